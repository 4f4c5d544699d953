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
    /// Entries left out to stay within the size bound (the oldest gone first).
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
                let scope = o.scope.as_deref().map(|s| {
                    *index.entry(s).or_insert_with(|| {
                        scopes.push(s.to_string());
                        scopes.len() - 1
                    })
                });
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
        Memory {
            version: VERSION,
            scopes,
            machines,
            clusters,
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
            .find_map(|e| e.scope.filter(|&s| s >= m.scopes.len()))
        {
            return Err(MemoryError::BadScope(bad));
        }
        let mut restored = 0;
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

/// A memory as stored: its bytes, and how many CloudStackMachines it holds and left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub bytes: Vec<u8>,
    pub machines: usize,
    pub dropped: usize,
}

/// `m` as gzip of JSON within `max_bytes`: when it does not fit, the CloudStackMachines gone
/// longest are left out first, then present ones (counted in `dropped`).
pub fn encode(m: &Memory, max_bytes: usize) -> Encoded {
    let mut m = m.clone();
    // Kept in this order: present ones, then the most recently gone.
    m.machines.sort_by(|a, b| {
        b.gone_since
            .is_none()
            .cmp(&a.gone_since.is_none())
            .then(b.gone_since.cmp(&a.gone_since))
    });
    loop {
        let bytes = gzip(&m);
        if bytes.len() <= max_bytes || m.machines.is_empty() {
            return Encoded {
                bytes,
                machines: m.machines.len(),
                dropped: m.dropped,
            };
        }
        // Shrink in proportion to the excess, at least one entry per round.
        let keep =
            (m.machines.len() as f64 * max_bytes as f64 / bytes.len() as f64 * 0.95) as usize;
        let keep = keep.min(m.machines.len() - 1);
        m.dropped += m.machines.len() - keep;
        m.machines.truncate(keep);
    }
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
mod tests {
    use super::*;
    use crate::orphans::{ClusterSighting, ScopeListing, SightingRef};
    use crate::scope::ListedVm;
    use jiff::SignedDuration;

    const SCOPE: &str = "https://cloud/client/api project=- zone=z1 key=abc";

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn csm(name: &str, id: &str) -> Arc<CloudStackMachineRecord> {
        Arc::new(CloudStackMachineRecord {
            namespace: "ns".into(),
            name: name.into(),
            instance_id: Some(id.into()),
            failure_domain_name: Some("fd1".into()),
            instance_state: None,
            instance_state_since: None,
            cluster_name: Some("c1".into()),
            deleting: false,
            moving: false,
        })
    }

    fn vm(id: &str, name: &str) -> ListedVm {
        ListedVm {
            id: id.into(),
            name: name.into(),
            state: crate::cloudstack::model::VmState::Running,
        }
    }

    fn cluster() -> Vec<ClusterSighting> {
        vec![ClusterSighting {
            namespace: "ns".into(),
            name: "c1".into(),
            paused: false,
            deleting: false,
        }]
    }

    fn cycle(
        f: &mut OrphanFinder,
        csms: &[Arc<CloudStackMachineRecord>],
        vms: &[ListedVm],
        now: Timestamp,
    ) -> usize {
        let sightings: Vec<SightingRef<'_>> = csms
            .iter()
            .map(|c| SightingRef {
                machine: c,
                scope: Some(SCOPE),
            })
            .collect();
        f.observe(
            &sightings,
            &cluster(),
            &[ScopeListing {
                scope: SCOPE,
                vms: Some(vms),
            }],
            now,
        );
        f.orphans().count()
    }

    #[test]
    fn a_new_finder_given_the_memory_reports_the_vm_of_a_machine_deleted_while_no_shim_watched() {
        let grace = SignedDuration::from_secs(60);
        let (keep, gone) = (csm("m-keep", "id-keep"), csm("m-gone", "id-gone"));
        let vms = [vm("id-keep", "m-keep"), vm("id-gone", "m-gone")];
        let mut before = OrphanFinder::new(grace);
        assert_eq!(
            cycle(&mut before, &[keep.clone(), gone.clone()], &vms, at(0)),
            0
        );
        let stored = encode(&before.memory(), 1 << 20).bytes;

        // The shim is down while m-gone is deleted (its finalizer removed by hand); a new
        // process starts with only m-keep to see.
        let mut fresh = OrphanFinder::new(grace);
        assert_eq!(
            cycle(&mut fresh, std::slice::from_ref(&keep), &vms, at(100)),
            0
        );
        assert_eq!(
            cycle(&mut fresh, std::slice::from_ref(&keep), &vms, at(200)),
            0,
            "without the memory, nothing"
        );

        let mut after = OrphanFinder::new(grace);
        assert_eq!(after.restore(decode(&stored).unwrap()), Ok(2));
        assert_eq!(
            cycle(&mut after, std::slice::from_ref(&keep), &vms, at(100)),
            0,
            "within the grace"
        );
        assert_eq!(cycle(&mut after, &[keep], &vms, at(161)), 1);
        let o = after.orphans().next().unwrap();
        assert_eq!(
            (o.vm_id.as_str(), o.kind),
            ("id-gone", crate::status::OrphanKind::InstanceOfDeleted)
        );
        assert_eq!(o.cluster.as_deref(), Some("ns/c1"));
    }

    #[test]
    fn the_bound_leaves_out_the_longest_gone_first_and_says_how_many() {
        let mut m = Memory {
            version: VERSION,
            scopes: vec![SCOPE.into()],
            ..Default::default()
        };
        for i in 0..2000 {
            m.machines.push(MachineEntry {
                namespace: "ns".into(),
                name: format!("m-{i}"),
                instance_id: Some(format!(
                    "{:08x}-1111-2222-3333-{:012x}",
                    i * 7919,
                    i * 104729
                )),
                cluster: Some("c1".into()),
                scope: Some(0),
                gone_since: (i % 2 == 1).then(|| at(i)),
                deleting: false,
                moving: false,
            });
        }
        let whole = encode(&m, 1 << 20).bytes;
        assert_eq!(decode(&whole).unwrap().dropped, 0);
        let bound = whole.len() * 3 / 4;
        let bounded = encode(&m, bound).bytes;
        assert!(bounded.len() <= bound);
        let back = decode(&bounded).unwrap();
        assert!(back.dropped > 0 && back.dropped + back.machines.len() == 2000);
        // Every present one was kept; of the gone ones, the most recently gone.
        assert_eq!(
            back.machines
                .iter()
                .filter(|e| e.gone_since.is_none())
                .count(),
            1000
        );
        let kept: std::collections::HashSet<&str> =
            back.machines.iter().map(|e| e.name.as_str()).collect();
        let oldest_kept = back.machines.iter().filter_map(|e| e.gone_since).min();
        for e in m
            .machines
            .iter()
            .filter(|e| !kept.contains(e.name.as_str()))
        {
            assert!(
                e.gone_since.is_some() && e.gone_since < oldest_kept,
                "{e:?} left out"
            );
        }
    }

    #[test]
    fn what_cannot_be_read_back_is_a_clear_error() {
        assert!(matches!(
            decode(b"<html>proxy</html>"),
            Err(MemoryError::NotGzip(_))
        ));
        let v2 = gzip_json(br#"{"v": 2, "m": []}"#);
        assert_eq!(decode(&v2), Err(MemoryError::UnknownVersion { found: 2 }));
        assert!(matches!(
            decode(&gzip_json(b"[1, 2")),
            Err(MemoryError::NotJson(_))
        ));
        let bad_scope = decode(&gzip_json(
            br#"{"v": 1, "s": [], "m": [{"n": "ns", "m": "a", "s": 3}]}"#,
        ))
        .unwrap();
        assert_eq!(
            OrphanFinder::new(SignedDuration::from_secs(1)).restore(bad_scope),
            Err(MemoryError::BadScope(3))
        );
    }

    #[test]
    fn a_decode_error_does_not_quote_the_memory() {
        // serde's own message would quote the offending value ("a-machine-name").
        let e = decode(&gzip_json(
            br#"{"v": 1, "m": [{"n": "ns", "m": 98765, "i": "a-machine-name"}]}"#,
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 1"), "{e}");
        assert!(!e.contains("a-machine-name") && !e.contains("98765"), "{e}");
        let e = decode(&gzip_json(br#"{"v": "v-secret-ish"}"#))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret-ish"), "{e}");
    }

    fn gzip_json(json: &[u8]) -> Vec<u8> {
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(json).unwrap();
        z.finish().unwrap()
    }
}
