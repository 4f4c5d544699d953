//! The orphan report inside the controller, against a real kube-apiserver (CAPI/CAPC CRDs) and
//! `cloudstack-sim`: VMs whose CloudStackMachine went away (one let go with its instance, one
//! named after a CloudStackMachine deleted before it recorded one) are reported in `/status`,
//! in the gauge and by one Warning Event on the Cluster each; a VM destroyed afterwards drops
//! out; other VMs of the project never show up.

mod kube_support;

use std::time::{Duration, Instant};

use capc_health_shim::controller::cycle::Controller;
use capc_health_shim::status::OrphanKind;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DeleteParams, ListParams};
use kube_support::{cycle_until_report, is, kube_client, Fixture};

async fn delete(f: &Fixture, r: &kube::core::ApiResource, name: &str) {
    let api: Api<kube::core::DynamicObject> = Api::namespaced_with(f.client.clone(), &f.ns, r);
    api.delete(name, &DeleteParams::default())
        .await
        .expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn vms_left_by_gone_cloudstack_machines_are_reported_and_clear_when_destroyed() {
    let client = kube_client().await;
    // The VM `m-late-csm` is what CAPC deploys for CloudStackMachine m-late-csm (it names VMs
    // after them); `jenkins` is someone else's VM in the same project.
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-kept", "healthy", "Starting"),
            ("vm-let-go", "healthy", "Starting"),
            ("m-late-csm", "healthy", "Starting"),
            ("jenkins", "healthy", "Starting"),
        ],
    )
    .await;
    f.machine("m-kept", Some("vm-kept"), false, "fd1").await;
    f.machine("m-let-go", Some("vm-let-go"), false, "fd1").await;
    // Being created: no instanceID yet, its VM already listed — CAPC will adopt it by name.
    f.machine("m-late", None, false, "fd1").await;
    let (mut controller, report) = f.controller(&["--orphan-grace", "2s"]).await;
    f.cycle_until(&mut controller, &["m-kept"], Duration::from_secs(60), |s| {
        is(&s["m-kept"], "True", "VMHealthy")
    })
    .await;
    // Well past the grace with every CloudStackMachine present: nothing is anyone's orphan.
    let settle = Instant::now() + Duration::from_secs(4);
    while Instant::now() < settle {
        controller.cycle(jiff::Timestamp::now()).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let r = report.read().await.clone();
    assert!(r.orphans.is_empty(), "{:#?}", r.orphans);
    assert!(r.orphan_detection.enabled);
    assert_eq!(r.orphan_detection.suspects, 0);
    assert_eq!(r.orphan_detection.remembered_machines, 3);

    // A finalizer removed by hand: the CloudStackMachine goes, its VM runs on. And a
    // CloudStackMachine deleted before CAPC recorded the VM it deployed.
    let csm = f.resources.cloudstack_machine.clone();
    for name in ["m-let-go", "m-late"] {
        delete(&f, &csm, &format!("{name}-csm")).await;
        delete(&f, &f.resources.machine, name).await;
    }
    let gone_at = jiff::Timestamp::now();
    let r = cycle_until_report(
        &mut controller,
        &report,
        Duration::from_secs(60),
        |r| r.orphans.len() >= 2,
        |r| {
            format!(
                "orphans {:#?}, detection {:?}",
                r.orphans, r.orphan_detection
            )
        },
    )
    .await;
    let ids = |name: &str| f.vm_ids[name].to_ascii_lowercase();
    let mut found: Vec<(String, OrphanKind, String)> = r
        .orphans
        .iter()
        .map(|o| (o.vm_id.clone(), o.kind, o.cloudstack_machine.clone()))
        .collect();
    found.sort();
    let mut want = vec![
        (
            ids("vm-let-go"),
            OrphanKind::InstanceOfDeleted,
            format!("{}/m-let-go-csm", f.ns),
        ),
        (
            ids("m-late-csm"),
            OrphanKind::NameOfDeleted,
            format!("{}/m-late-csm", f.ns),
        ),
    ];
    want.sort();
    assert_eq!(found, want);
    for o in &r.orphans {
        assert_eq!(o.cluster.as_deref(), Some(format!("{}/c1", f.ns).as_str()));
        assert_eq!(o.vm_state, "Running");
        let reported = o.reported_at.expect("reported");
        assert!(reported.duration_since(o.since) >= jiff::SignedDuration::from_secs(2));
        assert!(o.since >= gone_at, "since {} before the deletion", o.since);
    }
    let metrics = controller_metrics(&controller);
    let line = format!(
        "capc_health_orphan_vms{{cluster=\"{}/c1\",scope=\"{}\"}} 2",
        f.ns, r.orphans[0].scope
    );
    assert!(metrics.contains(&line), "{line} not in\n{metrics}");

    // One Warning Event per orphan on the Cluster (not one per cycle).
    for _ in 0..3 {
        controller.cycle(jiff::Timestamp::now()).await;
    }
    let events: Api<Event> = Api::namespaced(f.client.clone(), &f.ns);
    let deadline = Instant::now() + Duration::from_secs(20);
    let orphan_events = loop {
        let list = events.list(&ListParams::default()).await.expect("events");
        let ours: Vec<Event> = list
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("CloudStackVMOrphaned"))
            .collect();
        if ours.len() >= 2 || Instant::now() > deadline {
            break ours;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(orphan_events.len(), 2, "{orphan_events:#?}");
    for e in &orphan_events {
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.involved_object.kind.as_deref(), Some("Cluster"));
        assert_eq!(e.involved_object.name.as_deref(), Some("c1"));
        assert!(e.involved_object.uid.is_some(), "kubectl describe finds it");
        assert_eq!(e.count.unwrap_or(1), 1, "published once");
    }

    // An operator destroys one: it drops out of the report and the gauge follows.
    let let_go = ids("vm-let-go");
    f.sim.with_world(|w| {
        let idx = w.vm_index_by_id(&f.vm_ids["vm-let-go"]).expect("vm");
        w.destroy_vm_now(idx, true);
    });
    let r = cycle_until_report(
        &mut controller,
        &report,
        Duration::from_secs(30),
        |r| r.orphans.len() == 1,
        |r| {
            format!(
                "orphans {:#?}, detection {:?}",
                r.orphans, r.orphan_detection
            )
        },
    )
    .await;
    assert_ne!(r.orphans[0].vm_id, let_go);
    let metrics = controller_metrics(&controller);
    assert!(metrics.contains(&format!(
        "capc_health_orphan_vms{{cluster=\"{}/c1\",scope=\"{}\"}} 1",
        f.ns, r.orphans[0].scope
    )));
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn without_the_orphan_report_nothing_is_kept_or_reported() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-kept", "healthy", "Starting"),
            ("vm-let-go", "healthy", "Starting"),
        ],
    )
    .await;
    f.machine("m-kept", Some("vm-kept"), false, "fd1").await;
    f.machine("m-let-go", Some("vm-let-go"), false, "fd1").await;
    let (mut controller, report) = f
        .controller(&["--orphan-grace", "1s", "--no-orphan-report"])
        .await;
    f.cycle_until(&mut controller, &["m-kept"], Duration::from_secs(60), |s| {
        is(&s["m-kept"], "True", "VMHealthy")
    })
    .await;
    delete(&f, &f.resources.cloudstack_machine, "m-let-go-csm").await;
    delete(&f, &f.resources.machine, "m-let-go").await;
    let settle = Instant::now() + Duration::from_secs(4);
    while Instant::now() < settle {
        controller.cycle(jiff::Timestamp::now()).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let r = report.read().await.clone();
    assert!(r.orphans.is_empty());
    assert!(!r.orphan_detection.enabled);
    assert!(!controller_metrics(&controller).contains("capc_health_orphan_vms{"));
    f.cleanup().await;
}

fn controller_metrics(c: &Controller) -> String {
    c.metrics().encode()
}

/// A key rotation (same endpoint, new key: a scope of its own) after a CloudStackMachine went:
/// the VM named after it is still found, in the new key's listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_key_rotation_still_finds_the_vm_of_a_machine_gone_under_the_old_key() {
    const NEW_KEY: &str = "kube-test-key-rotated";
    const NEW_SECRET: &str = "kube-test-secret-rotated";
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-kept", "healthy", "Starting"),
            ("m-late-csm", "healthy", "Starting"),
        ],
    )
    .await;
    f.machine("m-kept", Some("vm-kept"), false, "fd1").await;
    // Being created: no instanceID yet, its VM already listed.
    f.machine("m-late", None, false, "fd1").await;
    let (mut controller, report) = f.controller(&["--orphan-grace", "2s"]).await;
    f.cycle_until(&mut controller, &["m-kept"], Duration::from_secs(60), |s| {
        is(&s["m-kept"], "True", "VMHealthy")
    })
    .await;
    let old_scope = report.read().await.scopes[0].key.clone();

    // Deleted before CAPC recorded its VM; the shim sees it gone under the old key.
    delete(&f, &f.resources.cloudstack_machine, "m-late-csm").await;
    delete(&f, &f.resources.machine, "m-late").await;
    let cluster = format!("{}/c1", f.ns);
    cycle_until_report(
        &mut controller,
        &report,
        Duration::from_secs(30),
        |r| {
            r.clusters
                .get(&cluster)
                .is_some_and(|c| !c.machines.contains_key("m-late"))
        },
        |r| format!("clusters {:#?}", r.clusters.keys()),
    )
    .await;
    // Then the account's key is rotated, in CloudStack and in the Secret.
    f.sim.with_world(|w| {
        let account = w
            .account_by_api_key(kube_support::SIM_KEY)
            .expect("account");
        w.accounts[account].api_key = NEW_KEY.into();
        w.accounts[account].secret_key = cloudstack_sim::world::Secret::new(NEW_SECRET);
    });
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(f.client.clone(), &f.ns);
    secrets
        .patch(
            "acs",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "stringData": {"api-key": NEW_KEY, "secret-key": NEW_SECRET}})),
        )
        .await
        .expect("patch the Secret");

    let r = cycle_until_report(
        &mut controller,
        &report,
        Duration::from_secs(60),
        |r| !r.orphans.is_empty(),
        |r| {
            format!(
                "orphans {:#?}, detection {:?}, scopes {:?}",
                r.orphans,
                r.orphan_detection,
                r.scopes.iter().map(|s| &s.key).collect::<Vec<_>>()
            )
        },
    )
    .await;
    assert_eq!(r.orphans.len(), 1, "{:#?}", r.orphans);
    let o = &r.orphans[0];
    assert_eq!(o.kind, OrphanKind::NameOfDeleted);
    assert_eq!(o.vm_id, f.vm_ids["m-late-csm"].to_ascii_lowercase());
    assert_eq!(o.cloudstack_machine, format!("{}/m-late-csm", f.ns));
    assert_ne!(o.scope, old_scope, "found in the new key's listing");
    f.cleanup().await;
}
