//! Whether to escalate a `False` Machine with the remediate-machine annotation (annotate
//! mode, or auto mode where the covering MachineHealthChecks do not list the condition:
//! [`super::coverage::annotates`]), with every guard of product.md §5. Pure: the caller
//! gathers the facts.

use jiff::{SignedDuration, Timestamp};

use super::objects::MachineView;
use crate::verdict::Status;
use capi_model::well_known;

/// Why an escalation is held back. Constants double as `/status` and Event reasons.
pub mod hold {
    pub const NOT_COVERED: &str = "NotCoveredByMachineHealthCheck";
    pub const OWNER_CANNOT_REMEDIATE: &str = "OwnerCannotRemediate";
    pub const DELETING: &str = "MachineDeleting";
    pub const PAUSED: &str = "Paused";
    pub const SKIP_REMEDIATION: &str = "SkipRemediation";
    pub const CONTROL_PLANE_IN_FLIGHT: &str = "ControlPlaneEscalationInFlight";
    pub const ESCALATION_DELAY: &str = "EscalationDelay";
}

/// What the controller knows when deciding.
#[derive(Debug, Clone)]
pub struct EscalationFacts<'a> {
    /// The annotation is this Machine's path to recycling ([`super::coverage::annotates`]).
    pub annotates: bool,
    pub machine: &'a MachineView,
    /// The published condition's status and when it last flipped.
    pub status: Status,
    pub since: Timestamp,
    pub now: Timestamp,
    /// How long a verdict must stay `False` before the annotation is set.
    pub delay: SignedDuration,
    /// Some MachineHealthCheck selects this Machine.
    pub covered_by_mhc: bool,
    /// The owning Cluster is paused.
    pub cluster_paused: bool,
    /// Another control-plane Machine of the same cluster is escalated and still exists.
    pub control_plane_escalation_in_flight: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Escalation {
    /// Set the annotation now.
    Annotate,
    /// The annotation is already there: it is the record, nothing to repeat.
    AlreadyAnnotated,
    /// Nothing to escalate (not `False`, or the annotation is not this Machine's path).
    NotNeeded,
    /// `False`, but a guard holds it back; `until` when only time stands in the way.
    Held {
        reason: &'static str,
        message: String,
        until: Option<Timestamp>,
    },
}

pub fn decide(f: &EscalationFacts<'_>) -> Escalation {
    let m = f.machine;
    if !f.annotates || f.status != Status::False {
        return Escalation::NotNeeded;
    }
    if m.annotated(well_known::REMEDIATE_MACHINE) {
        return Escalation::AlreadyAnnotated;
    }
    let held = |reason: &'static str, message: String| Escalation::Held {
        reason,
        message,
        until: None,
    };
    if m.deleting {
        return held(
            hold::DELETING,
            "the Machine is already being deleted".into(),
        );
    }
    if f.cluster_paused || m.annotated(well_known::PAUSED) {
        return held(hold::PAUSED, "the Machine or its Cluster is paused".into());
    }
    if m.annotated(well_known::SKIP_REMEDIATION) {
        return held(
            hold::SKIP_REMEDIATION,
            format!("the Machine carries {}", well_known::SKIP_REMEDIATION),
        );
    }
    match m.owner_kind.as_deref() {
        Some("MachineSet") | Some("KubeadmControlPlane") => {}
        other => {
            return held(
                hold::OWNER_CANNOT_REMEDIATE,
                format!(
                    "owned by {}; only MachineSet and KubeadmControlPlane remediate Machines",
                    other.unwrap_or("nothing")
                ),
            )
        }
    }
    if !f.covered_by_mhc {
        return held(
            hold::NOT_COVERED,
            "no MachineHealthCheck selects this Machine, so the annotation would not be acted on"
                .into(),
        );
    }
    if m.is_control_plane() && f.control_plane_escalation_in_flight {
        return held(
            hold::CONTROL_PLANE_IN_FLIGHT,
            format!(
                "another control-plane Machine of cluster {} is already being remediated",
                m.cluster_name
            ),
        );
    }
    let due = crate::verdict::later(f.since, f.delay);
    if f.now < due {
        return Escalation::Held {
            reason: hold::ESCALATION_DELAY,
            message: format!(
                "False since {}; escalating at {}",
                crate::verdict::at(f.since),
                crate::verdict::at(due)
            ),
            until: Some(due),
        };
    }
    Escalation::Annotate
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn worker() -> MachineView {
        MachineView {
            namespace: "ns".into(),
            name: "m".into(),
            cluster_name: "c1".into(),
            owner_kind: Some("MachineSet".into()),
            infrastructure_kind: Some("CloudStackMachine".into()),
            ..Default::default()
        }
    }

    fn facts(m: &MachineView) -> EscalationFacts<'_> {
        EscalationFacts {
            annotates: true,
            machine: m,
            status: Status::False,
            since: t(0),
            now: t(120),
            delay: SignedDuration::from_secs(60),
            covered_by_mhc: true,
            cluster_paused: false,
            control_plane_escalation_in_flight: false,
        }
    }

    fn reason(e: Escalation) -> &'static str {
        match e {
            Escalation::Held { reason, .. } => reason,
            other => panic!("expected Held, got {other:?}"),
        }
    }

    #[test]
    fn a_covered_false_worker_past_the_delay_is_annotated() {
        let m = worker();
        assert_eq!(decide(&facts(&m)), Escalation::Annotate);
    }

    #[test]
    fn only_false_on_the_annotation_path_escalates() {
        let m = worker();
        for status in [Status::True, Status::Unknown] {
            assert_eq!(
                decide(&EscalationFacts {
                    status,
                    ..facts(&m)
                }),
                Escalation::NotNeeded
            );
        }
        assert_eq!(
            decide(&EscalationFacts {
                annotates: false,
                ..facts(&m)
            }),
            Escalation::NotNeeded
        );
    }

    #[test]
    fn the_annotation_is_the_record() {
        let mut m = worker();
        m.annotations
            .insert(well_known::REMEDIATE_MACHINE.into(), String::new());
        assert_eq!(decide(&facts(&m)), Escalation::AlreadyAnnotated);
    }

    #[test]
    fn every_guard_holds() {
        let mut m = worker();
        m.deleting = true;
        assert_eq!(reason(decide(&facts(&m))), hold::DELETING);

        let m = worker();
        assert_eq!(
            reason(decide(&EscalationFacts {
                cluster_paused: true,
                ..facts(&m)
            })),
            hold::PAUSED
        );
        let mut m = worker();
        m.annotations
            .insert(well_known::PAUSED.into(), String::new());
        assert_eq!(reason(decide(&facts(&m))), hold::PAUSED);

        let mut m = worker();
        m.annotations
            .insert(well_known::SKIP_REMEDIATION.into(), String::new());
        assert_eq!(reason(decide(&facts(&m))), hold::SKIP_REMEDIATION);

        for owner in [None, Some("MachinePool"), Some("Cluster")] {
            let mut m = worker();
            m.owner_kind = owner.map(str::to_string);
            assert_eq!(reason(decide(&facts(&m))), hold::OWNER_CANNOT_REMEDIATE);
        }

        let m = worker();
        assert_eq!(
            reason(decide(&EscalationFacts {
                covered_by_mhc: false,
                ..facts(&m)
            })),
            hold::NOT_COVERED
        );
    }

    #[test]
    fn one_control_plane_escalation_per_cluster() {
        let mut m = worker();
        m.owner_kind = Some("KubeadmControlPlane".into());
        std::sync::Arc::make_mut(&mut m.labels)
            .insert(well_known::CONTROL_PLANE_LABEL.into(), String::new());
        let busy = EscalationFacts {
            control_plane_escalation_in_flight: true,
            ..facts(&m)
        };
        assert_eq!(reason(decide(&busy)), hold::CONTROL_PLANE_IN_FLIGHT);
        assert_eq!(decide(&facts(&m)), Escalation::Annotate);
        // Workers are not limited by control-plane escalations.
        let w = worker();
        assert_eq!(
            decide(&EscalationFacts {
                control_plane_escalation_in_flight: true,
                ..facts(&w)
            }),
            Escalation::Annotate
        );
    }

    #[test]
    fn the_escalation_delay_counts_from_the_transition() {
        let m = worker();
        let early = EscalationFacts {
            now: t(30),
            ..facts(&m)
        };
        match decide(&early) {
            Escalation::Held { reason, until, .. } => {
                assert_eq!(reason, hold::ESCALATION_DELAY);
                assert_eq!(until, Some(t(60)));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            decide(&EscalationFacts {
                now: t(60),
                ..facts(&m)
            }),
            Escalation::Annotate
        );
    }
}
