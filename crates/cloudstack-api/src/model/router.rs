//! The virtual router of a guest network (`listRouters`) and what it answers to
//! `runDiagnostics`, for the opt-in guest probe (docs/guest-probe.md §1, §4).
//!
//! Parsed as tolerantly as the VM model: unknown fields are ignored, everything but `id` and
//! `state` is optional, numbers sent as strings (and strings sent as numbers) are accepted.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::{lenient, ListItem, VmState};

/// One router of a `listRouters` page (`DomainRouterResponse`,
/// `api/.../response/DomainRouterResponse.java@b06ed655`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Router {
    pub id: String,
    #[serde(default)]
    pub name: String,
    /// A router is a VM: its state uses the VM vocabulary (`Running`, `Stopped`, …).
    pub state: VmState,
    /// `VIRTUAL_ROUTER` for what `listRouters` returns (it pins the role,
    /// `ListRoutersCmd.java@cf3a101d`).
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub role: Option<String>,
    #[serde(default, deserialize_with = "lenient::bool_or_false")]
    pub isredundantrouter: bool,
    /// `PRIMARY`, `BACKUP`, `FAULT` or `UNKNOWN` (`VirtualRouter.RedundantState`,
    /// `api/src/main/java/com/cloud/network/router/VirtualRouter.java@1502b605`); older
    /// releases said `MASTER` for `PRIMARY` (which release renamed it: unverified).
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub redundantstate: Option<String>,
    /// Set for a VPC router, which serves every tier of its VPC.
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub vpcid: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub guestipaddress: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub guestnetworkid: Option<String>,
    /// `runDiagnostics` needs the router to have a host: without one it fails with "Unable to
    /// find host for virtual machine instance" (`DiagnosticsServiceImpl.java@b9e01c15`).
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub hostid: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub hypervisor: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub zoneid: Option<String>,
    #[serde(default, rename = "nic", deserialize_with = "lenient::vec_or_empty")]
    pub nics: Vec<RouterNic>,
}

/// One NIC of a router (`NicResponse`, `api/.../response/NicResponse.java@267b9ed8`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct RouterNic {
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub id: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub networkid: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub ipaddress: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub gateway: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub netmask: Option<String>,
    /// `Guest`, `Public`, `Control`, …
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub traffictype: Option<String>,
    /// The network's type (`Isolated`, `Shared`, …), as on a VM's [`super::Nic`].
    #[serde(
        default,
        rename = "type",
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub network_type: Option<String>,
    #[serde(default, deserialize_with = "lenient::bool_or_false")]
    pub isdefault: bool,
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub macaddress: Option<String>,
    /// The NIC's device number; how it maps to the router's `ethN` is unverified
    /// (docs/guest-probe.md, "Suggested call").
    #[serde(
        default,
        deserialize_with = "lenient::string_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub deviceid: Option<String>,
}

impl Router {
    /// Only a Running router is worth asking: the diagnostics service never reads the state
    /// and fails late, through SSH or the agent, for one that is starting or stopping
    /// (`DiagnosticsServiceImpl.java@b9e01c15`).
    pub fn is_running(&self) -> bool {
        self.state == VmState::Running
    }

    /// The PRIMARY of a redundant pair (`MASTER` before the rename).
    pub fn is_primary(&self) -> bool {
        self.redundantstate
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("PRIMARY") || s.eq_ignore_ascii_case("MASTER"))
    }

    /// The router's NIC in `network_id`, if it shows one.
    pub fn nic_in(&self, network_id: &str) -> Option<&RouterNic> {
        self.nics.iter().find(|n| {
            n.networkid
                .as_deref()
                .is_some_and(|id| id.eq_ignore_ascii_case(network_id))
        })
    }

    /// Whether the router shows that it serves `network_id`: a NIC in it or its
    /// `guestnetworkid`. `listRouters networkid=…` already filters by NIC
    /// (`cloud.domain_router_view.sql@ef1b3540`); checking again keeps a server that ignored
    /// the filter from pointing the probe at another network's router.
    pub fn serves(&self, network_id: &str) -> bool {
        let guest = self
            .guestnetworkid
            .as_deref()
            .is_some_and(|id| id.eq_ignore_ascii_case(network_id));
        guest || self.nic_in(network_id).is_some()
    }

    /// 0 for the router to prefer, higher for worse. A switch to BACKUP takes down only the
    /// public interfaces and keeps the guest ones up (`CsRedundant.py@ab011806`, `set_backup`),
    /// so a BACKUP can arping too; then an unknown state, and FAULT last.
    fn preference(&self) -> u8 {
        let state = self.redundantstate.as_deref().unwrap_or("");
        if !self.isredundantrouter || self.is_primary() {
            0
        } else if state.eq_ignore_ascii_case("BACKUP") {
            1
        } else if state.eq_ignore_ascii_case("FAULT") {
            3
        } else {
            2
        }
    }
}

/// The router to run a probe from for `network_id`: Running, serving that network, the
/// PRIMARY of a redundant pair (or a router that is not redundant) first, docs/guest-probe.md
/// §4; then a BACKUP, then an unknown state, FAULT last; among equals the first in server order. `None`: the network has no usable router, and
/// the probe has no evidence.
pub fn pick_router<'r>(routers: &'r [Router], network_id: &str) -> Option<&'r Router> {
    if network_id.trim().is_empty() {
        return None;
    }
    routers
        .iter()
        .filter(|r| r.is_running() && r.serves(network_id))
        .min_by_key(|r| r.preference())
}

impl ListItem for Router {
    fn item_id(&self) -> Option<&str> {
        Some(&self.id)
    }
}

/// A `runDiagnostics` job's result (`RunDiagnosticsResponse`,
/// `api/.../response/RunDiagnosticsResponse.java@2a940403`): three strings, already split on
/// `&&` and trimmed by the agent (`DiagnosticsAnswer.java@102dce21`). `stdout` is often a
/// Python bytes literal (`b'…'`, docs/guest-probe.md §3); [`crate::diagnostics`] reads it.
/// A missing field reads as empty; a number is kept as its decimal text.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct DiagnosticsOutput {
    #[serde(default, deserialize_with = "text_or_empty")]
    pub stdout: String,
    #[serde(default, deserialize_with = "text_or_empty")]
    pub stderr: String,
    /// The tool's exit code as text (`"0"`); Marvin compares it with the string `'0'`
    /// (`test/integration/smoke/test_diagnostics.py@6819c237`).
    #[serde(default, deserialize_with = "text_or_empty")]
    pub exitcode: String,
}

fn text_or_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => s,
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{parse_list_page, Reply};

    /// A redundant pair of an isolated network, shaped like `listRouters` answers
    /// (`DomainRouterResponse`, `NicResponse`; `count` + `router`, cloudstack-go
    /// `RouterService.go@e463cd1c`), with a few of the liberties CloudStack versions take.
    const PAIR: &str = r#"{"listroutersresponse":{"count":2,"router":[
        {"id":"r-backup","name":"r-7-VM","state":"Running","role":"VIRTUAL_ROUTER",
         "isredundantrouter":true,"redundantstate":"BACKUP","guestnetworkid":"net-1",
         "guestipaddress":"10.1.1.2","hostid":"h-1","hypervisor":"KVM","zoneid":"z-1",
         "requiresupgrade":false,"healthcheckfailed":false,"networkdomain":"cs1cloud.internal",
         "nic":[{"id":"n-1","networkid":"net-1","ipaddress":"10.1.1.2","gateway":"10.1.1.1",
                 "netmask":"255.255.255.0","traffictype":"Guest","type":"Isolated",
                 "isdefault":false,"macaddress":"02:00:11:22:33:44","deviceid":"2"},
                {"id":"n-2","networkid":"net-pub","ipaddress":"192.0.2.10",
                 "traffictype":"Public","isdefault":true,"deviceid":3}]},
        {"id":"r-primary","name":"r-8-VM","state":"Running","role":"VIRTUAL_ROUTER",
         "isredundantrouter":"true","redundantstate":"PRIMARY","guestnetworkid":"net-1",
         "hostid":"h-2","nic":{"id":"n-3","networkid":"NET-1","ipaddress":"10.1.1.3",
         "macaddress":"02:00:11:22:33:55","deviceid":"2"}}]}}"#;

    fn routers(body: &str) -> Vec<Router> {
        let page = parse_list_page::<Router>("listRouters", "router", Reply::json(body.as_bytes()))
            .unwrap();
        assert!(page.is_clean(), "{:?}", page.failures);
        page.items
    }

    #[test]
    fn a_router_page_parses_with_nics() {
        let rs = routers(PAIR);
        assert_eq!(rs.len(), 2);
        let b = &rs[0];
        assert_eq!(b.id, "r-backup");
        assert_eq!(b.name, "r-7-VM");
        assert!(b.is_running() && b.isredundantrouter && !b.is_primary());
        assert_eq!(b.role.as_deref(), Some("VIRTUAL_ROUTER"));
        assert_eq!(b.hostid.as_deref(), Some("h-1"));
        assert_eq!(b.hypervisor.as_deref(), Some("KVM"));
        assert_eq!(b.zoneid.as_deref(), Some("z-1"));
        assert_eq!(b.guestipaddress.as_deref(), Some("10.1.1.2"));
        assert_eq!(b.vpcid, None);
        assert_eq!(b.nics.len(), 2);
        let n = &b.nics[0];
        assert_eq!(n.gateway.as_deref(), Some("10.1.1.1"));
        assert_eq!(n.netmask.as_deref(), Some("255.255.255.0"));
        assert_eq!(n.traffictype.as_deref(), Some("Guest"));
        assert_eq!(n.network_type.as_deref(), Some("Isolated"));
        assert_eq!(n.macaddress.as_deref(), Some("02:00:11:22:33:44"));
        assert_eq!(n.deviceid.as_deref(), Some("2"));
        assert!(b.nics[1].isdefault);
        assert_eq!(
            b.nics[1].deviceid.as_deref(),
            Some("3"),
            "a number is kept as text"
        );
        // `"true"` as a string, and a single NIC object instead of an array
        let p = &rs[1];
        assert!(p.isredundantrouter && p.is_primary());
        assert_eq!(p.nics.len(), 1);
        assert_eq!(
            p.nic_in("net-1").map(|n| n.id.as_deref()),
            Some(Some("n-3"))
        );
        assert_eq!(crate::model::ListItem::item_id(p), Some("r-primary"));
    }

    #[test]
    fn a_router_without_id_or_state_is_reported_not_dropped() {
        let page = parse_list_page::<Router>(
            "listRouters",
            "router",
            Reply::json(br#"{"listroutersresponse":{"count":3,"router":[{"id":"a","state":"Running"},{"id":"b"},{"state":"Running"}]}}"#),
        )
        .unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.failures.len(), 2);
        assert_eq!(page.failures[0].id.as_deref(), Some("b"));
    }

    #[test]
    fn the_primary_is_picked_before_a_backup_listed_first() {
        let rs = routers(PAIR);
        assert_eq!(
            pick_router(&rs, "net-1").map(|r| r.id.as_str()),
            Some("r-primary")
        );
        // ids compare without regard to case
        assert_eq!(
            pick_router(&rs, "NET-1").map(|r| r.id.as_str()),
            Some("r-primary")
        );
        // without the primary, the backup
        assert_eq!(
            pick_router(&rs[..1], "net-1").map(|r| r.id.as_str()),
            Some("r-backup")
        );
        // a router that does not show the network is never picked
        assert!(pick_router(&rs, "net-other").is_none());
        assert!(pick_router(&rs, " ").is_none());
        assert!(pick_router(&[], "net-1").is_none());
    }

    #[test]
    fn only_running_routers_are_picked_and_master_counts_as_primary() {
        let mut rs = routers(PAIR);
        rs[1].state = VmState::Stopping;
        assert_eq!(
            pick_router(&rs, "net-1").map(|r| r.id.as_str()),
            Some("r-backup")
        );
        rs[0].state = VmState::Stopped;
        assert!(pick_router(&rs, "net-1").is_none());

        let mut rs = routers(PAIR);
        rs[0].redundantstate = Some("FAULT".into());
        rs[1].redundantstate = Some("MASTER".into());
        assert_eq!(
            pick_router(&rs, "net-1").map(|r| r.id.as_str()),
            Some("r-primary")
        );
        // FAULT comes after any other state, even one listed later
        rs[1].redundantstate = Some("UNKNOWN".into());
        assert_eq!(
            pick_router(&rs, "net-1").map(|r| r.id.as_str()),
            Some("r-primary")
        );
    }

    #[test]
    fn a_single_router_or_a_vpc_router_serves_through_its_nic() {
        let vpc: Router = serde_json::from_str(
            r#"{"id":"v","state":"Running","vpcid":"vpc-1","isredundantrouter":false,
                "redundantstate":"UNKNOWN","nic":[{"networkid":"tier-1"},{"networkid":"tier-2"}]}"#,
        )
        .unwrap();
        let rs = [vpc];
        assert_eq!(pick_router(&rs, "tier-2").map(|r| r.id.as_str()), Some("v"));
        assert!(pick_router(&rs, "tier-3").is_none());
    }

    #[test]
    fn diagnostics_output_takes_strings_and_numbers() {
        let o: DiagnosticsOutput =
            serde_json::from_str(r#"{"stdout":"b'x'","stderr":"b''","exitcode":"1"}"#).unwrap();
        assert_eq!(
            (o.stdout.as_str(), o.stderr.as_str(), o.exitcode.as_str()),
            ("b'x'", "b''", "1")
        );
        let o: DiagnosticsOutput =
            serde_json::from_str(r#"{"stdout":"x","exitcode":0,"stderr":null,"new":1}"#).unwrap();
        assert_eq!((o.stderr.as_str(), o.exitcode.as_str()), ("", "0"));
        let o: DiagnosticsOutput = serde_json::from_str("{}").unwrap();
        assert_eq!(o, DiagnosticsOutput::default());
    }
}
