//! The remnant report in the cycle ([`crate::remnants`] decides): metadata-only watches of the
//! kinds a CAPC cluster is made of (those the API server serves), what the scope listings say
//! of deleting CloudStackMachines' VMs, the finder after the decisions, one Warning Event per
//! new remnant (through the writer), and what `/status` and the gauge show.
//!
//! The watches read metadata only (`PartialObjectMeta`: no spec, no status, no Secret): a
//! kind is judged once its watch has synced; one that is not served, or that RBAC does not
//! let the shim list, is left out, and an owner of that kind is never called gone.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;

use super::cycle::{Controller, CycleSummary};
use super::gather::Gathered;
use super::writer::{EventNote, Job};
use crate::remnants::{uid_of, ObjectRecord, OwnerRef, Remnant, RemnantFinder, Uid, VmFacts};
use crate::status::RemnantDetectionReport;
use capi_model::well_known::{CLUSTER_NAME_LABEL, DELETE_FOR_MOVE, PAUSED};

/// The reason of the Event a remnant gets.
pub const REMNANT_EVENT_REASON: &str = "ObjectLeftBehind";

/// The kinds a CAPC cluster is made of, by API group (CAPI, CABPK, KCP, CAPC): the plural is
/// how discovery names each.
pub const REMNANT_KINDS: &[(&str, &[&str])] = &[
    (
        "cluster.x-k8s.io",
        &[
            "Cluster",
            "Machine",
            "MachineSet",
            "MachineDeployment",
            "MachineHealthCheck",
        ],
    ),
    ("bootstrap.cluster.x-k8s.io", &["KubeadmConfig"]),
    ("controlplane.cluster.x-k8s.io", &["KubeadmControlPlane"]),
    (
        "infrastructure.cluster.x-k8s.io",
        &[
            "CloudStackCluster",
            "CloudStackMachine",
            "CloudStackMachineTemplate",
            "CloudStackFailureDomain",
            "CloudStackAffinityGroup",
            "CloudStackIsolatedNetwork",
        ],
    ),
];

/// The served resources of [`REMNANT_KINDS`], each at its group's preferred version; a group
/// or kind that is not served is simply absent.
pub async fn discover_remnant_kinds(client: &Client) -> Vec<ApiResource> {
    let mut out = Vec::new();
    for (group, kinds) in REMNANT_KINDS {
        let Ok(g) = kube::discovery::group(client, group).await else {
            continue;
        };
        for (ar, _) in g.recommended_resources() {
            if kinds.contains(&ar.kind.as_str()) {
                out.push(ar);
            }
        }
    }
    out
}

/// The object's metadata as the finder reads it (pure); `group` and `kind` are shared by
/// every record of the kind.
pub fn object_record(group: &Arc<str>, kind: &Arc<str>, m: ObjectMeta) -> Option<ObjectRecord> {
    let name = m.name?;
    let annotations = m.annotations.unwrap_or_default();
    Some(ObjectRecord {
        group: group.clone(),
        kind: kind.clone(),
        namespace: m.namespace.unwrap_or_default(),
        name,
        uid: uid_of(m.uid.as_deref().unwrap_or_default()),
        deleting_since: m.deletion_timestamp.map(|t| t.0),
        finalizers: m.finalizers.unwrap_or_default(),
        controller: m
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .find(|r| r.controller == Some(true))
            .map(|r| OwnerRef {
                kind: r.kind,
                name: r.name,
                uid: uid_of(&r.uid),
            }),
        cluster: m
            .labels
            .unwrap_or_default()
            .remove(CLUSTER_NAME_LABEL)
            .filter(|c| !c.is_empty()),
        paused: annotations.contains_key(PAUSED),
        moving: annotations.contains_key(DELETE_FOR_MOVE),
    })
}

/// One watch's objects by uid (a compact key: a store keyed by name would copy each name and
/// namespace once more); a relist (`Init` … `InitDone`) replaces them as a whole.
#[derive(Debug, Default)]
pub struct ObjectStore {
    live: HashMap<Uid, Arc<ObjectRecord>>,
    relist: Option<HashMap<Uid, Arc<ObjectRecord>>>,
    synced: bool,
}

impl ObjectStore {
    /// One watch event (pure).
    pub fn apply(&mut self, event: watcher::Event<ObjectRecord>) {
        use watcher::Event;
        match event {
            Event::Init => self.relist = Some(HashMap::new()),
            Event::InitApply(o) => {
                self.relist
                    .get_or_insert_with(HashMap::new)
                    .insert(o.uid, Arc::new(o));
            }
            Event::InitDone => {
                if let Some(listed) = self.relist.take() {
                    self.live = listed;
                }
                self.synced = true;
            }
            Event::Apply(o) => {
                self.live.insert(o.uid, Arc::new(o));
            }
            Event::Delete(o) => {
                self.live.remove(&o.uid);
            }
        }
    }

    /// Whether a whole list has been taken in.
    pub fn synced(&self) -> bool {
        self.synced
    }

    pub fn objects(&self) -> impl Iterator<Item = &Arc<ObjectRecord>> {
        self.live.values()
    }
}

type SharedStore = Arc<Mutex<ObjectStore>>;

fn lock(s: &SharedStore) -> std::sync::MutexGuard<'_, ObjectStore> {
    s.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One kind's metadata watches (one per namespace of `--namespace`, or one for all).
struct KindWatch {
    resource: ApiResource,
    stores: Vec<SharedStore>,
}

impl KindWatch {
    fn synced(&self) -> bool {
        self.stores.iter().all(|s| lock(s).synced())
    }
}

/// The metadata-only watches of the remnant report.
pub struct MetadataWatches {
    kinds: Vec<KindWatch>,
}

impl MetadataWatches {
    /// Starts one metadata watch per resource (and namespace); they sync in the background.
    pub fn start(client: &Client, resources: Vec<ApiResource>, namespaces: &[String]) -> Self {
        let kinds = resources
            .into_iter()
            .map(|ar| {
                let apis: Vec<Api<PartialObjectMeta<DynamicObject>>> = if namespaces.is_empty() {
                    vec![Api::all_with(client.clone(), &ar)]
                } else {
                    namespaces
                        .iter()
                        .map(|ns| Api::namespaced_with(client.clone(), ns, &ar))
                        .collect()
                };
                let stores = apis
                    .into_iter()
                    .map(|api| watch_metadata(api, ar.clone()))
                    .collect();
                KindWatch {
                    resource: ar,
                    stores,
                }
            })
            .collect();
        Self { kinds }
    }

    /// Every object of the synced kinds, and which kinds those are.
    fn synced_objects(&self) -> (Vec<Arc<ObjectRecord>>, HashSet<&str>) {
        let mut objects = Vec::new();
        let mut kinds = HashSet::new();
        for k in self.kinds.iter().filter(|k| k.synced()) {
            kinds.insert(k.resource.kind.as_str());
            for store in &k.stores {
                objects.extend(lock(store).objects().cloned());
            }
        }
        (objects, kinds)
    }

    fn api_version(&self, kind: &str) -> Option<&str> {
        self.kinds
            .iter()
            .find(|k| k.resource.kind == kind)
            .map(|k| k.resource.api_version.as_str())
    }

    fn unsynced(&self) -> Vec<String> {
        self.kinds
            .iter()
            .filter(|k| !k.synced())
            .map(|k| k.resource.kind.clone())
            .collect()
    }
}

fn watch_metadata(api: Api<PartialObjectMeta<DynamicObject>>, ar: ApiResource) -> SharedStore {
    let store = SharedStore::default();
    let writer = store.clone();
    let events = watcher(api, watcher::Config::default().any_semantic()).default_backoff();
    let (group, kind): (Arc<str>, Arc<str>) = (ar.group.as_str().into(), ar.kind.as_str().into());
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut refused_logged = false;
        while let Some(event) = events.next().await {
            use watcher::Event;
            let read =
                |o: PartialObjectMeta<DynamicObject>| object_record(&group, &kind, o.metadata);
            let event = match event {
                Ok(Event::Apply(o)) => read(o).map(Event::Apply),
                Ok(Event::Delete(o)) => read(o).map(Event::Delete),
                Ok(Event::InitApply(o)) => read(o).map(Event::InitApply),
                Ok(Event::Init) => Some(Event::Init),
                Ok(Event::InitDone) => Some(Event::InitDone),
                Err(e) => {
                    // A kind RBAC does not grant fails every retry: said once, then quietly.
                    if !refused_logged {
                        tracing::warn!(kind = %ar.kind, error = %e, "remnant report: metadata watch error; retrying with back-off (the kind is left out until it syncs)");
                        refused_logged = true;
                    }
                    None
                }
            };
            if let Some(event) = event {
                lock(&writer).apply(event);
            }
        }
    });
    store
}

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
    }

    /// For the CloudStackMachines reported stuck deleting whose VM is still listed: the error
    /// of the VM's last failed destroy job, one `listAsyncJobs` per scope at most every
    /// [`DESTROY_JOBS_EVERY`]. A failed listing keeps what was known.
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
        for (scope, vms) in by_scope {
            if report
                .jobs_listed
                .get(scope)
                .is_some_and(|t| t.elapsed() < DESTROY_JOBS_EVERY)
            {
                continue;
            }
            let Some(state) = self.scopes.get(scope) else {
                continue;
            };
            report
                .jobs_listed
                .insert(scope.to_string(), std::time::Instant::now());
            let client = &state.polled.client;
            let before = client.stats();
            let listed = tokio::time::timeout(timeout, client.list_destroy_jobs()).await;
            super::poll::record_call_deltas(&self.metrics, &before, &client.stats());
            match listed {
                Ok(Ok(jobs)) => {
                    for vm in vms {
                        match crate::cloudstack::model::last_failed_destroy(&jobs.items, vm) {
                            Some(e) => report.destroy_errors.insert(vm.to_string(), e),
                            None => report.destroy_errors.remove(vm),
                        };
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(scope = %scope, error = %e, "remnant report: cannot list the destroy jobs");
                }
                Err(_) => {
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use kube::api::GroupVersionKind;

    #[test]
    fn a_relist_replaces_what_the_store_holds_and_syncs_it() {
        let (group, kind): (Arc<str>, Arc<str>) = ("g".into(), "K".into());
        let record = |name: &str| {
            object_record(
                &group,
                &kind,
                ObjectMeta {
                    name: Some(name.into()),
                    uid: Some(format!("uid-{name}")),
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let names = |s: &ObjectStore| {
            let mut n: Vec<String> = s.objects().map(|o| o.name.clone()).collect();
            n.sort();
            n
        };
        let mut s = ObjectStore::default();
        s.apply(watcher::Event::Init);
        s.apply(watcher::Event::InitApply(record("a")));
        assert!(
            !s.synced() && names(&s).is_empty(),
            "not before the list is whole"
        );
        s.apply(watcher::Event::InitDone);
        assert!(s.synced());
        assert_eq!(names(&s), ["a"]);
        s.apply(watcher::Event::Apply(record("b")));
        s.apply(watcher::Event::Apply(record("b")));
        s.apply(watcher::Event::Delete(record("a")));
        assert_eq!(names(&s), ["b"]);
        // A relist after a gap: what it lists, nothing of before.
        s.apply(watcher::Event::Init);
        s.apply(watcher::Event::InitApply(record("c")));
        assert_eq!(
            names(&s),
            ["b"],
            "the old state serves until the relist is done"
        );
        s.apply(watcher::Event::InitDone);
        assert_eq!(names(&s), ["c"]);
    }

    #[test]
    fn an_objects_metadata_becomes_its_record() {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("bootstrap.cluster.x-k8s.io", "v1beta1", "KubeadmConfig"),
            "kubeadmconfigs",
        );
        let owner = |controller| OwnerReference {
            kind: "Machine".into(),
            name: "m1".into(),
            uid: "u-m1".into(),
            api_version: "cluster.x-k8s.io/v1beta1".into(),
            controller,
            ..Default::default()
        };
        let at: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let meta = ObjectMeta {
            name: Some("k1".into()),
            namespace: Some("ns".into()),
            uid: Some("u-k1".into()),
            deletion_timestamp: Some(Time(at)),
            finalizers: Some(vec!["f".into()]),
            owner_references: Some(vec![owner(None), owner(Some(true))]),
            labels: Some([(CLUSTER_NAME_LABEL.to_string(), "c1".to_string())].into()),
            annotations: Some([(DELETE_FOR_MOVE.to_string(), String::new())].into()),
            ..Default::default()
        };
        let (group, kind): (Arc<str>, Arc<str>) =
            (ar.group.as_str().into(), ar.kind.as_str().into());
        let r = object_record(&group, &kind, meta).unwrap();
        assert_eq!(
            (&*r.kind, &*r.group, r.cluster.as_deref()),
            ("KubeadmConfig", "bootstrap.cluster.x-k8s.io", Some("c1"))
        );
        assert_eq!(r.deleting_since, Some(at));
        assert_eq!(r.controller.map(|c| c.uid), Some(uid_of("u-m1")));
        assert!(r.moving && !r.paused);
        assert!(object_record(&group, &kind, ObjectMeta::default()).is_none());
        let empty_label = ObjectMeta {
            name: Some("k2".into()),
            labels: Some([(CLUSTER_NAME_LABEL.to_string(), String::new())].into()),
            ..Default::default()
        };
        assert_eq!(
            object_record(&group, &kind, empty_label).unwrap().cluster,
            None
        );
    }
}
