//! The controller's Prometheus metrics (product.md §7), in the controller-rs / Linkerd style:
//! one [`prometheus_client`] registry, every metric prefixed `capc_health_`, label sets as
//! derived structs, and a few small methods the controller calls. `/metrics` serves
//! [`Metrics::encode`].
//!
//! Label values are verdict statuses, condition reasons, scope keys, CloudStack command names
//! and outcomes — never a credential.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::verdict::Status;

/// The prefix of every metric name.
pub const PREFIX: &str = "capc_health";

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Buckets of `capc_health_poll_duration_seconds`: 50 ms … ~100 s.
const POLL_BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
];

/// Buckets of `capc_health_time_to_verdict_seconds`: 10 s … 1 h.
const TIME_TO_VERDICT_BUCKETS: [f64; 10] = [
    10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 3600.0,
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    pub status: String,
    pub reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EscalationLabels {
    pub result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    pub scope: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub command: String,
    pub result: String,
}

/// A write to the API server: `kind` is `condition`, `annotation` or `event`; `result` is
/// `ok` or a [`crate::k8s::kube_error::KubeError::label`].
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub kind: String,
    pub result: String,
}

/// What became of a write the cycle decided: `kind` as in [`WriteLabels`]; `outcome` is
/// `written`, `unchanged` (nothing to write), `failed`, `timed_out`, `dropped` (the writer's
/// queue was full) or `refused` (the leader Lease was not confirmed).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteOutcomeLabels {
    pub kind: String,
    pub outcome: String,
}

/// A guest probe attempt's answer (`reply`, `no_reply`, `no_evidence`), or what else the
/// probe counted (`job_started`, `router_lookup`, `skipped_budget`, `skipped_in_flight_cap`,
/// `skipped_router_busy`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub event: String,
}

/// Orphan VMs: the Cluster their CloudStackMachine belonged to (`namespace/name`, empty when
/// unlabelled) and the scope whose listing shows them.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct OrphanLabels {
    pub cluster: String,
    pub scope: String,
}

/// Remnants: their Cluster (`namespace/name`, empty when unlabelled) and their kind.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct RemnantLabels {
    pub cluster: String,
    pub kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

fn poll_histogram() -> Histogram {
    Histogram::new(POLL_BUCKETS)
}

fn time_to_verdict_histogram() -> Histogram {
    Histogram::new(TIME_TO_VERDICT_BUCKETS)
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Usable as a duration or a counter increment: finite and not negative.
/// A poisoned lock only means another thread panicked mid-update; the set is still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether an orphan series that reads `count` stays: while it counts reported orphans,
/// always (the alert must see VMs of deleted Clusters — the commonest case); at 0, only while
/// its scope and its Cluster (if it names one; one without counts against its scope alone)
/// are still there.
fn orphan_series_kept(
    labels: &OrphanLabels,
    count: i64,
    scopes: &BTreeSet<String>,
    clusters: &BTreeSet<String>,
) -> bool {
    count > 0
        || (scopes.contains(&labels.scope)
            && (labels.cluster.is_empty() || clusters.contains(&labels.cluster)))
}

fn usable(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

fn verdict_labels(status: Status, reason: &str) -> VerdictLabels {
    VerdictLabels {
        status: status.as_str().to_string(),
        reason: reason.to_string(),
    }
}

/// Every metric of the shim, and the registry that encodes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    verdicts: Family<VerdictLabels, Gauge>,
    /// Label sets `verdicts` has been set for, so vanished ones can be zeroed.
    verdicts_seen: Mutex<BTreeSet<(Status, String)>>,
    transitions: Family<VerdictLabels, Counter>,
    escalations: Family<EscalationLabels, Counter>,
    poll_duration: HistogramFamily<ScopeLabels>,
    cloudstack_calls: Family<CallLabels, Counter>,
    rate_limit_wait: Counter<f64, AtomicU64>,
    time_to_verdict: HistogramFamily<ReasonLabels>,
    mass_failure_held: Family<ScopeLabels, Gauge>,
    kube_writes: Family<WriteLabels, Counter>,
    writes: Family<WriteOutcomeLabels, Counter>,
    write_queue: Gauge,
    cycle_duration: Histogram,
    leader: Gauge,
    ready: Gauge,
    probe_events: Family<ProbeLabels, Counter>,
    /// The probe counts already added to `probe_events`.
    probe_seen: Mutex<crate::status::ProbeCounts>,
    probe_in_flight: Gauge,
    probe_refused: Gauge,
    orphan_vms: Family<OrphanLabels, Gauge>,
    /// Label sets `orphan_vms` has been set for and their current count, so vanished ones
    /// drop to 0 and only unreported ones are ever removed ([`Metrics::forget_gone`]).
    orphans_seen: Mutex<BTreeMap<OrphanLabels, i64>>,
    remnant_objects: Family<RemnantLabels, Gauge>,
    /// Label sets `remnant_objects` has now (a remnant's Cluster is often gone: its series
    /// goes when the remnant does, not with the Cluster).
    remnants_seen: Mutex<BTreeSet<RemnantLabels>>,
    /// Scopes the per-scope families have a label set for, so that a scope's series go when
    /// the scope does ([`Metrics::forget_gone`]): clusters and scopes come and go for weeks.
    scopes_seen: Mutex<BTreeSet<String>>,
    standing: standing::Standing,
    memory: memory::MemoryGauges,
    scorecard: scorecard::ScorecardSeries,
    incidents: incidents::IncidentSeries,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let verdicts = Family::<VerdictLabels, Gauge>::default();
        registry.register(
            "verdicts",
            "Machines per current verdict status and reason",
            verdicts.clone(),
        );
        let transitions = Family::<VerdictLabels, Counter>::default();
        registry.register(
            "transitions",
            "Verdict changes published, by the new status and reason",
            transitions.clone(),
        );
        let escalations = Family::<EscalationLabels, Counter>::default();
        registry.register(
            "escalations",
            "Escalation decisions: `annotated` or the reason it was held",
            escalations.clone(),
        );
        let poll_duration: HistogramFamily<ScopeLabels> =
            Family::new_with_constructor(poll_histogram);
        registry.register(
            "poll_duration_seconds",
            "Duration of one poll of a CloudStack scope",
            poll_duration.clone(),
        );
        let cloudstack_calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "cloudstack_calls",
            "CloudStack API calls by command and result",
            cloudstack_calls.clone(),
        );
        let rate_limit_wait = Counter::<f64, AtomicU64>::default();
        registry.register(
            "rate_limit_wait_seconds",
            "Seconds spent waiting for the CloudStack request budget",
            rate_limit_wait.clone(),
        );
        let time_to_verdict: HistogramFamily<ReasonLabels> =
            Family::new_with_constructor(time_to_verdict_histogram);
        registry.register(
            "time_to_verdict_seconds",
            "Seconds from a Machine's creation to its first False verdict, by reason",
            time_to_verdict.clone(),
        );
        let mass_failure_held = Family::<ScopeLabels, Gauge>::default();
        registry.register(
            "mass_failure_held",
            "1 while the mass-failure guard holds new False verdicts of a scope",
            mass_failure_held.clone(),
        );
        let kube_writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "kube_writes",
            "Writes to the API server by kind (condition, annotation, event) and result (ok or the error kind)",
            kube_writes.clone(),
        );
        let writes = Family::<WriteOutcomeLabels, Counter>::default();
        registry.register(
            "writes",
            "What became of each write the cycle decided, by kind and outcome (written, unchanged, failed, timed_out, dropped, refused)",
            writes.clone(),
        );
        let write_queue = Gauge::default();
        registry.register(
            "write_queue",
            "Writes queued for the writer task or being written",
            write_queue.clone(),
        );
        let cycle_duration = poll_histogram();
        registry.register(
            "cycle_duration_seconds",
            "Duration of one poll cycle (gather, poll, decide, act, report)",
            cycle_duration.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        let ready = Gauge::default();
        registry.register(
            "ready",
            "1 once discovery succeeded and the caches are synced",
            ready.clone(),
        );
        let probe_events = Family::<ProbeLabels, Counter>::default();
        registry.register(
            "probe_events",
            "Guest probe: attempts by answer (reply, no_reply, no_evidence), jobs started, router lookups, probes skipped for the budget, the in-flight cap or a busy router",
            probe_events.clone(),
        );
        let probe_in_flight = Gauge::default();
        registry.register(
            "probe_in_flight",
            "Guest probe jobs (runDiagnostics) started and not finished",
            probe_in_flight.clone(),
        );
        let probe_refused = Gauge::default();
        registry.register(
            "probe_refused",
            "1 while CloudStack refuses the guest probe's key (the probe is off until it changes)",
            probe_refused.clone(),
        );
        let orphan_vms = Family::<OrphanLabels, Gauge>::default();
        registry.register(
            "orphan_vms",
            "CloudStack VMs reported as owned by no CloudStackMachine (never deleted by the shim)",
            orphan_vms.clone(),
        );
        let remnant_objects = Family::<RemnantLabels, Gauge>::default();
        registry.register(
            "remnant_objects",
            "Objects of CAPC clusters left behind: stuck deleting, or their owner or Cluster gone (never deleted or patched by the shim)",
            remnant_objects.clone(),
        );
        let standing = standing::Standing::register(&mut registry);
        let memory = memory::MemoryGauges::register(&mut registry);
        let scorecard = scorecard::ScorecardSeries::register(&mut registry);
        let incidents = incidents::IncidentSeries::register(&mut registry);
        Self {
            standing,
            memory,
            scorecard,
            incidents,
            registry,
            verdicts,
            verdicts_seen: Mutex::new(BTreeSet::new()),
            transitions,
            escalations,
            poll_duration,
            cloudstack_calls,
            rate_limit_wait,
            time_to_verdict,
            mass_failure_held,
            kube_writes,
            writes,
            write_queue,
            cycle_duration,
            leader,
            ready,
            probe_events,
            probe_seen: Mutex::new(crate::status::ProbeCounts::default()),
            probe_in_flight,
            probe_refused,
            orphan_vms,
            orphans_seen: Mutex::new(BTreeMap::new()),
            remnant_objects,
            remnants_seen: Mutex::new(BTreeSet::new()),
            scopes_seen: Mutex::new(BTreeSet::new()),
        }
    }

    /// Sets `capc_health_verdicts` to the current counts; label sets that were set before
    /// and are missing from `counts` drop to 0 (the series stays, so rates and alerts see
    /// the drop instead of a gap).
    pub fn set_verdict_counts(&self, counts: &BTreeMap<(Status, String), i64>) {
        let mut seen = self
            .verdicts_seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (status, reason) in seen.iter() {
            if !counts.contains_key(&(*status, reason.clone())) {
                self.verdicts
                    .get_or_create(&verdict_labels(*status, reason))
                    .set(0);
            }
        }
        for ((status, reason), n) in counts {
            self.verdicts
                .get_or_create(&verdict_labels(*status, reason))
                .set(*n);
            seen.insert((*status, reason.clone()));
        }
    }

    /// One published verdict change to `status`/`reason`.
    pub fn record_transition(&self, status: Status, reason: &str) {
        self.transitions
            .get_or_create(&verdict_labels(status, reason))
            .inc();
    }

    /// One escalation decision: `annotated`, or the reason it was held.
    pub fn record_escalation(&self, result: &str) {
        self.escalations
            .get_or_create(&EscalationLabels {
                result: result.to_string(),
            })
            .inc();
    }

    /// Removes the series of scopes not in `scopes` and of clusters not in `clusters`
    /// (`namespace/name`): a deleted cluster or an unused scope leaves no label set behind.
    /// Orphan counts of live clusters and scopes still drop to 0 rather than vanish, and
    /// orphans still reported keep their series whatever their Cluster: VMs left behind by a
    /// cluster deletion name a Cluster that is gone ([`orphan_series_kept`]).
    pub fn forget_gone(&self, scopes: &BTreeSet<String>, clusters: &BTreeSet<String>) {
        let mut seen = lock(&self.scopes_seen);
        for scope in seen.iter().filter(|s| !scopes.contains(*s)) {
            let labels = ScopeLabels {
                scope: scope.clone(),
            };
            self.poll_duration.remove(&labels);
            self.mass_failure_held.remove(&labels);
            self.standing.scope_up.remove(&labels);
        }
        seen.retain(|s| scopes.contains(s));
        self.standing.forget_scopes(scopes);
        drop(seen);
        let mut orphans = lock(&self.orphans_seen);
        let kept = |l: &OrphanLabels, n: i64| orphan_series_kept(l, n, scopes, clusters);
        for (labels, _) in orphans.iter().filter(|(l, n)| !kept(l, **n)) {
            self.orphan_vms.remove(labels);
        }
        orphans.retain(|l, n| kept(l, *n));
    }

    fn saw_scope(&self, scope: &str) {
        let mut seen = lock(&self.scopes_seen);
        if !seen.contains(scope) {
            seen.insert(scope.to_string());
        }
    }

    /// How long one poll of `scope` took. Negative or non-finite durations are ignored.
    pub fn observe_poll(&self, scope: &str, seconds: f64) {
        self.saw_scope(scope);
        if usable(seconds) {
            self.poll_duration
                .get_or_create(&ScopeLabels {
                    scope: scope.to_string(),
                })
                .observe(seconds);
        }
    }

    /// `n` CloudStack calls of `command` that ended in `result` (e.g. `ok`, `timeout`).
    pub fn record_calls(&self, command: &str, result: &str, n: u64) {
        self.cloudstack_calls
            .get_or_create(&CallLabels {
                command: command.to_string(),
                result: result.to_string(),
            })
            .inc_by(n);
    }

    /// Time spent waiting for the request budget. Negative or non-finite values are ignored.
    pub fn record_rate_limit_wait(&self, seconds: f64) {
        if usable(seconds) {
            self.rate_limit_wait.inc_by(seconds);
        }
    }

    /// Seconds from a Machine's creation to its first `False` verdict with `reason`.
    /// Negative (clock skew) or non-finite values are ignored.
    pub fn observe_time_to_false(&self, reason: &str, seconds: f64) {
        if usable(seconds) {
            self.time_to_verdict
                .get_or_create(&ReasonLabels {
                    reason: reason.to_string(),
                })
                .observe(seconds);
        }
    }

    pub fn set_mass_failure_held(&self, scope: &str, held: bool) {
        self.saw_scope(scope);
        self.mass_failure_held
            .get_or_create(&ScopeLabels {
                scope: scope.to_string(),
            })
            .set(i64::from(held));
    }

    /// `n` writes of `kind` the cycle decided ended in `outcome` (see [`WriteOutcomeLabels`]).
    pub fn record_write_outcomes(&self, kind: &str, outcome: &str, n: u64) {
        self.writes
            .get_or_create(&WriteOutcomeLabels {
                kind: kind.to_string(),
                outcome: outcome.to_string(),
            })
            .inc_by(n);
    }

    /// One write of `kind` the cycle decided ended in `outcome`.
    pub fn record_write_outcome(&self, kind: &str, outcome: &str) {
        self.record_write_outcomes(kind, outcome, 1);
    }

    /// Writes queued for the writer task or being written.
    pub fn set_write_queue(&self, n: usize) {
        self.write_queue.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One write to the API server of `kind` that ended in `result` (`ok` or an error label).
    pub fn record_write(&self, kind: &str, result: &str) {
        self.kube_writes
            .get_or_create(&WriteLabels {
                kind: kind.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// How long one whole cycle took. Negative or non-finite durations are ignored.
    pub fn observe_cycle(&self, seconds: f64) {
        if usable(seconds) {
            self.cycle_duration.observe(seconds);
        }
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            // Writing into a String cannot fail; keep whatever was encoded if it ever does.
            tracing::warn!("encoding metrics failed: {e}");
        }
        out
    }
}

mod findings;
mod incidents;
mod memory;
mod scorecard;
mod standing;
pub use incidents::IncidentLabels;
pub use standing::{ClusterLabels, MachineLabels, PollFailureLabels};

#[cfg(test)]
mod tests;
