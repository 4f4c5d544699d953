//! Phase 4 of a cycle, act: write every changed condition ([`RunArgs::max_concurrent_writes`]
//! at a time; a cold start has one per Machine), its Event when the status changed, and in
//! annotate mode the remediate annotation where the escalation guards allow it.
//!
//! Every write first passes the [`LeaseGate`](super::leadership::LeaseGate) and runs under its
//! own timeout (`--kube-timeout`); once the Lease is found lost, nothing more is written.
//!
//! [`RunArgs::max_concurrent_writes`]: super::config::RunArgs::max_concurrent_writes

use std::collections::BTreeSet;

use futures::stream::{self, StreamExt};
use jiff::Timestamp;

use super::cycle::{Controller, CycleSummary, Written};
use super::decide::Decided;
use super::gather::Gathered;
use super::kube_io;
use super::leadership::Refusal;
use super::targets::Target;
use crate::cli::to_std;
use crate::k8s::escalation::{self, Escalation, EscalationFacts};
use crate::k8s::kube_error::KubeError;
use crate::verdict::condition::{is_unchanged, needs_event};
use crate::verdict::{ConditionState, Status};
use capi_model::well_known;

/// Where a Machine's escalation stands after this cycle, for `/status`.
#[derive(Debug, Clone, Default)]
pub(super) struct EscalationState {
    /// `none`, `pending`, `held` or `annotated`.
    pub state: &'static str,
    pub detail: Option<String>,
}

/// What the act phase did, for the report.
#[derive(Debug, Default)]
pub(super) struct Acted {
    /// Each target's escalation state (in target order).
    pub escalations: Vec<EscalationState>,
    /// Machines (`namespace/name`) whose condition write failed this cycle, with why: `/status`
    /// shows what they still carry and the failure, not the condition that was not written.
    pub failed_writes: std::collections::BTreeMap<String, String>,
}

/// The kinds of writes, as the `kind` label of `capc_health_kube_writes_total`.
pub(super) mod kind {
    pub const CONDITION: &str = "condition";
    pub const ANNOTATION: &str = "annotation";
    pub const EVENT: &str = "event";
}

impl Controller {
    /// Acts on `d`: conditions, Events, annotations. Returns each target's escalation state.
    pub(super) async fn act(
        &mut self,
        g: &Gathered,
        d: &Decided,
        now: Timestamp,
        summary: &mut CycleSummary,
    ) -> Acted {
        // Why writes were not sent this cycle (the first refusal stands for all of them).
        let mut refused: Option<String> = None;
        let mut failed_writes = std::collections::BTreeMap::new();
        for (t, next, outcome) in self.write_conditions(&g.targets, &d.conditions).await {
            match &outcome {
                Err(KubeError::NotLeader { message, .. }) => {
                    refused.get_or_insert_with(|| message.clone());
                }
                Err(e) => {
                    failed_writes.insert(
                        format!("{}/{}", t.machine.namespace, t.machine.name),
                        format!("could not write {}/{}: {e}", next.status, next.reason),
                    );
                }
                Ok(()) => {}
            }
            self.record_write(t, next, outcome, now, summary);
        }
        let mut cp_in_flight: BTreeSet<(String, String)> = g
            .targets
            .iter()
            .filter(|t| {
                t.machine.is_control_plane() && t.machine.annotated(well_known::REMEDIATE_MACHINE)
            })
            .map(|t| (t.machine.namespace.clone(), t.machine.cluster_name.clone()))
            .collect();
        let mut states = Vec::with_capacity(g.targets.len());
        for (i, (t, next)) in g.targets.iter().zip(&d.conditions).enumerate() {
            let mut state = EscalationState {
                state: if t.machine.annotated(well_known::REMEDIATE_MACHINE) {
                    "annotated"
                } else {
                    "none"
                },
                detail: None,
            };
            let machine = format!("{}/{}", t.machine.namespace, t.machine.name);
            if let Some(error) = failed_writes.get(&machine) {
                // Never escalate on a condition the Machine does not carry.
                state.state = "held";
                state.detail = Some(error.clone());
                states.push(state);
                continue;
            }
            if let Some(published) = next {
                if let Some(node) = d.unlinked.get(&i) {
                    state.state = "held";
                    state.detail = Some(format!(
                        "{}: Node {node} exists",
                        crate::verdict::reason::NODE_NOT_LINKED
                    ));
                }
                if let Err(message) = self
                    .escalate(t, published, now, &mut cp_in_flight, &mut state, summary)
                    .await
                {
                    refused.get_or_insert(message);
                }
            }
            states.push(state);
        }
        if self.lease.lost() {
            summary.lost_lease = true;
        }
        if let Some(why) = refused {
            // Once per cycle, not once per Machine: a cold start refuses thousands at once.
            tracing::warn!(writes = summary.refused_writes, reason = %why,
                "not writing: the leader Lease is not confirmed");
            summary.problems.push(format!(
                "{} write(s) not sent: {why}",
                summary.refused_writes
            ));
        }
        Acted {
            escalations: states,
            failed_writes,
        }
    }

    /// Sends one write of `kind` about `object` (`Machine ns/name`) if the Lease is confirmed, and counts its
    /// outcome; a refusal is the write's error ([`KubeError::NotLeader`]) and nothing is sent
    /// (`write` is a future: it does nothing until awaited here).
    pub(super) async fn gated(
        &self,
        kind: &str,
        object: &str,
        write: impl std::future::Future<Output = Result<(), KubeError>>,
    ) -> Result<(), KubeError> {
        let outcome = match self.lease.confirm().await {
            Ok(()) => write.await,
            Err(refusal) => {
                tracing::debug!(object = %object, kind = kind, reason = %refusal.message(),
                    "write not sent: the leader Lease is not confirmed");
                let message = match &refusal {
                    Refusal::Lost(why) => format!("no longer the leader: {why}"),
                    Refusal::Unconfirmed(why) => why.clone(),
                };
                Err(KubeError::NotLeader {
                    what: format!("{kind} on {object}"),
                    message,
                })
            }
        };
        let label = outcome.as_ref().map_or_else(KubeError::label, |()| "ok");
        self.metrics.record_write(kind, label);
        outcome
    }

    /// Writes every changed condition, followed by its Event when the status changed. Each
    /// written target with its condition and the outcome, in target order.
    async fn write_conditions<'a>(
        &self,
        targets: &'a [Target],
        nexts: &'a [Option<ConditionState>],
    ) -> Vec<(&'a Target, &'a ConditionState, Result<(), KubeError>)> {
        let changed = targets
            .iter()
            .zip(nexts)
            .enumerate()
            .filter_map(|(i, (t, next))| {
                let next = next.as_ref()?;
                (!is_unchanged(t.current.as_ref(), next)).then_some((i, t, next))
            });
        let mut outcomes: Vec<(usize, Result<(), KubeError>)> = stream::iter(changed)
            .map(|(i, t, next)| async move { (i, self.write_condition(t, next).await) })
            .buffer_unordered(usize::from(self.args.max_concurrent_writes))
            .collect()
            .await;
        outcomes.sort_by_key(|(i, _)| *i);
        outcomes
            .into_iter()
            .filter_map(|(i, outcome)| Some((&targets[i], nexts[i].as_ref()?, outcome)))
            .collect()
    }

    async fn write_condition(&self, t: &Target, next: &ConditionState) -> Result<(), KubeError> {
        let m = &t.machine;
        let machine = format!("{}/{}", m.namespace, m.name);
        let timeout = to_std(self.args.kube_timeout);
        let write = kube_io::apply_condition(
            &self.client,
            &self.resources.machine,
            self.api.layout,
            (&m.namespace, &m.name),
            next,
            timeout,
        );
        self.gated(kind::CONDITION, &format!("Machine {machine}"), write)
            .await?;
        tracing::debug!(machine = %machine, status = %next.status, reason = %next.reason, "condition written");
        let previous = t.current.as_ref().map(|c| c.status);
        if previous != Some(next.status) {
            tracing::info!(machine = %machine, status = %next.status, reason = %next.reason,
                message = %next.message, "verdict changed");
        }
        if needs_event(previous, next.status) {
            let note = format!(
                "{} is {}: {}",
                self.args.condition_type, next.status, next.message
            );
            self.publish_event(t, next.status != Status::True, &next.reason, note)
                .await;
        }
        Ok(())
    }

    /// An Event about `t`'s Machine; a failure is logged and counted, never fatal.
    async fn publish_event(&self, t: &Target, warning: bool, reason: &str, note: String) {
        let m = &t.machine;
        let machine = format!("{}/{}", m.namespace, m.name);
        let write = self.events.publish(
            (&m.namespace, &m.name, m.uid.as_deref()),
            warning,
            reason,
            note,
            to_std(self.args.kube_timeout),
        );
        if let Err(e) = self
            .gated(kind::EVENT, &format!("Machine {machine}"), write)
            .await
        {
            tracing::warn!(machine = %machine, error = %e, "cannot publish Event");
        }
    }

    /// The bookkeeping of one condition write: our record of it, metrics, the cycle's count.
    fn record_write(
        &mut self,
        t: &Target,
        next: &ConditionState,
        outcome: Result<(), KubeError>,
        now: Timestamp,
        summary: &mut CycleSummary,
    ) {
        match outcome {
            Ok(()) => {}
            Err(KubeError::NotLeader { .. }) => {
                summary.refused_writes += 1;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "condition write failed; retried next cycle");
                summary.problems.push(e.to_string());
                return;
            }
        }
        summary.condition_writes += 1;
        if let Some(uid) = &t.machine.uid {
            self.written.insert(
                uid.clone(),
                Written {
                    condition: next.clone(),
                    based_on: t.machine.resource_version.clone(),
                },
            );
        }
        if t.current.as_ref().map(|c| c.status) != Some(next.status) {
            self.metrics.record_transition(next.status, &next.reason);
            if next.status == Status::False {
                if let Some(created) = t.created {
                    self.metrics.observe_time_to_false(
                        &next.reason,
                        now.duration_since(created).as_secs_f64(),
                    );
                }
            }
        }
    }

    /// Escalates `t` when the guards allow it; `Err` carries why an annotation was not sent
    /// because the Lease could not be confirmed.
    async fn escalate(
        &mut self,
        t: &Target,
        published: &ConditionState,
        now: Timestamp,
        cp_in_flight: &mut BTreeSet<(String, String)>,
        state: &mut EscalationState,
        summary: &mut CycleSummary,
    ) -> Result<(), String> {
        let m = &t.machine;
        let cluster = (m.namespace.clone(), m.cluster_name.clone());
        let decision = escalation::decide(&EscalationFacts {
            mode: self.api.mode,
            machine: m,
            status: published.status,
            since: published.last_transition_time,
            now,
            delay: self.args.escalation_delay,
            covered_by_mhc: t.mhc_covered,
            cluster_paused: t.cluster_paused,
            control_plane_escalation_in_flight: cp_in_flight.contains(&cluster),
        });
        match decision {
            Escalation::NotNeeded => {}
            Escalation::AlreadyAnnotated => state.state = "annotated",
            Escalation::Held {
                reason,
                message,
                until,
            } => {
                state.state = if until.is_some() { "pending" } else { "held" };
                state.detail = Some(format!("{reason}: {message}"));
            }
            Escalation::Annotate => {
                let machine = format!("{}/{}", m.namespace, m.name);
                let write = kube_io::annotate_for_remediation(
                    &self.client,
                    &self.resources.machine,
                    (&m.namespace, &m.name),
                    &published.reason,
                    to_std(self.args.kube_timeout),
                );
                match self
                    .gated(kind::ANNOTATION, &format!("Machine {machine}"), write)
                    .await
                {
                    Ok(()) => {}
                    Err(KubeError::NotLeader { message, .. }) => {
                        summary.refused_writes += 1;
                        return Err(message);
                    }
                    Err(e) => {
                        summary.problems.push(e.to_string());
                        return Ok(());
                    }
                }
                summary.annotations += 1;
                self.metrics.record_escalation("annotated");
                state.state = "annotated";
                if m.is_control_plane() {
                    cp_in_flight.insert(cluster);
                }
                tracing::warn!(machine = %machine, reason = %published.reason,
                    "escalated: remediate-machine annotation set");
                let note = format!(
                    "set {} after {} False since {}: {}",
                    well_known::REMEDIATE_MACHINE,
                    self.args.condition_type,
                    crate::verdict::at(published.last_transition_time),
                    published.message
                );
                self.publish_event(t, true, "RemediationRequested", note)
                    .await;
            }
        }
        Ok(())
    }
}
