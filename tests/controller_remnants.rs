//! The remnant report inside the controller, against a real kube-apiserver (CAPI, CABPK, KCP and
//! CAPC CRDs) and `cloudstack-sim`: the kinds a CAPC cluster is made of are discovered and
//! watched as metadata; after `--remnant-grace`, a CloudStackMachine stuck deleting (with what
//! CloudStack says of its VM), objects whose controller owner is gone and one labelled for a
//! Cluster that does not exist are reported — in `/status`, the gauge and one Warning Event
//! each — and nothing else: not an object whose owner is present, not one clusterctl is moving,
//! not one owned by a kind the shim does not watch. Each drops out when it is gone.

mod kube_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use capc_health_shim::controller::remnants::{discover_remnant_kinds, MetadataWatches};
use capc_health_shim::remnants::RemnantReason;
use capc_health_shim::status::StatusReport;
use cloudstack_sim::catalog::{JobCommand, JobStatus};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube_support::{create, cycle_until_report, get, kube_client, Fixture, SIM_KEY};
use serde_json::json;

fn found(r: &StatusReport) -> BTreeSet<(String, String, RemnantReason)> {
    r.remnants
        .iter()
        .map(|x| (x.kind.clone(), x.name.clone(), x.reason))
        .collect()
}

async fn patch(f: &Fixture, r: &ApiResource, name: &str, body: serde_json::Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(f.client.clone(), &f.ns, r);
    api.patch(name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .expect("patch");
}

async fn delete(f: &Fixture, r: &ApiResource, name: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(f.client.clone(), &f.ns, r);
    api.delete(name, &DeleteParams::default())
        .await
        .expect("delete");
}

const CSM_FINALIZER: &str = "cloudstackmachine.infrastructure.cluster.x-k8s.io";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn what_a_deletion_left_behind_is_reported_with_its_reason_and_nothing_else() {
    let client = kube_client().await;
    let f = Fixture::new(client.clone(), &[("vm-stuck", "healthy", "Starting")]).await;
    let kinds = discover_remnant_kinds(&client).await;
    let kind_names: BTreeSet<&str> = kinds.iter().map(|k| k.kind.as_str()).collect();
    assert_eq!(kind_names.len(), 13, "every kind is served: {kind_names:?}");
    let kubeadm_config = kinds
        .iter()
        .find(|k| k.kind == "KubeadmConfig")
        .expect("CABPK is served")
        .clone();

    // m-stuck is owned by the fixture's MachineSet `owner`, which does not exist (as the
    // Machines of every fixture): it dangles, and so is reported once the grace is over.
    f.machine("m-stuck", Some("vm-stuck"), false, "fd1").await;
    let machine = get(&f.client, &f.ns, &f.resources.machine, "m-stuck").await;
    let machine_uid = machine["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    let config = |name: &str, extra: serde_json::Value| {
        let mut body = json!({"apiVersion": kubeadm_config.api_version, "kind": "KubeadmConfig",
            "metadata": {"name": name, "namespace": f.ns,
                "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": {"format": "cloud-config"}});
        for (k, v) in extra.as_object().expect("object") {
            body["metadata"][k] = v.clone();
        }
        body
    };
    let owner = |kind: &str, name: &str, uid: &str| {
        json!([{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": kind, "name": name,
            "uid": uid, "controller": true}])
    };
    let gone_uid = "0c9d8a2e-5b1f-4f3e-9a77-3e0d1c2b4a55";
    for (name, extra) in [
        // Its Machine is present: not a remnant.
        (
            "kc-owned",
            json!({"ownerReferences": owner("Machine", "m-stuck", &machine_uid)}),
        ),
        // Its Machine is gone.
        (
            "kc-orphaned",
            json!({"ownerReferences": owner("Machine", "m-gone", gone_uid)}),
        ),
        // clusterctl is moving it: its owner is re-linked on the target side.
        (
            "kc-moving",
            json!({"ownerReferences": owner("Machine", "m-gone", gone_uid),
                "annotations": {"clusterctl.cluster.x-k8s.io/delete-for-move": ""}}),
        ),
        // Owned by a kind the shim does not watch: it cannot tell, so it does not say.
        (
            "kc-foreign-owner",
            json!({"ownerReferences": owner("FooPool", "p1", gone_uid)}),
        ),
        // Labelled for a Cluster that does not exist.
        (
            "kc-lost",
            json!({"labels": {"cluster.x-k8s.io/cluster-name": "c-gone"}}),
        ),
    ] {
        create(&f.client, &f.ns, &kubeadm_config, config(name, extra)).await;
    }
    // The CloudStackMachine gets CAPC's finalizer and is deleted: it stays, deleting.
    let csm = f.resources.cloudstack_machine.clone();
    patch(
        &f,
        &csm,
        "m-stuck-csm",
        json!({"metadata": {"finalizers": [CSM_FINALIZER]}}),
    )
    .await;
    delete(&f, &csm, "m-stuck-csm").await;
    // CAPC's destroy of its VM failed (a job of the key's account, as CloudStack records
    // one): once it is reported, a look at the account's destroy jobs puts the error into why.
    const DESTROY_ERROR: &str = "Unable to destroy the VM: its host does not answer";
    f.sim.with_world(|w| {
        let vm = w.vm_index_by_id(&f.vm_ids["vm-stuck"]).expect("vm");
        let account = w.account_by_api_key(SIM_KEY).expect("account");
        let at_ms = w.now_ms();
        w.add_job(
            account,
            JobCommand::DestroyVm { vm },
            &f.vm_ids["vm-stuck"],
            JobStatus::Failed {
                at_ms,
                code: 530,
                cs: 4250,
                text: DESTROY_ERROR.into(),
            },
        );
    });

    let (controller, report) = f
        .controller(&["--orphan-grace", "2s", "--remnant-grace", "2s"])
        .await;
    let watches = MetadataWatches::start(&client, kinds.clone(), std::slice::from_ref(&f.ns));
    let mut controller = controller.with_remnant_report(watches);
    let started = jiff::Timestamp::now();

    let want: BTreeSet<(String, String, RemnantReason)> = [
        (
            "CloudStackMachine",
            "m-stuck-csm",
            RemnantReason::StuckDeleting,
        ),
        ("Machine", "m-stuck", RemnantReason::OwnerGone),
        ("KubeadmConfig", "kc-orphaned", RemnantReason::OwnerGone),
        ("KubeadmConfig", "kc-lost", RemnantReason::ClusterGone),
    ]
    .into_iter()
    .map(|(k, n, r)| (k.to_string(), n.to_string(), r))
    .collect();
    let grace = jiff::SignedDuration::from_secs(2);
    let r = cycle_until_report(
        &mut controller,
        &report,
        Duration::from_secs(60),
        |r| {
            // In every report: a dangling object appears only once the grace has passed since
            // the finder first saw it so (a finder without the grace reports it at once).
            for x in r
                .remnants
                .iter()
                .filter(|x| x.reason != RemnantReason::StuckDeleting)
            {
                assert!(
                    r.generated_at.is_some_and(|at| at >= x.since + grace),
                    "{} {} reported at {:?} though dangling only since {} (grace {grace:#})",
                    x.kind,
                    x.name,
                    r.generated_at,
                    x.since
                );
            }
            found(r) == want
        },
        |r| {
            format!(
                "remnants {:#?}, detection {:?}",
                r.remnants, r.remnant_detection
            )
        },
    )
    .await;
    let d = &r.remnant_detection;
    assert!(d.enabled);
    assert_eq!(d.kinds.len(), 13, "{d:?}");
    assert!(d.kinds_not_synced.is_empty(), "{d:?}");
    for x in &r.remnants {
        match x.reason {
            RemnantReason::StuckDeleting => {
                assert_eq!(x.blocking_finalizers, vec![CSM_FINALIZER.to_string()]);
                let vm = f.vm_ids["vm-stuck"].to_ascii_lowercase();
                assert_eq!(x.related_vm.as_deref(), Some(vm.as_str()));
                assert!(
                    x.why.contains(&format!("CloudStack shows VM {vm} Running")),
                    "{}",
                    x.why
                );
            }
            _ => {
                // Dangling: reported no sooner than the grace after the shim first saw it.
                assert!(x.since >= started, "{x:?}");
                assert!(x.blocking_finalizers.is_empty());
            }
        }
        assert_eq!(
            x.cluster.as_deref(),
            Some(if x.name == "kc-lost" {
                format!("{}/c-gone", f.ns)
            } else {
                format!("{}/c1", f.ns)
            })
            .as_deref()
        );
    }
    // Well past the grace, still nothing else (the owned, moving and foreign-owned ones).
    let settle = Instant::now() + Duration::from_secs(3);
    while Instant::now() < settle {
        controller.cycle(jiff::Timestamp::now()).await;
        assert_eq!(found(&report.read().await.clone()), want);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let r = cycle_until_report(
        &mut controller,
        &report,
        Duration::from_secs(30),
        |r| {
            r.remnants.iter().any(|x| {
                x.why
                    .contains(&format!("its last destroy failed: {DESTROY_ERROR}"))
            })
        },
        |r| format!("remnants {:#?}", r.remnants),
    )
    .await;
    assert_eq!(found(&r), want);
    let metrics = controller.metrics().encode();
    assert_eq!(
        series_value(
            &metrics,
            "capc_health_cloudstack_calls_total{command=\"listAsyncJobs\",result=\"ok\"}"
        ),
        Some(1.0),
        "one listing of the destroy jobs (at most one a minute):\n{metrics}"
    );
    for line in [
        format!(
            "capc_health_remnant_objects{{cluster=\"{}/c1\",kind=\"KubeadmConfig\"}} 1",
            f.ns
        ),
        format!(
            "capc_health_remnant_objects{{cluster=\"{}/c-gone\",kind=\"KubeadmConfig\"}} 1",
            f.ns
        ),
        format!(
            "capc_health_remnant_objects{{cluster=\"{}/c1\",kind=\"CloudStackMachine\"}} 1",
            f.ns
        ),
    ] {
        let (series, value) = line.rsplit_once(' ').expect("series and value");
        assert_eq!(
            series_value(&metrics, series),
            value.parse().ok(),
            "{line} not in\n{metrics}"
        );
    }

    // One Warning Event per remnant (not one per cycle): on Cluster c1 when it exists, on the
    // object itself for the one whose Cluster is gone.
    let events: Api<Event> = Api::namespaced(f.client.clone(), &f.ns);
    let deadline = Instant::now() + Duration::from_secs(20);
    let ours = loop {
        let list = events.list(&ListParams::default()).await.expect("events");
        let ours: Vec<Event> = list
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("ObjectLeftBehind"))
            .collect();
        if ours.len() >= 4 || Instant::now() > deadline {
            break ours;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(ours.len(), 4, "{ours:#?}");
    for e in &ours {
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.count.unwrap_or(1), 1, "published once");
        let on = (
            e.involved_object.kind.as_deref(),
            e.involved_object.name.as_deref(),
        );
        if e.message.as_deref().unwrap_or_default().contains("kc-lost") {
            assert_eq!(on, (Some("KubeadmConfig"), Some("kc-lost")));
        } else {
            assert_eq!(on, (Some("Cluster"), Some("c1")), "{e:?}");
        }
    }

    // What holds them goes: the finalizer is removed (as CAPC does once the VM is destroyed),
    // the dangling config deleted. They drop out; the gauge's series go with them.
    patch(
        &f,
        &csm,
        "m-stuck-csm",
        json!({"metadata": {"finalizers": null}}),
    )
    .await;
    delete(&f, &kubeadm_config, "kc-orphaned").await;
    let r = cycle_until_report(
        &mut controller,
        &report,
        Duration::from_secs(30),
        |r| found(r).len() == 2,
        |r| {
            format!(
                "remnants {:#?}, detection {:?}",
                r.remnants, r.remnant_detection
            )
        },
    )
    .await;
    assert!(found(&r)
        .iter()
        .all(|(_, n, _)| n == "m-stuck" || n == "kc-lost"));
    let metrics = controller.metrics().encode();
    assert!(
        !metrics.contains("kind=\"CloudStackMachine\""),
        "the series went with the remnant:\n{metrics}"
    );
    assert!(is_after(r.generated_at, started));
    f.cleanup().await;
}

fn is_after(t: Option<jiff::Timestamp>, start: jiff::Timestamp) -> bool {
    t.is_some_and(|t| t > start)
}

/// The value of exactly the series `series` (name and labels as exposed) in `text`: a prefix
/// of another series, or of a longer value, does not count.
fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(s, _)| *s == series)
        .and_then(|(_, v)| v.parse().ok())
}

/// With `--no-orphan-report`, a CloudStackMachine stuck deleting is still reported with what
/// CloudStack says of its VM: the listing it is read from is kept for the remnant report too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_stuck_deletion_shows_its_vm_state_with_the_orphan_report_off() {
    let client = kube_client().await;
    let f = Fixture::new(client.clone(), &[("vm-stuck", "healthy", "Starting")]).await;
    let kinds = discover_remnant_kinds(&client).await;
    f.machine("m-stuck", Some("vm-stuck"), false, "fd1").await;
    let csm = f.resources.cloudstack_machine.clone();
    patch(
        &f,
        &csm,
        "m-stuck-csm",
        json!({"metadata": {"finalizers": [CSM_FINALIZER]}}),
    )
    .await;
    delete(&f, &csm, "m-stuck-csm").await;

    let (controller, report) = f
        .controller(&["--no-orphan-report", "--remnant-grace", "1s"])
        .await;
    let watches = MetadataWatches::start(&client, kinds, std::slice::from_ref(&f.ns));
    let mut controller = controller.with_remnant_report(watches);
    let vm = f.vm_ids["vm-stuck"].to_ascii_lowercase();
    let stuck = |r: &StatusReport| {
        r.remnants
            .iter()
            .find(|x| x.reason == RemnantReason::StuckDeleting && x.name == "m-stuck-csm")
            .cloned()
    };
    // Reported first (the grace), then within a few cycles with the VM's state.
    let r = cycle_until_report(
        &mut controller,
        &report,
        Duration::from_secs(30),
        |r| stuck(r).is_some(),
        |r| format!("remnants {:#?}", r.remnants),
    )
    .await;
    assert!(!r.orphan_detection.enabled, "{:?}", r.orphan_detection);
    let r = cycle_until_report(
        &mut controller,
        &report,
        Duration::from_secs(15),
        |r| stuck(r).is_some_and(|x| x.why.contains(&format!("CloudStack shows VM {vm} Running"))),
        |r| format!("remnants {:#?}", r.remnants),
    )
    .await;
    let x = stuck(&r).expect("reported");
    assert_eq!(x.related_vm.as_deref(), Some(vm.as_str()));
    f.cleanup().await;
}
