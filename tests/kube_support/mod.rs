//! Shared set-up for the tests that run the controller against a real kube-apiserver with the
//! CAPI/CAPC CRDs (`make test` starts it through hack/with-apiserver.sh and passes its
//! kubeconfig in `CAPC_HEALTH_TEST_KUBECONFIG`) and an in-process `cloudstack-sim`.
#![allow(dead_code)]

pub mod matrix;
pub mod monitoring_crds;

use capc_health_shim::status::board::StatusBoard;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capc_health_shim::controller::cycle::Controller;
use capc_health_shim::controller::kube_io::{self, Resources, Stores};
use capc_health_shim::controller::RunArgs;
use capc_health_shim::k8s::watched::ConditionReader;
use capc_health_shim::metrics::Metrics;
use capi_model::apis::{choose, ApiChoice, Mode};
use clap::Parser;
use cloudstack_sim::{self as sim, SimServer, Simulator};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::Client;
use serde_json::{json, Value};

pub const SIM_KEY: &str = "kube-test-key";
pub const SIM_SECRET: &str = "kube-test-secret";
pub const ZONE_ID: &str = "1d8d87d4-1425-459c-8d81-c6f57dca2bd2";

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    run: RunArgs,
}

/// `run` flags as an operator would type them (after the program name).
pub fn run_args(args: &[&str]) -> RunArgs {
    let mut all = vec!["test"];
    all.extend_from_slice(args);
    Flags::parse_from(all).run
}

/// The admin client of the test API server; fails the test (with what to run) without one.
/// Tests that call it are `#[ignore = "needs a kube-apiserver …"]`: `make test` runs them.
pub async fn kube_client() -> Client {
    test_support::apiserver::client().await
}

pub use test_support::apiserver::profile;

pub fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub async fn create(client: &Client, ns: &str, r: &ApiResource, body: Value) -> Value {
    let api: Api<DynamicObject> = if ns.is_empty() {
        Api::all_with(client.clone(), r)
    } else {
        Api::namespaced_with(client.clone(), ns, r)
    };
    let obj: DynamicObject = serde_json::from_value(body).expect("object");
    let created = api
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", r.kind));
    serde_json::to_value(created).expect("json")
}

pub async fn get(client: &Client, ns: &str, r: &ApiResource, name: &str) -> Value {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, r);
    serde_json::to_value(api.get(name).await.expect("get")).expect("json")
}

pub async fn merge_patch(client: &Client, ns: &str, r: &ApiResource, name: &str, patch: Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, r);
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap_or_else(|e| panic!("patch {} {name}: {e}", r.kind));
}

/// A simulator with 1 s stats and boot, holding named VMs `(name, guest, state)`. Time is
/// compressed 60 times (a stats interval of 1 s stands for a minute), so guests send a real
/// minute's bytes in a second.
pub async fn simulator(
    vms: &[(&str, &str, &str)],
) -> (Simulator, SimServer, BTreeMap<String, String>) {
    simulator_with(
        json!({"stats_interval_seconds": 1, "boot_seconds": 1, "guest_speedup": 60, "guest_boot_seconds": 1.5, "guest_join_seconds": 3}),
        vms,
        1.0,
    )
    .await
}

/// A simulator from a whole scenario (its `vms` must carry fixed ids); the account
/// `admin`/[`SIM_KEY`] is added.
pub async fn simulator_from(
    scenario: Value,
    time_scale: f64,
) -> (Simulator, SimServer, BTreeMap<String, String>) {
    simulator_from_keys(scenario, time_scale, SIM_KEY, SIM_SECRET).await
}

/// [`simulator_from`] with the admin account's keys given (e.g. sentinel values that tests
/// then look for in logs, Events, `/status` and `/metrics`).
pub async fn simulator_from_keys(
    mut scenario: Value,
    time_scale: f64,
    api_key: &str,
    secret_key: &str,
) -> (Simulator, SimServer, BTreeMap<String, String>) {
    scenario["accounts"] =
        json!([{"name": "admin", "type": "Admin", "api_key": api_key, "secret_key": secret_key}]);
    simulator_from_scenario(scenario, time_scale).await
}

/// A simulator from a whole scenario that defines its own `accounts` (the first one's keys
/// are the world's default); VMs carry fixed ids.
pub async fn simulator_from_scenario(
    scenario: Value,
    time_scale: f64,
) -> (Simulator, SimServer, BTreeMap<String, String>) {
    let first = &scenario["accounts"][0];
    let (api_key, secret_key) = (
        first["api_key"].as_str().expect("accounts[0].api_key"),
        first["secret_key"]
            .as_str()
            .expect("accounts[0].secret_key"),
    );
    let ids = scenario["vms"]
        .as_array()
        .map(|vms| {
            vms.iter()
                .map(|v| {
                    (
                        v["name"].as_str().unwrap().to_string(),
                        v["id"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let world = sim::parse_scenario(
        &scenario.to_string(),
        "inline",
        sim::real_now_ms(),
        (api_key, secret_key),
    )
    .expect("scenario");
    let (simulator, server) = serve_world(world, time_scale).await;
    (simulator, server, ids)
}

/// Serves `world` on a free loopback port at the given clock rate (0 = frozen).
pub async fn serve_world(world: sim::World, time_scale: f64) -> (Simulator, SimServer) {
    sim::serve_loopback(world, time_scale).await.expect("serve")
}

/// GET `url` with a short timeout: status and body, or `None` when nothing answered.
pub async fn http_get(url: &str) -> Option<(u16, String)> {
    let r = reqwest::Client::new()
        .get(url)
        .timeout(std::time::Duration::from_secs(3))
        .send()
        .await
        .ok()?;
    let code = r.status().as_u16();
    Some((code, r.text().await.ok()?))
}

/// A simulator with the given `settings` and clock rate (0 = frozen, moved by `advance`).
pub async fn simulator_with(
    settings: Value,
    vms: &[(&str, &str, &str)],
    time_scale: f64,
) -> (Simulator, SimServer, BTreeMap<String, String>) {
    simulator_with_keys(settings, vms, time_scale, SIM_KEY, SIM_SECRET).await
}

/// [`simulator_with`] with the admin account's keys given.
pub async fn simulator_with_keys(
    settings: Value,
    vms: &[(&str, &str, &str)],
    time_scale: f64,
    api_key: &str,
    secret_key: &str,
) -> (Simulator, SimServer, BTreeMap<String, String>) {
    let vm_entries: Vec<Value> = vms
        .iter()
        .map(|(name, guest, state)| {
            json!({"name": name, "id": uuid::Uuid::new_v4().to_string(), "guest": guest, "state": state})
        })
        .collect();
    let scenario = json!({
        "settings": settings,
        "zones": [{"name": "zone-a", "id": ZONE_ID}],
        "networks": [{"name": "capi-shared", "zone": "zone-a", "cidr": "10.1.0.0/16"}],
        "vms": vm_entries,
    });
    simulator_from_keys(scenario, time_scale, api_key, secret_key).await
}

/// One namespace with a cluster `c1`: the endpoint Secret `acs`, failure domain `fd1`, the
/// Cluster and an MHC selecting every Machine without the label `uncovered`.
pub struct Fixture {
    pub client: Client,
    pub ns: String,
    pub choice: ApiChoice,
    pub resources: Resources,
    pub sim: Simulator,
    pub server: SimServer,
    /// VM name → VM id in the simulator.
    pub vm_ids: BTreeMap<String, String>,
    /// Namespaces of [`Fixture::tenant`]s, deleted by [`Fixture::cleanup`].
    tenants: std::sync::Mutex<Vec<String>>,
}

impl Fixture {
    pub async fn new(client: Client, vms: &[(&str, &str, &str)]) -> Self {
        Self::with_simulator(client, simulator(vms).await).await
    }

    pub async fn with_simulator(
        client: Client,
        sim: (Simulator, SimServer, BTreeMap<String, String>),
    ) -> Self {
        Self::with_simulator_keys(client, sim, SIM_KEY, SIM_SECRET).await
    }

    /// [`Fixture::with_simulator`] whose endpoint Secret `acs` carries the given keys (those
    /// of a simulator made by [`simulator_with_keys`]).
    pub async fn with_simulator_keys(
        client: Client,
        sim: (Simulator, SimServer, BTreeMap<String, String>),
        api_key: &str,
        secret_key: &str,
    ) -> Self {
        let (sim, server, vm_ids) = sim;
        let ns = format!("e2e-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let (served, _) = kube_io::discover(&client).await;
        let choice = choose(&served, None).expect("CAPI and CAPC CRDs are installed");
        let resources = Resources::for_choice(&choice);
        let f = Self {
            client,
            ns,
            choice,
            resources,
            sim,
            server,
            vm_ids,
            tenants: Default::default(),
        };
        f.scaffold(&f.ns, &f.server.api_url(), api_key, secret_key)
            .await;
        f
    }

    /// Another tenant on the same simulator: a namespace of its own with the same layout
    /// (Secret `acs` with these keys, failure domain `fd1`, Cluster `c1`, its MHC), as CAPC
    /// users run one workload cluster per namespace. Its name.
    pub async fn tenant(&self, api_key: &str, secret_key: &str) -> String {
        self.tenant_at(&self.server.api_url(), api_key, secret_key)
            .await
    }

    /// [`Fixture::tenant`] whose Secret names another CloudStack endpoint.
    pub async fn tenant_at(&self, api_url: &str, api_key: &str, secret_key: &str) -> String {
        let ns = format!("e2e-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        self.scaffold(&ns, api_url, api_key, secret_key).await;
        self.tenants.lock().unwrap().push(ns.clone());
        ns
    }

    async fn scaffold(&self, ns: &str, api_url: &str, api_key: &str, secret_key: &str) {
        create(
            &self.client,
            "",
            &ar("", "v1", "Namespace", "namespaces"),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
        self.secret_in(
            ns,
            "acs",
            &[
                ("api-url", api_url),
                ("api-key", api_key),
                ("secret-key", secret_key),
                ("verify-ssl", "false"),
            ],
        )
        .await;
        self.failure_domain_in(ns, "fd1", "acs").await;
        let f = self;
        create(&f.client, ns, &f.resources.cluster, json!({"apiVersion": f.resources.cluster.api_version, "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": ns}, "spec": {"controlPlaneEndpoint": {"host": "10.1.1.2", "port": 6443}}})).await;
        let mut mhc = json!({"apiVersion": f.resources.mhc.api_version, "kind": "MachineHealthCheck",
            "metadata": {"name": "c1-mhc", "namespace": ns},
            "spec": {"clusterName": "c1", "selector": {"matchExpressions": [{"key": "uncovered", "operator": "DoesNotExist"}]}}});
        if f.choice.mode == Mode::Condition {
            mhc["spec"]["checks"] = json!({"unhealthyMachineConditions": [{"type": "CloudStackVMHealthy", "status": "False", "timeoutSeconds": 0}]});
        }
        create(&f.client, ns, &f.resources.mhc, mhc).await;
    }

    pub async fn secret(&self, name: &str, data: &[(&str, &str)]) {
        self.secret_in(&self.ns, name, data).await
    }

    pub async fn secret_in(&self, ns: &str, name: &str, data: &[(&str, &str)]) {
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        create(&self.client, ns, &ar("", "v1", "Secret", "secrets"),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns}, "stringData": data})).await;
    }

    pub async fn failure_domain(&self, name: &str, secret: &str) {
        self.failure_domain_in(&self.ns, name, secret).await
    }

    pub async fn failure_domain_in(&self, ns: &str, name: &str, secret: &str) {
        let fd = &self.resources.failure_domain;
        create(&self.client, ns, fd, json!({"apiVersion": fd.api_version, "kind": "CloudStackFailureDomain",
            "metadata": {"name": format!("{name}-hash"), "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": {"name": name, "zone": {"name": "zone-a", "id": ZONE_ID, "network": {"name": "capi-shared"}},
                     "acsEndpoint": {"name": secret, "namespace": ns}}})).await;
    }

    /// A Machine owned by a MachineSet (a KubeadmControlPlane for control planes) and its
    /// CloudStackMachine in failure domain `fd`, with the VM `vm` (a name in `vm_ids`) if any.
    pub async fn machine(&self, name: &str, vm: Option<&str>, control_plane: bool, fd: &str) {
        self.machine_in(&self.ns, name, vm, control_plane, fd).await
    }

    /// [`Fixture::machine`] in namespace `ns` (a [`Fixture::tenant`]).
    pub async fn machine_in(
        &self,
        ns: &str,
        name: &str,
        vm: Option<&str>,
        control_plane: bool,
        fd: &str,
    ) {
        let mut labels = json!({"cluster.x-k8s.io/cluster-name": "c1", "pool": "md-0"});
        if control_plane {
            labels["cluster.x-k8s.io/control-plane"] = json!("");
        }
        let owner = if control_plane {
            "KubeadmControlPlane"
        } else {
            "MachineSet"
        };
        let csm = &self.resources.cloudstack_machine;
        // v1beta2 references name the API group, v1beta1 ones the apiVersion.
        let infra_ref = if self.resources.machine.version == "v1beta2" {
            json!({"apiGroup": csm.group, "kind": "CloudStackMachine", "name": format!("{name}-csm")})
        } else {
            json!({"apiVersion": csm.api_version, "kind": "CloudStackMachine", "name": format!("{name}-csm")})
        };
        create(&self.client, ns, &self.resources.machine, json!({
            "apiVersion": self.resources.machine.api_version, "kind": "Machine",
            "metadata": {"name": name, "namespace": ns, "labels": labels,
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": owner, "name": "owner",
                    "uid": "6a2b7a5e-1a62-4d2f-9d84-0d8c7a1f0b11", "controller": true}]},
            "spec": {"clusterName": "c1", "bootstrap": {"dataSecretName": "bootstrap"}, "infrastructureRef": infra_ref}
        })).await;
        let mut spec = json!({"offering": {"name": "small"}, "template": {"name": "ubuntu"}, "failureDomainName": fd});
        if let Some(vm) = vm {
            spec["instanceID"] = json!(self.vm_ids[vm]);
        }
        create(&self.client, ns, csm, json!({
            "apiVersion": csm.api_version, "kind": "CloudStackMachine",
            "metadata": {"name": format!("{name}-csm"), "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": spec
        })).await;
    }

    /// A controller for this namespace with scaled timings, plus its `/status` report.
    pub async fn controller_as(
        &self,
        client: Client,
        extra: &[&str],
    ) -> (Controller, Arc<StatusBoard>) {
        let defaults = [
            ("--poll-interval", "1s"),
            ("--stats-interval", "1s"),
            ("--escalation-delay", "1s"),
            ("--mass-failure-count", "50"),
            ("--mass-failure-percent", "100"),
        ];
        let mut args = vec!["--namespace", &self.ns, "--no-leader-election"];
        // A flag given in `extra` replaces its default here (clap refuses a flag twice).
        for (flag, value) in defaults {
            if !extra.contains(&flag) {
                args.extend([flag, value]);
            }
        }
        args.extend_from_slice(extra);
        let run = run_args(&args);
        let stores = Stores::start(
            &client,
            &self.resources,
            ConditionReader {
                layout: self.choice.layout,
                condition_type: run.condition_type.clone(),
            },
            &run.namespaces,
        );
        assert!(
            stores.wait_until_ready(Duration::from_secs(30)).await,
            "watches sync"
        );
        // `--mode` forced as `run` forces it (capi_model::apis::choose).
        let mut choice = self.choice.clone();
        if let Some(mode) = run.mode.forced() {
            choice.mode = mode;
            choice.mode_source = "forced".into();
        }
        let report = Arc::new(StatusBoard::default());
        let c = Controller::new(
            client,
            run,
            choice,
            self.resources.clone(),
            stores,
            report.clone(),
            Arc::new(Metrics::new()),
        );
        (c, report)
    }

    /// A controller with the shim's default timings (only the namespace and no Lease set).
    pub async fn controller_with_defaults(&self, extra: &[&str]) -> (Controller, Arc<StatusBoard>) {
        let mut args = vec!["--namespace", &self.ns, "--no-leader-election"];
        args.extend_from_slice(extra);
        let run = run_args(&args);
        let stores = Stores::start(
            &self.client,
            &self.resources,
            ConditionReader {
                layout: self.choice.layout,
                condition_type: run.condition_type.clone(),
            },
            &run.namespaces,
        );
        assert!(
            stores.wait_until_ready(Duration::from_secs(60)).await,
            "watches sync"
        );
        let report = Arc::new(StatusBoard::default());
        let c = Controller::new(
            self.client.clone(),
            run,
            self.choice.clone(),
            self.resources.clone(),
            stores,
            report.clone(),
            Arc::new(Metrics::new()),
        );
        (c, report)
    }

    pub async fn controller(&self, extra: &[&str]) -> (Controller, Arc<StatusBoard>) {
        self.controller_as(self.client.clone(), extra).await
    }

    pub fn conditions_pointer(&self) -> &'static str {
        self.choice.layout.conditions_pointer()
    }

    /// `(status, reason)` of our condition on Machine `name`, and whether it is annotated.
    pub async fn verdict(&self, name: &str) -> (Option<(String, String)>, bool) {
        self.verdict_in(&self.ns, name).await
    }

    /// [`Fixture::verdict`] of a Machine in namespace `ns`.
    pub async fn verdict_in(&self, ns: &str, name: &str) -> (Option<(String, String)>, bool) {
        let m = get(&self.client, ns, &self.resources.machine, name).await;
        let c = condition(&m, self.conditions_pointer()).map(|c| {
            (
                c["status"].as_str().unwrap_or("").to_string(),
                c["reason"].as_str().unwrap_or("").to_string(),
            )
        });
        (
            c,
            m.pointer("/metadata/annotations/cluster.x-k8s.io~1remediate-machine")
                .is_some(),
        )
    }

    /// Runs controller cycles until `done` holds for the current verdicts (deadline).
    pub async fn cycle_until(
        &self,
        controller: &mut Controller,
        names: &[&str],
        deadline: Duration,
        done: impl Fn(&BTreeMap<String, (Option<(String, String)>, bool)>) -> bool,
    ) -> BTreeMap<String, (Option<(String, String)>, bool)> {
        let until = Instant::now() + deadline;
        loop {
            controller.cycle(jiff::Timestamp::now()).await;
            let mut state = BTreeMap::new();
            for n in names {
                state.insert(n.to_string(), self.verdict(n).await);
            }
            if done(&state) {
                return state;
            }
            assert!(
                Instant::now() < until,
                "not reached within {deadline:?}: {state:#?}"
            );
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    }

    pub async fn cleanup(self) {
        self.server.shutdown().await;
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let tenants = std::mem::take(&mut *self.tenants.lock().unwrap());
        for ns in std::iter::once(&self.ns).chain(&tenants) {
            let _ = namespaces.delete(ns, &Default::default()).await;
        }
    }
}

pub fn condition<'a>(machine: &'a Value, pointer: &str) -> Option<&'a Value> {
    machine
        .pointer(pointer)?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "CloudStackVMHealthy")
}

/// Whether `(status, reason)` is the current verdict.
pub fn is(state: &(Option<(String, String)>, bool), status: &str, reason: &str) -> bool {
    state
        .0
        .as_ref()
        .is_some_and(|(s, r)| s == status && r == reason)
}

/// Whether the test API server has CAPI 1.13's CRDs: profile `capi-1.13`, or
/// `capi-1.13-v1beta2-only` (the same CRDs serving only their storage version, v1beta2). The
/// shim discovers condition mode on both.
pub fn capi_1_13() -> bool {
    profile().starts_with("capi-1.13")
}

/// Whether the fixture's API server made the shim pick annotate mode; asserts that this is
/// what the CRD profile under test implies (CAPI 1.9: annotate, 1.13: condition).
pub fn annotate_mode(f: &Fixture) -> bool {
    let annotate = f.choice.mode == capi_model::apis::Mode::Annotate;
    assert_eq!(annotate, !capi_1_13(), "profile {}", profile());
    annotate
}

/// A free loopback port (bound, then released for the process under test).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A token (TokenRequest, valid an hour) of the ServiceAccount `sa` in `ns`.
pub async fn service_account_token(client: &Client, ns: &str, sa: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), ns);
    sas.create_token_request(
        sa,
        &PostParams::default(),
        &TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await
    .expect("TokenRequest")
    .status
    .and_then(|s| s.token)
    .expect("a token")
}

/// A kubeconfig in `dir` for the test API server (its URL and CA) that carries only `token`.
pub fn token_kubeconfig(dir: &std::path::Path, token: &str) -> std::path::PathBuf {
    let admin: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(test_support::apiserver::kubeconfig_path()).unwrap(),
    )
    .unwrap();
    let ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .expect("the test kubeconfig carries its CA");
    let kc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": test_support::apiserver::url(), "certificate-authority-data": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": "sa"}}],
        "current-context": "sa",
    });
    let path = dir.join("kubeconfig-service-account");
    std::fs::write(&path, serde_yaml_ng::to_string(&kc).unwrap()).unwrap();
    path
}

/// An HTTPS client that accepts the shim's self-signed certificate, as the kubelet's probes do.
pub fn https_accepting_self_signed(timeout: Duration) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .timeout(timeout)
        .build()
        .expect("HTTPS client")
}

/// Cycles until `done` holds for `/status` (deadline); on failure the panic shows `what` of
/// the last report.
pub async fn cycle_until_report(
    controller: &mut Controller,
    report: &Arc<StatusBoard>,
    deadline: Duration,
    done: impl Fn(&capc_health_shim::status::StatusReport) -> bool,
    what: impl Fn(&capc_health_shim::status::StatusReport) -> String,
) -> capc_health_shim::status::StatusReport {
    let until = Instant::now() + deadline;
    loop {
        controller.cycle(jiff::Timestamp::now()).await;
        let r = report.read().await.clone();
        if done(&r) {
            return r;
        }
        assert!(
            Instant::now() < until,
            "not reached within {deadline:?}: {}",
            what(&r)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// hack/release built once per test binary (Go's build cache makes a rebuild instant).
pub fn release_tool() -> &'static std::path::Path {
    static TOOL: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    TOOL.get_or_init(|| {
        let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("release-tool");
        let status =
            std::process::Command::new(std::env::var("GO").unwrap_or_else(|_| "go".into()))
                .args(["build", "-o"])
                .arg(&out)
                .arg(".")
                .current_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/release"))
                // The Makefile's flags (-trimpath among them), so this build shares Go's build cache
                // with `make release-manifests` and `make test-release` instead of compiling again.
                .env(
                    "GOFLAGS",
                    std::env::var("GO_BUILD_FLAGS").unwrap_or_else(|_| "-mod=mod -trimpath".into()),
                )
                .env("GOWORK", "off")
                .status()
                .expect("go (1.25+) runs: hack/release is a Go module");
        assert!(status.success(), "go build hack/release: {status}");
        out
    })
}
