//! `cloudstack-sim`: a CloudStack API simulator for tests, the demo and benchmarks.
//!
//! It speaks CloudStack's wire protocol on `/client/api` (signed GET query strings and POST
//! form bodies, JSON envelopes, CloudStack's error codes and texts, pagination and
//! throttling rules) and exposes an admin JSON API under `/sim/` on the same listener.
//!
//! # In-process use
//!
//! ```no_run
//! use cloudstack_sim::{self as sim, Simulator, World, VmSpec, GuestKind};
//!
//! # async fn demo() -> std::io::Result<()> {
//! // One zone, one shared network, one host, a root admin with these keys.
//! let world = World::default_world("my-api-key", "my-secret", sim::real_now_ms());
//! let sim = Simulator::new(world);
//! // Load VMs directly (20 000 take well under a second).
//! let mut spec = VmSpec::new("unused");
//! spec.guest = GuestKind::Healthy;
//! sim.add_vms(20_000, "bench", &spec).unwrap();
//! let one = sim.add_vm(&VmSpec::new("demo-cp-1")).unwrap(); // returns the VM's UUID
//! sim.inject_fault(&one, sim::Fault::NicDown).unwrap();
//! // Serve it.
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let server = sim::serve(listener, sim.clone()).await?;
//! println!("{}", server.api_url());
//! sim.advance(60.0); // move simulated time without sleeping
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Scenario files (see `cloudstack-fixtures/scenarios/README.md`) are loaded with
//! [`load_scenario_file`]. Time is simulated: `start + real elapsed × time_scale + manual
//! advances` ([`Simulator::advance`], `POST /sim/clock`); all VM evolution is a pure function
//! of it, applied lazily before each request.
//!
//! # Modules
//! - [`world`]: the model (accounts, zones, networks, hosts, projects, VMs, affinity groups,
//!   async jobs) and its evolution.
//! - [`catalog`]: service offerings, templates, disk offerings, affinity groups, jobs.
//! - [`traffic`]: guest traffic profiles as closed-form bytes over time (with the estimates).
//! - [`api`]: request collection, verification, role/throttle/page rules, envelopes.
//! - [`commands`]: the command table and the VM list, NIC and discovery handlers.
//! - [`directory`]: users, keys, domain, accounts, projects, zones, networks, offerings,
//!   templates, public addresses, volumes (what a cluster provider looks up).
//! - [`provisioning`]: deploy/destroy VMs, affinity groups, `queryAsyncJobResult`.
//! - [`routers`]: `listRouters` and `runDiagnostics` (virtual routers of guest networks).
//! - [`scenario`]: scenario file parsing with path-precise errors.
//! - [`server`]: the HTTP server, admin API and API-level fault injection.
//! - [`load`]: the per-account load (`/sim/calls` `by_account`) as the e2e records it, read
//!   back as rates per Machine-hour for `make bench`.

pub mod admin;
pub mod api;
pub mod catalog;
pub mod clock;
pub mod commands;
pub mod directory;
pub mod load;
pub mod provisioning;
pub mod routers;
pub mod scenario;
pub mod server;
pub mod traffic;
pub mod world;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};

pub use clock::{real_now_ms, SimClock};
pub use scenario::{load_scenario_file, parse_scenario, ScenarioError};
pub use server::{serve, serve_loopback, serve_tls, tls_config, ApiFaults, SimServer};
pub use traffic::Profile;
pub use world::{
    AccountType, Fault, GuestKind, HostChange, HostControl, HostStatus, Hypervisor, Ms,
    NetworkSpec, NetworkType, Owner, ResourceState, Role, RoleRule, RouterState, Settings,
    Throttle, VmSpec, VmState, World, WorldError,
};

/// Per-command, per-result call counts (`GET /sim/calls`), and how many `vm_stats` rows the
/// server read to answer them (what asking for stats costs CloudStack).
#[derive(Debug, Default, Clone)]
pub struct CallStats {
    pub total: u64,
    pub by_command: BTreeMap<String, BTreeMap<String, u64>>,
    /// Rows read per command.
    pub stats_rows_by_command: BTreeMap<String, u64>,
    /// Rows read by the most recent API request, and the most any one request read.
    pub stats_rows_last_request: u64,
    pub stats_rows_max_request: u64,
    /// The same load by caller: account name → [`AccountCalls`] (`by_account`).
    ///
    /// Why: the end-to-end load test (issue 27, item 5) runs CAPC, the shim and the shim's
    /// guest probe against one simulator, each with its own key, and must tell what each of
    /// them costs CloudStack (calls, `vm_stats` rows, async jobs) to say what the shim adds to
    /// the load CAPC already makes. Keyed by account name — never by API key: `/sim/calls` is
    /// unauthenticated and lands in test reports. Bounded: accounts are finite, requests whose
    /// key matches none share [`UNKNOWN_KEY`], requests without one [`NO_KEY`], and past
    /// [`MAX_ACCOUNT_BUCKETS`] names the rest share [`OTHER_ACCOUNTS`].
    pub by_account: BTreeMap<String, AccountCalls>,
}

/// One caller's share of the API load (`GET /sim/calls` `by_account.<account>`).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AccountCalls {
    /// Every request that reached the API handler with this caller's key, whatever the
    /// answer (injected outages, proxy pages and hangs included).
    pub calls: u64,
    /// Requests by command name (unknown names share `(other)` as in `by_command`).
    pub by_command: BTreeMap<String, u64>,
    /// `vm_stats` rows read to answer this caller.
    pub stats_rows: u64,
    /// Successful (HTTP 200) calls of async commands: jobs CloudStack queued for the caller.
    pub async_jobs: u64,
}

/// `by_account` bucket of requests whose `apikey` matches no account.
pub const UNKNOWN_KEY: &str = "(unknown key)";
/// `by_account` bucket of requests without an `apikey` parameter.
pub const NO_KEY: &str = "(no key)";
/// `by_account` bucket of account names past [`MAX_ACCOUNT_BUCKETS`].
pub const OTHER_ACCOUNTS: &str = "(other accounts)";
/// Most account names `by_account` keeps apart.
pub const MAX_ACCOUNT_BUCKETS: usize = 256;

/// The mutable state behind a [`Simulator`].
pub(crate) struct SimState {
    pub world: World,
    pub clock: SimClock,
    pub api_faults: ApiFaults,
    pub calls: CallStats,
    pub throttle: api::ThrottleTable,
    /// The `signature` values of the most recent API requests (for secret scans in tests).
    pub signatures: std::collections::VecDeque<String>,
    initial: World,
}

/// How many received signatures [`Simulator::received_signatures`] keeps.
pub const KEPT_SIGNATURES: usize = 4096;

impl SimState {
    /// Remembers a received request signature (the newest [`KEPT_SIGNATURES`]).
    pub fn record_signature(&mut self, signature: &str) {
        if self.signatures.len() >= KEPT_SIGNATURES {
            self.signatures.pop_front();
        }
        self.signatures.push_back(signature.to_string());
    }

    /// The `by_account` bucket of a request: the name of the account whose key its `apikey`
    /// parameter (name matched case-insensitively, as the API does) carries, [`UNKNOWN_KEY`]
    /// or [`NO_KEY`]. Never the key itself.
    pub fn caller_of(&self, params: &api::Params) -> String {
        let key = params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("apikey"))
            .map(|(_, v)| v.as_str());
        let name = match key {
            None => return NO_KEY.to_string(),
            Some(key) => match self.world.account_by_api_key(key) {
                Some(i) => self.world.accounts[i].name.as_str(),
                None => return UNKNOWN_KEY.to_string(),
            },
        };
        if self.calls.by_account.contains_key(name)
            || self.calls.by_account.len() < MAX_ACCOUNT_BUCKETS
        {
            name.to_string()
        } else {
            OTHER_ACCOUNTS.to_string()
        }
    }

    /// Records how many `vm_stats` rows one request of `caller` read.
    pub fn record_stats_rows(&mut self, caller: &str, command: &str, rows: u64) {
        self.calls.stats_rows_last_request = rows;
        self.calls.stats_rows_max_request = self.calls.stats_rows_max_request.max(rows);
        if rows > 0 {
            self.calls
                .by_account
                .entry(caller.to_string())
                .or_default()
                .stats_rows += rows;
        }
        if rows > 0 && commands::find(command).is_some() {
            *self
                .calls
                .stats_rows_by_command
                .entry(command.to_string())
                .or_insert(0) += rows;
        }
    }

    /// Counts one request of `caller` (a [`SimState::caller_of`] bucket) answered with
    /// `result` (the HTTP status, `200-malformed`, `hang`).
    pub fn record_call(&mut self, caller: &str, command: &str, result: &str) {
        self.calls.total += 1;
        let name = if command.is_empty() {
            "(none)"
        } else {
            command
        };
        // Bound the map: arbitrary command names from clients share one bucket.
        let key = if commands::find(name).is_some()
            || name == "(none)"
            || self.calls.by_command.contains_key(name)
            || self.calls.by_command.len() < 256
        {
            name.to_string()
        } else {
            "(other)".to_string()
        };
        let account = self.calls.by_account.entry(caller.to_string()).or_default();
        account.calls += 1;
        *account.by_command.entry(key.clone()).or_insert(0) += 1;
        // A 200 of an async command is a job CloudStack queued (`200-malformed` too: only the
        // body was cut on the way back).
        let ok = result == "200" || result.starts_with("200-");
        if ok && commands::find(name).is_some_and(|spec| spec.is_async) {
            account.async_jobs += 1;
        }
        *self
            .calls
            .by_command
            .entry(key)
            .or_default()
            .entry(result.to_string())
            .or_insert(0) += 1;
    }
}

/// A simulator: the world, its clock and the API fault settings, shared between the HTTP
/// server and in-process callers. Cheap to clone.
#[derive(Clone)]
pub struct Simulator {
    state: Arc<Mutex<SimState>>,
}

impl Simulator {
    /// A simulator whose clock starts at the world's start time and runs at real speed.
    pub fn new(world: World) -> Self {
        Self::with_time_scale(world, 1.0)
    }

    /// Like [`Simulator::new`] with simulated time running `scale` times faster than real
    /// time (0 = frozen; only [`Simulator::advance`] moves it).
    pub fn with_time_scale(world: World, scale: f64) -> Self {
        let clock = SimClock::new(world.now_ms(), scale);
        Self {
            state: Arc::new(Mutex::new(SimState {
                initial: world.clone(),
                world,
                clock,
                api_faults: ApiFaults::default(),
                calls: CallStats::default(),
                throttle: api::ThrottleTable::default(),
                signatures: Default::default(),
            })),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Locks and brings the world to the clock's "now".
    pub(crate) fn lock_advanced(&self) -> MutexGuard<'_, SimState> {
        let mut st = self.lock();
        let now = st.clock.now_ms();
        st.world.advance_to(now);
        st
    }

    /// Runs `f` on the world, advanced to the current simulated time.
    pub fn with_world<R>(&self, f: impl FnOnce(&mut World) -> R) -> R {
        let mut st = self.lock_advanced();
        f(&mut st.world)
    }

    /// Current simulated time (ms since the epoch).
    pub fn now_ms(&self) -> Ms {
        self.lock().clock.now_ms()
    }

    /// Moves simulated time forward by `seconds` and evolves the world.
    pub fn advance(&self, seconds: f64) {
        let mut st = self.lock();
        st.clock.advance_ms(world::secs_to_ms(seconds));
        let now = st.clock.now_ms();
        st.world.advance_to(now);
    }

    /// Creates a VM now; returns its UUID.
    pub fn add_vm(&self, spec: &VmSpec) -> Result<String, WorldError> {
        self.with_world(|w| {
            let i = w.add_vm(spec)?;
            Ok(w.vms()[i].id.clone())
        })
    }

    /// Creates `n` VMs named `<prefix>-<i>` from a template; returns how many were made.
    pub fn add_vms(&self, n: usize, prefix: &str, template: &VmSpec) -> Result<usize, WorldError> {
        self.with_world(|w| w.add_vms(n, prefix, template).map(|v| v.len()))
    }

    /// Injects a fault into a VM (by name or id) now.
    pub fn inject_fault(&self, vm: &str, fault: Fault) -> Result<(), WorldError> {
        self.with_world(|w| {
            let i = w
                .vm_index(vm)
                .ok_or_else(|| WorldError::NotFound(format!("no VM with id or name {vm:?}")))?;
            w.apply_fault_now(i, fault);
            Ok(())
        })
    }

    /// Creates a guest network now (with its virtual router when its offering has a
    /// VirtualRouter service, see [`NetworkSpec`]); returns the network's UUID.
    pub fn add_network(&self, spec: &NetworkSpec) -> Result<String, WorldError> {
        self.with_world(|w| {
            let i = w.add_network_spec(spec)?;
            Ok(w.networks[i].id.clone())
        })
    }

    /// The UUIDs of a network's (by name or id) virtual routers: none for L2 and router-less
    /// networks.
    pub fn routers_of(&self, network: &str) -> Result<Vec<String>, WorldError> {
        self.with_world(|w| {
            let n = w
                .network_index(network)
                .ok_or_else(|| WorldError::NotFound(format!("no network {network:?}")))?;
            Ok(w.routers_of(n)
                .into_iter()
                .map(|r| w.routers[r].id.clone())
                .collect())
        })
    }

    /// Sets a router's (by id or name `r-N-VM`) state now: Stopped takes its host away,
    /// Running and Starting give it one.
    pub fn set_router_state(&self, router: &str, state: RouterState) -> Result<(), WorldError> {
        self.with_world(|w| {
            let i = w
                .router_index(router)
                .ok_or_else(|| WorldError::NotFound(format!("no router {router:?}")))?;
            w.set_router_state_now(i, state)
        })
    }

    /// A guest network (by id or name) loses (`up == false`) or gets back its uplink now:
    /// its guests' gateway stops answering; CloudStack sees nothing
    /// ([`World::set_network_uplink_now`]).
    pub fn set_network_uplink(&self, network: &str, up: bool) -> Result<(), WorldError> {
        self.with_world(|w| {
            let i = w
                .network_index(network)
                .ok_or_else(|| WorldError::NotFound(format!("no network {network:?}")))?;
            w.set_network_uplink_now(i, up)
        })
    }

    /// VMs deployed from a template (by id or name) from now on boot `guest` (`None`:
    /// healthy): one broken image ([`World::set_template_guest`]).
    pub fn set_template_guest(
        &self,
        template: &str,
        guest: Option<GuestKind>,
    ) -> Result<(), WorldError> {
        self.with_world(|w| {
            let i = w
                .template_index(template)
                .ok_or_else(|| WorldError::NotFound(format!("no template {template:?}")))?;
            w.set_template_guest(i, guest)
        })
    }

    /// The API key and secret key of a root admin (the first enabled account of type Admin
    /// without a dynamic role): the keys given to [`World::default_world`], the binary's
    /// `--api-key`/`--secret-key` (default `sim-api-key`/`sim-secret-key`), or a scenario's
    /// own Admin account.
    pub fn root_admin_keys(&self) -> Option<(String, String)> {
        self.lock().world.root_admin_keys()
    }

    /// Live-migrates a Running VM (by name or id) to host number `host` over `seconds`.
    pub fn migrate(&self, vm: &str, host: usize, seconds: f64) -> Result<(), WorldError> {
        self.with_world(|w| {
            let i = w
                .vm_index(vm)
                .ok_or_else(|| WorldError::NotFound(format!("no VM with id or name {vm:?}")))?;
            w.migrate_now(i, host, seconds)
        })
    }

    /// Clears a VM's injected faults now.
    pub fn clear_faults(&self, vm: &str) -> Result<(), WorldError> {
        self.with_world(|w| {
            let i = w
                .vm_index(vm)
                .ok_or_else(|| WorldError::NotFound(format!("no VM with id or name {vm:?}")))?;
            w.clear_faults_now(i);
            Ok(())
        })
    }

    /// Replaces the API fault settings.
    pub fn set_api_faults(&self, f: ApiFaults) {
        self.lock().api_faults = f;
    }

    /// Sets global throttling (`None` disables it) and resets the windows.
    pub fn set_throttle(&self, t: Option<Throttle>) {
        let mut st = self.lock();
        st.world.settings.throttle = t;
        st.throttle.clear();
    }

    /// The `signature` values of the most recent API requests, oldest first (as received,
    /// URL-decoded), so tests can check that none of them leaks anywhere.
    pub fn received_signatures(&self) -> Vec<String> {
        self.lock().signatures.iter().cloned().collect()
    }

    /// Call counts as served by `GET /sim/calls`.
    pub fn calls(&self) -> Value {
        let st = self.lock();
        let c = &st.calls;
        json!({
            "total": c.total,
            "by_command": c.by_command,
            "stats_rows_read": {
                "total": st.world.stats_rows_read,
                "by_command": c.stats_rows_by_command,
                "last_request": c.stats_rows_last_request,
                "max_request": c.stats_rows_max_request,
            },
            // Account names only, never keys (see `CallStats::by_account`).
            "by_account": c.by_account,
        })
    }

    /// The call counts by caller (`GET /sim/calls` `by_account`): account name → its calls,
    /// calls by command, `vm_stats` rows read and async jobs queued.
    pub fn calls_by_account(&self) -> BTreeMap<String, AccountCalls> {
        self.lock().calls.by_account.clone()
    }

    /// Sets (or clears, with `None`) a VM's traffic profile from now on.
    pub fn set_profile(&self, vm: &str, profile: Option<Profile>) -> Result<(), WorldError> {
        self.with_world(|w| {
            let i = w
                .vm_index(vm)
                .ok_or_else(|| WorldError::NotFound(format!("no VM with id or name {vm:?}")))?;
            w.set_profile_now(i, profile)
        })
    }

    /// Clears call counts (`by_account` too), API faults and throttle windows; with `world`,
    /// also restores the initial world and restarts the clock at its start time.
    pub fn reset(&self, world: bool) {
        let mut st = self.lock();
        st.calls = CallStats::default();
        st.world.stats_rows_read = 0;
        st.signatures.clear();
        st.api_faults = ApiFaults::default();
        st.throttle.clear();
        if world {
            st.world = st.initial.clone();
            st.clock = SimClock::new(st.world.now_ms(), st.clock.scale());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> api::Params {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn by_account_is_bounded_and_never_names_a_key() {
        let mut w = World::default_world("admin-key", "admin-secret", 0);
        for i in 0..=MAX_ACCOUNT_BUCKETS {
            w.add_account(
                &format!("acct-{i}"),
                None,
                AccountType::User,
                &format!("key-{i}"),
                "s",
                None,
                None,
            )
            .unwrap();
        }
        let sim = Simulator::new(w);
        let mut st = sim.lock();
        assert_eq!(st.caller_of(&params(&[])), NO_KEY);
        assert_eq!(st.caller_of(&params(&[("apiKey", "nope")])), UNKNOWN_KEY);
        assert_eq!(st.caller_of(&params(&[("APIKEY", "admin-key")])), "admin");
        // Fill the map to its bound; the next new account shares one bucket, known ones
        // keep theirs.
        for i in 0..MAX_ACCOUNT_BUCKETS {
            let who = st.caller_of(&params(&[("apikey", &format!("key-{i}"))]));
            assert_eq!(who, format!("acct-{i}"));
            st.record_call(&who, "listZones", "200");
        }
        let last = format!("key-{MAX_ACCOUNT_BUCKETS}");
        assert_eq!(st.caller_of(&params(&[("apikey", &last)])), OTHER_ACCOUNTS);
        assert_eq!(st.caller_of(&params(&[("apikey", "key-0")])), "acct-0");
        assert_eq!(st.calls.by_account.len(), MAX_ACCOUNT_BUCKETS);
        // Async jobs: only answered (200) calls of async commands.
        st.record_call("acct-0", "deployVirtualMachine", "200");
        st.record_call("acct-0", "deployVirtualMachine", "200-malformed");
        st.record_call("acct-0", "deployVirtualMachine", "530");
        st.record_call("acct-0", "deployVirtualMachine", "503");
        st.record_call("acct-0", "listVirtualMachines", "200");
        let a = &st.calls.by_account["acct-0"];
        assert_eq!(a.async_jobs, 2);
        assert_eq!(a.calls, 6);
        assert_eq!(a.by_command["deployVirtualMachine"], 4);
        drop(st);
        let text = sim.calls().to_string();
        assert!(!text.contains("key-"), "{text}");
    }
}
