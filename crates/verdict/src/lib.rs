//! The shim's decisions, pure: from what it has observed about a VM to a tri-state verdict
//! (product.md §4) and to the condition on the Machine. No I/O here; time is always passed in.
//!
//! - [`history`]: what the shim remembers about one VM between polls.
//! - [`collector`]: a host whose stats collection paused is not a host of silent guests.
//! - [`traffic`]: what guest→host traffic statistics say, with CloudStack's real semantics.
//! - [`engine`]: the verdict table.
//! - [`probe`]: the opt-in ARP probe from the virtual router: when to ask, what answers mean.
//! - [`guard`]: the mass-failure guard over one scope's verdicts.
//! - [`decide`]: the one pipeline (evaluate → guard → condition) that `run`, `check` and the
//!   benches share.
//! - [`condition`]: turning verdicts into a condition whose `lastTransitionTime` only moves
//!   when the status flips.
//! - [`scorecard`]: outcomes per Machine and boot baselines (issue 44; not wired yet).
//! - [`incidents`]: when many fail at once, the host, router, network, template or zone they
//!   share, or that nothing shared explains them (issue 45; not wired yet).
//!
//! What Cluster API and CAPC objects are (served versions, the condition entry and its apply
//! body, well-known labels) is the `capi-model` crate's; the condition's [`Status`] and
//! [`ConditionState`] come from there.

pub mod collector;
pub mod condition;
pub mod decide;
pub mod engine;
pub mod graces;
pub mod guard;
pub mod history;
pub mod incidents;
pub mod probe;
pub mod scorecard;
pub mod standing;
pub mod traffic;

#[cfg(test)]
mod tests;

use jiff::Timestamp;
use serde::Serialize;

pub use capi_model::{ConditionState, Status};
pub use collector::{mark_paused_collections, PausedCollection};
pub use decide::{decide, Decision, Evidence, Subject};
pub use engine::{evaluate, MachineFacts};
pub use graces::Graces;
pub use guard::{GuardOutcome, MassFailureGuard, ScopeMember};
pub use history::{PollOutcome, StatsServer, VmHistory};

/// Condition reasons. Constants so that metrics, Events and docs share one spelling.
pub mod reason {
    pub const VM_HEALTHY: &str = "VMHealthy";
    pub const VM_RUNNING: &str = "VMRunning";
    pub const VM_ERROR: &str = "VMError";
    pub const VM_STOPPED: &str = "VMStopped";
    pub const VM_NOT_FOUND: &str = "VMNotFound";
    pub const VM_DESTROYED: &str = "VMDestroyed";
    pub const VM_IN_TRANSITION: &str = "VMInTransition";
    pub const VM_STUCK_IN_TRANSITION: &str = "VMStuckInTransition";
    pub const VM_MIGRATING: &str = "VMMigrating";
    pub const VM_STATE_UNRECOGNIZED: &str = "VMStateUnrecognized";
    pub const HOST_UNREACHABLE: &str = "HostUnreachable";
    pub const NIC_DETACHED: &str = "NICDetached";
    pub const NIC_NO_ADDRESS: &str = "NICNoAddress";
    pub const GUEST_NETWORK_SILENT: &str = "GuestNetworkSilent";
    pub const CLOUDSTACK_API_UNAVAILABLE: &str = "CloudStackAPIUnavailable";
    pub const NODE_NOT_LINKED: &str = "NodeNotLinked";
    pub const REMEDIATION_HELD: &str = "RemediationHeld";
    pub const MACHINE_DELETING: &str = "MachineDeleting";
    /// The controller cannot read the CloudStack credentials of the Machine's endpoint.
    pub const CREDENTIALS_UNAVAILABLE: &str = "CredentialsUnavailable";

    /// Every reason, for docs and metrics label sets.
    pub const ALL: &[&str] = &[
        VM_HEALTHY,
        VM_RUNNING,
        VM_ERROR,
        VM_STOPPED,
        VM_NOT_FOUND,
        VM_DESTROYED,
        VM_IN_TRANSITION,
        VM_STUCK_IN_TRANSITION,
        VM_MIGRATING,
        VM_STATE_UNRECOGNIZED,
        HOST_UNREACHABLE,
        NIC_DETACHED,
        NIC_NO_ADDRESS,
        GUEST_NETWORK_SILENT,
        CLOUDSTACK_API_UNAVAILABLE,
        NODE_NOT_LINKED,
        REMEDIATION_HELD,
        MACHINE_DELETING,
        CREDENTIALS_UNAVAILABLE,
    ];

    /// The constant spelling `reason`, when this version publishes it.
    pub fn known(reason: &str) -> Option<&'static str> {
        ALL.iter().copied().find(|r| *r == reason)
    }
}

/// The engine's output for one Machine's VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub status: Status,
    pub reason: &'static str,
    /// Human-readable evidence, e.g. "VM state Stopped for 75s (grace 60s)".
    pub message: String,
    /// When the verdict could next change without new observations (a grace expiring);
    /// `None` when only a new observation can change it.
    pub next_change: Option<Timestamp>,
    /// A `True` reached while the guest's traffic samples are still coming in, for a bounded
    /// time: the samples will soon say `VMHealthy` or, after the window, `False`. A Machine
    /// that carries no condition yet is not given this one (one write per new Machine, not a
    /// provisional one and then the answer). Never set on `False` or `Unknown`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub provisional: bool,
}

impl Verdict {
    pub fn new(status: Status, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            message: message.into(),
            next_change: None,
            provisional: false,
        }
    }

    pub fn changes_at(mut self, at: Timestamp) -> Self {
        self.next_change = Some(at);
        self
    }

    /// Marks a `True` verdict provisional (see [`Verdict::provisional`]); others stay as they are.
    pub fn provisional_if(mut self, provisional: bool) -> Self {
        self.provisional = provisional && self.status == Status::True;
        self
    }
}

/// `t + d`, held at the ends of the representable range instead of panicking: times come from
/// CloudStack and the API server, and a far-future one must not crash the controller.
pub fn later(t: Timestamp, d: jiff::SignedDuration) -> Timestamp {
    t.saturating_add(d).unwrap_or(if d.is_negative() {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    })
}

/// A duration as a short human string (`75s` → `1m15s`, `3m20s`, `1h2m`, `48h`): whole seconds,
/// and whole minutes from an hour up; negative reads as `0s`. It is part of condition messages,
/// so its output must stay stable (a changed message is a status write on every Machine).
pub fn human_duration(d: jiff::SignedDuration) -> String {
    use jiff::fmt::friendly::{Designator, Spacing, SpanPrinter};
    const PRINTER: SpanPrinter = SpanPrinter::new()
        .designator(Designator::Compact)
        .spacing(Spacing::None);
    let secs = d.as_secs().max(0);
    let secs = if secs < 3600 { secs } else { secs - secs % 60 };
    PRINTER.duration_to_string(&jiff::SignedDuration::from_secs(secs))
}

/// A timestamp for messages: whole seconds, UTC. Messages name times rather than ages so
/// that an unchanged situation produces an unchanged message (and no status write).
pub fn at(t: Timestamp) -> String {
    t.round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| t.to_string())
}
