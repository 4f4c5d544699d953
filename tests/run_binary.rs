//! `capc-health-shim run` as a process, as deployed: KUBECONFIG, leader Lease, /readyz,
//! /status (through `capc-health-shim status`), /metrics, and SIGTERM releasing the Lease.

mod kube_support;
mod metric_names;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use capi_model::apis::Mode;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube_support::{http_get, is, kube_client, Fixture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn the_binary_leads_publishes_reports_and_stops_cleanly() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-error", "healthy", "Error"),
            ("vm-ok", "healthy", "Starting"),
        ],
    )
    .await;
    f.machine("m-error", Some("vm-error"), false, "fd1").await;
    f.machine("m-ok", Some("vm-ok"), false, "fd1").await;

    let port = kube_support::free_port();
    let addr = format!("127.0.0.1:{port}");
    let lease_name = format!("shim-{}", f.ns);
    let mut child = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
        .args([
            "--log",
            "info",
            "run",
            "--namespace",
            &f.ns,
            "--poll-interval",
            "1s",
            "--stats-interval",
            "1s",
            "--escalation-delay",
            "1s",
            "--status-addr",
            &addr,
            // Plain HTTP for this test; tests/http_auth.rs runs the secured default.
            "--insecure-serving",
            "--lease-namespace",
            &f.ns,
            "--lease-name",
            &lease_name,
        ])
        .env("KUBECONFIG", test_support::apiserver::kubeconfig_path())
        .env("HOSTNAME", "shim-test-pod")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start capc-health-shim run");

    // Ready and leading, verdicts on the Machines.
    let annotate = f.choice.mode == Mode::Annotate;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = matches!(
            http_get(&format!("http://{addr}/readyz")).await,
            Some((200, _))
        );
        let err = f.verdict("m-error").await;
        let ok = f.verdict("m-ok").await;
        if ready
            && is(&err, "False", "VMError")
            && is(&ok, "True", "VMHealthy")
            && (!annotate || err.1)
        {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("run exited early with {status}");
        }
        assert!(
            Instant::now() < deadline,
            "no verdicts within 60 s: {err:?} {ok:?} ready={ready}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), &f.ns);
    let lease = leases.get(&lease_name).await.expect("the Lease exists");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("shim-test-pod")
    );

    // The status subcommand renders what the endpoint serves.
    let out = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
        .args(["status", "--url", &format!("http://{addr}"), "-o", "json"])
        .output()
        .expect("status");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["leader"], true);
    assert_eq!(
        report["api"]["mode"],
        if annotate { "annotate" } else { "condition" }
    );
    let m = &report["clusters"][format!("{}/c1", f.ns)]["machines"]["m-error"];
    assert_eq!(m["verdict"], "False");
    assert_eq!(m["reason"], "VMError");
    let table = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
        .args(["status", "--url", &format!("http://{addr}")])
        .output()
        .expect("status table");
    assert!(String::from_utf8_lossy(&table.stdout).contains("m-error"));
    // One Cluster (asked of the endpoint) and one Machine of it.
    let cluster = format!("{}/c1", f.ns);
    let one = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
        .args(["status", "--url", &format!("http://{addr}")])
        .args(["--cluster", &cluster, "--machine", "m-error"])
        .output()
        .expect("status of one Machine");
    let one = String::from_utf8_lossy(&one.stdout).into_owned();
    assert!(one.contains("m-error") && !one.contains("m-ok"), "{one}");
    let elsewhere = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
        .args(["status", "--url", &format!("http://{addr}")])
        .args(["--cluster", &format!("{}/no-such-cluster", f.ns)])
        .output()
        .expect("status of an unknown Cluster");
    assert_ne!(elsewhere.status.code(), Some(0), "{elsewhere:?}");
    let (code, metrics) = http_get(&format!("http://{addr}/metrics"))
        .await
        .expect("metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("capc_health_transitions_total{status=\"False\",reason=\"VMError\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("capc_health_leader 1"), "{metrics}");
    // What deploy/components/monitoring queries is on this running shim's /metrics, but for
    // the families whose series only an event this test does not cause creates (no orphan, no
    // remnant, no guest probe, no failed poll, no escalation in condition mode, no Machine that
    // becomes a Node: no boot time, no scorecard warning; one failing Machine: no incident);
    // tests/monitoring_metrics.rs finds those after recording each, tests/controller_scorecard.rs
    // the scorecard's from a fleet, tests/controller_incidents.rs the incidents' from a storm.
    let not_here = [
        "capc_health_orphan_vms",
        "capc_health_remnant_objects",
        "capc_health_probe_events_total",
        "capc_health_scope_poll_failures_total",
        "capc_health_escalations_total",
        "capc_health_boot_to_node_seconds",
        "capc_health_scorecard_warnings",
        "capc_health_incidents",
        "capc_health_incident_failing_machines",
    ];
    let exported = metric_names::exported(&metrics);
    let missing: Vec<_> = metric_names::queried()
        .into_iter()
        .filter(|n| !exported.contains(n) && !not_here.contains(&n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "queried by deploy/components/monitoring, not on the shim's /metrics: {missing:?}\n{metrics}"
    );

    // SIGTERM: clean exit, Lease released.
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "run did not stop within 20 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains(kube_support::SIM_SECRET),
        "no secret in logs"
    );
    let lease = leases.get(&lease_name).await.expect("Lease");
    assert_ne!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("shim-test-pod"),
        "Lease released"
    );
    f.cleanup().await;
}
