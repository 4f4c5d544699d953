//! Faults: injected faults, guest kinds that imply them, the fault schedule, and applying
//! and clearing faults.

use super::{HostStatus, Ms, ResourceState, Vm, VmState, World, WorldError};

/// Faults that can be injected into a VM (admin API or scenario schedule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    NicDown,
    NoAddress,
    DetachNic,
    Stop,
    Error,
    Vanish,
    HostOffline,
    StallStarting,
    ServicesFail,
    SlowBoot,
    /// `destroyVirtualMachine` keeps failing (its async job ends Failed) until cleared; the
    /// VM itself runs on untouched.
    DestroyFails,
}

impl Fault {
    pub const ALL: [Fault; 11] = [
        Fault::NicDown,
        Fault::NoAddress,
        Fault::DetachNic,
        Fault::Stop,
        Fault::Error,
        Fault::Vanish,
        Fault::HostOffline,
        Fault::StallStarting,
        Fault::ServicesFail,
        Fault::SlowBoot,
        Fault::DestroyFails,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NicDown => "nic-down",
            Self::NoAddress => "no-address",
            Self::DetachNic => "detach-nic",
            Self::Stop => "stop",
            Self::Error => "error",
            Self::Vanish => "vanish",
            Self::HostOffline => "host-offline",
            Self::StallStarting => "stall-starting",
            Self::ServicesFail => "services-fail",
            Self::SlowBoot => "slow-boot",
            Self::DestroyFails => "destroy-fails",
        }
    }

    /// `"nic-down, no-address, …"` for error messages.
    pub fn names() -> String {
        Self::ALL.map(Fault::as_str).join(", ")
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// How the guest behaves from boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestKind {
    Healthy,
    NicDown,
    SlowBoot,
    ServicesFail,
    StallStarting,
    NoAddress,
    DetachNic,
    /// Boots, then kubeadm waits for an API endpoint that never comes up
    /// (`waiting-for-endpoint` traffic) until the profile is changed.
    Waiting,
}

impl GuestKind {
    pub const ALL: [GuestKind; 8] = [
        GuestKind::Healthy,
        GuestKind::NicDown,
        GuestKind::SlowBoot,
        GuestKind::ServicesFail,
        GuestKind::StallStarting,
        GuestKind::NoAddress,
        GuestKind::DetachNic,
        GuestKind::Waiting,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::NicDown => "nic-down",
            Self::SlowBoot => "slow-boot",
            Self::ServicesFail => "services-fail",
            Self::StallStarting => "stall-starting",
            Self::NoAddress => "no-address",
            Self::DetachNic => "detach-nic",
            Self::Waiting => "waiting",
        }
    }

    pub fn names() -> String {
        Self::ALL.map(GuestKind::as_str).join(", ")
    }

    fn as_fault(self) -> Option<Fault> {
        match self {
            Self::Healthy | Self::Waiting => None,
            Self::NicDown => Some(Fault::NicDown),
            Self::SlowBoot => Some(Fault::SlowBoot),
            Self::ServicesFail => Some(Fault::ServicesFail),
            Self::StallStarting => Some(Fault::StallStarting),
            Self::NoAddress => Some(Fault::NoAddress),
            Self::DetachNic => Some(Fault::DetachNic),
        }
    }
}

impl Vm {
    /// Whether a fault is in effect (injected, or the guest kind implies it).
    pub fn has(&self, f: Fault) -> bool {
        self.faults & f.bit() != 0 || self.guest.as_fault() == Some(f)
    }

    /// Injected faults (not counting the guest kind).
    pub fn faults(&self) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|f| self.faults & f.bit() != 0)
            .collect()
    }
}

/// A fault scheduled at a simulated time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledFault {
    pub at_ms: Ms,
    pub vm: usize,
    pub fault: Fault,
}

impl World {
    /// Schedules a fault for a VM at a simulated time (ms since epoch).
    pub fn schedule_fault(&mut self, at_ms: Ms, vm: usize, fault: Fault) -> Result<(), WorldError> {
        if vm >= self.vms.len() {
            return Err(WorldError::NotFound(format!("no VM with index {vm}")));
        }
        let pending = &mut self.scheduled[self.next_scheduled..];
        let pos = pending.partition_point(|f| f.at_ms <= at_ms) + self.next_scheduled;
        self.scheduled
            .insert(pos, ScheduledFault { at_ms, vm, fault });
        Ok(())
    }

    /// Faults not yet applied.
    pub fn pending_faults(&self) -> &[ScheduledFault] {
        &self.scheduled[self.next_scheduled..]
    }

    /// Applies a fault at the current simulated time (call `advance_to` first).
    pub fn apply_fault_now(&mut self, idx: usize, fault: Fault) {
        let t = self.now_ms;
        let c = self.ctx();
        let Some(vm) = self.vms.get_mut(idx) else {
            return;
        };
        if vm.removed {
            return;
        }
        let bit = fault.bit();
        match fault {
            Fault::NicDown => vm.change_flags(t, &c, |v| {
                if v.faults & bit == 0 {
                    v.nic_down_since = Some(t);
                }
                v.faults |= bit
            }),
            Fault::NoAddress | Fault::DetachNic | Fault::ServicesFail | Fault::SlowBoot => {
                vm.change_flags(t, &c, |v| v.faults |= bit)
            }
            // Only `destroyVirtualMachine` looks at it; nothing about the guest changes.
            Fault::DestroyFails => vm.faults |= bit,
            Fault::StallStarting => {
                vm.faults |= bit;
                if matches!(vm.state, VmState::Running | VmState::Starting) {
                    vm.stop_running(VmState::Starting, t);
                }
            }
            Fault::Stop => {
                vm.faults |= bit;
                vm.stop_running(VmState::Stopped, t);
            }
            Fault::Error => {
                vm.faults |= bit;
                vm.stop_running(VmState::Error, t);
            }
            Fault::Vanish => {
                vm.faults |= bit;
                vm.removed = true;
                vm.transition_at = None;
                let name = vm.name.clone();
                let freed = vm.nic_assignment();
                self.by_name.remove(&name);
                if let Some(address) = freed {
                    self.release_address(address);
                }
            }
            // The agent lost its connection (status Alert): `hostcontrolstate` Offline and
            // no more rows; the guest runs on.
            Fault::HostOffline => {
                vm.faults |= bit;
                let h = vm.host;
                if let Some(h) = self.hosts.get_mut(h) {
                    let rs = h.resource_state();
                    h.set_states(HostStatus::Alert, rs);
                }
            }
        }
    }

    /// Clears the injected faults of a VM at the current simulated time: NIC and address
    /// come back, the host goes back online, a stalled start proceeds. A VM that was stopped,
    /// put in Error or expunged stays so.
    pub fn clear_faults_now(&mut self, idx: usize) {
        let t = self.now_ms;
        let c = self.ctx();
        let Some(vm) = self.vms.get_mut(idx) else {
            return;
        };
        let host = vm.host;
        let had_host_offline = vm.faults & Fault::HostOffline.bit() != 0;
        vm.change_flags(t, &c, |v| {
            v.faults = 0;
            v.nic_down_since = None;
        });
        if vm.state == VmState::Starting
            && vm.transition_at.is_none()
            && !vm.has(Fault::StallStarting)
        {
            vm.transition_at = Some(t + vm.boot_ms);
        }
        if had_host_offline {
            if let Some(h) = self.hosts.get_mut(host) {
                // The agent reconnects: a fresh agent process has no previous readings.
                h.set_states(HostStatus::Up, ResourceState::Enabled);
                for v in self.vms.iter_mut().filter(|v| v.host == host) {
                    v.reset_agent_reading();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::world::test_support::{world, T0};
    use crate::world::*;

    #[test]
    fn host_offline_stops_collection_and_clear_resumes() {
        let mut w = world();
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        w.advance_to(T0 + 60_000);
        w.apply_fault_now(a, Fault::HostOffline);
        let rows = w.vm(a).unwrap().stats_rows().len();
        assert!(rows > 0);
        w.advance_to(T0 + 300_000);
        assert_eq!(
            w.vm(a).unwrap().stats_rows().len(),
            rows,
            "no rows while Alert"
        );
        assert_eq!(w.hosts[0].control_state(), HostControl::Offline);
        assert_eq!(w.hosts[0].status(), HostStatus::Alert);
        w.clear_faults_now(a);
        assert_eq!(w.hosts[0].control_state(), HostControl::Enabled);
        w.advance_to(T0 + 320_000);
        let vm = w.vm(a).unwrap();
        let new: Vec<_> = vm.stats_rows().skip(rows).collect();
        assert_eq!(new.len(), 2);
        assert_eq!(new[0].tx, 0, "the reconnected agent starts a new baseline");
        assert!(new[1].tx > 0);
    }

    #[test]
    fn destroy_fails_leaves_the_guest_alone_and_clears() {
        let mut w = world();
        let i = w.add_vm(&VmSpec::new("d")).unwrap();
        w.advance_to(T0 + 60_000);
        let state = w.vm(i).unwrap().state;
        w.apply_fault_now(i, Fault::DestroyFails);
        let vm = w.vm(i).unwrap();
        assert!(vm.has(Fault::DestroyFails));
        assert_eq!(vm.faults(), vec![Fault::DestroyFails]);
        assert_eq!(vm.state, state);
        assert_eq!(Fault::parse("destroy-fails"), Some(Fault::DestroyFails));
        w.clear_faults_now(i);
        assert!(!w.vm(i).unwrap().has(Fault::DestroyFails));
    }

    #[test]
    fn stall_starting_stays_until_cleared() {
        let mut w = world();
        let mut s = VmSpec::new("s");
        s.guest = GuestKind::Healthy;
        let i = w.add_vm(&s).unwrap();
        w.apply_fault_now(i, Fault::StallStarting);
        w.advance_to(T0 + 3_600_000);
        assert_eq!(w.vm(i).unwrap().state, VmState::Starting);
        w.clear_faults_now(i);
        w.advance_to(T0 + 3_600_000 + 5_000);
        assert_eq!(w.vm(i).unwrap().state, VmState::Running);
    }
}
