//! Catalogue entries of a scenario: `service_offerings`, `templates`, `disk_offerings`.

use serde_json::Value;

use super::{err, kind, FieldError, Obj, R};
use crate::world::World;

/// `zones` of a catalogue entry: zone names or ids, each checked.
fn zone_list(w: &World, o: &Obj<'_>) -> R<Vec<String>> {
    let mut out = Vec::new();
    for (j, z) in o.arr("zones")?.iter().enumerate() {
        let zp = format!("{}[{j}]", o.at("zones"));
        match z {
            Value::String(s) if w.zone_index(s).is_some() => out.push(s.clone()),
            Value::String(s) => return err(zp, format!("unknown zone {s:?}")),
            other => {
                return err(
                    zp,
                    format!("expected a zone name or id, got {}", kind(other)),
                )
            }
        }
    }
    Ok(out)
}

fn positive_u32(o: &Obj<'_>, k: &str, default: u32) -> R<u32> {
    match o.u64(k)? {
        None => Ok(default),
        Some(0) => err(o.at(k), "must be at least 1"),
        Some(n) => u32::try_from(n).or_else(|_| err(o.at(k), "too large")),
    }
}

/// `service_offerings`, `templates` and `disk_offerings`.
pub(super) fn catalogue(top: &Obj<'_>, w: &mut World) -> R<()> {
    let elem_err = |path: String| {
        move |e: crate::world::WorldError| FieldError {
            path: path.clone(),
            message: e.to_string(),
        }
    };
    for (i, so) in top.arr("service_offerings")?.iter().enumerate() {
        let p = format!("$.service_offerings[{i}]");
        let o = Obj::new(so, &p)?;
        o.only(&[
            "name",
            "id",
            "cpu_number",
            "cpu_speed_mhz",
            "memory_mb",
            "zones",
        ])?;
        let zones = zone_list(w, &o)?;
        let cpu = positive_u32(&o, "cpu_number", 1)?;
        let speed = positive_u32(&o, "cpu_speed_mhz", 1000)?;
        let memory = positive_u32(&o, "memory_mb", 1024)?;
        let id = o.uuid("id")?;
        w.add_service_offering(o.req_str("name")?, id, cpu, speed, memory, &zones)
            .map_err(elem_err(p.clone()))?;
    }
    for (i, t) in top.arr("templates")?.iter().enumerate() {
        let p = format!("$.templates[{i}]");
        let o = Obj::new(t, &p)?;
        o.only(&["name", "id", "zones"])?;
        let zones = zone_list(w, &o)?;
        let id = o.uuid("id")?;
        w.add_template(o.req_str("name")?, id, &zones)
            .map_err(elem_err(p.clone()))?;
    }
    for (i, d) in top.arr("disk_offerings")?.iter().enumerate() {
        let p = format!("$.disk_offerings[{i}]");
        let o = Obj::new(d, &p)?;
        o.only(&["name", "id", "disk_size_gb", "customized", "zones"])?;
        let zones = zone_list(w, &o)?;
        let customized = o.bool("customized")?.unwrap_or(false);
        let size = o.u64("disk_size_gb")?;
        if !customized && size.is_none_or(|s| s == 0) {
            return err(
                o.at("disk_size_gb"),
                "a disk offering needs disk_size_gb >= 1 or \"customized\": true",
            );
        }
        let id = o.uuid("id")?;
        w.add_disk_offering(
            o.req_str("name")?,
            id,
            size.unwrap_or(0),
            customized,
            &zones,
        )
        .map_err(elem_err(p.clone()))?;
    }
    Ok(())
}
