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
    /// Flat guest→host traffic over this many stats samples.
    pub silent_samples: u32,
    /// CloudStack's `vm.stats.interval`.
    pub stats_interval: SignedDuration,
    /// Anchor a newly seen VM's state age to CloudStack's `lastupdated` (clamped to now).
    pub anchor_to_lastupdated: bool,
}

impl Default for Graces {
    fn default() -> Self {
        Self {
            poll_interval: SignedDuration::from_secs(30),
            stale_poll_intervals: 3,
            error_confirm_polls: 1,
            stopped: SignedDuration::from_secs(60),
            not_found_polls: 2,
            transition: SignedDuration::from_mins(15),
            host_unreachable: SignedDuration::from_mins(10),
            nic_detached: SignedDuration::from_mins(2),
            nic_no_address: SignedDuration::from_mins(5),
            silent_samples: 3,
            stats_interval: SignedDuration::from_secs(60),
            anchor_to_lastupdated: true,
        }
    }
}

impl Graces {
    /// The age beyond which the last successful poll no longer counts as seeing the VM.
    pub fn stale_after(&self) -> SignedDuration {
        self.poll_interval * i32::try_from(self.stale_poll_intervals.max(1)).unwrap_or(i32::MAX)
    }

    /// How long a poll-only observer must see a flat counter before calling it silent: the
    /// samples themselves plus one interval, because poll and sample times are not aligned.
    pub fn silent_window_without_samples(&self) -> SignedDuration {
        self.stats_interval
            * (i32::try_from(self.silent_samples)
                .unwrap_or(i32::MAX)
                .saturating_add(1))
    }

    /// Usage-history samples older than this (by the shim's clock of arrival) are stale.
    pub fn stats_fresh_within(&self) -> SignedDuration {
        self.stats_interval * 2 + self.poll_interval
    }
}
