//! The verdict table of product.md §4 as one pure function.

use jiff::{SignedDuration, Timestamp};

use super::condition::ConditionState;
use super::history::{Sighting, VmHistory};
use super::probe::{assess_probe, unanswered_message, ProbeEvidence};
use super::standing::stand_or_replace;
use super::traffic::{assess_traffic, rise_fresh_within, TrafficEvidence};
use super::{at, human_duration, later, reason, Graces, Status, Verdict};
use cloudstack_api::model::VmState;

/// The few facts about the Machine that change how VM evidence is read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineFacts {
    /// The Machine has a `nodeRef`: only VM-level failures count, node health is MHC's job.
    pub has_node: bool,
    /// The Machine is being deleted: the VM is expected to stop and vanish.
    pub deleting: bool,
    /// A Node that matches the VM exists in the workload cluster although the Machine has no
    /// `nodeRef` (its name, for the message). Never escalate such a Machine.
    pub unlinked_node: Option<String>,
}

/// Evaluates one VM's history at `now`.
pub fn evaluate(
    history: &VmHistory,
    machine: &MachineFacts,
    graces: &Graces,
    now: Timestamp,
) -> Verdict {
    evaluate_on_record(history, machine, None, graces, now)
}

/// Evaluates one VM's history at `now` against the condition its Machine carries: where this
/// history cannot overrule `published`, it stands ([`crate::standing`]).
pub fn evaluate_on_record(
    history: &VmHistory,
    machine: &MachineFacts,
    published: Option<&ConditionState>,
    graces: &Graces,
    now: Timestamp,
) -> Verdict {
    let candidate = evaluate_vm(history, machine, graces, now);
    let verdict = stand_or_replace(published, candidate, history, machine, graces, now);
    match (&machine.unlinked_node, verdict.status) {
        (Some(node), Status::False) if !machine.has_node => Verdict::new(
            Status::Unknown,
            reason::NODE_NOT_LINKED,
            format!(
                "would be {} ({}), but Node {node} matches this VM while the Machine has no nodeRef; \
                 not escalating — check why CAPI has not linked the Node",
                verdict.reason, verdict.message
            ),
        ),
        _ => verdict,
    }
}

fn evaluate_vm(h: &VmHistory, machine: &MachineFacts, g: &Graces, now: Timestamp) -> Verdict {
    if machine.deleting {
        return Verdict::new(
            Status::Unknown,
            reason::MACHINE_DELETING,
            "Machine is being deleted; VM state is expected to change",
        );
    }
    if let Some(v) = api_trouble(h, g, now) {
        return v;
    }
    if h.absent_polls > 0 {
        return absent(h, g);
    }
    let Some(seen) = &h.sighting else {
        // Unreachable after a successful poll, but never guess.
        return Verdict::new(
            Status::Unknown,
            reason::CLOUDSTACK_API_UNAVAILABLE,
            "VM not observed yet",
        );
    };
    let since = h.state_since.unwrap_or(now);
    let age = now.duration_since(since);
    let state = &seen.state;
    match state {
        VmState::Error => {
            let needed = g.error_confirm_polls.saturating_add(1);
            if h.state_polls >= needed {
                Verdict::new(
                    Status::False,
                    reason::VM_ERROR,
                    format!("VM {} is in state Error since {}", seen.name, at(since)),
                )
            } else {
                let v = Verdict::new(
                    Status::Unknown,
                    reason::VM_ERROR,
                    format!(
                        "VM {} reported in state Error; waiting for a confirming poll",
                        seen.name
                    ),
                );
                v.changes_at(later(now, g.poll_interval))
            }
        }
        VmState::Stopped | VmState::Shutdown => stopped(seen, since, g, now),
        VmState::Destroyed | VmState::Expunging => {
            if h.state_polls >= g.not_found_polls {
                Verdict::new(
                    Status::False,
                    reason::VM_DESTROYED,
                    format!("VM {} is {state} since {}", seen.name, at(since)),
                )
            } else {
                Verdict::new(
                    Status::Unknown,
                    reason::VM_DESTROYED,
                    format!("VM {} reported {state}; confirming", seen.name),
                )
                .changes_at(later(now, g.poll_interval))
            }
        }
        VmState::Starting | VmState::Stopping | VmState::Restoring => {
            let message = format!("VM {} is {state} since {}", seen.name, at(since));
            if machine.has_node {
                Verdict::new(Status::Unknown, reason::VM_IN_TRANSITION, message)
            } else if age >= g.transition {
                Verdict::new(
                    Status::False,
                    reason::VM_STUCK_IN_TRANSITION,
                    format!("{message} (grace {})", human_duration(g.transition)),
                )
            } else {
                Verdict::new(Status::Unknown, reason::VM_IN_TRANSITION, message)
                    .changes_at(later(since, g.transition))
            }
        }
        VmState::Migrating => Verdict::new(
            Status::Unknown,
            reason::VM_MIGRATING,
            format!("VM {} is migrating between hosts", seen.name),
        ),
        VmState::Unknown | VmState::Other(_) => Verdict::new(
            Status::Unknown,
            reason::VM_STATE_UNRECOGNIZED,
            format!(
                "VM {} reports state {state:?}, which this version does not judge",
                seen.name
            ),
        ),
        VmState::Running => running(h, seen, machine, g, now),
    }
}

/// "I could not see" is `Unknown`, never `False`.
fn api_trouble(h: &VmHistory, g: &Graces, now: Timestamp) -> Option<Verdict> {
    if let Some(error) = &h.last_error {
        let seen = match h.last_success {
            Some(t) => format!("; last successful poll at {}", at(t)),
            None => "; never polled successfully".to_string(),
        };
        return Some(Verdict::new(
            Status::Unknown,
            reason::CLOUDSTACK_API_UNAVAILABLE,
            format!("CloudStack poll failed: {error}{seen}"),
        ));
    }
    match h.last_success {
        None => Some(Verdict::new(
            Status::Unknown,
            reason::CLOUDSTACK_API_UNAVAILABLE,
            "VM not polled yet",
        )),
        Some(t) if now.duration_since(t) > g.stale_after() => Some(Verdict::new(
            Status::Unknown,
            reason::CLOUDSTACK_API_UNAVAILABLE,
            format!(
                "last successful CloudStack poll at {} is older than {} poll intervals",
                at(t),
                g.stale_poll_intervals
            ),
        )),
        Some(_) => None,
    }
}

fn absent(h: &VmHistory, g: &Graces) -> Verdict {
    let last = h
        .sighting
        .as_ref()
        .map(|s| format!("; last seen as {} in state {}", s.name, s.state))
        .unwrap_or_else(|| "; never seen".to_string());
    if h.absent_polls >= g.not_found_polls {
        Verdict::new(
            Status::False,
            reason::VM_NOT_FOUND,
            format!(
                "VM {} is missing from every complete listing of its scope since {}{last}",
                h.vm_id,
                h.absent_since.map(at).unwrap_or_default()
            ),
        )
    } else {
        Verdict::new(
            Status::Unknown,
            reason::VM_NOT_FOUND,
            format!(
                "VM {} is missing from {} complete listing(s); confirming{last}",
                h.vm_id, h.absent_polls
            ),
        )
    }
}

/// `False` once `later(since, grace)` has passed, else `Unknown` with the time it would flip.
fn graced(
    grace: SignedDuration,
    since: Timestamp,
    now: Timestamp,
    reason: &'static str,
    message: String,
) -> Verdict {
    if now.duration_since(since) >= grace {
        Verdict::new(
            Status::False,
            reason,
            format!("{message} (grace {})", human_duration(grace)),
        )
    } else {
        Verdict::new(
            Status::Unknown,
            reason,
            format!("{message}; False after {}", human_duration(grace)),
        )
        .changes_at(later(since, grace))
    }
}

/// A stopped VM is judged after its grace — unless CloudStack itself may still bring it back:
/// a job on it is in flight (a start, a migration), or its offering is HA-enabled, and HA
/// restarts such a VM that stopped outside CloudStack's control (docs/cloudstack-stats.md).
fn stopped(seen: &Sighting, since: Timestamp, g: &Graces, now: Timestamp) -> Verdict {
    let message = format!("VM {} is {} since {}", seen.name, seen.state, at(since));
    if seen.job_pending {
        return Verdict::new(
            Status::Unknown,
            reason::VM_STOPPED,
            format!("{message}; a CloudStack job on it is still running"),
        );
    }
    if seen.ha_enabled {
        return graced(
            g.stopped_ha,
            since,
            now,
            reason::VM_STOPPED,
            format!("{message} (HA-enabled: CloudStack may restart it)"),
        );
    }
    graced(g.stopped, since, now, reason::VM_STOPPED, message)
}

fn running(
    h: &VmHistory,
    seen: &Sighting,
    machine: &MachineFacts,
    g: &Graces,
    now: Timestamp,
) -> Verdict {
    if let Some(since) = h.host_unreachable_since {
        let host = seen.host_control.as_ref().map_or("unknown", |s| s.as_str());
        let message = format!(
            "VM {} is Running on a host whose control state is {host} since {}",
            seen.name,
            at(since)
        );
        // Never False from the host's control state alone: Offline/Unknown is an agent that
        // lost its connection while guests usually run on (an agent restart shows it), and
        // once CloudStack decides the host is really down its HA changes the VM's state
        // itself — restarted elsewhere, or Stopped — which the state rules then judge.
        let waited = now.duration_since(since) >= g.host_unreachable;
        let message = if waited && !machine.has_node {
            format!(
                "{message}; CloudStack has not declared the host down (no HA action yet), so                  this stays Unknown — MHC's node-startup timeout still applies"
            )
        } else {
            message
        };
        return Verdict::new(Status::Unknown, reason::HOST_UNREACHABLE, message);
    }
    if machine.has_node {
        return Verdict::new(
            Status::True,
            reason::VM_RUNNING,
            format!(
                "VM {} is Running; the Machine has a Node, whose health is MHC's job",
                seen.name
            ),
        );
    }
    if seen.job_pending && (h.nic_detached_since.is_some() || h.nic_no_address_since.is_some()) {
        // addNicToVirtualMachine / removeNicFromVirtualMachine / updateVmNicIp in flight.
        return Verdict::new(
            Status::Unknown,
            reason::VM_RUNNING,
            format!(
                "VM {} is Running; its NICs are changing (a CloudStack job on it is still running)",
                seen.name
            ),
        );
    }
    if let Some(since) = h.nic_detached_since {
        let what = if seen.nic_count == 0 {
            "has no NIC"
        } else {
            "has no default NIC"
        };
        let message = format!("VM {} is Running but {what} since {}", seen.name, at(since));
        return graced(g.nic_detached, since, now, reason::NIC_DETACHED, message);
    }
    if let Some(since) = h.nic_no_address_since {
        let message = format!(
            "VM {} is Running but a NIC has no address since {}",
            seen.name,
            at(since)
        );
        return graced(
            g.nic_no_address,
            since,
            now,
            reason::NIC_NO_ADDRESS,
            message,
        );
    }
    let addresses = if seen.addresses.is_empty() {
        String::new()
    } else {
        format!(" ({})", seen.addresses.join(", "))
    };
    let traffic = assess_traffic(&h.traffic, seen, g, now);
    match (assess_probe(h, seen, g, now), &traffic) {
        (ProbeEvidence::Answers { router }, TrafficEvidence::Silent(evidence)) => {
            return Verdict::new(
                Status::True,
                reason::VM_HEALTHY,
                format!(
                    "VM {}{addresses} is Running and answers ARP from its virtual router {router} \
                     (counters alone would say: {evidence})",
                    seen.name
                ),
            );
        }
        (
            ProbeEvidence::Unanswered {
                router,
                attempts,
                since,
            },
            // A rise the probe's flat-traffic check allowed is a row from before the first
            // unanswered attempt (see `probe::flat_across`).
            _,
        ) => {
            let flat = h.traffic.last_value.unwrap_or_default();
            return Verdict::new(
                Status::False,
                reason::GUEST_NETWORK_SILENT,
                format!(
                    "VM {}{addresses} is Running but {}, and its guest→host traffic counter stayed \
                     flat at {flat} KiB",
                    seen.name,
                    unanswered_message(&router, seen.probe_nic.as_ref(), attempts, since)
                ),
            );
        }
        _ => {}
    }
    match traffic {
        TrafficEvidence::Silent(evidence) => Verdict::new(
            Status::False,
            reason::GUEST_NETWORK_SILENT,
            format!("VM {}{addresses} is Running but {evidence}", seen.name),
        ),
        TrafficEvidence::Rising(evidence) => Verdict::new(
            Status::True,
            reason::VM_HEALTHY,
            format!(
                "VM {}{addresses} is Running, NICs attached, {evidence}",
                seen.name
            ),
        ),
        TrafficEvidence::Inconclusive {
            why,
            silent_at,
            gathering,
        } => {
            let v = Verdict::new(
                Status::True,
                reason::VM_RUNNING,
                format!(
                    "VM {}{addresses} is Running with NICs attached; {why}",
                    seen.name
                ),
            )
            .provisional_if(gathering && (silent_at.is_some() || first_samples_due(h, g, now)));
            match silent_at {
                Some(at) => v.changes_at(at),
                None => v,
            }
        }
    }
}

/// Whether a VM's first traffic samples may still be on their way: it was first observed less
/// than two collection intervals and a poll ago. Bounds how long a verdict waiting for samples
/// without a window of its own (none reported yet) stays provisional.
fn first_samples_due(h: &VmHistory, g: &Graces, now: Timestamp) -> bool {
    h.first_observed
        .is_some_and(|first| now.duration_since(first) < rise_fresh_within(&h.traffic, g))
}
