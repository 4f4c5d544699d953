//! The usage-history side of a scope poll: which VMs need their `vm_stats` row times (those
//! whose listing counter does not prove activity), asking for them ten at a time within the
//! poll's time, resuming where a poll cut short stopped, and taking the answers in.

use std::collections::HashMap;

use jiff::Timestamp;

use super::{ScopeObserver, ScopePollReport};
use crate::cloudstack::client::{CloudStackClient, USAGE_IDS_PER_REQUEST};
use crate::cloudstack::error::CloudStackError;
use crate::cloudstack::model::{CsTime, UsageHistoryVm};
use crate::verdict::traffic::rose_recently;
use crate::verdict::Graces;

impl ScopeObserver {
    /// Takes a usage-history answer for the VMs in `asked`: a VM the answer does not show is
    /// recorded as not visible (usage history has no `projectid`). Rows older than `since`
    /// are dropped (a server that reads only the date of `startdate` sends more).
    pub fn record_usage(
        &mut self,
        asked: &[String],
        items: &[UsageHistoryVm],
        since: Timestamp,
        now: Timestamp,
    ) {
        let by_id: HashMap<String, &UsageHistoryVm> = items
            .iter()
            .map(|i| (i.id.to_ascii_lowercase(), i))
            .collect();
        for id in asked {
            if let Some(h) = self.histories.get_mut(id) {
                let rows: Option<Vec<_>> = by_id.get(id.as_str()).map(|item| {
                    item.stats
                        .iter()
                        .filter(|s| s.timestamp.is_some_and(|t| t.0 >= since))
                        .cloned()
                        .collect()
                });
                h.record_usage(rows.as_deref(), now);
            }
        }
    }

    /// Running VMs whose statistics are wanted and whose listing counter does not prove
    /// activity: the only ones whose usage history (row times) is worth fetching, so a
    /// healthy fleet costs no extra calls.
    pub fn usage_candidates(&self, graces: &Graces, now: Timestamp) -> Vec<String> {
        self.histories
            .values()
            .filter(|h| h.absent_polls == 0 && h.last_error.is_none())
            .filter(|h| self.wants_stats(&h.vm_id))
            .filter(|h| {
                h.sighting.as_ref().is_some_and(|s| {
                    s.state == crate::cloudstack::model::VmState::Running
                        && !s.host_unreachable()
                        && graces.judges_silence_on(s.hypervisor.as_deref())
                })
            })
            .filter(|h| !rose_recently(&h.traffic, graces, now))
            .map(|h| h.vm_id.clone())
            .collect()
    }
}

/// Rotates the sorted `ids` to begin after `cursor` (and wrap around): where the last poll
/// that ran out of time stopped.
fn start_after(ids: &mut [String], cursor: Option<&str>) {
    if let Some(cursor) = cursor {
        let first = ids.partition_point(|id| id.as_str() <= cursor);
        ids.rotate_left(first);
    }
}

/// The usage history of the VMs whose counters do not prove activity, a request of ten VMs at
/// a time, starting after the VM the last poll stopped at (so that a poll cut short by
/// `deadline` does not leave the same VMs without history every time); each answer is
/// recorded as it comes.
pub(super) async fn ask_usage_history(
    client: &CloudStackClient,
    observer: &mut ScopeObserver,
    graces: &Graces,
    usage_history: &mut bool,
    now: Timestamp,
    deadline: Option<tokio::time::Instant>,
    out: &mut ScopePollReport,
) {
    let mut ids = observer.usage_candidates(graces, now);
    if ids.is_empty() {
        return;
    }
    start_after(&mut ids, observer.usage_cursor.as_deref());
    let since = now - observer.usage_lookback(&ids, graces);
    let mut asked = 0;
    for chunk in ids.chunks(USAGE_IDS_PER_REQUEST) {
        let answer = client.list_usage_history(chunk, Some(CsTime(since)));
        let answer = match deadline {
            Some(at) => match tokio::time::timeout_at(at, answer).await {
                Ok(answer) => answer,
                Err(_) => {
                    out.usage_history_note = Some(format!(
                        "usage history of {} of {} VMs left for the next poll (poll deadline)",
                        ids.len() - asked,
                        ids.len()
                    ));
                    return;
                }
            },
            None => answer.await,
        };
        match answer {
            Ok(items) => observer.record_usage(chunk, &items, since, now),
            Err(CloudStackError::Unsupported { .. }) => {
                *usage_history = false;
                out.usage_history_note = Some(
                    "usage history not available here; judging traffic from listing counters"
                        .into(),
                );
                return;
            }
            Err(e) => {
                out.usage_history_note = Some(format!("usage history skipped this poll: {e}"));
                return;
            }
        }
        asked += chunk.len();
        observer.usage_cursor = chunk.last().cloned();
    }
    // A whole round: the next poll starts from the first VM again.
    observer.usage_cursor = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_history_resumes_after_the_vm_a_cut_short_poll_stopped_at() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut all = ids(&["a", "b", "c", "d"]);
        start_after(&mut all, Some("b"));
        assert_eq!(all, ids(&["c", "d", "a", "b"]));
        // A cursor VM that is gone (or no longer a candidate) still orders by id.
        let mut all = ids(&["a", "c", "d"]);
        start_after(&mut all, Some("b"));
        assert_eq!(all, ids(&["c", "d", "a"]));
        let mut all = ids(&["a", "b"]);
        start_after(&mut all, Some("z"));
        assert_eq!(all, ids(&["a", "b"]));
        start_after(&mut all, None);
        assert_eq!(all, ids(&["a", "b"]));
    }
}
