//! Part 3d: the opt-in guest probe (docs/guest-probe.md). With a root-admin key each scope's
//! checker asks the network's virtual router to `arping` Running VMs whose traffic looks
//! silent (`runDiagnostics`, an async job); three unanswered attempts a quarter stats interval
//! apart plus flat traffic give `False GuestNetworkSilent` sooner than the counters alone, a
//! reply keeps a VM from `False` by traffic.
//!
//! The controller's pacing is emulated ([`Pacer`], as `controller::probing::wait_probing`):
//! between cycles simulated time moves in steps of `probe_tick(spacing)` (3 s at the
//! defaults) and every checker's probe steps; when a step says the evidence changed, a cycle
//! (poll + verdicts of every scope) runs at that moment and the 30 s interval restarts from
//! there. Without the probe the pacer is the plain 30 s loop of sections 2 and 3.
//!
//! Measured: time from NIC-down to `False` on KVM, VMware and XenServer with and without the
//! probe (section 2's fleet and fault schedule, both twins from the same simulated start), the
//! precision fleet of section 3 with and without the probe (plus waiting-for-endpoint guests),
//! and what the probe costs CloudStack (calls per hour per 1 000 Machines without a Node).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use capc_health_shim::check::Checker;
use capc_health_shim::probe::probe_tick;
use capc_health_shim::verdict::probe::ProbeGraces;
use capc_health_shim::verdict::{reason, Graces, Status};
use cloudstack_sim::{Fault, Hypervisor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::fleet::{poll_all, ratio, Fleet, SHIM_INTERVAL_SECS};
use crate::precision::{self, PrecisionResult};
use crate::verdict_time::{self, advance_to, percentile};

/// The commands the probe makes.
pub const PROBE_COMMANDS: [&str; 3] = ["runDiagnostics", "queryAsyncJobResult", "listRouters"];

/// The time goal of the probe: p99 from NIC-down to `False`.
pub const GOAL_P99_SECONDS: f64 = 120.0;

/// When the next cycle runs, as the controller decides it.
pub struct Pacer {
    interval_ms: i64,
    /// Probe step period; `None` without the probe (then cycles are `interval_ms` apart).
    tick_ms: Option<i64>,
}

impl Pacer {
    /// `probing`: the checkers have probers (their pacing derives from `graces.stats_interval`).
    pub fn new(graces: &Graces, probing: bool) -> Self {
        let tick_ms = probing.then(|| {
            let pg = ProbeGraces::from_stats_interval(graces.stats_interval);
            probe_tick(pg.spacing).as_millis() as i64
        });
        Self {
            interval_ms: SHIM_INTERVAL_SECS * 1000,
            tick_ms,
        }
    }

    /// Moves simulated time from the last cycle (`last_cycle_ms`, the simulator's now) to the
    /// next one and returns its time: `interval` later, or earlier when a probe step changed
    /// the evidence. `apply_until(t)` applies the events due by `t` (moving time to each)
    /// before time reaches `t`.
    pub async fn next_cycle(
        &self,
        fleet: &Fleet,
        checkers: &mut [Checker],
        last_cycle_ms: i64,
        apply_until: &mut dyn FnMut(i64) -> Result<(), String>,
    ) -> Result<i64, String> {
        let deadline = last_cycle_ms + self.interval_ms;
        let Some(tick) = self.tick_ms else {
            apply_until(deadline)?;
            advance_to(fleet, deadline);
            return Ok(deadline);
        };
        let mut t = fleet.sim.now_ms();
        while t < deadline {
            t = (t + tick).min(deadline);
            apply_until(t)?;
            advance_to(fleet, t);
            let now = fleet.now();
            let steps =
                futures::future::join_all(checkers.iter_mut().map(|c| c.probe_step(now))).await;
            if steps.iter().any(|s| s.evidence_changed) {
                return Ok(t);
            }
        }
        Ok(deadline.max(t))
    }
}

/// What the probe cost CloudStack over a run.
#[derive(Debug, Clone, Default)]
pub struct Cost {
    /// Calls per command the simulator answered (all of the run).
    pub calls: BTreeMap<String, u64>,
    pub sim_seconds: f64,
    /// Machines without a Node (every tracked VM: `check` sees no Nodes).
    pub machines: usize,
    /// The probers' own counts, summed over the scopes.
    pub jobs_started: u64,
    pub replies: u64,
    pub no_replies: u64,
    pub no_evidence: u64,
    pub router_lookups: u64,
    pub skipped_for_budget: u64,
    pub skipped_in_flight_cap: u64,
    /// Cycles run, and of them early (a probe answer changed the evidence).
    pub cycles: usize,
    pub early_cycles: usize,
}

impl Cost {
    pub fn measure(fleet: &Fleet, checkers: &[Checker], started_ms: i64, machines: usize) -> Self {
        let mut c = Cost {
            calls: fleet.calls_by_command(),
            sim_seconds: (fleet.sim.now_ms() - started_ms) as f64 / 1000.0,
            machines,
            ..Cost::default()
        };
        for r in checkers.iter().filter_map(Checker::probe_report) {
            c.jobs_started += r.counts.jobs_started;
            c.replies += r.counts.replies;
            c.no_replies += r.counts.no_replies;
            c.no_evidence += r.counts.no_evidence;
            c.router_lookups += r.counts.router_lookups;
            c.skipped_for_budget += r.counts.skipped_for_budget;
            c.skipped_in_flight_cap += r.counts.skipped_in_flight_cap;
        }
        c
    }

    /// Every API call of the run per hour per 1 000 Machines without a Node.
    pub fn all_per_hour_per_1000(&self) -> f64 {
        let n: u64 = self.calls.values().sum();
        ratio(
            n as f64,
            (self.sim_seconds / 3600.0) * (self.machines as f64 / 1000.0),
        )
    }

    /// Calls of `command` per hour per 1 000 Machines without a Node.
    pub fn per_hour_per_1000(&self, command: &str) -> f64 {
        let n = self.calls.get(command).copied().unwrap_or(0) as f64;
        ratio(
            n,
            (self.sim_seconds / 3600.0) * (self.machines as f64 / 1000.0),
        )
    }
}

/// One run of section 2's nic-down fleet on one hypervisor.
#[derive(Debug, Clone)]
pub struct TimeResult {
    pub hypervisor: Hypervisor,
    pub probe: bool,
    pub network_per_scope: bool,
    pub injected: usize,
    /// Seconds from injection to `False`, sorted.
    pub seconds: Vec<f64>,
    /// Detections whose verdict cites unanswered ARP (the probe decided).
    pub by_probe: usize,
    pub false_false: usize,
    pub false_false_by_reason: BTreeMap<String, usize>,
    pub held: usize,
    /// The slowest detections (> the goal): seconds, scope kind, reason and message.
    pub slow: Vec<(f64, String)>,
    pub cost: Cost,
    pub wall_seconds: f64,
}

impl TimeResult {
    pub fn missed(&self) -> usize {
        self.injected - self.seconds.len()
    }

    pub fn label(&self) -> String {
        format!(
            "{}_{}",
            self.hypervisor.as_str().to_ascii_lowercase(),
            if self.probe {
                "with_probe"
            } else {
                "without_probe"
            }
        )
    }
}

/// Section 2's nic-down measurement (same fleet shape, seed and schedule) on `hv`, with or
/// without the probe, from the simulated start `start_ms` (the twins share it, so the stats
/// collector's phase is the same).
pub async fn time_to_false(
    hv: Hypervisor,
    seed: u64,
    graces: &Graces,
    probe: bool,
    network_per_scope: bool,
    start_ms: i64,
) -> Result<TimeResult, String> {
    let wall = Instant::now();
    let mut plan = verdict_time::plan();
    plan.hypervisor = hv;
    plan.start_ms = Some(start_ms);
    plan.network_per_scope = network_per_scope;
    let fleet = Fleet::start(&plan).await?;
    let started_ms = fleet.sim.now_ms();
    let mut checkers = if probe {
        fleet.probed_checkers_with(graces)?
    } else {
        fleet.checkers_with(graces)
    };
    let pacer = Pacer::new(graces, probe);
    let interval_ms = SHIM_INTERVAL_SECS * 1000;
    let mut last = started_ms;
    let mut cycles = 0;
    let mut early = 0;
    let warm_until = started_ms + verdict_time::WARMUP_CYCLES as i64 * interval_ms;
    while fleet.sim.now_ms() < warm_until {
        last = pacer
            .next_cycle(&fleet, &mut checkers, last, &mut |_| Ok(()))
            .await?;
        poll_all(&mut checkers, fleet.now()).await;
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let injections = verdict_time::schedule(&fleet, fleet.sim.now_ms(), &mut rng);
    let end_ms = injections.last().map_or(0, |i| i.0) + verdict_time::TAIL_MS;
    let mut pending = injections.iter().peekable();
    let mut injected_at: BTreeMap<String, i64> = BTreeMap::new();
    let mut detected: BTreeMap<String, f64> = BTreeMap::new();
    let kind_of: BTreeMap<&str, &'static str> = fleet
        .vms
        .iter()
        .map(|(id, scope, _)| (id.as_str(), fleet.scopes[*scope].kind.as_str()))
        .collect();
    let mut false_false: BTreeMap<String, String> = BTreeMap::new();
    let mut held: BTreeSet<String> = BTreeSet::new();
    let mut by_probe = 0;
    let mut slow = Vec::new();
    while fleet.sim.now_ms() < end_ms && detected.len() < injections.len() {
        let at = {
            let fleet = &fleet;
            let injected_at = &mut injected_at;
            let pending = &mut pending;
            let mut apply = |upto: i64| -> Result<(), String> {
                while let Some((at, id)) = pending.next_if(|(at, _)| *at <= upto) {
                    advance_to(fleet, *at);
                    fleet
                        .sim
                        .inject_fault(id, Fault::NicDown)
                        .map_err(|e| format!("{e:?}"))?;
                    injected_at.insert(id.clone(), *at);
                }
                Ok(())
            };
            pacer
                .next_cycle(fleet, &mut checkers, last, &mut apply)
                .await?
        };
        cycles += 1;
        if at < last + interval_ms {
            early += 1;
        }
        last = at;
        for r in poll_all(&mut checkers, fleet.now()).await {
            match (injected_at.get(&r.vm_id), r.verdict) {
                (Some(inj), Status::False) if !detected.contains_key(&r.vm_id) => {
                    let secs = (at - inj) as f64 / 1000.0;
                    detected.insert(r.vm_id.clone(), secs);
                    if r.message.contains("ARP") {
                        by_probe += 1;
                    }
                    if secs > GOAL_P99_SECONDS {
                        slow.push((
                            secs,
                            format!(
                                "{} scope, {}: {}",
                                kind_of[r.vm_id.as_str()],
                                r.reason,
                                r.message
                            ),
                        ));
                    }
                }
                (None, Status::False) => {
                    false_false
                        .entry(r.vm_id.clone())
                        .or_insert_with(|| r.reason.clone());
                }
                (Some(_), Status::Unknown) if r.reason == reason::REMEDIATION_HELD => {
                    held.insert(r.vm_id.clone());
                }
                _ => {}
            }
        }
    }
    let mut cost = Cost::measure(&fleet, &checkers, started_ms, fleet.vms.len());
    cost.cycles = cycles;
    cost.early_cycles = early;
    fleet.stop().await;
    let mut seconds: Vec<f64> = detected.into_values().collect();
    seconds.sort_by(f64::total_cmp);
    slow.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut false_false_by_reason = BTreeMap::new();
    for r in false_false.values() {
        *false_false_by_reason.entry(r.clone()).or_default() += 1;
    }
    Ok(TimeResult {
        hypervisor: hv,
        probe,
        network_per_scope,
        injected: injections.len(),
        seconds,
        by_probe,
        false_false: false_false.len(),
        false_false_by_reason,
        held: held.len(),
        slow,
        cost,
        wall_seconds: wall.elapsed().as_secs_f64(),
    })
}

/// Everything part 3d measured.
#[derive(Debug, Default)]
pub struct ProbeResults {
    /// Per hypervisor: (without, with) the probe.
    pub times: Vec<(TimeResult, TimeResult)>,
    /// KVM with one Isolated network (one router) per scope, with the probe.
    /// The stress case: every VM of the fleet on one shared network, so one virtual router
    /// (which runs one diagnostics job at a time) for 250 Machines without a Node; with the probe.
    pub shared_router: Vec<TimeResult>,
    /// The precision fleet with waiting-for-endpoint guests: (without, with) the probe.
    pub precision: Option<(PrecisionResult, PrecisionResult)>,
    pub wall_seconds: f64,
}

/// Runs part 3d at `graces` (the defaults).
pub async fn run(seed: u64, graces: &Graces) -> ProbeResults {
    let started = Instant::now();
    let mut out = ProbeResults::default();
    // The twins start at the same simulated moment (rounded to a second).
    // Fixed, so that runs (and builds) compare: the phase of the stats collections against
    // the polls moved these figures between runs when it came from the wall clock.
    let start_ms = crate::verdict_time::START_MS;
    // The goal runs: each scope on a network of its own with its own virtual router, as a
    // cluster's network is when CAPC creates it per cluster.
    for hv in Hypervisor::ALL {
        let pair = async {
            let without = time_to_false(hv, seed, graces, false, true, start_ms).await?;
            let with = time_to_false(hv, seed, graces, true, true, start_ms).await?;
            Ok::<_, String>((without, with))
        }
        .await;
        match pair {
            Ok((without, with)) => {
                for r in [&without, &with] {
                    eprintln!(
                        "guest probe: nic-down on {} {} (a router per scope): {} of {} detected, \
                         p99 {:.0} s, {} false False ({:.1} s)",
                        hv.as_str(),
                        if r.probe { "with probe" } else { "without" },
                        r.seconds.len(),
                        r.injected,
                        percentile(&r.seconds, 0.99),
                        r.false_false,
                        r.wall_seconds
                    );
                }
                out.times.push((without, with));
            }
            Err(e) => eprintln!("guest probe: {} skipped: {e}", hv.as_str()),
        }
    }
    // The stress runs: one router for the whole fleet.
    for hv in Hypervisor::ALL {
        match time_to_false(hv, seed, graces, true, false, start_ms).await {
            Ok(r) => {
                eprintln!(
                    "guest probe: nic-down on {} with probe, one router for all: {} of {} \
                     detected, p99 {:.0} s ({:.1} s)",
                    hv.as_str(),
                    r.seconds.len(),
                    r.injected,
                    percentile(&r.seconds, 0.99),
                    r.wall_seconds
                );
                out.shared_router.push(r);
            }
            Err(e) => eprintln!("guest probe: {} one router skipped: {e}", hv.as_str()),
        }
    }
    let variant = |probe| precision::Variant {
        probe,
        waiting: true,
    };
    let t = Instant::now();
    let pair = async {
        let without = precision::measure_with(seed, graces, variant(false)).await?;
        let with = precision::measure_with(seed, graces, variant(true)).await?;
        Ok::<_, String>((without, with))
    }
    .await;
    match pair {
        Ok((without, with)) => {
            eprintln!(
                "guest probe: precision: {} false False with the probe, {} without; missed {} / {} \
                 ({:.1} s)",
                with.false_false,
                without.false_false,
                with.missed,
                without.missed,
                t.elapsed().as_secs_f64()
            );
            out.precision = Some((without, with));
        }
        Err(e) => eprintln!("guest probe: precision skipped: {e}"),
    }
    out.wall_seconds = started.elapsed().as_secs_f64();
    out
}
