//! The simulated cloud: accounts, zones, networks, hosts, projects and VMs, and how they
//! evolve with simulated time.
//!
//! Everything that changes on its own (boot, expunge, `vm_stats` rows, scheduled faults and
//! host changes) is a pure function of simulated time and is applied lazily by
//! [`World::advance_to`], which the server calls before answering any request. Guest traffic
//! is closed-form ([`super::traffic`]); advancing costs O(VMs × rows created), and a clock
//! jump creates at most the rows that are still retained at its end.

mod accounts;
mod affinity;
mod collector;
mod diagnostics;
mod faults;
mod guest;
mod hosts;
mod infra;
mod jobs;
mod lifecycle;
mod offerings;
mod routers;
pub mod rows;
mod settings;
mod stats;
mod vms;

use std::collections::HashMap;

use super::catalog::{
    AffinityGroup, AsyncJob, DiskOffering, ServiceOffering, Template, DEFAULT_DISK_CUSTOM_ID,
    DEFAULT_DISK_SMALL_ID, DEFAULT_OFFERING_ID, DEFAULT_OFFERING_NAME, DEFAULT_TEMPLATE_ID,
    DEFAULT_TEMPLATE_NAME,
};
use super::traffic::{Profile, Timing};

pub use accounts::{
    rule_matches, Account, AccountType, Project, Role, RoleDecision, RoleRule, Secret, Throttle,
};
pub use diagnostics::{
    guest_answers, params_valid, py_bytes_repr, DiagOutcome, DiagOutput, DiagRequest, DiagTarget,
    DiagType, Diagnostic, DIAG_FAIL_CODE,
};
pub use faults::{Fault, GuestKind, ScheduledFault};
pub use guest::Reading;
pub use hosts::{
    Host, HostChange, HostControl, HostStatus, Hypervisor, ResourceState, ScheduledHostChange,
};
pub use infra::{parse_cidr, Network, NetworkSpec, NetworkType, Owner, Zone};
pub use routers::{Router, RouterState};
pub use rows::{Row, StatsRows, Sums};
pub use settings::{parse_time_zone, Settings};
pub use stats::{history_date, StatsView};
pub use vms::{DataDisk, Nic, Vm, VmSpec, VmState};

/// Simulated time: milliseconds since the Unix epoch.
pub type Ms = i64;

/// Formats simulated time the way CloudStack prints dates: `yyyy-MM-dd'T'HH:mm:ss+0000`.
pub fn format_time(ms: Ms) -> String {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(t) => t.strftime("%Y-%m-%dT%H:%M:%S+0000").to_string(),
        Err(_) => "1970-01-01T00:00:00+0000".to_string(),
    }
}

pub fn secs_to_ms(s: f64) -> Ms {
    if s.is_finite() && s > 0.0 {
        (s * 1000.0).round().min(1e15) as Ms
    } else {
        0
    }
}

/// Errors from world operations (admin API, scenario loading, library use).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorldError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
}

/// Names of zones, networks, hosts, accounts, projects and catalogue entries are unique
/// within their kind.
fn unique_name<T>(
    existing: &[T],
    name_of: impl Fn(&T) -> &String,
    what: &str,
    name: &str,
) -> Result<(), WorldError> {
    if existing.iter().any(|x| name_of(x) == name) {
        return Err(WorldError::Conflict(format!(
            "duplicate {what} name {name:?}"
        )));
    }
    Ok(())
}

/// Whether `s` is a lowercase canonical UUID (8-4-4-4-12 hex).
pub fn is_canonical_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        })
}

fn new_uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Timing and stats parameters the VMs evolve with.
#[derive(Debug, Clone)]
struct Ctx {
    /// `vm.stats.interval` (0 = collection off).
    interval_ms: Ms,
    /// Collection phase of each management server.
    offsets: Vec<Ms>,
    retention_ms: Ms,
    timing: Timing,
    slow_ms: Ms,
    expunge_delay_ms: Ms,
    expunge_ms: Ms,
}

/// The whole simulated cloud.
#[derive(Debug, Clone)]
pub struct World {
    pub settings: Settings,
    pub domain_id: String,
    pub accounts: Vec<Account>,
    pub zones: Vec<Zone>,
    pub networks: Vec<Network>,
    pub hosts: Vec<Host>,
    pub projects: Vec<Project>,
    pub service_offerings: Vec<ServiceOffering>,
    pub templates: Vec<Template>,
    pub disk_offerings: Vec<DiskOffering>,
    pub affinity_groups: Vec<AffinityGroup>,
    /// Virtual routers of the guest networks (`routers.rs`).
    pub routers: Vec<Router>,
    next_router_seq: u64,
    /// Diagnostics runs by job index (`diagnostics.rs`).
    diagnostics: HashMap<usize, Diagnostic>,
    jobs: Vec<AsyncJob>,
    job_by_id: HashMap<String, usize>,
    /// Jobs (indices) that wait for a VM to finish starting.
    pending_jobs: Vec<usize>,
    vms: Vec<Vm>,
    by_id: HashMap<String, usize>,
    by_name: HashMap<String, usize>,
    scheduled: Vec<ScheduledFault>,
    next_scheduled: usize,
    scheduled_hosts: Vec<ScheduledHostChange>,
    next_scheduled_host: usize,
    /// `vm_stats` rows the API had to read so far (listings with stats, usage history).
    pub stats_rows_read: u64,
    now_ms: Ms,
    start_ms: Ms,
    next_seq: u64,
}

impl World {
    /// An empty world whose simulated clock starts at `start_ms`.
    pub fn empty(settings: Settings, start_ms: Ms) -> Self {
        Self {
            settings,
            domain_id: new_uuid(),
            accounts: Vec::new(),
            zones: Vec::new(),
            networks: Vec::new(),
            hosts: Vec::new(),
            projects: Vec::new(),
            service_offerings: Vec::new(),
            templates: Vec::new(),
            disk_offerings: Vec::new(),
            affinity_groups: Vec::new(),
            routers: Vec::new(),
            next_router_seq: 1,
            diagnostics: HashMap::new(),
            jobs: Vec::new(),
            job_by_id: HashMap::new(),
            pending_jobs: Vec::new(),
            vms: Vec::new(),
            by_id: HashMap::new(),
            by_name: HashMap::new(),
            scheduled: Vec::new(),
            next_scheduled: 0,
            scheduled_hosts: Vec::new(),
            next_scheduled_host: 0,
            stats_rows_read: 0,
            now_ms: start_ms,
            start_ms,
            next_seq: 1,
        }
    }

    /// One zone, one shared network (10.0.0.0/16), one host and one root-admin account
    /// named `admin` with the given keys.
    pub fn default_world(api_key: &str, secret_key: &str, start_ms: Ms) -> Self {
        let mut w = Self::empty(Settings::default(), start_ms);
        w.populate_default(api_key, secret_key);
        w
    }

    /// Adds the default zone/network/host/admin where missing.
    pub fn populate_default(&mut self, api_key: &str, secret_key: &str) {
        if self.zones.is_empty() {
            let _ = self.add_zone("Sandbox-simulator", None);
        }
        if self.networks.is_empty() {
            let _ = self.add_network(
                "DefaultSharedNetwork",
                None,
                None,
                "10.0.0.0/16",
                None,
                NetworkType::Shared,
            );
        }
        if self.hosts.is_empty() {
            let name = format!("SimulatedAgent.{}", new_uuid());
            let _ = self.add_host(&name, None, None, HostControl::Enabled);
        }
        if self.accounts.is_empty() {
            let _ = self.add_account(
                "admin",
                None,
                AccountType::Admin,
                api_key,
                secret_key,
                None,
                None,
            );
        }
        if self.service_offerings.is_empty() {
            let _ = self.add_service_offering(
                DEFAULT_OFFERING_NAME,
                Some(DEFAULT_OFFERING_ID),
                2,
                1000,
                2048,
                &[],
            );
        }
        if self.templates.is_empty() {
            let _ = self.add_template(DEFAULT_TEMPLATE_NAME, Some(DEFAULT_TEMPLATE_ID), &[]);
        }
        if self.disk_offerings.is_empty() {
            let _ = self.add_disk_offering("Small", Some(DEFAULT_DISK_SMALL_ID), 5, false, &[]);
            let _ = self.add_disk_offering("Custom", Some(DEFAULT_DISK_CUSTOM_ID), 0, true, &[]);
        }
    }

    pub fn now_ms(&self) -> Ms {
        self.now_ms
    }

    pub fn start_ms(&self) -> Ms {
        self.start_ms
    }

    fn ctx(&self) -> Ctx {
        let s = &self.settings;
        let interval_ms = (s.stats_interval_seconds as Ms).saturating_mul(1000);
        let n = s.management_servers.clamp(1, 64) as usize;
        Ctx {
            interval_ms,
            offsets: (0..n).map(|k| s.ms_offset_ms(k)).collect(),
            retention_ms: (s.stats_retention_seconds as Ms).saturating_mul(1000),
            timing: Timing {
                boot_ms: secs_to_ms(s.guest_boot_seconds),
                join_ms: secs_to_ms(s.guest_join_seconds),
                speed_permille: (s.guest_speedup.clamp(0.001, 1_000.0) * 1000.0).round() as u64,
            },
            slow_ms: (s.slow_boot_seconds as Ms).saturating_mul(1000),
            expunge_delay_ms: secs_to_ms(s.expunge_delay_seconds),
            expunge_ms: secs_to_ms(s.expunge_seconds),
        }
    }

    // ---- entities -------------------------------------------------------------------

    fn check_id(
        &self,
        id: Option<&str>,
        what: &str,
        taken: impl Fn(&str) -> bool,
    ) -> Result<String, WorldError> {
        match id {
            None => Ok(new_uuid()),
            Some(id) if !is_canonical_uuid(id) => Err(WorldError::Invalid(format!(
                "{what} id {id:?} is not a lowercase canonical UUID"
            ))),
            Some(id) if taken(id) => Err(WorldError::Conflict(format!("duplicate {what} id {id}"))),
            Some(id) => Ok(id.to_string()),
        }
    }

    // ---- time -----------------------------------------------------------------------

    /// Advances the world to simulated time `t` (never backwards), applying scheduled faults
    /// and host changes at their times.
    pub fn advance_to(&mut self, t: Ms) {
        for h in &mut self.hosts {
            h.sync_legacy_control();
        }
        loop {
            let fault = self.scheduled.get(self.next_scheduled).map(|f| f.at_ms);
            let host = self
                .scheduled_hosts
                .get(self.next_scheduled_host)
                .map(|f| f.at_ms);
            let next = match (fault, host) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => break,
            };
            if next > t {
                break;
            }
            self.advance_all(next.max(self.now_ms));
            if fault == Some(next) {
                let f = self.scheduled[self.next_scheduled].clone();
                self.next_scheduled += 1;
                self.apply_fault_now(f.vm, f.fault);
            } else {
                let h = self.scheduled_hosts[self.next_scheduled_host].clone();
                self.next_scheduled_host += 1;
                let _ = self.change_host_now(h.host, &h.change);
            }
        }
        self.advance_all(t);
    }

    fn advance_all(&mut self, t: Ms) {
        if t <= self.now_ms {
            return;
        }
        let c = self.ctx();
        let col = collector::Collections::new(self.now_ms, t, &c);
        let hosts = &self.hosts;
        let mut freed = Vec::new();
        for vm in self.vms.iter_mut() {
            let host = hosts.get(vm.host).map(|h| (h.collectable(), h.hypervisor));
            if vm.advance(t, host, &col, &c) {
                self.by_name.remove(&vm.name);
                freed.extend(vm.nic_assignment());
            }
            vm.rows.expire(col.cutoff);
        }
        for address in freed {
            self.release_address(address);
        }
        self.now_ms = t;
        self.settle_jobs();
    }

    /// Sets (or clears, with `None`) a VM's traffic profile from now on (call `advance_to`
    /// first).
    pub fn set_profile_now(&mut self, idx: usize, p: Option<Profile>) -> Result<(), WorldError> {
        let t = self.now_ms;
        let c = self.ctx();
        let vm = self
            .vms
            .get_mut(idx)
            .ok_or_else(|| WorldError::NotFound(format!("no VM #{idx}")))?;
        vm.set_profile(p, t, &c);
        Ok(())
    }
}

#[cfg(test)]
mod stats_tests;
#[cfg(test)]
mod storm_tests;

#[cfg(test)]
mod test_support {
    use super::*;

    pub(super) const T0: Ms = 1_700_000_000_000;

    pub(super) fn world() -> World {
        let mut w = World::default_world("k", "s", T0);
        w.settings.stats_interval_seconds = 10;
        w.settings.boot_seconds = 5.0;
        w
    }
}
