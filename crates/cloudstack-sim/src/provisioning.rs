//! Handlers of the commands that create and destroy things — deployVirtualMachine,
//! destroyVirtualMachine, createAffinityGroup, deleteAffinityGroup — and of
//! queryAsyncJobResult, which reports how their async jobs went.
//!
//! Like CloudStack, parameter validation happens before the job exists (errors come back
//! as the command's own error envelope); what happens inside the job (placement, the VM
//! booting, permission checks on `expunge`) is reported by the job. Async commands answer
//! `{"id", "jobid"}` (create commands) or `{"jobid"}`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::api::{ApiError, Call, Reply};
use super::catalog::{AffinityType, AsyncJob, JobCommand, JobStatus};
use super::commands::{vm_response, vm_visible_to};
use super::directory::{
    account_param, admin_like, affinity_group_json, is_data_volume_of, permission_denied,
    project_param, uuid_param,
};
use super::world::{
    format_time, AccountType, DiagOutcome, Diagnostic, Fault, HostControl, VmSpec, VmState, World,
    WorldError,
};

/// `vm.userdata.max.length` (CloudStack's default): the most decoded bytes accepted.
pub const USERDATA_MAX_BYTES: usize = 32_768;

/// A required UUID parameter resolved with `find` (missing → 431, unknown → 431).
fn required(
    call: &Call<'_>,
    name: &str,
    find: impl Fn(&World, &str) -> Option<usize>,
) -> Result<usize, ApiError> {
    let v = call.require(name)?;
    find(call.world, v).ok_or_else(|| call.bad(name, v))
}

/// A comma-separated UUID list parameter; every token must resolve.
fn uuid_list(
    call: &Call<'_>,
    name: &str,
    find: impl Fn(&World, &str) -> Option<usize>,
) -> Result<Vec<usize>, ApiError> {
    let Some(v) = call.get_nonempty(name) else {
        return Ok(Vec::new());
    };
    v.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| find(call.world, t).ok_or_else(|| call.bad(name, t)))
        .collect()
}

/// Map parameters `name[N].field=value`, grouped by N in numeric order.
fn indexed_map<'a>(call: &'a Call<'_>, name: &str) -> Vec<BTreeMap<&'a str, &'a str>> {
    let prefix = format!("{name}[");
    let mut by_index: BTreeMap<u64, BTreeMap<&str, &str>> = BTreeMap::new();
    for (k, v) in call.params {
        let Some(rest) = k.strip_prefix(prefix.as_str()) else {
            continue;
        };
        let Some((idx, field)) = rest.split_once("].") else {
            continue;
        };
        if let Ok(i) = idx.parse::<u64>() {
            by_index.entry(i).or_default().insert(field, v.as_str());
        }
    }
    by_index.into_values().collect()
}

/// `InsufficientCapacityException` → 533 with `cserrorcode` 4325.
fn insufficient_capacity(text: impl Into<String>) -> ApiError {
    ApiError {
        code: 533,
        cs: Some(4325),
        text: text.into(),
        error_wrapper: false,
    }
}

/// A `CloudRuntimeException` → 530 with `cserrorcode` 4250.
fn runtime_error(text: impl Into<String>) -> ApiError {
    ApiError {
        code: 530,
        cs: Some(4250),
        text: text.into(),
        error_wrapper: false,
    }
}

// ---- deployVirtualMachine ---------------------------------------------------------------

const HOSTNAME_RULE: &str = "Invalid name. Vm name can contain ASCII letters 'a' through 'z', the digits '0' through '9', and the hyphen ('-'), must be between 1 and 63 characters long, and can't start or end with \"-\" and can't start with digit";

/// CloudStack's host name rule for VM names.
pub fn valid_hostname(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !b[0].is_ascii_digit()
}

/// Decodes `userdata` (standard or URL-safe alphabet, padding optional, whitespace ignored).
pub fn decode_userdata(v: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let compact: String = v.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    [STANDARD, URL_SAFE, STANDARD_NO_PAD, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|e| e.decode(compact.as_bytes()).ok())
}

fn userdata_param(call: &Call<'_>) -> Result<Option<Vec<u8>>, ApiError> {
    let Some(v) = call.get_nonempty("userdata") else {
        return Ok(None);
    };
    let bytes = decode_userdata(v)
        .ok_or_else(|| ApiError::invalid_value("User data is not base64 encoded"))?;
    if bytes.len() > USERDATA_MAX_BYTES {
        return Err(ApiError::invalid_value(format!(
            "User data is too long: {} bytes decoded, the limit (vm.userdata.max.length) is {USERDATA_MAX_BYTES}",
            bytes.len()
        )));
    }
    Ok(Some(bytes))
}

/// The VM's network and requested address, from `networkids` or `iptonetworklist`
/// (default: the zone's first network). The simulator models one NIC per VM.
fn network_param(call: &Call<'_>, zone: usize) -> Result<(usize, Option<Ipv4Addr>), ApiError> {
    let mut wanted: Vec<(usize, Option<&str>)> =
        uuid_list(call, "networkids", World::network_by_id)?
            .into_iter()
            .map(|n| (n, None))
            .collect();
    for entry in indexed_map(call, "iptonetworklist") {
        let Some(id) = entry.get("networkid").copied() else {
            return Err(ApiError::invalid_value(
                "iptonetworklist entries need a networkid",
            ));
        };
        let n = call
            .world
            .network_by_id(id)
            .ok_or_else(|| call.bad("iptonetworklist", id))?;
        wanted.push((n, entry.get("ip").copied().filter(|ip| !ip.is_empty())));
    }
    let w: &World = call.world;
    let (network, ip) = match wanted.as_slice() {
        [] => {
            let n = w
                .networks
                .iter()
                .position(|n| n.zone == zone)
                .ok_or_else(|| {
                    ApiError::invalid_value(format!(
                        "Unable to find a default network in zone {}",
                        w.zones[zone].id
                    ))
                })?;
            (n, None)
        }
        [one] => *one,
        _ => {
            return Err(ApiError::invalid_value(
                "cloudstack-sim models one NIC per VM: pass exactly one network",
            ))
        }
    };
    let net = &w.networks[network];
    if net.zone != zone {
        return Err(ApiError::invalid_value(format!(
            "Network id={} doesn't belong to zone {}",
            net.id, w.zones[zone].id
        )));
    }
    let ip = match ip {
        None => None,
        Some(s) => {
            let ip: Ipv4Addr = s.parse().map_err(|_| {
                ApiError::invalid_value(format!("Invalid format for IP address parameter: {s}"))
            })?;
            if !net.in_range(u32::from(ip)) || net.is_used(u32::from(ip)) {
                return Err(insufficient_capacity(format!(
                    "Unable to allocate requested ip address {ip} in network {}: it is in use or outside the network's range",
                    net.name
                )));
            }
            Some(ip)
        }
    };
    Ok((network, ip))
}

/// Data disk from `diskofferingid` (+ `size` in GB for customized offerings).
fn disk_param(call: &Call<'_>, zone: usize) -> Result<Option<(usize, u64)>, ApiError> {
    let Some(offering) = uuid_param(call, "diskofferingid", World::disk_offering_by_id)? else {
        return Ok(None);
    };
    let size = match call.get_nonempty("size") {
        None => None,
        Some(s) => Some(s.parse::<u64>().map_err(|_| call.bad("size", s))?),
    };
    let d = &call.world.disk_offerings[offering];
    if !d.in_zone(zone) {
        return Err(ApiError::invalid_value(format!(
            "Disk offering {} is not available in zone {}",
            d.id, call.world.zones[zone].id
        )));
    }
    let size_gb = if d.customized {
        size.filter(|s| *s > 0).ok_or_else(|| {
            ApiError::invalid_value("This disk offering requires a custom size specified")
        })?
    } else {
        d.disk_size_gb
    };
    Ok(Some((offering, size_gb)))
}

/// The account a deployed VM belongs to: `account` (admins only) or the caller.
fn owner_param(call: &Call<'_>) -> Result<usize, ApiError> {
    let Some(i) = account_param(call)? else {
        return Ok(call.caller);
    };
    if i != call.caller && !admin_like(call) {
        return Err(permission_denied(format!(
            "Account {} does not have permission to deploy VMs for account {}",
            call.caller_account().name,
            call.world.accounts[i].name
        )));
    }
    Ok(i)
}

/// Picks a host that satisfies the VM's affinity groups: `Ok(None)` when no group
/// constrains it (the world spreads VMs), `Err` when a strict rule cannot be met.
fn place(w: &World, zone: usize, groups: &[usize]) -> Result<Option<usize>, String> {
    if groups.is_empty() {
        return Ok(None);
    }
    let mut candidates: Vec<usize> = (0..w.hosts.len())
        .filter(|h| w.hosts[*h].zone == zone && w.hosts[*h].control == HostControl::Enabled)
        .collect();
    for g in groups {
        let group = &w.affinity_groups[*g];
        let used: Vec<usize> = w
            .affinity_members(*g)
            .into_iter()
            .map(|v| &w.vms()[v])
            .filter(|vm| matches!(vm.state, VmState::Running | VmState::Starting))
            .map(|vm| vm.host)
            .collect();
        let kept: Vec<usize> = if group.kind.anti() {
            candidates
                .iter()
                .copied()
                .filter(|h| !used.contains(h))
                .collect()
        } else if used.is_empty() {
            candidates.clone()
        } else {
            candidates
                .iter()
                .copied()
                .filter(|h| used.contains(h))
                .collect()
        };
        if !kept.is_empty() || group.kind.strict() {
            candidates = kept;
        }
    }
    match candidates.len() {
        0 => Err("no host satisfies the VM's affinity groups".into()),
        n => Ok(Some(candidates[w.vms().len() % n])),
    }
}

fn world_error(e: WorldError) -> ApiError {
    match e {
        WorldError::Conflict(m) => insufficient_capacity(m),
        WorldError::Invalid(m) => ApiError::invalid_value(m),
        WorldError::NotFound(m) => runtime_error(m),
    }
}

/// `deployVirtualMachine`: validates what it is given, creates the VM in `Starting` (it
/// boots after the boot delay with a healthy guest) and answers `{"id", "jobid"}`; the job
/// succeeds when the VM runs and fails when it lands in `Error`.
pub fn deploy_virtual_machine(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let zone = required(call, "zoneid", World::zone_by_id)?;
    let offering = required(call, "serviceofferingid", World::service_offering_by_id)?;
    let template = required(call, "templateid", World::template_by_id)?;
    let project = project_param(call)?;
    let owner = owner_param(call)?;
    let groups = uuid_list(call, "affinitygroupids", |w, v| w.affinity_group_by_id(v))?;
    let (network, ip) = network_param(call, zone)?;
    let disk = disk_param(call, zone)?;
    let userdata = userdata_param(call)?;
    let start = call.bool_param("startvm")?.unwrap_or(true);
    let w: &World = call.world;
    if !w.service_offerings[offering].in_zone(zone) {
        return Err(ApiError::invalid_value(format!(
            "Service offering {} is not available in zone {}",
            w.service_offerings[offering].id, w.zones[zone].id
        )));
    }
    if !w.templates[template].zones.contains(&zone) {
        return Err(ApiError::invalid_value(format!(
            "Template {} has not been completely downloaded to zone {}",
            w.templates[template].id, w.zones[zone].id
        )));
    }
    let name = match call.get_nonempty("name") {
        Some(n) => n.to_string(),
        None => format!("VM-{}", uuid::Uuid::new_v4()),
    };
    if !valid_hostname(&name) {
        return Err(ApiError::invalid_value(HOSTNAME_RULE));
    }
    if w.vm_index(&name).is_some() {
        let net = &w.networks[network];
        return Err(ApiError::invalid_value(format!(
            "The vm with hostName {name} already exists in the network domain: cs{}sim.internal; network={}",
            net.vlan, net.name
        )));
    }
    let placement = place(w, zone, &groups);
    let mut spec = VmSpec::new(name);
    spec.display_name = call.get_nonempty("displayname").map(str::to_string);
    spec.account = Some(w.accounts[owner].name.clone());
    spec.project = project.map(|p| w.projects[p].id.clone());
    spec.zone = Some(w.zones[zone].id.clone());
    spec.network = Some(w.networks[network].id.clone());
    spec.offering = Some(w.service_offerings[offering].id.clone());
    spec.template = Some(w.templates[template].id.clone());
    spec.ip = ip;
    spec.data_disk = disk;
    spec.userdata = userdata;
    spec.keypair = call.get_nonempty("keypair").map(str::to_string);
    spec.affinity_groups = groups;
    spec.details = indexed_map(call, "details")
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    spec.deployed = true;
    match placement {
        Ok(host) => {
            spec.host = host.map(|h| w.hosts[h].id.clone());
            if !start {
                spec.state = VmState::Stopped;
            }
        }
        // CloudStack creates the VM, then its start fails in the job: the VM is in Error.
        Err(_) => spec.state = VmState::Error,
    }
    let caller = call.caller;
    let idx = call.world.add_vm(&spec).map_err(world_error)?;
    let vm_id = call.world.vms()[idx].id.clone();
    let job = call.world.add_job(
        caller,
        JobCommand::DeployVm { vm: idx },
        &vm_id,
        JobStatus::Pending,
    );
    Ok(async_create_reply(&vm_id, call.world, job))
}

fn async_create_reply(id: &str, w: &World, job: usize) -> Reply {
    let mut m = Map::new();
    m.insert("id".into(), json!(id));
    m.insert("jobid".into(), json!(w.job(job).map(|j| j.id.as_str())));
    Reply::Raw(m)
}

pub(crate) fn async_reply(w: &World, job: usize) -> Reply {
    let mut m = Map::new();
    m.insert("jobid".into(), json!(w.job(job).map(|j| j.id.as_str())));
    Reply::Raw(m)
}

// ---- destroyVirtualMachine --------------------------------------------------------------

/// `destroyVirtualMachine`: `Destroyed` (then Expunging → gone on the expunge timers) or,
/// with `expunge=true`, straight to `Expunging`; `volumeids` (data disks of the VM) go with
/// it. An expunged VM's id still resolves, and CloudStack then fails with "Unable to find
/// uuid for id …" (CAPC treats that text as "already gone").
pub fn destroy_virtual_machine(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let idx = required(call, "id", |w, v| w.vm_index_by_id(v))?;
    let expunge = call.bool_param("expunge")?.unwrap_or(false);
    let volume_ids: Vec<&str> = call
        .get_nonempty("volumeids")
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let w: &World = call.world;
    let vm = &w.vms()[idx];
    if vm.removed {
        return Err(runtime_error(format!(
            "Unable to find uuid for id {}",
            vm.seq
        )));
    }
    if !vm_visible_to(w, call.caller, vm) {
        return Err(permission_denied(format!(
            "Account {} does not have permission to access the virtual machine",
            call.caller_account().name
        )));
    }
    for v in &volume_ids {
        if !is_data_volume_of(vm, v) {
            return Err(ApiError::invalid_value(format!(
                "Please specify a data volume of VM {}: volume {v} is not one",
                vm.id
            )));
        }
    }
    let with_volumes = !volume_ids.is_empty();
    let allowed = !expunge || admin_like(call) || w.settings.allow_user_expunge_recover_vm;
    let vm_id = vm.id.clone();
    let now = w.now_ms();
    let status = if allowed && vm.has(Fault::DestroyFails) {
        // The `destroy-fails` fault: `UserVmService.destroyVm` gives back no VM (for example
        // the stop before the destroy failed on a host that cannot be reached) and the command
        // answers `ServerApiException(INTERNAL_ERROR, "Failed to destroy Instance")`
        // (`DestroyVMCmd.execute`, api/.../command/user/vm/DestroyVMCmd.java@134fe662), a
        // `ServerApiException` without a cause: 530 with `cserrorcode` 9999. The VM stays as
        // it was, so every retry fails the same way until the fault is cleared.
        JobStatus::Failed {
            at_ms: now,
            code: 530,
            cs: 9999,
            text: "Failed to destroy Instance".into(),
        }
    } else if allowed {
        call.world.destroy_vm_now(idx, expunge);
        if with_volumes {
            call.world.drop_data_disk(idx);
        }
        JobStatus::Succeeded { at_ms: now }
    } else {
        JobStatus::Failed {
            at_ms: now,
            code: 531,
            cs: 4365,
            text: "Parameter expunge can be passed by Admin only. Or when the allow.user.expunge.recover.vm key is set.".into(),
        }
    };
    let caller = call.caller;
    let job = call
        .world
        .add_job(caller, JobCommand::DestroyVm { vm: idx }, &vm_id, status);
    Ok(async_reply(call.world, job))
}

// ---- affinity groups --------------------------------------------------------------------

/// `createAffinityGroup` (name, type, description, projectid, account): answers
/// `{"id", "jobid"}`; the job has already succeeded.
pub fn create_affinity_group(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let name = call.require("name")?.to_string();
    let type_name = call.require("type")?;
    let kind = AffinityType::parse(type_name).ok_or_else(|| {
        ApiError::invalid_value(format!(
            "Unable to create affinity group, invalid affinity group type {type_name}"
        ))
    })?;
    let project = project_param(call)?;
    let owner = owner_param(call)?;
    let description = call.get("description").unwrap_or_default().to_string();
    let idx = call
        .world
        .add_affinity_group(&name, kind, &description, owner, project)
        .map_err(|e| ApiError::invalid_value(e.to_string()))?;
    let id = call.world.affinity_groups[idx].id.clone();
    let now = call.world.now_ms();
    let caller = call.caller;
    let job = call.world.add_job(
        caller,
        JobCommand::CreateAffinityGroup { group: idx },
        &id,
        JobStatus::Succeeded { at_ms: now },
    );
    Ok(async_create_reply(&id, call.world, job))
}

/// `deleteAffinityGroup` by `id` or `name` (+ `projectid`): answers `{"jobid"}`; the job
/// fails with 536 while a live VM is still in the group.
pub fn delete_affinity_group(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let project = project_param(call)?;
    let w: &World = call.world;
    let idx = match (call.get_nonempty("id"), call.get_nonempty("name")) {
        (Some(id), _) => w
            .affinity_group_by_id(id)
            .ok_or_else(|| call.bad("id", id))?,
        (None, Some(name)) => w
            .affinity_groups
            .iter()
            .position(|g| {
                !g.deleted
                    && g.name == name
                    && g.project == project
                    && (project.is_some() || g.account == call.caller)
            })
            .ok_or_else(|| {
                ApiError::invalid_value(format!("Unable to find affinity group by name {name}"))
            })?,
        (None, None) => {
            return Err(ApiError::invalid_value(
                "Either the affinity group id or name must be specified",
            ))
        }
    };
    let g = &w.affinity_groups[idx];
    let own = match g.project {
        Some(p) => w.projects[p].members.contains(&call.caller),
        None => g.account == call.caller,
    };
    if !own && !admin_like(call) {
        return Err(permission_denied(format!(
            "Account {} does not have permission to delete affinity group {}",
            call.caller_account().name,
            g.id
        )));
    }
    let in_use = w
        .affinity_members(idx)
        .into_iter()
        .any(|v| !matches!(w.vms()[v].state, VmState::Destroyed | VmState::Expunging));
    let now = w.now_ms();
    let id = g.id.clone();
    let status = if in_use {
        JobStatus::Failed {
            at_ms: now,
            code: 536,
            cs: 4375,
            text: format!(
                "Cannot delete affinity group {} since it is in use by VMs",
                g.name
            ),
        }
    } else {
        call.world.affinity_groups[idx].deleted = true;
        JobStatus::Succeeded { at_ms: now }
    };
    let caller = call.caller;
    let job = call.world.add_job(
        caller,
        JobCommand::DeleteAffinityGroup { group: idx },
        &id,
        status,
    );
    Ok(async_reply(call.world, job))
}

// ---- queryAsyncJobResult ----------------------------------------------------------------

/// What a finished job returns: the object it worked on, rendered now.
fn job_result(w: &World, job: &AsyncJob, root: bool) -> Value {
    match job.command {
        JobCommand::DeployVm { vm } | JobCommand::DestroyVm { vm } => match w.vm(vm) {
            Some(v) => json!({"virtualmachine": vm_response(w, v, root)}),
            None => json!({}),
        },
        JobCommand::CreateAffinityGroup { group } => {
            json!({"affinitygroup": affinity_group_json(w, group)})
        }
        JobCommand::DeleteAffinityGroup { .. } => json!({"success": true}),
        // The gson adapter writes the object under its name, `diagnostics` (RDC.execute sets
        // it; ResponseObjectTypeAdapter.java@830f3061, guest-probe.md §1).
        JobCommand::RunDiagnostics { .. } => {
            match w.job_index(&job.id).and_then(|j| w.diagnostic(j)) {
                Some(Diagnostic {
                    outcome: DiagOutcome::Output(o),
                    ..
                }) => {
                    json!({"diagnostics": {"stdout": o.stdout, "stderr": o.stderr, "exitcode": o.exitcode}})
                }
                _ => json!({}),
            }
        }
    }
}

/// The `queryasyncjobresultresponse` body of a job.
pub fn job_json(w: &World, job: &AsyncJob, root: bool) -> Map<String, Value> {
    let account = w.accounts.get(job.account);
    let mut m = Map::new();
    m.insert("accountid".into(), json!(account.map(|a| a.id.as_str())));
    m.insert("userid".into(), json!(account.map(|a| a.user_id.as_str())));
    m.insert("cmd".into(), json!(job.command.class_name()));
    m.insert("jobstatus".into(), json!(job.status.code()));
    m.insert("jobprocstatus".into(), json!(0));
    let (code, completed, result) = match &job.status {
        JobStatus::Pending => (0, None, None),
        JobStatus::Succeeded { at_ms } => (0, Some(*at_ms), Some(job_result(w, job, root))),
        JobStatus::Failed {
            at_ms,
            code,
            cs,
            text,
        } => (
            *code,
            Some(*at_ms),
            Some(json!({"uuidList": [], "errorcode": code, "cserrorcode": cs, "errortext": text})),
        ),
    };
    m.insert("jobresultcode".into(), json!(code));
    m.insert("jobresulttype".into(), json!("object"));
    if let Some(r) = result {
        m.insert("jobresult".into(), r);
    }
    m.insert("jobinstancetype".into(), json!(job.command.instance_type()));
    m.insert("jobinstanceid".into(), json!(job.instance_id));
    m.insert("created".into(), json!(format_time(job.created_ms)));
    if let Some(t) = completed {
        m.insert("completed".into(), json!(format_time(t)));
    }
    m.insert("jobid".into(), json!(job.id));
    m
}

/// `queryAsyncJobResult` (jobid): the submitter's jobs, any job for root admins.
pub fn query_async_job_result(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let idx = required(call, "jobid", |w, v| w.job_index(v))?;
    let w: &World = call.world;
    let root = call.caller_account().is_root_admin();
    let Some(job) = w.job(idx) else {
        return Err(runtime_error("job vanished"));
    };
    if job.account != call.caller && !root {
        return Err(permission_denied(format!(
            "Permission denied, invalid job ownership, job id: {}",
            job.id
        )));
    }
    Ok(Reply::Raw(job_json(w, job, root)))
}

/// `listAsyncJobs` (keyword, listall, page, pagesize): the caller's jobs; with `listall=true`,
/// an admin's (root, domain or resource admin) covers every account of its domain and below —
/// every account here, where there is only the ROOT domain (`AccountManagerImpl.java@43d42b06`
/// `buildACLSearchParameters`, as for `listRouters`); `keyword` matches the job's command class (SQL `LIKE
/// %keyword%`, case-insensitive in CloudStack's MySQL collation); ordered by job id
/// (`server/src/main/java/com/cloud/api/query/QueryManagerImpl.java@57c33169`
/// `searchForAsyncJobsInternal`). Finished jobs stay listed (CloudStack purges them after
/// `job.expire.minutes`, a day by default, which the simulator's runs never reach).
pub fn list_async_jobs(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let listall = call.bool_param("listall")?.unwrap_or(false);
    let keyword = call.get_nonempty("keyword").map(str::to_lowercase);
    let w: &World = call.world;
    let root = call.caller_account().is_root_admin();
    let every_account = listall && call.caller_account().kind != AccountType::User;
    let items = (0..)
        .map_while(|i| w.job(i))
        .filter(|j| every_account || j.account == call.caller)
        .filter(|j| {
            keyword
                .as_ref()
                .is_none_or(|k| j.command.class_name().to_lowercase().contains(k.as_str()))
        })
        .map(|j| Value::Object(job_json(w, j, root)))
        .collect();
    Ok(crate::directory::page(call, items))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_follow_cloudstack_rule() {
        assert!(valid_hostname("e2e-md-0"));
        assert!(valid_hostname("A1"));
        for bad in [
            "",
            "-a",
            "a-",
            "9lives",
            "under_score",
            "dot.ted",
            &"a".repeat(64),
        ] {
            assert!(!valid_hostname(bad), "{bad:?}");
        }
    }

    #[test]
    fn userdata_decodes_with_or_without_padding() {
        assert_eq!(decode_userdata("aGk=").unwrap(), b"hi");
        assert_eq!(decode_userdata("aGk").unwrap(), b"hi");
        assert_eq!(decode_userdata("aG\nk=").unwrap(), b"hi");
        assert!(decode_userdata("***").is_none());
    }
}
