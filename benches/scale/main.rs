//! `make bench`, part two: scale and speed — the CloudStack load the shim adds to CAPC's own
//! (from the e2e's per-key counts, when `target/e2e/cloudstack-load.json` exists), against
//! CAPC's retired per-Machine state checker, and time to `False` and to recycle against the MHC
//! timer (issues 7 and 27). Runs the shim's real polling code (`check`'s `Checker`:
//! `scope::poll`, the verdict engine, the mass-failure guard, condition transitions) against an
//! in-process `cloudstack-sim` on loopback whose clock is frozen and moved in lockstep with the
//! shim's `now`, so hours of simulated time take seconds. Writes `target/bench/report.json` (flat
//! `{"name": value}` pairs, units in the names, including the micro-benchmarks of
//! `target/bench/cloudstack.json` when that file exists) and `target/bench/report.md`.
//!
//! These are measurements, not tests: nothing here asserts a speed.

mod fleet;
mod load;
mod matrix;
mod precision;
mod probe;
mod recycle;
mod report;
mod users_load;
mod verdict_time;

use std::time::Instant;

use capc_health_shim::verdict::Graces;
use report::Report;

/// Fleet sizes and scope counts of part 1.
const LOAD_SIZES: [usize; 3] = [100, 1_000, 10_000];
const LOAD_SCOPES: [usize; 2] = [1, 10];
const SEED: u64 = 7;
/// Fleet sizes of part 1b (stats rows read with and without `want_stats_for`).
const STATS_ROWS_SIZES: [usize; 2] = [1_000, 10_000];

fn main() {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut report = Report::default();
    // `CAPC_BENCH_SCALE_ONLY=probe`: part 3d alone, into target/bench/probe-only/ (for working
    // on the probe; `make bench` runs everything).
    if std::env::var("CAPC_BENCH_SCALE_ONLY").as_deref() == Ok("probe") {
        let probed = rt.block_on(probe::run(SEED, &Graces::default()));
        report.add_probe(&probed);
        match report.write("target/bench/probe-only") {
            Ok(()) => println!("{}", report.markdown()),
            Err(e) => eprintln!("cannot write the report: {e}"),
        }
        return;
    }
    // `CAPC_BENCH_SCALE_ONLY=load`: sections 1 and 1a alone, into target/bench/load-only/ (to
    // read a new `target/e2e/cloudstack-load.json` in about a minute).
    if std::env::var("CAPC_BENCH_SCALE_ONLY").as_deref() == Ok("load") {
        let rows = rt.block_on(measure_load());
        add_load_sections(&mut report, &rows);
        match report.write("target/bench/load-only") {
            Ok(()) => println!("{}", report.markdown()),
            Err(e) => eprintln!("cannot write the report: {e}"),
        }
        return;
    }
    rt.block_on(async {
        let rows = measure_load().await;
        add_load_sections(&mut report, &rows);

        let mut stats_rows = Vec::new();
        for vms in STATS_ROWS_SIZES {
            let t = Instant::now();
            match load::stats_rows(vms).await {
                Ok(r) => {
                    eprintln!(
                        "stats rows: {vms} VMs: {:.0} rows/cycle for every VM, {:.0} for the {} \
                         without a Node ({:.1} s)",
                        r.all.rows_per_cycle,
                        r.no_node_only.rows_per_cycle,
                        r.no_node,
                        t.elapsed().as_secs_f64()
                    );
                    stats_rows.push(r);
                }
                Err(e) => eprintln!("stats rows: {vms} VMs skipped: {e}"),
            }
        }
        report.add_stats_rows(&stats_rows);

        let defaults = Graces::default();
        let mut kinds = Vec::new();
        for (i, fault) in verdict_time::FAULT_KINDS.into_iter().enumerate() {
            let t = Instant::now();
            match verdict_time::measure(fault, SEED + i as u64, &defaults).await {
                Ok(k) => {
                    eprintln!(
                        "time to verdict: {}: {} of {} detected ({:.1} s)",
                        fault.as_str(),
                        k.seconds_to_false.len(),
                        k.injected,
                        t.elapsed().as_secs_f64()
                    );
                    kinds.push(k);
                }
                Err(e) => eprintln!("time to verdict: {} skipped: {e}", fault.as_str()),
            }
        }
        report.add_verdict_times(&kinds);

        let t = Instant::now();
        match precision::measure(SEED, &defaults).await {
            Ok(p) => {
                eprintln!(
                    "precision: {} false False, {} missed of {} faults ({:.1} s)",
                    p.false_false,
                    p.missed,
                    p.real_faults,
                    t.elapsed().as_secs_f64()
                );
                report.add_precision(&p);
            }
            Err(e) => eprintln!("precision skipped: {e}"),
        }

        let t = Instant::now();
        let cells = matrix::run(matrix::cells(), SEED).await;
        let opt_in = matrix::run(matrix::opt_in_cells(), SEED).await;
        eprintln!(
            "precision matrix: {} + {} cells ({:.1} s)",
            cells.len(),
            opt_in.len(),
            t.elapsed().as_secs_f64()
        );

        // The same two measurements at graces short enough for the time goal: what the
        // defaults' longer graces buy, in false verdicts.
        let goal = verdict_time::goal_graces();
        let mut goal_kinds = Vec::new();
        for (i, fault) in verdict_time::FAULT_KINDS.into_iter().enumerate() {
            match verdict_time::measure(fault, SEED + i as u64, &goal).await {
                Ok(k) => goal_kinds.push(k),
                Err(e) => eprintln!("goal graces: {} skipped: {e}", fault.as_str()),
            }
        }
        match precision::measure(SEED, &goal).await {
            Ok(p) => {
                eprintln!(
                    "precision at goal graces: {} false False, {} missed of {} faults",
                    p.false_false, p.missed, p.real_faults
                );
                report.add_goal_graces(&goal, &goal_kinds, &p);
            }
            Err(e) => eprintln!("precision at goal graces skipped: {e}"),
        }
        report.add_matrix(&cells, &opt_in);

        // Part 3d: the opt-in guest probe, with and without, at the defaults.
        let probed = probe::run(SEED, &defaults).await;
        eprintln!("guest probe: {:.1} s in all", probed.wall_seconds);
        report.add_probe(&probed);
    });
    report.add_micro_benchmarks("target/bench/cloudstack.json");
    report.set("bench_scale_wall_seconds", started.elapsed().as_secs_f64());
    match report.write("target/bench") {
        Ok(()) => println!(
            "{}\nwritten to target/bench/report.json and target/bench/report.md",
            report.markdown()
        ),
        Err(e) => eprintln!("cannot write the report: {e}"),
    }
}

/// Part 1's measurements: the shim's poller (and CAPC's retired state checker) at every size.
async fn measure_load() -> Vec<load::LoadRow> {
    let mut rows = Vec::new();
    for vms in LOAD_SIZES {
        for scopes in LOAD_SCOPES {
            let t = Instant::now();
            match load::measure(vms, scopes).await {
                Ok(row) => {
                    eprintln!(
                        "load: {vms} VMs / {scopes} scope(s): shim {:.1} calls per cycle, \
                         retired state checker {:.0} per 5 s ({:.1} s)",
                        row.shim_calls_per_cycle,
                        row.retired_checker_calls_per_cycle,
                        t.elapsed().as_secs_f64()
                    );
                    rows.push(row);
                }
                Err(e) => eprintln!("load: {vms} VMs / {scopes} scope(s) skipped: {e}"),
            }
        }
    }
    rows
}

/// Sections 1 and 1a: what the shim adds to the load CAPC already makes (from the e2e's per-key
/// counts; `CAPC_BENCH_CLOUDSTACK_LOAD=<file>` reads another file than the e2e's), then CAPC's
/// retired state checker, which measured the shim's figures for the fleet sizes of section 1.
fn add_load_sections(report: &mut Report, rows: &[load::LoadRow]) {
    let load_file = std::env::var("CAPC_BENCH_CLOUDSTACK_LOAD")
        .unwrap_or_else(|_| cloudstack_sim::load::LOAD_FILE.to_string());
    report.add_users_load(&load_file, rows);
    report.add_load(rows);
}
