//! The command line: flags shared by the subcommands (every grace of the verdict table is a
//! flag of both `check` and `run`, with the same names and defaults), and the commands that
//! read a running shim's `/status`:
//!
//! - [`status`]: `capc-health-shim status --url URL`, for humans.
//! - [`orphans`]: `capc-health-shim orphans --url URL`, the VMs it reports with the commands
//!   that would remove them (never run).
//! - [`cleanup`]: `capc-health-shim cleanup`, what the shim left behind after an uninstall
//!   (its Lease, memory ConfigMap, fields on Machines, MHC entries), removed with `--yes`.
//! - [`mhc`]: `capc-health-shim mhc --cluster NS/NAME`, the MachineHealthCheck (or the patch
//!   to one) that acts on the shim's verdict for the Cluster API version in use.

pub mod cleanup;
pub mod mhc;
pub mod orphans;
pub mod scorecard;
pub mod status;

use clap::{Args, ValueEnum};
use jiff::SignedDuration;

use crate::verdict::{Graces, MassFailureGuard};

/// How a command prints what it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

/// The longest duration any flag takes: longer is "never" in practice, and every sum of a
/// timestamp and flag durations (graces × polls, intervals × samples) stays far inside jiff's
/// range (an unbounded `1e20` panicked in the parser, a huge grace when added to a timestamp).
pub const MAX_FLAG_DURATION: SignedDuration = SignedDuration::from_hours(366 * 24);

/// Most `--silent-samples`: the stats history kept per VM is sized for 12 collections and a
/// baseline, so a larger value could never be judged (16+ silently disabled the check).
pub const MAX_SILENT_SAMPLES: u32 = 12;

/// Highest `--rate-limit` in requests per second (far above any `api.throttling.max`; the
/// burst, twice the rate, stays a small integer).
pub const MAX_RATE_LIMIT: f64 = 1000.0;

/// Parses `30s`, `2m`, `1h 30m`, `500ms`, ISO 8601 (`PT2M`) or a bare number of seconds,
/// from 0 up to [`MAX_FLAG_DURATION`] (366 days).
pub fn parse_duration(s: &str) -> Result<SignedDuration, String> {
    let t = s.trim();
    let too_long =
        || format!("{s:?} is longer than 366 days (8784h), the most a duration flag takes");
    if let Ok(secs) = t.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            if secs > MAX_FLAG_DURATION.as_secs_f64() {
                return Err(too_long());
            }
            return Ok(SignedDuration::from_secs_f64(secs));
        }
    }
    match t.parse::<SignedDuration>() {
        Ok(d) if d.is_negative() => Err(format!("{s:?} is negative; durations must be ≥ 0")),
        Ok(d) if d > MAX_FLAG_DURATION => Err(too_long()),
        Ok(d) => Ok(d),
        Err(_) => Err(format!(
            "{s:?} is not a duration (examples: 30s, 2m, 1h30m, 500ms)"
        )),
    }
}

/// A clap value parser: [`parse_duration`] within `min..=max` (both rendered in the error as
/// the flag's allowed range, e.g. `1s..=1h`).
pub fn duration_in(
    min: SignedDuration,
    max: SignedDuration,
) -> impl Fn(&str) -> Result<SignedDuration, String> + Clone + Send + Sync + 'static {
    move |s| {
        let d = parse_duration(s)?;
        if d < min || d > max {
            return Err(format!(
                "{s:?} is out of range: allowed {}..={}",
                friendly(min),
                friendly(max)
            ));
        }
        Ok(d)
    }
}

/// `1s`, `10m`, `1h`, `1h 30m` …
fn friendly(d: SignedDuration) -> String {
    format!("{d:#}").replace(' ', "")
}

/// `--rate-limit`: 0 (no limit) or a finite rate in (0, [`MAX_RATE_LIMIT`]] requests per
/// second (NaN, infinity, negatives and huge rates would overflow the burst or mean nothing).
pub fn parse_rate_limit(s: &str) -> Result<f64, String> {
    let allowed = "allowed: 0 (no limit) or more than 0 and at most 1000 requests per second";
    let r: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number; {allowed}"))?;
    if r == 0.0 || (r.is_finite() && r > 0.0 && r <= MAX_RATE_LIMIT) {
        Ok(r)
    } else {
        Err(format!("{s:?} is out of range; {allowed}"))
    }
}

/// A flag duration as a `std::time::Duration` (flags are never negative; 0 if one were).
pub fn to_std(d: SignedDuration) -> std::time::Duration {
    std::time::Duration::try_from(d).unwrap_or(std::time::Duration::ZERO)
}

/// The verdict table's graces (product.md §4).
#[derive(Debug, Clone, Args)]
pub struct GraceArgs {
    /// Further polls that must still show Error before VMError is False.
    #[arg(long, env = "CAPC_HEALTH_ERROR_CONFIRM_POLLS", default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub error_confirm_polls: u32,
    /// How long a VM may be Stopped/Shutdown before VMStopped is False.
    #[arg(long, env = "CAPC_HEALTH_STOPPED_GRACE", default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub stopped_grace: SignedDuration,
    /// Complete listings in a row that must miss the VM (or show it Destroyed/Expunging).
    #[arg(long, env = "CAPC_HEALTH_NOT_FOUND_POLLS", default_value_t = 2, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub not_found_polls: u32,
    /// How long a VM may stay Starting/Stopping/Restoring.
    #[arg(long, env = "CAPC_HEALTH_TRANSITION_GRACE", default_value = "15m", value_parser = parse_duration, value_name = "DURATION")]
    pub transition_grace: SignedDuration,
    /// How long a VM may be Stopped/Shutdown before VMStopped is False when its offering is
    /// HA-enabled (CloudStack's HA restarts such a VM by itself).
    #[arg(long, env = "CAPC_HEALTH_STOPPED_HA_GRACE", default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub stopped_ha_grace: SignedDuration,
    /// After this long with its host Offline/Unknown, the HostUnreachable message says
    /// CloudStack has not acted; host state alone never makes the condition False.
    #[arg(long, env = "CAPC_HEALTH_HOST_UNREACHABLE_GRACE", default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub host_unreachable_grace: SignedDuration,
    /// How long a Running VM may have no (default) NIC.
    #[arg(long, env = "CAPC_HEALTH_NIC_DETACHED_GRACE", default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub nic_detached_grace: SignedDuration,
    /// How long a NIC may lack an address on a network where CloudStack assigns one.
    #[arg(long, env = "CAPC_HEALTH_NIC_NO_ADDRESS_GRACE", default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub nic_no_address_grace: SignedDuration,
    /// Stats collections of zero guest→host traffic that make GuestNetworkSilent False.
    #[arg(long, env = "CAPC_HEALTH_SILENT_SAMPLES", default_value_t = 3, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=MAX_SILENT_SAMPLES as i64))]
    pub silent_samples: u32,
    /// Hypervisors whose traffic counters may make GuestNetworkSilent False (comma list).
    /// VMware and XenServer report averages that read a guest sending under 1 KB/s as 0:
    /// adding them catches their NIC-down VMs and risks recycling very quiet guests.
    #[arg(
        long,
        env = "CAPC_HEALTH_SILENCE_HYPERVISORS",
        default_value = "KVM",
        value_delimiter = ',',
        value_name = "HYPERVISORS"
    )]
    pub silence_hypervisors: Vec<String>,
    /// CloudStack's vm.stats.interval (how often traffic counters are sampled).
    #[arg(long, env = "CAPC_HEALTH_STATS_INTERVAL", default_value = "60s", value_parser = duration_in(SignedDuration::from_secs(1), SignedDuration::from_hours(24)), value_name = "DURATION")]
    pub stats_interval: SignedDuration,
    /// A last successful poll older than this many intervals counts as "cannot see".
    #[arg(long, env = "CAPC_HEALTH_STALE_POLL_INTERVALS", default_value_t = 3, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub stale_poll_intervals: u32,
    /// Do not anchor a newly seen VM's state age to CloudStack's `lastupdated`.
    #[arg(long, env = "CAPC_HEALTH_NO_LASTUPDATED_ANCHOR")]
    pub no_lastupdated_anchor: bool,
    /// Mass-failure guard: hold new False verdicts when at least this many Machines of a scope fail within the window.
    #[arg(long, env = "CAPC_HEALTH_MASS_FAILURE_COUNT", default_value_t = 5, value_name = "N", value_parser = clap::value_parser!(u32).range(2..=100_000))]
    pub mass_failure_count: u32,
    /// Mass-failure guard: … or at least this percentage of the scope.
    #[arg(long, env = "CAPC_HEALTH_MASS_FAILURE_PERCENT", default_value_t = 50, value_name = "PERCENT", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub mass_failure_percent: u32,
    /// Mass-failure guard: the window in which failures are counted together.
    #[arg(long, env = "CAPC_HEALTH_MASS_FAILURE_WINDOW", default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub mass_failure_window: SignedDuration,
}

impl GraceArgs {
    pub fn graces(&self, poll_interval: SignedDuration) -> Graces {
        Graces {
            poll_interval,
            stale_poll_intervals: self.stale_poll_intervals.max(1),
            error_confirm_polls: self.error_confirm_polls,
            stopped: self.stopped_grace,
            stopped_ha: self.stopped_ha_grace,
            not_found_polls: self.not_found_polls.max(1),
            transition: self.transition_grace,
            host_unreachable: self.host_unreachable_grace,
            nic_detached: self.nic_detached_grace,
            nic_no_address: self.nic_no_address_grace,
            silent_samples: self.silent_samples.max(1),
            silence_hypervisors: self
                .silence_hypervisors
                .iter()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .collect(),
            stats_interval: self.stats_interval,
            anchor_to_lastupdated: !self.no_lastupdated_anchor,
            // Set by `run`/`check` when probe credentials are given.
            probe: None,
        }
    }

    pub fn guard(&self) -> MassFailureGuard {
        MassFailureGuard {
            min_count: usize::try_from(self.mass_failure_count)
                .unwrap_or(usize::MAX)
                .max(2),
            min_percent: self.mass_failure_percent,
            window: self.mass_failure_window,
        }
    }
}

/// How the opt-in guest probe (docs/guest-probe.md) is paced and bounded. Inert unless probe
/// credentials are given (`run --probe-credentials`, `check --probe-credentials-file`).
#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// Unanswered probe attempts in a row (spaced apart) before "no reply" counts.
    #[arg(long, env = "CAPC_HEALTH_PROBE_ATTEMPTS", default_value_t = 3, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=20))]
    pub probe_attempts: u32,
    /// Time between attempts while a guest does not answer [default: a quarter of --stats-interval].
    #[arg(long, env = "CAPC_HEALTH_PROBE_SPACING", value_parser = duration_in(SignedDuration::from_millis(100), SignedDuration::from_hours(1)), value_name = "DURATION")]
    pub probe_spacing: Option<SignedDuration>,
    /// After a reply, the next attempt no sooner than this [default: half of --stats-interval].
    #[arg(long, env = "CAPC_HEALTH_PROBE_RECHECK", value_parser = duration_in(SignedDuration::from_millis(100), SignedDuration::from_hours(1)), value_name = "DURATION")]
    pub probe_recheck: Option<SignedDuration>,
    /// How long after it went Running a guest never seen alive may take to answer ARP before
    /// its silence counts [default: --stats-interval]. Raise it for images that boot slowly.
    #[arg(long, env = "CAPC_HEALTH_PROBE_BOOT_GRACE", value_parser = duration_in(SignedDuration::from_secs(1), SignedDuration::from_hours(1)), value_name = "DURATION")]
    pub probe_boot_grace: Option<SignedDuration>,
    /// Probe jobs started per CloudStack scope per minute, at most.
    #[arg(long, env = "CAPC_HEALTH_PROBE_MAX_PER_SCOPE_PER_MINUTE", default_value_t = 60, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub probe_max_per_scope_per_minute: u32,
    /// Probe jobs in flight at once, at most (and never two on one router: it runs them one
    /// at a time).
    #[arg(long, env = "CAPC_HEALTH_PROBE_MAX_IN_FLIGHT", default_value_t = 16, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub probe_max_in_flight: u16,
    /// A probe job not finished after this long is no evidence.
    #[arg(long, env = "CAPC_HEALTH_PROBE_JOB_TIMEOUT", default_value = "2m", value_parser = duration_in(SignedDuration::from_secs(1), SignedDuration::from_hours(1)), value_name = "DURATION")]
    pub probe_job_timeout: SignedDuration,
    /// Options passed to the router's arping (runDiagnostics `params`; CloudStack allows
    /// letters, digits, `_`, `-`, `.` and spaces). Add e.g. `-I eth2` where the router's arping
    /// cannot pick the interface itself.
    #[arg(long, env = "CAPC_HEALTH_PROBE_ARPING_PARAMS", default_value = "-c 3 -f", value_parser = parse_diagnostics_params, value_name = "OPTIONS")]
    pub probe_arping_params: String,
}

/// `runDiagnostics` refuses `params` outside `^[\w\-\s.]+$` (DiagnosticsServiceImpl):
/// refuse them here, with the rule, instead of at every probe.
pub fn parse_diagnostics_params(s: &str) -> Result<String, String> {
    let ok = !s.trim().is_empty()
        && s.chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '.' || c.is_whitespace());
    if ok {
        Ok(s.trim().to_string())
    } else {
        Err(format!(
            "{s:?} is not allowed: CloudStack's runDiagnostics takes letters, digits, '_', '-', '.' \
             and spaces only"
        ))
    }
}

impl ProbeArgs {
    /// The probe's pacing for the verdict engine, spacing and recheck derived from the stats
    /// interval unless set.
    pub fn graces(&self, stats_interval: SignedDuration) -> crate::verdict::probe::ProbeGraces {
        let derived = crate::verdict::probe::ProbeGraces::from_stats_interval(stats_interval);
        crate::verdict::probe::ProbeGraces {
            attempts: self.probe_attempts.max(1),
            spacing: self.probe_spacing.unwrap_or(derived.spacing),
            recheck: self.probe_recheck.unwrap_or(derived.recheck),
            boot_grace: self.probe_boot_grace.unwrap_or(derived.boot_grace),
        }
    }

    pub fn limits(&self) -> crate::probe::ProbeLimits {
        crate::probe::ProbeLimits {
            per_scope_per_minute: self.probe_max_per_scope_per_minute.max(1),
            max_in_flight: usize::from(self.probe_max_in_flight.max(1)),
            job_timeout: self.probe_job_timeout,
            arping_params: self.probe_arping_params.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_the_forms_operators_write() {
        assert_eq!(
            parse_duration("30s").unwrap(),
            SignedDuration::from_secs(30)
        );
        assert_eq!(parse_duration("2m").unwrap(), SignedDuration::from_mins(2));
        assert_eq!(
            parse_duration("1h30m").unwrap(),
            SignedDuration::from_mins(90)
        );
        assert_eq!(parse_duration("45").unwrap(), SignedDuration::from_secs(45));
        assert_eq!(
            parse_duration("0.5").unwrap(),
            SignedDuration::from_millis(500)
        );
        assert_eq!(
            parse_duration("PT2M").unwrap(),
            SignedDuration::from_mins(2)
        );
        assert!(parse_duration("soon")
            .unwrap_err()
            .contains("not a duration"));
        assert!(parse_duration("-5s").is_err());
        assert_eq!(parse_duration("8784h").unwrap(), MAX_FLAG_DURATION);
        for huge in ["1e20", "8785h", "100000000h", "31708800"] {
            assert!(
                parse_duration(huge).unwrap_err().contains("366 days"),
                "{huge}"
            );
        }
    }

    #[test]
    fn arping_params_follow_cloudstacks_rule_and_pacing_derives_from_stats() {
        assert_eq!(parse_diagnostics_params(" -c 3 -f ").unwrap(), "-c 3 -f");
        assert_eq!(
            parse_diagnostics_params("-I eth2 -c 2").unwrap(),
            "-I eth2 -c 2"
        );
        for bad in ["-c 3; reboot", "$(id)", "-I eth0|x", "", "  "] {
            assert!(
                parse_diagnostics_params(bad)
                    .unwrap_err()
                    .contains("runDiagnostics"),
                "{bad:?}"
            );
        }
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            probe: ProbeArgs,
        }
        use clap::Parser;
        let p = P::try_parse_from(["x"]).unwrap().probe;
        let g = p.graces(SignedDuration::from_secs(60));
        assert_eq!(
            (g.attempts, g.spacing, g.recheck),
            (
                3,
                SignedDuration::from_secs(15),
                SignedDuration::from_secs(30)
            )
        );
        let p = P::try_parse_from(["x", "--probe-spacing", "5s", "--probe-attempts", "2"])
            .unwrap()
            .probe;
        let g = p.graces(SignedDuration::from_secs(6));
        assert_eq!(
            (g.attempts, g.spacing, g.recheck),
            (
                2,
                SignedDuration::from_secs(5),
                SignedDuration::from_secs(3)
            )
        );
        assert!(P::try_parse_from(["x", "--probe-attempts", "0"]).is_err());
        assert!(P::try_parse_from(["x", "--probe-arping-params", "-c 1;x"]).is_err());
    }

    #[test]
    fn bounded_durations_and_rates_say_what_is_allowed() {
        let poll = duration_in(SignedDuration::from_secs(1), SignedDuration::from_hours(1));
        assert_eq!(poll("1s").unwrap(), SignedDuration::from_secs(1));
        assert_eq!(poll("1h").unwrap(), SignedDuration::from_hours(1));
        for bad in ["0", "999ms", "61m"] {
            assert!(poll(bad).unwrap_err().contains("allowed 1s..=1h"), "{bad}");
        }
        assert!(poll("soon").unwrap_err().contains("not a duration"));
        assert_eq!(parse_rate_limit("0").unwrap(), 0.0);
        assert_eq!(parse_rate_limit("1000").unwrap(), 1000.0);
        assert_eq!(parse_rate_limit("0.5").unwrap(), 0.5);
        for bad in ["3e9", "1000.5", "NaN", "inf", "-inf", "-1", "-0.1", "x"] {
            assert!(
                parse_rate_limit(bad).unwrap_err().contains("at most 1000"),
                "{bad}"
            );
        }
    }
}
