//! Virtual routers: the system VM (role `VIRTUAL_ROUTER`) `VirtualRouterElement` deploys for
//! a guest network whose offering maps a service to the VirtualRouter provider
//! (`server/.../network/element/VirtualRouterElement.java@ea7d3226`: `canHandle` →
//! `isProviderSupportServiceInNetwork`, `prepare`, `implement`; docs/guest-probe.md §4).
//! L2 networks and router-less Shared networks have none.
//!
//! One router per network (no redundant pairs, no VPCs). Its guest NIC is `eth0`
//! (`deviceid` 0) on the network, its control NIC `eth1` (link-local). A router that is not
//! Stopped runs on a host of its zone; a Stopped one has none (guest-probe.md §2 step 2 expects
//! the host to be cleared on stop: **unverified** there, modelled so).

use std::net::Ipv4Addr;

use super::{new_uuid, Hypervisor, Ms, NetworkType, Owner, World, WorldError};

/// The router states the simulator lets tests set (`VirtualMachine.State` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouterState {
    Running,
    Stopped,
    Starting,
}

impl RouterState {
    pub const ALL: [RouterState; 3] = [Self::Running, Self::Stopped, Self::Starting];

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "Running",
            Self::Stopped => "Stopped",
            Self::Starting => "Starting",
        }
    }

    pub fn names() -> String {
        Self::ALL.map(RouterState::as_str).join(", ")
    }
}

#[derive(Debug, Clone)]
pub struct Router {
    /// Internal id: `r-<seq>-VM`, and the id "Unable to find …" texts print. The simulator
    /// numbers routers on their own (CloudStack shares `vm_instance` ids with user VMs; kept
    /// apart so that adding routers does not renumber VMs).
    pub seq: u64,
    pub id: String,
    /// Name and instance name, `r-<seq>-VM`.
    pub name: String,
    /// The guest network it serves (index).
    pub network: usize,
    pub zone: usize,
    pub state: RouterState,
    /// The host it runs on; `None` when Stopped (or while its zone has no host).
    pub host: Option<usize>,
    pub hypervisor: Hypervisor,
    /// The guest NIC (`eth0`): the network's gateway on an Isolated network (the router is
    /// the gateway), an address of the guest range on a Shared one.
    pub guest_ip: Ipv4Addr,
    pub guest_nic_id: String,
    pub guest_mac: String,
    /// The control NIC (`eth1`, link-local; what `getSystemVMAccessDetails` gives SSH).
    pub control_nic_id: String,
    pub link_local_ip: Ipv4Addr,
    pub created_ms: Ms,
    /// Since when it is Stopped (set by `set_router_state_now`; a router deployed Stopped
    /// counts from its deployment).
    pub stopped_since: Option<Ms>,
    /// Diagnostics on one router run one at a time: every `NetworkElementCommand` for one
    /// router takes the same per-router lock on the agent (`VirtualRoutingResource.java@07a22304`,
    /// guest-probe.md §2 step 5). When the last queued one ends.
    pub busy_until: Ms,
}

impl Router {
    /// The owner of the router: the owner of its network.
    pub fn owner(&self, w: &World) -> Owner {
        w.networks
            .get(self.network)
            .map_or(Owner::System, |n| n.owner)
    }
}

impl World {
    /// Deploys the router of network `network` in `state`; returns its index.
    pub(super) fn add_router(
        &mut self,
        network: usize,
        state: RouterState,
    ) -> Result<usize, WorldError> {
        let seq = self.next_router_seq;
        let n = &mut self.networks[network];
        let guest_ip = match n.kind {
            NetworkType::Isolated => Some(n.gateway),
            // The address CloudStack picks for a Shared network's router is not modelled:
            // the top of the range, so VM addresses (from the bottom) stay as they were.
            _ => n.allocate_top(),
        }
        .ok_or_else(|| {
            WorldError::Conflict(format!(
                "network {:?} has no free address for its virtual router",
                n.name
            ))
        })?;
        let zone = n.zone;
        self.next_router_seq += 1;
        let m = seq & 0xffff_ffff;
        let idx = self.routers.len();
        self.routers.push(Router {
            seq,
            id: new_uuid(),
            name: format!("r-{seq}-VM"),
            network,
            zone,
            state,
            host: None,
            hypervisor: Hypervisor::default(),
            guest_ip,
            guest_nic_id: new_uuid(),
            guest_mac: format!(
                "02:01:{:02x}:{:02x}:{:02x}:{:02x}",
                (m >> 24) & 0xff,
                (m >> 16) & 0xff,
                (m >> 8) & 0xff,
                m & 0xff
            ),
            control_nic_id: new_uuid(),
            link_local_ip: Ipv4Addr::new(169, 254, ((seq >> 8) & 0xff) as u8, (seq & 0xff) as u8),
            created_ms: self.now_ms,
            stopped_since: (state == RouterState::Stopped).then_some(self.now_ms),
            busy_until: self.now_ms,
        });
        self.place_router(idx);
        Ok(idx)
    }

    /// Gives a router that is not Stopped a host of its zone (spread by its id), or takes the
    /// host away from a Stopped one.
    fn place_router(&mut self, idx: usize) {
        let r = &self.routers[idx];
        if r.state == RouterState::Stopped {
            self.routers[idx].host = None;
            return;
        }
        if r.host.is_some() {
            return;
        }
        let in_zone: Vec<usize> = (0..self.hosts.len())
            .filter(|h| self.hosts[*h].zone == r.zone)
            .collect();
        if in_zone.is_empty() {
            return;
        }
        let h = in_zone[(r.seq as usize) % in_zone.len()];
        let hv = self.hosts[h].hypervisor;
        let r = &mut self.routers[idx];
        r.host = Some(h);
        r.hypervisor = hv;
    }

    /// Places routers that wait for a host (their zone had none when they were deployed).
    pub(super) fn place_routers(&mut self) {
        for i in 0..self.routers.len() {
            self.place_router(i);
        }
    }

    /// A router by id or name.
    pub fn router_index(&self, id_or_name: &str) -> Option<usize> {
        self.routers
            .iter()
            .position(|r| r.id == id_or_name || r.name == id_or_name)
    }

    /// A router by UUID alone (API parameters).
    pub fn router_by_id(&self, id: &str) -> Option<usize> {
        self.routers.iter().position(|r| r.id == id)
    }

    /// The routers (indices) of a network.
    pub fn routers_of(&self, network: usize) -> Vec<usize> {
        (0..self.routers.len())
            .filter(|i| self.routers[*i].network == network)
            .collect()
    }

    /// Sets a router's state now: Stopped clears its host, Running and Starting give it one.
    pub fn set_router_state_now(
        &mut self,
        idx: usize,
        state: RouterState,
    ) -> Result<(), WorldError> {
        let r = self
            .routers
            .get_mut(idx)
            .ok_or_else(|| WorldError::NotFound(format!("no router #{idx}")))?;
        r.stopped_since = match (state, r.stopped_since) {
            (RouterState::Stopped, Some(t)) => Some(t),
            (RouterState::Stopped, None) => Some(self.now_ms),
            _ => None,
        };
        r.state = state;
        let network = r.network;
        self.place_router(idx);
        self.refresh_gateway(network);
        Ok(())
    }

    /// Since when the guests of `network` have no answering gateway: the network lost its
    /// uplink, or it is Isolated and its virtual router is Stopped. On an Isolated network the
    /// router *is* the gateway: `VirtualRouterElement.java@ea7d3226` `setCapabilities` lists
    /// `Service.Gateway` (with Dhcp, Dns, UserData, SourceNat) and the router's guest NIC
    /// takes the network's gateway address (`add_router` above). On a Shared network the
    /// gateway is the physical router: a stopped virtual router takes DHCP, DNS and user data
    /// away, which running guests with a lease do not miss at once (lease expiry is not
    /// modelled), so their traffic does not change.
    pub fn gateway_lost_since(&self, network: usize) -> Option<Ms> {
        let n = self.networks.get(network)?;
        let router = (n.kind == NetworkType::Isolated)
            .then(|| {
                self.routers
                    .iter()
                    .filter(|r| r.network == network)
                    .filter_map(|r| r.stopped_since)
                    .min()
            })
            .flatten();
        match (n.uplink_lost_since, router) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A guest network loses (`up == false`) or gets back its uplink now. CloudStack does not
    /// notice: a network has no state for it (`Network.java@c7c4db76` `State`: Allocated,
    /// Setup, Implementing, Implemented, Shutdown, Destroy) and the router stays Running;
    /// only the guests see it: their ARP requests for the gateway go unanswered and kubeadm's
    /// and kubelet's connections are retried (profile `waiting-for-endpoint-arp` from the
    /// change on, until the uplink is back).
    pub fn set_network_uplink_now(&mut self, network: usize, up: bool) -> Result<(), WorldError> {
        let now = self.now_ms;
        let n = self
            .networks
            .get_mut(network)
            .ok_or_else(|| WorldError::NotFound(format!("no network #{network}")))?;
        n.uplink_lost_since = match (up, n.uplink_lost_since) {
            (true, _) => None,
            (false, Some(t)) => Some(t),
            (false, None) => Some(now),
        };
        self.refresh_gateway(network);
        Ok(())
    }

    /// Gives every VM of `network` the network's gateway state, folding traffic at now.
    fn refresh_gateway(&mut self, network: usize) {
        let lost = self.gateway_lost_since(network);
        let t = self.now_ms;
        let c = self.ctx();
        for vm in self
            .vms
            .iter_mut()
            .filter(|v| !v.removed && v.nic.as_ref().is_some_and(|n| n.network == network))
        {
            if vm.gateway_lost_since != lost {
                vm.change_flags(t, &c, |v| v.gateway_lost_since = lost);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::world::test_support::world;
    use crate::world::*;

    #[test]
    fn routers_follow_the_offering_and_stopped_ones_have_no_host() {
        let mut w = world();
        // The default Shared network has a router holding the top of its range.
        assert_eq!(w.routers.len(), 1);
        assert_eq!(w.routers[0].guest_ip.to_string(), "10.0.255.254");
        assert!(w.routers[0].host.is_some());
        let iso = w
            .add_network(
                "iso",
                None,
                None,
                "10.1.1.0/24",
                None,
                NetworkType::Isolated,
            )
            .unwrap();
        let l2 = w
            .add_network("l2", None, None, "10.2.0.0/24", None, NetworkType::L2)
            .unwrap();
        let mut spec = NetworkSpec::new("bare", "10.3.0.0/24", NetworkType::Shared);
        spec.virtual_router = Some(false);
        let bare = w.add_network_spec(&spec).unwrap();
        assert_eq!(w.routers_of(iso).len(), 1);
        assert!(w.routers_of(l2).is_empty());
        assert!(w.routers_of(bare).is_empty());
        let r = w.routers_of(iso)[0];
        assert_eq!(w.routers[r].guest_ip.to_string(), "10.1.1.1");
        w.set_router_state_now(r, RouterState::Stopped).unwrap();
        assert_eq!(w.routers[r].host, None);
        w.set_router_state_now(r, RouterState::Starting).unwrap();
        assert!(w.routers[r].host.is_some());
    }
}
