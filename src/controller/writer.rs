//! The writer: every write of the shim (condition server-side apply with its Event, the
//! remediate annotation with its Event, the orphan Events) runs in one task behind a bounded
//! queue, so a slow API server delays writes and never a poll (issue 28 item 4).
//!
//! The cycle enqueues ([`Writer::send`]); a full queue drops the job, which the next cycle
//! decides again (the Machine still lacks the condition). Outcomes come back to the cycle
//! ([`Writer::outcomes`]) with the job that produced them, for its bookkeeping. Each job first
//! passes the [`LeaseGate`] and runs under `--kube-timeout`, as before.
//!
//! A job is sent only while it is still true (issue 40 item 4): right before it is sent, a
//! Machine's job must still be the cycle's current decision for that Machine ([`Decisions`]: a
//! newer decision or a recovery revokes it) and no older than the writer's age bound; writes
//! to a Machine carry its `uid` (the annotation its `resourceVersion` too), so a recreated or
//! changed Machine refuses them, and a refusal is decided again by the next cycle, never
//! retried here. [`Writer::stop`] ends intake at shutdown and drops what has not started.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::ApiResource;
use kube::Client;
use tokio::sync::{mpsc, Notify};

use super::kube_io::{self, Events};
use super::leadership::{LeaseGate, Refusal};
use crate::k8s::kube_error::KubeError;
use crate::metrics::Metrics;
use crate::verdict::{ConditionState, Status};
use capi_model::apis::ConditionLayout;

/// The kinds of writes, as the `kind` label of `capc_health_kube_writes_total` and
/// `capc_health_writes_total`.
pub(super) mod kind {
    pub const CONDITION: &str = "condition";
    pub const ANNOTATION: &str = "annotation";
    pub const EVENT: &str = "event";
}

/// What became of a job, as the `outcome` label of `capc_health_writes_total`. `unchanged`
/// (no write needed) is counted by the cycle, the others here.
pub mod outcome {
    pub const WRITTEN: &str = "written";
    pub const UNCHANGED: &str = "unchanged";
    pub const FAILED: &str = "failed";
    pub const TIMED_OUT: &str = "timed_out";
    pub const DROPPED: &str = "dropped";
    pub const REFUSED: &str = "refused";
    /// Not sent: by its turn the cycle had decided otherwise for the Machine (a newer
    /// decision, a recovery, the Machine gone).
    pub const SUPERSEDED: &str = "superseded";
    /// Not sent: it waited in the queue longer than the writer's age bound.
    pub const STALE: &str = "stale";
    /// Sent and refused by the API server: the Machine is not the one decided on (another
    /// `uid`: deleted and recreated; or, for the annotation, changed since it was read).
    pub const PRECONDITION_FAILED: &str = "precondition_failed";
    /// Not sent: queued when the shim stopped (shutdown drops what has not started).
    pub const SHUTDOWN: &str = "shutdown";
}

/// A Machine a job writes to.
#[derive(Debug, Clone)]
pub(super) struct MachineRef {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    /// The version the decision was made on (the annotation's precondition).
    pub resource_version: Option<String>,
}

impl MachineRef {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// An Event to publish after a job's write (or alone).
#[derive(Debug, Clone)]
pub(super) struct EventNote {
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

/// One unit of work for the writer.
#[derive(Debug, Clone)]
pub(super) enum Job {
    /// Our condition on the Machine; its Event when the status changed.
    Condition {
        machine: MachineRef,
        /// Shared with the cycle's record of what it wrote (one copy per Machine, not two,
        /// while 10 000 first writes are queued).
        condition: Arc<ConditionState>,
        /// The status the Machine carried when this was decided (metrics: a transition?).
        previous: Option<Status>,
        /// When the Machine was created (metrics: time to False).
        created: Option<Timestamp>,
        event: Option<EventNote>,
    },
    /// The remediate annotation, then its Event.
    Annotation {
        machine: MachineRef,
        reason: String,
        event: EventNote,
    },
    /// An Event about another object (an orphan VM's Cluster), with a related object. Boxed:
    /// the queue holds every job at the size of the largest, and conditions are most of them.
    Event {
        reference: Box<ObjectReference>,
        related: Option<Box<ObjectReference>>,
        event: EventNote,
    },
}

impl Job {
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Job::Condition { .. } => kind::CONDITION,
            Job::Annotation { .. } => kind::ANNOTATION,
            Job::Event { .. } => kind::EVENT,
        }
    }

    /// The Machine a job writes to (an orphan's Event has none).
    fn machine(&self) -> Option<&MachineRef> {
        match self {
            Job::Condition { machine, .. } | Job::Annotation { machine, .. } => Some(machine),
            Job::Event { .. } => None,
        }
    }

    /// What the job is about, for logs and errors (`Machine ns/name`).
    fn object(&self) -> String {
        match self {
            Job::Condition { machine, .. } | Job::Annotation { machine, .. } => {
                format!("Machine {}", machine.key())
            }
            Job::Event { reference, .. } => format!(
                "{} {}/{}",
                reference.kind.as_deref().unwrap_or("object"),
                reference.namespace.as_deref().unwrap_or_default(),
                reference.name.as_deref().unwrap_or_default()
            ),
        }
    }
}

/// A finished job and how its main write ended (its Event's failure is logged and counted
/// only: an Event never decides anything).
#[derive(Debug)]
pub(super) struct Outcome {
    pub job: Job,
    /// The decision the job was queued as ([`Decisions`]); 0 for an orphan's Event.
    pub stamp: u64,
    pub result: Result<(), NotWritten>,
}

mod still_true;
pub(super) use still_true::{
    due, outcome_label, precondition_failed, same_machine, Decisions, Due, NotWritten,
};

/// A job in the queue: when it was decided and as which decision.
#[derive(Debug)]
struct Queued {
    job: Job,
    stamp: u64,
    decided_at: Instant,
}

/// What the writer needs to write.
#[derive(Clone)]
pub(super) struct WriteTarget {
    pub client: Client,
    pub machine: ApiResource,
    pub layout: ConditionLayout,
    pub events: Events,
    pub lease: Arc<LeaseGate>,
    pub metrics: Arc<Metrics>,
    pub timeout: Duration,
    /// Whether the last write was refused (the warning is logged once per run of refusals).
    pub refusing: Arc<AtomicBool>,
    /// The oldest a queued job may be when its turn comes; older ones are dropped as stale
    /// (the next cycle decides again from what the Machine is by then).
    pub max_age: Duration,
    /// The watch cache of Machines: a job is not sent to a Machine it shows gone or with
    /// another `uid` (see [`same_machine`]).
    pub machines: Option<kube_io::Watched<crate::k8s::watched::MachineRecord>>,
}

/// The cycle's handle on the writer task.
pub(super) struct Writer {
    queue: mpsc::Sender<Queued>,
    done: Arc<Mutex<Vec<Outcome>>>,
    /// Jobs queued or being written.
    in_flight: Arc<AtomicUsize>,
    idle: Arc<Notify>,
    metrics: Arc<Metrics>,
    decisions: Arc<Decisions>,
    /// Set by [`Writer::stop`]: nothing more is queued, started or sent.
    stopped: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    /// Every job's outcome since the writer started, by `(kind, outcome)` (`/status`).
    counts: Arc<Mutex<BTreeMap<(&'static str, &'static str), u64>>>,
}

impl Writer {
    /// Starts the task: at most `concurrency` jobs at once, at most `capacity` waiting.
    pub fn start(target: WriteTarget, capacity: usize, concurrency: usize) -> Self {
        let (queue, jobs) = mpsc::channel::<Queued>(capacity.max(1));
        let done = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let idle = Arc::new(Notify::new());
        let metrics = target.metrics.clone();
        let decisions = Arc::new(Decisions::default());
        let stopped = Arc::new(AtomicBool::new(false));
        let counts: Arc<Mutex<BTreeMap<(&'static str, &'static str), u64>>> = Arc::default();
        let task = {
            let (done, in_flight, idle) = (done.clone(), in_flight.clone(), idle.clone());
            let (decisions, stopped, counts) = (decisions.clone(), stopped.clone(), counts.clone());
            tokio::spawn(async move {
                tokio_stream_of(jobs)
                    .for_each_concurrent(concurrency.max(1), |queued| {
                        let (target, done, in_flight, idle) =
                            (&target, done.clone(), in_flight.clone(), idle.clone());
                        let (decisions, stopped, counts) =
                            (decisions.clone(), stopped.clone(), counts.clone());
                        async move {
                            let Queued {
                                job,
                                stamp,
                                decided_at,
                            } = queued;
                            let result = target
                                .turn(&job, stamp, decided_at, &decisions, &stopped)
                                .await;
                            let label = outcome_label(&result);
                            target.metrics.record_write_outcome(job.kind(), label);
                            *lock(&counts).entry((job.kind(), label)).or_default() += 1;
                            if let Some(m) = job.machine() {
                                decisions.settle(&m.key(), job.kind(), stamp);
                            }
                            lock(&done).push(Outcome { job, stamp, result });
                            if in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
                                idle.notify_waiters();
                            }
                            target
                                .metrics
                                .set_write_queue(in_flight.load(Ordering::Acquire));
                        }
                    })
                    .await;
            })
        };
        Self {
            queue,
            done,
            in_flight,
            idle,
            metrics,
            decisions,
            stopped,
            task,
            counts,
        }
    }

    /// The current decisions the writer checks jobs against.
    pub fn decisions(&self) -> &Decisions {
        &self.decisions
    }

    /// Every job's outcome since the writer started, as `"<kind>/<outcome>"` → count.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        lock(&self.counts)
            .iter()
            .map(|((k, o), n)| (format!("{k}/{o}"), *n))
            .collect()
    }

    /// Stops the writer for a shutdown: nothing more is queued; queued jobs that have not
    /// started are dropped ([`outcome::SHUTDOWN`]); writes being sent get up to `wait`, then
    /// the task is aborted, so that nothing is sent after this returns. Returns the writes
    /// that were still being sent when the wait ran out.
    pub async fn stop(&mut self, wait: Duration) -> usize {
        self.stopped.store(true, Ordering::Release);
        let left = match tokio::time::timeout(wait, self.idle()).await {
            Ok(()) => 0,
            Err(_) => self.in_flight(),
        };
        self.task.abort();
        // Aborted (or finished): once awaited, none of its futures can send anything.
        let _ = (&mut self.task).await;
        left
    }

    /// Queues `job`; `false` when the queue is full (the job is dropped and counted: the next
    /// cycle decides it again).
    /// A job about a Machine becomes that Machine's current decision of its kind (any older
    /// one still queued is then not sent). Returns the job's stamp.
    pub fn send(&self, job: Job) -> Option<u64> {
        let kind = job.kind();
        if self.stopped.load(Ordering::Acquire) {
            self.count(kind, outcome::SHUTDOWN);
            return None;
        }
        let stamp = job
            .machine()
            .map_or(0, |m| self.decisions.decide(&m.key(), kind));
        let key = job.machine().map(MachineRef::key);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let queued = Queued {
            job,
            stamp,
            decided_at: Instant::now(),
        };
        match self.queue.try_send(queued) {
            Ok(()) => {
                self.metrics
                    .set_write_queue(self.in_flight.load(Ordering::Acquire));
                Some(stamp)
            }
            Err(_) => {
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                if let Some(key) = key {
                    self.decisions.settle(&key, kind, stamp);
                }
                self.count(kind, outcome::DROPPED);
                None
            }
        }
    }

    fn count(&self, kind: &'static str, label: &'static str) {
        self.metrics.record_write_outcome(kind, label);
        *lock(&self.counts).entry((kind, label)).or_default() += 1;
    }

    /// The jobs finished since the last call.
    pub fn outcomes(&self) -> Vec<Outcome> {
        std::mem::take(&mut *lock(&self.done))
    }

    /// Jobs queued or being written.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Resolves once nothing is queued or being written.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The receiver as a stream (tokio's `Receiver` has no `Stream` impl without tokio-stream).
fn tokio_stream_of(mut jobs: mpsc::Receiver<Queued>) -> impl futures::Stream<Item = Queued> {
    futures::stream::poll_fn(move |cx| jobs.poll_recv(cx))
}

impl WriteTarget {
    /// A job's turn: dropped if the writer stopped, the job is no longer the Machine's current
    /// decision or it waited too long; else run. Checked again after the Lease is confirmed
    /// (that can wait on a read), right before the write is sent.
    async fn turn(
        &self,
        job: &Job,
        stamp: u64,
        decided_at: Instant,
        decisions: &Decisions,
        stopped: &AtomicBool,
    ) -> Result<(), NotWritten> {
        let check = || {
            if stopped.load(Ordering::Acquire) {
                return Some(outcome::SHUTDOWN);
            }
            if let (Some(m), Some(store)) = (job.machine(), &self.machines) {
                let cached = store.get(&m.namespace, &m.name);
                let cached = cached.as_ref().map(|r| r.view.uid.as_deref());
                if !same_machine(m.uid.as_deref(), cached) {
                    return Some(outcome::PRECONDITION_FAILED);
                }
            }
            let machine = job.machine().map(MachineRef::key);
            let current = machine
                .as_ref()
                .and_then(|m| decisions.current(m, job.kind()));
            match due(
                machine.as_ref().map(|_| stamp),
                current,
                decided_at.elapsed(),
                self.max_age,
            ) {
                Due::Send => None,
                Due::Superseded => Some(outcome::SUPERSEDED),
                Due::Stale => Some(outcome::STALE),
            }
        };
        if let Some(why) = check() {
            tracing::debug!(object = %job.object(), kind = job.kind(), outcome = why,
                "queued write not sent");
            return Err(NotWritten::Skipped(why));
        }
        self.run(job, &check).await
    }

    /// One job: its write behind the Lease, then its Event (also behind the Lease).
    async fn run(
        &self,
        job: &Job,
        check: &(dyn Fn() -> Option<&'static str> + Sync),
    ) -> Result<(), NotWritten> {
        let object = job.object();
        match job {
            Job::Condition {
                machine,
                condition,
                event,
                ..
            } => {
                let write = kube_io::apply_condition(
                    &self.client,
                    &self.machine,
                    self.layout,
                    (&machine.namespace, &machine.name),
                    condition,
                    self.timeout,
                );
                self.gated(kind::CONDITION, &object, Some(check), write)
                    .await?;
                tracing::debug!(machine = %machine.key(), status = %condition.status,
                    reason = %condition.reason, "condition written");
                if let Some(e) = event {
                    self.machine_event(machine, e).await;
                }
                Ok(())
            }
            Job::Annotation {
                machine,
                reason,
                event,
                ..
            } => {
                let write = kube_io::annotate_for_remediation(
                    &self.client,
                    &self.machine,
                    kube_io::Precondition {
                        namespace: &machine.namespace,
                        name: &machine.name,
                        uid: machine.uid.as_deref(),
                        resource_version: machine.resource_version.as_deref(),
                    },
                    reason,
                    self.timeout,
                );
                self.gated(kind::ANNOTATION, &object, Some(check), write)
                    .await?;
                tracing::warn!(machine = %machine.key(), reason = %reason,
                    "escalated: remediate-machine annotation set");
                self.machine_event(machine, event).await;
                Ok(())
            }
            Job::Event {
                reference,
                related,
                event,
            } => {
                let write = self.events.publish_about(
                    (**reference).clone(),
                    related.as_deref().cloned(),
                    event.warning,
                    &event.reason,
                    event.note.clone(),
                    self.timeout,
                );
                self.gated(kind::EVENT, &object, Some(check), write).await
            }
        }
    }

    /// An Event about `machine`; a failure is logged and counted, never fatal.
    async fn machine_event(&self, machine: &MachineRef, e: &EventNote) {
        let write = self.events.publish(
            (&machine.namespace, &machine.name, machine.uid.as_deref()),
            e.warning,
            &e.reason,
            e.note.clone(),
            self.timeout,
        );
        let object = format!("Machine {}", machine.key());
        if let Err(err) = self.gated(kind::EVENT, &object, None, write).await {
            tracing::warn!(machine = %machine.key(), error = %err, "cannot publish Event");
        }
    }

    /// Sends one write of `kind` about `object` if the Lease is confirmed and `check` (the
    /// job still due) passes after that, and counts its result; a refusal is the write's error
    /// ([`KubeError::NotLeader`]) and nothing is sent (`write` is a future: it does nothing
    /// until awaited here).
    async fn gated(
        &self,
        kind: &str,
        object: &str,
        check: Option<&(dyn Fn() -> Option<&'static str> + Sync)>,
        write: impl std::future::Future<Output = Result<(), KubeError>>,
    ) -> Result<(), NotWritten> {
        let outcome = match self.lease.confirm().await {
            Ok(()) => {
                self.refusing.store(false, Ordering::Release);
                if let Some(why) = check.and_then(|c| c()) {
                    return Err(NotWritten::Skipped(why));
                }
                write.await
            }
            Err(refusal) => {
                if !self.refusing.swap(true, Ordering::AcqRel) {
                    // Once per run of refusals, not once per write: a cold start has thousands.
                    tracing::warn!(object = %object, kind = kind, reason = %refusal.message(),
                        "not writing: the leader Lease is not confirmed");
                }
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
        outcome.map_err(NotWritten::Failed)
    }
}

/// The oldest a queued write may be when its turn comes: two poll intervals (by then the
/// cycle has decided the Machine twice more) plus one write's timeout.
pub(super) fn max_queue_age(
    poll_interval: std::time::Duration,
    kube_timeout: std::time::Duration,
) -> std::time::Duration {
    poll_interval.saturating_mul(2).saturating_add(kube_timeout)
}

#[cfg(test)]
mod tests;
