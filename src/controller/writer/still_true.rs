//! Whether a queued write is still true when its turn comes (issue 40 item 4), as pure rules
//! the writer applies right before sending: still the Machine's current decision
//! ([`Decisions`]), young enough ([`due`]), addressed to the Machine the watch cache shows
//! ([`same_machine`]); and how a write that did not land is labelled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{lock, outcome};
use crate::k8s::kube_error::KubeError;

/// Why a job's write did not reach the Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::controller) enum NotWritten {
    /// Not sent: no longer the current decision, too old, or the writer stopped
    /// ([`outcome::SUPERSEDED`], [`outcome::STALE`], [`outcome::SHUTDOWN`]).
    Skipped(&'static str),
    /// Sent (or refused by the Lease gate) and failed.
    Failed(KubeError),
}

impl std::fmt::Display for NotWritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotWritten::Skipped(why) => write!(f, "not sent ({why})"),
            NotWritten::Failed(e) => e.fmt(f),
        }
    }
}

/// Whether the API server refused a write because the Machine is not the one it was decided
/// on: a `uid` or `resourceVersion` precondition (409). The shim's condition is applied with
/// `force`, so a field-manager conflict cannot be the cause of a 409.
pub(in crate::controller) fn precondition_failed(e: &KubeError) -> bool {
    matches!(e, KubeError::Conflict { .. })
}

/// The label of `capc_health_writes_total` for a job's result.
pub(in crate::controller) fn outcome_label(result: &Result<(), NotWritten>) -> &'static str {
    match result {
        Ok(()) => outcome::WRITTEN,
        Err(NotWritten::Skipped(why)) => why,
        Err(NotWritten::Failed(e)) => match e {
            KubeError::NotLeader { .. } => outcome::REFUSED,
            KubeError::Timeout { .. } => outcome::TIMED_OUT,
            e if precondition_failed(e) => outcome::PRECONDITION_FAILED,
            _ => outcome::FAILED,
        },
    }
}

/// Whether the Machine a job was decided on is still the one the watch cache shows under its
/// name: `cached` is `None` when the cache has no Machine of that name, else its `uid`. A job
/// without a `uid` (never the case for a Machine read from the API server) is not held back.
///
/// Why a client-side check for the condition: the API server ignores `metadata.uid` in a
/// write to a custom resource's `status` subresource (its status strategy copies the stored
/// metadata over the request's), so the apply body's `uid` refuses nothing there; and a
/// `resourceVersion` precondition would make every condition write lose to any other writer
/// of the Machine (CAPI patches Machines often). The annotation, a write to the Machine
/// itself, also carries `uid` and `resourceVersion` for the API server to check.
pub(in crate::controller) fn same_machine(
    job_uid: Option<&str>,
    cached: Option<Option<&str>>,
) -> bool {
    match (job_uid, cached) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(uid), Some(now)) => now == Some(uid),
    }
}

/// What the writer does with a job whose turn came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::controller) enum Due {
    Send,
    /// Not the current decision any more ([`outcome::SUPERSEDED`]).
    Superseded,
    /// Queued longer than the age bound ([`outcome::STALE`]).
    Stale,
}

/// Whether a job queued as decision `stamp` (`None`: not about a Machine), `age` ago, may
/// still be sent when the Machine's current decision is `current` and jobs may wait at most
/// `max_age`. A revoked or replaced decision wins over age: it says more.
pub(in crate::controller) fn due(
    stamp: Option<u64>,
    current: Option<u64>,
    age: Duration,
    max_age: Duration,
) -> Due {
    if stamp.is_some() && stamp != current {
        Due::Superseded
    } else if age > max_age {
        Due::Stale
    } else {
        Due::Send
    }
}

/// The cycle's current decision per Machine and kind of write, shared with the writer: each
/// job queued about a Machine gets a new stamp that replaces the one before; a decision that
/// no longer holds is revoked. The writer sends a job only while its stamp is the current one.
#[derive(Debug, Default)]
pub(in crate::controller) struct Decisions {
    current: Mutex<HashMap<(String, &'static str), u64>>,
    next: AtomicU64,
}

impl Decisions {
    /// A new decision for `machine`'s `kind` of write; earlier ones of that kind are void.
    pub fn decide(&self, machine: &str, kind: &'static str) -> u64 {
        let stamp = self.next.fetch_add(1, Ordering::AcqRel) + 1;
        lock(&self.current).insert((machine.to_string(), kind), stamp);
        stamp
    }

    /// The decision no longer holds (the Machine recovered, changed or is gone).
    pub fn revoke(&self, machine: &str, kind: &'static str) {
        lock(&self.current).remove(&(machine.to_string(), kind));
    }

    /// Clears a decision once its job is done, unless a newer one replaced it meanwhile.
    pub(in crate::controller) fn settle(&self, machine: &str, kind: &'static str, stamp: u64) {
        let mut current = lock(&self.current);
        let key = (machine.to_string(), kind);
        if current.get(&key) == Some(&stamp) {
            current.remove(&key);
        }
    }

    pub(in crate::controller) fn current(&self, machine: &str, kind: &'static str) -> Option<u64> {
        lock(&self.current)
            .get(&(machine.to_string(), kind))
            .copied()
    }
}
