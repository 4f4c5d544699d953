//! Management-side remnants (issue 29): objects of a CAPC cluster that a deletion left behind
//! or that something still holds — pure detection over the objects' metadata; nothing here
//! talks to the API server, and nothing is ever deleted or patched (the operator gets the
//! commands, [`commands`]).
//!
//! - **Stuck deleting**: a `deletionTimestamp` older than the grace with finalizers still on
//!   it; why, where it can be told: the child objects still present, the Cluster paused, what
//!   CloudStack says of a CloudStackMachine's VM (its state, the last failed destroy).
//! - **Dangling**: the controller owner (an `ownerReference` with `controller: true`) of a
//!   watched kind is gone, or the `cluster.x-k8s.io/cluster-name` label names a Cluster that
//!   does not exist, for longer than the grace since the finder first saw it so.
//!
//! Not remnants (each a test): an object within the grace (being created: CAPI sets owners
//! after creation; or the garbage collector still working through a foreground deletion);
//! `clusterctl move` (the source objects carry `delete-for-move`, the Cluster is paused while
//! its objects are copied); an owner of a kind the shim does not watch (it cannot see it, so
//! it does not call it gone).
//!
//! Finalizer names, from the sources: CAPC v0.6.1 `api/v1beta3/*_types.go`, CAPI v1.9.6
//! `api/v1beta1` and `controlplane/kubeadm/api/v1beta1`.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};

/// The default of `--remnant-grace`.
pub const DEFAULT_GRACE: SignedDuration = SignedDuration::from_mins(15);

/// An object's uid, compact: Kubernetes uids are UUIDs (anything else is hashed).
pub type Uid = u128;

/// The [`Uid`] of a uid string.
pub fn uid_of(s: &str) -> Uid {
    if let Ok(u) = uuid::Uuid::parse_str(s.trim()) {
        return u.as_u128();
    }
    use std::hash::{Hash, Hasher};
    let half = |seed: u8| {
        let mut h = std::hash::DefaultHasher::new();
        (seed, s).hash(&mut h);
        h.finish() as u128
    };
    (half(0) << 64) | half(1)
}

/// One object as its metadata-only watch shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRecord {
    /// API group, e.g. `cluster.x-k8s.io` (for the commands); one copy per kind, shared.
    pub group: Arc<str>,
    pub kind: Arc<str>,
    pub namespace: String,
    pub name: String,
    pub uid: Uid,
    pub deleting_since: Option<Timestamp>,
    pub finalizers: Vec<String>,
    /// The `ownerReference` with `controller: true`.
    pub controller: Option<OwnerRef>,
    /// The `cluster.x-k8s.io/cluster-name` label.
    pub cluster: Option<String>,
    /// A Cluster's `spec.paused`, or the `cluster.x-k8s.io/paused` annotation on any object.
    pub paused: bool,
    /// clusterctl marked it `delete-for-move`.
    pub moving: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRef {
    pub kind: String,
    pub name: String,
    pub uid: Uid,
}

/// What CloudStack says of the VM of a CloudStackMachine (from the scope's listing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmFacts {
    pub vm_id: String,
    /// `None`: a complete listing no longer shows it.
    pub state: Option<String>,
    /// The last failed call on it (a destroy job's error), when known.
    pub last_error: Option<String>,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum RemnantReason {
    StuckDeleting,
    OwnerGone,
    ClusterGone,
}

impl RemnantReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StuckDeleting => "stuck-deleting",
            Self::OwnerGone => "owner-gone",
            Self::ClusterGone => "cluster-gone",
        }
    }
}

/// One object left behind (a `/status` `remnants[]` entry).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Remnant {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// `namespace/name` of its Cluster, from its label (or itself, for a Cluster).
    pub cluster: Option<String>,
    /// Since when it is what it is: its deletionTimestamp, or when the finder first saw its
    /// owner or Cluster missing.
    pub since: Timestamp,
    pub reason: RemnantReason,
    pub why: String,
    pub blocking_finalizers: Vec<String>,
    /// The CloudStack VM of a CloudStackMachine.
    #[serde(default)]
    pub related_vm: Option<String>,
}

/// Finds remnants cycle by cycle; remembers since when each dangling object has been seen so.
#[derive(Debug, Clone)]
pub struct RemnantFinder {
    grace: SignedDuration,
    /// (uid, reason) → first seen dangling.
    dangling_since: HashMap<(Uid, RemnantReason), Timestamp>,
}

/// Child objects named in a reason, at most.
const NAMED: usize = 3;

impl RemnantFinder {
    pub fn new(grace: SignedDuration) -> Self {
        Self {
            grace,
            dangling_since: HashMap::new(),
        }
    }

    /// How long an object must be stuck or dangling before it is reported.
    pub fn grace(&self) -> SignedDuration {
        self.grace
    }

    /// Objects seen dangling and still within the grace.
    pub fn suspects(&self) -> usize {
        self.dangling_since.len()
    }

    /// One cycle over every object the watches show now. `watched`: the kinds watched (an
    /// owner of another kind is never called gone); `vms`: CloudStack's facts of a
    /// CloudStackMachine's VM by the CloudStackMachine's `namespace/name`.
    pub fn observe<O: Borrow<ObjectRecord>>(
        &mut self,
        objects: &[O],
        watched: &HashSet<&str>,
        vms: &HashMap<String, VmFacts>,
        now: Timestamp,
    ) -> Vec<Remnant> {
        let objects: Vec<&ObjectRecord> = objects.iter().map(Borrow::borrow).collect();
        let present: HashSet<Uid> = objects.iter().map(|o| o.uid).collect();
        let clusters: HashMap<(&str, &str), &ObjectRecord> = objects
            .iter()
            .filter(|o| &*o.kind == "Cluster")
            .map(|o| ((o.namespace.as_str(), o.name.as_str()), *o))
            .collect();
        let mut children: HashMap<Uid, Vec<&ObjectRecord>> = HashMap::new();
        let mut members: HashMap<(&str, &str), Vec<&ObjectRecord>> = HashMap::new();
        for &o in &objects {
            if let Some(c) = &o.controller {
                children.entry(c.uid).or_default().push(o);
            }
            if let (Some(c), false) = (&o.cluster, &*o.kind == "Cluster") {
                members
                    .entry((o.namespace.as_str(), c.as_str()))
                    .or_default()
                    .push(o);
            }
        }
        let mut still_dangling = HashSet::new();
        let mut out = Vec::new();
        for &o in objects.iter().filter(|o| !o.moving) {
            let cluster = if &*o.kind == "Cluster" {
                Some(o)
            } else {
                o.cluster
                    .as_deref()
                    .and_then(|c| clusters.get(&(o.namespace.as_str(), c)).copied())
            };
            if let Some(since) = o.deleting_since {
                if o.finalizers.is_empty() || now.duration_since(since) < self.grace {
                    continue;
                }
                let mut held_by: Vec<&ObjectRecord> =
                    children.get(&o.uid).cloned().unwrap_or_default();
                if &*o.kind == "Cluster" {
                    held_by.extend(
                        members
                            .get(&(o.namespace.as_str(), o.name.as_str()))
                            .into_iter()
                            .flatten(),
                    );
                }
                held_by.sort_by_key(|c| (&c.kind, &c.name));
                held_by.dedup_by_key(|c| c.uid);
                let vm = (&*o.kind == "CloudStackMachine")
                    .then(|| vms.get(&format!("{}/{}", o.namespace, o.name)))
                    .flatten();
                out.push(self.remnant(
                    o,
                    since,
                    RemnantReason::StuckDeleting,
                    stuck_why(o, &held_by, cluster.is_some_and(|c| c.paused), vm),
                    vm.map(|v| v.vm_id.clone()),
                ));
                continue;
            }
            // A paused object or Cluster is held on purpose (clusterctl move copies it while
            // its owners are re-linked): not dangling.
            if o.paused || cluster.is_some_and(|c| c.paused) {
                continue;
            }
            let mut dangling = Vec::new();
            if let Some(c) = o
                .controller
                .as_ref()
                .filter(|c| watched.contains(c.kind.as_str()) && !present.contains(&c.uid))
            {
                dangling.push((
                    RemnantReason::OwnerGone,
                    format!(
                        "its controller owner {} {} is gone: the garbage collector has not \
                         removed it (deleted with --cascade=orphan, or a finalizer holds it?)",
                        c.kind, c.name
                    ),
                ));
            }
            if let Some(c) = o.cluster.as_deref().filter(|_| {
                &*o.kind != "Cluster" && watched.contains("Cluster") && cluster.is_none()
            }) {
                dangling.push((
                    RemnantReason::ClusterGone,
                    format!(
                        "it is labelled for Cluster {}/{c}, which does not exist",
                        o.namespace
                    ),
                ));
            }
            for (reason, why) in dangling {
                let key = (o.uid, reason);
                let since = *self.dangling_since.entry(key).or_insert(now);
                still_dangling.insert(key);
                if now.duration_since(since) >= self.grace {
                    out.push(self.remnant(o, since, reason, why, None));
                }
            }
        }
        self.dangling_since
            .retain(|k, _| still_dangling.contains(k));
        out.sort_by(|a, b| {
            (&a.namespace, &a.kind, &a.name, a.reason).cmp(&(
                &b.namespace,
                &b.kind,
                &b.name,
                b.reason,
            ))
        });
        out
    }

    fn remnant(
        &self,
        o: &ObjectRecord,
        since: Timestamp,
        reason: RemnantReason,
        why: String,
        related_vm: Option<String>,
    ) -> Remnant {
        let cluster = if &*o.kind == "Cluster" {
            Some(o.name.as_str())
        } else {
            o.cluster.as_deref()
        };
        Remnant {
            group: o.group.to_string(),
            kind: o.kind.to_string(),
            namespace: o.namespace.clone(),
            name: o.name.clone(),
            cluster: cluster.map(|c| format!("{}/{c}", o.namespace)),
            since,
            reason,
            why,
            blocking_finalizers: if reason == RemnantReason::StuckDeleting {
                o.finalizers.clone()
            } else {
                Vec::new()
            },
            related_vm,
        }
    }
}

/// Why an object is still deleting, as far as the metadata and CloudStack tell.
fn stuck_why(
    o: &ObjectRecord,
    held_by: &[&ObjectRecord],
    cluster_paused: bool,
    vm: Option<&VmFacts>,
) -> String {
    let mut parts = vec![format!(
        "deleting, held by finalizer(s) {}",
        o.finalizers.join(", ")
    )];
    if !held_by.is_empty() {
        let named: Vec<String> = held_by
            .iter()
            .take(NAMED)
            .map(|c| format!("{} {}", c.kind, c.name))
            .collect();
        let more = held_by.len().saturating_sub(NAMED);
        parts.push(format!(
            "waiting for {} object(s) still present: {}{}",
            held_by.len(),
            named.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
    }
    if cluster_paused {
        parts.push("its Cluster is paused: no controller acts on it until it is unpaused".into());
    }
    if let Some(vm) = vm {
        parts.push(match (&vm.state, &vm.last_error) {
            (None, _) => format!("CloudStack no longer lists VM {}", vm.vm_id),
            (Some(state), None) => format!("CloudStack shows VM {} {state}", vm.vm_id),
            (Some(state), Some(e)) => format!(
                "CloudStack shows VM {} {state}; its last destroy failed: {e}",
                vm.vm_id
            ),
        });
    }
    parts.join("; ")
}

/// A command an operator may run (the shim never does), with what it skips when it is a last
/// resort.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Command {
    pub line: String,
    pub warning: Option<String>,
}

/// What an operator would run to look at `r` — and, for an object stuck deleting with nothing
/// left to wait for but its own finalizers' work, the finalizer removal with what it skips.
pub fn commands(r: &Remnant) -> Vec<Command> {
    let resource = format!("{}.{}", r.kind.to_ascii_lowercase(), r.group);
    let look = |verb: &str, tail: &str| Command {
        line: format!(
            "kubectl -n {} {verb} {resource} {}{tail}",
            r.namespace, r.name
        ),
        warning: None,
    };
    let mut out = vec![look("get", " -o yaml"), look("describe", "")];
    if r.reason == RemnantReason::StuckDeleting
        && !r.blocking_finalizers.is_empty()
        && !r.why.contains("still present")
    {
        let skipped: BTreeMap<&str, &str> = r
            .blocking_finalizers
            .iter()
            .map(|f| (f.as_str(), what_it_skips(f)))
            .collect();
        let warning = skipped
            .iter()
            .map(|(f, s)| format!("{f}: {s}"))
            .collect::<Vec<_>>()
            .join("; ");
        out.push(Command {
            line: format!(
                "kubectl -n {} patch {resource} {} --type=merge -p '{{\"metadata\":{{\"finalizers\":null}}}}'",
                r.namespace, r.name
            ),
            warning: Some(format!(
                "last resort — removing the finalizers skips the cleanup they wait for: {warning}"
            )),
        });
    }
    out
}

/// What removing finalizer `f` skips.
fn what_it_skips(f: &str) -> &'static str {
    match f {
        "cloudstackmachine.infrastructure.cluster.x-k8s.io" => {
            "CAPC will not destroy the VM; it runs on in CloudStack (the orphan report lists it) \
             until it is destroyed there"
        }
        "machine.cluster.x-k8s.io" => {
            "CAPI will not drain the Node nor delete the Machine's bootstrap and infrastructure \
             objects"
        }
        "cluster.cluster.x-k8s.io" => "CAPI will not delete the Cluster's remaining objects",
        "kubeadm.controlplane.cluster.x-k8s.io" => {
            "KubeadmControlPlane will not delete its Machines"
        }
        "cluster.x-k8s.io/machineset" | "cluster.x-k8s.io/machinedeployment" => {
            "CAPI will not delete the objects it owns"
        }
        "cloudstackcluster.infrastructure.cluster.x-k8s.io"
        | "cloudstackisolatednetwork.infrastructure.cluster.x-k8s.io"
        | "affinitygroup.infrastructure.cluster.x-k8s.io"
        | "cloudstackfailuredomain.infrastructure.cluster.x-k8s.io" => {
            "CAPC will not remove what it created in CloudStack for this object"
        }
        "foregroundDeletion" => "the garbage collector will not wait for the dependents",
        _ => "its controller's cleanup for this object does not run",
    }
}

#[cfg(test)]
mod tests;
