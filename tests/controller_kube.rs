//! The controller against a real kube-apiserver with the real CAPI and CAPC CRDs
//! (hack/apiserver, started by `make test`) and `cloudstack-sim`: Machines, CloudStackMachines,
//! a failure domain, its Secret and an MHC are created as CAPI/CAPC would; faults come from
//! the simulator; the test asserts the condition, the annotation (or its absence), Events
//! and `/status` — under every CRD profile (CAPI 1.9: annotate mode; 1.13, also with only
//! v1beta2 served: condition mode).

mod kube_support;

use std::time::Duration;

use capi_model::apis::Mode;
use kube::api::Api;
use kube_support::{get, is, kube_client, merge_patch, Fixture, SIM_SECRET};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn verdicts_reach_machines_with_every_guard() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-healthy", "healthy", "Starting"),
            ("vm-nicdown", "nic-down", "Starting"),
            ("vm-error", "healthy", "Error"),
            ("vm-uncovered", "healthy", "Error"),
            ("vm-badsecret", "healthy", "Starting"),
        ],
    )
    .await;
    let expected_mode = if kube_support::capi_1_13() {
        Mode::Condition
    } else {
        Mode::Annotate
    };
    assert_eq!(
        f.choice.mode,
        expected_mode,
        "profile {}",
        kube_support::profile()
    );

    f.secret(
        "acs-broken",
        &[("api-url", &f.server.api_url()), ("api-key", "k")],
    )
    .await;
    f.failure_domain("fd-broken", "acs-broken").await;
    f.machine("m-healthy", Some("vm-healthy"), false, "fd1")
        .await;
    f.machine("m-nicdown", Some("vm-nicdown"), false, "fd1")
        .await;
    f.machine("m-error", Some("vm-error"), true, "fd1").await;
    f.machine("m-badsecret", Some("vm-badsecret"), false, "fd-broken")
        .await;
    f.machine("m-nofd", Some("vm-healthy"), false, "fd-gone")
        .await;
    f.machine("m-noid", None, false, "fd1").await;
    // Not selected by the MHC: False, but never annotated.
    f.machine("m-uncovered", Some("vm-uncovered"), false, "fd1")
        .await;
    merge_patch(
        &client,
        &f.ns,
        &f.resources.machine,
        "m-uncovered",
        serde_json::json!({"metadata": {"labels": {"uncovered": "yes"}}}),
    )
    .await;

    let (mut controller, report) = f.controller(&[]).await;
    let names = [
        "m-healthy",
        "m-nicdown",
        "m-error",
        "m-uncovered",
        "m-badsecret",
        "m-nofd",
        "m-noid",
    ];
    let last = f
        .cycle_until(&mut controller, &names, Duration::from_secs(90), |s| {
            is(&s["m-healthy"], "True", "VMHealthy")
                && is(&s["m-nicdown"], "False", "GuestNetworkSilent")
                && is(&s["m-error"], "False", "VMError")
                && is(&s["m-uncovered"], "False", "VMError")
                && is(&s["m-badsecret"], "Unknown", "CredentialsUnavailable")
                && is(&s["m-nofd"], "Unknown", "CredentialsUnavailable")
                && (expected_mode != Mode::Annotate || (s["m-nicdown"].1 && s["m-error"].1))
        })
        .await;
    // Nothing to judge without an instance id; nothing escalates that the MHC does not cover.
    assert_eq!(last["m-noid"].0, None, "{last:#?}");
    assert!(
        !last["m-uncovered"].1,
        "an uncovered Machine must not be annotated"
    );
    assert!(!last["m-healthy"].1 && !last["m-badsecret"].1);
    if expected_mode == Mode::Condition {
        assert!(
            last.values().all(|(_, annotated)| !annotated),
            "condition mode never annotates"
        );
    }

    // Only our entry, written by our field manager on the status subresource.
    let m = get(&client, &f.ns, &f.resources.machine, "m-error").await;
    let ours = kube_support::condition(&m, f.conditions_pointer()).expect("condition");
    assert!(ours["message"].as_str().unwrap().contains("Error"));
    let managed = m["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        managed
            .iter()
            .any(|x| x["manager"] == "capc-health-shim" && x["subresource"] == "status"),
        "{managed:#?}"
    );

    // A further cycle with nothing changed writes nothing.
    let rv_before = get(&client, &f.ns, &f.resources.machine, "m-error").await["metadata"]
        ["resourceVersion"]
        .clone();
    let summary = controller.cycle(jiff::Timestamp::now()).await;
    let rv_after = get(&client, &f.ns, &f.resources.machine, "m-error").await["metadata"]
        ["resourceVersion"]
        .clone();
    assert_eq!(
        rv_before, rv_after,
        "an unchanged verdict must not be rewritten ({summary:?})"
    );

    // Events for the transitions (and the escalation in annotate mode).
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &f.ns);
    let evs = events
        .list(&Default::default())
        .await
        .expect("events")
        .items;
    assert!(
        evs.iter().any(|e| e.reason.as_deref() == Some("VMError")),
        "{evs:#?}"
    );
    if expected_mode == Mode::Annotate {
        assert!(evs
            .iter()
            .any(|e| e.reason.as_deref() == Some("RemediationRequested")));
    }
    // A first verdict of True is no news: the healthy Machine's Events, if its VM was seen
    // Starting first, begin with that (a Warning), never with a Normal "is True".
    let mut healthy: Vec<_> = evs
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("m-healthy"))
        .collect();
    healthy.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    if let Some(first) = healthy.first() {
        assert_eq!(first.type_.as_deref(), Some("Warning"), "{healthy:#?}");
    }

    // /status tells the operator what happened and why, without secrets.
    let r = report.read().await.clone();
    let c1 = &r.clusters[&format!("{}/c1", f.ns)];
    assert!(!c1.machines["m-uncovered"].mhc_covered);
    if expected_mode == Mode::Annotate {
        assert_eq!(c1.machines["m-uncovered"].escalation, "held");
        assert!(c1.machines["m-uncovered"]
            .escalation_detail
            .as_deref()
            .unwrap()
            .contains("NotCoveredByMachineHealthCheck"));
        assert_eq!(c1.machines["m-error"].escalation, "annotated");
    }
    assert!(c1.machines["m-noid"]
        .message
        .as_deref()
        .unwrap()
        .contains("instanceID"));
    assert!(c1.machines["m-badsecret"]
        .message
        .as_deref()
        .unwrap()
        .contains("secret-key"));
    assert!(
        !serde_json::to_string(&r).unwrap().contains(SIM_SECRET),
        "no secret in /status"
    );
    assert_eq!(r.scopes.len(), 1);
    assert!(r.scopes[0].calls_total > 0);
    f.cleanup().await;
}
