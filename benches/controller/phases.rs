//! `CAPC_BENCH_CONTROLLER_PART=phases`: in-process timing of the per-Machine pure phases on
//! synthetic objects shaped like the bench's (no API server, no CloudStack), to see which of
//! them grows faster than the fleet: taking the records out of watched objects (once per watch
//! event: the bytes read as a typed partial view, side by side with the way before issue 28 —
//! bytes → `DynamicObject` → a JSON copy → record) and the join (`targets::build`, every cycle).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use capc_health_shim::controller::joins::{ChangedKinds, Records, TargetIndex};
use capc_health_shim::controller::targets::{self, Objects};
use capc_health_shim::k8s::views::{CloudStackMachineObject, MachineObject, Partial};
use capc_health_shim::k8s::watched::{
    CloudStackMachineRecord, ClusterRecord, ConditionReader, FailureDomainRecord,
    HealthCheckRecord, MachineRecord,
};
use capi_model::apis::ConditionLayout;
use kube::api::DynamicObject;
use serde_json::{json, Value};

/// Machines, CloudStackMachines, failure domains, Clusters, MHCs.
type Fleet = (Vec<Value>, Vec<Value>, Vec<Value>, Vec<Value>, Vec<Value>);

fn objects(n: usize) -> Fleet {
    let ns = "bench";
    let mut machines = Vec::with_capacity(n);
    let mut csms = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("m-{i:05}");
        let cluster = format!("c{}", i % 10);
        machines.push(json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
            "metadata": {"name": name, "namespace": ns, "uid": uuid::Uuid::new_v4().to_string(),
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"cluster.x-k8s.io/cluster-name": cluster, "pool": "md-0"},
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet", "name": "ms",
                    "uid": "6a2b7a5e-1a62-4d2f-9d84-0d8c7a1f0b11", "controller": true}]},
            "spec": {"clusterName": cluster, "bootstrap": {"dataSecretName": "bootstrap"},
                "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta3", "kind": "CloudStackMachine", "name": format!("{name}-csm")}},
            "status": {"nodeRef": {"kind": "Node", "name": name}, "phase": "Running",
                "conditions": capi_conditions(),
                "v1beta2": {"conditions": [{"type": "CloudStackVMHealthy", "status": "True", "reason": "VMHealthy",
                "message": "VM vm-0 (10.1.0.10) is Running, NICs attached, guest→host traffic rising",
                "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]}}}));
        machines.last_mut().expect("pushed")["metadata"]["managedFields"] = managed_fields();
        csms.push(json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta3", "kind": "CloudStackMachine",
            "metadata": {"name": format!("{name}-csm"), "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
            "spec": {"offering": {"name": "small"}, "template": {"name": "ubuntu"}, "failureDomainName": "fd1",
                "instanceID": uuid::Uuid::new_v4().to_string()}}));
    }
    let fds = (0..10).map(|c| json!({"metadata": {"name": format!("c{c}-fd1-hash"), "namespace": ns,
        "labels": {"cluster.x-k8s.io/cluster-name": format!("c{c}")}},
        "spec": {"name": "fd1", "zone": {"name": "zone-a", "id": "z"}, "acsEndpoint": {"name": "acs", "namespace": ns}}})).collect();
    let clusters = (0..10)
        .map(|c| json!({"metadata": {"name": format!("c{c}"), "namespace": ns}, "spec": {}}))
        .collect();
    let mhcs = (0..10)
        .map(|c| {
            json!({"metadata": {"name": format!("c{c}-mhc"), "namespace": ns},
        "spec": {"clusterName": format!("c{c}"), "selector": {}}})
        })
        .collect();
    (machines, csms, fds, clusters, mhcs)
}

/// CAPI's v1beta1 conditions on a running Machine (what the watch sends besides ours).
fn capi_conditions() -> Value {
    let types = [
        "Ready",
        "BootstrapReady",
        "InfrastructureReady",
        "NodeHealthy",
        "HealthCheckSucceeded",
        "OwnerRemediated",
    ];
    Value::Array(types.iter().map(|t| json!({"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"})).collect())
}

/// managedFields as the API server sends them with every object: one entry per writer.
fn managed_fields() -> Value {
    let entry = |manager: &str, subresource: &str| {
        json!({"manager": manager, "operation": "Update",
        "apiVersion": "cluster.x-k8s.io/v1beta1", "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
        "subresource": subresource, "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:cluster.x-k8s.io/cluster-name": {}, "f:pool": {}},
            "f:ownerReferences": {".": {}, "k:{\"uid\":\"6a2b7a5e\"}": {}}},
            "f:spec": {".": {}, "f:bootstrap": {".": {}, "f:dataSecretName": {}}, "f:clusterName": {}, "f:infrastructureRef": {}},
            "f:status": {".": {}, "f:conditions": {}, "f:nodeRef": {}, "f:phase": {}}}})
    };
    json!([
        entry("manager", ""),
        entry("manager", "status"),
        entry("capc-health-shim", "status")
    ])
}

fn best_of<R>(rounds: usize, mut f: impl FnMut() -> R) -> f64 {
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64() * 1000.0
        })
        .fold(f64::INFINITY, f64::min)
}

/// The records as the watch stores hold them: lists, and lookups by (namespace, name).
struct Stores<'a> {
    machines: &'a [Arc<MachineRecord>],
    machine_by_key: HashMap<(String, String), Arc<MachineRecord>>,
    csms: &'a [Arc<CloudStackMachineRecord>],
    csm_by_key: HashMap<(String, String), Arc<CloudStackMachineRecord>>,
    fds: &'a [Arc<FailureDomainRecord>],
    clusters: &'a [Arc<ClusterRecord>],
    mhcs: &'a [Arc<HealthCheckRecord>],
}

impl<'a> Stores<'a> {
    fn new(
        machines: &'a [Arc<MachineRecord>],
        csms: &'a [Arc<CloudStackMachineRecord>],
        fds: &'a [Arc<FailureDomainRecord>],
        clusters: &'a [Arc<ClusterRecord>],
        mhcs: &'a [Arc<HealthCheckRecord>],
    ) -> Self {
        Self {
            machine_by_key: machines
                .iter()
                .map(|m| ((m.view.namespace.clone(), m.view.name.clone()), m.clone()))
                .collect(),
            csm_by_key: csms
                .iter()
                .map(|c| ((c.namespace.clone(), c.name.clone()), c.clone()))
                .collect(),
            machines,
            csms,
            fds,
            clusters,
            mhcs,
        }
    }
}

impl Records for Stores<'_> {
    fn machines(&self) -> Vec<Arc<MachineRecord>> {
        self.machines.to_vec()
    }
    fn machine(&self, namespace: &str, name: &str) -> Option<Arc<MachineRecord>> {
        self.machine_by_key
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
    fn cloudstack_machines(&self) -> Vec<Arc<CloudStackMachineRecord>> {
        self.csms.to_vec()
    }
    fn cloudstack_machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<CloudStackMachineRecord>> {
        self.csm_by_key
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
    fn failure_domains(&self) -> Vec<Arc<FailureDomainRecord>> {
        self.fds.to_vec()
    }
    fn clusters(&self) -> Vec<Arc<ClusterRecord>> {
        self.clusters.to_vec()
    }
    fn health_checks(&self) -> Vec<Arc<HealthCheckRecord>> {
        self.mhcs.to_vec()
    }
}

fn records<T>(json: &[Value], read: impl Fn(&Value) -> Option<T>) -> Vec<Arc<T>> {
    json.iter().filter_map(|v| read(v).map(Arc::new)).collect()
}

/// Prints and returns `(n, records ms, build ms)` per size.
pub fn run(sizes: &[usize]) -> Vec<(usize, f64, f64)> {
    let reader = ConditionReader {
        layout: ConditionLayout::V1Beta1WithV1Beta2Conditions,
        condition_type: "CloudStackVMHealthy".into(),
    };
    let mut out = Vec::new();
    for &n in sizes {
        let (machines, csms, fds, clusters, mhcs) = objects(n);
        // What a watch event carries: the object's bytes.
        let bytes = |list: &[Value]| -> Vec<Vec<u8>> {
            list.iter()
                .map(|v| serde_json::to_vec(v).expect("object"))
                .collect()
        };
        let (machine_bytes, csm_bytes) = (bytes(&machines), bytes(&csms));
        let before = best_of(3, || {
            let m = machine_bytes
                .iter()
                .filter_map(|b| serde_json::from_slice::<DynamicObject>(b).ok())
                .filter_map(|o| serde_json::to_value(o).ok())
                .filter_map(|v| MachineRecord::from_json(&v, &reader))
                .count();
            m + csm_bytes
                .iter()
                .filter_map(|b| serde_json::from_slice::<DynamicObject>(b).ok())
                .filter_map(|o| serde_json::to_value(o).ok())
                .filter_map(|v| CloudStackMachineRecord::from_json(&v))
                .count()
        });
        let reading = best_of(3, || {
            let m = machine_bytes
                .iter()
                .filter_map(|b| serde_json::from_slice::<Partial<MachineObject>>(b).ok())
                .filter_map(|o| MachineRecord::from_view(o.view, &reader))
                .count();
            m + csm_bytes
                .iter()
                .filter_map(|b| serde_json::from_slice::<Partial<CloudStackMachineObject>>(b).ok())
                .filter_map(|o| CloudStackMachineRecord::from_view(o.view))
                .count()
        });
        let (machines, csms, fds, clusters, mhcs) = (
            records(&machines, |m| MachineRecord::from_json(m, &reader)),
            records(&csms, CloudStackMachineRecord::from_json),
            records(&fds, FailureDomainRecord::from_json),
            records(&clusters, ClusterRecord::from_json),
            records(&mhcs, HealthCheckRecord::from_json),
        );
        let ns = vec!["bench".to_string()];
        let build = best_of(3, || {
            targets::build(
                &Objects {
                    machines: &machines,
                    cloudstack_machines: &csms,
                    failure_domains: &fds,
                    clusters: &clusters,
                    health_checks: &mhcs,
                },
                &ns,
            )
            .len()
        });
        let stores = Stores::new(&machines, &csms, &fds, &clusters, &mhcs);
        let mut index = TargetIndex::default();
        index.update(&stores, &ChangedKinds::default(), &ns);
        let kept = best_of(3, || {
            index.update(&stores, &ChangedKinds::default(), &ns).len()
        });
        // One Machine in a hundred and its CloudStackMachine changed since the last cycle.
        let mut some = ChangedKinds::default();
        for (m, c) in machines.iter().zip(&csms).step_by(100) {
            some.machines
                .keys
                .insert((m.view.namespace.clone(), m.view.name.clone()));
            some.cloudstack_machines
                .keys
                .insert((c.namespace.clone(), c.name.clone()));
        }
        let some_changed = best_of(3, || index.update(&stores, &some, &ns).len());
        eprintln!(
            "phases: {n} Machines: records from watch bytes {reading:.1} ms as typed views vs {before:.1} ms via DynamicObject + JSON copy (once per watch event); targets per cycle: targets::build {build:.1} ms, kept joins {kept:.2} ms with nothing changed, {some_changed:.2} ms with 1 % of Machines and CloudStackMachines changed"
        );
        out.push((n, reading, build));
    }
    out
}
