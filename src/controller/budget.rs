//! How long the phases of a cycle that wait on something other than CloudStack's listings may
//! take: the Secret reads of the gather phase, the destroy-job listings of the remnant report
//! and the NodeNotLinked lookups. Each phase gets a share of `--poll-deadline` (the poll keeps
//! its own, whole): the three shares add up to one `--poll-deadline`, so while CloudStack
//! answers, a cycle whose every Secret, workload API server and job listing hangs still ends
//! within about one `--poll-deadline` (at most about two when the polls hang too). Within a
//! phase the calls run at once, [`CONCURRENT_CALLS`] at a time, each under its own timeout and
//! at most a quarter of the phase's budget: calls that hang free their slots in waves, so a
//! call that answers never waits behind them past the phase's end unless more than four times
//! [`CONCURRENT_CALLS`] hang ahead of it. A call cut off counts as failed for its own Machines
//! only.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Calls of one phase in flight at once: enough that twenty slow Secrets or workload API
/// servers cost one timeout, not twenty; few enough not to flood the API server.
pub const CONCURRENT_CALLS: usize = 16;

/// The phases with a budget of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Every endpoint's Secret (and its `--endpoint-credentials` override): a quarter.
    SecretReads,
    /// The remnant report's `listAsyncJobs` per scope: a quarter.
    DestroyJobs,
    /// The workload clusters asked for Nodes: half.
    NodeLookups,
    /// The incidents' router lookups (one per incident, so rare): a quarter, outside the
    /// three shares above — a cycle that opens incidents may run that much longer.
    IncidentLookups,
}

/// The share of `poll_deadline` that `phase` may take.
pub fn budget(phase: Phase, poll_deadline: Duration) -> Duration {
    match phase {
        Phase::SecretReads | Phase::DestroyJobs | Phase::IncidentLookups => poll_deadline / 4,
        Phase::NodeLookups => poll_deadline / 2,
    }
}

/// One phase's calls: when the phase must be done, and how long one call may take.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    end: Instant,
    per_call: Duration,
}

impl Window {
    /// The window of `phase`, starting now.
    pub fn start(phase: Phase, poll_deadline: Duration) -> Self {
        let b = budget(phase, poll_deadline);
        Self {
            end: Instant::now() + b,
            per_call: b / 4,
        }
    }

    /// `call`, or `None` when it takes longer than a call may or the phase ends first. A call
    /// whose turn comes after the end is not made at all.
    pub async fn call<T>(&self, call: impl Future<Output = T>) -> Option<T> {
        let now = Instant::now();
        if now >= self.end {
            return None;
        }
        let until = self.end.min(now + self.per_call);
        tokio::time::timeout_at(until, call).await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_add_up_to_one_poll_deadline() {
        let p = Duration::from_secs(60);
        let sum: Duration = [Phase::SecretReads, Phase::DestroyJobs, Phase::NodeLookups]
            .into_iter()
            .map(|ph| budget(ph, p))
            .sum();
        assert_eq!(sum, p);
    }

    #[tokio::test]
    async fn a_call_is_cut_at_a_quarter_of_the_budget_and_none_is_made_after_the_end() {
        let w = Window::start(Phase::NodeLookups, Duration::from_millis(800));
        let started = std::time::Instant::now();
        assert_eq!(w.call(std::future::pending::<()>()).await, None);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(100) && took < Duration::from_millis(380),
            "cut after {took:?}, not after a quarter of 400ms"
        );
        assert_eq!(w.call(async { 1 }).await, Some(1), "answers in time");
        tokio::time::sleep_until(w.end).await;
        assert_eq!(w.call(async { 1 }).await, None, "made after the end");
    }
}
