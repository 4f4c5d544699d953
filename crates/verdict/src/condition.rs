//! From verdicts to a condition: `lastTransitionTime` moves only when the status flips
//! (MHC's timeouts count from it), and an unchanged condition is not rewritten.

use jiff::Timestamp;

use super::{Status, Verdict};

pub use capi_model::condition::{whole_seconds, ConditionState, DEFAULT_CONDITION_TYPE};

/// The condition to publish for `verdict`, given the one currently on the Machine.
pub fn next_condition(
    previous: Option<&ConditionState>,
    type_: &str,
    verdict: &Verdict,
    now: Timestamp,
) -> ConditionState {
    let last_transition_time = match previous {
        Some(p) if p.status == verdict.status => p.last_transition_time,
        _ => whole_seconds(now),
    };
    ConditionState {
        type_: type_.to_string(),
        status: verdict.status,
        reason: verdict.reason.to_string(),
        message: verdict.message.clone(),
        last_transition_time,
    }
}

/// Whether publishing `next` over `previous` would change nothing.
pub fn is_unchanged(previous: Option<&ConditionState>, next: &ConditionState) -> bool {
    previous == Some(next)
}

/// Whether a status change deserves an Event on the Machine: every change, except a first
/// verdict that is `True` (a cold start of 10 000 healthy Machines would otherwise write
/// 10 000 Events that tell nobody anything).
pub fn needs_event(previous: Option<Status>, next: Status) -> bool {
    match previous {
        None => next != Status::True,
        Some(p) => p != next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reason;

    #[test]
    fn events_mark_changes_but_not_a_first_healthy_verdict() {
        assert!(!needs_event(None, Status::True));
        assert!(needs_event(None, Status::False));
        assert!(needs_event(None, Status::Unknown));
        assert!(needs_event(Some(Status::Unknown), Status::True));
        assert!(needs_event(Some(Status::True), Status::False));
        assert!(!needs_event(Some(Status::False), Status::False));
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1 = t0 + jiff::SignedDuration::from_secs(30);
        let t2 = t1 + jiff::SignedDuration::from_secs(30);
        let running = Verdict::new(Status::True, reason::VM_RUNNING, "a");
        let healthy = Verdict::new(Status::True, reason::VM_HEALTHY, "b");
        let error = Verdict::new(Status::False, reason::VM_ERROR, "c");
        let c0 = next_condition(None, DEFAULT_CONDITION_TYPE, &running, t0);
        assert_eq!(c0.last_transition_time, t0);
        let c1 = next_condition(Some(&c0), DEFAULT_CONDITION_TYPE, &healthy, t1);
        assert_eq!(
            c1.last_transition_time, t0,
            "reason change alone keeps the time"
        );
        assert!(!is_unchanged(Some(&c0), &c1));
        let c2 = next_condition(Some(&c1), DEFAULT_CONDITION_TYPE, &error, t2);
        assert_eq!(c2.last_transition_time, t2);
        let c3 = next_condition(
            Some(&c2),
            DEFAULT_CONDITION_TYPE,
            &error,
            t2 + jiff::SignedDuration::from_secs(30),
        );
        assert!(is_unchanged(Some(&c2), &c3));
    }
}
