//! What the shim remembers about one VM between polls. Recording is pure: every function
//! takes `now` and the observation; nothing here talks to CloudStack.

use jiff::Timestamp;
use serde::Serialize;

use super::probe::{ProbeHistory, ProbeNic};
use super::Graces;
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
    /// `KVM`, `VMware`, `XenServer`, … (decides whether its counters can show silence).
    pub hypervisor: Option<String>,
    /// When CloudStack created the VM: its `vm_stats` rows are all younger than this.
    pub created: Option<CsTime>,
    /// The VM's offering is HA-enabled: CloudStack may restart it by itself.
    pub ha_enabled: bool,
    /// An async job on the VM is still running (`jobid` with `jobstatus` 0).
    pub job_pending: bool,
    /// The default NIC's IPv4 address on its network: what the guest probe asks about.
    pub probe_nic: Option<ProbeNic>,
    /// Template, service offering and zone names: what the scorecard groups by.
    pub template: Option<String>,
    pub offering: Option<String>,
    pub zone: Option<String>,
    /// The host's name and the default NIC's network: what a storm's shared cause is named by
    /// (`incidents`).
    pub host_name: Option<String>,
    pub network_id: Option<String>,
    pub network_name: Option<String>,
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
            hypervisor: vm.hypervisor.clone(),
            created: vm.created,
            ha_enabled: vm.haenable == Some(true),
            job_pending: vm.jobid.as_deref().is_some_and(|j| !j.trim().is_empty())
                && vm.jobstatus.is_none_or(|s| s == 0),
            probe_nic: probe_nic(vm),
            template: vm.templatename.clone(),
            offering: vm.serviceofferingname.clone(),
            zone: vm.zonename.clone(),
            host_name: vm.hostname.clone(),
            network_id: default_nic(vm).and_then(|n| n.networkid.clone()),
            network_name: default_nic(vm).and_then(|n| n.networkname.clone()),
        }
    }

    pub fn host_unreachable(&self) -> bool {
        self.host_control
            .as_ref()
            .is_some_and(HostControlState::is_unreachable)
    }

    /// The host is in (or entering, or failed at) maintenance: CloudStack's stats collector
    /// skips it (StatsCollector's host query), so its VMs' counters say nothing.
    pub fn host_in_maintenance(&self) -> bool {
        match &self.host_control {
            Some(HostControlState::Maintenance) => true,
            Some(HostControlState::Other(s)) => s.to_ascii_lowercase().contains("maintenance"),
            _ => false,
        }
    }
}

/// The default NIC, or the only one.
fn default_nic(vm: &VirtualMachine) -> Option<&cloudstack_api::model::Nic> {
    match vm.nics.as_slice() {
        [only] => Some(only),
        nics => nics.iter().find(|n| n.isdefault),
    }
}

/// The default NIC (or the only one) with an IPv4 address and a network: the address an ARP
/// probe from that network's router can ask about. IPv6-only NICs have none (ARP is IPv4).
fn probe_nic(vm: &VirtualMachine) -> Option<ProbeNic> {
    let nic = default_nic(vm)?;
    Some(ProbeNic {
        network_id: nic.networkid.clone().filter(|n| !n.trim().is_empty())?,
        address: nic.ipaddress.as_deref()?.trim().parse().ok()?,
        mac: nic.macaddress.clone().filter(|m| !m.trim().is_empty()),
    })
}

/// What one CloudStack endpoint's statistics are, from `listCapabilities` (asked once per
/// endpoint): whether a flat accumulated counter can mean anything at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StatsServer {
    /// The server honours `accumulate=true` (4.17.0+, and no counter of a VM younger than
    /// the retention was seen falling): the listing's counter is the sum over every retained
    /// `vm_stats` row, so it only falls when rows expire.
    pub accumulates: bool,
    /// `vm.stats.max.retention.time` (`instancesstatsretentiontime`): rows older than this
    /// leave the sum, so a VM older than this can show a flat sum while it sends.
    pub retention: Option<jiff::SignedDuration>,
}

impl StatsServer {
    /// From `cloudstackversion` and `instancesstatsretentiontime` (minutes).
    pub fn from_capabilities(version: Option<&str>, retention_minutes: Option<i64>) -> Self {
        Self {
            accumulates: version.is_some_and(|v| version_at_least(v, (4, 17))),
            retention: retention_minutes
                .filter(|m| *m > 0)
                .map(jiff::SignedDuration::from_mins),
        }
    }
}

impl VmHistory {
    /// Whether this VM's counter just fell although no row of it can have expired yet: proof
    /// that the server's counter is not a sum of rows.
    pub fn counter_fell_while_young(
        &self,
        retention: jiff::SignedDuration,
        now: Timestamp,
    ) -> bool {
        self.traffic.counter_fell
            && self
                .sighting
                .as_ref()
                .and_then(|s| s.created)
                .is_some_and(|c| now.duration_since(c.0) < retention)
    }
}

/// `"4.19.1.0"` ≥ `(4, 17)`; an unreadable version is not.
fn version_at_least(version: &str, (major, minor): (u64, u64)) -> bool {
    let mut parts = version
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// Guest→host traffic evidence: the listing's accumulated counter (no sample times) and the
/// usage-history rows (each one management server's reading of one interval, with
/// CloudStack's timestamp), where the server shows them. cloudstack-api.md §3.1b.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    /// Counter value at the last poll; `None` when stats were not reported.
    pub last_value: Option<u64>,
    /// Since when (shim time) the counter has not risen, or when observation (re)started
    /// after a gap: how long a flat counter has been watched without interruption.
    pub flat_since: Option<Timestamp>,
    /// Since when (shim time) the counter has shown its current value, gaps in observation
    /// included (a rise across a gap is still seen as a rise).
    pub unchanged_since: Option<Timestamp>,
    /// When (shim time) the counter was last seen rising.
    pub last_rise: Option<Timestamp>,
    /// Polls at which the counter was seen rising (kept across gaps: it shows the guest has
    /// had steady traffic, which makes it a witness for its host's stats collection).
    pub rises: u32,
    /// Set while every VM on this VM's host looks flat at once: the host's stats collection
    /// looks paused since then, so flat time after it is no evidence (see `collector`).
    pub collection_paused_since: Option<Timestamp>,
    /// The latest usage-history answer for this VM: `(timestamp, guest→host KiB)` per row,
    /// oldest first, one row per collection per management server. `None` when never asked
    /// or when the answer did not show this VM (CloudStack's usage history has no
    /// `projectid`, so VMs of projects are not in it).
    pub rows: Option<Vec<(CsTime, u64)>>,
    /// When (shim time) `rows` were fetched.
    pub rows_fetched: Option<Timestamp>,
    /// Time between the last two successful polls: how often a rise can be seen at all.
    pub poll_spacing: Option<jiff::SignedDuration>,
    /// The endpoint's statistics semantics, where known.
    pub server: Option<StatsServer>,
    /// Shim time between the counter's last few rises, seen without a gap in observation
    /// (newest last): how far apart rows with traffic arrive.
    pub rise_gaps: Vec<jiff::SignedDuration>,
    /// How long a busy guest's counter stays flat on this endpoint, as its scope's VMs show
    /// it (see [`crate::traffic::counter_cadence`]); set by the scope observer.
    pub counter_cadence: Option<jiff::SignedDuration>,
    /// The counter went down between two consecutive polls at the last poll. A sum of rows
    /// only falls when rows expire, so for a VM younger than the retention this shows the
    /// server is not summing (it ignored `accumulate`).
    pub counter_fell: bool,
}

/// Gaps between rises kept per VM.
pub const RISE_GAPS_KEPT: usize = 4;

/// Usage-history rows kept per VM: the newest ones, enough for 12 collections × 8
/// management servers. A longer answer (a server that drops the time of `startdate`) is cut.
pub const MAX_ROWS: usize = 96;

impl Traffic {
    /// Forget the baseline: after a gap in observation a flat counter proves nothing yet.
    fn restart(&mut self, now: Timestamp, value: Option<u64>) {
        self.last_value = value;
        self.flat_since = value.map(|_| now);
    }

    fn observe(&mut self, value: Option<u64>, now: Timestamp, after_gap: bool) {
        self.counter_fell =
            !after_gap && matches!((self.last_value, value), (Some(p), Some(v)) if v < p);
        // Across gaps too: with usage-history rows the gap itself is visible in their times.
        self.unchanged_since = match (self.last_value, value) {
            (Some(p), Some(v)) if p == v => self.unchanged_since.or(Some(now)),
            (_, Some(_)) => Some(now),
            (_, None) => None,
        };
        match (self.last_value, value) {
            (_, None) => self.restart(now, None),
            (None, Some(v)) => self.restart(now, Some(v)),
            // A rise of the accumulated counter is a new row with traffic: activity, even
            // across a gap (a poll cycle slower than the stale-poll age must not make every
            // guest look idle).
            (Some(prev), Some(v)) if v > prev => {
                if let (Some(last), false) = (self.last_rise, after_gap) {
                    self.rise_gaps.push(now.duration_since(last));
                    let cut = self.rise_gaps.len().saturating_sub(RISE_GAPS_KEPT);
                    self.rise_gaps.drain(..cut);
                }
                self.last_value = Some(v);
                self.last_rise = Some(now);
                self.rises = self.rises.saturating_add(1);
                self.flat_since = Some(now);
            }
            // Flat across a gap proves nothing yet; a counter that went down lost rows (they
            // expired) or is not a sum at all. Either way, start over.
            (Some(_), Some(v)) if after_gap => self.restart(now, Some(v)),
            (Some(prev), Some(v)) if v < prev => self.restart(now, Some(v)),
            (Some(_), Some(_)) => {}
        }
    }

    fn clear(&mut self) {
        let (server, counter_cadence) = (self.server, self.counter_cadence);
        *self = Traffic {
            server,
            counter_cadence,
            ..Traffic::default()
        };
    }

    /// Takes one usage-history answer for this VM (`None`: the answer did not show it).
    /// Rows without a timestamp or a guest→host value are dropped.
    pub fn record_rows(&mut self, samples: Option<&[UsageSample]>, now: Timestamp) {
        self.rows_fetched = Some(now);
        self.rows = samples.map(|samples| {
            let mut rows: Vec<(CsTime, u64)> = samples
                .iter()
                .filter_map(|s| Some((s.timestamp?, s.networkkbswrite?)))
                .collect();
            rows.sort_by_key(|r| r.0);
            let cut = rows.len().saturating_sub(MAX_ROWS);
            rows.drain(..cut);
            rows
        });
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
    /// When the polls began failing (the first failure of the current run of failures).
    pub failing_since: Option<Timestamp>,
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
    /// The guest probe's attempts (empty when the probe is off).
    pub probe: ProbeHistory,
}

impl VmHistory {
    pub fn new(vm_id: impl Into<String>) -> Self {
        Self {
            vm_id: vm_id.into(),
            first_observed: None,
            last_poll: None,
            last_error: None,
            failing_since: None,
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
            probe: ProbeHistory::default(),
        }
    }

    /// Anchor the current state's age to an earlier, trusted time (e.g. the
    /// CloudStackMachine's `instanceStateLastUpdated` after a restart of the shim).
    pub fn anchor_state_since(&mut self, at: Timestamp) {
        if let Some(since) = self.state_since {
            self.state_since = Some(since.min(at));
        }
    }

    pub fn record(&mut self, outcome: PollOutcome<'_>, now: Timestamp, graces: &Graces) {
        self.last_poll = Some(now);
        match outcome {
            PollOutcome::Failed(error) => {
                self.last_error = Some(error.to_string());
                self.failing_since.get_or_insert(now);
                // Consecutive-poll evidence needs consecutive successful polls.
                self.absent_polls = 0;
                self.state_polls = 0;
            }
            PollOutcome::Absent => {
                self.last_error = None;
                self.failing_since = None;
                self.last_success = Some(now);
                self.absent_polls = self.absent_polls.saturating_add(1);
                self.absent_since.get_or_insert(now);
                self.state_polls = 0;
                self.host_unreachable_since = None;
                self.nic_detached_since = None;
                self.nic_no_address_since = None;
                self.traffic.clear();
                self.probe.clear();
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
        self.failing_since = None;
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
            let rows = self.traffic.rows.take();
            let fetched = self.traffic.rows_fetched;
            self.traffic.clear();
            // Rows carry their own times; keep them unless the VM left Running.
            if running {
                self.traffic.rows = rows;
                self.traffic.rows_fetched = fetched;
            }
        }
        // Answers were about this address while Running; anything else starts over.
        let same_address = self
            .sighting
            .as_ref()
            .is_some_and(|prev| prev.probe_nic == seen.probe_nic);
        if !running || !same_address {
            self.probe.clear();
        }
        self.sighting = Some(seen);
    }

    /// Takes the usage-history answer for this VM (`None`: the answer did not show it).
    pub fn record_usage(&mut self, samples: Option<&[UsageSample]>, now: Timestamp) {
        let running = self
            .sighting
            .as_ref()
            .is_some_and(|s| s.state == VmState::Running);
        if running {
            self.traffic.record_rows(samples, now);
        }
    }
}
