//! Simulator settings: CloudStack global settings and simulator timings.

use super::Throttle;

/// Simulator settings (CloudStack global settings and simulator timings).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `vm.stats.interval` in seconds (CloudStack keeps it in ms); 0 disables collection
    /// (`StatsCollector.init@00114e8b` schedules the collector only when > 0).
    pub stats_interval_seconds: u64,
    /// `vm.stats.max.retention.time` in seconds (CloudStack: minutes, default 720 since
    /// 4.18, `StatsCollector@00114e8b`); 0 disables the cleanup (the simulator then still
    /// keeps at most [`super::rows::MAX_ROWS_PER_VM`] rows per VM).
    pub stats_retention_seconds: u64,
    /// `vm.stats.increment.metrics` (default true, dynamic): listings sum all retained rows
    /// unless `accumulate` says otherwise.
    pub stats_increment_metrics: bool,
    /// How many management servers run the VM stats collector (each stores its own row).
    pub management_servers: u32,
    /// Phase offset of each management server's collection within the interval, seconds;
    /// missing entries use the default `k × 0.37 × interval mod interval`.
    pub ms_offsets_seconds: Vec<f64>,
    /// The management server's time zone (IANA name), used to parse date-only parameters.
    pub server_time_zone: String,
    /// How long a guest's boot traffic phase lasts (DHCP, cloud-init, image pulls).
    pub guest_boot_seconds: f64,
    /// How long a guest's kubeadm-join traffic phase lasts.
    pub guest_join_seconds: f64,
    /// How many times faster than simulated time guests send their bytes (1 = real time). A
    /// scenario compressed by 0.1 (stats every 6 s standing for 60 s) sets 10, so that one
    /// interval's row holds what a real guest sends in a real interval.
    pub guest_speedup: f64,
    /// `default.page.size`: default and maximum page size.
    pub default_page_size: u64,
    /// Default Starting → Running delay.
    pub boot_seconds: f64,
    /// Destroyed → Expunging delay.
    pub expunge_delay_seconds: f64,
    /// Expunging → gone delay.
    pub expunge_seconds: f64,
    /// How long a slow-boot guest sends only a trickle.
    pub slow_boot_seconds: u64,
    pub cloudstack_version: String,
    /// `allow.user.view.destroyed.vm`.
    pub allow_user_view_destroyed_vm: bool,
    /// `allow.user.expunge.recover.vm` (admins may always expunge).
    pub allow_user_expunge_recover_vm: bool,
    /// Global API throttling (`None` = `api.throttling.enabled=false`).
    pub throttle: Option<Throttle>,
    /// Account VMs go to when a request names none (default: the first account).
    pub default_account: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            stats_interval_seconds: 60,
            stats_retention_seconds: 720 * 60,
            stats_increment_metrics: true,
            management_servers: 1,
            ms_offsets_seconds: Vec::new(),
            server_time_zone: "UTC".to_string(),
            guest_boot_seconds: 90.0,
            guest_join_seconds: 180.0,
            guest_speedup: 1.0,
            default_page_size: 500,
            boot_seconds: 30.0,
            expunge_delay_seconds: 60.0,
            expunge_seconds: 10.0,
            slow_boot_seconds: 1200,
            cloudstack_version: "4.19.1.0".to_string(),
            allow_user_view_destroyed_vm: false,
            allow_user_expunge_recover_vm: false,
            throttle: None,
            default_account: None,
        }
    }
}

impl Settings {
    /// Collection phase offset of management server `k` in ms (within `[0, interval)`).
    /// Default: `k × 0.37 × interval mod interval` — irregular, as independent servers'
    /// schedules are (each starts its collector `DEFAULT_INITIAL_DELAY` after its own boot).
    pub fn ms_offset_ms(&self, k: usize) -> super::Ms {
        let i = (self.stats_interval_seconds as super::Ms).saturating_mul(1000);
        if i <= 0 {
            return 0;
        }
        let off = match self.ms_offsets_seconds.get(k) {
            Some(s) if s.is_finite() => (s * 1000.0).round() as super::Ms,
            _ => ((k as f64 * 0.37 * i as f64).round()) as super::Ms,
        };
        off.rem_euclid(i)
    }

    /// Whether the simulated CloudStack version is at least `want` (dotted numbers).
    pub fn version_at_least(&self, want: &[u32]) -> bool {
        let have: Vec<u32> = self
            .cloudstack_version
            .split('.')
            .map(|p| p.trim().parse().unwrap_or(0))
            .collect();
        for (i, w) in want.iter().enumerate() {
            let h = have.get(i).copied().unwrap_or(0);
            if h != *w {
                return h > *w;
            }
        }
        true
    }

    /// The server's time zone (UTC when the name is unknown).
    pub fn time_zone(&self) -> jiff::tz::TimeZone {
        parse_time_zone(&self.server_time_zone).unwrap_or(jiff::tz::TimeZone::UTC)
    }
}

/// An IANA zone name (system tz database) or a fixed offset `+HH:MM` / `-HH:MM`.
pub fn parse_time_zone(name: &str) -> Option<jiff::tz::TimeZone> {
    let n = name.trim();
    if let Some(rest) = n.strip_prefix('+').or_else(|| n.strip_prefix('-')) {
        let (h, m) = rest.split_once(':').unwrap_or((rest, "0"));
        let secs = h.parse::<i32>().ok()? * 3600 + m.parse::<i32>().ok()? * 60;
        let secs = if n.starts_with('-') { -secs } else { secs };
        let off = jiff::tz::Offset::from_seconds(secs).ok()?;
        return Some(jiff::tz::TimeZone::fixed(off));
    }
    jiff::tz::TimeZone::get(n).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_offsets_are_irregular_and_versions_compare_numerically() {
        let mut s = Settings {
            management_servers: 3,
            ..Settings::default()
        };
        assert_eq!(s.ms_offset_ms(0), 0);
        assert_eq!(s.ms_offset_ms(1), 22_200);
        assert_eq!(s.ms_offset_ms(2), 44_400);
        s.ms_offsets_seconds = vec![5.0, 61.0];
        assert_eq!(s.ms_offset_ms(1), 1_000);
        s.cloudstack_version = "4.17.0.0".into();
        assert!(s.version_at_least(&[4, 17, 0]));
        s.cloudstack_version = "4.16.1.0".into();
        assert!(!s.version_at_least(&[4, 17, 0]));
        s.cloudstack_version = "4.9.3".into();
        assert!(!s.version_at_least(&[4, 17]));
    }
}
