//! The statistics side of a scope poll: what the endpoint's statistics are
//! (`listCapabilities`, and whether its counter really is a sum), the id-filtered stats
//! listing for Machines without a Node, and the summary `/status` and `check` show.

use jiff::{SignedDuration, Timestamp};

use super::{ScopeObserver, ScopePollReport};
use crate::cloudstack::client::{CloudStackClient, VmListQuery};
use crate::cloudstack::model::VirtualMachine;
use crate::verdict::traffic::{cadence_in_force, inferred_cadence};
use crate::verdict::{Graces, StatsServer};
use std::collections::HashMap;

/// How often an endpoint's `listCapabilities` (version, stats retention) is read again.
const CAPABILITIES_EVERY: SignedDuration = SignedDuration::from_hours(1);
/// Usage history asked back at least this far: enough collections to infer the cadence even
/// when the server collects every 5 minutes (a common setting) while `--stats-interval` says 1.
const MIN_USAGE_LOOKBACK: SignedDuration = SignedDuration::from_mins(30);

impl ScopeObserver {
    /// Marks the endpoint as not summing rows once a VM younger than the retention shows its
    /// counter falling (it cannot, if rows are summed).
    pub(super) fn disprove_sums(&mut self, now: Timestamp) {
        let Some(server) = self.server.as_mut() else {
            return;
        };
        let Some(retention) = server.retention else {
            return;
        };
        if !self.sums_disproved
            && self
                .histories
                .values()
                .any(|h| h.counter_fell_while_young(retention, now))
        {
            self.sums_disproved = true;
            tracing::warn!(
                "a VM's accumulated traffic counter fell although none of its stats rows can \
                 have expired: this CloudStack does not honour accumulate=true, so flat \
                 counters are no evidence here"
            );
        }
        if self.sums_disproved {
            server.accumulates = false;
        }
    }

    /// What this scope's statistics look like: the cadence its usage-history rows show
    /// (the median over its VMs), the one windows are scaled with, and the server's
    /// semantics. For `/status` and `check`.
    pub fn stats_summary(&self, graces: &Graces) -> StatsSummary {
        let mut inferred: Vec<SignedDuration> = self
            .histories
            .values()
            .filter_map(|h| inferred_cadence(&h.traffic))
            .collect();
        inferred.sort();
        let cadence = inferred.get(inferred.len() / 2).copied();
        StatsSummary {
            inferred_interval_seconds: cadence.map(|c| c.as_secs()),
            interval_in_force_seconds: cadence
                .map_or(graces.stats_interval, |c| c.max(graces.stats_interval))
                .as_secs(),
            sums_rows: self.server.map(|s| s.accumulates),
            retention_minutes: self
                .server
                .and_then(|s| s.retention)
                .map(|r| r.as_secs() / 60),
        }
    }

    /// How far back to ask usage history: the silence window at the slowest cadence the
    /// candidates' rows show, plus slack, and never less than [`MIN_USAGE_LOOKBACK`].
    pub fn usage_lookback(&self, ids: &[String], graces: &Graces) -> SignedDuration {
        let cadence = ids
            .iter()
            .filter_map(|id| self.histories.get(id))
            .map(|h| cadence_in_force(&h.traffic, graces))
            .max()
            .unwrap_or(graces.stats_interval);
        let collections = i32::try_from(graces.silent_samples)
            .unwrap_or(i32::MAX)
            .saturating_add(3);
        (cadence * collections).max(MIN_USAGE_LOOKBACK)
    }
}

/// A scope's statistics as the shim reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatsSummary {
    /// `vm.stats.interval` as the usage-history timestamps show it (median over the VMs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inferred_interval_seconds: Option<i64>,
    /// The interval windows are scaled with: the inferred one, at least `--stats-interval`.
    pub interval_in_force_seconds: i64,
    /// The server sums stats rows (`accumulate`, 4.17+); `None` before `listCapabilities`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sums_rows: Option<bool>,
    /// `vm.stats.max.retention.time` as the server reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_minutes: Option<i64>,
}

impl std::fmt::Display for StatsSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.inferred_interval_seconds {
            Some(s) => write!(f, "stats every {s} s (from sample timestamps)")?,
            None => write!(f, "stats interval not seen in samples yet")?,
        }
        write!(f, ", windows at {} s", self.interval_in_force_seconds)?;
        match self.sums_rows {
            Some(true) => write!(f, ", counter sums stats rows")?,
            Some(false) => write!(
                f,
                ", counter is not a sum (before 4.17, or accumulate ignored)"
            )?,
            None => write!(f, ", server capabilities unknown")?,
        }
        if let Some(m) = self.retention_minutes {
            write!(f, ", rows kept {m} min")?;
        }
        Ok(())
    }
}

/// Reads the endpoint's `listCapabilities` when it was never read or an hour ago. A failure
/// leaves what was known (or nothing: then no flat counter decides silence).
pub(super) async fn refresh_capabilities(
    client: &CloudStackClient,
    observer: &mut ScopeObserver,
    out: &mut ScopePollReport,
    now: Timestamp,
) {
    let due = observer
        .server_checked
        .is_none_or(|t| now.duration_since(t) >= CAPABILITIES_EVERY);
    if !due {
        return;
    }
    observer.server_checked = Some(now);
    match client.list_capabilities().await {
        Ok(c) => {
            let mut server = StatsServer::from_capabilities(
                c.cloudstackversion.as_deref(),
                c.instancesstatsretentiontime,
            );
            server.accumulates &= !observer.sums_disproved;
            observer.server = Some(server);
        }
        Err(e) => out.capabilities_note = Some(format!("listCapabilities failed: {e}")),
    }
}

/// Asks statistics for the listed VMs that want them (Machines without a Node) in a second,
/// id-filtered listing and puts its answers in place of theirs. Every id was in the listing
/// a moment ago; one that vanished in between fails the batch (431), and then these VMs go
/// without stats this poll, which only delays a traffic verdict.
pub(super) async fn ask_stats(
    client: &CloudStackClient,
    observer: &ScopeObserver,
    query: &VmListQuery,
    vms: &mut [VirtualMachine],
    out: &mut ScopePollReport,
) {
    let ids: Vec<String> = vms
        .iter()
        .filter(|vm| {
            let id = super::lowercase(&vm.id);
            observer.histories.contains_key(id.as_ref()) && observer.wants_stats(&id)
        })
        .map(|vm| vm.id.clone())
        .collect();
    if ids.is_empty() {
        return;
    }
    out.stats_vms_asked = ids.len();
    let stats_query = VmListQuery {
        ids,
        with_stats: true,
        ..query.clone()
    };
    match client.list_virtual_machines(&stats_query).await {
        Ok(with_stats) => {
            let by_id: HashMap<String, VirtualMachine> = with_stats
                .vms
                .into_iter()
                .map(|vm| (vm.id.to_ascii_lowercase(), vm))
                .collect();
            for vm in vms.iter_mut() {
                if let Some(fresh) = by_id.get(super::lowercase(&vm.id).as_ref()) {
                    vm.networkkbswrite = fresh.networkkbswrite;
                    vm.networkkbsread = fresh.networkkbsread;
                    vm.cpuused = fresh.cpuused.clone();
                }
            }
        }
        Err(e) => out.stats_note = Some(format!("stats listing failed this poll: {e}")),
    }
}
