//! Issue 43's operator path, walked once from the release bundle alone (`target/dist/` as
//! `make dist` wrote it, copied into an empty directory and checked with `sha256sum -c`; no
//! checkout): every `capc-health-shim` command is the bundle's CLI binary, the install is the
//! bundle's chart rendered by Helm's library and applied strictly to the real API server, and the
//! shim runs with exactly the rendered Deployment's arguments and environment as the release's
//! ServiceAccount (a TokenRequest token). Against it, in the order docs/install.md and
//! docs/uninstall.md give them:
//!
//! 1. install (Helm), CAPC's endpoint Secret pointing at cloudstack-sim, a Cluster with two
//!    Machines — one VM healthy, one in `Error`;
//! 2. "Check it works": the Lease names the leader (`kubectl … -o jsonpath`), `capc-health-shim
//!    status` with a reader's `kubectl create token` prints the faulty Machine `False VMError`
//!    and the healthy one `True VMHealthy`, and `kubectl get machines -o custom-columns=…` shows
//!    the condition at the path the docs give for the CAPI version;
//! 3. the documented MHC (`capc-health-shim mhc --cluster NS/NAME`, applied as printed): the
//!    faulty Machine's verdict becomes acted on (`acted_on` annotation in annotate mode, with the
//!    remediate annotation set; condition in condition mode) — recycle-ready (no CAPI controller
//!    runs here to recycle it);
//! 4. upgrade: the process stops, the chart of a next version (higher version and appVersion) is
//!    applied and the same binary starts with its Deployment's arguments; after the new leader's
//!    completed cycles every standing verdict (status, reason, lastTransitionTime, annotation) is
//!    as before, and none was ever Unknown or missing meanwhile;
//! 5. uninstall: the release's objects deleted as `helm uninstall` does, `capc-health-shim
//!    cleanup` lists the Lease, the memory ConfigMap, the shim's fields on the Machines (and the
//!    MHC entry in condition mode), `--yes --remove-mhc-entries` removes them: 0 objects and 0
//!    fields the shim's field manager owns are left.
//!
//! Runs on both CRD profiles (`make test`: capi-1.9 annotate mode, capi-1.13 condition mode).

mod kube_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{pinned_kind, Scope};
use kube::Client;
use kube_support::{
    annotate_mode, capi_1_13, free_port, https_accepting_self_signed, kube_client, release_tool,
    service_account_token, token_kubeconfig, Fixture,
};
use serde_json::{json, Value};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
/// The release name of the docs (`helm install capc-health-shim …`): the Lease, the memory
/// ConfigMap and the objects keep the base's names, which `cleanup`'s defaults are.
const RELEASE: &str = "capc-health-shim";
/// The operator's field manager (Helm's and kubectl's applies).
const OPERATOR: &str = "operator-walk";
const SHIM_MANAGER: &str = "capc-health-shim";
const TYPE: &str = "CloudStackVMHealthy";
const REMEDIATE: &str = "cluster.x-k8s.io/remediate-machine";

fn step(what: &str) {
    println!("\n== {what}");
}

/// The bundle in an empty directory: its files (those SHA256SUMS lists) checked with sha256sum.
struct Bundle {
    /// The empty directory the bundle was copied into (kept for the test's life).
    _dir: tempfile::TempDir,
    cli: PathBuf,
    chart: PathBuf,
}

fn bundle() -> Bundle {
    let dist = Path::new(REPO).join("target/dist");
    let sums = std::fs::read_to_string(dist.join("SHA256SUMS"))
        .unwrap_or_else(|e| panic!("target/dist/SHA256SUMS: {e} (run make dist)"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(dist.join("SHA256SUMS"), dir.path().join("SHA256SUMS")).unwrap();
    for line in sums.lines() {
        let (_, name) = line.split_once("  ").expect("sha256sum line");
        std::fs::copy(dist.join(name), dir.path().join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let size = std::fs::metadata(dir.path().join(name)).unwrap().len();
        println!("{size:>10}  {name}");
    }
    let check = Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(dir.path())
        .output()
        .expect("sha256sum");
    assert!(check.status.success(), "{check:?}");
    let version = env!("CARGO_PKG_VERSION");
    // The CLI is named by platform (capc-health-shim-v<version>-linux-<arch>).
    let cli = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("capc-health-shim-v{version}-linux-"))
        })
        .expect("the bundle's CLI");
    let chart = dir.path().join(format!("capc-health-shim-{version}.tgz"));
    assert!(chart.exists(), "the bundle's chart");
    Bundle {
        _dir: dir,
        cli,
        chart,
    }
}

/// The bundle's CLI: `capc-health-shim ARGS` with the admin kubeconfig (the operator's), printed.
fn shim_cli(b: &Bundle, args: &[&str]) -> Output {
    let out = Command::new(&b.cli)
        .args(args)
        .env("KUBECONFIG", test_support::apiserver::kubeconfig_path())
        .env_remove("CAPC_HEALTH_LOG")
        .output()
        .expect("the bundle's CLI runs");
    println!(
        "$ capc-health-shim {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// kubectl with the admin kubeconfig (the documented check commands); its stdout.
fn kubectl(args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", test_support::apiserver::kubeconfig_path())
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What `helm template` renders of `chart` (the release tool: Helm's own library).
fn helm_template(chart: &Path, ns: &str, sets: &[String]) -> Vec<Value> {
    let mut cmd = Command::new(release_tool());
    cmd.args(["helm-template", "--chart"]).arg(chart).args([
        "--namespace",
        ns,
        "--release-name",
        RELEASE,
    ]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("release tool runs");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_docs(&String::from_utf8(out.stdout).unwrap())
}

fn yaml_docs(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("YAML document");
        if !v.is_null() {
            out.push(v);
        }
    }
    out
}

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap()
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap()
}

async fn api_for(client: &Client, obj: &Value) -> Api<DynamicObject> {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let (ar, caps) = pinned_kind(client, &GroupVersionKind::gvk(group, version, kind(obj)))
        .await
        .unwrap_or_else(|e| panic!("{} is not served: {e}", kind(obj)));
    match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &ar),
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            obj["metadata"]["namespace"].as_str().expect("a namespace"),
            &ar,
        ),
    }
}

/// Server-side apply, strict field validation, dry run first (what `helm install` and `kubectl
/// apply --server-side` send).
async fn apply(client: &Client, o: &Value) {
    let api = api_for(client, o).await;
    let pp = PatchParams::apply(OPERATOR).validation_strict();
    let what = format!("{} {}", kind(o), name(o));
    api.patch(name(o), &pp.clone().dry_run(), &Patch::Apply(o))
        .await
        .unwrap_or_else(|e| panic!("{what}: apply, dry run: {e}"));
    api.patch(name(o), &pp, &Patch::Apply(o))
        .await
        .unwrap_or_else(|e| panic!("{what}: apply: {e}"));
}

/// The chart's render for the walk: the cluster-scoped objects (ClusterRoles, the binding) get
/// the shim namespace as a suffix, as in tests/release_manifests.rs, so that the walk takes over
/// no object of another test on a shared API server; the Deployment is untouched.
fn suffix_cluster_scoped(objs: &mut [Value], ns: &str) {
    for o in objs.iter_mut() {
        if matches!(kind(o), "ClusterRole" | "ClusterRoleBinding") {
            let n = format!("{}-{ns}", name(o));
            o["metadata"]["name"] = json!(n);
        }
        if o["roleRef"]["kind"] == "ClusterRole" {
            let r = format!("{}-{ns}", o["roleRef"]["name"].as_str().unwrap());
            o["roleRef"]["name"] = json!(r);
        }
    }
}

fn manager_container(objs: &[Value]) -> Value {
    let d = objs
        .iter()
        .find(|o| kind(o) == "Deployment")
        .expect("the Deployment");
    d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "manager")
        .expect("container manager")
        .clone()
}

struct Shim {
    child: Child,
    log: PathBuf,
    addr: String,
}

impl Shim {
    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as the kubelet stops a pod; waits for the exit.
    async fn stop(mut self) {
        assert!(Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success());
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "run did not stop within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bundle's binary as the pod would run it: the rendered Deployment's args and env (the
/// pod's namespace from its fieldRef), the ServiceAccount's token, HOSTNAME the pod's name; only
/// --status-addr is added (loopback).
fn start_shim(b: &Bundle, objs: &[Value], ns: &str, kubeconfig: &Path, pod: &str) -> Shim {
    let c = manager_container(objs);
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args.first(), Some(&"run"), "{args:?}");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(&b.cli);
    cmd.args(&args).args(["--status-addr", &addr]);
    let mut shown = Vec::new();
    for e in c["env"].as_array().cloned().unwrap_or_default() {
        let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("metadata.namespace") => ns.to_string(),
            Some(other) => panic!("fieldRef {other}: teach the test"),
            None => e["value"].as_str().expect("a literal value").to_string(),
        };
        shown.push(format!("{}={value}", e["name"].as_str().unwrap()));
        cmd.env(e["name"].as_str().unwrap(), value);
    }
    println!(
        "start {pod}: {} {} --status-addr {addr} (env: {})",
        b.cli.file_name().unwrap().to_string_lossy(),
        args.join(" "),
        shown.join(" ")
    );
    let log = kubeconfig.with_file_name(format!("{pod}.log"));
    let child = cmd
        .env("KUBECONFIG", kubeconfig)
        .env("HOSTNAME", pod)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("capc-health-shim run");
    Shim { child, log, addr }
}

/// `kubectl -n NS get lease NAME -o jsonpath='{.spec.holderIdentity}'` (docs/install.md step 5).
fn lease_holder(ns: &str) -> String {
    kubectl(&[
        "-n",
        ns,
        "get",
        "lease",
        RELEASE,
        "-o",
        "jsonpath={.spec.holderIdentity}",
        "--ignore-not-found",
    ])
}

async fn wait_leading(shim: &mut Shim, ns: &str, pod: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(Some(status)) = shim.child.try_wait() {
            panic!("run exited with {status}:\n{}", shim.logs());
        }
        if lease_holder(ns) == pod {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{pod} does not lead within 90 s (holder {:?}):\n{}",
            lease_holder(ns),
            shim.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `capc-health-shim status -o json` through the bundle's CLI with the reader's token file.
fn status_json(b: &Bundle, shim: &Shim, token_file: &Path) -> Option<Value> {
    let out = Command::new(&b.cli)
        .args(["status", "--url", &format!("https://{}", shim.addr)])
        .arg("--token-file")
        .arg(token_file)
        .args(["--insecure-skip-tls-verify", "-o", "json"])
        .output()
        .expect("status runs");
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn machine_entry<'a>(status: &'a Value, cluster: &str, machine: &str) -> &'a Value {
    &status["clusters"][cluster]["machines"][machine]
}

/// The completed cycles of a shim, from its /metrics (`capc_health_cycle_duration_seconds_count`).
async fn cycles(http: &reqwest::Client, shim: &Shim, token: &str) -> u64 {
    let Ok(r) = http
        .get(format!("https://{}/metrics", shim.addr))
        .bearer_auth(token)
        .send()
        .await
    else {
        return 0;
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("capc_health_cycle_duration_seconds_count "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

/// A Machine's standing verdict: the shim's condition entry (status, reason,
/// lastTransitionTime) at `pointer`, and the remediate annotation.
type Standing = (Option<(String, String, String)>, Option<String>);

async fn standing(f: &Fixture, pointer: &str, names: &[&str]) -> BTreeMap<String, Standing> {
    let mut out = BTreeMap::new();
    for n in names {
        let m = kube_support::get(&f.client, &f.ns, &f.resources.machine, n).await;
        let c = m
            .pointer(pointer)
            .and_then(Value::as_array)
            .and_then(|l| l.iter().find(|c| c["type"] == TYPE))
            .map(|c| {
                let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                (s("status"), s("reason"), s("lastTransitionTime"))
            });
        let a = m["metadata"]["annotations"][REMEDIATE]
            .as_str()
            .map(str::to_string);
        out.insert(n.to_string(), (c, a));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver and make dist: `make test` runs it (hack/with-apiserver.sh)"]
async fn the_operator_walks_install_check_mhc_upgrade_and_uninstall_from_the_bundle() {
    let client = kube_client().await;
    step("the release bundle, copied into an empty directory (sha256sum -c SHA256SUMS)");
    let b = bundle();
    let version = env!("CARGO_PKG_VERSION");
    let out = shim_cli(&b, &["--version"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(version));

    // The workload side: CAPC's Secret of the failure domain (pointing at cloudstack-sim), the
    // Cluster c1, one Machine whose VM is healthy and one whose VM is in Error.
    step("a Cluster with two Machines: VM healthy, VM in Error (cloudstack-sim)");
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-fault", "healthy", "Error"),
            ("vm-ok", "healthy", "Starting"),
        ],
    )
    .await;
    let annotate = annotate_mode(&f);
    // The fixture's own MHC goes: the walk installs the documented one.
    let mhcs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &f.ns, &f.resources.mhc);
    mhcs.delete("c1-mhc", &DeleteParams::default())
        .await
        .expect("delete the fixture's MHC");
    f.machine("m-fault", Some("vm-fault"), false, "fd1").await;
    f.machine("m-ok", Some("vm-ok"), false, "fd1").await;
    let cluster = format!("{}/c1", f.ns);
    println!("Cluster {cluster}: m-fault (VM Error), m-ok (VM healthy)");

    step("helm install capc-health-shim <bundle chart> (namespace labelled restricted)");
    let ns = format!(
        "walk-shim-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns,
            "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
        .unwrap(),
    )
    .await
    .expect("the release namespace");
    // Test timings through the chart's config values; the shim watches the walk's namespace only.
    let sets = vec![
        "log=info".to_string(),
        "config.pollInterval=1s".to_string(),
        "config.statsInterval=1s".to_string(),
        "config.escalationDelay=1s".to_string(),
        format!("config.namespaces={{{}}}", f.ns),
    ];
    let mut objs = helm_template(&b.chart, &ns, &sets);
    suffix_cluster_scoped(&mut objs, &ns);
    for o in &objs {
        apply(&client, o).await;
        println!("applied {} {}", kind(o), name(o));
    }
    let sa = objs
        .iter()
        .find(|o| kind(o) == "ServiceAccount")
        .map(|o| name(o).to_string())
        .expect("the release's ServiceAccount");
    let reader_role = objs
        .iter()
        .find(|o| kind(o) == "ClusterRole" && name(o).contains("metrics-reader"))
        .map(|o| name(o).to_string())
        .expect("the metrics reader ClusterRole");
    let work = tempfile::tempdir().unwrap();
    let sa_kubeconfig =
        token_kubeconfig(work.path(), &service_account_token(&client, &ns, &sa).await);

    step("the shim runs as the release (the bundle's binary, the Deployment's args and env)");
    let pod1 = "capc-health-shim-5d8f7c9b4-x2k4p";
    let mut shim = start_shim(&b, &objs, &ns, &sa_kubeconfig, pod1);
    wait_leading(&mut shim, &ns, pod1).await;

    step("check it works (docs/install.md, 5)");
    let holder = lease_holder(&ns);
    println!(
        "$ kubectl -n {ns} get lease {RELEASE} -o jsonpath='{{.spec.holderIdentity}}'\n{holder}"
    );
    assert_eq!(holder, pod1, "the Lease names the leader");
    let binding = format!("shim-reader-{ns}");
    kubectl(&["-n", &ns, "create", "serviceaccount", "shim-reader"]);
    kubectl(&[
        "create",
        "clusterrolebinding",
        &binding,
        &format!("--clusterrole={reader_role}"),
        &format!("--serviceaccount={ns}:shim-reader"),
    ]);
    let reader_token = kubectl(&["-n", &ns, "create", "token", "shim-reader"]);
    let token_file = work.path().join("shim-token");
    std::fs::write(&token_file, reader_token.trim()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = status_json(&b, &shim, &token_file);
        let verdict = |m: &str| {
            s.as_ref().map(|s| {
                let e = machine_entry(s, &cluster, m);
                (e["verdict"].clone(), e["reason"].clone())
            })
        };
        if verdict("m-fault") == Some((json!("False"), json!("VMError")))
            && verdict("m-ok") == Some((json!("True"), json!("VMHealthy")))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "verdicts within 120 s: m-fault {:?}, m-ok {:?}\n{}",
            verdict("m-fault"),
            verdict("m-ok"),
            shim.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let url = format!("https://{}", shim.addr);
    let out = shim_cli(
        &b,
        &[
            "status",
            "--url",
            &url,
            "--token-file",
            token_file.to_str().unwrap(),
            "--insecure-skip-tls-verify",
        ],
    );
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let row = |m: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(m))
            .unwrap_or_else(|| panic!("no row for {m}:\n{table}"))
            .to_string()
    };
    assert!(table.contains("ACTED ON"), "{table}");
    let fault = row("m-fault");
    assert!(
        fault.contains(" False ") && fault.contains(" VMError "),
        "{fault}"
    );
    let ok = row("m-ok");
    assert!(ok.contains(" True ") && ok.contains(" VMHealthy "), "{ok}");
    // No MHC covers them yet: nothing acts on the verdict.
    let s = status_json(&b, &shim, &token_file).expect("status");
    let acted = machine_entry(&s, &cluster, "m-fault")["acted_on"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(acted.starts_with("none"), "before the MHC: {acted}");
    assert!(fault.contains(" none:"), "{fault}");
    // The documented columns: status.conditions on CAPI 1.12+, status.v1beta2.conditions before.
    let columns = kubectl(&[
        "get",
        "machines",
        "-n",
        &f.ns,
        "-o",
        "custom-columns=NAME:.metadata.name,HEALTH:.status.conditions[?(@.type==\"CloudStackVMHealthy\")].status,HEALTH_V1BETA2:.status.v1beta2.conditions[?(@.type==\"CloudStackVMHealthy\")].status",
    ]);
    println!(
        "$ kubectl get machines -o custom-columns=NAME:…,HEALTH:…,HEALTH_V1BETA2:…\n{columns}"
    );
    let cols = |m: &str| -> Vec<String> {
        columns
            .lines()
            .find(|l| l.starts_with(&format!("{m} ")))
            .unwrap_or_else(|| panic!("no line for {m}: {columns}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let (fault_cols, ok_cols) = (cols("m-fault"), cols("m-ok"));
    if capi_1_13() {
        assert_eq!(fault_cols[1..], ["False", "<none>"], "{columns}");
        assert_eq!(ok_cols[1..], ["True", "<none>"], "{columns}");
    } else {
        assert_eq!(fault_cols[1..], ["<none>", "False"], "{columns}");
        assert_eq!(ok_cols[1..], ["<none>", "True"], "{columns}");
    }
    let pointer = if capi_1_13() {
        "/status/conditions"
    } else {
        "/status/v1beta2/conditions"
    };
    assert_eq!(pointer, f.conditions_pointer());

    step("the documented MHC: capc-health-shim mhc --cluster NS/NAME, applied as printed");
    let out = shim_cli(&b, &["mhc", "--cluster", &cluster]);
    assert!(out.status.success());
    let mhc_docs = yaml_docs(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(mhc_docs.len(), 1, "one MachineHealthCheck");
    apply(&client, &mhc_docs[0]).await;
    let mhc_name = name(&mhc_docs[0]).to_string();
    println!("applied MachineHealthCheck {}/{mhc_name}", f.ns);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = status_json(&b, &shim, &token_file);
        let e = s
            .as_ref()
            .map(|s| machine_entry(s, &cluster, "m-fault").clone());
        let acted = e
            .as_ref()
            .and_then(|e| e["acted_on"].as_str().map(str::to_string))
            .unwrap_or_default();
        let now = standing(&f, pointer, &["m-fault", "m-ok"]).await;
        let ready = if annotate {
            acted == "annotation"
                && e.as_ref().is_some_and(|e| e["escalation"] == "annotated")
                && now["m-fault"].1.is_some()
        } else {
            acted.starts_with("condition")
        };
        if ready {
            println!(
                "m-fault: acted_on {acted}, escalation {}, remediate annotation {:?}",
                e.as_ref().unwrap()["escalation"],
                now["m-fault"].1
            );
            assert_eq!(now["m-ok"].1, None, "the healthy Machine is not annotated");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not recycle-ready within 120 s: acted_on {acted:?}, {now:?}\n{}",
            shim.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The orphan report's memory is written before the uninstall lists it.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let memory = format!("{RELEASE}-memory");
    let deadline = Instant::now() + Duration::from_secs(60);
    while maps.get_opt(&memory).await.unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "no ConfigMap {memory} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let before = standing(&f, pointer, &["m-fault", "m-ok"]).await;
    println!("standing verdicts: {before:?}");
    assert!(before.values().all(|(c, _)| c.is_some()));

    step("upgrade: stop, apply the chart of a next version, start it");
    shim.stop().await;
    let next = work.path().join("next");
    std::fs::create_dir_all(&next).unwrap();
    let untar = Command::new("tar")
        .arg("-xzf")
        .arg(&b.chart)
        .current_dir(&next)
        .output()
        .expect("tar");
    assert!(untar.status.success(), "{untar:?}");
    let chart_yaml = next.join("capc-health-shim/Chart.yaml");
    let text = std::fs::read_to_string(&chart_yaml).unwrap();
    let (major, rest) = version.split_once('.').unwrap();
    let (minor, _) = rest.split_once('.').unwrap();
    let next_version = format!("{major}.{}.0", minor.parse::<u32>().unwrap() + 1);
    let bumped = text
        .replace(
            &format!("version: {version}\n"),
            &format!("version: {next_version}\n"),
        )
        .replace(
            &format!("appVersion: \"v{version}\""),
            &format!("appVersion: \"v{next_version}\""),
        );
    assert_ne!(bumped, text, "Chart.yaml: {text}");
    std::fs::write(&chart_yaml, bumped).unwrap();
    let mut next_objs = helm_template(&next.join("capc-health-shim"), &ns, &sets);
    suffix_cluster_scoped(&mut next_objs, &ns);
    let d = next_objs.iter().find(|o| kind(o) == "Deployment").unwrap();
    assert_eq!(
        d["metadata"]["labels"]["helm.sh/chart"],
        format!("capc-health-shim-{next_version}"),
        "the next version's render"
    );
    for o in &next_objs {
        apply(&client, o).await;
    }
    println!("applied the chart of v{next_version}");
    let pod2 = "capc-health-shim-7b6c5d4f8-q9r7t";
    let mut shim = start_shim(&b, &next_objs, &ns, &sa_kubeconfig, pod2);
    let http = https_accepting_self_signed(Duration::from_secs(3));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut led = false;
    loop {
        if let Ok(Some(status)) = shim.child.try_wait() {
            panic!("run exited with {status}:\n{}", shim.logs());
        }
        // Never Unknown, never gone, never changed, at any time of the handover.
        let now = standing(&f, pointer, &["m-fault", "m-ok"]).await;
        assert_eq!(now, before, "a standing verdict changed during the upgrade");
        led = led || lease_holder(&ns) == pod2;
        let done = if led {
            cycles(&http, &shim, reader_token.trim()).await
        } else {
            0
        };
        if done >= 5 {
            println!("{pod2} leads; {done} cycles completed");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the next version: led={led}, {done} cycles within 120 s\n{}",
            shim.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let after = standing(&f, pointer, &["m-fault", "m-ok"]).await;
    println!("standing verdicts after the upgrade: {after:?}");
    assert_eq!(after, before, "every standing verdict kept");
    let s = status_json(&b, &shim, &token_file).expect("status of the next version");
    assert_eq!(machine_entry(&s, &cluster, "m-fault")["verdict"], "False");
    assert_eq!(machine_entry(&s, &cluster, "m-ok")["verdict"], "True");

    step("uninstall: the release's objects deleted (helm uninstall), the process gone");
    shim.stop().await;
    for o in next_objs.iter().rev() {
        api_for(&client, o)
            .await
            .delete(name(o), &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete {} {}: {e}", kind(o), name(o)));
    }
    // The operator's reader of step 5.
    kubectl(&["delete", "clusterrolebinding", &binding]);
    kubectl(&["-n", &ns, "delete", "serviceaccount", "shim-reader"]);

    step("capc-health-shim cleanup: what the shim left");
    let flags = ["cleanup", "--lease-namespace", &ns, "--namespace", &f.ns];
    let out = shim_cli(&b, &flags);
    assert!(out.status.success());
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    for want in [
        format!("Lease      {ns}/{RELEASE}"),
        format!("ConfigMap  {ns}/{memory}"),
        format!("{}/m-fault", f.ns),
        format!("{}/m-ok", f.ns),
        TYPE.to_string(),
    ] {
        assert!(listing.contains(&want), "{want} not listed:\n{listing}");
    }
    if annotate {
        assert!(listing.contains(REMEDIATE), "{listing}");
    } else {
        assert!(
            listing.contains(&format!("{}/{mhc_name}: 1 entry naming {TYPE}", f.ns)),
            "{listing}"
        );
    }
    step("capc-health-shim cleanup --yes --remove-mhc-entries");
    let out = shim_cli(
        &b,
        &[&flags[..], &["--yes", "--remove-mhc-entries"]].concat(),
    );
    assert!(out.status.success());
    let removal = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(removal.contains("REMOVED"), "{removal}");

    step("what is left: 0 objects, 0 fields of the shim's field manager");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    assert!(
        leases.get_opt(RELEASE).await.unwrap().is_none(),
        "Lease left"
    );
    assert!(
        maps.get_opt(&memory).await.unwrap().is_none(),
        "ConfigMap left"
    );
    let mut left = Vec::new();
    for o in &next_objs {
        if api_for(&client, o)
            .await
            .get_opt(name(o))
            .await
            .unwrap()
            .is_some()
        {
            left.push(format!("{} {}", kind(o), name(o)));
        }
    }
    assert!(left.is_empty(), "release objects left: {left:?}");
    let machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &f.ns, &f.resources.machine);
    let mut fields = 0;
    for m in machines.list(&ListParams::default()).await.unwrap().items {
        let v = serde_json::to_value(&m).unwrap();
        let n = m.metadata.name.clone().unwrap();
        let owned: Vec<&Value> = v["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["manager"] == SHIM_MANAGER)
            .collect();
        fields += owned.len();
        assert!(owned.is_empty(), "{n}: {owned:?}");
        for p in ["/status/conditions", "/status/v1beta2/conditions"] {
            let has = v
                .pointer(p)
                .and_then(Value::as_array)
                .is_some_and(|l| l.iter().any(|c| c["type"] == TYPE));
            assert!(!has, "{n}: {TYPE} left at {p}");
        }
        assert!(
            v["metadata"]["annotations"][REMEDIATE].is_null(),
            "{n}: {REMEDIATE} left"
        );
    }
    let mhc = kube_support::get(&client, &f.ns, &f.resources.mhc, &mhc_name).await;
    let entries = mhc
        .pointer("/spec/checks/unhealthyMachineConditions")
        .and_then(Value::as_array)
        .map(|l| l.iter().filter(|c| c["type"] == TYPE).count())
        .unwrap_or(0);
    assert_eq!(entries, 0, "MHC entries naming {TYPE}: {mhc}");
    let out = shim_cli(&b, &flags);
    let again = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        again.contains("TOTAL: 0 object(s), 0 condition entries and 0 annotation(s) (+0 other field(s)) on 0 Machine(s), 0 MachineHealthCheck entries"),
        "{again}"
    );
    println!(
        "left: 0 objects of the release or the shim, {fields} fields of {SHIM_MANAGER} on the Machines, {entries} MHC entries"
    );

    nss.delete(&ns, &DeleteParams::default()).await.unwrap();
    f.cleanup().await;
}
