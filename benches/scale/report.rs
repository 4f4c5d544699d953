//! `target/bench/report.json` (flat `{"name": value}`, units in the names) and
//! `target/bench/report.md` (the same numbers as tables with ratios).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use capc_health_shim::verdict::Graces;
use cloudstack_sim::Fault;

use crate::fleet::{ratio, SHIM_INTERVAL_SECS};
use crate::load::{LoadRow, RowsRow, NO_NODE_PERCENT, PAGE_SIZE, PER_MACHINE_INTERVAL_SECS};
use crate::matrix::{self, CellResult, FaultCount};
use crate::precision::{self, PrecisionResult};
use crate::probe::{Cost, ProbeResults, TimeResult, GOAL_P99_SECONDS, PROBE_COMMANDS};
use crate::recycle::{cell, plus, RecycleTerms};
use crate::verdict_time::{never_false, percentile, KindResult, MHC_NODE_STARTUP_TIMEOUT_SECS};

/// `a: 1, b: 2` of a count map, or `none`.
fn counts<K: std::fmt::Display>(m: &BTreeMap<K, usize>) -> String {
    if m.is_empty() {
        return "none".to_string();
    }
    m.iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The cell of `cells` with the largest `key` above zero, if any.
fn worst_cell<K: PartialOrd + Copy + Default>(
    cells: &[CellResult],
    key: impl Fn(&CellResult) -> Option<K>,
) -> Option<&CellResult> {
    let mut best: Option<(&CellResult, K)> = None;
    for c in cells {
        if let Some(k) = key(c) {
            if k > best.map_or(K::default(), |b| b.1) {
                best = Some((c, k));
            }
        }
    }
    best.map(|b| b.0)
}

/// One line per metric naming the worst cell: `{metric}: {value} in `{cell}``, or the metric's
/// best case when no cell is worse than it. False `False` and held over `cells`; detections
/// (nic-down, quiet, one-nic-down) over the cells where silence is judged (`silence_judged`).
pub fn worst_cells(
    cells: &[CellResult],
    silence_judged: impl Fn(&CellResult) -> bool,
) -> Vec<String> {
    let judged: Vec<CellResult> = cells
        .iter()
        .filter(|c| silence_judged(c))
        .cloned()
        .collect();
    let line = |metric: &str,
                cell: Option<&CellResult>,
                value: &dyn Fn(&CellResult) -> String,
                none: &str| {
        match cell {
            Some(c) => format!("{metric}: {} in `{}`", value(c), c.cell.label()),
            None => format!("{metric}: {none}"),
        }
    };
    let p99 = |f: &FaultCount| (!f.seconds.is_empty()).then(|| percentile(&f.seconds, 0.99));
    // Fewest detected = the largest share missed.
    let miss_share = |f: &FaultCount| (f.total > 0).then(|| f.missed() as f64 / f.total as f64);
    let of = |f: &FaultCount| format!("{}/{}", f.detected(), f.total);
    vec![
        line(
            "false `False` (healthy)",
            worst_cell(cells, |c| Some(c.false_false)),
            &|c| c.false_false.to_string(),
            "0 in every cell",
        ),
        line(
            "healthy held by the guard",
            worst_cell(cells, |c| Some(c.healthy_held())),
            &|c| c.healthy_held().to_string(),
            "0 in every cell",
        ),
        line(
            "nic-down missed",
            worst_cell(&judged, |c| Some(c.nic_down.missed())),
            &|c| format!("{} of {}", c.nic_down.missed(), c.nic_down.total),
            "0 in every cell",
        ),
        line(
            "nic-down p99",
            worst_cell(&judged, |c| p99(&c.nic_down)),
            &|c| format!("{:.0} s", percentile(&c.nic_down.seconds, 0.99)),
            "none detected",
        ),
        line(
            "quiet detected",
            worst_cell(&judged, |c| miss_share(&c.quiet)),
            &|c| of(&c.quiet),
            "all in every cell",
        ),
        line(
            "one-nic-down detected",
            worst_cell(&judged, |c| miss_share(&c.one_nic_down)),
            &|c| of(&c.one_nic_down),
            "all in every cell",
        ),
        line(
            "one-nic-down p99",
            worst_cell(&judged, |c| p99(&c.one_nic_down)),
            &|c| format!("{:.0} s", percentile(&c.one_nic_down.seconds, 0.99)),
            "none detected",
        ),
    ]
}

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

    /// Appends a Markdown section (in the order added).
    pub fn push_section(&mut self, md: String) {
        self.sections.push(md);
    }

    pub fn add_load(&mut self, rows: &[LoadRow]) {
        let mut md = format!(
            "## 1a. CAPC's retired state checker at its {PER_MACHINE_INTERVAL_SECS} s interval (not registered in CAPC v0.6.1)\n\n\
             A second comparison, not the load users have (that is section 1): CAPC's old state \
             checker called `listVirtualMachinesMetrics id=…` for every Machine every \
             {PER_MACHINE_INTERVAL_SECS} s; it is switched off and not registered in CAPC v0.6.1, and \
             part of its ratio to the shim is only its {PER_MACHINE_INTERVAL_SECS} s interval against \
             the shim's {SHIM_INTERVAL_SECS} s. Calls counted by cloudstack-sim (every HTTP request it \
             answered). The shim polls each scope every {SHIM_INTERVAL_SECS} s (its default) with one \
             paginated listing. Floor: one page per {PAGE_SIZE} VMs per scope per interval. Healthy \
             fleet, simulated time. (`check`'s poller, not the controller: section 1b takes the \
             controller's own calls per cycle at 1 000 and 10 000 Machines.)\n\n\
             | VMs | scopes | shim calls/cycle | floor calls/cycle | shim ÷ floor | shim calls/machine-hour | retired checker calls/5 s | retired checker calls/machine-hour | retired checker ÷ shim |\n\
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
                r.retired_checker_calls_per_cycle,
            );
            self.set(
                &format!("api_calls_per_machine_hour_per_machine_poller_{label}"),
                r.retired_checker_calls_per_machine_hour,
            );
            self.set(
                &format!("api_calls_failed_per_machine_poller_{label}"),
                r.retired_checker_errors as f64,
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
                r.retired_checker_calls_per_cycle,
                r.retired_checker_calls_per_machine_hour,
                r.ratio()
            );
        }
        md.push_str("\nShim calls per cycle by command:\n\n");
        for r in rows {
            let bad = if r.shim_not_true > 0 || r.retired_checker_errors > 0 {
                format!(
                    " (not True: {}; failed retired-checker calls: {})",
                    r.shim_not_true, r.retired_checker_errors
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
        let terms = RecycleTerms::load();
        self.set(
            "mhc_node_startup_timeout_seconds",
            MHC_NODE_STARTUP_TIMEOUT_SECS,
        );
        if let Some(a) = terms.annotate() {
            self.set("recycle_added_seconds_annotate", a);
        }
        if let Some(c) = terms.condition() {
            self.set("recycle_added_seconds_condition", c);
        }
        let mut md = format!(
            "## 2. Time to a verdict\n\n\
             Seconds from fault injection to the first published `False`, simulated time: default \
             graces, shim interval {} s, CloudStack stats interval {} s. Per kind: 10 scopes × 25 VMs, \
             one host per VM, 200 faults at seeded random times. MHC's default `nodeStartupTimeout` \
             is {MHC_NODE_STARTUP_TIMEOUT_SECS:.0} s; floor = one poll interval + the evidence grace. \
             Time to `False` is not time to recycle: the last four columns add what a `False` still \
             waits for in each mode (below) and compare that with the stock MHC's \
             {MHC_NODE_STARTUP_TIMEOUT_SECS:.0} s.\n\n\
             | fault | faults | detected | p50 s to False | p99 s to False | max s to False | floor s | p99 ÷ floor | p99 s to recycle, annotate (+{}) | ÷ stock MHC {MHC_NODE_STARTUP_TIMEOUT_SECS:.0} s | p99 s to recycle, condition (+{}) | ÷ stock MHC {MHC_NODE_STARTUP_TIMEOUT_SECS:.0} s | held by guard | false False |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            g.poll_interval.as_secs(),
            g.stats_interval.as_secs(),
            cell(terms.annotate(), 0),
            cell(terms.condition(), 0),
        );
        let mut false_false = 0;
        let mut notes = Vec::new();
        for k in kinds {
            let key = fault_key(k.fault);
            let p50 = percentile(&k.seconds_to_false, 0.5);
            let p99 = percentile(&k.seconds_to_false, 0.99);
            let max = k.seconds_to_false.last().copied().unwrap_or(f64::NAN);
            false_false += k.false_false;
            if never_false(k.fault) {
                self.set(
                    &format!("verdict_false_after_fault_{key}"),
                    k.seconds_to_false.len() as f64,
                );
                self.set(
                    &format!("verdict_unknown_host_unreachable_{key}"),
                    k.unknown_host_unreachable as f64,
                );
                notes.push(format!(
                    "{} stays `Unknown HostUnreachable` by design (the agent lost its connection; \
                     the guest usually runs on and CloudStack's HA decides), so it has no floor \
                     and no time to `False`: {} of {} faulted VMs stayed `Unknown`, {} were \
                     published `False`; not counted as missed.",
                    k.fault.as_str(),
                    k.unknown_host_unreachable,
                    k.injected,
                    k.seconds_to_false.len()
                ));
            }
            for (path, secs) in &k.seconds_by_path {
                if !secs.is_empty() && k.fault == Fault::NicDown {
                    let (p50, p99) = (percentile(secs, 0.5), percentile(secs, 0.99));
                    self.set(&format!("verdict_p50_seconds_{key}_{path}_scopes"), p50);
                    self.set(&format!("verdict_p99_seconds_{key}_{path}_scopes"), p99);
                    notes.push(format!(
                        "{} in {path} scopes: {} detected, p50 {p50:.0} s, p99 {p99:.0} s.",
                        k.fault.as_str(),
                        secs.len()
                    ));
                }
            }
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
                for (mode, added) in [
                    ("annotate", terms.annotate()),
                    ("condition", terms.condition()),
                ] {
                    if let Some(r) = plus(p99, added) {
                        self.set(&format!("recycle_p99_seconds_{mode}_{key}"), r);
                        self.set(
                            &format!(
                                "recycle_p99_fraction_of_stock_mhc_node_startup_timeout_{mode}_{key}"
                            ),
                            r / MHC_NODE_STARTUP_TIMEOUT_SECS,
                        );
                    }
                }
            }
            if never_false(k.fault) {
                // No floor, no percentiles: the kind never gives `False` by design.
                let _ = writeln!(
                    md,
                    "| {} | {} | stays `Unknown` by design ({} `Unknown HostUnreachable`, {} \
                     `False`) | – | – | – | – | – | – | – | – | – | {} | {} |",
                    k.fault.as_str(),
                    k.injected,
                    k.unknown_host_unreachable,
                    k.seconds_to_false.len(),
                    k.held,
                    k.false_false
                );
                continue;
            }
            self.set(&format!("verdict_floor_seconds_{key}"), k.floor_seconds);
            let annotate = plus(p99, terms.annotate());
            let condition = plus(p99, terms.condition());
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {} | {} | {} | {} | {} | {} |",
                k.fault.as_str(),
                k.injected,
                k.seconds_to_false.len(),
                p50,
                p99,
                max,
                k.floor_seconds,
                p99 / k.floor_seconds,
                cell(annotate, 0),
                cell(annotate.map(|r| r / MHC_NODE_STARTUP_TIMEOUT_SECS), 2),
                cell(condition, 0),
                cell(condition.map(|r| r / MHC_NODE_STARTUP_TIMEOUT_SECS), 2),
                k.held,
                k.false_false
            );
        }
        md.push('\n');
        md.push_str(&terms.explain(g.poll_interval.as_secs()));
        self.set("verdict_time_false_false_verdicts", false_false as f64);
        md.push('\n');
        for n in notes {
            let _ = writeln!(md, "- {n}");
        }
        md.push_str(
            "\nThe scopes alternate between projects and accounts. Usage history has no \
             `projectid`, so it cannot show VMs of a project: there the shim judges silence from the \
             listing's accumulated counter alone, flat for (`--silent-samples` + 1) × \
             `--stats-interval` (4 min). For VMs of an account it reads the per-row samples and needs \
             `--silent-samples` (3) zero samples at the inferred cadence and a counter flat as long. \
             Either way the floor (one poll + 3 stats intervals) can be exceeded by up to one stats \
             interval: flat traffic shows only between samples taken after the fault. The phase \
             between polls and the collector is set by the wall clock at start and varies from run to \
             run. detach-nic and no-address use the 60 s default NIC graces (issue 14's goal: p99 ≤ \
             120 s).\n",
        );
        self.sections.push(md);
    }

    /// Section 3b: time to a verdict and precision at [`crate::verdict_time::goal_graces`].
    pub fn add_goal_graces(&mut self, g: &Graces, kinds: &[KindResult], p: &PrecisionResult) {
        let terms = RecycleTerms::load();
        let mut md = format!(
            "## 3b. At graces short enough for the time goal\n\n\
             The goal (p99 of time to `False` under 20 % of MHC's 600 s = 120 s; the recycle columns \
             add section 2's terms): the NIC graces are 60 s by default now \
             and host-offline never gives `False`, so what is left is nic-down, bounded by three stats \
             samples. Here sections 2 and 3 run again with `--silent-samples {}` (everything else \
             default, same seeds; NIC graces {} s / {} s):\n\n\
             | fault | p50 s to False | p99 s to False | floor s | p99 s to recycle, annotate (+{}) | ÷ stock MHC {MHC_NODE_STARTUP_TIMEOUT_SECS:.0} s | p99 s to recycle, condition (+{}) | ÷ stock MHC {MHC_NODE_STARTUP_TIMEOUT_SECS:.0} s | false False |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            g.silent_samples,
            g.nic_detached.as_secs(),
            g.nic_no_address.as_secs(),
            cell(terms.annotate(), 0),
            cell(terms.condition(), 0),
        );
        for k in kinds {
            let key = fault_key(k.fault);
            let p50 = percentile(&k.seconds_to_false, 0.5);
            let p99 = percentile(&k.seconds_to_false, 0.99);
            if !k.seconds_to_false.is_empty() {
                self.set(&format!("goal_graces_verdict_p99_seconds_{key}"), p99);
            }
            if never_false(k.fault) {
                let _ = writeln!(
                    md,
                    "| {} | stays `Unknown` by design ({} of {} `Unknown HostUnreachable`) | – | – | – | – | – | – | {} |",
                    k.fault.as_str(),
                    k.unknown_host_unreachable,
                    k.injected,
                    k.false_false
                );
                continue;
            }
            let annotate = plus(p99, terms.annotate());
            let condition = plus(p99, terms.condition());
            if let Some(r) = annotate {
                self.set(
                    &format!("goal_graces_recycle_p99_seconds_annotate_{key}"),
                    r,
                );
            }
            if let Some(r) = condition {
                self.set(
                    &format!("goal_graces_recycle_p99_seconds_condition_{key}"),
                    r,
                );
            }
            let _ = writeln!(
                md,
                "| {} | {p50:.0} | {p99:.0} | {:.0} | {} | {} | {} | {} | {} |",
                k.fault.as_str(),
                k.floor_seconds,
                cell(annotate, 0),
                cell(annotate.map(|r| r / MHC_NODE_STARTUP_TIMEOUT_SECS), 2),
                cell(condition, 0),
                cell(condition.map(|r| r / MHC_NODE_STARTUP_TIMEOUT_SECS), 2),
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
             published with another status/reason: {}. Even at one flat sample nic-down needs a \
             counter flat for (1 + 1) × 60 s in project scopes, and in account scopes a zero sample \
             taken after the fault (up to 2 × 60 s at CloudStack's default interval) plus the next \
             poll; compare its p99 above with 120 s.",
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
        let nic_false: usize = p
            .false_false_by_reason
            .iter()
            .filter(|(r, _)| {
                r.as_str() == capc_health_shim::verdict::reason::NIC_DETACHED
                    || r.as_str() == capc_health_shim::verdict::reason::NIC_NO_ADDRESS
            })
            .map(|(_, n)| *n)
            .sum();
        self.set("precision_false_false_nic_reasons", nic_false as f64);
        self.set("precision_l2_vms", p.l2_vms as f64);
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
             {} VMs in {} scopes (half projects, half accounts) on {} KVM hosts, {} of them on an L2 \
             network (no address by design), {} simulated cycles of {SHIM_INTERVAL_SECS} s: Pareto boots \
             (longest {:.0} s in `Starting`), {} slow boots with trickling but rising traffic (longest \
             {:.0} s), two stats gaps (8 and 3 min), one host offline for 6 min and back (never `False` \
             by design: its VMs must stay `Unknown HostUnreachable`), {} live \
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
            p.l2_vms,
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
            "\nHealthy VMs published with another status/reason at some poll (VM count): {}.\n\n\
             False `False` by reason: {}; of them `NICDetached`/`NICNoAddress` (NIC graces {} s / \
             {} s): **{nic_false}**.",
            benign.join(", "),
            counts(&p.false_false_by_reason),
            Graces::default().nic_detached.as_secs(),
            Graces::default().nic_no_address.as_secs(),
        );
        self.sections.push(md);
    }

    /// Section 1b: `vm_stats` rows CloudStack reads per poll cycle, with statistics asked for
    /// every VM against only for the Machines without a Node.
    pub fn add_stats_rows(&mut self, rows: &[RowsRow]) {
        let mut md = format!(
            "## 1b. What asking statistics only for Machines without a Node saves CloudStack\n\n\
             A listing with `details=stats&accumulate=true` makes CloudStack read every retained \
             `vm_stats` row of every listed VM (`StatsCollector.getVmStats` sums them); usage history \
             reads its samples too. Counted by cloudstack-sim (`/sim/calls` `stats_rows_read`) on a \
             healthy KVM fleet in {} scopes after {} h of simulated time at CloudStack's default \
             retention, 1 management server, 60 s interval; {NO_NODE_PERCENT} % of the Machines have \
             no Node. (a) stats for every VM (`check`'s default); (b) the cheap listing for every VM \
             plus an id-filtered stats listing for the Machines without a Node \
             (`Checker::want_stats_for`, what `run` does).\n\n\
             | VMs | without Node | retention min | rows per VM | (a) rows/cycle | (b) rows/cycle | (a) ÷ (b) | (a) calls/cycle | (b) calls/cycle |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            crate::load::ROWS_SCOPES,
            crate::load::ROWS_HISTORY_SECS / 3600
        );
        for r in rows {
            let l = format!("{}_vms", r.vms);
            self.set(
                &format!("stats_rows_per_cycle_all_vms_{l}"),
                r.all.rows_per_cycle,
            );
            self.set(
                &format!("stats_rows_per_cycle_no_node_only_{l}"),
                r.no_node_only.rows_per_cycle,
            );
            self.set(
                &format!("stats_rows_ratio_all_vs_no_node_only_{l}"),
                r.ratio(),
            );
            self.set(
                &format!("api_calls_per_cycle_stats_all_vms_{l}"),
                r.all.calls_per_cycle,
            );
            self.set(
                &format!("api_calls_per_cycle_stats_no_node_only_{l}"),
                r.no_node_only.calls_per_cycle,
            );
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.0} | {:.0} | {:.1}× | {:.1} | {:.1} |",
                r.vms,
                r.no_node,
                r.retention_minutes,
                r.rows_per_vm,
                r.all.rows_per_cycle,
                r.no_node_only.rows_per_cycle,
                r.ratio(),
                r.all.calls_per_cycle,
                r.no_node_only.calls_per_cycle
            );
        }
        md.push_str("\nCalls per cycle by command:\n\n");
        for r in rows {
            let _ = writeln!(
                md,
                "- {} VMs: (a) {}; (b) {}",
                r.vms, r.all.commands, r.no_node_only.commands
            );
        }
        self.sections.push(md);
    }

    /// Section 3c: the precision matrix at real statistics semantics (issue 14 §4).
    pub fn add_matrix(&mut self, defaults: &[CellResult], opt_in: &[CellResult]) {
        let mut md = format!(
            "## 3c. Precision at real statistics semantics (issue 14)\n\n\
             Every cell: {} VMs ({} per guest profile: boot→join, slow boot (boot → waiting-for-endpoint \
             up to 25 min → join), waiting-for-endpoint SYN and ARP for the whole run, idle-joined, \
             quiet (services failed after boot), nic-down at a random moment, one-nic-down at a random \
             moment) on {} hosts of the cell's hypervisor, in 2 project scopes (usage history cannot \
             show their VMs: counter alone) and 2 account scopes (per-row samples), a quarter on an L2 \
             network; {} simulated minutes polled every {SHIM_INTERVAL_SECS} s; a host through \
             PrepareForMaintenance (VMs live-migrated away) → Maintenance → Enabled, a host \
             `Connecting` for 5 min, a host whose stats call fails for 8 min. The shim at its defaults \
             (`--stats-interval 60s` also in the 300 s cells). A `False` recycles the Machine.\n\n\
             Classification. Healthy profiles: boot→join, slow boot, waiting-for-endpoint (SYN and \
             ARP), idle-joined, and nic-down and one-nic-down before their fault; a `False` on one of \
             them is a false `False`, and \"healthy held\" counts those whose `False` only the \
             mass-failure guard stopped. Faults: nic-down; quiet, which is what the simulator plays \
             for a guest whose services failed after boot (NTP/ARP only, about 4 B/s: the Machine \
             never joins and MHC would recycle it anyway), so a `GuestNetworkSilent` `False` on it is \
             a detection (a miss is left to MHC's `nodeStartupTimeout`); one-nic-down after its \
             fault, where a `False` is a detection and a miss is not detectable by design while the \
             second NIC keeps the counters rising. \"detected\" counts published `False`; \"+n held\" are faults whose `False` the guard held until MHC's \
             timer recycled them (not detected by the shim; for nic-down they are in \"missed\"). \
             `vm.stats.increment.metrics` on/off twins play the same seed: the shim always sends \
             `accumulate=true`, so they must agree.\n\n",
            matrix::PER_PROFILE * matrix::Guest::ALL.len(),
            matrix::PER_PROFILE,
            matrix::HOSTS,
            matrix::RUN_MINUTES
        );
        let by_kind = |m: &BTreeMap<&'static str, usize>| {
            format!(
                "{}, {}",
                m.get("account").copied().unwrap_or(0),
                m.get("project").copied().unwrap_or(0)
            )
        };
        // `18/20` or `18/20 (+2 held)`.
        let det = |f: &FaultCount| {
            let held = f.held_only();
            if held > 0 {
                format!("{}/{} (+{held} held)", f.detected(), f.total)
            } else {
                format!("{}/{}", f.detected(), f.total)
            }
        };
        let pct = |f: &FaultCount, q: f64| {
            if f.seconds.is_empty() {
                "–".to_string()
            } else {
                format!("{:.0}", percentile(&f.seconds, q))
            }
        };
        let table = |md: &mut String, cells: &[CellResult], me: &mut Self, prefix: &str| {
            md.push_str(
                "| hypervisor | increment | MS | interval s | inferred s | false False (healthy) | of them NIC reasons | healthy held | nic-down detected / injected (project, account) | nic-down missed | nic-down p50 s | nic-down p99 s | quiet detected / total | one-nic-down detected / injected | one-nic-down p50 s | one-nic-down p99 s | usage-history calls | VMs judged from samples (account, project) / counter alone (account, project) |\n\
                 |---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
            );
            for c in cells {
                let l = format!("{prefix}{}", c.cell.label());
                me.set(&format!("{l}_false_false"), c.false_false as f64);
                me.set(&format!("{l}_healthy_held"), c.healthy_held() as f64);
                for (name, f) in [
                    ("nic_down", &c.nic_down),
                    ("quiet", &c.quiet),
                    ("one_nic_down", &c.one_nic_down),
                ] {
                    me.set(&format!("{l}_{name}_total"), f.total as f64);
                    me.set(&format!("{l}_{name}_detected"), f.detected() as f64);
                    me.set(&format!("{l}_{name}_missed"), f.missed() as f64);
                    me.set(&format!("{l}_{name}_held_until_mhc"), f.held_only() as f64);
                    if !f.seconds.is_empty() && name != "quiet" {
                        me.set(
                            &format!("{l}_{name}_p50_seconds"),
                            percentile(&f.seconds, 0.5),
                        );
                        me.set(
                            &format!("{l}_{name}_p99_seconds"),
                            percentile(&f.seconds, 0.99),
                        );
                    }
                }
                let path = |k: &str| {
                    c.nic_down_by_path.get(k).map_or("0/0".to_string(), |p| {
                        format!("{}/{}", p.detected, p.injected)
                    })
                };
                let nd_held = c.nic_down.held_only();
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {}/{} ({}, {}) | {}{} | {} | {} | {} | {} | {} | {} | {} | {} / {} |",
                    c.cell.hypervisor.as_str(),
                    if c.cell.increment { "on" } else { "off" },
                    c.cell.management_servers,
                    c.cell.interval_secs,
                    c.inferred_interval_secs.map_or("–".to_string(), |s| s.to_string()),
                    c.false_false,
                    c.false_false_nic,
                    c.healthy_held(),
                    c.nic_down.detected(),
                    c.nic_down.total,
                    path("project"),
                    path("account"),
                    c.nic_down.missed(),
                    if nd_held > 0 { format!(" ({nd_held} held)") } else { String::new() },
                    pct(&c.nic_down, 0.5),
                    pct(&c.nic_down, 0.99),
                    det(&c.quiet),
                    det(&c.one_nic_down),
                    pct(&c.one_nic_down, 0.5),
                    pct(&c.one_nic_down, 0.99),
                    c.usage_history_calls,
                    by_kind(&c.rows_path_vms),
                    by_kind(&c.counter_path_vms),
                );
            }
        };
        // Sums of a fault profile over some cells.
        fn sum<'a>(
            cells: impl Iterator<Item = &'a CellResult> + Clone,
            f: fn(&CellResult) -> &FaultCount,
        ) -> (usize, usize, usize) {
            (
                cells.clone().map(|c| f(c).detected()).sum(),
                cells.clone().map(|c| f(c).total).sum(),
                cells.map(|c| f(c).held_only()).sum(),
            )
        }
        md.push_str("### At the defaults (`--silence-hypervisors KVM`)\n\n");
        table(&mut md, defaults, self, "matrix_");
        // Summary against the targets.
        let is_kvm = |c: &&CellResult| c.cell.hypervisor == cloudstack_sim::Hypervisor::Kvm;
        let ff: usize = defaults.iter().map(|c| c.false_false).sum();
        let ff_nic: usize = defaults.iter().map(|c| c.false_false_nic).sum();
        let held: usize = defaults.iter().map(CellResult::healthy_held).sum();
        let kvm: Vec<&CellResult> = defaults.iter().filter(is_kvm).collect();
        let others: Vec<&CellResult> = defaults.iter().filter(|c| !is_kvm(c)).collect();
        let kvm_missed: usize = kvm.iter().map(|c| c.nic_down.missed()).sum();
        let kvm_injected: usize = kvm.iter().map(|c| c.nic_down.total).sum();
        let other_caught: usize = others.iter().map(|c| c.nic_down.detected()).sum();
        let mut kvm_secs: Vec<f64> = kvm
            .iter()
            .filter(|c| c.cell.interval_secs == 60)
            .flat_map(|c| c.nic_down.seconds.clone())
            .collect();
        kvm_secs.sort_by(f64::total_cmp);
        let (q_kvm, q_kvm_n, q_kvm_held) = sum(kvm.iter().copied(), |c| &c.quiet);
        let (q_oth, q_oth_n, _) = sum(others.iter().copied(), |c| &c.quiet);
        let (o_kvm, o_kvm_n, _) = sum(kvm.iter().copied(), |c| &c.one_nic_down);
        let (o_oth, o_oth_n, _) = sum(others.iter().copied(), |c| &c.one_nic_down);
        let not_injected: usize = defaults.iter().map(|c| c.faults_not_injected).sum();
        self.set("matrix_cells_defaults", defaults.len() as f64);
        self.set("matrix_false_false_total_defaults", ff as f64);
        self.set(
            "matrix_false_false_nic_reasons_total_defaults",
            ff_nic as f64,
        );
        self.set("matrix_healthy_held_total_defaults", held as f64);
        self.set("matrix_nic_down_missed_kvm_total", kvm_missed as f64);
        self.set(
            "matrix_nic_down_false_vmware_xenserver_defaults",
            other_caught as f64,
        );
        self.set("matrix_quiet_detected_kvm", q_kvm as f64);
        self.set("matrix_quiet_total_kvm", q_kvm_n as f64);
        self.set("matrix_quiet_detected_vmware_xenserver", q_oth as f64);
        self.set("matrix_one_nic_down_detected_kvm", o_kvm as f64);
        self.set("matrix_one_nic_down_injected_kvm", o_kvm_n as f64);
        self.set(
            "matrix_one_nic_down_detected_vmware_xenserver",
            o_oth as f64,
        );
        self.set("matrix_faults_not_injected_defaults", not_injected as f64);
        if !kvm_secs.is_empty() {
            self.set(
                "matrix_nic_down_p50_seconds_kvm_60s",
                percentile(&kvm_secs, 0.5),
            );
            self.set(
                "matrix_nic_down_p99_seconds_kvm_60s",
                percentile(&kvm_secs, 0.99),
            );
        }
        let twins_agree = defaults.iter().all(|c| {
            defaults
                .iter()
                .find(|d| {
                    d.cell
                        == matrix::Cell {
                            increment: !c.cell.increment,
                            ..c.cell
                        }
                })
                .is_none_or(|d| {
                    d.false_false == c.false_false
                        && d.nic_down.seconds == c.nic_down.seconds
                        && d.quiet.seconds == c.quiet.seconds
                        && d.one_nic_down.seconds == c.one_nic_down.seconds
                })
        });
        let _ = writeln!(
            md,
            "\nAgainst issue 14's targets at the defaults: **{ff} false `False`** on healthy profiles \
             over {} cells ({ff_nic} of them `NICDetached`/`NICNoAddress`), **{held}** more healthy \
             VMs whose `False` only the mass-failure guard held; nic-down on KVM **{kvm_missed} \
             missed** of {kvm_injected} (p50 {:.0} s, p99 {:.0} s in the 60 s cells); nic-down \
             `False` on VMware/XenServer: **{other_caught}** (target 0: silence is not judged there \
             by default). Quiet (services failed) detected: KVM **{q_kvm}/{q_kvm_n}**{}, \
             VMware/XenServer {q_oth}/{q_oth_n}. One-nic-down detected: KVM **{o_kvm}/{o_kvm_n}**, \
             VMware/XenServer {o_oth}/{o_oth_n} (a miss is not detectable by design: the second \
             NIC keeps the counters rising).{} Increment on/off twins agree: {}.",
            defaults.len(),
            percentile(&kvm_secs, 0.5),
            percentile(&kvm_secs, 0.99),
            if q_kvm_held > 0 {
                format!(" (+{q_kvm_held} held until MHC's timer)")
            } else {
                String::new()
            },
            if not_injected > 0 {
                format!(
                    " {not_injected} faults were not injected: their Machine had already been \
                     recycled by a false `False`."
                )
            } else {
                String::new()
            },
            if twins_agree { "yes" } else { "**no**" }
        );
        let _ = writeln!(
            md,
            "\nWorst cell per metric at the defaults (detections over the KVM cells: silence is \
             not judged on VMware/XenServer by default):\n"
        );
        for w in worst_cells(defaults, |c| {
            c.cell.hypervisor == cloudstack_sim::Hypervisor::Kvm
        }) {
            let _ = writeln!(md, "- {w}");
        }
        let bad: Vec<String> = defaults
            .iter()
            .filter(|c| c.false_false > 0 || c.healthy_held() > 0)
            .map(|c| {
                format!(
                    "`{}`: False {} ({}); held {}",
                    c.cell.label(),
                    c.false_false,
                    counts(&c.false_false_by),
                    counts(&c.held_healthy_by)
                )
            })
            .collect();
        if !bad.is_empty() {
            md.push_str("\nCells that miss \"0 false `False`\" (healthy profiles only):\n\n");
            for b in bad {
                let _ = writeln!(md, "- {b}");
            }
        }
        let examples: Vec<&String> = defaults
            .iter()
            .flat_map(|c| c.false_false_examples.iter().take(1))
            .take(6)
            .collect();
        if !examples.is_empty() {
            md.push_str(
                "\nExamples (minute of the run, profile, scope kind, host, reason: message):\n\n",
            );
            for e in examples {
                let _ = writeln!(md, "- {e}");
            }
        }
        let q_reasons: BTreeMap<String, usize> = defaults
            .iter()
            .flat_map(|c| c.quiet.by_reason.iter())
            .fold(BTreeMap::new(), |mut m, (r, n)| {
                *m.entry(r.clone()).or_default() += n;
                m
            });
        let _ = writeln!(md, "\nQuiet detections by reason: {}.", counts(&q_reasons));
        md.push_str(
            "\n### VMware and XenServer with `--silence-hypervisors KVM,VMware,XenServer`\n\n",
        );
        table(&mut md, opt_in, self, "matrix_optin_");
        let (o_caught, o_inj, _) = sum(opt_in.iter(), |c| &c.nic_down);
        let o_judged: usize = opt_in.iter().map(|c| c.nic_down.judged).sum();
        let o_ff: usize = opt_in.iter().map(|c| c.false_false).sum();
        let o_wait: usize = opt_in.iter().map(|c| c.waiting_silent).sum();
        let o_held: usize = opt_in.iter().map(CellResult::healthy_held).sum();
        let (oq, oq_n, oq_held) = sum(opt_in.iter(), |c| &c.quiet);
        let (oo, oo_n, oo_held) = sum(opt_in.iter(), |c| &c.one_nic_down);
        self.set("matrix_optin_nic_down_judged_incl_held", o_judged as f64);
        self.set("matrix_optin_nic_down_caught", o_caught as f64);
        self.set("matrix_optin_nic_down_injected", o_inj as f64);
        self.set("matrix_optin_false_false_total", o_ff as f64);
        self.set("matrix_optin_waiting_judged_silent", o_wait as f64);
        self.set("matrix_optin_healthy_held_total", o_held as f64);
        self.set("matrix_optin_quiet_detected", oq as f64);
        self.set("matrix_optin_quiet_total", oq_n as f64);
        self.set("matrix_optin_one_nic_down_detected", oo as f64);
        self.set("matrix_optin_one_nic_down_injected", oo_n as f64);
        let _ = writeln!(
            md,
            "\nWith the opt-in: nic-down published `False` **{o_caught} of {o_inj}**, judged silent \
             (published or held by the mass-failure guard) **{o_judged}**; quiet detected \
             **{oq}/{oq_n}** (+{oq_held} held); one-nic-down detected {oo}/{oo_n} (+{oo_held} held); \
             false `False` on healthy profiles: **{o_ff}** (waiting-for-endpoint judged silent \
             {o_wait}, the rest: see the cells), {o_held} more healthy VMs held by the guard. When \
             enough guests of a scope read silent, the guard (≥ 5 and ≥ 50 % of a scope within \
             10 min) holds the whole scope, real faults included. That is the documented \
             trade-off: VMware rows are whole KB/s and XenServer rows average rates, so a guest \
             sending under about 1 KB/s reads 0."
        );
        for c in opt_in.iter().filter(|c| c.false_false > 0) {
            let _ = writeln!(md, "- `{}`: {}", c.cell.label(), counts(&c.false_false_by));
        }
        let _ = writeln!(md, "\nWorst cell per metric with the opt-in:\n");
        for w in worst_cells(opt_in, |_| true) {
            let _ = writeln!(md, "- {w}");
        }
        self.sections.push(md);
    }

    /// Section 3d: the opt-in guest probe, with and without, at the default graces.
    pub fn add_probe(&mut self, r: &ProbeResults) {
        let g = Graces::default();
        let pg =
            capc_health_shim::verdict::probe::ProbeGraces::from_stats_interval(g.stats_interval);
        let limits = capc_health_shim::probe::ProbeLimits::default();
        let tick = capc_health_shim::probe::probe_tick(pg.spacing);
        let mut md = format!(
            "## 3d. Guest probe (opt-in: `arping` from the network's virtual router)\n\n\
             Each scope's checker gets a probe with the root-admin key (`runDiagnostics` jobs, \
             `listRouters`, `queryAsyncJobResult`; default limits: {} jobs per scope per minute, {} in \
             flight per prober, job timeout {} s, arping `{}`), paced from the {} s stats interval: {} \
             unanswered attempts {} s apart (plus flat traffic) give `False`, a reply is rechecked after \
             {} s. The controller's pacing is emulated: between cycles simulated time moves in {:.0} s \
             probe steps (`probe_tick`); when a step changes the evidence a cycle (poll + verdicts of \
             every scope) runs at once and the {} s interval restarts from there. Without the probe \
             the loop is section 2's. `check` sees no Nodes, so every VM counts as a Machine without a \
             Node for its whole life (the probe's cost here is an upper bound). Goal: nic-down p99 ≤ \
             {GOAL_P99_SECONDS:.0} s on every hypervisor, 0 false `False`.\n\n\
             ### Time from NIC-down to `False`\n\n\
             Section 2's nic-down fleet (10 scopes × 25 VMs, 200 faults at the same seeded times), \
             default graces; the goal rows give each scope a network of its own with its own virtual \
             router (a cluster's network); the twins of a hypervisor start at the same simulated \
             moment. The last rows put all 250 VMs on one shared network: one router, which runs \
             one diagnostics job at a time, for 250 Machines without a Node (a stress case: the \
             probe never starts a second job on a busy router, so it falls behind and the counters \
             judge as without it).\n\n\
             | hypervisor | probe | detected / injected | by ARP | p50 s | p90 s | p99 s | max s | missed | false False | held by guard | p99 ÷ without | cycles (early) |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            limits.per_scope_per_minute,
            limits.max_in_flight,
            limits.job_timeout.as_secs(),
            limits.arping_params,
            g.stats_interval.as_secs(),
            pg.attempts,
            pg.spacing.as_secs(),
            pg.recheck.as_secs(),
            tick.as_secs_f64(),
            SHIM_INTERVAL_SECS,
        );
        self.set("probe_nic_down_p99_goal_seconds", GOAL_P99_SECONDS);
        let pct = |v: &[f64], q: f64| {
            if v.is_empty() {
                "–".to_string()
            } else {
                format!("{:.0}", percentile(v, q))
            }
        };
        let row = |me: &mut Self, md: &mut String, t: &TimeResult, vs: Option<&TimeResult>| {
            let l = t.label();
            let l = if t.network_per_scope {
                l
            } else {
                format!("{l}_one_router")
            };
            me.set(&format!("probe_nic_down_injected_{l}"), t.injected as f64);
            me.set(
                &format!("probe_nic_down_detected_{l}"),
                t.seconds.len() as f64,
            );
            me.set(
                &format!("probe_nic_down_detected_by_arp_{l}"),
                t.by_probe as f64,
            );
            me.set(&format!("probe_nic_down_missed_{l}"), t.missed() as f64);
            me.set(
                &format!("probe_nic_down_false_false_{l}"),
                t.false_false as f64,
            );
            me.set(&format!("probe_nic_down_held_{l}"), t.held as f64);
            me.set(&format!("probe_nic_down_cycles_{l}"), t.cost.cycles as f64);
            me.set(
                &format!("probe_nic_down_early_cycles_{l}"),
                t.cost.early_cycles as f64,
            );
            me.set(&format!("probe_nic_down_wall_seconds_{l}"), t.wall_seconds);
            if !t.seconds.is_empty() {
                for (q, name) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99")] {
                    me.set(
                        &format!("probe_nic_down_{name}_seconds_{l}"),
                        percentile(&t.seconds, q),
                    );
                }
                me.set(
                    &format!("probe_nic_down_max_seconds_{l}"),
                    t.seconds.last().copied().unwrap_or(f64::NAN),
                );
            }
            let vs_ratio = match vs.filter(|w| !w.seconds.is_empty() && !t.seconds.is_empty()) {
                Some(w) => {
                    let x = percentile(&t.seconds, 0.99) / percentile(&w.seconds, 0.99);
                    me.set(
                        &format!(
                            "probe_nic_down_p99_ratio_with_vs_without_{}",
                            t.hypervisor.as_str().to_ascii_lowercase()
                        ),
                        x,
                    );
                    format!("{x:.2}")
                }
                None if vs.is_some() => "– (none without)".to_string(),
                None => "–".to_string(),
            };
            let _ =
                writeln!(
                md,
                "| {}{} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) |",
                t.hypervisor.as_str(),
                if t.network_per_scope { "" } else { ", one router for all 250" },
                if t.probe { "**with**" } else { "without" },
                t.seconds.len(),
                t.injected,
                t.by_probe,
                pct(&t.seconds, 0.5),
                pct(&t.seconds, 0.9),
                pct(&t.seconds, 0.99),
                pct(&t.seconds, 1.0),
                t.missed(),
                t.false_false,
                t.held,
                vs_ratio,
                t.cost.cycles,
                t.cost.early_cycles,
            );
        };
        for (without, with) in &r.times {
            row(self, &mut md, without, None);
            row(self, &mut md, with, Some(without));
            let met = !with.seconds.is_empty()
                && with.missed() == 0
                && percentile(&with.seconds, 0.99) <= GOAL_P99_SECONDS;
            self.set(
                &format!(
                    "probe_nic_down_p99_goal_met_{}",
                    with.hypervisor.as_str().to_ascii_lowercase()
                ),
                f64::from(u8::from(met)),
            );
        }
        for t in &r.shared_router {
            let without = r
                .times
                .iter()
                .find(|(w, _)| w.hypervisor == t.hypervisor)
                .map(|(w, _)| w);
            row(self, &mut md, t, without);
        }
        md.push('\n');
        for with in r.times.iter().map(|t| &t.1).chain(r.shared_router.iter()) {
            if !with.false_false_by_reason.is_empty() {
                let _ = writeln!(
                    md,
                    "- {} with the probe, false `False` by reason: {}.",
                    with.hypervisor.as_str(),
                    counts(&with.false_false_by_reason)
                );
            }
            if !with.slow.is_empty() {
                let _ = writeln!(
                    md,
                    "- {}{} with the probe: {} detections over {GOAL_P99_SECONDS:.0} s; the slowest:",
                    with.hypervisor.as_str(),
                    if with.network_per_scope { "" } else { " (one router for all)" },
                    with.slow.len()
                );
                for (secs, what) in with.slow.iter().take(3) {
                    let _ = writeln!(md, "  - {secs:.0} s, {what}");
                }
            }
        }
        if let Some((without, with)) = &r.precision {
            let _ = writeln!(
                md,
                "\n### Precision with the probe\n\n\
                 Section 3's fleet and seed (KVM, benign incidents, {} real faults) with {} of its \
                 {} VMs waiting for their control-plane endpoint (`GuestKind::Waiting`: alive, \
                 little traffic; every 20th VM, none of them slow-booting; in both columns here, \
                 not in section 3), with and without the probe.\n\n\
                 | probe | false `False` | by reason | of them waiting-for-endpoint | missed faults | held by guard | p50 s to False | p99 s to False | cycles (early) |\n\
                 |---|---:|---|---:|---:|---:|---:|---:|---:|",
                with.real_faults, with.waiting_vms, with.vms
            );
            for p in [without, with] {
                let l = if p.probe {
                    "with_probe"
                } else {
                    "without_probe"
                };
                self.set(
                    &format!("probe_precision_false_false_{l}"),
                    p.false_false as f64,
                );
                self.set(
                    &format!("probe_precision_waiting_false_false_{l}"),
                    p.waiting_false_false as f64,
                );
                self.set(&format!("probe_precision_missed_{l}"), p.missed as f64);
                self.set(&format!("probe_precision_held_{l}"), p.held as f64);
                self.set(
                    &format!("probe_precision_real_faults_{l}"),
                    p.real_faults as f64,
                );
                self.set(
                    &format!("probe_precision_waiting_vms_{l}"),
                    p.waiting_vms as f64,
                );
                for (reason, n) in &p.false_false_by_reason {
                    self.set(
                        &format!("probe_precision_false_false_{reason}_{l}"),
                        *n as f64,
                    );
                }
                if !p.seconds_to_false.is_empty() {
                    self.set(
                        &format!("probe_precision_p50_seconds_{l}"),
                        percentile(&p.seconds_to_false, 0.5),
                    );
                    self.set(
                        &format!("probe_precision_p99_seconds_{l}"),
                        percentile(&p.seconds_to_false, 0.99),
                    );
                }
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) |",
                    if p.probe { "**with**" } else { "without" },
                    p.false_false,
                    counts(&p.false_false_by_reason),
                    p.waiting_false_false,
                    p.missed,
                    p.held,
                    pct(&p.seconds_to_false, 0.5),
                    pct(&p.seconds_to_false, 0.99),
                    p.cost.cycles,
                    p.cost.early_cycles,
                );
            }
            let by_fault = |p: &PrecisionResult| {
                p.seconds_by_fault
                    .iter()
                    .map(|(k, v)| {
                        format!(
                            "{k} {}/{}",
                            percentile(v, 0.5).round(),
                            percentile(v, 0.99).round()
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            for p in [without, with] {
                let l = if p.probe {
                    "with_probe"
                } else {
                    "without_probe"
                };
                for (k, v) in &p.seconds_by_fault {
                    let k = k.replace('-', "_");
                    self.set(
                        &format!("probe_precision_p99_seconds_{k}_{l}"),
                        percentile(v, 0.99),
                    );
                }
            }
            let _ = writeln!(
                md,
                "\nSeconds to `False` by fault (p50/p99): without the probe {}; with it {}.\n\n\
                 Healthy VMs with another status/reason at some poll, with the probe: {}.",
                by_fault(without),
                by_fault(with),
                counts(&with.healthy_vms_by_other_reason)
            );
        }
        md.push_str(
            "\n### What the probe costs CloudStack\n\n\
             Calls the simulator answered over each run (warm-up and tail included), per hour per \
             1 000 Machines without a Node, and the probers' own counts (summed over the scopes).\n\n\
             The last two columns: every API call of the run (listings included) per hour per 1 000 \
             Machines, and that ÷ the same run without the probe (early cycles poll the listings \
             again).\n\n\
             | run | simulated h | Machines without a Node | runDiagnostics /h/1000 | queryAsyncJobResult /h/1000 | listRouters /h/1000 | jobs started | replies | no reply | no evidence | router lookups | skipped: budget | skipped: in-flight cap | all calls /h/1000 | all calls ÷ without probe |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let cost_row = |me: &mut Self,
                        md: &mut String,
                        name: &str,
                        c: &Cost,
                        base: Option<&Cost>| {
            let all = c.all_per_hour_per_1000();
            me.set(
                &format!("probe_cost_all_calls_per_hour_per_1000_machines_{name}"),
                all,
            );
            let vs = match base {
                Some(b) => {
                    let x = ratio(all, b.all_per_hour_per_1000());
                    me.set(
                        &format!("probe_cost_all_calls_ratio_with_vs_without_{name}"),
                        x,
                    );
                    format!("{x:.2}")
                }
                None => "–".to_string(),
            };
            for cmd in PROBE_COMMANDS {
                me.set(
                    &format!(
                        "probe_cost_{}_per_hour_per_1000_machines_{name}",
                        cmd.to_ascii_lowercase()
                    ),
                    c.per_hour_per_1000(cmd),
                );
            }
            for (k, v) in [
                ("jobs_started", c.jobs_started),
                ("replies", c.replies),
                ("no_replies", c.no_replies),
                ("no_evidence", c.no_evidence),
                ("router_lookups", c.router_lookups),
                ("skipped_for_budget", c.skipped_for_budget),
                ("skipped_in_flight_cap", c.skipped_in_flight_cap),
            ] {
                me.set(&format!("probe_counts_{k}_{name}"), v as f64);
            }
            me.set(
                &format!("probe_cost_simulated_hours_{name}"),
                c.sim_seconds / 3600.0,
            );
            let _ = writeln!(
                md,
                "| {name} | {:.2} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {all:.0} | {vs} |",
                c.sim_seconds / 3600.0,
                c.machines,
                c.per_hour_per_1000(PROBE_COMMANDS[0]),
                c.per_hour_per_1000(PROBE_COMMANDS[1]),
                c.per_hour_per_1000(PROBE_COMMANDS[2]),
                c.jobs_started,
                c.replies,
                c.no_replies,
                c.no_evidence,
                c.router_lookups,
                c.skipped_for_budget,
                c.skipped_in_flight_cap,
            );
        };
        for (without, with) in &r.times {
            let name = format!(
                "time_to_false_{}",
                with.hypervisor.as_str().to_ascii_lowercase()
            );
            cost_row(self, &mut md, &name, &with.cost, Some(&without.cost));
        }
        for t in &r.shared_router {
            let name = format!(
                "time_to_false_{}_one_router",
                t.hypervisor.as_str().to_ascii_lowercase()
            );
            cost_row(self, &mut md, &name, &t.cost, None);
        }
        if let Some((without, with)) = &r.precision {
            cost_row(self, &mut md, "precision", &with.cost, Some(&without.cost));
        }
        self.set("bench_probe_wall_seconds", r.wall_seconds);
        let _ = writeln!(md, "\nThis part took {:.0} s of wall time.", r.wall_seconds);
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
