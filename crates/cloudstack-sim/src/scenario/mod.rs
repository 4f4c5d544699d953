//! Scenario files: JSON documents that preload a [`World`]. The format is described in
//! `cloudstack-fixtures/scenarios/README.md`. Every error names the file, the JSON path of
//! the offending field and why it is wrong.

use std::collections::HashSet;
use std::path::Path;

use serde_json::{Map, Value};

mod catalogue;
mod stats;

use catalogue::catalogue;

pub use stats::{apply_settings, host_change, SETTINGS_KEYS};

use super::traffic::Profile;
use super::world::{
    is_canonical_uuid, secs_to_ms, AccountType, Fault, GuestKind, HostControl, Ms, NetworkSpec,
    NetworkType, Role, RoleRule, RouterState, Settings, Throttle, VmSpec, VmState, World,
};

/// A scenario that could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {path}: {message}")]
pub struct ScenarioError {
    pub file: String,
    /// JSON path of the offending field, e.g. `$.vms[2].guest`.
    pub path: String,
    pub message: String,
}

/// A path + message before the file name is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

pub(crate) type R<T> = Result<T, FieldError>;

pub(crate) fn err<T>(path: impl Into<String>, message: impl Into<String>) -> R<T> {
    Err(FieldError {
        path: path.into(),
        message: message.into(),
    })
}

pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A JSON object with its path, with typed, path-reporting accessors.
pub struct Obj<'a> {
    m: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    pub fn new(v: &'a Value, path: &str) -> R<Self> {
        match v {
            Value::Object(m) => Ok(Self {
                m,
                path: path.to_string(),
            }),
            other => err(path, format!("expected an object, got {}", kind(other))),
        }
    }

    pub fn at(&self, k: &str) -> String {
        format!("{}.{k}", self.path)
    }

    /// Rejects fields not in `allowed` (catches typos).
    pub fn only(&self, allowed: &[&str]) -> R<()> {
        for k in self.m.keys() {
            if !allowed.contains(&k.as_str()) {
                return err(
                    self.at(k),
                    format!("unknown field (expected one of: {})", allowed.join(", ")),
                );
            }
        }
        Ok(())
    }

    pub(crate) fn get(&self, k: &str) -> Option<&'a Value> {
        self.m.get(k).filter(|v| !v.is_null())
    }

    pub fn str(&self, k: &str) -> R<Option<&'a str>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => err(self.at(k), format!("expected a string, got {}", kind(v))),
        }
    }

    pub fn req_str(&self, k: &str) -> R<&'a str> {
        match self.str(k)? {
            Some(s) if !s.trim().is_empty() => Ok(s),
            Some(_) => err(self.at(k), "must not be empty"),
            None => err(self.at(k), "missing required field"),
        }
    }

    pub fn f64(&self, k: &str) -> R<Option<f64>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(f) if f.is_finite() && f >= 0.0 => Ok(Some(f)),
                _ => err(self.at(k), "expected a non-negative number"),
            },
            Some(v) => err(self.at(k), format!("expected a number, got {}", kind(v))),
        }
    }

    pub fn u64(&self, k: &str) -> R<Option<u64>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(u) => Ok(Some(u)),
                None => err(self.at(k), "expected a non-negative integer"),
            },
            Some(v) => err(self.at(k), format!("expected an integer, got {}", kind(v))),
        }
    }

    pub fn bool(&self, k: &str) -> R<Option<bool>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => err(self.at(k), format!("expected a boolean, got {}", kind(v))),
        }
    }

    pub fn arr(&self, k: &str) -> R<&'a [Value]> {
        match self.get(k) {
            None => Ok(&[]),
            Some(Value::Array(a)) => Ok(a),
            Some(v) => err(self.at(k), format!("expected an array, got {}", kind(v))),
        }
    }

    pub fn has(&self, k: &str) -> bool {
        self.get(k).is_some()
    }

    pub fn value(&self, k: &str) -> Option<&'a Value> {
        self.get(k)
    }

    fn uuid(&self, k: &str) -> R<Option<&'a str>> {
        match self.str(k)? {
            Some(s) if !is_canonical_uuid(s) => err(
                self.at(k),
                format!("{s:?} is not a lowercase canonical UUID"),
            ),
            other => Ok(other),
        }
    }
}

pub(crate) fn throttle(v: &Value, path: &str) -> R<Throttle> {
    let o = Obj::new(v, path)?;
    o.only(&["max", "interval_seconds"])?;
    let max = o.u64("max")?.ok_or_else(|| FieldError {
        path: o.at("max"),
        message: "missing required field".into(),
    })?;
    let interval_seconds = o.u64("interval_seconds")?.unwrap_or(1);
    if interval_seconds == 0 {
        return err(o.at("interval_seconds"), "must be at least 1");
    }
    Ok(Throttle {
        max,
        interval_seconds,
    })
}

fn role(v: &Value, path: &str) -> R<Role> {
    let o = Obj::new(v, path)?;
    o.only(&["name", "type", "rules", "annotation_fallback"])?;
    let kind = match o.str("type")? {
        None => AccountType::User,
        Some(t) => AccountType::parse(t).ok_or_else(|| FieldError {
            path: o.at("type"),
            message: format!(
                "unknown role type {t:?} (expected one of: Admin, ResourceAdmin, DomainAdmin, User)"
            ),
        })?,
    };
    let mut rules = Vec::new();
    for (i, r) in o.arr("rules")?.iter().enumerate() {
        let rp = format!("{}[{i}]", o.at("rules"));
        let ro = Obj::new(r, &rp)?;
        ro.only(&["rule", "permission", "description"])?;
        let rule = ro.req_str("rule")?;
        if !rule
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'*' || b == b'_')
        {
            return err(
                ro.at("rule"),
                format!("invalid rule {rule:?} (letters, digits, _ and * only)"),
            );
        }
        let allow = match ro.req_str("permission")? {
            "allow" => true,
            "deny" => false,
            p => {
                return err(
                    ro.at("permission"),
                    format!("expected \"allow\" or \"deny\", got {p:?}"),
                )
            }
        };
        rules.push(RoleRule {
            rule: rule.to_string(),
            allow,
        });
    }
    Ok(Role {
        name: o.str("name")?.unwrap_or("custom-role").to_string(),
        kind,
        rules,
        annotation_fallback: o.bool("annotation_fallback")?.unwrap_or(false),
    })
}

/// Parses one VM object (scenario `vms[i]` and the admin API's `POST /sim/vms` body).
/// Returns the spec and how many copies to create (`count`, default 1).
pub fn vm_spec(v: &Value, path: &str, allow_count: bool) -> R<(VmSpec, usize)> {
    let o = Obj::new(v, path)?;
    let mut fields = vec![
        "name",
        "id",
        "displayname",
        "guest",
        "state",
        "boot_seconds",
        "account",
        "project",
        "zone",
        "network",
        "host",
        "tags",
        "haenable",
        "service_offering",
        "template",
        "profile",
    ];
    if allow_count {
        fields.push("count");
    }
    o.only(&fields)?;
    let mut spec = VmSpec::new(o.req_str("name")?);
    spec.id = o.uuid("id")?.map(str::to_string);
    spec.display_name = o.str("displayname")?.map(str::to_string);
    if let Some(g) = o.str("guest")? {
        spec.guest = GuestKind::parse(g).ok_or_else(|| FieldError {
            path: o.at("guest"),
            message: format!(
                "unknown guest kind {g:?} (expected one of: {})",
                GuestKind::names()
            ),
        })?;
    }
    if let Some(s) = o.str("state")? {
        spec.state = VmState::parse(s).ok_or_else(|| FieldError {
            path: o.at("state"),
            message: format!(
                "unknown state {s:?} (expected one of: {})",
                VmState::NAMES.join(", ")
            ),
        })?;
    }
    if let Some(p) = o.str("profile")? {
        spec.profile = Some(Profile::parse(p).ok_or_else(|| FieldError {
            path: o.at("profile"),
            message: format!(
                "unknown traffic profile {p:?} (expected one of: {})",
                Profile::names()
            ),
        })?);
    }
    spec.boot_seconds = o.f64("boot_seconds")?;
    spec.account = o.str("account")?.map(str::to_string);
    spec.project = o.str("project")?.map(str::to_string);
    spec.zone = o.str("zone")?.map(str::to_string);
    spec.network = o.str("network")?.map(str::to_string);
    spec.host = o.str("host")?.map(str::to_string);
    spec.offering = o.str("service_offering")?.map(str::to_string);
    spec.template = o.str("template")?.map(str::to_string);
    spec.haenable = o.bool("haenable")?.unwrap_or(false);
    if let Some(t) = o.value("tags") {
        let to = Obj::new(t, &o.at("tags"))?;
        for (k, v) in to.m {
            match v {
                Value::String(s) => spec.tags.push((k.clone(), s.clone())),
                other => {
                    return err(
                        to.at(k),
                        format!("expected a string tag value, got {}", kind(other)),
                    )
                }
            }
        }
    }
    let count = match o.u64("count")? {
        None => 1,
        Some(0) => return err(o.at("count"), "must be at least 1"),
        Some(n) if n > 100_000 => return err(o.at("count"), "at most 100000"),
        Some(n) => n as usize,
    };
    if count > 1 && spec.id.is_some() {
        return err(o.at("id"), "a fixed id cannot be combined with count > 1");
    }
    Ok((spec, count))
}

/// Builds a world from scenario JSON. `origin` names the file in errors; `start_ms` is the
/// simulated start time; the default keys are used for the root admin when the scenario
/// defines no account.
pub fn parse_scenario(
    text: &str,
    origin: &str,
    start_ms: Ms,
    default_keys: (&str, &str),
) -> Result<World, ScenarioError> {
    let wrap = |e: FieldError| ScenarioError {
        file: origin.to_string(),
        path: e.path,
        message: e.message,
    };
    let v: Value = serde_json::from_str(text).map_err(|e| ScenarioError {
        file: origin.to_string(),
        path: "$".into(),
        message: format!("not valid JSON: {e}"),
    })?;
    build(&v, start_ms, default_keys).map_err(wrap)
}

/// Reads and parses a scenario file.
pub fn load_scenario_file(
    path: &Path,
    start_ms: Ms,
    default_keys: (&str, &str),
) -> Result<World, ScenarioError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
        file: origin.clone(),
        path: "$".into(),
        message: format!("cannot read file: {e}"),
    })?;
    parse_scenario(&text, &origin, start_ms, default_keys)
}

/// A network of a scenario file or `POST /sim/networks`: `name`, `cidr` (required), `id`,
/// `zone`, `gateway`, `type` (Shared, Isolated, L2), `virtual_router` (whether the offering
/// has a VirtualRouter service; default: every type but L2), `router_state`, `account`,
/// `project`.
pub fn network_spec(v: &Value, path: &str) -> Result<NetworkSpec, FieldError> {
    let o = Obj::new(v, path)?;
    o.only(&[
        "name",
        "id",
        "zone",
        "cidr",
        "gateway",
        "type",
        "virtual_router",
        "router_state",
        "account",
        "project",
    ])?;
    let kind = match o.str("type")? {
        None => NetworkType::Shared,
        Some(t) => NetworkType::parse(t).ok_or_else(|| FieldError {
            path: o.at("type"),
            message: format!("unknown network type {t:?} (expected Shared, Isolated or L2)"),
        })?,
    };
    let cidr = o.req_str("cidr")?;
    if super::world::parse_cidr(cidr).is_none() {
        return err(
            o.at("cidr"),
            format!("bad cidr {cidr:?} (expected a.b.c.d/len, len 8..30)"),
        );
    }
    let mut spec = NetworkSpec::new(o.req_str("name")?, cidr, kind);
    spec.id = o.uuid("id")?.map(str::to_string);
    spec.zone = o.str("zone")?.map(str::to_string);
    spec.gateway = o.str("gateway")?.map(str::to_string);
    spec.virtual_router = o.bool("virtual_router")?;
    if spec.virtual_router == Some(true) && kind == NetworkType::L2 {
        return err(
            o.at("virtual_router"),
            "an L2 network has no VirtualRouter service, so no router",
        );
    }
    spec.router_state = match o.str("router_state")? {
        None => None,
        Some(s) => Some(RouterState::parse(s).ok_or_else(|| FieldError {
            path: o.at("router_state"),
            message: format!(
                "unknown router state {s:?} (expected one of: {})",
                RouterState::names()
            ),
        })?),
    };
    spec.account = o.str("account")?.map(str::to_string);
    spec.project = o.str("project")?.map(str::to_string);
    Ok(spec)
}

fn build(v: &Value, start_ms: Ms, default_keys: (&str, &str)) -> R<World> {
    let top = Obj::new(v, "$")?;
    top.only(&[
        "description",
        "settings",
        "accounts",
        "zones",
        "networks",
        "hosts",
        "projects",
        "service_offerings",
        "templates",
        "disk_offerings",
        "vms",
        "faults",
        "host_events",
    ])?;
    let mut settings = Settings::default();
    if let Some(s) = top.value("settings") {
        apply_settings(s, "$.settings", &mut settings)?;
    }
    let mut w = World::empty(settings, start_ms);
    let elem_err = |path: String| {
        move |e: super::world::WorldError| FieldError {
            path: path.clone(),
            message: e.to_string(),
        }
    };

    for (i, a) in top.arr("accounts")?.iter().enumerate() {
        let p = format!("$.accounts[{i}]");
        let o = Obj::new(a, &p)?;
        o.only(&[
            "name",
            "id",
            "type",
            "api_key",
            "secret_key",
            "role",
            "throttle",
            "enabled",
        ])?;
        let name = o.req_str("name")?;
        if w.account_index(name).is_some() {
            return err(o.at("name"), format!("duplicate account name {name:?}"));
        }
        let kind = match o.str("type")? {
            None => AccountType::User,
            Some(t) => AccountType::parse(t).ok_or_else(|| FieldError {
                path: o.at("type"),
                message: format!(
                    "unknown account type {t:?} (expected one of: Admin, ResourceAdmin, DomainAdmin, User)"
                ),
            })?,
        };
        let api_key = o.req_str("api_key")?;
        if w.account_by_api_key(api_key).is_some() {
            return err(o.at("api_key"), "duplicate api key");
        }
        let secret = o.req_str("secret_key")?;
        let role = match o.value("role") {
            Some(r) => Some(role(r, &o.at("role"))?),
            None => None,
        };
        let th = match o.value("throttle") {
            Some(t) => Some(throttle(t, &o.at("throttle"))?),
            None => None,
        };
        let id = o.uuid("id")?;
        let idx = w
            .add_account(name, id, kind, api_key, secret, role, th)
            .map_err(elem_err(p.clone()))?;
        w.accounts[idx].enabled = o.bool("enabled")?.unwrap_or(true);
    }
    if let Some(d) = &w.settings.default_account {
        if w.account_index(d).is_none() && !w.accounts.is_empty() {
            return err(
                "$.settings.default_account",
                format!("unknown account {d:?}"),
            );
        }
    }

    for (i, z) in top.arr("zones")?.iter().enumerate() {
        let p = format!("$.zones[{i}]");
        let o = Obj::new(z, &p)?;
        o.only(&["name", "id"])?;
        let id = o.uuid("id")?;
        w.add_zone(o.req_str("name")?, id)
            .map_err(elem_err(p.clone()))?;
    }
    if w.zones.is_empty() {
        let _ = w.add_zone("Sandbox-simulator", None);
    }
    let zone_ref = |w: &World, o: &Obj<'_>| -> R<Option<String>> {
        match o.str("zone")? {
            Some(z) if w.zone_index(z).is_none() => {
                err(o.at("zone"), format!("unknown zone {z:?}"))
            }
            other => Ok(other.map(str::to_string)),
        }
    };

    let mut network_projects: Vec<(usize, String, String)> = Vec::new();
    for (i, n) in top.arr("networks")?.iter().enumerate() {
        let p = format!("$.networks[{i}]");
        let mut spec = network_spec(n, &p)?;
        let o = Obj::new(n, &p)?;
        zone_ref(&w, &o)?;
        if let Some(a) = &spec.account {
            if w.account_index(a).is_none() {
                return err(o.at("account"), format!("unknown account {a:?}"));
            }
        }
        // Projects come later in the file: their networks are handed over below.
        let project = spec.project.take();
        let idx = w.add_network_spec(&spec).map_err(elem_err(p.clone()))?;
        if let Some(pr) = project {
            network_projects.push((idx, pr, o.at("project")));
        }
    }

    for (i, h) in top.arr("hosts")?.iter().enumerate() {
        let p = format!("$.hosts[{i}]");
        let o = Obj::new(h, &p)?;
        o.only(&[
            "name",
            "id",
            "zone",
            "control_state",
            "hypervisor",
            "status",
            "resource_state",
            "stats_call_fails",
        ])?;
        let zone = zone_ref(&w, &o)?;
        let control = match o.str("control_state")? {
            None => HostControl::Enabled,
            Some(c) => HostControl::parse(c).ok_or_else(|| FieldError {
                path: o.at("control_state"),
                message: format!(
                    "unknown control state {c:?} (expected Enabled, Disabled, Offline, Maintenance or Unknown)"
                ),
            })?,
        };
        let change = host_change(
            &o,
            &["hypervisor", "status", "resource_state", "stats_call_fails"],
        )?;
        let id = o.uuid("id")?;
        let idx = w
            .add_host(o.req_str("name")?, id, zone.as_deref(), control)
            .map_err(elem_err(p.clone()))?;
        w.change_host_now(idx, &change)
            .map_err(elem_err(p.clone()))?;
    }

    for (i, pr) in top.arr("projects")?.iter().enumerate() {
        let p = format!("$.projects[{i}]");
        let o = Obj::new(pr, &p)?;
        o.only(&["name", "id", "members"])?;
        let mut members = Vec::new();
        for (j, m) in o.arr("members")?.iter().enumerate() {
            let mp = format!("{}[{j}]", o.at("members"));
            match m {
                Value::String(s) if w.account_index(s).is_some() => members.push(s.clone()),
                Value::String(s) => return err(mp, format!("unknown account {s:?}")),
                other => return err(mp, format!("expected an account name, got {}", kind(other))),
            }
        }
        let id = o.uuid("id")?;
        w.add_project(o.req_str("name")?, id, &members)
            .map_err(elem_err(p.clone()))?;
    }

    for (network, project, path) in network_projects {
        let Some(p) = w.project_index(&project) else {
            return err(path, format!("unknown project {project:?}"));
        };
        w.set_network_owner(network, super::world::Owner::Project(p))
            .map_err(|e| FieldError {
                path,
                message: e.to_string(),
            })?;
    }

    catalogue(&top, &mut w)?;

    // Defaults for what the scenario left out (network, host, root admin, offerings…).
    w.populate_default(default_keys.0, default_keys.1);

    let mut seen_ids = HashSet::new();
    for (i, vm) in top.arr("vms")?.iter().enumerate() {
        let p = format!("$.vms[{i}]");
        let (spec, count) = vm_spec(vm, &p, true)?;
        let o = Obj::new(vm, &p)?;
        if let Some(id) = &spec.id {
            if !seen_ids.insert(id.clone()) {
                return err(o.at("id"), format!("duplicate VM id {id}"));
            }
        }
        if let Some(a) = &spec.account {
            if w.account_index(a).is_none() {
                return err(o.at("account"), format!("unknown account {a:?}"));
            }
        }
        if let Some(pj) = &spec.project {
            if w.project_index(pj).is_none() {
                return err(o.at("project"), format!("unknown project {pj:?}"));
            }
        }
        zone_ref(&w, &o)?;
        if let Some(n) = &spec.network {
            if w.network_index(n).is_none() {
                return err(o.at("network"), format!("unknown network {n:?}"));
            }
        }
        if let Some(h) = &spec.host {
            if w.host_index(h).is_none() {
                return err(o.at("host"), format!("unknown host {h:?}"));
            }
        }
        if let Some(so) = &spec.offering {
            if w.service_offering_index(so).is_none() {
                return err(
                    o.at("service_offering"),
                    format!("unknown service offering {so:?}"),
                );
            }
        }
        if let Some(t) = &spec.template {
            if w.template_index(t).is_none() {
                return err(o.at("template"), format!("unknown template {t:?}"));
            }
        }
        let r = if count == 1 {
            w.add_vm(&spec).map(|_| ())
        } else {
            w.add_vms(count, &spec.name, &spec).map(|_| ())
        };
        r.map_err(|e| match e {
            super::world::WorldError::Conflict(m) if m.contains("named") => FieldError {
                path: o.at("name"),
                message: m,
            },
            other => FieldError {
                path: p.clone(),
                message: other.to_string(),
            },
        })?;
    }

    for (i, f) in top.arr("faults")?.iter().enumerate() {
        let p = format!("$.faults[{i}]");
        let o = Obj::new(f, &p)?;
        o.only(&["at_seconds", "vm", "fault"])?;
        let at = o.f64("at_seconds")?.ok_or_else(|| FieldError {
            path: o.at("at_seconds"),
            message: "missing required field".into(),
        })?;
        let vm = o.req_str("vm")?;
        let idx = w.vm_index(vm).ok_or_else(|| FieldError {
            path: o.at("vm"),
            message: format!("unknown VM {vm:?} (no VM with that name or id)"),
        })?;
        let fname = o.req_str("fault")?;
        let fault = Fault::parse(fname).ok_or_else(|| FieldError {
            path: o.at("fault"),
            message: format!(
                "unknown fault {fname:?} (expected one of: {})",
                Fault::names()
            ),
        })?;
        w.schedule_fault(start_ms + secs_to_ms(at), idx, fault)
            .map_err(elem_err(p.clone()))?;
    }
    stats::host_events(&top, &mut w, start_ms)?;
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<World, ScenarioError> {
        parse_scenario(s, "test.json", 0, ("k", "s"))
    }

    #[test]
    fn empty_scenario_gets_defaults() {
        let w = parse("{}").unwrap();
        assert_eq!(w.zones.len(), 1);
        assert_eq!(w.networks.len(), 1);
        assert_eq!(w.hosts.len(), 1);
        assert_eq!(w.accounts[0].api_key, "k");
    }

    #[test]
    fn errors_name_file_path_and_reason() {
        let e = parse(r#"{"vms":[{"name":"a"},{"name":"b","guest":"zombie"}]}"#).unwrap_err();
        assert_eq!(e.file, "test.json");
        assert_eq!(e.path, "$.vms[1].guest");
        assert!(e.message.contains("unknown guest kind"), "{e}");
        assert!(e.to_string().starts_with("test.json: $.vms[1].guest: "));

        let e = parse(
            r#"{"vms":[{"name":"a"}],"faults":[{"at_seconds":1,"vm":"nope","fault":"stop"}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.path, "$.faults[0].vm");

        let id = "0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11";
        let e = parse(&format!(
            r#"{{"vms":[{{"name":"a","id":"{id}"}},{{"name":"b","id":"{id}"}}]}}"#
        ))
        .unwrap_err();
        assert_eq!(e.path, "$.vms[1].id");
        assert!(e.message.contains("duplicate"));

        let e = parse(r#"{"settings":{"stats_interval_seconds":"2"}}"#).unwrap_err();
        assert_eq!(e.path, "$.settings.stats_interval_seconds");
        assert!(e.message.contains("expected an integer"));

        let e = parse(r#"{"vms":[{"name":"a","colour":"red"}]}"#).unwrap_err();
        assert_eq!(e.path, "$.vms[0].colour");

        let e = parse("{").unwrap_err();
        assert_eq!(e.path, "$");
    }

    #[test]
    fn faults_are_scheduled_in_time_order() {
        let w = parse(
            r#"{"vms":[{"name":"a"},{"name":"b"}],
                "faults":[{"at_seconds":40,"vm":"a","fault":"nic-down"},
                          {"at_seconds":10,"vm":"b","fault":"stop"}]}"#,
        )
        .unwrap();
        let f = w.pending_faults();
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].at_ms, 10_000);
        assert_eq!(f[0].fault, Fault::Stop);
    }
}
