//! The orphan report in the cycle ([`crate::orphans`] decides): which endpoints gather must
//! keep listing, the sightings and listings fed to the finder after the poll, and one Warning
//! Event on the Cluster per orphan when it is first reported (through the writer).

use std::collections::BTreeSet;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;

use super::cycle::{Controller, CycleSummary};
use super::gather::Gathered;
use super::targets::{EndpointRef, FailureDomains};
use super::writer::{EventNote, Job};
use crate::k8s::watched::CloudStackMachineRecord;
use crate::orphans::{ClusterSighting, ScopeListing, SightingRef};
use crate::status::{OrphanDetectionReport, OrphanReport};

/// The reason of the Event an orphan gets.
pub const ORPHAN_EVENT_REASON: &str = "CloudStackVMOrphaned";

impl Controller {
    fn in_namespaces(&self, namespace: &str) -> bool {
        self.args.namespaces.is_empty() || self.args.namespaces.iter().any(|n| n == namespace)
    }

    /// Each watched CloudStackMachine with the endpoint its failure domain names, when the
    /// orphan report is on (gather keeps them for [`Controller::find_orphans`]); with only the
    /// remnant report on, those deleting with a VM (what CloudStack says of it is part of the
    /// report: [`Controller::note_remnant_vms`]).
    pub(super) fn orphan_candidates(
        &self,
    ) -> Vec<(Arc<CloudStackMachineRecord>, Option<Arc<EndpointRef>>)> {
        let wanted = |c: &CloudStackMachineRecord| {
            self.orphans.is_some()
                || (self.remnants.is_some() && c.deleting && c.instance_id.is_some())
        };
        if self.orphans.is_none() && self.remnants.is_none() {
            return Vec::new();
        }
        let fds = self.stores.failure_domains.state();
        let failure_domains = FailureDomains::new(&fds);
        self.stores
            .cloudstack_machines
            .state()
            .into_iter()
            .filter(|c| self.in_namespaces(&c.namespace) && wanted(c))
            .map(|c| {
                let endpoint = c.failure_domain_name.as_deref().and_then(|fd| {
                    let cluster = c.cluster_name.as_deref().unwrap_or_default();
                    failure_domains.endpoint(&c.namespace, cluster, fd).ok()
                });
                (c, endpoint)
            })
            .collect()
    }

    /// Endpoints gather must poll for the orphan report although no Machine with a VM may use
    /// them: every CloudStackMachine's (one being created has no VM yet, but once gone, a VM
    /// named after it is looked for there), and the scopes of gone ones and of suspects. With
    /// only the remnant report on: those of the deleting CloudStackMachines.
    pub(super) fn orphan_endpoints(
        &self,
        candidates: &[(Arc<CloudStackMachineRecord>, Option<Arc<EndpointRef>>)],
    ) -> BTreeSet<EndpointRef> {
        // The few distinct endpoints first: one copy each, not one per CloudStackMachine.
        let distinct: BTreeSet<&EndpointRef> = candidates
            .iter()
            .filter_map(|(_, e)| e.as_deref())
            .collect();
        let mut out: BTreeSet<EndpointRef> = distinct.into_iter().cloned().collect();
        let Some(finder) = &self.orphans else {
            return out;
        };
        for key in finder.scopes_watched() {
            if let Some(scope) = self.scopes.get(key) {
                out.insert(scope.endpoint.clone());
            }
        }
        out
    }

    /// After the poll: this cycle's CloudStackMachines, Clusters and complete listings into
    /// the finder; returns the orphans reported for the first time.
    pub(super) fn find_orphans(&mut self, g: &Gathered, now: Timestamp) -> Vec<OrphanReport> {
        if self.orphans.is_none() {
            return Vec::new();
        }
        let machines: Vec<SightingRef<'_>> = g
            .cloudstack_machines
            .iter()
            .map(|(c, endpoint)| SightingRef {
                machine: c,
                scope: endpoint
                    .as_deref()
                    .and_then(|e| g.scope_of.get(e))
                    .map(String::as_str),
            })
            .collect();
        let clusters: Vec<ClusterSighting> = self
            .stores
            .clusters
            .state()
            .iter()
            .map(|c| ClusterSighting {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                paused: c.paused,
                deleting: c.deleting,
            })
            .collect();
        let listings: Vec<ScopeListing<'_>> = self
            .scopes
            .iter()
            .map(|(key, s)| ScopeListing {
                scope: key,
                vms: s.listing.as_deref(),
            })
            .collect();
        let finder = self.orphans.as_mut().expect("checked above");
        for (old, new) in &g.rotations {
            finder.rotated(old, new);
        }
        let newly = finder.observe(&machines, &clusters, &listings, now);
        drop(listings);
        // The listings served only this: not held through the rest of the cycle and the wait
        // for the next one (~1.5 MB at 10 000 VMs).
        for scope in self.scopes.values_mut() {
            scope.listing = None;
        }
        for o in &newly {
            tracing::warn!(vm = %o.vm_id, name = %o.vm_name, scope = %o.scope,
                cloudstack_machine = %o.cloudstack_machine, why = %o.why,
                "orphan VM: owned by no CloudStackMachine (reported, never deleted)");
        }
        newly
    }

    /// One Warning Event per newly reported orphan on its Cluster (none without a cluster
    /// label: the orphan is still in `/status` and the metric).
    pub(super) fn announce_orphans(&mut self, newly: &[OrphanReport], summary: &mut CycleSummary) {
        let clusters = self.stores.clusters.state();
        for o in newly {
            let Some((namespace, name)) = o.cluster.as_deref().and_then(|c| c.split_once('/'))
            else {
                continue;
            };
            let uid = clusters
                .iter()
                .find(|c| c.namespace == namespace && c.name == name)
                .and_then(|c| c.uid.clone());
            let reference = ObjectReference {
                api_version: Some(self.resources.cluster.api_version.clone()),
                kind: Some("Cluster".into()),
                namespace: Some(namespace.to_string()),
                name: Some(name.to_string()),
                uid,
                ..Default::default()
            };
            let note = format!(
                "VM {} ({}, {}) is owned by no CloudStackMachine: {}. The shim never deletes it; \
                 `capc-health-shim orphans` prints the CloudMonkey command to remove it.",
                o.vm_name, o.vm_id, o.vm_state, o.why
            );
            // The CloudStackMachine it belonged to: one Event per orphan, not one series.
            let related = o
                .cloudstack_machine
                .split_once('/')
                .map(|(ns, n)| ObjectReference {
                    api_version: Some(self.resources.cloudstack_machine.api_version.clone()),
                    kind: Some("CloudStackMachine".into()),
                    namespace: Some(ns.to_string()),
                    name: Some(n.to_string()),
                    ..Default::default()
                });
            let event = EventNote {
                warning: true,
                reason: ORPHAN_EVENT_REASON.into(),
                note,
            };
            self.enqueue(
                Job::Event {
                    reference: Box::new(reference),
                    related: related.map(Box::new),
                    event,
                },
                summary,
            );
        }
    }

    /// What `/status` shows of the orphan report, and the gauge by cluster and scope.
    pub(super) fn orphan_report(&self) -> (Vec<OrphanReport>, OrphanDetectionReport) {
        let Some(finder) = &self.orphans else {
            self.metrics.set_orphans(&[]);
            return (Vec::new(), OrphanDetectionReport::default());
        };
        let orphans: Vec<OrphanReport> = finder.orphans().cloned().collect();
        self.metrics.set_orphans(&orphans);
        let detection = OrphanDetectionReport {
            enabled: true,
            grace_seconds: finder.grace().as_secs_f64(),
            suspects: finder.suspects(),
            remembered_machines: finder.remembered(),
            memory: self.memory_report(),
        };
        (orphans, detection)
    }
}
