//! From the watched records to the list of Machines to judge (pure). Each CAPC-backed Machine
//! is joined to its CloudStackMachine (instance id, state anchor), its failure domain (endpoint
//! Secret, project, zone), its Cluster (paused?) and the MachineHealthChecks that cover it.

use std::collections::HashMap;
use std::sync::Arc;

use jiff::Timestamp;

use crate::k8s::objects::{mhc_covers, MachineView};
use crate::k8s::watched::{
    CloudStackMachineRecord, ClusterRecord, FailureDomainRecord, HealthCheckRecord, MachineRecord,
};
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
    pub machine: Arc<MachineView>,
    pub created: Option<Timestamp>,
    /// The CloudStackMachine it was joined to (shared with the watch store, not copied).
    pub csm: Option<Arc<CloudStackMachineRecord>>,
    pub endpoint: Option<Arc<EndpointRef>>,
    pub problem: Option<TargetProblem>,
    /// The MachineHealthChecks that cover it ([`mhc_covers`]), shared with the watch store.
    pub mhcs: Vec<Arc<HealthCheckRecord>>,
    pub cluster_paused: bool,
    /// Our condition as currently published on the Machine.
    pub current: Option<Arc<ConditionState>>,
}

impl Target {
    /// Some MachineHealthCheck covers it.
    pub fn mhc_covered(&self) -> bool {
        !self.mhcs.is_empty()
    }

    /// The VM's id (`spec.instanceID`), once CAPC deployed it.
    pub fn instance_id(&self) -> Option<&String> {
        self.csm.as_ref()?.instance_id.as_ref()
    }

    /// CAPC's `status.instanceState` (an anchor after a restart).
    pub fn csm_state(&self) -> Option<&String> {
        self.csm.as_ref()?.instance_state.as_ref()
    }

    /// When CAPC last changed `status.instanceState`.
    pub fn csm_state_since(&self) -> Option<Timestamp> {
        self.csm.as_ref()?.instance_state_since
    }
}

/// Everything the watches hold, as records.
pub struct Objects<'a> {
    pub machines: &'a [Arc<MachineRecord>],
    pub cloudstack_machines: &'a [Arc<CloudStackMachineRecord>],
    pub failure_domains: &'a [Arc<FailureDomainRecord>],
    pub clusters: &'a [Arc<ClusterRecord>],
    pub health_checks: &'a [Arc<HealthCheckRecord>],
}

/// The failure domains by namespace and by each name a CloudStackMachine may use for one
/// (`spec.name`, or the object's name): built once per cycle from the few failure domains, so
/// a Machine's lookup costs one hash probe instead of a scan of all of them.
pub(super) struct FailureDomains<'a> {
    by_name: HashMap<(&'a str, &'a str), Vec<usize>>,
    /// Each failure domain with its endpoint, made once per cycle and shared by the Machines
    /// that use it (`None`: its `spec.acsEndpoint` names no Secret).
    all: Vec<(&'a FailureDomainRecord, Option<Arc<EndpointRef>>)>,
}

impl<'a> FailureDomains<'a> {
    pub(super) fn new(fds: &'a [Arc<FailureDomainRecord>]) -> Self {
        let mut by_name: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        let mut all = Vec::with_capacity(fds.len());
        for (i, fd) in fds.iter().enumerate() {
            let ns = fd.namespace.as_str();
            by_name.entry((ns, fd.name.as_str())).or_default().push(i);
            match fd.spec_name.as_deref() {
                Some(spec_name) if spec_name != fd.name => {
                    by_name.entry((ns, spec_name)).or_default().push(i)
                }
                _ => {}
            }
            let endpoint = fd.secret_name.as_ref().map(|secret_name| {
                Arc::new(EndpointRef {
                    secret_namespace: fd
                        .secret_namespace
                        .clone()
                        .unwrap_or_else(|| fd.namespace.clone()),
                    secret_name: secret_name.clone(),
                    project: fd.project.clone(),
                    zone_id: fd.zone_id.clone(),
                })
            });
            all.push((&**fd, endpoint));
        }
        Self { by_name, all }
    }

    /// The failure domain the Machine's CloudStackMachine names: by `spec.name` (or object
    /// name) in the Machine's namespace. CAPC makes one per cluster and labels it with the
    /// cluster, so the one labelled with the Machine's cluster is it; an unlabelled one (made by
    /// hand) only when it is the one failure domain of that name. One labelled for another
    /// cluster is never used: its zone and project would list the wrong VMs (and the VM would
    /// look gone). The error names what was looked for and what was found instead, for the
    /// `Unknown` verdict.
    pub(super) fn endpoint(
        &self,
        namespace: &str,
        cluster: &str,
        fd_name: &str,
    ) -> Result<Arc<EndpointRef>, String> {
        if fd_name.is_empty() {
            return Err("(the CloudStackMachine names no failure domain)".to_string());
        }
        let candidates: &[usize] = self
            .by_name
            .get(&(namespace, fd_name))
            .map_or(&[], Vec::as_slice);
        let mut own = candidates
            .iter()
            .copied()
            .filter(|&i| self.all[i].0.cluster_name.as_deref() == Some(cluster));
        let chosen = match (own.next(), own.next(), candidates) {
            (Some(i), None, _) => i,
            (None, _, [i]) if self.all[*i].0.cluster_name.is_none() => *i,
            (None, _, []) => return Err(fd_name.to_string()),
            _ => {
                let records: Vec<&FailureDomainRecord> =
                    candidates.iter().map(|&i| self.all[i].0).collect();
                let own = records
                    .iter()
                    .filter(|fd| fd.cluster_name.as_deref() == Some(cluster))
                    .count();
                return Err(unusable(fd_name, cluster, &records, own));
            }
        };
        self.all[chosen]
            .1
            .clone()
            .ok_or_else(|| format!("{fd_name} (its spec.acsEndpoint names no Secret)"))
    }
}

/// Joins the records into targets. `namespaces` empty = all. Each Machine's joins are hash
/// probes (CloudStackMachine and Cluster by name, failure domain by name, MachineHealthChecks
/// by cluster): a cycle costs O(Machines), not O(Machines × (MHCs + failure domains)). The
/// controller keeps its targets between cycles and joins only the Machines a watch changed
/// ([`super::joins`]); this is the whole join, for a (re)list and for `check`-like callers.
pub fn build(objects: &Objects<'_>, namespaces: &[String]) -> Vec<Target> {
    let csm_by_name: HashMap<(&str, &str), &Arc<CloudStackMachineRecord>> = objects
        .cloudstack_machines
        .iter()
        .map(|c| ((c.namespace.as_str(), c.name.as_str()), c))
        .collect();
    let joiner = Joiner::new(
        objects.failure_domains,
        objects.clusters,
        objects.health_checks,
        namespaces,
    );
    objects
        .machines
        .iter()
        .filter_map(|record| {
            let csm = csm_by_name
                .get(&(record.view.namespace.as_str(), csm_name(record)))
                .copied();
            joiner.target(record, csm)
        })
        .collect()
}

/// The CloudStackMachine a Machine's `spec.infrastructureRef` names ("" when none).
pub(super) fn csm_name(record: &MachineRecord) -> &str {
    record
        .view
        .infrastructure_name
        .as_deref()
        .unwrap_or_default()
}

/// The few kinds a Machine is joined against besides its CloudStackMachine — failure domains,
/// Clusters, MachineHealthChecks — as lookups, built once per cycle.
pub(super) struct Joiner<'a> {
    paused_clusters: HashMap<(&'a str, &'a str), bool>,
    mhcs_by_cluster: HashMap<(&'a str, &'a str), Vec<&'a Arc<HealthCheckRecord>>>,
    failure_domains: FailureDomains<'a>,
    namespaces: &'a [String],
}

impl<'a> Joiner<'a> {
    pub(super) fn new(
        failure_domains: &'a [Arc<FailureDomainRecord>],
        clusters: &'a [Arc<ClusterRecord>],
        health_checks: &'a [Arc<HealthCheckRecord>],
        namespaces: &'a [String],
    ) -> Self {
        let paused_clusters = clusters
            .iter()
            .map(|c| ((c.namespace.as_str(), c.name.as_str()), c.paused))
            .collect();
        let mut mhcs_by_cluster: HashMap<(&str, &str), Vec<&Arc<HealthCheckRecord>>> =
            HashMap::new();
        for mhc in health_checks {
            if let Some(cluster) = mhc.cluster_name.as_deref() {
                mhcs_by_cluster
                    .entry((mhc.namespace.as_str(), cluster))
                    .or_default()
                    .push(mhc);
            }
        }
        Self {
            paused_clusters,
            mhcs_by_cluster,
            failure_domains: FailureDomains::new(failure_domains),
            namespaces,
        }
    }

    /// The Machine's target, joined with its CloudStackMachine `csm` (looked up by the caller
    /// under [`csm_name`]); `None` for a Machine that is not CAPC's or is outside `--namespace`.
    pub(super) fn target(
        &self,
        record: &MachineRecord,
        csm: Option<&Arc<CloudStackMachineRecord>>,
    ) -> Option<Target> {
        let view = &record.view;
        if !view.is_cloudstack()
            || (!self.namespaces.is_empty() && !self.namespaces.contains(&view.namespace))
        {
            return None;
        }
        let cluster_key = (view.namespace.as_str(), view.cluster_name.as_str());
        let mut t = Target {
            created: record.created,
            csm: None,
            endpoint: None,
            problem: None,
            mhcs: self
                .mhcs_by_cluster
                .get(&cluster_key)
                .map(|mhcs| {
                    mhcs.iter()
                        .filter(|mhc| mhc_covers(mhc, view))
                        .map(|mhc| Arc::clone(mhc))
                        .collect()
                })
                .unwrap_or_default(),
            cluster_paused: self
                .paused_clusters
                .get(&cluster_key)
                .copied()
                .unwrap_or(false),
            current: record.current.clone(),
            machine: view.clone(),
        };
        let Some(csm) = csm else {
            t.problem = Some(TargetProblem::NoCloudStackMachine(
                csm_name(record).to_string(),
            ));
            return Some(t);
        };
        t.csm = Some(csm.clone());
        let fd_name = csm.failure_domain_name.as_deref().unwrap_or_default();
        match self
            .failure_domains
            .endpoint(&view.namespace, &view.cluster_name, fd_name)
        {
            Ok(endpoint) => t.endpoint = Some(endpoint),
            // Not deployed yet: CAPC picks the failure domain and the VM together, so a missing
            // one is no credentials problem until there is an instance to judge.
            Err(_) if csm.instance_id.is_none() => {}
            Err(missing) => t.problem = Some(TargetProblem::NoFailureDomain(missing)),
        }
        if csm.instance_id.is_none() && t.problem.is_none() {
            t.problem = Some(TargetProblem::NoInstanceId);
        }
        Some(t)
    }
}

/// Why none of several failure domains named `fd_name` can be used for a Machine of `cluster`:
/// the clusters they are labelled for, so the operator sees the mix-up.
fn unusable(
    fd_name: &str,
    cluster: &str,
    candidates: &[&FailureDomainRecord],
    own: usize,
) -> String {
    let mut found: Vec<&str> = candidates
        .iter()
        .map(|fd| fd.cluster_name.as_deref().unwrap_or("no cluster label"))
        .collect();
    found.sort_unstable();
    found.dedup();
    let found = found.join(", ");
    let why = if own == 0 && candidates.iter().all(|fd| fd.cluster_name.is_some()) {
        format!("only found for cluster(s) {found}; another cluster's failure domain is never used")
    } else {
        format!(
            "ambiguous: {} failure domains of that name, for {found}",
            candidates.len()
        )
    };
    format!("{fd_name} of cluster {cluster} ({why})")
}

#[cfg(test)]
mod tests {
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
        let cluster =
            json!({"metadata": {"namespace": "ns", "name": "c1"}, "spec": {"paused": true}});
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
}
