//! Issue 45 on the real API server: a virtual router stopped behind the VMs of three clusters of
//! one zone (one CloudStack scope) is one incident naming the router, one Warning Event on each
//! Cluster, the `capc_health_incidents` series and the router alert firing in promtool on the
//! scraped series; one `listRouters` for the whole incident; once the owners replaced the failed
//! Machines the incident ends and is remembered in the scorecard window.
//!
//! The storm: an Isolated network's router that cannot start makes every VM deployed on the
//! network fail to start, and a user VM whose first start fails is left in `Error`
//! (`UserVmManagerImpl` marks it so when the deployment fails); the VMs of the Shared network
//! boot and join. (A router stopped under VMs that already run does not show in CloudStack's
//! counters: the guests keep sending ARP for their gateway, so their traffic rises.)

mod kube_support;
mod metric_names;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::json;

use capc_health_shim::controller::incidents::INCIDENT_EVENT_REASON;
use capc_health_shim::status::StatusReport;
use capc_health_shim::verdict::incidents::CauseKind;
use cloudstack_sim::RouterState;
use kube_support::{
    cycle_until_report, kube_client, simulator_from_scenario, Fixture, SIM_KEY, SIM_SECRET, ZONE_ID,
};
use metric_names::promtool::firing_count_is;

const BEHIND: usize = 3;
const BESIDE: usize = 4;

fn incidents_of(r: &StatusReport) -> String {
    serde_json::to_string_pretty(&r.incidents).unwrap()
}

/// The incidents with every Machine's verdict and the scopes, for a wait that timed out.
fn incidents_and_verdicts(r: &StatusReport) -> String {
    let verdicts: Vec<String> = r
        .clusters
        .iter()
        .flat_map(|(c, cr)| {
            cr.machines.iter().map(move |(m, mr)| {
                format!(
                    "{c} {m}: {:?} {:?} vm {:?}",
                    mr.verdict, mr.reason, mr.vm_id
                )
            })
        })
        .collect();
    let scopes: Vec<String> = r
        .scopes
        .iter()
        .map(|s| {
            format!(
                "{} machines {} held {} error {:?}",
                s.key, s.machines, s.held, s.last_error
            )
        })
        .collect();
    format!(
        "incidents {}\nverdicts:\n{}\nscopes:\n{}\nproblems {:?}",
        incidents_of(r),
        verdicts.join("\n"),
        scopes.join("\n"),
        r.problems
    )
}

/// Per cluster `c`: `BEHIND` VMs on the Isolated network `iso` and `BESIDE` on the Shared
/// network, all from the same template in the same zone.
fn scenario() -> serde_json::Value {
    let mut vms = Vec::new();
    for c in 0..3 {
        for i in 0..BEHIND {
            vms.push(
                json!({"name": format!("iso-{c}-{i}"), "id": uuid::Uuid::new_v4().to_string(),
                "guest": "healthy", "state": "Error", "network": "iso"}),
            );
        }
        for i in 0..BESIDE {
            vms.push(
                json!({"name": format!("shared-{c}-{i}"), "id": uuid::Uuid::new_v4().to_string(),
                "guest": "healthy", "state": "Starting", "network": "capi-shared"}),
            );
        }
    }
    json!({
        "settings": {"stats_interval_seconds": 1, "boot_seconds": 1, "guest_speedup": 60,
                     "guest_boot_seconds": 1.5, "guest_join_seconds": 3},
        "accounts": [{"name": "admin", "type": "Admin", "api_key": SIM_KEY, "secret_key": SIM_SECRET}],
        "zones": [{"name": "zone-a", "id": ZONE_ID}],
        "networks": [
            {"name": "capi-shared", "zone": "zone-a", "cidr": "10.1.0.0/16"},
            {"name": "iso", "zone": "zone-a", "cidr": "10.2.0.0/24", "type": "Isolated"},
        ],
        "vms": vms,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_stopped_router_behind_three_clusters_is_one_incident_naming_it() {
    let client = kube_client().await;
    let f = Fixture::with_simulator(
        client.clone(),
        simulator_from_scenario(scenario(), 1.0).await,
    )
    .await;
    // The network's router is stopped (the VMs behind it failed to deploy: Error).
    let routers = f
        .sim
        .routers_of("iso")
        .expect("the Isolated network's routers");
    assert_eq!(routers.len(), 1, "one router: {routers:?}");
    let router = routers[0].clone();
    f.sim
        .set_router_state(&router, RouterState::Stopped)
        .expect("stop the router");
    // Three clusters (namespaces) on the same key and zone: one CloudStack scope.
    let tenants = [
        f.ns.clone(),
        f.tenant(SIM_KEY, SIM_SECRET).await,
        f.tenant(SIM_KEY, SIM_SECRET).await,
    ];
    for (c, ns) in tenants.iter().enumerate() {
        for i in 0..BEHIND {
            f.machine_in(
                ns,
                &format!("iso-{i}"),
                Some(&format!("iso-{c}-{i}")),
                false,
                "fd1",
            )
            .await;
        }
        for i in 0..BESIDE {
            f.machine_in(
                ns,
                &format!("shared-{i}"),
                Some(&format!("shared-{c}-{i}")),
                false,
                "fd1",
            )
            .await;
        }
    }
    let mut args = Vec::new();
    for ns in &tenants[1..] {
        args.extend(["--namespace", ns.as_str()]);
    }
    let (mut c, report) = f.controller(&args).await;

    let failing = 3 * BEHIND;
    let healthy = 3 * BESIDE;
    let r = cycle_until_report(
        &mut c,
        &report,
        Duration::from_secs(120),
        |r| {
            r.incidents.len() == 1
                && r.incidents[0].failing == failing
                && r.incidents[0].healthy == healthy
                && r.incidents[0]
                    .cause
                    .as_ref()
                    .is_some_and(|c| c.kind == CauseKind::Router)
        },
        incidents_and_verdicts,
    )
    .await;
    let incident = &r.incidents[0];
    let cause = incident.cause.as_ref().unwrap();
    assert_eq!(cause.id, router, "{}", incidents_of(&r));
    assert_eq!(cause.state.as_deref(), Some("Stopped"));
    assert_eq!((cause.failing, cause.healthy), (failing, 0));
    assert_eq!(cause.failing_coverage, 1.0);
    let want_clusters: Vec<String> = {
        let mut v: Vec<String> = tenants.iter().map(|ns| format!("{ns}/c1")).collect();
        v.sort();
        v
    };
    assert_eq!(incident.clusters, want_clusters);
    assert_eq!(incident.machines.len(), failing);
    assert!(
        incident.summary.starts_with(&format!(
            "{failing} of {failing} failing Machines share router "
        )),
        "{}",
        incident.summary
    );
    // Every failing Machine is one of those behind the router; the shared ones are True.
    for m in &incident.machines {
        assert!(m.contains("/iso-"), "{m} failing");
    }

    // More cycles: still one incident, still one lookup, one Event per Cluster.
    for _ in 0..4 {
        c.cycle(jiff::Timestamp::now()).await;
    }
    let metrics = c.metrics().encode();
    let samples = metric_names::samples(&metrics);
    let scope = incident.scope.as_str();
    assert_eq!(
        metric_names::value(
            &samples,
            "capc_health_incidents",
            &[("scope", scope), ("cause_kind", "router")]
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric_names::value(
            &samples,
            "capc_health_incident_failing_machines",
            &[("scope", scope), ("cause_kind", "router")]
        ),
        Some(failing as f64)
    );
    assert_eq!(
        metric_names::value(
            &samples,
            "capc_health_cloudstack_calls_total",
            &[("command", "listRouters"), ("result", "ok")]
        ),
        Some(1.0),
        "one router lookup for the incident, counted: {metrics}"
    );
    for ns in &tenants {
        let events: Api<Event> = Api::namespaced(f.client.clone(), ns);
        let deadline = Instant::now() + Duration::from_secs(20);
        let ours = loop {
            let list = events.list(&ListParams::default()).await.expect("events");
            let ours: Vec<Event> = list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(INCIDENT_EVENT_REASON))
                .collect();
            if !ours.is_empty() || Instant::now() > deadline {
                break ours;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        assert_eq!(ours.len(), 1, "{ns}: {ours:#?}");
        let e = &ours[0];
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.involved_object.kind.as_deref(), Some("Cluster"));
        assert_eq!(e.involved_object.name.as_deref(), Some("c1"));
        assert!(e.involved_object.uid.is_some(), "kubectl describe finds it");
        assert_eq!(e.count.unwrap_or(1), 1, "{ns}: told once");
        let note = e.message.as_deref().unwrap_or_default();
        assert!(note.contains(&router), "{note}");
        assert!(note.contains("state Stopped"), "{note}");
    }
    // The alerts on what the shim exports: the router's fires, the host's does not.
    firing_count_is(
        &metrics,
        "CAPCHealthIncidentRouter",
        &[("scope", scope), ("cause_kind", "router")],
        1,
    )
    .unwrap();
    firing_count_is(&metrics, "CAPCHealthIncidentHost", &[], 0).unwrap();
    firing_count_is(&metrics, "CAPCHealthIncidentUnexplained", &[], 0).unwrap();

    // The owners replace the failed Machines (CAPI deletes them): fewer than
    // --incident-min-failing are left, the incident ends, its series go, and the scorecard
    // window remembers it.
    for ns in &tenants {
        let machines: Api<kube::api::DynamicObject> =
            Api::namespaced_with(f.client.clone(), ns, &f.resources.machine);
        for i in 0..BEHIND {
            machines
                .delete(&format!("iso-{i}"), &Default::default())
                .await
                .expect("delete a failed Machine");
        }
    }
    let r = cycle_until_report(
        &mut c,
        &report,
        Duration::from_secs(120),
        |r| {
            r.incidents.is_empty()
                && r.scorecard
                    .as_ref()
                    .is_some_and(|s| !s.incidents.is_empty())
        },
        |r| {
            format!(
                "open {}; remembered {:?}",
                incidents_of(r),
                r.scorecard.as_ref().map(|s| &s.incidents)
            )
        },
    )
    .await;
    let remembered = &r.scorecard.as_ref().unwrap().incidents;
    assert_eq!(remembered.len(), 1);
    assert_eq!(remembered[0].scope, scope);
    assert_eq!(remembered[0].peak_failing, failing);
    assert_eq!(remembered[0].cause.as_ref().unwrap().id, router);
    let metrics = c.metrics().encode();
    assert!(
        !metrics.contains("capc_health_incidents{"),
        "series gone with the incident: {metrics}"
    );
    firing_count_is(&metrics, "CAPCHealthIncidentRouter", &[], 0).unwrap();
    f.cleanup().await;
}
