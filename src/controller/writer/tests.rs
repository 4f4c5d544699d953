use super::*;

#[test]
fn outcomes_are_labelled_by_what_stopped_them() {
    let failed = |e| Err(NotWritten::Failed(e));
    let timeout = failed(KubeError::Timeout {
        what: "x".into(),
        after: Duration::from_secs(5),
    });
    let refused = failed(KubeError::NotLeader {
        what: "x".into(),
        message: "y".into(),
    });
    let conflict = failed(KubeError::Conflict {
        what: "x".into(),
        message: "y".into(),
    });
    let unavailable = failed(KubeError::Unavailable {
        what: "x".into(),
        code: 503,
        message: "y".into(),
    });
    assert_eq!(outcome_label(&Ok(())), outcome::WRITTEN);
    assert_eq!(outcome_label(&timeout), outcome::TIMED_OUT);
    assert_eq!(outcome_label(&refused), outcome::REFUSED);
    assert_eq!(outcome_label(&conflict), outcome::PRECONDITION_FAILED);
    assert_eq!(outcome_label(&unavailable), outcome::FAILED);
    assert_eq!(
        outcome_label(&Err(NotWritten::Skipped(outcome::STALE))),
        outcome::STALE
    );
}

#[test]
fn a_job_is_sent_only_while_it_is_the_current_decision_and_young_enough() {
    let s = Duration::from_secs;
    let max = s(60);
    assert_eq!(due(Some(3), Some(3), s(1), max), Due::Send);
    // A newer decision replaced it, or the decision was revoked (recovery, Machine gone).
    assert_eq!(due(Some(3), Some(4), s(1), max), Due::Superseded);
    assert_eq!(due(Some(3), None, s(1), max), Due::Superseded);
    // Current but waited too long: decided again from what the Machine is by then.
    assert_eq!(due(Some(3), Some(3), s(61), max), Due::Stale);
    assert_eq!(due(Some(3), Some(3), s(60), max), Due::Send);
    // Replaced and old: superseded says more.
    assert_eq!(due(Some(3), Some(4), s(61), max), Due::Superseded);
    // Not about a Machine (an orphan's Event): age only.
    assert_eq!(due(None, None, s(1), max), Due::Send);
    assert_eq!(due(None, None, s(61), max), Due::Stale);
}

#[test]
fn a_job_goes_only_to_the_machine_it_was_decided_on() {
    assert!(same_machine(Some("u1"), Some(Some("u1"))));
    assert!(!same_machine(Some("u1"), Some(Some("u2"))), "recreated");
    assert!(!same_machine(Some("u1"), None), "gone");
    assert!(!same_machine(Some("u1"), Some(None)));
    assert!(same_machine(None, None), "nothing to compare");
}

#[test]
fn decisions_replace_revoke_and_settle_only_their_own() {
    let d = Decisions::default();
    let a = d.decide("ns/m", kind::ANNOTATION);
    let c = d.decide("ns/m", kind::CONDITION);
    assert_eq!(d.current("ns/m", kind::ANNOTATION), Some(a));
    let a2 = d.decide("ns/m", kind::ANNOTATION);
    assert_ne!(a, a2);
    assert_eq!(d.current("ns/m", kind::ANNOTATION), Some(a2));
    // The first job finishing does not clear the decision that replaced it.
    d.settle("ns/m", kind::ANNOTATION, a);
    assert_eq!(d.current("ns/m", kind::ANNOTATION), Some(a2));
    d.revoke("ns/m", kind::ANNOTATION);
    assert_eq!(d.current("ns/m", kind::ANNOTATION), None);
    assert_eq!(d.current("ns/m", kind::CONDITION), Some(c), "per kind");
    d.settle("ns/m", kind::CONDITION, c);
    assert_eq!(d.current("ns/m", kind::CONDITION), None);
}
