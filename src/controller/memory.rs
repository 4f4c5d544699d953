//! The orphan finder's memory in a ConfigMap of the shim's own namespace (issue 29), so that a
//! new leader — after a restart, a crash or a takeover — still knows the CloudStackMachines
//! seen before it started, and reports the VM of one deleted while no shim was watching. Read
//! when leadership begins; written behind the Lease when it changed, at most once per
//! [`WRITE_EVERY`]; bounded to [`MAX_BYTES`] ([`crate::orphans::memory`] decides what fits).
//!
//! Read before written (issue 40): a leader writes nothing over the stored memory until it has
//! read it in this term (or found none); a read that fails is tried again each cycle. A memory
//! that is read but cannot be decoded is copied to [`ASIDE_KEY`] of the same ConfigMap, with a
//! note of when and why ([`ASIDE_NOTE_KEY`]), before this leader's memory replaces it. The
//! rule is [`next_step`]; the rest is I/O.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde::{Deserialize, Serialize};

use super::cycle::Controller;
use crate::cli::to_std;
use crate::k8s::kube_error::{within, KubeError};
use crate::orphans::memory::{decode, encode};
use crate::status::{KeptAside, MemoryRead, MemoryReport};
use capi_model::condition::FIELD_MANAGER;

/// The ConfigMap's key.
pub const DATA_KEY: &str = "orphan-memory.json.gz";

/// Where a stored memory this build cannot read is kept, as it was read (binaryData).
pub const ASIDE_KEY: &str = "orphan-memory.unreadable.json.gz";

/// When and why it was kept aside (data, JSON: [`AsideNote`]).
pub const ASIDE_NOTE_KEY: &str = "orphan-memory.unreadable.json";

/// The aside is applied by a field manager of its own: server-side apply removes the fields a
/// manager stops sending, so the main key's writes (without the aside) must not own it.
const ASIDE_MANAGER: &str = "capc-health-shim-memory-aside";

/// Well under a ConfigMap's 1 MiB (the API carries binaryData as base64, 4/3 of this).
pub const MAX_BYTES: usize = 600 * 1024;

/// What a ConfigMap's data and binaryData may hold together (the API server's limit).
const CONFIGMAP_LIMIT: usize = 1024 * 1024;

/// Room left for the labels, the note and the keys beside the aside's bytes.
const AROUND_ASIDE: usize = 8 * 1024;

/// How often the memory is written at most (the first write goes out at once).
pub const WRITE_EVERY: Duration = Duration::from_secs(60);

/// What this term does next with the stored memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Read it (again): nothing is written before a read succeeds.
    Read,
    /// Copy the unreadable bytes to [`ASIDE_KEY`]; the main key waits until that succeeded.
    KeepAside,
    /// Write this leader's memory when it changed.
    Write,
}

/// The rule: nothing replaces the stored memory unless this term read it (or found none) and,
/// when it could not be decoded, kept it aside first.
pub fn next_step(read: MemoryRead, aside_pending: bool) -> Step {
    match read {
        MemoryRead::Pending | MemoryRead::Failed => Step::Read,
        MemoryRead::Unreadable if aside_pending => Step::KeepAside,
        MemoryRead::Ok | MemoryRead::Absent | MemoryRead::Unreadable => Step::Write,
    }
}

/// A read that got an answer: how it went, and whether the stored bytes still have to be kept
/// aside (not when the aside key already holds these very bytes — an earlier leader kept them
/// and stopped before it wrote its own).
pub fn after_read(
    main: Option<&[u8]>,
    aside: Option<&[u8]>,
    taken_back: bool,
) -> (MemoryRead, bool) {
    match main {
        None => (MemoryRead::Absent, false),
        Some(_) if taken_back => (MemoryRead::Ok, false),
        Some(bytes) => (MemoryRead::Unreadable, aside != Some(bytes)),
    }
}

/// The main key's bound when `aside` bytes sit beside it: both must fit in one ConfigMap.
pub fn main_budget(aside: usize) -> usize {
    if aside == 0 {
        return MAX_BYTES;
    }
    MAX_BYTES.min(CONFIGMAP_LIMIT.saturating_sub(aside + AROUND_ASIDE))
}

/// The note stored next to the kept-aside bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AsideNote {
    pub kept_at: Option<Timestamp>,
    /// Why it could not be read (names the key and the error, never the contents).
    pub reason: String,
    /// The key it was read from.
    pub from: String,
}

/// What a GET of the ConfigMap found.
#[derive(Debug, Default)]
struct Stored {
    main: Option<Vec<u8>>,
    aside: Option<Vec<u8>>,
    note: Option<String>,
}

impl Stored {
    fn of(cm: Option<ConfigMap>) -> Self {
        let Some(cm) = cm else {
            return Self::default();
        };
        let mut binary = cm.binary_data.unwrap_or_default();
        Self {
            main: binary.remove(DATA_KEY).map(|b| b.0),
            aside: binary.remove(ASIDE_KEY).map(|b| b.0),
            note: cm.data.and_then(|mut d| d.remove(ASIDE_NOTE_KEY)),
        }
    }

    /// What `/status` says of the aside found; a note that does not parse is shown as such.
    fn kept_aside(&self) -> Option<KeptAside> {
        let bytes = self.aside.as_ref()?;
        let note: Option<AsideNote> = self
            .note
            .as_deref()
            .and_then(|n| serde_json::from_str(n).ok());
        Some(KeptAside {
            key: ASIDE_KEY.to_string(),
            bytes: bytes.len(),
            kept_at: note.as_ref().and_then(|n| n.kept_at),
            reason: note.map_or_else(
                || format!("no readable note under {ASIDE_NOTE_KEY}"),
                |n| n.reason,
            ),
        })
    }

    fn aside_len(&self) -> usize {
        self.aside.as_ref().map_or(0, Vec::len) + self.note.as_ref().map_or(0, String::len)
    }
}

/// Where the memory lives and what was last written there.
pub struct MemoryStore {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    /// The bytes last written (a memory that did not change is not written again).
    written: Option<Vec<u8>>,
    /// When the memory was last taken from the finder (at most once per [`WRITE_EVERY`]).
    last_check: Option<Instant>,
    /// An unreadable memory still to be kept aside, and why it is unreadable.
    unreadable: Option<(Vec<u8>, String)>,
    /// Bytes the aside and its note take in the ConfigMap (the main key gets the rest).
    aside_len: usize,
    report: MemoryReport,
}

impl MemoryStore {
    pub fn new(client: &Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            written: None,
            last_check: None,
            unreadable: None,
            aside_len: 0,
            report: MemoryReport {
                configmap: format!("{namespace}/{name}"),
                ..Default::default()
            },
        }
    }

    fn what(&self) -> String {
        format!("ConfigMap {}/{}", self.namespace, self.name)
    }

    fn step(&self) -> Step {
        next_step(self.report.read, self.unreadable.is_some())
    }

    async fn load(&self, timeout: Duration) -> Result<Stored, KubeError> {
        let what = self.what();
        let cm = within(timeout, what.clone(), async {
            self.api
                .get_opt(&self.name)
                .await
                .map_err(|e| KubeError::from_kube(what.clone(), &e))
        })
        .await?;
        Ok(Stored::of(cm))
    }

    /// Server-side apply of `cm`'s data by `manager`; what the ConfigMap holds afterwards.
    async fn apply(
        &self,
        cm: ConfigMap,
        manager: &str,
        timeout: Duration,
    ) -> Result<Stored, KubeError> {
        let mut body = serde_json::to_value(&cm).unwrap_or_default();
        body["apiVersion"] = "v1".into();
        body["kind"] = "ConfigMap".into();
        let what = self.what();
        let cm = within(timeout, what.clone(), async {
            self.api
                .patch(
                    &self.name,
                    &PatchParams::apply(manager).force(),
                    &Patch::Apply(body),
                )
                .await
                .map_err(|e| KubeError::from_kube(what.clone(), &e))
        })
        .await?;
        Ok(Stored::of(Some(cm)))
    }

    fn meta(&self) -> kube::api::ObjectMeta {
        kube::api::ObjectMeta {
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            ..Default::default()
        }
    }

    async fn save(&self, bytes: &[u8], timeout: Duration) -> Result<Stored, KubeError> {
        let mut metadata = self.meta();
        metadata.labels = Some(BTreeMap::from([(
            "app.kubernetes.io/name".to_string(),
            "capc-health-shim".to_string(),
        )]));
        let cm = ConfigMap {
            metadata,
            binary_data: Some(BTreeMap::from([(
                DATA_KEY.to_string(),
                ByteString(bytes.to_vec()),
            )])),
            ..Default::default()
        };
        self.apply(cm, FIELD_MANAGER, timeout).await
    }

    async fn keep_aside(
        &self,
        bytes: &[u8],
        note: &AsideNote,
        timeout: Duration,
    ) -> Result<Stored, KubeError> {
        let cm = ConfigMap {
            metadata: self.meta(),
            binary_data: Some(BTreeMap::from([(
                ASIDE_KEY.to_string(),
                ByteString(bytes.to_vec()),
            )])),
            data: Some(BTreeMap::from([(
                ASIDE_NOTE_KEY.to_string(),
                serde_json::to_string(note).unwrap_or_default(),
            )])),
            ..Default::default()
        };
        self.apply(cm, ASIDE_MANAGER, timeout).await
    }

    /// What the ConfigMap holds aside now (after a write or a check).
    fn saw_aside(&mut self, stored: &Stored) {
        self.aside_len = stored.aside_len();
        self.report.kept_aside = stored.kept_aside();
    }
}

impl Controller {
    /// Keeps the orphan finder's memory in `store` (with the orphan report on).
    pub fn with_memory(mut self, store: MemoryStore) -> Self {
        if self.orphans.is_some() {
            self.memory = Some(store);
        }
        self
    }

    /// When leadership begins (before the first cycle): what an earlier leader stored. A read
    /// that fails is tried again each cycle ([`Controller::keep_memory`]); until one succeeds
    /// nothing is written over the stored memory. It never stops the shim.
    pub async fn restore_memory(&mut self) {
        self.read_memory().await;
        self.publish_memory();
    }

    /// One read of the stored memory: taken back into the finder, found absent, failed (to be
    /// tried again) or unreadable (to be kept aside before anything replaces it).
    async fn read_memory(&mut self) {
        let timeout = to_std(self.args.kube_timeout);
        let (Some(store), Some(finder)) = (self.memory.as_mut(), self.orphans.as_mut()) else {
            return;
        };
        let stored = match store.load(timeout).await {
            Ok(stored) => stored,
            Err(e) => {
                store.report.read = MemoryRead::Failed;
                store.report.read_failures = store.report.read_failures.saturating_add(1);
                let e = format!(
                    "cannot read key {DATA_KEY}, so nothing is written over it until a read succeeds: {e}"
                );
                tracing::warn!(error = %e, failures = store.report.read_failures,
                    "orphan report: its stored memory could not be read; trying again next cycle");
                store.report.last_error = Some(e);
                return;
            }
        };
        let taken = stored
            .main
            .as_deref()
            .map(|bytes| decode(bytes).and_then(|m| finder.restore(m)));
        let (read, aside_pending) = after_read(
            stored.main.as_deref(),
            stored.aside.as_deref(),
            matches!(taken, Some(Ok(_))),
        );
        store.report.read = read;
        store.report.read_failures = 0;
        store.saw_aside(&stored);
        match taken {
            None => {
                store.report.last_error = None;
                tracing::info!(configmap = %store.report.configmap,
                    "orphan report: no memory stored yet");
            }
            Some(Ok(n)) => {
                store.report.restored = n;
                store.report.last_error = None;
                tracing::info!(configmap = %store.report.configmap, restored = n,
                    "orphan report: took back the CloudStackMachines an earlier leader remembered");
            }
            Some(Err(e)) => {
                let why = format!("{} key {DATA_KEY}: cannot be decoded: {e}", store.what());
                tracing::warn!(error = %why, kept_aside_before = !aside_pending,
                    "orphan report: its stored memory is unreadable; it is kept under {ASIDE_KEY} before this leader writes its own");
                store.report.last_error = Some(why.clone());
                if aside_pending {
                    store.unreadable = stored.main.map(|bytes| (bytes, why));
                }
            }
        }
    }

    /// Copies an unreadable memory to [`ASIDE_KEY`], behind the Lease. Whether it is kept.
    async fn keep_memory_aside(&mut self, now: Timestamp) -> bool {
        let timeout = to_std(self.args.kube_timeout);
        let Some(store) = self.memory.as_mut() else {
            return false;
        };
        let Some((bytes, why)) = store.unreadable.as_ref() else {
            return true;
        };
        if let Err(why) = self.lease.confirm().await {
            tracing::debug!(
                ?why,
                "not keeping the orphan memory aside: the Lease is not confirmed"
            );
            return false;
        }
        let note = AsideNote {
            kept_at: Some(now),
            reason: why.clone(),
            from: DATA_KEY.to_string(),
        };
        match store.keep_aside(bytes, &note, timeout).await {
            Ok(stored) => {
                tracing::warn!(configmap = %store.report.configmap, bytes = bytes.len(),
                    "orphan report: kept the unreadable memory under {ASIDE_KEY}; this leader's memory replaces it under {DATA_KEY}");
                store.saw_aside(&stored);
                store.unreadable = None;
                true
            }
            Err(e) => {
                let e = format!(
                    "cannot keep the unreadable key {DATA_KEY} aside under {ASIDE_KEY}, so nothing is written over it: {e}"
                );
                tracing::warn!(error = %e, "orphan report: trying again next cycle");
                store.report.last_error = Some(e);
                false
            }
        }
    }

    /// After the orphan finder's step: reads the stored memory first if this term has not yet,
    /// keeps an unreadable one aside, then writes the finder's memory when it changed (at most
    /// once per [`WRITE_EVERY`]), behind the Lease.
    pub(super) async fn keep_memory(&mut self, now: Timestamp) {
        self.keep_memory_steps(now).await;
        self.publish_memory();
    }

    async fn keep_memory_steps(&mut self, now: Timestamp) {
        let timeout = to_std(self.args.kube_timeout);
        let Some(store) = self.memory.as_ref() else {
            return;
        };
        if store.step() == Step::Read {
            self.read_memory().await;
        }
        let Some(store) = self.memory.as_ref() else {
            return;
        };
        match store.step() {
            Step::Read => return,
            Step::KeepAside => {
                if !self.keep_memory_aside(now).await {
                    return;
                }
            }
            Step::Write => {}
        }
        let (Some(store), Some(finder)) = (self.memory.as_mut(), self.orphans.as_ref()) else {
            return;
        };
        if store.step() != Step::Write
            || store.last_check.is_some_and(|t| t.elapsed() < WRITE_EVERY)
        {
            return;
        }
        if let Err(why) = self.lease.confirm().await {
            tracing::debug!(
                ?why,
                "not writing the orphan memory: the Lease is not confirmed"
            );
            return;
        }
        store.last_check = Some(Instant::now());
        let encoded = encode(&finder.memory(), main_budget(store.aside_len));
        if store.written.as_deref() == Some(encoded.bytes.as_slice()) {
            // Nothing to write; while a copy is kept aside, see whether an operator removed it.
            if store.report.kept_aside.is_some() {
                if let Ok(stored) = store.load(timeout).await {
                    store.saw_aside(&stored);
                }
            }
            return;
        }
        match store.save(&encoded.bytes, timeout).await {
            Ok(stored) => {
                store.report.stored_machines = encoded.machines;
                store.report.dropped = encoded.dropped;
                store.report.bytes = encoded.bytes.len();
                store.report.written_at = Some(now);
                store.report.last_error = None;
                store.written = Some(encoded.bytes);
                store.saw_aside(&stored);
            }
            Err(e) => {
                tracing::warn!(error = %e, "orphan report: cannot write its memory; trying again later");
                store.report.last_error = Some(e.to_string());
            }
        }
    }

    fn publish_memory(&mut self) {
        if let Some(store) = self.memory.as_mut() {
            store.report.held = store.step() != Step::Write;
            self.metrics.set_orphan_memory(&store.report);
        }
    }

    /// What `/status` shows of the memory.
    pub(super) fn memory_report(&self) -> Option<MemoryReport> {
        self.memory.as_ref().map(|s| s.report.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [MemoryRead; 5] = [
        MemoryRead::Pending,
        MemoryRead::Ok,
        MemoryRead::Absent,
        MemoryRead::Failed,
        MemoryRead::Unreadable,
    ];

    #[test]
    fn nothing_is_written_before_a_read_succeeds() {
        for pending in [false, true] {
            assert_eq!(next_step(MemoryRead::Pending, pending), Step::Read);
            assert_eq!(next_step(MemoryRead::Failed, pending), Step::Read);
        }
    }

    #[test]
    fn an_unreadable_memory_is_kept_aside_before_it_is_replaced() {
        assert_eq!(next_step(MemoryRead::Unreadable, true), Step::KeepAside);
        assert_eq!(next_step(MemoryRead::Unreadable, false), Step::Write);
    }

    #[test]
    fn only_a_read_or_an_absent_memory_or_one_kept_aside_lets_the_leader_write() {
        for read in ALL {
            for pending in [false, true] {
                let writes = next_step(read, pending) == Step::Write;
                let allowed = matches!(read, MemoryRead::Ok | MemoryRead::Absent)
                    || (read == MemoryRead::Unreadable && !pending);
                assert_eq!(writes, allowed, "{read:?}, aside pending {pending}");
            }
        }
    }

    #[test]
    fn a_read_is_judged_by_what_it_found() {
        assert_eq!(after_read(None, None, false), (MemoryRead::Absent, false));
        // An aside left by an earlier leader does not make an absent memory unreadable.
        assert_eq!(
            after_read(None, Some(b"x"), false),
            (MemoryRead::Absent, false)
        );
        assert_eq!(after_read(Some(b"m"), None, true), (MemoryRead::Ok, false));
        assert_eq!(
            after_read(Some(b"m"), Some(b"x"), true),
            (MemoryRead::Ok, false)
        );
        assert_eq!(
            after_read(Some(b"m"), None, false),
            (MemoryRead::Unreadable, true)
        );
        // Another unreadable memory than the one kept aside is kept aside too.
        assert_eq!(
            after_read(Some(b"m"), Some(b"x"), false),
            (MemoryRead::Unreadable, true)
        );
        // The very bytes already kept aside (an earlier leader stopped before its own write).
        assert_eq!(
            after_read(Some(b"m"), Some(b"m"), false),
            (MemoryRead::Unreadable, false)
        );
    }

    #[test]
    fn the_main_key_leaves_room_for_the_aside_within_one_configmap() {
        assert_eq!(main_budget(0), MAX_BYTES);
        assert_eq!(main_budget(1000), MAX_BYTES);
        for aside in [300 * 1024, 600 * 1024, 900 * 1024] {
            let budget = main_budget(aside);
            assert!(
                budget + aside + AROUND_ASIDE <= CONFIGMAP_LIMIT,
                "{aside}: {budget}"
            );
            assert!(budget > 0, "{aside}");
        }
        assert_eq!(main_budget(CONFIGMAP_LIMIT), 0);
    }

    #[test]
    fn a_kept_aside_copy_is_reported_with_its_note_or_without_one() {
        let note = AsideNote {
            kept_at: Some(Timestamp::from_second(1_800_000_000).unwrap()),
            reason:
                "ConfigMap ns/m key orphan-memory.json.gz: cannot be decoded: written in format 2"
                    .into(),
            from: DATA_KEY.into(),
        };
        let stored = Stored {
            main: Some(b"new".to_vec()),
            aside: Some(vec![0; 10]),
            note: Some(serde_json::to_string(&note).unwrap()),
        };
        let k = stored.kept_aside().unwrap();
        assert_eq!((k.key.as_str(), k.bytes), (ASIDE_KEY, 10));
        assert_eq!(k.kept_at, note.kept_at);
        assert_eq!(k.reason, note.reason);
        let bare = Stored {
            aside: Some(vec![1]),
            note: Some("{not json".into()),
            ..Default::default()
        };
        assert!(bare
            .kept_aside()
            .unwrap()
            .reason
            .contains("no readable note"));
        assert!(Stored::default().kept_aside().is_none());
    }
}
