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

/// The probe's key's calls so far (its own account in the simulator: `prober`).
fn probe_calls(f: &Fixture) -> (u64, String) {
    let by = f.sim.calls_by_account();
    by.get("prober").map_or((0, "none".into()), |a| {
        (a.calls, format!("{:?}", a.by_command))
    })
}

/// Issue 42 item 5: with the probe on, every Machine having its Node, the probe calls nothing.
/// The e2e's steady window (it opens when the API server shows every nodeRef) counted probe
/// calls there: a job started before a Node appeared was still read (`queryAsyncJobResult`
/// each step, then a `ping` retry), and between cycles the probe judged Machines by the facts
/// of the last cycle, so it started new attempts for Machines that had their Node meanwhile.
/// Here: one silent Machine without a Node, probed (the control: its key calls), then given its
/// Node while a job is in flight; once the controller's own watch has the nodeRef, its steps
/// and cycles make no call with the probe's key. A Machine that had its Node all along is
/// never probed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn once_every_machine_has_its_node_the_probe_calls_nothing() {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use kube_support::{simulator_from_scenario, ZONE_ID};
    use serde_json::json;

    let id = || uuid::Uuid::new_v4().to_string();
    let scenario = json!({
        "settings": {"stats_interval_seconds": 1, "boot_seconds": 1, "guest_speedup": 60,
                     "guest_boot_seconds": 1.5, "guest_join_seconds": 3},
        "accounts": [
            {"name": "admin", "type": "Admin", "api_key": SIM_KEY, "secret_key": SIM_SECRET},
            // runDiagnostics is for root admins: the probe's own key, counted apart.
            {"name": "prober", "type": "Admin", "api_key": "prober-key", "secret_key": "prober-secret"},
        ],
        "zones": [{"name": "zone-a", "id": ZONE_ID}],
        "networks": [{"name": "capi-shared", "zone": "zone-a", "cidr": "10.1.0.0/16"}],
        "vms": [
            {"name": "vm-silent", "id": id(), "guest": "nic-down", "state": "Starting"},
            {"name": "vm-node", "id": id(), "guest": "nic-down", "state": "Starting"},
        ],
    });
    let client = kube_client().await;
    let f =
        Fixture::with_simulator(client.clone(), simulator_from_scenario(scenario, 1.0).await).await;
    f.secret(
        "probe-key",
        &[
            ("api-url", &f.server.api_url()),
            ("api-key", "prober-key"),
            ("secret-key", "prober-secret"),
        ],
    )
    .await;
    f.machine("m-silent", Some("vm-silent"), false, "fd1").await;
    f.machine("m-node", Some("vm-node"), false, "fd1").await;
    let machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &f.ns, &f.resources.machine);
    let give_node = |name: &'static str| {
        let machines = machines.clone();
        async move {
            let status =
                json!({"status": {"nodeRef": {"apiVersion": "v1", "kind": "Node", "name": name}}});
            machines
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .unwrap_or_else(|e| panic!("status.nodeRef of {name}: {e}"));
        }
    };
    // m-node's guest is as silent as m-silent's: only its Node keeps the probe away.
    give_node("m-node").await;
    let probe_ref = format!("{}/probe-key", f.ns);
    let (mut c, report) = f.controller(&["--probe-credentials", &probe_ref]).await;

    // The control: the Node-less silent Machine is probed with the probe's key; go on until a
    // cycle ends with one of its jobs in flight (an arping of a silent guest runs 3 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        c.cycle(jiff::Timestamp::now()).await;
        let p = report.read().await.probe.clone().expect("a probe section");
        assert!(p.refused.is_none() && p.last_error.is_none(), "{p:?}");
        if p.in_flight > 0 && p.counts.jobs_started >= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no probe job in flight for the silent Machine: {p:?}"
        );
        c.wait_probing(Duration::from_millis(500)).await;
    }
    let (before, commands) = probe_calls(&f);
    assert!(
        before > 0,
        "the probe's key made no call for a Node-less silent Machine"
    );
    eprintln!("probe key while m-silent had no Node: {before} calls ({commands})");

    // m-silent gets its Node: from the moment the controller's watch has it, nothing.
    give_node("m-silent").await;
    let seen_by = std::time::Instant::now() + Duration::from_secs(30);
    while !c
        .stores()
        .machines
        .get(&f.ns, "m-silent")
        .is_some_and(|m| m.view.has_node_ref)
    {
        assert!(
            std::time::Instant::now() < seen_by,
            "the controller's watch never saw m-silent's nodeRef"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (from, _) = probe_calls(&f);
    let listing = |f: &Fixture| f.sim.calls_by_account().get("admin").map_or(0, |a| a.calls);
    let listed = listing(&f);
    // Steps until the next cycle (with the last cycle's facts), then cycles and steps.
    c.wait_probing(Duration::from_secs(2)).await;
    for _ in 0..4 {
        c.cycle(jiff::Timestamp::now()).await;
        c.wait_probing(Duration::from_secs(1)).await;
    }
    let (to, commands) = probe_calls(&f);
    // The window was live: the controller listed, and the probe is still on.
    assert!(listing(&f) > listed, "no cycle polled in the window");
    let p = report.read().await.probe.clone().expect("a probe section");
    assert!(p.enabled && p.refused.is_none(), "{p:?}");
    assert_eq!(
        to - from,
        0,
        "probe calls while every Machine has its Node (by command so far: {commands}); {p:?}"
    );
    assert_eq!(p.in_flight, 0, "{p:?}");
    f.cleanup().await;
}
