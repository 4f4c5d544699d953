//! Admin API (`/sim/…`) and API-level fault injection.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

#[tokio::test]
async fn create_fault_clear_and_calls() {
    let h = start(default_world()).await;
    let r = h
        .admin_post(
            "/sim/vms",
            json!({"name": "x", "state": "Running", "guest": "healthy",
                   "id": "0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.json["id"], "0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11");
    assert_eq!(r.json["state"], "Running");
    assert_eq!(r.json["joined"], true);

    let dup = h.admin_post("/sim/vms", json!({"name": "x"})).await;
    assert_eq!(dup.status, 409);
    let bad = h
        .admin_post("/sim/vms", json!({"name": "y", "guest": "zombie"}))
        .await;
    assert_eq!(bad.status, 400);
    assert!(bad.json["error"].as_str().unwrap().contains("guest"));

    let unknown_vm = h
        .admin_post("/sim/vms/nope/faults", json!({"fault": "stop"}))
        .await;
    assert_eq!(unknown_vm.status, 404);
    let unknown_fault = h
        .admin_post("/sim/vms/x/faults", json!({"fault": "meteor"}))
        .await;
    assert_eq!(unknown_fault.status, 400);
    let msg = unknown_fault.json["error"].as_str().unwrap();
    assert!(msg.contains("meteor") && msg.contains("nic-down"), "{msg}");

    let f = h
        .admin_post("/sim/vms/x/faults", json!({"fault": "no-address"}))
        .await;
    assert_eq!(f.status, 200);
    assert_eq!(f.json["faults"], json!(["no-address"]));
    assert!(f.json["ipaddress"].is_null());
    let c = h.admin_delete("/sim/vms/x/faults").await;
    assert_eq!(c.json["faults"], json!([]));
    assert!(c.json["ipaddress"].is_string());

    let all = h.admin_get("/sim/vms").await;
    assert_eq!(all.json["vms"].as_array().unwrap().len(), 1);

    h.api(&[("command", "listVirtualMachines")]).await;
    h.api(&[("command", "listVirtualMachines")]).await;
    h.api_as(ADMIN_KEY, "wrong", &[("command", "listVirtualMachines")])
        .await;
    let calls = h.admin_get("/sim/calls").await;
    assert_eq!(calls.json["total"], 3);
    assert_eq!(
        calls.json["by_command"]["listVirtualMachines"],
        json!({"200": 2, "401": 1})
    );
    let r = h.admin_post("/sim/reset", json!({})).await;
    assert_eq!(r.status, 200);
    assert_eq!(h.admin_get("/sim/calls").await.json["total"], 0);
    // A world reset drops VMs created later.
    h.admin_post("/sim/reset", json!({"world": true})).await;
    assert_eq!(h.admin_get("/sim/vms").await.json["vms"], json!([]));
    h.server.shutdown().await;
}

#[tokio::test]
async fn clock_endpoint_moves_time() {
    let h = start(default_world()).await;
    let a = h.admin_get("/sim/clock").await.json["now_ms"]
        .as_i64()
        .unwrap();
    h.advance(90.0).await;
    let b = h.admin_get("/sim/clock").await.json["now_ms"]
        .as_i64()
        .unwrap();
    assert_eq!(b - a, 90_000, "frozen clock moves only by advances");
    let bad = h
        .admin_post("/sim/clock", json!({"advance_seconds": -5}))
        .await;
    assert_eq!(bad.status, 400);
    h.server.shutdown().await;
}

#[tokio::test]
async fn outage_html_malformed_and_530_injections() {
    let h = start(default_world()).await;
    h.create_vm(json!({"name": "a", "state": "Running"})).await;

    let r = h.admin_post("/sim/api", json!({"outage": true})).await;
    assert_eq!(r.json["outage"], true);
    let o = h.api(&[("command", "listVirtualMachines")]).await;
    assert_eq!(o.status, 503);
    assert!(o.body.contains("<html>"));
    h.admin_post("/sim/api", json!({"outage": false})).await;

    h.admin_post("/sim/api", json!({"html_next": 1})).await;
    let p = h.api(&[("command", "listVirtualMachines")]).await;
    assert_eq!(p.status, 502);
    assert!(p.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(p.body.contains("502 Bad Gateway"));
    assert_eq!(
        h.api(&[("command", "listVirtualMachines")]).await.status,
        200
    );

    h.admin_post("/sim/api", json!({"malformed_next": 1})).await;
    let m = h.api(&[("command", "listVirtualMachines")]).await;
    assert_eq!(m.status, 200);
    assert!(serde_json::from_str::<serde_json::Value>(&m.body).is_err());
    assert!(m.body.starts_with("{\"listvirtualmachinesresponse\""));

    h.admin_post("/sim/api", json!({"server_error_rate": 1.0}))
        .await;
    let e = h.api(&[("command", "listVirtualMachines")]).await;
    assert_eq!(e.status, 530);
    assert_eq!(e.json["listvirtualmachinesresponse"]["errorcode"], 530);
    assert!(e.headers.get("x-description").is_some());
    // Authentication still comes first.
    let unauth = h
        .api_as(ADMIN_KEY, "wrong", &[("command", "listVirtualMachines")])
        .await;
    assert_eq!(unauth.status, 401);
    h.admin_post("/sim/api", json!({"server_error_rate": 0}))
        .await;

    let bad = h
        .admin_post("/sim/api", json!({"server_error_rate": 3}))
        .await;
    assert_eq!(bad.status, 400);
    let bad = h.admin_post("/sim/api", json!({"nonsense": 1})).await;
    assert_eq!(bad.status, 400);

    let calls = h.admin_get("/sim/calls").await.json;
    let by = &calls["by_command"]["listVirtualMachines"];
    assert_eq!(by["503"], 1);
    assert_eq!(by["502"], 1);
    assert_eq!(by["200-malformed"], 1);
    assert_eq!(by["530"], 1);
    h.server.shutdown().await;
}

#[tokio::test]
async fn timeout_next_hangs_beyond_the_client_timeout() {
    let h = start(default_world()).await;
    h.admin_post("/sim/api", json!({"timeout_next": 1})).await;
    let short = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let q = cloudstack_api::signing::signed_query(
        ADMIN_SECRET,
        [
            ("apiKey", ADMIN_KEY),
            ("command", "listVirtualMachines"),
            ("response", "json"),
        ],
    );
    let url = format!("{}?{}", h.server.api_url(), q);
    let err = short.get(&url).send().await.expect_err("must time out");
    assert!(err.is_timeout(), "{err}");
    // The next request is served normally.
    assert_eq!(
        h.api(&[("command", "listVirtualMachines")]).await.status,
        200
    );
    // Shutdown releases the hanging request (bounded by a deadline).
    tokio::time::timeout(Duration::from_secs(10), h.server.shutdown())
        .await
        .expect("shutdown finished");
}
