//! The kept joins equal the whole join after any sequence of watch changes, and a cycle
//! without changes joins nothing again.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::k8s::watched::ConditionReader;
use capi_model::apis::ConditionLayout;

/// The stores of one namespace, changed the way a watch changes them: the store first, then
/// the note.
#[derive(Default)]
struct Lists {
    machines: BTreeMap<Key, Arc<MachineRecord>>,
    csms: BTreeMap<Key, Arc<CloudStackMachineRecord>>,
    fds: BTreeMap<Key, Arc<FailureDomainRecord>>,
    clusters: BTreeMap<Key, Arc<ClusterRecord>>,
    checks: BTreeMap<Key, Arc<HealthCheckRecord>>,
    changed: ChangedKinds,
}

fn key(name: &str) -> Key {
    ("ns".to_string(), name.to_string())
}

fn reader() -> ConditionReader {
    ConditionReader {
        layout: ConditionLayout::V1Beta1WithV1Beta2Conditions,
        condition_type: "CloudStackVMHealthy".into(),
    }
}

fn machine(name: &str, csm: &str, cluster: &str, condition: Option<&str>) -> Value {
    let mut v = json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "resourceVersion": "1", "creationTimestamp": "2026-11-30T00:00:00Z",
            "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
           "spec": {"clusterName": cluster, "infrastructureRef": {"kind": "CloudStackMachine", "name": csm}}});
    if let Some(status) = condition {
        v["status"] = json!({"conditions": [{"type": "CloudStackVMHealthy", "status": status,
            "reason": "VMHealthy", "message": "m", "lastTransitionTime": "2026-11-30T00:10:00Z"}]});
    }
    v
}

fn csm(name: &str, id: Option<&str>, fd: &str) -> Value {
    let mut v = json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"failureDomainName": fd},
                       "status": {"instanceState": "Running"}});
    if let Some(id) = id {
        v["spec"]["instanceID"] = json!(id);
    }
    v
}

fn fd(object: &str, cluster: &str, secret: &str) -> Value {
    json!({"metadata": {"name": object, "namespace": "ns", "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
           "spec": {"name": "fd1", "zone": {"name": "z", "id": "zone-1"},
                    "acsEndpoint": {"name": secret, "namespace": "capc-system"}}})
}

impl Records for Lists {
    fn machines(&self) -> Vec<Arc<MachineRecord>> {
        self.machines.values().cloned().collect()
    }
    fn machine(&self, namespace: &str, name: &str) -> Option<Arc<MachineRecord>> {
        self.machines.get(&(namespace.into(), name.into())).cloned()
    }
    fn cloudstack_machines(&self) -> Vec<Arc<CloudStackMachineRecord>> {
        self.csms.values().cloned().collect()
    }
    fn cloudstack_machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<CloudStackMachineRecord>> {
        self.csms.get(&(namespace.into(), name.into())).cloned()
    }
    fn failure_domains(&self) -> Vec<Arc<FailureDomainRecord>> {
        self.fds.values().cloned().collect()
    }
    fn clusters(&self) -> Vec<Arc<ClusterRecord>> {
        self.clusters.values().cloned().collect()
    }
    fn health_checks(&self) -> Vec<Arc<HealthCheckRecord>> {
        self.checks.values().cloned().collect()
    }
}

/// Sets (`Some`) or deletes (`None`) one object and notes it, as a watch does.
fn put<R: Lookup<DynamicType = ()> + Clone>(
    store: &mut BTreeMap<Key, Arc<R>>,
    changed: &mut Changed,
    name: &str,
    record: Option<R>,
) {
    let event = match record {
        Some(r) => {
            store.insert(key(name), Arc::new(r.clone()));
            watcher::Event::Apply(r)
        }
        None => match store.remove(&key(name)) {
            Some(old) => watcher::Event::Delete((*old).clone()),
            None => return,
        },
    };
    changed.note(&event);
}

/// One watch change of the generated sequence.
#[derive(Debug, Clone)]
enum Op {
    Machine {
        i: u8,
        csm: u8,
        cluster: u8,
        condition: Option<bool>,
    },
    DeleteMachine(u8),
    Csm {
        j: u8,
        id: Option<u8>,
        fd: bool,
    },
    DeleteCsm(u8),
    FailureDomain {
        cluster: u8,
        secret: u8,
    },
    Paused {
        cluster: u8,
        paused: bool,
    },
    HealthCheck {
        cluster: u8,
    },
    Relist,
    Cycle,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..8, 0u8..8, 0u8..2, proptest::option::of(any::<bool>()))
            .prop_map(|(i, csm, cluster, condition)| Op::Machine { i, csm, cluster, condition }),
        2 => (0u8..8).prop_map(Op::DeleteMachine),
        6 => (0u8..8, proptest::option::of(0u8..4), any::<bool>())
            .prop_map(|(j, id, fd)| Op::Csm { j, id, fd }),
        2 => (0u8..8).prop_map(Op::DeleteCsm),
        1 => (0u8..2, 0u8..2).prop_map(|(cluster, secret)| Op::FailureDomain { cluster, secret }),
        1 => (0u8..2, any::<bool>()).prop_map(|(cluster, paused)| Op::Paused { cluster, paused }),
        1 => (0u8..2).prop_map(|cluster| Op::HealthCheck { cluster }),
        1 => Just(Op::Relist),
        4 => Just(Op::Cycle),
    ]
}

impl Lists {
    fn apply(&mut self, op: &Op) {
        let c = &mut self.changed;
        match op {
            Op::Machine {
                i,
                csm,
                cluster,
                condition,
            } => {
                let status = condition.map(|ok| if ok { "True" } else { "False" });
                let v = machine(
                    &format!("m{i}"),
                    &format!("c{csm}"),
                    &format!("k{cluster}"),
                    status,
                );
                let record = MachineRecord::from_json(&v, &reader());
                put(
                    &mut self.machines,
                    &mut c.machines,
                    &format!("m{i}"),
                    record,
                );
            }
            Op::DeleteMachine(i) => {
                put::<MachineRecord>(&mut self.machines, &mut c.machines, &format!("m{i}"), None)
            }
            Op::Csm { j, id, fd } => {
                let id = id.map(|n| format!("vm-{n}"));
                let fd = if *fd { "fd1" } else { "nowhere" };
                let record =
                    CloudStackMachineRecord::from_json(&csm(&format!("c{j}"), id.as_deref(), fd));
                put(
                    &mut self.csms,
                    &mut c.cloudstack_machines,
                    &format!("c{j}"),
                    record,
                );
            }
            Op::DeleteCsm(j) => put::<CloudStackMachineRecord>(
                &mut self.csms,
                &mut c.cloudstack_machines,
                &format!("c{j}"),
                None,
            ),
            Op::FailureDomain { cluster, secret } => {
                let name = format!("fd-k{cluster}");
                let v = fd(&name, &format!("k{cluster}"), &format!("s{secret}"));
                put(
                    &mut self.fds,
                    &mut c.failure_domains,
                    &name,
                    FailureDomainRecord::from_json(&v),
                );
            }
            Op::Paused { cluster, paused } => {
                let name = format!("k{cluster}");
                let v = json!({"metadata": {"namespace": "ns", "name": name}, "spec": {"paused": paused}});
                put(
                    &mut self.clusters,
                    &mut c.clusters,
                    &name,
                    ClusterRecord::from_json(&v),
                );
            }
            Op::HealthCheck { cluster } => {
                let name = format!("mhc-k{cluster}");
                let v = json!({"metadata": {"namespace": "ns", "name": name},
                               "spec": {"clusterName": format!("k{cluster}"), "selector": {}}});
                put(
                    &mut self.checks,
                    &mut c.health_checks,
                    &name,
                    HealthCheckRecord::from_json(&v),
                );
            }
            Op::Relist => c.machines.all = true,
            Op::Cycle => {}
        }
    }

    fn take_changes(&mut self) -> ChangedKinds {
        std::mem::take(&mut self.changed)
    }

    /// The whole join, as the first cycle makes it.
    fn joined_whole(&self) -> Vec<String> {
        let targets = whole_join(self, &[]);
        let mut out: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
        out.sort();
        out
    }
}

fn shown(targets: &[Arc<Target>]) -> Vec<String> {
    let mut out: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
    out.sort();
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// After any sequence of watch changes, the targets kept and joined again per change are
    /// the targets the whole join gives.
    #[test]
    fn kept_joins_equal_the_whole_join(ops in proptest::collection::vec(op(), 1..60)) {
        let mut lists = Lists::default();
        let mut index = TargetIndex::default();
        for op in &ops {
            lists.apply(op);
            if matches!(op, Op::Cycle) {
                let kept = cycle(&mut index, &mut lists);
                prop_assert_eq!(shown(&kept), lists.joined_whole());
            }
        }
        let kept = cycle(&mut index, &mut lists);
        prop_assert_eq!(shown(&kept), lists.joined_whole());
    }
}

fn cycle(index: &mut TargetIndex, lists: &mut Lists) -> Vec<Arc<Target>> {
    let changed = lists.take_changes();
    index.update(lists, &changed, &[])
}

/// The point of keeping them: with nothing changed, a cycle gets the very targets of the last
/// one (not joined again); a changed CloudStackMachine rejoins only its Machine.
#[test]
fn only_what_changed_is_joined_again() {
    let mut lists = Lists::default();
    lists.apply(&Op::FailureDomain {
        cluster: 0,
        secret: 0,
    });
    for i in 0..3 {
        lists.apply(&Op::Csm {
            j: i,
            id: Some(i),
            fd: true,
        });
        lists.apply(&Op::Machine {
            i,
            csm: i,
            cluster: 0,
            condition: Some(true),
        });
    }
    let mut index = TargetIndex::default();
    let first = cycle(&mut index, &mut lists);
    assert_eq!(first.len(), 3);
    let same = cycle(&mut index, &mut lists);
    assert!(first.iter().zip(&same).all(|(a, b)| Arc::ptr_eq(a, b)));

    lists.apply(&Op::Csm {
        j: 1,
        id: None,
        fd: true,
    });
    let next = cycle(&mut index, &mut lists);
    let rejoined: Vec<bool> = first
        .iter()
        .zip(&next)
        .map(|(a, b)| !Arc::ptr_eq(a, b))
        .collect();
    assert_eq!(rejoined, [false, true, false]);
    assert_eq!(next[1].instance_id(), None);
    assert!(matches!(
        next[1].problem,
        Some(targets::TargetProblem::NoInstanceId)
    ));

    // A failure domain change joins every Machine again.
    lists.apply(&Op::FailureDomain {
        cluster: 0,
        secret: 1,
    });
    let all = cycle(&mut index, &mut lists);
    assert!(next.iter().zip(&all).all(|(a, b)| !Arc::ptr_eq(a, b)));
    assert_eq!(
        all[0].endpoint.as_ref().map(|e| e.secret_name.as_str()),
        Some("s1")
    );
}

#[test]
fn a_relist_is_noted_as_everything() {
    let mut c = Changed::default();
    c.note::<ClusterRecord>(&watcher::Event::Init);
    assert!(c.is_empty());
    c.note::<ClusterRecord>(&watcher::Event::InitDone);
    assert!(c.all && !c.is_empty());
}

/// A follower's notes (nobody takes them) stay bounded while Machines come and go under ever
/// new names — before, they kept every name — and the leader it becomes, with targets built
/// while it led before, joins everything it missed.
#[test]
fn unread_notes_stay_bounded_and_a_leader_taking_over_joins_everything() {
    let mut lists = Lists::default();
    lists.apply(&Op::FailureDomain {
        cluster: 0,
        secret: 0,
    });
    for i in 0..2 {
        lists.apply(&Op::Csm {
            j: i,
            id: Some(i),
            fd: true,
        });
        lists.apply(&Op::Machine {
            i,
            csm: i,
            cluster: 0,
            condition: Some(true),
        });
    }
    let mut index = TargetIndex::default();
    assert_eq!(cycle(&mut index, &mut lists).len(), 2, "led once");

    // Following: Machines created and deleted under new names, m0 deleted, m1's
    // CloudStackMachine loses its VM id; nobody takes the notes.
    let mut most = 0;
    for n in 0..3 * NOTED_KEYS_MAX {
        let name = format!("churn{n}");
        let record = MachineRecord::from_json(&machine(&name, "c0", "k0", None), &reader());
        put(
            &mut lists.machines,
            &mut lists.changed.machines,
            &name,
            record,
        );
        if n % 100 != 0 {
            put::<MachineRecord>(
                &mut lists.machines,
                &mut lists.changed.machines,
                &name,
                None,
            );
        }
        most = most.max(lists.changed.machines.keys.len());
    }
    lists.apply(&Op::DeleteMachine(0));
    lists.apply(&Op::Csm {
        j: 1,
        id: None,
        fd: true,
    });
    assert!(most <= NOTED_KEYS_MAX, "{most} names noted while following");
    assert!(lists.changed.machines.all && lists.changed.machines.keys.is_empty());

    let kept = cycle(&mut index, &mut lists);
    assert_eq!(shown(&kept), lists.joined_whole());
    let names: Vec<&str> = kept.iter().map(|t| t.machine.name.as_str()).collect();
    assert_eq!(
        names.len(),
        1 + (3 * NOTED_KEYS_MAX).div_ceil(100),
        "m1 and the churn kept"
    );
    assert!(!names.contains(&"m0"), "the deleted Machine is gone");
    let m1 = kept.iter().find(|t| t.machine.name == "m1").expect("m1");
    assert_eq!(
        m1.instance_id(),
        None,
        "m1 joined to its changed CloudStackMachine"
    );

    // Leading: a small change is noted by name again.
    lists.apply(&Op::Machine {
        i: 1,
        csm: 1,
        cluster: 0,
        condition: Some(false),
    });
    assert!(!lists.changed.machines.all && lists.changed.machines.keys.len() == 1);
    assert_eq!(shown(&cycle(&mut index, &mut lists)), lists.joined_whole());
}
