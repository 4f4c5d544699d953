//! Writes that are still true when they land, and silence after the Lease is released (issue 40
//! items 4 and 5), against the real kube-apiserver (hack/apiserver) and `cloudstack-sim`:
//!
//! 1. a writer held back by a slow API server (4.5 s per PATCH, one at a time; the longest
//!    `--kube-timeout` is 5 s, so a 5 s PATCH could only time out) does not send a write whose
//!    Machine recovered before its turn: in annotate mode the remediate annotation, in condition
//!    mode the `False` condition (what the MHC acts on there);
//! 2. a Machine deleted and recreated under the same name refuses the write queued for the old
//!    one (its `uid` travels with the write), the refusal is counted and the new Machine is
//!    decided again;
//! 3. after SIGTERM of `capc-health-shim run`, no write reaches the API server once the Lease
//!    has been released — seen by a recording proxy between the shim and the API server, not by
//!    the shim's counters.
//!
//! Each writes its row to `target/fault-matrix/<test>.json` (as tests/fault_matrix_kube.rs).
//! Run in both CAPI stacks (capi-1.9: annotate mode, capi-1.13: condition mode).

mod kube_support;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capc_health_shim::controller::cycle::Controller;
use capc_health_shim::status::board::StatusBoard;
use capi_model::apis::Mode;
use cloudstack_sim::Fault;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube_support::matrix::{out_dir, MatrixRow};
use kube_support::{get, kube_client, Fixture};
use serde_json::{json, Value};

/// One test at a time: two shared cores, and timing matters here.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The slow API server's time per PATCH.
const SLOW: Duration = Duration::from_millis(4500);

// ---------------------------------------------------------------------------------------------
// A slow API server, as the shim's client sees it.

/// The PATCH requests a client sent (after their delay): path and body.
type Sent = Arc<Mutex<Vec<(String, String)>>>;

/// A client of the test API server whose every PATCH waits `delay_ms` (changeable while it
/// runs) before it is sent, and is recorded.
async fn slow_client(delay_ms: Arc<AtomicU64>) -> (kube::Client, Sent) {
    let path = test_support::apiserver::kubeconfig_path();
    let yaml = std::fs::read_to_string(&path).expect("the test API server's kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig parses");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig usable");
    let sent: Sent = Arc::default();
    let record = sent.clone();
    let hold =
        tower::filter::AsyncFilterLayer::new(move |req: http::Request<kube::client::Body>| {
            let (record, delay_ms) = (record.clone(), delay_ms.clone());
            async move {
                if req.method() != http::Method::PATCH {
                    return Ok::<_, tower::BoxError>(req);
                }
                let delay = delay_ms.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let (parts, body) = req.into_parts();
                let bytes = body.collect_bytes().await?;
                record.lock().unwrap().push((
                    parts.uri.path().to_string(),
                    String::from_utf8_lossy(&bytes).into_owned(),
                ));
                Ok(http::Request::from_parts(
                    parts,
                    kube::client::Body::from(bytes),
                ))
            }
        });
    let stack = tower::ServiceBuilder::new().layer(hold).buffer(64);
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&stack)
        .build();
    (client, sent)
}

// ---------------------------------------------------------------------------------------------
// Machines.

fn machines(f: &Fixture) -> Api<DynamicObject> {
    Api::namespaced_with(f.client.clone(), &f.ns, &f.resources.machine)
}

async fn uid(f: &Fixture, name: &str) -> String {
    get(&f.client, &f.ns, &f.resources.machine, name).await["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string()
}

async fn set_uncovered(f: &Fixture, name: &str, uncovered: bool) {
    let value = if uncovered { json!("") } else { Value::Null };
    machines(f)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"uncovered": value}}})),
        )
        .await
        .expect("label");
}

/// Drops every condition in the list our condition lives in (another writer did): the shim
/// then writes ours again.
async fn drop_conditions(f: &Fixture, name: &str) {
    let pointer = f.conditions_pointer(); // "/status/v1beta2/conditions" or "/status/conditions"
    let mut patch = json!([]);
    for key in pointer.trim_start_matches('/').split('/').rev() {
        patch = json!({ key: patch });
    }
    machines(f)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("drop conditions");
}

/// Deletes Machine `name` and creates it again with the same labels, owner and spec (a new
/// `uid`); returns the new uid. Test Machines have no finalizers: the delete is immediate.
async fn recreate(f: &Fixture, name: &str) -> String {
    let api = machines(f);
    let old = get(&f.client, &f.ns, &f.resources.machine, name).await;
    api.delete(name, &DeleteParams::default())
        .await
        .expect("delete");
    let until = Instant::now() + Duration::from_secs(10);
    while api.get_opt(name).await.expect("get").is_some() {
        assert!(Instant::now() < until, "Machine {name} not gone in 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = json!({
        "apiVersion": old["apiVersion"], "kind": "Machine",
        "metadata": {"name": name, "namespace": f.ns, "labels": old["metadata"]["labels"],
            "ownerReferences": old["metadata"]["ownerReferences"]},
        "spec": old["spec"],
    });
    let obj: DynamicObject = serde_json::from_value(body).expect("machine");
    let made = api
        .create(&PostParams::default(), &obj)
        .await
        .expect("create");
    made.metadata.uid.expect("new uid")
}

/// `capc_health_writes_total{kind, outcome}` of a controller.
fn writes(c: &Controller, kind: &str, outcome: &str) -> u64 {
    c.metrics()
        .encode()
        .lines()
        .find(|l| {
            l.starts_with("capc_health_writes_total{")
                && l.contains(&format!(r#"kind="{kind}""#))
                && l.contains(&format!(r#"outcome="{outcome}""#))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// `(escalation, escalation_detail, verdict)` of Machine `name` in the last `/status`; the
/// verdict as decided: a pending one (not on the Machine yet) before the published one.
async fn reported(
    report: &StatusBoard,
    f: &Fixture,
    name: &str,
) -> Option<(String, String, String)> {
    let r = report.read().await;
    let m = r
        .clusters
        .get(&format!("{}/c1", f.ns))?
        .machines
        .get(name)?;
    Some((
        m.escalation.clone(),
        m.escalation_detail.clone().unwrap_or_default(),
        m.pending
            .as_ref()
            .map(|p| p.verdict)
            .or(m.verdict)
            .map(|v| v.to_string())
            .unwrap_or_default(),
    ))
}

/// Cycles every 300 ms until `done` (deadline `within`).
async fn cycle_until<F, Fut>(c: &mut Controller, within: Duration, what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + within;
    loop {
        c.cycle(jiff::Timestamp::now()).await;
        if done().await {
            return;
        }
        assert!(Instant::now() < until, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A write held back by a slow API server, whose Machine recovered before its turn.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_write_whose_machine_recovered_before_its_turn_is_not_sent() {
    let _serial = SERIAL.lock().await;
    let mut row = MatrixRow::new(
        "write_of_a_recovered_machine",
        "slow API server (4.5 s per PATCH, one at a time); the VM recovers while its write waits",
        "the queued write (annotate mode: remediate annotation; condition mode: False) is not sent; counted superseded",
    );
    let blockers = ["m-b0", "m-b1", "m-b2"];
    let vms = [
        ("vm-t", "healthy", "Running"),
        ("vm-b0", "healthy", "Running"),
        ("vm-b1", "healthy", "Running"),
        ("vm-b2", "healthy", "Running"),
    ];
    let f = Fixture::new(kube_client().await, &vms).await;
    let annotate = f.choice.mode == Mode::Annotate;
    f.machine("m-t", Some("vm-t"), false, "fd1").await;
    for (i, b) in blockers.iter().enumerate() {
        f.machine(b, Some(&format!("vm-b{i}")), false, "fd1").await;
    }
    // Not escalated while it fails: its annotation is queued only when the test covers it.
    set_uncovered(&f, "m-t", true).await;
    let delay = Arc::new(AtomicU64::new(0));
    let (client, sent) = slow_client(delay.clone()).await;
    // A poll interval of 10 s puts the writer's age bound (2 polls + --kube-timeout) at 25 s:
    // the write waits less than that, so only its supersession can stop it.
    let (c, report) = f
        .controller_as(
            client,
            &[
                "--max-concurrent-writes",
                "1",
                "--poll-interval",
                "10s",
                "--nic-detached-grace",
                "1s",
            ],
        )
        .await;
    let mut c = c.detached_writes();
    let all: Vec<&str> = std::iter::once("m-t").chain(blockers).collect();
    cycle_until(
        &mut c,
        Duration::from_secs(90),
        "every Machine True",
        || async {
            for m in &all {
                if f.verdict(m).await.0.map(|v| v.0) != Some("True".into()) {
                    return false;
                }
            }
            true
        },
    )
    .await;
    row.saw("every Machine True");

    // m-t's VM loses its NIC; in annotate mode the shim publishes False first (m-t is not
    // covered: no annotation yet).
    f.sim.inject_fault("vm-t", Fault::DetachNic).expect("fault");
    if annotate {
        cycle_until(&mut c, Duration::from_secs(60), "m-t False", || async {
            f.verdict("m-t").await.0.map(|v| v.0) == Some("False".into())
        })
        .await;
        row.saw("m-t False (uncovered: not escalated)");
    }
    // The API server turns slow; three blockers' conditions are dropped by another writer, so
    // their rewrites (4.5 s each) queue ahead of m-t's write.
    delay.store(SLOW.as_millis() as u64, Ordering::SeqCst);
    for b in blockers {
        drop_conditions(&f, b).await;
    }
    if annotate {
        set_uncovered(&f, "m-t", false).await;
    }
    let want = if annotate {
        "the remediate annotation is being written"
    } else {
        "the condition is being written"
    };
    let queued_at = Instant::now();
    cycle_until(
        &mut c,
        Duration::from_secs(30),
        "m-t's write queued",
        || async {
            reported(&report, &f, "m-t")
                .await
                .is_some_and(|(_, detail, verdict)| detail == want && verdict == "False")
        },
    )
    .await;
    assert!(
        c.writes_in_flight() >= 2,
        "m-t's write waits behind the blockers' ({} in flight)",
        c.writes_in_flight()
    );
    if !annotate {
        // Queued is not published: /status shows what the Machine carries, the False apart,
        // and the gauge does not count it as False yet.
        let r = report.read().await;
        let m = &r.clusters[&format!("{}/c1", f.ns)].machines["m-t"];
        let pending = m
            .pending
            .as_ref()
            .map(|p| (p.verdict.to_string(), p.state.clone()));
        assert_eq!(
            m.verdict.map(|v| v.to_string()).as_deref(),
            Some("True"),
            "{m:?}"
        );
        assert_eq!(pending, Some(("False".into(), "queued".into())), "{m:?}");
        let text = c.metrics().encode();
        let counted_false = text
            .lines()
            .filter(|l| l.starts_with("capc_health_machines{") && l.contains("status=\"False\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
        assert_eq!(counted_false, 0.0, "a queued False counted as published");
        row.saw("while queued, /status shows m-t True with its False pending (queued), capc_health_machines counts no False".to_string());
    }
    row.saw(format!(
        "m-t's write queued ({want}) {:.1} s after the blockers' rewrites, {} writes in flight",
        queued_at.elapsed().as_secs_f64(),
        c.writes_in_flight()
    ));

    // The VM recovers before the write's turn; the shim decides again while it waits.
    f.sim.clear_faults("vm-t").expect("clear");
    let recovered_at = Instant::now();
    cycle_until(
        &mut c,
        Duration::from_secs(60),
        "m-t decided True",
        || async {
            reported(&report, &f, "m-t")
                .await
                .is_some_and(|(_, _, v)| v == "True")
        },
    )
    .await;
    let decided_true = recovered_at.elapsed().as_secs_f64();
    // Every queued write has had its turn; the Machine is watched at the API server meanwhile.
    let mut seen_false = false;
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        c.cycle(jiff::Timestamp::now()).await;
        let (v, annotated) = f.verdict("m-t").await;
        seen_false |= v.as_ref().is_some_and(|v| v.0 == "False") && !annotate;
        if c.writes_in_flight() == 0 {
            break;
        }
        assert!(!annotated, "m-t was annotated after its VM recovered");
        assert!(Instant::now() < until, "writes not done in 90 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.cycle(jiff::Timestamp::now()).await;
    let (v, annotated) = f.verdict("m-t").await;
    let kind = if annotate { "annotation" } else { "condition" };
    let superseded = writes(&c, kind, "superseded");
    let to_t: Vec<String> = sent
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _)| p.contains("/machines/m-t"))
        .map(|(p, b)| format!("{p} {b}"))
        .collect();
    row.measure("decided_true_after_recovery_seconds", decided_true);
    row.measure("superseded", superseded);
    row.measure("patches_to_m_t", to_t.len() as u64);
    row.saw(format!(
        "m-t now {v:?}, annotated: {annotated}; {kind} writes superseded: {superseded}; PATCHes sent to m-t: {to_t:?}"
    ));
    assert!(!annotated, "m-t was annotated after its VM recovered");
    assert!(
        !seen_false,
        "the False decided before the recovery landed on m-t"
    );
    if !annotate {
        assert!(
            !to_t.iter().any(|p| p.contains(r#""status":"False""#)),
            "a False condition was sent to m-t: {to_t:?}"
        );
    } else {
        assert!(
            !to_t.iter().any(|p| p.contains("remediate-machine")),
            "the annotation was sent to m-t: {to_t:?}"
        );
    }
    assert_eq!(superseded, 1, "the queued write counted as superseded");
    assert_eq!(v.map(|v| v.0), Some("True".into()), "m-t ends True");
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 2. A Machine deleted and recreated under the same name while a write for it waits.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_recreated_machine_refuses_the_write_queued_for_the_old_one() {
    let _serial = SERIAL.lock().await;
    let mut row = MatrixRow::new(
        "write_to_a_recreated_machine",
        "Machine deleted and recreated (same name, new uid) while its write waits behind a slow API server (4.5 s per PATCH)",
        "the write is not made to the new Machine (condition: uid checked against the watch cache before sending; annotation: uid and resourceVersion in the patch, refused by the API server), counted precondition_failed, and the new Machine is decided again",
    );
    let f = Fixture::new(
        kube_client().await,
        &[
            ("vm-b0", "healthy", "Running"),
            ("vm-b1", "healthy", "Running"),
            ("vm-r", "healthy", "Running"),
            ("vm-a", "healthy", "Running"),
        ],
    )
    .await;
    let annotate = f.choice.mode == Mode::Annotate;
    // Two blockers whose rewrites queue ahead of m-r's (targets go in name order).
    f.machine("m-b0", Some("vm-b0"), false, "fd1").await;
    f.machine("m-b1", Some("vm-b1"), false, "fd1").await;
    f.machine("m-r", Some("vm-r"), false, "fd1").await;
    f.machine("m-a", Some("vm-a"), false, "fd1").await;
    set_uncovered(&f, "m-a", true).await;
    let delay = Arc::new(AtomicU64::new(0));
    let (client, sent) = slow_client(delay.clone()).await;
    let (c, report) = f
        .controller_as(
            client,
            &[
                "--max-concurrent-writes",
                "1",
                "--poll-interval",
                "10s",
                "--nic-detached-grace",
                "1s",
            ],
        )
        .await;
    let mut c = c.detached_writes();
    f.sim.inject_fault("vm-a", Fault::DetachNic).expect("fault");
    cycle_until(
        &mut c,
        Duration::from_secs(90),
        "m-r, m-b* True, m-a False",
        || async {
            f.verdict("m-r").await.0.map(|v| v.0) == Some("True".into())
                && f.verdict("m-b0").await.0.map(|v| v.0) == Some("True".into())
                && f.verdict("m-b1").await.0.map(|v| v.0) == Some("True".into())
                && f.verdict("m-a").await.0.map(|v| v.0) == Some("False".into())
        },
    )
    .await;
    let old_uid = uid(&f, "m-r").await;

    // The condition: dropped by another writer on m-r and both blockers, so the shim writes
    // them again — slowly, one at a time, m-r's last.
    delay.store(SLOW.as_millis() as u64, Ordering::SeqCst);
    for m in ["m-b0", "m-b1", "m-r"] {
        drop_conditions(&f, m).await;
    }
    cycle_until(
        &mut c,
        Duration::from_secs(20),
        "m-r's rewrite queued",
        || async {
            reported(&report, &f, "m-r")
                .await
                .is_some_and(|(_, d, _)| d == "the condition is being written")
        },
    )
    .await;
    let queued = c.writes_in_flight();
    assert!(
        queued >= 2,
        "m-r's rewrite waits behind a blocker's ({queued} in flight)"
    );
    let new_uid = recreate(&f, "m-r").await;
    assert_ne!(old_uid, new_uid);
    row.saw(format!(
        "m-r recreated while its condition rewrite waited ({queued} writes in flight; uid {old_uid} → {new_uid})"
    ));
    c.writes_done().await;
    let (v, _) = f.verdict("m-r").await;
    let to_r: Vec<String> = sent
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _)| p.contains("/machines/m-r"))
        .map(|(p, b)| format!("{p} {b}"))
        .collect();
    row.saw(format!(
        "after its turn: the new m-r carries {v:?}; PATCHes sent to m-r: {}",
        to_r.len()
    ));
    assert!(
        v.is_none(),
        "the condition decided for the old m-r landed on the new one: {v:?} ({to_r:?})"
    );
    let summary = c.cycle(jiff::Timestamp::now()).await;
    let refused = writes(&c, "condition", "precondition_failed");
    row.measure("condition_precondition_failed", refused);
    row.saw(format!("cycle summary: {summary:?}"));
    assert_eq!(refused, 1, "the refusal is counted");
    assert!(
        summary
            .problems
            .iter()
            .any(|p| p.contains("refused by the API server")),
        "the cycle says so: {:?}",
        summary.problems
    );

    // The annotation (annotate mode): m-a covered now, its annotation held, m-a recreated.
    if annotate {
        set_uncovered(&f, "m-a", false).await;
        cycle_until(
            &mut c,
            Duration::from_secs(20),
            "m-a's annotation queued",
            || async {
                reported(&report, &f, "m-a")
                    .await
                    .is_some_and(|(_, d, _)| d == "the remediate annotation is being written")
            },
        )
        .await;
        recreate(&f, "m-a").await;
        c.writes_done().await;
        let (_, annotated) = f.verdict("m-a").await;
        row.saw(format!(
            "after the held annotation: new m-a annotated: {annotated}"
        ));
        assert!(
            !annotated,
            "the annotation decided for the old m-a landed on the new one"
        );
        c.cycle(jiff::Timestamp::now()).await;
        let refused = writes(&c, "annotation", "precondition_failed");
        row.measure("annotation_precondition_failed", refused);
        assert_eq!(refused, 1, "the annotation's refusal is counted");
    } else {
        row.saw("condition mode: no annotation to refuse (the condition part applies)");
    }

    // Decided again: the new m-r gets its own condition.
    delay.store(0, Ordering::SeqCst);
    cycle_until(
        &mut c,
        Duration::from_secs(60),
        "the new m-r decided again",
        || async { f.verdict("m-r").await.0.map(|v| v.0) == Some("True".into()) },
    )
    .await;
    assert_eq!(uid(&f, "m-r").await, new_uid);
    let counted = report.read().await.writes.clone();
    row.saw(format!("/status writes: {counted:?}"));
    assert_eq!(
        counted.get("condition/precondition_failed"),
        Some(&1),
        "/status shows the refusal: {counted:?}"
    );
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 3. SIGTERM: nothing written after the Lease is released.

/// A request that reached the API server through the recording proxy.
#[derive(Debug, Clone)]
struct Forwarded {
    at: Instant,
    method: String,
    path: String,
}

/// A plain-HTTP proxy on loopback in front of the test API server that records every request
/// as it forwards it (with the test's own credentials) and answers Machine PATCHes `slow` late
/// (the write is done at once; the answer is slow, as from an API server whose answers lag).
async fn recording_proxy(slow: Duration) -> (u16, Arc<Mutex<Vec<Forwarded>>>) {
    let client = kube_client().await;
    let log: Arc<Mutex<Vec<Forwarded>>> = Arc::default();
    let record = log.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let (client, record) = (client.clone(), record.clone());
        async move {
            let (mut parts, body) = req.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, 64 << 20).await else {
                return http::Response::builder()
                    .status(400)
                    .body(axum::body::Body::empty())
                    .unwrap();
            };
            parts.headers.remove(http::header::HOST);
            let path = parts
                .uri
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default();
            let method = parts.method.to_string();
            let slow_answer = parts.method == http::Method::PATCH && path.contains("/machines/");
            record.lock().unwrap().push(Forwarded {
                at: Instant::now(),
                method,
                path,
            });
            let resp = client
                .send(http::Request::from_parts(
                    parts,
                    kube::client::Body::from(bytes.to_vec()),
                ))
                .await;
            if slow_answer {
                tokio::time::sleep(slow).await;
            }
            match resp {
                Ok(r) => r.map(axum::body::Body::new),
                Err(_) => http::Response::builder()
                    .status(502)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (port, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn after_sigterm_no_write_reaches_the_api_server_once_the_lease_is_released() {
    let _serial = SERIAL.lock().await;
    let mut row = MatrixRow::new(
        "silence_after_release",
        "SIGTERM while a slow API server (Machine PATCHes answered 4 s late) has writes queued; a scraper holds /metrics mid-request",
        "no write reaches the API server after the Lease release (recording proxy)",
    );
    const N: usize = 8;
    let vms: Vec<(String, &str, &str)> = (0..N)
        .map(|i| (format!("vm-{i}"), "healthy", "Running"))
        .collect();
    let specs: Vec<(&str, &str, &str)> = vms.iter().map(|(a, b, c)| (a.as_str(), *b, *c)).collect();
    let f = Fixture::new(kube_client().await, &specs).await;
    for i in 0..N {
        f.machine(&format!("m-{i}"), Some(&format!("vm-{i}")), false, "fd1")
            .await;
    }
    let (port, log) = recording_proxy(Duration::from_secs(4)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: p\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: p\n    user: u\ncurrent-context: c\n"
        ),
    )
    .expect("kubeconfig");
    let lease = format!("capc-health-shim-{}", &f.ns[4..]);
    let addr = format!("127.0.0.1:{}", kube_support::free_port());
    let log_path = out_dir().join("logs/silence_after_release.log");
    let file = std::fs::File::create(&log_path).expect("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
        .args([
            "--log",
            "info,capc_health_shim=debug",
            "run",
            "--status-addr",
            &addr,
            "--insecure-serving",
            "--namespace",
            &f.ns,
            "--lease-namespace",
            &f.ns,
            "--lease-name",
            &lease,
            "--poll-interval",
            "1s",
            "--stats-interval",
            "1s",
            "--max-concurrent-writes",
            "1",
            "--mass-failure-count",
            "50",
            "--mass-failure-percent",
            "100",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("HOSTNAME", "silence-a")
        .env_remove("RUST_LOG")
        .stdout(Stdio::from(file.try_clone().expect("fd")))
        .stderr(Stdio::from(file))
        .spawn()
        .expect("start the shim");
    let machine_writes = |log: &Vec<Forwarded>| {
        log.iter()
            .filter(|r| r.method == "PATCH" && r.path.contains("/machines/"))
            .count()
    };
    // Leading and writing: the first condition write reached the API server.
    let until = Instant::now() + Duration::from_secs(120);
    while machine_writes(&log.lock().unwrap()) == 0 {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the shim exited; see {}",
            log_path.display()
        );
        assert!(Instant::now() < until, "no Machine write within 120 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A scraper mid-request: the HTTP server's graceful stop waits for it (up to its 6 s),
    // the window in which an unstopped writer went on sending.
    let mut scraper = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("scraper");
    tokio::io::AsyncWriteExt::write_all(&mut scraper, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("half a request");
    let before = machine_writes(&log.lock().unwrap());
    let sigterm = Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill")
        .success());
    let until = Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < until,
            "the shim did not exit within 40 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    drop(scraper);
    let exited = sigterm.elapsed().as_secs_f64();
    let log = log.lock().unwrap().clone();
    let after: Vec<&Forwarded> = log.iter().filter(|r| r.at >= sigterm).collect();
    let lease_writes: Vec<&&Forwarded> = after
        .iter()
        .filter(|r| r.method != "GET" && r.path.contains("/leases/"))
        .collect();
    let release = lease_writes
        .last()
        .map(|r| r.at)
        .expect("the Lease was released through the proxy after SIGTERM");
    let late: Vec<String> = after
        .iter()
        .filter(|r| r.at > release && r.method != "GET" && !r.path.contains("/leases/"))
        .map(|r| {
            format!(
                "{} {} {:.2} s after the release",
                r.method,
                r.path,
                (r.at - release).as_secs_f64()
            )
        })
        .collect();
    let machine_after_sigterm = after
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.contains("/machines/"))
        .count();
    let with_condition = {
        let mut n = 0;
        for i in 0..N {
            n += usize::from(f.verdict(&format!("m-{i}")).await.0.is_some());
        }
        n
    };
    row.measure("machine_writes_before_sigterm", before as u64);
    row.measure("machine_writes_after_sigterm", machine_after_sigterm as u64);
    row.measure(
        "release_after_sigterm_seconds",
        (release - sigterm).as_secs_f64(),
    );
    row.measure("exit_after_sigterm_seconds", exited);
    row.measure("writes_after_release", late.len() as u64);
    row.saw(format!(
        "exit {:?} {exited:.1} s after SIGTERM; Lease released {:.1} s after SIGTERM; {machine_after_sigterm} Machine PATCHes after SIGTERM; {with_condition}/{N} Machines carry a condition; writes after the release: {late:?}",
        status.code(),
        (release - sigterm).as_secs_f64()
    ));
    assert!(
        with_condition < N,
        "every write was done before the shim stopped: the test would prove nothing"
    );
    assert!(
        late.is_empty(),
        "writes reached the API server after the Lease was released: {late:#?}"
    );
    assert_eq!(
        status.code(),
        Some(0),
        "clean exit; log {}",
        log_path.display()
    );
    f.cleanup().await;
}
