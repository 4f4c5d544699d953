//! `capc-health-shim status` without `--url`, on the real API server (issue 43 item 4): the
//! Lease names the leader's pod, a TokenRequest makes a short-lived token of
//! `--service-account`, and a running shim's secured `/status` accepts it; a standby's answer
//! leads to the Lease's holder; a missing Lease, ServiceAccount or token source is reported as
//! documented.
//!
//! The test API server has no kubelet, so `pods/portforward` never reaches a process: the
//! library's `StatusTransport::Direct` stands in for the port-forward's last hop (the shims'
//! loopback addresses, per pod name) while the binary — which always takes the port-forward —
//! must come back with the API server's own refusal for a Pod object that exists but never ran.
//! The bytes through a port-forward are tests/status_tunnel.rs's (a stand-in API server).

mod kube_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use capc_health_shim::cli::status::leader::{
    leader_status, service_account_token, status_from, Hop, KubePathError, LeaderQuery,
    StatusTransport,
};
use capc_health_shim::cli::status::{exit, BearerToken, FetchError, FetchOptions, View};
use capc_health_shim::http::auth::READER_CLUSTER_ROLE;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use kube_support::{free_port, https_accepting_self_signed, kube_client};
use serde_json::{json, Value};

const LEASE: &str = "capc-health-shim";
const READER: &str = "shim-reader";
/// The container port named `https` of the test's Pod objects: not the default 8443, so the
/// port the CLI picks is seen to come from the pod.
const POD_PORT: u16 = 9443;

/// A namespace with the ServiceAccount `shim-reader` bound to a copy of the shipped reader
/// ClusterRole, as docs/install.md creates it.
struct Setup {
    client: Client,
    ns: String,
    role: String,
}

fn shipped_reader_role() -> ClusterRole {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/base/rbac.yaml"
    ))
    .expect("deploy/base/rbac.yaml");
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("YAML");
        if v["kind"] == "ClusterRole" && v["metadata"]["name"] == READER_CLUSTER_ROLE {
            return serde_json::from_value(v).expect("ClusterRole");
        }
    }
    panic!("no ClusterRole {READER_CLUSTER_ROLE} in deploy/base/rbac.yaml");
}

impl Setup {
    async fn new() -> Self {
        let client = kube_client().await;
        let ns = format!(
            "status-kube-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await
            .expect("namespace");
        Api::<ServiceAccount>::namespaced(client.clone(), &ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": READER}})).unwrap(),
            )
            .await
            .expect("ServiceAccount");
        let mut role = shipped_reader_role();
        let role_name = format!("{READER_CLUSTER_ROLE}-{ns}");
        role.metadata.name = Some(role_name.clone());
        Api::<ClusterRole>::all(client.clone())
            .create(&PostParams::default(), &role)
            .await
            .expect("reader ClusterRole");
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": role_name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
                    "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": ns}],
                }))
                .unwrap(),
            )
            .await
            .expect("ClusterRoleBinding");
        Self {
            client,
            ns,
            role: role_name,
        }
    }

    /// A Pod object as the Deployment's (a container port named https); no kubelet runs it.
    async fn pod(&self, name: &str) {
        Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {
                        "serviceAccountName": READER,
                        "automountServiceAccountToken": false,
                        "containers": [{"name": "manager", "image": "example.invalid/capc-health-shim:test",
                            "ports": [{"name": "https", "containerPort": POD_PORT}]}]
                    }
                }))
                .unwrap(),
            )
            .await
            .expect("Pod");
    }

    /// The Lease `capc-health-shim`, held by `holder` (none: released).
    async fn lease(&self, holder: Option<&str>) {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.ns);
        leases
            .patch(
                LEASE,
                &PatchParams::apply("status-kube-test").force(),
                &Patch::Apply(json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": LEASE},
                    "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
                })),
            )
            .await
            .expect("Lease");
    }

    async fn holder(&self) -> Option<String> {
        Api::<Lease>::namespaced(self.client.clone(), &self.ns)
            .get_opt(LEASE)
            .await
            .expect("read Lease")
            .and_then(|l| l.spec?.holder_identity)
    }

    async fn cleanup(self) {
        let _ = Api::<ClusterRoleBinding>::all(self.client.clone())
            .delete(&self.role, &DeleteParams::default())
            .await;
        let _ = Api::<ClusterRole>::all(self.client.clone())
            .delete(&self.role, &DeleteParams::default())
            .await;
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
    }
}

/// `capc-health-shim run` with its secured defaults (HTTPS, TokenReview + SubjectAccessReview)
/// and leader election on the namespace's Lease; `pod` is its identity (`HOSTNAME`). Killed
/// when dropped.
struct Shim {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Shim {
    fn start(ns: &str, pod: &str, dir: &Path) -> Self {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join(format!("{pod}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
            .args(["--log", "info", "run", "--namespace", ns])
            .args(["--status-addr", &addr, "--lease-namespace", ns])
            .args(["--lease-name", LEASE])
            .env("KUBECONFIG", test_support::apiserver::kubeconfig_path())
            .env("HOSTNAME", pod)
            .env_remove("CAPC_HEALTH_INSECURE_SERVING")
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("start capc-health-shim run");
        Self { child, addr, log }
    }

    fn url(&self) -> url::Url {
        url::Url::parse(&format!("https://{}", self.addr)).unwrap()
    }

    async fn wait_ready(&mut self) {
        let client = https_accepting_self_signed(Duration::from_secs(5));
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = client.get(format!("{}readyz", self.url())).send().await {
                if r.status().as_u16() == 200 {
                    return;
                }
            }
            if let Ok(Some(s)) = self.child.try_wait() {
                panic!(
                    "run exited with {s}:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < until, "not ready within 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The real CLI with the test API server's admin kubeconfig (or `kubeconfig`), off the async
/// runtime, with no token or address from the environment.
async fn cli(args: Vec<String>, kubeconfig: Option<PathBuf>) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"));
        cmd.args(&args).env(
            "KUBECONFIG",
            kubeconfig.unwrap_or_else(test_support::apiserver::kubeconfig_path),
        );
        for v in [
            "CAPC_HEALTH_TOKEN",
            "CAPC_HEALTH_TOKEN_FILE",
            "CAPC_HEALTH_URL",
            "CAPC_HEALTH_NAMESPACE",
            "CAPC_HEALTH_SERVICE_ACCOUNT",
            "CAPC_HEALTH_KUBECONFIG",
            "CAPC_HEALTH_CONTEXT",
            "CAPC_HEALTH_PORT",
            "CAPC_HEALTH_LEASE_NAME",
        ] {
            cmd.env_remove(v);
        }
        cmd.output().expect("capc-health-shim runs")
    })
    .await
    .expect("join")
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn query(ns: &str, token: BearerToken, shims: &[(&str, &Shim)]) -> LeaderQuery {
    LeaderQuery {
        namespace: ns.to_string(),
        lease_name: LEASE.to_string(),
        port: None,
        options: FetchOptions {
            timeout: Duration::from_secs(15),
            token: Some(token),
            ca_pem: None,
            insecure_skip_tls_verify: false,
            resolve: None,
        },
        view: View::default(),
        transport: StatusTransport::Direct(
            shims
                .iter()
                .map(|(pod, s)| (pod.to_string(), s.url()))
                .collect::<BTreeMap<_, _>>(),
        ),
    }
}

/// Two shims on one Lease: the Lease's holder is asked with a ServiceAccount's TokenRequest
/// token, which the running shim's TokenReview and SubjectAccessReview accept; a standby asked
/// first (the Lease moved between the read and the request) leads to the holder; the binary,
/// given the same flags, takes the Lease's holder through a port-forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn the_leaders_status_is_found_through_its_lease_with_a_service_account_token() {
    let s = Setup::new().await;
    let dir = tempfile::tempdir().unwrap();
    s.pod("shim-a").await;
    s.pod("shim-b").await;
    let mut a = Shim::start(&s.ns, "shim-a", dir.path());
    a.wait_ready().await;
    let until = Instant::now() + Duration::from_secs(60);
    while s.holder().await.as_deref() != Some("shim-a") {
        assert!(Instant::now() < until, "shim-a did not take the Lease");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut b = Shim::start(&s.ns, "shim-b", dir.path());
    b.wait_ready().await;
    assert_eq!(s.holder().await.as_deref(), Some("shim-a"));

    // The TokenRequest: a real token of shim-reader, never printed.
    let token = service_account_token(&s.client, &s.ns, READER, Duration::from_secs(10))
        .await
        .expect("a token of shim-reader");
    assert_eq!(format!("{token:?}"), "BearerToken(<redacted>)");

    // The Lease's holder, asked with that token: the leader's own report.
    let q = query(&s.ns, token.clone(), &[("shim-a", &a), ("shim-b", &b)]);
    let got = leader_status(&s.client, &q)
        .await
        .expect("the leader's status");
    assert!(got.report.leader, "{:?}", got.report);
    assert_eq!(
        got.hops,
        vec![Hop {
            pod: "shim-a".into(),
            port: POD_PORT,
            leader: true
        }]
    );

    // Negative control: the shim checks the token (a made-up one is refused, 401).
    let bad = query(
        &s.ns,
        BearerToken::parse("not-a-kubernetes-token").unwrap(),
        &[("shim-a", &a)],
    );
    match leader_status(&s.client, &bad).await {
        Err(KubePathError::Fetch(FetchError::Refused(m))) => assert!(m.contains("401"), "{m}"),
        other => panic!("a made-up token was not refused: {other:?}"),
    }

    // The standby first: its answer (`leader: false`) leads to the Lease's holder, once.
    let got = status_from(&s.client, &q, "shim-b".into())
        .await
        .expect("followed to the leader");
    assert!(got.report.leader, "{:?}", got.report);
    assert_eq!(
        got.hops
            .iter()
            .map(|h| (h.pod.as_str(), h.leader))
            .collect::<Vec<_>>(),
        [("shim-b", false), ("shim-a", true)]
    );

    // The binary with the documented flags: TokenRequest, Lease → shim-a, its port named https,
    // and a port-forward, which the API server refuses for a pod that never ran (no kubelet).
    let out = cli(
        args(&["status", "-n", &s.ns, "--service-account", READER]),
        None,
    )
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(i32::from(exit::KUBE)), "{err}");
    assert!(
        err.contains(&format!(
            "the API server did not open a port-forward to pod {}/shim-a port {POD_PORT}",
            s.ns
        )),
        "{err}"
    );
    drop((a, b));
    s.cleanup().await;
}

/// No shim runs: the binary's port-forward path against the API server's refusal, and the
/// documented errors for a missing Lease, holder, pod, ServiceAccount or token source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn without_url_each_missing_piece_and_the_port_forward_refusal_are_reported() {
    let s = Setup::new().await;
    let ns = s.ns.clone();
    let status = |extra: &[&str]| {
        let mut a = args(&["status", "-n", &ns]);
        a.extend(args(extra));
        a
    };

    // No Lease.
    let out = cli(status(&["--service-account", READER]), None).await;
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("no Lease {LEASE} in namespace {ns}")),
        "{}",
        stderr(&out)
    );

    // A Lease without a holder.
    s.lease(None).await;
    let out = cli(status(&["--service-account", READER]), None).await;
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(stderr(&out).contains("has no holder"), "{}", stderr(&out));

    // A Lease held by a pod that no longer exists.
    s.lease(Some("gone-pod")).await;
    let out = cli(status(&["--service-account", READER]), None).await;
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("there is no pod gone-pod in {ns}")),
        "{}",
        stderr(&out)
    );

    // A ServiceAccount that does not exist.
    s.pod("pending-pod").await;
    s.lease(Some("pending-pod")).await;
    let out = cli(status(&["--service-account", "nobody"]), None).await;
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("no ServiceAccount nobody in namespace {ns}")),
        "{}",
        stderr(&out)
    );

    // The port-forward: the Pod exists but never ran; the API server's refusal is the answer,
    // for `status` and `orphans` alike, and `--port` picks the port.
    for (cmd, port) in [("status", POD_PORT), ("orphans", 7443)] {
        let mut a = args(&[cmd, "-n", &ns, "--service-account", READER]);
        if cmd == "orphans" {
            a.extend(args(&["--port", "7443"]));
        }
        let out = cli(a, None).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(5), "{err}");
        assert!(
            err.contains(&format!(
                "the API server did not open a port-forward to pod {ns}/pending-pod port {port}: \
                 pod pending-pod does not have a host assigned (400); is the pod running?"
            )),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(!err.contains("eyJ"), "a token reached stderr: {err}");
        assert!(out.stdout.is_empty());
    }

    // A kubeconfig user without a bearer token, and no --service-account: what to pass.
    let admin: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(test_support::apiserver::kubeconfig_path()).unwrap(),
    )
    .unwrap();
    let kc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": test_support::apiserver::url(),
            "certificate-authority-data": admin["clusters"][0]["cluster"]["certificate-authority-data"]}}],
        "users": [{"name": "anonymous", "user": {}}],
        "contexts": [{"name": "anon", "context": {"cluster": "test", "user": "anonymous"}}],
        "current-context": "anon",
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig-no-token");
    std::fs::write(&path, serde_yaml_ng::to_string(&kc).unwrap()).unwrap();
    let out = cli(status(&[]), Some(path.clone())).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("pass --service-account NAME"),
        "{}",
        stderr(&out)
    );
    // --kubeconfig names the same file as KUBECONFIG would.
    let mut a = status(&[]);
    a.extend(args(&["--kubeconfig", path.to_str().unwrap()]));
    let out = cli(a, None).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("pass --service-account NAME"));

    // --service-account beside --url is refused rather than ignored.
    let out = cli(
        status(&["--url", "https://127.0.0.1:1", "--service-account", READER]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    s.cleanup().await;
}
