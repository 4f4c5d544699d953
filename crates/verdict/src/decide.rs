//! The one decision pipeline, from observations to the conditions to publish: evaluate each
//! Machine's VM ([`evaluate`]) → the mass-failure guard per scope → the next condition. The
//! controller (`run`), `check` and the benches all call [`decide`], so what the benches measure
//! is what the controller publishes.
//!
//! Before it, the caller has folded the polls into the histories and marked paused stats
//! collections ([`crate::mark_paused_collections`]); after it, the caller acts. Pure: time is
//! passed in, nothing is written.

use std::collections::BTreeMap;

use jiff::Timestamp;

use crate::condition::{next_condition, ConditionState};
use crate::engine::{evaluate_on_record, MachineFacts};
use crate::guard::{GuardOutcome, MassFailureGuard, ScopeMember};
use crate::standing::unavailable_or_standing;
use crate::{Graces, Status, Verdict, VmHistory};

/// What a Machine's verdict rests on.
#[derive(Debug, Clone, Copy)]
pub enum Evidence<'a> {
    /// Nothing to judge yet (no VM deployed): no verdict, no condition.
    None,
    /// The VM's history in its scope.
    Observed(&'a VmHistory),
    /// No history can be had (credentials or failure domain missing) since `since`, the first
    /// failure this process saw: `verdict`, once the published condition no longer stands
    /// ([`crate::standing::unavailable_or_standing`]).
    Unavailable {
        verdict: &'a Verdict,
        since: Timestamp,
    },
}

/// One Machine (or, for `check`, one VM) to decide about.
#[derive(Debug, Clone)]
pub struct Subject<'a> {
    /// The mass-failure guard's group: the CloudStack scope the VM is listed in. Subjects
    /// without a scope are decided but never grouped.
    pub scope: Option<&'a str>,
    pub evidence: Evidence<'a>,
    pub facts: MachineFacts,
    /// The condition the Machine carries now (its status and `lastTransitionTime`).
    pub published: Option<&'a ConditionState>,
}

/// What [`decide`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// The engine's verdict per subject, before the mass-failure guard (same order).
    pub candidates: Vec<Option<Verdict>>,
    /// The verdict per subject after the guard: what is published.
    pub verdicts: Vec<Option<Verdict>>,
    /// The guard's outcome per scope, with the number of subjects it covered.
    pub scopes: BTreeMap<String, (GuardOutcome, usize)>,
}

impl Decision {
    /// Indices of subjects whose candidate is `False` on a Machine without a Node that is not
    /// being deleted: the ones the NodeNotLinked guard must look up before anything is
    /// published (in condition mode the MHC acts on `False` itself).
    pub fn needing_node_lookup<'s>(
        &'s self,
        subjects: &'s [Subject<'_>],
    ) -> impl Iterator<Item = usize> + 's {
        self.candidates
            .iter()
            .zip(subjects)
            .enumerate()
            .filter(|(_, (v, s))| {
                v.as_ref().is_some_and(|v| v.status == Status::False)
                    && !s.facts.has_node
                    && !s.facts.deleting
            })
            .map(|(i, _)| i)
    }

    /// Per subject: whether its condition is held back, because the verdict is provisional
    /// and the Machine carries no condition yet — its first condition waits (a bounded time,
    /// see [`Verdict::provisional`]) for the samples that decide. What it already carries is
    /// never held.
    pub fn first_writes_held(&self, subjects: &[Subject<'_>]) -> Vec<bool> {
        self.verdicts
            .iter()
            .zip(subjects)
            .map(|(v, s)| s.published.is_none() && v.as_ref().is_some_and(|v| v.provisional))
            .collect()
    }

    /// The condition to publish per subject, given what each carries now.
    pub fn conditions(
        &self,
        subjects: &[Subject<'_>],
        condition_type: &str,
        now: Timestamp,
    ) -> Vec<Option<ConditionState>> {
        self.verdicts
            .iter()
            .zip(subjects)
            .map(|(v, s)| {
                Some(next_condition(
                    s.published,
                    condition_type,
                    v.as_ref()?,
                    now,
                ))
            })
            .collect()
    }
}

/// Decides every subject at `now`: evaluate, then hold a mass failure per scope.
pub fn decide(
    subjects: &[Subject<'_>],
    graces: &Graces,
    guard: &MassFailureGuard,
    now: Timestamp,
) -> Decision {
    let candidates: Vec<Option<Verdict>> = subjects
        .iter()
        .map(|s| match s.evidence {
            Evidence::None => None,
            Evidence::Observed(h) => {
                Some(evaluate_on_record(h, &s.facts, s.published, graces, now))
            }
            Evidence::Unavailable { verdict, since } => Some(unavailable_or_standing(
                s.published,
                verdict,
                since,
                &s.facts,
                graces,
                now,
            )),
        })
        .collect();
    let mut by_scope: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, s) in subjects.iter().enumerate() {
        if let (Some(scope), Some(_)) = (s.scope, &candidates[i]) {
            by_scope.entry(scope).or_default().push(i);
        }
    }
    let mut verdicts = candidates.clone();
    let mut scopes = BTreeMap::new();
    for (scope, idx) in by_scope {
        let mut members: Vec<ScopeMember> = idx
            .iter()
            .filter_map(|&i| {
                Some(ScopeMember {
                    candidate: verdicts[i].take()?,
                    false_since: subjects[i]
                        .published
                        .filter(|c| c.status == Status::False)
                        .map(|c| c.last_transition_time),
                })
            })
            .collect();
        let outcome = guard.apply(&mut members, now);
        for (member, &i) in members.into_iter().zip(&idx) {
            verdicts[i] = Some(member.candidate);
        }
        scopes.insert(scope.to_string(), (outcome, idx.len()));
    }
    Decision {
        candidates,
        verdicts,
        scopes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reason;

    fn now() -> Timestamp {
        "2026-12-01T12:00:00Z".parse().unwrap()
    }

    /// Evidence that is only this verdict, unavailable since `now()`.
    fn fixed(verdict: &Verdict) -> Evidence<'_> {
        Evidence::Unavailable {
            verdict,
            since: now(),
        }
    }

    fn subject<'a>(scope: &'a str, evidence: Evidence<'a>) -> Subject<'a> {
        Subject {
            scope: Some(scope),
            evidence,
            facts: MachineFacts::default(),
            published: None,
        }
    }

    #[test]
    fn subjects_without_evidence_get_no_verdict_and_no_condition() {
        let s = [subject("a", Evidence::None)];
        let d = decide(&s, &Graces::default(), &MassFailureGuard::default(), now());
        assert_eq!(d.verdicts, vec![None]);
        assert_eq!(d.conditions(&s, "T", now()), vec![None]);
        assert!(d.scopes.is_empty());
    }

    #[test]
    fn the_guard_holds_new_failures_per_scope_and_leaves_other_scopes_alone() {
        let failing = Verdict::new(Status::False, reason::VM_ERROR, "VM state Error");
        let fine = Verdict::new(Status::True, reason::VM_HEALTHY, "ok");
        let mut s: Vec<Subject> = (0..3).map(|_| subject("a", fixed(&failing))).collect();
        s.push(subject("a", fixed(&fine)));
        s.push(subject("b", fixed(&failing)));
        s.push(subject("b", fixed(&fine)));
        s.push(subject("b", fixed(&fine)));
        let d = decide(&s, &Graces::default(), &MassFailureGuard::default(), now());
        // Scope a: 3 of 4 turn False at once → held; scope b: a single failure → published.
        assert!(d.scopes["a"].0.held);
        assert_eq!(d.scopes["a"].1, 4);
        assert!(!d.scopes["b"].0.held);
        for v in &d.verdicts[..3] {
            assert_eq!(v.as_ref().unwrap().reason, reason::REMEDIATION_HELD);
        }
        assert_eq!(d.verdicts[4].as_ref().unwrap().status, Status::False);
        // The candidates keep the engine's view, for the NodeNotLinked lookup.
        assert_eq!(d.candidates[0].as_ref().unwrap().status, Status::False);
        let lookups: Vec<usize> = d.needing_node_lookup(&s).collect();
        assert_eq!(lookups, [0, 1, 2, 4]);
    }

    #[test]
    fn machines_with_a_node_or_being_deleted_need_no_node_lookup() {
        let failing = Verdict::new(Status::False, reason::VM_ERROR, "VM state Error");
        let mut with_node = subject("a", fixed(&failing));
        with_node.facts.has_node = true;
        let mut deleting = subject("a", fixed(&failing));
        deleting.facts.deleting = true;
        let plain = subject("a", fixed(&failing));
        let s = [with_node, deleting, plain];
        let d = decide(&s, &Graces::default(), &MassFailureGuard::default(), now());
        assert_eq!(d.needing_node_lookup(&s).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn only_a_machine_without_a_condition_has_its_provisional_first_write_held() {
        let provisional =
            Verdict::new(Status::True, reason::VM_RUNNING, "samples due").provisional_if(true);
        let decided = Verdict::new(Status::True, reason::VM_HEALTHY, "rising");
        let carried = next_condition(None, "CloudStackVMHealthy", &decided, now());
        let mut subjects = vec![
            subject("s", fixed(&provisional)),
            subject("s", fixed(&provisional)),
            subject("s", fixed(&decided)),
        ];
        subjects[1].published = Some(&carried);
        let d = decide(
            &subjects,
            &Graces::default(),
            &MassFailureGuard::default(),
            now(),
        );
        assert_eq!(d.first_writes_held(&subjects), [true, false, false]);
        // Only True is ever provisional.
        let unknown = Verdict::new(Status::Unknown, reason::VM_IN_TRANSITION, "starting");
        assert!(!unknown.provisional_if(true).provisional);
    }

    #[test]
    fn a_published_false_keeps_its_transition_time() {
        let failing = Verdict::new(Status::False, reason::VM_ERROR, "VM state Error");
        let since: Timestamp = "2026-12-01T11:00:00Z".parse().unwrap();
        let published = ConditionState {
            type_: "T".into(),
            status: Status::False,
            reason: reason::VM_ERROR.into(),
            message: "VM state Error".into(),
            last_transition_time: since,
        };
        let mut s = subject("a", fixed(&failing));
        s.published = Some(&published);
        let s = [s];
        let d = decide(&s, &Graces::default(), &MassFailureGuard::default(), now());
        let c = d.conditions(&s, "T", now());
        assert_eq!(c[0].as_ref().unwrap(), &published);
    }
}
