//! The secured HTTP side as deployed: `capc-health-shim run` with its defaults serves HTTPS and
//! answers `/status` and `/metrics` only to bearer tokens the real kube-apiserver authenticates
//! (TokenReview) and authorizes for the path (SubjectAccessReview, granted by the ClusterRole
//! `capc-health-shim-metrics-reader` of deploy/base/rbac.yaml); `/healthz` and `/readyz` stay
//! open; `capc-health-shim status` brings the token. Also: answers are cached (a scrape costs
//! no review), a review the API server cannot answer is a 503 and never a pass, and a
//! certificate of the operator's is served, verified with `--ca-file` and reloaded on change.

mod kube_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use capc_health_shim::http::auth::{DENY_TTL, READER_CLUSTER_ROLE};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use kube_support::{free_port, https_accepting_self_signed, kube_client, service_account_token};
use serde_json::{json, Value};
use test_support::proxy::CutProxy;

/// The tests share one API server and one of them counts its TokenReviews: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const DEADLINE: Duration = Duration::from_secs(60);

/// `capc-health-shim run` as a process, killed when dropped; its log in a file.
struct Shim {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Shim {
    fn start(kubeconfig: &Path, ns: &str, dir: &Path, extra: &[&str]) -> Self {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join(format!("shim-{}.log", addr.replace(':', "-")));
        let file = std::fs::File::create(&log).expect("log file");
        let mut args = vec![
            "--log",
            "debug",
            "run",
            "--namespace",
            ns,
            "--no-leader-election",
            "--status-addr",
            &addr,
        ];
        args.extend_from_slice(extra);
        let child = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
            .args(&args)
            .env("KUBECONFIG", kubeconfig)
            .env("HOSTNAME", "http-auth-test")
            .env_remove("CAPC_HEALTH_INSECURE_SERVING")
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("start capc-health-shim run");
        Self { child, addr, log }
    }

    fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Until `/readyz` answers 200 over HTTPS without any token.
    async fn wait_ready(&mut self) {
        let client = https_accepting_self_signed(Duration::from_secs(15));
        let until = Instant::now() + DEADLINE;
        loop {
            if let Some((200, body)) = get(&client, &self.url("/readyz"), None).await {
                assert_eq!(body, "ready\n");
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("run exited with {status}:\n{}", self.logs());
            }
            assert!(
                Instant::now() < until,
                "not ready within {DEADLINE:?}:\n{}",
                self.logs()
            );
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

/// GET with an optional bearer token: status and body, `None` when nothing answered HTTP.
async fn get(client: &reqwest::Client, url: &str, token: Option<&str>) -> Option<(u16, String)> {
    Some(get_full(client, url, token).await?.0)
}

async fn get_full(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
) -> Option<((u16, String), reqwest::header::HeaderMap)> {
    let mut req = client.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.ok()?;
    let code = r.status().as_u16();
    let headers = r.headers().clone();
    Some(((code, r.text().await.ok()?), headers))
}

/// Runs the real `capc-health-shim` CLI off the async runtime.
async fn cli(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
            .args(&args)
            .env_remove("CAPC_HEALTH_TOKEN")
            .env_remove("CAPC_HEALTH_TOKEN_FILE")
            .env_remove("CAPC_HEALTH_URL")
            .output()
            .expect("capc-health-shim runs")
    })
    .await
    .expect("join")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A namespace with two ServiceAccounts: `reader`, bound to a copy of the shipped reader
/// ClusterRole, and `stranger`, bound to nothing; their tokens in files.
struct Accounts {
    client: Client,
    ns: String,
    role: String,
    bindings: Vec<String>,
    reader: String,
    stranger: String,
    reader_file: PathBuf,
    stranger_file: PathBuf,
}

/// The reader ClusterRole exactly as deploy/base/rbac.yaml ships it.
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

impl Accounts {
    async fn new(client: Client, dir: &Path) -> Self {
        let ns = format!(
            "http-auth-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let namespaces: Api<Namespace> = Api::all(client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await
            .expect("namespace");
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
        let mut tokens = Vec::new();
        for name in ["reader", "stranger"] {
            sas.create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .expect("ServiceAccount");
            tokens.push(service_account_token(&client, &ns, name).await);
        }
        // The shipped role under a name of this test, so parallel runs never collide.
        let mut role = shipped_reader_role();
        let role_name = format!("{READER_CLUSTER_ROLE}-{ns}");
        role.metadata.name = Some(role_name.clone());
        let roles: Api<ClusterRole> = Api::all(client.clone());
        roles
            .create(&PostParams::default(), &role)
            .await
            .expect("reader ClusterRole");
        let reader_file = dir.join(format!("{ns}-reader.token"));
        let stranger_file = dir.join(format!("{ns}-stranger.token"));
        std::fs::write(&reader_file, format!("{}\n", tokens[0])).unwrap();
        std::fs::write(&stranger_file, &tokens[1]).unwrap();
        let mut accounts = Self {
            client,
            ns,
            role: role_name,
            bindings: Vec::new(),
            reader: tokens[0].clone(),
            stranger: tokens[1].clone(),
            reader_file,
            stranger_file,
        };
        accounts.bind("reader").await;
        accounts
    }

    async fn bind(&mut self, sa: &str) {
        let name = format!("{}-{sa}", self.role);
        let bindings: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": self.role},
                    "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": self.ns}],
                }))
                .unwrap(),
            )
            .await
            .expect("ClusterRoleBinding");
        self.bindings.push(name);
    }

    async fn cleanup(self) {
        let bindings: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        for b in &self.bindings {
            let _ = bindings.delete(b, &DeleteParams::default()).await;
        }
        let roles: Api<ClusterRole> = Api::all(self.client.clone());
        let _ = roles.delete(&self.role, &DeleteParams::default()).await;
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let _ = namespaces.delete(&self.ns, &DeleteParams::default()).await;
    }
}

/// TokenReviews the API server has answered so far, from its own `/metrics`.
async fn token_reviews() -> f64 {
    let dir = test_support::apiserver::kubeconfig_path()
        .parent()
        .expect("dir")
        .to_path_buf();
    let admin = std::fs::read_to_string(dir.join("token")).expect("token next to the kubeconfig");
    let (code, text) = get(
        &https_accepting_self_signed(Duration::from_secs(15)),
        &format!("{}/metrics", test_support::apiserver::url()),
        Some(admin.trim()),
    )
    .await
    .expect("apiserver /metrics");
    assert_eq!(code, 200);
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"tokenreviews\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn status_and_metrics_need_a_token_the_api_server_authorizes() {
    let _serial = SERIAL.lock().await;
    let admin = kube_client().await;
    let dir = tempfile::tempdir().unwrap();
    let mut a = Accounts::new(admin, dir.path()).await;
    let mut shim = Shim::start(
        &test_support::apiserver::kubeconfig_path(),
        &a.ns,
        dir.path(),
        &[],
    );
    // Ready over HTTPS with no token at all: the probes stay open.
    shim.wait_ready().await;
    let c = https_accepting_self_signed(Duration::from_secs(15));
    assert_eq!(
        get(&c, &shim.url("/healthz"), None).await,
        Some((200, "ok\n".to_string()))
    );
    // No plain HTTP on the secured listener.
    assert_eq!(
        kube_support::http_get(&format!("http://{}/status", shim.addr)).await,
        None,
        "the secured listener answered plain HTTP"
    );

    // 401: no token, another scheme, a token the API server does not know.
    let ((code, body), headers) = get_full(&c, &shim.url("/metrics"), None).await.unwrap();
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("no bearer token"), "{body}");
    assert!(headers
        .get("www-authenticate")
        .is_some_and(|v| v.to_str().unwrap().starts_with("Bearer")));
    let basic = c
        .get(shim.url("/status"))
        .basic_auth("admin", Some("admin"))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status().as_u16(), 401);
    let garbage = "not-a-kubernetes-token-3f9c1a";
    let (code, body) = get(&c, &shim.url("/status"), Some(garbage)).await.unwrap();
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("did not accept the bearer token"), "{body}");

    // 403: a real token whose user has no binding; the body names the user and the role.
    for path in ["/metrics", "/status"] {
        let (code, body) = get(&c, &shim.url(path), Some(&a.stranger)).await.unwrap();
        assert_eq!(code, 403, "{path}: {body}");
        assert!(
            body.contains(&format!("system:serviceaccount:{}:stranger", a.ns)),
            "{body}"
        );
        assert!(body.contains(READER_CLUSTER_ROLE), "{body}");
    }

    // 200 for the reader, on both paths.
    let (code, metrics) = get(&c, &shim.url("/metrics"), Some(&a.reader))
        .await
        .unwrap();
    assert_eq!(code, 200, "{metrics}");
    assert!(metrics.contains("capc_health_leader 1"), "{metrics}");
    let (code, status) = get(&c, &shim.url("/status"), Some(&a.reader))
        .await
        .unwrap();
    assert_eq!(code, 200, "{status}");
    let doc: Value = serde_json::from_str(&status).expect("JSON");
    assert_eq!(doc["leader"], true);
    assert_eq!(doc["ready"], true);

    // Answers are cached: five more scrapes cost the API server no TokenReview.
    let before = token_reviews().await;
    assert!(
        before >= 5.0,
        "the API server counted {before} TokenReviews; the requests above made at least 5"
    );
    for _ in 0..5 {
        let (code, _) = get(&c, &shim.url("/metrics"), Some(&a.reader))
            .await
            .unwrap();
        assert_eq!(code, 200);
    }
    assert_eq!(
        token_reviews().await - before,
        0.0,
        "cached scrapes still asked the API server"
    );

    // `capc-health-shim status` brings the token.
    let base = shim.url("");
    let reader_file = a.reader_file.display().to_string();
    let stranger_file = a.stranger_file.display().to_string();
    let out = cli(vec![
        "status".into(),
        "--url".into(),
        base.clone(),
        "--token-file".into(),
        reader_file.clone(),
        "--insecure-skip-tls-verify".into(),
        "-o".into(),
        "json".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["leader"], true);
    assert!(
        stderr(&out).contains("not verifying"),
        "the skipped verification is said: {}",
        stderr(&out)
    );
    let out = cli(vec![
        "orphans".into(),
        "--url".into(),
        base.clone(),
        "--token-file".into(),
        reader_file.clone(),
        "--insecure-skip-tls-verify".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("orphan VMs: 0 reported"));
    // The self-signed certificate is not trusted unasked: unreachable (3), with the way out.
    let out = cli(vec![
        "status".into(),
        "--url".into(),
        base.clone(),
        "--token-file".into(),
        reader_file.clone(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--insecure-skip-tls-verify"),
        "{}",
        stderr(&out)
    );
    // Refusals are exit 4 with what to do.
    let out = cli(vec![
        "status".into(),
        "--url".into(),
        base.clone(),
        "--insecure-skip-tls-verify".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no token was sent"),
        "{}",
        stderr(&out)
    );
    let out = cli(vec![
        "status".into(),
        "--url".into(),
        base.clone(),
        "--token-file".into(),
        stranger_file,
        "--insecure-skip-tls-verify".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("HTTP 403"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(READER_CLUSTER_ROLE),
        "{}",
        stderr(&out)
    );
    // Plain HTTP to the HTTPS listener: unreachable, and the message says to use https.
    let out = cli(vec![
        "status".into(),
        "--url".into(),
        format!("http://{}", shim.addr),
        "--token-file".into(),
        reader_file,
    ])
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));

    // A binding made after a refusal counts once the refusal's cache entry runs out.
    a.bind("stranger").await;
    let until = Instant::now() + DENY_TTL + Duration::from_secs(20);
    loop {
        let (code, body) = get(&c, &shim.url("/metrics"), Some(&a.stranger))
            .await
            .unwrap();
        if code == 200 {
            break;
        }
        assert_eq!(code, 403, "{body}");
        assert!(
            Instant::now() < until,
            "the new binding did not count within {:?}",
            DENY_TTL + Duration::from_secs(20)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // No token ever reaches the log (which is at debug level).
    let logs = shim.logs();
    assert!(
        logs.contains("bearer token not accepted"),
        "debug log of the 401s"
    );
    for (what, secret) in [
        ("reader", a.reader.as_str()),
        ("stranger", a.stranger.as_str()),
        ("garbage", garbage),
    ] {
        assert!(!logs.contains(secret), "the {what} token is in the log");
    }
    drop(shim);
    a.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_review_the_api_server_cannot_answer_is_503_never_a_pass() {
    let _serial = SERIAL.lock().await;
    let admin = kube_client().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Accounts::new(admin, dir.path()).await;
    let upstream = url::Url::parse(&test_support::apiserver::url()).unwrap();
    let proxy = CutProxy::start(format!(
        "{}:{}",
        upstream.host_str().unwrap(),
        upstream.port_or_known_default().unwrap()
    ))
    .await;
    let kubeconfig = proxy.kubeconfig(dir.path());
    let mut shim = Shim::start(&kubeconfig, &a.ns, dir.path(), &["--kube-timeout", "2s"]);
    shim.wait_ready().await;
    let c = https_accepting_self_signed(Duration::from_secs(15));

    // The API server unreachable: a token not seen before cannot be reviewed.
    proxy.cut();
    let started = Instant::now();
    let (code, body) = get(&c, &shim.url("/metrics"), Some(&a.reader))
        .await
        .unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("cannot check the request with the Kubernetes API")
            && body.contains("TokenReview"),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the review is bounded by --kube-timeout: {:?}",
        started.elapsed()
    );
    assert!(!body.contains(&a.reader));
    // The failure is not remembered, and the probes do not depend on the API server.
    assert_eq!(
        get(&c, &shim.url("/healthz"), None).await,
        Some((200, "ok\n".to_string()))
    );

    // Back: the same token is reviewed again and gets in.
    proxy.restore();
    let until = Instant::now() + DEADLINE;
    loop {
        let (code, body) = get(&c, &shim.url("/metrics"), Some(&a.reader))
            .await
            .unwrap();
        if code == 200 {
            break;
        }
        assert_eq!(code, 503, "{body}");
        assert!(
            Instant::now() < until,
            "still {code} after the API came back"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(!shim.logs().contains(&a.reader), "the token is in the log");
    drop(shim);
    a.cleanup().await;
}

/// A CA and a serving certificate for 127.0.0.1 it signed, PEM: (ca, cert, key).
fn ca_and_cert() -> (String, String, String) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "capc-health-shim test CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn an_operators_certificate_is_verified_with_ca_file_and_reloaded_on_change() {
    let _serial = SERIAL.lock().await;
    let admin = kube_client().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Accounts::new(admin, dir.path()).await;
    let (ca1, cert1, key1) = ca_and_cert();
    let (ca2, cert2, key2) = ca_and_cert();
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let (ca1, ca2) = (file("ca1.pem", &ca1), file("ca2.pem", &ca2));
    let cert = file("tls.crt", &cert1);
    let key = file("tls.key", &key1);
    let mut shim = Shim::start(
        &test_support::apiserver::kubeconfig_path(),
        &a.ns,
        dir.path(),
        &["--tls-cert-file", &cert, "--tls-private-key-file", &key],
    );
    shim.wait_ready().await;
    let status = |ca: &str| {
        cli(vec![
            "status".into(),
            "--url".into(),
            shim.url(""),
            "--token-file".into(),
            a.reader_file.display().to_string(),
            "--ca-file".into(),
            ca.to_string(),
            "-o".into(),
            "json".into(),
        ])
    };
    let out = status(&ca1).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = status(&ca2).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "another CA's certificate is refused"
    );

    // The files change in place (as a Secret volume or cert-manager rotates them).
    file("tls.crt", &cert2);
    file("tls.key", &key2);
    let until = Instant::now() + Duration::from_secs(40);
    loop {
        let out = status(&ca2).await;
        if out.status.code() == Some(0) {
            break;
        }
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(
            Instant::now() < until,
            "the new certificate was not served within 40 s:\n{}",
            shim.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let out = status(&ca1).await;
    assert_eq!(out.status.code(), Some(3), "the old certificate is gone");
    assert!(shim.logs().contains("serving certificate reloaded"));

    // A broken replacement is refused (said in the log) and the served certificate kept.
    file("tls.key", "not a key");
    let until = Instant::now() + capc_health_shim::http::tls::RELOAD_CHECK_EVERY * 3;
    while !shim.logs().contains("keeping the one in use") {
        assert!(
            Instant::now() < until,
            "the broken key was not noticed:\n{}",
            shim.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = status(&ca2).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    drop(shim);
    a.cleanup().await;
}
