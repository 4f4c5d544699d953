//! The VM list commands: `listVirtualMachines`, `listVirtualMachinesMetrics` and
//! `listVirtualMachinesUsageHistory` (selection, filters and the VM response).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::api::{ApiError, Call, Reply};
use crate::traffic;
use crate::world::{format_time, is_canonical_uuid, AccountType, StatsView, Vm, VmState, World};

use super::nics::nic_json;

// ---- listVirtualMachines ---------------------------------------------------------------

const DETAIL_VALUES: &[&str] = &[
    "all", "group", "nics", "stats", "secgrp", "tmpl", "servoff", "diskoff", "backoff", "iso",
    "volume", "min", "affgrp",
];

/// Which optional parts of a VM response were requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Details {
    pub nics: bool,
    pub stats: bool,
    pub servoff: bool,
    pub tmpl: bool,
    pub secgrp: bool,
    pub affgrp: bool,
    pub group: bool,
}

impl Details {
    const ALL: Details = Details {
        nics: true,
        stats: true,
        servoff: true,
        tmpl: true,
        secgrp: true,
        affgrp: true,
        group: true,
    };

    fn parse(v: Option<&str>) -> Result<Self, ApiError> {
        let Some(v) = v.filter(|v| !v.is_empty()) else {
            return Ok(Self::ALL);
        };
        let mut d = Details {
            nics: false,
            stats: false,
            servoff: false,
            tmpl: false,
            secgrp: false,
            affgrp: false,
            group: false,
        };
        for tok in v.split(',').filter(|t| !t.is_empty()) {
            match tok {
                "all" => return Ok(Self::ALL),
                "nics" => d.nics = true,
                "stats" => d.stats = true,
                "servoff" => d.servoff = true,
                "tmpl" => d.tmpl = true,
                "secgrp" => d.secgrp = true,
                "affgrp" => d.affgrp = true,
                "group" => d.group = true,
                t if DETAIL_VALUES.contains(&t) => {}
                _ => {
                    return Err(ApiError::invalid_value(format!(
                        "The details parameter contains a non permitted value. The allowed values are [{}]",
                        DETAIL_VALUES.join(", ")
                    )))
                }
            }
        }
        Ok(d)
    }
}

/// Parses `tags[i].key` / `tags[i].value` map parameters.
fn tag_filters(call: &Call<'_>) -> Vec<(String, Option<String>)> {
    let mut by_index: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
    for (k, v) in call.params {
        let Some(rest) = k.strip_prefix("tags[") else {
            continue;
        };
        let Some((idx, field)) = rest.split_once("].") else {
            continue;
        };
        let e = by_index.entry(idx.to_string()).or_default();
        match field {
            "key" => e.0 = Some(v.clone()),
            "value" => e.1 = Some(v.clone()),
            _ => {}
        }
    }
    by_index
        .into_values()
        .filter_map(|(k, v)| k.map(|k| (k, v)))
        .collect()
}

/// Applies id/ids, visibility and the filters of `listVirtualMachines`; returns matching
/// VM indices in internal-id order.
pub(super) fn select_vms(call: &Call<'_>, usage_history: bool) -> Result<Vec<usize>, ApiError> {
    let w: &World = call.world;
    let caller = &w.accounts[call.caller];
    let root = caller.is_root_admin();
    let admin_like = caller.kind != AccountType::User;

    let id = call.get_nonempty("id");
    let ids = call.get_nonempty("ids");
    if id.is_some() && ids.is_some() {
        return Err(ApiError::invalid_value(
            "Specify either id or ids but not both parameters",
        ));
    }
    let mut id_set: Option<Vec<usize>> = None;
    if let Some(id) = id {
        let i = w.vm_index_by_id(id).ok_or_else(|| call.bad("id", id))?;
        id_set = Some(vec![i]);
    }
    if let Some(ids) = ids {
        let mut v = Vec::new();
        for tok in ids.split(',') {
            // Tokens that are not lowercase canonical UUIDs are silently dropped, as for
            // every parameter with a `since` annotation.
            if !is_canonical_uuid(tok) {
                continue;
            }
            v.push(w.vm_index_by_id(tok).ok_or_else(|| call.bad("ids", tok))?);
        }
        if !v.is_empty() {
            v.sort_unstable();
            v.dedup();
            id_set = Some(v);
        }
    }

    let listall = if usage_history {
        false
    } else {
        call.bool_param("listall")?.unwrap_or(false)
    };
    let haenable = if usage_history {
        None
    } else {
        call.bool_param("haenable")?
    };
    let zone = match call.get_nonempty("zoneid").filter(|_| !usage_history) {
        Some(z) => Some(
            w.zones
                .iter()
                .position(|x| x.id == z)
                .ok_or_else(|| call.bad("zoneid", z))?,
        ),
        None => None,
    };
    let host = match call
        .get_nonempty("hostid")
        .filter(|_| root && !usage_history)
    {
        Some(h) => Some(
            w.hosts
                .iter()
                .position(|x| x.id == h)
                .ok_or_else(|| call.bad("hostid", h))?,
        ),
        None => None,
    };
    // projectid: none = non-project VMs; -1 = all visible projects; uuid = that project.
    enum Proj {
        None,
        All,
        One(usize),
    }
    let project = match call.get_nonempty("projectid").filter(|_| !usage_history) {
        None => Proj::None,
        Some("-1") => Proj::All,
        Some(p) => Proj::One(
            w.projects
                .iter()
                .position(|x| x.id == p)
                .ok_or_else(|| call.bad("projectid", p))?,
        ),
    };
    let domainid = call.get_nonempty("domainid").filter(|_| !usage_history);
    if let Some(d) = domainid {
        if d != w.domain_id {
            return Err(call.bad("domainid", d));
        }
    }
    let account_filter = match call.get_nonempty("account").filter(|_| !usage_history) {
        Some(a) => match w.account_index(a) {
            Some(i) => Some(i),
            None => {
                return Err(ApiError::invalid_value(format!(
                    "Unable to find account {a} in domain {}",
                    domainid.unwrap_or(&w.domain_id)
                )))
            }
        },
        None => None,
    };
    let template = match call.get_nonempty("templateid").filter(|_| !usage_history) {
        Some(t) => Some(
            w.template_index(t)
                .filter(|i| w.templates[*i].id == t)
                .ok_or_else(|| call.bad("templateid", t))?,
        ),
        None => None,
    };
    let network = match call.get_nonempty("networkid").filter(|_| !usage_history) {
        Some(n) => Some(
            w.networks
                .iter()
                .position(|x| x.id == n)
                .ok_or_else(|| call.bad("networkid", n))?,
        ),
        None => None,
    };
    let state = call.get_nonempty("state").filter(|_| !usage_history);
    let keyword = call.get_nonempty("keyword").map(str::to_lowercase);
    let name = call.get_nonempty("name");
    let tags = if usage_history {
        Vec::new()
    } else {
        tag_filters(call)
    };
    let hide_destroyed =
        caller.kind == AccountType::User && !w.settings.allow_user_view_destroyed_vm;
    let wide = admin_like && (listall || id_set.is_some() || account_filter.is_some());

    let visible = |vm: &Vm| -> bool {
        if vm.removed {
            return false;
        }
        match (&project, vm.project) {
            (Proj::None, Some(_)) => return false,
            (Proj::None, None) => {
                if !wide && vm.account != call.caller {
                    return false;
                }
                if let Some(a) = account_filter {
                    if vm.account != a || (!admin_like && a != call.caller) {
                        return false;
                    }
                }
            }
            (Proj::All, None) => return false,
            (Proj::One(p), Some(q)) if *p != q => return false,
            (Proj::One(_), None) => return false,
            (Proj::All | Proj::One(_), Some(q)) => {
                if !admin_like && !w.projects[q].members.contains(&call.caller) {
                    return false;
                }
            }
        }
        if hide_destroyed && matches!(vm.state, VmState::Destroyed | VmState::Expunging) {
            return false;
        }
        true
    };
    let matches = |vm: &Vm| -> bool {
        if let Some(z) = zone {
            if vm.zone != z {
                return false;
            }
        }
        if let Some(h) = host {
            if vm.host != h || !on_host(vm) {
                return false;
            }
        }
        if let Some(t) = template {
            if vm.template != t {
                return false;
            }
        }
        if let Some(n) = network {
            if vm.visible_nic().is_none_or(|nic| nic.network != n) {
                return false;
            }
        }
        if let Some(ha) = haenable {
            if vm.haenable != ha {
                return false;
            }
        }
        if let Some(s) = state {
            let destroyedish = matches!(vm.state, VmState::Destroyed | VmState::Expunging);
            if s.eq_ignore_ascii_case("Present") {
                if destroyedish {
                    return false;
                }
            } else if !vm.state.as_str().eq_ignore_ascii_case(s) {
                return false;
            }
        }
        if let Some(n) = name {
            let ok = if usage_history {
                vm.display_name.to_lowercase().contains(&n.to_lowercase())
            } else {
                vm.name.eq_ignore_ascii_case(n)
            };
            if !ok {
                return false;
            }
        }
        if let Some(k) = &keyword {
            let ip = vm.visible_ip().map(|i| i.to_string()).unwrap_or_default();
            let hit = vm.display_name.to_lowercase().contains(k.as_str())
                || vm.name.to_lowercase().contains(k.as_str())
                || (!ip.is_empty() && ip.contains(k.as_str()))
                || vm.state.as_str().eq_ignore_ascii_case(k)
                || (root && instance_name(vm).to_lowercase().contains(k.as_str()));
            if !hit {
                return false;
            }
        }
        if !tags.is_empty() {
            let any = tags.iter().any(|(tk, tv)| {
                vm.tags
                    .iter()
                    .any(|(k, v)| k == tk && tv.as_ref().is_none_or(|tv| tv == v))
            });
            if !any {
                return false;
            }
        }
        true
    };

    let vms = w.vms();
    let out = match id_set {
        Some(ids) => ids
            .into_iter()
            .filter(|i| visible(&vms[*i]) && matches(&vms[*i]))
            .collect(),
        None => (0..vms.len())
            .filter(|i| visible(&vms[*i]) && matches(&vms[*i]))
            .collect(),
    };
    Ok(out)
}

fn on_host(vm: &Vm) -> bool {
    matches!(vm.state, VmState::Running | VmState::Starting)
}

fn instance_name(vm: &Vm) -> String {
    format!("i-2-{}-VM", vm.seq)
}

/// Who is looking and what they asked for.
#[derive(Debug, Clone, Copy)]
struct View {
    root: bool,
    details: Details,
    metrics: bool,
    /// Sum all retained rows (true) or show the latest row.
    accumulate: bool,
}

pub(super) fn mib(kib: u64) -> String {
    format!("{:.2} MiB", kib as f64 / 1024.0)
}

/// The stats fields of a VM or a usage-history sample (whole numbers, `(long)` casts in
/// `UserVmJoinDaoImpl` and `MetricsServiceImpl.createStatsResponse@44d54b35`).
pub(super) fn stats_fields(m: &mut Map<String, Value>, vm: &Vm, s: &StatsView) {
    let memkbs = u64::from(vm.memory_mb) * 1024;
    m.insert("cpuused".into(), json!(traffic::format_cpu(s.cpu_centi)));
    m.insert("networkkbsread".into(), json!(s.rx_kib));
    m.insert("networkkbswrite".into(), json!(s.tx_kib));
    m.insert("diskkbsread".into(), json!(s.disk_read_kib));
    m.insert("diskkbswrite".into(), json!(s.disk_write_kib));
    m.insert("diskioread".into(), json!(s.disk_io_read));
    m.insert("diskiowrite".into(), json!(s.disk_io_write));
    m.insert("memorykbs".into(), json!(memkbs));
    m.insert(
        "memoryintfreekbs".into(),
        json!(memkbs * (30 + traffic::mix(vm.seq, s.latest_ms as u64 / 1000) % 20) / 100),
    );
    m.insert("memorytargetkbs".into(), json!(memkbs));
}

fn vm_json(w: &World, vm: &Vm, v: View) -> Value {
    let acc = &w.accounts[vm.account];
    let zone = &w.zones[vm.zone];
    let mut m = Map::new();
    m.insert("id".into(), json!(vm.id));
    m.insert("name".into(), json!(vm.name));
    m.insert("displayname".into(), json!(vm.display_name));
    if v.root {
        m.insert("instancename".into(), json!(instance_name(vm)));
    }
    match vm.project.and_then(|p| w.projects.get(p)) {
        Some(p) => {
            m.insert("account".into(), json!(p.account_name));
            m.insert("projectid".into(), json!(p.id));
            m.insert("project".into(), json!(p.name));
        }
        None => {
            m.insert("account".into(), json!(acc.name));
        }
    }
    m.insert("userid".into(), json!(acc.user_id));
    m.insert("username".into(), json!(acc.username));
    m.insert("domainid".into(), json!(w.domain_id));
    m.insert("domain".into(), json!("ROOT"));
    m.insert("created".into(), json!(format_time(vm.created_ms)));
    m.insert("lastupdated".into(), json!(format_time(vm.last_updated_ms)));
    m.insert("state".into(), json!(vm.state.as_str()));
    m.insert("haenable".into(), json!(vm.haenable));
    m.insert("zoneid".into(), json!(zone.id));
    m.insert("zonename".into(), json!(zone.name));
    if on_host(vm) {
        if let Some(h) = w.hosts.get(vm.host) {
            if v.root {
                m.insert("hostid".into(), json!(h.id));
                m.insert("hostname".into(), json!(h.name));
            }
            m.insert("hostcontrolstate".into(), json!(h.control_state().as_str()));
        }
    }
    // The VM's hypervisor type is its host's.
    if let Some(h) = w.hosts.get(vm.host) {
        m.insert("hypervisor".into(), json!(h.hypervisor.as_str()));
    }
    m.insert("displayvm".into(), json!(true));
    m.insert("isdynamicallyscalable".into(), json!(false));
    m.insert("passwordenabled".into(), json!(false));
    m.insert("rootdeviceid".into(), json!(0));
    m.insert("rootdevicetype".into(), json!("ROOT"));
    m.insert("guestosid".into(), json!(SIM_OS_ID));
    m.insert("ostypeid".into(), json!(SIM_OS_ID));
    m.insert("osdisplayname".into(), json!("Ubuntu 22.04 LTS"));
    if v.details.tmpl {
        if let Some(t) = w.templates.get(vm.template) {
            m.insert("templateid".into(), json!(t.id));
            m.insert("templatename".into(), json!(t.name));
            m.insert("templatedisplaytext".into(), json!(t.display_text));
        }
    }
    if v.details.servoff {
        if let Some(o) = w.service_offerings.get(vm.offering) {
            m.insert("serviceofferingid".into(), json!(o.id));
            m.insert("serviceofferingname".into(), json!(o.name));
        }
        m.insert("cpunumber".into(), json!(vm.cpu_number));
        m.insert("cpuspeed".into(), json!(vm.cpu_speed));
        m.insert("memory".into(), json!(vm.memory_mb));
    }
    if let Some(d) = vm
        .data_disk
        .as_ref()
        .and_then(|d| w.disk_offerings.get(d.offering))
    {
        m.insert("diskofferingid".into(), json!(d.id));
        m.insert("diskofferingname".into(), json!(d.name));
    }
    if let Some(k) = &vm.keypair {
        m.insert("keypairs".into(), json!(k));
    }
    if !vm.details.is_empty() {
        let details: Map<String, Value> = vm
            .details
            .iter()
            .map(|(k, val)| (k.clone(), json!(val)))
            .collect();
        m.insert("details".into(), Value::Object(details));
    }
    if v.details.secgrp {
        m.insert("securitygroup".into(), json!([]));
    }
    if v.details.affgrp {
        let groups: Vec<Value> = vm
            .affinity_groups
            .iter()
            .filter_map(|g| w.affinity_groups.get(*g))
            .map(|g| json!({"id": g.id, "name": g.name, "type": g.kind.as_str(), "description": g.description}))
            .collect();
        m.insert("affinitygroup".into(), Value::Array(groups));
    }
    let tags: Vec<Value> = vm
        .tags
        .iter()
        .map(|(k, val)| {
            json!({"key": k, "value": val, "resourcetype": "UserVm", "resourceid": vm.id,
                   "account": acc.name, "domainid": w.domain_id, "domain": "ROOT"})
        })
        .collect();
    m.insert("tags".into(), Value::Array(tags));
    if v.details.nics {
        let nics: Vec<Value> = nic_json(w, vm, false).into_iter().collect();
        m.insert("nic".into(), Value::Array(nics));
    }
    // Stats fields exist while the VM has retained rows (`getVmStats` returns null without).
    let sample = vm.stats_view(v.accumulate).filter(|_| v.details.stats);
    if let Some(s) = &sample {
        stats_fields(&mut m, vm, s);
    }
    if v.metrics {
        m.insert(
            "cputotal".into(),
            json!(format!(
                "{:.2} Ghz",
                f64::from(vm.cpu_number * vm.cpu_speed) / 1000.0
            )),
        );
        m.insert(
            "memorytotal".into(),
            json!(format!("{:.2} GiB", f64::from(vm.memory_mb) / 1024.0)),
        );
        if let Some(ip) = vm.visible_ip() {
            m.insert("ipaddress".into(), json!(ip.to_string()));
        }
        if let Some(s) = &sample {
            m.insert("networkread".into(), json!(mib(s.rx_kib)));
            m.insert("networkwrite".into(), json!(mib(s.tx_kib)));
            m.insert("diskread".into(), json!(mib(s.disk_read_kib)));
            m.insert("diskwrite".into(), json!(mib(s.disk_write_kib)));
            m.insert(
                "diskiopstotal".into(),
                json!(s.disk_io_read + s.disk_io_write),
            );
        }
    }
    Value::Object(m)
}

pub(crate) const SIM_OS_ID: &str = "5a0d7e3e-8b8c-4d0e-9a57-2f6a1c3b9e01";

/// A VM as `listVirtualMachines` shows it with every detail (job results, deploy answers).
pub(crate) fn vm_response(w: &World, vm: &Vm, root: bool) -> Value {
    let view = View {
        root,
        details: Details::ALL,
        metrics: false,
        accumulate: w.settings.stats_increment_metrics,
    };
    vm_json(w, vm, view)
}

/// Whether stats are summed: the `accumulate` parameter (`ListVMsCmd`, since 4.17.0; parsed
/// as `Boolean.valueOf`, so anything but "true" is false) overrides the global
/// `vm.stats.increment.metrics` (`StatsCollector.getVmStats@00114e8b`). Older servers do not
/// know the parameter and ignore it, as any unknown parameter.
fn accumulate(call: &Call<'_>) -> bool {
    let s = &call.world.settings;
    match call.get_nonempty("accumulate") {
        Some(v) if s.version_at_least(&[4, 17, 0]) => v.eq_ignore_ascii_case("true"),
        _ => s.stats_increment_metrics,
    }
}

fn list_vms_common(call: &mut Call<'_>, metrics: bool) -> Result<Reply, ApiError> {
    let details = Details::parse(call.get("details"))?;
    let all = select_vms(call, false)?;
    let w: &World = call.world;
    let view = View {
        root: w.accounts[call.caller].is_root_admin(),
        details,
        metrics,
        accumulate: accumulate(call),
    };
    let range = call.paging.slice(&all);
    let page = &all[range];
    let items = page
        .iter()
        .map(|i| vm_json(w, &w.vms()[*i], view))
        .collect();
    if details.stats {
        let read: usize = page.iter().map(|i| w.vms()[*i].stats_rows().len()).sum();
        call.world.stats_rows_read += read as u64;
    }
    Ok(Reply::List {
        items,
        count: all.len(),
    })
}

pub(super) fn list_virtual_machines(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    list_vms_common(call, false)
}

pub(super) fn list_virtual_machines_metrics(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    list_vms_common(call, true)
}
