//! Hosts: hypervisor type, agent `status`, `resource_state`, the `hostcontrolstate` derived
//! from them, and whether the VM stats collector reaches a host.

use super::{unique_name, Ms, World, WorldError};

/// The host's hypervisor; every VM on it reports it as `hypervisor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hypervisor {
    #[default]
    Kvm,
    VMware,
    XenServer,
}

impl Hypervisor {
    pub const ALL: [Hypervisor; 3] = [Self::Kvm, Self::VMware, Self::XenServer];
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|h| h.as_str().eq_ignore_ascii_case(s))
    }
    /// As `HypervisorType` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kvm => "KVM",
            Self::VMware => "VMware",
            Self::XenServer => "XenServer",
        }
    }
}

/// Host agent status (`Status.java@3523fdb4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostStatus {
    Creating,
    Connecting,
    #[default]
    Up,
    Down,
    Disconnected,
    Alert,
    Removed,
    Error,
    Rebalancing,
    Unknown,
}

impl HostStatus {
    pub const ALL: [HostStatus; 10] = [
        Self::Creating,
        Self::Connecting,
        Self::Up,
        Self::Down,
        Self::Disconnected,
        Self::Alert,
        Self::Removed,
        Self::Error,
        Self::Rebalancing,
        Self::Unknown,
    ];
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.as_str() == s)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "Creating",
            Self::Connecting => "Connecting",
            Self::Up => "Up",
            Self::Down => "Down",
            Self::Disconnected => "Disconnected",
            Self::Alert => "Alert",
            Self::Removed => "Removed",
            Self::Error => "Error",
            Self::Rebalancing => "Rebalancing",
            Self::Unknown => "Unknown",
        }
    }
    /// `Status.lostConnection()` (third constructor flag in `Status.java@3523fdb4`).
    pub fn lost_connection(self) -> bool {
        matches!(
            self,
            Self::Down
                | Self::Disconnected
                | Self::Alert
                | Self::Removed
                | Self::Error
                | Self::Rebalancing
        )
    }
}

/// Host resource state (`ResourceState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResourceState {
    Creating,
    #[default]
    Enabled,
    Disabled,
    PrepareForMaintenance,
    ErrorInPrepareForMaintenance,
    Maintenance,
    ErrorInMaintenance,
    Error,
    Degraded,
}

impl ResourceState {
    pub const ALL: [ResourceState; 9] = [
        Self::Creating,
        Self::Enabled,
        Self::Disabled,
        Self::PrepareForMaintenance,
        Self::ErrorInPrepareForMaintenance,
        Self::Maintenance,
        Self::ErrorInMaintenance,
        Self::Error,
        Self::Degraded,
    ];
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.as_str() == s)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "Creating",
            Self::Enabled => "Enabled",
            Self::Disabled => "Disabled",
            Self::PrepareForMaintenance => "PrepareForMaintenance",
            Self::ErrorInPrepareForMaintenance => "ErrorInPrepareForMaintenance",
            Self::Maintenance => "Maintenance",
            Self::ErrorInMaintenance => "ErrorInMaintenance",
            Self::Error => "Error",
            Self::Degraded => "Degraded",
        }
    }
    /// `ResourceState.isMaintenanceState`; also the states the VM stats collector skips
    /// (`StatsCollector.createSearchCriteriaForHostTypeRoutingStateUpAndNotInMaintenance@00114e8b`).
    pub fn is_maintenance(self) -> bool {
        matches!(
            self,
            Self::Maintenance
                | Self::PrepareForMaintenance
                | Self::ErrorInPrepareForMaintenance
                | Self::ErrorInMaintenance
        )
    }
}

/// `hostcontrolstate` as listed on VMs (`ControlState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostControl {
    Enabled,
    Disabled,
    Offline,
    Maintenance,
    Unknown,
}

impl HostControl {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Enabled" => Some(Self::Enabled),
            "Disabled" => Some(Self::Disabled),
            "Offline" => Some(Self::Offline),
            "Maintenance" => Some(Self::Maintenance),
            "Unknown" => Some(Self::Unknown),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enabled => "Enabled",
            Self::Disabled => "Disabled",
            Self::Offline => "Offline",
            Self::Maintenance => "Maintenance",
            Self::Unknown => "Unknown",
        }
    }

    /// `ControlState.getControlState@1502b605`: Unknown status → Unknown; lost connection →
    /// Offline; a maintenance resource state → Maintenance; Enabled → Enabled; else Disabled.
    /// So a `Connecting` host shows Enabled.
    pub fn derive(status: HostStatus, rs: ResourceState) -> Self {
        if status == HostStatus::Unknown {
            Self::Unknown
        } else if status.lost_connection() {
            Self::Offline
        } else if rs.is_maintenance() {
            Self::Maintenance
        } else if rs == ResourceState::Enabled {
            Self::Enabled
        } else {
            Self::Disabled
        }
    }

    /// The (status, resource state) an old-style control state stands for (scenario
    /// `control_state`, and writes to [`Host::control`]).
    pub fn to_states(self, current: (HostStatus, ResourceState)) -> (HostStatus, ResourceState) {
        match self {
            Self::Enabled => (HostStatus::Up, ResourceState::Enabled),
            Self::Disabled => (HostStatus::Up, ResourceState::Disabled),
            Self::Maintenance => (HostStatus::Up, ResourceState::Maintenance),
            Self::Offline => (HostStatus::Alert, current.1),
            Self::Unknown => (HostStatus::Unknown, current.1),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Host {
    pub id: String,
    pub name: String,
    pub zone: usize,
    pub hypervisor: Hypervisor,
    status: HostStatus,
    resource_state: ResourceState,
    /// Mirror of the derived `hostcontrolstate`, kept for callers of the old model: writing
    /// it directly is translated into status/resource state at the next world advance
    /// ([`HostControl::to_states`]). Prefer [`World::set_host_state`].
    pub control: HostControl,
    mirrored: HostControl,
    /// The host's stats call fails (a collection gap while the host stays Up): the collector
    /// stores no rows for its VMs.
    pub stats_collection_paused: bool,
}

impl Host {
    pub fn status(&self) -> HostStatus {
        self.status
    }
    pub fn resource_state(&self) -> ResourceState {
        self.resource_state
    }
    /// `hostcontrolstate`.
    pub fn control_state(&self) -> HostControl {
        HostControl::derive(self.status, self.resource_state)
    }
    pub fn set_states(&mut self, status: HostStatus, rs: ResourceState) {
        self.status = status;
        self.resource_state = rs;
        self.control = self.control_state();
        self.mirrored = self.control;
    }
    /// Applies a direct write of [`Host::control`] (compatibility with the old model).
    pub(super) fn sync_legacy_control(&mut self) {
        if self.control != self.mirrored {
            let (s, r) = self.control.to_states((self.status, self.resource_state));
            self.set_states(s, r);
        }
    }
    /// Whether the VM stats collector stores rows for this host's VMs: status Up, not in a
    /// maintenance state (`StatsCollector.VmStatsCollector@00114e8b` selects hosts with
    /// `createSearchCriteriaForHostTypeRoutingStateUpAndNotInMaintenance`), and its stats
    /// call succeeds (a failing host is skipped with `continue`).
    pub fn collectable(&self) -> bool {
        self.status == HostStatus::Up
            && !self.resource_state.is_maintenance()
            && !self.stats_collection_paused
    }
}

/// A change to a host (admin API, scenario, schedule); `None` fields stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostChange {
    pub status: Option<HostStatus>,
    pub resource_state: Option<ResourceState>,
    pub hypervisor: Option<Hypervisor>,
    pub stats_call_fails: Option<bool>,
}

/// A host change scheduled at a simulated time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledHostChange {
    pub at_ms: Ms,
    pub host: usize,
    pub change: HostChange,
}

impl World {
    pub fn add_host(
        &mut self,
        name: &str,
        id: Option<&str>,
        zone: Option<&str>,
        control: HostControl,
    ) -> Result<usize, WorldError> {
        unique_name(&self.hosts, |h| &h.name, "host", name)?;
        let zone = self.zone_or_first(zone)?;
        let id = self.check_id(id, "host", |i| self.hosts.iter().any(|h| h.id == i))?;
        let (status, rs) = control.to_states((HostStatus::Up, ResourceState::Enabled));
        let mut h = Host {
            id,
            name: name.to_string(),
            zone,
            hypervisor: Hypervisor::Kvm,
            status,
            resource_state: rs,
            control,
            mirrored: control,
            stats_collection_paused: false,
        };
        h.set_states(status, rs);
        self.hosts.push(h);
        // Routers deployed while their zone had no host start on this one.
        self.place_routers();
        Ok(self.hosts.len() - 1)
    }

    pub fn host_index(&self, name_or_id: &str) -> Option<usize> {
        self.hosts
            .iter()
            .position(|h| h.name == name_or_id || h.id == name_or_id)
    }

    /// Changes a host now (call `advance_to` first). A hypervisor change restarts the KVM
    /// agent's per-VM readings of the host's VMs.
    pub fn change_host_now(&mut self, host: usize, ch: &HostChange) -> Result<(), WorldError> {
        let h = self
            .hosts
            .get_mut(host)
            .ok_or_else(|| WorldError::NotFound(format!("no host #{host}")))?;
        h.sync_legacy_control();
        let status = ch.status.unwrap_or(h.status);
        let rs = ch.resource_state.unwrap_or(h.resource_state);
        h.set_states(status, rs);
        if let Some(p) = ch.stats_call_fails {
            h.stats_collection_paused = p;
        }
        if let Some(hv) = ch.hypervisor {
            if hv != h.hypervisor {
                h.hypervisor = hv;
                for vm in self.vms.iter_mut().filter(|v| v.host == host) {
                    vm.reset_agent_reading();
                }
            }
        }
        Ok(())
    }

    /// Sets a host's status and resource state now.
    pub fn set_host_state(
        &mut self,
        host: usize,
        status: HostStatus,
        rs: ResourceState,
    ) -> Result<(), WorldError> {
        self.change_host_now(
            host,
            &HostChange {
                status: Some(status),
                resource_state: Some(rs),
                ..HostChange::default()
            },
        )
    }

    /// Schedules a host change at a simulated time (ms since epoch).
    pub fn schedule_host_change(
        &mut self,
        at_ms: Ms,
        host: usize,
        change: HostChange,
    ) -> Result<(), WorldError> {
        if host >= self.hosts.len() {
            return Err(WorldError::NotFound(format!("no host with index {host}")));
        }
        let pending = &self.scheduled_hosts[self.next_scheduled_host..];
        let pos = pending.partition_point(|f| f.at_ms <= at_ms) + self.next_scheduled_host;
        self.scheduled_hosts.insert(
            pos,
            ScheduledHostChange {
                at_ms,
                host,
                change,
            },
        );
        Ok(())
    }

    /// Host changes not yet applied.
    pub fn pending_host_changes(&self) -> &[ScheduledHostChange] {
        &self.scheduled_hosts[self.next_scheduled_host..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_state_is_derived_as_control_state_java_does() {
        use HostControl as C;
        use HostStatus as S;
        use ResourceState as R;
        assert_eq!(C::derive(S::Connecting, R::Enabled), C::Enabled);
        assert_eq!(C::derive(S::Up, R::Enabled), C::Enabled);
        for s in [
            S::Down,
            S::Disconnected,
            S::Alert,
            S::Removed,
            S::Error,
            S::Rebalancing,
        ] {
            assert_eq!(C::derive(s, R::Maintenance), C::Offline, "{s:?}");
        }
        for r in [
            R::Maintenance,
            R::PrepareForMaintenance,
            R::ErrorInMaintenance,
            R::ErrorInPrepareForMaintenance,
        ] {
            assert_eq!(C::derive(S::Up, r), C::Maintenance);
        }
        assert_eq!(C::derive(S::Up, R::Disabled), C::Disabled);
        assert_eq!(C::derive(S::Up, R::Degraded), C::Disabled);
        assert_eq!(C::derive(S::Unknown, R::Enabled), C::Unknown);
    }
}
