//! Per-caller accounting (`GET /sim/calls` `by_account`): what each API key's account cost the
//! simulator — calls by command, `vm_stats` rows read, async jobs queued — by account name,
//! never by key (issue 27: the e2e's per-key load of CAPC, the shim and its probe).

mod support;

use cloudstack_sim::{AccountType, World};
use serde_json::{json, Value};
use support::*;

/// 2024-01-02T10:00:20Z.
const START: i64 = 1_704_189_620_000;
const RO_KEY: &str = "shim-ro-key";
const RO_SECRET: &str = "shim-ro-secret";

fn world() -> World {
    let mut w = World::default_world(ADMIN_KEY, ADMIN_SECRET, START);
    w.add_account(
        "shim-ro",
        None,
        AccountType::User,
        RO_KEY,
        RO_SECRET,
        None,
        None,
    )
    .expect("second account");
    w
}

fn account<'a>(calls: &'a Value, name: &str) -> &'a Value {
    &calls["by_account"][name]
}

#[tokio::test]
async fn by_account_counts_calls_commands_stats_rows_and_async_jobs_per_key() {
    let h = start(world()).await;
    h.create_vm(
        json!({"name": "w-0", "state": "Running", "profile": "idle-joined",
                       "account": "shim-ro"}),
    )
    .await;
    h.advance(600.0).await;

    // The admin (CAPC's key in the e2e): an async command that queues a job, the same again
    // refused (431: no job), and a plain listing.
    let g = h
        .api(&[
            ("command", "createAffinityGroup"),
            ("name", "cp"),
            ("type", "host anti-affinity"),
        ])
        .await;
    assert_eq!(g.status, 200, "{}", g.body);
    let again = h
        .api(&[
            ("command", "createAffinityGroup"),
            ("name", "cp"),
            ("type", "host anti-affinity"),
        ])
        .await;
    assert_eq!(again.status, 431, "{}", again.body);
    h.api(&[("command", "listZones")]).await;

    // The second account: a stats-reading listing of its own VM, and a plain one.
    let stats = h
        .api_as(
            RO_KEY,
            RO_SECRET,
            &[
                ("command", "listVirtualMachines"),
                ("details", "stats"),
                ("accumulate", "true"),
            ],
        )
        .await;
    assert_eq!(stats.status, 200, "{}", stats.body);
    let listed = &stats.json["listvirtualmachinesresponse"]["virtualmachine"];
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{}", stats.body);
    h.api_as(RO_KEY, RO_SECRET, &[("command", "listVirtualMachines")])
        .await;
    // The parameter name is matched case-insensitively (as the API does): an unsigned request
    // with `APIKEY=` still counts for its account, refused or not.
    let unsigned = h
        .raw_get(&format!("command=listZones&response=json&APIKEY={RO_KEY}"))
        .await;
    assert_eq!(unsigned.status, 401);
    // Injected answers count too: an outage's 503 for the same key.
    h.admin_post("/sim/api", json!({"outage": true})).await;
    let down = h
        .api_as(RO_KEY, RO_SECRET, &[("command", "listVirtualMachines")])
        .await;
    assert_eq!(down.status, 503);
    h.admin_post("/sim/api", json!({"outage": false})).await;

    // A key no account has, twice; and no key at all.
    h.api_as("nobody", "x", &[("command", "listVirtualMachines")])
        .await;
    h.api_as("nobody-else", "y", &[("command", "listZones")])
        .await;
    let nokey = h.raw_get("command=listZones&response=json").await;
    assert_eq!(nokey.status, 401);

    let calls = h.admin_get("/sim/calls").await.json;
    let admin = account(&calls, "admin");
    assert_eq!(admin["calls"], 3, "{calls:#}");
    assert_eq!(
        admin["by_command"],
        json!({"createAffinityGroup": 2, "listZones": 1})
    );
    assert_eq!(
        admin["async_jobs"], 1,
        "the refused second create queued nothing"
    );
    assert_eq!(admin["stats_rows"], 0);

    let ro = account(&calls, "shim-ro");
    assert_eq!(ro["calls"], 4, "{calls:#}");
    assert_eq!(
        ro["by_command"],
        json!({"listVirtualMachines": 3, "listZones": 1})
    );
    assert_eq!(ro["async_jobs"], 0);
    let rows = ro["stats_rows"].as_u64().unwrap();
    assert!(rows > 0, "the stats listing read rows: {calls:#}");
    assert_eq!(
        rows, calls["stats_rows_read"]["total"],
        "every row read was read for this account"
    );

    let unknown = account(&calls, "(unknown key)");
    assert_eq!(unknown["calls"], 2, "{calls:#}");
    assert_eq!(
        unknown["by_command"],
        json!({"listVirtualMachines": 1, "listZones": 1})
    );
    assert_eq!(account(&calls, "(no key)")["calls"], 1);
    let buckets: Vec<&String> = calls["by_account"].as_object().unwrap().keys().collect();
    assert_eq!(
        buckets,
        ["(no key)", "(unknown key)", "admin", "shim-ro"],
        "one bucket per account, the unknown keys share one"
    );
    // Every request is in exactly one bucket.
    let summed: u64 = calls["by_account"]
        .as_object()
        .unwrap()
        .values()
        .map(|a| a["calls"].as_u64().unwrap())
        .sum();
    assert_eq!(summed, calls["total"].as_u64().unwrap());
    // Names only: no key (or secret) anywhere in the answer.
    let text = calls.to_string();
    for secret in [ADMIN_KEY, ADMIN_SECRET, RO_KEY, RO_SECRET, "nobody"] {
        assert!(!text.contains(secret), "{secret:?} in {text}");
    }

    // `/sim/reset` clears it with the rest.
    h.admin_post("/sim/reset", json!({})).await;
    let after = h.admin_get("/sim/calls").await.json;
    assert_eq!(after["by_account"], json!({}));
    assert_eq!(h.sim.calls_by_account().len(), 0);
    h.server.shutdown().await;
}
