//! The guest probe inside the controller, against a real kube-apiserver (CAPI/CAPC CRDs) and
//! `cloudstack-sim`: its key comes from its own Secret (`--probe-credentials`), its work shows
//! in `/status`, and without a usable key nothing changes but a reported problem.

mod kube_support;

use std::time::Duration;

use kube_support::{is, kube_client, Fixture, SIM_KEY, SIM_SECRET};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn the_probe_asks_the_router_and_reports_what_it_did() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-healthy", "healthy", "Starting"),
            ("vm-nicdown", "nic-down", "Starting"),
        ],
    )
    .await;
    // A Secret of its own (here the simulator's root admin key; in production a key whose role
    // allows only listRouters, runDiagnostics and queryAsyncJobResult).
    f.secret(
        "probe-key",
        &[
            ("api-url", &f.server.api_url()),
            ("api-key", SIM_KEY),
            ("secret-key", SIM_SECRET),
        ],
    )
    .await;
    f.machine("m-healthy", Some("vm-healthy"), false, "fd1")
        .await;
    f.machine("m-nicdown", Some("vm-nicdown"), false, "fd1")
        .await;
    let probe_ref = format!("{}/probe-key", f.ns);
    let (mut controller, report) = f.controller(&["--probe-credentials", &probe_ref]).await;
    let names = ["m-healthy", "m-nicdown"];
    let state = f
        .cycle_until(&mut controller, &names, Duration::from_secs(90), |s| {
            is(&s["m-nicdown"], "False", "GuestNetworkSilent")
        })
        .await;
    assert!(
        !is(&state["m-healthy"], "False", "GuestNetworkSilent"),
        "{state:?}"
    );
    // The healthy guest keeps answering while the controller cycles.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        controller.cycle(jiff::Timestamp::now()).await;
        let r = report.read().await.clone();
        let p = r
            .probe
            .clone()
            .expect("a probe section with --probe-credentials");
        if p.counts.replies > 0 && p.counts.jobs_started > 0 {
            assert!(p.enabled && p.refused.is_none(), "{p:?}");
            assert_eq!(p.endpoint.as_deref(), Some(f.server.api_url().as_str()));
            assert!(
                !r.problems.iter().any(|x| x.contains("probe")),
                "{:?}",
                r.problems
            );
            let status = serde_json::to_string(&r).unwrap();
            assert!(
                !status.contains(SIM_SECRET),
                "the probe's secret reached /status"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no probe replies: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        !is(&f.verdict("m-healthy").await, "False", "GuestNetworkSilent"),
        "a guest that answers is never False from traffic"
    );
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_missing_probe_secret_is_a_problem_and_changes_nothing_else() {
    let client = kube_client().await;
    let f = Fixture::new(client.clone(), &[("vm-nicdown", "nic-down", "Starting")]).await;
    f.machine("m-nicdown", Some("vm-nicdown"), false, "fd1")
        .await;
    let probe_ref = format!("{}/no-such-secret", f.ns);
    let (mut controller, report) = f.controller(&["--probe-credentials", &probe_ref]).await;
    // Counters alone still judge the silent guest.
    f.cycle_until(
        &mut controller,
        &["m-nicdown"],
        Duration::from_secs(90),
        |s| is(&s["m-nicdown"], "False", "GuestNetworkSilent"),
    )
    .await;
    let r = report.read().await.clone();
    let p = r.probe.expect("a probe section");
    assert_eq!(p.counts.jobs_started, 0, "{p:?}");
    let err = p.last_error.expect("why the probe is off");
    assert!(err.contains("no-such-secret"), "{err}");
    assert!(
        r.problems.iter().any(|x| x.contains("probe credentials")),
        "{:?}",
        r.problems
    );
    f.cleanup().await;
}
