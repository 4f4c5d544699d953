//! The controller against a real kube-apiserver with the real CAPI and CAPC CRDs
//! (`make apiserver`, see hack/apiserver/) and `cloudstack-sim`: Machines, CloudStackMachines,
//! a failure domain, its Secret and an MHC are created as CAPI/CAPC would; faults come from
//! the simulator; the test asserts the condition, the annotation (or its absence), Events
//! and `/status`. The API server is given by `CAPC_HEALTH_TEST_KUBECONFIG` (set by
//! `make test`); without it the test says so and passes only outside CI.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capc_health_shim::controller::cycle::Controller;
use capc_health_shim::controller::kube_io::{self, Resources, Stores};
use capc_health_shim::controller::RunArgs;
use capc_health_shim::k8s::capi::{choose, Mode};
use capc_health_shim::metrics::Metrics;
use capc_health_shim::sim::{self, SimServer, Simulator};
use capc_health_shim::status::StatusReport;
use clap::Parser;
use jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::RwLock;

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    run: RunArgs,
}

async fn kube_client() -> Option<Client> {
    let Ok(path) = std::env::var("CAPC_HEALTH_TEST_KUBECONFIG") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CAPC_HEALTH_TEST_KUBECONFIG must point at the test API server in CI (make test starts it)"
        );
        eprintln!("skipped: CAPC_HEALTH_TEST_KUBECONFIG is not set (run `make test`)");
        return None;
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let yaml = std::fs::read_to_string(&path).expect("kubeconfig readable");
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig parses");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .expect("kubeconfig usable");
    Some(Client::try_from(cfg).expect("client"))
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

async fn create(client: &Client, ns: &str, r: &ApiResource, body: Value) -> Value {
    let api: Api<DynamicObject> = if r.kind == "Namespace" {
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

async fn get(client: &Client, ns: &str, r: &ApiResource, name: &str) -> Value {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, r);
    serde_json::to_value(api.get(name).await.expect("get")).expect("json")
}

/// The simulator with fast stats and boot, and named VMs per guest behaviour.
async fn simulator(vms: &[(&str, &str, &str)]) -> (Simulator, SimServer, BTreeMap<String, String>) {
    let mut ids = BTreeMap::new();
    let vm_entries: Vec<Value> = vms
        .iter()
        .map(|(name, guest, state)| {
            let id = uuid::Uuid::new_v4().to_string();
            ids.insert(name.to_string(), id.clone());
            json!({"name": name, "id": id, "guest": guest, "state": state})
        })
        .collect();
    let scenario = json!({
        "settings": {"stats_interval_seconds": 1, "boot_seconds": 1},
        "accounts": [{"name": "admin", "type": "Admin", "api_key": "kube-test-key", "secret_key": "kube-test-secret"}],
        "zones": [{"name": "zone-a", "id": "1d8d87d4-1425-459c-8d81-c6f57dca2bd2"}],
        "networks": [{"name": "capi-shared", "zone": "zone-a", "cidr": "10.1.1.0/24"}],
        "vms": vm_entries,
    });
    let world = sim::parse_scenario(
        &scenario.to_string(),
        "inline",
        sim::real_now_ms(),
        ("kube-test-key", "kube-test-secret"),
    )
    .expect("scenario");
    let simulator = Simulator::with_time_scale(world, 1.0);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let server = sim::serve(listener, simulator.clone())
        .await
        .expect("serve");
    (simulator, server, ids)
}

struct Cluster<'a> {
    client: &'a Client,
    ns: String,
    machine: ApiResource,
    csm: ApiResource,
}

impl Cluster<'_> {
    /// A Machine owned by a MachineSet (or KCP for control planes) with its CloudStackMachine.
    async fn machine(&self, name: &str, instance_id: Option<&str>, control_plane: bool, fd: &str) {
        let mut labels = json!({"cluster.x-k8s.io/cluster-name": "c1", "pool": "md-0"});
        if control_plane {
            labels["cluster.x-k8s.io/control-plane"] = json!("");
        }
        let owner = if control_plane {
            "KubeadmControlPlane"
        } else {
            "MachineSet"
        };
        // v1beta2 references name the API group, v1beta1 ones the apiVersion.
        let infra_ref = if self.machine.version == "v1beta2" {
            json!({"apiGroup": self.csm.group, "kind": "CloudStackMachine", "name": format!("{name}-csm")})
        } else {
            json!({"apiVersion": self.csm.api_version, "kind": "CloudStackMachine", "name": format!("{name}-csm")})
        };
        create(self.client, &self.ns, &self.machine, json!({
            "apiVersion": self.machine.api_version, "kind": "Machine",
            "metadata": {"name": name, "namespace": self.ns, "labels": labels,
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": owner, "name": "owner",
                    "uid": "6a2b7a5e-1a62-4d2f-9d84-0d8c7a1f0b11", "controller": true}]},
            "spec": {"clusterName": "c1", "bootstrap": {"dataSecretName": "bootstrap"},
                "infrastructureRef": infra_ref}
        })).await;
        let mut spec = json!({"offering": {"name": "small"}, "template": {"name": "ubuntu"}, "failureDomainName": fd});
        if let Some(id) = instance_id {
            spec["instanceID"] = json!(id);
        }
        create(
            self.client,
            &self.ns,
            &self.csm,
            json!({
                "apiVersion": self.csm.api_version, "kind": "CloudStackMachine",
                "metadata": {"name": format!("{name}-csm"), "namespace": self.ns,
                    "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
                "spec": spec
            }),
        )
        .await;
    }
}

fn condition<'a>(machine: &'a Value, pointer: &str) -> Option<&'a Value> {
    machine
        .pointer(pointer)?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "CloudStackVMHealthy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_reach_machines_with_every_guard() {
    let Some(client) = kube_client().await else {
        return;
    };
    let profile = std::env::var("CAPC_HEALTH_TEST_PROFILE").unwrap_or_else(|_| "capi-1.9".into());
    let ns = format!("e2e-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    create(
        &client,
        "",
        &ar("", "v1", "Namespace", "namespaces"),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await;

    let (sim, server, ids) = simulator(&[
        ("vm-healthy", "healthy", "Starting"),
        ("vm-nicdown", "nic-down", "Starting"),
        ("vm-error", "healthy", "Error"),
        ("vm-uncovered", "healthy", "Error"),
        ("vm-badsecret", "healthy", "Starting"),
    ])
    .await;

    // What discovery finds decides the Machine version we create objects through.
    let (served, _) = kube_io::discover(&client).await;
    let choice = choose(&served, None).expect("CAPI and CAPC CRDs are installed");
    let resources = Resources::for_choice(&choice);
    let expected_mode = if profile == "capi-1.13" {
        Mode::Condition
    } else {
        Mode::Annotate
    };
    assert_eq!(choice.mode, expected_mode, "profile {profile}");
    let cluster = Cluster {
        client: &client,
        ns: ns.clone(),
        machine: resources.machine.clone(),
        csm: resources.cloudstack_machine.clone(),
    };

    let secret = ar("", "v1", "Secret", "secrets");
    create(&client, &ns, &secret, json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "acs", "namespace": ns},
        "stringData": {"api-url": server.api_url(), "api-key": "kube-test-key", "secret-key": "kube-test-secret", "verify-ssl": "false"}})).await;
    create(&client, &ns, &secret, json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "acs-broken", "namespace": ns},
        "stringData": {"api-url": server.api_url(), "api-key": "kube-test-key"}})).await;
    let fd_api = resources.failure_domain.clone();
    for (fd, secret_name) in [("fd1", "acs"), ("fd-broken", "acs-broken")] {
        create(&client, &ns, &fd_api, json!({"apiVersion": fd_api.api_version, "kind": "CloudStackFailureDomain",
            "metadata": {"name": format!("{fd}-hash"), "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": {"name": fd, "zone": {"name": "zone-a", "id": "1d8d87d4-1425-459c-8d81-c6f57dca2bd2", "network": {"name": "capi-shared"}},
                     "acsEndpoint": {"name": secret_name, "namespace": ns}}})).await;
    }
    create(
        &client,
        &ns,
        &resources.cluster,
        json!({"apiVersion": resources.cluster.api_version, "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": ns}, "spec": {"controlPlaneEndpoint": {"host": "10.1.1.2", "port": 6443}}}),
    )
    .await;
    let mut mhc = json!({"apiVersion": resources.mhc.api_version, "kind": "MachineHealthCheck",
        "metadata": {"name": "c1-mhc", "namespace": ns},
        "spec": {"clusterName": "c1", "selector": {"matchExpressions": [{"key": "uncovered", "operator": "DoesNotExist"}]}}});
    if expected_mode == Mode::Condition {
        mhc["spec"]["checks"] = json!({"unhealthyMachineConditions": [{"type": "CloudStackVMHealthy", "status": "False", "timeoutSeconds": 0}]});
    }
    create(&client, &ns, &resources.mhc, mhc).await;

    cluster
        .machine("m-healthy", Some(&ids["vm-healthy"]), false, "fd1")
        .await;
    cluster
        .machine("m-nicdown", Some(&ids["vm-nicdown"]), false, "fd1")
        .await;
    cluster
        .machine("m-error", Some(&ids["vm-error"]), true, "fd1")
        .await;
    cluster
        .machine(
            "m-badsecret",
            Some(&ids["vm-badsecret"]),
            false,
            "fd-broken",
        )
        .await;
    cluster
        .machine("m-nofd", Some(&ids["vm-healthy"]), false, "fd-gone")
        .await;
    cluster.machine("m-noid", None, false, "fd1").await;
    // Not selected by the MHC: False, but never annotated.
    cluster
        .machine("m-uncovered", Some(&ids["vm-uncovered"]), false, "fd1")
        .await;
    {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resources.machine);
        api.patch(
            "m-uncovered",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"uncovered": "yes"}}})),
        )
        .await
        .expect("label");
    }

    let flags = Flags::parse_from([
        "t",
        "--namespace",
        &ns,
        "--poll-interval",
        "1s",
        "--stats-interval",
        "1s",
        "--escalation-delay",
        "1s",
        "--no-leader-election",
        "--mass-failure-count",
        "50",
        "--mass-failure-percent",
        "100",
    ]);
    let stores = Stores::start(&client, &resources);
    assert!(
        stores.wait_until_ready(Duration::from_secs(30)).await,
        "watches sync"
    );
    let report = Arc::new(RwLock::new(StatusReport::default()));
    let mut controller = Controller::new(
        client.clone(),
        flags.run,
        choice.clone(),
        resources.clone(),
        stores,
        report.clone(),
        Arc::new(Metrics::new()),
    );

    let pointer = choice.layout.conditions_pointer();
    let deadline = Instant::now() + Duration::from_secs(90);
    let machine_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &resources.machine);
    let status_of = |m: &Value| {
        condition(m, pointer).map(|c| {
            (
                c["status"].as_str().unwrap_or("").to_string(),
                c["reason"].as_str().unwrap_or("").to_string(),
            )
        })
    };
    let last = loop {
        controller.cycle(Timestamp::now()).await;
        let mut now_state = BTreeMap::new();
        for m in machine_api
            .list(&Default::default())
            .await
            .expect("list")
            .items
        {
            let v = serde_json::to_value(&m).unwrap();
            now_state.insert(
                m.metadata.name.clone().unwrap(),
                (
                    status_of(&v),
                    v["metadata"]["annotations"]
                        .get("cluster.x-k8s.io/remediate-machine")
                        .is_some(),
                ),
            );
        }
        let want = |name: &str, s: &str, r: &str| {
            now_state
                .get(name)
                .is_some_and(|(c, _)| c.as_ref().is_some_and(|(cs, cr)| cs == s && cr == r))
        };
        let done = want("m-healthy", "True", "VMHealthy")
            && want("m-nicdown", "False", "GuestNetworkSilent")
            && want("m-error", "False", "VMError")
            && want("m-uncovered", "False", "VMError")
            && want("m-badsecret", "Unknown", "CredentialsUnavailable")
            && want("m-nofd", "Unknown", "CredentialsUnavailable")
            && (expected_mode != Mode::Annotate
                || (now_state["m-nicdown"].1 && now_state["m-error"].1));
        if done {
            break now_state;
        }
        assert!(
            Instant::now() < deadline,
            "verdicts did not arrive within 90 s: {now_state:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Nothing to judge without an instance id; nothing escalates that the MHC does not cover.
    assert_eq!(last["m-noid"].0, None, "{last:#?}");
    assert!(
        !last["m-uncovered"].1,
        "an uncovered Machine must not be annotated"
    );
    assert!(!last["m-healthy"].1 && !last["m-badsecret"].1);
    if expected_mode == Mode::Condition {
        assert!(
            last.values().all(|(_, annotated)| !annotated),
            "condition mode never annotates"
        );
    }

    // CAPI's own conditions would sit next to ours: the SSA wrote only our entry.
    let m = get(&client, &ns, &resources.machine, "m-error").await;
    let ours = condition(&m, pointer).expect("condition");
    assert!(ours["message"].as_str().unwrap().contains("Error"));
    let managed = m["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        managed
            .iter()
            .any(|f| f["manager"] == "capc-health-shim" && f["subresource"] == "status"),
        "{managed:#?}"
    );

    // A second cycle with nothing changed writes nothing.
    let rv_before = get(&client, &ns, &resources.machine, "m-error").await["metadata"]
        ["resourceVersion"]
        .clone();
    let summary = controller.cycle(Timestamp::now()).await;
    let rv_after = get(&client, &ns, &resources.machine, "m-error").await["metadata"]
        ["resourceVersion"]
        .clone();
    assert_eq!(
        rv_before, rv_after,
        "an unchanged verdict must not be rewritten ({summary:?})"
    );

    // Events were recorded for the transitions.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let evs = events
        .list(&Default::default())
        .await
        .expect("events")
        .items;
    assert!(
        evs.iter().any(|e| e.reason.as_deref() == Some("VMError")),
        "{evs:#?}"
    );
    if expected_mode == Mode::Annotate {
        assert!(evs
            .iter()
            .any(|e| e.reason.as_deref() == Some("RemediationRequested")));
    }

    // /status tells the operator what happened and why.
    let r = report.read().await.clone();
    let c1 = &r.clusters[&format!("{ns}/c1")];
    assert!(!c1.machines["m-uncovered"].mhc_covered);
    if expected_mode == Mode::Annotate {
        assert_eq!(c1.machines["m-uncovered"].escalation, "held");
        assert!(c1.machines["m-uncovered"]
            .escalation_detail
            .as_deref()
            .unwrap()
            .contains("NotCoveredByMachineHealthCheck"));
        assert_eq!(c1.machines["m-error"].escalation, "annotated");
    }
    assert!(c1.machines["m-noid"]
        .message
        .as_deref()
        .unwrap()
        .contains("instanceID"));
    assert!(c1.machines["m-badsecret"]
        .message
        .as_deref()
        .unwrap()
        .contains("secret-key"));
    assert!(
        !serde_json::to_string(&r)
            .unwrap()
            .contains("kube-test-secret"),
        "no secret in /status"
    );
    assert_eq!(r.scopes.len(), 1);
    assert!(r.scopes[0].calls_total > 0);

    drop(sim);
    server.shutdown().await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(&ns, &Default::default()).await;
}
