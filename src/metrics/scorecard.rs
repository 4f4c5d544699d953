//! The scorecard's series (issue 44): a counter per outcome and reason, the boot baselines
//! per template, offering and zone, and the warnings that follow from them.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{lock, Metrics};
use crate::verdict::reason;
use crate::verdict::scorecard::{BaselineRow, Warning, OUTCOMES};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
    /// The reason of the `False` the outcome is about ("" when the shim had none).
    pub reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct BootLabels {
    pub template: String,
    pub offering: String,
    pub zone: String,
    /// `0.5`, `0.95` or `1` (the maximum).
    pub quantile: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct WarningLabels {
    /// `mhc-timeout-below-boot` or `template-slower`.
    pub warning: String,
    /// The MHC (`namespace/name`) or the template it is about.
    pub subject: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Debug, Default)]
pub(super) struct ScorecardSeries {
    outcomes: Family<OutcomeLabels, Counter>,
    boot_seconds: Family<BootLabels, FloatGauge>,
    boot_seen: Mutex<BTreeSet<BootLabels>>,
    warnings: Family<WarningLabels, Gauge>,
    warnings_seen: Mutex<BTreeSet<WarningLabels>>,
    memory_problem: Family<super::memory::ConfigMapLabels, Gauge>,
}

impl ScorecardSeries {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let s = Self::default();
        registry.register(
            "outcomes",
            "Machines whose story ended (or, still-stuck, went on too long) with each scorecard outcome, by the reason of the False it is about (docs/scorecard.md)",
            s.outcomes.clone(),
        );
        registry.register(
            "boot_to_node_seconds",
            "Machine creation → Node in the scorecard's current window, per template, offering and zone: p50, p95 and max (quantile 1)",
            s.boot_seconds.clone(),
        );
        registry.register(
            "scorecard_warnings",
            "1 per scorecard warning in force: an MHC whose nodeStartupTimeout is below the boot p95 × margin of Machines it covers, a template whose boot p95 doubled",
            s.warnings.clone(),
        );
        registry.register(
            "scorecard_memory_problem",
            "1 while the scorecard's counts are not kept for the next leader: its stored copy cannot be read (nothing is written), a write fails, or an unreadable copy is kept aside",
            s.memory_problem.clone(),
        );
        // Every outcome and reason at 0 from the start: an alert on the counter's increase
        // sees the first one of a new process (a series born at 1 shows no increase).
        for outcome in OUTCOMES {
            for r in reason::ALL.iter().chain(&[""]) {
                let _ = s.outcomes.get_or_create(&OutcomeLabels {
                    outcome: outcome.to_string(),
                    reason: r.to_string(),
                });
            }
        }
        s
    }
}

impl Metrics {
    pub fn count_outcome(&self, outcome: &str, reason: &str) {
        self.scorecard
            .outcomes
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The baselines and warnings as they stand; series of keys and warnings gone are removed.
    pub fn set_scorecard(&self, rows: &[BaselineRow], warnings: &[Warning]) {
        let s = &self.scorecard;
        let mut boot = BTreeSet::new();
        for row in rows {
            let Some(summary) = row.from_creation else {
                continue;
            };
            for (q, v) in [
                ("0.5", summary.p50),
                ("0.95", summary.p95),
                ("1", summary.max),
            ] {
                let l = BootLabels {
                    template: row.key.template.clone(),
                    offering: row.key.offering.clone(),
                    zone: row.key.zone.clone(),
                    quantile: q.to_string(),
                };
                s.boot_seconds.get_or_create(&l).set(v);
                boot.insert(l);
            }
        }
        let mut seen = lock(&s.boot_seen);
        for gone in seen.difference(&boot) {
            s.boot_seconds.remove(gone);
        }
        *seen = boot;
        let now: BTreeSet<WarningLabels> = warnings.iter().map(warning_labels).collect();
        let mut seen = lock(&s.warnings_seen);
        for gone in seen.difference(&now) {
            s.warnings.remove(gone);
        }
        for l in &now {
            s.warnings.get_or_create(l).set(1);
        }
        *seen = now;
    }
}

impl Metrics {
    pub fn set_scorecard_memory(&self, m: &crate::status::ScorecardMemoryReport) {
        let labels = super::memory::ConfigMapLabels {
            configmap: m.configmap.clone(),
        };
        self.scorecard
            .memory_problem
            .get_or_create(&labels)
            .set(i64::from(m.troubled()));
    }
}

fn warning_labels(w: &Warning) -> WarningLabels {
    match w {
        Warning::MhcTimeoutBelowBoot { mhc, .. } => WarningLabels {
            warning: "mhc-timeout-below-boot".into(),
            subject: mhc.clone(),
        },
        Warning::TemplateSlower { template, .. } => WarningLabels {
            warning: "template-slower".into(),
            subject: template.clone(),
        },
    }
}
