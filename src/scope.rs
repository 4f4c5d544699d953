//! A *scope* is one endpoint × project/account × zone: one paginated listing per poll,
//! matched to the tracked VMs client-side by id (one unknown id in `ids=` would fail the
//! whole batch with 431, so the shim never filters by id on the server).
//!
//! [`ScopeObserver`] is pure; [`poll`] is the one I/O step that feeds it (used by `check`
//! and by the controller alike).

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;

use crate::cloudstack::client::{CloudStackClient, VmListQuery};
use crate::cloudstack::error::CloudStackError;
use crate::cloudstack::model::{CsTime, UsageHistoryVm, VirtualMachine};
use crate::verdict::{Graces, PollOutcome, VmHistory};

/// One poll of a scope.
#[derive(Debug, Clone, Copy)]
pub enum ScopePoll<'a> {
    /// The listing came back; `complete` is false when some items could not be read or
    /// pages are missing, in which case a missing VM proves nothing.
    Listed {
        vms: &'a [VirtualMachine],
        complete: bool,
    },
    /// The listing failed (the error is already operator-readable and secret-free).
    Failed(&'a str),
}

/// The histories of the VMs of one scope.
#[derive(Debug, Clone, Default)]
pub struct ScopeObserver {
    pub histories: BTreeMap<String, VmHistory>,
    /// Track every VM the listing shows (the `check` command without `--vm`).
    pub track_all_listed: bool,
}

impl ScopeObserver {
    pub fn tracking(ids: impl IntoIterator<Item = String>) -> Self {
        Self {
            histories: ids
                .into_iter()
                .map(|id| (id.clone(), VmHistory::new(id)))
                .collect(),
            track_all_listed: false,
        }
    }

    pub fn tracking_all() -> Self {
        Self {
            histories: BTreeMap::new(),
            track_all_listed: true,
        }
    }

    /// Records one poll for every tracked VM.
    pub fn record(&mut self, poll: ScopePoll<'_>, now: Timestamp, graces: &Graces) {
        match poll {
            ScopePoll::Failed(error) => {
                for h in self.histories.values_mut() {
                    h.record(PollOutcome::Failed(error), now, graces);
                }
            }
            ScopePoll::Listed { vms, complete } => {
                let by_id: HashMap<&str, &VirtualMachine> =
                    vms.iter().map(|vm| (vm.id.as_str(), vm)).collect();
                if self.track_all_listed {
                    for vm in vms {
                        self.histories
                            .entry(vm.id.clone())
                            .or_insert_with(|| VmHistory::new(vm.id.clone()));
                    }
                }
                for (id, h) in self.histories.iter_mut() {
                    let outcome = match by_id.get(id.as_str()) {
                        Some(vm) => PollOutcome::Seen(vm),
                        None if complete => PollOutcome::Absent,
                        None => PollOutcome::Failed("the scope's listing was incomplete"),
                    };
                    h.record(outcome, now, graces);
                }
            }
        }
    }

    /// Merges usage-history samples into the matching histories.
    pub fn record_usage(&mut self, items: &[UsageHistoryVm], now: Timestamp) {
        for item in items {
            if let Some(h) = self.histories.get_mut(&item.id) {
                h.record_usage(&item.stats, now);
            }
        }
    }

    /// Running VMs whose listing counters do not prove activity: the only ones whose
    /// usage history (sample times) is worth fetching, so a healthy fleet costs no extra calls.
    pub fn usage_candidates(&self, graces: &Graces, now: Timestamp) -> Vec<String> {
        self.histories
            .values()
            .filter(|h| h.absent_polls == 0 && h.last_error.is_none())
            .filter(|h| {
                h.sighting.as_ref().is_some_and(|s| {
                    s.state == crate::cloudstack::model::VmState::Running && !s.host_unreachable()
                })
            })
            .filter(|h| !crate::verdict::engine::rose_recently(&h.traffic, graces, now))
            .map(|h| h.vm_id.clone())
            .collect()
    }
}

/// What one [`poll`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopePollReport {
    pub listing_error: Option<CloudStackError>,
    pub vms_listed: usize,
    pub complete: bool,
    /// Items of the listing that could not be read (the listing is then incomplete).
    pub unreadable: usize,
    /// Why usage history was not used this time, if it was wanted.
    pub usage_history_note: Option<String>,
}

/// Polls a scope once: one paginated listing, then the usage history of the VMs whose
/// listing counters do not prove activity. `usage_history` is switched off for good when
/// the server or the role does not have the API.
pub async fn poll(
    client: &CloudStackClient,
    observer: &mut ScopeObserver,
    query: &VmListQuery,
    graces: &Graces,
    usage_history: &mut bool,
    now: Timestamp,
) -> ScopePollReport {
    let mut out = ScopePollReport {
        listing_error: None,
        vms_listed: 0,
        complete: false,
        unreadable: 0,
        usage_history_note: None,
    };
    match client.list_virtual_machines(query).await {
        Ok(l) => {
            out.vms_listed = l.vms.len();
            out.complete = l.complete;
            out.unreadable = l.failures.len();
            observer.record(
                ScopePoll::Listed {
                    vms: &l.vms,
                    complete: l.complete,
                },
                now,
                graces,
            );
        }
        Err(e) => {
            observer.record(ScopePoll::Failed(&e.to_string()), now, graces);
            out.listing_error = Some(e);
            return out;
        }
    }
    if *usage_history {
        let ids = observer.usage_candidates(graces, now);
        if !ids.is_empty() {
            // Enough samples to judge silence, plus a little slack.
            let lookback = graces.stats_interval
                * i32::try_from(graces.silent_samples)
                    .unwrap_or(i32::MAX)
                    .saturating_add(3);
            match client
                .list_usage_history(&ids, Some(CsTime(now - lookback)))
                .await
            {
                Ok(items) => observer.record_usage(&items, now),
                Err(CloudStackError::Unsupported { .. }) => {
                    *usage_history = false;
                    out.usage_history_note = Some(
                        "usage history not available here; judging traffic from listing counters"
                            .into(),
                    );
                }
                Err(e) => {
                    out.usage_history_note = Some(format!("usage history skipped this poll: {e}"))
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudstack::model::VmState;

    fn vm(id: &str) -> VirtualMachine {
        serde_json::from_value(serde_json::json!({"id": id, "name": id, "state": "Running"}))
            .unwrap()
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    #[test]
    fn vms_are_matched_by_id_and_missing_ones_only_count_in_complete_listings() {
        let g = Graces::default();
        let mut o = ScopeObserver::tracking(["a".to_string(), "b".to_string()]);
        let listing = [vm("a"), vm("other")];
        o.record(
            ScopePoll::Listed {
                vms: &listing,
                complete: false,
            },
            at(0),
            &g,
        );
        assert_eq!(
            o.histories["a"].sighting.as_ref().unwrap().state,
            VmState::Running
        );
        assert_eq!(o.histories["b"].absent_polls, 0);
        assert!(o.histories["b"].last_error.is_some());
        assert!(!o.histories.contains_key("other"));
        o.record(
            ScopePoll::Listed {
                vms: &listing,
                complete: true,
            },
            at(30),
            &g,
        );
        assert_eq!(o.histories["b"].absent_polls, 1);
        assert!(o.histories["b"].last_error.is_none());
        assert_eq!(o.usage_candidates(&g, at(30)), vec!["a".to_string()]);
    }

    #[test]
    fn vms_with_rising_counters_need_no_usage_history() {
        let g = Graces::default();
        let mut o = ScopeObserver::tracking(["a".to_string(), "b".to_string()]);
        let with_tx = |id: &str, tx: u64| {
            let mut v = vm(id);
            v.networkkbswrite = Some(tx);
            v
        };
        o.record(
            ScopePoll::Listed {
                vms: &[with_tx("a", 10), with_tx("b", 10)],
                complete: true,
            },
            at(0),
            &g,
        );
        o.record(
            ScopePoll::Listed {
                vms: &[with_tx("a", 20), with_tx("b", 10)],
                complete: true,
            },
            at(30),
            &g,
        );
        assert_eq!(o.usage_candidates(&g, at(30)), vec!["b".to_string()]);
        // Long after the last rise, "a" is a candidate again.
        assert_eq!(o.usage_candidates(&g, at(600)).len(), 2);
    }

    #[test]
    fn a_failed_poll_reaches_every_tracked_vm() {
        let g = Graces::default();
        let mut o = ScopeObserver::tracking(["a".to_string()]);
        o.record(ScopePoll::Failed("timeout"), at(0), &g);
        assert_eq!(o.histories["a"].last_error.as_deref(), Some("timeout"));
    }

    #[test]
    fn tracking_all_picks_up_new_vms() {
        let g = Graces::default();
        let mut o = ScopeObserver::tracking_all();
        o.record(
            ScopePoll::Listed {
                vms: &[vm("a")],
                complete: true,
            },
            at(0),
            &g,
        );
        o.record(
            ScopePoll::Listed {
                vms: &[vm("b")],
                complete: true,
            },
            at(30),
            &g,
        );
        assert_eq!(o.histories.len(), 2);
        assert_eq!(o.histories["a"].absent_polls, 1);
    }
}
