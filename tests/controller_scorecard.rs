//! Issue 44 on the real API server: the scorecard counts a false alarm once, the boot
//! baseline, and keeps its counts for the next leader (and an unreadable stored copy aside).

mod kube_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use capc_health_shim::controller::cycle::Controller;
use capc_health_shim::controller::scorecard_memory::{ScorecardStore, ASIDE_KEY, DATA_KEY};
use capc_health_shim::status::StatusReport;
use cloudstack_sim::Fault;
use kube_support::{cycle_until_report, is, kube_client, Fixture};

const MEMORY: &str = "capc-health-shim-memory";

fn false_alarms(r: &StatusReport) -> u64 {
    r.scorecard
        .as_ref()
        .and_then(|s| s.totals.get("false-alarm"))
        .map_or(0, |t| t.count)
}

fn scorecard_of(r: &StatusReport) -> String {
    serde_json::to_string_pretty(&r.scorecard).unwrap()
}

async fn with_memory(
    f: &Fixture,
    extra: &[&str],
) -> (
    Controller,
    std::sync::Arc<capc_health_shim::status::board::StatusBoard>,
) {
    let (c, report) = f.controller(extra).await;
    let mut c = c.with_scorecard_memory(ScorecardStore::new(&f.client, &f.ns, MEMORY));
    c.restore_scorecard().await;
    (c, report)
}

async fn stored(f: &Fixture) -> std::collections::BTreeMap<String, String> {
    let cms: Api<ConfigMap> = Api::namespaced(f.client.clone(), &f.ns);
    cms.get_opt(MEMORY)
        .await
        .expect("GET the memory ConfigMap")
        .and_then(|c| c.data)
        .unwrap_or_default()
}

/// Observe mode: a VM whose guest is silent long enough to be judged `False`
/// (GuestNetworkSilent), then sends traffic and its Machine gets its Node, is exactly one
/// false alarm once it stayed `True` for the settle time; a VM that boots and joins normally
/// beside it is none. The counter and `/status` say so; the count reaches the memory
/// ConfigMap, and a new leader reading it shows the same counts and does not count the
/// Machine again. A stored copy it cannot read is kept aside and reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_silent_vm_that_then_joins_is_one_false_alarm_kept_for_the_next_leader() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-slow", "healthy", "Starting"),
            ("vm-fine", "healthy", "Starting"),
        ],
    )
    .await;
    // The slow VM's guest sends nothing (its NIC down) until the test lets it join.
    f.sim
        .inject_fault("vm-slow", Fault::NicDown)
        .expect("fault");
    f.machine("m-slow", Some("vm-slow"), false, "fd1").await;
    f.machine("m-fine", Some("vm-fine"), false, "fd1").await;
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
    let args = ["--mode", "observe", "--scorecard-settle", "3s"];
    let (mut c, report) = with_memory(&f, &args).await;

    f.cycle_until(
        &mut c,
        &["m-slow", "m-fine"],
        Duration::from_secs(90),
        |s| {
            is(&s["m-slow"], "False", "GuestNetworkSilent") && is(&s["m-fine"], "True", "VMHealthy")
        },
    )
    .await;
    // The healthy one joins; the silent one recovers and joins.
    give_node("m-fine").await;
    f.sim.clear_faults("vm-slow").expect("clear");
    f.cycle_until(&mut c, &["m-slow"], Duration::from_secs(60), |s| {
        is(&s["m-slow"], "True", "VMHealthy")
    })
    .await;
    give_node("m-slow").await;
    let r = cycle_until_report(
        &mut c,
        &report,
        Duration::from_secs(60),
        |r| false_alarms(r) == 1 && r.scorecard.as_ref().is_some_and(|s| s.following == 0),
        scorecard_of,
    )
    .await;
    let s = r.scorecard.clone().unwrap();
    assert_eq!(
        s.totals.len(),
        1,
        "only the false alarm: {}",
        scorecard_of(&r)
    );
    assert_eq!(
        s.uneventful,
        1,
        "m-fine booted and joined: {}",
        scorecard_of(&r)
    );
    let o = s.recent.last().expect("the outcome");
    assert_eq!(o.machine, format!("{}/m-slow", f.ns));
    assert_eq!(o.reason, "GuestNetworkSilent");
    assert_eq!(o.mode, capi_model::apis::Mode::Observe);
    // The simulator's template, offering and zone, as CloudStack lists them.
    assert_eq!(
        (
            o.labels.template.as_str(),
            o.labels.offering.as_str(),
            o.labels.zone.as_str()
        ),
        ("capi-ubuntu-2204-kube", "Medium Instance", "zone-a"),
        "{o:?}"
    );
    // Observing, nothing was annotated.
    assert!(!f.verdict("m-slow").await.1);
    // Both boots measured, for the one template/offering/zone they share.
    assert_eq!(s.baselines.len(), 1, "{:?}", s.baselines);
    assert_eq!(s.baselines[0].count, 2);
    let metrics = c.metrics().encode();
    assert!(
        metrics.contains(
            "capc_health_outcomes_total{outcome=\"false-alarm\",reason=\"GuestNetworkSilent\"} 1"
        ),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("false-alarm"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // More cycles count nothing more.
    for _ in 0..5 {
        c.cycle(jiff::Timestamp::now()).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(false_alarms(&report.read().await.clone()), 1);

    // The count reaches the ConfigMap (written at most every 10 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let kept = loop {
        c.cycle(jiff::Timestamp::now()).await;
        let data = stored(&f).await;
        if let Some(k) = data
            .get(DATA_KEY)
            .and_then(|j| {
                serde_json::from_str::<capc_health_shim::verdict::scorecard::Kept>(j).ok()
            })
            .filter(|k| k.count("false-alarm") == 1)
        {
            break k;
        }
        assert!(std::time::Instant::now() < deadline, "not stored: {data:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let before = report.read().await.scorecard.clone().unwrap();
    assert_eq!(kept.totals, before.totals);
    drop(c);

    // A new leader: the same counts, and the Machine (a healthy Node now) is not counted again.
    let (mut next, next_report) = with_memory(&f, &args).await;
    for _ in 0..8 {
        next.cycle(jiff::Timestamp::now()).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let after = next_report.read().await.scorecard.clone().unwrap();
    assert_eq!(after.totals, before.totals);
    assert_eq!(after.since, before.since);
    assert_eq!(after.uneventful, before.uneventful);
    assert_eq!(after.memory.as_ref().unwrap().read.as_str(), "ok");
    drop(next);

    // A stored copy no build can read: kept aside, reported, and a fresh count written.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &f.ns);
    cms.patch(
        MEMORY,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {DATA_KEY: "<html>a proxy's page</html>"}})),
    )
    .await
    .expect("corrupt the stored scorecard");
    let (mut third, third_report) = with_memory(&f, &args).await;
    let r = cycle_until_report(
        &mut third,
        &third_report,
        Duration::from_secs(30),
        |r| {
            r.scorecard
                .as_ref()
                .and_then(|s| s.memory.as_ref()?.written_at)
                .is_some()
        },
        scorecard_of,
    )
    .await;
    let m = r.scorecard.unwrap().memory.unwrap();
    assert_eq!(m.read.as_str(), "unreadable");
    assert!(
        m.kept_aside
            .as_deref()
            .is_some_and(|k| k.starts_with(ASIDE_KEY)),
        "{m:?}"
    );
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains(DATA_KEY) && p.contains("cannot be decoded")),
        "{:?}",
        r.problems
    );
    let data = stored(&f).await;
    assert_eq!(data[ASIDE_KEY], "<html>a proxy's page</html>");
    assert!(serde_json::from_str::<serde_json::Value>(&data[DATA_KEY]).is_ok());
    f.cleanup().await;
}
