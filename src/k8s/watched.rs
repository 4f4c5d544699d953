//! What the watches keep of each object: the few facts the shim's decisions read, taken once
//! per watch event from the object's typed partial view ([`super::views`]: a field the shim
//! does not expect never makes an object unreadable; a missing one reads as missing).
//!
//! Why not keep the objects: at 10 000 Machines the stored JSON trees (every small map a
//! B-tree node), the API-resource copy in each store key and a JSON copy of every object
//! taken each cycle for the join made up 160 of the controller's 200 MiB of live heap. These
//! records are a few hundred bytes each and the join reads them in place.

use std::borrow::Cow;
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use kube::runtime::reflector::Lookup;
use kube::runtime::watcher;
use serde_json::Value;

use kube::core::Selector;

use super::coverage::{go_duration, ConditionRule};
use super::objects::MachineView;
use super::views::{
    text, CloudStackMachineObject, ClusterObject, FailureDomainObject, HealthCheckObject,
    MachineObject, Meta,
};
use crate::verdict::ConditionState;
use capi_model::apis::ConditionLayout;
use capi_model::condition as conditions;
use capi_model::well_known;

/// How to read our condition off a Machine: where the served API keeps conditions, and the
/// condition type the shim owns.
#[derive(Debug, Clone)]
pub struct ConditionReader {
    pub layout: ConditionLayout,
    pub condition_type: String,
}

/// Reads `json` as the view `V` and takes its record: the path a watch event takes, for tests,
/// benches and tools that hold JSON.
fn via_view<'a, V: serde::Deserialize<'a>, R>(
    json: &'a Value,
    record: impl FnOnce(V) -> Option<R>,
) -> Option<R> {
    V::deserialize(json).ok().and_then(record)
}

fn owned(s: &Option<String>) -> Option<String> {
    text(s).map(str::to_string)
}

fn time(s: &Option<String>) -> Option<Timestamp> {
    text(s).and_then(|s| s.parse().ok())
}

fn cluster_label(m: &Meta) -> Option<String> {
    m.label(well_known::CLUSTER_NAME_LABEL).map(str::to_string)
}

/// A Machine: its view, when it was created, and our condition as published on it.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineRecord {
    pub view: Arc<MachineView>,
    pub created: Option<Timestamp>,
    /// Shared with the targets joined from this record.
    pub current: Option<Arc<ConditionState>>,
}

impl MachineRecord {
    pub fn from_view(m: MachineObject, reader: &ConditionReader) -> Option<Self> {
        let conditions = match reader.layout {
            ConditionLayout::V1Beta2 => &m.status.conditions,
            ConditionLayout::V1Beta1WithV1Beta2Conditions => &m.status.v1beta2.conditions,
        };
        Some(Self {
            current: conditions::find(conditions, &reader.condition_type).map(Arc::new),
            created: time(&m.metadata.creation_timestamp),
            view: Arc::new(MachineView::from_view(&m)?),
        })
    }

    pub fn from_json(m: &Value, reader: &ConditionReader) -> Option<Self> {
        via_view(m, |m| Self::from_view(m, reader))
    }
}

/// A CloudStackMachine: which VM, in which failure domain, and CAPC's record of its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudStackMachineRecord {
    pub namespace: String,
    pub name: String,
    /// `spec.instanceID`, lowercased as CloudStack's ids compare.
    pub instance_id: Option<String>,
    pub failure_domain_name: Option<String>,
    /// `status.instanceState` and when it last changed (an anchor after a restart).
    pub instance_state: Option<String>,
    pub instance_state_since: Option<Timestamp>,
    /// The `cluster.x-k8s.io/cluster-name` label.
    pub cluster_name: Option<String>,
    /// It has a deletionTimestamp: CAPC is destroying its VM.
    pub deleting: bool,
    /// clusterctl marked it `delete-for-move`: its deletion here is a move, not a loss.
    pub moving: bool,
}

impl CloudStackMachineRecord {
    pub fn from_view(v: CloudStackMachineObject) -> Option<Self> {
        let (namespace, name) = v.metadata.key()?;
        Some(Self {
            namespace,
            name,
            instance_id: text(&v.spec.instance_id).map(str::to_ascii_lowercase),
            failure_domain_name: owned(&v.spec.failure_domain_name),
            instance_state: owned(&v.status.instance_state),
            instance_state_since: time(&v.status.instance_state_last_updated),
            cluster_name: cluster_label(&v.metadata),
            deleting: v.metadata.deleting(),
            moving: v.metadata.annotated(well_known::DELETE_FOR_MOVE),
        })
    }

    pub fn from_json(v: &Value) -> Option<Self> {
        via_view(v, Self::from_view)
    }
}

/// A CloudStackFailureDomain: CAPC names the object `md5(name+cluster)` and keeps the
/// logical name in `spec.name`; the endpoint Secret, project and zone say where to poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureDomainRecord {
    pub namespace: String,
    pub name: String,
    pub spec_name: Option<String>,
    /// The `cluster.x-k8s.io/cluster-name` label.
    pub cluster_name: Option<String>,
    pub secret_name: Option<String>,
    pub secret_namespace: Option<String>,
    pub project: Option<String>,
    pub zone_id: Option<String>,
}

impl FailureDomainRecord {
    pub fn from_view(v: FailureDomainObject) -> Option<Self> {
        let (namespace, name) = v.metadata.key()?;
        Some(Self {
            namespace,
            name,
            spec_name: owned(&v.spec.name),
            cluster_name: cluster_label(&v.metadata),
            secret_name: owned(&v.spec.acs_endpoint.name),
            secret_namespace: owned(&v.spec.acs_endpoint.namespace),
            project: owned(&v.spec.project),
            zone_id: owned(&v.spec.zone.id),
        })
    }

    pub fn from_json(v: &Value) -> Option<Self> {
        via_view(v, Self::from_view)
    }
}

/// A Cluster: whether it is paused (`spec.paused` or the paused annotation), whether it is
/// being deleted, and its uid (Events about it name it, so `kubectl describe` finds them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRecord {
    pub namespace: String,
    pub name: String,
    pub paused: bool,
    pub deleting: bool,
    pub uid: Option<String>,
}

impl ClusterRecord {
    pub fn from_view(v: ClusterObject) -> Option<Self> {
        let (namespace, name) = v.metadata.key()?;
        Some(Self {
            namespace,
            name,
            paused: v.spec.paused || v.metadata.annotated(well_known::PAUSED),
            deleting: v.metadata.deleting(),
            uid: owned(&v.metadata.uid),
        })
    }

    pub fn from_json(v: &Value) -> Option<Self> {
        via_view(v, Self::from_view)
    }
}

/// A MachineHealthCheck: which cluster, which Machines (its selector, parsed once here; `None`
/// when unreadable, which selects nothing), and whether it is paused.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheckRecord {
    pub namespace: String,
    pub name: String,
    pub cluster_name: Option<String>,
    pub selector: Option<Selector>,
    pub paused: bool,
    /// `unhealthyMachineConditions` of either API version (`spec.checks.…` in v1beta2,
    /// `spec.…` in v1beta1 since CAPI 1.13); entries without a type or status are dropped.
    pub machine_conditions: Vec<ConditionRule>,
    /// `nodeStartupTimeout` (v1beta1) or `checks.nodeStartupTimeoutSeconds` (v1beta2), when
    /// set: how long it lets a Machine go without its Node.
    pub node_startup_timeout: Option<SignedDuration>,
}

impl HealthCheckRecord {
    pub fn from_view(v: HealthCheckObject) -> Option<Self> {
        let (namespace, name) = v.metadata.key()?;
        Some(Self {
            namespace,
            name,
            cluster_name: owned(&v.spec.cluster_name),
            selector: v.spec.selector.and_then(|s| Selector::try_from(s).ok()),
            paused: v.metadata.annotated(well_known::PAUSED),
            machine_conditions: v
                .spec
                .checks
                .unhealthy_machine_conditions
                .iter()
                .map(|r| (r, r.timeout_seconds.map(SignedDuration::from_secs)))
                .chain(
                    v.spec
                        .unhealthy_machine_conditions
                        .iter()
                        .map(|r| (r, r.timeout.as_deref().and_then(go_duration))),
                )
                .filter_map(|(r, timeout)| {
                    Some(ConditionRule {
                        type_: text(&r.type_)?.to_string(),
                        status: text(&r.status)?.to_string(),
                        timeout,
                    })
                })
                .collect(),
            node_startup_timeout: v
                .spec
                .checks
                .node_startup_timeout_seconds
                .map(SignedDuration::from_secs)
                .or_else(|| v.spec.node_startup_timeout.as_deref().and_then(go_duration)),
        })
    }

    pub fn from_json(v: &Value) -> Option<Self> {
        via_view(v, Self::from_view)
    }
}

/// Keys the store by namespace and name only (`DynamicType = ()`: a `DynamicObject` store
/// keeps a copy of the API resource in every key). The resourceVersion and uid stay out of
/// the key; the records that need them carry them.
macro_rules! keyed_by_name {
    ($record:ty, $kind:literal, $(.$ns:ident)+, $(.$name:ident)+) => {
        impl Lookup for $record {
            type DynamicType = ();
            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                "".into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                "".into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                "".into()
            }
            fn name(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Borrowed(self$(.$name)+.as_str()))
            }
            fn namespace(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Borrowed(self$(.$ns)+.as_str()))
            }
            fn resource_version(&self) -> Option<Cow<'_, str>> {
                None
            }
            fn uid(&self) -> Option<Cow<'_, str>> {
                None
            }
        }
    };
}

/// Which of two reads of one object is the newer: a relist (the watches read with
/// `any_semantic`, so from the API server's cache) may serve an object older than one already
/// seen, and an older Machine taken as news would restart a clock the shim already published.
pub trait Versioned {
    /// The object's uid and resourceVersion, when the record keeps them. resourceVersions are
    /// etcd revisions, compared as integers; one that does not parse is never called older.
    fn version(&self) -> Option<(&str, u64)> {
        None
    }
}

impl Versioned for MachineRecord {
    fn version(&self) -> Option<(&str, u64)> {
        let uid = self.view.uid.as_deref()?;
        let rv = self.view.resource_version.as_deref()?.parse().ok()?;
        Some((uid, rv))
    }
}
// The other kinds keep no version, so each read of them is taken as it comes: they are inputs
// the cycle reads again every poll, while a Machine carries the clocks (lastTransitionTime,
// the writer's precondition) that an older read would turn back.
impl Versioned for CloudStackMachineRecord {}
impl Versioned for FailureDomainRecord {}
impl Versioned for ClusterRecord {}
impl Versioned for HealthCheckRecord {}

/// Whether `incoming` is an older read of the object `stored` is (same uid, lower
/// resourceVersion). A recreated object (another uid) is never older.
pub fn is_older_read(incoming: &impl Versioned, stored: &impl Versioned) -> bool {
    match (incoming.version(), stored.version()) {
        (Some((uid, rv)), Some((stored_uid, stored_rv))) => uid == stored_uid && rv < stored_rv,
        _ => false,
    }
}

/// A watch event with stale reads taken out: an update older than what the store holds is
/// dropped, and a relist's older copy is replaced by the stored, newer one (the relist still
/// replaces the store, so objects gone from it are gone). `stored` looks an object up in the
/// store as it was before the event. Returns the event and whether a stale read was met.
pub fn keep_newer<R: Versioned + Clone>(
    event: watcher::Event<R>,
    stored: impl Fn(&R) -> Option<Arc<R>>,
) -> (Option<watcher::Event<R>>, bool) {
    use watcher::Event;
    let newer = |o: &R| stored(o).filter(|s| is_older_read(o, s.as_ref()));
    match event {
        Event::Apply(o) => match newer(&o) {
            Some(_) => (None, true),
            None => (Some(Event::Apply(o)), false),
        },
        Event::InitApply(o) => match newer(&o) {
            Some(s) => (Some(Event::InitApply((*s).clone())), true),
            None => (Some(Event::InitApply(o)), false),
        },
        other => (Some(other), false),
    }
}

keyed_by_name!(MachineRecord, "Machine", .view.namespace, .view.name);
keyed_by_name!(CloudStackMachineRecord, "CloudStackMachine", .namespace, .name);
keyed_by_name!(FailureDomainRecord, "CloudStackFailureDomain", .namespace, .name);
keyed_by_name!(ClusterRecord, "Cluster", .namespace, .name);
keyed_by_name!(HealthCheckRecord, "MachineHealthCheck", .namespace, .name);

#[cfg(test)]
mod tests {
    use super::*;
    use capi_model::well_known::{CLUSTER_NAME_LABEL, PAUSED};
    use kube::core::SelectorExt;
    use serde_json::json;

    const OURS: &str = "CloudStackVMHealthy";

    fn condition(type_: &str, status: &str) -> Value {
        json!({"type": type_, "status": status, "reason": "R", "message": "m",
            "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    /// Machine `m1` (uid `uid`, resourceVersion `rv`) carrying our condition at `status`.
    fn machine_at(uid: &str, rv: &str, status: &str) -> MachineRecord {
        let m = json!({"metadata": {"name": "m1", "namespace": "ns1", "uid": uid,
                "resourceVersion": rv},
            "spec": {"clusterName": "c1", "infrastructureRef": {"kind": "CloudStackMachine", "name": "m1-csm"}},
            "status": {"conditions": [condition(OURS, status)]}});
        let reader = ConditionReader {
            layout: ConditionLayout::V1Beta2,
            condition_type: OURS.into(),
        };
        MachineRecord::from_json(&m, &reader).unwrap()
    }

    /// A relist that serves an older copy of a Machine (the cache of an API server behind)
    /// leaves the newer one in the store; an update older than the store is dropped; a
    /// Machine recreated under the same name (another uid) is taken whatever its version;
    /// one gone from the relist is gone. Driven through kube's own reflector store.
    #[test]
    fn a_stale_relist_or_update_does_not_replace_a_newer_machine() {
        use capi_model::Status;
        use kube::runtime::reflector::{store::Writer, ObjectRef};
        use watcher::Event;
        let mut writer = Writer::<MachineRecord>::new(());
        let reader = writer.as_reader();
        let status_of = |reader: &kube::runtime::reflector::Store<MachineRecord>| {
            let m = reader.get(&ObjectRef::new("m1").within("ns1"))?;
            let (uid, rv) = m.version()?;
            Some((uid.to_string(), rv, m.current.as_ref()?.status))
        };
        let apply = |writer: &mut Writer<MachineRecord>, events: Vec<Event<MachineRecord>>| {
            let mut stale = 0;
            for e in events {
                let (e, was_stale) = keep_newer(e, |o| {
                    reader.get(&ObjectRef::new(&o.view.name).within("ns1"))
                });
                stale += usize::from(was_stale);
                if let Some(e) = e {
                    writer.apply_watcher_event(&e);
                }
            }
            stale
        };
        let relist = |m: Option<MachineRecord>| {
            let mut e = vec![Event::Init];
            e.extend(m.map(Event::InitApply));
            e.push(Event::InitDone);
            e
        };
        let newer = machine_at("u1", "120", "False");
        assert_eq!(apply(&mut writer, relist(Some(newer))), 0);
        assert_eq!(status_of(&reader), Some(("u1".into(), 120, Status::False)));
        // The relist serves resourceVersion 100, when our condition was still True.
        let older = machine_at("u1", "100", "True");
        assert_eq!(apply(&mut writer, relist(Some(older.clone()))), 1);
        assert_eq!(status_of(&reader), Some(("u1".into(), 120, Status::False)));
        // An update older than the store, likewise.
        assert_eq!(apply(&mut writer, vec![Event::Apply(older)]), 1);
        assert_eq!(status_of(&reader), Some(("u1".into(), 120, Status::False)));
        // A newer one is taken.
        let later = machine_at("u1", "130", "True");
        assert_eq!(apply(&mut writer, vec![Event::Apply(later)]), 0);
        assert_eq!(status_of(&reader), Some(("u1".into(), 130, Status::True)));
        // Recreated: another uid, a lower version than the old object's — it is the truth.
        let recreated = machine_at("u2", "7", "Unknown");
        assert_eq!(apply(&mut writer, relist(Some(recreated))), 0);
        assert_eq!(status_of(&reader), Some(("u2".into(), 7, Status::Unknown)));
        // Gone from the relist: gone.
        assert_eq!(apply(&mut writer, relist(None)), 0);
        assert_eq!(status_of(&reader), None);
        // A version that is not a number is never called older.
        let odd = machine_at("u3", "abc", "True");
        assert!(!is_older_read(&odd, &machine_at("u3", "5", "True")));
    }

    #[test]
    fn a_machine_record_reads_our_condition_from_the_served_layout() {
        let m = json!({"metadata": {"name": "m1", "namespace": "ns1", "uid": "u1",
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"clusterName": "c1", "infrastructureRef": {"kind": "CloudStackMachine", "name": "m1-csm"}},
            "status": {"conditions": [condition("Ready", "False")],
                "v1beta2": {"conditions": [condition("Available", "False"), condition(OURS, "False")]}}});
        let read = |layout| {
            MachineRecord::from_json(
                &m,
                &ConditionReader {
                    layout,
                    condition_type: OURS.into(),
                },
            )
            .unwrap()
        };
        let v1beta1 = read(ConditionLayout::V1Beta1WithV1Beta2Conditions);
        assert_eq!(v1beta1.view.name, "m1");
        assert_eq!(
            v1beta1.created,
            Some("2026-01-01T00:00:00Z".parse().unwrap())
        );
        assert_eq!(
            v1beta1.current.as_ref().map(|c| c.type_.as_str()),
            Some(OURS)
        );
        // Under v1beta2, `status.conditions` is where ours would be, and it is not there.
        assert_eq!(read(ConditionLayout::V1Beta2).current, None);
        assert_eq!(
            MachineRecord::from_json(
                &json!({"metadata": {}}),
                &ConditionReader {
                    layout: ConditionLayout::V1Beta2,
                    condition_type: OURS.into()
                }
            ),
            None
        );
    }

    #[test]
    fn records_take_the_read_fields_and_tolerate_odd_shapes() {
        let csm = CloudStackMachineRecord::from_json(&json!({"metadata": {"name": "x"},
            "spec": {"instanceID": "ABC-1", "failureDomainName": "", "offering": {"name": "s"}},
            "status": {"instanceState": 7, "instanceStateLastUpdated": "not a time"}}))
        .unwrap();
        assert_eq!(
            csm,
            CloudStackMachineRecord {
                namespace: "default".into(),
                name: "x".into(),
                instance_id: Some("abc-1".into()),
                failure_domain_name: None,
                instance_state: None,
                instance_state_since: None,
                cluster_name: None,
                deleting: false,
                moving: false,
            }
        );
        let moving = CloudStackMachineRecord::from_json(&json!({"metadata": {"name": "x",
            "labels": {CLUSTER_NAME_LABEL: "c1"}, "deletionTimestamp": "2026-12-01T00:00:00Z",
            "annotations": {"clusterctl.cluster.x-k8s.io/delete-for-move": ""}}}))
        .unwrap();
        assert_eq!(moving.cluster_name.as_deref(), Some("c1"));
        assert!(moving.deleting && moving.moving);
        let fd =
            FailureDomainRecord::from_json(&json!({"metadata": {"name": "hash", "namespace": "ns",
                "labels": {CLUSTER_NAME_LABEL: "c1", "other": "x"}},
            "spec": {"name": "fd1", "zone": {"id": "z1", "name": "zone-a"}, "project": "p1",
                "acsEndpoint": {"name": "s1", "namespace": "capc-system"}}}))
            .unwrap();
        assert_eq!(
            (fd.spec_name.as_deref(), fd.cluster_name.as_deref()),
            (Some("fd1"), Some("c1"))
        );
        assert_eq!(
            (fd.secret_namespace.as_deref(), fd.secret_name.as_deref()),
            (Some("capc-system"), Some("s1"))
        );
        assert_eq!(
            (fd.project.as_deref(), fd.zone_id.as_deref()),
            (Some("p1"), Some("z1"))
        );
        for (cluster, paused) in [
            (
                json!({"metadata": {"name": "c"}, "spec": {"paused": true}}),
                true,
            ),
            (
                json!({"metadata": {"name": "c", "annotations": {PAUSED: ""}}}),
                true,
            ),
            (
                json!({"metadata": {"name": "c"}, "spec": {"paused": "yes"}}),
                false,
            ),
        ] {
            assert_eq!(ClusterRecord::from_json(&cluster).unwrap().paused, paused);
        }
        let mhc = HealthCheckRecord::from_json(&json!({"metadata": {"name": "h", "namespace": "ns"},
            "spec": {"clusterName": "c1", "selector": {"matchLabels": {"a": "b"}}, "nodeStartupTimeout": "10m"}}))
        .unwrap();
        let labels = |v: &str| [("a".to_string(), v.to_string())].into();
        let selector = mhc.selector.expect("a readable selector");
        assert!(selector.matches(&labels("b")) && !selector.matches(&labels("c")));
        assert!(!mhc.paused);
        assert_eq!(ClusterRecord::from_json(&json!("garbage")), None);
    }

    #[test]
    fn the_store_key_is_namespace_and_name() {
        let c = ClusterRecord {
            namespace: "ns".into(),
            name: "c1".into(),
            paused: false,
            deleting: false,
            uid: None,
        };
        let key = c.to_object_ref(());
        assert_eq!(
            (key.namespace.as_deref(), key.name.as_str()),
            (Some("ns"), "c1")
        );
    }
}
