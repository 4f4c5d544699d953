//! Every metric the alerts and the dashboard of deploy/components/monitoring query is one the
//! shim exports: the shim's own /metrics endpoint (src/http over its Metrics) is scraped after
//! every recorder the controller calls has recorded something (a family with no series is not
//! printed at all), and each queried name must be among the samples, each label an alert
//! selects on on their series. tests/run_binary.rs checks
//! the same names against a running shim's scrape, for the families its scenario fills.

mod metric_names;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use capc_health_shim::http::{self, HttpState};
use capc_health_shim::metrics::Metrics;
use capc_health_shim::remnants::{Remnant, RemnantReason};
use capc_health_shim::status::{
    ClusterReport, MachineReport, MemoryReport, OrphanKind, OrphanReport, ProbeReport, StatusReport,
};
use capc_health_shim::verdict::Status;
use tokio::net::TcpListener;

/// A Metrics every recorder has been called on, as the controller calls them.
fn recorded() -> Metrics {
    let m = Metrics::new();
    let scope = "https://cs.example/client/api zone=z1";
    m.set_verdict_counts(&BTreeMap::from([(
        (Status::False, "VMError".to_string()),
        1,
    )]));
    m.record_transition(Status::False, "VMError");
    m.record_escalation("annotated");
    m.observe_poll(scope, 0.4);
    m.record_calls("listVirtualMachines", "unauthorized", 1);
    m.record_rate_limit_wait(1.0);
    m.observe_time_to_false("VMError", 120.0);
    m.set_mass_failure_held(scope, true);
    m.record_write("condition", "ok");
    m.record_write_outcome("condition", "written");
    m.set_write_queue(1);
    m.observe_cycle(0.5);
    m.set_leader(true);
    m.set_ready(true);
    let mut probe = ProbeReport::default();
    probe.counts.jobs_started = 1;
    m.observe_probe(&probe);
    let now = jiff::Timestamp::now();
    m.set_orphans(&[OrphanReport {
        vm_id: "7c3e1a90-0000-4000-8000-0000000000aa".to_string(),
        vm_name: "c1-md-0-x".to_string(),
        vm_state: "Running".to_string(),
        scope: scope.to_string(),
        cluster: Some("ns/c1".to_string()),
        cloudstack_machine: "ns/c1-md-0-x".to_string(),
        kind: OrphanKind::InstanceOfDeleted,
        since: now,
        reported_at: Some(now),
        why: String::new(),
    }]);
    m.set_remnants(&[Remnant {
        group: "infrastructure.cluster.x-k8s.io".to_string(),
        kind: "CloudStackMachine".to_string(),
        namespace: "ns".to_string(),
        name: "c1-md-0-x".to_string(),
        cluster: Some("ns/c1".to_string()),
        since: now,
        reason: RemnantReason::StuckDeleting,
        why: String::new(),
        blocking_finalizers: Vec::new(),
        related_vm: None,
    }]);
    let mut cluster = ClusterReport::default();
    cluster.machines.insert(
        "m1".to_string(),
        MachineReport {
            verdict: Some(Status::False),
            reason: Some("VMError".to_string()),
            since: Some(jiff::Timestamp::now()),
            ..Default::default()
        },
    );
    m.set_standing(
        &BTreeMap::from([("ns/c1".to_string(), cluster)]),
        jiff::Timestamp::now(),
    );
    m.record_scope_poll(scope, Err("unauthorized"));
    m.set_false_unacted(BTreeMap::from([("ns/c1".to_string(), 1)]));
    m.set_orphan_memory(&MemoryReport {
        configmap: "capc-health-shim-system/capc-health-shim-memory".to_string(),
        ..Default::default()
    });
    {
        use capc_health_shim::verdict::scorecard::{BaselineRow, BootKey, Summary, Warning};
        let key = BootKey {
            template: "ubuntu".to_string(),
            offering: "medium".to_string(),
            zone: "zone-a".to_string(),
        };
        let boot = Summary {
            count: 5,
            p50: 300.0,
            p95: 420.0,
            max: 480.0,
        };
        m.set_scorecard(
            &[BaselineRow {
                key: key.clone(),
                count: 5,
                from_creation: Some(boot),
                from_running: None,
            }],
            &[Warning::MhcTimeoutBelowBoot {
                mhc: "ns/c1-mhc".to_string(),
                timeout_secs: 300,
                key,
                p95_secs: 420.0,
                margin: 1.5,
            }],
        );
        m.set_scorecard_memory(&capc_health_shim::status::ScorecardMemoryReport {
            configmap: "capc-health-shim-system/capc-health-shim-memory".to_string(),
            ..Default::default()
        });
        // An open incident of every cause kind (and one nothing explains).
        let incidents = capc_health_shim::verdict::incidents::CauseKind::ALL
            .iter()
            .map(|k| k.as_str())
            .chain(["none"])
            .enumerate()
            .map(|(i, kind)| {
                (
                    capc_health_shim::metrics::IncidentLabels {
                        scope: format!("{scope} #{i}"),
                        cause_kind: kind.to_string(),
                    },
                    7,
                )
            })
            .collect();
        m.set_incidents(&incidents);
    }
    m
}

#[tokio::test]
async fn every_metric_the_alerts_and_dashboard_query_is_on_the_shims_metrics_endpoint() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = HttpState::new(StatusReport::default(), recorded());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(http::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let body = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("body");
    let _ = stop.send(());
    let _ = server.await;

    let exported = metric_names::exported(&body);
    let missing: BTreeSet<_> = metric_names::queried()
        .difference(&exported)
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "queried by deploy/components/monitoring but not exported by the shim: {missing:?}\n{body}"
    );
    // The labels the alerts select on (hack/monitoring/testdata/rule-labels.txt): every series
    // carries each label its alert groups or matches by, and a matcher's value is exported
    // exactly as the rule spells it (`kind="unauthorized"`: the recorders were given an
    // unauthorized poll). tests/alerts_kube.rs checks the same on the running shim's scrape.
    let rules = metric_names::rule_labels();
    let problems = metric_names::label_problems(&metric_names::samples(&body), &rules, &|_| false);
    assert!(
        problems.is_empty(),
        "labels the alerts select on, not on the shim's series: {problems:#?}\n{body}"
    );
}

#[test]
fn exported_names_follow_the_exposition_types() {
    let text = "# TYPE a counter\n# TYPE b histogram\n# TYPE c gauge\nc{x=\"1\"} 2\nd 1\n# EOF\n";
    let names = metric_names::exported(text);
    for n in ["a_total", "b_bucket", "b_sum", "b_count", "c", "d"] {
        assert!(names.contains(n), "{n}: {names:?}");
    }
    assert!(!names.contains("a"));
}
