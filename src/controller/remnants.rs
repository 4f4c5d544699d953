//! The remnant report in the cycle ([`crate::remnants`] decides): over the metadata watches
//! ([`super::remnant_watch`]), what the scope listings and the destroy jobs say of deleting
//! CloudStackMachines' VMs, the finder after the decisions, one Warning Event per new remnant
//! (through the writer), and what `/status` and the gauge show.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::stream::{self, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;

use super::budget::{self, Phase};
use super::cycle::{Controller, CycleSummary};
use super::gather::Gathered;
pub use super::remnant_watch::{
    discover_remnant_kinds, object_record, MetadataWatches, ObjectStore, REMNANT_KINDS,
};
use super::writer::{EventNote, Job};
use crate::cloudstack::client::CloudStackClient;
use crate::remnants::{Remnant, RemnantFinder, VmFacts};
use crate::status::RemnantDetectionReport;

/// The reason of the Event a remnant gets.
pub const REMNANT_EVENT_REASON: &str = "ObjectLeftBehind";

/// The remnant report's state between cycles.
pub struct RemnantReport {
    pub(super) finder: RemnantFinder,
    pub(super) watches: MetadataWatches,
    /// What CloudStack said of deleting CloudStackMachines' VMs at the last complete listing,
    /// by the CloudStackMachine's `namespace/name`.
    pub(super) vms: HashMap<String, VmFacts>,
    /// The remnants of the last cycle.
    pub(super) current: Vec<Remnant>,
    /// Objects in the last cycle's report (kind, namespace/name, reason): an Event goes out
    /// when one first appears, not every cycle.
    pub(super) announced: HashSet<(String, String, crate::remnants::RemnantReason)>,
    pub(super) objects: usize,
    /// The error of the last failed destroy job, by VM id (from `listAsyncJobs`).
    pub(super) destroy_errors: HashMap<String, String>,
    /// When each scope's destroy jobs were last listed.
    pub(super) jobs_listed: HashMap<String, std::time::Instant>,
}

/// How often a scope's destroy jobs are listed at most, while it has a CloudStackMachine stuck
/// deleting (CAPC retries a failing destroy on its own back-off, minutes apart).
pub const DESTROY_JOBS_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl RemnantReport {
    pub fn new(finder: RemnantFinder, watches: MetadataWatches) -> Self {
        Self {
            finder,
            watches,
            vms: HashMap::new(),
            current: Vec::new(),
            announced: HashSet::new(),
            objects: 0,
            destroy_errors: HashMap::new(),
            jobs_listed: HashMap::new(),
        }
    }
}

/// Which of the `wanted` scopes (those with a CloudStackMachine stuck deleting) may have their
/// destroy jobs listed at `now`: not listed within [`DESTROY_JOBS_EVERY`]. `listed` forgets
/// the scopes no longer wanted once their interval is over, so it holds only scopes in use, not
/// every scope that ever had a stuck CloudStackMachine.
fn due_scopes<'a>(
    listed: &mut HashMap<String, std::time::Instant>,
    wanted: impl IntoIterator<Item = &'a str>,
    now: std::time::Instant,
) -> HashSet<&'a str> {
    let wanted: HashSet<&str> = wanted.into_iter().collect();
    let recent = |t: &std::time::Instant| now.saturating_duration_since(*t) < DESTROY_JOBS_EVERY;
    listed.retain(|scope, t| wanted.contains(scope.as_str()) || recent(t));
    wanted
        .into_iter()
        .filter(|scope| !listed.get(*scope).is_some_and(recent))
        .collect()
}

impl Controller {
    /// Turns the remnant report on, over `watches`.
    pub fn with_remnant_report(mut self, watches: MetadataWatches) -> Self {
        let finder = RemnantFinder::new(self.args.remnant_grace);
        self.remnants = Some(RemnantReport::new(finder, watches));
        self
    }

    /// Right after the poll, while the complete listings are still held: what CloudStack says
    /// of each deleting CloudStackMachine's VM (state, or no longer listed).
    pub(super) fn note_remnant_vms(&mut self, g: &Gathered) {
        let Some(report) = self.remnants.as_mut() else {
            return;
        };
        let mut by_scope: HashMap<&str, HashMap<&str, &str>> = HashMap::new();
        let mut seen = HashSet::new();
        for (c, endpoint) in &g.cloudstack_machines {
            let (true, Some(vm_id)) = (c.deleting, c.instance_id.as_deref()) else {
                continue;
            };
            let key = format!("{}/{}", c.namespace, c.name);
            seen.insert(key.clone());
            let Some(scope) = endpoint.as_deref().and_then(|e| g.scope_of.get(e)) else {
                continue;
            };
            let Some(listing) = self.scopes.get(scope).and_then(|s| s.listing.as_deref()) else {
                continue; // not complete this cycle: what was said before stands
            };
            let states = by_scope.entry(scope.as_str()).or_insert_with(|| {
                listing
                    .iter()
                    .map(|v| (v.id.as_str(), v.state.as_str()))
                    .collect()
            });
            let state = states.get(vm_id).map(|s| s.to_string());
            let facts = report.vms.entry(key).or_insert_with(|| VmFacts {
                vm_id: vm_id.to_string(),
                state: None,
                last_error: None,
            });
            facts.state = state;
            facts.last_error = report.destroy_errors.get(vm_id).cloned();
        }
        report.vms.retain(|k, _| seen.contains(k));
        // Without the orphan report, nothing else reads the listings: not held through the
        // rest of the cycle.
        if self.orphans.is_none() {
            for scope in self.scopes.values_mut() {
                scope.listing = None;
            }
        }
    }

    /// For the CloudStackMachines reported stuck deleting whose VM is still listed: the error
    /// of the VM's last failed destroy job, one `listAsyncJobs` per scope at most every
    /// [`DESTROY_JOBS_EVERY`], the scopes at once ([`super::budget`]). A failed listing, or one
    /// not done in time, keeps what was known.
    pub(super) async fn look_up_destroy_errors(&mut self, g: &Gathered) {
        let Some(report) = self.remnants.as_mut() else {
            return;
        };
        let stuck: HashSet<(&str, &str)> = report
            .current
            .iter()
            .filter(|r| r.reason == crate::remnants::RemnantReason::StuckDeleting)
            .filter(|r| r.kind == "CloudStackMachine" && r.related_vm.is_some())
            .map(|r| (r.namespace.as_str(), r.name.as_str()))
            .collect();
        let mut by_scope: HashMap<&str, Vec<&str>> = HashMap::new();
        for (c, endpoint) in &g.cloudstack_machines {
            let (Some(vm), true) = (
                c.instance_id.as_deref(),
                stuck.contains(&(c.namespace.as_str(), c.name.as_str())),
            ) else {
                continue;
            };
            if let Some(scope) = endpoint.as_deref().and_then(|e| g.scope_of.get(e)) {
                by_scope.entry(scope.as_str()).or_default().push(vm);
            }
        }
        let wanted: HashSet<&str> = by_scope.values().flatten().copied().collect();
        report
            .destroy_errors
            .retain(|vm, _| wanted.contains(vm.as_str()));
        let timeout = crate::cli::to_std(self.args.request_timeout) * 4;
        let now = std::time::Instant::now();
        // At most one listing per scope per DESTROY_JOBS_EVERY; scopes no longer wanted are
        // forgotten (`due_scopes`).
        let due_now = due_scopes(&mut report.jobs_listed, by_scope.keys().copied(), now);
        let due: Vec<(&str, Vec<&str>, &CloudStackClient)> = by_scope
            .into_iter()
            .filter(|(scope, _)| due_now.contains(scope))
            .filter_map(|(scope, vms)| Some((scope, vms, &self.scopes.get(scope)?.polled.client)))
            .collect();
        for (scope, _, _) in &due {
            report.jobs_listed.insert(scope.to_string(), now);
        }
        // All scopes at once within the listings' share of --poll-deadline: one CloudStack
        // that does not answer delays no other, and what was known of its VMs stands.
        let window = budget::Window::start(
            Phase::DestroyJobs,
            crate::cli::to_std(self.args.poll_deadline),
        );
        let metrics = &self.metrics;
        let listed: Vec<_> = stream::iter(due)
            .map(|(scope, vms, client)| async move {
                let before = client.stats();
                let listed = window
                    .call(tokio::time::timeout(timeout, client.list_destroy_jobs()))
                    .await;
                super::poll::record_call_deltas(metrics, &before, &client.stats());
                (scope, vms, listed)
            })
            .buffer_unordered(budget::CONCURRENT_CALLS)
            .collect()
            .await;
        for (scope, vms, listed) in listed {
            match listed {
                Some(Ok(Ok(jobs))) => {
                    for vm in vms {
                        match crate::cloudstack::model::last_failed_destroy(&jobs.items, vm) {
                            Some(e) => report.destroy_errors.insert(vm.to_string(), e),
                            None => report.destroy_errors.remove(vm),
                        };
                    }
                }
                Some(Ok(Err(e))) => {
                    tracing::debug!(scope = %scope, error = %e, "remnant report: cannot list the destroy jobs");
                }
                Some(Err(_)) | None => {
                    tracing::debug!(scope = %scope, "remnant report: listing the destroy jobs timed out");
                }
            }
        }
    }

    /// The finder over this cycle's objects; new remnants get their Event.
    pub(super) fn find_remnants(&mut self, now: Timestamp, summary: &mut CycleSummary) {
        let Some(report) = self.remnants.as_mut() else {
            return;
        };
        let (mut objects, kinds) = report.watches.synced_objects();
        // A Cluster's `spec.paused` is not metadata: the Cluster watch knows it.
        let paused: HashSet<(String, String)> = self
            .stores
            .clusters
            .state()
            .iter()
            .filter(|c| c.paused)
            .map(|c| (c.namespace.clone(), c.name.clone()))
            .collect();
        for o in objects.iter_mut() {
            if &*o.kind == "Cluster"
                && !o.paused
                && paused.contains(&(o.namespace.clone(), o.name.clone()))
            {
                Arc::make_mut(o).paused = true;
            }
        }
        let found = report.finder.observe(&objects, &kinds, &report.vms, now);
        report.objects = objects.len();
        drop(objects);
        let key = |r: &Remnant| {
            (
                r.kind.clone(),
                format!("{}/{}", r.namespace, r.name),
                r.reason,
            )
        };
        let new: Vec<Remnant> = found
            .iter()
            .filter(|r| !report.announced.contains(&key(r)))
            .cloned()
            .collect();
        report.announced = found.iter().map(key).collect();
        report.current = found;
        for r in &new {
            tracing::warn!(kind = %r.kind, namespace = %r.namespace, name = %r.name,
                reason = r.reason.as_str(), why = %r.why,
                "remnant: an object left behind (reported, never deleted or patched)");
        }
        self.announce_remnants(&new, summary);
    }

    /// One Warning Event per new remnant: on its Cluster when that exists, else on the object.
    fn announce_remnants(&mut self, new: &[Remnant], summary: &mut CycleSummary) {
        let Some(report) = self.remnants.as_ref() else {
            return;
        };
        let clusters = self.stores.clusters.state();
        let mut jobs = Vec::new();
        for r in new {
            let cluster = r
                .cluster
                .as_deref()
                .and_then(|c| c.split_once('/'))
                .and_then(|(ns, name)| {
                    clusters
                        .iter()
                        .find(|c| c.namespace == ns && c.name == name)
                });
            let object = ObjectReference {
                api_version: report.watches.api_version(&r.kind).map(str::to_string),
                kind: Some(r.kind.clone()),
                namespace: Some(r.namespace.clone()),
                name: Some(r.name.clone()),
                ..Default::default()
            };
            let (reference, related) = match cluster {
                Some(c) if r.kind != "Cluster" => (
                    ObjectReference {
                        api_version: Some(self.resources.cluster.api_version.clone()),
                        kind: Some("Cluster".into()),
                        namespace: Some(c.namespace.clone()),
                        name: Some(c.name.clone()),
                        uid: c.uid.clone(),
                        ..Default::default()
                    },
                    Some(object),
                ),
                _ => (object, None),
            };
            let note = format!(
                "{} {}/{} is left behind ({}): {}. The shim never deletes or patches it; \
                 `capc-health-shim orphans` prints the commands to inspect it.",
                r.kind,
                r.namespace,
                r.name,
                r.reason.as_str(),
                r.why
            );
            jobs.push(Job::Event {
                reference: Box::new(reference),
                related: related.map(Box::new),
                event: EventNote {
                    warning: true,
                    reason: REMNANT_EVENT_REASON.into(),
                    note,
                },
            });
        }
        for job in jobs {
            self.enqueue(job, summary);
        }
    }

    /// What `/status` shows of the remnant report, and the gauge by cluster and kind.
    pub(super) fn remnant_report(&self) -> (Vec<Remnant>, RemnantDetectionReport) {
        let Some(report) = &self.remnants else {
            self.metrics.set_remnants(&[]);
            return (Vec::new(), RemnantDetectionReport::default());
        };
        self.metrics.set_remnants(&report.current);
        let (synced, unsynced): (BTreeSet<String>, Vec<String>) = (
            report
                .watches
                .kinds
                .iter()
                .filter(|k| k.synced())
                .map(|k| k.resource.kind.clone())
                .collect(),
            report.watches.unsynced(),
        );
        let detection = RemnantDetectionReport {
            enabled: true,
            grace_seconds: report.finder.grace().as_secs_f64(),
            kinds: synced.into_iter().collect(),
            kinds_not_synced: unsynced,
            objects: report.objects,
            suspects: report.finder.suspects(),
        };
        (report.current.clone(), detection)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A scope is listed at most every DESTROY_JOBS_EVERY while it has a stuck
    /// CloudStackMachine, and forgotten once it has none and its interval is over: the map
    /// holds the scopes in use, not every scope ever seen (it grew without end before).
    #[test]
    fn destroy_job_listings_are_spaced_and_forgotten_scopes_pruned() {
        let mut listed = HashMap::new();
        let t0 = Instant::now();
        let mark = |listed: &mut HashMap<String, Instant>, due: &HashSet<&str>, at: Instant| {
            for s in due {
                listed.insert(s.to_string(), at);
            }
        };
        let due = due_scopes(&mut listed, ["a", "b"], t0);
        assert_eq!(due, HashSet::from(["a", "b"]));
        mark(&mut listed, &due, t0);
        // Within the interval: nothing due, and b (no longer stuck) is still remembered, so
        // a flapping scope is not listed more often.
        let t1 = t0 + Duration::from_secs(10);
        assert!(due_scopes(&mut listed, ["a"], t1).is_empty());
        assert!(due_scopes(&mut listed, ["a", "b"], t1).is_empty());
        // Past it: a is due again; b, wanted by nobody, is forgotten.
        let t2 = t0 + DESTROY_JOBS_EVERY + Duration::from_secs(1);
        let due = due_scopes(&mut listed, ["a"], t2);
        assert_eq!(due, HashSet::from(["a"]));
        mark(&mut listed, &due, t2);
        assert_eq!(listed.keys().collect::<Vec<_>>(), ["a"]);
        // Many scopes come and go: the map never holds more than the scopes in use and those
        // listed within the last interval.
        let mut at = t2;
        for round in 0..100 {
            at += DESTROY_JOBS_EVERY;
            let scope = format!("scope-{round}");
            let due = due_scopes(&mut listed, [scope.as_str()], at);
            mark(&mut listed, &due, at);
            assert!(listed.len() <= 2, "{} scopes remembered", listed.len());
        }
        // Nothing stuck anywhere: all forgotten after one interval.
        assert!(due_scopes(&mut listed, [], at + DESTROY_JOBS_EVERY).is_empty());
        assert!(listed.is_empty());
    }
}
