//! A VM's guest traffic over time: which [`Plan`] its guest kind, faults and profile override
//! give, and the segments that "fold" the true byte counters when that changes (the bytes at
//! the change become the new base, the new plan applies from then on).

use crate::traffic::{disk_bytes, Plan, Profile};

use super::{Ctx, Fault, GuestKind, Ms, Vm, VmState};

/// One stretch of time with one plan: bytes(t) = base + plan(t − anchor) − plan(start − anchor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    pub start_ms: Ms,
    pub anchor_ms: Ms,
    pub plan: Plan,
    base: (u64, u64),
    off: (u64, u64),
}

/// Segments kept per VM (older ones are only needed to look one interval back).
const MAX_SEGS: usize = 8;

/// True hypervisor counters at one instant (since the VM started running): network rx/tx and
/// disk read/write bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    pub rx: u64,
    pub tx: u64,
    pub disk_read: u64,
    pub disk_write: u64,
}

impl Vm {
    /// The plan the guest follows and its anchor, given its kind, faults and override, for a
    /// change at `now` (or the start of running when `now` is `running_since`).
    fn traffic_plan(&self, now: Ms, c: &Ctx) -> (Ms, Plan) {
        let rs = self.running_since.unwrap_or(now);
        let t = c.timing;
        let boot = (Profile::Boot, t.boot_ms);
        if self.has(Fault::DetachNic) {
            return (now, Plan::constant(Profile::Silent, t));
        }
        if self.has(Fault::NicDown) {
            return match self.nic_down_since.filter(|s| *s > rs) {
                Some(since) => (since, Plan::constant(Profile::NicDown, t)),
                // NIC down right after boot: only the DHCP exchange got out.
                None => (
                    rs,
                    Plan::new(&[(Profile::Boot, t.dhcp_ms()), (Profile::NicDown, 0)], t),
                ),
            };
        }
        // No gateway (`World::gateway_lost_since`): ARP for the gateway and retried
        // connections only, whatever the guest would do otherwise.
        if let Some(since) = self.gateway_lost_since {
            return (
                since.max(rs),
                Plan::constant(Profile::WaitingForEndpointArp, t),
            );
        }
        if let Some(p) = self.profile_override {
            return (self.override_since.max(rs), Plan::constant(p, t));
        }
        let plan = if self.has(Fault::ServicesFail) {
            Plan::new(&[boot, (Profile::Quiet, 0)], t)
        } else if self.has(Fault::SlowBoot) {
            Plan::new(
                &[
                    boot,
                    (Profile::WaitingForEndpoint, c.slow_ms - t.boot_ms),
                    (Profile::KubeadmJoin, t.join_ms),
                    (Profile::IdleJoined, 0),
                ],
                t,
            )
        } else if self.guest == GuestKind::Waiting {
            Plan::new(&[boot, (Profile::WaitingForEndpoint, 0)], t)
        } else {
            Plan::new(
                &[
                    boot,
                    (Profile::KubeadmJoin, t.join_ms),
                    (Profile::IdleJoined, 0),
                ],
                t,
            )
        };
        (rs, plan)
    }

    fn seg_at(&self, t: Ms) -> Option<&Seg> {
        self.segs.iter().rev().find(|s| s.start_ms <= t)
    }

    /// True network bytes (rx, tx) the guest moved between starting to run and `t`.
    pub fn true_bytes(&self, t: Ms) -> (u64, u64) {
        match self.seg_at(t) {
            None => (0, 0),
            Some(s) => {
                let (r, x) = s.plan.bytes(t - s.anchor_ms);
                (
                    s.base.0 + r.saturating_sub(s.off.0),
                    s.base.1 + x.saturating_sub(s.off.1),
                )
            }
        }
    }

    /// The traffic profile in force at `t` (None before the VM ran).
    pub fn profile_at(&self, t: Ms) -> Option<Profile> {
        self.seg_at(t).map(|s| s.plan.profile_at(t - s.anchor_ms))
    }

    /// The profile set explicitly (admin API or scenario), if any.
    pub fn profile_override(&self) -> Option<Profile> {
        self.profile_override
    }

    /// All hypervisor counters at `t`.
    pub(super) fn reading(&self, t: Ms, c: &Ctx) -> Reading {
        let (rx, tx) = self.true_bytes(t);
        let (disk_read, disk_write) = match self.running_since {
            Some(rs) if t > rs => disk_bytes(t - rs, c.timing),
            _ => (0, 0),
        };
        Reading {
            rx,
            tx,
            disk_read,
            disk_write,
        }
    }

    /// Starts a new segment at `t` with the plan the VM's flags give now.
    fn fold(&mut self, t: Ms, c: &Ctx) {
        let base = self.true_bytes(t);
        let (anchor, plan) = self.traffic_plan(t, c);
        let off = plan.bytes(t - anchor);
        // Keep what is needed to look two intervals back (VMware/XenServer averages).
        let keep_from = t - 2 * c.interval_ms.max(60_000);
        self.segs.retain(|s| s.start_ms < t);
        if let Some(first) = self.segs.iter().rposition(|s| s.start_ms <= keep_from) {
            self.segs.drain(..first);
        }
        if self.segs.len() >= MAX_SEGS {
            self.segs.remove(0);
        }
        self.segs.push(Seg {
            start_ms: t,
            anchor_ms: anchor,
            plan,
            base,
            off,
        });
    }

    /// The guest starts running at `t`: counters (tap devices) start from 0.
    pub(super) fn start_traffic(&mut self, t: Ms, c: &Ctx) {
        self.segs.clear();
        self.kvm_prev = None;
        self.fold(t, c);
    }

    /// Applies `f` to the VM's flags at `t`; a running guest's traffic follows the new plan
    /// from `t` on.
    pub(super) fn change_flags(&mut self, t: Ms, c: &Ctx, f: impl FnOnce(&mut Self)) {
        f(self);
        if self.state == VmState::Running || self.state == VmState::Migrating {
            self.fold(t, c);
        }
    }

    /// Sets (or with `None` clears) the traffic profile override from `t` on.
    pub(super) fn set_profile(&mut self, p: Option<Profile>, t: Ms, c: &Ctx) {
        self.change_flags(t, c, |v| {
            v.profile_override = p;
            v.override_since = t;
        });
    }

    /// The KVM agent forgets its previous reading (agent restart, new host).
    pub(super) fn reset_agent_reading(&mut self) {
        self.kvm_prev = None;
    }
}

#[cfg(test)]
mod tests {
    use crate::traffic::Profile;
    use crate::world::test_support::{world, T0};
    use crate::world::*;

    #[test]
    fn a_healthy_guest_boots_joins_and_idles() {
        let mut w = world();
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        w.advance_to(T0 + 5_000);
        let rs = w.vm(a).unwrap().running_since.unwrap();
        let vm = w.vm(a).unwrap();
        assert_eq!(vm.profile_at(rs + 10_000), Some(Profile::Boot));
        assert_eq!(vm.profile_at(rs + 100_000), Some(Profile::KubeadmJoin));
        assert_eq!(vm.profile_at(rs + 3_600_000), Some(Profile::IdleJoined));
    }

    #[test]
    fn a_profile_change_folds_the_counters_at_now() {
        let mut w = world();
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        w.advance_to(T0 + 600_000);
        let before = w.vm(a).unwrap().true_bytes(T0 + 600_000);
        w.set_profile_now(a, Some(Profile::NicDown)).unwrap();
        w.advance_to(T0 + 4_200_000);
        let vm = w.vm(a).unwrap();
        let after = vm.true_bytes(T0 + 4_200_000);
        assert_eq!(after.1, before.1, "guest→host flat from the change on");
        assert_eq!(after.0, before.0 + crate::traffic::RX_RING_BYTES);
        assert_eq!(
            vm.true_bytes(T0 + 300_000),
            w.vm(a).unwrap().true_bytes(T0 + 300_000)
        );
        w.set_profile_now(a, None).unwrap();
        w.advance_to(T0 + 4_260_000);
        assert!(w.vm(a).unwrap().true_bytes(T0 + 4_260_000).1 > after.1);
    }

    #[test]
    fn slow_boot_waits_for_the_endpoint_then_joins() {
        let mut w = world();
        w.settings.slow_boot_seconds = 600;
        let mut s = VmSpec::new("s");
        s.guest = GuestKind::SlowBoot;
        let i = w.add_vm(&s).unwrap();
        w.advance_to(T0 + 5_000);
        let rs = w.vm(i).unwrap().running_since.unwrap();
        let vm = w.vm(i).unwrap();
        assert_eq!(
            vm.profile_at(rs + 300_000),
            Some(Profile::WaitingForEndpoint)
        );
        assert_eq!(vm.profile_at(rs + 650_000), Some(Profile::KubeadmJoin));
        assert_eq!(vm.profile_at(rs + 7_200_000), Some(Profile::IdleJoined));
    }
}
