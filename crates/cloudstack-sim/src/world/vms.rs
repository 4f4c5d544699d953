//! VMs: their states, NICs and data disks, what to create ([`VmSpec`]), creation and lookup.

use std::net::Ipv4Addr;

use crate::traffic::Profile;

use super::guest::{Reading, Seg};
use super::rows::StatsRows;
use super::{
    is_canonical_uuid, new_uuid, secs_to_ms, Fault, GuestKind, Ms, NetworkType, World, WorldError,
};

/// The VM states the simulator produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmState {
    Starting,
    Running,
    /// Live migration to another host: the guest keeps running, the stats collector skips it.
    Migrating,
    Stopped,
    Error,
    Destroyed,
    Expunging,
}

impl VmState {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Starting" => Some(Self::Starting),
            "Running" => Some(Self::Running),
            "Migrating" => Some(Self::Migrating),
            "Stopped" => Some(Self::Stopped),
            "Error" => Some(Self::Error),
            "Destroyed" => Some(Self::Destroyed),
            "Expunging" => Some(Self::Expunging),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "Starting",
            Self::Running => "Running",
            Self::Migrating => "Migrating",
            Self::Stopped => "Stopped",
            Self::Error => "Error",
            Self::Destroyed => "Destroyed",
            Self::Expunging => "Expunging",
        }
    }
    pub const NAMES: &'static [&'static str] = &[
        "Starting",
        "Running",
        "Migrating",
        "Stopped",
        "Error",
        "Destroyed",
        "Expunging",
    ];
}

#[derive(Debug, Clone)]
pub struct Nic {
    pub id: String,
    pub mac: String,
    pub ip: Option<Ipv4Addr>,
    pub network: usize,
}

#[derive(Debug, Clone)]
pub struct Vm {
    /// Internal id (creation order); list results are ordered by it.
    pub seq: u64,
    pub id: String,
    pub name: String,
    pub display_name: String,
    pub account: usize,
    pub project: Option<usize>,
    pub zone: usize,
    pub host: usize,
    pub state: VmState,
    pub created_ms: Ms,
    pub last_updated_ms: Ms,
    pub guest: GuestKind,
    pub(super) faults: u16,
    pub boot_ms: Ms,
    pub transition_at: Option<Ms>,
    /// The host a migration in progress moves the VM to.
    pub migration_target: Option<usize>,
    pub running_since: Option<Ms>,
    pub(super) nic: Option<Nic>,
    /// Traffic segments (see `guest.rs`).
    pub(super) segs: Vec<Seg>,
    pub(super) profile_override: Option<Profile>,
    pub(super) override_since: Ms,
    /// When an injected nic-down fault took the NIC down.
    pub(super) nic_down_since: Option<Ms>,
    /// Since when its network's gateway does not answer (uplink lost, or the virtual router
    /// of an Isolated network stopped): see `World::gateway_lost_since`.
    pub(super) gateway_lost_since: Option<Ms>,
    /// The KVM agent's previous reading of this VM.
    pub(super) kvm_prev: Option<Reading>,
    /// The VM's retained `vm_stats` rows.
    pub(super) rows: StatsRows,
    pub(super) processed_ms: Ms,
    /// Expunged (vanished): the id still resolves but the VM is never listed.
    pub removed: bool,
    pub tags: Vec<(String, String)>,
    pub haenable: bool,
    pub cpu_number: u32,
    pub cpu_speed: u32,
    pub memory_mb: u32,
    /// Service offering and template (indices) the VM was created from.
    pub offering: usize,
    pub template: usize,
    pub root_volume_id: String,
    pub data_disk: Option<DataDisk>,
    /// User data as deployVirtualMachine received it, base64-decoded (CAPC sends gzip).
    pub userdata: Option<Vec<u8>>,
    pub keypair: Option<String>,
    /// Affinity groups (indices).
    pub affinity_groups: Vec<usize>,
    /// `details[i].key=value` of the deploy call.
    pub details: Vec<(String, String)>,
    /// Created through deployVirtualMachine (not by the scenario or the admin API).
    pub deployed: bool,
}

/// A VM's data disk (`listVolumes type=DATADISK`).
#[derive(Debug, Clone)]
pub struct DataDisk {
    pub id: String,
    /// Disk offering (index).
    pub offering: usize,
    pub size_gb: u64,
}

impl Vm {
    /// The NIC as the API shows it (`None` when detached).
    pub fn visible_nic(&self) -> Option<&Nic> {
        if self.has(Fault::DetachNic) {
            None
        } else {
            self.nic.as_ref()
        }
    }

    /// The network (index) and address the VM's NIC holds, faults aside.
    pub fn nic_assignment(&self) -> Option<(usize, Ipv4Addr)> {
        self.nic
            .as_ref()
            .and_then(|n| n.ip.map(|ip| (n.network, ip)))
    }

    /// The NIC's address as the API shows it.
    pub fn visible_ip(&self) -> Option<Ipv4Addr> {
        if self.has(Fault::NoAddress) {
            None
        } else {
            self.visible_nic().and_then(|n| n.ip)
        }
    }
}

/// What to create (admin API, scenario files, benchmarks).
#[derive(Debug, Clone)]
pub struct VmSpec {
    pub name: String,
    /// Fixed id (lowercase canonical UUID); random when absent.
    pub id: Option<String>,
    pub display_name: Option<String>,
    pub state: VmState,
    pub guest: GuestKind,
    /// A traffic profile for the whole run instead of the guest kind's timeline.
    pub profile: Option<Profile>,
    /// Account name; the default account when absent.
    pub account: Option<String>,
    /// Zone name or id; the first zone when absent.
    pub zone: Option<String>,
    /// Network name or id; the zone's first network when absent.
    pub network: Option<String>,
    /// Project name or id.
    pub project: Option<String>,
    /// Host name or id; spread over the zone's hosts when absent.
    pub host: Option<String>,
    /// Boot delay; the settings' default when absent.
    pub boot_seconds: Option<f64>,
    pub tags: Vec<(String, String)>,
    pub haenable: bool,
    /// Service offering name or id; the first offering when absent.
    pub offering: Option<String>,
    /// Template name or id; the first template when absent.
    pub template: Option<String>,
    /// A requested NIC address; the lowest free one when absent.
    pub ip: Option<Ipv4Addr>,
    /// Data disk: disk offering (index) and size in GB.
    pub data_disk: Option<(usize, u64)>,
    pub userdata: Option<Vec<u8>>,
    pub keypair: Option<String>,
    pub affinity_groups: Vec<usize>,
    pub details: Vec<(String, String)>,
    /// Set by deployVirtualMachine.
    pub deployed: bool,
}

impl VmSpec {
    /// A healthy VM that starts booting when created.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            id: None,
            display_name: None,
            state: VmState::Starting,
            guest: GuestKind::Healthy,
            profile: None,
            account: None,
            zone: None,
            network: None,
            project: None,
            host: None,
            boot_seconds: None,
            tags: Vec::new(),
            haenable: false,
            offering: None,
            template: None,
            ip: None,
            data_disk: None,
            userdata: None,
            keypair: None,
            affinity_groups: Vec::new(),
            details: Vec::new(),
            deployed: false,
        }
    }
}

impl World {
    /// All VMs ever created, in creation order (including expunged ones: check `removed`).
    pub fn vms(&self) -> &[Vm] {
        &self.vms
    }

    pub fn vm(&self, idx: usize) -> Option<&Vm> {
        self.vms.get(idx)
    }

    /// Index of the VM with this id (also for expunged VMs).
    pub fn vm_index_by_id(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    /// Index of a live VM by name, or any VM by id.
    pub fn vm_index(&self, name_or_id: &str) -> Option<usize> {
        self.by_name
            .get(name_or_id)
            .or_else(|| self.by_id.get(name_or_id))
            .copied()
    }

    /// Creates a VM at the current simulated time; returns its index.
    pub fn add_vm(&mut self, spec: &VmSpec) -> Result<usize, WorldError> {
        let name = spec.name.trim();
        if name.is_empty() {
            return Err(WorldError::Invalid("VM name must not be empty".into()));
        }
        if self.by_name.contains_key(name) {
            return Err(WorldError::Conflict(format!(
                "a VM named {name:?} already exists"
            )));
        }
        let id = match &spec.id {
            Some(id) if !is_canonical_uuid(id) => {
                return Err(WorldError::Invalid(format!(
                    "VM id {id:?} is not a lowercase canonical UUID"
                )))
            }
            Some(id) if self.by_id.contains_key(id.as_str()) => {
                return Err(WorldError::Conflict(format!("duplicate VM id {id}")))
            }
            Some(id) => id.clone(),
            None => new_uuid(),
        };
        let account = match spec
            .account
            .as_deref()
            .or(self.settings.default_account.as_deref())
        {
            Some(a) => self
                .account_index(a)
                .ok_or_else(|| WorldError::NotFound(format!("unknown account {a:?}")))?,
            None if self.accounts.is_empty() => {
                return Err(WorldError::NotFound("no account defined".into()))
            }
            None => 0,
        };
        let project = match &spec.project {
            Some(p) => Some(
                self.project_index(p)
                    .ok_or_else(|| WorldError::NotFound(format!("unknown project {p:?}")))?,
            ),
            None => None,
        };
        let zone = self.zone_or_first(spec.zone.as_deref())?;
        let network = match &spec.network {
            Some(n) => {
                let i = self
                    .network_index(n)
                    .ok_or_else(|| WorldError::NotFound(format!("unknown network {n:?}")))?;
                if self.networks[i].zone != zone {
                    return Err(WorldError::Invalid(format!(
                        "network {n:?} is not in zone {:?}",
                        self.zones[zone].name
                    )));
                }
                i
            }
            None => self
                .networks
                .iter()
                .position(|n| n.zone == zone)
                .ok_or_else(|| {
                    WorldError::NotFound(format!("zone {:?} has no network", self.zones[zone].name))
                })?,
        };
        let seq = self.next_seq;
        let host = match &spec.host {
            Some(h) => self
                .host_index(h)
                .ok_or_else(|| WorldError::NotFound(format!("unknown host {h:?}")))?,
            None => {
                let in_zone: Vec<usize> = (0..self.hosts.len())
                    .filter(|i| self.hosts[*i].zone == zone)
                    .collect();
                if in_zone.is_empty() {
                    return Err(WorldError::NotFound(format!(
                        "zone {:?} has no host",
                        self.zones[zone].name
                    )));
                }
                in_zone[(seq as usize) % in_zone.len()]
            }
        };
        let boot_s = spec.boot_seconds.unwrap_or(self.settings.boot_seconds);
        if !(boot_s.is_finite() && boot_s >= 0.0) {
            return Err(WorldError::Invalid(format!("bad boot_seconds {boot_s}")));
        }
        let offering = self.offering_for(spec.offering.as_deref(), zone)?;
        let template = self.template_for(spec.template.as_deref(), zone)?;
        let ip = match spec.ip {
            Some(want) if self.networks[network].allocate_exact(want) => Some(want),
            Some(want) => {
                return Err(WorldError::Conflict(format!(
                    "address {want} is not available in network {:?}",
                    self.networks[network].name
                )))
            }
            None => self.networks[network].allocate(),
        };
        if ip.is_none() && self.networks[network].kind != NetworkType::L2 {
            return Err(WorldError::Conflict(format!(
                "network {:?} has no free address",
                self.networks[network].name
            )));
        }
        let size = &self.service_offerings[offering];
        let (cpu_number, cpu_speed, memory_mb) = (size.cpu_number, size.cpu_speed, size.memory_mb);
        let now = self.now_ms;
        let c = self.ctx();
        let mac_n = seq & 0xffff_ffff;
        let mut vm = Vm {
            seq,
            id: id.clone(),
            name: name.to_string(),
            display_name: spec
                .display_name
                .clone()
                .unwrap_or_else(|| name.to_string()),
            account,
            project,
            zone,
            host,
            state: spec.state,
            created_ms: now,
            last_updated_ms: now,
            // A healthy spec boots what its template's image does (`set_template_guest`).
            guest: match (spec.guest, self.templates[template].guest) {
                (GuestKind::Healthy, Some(g)) => g,
                (g, _) => g,
            },
            faults: 0,
            boot_ms: secs_to_ms(boot_s),
            transition_at: None,
            migration_target: None,
            running_since: None,
            nic: Some(Nic {
                id: new_uuid(),
                mac: format!(
                    "02:00:{:02x}:{:02x}:{:02x}:{:02x}",
                    (mac_n >> 24) & 0xff,
                    (mac_n >> 16) & 0xff,
                    (mac_n >> 8) & 0xff,
                    mac_n & 0xff
                ),
                ip,
                network,
            }),
            segs: Vec::new(),
            profile_override: spec.profile,
            override_since: now,
            nic_down_since: None,
            gateway_lost_since: self.gateway_lost_since(network),
            kvm_prev: None,
            rows: StatsRows::default(),
            processed_ms: now,
            removed: false,
            tags: spec.tags.clone(),
            haenable: spec.haenable,
            cpu_number,
            cpu_speed,
            memory_mb,
            offering,
            template,
            root_volume_id: new_uuid(),
            data_disk: spec.data_disk.map(|(offering, size_gb)| DataDisk {
                id: new_uuid(),
                offering,
                size_gb,
            }),
            userdata: spec.userdata.clone(),
            keypair: spec.keypair.clone(),
            affinity_groups: spec.affinity_groups.clone(),
            details: spec.details.clone(),
            deployed: spec.deployed,
        };
        match spec.state {
            VmState::Starting if !vm.has(Fault::StallStarting) => {
                vm.transition_at = Some(now + vm.boot_ms)
            }
            VmState::Running => vm.start_running(now, &c),
            VmState::Destroyed => vm.transition_at = Some(now + c.expunge_delay_ms),
            VmState::Expunging => vm.transition_at = Some(now + c.expunge_ms),
            _ => {}
        }
        self.next_seq += 1;
        let idx = self.vms.len();
        self.by_id.insert(id, idx);
        self.by_name.insert(vm.name.clone(), idx);
        self.vms.push(vm);
        Ok(idx)
    }

    /// Creates `n` VMs named `<prefix>-<i>` (i from 0) from a template, quickly.
    pub fn add_vms(
        &mut self,
        n: usize,
        prefix: &str,
        template: &VmSpec,
    ) -> Result<Vec<usize>, WorldError> {
        self.vms.reserve(n);
        self.by_id.reserve(n);
        self.by_name.reserve(n);
        let mut spec = template.clone();
        spec.id = None;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            spec.name = format!("{prefix}-{i}");
            out.push(self.add_vm(&spec)?);
        }
        Ok(out)
    }

    /// Deletes a VM's data disk (destroyed together with the VM).
    pub fn drop_data_disk(&mut self, idx: usize) {
        if let Some(vm) = self.vms.get_mut(idx) {
            vm.data_disk = None;
        }
    }
}
