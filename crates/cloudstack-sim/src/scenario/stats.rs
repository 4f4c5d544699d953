//! Settings, host states and scheduled host changes: shared by scenario files and the admin
//! API (`POST /sim/settings`, `POST /sim/hosts/{id}`).

use serde_json::Value;

use super::{err, kind, throttle, FieldError, Obj, R};
use crate::world::parse_time_zone;
use crate::world::{
    secs_to_ms, HostChange, HostStatus, Hypervisor, Ms, ResourceState, Settings, World,
};

/// Keys of `settings` (scenario) and of `POST /sim/settings`.
pub const SETTINGS_KEYS: &[&str] = &[
    "stats_interval_seconds",
    "stats_retention_minutes",
    "stats_retention_seconds",
    "stats_increment_metrics",
    "management_servers",
    "ms_offsets_seconds",
    "server_time_zone",
    "guest_boot_seconds",
    "guest_join_seconds",
    "guest_speedup",
    "default_page_size",
    "boot_seconds",
    "expunge_delay_seconds",
    "expunge_seconds",
    "slow_boot_seconds",
    "cloudstack_version",
    "allow_user_view_destroyed_vm",
    "allow_user_expunge_recover_vm",
    "throttle",
    "default_account",
];

/// Applies the fields present in `v` to `s` (fields left out keep their value).
pub fn apply_settings(v: &Value, path: &str, s: &mut Settings) -> R<()> {
    let o = Obj::new(v, path)?;
    o.only(SETTINGS_KEYS)?;
    let mut n = s.clone();
    if let Some(x) = o.u64("stats_interval_seconds")? {
        n.stats_interval_seconds = x;
    }
    if let Some(x) = o.u64("stats_retention_seconds")? {
        n.stats_retention_seconds = x;
    }
    if let Some(x) = o.u64("stats_retention_minutes")? {
        n.stats_retention_seconds = x.saturating_mul(60);
    }
    if let Some(x) = o.bool("stats_increment_metrics")? {
        n.stats_increment_metrics = x;
    }
    if let Some(x) = o.u64("management_servers")? {
        if !(1..=64).contains(&x) {
            return err(o.at("management_servers"), "must be between 1 and 64");
        }
        n.management_servers = x as u32;
    }
    if o.has("ms_offsets_seconds") {
        let mut offs = Vec::new();
        for (i, x) in o.arr("ms_offsets_seconds")?.iter().enumerate() {
            match x.as_f64() {
                Some(f) if f.is_finite() && f >= 0.0 => offs.push(f),
                _ => {
                    return err(
                        format!("{}[{i}]", o.at("ms_offsets_seconds")),
                        format!("expected a non-negative number, got {}", kind(x)),
                    )
                }
            }
        }
        n.ms_offsets_seconds = offs;
    }
    if let Some(z) = o.str("server_time_zone")? {
        if parse_time_zone(z).is_none() {
            return err(
                o.at("server_time_zone"),
                format!("unknown time zone {z:?} (an IANA name or +HH:MM)"),
            );
        }
        n.server_time_zone = z.to_string();
    }
    if let Some(x) = o.f64("guest_boot_seconds")? {
        n.guest_boot_seconds = x;
    }
    if let Some(x) = o.f64("guest_join_seconds")? {
        n.guest_join_seconds = x;
    }
    if let Some(x) = o.f64("guest_speedup")? {
        if !(0.001..=1_000.0).contains(&x) {
            return err(o.at("guest_speedup"), "must be between 0.001 and 1000");
        }
        n.guest_speedup = x;
    }
    if let Some(x) = o.u64("default_page_size")? {
        if x == 0 {
            return err(o.at("default_page_size"), "must be at least 1");
        }
        n.default_page_size = x;
    }
    if let Some(x) = o.f64("boot_seconds")? {
        n.boot_seconds = x;
    }
    if let Some(x) = o.f64("expunge_delay_seconds")? {
        n.expunge_delay_seconds = x;
    }
    if let Some(x) = o.f64("expunge_seconds")? {
        n.expunge_seconds = x;
    }
    if let Some(x) = o.u64("slow_boot_seconds")? {
        n.slow_boot_seconds = x;
    }
    if let Some(x) = o.str("cloudstack_version")? {
        n.cloudstack_version = x.to_string();
    }
    if let Some(x) = o.bool("allow_user_view_destroyed_vm")? {
        n.allow_user_view_destroyed_vm = x;
    }
    if let Some(x) = o.bool("allow_user_expunge_recover_vm")? {
        n.allow_user_expunge_recover_vm = x;
    }
    if let Some(t) = o.value("throttle") {
        n.throttle = Some(throttle(t, &o.at("throttle"))?);
    }
    if let Some(a) = o.str("default_account")? {
        n.default_account = Some(a.to_string());
    }
    *s = n;
    Ok(())
}

fn parse_enum<T>(o: &Obj<'_>, k: &str, parse: fn(&str) -> Option<T>, names: &str) -> R<Option<T>> {
    match o.str(k)? {
        None => Ok(None),
        Some(v) => parse(v).map(Some).ok_or_else(|| FieldError {
            path: o.at(k),
            message: format!("unknown value {v:?} (expected one of: {names})"),
        }),
    }
}

fn names<T: Copy>(all: &[T], f: fn(T) -> &'static str) -> String {
    all.iter().map(|x| f(*x)).collect::<Vec<_>>().join(", ")
}

/// The host fields `keys` of `o` (`hypervisor`, `status`, `resource_state`,
/// `stats_call_fails`) as a change.
pub fn host_change(o: &Obj<'_>, keys: &[&str]) -> R<HostChange> {
    let want = |k: &str| keys.contains(&k);
    let mut ch = HostChange::default();
    if want("hypervisor") {
        ch.hypervisor = parse_enum(
            o,
            "hypervisor",
            Hypervisor::parse,
            &names(&Hypervisor::ALL, Hypervisor::as_str),
        )?;
    }
    if want("status") {
        ch.status = parse_enum(
            o,
            "status",
            HostStatus::parse,
            &names(&HostStatus::ALL, HostStatus::as_str),
        )?;
    }
    if want("resource_state") {
        ch.resource_state = parse_enum(
            o,
            "resource_state",
            ResourceState::parse,
            &names(&ResourceState::ALL, ResourceState::as_str),
        )?;
    }
    if want("stats_call_fails") {
        ch.stats_call_fails = o.bool("stats_call_fails")?;
    }
    Ok(ch)
}

/// `host_events`: `[{"at_seconds": S, "host": name-or-id, "status"?, "resource_state"?,
/// "hypervisor"?, "stats_call_fails"?}]`, applied at start + S.
pub(super) fn host_events(top: &Obj<'_>, w: &mut World, start_ms: Ms) -> R<()> {
    const KEYS: &[&str] = &["status", "resource_state", "hypervisor", "stats_call_fails"];
    for (i, e) in top.arr("host_events")?.iter().enumerate() {
        let p = format!("$.host_events[{i}]");
        let o = Obj::new(e, &p)?;
        o.only(&[
            "at_seconds",
            "host",
            "status",
            "resource_state",
            "hypervisor",
            "stats_call_fails",
        ])?;
        let at = o.f64("at_seconds")?.ok_or_else(|| FieldError {
            path: o.at("at_seconds"),
            message: "missing required field".into(),
        })?;
        let h = o.req_str("host")?;
        let idx = w.host_index(h).ok_or_else(|| FieldError {
            path: o.at("host"),
            message: format!("unknown host {h:?}"),
        })?;
        let change = host_change(&o, KEYS)?;
        if change == HostChange::default() {
            return err(
                p,
                "a host event needs status, resource_state, hypervisor or stats_call_fails",
            );
        }
        w.schedule_host_change(start_ms + secs_to_ms(at), idx, change)
            .map_err(|e| FieldError {
                path: p.clone(),
                message: e.to_string(),
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::parse_scenario;
    use crate::traffic::Profile;
    use crate::world::{HostControl, HostStatus, Hypervisor, ResourceState};

    #[test]
    fn scenarios_set_hosts_stats_settings_schedules_and_profiles() {
        let w = parse_scenario(
            r#"{"settings": {"management_servers": 3, "ms_offsets_seconds": [0, 7.5, 41],
                             "stats_interval_seconds": 300, "stats_retention_minutes": 60,
                             "stats_increment_metrics": false, "server_time_zone": "+01:00",
                             "guest_boot_seconds": 9, "guest_join_seconds": 18},
                "hosts": [{"name": "kvm"},
                          {"name": "esx", "hypervisor": "VMware", "status": "Connecting"},
                          {"name": "xen", "hypervisor": "XenServer",
                           "resource_state": "Maintenance", "stats_call_fails": true},
                          {"name": "old", "control_state": "Offline"}],
                "vms": [{"name": "a", "host": "esx", "profile": "one-nic-down"},
                        {"name": "b", "guest": "waiting"}],
                "host_events": [{"at_seconds": 60, "host": "kvm", "status": "Alert"},
                                {"at_seconds": 90, "host": "kvm", "status": "Up",
                                 "resource_state": "PrepareForMaintenance"}]}"#,
            "t.json",
            0,
            ("k", "s"),
        )
        .unwrap();
        let s = &w.settings;
        assert_eq!(
            (
                s.management_servers,
                s.stats_interval_seconds,
                s.stats_retention_seconds
            ),
            (3, 300, 3600)
        );
        assert!(!s.stats_increment_metrics);
        assert_eq!(s.ms_offset_ms(1), 7_500);
        assert_eq!(w.hosts[1].hypervisor, Hypervisor::VMware);
        assert_eq!(w.hosts[1].status(), HostStatus::Connecting);
        assert_eq!(w.hosts[1].control_state(), HostControl::Enabled);
        assert!(!w.hosts[2].collectable());
        assert_eq!(w.hosts[2].resource_state(), ResourceState::Maintenance);
        assert_eq!(w.hosts[3].control_state(), HostControl::Offline);
        assert_eq!(
            w.vm(0).unwrap().profile_override(),
            Some(Profile::OneNicDown)
        );
        assert_eq!(w.pending_host_changes().len(), 2);
        let mut w = w;
        w.advance_to(61_000);
        assert_eq!(w.hosts[0].control_state(), HostControl::Offline);
        w.advance_to(91_000);
        assert_eq!(w.hosts[0].control_state(), HostControl::Maintenance);
    }

    #[test]
    fn bad_stats_keys_name_their_path() {
        let p = |s: &str| parse_scenario(s, "t.json", 0, ("k", "s")).unwrap_err();
        assert_eq!(
            p(r#"{"hosts": [{"name": "h", "hypervisor": "Hyper-V"}]}"#).path,
            "$.hosts[0].hypervisor"
        );
        assert_eq!(
            p(r#"{"settings": {"management_servers": 0}}"#).path,
            "$.settings.management_servers"
        );
        assert_eq!(
            p(r#"{"host_events": [{"at_seconds": 1, "host": "nope", "status": "Up"}]}"#).path,
            "$.host_events[0].host"
        );
        assert_eq!(
            p(r#"{"vms": [{"name": "a", "profile": "zombie"}]}"#).path,
            "$.vms[0].profile"
        );
        assert_eq!(
            p(r#"{"settings": {"ms_offsets_seconds": [-1]}}"#).path,
            "$.settings.ms_offsets_seconds[0]"
        );
    }
}
