//! VM lifecycle: state transitions over simulated time (boot, expunge), destroy, live
//! migration, and whether a guest has joined its cluster.

use super::collector::Collections;
use super::{Ctx, Fault, GuestKind, Hypervisor, Ms, Vm, VmState, World, WorldError};
use crate::traffic::Profile;

impl Vm {
    pub(super) fn set_state(&mut self, s: VmState, t: Ms) {
        if self.state != s {
            self.state = s;
            self.last_updated_ms = t;
        }
    }

    pub(super) fn start_running(&mut self, t: Ms, c: &Ctx) {
        self.set_state(VmState::Running, t);
        self.running_since = Some(t);
        self.transition_at = None;
        self.start_traffic(t, c);
    }

    pub(super) fn stop_running(&mut self, s: VmState, t: Ms) {
        self.set_state(s, t);
        self.running_since = None;
        self.transition_at = None;
        self.kvm_prev = None;
    }

    /// Moves this VM to time `t`. Returns true when the VM was expunged on the way.
    /// `host` is (collectable, hypervisor) of the VM's host.
    pub(super) fn advance(
        &mut self,
        t: Ms,
        host: Option<(bool, Hypervisor)>,
        col: &Collections,
        c: &Ctx,
    ) -> bool {
        if self.removed || t <= self.processed_ms {
            return false;
        }
        loop {
            let next = self.transition_at.filter(|x| *x <= t);
            let end = next.unwrap_or(t).max(self.processed_ms);
            self.collect(self.processed_ms, end, host, col, c);
            self.processed_ms = end;
            let Some(x) = next else { break };
            match self.state {
                VmState::Starting => self.start_running(x, c),
                VmState::Destroyed => {
                    self.set_state(VmState::Expunging, x);
                    self.running_since = None;
                    self.transition_at = Some(x + c.expunge_ms);
                }
                VmState::Expunging => {
                    self.transition_at = None;
                    self.removed = true;
                    self.rows.clear();
                    self.segs.clear();
                    self.processed_ms = t;
                    return true;
                }
                // The guest ran on throughout; the destination's agent has no previous
                // reading, so its first KVM row is 0 (`LibvirtComputingResource.getVmStat`).
                VmState::Migrating => {
                    self.set_state(VmState::Running, x);
                    self.host = self.migration_target.take().unwrap_or(self.host);
                    self.transition_at = None;
                    self.kvm_prev = None;
                }
                _ => self.transition_at = None,
            }
        }
        false
    }
}

impl World {
    /// Destroys a VM now: `Destroyed` (expunged after the expunge delay) or, with
    /// `expunge`, straight to `Expunging`. Already destroyed VMs only move on when
    /// `expunge` asks for it; expunging or expunged VMs do not change.
    pub fn destroy_vm_now(&mut self, idx: usize, expunge: bool) {
        let t = self.now_ms;
        let c = self.ctx();
        let Some(vm) = self.vms.get_mut(idx) else {
            return;
        };
        if vm.removed {
            return;
        }
        match (vm.state, expunge) {
            (VmState::Expunging, _) | (VmState::Destroyed, false) => {}
            (_, true) => {
                vm.stop_running(VmState::Expunging, t);
                vm.transition_at = Some(t + c.expunge_ms);
            }
            (_, false) => {
                vm.stop_running(VmState::Destroyed, t);
                vm.transition_at = Some(t + c.expunge_delay_ms);
            }
        }
    }

    /// Starts a live migration of a Running VM to `host`, taking `seconds` (what
    /// `migrateVirtualMachine` or a host entering maintenance does): `Migrating`, then
    /// `Running` on the new host.
    pub fn migrate_now(&mut self, idx: usize, host: usize, seconds: f64) -> Result<(), WorldError> {
        let t = self.now_ms;
        if host >= self.hosts.len() {
            return Err(WorldError::NotFound(format!("no host #{host}")));
        }
        let vm = self
            .vms
            .get_mut(idx)
            .ok_or_else(|| WorldError::NotFound(format!("no VM #{idx}")))?;
        if vm.state != VmState::Running {
            return Err(WorldError::Conflict(format!(
                "VM {} is {}, not Running",
                vm.name,
                vm.state.as_str()
            )));
        }
        vm.set_state(VmState::Migrating, t);
        vm.migration_target = Some(host);
        vm.transition_at = Some(t + (seconds * 1000.0).round().max(1.0) as Ms);
        Ok(())
    }

    /// Whether the guest would have joined its cluster by now (admin view only).
    pub fn joined(&self, vm: &Vm) -> bool {
        let Some(rs) = vm.running_since else {
            return false;
        };
        let joining_profile = vm.profile_override().is_none_or(|p| {
            matches!(
                p,
                Profile::Boot | Profile::KubeadmJoin | Profile::IdleJoined
            )
        });
        if vm.state != VmState::Running
            || vm.removed
            || vm.guest == GuestKind::Waiting
            || !joining_profile
            || vm.has(Fault::ServicesFail)
            || vm.has(Fault::NicDown)
            || vm.has(Fault::DetachNic)
            || vm.visible_ip().is_none()
        {
            return false;
        }
        let ready_at = if vm.has(Fault::SlowBoot) {
            rs + (self.settings.slow_boot_seconds as Ms) * 1000
        } else {
            rs
        };
        self.now_ms >= ready_at
    }
}

#[cfg(test)]
mod tests {
    use crate::world::test_support::{world, T0};
    use crate::world::*;

    #[test]
    fn a_migration_skips_collection_and_restarts_the_kvm_baseline() {
        let mut w = world();
        w.add_host("host-extra", None, None, HostControl::Enabled)
            .unwrap();
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        let from = w.vm(a).unwrap().host;
        let to = (0..w.hosts.len()).find(|h| *h != from).unwrap();
        assert!(matches!(
            w.migrate_now(a, to, 30.0),
            Err(WorldError::Conflict(_))
        ));
        w.advance_to(T0 + 60_000);
        let before = w.vm(a).unwrap().stats_rows().len();
        w.migrate_now(a, to, 30.0).unwrap();
        w.advance_to(T0 + 85_000);
        let vm = w.vm(a).unwrap();
        assert_eq!((vm.state, vm.host), (VmState::Migrating, from));
        assert_eq!(vm.stats_rows().len(), before, "no rows while migrating");
        w.advance_to(T0 + 120_000);
        let vm = w.vm(a).unwrap();
        assert_eq!((vm.state, vm.host), (VmState::Running, to));
        let new: Vec<_> = vm.stats_rows().skip(before).collect();
        assert_eq!(new[0].tx, 0, "first reading on the new host");
        assert!(new[1].tx > 0);
        assert!(matches!(
            w.migrate_now(a, 99, 30.0),
            Err(WorldError::NotFound(_))
        ));
    }

    #[test]
    fn destroyed_expunges_and_disappears_by_name() {
        let mut w = world();
        w.settings.expunge_delay_seconds = 10.0;
        w.settings.expunge_seconds = 5.0;
        let mut s = VmSpec::new("d");
        s.state = VmState::Destroyed;
        let d = w.add_vm(&s).unwrap();
        w.advance_to(T0 + 11_000);
        assert_eq!(w.vm(d).unwrap().state, VmState::Expunging);
        w.advance_to(T0 + 16_000);
        assert!(w.vm(d).unwrap().removed);
        assert_eq!(w.vm_index("d"), None);
        let id = w.vm(d).unwrap().id.clone();
        assert_eq!(w.vm_index_by_id(&id), Some(d));
    }

    #[test]
    fn destroy_without_expunge_waits_for_the_delay() {
        let mut w = world();
        w.settings.expunge_delay_seconds = 10.0;
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        w.destroy_vm_now(a, false);
        assert_eq!(w.vm(a).unwrap().state, VmState::Destroyed);
        // A second destroy without expunge changes nothing; with expunge it moves on.
        w.destroy_vm_now(a, false);
        assert_eq!(w.vm(a).unwrap().state, VmState::Destroyed);
        w.destroy_vm_now(a, true);
        assert_eq!(w.vm(a).unwrap().state, VmState::Expunging);
    }
}
