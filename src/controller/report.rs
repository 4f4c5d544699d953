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
use crate::status::{ClusterReport, FailureDomainReport, MachineReport, StatusReport};
use crate::verdict::{ConditionState, Status};

impl Controller {
    pub(super) async fn report(
        &self,
        g: &Gathered,
        d: &Decided,
        acted: Acted,
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
        for ((t, decided), escalation) in g.targets.iter().zip(&d.conditions).zip(acted.escalations)
        {
            let machine = format!("{}/{}", t.machine.namespace, t.machine.name);
            let write_error = acted.failed_writes.get(&machine).cloned();
            // A condition that could not be written is not what the Machine carries.
            let published = match write_error {
                Some(_) => t.current.as_deref(),
                None => decided.as_ref(),
            };
            let mut report = self.machine_report(g, t, published, escalation, &scope_names);
            report.write_error = write_error;
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
