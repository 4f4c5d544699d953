//! The simulated cloud: accounts, zones, networks, hosts, projects and VMs, and how they
//! evolve with simulated time.
//!
//! Everything that changes on its own (boot, expunge, stats samples, scheduled faults) is a
//! pure function of simulated time and is applied lazily by [`World::advance_to`], which the
//! server calls before answering any request. Advancing is O(number of VMs) with O(1) work
//! per VM and step (counters are closed-form, see [`super::traffic`]), independent of how
//! far the clock jumped.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::net::Ipv4Addr;

use super::catalog::{
    AffinityGroup, AffinityType, AsyncJob, DiskOffering, JobCommand, JobStatus, ServiceOffering,
    Template, DEFAULT_DISK_CUSTOM_ID, DEFAULT_DISK_SMALL_ID, DEFAULT_OFFERING_ID,
    DEFAULT_OFFERING_NAME, DEFAULT_TEMPLATE_ID, DEFAULT_TEMPLATE_NAME,
};
use super::traffic::{self, Behaviour, RateParams};

/// Simulated time: milliseconds since the Unix epoch.
pub type Ms = i64;

/// Formats simulated time the way CloudStack prints dates: `yyyy-MM-dd'T'HH:mm:ss+0000`.
pub fn format_time(ms: Ms) -> String {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(t) => t.strftime("%Y-%m-%dT%H:%M:%S+0000").to_string(),
        Err(_) => "1970-01-01T00:00:00+0000".to_string(),
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

/// CloudStack account types (`Account.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccountType {
    User,
    Admin,
    DomainAdmin,
    ResourceAdmin,
}

impl AccountType {
    pub const ALL: [AccountType; 4] = [
        AccountType::User,
        AccountType::Admin,
        AccountType::DomainAdmin,
        AccountType::ResourceAdmin,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "User" => Some(Self::User),
            "Admin" => Some(Self::Admin),
            "DomainAdmin" => Some(Self::DomainAdmin),
            "ResourceAdmin" => Some(Self::ResourceAdmin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "User",
            Self::Admin => "Admin",
            Self::DomainAdmin => "DomainAdmin",
            Self::ResourceAdmin => "ResourceAdmin",
        }
    }

    /// The numeric `accounttype` CloudStack reports.
    pub fn code(self) -> u8 {
        match self {
            Self::User => 0,
            Self::Admin => 1,
            Self::DomainAdmin => 2,
            Self::ResourceAdmin => 3,
        }
    }
}

/// A secret string whose `Debug`/`Display` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// One dynamic-role rule: an API name pattern (`*` matches any run of characters) and
/// whether it allows or denies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleRule {
    pub rule: String,
    pub allow: bool,
}

/// A dynamic role: ordered rules, first match decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    pub name: String,
    /// The role type (`User`, `DomainAdmin`, …) used by the annotation fallback.
    pub kind: AccountType,
    pub rules: Vec<RoleRule>,
    /// CloudStack allows an API that matches no rule when the command's annotation lists the
    /// role type. Off by default in the simulator so that "no rule" is always 432.
    pub annotation_fallback: bool,
}

/// Result of checking an API name against a role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleDecision {
    Allow,
    Deny,
    NoRule,
}

impl Role {
    pub fn decide(&self, api: &str) -> RoleDecision {
        for r in &self.rules {
            if rule_matches(&r.rule, api) {
                return if r.allow {
                    RoleDecision::Allow
                } else {
                    RoleDecision::Deny
                };
            }
        }
        RoleDecision::NoRule
    }
}

/// Glob match where `*` matches any (possibly empty) run of characters; case-sensitive.
pub fn rule_matches(pattern: &str, name: &str) -> bool {
    let p = pattern.as_bytes();
    let n = name.as_bytes();
    let (mut pi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if pi < p.len() && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// API throttling settings (`api.throttling.max` / `api.throttling.interval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Throttle {
    pub max: u64,
    pub interval_seconds: u64,
}

#[derive(Debug, Clone)]
pub struct Account {
    pub id: String,
    pub name: String,
    pub kind: AccountType,
    pub user_id: String,
    pub username: String,
    pub api_key: String,
    pub secret_key: Secret,
    pub role: Option<Role>,
    /// Per-account throttle; `None` uses the global setting.
    pub throttle: Option<Throttle>,
    pub enabled: bool,
}

impl Account {
    /// Root admin = `Admin` type (the simulator has only the ROOT domain).
    pub fn is_root_admin(&self) -> bool {
        self.kind == AccountType::Admin
    }
}

#[derive(Debug, Clone)]
pub struct Zone {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkType {
    Shared,
    Isolated,
    L2,
}

impl NetworkType {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Shared" => Some(Self::Shared),
            "Isolated" => Some(Self::Isolated),
            "L2" => Some(Self::L2),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "Shared",
            Self::Isolated => "Isolated",
            Self::L2 => "L2",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Network {
    pub id: String,
    pub name: String,
    pub zone: usize,
    pub kind: NetworkType,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
    pub vlan: u32,
    /// The address range NICs get addresses from (CloudStack's guest IP range).
    first_host: u32,
    last_host: u32,
    /// Addresses held by NICs of VMs that are not expunged.
    used: HashSet<u32>,
    /// Lowest address that may be free (allocation scans upwards from here).
    hint: u32,
}

impl Network {
    pub fn netmask(&self) -> Ipv4Addr {
        let m = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix))
        };
        Ipv4Addr::from(m)
    }

    /// Whether `ip` is in the guest range (the gateway excluded).
    pub fn in_range(&self, ip: u32) -> bool {
        self.kind != NetworkType::L2
            && (self.first_host..=self.last_host).contains(&ip)
            && ip != u32::from(self.gateway)
    }

    /// Every address of the guest range, in order.
    pub fn range(&self) -> impl Iterator<Item = u32> + '_ {
        let gw = u32::from(self.gateway);
        let end = if self.kind == NetworkType::L2 {
            self.first_host.saturating_sub(1)
        } else {
            self.last_host
        };
        (self.first_host..=end).filter(move |ip| *ip != gw)
    }

    pub fn is_used(&self, ip: u32) -> bool {
        self.used.contains(&ip)
    }

    /// How many addresses NICs hold.
    pub fn used_count(&self) -> usize {
        self.used.len()
    }

    /// The lowest free address.
    fn allocate(&mut self) -> Option<Ipv4Addr> {
        if self.kind == NetworkType::L2 {
            return None;
        }
        let mut ip = self.hint.max(self.first_host);
        while ip <= self.last_host {
            if self.in_range(ip) && !self.used.contains(&ip) {
                self.used.insert(ip);
                self.hint = ip + 1;
                return Some(Ipv4Addr::from(ip));
            }
            ip += 1;
        }
        None
    }

    /// Takes a requested address; `false` when it is outside the range or held.
    fn allocate_exact(&mut self, ip: Ipv4Addr) -> bool {
        let v = u32::from(ip);
        self.in_range(v) && self.used.insert(v)
    }

    /// Returns an address to the pool (its VM was expunged).
    fn release(&mut self, ip: Ipv4Addr) {
        let v = u32::from(ip);
        if self.used.remove(&v) {
            self.hint = self.hint.min(v);
        }
    }
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

/// Parses `a.b.c.d/len`; returns (network address, prefix).
pub fn parse_cidr(s: &str) -> Option<(u32, u8)> {
    let (ip, len) = s.split_once('/')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    if !(8..=30).contains(&len) {
        return None;
    }
    let mask = u32::MAX << (32 - u32::from(len));
    Some((u32::from(ip) & mask, len))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostControl {
    Enabled,
    Disabled,
    Offline,
    Maintenance,
    Unknown,
}

impl HostControl {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Enabled" => Some(Self::Enabled),
            "Disabled" => Some(Self::Disabled),
            "Offline" => Some(Self::Offline),
            "Maintenance" => Some(Self::Maintenance),
            "Unknown" => Some(Self::Unknown),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enabled => "Enabled",
            Self::Disabled => "Disabled",
            Self::Offline => "Offline",
            Self::Maintenance => "Maintenance",
            Self::Unknown => "Unknown",
        }
    }
    /// Whether the stats collector reaches the host.
    pub fn collects_stats(self) -> bool {
        matches!(self, Self::Enabled | Self::Disabled | Self::Maintenance)
    }
}

#[derive(Debug, Clone)]
pub struct Host {
    pub id: String,
    pub name: String,
    pub zone: usize,
    pub control: HostControl,
    /// The stats collector misses this host although it is connected (a stats gap): its
    /// VMs' counters stay at their last sample and no new samples are kept.
    pub stats_collection_paused: bool,
}

#[derive(Debug, Clone)]
pub struct Project {
    pub id: String,
    pub name: String,
    /// Name of the project's owning account (`PrjAcct-…`), shown as `account` on its VMs.
    pub account_name: String,
    /// Accounts (indices) that are members.
    pub members: Vec<usize>,
}

/// The VM states the simulator produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmState {
    Starting,
    Running,
    /// Live migration to another host: the guest keeps running, the stats collector skips it.
    Migrating,
    Stopped,
    Error,
    Destroyed,
    Expunging,
}

impl VmState {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Starting" => Some(Self::Starting),
            "Running" => Some(Self::Running),
            "Migrating" => Some(Self::Migrating),
            "Stopped" => Some(Self::Stopped),
            "Error" => Some(Self::Error),
            "Destroyed" => Some(Self::Destroyed),
            "Expunging" => Some(Self::Expunging),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "Starting",
            Self::Running => "Running",
            Self::Migrating => "Migrating",
            Self::Stopped => "Stopped",
            Self::Error => "Error",
            Self::Destroyed => "Destroyed",
            Self::Expunging => "Expunging",
        }
    }
    pub const NAMES: &'static [&'static str] = &[
        "Starting",
        "Running",
        "Migrating",
        "Stopped",
        "Error",
        "Destroyed",
        "Expunging",
    ];
}

/// Faults that can be injected into a VM (admin API or scenario schedule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    NicDown,
    NoAddress,
    DetachNic,
    Stop,
    Error,
    Vanish,
    HostOffline,
    StallStarting,
    ServicesFail,
    SlowBoot,
}

impl Fault {
    pub const ALL: [Fault; 10] = [
        Fault::NicDown,
        Fault::NoAddress,
        Fault::DetachNic,
        Fault::Stop,
        Fault::Error,
        Fault::Vanish,
        Fault::HostOffline,
        Fault::StallStarting,
        Fault::ServicesFail,
        Fault::SlowBoot,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NicDown => "nic-down",
            Self::NoAddress => "no-address",
            Self::DetachNic => "detach-nic",
            Self::Stop => "stop",
            Self::Error => "error",
            Self::Vanish => "vanish",
            Self::HostOffline => "host-offline",
            Self::StallStarting => "stall-starting",
            Self::ServicesFail => "services-fail",
            Self::SlowBoot => "slow-boot",
        }
    }

    /// `"nic-down, no-address, …"` for error messages.
    pub fn names() -> String {
        Self::ALL.map(Fault::as_str).join(", ")
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// How the guest behaves from boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestKind {
    Healthy,
    NicDown,
    SlowBoot,
    ServicesFail,
    StallStarting,
    NoAddress,
    DetachNic,
}

impl GuestKind {
    pub const ALL: [GuestKind; 7] = [
        GuestKind::Healthy,
        GuestKind::NicDown,
        GuestKind::SlowBoot,
        GuestKind::ServicesFail,
        GuestKind::StallStarting,
        GuestKind::NoAddress,
        GuestKind::DetachNic,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::NicDown => "nic-down",
            Self::SlowBoot => "slow-boot",
            Self::ServicesFail => "services-fail",
            Self::StallStarting => "stall-starting",
            Self::NoAddress => "no-address",
            Self::DetachNic => "detach-nic",
        }
    }

    pub fn names() -> String {
        Self::ALL.map(GuestKind::as_str).join(", ")
    }

    fn as_fault(self) -> Option<Fault> {
        match self {
            Self::Healthy => None,
            Self::NicDown => Some(Fault::NicDown),
            Self::SlowBoot => Some(Fault::SlowBoot),
            Self::ServicesFail => Some(Fault::ServicesFail),
            Self::StallStarting => Some(Fault::StallStarting),
            Self::NoAddress => Some(Fault::NoAddress),
            Self::DetachNic => Some(Fault::DetachNic),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Nic {
    pub id: String,
    pub mac: String,
    pub ip: Option<Ipv4Addr>,
    pub network: usize,
}

/// One collected stats sample (cumulative counters at a stats-interval boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub at_ms: Ms,
    /// Intervals since the VM started running.
    pub n: u64,
    pub rx_kib: u64,
    pub tx_kib: u64,
    pub disk_read_kib: u64,
    pub disk_write_kib: u64,
    pub cpu_centi: u32,
}

#[derive(Debug, Clone)]
pub struct Vm {
    /// Internal id (creation order); list results are ordered by it.
    pub seq: u64,
    pub id: String,
    pub name: String,
    pub display_name: String,
    pub account: usize,
    pub project: Option<usize>,
    pub zone: usize,
    pub host: usize,
    pub state: VmState,
    pub created_ms: Ms,
    pub last_updated_ms: Ms,
    pub guest: GuestKind,
    faults: u16,
    pub boot_ms: Ms,
    pub transition_at: Option<Ms>,
    /// The host a migration in progress moves the VM to.
    pub migration_target: Option<usize>,
    pub running_since: Option<Ms>,
    nic: Option<Nic>,
    seg_n: u64,
    base_rx: u64,
    base_tx: u64,
    beh: Behaviour,
    pub last_sample: Option<Sample>,
    pub history: VecDeque<Sample>,
    processed_ms: Ms,
    /// Expunged (vanished): the id still resolves but the VM is never listed.
    pub removed: bool,
    pub tags: Vec<(String, String)>,
    pub haenable: bool,
    pub cpu_number: u32,
    pub cpu_speed: u32,
    pub memory_mb: u32,
    /// Service offering and template (indices) the VM was created from.
    pub offering: usize,
    pub template: usize,
    pub root_volume_id: String,
    pub data_disk: Option<DataDisk>,
    /// User data as deployVirtualMachine received it, base64-decoded (CAPC sends gzip).
    pub userdata: Option<Vec<u8>>,
    pub keypair: Option<String>,
    /// Affinity groups (indices).
    pub affinity_groups: Vec<usize>,
    /// `details[i].key=value` of the deploy call.
    pub details: Vec<(String, String)>,
    /// Created through deployVirtualMachine (not by the scenario or the admin API).
    pub deployed: bool,
}

/// A VM's data disk (`listVolumes type=DATADISK`).
#[derive(Debug, Clone)]
pub struct DataDisk {
    pub id: String,
    /// Disk offering (index).
    pub offering: usize,
    pub size_gb: u64,
}

/// Timing and stats parameters the VMs evolve with.
#[derive(Debug, Clone, Copy)]
struct Ctx {
    interval_ms: Ms,
    cap: usize,
    rates: RateParams,
    expunge_delay_ms: Ms,
    expunge_ms: Ms,
}

impl Vm {
    /// Whether a fault is in effect (injected, or the guest kind implies it).
    pub fn has(&self, f: Fault) -> bool {
        self.faults & f.bit() != 0 || self.guest.as_fault() == Some(f)
    }

    /// Injected faults (not counting the guest kind).
    pub fn faults(&self) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|f| self.faults & f.bit() != 0)
            .collect()
    }

    /// The NIC as the API shows it (`None` when detached).
    pub fn visible_nic(&self) -> Option<&Nic> {
        if self.has(Fault::DetachNic) {
            None
        } else {
            self.nic.as_ref()
        }
    }

    /// The network (index) and address the VM's NIC holds, faults aside.
    pub fn nic_assignment(&self) -> Option<(usize, Ipv4Addr)> {
        self.nic
            .as_ref()
            .and_then(|n| n.ip.map(|ip| (n.network, ip)))
    }

    /// The NIC's address as the API shows it.
    pub fn visible_ip(&self) -> Option<Ipv4Addr> {
        if self.has(Fault::NoAddress) {
            None
        } else {
            self.visible_nic().and_then(|n| n.ip)
        }
    }

    pub fn behaviour(&self) -> Behaviour {
        if self.has(Fault::DetachNic) {
            Behaviour::Silent
        } else if self.has(Fault::NicDown) {
            Behaviour::NicDown
        } else if self.has(Fault::SlowBoot) {
            Behaviour::SlowBoot
        } else {
            Behaviour::Healthy
        }
    }

    /// Stats intervals completed between the VM starting to run and `t`.
    fn n_at(&self, t: Ms, interval_ms: Ms) -> u64 {
        match self.running_since {
            Some(rs) if interval_ms > 0 && t >= rs => {
                (t.div_euclid(interval_ms) - rs.div_euclid(interval_ms)).max(0) as u64
            }
            _ => 0,
        }
    }

    /// The hypervisor's cumulative network counters after `n` intervals.
    fn net_at(&self, n: u64, rates: RateParams) -> (u64, u64) {
        let (rx, tx) = traffic::sum(self.beh, self.seg_n, n.max(self.seg_n), rates);
        (self.base_rx + rx, self.base_tx + tx)
    }

    /// Freezes the counters at `t` so that a behaviour change applies from `t` on.
    fn fold(&mut self, t: Ms, c: &Ctx) {
        if self.state == VmState::Running && c.interval_ms > 0 {
            let n = self.n_at(t, c.interval_ms);
            let (rx, tx) = self.net_at(n, c.rates);
            self.base_rx = rx;
            self.base_tx = tx;
            self.seg_n = n.max(self.seg_n);
        }
    }

    fn change_flags(&mut self, t: Ms, c: &Ctx, f: impl FnOnce(&mut Self)) {
        self.fold(t, c);
        f(self);
        self.beh = self.behaviour();
    }

    fn set_state(&mut self, s: VmState, t: Ms) {
        if self.state != s {
            self.state = s;
            self.last_updated_ms = t;
        }
    }

    fn start_running(&mut self, t: Ms) {
        self.set_state(VmState::Running, t);
        self.running_since = Some(t);
        self.transition_at = None;
        self.seg_n = 0;
        self.base_rx = 0;
        self.base_tx = 0;
        self.beh = self.behaviour();
    }

    fn stop_running(&mut self, s: VmState, t: Ms) {
        self.set_state(s, t);
        self.running_since = None;
        self.transition_at = None;
    }

    fn sample(&self, at_ms: Ms, n: u64, c: &Ctx) -> Sample {
        let (rx, tx) = self.net_at(n, c.rates);
        let (dr, dw) = traffic::disk(n, c.rates);
        Sample {
            at_ms,
            n,
            rx_kib: rx,
            tx_kib: tx,
            disk_read_kib: dr,
            disk_write_kib: dw,
            cpu_centi: traffic::cpu_centi(self.beh, self.seq, n, c.rates),
        }
    }

    /// Collects the samples at stats boundaries in `(from, to]`.
    fn collect(&mut self, from: Ms, to: Ms, online: bool, c: &Ctx) {
        let i = c.interval_ms;
        if i <= 0 || self.state != VmState::Running || !online || to <= from {
            return;
        }
        let Some(rs) = self.running_since else {
            return;
        };
        let first = from.div_euclid(i) + 1;
        let last = to.div_euclid(i);
        if last < first {
            return;
        }
        let start = first.max(last - c.cap as i64 + 1);
        let rs_b = rs.div_euclid(i);
        for b in start..=last {
            let n = (b - rs_b).max(0) as u64;
            let s = self.sample(b * i, n, c);
            self.history.push_back(s);
            if self.history.len() > c.cap {
                self.history.pop_front();
            }
            self.last_sample = Some(s);
        }
    }

    /// Moves this VM to time `t`. Returns true when the VM was expunged on the way.
    fn advance(&mut self, t: Ms, online: bool, c: &Ctx) -> bool {
        if self.removed || t <= self.processed_ms {
            return false;
        }
        loop {
            let next = self.transition_at.filter(|x| *x <= t);
            let end = next.unwrap_or(t).max(self.processed_ms);
            self.collect(self.processed_ms, end, online, c);
            self.processed_ms = end;
            let Some(x) = next else { break };
            match self.state {
                VmState::Starting => self.start_running(x),
                VmState::Destroyed => {
                    self.set_state(VmState::Expunging, x);
                    self.running_since = None;
                    self.transition_at = Some(x + c.expunge_ms);
                }
                VmState::Expunging => {
                    self.transition_at = None;
                    self.removed = true;
                    self.processed_ms = t;
                    return true;
                }
                // The guest ran on throughout: counters continue from `running_since`.
                VmState::Migrating => {
                    self.set_state(VmState::Running, x);
                    self.host = self.migration_target.take().unwrap_or(self.host);
                    self.transition_at = None;
                }
                _ => self.transition_at = None,
            }
        }
        false
    }
}

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

/// A fault scheduled at a simulated time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledFault {
    pub at_ms: Ms,
    pub vm: usize,
    pub fault: Fault,
}

/// What to create (admin API, scenario files, benchmarks).
#[derive(Debug, Clone)]
pub struct VmSpec {
    pub name: String,
    /// Fixed id (lowercase canonical UUID); random when absent.
    pub id: Option<String>,
    pub display_name: Option<String>,
    pub state: VmState,
    pub guest: GuestKind,
    /// Account name; the default account when absent.
    pub account: Option<String>,
    /// Zone name or id; the first zone when absent.
    pub zone: Option<String>,
    /// Network name or id; the zone's first network when absent.
    pub network: Option<String>,
    /// Project name or id.
    pub project: Option<String>,
    /// Host name or id; spread over the zone's hosts when absent.
    pub host: Option<String>,
    /// Boot delay; the settings' default when absent.
    pub boot_seconds: Option<f64>,
    pub tags: Vec<(String, String)>,
    pub haenable: bool,
    /// Service offering name or id; the first offering when absent.
    pub offering: Option<String>,
    /// Template name or id; the first template when absent.
    pub template: Option<String>,
    /// A requested NIC address; the lowest free one when absent.
    pub ip: Option<Ipv4Addr>,
    /// Data disk: disk offering (index) and size in GB.
    pub data_disk: Option<(usize, u64)>,
    pub userdata: Option<Vec<u8>>,
    pub keypair: Option<String>,
    pub affinity_groups: Vec<usize>,
    pub details: Vec<(String, String)>,
    /// Set by deployVirtualMachine.
    pub deployed: bool,
}

impl VmSpec {
    /// A healthy VM that starts booting when created.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            id: None,
            display_name: None,
            state: VmState::Starting,
            guest: GuestKind::Healthy,
            account: None,
            zone: None,
            network: None,
            project: None,
            host: None,
            boot_seconds: None,
            tags: Vec::new(),
            haenable: false,
            offering: None,
            template: None,
            ip: None,
            data_disk: None,
            userdata: None,
            keypair: None,
            affinity_groups: Vec::new(),
            details: Vec::new(),
            deployed: false,
        }
    }
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
    jobs: Vec<AsyncJob>,
    job_by_id: HashMap<String, usize>,
    /// Jobs (indices) that wait for a VM to finish starting.
    pending_jobs: Vec<usize>,
    vms: Vec<Vm>,
    by_id: HashMap<String, usize>,
    by_name: HashMap<String, usize>,
    scheduled: Vec<ScheduledFault>,
    next_scheduled: usize,
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
            jobs: Vec::new(),
            job_by_id: HashMap::new(),
            pending_jobs: Vec::new(),
            vms: Vec::new(),
            by_id: HashMap::new(),
            by_name: HashMap::new(),
            scheduled: Vec::new(),
            next_scheduled: 0,
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
        let cap = s
            .stats_retention_seconds
            .checked_div(s.stats_interval_seconds)
            .map_or(1, |c| c.max(1) as usize);
        let slow_intervals = if s.stats_interval_seconds == 0 {
            0
        } else {
            s.slow_boot_seconds.div_ceil(s.stats_interval_seconds)
        };
        Ctx {
            interval_ms,
            cap: cap.min(100_000),
            rates: RateParams {
                interval_s: s.stats_interval_seconds.max(1),
                slow_intervals,
            },
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

    pub fn add_zone(&mut self, name: &str, id: Option<&str>) -> Result<usize, WorldError> {
        unique_name(&self.zones, |z| &z.name, "zone", name)?;
        let id = self.check_id(id, "zone", |i| self.zones.iter().any(|z| z.id == i))?;
        self.zones.push(Zone {
            id,
            name: name.to_string(),
        });
        Ok(self.zones.len() - 1)
    }

    pub fn zone_index(&self, name_or_id: &str) -> Option<usize> {
        self.zones
            .iter()
            .position(|z| z.name == name_or_id || z.id == name_or_id)
    }

    fn zone_or_first(&self, z: Option<&str>) -> Result<usize, WorldError> {
        match z {
            Some(z) => self
                .zone_index(z)
                .ok_or_else(|| WorldError::NotFound(format!("unknown zone {z:?}"))),
            None if self.zones.is_empty() => Err(WorldError::NotFound("no zone defined".into())),
            None => Ok(0),
        }
    }

    /// Adds a network with addresses from `cidr` (`gateway` defaults to the first address).
    pub fn add_network(
        &mut self,
        name: &str,
        id: Option<&str>,
        zone: Option<&str>,
        cidr: &str,
        gateway: Option<&str>,
        kind: NetworkType,
    ) -> Result<usize, WorldError> {
        unique_name(&self.networks, |n| &n.name, "network", name)?;
        let zone = self.zone_or_first(zone)?;
        let (base, prefix) = parse_cidr(cidr).ok_or_else(|| {
            WorldError::Invalid(format!(
                "bad cidr {cidr:?} (expected a.b.c.d/len with len 8..30)"
            ))
        })?;
        let broadcast = base | !(u32::MAX << (32 - u32::from(prefix)));
        let gateway = match gateway {
            Some(g) => {
                let ip: Ipv4Addr = g
                    .parse()
                    .map_err(|_| WorldError::Invalid(format!("bad gateway {g:?}")))?;
                let v = u32::from(ip);
                if v <= base || v >= broadcast {
                    return Err(WorldError::Invalid(format!(
                        "gateway {g} is outside {cidr}"
                    )));
                }
                ip
            }
            None => Ipv4Addr::from(base + 1),
        };
        let id = self.check_id(id, "network", |i| self.networks.iter().any(|n| n.id == i))?;
        let vlan = 1000 + self.networks.len() as u32;
        self.networks.push(Network {
            id,
            name: name.to_string(),
            zone,
            kind,
            prefix,
            gateway,
            vlan,
            first_host: base + 10.min(broadcast - base - 1),
            last_host: broadcast - 1,
            used: HashSet::new(),
            hint: 0,
        });
        Ok(self.networks.len() - 1)
    }

    pub fn network_index(&self, name_or_id: &str) -> Option<usize> {
        self.networks
            .iter()
            .position(|n| n.name == name_or_id || n.id == name_or_id)
    }

    pub fn add_host(
        &mut self,
        name: &str,
        id: Option<&str>,
        zone: Option<&str>,
        control: HostControl,
    ) -> Result<usize, WorldError> {
        unique_name(&self.hosts, |h| &h.name, "host", name)?;
        let zone = self.zone_or_first(zone)?;
        let id = self.check_id(id, "host", |i| self.hosts.iter().any(|h| h.id == i))?;
        self.hosts.push(Host {
            id,
            name: name.to_string(),
            zone,
            control,
            stats_collection_paused: false,
        });
        Ok(self.hosts.len() - 1)
    }

    pub fn host_index(&self, name_or_id: &str) -> Option<usize> {
        self.hosts
            .iter()
            .position(|h| h.name == name_or_id || h.id == name_or_id)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn add_account(
        &mut self,
        name: &str,
        id: Option<&str>,
        kind: AccountType,
        api_key: &str,
        secret_key: &str,
        role: Option<Role>,
        throttle: Option<Throttle>,
    ) -> Result<usize, WorldError> {
        unique_name(&self.accounts, |a| &a.name, "account", name)?;
        if api_key.is_empty() || secret_key.is_empty() {
            return Err(WorldError::Invalid(format!(
                "account {name:?} needs a non-empty api key and secret key"
            )));
        }
        if self.accounts.iter().any(|a| a.api_key == api_key) {
            return Err(WorldError::Conflict(format!(
                "account {name:?} reuses another account's api key"
            )));
        }
        let id = self.check_id(id, "account", |i| self.accounts.iter().any(|a| a.id == i))?;
        self.accounts.push(Account {
            id,
            name: name.to_string(),
            kind,
            user_id: new_uuid(),
            username: name.to_string(),
            api_key: api_key.to_string(),
            secret_key: Secret::new(secret_key),
            role,
            throttle,
            enabled: true,
        });
        Ok(self.accounts.len() - 1)
    }

    pub fn account_index(&self, name: &str) -> Option<usize> {
        self.accounts.iter().position(|a| a.name == name)
    }

    pub fn account_by_api_key(&self, key: &str) -> Option<usize> {
        self.accounts.iter().position(|a| a.api_key == key)
    }

    pub fn add_project(
        &mut self,
        name: &str,
        id: Option<&str>,
        members: &[String],
    ) -> Result<usize, WorldError> {
        unique_name(&self.projects, |p| &p.name, "project", name)?;
        let mut m = Vec::new();
        for a in members {
            m.push(self.account_index(a).ok_or_else(|| {
                WorldError::NotFound(format!("project {name:?}: unknown member account {a:?}"))
            })?);
        }
        let id = self.check_id(id, "project", |i| self.projects.iter().any(|p| p.id == i))?;
        let account_name = format!("PrjAcct-{name}-{}", self.projects.len() + 1);
        self.projects.push(Project {
            id,
            name: name.to_string(),
            account_name,
            members: m,
        });
        Ok(self.projects.len() - 1)
    }

    pub fn project_index(&self, name_or_id: &str) -> Option<usize> {
        self.projects
            .iter()
            .position(|p| p.name == name_or_id || p.id == name_or_id)
    }

    // ---- VMs ------------------------------------------------------------------------

    /// All VMs ever created, in creation order (including expunged ones: check `removed`).
    pub fn vms(&self) -> &[Vm] {
        &self.vms
    }

    pub fn vm(&self, idx: usize) -> Option<&Vm> {
        self.vms.get(idx)
    }

    /// Index of the VM with this id (also for expunged VMs).
    pub fn vm_index_by_id(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    /// Index of a live VM by name, or any VM by id.
    pub fn vm_index(&self, name_or_id: &str) -> Option<usize> {
        self.by_name
            .get(name_or_id)
            .or_else(|| self.by_id.get(name_or_id))
            .copied()
    }

    // Lookups by UUID alone, as API parameters name objects (`*_index` also take names).

    pub fn zone_by_id(&self, id: &str) -> Option<usize> {
        self.zones.iter().position(|z| z.id == id)
    }

    pub fn network_by_id(&self, id: &str) -> Option<usize> {
        self.networks.iter().position(|n| n.id == id)
    }

    pub fn service_offering_by_id(&self, id: &str) -> Option<usize> {
        self.service_offerings.iter().position(|o| o.id == id)
    }

    pub fn template_by_id(&self, id: &str) -> Option<usize> {
        self.templates.iter().position(|t| t.id == id)
    }

    pub fn disk_offering_by_id(&self, id: &str) -> Option<usize> {
        self.disk_offerings.iter().position(|d| d.id == id)
    }

    /// Creates a VM at the current simulated time; returns its index.
    pub fn add_vm(&mut self, spec: &VmSpec) -> Result<usize, WorldError> {
        let name = spec.name.trim();
        if name.is_empty() {
            return Err(WorldError::Invalid("VM name must not be empty".into()));
        }
        if self.by_name.contains_key(name) {
            return Err(WorldError::Conflict(format!(
                "a VM named {name:?} already exists"
            )));
        }
        let id = match &spec.id {
            Some(id) if !is_canonical_uuid(id) => {
                return Err(WorldError::Invalid(format!(
                    "VM id {id:?} is not a lowercase canonical UUID"
                )))
            }
            Some(id) if self.by_id.contains_key(id.as_str()) => {
                return Err(WorldError::Conflict(format!("duplicate VM id {id}")))
            }
            Some(id) => id.clone(),
            None => new_uuid(),
        };
        let account = match spec
            .account
            .as_deref()
            .or(self.settings.default_account.as_deref())
        {
            Some(a) => self
                .account_index(a)
                .ok_or_else(|| WorldError::NotFound(format!("unknown account {a:?}")))?,
            None if self.accounts.is_empty() => {
                return Err(WorldError::NotFound("no account defined".into()))
            }
            None => 0,
        };
        let project = match &spec.project {
            Some(p) => Some(
                self.project_index(p)
                    .ok_or_else(|| WorldError::NotFound(format!("unknown project {p:?}")))?,
            ),
            None => None,
        };
        let zone = self.zone_or_first(spec.zone.as_deref())?;
        let network = match &spec.network {
            Some(n) => {
                let i = self
                    .network_index(n)
                    .ok_or_else(|| WorldError::NotFound(format!("unknown network {n:?}")))?;
                if self.networks[i].zone != zone {
                    return Err(WorldError::Invalid(format!(
                        "network {n:?} is not in zone {:?}",
                        self.zones[zone].name
                    )));
                }
                i
            }
            None => self
                .networks
                .iter()
                .position(|n| n.zone == zone)
                .ok_or_else(|| {
                    WorldError::NotFound(format!("zone {:?} has no network", self.zones[zone].name))
                })?,
        };
        let seq = self.next_seq;
        let host = match &spec.host {
            Some(h) => self
                .host_index(h)
                .ok_or_else(|| WorldError::NotFound(format!("unknown host {h:?}")))?,
            None => {
                let in_zone: Vec<usize> = (0..self.hosts.len())
                    .filter(|i| self.hosts[*i].zone == zone)
                    .collect();
                if in_zone.is_empty() {
                    return Err(WorldError::NotFound(format!(
                        "zone {:?} has no host",
                        self.zones[zone].name
                    )));
                }
                in_zone[(seq as usize) % in_zone.len()]
            }
        };
        let boot_s = spec.boot_seconds.unwrap_or(self.settings.boot_seconds);
        if !(boot_s.is_finite() && boot_s >= 0.0) {
            return Err(WorldError::Invalid(format!("bad boot_seconds {boot_s}")));
        }
        let offering = self.offering_for(spec.offering.as_deref(), zone)?;
        let template = self.template_for(spec.template.as_deref(), zone)?;
        let ip = match spec.ip {
            Some(want) if self.networks[network].allocate_exact(want) => Some(want),
            Some(want) => {
                return Err(WorldError::Conflict(format!(
                    "address {want} is not available in network {:?}",
                    self.networks[network].name
                )))
            }
            None => self.networks[network].allocate(),
        };
        if ip.is_none() && self.networks[network].kind != NetworkType::L2 {
            return Err(WorldError::Conflict(format!(
                "network {:?} has no free address",
                self.networks[network].name
            )));
        }
        let size = &self.service_offerings[offering];
        let (cpu_number, cpu_speed, memory_mb) = (size.cpu_number, size.cpu_speed, size.memory_mb);
        let now = self.now_ms;
        let c = self.ctx();
        let mac_n = seq & 0xffff_ffff;
        let mut vm = Vm {
            seq,
            id: id.clone(),
            name: name.to_string(),
            display_name: spec
                .display_name
                .clone()
                .unwrap_or_else(|| name.to_string()),
            account,
            project,
            zone,
            host,
            state: spec.state,
            created_ms: now,
            last_updated_ms: now,
            guest: spec.guest,
            faults: 0,
            boot_ms: secs_to_ms(boot_s),
            transition_at: None,
            migration_target: None,
            running_since: None,
            nic: Some(Nic {
                id: new_uuid(),
                mac: format!(
                    "02:00:{:02x}:{:02x}:{:02x}:{:02x}",
                    (mac_n >> 24) & 0xff,
                    (mac_n >> 16) & 0xff,
                    (mac_n >> 8) & 0xff,
                    mac_n & 0xff
                ),
                ip,
                network,
            }),
            seg_n: 0,
            base_rx: 0,
            base_tx: 0,
            beh: Behaviour::Healthy,
            last_sample: None,
            history: VecDeque::new(),
            processed_ms: now,
            removed: false,
            tags: spec.tags.clone(),
            haenable: spec.haenable,
            cpu_number,
            cpu_speed,
            memory_mb,
            offering,
            template,
            root_volume_id: new_uuid(),
            data_disk: spec.data_disk.map(|(offering, size_gb)| DataDisk {
                id: new_uuid(),
                offering,
                size_gb,
            }),
            userdata: spec.userdata.clone(),
            keypair: spec.keypair.clone(),
            affinity_groups: spec.affinity_groups.clone(),
            details: spec.details.clone(),
            deployed: spec.deployed,
        };
        vm.beh = vm.behaviour();
        match spec.state {
            VmState::Starting if !vm.has(Fault::StallStarting) => {
                vm.transition_at = Some(now + vm.boot_ms)
            }
            VmState::Running => vm.start_running(now),
            VmState::Destroyed => vm.transition_at = Some(now + c.expunge_delay_ms),
            VmState::Expunging => vm.transition_at = Some(now + c.expunge_ms),
            _ => {}
        }
        self.next_seq += 1;
        let idx = self.vms.len();
        self.by_id.insert(id, idx);
        self.by_name.insert(vm.name.clone(), idx);
        self.vms.push(vm);
        Ok(idx)
    }

    /// Creates `n` VMs named `<prefix>-<i>` (i from 0) from a template, quickly.
    pub fn add_vms(
        &mut self,
        n: usize,
        prefix: &str,
        template: &VmSpec,
    ) -> Result<Vec<usize>, WorldError> {
        self.vms.reserve(n);
        self.by_id.reserve(n);
        self.by_name.reserve(n);
        let mut spec = template.clone();
        spec.id = None;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            spec.name = format!("{prefix}-{i}");
            out.push(self.add_vm(&spec)?);
        }
        Ok(out)
    }

    /// Schedules a fault for a VM at a simulated time (ms since epoch).
    pub fn schedule_fault(&mut self, at_ms: Ms, vm: usize, fault: Fault) -> Result<(), WorldError> {
        if vm >= self.vms.len() {
            return Err(WorldError::NotFound(format!("no VM with index {vm}")));
        }
        let pending = &mut self.scheduled[self.next_scheduled..];
        let pos = pending.partition_point(|f| f.at_ms <= at_ms) + self.next_scheduled;
        self.scheduled
            .insert(pos, ScheduledFault { at_ms, vm, fault });
        Ok(())
    }

    /// Faults not yet applied.
    pub fn pending_faults(&self) -> &[ScheduledFault] {
        &self.scheduled[self.next_scheduled..]
    }

    /// Destroys a VM now: `Destroyed` (expunged after the expunge delay) or, with
    /// `expunge`, straight to `Expunging`. Already destroyed VMs only move on when
    /// `expunge` asks for it; expunging or expunged VMs do not change.
    pub fn destroy_vm_now(&mut self, idx: usize, expunge: bool) {
        let t = self.now_ms;
        let c = self.ctx();
        let Some(vm) = self.vms.get_mut(idx) else {
            return;
        };
        if vm.removed {
            return;
        }
        match (vm.state, expunge) {
            (VmState::Expunging, _) | (VmState::Destroyed, false) => {}
            (_, true) => {
                vm.stop_running(VmState::Expunging, t);
                vm.transition_at = Some(t + c.expunge_ms);
            }
            (_, false) => {
                vm.stop_running(VmState::Destroyed, t);
                vm.transition_at = Some(t + c.expunge_delay_ms);
            }
        }
    }

    /// Deletes a VM's data disk (destroyed together with the VM).
    pub fn drop_data_disk(&mut self, idx: usize) {
        if let Some(vm) = self.vms.get_mut(idx) {
            vm.data_disk = None;
        }
    }

    // ---- catalogue ------------------------------------------------------------------

    fn zone_refs(&self, refs: &[String]) -> Result<Vec<usize>, WorldError> {
        refs.iter()
            .map(|z| {
                self.zone_index(z)
                    .ok_or_else(|| WorldError::NotFound(format!("unknown zone {z:?}")))
            })
            .collect()
    }

    /// Adds a service offering; `zones` (names or ids) restrict it, empty = every zone.
    pub fn add_service_offering(
        &mut self,
        name: &str,
        id: Option<&str>,
        cpu_number: u32,
        cpu_speed: u32,
        memory_mb: u32,
        zones: &[String],
    ) -> Result<usize, WorldError> {
        unique_name(
            &self.service_offerings,
            |o| &o.name,
            "service offering",
            name,
        )?;
        if cpu_number == 0 || memory_mb == 0 {
            return Err(WorldError::Invalid(format!(
                "service offering {name:?} needs at least 1 cpu and 1 MiB of memory"
            )));
        }
        let zones = self.zone_refs(zones)?;
        let id = self.check_id(id, "service offering", |i| {
            self.service_offerings.iter().any(|o| o.id == i)
        })?;
        self.service_offerings.push(ServiceOffering {
            id,
            name: name.to_string(),
            display_text: name.to_string(),
            cpu_number,
            cpu_speed,
            memory_mb,
            zones,
        });
        Ok(self.service_offerings.len() - 1)
    }

    pub fn service_offering_index(&self, name_or_id: &str) -> Option<usize> {
        self.service_offerings
            .iter()
            .position(|o| o.id == name_or_id || o.name == name_or_id)
    }

    /// Adds a ready template in `zones` (names or ids; empty = every zone).
    pub fn add_template(
        &mut self,
        name: &str,
        id: Option<&str>,
        zones: &[String],
    ) -> Result<usize, WorldError> {
        unique_name(&self.templates, |t| &t.name, "template", name)?;
        let mut zones = self.zone_refs(zones)?;
        if zones.is_empty() {
            zones = (0..self.zones.len()).collect();
        }
        let id = self.check_id(id, "template", |i| self.templates.iter().any(|t| t.id == i))?;
        self.templates.push(Template {
            id,
            name: name.to_string(),
            display_text: name.to_string(),
            zones,
            size_bytes: 8 * 1024 * 1024 * 1024,
        });
        Ok(self.templates.len() - 1)
    }

    pub fn template_index(&self, name_or_id: &str) -> Option<usize> {
        self.templates
            .iter()
            .position(|t| t.id == name_or_id || t.name == name_or_id)
    }

    /// Adds a disk offering: a fixed size in GB, or `customized` (size given at deploy).
    pub fn add_disk_offering(
        &mut self,
        name: &str,
        id: Option<&str>,
        disk_size_gb: u64,
        customized: bool,
        zones: &[String],
    ) -> Result<usize, WorldError> {
        unique_name(&self.disk_offerings, |d| &d.name, "disk offering", name)?;
        if !customized && disk_size_gb == 0 {
            return Err(WorldError::Invalid(format!(
                "disk offering {name:?} needs a size or customized: true"
            )));
        }
        let zones = self.zone_refs(zones)?;
        let id = self.check_id(id, "disk offering", |i| {
            self.disk_offerings.iter().any(|d| d.id == i)
        })?;
        self.disk_offerings.push(DiskOffering {
            id,
            name: name.to_string(),
            display_text: name.to_string(),
            disk_size_gb: if customized { 0 } else { disk_size_gb },
            customized,
            zones,
        });
        Ok(self.disk_offerings.len() - 1)
    }

    pub fn disk_offering_index(&self, name_or_id: &str) -> Option<usize> {
        self.disk_offerings
            .iter()
            .position(|d| d.id == name_or_id || d.name == name_or_id)
    }

    /// The offering a VM gets: the named one (it must serve the zone) or the first that does.
    fn offering_for(&self, r: Option<&str>, zone: usize) -> Result<usize, WorldError> {
        let i = match r {
            Some(r) => self
                .service_offering_index(r)
                .ok_or_else(|| WorldError::NotFound(format!("unknown service offering {r:?}")))?,
            None => self
                .service_offerings
                .iter()
                .position(|o| o.in_zone(zone))
                .ok_or_else(|| WorldError::NotFound("no service offering for the zone".into()))?,
        };
        if !self.service_offerings[i].in_zone(zone) {
            return Err(WorldError::Invalid(format!(
                "service offering {:?} is not available in zone {:?}",
                self.service_offerings[i].name, self.zones[zone].name
            )));
        }
        Ok(i)
    }

    /// The template a VM gets: the named one (it must be in the zone) or the first that is.
    fn template_for(&self, r: Option<&str>, zone: usize) -> Result<usize, WorldError> {
        let i = match r {
            Some(r) => self
                .template_index(r)
                .ok_or_else(|| WorldError::NotFound(format!("unknown template {r:?}")))?,
            None => self
                .templates
                .iter()
                .position(|t| t.zones.contains(&zone))
                .ok_or_else(|| WorldError::NotFound("no template in the zone".into()))?,
        };
        if !self.templates[i].zones.contains(&zone) {
            return Err(WorldError::Invalid(format!(
                "template {:?} is not in zone {:?}",
                self.templates[i].name, self.zones[zone].name
            )));
        }
        Ok(i)
    }

    /// Creates an affinity group; names are unique per owner (account or project).
    pub fn add_affinity_group(
        &mut self,
        name: &str,
        kind: AffinityType,
        description: &str,
        account: usize,
        project: Option<usize>,
    ) -> Result<usize, WorldError> {
        let taken = self.affinity_groups.iter().any(|g| {
            !g.deleted
                && g.name == name
                && g.project == project
                && (project.is_some() || g.account == account)
        });
        if taken {
            return Err(WorldError::Conflict(format!(
                "Unable to create affinity group, a group with name {name} already exists."
            )));
        }
        self.affinity_groups.push(AffinityGroup {
            id: new_uuid(),
            name: name.to_string(),
            kind,
            description: description.to_string(),
            account,
            project,
            deleted: false,
        });
        Ok(self.affinity_groups.len() - 1)
    }

    /// A live affinity group by id.
    pub fn affinity_group_by_id(&self, id: &str) -> Option<usize> {
        self.affinity_groups
            .iter()
            .position(|g| !g.deleted && g.id == id)
    }

    /// Live, non-expunged VMs (indices) that are members of an affinity group.
    pub fn affinity_members(&self, group: usize) -> Vec<usize> {
        (0..self.vms.len())
            .filter(|i| {
                let vm = &self.vms[*i];
                !vm.removed && vm.affinity_groups.contains(&group)
            })
            .collect()
    }

    // ---- async jobs -----------------------------------------------------------------

    /// Records a job submitted by `account` now; returns its index. Pending deploy jobs
    /// finish when their VM stops starting.
    pub fn add_job(
        &mut self,
        account: usize,
        command: JobCommand,
        instance_id: &str,
        status: JobStatus,
    ) -> usize {
        let idx = self.jobs.len();
        let id = new_uuid();
        if status == JobStatus::Pending {
            self.pending_jobs.push(idx);
        }
        self.job_by_id.insert(id.clone(), idx);
        self.jobs.push(AsyncJob {
            id,
            account,
            command,
            created_ms: self.now_ms,
            instance_id: instance_id.to_string(),
            status,
        });
        // A VM that is already past starting (startvm=false, failed placement) settles now.
        self.settle_jobs();
        idx
    }

    pub fn job(&self, idx: usize) -> Option<&AsyncJob> {
        self.jobs.get(idx)
    }

    pub fn job_index(&self, id: &str) -> Option<usize> {
        self.job_by_id.get(id).copied()
    }

    // ---- time -----------------------------------------------------------------------

    /// Advances the world to simulated time `t` (never backwards).
    pub fn advance_to(&mut self, t: Ms) {
        while let Some(f) = self.scheduled.get(self.next_scheduled).cloned() {
            if f.at_ms > t {
                break;
            }
            self.next_scheduled += 1;
            let at = f.at_ms.max(self.now_ms);
            self.advance_all(at);
            self.apply_fault_now(f.vm, f.fault);
        }
        self.advance_all(t);
    }

    fn advance_all(&mut self, t: Ms) {
        if t <= self.now_ms {
            return;
        }
        let c = self.ctx();
        let hosts = &self.hosts;
        let mut freed = Vec::new();
        for vm in self.vms.iter_mut() {
            let online = hosts
                .get(vm.host)
                .is_some_and(|h| h.control.collects_stats() && !h.stats_collection_paused);
            if vm.advance(t, online, &c) {
                self.by_name.remove(&vm.name);
                freed.extend(vm.nic_assignment());
            }
        }
        for address in freed {
            self.release_address(address);
        }
        self.now_ms = t;
        self.settle_jobs();
    }

    /// Returns an expunged VM's NIC address (network index, address) to the network's pool.
    fn release_address(&mut self, (network, ip): (usize, Ipv4Addr)) {
        if let Some(n) = self.networks.get_mut(network) {
            n.release(ip);
        }
    }

    /// Finishes the deploy jobs whose VM is no longer starting.
    fn settle_jobs(&mut self) {
        if self.pending_jobs.is_empty() {
            return;
        }
        let mut still = Vec::new();
        for j in std::mem::take(&mut self.pending_jobs) {
            let outcome = match self.jobs[j].command {
                JobCommand::DeployVm { vm } => self.vms.get(vm).and_then(deploy_outcome),
                // Other jobs are finished when they are created.
                _ => Some(JobStatus::Succeeded { at_ms: self.now_ms }),
            };
            match outcome {
                Some(s) => self.jobs[j].status = s,
                None => still.push(j),
            }
        }
        self.pending_jobs = still;
    }

    /// Applies a fault at the current simulated time (call `advance_to` first).
    pub fn apply_fault_now(&mut self, idx: usize, fault: Fault) {
        let t = self.now_ms;
        let c = self.ctx();
        let Some(vm) = self.vms.get_mut(idx) else {
            return;
        };
        if vm.removed {
            return;
        }
        let bit = fault.bit();
        match fault {
            Fault::NicDown
            | Fault::NoAddress
            | Fault::DetachNic
            | Fault::ServicesFail
            | Fault::SlowBoot => vm.change_flags(t, &c, |v| v.faults |= bit),
            Fault::StallStarting => {
                vm.faults |= bit;
                if matches!(vm.state, VmState::Running | VmState::Starting) {
                    vm.stop_running(VmState::Starting, t);
                }
            }
            Fault::Stop => {
                vm.faults |= bit;
                vm.stop_running(VmState::Stopped, t);
            }
            Fault::Error => {
                vm.faults |= bit;
                vm.stop_running(VmState::Error, t);
            }
            Fault::Vanish => {
                vm.faults |= bit;
                vm.removed = true;
                vm.transition_at = None;
                let name = vm.name.clone();
                let freed = vm.nic_assignment();
                self.by_name.remove(&name);
                if let Some(address) = freed {
                    self.release_address(address);
                }
            }
            Fault::HostOffline => {
                vm.faults |= bit;
                let h = vm.host;
                if let Some(h) = self.hosts.get_mut(h) {
                    h.control = HostControl::Offline;
                }
            }
        }
    }

    /// Starts a live migration of a Running VM to `host`, taking `seconds` (what
    /// `migrateVirtualMachine` or a host entering maintenance does): `Migrating`, then
    /// `Running` on the new host.
    pub fn migrate_now(&mut self, idx: usize, host: usize, seconds: f64) -> Result<(), WorldError> {
        let t = self.now_ms;
        if host >= self.hosts.len() {
            return Err(WorldError::NotFound(format!("no host #{host}")));
        }
        let vm = self
            .vms
            .get_mut(idx)
            .ok_or_else(|| WorldError::NotFound(format!("no VM #{idx}")))?;
        if vm.state != VmState::Running {
            return Err(WorldError::Conflict(format!(
                "VM {} is {}, not Running",
                vm.name,
                vm.state.as_str()
            )));
        }
        vm.set_state(VmState::Migrating, t);
        vm.migration_target = Some(host);
        vm.transition_at = Some(t + (seconds * 1000.0).round().max(1.0) as Ms);
        Ok(())
    }

    /// Clears the injected faults of a VM at the current simulated time: NIC and address
    /// come back, the host goes back online, a stalled start proceeds. A VM that was stopped,
    /// put in Error or expunged stays so.
    pub fn clear_faults_now(&mut self, idx: usize) {
        let t = self.now_ms;
        let c = self.ctx();
        let Some(vm) = self.vms.get_mut(idx) else {
            return;
        };
        let host = vm.host;
        let had_host_offline = vm.faults & Fault::HostOffline.bit() != 0;
        vm.change_flags(t, &c, |v| v.faults = 0);
        if vm.state == VmState::Starting
            && vm.transition_at.is_none()
            && !vm.has(Fault::StallStarting)
        {
            vm.transition_at = Some(t + vm.boot_ms);
        }
        if had_host_offline {
            if let Some(h) = self.hosts.get_mut(host) {
                h.control = HostControl::Enabled;
            }
        }
    }

    /// Whether the guest would have joined its cluster by now (admin view only).
    pub fn joined(&self, vm: &Vm) -> bool {
        let Some(rs) = vm.running_since else {
            return false;
        };
        if vm.state != VmState::Running
            || vm.removed
            || vm.has(Fault::ServicesFail)
            || vm.has(Fault::NicDown)
            || vm.has(Fault::DetachNic)
            || vm.visible_ip().is_none()
        {
            return false;
        }
        let ready_at = if vm.has(Fault::SlowBoot) {
            rs + (self.settings.slow_boot_seconds as Ms) * 1000
        } else {
            rs
        };
        self.now_ms >= ready_at
    }
}

/// How a deploy job ends, judged from its VM: `None` while the VM is still starting.
fn deploy_outcome(vm: &Vm) -> Option<JobStatus> {
    let at_ms = vm.last_updated_ms;
    match vm.state {
        _ if vm.removed => Some(destroyed_before_start(vm, at_ms)),
        VmState::Starting => None,
        VmState::Running | VmState::Migrating | VmState::Stopped => {
            Some(JobStatus::Succeeded { at_ms })
        }
        VmState::Error => Some(JobStatus::Failed {
            at_ms,
            code: 533,
            cs: 4325,
            text: format!(
                "Unable to create a deployment for VM instance {{\"instanceName\":\"i-2-{}-VM\",\"uuid\":\"{}\"}}",
                vm.seq, vm.id
            ),
        }),
        VmState::Destroyed | VmState::Expunging => Some(destroyed_before_start(vm, at_ms)),
    }
}

fn destroyed_before_start(vm: &Vm, at_ms: Ms) -> JobStatus {
    JobStatus::Failed {
        at_ms,
        code: 530,
        cs: 4250,
        text: format!("VM {} was destroyed before its start completed", vm.name),
    }
}

pub fn secs_to_ms(s: f64) -> Ms {
    if s.is_finite() && s > 0.0 {
        (s * 1000.0).round().min(1e15) as Ms
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Ms = 1_700_000_000_000;

    fn world() -> World {
        let mut w = World::default_world("k", "s", T0);
        w.settings.stats_interval_seconds = 10;
        w.settings.boot_seconds = 5.0;
        w
    }

    #[test]
    fn glob_rules() {
        assert!(rule_matches("*", "listVirtualMachines"));
        assert!(rule_matches("list*", "listVirtualMachines"));
        assert!(rule_matches("list*Machines", "listVirtualMachines"));
        assert!(!rule_matches("list*", "deployVirtualMachine"));
        assert!(rule_matches("listNics", "listNics"));
        assert!(!rule_matches("listnics", "listNics"));
        assert!(!rule_matches("listNics", "listNicsX"));
    }

    #[test]
    fn boot_then_healthy_counters_rise_and_nic_down_stays_flat() {
        let mut w = world();
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        let mut spec = VmSpec::new("b");
        spec.guest = GuestKind::NicDown;
        let b = w.add_vm(&spec).unwrap();
        assert_eq!(w.vm(a).unwrap().state, VmState::Starting);
        w.advance_to(T0 + 5_000);
        assert_eq!(w.vm(a).unwrap().state, VmState::Running);
        w.advance_to(T0 + 60_000);
        let s1 = w.vm(a).unwrap().last_sample.unwrap();
        let n1 = w.vm(b).unwrap().last_sample.unwrap();
        w.advance_to(T0 + 600_000);
        let s2 = w.vm(a).unwrap().last_sample.unwrap();
        let n2 = w.vm(b).unwrap().last_sample.unwrap();
        assert!(s2.tx_kib > s1.tx_kib && s2.rx_kib > s1.rx_kib);
        assert!(n1.tx_kib > 0, "boot traffic");
        assert_eq!(n2.tx_kib, n1.tx_kib);
        assert!(n2.rx_kib > n1.rx_kib);
    }

    #[test]
    fn big_clock_jump_is_bounded_and_equals_small_steps() {
        let mut w1 = world();
        let mut w2 = world();
        for w in [&mut w1, &mut w2] {
            w.add_vm(&VmSpec::new("a")).unwrap();
        }
        w1.advance_to(T0 + 86_400_000);
        let mut t = T0;
        while t < T0 + 86_400_000 {
            t += 7_000;
            w2.advance_to(t.min(T0 + 86_400_000));
        }
        let a = w1.vm(0).unwrap();
        let b = w2.vm(0).unwrap();
        assert_eq!(a.last_sample, b.last_sample);
        assert_eq!(a.history, b.history);
        assert_eq!(a.history.len(), 360);
    }

    #[test]
    fn host_offline_stops_collection_and_clear_resumes() {
        let mut w = world();
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        w.advance_to(T0 + 60_000);
        w.apply_fault_now(a, Fault::HostOffline);
        let before = w.vm(a).unwrap().last_sample;
        w.advance_to(T0 + 300_000);
        assert_eq!(w.vm(a).unwrap().last_sample, before);
        assert_eq!(w.hosts[0].control, HostControl::Offline);
        w.clear_faults_now(a);
        assert_eq!(w.hosts[0].control, HostControl::Enabled);
        w.advance_to(T0 + 320_000);
        assert!(w.vm(a).unwrap().last_sample.unwrap().tx_kib > before.unwrap().tx_kib);
    }

    #[test]
    fn a_migration_moves_the_vm_and_its_counters_carry_on() {
        let mut w = world();
        w.add_host("host-extra", None, None, HostControl::Enabled)
            .unwrap();
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        let from = w.vm(a).unwrap().host;
        let to = (0..w.hosts.len()).find(|h| *h != from).unwrap();
        assert!(matches!(
            w.migrate_now(a, to, 30.0),
            Err(WorldError::Conflict(_))
        ));
        w.advance_to(T0 + 60_000);
        let before = w.vm(a).unwrap().last_sample.unwrap();
        w.migrate_now(a, to, 30.0).unwrap();
        w.advance_to(T0 + 85_000);
        let vm = w.vm(a).unwrap();
        assert_eq!((vm.state, vm.host), (VmState::Migrating, from));
        assert_eq!(vm.last_sample, Some(before), "no samples while migrating");
        w.advance_to(T0 + 120_000);
        let vm = w.vm(a).unwrap();
        assert_eq!((vm.state, vm.host), (VmState::Running, to));
        assert!(vm.last_sample.unwrap().tx_kib > before.tx_kib);
        assert!(matches!(
            w.migrate_now(a, 99, 30.0),
            Err(WorldError::NotFound(_))
        ));
    }

    #[test]
    fn a_stats_gap_keeps_the_host_connected_and_the_counters_flat() {
        let mut w = world();
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        w.advance_to(T0 + 120_000);
        w.hosts[0].stats_collection_paused = true;
        let before = w.vm(a).unwrap().last_sample;
        let kept = w.vm(a).unwrap().history.len();
        w.advance_to(T0 + 400_000);
        assert_eq!(w.vm(a).unwrap().last_sample, before);
        assert_eq!(w.vm(a).unwrap().history.len(), kept);
        assert_eq!(w.hosts[0].control, HostControl::Enabled);
        w.hosts[0].stats_collection_paused = false;
        w.advance_to(T0 + 460_000);
        assert!(w.vm(a).unwrap().last_sample.unwrap().tx_kib > before.unwrap().tx_kib);
    }

    #[test]
    fn destroyed_expunges_and_disappears_by_name() {
        let mut w = world();
        w.settings.expunge_delay_seconds = 10.0;
        w.settings.expunge_seconds = 5.0;
        let mut s = VmSpec::new("d");
        s.state = VmState::Destroyed;
        let d = w.add_vm(&s).unwrap();
        w.advance_to(T0 + 11_000);
        assert_eq!(w.vm(d).unwrap().state, VmState::Expunging);
        w.advance_to(T0 + 16_000);
        assert!(w.vm(d).unwrap().removed);
        assert_eq!(w.vm_index("d"), None);
        let id = w.vm(d).unwrap().id.clone();
        assert_eq!(w.vm_index_by_id(&id), Some(d));
    }

    #[test]
    fn stall_starting_stays_until_cleared() {
        let mut w = world();
        let mut s = VmSpec::new("s");
        s.guest = GuestKind::Healthy;
        let i = w.add_vm(&s).unwrap();
        w.apply_fault_now(i, Fault::StallStarting);
        w.advance_to(T0 + 3_600_000);
        assert_eq!(w.vm(i).unwrap().state, VmState::Starting);
        w.clear_faults_now(i);
        w.advance_to(T0 + 3_600_000 + 5_000);
        assert_eq!(w.vm(i).unwrap().state, VmState::Running);
    }

    #[test]
    fn expunged_addresses_are_reused_and_exact_requests_are_checked() {
        let mut w = world();
        w.settings.expunge_seconds = 1.0;
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        let first = w.vm(a).unwrap().visible_ip().unwrap();
        let mut taken = VmSpec::new("b");
        taken.ip = Some(first);
        assert!(matches!(w.add_vm(&taken), Err(WorldError::Conflict(_))));
        w.destroy_vm_now(a, true);
        assert_eq!(w.vm(a).unwrap().state, VmState::Expunging);
        w.advance_to(T0 + 2_000);
        assert!(w.vm(a).unwrap().removed);
        let b = w.add_vm(&taken).unwrap();
        assert_eq!(w.vm(b).unwrap().visible_ip(), Some(first));
        let c = w.add_vm(&VmSpec::new("c")).unwrap();
        assert_ne!(w.vm(c).unwrap().visible_ip(), Some(first));
    }

    #[test]
    fn destroy_without_expunge_waits_for_the_delay() {
        let mut w = world();
        w.settings.expunge_delay_seconds = 10.0;
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        w.destroy_vm_now(a, false);
        assert_eq!(w.vm(a).unwrap().state, VmState::Destroyed);
        // A second destroy without expunge changes nothing; with expunge it moves on.
        w.destroy_vm_now(a, false);
        assert_eq!(w.vm(a).unwrap().state, VmState::Destroyed);
        w.destroy_vm_now(a, true);
        assert_eq!(w.vm(a).unwrap().state, VmState::Expunging);
    }

    #[test]
    fn address_allocation_skips_gateway_and_is_unique() {
        let mut w = world();
        let v = w.add_vms(100, "x", &VmSpec::new("t")).unwrap();
        let mut ips: Vec<_> = v
            .iter()
            .map(|i| w.vm(*i).unwrap().visible_ip().unwrap())
            .collect();
        ips.sort();
        ips.dedup();
        assert_eq!(ips.len(), 100);
        assert!(!ips.contains(&w.networks[0].gateway));
    }
}
