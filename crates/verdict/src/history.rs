//! What the shim remembers about one VM between polls. Recording is pure: every function
//! takes `now` and the observation; nothing here talks to CloudStack.

use std::collections::VecDeque;

use jiff::Timestamp;
use serde::Serialize;

use super::{reason, Graces};
use cloudstack_api::model::{CsTime, HostControlState, UsageSample, VirtualMachine, VmState};

/// The outcome of one poll of a VM's scope, as far as this VM is concerned.
#[derive(Debug, Clone, Copy)]
pub enum PollOutcome<'a> {
    /// The VM was in the listing.
    Seen(&'a VirtualMachine),
    /// The VM was missing from a complete listing of its scope.
    Absent,
    /// The listing failed or was incomplete: nothing was learnt about this VM.
    Failed(&'a str),
}

/// The parts of a sighting that the verdict table uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sighting {
    pub name: String,
    pub state: VmState,
    pub lastupdated: Option<CsTime>,
    /// The host running the VM, where the key may see it (CloudStack shows it to root admins).
    pub host_id: Option<String>,
    pub host_control: Option<HostControlState>,
    pub nic_count: usize,
    pub has_default_nic: bool,
    /// Addresses CloudStack assigned to the VM's NICs.
    pub addresses: Vec<String>,
    /// A NIC on a network that assigns addresses has none.
    pub nic_missing_address: bool,
    pub tx_kbs: Option<u64>,
}

impl Sighting {
    pub fn from_vm(vm: &VirtualMachine) -> Self {
        Self {
            name: vm.name.clone(),
            state: vm.state.clone(),
            lastupdated: vm.lastupdated,
            host_id: vm.hostid.clone(),
            host_control: vm.hostcontrolstate.clone(),
            nic_count: vm.nics.len(),
            has_default_nic: vm.nics.iter().any(|n| n.isdefault) || vm.nics.len() == 1,
            addresses: vm
                .nics
                .iter()
                .filter_map(|n| n.ipaddress.clone().or_else(|| n.ip6address.clone()))
                .collect(),
            nic_missing_address: vm
                .nics
                .iter()
                .any(|n| n.expects_address() && !n.has_address()),
            tx_kbs: vm.networkkbswrite,
        }
    }

    pub fn host_unreachable(&self) -> bool {
        self.host_control
            .as_ref()
            .is_some_and(HostControlState::is_unreachable)
    }
}

/// Guest→host traffic evidence, from polls (cumulative counter, no sample times) and from
/// the usage-history API (samples with CloudStack's timestamps) where the server has it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    /// Counter value at the last poll; `None` when stats were not reported.
    pub last_value: Option<u64>,
    /// Since when (shim time) the counter has not risen, or when observation (re)started.
    pub flat_since: Option<Timestamp>,
    /// When (shim time) the counter was last seen rising.
    pub last_rise: Option<Timestamp>,
    /// Polls at which the counter was seen rising (kept across gaps: it shows the guest has
    /// had steady traffic, which makes it a witness for its host's stats collection).
    pub rises: u32,
    /// Set while every VM on this VM's host looks flat at once: the host's stats collection
    /// looks paused since then, so flat time after it is no evidence (see `collector`).
    pub collection_paused_since: Option<Timestamp>,
    /// Usage-history samples `(CloudStack time, guest→host KiB)`, oldest first, bounded.
    pub samples: VecDeque<(CsTime, u64)>,
    /// When (shim time) the newest sample first arrived: the freshness of the stats.
    pub newest_sample_arrived: Option<Timestamp>,
    /// Time between the last two successful polls: how often a rise can be seen at all.
    pub poll_spacing: Option<jiff::SignedDuration>,
}

/// Usage-history samples kept per VM; enough for any sensible `silent_samples`.
pub const MAX_SAMPLES: usize = 16;

impl Traffic {
    /// Forget the baseline: after a gap in observation a flat counter proves nothing yet.
    fn restart(&mut self, now: Timestamp, value: Option<u64>) {
        self.last_value = value;
        self.flat_since = value.map(|_| now);
    }

    fn observe(&mut self, value: Option<u64>, now: Timestamp, after_gap: bool) {
        match (self.last_value, value) {
            (_, None) => self.restart(now, None),
            (None, Some(v)) => self.restart(now, Some(v)),
            // The counter is cumulative: a rise is activity even across a gap (a poll cycle
            // slower than the stale-poll age must not make every guest look idle).
            (Some(prev), Some(v)) if v > prev => {
                self.last_value = Some(v);
                self.last_rise = Some(now);
                self.rises = self.rises.saturating_add(1);
                self.flat_since = Some(now);
            }
            // Flat across a gap proves nothing yet; a counter that went backwards was reset
            // (restart, migration). Either way, start over.
            (Some(_), Some(v)) if after_gap => self.restart(now, Some(v)),
            (Some(prev), Some(v)) if v < prev => self.restart(now, Some(v)),
            (Some(_), Some(_)) => {}
        }
    }

    fn clear(&mut self) {
        *self = Traffic::default();
    }

    /// Merge usage-history samples (any order, duplicates allowed).
    pub fn record_samples(&mut self, samples: &[UsageSample], now: Timestamp) {
        let newest_before = self.samples.back().map(|s| s.0);
        for s in samples {
            if let (Some(ts), Some(tx)) = (s.timestamp, s.networkkbswrite) {
                match self.samples.binary_search_by(|probe| probe.0.cmp(&ts)) {
                    Ok(i) => self.samples[i].1 = tx,
                    Err(i) => self.samples.insert(i, (ts, tx)),
                }
            }
        }
        while self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
        let newest_after = self.samples.back().map(|s| s.0);
        if newest_after.is_some() && newest_after != newest_before {
            self.newest_sample_arrived = Some(now);
        }
    }
}

/// Everything the shim remembers about one VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmHistory {
    pub vm_id: String,
    pub first_observed: Option<Timestamp>,
    /// The latest poll attempt of the VM's scope.
    pub last_poll: Option<Timestamp>,
    /// Set when the latest poll failed; cleared by the next successful one.
    pub last_error: Option<String>,
    pub last_success: Option<Timestamp>,
    /// The latest sighting (kept while absent, for the message).
    pub sighting: Option<Sighting>,
    /// Since when the VM has been in its current state (shim time, or anchored).
    pub state_since: Option<Timestamp>,
    /// Successful polls in a row that showed the current state.
    pub state_polls: u32,
    /// Complete listings in a row that missed the VM.
    pub absent_polls: u32,
    pub absent_since: Option<Timestamp>,
    pub host_unreachable_since: Option<Timestamp>,
    pub nic_detached_since: Option<Timestamp>,
    pub nic_no_address_since: Option<Timestamp>,
    pub traffic: Traffic,
}

impl VmHistory {
    pub fn new(vm_id: impl Into<String>) -> Self {
        Self {
            vm_id: vm_id.into(),
            first_observed: None,
            last_poll: None,
            last_error: None,
            last_success: None,
            sighting: None,
            state_since: None,
            state_polls: 0,
            absent_polls: 0,
            absent_since: None,
            host_unreachable_since: None,
            nic_detached_since: None,
            nic_no_address_since: None,
            traffic: Traffic::default(),
        }
    }

    /// Anchor the current state's age to an earlier, trusted time (e.g. the
    /// CloudStackMachine's `instanceStateLastUpdated` after a restart of the shim).
    pub fn anchor_state_since(&mut self, at: Timestamp) {
        if let Some(since) = self.state_since {
            self.state_since = Some(since.min(at));
        }
    }

    /// A `False` that the VM's Machine already carries — published by an earlier process of the
    /// shim, before a restart or a change of leader — stands for the confirming polls this
    /// fresh history lacks, as long as the latest poll shows the same evidence. Without it a
    /// new process would flip a confirmed verdict to Unknown and back, and restart the
    /// escalation delay and MHC's timeout with a new transition time.
    pub fn credit_published_false(&mut self, published_reason: &str, graces: &Graces) {
        if self.last_error.is_some() || self.last_success.is_none() {
            return;
        }
        let state = self.sighting.as_ref().map(|s| &s.state);
        match published_reason {
            reason::VM_ERROR if self.absent_polls == 0 && state == Some(&VmState::Error) => {
                self.state_polls = self
                    .state_polls
                    .max(graces.error_confirm_polls.saturating_add(1));
            }
            reason::VM_DESTROYED
                if self.absent_polls == 0
                    && matches!(state, Some(VmState::Destroyed | VmState::Expunging)) =>
            {
                self.state_polls = self.state_polls.max(graces.not_found_polls);
            }
            reason::VM_NOT_FOUND if self.absent_polls > 0 => {
                self.absent_polls = self.absent_polls.max(graces.not_found_polls);
            }
            _ => {}
        }
    }

    pub fn record(&mut self, outcome: PollOutcome<'_>, now: Timestamp, graces: &Graces) {
        self.last_poll = Some(now);
        match outcome {
            PollOutcome::Failed(error) => {
                self.last_error = Some(error.to_string());
                // Consecutive-poll evidence needs consecutive successful polls.
                self.absent_polls = 0;
                self.state_polls = 0;
            }
            PollOutcome::Absent => {
                self.last_error = None;
                self.last_success = Some(now);
                self.absent_polls = self.absent_polls.saturating_add(1);
                self.absent_since.get_or_insert(now);
                self.state_polls = 0;
                self.host_unreachable_since = None;
                self.nic_detached_since = None;
                self.nic_no_address_since = None;
                self.traffic.clear();
            }
            PollOutcome::Seen(vm) => self.record_sighting(vm, now, graces),
        }
    }

    fn record_sighting(&mut self, vm: &VirtualMachine, now: Timestamp, graces: &Graces) {
        let seen = Sighting::from_vm(vm);
        let after_gap = self
            .last_success
            .is_none_or(|t| now.duration_since(t) > graces.stale_after());
        let first_sighting = self.sighting.is_none();
        self.traffic.poll_spacing = self.last_success.map(|t| now.duration_since(t));
        self.first_observed.get_or_insert(now);
        self.last_error = None;
        self.last_success = Some(now);
        self.absent_polls = 0;
        self.absent_since = None;

        let same_state = self.sighting.as_ref().is_some_and(|prev| {
            prev.state == seen.state
                // A moved `lastupdated` means the VM changed state between two polls.
                && (prev.lastupdated.is_none() || seen.lastupdated.is_none() || prev.lastupdated == seen.lastupdated)
        });
        if same_state && self.state_since.is_some() {
            self.state_polls = self.state_polls.saturating_add(1);
        } else {
            let anchored = match (
                first_sighting,
                graces.anchor_to_lastupdated,
                seen.lastupdated,
            ) {
                (true, true, Some(at)) => at.0.min(now),
                _ => now,
            };
            self.state_since = Some(anchored);
            self.state_polls = 1;
        }

        let running = seen.state == VmState::Running;
        let host_unreachable = running && seen.host_unreachable();
        let host_came_back = self.host_unreachable_since.is_some() && !host_unreachable;
        self.host_unreachable_since = if host_unreachable {
            Some(self.host_unreachable_since.unwrap_or(now))
        } else {
            None
        };
        let detached = running && (seen.nic_count == 0 || !seen.has_default_nic);
        self.nic_detached_since = if detached {
            Some(self.nic_detached_since.unwrap_or(now))
        } else {
            None
        };
        let no_address = running && !detached && seen.nic_missing_address;
        self.nic_no_address_since = if no_address {
            Some(self.nic_no_address_since.unwrap_or(now))
        } else {
            None
        };

        if running && !host_unreachable {
            // Stats are not collected while the host is unreachable: start afresh after it.
            self.traffic
                .observe(seen.tx_kbs, now, after_gap || host_came_back || !same_state);
        } else {
            let samples = std::mem::take(&mut self.traffic.samples);
            self.traffic.clear();
            // Samples carry their own times; keep them unless the VM left Running.
            if running {
                self.traffic.samples = samples;
            }
        }
        self.sighting = Some(seen);
    }

    /// Merge usage-history samples for this VM.
    pub fn record_usage(&mut self, samples: &[UsageSample], now: Timestamp) {
        let running = self
            .sighting
            .as_ref()
            .is_some_and(|s| s.state == VmState::Running);
        if running {
            self.traffic.record_samples(samples, now);
        }
    }
}
