//! A *scope* is one endpoint × project/account × zone: one paginated listing per poll,
//! matched to the tracked VMs client-side by id (one unknown id in `ids=` would fail the
//! whole batch with 431, so the scope's listing never filters by id; only the stats listing
//! does, with ids the listing has just shown — see [`stats`]).
//!
//! [`Scope`] is what `check` and the controller both hold per scope: its client, its listing
//! and the [`ScopeObserver`] (pure) that the one I/O step, [`Scope::poll`], feeds.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use jiff::Timestamp;

use crate::cloudstack::client::{CloudStackClient, VmListQuery};
use crate::cloudstack::error::CloudStackError;
use crate::cloudstack::model::{VirtualMachine, VmState};
use crate::verdict::traffic::counter_cadence;
use crate::verdict::{Graces, PollOutcome, StatsServer, VmHistory};

mod stats;
mod usage;
pub use stats::StatsSummary;
use stats::{ask_stats, refresh_capabilities};
use usage::ask_usage_history;

/// One scope as it is polled: the client (with its rate limit and back-off), the listing's
/// query, and the histories of the VMs it tracks. The controller keeps one per endpoint scope
/// between cycles (with its own bookkeeping around it); `check` keeps one for its run.
#[derive(Debug)]
pub struct Scope {
    pub client: CloudStackClient,
    pub query: VmListQuery,
    pub observer: ScopeObserver,
    /// Usage history is asked while this is on; switched off for good when the server or the
    /// role does not have the API.
    pub usage_history: bool,
}

impl Scope {
    pub fn new(
        client: CloudStackClient,
        query: VmListQuery,
        observer: ScopeObserver,
        usage_history: bool,
    ) -> Self {
        Self {
            client,
            query,
            observer,
            usage_history,
        }
    }

    /// Polls the scope once: one paginated listing, then the usage history of the VMs whose
    /// listing counters do not prove activity.
    pub async fn poll(&mut self, graces: &Graces, now: Timestamp) -> ScopePollReport {
        self.poll_until(graces, now, None).await
    }

    /// [`Scope::poll`], with the usage history asked only until `deadline`: what came back by
    /// then is kept, the rest waits for the next poll. The listing is the evidence; usage
    /// history only a liveness hint, so running out of time on it is no failed poll (at
    /// 10 000 new VMs, ten per request behind the rate limit, it once took minutes).
    pub async fn poll_until(
        &mut self,
        graces: &Graces,
        now: Timestamp,
        deadline: Option<tokio::time::Instant>,
    ) -> ScopePollReport {
        poll(
            &self.client,
            &mut self.observer,
            &self.query,
            graces,
            &mut self.usage_history,
            now,
            deadline,
        )
        .await
    }
}

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

/// The VM histories of a scope, by VM id. Boxed: a history is ~900 bytes, and a B-tree keeps
/// its values in nodes of eleven slots that are a third empty on average (at 10 000 VMs, 14 MB
/// of nodes instead of 9 MB of histories).
pub type Histories = BTreeMap<String, Box<VmHistory>>;

/// The histories of the VMs of one scope.
#[derive(Debug, Clone, Default)]
pub struct ScopeObserver {
    pub histories: Histories,
    /// Track every VM the listing shows (the `check` command without `--vm`).
    pub track_all_listed: bool,
    /// The VMs whose traffic statistics are worth asking for (Machines without a Node);
    /// `None`: every tracked VM.
    pub stats_wanted: Option<BTreeSet<String>>,
    /// The endpoint's statistics semantics, from its `listCapabilities`.
    pub server: Option<StatsServer>,
    /// When `listCapabilities` was last asked.
    pub server_checked: Option<Timestamp>,
    /// A young VM's counter fell: this endpoint does not sum rows whatever its version says
    /// (it ignored `accumulate`). Sticky: a later `listCapabilities` does not undo it.
    pub sums_disproved: bool,
    /// Keep every listed VM's id, name and state in the poll's report (the orphan report
    /// reads them; nothing else needs the VMs no Machine tracks).
    pub keep_listing: bool,
    /// The last VM whose usage history a poll cut short by its deadline asked: the next poll
    /// goes on after it.
    pub usage_cursor: Option<String>,
}

/// One VM of a scope's listing, as the orphan report needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedVm {
    /// Lowercased, as the CloudStackMachines' `instanceID`s are read.
    pub id: String,
    pub name: String,
    pub state: VmState,
}

impl From<VirtualMachine> for ListedVm {
    fn from(vm: VirtualMachine) -> Self {
        let mut id = vm.id;
        id.make_ascii_lowercase();
        Self {
            id,
            name: vm.name,
            state: vm.state,
        }
    }
}

impl ScopeObserver {
    pub fn tracking(ids: impl IntoIterator<Item = String>) -> Self {
        Self {
            histories: ids
                .into_iter()
                .map(|id| (id.clone(), Box::new(VmHistory::new(id))))
                .collect(),
            ..Self::default()
        }
    }

    pub fn tracking_all() -> Self {
        Self {
            track_all_listed: true,
            ..Self::default()
        }
    }

    /// Whether this VM's statistics are asked for.
    pub fn wants_stats(&self, vm_id: &str) -> bool {
        self.stats_wanted
            .as_ref()
            .is_none_or(|wanted| wanted.contains(vm_id))
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
                // CloudStack's ids compare case-insensitively; histories are keyed lowercased
                // (as the CloudStackMachines' instanceIDs are read).
                // (Borrowed when already lowercase, as CloudStack's uuids are: no copy per VM.)
                let by_id: HashMap<Cow<'_, str>, &VirtualMachine> =
                    vms.iter().map(|vm| (lowercase(&vm.id), vm)).collect();
                if self.track_all_listed {
                    for id in by_id.keys() {
                        if !self.histories.contains_key(id.as_ref()) {
                            self.histories
                                .insert(id.to_string(), Box::new(VmHistory::new(id.as_ref())));
                        }
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
                self.disprove_sums(now);
                let cadence = counter_cadence(self.histories.values().map(|h| &h.traffic));
                for h in self.histories.values_mut() {
                    h.traffic.server = self.server;
                    h.traffic.counter_cadence = cadence;
                }
            }
        }
    }
}

/// `id` lowercased, borrowed when it already is.
pub(crate) fn lowercase(id: &str) -> Cow<'_, str> {
    if id.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(id.to_ascii_lowercase())
    } else {
        Cow::Borrowed(id)
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
    /// VMs whose statistics were asked (a stats listing sums stored rows for each of them).
    pub stats_vms_asked: usize,
    /// Why the statistics of the VMs without a Node are missing this poll, if they are.
    pub stats_note: Option<String>,
    /// Why the endpoint's capabilities are not known, if reading them failed.
    pub capabilities_note: Option<String>,
    /// Every listed VM, when the observer keeps the listing (`None` when it does not, or the
    /// listing failed).
    pub listed: Option<Vec<ListedVm>>,
}

/// [`Scope::poll`], over the scope's parts.
async fn poll(
    client: &CloudStackClient,
    observer: &mut ScopeObserver,
    query: &VmListQuery,
    graces: &Graces,
    usage_history: &mut bool,
    now: Timestamp,
    deadline: Option<tokio::time::Instant>,
) -> ScopePollReport {
    let mut out = ScopePollReport {
        listing_error: None,
        vms_listed: 0,
        complete: false,
        unreadable: 0,
        usage_history_note: None,
        stats_vms_asked: 0,
        stats_note: None,
        capabilities_note: None,
        listed: None,
    };
    refresh_capabilities(client, observer, &mut out, now).await;
    let wants_all = observer.stats_wanted.is_none();
    let listing_query = VmListQuery {
        with_stats: wants_all,
        ..query.clone()
    };
    let mut listing = match client.list_virtual_machines(&listing_query).await {
        Ok(l) => l,
        Err(e) => {
            observer.record(ScopePoll::Failed(&e.stable_summary()), now, graces);
            out.listing_error = Some(e);
            return out;
        }
    };
    if wants_all {
        out.stats_vms_asked = listing.vms.len();
    } else {
        ask_stats(client, observer, query, &mut listing.vms, &mut out).await;
    }
    out.vms_listed = listing.vms.len();
    out.complete = listing.complete;
    out.unreadable = listing.failures.len();
    observer.record(
        ScopePoll::Listed {
            vms: &listing.vms,
            complete: listing.complete,
        },
        now,
        graces,
    );
    if observer.keep_listing {
        // The VMs are not needed after this: their ids and names move, not copy.
        out.listed = Some(listing.vms.into_iter().map(ListedVm::from).collect());
    }
    if *usage_history {
        ask_usage_history(
            client,
            observer,
            graces,
            usage_history,
            now,
            deadline,
            &mut out,
        )
        .await;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudstack::model::{CsTime, UsageHistoryVm};

    fn vm(id: &str) -> VirtualMachine {
        serde_json::from_value(
            serde_json::json!({"id": id, "name": id, "state": "Running", "hypervisor": "KVM"}),
        )
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
    fn vm_ids_match_whatever_their_case() {
        // instanceIDs are read lowercased; a CloudStack answering in capitals must not make
        // its VMs look missing (VMNotFound after two polls).
        let g = Graces::default();
        let id = "1d8d87d4-1425-459c-8d81-c6f57dca2bd2";
        let mut o = ScopeObserver::tracking([id.to_string()]);
        let listing = [vm(&id.to_ascii_uppercase())];
        for t in [0, 30] {
            o.record(
                ScopePoll::Listed {
                    vms: &listing,
                    complete: true,
                },
                at(t),
                &g,
            );
        }
        assert_eq!(o.histories[id].absent_polls, 0);
        assert!(o.histories[id].sighting.is_some());
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
    fn only_wanted_kvm_vms_are_usage_candidates() {
        let g = Graces::default();
        let mut o = ScopeObserver::tracking(["a", "b", "c"].map(String::from));
        o.stats_wanted = Some(["a".to_string(), "c".to_string()].into());
        let mut vmware = vm("c");
        vmware.hypervisor = Some("VMware".into());
        o.record(
            ScopePoll::Listed {
                vms: &[vm("a"), vm("b"), vmware],
                complete: true,
            },
            at(0),
            &g,
        );
        // b has a Node (not wanted), c is on VMware (not judged by default).
        assert_eq!(o.usage_candidates(&g, at(0)), vec!["a".to_string()]);
    }

    #[test]
    fn a_vm_missing_from_the_usage_answer_is_recorded_as_not_visible() {
        let g = Graces::default();
        let mut o = ScopeObserver::tracking(["a", "b"].map(String::from));
        o.record(
            ScopePoll::Listed {
                vms: &[vm("a"), vm("b")],
                complete: true,
            },
            at(0),
            &g,
        );
        let answer: Vec<UsageHistoryVm> = serde_json::from_value(serde_json::json!([
            {"id": "a", "stats": [
                {"timestamp": "2027-01-15T07:59:00+0000", "networkkbswrite": 0},
                {"timestamp": "2027-01-15T08:00:00+0000", "networkkbswrite": 3}
            ]}
        ]))
        .unwrap();
        let asked = ["a".to_string(), "b".to_string()];
        let since = "2027-01-15T07:59:30Z".parse().unwrap();
        o.record_usage(&asked, &answer, since, at(0));
        // Rows older than `since` are dropped (a date-only server sends a whole day).
        let rows = o.histories["a"].traffic.rows.as_ref().unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].1, 3);
        assert_eq!(o.histories["b"].traffic.rows, None);
        assert!(o.histories["b"].traffic.rows_fetched.is_some());
    }

    #[test]
    fn a_young_vms_falling_counter_disproves_summing_for_the_endpoint() {
        let g = Graces::default();
        let mut o = ScopeObserver::tracking(["a", "b"].map(String::from));
        o.server = Some(StatsServer::from_capabilities(Some("4.19.0.0"), Some(720)));
        let listed = |tx: u64| {
            let mut v = vm("a");
            v.networkkbswrite = Some(tx);
            v.created = Some(CsTime(at(-600)));
            let mut w = vm("b");
            w.networkkbswrite = Some(7);
            w.created = Some(CsTime(at(-600)));
            [v, w]
        };
        for (t, tx) in [(0, 30), (30, 45)] {
            o.record(
                ScopePoll::Listed {
                    vms: &listed(tx),
                    complete: true,
                },
                at(t),
                &g,
            );
        }
        assert!(o.histories["b"].traffic.server.unwrap().accumulates);
        // a shows one interval's value, not a sum: it goes down.
        o.record(
            ScopePoll::Listed {
                vms: &listed(12),
                complete: true,
            },
            at(60),
            &g,
        );
        assert!(o.sums_disproved);
        assert!(!o.histories["b"].traffic.server.unwrap().accumulates);
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
