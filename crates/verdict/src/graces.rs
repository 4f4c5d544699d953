//! How long each kind of evidence must persist before it becomes a `False` verdict.

use jiff::SignedDuration;

/// Every grace of the verdict table (product.md §4); all are flags of `run` and `check`.
#[derive(Debug, Clone, PartialEq)]
pub struct Graces {
    /// The shim's poll interval; used to judge whether the last poll is too old.
    pub poll_interval: SignedDuration,
    /// A last successful poll older than this many intervals means "cannot see".
    pub stale_poll_intervals: u32,
    /// Further polls that must still show `Error` before `VMError` is `False`.
    pub error_confirm_polls: u32,
    /// `Stopped`/`Shutdown` for at least this long.
    pub stopped: SignedDuration,
    /// The same for a VM whose offering is HA-enabled: CloudStack's HA restarts such a VM by
    /// itself after it stopped outside CloudStack's control, so wait for it first.
    pub stopped_ha: SignedDuration,
    /// Complete listings in a row that must miss the VM (or show it destroyed).
    pub not_found_polls: u32,
    /// `Starting`/`Stopping`/`Restoring` for at least this long.
    pub transition: SignedDuration,
    /// Host control state Offline/Unknown for at least this long.
    pub host_unreachable: SignedDuration,
    /// No NIC, or no default NIC, for at least this long.
    pub nic_detached: SignedDuration,
    /// A NIC without an address on a network that assigns one, for at least this long.
    pub nic_no_address: SignedDuration,
    /// Zero guest→host traffic over this many stats collections.
    pub silent_samples: u32,
    /// Hypervisors (as CloudStack names them, any case) whose counters may decide
    /// `GuestNetworkSilent`. KVM by default: its rows are byte deltas of the guest's taps.
    /// VMware's are an integer KB/s average and XenServer's an average rate, so a guest
    /// sending under 1 KB/s reads 0 there — low traffic and none look alike.
    pub silence_hypervisors: Vec<String>,
    /// CloudStack's `vm.stats.interval`.
    pub stats_interval: SignedDuration,
    /// Anchor a newly seen VM's state age to CloudStack's `lastupdated` (clamped to now).
    pub anchor_to_lastupdated: bool,
    /// The opt-in guest probe's pacing; `None` when no probe credentials are configured.
    pub probe: Option<crate::probe::ProbeGraces>,
}

impl Default for Graces {
    fn default() -> Self {
        Self {
            poll_interval: SignedDuration::from_secs(30),
            stale_poll_intervals: 3,
            error_confirm_polls: 1,
            stopped: SignedDuration::from_secs(60),
            stopped_ha: SignedDuration::from_mins(10),
            not_found_polls: 2,
            transition: SignedDuration::from_mins(15),
            host_unreachable: SignedDuration::from_mins(10),
            nic_detached: SignedDuration::from_secs(60),
            nic_no_address: SignedDuration::from_secs(60),
            silent_samples: 3,
            silence_hypervisors: vec!["KVM".to_string()],
            stats_interval: SignedDuration::from_secs(60),
            anchor_to_lastupdated: true,
            probe: None,
        }
    }
}

impl Graces {
    /// The age beyond which the last successful poll no longer counts as seeing the VM.
    pub fn stale_after(&self) -> SignedDuration {
        self.poll_interval * i32::try_from(self.stale_poll_intervals.max(1)).unwrap_or(i32::MAX)
    }

    /// How long a poll-only observer must see a flat counter before calling it silent: the
    /// collections themselves plus one interval, because poll and collection times are not
    /// aligned.
    pub fn silent_window_without_samples(&self) -> SignedDuration {
        self.stats_interval
            * (i32::try_from(self.silent_samples)
                .unwrap_or(i32::MAX)
                .saturating_add(1))
    }

    /// How long ago the newest stats may have been taken for them to count as current.
    pub fn stats_fresh_within(&self) -> SignedDuration {
        self.stats_interval * 2 + self.poll_interval
    }

    /// Whether counters of this hypervisor may decide silence.
    pub fn judges_silence_on(&self, hypervisor: Option<&str>) -> bool {
        hypervisor.is_some_and(|h| {
            self.silence_hypervisors
                .iter()
                .any(|j| j.eq_ignore_ascii_case(h.trim()))
        })
    }
}
