//! Remnants: CloudStack VMs that CAPI lost, found from what the shim already has (the watched
//! CloudStackMachines and each scope's listing — no extra CloudStack call), reported and never
//! deleted. [`OrphanFinder`] is pure; the controller feeds it once per cycle
//! (`controller::orphans`), and [`cmd`] is `capc-health-shim orphans`.
//!
//! What it rests on, from CAPC v0.6.1 (`sigs.k8s.io/cluster-api-provider-cloudstack@v0.6.1`):
//! - A VM is named after its CloudStackMachine and displayed as its Machine
//!   (`pkg/cloud/instance.go` `DeployVM`: `SetName(csMachine.Name)`,
//!   `SetDisplayname(capiMachine.Name)`).
//! - `DeployVM` calls deployVirtualMachine through cloudstack-go's non-waiting client (`c.cs`,
//!   `pkg/cloud/client.go`): the answer carries the VM id while the deploy job runs on. CAPC
//!   puts it in `spec.instanceID` and adds its finalizer (`GetOrCreateVMInstance`,
//!   `controllers/cloudstackmachine_controller.go`) in memory, and both reach the API server
//!   only in the reconcile's deferred patch (`controllers/utils/base_reconciler.go`
//!   `RunBaseReconciliationStages`). A CloudStackMachine deleted between CloudStack creating
//!   the VM and that patch — a slow deploy answer, a patch refused — is gone at once (no
//!   finalizer yet), and the VM runs on (capc#190): a VM named like a CloudStackMachine that no
//!   longer exists.
//! - On delete CAPC destroys the VM (by `instanceID`, or found by name when none was recorded:
//!   `ReconcileDelete`) and removes the finalizer only when the VM is Expunging/Expunged or not
//!   found (`DestroyVMInstance`). So a VM of a CloudStackMachine deleted the normal way is
//!   never left Running; one that is was let go by hand (a finalizer removed).
//! - A deploy call that returned an error makes CAPC look for a half-created VM of that name
//!   and record its id ("incomplete vm deployment", `DeployVM`): a second VM of the same name
//!   is no one's.
//!
//! What keeps it honest (each a test below): a CloudStackMachine still being created (no
//! `instanceID`: CAPC will adopt the VM by name) or being deleted owns its VM; a Destroyed or
//! Expunging VM is no remnant; a scope not listed completely this cycle changes nothing; a
//! CloudStackMachine that clusterctl moved (`delete-for-move`, or its Cluster paused, or its
//! Cluster gone without ever being seen deleting) left nothing behind; and nothing is reported
//! before `grace` has passed since the VM was first seen owned by nothing.

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};

use crate::cloudstack::model::VmState;
use crate::k8s::watched::CloudStackMachineRecord;
use crate::scope::ListedVm;
use crate::status::{OrphanKind, OrphanReport};

pub mod memory;

/// How long a CloudStackMachine is remembered after it disappeared (a VM deployed for it
/// shows up within minutes at most), unless a VM it left behind is still suspect.
pub const MEMORY: SignedDuration = SignedDuration::from_hours(1);

/// One CloudStackMachine as the watch shows it this cycle — its record, shared with the watch
/// store (a cycle copies nothing of the thousands it sees, and what is remembered is the
/// record itself) — and the scope its failure domain is polled through, when that is known.
#[derive(Debug, Clone, Copy)]
pub struct SightingRef<'a> {
    pub machine: &'a Arc<CloudStackMachineRecord>,
    pub scope: Option<&'a str>,
}

/// One Cluster as the watch shows it this cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSighting {
    pub namespace: String,
    pub name: String,
    pub paused: bool,
    pub deleting: bool,
}

/// A scope this cycle: its VMs when it was listed completely now, `None` when it was not
/// (failed, incomplete, backing off) — then what is known of it stays as it was.
#[derive(Debug, Clone, Copy)]
pub struct ScopeListing<'a> {
    pub scope: &'a str,
    pub vms: Option<&'a [ListedVm]>,
}

/// A CloudStackMachine remembered: as last seen, and since when it is gone.
#[derive(Debug, Clone)]
struct Owner {
    last: Arc<CloudStackMachineRecord>,
    /// The scope last known for it (one shared copy per scope: a scope key is long, and
    /// thousands of CloudStackMachines share a few).
    scope: Option<Arc<str>>,
    gone_since: Option<Timestamp>,
}

#[derive(Debug, Clone)]
struct ClusterMemory {
    paused: bool,
    deleting_seen: bool,
    gone_since: Option<Timestamp>,
}

/// What a listed VM is to the CloudStackMachines the shim knows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ownership {
    /// A CloudStackMachine that exists owns it, or will (being created) or is destroying it.
    Owned,
    /// No CloudStackMachine the shim knows of has anything to do with it (or it was moved).
    NotOurs,
    /// Owned by nothing: which CloudStackMachine it belonged to, and how.
    Unowned {
        /// `namespace/name` of the CloudStackMachine.
        owner: String,
        kind: OrphanKind,
        why: String,
    },
}

/// Remembers the CloudStackMachines it has seen and finds the VMs they left behind.
#[derive(Debug, Clone)]
pub struct OrphanFinder {
    grace: SignedDuration,
    /// By `namespace/name`.
    owners: HashMap<String, Owner>,
    clusters: HashMap<(String, String), ClusterMemory>,
    /// The scope keys remembered CloudStackMachines use, one copy each.
    scopes: HashSet<Arc<str>>,
    /// Key rotations: old scope → the scopes its endpoints are polled through since (a scope
    /// key names the key). A VM is named after its CloudStackMachine whatever key listed it, so
    /// one remembered under an old scope is looked for by name under the new ones too.
    successors: HashMap<Arc<str>, Vec<Arc<str>>>,
    /// VM id → what is known of it as an orphan; reported once `grace` has passed.
    suspects: BTreeMap<String, OrphanReport>,
}

impl OrphanFinder {
    pub fn new(grace: SignedDuration) -> Self {
        Self {
            grace,
            owners: HashMap::new(),
            clusters: HashMap::new(),
            scopes: HashSet::new(),
            successors: HashMap::new(),
            suspects: BTreeMap::new(),
        }
    }

    pub fn grace(&self) -> SignedDuration {
        self.grace
    }

    /// The CloudStackMachines remembered (present or gone).
    pub fn remembered(&self) -> usize {
        self.owners.len()
    }

    /// VMs owned by nothing that are not reported yet (within their grace).
    pub fn suspects(&self) -> usize {
        self.suspects
            .values()
            .filter(|s| s.reported_at.is_none())
            .count()
    }

    /// The reported orphans, by VM id.
    pub fn orphans(&self) -> impl Iterator<Item = &OrphanReport> {
        self.suspects.values().filter(|s| s.reported_at.is_some())
    }

    /// Scopes that must go on being listed although no Machine may use them any more: those
    /// of CloudStackMachines that disappeared (and the scopes their keys were rotated to), and
    /// of suspects.
    pub fn scopes_watched(&self) -> BTreeSet<&str> {
        let gone: BTreeSet<&str> = self
            .owners
            .values()
            .filter(|o| o.gone_since.is_some())
            .filter_map(|o| o.scope.as_deref())
            .collect();
        gone.into_iter()
            .flat_map(|s| self.lineage(s))
            .chain(self.suspects.values().map(|s| s.scope.as_str()))
            .collect()
    }

    /// The endpoint polled through scope `old` is now polled through `new`: its key was
    /// rotated. CloudStackMachines remembered under `old` are looked for under `new` too.
    pub fn rotated(&mut self, old: &str, new: &str) {
        if old == new {
            return;
        }
        let new = shared(&mut self.scopes, new);
        let next = self
            .successors
            .entry(shared(&mut self.scopes, old))
            .or_default();
        if !next.contains(&new) {
            next.push(new);
        }
    }

    /// `scope` and every scope its key was rotated to since (a rotation back to an earlier key
    /// ends the walk there).
    fn lineage<'s>(&'s self, scope: &'s str) -> Vec<&'s str> {
        let mut out = vec![scope];
        let mut i = 0;
        while let Some(&s) = out.get(i) {
            for next in self.successors.get(s).into_iter().flatten() {
                if !out.contains(&&**next) {
                    out.push(next);
                }
            }
            i += 1;
        }
        out
    }

    /// One cycle: takes what the watches show now and this cycle's listings; returns the
    /// orphans reported for the first time (each gets its one Event).
    pub fn observe(
        &mut self,
        machines: &[SightingRef<'_>],
        clusters: &[ClusterSighting],
        listings: &[ScopeListing<'_>],
        now: Timestamp,
    ) -> Vec<OrphanReport> {
        self.remember(machines, clusters, now);
        let mut seen: HashMap<&str, (Ownership, &ListedVm, &str)> = HashMap::new();
        {
            let by_id = self.owners_by_id();
            // Only a VM no instance id accounts for is looked up by name: in steady state none.
            let by_name = OnceCell::new();
            for listing in listings {
                for vm in listing.vms.into_iter().flatten() {
                    if matches!(vm.state, VmState::Destroyed | VmState::Expunging) {
                        continue;
                    }
                    let found = self.ownership(vm, listing.scope, &by_id, &by_name);
                    // A VM listed in two scopes (overlapping project listings): owned wins.
                    let keep = match seen.get(vm.id.as_str()) {
                        None => true,
                        Some((prior, ..)) => rank(&found) > rank(prior),
                    };
                    if keep {
                        seen.insert(vm.id.as_str(), (found, vm, listing.scope));
                    }
                }
            }
        }
        let listed_now: BTreeSet<&str> = listings
            .iter()
            .filter(|l| l.vms.is_some())
            .map(|l| l.scope)
            .collect();
        let existing: BTreeSet<&str> = listings.iter().map(|l| l.scope).collect();
        // A suspect of a scope listed completely now stays only if it is still owned by
        // nothing; one of a scope not listed now stays as it was; one of a scope that no longer
        // exists is dropped.
        self.suspects.retain(|id, s| {
            if !existing.contains(s.scope.as_str()) {
                return false;
            }
            !listed_now.contains(s.scope.as_str())
                || matches!(seen.get(id.as_str()), Some((Ownership::Unowned { .. }, ..)))
        });
        let mut newly = Vec::new();
        for (id, (ownership, vm, scope)) in seen {
            let Ownership::Unowned { owner, kind, why } = ownership else {
                continue;
            };
            let cluster = self.owners.get(&owner).and_then(|o| {
                o.last
                    .cluster_name
                    .as_ref()
                    .map(|c| format!("{}/{c}", o.last.namespace))
            });
            let s = self
                .suspects
                .entry(id.to_string())
                .or_insert_with(|| OrphanReport {
                    vm_id: id.to_string(),
                    vm_name: vm.name.clone(),
                    vm_state: String::new(),
                    scope: scope.to_string(),
                    cluster: None,
                    cloudstack_machine: owner.clone(),
                    kind,
                    since: now,
                    reported_at: None,
                    why: String::new(),
                });
            s.vm_state = vm.state.as_str().to_string();
            // Listed now under another key's scope (a rotation): the suspect follows it, and
            // is not dropped when the old scope is retired.
            if s.scope != scope {
                s.scope = scope.to_string();
            }
            s.cluster = cluster;
            s.kind = kind;
            s.why = why;
            if s.reported_at.is_none() && now.duration_since(s.since) >= self.grace {
                s.reported_at = Some(now);
                newly.push(s.clone());
            }
        }
        self.forget(now);
        newly.sort_by(|a, b| a.vm_id.cmp(&b.vm_id));
        newly
    }

    fn remember(
        &mut self,
        machines: &[SightingRef<'_>],
        clusters: &[ClusterSighting],
        now: Timestamp,
    ) {
        // This cycle's by (namespace, name); the remembered ones are updated in place (a record
        // is shared, so most cycles nothing is copied), the rest are new.
        let index: HashMap<(&str, &str), usize> = machines
            .iter()
            .enumerate()
            .map(|(i, m)| ((m.machine.namespace.as_str(), m.machine.name.as_str()), i))
            .collect();
        let mut matched = vec![false; machines.len()];
        for o in self.owners.values_mut() {
            let Some(&i) = index.get(&(o.last.namespace.as_str(), o.last.name.as_str())) else {
                o.gone_since.get_or_insert(now);
                continue;
            };
            matched[i] = true;
            o.gone_since = None;
            let m = machines[i];
            if !Arc::ptr_eq(&o.last, m.machine) {
                o.last = m.machine.clone();
            }
            // A known scope is not forgotten because the failure domain went away first.
            if let Some(scope) = m.scope.filter(|s| o.scope.as_deref() != Some(*s)) {
                o.scope = Some(shared(&mut self.scopes, scope));
            }
        }
        for (m, _) in machines.iter().zip(&matched).filter(|(_, seen)| !**seen) {
            let c = m.machine;
            self.owners.insert(
                format!("{}/{}", c.namespace, c.name),
                Owner {
                    last: c.clone(),
                    scope: m.scope.map(|s| shared(&mut self.scopes, s)),
                    gone_since: None,
                },
            );
        }
        let present: BTreeSet<(&str, &str)> = clusters
            .iter()
            .map(|c| (c.namespace.as_str(), c.name.as_str()))
            .collect();
        for (key, c) in self.clusters.iter_mut() {
            if !present.contains(&(key.0.as_str(), key.1.as_str())) && c.gone_since.is_none() {
                c.gone_since = Some(now);
            }
        }
        for c in clusters {
            let memory = self
                .clusters
                .entry((c.namespace.clone(), c.name.clone()))
                .or_insert(ClusterMemory {
                    paused: false,
                    deleting_seen: false,
                    gone_since: None,
                });
            memory.paused = c.paused;
            memory.deleting_seen |= c.deleting;
            memory.gone_since = None;
        }
    }

    /// Drops CloudStackMachines (and Clusters) gone longer than [`MEMORY`] whose VMs are not
    /// suspect.
    fn forget(&mut self, now: Timestamp) {
        // By (namespace, name), so the check per remembered CloudStackMachine allocates nothing.
        let suspected: BTreeSet<(&str, &str)> = self
            .suspects
            .values()
            .filter_map(|s| s.cloudstack_machine.split_once('/'))
            .collect();
        self.owners.retain(|_, o| {
            o.gone_since.is_none_or(|t| now.duration_since(t) < MEMORY)
                || suspected.contains(&(o.last.namespace.as_str(), o.last.name.as_str()))
        });
        // Rotations no remembered CloudStackMachine's scope leads through any more.
        if !self.successors.is_empty() {
            let held: BTreeSet<&str> = self
                .owners
                .values()
                .filter_map(|o| o.scope.as_deref())
                .collect();
            let reached: HashSet<Arc<str>> = held
                .into_iter()
                .flat_map(|s| self.lineage(s))
                .filter_map(|s| self.scopes.get(s).cloned())
                .collect();
            self.successors.retain(|old, _| reached.contains(old));
        }
        // A scope key no remembered CloudStackMachine (or rotation) holds any more.
        self.scopes.retain(|s| Arc::strong_count(s) > 1);
        let clusters_in_use: BTreeSet<(&str, &str)> = self
            .owners
            .values()
            .filter_map(|o| Some((o.last.namespace.as_str(), o.last.cluster_name.as_deref()?)))
            .collect();
        self.clusters.retain(|(ns, name), c| {
            c.gone_since.is_none_or(|t| now.duration_since(t) < MEMORY)
                || clusters_in_use.contains(&(ns.as_str(), name.as_str()))
        });
    }

    fn owners_by_id(&self) -> HashMap<&str, &Owner> {
        self.owners
            .values()
            .filter_map(|o| Some((o.last.instance_id.as_deref()?, o)))
            .collect()
    }

    fn owners_by_name(&self) -> HashMap<(&str, &str), Vec<&Owner>> {
        let mut by_name: HashMap<(&str, &str), Vec<&Owner>> = HashMap::new();
        // Each scope's lineage once, not once per CloudStackMachine.
        let mut lineages: HashMap<&str, Vec<&str>> = HashMap::new();
        for o in self.owners.values() {
            let Some(scope) = o.scope.as_deref() else {
                continue;
            };
            let lineage = lineages.entry(scope).or_insert_with(|| self.lineage(scope));
            for s in lineage.iter() {
                by_name
                    .entry((s, o.last.name.as_str()))
                    .or_default()
                    .push(o);
            }
        }
        by_name
    }

    /// Whether a gone CloudStackMachine's deletion was a clusterctl move: it carried
    /// `delete-for-move`, or its Cluster is (or was, when last seen) paused — clusterctl pauses
    /// it before moving — or its Cluster vanished without the shim ever seeing it deleting
    /// (a move deletes every source object at once; a real deletion takes the Cluster through
    /// its deletionTimestamp while the Machines go).
    fn moved(&self, o: &Owner) -> bool {
        if o.last.moving {
            return true;
        }
        let Some(cluster) = o.last.cluster_name.as_ref() else {
            return false;
        };
        match self
            .clusters
            .get(&(o.last.namespace.clone(), cluster.clone()))
        {
            Some(c) => c.paused || (c.gone_since.is_some() && !c.deleting_seen),
            None => false,
        }
    }

    fn ownership<'s>(
        &'s self,
        vm: &ListedVm,
        scope: &str,
        by_id: &HashMap<&str, &Owner>,
        by_name: &OnceCell<HashMap<(&'s str, &'s str), Vec<&'s Owner>>>,
    ) -> Ownership {
        let key = |o: &Owner| format!("{}/{}", o.last.namespace, o.last.name);
        let shown = |o: &Owner| format!("{}/{}", o.last.namespace, o.last.name);
        if let Some(o) = by_id.get(vm.id.as_str()) {
            return match o.gone_since {
                None => Ownership::Owned,
                Some(_) if self.moved(o) => Ownership::NotOurs,
                Some(gone) => Ownership::Unowned {
                    owner: key(o),
                    kind: OrphanKind::InstanceOfDeleted,
                    why: format!(
                        "it was the instance of CloudStackMachine {}, which has been gone since \
                         {gone} without CAPC destroying it (a finalizer removed by hand?)",
                        shown(o)
                    ),
                },
            };
        }
        let by_name = by_name.get_or_init(|| self.owners_by_name());
        let Some(named) = by_name.get(&(scope, vm.name.as_str())) else {
            return Ownership::NotOurs;
        };
        let present: Vec<&&Owner> = named.iter().filter(|o| o.gone_since.is_none()).collect();
        // Being created (CAPC adopts the VM by name) or being deleted (CAPC destroys it by name).
        if present
            .iter()
            .any(|o| o.last.instance_id.is_none() || o.last.deleting)
        {
            return Ownership::Owned;
        }
        if let Some(o) = present.first() {
            return Ownership::Unowned {
                owner: key(o),
                kind: OrphanKind::NameTaken,
                why: format!(
                    "it has the name of CloudStackMachine {}, which records another instance ({})",
                    shown(o),
                    o.last.instance_id.as_deref().unwrap_or_default()
                ),
            };
        }
        match named.iter().find(|o| !self.moved(o)) {
            Some(o) => Ownership::Unowned {
                owner: key(o),
                kind: OrphanKind::NameOfDeleted,
                why: match o.last.instance_id.as_deref() {
                    None => format!(
                        "it has the name of CloudStackMachine {}, which was deleted before CAPC \
                         recorded the VM it deployed for it (capc#190)",
                        shown(o)
                    ),
                    Some(other) => format!(
                        "it has the name of CloudStackMachine {}, which was deleted; it had \
                         recorded another instance ({other})",
                        shown(o)
                    ),
                },
            },
            None => Ownership::NotOurs,
        }
    }
}

/// The one copy of scope key `s` in `scopes`.
fn shared(scopes: &mut HashSet<Arc<str>>, s: &str) -> Arc<str> {
    if let Some(known) = scopes.get(s) {
        return known.clone();
    }
    let s: Arc<str> = s.into();
    scopes.insert(s.clone());
    s
}

/// Which of two findings about one VM (listed in two scopes) stands: owned, then unowned.
fn rank(o: &Ownership) -> u8 {
    match o {
        Ownership::Owned => 2,
        Ownership::Unowned { .. } => 1,
        Ownership::NotOurs => 0,
    }
}

#[cfg(test)]
mod tests;
