//! Section 1b (issue 42 item 5): the CloudStack load the shim adds to CAPC's at 1 000 and
//! 10 000 Machines, from the controller users run — this part's release `capc-health-shim run`
//! and its CloudStack calls per poll cycle, counted from its own
//! `capc_health_cloudstack_calls_total` over the steady window of each steady-fleet row, in one
//! scope and in [`super::SCOPED`] — beside CAPC's steady calls per Machine-hour, counted per
//! key by the e2e (`target/e2e/cloudstack-load.json`, `make e2e-load`). The arithmetic is
//! `cloudstack_sim::load::controller_fleet_rows` (unit-tested there); it refuses a load file in
//! which CAPC made no steady calls, and so does this section: the bench fails rather than
//! leave the shares out.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{bail, Result};
use cloudstack_sim::load::{
    controller_fleet_rows, fleet_key, format_percent as pct, format_rate as num, ControllerCalls,
    FleetRow, Key, LoadFile, Phase, ShimSource, CONTROLLER_SECTION_HEADING, FLEET_SIZES,
    LOAD_COMMAND, LOAD_FILE,
};

pub const HEADING: &str = CONTROLLER_SECTION_HEADING;

/// What each key called in the e2e's steady window, and why (issue 42: the remaining steady
/// calls explained).
fn steady_calls_explained(f: &LoadFile) -> String {
    let by = |k: Key| {
        f.counts(k, Phase::Steady)
            .map(|c| {
                c.by_command
                    .iter()
                    .filter(|(_, n)| **n > 0.0)
                    .map(|(cmd, n)| format!("{cmd} {n:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "none".to_string())
    };
    let w = f.window(Phase::Steady);
    let cycles = w.scaled_seconds / f.shim_poll_interval_seconds;
    format!(
        "What each key called in the e2e's steady window ({:.0} s product time, every Machine with \
         its Node), and why:\n\n\
         - **CAPC**: {}. CAPC v0.6.1's CloudStackFailureDomain reconciler resolves the failure \
         domain's zone and network on every reconcile (`ResolveZone`, `ResolveNetworkForZone`, \
         controllers/cloudstackfailuredomain_controller.go:96-99), at least every \
         `--sync-period`: the load users already have. These follow failure domains, not \
         Machines (the e2e runs one cluster of {} Machines): CAPC's calls/h above, its per \
         Machine-hour × N, hold for fleets of clusters that size; a fleet of larger clusters has \
         fewer failure domains per Machine, CAPC makes fewer steady calls, and the shim's shares \
         above are then lower than its real share.\n\
         - **the shim's listing key**: {}. One `listVirtualMachines` page per scope per poll \
         interval ({:.0} intervals of {:.0} s in the window): with every Machine having its Node, \
         no statistics are asked (no usage history, no `vm_stats` rows). Per Machine-hour this is \
         large for the e2e's {} Machines and small for a fleet, whose pages hold 500 VMs each: \
         hence the table above from the controller's own calls per cycle.\n\
         - **the guest probe's key**: {}. The probe asks only about Machines without a Node \
         (`verdict::probe::probe_wanted`); between cycles it re-reads each Machine from the \
         controller's watch at every step, and it stops reading a job whose Machine got its Node \
         meanwhile (controller_probe `once_every_machine_has_its_node_the_probe_calls_nothing`). \
         Anything left here was started in the instant between the API server recording a \
         `nodeRef` and the shim's watch delivering it; it does not recur, so at N Machines the \
         probe's steady calls per hour are its per Machine-hour rate × N only as an upper bound of \
         a window that opens right at ready.\n",
        w.scaled_seconds,
        by(Key::Capc),
        f.machines,
        by(Key::Shim),
        cycles,
        f.shim_poll_interval_seconds,
        f.machines,
        by(Key::ShimProbe),
    )
}

fn source(s: ShimSource) -> String {
    match s {
        ShimSource::Measured {
            calls_per_cycle, ..
        } => format!("controller: {} calls/cycle", num(calls_per_cycle)),
        ShimSource::PerMachineHour => "per Machine-hour × N (not measured)".to_string(),
    }
}

/// The section and its report.json values; an error when CAPC made no steady calls.
pub fn section(
    measured: &[ControllerCalls],
    scoped: u64,
) -> Result<(BTreeMap<String, f64>, String)> {
    let path =
        std::env::var("CAPC_BENCH_CLOUDSTACK_LOAD").unwrap_or_else(|_| LOAD_FILE.to_string());
    let mut v = BTreeMap::new();
    let head = format!("{HEADING}\n\n");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok((
            v,
            format!("{head}No figures: `{path}` does not exist (`{LOAD_COMMAND}` writes it).\n"),
        ));
    };
    let f = match LoadFile::parse(&text) {
        Ok(f) => f,
        Err(e) => bail!("`{path}` cannot be read: {e}"),
    };
    let scopes = [1, scoped];
    let rows = controller_fleet_rows(
        &f,
        measured,
        &FLEET_SIZES,
        &scopes,
        f.shim_poll_interval_seconds,
    )
    .map_err(|e| anyhow::anyhow!("section 1b from `{path}`: {e}"))?;
    let find = |n: u64, s: u64, p: Phase| -> &FleetRow {
        rows.iter()
            .find(|r| r.calls.machines == n && r.scopes == s && r.phase == p)
            .expect("a row per size, scope count and phase")
    };
    for r in &rows {
        let (p, n, s, c) = (r.phase, r.calls.machines, r.scopes, &r.calls);
        let key = |base: &str| fleet_key(base, p, n, s);
        v.insert(key("cloudstack_calls_per_hour_capc"), c.capc);
        v.insert(key("cloudstack_calls_per_hour_shim"), c.shim);
        v.insert(key("cloudstack_calls_per_hour_shim_probe"), c.probe);
        v.insert(
            key("cloudstack_calls_per_machine_hour_shim"),
            c.shim / n as f64,
        );
        if let Some(x) = c.shim_percent() {
            v.insert(key("shim_added_cloudstack_calls_percent_of_capc"), x);
        }
        if let Some(x) = c.shim_and_probe_percent() {
            v.insert(
                key("shim_and_probe_added_cloudstack_calls_percent_of_capc"),
                x,
            );
        }
    }
    let mut md = format!(
        "{head}The shim's CloudStack calls per hour at N Machines from the controller users run: \
         section 4's release `capc-health-shim run` against a real kube-apiserver, every Machine \
         with its Node, its calls per poll cycle counted from its own \
         `capc_health_cloudstack_calls_total` over the steady window, with the Machines in 1 \
         scope and in {scoped} (one CloudStack project per cluster), × 3600 ÷ {:.0} s (the \
         default poll interval; a cycle's calls do not depend on the interval). CAPC and the \
         probe: their steady calls per Machine-hour in the e2e (section 1) × N. CAPC's steady \
         calls are asserted (the bench fails without them: every share below is relative to \
         them). Provisioning, and any size the controller part did not measure: the shim's per \
         Machine-hour × N, an upper bound (its listing grows with pages of 500 VMs per scope, \
         not with Machines).\n\n\
         | Machines | window | CAPC calls/h | shim calls/h, 1 scope | {scoped} scopes | shim per Machine-hour, 1 scope | {scoped} scopes | probe calls/h | shim ÷ CAPC, 1 scope | {scoped} scopes | shim + probe ÷ CAPC, 1 scope | {scoped} scopes | shim source, 1 scope | {scoped} scopes |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n",
        f.shim_poll_interval_seconds
    );
    for n in FLEET_SIZES {
        for p in Phase::ALL {
            let (one, many) = (find(n, 1, p).calls, find(n, scoped, p).calls);
            let _ = writeln!(
                md,
                "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                p.as_str(),
                num(one.capc),
                num(one.shim),
                num(many.shim),
                num(one.shim / n as f64),
                num(many.shim / n as f64),
                num(one.probe),
                pct(one.shim_percent()),
                pct(many.shim_percent()),
                pct(one.shim_and_probe_percent()),
                pct(many.shim_and_probe_percent()),
                source(one.shim_source),
                source(many.shim_source),
            );
        }
    }
    let _ = writeln!(
        md,
        "\nreport.json: the keys of one scope as before (`shim_added_cloudstack_calls_percent_of_capc_steady_1000_machines`, \
         `cloudstack_calls_per_hour_shim_steady_10000_machines`, …) and the same with `_{scoped}_scopes` \
         appended; `cloudstack_calls_per_machine_hour_shim_…` the shim's per Machine-hour at N.\n"
    );
    md.push_str(&steady_calls_explained(&f));
    Ok((v, md))
}

/// The controller's calls per cycle as the cost part wrote them (`controller.json`, merged into
/// `report.json`)
/// (`cloudstack_calls_per_cycle_<N>_machines[_<S>_scopes]`), at the fleet sizes of section 1b.
fn measured_in(values: &BTreeMap<String, f64>, scoped: u64) -> Vec<ControllerCalls> {
    let mut out = Vec::new();
    for n in FLEET_SIZES {
        for s in [1, scoped] {
            let suffix = if s > 1 {
                format!("_{s}_scopes")
            } else {
                String::new()
            };
            if let Some(c) = values.get(&format!("cloudstack_calls_per_cycle_{n}_machines{suffix}"))
            {
                out.push(ControllerCalls {
                    machines: n,
                    scopes: s,
                    calls_per_cycle: *c,
                });
            }
        }
    }
    out
}

/// Section 1b from the calls per cycle merged into `report.json` by the last cost runs (a
/// partial run, `CAPC_BENCH_SCOPED_SIZES` alone say, adds to the rows of an earlier one) and the
/// load file, merged into the report again.
pub fn again(scoped: u64) -> Result<()> {
    let path = std::path::Path::new(super::report::DIR).join("report.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("{}: {e} (the cost part merges into it)", path.display()))?;
    let values: BTreeMap<String, f64> = serde_json::from_str(&text)?;
    let measured = measured_in(&values, scoped);
    let (v, md) = section(&measured, scoped)?;
    super::report::write_and_merge("controller-users-load.json", &v, HEADING, &md)?;
    println!("{md}");
    Ok(())
}
