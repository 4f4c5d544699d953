use super::*;
use crate::k8s::watched::ConditionReader;
use capi_model::apis::ConditionLayout;
use serde_json::{json, Value};

fn machine(name: &str, csm: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2026-11-30T00:00:00Z",
            "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
            "ownerReferences": [{"kind": "MachineSet", "name": "ms", "controller": true}]},
           "spec": {"clusterName": "c1", "infrastructureRef": {"kind": "CloudStackMachine", "name": csm}}})
}

fn csm(name: &str, id: Option<&str>, fd: &str) -> Value {
    let mut v = json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"failureDomainName": fd},
                       "status": {"instanceState": "Running", "instanceStateLastUpdated": "2026-11-30T00:05:00Z"}});
    if let Some(id) = id {
        v["spec"]["instanceID"] = json!(id);
    }
    v
}

fn fd() -> Value {
    json!({"metadata": {"name": "0123abcd", "namespace": "ns", "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
           "spec": {"name": "fd1", "zone": {"name": "z", "id": "zone-1"}, "project": "p1",
                    "acsEndpoint": {"name": "secret1", "namespace": "capc-system"}}})
}

/// A failure domain `fd1` (object `object`) labelled for `cluster` (`None`: unlabelled),
/// in its own zone and project.
fn fd_of(object: &str, cluster: Option<&str>, zone: &str) -> Value {
    let mut v = json!({"metadata": {"name": object, "namespace": "ns"},
           "spec": {"name": "fd1", "zone": {"name": zone, "id": zone}, "project": format!("p-{zone}"),
                    "acsEndpoint": {"name": "secret1", "namespace": "capc-system"}}});
    if let Some(c) = cluster {
        v["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": c});
    }
    v
}

fn records<T>(json: &[Value], read: impl Fn(&Value) -> Option<T>) -> Vec<Arc<T>> {
    json.iter().filter_map(|v| read(v).map(Arc::new)).collect()
}

fn build_one(machines: &[Value], csms: &[Value], fds: &[Value]) -> Vec<Target> {
    let mhc = json!({"metadata": {"namespace": "ns", "name": "mhc"}, "spec": {"clusterName": "c1", "selector": {}}});
    let cluster = json!({"metadata": {"namespace": "ns", "name": "c1"}, "spec": {"paused": true}});
    let reader = ConditionReader {
        layout: ConditionLayout::V1Beta1WithV1Beta2Conditions,
        condition_type: "CloudStackVMHealthy".into(),
    };
    build(
        &Objects {
            machines: &records(machines, |m| MachineRecord::from_json(m, &reader)),
            cloudstack_machines: &records(csms, CloudStackMachineRecord::from_json),
            failure_domains: &records(fds, FailureDomainRecord::from_json),
            clusters: &records(&[cluster], ClusterRecord::from_json),
            health_checks: &records(&[mhc], HealthCheckRecord::from_json),
        },
        &[],
    )
}

#[test]
fn a_complete_chain_gives_an_endpoint_and_an_instance_id() {
    let t = build_one(
        &[machine("m1", "csm1")],
        &[csm("csm1", Some("ABC-1"), "fd1")],
        &[fd()],
    );
    assert_eq!(t.len(), 1);
    let t = &t[0];
    assert_eq!(t.problem, None);
    assert_eq!(t.instance_id().map(String::as_str), Some("abc-1"));
    assert!(t.mhc_covered() && t.cluster_paused);
    assert_eq!(t.csm_state().map(String::as_str), Some("Running"));
    let e = t.endpoint.as_ref().unwrap();
    assert_eq!(
        (e.secret_namespace.as_str(), e.secret_name.as_str()),
        ("capc-system", "secret1")
    );
    assert_eq!(
        (e.project.as_deref(), e.zone_id.as_deref()),
        (Some("p1"), Some("zone-1"))
    );
}

#[test]
fn each_broken_link_is_a_named_problem() {
    let t = build_one(&[machine("m1", "missing")], &[], &[fd()]);
    assert_eq!(
        t[0].problem,
        Some(TargetProblem::NoCloudStackMachine("missing".into()))
    );
    let t = build_one(
        &[machine("m1", "csm1")],
        &[csm("csm1", None, "fd1")],
        &[fd()],
    );
    assert_eq!(t[0].problem, Some(TargetProblem::NoInstanceId));
    let t = build_one(
        &[machine("m1", "csm1")],
        &[csm("csm1", Some("a"), "fd-gone")],
        &[fd()],
    );
    assert_eq!(
        t[0].problem,
        Some(TargetProblem::NoFailureDomain("fd-gone".into()))
    );
    // Before CAPC deploys the VM it has not named the failure domain either: nothing to
    // judge, which is no credentials problem.
    for fd_name in ["", "fd-gone"] {
        let t = build_one(
            &[machine("m1", "csm1")],
            &[csm("csm1", None, fd_name)],
            &[fd()],
        );
        assert_eq!(
            t[0].problem,
            Some(TargetProblem::NoInstanceId),
            "{fd_name:?}"
        );
    }
}

#[test]
fn a_failure_domain_of_another_cluster_is_never_used() {
    let zone_of = |fds: &[Value]| {
        let t = build_one(
            &[machine("m1", "csm1")],
            &[csm("csm1", Some("a"), "fd1")],
            fds,
        );
        (
            t[0].endpoint.as_ref().and_then(|e| e.zone_id.clone()),
            t[0].problem.clone(),
        )
    };
    // Labelled for the Machine's cluster c1: that one, wherever it sorts.
    for fds in [
        [
            fd_of("a", Some("c2"), "zone-c2"),
            fd_of("b", Some("c1"), "zone-c1"),
        ],
        [
            fd_of("a", Some("c1"), "zone-c1"),
            fd_of("b", Some("c2"), "zone-c2"),
        ],
        [
            fd_of("a", None, "zone-none"),
            fd_of("b", Some("c1"), "zone-c1"),
        ],
    ] {
        assert_eq!(zone_of(&fds), (Some("zone-c1".into()), None));
    }
    // The only failure domain of that name, unlabelled: an operator's own, used.
    assert_eq!(
        zone_of(&[fd_of("a", None, "zone-none")]),
        (Some("zone-none".into()), None)
    );
    // Only another cluster's (or several candidates, none of c1): no endpoint, and a
    // problem naming the failure domain and the clusters it was found for.
    for (fds, clusters) in [
        (vec![fd_of("a", Some("c2"), "zone-c2")], "c2"),
        (
            vec![
                fd_of("a", Some("c2"), "zone-c2"),
                fd_of("b", Some("c3"), "zone-c3"),
            ],
            "c2, c3",
        ),
        (
            vec![
                fd_of("a", None, "zone-none"),
                fd_of("b", Some("c2"), "zone-c2"),
            ],
            "c2",
        ),
        (
            vec![fd_of("a", None, "zone-1"), fd_of("b", None, "zone-2")],
            "no cluster label",
        ),
    ] {
        let (zone, problem) = zone_of(&fds);
        assert_eq!(zone, None, "{fds:?}");
        let Some(TargetProblem::NoFailureDomain(text)) = problem else {
            panic!("{problem:?} for {fds:?}");
        };
        assert!(
            text.contains("fd1") && text.contains("c1") && text.contains(clusters),
            "{text}"
        );
    }
    // Two labelled for c1 itself: ambiguous too.
    let (zone, problem) = zone_of(&[
        fd_of("a", Some("c1"), "zone-1"),
        fd_of("b", Some("c1"), "zone-2"),
    ]);
    assert_eq!(zone, None);
    assert!(
        matches!(&problem, Some(TargetProblem::NoFailureDomain(t)) if t.contains("fd1")),
        "{problem:?}"
    );
}

#[test]
fn foreign_and_malformed_machines_are_skipped_not_fatal() {
    let mut docker = machine("m2", "x");
    docker["spec"]["infrastructureRef"]["kind"] = json!("DockerMachine");
    let t = build_one(
        &[
            json!("garbage"),
            json!({"metadata": {}}),
            docker,
            machine("m1", "csm1"),
        ],
        &[csm("csm1", Some("a"), "fd1")],
        &[fd()],
    );
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].machine.name, "m1");
}

#[test]
fn health_checks_and_pauses_are_joined_by_namespace_and_cluster() {
    let reader = ConditionReader {
        layout: ConditionLayout::V1Beta1WithV1Beta2Conditions,
        condition_type: "CloudStackVMHealthy".into(),
    };
    let in_cluster = |name: &str, ns: &str, cluster: &str| {
        let mut m = machine(name, "csm1");
        m["metadata"]["namespace"] = json!(ns);
        m["spec"]["clusterName"] = json!(cluster);
        m
    };
    let machines = [
        in_cluster("a", "ns", "c1"),
        in_cluster("b", "ns", "c2"),
        in_cluster("c", "other", "c1"),
    ];
    let mhc = |ns: &str, cluster: &str| {
        json!({"metadata": {"namespace": ns, "name": format!("{cluster}-mhc")},
        "spec": {"clusterName": cluster, "selector": {}}})
    };
    let cluster = |ns: &str, name: &str, paused: bool| {
        json!({"metadata": {"namespace": ns, "name": name},
        "spec": {"paused": paused}})
    };
    let targets = build(
        &Objects {
            machines: &records(&machines, |m| MachineRecord::from_json(m, &reader)),
            cloudstack_machines: &[],
            failure_domains: &[],
            clusters: &records(
                &[cluster("ns", "c1", false), cluster("ns", "c2", true)],
                ClusterRecord::from_json,
            ),
            health_checks: &records(
                &[mhc("ns", "c2"), mhc("other", "c1"), mhc("ns", "c3")],
                HealthCheckRecord::from_json,
            ),
        },
        &[],
    );
    let seen: Vec<(&str, bool, bool)> = targets
        .iter()
        .map(|t| (t.machine.name.as_str(), t.mhc_covered(), t.cluster_paused))
        .collect();
    assert_eq!(
        seen,
        [("a", false, false), ("b", true, true), ("c", true, false)]
    );
}
