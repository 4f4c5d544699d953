//! Phase 5 of a cycle, report: what each Machine's verdict and escalation are, per cluster,
//! scope and failure domain, into `/status` and the verdict gauges.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use jiff::Timestamp;

use super::act::{Acted, EscalationState};
use super::cycle::{Controller, CycleSummary};
use super::decide::Decided;
use super::gather::Gathered;
use super::targets::{Target, TargetProblem};
use crate::k8s::coverage;
use crate::status::{
    ClusterReport, FailureDomainReport, IncidentReport, MachineReport, PendingVerdict, StatusReport,
};
use crate::verdict::condition::is_unchanged;
use crate::verdict::{ConditionState, Status};

impl Controller {
    pub(super) async fn report(
        &self,
        g: &Gathered,
        d: &Decided,
        acted: Acted,
        incidents: Vec<IncidentReport>,
        summary: &CycleSummary,
        now: Timestamp,
    ) {
        let mut clusters: BTreeMap<String, ClusterReport> = BTreeMap::new();
        let mut unacted: BTreeMap<String, i64> = BTreeMap::new();
        // One copy of each scope key for all the Machines polled in it.
        let scope_names: HashMap<&str, Arc<str>> = g
            .scope_of
            .values()
            .map(|k| (k.as_str(), Arc::from(k.as_str())))
            .collect();
        for (((t, decided), held), escalation) in g
            .targets
            .iter()
            .zip(&d.conditions)
            .zip(&d.first_write_held)
            .zip(acted.escalations)
        {
            let machine = format!("{}/{}", t.machine.namespace, t.machine.name);
            let write_error = acted.failed_writes.get(&machine).cloned();
            let queued = self.pending.conditions.get(&machine).map(|(_, c)| &**c);
            // The watch cache's own, when what gather laid over it is the write still queued.
            let cached = || {
                self.stores
                    .machines
                    .get(&t.machine.namespace, &t.machine.name)
                    .and_then(|m| m.current.clone())
            };
            let carried = match (t.current.as_deref(), queued) {
                (Some(c), Some(q)) if c == q => cached(),
                (c, _) => c.cloned().map(Arc::new),
            };
            let (published, pending) = shown(
                decided.as_ref(),
                carried.as_deref(),
                write_error.is_some(),
                *held,
                queued,
            );
            let mut report = self.machine_report(g, t, published, escalation, &scope_names);
            report.write_error = write_error;
            report.pending = pending.map(|(c, state)| PendingVerdict {
                verdict: c.status,
                reason: c.reason.clone(),
                state: state.into(),
            });
            let facts = self.coverage_facts(t);
            let acted = coverage::acted_on(&facts);
            report.acted_on_detail = coverage::acted_on_detail(&facts, &acted);
            report.acted_on = acted.to_string();
            let cluster = format!("{}/{}", t.machine.namespace, t.machine.cluster_name);
            // The Machines standing False that nothing will recycle: the alert's gauge.
            let gap = published.is_some_and(|p| p.status == Status::False) && acted.is_gap();
            *unacted.entry(cluster.clone()).or_default() += i64::from(gap);
            clusters
                .entry(cluster)
                .or_default()
                .machines
                .insert(t.machine.name.clone(), report);
        }
        self.metrics.set_verdict_counts(&verdict_counts(&clusters));
        self.metrics.set_standing(&clusters, now);
        self.metrics.set_false_unacted(unacted);
        let failure_domains = failure_domains(&clusters);
        let (orphans, orphan_detection) = self.orphan_report();
        let (remnants, remnant_detection) = self.remnant_report();
        let mut r = StatusReport {
            generated_at: Some(now),
            api: Some(self.api.clone()),
            problems: summary.problems.clone(),
            clusters,
            scopes: self
                .scopes
                .values()
                .filter(|s| s.in_use)
                .map(|s| s.report.clone())
                .collect(),
            failure_domains,
            probe: self.probe_report(),
            orphans,
            orphan_detection,
            remnants,
            remnant_detection,
            writes: self.write_counts(),
            scorecard: Some(self.scorecard_report()),
            incidents,
            ..Default::default()
        };
        // Series of scopes that are gone (past their retention) and of deleted Clusters go too.
        let scopes: std::collections::BTreeSet<String> = self.scopes.keys().cloned().collect();
        let clusters = self
            .stores
            .clusters
            .state()
            .iter()
            .map(|c| format!("{}/{}", c.namespace, c.name))
            .chain(r.clusters.keys().cloned())
            .collect();
        self.metrics.forget_gone(&scopes, &clusters);
        if let Some(m) = &r.orphan_detection.memory {
            let problems = m.problems();
            r.problems.extend(problems);
        }
        if let Some(m) = r.scorecard.as_ref().and_then(|s| s.memory.as_ref()) {
            self.metrics.set_scorecard_memory(m);
            let problems = m.problems();
            r.problems.extend(problems);
        }
        if let Some(p) = r.probe.clone() {
            r.problems.extend(p.last_error);
            r.problems.extend(
                p.refused
                    .map(|why| format!("guest probe off: CloudStack refused its key ({why})")),
            );
        }
        // Swapped in, then rendered once: no GET /status waits for (or repeats) the rendering.
        self.report.publish(r).await;
    }

    fn machine_report(
        &self,
        g: &Gathered,
        t: &Target,
        published: Option<&ConditionState>,
        escalation: EscalationState,
        scope_names: &HashMap<&str, Arc<str>>,
    ) -> MachineReport {
        let scope = g
            .scope_key(t)
            .and_then(|k| scope_names.get(k.as_str()).cloned());
        let vm_state = scope
            .as_ref()
            .and_then(|k| self.scopes.get(&**k))
            .zip(t.instance_id())
            .and_then(|(s, id)| s.polled.observer.histories.get(id))
            .and_then(|h| h.sighting.as_ref())
            .map(|s| s.state.to_string());
        let mut report = MachineReport {
            namespace: t.machine.namespace.clone(),
            name: t.machine.name.clone(),
            control_plane: t.machine.is_control_plane(),
            vm_id: t.instance_id().cloned(),
            mhc_covered: t.mhc_covered(),
            escalation: escalation.state.into(),
            escalation_detail: escalation.detail,
            scope,
            vm_state,
            ..Default::default()
        };
        report.message = match &t.problem {
            Some(TargetProblem::NoCloudStackMachine(name)) => Some(format!(
                "CloudStackMachine {name} not found; nothing to judge yet"
            )),
            Some(TargetProblem::NoInstanceId) => {
                Some("the CloudStackMachine has no instanceID yet (VM not deployed)".into())
            }
            _ => None,
        };
        if let Some(p) = published {
            report.verdict = Some(p.status);
            report.reason = Some(p.reason.clone());
            report.message = Some(p.message.clone());
            report.since = Some(p.last_transition_time);
        }
        report
    }
}

/// What `/status` and the verdict gauges show of a Machine's condition: what it carries, and
/// apart from that a verdict decided but not on it yet — its first condition held for the
/// traffic samples (`held`) or a write still queued or being sent (`queued`). A write that
/// failed leaves what it carries (the failure is shown on its own); otherwise the decision is
/// on the Machine (unchanged, or written this cycle).
fn shown<'a>(
    decided: Option<&'a ConditionState>,
    carried: Option<&'a ConditionState>,
    write_failed: bool,
    held: bool,
    queued: Option<&'a ConditionState>,
) -> (
    Option<&'a ConditionState>,
    Option<(&'a ConditionState, &'static str)>,
) {
    if write_failed {
        return (carried, None);
    }
    if held {
        return (carried, decided.map(|c| (c, "held")));
    }
    if queued.is_none() {
        return (decided, None);
    }
    // A write is queued or being sent: the decision is pending unless the Machine already
    // carries it (the queued write was for a decision since revoked, e.g. a recovery).
    let pending = decided.filter(|d| !is_unchanged(carried, d));
    (carried, pending.map(|d| (d, "queued")))
}

/// Machines per (status, reason), for `capc_health_verdicts`.
fn verdict_counts(clusters: &BTreeMap<String, ClusterReport>) -> BTreeMap<(Status, String), i64> {
    let mut counts: BTreeMap<(Status, String), i64> = BTreeMap::new();
    for m in clusters.values().flat_map(|c| c.machines.values()) {
        if let (Some(s), Some(r)) = (m.verdict, &m.reason) {
            *counts.entry((s, r.clone())).or_default() += 1;
        }
    }
    counts
}

/// Machines and failing Machines per namespace and scope.
fn failure_domains(clusters: &BTreeMap<String, ClusterReport>) -> Vec<FailureDomainReport> {
    let mut fds: BTreeMap<(&str, &str), (usize, usize)> = BTreeMap::new();
    for (key, c) in clusters {
        let ns = key.split('/').next().unwrap_or_default();
        for m in c.machines.values() {
            let entry = fds
                .entry((ns, m.scope.as_deref().unwrap_or("-")))
                .or_default();
            entry.0 += 1;
            if m.verdict == Some(Status::False) {
                entry.1 += 1;
            }
        }
    }
    fds.into_iter()
        .map(
            |((namespace, name), (machines, failing))| FailureDomainReport {
                namespace: namespace.to_string(),
                name: name.to_string(),
                machines,
                failing,
                failure_ratio: if machines == 0 {
                    0.0
                } else {
                    failing as f64 / machines as f64
                },
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(status: Status, reason: &str) -> ConditionState {
        ConditionState {
            type_: "CloudStackVMHealthy".into(),
            status,
            reason: reason.into(),
            message: format!("{reason} evidence"),
            last_transition_time: "2026-12-01T10:00:00Z".parse().unwrap(),
        }
    }

    /// A verdict counts as published (in `/status`'s verdict fields and so in
    /// `capc_health_machines`) only once it is on the Machine; a held first write or a write
    /// still queued shows apart, as pending (before, both showed as published).
    #[test]
    fn only_what_the_machine_carries_is_published() {
        let healthy = condition(Status::True, "VMHealthy");
        let failed = condition(Status::False, "VMError");
        let running = condition(Status::True, "VMRunning");
        let show = |(p, pending): (Option<&ConditionState>, Option<(&ConditionState, &str)>)| {
            (
                p.map(|c| c.reason.clone()),
                pending.map(|(c, s)| format!("{}:{s}", c.reason)),
            )
        };
        // Decided and on the Machine (unchanged, or written this cycle).
        assert_eq!(
            show(shown(Some(&failed), Some(&healthy), false, false, None)),
            (Some("VMError".into()), None)
        );
        // Its write is still queued: the Machine carries True.
        assert_eq!(
            show(shown(
                Some(&failed),
                Some(&healthy),
                false,
                false,
                Some(&failed)
            )),
            (Some("VMHealthy".into()), Some("VMError:queued".into()))
        );
        // Recovered while its False was queued (revoked): nothing pending, True published.
        assert_eq!(
            show(shown(
                Some(&healthy),
                Some(&healthy),
                false,
                false,
                Some(&failed)
            )),
            (Some("VMHealthy".into()), None)
        );
        // A first condition held for the traffic samples: nothing published yet.
        assert_eq!(
            show(shown(Some(&running), None, false, true, None)),
            (None, Some("VMRunning:held".into()))
        );
        // A failed write: what the Machine still carries, nothing pending.
        assert_eq!(
            show(shown(Some(&failed), Some(&healthy), true, false, None)),
            (Some("VMHealthy".into()), None)
        );
    }

    /// The gauge counts what `/status` publishes: a queued False is not counted as False.
    #[test]
    fn verdict_counts_leave_pending_verdicts_out() {
        let healthy = condition(Status::True, "VMHealthy");
        let failed = condition(Status::False, "VMError");
        let mut c = ClusterReport::default();
        for (name, (published, pending)) in [
            (
                "m1",
                shown(Some(&failed), Some(&healthy), false, false, Some(&failed)),
            ),
            (
                "m2",
                shown(Some(&failed), Some(&failed), false, false, None),
            ),
            ("m3", shown(Some(&healthy), None, false, true, None)),
        ] {
            let m = MachineReport {
                verdict: published.map(|p| p.status),
                reason: published.map(|p| p.reason.clone()),
                pending: pending.map(|(c, s)| PendingVerdict {
                    verdict: c.status,
                    reason: c.reason.clone(),
                    state: s.into(),
                }),
                ..Default::default()
            };
            c.machines.insert(name.into(), m);
        }
        let counts = verdict_counts(&BTreeMap::from([("ns/c1".to_string(), c)]));
        assert_eq!(
            counts,
            BTreeMap::from([
                ((Status::True, "VMHealthy".to_string()), 1),
                ((Status::False, "VMError".to_string()), 1),
            ])
        );
    }
}
