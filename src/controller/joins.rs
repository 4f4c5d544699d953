//! The Machine → target joins, kept between cycles and redone only for what the watches
//! changed: each watch notes the objects it applied or deleted ([`Changed`]), and a cycle joins
//! again only the Machines among them and those whose CloudStackMachine is among them, looking
//! each up in the watch stores (indexes the watch streams maintain). A steady fleet costs a
//! cycle no join at all. A change to the few kinds every Machine is joined against (failure
//! domains, Clusters, MachineHealthChecks) or a relist joins everything again
//! ([`super::targets::build`]), as does the first cycle.
//!
//! Order matters at the edge: a watch applies an event to its store first and notes it after,
//! so a cycle that takes the notes before reading the stores sees every noted change (at worst
//! a change lands one cycle late, like any watch lag), never a note whose object it has not seen.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use kube::runtime::reflector::Lookup;
use kube::runtime::watcher;

use super::targets::{self, csm_name, Joiner, Objects, Target};
use crate::k8s::watched::{
    CloudStackMachineRecord, ClusterRecord, FailureDomainRecord, HealthCheckRecord, MachineRecord,
};

/// An object's (namespace, name).
pub type Key = (String, String);

/// What one watch changed since it was last asked.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changed {
    /// A (re)list replaced the store: everything may have changed.
    pub all: bool,
    /// Objects applied or deleted.
    pub keys: HashSet<Key>,
}

impl Changed {
    /// Notes `event`, after the store has applied it.
    pub fn note<R: Lookup>(&mut self, event: &watcher::Event<R>) {
        match event {
            watcher::Event::Apply(r) | watcher::Event::Delete(r) => {
                let key = (
                    r.namespace().unwrap_or_default().into_owned(),
                    r.name().unwrap_or_default().into_owned(),
                );
                self.keys.insert(key);
            }
            // The store swaps in the relisted objects at InitDone.
            watcher::Event::InitDone => self.all = true,
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.all && self.keys.is_empty()
    }
}

/// What each watch changed since the last cycle.
#[derive(Debug, Default, Clone)]
pub struct ChangedKinds {
    pub machines: Changed,
    pub cloudstack_machines: Changed,
    pub failure_domains: Changed,
    pub clusters: Changed,
    pub health_checks: Changed,
}

/// Where a cycle's records come from: the watch stores, or plain lists in tests.
pub trait Records {
    fn machines(&self) -> Vec<Arc<MachineRecord>>;
    fn machine(&self, namespace: &str, name: &str) -> Option<Arc<MachineRecord>>;
    fn cloudstack_machines(&self) -> Vec<Arc<CloudStackMachineRecord>>;
    fn cloudstack_machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<CloudStackMachineRecord>>;
    fn failure_domains(&self) -> Vec<Arc<FailureDomainRecord>>;
    fn clusters(&self) -> Vec<Arc<ClusterRecord>>;
    fn health_checks(&self) -> Vec<Arc<HealthCheckRecord>>;
}

/// The targets of the last cycle, by Machine, with the CloudStackMachine each was joined to.
#[derive(Default)]
pub struct TargetIndex {
    targets: BTreeMap<Key, Arc<Target>>,
    /// CloudStackMachine → the Machines whose `infrastructureRef` names it.
    machines_of: HashMap<Key, BTreeSet<Key>>,
    /// Machine → the CloudStackMachine it names (to unlink it when that changes).
    csm_of: HashMap<Key, Key>,
    built: bool,
}

impl TargetIndex {
    /// Brings the targets up to date with `changed` and returns them, in Machine order.
    pub fn update(
        &mut self,
        records: &impl Records,
        changed: &ChangedKinds,
        namespaces: &[String],
    ) -> Vec<Arc<Target>> {
        let everything = !self.built
            || changed.machines.all
            || changed.cloudstack_machines.all
            || !changed.failure_domains.is_empty()
            || !changed.clusters.is_empty()
            || !changed.health_checks.is_empty();
        if everything {
            self.rebuild(records, namespaces);
        } else if !changed.machines.is_empty() || !changed.cloudstack_machines.is_empty() {
            let (fds, clusters, checks) = (
                records.failure_domains(),
                records.clusters(),
                records.health_checks(),
            );
            let joiner = Joiner::new(&fds, &clusters, &checks, namespaces);
            let mut dirty: BTreeSet<&Key> = changed.machines.keys.iter().collect();
            let mut via_csm = BTreeSet::new();
            for csm in &changed.cloudstack_machines.keys {
                via_csm.extend(self.machines_of.get(csm).into_iter().flatten().cloned());
            }
            dirty.extend(via_csm.iter());
            for key in dirty {
                self.join(key, records, &joiner);
            }
        }
        self.targets.values().cloned().collect()
    }

    fn rebuild(&mut self, records: &impl Records, namespaces: &[String]) {
        let machines = records.machines();
        let built = targets::build(
            &Objects {
                machines: &machines,
                cloudstack_machines: &records.cloudstack_machines(),
                failure_domains: &records.failure_domains(),
                clusters: &records.clusters(),
                health_checks: &records.health_checks(),
            },
            namespaces,
        );
        *self = Self {
            built: true,
            ..Self::default()
        };
        for t in built {
            let key = (t.machine.namespace.clone(), t.machine.name.clone());
            self.link(&key, t.infrastructure_key());
            self.targets.insert(key, Arc::new(t));
        }
    }

    /// Joins one Machine again (or forgets it, when it is gone or not ours).
    fn join(&mut self, key: &Key, records: &impl Records, joiner: &Joiner<'_>) {
        self.unlink(key);
        self.targets.remove(key);
        let Some(record) = records.machine(&key.0, &key.1) else {
            return;
        };
        let csm = records.cloudstack_machine(&key.0, csm_name(&record));
        if let Some(t) = joiner.target(&record, csm.as_deref()) {
            self.link(key, t.infrastructure_key());
            self.targets.insert(key.clone(), Arc::new(t));
        }
    }

    fn link(&mut self, machine: &Key, csm: Key) {
        self.machines_of
            .entry(csm.clone())
            .or_default()
            .insert(machine.clone());
        self.csm_of.insert(machine.clone(), csm);
    }

    fn unlink(&mut self, machine: &Key) {
        let Some(csm) = self.csm_of.remove(machine) else {
            return;
        };
        if let Some(set) = self.machines_of.get_mut(&csm) {
            set.remove(machine);
            if set.is_empty() {
                self.machines_of.remove(&csm);
            }
        }
    }
}

impl Target {
    /// The CloudStackMachine this target was joined to (or looked for).
    fn infrastructure_key(&self) -> Key {
        (
            self.machine.namespace.clone(),
            self.machine.infrastructure_name.clone().unwrap_or_default(),
        )
    }
}

#[cfg(test)]
mod tests;
