//! Infrastructure: zones, guest networks and their address pools (hosts: `hosts.rs`).

use std::collections::HashSet;
use std::net::Ipv4Addr;

use super::{unique_name, RouterState, World, WorldError};

#[derive(Debug, Clone)]
pub struct Zone {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkType {
    Shared,
    Isolated,
    L2,
}

impl NetworkType {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Shared" => Some(Self::Shared),
            "Isolated" => Some(Self::Isolated),
            "L2" => Some(Self::L2),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "Shared",
            Self::Isolated => "Isolated",
            Self::L2 => "L2",
        }
    }
}

/// Who owns a guest network (and so its virtual router, which is deployed for the
/// network's owner: `domain_router_view` joins the router's `account_id`,
/// `cloud.domain_router_view.sql@ef1b3540`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    /// CloudStack's `system` account (id 1). Domain-wide (Shared) networks belong to it in the
    /// simulator; that CloudStack gives them this owner is **unverified** in
    /// `docs/guest-probe.md`.
    System,
    /// An account (index).
    Account(usize),
    /// A project (index): the project's own account (`PrjAcct-…`) owns it, and the project
    /// filters of `buildACLSearchParameters` apply (`AccountManagerImpl.java@43d42b06`).
    Project(usize),
}

/// What to create with [`World::add_network_spec`] (admin API, scenario, library).
#[derive(Debug, Clone)]
pub struct NetworkSpec {
    pub name: String,
    /// Fixed id (lowercase canonical UUID); random when absent.
    pub id: Option<String>,
    /// Zone name or id; the first zone when absent.
    pub zone: Option<String>,
    pub cidr: String,
    pub gateway: Option<String>,
    pub kind: NetworkType,
    /// Whether the network's offering maps a service to the VirtualRouter provider, i.e.
    /// whether `VirtualRouterElement` deploys a router for it
    /// (`VirtualRouterElement.java@ea7d3226`: `canHandle` → `isProviderSupportServiceInNetwork`).
    /// Absent: the default offering of the type decides (Isolated and Shared yes, L2 never).
    pub virtual_router: Option<bool>,
    /// Owning account name (Isolated/L2 default: the default account; Shared: `system`).
    pub account: Option<String>,
    /// Owning project (name or id); wins over `account`.
    pub project: Option<String>,
    /// State of the network's router when it has one (default Running).
    pub router_state: Option<RouterState>,
}

impl NetworkSpec {
    pub fn new(name: impl Into<String>, cidr: impl Into<String>, kind: NetworkType) -> Self {
        Self {
            name: name.into(),
            id: None,
            zone: None,
            cidr: cidr.into(),
            gateway: None,
            kind,
            virtual_router: None,
            account: None,
            project: None,
            router_state: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Network {
    pub id: String,
    pub name: String,
    pub zone: usize,
    pub kind: NetworkType,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
    pub vlan: u32,
    pub owner: Owner,
    /// The offering provides a service through the VirtualRouter provider (see
    /// [`NetworkSpec::virtual_router`]); such a network has a router in `World::routers`.
    pub virtual_router: bool,
    /// The address range NICs get addresses from (CloudStack's guest IP range).
    first_host: u32,
    last_host: u32,
    /// Addresses held by NICs of VMs that are not expunged.
    used: HashSet<u32>,
    /// Lowest address that may be free (allocation scans upwards from here).
    hint: u32,
    /// Since when the network has lost its uplink (`World::set_network_uplink_now`).
    pub uplink_lost_since: Option<super::Ms>,
}

impl Network {
    pub fn netmask(&self) -> Ipv4Addr {
        let m = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix))
        };
        Ipv4Addr::from(m)
    }

    /// Whether `ip` is in the guest range (the gateway excluded).
    pub fn in_range(&self, ip: u32) -> bool {
        self.kind != NetworkType::L2
            && (self.first_host..=self.last_host).contains(&ip)
            && ip != u32::from(self.gateway)
    }

    /// Every address of the guest range, in order.
    pub fn range(&self) -> impl Iterator<Item = u32> + '_ {
        let gw = u32::from(self.gateway);
        let end = if self.kind == NetworkType::L2 {
            self.first_host.saturating_sub(1)
        } else {
            self.last_host
        };
        (self.first_host..=end).filter(move |ip| *ip != gw)
    }

    pub fn is_used(&self, ip: u32) -> bool {
        self.used.contains(&ip)
    }

    /// How many addresses NICs hold.
    pub fn used_count(&self) -> usize {
        self.used.len()
    }

    /// The lowest free address.
    pub(super) fn allocate(&mut self) -> Option<Ipv4Addr> {
        if self.kind == NetworkType::L2 {
            return None;
        }
        let mut ip = self.hint.max(self.first_host);
        while ip <= self.last_host {
            if self.in_range(ip) && !self.used.contains(&ip) {
                self.used.insert(ip);
                self.hint = ip + 1;
                return Some(Ipv4Addr::from(ip));
            }
            ip += 1;
        }
        None
    }

    /// Takes a requested address; `false` when it is outside the range or held.
    pub(super) fn allocate_exact(&mut self, ip: Ipv4Addr) -> bool {
        let v = u32::from(ip);
        self.in_range(v) && self.used.insert(v)
    }

    /// The highest free address of the range (taken for a Shared network's router, so that
    /// VM addresses, allocated from the bottom, stay where they were).
    pub(super) fn allocate_top(&mut self) -> Option<Ipv4Addr> {
        let gw = u32::from(self.gateway);
        let ip = (self.first_host..=self.last_host)
            .rev()
            .find(|ip| *ip != gw && !self.used.contains(ip))?;
        self.used.insert(ip);
        Some(Ipv4Addr::from(ip))
    }

    /// Returns an address to the pool (its VM was expunged).
    fn release(&mut self, ip: Ipv4Addr) {
        let v = u32::from(ip);
        if self.used.remove(&v) {
            self.hint = self.hint.min(v);
        }
    }
}

/// Parses `a.b.c.d/len`; returns (network address, prefix).
pub fn parse_cidr(s: &str) -> Option<(u32, u8)> {
    let (ip, len) = s.split_once('/')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    if !(8..=30).contains(&len) {
        return None;
    }
    let mask = u32::MAX << (32 - u32::from(len));
    Some((u32::from(ip) & mask, len))
}

impl World {
    pub fn add_zone(&mut self, name: &str, id: Option<&str>) -> Result<usize, WorldError> {
        unique_name(&self.zones, |z| &z.name, "zone", name)?;
        let id = self.check_id(id, "zone", |i| self.zones.iter().any(|z| z.id == i))?;
        self.zones.push(Zone {
            id,
            name: name.to_string(),
        });
        Ok(self.zones.len() - 1)
    }

    pub fn zone_index(&self, name_or_id: &str) -> Option<usize> {
        self.zones
            .iter()
            .position(|z| z.name == name_or_id || z.id == name_or_id)
    }

    pub(super) fn zone_or_first(&self, z: Option<&str>) -> Result<usize, WorldError> {
        match z {
            Some(z) => self
                .zone_index(z)
                .ok_or_else(|| WorldError::NotFound(format!("unknown zone {z:?}"))),
            None if self.zones.is_empty() => Err(WorldError::NotFound("no zone defined".into())),
            None => Ok(0),
        }
    }

    /// Adds a network with addresses from `cidr` (`gateway` defaults to the first address),
    /// the default offering of its type and owner (see [`NetworkSpec`]).
    pub fn add_network(
        &mut self,
        name: &str,
        id: Option<&str>,
        zone: Option<&str>,
        cidr: &str,
        gateway: Option<&str>,
        kind: NetworkType,
    ) -> Result<usize, WorldError> {
        let mut spec = NetworkSpec::new(name, cidr, kind);
        spec.id = id.map(str::to_string);
        spec.zone = zone.map(str::to_string);
        spec.gateway = gateway.map(str::to_string);
        self.add_network_spec(&spec)
    }

    /// Adds a network, and its virtual router when its offering has a VirtualRouter service.
    pub fn add_network_spec(&mut self, spec: &NetworkSpec) -> Result<usize, WorldError> {
        let (name, id, cidr, kind) = (
            spec.name.as_str(),
            spec.id.as_deref(),
            spec.cidr.as_str(),
            spec.kind,
        );
        let gateway = spec.gateway.as_deref();
        unique_name(&self.networks, |n| &n.name, "network", name)?;
        let zone = self.zone_or_first(spec.zone.as_deref())?;
        let owner = self.network_owner(spec)?;
        // L2 networks have no service at all, so no VirtualRouter service (guest-probe.md §4).
        let virtual_router = spec.virtual_router.unwrap_or(true) && kind != NetworkType::L2;
        if spec.virtual_router == Some(true) && kind == NetworkType::L2 {
            return Err(WorldError::Invalid(format!(
                "network {name:?}: an L2 network has no VirtualRouter service, so no router"
            )));
        }
        let (base, prefix) = parse_cidr(cidr).ok_or_else(|| {
            WorldError::Invalid(format!(
                "bad cidr {cidr:?} (expected a.b.c.d/len with len 8..30)"
            ))
        })?;
        let broadcast = base | !(u32::MAX << (32 - u32::from(prefix)));
        let gateway = match gateway {
            Some(g) => {
                let ip: Ipv4Addr = g
                    .parse()
                    .map_err(|_| WorldError::Invalid(format!("bad gateway {g:?}")))?;
                let v = u32::from(ip);
                if v <= base || v >= broadcast {
                    return Err(WorldError::Invalid(format!(
                        "gateway {g} is outside {cidr}"
                    )));
                }
                ip
            }
            None => Ipv4Addr::from(base + 1),
        };
        let id = self.check_id(id, "network", |i| self.networks.iter().any(|n| n.id == i))?;
        let vlan = 1000 + self.networks.len() as u32;
        self.networks.push(Network {
            id,
            name: name.to_string(),
            zone,
            kind,
            prefix,
            gateway,
            vlan,
            owner,
            virtual_router,
            first_host: base + 10.min(broadcast - base - 1),
            last_host: broadcast - 1,
            used: HashSet::new(),
            hint: 0,
            uplink_lost_since: None,
        });
        let idx = self.networks.len() - 1;
        if virtual_router {
            let state = spec.router_state.unwrap_or(RouterState::Running);
            if let Err(e) = self.add_router(idx, state) {
                self.networks.pop();
                return Err(e);
            }
        }
        Ok(idx)
    }

    /// The owner a network spec names (project over account; defaults per type).
    fn network_owner(&self, spec: &NetworkSpec) -> Result<Owner, WorldError> {
        if let Some(p) = &spec.project {
            return self
                .project_index(p)
                .map(Owner::Project)
                .ok_or_else(|| WorldError::NotFound(format!("unknown project {p:?}")));
        }
        let lookup = |a: &str| {
            self.account_index(a)
                .map(Owner::Account)
                .ok_or_else(|| WorldError::NotFound(format!("unknown account {a:?}")))
        };
        if let Some(a) = &spec.account {
            return lookup(a);
        }
        if spec.kind == NetworkType::Shared || self.accounts.is_empty() {
            return Ok(Owner::System);
        }
        // Like a VM without an account: the default account, else the first one.
        match self.settings.default_account.as_deref() {
            Some(a) => lookup(a),
            None => Ok(Owner::Account(0)),
        }
    }

    /// Sets a network's owner (scenario files name projects after their networks).
    pub fn set_network_owner(&mut self, network: usize, owner: Owner) -> Result<(), WorldError> {
        let ok = match owner {
            Owner::System => true,
            Owner::Account(a) => a < self.accounts.len(),
            Owner::Project(p) => p < self.projects.len(),
        };
        let n = self
            .networks
            .get_mut(network)
            .ok_or_else(|| WorldError::NotFound(format!("no network #{network}")))?;
        if !ok {
            return Err(WorldError::NotFound(format!("{owner:?} does not exist")));
        }
        n.owner = owner;
        Ok(())
    }

    pub fn network_index(&self, name_or_id: &str) -> Option<usize> {
        self.networks
            .iter()
            .position(|n| n.name == name_or_id || n.id == name_or_id)
    }

    // Lookups by UUID alone, as API parameters name objects (`*_index` also take names).

    pub fn zone_by_id(&self, id: &str) -> Option<usize> {
        self.zones.iter().position(|z| z.id == id)
    }

    pub fn network_by_id(&self, id: &str) -> Option<usize> {
        self.networks.iter().position(|n| n.id == id)
    }

    /// Returns an expunged VM's NIC address (network index, address) to the network's pool.
    pub(super) fn release_address(&mut self, (network, ip): (usize, Ipv4Addr)) {
        if let Some(n) = self.networks.get_mut(network) {
            n.release(ip);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::world::test_support::{world, T0};
    use crate::world::*;

    #[test]
    fn expunged_addresses_are_reused_and_exact_requests_are_checked() {
        let mut w = world();
        w.settings.expunge_seconds = 1.0;
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        let first = w.vm(a).unwrap().visible_ip().unwrap();
        let mut taken = VmSpec::new("b");
        taken.ip = Some(first);
        assert!(matches!(w.add_vm(&taken), Err(WorldError::Conflict(_))));
        w.destroy_vm_now(a, true);
        assert_eq!(w.vm(a).unwrap().state, VmState::Expunging);
        w.advance_to(T0 + 2_000);
        assert!(w.vm(a).unwrap().removed);
        let b = w.add_vm(&taken).unwrap();
        assert_eq!(w.vm(b).unwrap().visible_ip(), Some(first));
        let c = w.add_vm(&VmSpec::new("c")).unwrap();
        assert_ne!(w.vm(c).unwrap().visible_ip(), Some(first));
    }

    #[test]
    fn address_allocation_skips_gateway_and_is_unique() {
        let mut w = world();
        let v = w.add_vms(100, "x", &VmSpec::new("t")).unwrap();
        let mut ips: Vec<_> = v
            .iter()
            .map(|i| w.vm(*i).unwrap().visible_ip().unwrap())
            .collect();
        ips.sort();
        ips.dedup();
        assert_eq!(ips.len(), 100);
        assert!(!ips.contains(&w.networks[0].gateway));
    }
}
