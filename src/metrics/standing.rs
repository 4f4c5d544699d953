//! What stands now, per cluster and per scope: each Cluster's Machines by verdict, how long
//! its oldest `False` verdict has stood, whether each scope's last poll succeeded and why its
//! polls failed. The alerts of `deploy/components/monitoring` and docs/alerts.md read these.

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

/// Judged Machines: their Cluster (`namespace/name`), the verdict's status and reason.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct MachineLabels {
    pub cluster: String,
    pub status: String,
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
    machines: Family<MachineLabels, Gauge>,
    machines_seen: Mutex<BTreeSet<MachineLabels>>,
    oldest_false: Family<ClusterLabels, Gauge>,
    oldest_seen: Mutex<BTreeSet<ClusterLabels>>,
    false_unacted: Family<ClusterLabels, Gauge>,
    unacted_seen: Mutex<BTreeSet<ClusterLabels>>,
    pub(super) scope_up: Family<ScopeLabels, Gauge>,
    poll_failures: Family<PollFailureLabels, Counter>,
    failures_seen: Mutex<BTreeSet<PollFailureLabels>>,
}

impl Standing {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let machines = Family::<MachineLabels, Gauge>::default();
        registry.register(
            "machines",
            "Machines by Cluster (namespace/name) and the verdict they carry now (status, reason)",
            machines.clone(),
        );
        let oldest_false = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "oldest_false_seconds",
            "Seconds the longest-standing False verdict of a Cluster has stood (no series when none is False)",
            oldest_false.clone(),
        );
        let false_unacted = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "false_unacted_machines",
            "Machines of a Cluster whose verdict is False and that nothing will act on: no MachineHealthCheck covers them, none lists the condition (--mode condition), or their owner cannot remediate (0 for every Cluster with CAPC Machines)",
            false_unacted.clone(),
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
            machines,
            machines_seen: Mutex::new(BTreeSet::new()),
            oldest_false,
            oldest_seen: Mutex::new(BTreeSet::new()),
            false_unacted,
            unacted_seen: Mutex::new(BTreeSet::new()),
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
    /// Sets `capc_health_machines` and `capc_health_oldest_false_seconds` from this cycle's
    /// report (clusters keyed `namespace/name`); a label set with no Machine now, and a cluster
    /// with no `False` Machine, have no series. Machines not judged yet are not counted. A
    /// verdict without a transition time counts from `now`.
    pub fn set_standing(&self, clusters: &BTreeMap<String, ClusterReport>, now: Timestamp) {
        let mut counts: BTreeMap<MachineLabels, i64> = BTreeMap::new();
        let mut oldest: BTreeMap<ClusterLabels, i64> = BTreeMap::new();
        for (cluster, report) in clusters {
            // Counted on borrowed keys: label strings are made per label set, not per Machine.
            let mut here: BTreeMap<(Status, &str), i64> = BTreeMap::new();
            let mut oldest_here: Option<i64> = None;
            for m in report.machines.values() {
                let Some(status) = m.verdict else { continue };
                *here
                    .entry((status, m.reason.as_deref().unwrap_or_default()))
                    .or_default() += 1;
                if status == Status::False {
                    let age = m
                        .since
                        .map(|since| now.duration_since(since).as_secs().max(0))
                        .unwrap_or(0);
                    oldest_here = Some(oldest_here.map_or(age, |o| o.max(age)));
                }
            }
            for ((status, reason), n) in here {
                let labels = MachineLabels {
                    cluster: cluster.clone(),
                    status: status.as_str().to_string(),
                    reason: reason.to_string(),
                };
                counts.insert(labels, n);
            }
            if let Some(age) = oldest_here {
                let labels = ClusterLabels {
                    cluster: cluster.clone(),
                };
                oldest.insert(labels, age);
            }
        }
        replace(
            &self.standing.machines,
            &self.standing.machines_seen,
            counts,
        );
        replace(
            &self.standing.oldest_false,
            &self.standing.oldest_seen,
            oldest,
        );
    }

    /// Sets `capc_health_false_unacted_machines` per Cluster (`namespace/name`); Clusters not
    /// in `counts` lose their series.
    pub fn set_false_unacted(&self, counts: BTreeMap<String, i64>) {
        let now = counts
            .into_iter()
            .map(|(cluster, n)| (ClusterLabels { cluster }, n))
            .collect();
        replace(
            &self.standing.false_unacted,
            &self.standing.unacted_seen,
            now,
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
