//! Handlers of the read-only lookups a cluster provider makes before and around creating
//! VMs: users, keys, the ROOT domain, accounts, projects, zones, networks, affinity groups,
//! offerings, templates, public addresses of shared networks and volumes.
//!
//! UUID parameters behave like CloudStack's parameter processing: a value that names no
//! object is a 431 "…invalid value. Invalid parameter X value=…" before the command runs;
//! name filters that match nothing give an empty list (`{}`).

use std::collections::HashMap;
use std::net::Ipv4Addr;

use serde_json::{json, Map, Value};

use super::api::{ApiError, Call, Reply};
use super::catalog::{address_id, AffinityGroup, DiskOffering, ServiceOffering, Template};
use super::commands::{vm_visible_to, SIM_OS_ID};
use super::world::{format_time, Account, AccountType, Network, NetworkType, Vm, VmState, World};

pub(crate) const ROOT_DOMAIN: &str = "ROOT";
const UNLIMITED: &str = "Unlimited";

// ---- shared helpers --------------------------------------------------------------------

/// The requested page of `items`, with `count` = all of them.
pub(crate) fn page(call: &Call<'_>, items: Vec<Value>) -> Reply {
    let count = items.len();
    let range = call.paging.slice(&items);
    Reply::List {
        items: items[range].to_vec(),
        count,
    }
}

/// Callers other than plain users see every account's objects (one domain only).
pub(crate) fn admin_like(call: &Call<'_>) -> bool {
    call.caller_account().kind != AccountType::User
}

/// `keyword`, lowercased, or `None`.
fn keyword(call: &Call<'_>) -> Option<String> {
    call.get_nonempty("keyword").map(str::to_lowercase)
}

fn contains_ci(haystack: &str, lowered_needle: &str) -> bool {
    haystack.to_lowercase().contains(lowered_needle)
}

/// The `name` (whole name) and `keyword` (part of the name) filters most list commands
/// take; CloudStack matches both case-insensitively.
struct NameFilter<'a> {
    name: Option<&'a str>,
    keyword: Option<String>,
}

impl<'a> NameFilter<'a> {
    fn of(call: &'a Call<'_>) -> Self {
        NameFilter {
            name: call.get_nonempty("name"),
            keyword: keyword(call),
        }
    }

    fn matches(&self, name: &str) -> bool {
        self.name.is_none_or(|n| name.eq_ignore_ascii_case(n))
            && self.keyword.as_ref().is_none_or(|k| contains_ci(name, k))
    }
}

/// `domainid` must be the ROOT domain when given (the simulator has no other).
pub(crate) fn check_domain(call: &Call<'_>) -> Result<(), ApiError> {
    match call.get_nonempty("domainid") {
        Some(d) if d != call.world.domain_id => Err(call.bad("domainid", d)),
        _ => Ok(()),
    }
}

/// Resolves a UUID parameter with `find`; unknown values are CloudStack's 431.
pub(crate) fn uuid_param(
    call: &Call<'_>,
    name: &str,
    find: impl Fn(&World, &str) -> Option<usize>,
) -> Result<Option<usize>, ApiError> {
    match call.get_nonempty(name) {
        None => Ok(None),
        Some(v) => find(call.world, v)
            .map(Some)
            .ok_or_else(|| call.bad(name, v)),
    }
}

pub(crate) fn zone_param(call: &Call<'_>, name: &str) -> Result<Option<usize>, ApiError> {
    uuid_param(call, name, World::zone_by_id)
}

/// `projectid` (a member's or an admin's); `-1` means every project and is returned as `None`.
pub(crate) fn project_param(call: &Call<'_>) -> Result<Option<usize>, ApiError> {
    if call.get_nonempty("projectid") == Some("-1") {
        return Ok(None);
    }
    let p = uuid_param(call, "projectid", |w, v| {
        w.projects.iter().position(|p| p.id == v)
    })?;
    if let Some(p) = p {
        let w: &World = call.world;
        if !admin_like(call) && !w.projects[p].members.contains(&call.caller) {
            return Err(permission_denied(format!(
                "Account {} does not have permission to access project {}",
                call.caller_account().name,
                w.projects[p].id
            )));
        }
    }
    Ok(p)
}

/// `PermissionDeniedException` → 531 with `cserrorcode` 4365.
pub(crate) fn permission_denied(text: impl Into<String>) -> ApiError {
    ApiError {
        code: 531,
        cs: Some(4365),
        text: text.into(),
        error_wrapper: false,
    }
}

/// `account` (by name) as a filter; unknown names are CloudStack's 431.
pub(crate) fn account_param(call: &Call<'_>) -> Result<Option<usize>, ApiError> {
    match call.get_nonempty("account") {
        None => Ok(None),
        Some(a) => call.world.account_index(a).map(Some).ok_or_else(|| {
            ApiError::invalid_value(format!(
                "Unable to find account {a} in domain {}",
                call.world.domain_id
            ))
        }),
    }
}

/// Resource usage of an owner's live VMs: (vm count, running, stopped, cpus, memory MiB).
fn usage(w: &World, owns: impl Fn(&Vm) -> bool) -> (u64, u64, u64, u64, u64) {
    let mut u = (0, 0, 0, 0, 0);
    for vm in w.vms() {
        if vm.removed || matches!(vm.state, VmState::Destroyed | VmState::Expunging) || !owns(vm) {
            continue;
        }
        u.0 += 1;
        match vm.state {
            VmState::Running => u.1 += 1,
            VmState::Stopped => u.2 += 1,
            _ => {}
        }
        u.3 += u64::from(vm.cpu_number);
        u.4 += u64::from(vm.memory_mb);
    }
    u
}

/// The limit fields CAPC reads (`*available`; non-numeric values skip its checks).
fn limits(m: &mut Map<String, Value>, u: (u64, u64, u64, u64, u64)) {
    for what in [
        "cpu", "memory", "vm", "ip", "volume", "network", "vpc", "template",
    ] {
        m.insert(format!("{what}limit"), json!(UNLIMITED));
        m.insert(format!("{what}available"), json!(UNLIMITED));
    }
    m.insert("vmtotal".into(), json!(u.0));
    m.insert("cputotal".into(), json!(u.3));
    m.insert("memorytotal".into(), json!(u.4));
}

// ---- users, keys, domains, accounts, projects -------------------------------------------

fn role_name(a: &Account) -> String {
    match (&a.role, a.kind) {
        (Some(r), _) => r.name.clone(),
        (None, AccountType::Admin) => "Root Admin".into(),
        (None, AccountType::DomainAdmin) => "Domain Admin".into(),
        (None, AccountType::ResourceAdmin) => "Resource Admin".into(),
        (None, AccountType::User) => "User".into(),
    }
}

fn role_type(a: &Account) -> &'static str {
    a.role.as_ref().map_or(a.kind, |r| r.kind).as_str()
}

fn state_of(a: &Account) -> &'static str {
    if a.enabled {
        "enabled"
    } else {
        "disabled"
    }
}

fn user_json(w: &World, a: &Account) -> Value {
    json!({
        "id": a.user_id,
        "username": a.username,
        "firstname": a.username,
        "lastname": a.name,
        "created": format_time(w.start_ms()),
        "state": state_of(a),
        "account": a.name,
        "accountid": a.id,
        "accounttype": a.kind.code(),
        "rolename": role_name(a),
        "roletype": role_type(a),
        "domainid": w.domain_id,
        "domain": ROOT_DOMAIN,
        "apikey": a.api_key,
        "isdefault": false,
        "iscallerchilddomain": false,
        "usersource": "native",
    })
}

/// `listUsers`: the caller's own user unless `listall`, an `account`, `id`, `username` or
/// `domainid` widens it (admins only; users always see themselves).
pub fn list_users(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    check_domain(call)?;
    let listall = call.bool_param("listall")?.unwrap_or(false);
    let id = uuid_param(call, "id", |w, v| {
        w.accounts.iter().position(|a| a.user_id == v)
    })?;
    let account = account_param(call)?;
    let username = call.get_nonempty("username");
    let kw = keyword(call);
    let w: &World = call.world;
    let wide = admin_like(call)
        && (listall
            || id.is_some()
            || account.is_some()
            || username.is_some()
            || call.get_nonempty("domainid").is_some());
    let items = (0..w.accounts.len())
        .filter(|i| wide || *i == call.caller)
        .filter(|i| id.is_none_or(|x| x == *i) && account.is_none_or(|x| x == *i))
        .map(|i| &w.accounts[i])
        .filter(|a| username.is_none_or(|u| a.username == u))
        .filter(|a| kw.as_ref().is_none_or(|k| contains_ci(&a.username, k)))
        .map(|a| user_json(w, a))
        .collect();
    Ok(page(call, items))
}

/// `getUserKeys`: `{"userkeys": {apikey, secretkey}}` for the caller's own user, or any user
/// for admins.
pub fn get_user_keys(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let id = call.require("id")?;
    let w: &World = call.world;
    let i = w
        .accounts
        .iter()
        .position(|a| a.user_id == id)
        .ok_or_else(|| call.bad("id", id))?;
    if i != call.caller && !admin_like(call) {
        return Err(permission_denied(format!(
            "Account {} does not have permission to access the keys of user {id}",
            call.caller_account().name
        )));
    }
    let a = &w.accounts[i];
    Ok(Reply::Object(
        "userkeys",
        json!({"apikey": a.api_key, "secretkey": a.secret_key.expose()}),
    ))
}

fn domain_json(w: &World) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), json!(w.domain_id));
    m.insert("name".into(), json!(ROOT_DOMAIN));
    m.insert("path".into(), json!(ROOT_DOMAIN));
    m.insert("level".into(), json!(0));
    m.insert("haschild".into(), json!(false));
    m.insert("state".into(), json!("Active"));
    m.insert("created".into(), json!(format_time(w.start_ms())));
    limits(&mut m, usage(w, |_| true));
    Value::Object(m)
}

/// `listDomains`: the ROOT domain, by `id`, `name` (+ `level`) or `keyword`.
pub fn list_domains(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let w: &World = call.world;
    if let Some(id) = call.get_nonempty("id") {
        if id != w.domain_id {
            return Err(call.bad("id", id));
        }
    }
    let level = match call.get_nonempty("level") {
        None => None,
        Some(l) => Some(l.parse::<i64>().map_err(|_| call.bad("level", l))?),
    };
    let items = if NameFilter::of(call).matches(ROOT_DOMAIN) && level.is_none_or(|l| l == 0) {
        vec![domain_json(w)]
    } else {
        Vec::new()
    };
    Ok(page(call, items))
}

fn account_json(w: &World, i: usize) -> Value {
    let a = &w.accounts[i];
    let u = usage(w, |vm| vm.project.is_none() && vm.account == i);
    let mut m = Map::new();
    m.insert("id".into(), json!(a.id));
    m.insert("name".into(), json!(a.name));
    m.insert("accounttype".into(), json!(a.kind.code()));
    m.insert("rolename".into(), json!(role_name(a)));
    m.insert("roletype".into(), json!(role_type(a)));
    m.insert("domainid".into(), json!(w.domain_id));
    m.insert("domain".into(), json!(ROOT_DOMAIN));
    m.insert("domainpath".into(), json!(ROOT_DOMAIN));
    m.insert("state".into(), json!(state_of(a)));
    m.insert("isdefault".into(), json!(false));
    m.insert("created".into(), json!(format_time(w.start_ms())));
    m.insert("vmrunning".into(), json!(u.1));
    m.insert("vmstopped".into(), json!(u.2));
    limits(&mut m, u);
    m.insert("user".into(), json!([user_json(w, a)]));
    Value::Object(m)
}

/// `listAccounts`: users see their own account; admins every account (`name`, `id`,
/// `accounttype`, `keyword` filter).
pub fn list_accounts(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    check_domain(call)?;
    let _ = call.bool_param("listall")?;
    let id = uuid_param(call, "id", |w, v| w.accounts.iter().position(|a| a.id == v))?;
    let kind = match call.get_nonempty("accounttype") {
        None => None,
        Some(t) => Some(t.parse::<u8>().map_err(|_| call.bad("accounttype", t))?),
    };
    let names = NameFilter::of(call);
    let wide = admin_like(call);
    let w: &World = call.world;
    let items = (0..w.accounts.len())
        .filter(|i| wide || *i == call.caller)
        .filter(|i| id.is_none_or(|x| x == *i))
        .filter(|i| {
            let a = &w.accounts[*i];
            names.matches(&a.name) && kind.is_none_or(|k| a.kind.code() == k)
        })
        .map(|i| account_json(w, i))
        .collect();
    Ok(page(call, items))
}

fn project_json(w: &World, i: usize) -> Value {
    let p = &w.projects[i];
    let owner = p
        .members
        .first()
        .and_then(|a| w.accounts.get(*a))
        .map_or(p.account_name.as_str(), |a| a.name.as_str());
    let u = usage(w, |vm| vm.project == Some(i));
    let mut m = Map::new();
    m.insert("id".into(), json!(p.id));
    m.insert("name".into(), json!(p.name));
    m.insert("displaytext".into(), json!(p.name));
    m.insert("domainid".into(), json!(w.domain_id));
    m.insert("domain".into(), json!(ROOT_DOMAIN));
    m.insert("account".into(), json!(owner));
    m.insert("owner".into(), json!([{"account": owner}]));
    m.insert("projectaccountname".into(), json!(p.account_name));
    m.insert("state".into(), json!("Active"));
    m.insert("created".into(), json!(format_time(w.start_ms())));
    m.insert("vmrunning".into(), json!(u.1));
    m.insert("vmstopped".into(), json!(u.2));
    limits(&mut m, u);
    m.insert("tags".into(), json!([]));
    Value::Object(m)
}

/// `listProjects`: the caller's projects (all for admins); `account` keeps the projects that
/// account is a member of.
pub fn list_projects(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    check_domain(call)?;
    let _ = call.bool_param("listall")?;
    let id = uuid_param(call, "id", |w, v| w.projects.iter().position(|p| p.id == v))?;
    let member = account_param(call)?;
    let names = NameFilter::of(call);
    let wide = admin_like(call);
    let w: &World = call.world;
    let items = (0..w.projects.len())
        .filter(|i| {
            let p = &w.projects[*i];
            (wide || p.members.contains(&call.caller))
                && id.is_none_or(|x| x == *i)
                && member.is_none_or(|a| p.members.contains(&a))
                && names.matches(&p.name)
        })
        .map(|i| project_json(w, i))
        .collect();
    Ok(page(call, items))
}

// ---- zones and networks ---------------------------------------------------------------

fn zone_json(w: &World, i: usize) -> Value {
    let z = &w.zones[i];
    json!({
        "id": z.id,
        "name": z.name,
        "allocationstate": "Enabled",
        "networktype": "Advanced",
        "securitygroupsenabled": false,
        "localstorageenabled": false,
        "dhcpprovider": "VirtualRouter",
        "dns1": "8.8.8.8",
        "internaldns1": "10.0.0.2",
        "guestcidraddress": "10.1.0.0/16",
        "hasannotations": false,
        "tags": [],
    })
}

/// `listZones` by `id`, `name` or `keyword`.
pub fn list_zones(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let id = zone_param(call, "id")?;
    let _ = call.bool_param("available")?;
    let names = NameFilter::of(call);
    let w: &World = call.world;
    let items = (0..w.zones.len())
        .filter(|i| id.is_none_or(|x| x == *i) && names.matches(&w.zones[*i].name))
        .map(|i| zone_json(w, i))
        .collect();
    Ok(page(call, items))
}

fn offering_name_of(kind: NetworkType) -> &'static str {
    match kind {
        NetworkType::Shared => "DefaultSharedNetworkOffering",
        NetworkType::Isolated => "DefaultIsolatedNetworkOfferingWithSourceNatService",
        NetworkType::L2 => "DefaultL2NetworkOffering",
    }
}

/// The network's CIDR as `a.b.c.d/len`.
pub(crate) fn cidr_of(n: &Network) -> String {
    let base = u32::from(n.gateway) & u32::from(n.netmask());
    format!("{}/{}", Ipv4Addr::from(base), n.prefix)
}

fn network_json(w: &World, n: &Network) -> Value {
    let zone = &w.zones[n.zone];
    let mut m = Map::new();
    m.insert("id".into(), json!(n.id));
    m.insert("name".into(), json!(n.name));
    m.insert("displaytext".into(), json!(n.name));
    m.insert("type".into(), json!(n.kind.as_str()));
    m.insert("traffictype".into(), json!("Guest"));
    m.insert("broadcastdomaintype".into(), json!("Vlan"));
    m.insert("broadcasturi".into(), json!(format!("vlan://{}", n.vlan)));
    m.insert("vlan".into(), json!(n.vlan.to_string()));
    if n.kind != NetworkType::L2 {
        m.insert("gateway".into(), json!(n.gateway.to_string()));
        m.insert("netmask".into(), json!(n.netmask().to_string()));
        m.insert("cidr".into(), json!(cidr_of(n)));
        m.insert("dns1".into(), json!("8.8.8.8"));
    }
    m.insert("zoneid".into(), json!(zone.id));
    m.insert("zonename".into(), json!(zone.name));
    let offering = offering_name_of(n.kind);
    m.insert("networkofferingname".into(), json!(offering));
    m.insert("networkofferingdisplaytext".into(), json!(offering));
    m.insert("networkofferingavailability".into(), json!("Optional"));
    let shared = n.kind == NetworkType::Shared;
    m.insert(
        "state".into(),
        json!(if shared { "Setup" } else { "Implemented" }),
    );
    m.insert(
        "acltype".into(),
        json!(if shared { "Domain" } else { "Account" }),
    );
    m.insert("specifyipranges".into(), json!(shared));
    m.insert("subdomainaccess".into(), json!(shared));
    m.insert("domainid".into(), json!(w.domain_id));
    m.insert("domain".into(), json!(ROOT_DOMAIN));
    m.insert("issystem".into(), json!(false));
    m.insert("isdefault".into(), json!(false));
    m.insert("ispersistent".into(), json!(false));
    m.insert("canusefordeploy".into(), json!(true));
    m.insert("displaynetwork".into(), json!(true));
    m.insert("restartrequired".into(), json!(false));
    m.insert("redundantrouter".into(), json!(false));
    m.insert("service".into(), json!([]));
    m.insert("tags".into(), json!([]));
    Value::Object(m)
}

/// `listNetworks` by `id`, `zoneid`, `keyword` (name or text contains), `name`, `type`.
/// Every network is visible to every account (shared networks are domain-wide; the
/// simulator does not model owners of isolated ones).
pub fn list_networks(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let id = uuid_param(call, "id", World::network_by_id)?;
    let zone = zone_param(call, "zoneid")?;
    let _ = project_param(call)?;
    let _ = call.bool_param("listall")?;
    if call.bool_param("issystem")? == Some(true) {
        return Ok(page(call, Vec::new()));
    }
    let names = NameFilter::of(call);
    let kind = call.get_nonempty("type");
    let w: &World = call.world;
    let items = (0..w.networks.len())
        .filter(|i| id.is_none_or(|x| x == *i))
        .map(|i| &w.networks[i])
        .filter(|n| zone.is_none_or(|z| n.zone == z) && names.matches(&n.name))
        .filter(|n| kind.is_none_or(|t| n.kind.as_str().eq_ignore_ascii_case(t)))
        .map(|n| network_json(w, n))
        .collect();
    Ok(page(call, items))
}

// ---- affinity groups --------------------------------------------------------------------

pub(crate) fn affinity_group_json(w: &World, i: usize) -> Value {
    let g: &AffinityGroup = &w.affinity_groups[i];
    let mut m = Map::new();
    m.insert("id".into(), json!(g.id));
    m.insert("name".into(), json!(g.name));
    m.insert("type".into(), json!(g.kind.as_str()));
    m.insert("description".into(), json!(g.description));
    match g.project.and_then(|p| w.projects.get(p)) {
        Some(p) => {
            m.insert("account".into(), json!(p.account_name));
            m.insert("projectid".into(), json!(p.id));
            m.insert("project".into(), json!(p.name));
        }
        None => {
            let owner = w.accounts.get(g.account).map(|a| a.name.as_str());
            m.insert("account".into(), json!(owner));
        }
    }
    m.insert("domainid".into(), json!(w.domain_id));
    m.insert("domain".into(), json!(ROOT_DOMAIN));
    m.insert("domainpath".into(), json!(ROOT_DOMAIN));
    let members: Vec<Value> = w
        .affinity_members(i)
        .into_iter()
        .map(|v| json!(w.vms()[v].id))
        .collect();
    m.insert("virtualmachineIds".into(), Value::Array(members));
    Value::Object(m)
}

/// Whether the caller sees a group: its own (or its project's) groups; admins every group
/// with `listall` or an `id`.
fn group_visible(call: &Call<'_>, g: &AffinityGroup, project: Option<usize>, wide: bool) -> bool {
    if g.deleted || g.project != project {
        return false;
    }
    match g.project {
        Some(_) => true,
        None => wide || g.account == call.caller,
    }
}

/// `listAffinityGroups` by `id`, `name`, `type`, `virtualmachineid`, `keyword`, `projectid`.
pub fn list_affinity_groups(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let id = uuid_param(call, "id", |w, v| w.affinity_group_by_id(v))?;
    let vm = uuid_param(call, "virtualmachineid", |w, v| w.vm_index_by_id(v))?;
    let project = project_param(call)?;
    let listall = call.bool_param("listall")?.unwrap_or(false);
    let name = call.get_nonempty("name");
    let kind = call.get_nonempty("type");
    let kw = keyword(call);
    let wide = admin_like(call) && (listall || id.is_some());
    let w: &World = call.world;
    let items = (0..w.affinity_groups.len())
        .filter(|i| id.is_none_or(|x| x == *i))
        .filter(|i| group_visible(call, &w.affinity_groups[*i], project, wide))
        .filter(|i| {
            let g = &w.affinity_groups[*i];
            name.is_none_or(|n| g.name == n)
                && kind.is_none_or(|t| g.kind.as_str() == t)
                && kw.as_ref().is_none_or(|k| contains_ci(&g.name, k))
                && vm.is_none_or(|v| w.vms()[v].affinity_groups.contains(i))
        })
        .map(|i| affinity_group_json(w, i))
        .collect();
    Ok(page(call, items))
}

// ---- offerings and templates ----------------------------------------------------------

fn zone_restriction(w: &World, m: &mut Map<String, Value>, zones: &[usize]) {
    if zones.is_empty() {
        return;
    }
    let pick = |f: fn(&super::world::Zone) -> &str| {
        zones
            .iter()
            .filter_map(|z| w.zones.get(*z))
            .map(f)
            .collect::<Vec<_>>()
            .join(",")
    };
    m.insert("zoneid".into(), json!(pick(|z| &z.id)));
    m.insert("zone".into(), json!(pick(|z| &z.name)));
}

fn service_offering_json(w: &World, o: &ServiceOffering) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), json!(o.id));
    m.insert("name".into(), json!(o.name));
    m.insert("displaytext".into(), json!(o.display_text));
    m.insert("cpunumber".into(), json!(o.cpu_number));
    m.insert("cpuspeed".into(), json!(o.cpu_speed));
    m.insert("memory".into(), json!(o.memory_mb));
    m.insert("created".into(), json!(format_time(w.start_ms())));
    m.insert("storagetype".into(), json!("shared"));
    m.insert("provisioningtype".into(), json!("thin"));
    m.insert("offerha".into(), json!(false));
    m.insert("limitcpuuse".into(), json!(false));
    m.insert("isvolatile".into(), json!(false));
    m.insert("issystem".into(), json!(false));
    m.insert("defaultuse".into(), json!(false));
    m.insert("iscustomized".into(), json!(false));
    m.insert("hasannotations".into(), json!(false));
    zone_restriction(w, &mut m, &o.zones);
    Value::Object(m)
}

/// `listServiceOfferings` by `id`, `name`, `zoneid` (offerings usable there), `keyword`.
pub fn list_service_offerings(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let id = uuid_param(call, "id", World::service_offering_by_id)?;
    let zone = zone_param(call, "zoneid")?;
    if call.bool_param("issystem")? == Some(true) {
        return Ok(page(call, Vec::new()));
    }
    let names = NameFilter::of(call);
    let w: &World = call.world;
    let items = (0..w.service_offerings.len())
        .filter(|i| id.is_none_or(|x| x == *i))
        .map(|i| &w.service_offerings[i])
        .filter(|o| zone.is_none_or(|z| o.in_zone(z)) && names.matches(&o.name))
        .map(|o| service_offering_json(w, o))
        .collect();
    Ok(page(call, items))
}

const TEMPLATE_FILTERS: &[&str] = &[
    "featured",
    "self",
    "selfexecutable",
    "sharedexecutable",
    "executable",
    "community",
    "all",
];

fn template_json(w: &World, t: &Template, zone: usize) -> Value {
    let z = &w.zones[zone];
    json!({
        "id": t.id,
        "name": t.name,
        "displaytext": t.display_text,
        "ispublic": true,
        "isfeatured": true,
        "isextractable": false,
        "isready": true,
        "status": "Download Complete",
        "created": format_time(w.start_ms()),
        "passwordenabled": false,
        "sshkeyenabled": false,
        "format": "QCOW2",
        "templatetype": "USER",
        "hypervisor": "Simulator",
        "ostypeid": SIM_OS_ID,
        "ostypename": "Ubuntu 22.04 LTS",
        "account": "system",
        "domainid": w.domain_id,
        "domain": ROOT_DOMAIN,
        "zoneid": z.id,
        "zonename": z.name,
        "size": t.size_bytes,
        "physicalsize": t.size_bytes / 3,
        "crossZones": false,
        "bootable": true,
        "directdownload": false,
        "deployasis": false,
        "requireshvm": false,
        "isdynamicallyscalable": false,
        "tags": [],
    })
}

/// `listTemplates` (`templatefilter` required): one entry per template and zone, by `id`,
/// `name`, `zoneid`, `keyword`. The simulator's templates are public and featured, owned by
/// the system: `self`, `selfexecutable` and `sharedexecutable` list none.
pub fn list_templates(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let filter = call.require("templatefilter")?;
    if !TEMPLATE_FILTERS.contains(&filter) {
        return Err(ApiError::invalid_value(format!(
            "Please specify a valid template filter, one of: {}",
            TEMPLATE_FILTERS.join(", ")
        )));
    }
    let id = uuid_param(call, "id", World::template_by_id)?;
    let zone = zone_param(call, "zoneid")?;
    let _ = project_param(call)?;
    let names = NameFilter::of(call);
    let w: &World = call.world;
    let listed = !matches!(filter, "self" | "selfexecutable" | "sharedexecutable");
    let mut items = Vec::new();
    for (i, t) in w.templates.iter().enumerate() {
        if !listed || id.is_some_and(|x| x != i) || !names.matches(&t.name) {
            continue;
        }
        for z in &t.zones {
            if zone.is_none_or(|want| want == *z) {
                items.push(template_json(w, t, *z));
            }
        }
    }
    Ok(page(call, items))
}

fn disk_offering_json(w: &World, d: &DiskOffering) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), json!(d.id));
    m.insert("name".into(), json!(d.name));
    m.insert("displaytext".into(), json!(d.display_text));
    m.insert("disksize".into(), json!(d.disk_size_gb));
    m.insert("iscustomized".into(), json!(d.customized));
    m.insert("storagetype".into(), json!("shared"));
    m.insert("provisioningtype".into(), json!("thin"));
    m.insert("cacheMode".into(), json!("none"));
    m.insert("created".into(), json!(format_time(w.start_ms())));
    m.insert("displayoffering".into(), json!(true));
    m.insert("encrypt".into(), json!(false));
    m.insert("disksizestrictness".into(), json!(false));
    m.insert("hasannotations".into(), json!(false));
    zone_restriction(w, &mut m, &d.zones);
    Value::Object(m)
}

/// `listDiskOfferings` by `id`, `name`, `zoneid`, `keyword`.
pub fn list_disk_offerings(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let id = uuid_param(call, "id", World::disk_offering_by_id)?;
    let zone = zone_param(call, "zoneid")?;
    let _ = project_param(call)?;
    let names = NameFilter::of(call);
    let w: &World = call.world;
    let items = (0..w.disk_offerings.len())
        .filter(|i| id.is_none_or(|x| x == *i))
        .map(|i| &w.disk_offerings[i])
        .filter(|d| zone.is_none_or(|z| d.in_zone(z)) && names.matches(&d.name))
        .map(|d| disk_offering_json(w, d))
        .collect();
    Ok(page(call, items))
}

// ---- public addresses of shared networks -------------------------------------------------

fn public_ip_json(w: &World, n: &Network, ip: u32, holder: Option<&Vm>) -> Value {
    let zone = &w.zones[n.zone];
    let mut m = Map::new();
    m.insert("id".into(), json!(address_id(&n.id, ip)));
    m.insert("ipaddress".into(), json!(Ipv4Addr::from(ip).to_string()));
    m.insert(
        "state".into(),
        json!(if n.is_used(ip) { "Allocated" } else { "Free" }),
    );
    m.insert("zoneid".into(), json!(zone.id));
    m.insert("zonename".into(), json!(zone.name));
    m.insert("networkid".into(), json!(n.id));
    m.insert("associatednetworkid".into(), json!(n.id));
    m.insert("associatednetworkname".into(), json!(n.name));
    m.insert("vlanid".into(), json!(address_id(&n.id, 0)));
    m.insert("vlanname".into(), json!(format!("vlan://{}", n.vlan)));
    m.insert("forvirtualnetwork".into(), json!(false));
    m.insert("issourcenat".into(), json!(false));
    m.insert("isstaticnat".into(), json!(false));
    m.insert("issystem".into(), json!(false));
    m.insert("isportable".into(), json!(false));
    m.insert("forsystemvms".into(), json!(false));
    m.insert("fordisplay".into(), json!(true));
    m.insert("hasrules".into(), json!(false));
    m.insert("domainid".into(), json!(w.domain_id));
    m.insert("domain".into(), json!(ROOT_DOMAIN));
    match holder {
        Some(vm) => {
            let owner = w.accounts.get(vm.account).map(|a| a.name.as_str());
            m.insert("account".into(), json!(owner));
            m.insert("allocated".into(), json!(format_time(vm.created_ms)));
            m.insert("virtualmachineid".into(), json!(vm.id));
            m.insert("virtualmachinename".into(), json!(vm.name));
            m.insert("virtualmachinedisplayname".into(), json!(vm.display_name));
        }
        None => {
            m.insert("account".into(), json!("system"));
        }
    }
    Value::Object(m)
}

/// `listPublicIpAddresses` over the guest ranges of Shared networks (`forvirtualnetwork`
/// true lists nothing: the simulator has no public ranges). `allocatedonly` defaults to
/// true, like CloudStack's; with false every address of the range is listed, `Free` or
/// `Allocated`.
pub fn list_public_ip_addresses(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let network = uuid_param(call, "networkid", World::network_by_id)?;
    let associated = uuid_param(call, "associatednetworkid", World::network_by_id)?;
    let zone = zone_param(call, "zoneid")?;
    let _ = project_param(call)?;
    let _ = call.bool_param("listall")?;
    let allocated_only = call.bool_param("allocatedonly")?.unwrap_or(true);
    let virtual_net = call.bool_param("forvirtualnetwork")?;
    let wanted_ip = call.get_nonempty("ipaddress");
    let wanted_id = call.get_nonempty("id");
    let state = call.get_nonempty("state");
    let w: &World = call.world;
    if virtual_net == Some(true) {
        return Ok(page(call, Vec::new()));
    }
    let mut rows: Vec<(usize, u32)> = Vec::new();
    for (i, n) in w.networks.iter().enumerate() {
        if n.kind != NetworkType::Shared
            || network.is_some_and(|x| x != i)
            || associated.is_some_and(|x| x != i)
            || zone.is_some_and(|z| z != n.zone)
        {
            continue;
        }
        match wanted_ip {
            Some(s) => {
                let ip = s.parse::<Ipv4Addr>().map(u32::from).ok();
                rows.extend(ip.filter(|ip| n.in_range(*ip)).map(|ip| (i, ip)));
            }
            None if allocated_only => {
                rows.extend(n.range().filter(|ip| n.is_used(*ip)).map(|ip| (i, ip)))
            }
            None => rows.extend(n.range().map(|ip| (i, ip))),
        }
    }
    rows.retain(|(i, ip)| {
        let n = &w.networks[*i];
        let used = n.is_used(*ip);
        (!allocated_only || used)
            && state.is_none_or(|s| s.eq_ignore_ascii_case(if used { "Allocated" } else { "Free" }))
            && wanted_id.is_none_or(|id| address_id(&n.id, *ip) == id)
    });
    let count = rows.len();
    let range = call.paging.slice(&rows);
    let holders = address_holders(w);
    let items = rows[range]
        .iter()
        .map(|(i, ip)| {
            let holder = holders.get(&(*i, *ip)).map(|v| &w.vms()[*v]);
            public_ip_json(w, &w.networks[*i], *ip, holder)
        })
        .collect();
    Ok(Reply::List { items, count })
}

/// Which VM (index) holds each (network, address).
fn address_holders(w: &World) -> HashMap<(usize, u32), usize> {
    w.vms()
        .iter()
        .enumerate()
        .filter(|(_, vm)| !vm.removed)
        .filter_map(|(i, vm)| {
            let nic = vm.nic_assignment()?;
            Some(((nic.0, u32::from(nic.1)), i))
        })
        .collect()
}

// ---- volumes ----------------------------------------------------------------------------

/// A VM's volumes: (id, type, device id, size in bytes, disk offering index).
fn volumes_of(w: &World, vm: &Vm) -> Vec<(String, &'static str, u64, u64, Option<usize>)> {
    let root_size = w.templates.get(vm.template).map_or(0, |t| t.size_bytes);
    let mut v = vec![(vm.root_volume_id.clone(), "ROOT", 0, root_size, None)];
    if let Some(d) = &vm.data_disk {
        let size = w.disk_offerings.get(d.offering).map_or(d.size_gb, |o| {
            if o.customized {
                d.size_gb
            } else {
                o.disk_size_gb
            }
        });
        v.push((
            d.id.clone(),
            "DATADISK",
            1,
            size * 1024 * 1024 * 1024,
            Some(d.offering),
        ));
    }
    v
}

fn volume_json(
    w: &World,
    vm: &Vm,
    (id, kind, device, size, offering): &(String, &'static str, u64, u64, Option<usize>),
) -> Value {
    let zone = &w.zones[vm.zone];
    let mut m = Map::new();
    m.insert("id".into(), json!(id));
    let prefix = if *kind == "ROOT" { "ROOT" } else { "DATA" };
    m.insert("name".into(), json!(format!("{prefix}-{}", vm.seq)));
    m.insert("type".into(), json!(kind));
    m.insert("deviceid".into(), json!(device));
    m.insert("size".into(), json!(size));
    m.insert("state".into(), json!("Ready"));
    m.insert("zoneid".into(), json!(zone.id));
    m.insert("zonename".into(), json!(zone.name));
    m.insert("virtualmachineid".into(), json!(vm.id));
    m.insert("vmname".into(), json!(vm.name));
    m.insert("vmdisplayname".into(), json!(vm.display_name));
    m.insert("vmstate".into(), json!(vm.state.as_str()));
    let owner = w.accounts.get(vm.account).map(|a| a.name.as_str());
    m.insert("account".into(), json!(owner));
    m.insert("domainid".into(), json!(w.domain_id));
    m.insert("domain".into(), json!(ROOT_DOMAIN));
    m.insert("storagetype".into(), json!("shared"));
    m.insert("provisioningtype".into(), json!("thin"));
    m.insert("hypervisor".into(), json!("Simulator"));
    m.insert("storage".into(), json!("SimPrimaryStorage"));
    m.insert("destroyed".into(), json!(false));
    m.insert("isextractable".into(), json!(false));
    m.insert("created".into(), json!(format_time(vm.created_ms)));
    match offering.and_then(|o| w.disk_offerings.get(o)) {
        Some(o) => {
            m.insert("diskofferingid".into(), json!(o.id));
            m.insert("diskofferingname".into(), json!(o.name));
        }
        None => {
            if let Some(t) = w.templates.get(vm.template) {
                m.insert("templateid".into(), json!(t.id));
            }
            if let Some(o) = w.service_offerings.get(vm.offering) {
                m.insert("serviceofferingid".into(), json!(o.id));
                m.insert("serviceofferingname".into(), json!(o.name));
            }
        }
    }
    Value::Object(m)
}

/// `listVolumes` of the caller's VMs (every VM for admins with `listall` or a VM id), by
/// `virtualmachineid`, `id`, `type` (ROOT / DATADISK), `zoneid`. Expunged VMs have none.
pub fn list_volumes(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let vm = uuid_param(call, "virtualmachineid", |w, v| w.vm_index_by_id(v))?;
    let id = call.get_nonempty("id");
    if let Some(id) = id {
        let w: &World = call.world;
        let known = w
            .vms()
            .iter()
            .any(|v| v.root_volume_id == id || v.data_disk.as_ref().is_some_and(|d| d.id == id));
        if !known {
            return Err(call.bad("id", id));
        }
    }
    let zone = zone_param(call, "zoneid")?;
    let project = project_param(call)?;
    let listall = call.bool_param("listall")?.unwrap_or(false);
    let kind = call.get_nonempty("type");
    let kw = keyword(call);
    let wide = admin_like(call) && (listall || vm.is_some() || id.is_some());
    let w: &World = call.world;
    let mut items = Vec::new();
    for (i, v) in w.vms().iter().enumerate() {
        let owned = match v.project {
            Some(p) => project == Some(p),
            None => project.is_none() && (wide || v.account == call.caller),
        };
        if v.removed
            || vm.is_some_and(|x| x != i)
            || zone.is_some_and(|z| z != v.zone)
            || !owned
            || !vm_visible_to(w, call.caller, v)
        {
            continue;
        }
        for vol in volumes_of(w, v) {
            let keep = kind.is_none_or(|k| vol.1.eq_ignore_ascii_case(k))
                && id.is_none_or(|x| vol.0 == x)
                && kw.as_ref().is_none_or(|k| contains_ci(&v.name, k));
            if keep {
                items.push(volume_json(w, v, &vol));
            }
        }
    }
    Ok(page(call, items))
}

/// Whether a data volume id belongs to the VM (`destroyVirtualMachine volumeids`).
pub(crate) fn is_data_volume_of(vm: &Vm, id: &str) -> bool {
    vm.data_disk.as_ref().is_some_and(|d| d.id == id)
}
