//! The HTTP side as an operator meets it: the endpoints of `http::serve` on a real socket,
//! then the real `capc-health-shim status` binary rendering them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Output};
use std::time::Duration;

use capc_health_shim::http::{self, HttpState};
use capc_health_shim::metrics::Metrics;
use capc_health_shim::remnants::{Remnant, RemnantReason};
use capc_health_shim::status::{
    ClusterReport, FailureDomainReport, MachineReport, OrphanDetectionReport, OrphanKind,
    OrphanReport, ProbeCounts, ProbeReport, RemnantDetectionReport, ScopeReport, StatusReport,
};
use capc_health_shim::verdict::Status;
use capi_model::apis::{ApiChoice, ConditionLayout, Mode};
use jiff::Timestamp;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const DEADLINE: Duration = Duration::from_secs(30);

fn ts(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

fn machine(ns: &str, name: &str) -> MachineReport {
    MachineReport {
        namespace: ns.into(),
        name: name.into(),
        escalation: "none".into(),
        mhc_covered: true,
        ..Default::default()
    }
}

fn report() -> StatusReport {
    let mut prod = ClusterReport::default();
    prod.machines.insert(
        "prod-cp-abc12".into(),
        MachineReport {
            control_plane: true,
            vm_id: Some("1f0e4c2a-0000-4000-8000-000000000001".into()),
            vm_state: Some("Running".into()),
            verdict: Some(Status::True),
            reason: Some("VMHealthy".into()),
            message: Some("VM Running on host h1, guest traffic flowing".into()),
            since: Some(ts("2026-11-30T09:00:00Z")),
            scope: Some("https://cs.example/client/api zone=z1".into()),
            ..machine("prod", "prod-cp-abc12")
        },
    );
    prod.machines.insert(
        "prod-md-0-xyz34".into(),
        MachineReport {
            vm_id: Some("1f0e4c2a-0000-4000-8000-000000000002".into()),
            vm_state: Some("Error".into()),
            verdict: Some(Status::False),
            reason: Some("VMError".into()),
            message: Some("VM in state Error for 2 polls".into()),
            since: Some(ts("2026-11-30T10:15:00Z")),
            escalation: "annotated".into(),
            scope: Some("https://cs.example/client/api zone=z1".into()),
            console_url: Some("https://cs.example/client/console?vm=2".into()),
            acted_on: "annotation".into(),
            ..machine("prod", "prod-md-0-xyz34")
        },
    );
    let mut staging = ClusterReport::default();
    staging.machines.insert(
        "staging-md-0-held1".into(),
        MachineReport {
            vm_id: Some("1f0e4c2a-0000-4000-8000-000000000003".into()),
            vm_state: Some("Stopped".into()),
            verdict: Some(Status::False),
            reason: Some("VMStopped".into()),
            message: Some("VM Stopped for 5m".into()),
            since: Some(ts("2026-11-30T10:20:00Z")),
            escalation: "held".into(),
            escalation_detail: Some("MassFailure: 5 of 6 Machines in scope failing".into()),
            mhc_covered: false,
            scope: Some("https://cs.example/client/api zone=z2".into()),
            ..machine("staging", "staging-md-0-held1")
        },
    );
    staging.machines.insert(
        "staging-md-0-new".into(),
        machine("staging", "staging-md-0-new"),
    );
    StatusReport {
        version: "0.1.0".into(),
        generated_at: Some(ts("2026-11-30T10:30:00Z")),
        leader: true,
        leader_identity: Some("capc-health-shim-0".into()),
        ready: false,
        api: Some(ApiChoice {
            mode: Mode::Annotate,
            mode_source: "auto".into(),
            layout: ConditionLayout::V1Beta2,
            cluster_version: "v1beta2".into(),
            mhc_version: "v1beta2".into(),
            cloudstack_machine_version: "v1beta3".into(),
            cloudstack_failure_domain_version: "v1beta3".into(),
        }),
        problems: vec![
            "credentials Secret staging/cloudstack-creds: key secret-key missing".into(),
        ],
        clusters: BTreeMap::from([
            ("prod/prod".to_string(), prod),
            ("staging/staging".to_string(), staging),
        ]),
        scopes: vec![
            ScopeReport {
                key: "https://cs.example/client/api zone=z1".into(),
                api_url: "https://cs.example/client/api".into(),
                machines: 2,
                last_poll: Some(ts("2026-11-30T10:29:30Z")),
                last_success: Some(ts("2026-11-30T10:29:30Z")),
                last_error: None,
                calls_total: 42,
                calls: BTreeMap::from([("listVirtualMachines/ok".to_string(), 42)]),
                rate_limit_wait_seconds: 0.0,
                held: false,
                next_poll: None,
                stats: Some(capc_health_shim::scope::StatsSummary {
                    inferred_interval_seconds: Some(60),
                    interval_in_force_seconds: 60,
                    sums_rows: Some(true),
                    retention_minutes: Some(720),
                }),
                stats_vms_asked: 1,
                secrets: vec!["prod/cloudstack-creds".into()],
            },
            ScopeReport {
                key: "https://cs.example/client/api zone=z2".into(),
                api_url: "https://cs.example/client/api".into(),
                machines: 2,
                last_poll: Some(ts("2026-11-30T10:29:31Z")),
                last_success: Some(ts("2026-11-30T10:20:00Z")),
                last_error: Some("listVirtualMachines timed out after 15s".into()),
                calls_total: 17,
                calls: BTreeMap::from([
                    ("listVirtualMachines/ok".to_string(), 12),
                    ("listVirtualMachines/timeout".to_string(), 5),
                ]),
                rate_limit_wait_seconds: 2.5,
                held: true,
                next_poll: None,
                stats: None,
                stats_vms_asked: 0,
                secrets: vec![
                    "staging/cloudstack-creds".into(),
                    "team-b/cloudstack-creds".into(),
                ],
            },
        ],
        failure_domains: vec![FailureDomainReport {
            namespace: "prod".into(),
            name: "fd-z1".into(),
            machines: 4,
            failing: 1,
            failure_ratio: 0.25,
        }],
        probe: Some(ProbeReport {
            enabled: true,
            endpoint: Some("https://cloud.example/client/api".into()),
            in_flight: 2,
            counts: ProbeCounts {
                replies: 40,
                no_replies: 3,
                no_evidence: 1,
                jobs_started: 46,
                router_lookups: 5,
                skipped_for_budget: 0,
                skipped_in_flight_cap: 1,
                skipped_router_busy: 2,
            },
            refused: None,
            last_error: None,
        }),
        orphans: vec![OrphanReport {
            vm_id: ORPHAN_ID.into(),
            vm_name: "prod-md-0-gone7".into(),
            vm_state: "Running".into(),
            scope: "https://cs.example/client/api zone=z1".into(),
            cluster: Some("prod/prod".into()),
            cloudstack_machine: "prod/prod-md-0-gone7".into(),
            kind: OrphanKind::NameOfDeleted,
            since: ts("2026-11-30T10:00:00Z"),
            reported_at: Some(ts("2026-11-30T10:15:00Z")),
            why: "it has the name of CloudStackMachine prod/prod-md-0-gone7, which was deleted \
                  before CAPC recorded the VM it deployed for it (capc#190)"
                .into(),
        }],
        orphan_detection: OrphanDetectionReport {
            enabled: true,
            grace_seconds: 900.0,
            suspects: 0,
            remembered_machines: 5,
            memory: None,
        },
        remnants: vec![Remnant {
            group: "cluster.x-k8s.io".into(),
            kind: "MachineSet".into(),
            namespace: "prod".into(),
            name: "prod-md-0-7f9c".into(),
            cluster: Some("prod/prod".into()),
            since: ts("2026-11-30T10:05:00Z"),
            reason: RemnantReason::OwnerGone,
            why: "its controller owner MachineDeployment prod-md-0 is gone".into(),
            blocking_finalizers: vec![],
            related_vm: None,
        }],
        remnant_detection: RemnantDetectionReport {
            enabled: true,
            grace_seconds: 900.0,
            kinds: vec!["MachineDeployment".into(), "MachineSet".into()],
            kinds_not_synced: vec![],
            objects: 9,
            suspects: 0,
        },
        writes: [("condition/written".to_string(), 12)].into(),
        scorecard: None,
        incidents: Vec::new(),
    }
}

const ORPHAN_ID: &str = "7c3e1a90-0000-4000-8000-0000000000aa";

fn metrics() -> Metrics {
    let m = Metrics::new();
    m.record_transition(Status::False, "VMError");
    m.record_transition(Status::False, "VMStopped");
    m.record_escalation("annotated");
    m.record_escalation("MassFailure");
    m.record_calls("listVirtualMachines", "ok", 54);
    m.record_calls("listVirtualMachines", "timeout", 5);
    m.record_rate_limit_wait(2.5);
    m.observe_poll("https://cs.example/client/api zone=z1", 0.4);
    m.observe_time_to_false("VMError", 120.0);
    m.set_mass_failure_held("https://cs.example/client/api zone=z2", true);
    m.set_leader(true);
    m.set_verdict_counts(&BTreeMap::from([
        ((Status::True, "VMHealthy".to_string()), 1),
        ((Status::False, "VMError".to_string()), 1),
        ((Status::False, "VMStopped".to_string()), 1),
    ]));
    m
}

struct Server {
    addr: SocketAddr,
    state: HttpState,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

async fn start(report: StatusReport) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = HttpState::new(report, metrics());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(http::serve(listener, state.clone(), async move {
        let _ = stopped.await;
    }));
    Server {
        addr,
        state,
        stop: Some(stop),
        task,
    }
}

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    // A fresh client per request: no pooled keep-alive connection outlives the call.
    let r = client()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .expect("request");
    let code = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (code, ct, r.text().await.expect("body"))
}

/// Runs the real binary off the async runtime, so the in-process server keeps serving.
async fn shim(args: Vec<String>) -> Output {
    let run = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
            .args(&args)
            .env_remove("CAPC_HEALTH_URL")
            .env_remove("CAPC_HEALTH_TOKEN")
            .env_remove("CAPC_HEALTH_TOKEN_FILE")
            .output()
            .expect("run capc-health-shim")
    });
    tokio::time::timeout(DEADLINE, run)
        .await
        .expect("status command finished within the deadline")
        .expect("join")
}

/// Cells of a table row: columns are separated by at least two spaces.
fn columns(row: &str) -> Vec<&str> {
    row.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_serve_the_report_metrics_and_probes_and_stop_on_shutdown() {
    let mut server = start(report()).await;
    let addr = server.addr;

    let (code, ct, body) = get(addr, "/status").await;
    assert_eq!(code, 200);
    assert!(ct.starts_with("application/json"), "{ct}");
    let back: StatusReport = serde_json::from_str(&body).expect("status JSON");
    assert_eq!(back, report());

    let (code, ct, body) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    assert_eq!(
        ct,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    for line in [
        r#"capc_health_transitions_total{status="False",reason="VMError"} 1"#,
        r#"capc_health_transitions_total{status="False",reason="VMStopped"} 1"#,
        r#"capc_health_escalations_total{result="annotated"} 1"#,
        r#"capc_health_escalations_total{result="MassFailure"} 1"#,
        r#"capc_health_cloudstack_calls_total{command="listVirtualMachines",result="timeout"} 5"#,
        r#"capc_health_verdicts{status="False",reason="VMStopped"} 1"#,
        r#"capc_health_mass_failure_held{scope="https://cs.example/client/api zone=z2"} 1"#,
        r#"capc_health_time_to_verdict_seconds_count{reason="VMError"} 1"#,
        "capc_health_rate_limit_wait_seconds_total 2.5",
        "capc_health_leader 1",
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "missing {line:?} in\n{body}"
        );
    }
    assert!(body.ends_with("# EOF\n"));

    // The controller keeps recording; /metrics shows it on the next scrape.
    server
        .state
        .metrics
        .record_transition(Status::False, "VMError");
    let (_, _, body) = get(addr, "/metrics").await;
    assert!(body
        .lines()
        .any(|l| l == r#"capc_health_transitions_total{status="False",reason="VMError"} 2"#));

    let (code, _, body) = get(addr, "/healthz").await;
    assert_eq!((code, body.trim()), (200, "ok"));

    let (code, _, body) = get(addr, "/readyz").await;
    assert_eq!(code, 503);
    assert_eq!(
        body.trim(),
        "not ready: credentials Secret staging/cloudstack-creds: key secret-key missing"
    );
    server.state.report.write().await.problems.clear();
    let (code, _, body) = get(addr, "/readyz").await;
    assert_eq!(
        (code, body.trim()),
        (503, "not ready: discovery/caches not done")
    );
    server.state.report.write().await.ready = true;
    let (code, _, body) = get(addr, "/readyz").await;
    assert_eq!((code, body.trim()), (200, "ready"));
    // /status follows the shared report too.
    let (_, _, body) = get(addr, "/status").await;
    let now: StatusReport = serde_json::from_str(&body).expect("status JSON");
    assert!(now.ready && now.problems.is_empty());

    let (code, ct, body) = get(addr, "/nope").await;
    assert_eq!(code, 404);
    assert!(ct.starts_with("application/json"), "{ct}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("404 JSON");
    assert_eq!(v["error"], "not found");
    assert_eq!(v["path"], "/nope");

    let _ = server.stop.take().expect("stop").send(());
    let ended = tokio::time::timeout(Duration::from_secs(10), &mut server.task)
        .await
        .expect("server stopped within 10s of the shutdown signal")
        .expect("join");
    assert!(ended.is_ok(), "{ended:?}");
    let refused = client().get(format!("http://{addr}/healthz")).send().await;
    assert!(refused.is_err(), "still serving after shutdown");
}

/// `/status` as a poller and a person use it at scale (issue 28): the whole document is the
/// same bytes until the report changes (ETag → 304), gzip when asked, and one cluster or only
/// the problems when asked; a bad query is a clear 400, an unknown cluster a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_has_etags_gzip_and_views_of_one_cluster_or_the_problems() {
    use std::io::Read as _;
    let server = start(report()).await;
    let addr = server.addr;
    let url = |path: &str| format!("http://{addr}{path}");
    let c = client();

    let first = c.get(url("/status")).send().await.expect("GET");
    assert_eq!(first.status().as_u16(), 200);
    let etag = first.headers()["etag"].to_str().expect("etag").to_string();
    assert!(etag.starts_with("W/\""), "{etag}");
    let body = first.bytes().await.expect("body");
    assert_eq!(
        serde_json::from_slice::<StatusReport>(&body).expect("JSON"),
        report()
    );

    // Unchanged: 304 without a body; the same bytes again without the validator.
    let again = c
        .get(url("/status"))
        .header("if-none-match", &etag)
        .send()
        .await
        .expect("GET");
    assert_eq!(again.status().as_u16(), 304);
    assert!(again.bytes().await.expect("body").is_empty());

    // gzip when accepted (and not when refused with q=0).
    let gz = c
        .get(url("/status"))
        .header("accept-encoding", "br, gzip")
        .send()
        .await
        .expect("GET");
    assert_eq!(gz.headers()["content-encoding"], "gzip");
    assert_eq!(gz.headers()["etag"].to_str().unwrap(), etag);
    let packed = gz.bytes().await.expect("body");
    let mut unpacked = Vec::new();
    flate2::read::GzDecoder::new(&packed[..])
        .read_to_end(&mut unpacked)
        .expect("gunzip");
    assert_eq!(unpacked, body);
    assert!(packed.len() < body.len());
    let refused = c
        .get(url("/status"))
        .header("accept-encoding", "gzip;q=0")
        .send()
        .await
        .expect("GET");
    assert!(refused.headers().get("content-encoding").is_none());

    // A change is a new document with a new ETag; the old validator no longer matches.
    server.state.report.write().await.problems = vec!["changed".into()];
    let changed = c
        .get(url("/status"))
        .header("if-none-match", &etag)
        .send()
        .await
        .expect("GET");
    assert_eq!(changed.status().as_u16(), 200);
    assert_ne!(changed.headers()["etag"].to_str().unwrap(), etag);
    let now: StatusReport = serde_json::from_slice(&changed.bytes().await.unwrap()).unwrap();
    assert_eq!(now.problems, ["changed"]);

    // One cluster.
    let (code, _, body) = get(addr, "/status?cluster=prod/prod").await;
    assert_eq!(code, 200, "{body}");
    let one: StatusReport = serde_json::from_str(&body).expect("JSON");
    assert_eq!(one.clusters.keys().collect::<Vec<_>>(), ["prod/prod"]);
    assert_eq!(one.clusters["prod/prod"], report().clusters["prod/prod"]);
    let (code, _, body) = get(addr, "/status?cluster=prod/nope").await;
    assert_eq!(code, 404);
    assert!(body.contains("no cluster prod/nope"), "{body}");

    // Only what needs a look: every Machine shown is not True, or carries a failed write or
    // an escalation; every one of those in the report is shown.
    let (code, _, body) = get(addr, "/status?problems=true").await;
    assert_eq!(code, 200, "{body}");
    let problems: StatusReport = serde_json::from_str(&body).expect("JSON");
    let machines = |r: &StatusReport| -> Vec<MachineReport> {
        r.clusters
            .values()
            .flat_map(|c| c.machines.values().cloned())
            .collect()
    };
    let needs_look = |m: &MachineReport| {
        m.verdict != Some(Status::True) || m.write_error.is_some() || m.escalation != "none"
    };
    let shown = machines(&problems);
    let all = machines(&report());
    let expected: Vec<MachineReport> = all.iter().filter(|m| needs_look(m)).cloned().collect();
    assert!(!shown.is_empty() && shown.len() < all.len(), "{shown:?}");
    assert_eq!(shown, expected);

    // A bad query is refused with what /status takes.
    let (code, _, body) = get(addr, "/status?problems=maybe").await;
    assert_eq!(code, 400);
    assert!(body.contains("cluster=<namespace>/<name>"), "{body}");
    let (code, _, _) = get(addr, "/status?colour=blue").await;
    assert_eq!(code, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orphans_command_prints_each_orphan_and_the_command_it_never_runs() {
    let server = start(report()).await;
    let url = format!("http://{}", server.addr);
    let out = shim(vec!["orphans".into(), "--url".into(), url.clone()]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text, stderr(&out));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "orphan VMs: 1 reported, 0 within their 900 s grace"
    );
    assert_eq!(
        columns(lines[2]),
        [
            "prod/prod",
            "prod-md-0-gone7",
            ORPHAN_ID,
            "Running",
            "prod/prod-md-0-gone7",
            "name-of-deleted",
            "2026-11-30T10:00:00Z",
            "https://cs.example/client/api zone=z1",
        ]
    );
    assert!(text.contains(&format!(
        "cmk destroy virtualmachine id={ORPHAN_ID} expunge=true"
    )));
    assert!(text.contains("never runs these"));
    // -o json is the orphans section, as /status has it.
    let out = shim(vec![
        "orphans".into(),
        "--url".into(),
        url.clone(),
        "-o".into(),
        "json".into(),
    ])
    .await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v[0]["vm_id"], ORPHAN_ID);
    assert_eq!(v[0]["kind"], "name-of-deleted");
    assert_eq!(v[0]["reported_at"], "2026-11-30T10:15:00Z");
    // `status` shows the same table.
    let out = shim(vec!["status".into(), "--url".into(), url]).await;
    assert!(stdout(&out).contains("orphan VMs: 1 reported"));
    assert!(stdout(&out).contains(ORPHAN_ID));
    // An unreachable shim is exit 3, as for `status`.
    let out = shim(vec![
        "orphans".into(),
        "--url".into(),
        "http://127.0.0.1:9".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("orphans: cannot reach"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_command_renders_tables_and_json() {
    let server = start(report()).await;
    let url = format!("http://{}", server.addr);

    let out = shim(vec!["status".into(), "--url".into(), url.clone()]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text, stderr(&out));
    println!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "mode: annotate (auto)  leader: yes  ready: no  APIs: Machine cluster.x-k8s.io/v1beta2, \
         Cluster v1beta2, MHC v1beta2, CloudStackMachine v1beta3, CloudStackFailureDomain v1beta3"
    );
    assert!(
        text.contains("- credentials Secret staging/cloudstack-creds: key secret-key missing\n"),
        "{text}"
    );

    let header = lines
        .iter()
        .find(|l| l.starts_with("CLUSTER"))
        .expect("machines header");
    let cols = [
        "CLUSTER",
        "MACHINE",
        "CP",
        "VM",
        "STATE",
        "VERDICT",
        "REASON",
        "SINCE",
        "ESCALATION",
        "ACTED ON",
        "MESSAGE",
    ];
    let starts: Vec<usize> = cols.iter().map(|c| header.find(c).expect(c)).collect();
    assert!(starts.windows(2).all(|w| w[0] < w[1]), "{header}");
    assert!(header.ends_with("MESSAGE"), "{header:?}");
    // Each cell begins at its header's column.
    let cell = |row: &str, i: usize| -> String {
        let end = starts.get(i + 1).copied().unwrap_or(row.len());
        row[starts[i]..end.min(row.len())].trim().to_string()
    };
    let row = |name: &str| -> String {
        lines
            .iter()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("row for {name} in\n{text}"))
            .to_string()
    };
    let annotated = row("prod-md-0-xyz34");
    let got: Vec<String> = (0..cols.len()).map(|i| cell(&annotated, i)).collect();
    assert_eq!(
        got,
        [
            "prod/prod",
            "prod-md-0-xyz34",
            "no",
            "1f0e4c2a-0000-4000-8000-000000000002",
            "Error",
            "False",
            "VMError",
            "2026-11-30T10:15:00Z",
            "annotated",
            "annotation",
            "VM in state Error for 2 polls",
        ]
    );
    let held = row("staging-md-0-held1");
    assert_eq!(cell(&held, 0), "staging/staging");
    assert_eq!(cell(&held, 5), "False");
    assert_eq!(cell(&held, 6), "VMStopped");
    assert_eq!(
        cell(&held, 8),
        "held (MassFailure: 5 of 6 Machines in scope failing)"
    );
    // A report without `acted_on` (an older shim) says whether an MHC selects it.
    assert_eq!(cell(&held, 9), "mhc: no");
    let cp = row("prod-cp-abc12");
    assert_eq!(
        (cell(&cp, 2).as_str(), cell(&cp, 5).as_str()),
        ("yes", "True")
    );
    let fresh = row("staging-md-0-new");
    assert_eq!(
        (cell(&fresh, 3), cell(&fresh, 5), cell(&fresh, 10)),
        ("-".to_string(), "-".to_string(), "-".to_string())
    );
    assert!(
        annotated.ends_with("VM in state Error for 2 polls"),
        "unpadded last column"
    );

    let scope_header = lines
        .iter()
        .find(|l| l.starts_with("SCOPE"))
        .expect("scopes header");
    for c in ["MACHINES", "LAST POLL", "LAST ERROR", "CALLS", "HELD"] {
        assert!(scope_header.contains(c), "{scope_header}");
    }
    let z2 = lines
        .iter()
        .find(|l| l.starts_with("https://cs.example/client/api zone=z2"))
        .expect("z2 scope row");
    assert_eq!(
        columns(z2),
        [
            "https://cs.example/client/api zone=z2",
            "2",
            "2026-11-30T10:29:31Z",
            "listVirtualMachines timed out after 15s",
            "17",
            "yes"
        ]
    );
    let z1 = lines
        .iter()
        .find(|l| l.starts_with("https://cs.example/client/api zone=z1"))
        .expect("z1 scope row");
    assert_eq!(
        columns(z1),
        [
            "https://cs.example/client/api zone=z1",
            "2",
            "2026-11-30T10:29:30Z",
            "-",
            "42",
            "no"
        ]
    );
    let fd = lines
        .iter()
        .find(|l| l.starts_with("prod/fd-z1"))
        .expect("failure domain row");
    let fd_cells: Vec<&str> = fd.split_whitespace().collect();
    assert_eq!(fd_cells, ["prod/fd-z1", "4", "1", "25%"]);

    let out = shim(vec![
        "status".into(),
        "--url".into(),
        url.clone(),
        "-o".into(),
        "json".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let parsed: StatusReport = serde_json::from_str(&stdout(&out)).expect("JSON output");
    assert_eq!(parsed, report());
    let raw: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(
        raw["clusters"]["staging/staging"]["machines"]["staging-md-0-held1"]["escalation"],
        "held"
    );
    assert_eq!(raw["scopes"][1]["calls"]["listVirtualMachines/timeout"], 5);

    // An explicit path is used as given: a path the shim does not serve is not a status.
    let out = shim(vec!["status".into(), "--url".into(), format!("{url}/nope")]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("HTTP 404"), "{}", stderr(&out));
    assert!(stdout(&out).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_command_exits_3_when_nothing_listens() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let out = shim(vec![
        "status".into(),
        "--url".into(),
        format!("http://user:hunter2@127.0.0.1:{port}"),
        "--timeout".into(),
        "3s".into(),
    ])
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("cannot reach"), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}/status")), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    assert!(stdout(&out).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_command_exits_3_when_the_server_never_answers() {
    // Accepts connections but never replies: only the timeout ends the wait.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let started = std::time::Instant::now();
    let out = shim(vec![
        "status".into(),
        "--url".into(),
        format!("http://{addr}"),
        "--timeout".into(),
        "1s".into(),
    ])
    .await;
    hold.abort();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("timed out"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_command_exits_1_for_an_html_page_and_for_foreign_json() {
    let app = axum::Router::new()
        .route(
            "/status",
            axum::routing::get(|| async {
                axum::response::Html("<html><body><h1>Welcome to nginx!</h1></body></html>")
            }),
        )
        .route(
            "/other/status",
            axum::routing::get(|| async { axum::Json(serde_json::json!({"hello": "world"})) }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });

    let out = shim(vec![
        "status".into(),
        "--url".into(),
        format!("http://{addr}/"),
    ])
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not JSON"), "{err}");
    assert!(err.contains("text/html"), "{err}");
    assert!(err.contains("not a status document"), "{err}");
    assert!(stdout(&out).is_empty());

    let out = shim(vec![
        "status".into(),
        "--url".into(),
        format!("http://{addr}/other/status"),
    ])
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("answered JSON that is not a status document"),
        "{err}"
    );

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}

/// A stand-in for the secured shim: `/status` is the report for `Bearer good-token-7c1e`, 403
/// for any other token, 401 without one (the real checks against the API server are in
/// tests/http_auth.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_command_sends_its_token_and_exits_4_when_refused() {
    const GOOD: &str = "good-token-7c1e";
    async fn guarded(headers: axum::http::HeaderMap) -> axum::response::Response {
        use axum::response::IntoResponse;
        match headers.get("authorization").and_then(|v| v.to_str().ok()) {
            Some(v) if v == format!("Bearer {GOOD}") => axum::Json(report()).into_response(),
            Some(_) => (
                axum::http::StatusCode::FORBIDDEN,
                "Forbidden: user \"system:serviceaccount:x:y\" may not get /status\n",
            )
                .into_response(),
            None => (
                axum::http::StatusCode::UNAUTHORIZED,
                "Unauthorized: no bearer token\n",
            )
                .into_response(),
        }
    }
    let app = axum::Router::new().route("/status", axum::routing::get(guarded));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{GOOD}\n")).unwrap();
    let token_file = token_file.display().to_string();

    for auth in [
        vec!["--token".to_string(), GOOD.to_string()],
        vec!["--token-file".to_string(), token_file.clone()],
    ] {
        let mut args = vec![
            "status".into(),
            "--url".into(),
            url.clone(),
            "-o".into(),
            "json".into(),
        ];
        args.extend(auth.clone());
        let out = shim(args).await;
        assert_eq!(out.status.code(), Some(0), "{auth:?}: {}", stderr(&out));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(doc["leader"], true);
        assert!(
            stderr(&out).is_empty(),
            "no warning on loopback: {}",
            stderr(&out)
        );
    }
    let out = shim(vec![
        "orphans".into(),
        "--url".into(),
        url.clone(),
        "--token-file".into(),
        token_file,
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // The token from the environment works, and --help never shows its value.
    let from_env = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
            .args(args)
            .env("CAPC_HEALTH_TOKEN", GOOD)
            .env_remove("CAPC_HEALTH_TOKEN_FILE")
            .env_remove("CAPC_HEALTH_URL")
            .output()
            .expect("runs")
    };
    let u = url.clone();
    let out = tokio::task::spawn_blocking(move || from_env(&["status", "--url", &u]))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let help = from_env(&["status", "--help"]);
    assert!(
        stdout(&help).contains("CAPC_HEALTH_TOKEN"),
        "{}",
        stdout(&help)
    );
    assert!(
        !stdout(&help).contains(GOOD),
        "the token's value is in --help"
    );

    let out = shim(vec!["status".into(), "--url".into(), url.clone()]).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("HTTP 401") && err.contains("no token was sent"),
        "{err}"
    );
    let out = shim(vec![
        "status".into(),
        "--url".into(),
        url.clone(),
        "--token".into(),
        "someone-else".into(),
    ])
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("HTTP 403") && err.contains("may not get /status"),
        "{err}"
    );
    assert!(
        !err.contains("someone-else"),
        "the token is in the message: {err}"
    );
    assert!(stdout(&out).is_empty());

    // A token file that cannot be used is a usage error, before any request.
    let out = shim(vec![
        "status".into(),
        "--url".into(),
        url,
        "--token-file".into(),
        "/nonexistent/token".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--token-file /nonexistent/token"));

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}
