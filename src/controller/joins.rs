//! The Machine → target joins, kept between cycles and redone only for what the watches
//! changed: each watch notes the objects it applied or deleted ([`Changed`]), and a cycle joins
//! again only the Machines among them and those whose CloudStackMachine is among them, looking
//! each up in the watch stores (indexes the watch streams maintain). A steady fleet costs a
//! cycle no join at all. A change to the few kinds every Machine is joined against (failure
//! domains, Clusters, MachineHealthChecks), a relist or more changes than are noted by name
//! ([`NOTED_KEYS_MAX`]) joins everything again ([`super::targets::build`]), as does the first
//! cycle.
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

/// At most this many objects are noted by name between two cycles; past it the notes say
/// "everything changed". Only the leader takes the notes: a follower's would otherwise keep
/// the name of every object it ever saw, for as long as it follows. Joining everything again
/// costs a leader about what joining this many Machines one by one does.
pub const NOTED_KEYS_MAX: usize = 4096;

/// What one watch changed since it was last asked.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changed {
    /// A (re)list replaced the store, or more objects changed than are noted by name:
    /// everything may have changed.
    pub all: bool,
    /// Objects applied or deleted (empty when `all`: everything is joined again anyway).
    pub keys: HashSet<Key>,
}

impl Changed {
    /// Notes `event`, after the store has applied it.
    pub fn note<R: Lookup>(&mut self, event: &watcher::Event<R>) {
        match event {
            watcher::Event::Apply(r) | watcher::Event::Delete(r) => {
                if self.all {
                    return;
                }
                let key = (
                    r.namespace().unwrap_or_default().into_owned(),
                    r.name().unwrap_or_default().into_owned(),
                );
                self.keys.insert(key);
                if self.keys.len() > NOTED_KEYS_MAX {
                    self.everything();
                }
            }
            // The store swaps in the relisted objects at InitDone.
            watcher::Event::InitDone => self.everything(),
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    fn everything(&mut self) {
        self.all = true;
        self.keys = HashSet::new();
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

/// Every Machine joined from `records`, as the first cycle (or a relist) does it.
pub fn whole_join(records: &impl Records, namespaces: &[String]) -> Vec<Target> {
    targets::build(
        &Objects {
            machines: &records.machines(),
            cloudstack_machines: &records.cloudstack_machines(),
            failure_domains: &records.failure_domains(),
            clusters: &records.clusters(),
            health_checks: &records.health_checks(),
        },
        namespaces,
    )
}

/// The targets of the last cycle, by Machine, and which Machines each CloudStackMachine
/// feeds. Keys are `namespace/name` ('/' is in neither part): one allocation each, as this is
/// kept for every Machine.
#[derive(Default)]
pub struct TargetIndex {
    targets: BTreeMap<Box<str>, Arc<Target>>,
    /// A CloudStackMachine → the Machines whose `infrastructureRef` names it (one, unless
    /// several Machines name the same object).
    machines_of: HashMap<Box<str>, Vec<Box<str>>>,
    built: bool,
}

fn joined(namespace: &str, name: &str) -> Box<str> {
    format!("{namespace}/{name}").into_boxed_str()
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
            let mut dirty: BTreeSet<Box<str>> = changed
                .machines
                .keys
                .iter()
                .map(|(ns, name)| joined(ns, name))
                .collect();
            for (ns, name) in &changed.cloudstack_machines.keys {
                if let Some(machines) = self.machines_of.get(&joined(ns, name)) {
                    dirty.extend(machines.iter().cloned());
                }
            }
            for key in dirty {
                self.join(key, records, &joiner);
            }
        }
        self.targets.values().cloned().collect()
    }

    fn rebuild(&mut self, records: &impl Records, namespaces: &[String]) {
        *self = Self {
            built: true,
            ..Self::default()
        };
        for t in whole_join(records, namespaces) {
            self.insert(joined(&t.machine.namespace, &t.machine.name), t);
        }
    }

    /// Joins one Machine again (or forgets it, when it is gone or not ours).
    fn join(&mut self, key: Box<str>, records: &impl Records, joiner: &Joiner<'_>) {
        self.forget(&key);
        let Some((namespace, name)) = key.split_once('/') else {
            return;
        };
        let Some(record) = records.machine(namespace, name) else {
            return;
        };
        let csm = records.cloudstack_machine(namespace, csm_name(&record));
        if let Some(t) = joiner.target(&record, csm.as_ref()) {
            self.insert(key, t);
        }
    }

    fn insert(&mut self, key: Box<str>, t: Target) {
        let feeds = self.machines_of.entry(t.csm_key()).or_default();
        if !feeds.contains(&key) {
            feeds.push(key.clone());
        }
        self.targets.insert(key, Arc::new(t));
    }

    fn forget(&mut self, key: &str) {
        let Some(old) = self.targets.remove(key) else {
            return;
        };
        let csm = old.csm_key();
        if let Some(feeds) = self.machines_of.get_mut(&csm) {
            feeds.retain(|m| &**m != key);
            if feeds.is_empty() {
                self.machines_of.remove(&csm);
            }
        }
    }
}

impl Target {
    /// The CloudStackMachine this target was joined to (or looked for), as an index key.
    fn csm_key(&self) -> Box<str> {
        joined(
            &self.machine.namespace,
            self.machine
                .infrastructure_name
                .as_deref()
                .unwrap_or_default(),
        )
    }
}

#[cfg(test)]
mod tests;
