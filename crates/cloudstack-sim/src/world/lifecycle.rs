//! VM lifecycle: state transitions over simulated time (boot, expunge), destroy, live
//! migration, and whether a guest has joined its cluster.

use super::{Ctx, Fault, Ms, Vm, VmState, World, WorldError};

impl Vm {
    pub(super) fn set_state(&mut self, s: VmState, t: Ms) {
        if self.state != s {
            self.state = s;
            self.last_updated_ms = t;
        }
    }

    pub(super) fn start_running(&mut self, t: Ms) {
        self.set_state(VmState::Running, t);
        self.running_since = Some(t);
        self.transition_at = None;
        self.seg_n = 0;
        self.base_rx = 0;
        self.base_tx = 0;
        self.beh = self.behaviour();
    }

    pub(super) fn stop_running(&mut self, s: VmState, t: Ms) {
        self.set_state(s, t);
        self.running_since = None;
        self.transition_at = None;
    }

    /// Moves this VM to time `t`. Returns true when the VM was expunged on the way.
    pub(super) fn advance(&mut self, t: Ms, online: bool, c: &Ctx) -> bool {
        if self.removed || t <= self.processed_ms {
            return false;
        }
        loop {
            let next = self.transition_at.filter(|x| *x <= t);
            let end = next.unwrap_or(t).max(self.processed_ms);
            self.collect(self.processed_ms, end, online, c);
            self.processed_ms = end;
            let Some(x) = next else { break };
            match self.state {
                VmState::Starting => self.start_running(x),
                VmState::Destroyed => {
                    self.set_state(VmState::Expunging, x);
                    self.running_since = None;
                    self.transition_at = Some(x + c.expunge_ms);
                }
                VmState::Expunging => {
                    self.transition_at = None;
                    self.removed = true;
                    self.processed_ms = t;
                    return true;
                }
                // The guest ran on throughout: counters continue from `running_since`.
                VmState::Migrating => {
                    self.set_state(VmState::Running, x);
                    self.host = self.migration_target.take().unwrap_or(self.host);
                    self.transition_at = None;
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
        if vm.state != VmState::Running
            || vm.removed
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
    fn a_migration_moves_the_vm_and_its_counters_carry_on() {
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
        let before = w.vm(a).unwrap().last_sample.unwrap();
        w.migrate_now(a, to, 30.0).unwrap();
        w.advance_to(T0 + 85_000);
        let vm = w.vm(a).unwrap();
        assert_eq!((vm.state, vm.host), (VmState::Migrating, from));
        assert_eq!(vm.last_sample, Some(before), "no samples while migrating");
        w.advance_to(T0 + 120_000);
        let vm = w.vm(a).unwrap();
        assert_eq!((vm.state, vm.host), (VmState::Running, to));
        assert!(vm.last_sample.unwrap().tx_kib > before.tx_kib);
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
