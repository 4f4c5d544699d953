//! Coverage means "this MachineHealthCheck will act on this verdict", against a real
//! kube-apiserver with the CAPI/CAPC CRDs (hack/apiserver) and `cloudstack-sim`. On CAPI 1.13
//! (condition mode, auto) an MHC left as it was for CAPI 1.9 — Node conditions only, no
//! `unhealthyMachineConditions` — covers a Machine whose VM is in `Error`: the shim sets the
//! remediate annotation on it (the path MHC honours on every version), leaves the Machine whose
//! MHC lists the condition to that MHC, and counts the `False` Machine no MHC covers in
//! `capc_health_false_unacted_machines`. `/status` says which path each Machine's verdict takes.
//! Under CAPI 1.9 (annotate mode) the same fixture is annotated as before.
//!
//! Then (condition mode) the patch `capc-health-shim mhc --existing` renders for the old MHC,
//! and the MHC it renders for the Cluster, are applied: both Machines move to the condition path.
//!
//! The first half reads `/status` as JSON and the metrics as text: run alone against 818ddc7
//! (before coverage), it failed on the annotation — m-old stayed `False`/VMError unannotated
//! for the 90 s deadline.

mod kube_support;

use std::time::Duration;

use capc_health_shim::cli::mhc::{render, MhcApi, MhcRequest};
use capi_model::apis::Mode;
use kube_support::{ar, create, cycle_until_report, get, is, kube_client, merge_patch, Fixture};
use serde_json::{json, Value};

/// The value of `capc_health_false_unacted_machines{cluster="<cluster>"}` in `text`.
fn unacted(text: &str, cluster: &str) -> Option<f64> {
    let series = format!("capc_health_false_unacted_machines{{cluster=\"{cluster}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

fn machine<'a>(status: &'a Value, cluster: &str, name: &str) -> &'a Value {
    &status["clusters"][cluster]["machines"][name]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_machine_whose_mhc_lacks_the_condition_gets_the_annotation() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-listed", "healthy", "Error"),
            ("vm-old", "healthy", "Error"),
            ("vm-nomhc", "healthy", "Error"),
            ("vm-ok", "healthy", "Starting"),
        ],
    )
    .await;
    let condition_mode = f.choice.mode == Mode::Condition;
    assert_eq!(condition_mode, kube_support::capi_1_13());
    // The fixture's MHC (c1-mhc) lists the condition in condition mode and selects Machines
    // without the label `uncovered`. A CAPI 1.9-style MHC selects those with `old-mhc`:
    // written through v1beta1 where it is served, as it was before the upgrade.
    let mhc = if kube_support::profile() == "capi-1.13-v1beta2-only" {
        f.resources.mhc.clone()
    } else {
        ar(
            "cluster.x-k8s.io",
            "v1beta1",
            "MachineHealthCheck",
            "machinehealthchecks",
        )
    };
    let spec = if mhc.version == "v1beta1" {
        json!({"clusterName": "c1", "selector": {"matchLabels": {"old-mhc": "yes"}},
            "nodeStartupTimeout": "30m",
            "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "300s"}]})
    } else {
        json!({"clusterName": "c1", "selector": {"matchLabels": {"old-mhc": "yes"}},
            "checks": {"nodeStartupTimeoutSeconds": 1800,
                "unhealthyNodeConditions": [{"type": "Ready", "status": "False", "timeoutSeconds": 300}]}})
    };
    create(
        &client,
        &f.ns,
        &mhc,
        json!({"apiVersion": mhc.api_version, "kind": "MachineHealthCheck",
            "metadata": {"name": "c1-old", "namespace": f.ns}, "spec": spec}),
    )
    .await;
    f.machine("m-listed", Some("vm-listed"), false, "fd1").await;
    f.machine("m-old", Some("vm-old"), false, "fd1").await;
    f.machine("m-nomhc", Some("vm-nomhc"), false, "fd1").await;
    // Healthy Machines, so that three VMs in Error are no mass failure (the guard holds 100 %).
    for name in ["m-ok1", "m-ok2"] {
        f.machine(name, Some("vm-ok"), false, "fd1").await;
    }
    for (name, labels) in [
        ("m-old", json!({"uncovered": "yes", "old-mhc": "yes"})),
        ("m-nomhc", json!({"uncovered": "yes"})),
    ] {
        merge_patch(
            &client,
            &f.ns,
            &f.resources.machine,
            name,
            json!({"metadata": {"labels": labels}}),
        )
        .await;
    }

    let (mut controller, report) = f.controller(&[]).await;
    let names = ["m-listed", "m-old", "m-nomhc"];
    let last = f
        .cycle_until(&mut controller, &names, Duration::from_secs(90), |s| {
            names.iter().all(|n| is(&s[*n], "False", "VMError")) && s["m-old"].1
        })
        .await;
    // The Machine whose MHC lists the condition is that MHC's (in annotate mode, annotated);
    // the one no MHC covers is never annotated.
    assert_eq!(last["m-listed"].1, !condition_mode, "{last:#?}");
    assert!(!last["m-nomhc"].1, "{last:#?}");

    let cluster = format!("{}/c1", f.ns);
    let status = cycle_until_report(
        &mut controller,
        &report,
        Duration::from_secs(60),
        |r| {
            r.clusters
                .get(&cluster)
                .is_some_and(|c| names.iter().all(|n| c.machines.contains_key(*n)))
        },
        |r| format!("{:#?}", r.clusters.keys().collect::<Vec<_>>()),
    )
    .await;
    let status = serde_json::to_value(&status).expect("the report serializes");
    let acted = |name: &str| machine(&status, &cluster, name)["acted_on"].clone();
    let detail = |name: &str| {
        machine(&status, &cluster, name)["acted_on_detail"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    if condition_mode {
        assert_eq!(acted("m-listed"), json!("condition"), "{status:#}");
        assert!(
            detail("m-listed").contains(&format!("{}/c1-mhc", f.ns)),
            "{}",
            detail("m-listed")
        );
        assert!(
            detail("m-old").contains("lists CloudStackVMHealthy=False"),
            "{}",
            detail("m-old")
        );
    } else {
        assert_eq!(acted("m-listed"), json!("annotation"), "{status:#}");
    }
    assert_eq!(acted("m-old"), json!("annotation"), "{status:#}");
    assert_eq!(
        acted("m-nomhc"),
        json!("none: no MachineHealthCheck selects this Machine"),
        "{status:#}"
    );
    let metrics = controller.metrics().encode();
    assert_eq!(
        unacted(&metrics, &cluster),
        Some(1.0),
        "one False Machine nothing acts on: {}",
        metrics
            .lines()
            .filter(|l| l.contains("unacted"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // `capc-health-shim mhc`'s patch for the old MHC, applied: its Machine moves to the
    // condition path (and the rendered new MHC is one the API server accepts).
    if condition_mode {
        let request = MhcRequest {
            namespace: &f.ns,
            cluster: "c1",
            api: MhcApi::V1Beta2AndV1Beta1,
            condition_type: "CloudStackVMHealthy",
            timeout: jiff::SignedDuration::from_secs(60),
        };
        let old = get(&client, &f.ns, &f.resources.mhc, "c1-old").await;
        let patch: Value =
            serde_yaml_ng::from_str(&render(&request, Some(&old)).expect("a patch")).unwrap();
        merge_patch(&client, &f.ns, &f.resources.mhc, "c1-old", patch).await;
        let new: Value = serde_yaml_ng::from_str(&render(&request, None).expect("an MHC")).unwrap();
        create(&client, &f.ns, &f.resources.mhc, new).await;
        let status = cycle_until_report(
            &mut controller,
            &report,
            Duration::from_secs(60),
            |r| {
                r.clusters.get(&cluster).is_some_and(|c| {
                    c.machines.get("m-old").map(|m| m.acted_on.as_str()) == Some("condition")
                        && c.machines.get("m-nomhc").map(|m| m.acted_on.as_str())
                            == Some("condition")
                })
            },
            |r| format!("{:#?}", r.clusters.get(&cluster)),
        )
        .await;
        let m = &status.clusters[&cluster].machines["m-old"];
        assert!(
            m.acted_on_detail
                .as_deref()
                .is_some_and(|d| d.contains("c1-old") || d.contains("c1-capc-health")),
            "{m:#?}"
        );
        assert_eq!(
            unacted(&controller.metrics().encode(), &cluster),
            Some(0.0),
            "the new MHC covers m-nomhc too"
        );
    }
    f.cleanup().await;
}
