//! A simulated CloudStack fleet for the scale benchmarks: an in-process `cloudstack-sim`
//! served on loopback with a frozen clock, VMs spread over scopes (a project or an account:
//! one scope of the shim each), and the shim's own `check` machinery (`scope::poll`, the
//! verdict engine, the mass-failure guard, condition transitions) polling each scope.
//!
//! Scope kinds matter for traffic: `listVirtualMachinesUsageHistory` has no `projectid`, so
//! VMs of a project are not in it and the shim judges them from the listing's counter alone;
//! VMs of an account scope are, and the shim reads their per-row samples.

use std::collections::BTreeMap;
use std::time::Duration;

use capc_health_shim::check::{Checker, UsageHistoryMode, VmReport};
use capc_health_shim::cloudstack::client::{
    ClientConfig, CloudStackClient, Credentials, VmListQuery,
};
use capc_health_shim::probe::{ProbeLimits, Prober};
use capc_health_shim::verdict::probe::ProbeGraces;
use capc_health_shim::verdict::{Graces, MassFailureGuard};
use cloudstack_sim::{
    self as sim, AccountType, GuestKind, HostChange, HostControl, Hypervisor, NetworkSpec,
    NetworkType, Profile, Settings, SimServer, Simulator, VmSpec, VmState, World,
};
use jiff::Timestamp;

pub const API_KEY: &str = "bench-api-key";
pub const SECRET_KEY: &str = "bench-secret-key";

/// The shim's default poll interval (`run --poll-interval`, `check --interval`).
pub const SHIM_INTERVAL_SECS: i64 = 30;

/// One VM to create.
#[derive(Debug, Clone)]
pub struct VmPlan {
    pub scope: usize,
    /// Index into the fleet's hosts.
    pub host: usize,
    pub state: VmState,
    pub boot_seconds: f64,
    pub guest: GuestKind,
    /// A traffic profile for the whole run instead of the guest kind's timeline.
    pub profile: Option<Profile>,
    /// On the L2 network (CloudStack assigns no address there) instead of the shared one.
    pub l2: bool,
}

impl VmPlan {
    /// A healthy guest that boots for `boot_seconds` on the shared network.
    pub fn new(scope: usize, host: usize, state: VmState, boot_seconds: f64) -> Self {
        Self {
            scope,
            host,
            state,
            boot_seconds,
            guest: GuestKind::Healthy,
            profile: None,
            l2: false,
        }
    }
}

/// What a scope of the shim is in CloudStack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeKind {
    /// A project: its VMs are invisible to usage history (counter-alone path).
    Project,
    /// An account (listed with `account` + `domainid`): usage history shows its VMs.
    Account,
}

impl ScopeKind {
    /// `n` scopes, projects and accounts in turn (even: project, odd: account), so both
    /// traffic paths (counter alone, usage-history rows) are exercised.
    pub fn alternating(n: usize) -> Vec<ScopeKind> {
        (0..n)
            .map(|s| {
                if s % 2 == 1 {
                    Self::Account
                } else {
                    Self::Project
                }
            })
            .collect()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Project => "project",
            Self::Account => "account",
        }
    }
}

/// What to build: `scopes` scopes (projects unless `scope_kinds` says otherwise), `hosts`
/// hosts of `hypervisor`, the VMs, CloudStack's settings and the simulated start time.
#[derive(Debug, Clone)]
pub struct FleetPlan {
    pub scopes: usize,
    pub hosts: usize,
    pub vms: Vec<VmPlan>,
    /// Kind of each scope; missing entries are projects.
    pub scope_kinds: Vec<ScopeKind>,
    pub hypervisor: Hypervisor,
    pub settings: Settings,
    /// Simulated start (ms since the epoch); the wall clock when `None`.
    pub start_ms: Option<i64>,
    /// Each scope's VMs (but L2 ones) on an Isolated network of their own, owned by the scope,
    /// with its own virtual router (a CAPC cluster's network), instead of all on the one
    /// shared network (one router).
    pub network_per_scope: bool,
}

impl Default for FleetPlan {
    fn default() -> Self {
        Self {
            scopes: 1,
            hosts: 1,
            vms: Vec::new(),
            scope_kinds: Vec::new(),
            hypervisor: Hypervisor::Kvm,
            settings: Settings::default(),
            start_ms: None,
            network_per_scope: false,
        }
    }
}

impl FleetPlan {
    pub fn scope_kind(&self, scope: usize) -> ScopeKind {
        self.scope_kinds
            .get(scope)
            .copied()
            .unwrap_or(ScopeKind::Project)
    }
}

impl FleetPlan {
    /// `vms` running VMs spread round-robin over `scopes` projects and `hosts` hosts.
    pub fn running(vms: usize, scopes: usize, hosts: usize) -> Self {
        Self {
            scopes,
            hosts,
            vms: (0..vms)
                .map(|i| VmPlan::new(i % scopes, i % hosts, VmState::Running, 0.0))
                .collect(),
            ..Self::default()
        }
    }
}

/// One scope: its project or account and the ids of its VMs (in creation order).
#[derive(Debug, Clone)]
pub struct Scope {
    pub kind: ScopeKind,
    /// The project's id (projects) or the account's name (accounts).
    pub project_id: String,
    pub domain_id: String,
    pub vm_ids: Vec<String>,
}

impl Scope {
    /// The listing the shim makes for this scope.
    pub fn query(&self) -> VmListQuery {
        match self.kind {
            ScopeKind::Project => VmListQuery {
                project_id: Some(self.project_id.clone()),
                ..Default::default()
            },
            ScopeKind::Account => VmListQuery {
                account: Some(self.project_id.clone()),
                domain_id: Some(self.domain_id.clone()),
                ..Default::default()
            },
        }
    }
}

pub struct Fleet {
    pub sim: Simulator,
    server: SimServer,
    pub scopes: Vec<Scope>,
    /// Every VM id with its scope and host index, in creation order.
    pub vms: Vec<PlacedVm>,
}

fn project_name(i: usize) -> String {
    format!("scope-{i}")
}

fn host_name(i: usize) -> String {
    format!("kvm-host-{i}")
}

/// A VM's id, scope and host index.
pub type PlacedVm = (String, usize, usize);

fn account_name(i: usize) -> String {
    format!("tenant-{i}")
}

const L2_NETWORK: &str = "bench-l2";

fn scope_network(i: usize) -> String {
    format!("scope-{i}-net")
}

fn build_world(plan: &FleetPlan) -> Result<(World, Vec<Scope>, Vec<PlacedVm>), String> {
    let start = plan.start_ms.unwrap_or_else(sim::real_now_ms);
    let mut w = World::empty(plan.settings.clone(), start);
    w.populate_default(API_KEY, SECRET_KEY);
    let e = |e: sim::WorldError| format!("{e:?}");
    let mut scopes = Vec::with_capacity(plan.scopes);
    for s in 0..plan.scopes {
        let kind = plan.scope_kind(s);
        let name = match kind {
            ScopeKind::Project => {
                let p = w
                    .add_project(&project_name(s), None, &["admin".to_string()])
                    .map_err(e)?;
                w.projects[p].id.clone()
            }
            ScopeKind::Account => {
                let name = account_name(s);
                w.add_account(
                    &name,
                    None,
                    AccountType::User,
                    &format!("{name}-api-key"),
                    &format!("{name}-secret-key"),
                    None,
                    None,
                )
                .map_err(e)?;
                name
            }
        };
        scopes.push(Scope {
            kind,
            project_id: name,
            domain_id: w.domain_id.clone(),
            vm_ids: Vec::new(),
        });
    }
    // The default world has one host; add the rest.
    for h in 1..plan.hosts {
        w.add_host(&host_name(h), None, None, HostControl::Enabled)
            .map_err(e)?;
    }
    if plan.hypervisor != Hypervisor::Kvm {
        for h in 0..w.hosts.len() {
            w.change_host_now(
                h,
                &HostChange {
                    hypervisor: Some(plan.hypervisor),
                    ..HostChange::default()
                },
            )
            .map_err(e)?;
        }
    }
    if plan.network_per_scope {
        for s in 0..plan.scopes {
            let mut spec = NetworkSpec::new(
                scope_network(s),
                format!("10.{}.0.0/16", 100 + s),
                NetworkType::Isolated,
            );
            match plan.scope_kind(s) {
                ScopeKind::Project => spec.project = Some(project_name(s)),
                ScopeKind::Account => spec.account = Some(account_name(s)),
            }
            w.add_network_spec(&spec).map_err(e)?;
        }
    }
    if plan.vms.iter().any(|v| v.l2) {
        w.add_network(L2_NETWORK, None, None, "10.9.0.0/16", None, NetworkType::L2)
            .map_err(e)?;
    }
    let host_names: Vec<String> = w.hosts.iter().map(|h| h.name.clone()).collect();
    let mut vms = Vec::with_capacity(plan.vms.len());
    for (i, v) in plan.vms.iter().enumerate() {
        let mut spec = VmSpec::new(format!("capi-vm-{i}"));
        match plan.scope_kind(v.scope) {
            ScopeKind::Project => spec.project = Some(project_name(v.scope)),
            ScopeKind::Account => spec.account = Some(account_name(v.scope)),
        }
        spec.host = Some(host_names[v.host].clone());
        spec.state = v.state;
        spec.boot_seconds = Some(v.boot_seconds);
        spec.guest = v.guest;
        spec.profile = v.profile;
        if v.l2 {
            spec.network = Some(L2_NETWORK.to_string());
        } else if plan.network_per_scope {
            spec.network = Some(scope_network(v.scope));
        }
        let idx = w.add_vm(&spec).map_err(e)?;
        let id = w.vms()[idx].id.clone();
        scopes[v.scope].vm_ids.push(id.clone());
        vms.push((id, v.scope, v.host));
    }
    Ok((w, scopes, vms))
}

impl Fleet {
    /// Builds the world, freezes its clock and serves it on 127.0.0.1.
    pub async fn start(plan: &FleetPlan) -> Result<Self, String> {
        let (world, scopes, vms) = build_world(plan)?;
        let (sim, server) = sim::serve_loopback(world, 0.0)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            sim,
            server,
            scopes,
            vms,
        })
    }

    /// The simulator's clock as the shim's `now` (they move in lockstep).
    pub fn now(&self) -> Timestamp {
        Timestamp::from_millisecond(self.sim.now_ms()).expect("simulated time is a timestamp")
    }

    /// The project's CloudStack client for this endpoint. The client-side rate limit is off:
    /// it only spreads calls out in wall time and does not change how many are made.
    pub fn client(&self) -> CloudStackClient {
        let creds = Credentials::new(API_KEY, SECRET_KEY).expect("credentials");
        let mut cfg = ClientConfig::new(&self.server.api_url(), creds).expect("client config");
        cfg.rate_limit = None;
        cfg.request_timeout = Duration::from_secs(30);
        CloudStackClient::new(cfg).expect("client")
    }

    /// The shim's checker for one scope, tracking that scope's VMs (as the controller tracks
    /// the instance ids of its Machines), at `graces` and the default guard.
    pub fn checker(&self, scope: usize, graces: &Graces) -> Checker {
        let s = &self.scopes[scope];
        Checker::new(
            self.client(),
            s.query(),
            &s.vm_ids,
            graces.clone(),
            MassFailureGuard::default(),
            UsageHistoryMode::Auto,
        )
    }

    /// A client with the simulator's root-admin key (the guest probe's key). `populate_default`
    /// makes the fleet's [`API_KEY`] the root admin; this checks that it still is.
    pub fn root_admin_client(&self) -> Result<CloudStackClient, String> {
        match self.sim.root_admin_keys() {
            Some((api, secret)) if api == API_KEY && secret == SECRET_KEY => Ok(self.client()),
            Some((api, _)) => Err(format!(
                "the simulator's root admin is {api:?}, not the fleet's key"
            )),
            None => Err("the simulator has no root-admin account".into()),
        }
    }

    /// One checker per scope at `graces` (whose `probe` must be `None`), each with a guest
    /// probe of its own (root-admin key, default limits, pacing from the stats interval), as
    /// `check --probe-credentials-file` builds it.
    pub fn probed_checkers_with(&self, graces: &Graces) -> Result<Vec<Checker>, String> {
        (0..self.scopes.len())
            .map(|s| {
                let prober = Prober::new(self.root_admin_client()?, ProbeLimits::default());
                Ok(self.checker(s, graces).with_prober(
                    prober,
                    ProbeGraces::from_stats_interval(graces.stats_interval),
                ))
            })
            .collect()
    }

    /// One checker per scope at the default graces.
    pub fn checkers(&self) -> Vec<Checker> {
        self.checkers_with(&Graces::default())
    }

    pub fn checkers_with(&self, graces: &Graces) -> Vec<Checker> {
        (0..self.scopes.len())
            .map(|s| self.checker(s, graces))
            .collect()
    }

    /// Total API calls the simulator has answered.
    pub fn calls_total(&self) -> u64 {
        self.sim.calls()["total"].as_u64().unwrap_or(0)
    }

    /// `vm_stats` rows the simulated server has read to answer API calls so far (listings
    /// with stats sum every retained row of each listed VM; usage history reads its rows).
    pub fn stats_rows_read(&self) -> u64 {
        self.sim.calls()["stats_rows_read"]["total"]
            .as_u64()
            .unwrap_or(0)
    }

    /// API calls per command (all results).
    pub fn calls_by_command(&self) -> BTreeMap<String, u64> {
        let calls = self.sim.calls();
        let mut out = BTreeMap::new();
        if let Some(by) = calls["by_command"].as_object() {
            for (command, results) in by {
                let n: u64 = results
                    .as_object()
                    .map(|r| r.values().filter_map(|v| v.as_u64()).sum())
                    .unwrap_or(0);
                out.insert(command.clone(), n);
            }
        }
        out
    }

    pub async fn stop(self) {
        self.server.shutdown().await;
    }
}

/// Polls every scope once at `now` (the scopes concurrently, which only saves wall time
/// when retries back off) and returns the verdicts of all of them.
pub async fn poll_all(checkers: &mut [Checker], now: Timestamp) -> Vec<VmReport> {
    futures::future::join_all(checkers.iter_mut().map(|c| c.poll(now))).await;
    Checker::mark_paused_collections(checkers, now);
    checkers.iter_mut().flat_map(|c| c.verdicts(now)).collect()
}

/// `numerator / denominator`, or 0 when there is nothing to divide by.
pub fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 {
        numerator / denominator
    } else {
        0.0
    }
}
