//! Simulator settings: CloudStack global settings and simulator timings.

use super::Throttle;

/// Simulator settings (CloudStack global settings and simulator timings).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `vm.stats.interval` in seconds; 0 disables stats (fields absent).
    pub stats_interval_seconds: u64,
    /// `vm.stats.max.retention.time` in seconds (bounded history per VM).
    pub stats_retention_seconds: u64,
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
            stats_retention_seconds: 3600,
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
