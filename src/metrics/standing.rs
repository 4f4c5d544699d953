//! What stands now, per cluster and per scope: Machines `False` and how long the oldest has
//! been, whether each scope's last poll succeeded and why its polls failed. The alerts of
//! `deploy/components/monitoring` and docs/alerts.md read these.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{lock, Metrics, ScopeLabels};
use crate::status::ClusterReport;
use crate::verdict::Status;

/// Machines standing `False`: their Cluster (`namespace/name`) and the verdict's reason.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct FalseLabels {
    pub cluster: String,
    pub reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

/// A failed poll of a scope: `kind` is the CloudStack error's kind (`unauthorized`,
/// `transport`, `timeout`, …) or `deadline` (the poll did not finish in time).
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PollFailureLabels {
    pub scope: String,
    pub kind: String,
}

#[derive(Debug)]
pub(super) struct Standing {
    false_machines: Family<FalseLabels, Gauge>,
    false_seen: Mutex<BTreeSet<FalseLabels>>,
    oldest_false: Family<ClusterLabels, Gauge>,
    oldest_seen: Mutex<BTreeSet<ClusterLabels>>,
    pub(super) scope_up: Family<ScopeLabels, Gauge>,
    poll_failures: Family<PollFailureLabels, Counter>,
    failures_seen: Mutex<BTreeSet<PollFailureLabels>>,
}

impl Standing {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let false_machines = Family::<FalseLabels, Gauge>::default();
        registry.register(
            "false_machines",
            "Machines whose verdict is False now, by Cluster (namespace/name) and reason",
            false_machines.clone(),
        );
        let oldest_false = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "oldest_false_seconds",
            "Seconds the longest-standing False verdict of a Cluster has stood (no series when none is False)",
            oldest_false.clone(),
        );
        let scope_up = Family::<ScopeLabels, Gauge>::default();
        registry.register(
            "scope_up",
            "1 when the last poll of a CloudStack scope listed its VMs, 0 when it failed",
            scope_up.clone(),
        );
        let poll_failures = Family::<PollFailureLabels, Counter>::default();
        registry.register(
            "scope_poll_failures",
            "Failed polls of a CloudStack scope by error kind (unauthorized, transport, timeout, … or deadline)",
            poll_failures.clone(),
        );
        Self {
            false_machines,
            false_seen: Mutex::new(BTreeSet::new()),
            oldest_false,
            oldest_seen: Mutex::new(BTreeSet::new()),
            scope_up,
            poll_failures,
            failures_seen: Mutex::new(BTreeSet::new()),
        }
    }

    /// Drops the poll-failure series of scopes not in `scopes`.
    pub(super) fn forget_scopes(&self, scopes: &BTreeSet<String>) {
        let mut seen = lock(&self.failures_seen);
        for labels in seen.iter().filter(|l| !scopes.contains(&l.scope)) {
            self.poll_failures.remove(labels);
        }
        seen.retain(|l| scopes.contains(&l.scope));
    }
}

/// Replaces the series of `family` by `now`; label sets missing from `now` are removed.
fn replace<L>(family: &Family<L, Gauge>, seen: &Mutex<BTreeSet<L>>, now: BTreeMap<L, i64>)
where
    L: Clone + Ord + std::hash::Hash + EncodeLabelSet + std::fmt::Debug,
{
    let mut seen = lock(seen);
    for labels in seen.iter().filter(|l| !now.contains_key(*l)) {
        family.remove(labels);
    }
    seen.clear();
    for (labels, n) in now {
        family.get_or_create(&labels).set(n);
        seen.insert(labels);
    }
}

impl Metrics {
    /// Sets `capc_health_false_machines` and `capc_health_oldest_false_seconds` from this
    /// cycle's report (clusters keyed `namespace/name`); a cluster or reason with no `False`
    /// Machine now has no series. A verdict without a transition time counts from `now`.
    pub fn set_standing_false(&self, clusters: &BTreeMap<String, ClusterReport>, now: Timestamp) {
        let mut counts: BTreeMap<FalseLabels, i64> = BTreeMap::new();
        let mut oldest: BTreeMap<ClusterLabels, i64> = BTreeMap::new();
        for (cluster, report) in clusters {
            for m in report.machines.values() {
                if m.verdict != Some(Status::False) {
                    continue;
                }
                let labels = FalseLabels {
                    cluster: cluster.clone(),
                    reason: m.reason.clone().unwrap_or_default(),
                };
                *counts.entry(labels).or_default() += 1;
                let age = m
                    .since
                    .map(|since| now.duration_since(since).as_secs().max(0))
                    .unwrap_or(0);
                let o = oldest
                    .entry(ClusterLabels {
                        cluster: cluster.clone(),
                    })
                    .or_default();
                *o = (*o).max(age);
            }
        }
        replace(
            &self.standing.false_machines,
            &self.standing.false_seen,
            counts,
        );
        replace(
            &self.standing.oldest_false,
            &self.standing.oldest_seen,
            oldest,
        );
    }

    /// The outcome of one poll of `scope`: `Ok` when it listed the scope's VMs, else the
    /// failure's kind (see [`PollFailureLabels`]).
    pub fn record_scope_poll(&self, scope: &str, outcome: Result<(), &str>) {
        self.saw_scope(scope);
        let labels = ScopeLabels {
            scope: scope.to_string(),
        };
        self.standing
            .scope_up
            .get_or_create(&labels)
            .set(i64::from(outcome.is_ok()));
        if let Err(kind) = outcome {
            let labels = PollFailureLabels {
                scope: scope.to_string(),
                kind: kind.to_string(),
            };
            self.standing.poll_failures.get_or_create(&labels).inc();
            lock(&self.standing.failures_seen).insert(labels);
        }
    }
}
