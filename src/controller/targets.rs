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
mod tests;
