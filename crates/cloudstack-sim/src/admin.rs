//! The `/sim/…` admin JSON API: VMs (create, inspect, faults, guest traffic profile), hosts,
//! settings, API-level faults, call counts, reset and the clock, networks (and their uplink)
//! and their virtual routers.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::scenario;
use super::server::App;
use super::traffic::Profile;
use super::world::{
    format_time, Fault, Host, Owner, Router, RouterState, Row, Throttle, Vm, World, WorldError,
};

fn admin_error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(json!({"error": msg.into()}))).into_response()
}

fn world_error(e: WorldError) -> Response {
    let status = match &e {
        WorldError::NotFound(_) => StatusCode::NOT_FOUND,
        WorldError::Invalid(_) => StatusCode::BAD_REQUEST,
        WorldError::Conflict(_) => StatusCode::CONFLICT,
    };
    admin_error(status, e.to_string())
}

fn no_vm(id: &str) -> Response {
    admin_error(
        StatusCode::NOT_FOUND,
        format!("no VM with id or name {id:?}"),
    )
}

/// The VM's admin view after a change (`null` should it be gone).
fn vm_view(w: &World, idx: usize) -> Response {
    Json(
        w.vm(idx)
            .map(|vm| vm_admin_json(w, vm))
            .unwrap_or(Value::Null),
    )
    .into_response()
}

fn parse_body(body: &Bytes) -> Result<Value, Box<Response>> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(json!({}));
    }
    serde_json::from_slice(body).map_err(|e| {
        Box::new(admin_error(
            StatusCode::BAD_REQUEST,
            format!("body is not valid JSON: {e}"),
        ))
    })
}

/// The admin view of one VM (internal state included).
pub fn vm_admin_json(w: &World, vm: &Vm) -> Value {
    let host = w.hosts.get(vm.host);
    let nic = vm.visible_nic();
    json!({
        "id": vm.id,
        "name": vm.name,
        "displayname": vm.display_name,
        "state": vm.state.as_str(),
        "removed": vm.removed,
        "guest": vm.guest.as_str(),
        "faults": vm.faults().iter().map(|f| f.as_str()).collect::<Vec<_>>(),
        "account": w.accounts.get(vm.account).map(|a| a.name.clone()),
        "project": vm.project.and_then(|p| w.projects.get(p)).map(|p| p.name.clone()),
        "zone": w.zones.get(vm.zone).map(|z| z.name.clone()),
        "host": host.map(|h| h.name.clone()),
        "hostid": host.map(|h| h.id.clone()),
        "host_control_state": host.map(|h| h.control_state().as_str()),
        "hypervisor": host.map(|h| h.hypervisor.as_str()),
        "nic": nic.is_some(),
        "network": nic.and_then(|n| w.networks.get(n.network)).map(|n| n.name.clone()),
        "ipaddress": vm.visible_ip().map(|i| i.to_string()),
        "boot_seconds": vm.boot_ms as f64 / 1000.0,
        "created": format_time(vm.created_ms),
        "lastupdated": format_time(vm.last_updated_ms),
        "running_since": vm.running_since.map(format_time),
        "joined": w.joined(vm),
        "profile": vm.profile_at(w.now_ms()).map(Profile::as_str),
        "profile_override": vm.profile_override().map(Profile::as_str),
        "stats": stats_admin_json(w, vm),
        "tags": vm.tags.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
        "deployed": vm.deployed,
        "service_offering": w.service_offerings.get(vm.offering).map(|o| o.name.clone()),
        "template": w.templates.get(vm.template).map(|t| t.name.clone()),
        "cpu_number": vm.cpu_number,
        "memory_mb": vm.memory_mb,
        "userdata_bytes": vm.userdata.as_ref().map(Vec::len),
        "userdata_gzip": vm.userdata.as_ref().is_some_and(|u| u.starts_with(&[0x1f, 0x8b])),
        "keypair": vm.keypair,
        "affinity_groups": vm.affinity_groups.iter().filter_map(|g| w.affinity_groups.get(*g)).map(|g| g.name.clone()).collect::<Vec<_>>(),
        "details": vm.details.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
        "data_disk_gb": vm.data_disk.as_ref().map(|d| d.size_gb),
    })
}

/// Debugging view of a VM's statistics: retained rows, the last row, the true bytes.
fn stats_admin_json(w: &World, vm: &Vm) -> Value {
    let (rx, tx) = vm.true_bytes(w.now_ms());
    let last = vm.stats_rows().next_back().map(|r| {
        json!({
            "timestamp": format_time(r.at_ms),
            "management_server": r.ms,
            "networkkbsread": Row::kib(r.rx),
            "networkkbswrite": Row::kib(r.tx),
            "diskkbsread": Row::kib(r.disk_read),
            "diskkbswrite": Row::kib(r.disk_write),
        })
    });
    json!({
        "rows": vm.stats_rows().len(),
        "last_row": last,
        "true_rx_bytes": rx,
        "true_tx_bytes": tx,
    })
}

pub(crate) async fn admin_list_vms(State(app): State<App>) -> Response {
    let st = app.sim.lock_advanced();
    let vms: Vec<Value> = st
        .world
        .vms()
        .iter()
        .map(|v| vm_admin_json(&st.world, v))
        .collect();
    Json(json!({"now": format_time(st.world.now_ms()), "vms": vms})).into_response()
}

pub(crate) async fn admin_get_vm(State(app): State<App>, Path(id): Path<String>) -> Response {
    let st = app.sim.lock_advanced();
    match st.world.vm_index(&id).and_then(|i| st.world.vm(i)) {
        Some(vm) => Json(vm_admin_json(&st.world, vm)).into_response(),
        None => no_vm(&id),
    }
}

pub(crate) async fn admin_create_vm(State(app): State<App>, body: Bytes) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let spec = match scenario::vm_spec(&v, "$", false) {
        Ok((s, _)) => s,
        Err(e) => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                format!("{}: {}", e.path, e.message),
            )
        }
    };
    let mut st = app.sim.lock_advanced();
    match st.world.add_vm(&spec) {
        Ok(i) => {
            let w = &st.world;
            let view = w
                .vm(i)
                .map(|vm| vm_admin_json(w, vm))
                .unwrap_or(Value::Null);
            (StatusCode::CREATED, Json(view)).into_response()
        }
        Err(e) => world_error(e),
    }
}

pub(crate) async fn admin_add_fault(
    State(app): State<App>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let mut st = app.sim.lock_advanced();
    let Some(idx) = st.world.vm_index(&id) else {
        return no_vm(&id);
    };
    let Some(name) = v.get("fault").and_then(Value::as_str) else {
        return admin_error(
            StatusCode::BAD_REQUEST,
            format!(
                "body must be {{\"fault\": F}} with F one of: {}",
                Fault::names()
            ),
        );
    };
    let Some(fault) = Fault::parse(name) else {
        return admin_error(
            StatusCode::BAD_REQUEST,
            format!(
                "unknown fault {name:?} (expected one of: {})",
                Fault::names()
            ),
        );
    };
    st.world.apply_fault_now(idx, fault);
    vm_view(&st.world, idx)
}

pub(crate) async fn admin_clear_faults(State(app): State<App>, Path(id): Path<String>) -> Response {
    let mut st = app.sim.lock_advanced();
    let Some(idx) = st.world.vm_index(&id) else {
        return no_vm(&id);
    };
    st.world.clear_faults_now(idx);
    vm_view(&st.world, idx)
}

pub(crate) async fn admin_get_api(State(app): State<App>) -> Response {
    let st = app.sim.lock();
    Json(st.api_faults.to_json(st.world.settings.throttle)).into_response()
}

pub(crate) async fn admin_set_api(State(app): State<App>, body: Bytes) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Some(obj) = v.as_object() else {
        return admin_error(StatusCode::BAD_REQUEST, "body must be a JSON object");
    };
    let mut st = app.sim.lock();
    let mut f = st.api_faults.clone();
    let mut throttle = st.world.settings.throttle;
    for (k, val) in obj {
        let bad =
            |what: &str| admin_error(StatusCode::BAD_REQUEST, format!("{k}: expected {what}"));
        match k.as_str() {
            "outage" => match val.as_bool() {
                Some(b) => f.outage = b,
                None => return bad("a boolean"),
            },
            "timeout_next" | "malformed_next" | "html_next" | "fault_after" => {
                let Some(n) = val.as_u64() else {
                    return bad("a non-negative integer");
                };
                match k.as_str() {
                    "timeout_next" => f.timeout_next = n,
                    "malformed_next" => f.malformed_next = n,
                    "fault_after" => f.fault_after = n,
                    _ => f.html_next = n,
                }
            }
            "latency_ms" => match val.as_u64() {
                Some(n) => f.latency_ms = n,
                None => return bad("a non-negative integer"),
            },
            "clock_skew_seconds" => match val.as_f64() {
                Some(x) if x.is_finite() && x.abs() < 1e9 => f.clock_skew_ms = (x * 1000.0) as i64,
                _ => return bad("a number of seconds (negative = behind)"),
            },
            "server_error_rate" => match val.as_f64() {
                Some(r) if (0.0..=1.0).contains(&r) => f.server_error_rate = r,
                _ => return bad("a number between 0 and 1"),
            },
            "throttle" => {
                if val.is_null() {
                    throttle = None;
                } else {
                    match serde_json::from_value::<Throttle>(val.clone()) {
                        Ok(t) if t.interval_seconds > 0 => throttle = Some(t),
                        _ => return bad("null or {\"max\": N, \"interval_seconds\": S} with S >= 1"),
                    }
                }
            }
            _ => {
                return admin_error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "unknown field {k:?} (expected outage, throttle, latency_ms, server_error_rate, timeout_next, malformed_next, html_next, fault_after, clock_skew_seconds)"
                    ),
                )
            }
        }
    }
    if throttle != st.world.settings.throttle {
        st.throttle.clear();
    }
    st.api_faults = f;
    st.world.settings.throttle = throttle;
    Json(st.api_faults.to_json(throttle)).into_response()
}

pub(crate) async fn admin_calls(State(app): State<App>) -> Response {
    Json(app.sim.calls()).into_response()
}

pub(crate) async fn admin_reset(State(app): State<App>, body: Bytes) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let world = v.get("world").and_then(Value::as_bool).unwrap_or(false);
    app.sim.reset(world);
    Json(json!({"reset": true, "world": world})).into_response()
}

fn clock_json(app: &App) -> Value {
    let st = app.sim.lock_advanced();
    json!({
        "now": format_time(st.world.now_ms()),
        "now_ms": st.world.now_ms(),
        "time_scale": st.clock.scale(),
        "advanced_seconds": st.clock.advanced_ms() as f64 / 1000.0,
        "start": format_time(st.clock.start_ms()),
    })
}

pub(crate) async fn admin_get_clock(State(app): State<App>) -> Response {
    Json(clock_json(&app)).into_response()
}

pub(crate) async fn admin_set_clock(State(app): State<App>, body: Bytes) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    match v.get("advance_seconds").and_then(Value::as_f64) {
        Some(s) if s.is_finite() && s >= 0.0 => app.sim.advance(s),
        _ => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                "body must be {\"advance_seconds\": N} with N >= 0",
            )
        }
    }
    Json(clock_json(&app)).into_response()
}

// ---- guest traffic profile, hosts, settings ---------------------------------------------

/// `POST /sim/vms/{id}/guest {"profile": P}`: the guest follows profile P from now on;
/// `null` or `"default"` returns it to its guest kind's timeline.
pub(crate) async fn admin_set_guest(
    State(app): State<App>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let usage = || {
        admin_error(
            StatusCode::BAD_REQUEST,
            format!(
                "body must be {{\"profile\": P}} with P null, \"default\" or one of: {}",
                Profile::names()
            ),
        )
    };
    let profile = match v.get("profile") {
        Some(Value::Null) => None,
        Some(Value::String(s)) if s == "default" => None,
        Some(Value::String(s)) => match Profile::parse(s) {
            Some(p) => Some(p),
            None => return usage(),
        },
        _ => return usage(),
    };
    let mut st = app.sim.lock_advanced();
    let Some(idx) = st.world.vm_index(&id) else {
        return no_vm(&id);
    };
    if let Err(e) = st.world.set_profile_now(idx, profile) {
        return world_error(e);
    }
    vm_view(&st.world, idx)
}

fn host_json(h: &Host) -> Value {
    json!({
        "id": h.id,
        "name": h.name,
        "hypervisor": h.hypervisor.as_str(),
        "status": h.status().as_str(),
        "resource_state": h.resource_state().as_str(),
        "hostcontrolstate": h.control_state().as_str(),
        "stats_call_fails": h.stats_collection_paused,
        "collected": h.collectable(),
    })
}

pub(crate) async fn admin_list_hosts(State(app): State<App>) -> Response {
    let st = app.sim.lock_advanced();
    let hosts: Vec<Value> = st.world.hosts.iter().map(host_json).collect();
    Json(json!({"hosts": hosts})).into_response()
}

pub(crate) async fn admin_get_host(State(app): State<App>, Path(id): Path<String>) -> Response {
    let st = app.sim.lock_advanced();
    match st.world.host_index(&id) {
        Some(i) => Json(host_json(&st.world.hosts[i])).into_response(),
        None => admin_error(StatusCode::NOT_FOUND, format!("no host {id:?}")),
    }
}

/// `POST /sim/hosts/{id}` with any of `status`, `resource_state`, `hypervisor`,
/// `stats_call_fails`: applied now.
pub(crate) async fn admin_set_host(
    State(app): State<App>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    const KEYS: &[&str] = &["status", "resource_state", "hypervisor", "stats_call_fails"];
    let change = match scenario::Obj::new(&v, "$")
        .and_then(|o| o.only(KEYS).map(|_| o))
        .and_then(|o| scenario::host_change(&o, KEYS))
    {
        Ok(c) => c,
        Err(e) => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                format!("{}: {}", e.path, e.message),
            )
        }
    };
    let mut st = app.sim.lock_advanced();
    let Some(i) = st.world.host_index(&id) else {
        return admin_error(StatusCode::NOT_FOUND, format!("no host {id:?}"));
    };
    if let Err(e) = st.world.change_host_now(i, &change) {
        return world_error(e);
    }
    Json(host_json(&st.world.hosts[i])).into_response()
}

fn settings_json(w: &World) -> Value {
    let s = &w.settings;
    json!({
        "stats_interval_seconds": s.stats_interval_seconds,
        "stats_retention_minutes": s.stats_retention_seconds / 60,
        "stats_retention_seconds": s.stats_retention_seconds,
        "stats_increment_metrics": s.stats_increment_metrics,
        "management_servers": s.management_servers,
        "ms_offsets_seconds": (0..s.management_servers as usize)
            .map(|k| s.ms_offset_ms(k) as f64 / 1000.0)
            .collect::<Vec<_>>(),
        "server_time_zone": s.server_time_zone,
        "guest_boot_seconds": s.guest_boot_seconds,
        "guest_join_seconds": s.guest_join_seconds,
        "guest_speedup": s.guest_speedup,
        "slow_boot_seconds": s.slow_boot_seconds,
        "boot_seconds": s.boot_seconds,
        "default_page_size": s.default_page_size,
        "cloudstack_version": s.cloudstack_version,
    })
}

pub(crate) async fn admin_get_settings(State(app): State<App>) -> Response {
    let st = app.sim.lock_advanced();
    Json(settings_json(&st.world)).into_response()
}

/// `POST /sim/settings`: the scenario `settings` keys; applied from now on (the world is
/// first advanced to now under the old settings).
pub(crate) async fn admin_set_settings(State(app): State<App>, body: Bytes) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let mut st = app.sim.lock_advanced();
    let mut s = st.world.settings.clone();
    if let Err(e) = scenario::apply_settings(&v, "$", &mut s) {
        return admin_error(
            StatusCode::BAD_REQUEST,
            format!("{}: {}", e.path, e.message),
        );
    }
    if s.throttle != st.world.settings.throttle {
        st.throttle.clear();
    }
    st.world.settings = s;
    Json(settings_json(&st.world)).into_response()
}

// ---- networks and virtual routers -------------------------------------------------------

fn owner_json(w: &World, o: Owner) -> Value {
    match o {
        Owner::System => json!({"account": "system"}),
        Owner::Account(a) => json!({"account": w.accounts.get(a).map(|a| a.name.clone())}),
        Owner::Project(p) => json!({"project": w.projects.get(p).map(|p| p.name.clone())}),
    }
}

fn network_admin_json(w: &World, i: usize) -> Value {
    let n = &w.networks[i];
    json!({
        "id": n.id,
        "name": n.name,
        "type": n.kind.as_str(),
        "zone": w.zones.get(n.zone).map(|z| z.name.clone()),
        "cidr": crate::directory::cidr_of(n),
        "gateway": n.gateway.to_string(),
        "virtual_router": n.virtual_router,
        "owner": owner_json(w, n.owner),
        "routers": w.routers_of(i).into_iter().map(|r| w.routers[r].id.clone()).collect::<Vec<_>>(),
        "uplink": n.uplink_lost_since.is_none(),
        "gateway_lost_since": w.gateway_lost_since(i).map(format_time),
    })
}

/// `POST /sim/networks/{id}` `{"uplink": false | true}` (id or name): the network loses or
/// gets back its uplink now (`World::set_network_uplink_now`: its guests' gateway stops
/// answering; CloudStack sees nothing).
pub(crate) async fn admin_set_network(
    State(app): State<App>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Some(up) = v.get("uplink").and_then(Value::as_bool) else {
        return admin_error(
            StatusCode::BAD_REQUEST,
            "body must be {\"uplink\": true | false}",
        );
    };
    let mut st = app.sim.lock_advanced();
    let Some(i) = st.world.network_index(&id) else {
        return admin_error(StatusCode::NOT_FOUND, format!("no network {id:?}"));
    };
    if let Err(e) = st.world.set_network_uplink_now(i, up) {
        return world_error(e);
    }
    Json(network_admin_json(&st.world, i)).into_response()
}

fn router_admin_json(w: &World, r: &Router) -> Value {
    let host = r.host.and_then(|h| w.hosts.get(h));
    json!({
        "id": r.id,
        "name": r.name,
        "state": r.state.as_str(),
        "network": w.networks.get(r.network).map(|n| n.name.clone()),
        "networkid": w.networks.get(r.network).map(|n| n.id.clone()),
        "host": host.map(|h| h.name.clone()),
        "hostid": host.map(|h| h.id.clone()),
        "guestipaddress": r.guest_ip.to_string(),
        "macaddress": r.guest_mac,
        "owner": owner_json(w, r.owner(w)),
        "busy_until": format_time(r.busy_until),
    })
}

/// `GET /sim/networks`: every network with its owner and router ids.
pub(crate) async fn admin_list_networks(State(app): State<App>) -> Response {
    let st = app.sim.lock_advanced();
    let w = &st.world;
    let nets: Vec<Value> = (0..w.networks.len())
        .map(|i| network_admin_json(w, i))
        .collect();
    Json(json!({"networks": nets})).into_response()
}

/// `POST /sim/networks`: the scenario's network keys (`name`, `cidr`, `zone`, `gateway`,
/// `type`, `id`, `virtual_router`, `router_state`, `account`, `project`); 201 with the
/// network's view.
pub(crate) async fn admin_create_network(State(app): State<App>, body: Bytes) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let spec = match scenario::network_spec(&v, "$") {
        Ok(s) => s,
        Err(e) => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                format!("{}: {}", e.path, e.message),
            )
        }
    };
    let mut st = app.sim.lock_advanced();
    match st.world.add_network_spec(&spec) {
        Ok(i) => (StatusCode::CREATED, Json(network_admin_json(&st.world, i))).into_response(),
        Err(e) => world_error(e),
    }
}

/// `GET /sim/routers`: every virtual router.
pub(crate) async fn admin_list_routers(State(app): State<App>) -> Response {
    let st = app.sim.lock_advanced();
    let w = &st.world;
    let routers: Vec<Value> = w.routers.iter().map(|r| router_admin_json(w, r)).collect();
    Json(json!({"routers": routers})).into_response()
}

pub(crate) async fn admin_get_router(State(app): State<App>, Path(id): Path<String>) -> Response {
    let st = app.sim.lock_advanced();
    match st.world.router_index(&id) {
        Some(i) => Json(router_admin_json(&st.world, &st.world.routers[i])).into_response(),
        None => admin_error(StatusCode::NOT_FOUND, format!("no router {id:?}")),
    }
}

/// `POST /sim/routers/{id}` `{"state": "Running" | "Stopped" | "Starting"}` (id or name):
/// applied now; Stopped takes the router's host away.
pub(crate) async fn admin_set_router(
    State(app): State<App>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Some(state) = v
        .get("state")
        .and_then(Value::as_str)
        .and_then(RouterState::parse)
    else {
        return admin_error(
            StatusCode::BAD_REQUEST,
            format!(
                "body must be {{\"state\": S}} with S one of: {}",
                RouterState::names()
            ),
        );
    };
    let mut st = app.sim.lock_advanced();
    let Some(i) = st.world.router_index(&id) else {
        return admin_error(StatusCode::NOT_FOUND, format!("no router {id:?}"));
    };
    if let Err(e) = st.world.set_router_state_now(i, state) {
        return world_error(e);
    }
    Json(router_admin_json(&st.world, &st.world.routers[i])).into_response()
}

/// `GET /sim/root-admin`: the root admin account's name and API key (never the secret: the
/// caller started the simulator with it, see `Simulator::root_admin_keys`).
pub(crate) async fn admin_root_admin(State(app): State<App>) -> Response {
    let st = app.sim.lock();
    let w = &st.world;
    match w.root_admin_keys() {
        Some((key, _)) => {
            let name = w
                .account_by_api_key(&key)
                .map(|i| w.accounts[i].name.clone());
            Json(json!({"account": name, "apikey": key})).into_response()
        }
        None => admin_error(StatusCode::NOT_FOUND, "no root admin account"),
    }
}
