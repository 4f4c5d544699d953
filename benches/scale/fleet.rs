//! A simulated CloudStack fleet for the scale benchmarks: an in-process `cloudstack-sim`
//! served on loopback with a frozen clock, VMs spread over projects (one project = one
//! scope of the shim), and the shim's own `check` machinery (`scope::poll`, the verdict
//! engine, the mass-failure guard, condition transitions) polling each scope.

use std::collections::BTreeMap;
use std::time::Duration;

use capc_health_shim::check::{Checker, UsageHistoryMode, VmReport};
use capc_health_shim::cloudstack::client::{
    ClientConfig, CloudStackClient, Credentials, VmListQuery,
};
use capc_health_shim::verdict::{Graces, MassFailureGuard};
use cloudstack_sim::{self as sim, HostControl, SimServer, Simulator, VmSpec, VmState, World};
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
}

/// What to build: `scopes` projects, `hosts` hosts, and the VMs.
#[derive(Debug, Clone)]
pub struct FleetPlan {
    pub scopes: usize,
    pub hosts: usize,
    pub vms: Vec<VmPlan>,
}

impl FleetPlan {
    /// `vms` running VMs spread round-robin over `scopes` projects and `hosts` hosts.
    pub fn running(vms: usize, scopes: usize, hosts: usize) -> Self {
        Self {
            scopes,
            hosts,
            vms: (0..vms)
                .map(|i| VmPlan {
                    scope: i % scopes,
                    host: i % hosts,
                    state: VmState::Running,
                    boot_seconds: 0.0,
                })
                .collect(),
        }
    }
}

/// One scope: its project and the ids of its VMs (in creation order).
#[derive(Debug, Clone)]
pub struct Scope {
    pub project_id: String,
    pub vm_ids: Vec<String>,
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

fn build_world(plan: &FleetPlan) -> Result<(World, Vec<Scope>, Vec<PlacedVm>), String> {
    let mut w = World::default_world(API_KEY, SECRET_KEY, sim::real_now_ms());
    let e = |e: sim::WorldError| format!("{e:?}");
    let mut scopes = Vec::with_capacity(plan.scopes);
    for s in 0..plan.scopes {
        let p = w
            .add_project(&project_name(s), None, &["admin".to_string()])
            .map_err(e)?;
        scopes.push(Scope {
            project_id: w.projects[p].id.clone(),
            vm_ids: Vec::new(),
        });
    }
    // The default world has one host; add the rest.
    for h in 1..plan.hosts {
        w.add_host(&host_name(h), None, None, HostControl::Enabled)
            .map_err(e)?;
    }
    let host_names: Vec<String> = w.hosts.iter().map(|h| h.name.clone()).collect();
    let mut vms = Vec::with_capacity(plan.vms.len());
    for (i, v) in plan.vms.iter().enumerate() {
        let mut spec = VmSpec::new(format!("capi-vm-{i}"));
        spec.project = Some(project_name(v.scope));
        spec.host = Some(host_names[v.host].clone());
        spec.state = v.state;
        spec.boot_seconds = Some(v.boot_seconds);
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
        let sim = Simulator::with_time_scale(world, 0.0);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let server = sim::serve(listener, sim.clone())
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
            VmListQuery {
                project_id: Some(s.project_id.clone()),
                ..Default::default()
            },
            &s.vm_ids,
            graces.clone(),
            MassFailureGuard::default(),
            UsageHistoryMode::Auto,
        )
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
