//! `target/bench/report.json` (flat `{"name": value}`, units in the names) and
//! `target/bench/report.md` (the same numbers as tables with ratios).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use capc_health_shim::verdict::Graces;
use cloudstack_sim::Fault;

use crate::fleet::{ratio, SHIM_INTERVAL_SECS};
use crate::load::{LoadRow, PAGE_SIZE, PER_MACHINE_INTERVAL_SECS};
use crate::precision::{self, PrecisionResult};
use crate::verdict_time::{percentile, KindResult, MHC_NODE_STARTUP_TIMEOUT_SECS};

#[derive(Debug, Default)]
pub struct Report {
    values: BTreeMap<String, f64>,
    sections: Vec<String>,
}

/// `1_scope` / `10_scopes`.
pub fn scope_label(scopes: usize) -> String {
    if scopes == 1 {
        "1_scope".to_string()
    } else {
        format!("{scopes}_scopes")
    }
}

/// `nic-down` → `nic_down`.
pub fn fault_key(f: Fault) -> String {
    f.as_str().replace('-', "_")
}

impl Report {
    pub fn set(&mut self, name: &str, value: f64) {
        self.values.insert(name.to_string(), value);
    }

    pub fn add_load(&mut self, rows: &[LoadRow]) {
        let mut md = format!(
            "## 1. CloudStack API load\n\n\
             Calls counted by cloudstack-sim (every HTTP request it answered). The shim polls each scope \
             every {SHIM_INTERVAL_SECS} s (its default) with one paginated listing; the per-Machine \
             poller calls `listVirtualMachinesMetrics id=…` for every Machine every \
             {PER_MACHINE_INTERVAL_SECS} s. Floor: one page per {PAGE_SIZE} VMs per scope per interval. \
             Healthy fleet, simulated time.\n\n\
             | VMs | scopes | shim calls/cycle | floor calls/cycle | shim ÷ floor | shim calls/machine-hour | per-Machine calls/5 s | per-Machine calls/machine-hour | per-Machine ÷ shim |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        );
        for r in rows {
            let label = format!("{}_vms_{}", r.vms, scope_label(r.scopes));
            self.set(
                &format!("api_calls_per_cycle_shim_{label}"),
                r.shim_calls_per_cycle,
            );
            self.set(
                &format!("api_calls_per_machine_hour_shim_{label}"),
                r.shim_calls_per_machine_hour,
            );
            self.set(
                &format!("api_calls_per_cycle_floor_{label}"),
                r.floor_calls_per_cycle,
            );
            self.set(
                &format!("api_calls_per_machine_hour_floor_{label}"),
                r.floor_calls_per_machine_hour,
            );
            self.set(
                &format!("api_calls_per_5s_cycle_per_machine_poller_{label}"),
                r.baseline_calls_per_cycle,
            );
            self.set(
                &format!("api_calls_per_machine_hour_per_machine_poller_{label}"),
                r.baseline_calls_per_machine_hour,
            );
            self.set(
                &format!("api_calls_failed_per_machine_poller_{label}"),
                r.baseline_errors as f64,
            );
            self.set(
                &format!("shim_verdicts_not_true_healthy_fleet_{label}"),
                r.shim_not_true as f64,
            );
            let ratio_key = if r.scopes == 1 {
                format!("api_calls_ratio_per_machine_poller_vs_shim_{}_vms", r.vms)
            } else {
                format!("api_calls_ratio_per_machine_poller_vs_shim_{label}")
            };
            self.set(&ratio_key, r.ratio());
            let over_floor = ratio(r.shim_calls_per_cycle, r.floor_calls_per_cycle);
            self.set(
                &format!("api_calls_ratio_shim_vs_floor_{label}"),
                over_floor,
            );
            let _ = writeln!(
                md,
                "| {} | {} | {:.1} | {:.0} | {:.2} | {:.3} | {:.0} | {:.0} | {:.0}× |",
                r.vms,
                r.scopes,
                r.shim_calls_per_cycle,
                r.floor_calls_per_cycle,
                over_floor,
                r.shim_calls_per_machine_hour,
                r.baseline_calls_per_cycle,
                r.baseline_calls_per_machine_hour,
                r.ratio()
            );
        }
        md.push_str("\nShim calls per cycle by command:\n\n");
        for r in rows {
            let bad = if r.shim_not_true > 0 || r.baseline_errors > 0 {
                format!(
                    " (not True: {}; failed per-Machine calls: {})",
                    r.shim_not_true, r.baseline_errors
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                md,
                "- {} VMs / {} scope(s): {}{bad}",
                r.vms, r.scopes, r.shim_commands
            );
        }
        self.sections.push(md);
    }

    pub fn add_verdict_times(&mut self, kinds: &[KindResult]) {
        let g = Graces::default();
        self.set(
            "mhc_node_startup_timeout_seconds",
            MHC_NODE_STARTUP_TIMEOUT_SECS,
        );
        let mut md = format!(
            "## 2. Time to a verdict\n\n\
             Seconds from fault injection to the first published `False`, simulated time: default \
             graces, shim interval {} s, CloudStack stats interval {} s. Per kind: 10 scopes × 25 VMs, \
             one host per VM, 200 faults at seeded random times. MHC's default `nodeStartupTimeout` \
             is {MHC_NODE_STARTUP_TIMEOUT_SECS:.0} s; floor = one poll interval + the evidence grace.\n\n\
             | fault | faults | detected | p50 s | p99 s | max s | floor s | p99 ÷ floor | p99 ÷ MHC 600 s | held by guard | false False |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            g.poll_interval.as_secs(),
            g.stats_interval.as_secs()
        );
        let mut false_false = 0;
        for k in kinds {
            let key = fault_key(k.fault);
            let p50 = percentile(&k.seconds_to_false, 0.5);
            let p99 = percentile(&k.seconds_to_false, 0.99);
            let max = k.seconds_to_false.last().copied().unwrap_or(f64::NAN);
            false_false += k.false_false;
            self.set(&format!("verdict_faults_injected_{key}"), k.injected as f64);
            self.set(&format!("verdict_faults_missed_{key}"), k.missed() as f64);
            if !k.seconds_to_false.is_empty() {
                self.set(&format!("verdict_p50_seconds_{key}"), p50);
                self.set(&format!("verdict_p99_seconds_{key}"), p99);
                self.set(&format!("verdict_max_seconds_{key}"), max);
                self.set(
                    &format!("verdict_p99_fraction_of_mhc_node_startup_timeout_{key}"),
                    p99 / MHC_NODE_STARTUP_TIMEOUT_SECS,
                );
            }
            self.set(&format!("verdict_floor_seconds_{key}"), k.floor_seconds);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {} | {} |",
                k.fault.as_str(),
                k.injected,
                k.seconds_to_false.len(),
                p50,
                p99,
                max,
                k.floor_seconds,
                p99 / k.floor_seconds,
                p99 / MHC_NODE_STARTUP_TIMEOUT_SECS,
                k.held,
                k.false_false
            );
        }
        self.set("verdict_time_false_false_verdicts", false_false as f64);
        md.push_str(
            "\nnic-down can exceed its floor: cloudstack-sim's `listVirtualMachinesUsageHistory` has no \
             `projectid` and shows no samples for VMs in projects (every scope here is a project), so the \
             shim judges silence from the listing's counters over (3 + 1) stats intervals; the phase \
             between the shim's polls and the stats collector is set by the wall clock at start and moves \
             nic-down by up to one stats interval from run to run.\n",
        );
        self.sections.push(md);
    }

    /// Section 3b: time to a verdict and precision at [`crate::verdict_time::goal_graces`].
    pub fn add_goal_graces(&mut self, g: &Graces, kinds: &[KindResult], p: &PrecisionResult) {
        let mut md = format!(
            "## 3b. At graces short enough for the time goal\n\n\
             The goal (p99 under 20 % of MHC's 600 s = 120 s) at the default graces is out of reach \
             for four kinds by the graces alone (section 2). Here sections 2 and 3 run again with \
             `--silent-samples {}`, `--nic-detached-grace {} s`, `--nic-no-address-grace {} s` and \
             `--host-unreachable-grace {} s` (everything else default, same seeds):\n\n\
             | fault | p50 s | p99 s | floor s | p99 ÷ MHC 600 s | false False |\n\
             |---|---:|---:|---:|---:|---:|\n",
            g.silent_samples,
            g.nic_detached.as_secs(),
            g.nic_no_address.as_secs(),
            g.host_unreachable.as_secs()
        );
        for k in kinds {
            let key = fault_key(k.fault);
            let p50 = percentile(&k.seconds_to_false, 0.5);
            let p99 = percentile(&k.seconds_to_false, 0.99);
            if !k.seconds_to_false.is_empty() {
                self.set(&format!("goal_graces_verdict_p99_seconds_{key}"), p99);
            }
            let _ = writeln!(
                md,
                "| {} | {p50:.0} | {p99:.0} | {:.0} | {:.2} | {} |",
                k.fault.as_str(),
                k.floor_seconds,
                p99 / MHC_NODE_STARTUP_TIMEOUT_SECS,
                k.false_false
            );
        }
        self.set("goal_graces_false_false_verdicts", p.false_false as f64);
        self.set("goal_graces_missed_faults", p.missed as f64);
        let benign: Vec<String> = p
            .healthy_vms_by_other_reason
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        let _ = writeln!(
            md,
            "\nThe precision fleet of section 3 at these graces: **{} false `False`** (healthy VMs \
             recycled), {} missed of {} real faults, {} held by the mass-failure guard. Healthy VMs \
             published with another status/reason: {}. nic-down stays above 120 s even at one \
             flat sample: flat traffic shows only between two stats samples taken after the fault \
             (up to 2 × 60 s at CloudStack's default interval), then the next poll.",
            p.false_false,
            p.missed,
            p.real_faults,
            p.held,
            benign.join(", ")
        );
        self.sections.push(md);
    }

    pub fn add_precision(&mut self, p: &PrecisionResult) {
        self.set("false_false_verdicts", p.false_false as f64);
        self.set("missed_faults", p.missed as f64);
        self.set("precision_vms", p.vms as f64);
        self.set("precision_real_faults", p.real_faults as f64);
        self.set("precision_slow_boot_vms", p.slow_boots as f64);
        self.set("precision_remediation_held_vms", p.held as f64);
        self.set("precision_live_migrations", p.migrations as f64);
        self.set(
            "precision_recycled_by_mhc_timer_after_hold",
            p.recycled_by_mhc_timer as f64,
        );
        let p50 = percentile(&p.seconds_to_false, 0.5);
        let p99 = percentile(&p.seconds_to_false, 0.99);
        if !p.seconds_to_false.is_empty() {
            self.set("precision_verdict_p50_seconds_all_faults", p50);
            self.set("precision_verdict_p99_seconds_all_faults", p99);
        }
        let benign: Vec<String> = p
            .healthy_vms_by_other_reason
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        let mut md = format!(
            "## 3. Precision\n\n\
             {} VMs in {} scopes on {} hosts, {} simulated cycles of {SHIM_INTERVAL_SECS} s: Pareto boots \
             (longest {:.0} s in `Starting`), {} slow boots with trickling but rising traffic (longest \
             {:.0} s), two stats gaps (8 and 3 min), one host offline for 6 min and back, {} live \
             migrations (`Migrating` 1–4 min, no stats meanwhile; one host's VMs all moved for its \
             maintenance, the rest single), a 3 min API outage, {} real faults (nic-down, error, stop, vanish, detach-nic, no-address). A Machine \
             published `False` is recycled at once; one held by the mass-failure guard is recycled by \
             the MHC timer after 600 s and counts as missed.\n\n\
             | VMs | real faults | false `False` | missed faults | held by guard | of them recycled by the MHC timer | p50 s to False | p99 s to False |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|\n\
             | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} |\n",
            p.vms,
            precision::SCOPES,
            precision::HOSTS,
            p.cycles,
            p.max_boot_seconds,
            p.slow_boots,
            p.max_slow_boot_seconds,
            p.migrations,
            p.real_faults,
            p.vms,
            p.real_faults,
            p.false_false,
            p.missed,
            p.held,
            p.recycled_by_mhc_timer,
            p50,
            p99
        );
        let _ = writeln!(
            md,
            "\nHealthy VMs published with another status/reason at some poll (VM count): {}.",
            benign.join(", ")
        );
        self.sections.push(md);
    }

    /// Folds the micro-benchmarks (`benches/cloudstack.rs`) into the report.
    pub fn add_micro_benchmarks(&mut self, path: &str) {
        let Ok(text) = std::fs::read_to_string(path) else {
            self.sections
                .push(format!("## 5. Micro-benchmarks\n\n{path} not found (run `cargo bench --bench cloudstack` first).\n"));
            return;
        };
        let values: BTreeMap<String, f64> = serde_json::from_str(&text).unwrap_or_default();
        let mut md = format!(
            "## 5. Micro-benchmarks (regression guards)\n\n\
             From `{path}` (Criterion medians; Criterion itself compares each run with the last under `target/criterion`).\n\n\
             | name | value |\n|---|---:|\n"
        );
        for (k, v) in values {
            let _ = writeln!(md, "| {k} | {v:.3} |");
            self.values.insert(k, v);
        }
        self.sections.push(md);
    }

    pub fn markdown(&self) -> String {
        let mut md = String::from(
            "# capc-health-shim: scale and speed (issue 7)\n\n\
             One `make bench` run on this machine. Simulated time throughout parts 1–3.\n\n",
        );
        for s in &self.sections {
            md.push_str(s);
            md.push('\n');
        }
        md
    }

    pub fn write(&self, dir: &str) -> std::io::Result<()> {
        let dir = Path::new(dir);
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(&self.values).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("report.json"), json)?;
        std::fs::write(dir.join("report.md"), self.markdown())
    }
}
