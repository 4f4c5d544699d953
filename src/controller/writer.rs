//! The writer: every write of the shim (condition server-side apply with its Event, the
//! remediate annotation with its Event, the orphan Events) runs in one task behind a bounded
//! queue, so a slow API server delays writes and never a poll (issue 28 item 4).
//!
//! The cycle enqueues ([`Writer::send`]); a full queue drops the job, which the next cycle
//! decides again (the Machine still lacks the condition). Outcomes come back to the cycle
//! ([`Writer::outcomes`]) with the job that produced them, for its bookkeeping. Each job first
//! passes the [`LeaseGate`] and runs under `--kube-timeout`, as before.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
}

/// A Machine a job writes to.
#[derive(Debug, Clone)]
pub(super) struct MachineRef {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
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
    fn kind(&self) -> &'static str {
        match self {
            Job::Condition { .. } => kind::CONDITION,
            Job::Annotation { .. } => kind::ANNOTATION,
            Job::Event { .. } => kind::EVENT,
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
    pub result: Result<(), KubeError>,
}

/// The label of `capc_health_writes_total` for a job's result.
pub(super) fn outcome_label(result: &Result<(), KubeError>) -> &'static str {
    match result {
        Ok(()) => outcome::WRITTEN,
        Err(KubeError::NotLeader { .. }) => outcome::REFUSED,
        Err(KubeError::Timeout { .. }) => outcome::TIMED_OUT,
        Err(_) => outcome::FAILED,
    }
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
}

/// The cycle's handle on the writer task.
pub(super) struct Writer {
    queue: mpsc::Sender<Job>,
    done: Arc<Mutex<Vec<Outcome>>>,
    /// Jobs queued or being written.
    in_flight: Arc<AtomicUsize>,
    idle: Arc<Notify>,
    metrics: Arc<Metrics>,
}

impl Writer {
    /// Starts the task: at most `concurrency` jobs at once, at most `capacity` waiting.
    pub fn start(target: WriteTarget, capacity: usize, concurrency: usize) -> Self {
        let (queue, jobs) = mpsc::channel::<Job>(capacity.max(1));
        let done = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let idle = Arc::new(Notify::new());
        let metrics = target.metrics.clone();
        {
            let (done, in_flight, idle) = (done.clone(), in_flight.clone(), idle.clone());
            tokio::spawn(async move {
                tokio_stream_of(jobs)
                    .for_each_concurrent(concurrency.max(1), |job| {
                        let (target, done, in_flight, idle) =
                            (&target, done.clone(), in_flight.clone(), idle.clone());
                        async move {
                            let result = target.run(&job).await;
                            target
                                .metrics
                                .record_write_outcome(job.kind(), outcome_label(&result));
                            lock(&done).push(Outcome { job, result });
                            if in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
                                idle.notify_waiters();
                            }
                            target
                                .metrics
                                .set_write_queue(in_flight.load(Ordering::Acquire));
                        }
                    })
                    .await;
            });
        }
        Self {
            queue,
            done,
            in_flight,
            idle,
            metrics,
        }
    }

    /// Queues `job`; `false` when the queue is full (the job is dropped and counted: the next
    /// cycle decides it again).
    pub fn send(&self, job: Job) -> bool {
        let kind = job.kind();
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        match self.queue.try_send(job) {
            Ok(()) => {
                self.metrics
                    .set_write_queue(self.in_flight.load(Ordering::Acquire));
                true
            }
            Err(_) => {
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                self.metrics.record_write_outcome(kind, outcome::DROPPED);
                false
            }
        }
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
fn tokio_stream_of(mut jobs: mpsc::Receiver<Job>) -> impl futures::Stream<Item = Job> {
    futures::stream::poll_fn(move |cx| jobs.poll_recv(cx))
}

impl WriteTarget {
    /// One job: its write behind the Lease, then its Event (also behind the Lease).
    async fn run(&self, job: &Job) -> Result<(), KubeError> {
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
                self.gated(kind::CONDITION, &object, write).await?;
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
                    (&machine.namespace, &machine.name),
                    reason,
                    self.timeout,
                );
                self.gated(kind::ANNOTATION, &object, write).await?;
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
                self.gated(kind::EVENT, &object, write).await
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
        if let Err(err) = self.gated(kind::EVENT, &object, write).await {
            tracing::warn!(machine = %machine.key(), error = %err, "cannot publish Event");
        }
    }

    /// Sends one write of `kind` about `object` if the Lease is confirmed, and counts its
    /// result; a refusal is the write's error ([`KubeError::NotLeader`]) and nothing is sent
    /// (`write` is a future: it does nothing until awaited here).
    async fn gated(
        &self,
        kind: &str,
        object: &str,
        write: impl std::future::Future<Output = Result<(), KubeError>>,
    ) -> Result<(), KubeError> {
        let outcome = match self.lease.confirm().await {
            Ok(()) => {
                self.refusing.store(false, Ordering::Release);
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
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_labelled_by_what_stopped_them() {
        let timeout = Err(KubeError::Timeout {
            what: "x".into(),
            after: Duration::from_secs(5),
        });
        let refused = Err(KubeError::NotLeader {
            what: "x".into(),
            message: "y".into(),
        });
        let conflict = Err(KubeError::Conflict {
            what: "x".into(),
            message: "y".into(),
        });
        assert_eq!(outcome_label(&Ok(())), outcome::WRITTEN);
        assert_eq!(outcome_label(&timeout), outcome::TIMED_OUT);
        assert_eq!(outcome_label(&refused), outcome::REFUSED);
        assert_eq!(outcome_label(&conflict), outcome::FAILED);
    }
}
