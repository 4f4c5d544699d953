//! Phase 4 of a cycle, act: hand every changed condition (with its Event when the status
//! changed) and, on the annotation path (annotate mode, or auto mode where the Machine's MHCs do
//! not list the condition: `k8s::coverage`), the remediate annotation where the escalation guards allow
//! it to the [writer](super::writer), and take in what the writer finished since. The cycle
//! never waits on the API server (a cold start has one write per Machine): a Machine whose
//! write is still queued is not written again, and escalates only once the condition it
//! escalates on is on it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;

use super::cycle::{Controller, CycleSummary};
use super::decide::Decided;
use super::gather::Gathered;
use super::targets::Target;
use super::writer::{
    kind, outcome, precondition_failed, EventNote, Job, MachineRef, NotWritten, Outcome,
    WriteTarget, Writer,
};
use crate::cli::to_std;
use crate::k8s::coverage::{self, CoverageFacts};
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

/// The writes handed to the writer and not finished yet, by Machine (`namespace/name`), each
/// with the stamp of its decision (an outcome of an older job does not clear a newer one).
#[derive(Debug, Default)]
pub(super) struct PendingWrites {
    /// With the condition queued: a new decision that differs from it revokes it.
    pub(super) conditions: BTreeMap<String, (u64, Arc<ConditionState>)>,
    /// With whether the Machine is a control-plane Machine (one at a time per cluster).
    pub(super) annotations: BTreeMap<String, (u64, bool)>,
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
                    machines: Some(self.stores.machines.clone()),
                    max_age: super::writer::max_queue_age(
                        to_std(self.args.poll_interval),
                        to_std(self.args.kube_timeout),
                    ),
                },
                usize::try_from(self.args.write_queue).unwrap_or(usize::MAX),
                usize::from(self.args.max_concurrent_writes),
            )
        })
    }

    /// Hands `job` to the writer, as the current decision for its Machine; its stamp, or
    /// `None` when the queue was full (the job is dropped) or the writer stopped.
    pub(super) fn enqueue(&mut self, job: Job, summary: &mut CycleSummary) -> Option<u64> {
        let sent = self.writer().send(job);
        if sent.is_none() {
            summary.dropped_writes += 1;
        }
        sent
    }

    /// Stops the writer for a shutdown (see [`Writer::stop`]): no write of this controller is
    /// sent after this returns. The writes still being sent when `wait` ran out.
    pub async fn stop_writes(&mut self, wait: std::time::Duration) -> usize {
        match &mut self.writer {
            Some(w) => w.stop(wait).await,
            None => 0,
        }
    }

    /// What became of the writer's jobs so far, `"<kind>/<outcome>"` → count (`/status`).
    pub(super) fn write_counts(&self) -> BTreeMap<String, u64> {
        self.writer.as_ref().map(Writer::counts).unwrap_or_default()
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
        self.revoke_annotations(g, d, now);
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
                        || self
                            .pending
                            .annotations
                            .get(&key_of(t))
                            .is_some_and(|a| a.1))
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
        let skipped = summary.stale_writes + summary.precondition_failed_writes;
        if skipped > 0 {
            summary.problems.push(format!(
                "{} write(s) not made: {} waited past the writer's age bound, {} refused by the API server (the Machine was recreated or changed); decided again next cycle",
                skipped, summary.stale_writes, summary.precondition_failed_writes
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
        if self.pending.conditions.contains_key(&machine) {
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
            if let Some((_, queued)) = self.pending.conditions.get(&machine) {
                // Its write is still queued; decided again once it is done. A decision that
                // no longer matches it (a recovery, a new reason) stops it from being sent.
                if !is_unchanged(Some(queued), next) {
                    self.writer().decisions().revoke(&machine, kind::CONDITION);
                }
                continue;
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
            if let Some(stamp) = self.enqueue(job, summary) {
                self.pending
                    .conditions
                    .insert(machine, (stamp, condition.clone()));
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
        for Outcome { job, stamp, result } in writer.outcomes() {
            match job {
                Job::Condition {
                    machine,
                    condition,
                    previous,
                    created,
                    ..
                } => {
                    let key = machine.key();
                    if self.pending.conditions.get(&key).map(|p| p.0) == Some(stamp) {
                        self.pending.conditions.remove(&key);
                    }
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
                            if !self.note_failure(&machine, &e, summary) {
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
                    let key = machine.key();
                    if self.pending.annotations.get(&key).map(|p| p.0) == Some(stamp) {
                        self.pending.annotations.remove(&key);
                    }
                    match result {
                        Ok(()) => {
                            self.pending.annotated_now.insert(key);
                            summary.annotations += 1;
                            self.metrics.record_escalation("annotated");
                        }
                        Err(e) => {
                            self.note_failure(&machine, &e, summary);
                        }
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

    /// Counts a write that did not reach `machine`; `true` when that is nothing to show on
    /// the Machine (not sent, refused by the Lease, or addressed to a Machine that is no more
    /// the one decided on): only other failures hold its escalation and show in `/status`.
    fn note_failure(
        &mut self,
        machine: &MachineRef,
        e: &NotWritten,
        summary: &mut CycleSummary,
    ) -> bool {
        match e {
            NotWritten::Skipped(why) => {
                match *why {
                    outcome::SUPERSEDED => summary.superseded_writes += 1,
                    outcome::STALE => summary.stale_writes += 1,
                    outcome::PRECONDITION_FAILED => summary.precondition_failed_writes += 1,
                    _ => {}
                }
                true
            }
            NotWritten::Failed(KubeError::NotLeader { message, .. }) => {
                summary.refused_writes += 1;
                self.refusal.get_or_insert_with(|| message.clone());
                true
            }
            NotWritten::Failed(e) if precondition_failed(e) => {
                // The Machine is not the one decided on: the next cycle decides again from the
                // one there is (never retried as it was).
                tracing::info!(machine = %machine.key(), error = %e,
                    "write refused by its precondition; decided again next cycle");
                summary.precondition_failed_writes += 1;
                true
            }
            NotWritten::Failed(e) => {
                tracing::warn!(error = %e, "write failed; decided again next cycle");
                summary.problems.push(e.to_string());
                false
            }
        }
    }

    /// Revokes the queued annotation of every Machine for which it is no longer the decision:
    /// gone, its condition no longer `False` as escalated on, or the guards no longer allow it
    /// (its own queued annotation aside). The writer then does not send it.
    fn revoke_annotations(&mut self, g: &Gathered, d: &Decided, now: Timestamp) {
        if self.pending.annotations.is_empty() {
            return;
        }
        let mut still: BTreeSet<String> = BTreeSet::new();
        for (t, next) in g.targets.iter().zip(&d.conditions) {
            let key = key_of(t);
            if !self.pending.annotations.contains_key(&key) {
                continue;
            }
            let Some(published) = next else { continue };
            if self.escalation(t, published, now, false) == Escalation::Annotate {
                still.insert(key);
            }
        }
        let writer = self.writer.as_ref();
        for key in self.pending.annotations.keys() {
            if !still.contains(key) {
                tracing::info!(machine = %key,
                    "the queued remediate annotation no longer holds; not sent");
                if let Some(w) = writer {
                    w.decisions().revoke(key, kind::ANNOTATION);
                }
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

    /// What decides how `t`'s verdict is acted on ([`coverage`]).
    pub(super) fn coverage_facts<'a>(&'a self, t: &'a Target) -> CoverageFacts<'a> {
        CoverageFacts {
            mode: self.api.mode,
            auto: self.api.mode_source == "auto",
            condition_type: &self.args.condition_type,
            machine: &t.machine,
            covering: &t.mhcs,
        }
    }

    /// What the escalation guards say about annotating `t`, whose condition is `published`.
    fn escalation(
        &self,
        t: &Target,
        published: &ConditionState,
        now: Timestamp,
        control_plane_escalation_in_flight: bool,
    ) -> Escalation {
        escalation::decide(&EscalationFacts {
            annotates: coverage::annotates(&self.coverage_facts(t)),
            machine: &t.machine,
            status: published.status,
            since: published.last_transition_time,
            now,
            delay: self.args.escalation_delay,
            covered_by_mhc: t.mhc_covered(),
            cluster_paused: t.cluster_paused,
            control_plane_escalation_in_flight,
        })
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
        match self.escalation(t, published, now, cp_in_flight.contains(&cluster)) {
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
                if let Some(stamp) = self.enqueue(job, summary) {
                    self.pending
                        .annotations
                        .insert(key_of(t), (stamp, m.is_control_plane()));
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
        resource_version: t.machine.resource_version.clone(),
    }
}
