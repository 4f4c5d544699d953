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

/// Issue 44's baseline test: 200 Machines boot from two templates, 100 each; the test gives each
/// its Node after a boot time of its own (fast template 20–28 s, slow 50–70 s after the
/// Machine's creation). The scorecard's p95 per template is within 10 % of the p95 of those boot
/// times, and the one MachineHealthCheck covering them, whose nodeStartupTimeout (45 s) is
/// below 1.5 × the slow template's p95 but not the fast one's, is warned about — on `/status`
/// and in the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn two_hundred_boots_from_two_templates_give_their_p95_and_warn_of_a_short_mhc_timer() {
    use kube_support::{simulator_from, ZONE_ID};
    const PER_TEMPLATE: usize = 100;
    let templates = [
        (
            "fast-tmpl",
            "6a0b1b43-5f6e-4c5b-9a77-1d5f3c0e0a01",
            20.0,
            28.0,
        ),
        (
            "slow-tmpl",
            "6a0b1b43-5f6e-4c5b-9a77-1d5f3c0e0a02",
            50.0,
            70.0,
        ),
    ];
    let mut vms = Vec::new();
    for (t, _, _, _) in templates {
        for i in 0..PER_TEMPLATE {
            vms.push(
                json!({"name": format!("{t}-vm-{i}"), "id": uuid::Uuid::new_v4().to_string(),
                "guest": "healthy", "state": "Starting", "template": t}),
            );
        }
    }
    let scenario = json!({
        "settings": {"stats_interval_seconds": 1, "boot_seconds": 1, "guest_speedup": 60,
                     "guest_boot_seconds": 1.5, "guest_join_seconds": 3},
        "zones": [{"name": "zone-a", "id": ZONE_ID}],
        "networks": [{"name": "capi-shared", "zone": "zone-a", "cidr": "10.1.0.0/16"}],
        "templates": templates.iter().map(|(n, id, _, _)| json!({"name": n, "id": id, "zones": ["zone-a"]})).collect::<Vec<_>>(),
        "vms": vms,
    });
    let client = kube_client().await;
    let f = Fixture::with_simulator(client.clone(), simulator_from(scenario, 1.0).await).await;
    // The fixture's MHC covers every Machine: its node startup timeout, 45 s.
    let timeout = if f.resources.mhc.version == "v1beta2" {
        json!({"spec": {"checks": {"nodeStartupTimeoutSeconds": 45}}})
    } else {
        json!({"spec": {"nodeStartupTimeout": "45s"}})
    };
    kube_support::merge_patch(&client, &f.ns, &f.resources.mhc, "c1-mhc", timeout).await;

    let (mut c, report) = f.controller(&[]).await;
    let machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &f.ns, &f.resources.machine);
    // Created in turn (cycling meanwhile so every one is first seen without its Node); each
    // gets its boot time, drawn evenly over its template's range.
    let mut schedule = Vec::new();
    let mut created_all = 0;
    for (t, _, low, high) in templates {
        for i in 0..PER_TEMPLATE {
            let name = format!("{t}-{i}");
            f.machine(&name, Some(&format!("{t}-vm-{i}")), false, "fd1")
                .await;
            let created: jiff::Timestamp = machines
                .get(&name)
                .await
                .expect("GET")
                .metadata
                .creation_timestamp
                .expect("creationTimestamp")
                .0
                .to_string()
                .parse()
                .unwrap();
            let boot = low + (high - low) * (i as f64 + 0.5) / PER_TEMPLATE as f64;
            schedule.push((name, t, created, boot));
            created_all += 1;
            if created_all % 20 == 0 {
                c.cycle(jiff::Timestamp::now()).await;
            }
        }
    }
    // The Nodes come at their times, from a task of their own.
    let nodes = {
        let machines = machines.clone();
        let mut due: Vec<(jiff::Timestamp, String)> = schedule
            .iter()
            .map(|(n, _, created, boot)| {
                (
                    *created + jiff::SignedDuration::from_secs_f64(*boot),
                    n.clone(),
                )
            })
            .collect();
        due.sort();
        tokio::spawn(async move {
            for (at, name) in due {
                let wait = at.duration_since(jiff::Timestamp::now());
                if wait.is_positive() {
                    tokio::time::sleep(wait.unsigned_abs()).await;
                }
                let status = json!({"status": {"nodeRef": {"apiVersion": "v1", "kind": "Node", "name": name}}});
                machines
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .unwrap_or_else(|e| panic!("status.nodeRef of {name}: {e}"));
            }
        })
    };
    let r = cycle_until_report(
        &mut c,
        &report,
        Duration::from_secs(180),
        |r| {
            r.scorecard.as_ref().is_some_and(|s| {
                s.baselines.iter().map(|b| b.count).sum::<u64>() == 2 * PER_TEMPLATE as u64
            })
        },
        |r| format!("{:?}", r.scorecard.as_ref().map(|s| &s.baselines)),
    )
    .await;
    nodes.await.expect("the Node task");
    let s = r.scorecard.unwrap();
    let p95 = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[((v.len() as f64) * 0.95).ceil() as usize - 1]
    };
    for (t, _, _, _) in templates {
        let row = s.baselines.iter().find(|b| b.key.template == t).expect(t);
        assert_eq!(row.count, PER_TEMPLATE as u64, "{row:?}");
        let measured = row.from_creation.expect("creation → Node").p95;
        let simulated = p95(schedule.iter().filter(|x| x.1 == t).map(|x| x.3).collect());
        let off = (measured - simulated).abs() / simulated;
        eprintln!(
            "{t}: p95 simulated {simulated:.1} s, scorecard {measured:.1} s ({:.1} % off)",
            off * 100.0
        );
        assert!(off < 0.10, "{t}: {measured} vs {simulated}");
    }
    let mhc = format!("{}/c1-mhc", f.ns);
    assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
    match &s.warnings[0] {
        capc_health_shim::verdict::scorecard::Warning::MhcTimeoutBelowBoot {
            mhc: m,
            timeout_secs,
            key,
            ..
        } => {
            assert_eq!(
                (m, *timeout_secs, key.template.as_str()),
                (&mhc, 45, "slow-tmpl")
            );
        }
        w => panic!("{w:?}"),
    }
    let metrics = c.metrics().encode();
    assert!(
        metrics.contains(&format!(
            "capc_health_scorecard_warnings{{warning=\"mhc-timeout-below-boot\",subject=\"{mhc}\"}} 1"
        )),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(|l| l
            .starts_with("capc_health_boot_to_node_seconds{template=\"slow-tmpl\"")
            && l.contains("quantile=\"0.95\"")),
        "{metrics}"
    );
    f.cleanup().await;
}
