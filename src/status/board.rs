//! The `/status` document as the HTTP side serves it: the [`StatusReport`] and its JSON,
//! rendered once per change instead of once per request.
//!
//! At 10 000 Machines the document is ~4.7 MB; cloning and serializing it for every GET cost
//! tens of milliseconds each and a copy of the report per concurrent reader. Here a cycle's
//! report is swapped in and rendered once ([`StatusBoard::publish`]; meanwhile GETs get the
//! last rendering, so none waits for it); any other change ([`StatusBoard::write`]) marks the rendering stale
//! and the next GET renders it. Every GET until the next change sends the same shared bytes
//! (gzip made once, on the first request that accepts it). Smaller views (`?cluster=`,
//! `?problems=true`) borrow from the report ([`StatusView`]) and are rendered on their first GET
//! of a generation, then kept for it like the whole document.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{ClusterReport, MachineReport, ScopeReport, StatusReport};
use crate::verdict::Status;

/// One rendering of the whole document.
#[derive(Debug)]
pub struct Rendered {
    /// Which change of the report it shows (also in its ETag).
    pub generation: u64,
    pub json: Bytes,
    gzip: OnceLock<Bytes>,
    /// A weak validator: the same for the identity and the gzip coding of one generation.
    pub etag: String,
}

impl Rendered {
    /// The document gzip-compressed, made on first use and kept.
    pub fn gzip(&self) -> &Bytes {
        self.gzip.get_or_init(|| gzip(&self.json))
    }
}

/// `value` as JSON bytes, sized to the document (within a sixteenth): `Bytes` keeps a `Vec`'s
/// whole capacity, and a grown one is up to twice the document (a 4.7 MB report at 10 000
/// Machines held 8 MB).
fn json_bytes<T: serde::Serialize + ?Sized>(value: &T) -> Bytes {
    json_bytes_near(value, 0)
}

/// As [`json_bytes`], written into room for `expected` bytes (the last rendering's size, plus
/// a little): a document about that size is written without growing its buffer — growing
/// doubled it and, while it moved, held old and new at once — and without a copy to trim it.
fn json_bytes_near<T: serde::Serialize + ?Sized>(value: &T, expected: usize) -> Bytes {
    let mut json = Vec::with_capacity(expected + expected / 32);
    if serde_json::to_writer(&mut json, value).is_err() {
        json.clear();
    }
    if json.capacity() - json.len() > json.len() / 16 {
        json.shrink_to_fit();
    }
    Bytes::from(json)
}

fn gzip(data: &[u8]) -> Bytes {
    use std::io::Write as _;
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 8),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(data);
    let mut gz = enc.finish().unwrap_or_default();
    gz.shrink_to_fit();
    Bytes::from(gz)
}

/// The report, and its rendering while it is current.
#[derive(Debug)]
pub struct StatusBoard {
    report: RwLock<StatusReport>,
    generation: AtomicU64,
    rendered: Mutex<Option<Arc<Rendered>>>,
    /// Views rendered for the current generation, by [`StatusQuery::tag`] (a dashboard asking
    /// for one cluster every few seconds gets the same bytes until the next cycle).
    views: Mutex<ViewCache>,
    /// Tells this process's ETags from an earlier one's (generations restart at 0).
    epoch: u64,
}

impl Default for StatusBoard {
    fn default() -> Self {
        Self::new(StatusReport::default())
    }
}

impl StatusBoard {
    pub fn new(report: StatusReport) -> Self {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        Self {
            report: RwLock::new(report),
            generation: AtomicU64::new(0),
            rendered: Mutex::new(None),
            views: Mutex::new(ViewCache::default()),
            epoch,
        }
    }

    pub async fn read(&self) -> RwLockReadGuard<'_, StatusReport> {
        self.report.read().await
    }

    /// The report, to change: the rendering is stale from here on (readers wait for the lock,
    /// so none renders the report half-changed).
    pub async fn write(&self) -> RwLockWriteGuard<'_, StatusReport> {
        let guard = self.report.write().await;
        self.generation.fetch_add(1, Ordering::SeqCst);
        *self.rendered.lock().unwrap_or_else(|e| e.into_inner()) = None;
        guard
    }

    /// The current rendering, made now if the report changed since the last one.
    pub async fn rendered(&self) -> Arc<Rendered> {
        if let Some(r) = self.cached() {
            return r;
        }
        let report = self.report.read().await;
        // Under the read lock no write can happen: the generation is the report's.
        let generation = self.generation.load(Ordering::SeqCst);
        if let Some(r) = self.cached().filter(|r| r.generation == generation) {
            return r;
        }
        let json = json_bytes(&*report);
        self.keep(generation, json)
    }

    /// A cycle's whole report (the controller's): swapped in, then rendered once. Until its
    /// rendering is kept (milliseconds), a GET gets the last one and never waits for this. The
    /// report it replaces is freed before the rendering is made, so the previous report, its
    /// rendering and the new report's rendering are never all held at once (at 10 000
    /// Machines that was the process's peak). What the process says of itself (`version`,
    /// `leader`, `ready`) is kept from the current report.
    pub async fn publish(&self, mut next: StatusReport) {
        let generation = {
            let mut current = self.report.write().await;
            (next.version, next.leader, next.ready) =
                (current.version.clone(), current.leader, current.ready);
            let previous = std::mem::replace(&mut *current, next);
            let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
            drop(current);
            drop(previous);
            generation
        };
        let expected = self.cached().map_or(0, |r| r.json.len());
        let report = self.report.read().await;
        // Changed again meanwhile ([`StatusBoard::write`]): the next GET renders that one.
        if self.generation.load(Ordering::SeqCst) != generation {
            return;
        }
        let json = json_bytes_near(&*report, expected);
        self.keep(generation, json);
    }

    /// The ETag of views cut from the current report (`?cluster=`, `?problems=`).
    pub fn etag_of_view(&self, view: &str) -> String {
        self.view_etag(self.generation.load(Ordering::SeqCst), view)
    }

    fn view_etag(&self, generation: u64, view: &str) -> String {
        format!("W/\"{:x}-{generation}-{view}\"", self.epoch)
    }

    /// The view `q` asks for, rendered (once per generation and view) with its ETag.
    pub async fn rendered_view(&self, q: &StatusQuery) -> Result<(String, Bytes), ViewError> {
        let report = self.report.read().await;
        // Under the read lock no write can happen: the generation is the report's.
        let generation = self.generation.load(Ordering::SeqCst);
        let tag = q.tag();
        let etag = self.view_etag(generation, &tag);
        if let Some(json) = self.views_lock().get(generation, &tag) {
            return Ok((etag, json));
        }
        let json = json_bytes(&view(&report, q)?);
        self.views_lock().keep(generation, tag, json.clone());
        Ok((etag, json))
    }

    fn views_lock(&self) -> std::sync::MutexGuard<'_, ViewCache> {
        self.views.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `json` as the rendering of `generation`, kept for the GETs until the next change.
    fn keep(&self, generation: u64, json: Bytes) -> Arc<Rendered> {
        let r = Arc::new(Rendered {
            generation,
            json,
            gzip: OnceLock::new(),
            etag: format!("W/\"{:x}-{generation}\"", self.epoch),
        });
        *self.rendered.lock().unwrap_or_else(|e| e.into_inner()) = Some(r.clone());
        r
    }

    fn cached(&self) -> Option<Arc<Rendered>> {
        self.rendered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Rendered views of one generation, at most [`ViewCache::MAX`] of them (the query names any
/// cluster, so the cache is bounded; past it, views are rendered per request).
#[derive(Debug, Default)]
struct ViewCache {
    generation: u64,
    views: std::collections::HashMap<String, Bytes>,
}

impl ViewCache {
    const MAX: usize = 64;

    fn get(&self, generation: u64, tag: &str) -> Option<Bytes> {
        (self.generation == generation)
            .then(|| self.views.get(tag).cloned())
            .flatten()
    }

    fn keep(&mut self, generation: u64, tag: String, json: Bytes) {
        if self.generation != generation {
            self.generation = generation;
            self.views.clear();
        }
        if self.views.len() < Self::MAX {
            self.views.insert(tag, json);
        }
    }
}

/// What a request asks to see of the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusQuery {
    /// `namespace/name` of one Cluster: its Machines, orphans and remnants only.
    pub cluster: Option<String>,
    /// Only what needs a look: Machines not `True` (or whose write failed, or whose
    /// escalation is held, pending or done), scopes in trouble, problems, orphans, remnants.
    #[serde(default)]
    pub problems: bool,
}

impl StatusQuery {
    pub fn is_whole(&self) -> bool {
        self.cluster.is_none() && !self.problems
    }

    /// A short name of the view, for its ETag.
    pub fn tag(&self) -> String {
        let mut tag = String::new();
        if let Some(c) = &self.cluster {
            tag.push_str("c=");
            tag.push_str(&c.replace(['"', '\\'], "_"));
        }
        if self.problems {
            tag.push_str(";p");
        }
        tag
    }
}

/// Why a view cannot be cut.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("no cluster {0} in /status (clusters are namespace/name)")]
    NoSuchCluster(String),
}

/// Whether a Machine needs a look.
pub fn machine_needs_look(m: &MachineReport) -> bool {
    m.verdict != Some(Status::True)
        || m.write_error.is_some()
        || matches!(m.escalation.as_str(), "held" | "pending" | "annotated")
}

fn scope_needs_look(s: &ScopeReport) -> bool {
    s.last_error.is_some() || s.held || s.next_poll.is_some()
}

/// A view of the report: the same document shape, borrowing from the report (a view of one
/// cluster of a 10 000-Machine fleet is rendered without copying its Machines first).
#[derive(Debug, serde::Serialize)]
pub struct StatusView<'a> {
    pub version: &'a str,
    pub generated_at: Option<jiff::Timestamp>,
    pub leader: bool,
    pub ready: bool,
    pub api: Option<&'a capi_model::apis::ApiChoice>,
    pub problems: &'a [String],
    pub clusters: BTreeMap<&'a str, ClusterView<'a>>,
    pub scopes: Vec<&'a ScopeReport>,
    pub failure_domains: &'a [super::FailureDomainReport],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<&'a super::ProbeReport>,
    pub orphans: Vec<&'a super::OrphanReport>,
    pub orphan_detection: &'a super::OrphanDetectionReport,
    pub remnants: Vec<&'a crate::remnants::Remnant>,
    pub remnant_detection: &'a super::RemnantDetectionReport,
    pub writes: &'a BTreeMap<String, u64>,
    /// With `?cluster=`: the incidents that affect it.
    pub incidents: Vec<&'a super::IncidentReport>,
}

/// One cluster of a [`StatusView`].
#[derive(Debug, serde::Serialize)]
pub struct ClusterView<'a> {
    pub machines: BTreeMap<&'a str, &'a MachineReport>,
}

/// The part of `r` that `q` asks for (pure); nothing is copied.
pub fn view<'a>(r: &'a StatusReport, q: &StatusQuery) -> Result<StatusView<'a>, ViewError> {
    let mut clusters = BTreeMap::new();
    let mut take = |key: &'a String, c: &'a ClusterReport| {
        let machines: BTreeMap<&str, &MachineReport> = c
            .machines
            .iter()
            .filter(|(_, m)| !q.problems || machine_needs_look(m))
            .map(|(k, m)| (k.as_str(), m))
            .collect();
        if !(q.problems && machines.is_empty()) {
            clusters.insert(key.as_str(), ClusterView { machines });
        }
    };
    match &q.cluster {
        Some(key) => {
            let (key, c) = r
                .clusters
                .get_key_value(key)
                .ok_or_else(|| ViewError::NoSuchCluster(key.clone()))?;
            take(key, c);
        }
        None => r.clusters.iter().for_each(|(k, c)| take(k, c)),
    }
    Ok(StatusView {
        version: &r.version,
        generated_at: r.generated_at,
        leader: r.leader,
        ready: r.ready,
        api: r.api.as_ref(),
        problems: &r.problems,
        clusters,
        scopes: r
            .scopes
            .iter()
            .filter(|s| !q.problems || scope_needs_look(s))
            .collect(),
        failure_domains: &r.failure_domains,
        probe: r.probe.as_ref(),
        orphans: r
            .orphans
            .iter()
            .filter(|o| q.cluster.is_none() || o.cluster == q.cluster)
            .collect(),
        orphan_detection: &r.orphan_detection,
        remnants: r
            .remnants
            .iter()
            .filter(|o| q.cluster.is_none() || o.cluster == q.cluster)
            .collect(),
        remnant_detection: &r.remnant_detection,
        writes: &r.writes,
        incidents: r
            .incidents
            .iter()
            .filter(|i| q.cluster.as_ref().is_none_or(|c| i.clusters.contains(c)))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str, verdict: Option<Status>) -> MachineReport {
        MachineReport {
            namespace: "ns".into(),
            name: name.into(),
            verdict,
            escalation: "none".into(),
            ..Default::default()
        }
    }

    fn report() -> StatusReport {
        let mut r = StatusReport::default();
        for (cluster, machines) in [
            (
                "ns/a",
                vec![("a-1", Some(Status::True)), ("a-2", Some(Status::False))],
            ),
            ("ns/b", vec![("b-1", Some(Status::True))]),
        ] {
            let c = r.clusters.entry(cluster.into()).or_default();
            for (name, v) in machines {
                c.machines.insert(name.into(), machine(name, v));
            }
        }
        r.scopes = vec![
            ScopeReport {
                key: "ok".into(),
                ..Default::default()
            },
            ScopeReport {
                key: "failing".into(),
                last_error: Some("timeout".into()),
                ..Default::default()
            },
        ];
        r
    }

    /// A view as the document a client reads.
    fn owned(v: StatusView<'_>) -> StatusReport {
        serde_json::from_value(serde_json::to_value(v).unwrap()).unwrap()
    }

    #[test]
    fn the_whole_view_is_the_report() {
        let r = report();
        assert_eq!(owned(view(&r, &StatusQuery::default()).unwrap()), r);
        assert_eq!(
            serde_json::to_value(view(&r, &StatusQuery::default()).unwrap()).unwrap(),
            serde_json::to_value(&r).unwrap(),
            "the same document, field for field"
        );
    }

    #[test]
    fn one_cluster_is_that_cluster_only() {
        let q = StatusQuery {
            cluster: Some("ns/b".into()),
            ..Default::default()
        };
        let v = owned(view(&report(), &q).unwrap());
        assert_eq!(v.clusters.keys().collect::<Vec<_>>(), ["ns/b"]);
        assert_eq!(v.scopes.len(), 2, "scopes are not per cluster");
        let missing = StatusQuery {
            cluster: Some("ns/zz".into()),
            ..Default::default()
        };
        assert_eq!(
            view(&report(), &missing).unwrap_err(),
            ViewError::NoSuchCluster("ns/zz".into())
        );
    }

    #[test]
    fn problems_are_machines_not_true_and_scopes_in_trouble() {
        let q = StatusQuery {
            problems: true,
            ..Default::default()
        };
        let mut r = report();
        r.clusters
            .get_mut("ns/b")
            .unwrap()
            .machines
            .get_mut("b-1")
            .unwrap()
            .write_error = Some("could not write".into());
        let v = owned(view(&r, &q).unwrap());
        let names: Vec<&String> = v
            .clusters
            .values()
            .flat_map(|c| c.machines.keys())
            .collect();
        assert_eq!(names, ["a-2", "b-1"]);
        assert_eq!(v.scopes.len(), 1);
        assert_eq!(v.scopes[0].key, "failing");
        // A healthy fleet's problem view is empty of clusters.
        let healthy = owned(view(&StatusReport::default(), &q).unwrap());
        assert!(healthy.clusters.is_empty());
    }

    #[tokio::test]
    async fn a_change_makes_a_new_rendering_and_reading_does_not() {
        let board = StatusBoard::new(report());
        let first = board.rendered().await;
        let again = board.rendered().await;
        assert!(Arc::ptr_eq(&first, &again), "rendered once per change");
        assert_eq!(
            serde_json::from_slice::<StatusReport>(&first.json).unwrap(),
            report()
        );
        board.write().await.problems.push("new".into());
        let changed = board.rendered().await;
        assert!(changed.generation > first.generation);
        assert_ne!(changed.etag, first.etag);
        assert_eq!(
            serde_json::from_slice::<StatusReport>(&changed.json)
                .unwrap()
                .problems,
            ["new"]
        );
    }

    #[tokio::test]
    async fn a_published_report_comes_rendered_and_keeps_what_the_process_says_of_itself() {
        let board = StatusBoard::new(StatusReport {
            version: "1.2.3".into(),
            leader: true,
            ready: true,
            ..Default::default()
        });
        let before = board.rendered().await;
        board.publish(report()).await;
        // Rendered by publish: a GET takes it from the cache, with a new generation.
        let cached = board.cached().expect("publish leaves a rendering");
        assert!(cached.generation > before.generation);
        let back: StatusReport = serde_json::from_slice(&board.rendered().await.json).unwrap();
        assert_eq!(back.clusters, report().clusters);
        assert_eq!(
            (back.version.as_str(), back.leader, back.ready),
            ("1.2.3", true, true)
        );
        assert_eq!(*board.read().await, back);
    }

    #[tokio::test]
    async fn a_view_is_rendered_once_per_generation() {
        let board = StatusBoard::new(report());
        let q = StatusQuery {
            cluster: Some("ns/a".into()),
            ..Default::default()
        };
        let (etag, first) = board.rendered_view(&q).await.unwrap();
        let (again_etag, again) = board.rendered_view(&q).await.unwrap();
        assert_eq!(etag, again_etag);
        assert_eq!(
            first.as_ptr(),
            again.as_ptr(),
            "the same bytes, not a new rendering"
        );
        let read: StatusReport = serde_json::from_slice(&first).unwrap();
        assert_eq!(read.clusters.keys().collect::<Vec<_>>(), ["ns/a"]);
        board
            .write()
            .await
            .clusters
            .get_mut("ns/a")
            .unwrap()
            .machines
            .remove("a-2");
        let (changed_etag, changed) = board.rendered_view(&q).await.unwrap();
        assert_ne!(changed_etag, etag);
        let read: StatusReport = serde_json::from_slice(&changed).unwrap();
        assert_eq!(
            read.clusters["ns/a"].machines.len(),
            1,
            "a change renders anew"
        );
        let missing = StatusQuery {
            cluster: Some("ns/zz".into()),
            ..Default::default()
        };
        assert!(board.rendered_view(&missing).await.is_err());
    }

    #[test]
    fn gzip_is_the_document_compressed() {
        use std::io::Read as _;
        let r = Rendered {
            generation: 1,
            json: Bytes::from(serde_json::to_vec(&report()).unwrap()),
            gzip: OnceLock::new(),
            etag: String::new(),
        };
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&r.gzip()[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, r.json);
    }
}
