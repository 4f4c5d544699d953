//! The remnant report's metadata-only watches (`PartialObjectMeta`: no spec, no status, no
//! Secret) of the kinds a CAPC cluster is made of, as far as the API server serves them: each
//! object as the record [`crate::remnants`] judges, in a store keyed by a compact uid. A kind
//! counts once its watch holds a whole list; one that is not served, or that RBAC does not let
//! the shim list, is left out (and an owner of that kind is never called gone).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;

use crate::remnants::{uid_of, ObjectRecord, OwnerRef, Uid};
use capi_model::well_known::{CLUSTER_NAME_LABEL, DELETE_FOR_MOVE, PAUSED};

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
pub(super) struct KindWatch {
    pub(super) resource: ApiResource,
    stores: Vec<SharedStore>,
}

impl KindWatch {
    pub(super) fn synced(&self) -> bool {
        self.stores.iter().all(|s| lock(s).synced())
    }
}

/// The metadata-only watches of the remnant report.
pub struct MetadataWatches {
    pub(super) kinds: Vec<KindWatch>,
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
    pub(super) fn synced_objects(&self) -> (Vec<Arc<ObjectRecord>>, HashSet<&str>) {
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

    pub(super) fn api_version(&self, kind: &str) -> Option<&str> {
        self.kinds
            .iter()
            .find(|k| k.resource.kind == kind)
            .map(|k| k.resource.api_version.as_str())
    }

    pub(super) fn unsynced(&self) -> Vec<String> {
        self.kinds
            .iter()
            .filter(|k| !k.synced())
            .map(|k| k.resource.kind.clone())
            .collect()
    }
}

/// Which watch errors are said: the first of each run of errors. A kind RBAC does not grant
/// fails every retry (said once, not every back-off), but a watch that worked and fails again
/// is a new trouble and is said again.
#[derive(Debug, Default)]
struct ErrorRun {
    /// Errors since the last event that went through.
    errors: u64,
}

impl ErrorRun {
    /// An error: whether to say it (the first of its run).
    fn error(&mut self) -> bool {
        self.errors += 1;
        self.errors == 1
    }

    /// An event went through: the run ends; how many errors it had, if there was one.
    fn ok(&mut self) -> Option<u64> {
        Some(std::mem::take(&mut self.errors)).filter(|n| *n > 0)
    }
}

fn watch_metadata(api: Api<PartialObjectMeta<DynamicObject>>, ar: ApiResource) -> SharedStore {
    let store = SharedStore::default();
    let writer = store.clone();
    let events = watcher(api, watcher::Config::default().any_semantic()).default_backoff();
    let (group, kind): (Arc<str>, Arc<str>) = (ar.group.as_str().into(), ar.kind.as_str().into());
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut errors = ErrorRun::default();
        while let Some(event) = events.next().await {
            use watcher::Event;
            let read =
                |o: PartialObjectMeta<DynamicObject>| object_record(&group, &kind, o.metadata);
            if event.is_ok() {
                if let Some(n) = errors.ok() {
                    tracing::info!(kind = %ar.kind, errors = n, "remnant report: metadata watch works again");
                }
            }
            let event = match event {
                Ok(Event::Apply(o)) => read(o).map(Event::Apply),
                Ok(Event::Delete(o)) => read(o).map(Event::Delete),
                Ok(Event::InitApply(o)) => read(o).map(Event::InitApply),
                Ok(Event::Init) => Some(Event::Init),
                Ok(Event::InitDone) => Some(Event::InitDone),
                Err(e) => {
                    if errors.error() {
                        tracing::warn!(kind = %ar.kind, error = %e, "remnant report: metadata watch error; retrying with back-off (the kind is left out until it syncs)");
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use kube::api::GroupVersionKind;

    /// Each run of watch errors is said once — also a run after the watch worked again
    /// (before, only the watch's first error ever was).
    #[test]
    fn every_new_run_of_watch_errors_is_said() {
        let mut run = ErrorRun::default();
        assert_eq!(run.ok(), None, "no errors, nothing to say");
        let said = |run: &mut ErrorRun, n: usize| (0..n).filter(|_| run.error()).count();
        assert_eq!(
            said(&mut run, 5),
            1,
            "a refused kind: said once, not every retry"
        );
        assert_eq!(run.ok(), Some(5));
        assert_eq!(run.ok(), None);
        assert_eq!(said(&mut run, 3), 1, "a later run is said again");
        assert_eq!(run.ok(), Some(3));
        assert_eq!(said(&mut run, 1), 1);
    }

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
        let at: jiff::Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
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
