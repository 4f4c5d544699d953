//! The Machine's condition is the record. A process that starts without history (a restart,
//! a new leader, an upgrade) or loses sight of CloudStack for a moment keeps the condition the
//! Machine carries — status, reason, message and `lastTransitionTime` — until its own evidence
//! positively contradicts it. Without this, a fresh process republishes a standing `False` as
//! `True` or `Unknown` for lack of history (moving `lastTransitionTime`, so MHC's timeout and
//! the escalation delay start over), one failed listing or Secret read turns every verdict
//! `Unknown`, and a `True` reason flips on every rollout of the shim.
//!
//! Every way of not seeing — a failed listing, credentials that cannot be read, a failure
//! domain briefly missing, a VM this process has not polled yet — goes through one rule,
//! [`blind_grace_holds`]: the record stands while this process has been blind for no longer
//! than the API-trouble grace, counted from the first failure *it* saw (so the grace after a
//! restart is never shorter than without one).
//!
//! Pure: the caller passes the published condition, the engine's candidate and the history.

use jiff::Timestamp;

use crate::condition::ConditionState;
use crate::engine::MachineFacts;
use crate::history::VmHistory;
use crate::{reason, Graces, Status, Verdict};
use cloudstack_api::model::VmState;

/// The one rule for "I cannot see": blind since `since` (the first failure this process saw),
/// the record stands while that is no longer ago than the API-trouble grace
/// ([`Graces::stale_after`]). Past it the failure is lasting and is published.
pub fn blind_grace_holds(since: Timestamp, g: &Graces, now: Timestamp) -> bool {
    now.duration_since(since) <= g.stale_after()
}

/// Whether the history's evidence is too thin to overrule anything yet: the VM was never
/// polled by this process, or its polls have failed for no longer than the API-trouble grace.
/// Past the grace the engine's `Unknown`/`CloudStackAPIUnavailable` is published as before.
pub fn briefly_blind(h: &VmHistory, g: &Graces, now: Timestamp) -> bool {
    if h.last_poll.is_none() {
        return true;
    }
    h.last_error.is_some()
        && h.failing_since
            .is_some_and(|since| blind_grace_holds(since, g, now))
}

/// The verdict to publish for a Machine this process cannot poll at all (credentials or its
/// failure domain missing, since `since`): `unavailable` — unless the Machine carries a
/// condition this version publishes and the blindness is within the grace, then that stands.
pub fn unavailable_or_standing(
    published: Option<&ConditionState>,
    unavailable: &Verdict,
    since: Timestamp,
    facts: &MachineFacts,
    g: &Graces,
    now: Timestamp,
) -> Verdict {
    match published {
        Some(p) if !facts.deleting && blind_grace_holds(since, g, now) => {
            as_verdict(p).unwrap_or_else(|| unavailable.clone())
        }
        _ => unavailable.clone(),
    }
}

/// Whether the latest poll saw the VM's scope: it succeeded and is not stale.
fn sees_now(h: &VmHistory, g: &Graces, now: Timestamp) -> bool {
    h.last_error.is_none()
        && h.last_success
            .is_some_and(|t| now.duration_since(t) <= g.stale_after())
}

/// Whether the current evidence positively contradicts the `published` condition: what its
/// reason claims is no longer what CloudStack shows. `candidate` is what the engine makes of
/// the same evidence. A reason this version does not know is replaced by whatever current
/// evidence says.
pub fn contradicts(
    published: &ConditionState,
    candidate: &Verdict,
    h: &VmHistory,
    facts: &MachineFacts,
) -> bool {
    let seen = h.sighting.as_ref().filter(|_| h.absent_polls == 0);
    let state = seen.map(|s| &s.state);
    let running = state == Some(&VmState::Running);
    match published.reason.as_str() {
        // Still missing, or gone again: nothing contradicts it.
        reason::VM_NOT_FOUND => seen.is_some(),
        reason::VM_DESTROYED => {
            seen.is_some() && !matches!(state, Some(VmState::Destroyed | VmState::Expunging))
        }
        reason::VM_ERROR => seen.is_some() && state != Some(&VmState::Error),
        reason::VM_STOPPED => {
            seen.is_some() && !matches!(state, Some(VmState::Stopped | VmState::Shutdown))
        }
        reason::VM_STUCK_IN_TRANSITION | reason::VM_IN_TRANSITION => {
            seen.is_some()
                && !matches!(
                    state,
                    Some(VmState::Starting | VmState::Stopping | VmState::Restoring)
                )
        }
        reason::HOST_UNREACHABLE => seen.is_some_and(|s| !running || !s.host_unreachable()),
        reason::NIC_DETACHED => {
            seen.is_some_and(|s| !running || (s.nic_count > 0 && s.has_default_nic))
        }
        reason::NIC_NO_ADDRESS => seen.is_some_and(|s| !running || !s.nic_missing_address),
        // Silence is contradicted by traffic seen rising, a probe answer (both VMHealthy), a
        // Node (the guest joined), or the VM leaving Running. A fresh history whose counter
        // has not moved yet is no evidence either way.
        reason::GUEST_NETWORK_SILENT => {
            facts.has_node
                || seen.is_some_and(|_| !running)
                || candidate.reason == reason::VM_HEALTHY
        }
        // Traffic seen or a probe answered: contradicted by the VM leaving Running, or by a
        // Node (then "the Machine has a Node" is the record, as a running process writes it).
        // A fresh process that has not seen the counter rise yet is no evidence either way.
        reason::VM_HEALTHY => facts.has_node || seen.is_some_and(|_| !running),
        // Running, NICs attached: contradicted by the VM leaving Running, by a rise or an
        // answer (VMHealthy), and by a Node the published message predates (with a Node the
        // engine's message is fixed, so a different one was written without it).
        reason::VM_RUNNING => {
            seen.is_some_and(|_| !running)
                || candidate.reason == reason::VM_HEALTHY
                || (facts.has_node && candidate.message != published.message)
        }
        // The Unknowns that only say what this process sees or decides now (API trouble,
        // guards, migrations, credentials): current evidence wins.
        _ => true,
    }
}

/// How bad a status is, for "never less severe for lack of history".
fn severity(s: Status) -> u8 {
    match s {
        Status::True => 0,
        Status::Unknown => 1,
        Status::False => 2,
    }
}

/// The published condition as a verdict, when its reason is one this version publishes.
fn as_verdict(p: &ConditionState) -> Option<Verdict> {
    let reason = reason::known(&p.reason)?;
    Some(Verdict::new(p.status, reason, p.message.clone()))
}

/// The verdict to publish: the engine's `candidate`, unless the `published` condition stands.
/// It stands (unchanged, so nothing is written) while this process is briefly blind, and
/// where the candidate is no more severe without positive evidence against what the published
/// reason claims — an equally severe candidate included, so that a new leader rewrites
/// neither a `False` nor a `True` reason (or its message) it has no evidence against. A
/// Machine being deleted always gets the candidate.
pub fn stand_or_replace(
    published: Option<&ConditionState>,
    candidate: Verdict,
    h: &VmHistory,
    facts: &MachineFacts,
    g: &Graces,
    now: Timestamp,
) -> Verdict {
    let Some(p) = published else {
        return candidate;
    };
    if facts.deleting {
        return candidate;
    }
    let standing = || as_verdict(p);
    if briefly_blind(h, g, now) {
        return standing().unwrap_or(candidate);
    }
    if severity(candidate.status) > severity(p.status) || !sees_now(h, g, now) {
        return candidate;
    }
    // A failure the engine confirmed is evidence by itself: another failure replaces the one
    // published (the same one keeps its message).
    let other_failure = candidate.status == Status::False && candidate.reason != p.reason;
    if other_failure || contradicts(p, &candidate, h, facts) {
        return candidate;
    }
    standing().unwrap_or(candidate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::evaluate;
    use crate::history::PollOutcome;
    use crate::tests::vm;
    use cloudstack_api::model::VirtualMachine;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_796_000_000 + secs).unwrap()
    }

    fn detached() -> VirtualMachine {
        let mut v = vm(VmState::Running);
        v.nics.clear();
        v
    }

    fn no_address() -> VirtualMachine {
        let mut v = vm(VmState::Running);
        v.nics[0].ipaddress = None;
        v
    }

    fn published(status: Status, reason: &str) -> ConditionState {
        ConditionState {
            type_: "CloudStackVMHealthy".into(),
            status,
            reason: reason.into(),
            message: format!("{reason} as the predecessor saw it"),
            last_transition_time: at(-3600),
        }
    }

    /// A fresh process: one poll with `outcome` at `secs`, then the verdict it would publish.
    fn fresh(
        p: &ConditionState,
        outcome: PollOutcome<'_>,
        facts: &MachineFacts,
        g: &Graces,
    ) -> Verdict {
        let mut h = VmHistory::new("vm-1");
        h.record(outcome, at(0), g);
        let c = evaluate(&h, facts, g, at(0));
        stand_or_replace(Some(p), c, &h, facts, g, at(0))
    }

    fn assert_stands(v: &Verdict, p: &ConditionState) {
        assert_eq!(
            (v.status, v.reason, v.message.as_str()),
            (p.status, p.reason.as_str(), p.message.as_str()),
            "{v:?}"
        );
    }

    #[test]
    fn a_fresh_process_keeps_every_standing_false_while_the_evidence_still_shows_it() {
        let g = Graces::default();
        let node_less = MachineFacts::default();
        // `None`: missing from a complete listing.
        let cases: Vec<(&str, Option<VirtualMachine>)> = vec![
            (reason::GUEST_NETWORK_SILENT, Some(vm(VmState::Running))),
            (reason::NIC_DETACHED, Some(detached())),
            (reason::NIC_NO_ADDRESS, Some(no_address())),
            (reason::VM_STOPPED, Some(vm(VmState::Stopped))),
            (reason::VM_ERROR, Some(vm(VmState::Error))),
            (reason::VM_DESTROYED, Some(vm(VmState::Destroyed))),
            (reason::VM_NOT_FOUND, None),
            (reason::VM_STUCK_IN_TRANSITION, Some(vm(VmState::Starting))),
        ];
        for (r, listed) in &cases {
            let p = published(Status::False, r);
            let mut h = VmHistory::new("vm-1");
            let outcome = listed
                .as_ref()
                .map_or(PollOutcome::Absent, PollOutcome::Seen);
            h.record(outcome, at(0), &g);
            let c = evaluate(&h, &node_less, &g, at(0));
            assert_ne!(
                c.status,
                Status::False,
                "{r}: the fresh engine alone says {c:?}"
            );
            let v = stand_or_replace(Some(&p), c, &h, &node_less, &g, at(0));
            assert_stands(&v, &p);
        }
    }

    #[test]
    fn positive_evidence_replaces_a_standing_false() {
        let g = Graces::default();
        let node_less = MachineFacts::default();
        let running = vm(VmState::Running);
        for (r, outcome) in [
            (reason::NIC_DETACHED, PollOutcome::Seen(&running)),
            (reason::NIC_NO_ADDRESS, PollOutcome::Seen(&running)),
            (reason::VM_STOPPED, PollOutcome::Seen(&running)),
            (reason::VM_ERROR, PollOutcome::Seen(&running)),
            (reason::VM_NOT_FOUND, PollOutcome::Seen(&running)),
            (reason::VM_STUCK_IN_TRANSITION, PollOutcome::Seen(&running)),
            (
                reason::GUEST_NETWORK_SILENT,
                PollOutcome::Seen(&vm(VmState::Stopped)),
            ),
        ] {
            let p = published(Status::False, r);
            let v = fresh(&p, outcome, &node_less, &g);
            assert_ne!(v.message, p.message, "{r} stood against evidence: {v:?}");
        }
        // Silence: a Node is evidence the guest joined.
        let p = published(Status::False, reason::GUEST_NETWORK_SILENT);
        let with_node = MachineFacts {
            has_node: true,
            ..Default::default()
        };
        let v = fresh(&p, PollOutcome::Seen(&running), &with_node, &g);
        assert_eq!((v.status, v.reason), (Status::True, reason::VM_RUNNING));
        // ... and so is its counter rising between two polls.
        let mut h = VmHistory::new("vm-1");
        h.record(PollOutcome::Seen(&running), at(0), &g);
        let mut more = running.clone();
        more.networkkbswrite = Some(500);
        h.record(PollOutcome::Seen(&more), at(30), &g);
        let c = evaluate(&h, &node_less, &g, at(30));
        assert_eq!(c.reason, reason::VM_HEALTHY);
        let v = stand_or_replace(Some(&p), c, &h, &node_less, &g, at(30));
        assert_eq!(v.status, Status::True);
    }

    #[test]
    fn a_fresh_process_keeps_a_true_reason_and_message_it_has_no_evidence_against() {
        let g = Graces::default();
        let node_less = MachineFacts::default();
        let running = vm(VmState::Running);
        // Node-less VMHealthy: a fresh process has not seen the counter rise yet (its
        // candidate is VMRunning); before this rule it rewrote VMHealthy → VMRunning → VMHealthy.
        let healthy = published(Status::True, reason::VM_HEALTHY);
        let mut h = VmHistory::new("vm-1");
        h.record(PollOutcome::Seen(&running), at(0), &g);
        let c = evaluate(&h, &node_less, &g, at(0));
        assert_eq!((c.status, c.reason), (Status::True, reason::VM_RUNNING));
        assert_stands(
            &stand_or_replace(Some(&healthy), c, &h, &node_less, &g, at(0)),
            &healthy,
        );
        // Node-less VMRunning whose message another process wrote: the same reason stands
        // with its message (a different one would be a write on every rollout).
        let inconclusive = published(Status::True, reason::VM_RUNNING);
        let c = evaluate(&h, &node_less, &g, at(0));
        assert_ne!(c.message, inconclusive.message);
        assert_stands(
            &stand_or_replace(Some(&inconclusive), c, &h, &node_less, &g, at(0)),
            &inconclusive,
        );
        // The same holds for a False with the same reason and another message.
        let detached_since_earlier = published(Status::False, reason::NIC_DETACHED);
        let v = fresh(
            &detached_since_earlier,
            PollOutcome::Seen(&detached()),
            &node_less,
            &g,
        );
        assert_stands(&v, &detached_since_earlier);
    }

    #[test]
    fn evidence_replaces_a_true_reason() {
        let g = Graces::default();
        let node_less = MachineFacts::default();
        let with_node = MachineFacts {
            has_node: true,
            ..Default::default()
        };
        let running = vm(VmState::Running);
        // The Node joined: "the Machine has a Node" is the record.
        for r in [reason::VM_HEALTHY, reason::VM_RUNNING] {
            let p = published(Status::True, r);
            let v = fresh(&p, PollOutcome::Seen(&running), &with_node, &g);
            assert_eq!((v.status, v.reason), (Status::True, reason::VM_RUNNING));
            assert!(v.message.contains("has a Node"), "{r}: {v:?}");
        }
        // A rise replaces VMRunning with VMHealthy.
        let p = published(Status::True, reason::VM_RUNNING);
        let mut h = VmHistory::new("vm-1");
        h.record(PollOutcome::Seen(&running), at(0), &g);
        let mut more = running.clone();
        more.networkkbswrite = Some(500);
        h.record(PollOutcome::Seen(&more), at(30), &g);
        let c = evaluate(&h, &node_less, &g, at(30));
        assert_eq!(c.reason, reason::VM_HEALTHY);
        let v = stand_or_replace(Some(&p), c, &h, &node_less, &g, at(30));
        assert_eq!(v.reason, reason::VM_HEALTHY);
        // A VM that stopped is not healthy whatever was published (an Unknown or a False
        // follows, both more severe, or the stopped grace's Unknown).
        let p = published(Status::True, reason::VM_HEALTHY);
        let v = fresh(&p, PollOutcome::Seen(&vm(VmState::Stopped)), &node_less, &g);
        assert_ne!(v.status, Status::True, "{v:?}");
        // Another confirmed failure replaces a standing one.
        let p = published(Status::False, reason::GUEST_NETWORK_SILENT);
        let mut h = VmHistory::new("vm-1");
        for secs in [0, 30] {
            h.record(PollOutcome::Seen(&vm(VmState::Error)), at(secs), &g);
        }
        let c = evaluate(&h, &node_less, &g, at(30));
        assert_eq!((c.status, c.reason), (Status::False, reason::VM_ERROR));
        let v = stand_or_replace(Some(&p), c, &h, &node_less, &g, at(30));
        assert_eq!(v.reason, reason::VM_ERROR);
    }

    #[test]
    fn a_machine_that_cannot_be_polled_keeps_its_record_for_the_grace_counted_from_the_first_failure(
    ) {
        let g = Graces::default();
        let facts = MachineFacts::default();
        let unavailable = Verdict::new(
            Status::Unknown,
            reason::CREDENTIALS_UNAVAILABLE,
            "Secret ns/acs: not found",
        );
        for status in [Status::True, Status::False] {
            let p = ConditionState {
                reason: if status == Status::True {
                    reason::VM_HEALTHY
                } else {
                    reason::NIC_DETACHED
                }
                .into(),
                ..published(status, reason::VM_HEALTHY)
            };
            // Blind since 0: the record stands through the grace...
            let grace = g.stale_after().as_secs();
            for secs in [0, grace / 2, grace] {
                let v =
                    unavailable_or_standing(Some(&p), &unavailable, at(0), &facts, &g, at(secs));
                assert_stands(&v, &p);
            }
            // ... and the lasting failure is published past it.
            let v =
                unavailable_or_standing(Some(&p), &unavailable, at(0), &facts, &g, at(grace + 1));
            assert_eq!(v, unavailable);
        }
        // Nothing published: the failure is the first verdict. Being deleted: no record holds.
        assert_eq!(
            unavailable_or_standing(None, &unavailable, at(0), &facts, &g, at(0)),
            unavailable
        );
        let p = published(Status::False, reason::VM_ERROR);
        let deleting = MachineFacts {
            deleting: true,
            ..Default::default()
        };
        assert_eq!(
            unavailable_or_standing(Some(&p), &unavailable, at(0), &deleting, &g, at(0)),
            unavailable
        );
    }

    #[test]
    fn a_machine_being_deleted_is_never_held_to_its_record() {
        let g = Graces::default();
        let deleting = MachineFacts {
            deleting: true,
            ..Default::default()
        };
        let p = published(Status::False, reason::VM_ERROR);
        let v = fresh(&p, PollOutcome::Seen(&vm(VmState::Error)), &deleting, &g);
        assert_eq!(v.reason, reason::MACHINE_DELETING);
    }

    #[test]
    fn one_failed_poll_changes_nothing_and_a_lasting_failure_is_unknown() {
        let g = Graces::default();
        let facts = MachineFacts::default();
        let running = vm(VmState::Running);
        for status in [Status::True, Status::False, Status::Unknown] {
            let p = published(status, reason::VM_HEALTHY);
            let p = ConditionState {
                reason: match status {
                    Status::True => reason::VM_HEALTHY,
                    Status::False => reason::VM_ERROR,
                    Status::Unknown => reason::VM_IN_TRANSITION,
                }
                .into(),
                ..p
            };
            let mut h = VmHistory::new("vm-1");
            h.record(PollOutcome::Seen(&running), at(0), &g);
            // Failed polls for up to the grace (3 intervals): the record stands.
            for secs in [30, 60, 90, 120] {
                h.record(PollOutcome::Failed("502 from the proxy"), at(secs), &g);
                let c = evaluate(&h, &facts, &g, at(secs));
                let v = stand_or_replace(Some(&p), c, &h, &facts, &g, at(secs));
                assert_stands(&v, &p);
            }
            // Past it: Unknown, as before this rule.
            h.record(PollOutcome::Failed("502 from the proxy"), at(150), &g);
            let c = evaluate(&h, &facts, &g, at(150));
            let v = stand_or_replace(Some(&p), c, &h, &facts, &g, at(150));
            assert_eq!(
                (v.status, v.reason),
                (Status::Unknown, reason::CLOUDSTACK_API_UNAVAILABLE)
            );
        }
    }

    #[test]
    fn worse_news_is_never_held_back_and_unknown_reasons_yield_to_current_evidence() {
        let g = Graces::default();
        let facts = MachineFacts::default();
        let p = published(Status::True, reason::VM_HEALTHY);
        let mut h = VmHistory::new("vm-1");
        for secs in [0, 30] {
            h.record(PollOutcome::Seen(&vm(VmState::Error)), at(secs), &g);
        }
        let c = evaluate(&h, &facts, &g, at(30));
        assert_eq!(c.status, Status::False);
        let v = stand_or_replace(Some(&p), c.clone(), &h, &facts, &g, at(30));
        assert_eq!(v, c);
        // A reason some other version wrote: what this process sees replaces it.
        let p = published(Status::False, "SomethingElse");
        let v = fresh(&p, PollOutcome::Seen(&vm(VmState::Running)), &facts, &g);
        assert_eq!(v.status, Status::True);
    }
}
