//! Phase 4 of a cycle, act: hand every changed condition (with its Event when the status
//! changed) and, in annotate mode, the remediate annotation where the escalation guards allow
//! it to the [writer](super::writer), and take in what the writer finished since. The cycle
//! never waits on the API server (a cold start has one write per Machine): a Machine whose
//! write is still queued is not written again, and escalates only once the condition it
//! escalates on is on it.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;

use super::cycle::{Controller, CycleSummary};
use super::decide::Decided;
use super::gather::Gathered;
use super::targets::Target;
use super::writer::{kind, outcome, EventNote, Job, MachineRef, Outcome, WriteTarget, Writer};
use crate::cli::to_std;
use crate::k8s::escalation::{self, Escalation, EscalationFacts};
use crate::k8s::kube_error::KubeError;

/// `/status` detail of a Machine whose first condition waits for its traffic samples.
const FIRST_WRITE_HELD: &str =
    "not written yet: the Machine's first condition waits for the traffic samples that decide it";
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
    /// Machines (`namespace/name`) whose last condition write failed, with why: `/status`
    /// shows what they still carry and the failure, not the condition that was not written.
    pub failed_writes: BTreeMap<String, String>,
}

/// The writes handed to the writer and not finished yet, by Machine (`namespace/name`).
#[derive(Debug, Default)]
pub(super) struct PendingWrites {
    pub(super) conditions: BTreeSet<String>,
    /// With whether the Machine is a control-plane Machine (one at a time per cluster).
    pub(super) annotations: BTreeMap<String, bool>,
    /// Annotations written since the cycle began (their state in `/status`).
    pub(super) annotated_now: BTreeSet<String>,
}

impl Controller {
    /// The writer task, started on first use (after [`Controller::leading_by`] set the Lease).
    fn writer(&mut self) -> &Writer {
        self.writer.get_or_insert_with(|| {
            Writer::start(
                WriteTarget {
                    client: self.client.clone(),
                    machine: self.resources.machine.clone(),
                    layout: self.api.layout,
                    events: self.events.clone(),
                    lease: self.lease.clone(),
                    metrics: self.metrics.clone(),
                    timeout: to_std(self.args.kube_timeout),
                    refusing: Default::default(),
                },
                usize::try_from(self.args.write_queue).unwrap_or(usize::MAX),
                usize::from(self.args.max_concurrent_writes),
            )
        })
    }

    /// Hands `job` to the writer; `false` when its queue was full (the job is dropped).
    pub(super) fn enqueue(&mut self, job: Job, summary: &mut CycleSummary) -> bool {
        let sent = self.writer().send(job);
        if !sent {
            summary.dropped_writes += 1;
        }
        sent
    }

    /// Writes handed to the writer and not finished.
    pub fn writes_in_flight(&self) -> usize {
        self.writer.as_ref().map_or(0, Writer::in_flight)
    }

    /// Resolves once the writer has nothing queued or in flight.
    pub async fn writes_done(&mut self) {
        if let Some(w) = &self.writer {
            w.idle().await;
        }
    }

    /// Acts on `d`: conditions, Events, annotations. Returns each target's escalation state.
    pub(super) async fn act(
        &mut self,
        g: &Gathered,
        d: &Decided,
        now: Timestamp,
        summary: &mut CycleSummary,
    ) -> Acted {
        if !self.write_errors.is_empty() {
            let live: BTreeSet<String> = g.targets.iter().map(|t| key_of(t)).collect();
            self.write_errors.retain(|k, _| live.contains(k));
        }
        self.queue_conditions(&g.targets, &d.conditions, &d.first_write_held, summary);
        if self.wait_for_writes {
            self.writes_done().await;
            self.take_outcomes(summary);
        }
        let mut cp_in_flight: BTreeSet<(String, String)> = g
            .targets
            .iter()
            .filter(|t| {
                t.machine.is_control_plane()
                    && (t.machine.annotated(well_known::REMEDIATE_MACHINE)
                        || self.pending.annotations.get(&key_of(t)) == Some(&true))
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
            if let Some(waiting) = self.waiting_on_a_write(t) {
                // Never escalate on a condition the Machine does not carry (yet).
                if state.state != "annotated" || waiting.0 == "held" {
                    state.state = waiting.0;
                    state.detail = Some(waiting.1);
                }
                states.push(state);
                continue;
            }
            if d.first_write_held[i] {
                state.detail = Some(FIRST_WRITE_HELD.into());
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
                self.escalate(t, published, now, &mut cp_in_flight, &mut state, summary);
            }
            states.push(state);
        }
        if self.wait_for_writes {
            self.writes_done().await;
            self.take_outcomes(summary);
            for (t, state) in g.targets.iter().zip(states.iter_mut()) {
                if self.pending.annotated_now.contains(&key_of(t)) {
                    *state = EscalationState {
                        state: "annotated",
                        detail: None,
                    };
                }
            }
        }
        if self.lease.lost() {
            summary.lost_lease = true;
        }
        if let Some(why) = self.refusal.take() {
            // Once per cycle, not once per Machine: a cold start refuses thousands at once.
            tracing::warn!(writes = summary.refused_writes, reason = %why,
                "not writing: the leader Lease is not confirmed");
            summary.problems.push(format!(
                "{} write(s) not sent: {why}",
                summary.refused_writes
            ));
        }
        if summary.dropped_writes > 0 {
            summary.problems.push(format!(
                "{} write(s) not queued: the writer's queue (--write-queue {}) is full; decided again next cycle",
                summary.dropped_writes, self.args.write_queue
            ));
        }
        Acted {
            escalations: states,
            failed_writes: self.write_errors.clone().into_iter().collect(),
        }
    }

    /// Why `t` cannot escalate now because of a write of ours (its state and detail): its
    /// last condition write failed, or a condition or annotation write is still queued.
    /// Cheap when nothing is failed or queued (no key is built).
    fn waiting_on_a_write(&self, t: &Target) -> Option<(&'static str, String)> {
        if self.write_errors.is_empty()
            && self.pending.conditions.is_empty()
            && self.pending.annotations.is_empty()
        {
            return None;
        }
        let machine = key_of(t);
        if let Some(error) = self.write_errors.get(&machine) {
            return Some(("held", error.clone()));
        }
        if self.pending.conditions.contains(&machine) {
            return Some(("pending", "the condition is being written".into()));
        }
        if self.pending.annotations.contains_key(&machine) {
            return Some((
                "pending",
                "the remediate annotation is being written".into(),
            ));
        }
        None
    }

    /// Queues every changed condition (with its Event when the status changed) that is not
    /// already queued; counts the unchanged ones.
    fn queue_conditions(
        &mut self,
        targets: &[std::sync::Arc<Target>],
        nexts: &[Option<ConditionState>],
        held: &[bool],
        summary: &mut CycleSummary,
    ) {
        let mut unchanged = 0u64;
        for ((t, next), held) in targets.iter().zip(nexts).zip(held) {
            let Some(next) = next.as_ref().filter(|_| !held) else {
                continue;
            };
            if is_unchanged(t.current.as_deref(), next) {
                unchanged += 1;
                if !self.write_errors.is_empty() {
                    // It carries what was decided: an earlier failed write no longer stands.
                    self.write_errors.remove(&key_of(t));
                }
                continue;
            }
            let machine = key_of(t);
            if self.pending.conditions.contains(&machine) {
                continue; // its write is still queued; decided again once it is done
            }
            let previous = t.current.as_ref().map(|c| c.status);
            let event = needs_event(previous, next.status).then(|| EventNote {
                warning: next.status != Status::True,
                reason: next.reason.clone(),
                note: format!(
                    "{} is {}: {}",
                    self.args.condition_type, next.status, next.message
                ),
            });
            let condition = std::sync::Arc::new(next.clone());
            let job = Job::Condition {
                machine: machine_ref(t),
                condition: condition.clone(),
                previous,
                created: t.created,
                event,
            };
            if self.enqueue(job, summary) {
                self.pending.conditions.insert(machine);
                // Laid over the watch cache until it shows a newer version (gather).
                if let Some(uid) = &t.machine.uid {
                    self.written.insert(
                        uid.clone(),
                        super::cycle::Written {
                            condition,
                            based_on: t.machine.resource_version.clone(),
                        },
                    );
                }
            }
        }
        self.metrics
            .record_write_outcomes(kind::CONDITION, outcome::UNCHANGED, unchanged);
    }

    /// Takes in what the writer finished: our record of each write, metrics, the cycle's
    /// counts, the write errors `/status` shows.
    pub(super) fn take_outcomes(&mut self, summary: &mut CycleSummary) {
        let Some(writer) = &self.writer else { return };
        for Outcome { job, result } in writer.outcomes() {
            match job {
                Job::Condition {
                    machine,
                    condition,
                    previous,
                    created,
                    ..
                } => {
                    let key = machine.key();
                    self.pending.conditions.remove(&key);
                    match result {
                        Ok(()) => {
                            self.write_errors.remove(&key);
                            summary.condition_writes += 1;
                            self.record_written(&machine, &condition, previous, created);
                        }
                        Err(e) => {
                            if let Some(uid) = &machine.uid {
                                self.written.remove(uid); // not what the Machine carries
                            }
                            self.note_failure(&e, summary);
                            if !matches!(e, KubeError::NotLeader { .. }) {
                                self.write_errors.insert(
                                    key,
                                    format!(
                                        "could not write {}/{}: {e}",
                                        condition.status, condition.reason
                                    ),
                                );
                            }
                        }
                    }
                }
                Job::Annotation { machine, .. } => {
                    self.pending.annotations.remove(&machine.key());
                    match result {
                        Ok(()) => {
                            self.pending.annotated_now.insert(machine.key());
                            summary.annotations += 1;
                            self.metrics.record_escalation("annotated");
                        }
                        Err(e) => self.note_failure(&e, summary),
                    }
                }
                Job::Event { reference, .. } => {
                    if let Err(e) = result {
                        tracing::warn!(object = ?reference.name, error = %e, "cannot publish the Event");
                    }
                }
            }
        }
    }

    fn note_failure(&mut self, e: &KubeError, summary: &mut CycleSummary) {
        match e {
            KubeError::NotLeader { message, .. } => {
                summary.refused_writes += 1;
                self.refusal.get_or_insert_with(|| message.clone());
            }
            e => {
                tracing::warn!(error = %e, "write failed; decided again next cycle");
                summary.problems.push(e.to_string());
            }
        }
    }

    /// The metrics of a condition that reached the Machine.
    fn record_written(
        &self,
        machine: &MachineRef,
        next: &ConditionState,
        previous: Option<Status>,
        created: Option<Timestamp>,
    ) {
        if previous == Some(next.status) {
            return;
        }
        tracing::info!(machine = %machine.key(), status = %next.status, reason = %next.reason,
            message = %next.message, "verdict changed");
        self.metrics.record_transition(next.status, &next.reason);
        if next.status == Status::False {
            if let Some(created) = created {
                // Measured to the decision (the condition's transition time), not to the write.
                let seconds = next
                    .last_transition_time
                    .duration_since(created)
                    .as_secs_f64();
                self.metrics.observe_time_to_false(&next.reason, seconds);
            }
        }
    }

    /// Queues the remediate annotation for `t` when the guards allow it.
    fn escalate(
        &mut self,
        t: &Target,
        published: &ConditionState,
        now: Timestamp,
        cp_in_flight: &mut BTreeSet<(String, String)>,
        state: &mut EscalationState,
        summary: &mut CycleSummary,
    ) {
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
                let note = format!(
                    "set {} after {} False since {}: {}",
                    well_known::REMEDIATE_MACHINE,
                    self.args.condition_type,
                    crate::verdict::at(published.last_transition_time),
                    published.message
                );
                let job = Job::Annotation {
                    machine: machine_ref(t),
                    reason: published.reason.clone(),
                    event: EventNote {
                        warning: true,
                        reason: "RemediationRequested".into(),
                        note,
                    },
                };
                if self.enqueue(job, summary) {
                    self.pending
                        .annotations
                        .insert(key_of(t), m.is_control_plane());
                    state.state = "pending";
                    state.detail = Some("the remediate annotation is being written".into());
                    if m.is_control_plane() {
                        cp_in_flight.insert(cluster);
                    }
                } else {
                    state.state = "pending";
                    state.detail = Some(
                        "the remediate annotation is due; the write queue is full (next cycle)"
                            .into(),
                    );
                }
            }
        }
    }
}

fn key_of(t: &Target) -> String {
    format!("{}/{}", t.machine.namespace, t.machine.name)
}

fn machine_ref(t: &Target) -> MachineRef {
    MachineRef {
        namespace: t.machine.namespace.clone(),
        name: t.machine.name.clone(),
        uid: t.machine.uid.clone(),
    }
}
