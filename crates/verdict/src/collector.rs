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

/// Finds paused collections among `histories` (all VMs the shim polls on one CloudStack, so
/// that a host's VMs from different scopes are judged together) and marks their VMs' traffic;
/// clears the mark everywhere else. Idempotent for a given `now`.
pub fn mark_paused_collections<'a>(
    histories: impl IntoIterator<Item = &'a mut VmHistory>,
    g: &Graces,
    now: Timestamp,
) -> Vec<PausedCollection> {
    let mut by_host: BTreeMap<Option<String>, Vec<&'a mut VmHistory>> = BTreeMap::new();
    for h in histories {
        h.traffic.collection_paused_since = None;
        let Some(seen) = &h.sighting else { continue };
        let counted = h.absent_polls == 0
            && seen.state == VmState::Running
            && !seen.host_unreachable()
            && h.traffic.last_value.is_some();
        if counted {
            by_host.entry(seen.host_id.clone()).or_default().push(h);
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
}
