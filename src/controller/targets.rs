//! From the watched objects to the list of Machines to judge (pure). Each CAPC-backed Machine
//! is joined to its CloudStackMachine (instance id, state anchor), its failure domain (endpoint
//! Secret, project, zone), its Cluster (paused?) and the MachineHealthChecks that cover it.

use std::collections::HashMap;

use jiff::Timestamp;
use serde_json::Value;

use crate::k8s::capi::ConditionLayout;
use crate::k8s::conditions;
use crate::k8s::objects::{mhc_covers, well_known, MachineView};
use crate::verdict::ConditionState;

/// Which CloudStack endpoint and scope a Machine's VM is polled through.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointRef {
    pub secret_namespace: String,
    pub secret_name: String,
    /// Project id or name from the failure domain (`None` = no project).
    pub project: Option<String>,
    /// Zone id from the failure domain, when it has one.
    pub zone_id: Option<String>,
}

/// Why a Machine cannot be polled (shown on `/status`; `Unknown` where a verdict is due).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetProblem {
    /// No CloudStackMachine of that name: nothing to judge yet.
    NoCloudStackMachine(String),
    /// The CloudStackMachine has no `spec.instanceID` yet: the VM was never deployed.
    NoInstanceId,
    /// The failure domain (or its `acsEndpoint`) cannot be found: cannot see.
    NoFailureDomain(String),
}

#[derive(Debug, Clone)]
pub struct Target {
    pub machine: MachineView,
    pub created: Option<Timestamp>,
    pub instance_id: Option<String>,
    /// CAPC's `status.instanceState` and when it last changed (anchor after a restart).
    pub csm_state: Option<String>,
    pub csm_state_since: Option<Timestamp>,
    pub endpoint: Option<EndpointRef>,
    pub problem: Option<TargetProblem>,
    pub mhc_covered: bool,
    pub cluster_paused: bool,
    /// Our condition as currently published on the Machine.
    pub current: Option<ConditionState>,
}

fn str_at<'a>(v: &'a Value, p: &str) -> Option<&'a str> {
    v.pointer(p)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn ns_name(v: &Value) -> Option<(String, String)> {
    Some((
        str_at(v, "/metadata/namespace")
            .unwrap_or("default")
            .to_string(),
        str_at(v, "/metadata/name")?.to_string(),
    ))
}

fn time_at(v: &Value, p: &str) -> Option<Timestamp> {
    str_at(v, p).and_then(|s| s.parse().ok())
}

/// Everything the watches hold, as JSON.
pub struct Objects<'a> {
    pub machines: &'a [Value],
    pub cloudstack_machines: &'a [Value],
    pub failure_domains: &'a [Value],
    pub clusters: &'a [Value],
    pub health_checks: &'a [Value],
}

/// Joins the objects into targets. `namespaces` empty = all.
pub fn build(
    objects: &Objects<'_>,
    layout: ConditionLayout,
    condition_type: &str,
    namespaces: &[String],
) -> Vec<Target> {
    let csm_by_name: HashMap<(String, String), &Value> = objects
        .cloudstack_machines
        .iter()
        .filter_map(|o| Some((ns_name(o)?, o)))
        .collect();
    let paused_clusters: HashMap<(String, String), bool> = objects
        .clusters
        .iter()
        .filter_map(|c| {
            let paused = c
                .pointer("/spec/paused")
                .and_then(Value::as_bool)
                .unwrap_or(false)
                || c.pointer("/metadata/annotations")
                    .and_then(Value::as_object)
                    .is_some_and(|a| a.contains_key(well_known::PAUSED));
            Some((ns_name(c)?, paused))
        })
        .collect();
    let mut out = Vec::new();
    for m in objects.machines {
        let Some(view) = MachineView::from_json(m) else {
            continue;
        };
        if !view.is_cloudstack()
            || (!namespaces.is_empty() && !namespaces.contains(&view.namespace))
        {
            continue;
        }
        let mut t = Target {
            created: time_at(m, "/metadata/creationTimestamp"),
            instance_id: None,
            csm_state: None,
            csm_state_since: None,
            endpoint: None,
            problem: None,
            mhc_covered: objects
                .health_checks
                .iter()
                .any(|mhc| mhc_covers(mhc, &view)),
            cluster_paused: paused_clusters
                .get(&(view.namespace.clone(), view.cluster_name.clone()))
                .copied()
                .unwrap_or(false),
            current: conditions::read(m, layout, condition_type),
            machine: view,
        };
        let csm_name = t.machine.infrastructure_name.clone().unwrap_or_default();
        let Some(csm) = csm_by_name.get(&(t.machine.namespace.clone(), csm_name.clone())) else {
            t.problem = Some(TargetProblem::NoCloudStackMachine(csm_name));
            out.push(t);
            continue;
        };
        t.instance_id = str_at(csm, "/spec/instanceID").map(|s| s.to_ascii_lowercase());
        t.csm_state = str_at(csm, "/status/instanceState").map(str::to_string);
        t.csm_state_since = time_at(csm, "/status/instanceStateLastUpdated");
        let fd_name = str_at(csm, "/spec/failureDomainName")
            .unwrap_or_default()
            .to_string();
        match failure_domain(objects.failure_domains, &t.machine, &fd_name) {
            Some(endpoint) => t.endpoint = Some(endpoint),
            // Not deployed yet: CAPC picks the failure domain and the VM together, so a missing
            // one is no credentials problem until there is an instance to judge.
            None if t.instance_id.is_none() => {}
            None => {
                t.problem = Some(TargetProblem::NoFailureDomain(if fd_name.is_empty() {
                    "(the CloudStackMachine names no failure domain)".to_string()
                } else {
                    fd_name
                }))
            }
        }
        if t.instance_id.is_none() && t.problem.is_none() {
            t.problem = Some(TargetProblem::NoInstanceId);
        }
        out.push(t);
    }
    out
}

/// CAPC names failure-domain objects `md5(name+cluster)` and keeps the logical name in
/// `spec.name`; match on that and the cluster label, in the Machine's namespace.
fn failure_domain(fds: &[Value], m: &MachineView, fd_name: &str) -> Option<EndpointRef> {
    if fd_name.is_empty() {
        return None;
    }
    let candidates: Vec<&Value> = fds
        .iter()
        .filter(|fd| str_at(fd, "/metadata/namespace").unwrap_or("default") == m.namespace)
        .filter(|fd| {
            str_at(fd, "/spec/name") == Some(fd_name)
                || str_at(fd, "/metadata/name") == Some(fd_name)
        })
        .collect();
    let fd = candidates
        .iter()
        .find(|fd| {
            fd.pointer("/metadata/labels")
                .and_then(|l| l.get(well_known::CLUSTER_NAME_LABEL))
                .and_then(Value::as_str)
                == Some(m.cluster_name.as_str())
        })
        .or_else(|| candidates.first())?;
    let secret_name = str_at(fd, "/spec/acsEndpoint/name")?.to_string();
    let secret_namespace = str_at(fd, "/spec/acsEndpoint/namespace")
        .unwrap_or(&m.namespace)
        .to_string();
    Some(EndpointRef {
        secret_namespace,
        secret_name,
        project: str_at(fd, "/spec/project").map(str::to_string),
        zone_id: str_at(fd, "/spec/zone/id").map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    fn build_one(machines: &[Value], csms: &[Value], fds: &[Value]) -> Vec<Target> {
        let mhc = json!({"metadata": {"namespace": "ns", "name": "mhc"}, "spec": {"clusterName": "c1", "selector": {}}});
        let cluster =
            json!({"metadata": {"namespace": "ns", "name": "c1"}, "spec": {"paused": true}});
        build(
            &Objects {
                machines,
                cloudstack_machines: csms,
                failure_domains: fds,
                clusters: &[cluster],
                health_checks: &[mhc],
            },
            ConditionLayout::V1Beta1WithV1Beta2Conditions,
            "CloudStackVMHealthy",
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
        assert_eq!(t.instance_id.as_deref(), Some("abc-1"));
        assert!(t.mhc_covered && t.cluster_paused);
        assert_eq!(t.csm_state.as_deref(), Some("Running"));
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
}
