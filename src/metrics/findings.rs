//! What the watchers beside the verdicts found: orphan VMs, remnant objects of deleted
//! Machines, and the guest probe's jobs and replies.

use std::collections::BTreeMap;

use super::{lock, Metrics, OrphanLabels, ProbeLabels, RemnantLabels};
use crate::remnants::Remnant;
use crate::status::{OrphanReport, ProbeReport};

impl Metrics {
    /// Sets `capc_health_orphan_vms` to the reported orphans per cluster and scope; label sets
    /// set before and missing now drop to 0 (and go once their Cluster or scope is gone,
    /// [`Metrics::forget_gone`]).
    pub fn set_orphans(&self, orphans: &[OrphanReport]) {
        let mut counts: BTreeMap<OrphanLabels, i64> = BTreeMap::new();
        for o in orphans {
            let labels = OrphanLabels {
                cluster: o.cluster.clone().unwrap_or_default(),
                scope: o.scope.clone(),
            };
            *counts.entry(labels).or_default() += 1;
        }
        let mut seen = lock(&self.orphans_seen);
        for (labels, n) in seen.iter_mut() {
            if !counts.contains_key(labels) {
                self.orphan_vms.get_or_create(labels).set(0);
                *n = 0;
            }
        }
        for (labels, n) in counts {
            self.orphan_vms.get_or_create(&labels).set(n);
            seen.insert(labels, n);
        }
    }

    /// Sets `capc_health_remnant_objects` to the remnants per cluster and kind; label sets
    /// that have none now are removed.
    pub fn set_remnants(&self, remnants: &[Remnant]) {
        let mut counts: BTreeMap<RemnantLabels, i64> = BTreeMap::new();
        for r in remnants {
            let labels = RemnantLabels {
                cluster: r.cluster.clone().unwrap_or_default(),
                kind: r.kind.clone(),
            };
            *counts.entry(labels).or_default() += 1;
        }
        let mut seen = lock(&self.remnants_seen);
        for labels in seen.iter().filter(|l| !counts.contains_key(*l)) {
            self.remnant_objects.remove(labels);
        }
        seen.clear();
        for (labels, n) in counts {
            self.remnant_objects.get_or_create(&labels).set(n);
            seen.insert(labels);
        }
    }

    /// Brings the guest probe's metrics up to `report` (its counts only grow while the
    /// prober lives; a new prober, after a key change, starts them over and adds from 0).
    pub fn observe_probe(&self, report: &ProbeReport) {
        let mut guard = lock(&self.probe_seen);
        let seen = &mut *guard;
        let c = &report.counts;
        let pairs = [
            ("reply", c.replies, &mut seen.replies),
            ("no_reply", c.no_replies, &mut seen.no_replies),
            ("no_evidence", c.no_evidence, &mut seen.no_evidence),
            ("job_started", c.jobs_started, &mut seen.jobs_started),
            ("router_lookup", c.router_lookups, &mut seen.router_lookups),
            (
                "skipped_budget",
                c.skipped_for_budget,
                &mut seen.skipped_for_budget,
            ),
            (
                "skipped_in_flight_cap",
                c.skipped_in_flight_cap,
                &mut seen.skipped_in_flight_cap,
            ),
            (
                "skipped_router_busy",
                c.skipped_router_busy,
                &mut seen.skipped_router_busy,
            ),
        ];
        for (event, now, before) in pairs {
            let delta = if now >= *before { now - *before } else { now };
            if delta > 0 {
                self.probe_events
                    .get_or_create(&ProbeLabels {
                        event: event.to_string(),
                    })
                    .inc_by(delta);
            }
            *before = now;
        }
        self.probe_in_flight
            .set(i64::try_from(report.in_flight).unwrap_or(i64::MAX));
        self.probe_refused.set(i64::from(report.refused.is_some()));
    }
}
