//! The incidents' series (issue 45): one per open incident, by scope and the kind of its named
//! cause (`none` when nothing shared explains the failures). Replaced whole every cycle, so an
//! incident that ended (or a scope gone) leaves no series behind.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{lock, Metrics};

#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct IncidentLabels {
    pub scope: String,
    /// `host`, `router`, `network`, `cluster`, `pod`, `template`, `offering`, `zone` or `none`.
    pub cause_kind: String,
}

#[derive(Debug, Default)]
pub(super) struct IncidentSeries {
    open: Family<IncidentLabels, Gauge>,
    failing: Family<IncidentLabels, Gauge>,
    seen: Mutex<BTreeMap<IncidentLabels, i64>>,
}

impl IncidentSeries {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let s = Self::default();
        registry.register(
            "incidents",
            "1 per open incident: many Machines of one scope failing at once, by the kind of the cause their VMs share (none: no shared cause explains them); /status incidents[] names it",
            s.open.clone(),
        );
        registry.register(
            "incident_failing_machines",
            "Failing Machines (False, or held by the mass-failure guard) in each open incident",
            s.failing.clone(),
        );
        s
    }
}

impl Metrics {
    /// The open incidents as they stand: `(scope, cause kind) → failing Machines`.
    pub fn set_incidents(&self, open: &BTreeMap<IncidentLabels, i64>) {
        let s = &self.incidents;
        let mut seen = lock(&s.seen);
        for gone in seen.keys().filter(|l| !open.contains_key(*l)) {
            s.open.remove(gone);
            s.failing.remove(gone);
        }
        for (l, failing) in open {
            s.open.get_or_create(l).set(1);
            s.failing.get_or_create(l).set(*failing);
        }
        *seen = open.clone();
    }
}
