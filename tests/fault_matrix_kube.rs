//! Fault matrix, Kubernetes side (issue 6): `capc-health-shim run` as a process against the
//! real kube-apiserver (hack/apiserver, `CAPC_HEALTH_TEST_KUBECONFIG`) and `cloudstack-sim`
//! when the Kubernetes side misbehaves:
//!
//! 1. the API server goes away and comes back while the shim runs (a TCP proxy between the
//!    shim and the API server is cut and restored: connection refused, as when the
//!    kube-apiserver process is gone);
//! 2. the leader is SIGKILLed during the escalation delay and the follower takes over;
//! 3. the shim is SIGKILLed and restarted mid-grace and mid-escalation-delay;
//! 4. a flood of concurrent status writers (CAPI-patch-helper style, optimistic locking) on
//!    the Machine the shim writes, some of them dropping the shim's condition;
//! 9. the orphan memory's first reads answered 500, and a memory that cannot be decoded: read
//!    before written, kept aside before replaced (in-process controllers, the 500s injected in
//!    the kube client's service stack);
//! 10. the Machines' watch expires and the relist comes from a lagging cache (an older LIST,
//!     then the watch held back; injected in the kube client's service stack).
//!
//! Every test runs under both CRD profiles of `make test-rust` — capi-1.9 (annotate mode) and
//! capi-1.13 (condition mode) — except the two leader-killed-mid-escalation tests, which time
//! the remediate-machine annotation and so apply to annotate mode only: the capi-1.13 pass
//! skips them by name, and run there anyway they fail with the reason instead of passing.
//!
//! Every test uses sentinel CloudStack keys and checks that neither the secret key nor a
//! `signature=` appears in the shim's logs, the namespace's Events, `/status` or `/metrics`.
//! Each writes its outcome as `{fault, expected, observed, ...}` to
//! `target/fault-matrix/<test>.json` (also when it fails: `result` says which).
//! The tests run one at a time (they share two cores and the API server's request counters).

mod kube_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capc_health_shim::controller::cycle::Controller;
use capi_model::apis::Mode;
use cloudstack_sim::{ApiFaults, Fault};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::Client;
use kube_support::matrix::{out_dir, secs, MatrixRow};
use kube_support::{get, http_get, is, kube_client, simulator_with_keys, Fixture};
use serde_json::{json, Value};
use test_support::proxy::CutProxy;
use tokio::sync::Mutex;

/// Evaluates `probe` (an expression that may `.await`) every 250 ms until it is `Some`,
/// panicking with `what` after `within`.
macro_rules! wait_for {
    ($within:expr, $what:expr, $probe:expr) => {{
        let within: Duration = $within;
        let until = Instant::now() + within;
        loop {
            if let Some(v) = async { $probe }.await {
                break v;
            }
            assert!(Instant::now() < until, "not within {:?}: {}", within, $what);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }};
}

/// One test at a time: two shared cores, and test 2/4 read the API server's request counters.
static SERIAL: Mutex<()> = Mutex::const_new(());

const SENTINEL_KEY: &str = "SENTINEL-KEY-kubefaults";

fn sentinel_secret() -> String {
    format!(
        "SENTINEL-SECRET-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Seconds from `a` to `b` (negative when `b` is earlier), one decimal.
fn between(a: Timestamp, b: Timestamp) -> f64 {
    ((b.as_millisecond() - a.as_millisecond()) as f64 / 100.0).round() / 10.0
}

// ---------------------------------------------------------------------------------------------
// The shim as a process.

struct Shim {
    name: String,
    child: Child,
    log: PathBuf,
    addr: String,
    exited: Option<ExitStatus>,
}

impl Shim {
    /// `capc-health-shim run` with `args` (after `run`), its output to
    /// target/fault-matrix/logs/<test>-<name>.log (appended to across restarts).
    fn start(test: &str, name: &str, kubeconfig: &Path, identity: &str, args: &[&str]) -> Self {
        let log = out_dir().join(format!("logs/{test}-{name}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let addr = format!("127.0.0.1:{}", kube_support::free_port());
        let mut all = vec![
            "--log",
            "info,capc_health_shim=debug",
            "run",
            "--status-addr",
            &addr,
            "--insecure-serving",
        ];
        all.extend_from_slice(args);
        let child = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
            .args(&all)
            .env("KUBECONFIG", kubeconfig)
            .env("HOSTNAME", identity)
            .env_remove("RUST_LOG")
            .stdout(Stdio::from(file.try_clone().expect("log fd")))
            .stderr(Stdio::from(file))
            .spawn()
            .expect("start capc-health-shim run");
        Self {
            name: name.to_string(),
            child,
            log,
            addr,
            exited: None,
        }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().expect("try_wait");
        }
        self.exited
    }

    fn assert_running(&mut self) {
        if let Some(s) = self.exit_status() {
            panic!(
                "shim {} exited with {s}; log tail:\n{}",
                self.name,
                tail(&self.logs(), 30)
            );
        }
    }

    fn signal(&self, sig: &str) {
        assert!(Command::new("kill")
            .args([&format!("-{sig}"), &self.pid()])
            .status()
            .expect("kill")
            .success());
    }

    async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let until = Instant::now() + within;
        loop {
            if let Some(s) = self.exit_status() {
                return s;
            }
            assert!(
                Instant::now() < until,
                "shim {} did not exit within {within:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM and a clean exit (code 0) within 20 s.
    async fn stop(&mut self) {
        if self.exit_status().is_some() {
            return;
        }
        self.signal("TERM");
        let s = self.wait_exit(Duration::from_secs(20)).await;
        assert_eq!(
            s.code(),
            Some(0),
            "shim {} after SIGTERM; log tail:\n{}",
            self.name,
            tail(&self.logs(), 30)
        );
    }

    /// The poll cycles it completed (its `cycle done` lines).
    fn cycles_done(&self) -> usize {
        self.logs()
            .lines()
            .filter(|l| l.contains("cycle done"))
            .count()
    }

    /// Waits until it completed `n` more cycles (within `within`), still running: a window in
    /// which an absence is asserted is measured in cycles the shim really ran, not in seconds.
    async fn run_cycles(&mut self, n: usize, within: Duration) {
        let (start, since) = (self.cycles_done(), Instant::now());
        while self.cycles_done() < start + n {
            self.assert_running();
            assert!(
                since.elapsed() < within,
                "{} completed {} of {n} cycles in {within:?}",
                self.name,
                self.cycles_done() - start
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(&format!("http://{}{path}", self.addr)).await
    }

    async fn status(&self) -> Option<Value> {
        match self.get("/status").await {
            Some((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        if self.exit_status().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Sum of the `capc_health_*` metric line values whose line starts with `prefix`.
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---------------------------------------------------------------------------------------------
// The Machine as the API server has it.

/// Per Machine, every published state with when the test first saw it.
type History = BTreeMap<String, Vec<(Timestamp, Option<Seen>)>>;

#[derive(Debug, Clone, PartialEq)]
struct Seen {
    status: String,
    reason: String,
    ltt: Option<Timestamp>,
    annotated: bool,
}

async fn seen(f: &Fixture, name: &str) -> Option<Seen> {
    let m = get(&f.client, &f.ns, &f.resources.machine, name).await;
    let annotated = m
        .pointer("/metadata/annotations/cluster.x-k8s.io~1remediate-machine")
        .is_some();
    let c = kube_support::condition(&m, f.conditions_pointer());
    Some(Seen {
        status: c.map(|c| c["status"].as_str().unwrap_or("").to_string())?,
        reason: c.map(|c| c["reason"].as_str().unwrap_or("").to_string())?,
        ltt: c
            .and_then(|c| c["lastTransitionTime"].as_str())
            .and_then(|t| t.parse().ok()),
        annotated,
    })
}

async fn wait_verdict(
    f: &Fixture,
    name: &str,
    status: &str,
    reason: &str,
    within: Duration,
) -> Seen {
    wait_for!(within, &format!("{name} {status}/{reason}"), {
        seen(f, name)
            .await
            .filter(|s| s.status == status && s.reason == reason)
    })
}

/// Records every change of the Machines' published verdict (polled every 200 ms) until
/// stopped; the history is returned by `finish`.
struct Monitor {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<History>,
}

impl Monitor {
    fn start(f: &Fixture, names: &[&str]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let client = f.client.clone();
        let ns = f.ns.clone();
        let machine = f.resources.machine.clone();
        let pointer = f.conditions_pointer();
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &machine);
            let mut history: History = BTreeMap::new();
            while !flag.load(Ordering::SeqCst) {
                for n in &names {
                    let Ok(m) = api.get(n).await else { continue };
                    let m = serde_json::to_value(m).expect("json");
                    let c = kube_support::condition(&m, pointer);
                    let now = c.map(|c| Seen {
                        status: c["status"].as_str().unwrap_or("").to_string(),
                        reason: c["reason"].as_str().unwrap_or("").to_string(),
                        ltt: c["lastTransitionTime"]
                            .as_str()
                            .and_then(|t| t.parse().ok()),
                        annotated: m
                            .pointer("/metadata/annotations/cluster.x-k8s.io~1remediate-machine")
                            .is_some(),
                    });
                    let h = history.entry(n.clone()).or_default();
                    if h.last().map(|(_, s)| s) != Some(&now) {
                        h.push((Timestamp::now(), now));
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            history
        });
        Self { stop, task }
    }

    async fn finish(self) -> History {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("monitor")
    }
}

fn describe(h: &[(Timestamp, Option<Seen>)]) -> String {
    h.iter()
        .map(|(_, s)| match s {
            Some(s) => format!(
                "{}/{}{}",
                s.status,
                s.reason,
                if s.annotated { "+annotated" } else { "" }
            ),
            None => "-".into(),
        })
        .collect::<Vec<_>>()
        .join(" → ")
}

// ---------------------------------------------------------------------------------------------
// No secret anywhere.

/// The sentinel secret and `signature=` appear nowhere an operator or attacker could read:
/// the shims' captured stdout/stderr, the namespace's Events (both APIs), the Machines,
/// and the given `/status` and `/metrics` texts (scraped by the test during and after the
/// fault). Also checks that what was searched is not empty.
async fn assert_no_leaks(
    f: &Fixture,
    secret: &str,
    shims: &[&Shim],
    scraped: &[String],
    row: &mut MatrixRow,
) {
    let mut texts: Vec<(String, String)> = Vec::new();
    for s in shims {
        texts.push((format!("log of {}", s.name), s.logs()));
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(f.client.clone(), &f.ns);
    let ev = events.list(&ListParams::default()).await.expect("events");
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(f.client.clone(), &f.ns);
    let cev = core
        .list(&ListParams::default())
        .await
        .expect("core events");
    texts.push((
        "Events".into(),
        serde_json::to_string(&ev.items).unwrap() + &serde_json::to_string(&cev.items).unwrap(),
    ));
    let machines: Api<DynamicObject> =
        Api::namespaced_with(f.client.clone(), &f.ns, &f.resources.machine);
    let ms = machines
        .list(&ListParams::default())
        .await
        .expect("machines");
    texts.push(("Machines".into(), serde_json::to_string(&ms.items).unwrap()));
    for (i, s) in scraped.iter().enumerate() {
        texts.push((format!("scraped /status or /metrics #{i}"), s.clone()));
    }
    let mut bytes = 0;
    for (what, text) in &texts {
        bytes += text.len();
        assert!(
            !text.contains(secret),
            "the sentinel secret key appears in {what} (value not shown)"
        );
        assert!(
            !text.contains("signature="),
            "a request signature appears in {what}"
        );
        assert!(
            !text.contains(SENTINEL_KEY) || what.starts_with("log"),
            "the API key appears in {what}"
        );
    }
    let logs: usize = shims.iter().map(|s| s.logs().len()).sum();
    assert!(
        logs > 0,
        "the shims logged nothing: the log check would be vacuous"
    );
    assert!(
        !ev.items.is_empty() || !cev.items.is_empty(),
        "no Events in the namespace: the Event check would be vacuous"
    );
    assert!(
        !scraped.is_empty(),
        "nothing scraped from /status or /metrics"
    );
    row.saw(format!(
        "no secret/signature= in {bytes} bytes of logs, {} Events, Machines, {} /status+/metrics scrapes",
        ev.items.len() + cev.items.len(),
        scraped.len()
    ));
}

// ---------------------------------------------------------------------------------------------
// The API server, directly: its request counters and a proxy in front of it.

/// `apiserver_request_total` summed over codes for `verb` on Machines (`subresource` "" for
/// the main resource), from the API server's own /metrics.
async fn apiserver_requests(verb: &str, subresource: &str) -> f64 {
    let dir = test_support::apiserver::kubeconfig_path()
        .parent()
        .expect("dir")
        .to_path_buf();
    let token = std::fs::read_to_string(dir.join("token")).expect("token next to the kubeconfig");
    let text = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()
        .expect("client")
        .get(format!("{}/metrics", test_support::apiserver::url()))
        .bearer_auth(token.trim())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("apiserver /metrics")
        .text()
        .await
        .expect("metrics text");
    let want = [
        "group=\"cluster.x-k8s.io\"".to_string(),
        "resource=\"machines\"".to_string(),
        format!("subresource=\"{subresource}\""),
        format!("verb=\"{verb}\""),
    ];
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| want.iter().all(|w| l.contains(w.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A TCP proxy on a fixed loopback port in front of the API server. `cut` closes the
/// listener and every open connection (clients then get "connection refused", as when the
/// kube-apiserver process is gone); `restore` listens again on the same port.
fn upstream_addr() -> String {
    let url = url::Url::parse(&test_support::apiserver::url()).expect("server URL");
    format!(
        "{}:{}",
        url.host_str().expect("host"),
        url.port_or_known_default().expect("port")
    )
}

fn annotate_mode(f: &Fixture) -> bool {
    f.choice.mode == Mode::Annotate
}

async fn fixture(client: Client, secret: &str, vms: &[(&str, &str, &str)]) -> Fixture {
    let sim = simulator_with_keys(
        json!({"stats_interval_seconds": 1, "boot_seconds": 1, "guest_speedup": 60, "guest_boot_seconds": 1.5, "guest_join_seconds": 3}),
        vms,
        1.0,
        SENTINEL_KEY,
        secret,
    )
    .await;
    Fixture::with_simulator_keys(client, sim, SENTINEL_KEY, secret).await
}

const NO_MASS_GUARD: [&str; 4] = [
    "--mass-failure-count",
    "50",
    "--mass-failure-percent",
    "100",
];

// ---------------------------------------------------------------------------------------------
// 1. The API server goes away and comes back.

/// Also requires that the verdicts published before the gap are not flipped when it ends
/// (with src/controller/cycle.rs at 994dd5a this fails: a cycle that cannot read the endpoint
/// Secret dropped the scope with every VM history, so the first poll after the return
/// published a confirmed False/VMError as Unknown and then False with a new
/// lastTransitionTime; the scope retention being added to cycle.rs keeps the histories).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn the_api_server_goes_away_and_comes_back() {
    outage().await;
}

async fn outage() {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let mut row = MatrixRow::new(
        "apiserver_outage",
        "kube-apiserver unreachable for 30 s (proxy cut: connection refused) while the shim binary leads; a VM fails during the gap",
        "the process keeps running; /status reports the problem; no published verdict is lost or flipped (the False and the True Machines unchanged, lastTransitionTimes kept, conditions never missing); after the API server returns the shim resumes writing and the fault injected in the gap is published",
    );
    let secret = sentinel_secret();
    let f = fixture(
        client.clone(),
        &secret,
        &[
            ("vm-pre", "healthy", "Starting"),
            ("vm-gap", "healthy", "Starting"),
            ("vm-ok", "healthy", "Starting"),
        ],
    )
    .await;
    for (m, vm) in [("m-pre", "vm-pre"), ("m-gap", "vm-gap"), ("m-ok", "vm-ok")] {
        f.machine(m, Some(vm), false, "fd1").await;
    }
    let proxy = CutProxy::start(upstream_addr()).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let kubeconfig = proxy.kubeconfig(tmp.path());
    let lease_name = format!("shim-{}", f.ns);
    let identity = format!("shim-outage-{}", &f.ns[4..]);
    let mut shim = Shim::start(
        row.test,
        "shim",
        &kubeconfig,
        &identity,
        &[
            &[
                "--namespace",
                &f.ns,
                "--poll-interval",
                "1s",
                "--stats-interval",
                "1s",
            ][..],
            &[
                "--escalation-delay",
                "10m",
                "--lease-namespace",
                &f.ns,
                "--lease-name",
                &lease_name,
            ],
            &NO_MASS_GUARD,
        ]
        .concat(),
    );
    let mut scraped = Vec::new();

    // Before: leading, m-pre False (its VM failed), the others True.
    for m in ["m-gap", "m-ok", "m-pre"] {
        wait_verdict(&f, m, "True", "VMHealthy", Duration::from_secs(90)).await;
    }
    f.sim.inject_fault("vm-pre", Fault::Error).expect("fault");
    let pre = wait_verdict(&f, "m-pre", "False", "VMError", Duration::from_secs(30)).await;
    let ok_before = seen(&f, "m-ok").await.expect("m-ok");
    let gap_before = seen(&f, "m-gap").await.expect("m-gap");
    shim.assert_running();
    let st = shim.status().await.expect("/status");
    assert_eq!(st["leader"], true, "{st}");
    let monitor = Monitor::start(&f, &["m-pre", "m-gap", "m-ok"]);

    // The gap.
    let cut_at = Timestamp::now();
    let cut_instant = Instant::now();
    proxy.cut();
    row.saw(format!(
        "proxy cut at {cut_at} after {} connections through it",
        proxy.accepted()
    ));
    let mut injected_at = None;
    let mut problem: Option<(f64, String)> = None;
    let mut healthz_ok = 0;
    let mut probes = 0;
    while cut_instant.elapsed() < Duration::from_secs(30) {
        shim.assert_running();
        probes += 1;
        if matches!(shim.get("/healthz").await, Some((200, _))) {
            healthz_ok += 1;
        }
        if injected_at.is_none() && cut_instant.elapsed() >= Duration::from_secs(5) {
            f.sim.inject_fault("vm-gap", Fault::Error).expect("fault");
            injected_at = Some(Timestamp::now());
        }
        if problem.is_none() {
            if let Some(st) = shim.status().await {
                let problems: Vec<String> = st["problems"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|p| p.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                if !problems.is_empty() {
                    problem = Some((secs(cut_instant.elapsed()), problems.join(" | ")));
                    scraped.push(st.to_string());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if let Some(m) = shim.get("/metrics").await {
        scraped.push(m.1);
    }
    let during = shim.status().await.expect("/status during the gap");
    scraped.push(during.to_string());
    // Nothing changed on the Machines meanwhile (the shim could not write; nobody else did).
    assert_eq!(
        seen(&f, "m-gap").await.as_ref(),
        Some(&gap_before),
        "m-gap during the gap"
    );
    proxy.restore();
    let restored_at = Timestamp::now();
    row.saw(format!(
        "gap {:.1} s; process alive throughout; /healthz 200 in {healthz_ok}/{probes} probes",
        between(cut_at, restored_at)
    ));
    let (problem_after, problem_text) =
        problem.expect("/status reported no problem during a 30 s API server outage");
    row.saw(format!(
        "/status problems non-empty {problem_after} s after the cut: {:?}",
        problem_text.chars().take(160).collect::<String>()
    ));
    row.measure("gap_seconds", between(cut_at, restored_at));
    row.measure("status_problem_after_cut_seconds", problem_after);
    row.measure("healthz_ok_probes", healthz_ok);
    row.measure("probes", probes);
    assert_eq!(
        healthz_ok, probes,
        "/healthz failed while the process was up"
    );

    // After: the fault from the gap is published, the shim leads on, problems clear.
    let gap = wait_verdict(&f, "m-gap", "False", "VMError", Duration::from_secs(120)).await;
    let published_at = Timestamp::now();
    let resumed = between(restored_at, published_at);
    row.saw(format!(
        "fault injected {:.1} s into the gap published as False/VMError {resumed} s after the API server returned",
        between(cut_at, injected_at.expect("injected"))
    ));
    row.measure("resume_to_publish_seconds", resumed);
    let st = wait_for!(
        Duration::from_secs(60),
        "problems clear after the return",
        {
            shim.status().await.filter(|s| {
                s["problems"].as_array().is_some_and(|p| p.is_empty()) && s["leader"] == true
            })
        }
    );
    scraped.push(st.to_string());
    let leases: Api<Lease> = Api::namespaced(client.clone(), &f.ns);
    let lease = wait_for!(Duration::from_secs(30), "Lease renewed after the return", {
        let l = leases.get(&lease_name).await.ok()?;
        let spec = l.spec?;
        let renewed: Timestamp = spec.renew_time.as_ref()?.0.to_string().parse().ok()?;
        (spec.holder_identity.as_deref() == Some(identity.as_str()) && renewed > restored_at)
            .then_some(renewed)
    });
    row.saw(format!(
        "still leader, Lease renewed by the same identity {} s after the return; exit status: still running",
        between(restored_at, lease)
    ));
    // Let the monitor see a few more cycles of the resumed shim.
    shim.run_cycles(3, Duration::from_secs(30)).await;
    let history = monitor.finish().await;
    for (m, h) in &history {
        row.saw(format!("{m}: {}", describe(h)));
    }
    // Nothing lost: our condition never vanished; the healthy Machine stayed True with its
    // lastTransitionTime; m-pre is False/VMError at the end.
    for (m, h) in &history {
        assert!(
            h.iter().all(|(_, s)| s.is_some()),
            "{m}: our condition vanished: {}",
            describe(h)
        );
    }
    let ok_now = seen(&f, "m-ok").await.expect("m-ok");
    assert!(
        history["m-ok"]
            .iter()
            .all(|(_, s)| s.as_ref().is_some_and(|s| s.status == "True")),
        "m-ok: {}",
        describe(&history["m-ok"])
    );
    assert_eq!(ok_now.ltt, ok_before.ltt, "m-ok's lastTransitionTime moved");
    let pre_now = seen(&f, "m-pre").await.expect("m-pre");
    assert_eq!(
        (pre_now.status.as_str(), pre_now.reason.as_str()),
        ("False", "VMError")
    );
    // Flipped? (m-pre should have one state; m-gap True → False.)
    // m-gap's one Unknown/VMError ("waiting for a confirming poll") is the designed first
    // sighting of an Error; m-pre and m-ok must never change.
    let unknowns: usize = ["m-pre", "m-ok"]
        .iter()
        .map(|m| {
            history[*m]
                .iter()
                .filter(|(_, s)| s.as_ref().is_some_and(|s| s.status == "Unknown"))
                .count()
        })
        .sum();
    let pre_ltt_moved = pre_now.ltt != pre.ltt;
    row.measure("unknown_publications_after_gap", unknowns as u64);
    row.measure("false_ltt_moved", pre_ltt_moved);
    row.measure(
        "false_ltt_moved_by_seconds",
        match (pre.ltt, pre_now.ltt) {
            (Some(a), Some(b)) => between(a, b),
            _ => 0.0,
        },
    );
    if unknowns > 0 || pre_ltt_moved {
        row.saw(format!(
            "flipped: {unknowns} Unknown publication(s) of m-pre/m-ok after the gap; m-pre's lastTransitionTime {} → {}",
            pre.ltt.map(|t| t.to_string()).unwrap_or_default(),
            pre_now.ltt.map(|t| t.to_string()).unwrap_or_default()
        ));
    }
    {
        assert_eq!(unknowns, 0, "m-pre/m-ok published Unknown");
        assert_eq!(
            history["m-pre"].len(),
            1,
            "m-pre changed: {}",
            describe(&history["m-pre"])
        );
        assert_eq!(
            history["m-ok"].len(),
            1,
            "m-ok changed: {}",
            describe(&history["m-ok"])
        );
        assert_eq!(pre_now.ltt, pre.ltt, "m-pre's lastTransitionTime moved");
        let steps: Vec<String> = history["m-gap"]
            .iter()
            .filter_map(|(_, s)| s.as_ref().map(|s| format!("{}/{}", s.status, s.reason)))
            .collect();
        assert!(
            steps == ["True/VMHealthy", "False/VMError"]
                || steps == ["True/VMHealthy", "Unknown/VMError", "False/VMError"],
            "m-gap: {}",
            describe(&history["m-gap"])
        );
    }
    assert!(
        gap.ltt
            .is_some_and(|t| t >= cut_at - jiff::SignedDuration::from_secs(1)),
        "m-gap's transition predates the gap: {gap:?}"
    );
    if let Some(m) = shim.get("/metrics").await {
        scraped.push(m.1);
    }
    assert_no_leaks(&f, &secret, &[&shim], &scraped, &mut row).await;
    shim.stop().await;
    row.saw("SIGTERM: exit 0");
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 2. The leader is killed during the escalation delay.

async fn wait_leader(s: &Shim, within: Duration) -> Timestamp {
    wait_for!(within, &format!("{} leads", s.name), {
        s.status()
            .await
            .filter(|st| st["leader"] == true)
            .map(|_| Timestamp::now())
    })
}

async fn remediation_events(f: &Fixture, machine: &str) -> (u64, Vec<String>) {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(f.client.clone(), &f.ns);
    let list = events.list(&ListParams::default()).await.expect("events");
    let mut count = 0;
    let mut notes = Vec::new();
    for e in list.items {
        let about = e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(machine);
        if about && e.reason.as_deref() == Some("RemediationRequested") {
            count += e.series.as_ref().map(|s| s.count as u64).unwrap_or(1);
            notes.push(format!(
                "{} by {}",
                e.note.clone().unwrap_or_default(),
                e.reporting_instance.clone().unwrap_or_default()
            ));
        }
    }
    (count, notes)
}

/// The failing VM is Stopped (VMStopped, 2 s grace): its grace is anchored to CloudStack's
/// `lastupdated`, so the new leader's first poll already agrees with the published False.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn the_leader_killed_mid_escalation_hands_over_one_annotation() {
    leader_kill(Fault::Stop).await;
}

/// The same with a VM in Error (VMError needs a confirming poll): the new leader starts without
/// history, and the False its predecessor published must stand for that poll, or it flips the
/// verdict to Unknown and back and restarts the escalation delay at the takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn the_leader_killed_mid_escalation_of_a_vm_error_keeps_the_clock() {
    leader_kill(Fault::Error).await;
}

async fn leader_kill(fault: Fault) {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let (test, reason) = if fault == Fault::Error {
        ("leader_killed_mid_escalation_vm_error", "VMError")
    } else {
        ("leader_killed_mid_escalation", "VMStopped")
    };
    let mut row = MatrixRow::new(
        test,
        if fault == Fault::Error {
            "two shim processes with leader election (Lease 15 s, fixed in run.rs); a VM in Error (False/VMError); the leader is SIGKILLed 8 s into the 40 s escalation delay"
        } else {
            "two shim processes with leader election (Lease 15 s, fixed in run.rs); a VM Stopped (False/VMStopped, 2 s grace); the leader is SIGKILLed 8 s into the 40 s escalation delay"
        },
        "the follower takes over; exactly one remediate-machine annotation on the failing Machine, written once, at lastTransitionTime + 40 s (not takeover + 40 s), lastTransitionTime kept; the healthy Machine is never annotated",
    );
    let secret = sentinel_secret();
    let f = fixture(
        client.clone(),
        &secret,
        &[
            ("vm-bad", "healthy", "Starting"),
            ("vm-ok", "healthy", "Starting"),
        ],
    )
    .await;
    // Annotate mode only: condition mode (CAPI 1.12+) never annotates, so this test has
    // nothing to check there and `make test-rust` does not run it in its capi-1.13 passes
    // (`--skip the_leader_killed_mid_escalation`). Run there by mistake, it fails rather than
    // report a pass it did not earn.
    if !annotate_mode(&f) {
        let why = format!(
            "not applicable under API server profile {}: condition mode (CAPI 1.12+) never \
             annotates; this test needs an annotate-mode profile (capi-1.9)",
            kube_support::profile()
        );
        row.saw(why.clone());
        f.cleanup().await;
        panic!("{why}");
    }
    f.machine("m-bad", Some("vm-bad"), false, "fd1").await;
    f.machine("m-ok", Some("vm-ok"), false, "fd1").await;
    const DELAY: f64 = 40.0;
    let lease_name = format!("shim-{}", f.ns);
    let args = [
        &[
            "--namespace",
            &f.ns,
            "--poll-interval",
            "1s",
            "--stats-interval",
            "1s",
        ][..],
        &[
            "--escalation-delay",
            "40s",
            "--stopped-grace",
            "2s",
            "--lease-namespace",
            &f.ns,
            "--lease-name",
            &lease_name,
        ],
        &NO_MASS_GUARD,
    ]
    .concat();
    let patches_before = apiserver_requests("PATCH", "").await;
    let kubeconfig = test_support::apiserver::kubeconfig_path();
    let mut a = Shim::start(test, "a", &kubeconfig, "shim-a", &args);
    wait_leader(&a, Duration::from_secs(60)).await;
    let mut b = Shim::start(test, "b", &kubeconfig, "shim-b", &args);
    // Ready as a follower, and its /status says where the verdicts are: the Lease's holder.
    wait_for!(
        Duration::from_secs(60),
        "b ready as a follower naming the leader",
        {
            let ready = matches!(b.get("/readyz").await, Some((200, _)));
            b.status()
                .await
                .filter(|st| ready && st["leader"] == false && st["leader_identity"] == "shim-a")
        }
    );
    wait_verdict(&f, "m-bad", "True", "VMHealthy", Duration::from_secs(90)).await;
    wait_verdict(&f, "m-ok", "True", "VMHealthy", Duration::from_secs(30)).await;
    let monitor = Monitor::start(&f, &["m-bad", "m-ok"]);

    f.sim.inject_fault("vm-bad", fault).expect("fault");
    let bad = wait_verdict(&f, "m-bad", "False", reason, Duration::from_secs(30)).await;
    let ltt = bad.ltt.expect("lastTransitionTime");
    // Mid-delay: 8 s after the transition, not annotated, the leader has escalated nothing.
    let kill_at = ltt + jiff::SignedDuration::from_secs(8);
    while Timestamp::now() < kill_at {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !seen(&f, "m-bad").await.expect("m-bad").annotated,
        "annotated before the delay"
    );
    let (_, a_metrics) = a.get("/metrics").await.expect("a /metrics");
    assert_eq!(
        metric(
            &a_metrics,
            "capc_health_escalations_total{result=\"annotated\"}"
        ),
        0.0
    );
    a.assert_running();
    a.signal("KILL");
    let killed_at = Timestamp::now();
    a.wait_exit(Duration::from_secs(10)).await;
    row.saw(format!(
        "m-bad False/{reason}, lastTransitionTime {ltt}; leader a SIGKILLed {} s after it",
        between(ltt, killed_at)
    ));

    let took_over = wait_leader(&b, Duration::from_secs(60)).await;
    row.saw(format!(
        "b leads {} s after the kill ({} s after lastTransitionTime)",
        between(killed_at, took_over),
        between(ltt, took_over)
    ));
    assert!(
        between(ltt, took_over) < DELAY - 5.0,
        "the takeover came too late for this test to tell the clocks apart"
    );
    let annotated_at = wait_for!(Duration::from_secs(DELAY as u64 + 60), "m-bad annotated", {
        seen(&f, "m-bad")
            .await
            .filter(|s| s.annotated)
            .map(|_| Timestamp::now())
    });
    let after_ltt = between(ltt, annotated_at);
    let after_takeover = between(took_over, annotated_at);
    row.saw(format!(
        "annotation {after_ltt} s after lastTransitionTime ({after_takeover} s after the takeover; delay {DELAY} s)"
    ));
    row.measure("takeover_after_kill_seconds", between(killed_at, took_over));
    row.measure("annotation_after_ltt_seconds", after_ltt);
    row.measure("annotation_after_takeover_seconds", after_takeover);
    // Counted from lastTransitionTime (LTT is truncated to the second: ≥ delay − 1).
    assert!(after_ltt >= DELAY - 1.0, "annotated early: {after_ltt} s");
    assert!(
        after_ltt <= DELAY + 12.0,
        "annotated late: {after_ltt} s after LTT"
    );
    assert!(
        after_takeover < DELAY - 5.0,
        "the escalation clock restarted at the takeover ({after_takeover} s)"
    );
    // Let b run a few more cycles: no second write.
    b.run_cycles(3, Duration::from_secs(30)).await;
    let history = monitor.finish().await;
    for (m, h) in &history {
        row.saw(format!("{m}: {}", describe(h)));
    }
    let now_bad = seen(&f, "m-bad").await.expect("m-bad");
    assert!(now_bad.annotated);
    assert_eq!(
        now_bad.ltt,
        Some(ltt),
        "the new leader rewrote lastTransitionTime"
    );
    let ok = seen(&f, "m-ok").await.expect("m-ok");
    assert!(!ok.annotated, "the healthy Machine was annotated");
    assert!(
        history["m-ok"].iter().all(|(_, s)| s
            .as_ref()
            .is_some_and(|s| s.status == "True" && !s.annotated)),
        "m-ok: {}",
        describe(&history["m-ok"])
    );
    let patches = apiserver_requests("PATCH", "").await - patches_before;
    let (events, notes) = remediation_events(&f, "m-bad").await;
    let (_, b_metrics) = b.get("/metrics").await.expect("b /metrics");
    let b_annotated = metric(
        &b_metrics,
        "capc_health_escalations_total{result=\"annotated\"}",
    );
    row.saw(format!(
        "annotation writes: {patches} Machine PATCH requests at the API server (its apiserver_request_total), {events} RemediationRequested Event(s) {notes:?}, b's escalations_total{{annotated}} = {b_annotated}, a's = 0 before the kill"
    ));
    row.measure("machine_patch_requests", patches);
    row.measure("remediation_events", events);
    assert_eq!(patches, 1.0, "annotation PATCH requests on Machines");
    assert_eq!(events, 1, "RemediationRequested Events: {notes:?}");
    assert_eq!(b_annotated, 1.0);
    assert!(notes[0].contains("shim-b"), "{notes:?}");
    let status = b.status().await.expect("b /status");
    assert_eq!(
        status["clusters"][format!("{}/c1", f.ns)]["machines"]["m-bad"]["escalation"],
        "annotated"
    );
    let scraped = vec![a_metrics, b_metrics, status.to_string()];
    assert_no_leaks(&f, &secret, &[&a, &b], &scraped, &mut row).await;
    b.stop().await;
    f.cleanup().await;
}

/// The leader is cut off from the API server (its own proxy) for longer than its Lease, the
/// follower takes over, then the old leader's connection comes back. The Lease library only
/// logs and retries while the API server is away, so the old leader must find out from the
/// Lease itself before it acts again: it exits (code 5) without running another cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_leader_cut_off_past_its_lease_does_not_write_after_its_successor_took_over() {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let test = "leader_partitioned";
    let mut row = MatrixRow::new(
        test,
        "two shims; the leader reaches the API server through a proxy that is cut for longer than the 15 s Lease while the follower (direct) takes over and a VM fails; then the proxy comes back",
        "the follower leads and publishes the fault; the old leader runs no cycle after its connection returns and exits with code 5 (lost Lease)",
    );
    let secret = sentinel_secret();
    let f = fixture(
        client.clone(),
        &secret,
        &[
            ("vm-bad", "healthy", "Starting"),
            ("vm-ok", "healthy", "Starting"),
        ],
    )
    .await;
    f.machine("m-bad", Some("vm-bad"), false, "fd1").await;
    f.machine("m-ok", Some("vm-ok"), false, "fd1").await;
    let lease_name = format!("shim-{}", f.ns);
    let args = [
        &[
            "--namespace",
            &f.ns,
            "--poll-interval",
            "1s",
            "--stats-interval",
            "1s",
            "--stopped-grace",
            "2s",
        ][..],
        &["--lease-namespace", &f.ns, "--lease-name", &lease_name],
        &NO_MASS_GUARD,
    ]
    .concat();
    let proxy = CutProxy::start(upstream_addr()).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let mut a = Shim::start(test, "a", &proxy.kubeconfig(tmp.path()), "shim-a", &args);
    wait_leader(&a, Duration::from_secs(60)).await;
    let mut b = Shim::start(
        test,
        "b",
        &test_support::apiserver::kubeconfig_path(),
        "shim-b",
        &args,
    );
    wait_for!(Duration::from_secs(60), "b ready as a follower", {
        let ready = matches!(b.get("/readyz").await, Some((200, _)));
        b.status().await.filter(|st| ready && st["leader"] == false)
    });
    wait_verdict(&f, "m-ok", "True", "VMHealthy", Duration::from_secs(90)).await;

    proxy.cut();
    let cut_at = Timestamp::now();
    let took_over = wait_leader(&b, Duration::from_secs(60)).await;
    row.saw(format!(
        "b leads {} s after the cut",
        between(cut_at, took_over)
    ));
    f.sim.inject_fault("vm-bad", Fault::Stop).expect("fault");
    wait_verdict(&f, "m-bad", "False", "VMStopped", Duration::from_secs(30)).await;
    a.assert_running();
    let log_before_restore = a.logs().len();
    proxy.restore();
    let restored_at = Timestamp::now();
    let status = a.wait_exit(Duration::from_secs(60)).await;
    let exited_at = Timestamp::now();
    let after = a.logs()[log_before_restore..].to_string();
    let (_, cycles_after) = logged_writes(&after);
    row.saw(format!(
        "a exited {} s after its connection returned ({status}); cycles it ran after that: {cycles_after}",
        between(restored_at, exited_at)
    ));
    row.measure("takeover_after_cut_seconds", between(cut_at, took_over));
    row.measure("old_leader_cycles_after_restore", cycles_after as f64);
    row.measure(
        "old_leader_exit_after_restore_seconds",
        between(restored_at, exited_at),
    );
    assert_eq!(
        status.code(),
        Some(5),
        "exit code: {status}\n{}",
        tail(&after, 20)
    );
    assert_eq!(
        cycles_after,
        0,
        "the old leader ran cycles:\n{}",
        tail(&after, 20)
    );
    // Either the cycle's Lease check or the renewer's watch sees it first (a race of two
    // timers once the connection returns); both stop every write and exit 5.
    assert!(
        after.contains("no longer the leader") || after.contains("lost the leader Lease"),
        "{}",
        tail(&after, 20)
    );
    b.assert_running();
    let (_, b_metrics) = b.get("/metrics").await.expect("b /metrics");
    let b_status = b.status().await.expect("b /status");
    assert_no_leaks(
        &f,
        &secret,
        &[&a, &b],
        &[b_metrics, b_status.to_string()],
        &mut row,
    )
    .await;
    b.stop().await;
    f.cleanup().await;
}

/// Sum of `field: N` over the shim's `cycle done` debug lines in `log` (e.g. `refused_writes`).
fn cycle_field(log: &str, field: &str) -> u64 {
    let key = format!("{field}: ");
    log.lines()
        .filter(|l| l.contains("cycle done"))
        .filter_map(|l| {
            l.split(key.as_str())
                .nth(1)?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Requests the simulator has answered (counted when answered, after any latency).
fn sim_answered(f: &Fixture) -> u64 {
    f.sim.calls()["total"].as_u64().unwrap_or(0)
}

/// events.k8s.io Events in the namespace reported by `instance` (series counted in full).
async fn events_by(f: &Fixture, instance: &str) -> (u64, Vec<String>) {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(f.client.clone(), &f.ns);
    let list = events.list(&ListParams::default()).await.expect("events");
    let mut count = 0;
    let mut what = Vec::new();
    for e in list.items {
        if e.reporting_instance.as_deref() == Some(instance) {
            count += e.series.as_ref().map(|s| s.count as u64).unwrap_or(1);
            what.push(format!(
                "{} about {}",
                e.reason.clone().unwrap_or_default(),
                e.regarding
                    .as_ref()
                    .and_then(|r| r.name.clone())
                    .unwrap_or_default()
            ));
        }
    }
    (count, what)
}

/// The leader's Lease runs out while its cycle is inside a slow CloudStack poll (its API
/// server connection cut past the 15 s Lease, the follower takes over), and its connection is
/// back before the poll returns with a VM in Error: the old leader then has a condition write,
/// its Event, the remediate-machine annotation (`--escalation-delay 0s`) and that Event to
/// send, and must send none of them — the Lease confirmed once per cycle is not enough, every
/// write confirms it — and exit with code 5. The successor publishes the verdict and the one
/// escalation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_lease_lost_mid_cycle_stops_every_write_of_the_old_leader() {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let test = "lease_lost_mid_cycle";
    /// CloudStack latency per request while the leader's cycle is in flight: longer than the
    /// cut + takeover (≤ ~17 s: Lease 15 s, renewed 7 s before it ends) with room to spare.
    const LATENCY: Duration = Duration::from_secs(35);
    let mut row = MatrixRow::new(
        test,
        "two shims with leader election (Lease 15 s); CloudStack slowed to 35 s per request; while the leader's cycle waits for its listing, a VM goes to Error (False at once: --error-confirm-polls 0, --escalation-delay 0s) and the leader's API server connection (a proxy) is cut until the follower (direct) has taken over, then restored before the listing returns",
        "the old leader sends nothing after the takeover — no condition write, no annotation, no Event (its log shows the writes refused: 'not writing', or dropped unsent when the lost Lease stopped the writer first) — and exits with code 5 ('no longer the leader'); the successor publishes False/VMError (its own lastTransitionTime, after the cut) and exactly one remediate-machine escalation (one annotation PATCH, one RemediationRequested Event, by the successor); the healthy Machines stay True",
    );
    let secret = sentinel_secret();
    let f = fixture(
        client.clone(),
        &secret,
        &[
            ("vm-bad", "healthy", "Starting"),
            ("vm-ok1", "healthy", "Starting"),
            ("vm-ok2", "healthy", "Starting"),
        ],
    )
    .await;
    let annotate = annotate_mode(&f);
    for (m, vm) in [
        ("m-bad", "vm-bad"),
        ("m-ok1", "vm-ok1"),
        ("m-ok2", "vm-ok2"),
    ] {
        f.machine(m, Some(vm), false, "fd1").await;
    }
    let lease_name = format!("shim-{}", f.ns);
    let request_timeout = format!("{}s", LATENCY.as_secs() * 3);
    let args = [
        &[
            "--namespace",
            &f.ns,
            "--poll-interval",
            "1s",
            "--stats-interval",
            "1s",
        ][..],
        &[
            "--escalation-delay",
            "0s",
            "--error-confirm-polls",
            "0",
            "--request-timeout",
            &request_timeout,
            // Its listing is meant to take minutes: the point is a cycle in flight.
            "--poll-deadline",
            "10m",
        ],
        &["--lease-namespace", &f.ns, "--lease-name", &lease_name],
        &NO_MASS_GUARD,
    ]
    .concat();
    let patches_before = apiserver_requests("PATCH", "").await;
    let proxy = CutProxy::start(upstream_addr()).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let mut a = Shim::start(test, "a", &proxy.kubeconfig(tmp.path()), "shim-a", &args);
    wait_leader(&a, Duration::from_secs(60)).await;
    let mut b = Shim::start(
        test,
        "b",
        &test_support::apiserver::kubeconfig_path(),
        "shim-b",
        &args,
    );
    wait_for!(Duration::from_secs(60), "b ready as a follower", {
        let ready = matches!(b.get("/readyz").await, Some((200, _)));
        b.status().await.filter(|st| ready && st["leader"] == false)
    });
    for m in ["m-bad", "m-ok1", "m-ok2"] {
        wait_verdict(&f, m, "True", "VMHealthy", Duration::from_secs(90)).await;
    }
    let mut scraped = Vec::new();
    if let Some(st) = a.status().await {
        scraped.push(st.to_string());
    }
    let monitor = Monitor::start(&f, &["m-bad", "m-ok1", "m-ok2"]);

    // Slow CloudStack down and catch a's next cycle inside its listing. The simulator records
    // a request's signature and reads the latency under one lock, so every request recorded
    // after this point waits the full latency (only a polls: b follows).
    let usage_calls = |f: &Fixture| {
        f.sim.calls()["by_command"]["listVirtualMachinesUsageHistory"]
            .as_u64()
            .unwrap_or(0)
    };
    let usage_before = usage_calls(&f);
    f.sim.set_api_faults(ApiFaults {
        latency_ms: LATENCY.as_millis() as u64,
        ..ApiFaults::default()
    });
    let sent_before = f.sim.received_signatures().len();
    assert!(
        sent_before < cloudstack_sim::KEPT_SIGNATURES,
        "the simulator's signature record is full: cannot see a's next request"
    );
    let slowed_at = Instant::now();
    let (in_flight_since, answered_before) = wait_for!(
        Duration::from_secs(15),
        "a sends its next CloudStack request",
        {
            (f.sim.received_signatures().len() > sent_before)
                .then(|| (Instant::now(), sim_answered(&f)))
        }
    );
    // The listing is computed when it is answered: it shows the VM in Error.
    f.sim.inject_fault("vm-bad", Fault::Error).expect("fault");
    a.assert_running();
    // a's Events so far (its first verdicts): any more are writes after the cut.
    let (a_events_before, _) = events_by(&f, "shim-a").await;
    proxy.cut();
    let cut_at = Timestamp::now();
    row.saw(format!(
        "a's cycle in its CloudStack listing {:.1} s after the slow-down; vm-bad in Error; a's proxy cut",
        (in_flight_since - slowed_at).as_secs_f64()
    ));

    let took_over = wait_leader(&b, Duration::from_secs(60)).await;
    let a_log_at_takeover = a.logs().len();
    let takeover = between(cut_at, took_over);
    row.saw(format!("b leads {takeover} s after the cut"));
    row.measure("takeover_after_cut_seconds", takeover);
    // a's listing has not come back (b's first one, sent at the takeover, neither): a's cycle
    // is still in flight, with time to spare for its connection to come back first.
    a.assert_running();
    assert_eq!(
        sim_answered(&f),
        answered_before,
        "a CloudStack request was answered before the restore: a's cycle is no longer in flight"
    );
    let in_flight = in_flight_since.elapsed();
    assert!(
        in_flight + Duration::from_secs(5) < LATENCY,
        "the takeover took too long ({in_flight:?} into a's {LATENCY:?} listing) to restore a's connection before its cycle acts"
    );
    proxy.restore();
    let restored_at = Timestamp::now();
    f.sim.set_api_faults(ApiFaults::default());
    row.saw(format!(
        "a's proxy restored and the latency removed {} s after the takeover, {:.1} s into a's listing",
        between(took_over, restored_at),
        in_flight.as_secs_f64()
    ));
    row.measure(
        "old_leader_listing_in_flight_at_restore_seconds",
        secs(in_flight),
    );
    if let Some((_, m)) = a.get("/metrics").await {
        scraped.push(m);
    }

    // a's listing returns; a must refuse every write and exit.
    let status = a.wait_exit(LATENCY + Duration::from_secs(60)).await;
    let exited_at = Timestamp::now();
    let a_code = status.code();
    let after = a.logs()[a_log_at_takeover..].to_string();
    let conditions_written = after.matches("condition written").count() as u64;
    let annotated = after
        .matches("escalated: remediate-machine annotation set")
        .count() as u64;
    // The writer task logs each write as it is sent ("condition written", the escalation); a
    // cycle's `condition_writes` counts the outcomes it took in, which can be writes sent before
    // the takeover, so the cycle summaries are not the record of when a write went out.
    let (cycle_writes, cycles_after) = logged_writes(&after);
    let refused = cycle_field(&after, "refused_writes");
    let refusals_logged = after.lines().filter(|l| l.contains("not writing")).count() as u64;
    let (a_events_now, a_event_list) = events_by(&f, "shim-a").await;
    let a_events = a_events_now.saturating_sub(a_events_before);
    let a_writes = conditions_written + annotated + a_events;
    row.saw(format!(
        "a exited {} s after its connection returned, {} s after the takeover ({status}); after the takeover it logged {conditions_written} 'condition written', {annotated} annotations, {cycles_after} cycle(s) taking in {cycle_writes} finished condition write(s) and {refused} refused write(s), {refusals_logged} 'not writing' warning(s); Events by shim-a since the cut: {a_events} (all of them: {a_event_list:?})",
        between(restored_at, exited_at),
        between(took_over, exited_at)
    ));
    row.measure("old_leader_writes_after_takeover", a_writes);
    row.measure("old_leader_refused_writes", refused.max(refusals_logged));
    row.measure(
        "old_leader_exit_code",
        a_code.map(Value::from).unwrap_or(Value::Null),
    );
    row.measure(
        "old_leader_exit_after_restore_seconds",
        between(restored_at, exited_at),
    );
    assert_eq!(
        a_writes,
        0,
        "the old leader wrote after its successor took over ({a_events} Events since the cut; all of a's: {a_event_list:?}):\n{}",
        tail(&after, 30)
    );
    assert_eq!(a_code, Some(5), "exit code: {status}\n{}", tail(&after, 30));
    assert!(
        after.contains("no longer the leader"),
        "{}",
        tail(&after, 30)
    );
    // Not vacuous: the cycle in flight reached its writes and had them refused by the Lease
    // gate, or — when the lost Lease stopped the writer first — dropped unsent at shutdown.
    // Either line says so: the writer's own for each job it drained, or — when it was
    // aborted with jobs left (a lost Lease waits for nothing) — run's summary with cut_off > 0.
    let stopped_unsent = after.lines().any(|l| {
        (l.contains("queued write not sent") && l.contains("outcome=\"shutdown\""))
            || (l.contains("stopping with writes not sent")
                && !l.contains("cut_off=0")
                && l.contains("cut_off="))
    });
    row.measure("old_leader_writes_dropped_at_shutdown", stopped_unsent);
    assert!(
        after.contains("not writing") || stopped_unsent,
        "a exited without a refused or dropped write: its cycle in flight did not get to the act phase with the verdict to publish (usage-history calls during the test: {}):\n{}",
        usage_calls(&f) - usage_before,
        tail(&after, 30)
    );

    // The successor publishes the verdict and escalates once.
    let bad = wait_verdict(
        &f,
        "m-bad",
        "False",
        "VMError",
        LATENCY + Duration::from_secs(60),
    )
    .await;
    let published_at = Timestamp::now();
    row.saw(format!(
        "m-bad False/VMError on the Machine {} s after the takeover, lastTransitionTime {}",
        between(took_over, published_at),
        bad.ltt.map(|t| t.to_string()).unwrap_or_default()
    ));
    if annotate {
        wait_for!(Duration::from_secs(60), "m-bad annotated", {
            seen(&f, "m-bad").await.filter(|s| s.annotated)
        });
    }
    // A few more cycles of b: no second escalation.
    b.run_cycles(3, Duration::from_secs(30)).await;
    let history = monitor.finish().await;
    for (m, h) in &history {
        row.saw(format!("{m}: {}", describe(h)));
    }
    let (escalations, notes) = remediation_events(&f, "m-bad").await;
    let patches = apiserver_requests("PATCH", "").await - patches_before;
    let (_, b_metrics) = b.get("/metrics").await.expect("b /metrics");
    let b_annotated = metric(
        &b_metrics,
        "capc_health_escalations_total{result=\"annotated\"}",
    );
    row.saw(format!(
        "escalations of m-bad: {escalations} RemediationRequested Event(s) {notes:?}, {patches} Machine PATCH request(s) at the API server, b's escalations_total{{annotated}} = {b_annotated}"
    ));
    row.measure("escalations_total", escalations);
    row.measure("machine_patch_requests", patches);
    let now_bad = seen(&f, "m-bad").await.expect("m-bad");
    assert_eq!(
        (now_bad.status.as_str(), now_bad.annotated),
        ("False", annotate),
        "m-bad at the end: {}",
        describe(&history["m-bad"])
    );
    // Written by b: a's verdict would carry a's cycle start (before the cut) as its
    // lastTransitionTime.
    assert!(
        now_bad.ltt.is_some_and(|t| t > cut_at),
        "m-bad's False predates the cut (a's write?): {now_bad:?}"
    );
    let expected = u64::from(annotate);
    assert_eq!(
        escalations, expected,
        "RemediationRequested Events: {notes:?}"
    );
    assert_eq!(
        patches, expected as f64,
        "annotation PATCH requests on Machines"
    );
    assert_eq!(b_annotated, expected as f64, "b's escalations");
    if annotate {
        assert!(notes[0].contains("shim-b"), "{notes:?}");
    }
    for m in ["m-ok1", "m-ok2"] {
        assert!(
            history[m].iter().all(|(_, s)| s
                .as_ref()
                .is_some_and(|s| s.status == "True" && !s.annotated)),
            "{m}: {}",
            describe(&history[m])
        );
    }
    let b_status = b.status().await.expect("b /status");
    scraped.push(b_metrics);
    scraped.push(b_status.to_string());
    assert_no_leaks(&f, &secret, &[&a, &b], &scraped, &mut row).await;
    b.stop().await;
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 3. The shim is killed and restarted mid-grace and mid-escalation-delay.

/// The Machine mid escalation-delay is False because its VM is Stopped too (stopped 25 s
/// before the other one, so it is False when the shim dies).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_restarted_shim_keeps_its_clocks() {
    restart(Fault::Stop).await;
}

/// The same with the Machine mid escalation-delay False/VMError: the restarted shim must keep
/// the confirmed verdict and its lastTransitionTime, so the annotation comes at transition +
/// delay, not at restart + delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_restarted_shim_keeps_the_clock_of_a_vm_error() {
    restart(Fault::Error).await;
}

async fn restart(esc_fault: Fault) {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let (test, esc_reason) = if esc_fault == Fault::Error {
        ("shim_restart_mid_grace_vm_error", "VMError")
    } else {
        ("shim_restart_mid_grace", "VMStopped")
    };
    let mut row = MatrixRow::new(
        test,
        if esc_fault == Fault::Error {
            "the shim is SIGKILLed 10 s into a 30 s VMStopped grace (m-stop) and 8 s into the 30 s escalation delay of a False/VMError Machine (m-esc), started again 6 s later (same pod identity)"
        } else {
            "the shim is SIGKILLed ≈14 s into a 30 s VMStopped grace (m-stop) and 8 s into the 30 s escalation delay of a False/VMStopped Machine (m-esc), started again 6 s later (same pod identity)"
        },
        "m-stop False at stop + 30 s (not at restart, not restart + 30 s); m-esc annotated at lastTransitionTime + 30 s (not at restart, not restart + 30 s; annotate mode — condition mode: never annotated), its lastTransitionTime kept and never un-False",
    );
    let secret = sentinel_secret();
    let f = fixture(
        client.clone(),
        &secret,
        &[
            ("vm-stop", "healthy", "Starting"),
            ("vm-esc", "healthy", "Starting"),
            ("vm-ok", "healthy", "Starting"),
        ],
    )
    .await;
    let annotate = annotate_mode(&f);
    for (m, vm) in [
        ("m-stop", "vm-stop"),
        ("m-esc", "vm-esc"),
        ("m-ok", "vm-ok"),
    ] {
        f.machine(m, Some(vm), false, "fd1").await;
    }
    const GRACE: f64 = 30.0;
    const DELAY: f64 = 30.0;
    let lease_name = format!("shim-{}", f.ns);
    let args = [
        &[
            "--namespace",
            &f.ns,
            "--poll-interval",
            "1s",
            "--stats-interval",
            "1s",
        ][..],
        &["--stopped-grace", "30s", "--escalation-delay", "30s"],
        &["--lease-namespace", &f.ns, "--lease-name", &lease_name],
        &NO_MASS_GUARD,
    ]
    .concat();
    let kubeconfig = test_support::apiserver::kubeconfig_path();
    let mut s1 = Shim::start(test, "shim", &kubeconfig, "shim-restart", &args);
    for m in ["m-stop", "m-esc", "m-ok"] {
        wait_verdict(&f, m, "True", "VMHealthy", Duration::from_secs(90)).await;
    }
    let monitor = Monitor::start(&f, &["m-stop", "m-esc", "m-ok"]);
    let esc_at = Timestamp::now();
    f.sim.inject_fault("vm-esc", esc_fault).expect("fault");
    if esc_fault == Fault::Stop {
        // m-esc becomes False at esc_at + 30 s; stop the other VM so that its grace is
        // under way when m-esc is mid-delay.
        while Timestamp::now() < esc_at + jiff::SignedDuration::from_secs(25) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    f.sim.inject_fault("vm-stop", Fault::Stop).expect("fault");
    let stopped_at = Timestamp::now();
    let err = wait_verdict(&f, "m-esc", "False", esc_reason, Duration::from_secs(60)).await;
    let ltt = err.ltt.expect("lastTransitionTime");
    // s1 has seen the VM Stopped (so its grace clock was running) before it dies.
    let key = format!("{}/c1", f.ns);
    let st1 = wait_for!(Duration::from_secs(30), "s1 sees vm-stop Stopped", {
        s1.status()
            .await
            .filter(|st| st["clusters"][&key]["machines"]["m-stop"]["vm_state"] == "Stopped")
    });
    let during_grace = st1["clusters"][&key]["machines"]["m-stop"].clone();
    let kill_at = (stopped_at + jiff::SignedDuration::from_secs(10))
        .max(ltt + jiff::SignedDuration::from_secs(8));
    while Timestamp::now() < kill_at {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m_stop = seen(&f, "m-stop").await.expect("m-stop");
    assert_ne!(m_stop.status, "False", "VMStopped False before its grace");
    assert!(
        !seen(&f, "m-esc").await.expect("m-esc").annotated,
        "annotated before the delay"
    );
    let mut scraped = vec![st1.to_string()];
    if let Some(m) = s1.get("/metrics").await {
        scraped.push(m.1);
    }
    s1.assert_running();
    s1.signal("KILL");
    let killed_at = Timestamp::now();
    s1.wait_exit(Duration::from_secs(10)).await;
    row.saw(format!(
        "vm-stop stopped at {stopped_at}; m-stop published {}/{} during the grace (s1's report: verdict {}, reason {}); m-esc False since {ltt}; s1 SIGKILLed {} s into the grace, {} s into the delay",
        m_stop.status,
        m_stop.reason,
        during_grace["verdict"],
        during_grace["reason"],
        between(stopped_at, killed_at),
        between(ltt, killed_at)
    ));
    while Timestamp::now() < killed_at + jiff::SignedDuration::from_secs(6) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s2 = Shim::start(test, "shim-restarted", &kubeconfig, "shim-restart", &args);
    let restarted_at = Timestamp::now();
    row.saw(format!(
        "restarted {} s after the stop, {} s after m-esc's transition",
        between(stopped_at, restarted_at),
        between(ltt, restarted_at)
    ));

    // The stopped VM: False at stop + grace.
    let stop_false = wait_verdict(
        &f,
        "m-stop",
        "False",
        "VMStopped",
        Duration::from_secs(GRACE as u64 + 60),
    )
    .await;
    let stop_false_at = Timestamp::now();
    let after_stop = between(stopped_at, stop_false_at);
    let after_restart = between(restarted_at, stop_false_at);
    row.saw(format!(
        "m-stop False/VMStopped {after_stop} s after the stop ({after_restart} s after the restart; grace {GRACE} s)"
    ));
    row.measure("stopped_false_after_stop_seconds", after_stop);
    row.measure("stopped_false_after_restart_seconds", after_restart);

    // The False Machine: annotated at LTT + delay.
    let mut annotation = None;
    if annotate {
        let at = wait_for!(Duration::from_secs(DELAY as u64 + 60), "m-esc annotated", {
            seen(&f, "m-esc")
                .await
                .filter(|s| s.annotated)
                .map(|_| Timestamp::now())
        });
        let a_ltt = between(ltt, at);
        let a_restart = between(restarted_at, at);
        row.saw(format!(
            "m-esc annotated {a_ltt} s after lastTransitionTime ({a_restart} s after the restart; delay {DELAY} s)"
        ));
        row.measure("annotation_after_ltt_seconds", a_ltt);
        row.measure("annotation_after_restart_seconds", a_restart);
        annotation = Some((a_ltt, a_restart));
    } else {
        // Condition mode: no annotation to time; the verdict and its lastTransitionTime are
        // checked below as in annotate mode, and m-esc must never be annotated.
        row.saw("condition mode: no annotation timing to check; m-esc must stay unannotated");
    }
    let history = monitor.finish().await;
    for (m, h) in &history {
        row.saw(format!("{m}: {}", describe(h)));
    }
    if !annotate {
        assert!(
            history["m-esc"]
                .iter()
                .all(|(_, s)| s.as_ref().is_none_or(|s| !s.annotated)),
            "condition mode annotated m-esc: {}",
            describe(&history["m-esc"])
        );
    }
    // Grace anchored to the stop, not reset by the restart, not skipped.
    assert!(
        after_stop >= GRACE - 1.0,
        "VMStopped False early: {after_stop} s after the stop"
    );
    assert!(
        after_stop <= GRACE + 10.0,
        "VMStopped False late: {after_stop} s after the stop"
    );
    assert!(
        after_restart >= 5.0,
        "VMStopped False at once after the restart ({after_restart} s)"
    );
    assert!(
        after_restart < GRACE - 5.0,
        "the grace started over at the restart ({after_restart} s)"
    );
    assert!(stop_false.ltt.is_some_and(|t| t >= stopped_at));
    if let Some((a_ltt, a_restart)) = annotation {
        assert!(a_ltt >= DELAY - 1.0, "annotated early: {a_ltt} s");
        assert!(a_ltt <= DELAY + 10.0, "annotated late: {a_ltt} s after LTT");
        assert!(
            a_restart >= 5.0,
            "annotated at once after the restart ({a_restart} s)"
        );
        assert!(
            a_restart < DELAY - 5.0,
            "the escalation delay started over at the restart ({a_restart} s)"
        );
    }
    assert_eq!(
        seen(&f, "m-esc").await.expect("m-esc").ltt,
        Some(ltt),
        "lastTransitionTime changed across the restart"
    );
    let h = &history["m-esc"];
    let first_false = h
        .iter()
        .position(|(_, s)| s.as_ref().is_some_and(|s| s.status == "False"))
        .expect("m-esc was False");
    assert!(
        h[first_false..]
            .iter()
            .all(|(_, s)| s.as_ref().is_some_and(|s| s.status == "False")),
        "m-esc left False across the restart: {}",
        describe(h)
    );
    let ok = seen(&f, "m-ok").await.expect("m-ok");
    assert_eq!((ok.status.as_str(), ok.annotated), ("True", false));
    let mut s2 = s2;
    if let Some(st) = s2.status().await {
        scraped.push(st.to_string());
    }
    if let Some(m) = s2.get("/metrics").await {
        scraped.push(m.1);
    }
    assert_no_leaks(&f, &secret, &[&s1, &s2], &scraped, &mut row).await;
    s2.stop().await;
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 3b. A CloudStackMachine deleted while no shim runs: the orphan report's memory.

/// The ConfigMap memory of the orphan report (issue 29): the shim is SIGKILLed after it has
/// seen m-gone; while no shim runs, m-gone's CloudStackMachine is let go by hand (deleted
/// without CAPC destroying its VM) with its Machine. A shim started with an empty memory (a
/// ConfigMap of another name: the control) reports nothing; the shim started with its own
/// memory reports the VM. Both run with the same pod identity, one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_machine_deleted_while_the_shim_was_down_still_has_its_vm_reported() {
    use capc_health_shim::orphans::memory::decode;
    use k8s_openapi::api::core::v1::ConfigMap;

    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let test = "shim_restart_orphan_memory";
    let mut row = MatrixRow::new(
        test,
        "the shim is SIGKILLed after it has seen m-gone; while no shim runs, m-gone's CloudStackMachine is deleted without CAPC destroying its VM (a finalizer removed by hand), and its Machine; then a shim with an empty memory (control), then the shim with its own",
        "control: no orphan after --orphan-grace + 3 polls; restarted: 2 CloudStackMachines taken back from the ConfigMap, vm-gone reported instance-of-deleted within --orphan-grace + 3 polls of its start",
    );
    let secret = sentinel_secret();
    let f = fixture(
        client.clone(),
        &secret,
        &[
            ("vm-keep", "healthy", "Starting"),
            ("vm-gone", "healthy", "Starting"),
        ],
    )
    .await;
    for (m, vm) in [("m-keep", "vm-keep"), ("m-gone", "vm-gone")] {
        f.machine(m, Some(vm), false, "fd1").await;
    }
    const GRACE: f64 = 5.0;
    const POLL: f64 = 1.0;
    let lease_name = format!("shim-{}", f.ns);
    let args = |memory: &str| -> Vec<String> {
        [
            &[
                "--namespace",
                &f.ns,
                "--poll-interval",
                "1s",
                "--stats-interval",
                "1s",
                "--orphan-grace",
                "5s",
            ][..],
            &["--lease-namespace", &f.ns, "--lease-name", &lease_name],
            &["--orphan-memory-configmap", memory],
            &NO_MASS_GUARD,
        ]
        .concat()
        .into_iter()
        .map(str::to_string)
        .collect()
    };
    let start = |name: &str, memory: &str| {
        let a = args(memory);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        Shim::start(
            test,
            name,
            &test_support::apiserver::kubeconfig_path(),
            "shim-memory",
            &a,
        )
    };
    let mut s1 = start("shim", "capc-health-shim-memory");
    for m in ["m-keep", "m-gone"] {
        wait_verdict(&f, m, "True", "VMHealthy", Duration::from_secs(90)).await;
    }
    let gone_id = f.vm_ids["vm-gone"].to_ascii_lowercase();
    let configmaps: Api<ConfigMap> = Api::namespaced(f.client.clone(), &f.ns);
    let stored = wait_for!(
        Duration::from_secs(90),
        "s1 stores m-gone's CloudStackMachine in its memory",
        {
            configmaps
                .get_opt("capc-health-shim-memory")
                .await
                .ok()
                .flatten()
                .and_then(|cm| cm.binary_data)
                .and_then(|d| {
                    d.get(capc_health_shim::controller::memory::DATA_KEY)
                        .cloned()
                })
                .and_then(|b| decode(&b.0).ok())
                .filter(|m| {
                    m.machines.iter().any(|e| {
                        e.name == "m-gone-csm" && e.instance_id.as_deref() == Some(gone_id.as_str())
                    })
                })
        }
    );
    row.saw(format!(
        "s1 stored {} CloudStackMachines in ConfigMap capc-health-shim-memory",
        stored.machines.len()
    ));
    s1.signal("KILL");
    s1.wait_exit(Duration::from_secs(10)).await;
    // While no shim runs: the finalizer is gone (the fixture's CloudStackMachines carry none,
    // as after `kubectl patch … finalizers: null`), so the deletion does not destroy the VM.
    for (r, name) in [
        (&f.resources.cloudstack_machine, "m-gone-csm"),
        (&f.resources.machine, "m-gone"),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(f.client.clone(), &f.ns, r);
        api.delete(name, &Default::default()).await.expect("delete");
    }
    let mut scraped = Vec::new();

    // The control: a shim with an empty memory, for the grace and three polls past its first
    // cycle as leader.
    let mut control = start("control", "capc-health-shim-control-memory");
    let control_start = Timestamp::now();
    let first = wait_for!(Duration::from_secs(60), "the control leads and cycles", {
        control
            .status()
            .await
            .filter(|st| st["leader"] == true && !st["generated_at"].is_null())
            .and_then(|st| st["generated_at"].as_str()?.parse::<Timestamp>().ok())
    });
    let control_status = wait_for!(
        Duration::from_secs(60),
        "the control runs past the grace",
        {
            control.status().await.filter(|st| {
                st["generated_at"]
                    .as_str()
                    .and_then(|t| t.parse::<Timestamp>().ok())
                    .is_some_and(|t| between(first, t) >= GRACE + 3.0 * POLL)
            })
        }
    );
    let control_orphans = control_status["orphans"].as_array().map_or(0, Vec::len);
    row.saw(format!(
        "control (empty memory): {control_orphans} orphan(s) {} s after its start",
        between(control_start, Timestamp::now())
    ));
    row.measure("control_orphans", control_orphans as u64);
    scraped.push(control_status.to_string());
    control.stop().await;
    assert_eq!(
        control_orphans, 0,
        "a shim without the memory cannot know m-gone-csm: {control_status}"
    );

    let mut s2 = start("shim", "capc-health-shim-memory");
    let restarted_at = Timestamp::now();
    let reported = wait_for!(
        Duration::from_secs(60),
        "the restarted shim reports vm-gone",
        {
            s2.status().await.filter(|st| {
                st["orphans"].as_array().is_some_and(|o| {
                    o.iter().any(|o| {
                        o["vm_id"] == gone_id.as_str()
                            && o["kind"] == "instance-of-deleted"
                            && !o["reported_at"].is_null()
                    })
                })
            })
        }
    );
    let after = between(restarted_at, Timestamp::now());
    let restored = reported["orphan_detection"]["memory"]["restored"]
        .as_u64()
        .unwrap_or(0);
    row.saw(format!(
        "restarted shim: {restored} CloudStackMachines taken back; vm-gone reported {after} s after its start"
    ));
    row.measure("restored_machines", restored);
    row.measure("reported_after_restart_seconds", after);
    assert_eq!(restored, 2, "{}", reported["orphan_detection"]);
    assert_eq!(reported["orphans"].as_array().map(Vec::len), Some(1));
    assert!(
        after <= GRACE + 3.0 * POLL + 15.0,
        "reported {after} s after the restart"
    );
    scraped.push(reported.to_string());
    if let Some(m) = s2.get("/metrics").await {
        scraped.push(m.1);
    }
    assert_no_leaks(&f, &secret, &[&s1, &control, &s2], &scraped, &mut row).await;
    s2.stop().await;
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 4. A flood of concurrent status writers.

fn tick_time(tick: u64) -> String {
    jiff::Timestamp::from_second(1_700_000_000 + tick as i64)
        .expect("timestamp")
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[derive(Debug, Default, Clone)]
struct WriterOutcome {
    writes: u64,
    conflicts: u64,
    last_tick: u64,
    /// Successful writes that removed the shim's condition (droppers only).
    dropped_ours: u64,
    /// 100 ms waits for the shim to rewrite its condition before a drop (droppers only).
    waits_for_rewrite: u64,
}

/// CAPI's patch helper: GET latest → change own conditions (or, for a dropper, remove the
/// shim's) → JSON merge patch of the status conditions with `metadata.resourceVersion`
/// (optimistic lock); on 409 start over. Every `period` until `stop`.
#[allow(clippy::too_many_arguments)]
async fn writer(
    api: Api<DynamicObject>,
    name: String,
    pointer: &'static str,
    own_type: String,
    dropper: bool,
    period: Duration,
    start_after: Duration,
    stop: Arc<AtomicBool>,
) -> WriterOutcome {
    let params = PatchParams {
        field_manager: Some(format!("capi-flood-{own_type}")),
        ..Default::default()
    };
    let mut out = WriterOutcome::default();
    let mut tick = 0;
    tokio::time::sleep(start_after).await;
    while !stop.load(Ordering::SeqCst) {
        tick += 1;
        loop {
            let latest =
                serde_json::to_value(api.get(&name).await.expect("writer GET")).expect("json");
            let rv = latest["metadata"]["resourceVersion"].clone();
            let mut list: Vec<Value> = latest
                .pointer(pointer)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if dropper {
                let before = list.len();
                list.retain(|c| c["type"] != "CloudStackVMHealthy");
                if list.len() == before {
                    // Nothing to drop yet (the other dropper just did, and the shim has not
                    // rewritten it): wait for the shim's rewrite instead of skipping the tick.
                    // Skipping kept the two droppers in lockstep and one never wrote at all
                    // (CI, 2026-12-06: FloodWriter1 missing at the end).
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    out.waits_for_rewrite += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
            let entry = json!({"type": own_type, "status": "True", "reason": "Tick",
                "message": format!("tick {tick}"), "lastTransitionTime": tick_time(tick)});
            match list.iter_mut().find(|c| c["type"] == own_type.as_str()) {
                Some(c) => *c = entry,
                None => list.push(entry),
            }
            let status = if pointer == "/status/v1beta2/conditions" {
                json!({"v1beta2": {"conditions": list}})
            } else {
                json!({"conditions": list})
            };
            let patch = json!({"metadata": {"resourceVersion": rv}, "status": status});
            match api
                .patch_status(&name, &params, &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    out.writes += 1;
                    out.last_tick = tick;
                    if dropper {
                        out.dropped_ours += 1;
                    }
                    break;
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    out.conflicts += 1;
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                }
                Err(e) => panic!("writer patch failed: {e}"),
            }
        }
        tokio::time::sleep(period).await;
    }
    out
}

/// `condition_writes` summed over the shim's `cycle done` debug lines, and the cycles.
fn logged_writes(log: &str) -> (u64, u64) {
    let mut writes = 0;
    let mut cycles = 0;
    for l in log.lines().filter(|l| l.contains("cycle done")) {
        cycles += 1;
        if let Some(rest) = l.split("condition_writes: ").nth(1) {
            writes += rest
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    (writes, cycles)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_flood_of_conflicting_status_writers() {
    flood(0).await;
}

/// The same flood where 2 of the 8 writers also drop the shim's condition (a writer working
/// from a copy without it): the shim must put it back. (It once trusted its own record of its
/// last write over every later version of the Machine and never did.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_dropped_shim_condition_is_rewritten_during_a_writer_flood() {
    flood(2).await;
}

async fn flood(droppers: usize) {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    const N: usize = 8;
    let (test, fault, expected) = if droppers == 0 {
        (
            "status_writer_flood",
            "8 concurrent writers patch the Machine's status conditions like CAPI's patch helper (GET, change own condition, merge patch with resourceVersion, retry on 409) every 50 ms for 20 s while the binary runs; the VM fails mid-flood",
            "the shim's condition stays on the Machine and reaches the right verdict; every writer's own condition is preserved (its last tick); the shim's status writes stay bounded (one per verdict change, counted at the API server), none after the flood",
        )
    } else {
        (
            "status_writer_flood_dropping",
            "the same 8-writer flood, 2 of the writers also removing the shim's condition (optimistic lock, every 2 s)",
            "the shim rewrites its condition after each drop within a few cycles (never missing > 6 s); writes ≈ drops + transitions; others' conditions preserved; no hot loop",
        )
    };
    let mut row = MatrixRow::new(test, fault, expected);
    let secret = sentinel_secret();
    let f = fixture(
        client.clone(),
        &secret,
        &[
            ("vm-f", "healthy", "Starting"),
            ("vm-quiet", "healthy", "Starting"),
        ],
    )
    .await;
    f.machine("m-f", Some("vm-f"), false, "fd1").await;
    f.machine("m-quiet", Some("vm-quiet"), false, "fd1").await;
    let args = [
        &[
            "--namespace",
            &f.ns,
            "--poll-interval",
            "1s",
            "--stats-interval",
            "1s",
        ][..],
        &["--escalation-delay", "10m", "--no-leader-election"],
        &NO_MASS_GUARD,
    ]
    .concat();
    let applies_before = apiserver_requests("APPLY", "status").await;
    let mut shim = Shim::start(
        test,
        "shim",
        &test_support::apiserver::kubeconfig_path(),
        "shim-flood",
        &args,
    );
    wait_verdict(&f, "m-f", "True", "VMHealthy", Duration::from_secs(90)).await;
    wait_verdict(&f, "m-quiet", "True", "VMHealthy", Duration::from_secs(30)).await;
    let applies_start = apiserver_requests("APPLY", "status").await;
    let (writes_start, cycles_start) = logged_writes(&shim.logs());

    let stop = Arc::new(AtomicBool::new(false));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &f.ns, &f.resources.machine);
    let mut tasks = Vec::new();
    for i in 0..N {
        let dropper = i < droppers;
        tasks.push(tokio::spawn(writer(
            api.clone(),
            "m-f".into(),
            f.conditions_pointer(),
            format!("FloodWriter{i}"),
            dropper,
            if dropper {
                Duration::from_secs(2)
            } else {
                Duration::from_millis(50)
            },
            // Droppers staggered over their period: in lockstep the second always found the
            // shim's condition already dropped by the first, never wrote, and its own condition
            // was missing at the end (seen once under load).
            if dropper {
                Duration::from_secs(2) * i as u32 / droppers as u32
            } else {
                Duration::ZERO
            },
            stop.clone(),
        )));
    }
    // Watch our condition during the flood: how long it stays missing after each drop.
    let flood = Instant::now();
    let mut injected = false;
    let mut missing_since: Option<Instant> = None;
    let mut longest_missing = Duration::ZERO;
    let mut missing_now = false;
    let mut samples = 0u64;
    let mut missing_samples = 0u64;
    while flood.elapsed() < Duration::from_secs(20) {
        shim.assert_running();
        if !injected && flood.elapsed() >= Duration::from_secs(8) {
            f.sim.inject_fault("vm-f", Fault::Error).expect("fault");
            injected = true;
        }
        let m = get(&client, &f.ns, &f.resources.machine, "m-f").await;
        let ours = kube_support::condition(&m, f.conditions_pointer()).is_some();
        samples += 1;
        if ours {
            if let Some(since) = missing_since.take() {
                longest_missing = longest_missing.max(since.elapsed());
            }
            missing_now = false;
        } else {
            missing_samples += 1;
            missing_since.get_or_insert_with(Instant::now);
            missing_now = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.expect("writer task"));
    }
    let flood_secs = secs(flood.elapsed());
    if let Some(since) = missing_since {
        longest_missing = longest_missing.max(since.elapsed());
    }
    let total_writes: u64 = outcomes.iter().map(|o| o.writes).sum();
    let conflicts: u64 = outcomes.iter().map(|o| o.conflicts).sum();
    let drops: u64 = outcomes.iter().map(|o| o.dropped_ours).sum();
    let applies_flood = apiserver_requests("APPLY", "status").await - applies_start;
    let (writes_end, cycles_end) = logged_writes(&shim.logs());
    let shim_writes = writes_end - writes_start;
    let shim_cycles = cycles_end - cycles_start;
    row.saw(format!(
        "{flood_secs} s flood: writers {total_writes} status writes, {conflicts} 409s retried; {drops} drops of the shim's condition; shim {shim_cycles} cycles, {shim_writes} condition writes (its log), {applies_flood} status APPLY requests at the API server"
    ));
    row.saw(format!(
        "shim's condition missing in {missing_samples}/{samples} samples (every 100 ms), longest gap {:.1} s, missing at the end of the flood: {missing_now}",
        longest_missing.as_secs_f64()
    ));
    row.measure("writer_writes", total_writes);
    row.measure("writer_conflicts", conflicts);
    row.measure("drops_of_shim_condition", drops);
    row.measure("shim_cycles", shim_cycles);
    row.measure("shim_condition_writes_logged", shim_writes);
    row.measure("shim_status_apply_requests", applies_flood);
    row.measure(
        "shim_condition_missing_longest_seconds",
        secs(longest_missing),
    );
    assert!(injected);
    assert!(
        total_writes >= 40,
        "the flood should mostly succeed: {outcomes:?}"
    );
    // Each drop must be answered: the condition never stays missing for long.
    assert!(
        longest_missing < Duration::from_secs(6),
        "the shim's condition stayed missing {longest_missing:?} after a drop (not rewritten; missing at the end: {missing_now})"
    );
    assert!(
        droppers == 0 || drops >= 3,
        "the droppers dropped too rarely to test anything: {outcomes:?}"
    );
    for (i, o) in outcomes.iter().enumerate().take(droppers) {
        assert!(
            o.dropped_ours >= 1,
            "dropper FloodWriter{i} never found the shim's condition to drop: {o:?}"
        );
    }

    // After the flood: our verdict is on the Machine (within a few cycles), the writers'
    // conditions are exactly their last ticks.
    let settled = wait_verdict(&f, "m-f", "False", "VMError", Duration::from_secs(30)).await;
    assert!(!settled.annotated);
    let m = get(&client, &f.ns, &f.resources.machine, "m-f").await;
    let list = m
        .pointer(f.conditions_pointer())
        .and_then(Value::as_array)
        .expect("conditions");
    for (i, o) in outcomes.iter().enumerate() {
        let t = format!("FloodWriter{i}");
        let c = list
            .iter()
            .find(|c| c["type"] == t.as_str())
            .unwrap_or_else(|| panic!("{t} missing: {list:#?}"));
        assert_eq!(c["message"], format!("tick {}", o.last_tick), "{t}: {o:?}");
    }
    row.saw(format!(
        "all {N} writers' conditions at their last tick; shim's condition False/VMError"
    ));

    // Bounded, and no hot loop once the writers are gone.
    let quiet_start = apiserver_requests("APPLY", "status").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    shim.assert_running();
    let quiet = apiserver_requests("APPLY", "status").await - quiet_start;
    row.saw(format!(
        "{quiet} status APPLY requests in 5 s after the flood"
    ));
    row.measure("shim_status_apply_requests_quiet_5s", quiet);
    row.measure(
        "shim_status_apply_requests_total",
        apiserver_requests("APPLY", "status").await - applies_before,
    );
    assert_eq!(quiet, 0.0, "the shim keeps writing with nothing changing");
    // One write per drop (re-add) plus the True → False transition, a few spare: never more
    // than one per cycle.
    assert!(
        applies_flood <= (drops + 4) as f64,
        "status writes not bounded by the drops: {applies_flood} APPLYs for {drops} drops"
    );
    assert!(applies_flood <= shim_cycles as f64 + 2.0);
    assert!(
        applies_flood >= drops as f64,
        "fewer writes ({applies_flood}) than drops ({drops}): some drops were never repaired"
    );
    let mut scraped = Vec::new();
    if let Some(st) = shim.status().await {
        scraped.push(st.to_string());
    }
    if let Some(m) = shim.get("/metrics").await {
        scraped.push(m.1);
    }
    assert_no_leaks(&f, &secret, &[&shim], &scraped, &mut row).await;
    shim.stop().await;
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 5. The Machine's condition is the record: kill -9 and leader takeovers while Machines stand
//    at False for every reason, and at Unknown.

/// Events about `machine` in the namespace, every reporter (series counted).
async fn events_about(f: &Fixture, machine: &str) -> u64 {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(f.client.clone(), &f.ns);
    let list = events.list(&ListParams::default()).await.expect("events");
    list.items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(machine))
        .map(|e| e.series.as_ref().map(|s| s.count as u64).unwrap_or(1))
        .sum()
}

/// Machine → (VM, the fault that puts it there, the verdict it must stand at).
const STANDING: [(&str, &str, &str, &str); 9] = [
    ("m-silent", "vm-silent", "False", "GuestNetworkSilent"),
    ("m-detached", "vm-detached", "False", "NICDetached"),
    ("m-noaddr", "vm-noaddr", "False", "NICNoAddress"),
    ("m-stopped", "vm-stopped", "False", "VMStopped"),
    ("m-error", "vm-error", "False", "VMError"),
    ("m-gone", "vm-gone", "False", "VMNotFound"),
    ("m-destroyed", "vm-destroyed", "False", "VMDestroyed"),
    ("m-stalled", "vm-stalled", "Unknown", "VMInTransition"),
    ("m-ok", "vm-ok", "True", "VMHealthy"),
];

/// With src/ at 45755a3 this fails: the process that takes over (fresh, after a kill -9)
/// republishes m-silent True/VMRunning (its history is inconclusive for twice the window) and
/// m-detached / m-noaddr / m-stopped Unknown ("False after …"), each with a new
/// lastTransitionTime, a condition write and an Event. With src/ at 818ddc7 it fails on the
/// condition writes counted at the API server: each new leader rewrote m-ok's True/VMHealthy
/// as True/VMRunning and back, and every standing condition whose message it phrased anew
/// (no status flip, no moved lastTransitionTime, so the checks before did not see it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn standing_verdicts_survive_kill_and_takeover() {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let test = "standing_verdicts_survive_kill_and_takeover";
    let mut row = MatrixRow::new(
        test,
        "Machines stand at False for every reason (GuestNetworkSilent, NICDetached, NICNoAddress, VMStopped, VMError, VMNotFound, VMDestroyed) and at Unknown (VMInTransition: a VM stuck Starting, inside its grace); the leader is SIGKILLed (a follower takes over), a fresh replica is started, the new leader is SIGKILLed (the fresh one takes over)",
        "zero status flips, zero moved lastTransitionTimes, zero extra Events, zero extra annotations",
    );
    let secret = sentinel_secret();
    let f = fixture(
        client.clone(),
        &secret,
        &[
            ("vm-silent", "nic-down", "Starting"),
            ("vm-detached", "healthy", "Starting"),
            ("vm-noaddr", "healthy", "Starting"),
            ("vm-stopped", "healthy", "Starting"),
            ("vm-error", "healthy", "Starting"),
            ("vm-gone", "healthy", "Starting"),
            ("vm-destroyed", "healthy", "Destroyed"),
            ("vm-stalled", "stall-starting", "Starting"),
            ("vm-ok", "healthy", "Starting"),
        ],
    )
    .await;
    let annotate = annotate_mode(&f);
    for (m, vm, _, _) in STANDING {
        f.machine(m, Some(vm), false, "fd1").await;
    }
    let lease_name = format!("shim-{}", f.ns);
    let args = [
        &[
            "--namespace",
            &f.ns,
            "--poll-interval",
            "1s",
            "--stats-interval",
            "1s",
        ][..],
        &[
            "--stopped-grace",
            "3s",
            "--nic-detached-grace",
            "3s",
            "--nic-no-address-grace",
            "3s",
            "--escalation-delay",
            "2s",
        ],
        &["--lease-namespace", &f.ns, "--lease-name", &lease_name],
        &NO_MASS_GUARD,
    ]
    .concat();
    let kubeconfig = test_support::apiserver::kubeconfig_path();
    let mut a = Shim::start(test, "a", &kubeconfig, "shim-a", &args);
    wait_leader(&a, Duration::from_secs(30)).await;
    let mut b = Shim::start(test, "b", &kubeconfig, "shim-b", &args);
    for (m, _, _, _) in STANDING {
        if m != "m-destroyed" {
            wait_for!(Duration::from_secs(60), &format!("{m} has a condition"), {
                seen(&f, m).await
            });
        }
    }
    for (vm, fault) in [
        ("vm-detached", Fault::DetachNic),
        ("vm-noaddr", Fault::NoAddress),
        ("vm-stopped", Fault::Stop),
        ("vm-error", Fault::Error),
        ("vm-gone", Fault::Vanish),
    ] {
        f.sim.inject_fault(vm, fault).expect("fault");
    }
    let mut before = BTreeMap::new();
    for (m, _, status, reason) in STANDING {
        let s = wait_verdict(&f, m, status, reason, Duration::from_secs(90)).await;
        before.insert(m, s);
    }
    if annotate {
        for (m, _, status, _) in STANDING {
            if status == "False" {
                wait_for!(Duration::from_secs(30), &format!("{m} annotated"), {
                    seen(&f, m).await.filter(|s| s.annotated)
                });
            }
        }
    }
    // Settled: what every Machine carries, and the Events so far.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut events_before = BTreeMap::new();
    for (m, _, _, _) in STANDING {
        before.insert(m, seen(&f, m).await.expect("condition"));
        events_before.insert(m, events_about(&f, m).await);
    }
    row.saw(format!(
        "settled: {}",
        STANDING
            .iter()
            .map(|(m, ..)| format!("{m} {}/{}", before[m].status, before[m].reason))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let names: Vec<&str> = STANDING.iter().map(|(m, ..)| *m).collect();
    let monitor = Monitor::start(&f, &names);
    // Condition writes as the API server counts them (server-side applies of Machine status):
    // nothing else writes these Machines' status in this test.
    let applies_before = apiserver_requests("APPLY", "status").await;

    // 1. kill -9 of the leader: the running follower takes over.
    a.signal("KILL");
    a.wait_exit(Duration::from_secs(10)).await;
    wait_leader(&b, Duration::from_secs(40)).await;
    row.saw("a SIGKILLed; b took over");
    // 2. a rollout: a fresh replica (the new pod), then SIGTERM of the leader (it releases
    // the Lease): the fresh one leads.
    let mut c = Shim::start(test, "c", &kubeconfig, "shim-a", &args);
    tokio::time::sleep(Duration::from_secs(5)).await;
    b.stop().await;
    wait_leader(&c, Duration::from_secs(40)).await;
    let took_over = Instant::now();
    row.saw("c started fresh; b stopped by SIGTERM; c took over");
    // The fresh leader polls for a while: long enough to have flipped anything it would flip
    // (its histories are younger than every window), and at least three whole cycles (c only
    // cycles once it leads).
    let c_cycles = |s: &Shim| {
        s.logs()
            .lines()
            .filter(|l| l.contains("cycle done"))
            .count()
    };
    while took_over.elapsed() < Duration::from_secs(20) || c_cycles(&c) < 3 {
        c.assert_running();
        assert!(
            took_over.elapsed() < Duration::from_secs(90),
            "the new leader completed {} cycles in 90 s",
            c_cycles(&c)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let history = monitor.finish().await;
    let condition_writes = apiserver_requests("APPLY", "status").await - applies_before;
    let new_leader_cycles = c_cycles(&c);
    let mut flips = 0;
    let mut moved = 0;
    let mut extra_events = 0;
    let mut extra_annotations = 0;
    for (m, _, _, _) in STANDING {
        let now = seen(&f, m).await.expect("condition");
        let h = &history[m];
        row.saw(format!("{m}: {}", describe(h)));
        flips += h
            .iter()
            .filter(|(_, s)| s.as_ref().map(|s| &s.status) != Some(&before[m].status))
            .count();
        moved += h
            .iter()
            .filter(|(_, s)| s.as_ref().and_then(|s| s.ltt) != before[m].ltt)
            .count();
        extra_annotations += usize::from(now.annotated != before[m].annotated);
        extra_events += events_about(&f, m).await - events_before[m];
    }
    row.measure("status_flips", flips);
    row.measure("moved_last_transition_times", moved);
    row.measure("extra_events", extra_events);
    row.measure("extra_annotations", extra_annotations);
    row.measure("condition_writes_at_the_api_server", condition_writes);
    row.measure("new_leader_cycles", new_leader_cycles);
    row.measure("mode", if annotate { "annotate" } else { "condition" });
    assert!(
        new_leader_cycles >= 3,
        "the new leader completed only {new_leader_cycles} cycles"
    );
    assert_eq!(
        condition_writes, 0.0,
        "condition writes (server-side applies of Machine status) across the takeovers"
    );
    assert_eq!(flips, 0, "status flips across the takeovers");
    assert_eq!(moved, 0, "lastTransitionTimes moved across the takeovers");
    assert_eq!(extra_events, 0, "Events written across the takeovers");
    assert_eq!(
        extra_annotations, 0,
        "annotations changed across the takeovers"
    );
    let mut scraped = Vec::new();
    if let Some(st) = c.status().await {
        scraped.push(st.to_string());
    }
    assert_no_leaks(&f, &secret, &[&a, &b, &c], &scraped, &mut row).await;
    c.stop().await;
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 6. Transient trouble is not news: one failed Secret read and one failed listing.

/// With src/ at 45755a3 this fails: the cycle that cannot read the Secret publishes every
/// Machine `Unknown/CredentialsUnavailable`, the one whose listing fails publishes them
/// `Unknown/CloudStackAPIUnavailable` — a write and an Event each, and a new
/// lastTransitionTime for the False ones when they come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn one_failed_secret_read_or_listing_writes_nothing() {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let test = "one_failed_secret_read_or_listing";
    let mut row = MatrixRow::new(
        test,
        "settled Machines (True, False/VMError, False/GuestNetworkSilent); the endpoint Secret is gone for one cycle; later every CloudStack call of one cycle gets a proxy's 503 page",
        "zero condition writes, zero annotations, zero Events; the verdicts stand",
    );
    let secret = sentinel_secret();
    let f = fixture(
        client.clone(),
        &secret,
        &[
            ("vm-ok", "healthy", "Starting"),
            ("vm-err", "healthy", "Error"),
            ("vm-silent", "nic-down", "Starting"),
        ],
    )
    .await;
    let names = ["m-ok", "m-err", "m-silent"];
    for (m, vm) in names.iter().zip(["vm-ok", "vm-err", "vm-silent"]) {
        f.machine(m, Some(vm), false, "fd1").await;
    }
    let (mut c, _report) = f.controller(&[]).await;
    f.cycle_until(&mut c, &names, Duration::from_secs(60), |v| {
        v["m-ok"].0.as_ref().is_some_and(|(s, _)| s == "True")
            && is(&v["m-err"], "False", "VMError")
            && is(&v["m-silent"], "False", "GuestNetworkSilent")
    })
    .await;
    // Quiet: three cycles in a row without a write.
    let mut quiet = 0;
    let until = Instant::now() + Duration::from_secs(60);
    while quiet < 3 {
        assert!(Instant::now() < until, "never quiet");
        let s = c.cycle(Timestamp::now()).await;
        quiet = if s.condition_writes + s.annotations == 0 {
            quiet + 1
        } else {
            0
        };
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    let mut before = BTreeMap::new();
    let mut events_before = 0;
    for m in names {
        before.insert(m, seen(&f, m).await.expect("condition"));
        events_before += events_about(&f, m).await;
    }
    // Events about a Machine name its uid, so `kubectl describe machine` lists them (before,
    // the reference had none and describe showed nothing).
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &f.ns);
    for m in ["m-err", "m-silent"] {
        let uid = get(&f.client, &f.ns, &f.resources.machine, m).await["metadata"]["uid"]
            .as_str()
            .expect("uid")
            .to_string();
        let about: Vec<_> = events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(m))
            .collect();
        assert!(!about.is_empty(), "an Event about {m}");
        for e in about {
            assert_eq!(
                e.regarding.and_then(|r| r.uid).as_deref(),
                Some(uid.as_str()),
                "the Event about {m} names its uid"
            );
        }
    }
    let mut writes = 0;
    let mut cycle = async |c: &mut Controller, what: &str| {
        let s = c.cycle(Timestamp::now()).await;
        writes += s.condition_writes + s.annotations;
        eprintln!(
            "[{test}] {what}: {} write(s), problems {:?}",
            s.condition_writes + s.annotations,
            s.problems
        );
        tokio::time::sleep(Duration::from_millis(1000)).await;
        s
    };
    let poll_failures = |c: &Controller| {
        metric(
            &c.metrics().encode(),
            "capc_health_scope_poll_failures_total",
        )
    };

    // 1. The Secret is gone for one cycle (deleted and recreated: a GET that fails).
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &f.ns);
    let acs = secrets.get("acs").await.expect("Secret acs");
    secrets
        .delete("acs", &Default::default())
        .await
        .expect("delete");
    let gone = cycle(&mut c, "Secret gone").await;
    // The fault was met: the cycle could not read the Secret and said so.
    assert!(
        gone.problems
            .iter()
            .any(|p| p.contains(&format!("{}/acs", f.ns))),
        "the cycle without the Secret did not report it: {:?}",
        gone.problems
    );
    let mut again = acs.clone();
    again.metadata = kube::api::ObjectMeta {
        name: Some("acs".into()),
        namespace: Some(f.ns.clone()),
        ..Default::default()
    };
    secrets
        .create(&Default::default(), &again)
        .await
        .expect("recreate");
    for _ in 0..3 {
        cycle(&mut c, "Secret back").await;
    }
    // 2. One cycle in which every CloudStack call gets a proxy's 503 page.
    f.sim.set_api_faults(ApiFaults {
        outage: true,
        ..Default::default()
    });
    let failures_before = poll_failures(&c);
    cycle(&mut c, "CloudStack behind a failing proxy").await;
    // The fault was met: that cycle's poll failed (as the shim counts it).
    let failed = poll_failures(&c) - failures_before;
    assert!(
        failed >= 1.0,
        "the poll behind the failing proxy did not fail"
    );
    row.measure("failed_polls_during_the_outage", failed);
    f.sim.set_api_faults(ApiFaults::default());
    for _ in 0..3 {
        cycle(&mut c, "CloudStack back").await;
    }
    let mut events_after = 0;
    let mut changed = Vec::new();
    for m in names {
        let now = seen(&f, m).await.expect("condition");
        if now != before[m] {
            changed.push(format!("{m}: {:?} → {:?}", before[m], now));
        }
        events_after += events_about(&f, m).await;
    }
    row.measure("condition_writes", writes);
    row.measure("extra_events", events_after - events_before);
    row.saw(format!(
        "{writes} write(s), {} Event(s), changed: {changed:?}",
        events_after - events_before
    ));
    assert_eq!(writes, 0, "writes during transient trouble");
    assert_eq!(
        events_after, events_before,
        "Events during transient trouble"
    );
    assert!(changed.is_empty(), "verdicts moved: {changed:?}");
    f.cleanup().await;
}

/// A new leader (a process with no memory of the endpoint) whose first reads of the endpoint
/// Secret fail — or that finds the failure domain briefly missing — writes nothing to the
/// Machines standing `False` or `True` until the API-trouble grace has passed for it, then
/// publishes the lasting failure. With src/ at 818ddc7 this fails: the fresh process's first
/// cycle rewrote every Machine `Unknown/CredentialsUnavailable` with a new
/// lastTransitionTime and a Warning Event (the grace applied only to an endpoint this process
/// had read before).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_new_leader_that_cannot_read_the_secret_yet_writes_nothing() {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let test = "a_new_leader_that_cannot_read_the_secret_yet";
    let mut row = MatrixRow::new(
        test,
        "settled Machines (True, False/VMError, False/NICDetached); the shim restarts (a fresh controller) while the endpoint Secret is gone, later while the failure domain is gone; grace: 12 polls of 1 s",
        "within the grace: zero condition writes (at the API server), zero Events, the verdicts and their lastTransitionTimes stand; past it: Unknown/CredentialsUnavailable",
    );
    let secret = sentinel_secret();
    let f = fixture(
        client.clone(),
        &secret,
        &[
            ("vm-ok", "healthy", "Starting"),
            ("vm-err", "healthy", "Error"),
            ("vm-nic", "healthy", "Starting"),
        ],
    )
    .await;
    let names = ["m-ok", "m-err", "m-nic"];
    for (m, vm) in names.iter().zip(["vm-ok", "vm-err", "vm-nic"]) {
        f.machine(m, Some(vm), false, "fd1").await;
    }
    let flags = ["--nic-detached-grace", "2s", "--stale-poll-intervals", "12"];
    let (mut first, _) = f.controller(&flags).await;
    f.cycle_until(&mut first, &names, Duration::from_secs(60), |v| {
        v["m-ok"].0.as_ref().is_some_and(|(s, _)| s == "True")
    })
    .await;
    f.sim
        .inject_fault("vm-nic", Fault::DetachNic)
        .expect("fault");
    let annotate = annotate_mode(&f);
    f.cycle_until(&mut first, &names, Duration::from_secs(60), |v| {
        v["m-ok"].0.as_ref().is_some_and(|(s, _)| s == "True")
            && is(&v["m-err"], "False", "VMError")
            && is(&v["m-nic"], "False", "NICDetached")
            // Escalated too (annotate mode), so what the Machines carry is settled.
            && (!annotate || (v["m-err"].1 && v["m-nic"].1))
    })
    .await;
    drop(first); // the process is gone: nothing it knew survives
    let mut before = BTreeMap::new();
    let mut events_before = 0;
    for m in names {
        before.insert(m, seen(&f, m).await.expect("condition"));
        events_before += events_about(&f, m).await;
    }
    row.saw(format!("settled: {before:?}"));
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &f.ns);
    let fds: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &f.ns, &f.resources.failure_domain);

    // One fault at a time: the Secret gone, then the failure domain gone. A fresh controller
    // each time; it cycles for 6 polls (half the grace) with the fault on, then without.
    for fault in ["Secret acs gone", "failure domain fd1 gone"] {
        let saved_secret = secrets.get("acs").await.expect("Secret acs");
        let saved_fd = fds.get("fd1-hash").await.expect("failure domain");
        if fault.starts_with("Secret") {
            secrets
                .delete("acs", &Default::default())
                .await
                .expect("delete");
        } else {
            fds.delete("fd1-hash", &Default::default())
                .await
                .expect("delete");
        }
        let applies_before = apiserver_requests("APPLY", "status").await;
        let (mut fresh, report) = f.controller(&flags).await;
        let mut problems_seen = 0;
        for _ in 0..6 {
            let s = fresh.cycle(Timestamp::now()).await;
            problems_seen += s.problems.len();
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // The fault was met, and /status says so while the conditions stand.
        let problems = report.read().await.problems.join("; ");
        row.saw(format!(
            "{fault}: {problems_seen} problem(s) reported by the fresh controller; /status: {problems}"
        ));
        // Restored: the fresh controller polls and still has nothing to write.
        if fault.starts_with("Secret") {
            let mut again = saved_secret.clone();
            again.metadata = kube::api::ObjectMeta {
                name: Some("acs".into()),
                namespace: Some(f.ns.clone()),
                ..Default::default()
            };
            secrets
                .create(&Default::default(), &again)
                .await
                .expect("recreate");
        } else {
            let mut again = saved_fd.clone();
            again.metadata = kube::api::ObjectMeta {
                name: Some("fd1-hash".into()),
                namespace: Some(f.ns.clone()),
                labels: saved_fd.metadata.labels.clone(),
                ..Default::default()
            };
            fds.create(&Default::default(), &again)
                .await
                .expect("recreate");
        }
        for _ in 0..4 {
            fresh.cycle(Timestamp::now()).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let applies = apiserver_requests("APPLY", "status").await - applies_before;
        let mut changed = Vec::new();
        for m in names {
            let now = seen(&f, m).await.expect("condition");
            if now != before[m] {
                changed.push(format!("{m}: {:?} → {:?}", before[m], now));
            }
        }
        let events = {
            let mut n = 0;
            for m in names {
                n += events_about(&f, m).await;
            }
            n
        };
        row.measure(&format!("{fault}: condition_writes"), applies);
        row.measure(&format!("{fault}: extra_events"), events - events_before);
        row.saw(format!(
            "{fault}: {applies} condition write(s), changed {changed:?}"
        ));
        assert_eq!(
            applies, 0.0,
            "{fault}: condition writes by the fresh controller"
        );
        assert!(changed.is_empty(), "{fault}: verdicts moved: {changed:?}");
        assert_eq!(
            events, events_before,
            "{fault}: Events by the fresh controller"
        );
        // Not silent: the fault was reported, and /status said the conditions stand.
        let named = if fault.starts_with("Secret") {
            "acs"
        } else {
            "fd1"
        };
        assert!(problems_seen > 0, "{fault}: never reported");
        assert!(
            problems.contains(named) && problems.contains("keep the conditions"),
            "{fault}: /status does not say so: {problems}"
        );
    }

    // The grace is bounded: a fresh controller that cannot read the Secret for longer than
    // the grace publishes the lasting failure.
    secrets
        .delete("acs", &Default::default())
        .await
        .expect("delete");
    let (mut fresh, _) = f.controller(&flags).await;
    let blind_from = Instant::now();
    let state = f
        .cycle_until(&mut fresh, &names, Duration::from_secs(60), |v| {
            names
                .iter()
                .all(|m| is(&v[*m], "Unknown", "CredentialsUnavailable"))
        })
        .await;
    let after = blind_from.elapsed();
    row.measure("unknown_after_seconds", secs(after));
    row.saw(format!("past the grace, after {after:?}: {state:?}"));
    assert!(
        after >= Duration::from_secs(12),
        "turned Unknown after {after:?}, inside the 12 s grace"
    );
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 7. A refused condition write is shown as refused.

/// With src/ at 45755a3 this fails: `/status` showed the decided `False/VMError` although the
/// API server refused the write and the Machine carried no condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_refused_condition_write_shows_as_failed_in_status() {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let f = fixture(
        client.clone(),
        &sentinel_secret(),
        &[("vm-err", "healthy", "Error")],
    )
    .await;
    f.machine("m-err", Some("vm-err"), false, "fd1").await;
    // An admission policy refuses every status update of Machines in this namespace.
    let policy = format!("refuse-machine-status-{}", f.ns);
    let vap = kube_support::ar(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
    );
    let binding = kube_support::ar(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    );
    kube_support::create(&client, "", &vap, json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy},
        "spec": {"failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["cluster.x-k8s.io"], "apiVersions": ["*"],
                "operations": ["UPDATE"], "resources": ["machines/status"]}]},
            "validations": [{"expression": "false", "message": "machine status is frozen by the test"}]}
    })).await;
    kube_support::create(&client, "", &binding, json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {"policyName": policy, "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": f.ns}}}}
    })).await;
    // The policy takes effect within a few seconds: wait until a status update is refused.
    let machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &f.ns, &f.resources.machine);
    wait_for!(
        Duration::from_secs(30),
        "the policy refuses status updates",
        {
            machines
                .patch_status(
                    "m-err",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": "Provisioning"}})),
                )
                .await
                .err()
        }
    );
    let (mut c, report) = f.controller(&[]).await;
    let until = Instant::now() + Duration::from_secs(60);
    let m = loop {
        c.cycle(Timestamp::now()).await;
        let r = report.read().await.clone();
        let m = r
            .clusters
            .get(&format!("{}/c1", f.ns))
            .and_then(|c| c.machines.get("m-err"))
            .cloned();
        if let Some(m) = m.filter(|m| m.write_error.is_some()) {
            break m;
        }
        assert!(
            Instant::now() < until,
            "no refused write shown: {:?}",
            r.clusters
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let err = m.write_error.clone().unwrap_or_default();
    assert!(err.contains("could not write"), "{err}");
    assert!(err.contains("frozen by the test"), "{err}");
    // /status shows what the Machine carries (nothing, or the Unknown written before the
    // policy took effect), never the refused False, and does not escalate on it.
    let carried = seen(&f, "m-err").await;
    assert_ne!(carried.as_ref().map(|s| s.status.as_str()), Some("False"));
    assert_eq!(
        m.verdict.map(|s| s.to_string()),
        carried.as_ref().map(|s| s.status.clone()),
        "{m:?}"
    );
    assert_eq!(m.escalation, "held", "{m:?}");
    assert!(!carried.is_some_and(|s| s.annotated));
    for (r, name) in [(&binding, &policy), (&vap, &policy)] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), r);
        let _ = api.delete(name, &Default::default()).await;
    }
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 8. A workload kubeconfig that would run a command is refused.

/// With src/ at 45755a3 this fails: the NodeNotLinked lookup built a client from the Secret as
/// it was, and its `exec` stanza ran a command in the shim's process (the marker file appears).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_workload_kubeconfig_with_exec_is_refused_not_run() {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let f = fixture(
        client.clone(),
        &sentinel_secret(),
        &[("vm-err", "healthy", "Error")],
    )
    .await;
    f.machine("m-err", Some("vm-err"), false, "fd1").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("ran");
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
         clusters:\n- name: w\n  cluster:\n    server: https://127.0.0.1:1\n\
         users:\n- name: admin\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      \
         command: /bin/sh\n      args: [-c, 'touch {}']\n      interactiveMode: Never\n\
         contexts:\n- name: c\n  context: {{cluster: w, user: admin}}\n",
        marker.display()
    );
    f.secret("c1-kubeconfig", &[("value", &kubeconfig)]).await;
    let (mut c, report) = f.controller(&[]).await;
    let st = f
        .cycle_until(&mut c, &["m-err"], Duration::from_secs(60), |v| {
            is(&v["m-err"], "False", "VMError")
        })
        .await;
    // The lookup ran (the verdict is False and a Node-less Machine) and was refused.
    let problems = report.read().await.problems.clone();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("c1-kubeconfig") && p.contains("refused") && p.contains("exec")),
        "a clear problem: {problems:?} ({st:?})"
    );
    assert!(!marker.exists(), "the kubeconfig's command ran");
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 9. The orphan memory is read before it is written (issue 40).

/// A client of the test API server whose first `n` GETs of the path `path` are answered 500
/// (a Status body, as an API server that cannot reach etcd answers) without reaching it;
/// everything else goes through to the API server. The API server speaks TLS with client
/// certificates, so the fault sits in the client's own service stack, not in a proxy: what the
/// shim's code sees is a real `kube::Client` getting a 500. The count of 500s answered.
fn failing_gets(inner: Client, path: String, n: usize) -> (Client, Arc<AtomicUsize>) {
    let left = Arc::new(AtomicUsize::new(n));
    let answered = Arc::new(AtomicUsize::new(0));
    let counted = answered.clone();
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        let fail = req.method() == http::Method::GET
            && req.uri().path() == path
            && left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1))
                .is_ok();
        if fail {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        async move {
            if fail {
                let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "reason": "InternalError", "code": 500,
                    "message": "etcdserver: request timed out (injected by the test)"});
                return Ok::<_, kube::Error>(
                    http::Response::builder()
                        .status(500)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(status.to_string().into_bytes()))
                        .expect("response"),
                );
            }
            inner.send(req).await
        }
    });
    (Client::new(svc, "default"), answered)
}

/// The memory's ConfigMap as stored: `binaryData` by key and `data` by key.
async fn stored_memory(
    client: &Client,
    ns: &str,
    name: &str,
) -> (BTreeMap<String, Vec<u8>>, BTreeMap<String, String>) {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = cms
        .get_opt(name)
        .await
        .expect("GET ConfigMap")
        .unwrap_or_default();
    (
        cm.binary_data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect(),
        cm.data.unwrap_or_default(),
    )
}

fn memory_report(
    r: &capc_health_shim::status::StatusReport,
) -> capc_health_shim::status::MemoryReport {
    r.orphan_detection.memory.clone().expect("a memory report")
}

/// With src/controller/memory.rs at 818ddc7 this fails: the first cycle after the failed read
/// writes the new leader's own memory over the stored one (without m-gone-csm), so the stored
/// bytes change and vm-gone, whose CloudStackMachine was deleted while no shim watched, is
/// never reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_failed_memory_read_leaves_the_stored_memory_intact() {
    use capc_health_shim::controller::memory::{MemoryStore, DATA_KEY};
    use capc_health_shim::orphans::memory::decode;
    use capc_health_shim::status::MemoryRead;

    const MEMORY: &str = "capc-health-shim-memory";
    const FAILED_READS: usize = 4;
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let test = "memory_read_fails_first";
    let mut row = MatrixRow::new(
        test,
        "a leader stored m-gone's CloudStackMachine in its memory and went; m-gone's CloudStackMachine is deleted while no shim watches (its VM runs on); the new leader's first 4 GETs of the memory's ConfigMap are answered 500",
        "the stored memory byte-for-byte the same through every cycle with a failed read; the first read that succeeds takes m-gone-csm back; vm-gone reported instance-of-deleted",
    );
    let f = fixture(
        client.clone(),
        &sentinel_secret(),
        &[
            ("vm-keep", "healthy", "Starting"),
            ("vm-gone", "healthy", "Starting"),
        ],
    )
    .await;
    for (m, vm) in [("m-keep", "vm-keep"), ("m-gone", "vm-gone")] {
        f.machine(m, Some(vm), false, "fd1").await;
    }
    let gone_id = f.vm_ids["vm-gone"].to_ascii_lowercase();

    // The earlier leader: cycles until its memory holds m-gone-csm with its instance.
    let (c1, _) = f.controller(&["--orphan-grace", "2s"]).await;
    let mut c1 = c1.with_memory(MemoryStore::new(&client, &f.ns, MEMORY));
    c1.restore_memory().await;
    let stored = wait_for!(
        Duration::from_secs(60),
        "the first leader stores m-gone-csm",
        {
            c1.cycle(Timestamp::now()).await;
            let (binary, _) = stored_memory(&client, &f.ns, MEMORY).await;
            binary.get(DATA_KEY).cloned().filter(|b| {
                decode(b).is_ok_and(|m| {
                    m.machines.iter().any(|e| {
                        e.name == "m-gone-csm" && e.instance_id.as_deref() == Some(gone_id.as_str())
                    })
                })
            })
        }
    );
    drop(c1);
    row.saw(format!(
        "the first leader stored {} bytes with m-gone-csm",
        stored.len()
    ));
    // While no shim watches: the CloudStackMachine goes without CAPC destroying its VM.
    for (r, name) in [
        (&f.resources.cloudstack_machine, "m-gone-csm"),
        (&f.resources.machine, "m-gone"),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &f.ns, r);
        api.delete(name, &Default::default()).await.expect("delete");
    }

    let (faulty, failed) = failing_gets(
        client.clone(),
        format!("/api/v1/namespaces/{}/configmaps/{MEMORY}", f.ns),
        FAILED_READS,
    );
    let (c2, report) = f.controller(&["--orphan-grace", "2s"]).await;
    let mut c2 = c2.with_memory(MemoryStore::new(&faulty, &f.ns, MEMORY));
    c2.restore_memory().await;
    // Each cycle tries the read again: the restore and three cycles get a 500.
    let mut cycles_failed = 0;
    while failed.load(Ordering::SeqCst) < FAILED_READS {
        c2.cycle(Timestamp::now()).await;
        cycles_failed += 1;
        let (binary, _) = stored_memory(&client, &f.ns, MEMORY).await;
        let now = binary.get(DATA_KEY);
        assert_eq!(
            now.map(Vec::len),
            Some(stored.len()),
            "cycle {cycles_failed} after {} failed read(s) changed the stored memory",
            failed.load(Ordering::SeqCst)
        );
        assert!(
            now == Some(&stored),
            "cycle {cycles_failed}: stored bytes differ"
        );
        let m = memory_report(&*report.read().await);
        assert_eq!(m.read, MemoryRead::Failed, "{m:?}");
        assert!(m.held, "{m:?}");
        let err = m.last_error.clone().unwrap_or_default();
        assert!(
            err.contains(&format!("ConfigMap {}/{MEMORY}", f.ns)) && err.contains(DATA_KEY),
            "the error names the ConfigMap and key: {err}"
        );
        let metrics = c2.metrics().encode();
        let held = format!(
            "capc_health_orphan_memory_held{{configmap=\"{}/{MEMORY}\"}} 1",
            f.ns
        );
        assert!(metrics.contains(&held), "{held} not in\n{metrics}");
        assert!(
            cycles_failed <= FAILED_READS,
            "more cycles than failed reads"
        );
    }
    row.saw(format!(
        "{} GETs answered 500 (the restore and {cycles_failed} cycles): the stored {} bytes unchanged after each",
        failed.load(Ordering::SeqCst),
        stored.len()
    ));
    row.measure("failed_reads", failed.load(Ordering::SeqCst) as u64);
    row.measure("cycles_with_a_failed_read", cycles_failed);

    // The next read succeeds: m-gone-csm comes back, and with it vm-gone's owner.
    let read_back_at = Timestamp::now();
    let r = kube_support::cycle_until_report(
        &mut c2,
        &report,
        Duration::from_secs(60),
        |r| {
            r.orphans.iter().any(|o| {
                o.vm_id == gone_id
                    && o.kind == capc_health_shim::status::OrphanKind::InstanceOfDeleted
                    && o.reported_at.is_some()
            })
        },
        |r| {
            format!(
                "orphans {:#?}, detection {:?}",
                r.orphans, r.orphan_detection
            )
        },
    )
    .await;
    let m = memory_report(&r);
    assert_eq!(m.read, MemoryRead::Ok, "{m:?}");
    assert!(!m.held, "{m:?}");
    assert_eq!(m.read_failures, 0, "{m:?}");
    assert_eq!(
        m.restored, 1,
        "m-gone-csm taken back (m-keep-csm it saw itself): {m:?}"
    );
    let after = between(read_back_at, Timestamp::now());
    row.saw(format!(
        "the read after them took back {} CloudStackMachine; vm-gone reported instance-of-deleted {after} s later",
        m.restored
    ));
    row.measure("restored", m.restored as u64);
    row.measure("reported_after_read_seconds", after);
    // What this leader wrote after its read still holds m-gone-csm: the next leader knows it.
    let (binary, _) = stored_memory(&client, &f.ns, MEMORY).await;
    let now = decode(binary.get(DATA_KEY).expect("memory")).expect("decodes");
    assert!(
        now.machines.iter().any(|e| e.name == "m-gone-csm"),
        "{now:?}"
    );
    f.cleanup().await;
}

/// With src/controller/memory.rs at 818ddc7 this fails: the unreadable memory is logged and
/// replaced by the new leader's own at its first cycle; nothing keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn an_unreadable_memory_is_kept_aside_and_reported() {
    use capc_health_shim::controller::memory::{
        AsideNote, MemoryStore, ASIDE_KEY, ASIDE_NOTE_KEY, DATA_KEY,
    };
    use capc_health_shim::orphans::memory::decode;
    use capc_health_shim::status::MemoryRead;
    use std::io::Write;

    const MEMORY: &str = "capc-health-shim-memory";
    // In the stored memory and nowhere in what the shim says about it.
    const MARKER: &str = "m-marker-7f3a";
    const MARKER_ID: &str = "918273645";
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let test = "memory_unreadable";
    let mut row = MatrixRow::new(
        test,
        "the memory's ConfigMap holds gzip data that is not the memory's JSON (an instance id where a name belongs)",
        "the stored bytes copied byte-for-byte under the aside key with when and why, before the leader's own memory replaces them; /status names it (read unreadable, kept_aside, a problem) and the gauge is 1; a later leader's writes keep it",
    );
    let f = fixture(
        client.clone(),
        &sentinel_secret(),
        &[("vm-keep", "healthy", "Starting")],
    )
    .await;
    f.machine("m-keep", Some("vm-keep"), false, "fd1").await;
    let corrupt = {
        let json = format!(
            r#"{{"v": 1, "s": [], "m": [{{"n": "{}", "m": "{MARKER}", "i": {MARKER_ID}}}]}}"#,
            f.ns
        );
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(json.as_bytes()).expect("gzip");
        z.finish().expect("gzip")
    };
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &f.ns);
    cms.create(
        &Default::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": MEMORY, "namespace": f.ns},
            "binaryData": {DATA_KEY: base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &corrupt)},
        }))
        .expect("ConfigMap"),
    )
    .await
    .expect("create the ConfigMap");

    let (c1, report) = f.controller(&[]).await;
    let mut c1 = c1.with_memory(MemoryStore::new(&client, &f.ns, MEMORY));
    c1.restore_memory().await;
    let r = kube_support::cycle_until_report(
        &mut c1,
        &report,
        Duration::from_secs(60),
        |r| {
            r.orphan_detection
                .memory
                .as_ref()
                .is_some_and(|m| m.written_at.is_some())
        },
        |r| format!("{:?}", r.orphan_detection),
    )
    .await;
    let m = memory_report(&r);
    let (binary, data) = stored_memory(&client, &f.ns, MEMORY).await;
    assert!(
        binary.get(ASIDE_KEY) == Some(&corrupt),
        "the unreadable bytes kept aside as they were: {:?}",
        binary.keys().collect::<Vec<_>>()
    );
    let note: AsideNote =
        serde_json::from_str(data.get(ASIDE_NOTE_KEY).expect("a note")).expect("note parses");
    assert!(note.kept_at.is_some(), "{note:?}");
    assert_eq!(note.from, DATA_KEY);
    assert!(
        note.reason
            .contains(&format!("ConfigMap {}/{MEMORY}", f.ns))
            && note.reason.contains(DATA_KEY),
        "{note:?}"
    );
    let own = decode(binary.get(DATA_KEY).expect("the leader's own memory")).expect("decodes");
    assert!(
        own.machines.iter().any(|e| e.name == "m-keep-csm"),
        "{own:?}"
    );
    assert_eq!(m.read, MemoryRead::Unreadable, "{m:?}");
    assert!(!m.held, "written after the copy: {m:?}");
    let kept = m.kept_aside.clone().expect("kept_aside in /status");
    assert_eq!((kept.key.as_str(), kept.bytes), (ASIDE_KEY, corrupt.len()));
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains(ASIDE_KEY) && p.contains(MEMORY)),
        "{:?}",
        r.problems
    );
    let metrics = c1.metrics().encode();
    let gauge = format!(
        "capc_health_orphan_memory_kept_aside{{configmap=\"{}/{MEMORY}\"}} 1",
        f.ns
    );
    assert!(metrics.contains(&gauge), "{gauge} not in\n{metrics}");
    let said = serde_json::to_string(&r).expect("status") + &note.reason + &metrics;
    assert!(
        !said.contains(MARKER) && !said.contains(MARKER_ID),
        "the memory's contents are not quoted"
    );
    row.saw(format!(
        "{} bytes kept under {ASIDE_KEY} ({}), the leader's own memory ({} bytes) under {DATA_KEY}",
        kept.bytes, note.reason, m.bytes
    ));
    row.measure("kept_aside_bytes", kept.bytes as u64);
    drop(c1);

    // A later leader reads its predecessor's memory, writes its own, and the copy stays.
    let (c2, report2) = f.controller(&[]).await;
    let mut c2 = c2.with_memory(MemoryStore::new(&client, &f.ns, MEMORY));
    c2.restore_memory().await;
    let r = kube_support::cycle_until_report(
        &mut c2,
        &report2,
        Duration::from_secs(60),
        |r| {
            r.orphan_detection
                .memory
                .as_ref()
                .is_some_and(|m| m.written_at.is_some())
        },
        |r| format!("{:?}", r.orphan_detection),
    )
    .await;
    let m = memory_report(&r);
    assert_eq!(m.read, MemoryRead::Ok, "{m:?}");
    assert_eq!(m.kept_aside.as_ref().map(|k| k.bytes), Some(corrupt.len()));
    let (binary, _) = stored_memory(&client, &f.ns, MEMORY).await;
    assert!(
        binary.get(ASIDE_KEY) == Some(&corrupt),
        "the next leader's write kept the copy"
    );
    row.saw("a later leader read the memory (ok), wrote its own, and the copy is still there");
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 10. A relist from a lagging cache serves older Machines (issue 40 item 2).

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type TestBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, BoxError>;

/// What the test does to the Machines' watch through [`stale_relist`].
struct RelistControl {
    /// The body the next LIST of the Machines is answered with (taken once).
    stale: std::sync::Mutex<Option<bytes::Bytes>>,
    /// LISTs answered with the stale body.
    served: AtomicUsize,
    /// Watch requests that had to wait for `hold` to clear, and watch requests sent on.
    held: AtomicUsize,
    forwarded: AtomicUsize,
    /// While true, new watch requests wait: the cache is behind, so the watch that follows a
    /// relist cannot replay the newer events at once.
    hold: tokio::sync::watch::Sender<bool>,
    /// Bumped to end every open watch of the Machines with a 410 Expired event.
    cut: tokio::sync::watch::Sender<u64>,
}

/// Whether a request's query asks for a watch.
fn is_watch(query: Option<&str>) -> bool {
    query
        .unwrap_or("")
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1")
}

fn boxed(body: kube::client::Body) -> TestBody {
    use http_body_util::BodyExt;
    body.map_err(|e| Box::new(e) as BoxError).boxed_unsync()
}

/// The watch response's body until `cut` changes; then one `ERROR` event with a 410 Expired
/// Status (as an API server whose watch cache dropped the watcher's resourceVersion sends),
/// which makes kube's watcher relist. A watch that ends on its own ends as it would.
fn cut_short(body: kube::client::Body, mut cut: tokio::sync::watch::Receiver<u64>) -> TestBody {
    use futures::StreamExt;
    use http_body_util::BodyExt;
    let was_cut = Arc::new(AtomicBool::new(false));
    let set = was_cut.clone();
    let expired = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
        "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
        "message": "too old resource version (injected)"}})
    .to_string()
        + "\n";
    let frames = http_body_util::BodyStream::new(body)
        .map(|f| f.map_err(|e| Box::new(e) as BoxError))
        .take_until(async move {
            if cut.changed().await.is_ok() {
                set.store(true, Ordering::SeqCst);
            } else {
                // The test is gone: never cut.
                std::future::pending::<()>().await;
            }
        })
        .chain(
            futures::stream::once(async move { was_cut.load(Ordering::SeqCst) }).filter_map(
                move |cut| {
                    let line = bytes::Bytes::from(expired.clone());
                    async move { cut.then(|| Ok(http_body::Frame::data(line))) }
                },
            ),
        );
    http_body_util::StreamBody::new(frames).boxed_unsync()
}

/// A client of the test API server whose reads of the Machines collection at `machines` (a
/// path) can be made to come from a lagging cache: the open watches cut with 410 Expired, the
/// relist that follows answered with a stored older LIST body, the watch after it held back.
/// Everything else goes through unchanged. As in [`failing_gets`], the fault sits in the
/// client's own service stack (the API server wants TLS client certificates).
fn stale_relist(inner: Client, machines: String) -> (Client, Arc<RelistControl>) {
    let control = Arc::new(RelistControl {
        stale: Default::default(),
        served: AtomicUsize::new(0),
        held: AtomicUsize::new(0),
        forwarded: AtomicUsize::new(0),
        hold: tokio::sync::watch::Sender::new(false),
        cut: tokio::sync::watch::Sender::new(0),
    });
    let ctl = control.clone();
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        let ctl = ctl.clone();
        let ours = req.method() == http::Method::GET && req.uri().path() == machines;
        let watch = ours && is_watch(req.uri().query());
        async move {
            if watch {
                let mut hold = ctl.hold.subscribe();
                if *hold.borrow_and_update() {
                    ctl.held.fetch_add(1, Ordering::SeqCst);
                }
                // The sender lives as long as this service: an error cannot happen here.
                let _ = hold.wait_for(|held| !*held).await;
                ctl.forwarded.fetch_add(1, Ordering::SeqCst);
                let cut = ctl.cut.subscribe();
                let res = inner.send(req).await?;
                return Ok::<_, kube::Error>(res.map(|b| cut_short(b, cut)));
            }
            let stale = if ours {
                ctl.stale.lock().unwrap_or_else(|e| e.into_inner()).take()
            } else {
                None
            };
            if let Some(stale) = stale {
                use http_body_util::BodyExt;
                ctl.served.fetch_add(1, Ordering::SeqCst);
                return Ok(http::Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(
                        http_body_util::Full::new(stale)
                            .map_err(|never| match never {})
                            .boxed_unsync(),
                    )
                    .expect("response"));
            }
            Ok(inner.send(req).await?.map(boxed))
        }
    });
    (Client::new(svc, "default"), control)
}

/// Condition writes and merge patches (the remediate annotation) of Machines, counted by the
/// API server.
async fn machine_writes() -> f64 {
    apiserver_requests("APPLY", "status").await + apiserver_requests("PATCH", "").await
}

/// `(name, status)` of our condition on each Machine of a MachineList body.
fn listed_conditions(list: &str, pointer: &str) -> Vec<(String, String)> {
    let list: Value = serde_json::from_str(list).expect("a MachineList");
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|m| {
                    let status = kube_support::condition(m, pointer)
                        .and_then(|c| c["status"].as_str())
                        .unwrap_or("-");
                    (
                        m["metadata"]["name"].as_str().unwrap_or("?").to_string(),
                        status.to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// With src/ and crates/ at 818ddc7 this fails: the relist's older m-flap (still True) is taken
/// as the truth, and the shim writes False/VMError again with a new lastTransitionTime and a
/// new Event (capi-1.9: 4 writes and 4 Events in the 4 stale cycles; capi-1.13: 2 and 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_stale_relist_changes_nothing() {
    let client = kube_client().await;
    let _serial = SERIAL.lock().await;
    let test = "a_stale_relist_changes_nothing";
    let mut row = MatrixRow::new(
        test,
        "m-flap standing False/VMError, m-ok True; the Machines' watch ends with 410 Expired and the relist is answered from a lagging cache (the Machines as listed before m-flap failed: both True); the watch after it held back for 4 cycles, then let through",
        "zero condition writes and annotation patches (at the API server), zero Events; m-flap stays False/VMError with its lastTransitionTime and m-ok True, while the stale list is all the watch has and after it catches up",
    );
    let f = fixture(
        client.clone(),
        &sentinel_secret(),
        &[
            ("vm-ok", "healthy", "Starting"),
            ("vm-flap", "healthy", "Starting"),
        ],
    )
    .await;
    let names = ["m-ok", "m-flap"];
    f.machine("m-ok", Some("vm-ok"), false, "fd1").await;
    f.machine("m-flap", Some("vm-flap"), false, "fd1").await;
    let r = &f.resources.machine;
    let path = format!(
        "/apis/{}/{}/namespaces/{}/{}",
        r.group, r.version, f.ns, r.plural
    );
    let (wrapped, relist) = stale_relist(client.clone(), path.clone());
    let (mut c, _report) = f.controller_as(wrapped, &[]).await;
    let true_ =
        |v: &(Option<(String, String)>, bool)| v.0.as_ref().is_some_and(|(s, _)| s == "True");
    f.cycle_until(&mut c, &names, Duration::from_secs(60), |v| {
        names.iter().all(|m| true_(&v[*m]))
    })
    .await;
    // The older state, as a lagging cache would serve it.
    let older = client
        .request_text(http::Request::get(&path).body(Vec::new()).expect("request"))
        .await
        .expect("LIST the Machines");
    let listed = listed_conditions(&older, f.conditions_pointer());
    assert_eq!(
        listed.iter().filter(|(_, s)| s == "True").count(),
        2,
        "the older list has both Machines True: {listed:?}"
    );

    f.sim.inject_fault("vm-flap", Fault::Error).expect("fault");
    let annotate = annotate_mode(&f);
    f.cycle_until(&mut c, &names, Duration::from_secs(60), |v| {
        true_(&v["m-ok"]) && is(&v["m-flap"], "False", "VMError") && (!annotate || v["m-flap"].1)
    })
    .await;
    // Settled: three cycles in a row that write nothing.
    let until = Instant::now() + Duration::from_secs(60);
    let mut quiet = 0;
    while quiet < 3 {
        let before = machine_writes().await;
        c.cycle(Timestamp::now()).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        quiet = if machine_writes().await == before {
            quiet + 1
        } else {
            0
        };
        assert!(Instant::now() < until, "the writes never settled");
    }
    let mut before = BTreeMap::new();
    let mut events_before = 0;
    for m in names {
        before.insert(m, seen(&f, m).await.expect("condition"));
        events_before += events_about(&f, m).await;
    }
    row.saw(format!("settled: {before:?}"));
    let writes_before = machine_writes().await;
    let applies_before = apiserver_requests("APPLY", "status").await;

    // Armed: the next relist serves the older list, and the watch after it waits.
    *relist.stale.lock().unwrap() = Some(bytes::Bytes::from(older));
    relist.hold.send_replace(true);
    let forwarded = relist.forwarded.load(Ordering::SeqCst);
    relist.cut.send_modify(|g| *g += 1);
    // Once the watch after the relist is asked for, the relist's objects went through the
    // watch loop.
    wait_for!(
        Duration::from_secs(30),
        "the relist answered from the stale list and the next watch held",
        (relist.served.load(Ordering::SeqCst) == 1 && relist.held.load(Ordering::SeqCst) >= 1)
            .then_some(())
    );
    let check = |when: &str, before: &BTreeMap<&str, Seen>, now: &BTreeMap<&str, Seen>| {
        let changed: Vec<String> = names
            .iter()
            .filter(|m| before[*m] != now[*m])
            .map(|m| format!("{m}: {:?} → {:?}", before[*m], now[*m]))
            .collect();
        assert!(changed.is_empty(), "{when}: verdicts moved: {changed:?}");
    };
    let stale_cycles = 4;
    for _ in 0..stale_cycles {
        c.cycle(Timestamp::now()).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let stale_writes = machine_writes().await - writes_before;
    let stale_applies = apiserver_requests("APPLY", "status").await - applies_before;
    let mut now = BTreeMap::new();
    let mut events = 0;
    for m in names {
        now.insert(m, seen(&f, m).await.expect("condition"));
        events += events_about(&f, m).await;
    }
    row.measure(
        "stale_lists_served",
        relist.served.load(Ordering::SeqCst) as u64,
    );
    row.measure("watches_held", relist.held.load(Ordering::SeqCst) as u64);
    row.measure("cycles_on_the_stale_list", stale_cycles);
    row.measure("writes_on_the_stale_list", stale_writes);
    row.measure("condition_writes_on_the_stale_list", stale_applies);
    row.measure("extra_events_on_the_stale_list", events - events_before);
    row.saw(format!(
        "stale list served, watch held, {stale_cycles} cycles: {stale_writes} write(s) ({stale_applies} of the condition), {} extra Event(s), now {now:?}",
        events - events_before
    ));
    assert_eq!(stale_writes, 0.0, "writes while the relist was stale");
    check("on the stale list", &before, &now);
    assert_eq!(events, events_before, "Events while the relist was stale");

    // The cache catches up: the watch goes through and replays what the older list lacked.
    relist.hold.send_replace(false);
    wait_for!(
        Duration::from_secs(30),
        "the held watch let through",
        (relist.forwarded.load(Ordering::SeqCst) > forwarded).then_some(())
    );
    for _ in 0..2 {
        c.cycle(Timestamp::now()).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_writes = machine_writes().await - writes_before;
    let mut after = BTreeMap::new();
    let mut events_after = 0;
    for m in names {
        after.insert(m, seen(&f, m).await.expect("condition"));
        events_after += events_about(&f, m).await;
    }
    row.measure("writes_after_catching_up", all_writes);
    row.saw(format!(
        "caught up, 2 more cycles: {all_writes} write(s) in all, now {after:?}"
    ));
    assert_eq!(all_writes, 0.0, "writes once the watch caught up");
    check("after catching up", &before, &after);
    assert_eq!(events_after, events_before, "Events after catching up");
    f.cleanup().await;
}
