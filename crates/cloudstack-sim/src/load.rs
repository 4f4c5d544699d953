//! The per-account load read back: `target/e2e/cloudstack-load.json`, which the e2e's
//! `TestCloudStackLoad` writes from `GET /sim/calls` `by_account` (CAPC's key, the shim's,
//! the shim's guest probe's; steady state and provisioning), and the arithmetic `make bench`
//! does with it — rates per Machine-hour, what the shim adds to CAPC's load in percent, and the
//! extrapolation to a fleet of N Machines (issue 27, item 5).
//!
//! It lives beside the accounting whose counts it reads so that `cargo test` covers it: the
//! benches (`benches/scale`, which renders the table) are built but never tested. Pure: no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

/// Where the e2e writes the file, relative to the workspace root.
pub const LOAD_FILE: &str = "target/e2e/cloudstack-load.json";
/// What produces [`LOAD_FILE`].
pub const LOAD_COMMAND: &str = "make e2e-load";
/// The heading of `make bench`'s report section that extrapolates [`LOAD_FILE`] with the
/// controller's measured calls per cycle: written by the controller part (benches/controller),
/// held in place by the scale part (benches/scale) until then.
pub const CONTROLLER_SECTION_HEADING: &str =
    "## 1b. CloudStack load at 1 000 and 10 000 Machines, from the controller";
/// Fleet sizes of that extrapolation.
pub const FLEET_SIZES: [u64; 2] = [1_000, 10_000];

/// One key's counts over one window.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Counts {
    pub calls: f64,
    pub stats_rows: f64,
    pub async_jobs: f64,
    /// `null` reads as empty: the e2e (Go) writes a key without calls in a window that way.
    #[serde(deserialize_with = "null_as_empty")]
    pub by_command: BTreeMap<String, f64>,
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f64>, D::Error> {
    Ok(Option::<BTreeMap<String, f64>>::deserialize(d)?.unwrap_or_default())
}

/// One window of the run: real and product (scaled) seconds, and the Machine-hours it held in
/// product time (Machines × scaled seconds ÷ 3600).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
pub struct Window {
    pub real_seconds: f64,
    pub scaled_seconds: f64,
    pub machine_hours: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
pub struct Windows {
    pub provisioning: Window,
    pub steady: Window,
}

/// `target/e2e/cloudstack-load.json`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LoadFile {
    #[serde(default)]
    pub capi_version: String,
    #[serde(default)]
    pub time_scale: f64,
    pub machines: u64,
    /// CAPC's `--sync-period` default, unscaled (the e2e runs CAPC with it, scaled).
    pub capc_sync_period_seconds: f64,
    /// The shim's default `--poll-interval`, unscaled.
    pub shim_poll_interval_seconds: f64,
    pub windows: Windows,
    /// `capc` / `shim` / `shim_probe` → `provisioning` / `steady` → counts.
    pub keys: BTreeMap<String, BTreeMap<String, Counts>>,
    #[serde(default)]
    pub note: String,
}

/// A window of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Steady,
    Provisioning,
}

impl Phase {
    pub const ALL: [Phase; 2] = [Phase::Steady, Phase::Provisioning];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Steady => "steady",
            Phase::Provisioning => "provisioning",
        }
    }
}

/// Whose key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// CAPC v0.6.1's own key: what users already run.
    Capc,
    /// The shim's read-only listing key.
    Shim,
    /// The shim's guest-probe key.
    ShimProbe,
}

impl Key {
    pub const ALL: [Key; 3] = [Key::Capc, Key::Shim, Key::ShimProbe];

    pub fn as_str(self) -> &'static str {
        match self {
            Key::Capc => "capc",
            Key::Shim => "shim",
            Key::ShimProbe => "shim_probe",
        }
    }
}

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    Calls,
    StatsRows,
    AsyncJobs,
}

impl Measure {
    pub const ALL: [Measure; 3] = [Measure::Calls, Measure::StatsRows, Measure::AsyncJobs];

    /// The name inside report keys: `cloudstack_<this>_per_machine_hour_…`.
    pub fn key(self) -> &'static str {
        match self {
            Measure::Calls => "calls",
            Measure::StatsRows => "stats_rows",
            Measure::AsyncJobs => "async_jobs",
        }
    }

    /// For prose: `calls`, `vm_stats rows`, `async jobs`.
    pub fn label(self) -> &'static str {
        match self {
            Measure::Calls => "calls",
            Measure::StatsRows => "`vm_stats` rows",
            Measure::AsyncJobs => "async jobs",
        }
    }

    pub fn of(self, c: &Counts) -> f64 {
        match self {
            Measure::Calls => c.calls,
            Measure::StatsRows => c.stats_rows,
            Measure::AsyncJobs => c.async_jobs,
        }
    }
}

/// A rate for the load report, with as many digits as it needs ("–" when undefined).
pub fn format_rate(x: f64) -> String {
    if !x.is_finite() {
        "–".to_string()
    } else if x == 0.0 {
        "0".to_string()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

/// A share for the load report: two decimals under 1 %, one above ("–" when undefined).
pub fn format_percent(x: Option<f64>) -> String {
    match x {
        None => "–".to_string(),
        Some(p) if p != 0.0 && p.abs() < 1.0 => format!("{p:.2} %"),
        Some(p) => format!("{p:.1} %"),
    }
}

/// `count` over `machine_hours` (none when the window held no Machine-hours).
pub fn per_machine_hour(count: f64, machine_hours: f64) -> Option<f64> {
    (machine_hours.is_finite() && machine_hours > 0.0 && count.is_finite())
        .then(|| count / machine_hours)
}

/// `added` as a percentage of `base` (none when the base is zero: nothing to add to).
pub fn percent_of(added: f64, base: f64) -> Option<f64> {
    (base.is_finite() && base > 0.0 && added.is_finite()).then(|| 100.0 * added / base)
}

/// Per hour for `machines` Machines of a load that grows with each Machine (CAPC reconciles
/// every Machine on its own): per Machine-hour × N.
pub fn per_hour_for_machines(per_machine_hour: f64, machines: u64) -> f64 {
    per_machine_hour * machines as f64
}

/// Per hour of a poller making `calls_per_cycle` calls every `interval_seconds` (the shim's
/// polling, measured at a fleet size: its calls grow with pages per scope, not Machines).
pub fn per_hour_of_cycles(calls_per_cycle: f64, interval_seconds: f64) -> Option<f64> {
    (interval_seconds > 0.0).then(|| calls_per_cycle * 3600.0 / interval_seconds)
}

/// Per Machine-hour, by key: one phase of the file.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    pub calls: f64,
    pub stats_rows: f64,
    pub async_jobs: f64,
}

impl Rates {
    pub fn get(&self, m: Measure) -> f64 {
        match m {
            Measure::Calls => self.calls,
            Measure::StatsRows => self.stats_rows,
            Measure::AsyncJobs => self.async_jobs,
        }
    }

    pub fn plus(&self, o: &Rates) -> Rates {
        Rates {
            calls: self.calls + o.calls,
            stats_rows: self.stats_rows + o.stats_rows,
            async_jobs: self.async_jobs + o.async_jobs,
        }
    }
}

/// One phase's rates of the three keys.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stack {
    pub capc: Rates,
    pub shim: Rates,
    pub probe: Rates,
}

impl Stack {
    /// The table's rows, cumulative: CAPC alone, + the shim, + the shim and its probe.
    pub fn rows(&self) -> [(&'static str, Rates); 3] {
        let with_shim = self.capc.plus(&self.shim);
        [
            ("CAPC alone", self.capc),
            ("+ shim", with_shim),
            ("+ shim + probe", with_shim.plus(&self.probe)),
        ]
    }

    /// What the shim (with its probe: `with_probe`) adds to CAPC's `m`, in percent of CAPC's.
    pub fn added_percent(&self, m: Measure, with_probe: bool) -> Option<f64> {
        let probe = if with_probe { self.probe.get(m) } else { 0.0 };
        percent_of(self.shim.get(m) + probe, self.capc.get(m))
    }
}

impl LoadFile {
    /// Parses and checks the file: every key and phase present, windows with Machine-hours.
    pub fn parse(text: &str) -> Result<Self, String> {
        let f: LoadFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        for p in Phase::ALL {
            let w = f.window(p);
            if !(w.machine_hours.is_finite() && w.machine_hours > 0.0) {
                return Err(format!(
                    "windows.{}.machine_hours is {}, not a positive number",
                    p.as_str(),
                    w.machine_hours
                ));
            }
            for k in Key::ALL {
                if f.counts(k, p).is_none() {
                    return Err(format!("keys.{}.{} is missing", k.as_str(), p.as_str()));
                }
            }
        }
        if f.machines == 0 {
            return Err("machines is 0".into());
        }
        Ok(f)
    }

    pub fn window(&self, p: Phase) -> Window {
        match p {
            Phase::Steady => self.windows.steady,
            Phase::Provisioning => self.windows.provisioning,
        }
    }

    pub fn counts(&self, k: Key, p: Phase) -> Option<&Counts> {
        self.keys.get(k.as_str())?.get(p.as_str())
    }

    /// One key's rates per Machine-hour in one phase (zeros when absent).
    pub fn rates(&self, k: Key, p: Phase) -> Rates {
        let mh = self.window(p).machine_hours;
        let c = self.counts(k, p).cloned().unwrap_or_default();
        let r = |x: f64| per_machine_hour(x, mh).unwrap_or(0.0);
        Rates {
            calls: r(c.calls),
            stats_rows: r(c.stats_rows),
            async_jobs: r(c.async_jobs),
        }
    }

    pub fn stack(&self, p: Phase) -> Stack {
        Stack {
            capc: self.rates(Key::Capc, p),
            shim: self.rates(Key::Shim, p),
            probe: self.rates(Key::ShimProbe, p),
        }
    }

    /// The shim's listing calls per poll cycle in a phase: its calls ÷ (product seconds ÷ its
    /// poll interval). Compares the e2e's shim with the bench's poller at the same size.
    pub fn shim_calls_per_cycle(&self, p: Phase) -> Option<f64> {
        let cycles = self.window(p).scaled_seconds / self.shim_poll_interval_seconds;
        let calls = self.counts(Key::Shim, p)?.calls;
        (cycles.is_finite() && cycles > 0.0).then(|| calls / cycles)
    }
}

/// Where a fleet-size figure of the shim comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ShimSource {
    /// The bench's poller at that fleet size: calls per cycle at the shim's interval.
    Measured {
        calls_per_cycle: f64,
        interval_seconds: f64,
    },
    /// The e2e's per Machine-hour × N (an upper bound for the listing key: its calls grow
    /// with pages of 500 VMs per scope, not with Machines).
    PerMachineHour,
}

/// One row of the extrapolation: calls per hour for `machines` Machines.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetCalls {
    pub machines: u64,
    pub capc: f64,
    pub shim: f64,
    pub probe: f64,
    pub shim_source: ShimSource,
}

impl FleetCalls {
    pub fn shim_percent(&self) -> Option<f64> {
        percent_of(self.shim, self.capc)
    }

    pub fn shim_and_probe_percent(&self) -> Option<f64> {
        percent_of(self.shim + self.probe, self.capc)
    }
}

/// Calls per hour at `machines` Machines in one phase: CAPC and the probe per Machine-hour ×
/// N; the shim from `source`.
pub fn fleet_calls(stack: &Stack, machines: u64, source: ShimSource) -> FleetCalls {
    let shim = match source {
        ShimSource::Measured {
            calls_per_cycle,
            interval_seconds,
        } => per_hour_of_cycles(calls_per_cycle, interval_seconds)
            .unwrap_or_else(|| per_hour_for_machines(stack.shim.calls, machines)),
        ShimSource::PerMachineHour => per_hour_for_machines(stack.shim.calls, machines),
    };
    FleetCalls {
        machines,
        capc: per_hour_for_machines(stack.capc.calls, machines),
        shim,
        probe: per_hour_for_machines(stack.probe.calls, machines),
        shim_source: source,
    }
}

/// The base of every share of CAPC's load: CAPC's steady calls per Machine-hour. An error when
/// CAPC made none — every percentage would be undefined, and a report that silently left them
/// out would read as if the shim added nothing.
pub fn capc_steady_calls(f: &LoadFile) -> Result<f64, String> {
    let w = f.window(Phase::Steady);
    let calls = f.counts(Key::Capc, Phase::Steady).map_or(0.0, |c| c.calls);
    let rate = f.rates(Key::Capc, Phase::Steady).calls;
    if calls > 0.0 && rate.is_finite() && rate > 0.0 {
        Ok(rate)
    } else {
        Err(format!(
            "CAPC's key made {calls} CloudStack calls in the steady window ({:.0} s real, {:.3} \
             Machine-hours): no base for the shim's share; `{LOAD_COMMAND}` must count CAPC at work",
            w.real_seconds, w.machine_hours
        ))
    }
}

/// The controller's CloudStack calls per poll cycle at a fleet size and scope count, measured
/// by `make bench`'s controller part (the release `capc-health-shim run` against a real
/// kube-apiserver, every Machine with its Node).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControllerCalls {
    pub machines: u64,
    pub scopes: u64,
    pub calls_per_cycle: f64,
}

/// One row of the extrapolation: `scopes` scopes, one phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetRow {
    pub scopes: u64,
    pub phase: Phase,
    pub calls: FleetCalls,
}

/// A report key of the extrapolation: `<base>_<phase>_<N>_machines`, and `_<S>_scopes` after
/// it for more than one scope (the keys of one scope are those of the reports before scopes).
pub fn fleet_key(base: &str, phase: Phase, machines: u64, scopes: u64) -> String {
    let k = format!("{base}_{}_{machines}_machines", phase.as_str());
    if scopes > 1 {
        format!("{k}_{scopes}_scopes")
    } else {
        k
    }
}

/// The extrapolation to every size × scope count × phase. Steady: the shim from the
/// controller's measured calls per cycle at that size and scope count, at `interval_seconds`
/// (the shim's default poll interval; its listing grows with pages of 500 VMs per scope, not
/// with Machines), CAPC and the probe per Machine-hour × N. Provisioning, and a steady row the
/// controller part did not measure: per Machine-hour × N (an upper bound for the shim).
/// Refused when CAPC made no steady calls ([`capc_steady_calls`]).
pub fn controller_fleet_rows(
    f: &LoadFile,
    measured: &[ControllerCalls],
    sizes: &[u64],
    scopes: &[u64],
    interval_seconds: f64,
) -> Result<Vec<FleetRow>, String> {
    capc_steady_calls(f)?;
    let mut rows = Vec::new();
    for &n in sizes {
        for &s in scopes {
            for phase in Phase::ALL {
                let m = measured
                    .iter()
                    .find(|m| m.machines == n && m.scopes == s)
                    .filter(|_| phase == Phase::Steady);
                let source = match m {
                    Some(m) => ShimSource::Measured {
                        calls_per_cycle: m.calls_per_cycle,
                        interval_seconds,
                    },
                    None => ShimSource::PerMachineHour,
                };
                rows.push(FleetRow {
                    scopes: s,
                    phase,
                    calls: fleet_calls(&f.stack(phase), n, source),
                });
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3 Machines; steady 1 200 product seconds (1 Machine-hour), provisioning 600 s (0.5).
    const SAMPLE: &str = r#"{
      "capi_version": "v1.9.6", "time_scale": 0.1, "machines": 3,
      "capc_sync_period_seconds": 60, "shim_poll_interval_seconds": 30,
      "windows": {
        "provisioning": {"real_seconds": 60, "scaled_seconds": 600, "machine_hours": 0.5},
        "steady": {"real_seconds": 120, "scaled_seconds": 1200, "machine_hours": 1.0}
      },
      "keys": {
        "capc": {
          "provisioning": {"calls": 400, "stats_rows": 0, "async_jobs": 6,
                           "by_command": {"deployVirtualMachine": 3}},
          "steady": {"calls": 200, "stats_rows": 0, "async_jobs": 0, "by_command": {}}
        },
        "shim": {
          "provisioning": {"calls": 20, "stats_rows": 30, "async_jobs": 0, "by_command": {}},
          "steady": {"calls": 40, "stats_rows": 0, "async_jobs": 0, "by_command": {}}
        },
        "shim_probe": {
          "provisioning": {"calls": 10, "stats_rows": 0, "async_jobs": 3, "by_command": {}},
          "steady": {"calls": 0, "stats_rows": 0, "async_jobs": 0, "by_command": {}}
        }
      },
      "note": "sample"
    }"#;

    #[test]
    fn rates_are_per_machine_hour_of_product_time() {
        let f = LoadFile::parse(SAMPLE).unwrap();
        assert_eq!(f.machines, 3);
        let s = f.stack(Phase::Steady);
        assert_eq!(s.capc.calls, 200.0);
        assert_eq!(s.shim.calls, 40.0);
        let p = f.stack(Phase::Provisioning);
        assert_eq!(p.capc.calls, 800.0);
        assert_eq!(p.capc.async_jobs, 12.0);
        assert_eq!(p.shim.stats_rows, 60.0);
        assert_eq!(p.probe.async_jobs, 6.0);
        // 1 200 s at 30 s = 40 cycles; 40 calls = one a cycle.
        assert_eq!(f.shim_calls_per_cycle(Phase::Steady), Some(1.0));
    }

    #[test]
    fn the_rows_are_cumulative_and_the_percentages_relative_to_capc() {
        let f = LoadFile::parse(SAMPLE).unwrap();
        let p = f.stack(Phase::Provisioning);
        let rows = p.rows();
        assert_eq!(rows[0].0, "CAPC alone");
        assert_eq!(rows[1].1.calls, 840.0);
        assert_eq!(rows[2].1.calls, 860.0);
        assert_eq!(rows[2].1.async_jobs, 18.0);
        assert_eq!(p.added_percent(Measure::Calls, false), Some(5.0));
        assert_eq!(p.added_percent(Measure::Calls, true), Some(7.5));
        assert_eq!(p.added_percent(Measure::AsyncJobs, false), Some(0.0));
        assert_eq!(p.added_percent(Measure::AsyncJobs, true), Some(50.0));
        // CAPC reads no rows: no percentage to speak of.
        assert_eq!(p.added_percent(Measure::StatsRows, false), None);
        let s = f.stack(Phase::Steady);
        assert_eq!(s.added_percent(Measure::Calls, false), Some(20.0));
    }

    #[test]
    fn percent_and_per_machine_hour_refuse_empty_bases() {
        assert_eq!(percent_of(1.0, 0.0), None);
        assert_eq!(percent_of(1.0, f64::NAN), None);
        assert_eq!(percent_of(0.0, 4.0), Some(0.0));
        assert_eq!(per_machine_hour(10.0, 0.0), None);
        assert_eq!(per_machine_hour(10.0, 2.0), Some(5.0));
        assert_eq!(per_hour_of_cycles(2.0, 0.0), None);
        assert_eq!(per_hour_of_cycles(2.0, 30.0), Some(240.0));
    }

    #[test]
    fn extrapolation_scales_capc_per_machine_and_the_shim_by_its_measured_cycles() {
        let f = LoadFile::parse(SAMPLE).unwrap();
        let s = f.stack(Phase::Steady);
        // Measured: 2 pages per 30 s cycle at 1 000 VMs = 240 calls per hour.
        let m = fleet_calls(
            &s,
            1_000,
            ShimSource::Measured {
                calls_per_cycle: 2.0,
                interval_seconds: 30.0,
            },
        );
        assert_eq!(m.capc, 200_000.0);
        assert_eq!(m.shim, 240.0);
        assert_eq!(m.shim_percent(), Some(0.12));
        // Not measured: per Machine-hour × N.
        let n = fleet_calls(&s, 10_000, ShimSource::PerMachineHour);
        assert_eq!(n.capc, 2_000_000.0);
        assert_eq!(n.shim, 400_000.0);
        assert_eq!(n.shim_percent(), Some(20.0));
        assert_eq!(n.shim_and_probe_percent(), Some(20.0));
    }

    #[test]
    fn a_key_without_calls_may_have_a_null_by_command() {
        // What Go's encoding/json writes for a nil map (the probe's key in steady state).
        let text = SAMPLE.replace(
            r#""steady": {"calls": 0, "stats_rows": 0, "async_jobs": 0, "by_command": {}}"#,
            r#""steady": {"calls": 0, "stats_rows": 0, "async_jobs": 0, "by_command": null}"#,
        );
        assert!(text.contains("null"));
        let f = LoadFile::parse(&text).unwrap();
        let c = f.counts(Key::ShimProbe, Phase::Steady).unwrap();
        assert!(c.by_command.is_empty());
        assert_eq!(f.rates(Key::ShimProbe, Phase::Steady), Rates::default());
    }

    #[test]
    fn no_capc_steady_calls_is_an_error_not_a_missing_key() {
        let f = LoadFile::parse(SAMPLE).unwrap();
        assert_eq!(capc_steady_calls(&f), Ok(200.0));
        let idle = SAMPLE.replace(
            r#""steady": {"calls": 200, "stats_rows": 0, "async_jobs": 0, "by_command": {}}"#,
            r#""steady": {"calls": 0, "stats_rows": 0, "async_jobs": 0, "by_command": {}}"#,
        );
        assert_ne!(idle, SAMPLE);
        let f = LoadFile::parse(&idle).unwrap();
        let e = capc_steady_calls(&f).unwrap_err();
        assert!(e.contains("CAPC's key made 0"), "{e}");
        let measured = [ControllerCalls {
            machines: 1_000,
            scopes: 1,
            calls_per_cycle: 2.0,
        }];
        let e = controller_fleet_rows(&f, &measured, &[1_000], &[1], 30.0).unwrap_err();
        assert!(e.contains("CAPC's key made 0"), "{e}");
    }

    #[test]
    fn the_controller_rows_use_its_calls_per_cycle_by_size_and_scopes() {
        let f = LoadFile::parse(SAMPLE).unwrap();
        let measured = [
            ControllerCalls {
                machines: 1_000,
                scopes: 1,
                calls_per_cycle: 2.0,
            },
            ControllerCalls {
                machines: 1_000,
                scopes: 10,
                calls_per_cycle: 10.0,
            },
        ];
        let rows = controller_fleet_rows(&f, &measured, &[1_000, 10_000], &[1, 10], 30.0).unwrap();
        assert_eq!(rows.len(), 8);
        let at = |n: u64, s: u64, p: Phase| {
            rows.iter()
                .find(|r| r.calls.machines == n && r.scopes == s && r.phase == p)
                .unwrap()
                .calls
        };
        // 2 calls every 30 s = 240 an hour; 10 = 1 200; CAPC 200 per Machine-hour × 1 000.
        assert_eq!(at(1_000, 1, Phase::Steady).shim, 240.0);
        assert_eq!(at(1_000, 10, Phase::Steady).shim, 1_200.0);
        assert_eq!(at(1_000, 10, Phase::Steady).capc, 200_000.0);
        assert_eq!(at(1_000, 10, Phase::Steady).shim_percent(), Some(0.6));
        // Not measured, and provisioning: per Machine-hour × N, said so.
        let unmeasured = at(10_000, 10, Phase::Steady);
        assert_eq!(unmeasured.shim_source, ShimSource::PerMachineHour);
        assert_eq!(unmeasured.shim, 400_000.0);
        assert_eq!(
            at(1_000, 1, Phase::Provisioning).shim_source,
            ShimSource::PerMachineHour
        );
    }

    #[test]
    fn fleet_keys_keep_the_one_scope_names_and_add_the_scopes() {
        assert_eq!(
            fleet_key(
                "shim_added_cloudstack_calls_percent_of_capc",
                Phase::Steady,
                1_000,
                1
            ),
            "shim_added_cloudstack_calls_percent_of_capc_steady_1000_machines"
        );
        assert_eq!(
            fleet_key(
                "cloudstack_calls_per_hour_shim",
                Phase::Provisioning,
                10_000,
                10
            ),
            "cloudstack_calls_per_hour_shim_provisioning_10000_machines_10_scopes"
        );
    }

    #[test]
    fn a_file_without_a_window_or_a_key_is_refused_not_guessed() {
        let no_probe = SAMPLE.replace("\"shim_probe\"", "\"other\"");
        let e = LoadFile::parse(&no_probe).unwrap_err();
        assert!(e.contains("keys.shim_probe"), "{e}");
        let empty = SAMPLE.replace("\"machine_hours\": 1.0", "\"machine_hours\": 0");
        let e = LoadFile::parse(&empty).unwrap_err();
        assert!(e.contains("windows.steady.machine_hours"), "{e}");
        assert!(LoadFile::parse("{").is_err());
    }
}
