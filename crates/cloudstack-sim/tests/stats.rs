//! Statistics as CloudStack serves them, through `/client/api` and `/sim/…`: per-interval
//! rows, `vm.stats.increment.metrics` and `accumulate`, usage history, date parsing in the
//! server's zone, hypervisors, host states, guest profiles, the rows-read metric.

mod support;

use cloudstack_sim::World;
use serde_json::{json, Value};
use support::*;

/// 2024-01-02T10:00:20Z.
const START: i64 = 1_704_189_620_000;

fn world() -> World {
    World::default_world(ADMIN_KEY, ADMIN_SECRET, START)
}

fn tx(v: &Value) -> u64 {
    v["networkkbswrite"].as_u64().expect("networkkbswrite")
}

async fn history(h: &Harness, id: &str, extra: &[(&str, &str)]) -> Vec<Value> {
    let mut p = vec![("command", "listVirtualMachinesUsageHistory"), ("id", id)];
    p.extend_from_slice(extra);
    let r = h.api(&p).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json["listvirtualmachinesusagehistoryresponse"]["virtualmachine"][0]["stats"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn stats_of(h: &Harness, id: &str, extra: &[(&str, &str)]) -> Value {
    let mut p = vec![("id", id), ("details", "stats")];
    p.extend_from_slice(extra);
    h.list_vms(&p).await.into_iter().next().unwrap()
}

#[tokio::test]
async fn increment_metrics_accumulate_override_and_version_gating() {
    let h = start(world()).await;
    let id = h
        .create_vm(json!({"name": "a", "state": "Running", "profile": "idle-joined"}))
        .await;
    h.advance(600.0).await;
    // Default vm.stats.increment.metrics=true: the sum of the retained rows.
    let summed = tx(&stats_of(&h, &id, &[]).await);
    let latest = tx(&stats_of(&h, &id, &[("accumulate", "false")]).await);
    assert_eq!(latest, 90, "one 60-s row of 1.5 KiB/s");
    assert!((8 * 90..=10 * 90).contains(&summed), "{summed}");
    // The global setting changes at run time, through the admin API…
    let r = h
        .admin_post("/sim/settings", json!({"stats_increment_metrics": false}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(tx(&stats_of(&h, &id, &[]).await), latest);
    assert_eq!(
        tx(&stats_of(&h, &id, &[("accumulate", "true")]).await),
        summed
    );
    // …and through updateConfiguration (root admin).
    let r = h
        .api(&[
            ("command", "updateConfiguration"),
            ("name", "vm.stats.increment.metrics"),
            ("value", "true"),
        ])
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json["updateconfigurationresponse"]["configuration"]["value"],
        "true"
    );
    assert_eq!(tx(&stats_of(&h, &id, &[]).await), summed);
    // Before 4.17.0 `accumulate` does not exist: ignored like any unknown parameter.
    h.admin_post("/sim/settings", json!({"cloudstack_version": "4.16.1.0"}))
        .await;
    assert_eq!(
        tx(&stats_of(&h, &id, &[("accumulate", "false")]).await),
        summed
    );
    // The metrics listing carries the same numbers as display strings.
    let m = h
        .api(&[
            ("command", "listVirtualMachinesMetrics"),
            ("id", &id),
            ("details", "stats"),
        ])
        .await;
    let vm = &m.json["listvirtualmachinesmetricsresponse"]["virtualmachine"][0];
    assert_eq!(
        vm["networkwrite"],
        format!("{:.2} MiB", summed as f64 / 1024.0)
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn usage_history_has_one_sample_per_row_of_each_server() {
    let mut w = world();
    w.settings.management_servers = 2;
    w.settings.ms_offsets_seconds = vec![0.0, 25.0];
    let h = start(w).await;
    let id = h
        .create_vm(json!({"name": "a", "state": "Running", "profile": "idle-joined"}))
        .await;
    h.advance(300.0).await;
    let s = history(&h, &id, &[]).await;
    assert_eq!(s.len(), 10, "5 minutes × 2 servers");
    let times: Vec<&str> = s.iter().map(|x| x["timestamp"].as_str().unwrap()).collect();
    assert_eq!(times[0], "2024-01-02T10:00:25+0000");
    assert_eq!(times[1], "2024-01-02T10:01:00+0000");
    assert_eq!(times[2], "2024-01-02T10:01:25+0000");
    let mut sorted = times.clone();
    sorted.sort();
    assert_eq!(times, sorted, "oldest first");
    // KVM: the servers share the agent's baseline, so their rows partition the traffic:
    // 35 s and 25 s of 1.5 KiB/s, truncated to whole KiB (52.5 → 52, 37.5 → 37).
    assert_eq!(tx(&s[0]), 0, "the first reading after the start");
    let w: Vec<u64> = s[1..].iter().map(tx).collect();
    let alternating = w
        .iter()
        .enumerate()
        .all(|(i, x)| *x == if i % 2 == 0 { 52 } else { 37 });
    assert!(alternating, "{w:?}");
    // The listing's (accumulated) value is the sum of the rows, truncated once.
    let listed = tx(&stats_of(&h, &id, &[]).await);
    assert_eq!(listed, 1536 * (35 * 5 + 25 * 4) / 1024);
    let calls = h.admin_get("/sim/calls").await.json;
    assert!(calls["stats_rows_read"]["by_command"]["listVirtualMachinesUsageHistory"] == 10);
    assert_eq!(
        calls["stats_rows_read"]["last_request"], 10,
        "the listing read 10 rows"
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn startdate_is_read_date_only_in_the_server_time_zone() {
    let mut w = world();
    // New York is 5 h behind UTC in January; a fixed offset needs no tz database.
    w.settings.server_time_zone = "-05:00".into();
    w.settings.stats_retention_seconds = 24 * 3600;
    let h = start(w).await;
    let id = h
        .create_vm(json!({"name": "a", "state": "Running", "profile": "idle-joined"}))
        .await;
    // From 10:00:20Z to 10:00:20Z the next day: rows every minute.
    h.advance(86_400.0).await;
    let all = history(&h, &id, &[]).await;
    assert_eq!(all.len(), 1440);
    // "2024-01-03 09:00:00" (a UTC time without zone) is read as 2024-01-03 00:00 at -05:00
    // = 05:00Z: the time is dropped, so ~5 h 20 min of samples come back, not ~1 h 20 min.
    let since = history(&h, &id, &[("startdate", "2024-01-03 09:00:00")]).await;
    assert_eq!(since[0]["timestamp"], "2024-01-03T05:00:00+0000");
    assert_eq!(since.len(), 5 * 60 + 1);
    // enddate alike (inclusive); a start after the end is refused.
    let until = history(&h, &id, &[("enddate", "2024-01-03")]).await;
    assert_eq!(
        until.last().unwrap()["timestamp"],
        "2024-01-03T05:00:00+0000"
    );
    let bad = h
        .api(&[
            ("command", "listVirtualMachinesUsageHistory"),
            ("id", &id),
            ("startdate", "2024-01-04"),
            ("enddate", "2024-01-03"),
        ])
        .await;
    assert_eq!(bad.status, 431);
    let garbage = h
        .api(&[
            ("command", "listVirtualMachinesUsageHistory"),
            ("id", &id),
            ("startdate", "yesterday"),
        ])
        .await;
    assert_eq!(garbage.status, 431);
    h.server.shutdown().await;
}

#[tokio::test]
async fn hypervisors_hosts_and_guest_profiles_through_the_admin_api() {
    let h = start(world()).await;
    let host = h.admin_get("/sim/hosts").await.json["hosts"][0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let r = h
        .admin_post(
            &format!("/sim/hosts/{host}"),
            json!({"hypervisor": "VMware"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let id = h.create_vm(json!({"name": "a", "state": "Running"})).await;
    let vm = h.vm_by_id(&id).await.unwrap();
    assert_eq!(vm["hypervisor"], "VMware");
    // A Connecting host still shows Enabled but is not collected.
    let r = h
        .admin_post(
            &format!("/sim/hosts/{host}"),
            json!({"status": "Connecting"}),
        )
        .await;
    assert_eq!(r.json["hostcontrolstate"], "Enabled");
    assert_eq!(r.json["collected"], false);
    h.advance(300.0).await;
    assert!(stats_of(&h, &id, &[])
        .await
        .get("networkkbswrite")
        .is_none());
    let r = h
        .admin_post(
            &format!("/sim/hosts/{host}"),
            json!({"status": "Up", "resource_state": "PrepareForMaintenance"}),
        )
        .await;
    assert_eq!(r.json["hostcontrolstate"], "Maintenance");
    let bad = h
        .admin_post(&format!("/sim/hosts/{host}"), json!({"status": "Sleepy"}))
        .await;
    assert_eq!(bad.status, 400);
    h.admin_post(
        &format!("/sim/hosts/{host}"),
        json!({"resource_state": "Enabled", "hypervisor": "KVM"}),
    )
    .await;
    // Guest profile from now on.
    let r = h
        .admin_post(
            &format!("/sim/vms/{id}/guest"),
            json!({"profile": "waiting-for-endpoint"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json["profile"], "waiting-for-endpoint");
    assert_eq!(r.json["joined"], false);
    h.advance(600.0).await;
    let s = history(&h, &id, &[]).await;
    assert!(s.len() >= 10);
    assert!(s[1..].iter().all(|x| (1..=2).contains(&tx(x))), "{s:?}");
    let admin = h.admin_get(&format!("/sim/vms/{id}")).await.json;
    assert_eq!(admin["stats"]["rows"], s.len());
    assert!(admin["stats"]["true_tx_bytes"].as_u64().unwrap() > 0);
    let bad = h
        .admin_post(
            &format!("/sim/vms/{id}/guest"),
            json!({"profile": "zombie"}),
        )
        .await;
    assert_eq!(bad.status, 400);
    h.server.shutdown().await;
}

#[tokio::test]
async fn settings_round_trip_and_reject_bad_values() {
    let h = start(world()).await;
    let r = h
        .admin_post(
            "/sim/settings",
            json!({"management_servers": 3, "stats_interval_seconds": 300,
                   "stats_retention_minutes": 60, "server_time_zone": "+02:00"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json["management_servers"], 3);
    assert_eq!(r.json["ms_offsets_seconds"], json!([0.0, 111.0, 222.0]));
    let caps = h.api(&[("command", "listCapabilities")]).await;
    assert_eq!(
        caps.json["listcapabilitiesresponse"]["capability"]["instancesstatsretentiontime"],
        60
    );
    for bad in [
        json!({"management_servers": 0}),
        json!({"server_time_zone": "Mars/Olympus"}),
        json!({"colour": 1}),
    ] {
        assert_eq!(h.admin_post("/sim/settings", bad).await.status, 400);
    }
    h.server.shutdown().await;
}
