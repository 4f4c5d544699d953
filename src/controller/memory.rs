//! The orphan finder's memory in a ConfigMap of the shim's own namespace (issue 29), so that a
//! new leader — after a restart, a crash or a takeover — still knows the CloudStackMachines
//! seen before it started, and reports the VM of one deleted while no shim was watching. Read
//! once when leadership begins; written behind the Lease when it changed, at most once per
//! [`WRITE_EVERY`]; bounded to [`MAX_BYTES`] ([`crate::orphans::memory`] decides what fits).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;

use super::cycle::Controller;
use crate::cli::to_std;
use crate::k8s::kube_error::{within, KubeError};
use crate::orphans::memory::{decode, encode};
use crate::status::MemoryReport;
use capi_model::condition::FIELD_MANAGER;

/// The ConfigMap's key.
pub const DATA_KEY: &str = "orphan-memory.json.gz";

/// Well under a ConfigMap's 1 MiB (the API carries binaryData as base64, 4/3 of this).
pub const MAX_BYTES: usize = 600 * 1024;

/// How often the memory is written at most (the first write goes out at once).
pub const WRITE_EVERY: Duration = Duration::from_secs(60);

/// Where the memory lives and what was last written there.
pub struct MemoryStore {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    /// The bytes last written (a memory that did not change is not written again).
    written: Option<Vec<u8>>,
    /// When the memory was last taken from the finder (at most once per [`WRITE_EVERY`]).
    last_check: Option<Instant>,
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
            report: MemoryReport {
                configmap: format!("{namespace}/{name}"),
                ..Default::default()
            },
        }
    }

    fn what(&self) -> String {
        format!("ConfigMap {}/{}", self.namespace, self.name)
    }

    /// The stored bytes; `None` when there is no ConfigMap or no key yet.
    async fn load(&self, timeout: Duration) -> Result<Option<Vec<u8>>, KubeError> {
        let what = self.what();
        let cm = within(timeout, what.clone(), async {
            self.api
                .get_opt(&self.name)
                .await
                .map_err(|e| KubeError::from_kube(what.clone(), &e))
        })
        .await?;
        Ok(cm
            .and_then(|cm| cm.binary_data)
            .and_then(|mut d| d.remove(DATA_KEY))
            .map(|b| b.0))
    }

    async fn save(&self, bytes: &[u8], timeout: Duration) -> Result<(), KubeError> {
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/name".to_string(),
                    "capc-health-shim".to_string(),
                )])),
                ..Default::default()
            },
            binary_data: Some(BTreeMap::from([(
                DATA_KEY.to_string(),
                ByteString(bytes.to_vec()),
            )])),
            ..Default::default()
        };
        let mut body = serde_json::to_value(&cm).unwrap_or_default();
        body["apiVersion"] = "v1".into();
        body["kind"] = "ConfigMap".into();
        let what = self.what();
        within(timeout, what.clone(), async {
            self.api
                .patch(
                    &self.name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(body),
                )
                .await
                .map(|_| ())
                .map_err(|e| KubeError::from_kube(what.clone(), &e))
        })
        .await
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

    /// Once, when leadership begins (before the first cycle): what an earlier leader stored.
    /// A memory that cannot be read is reported and left as it is until this leader writes
    /// its own; it never stops the shim.
    pub async fn restore_memory(&mut self) {
        let timeout = to_std(self.args.kube_timeout);
        let (Some(store), Some(finder)) = (self.memory.as_mut(), self.orphans.as_mut()) else {
            return;
        };
        let outcome = match store.load(timeout).await {
            Ok(None) => Ok(0),
            Ok(Some(bytes)) => decode(&bytes)
                .and_then(|m| finder.restore(m))
                .map_err(|e| format!("{}: {DATA_KEY}: {e}", store.what())),
            Err(e) => Err(e.to_string()),
        };
        match outcome {
            Ok(n) => {
                store.report.restored = n;
                tracing::info!(configmap = %store.report.configmap, restored = n,
                    "orphan report: took back the CloudStackMachines an earlier leader remembered");
            }
            Err(e) => {
                tracing::warn!(error = %e, "orphan report: cannot read the stored memory; starting without it");
                store.report.last_error = Some(e);
            }
        }
    }

    /// After the orphan finder's step: writes its memory when it changed (at most once per
    /// [`WRITE_EVERY`]), behind the Lease.
    pub(super) async fn keep_memory(&mut self, now: Timestamp) {
        let timeout = to_std(self.args.kube_timeout);
        let (Some(store), Some(finder)) = (self.memory.as_mut(), self.orphans.as_ref()) else {
            return;
        };
        if store.last_check.is_some_and(|t| t.elapsed() < WRITE_EVERY) {
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
        let encoded = encode(&finder.memory(), MAX_BYTES);
        if store.written.as_deref() == Some(encoded.bytes.as_slice()) {
            return;
        }
        match store.save(&encoded.bytes, timeout).await {
            Ok(()) => {
                store.report.stored_machines = encoded.machines;
                store.report.dropped = encoded.dropped;
                store.report.bytes = encoded.bytes.len();
                store.report.written_at = Some(now);
                store.report.last_error = None;
                store.written = Some(encoded.bytes);
            }
            Err(e) => {
                tracing::warn!(error = %e, "orphan report: cannot write its memory; trying again later");
                store.report.last_error = Some(e.to_string());
            }
        }
    }

    /// What `/status` shows of the memory.
    pub(super) fn memory_report(&self) -> Option<MemoryReport> {
        self.memory.as_ref().map(|s| s.report.clone())
    }
}
