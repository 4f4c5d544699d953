//! Section 1: CloudStack load against what users run (issue 27, item 5). Users already run
//! stock CAPC v0.6.1, whose reconcilers call CloudStack for every Machine every
//! `--sync-period`; the question is what the shim (and its guest probe) adds to that. The e2e
//! (`make e2e-load`, `TestCloudStackLoad`) counts each key's calls, `vm_stats` rows and async
//! jobs from cloudstack-sim's per-account accounting and writes `target/e2e/cloudstack-load.json`;
//! this section turns it into rates per Machine-hour (the arithmetic is `cloudstack_sim::load`,
//! unit-tested there), and fails when CAPC made no steady calls (every share is relative to
//! them). The calls at 1 000 and 10 000 Machines are section 1b's, written by the controller
//! part from the controller's measured calls per cycle; this part holds its place. Without the
//! file it says so and shows nothing.

use std::fmt::Write as _;

use cloudstack_sim::load::{
    capc_steady_calls, format_percent as pct, format_rate as num, per_hour_for_machines, Key,
    LoadFile, Measure, Phase, Stack, CONTROLLER_SECTION_HEADING, FLEET_SIZES, LOAD_COMMAND,
};

use crate::load::LoadRow;
use crate::report::Report;

const HEADING: &str = "## 1. CloudStack load against what users run\n\n";

/// "the shim adds X % to the <measure> that CAPC already makes (steady; Y % during
/// provisioning)", or what stands instead when CAPC has none to add to.
fn headline(m: Measure, steady: &Stack, prov: &Stack, with_probe: bool) -> String {
    let who = if with_probe {
        "the shim with its guest probe"
    } else {
        "the shim"
    };
    let what = match m {
        Measure::Calls => "CloudStack calls",
        other => other.label(),
    };
    let verb = match m {
        Measure::Calls => "makes",
        Measure::StatsRows => "has CloudStack read",
        Measure::AsyncJobs => "has CloudStack queue",
    };
    let added = |st: &Stack| st.shim.get(m) + if with_probe { st.probe.get(m) } else { 0.0 };
    let none = |st: &Stack| format!("CAPC none, {who} {}", num(added(st)));
    match (
        steady.added_percent(m, with_probe),
        prov.added_percent(m, with_probe),
    ) {
        (Some(s), Some(p)) => format!(
            "{who} adds {} to the {what} that CAPC already {verb} (steady; {} during provisioning)",
            pct(Some(s)),
            pct(Some(p))
        ),
        (Some(s), None) => format!(
            "{who} adds {} to the {what} that CAPC already {verb} in steady state (during \
             provisioning: {} per Machine-hour)",
            pct(Some(s)),
            none(prov)
        ),
        (None, Some(p)) => format!(
            "{who} adds {} to the {what} that CAPC already {verb} during provisioning (steady \
             state: {} per Machine-hour)",
            pct(Some(p)),
            none(steady)
        ),
        (None, None) => format!(
            "CAPC {verb} no {what} in either window; {who} {verb} {} per Machine-hour steady and \
             {} during provisioning",
            num(added(steady)),
            num(added(prov))
        ),
    }
}

impl Report {
    /// Section 1 from `path` (the e2e's `cloudstack-load.json`); `rows` are section 1a's
    /// measurements of the shim's poller, used for the fleet sizes they cover.
    pub fn add_users_load(&mut self, path: &str, rows: &[LoadRow]) {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(_) => {
                self.push_section(format!(
                    "{HEADING}No figures: `{path}` does not exist (`{LOAD_COMMAND}` writes it: CAPC's, \
                     the shim's and the probe's CloudStack calls counted per key in the e2e).\n"
                ));
                self.push_controller_placeholder();
                return;
            }
        };
        let f = match LoadFile::parse(&text) {
            Ok(f) => f,
            Err(e) => {
                self.push_section(format!(
                    "{HEADING}No figures: `{path}` cannot be read ({e}); `{LOAD_COMMAND}` writes it.\n"
                ));
                self.push_controller_placeholder();
                return;
            }
        };
        // Every share below is relative to CAPC's steady calls: without them the bench fails
        // rather than leave the percentages out.
        if let Err(e) = capc_steady_calls(&f) {
            panic!("section 1 from `{path}`: {e}");
        }
        let steady = f.stack(Phase::Steady);
        let prov = f.stack(Phase::Provisioning);
        for p in Phase::ALL {
            let st = f.stack(p);
            let ph = p.as_str();
            for m in Measure::ALL {
                let mk = m.key();
                for (k, r) in [
                    (Key::Capc, st.capc),
                    (Key::Shim, st.shim),
                    (Key::ShimProbe, st.probe),
                ] {
                    self.set(
                        &format!("cloudstack_{mk}_per_machine_hour_{}_{ph}", k.as_str()),
                        r.get(m),
                    );
                }
                // Undefined (CAPC has none of it) stays out rather than as a made-up number.
                if let Some(x) = st.added_percent(m, false) {
                    self.set(
                        &format!("shim_added_cloudstack_{mk}_percent_of_capc_{ph}"),
                        x,
                    );
                }
                if let Some(x) = st.added_percent(m, true) {
                    self.set(
                        &format!("shim_and_probe_added_cloudstack_{mk}_percent_of_capc_{ph}"),
                        x,
                    );
                }
            }
            self.set(
                &format!("cloudstack_load_machine_hours_{ph}"),
                f.window(p).machine_hours,
            );
        }
        self.set("cloudstack_load_e2e_machines", f.machines as f64);
        self.set(
            "cloudstack_load_capc_sync_period_seconds",
            f.capc_sync_period_seconds,
        );

        let w = |p: Phase| f.window(p);
        let mut md = format!(
            "{HEADING}What users run is stock CAPC v0.6.1, which reconciles every Machine and calls \
             CloudStack each time (at least every `--sync-period`, {:.0} s by default). The e2e \
             (`{LOAD_COMMAND}`, CAPI {}) ran one cluster of {} Machines alone on cloudstack-sim with \
             the shim (poll interval {:.0} s, its default) and its guest probe, and the simulator \
             counted every request per API key's account: CAPC's key, the shim's read-only listing \
             key, the probe's key. Rates are per Machine-hour of product time (real seconds ÷ the \
             time scale {}): provisioning {:.0} s real = {:.0} s product = {:.3} Machine-hours; steady \
             {:.0} s real = {:.0} s product = {:.3} Machine-hours.\n\n",
            f.capc_sync_period_seconds,
            if f.capi_version.is_empty() {
                "?"
            } else {
                f.capi_version.as_str()
            },
            f.machines,
            f.shim_poll_interval_seconds,
            f.time_scale,
            w(Phase::Provisioning).real_seconds,
            w(Phase::Provisioning).scaled_seconds,
            w(Phase::Provisioning).machine_hours,
            w(Phase::Steady).real_seconds,
            w(Phase::Steady).scaled_seconds,
            w(Phase::Steady).machine_hours,
        );
        for m in Measure::ALL {
            let _ = writeln!(
                md,
                "- **{}.**",
                capitalize(&headline(m, &steady, &prov, false))
            );
            let _ = writeln!(
                md,
                "  With the probe: {}.",
                headline(m, &steady, &prov, true)
            );
        }
        md.push_str(
            "\n| per Machine-hour | calls, steady | calls, provisioning | `vm_stats` rows, steady | \
             `vm_stats` rows, provisioning | async jobs, steady | async jobs, provisioning |\n\
             |---|---:|---:|---:|---:|---:|---:|\n",
        );
        let (rs, rp) = (steady.rows(), prov.rows());
        for ((name, s), (_, p)) in rs.iter().zip(rp.iter()) {
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {} | {} | {} | {} |",
                num(s.calls),
                num(p.calls),
                num(s.stats_rows),
                num(p.stats_rows),
                num(s.async_jobs),
                num(p.async_jobs)
            );
        }
        let _ = writeln!(
            md,
            "\nRows are cumulative (CAPC alone, then with the shim's key, then with the probe's \
             too); report.json carries each key alone (`cloudstack_calls_per_machine_hour_capc_steady`, \
             `…_shim_…`, `…_shim_probe_…`) and the shares (`shim_added_cloudstack_calls_percent_of_capc_…`, \
             `shim_and_probe_added_…`)."
        );
        if let Some(c) = f.shim_calls_per_cycle(Phase::Steady) {
            self.set("cloudstack_load_e2e_shim_calls_per_cycle_steady", c);
            let _ = writeln!(
                md,
                "\nThe e2e's shim made {} calls per poll cycle in steady state (its calls ÷ \
                 (product seconds ÷ {:.0} s)); section 1a's poller made {} per cycle for 100 VMs in \
                 1 scope.",
                num(c),
                f.shim_poll_interval_seconds,
                rows.iter()
                    .find(|r| r.vms == 100 && r.scopes == 1)
                    .map_or("–".to_string(), |r| num(r.shim_calls_per_cycle))
            );
        }
        md.push_str("\nBy command (counts over each window):\n\n");
        for k in Key::ALL {
            for p in Phase::ALL {
                let by = f
                    .counts(k, p)
                    .map(|c| {
                        c.by_command
                            .iter()
                            .filter(|(_, n)| **n > 0.0)
                            .map(|(cmd, n)| format!("{cmd} {n:.0}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default();
                let by = if by.is_empty() { "none" } else { &by };
                let _ = writeln!(md, "- {} {}: {by}", k.as_str(), p.as_str());
            }
        }
        if !f.note.is_empty() {
            let _ = writeln!(md, "\nThe e2e's note: {}", f.note);
        }

        // The extrapolation of calls is section 1b's, from the controller's measured calls per
        // cycle (benches/controller); until that part runs, its place says so.
        md.push_str(
            "\nCalls at 1 000 and 10 000 Machines: section 1b, from the controller users run \
             (`make bench`'s controller part measures its calls per cycle in 1 and 10 scopes).",
        );
        md.push_str(
            "\n\n`vm_stats` rows and async jobs per hour at N Machines, per Machine-hour × N for every \
             key (the shim reads rows only for Machines without a Node, the probe queues jobs only \
             for them, so both grow with Machines):\n\n\
             | Machines | window | CAPC rows/h | shim + probe rows/h | CAPC jobs/h | shim + probe jobs/h |\n\
             |---:|---|---:|---:|---:|---:|\n",
        );
        for n in FLEET_SIZES {
            for p in Phase::ALL {
                let st = f.stack(p);
                let at = |x: f64| per_hour_for_machines(x, n);
                let _ = writeln!(
                    md,
                    "| {n} | {} | {} | {} | {} | {} |",
                    p.as_str(),
                    num(at(st.capc.stats_rows)),
                    num(at(st.shim.stats_rows + st.probe.stats_rows)),
                    num(at(st.capc.async_jobs)),
                    num(at(st.shim.async_jobs + st.probe.async_jobs)),
                );
            }
        }
        self.push_section(md);
        self.push_controller_placeholder();
    }

    /// Section 1b's place, until the controller part (benches/controller) writes it there.
    fn push_controller_placeholder(&mut self) {
        self.push_section(format!(
            "{CONTROLLER_SECTION_HEADING}\n\nNot measured yet: `make bench`'s controller part \
             (`cargo bench --bench controller`) measures the controller's CloudStack calls per \
             cycle at 1 000 and 10 000 Machines in 1 and 10 scopes and writes this section.\n"
        ));
    }
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}
