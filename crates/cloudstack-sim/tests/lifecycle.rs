//! VM lifecycle, counters and faults as seen through `/client/api` (clock moved with
//! `POST /sim/clock`, never by sleeping).

mod support;

use serde_json::{json, Value};
use support::*;

fn stats_world() -> cloudstack_sim::World {
    let mut w = default_world();
    w.settings.stats_interval_seconds = 10;
    w.settings.boot_seconds = 5.0;
    w.settings.slow_boot_seconds = 120;
    w.settings.guest_boot_seconds = 10.0;
    w.settings.guest_join_seconds = 30.0;
    w
}

fn tx(v: &Value) -> u64 {
    v["networkkbswrite"].as_u64().expect("networkkbswrite")
}
fn rx(v: &Value) -> u64 {
    v["networkkbsread"].as_u64().expect("networkkbsread")
}

#[tokio::test]
async fn starting_becomes_running_after_boot_delay() {
    let h = start(stats_world()).await;
    let id = h
        .create_vm(json!({"name": "boot", "boot_seconds": 30}))
        .await;
    let vm = h.vm_by_id(&id).await.unwrap();
    assert_eq!(vm["state"], "Starting");
    let created_updated = vm["lastupdated"].clone();
    assert!(
        vm.get("networkkbswrite").is_none(),
        "no sample before running"
    );
    h.advance(29.0).await;
    assert_eq!(h.vm_by_id(&id).await.unwrap()["state"], "Starting");
    h.advance(2.0).await;
    let vm = h.vm_by_id(&id).await.unwrap();
    assert_eq!(vm["state"], "Running");
    assert_ne!(
        vm["lastupdated"], created_updated,
        "lastupdated moves on state change"
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn healthy_counters_rise_and_nic_down_guest_to_host_stays_flat() {
    let h = start(stats_world()).await;
    let ok = h.create_vm(json!({"name": "ok", "state": "Running"})).await;
    let down = h
        .create_vm(json!({"name": "down", "state": "Running", "guest": "nic-down"}))
        .await;
    h.advance(25.0).await;
    let (ok1, down1) = (
        h.vm_by_id(&ok).await.unwrap(),
        h.vm_by_id(&down).await.unwrap(),
    );
    h.advance(100.0).await;
    let (ok2, down2) = (
        h.vm_by_id(&ok).await.unwrap(),
        h.vm_by_id(&down).await.unwrap(),
    );
    // vm.stats.increment.metrics=true: the listing sums the retained per-interval rows.
    assert!(tx(&ok2) > tx(&ok1) && rx(&ok2) > rx(&ok1));
    assert_eq!(tx(&down2), tx(&down1), "guest→host is flat");
    assert!(rx(&down2) >= rx(&down1));
    let hist = h
        .api(&[
            ("command", "listVirtualMachinesUsageHistory"),
            ("id", &down),
        ])
        .await;
    let rows = hist.json["listvirtualmachinesusagehistoryresponse"]["virtualmachine"][0]["stats"]
        .as_array()
        .unwrap()
        .clone();
    assert!(rows.len() >= 12);
    assert!(
        rows.iter().all(|r| tx(r) == 0),
        "a silent guest's rows are 0"
    );

    // Between two boundaries nothing changes.
    let now = h.admin_get("/sim/clock").await.json["now_ms"]
        .as_i64()
        .unwrap();
    let to_boundary = 10_000 - now.rem_euclid(10_000);
    if to_boundary > 1_000 {
        h.advance((to_boundary - 500) as f64 / 1000.0).await;
        assert_eq!(tx(&h.vm_by_id(&ok).await.unwrap()), tx(&ok2));
    }

    // A nic-down fault injected later freezes guest→host from then on.
    h.admin_post(
        &format!("/sim/vms/{ok}/faults"),
        json!({"fault": "nic-down"}),
    )
    .await;
    h.advance(10.0).await;
    let a = tx(&h.vm_by_id(&ok).await.unwrap());
    h.advance(60.0).await;
    assert_eq!(tx(&h.vm_by_id(&ok).await.unwrap()), a);
    h.server.shutdown().await;
}

#[tokio::test]
async fn stats_disabled_means_no_stats_fields() {
    let mut w = default_world();
    w.settings.stats_interval_seconds = 0;
    let h = start(w).await;
    let id = h.create_vm(json!({"name": "a", "state": "Running"})).await;
    h.advance(600.0).await;
    let vm = h.vm_by_id(&id).await.unwrap();
    for f in [
        "cpuused",
        "networkkbsread",
        "networkkbswrite",
        "diskkbsread",
    ] {
        assert!(vm.get(f).is_none(), "{f} present: {vm}");
    }
    h.server.shutdown().await;
}

async fn fault(h: &Harness, id: &str, f: &str) {
    let r = h
        .admin_post(&format!("/sim/vms/{id}/faults"), json!({"fault": f}))
        .await;
    assert_eq!(r.status, 200, "{f}: {}", r.body);
}

#[tokio::test]
async fn every_fault_is_visible_through_the_api() {
    let h = start(stats_world()).await;
    let mut ids = std::collections::BTreeMap::new();
    for f in [
        "no-address",
        "detach-nic",
        "stop",
        "error",
        "vanish",
        "host-offline",
        "stall-starting",
        "services-fail",
        "slow-boot",
    ] {
        let id = h
            .create_vm(json!({"name": format!("vm-{f}"), "state": "Running"}))
            .await;
        ids.insert(f, id);
    }
    h.advance(30.0).await;
    let before_offline = h.vm_by_id(&ids["host-offline"]).await.unwrap();
    for (f, id) in &ids {
        fault(&h, id, f).await;
    }
    h.advance(60.0).await;

    let vm = h.vm_by_id(&ids["no-address"]).await.unwrap();
    assert!(vm["nic"][0].get("ipaddress").is_none(), "{vm}");
    assert!(vm["nic"][0]["macaddress"].is_string());

    let vm = h.vm_by_id(&ids["detach-nic"]).await.unwrap();
    assert_eq!(vm["nic"], json!([]));

    let vm = h.vm_by_id(&ids["stop"]).await.unwrap();
    assert_eq!(vm["state"], "Stopped");
    assert!(vm.get("hostid").is_none());

    assert_eq!(h.vm_by_id(&ids["error"]).await.unwrap()["state"], "Error");

    // Vanished: gone from lists; its id still resolves (empty result, not 431).
    assert!(h.vm_by_id(&ids["vanish"]).await.is_none());
    let r = h
        .api(&[("command", "listVirtualMachines"), ("ids", &ids["vanish"])])
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, r#"{"listvirtualmachinesresponse":{}}"#);

    // Host offline: control state Offline and stats no longer collected. Every VM shares
    // the single host here, so the others' stats froze too.
    let vm = h.vm_by_id(&ids["host-offline"]).await.unwrap();
    assert_eq!(vm["hostcontrolstate"], "Offline");
    assert_eq!(vm["state"], "Running");
    assert!(tx(&vm) >= tx(&before_offline));
    h.advance(60.0).await;
    assert_eq!(
        tx(&h.vm_by_id(&ids["host-offline"]).await.unwrap()),
        tx(&vm)
    );

    assert_eq!(
        h.vm_by_id(&ids["stall-starting"]).await.unwrap()["state"],
        "Starting"
    );

    // services-fail: Running with traffic, but the admin view says it never joined.
    assert_eq!(
        h.vm_by_id(&ids["services-fail"]).await.unwrap()["state"],
        "Running"
    );
    let admin = h
        .admin_get(&format!("/sim/vms/{}", ids["services-fail"]))
        .await;
    assert_eq!(admin.json["joined"], false);
    assert_eq!(admin.json["faults"], json!(["services-fail"]));

    // Clearing brings the host back and stats resume.
    let r = h
        .admin_delete(&format!("/sim/vms/{}/faults", ids["host-offline"]))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["host_control_state"], "Enabled");
    h.advance(30.0).await;
    let vm = h.vm_by_id(&ids["host-offline"]).await.unwrap();
    assert_eq!(vm["hostcontrolstate"], "Enabled");
    assert!(tx(&vm) > tx(&before_offline));
    h.server.shutdown().await;
}

#[tokio::test]
async fn slow_boot_sends_little_then_normal_traffic() {
    let h = start(stats_world()).await;
    let slow = h
        .create_vm(json!({"name": "slow", "state": "Running", "guest": "slow-boot"}))
        .await;
    let fast = h
        .create_vm(json!({"name": "fast", "state": "Running"}))
        .await;
    h.advance(15.0).await;
    let (s1, f1) = (
        h.vm_by_id(&slow).await.unwrap(),
        h.vm_by_id(&fast).await.unwrap(),
    );
    h.advance(60.0).await;
    let (s2, f2) = (
        h.vm_by_id(&slow).await.unwrap(),
        h.vm_by_id(&fast).await.unwrap(),
    );
    let slow_delta = tx(&s2) - tx(&s1);
    let fast_delta = tx(&f2) - tx(&f1);
    assert!(slow_delta > 0, "slow-boot traffic still rises");
    // The trickle is about a tenth of a joining guest's traffic; the sim's clock starts at the
    // wall clock, so where the 10 s samples fall in this 60 s window moves each delta by up to
    // a sample (24 vs 240 KiB was seen): the claim is "an order less", not "less than a tenth".
    assert!(slow_delta * 5 < fast_delta, "{slow_delta} vs {fast_delta}");
    let admin = h.admin_get(&format!("/sim/vms/{slow}")).await;
    assert_eq!(admin.json["joined"], false);
    // After the slow window (120 s) it behaves normally and joins.
    h.advance(120.0).await;
    let s3 = h.vm_by_id(&slow).await.unwrap();
    h.advance(60.0).await;
    let s4 = h.vm_by_id(&slow).await.unwrap();
    assert!(tx(&s4) - tx(&s3) >= 60, "idle-joined: ~1.5 KiB/s");
    assert_eq!(
        h.admin_get(&format!("/sim/vms/{slow}")).await.json["joined"],
        true
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn destroyed_vm_expunges_and_disappears() {
    let mut w = stats_world();
    w.settings.expunge_delay_seconds = 20.0;
    w.settings.expunge_seconds = 5.0;
    let h = start(w).await;
    let id = h
        .create_vm(json!({"name": "d", "state": "Destroyed"}))
        .await;
    assert_eq!(h.vm_by_id(&id).await.unwrap()["state"], "Destroyed");
    h.advance(21.0).await;
    assert_eq!(h.vm_by_id(&id).await.unwrap()["state"], "Expunging");
    h.advance(5.0).await;
    assert!(h.vm_by_id(&id).await.is_none());
    let admin = h.admin_get(&format!("/sim/vms/{id}")).await;
    assert_eq!(admin.json["removed"], true);
    h.server.shutdown().await;
}
