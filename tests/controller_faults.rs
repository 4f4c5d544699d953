//! The controller against a real kube-apiserver (hack/apiserver) and `cloudstack-sim` when
//! things go wrong around it: a concurrent writer patching the same Machine status the way
//! CAPI's patch helper does, a Node that CAPI has not linked, CloudStack answering HTML or
//! rejecting rotated keys, broken or missing endpoint Secrets, and a CloudStack outage.
//! Every test runs under both CRD profiles (CAPI 1.9: annotate mode; 1.13: condition mode).

mod kube_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capc_health_shim::controller::cycle::{Controller, CycleSummary};
use capc_health_shim::verdict::Status;
use cloudstack_sim::{ApiFaults, Fault};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube_support::{ar, get, is, kube_client, merge_patch, Fixture, SIM_SECRET};
use serde_json::{json, Value};

type State = BTreeMap<String, (Option<(String, String)>, bool)>;

/// What a run of cycles saw: every state after every cycle, and every cycle's summary.
struct Run {
    cycles: usize,
    elapsed: Duration,
    last: State,
    seen: Vec<State>,
    summaries: Vec<CycleSummary>,
}

impl Run {
    /// Whether Machine `name` was ever published with `status`.
    fn ever(&self, name: &str, status: &str) -> bool {
        self.seen.iter().any(|s| {
            s.get(name)
                .and_then(|v| v.0.as_ref())
                .is_some_and(|(st, _)| st == status)
        })
    }

    /// Appends a later run (for "and it stays so" checks).
    fn extend(&mut self, later: Run) {
        self.cycles += later.cycles;
        self.elapsed += later.elapsed;
        self.last = later.last;
        self.seen.extend(later.seen);
        self.summaries.extend(later.summaries);
    }

    fn annotations(&self) -> usize {
        self.summaries.iter().map(|s| s.annotations).sum()
    }
}

/// Cycles (≈ every 400 ms) until `done` holds for the current verdicts; panics at `deadline`.
async fn run_until(
    f: &Fixture,
    controller: &mut Controller,
    names: &[&str],
    deadline: Duration,
    done: impl Fn(&State) -> bool,
) -> Run {
    let start = Instant::now();
    let mut run = Run {
        cycles: 0,
        elapsed: Duration::ZERO,
        last: State::new(),
        seen: Vec::new(),
        summaries: Vec::new(),
    };
    loop {
        let summary = controller.cycle(jiff::Timestamp::now()).await;
        run.cycles += 1;
        run.summaries.push(summary);
        let mut state = State::new();
        for n in names {
            state.insert(n.to_string(), f.verdict(n).await);
        }
        run.seen.push(state.clone());
        if done(&state) {
            run.last = state;
            run.elapsed = start.elapsed();
            return run;
        }
        assert!(
            start.elapsed() < deadline,
            "not reached within {deadline:?} ({} cycles): {state:#?}\nproblems of the last cycle: {:?}",
            run.cycles,
            run.summaries.last().map(|s| &s.problems)
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
}

/// Annotate mode (CAPI 1.9 profile) or condition mode (1.13), as discovery chose.
fn annotate_mode(f: &Fixture) -> bool {
    kube_support::annotate_mode(f)
}

async fn resource_version(f: &Fixture, name: &str) -> String {
    get(&f.client, &f.ns, &f.resources.machine, name).await["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string()
}

/// A report as JSON must never carry a secret key.
fn assert_no_secret(report: &impl serde::Serialize, secrets: &[&str]) {
    let text = serde_json::to_string(report).expect("report serializes");
    for s in secrets {
        assert!(
            !text.contains(s),
            "a secret key value appears in /status (value not shown)"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A concurrent writer patching the Machine status like CAPI's patch helper.

const WRITER_TYPES: [&str; 2] = ["Ready", "InfrastructureReady"];

/// Inserts or replaces the entry of `type` in a conditions list.
fn upsert(list: &mut Vec<Value>, entry: Value) {
    match list.iter_mut().find(|c| c["type"] == entry["type"]) {
        Some(c) => *c = entry,
        None => list.push(entry),
    }
}

fn writer_time(tick: u64) -> String {
    jiff::Timestamp::from_second(1_700_000_000 + tick as i64)
        .expect("timestamp")
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[derive(Debug, Default)]
struct WriterOutcome {
    /// Successful status patches.
    writes: u64,
    /// 409 answers (each retried after a fresh GET).
    conflicts: u64,
    /// The tick of the last successful write.
    last_tick: u64,
    /// GETs where our condition was missing after it had been seen once.
    lost_ours: u64,
}

/// GET latest → upsert CAPI-owned conditions (metav1 list, and the legacy clusterv1 list on
/// v1beta1) → JSON merge patch of `status` carrying `metadata.resourceVersion`; on 409 start
/// over. Every `period` until `stop`.
async fn capi_like_writer(
    api: Api<DynamicObject>,
    name: String,
    metav1_pointer: &'static str,
    legacy: bool,
    period: Duration,
    stop: Arc<AtomicBool>,
) -> WriterOutcome {
    let params = PatchParams {
        field_manager: Some("capi-test-writer".into()),
        ..Default::default()
    };
    let mut out = WriterOutcome::default();
    let mut seen_ours = false;
    let mut tick = 0u64;
    while !stop.load(Ordering::SeqCst) {
        tick += 1;
        loop {
            let latest =
                serde_json::to_value(api.get(&name).await.expect("writer GET")).expect("json");
            let ours = kube_support::condition(&latest, metav1_pointer).is_some();
            if ours {
                seen_ours = true;
            } else if seen_ours {
                out.lost_ours += 1;
            }
            let rv = latest["metadata"]["resourceVersion"].clone();
            let mut list: Vec<Value> = latest
                .pointer(metav1_pointer)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for t in WRITER_TYPES {
                upsert(
                    &mut list,
                    json!({"type": t, "status": "True", "reason": "WriterTick",
                           "message": format!("writer tick {tick}"),
                           "lastTransitionTime": writer_time(tick), "observedGeneration": 1}),
                );
            }
            // The metav1 list lives at .../conditions under status (v1beta2 Machine) or under
            // status.v1beta2 (v1beta1 Machine).
            let mut status = if metav1_pointer == "/status/v1beta2/conditions" {
                json!({"v1beta2": {"conditions": list}})
            } else {
                json!({"conditions": list})
            };
            if legacy {
                let mut old: Vec<Value> = latest
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                for t in WRITER_TYPES {
                    upsert(
                        &mut old,
                        json!({"type": t, "status": "True", "severity": "",
                               "message": format!("writer tick {tick}"),
                               "lastTransitionTime": writer_time(tick)}),
                    );
                }
                status["conditions"] = json!(old);
            }
            let patch = json!({"metadata": {"resourceVersion": rv}, "status": status});
            match api
                .patch_status(&name, &params, &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    out.writes += 1;
                    out.last_tick = tick;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_conflicting_capi_writer_neither_loses_nor_loops() {
    let client = kube_client().await;
    let f = Fixture::new(client.clone(), &[("vm-c", "healthy", "Starting")]).await;
    f.machine("m-c", Some("vm-c"), false, "fd1").await;
    let (mut controller, _report) = f.controller(&[]).await;
    let legacy = f.resources.machine.version == "v1beta1";

    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(capi_like_writer(
        Api::namespaced_with(client.clone(), &f.ns, &f.resources.machine),
        "m-c".into(),
        f.conditions_pointer(),
        legacy,
        Duration::from_millis(30),
        stop.clone(),
    ));

    // Cycle while the writer runs: the VM boots (True), then fails (False/VMError), so the
    // shim writes its condition (and in annotate mode the annotation) during the storm.
    let start = Instant::now();
    let mut writes_during = 0;
    let mut cycles = 0;
    let mut injected = false;
    while start.elapsed() < Duration::from_secs(6) {
        let s = controller.cycle(jiff::Timestamp::now()).await;
        cycles += 1;
        writes_during += s.condition_writes;
        if !injected && is(&f.verdict("m-c").await, "True", "VMHealthy") {
            f.sim.inject_fault("vm-c", Fault::Error).expect("fault");
            injected = true;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let w = writer.await.expect("writer task");
    eprintln!(
        "conflicting writer: {} writes, {} conflicts retried, {cycles} shim cycles with {writes_during} condition writes in {:?}",
        w.writes,
        w.conflicts,
        start.elapsed()
    );
    assert!(
        injected,
        "the VM never became True while the writer ran ({cycles} cycles)"
    );
    assert!(
        w.writes >= 20,
        "the writer's patches should mostly succeed: {w:?}"
    );
    assert!(
        writes_during >= 2,
        "the shim wrote during the storm ({writes_during})"
    );
    assert_eq!(
        w.lost_ours, 0,
        "our condition vanished from the Machine after it had been written: {w:?}"
    );

    // The verdict settles (it may already have): False/VMError, annotated in annotate mode.
    let run = run_until(
        &f,
        &mut controller,
        &["m-c"],
        Duration::from_secs(30),
        |s| is(&s["m-c"], "False", "VMError") && (!annotate_mode(&f) || s["m-c"].1),
    )
    .await;
    if !annotate_mode(&f) {
        assert!(!run.last["m-c"].1, "condition mode never annotates");
    }

    // CAPI's conditions are intact: exactly the writer's last values, in both lists.
    let m = get(&client, &f.ns, &f.resources.machine, "m-c").await;
    let want = format!("writer tick {}", w.last_tick);
    let list = m
        .pointer(f.conditions_pointer())
        .and_then(Value::as_array)
        .expect("metav1 conditions");
    for t in WRITER_TYPES {
        let c = list
            .iter()
            .find(|c| c["type"] == t)
            .unwrap_or_else(|| panic!("{t} missing: {list:#?}"));
        assert_eq!(c["message"], want, "{t}");
        assert_eq!(c["lastTransitionTime"], writer_time(w.last_tick), "{t}");
    }
    if legacy {
        let old = m
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .expect("legacy conditions");
        for t in WRITER_TYPES {
            let c = old
                .iter()
                .find(|c| c["type"] == t)
                .unwrap_or_else(|| panic!("legacy {t} missing: {old:#?}"));
            assert_eq!(c["message"], want, "legacy {t}");
        }
        assert!(
            kube_support::condition(&m, "/status/conditions").is_none(),
            "the shim never writes the legacy list"
        );
    }
    let ours = kube_support::condition(&m, f.conditions_pointer()).expect("ours");
    assert_eq!(ours["status"], "False");
    assert_eq!(ours["reason"], "VMError");

    // No loop: with the writer gone, two more cycles write nothing and change nothing.
    let rv = resource_version(&f, "m-c").await;
    for i in 0..2 {
        let s = controller.cycle(jiff::Timestamp::now()).await;
        assert_eq!(s.condition_writes, 0, "cycle {i} after the writer: {s:?}");
        assert_eq!(s.annotations, 0, "cycle {i} after the writer: {s:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        rv,
        resource_version(&f, "m-c").await,
        "the Machine changed although nothing did"
    );
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 2. NodeNotLinked: a Node matches the VM although the Machine has no nodeRef.

fn kubeconfig_to(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: w\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\n\
         users:\n- name: u\n  user:\n    token: not-a-real-token\ncontexts:\n- name: w\n  context:\n    cluster: w\n    user: u\n\
         current-context: w\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_node_capi_has_not_linked_holds_the_verdict_at_unknown() {
    let client = kube_client().await;
    let f = Fixture::new(client.clone(), &[("vm-n", "nic-down", "Starting")]).await;
    // The workload cluster is the test API server itself; the Node is named like the Machine.
    let kubeconfig = std::fs::read_to_string(test_support::apiserver::kubeconfig_path())
        .expect("kubeconfig readable");
    f.secret("c1-kubeconfig", &[("value", &kubeconfig)]).await;
    let name = format!("{}-unlinked", f.ns);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
            )
            .expect("node"),
        )
        .await
        .expect("create Node");
    f.machine(&name, Some("vm-n"), false, "fd1").await;
    let (mut controller, report) = f.controller(&[]).await;

    let run = run_until(
        &f,
        &mut controller,
        &[&name],
        Duration::from_secs(60),
        |s| is(&s[&name], "Unknown", "NodeNotLinked"),
    )
    .await;
    eprintln!(
        "NodeNotLinked after {} cycles / {:?}",
        run.cycles, run.elapsed
    );
    // It must hold: the VM stays silent, the Node stays there, nothing flips or escalates.
    let rv = resource_version(&f, &name).await;
    let mut more = run_until(
        &f,
        &mut controller,
        &[&name],
        Duration::from_secs(30),
        |_| true,
    )
    .await;
    // Past the escalation delay (1 s) several times over.
    while more.cycles < 6 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        more.extend(
            run_until(
                &f,
                &mut controller,
                &[&name],
                Duration::from_secs(30),
                |_| true,
            )
            .await,
        );
    }
    let status_now = report.read().await.clusters.clone();
    for s in &more.seen {
        assert!(
            is(&s[&name], "Unknown", "NodeNotLinked"),
            "the verdict left NodeNotLinked: {s:#?}\n/status now: {status_now:#?}"
        );
    }
    let writes: usize = more.summaries.iter().map(|s| s.condition_writes).sum();
    assert_eq!(writes, 0, "a held verdict is not rewritten");
    assert_eq!(rv, resource_version(&f, &name).await);
    // Never False on the way (in condition mode the MHC would remediate on False at once).
    assert!(
        !run.ever(&name, "False"),
        "published False before NodeNotLinked: {:#?}",
        run.seen
    );
    assert!(!run.last[&name].1, "must not be annotated");
    assert_eq!(run.annotations() + more.annotations(), 0);

    let m = get(&client, &f.ns, &f.resources.machine, &name).await;
    let c = kube_support::condition(&m, f.conditions_pointer()).expect("condition");
    assert!(c["message"].as_str().unwrap().contains(&name), "{c:#?}");
    let r = report.read().await.clone();
    let mr = &r.clusters[&format!("{}/c1", f.ns)].machines[&name];
    assert_eq!(mr.verdict, Some(Status::Unknown));
    assert_eq!(mr.reason.as_deref(), Some("NodeNotLinked"));
    let why = mr.message.as_deref().unwrap_or_default();
    assert!(
        why.contains(&format!("Node {name}")) && why.contains("nodeRef"),
        "/status must say which Node and why: {why}"
    );
    assert!(
        why.contains("GuestNetworkSilent"),
        "/status must say what it would have been: {why}"
    );
    assert_eq!(mr.escalation, "held");
    assert!(
        mr.escalation_detail
            .as_deref()
            .is_some_and(|d| d.contains("NodeNotLinked") && d.contains(&name)),
        "{:?}",
        mr.escalation_detail
    );
    eprintln!("NodeNotLinked /status message: {why}");
    assert_no_secret(&r, &[SIM_SECRET]);

    let _ = nodes.delete(&name, &Default::default()).await;
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn an_unreachable_workload_cluster_does_not_block_escalation() {
    let client = kube_client().await;
    let f = Fixture::new(client.clone(), &[("vm-n", "nic-down", "Starting")]).await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    f.secret(
        "c1-kubeconfig",
        &[(
            "value",
            &kubeconfig_to(&format!("https://127.0.0.1:{closed}")),
        )],
    )
    .await;
    f.machine("m-n", Some("vm-n"), false, "fd1").await;
    let (mut controller, report) = f.controller(&[]).await;
    let run = run_until(
        &f,
        &mut controller,
        &["m-n"],
        Duration::from_secs(60),
        |s| is(&s["m-n"], "False", "GuestNetworkSilent") && (!annotate_mode(&f) || s["m-n"].1),
    )
    .await;
    eprintln!(
        "unreachable workload cluster: False{} after {} cycles / {:?}",
        if annotate_mode(&f) {
            " and annotated"
        } else {
            ""
        },
        run.cycles,
        run.elapsed
    );
    assert!(
        !run.seen
            .iter()
            .any(|s| is(&s["m-n"], "Unknown", "NodeNotLinked")),
        "no Node was found, so NodeNotLinked must not appear"
    );
    if annotate_mode(&f) {
        let r = report.read().await.clone();
        assert_eq!(
            r.clusters[&format!("{}/c1", f.ns)].machines["m-n"].escalation,
            "annotated"
        );
    } else {
        assert!(!run.last["m-n"].1, "condition mode never annotates");
    }
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 3. Bad input: each gives Unknown with a reason on /status, never False.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn bad_input_gives_unknown_with_a_reason() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-ok", "healthy", "Starting"),
            ("vm-badurl", "healthy", "Starting"),
            ("vm-nosecret", "healthy", "Starting"),
        ],
    )
    .await;
    f.secret(
        "acs-badurl",
        &[
            ("api-url", "cloudstack.example:8080 /client/api"),
            ("api-key", "k"),
            ("secret-key", "s"),
        ],
    )
    .await;
    f.failure_domain("fd-badurl", "acs-badurl").await;
    f.failure_domain("fd-nosecret", "acs-missing").await;
    f.machine("m-ok", Some("vm-ok"), false, "fd1").await;
    f.machine("m-badurl", Some("vm-badurl"), false, "fd-badurl")
        .await;
    f.machine("m-nosecret", Some("vm-nosecret"), false, "fd-nosecret")
        .await;
    let names = ["m-ok", "m-badurl", "m-nosecret"];
    let (mut controller, report) = f.controller(&[]).await;
    let cluster = format!("{}/c1", f.ns);

    let run = run_until(&f, &mut controller, &names, Duration::from_secs(60), |s| {
        is(&s["m-ok"], "True", "VMHealthy")
            && is(&s["m-badurl"], "Unknown", "CredentialsUnavailable")
            && is(&s["m-nosecret"], "Unknown", "CredentialsUnavailable")
    })
    .await;
    eprintln!(
        "bad Secrets: settled after {} cycles / {:?}",
        run.cycles, run.elapsed
    );
    let r = report.read().await.clone();
    let msg = |n: &str| {
        r.clusters[&cluster].machines[n]
            .message
            .clone()
            .unwrap_or_default()
    };
    assert!(msg("m-badurl").contains("api-url"), "{}", msg("m-badurl"));
    assert!(
        msg("m-badurl").contains("acs-badurl"),
        "names the Secret: {}",
        msg("m-badurl")
    );
    assert!(
        msg("m-nosecret").contains(&format!("Secret {}/acs-missing", f.ns))
            && msg("m-nosecret").contains("does not exist"),
        "{}",
        msg("m-nosecret")
    );
    assert!(r.problems.iter().any(|p| p.contains("acs-missing")));
    eprintln!(
        "bad api-url: {}\nmissing Secret: {}",
        msg("m-badurl"),
        msg("m-nosecret")
    );

    // CloudStack behind a proxy that answers HTML: an outage page (503), then 502 pages.
    let mut timeline = Vec::new();
    for (label, faults, needle) in [
        (
            "503 outage page",
            ApiFaults {
                outage: true,
                ..Default::default()
            },
            "503",
        ),
        (
            "502 proxy page",
            ApiFaults {
                html_next: 1_000_000,
                ..Default::default()
            },
            "502",
        ),
    ] {
        f.sim.set_api_faults(faults);
        let run = run_until(&f, &mut controller, &names, Duration::from_secs(30), |s| {
            is(&s["m-ok"], "Unknown", "CloudStackAPIUnavailable")
        })
        .await;
        timeline.push(format!(
            "{label}: Unknown after {} cycle(s) / {:?}",
            run.cycles, run.elapsed
        ));
        let r = report.read().await.clone();
        let why = r.clusters[&cluster].machines["m-ok"]
            .message
            .clone()
            .unwrap_or_default();
        assert!(
            why.contains(needle) && why.to_lowercase().contains("html"),
            "{label}: /status must name the HTML page and its status: {why}"
        );
        eprintln!("{label}: {why}");
        let scope_error = r.scopes[0].last_error.clone().unwrap_or_default();
        assert!(scope_error.contains(needle), "{label}: {scope_error}");
        for n in names {
            assert!(!run.ever(n, "False"), "{label}: {n} went False");
        }
        // Bad Secrets keep their own reason through it.
        assert!(is(
            &run.last["m-badurl"],
            "Unknown",
            "CredentialsUnavailable"
        ));
        // Healthy again before the next page (a scope still backing off would not poll in
        // the next phase's first cycles, and the Unknown it carries names this page).
        f.sim.set_api_faults(ApiFaults::default());
        let run = run_until(&f, &mut controller, &names, Duration::from_secs(30), |s| {
            is(&s["m-ok"], "True", "VMHealthy")
        })
        .await;
        timeline.push(format!(
            "{label} gone: True after {} cycle(s) / {:?}",
            run.cycles, run.elapsed
        ));
        assert!(!run.ever("m-ok", "False"));
    }
    eprintln!("{}", timeline.join("\n"));
    assert_no_secret(&*report.read().await, &[SIM_SECRET]);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_rotated_secret_key_is_picked_up_without_a_restart() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-a", "healthy", "Starting"),
            ("vm-b", "healthy", "Starting"),
        ],
    )
    .await;
    f.machine("m-a", Some("vm-a"), false, "fd1").await;
    f.machine("m-b", Some("vm-b"), true, "fd1").await;
    let names = ["m-a", "m-b"];
    let (mut controller, report) = f.controller(&[]).await;
    let all = |s: &State, st: &str, r: &str| names.iter().all(|n| is(&s[*n], st, r));
    run_until(&f, &mut controller, &names, Duration::from_secs(60), |s| {
        all(s, "True", "VMHealthy")
    })
    .await;

    let secrets = ar("", "v1", "Secret", "secrets");
    const WRONG: &str = "rotated-but-wrong-secret-key";
    merge_patch(
        &client,
        &f.ns,
        &secrets,
        "acs",
        json!({"stringData": {"secret-key": WRONG}}),
    )
    .await;
    let wrong = run_until(&f, &mut controller, &names, Duration::from_secs(30), |s| {
        all(s, "Unknown", "CloudStackAPIUnavailable")
    })
    .await;
    let r = report.read().await.clone();
    let why = r.clusters[&format!("{}/c1", f.ns)].machines["m-a"]
        .message
        .clone()
        .unwrap_or_default();
    assert!(
        why.contains("401"),
        "/status must say the key was rejected: {why}"
    );
    eprintln!("wrong secret-key: {why}");
    assert_no_secret(&r, &[SIM_SECRET, WRONG]);

    merge_patch(
        &client,
        &f.ns,
        &secrets,
        "acs",
        json!({"stringData": {"secret-key": SIM_SECRET}}),
    )
    .await;
    let back = run_until(&f, &mut controller, &names, Duration::from_secs(30), |s| {
        all(s, "True", "VMHealthy")
    })
    .await;
    eprintln!(
        "secret rotation: wrong key → Unknown after {} cycle(s) / {:?}; right key → True after {} cycle(s) / {:?}",
        wrong.cycles, wrong.elapsed, back.cycles, back.elapsed
    );
    for n in names {
        assert!(
            !wrong.ever(n, "False") && !back.ever(n, "False"),
            "{n} went False"
        );
    }
    assert_eq!(wrong.annotations() + back.annotations(), 0);
    let r = report.read().await.clone();
    assert_eq!(r.scopes.len(), 1, "one scope, its client rebuilt in place");
    assert_no_secret(&r, &[SIM_SECRET, WRONG]);
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// 4. A CloudStack outage recycles nothing.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn an_api_outage_recycles_nothing() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-bad", "healthy", "Error"),
            ("vm-ok1", "healthy", "Starting"),
            ("vm-ok2", "healthy", "Starting"),
        ],
    )
    .await;
    f.machine("m-bad", Some("vm-bad"), false, "fd1").await;
    f.machine("m-ok1", Some("vm-ok1"), false, "fd1").await;
    f.machine("m-ok2", Some("vm-ok2"), true, "fd1").await;
    let names = ["m-bad", "m-ok1", "m-ok2"];
    let (mut controller, report) = f.controller(&[]).await;
    let before = run_until(&f, &mut controller, &names, Duration::from_secs(60), |s| {
        is(&s["m-bad"], "False", "VMError")
            && (!annotate_mode(&f) || s["m-bad"].1)
            && is(&s["m-ok1"], "True", "VMHealthy")
            && is(&s["m-ok2"], "True", "VMHealthy")
    })
    .await;
    assert!(!before.last["m-ok1"].1 && !before.last["m-ok2"].1);

    f.sim.set_api_faults(ApiFaults {
        outage: true,
        ..Default::default()
    });
    let outage_start = Instant::now();
    let during = run_until(&f, &mut controller, &names, Duration::from_secs(30), |s| {
        names
            .iter()
            .all(|n| is(&s[*n], "Unknown", "CloudStackAPIUnavailable"))
    })
    .await;
    // Stay in the outage a while longer (past the escalation delay and the stale-poll age).
    let mut held = run_until(&f, &mut controller, &names, Duration::from_secs(30), |_| {
        true
    })
    .await;
    while outage_start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(400)).await;
        held.extend(
            run_until(&f, &mut controller, &names, Duration::from_secs(30), |_| {
                true
            })
            .await,
        );
    }
    for s in &held.seen {
        for n in names {
            assert!(
                is(&s[n], "Unknown", "CloudStackAPIUnavailable"),
                "{n} left Unknown during the outage: {s:#?}"
            );
        }
    }
    assert_eq!(
        during.annotations() + held.annotations(),
        0,
        "an outage must not annotate"
    );
    for n in ["m-ok1", "m-ok2"] {
        assert!(!held.seen.last().unwrap()[n].1, "{n} annotated");
        assert!(
            !during.ever(n, "False") && !held.ever(n, "False"),
            "{n} went False"
        );
    }
    // m-bad keeps the annotation it had (it is the record); nothing removes or adds one.
    assert_eq!(held.seen.last().unwrap()["m-bad"].1, annotate_mode(&f));
    let r = report.read().await.clone();
    let why = r.clusters[&format!("{}/c1", f.ns)].machines["m-ok1"]
        .message
        .clone()
        .unwrap_or_default();
    assert!(why.contains("503"), "{why}");
    assert!(r.scopes[0].last_error.is_some());

    f.sim.set_api_faults(ApiFaults::default());
    let after = run_until(&f, &mut controller, &names, Duration::from_secs(30), |s| {
        is(&s["m-bad"], "False", "VMError")
            && is(&s["m-ok1"], "True", "VMHealthy")
            && is(&s["m-ok2"], "True", "VMHealthy")
    })
    .await;
    eprintln!(
        "outage: all Unknown after {} cycle(s) / {:?}; held {} more cycles; verdicts back after {} cycle(s) / {:?}",
        during.cycles, during.elapsed, held.cycles, after.cycles, after.elapsed
    );
    assert_eq!(after.annotations(), 0, "m-bad is already annotated");
    assert!(!after.last["m-ok1"].1 && !after.last["m-ok2"].1);
    assert_eq!(after.last["m-bad"].1, annotate_mode(&f));
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn an_operator_named_secret_overrides_the_failure_domain_keys_for_its_endpoint() {
    let client = kube_support::kube_client().await;
    let f = Fixture::new(client.clone(), &[("vm-error", "healthy", "Error")]).await;
    // The failure domain's own Secret carries a key CloudStack rejects (e.g. CAPC's key was
    // rotated away from the shim); the operator's read-only Secret has the right one.
    f.secret(
        "capc-key",
        &[
            ("api-url", &f.server.api_url()),
            ("api-key", kube_support::SIM_KEY),
            ("secret-key", "not-the-secret"),
        ],
    )
    .await;
    f.secret(
        "shim-ro",
        &[
            ("api-key", kube_support::SIM_KEY),
            ("secret-key", kube_support::SIM_SECRET),
        ],
    )
    .await;
    f.failure_domain("fd-capc", "capc-key").await;
    f.machine("m-error", Some("vm-error"), false, "fd-capc")
        .await;

    let (mut without, _) = f.controller(&[]).await;
    f.cycle_until(&mut without, &["m-error"], Duration::from_secs(20), |s| {
        kube_support::is(&s["m-error"], "Unknown", "CloudStackAPIUnavailable")
    })
    .await;
    let over = format!("{}={}/shim-ro", f.server.api_url(), f.ns);
    let (mut with, report) = f.controller(&["--endpoint-credentials", &over]).await;
    f.cycle_until(&mut with, &["m-error"], Duration::from_secs(20), |s| {
        kube_support::is(&s["m-error"], "False", "VMError")
    })
    .await;
    assert!(!serde_json::to_string(&*report.read().await)
        .unwrap()
        .contains(kube_support::SIM_SECRET));
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_machine_without_its_cloudstack_machine_gets_no_verdict_but_a_reason() {
    let client = kube_support::kube_client().await;
    let f = Fixture::new(client.clone(), &[("vm-ok", "healthy", "Starting")]).await;
    f.machine("m-ok", Some("vm-ok"), false, "fd1").await;
    f.machine("m-orphan", Some("vm-ok"), false, "fd1").await;
    let csm: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client.clone(), &f.ns, &f.resources.cloudstack_machine);
    csm.delete("m-orphan-csm", &Default::default())
        .await
        .expect("delete the CloudStackMachine");
    let (mut c, report) = f.controller(&[]).await;
    let s = f
        .cycle_until(
            &mut c,
            &["m-ok", "m-orphan"],
            Duration::from_secs(30),
            |s| kube_support::is(&s["m-ok"], "True", "VMHealthy"),
        )
        .await;
    assert_eq!(
        s["m-orphan"].0, None,
        "no verdict without a CloudStackMachine"
    );
    let r = report.read().await.clone();
    let m = &r.clusters[&format!("{}/c1", f.ns)].machines["m-orphan"];
    assert!(
        m.message
            .as_deref()
            .unwrap()
            .contains("CloudStackMachine m-orphan-csm not found"),
        "{m:?}"
    );
    f.cleanup().await;
}
