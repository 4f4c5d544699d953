//! Cluster API as it will ship once it stops serving v1beta1: the API server profile
//! `capi-1.13-v1beta2-only` (hack/apiserver) installs CAPI v1.13.5's CRDs with only their
//! storage version, v1beta2, served (CAPC's CRDs as they are). The shim must still discover
//! condition mode, publish its verdict in the v1beta2 `status.conditions` — the list a CAPI
//! 1.12+ MachineHealthCheck reads — and never ask for `cluster.x-k8s.io/v1beta1`.
//!
//! How requests are counted: in this profile the runner starts kube-apiserver with an audit log
//! (hack/apiserver/run/audit.go: level Metadata for the CAPI and CAPC groups, blocking mode, so
//! a request is on disk before it is handled). Every request through the shim's client carries
//! its own User-Agent (kube-rs sends none by default), so its requests are told apart from the
//! test's set-up. The audit log is chosen over `apiserver_request_total` from `/metrics`: it
//! names the client and the exact path, and it records requests for a version that is not
//! served, which the metric does not (checked on this server: GETs of unserved
//! `cluster.x-k8s.io/v1beta1` paths, answered 404, add no series with that group and version,
//! so the metric would read 0 whatever the shim did). The test first makes a v1beta1 request of
//! its own and finds it in the log, so 0 below means none was made, not none was recorded.
//!
//! The test applies to that profile only: `make test-rust` runs it in its
//! `capi-1.13-v1beta2-only` pass and skips it by name (`--skip
//! condition_mode_without_one_v1beta1_request`) in the others. Run under another profile anyway,
//! it fails with the reason rather than report a pass it did not earn.

mod kube_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use capc_health_shim::controller::kube_io;
use capi_model::apis::{choose, ConditionLayout, Mode};
use kube::api::{Api, DynamicObject};
use kube_support::{ar, condition, get, is, kube_client, profile, Fixture};
use reqwest::header::{HeaderValue, USER_AGENT};
use serde_json::Value;

const PROFILE: &str = "capi-1.13-v1beta2-only";
/// The User-Agent of every request the shim makes in this test.
const SHIM_AGENT: &str = "capc-health-shim-under-audit";
const V1BETA1: &str = "/apis/cluster.x-k8s.io/v1beta1";
const V1BETA2: &str = "/apis/cluster.x-k8s.io/v1beta2";

/// One audited request (the audit log has an event per stage; they share the auditID).
#[derive(Debug, Clone)]
struct Request {
    verb: String,
    uri: String,
    user_agent: String,
    code: Option<u64>,
}

/// Every request in the audit log, by auditID; the response code where a stage carries one.
fn audited(path: &Path) -> BTreeMap<String, Request> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("audit log {}: {e}", path.display()));
    let mut out: BTreeMap<String, Request> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let e: Value = serde_json::from_str(line).expect("an audit event per line");
        let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
        let r = out.entry(s("auditID")).or_insert_with(|| Request {
            verb: s("verb"),
            uri: s("requestURI"),
            user_agent: s("userAgent"),
            code: None,
        });
        if let Some(code) = e.pointer("/responseStatus/code").and_then(Value::as_u64) {
            r.code = Some(code);
        }
    }
    out
}

/// Whether `uri` is `prefix` or below it (`/apis/cluster.x-k8s.io/v1beta1`, `…/v1beta1/…`,
/// `…/v1beta1?…`), not `…/v1beta10`.
fn under(uri: &str, prefix: &str) -> bool {
    uri.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/') || rest.starts_with('?'))
}

/// A client with the test server's admin credentials and the shim's own User-Agent.
async fn shim_client() -> kube::Client {
    let path = test_support::apiserver::kubeconfig_path();
    let kc = kube::config::Kubeconfig::from_yaml(&std::fs::read_to_string(path).unwrap())
        .expect("kubeconfig parses");
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("kubeconfig usable");
    cfg.headers
        .push((USER_AGENT, HeaderValue::from_static(SHIM_AGENT)));
    kube::Client::try_from(cfg).expect("shim client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh capi-1.13-v1beta2-only)"]
async fn condition_mode_without_one_v1beta1_request() {
    // Like every test here that needs the server, fail without one rather than pass unlooked.
    test_support::apiserver::kubeconfig_path();
    assert_eq!(
        profile(),
        PROFILE,
        "not applicable: this test needs the API server profile {PROFILE} (v1beta1 not served, \
         audit log on); `make test-rust` runs it there and skips it under every other profile"
    );
    let audit_log = test_support::apiserver::audit_log_path()
        .expect("the capi-1.13-v1beta2-only runner writes an audit log (APISERVER_AUDIT_LOG)");
    let admin = kube_client().await;
    let f = Fixture::new(admin.clone(), &[("vm-broken", "healthy", "Error")]).await;
    // A worker whose VM is in Error before it ever joined: no Node.
    f.machine("m-broken", Some("vm-broken"), false, "fd1").await;

    // The profile really serves no v1beta1, and the audit log records a request for it.
    let v1beta1_machines: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        &f.ns,
        &ar("cluster.x-k8s.io", "v1beta1", "Machine", "machines"),
    );
    match v1beta1_machines.list(&Default::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 404, "{s:?}"),
        other => panic!("cluster.x-k8s.io/v1beta1 must not be served here: {other:?}"),
    }
    let control = format!("{V1BETA1}/namespaces/{}/machines", f.ns);
    assert!(
        audited(&audit_log)
            .values()
            .any(|r| under(&r.uri, &control) && r.code == Some(404)),
        "the audit log ({}) does not show the test's own v1beta1 request {control}",
        audit_log.display()
    );

    // What `capc-health-shim run` does at start-up, through the shim's client: discovery, the
    // choice, the watches; then controller cycles.
    let shim = shim_client().await;
    let (served, problems) = kube_io::discover(&shim).await;
    assert!(problems.is_empty(), "{problems:?}");
    for (kind, versions) in [
        ("Machine", &served.machine),
        ("Cluster", &served.cluster),
        ("MachineHealthCheck", &served.machine_health_check),
    ] {
        assert_eq!(versions, &["v1beta2"], "{kind}: only v1beta2 is served");
    }
    let choice = choose(&served, None).expect("discovery succeeds without v1beta1");
    assert_eq!(
        (choice.mode, choice.mode_source.as_str(), choice.layout),
        (Mode::Condition, "auto", ConditionLayout::V1Beta2),
        "{choice:?}"
    );
    assert_eq!(choice.cloudstack_machine_version, "v1beta3");
    assert_eq!(
        choice, f.choice,
        "the shim's discovery and the fixture's agree"
    );
    let (mut controller, _report) = f.controller_as(shim.clone(), &[]).await;
    // The first poll sees the VM in Error and waits for a confirming one (Unknown): cycles
    // until the verdict is False, as `run` would (poll interval 1 s).
    f.cycle_until(
        &mut controller,
        &["m-broken"],
        Duration::from_secs(30),
        |s| is(&s["m-broken"], "False", "VMError"),
    )
    .await;

    // The verdict, on the Machine read as cluster.x-k8s.io/v1beta2, in status.conditions.
    let m = get(
        &admin,
        &f.ns,
        &ar("cluster.x-k8s.io", "v1beta2", "Machine", "machines"),
        "m-broken",
    )
    .await;
    assert!(m.pointer("/status/nodeRef").is_none(), "no Node: {m:#}");
    let c = condition(&m, "/status/conditions")
        .unwrap_or_else(|| panic!("no CloudStackVMHealthy in status.conditions: {m:#}"));
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("VMError")),
        "{c:#}"
    );
    assert!(
        m.pointer("/metadata/annotations/cluster.x-k8s.io~1remediate-machine")
            .is_none(),
        "condition mode never annotates"
    );

    // The count: every request the shim made so far (discovery, watches, the status write).
    let shim_requests: Vec<Request> = audited(&audit_log)
        .into_values()
        .filter(|r| r.user_agent == SHIM_AGENT)
        .collect();
    let v1beta1: Vec<&Request> = shim_requests
        .iter()
        .filter(|r| under(&r.uri, V1BETA1))
        .collect();
    let v1beta2 = shim_requests
        .iter()
        .filter(|r| under(&r.uri, V1BETA2))
        .count();
    eprintln!(
        "profile {PROFILE}: the shim made {} audited requests ({v1beta2} to {V1BETA2}, {} to {V1BETA1})",
        shim_requests.len(),
        v1beta1.len()
    );
    // The filter sees the shim: its discovery, watches and condition write are there.
    assert!(
        shim_requests.iter().any(|r| r.verb == "patch"
            && r.uri.starts_with(&format!(
                "{V1BETA2}/namespaces/{}/machines/m-broken/status",
                f.ns
            ))),
        "the shim's v1beta2 status write is not in the audit log: {shim_requests:#?}"
    );
    assert!(
        v1beta1.is_empty(),
        "the shim asked for v1beta1: {v1beta1:#?}"
    );

    drop(controller);
    f.cleanup().await;
}
