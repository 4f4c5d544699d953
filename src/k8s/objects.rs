//! The rules over the foreign objects the shim watches, pure: a Machine's facts (from its
//! tolerant view, [`super::views`]), which MachineHealthChecks cover it (kube's `Selector`,
//! parsed once per watch event), which workload Node is its VM's (NodeNotLinked), and whether a
//! CRD's schema declares a field.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};
use kube::core::SelectorExt;
use serde::Deserialize;
use serde_json::Value;

use capi_model::well_known;

use super::views::{text, MachineObject};
use super::watched::HealthCheckRecord;

/// The Machine annotations the shim's decisions read; the others are not kept (a control-plane
/// Machine carries kubeadm's whole ClusterConfiguration as one, kilobytes per Machine).
const MACHINE_ANNOTATIONS_READ: [&str; 3] = [
    well_known::REMEDIATE_MACHINE,
    well_known::PAUSED,
    well_known::SKIP_REMEDIATION,
];

/// The facts about a Machine the shim's decisions use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineView {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    /// The version of the object this view was read from.
    pub resource_version: Option<String>,
    pub cluster_name: String,
    /// Shared by every Machine with the same labels ([`shared_labels`]).
    pub labels: Arc<BTreeMap<String, String>>,
    /// Only those the shim reads ([`MACHINE_ANNOTATIONS_READ`]).
    pub annotations: BTreeMap<String, String>,
    pub deleting: bool,
    pub has_node_ref: bool,
    /// Kind of the controlling owner (`MachineSet`, `KubeadmControlPlane`, …).
    pub owner_kind: Option<String>,
    /// `spec.infrastructureRef` kind and name.
    pub infrastructure_kind: Option<String>,
    pub infrastructure_name: Option<String>,
    /// A MachineHealthCheck's `HealthCheckSucceeded=False` on it: its reason and message.
    pub health_check_failed: Option<(String, String)>,
}

impl MachineView {
    /// Reads a Machine of any served version; `None` when it lacks a name (not a Machine).
    pub fn from_view(m: &MachineObject) -> Option<Self> {
        let (namespace, name) = m.metadata.key()?;
        let owned = |s: &Option<String>| text(s).map(str::to_string);
        Some(Self {
            namespace,
            name,
            uid: owned(&m.metadata.uid),
            resource_version: owned(&m.metadata.resource_version),
            cluster_name: owned(&m.spec.cluster_name).unwrap_or_default(),
            labels: shared_labels(&m.metadata.labels),
            annotations: m
                .metadata
                .annotations
                .iter()
                .filter(|(k, _)| MACHINE_ANNOTATIONS_READ.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            deleting: m.metadata.deleting(),
            has_node_ref: m.status.node_ref,
            owner_kind: m.metadata.owner_kind().map(str::to_string),
            infrastructure_kind: owned(&m.spec.infrastructure_ref.kind),
            infrastructure_name: owned(&m.spec.infrastructure_ref.name),
            health_check_failed: health_check_failed(m),
        })
    }

    /// [`MachineView::from_view`] of a Machine held as JSON.
    pub fn from_json(m: &Value) -> Option<Self> {
        Self::from_view(&MachineObject::deserialize(m).ok()?)
    }

    pub fn is_cloudstack(&self) -> bool {
        self.infrastructure_kind.as_deref() == Some("CloudStackMachine")
    }

    pub fn is_control_plane(&self) -> bool {
        self.labels.contains_key(well_known::CONTROL_PLANE_LABEL)
    }

    pub fn annotated(&self, key: &str) -> bool {
        self.annotations.contains_key(key)
    }
}

/// The MachineHealthCheck's mark: `HealthCheckSucceeded` at `False`, in the list of either
/// layout (v1beta1's `status.conditions` and `status.v1beta2.conditions`, v1beta2's
/// `status.conditions`).
fn health_check_failed(m: &MachineObject) -> Option<(String, String)> {
    m.status
        .conditions
        .iter()
        .chain(&m.status.v1beta2.conditions)
        .find(|c| {
            c.type_.as_deref() == Some(HEALTH_CHECK_SUCCEEDED)
                && c.status.as_deref() == Some("False")
        })
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// The condition a MachineHealthCheck sets on the Machines it checks (cluster-api v1.9.6
/// api/v1beta1/condition_consts.go; v1.13.5 api/core/v1beta2/machine_types.go).
pub const HEALTH_CHECK_SUCCEEDED: &str = "HealthCheckSucceeded";

/// The one shared copy of a label set. The Machines of a MachineSet or control plane carry the
/// same labels, so 10 000 Machines hold a handful of sets (a map of two labels is a 540-byte
/// node: 5 MB at 10 000 when each Machine kept its own). Sets no Machine holds any more are
/// dropped as the registry grows, so it stays near the number in use.
fn shared_labels(labels: &BTreeMap<String, String>) -> Arc<BTreeMap<String, String>> {
    let mut r = LABEL_SETS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(set) = r.sets.get(labels) {
        return set.clone();
    }
    if r.sets.len() >= r.prune_at {
        r.sets.retain(|set| Arc::strong_count(set) > 1);
        r.prune_at = (r.sets.len() * 2).max(64);
    }
    let set = Arc::new(labels.clone());
    r.sets.insert(set.clone());
    set
}

struct LabelSets {
    sets: HashSet<Arc<BTreeMap<String, String>>>,
    /// The size at which sets no Machine holds are dropped.
    prune_at: usize,
}

static LABEL_SETS: LazyLock<Mutex<LabelSets>> = LazyLock::new(|| {
    Mutex::new(LabelSets {
        sets: HashSet::new(),
        prune_at: 64,
    })
});

/// Whether the MachineHealthCheck `mhc` covers `machine` (same namespace and cluster, selector
/// matches, neither paused).
pub fn mhc_covers(mhc: &HealthCheckRecord, machine: &MachineView) -> bool {
    mhc.namespace == machine.namespace
        && mhc.cluster_name.as_deref() == Some(machine.cluster_name.as_str())
        && !mhc.paused
        && mhc
            .selector
            .as_ref()
            .is_some_and(|s| s.matches(&machine.labels))
}

/// Whether any served version of `crd` declares `field` somewhere under `spec` (at any depth
/// of its properties or list items): a walk over the schema's property names, so a description
/// that merely mentions the field does not count.
pub fn crd_declares_spec_field(crd: &CustomResourceDefinition, field: &str) -> bool {
    fn declares(schema: &JSONSchemaProps, field: &str) -> bool {
        let in_properties = schema
            .properties
            .iter()
            .flatten()
            .any(|(name, child)| name == field || declares(child, field));
        let in_items = match &schema.items {
            Some(JSONSchemaPropsOrArray::Schema(item)) => declares(item, field),
            Some(JSONSchemaPropsOrArray::Schemas(items)) => {
                items.iter().any(|i| declares(i, field))
            }
            None => false,
        };
        in_properties || in_items
    }
    crd.spec
        .versions
        .iter()
        .filter(|v| v.served)
        .filter_map(|v| v.schema.as_ref()?.open_api_v3_schema.as_ref())
        .filter_map(|root| root.properties.as_ref()?.get("spec"))
        .any(|spec| declares(spec, field))
}

/// A Node of the workload cluster that belongs to this Machine's VM although the Machine has
/// no `nodeRef`: same name as the Machine, or an InternalIP equal to one of the VM's addresses.
pub fn matching_node<'a>(
    nodes: &'a [Node],
    machine_name: &str,
    vm_addresses: &[String],
) -> Option<&'a str> {
    nodes.iter().find_map(|n| {
        let name = n.metadata.name.as_deref()?;
        if name == machine_name {
            return Some(name);
        }
        let addresses = n.status.as_ref()?.addresses.as_deref()?;
        addresses
            .iter()
            .filter(|a| a.type_ == "InternalIP")
            .any(|a| vm_addresses.contains(&a.address))
            .then_some(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn machine() -> Value {
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
            "metadata": {"name": "c1-md-0-x", "namespace": "ns1",
                "labels": {"cluster.x-k8s.io/cluster-name": "c1", "nodepool": "md-0"},
                "annotations": {"cluster.x-k8s.io/skip-remediation": "",
                    "controlplane.cluster.x-k8s.io/kubeadm-cluster-configuration": "{\"etcd\":{}}"},
                "ownerReferences": [{"kind": "Cluster", "name": "c1"}, {"kind": "MachineSet", "name": "ms", "controller": true}]},
            "spec": {"clusterName": "c1", "infrastructureRef": {"kind": "CloudStackMachine", "name": "csm-1"}},
            "status": {"phase": "Provisioned", "someFutureField": {"x": 1}}
        })
    }

    #[test]
    fn a_machine_reads_tolerantly() {
        let m = MachineView::from_json(&machine()).unwrap();
        assert_eq!(m.cluster_name, "c1");
        assert_eq!(m.owner_kind.as_deref(), Some("MachineSet"));
        assert!(m.is_cloudstack());
        assert!(!m.is_control_plane());
        assert!(m.annotated(well_known::SKIP_REMEDIATION));
        assert_eq!(
            m.annotations.len(),
            1,
            "only the annotations the shim reads are kept"
        );
        assert!(!m.deleting && !m.has_node_ref);
        assert_eq!(m.infrastructure_name.as_deref(), Some("csm-1"));
        assert!(MachineView::from_json(&json!({"metadata": {}})).is_none());
        assert!(MachineView::from_json(&json!("garbage")).is_none());
    }

    #[test]
    fn machines_with_the_same_labels_share_one_copy_and_unused_sets_are_dropped() {
        let with_labels = |labels: Value| {
            let mut m = machine();
            m["metadata"]["labels"] = labels;
            MachineView::from_json(&m).expect("a view")
        };
        let a = with_labels(json!({"pool": "shared-a"}));
        let b = with_labels(json!({"pool": "shared-a"}));
        let c = with_labels(json!({"pool": "shared-c"}));
        assert!(Arc::ptr_eq(&a.labels, &b.labels));
        assert!(!Arc::ptr_eq(&a.labels, &c.labels));
        assert_eq!(c.labels.get("pool").map(String::as_str), Some("shared-c"));
        // Many sets nobody keeps: the registry does not keep them all.
        for i in 0..1_000 {
            drop(with_labels(json!({ "pool": format!("gone-{i}") })));
        }
        let d = with_labels(json!({"pool": "shared-a"}));
        assert!(Arc::ptr_eq(&a.labels, &d.labels), "a set in use is kept");
        let registered = LABEL_SETS.lock().unwrap().sets.len();
        assert!(
            registered < 300,
            "{registered} label sets kept for a few in use"
        );
        let probe = with_labels(json!({"pool": "probe"}));
        assert_eq!(
            Arc::strong_count(&probe.labels),
            2,
            "the registry's and the view's"
        );
    }

    #[test]
    fn selectors_follow_kubernetes_semantics() {
        let labels: BTreeMap<String, String> = [
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string()),
        ]
        .into();
        let selector_of = |spec: Value| {
            HealthCheckRecord::from_json(&json!({"metadata": {"name": "h"}, "spec": spec}))
                .expect("a record")
                .selector
        };
        let selects = |selector: Value| {
            selector_of(json!({ "selector": selector })).is_some_and(|s| s.matches(&labels))
        };
        assert!(selects(json!({})), "an empty selector selects everything");
        assert!(selects(json!({"matchLabels": {"a": "1"}})));
        assert!(!selects(json!({"matchLabels": {"a": "2"}})));
        assert!(!selects(json!({"matchLabels": {"c": "1"}})));
        let expr = |op: &str, values: Value| json!({"matchExpressions": [{"key": "b", "operator": op, "values": values}]});
        assert!(selects(expr("In", json!(["2", "3"]))));
        assert!(!selects(expr("In", json!(["3"]))));
        assert!(!selects(expr("NotIn", json!(["2"]))));
        assert!(selects(
            json!({"matchExpressions": [{"key": "c", "operator": "NotIn", "values": ["2"]}]})
        ));
        assert!(selects(expr("Exists", json!([]))));
        assert!(!selects(expr("DoesNotExist", json!([]))));
        // Unreadable selectors select nothing.
        assert!(!selects(expr("Bogus", json!([]))));
        assert!(!selects(
            json!({"matchExpressions": [{"key": "b", "operator": "In"}]})
        ));
        assert!(!selects(json!({"matchLabels": "nonsense"})));
        assert!(!selects(Value::Null));
        assert!(!selects(json!("garbage")));
        assert!(
            selector_of(json!({})).is_none(),
            "no selector selects nothing"
        );
    }

    #[test]
    fn mhc_coverage_needs_namespace_cluster_and_selector() {
        let m = MachineView::from_json(&machine()).unwrap();
        let mhc_json = |ns: &str, cluster: &str, sel: Value| json!({"metadata": {"name": "mhc", "namespace": ns}, "spec": {"clusterName": cluster, "selector": sel}});
        let mhc = |ns: &str, cluster: &str, sel: Value| {
            HealthCheckRecord::from_json(&mhc_json(ns, cluster, sel)).unwrap()
        };
        assert!(mhc_covers(
            &mhc("ns1", "c1", json!({"matchLabels": {"nodepool": "md-0"}})),
            &m
        ));
        assert!(!mhc_covers(&mhc("ns2", "c1", json!({})), &m));
        assert!(!mhc_covers(&mhc("ns1", "c2", json!({})), &m));
        assert!(!mhc_covers(
            &mhc("ns1", "c1", json!({"matchLabels": {"nodepool": "md-1"}})),
            &m
        ));
        let mut paused = mhc_json("ns1", "c1", json!({}));
        paused["metadata"]["annotations"] = json!({"cluster.x-k8s.io/paused": ""});
        assert!(!mhc_covers(
            &HealthCheckRecord::from_json(&paused).unwrap(),
            &m
        ));
    }

    #[test]
    fn a_node_matches_by_name_or_internal_ip() {
        let node = |v: Value| -> Node { serde_json::from_value(v).unwrap() };
        let nodes = vec![
            node(
                json!({"metadata": {"name": "other"}, "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.9"}]}}),
            ),
            node(
                json!({"metadata": {"name": "ip-node"}, "status": {"addresses": [
                {"type": "ExternalIP", "address": "10.1.1.12"}, {"type": "InternalIP", "address": "10.1.1.13"}]}}),
            ),
            node(json!({"metadata": {"name": "c1-md-0-x"}})),
        ];
        assert_eq!(matching_node(&nodes, "c1-md-0-x", &[]), Some("c1-md-0-x"));
        assert_eq!(
            matching_node(&nodes, "m", &["10.1.1.13".into()]),
            Some("ip-node")
        );
        assert_eq!(
            matching_node(&nodes, "m", &["10.1.1.12".into()]),
            None,
            "only InternalIP counts"
        );
        assert_eq!(matching_node(&[node(json!({}))], "m", &[]), None);
    }

    #[test]
    fn a_crd_declares_a_field_by_its_schema_not_its_descriptions() {
        let crd = |versions: Value| -> CustomResourceDefinition {
            serde_json::from_value(json!({
                "metadata": {"name": "machinehealthchecks.cluster.x-k8s.io"},
                "spec": {"group": "cluster.x-k8s.io", "scope": "Namespaced",
                    "names": {"kind": "MachineHealthCheck", "plural": "machinehealthchecks"},
                    "versions": versions}
            }))
            .unwrap()
        };
        let version = |name: &str, served: bool, spec: Value| {
            json!({"name": name, "served": served, "storage": served,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}}})
        };
        let field = "unhealthyMachineConditions";
        // v1beta1 keeps it at the top of spec, v1beta2 under spec.checks.
        let top = json!({"type": "object", "properties": {field: {"type": "array"}}});
        let nested = json!({"type": "object", "properties": {"checks": {"type": "object", "properties": {field: {"type": "array"}}}}});
        let in_items = json!({"type": "object", "properties": {"rules": {"type": "array", "items": {"type": "object", "properties": {field: {"type": "string"}}}}}});
        let only_described = json!({"type": "object", "description": format!("see {field}"), "properties": {"unhealthyConditions": {"type": "array", "description": field}}});
        assert!(crd_declares_spec_field(
            &crd(json!([version("v1beta1", true, top)])),
            field
        ));
        assert!(crd_declares_spec_field(
            &crd(json!([version("v1beta2", true, nested.clone())])),
            field
        ));
        assert!(crd_declares_spec_field(
            &crd(json!([version("v1beta2", true, in_items)])),
            field
        ));
        assert!(!crd_declares_spec_field(
            &crd(json!([version("v1beta1", true, only_described.clone())])),
            field
        ));
        assert!(
            !crd_declares_spec_field(
                &crd(json!([
                    version("v1beta2", false, nested),
                    version("v1beta1", true, only_described)
                ])),
                field
            ),
            "a version that is not served does not count"
        );
        assert!(!crd_declares_spec_field(
            &crd(json!([{"name": "v1", "served": true, "storage": true}])),
            field
        ));
    }
}
