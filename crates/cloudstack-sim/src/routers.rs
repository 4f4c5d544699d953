//! Handlers of `listRouters` and `runDiagnostics` (docs/guest-probe.md §1–§5): the virtual
//! routers of guest networks and the probe a root admin can run inside one.

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use super::api::{ApiError, Call, Reply};
use super::directory::{
    account_param, check_domain, cidr_of, page, permission_denied, uuid_param, zone_param,
    ROOT_DOMAIN,
};
use super::provisioning::async_reply;
use super::world::{
    format_time, AccountType, DiagRequest, DiagTarget, NetworkType, Owner, Router, World,
};

// ---- listRouters --------------------------------------------------------------------------

/// `ListProjectResourcesCriteria` of `buildACLSearchParameters`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Criteria {
    SkipProjectResources,
    ListProjectResourcesOnly,
    ListAllIncludingProjectResources,
}

/// Which owners' routers the caller sees: `AccountManagerImpl.buildACLSearchParameters`
/// (`AccountManagerImpl.java@43d42b06`, guest-probe.md §4). `permitted` empty = any owner
/// (the simulator has only the ROOT domain, so "recursive from the caller's domain" is
/// everything).
fn acl(
    call: &Call<'_>,
    id: Option<usize>,
    listall: bool,
) -> Result<(HashSet<Owner>, Option<Criteria>), ApiError> {
    let w: &World = call.world;
    let caller = call.caller;
    let kind = call.caller_account().kind;
    let domain_given = call.get_nonempty("domainid").is_some();
    let mut permitted = HashSet::new();
    let account = account_param(call)?;
    let project = call.get_nonempty("projectid");
    if account.is_some() && project.is_some() {
        return Err(ApiError::invalid_value(
            "Account and projectId can't be specified together",
        ));
    }
    if let Some(a) = account {
        if kind == AccountType::User && a != caller {
            return Err(permission_denied(format!(
                "Account {} does not have permission to access account {}",
                call.caller_account().name,
                w.accounts[a].name
            )));
        }
        permitted.insert(Owner::Account(a));
    }
    let mut criteria = None;
    match project {
        Some("-1") => {
            criteria = Some(Criteria::ListProjectResourcesOnly);
            if kind != AccountType::Admin {
                permitted.extend(
                    (0..w.projects.len())
                        .filter(|p| w.projects[*p].members.contains(&caller))
                        .map(Owner::Project),
                );
                // "permittedAccounts can be empty when the caller is not a part of any
                // project (a domain account)".
                if permitted.is_empty() || listall {
                    permitted.insert(Owner::Account(caller));
                }
            }
            if listall {
                criteria = Some(Criteria::ListAllIncludingProjectResources);
            }
        }
        Some(p) => {
            let p = w
                .projects
                .iter()
                .position(|x| x.id == p)
                .ok_or_else(|| call.bad("projectid", p))?;
            // canAccessProjectAccount: admins any project, users their own.
            if kind == AccountType::User && !w.projects[p].members.contains(&caller) {
                return Err(permission_denied(format!(
                    "Account {} can't access project id={}",
                    call.caller_account().name,
                    w.projects[p].id
                )));
            }
            permitted.insert(Owner::Project(p));
        }
        None => {
            if id.is_none() {
                criteria = Some(Criteria::SkipProjectResources);
            }
            if permitted.is_empty() && !domain_given {
                if kind == AccountType::User || (!listall && id.is_none()) {
                    permitted.insert(Owner::Account(caller));
                }
            } else if domain_given && kind == AccountType::User {
                permitted.insert(Owner::Account(caller));
            }
        }
    }
    Ok((permitted, criteria))
}

fn owner_fields(w: &World, owner: Owner, m: &mut Map<String, Value>) {
    match owner {
        Owner::Project(p) => {
            let p = &w.projects[p];
            m.insert("account".into(), json!(p.account_name));
            m.insert("projectid".into(), json!(p.id));
            m.insert("project".into(), json!(p.name));
        }
        Owner::Account(a) => {
            let name = w.accounts.get(a).map(|a| a.name.as_str());
            m.insert("account".into(), json!(name));
        }
        Owner::System => {
            m.insert("account".into(), json!("system"));
        }
    }
    m.insert("domainid".into(), json!(w.domain_id));
    m.insert("domain".into(), json!(ROOT_DOMAIN));
}

/// A router as `DomainRouterResponse` (`DomainRouterResponse.java@b06ed655`) with its guest
/// NIC as `NicResponse` (`NicResponse.java@267b9ed8`). Not redundant (`redundantstate`
/// UNKNOWN, the state CloudStack keeps for a non-redundant router: **unverified**), no VPC.
pub(crate) fn router_json(w: &World, r: &Router) -> Value {
    let n = &w.networks[r.network];
    let zone = &w.zones[r.zone];
    let mut m = Map::new();
    m.insert("id".into(), json!(r.id));
    m.insert("name".into(), json!(r.name));
    m.insert("state".into(), json!(r.state.as_str()));
    m.insert("role".into(), json!("VIRTUAL_ROUTER"));
    m.insert("isredundantrouter".into(), json!(false));
    m.insert("redundantstate".into(), json!("UNKNOWN"));
    m.insert("guestipaddress".into(), json!(r.guest_ip.to_string()));
    m.insert("guestmacaddress".into(), json!(r.guest_mac));
    m.insert("guestnetmask".into(), json!(n.netmask().to_string()));
    m.insert("guestnetworkid".into(), json!(n.id));
    m.insert("guestnetworkname".into(), json!(n.name));
    m.insert(
        "networkdomain".into(),
        json!(format!("cs{}sim.internal", n.vlan)),
    );
    m.insert("linklocalip".into(), json!(r.link_local_ip.to_string()));
    m.insert("linklocalnetmask".into(), json!("255.255.0.0"));
    if let Some(h) = r.host.and_then(|h| w.hosts.get(h)) {
        m.insert("hostid".into(), json!(h.id));
        m.insert("hostname".into(), json!(h.name));
    }
    m.insert("hypervisor".into(), json!(r.hypervisor.as_str()));
    m.insert("zoneid".into(), json!(zone.id));
    m.insert("zonename".into(), json!(zone.name));
    m.insert("dns1".into(), json!("8.8.8.8"));
    m.insert("created".into(), json!(format_time(r.created_ms)));
    owner_fields(w, r.owner(w), &mut m);
    m.insert("requiresupgrade".into(), json!(false));
    m.insert("healthcheckfailed".into(), json!(false));
    m.insert(
        "nic".into(),
        json!([{
            "id": r.guest_nic_id,
            "networkid": n.id,
            "networkname": n.name,
            "ipaddress": r.guest_ip.to_string(),
            "gateway": n.gateway.to_string(),
            "netmask": n.netmask().to_string(),
            "cidr": cidr_of(n),
            "traffictype": "Guest",
            "type": n.kind.as_str(),
            // The guest NIC is the router's default one only where it has no public NIC
            // (the simulator models no public ranges).
            "isdefault": n.kind == NetworkType::Shared,
            "macaddress": r.guest_mac,
            "deviceid": "0",
            "isolationuri": format!("vlan://{}", n.vlan),
            "broadcasturi": format!("vlan://{}", n.vlan),
        }]),
    );
    Value::Object(m)
}

/// `listRouters` (`ListRoutersCmd.java@cf3a101d`): role `VIRTUAL_ROUTER` only; `id`, `name`
/// (whole name; that CloudStack matches it whole is **unverified**), `keyword`, `state`,
/// `zoneid`, `networkid` (any router with a NIC there), `vpcid` (the simulator has no VPCs:
/// every value is unknown), `hostid`, plus the account/project visibility of
/// [`acl`] and paging. Ordered by internal id.
pub fn list_routers(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    check_domain(call)?;
    let id = uuid_param(call, "id", World::router_by_id)?;
    let zone = zone_param(call, "zoneid")?;
    let network = uuid_param(call, "networkid", World::network_by_id)?;
    let _ = uuid_param(call, "vpcid", |_, _| None)?;
    let host = uuid_param(call, "hostid", |w, v| {
        w.hosts.iter().position(|h| h.id == v)
    })?;
    let listall = call.bool_param("listall")?.unwrap_or(false);
    let _ = call.bool_param("forvpc")?;
    let (permitted, criteria) = acl(call, id, listall)?;
    let name = call.get_nonempty("name");
    let kw = call.get_nonempty("keyword").map(str::to_lowercase);
    let state = call.get_nonempty("state");
    let w: &World = call.world;
    let items = (0..w.routers.len())
        .filter(|i| id.is_none_or(|x| x == *i))
        .map(|i| &w.routers[i])
        .filter(|r| {
            let owner = r.owner(w);
            let is_project = matches!(owner, Owner::Project(_));
            let criteria_ok = match criteria {
                None | Some(Criteria::ListAllIncludingProjectResources) => true,
                Some(Criteria::SkipProjectResources) => !is_project,
                Some(Criteria::ListProjectResourcesOnly) => is_project,
            };
            criteria_ok
                && (permitted.is_empty() || permitted.contains(&owner))
                && zone.is_none_or(|z| r.zone == z)
                && network.is_none_or(|n| r.network == n)
                && host.is_none_or(|h| r.host == Some(h))
                && name.is_none_or(|n| r.name.eq_ignore_ascii_case(n))
                && kw
                    .as_ref()
                    .is_none_or(|k| r.name.to_lowercase().contains(k.as_str()))
                && state.is_none_or(|s| r.state.as_str().eq_ignore_ascii_case(s))
        })
        .map(|r| router_json(w, r))
        .collect();
    Ok(page(call, items))
}

// ---- runDiagnostics -------------------------------------------------------------------

/// `runDiagnostics` (`RunDiagnosticsCmd`, async; guest-probe.md §1–§3). Parameter processing
/// happens before the job: `targetid`, `ipaddress`, `type` are required and `targetid` must
/// name a VM instance (a user VM resolves too). Everything `DiagnosticsServiceImpl` checks
/// (type, system VM, host, `params`) fails the job; see `world/diagnostics.rs`.
pub fn run_diagnostics(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let t = call.require("targetid")?;
    let w: &World = call.world;
    let target = match (w.router_by_id(t), w.vm_index_by_id(t)) {
        (Some(r), _) => DiagTarget::Router(r),
        (None, Some(v)) if !w.vms()[v].removed => DiagTarget::UserVm(w.vms()[v].seq, v),
        _ => return Err(call.bad("targetid", t)),
    };
    let ipaddress = call.require("ipaddress")?.to_string();
    let kind = call.require("type")?.to_string();
    let a = call.caller_account();
    let role_type = a.role.as_ref().map_or(a.kind, |r| r.kind);
    // `params` is `authorized = {RoleType.Admin}`: dropped for any other role type.
    let params = if role_type == AccountType::Admin {
        call.get("params").map(str::to_string)
    } else {
        None
    };
    // `@ACL(OperateEntry)` on targetid: a plain user only for its own router (whether a
    // domain admin passes for a router of its domain is **unverified**, guest-probe.md §5;
    // admitted here).
    if a.kind == AccountType::User {
        let own = match target {
            DiagTarget::Router(r) => w.routers[r].owner(w) == Owner::Account(call.caller),
            DiagTarget::UserVm(_, v) => w.vms()[v].account == call.caller,
        };
        if !own {
            return Err(permission_denied(format!(
                "Account {} does not have permission to operate on the system vm",
                a.name
            )));
        }
    }
    let req = DiagRequest {
        target,
        kind,
        ipaddress,
        params,
    };
    let caller = call.caller;
    let job = call.world.run_diagnostics(caller, &req);
    Ok(async_reply(call.world, job))
}
