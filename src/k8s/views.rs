//! Typed partial views of the foreign objects the shim watches: `serde` structs holding exactly
//! the fields the shim reads, deserialized once per watch event straight from the API server's
//! bytes (no JSON tree of the whole object, no `managedFields`).
//!
//! CAPI and CAPC own these schemas, so every field is tolerant: missing reads as empty, and a
//! field of an unexpected shape reads as absent (`DefaultOnError`) instead of making the object
//! unreadable — one odd Machine must never stop the watch of all of them. [`Partial`] makes a
//! view watchable at the API version discovery chose.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::ApiResource;
use kube::core::DynamicResourceScope;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_with::{As, DefaultOnError, Same, VecSkipError};

use capi_model::condition::ConditionEntry;

/// `metadata`, as far as the shim reads it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Meta {
    #[serde(with = "As::<DefaultOnError>")]
    pub name: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub namespace: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub uid: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub resource_version: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub creation_timestamp: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub deletion_timestamp: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub labels: BTreeMap<String, String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub annotations: BTreeMap<String, String>,
    #[serde(with = "As::<DefaultOnError<VecSkipError<Same>>>")]
    pub owner_references: Vec<OwnerRef>,
}

/// An ownerReference: whose it is.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct OwnerRef {
    #[serde(with = "As::<DefaultOnError>")]
    pub kind: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub controller: Option<bool>,
}

/// `Some` only for a non-empty string: an empty name, id or timestamp is no value.
pub fn text(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

impl Meta {
    /// Namespace (an object without one is in `default`) and name; `None` without a name.
    pub fn key(&self) -> Option<(String, String)> {
        Some((
            text(&self.namespace).unwrap_or("default").to_string(),
            text(&self.name)?.to_string(),
        ))
    }

    pub fn deleting(&self) -> bool {
        text(&self.deletion_timestamp).is_some()
    }

    pub fn annotated(&self, key: &str) -> bool {
        self.annotations.contains_key(key)
    }

    /// The value of the label `key`, when the object has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// The kind of the controlling owner, else of the first owner.
    pub fn owner_kind(&self) -> Option<&str> {
        let refs = &self.owner_references;
        refs.iter()
            .find(|r| r.controller == Some(true))
            .or_else(|| refs.first())
            .and_then(|r| text(&r.kind))
    }
}

/// An object reference (`spec.infrastructureRef`, `spec.acsEndpoint`): kind, name, namespace.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Reference {
    #[serde(with = "As::<DefaultOnError>")]
    pub kind: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub name: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub namespace: Option<String>,
}

/// A list of conditions; entries that cannot be read are skipped.
type Conditions = Vec<ConditionEntry>;

/// A CAPI Machine (v1beta1 or v1beta2).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct MachineObject {
    #[serde(deserialize_with = "object_or_default")]
    pub metadata: Meta,
    #[serde(deserialize_with = "object_or_default")]
    pub spec: MachineSpec,
    #[serde(deserialize_with = "object_or_default")]
    pub status: MachineStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MachineSpec {
    #[serde(with = "As::<DefaultOnError>")]
    pub cluster_name: Option<String>,
    #[serde(deserialize_with = "object_or_default")]
    pub infrastructure_ref: Reference,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MachineStatus {
    /// Only whether it is there: a Machine with a `nodeRef` has its Node.
    #[serde(deserialize_with = "present")]
    pub node_ref: bool,
    /// Where v1beta2 keeps every condition and v1beta1 keeps CAPI's v1beta1 ones.
    #[serde(with = "As::<DefaultOnError<VecSkipError<Same>>>")]
    pub conditions: Conditions,
    /// v1beta1's `status.v1beta2.conditions`.
    #[serde(deserialize_with = "object_or_default")]
    pub v1beta2: V1Beta2Status,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct V1Beta2Status {
    #[serde(with = "As::<DefaultOnError<VecSkipError<Same>>>")]
    pub conditions: Conditions,
}

/// A CloudStackMachine (CAPC).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct CloudStackMachineObject {
    #[serde(deserialize_with = "object_or_default")]
    pub metadata: Meta,
    #[serde(deserialize_with = "object_or_default")]
    pub spec: CloudStackMachineSpec,
    #[serde(deserialize_with = "object_or_default")]
    pub status: CloudStackMachineStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CloudStackMachineSpec {
    #[serde(rename = "instanceID", with = "As::<DefaultOnError>")]
    pub instance_id: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub failure_domain_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CloudStackMachineStatus {
    #[serde(with = "As::<DefaultOnError>")]
    pub instance_state: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub instance_state_last_updated: Option<String>,
}

/// A CloudStackFailureDomain (CAPC).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct FailureDomainObject {
    #[serde(deserialize_with = "object_or_default")]
    pub metadata: Meta,
    #[serde(deserialize_with = "object_or_default")]
    pub spec: FailureDomainSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FailureDomainSpec {
    #[serde(with = "As::<DefaultOnError>")]
    pub name: Option<String>,
    #[serde(deserialize_with = "object_or_default")]
    pub acs_endpoint: Reference,
    #[serde(with = "As::<DefaultOnError>")]
    pub project: Option<String>,
    #[serde(deserialize_with = "object_or_default")]
    pub zone: Zone,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Zone {
    #[serde(with = "As::<DefaultOnError>")]
    pub id: Option<String>,
}

/// A CAPI Cluster.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ClusterObject {
    #[serde(deserialize_with = "object_or_default")]
    pub metadata: Meta,
    #[serde(deserialize_with = "object_or_default")]
    pub spec: ClusterSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ClusterSpec {
    /// Only a JSON `true` pauses (`"yes"` does not).
    #[serde(with = "As::<DefaultOnError>")]
    pub paused: bool,
}

/// A CAPI MachineHealthCheck.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct HealthCheckObject {
    #[serde(deserialize_with = "object_or_default")]
    pub metadata: Meta,
    #[serde(deserialize_with = "object_or_default")]
    pub spec: HealthCheckSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HealthCheckSpec {
    #[serde(with = "As::<DefaultOnError>")]
    pub cluster_name: Option<String>,
    /// `None` when missing or not a label selector; kube's `Selector` parses the rest.
    #[serde(with = "As::<DefaultOnError>")]
    pub selector: Option<LabelSelector>,
    /// v1beta1 (CAPI 1.13+): `spec.unhealthyMachineConditions[] {type, status, timeout}`.
    #[serde(with = "As::<DefaultOnError<VecSkipError<Same>>>")]
    pub unhealthy_machine_conditions: Vec<MachineConditionRule>,
    /// v1beta2 (CAPI 1.12+): `spec.checks.unhealthyMachineConditions[] {type, status,
    /// timeoutSeconds}`.
    #[serde(deserialize_with = "object_or_default")]
    pub checks: HealthCheckChecks,
    /// v1beta1: `spec.nodeStartupTimeout`, a Go duration.
    #[serde(with = "As::<DefaultOnError>")]
    pub node_startup_timeout: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HealthCheckChecks {
    #[serde(with = "As::<DefaultOnError<VecSkipError<Same>>>")]
    pub unhealthy_machine_conditions: Vec<MachineConditionRule>,
    /// v1beta2: `spec.checks.nodeStartupTimeoutSeconds`.
    #[serde(with = "As::<DefaultOnError>")]
    pub node_startup_timeout_seconds: Option<i64>,
}

/// One entry of an MHC's `unhealthyMachineConditions`, of either API version.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MachineConditionRule {
    #[serde(rename = "type", with = "As::<DefaultOnError>")]
    pub type_: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub status: Option<String>,
    /// v1beta1: a Go duration (`"60s"`, `"5m"`).
    #[serde(with = "As::<DefaultOnError>")]
    pub timeout: Option<String>,
    /// v1beta2.
    #[serde(with = "As::<DefaultOnError>")]
    pub timeout_seconds: Option<i64>,
}

/// A struct-valued field: read when it is an object, the default for any other shape. Unlike
/// `DefaultOnError` it reads the object in place (no buffered copy of, say, all of
/// `metadata` with its `managedFields`); the structs it reads are tolerant field by field.
fn object_or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    use serde::de::value::MapAccessDeserializer;
    use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
    use std::marker::PhantomData;

    struct ObjectOrDefault<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for ObjectOrDefault<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object (anything else reads as empty)")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(T::default())
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<T, D2::Error> {
            d.deserialize_any(self)
        }
        fn visit_none<E>(self) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_unit<E>(self) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_bool<E>(self, _: bool) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_i64<E>(self, _: i64) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_u64<E>(self, _: u64) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_f64<E>(self, _: f64) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_str<E>(self, _: &str) -> Result<T, E> {
            Ok(T::default())
        }
    }

    d.deserialize_any(ObjectOrDefault(PhantomData))
}

/// Reads whether a field is there at all (and not `null`), whatever it holds.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<serde::de::IgnoredAny>::deserialize(d)?.is_some())
}

/// A view the watches read; its metadata is what the watcher needs to resume.
pub trait View: DeserializeOwned + Clone + Debug + Send + Sync + 'static {
    fn meta(&self) -> &Meta;
}

macro_rules! view {
    ($($object:ty),+) => {$(
        impl View for $object {
            fn meta(&self) -> &Meta {
                &self.metadata
            }
        }
    )+};
}
view!(
    MachineObject,
    CloudStackMachineObject,
    FailureDomainObject,
    ClusterObject,
    HealthCheckObject
);

/// A view as a Kubernetes resource of the kind and version discovery chose (like kube's
/// `DynamicObject`, but holding only the view): what `Api` and the watcher read. Its
/// `ObjectMeta` carries only name, namespace, uid and resourceVersion (the watcher resumes
/// from the resourceVersion).
#[derive(Debug, Clone)]
pub struct Partial<V> {
    metadata: ObjectMeta,
    pub view: V,
}

impl<'de, V: View> Deserialize<'de> for Partial<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let view = V::deserialize(d)?;
        let m = view.meta();
        let metadata = ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            ..ObjectMeta::default()
        };
        Ok(Self { metadata, view })
    }
}

impl<V: View> Resource for Partial<V> {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn odd_shapes_read_as_absent_and_never_fail_the_object() {
        let m: MachineObject = serde_json::from_value(json!({
            "metadata": {"name": "m1", "namespace": 7, "labels": "nonsense",
                "annotations": {"a": ""}, "ownerReferences": [3, {"kind": "MachineSet", "controller": "yes"}],
                "managedFields": [{"manager": "x", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"clusterName": ["c"], "infrastructureRef": {"kind": "CloudStackMachine", "name": 5}},
            "status": {"nodeRef": {}, "conditions": "none",
                "v1beta2": {"conditions": [1, {"type": "A", "status": "True"}]}}
        }))
        .unwrap();
        assert_eq!(m.metadata.key(), Some(("default".into(), "m1".into())));
        assert!(m.metadata.labels.is_empty() && m.metadata.annotated("a"));
        assert_eq!(m.metadata.owner_kind(), Some("MachineSet"));
        assert_eq!(m.spec.cluster_name, None);
        assert_eq!(m.spec.infrastructure_ref.name, None);
        assert!(m.status.node_ref && m.status.conditions.is_empty());
        assert_eq!(m.status.v1beta2.conditions.len(), 1);
        let bare: MachineObject =
            serde_json::from_value(json!({"metadata": "x", "spec": 1, "status": null})).unwrap();
        assert_eq!(bare.metadata.key(), None);
        assert!(!bare.status.node_ref);
    }

    #[test]
    fn a_partial_keeps_what_the_watcher_resumes_from() {
        let p: Partial<ClusterObject> = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "42", "uid": "u"},
            "spec": {"paused": "yes"}
        }))
        .unwrap();
        assert_eq!(p.meta().resource_version.as_deref(), Some("42"));
        assert_eq!(p.meta().name.as_deref(), Some("c"));
        assert!(!p.view.spec.paused, "only a JSON true pauses");
    }
}
