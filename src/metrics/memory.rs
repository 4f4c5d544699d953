//! The orphan report's memory (issue 40): whether this leader holds its writes because it has
//! not read the stored memory yet, and whether an unreadable one is kept aside.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;
use crate::status::MemoryReport;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigMapLabels {
    /// `namespace/name`.
    pub configmap: String,
}

/// Series only on a leader with the orphan report on (a label set per ConfigMap), so a
/// follower or a shim without the memory shows nothing an alert could take for trouble.
#[derive(Debug, Default)]
pub(super) struct MemoryGauges {
    held: Family<ConfigMapLabels, Gauge>,
    kept_aside: Family<ConfigMapLabels, Gauge>,
}

impl MemoryGauges {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let g = Self::default();
        registry.register(
            "orphan_memory_held",
            "1 while the leader writes nothing over the orphan report's stored memory because it has not read it (its reads fail, or an unreadable one is not yet kept aside)",
            g.held.clone(),
        );
        registry.register(
            "orphan_memory_kept_aside",
            "1 while the memory's ConfigMap holds an unreadable memory kept aside (until an operator removes that key)",
            g.kept_aside.clone(),
        );
        g
    }
}

impl Metrics {
    /// Brings the memory's gauges up to `report`.
    pub fn set_orphan_memory(&self, report: &MemoryReport) {
        let labels = ConfigMapLabels {
            configmap: report.configmap.clone(),
        };
        self.memory
            .held
            .get_or_create(&labels)
            .set(i64::from(report.held));
        self.memory
            .kept_aside
            .get_or_create(&labels)
            .set(i64::from(report.kept_aside.is_some()));
    }
}
