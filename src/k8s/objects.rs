//! Reading the foreign objects the shim watches (Machines, MachineHealthChecks, Nodes) as
//! JSON, tolerantly: CAPI and CAPC own these schemas, and a field the shim does not expect must
//! never make a Machine unreadable. Pure functions over `serde_json::Value`.

use std::collections::BTreeMap;

use serde_json::Value;

use capi_model::well_known;

use super::watched::HealthCheckRecord;

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// The facts about a Machine the shim's decisions use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineView {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    /// The version of the object this view was read from.
    pub resource_version: Option<String>,
    pub cluster_name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub deleting: bool,
    pub has_node_ref: bool,
    /// Kind of the controlling owner (`MachineSet`, `KubeadmControlPlane`, …).
    pub owner_kind: Option<String>,
    /// `spec.infrastructureRef` kind and name.
    pub infrastructure_kind: Option<String>,
    pub infrastructure_name: Option<String>,
}

impl MachineView {
    /// Reads a Machine of any served version; `None` when it lacks a name (not a Machine).
    pub fn from_json(m: &Value) -> Option<Self> {
        let name = str_at(m, "/metadata/name")?.to_string();
        let owner_kind = m
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .and_then(|refs| {
                refs.iter()
                    .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
                    .or_else(|| refs.first())
            })
            .and_then(|r| r.get("kind"))
            .and_then(Value::as_str)
            .map(str::to_string);
        Some(Self {
            namespace: str_at(m, "/metadata/namespace")
                .unwrap_or("default")
                .to_string(),
            name,
            uid: str_at(m, "/metadata/uid").map(str::to_string),
            resource_version: str_at(m, "/metadata/resourceVersion").map(str::to_string),
            cluster_name: str_at(m, "/spec/clusterName")
                .unwrap_or_default()
                .to_string(),
            labels: string_map(m.pointer("/metadata/labels")),
            annotations: string_map(m.pointer("/metadata/annotations")),
            deleting: m
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|v| !v.is_null()),
            has_node_ref: m.pointer("/status/nodeRef").is_some_and(|v| !v.is_null()),
            owner_kind,
            infrastructure_kind: str_at(m, "/spec/infrastructureRef/kind").map(str::to_string),
            infrastructure_name: str_at(m, "/spec/infrastructureRef/name").map(str::to_string),
        })
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

/// Whether a label selector (`matchLabels` + `matchExpressions`) selects `labels`.
/// An unreadable selector selects nothing (the safe answer for remediation coverage).
pub fn selector_matches(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    if !selector.is_object() {
        return false;
    }
    if let Some(ml) = selector.get("matchLabels") {
        let Some(ml) = ml.as_object() else {
            return false;
        };
        for (k, v) in ml {
            if labels.get(k).map(String::as_str) != v.as_str() {
                return false;
            }
        }
    }
    if let Some(exprs) = selector.get("matchExpressions") {
        let Some(exprs) = exprs.as_array() else {
            return false;
        };
        for e in exprs {
            let (Some(key), Some(op)) = (
                e.get("key").and_then(Value::as_str),
                e.get("operator").and_then(Value::as_str),
            ) else {
                return false;
            };
            let values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let have = labels.get(key).map(String::as_str);
            let ok = match op {
                "In" => have.is_some_and(|h| values.contains(&h)),
                "NotIn" => have.is_none_or(|h| !values.contains(&h)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            };
            if !ok {
                return false;
            }
        }
    }
    true
}

/// Whether the MachineHealthCheck `mhc` covers `machine` (same namespace and cluster, selector
/// matches, neither paused).
pub fn mhc_covers(mhc: &HealthCheckRecord, machine: &MachineView) -> bool {
    mhc.namespace == machine.namespace
        && mhc.cluster_name.as_deref() == Some(machine.cluster_name.as_str())
        && !mhc.paused
        && selector_matches(&mhc.selector, &machine.labels)
}

/// A Node of the workload cluster that belongs to this Machine's VM although the Machine has
/// no `nodeRef`: same name as the Machine, or an InternalIP equal to one of the VM's addresses.
pub fn matching_node<'a>(
    nodes: &'a [Value],
    machine_name: &str,
    vm_addresses: &[String],
) -> Option<&'a str> {
    nodes.iter().find_map(|n| {
        let name = str_at(n, "/metadata/name")?;
        if name == machine_name {
            return Some(name);
        }
        let addresses = n.pointer("/status/addresses").and_then(Value::as_array)?;
        addresses
            .iter()
            .filter(|a| a.get("type").and_then(Value::as_str) == Some("InternalIP"))
            .filter_map(|a| a.get("address").and_then(Value::as_str))
            .any(|ip| vm_addresses.iter().any(|v| v == ip))
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
                "annotations": {"cluster.x-k8s.io/skip-remediation": ""},
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
        assert!(!m.deleting && !m.has_node_ref);
        assert_eq!(m.infrastructure_name.as_deref(), Some("csm-1"));
        assert!(MachineView::from_json(&json!({"metadata": {}})).is_none());
        assert!(MachineView::from_json(&json!("garbage")).is_none());
    }

    #[test]
    fn selectors_follow_kubernetes_semantics() {
        let labels: BTreeMap<String, String> = [
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string()),
        ]
        .into();
        assert!(selector_matches(&json!({}), &labels));
        assert!(selector_matches(
            &json!({"matchLabels": {"a": "1"}}),
            &labels
        ));
        assert!(!selector_matches(
            &json!({"matchLabels": {"a": "2"}}),
            &labels
        ));
        let expr = |op: &str, values: Value| json!({"matchExpressions": [{"key": "b", "operator": op, "values": values}]});
        assert!(selector_matches(&expr("In", json!(["2", "3"])), &labels));
        assert!(!selector_matches(&expr("NotIn", json!(["2"])), &labels));
        assert!(selector_matches(&expr("Exists", json!([])), &labels));
        assert!(!selector_matches(&expr("DoesNotExist", json!([])), &labels));
        assert!(!selector_matches(&expr("Bogus", json!([])), &labels));
        assert!(!selector_matches(
            &json!({"matchLabels": "nonsense"}),
            &labels
        ));
        assert!(!selector_matches(&Value::Null, &labels));
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
        let nodes = vec![
            json!({"metadata": {"name": "other"}, "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.9"}]}}),
            json!({"metadata": {"name": "ip-node"}, "status": {"addresses": [
                {"type": "ExternalIP", "address": "10.1.1.12"}, {"type": "InternalIP", "address": "10.1.1.13"}]}}),
            json!({"metadata": {"name": "c1-md-0-x"}}),
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
        assert_eq!(matching_node(&[json!(42)], "m", &[]), None);
    }
}
