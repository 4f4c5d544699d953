//! What the orphan finder remembers, in a form a new leader can read back (issue 29): the
//! CloudStackMachines it has seen (name, instance id, Cluster, scope, since when gone) and the
//! Clusters it has seen (paused, seen deleting, since when gone). The controller keeps it in a
//! ConfigMap (`controller::memory`); this module is the pure part: taking it from a finder,
//! giving it back, and encoding it within a size bound (gzip of compact JSON; a ConfigMap holds
//! at most 1 MiB).
//!
//! What it does not carry: the VM suspects (after a restart, a VM's grace starts again) and
//! the remnant finder's dangling clocks (likewise).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::Arc;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{shared, ClusterMemory, OrphanFinder, Owner};
use crate::k8s::watched::CloudStackMachineRecord;

/// The format this build writes and reads.
pub const VERSION: u32 = 1;

/// The snapshot: short field names, since a 10 000-Machine fleet writes 10 000 entries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memory {
    #[serde(rename = "v")]
    pub version: u32,
    /// Scope keys, referred to by index.
    #[serde(rename = "s", default)]
    pub scopes: Vec<String>,
    #[serde(rename = "m", default)]
    pub machines: Vec<MachineEntry>,
    #[serde(rename = "c", default)]
    pub clusters: Vec<ClusterEntry>,
    /// Key rotations, as (old scope, new scope) indices into `scopes`: a VM named like a
    /// CloudStackMachine remembered under the old key is looked for under the new one too.
    #[serde(rename = "r", default, skip_serializing_if = "Vec::is_empty")]
    pub rotations: Vec<(usize, usize)>,
    /// CloudStackMachine entries left out to stay within the size bound (the oldest gone first).
    #[serde(rename = "d", default)]
    pub dropped: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineEntry {
    #[serde(rename = "n")]
    pub namespace: String,
    #[serde(rename = "m")]
    pub name: String,
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<usize>,
    #[serde(rename = "g", default, skip_serializing_if = "Option::is_none")]
    pub gone_since: Option<Timestamp>,
    #[serde(rename = "d", default, skip_serializing_if = "is_false")]
    pub deleting: bool,
    #[serde(rename = "x", default, skip_serializing_if = "is_false")]
    pub moving: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterEntry {
    #[serde(rename = "n")]
    pub namespace: String,
    #[serde(rename = "m")]
    pub name: String,
    #[serde(rename = "p", default, skip_serializing_if = "is_false")]
    pub paused: bool,
    #[serde(rename = "d", default, skip_serializing_if = "is_false")]
    pub deleting_seen: bool,
    #[serde(rename = "g", default, skip_serializing_if = "Option::is_none")]
    pub gone_since: Option<Timestamp>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Why a stored memory cannot be read back.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MemoryError {
    #[error("not gzip data: {0}")]
    NotGzip(String),
    #[error("not the memory's JSON: {0}")]
    NotJson(String),
    #[error("written in format {found}, this build reads format {VERSION}")]
    UnknownVersion { found: u32 },
    #[error("scope index {0} out of range")]
    BadScope(usize),
}

impl OrphanFinder {
    /// What a new leader needs of this finder's memory.
    pub fn memory(&self) -> Memory {
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut scopes = Vec::new();
        let mut machines: Vec<MachineEntry> = self
            .owners
            .values()
            .map(|o| {
                let scope = o
                    .scope
                    .as_deref()
                    .map(|s| index_of(&mut index, &mut scopes, s));
                MachineEntry {
                    namespace: o.last.namespace.clone(),
                    name: o.last.name.clone(),
                    instance_id: o.last.instance_id.clone(),
                    cluster: o.last.cluster_name.clone(),
                    scope,
                    gone_since: o.gone_since,
                    deleting: o.last.deleting,
                    moving: o.last.moving,
                }
            })
            .collect();
        machines.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let mut clusters: Vec<ClusterEntry> = self
            .clusters
            .iter()
            .map(|((namespace, name), c)| ClusterEntry {
                namespace: namespace.clone(),
                name: name.clone(),
                paused: c.paused,
                deleting_seen: c.deleting_seen,
                gone_since: c.gone_since,
            })
            .collect();
        clusters.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let mut rotations: Vec<(usize, usize)> = self
            .successors
            .iter()
            .flat_map(|(old, next)| next.iter().map(move |new| (old, new)))
            .map(|(old, new)| {
                (
                    index_of(&mut index, &mut scopes, old),
                    index_of(&mut index, &mut scopes, new),
                )
            })
            .collect();
        rotations.sort_unstable();
        Memory {
            version: VERSION,
            scopes,
            machines,
            clusters,
            rotations,
            dropped: 0,
        }
    }

    /// Takes a stored memory back (before the first cycle): what this process already knows
    /// stands; the rest is remembered as stored. A CloudStackMachine stored as present and
    /// missing at the first cycle is gone from then on — it went while no shim was watching.
    pub fn restore(&mut self, m: Memory) -> Result<usize, MemoryError> {
        if let Some(bad) = m
            .machines
            .iter()
            .filter_map(|e| e.scope)
            .chain(m.rotations.iter().flat_map(|&(a, b)| [a, b]))
            .find(|&s| s >= m.scopes.len())
        {
            return Err(MemoryError::BadScope(bad));
        }
        let mut restored = 0;
        for &(old, new) in &m.rotations {
            self.rotated(&m.scopes[old], &m.scopes[new]);
        }
        for e in m.machines {
            let key = format!("{}/{}", e.namespace, e.name);
            if self.owners.contains_key(&key) {
                continue;
            }
            let scope = e.scope.map(|i| shared(&mut self.scopes, &m.scopes[i]));
            let record = CloudStackMachineRecord {
                namespace: e.namespace,
                name: e.name,
                instance_id: e.instance_id,
                failure_domain_name: None,
                instance_state: None,
                instance_state_since: None,
                cluster_name: e.cluster,
                deleting: e.deleting,
                moving: e.moving,
            };
            self.owners.insert(
                key,
                Owner {
                    last: Arc::new(record),
                    scope,
                    gone_since: e.gone_since,
                },
            );
            restored += 1;
        }
        for c in m.clusters {
            self.clusters
                .entry((c.namespace, c.name))
                .or_insert(ClusterMemory {
                    paused: c.paused,
                    deleting_seen: c.deleting_seen,
                    gone_since: c.gone_since,
                });
        }
        Ok(restored)
    }
}

/// Scope `s`'s index in `scopes` (added when new).
fn index_of<'a>(
    index: &mut HashMap<&'a str, usize>,
    scopes: &mut Vec<String>,
    s: &'a str,
) -> usize {
    *index.entry(s).or_insert_with(|| {
        scopes.push(s.to_string());
        scopes.len() - 1
    })
}

/// A memory as stored: its bytes, how many CloudStackMachines it holds and left out, and how
/// many Cluster entries it left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub bytes: Vec<u8>,
    pub machines: usize,
    pub dropped: usize,
    pub clusters_dropped: usize,
}

/// `m` as gzip of JSON within `max_bytes`, whatever part of it is large: when it does not fit,
/// what serves no CloudStackMachine kept goes first (scopes and rotations none refers to,
/// Clusters none belongs to), then the CloudStackMachines gone longest, then present ones
/// (counted in `dropped`) — each time with the scopes and Clusters only they needed —, then the
/// Clusters, the longest gone first. Only a bound below an empty memory's size (~40 bytes)
/// is not met.
pub fn encode(m: &Memory, max_bytes: usize) -> Encoded {
    let mut m = m.clone();
    let mut clusters_dropped = 0;
    // Kept in this order: present ones, then the most recently gone.
    m.machines.sort_by(|a, b| {
        b.gone_since
            .is_none()
            .cmp(&a.gone_since.is_none())
            .then(b.gone_since.cmp(&a.gone_since))
    });
    m.clusters.sort_by(|a, b| {
        b.gone_since
            .is_none()
            .cmp(&a.gone_since.is_none())
            .then(b.gone_since.cmp(&a.gone_since))
    });
    let mut pruned = false;
    loop {
        let bytes = gzip(&m);
        let fits = bytes.len() <= max_bytes;
        if fits || (m.machines.is_empty() && m.clusters.is_empty() && pruned) {
            return Encoded {
                bytes,
                machines: m.machines.len(),
                dropped: m.dropped,
                clusters_dropped,
            };
        }
        if !pruned {
            pruned = true;
            clusters_dropped += prune(&mut m);
            continue;
        }
        // Shrink in proportion to the excess, at least one entry per round.
        let share = max_bytes as f64 / bytes.len() as f64 * 0.95;
        if m.machines.is_empty() {
            let keep = ((m.clusters.len() as f64 * share) as usize).min(m.clusters.len() - 1);
            clusters_dropped += m.clusters.len() - keep;
            m.clusters.truncate(keep);
        } else {
            let keep = ((m.machines.len() as f64 * share) as usize).min(m.machines.len() - 1);
            m.dropped += m.machines.len() - keep;
            m.machines.truncate(keep);
            clusters_dropped += prune(&mut m);
        }
    }
}

/// Leaves out of `m` what no CloudStackMachine in it needs: scopes none refers to (nor leads
/// to through a rotation), rotations between such scopes, Clusters none belongs to. Returns the
/// Clusters left out.
fn prune(m: &mut Memory) -> usize {
    let mut needed = vec![false; m.scopes.len()];
    let mut todo: Vec<usize> = m.machines.iter().filter_map(|e| e.scope).collect();
    while let Some(i) = todo.pop() {
        if needed.get(i).copied() != Some(false) {
            continue;
        }
        needed[i] = true;
        todo.extend(m.rotations.iter().filter(|r| r.0 == i).map(|r| r.1));
    }
    // Old index → new index of the scopes kept.
    let mut new_index = vec![None; m.scopes.len()];
    let mut kept = 0;
    for (i, keep) in needed.iter().enumerate() {
        if *keep {
            new_index[i] = Some(kept);
            kept += 1;
        }
    }
    let mut i = 0;
    m.scopes.retain(|_| {
        i += 1;
        needed[i - 1]
    });
    let at = |i: usize| new_index.get(i).copied().flatten();
    for e in &mut m.machines {
        e.scope = e.scope.and_then(at);
    }
    m.rotations = m
        .rotations
        .iter()
        .filter_map(|&(a, b)| Some((at(a)?, at(b)?)))
        .collect();
    let belonging: std::collections::HashSet<(&str, &str)> = m
        .machines
        .iter()
        .filter_map(|e| Some((e.namespace.as_str(), e.cluster.as_deref()?)))
        .collect();
    let before = m.clusters.len();
    let clusters = std::mem::take(&mut m.clusters);
    m.clusters = clusters
        .into_iter()
        .filter(|c| belonging.contains(&(c.namespace.as_str(), c.name.as_str())))
        .collect();
    before - m.clusters.len()
}

fn gzip(m: &Memory) -> Vec<u8> {
    let json = serde_json::to_vec(m).unwrap_or_default();
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = z.write_all(&json);
    z.finish().unwrap_or_default()
}

/// Reads back what [`encode`] wrote; anything else is a clear error.
pub fn decode(bytes: &[u8]) -> Result<Memory, MemoryError> {
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        // A hostile object cannot make the shim inflate without bound.
        .take(64 << 20)
        .read_to_end(&mut json)
        .map_err(|e| MemoryError::NotGzip(e.to_string()))?;
    #[derive(Deserialize)]
    struct Version {
        #[serde(rename = "v")]
        version: u32,
    }
    let v: Version = serde_json::from_slice(&json).map_err(not_json)?;
    if v.version != VERSION {
        return Err(MemoryError::UnknownVersion { found: v.version });
    }
    serde_json::from_slice(&json).map_err(not_json)
}

/// Where the JSON broke, without serde's quote of the offending value: the memory holds names
/// of the fleet, and this error goes to logs and `/status`.
fn not_json(e: serde_json::Error) -> MemoryError {
    MemoryError::NotJson(format!(
        "{:?} error at line {} column {}",
        e.classify(),
        e.line(),
        e.column()
    ))
}

#[cfg(test)]
mod tests;
