//! What the simulated cloud offers besides VMs: service offerings, templates, disk offerings,
//! affinity groups, and the async jobs of the commands that create or destroy things.
//!
//! These are plain data; [`super::world::World`] owns them and the command handlers render
//! them. Defaults (used when a scenario defines none) keep the ids the simulator has always
//! shown on VMs, so older fixtures and tests see the same template and offering.

use super::world::Ms;

/// The offering VMs get when a scenario defines none.
pub const DEFAULT_OFFERING_ID: &str = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b9a";
pub const DEFAULT_OFFERING_NAME: &str = "Medium Instance";
/// The template VMs get when a scenario defines none.
pub const DEFAULT_TEMPLATE_ID: &str = "8f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
pub const DEFAULT_TEMPLATE_NAME: &str = "capi-ubuntu-2204-kube";
/// Default disk offerings (CloudStack installs a few; these two cover fixed and custom size).
pub const DEFAULT_DISK_SMALL_ID: &str = "6b1f0c55-2d1e-4b7a-9c3e-5a8d7f6e4c21";
pub const DEFAULT_DISK_CUSTOM_ID: &str = "9e4d2a77-3c5b-4f1e-8a6d-7b9c0e1f2a33";

/// `listServiceOfferings` entries; CPU and memory of the VMs deployed with them.
#[derive(Debug, Clone)]
pub struct ServiceOffering {
    pub id: String,
    pub name: String,
    pub display_text: String,
    pub cpu_number: u32,
    /// MHz per core.
    pub cpu_speed: u32,
    pub memory_mb: u32,
    /// Zones (indices) it is restricted to; empty = every zone.
    pub zones: Vec<usize>,
}

impl ServiceOffering {
    pub fn in_zone(&self, zone: usize) -> bool {
        serves_zone(&self.zones, zone)
    }
}

/// An offering's zone restriction: empty means every zone.
fn serves_zone(zones: &[usize], zone: usize) -> bool {
    zones.is_empty() || zones.contains(&zone)
}

/// A registered, ready, executable template.
#[derive(Debug, Clone)]
pub struct Template {
    pub id: String,
    pub name: String,
    pub display_text: String,
    /// Zones (indices) it was downloaded to; `listTemplates` shows one entry per zone.
    pub zones: Vec<usize>,
    pub size_bytes: u64,
    /// How the guests of VMs deployed from it behave when their spec does not say (a
    /// template whose image is broken: every VM from it boots the same broken guest); see
    /// [`World::set_template_guest`](super::world::World::set_template_guest).
    pub guest: Option<super::world::GuestKind>,
}

/// A disk offering for a VM's data disk.
#[derive(Debug, Clone)]
pub struct DiskOffering {
    pub id: String,
    pub name: String,
    pub display_text: String,
    /// Fixed size (0 for customized offerings).
    pub disk_size_gb: u64,
    /// The size comes from the deploy call's `size`.
    pub customized: bool,
    /// Zones it is restricted to; empty = every zone.
    pub zones: Vec<usize>,
}

impl DiskOffering {
    pub fn in_zone(&self, zone: usize) -> bool {
        serves_zone(&self.zones, zone)
    }
}

/// The affinity group types the simulator knows (CloudStack's processors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AffinityType {
    HostAntiAffinity,
    HostAffinity,
    NonStrictHostAntiAffinity,
    NonStrictHostAffinity,
}

impl AffinityType {
    pub const ALL: [AffinityType; 4] = [
        AffinityType::HostAntiAffinity,
        AffinityType::HostAffinity,
        AffinityType::NonStrictHostAntiAffinity,
        AffinityType::NonStrictHostAffinity,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::HostAntiAffinity => "host anti-affinity",
            Self::HostAffinity => "host affinity",
            Self::NonStrictHostAntiAffinity => "non-strict host anti-affinity",
            Self::NonStrictHostAffinity => "non-strict host affinity",
        }
    }

    /// Whether placement must fail rather than bend the rule.
    pub fn strict(self) -> bool {
        matches!(self, Self::HostAntiAffinity | Self::HostAffinity)
    }

    pub fn anti(self) -> bool {
        matches!(
            self,
            Self::HostAntiAffinity | Self::NonStrictHostAntiAffinity
        )
    }
}

#[derive(Debug, Clone)]
pub struct AffinityGroup {
    pub id: String,
    pub name: String,
    pub kind: AffinityType,
    pub description: String,
    /// Owning account (index).
    pub account: usize,
    pub project: Option<usize>,
    /// Deleted groups keep their slot (VMs refer to groups by index) but no longer resolve.
    pub deleted: bool,
}

/// The command an async job runs, and the object it works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobCommand {
    DeployVm {
        vm: usize,
    },
    DestroyVm {
        vm: usize,
    },
    CreateAffinityGroup {
        group: usize,
    },
    DeleteAffinityGroup {
        group: usize,
    },
    /// `runDiagnostics` on a router (`None`: the target was not a system VM).
    RunDiagnostics {
        router: Option<usize>,
    },
}

impl JobCommand {
    /// The Java command class CloudStack reports as `cmd`.
    pub fn class_name(self) -> &'static str {
        match self {
            Self::DeployVm { .. } => {
                "org.apache.cloudstack.api.command.admin.vm.DeployVMCmdByAdmin"
            }
            Self::DestroyVm { .. } => {
                "org.apache.cloudstack.api.command.admin.vm.DestroyVMCmdByAdmin"
            }
            Self::CreateAffinityGroup { .. } => {
                "org.apache.cloudstack.api.command.user.affinitygroup.CreateAffinityGroupCmd"
            }
            Self::DeleteAffinityGroup { .. } => {
                "org.apache.cloudstack.api.command.user.affinitygroup.DeleteAffinityGroupCmd"
            }
            Self::RunDiagnostics { .. } => {
                "org.apache.cloudstack.api.command.admin.diagnostics.RunDiagnosticsCmd"
            }
        }
    }

    /// `jobinstancetype`.
    pub fn instance_type(self) -> &'static str {
        match self {
            Self::DeployVm { .. } | Self::DestroyVm { .. } => "VirtualMachine",
            Self::CreateAffinityGroup { .. } | Self::DeleteAffinityGroup { .. } => "AffinityGroup",
            // RunDiagnosticsCmd.getInstanceType: ApiCommandJobType.SystemVm (RDC@0ecc61aa).
            Self::RunDiagnostics { .. } => "SystemVm",
        }
    }
}

/// Where a job stands. Results are rendered when queried (from the object's current state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobStatus {
    Pending,
    Succeeded {
        at_ms: Ms,
    },
    Failed {
        at_ms: Ms,
        code: u16,
        cs: u32,
        text: String,
    },
}

impl JobStatus {
    /// `jobstatus`: 0 in progress, 1 succeeded, 2 failed.
    pub fn code(&self) -> u8 {
        match self {
            Self::Pending => 0,
            Self::Succeeded { .. } => 1,
            Self::Failed { .. } => 2,
        }
    }
}

#[derive(Debug, Clone)]
pub struct AsyncJob {
    pub id: String,
    /// The account that submitted it (only it and root admins may query it).
    pub account: usize,
    pub command: JobCommand,
    pub created_ms: Ms,
    /// UUID of the object the job works on (`jobinstanceid`).
    pub instance_id: String,
    pub status: JobStatus,
}

/// A deterministic, UUID-shaped id for an address of a network: the network id's first four
/// groups, then the IPv4 address as hex. Public IP ids must stay the same between calls
/// without being stored per address.
pub fn address_id(network_id: &str, ip: u32) -> String {
    let prefix = network_id.get(..24).unwrap_or("00000000-0000-0000-0000-");
    format!("{prefix}0000{ip:08x}")
}
