//! The scorecard's counts and baselines kept in the shim's memory ConfigMap (issue 44), so a
//! new leader goes on counting where the last one stopped. Its own key and field manager (the
//! orphan memory's writes do not touch it, and it does not touch theirs); written behind the
//! Lease when the counts changed, at most once per [`WRITE_EVERY`]; bounded to [`MAX_BYTES`].
//!
//! As for the orphan memory (issue 40), nothing is written before this term read what is
//! stored (or found nothing); a stored scorecard this build cannot read is written back under
//! [`ASIDE_KEY`] beside the new one, never lost silently.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;

use super::cycle::Controller;
use crate::cli::to_std;
use crate::k8s::kube_error::{within, KubeError};
use crate::status::{MemoryRead, ScorecardMemoryReport};
use crate::verdict::scorecard::Kept;

/// The ConfigMap's key (JSON: [`Kept`]).
pub const DATA_KEY: &str = "scorecard.json";
/// Where a stored scorecard this build cannot read is kept, as it was read.
pub const ASIDE_KEY: &str = "scorecard.unreadable.json";
/// The field manager of both keys.
const MANAGER: &str = "capc-health-shim-scorecard";
/// Beside the orphan memory's 600 KiB, within the ConfigMap's 1 MiB.
pub const MAX_BYTES: usize = 200 * 1024;
/// How often it is written at most (outcomes are rare; counts lost at a crash are at most
/// this old).
pub const WRITE_EVERY: Duration = Duration::from_secs(10);

/// Where the scorecard is kept and what was last written there.
pub struct ScorecardStore {
    api: Api<ConfigMap>,
    name: String,
    written: Option<String>,
    last_write: Option<Instant>,
    /// An unreadable stored scorecard, written back under [`ASIDE_KEY`] with every write.
    aside: Option<String>,
    pub(super) report: ScorecardMemoryReport,
}

impl ScorecardStore {
    pub fn new(client: &Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            name: name.to_string(),
            written: None,
            last_write: None,
            aside: None,
            report: ScorecardMemoryReport {
                configmap: format!("{namespace}/{name}"),
                ..Default::default()
            },
        }
    }

    fn what(&self) -> String {
        format!("ConfigMap {} key {DATA_KEY}", self.report.configmap)
    }

    async fn load(&self, timeout: Duration) -> Result<BTreeMap<String, String>, KubeError> {
        let what = self.what();
        let cm = within(timeout, what.clone(), async {
            self.api
                .get_opt(&self.name)
                .await
                .map_err(|e| KubeError::from_kube(what.clone(), &e))
        })
        .await?;
        Ok(cm.and_then(|c| c.data).unwrap_or_default())
    }

    async fn save(&self, json: &str, timeout: Duration) -> Result<(), KubeError> {
        let mut data = BTreeMap::from([(DATA_KEY.to_string(), json.to_string())]);
        if let Some(aside) = &self.aside {
            data.insert(ASIDE_KEY.to_string(), aside.clone());
        }
        let body = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": self.name, "labels": {"app.kubernetes.io/name": "capc-health-shim"}},
            "data": data,
        });
        let what = self.what();
        within(timeout, what.clone(), async {
            self.api
                .patch(
                    &self.name,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(body),
                )
                .await
                .map_err(|e| KubeError::from_kube(what.clone(), &e))
        })
        .await?;
        Ok(())
    }
}

/// What a read found: the counts to take back, nothing, or bytes this build cannot read.
#[derive(Debug, PartialEq)]
pub enum Found {
    Kept(Box<Kept>),
    Absent,
    Unreadable { stored: String, why: String },
}

/// The rule for the stored data (pure).
pub fn found(data: &BTreeMap<String, String>) -> Found {
    match data.get(DATA_KEY) {
        None => Found::Absent,
        Some(stored) => match serde_json::from_str::<Kept>(stored) {
            Ok(k) => Found::Kept(Box::new(k)),
            Err(e) => Found::Unreadable {
                stored: stored.clone(),
                why: format!("key {DATA_KEY} cannot be decoded: {e}"),
            },
        },
    }
}

impl Controller {
    /// Keeps the scorecard in `store`.
    pub fn with_scorecard_memory(mut self, store: ScorecardStore) -> Self {
        self.scorecard_memory = Some(store);
        self
    }

    /// When leadership begins: what an earlier leader counted. A read that fails is tried
    /// again each cycle; until one succeeds nothing is written.
    pub async fn restore_scorecard(&mut self) {
        let timeout = to_std(self.args.kube_timeout);
        let Some(store) = self.scorecard_memory.as_mut() else {
            return;
        };
        match store.load(timeout).await {
            Err(e) => {
                store.report.read = MemoryRead::Failed;
                let e = format!(
                    "scorecard: cannot read its stored counts, so nothing is written over them until a read succeeds: {e}"
                );
                tracing::warn!(error = %e, "scorecard: trying the read again next cycle");
                store.report.last_error = Some(e);
            }
            Ok(data) => {
                store.report.last_error = None;
                store.aside = data.get(ASIDE_KEY).cloned();
                match found(&data) {
                    Found::Kept(k) => {
                        store.report.read = MemoryRead::Ok;
                        tracing::info!(configmap = %store.report.configmap, since = %k.since,
                            "scorecard: took back what earlier leaders counted");
                        self.scorecard.restore(*k);
                    }
                    Found::Absent => store.report.read = MemoryRead::Absent,
                    Found::Unreadable { stored, why } => {
                        store.report.read = MemoryRead::Unreadable;
                        tracing::warn!(error = %why,
                            "scorecard: its stored counts are unreadable; kept under {ASIDE_KEY}, counting starts again");
                        store.report.last_error = Some(why);
                        store.aside = Some(stored);
                    }
                }
                store.report.kept_aside = match (&store.aside, &store.report.last_error) {
                    (None, _) => None,
                    (Some(_), Some(why)) => Some(format!("{ASIDE_KEY}: {why}")),
                    (Some(_), None) => Some(format!("{ASIDE_KEY}: kept by an earlier leader")),
                };
            }
        }
    }

    /// After the scoring phase: reads first if this term has not yet, then writes the counts
    /// when they changed (at most once per [`WRITE_EVERY`]), behind the Lease.
    pub(super) async fn keep_scorecard(&mut self, now: Timestamp) {
        let timeout = to_std(self.args.kube_timeout);
        let Some(store) = self.scorecard_memory.as_ref() else {
            return;
        };
        if matches!(store.report.read, MemoryRead::Pending | MemoryRead::Failed) {
            self.restore_scorecard().await;
        }
        let Some(store) = self.scorecard_memory.as_mut() else {
            return;
        };
        if matches!(store.report.read, MemoryRead::Pending | MemoryRead::Failed)
            || store.last_write.is_some_and(|t| t.elapsed() < WRITE_EVERY)
        {
            return;
        }
        let (json, left_out) = self.scorecard.kept.encode(MAX_BYTES);
        if store.written.as_deref() == Some(json.as_str()) {
            return;
        }
        if let Err(why) = self.lease.confirm().await {
            tracing::debug!(
                ?why,
                "not writing the scorecard: the Lease is not confirmed"
            );
            return;
        }
        store.last_write = Some(Instant::now());
        match store.save(&json, timeout).await {
            Ok(()) => {
                store.report.written_at = Some(now);
                store.report.bytes = json.len();
                store.report.left_out = left_out;
                store.report.last_error = None;
                store.written = Some(json);
            }
            Err(e) => {
                tracing::warn!(error = %e, "scorecard: cannot write its counts; trying again later");
                store.report.last_error = Some(format!("scorecard: cannot write its counts: {e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_scorecard_is_taken_back_absent_or_unreadable() {
        let kept = Kept::new(
            Timestamp::from_second(1_800_000_000).unwrap(),
            jiff::SignedDuration::from_hours(1),
        );
        let data = BTreeMap::from([(DATA_KEY.to_string(), serde_json::to_string(&kept).unwrap())]);
        assert_eq!(found(&data), Found::Kept(Box::new(kept)));
        assert_eq!(found(&BTreeMap::new()), Found::Absent);
        let bad = BTreeMap::from([(DATA_KEY.to_string(), "<html>proxy</html>".to_string())]);
        let Found::Unreadable { stored, why } = found(&bad) else {
            panic!("unreadable expected")
        };
        assert_eq!(stored, "<html>proxy</html>");
        assert!(why.contains(DATA_KEY), "{why}");
    }
}
