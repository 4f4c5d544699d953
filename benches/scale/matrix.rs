//! Part 3c: precision at real semantics (issue 14 §4). The simulator produces statistics the
//! way CloudStack does (per-hypervisor rows, N management servers, retention, usage history
//! per row); every guest profile a Machine without a Node can show runs in every cell of
//! {KVM, VMware, XenServer} × `vm.stats.increment.metrics` {on, off} × management servers
//! {1, 3} × `vm.stats.interval` {60 s, 300 s}, with the shim at its defaults (`--stats-interval`
//! stays 60 s: it must infer a 300 s cadence itself).
//!
//! A cell: 8 profiles × [`PER_PROFILE`] VMs on [`HOSTS`] hosts of the cell's hypervisor, in four
//! scopes — two projects (usage history cannot show their VMs: the counter-alone path) and two
//! accounts (usage history shows them: the per-row path) — a quarter of them on an L2 network
//! (CloudStack assigns no address there). Incidents in every cell: a host goes through
//! PrepareForMaintenance (its VMs live-migrated away one by one, the collector skipping the
//! host meanwhile) → Maintenance → Enabled; a host is `Connecting` for 5 min (shown `Enabled`,
//! not collected); a host's stats call fails for 8 min. Faults go only on the other hosts.
//!
//! Counting: a Machine published `False` is recycled at once (the shim forgets the VM). Healthy
//! profiles are boot→join, slow boot, waiting-for-endpoint (SYN and ARP) and idle-joined, and
//! nic-down and one-nic-down until their fault: a `False` on one of them is a false `False`.
//! Faults are nic-down and one-nic-down after their fault, and quiet from the start: quiet is
//! what a guest whose services failed after boot sends (NTP/ARP only, about 4 B/s); its Machine
//! never joins and MHC would recycle it anyway, so a `False` on it is a detection. A fault whose
//! `False` the mass-failure guard holds is recycled by MHC's timer after 600 s and is not
//! counted as detected. A one-nic-down never published `False` is not detectable by design
//! while its second NIC keeps the counters rising.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use capc_health_shim::verdict::{reason, Graces, Status};
use cloudstack_sim::{
    Fault, GuestKind, HostChange, HostStatus, Hypervisor, Profile, ResourceState, Settings, VmState,
};
use futures::stream::{self, StreamExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::fleet::{poll_all, Fleet, FleetPlan, ScopeKind, VmPlan, SHIM_INTERVAL_SECS};
use crate::precision::pareto;
use crate::verdict_time::MHC_NODE_STARTUP_TIMEOUT_SECS;

pub const PER_PROFILE: usize = 20;
pub const HOSTS: usize = 8;
const SCOPE_KINDS: [ScopeKind; 4] = [
    ScopeKind::Project,
    ScopeKind::Account,
    ScopeKind::Project,
    ScopeKind::Account,
];
const MAINTENANCE_HOST: usize = 0;
const CONNECTING_HOST: usize = 1;
const FAILING_HOST: usize = 2;
/// Hosts without incidents: faults go there, and so do migrations.
const FIRST_QUIET_HOST: usize = 3;
const MIN: i64 = 60_000;
pub const RUN_MINUTES: i64 = 100;
/// Cells run at the same time (each has its own simulator and checkers).
const CONCURRENT_CELLS: usize = 2;
/// A fixed simulated epoch (plus a seeded offset per cell), so a cell is reproducible.
const EPOCH_MS: i64 = 1_767_225_600_000;
const MAX_EXAMPLES: usize = 4;

/// What a guest does over the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Guest {
    /// boot → kubeadm join → idle-joined.
    BootJoin,
    /// boot → waiting-for-endpoint (Pareto, up to 25 min) → join → idle-joined.
    SlowBoot,
    /// boot → waiting-for-endpoint (SYN retransmits) for the whole run.
    WaitSyn,
    /// boot → waiting-for-endpoint-arp (unclaimed VIP) for the whole run.
    WaitArp,
    /// idle-joined from the start (a joined node whose Node is not linked yet).
    IdleJoined,
    /// boot → quiet (services failed: NTP, ARP, MLD only).
    Quiet,
    /// boot → join → idle, NIC down at a random moment after it runs.
    NicDown,
    /// boot → join → idle, the default NIC of two down at a random moment.
    OneNicDown,
}

impl Guest {
    pub const ALL: [Guest; 8] = [
        Guest::BootJoin,
        Guest::SlowBoot,
        Guest::WaitSyn,
        Guest::WaitArp,
        Guest::IdleJoined,
        Guest::Quiet,
        Guest::NicDown,
        Guest::OneNicDown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::BootJoin => "boot-join",
            Self::SlowBoot => "slow-boot",
            Self::WaitSyn => "waiting-for-endpoint",
            Self::WaitArp => "waiting-for-endpoint-arp",
            Self::IdleJoined => "idle-joined",
            Self::Quiet => "quiet",
            Self::NicDown => "nic-down",
            Self::OneNicDown => "one-nic-down",
        }
    }

    /// Gets a fault injected during the run (placed on a host without incidents).
    fn injected(self) -> bool {
        matches!(self, Self::NicDown | Self::OneNicDown)
    }

    /// Whether the guest is faulty at a poll, given whether its injected fault is in yet (a
    /// `False` on a guest that is not is a false `False`): quiet always (services failed after boot: the Machine never joins), nic-down and
    /// one-nic-down once their fault is in.
    fn faulty(self, fault_in: bool) -> bool {
        match self {
            Self::Quiet => true,
            Self::NicDown | Self::OneNicDown => fault_in,
            _ => false,
        }
    }

    /// The profile as a healthy-VM label: `nic-down before its fault` for the injected ones.
    fn healthy_label(self) -> String {
        if self.injected() {
            format!("{} before its fault", self.as_str())
        } else {
            self.as_str().to_string()
        }
    }
}

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    pub hypervisor: Hypervisor,
    /// `vm.stats.increment.metrics`.
    pub increment: bool,
    pub management_servers: u32,
    pub interval_secs: u64,
    /// `--silence-hypervisors KVM,VMware,XenServer` instead of the default (KVM).
    pub opt_in: bool,
}

impl Cell {
    /// `kvm_inc_on_1ms_60s` (`_optin` with the opt-in).
    pub fn label(&self) -> String {
        format!(
            "{}_inc_{}_{}ms_{}s{}",
            self.hypervisor.as_str().to_ascii_lowercase(),
            if self.increment { "on" } else { "off" },
            self.management_servers,
            self.interval_secs,
            if self.opt_in { "_optin" } else { "" }
        )
    }

    /// The seed leaves out `increment`: the on/off twins play the same run, so any difference
    /// between them is the setting's.
    fn seed(&self, base: u64) -> u64 {
        let hv = Hypervisor::ALL
            .iter()
            .position(|h| *h == self.hypervisor)
            .unwrap_or(0) as u64;
        base.wrapping_mul(1_000_003)
            .wrapping_add(hv * 10_000 + u64::from(self.management_servers) * 1_000)
            .wrapping_add(self.interval_secs)
    }

    fn graces(&self) -> Graces {
        let mut g = Graces::default();
        if self.opt_in {
            g.silence_hypervisors = Hypervisor::ALL
                .iter()
                .map(|h| h.as_str().to_string())
                .collect();
        }
        g
    }
}

/// The 24 cells at the shim's defaults.
pub fn cells() -> Vec<Cell> {
    let mut out = Vec::new();
    for hypervisor in Hypervisor::ALL {
        for increment in [true, false] {
            for management_servers in [1, 3] {
                for interval_secs in [60, 300] {
                    out.push(Cell {
                        hypervisor,
                        increment,
                        management_servers,
                        interval_secs,
                        opt_in: false,
                    });
                }
            }
        }
    }
    out
}

/// The VMware and XenServer cells again with every hypervisor opted in.
pub fn opt_in_cells() -> Vec<Cell> {
    cells()
        .into_iter()
        .filter(|c| c.hypervisor != Hypervisor::Kvm)
        .map(|c| Cell { opt_in: true, ..c })
        .collect()
}

/// Injected / detected nic-down faults of one scope kind.
#[derive(Debug, Clone, Default)]
pub struct PathCount {
    pub injected: usize,
    pub detected: usize,
}

/// Detections of one fault profile in a cell.
#[derive(Debug, Clone, Default)]
pub struct FaultCount {
    /// VMs that had the fault (nic-down, one-nic-down: injected; quiet: every quiet VM).
    pub total: usize,
    /// Seconds from injection to the published `False` (quiet: from the start of the run),
    /// sorted; its length is the number detected.
    pub seconds: Vec<f64>,
    /// VMs judged: published `False`, or `False` held by the mass-failure guard.
    pub judged: usize,
    /// `reason` → detections with it.
    pub by_reason: BTreeMap<String, usize>,
}

impl FaultCount {
    pub fn detected(&self) -> usize {
        self.seconds.len()
    }

    pub fn missed(&self) -> usize {
        self.total - self.detected()
    }

    /// Judged silent but never published: the guard held the `False` until MHC's timer.
    pub fn held_only(&self) -> usize {
        self.judged.saturating_sub(self.detected())
    }
}

#[derive(Debug, Clone)]
pub struct CellResult {
    pub cell: Cell,
    pub cycles: usize,
    /// Healthy VMs published `False` (healthy profiles; nic-down and one-nic-down before their
    /// fault).
    pub false_false: usize,
    /// `profile scope-kind reason` → healthy VMs published `False` with it.
    pub false_false_by: BTreeMap<String, usize>,
    /// Healthy VMs published `False` with `NICDetached` or `NICNoAddress`.
    pub false_false_nic: usize,
    pub nic_down: FaultCount,
    /// Nic-down per scope kind (`project`: counter-alone path, `account`: per-row path).
    pub nic_down_by_path: BTreeMap<&'static str, PathCount>,
    /// Quiet guests (services failed after boot): a fault, a `False` is a detection.
    pub quiet: FaultCount,
    /// One-nic-down after its fault: a `False` is a detection; a miss is not detectable by
    /// design while the second NIC keeps the counters rising.
    pub one_nic_down: FaultCount,
    /// Injections skipped because the Machine was already recycled (a false `False` before
    /// its fault).
    pub faults_not_injected: usize,
    /// The first few false `False` verdicts: minute of the run, profile, scope kind, host,
    /// reason and message.
    pub false_false_examples: Vec<String>,
    /// `profile scope-kind` → healthy VMs whose `False` the mass-failure guard held (a
    /// `False` the guard prevented; it also hides real faults in the same scope meanwhile).
    pub held_healthy_by: BTreeMap<String, usize>,
    /// Healthy `waiting-for-endpoint*` VMs published `GuestNetworkSilent`.
    pub waiting_silent: usize,
    /// VMs whose `False` the mass-failure guard held at some poll (healthy or not).
    pub held: usize,
    /// Faulty VMs held by the guard that MHC's timer recycled.
    pub recycled_by_mhc_timer: usize,
    /// Per scope kind: VMs whose verdict messages showed usage-history samples, and VMs whose
    /// messages showed only the listing counter (no samples).
    pub rows_path_vms: BTreeMap<&'static str, usize>,
    pub counter_path_vms: BTreeMap<&'static str, usize>,
    pub vms_by_kind: BTreeMap<&'static str, usize>,
    pub usage_history_calls: u64,
    /// The cadence the shim inferred from the account scopes' samples (the largest).
    pub inferred_interval_secs: Option<i64>,
    pub migrations: usize,
    /// Healthy VMs published with another status/reason than `True VMHealthy` at some poll.
    pub healthy_other_reasons: BTreeMap<String, usize>,
    pub wall_seconds: f64,
}

impl CellResult {
    pub fn healthy_held(&self) -> usize {
        self.held_healthy_by.values().sum()
    }
}

#[derive(Debug, Clone)]
enum Event {
    NicDown(usize),
    Profile(usize, Option<Profile>),
    Host(usize, HostChange),
    Migrate(usize, usize, f64),
}

fn host_event(host: usize, status: Option<HostStatus>, rs: Option<ResourceState>) -> Event {
    Event::Host(
        host,
        HostChange {
            status,
            resource_state: rs,
            ..HostChange::default()
        },
    )
}

struct Planned {
    plan: FleetPlan,
    guests: Vec<Guest>,
    events: Vec<(i64, Event)>,
    /// VM index → when its fault (nic-down, one-nic-down) is injected.
    fault_at: BTreeMap<usize, i64>,
}

fn plan_cell(cell: &Cell, rng: &mut StdRng) -> Planned {
    let t0 = EPOCH_MS + rng.random_range(0..600_000);
    let settings = Settings {
        stats_interval_seconds: cell.interval_secs,
        management_servers: cell.management_servers,
        stats_increment_metrics: cell.increment,
        ..Settings::default()
    };
    let boot_phase_ms = (settings.guest_boot_seconds * 1000.0) as i64;
    let join_ms = (settings.guest_join_seconds * 1000.0) as i64;
    let quiet_hosts = HOSTS - FIRST_QUIET_HOST;
    let mut vms = Vec::new();
    let mut guests = Vec::new();
    let mut events = Vec::new();
    let mut fault_at = BTreeMap::new();
    let mut healthy_n = 0usize;
    let mut faulted_n = 0usize;
    for guest in Guest::ALL {
        for k in 0..PER_PROFILE {
            let i = vms.len();
            let host = if guest.injected() {
                faulted_n += 1;
                FIRST_QUIET_HOST + faulted_n % quiet_hosts
            } else {
                healthy_n += 1;
                healthy_n % HOSTS
            };
            let idle = guest == Guest::IdleJoined;
            let boot_s = if idle {
                0.0
            } else {
                pareto(rng, 20.0, 1.5, 600.0)
            };
            let mut v = VmPlan::new(
                k % SCOPE_KINDS.len(),
                host,
                if idle {
                    VmState::Running
                } else {
                    VmState::Starting
                },
                boot_s,
            );
            v.l2 = (k / SCOPE_KINDS.len()) % 4 == 1;
            let rs = t0 + (boot_s * 1000.0) as i64;
            match guest {
                Guest::BootJoin => {}
                Guest::SlowBoot => {
                    v.guest = GuestKind::Waiting;
                    let wait = (pareto(rng, 120.0, 1.2, 1500.0) * 1000.0) as i64;
                    let join = rs + boot_phase_ms + wait;
                    events.push((join, Event::Profile(i, Some(Profile::KubeadmJoin))));
                    events.push((join + join_ms, Event::Profile(i, Some(Profile::IdleJoined))));
                }
                Guest::WaitSyn => v.guest = GuestKind::Waiting,
                Guest::WaitArp => {
                    v.guest = GuestKind::Waiting;
                    events.push((
                        rs + boot_phase_ms,
                        Event::Profile(i, Some(Profile::WaitingForEndpointArp)),
                    ));
                }
                Guest::IdleJoined => v.profile = Some(Profile::IdleJoined),
                Guest::Quiet => v.guest = GuestKind::ServicesFail,
                Guest::NicDown | Guest::OneNicDown => {
                    let at = rs + 1_000 + rng.random_range(0..55 * MIN);
                    fault_at.insert(i, at);
                    events.push((
                        at,
                        if guest == Guest::NicDown {
                            Event::NicDown(i)
                        } else {
                            Event::Profile(i, Some(Profile::OneNicDown))
                        },
                    ));
                }
            }
            vms.push(v);
            guests.push(guest);
        }
    }
    // PrepareForMaintenance → its VMs live-migrated away one by one → Maintenance → Enabled.
    let m = t0 + 30 * MIN;
    events.push((
        m,
        host_event(
            MAINTENANCE_HOST,
            None,
            Some(ResourceState::PrepareForMaintenance),
        ),
    ));
    let on_maintenance: Vec<usize> = (0..vms.len())
        .filter(|i| vms[*i].host == MAINTENANCE_HOST)
        .collect();
    for (k, i) in on_maintenance.into_iter().enumerate() {
        let at = m + k as i64 * 20_000 + rng.random_range(0..20_000);
        let to = FIRST_QUIET_HOST + rng.random_range(0..quiet_hosts);
        events.push((at, Event::Migrate(i, to, rng.random_range(60.0..240.0))));
    }
    events.push((
        m + 15 * MIN,
        host_event(MAINTENANCE_HOST, None, Some(ResourceState::Maintenance)),
    ));
    events.push((
        m + 40 * MIN,
        host_event(MAINTENANCE_HOST, None, Some(ResourceState::Enabled)),
    ));
    // An agent reconnecting: status Connecting (hostcontrolstate Enabled), not collected.
    events.push((
        t0 + 40 * MIN,
        host_event(CONNECTING_HOST, Some(HostStatus::Connecting), None),
    ));
    events.push((
        t0 + 45 * MIN,
        host_event(CONNECTING_HOST, Some(HostStatus::Up), None),
    ));
    // The host's stats call fails for 8 min: a collection gap while everything else is fine.
    let fails = |on: bool| {
        Event::Host(
            FAILING_HOST,
            HostChange {
                stats_call_fails: Some(on),
                ..HostChange::default()
            },
        )
    };
    events.push((t0 + 50 * MIN, fails(true)));
    events.push((t0 + 58 * MIN, fails(false)));
    events.sort_by_key(|e| e.0);
    Planned {
        plan: FleetPlan {
            scopes: SCOPE_KINDS.len(),
            hosts: HOSTS,
            vms,
            scope_kinds: SCOPE_KINDS.to_vec(),
            hypervisor: cell.hypervisor,
            settings,
            start_ms: Some(t0),
            network_per_scope: false,
        },
        guests,
        events,
        fault_at,
    }
}

/// Applies one event; `Ok(false)` for a migration of a VM that was not Running then.
fn apply(fleet: &Fleet, e: &Event) -> Result<bool, String> {
    let err = |e: cloudstack_sim::WorldError| format!("{e:?}");
    match e {
        Event::NicDown(i) => fleet
            .sim
            .inject_fault(&fleet.vms[*i].0, Fault::NicDown)
            .map_err(err)?,
        Event::Profile(i, p) => fleet.sim.set_profile(&fleet.vms[*i].0, *p).map_err(err)?,
        Event::Host(h, ch) => fleet
            .sim
            .with_world(|w| w.change_host_now(*h, ch))
            .map_err(err)?,
        Event::Migrate(i, to, secs) => {
            return match fleet.sim.migrate(&fleet.vms[*i].0, *to, *secs) {
                Ok(()) => Ok(true),
                Err(cloudstack_sim::WorldError::Conflict(_)) => Ok(false),
                Err(e) => Err(err(e)),
            }
        }
    }
    Ok(true)
}

pub async fn run_cell(cell: Cell, seed: u64) -> Result<CellResult, String> {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(cell.seed(seed));
    let planned = plan_cell(&cell, &mut rng);
    let fleet = Fleet::start(&planned.plan).await?;
    let t0 = fleet.sim.now_ms();
    let graces = cell.graces();
    let mut checkers = fleet.checkers_with(&graces);
    let index_of: BTreeMap<&str, usize> = fleet
        .vms
        .iter()
        .enumerate()
        .map(|(i, (id, _, _))| (id.as_str(), i))
        .collect();
    let kinds: Vec<&'static str> = fleet
        .vms
        .iter()
        .map(|(_, scope, _)| planned.plan.scope_kind(*scope).as_str())
        .collect();
    let kind_of = |i: usize| kinds[i];
    let mut out = CellResult {
        cell,
        cycles: 0,
        false_false: 0,
        false_false_by: BTreeMap::new(),
        false_false_nic: 0,
        nic_down: FaultCount::default(),
        nic_down_by_path: BTreeMap::new(),
        quiet: FaultCount {
            total: planned
                .guests
                .iter()
                .filter(|g| **g == Guest::Quiet)
                .count(),
            ..FaultCount::default()
        },
        one_nic_down: FaultCount::default(),
        faults_not_injected: 0,
        false_false_examples: Vec::new(),
        held_healthy_by: BTreeMap::new(),
        waiting_silent: 0,
        held: 0,
        recycled_by_mhc_timer: 0,
        rows_path_vms: BTreeMap::new(),
        counter_path_vms: BTreeMap::new(),
        vms_by_kind: BTreeMap::new(),
        usage_history_calls: 0,
        inferred_interval_secs: None,
        migrations: 0,
        healthy_other_reasons: BTreeMap::new(),
        wall_seconds: 0.0,
    };
    for i in 0..fleet.vms.len() {
        *out.vms_by_kind.entry(kind_of(i)).or_default() += 1;
    }
    let step_ms = SHIM_INTERVAL_SECS * 1000;
    let mhc_ms = (MHC_NODE_STARTUP_TIMEOUT_SECS * 1000.0) as i64;
    let mut pending = planned.events.iter().peekable();
    let mut recycled: BTreeSet<usize> = BTreeSet::new();
    // Every VM the guard held at some poll, and when the guard began holding each faulty one.
    let mut held_any: BTreeSet<usize> = BTreeSet::new();
    let mut fault_held_since: BTreeMap<usize, i64> = BTreeMap::new();
    let mut rows_seen: BTreeSet<usize> = BTreeSet::new();
    let mut counter_seen: BTreeSet<usize> = BTreeSet::new();
    let mut other: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    let mut held_healthy: BTreeSet<usize> = BTreeSet::new();
    // Faulty VMs published `False`, or held by the guard, per profile.
    let mut judged: BTreeMap<Guest, BTreeSet<usize>> = BTreeMap::new();
    while fleet.sim.now_ms() < t0 + RUN_MINUTES * MIN {
        let poll_at = fleet.sim.now_ms() + step_ms;
        while let Some((at, e)) = pending.next_if(|(at, _)| *at <= poll_at) {
            let now = fleet.sim.now_ms();
            if *at > now {
                fleet.sim.advance((*at - now) as f64 / 1000.0);
            }
            let (skip, fault_of) = match e {
                Event::NicDown(i) => (recycled.contains(i), Some(*i)),
                Event::Profile(i, _) => (
                    recycled.contains(i),
                    Some(*i).filter(|i| planned.fault_at.get(i) == Some(at)),
                ),
                Event::Migrate(i, ..) => (recycled.contains(i), None),
                Event::Host(..) => (false, None),
            };
            if skip {
                out.faults_not_injected += usize::from(fault_of.is_some());
                continue;
            }
            if apply(&fleet, e)? && matches!(e, Event::Migrate(..)) {
                out.migrations += 1;
            }
            if let Some(i) = fault_of {
                if planned.guests[i] == Guest::NicDown {
                    out.nic_down.total += 1;
                    out.nic_down_by_path.entry(kind_of(i)).or_default().injected += 1;
                } else {
                    out.one_nic_down.total += 1;
                }
            }
        }
        let now = fleet.sim.now_ms();
        fleet.sim.advance((poll_at - now) as f64 / 1000.0);
        out.cycles += 1;
        let mut recycle = Vec::new();
        for r in poll_all(&mut checkers, fleet.now()).await {
            let Some(&i) = index_of.get(r.vm_id.as_str()) else {
                continue;
            };
            let guest = planned.guests[i];
            let fault_in = planned.fault_at.get(&i).is_some_and(|at| *at <= poll_at);
            let faulty = guest.faulty(fault_in);
            if r.message.contains("stats sample") {
                rows_seen.insert(i);
            } else if r.message.contains("flat at") {
                counter_seen.insert(i);
            }
            if !faulty && r.reason != reason::VM_HEALTHY {
                other
                    .entry(format!("{} {}", r.verdict, r.reason))
                    .or_default()
                    .insert(i);
            }
            match r.verdict {
                Status::False => {
                    recycle.push(i);
                    if faulty {
                        judged.entry(guest).or_default().insert(i);
                        // Quiet is faulty from the start of the run.
                        let since = planned.fault_at.get(&i).copied().unwrap_or(t0);
                        let secs = (poll_at - since) as f64 / 1000.0;
                        let count = match guest {
                            Guest::NicDown => {
                                out.nic_down_by_path.entry(kind_of(i)).or_default().detected += 1;
                                &mut out.nic_down
                            }
                            Guest::OneNicDown => &mut out.one_nic_down,
                            _ => &mut out.quiet,
                        };
                        count.seconds.push(secs);
                        *count.by_reason.entry(r.reason.clone()).or_default() += 1;
                    } else {
                        out.false_false += 1;
                        *out.false_false_by
                            .entry(format!(
                                "{} {} {}",
                                guest.healthy_label(),
                                kind_of(i),
                                r.reason
                            ))
                            .or_default() += 1;
                        if out.false_false_examples.len() < MAX_EXAMPLES {
                            out.false_false_examples.push(format!(
                                "min {:.1} {} {} host {} {}: {}",
                                (poll_at - t0) as f64 / MIN as f64,
                                guest.healthy_label(),
                                kind_of(i),
                                fleet.vms[i].2,
                                r.reason,
                                r.message
                            ));
                        }
                        if r.reason == reason::NIC_DETACHED || r.reason == reason::NIC_NO_ADDRESS {
                            out.false_false_nic += 1;
                        }
                        if r.reason == reason::GUEST_NETWORK_SILENT
                            && matches!(guest, Guest::WaitSyn | Guest::WaitArp)
                        {
                            out.waiting_silent += 1;
                        }
                    }
                }
                Status::Unknown if r.reason == reason::REMEDIATION_HELD => {
                    held_any.insert(i);
                    if faulty {
                        judged.entry(guest).or_default().insert(i);
                        let since = *fault_held_since.entry(i).or_insert(poll_at);
                        if poll_at - since >= mhc_ms {
                            // The faulty VM never joins: MHC's nodeStartupTimeout recycles it.
                            out.recycled_by_mhc_timer += 1;
                            recycle.push(i);
                        }
                    } else {
                        held_healthy.insert(i);
                    }
                }
                _ => {}
            }
        }
        for i in recycle {
            recycled.insert(i);
            let (id, scope, _) = &fleet.vms[i];
            checkers[*scope].forget(id);
        }
    }
    out.inferred_interval_secs = checkers
        .iter()
        .filter_map(|c| c.stats_summary().inferred_interval_seconds)
        .max();
    out.usage_history_calls = fleet
        .calls_by_command()
        .get("listVirtualMachinesUsageHistory")
        .copied()
        .unwrap_or(0);
    fleet.stop().await;
    out.held = held_any.len();
    let judged_n = |g: Guest| judged.get(&g).map_or(0, BTreeSet::len);
    out.nic_down.judged = judged_n(Guest::NicDown);
    out.quiet.judged = judged_n(Guest::Quiet);
    out.one_nic_down.judged = judged_n(Guest::OneNicDown);
    for i in &held_healthy {
        *out.held_healthy_by
            .entry(format!(
                "{} {}",
                planned.guests[*i].healthy_label(),
                kind_of(*i)
            ))
            .or_default() += 1;
    }
    for i in &rows_seen {
        *out.rows_path_vms.entry(kind_of(*i)).or_default() += 1;
    }
    for i in counter_seen.difference(&rows_seen) {
        *out.counter_path_vms.entry(kind_of(*i)).or_default() += 1;
    }
    out.healthy_other_reasons = other.into_iter().map(|(r, v)| (r, v.len())).collect();
    for c in [&mut out.nic_down, &mut out.quiet, &mut out.one_nic_down] {
        c.seconds.sort_by(f64::total_cmp);
    }
    out.wall_seconds = started.elapsed().as_secs_f64();
    Ok(out)
}

/// Runs `cells`, [`CONCURRENT_CELLS`] at a time, in their order.
pub async fn run(cells: Vec<Cell>, seed: u64) -> Vec<CellResult> {
    let mut results: Vec<(usize, CellResult)> = stream::iter(cells.into_iter().enumerate())
        .map(|(n, cell)| async move {
            let r = run_cell(cell, seed).await;
            match &r {
                Ok(c) => eprintln!(
                    "matrix {}: {} false False, nic-down {}/{} detected, quiet {}/{}, \
                     one-nic-down {}/{}, held {} ({:.1} s)",
                    cell.label(),
                    c.false_false,
                    c.nic_down.detected(),
                    c.nic_down.total,
                    c.quiet.detected(),
                    c.quiet.total,
                    c.one_nic_down.detected(),
                    c.one_nic_down.total,
                    c.held,
                    c.wall_seconds
                ),
                Err(e) => eprintln!("matrix {} skipped: {e}", cell.label()),
            }
            (n, r)
        })
        .buffer_unordered(CONCURRENT_CELLS)
        .filter_map(|(n, r)| std::future::ready(r.ok().map(|r| (n, r))))
        .collect()
        .await;
    results.sort_by_key(|r| r.0);
    results.into_iter().map(|r| r.1).collect()
}
