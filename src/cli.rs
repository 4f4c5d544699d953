//! Command-line flags shared by the subcommands. Every grace of the verdict table is a flag
//! of both `check` and (later) `run`, with the same names and defaults.

use clap::Args;
use jiff::SignedDuration;

use crate::verdict::{Graces, MassFailureGuard};

/// Parses `30s`, `2m`, `1h 30m`, `500ms`, ISO 8601 (`PT2M`) or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<SignedDuration, String> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(SignedDuration::from_secs_f64(secs));
        }
    }
    match t.parse::<SignedDuration>() {
        Ok(d) if !d.is_negative() => Ok(d),
        Ok(_) => Err(format!("{s:?} is negative; durations must be ≥ 0")),
        Err(_) => Err(format!(
            "{s:?} is not a duration (examples: 30s, 2m, 1h30m, 500ms)"
        )),
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
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub error_confirm_polls: u32,
    /// How long a VM may be Stopped/Shutdown before VMStopped is False.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub stopped_grace: SignedDuration,
    /// Complete listings in a row that must miss the VM (or show it Destroyed/Expunging).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub not_found_polls: u32,
    /// How long a VM may stay Starting/Stopping/Restoring.
    #[arg(long, default_value = "15m", value_parser = parse_duration, value_name = "DURATION")]
    pub transition_grace: SignedDuration,
    /// How long the VM's host may be Offline/Unknown before HostUnreachable is False.
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub host_unreachable_grace: SignedDuration,
    /// How long a Running VM may have no (default) NIC.
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pub nic_detached_grace: SignedDuration,
    /// How long a NIC may lack an address on a network that assigns one.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub nic_no_address_grace: SignedDuration,
    /// Stats samples of flat guest→host traffic that make GuestNetworkSilent False.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub silent_samples: u32,
    /// CloudStack's vm.stats.interval (how often traffic counters are sampled).
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub stats_interval: SignedDuration,
    /// A last successful poll older than this many intervals counts as "cannot see".
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub stale_poll_intervals: u32,
    /// Do not anchor a newly seen VM's state age to CloudStack's `lastupdated`.
    #[arg(long)]
    pub no_lastupdated_anchor: bool,
    /// Mass-failure guard: hold new False verdicts when at least this many Machines of a scope fail within the window.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub mass_failure_count: usize,
    /// Mass-failure guard: … or at least this percentage of the scope.
    #[arg(long, default_value_t = 50, value_name = "PERCENT", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub mass_failure_percent: u32,
    /// Mass-failure guard: the window in which failures are counted together.
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub mass_failure_window: SignedDuration,
}

impl GraceArgs {
    pub fn graces(&self, poll_interval: SignedDuration) -> Graces {
        Graces {
            poll_interval,
            stale_poll_intervals: self.stale_poll_intervals.max(1),
            error_confirm_polls: self.error_confirm_polls,
            stopped: self.stopped_grace,
            not_found_polls: self.not_found_polls.max(1),
            transition: self.transition_grace,
            host_unreachable: self.host_unreachable_grace,
            nic_detached: self.nic_detached_grace,
            nic_no_address: self.nic_no_address_grace,
            silent_samples: self.silent_samples.max(1),
            stats_interval: self.stats_interval,
            anchor_to_lastupdated: !self.no_lastupdated_anchor,
        }
    }

    pub fn guard(&self) -> MassFailureGuard {
        MassFailureGuard {
            min_count: self.mass_failure_count.max(2),
            min_percent: self.mass_failure_percent,
            window: self.mass_failure_window,
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
    }
}
