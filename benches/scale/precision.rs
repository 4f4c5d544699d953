//! Part 3: precision on a mixed fleet. 1 000 VMs in 10 scopes (5 projects, 5 accounts: both
//! traffic paths) on 50 KVM hosts, every 10th VM on an L2 network (no address by design), with
//! heavy-tailed but healthy boots (Pareto-distributed `Starting` times up to 12 min, and for
//! 30 % of them a Pareto-distributed slow-boot phase of trickling but rising traffic up to
//! 20 min), two stats gaps (the collector misses a connected host for 8 and 3 min), one host
//! offline for 6 min and back, a host put into maintenance (every VM on it live-migrated away,
//! 1–4 min each, `Migrating` with no stats meanwhile), 40 more single live migrations, a 3 min
//! API outage, and 120 real faults (20 each of nic-down, error, stop, vanish, detach-nic,
//! no-address) at random times on VMs of the other hosts.
//! Counts: healthy VMs ever published `False` (false `False`, by reason: none may be
//! `NICDetached`/`NICNoAddress`) and faulted VMs never published `False` (missed faults). The
//! offline host is no fault: its VMs must stay `Unknown HostUnreachable`, never `False`.
//! Simulated time, seeded RNG.
//!
//! Recycling is modelled, or faults would pile up in a way no cluster shows: a Machine whose
//! VM is published `False` is recycled at once (the shim stops judging it, as the controller
//! does when a Machine goes away), and one whose `False` the mass-failure guard holds is
//! recycled by the MHC timer ([`MHC_NODE_STARTUP_TIMEOUT_SECS`] after the hold began) and
//! counts as missed by the shim.

use std::collections::{BTreeMap, BTreeSet};

use capc_health_shim::verdict::{reason, Graces, Status};
use cloudstack_sim::{ApiFaults, Fault, GuestKind, HostControl, VmState};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::fleet::{poll_all, Fleet, FleetPlan, ScopeKind, VmPlan};
use crate::probe::{Cost, Pacer};
use crate::verdict_time::{FAULT_KINDS as FAULT_KINDS_ALL, MHC_NODE_STARTUP_TIMEOUT_SECS};

pub const VMS: usize = 1_000;
pub const SCOPES: usize = 10;
pub const HOSTS: usize = 50;
const SLOW_BOOT_PERCENT: u32 = 30;
/// The per-VM fault kinds: all of verdict_time's but the last, host-offline, which this fleet
/// plays as its own event.
const FAULT_KINDS: &[Fault] = FAULT_KINDS_ALL.split_at(FAULT_KINDS_ALL.len() - 1).0;
const FAULTS_PER_KIND: usize = 20;
const MIN: i64 = 60_000;
/// Hosts with benign incidents; no real fault is injected on their VMs.
const OFFLINE_HOST: usize = 0;
const GAP_HOSTS: [usize; 2] = [1, 2];
/// The host whose VMs are all live-migrated away (maintenance), and more single migrations.
const MAINTENANCE_HOST: usize = 3;
const SINGLE_MIGRATIONS: usize = 40;
const RUN_MS: i64 = 100 * MIN;

#[derive(Debug, Clone, Default)]
pub struct PrecisionResult {
    pub vms: usize,
    pub slow_boots: usize,
    pub max_boot_seconds: f64,
    pub max_slow_boot_seconds: f64,
    pub real_faults: usize,
    pub false_false: usize,
    pub missed: usize,
    pub held: usize,
    /// Live migrations that took place (the VM was Running when asked).
    pub migrations: usize,
    /// Held VMs that the MHC timer recycled before the shim published `False`.
    pub recycled_by_mhc_timer: usize,
    /// Healthy VMs that were published with each reason other than `VMHealthy` at some poll
    /// (shows that the benign incidents reached the shim).
    pub healthy_vms_by_other_reason: BTreeMap<String, usize>,
    /// Healthy VMs published `False`, by reason.
    pub false_false_by_reason: BTreeMap<String, usize>,
    /// VMs on the L2 network (CloudStack assigns them no address).
    pub l2_vms: usize,
    /// Seconds from injection to `False` of the detected faults, sorted.
    pub seconds_to_false: Vec<f64>,
    pub cycles: usize,
    /// Waiting-for-endpoint guests (part 3d's variant only; 0 in section 3).
    pub waiting_vms: usize,
    /// Of the false `False`, waiting-for-endpoint guests.
    pub waiting_false_false: usize,
    /// Whether the checkers probed guests (part 3d).
    pub probe: bool,
    /// API calls of the run and the probers' counts.
    pub cost: Cost,
    /// Seconds to `False` by fault kind, sorted.
    pub seconds_by_fault: BTreeMap<&'static str, Vec<f64>>,
}

/// What part 3d changes in this fleet; the default is section 3 as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// Each scope's checker gets a guest probe (root-admin key), paced as the controller does.
    pub probe: bool,
    /// Every 20th VM (5 %) is a guest waiting for its control-plane endpoint (alive, little
    /// traffic, `GuestKind::Waiting`) instead of a healthy one; none of them slow-boots.
    pub waiting: bool,
}

/// The waiting-for-endpoint guests of [`Variant::waiting`] (never an L2 one).
fn is_waiting(v: Variant, i: usize) -> bool {
    v.waiting && i % 20 == 13
}

#[derive(Debug, Clone)]
enum Event {
    Fault(String, Fault),
    EndSlowBoot(String),
    HostControl(usize, HostControl),
    StatsPaused(usize, bool),
    ApiOutage(bool),
    /// VM id, target host, seconds.
    Migrate(String, usize, f64),
}

/// Every 10th VM is on the L2 network.
fn is_l2(i: usize) -> bool {
    i % 10 == 7
}

/// A Pareto(`scale`, `shape`) sample capped at `cap`.
pub fn pareto(rng: &mut StdRng, scale: f64, shape: f64, cap: f64) -> f64 {
    let u: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
    (scale / u.powf(1.0 / shape)).min(cap)
}

fn plan(boots: &[f64], variant: Variant) -> FleetPlan {
    FleetPlan {
        scopes: SCOPES,
        hosts: HOSTS,
        vms: boots
            .iter()
            .enumerate()
            // A host's VMs are spread over every scope, as placement does not follow projects.
            .map(|(i, b)| {
                let mut v = VmPlan::new(i % SCOPES, (i / SCOPES) % HOSTS, VmState::Starting, *b);
                v.l2 = is_l2(i);
                if is_waiting(variant, i) {
                    v.guest = GuestKind::Waiting;
                }
                v
            })
            .collect(),
        scope_kinds: ScopeKind::alternating(SCOPES),
        // A fixed simulated start, as in section 3's time to False: the wall clock's phase
        // against the stats collections made the counts differ per run.
        start_ms: Some(crate::verdict_time::START_MS),
        ..FleetPlan::default()
    }
}

/// Applies one event; `Ok(false)` for a migration of a VM that was not Running then (a VM
/// still booting cannot be migrated, as in CloudStack).
fn apply(fleet: &Fleet, e: &Event) -> Result<bool, String> {
    let err = |e: cloudstack_sim::WorldError| format!("{e:?}");
    match e {
        Event::Fault(id, f) => fleet.sim.inject_fault(id, *f).map_err(err)?,
        Event::EndSlowBoot(id) => fleet.sim.clear_faults(id).map_err(err)?,
        Event::HostControl(h, c) => fleet.sim.with_world(|w| w.hosts[*h].control = *c),
        Event::StatsPaused(h, p) => fleet
            .sim
            .with_world(|w| w.hosts[*h].stats_collection_paused = *p),
        Event::ApiOutage(on) => fleet.sim.set_api_faults(ApiFaults {
            outage: *on,
            ..Default::default()
        }),
        Event::Migrate(id, host, seconds) => {
            return match fleet.sim.migrate(id, *host, *seconds) {
                Ok(()) => Ok(true),
                Err(cloudstack_sim::WorldError::Conflict(_)) => Ok(false),
                Err(e) => Err(err(e)),
            }
        }
    }
    Ok(true)
}

pub async fn measure(seed: u64, graces: &Graces) -> Result<PrecisionResult, String> {
    measure_with(seed, graces, Variant::default()).await
}

pub async fn measure_with(
    seed: u64,
    graces: &Graces,
    variant: Variant,
) -> Result<PrecisionResult, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let boots: Vec<f64> = (0..VMS)
        .map(|_| pareto(&mut rng, 20.0, 1.5, 720.0))
        .collect();
    let fleet = Fleet::start(&plan(&boots, variant)).await?;
    let t0 = fleet.sim.now_ms();
    let mut events: Vec<(i64, Event)> = Vec::new();
    let mut out = PrecisionResult {
        vms: VMS,
        l2_vms: (0..VMS).filter(|i| is_l2(*i)).count(),
        max_boot_seconds: boots.iter().copied().fold(0.0, f64::max),
        waiting_vms: (0..VMS).filter(|i| is_waiting(variant, *i)).count(),
        probe: variant.probe,
        ..Default::default()
    };
    let waiting: BTreeSet<String> = fleet
        .vms
        .iter()
        .enumerate()
        .filter(|(i, _)| is_waiting(variant, *i))
        .map(|(_, (id, _, _))| id.clone())
        .collect();
    for (i, (id, _, _)) in fleet.vms.iter().enumerate() {
        if rng.random_range(0..100) < SLOW_BOOT_PERCENT {
            let slow = pareto(&mut rng, 120.0, 1.2, 1200.0);
            if waiting.contains(id) {
                continue;
            }
            fleet
                .sim
                .inject_fault(id, Fault::SlowBoot)
                .map_err(|e| format!("{e:?}"))?;
            out.max_slow_boot_seconds = out.max_slow_boot_seconds.max(slow);
            out.slow_boots += 1;
            let end = t0 + ((boots[i] + slow) * 1000.0) as i64;
            events.push((end, Event::EndSlowBoot(id.clone())));
        }
    }
    events.push((
        t0 + 40 * MIN,
        Event::HostControl(OFFLINE_HOST, HostControl::Offline),
    ));
    events.push((
        t0 + 46 * MIN,
        Event::HostControl(OFFLINE_HOST, HostControl::Enabled),
    ));
    events.push((t0 + 50 * MIN, Event::StatsPaused(GAP_HOSTS[0], true)));
    events.push((t0 + 58 * MIN, Event::StatsPaused(GAP_HOSTS[0], false)));
    events.push((t0 + 60 * MIN, Event::StatsPaused(GAP_HOSTS[1], true)));
    events.push((t0 + 63 * MIN, Event::StatsPaused(GAP_HOSTS[1], false)));
    events.push((t0 + 70 * MIN, Event::ApiOutage(true)));
    events.push((t0 + 73 * MIN, Event::ApiOutage(false)));
    // Hosts without incidents: where migrations go, and where real faults are injected.
    let quiet_host =
        |h: usize| h != OFFLINE_HOST && !GAP_HOSTS.contains(&h) && h != MAINTENANCE_HOST;
    let quiet_hosts: Vec<usize> = (0..HOSTS).filter(|h| quiet_host(*h)).collect();
    for (k, (id, _, _)) in fleet
        .vms
        .iter()
        .filter(|(_, _, h)| *h == MAINTENANCE_HOST)
        .enumerate()
    {
        let at = t0 + 25 * MIN + (k as i64 % 5) * MIN + rng.random_range(0..MIN);
        let to = quiet_hosts[rng.random_range(0..quiet_hosts.len())];
        events.push((
            at,
            Event::Migrate(id.clone(), to, rng.random_range(60.0..240.0)),
        ));
    }
    // No fault on L2 VMs: an address that CloudStack never assigns cannot go missing.
    let mut candidates: Vec<&String> = fleet
        .vms
        .iter()
        .enumerate()
        .filter(|(i, (_, _, host))| quiet_host(*host) && !is_l2(*i))
        .map(|(_, (id, _, _))| id)
        .collect();
    candidates.shuffle(&mut rng);
    let mut faulted: BTreeMap<String, i64> = BTreeMap::new();
    let mut fault_of: BTreeMap<String, &'static str> = BTreeMap::new();
    for (k, id) in candidates
        .into_iter()
        .take(FAULT_KINDS.len() * FAULTS_PER_KIND)
        .enumerate()
    {
        let at = t0 + 35 * MIN + rng.random_range(0..50 * MIN);
        events.push((
            at,
            Event::Fault(id.clone(), FAULT_KINDS[k % FAULT_KINDS.len()]),
        ));
        faulted.insert(id.clone(), at);
        fault_of.insert(id.clone(), FAULT_KINDS[k % FAULT_KINDS.len()].as_str());
    }
    out.real_faults = faulted.len();
    // Single migrations of healthy VMs (the faulted ones are not candidates: their fault
    // must stay what is measured), at random times while faults are injected.
    let mut healthy: Vec<&String> = fleet
        .vms
        .iter()
        .filter(|(id, _, h)| quiet_host(*h) && !faulted.contains_key(id))
        .map(|(id, _, _)| id)
        .collect();
    healthy.shuffle(&mut rng);
    for id in healthy.iter().take(SINGLE_MIGRATIONS) {
        let at = t0 + 30 * MIN + rng.random_range(0..60 * MIN);
        let to = quiet_hosts[rng.random_range(0..quiet_hosts.len())];
        events.push((
            at,
            Event::Migrate((*id).clone(), to, rng.random_range(60.0..240.0)),
        ));
    }
    events.sort_by_key(|e| e.0);

    let mut checkers = if variant.probe {
        fleet.probed_checkers_with(graces)?
    } else {
        fleet.checkers_with(graces)
    };
    let pacer = Pacer::new(graces, variant.probe);
    let mut last_cycle = fleet.sim.now_ms();
    let mut early_cycles = 0;
    let mut pending = events.iter().peekable();
    let mut detected: BTreeMap<String, f64> = BTreeMap::new();
    let mut false_false: BTreeSet<String> = BTreeSet::new();
    let mut held_since: BTreeMap<String, i64> = BTreeMap::new();
    let mut recycled_by_timer = 0;
    let scope_of: BTreeMap<&str, usize> = fleet
        .vms
        .iter()
        .map(|(id, scope, _)| (id.as_str(), *scope))
        .collect();
    let mhc_timer_ms = (MHC_NODE_STARTUP_TIMEOUT_SECS * 1000.0) as i64;
    let mut other_reasons: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    while fleet.sim.now_ms() < t0 + RUN_MS {
        let poll_at = {
            let fleet = &fleet;
            let pending = &mut pending;
            let migrations = &mut out.migrations;
            // Events due by `upto`, each at its time.
            let mut apply_until = |upto: i64| -> Result<(), String> {
                while let Some((at, e)) = pending.next_if(|(at, _)| *at <= upto) {
                    let now = fleet.sim.now_ms();
                    if *at > now {
                        fleet.sim.advance((*at - now) as f64 / 1000.0);
                    }
                    if apply(fleet, e)? && matches!(e, Event::Migrate(..)) {
                        *migrations += 1;
                    }
                }
                Ok(())
            };
            pacer
                .next_cycle(fleet, &mut checkers, last_cycle, &mut apply_until)
                .await?
        };
        if poll_at < last_cycle + crate::fleet::SHIM_INTERVAL_SECS * 1000 {
            early_cycles += 1;
        }
        last_cycle = poll_at;
        out.cycles += 1;
        let mut recycle = Vec::new();
        for r in poll_all(&mut checkers, fleet.now()).await {
            let injected = faulted.get(&r.vm_id).filter(|at| **at <= poll_at);
            if injected.is_none() && r.reason != reason::VM_HEALTHY {
                other_reasons
                    .entry(format!("{} {}", r.verdict, r.reason))
                    .or_default()
                    .insert(r.vm_id.clone());
            }
            match (injected, r.verdict) {
                (Some(at), Status::False) => {
                    detected.insert(r.vm_id.clone(), (poll_at - at) as f64 / 1000.0);
                    recycle.push(r.vm_id.clone());
                }
                (None, Status::False) if false_false.insert(r.vm_id.clone()) => {
                    *out.false_false_by_reason
                        .entry(r.reason.clone())
                        .or_default() += 1;
                }
                (_, Status::Unknown) if r.reason == reason::REMEDIATION_HELD => {
                    let since = *held_since.entry(r.vm_id.clone()).or_insert(poll_at);
                    if poll_at - since >= mhc_timer_ms {
                        recycled_by_timer += 1;
                        recycle.push(r.vm_id.clone());
                    }
                }
                _ => {}
            }
        }
        for id in recycle {
            checkers[scope_of[id.as_str()]].forget(&id);
        }
    }
    out.cost = Cost::measure(&fleet, &checkers, t0, VMS);
    out.cost.cycles = out.cycles;
    out.cost.early_cycles = early_cycles;
    fleet.stop().await;
    out.waiting_false_false = false_false
        .iter()
        .filter(|id| waiting.contains(*id))
        .count();
    out.false_false = false_false.len();
    out.missed = out.real_faults - detected.len();
    out.held = held_since.len();
    out.recycled_by_mhc_timer = recycled_by_timer;
    out.healthy_vms_by_other_reason = other_reasons
        .into_iter()
        .map(|(r, ids)| (r, ids.len()))
        .collect();
    for (id, secs) in &detected {
        out.seconds_by_fault
            .entry(fault_of[id])
            .or_default()
            .push(*secs);
    }
    for v in out.seconds_by_fault.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    out.seconds_to_false = detected.into_values().collect();
    out.seconds_to_false.sort_by(f64::total_cmp);
    Ok(out)
}
