//! Part 1: CloudStack API load of the shim's batch polling at 100–10 000 VMs, counted by the
//! simulator (every HTTP request it answered, by command), next to a per-Machine poller: CAPC's
//! retired state checker at its 5 s interval. That checker is not registered in CAPC v0.6.1, so
//! it is not what users run; `users_load.rs` compares with what they run (CAPC's own calls,
//! counted per key by the e2e), and section 1b (benches/controller) extrapolates them to fleet
//! sizes with the controller's own calls per cycle.

use capc_health_shim::cloudstack::model::VirtualMachine;
use futures::stream::{self, StreamExt};

use crate::fleet::{poll_all, ratio, Fleet, FleetPlan, SHIM_INTERVAL_SECS};

/// CAPC's retired state checker: one `listVirtualMachinesMetrics id=…` per Machine every 5 s
/// (switched off and not registered in CAPC v0.6.1; a second comparison, not the load users have).
pub const PER_MACHINE_INTERVAL_SECS: i64 = 5;
/// CloudStack's default (and the shim's) page size.
pub const PAGE_SIZE: usize = 500;

/// Concurrent requests of the retired checker (it only shortens the wall time).
const RETIRED_CHECKER_CONCURRENCY: usize = 8;
const WARMUP_CYCLES: usize = 6;
const MEASURED_CYCLES: u64 = 10;

#[derive(Debug, Clone)]
pub struct LoadRow {
    pub vms: usize,
    pub scopes: usize,
    pub shim_calls_per_cycle: f64,
    pub shim_calls_per_machine_hour: f64,
    /// One page per 500 VMs per scope per interval.
    pub floor_calls_per_cycle: f64,
    pub floor_calls_per_machine_hour: f64,
    pub retired_checker_calls_per_cycle: f64,
    pub retired_checker_calls_per_machine_hour: f64,
    /// Retired-checker calls that failed (should be 0; a failed call is still a call).
    pub retired_checker_errors: u64,
    /// Shim verdicts that were not `True` at the end (a healthy fleet: should be 0).
    pub shim_not_true: usize,
    pub shim_commands: String,
}

impl LoadRow {
    pub fn ratio(&self) -> f64 {
        ratio(
            self.retired_checker_calls_per_machine_hour,
            self.shim_calls_per_machine_hour,
        )
    }
}

/// Calls per machine-hour of a poller making `per_cycle` calls every `interval_secs` for `vms`.
pub fn per_machine_hour(per_cycle: f64, interval_secs: i64, vms: usize) -> f64 {
    ratio(per_cycle * 3600.0 / interval_secs as f64, vms as f64)
}

/// One page per 500 VMs (rounded up) per scope.
pub fn floor_pages_per_cycle(vms: usize, scopes: usize) -> usize {
    let per_scope = vms.div_ceil(scopes.max(1));
    scopes * per_scope.div_ceil(PAGE_SIZE).max(1)
}

async fn shim_cycles(fleet: &Fleet) -> (f64, usize, String) {
    let mut checkers = fleet.checkers();
    for _ in 0..WARMUP_CYCLES {
        fleet.sim.advance(SHIM_INTERVAL_SECS as f64);
        poll_all(&mut checkers, fleet.now()).await;
    }
    let before = fleet.calls_by_command();
    let mut last = Vec::new();
    for _ in 0..MEASURED_CYCLES {
        fleet.sim.advance(SHIM_INTERVAL_SECS as f64);
        last = poll_all(&mut checkers, fleet.now()).await;
    }
    let after = fleet.calls_by_command();
    let mut total = 0u64;
    let mut commands = Vec::new();
    for (command, n) in &after {
        let d = n - before.get(command).copied().unwrap_or(0);
        if d > 0 {
            total += d;
            commands.push(format!(
                "{command} {:.1}",
                d as f64 / MEASURED_CYCLES as f64
            ));
        }
    }
    let not_true = last
        .iter()
        .filter(|r| r.verdict != capc_health_shim::verdict::Status::True)
        .count();
    (
        total as f64 / MEASURED_CYCLES as f64,
        not_true,
        commands.join(", "),
    )
}

/// One 5 s round of the retired checker: returns (calls, failed calls).
async fn retired_checker_round(fleet: &Fleet) -> (u64, u64) {
    let client = fleet.client();
    let before = fleet.calls_total();
    let targets: Vec<(String, String)> = fleet
        .vms
        .iter()
        .map(|(id, scope, _)| (id.clone(), fleet.scopes[*scope].project_id.clone()))
        .collect();
    let errors = stream::iter(targets.iter())
        .map(|(id, project)| {
            let client = &client;
            async move {
                client
                    .list::<VirtualMachine>(
                        "listVirtualMachinesMetrics",
                        "virtualmachine",
                        &[("id", id), ("projectid", project)],
                    )
                    .await
                    .map(|l| l.items.len() == 1)
                    .unwrap_or(false)
            }
        })
        .buffer_unordered(RETIRED_CHECKER_CONCURRENCY)
        .filter(|found| std::future::ready(!found))
        .count()
        .await;
    (fleet.calls_total() - before, errors as u64)
}

pub async fn measure(vms: usize, scopes: usize) -> Result<LoadRow, String> {
    let hosts = 20.min(vms);
    let fleet = Fleet::start(&FleetPlan::running(vms, scopes, hosts)).await?;
    let (shim_per_cycle, not_true, commands) = shim_cycles(&fleet).await;
    // Few rounds at 10 000 VMs: each round is 10 000 HTTP requests.
    let rounds: u64 = if vms >= 10_000 { 1 } else { 3 };
    let mut calls = 0;
    let mut errors = 0;
    for _ in 0..rounds {
        fleet.sim.advance(PER_MACHINE_INTERVAL_SECS as f64);
        let (c, e) = retired_checker_round(&fleet).await;
        calls += c;
        errors += e;
    }
    fleet.stop().await;
    let retired_checker_per_cycle = calls as f64 / rounds as f64;
    let floor = floor_pages_per_cycle(vms, scopes) as f64;
    Ok(LoadRow {
        vms,
        scopes,
        shim_calls_per_cycle: shim_per_cycle,
        shim_calls_per_machine_hour: per_machine_hour(shim_per_cycle, SHIM_INTERVAL_SECS, vms),
        floor_calls_per_cycle: floor,
        floor_calls_per_machine_hour: per_machine_hour(floor, SHIM_INTERVAL_SECS, vms),
        retired_checker_calls_per_cycle: retired_checker_per_cycle,
        retired_checker_calls_per_machine_hour: per_machine_hour(
            retired_checker_per_cycle,
            PER_MACHINE_INTERVAL_SECS,
            vms,
        ),
        retired_checker_errors: errors,
        shim_not_true: not_true,
        shim_commands: commands,
    })
}

/// Part 1b: what asking statistics only for Machines without a Node saves CloudStack.
/// Share of the fleet without a Node.
pub const NO_NODE_PERCENT: usize = 10;
/// Simulated time the fleet has run before measuring, so rows are retained (CloudStack's
/// default retention, 720 min, keeps all of them).
pub const ROWS_HISTORY_SECS: i64 = 2 * 3600;
pub const ROWS_SCOPES: usize = 10;
const ROWS_WARMUP_CYCLES: usize = 4;
const ROWS_MEASURED_CYCLES: u64 = 5;

/// The cost of one way of asking, per poll cycle of every scope.
#[derive(Debug, Clone, Default)]
pub struct StatsCost {
    /// `vm_stats` rows the server read (listing sums and usage-history samples).
    pub rows_per_cycle: f64,
    pub calls_per_cycle: f64,
    pub commands: String,
}

#[derive(Debug, Clone)]
pub struct RowsRow {
    pub vms: usize,
    pub no_node: usize,
    pub retention_minutes: u64,
    /// Retained rows per VM when measuring.
    pub rows_per_vm: usize,
    /// (a) stats for every VM (`check`'s default).
    pub all: StatsCost,
    /// (b) stats only for the Machines without a Node (`Checker::want_stats_for`, as `run`).
    pub no_node_only: StatsCost,
}

impl RowsRow {
    pub fn ratio(&self) -> f64 {
        ratio(self.all.rows_per_cycle, self.no_node_only.rows_per_cycle)
    }
}

async fn stats_cost(fleet: &Fleet, checkers: &mut [capc_health_shim::check::Checker]) -> StatsCost {
    for _ in 0..ROWS_WARMUP_CYCLES {
        fleet.sim.advance(SHIM_INTERVAL_SECS as f64);
        poll_all(checkers, fleet.now()).await;
    }
    let rows0 = fleet.stats_rows_read();
    let before = fleet.calls_by_command();
    for _ in 0..ROWS_MEASURED_CYCLES {
        fleet.sim.advance(SHIM_INTERVAL_SECS as f64);
        poll_all(checkers, fleet.now()).await;
    }
    let after = fleet.calls_by_command();
    let n = ROWS_MEASURED_CYCLES as f64;
    let mut calls = 0;
    let mut commands = Vec::new();
    for (command, c) in &after {
        let d = c - before.get(command).copied().unwrap_or(0);
        if d > 0 {
            calls += d;
            commands.push(format!("{command} {:.1}", d as f64 / n));
        }
    }
    StatsCost {
        rows_per_cycle: (fleet.stats_rows_read() - rows0) as f64 / n,
        calls_per_cycle: calls as f64 / n,
        commands: commands.join(", "),
    }
}

pub async fn stats_rows(vms: usize) -> Result<RowsRow, String> {
    let plan = FleetPlan::running(vms, ROWS_SCOPES, 20.min(vms));
    let retention_minutes = plan.settings.stats_retention_seconds / 60;
    let fleet = Fleet::start(&plan).await?;
    fleet.sim.advance(ROWS_HISTORY_SECS as f64);
    let rows_per_vm = fleet
        .sim
        .with_world(|w| w.vms().first().map_or(0, |v| v.stats_rows().len()));
    let mut every = fleet.checkers();
    let all = stats_cost(&fleet, &mut every).await;
    drop(every);
    // Every 10th VM of each scope has no Node yet.
    let step = 100 / NO_NODE_PERCENT;
    let mut no_node = 0;
    let mut checkers = fleet.checkers();
    for (c, scope) in checkers.iter_mut().zip(&fleet.scopes) {
        let ids: Vec<String> = scope.vm_ids.iter().step_by(step).cloned().collect();
        no_node += ids.len();
        c.want_stats_for(ids);
    }
    let no_node_only = stats_cost(&fleet, &mut checkers).await;
    fleet.stop().await;
    Ok(RowsRow {
        vms,
        no_node,
        retention_minutes,
        rows_per_vm,
        all,
        no_node_only,
    })
}
