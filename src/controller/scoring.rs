//! Phase 4b of a cycle, score (issue 44): each Machine as this cycle saw it — its verdict,
//! its Node, the MachineHealthCheck's mark, its deletion — into the scorecard
//! ([`crate::verdict::scorecard`]), and the outcomes that ended into the counters and the log.
//! The rules that read CAPI's objects are the small pure functions below.

use jiff::{SignedDuration, Timestamp};

use super::act::Acted;
use super::cycle::Controller;
use super::decide::Decided;
use super::gather::Gathered;
use super::targets::Target;
use crate::cloudstack::model::VmState;
use crate::k8s::coverage::{self, ActedOn};
use crate::k8s::watched::HealthCheckRecord;
use crate::status::ScorecardReport;
use crate::verdict::scorecard::{
    BootKey, Departed, Labels, MhcTrigger, Observation, Outcome, Seen, Timing, DEFAULT_WARN_POLICY,
};
use crate::verdict::{ConditionState, Status, VmHistory};
use capi_model::apis::Mode;
use capi_model::well_known;

/// CAPI's default `nodeStartupTimeout` (cluster-api v1.9.6
/// internal/webhooks/machinehealthcheck.go `defaultNodeStartupTimeout`; v1beta2 the same
/// 10 min): what an MHC without one waits.
pub const DEFAULT_NODE_STARTUP_TIMEOUT: SignedDuration = SignedDuration::from_mins(10);

/// The MHC reason for a Machine that carries the remediate annotation (v1beta1 and v1beta2
/// names: cluster-api v1.9.6 api/v1beta1/condition_consts.go `HasRemediateMachineAnnotationReason`,
/// api/v1beta1/machine_types.go `MachineHealthCheckHasRemediateAnnotationV1Beta2Reason`).
const ANNOTATION_REASONS: [&str; 2] = ["HasRemediateAnnotation", "HasRemediateMachineAnnotation"];
/// No Node within `nodeStartupTimeout` (the same name in both).
const NODE_STARTUP_TIMEOUT_REASON: &str = "NodeStartupTimeout";
/// A Machine condition the MHC lists (v1.13.5 machinehealthcheck_targets.go; v1beta1
/// `UnhealthyMachineConditionReason` is the same word).
const UNHEALTHY_MACHINE_REASON: &str = "UnhealthyMachine";

/// Why the MHC marked a Machine, from its `HealthCheckSucceeded=False` reason and message: the
/// shim's condition only when the MHC names it among its findings.
pub fn mhc_trigger(reason: &str, message: &str, condition_type: &str) -> MhcTrigger {
    if ANNOTATION_REASONS.contains(&reason) {
        return MhcTrigger::Annotation;
    }
    if reason == NODE_STARTUP_TIMEOUT_REASON {
        return MhcTrigger::NodeStartupTimeout;
    }
    let names_ours = message
        .split(['\n', ';'])
        .map(|item| item.trim().trim_start_matches("* "))
        .any(|item| item.starts_with(&format!("Condition {condition_type} on Machine ")));
    if reason == UNHEALTHY_MACHINE_REASON && names_ours {
        MhcTrigger::Condition
    } else {
        MhcTrigger::Other
    }
}

/// What acting on a `False` would take for this Machine, and when a Node-less one counts as
/// stuck: the escalation delay where the shim annotates (or, observing, would), the MHC's
/// timeout for the condition where an MHC acts on it; the shortest `nodeStartupTimeout` of
/// the MHCs covering it.
pub fn timing(
    acted_on: &ActedOn,
    observing: bool,
    covering: &[std::sync::Arc<HealthCheckRecord>],
    condition_type: &str,
    escalation_delay: SignedDuration,
) -> Timing {
    let listed = covering.iter().find_map(|m| {
        coverage::rule_for(m, condition_type, Status::False).map(|r| r.timeout.unwrap_or_default())
    });
    let action_lag = match acted_on {
        ActedOn::Condition { after, .. } => after.unwrap_or_default(),
        _ if observing => listed.unwrap_or(escalation_delay),
        _ => escalation_delay,
    };
    let stuck_after = covering
        .iter()
        .filter_map(|m| m.node_startup_timeout)
        .filter(|t| !t.is_zero())
        .min()
        .unwrap_or(DEFAULT_NODE_STARTUP_TIMEOUT);
    Timing {
        action_lag,
        stuck_after,
    }
}

/// The guest's counter rose at one of the last two samples.
pub fn traffic_rising(h: &VmHistory, now: Timestamp, stats_interval: SignedDuration) -> bool {
    h.traffic
        .last_rise
        .is_some_and(|r| now.duration_since(r) <= stats_interval * 2)
}

impl Controller {
    /// Folds this cycle into the scorecard; the outcomes that ended are counted and logged.
    pub(super) fn score(&mut self, g: &Gathered, d: &Decided, acted: &Acted, now: Timestamp) {
        let seen: Vec<Observation> = g
            .targets
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let decided = if d.first_write_held[i] {
                    None
                } else {
                    d.conditions[i].as_ref()
                };
                // Annotated by the shim: the escalation says so, or its annotation is queued
                // or written this cycle (the writes are detached: the Machine may carry it only
                // after it is gone from the next cycle).
                let key = format!("{}/{}", t.machine.namespace, t.machine.name);
                let annotated_by_shim = self.api.mode != Mode::Observe
                    && (acted
                        .escalations
                        .get(i)
                        .is_some_and(|e| e.state == "annotated")
                        || self.pending.annotations.contains_key(&key)
                        || self.pending.annotated_now.contains(&key));
                self.observation(g, t, decided, annotated_by_shim, now)
            })
            .collect();
        let departed: Vec<Departed> = g
            .departed
            .iter()
            .map(|r| {
                let m = &r.view;
                Departed {
                    uid: m
                        .uid
                        .clone()
                        .unwrap_or_else(|| format!("{}/{}", m.namespace, m.name)),
                    annotated: m.annotated(well_known::REMEDIATE_MACHINE),
                    mhc_marked: m.health_check_failed.as_ref().map(|(reason, message)| {
                        mhc_trigger(reason, message, &self.args.condition_type)
                    }),
                }
            })
            .collect();
        let ended = self.scorecard.observe_with(now, &seen, &departed);
        for o in &ended {
            self.metrics.count_outcome(o.kind.label(), &o.reason);
            log_outcome(o);
        }
    }

    fn observation(
        &self,
        g: &Gathered,
        t: &Target,
        decided: Option<&ConditionState>,
        annotated_by_shim: bool,
        now: Timestamp,
    ) -> Observation {
        let m = &t.machine;
        let history = g
            .scope_key(t)
            .zip(t.instance_id())
            .and_then(|(key, id)| self.scopes.get(key)?.polled.observer.histories.get(id));
        let sighting = history.and_then(|h| h.sighting.as_ref());
        let name = |v: Option<&Option<String>>| v.and_then(Clone::clone).unwrap_or_default();
        let labels = Labels {
            cluster: format!("{}/{}", m.namespace, m.cluster_name),
            zone: name(sighting.map(|s| &s.zone)),
            template: name(sighting.map(|s| &s.template)),
            offering: name(sighting.map(|s| &s.offering)),
            hypervisor: name(sighting.map(|s| &s.hypervisor)),
        };
        let boot_key = (!labels.template.is_empty() && !labels.zone.is_empty()).then(|| BootKey {
            template: labels.template.clone(),
            offering: labels.offering.clone(),
            zone: labels.zone.clone(),
        });
        let condition = decided.or(t.current.as_deref());
        let verdict = condition.map(|c| Seen {
            status: c.status,
            reason: c.reason.clone(),
            evidence: c.message.clone(),
            traffic_rising: history
                .is_some_and(|h| traffic_rising(h, now, self.graces.stats_interval)),
            since: c.last_transition_time,
        });
        let facts = self.coverage_facts(t);
        let acted_on = coverage::acted_on(&facts);
        let observing = self.api.mode == Mode::Observe;
        Observation {
            uid: m
                .uid
                .clone()
                .unwrap_or_else(|| format!("{}/{}", m.namespace, m.name)),
            machine: format!("{}/{}", m.namespace, m.name),
            labels,
            mode: self.api.mode,
            timing: timing(
                &acted_on,
                observing,
                &t.mhcs,
                &self.args.condition_type,
                self.args.escalation_delay,
            ),
            created: t.created,
            verdict,
            vm_running: sighting.is_some_and(|s| s.state == VmState::Running),
            // The shim's own annotation counts in the cycle that writes it: the Machine as
            // gathered does not carry it yet, and may be gone by the next cycle.
            annotated: (annotated_by_shim || m.annotated(well_known::REMEDIATE_MACHINE))
                .then_some(annotated_by_shim),
            mhc_marked: m
                .health_check_failed
                .as_ref()
                .map(|(reason, message)| mhc_trigger(reason, message, &self.args.condition_type)),
            has_node: m.has_node_ref,
            deleting: m.deleting,
            owned: m.owner_kind.is_some(),
            boot_key,
            mhcs: t
                .mhcs
                .iter()
                .map(|h| {
                    (
                        format!("{}/{}", h.namespace, h.name),
                        h.node_startup_timeout
                            .unwrap_or(DEFAULT_NODE_STARTUP_TIMEOUT),
                    )
                })
                .collect(),
        }
    }
}

impl Controller {
    /// `/status` `scorecard`, and the baseline and warning series brought up to it.
    pub(super) fn scorecard_report(&self) -> ScorecardReport {
        let kept = &self.scorecard.kept;
        let baselines = kept.baselines.rows();
        let warnings = self.scorecard.warnings(DEFAULT_WARN_POLICY);
        self.metrics.set_scorecard(&baselines, &warnings);
        ScorecardReport {
            since: kept.since,
            settle_seconds: self.scorecard.settle.as_secs(),
            following: self.scorecard.following(),
            totals: kept.totals.clone(),
            by_reason: kept.by_reason.clone(),
            groups: kept.groups.clone(),
            uneventful: kept.uneventful,
            untracked: kept.untracked,
            recent: kept.recent.iter().cloned().collect(),
            window_start: kept.baselines.current.start,
            window_seconds: kept.baselines.length.as_secs(),
            baselines,
            warnings,
            incidents: kept.incidents.iter().cloned().collect(),
            memory: self.scorecard_memory.as_ref().map(|m| m.report.clone()),
        }
    }
}

fn log_outcome(o: &Outcome) {
    let outcome = o.kind.label();
    if outcome == "false-alarm" {
        tracing::warn!(machine = %o.machine, outcome, reason = %o.reason, evidence = %o.evidence,
            "scorecard: the shim said False on a Machine that then became a healthy Node");
    } else {
        tracing::info!(machine = %o.machine, outcome, reason = %o.reason, kind = ?o.kind,
            "scorecard: a Machine's story ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mhc_mark_names_the_shim_only_when_its_findings_do() {
        let ours = "Health check failed:\n  * Condition CloudStackVMHealthy on Machine is reporting status False with reason VMError for more than 1m0s";
        assert_eq!(
            mhc_trigger("UnhealthyMachine", ours, "CloudStackVMHealthy"),
            MhcTrigger::Condition
        );
        // v1beta1's "a; b" list, ours second.
        let v1 = "Condition Ready on Machine is reporting status False for more than 5m0s; Condition CloudStackVMHealthy on Machine is reporting status False for more than 1m0s";
        assert_eq!(
            mhc_trigger("UnhealthyMachine", v1, "CloudStackVMHealthy"),
            MhcTrigger::Condition
        );
        let other = "Health check failed:\n  * Condition Ready on Machine is reporting status False for more than 5m0s";
        assert_eq!(
            mhc_trigger("UnhealthyMachine", other, "CloudStackVMHealthy"),
            MhcTrigger::Other
        );
        // Another condition whose name starts like ours is not ours.
        let prefix = "Condition CloudStackVMHealthyX on Machine is reporting status False for more than 1m0s";
        assert_eq!(
            mhc_trigger("UnhealthyMachine", prefix, "CloudStackVMHealthy"),
            MhcTrigger::Other
        );
        assert_eq!(
            mhc_trigger(
                "NodeStartupTimeout",
                "Node failed to report startup in 10m0s",
                "CloudStackVMHealthy"
            ),
            MhcTrigger::NodeStartupTimeout
        );
        for r in ANNOTATION_REASONS {
            assert_eq!(
                mhc_trigger(r, "", "CloudStackVMHealthy"),
                MhcTrigger::Annotation
            );
        }
        assert_eq!(
            mhc_trigger("UnhealthyNode", ours, "CloudStackVMHealthy"),
            MhcTrigger::Other
        );
    }

    fn mhc(json: serde_json::Value) -> std::sync::Arc<HealthCheckRecord> {
        let mut v = serde_json::json!({"metadata": {"name": "workers", "namespace": "default"}});
        v["spec"] = json;
        std::sync::Arc::new(HealthCheckRecord::from_json(&v).expect("an MHC"))
    }

    #[test]
    fn timing_follows_who_acts_and_the_shortest_startup_timeout() {
        let delay = SignedDuration::from_secs(60);
        let listing = mhc(serde_json::json!({
            "nodeStartupTimeout": "20m",
            "unhealthyMachineConditions": [{"type": "CloudStackVMHealthy", "status": "False", "timeout": "2m"}],
        }));
        let v1beta2 = mhc(serde_json::json!({"checks": {"nodeStartupTimeoutSeconds": 900}}));
        let condition = ActedOn::Condition {
            mhc: "default/workers".into(),
            after: Some(SignedDuration::from_secs(120)),
        };
        let t = timing(
            &condition,
            false,
            &[listing.clone(), v1beta2.clone()],
            "CloudStackVMHealthy",
            delay,
        );
        assert_eq!(t.action_lag, SignedDuration::from_secs(120));
        assert_eq!(t.stuck_after, SignedDuration::from_secs(900));
        let annotation = ActedOn::Annotation { fallback: true };
        let t = timing(
            &annotation,
            false,
            std::slice::from_ref(&v1beta2),
            "CloudStackVMHealthy",
            delay,
        );
        assert_eq!(t.action_lag, delay);
        // Observing: what the MHC listing the condition would take, else the escalation delay.
        let none = ActedOn::None {
            why: "observe".into(),
            deliberate: true,
        };
        let t = timing(&none, true, &[listing], "CloudStackVMHealthy", delay);
        assert_eq!(t.action_lag, SignedDuration::from_secs(120));
        assert_eq!(t.stuck_after, SignedDuration::from_mins(20));
        let t = timing(&none, true, &[], "CloudStackVMHealthy", delay);
        assert_eq!(
            (t.action_lag, t.stuck_after),
            (delay, DEFAULT_NODE_STARTUP_TIMEOUT)
        );
    }
}
