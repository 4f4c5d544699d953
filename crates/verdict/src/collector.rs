//! Telling a paused stats collector from silent guests.
//!
//! The listing's traffic counters are what CloudStack's stats collector last read from the
//! hypervisor; the listing carries no sample time. When the collector skips a host (agent
//! busy, management server overloaded), every VM on that host looks flat at once — the same
//! picture as a guest that stopped transmitting. One guest going quiet is evidence; every
//! guest of a host going quiet in the same collection, while each of them had been sending
//! steadily, is a collector that stopped looking. "Could not see" must not become "unhealthy",
//! so while a host looks paused, flat time after the pause began counts for nothing.
//!
//! The counters are cumulative, so nothing is lost: once the collector reads the host again,
//! a counter that is still flat covers the whole pause, and the silent window counts again.
//!
//! Grouping is by `hostid`. Keys that do not see `hostid` (CloudStack shows it to root
//! admins) put all their VMs in one group, so only a pause that covers all of them is seen.
//!
//! Only what was just seen counts ([`fresh_witness`]): a VM whose scope could not be listed
//! keeps its last sighting and a frozen last rise, which would read as a steady guest gone
//! flat — and hosts are shared by the tenants of an endpoint, so one tenant's revoked key
//! would make another tenant's silent guest look like a paused collection, for good.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::{Graces, VmHistory};
use cloudstack_api::model::VmState;

/// How many VMs with steady traffic must go flat together before a pause is assumed. Two:
/// one VM going quiet is exactly the fault the shim looks for.
pub const MIN_WITNESSES: usize = 2;

/// A host (or, without host ids, a whole group) whose stats look paused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PausedCollection {
    /// `None` for the group of VMs without a host id.
    pub host_id: Option<String>,
    /// The newest rise on the host: the collector was still reading it then.
    pub since: Timestamp,
    /// VMs with steady traffic that went flat within one freshness window of each other.
    pub witnesses: usize,
    /// Running VMs on the host with listing counters.
    pub vms: usize,
}

/// What the pause decision needs from one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterView {
    pub last_rise: Option<Timestamp>,
    pub rises: u32,
}

/// A VM whose counter rose at enough polls to count as steady traffic: a guest that only
/// sent its boot traffic (the typical NIC-down VM) never becomes a witness.
pub fn is_steady(v: &CounterView, g: &Graces) -> bool {
    v.rises > g.silent_samples
}

/// Whether one host's VMs look like a paused collection at `now`, and since when.
pub fn paused_since(vms: &[CounterView], g: &Graces, now: Timestamp) -> Option<(Timestamp, usize)> {
    let fresh = g.stats_fresh_within();
    let newest = vms.iter().filter_map(|v| v.last_rise).max()?;
    if now.duration_since(newest) <= fresh {
        // Someone on the host is still rising: the collector is reading it.
        return None;
    }
    let witnesses = vms
        .iter()
        .filter(|v| is_steady(v, g))
        .filter(|v| {
            v.last_rise
                .is_some_and(|r| newest.duration_since(r) <= fresh)
        })
        .count();
    (witnesses >= MIN_WITNESSES).then_some((newest, witnesses))
}

/// Whether `h` takes part in judging its host's collection at `now`: a Running VM on a
/// reachable host, with counters, seen by a successful poll of its scope no longer ago than
/// the stale-poll age. A history whose latest poll failed (a revoked key, an outage, an
/// incomplete listing) says nothing about the collection now.
pub fn fresh_witness(h: &VmHistory, g: &Graces, now: Timestamp) -> bool {
    let Some(seen) = &h.sighting else {
        return false;
    };
    h.last_error.is_none()
        && h.absent_polls == 0
        && h.last_success
            .is_some_and(|t| now.duration_since(t) <= g.stale_after())
        && seen.state == VmState::Running
        && !seen.host_unreachable()
        && h.traffic.last_value.is_some()
}

/// Finds paused collections among `histories` (all VMs the shim polls on one CloudStack, so
/// that a host's VMs from different scopes are judged together) and marks their VMs' traffic;
/// clears the mark everywhere else. Only [`fresh_witness`]es are judged or marked. Idempotent
/// for a given `now`.
pub fn mark_paused_collections<'a>(
    histories: impl IntoIterator<Item = &'a mut VmHistory>,
    g: &Graces,
    now: Timestamp,
) -> Vec<PausedCollection> {
    let mut by_host: BTreeMap<Option<String>, Vec<&'a mut VmHistory>> = BTreeMap::new();
    for h in histories {
        h.traffic.collection_paused_since = None;
        if fresh_witness(h, g, now) {
            let host = h.sighting.as_ref().and_then(|s| s.host_id.clone());
            by_host.entry(host).or_default().push(h);
        }
    }
    let mut paused = Vec::new();
    for (host_id, members) in by_host {
        let views: Vec<CounterView> = members
            .iter()
            .map(|h| CounterView {
                last_rise: h.traffic.last_rise,
                rises: h.traffic.rises,
            })
            .collect();
        if let Some((since, witnesses)) = paused_since(&views, g, now) {
            paused.push(PausedCollection {
                host_id,
                since,
                witnesses,
                vms: members.len(),
            });
            for h in members {
                h.traffic.collection_paused_since = Some(since);
            }
        }
    }
    paused
}

#[cfg(test)]
mod tests {
    use jiff::SignedDuration;

    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap() + SignedDuration::from_secs(secs)
    }

    fn view(last_rise: Option<i64>, rises: u32) -> CounterView {
        CounterView {
            last_rise: last_rise.map(t),
            rises,
        }
    }

    #[test]
    fn steady_vms_going_flat_together_is_a_pause() {
        let g = Graces::default();
        let vms = [view(Some(100), 20), view(Some(130), 9), view(Some(40), 1)];
        assert_eq!(paused_since(&vms, &g, t(400)), Some((t(130), 2)));
    }

    #[test]
    fn one_vm_still_rising_means_the_collector_reads_the_host() {
        let g = Graces::default();
        let vms = [view(Some(100), 20), view(Some(130), 9), view(Some(390), 30)];
        assert_eq!(paused_since(&vms, &g, t(400)), None);
    }

    #[test]
    fn a_single_quiet_vm_is_evidence_not_a_pause() {
        let g = Graces::default();
        let vms = [view(Some(100), 20)];
        assert_eq!(paused_since(&vms, &g, t(400)), None);
    }

    #[test]
    fn vms_that_only_sent_boot_traffic_are_no_witnesses() {
        // Two NIC-down VMs booted together on an otherwise empty host.
        let g = Graces::default();
        let vms = [view(Some(60), 2), view(Some(90), 1)];
        assert_eq!(paused_since(&vms, &g, t(600)), None);
    }

    #[test]
    fn vms_that_stopped_far_apart_are_no_common_pause() {
        // One steady VM hung long ago, another just now: two faults, not one pause.
        let g = Graces::default();
        let vms = [view(Some(100), 20), view(Some(2_000), 20)];
        assert_eq!(paused_since(&vms, &g, t(2_300)), None);
    }

    use crate::history::PollOutcome;
    use cloudstack_api::model::VirtualMachine;

    fn running_on(host: &str, tx: u64) -> VirtualMachine {
        let mut v = crate::tests::vm(VmState::Running);
        v.hostid = Some(host.into());
        v.networkkbswrite = Some(tx);
        v
    }

    /// Two tenants share `host-1`: tenant A's two steady guests, tenant B's one guest, all
    /// polled every 30 s and rising by 10 KiB a minute. At 600 s B's guest goes silent and
    /// A's key is revoked (A's polls fail from then on). Returns whether a pause was ever
    /// marked on B's guest, polling until `until`.
    fn revoked_neighbour(until: i64, a_fails_from: i64) -> bool {
        let g = Graces::default();
        let mut a = [VmHistory::new("a-1"), VmHistory::new("a-2")];
        let mut b = VmHistory::new("b-1");
        let mut marked = false;
        for secs in (0..=until).step_by(30) {
            let now = t(secs);
            let tx = 100 + 10 * (secs / 60) as u64;
            for h in &mut a {
                if secs >= a_fails_from {
                    h.record(PollOutcome::Failed("unauthorized (401)"), now, &g);
                } else {
                    h.record(PollOutcome::Seen(&running_on("host-1", tx)), now, &g);
                }
            }
            let b_tx = 100 + 10 * (secs.min(600) / 60) as u64;
            b.record(PollOutcome::Seen(&running_on("host-1", b_tx)), now, &g);
            let all = a.iter_mut().chain(std::iter::once(&mut b));
            mark_paused_collections(all, &g, now);
            marked |= b.traffic.collection_paused_since.is_some();
        }
        marked
    }

    #[test]
    fn a_history_whose_last_poll_failed_is_no_witness() {
        let g = Graces::default();
        let mut h = VmHistory::new("vm-1");
        assert!(!fresh_witness(&h, &g, t(0)), "never seen");
        h.record(PollOutcome::Seen(&running_on("host-1", 100)), t(0), &g);
        assert!(fresh_witness(&h, &g, t(0)));
        // Seen, but not lately: the stale-poll age is the limit.
        assert!(fresh_witness(&h, &g, t(0) + g.stale_after()));
        assert!(!fresh_witness(
            &h,
            &g,
            t(0) + g.stale_after() + SignedDuration::from_secs(1)
        ));
        h.record(PollOutcome::Failed("unauthorized (401)"), t(30), &g);
        assert!(h.sighting.is_some() && h.absent_polls == 0);
        assert!(!fresh_witness(&h, &g, t(30)));
        h.record(PollOutcome::Seen(&running_on("host-1", 110)), t(60), &g);
        assert!(fresh_witness(&h, &g, t(60)));
        h.record(PollOutcome::Absent, t(90), &g);
        assert!(!fresh_witness(&h, &g, t(90)));
    }

    #[test]
    fn a_tenant_whose_key_was_revoked_does_not_blind_the_others_on_its_host() {
        assert!(
            !revoked_neighbour(1_800, 600),
            "A's frozen histories witnessed a pause on B's silent guest"
        );
    }

    #[test]
    fn the_same_two_tenants_listed_while_flat_together_are_a_pause() {
        // The control: A's guests seen flat by successful polls together with B's is what a
        // paused collection looks like, and is still recognised.
        let g = Graces::default();
        let mut hs = [
            VmHistory::new("a-1"),
            VmHistory::new("a-2"),
            VmHistory::new("b-1"),
        ];
        let mut marked = false;
        for secs in (0..=1_200).step_by(30) {
            let tx = 100 + 10 * (secs.min(600) / 60) as u64;
            for h in &mut hs {
                h.record(PollOutcome::Seen(&running_on("host-1", tx)), t(secs), &g);
            }
            marked |= !mark_paused_collections(hs.iter_mut(), &g, t(secs)).is_empty();
        }
        assert!(marked);
    }
}
