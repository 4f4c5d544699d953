//! `listVirtualMachinesUsageHistory` (`ListVMsUsageHistoryCmd@38dc0458`, answered by
//! `MetricsServiceImpl@44d54b35`): one sample per retained `vm_stats` row.

use serde_json::{json, Map, Value};

use crate::api::{ApiError, Call, Reply};
use crate::world::{format_time, history_date, Ms, Row, StatsView, Vm, World};

use super::vms::{mib, select_vms, stats_fields};

fn date_param(call: &Call<'_>, name: &str) -> Result<Option<Ms>, ApiError> {
    let Some(v) = call.get_nonempty(name) else {
        return Ok(None);
    };
    history_date(v, &call.world.settings.time_zone())
        .map(Some)
        .ok_or_else(|| call.bad(name, v))
}

/// One row as a sample: that row's own per-interval values, each truncated to a whole number
/// (`createStatsResponse` casts every value with `(long)`).
fn sample_json(vm: &Vm, r: &Row) -> Value {
    let v = StatsView {
        rx_kib: u64::from(r.rx) / 1024,
        tx_kib: u64::from(r.tx) / 1024,
        disk_read_kib: u64::from(r.disk_read) / 1024,
        disk_write_kib: u64::from(r.disk_write) / 1024,
        disk_io_read: u64::from(r.disk_read) / 8192,
        disk_io_write: u64::from(r.disk_write) / 8192,
        cpu_centi: r.cpu_centi,
        latest_ms: r.at_ms,
        rows_read: 1,
    };
    let mut m = Map::new();
    m.insert("timestamp".into(), json!(format_time(r.at_ms)));
    stats_fields(&mut m, vm, &v);
    m.insert(
        "diskiopstotal".into(),
        json!(v.disk_io_read + v.disk_io_write),
    );
    m.insert("networkread".into(), json!(mib(v.rx_kib)));
    m.insert("networkwrite".into(), json!(mib(v.tx_kib)));
    Value::Object(m)
}

pub(super) fn list_usage_history(call: &mut Call<'_>) -> Result<Reply, ApiError> {
    let start = date_param(call, "startdate")?;
    let end = date_param(call, "enddate")?;
    // `MetricsServiceImpl.validateDateParams`.
    if let (Some(s), Some(e)) = (start, end) {
        if s > e {
            return Err(ApiError::invalid_value(
                "startDate cannot be after endDate.",
            ));
        }
    }
    let all = select_vms(call, true)?;
    let w: &World = call.world;
    let range = call.paging.slice(&all);
    let mut read = 0u64;
    let items: Vec<Value> = all[range]
        .iter()
        .map(|i| {
            let vm = &w.vms()[*i];
            // `findVmStatsAccordingToDateParams`: timestamp >= startdate, <= enddate (both
            // inclusive). `VmStatsDaoImpl` sets no ORDER BY; MySQL returns the rows in index
            // order, i.e. as inserted — oldest first — which is what we return.
            let stats: Vec<Value> = vm
                .stats_rows()
                .filter(|r| start.is_none_or(|t| r.at_ms >= t))
                .filter(|r| end.is_none_or(|t| r.at_ms <= t))
                .map(|r| sample_json(vm, r))
                .collect();
            read += stats.len() as u64;
            json!({"id": vm.id, "name": vm.name, "displayname": vm.display_name, "stats": stats})
        })
        .collect();
    call.world.stats_rows_read += read;
    let count = items.len();
    Ok(Reply::List { items, count })
}
