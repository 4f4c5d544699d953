//! Phase 2 of a cycle, poll: one listing per scope in use (skipping scopes in back-off), folded
//! into the VM histories, then a paused stats collection marked per CloudStack over all its
//! scopes. Each scope poll runs in its own tracing span and is timed in metrics.

use std::collections::BTreeMap;

use futures::stream::{self, StreamExt};
use jiff::Timestamp;
use tracing::Instrument;

use super::cycle::Controller;
use super::gather::ScopeState;
use crate::scope::ScopePoll;
use crate::verdict::{Graces, VmHistory};

/// Poll intervals to wait after `failed` polls of a scope failed in a row: 1, 2, then 4 — fewer
/// calls into an outage or a 429 storm (each poll retries already), without going blind for long.
pub fn backoff_intervals(failed: u32) -> i32 {
    1 << failed.saturating_sub(1).min(2)
}

/// Scopes polled at once: one slow or unreachable CloudStack must not hold up the others.
const CONCURRENT_POLLS: usize = 8;

impl Controller {
    pub(super) async fn poll(&mut self, now: Timestamp) {
        for scope in self.scopes.values_mut() {
            scope.listing = None;
        }
        let graces = &self.graces;
        let metrics = &self.metrics;
        // An unreachable endpoint (four attempts of --request-timeout) holds the cycle, and
        // with it every scope's verdicts, at most this long.
        let deadline = crate::cli::to_std(self.args.poll_deadline);
        let due: Vec<(&String, &mut ScopeState)> = self
            .scopes
            .iter_mut()
            .filter(|(_, s)| s.in_use && s.report.next_poll.is_none_or(|due| now >= due))
            .collect();
        stream::iter(due)
            .for_each_concurrent(CONCURRENT_POLLS, |(key, scope)| async move {
                let started = std::time::Instant::now();
                let calls_before = scope.polled.client.stats();
                // The usage history stops a little before the deadline and keeps what it has;
                // the deadline itself only cuts a listing that hangs.
                let usage_until = tokio::time::Instant::now() + usage_budget(deadline);
                let polled =
                    tokio::time::timeout(deadline, poll_scope(scope, graces, now, usage_until))
                        .instrument(tracing::info_span!("scope_poll", scope = %key))
                        .await;
                if polled.is_err() {
                    let why = format!("the poll did not finish within {}s", deadline.as_secs_f64());
                    scope
                        .polled
                        .observer
                        .record(ScopePoll::Failed(&why), now, graces);
                    record_failure(scope, why, graces, now);
                }
                metrics.observe_poll(key, started.elapsed().as_secs_f64());
                metrics.record_scope_poll(key, polled.unwrap_or(Err("deadline")));
                let after = scope.polled.client.stats();
                record_call_deltas(metrics, &calls_before, &after);
                let waited = after
                    .rate_limit_wait
                    .saturating_sub(calls_before.rate_limit_wait);
                metrics.record_rate_limit_wait(waited.as_secs_f64());
            })
            .await;
        self.mark_paused_collections(now);
    }

    /// A host whose stats collection paused makes all its VMs look flat at once; judge each
    /// CloudStack's hosts over all of its scopes.
    fn mark_paused_collections(&mut self, now: Timestamp) {
        let mut by_cloud: BTreeMap<String, Vec<&mut VmHistory>> = BTreeMap::new();
        for scope in self.scopes.values_mut().filter(|s| s.in_use) {
            by_cloud
                .entry(scope.report.api_url.clone())
                .or_default()
                .extend(
                    scope
                        .polled
                        .observer
                        .histories
                        .values_mut()
                        .map(|h| &mut **h),
                );
        }
        for (api_url, histories) in by_cloud {
            for p in crate::verdict::mark_paused_collections(histories, &self.graces, now) {
                tracing::debug!(
                    api_url = %api_url,
                    host = p.host_id.as_deref().unwrap_or("(no host id)"),
                    since = %p.since,
                    witnesses = p.witnesses,
                    vms = p.vms,
                    "stats collection looks paused; flat traffic there is no evidence"
                );
            }
        }
    }
}

/// How much of a scope's poll deadline the usage history may run into: all but a tenth (at
/// most 5 s), which is left for recording what came back.
fn usage_budget(deadline: std::time::Duration) -> std::time::Duration {
    deadline.saturating_sub((deadline / 10).min(std::time::Duration::from_secs(5)))
}

async fn poll_scope(
    scope: &mut ScopeState,
    graces: &Graces,
    now: Timestamp,
    usage_until: tokio::time::Instant,
) -> Result<(), &'static str> {
    let was_failing = scope.report.last_error.is_some();
    scope.report.last_poll = Some(now);
    let o = scope
        .polled
        .poll_until(graces, now, Some(usage_until))
        .await;
    scope.report.stats = Some(scope.polled.observer.stats_summary(graces));
    // Only a complete listing can show that a VM is owned by nothing.
    scope.listing = o.listed.filter(|_| o.complete && o.listing_error.is_none());
    scope.report.stats_vms_asked = o.stats_vms_asked;
    for note in [&o.stats_note, &o.capabilities_note].into_iter().flatten() {
        tracing::debug!(scope = %scope.report.key, note = %note, "statistics");
    }
    match &o.listing_error {
        Some(e) => scope.report.last_error = Some(e.to_string()),
        None => {
            scope.report.last_success = Some(now);
            scope.report.last_error = (!o.complete).then(|| {
                format!(
                    "listing incomplete: {} item(s) could not be read",
                    o.unreadable
                )
            });
        }
    }
    if o.listing_error.is_some() {
        back_off(scope, graces, now);
    } else {
        scope.failed_polls = 0;
        scope.report.next_poll = None;
    }
    // Say so once when a scope starts failing and once when it recovers, not every cycle.
    match (&scope.report.last_error, was_failing) {
        (Some(error), false) => tracing::warn!(
            scope = %scope.report.key,
            error = %error,
            "CloudStack poll failed; this scope's verdicts are Unknown until a poll succeeds"
        ),
        (None, true) => {
            tracing::info!(scope = %scope.report.key, "CloudStack poll succeeded again")
        }
        _ => {}
    }
    if let Some(note) = &o.usage_history_note {
        tracing::debug!(note = %note, "usage history");
    }
    let stats = scope.polled.client.stats();
    scope.report.calls_total = stats.calls;
    scope.report.calls = stats
        .by_command
        .iter()
        .map(|((cmd, outcome), n)| (format!("{cmd}/{outcome}"), *n))
        .collect();
    scope.report.rate_limit_wait_seconds = stats.rate_limit_wait.as_secs_f64();
    o.listing_error.as_ref().map_or(Ok(()), |e| Err(e.kind()))
}

/// Adds to `capc_health_cloudstack_calls_total` what a client did between two of its stats.
pub(super) fn record_call_deltas(
    metrics: &crate::metrics::Metrics,
    before: &crate::cloudstack::client::CallStats,
    after: &crate::cloudstack::client::CallStats,
) {
    for ((command, outcome), n) in &after.by_command {
        let was = before
            .by_command
            .get(&(command.clone(), outcome.clone()))
            .copied()
            .unwrap_or(0);
        if *n > was {
            metrics.record_calls(command, outcome, n - was);
        }
    }
}

/// Another failed poll in a row: wait longer before the next one.
fn back_off(scope: &mut ScopeState, graces: &Graces, now: Timestamp) {
    scope.failed_polls = scope.failed_polls.saturating_add(1);
    let wait = graces.poll_interval * backoff_intervals(scope.failed_polls);
    scope.report.next_poll = (scope.failed_polls > 1).then(|| crate::verdict::later(now, wait));
}

/// A poll cut off by its deadline: failed, as a listing error would be.
fn record_failure(scope: &mut ScopeState, why: String, graces: &Graces, now: Timestamp) {
    if scope.report.last_error.is_none() {
        tracing::warn!(scope = %scope.report.key, error = %why,
            "CloudStack poll failed; this scope's verdicts are Unknown until a poll succeeds");
    }
    scope.report.last_poll = Some(now);
    scope.report.last_error = Some(why);
    scope.listing = None;
    back_off(scope, graces, now);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_polls_back_off_to_four_intervals_at_most() {
        let waits: Vec<i32> = (0..7).map(backoff_intervals).collect();
        assert_eq!(waits, [1, 1, 2, 4, 4, 4, 4]);
        assert_eq!(backoff_intervals(u32::MAX), 4);
    }
}
