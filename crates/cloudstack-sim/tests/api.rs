//! `/client/api` behaviour: signing, errors, roles, throttling, paging, filters, shapes.

mod support;

use cloudstack_api::signing::signed_query;
use cloudstack_sim::{self as sim, World};
use serde_json::{json, Value};
use support::*;

const ROLE_SCENARIO: &str = r#"{
  "settings": {"stats_interval_seconds": 10, "boot_seconds": 5},
  "accounts": [
    {"name": "admin", "type": "Admin", "api_key": "admin-key", "secret_key": "admin-secret"},
    {"name": "capi", "type": "User", "api_key": "capi-key", "secret_key": "capi-secret",
     "role": {"name": "capi-health-ro", "type": "User", "rules": [
        {"rule": "listVirtualMachines", "permission": "allow"},
        {"rule": "listCapabilities", "permission": "allow"},
        {"rule": "listApis", "permission": "allow"},
        {"rule": "listNics", "permission": "deny"}
     ]}},
    {"name": "busy", "type": "User", "api_key": "busy-key", "secret_key": "busy-secret",
     "throttle": {"max": 3, "interval_seconds": 3600}},
    {"name": "other", "type": "User", "api_key": "other-key", "secret_key": "other-secret"}
  ],
  "projects": [{"name": "capi-project", "members": ["capi"]}],
  "vms": [
    {"name": "admin-vm", "account": "admin", "state": "Running"},
    {"name": "capi-1", "account": "capi", "state": "Running", "tags": {"cluster": "c1"}},
    {"name": "capi-2", "account": "capi", "state": "Running", "tags": {"cluster": "c2"}},
    {"name": "capi-gone", "account": "capi", "state": "Destroyed"},
    {"name": "proj-1", "account": "capi", "project": "capi-project", "state": "Running"},
    {"name": "other-1", "account": "other", "state": "Running"}
  ]
}"#;

fn role_world() -> World {
    sim::parse_scenario(ROLE_SCENARIO, "inline", sim::real_now_ms(), ("x", "y")).unwrap()
}

fn names(vms: &[Value]) -> Vec<String> {
    vms.iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

fn err_of<'a>(r: &'a Resp, wrapper: &str) -> &'a Value {
    let e = &r.json[wrapper];
    assert!(e.is_object(), "expected wrapper {wrapper}: {}", r.body);
    assert_eq!(
        e["errorcode"].as_u64(),
        Some(u64::from(r.status)),
        "{}",
        r.body
    );
    assert_eq!(e["uuidList"], json!([]), "{}", r.body);
    e
}

#[tokio::test]
async fn signed_get_and_post_succeed_wrong_secret_is_401() {
    let h = start(default_world()).await;
    h.create_vm(json!({"name": "a", "state": "Running"})).await;
    let ok = h.api(&[("command", "listVirtualMachines")]).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.json["listvirtualmachinesresponse"]["count"], 1);
    assert!(ok.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));

    let post = h.api_post(&[("command", "listVirtualMachines")]).await;
    assert_eq!(post.status, 200, "{}", post.body);
    assert_eq!(post.json["listvirtualmachinesresponse"]["count"], 1);

    let bad = h
        .api_as(
            ADMIN_KEY,
            "not-the-secret",
            &[("command", "listVirtualMachines")],
        )
        .await;
    assert_eq!(bad.status, 401);
    let e = err_of(&bad, "listvirtualmachinesresponse");
    assert_eq!(
        e["errortext"],
        "unable to verify user credentials and/or request signature"
    );
    assert!(e.get("cserrorcode").is_none(), "{}", bad.body);

    let unknown_key = h
        .api_as(
            "nobody",
            ADMIN_SECRET,
            &[("command", "listVirtualMachines")],
        )
        .await;
    assert_eq!(unknown_key.status, 401);

    // A tampered value after signing fails too.
    let q = signed_query(
        ADMIN_SECRET,
        [
            ("apiKey", ADMIN_KEY),
            ("command", "listVirtualMachines"),
            ("keyword", "a"),
            ("response", "json"),
        ],
    )
    .replace("keyword=a", "keyword=b");
    assert_eq!(h.raw_get(&q).await.status, 401);
    h.server.shutdown().await;
}

#[tokio::test]
async fn signature_version_3_requires_future_expires() {
    let h = start(default_world()).await;
    for expires in ["2020-01-01T00:00:00+0000", "garbage"] {
        let r = h
            .api(&[
                ("command", "listVirtualMachines"),
                ("signatureversion", "3"),
                ("expires", expires),
            ])
            .await;
        assert_eq!(r.status, 401, "{expires}: {}", r.body);
        err_of(&r, "listvirtualmachinesresponse");
    }
    let missing = h
        .api(&[
            ("command", "listVirtualMachines"),
            ("signatureversion", "3"),
        ])
        .await;
    assert_eq!(missing.status, 401);
    for expires in ["2099-01-01T00:00:00+0000", "2099-01-01T00:00:00Z"] {
        let r = h
            .api(&[
                ("command", "listVirtualMachines"),
                ("signatureversion", "3"),
                ("expires", expires),
            ])
            .await;
        assert_eq!(r.status, 200, "{expires}: {}", r.body);
    }
    // Other versions skip the expiry check entirely.
    let r = h
        .api(&[
            ("command", "listVirtualMachines"),
            ("signatureversion", "2"),
            ("expires", "2020-01-01T00:00:00+0000"),
        ])
        .await;
    assert_eq!(r.status, 200);
    h.server.shutdown().await;
}

#[tokio::test]
async fn unknown_command_is_401_errorresponse_before_signature() {
    let h = start(default_world()).await;
    let r = h.raw_get("command=listFlyingSaucers&response=json").await;
    assert_eq!(r.status, 401);
    let e = err_of(&r, "errorresponse");
    assert!(e.get("cserrorcode").is_none());
    // Case matters for command names.
    let r = h.api(&[("command", "listvirtualmachines")]).await;
    assert_eq!(r.status, 401);
    err_of(&r, "errorresponse");
    h.server.shutdown().await;
}

#[tokio::test]
async fn role_deny_is_401_and_no_rule_is_432() {
    let h = start(role_world()).await;
    let allowed = h
        .api_as(
            "capi-key",
            "capi-secret",
            &[("command", "listVirtualMachines")],
        )
        .await;
    assert_eq!(allowed.status, 200, "{}", allowed.body);

    let denied = h
        .api_as(
            "capi-key",
            "capi-secret",
            &[("command", "listNics"), ("virtualmachineid", "x")],
        )
        .await;
    assert_eq!(denied.status, 401, "{}", denied.body);
    let e = err_of(&denied, "listnicsresponse");
    assert_eq!(
        e["errortext"],
        "The given command 'listNics' either does not exist, is not available for user."
    );
    assert_eq!(e["cserrorcode"], 9999);
    assert_eq!(
        denied.headers["x-description"].to_str().unwrap(),
        e["errortext"].as_str().unwrap()
    );

    let no_rule = h
        .api_as(
            "capi-key",
            "capi-secret",
            &[("command", "listVirtualMachinesMetrics")],
        )
        .await;
    assert_eq!(no_rule.status, 432, "{}", no_rule.body);
    let e = err_of(&no_rule, "errorresponse");
    assert!(e["errortext"]
        .as_str()
        .unwrap()
        .contains("does not exist or is not available for this account"));

    // listApis shows exactly the allowed APIs.
    let apis = h
        .api_as("capi-key", "capi-secret", &[("command", "listApis")])
        .await;
    assert_eq!(apis.status, 200);
    let mut got: Vec<String> = apis.json["listapisresponse"]["api"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_string())
        .collect();
    got.sort();
    assert_eq!(got, ["listApis", "listCapabilities", "listVirtualMachines"]);
    let one = h
        .api_as(
            "capi-key",
            "capi-secret",
            &[("command", "listApis"), ("name", "listNics")],
        )
        .await;
    assert_eq!(one.status, 530, "{}", one.body);
    let one = h
        .api_as(
            "capi-key",
            "capi-secret",
            &[("command", "listApis"), ("name", "listVirtualMachines")],
        )
        .await;
    assert_eq!(one.json["listapisresponse"]["count"], 1);
    h.server.shutdown().await;
}

#[tokio::test]
async fn throttling_gives_429_with_cloudstack_text_and_root_is_exempt() {
    let h = start(role_world()).await;
    for _ in 0..3 {
        let r = h
            .api_as(
                "busy-key",
                "busy-secret",
                &[("command", "listCapabilities")],
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let r = h
        .api_as(
            "busy-key",
            "busy-secret",
            &[("command", "listCapabilities")],
        )
        .await;
    assert_eq!(r.status, 429, "{}", r.body);
    let e = err_of(&r, "listcapabilitiesresponse");
    assert_eq!(e["cserrorcode"], 9999);
    let text = e["errortext"].as_str().unwrap();
    let prefix = "The given user has reached his/her account api limit, please retry after [";
    assert!(text.starts_with(prefix), "{text}");
    let ms: u64 = text[prefix.len()..]
        .strip_suffix("] ms.")
        .expect("suffix")
        .parse()
        .expect("ms");
    assert!(ms > 0 && ms <= 3_600_000);
    assert!(r.headers.get("retry-after").is_none());

    // A global throttle does not apply to the root admin.
    h.sim.set_throttle(Some(sim::Throttle {
        max: 1,
        interval_seconds: 3600,
    }));
    for _ in 0..5 {
        assert_eq!(h.api(&[("command", "listCapabilities")]).await.status, 200);
    }
    let caps = h
        .api_as(
            "other-key",
            "other-secret",
            &[("command", "listCapabilities")],
        )
        .await;
    assert_eq!(
        caps.json["listcapabilitiesresponse"]["capability"]["apilimitmax"],
        1
    );
    let again = h
        .api_as(
            "other-key",
            "other-secret",
            &[("command", "listCapabilities")],
        )
        .await;
    assert_eq!(again.status, 429);
    h.server.shutdown().await;
}

#[tokio::test]
async fn page_rules_give_431() {
    let h = start(default_world()).await;
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("page", "1"), ("pagesize", "501")],
            "Page size can't exceed max allowed page size value: 500",
        ),
        (
            &[("pagesize", "10")],
            "\"page\" parameter is required when \"pagesize\" is specified",
        ),
        (
            &[("page", "1")],
            "\"pagesize\" parameter is required when \"page\" is specified",
        ),
        (
            &[("page", "1"), ("pagesize", "-1")],
            "Can't specify page parameter when pagesize is -1 (Unlimited)",
        ),
    ];
    for (extra, text) in cases {
        let mut p = vec![("command", "listVirtualMachines")];
        p.extend_from_slice(extra);
        let r = h.api(&p).await;
        assert_eq!(r.status, 431, "{extra:?}: {}", r.body);
        let e = err_of(&r, "listvirtualmachinesresponse");
        assert_eq!(e["errortext"], *text);
        assert!(e["cserrorcode"].is_u64());
        assert_eq!(r.headers["x-description"].to_str().unwrap(), *text);
    }
    let unlimited = h
        .api(&[("command", "listVirtualMachines"), ("pagesize", "-1")])
        .await;
    assert_eq!(unlimited.status, 200);
    h.server.shutdown().await;
}

#[tokio::test]
async fn ids_errors_and_empty_shape() {
    let h = start(default_world()).await;
    let id = h.create_vm(json!({"name": "a"})).await;
    let unknown = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
    let ids = format!("{id},{unknown}");
    let r = h
        .api(&[("command", "listVirtualMachines"), ("ids", &ids)])
        .await;
    assert_eq!(r.status, 431, "{}", r.body);
    let e = err_of(&r, "listvirtualmachinesresponse");
    assert_eq!(
        e["errortext"],
        format!("Unable to execute API command listvirtualmachines due to invalid value. Invalid parameter ids value={unknown} due to incorrect long value format, or entity does not exist or due to incorrect parameter annotation for the field in api cmd class.")
    );
    assert_eq!(e["cserrorcode"], 9999);

    let both = h
        .api(&[
            ("command", "listVirtualMachines"),
            ("id", &id),
            ("ids", &id),
        ])
        .await;
    assert_eq!(both.status, 431);
    assert_eq!(
        err_of(&both, "listvirtualmachinesresponse")["errortext"],
        "Specify either id or ids but not both parameters"
    );

    let details = h
        .api(&[
            ("command", "listVirtualMachines"),
            ("details", "nics,bogus"),
        ])
        .await;
    assert_eq!(details.status, 431);
    assert!(err_of(&details, "listvirtualmachinesresponse")["errortext"]
        .as_str()
        .unwrap()
        .starts_with("The details parameter contains a non permitted value."));

    let empty = h
        .api(&[("command", "listVirtualMachines"), ("name", "nothing-here")])
        .await;
    assert_eq!(empty.status, 200);
    assert_eq!(empty.body, r#"{"listvirtualmachinesresponse":{}}"#);
    h.server.shutdown().await;
}

#[tokio::test]
async fn count_is_total_across_pages_in_creation_order() {
    let h = start(default_world()).await;
    let mut created = Vec::new();
    for i in 0..7 {
        created.push(h.create_vm(json!({"name": format!("vm-{i}")})).await);
    }
    let mut seen = Vec::new();
    for page in ["1", "2", "3"] {
        let r = h
            .api(&[
                ("command", "listVirtualMachines"),
                ("page", page),
                ("pagesize", "3"),
            ])
            .await;
        assert_eq!(r.status, 200);
        let inner = &r.json["listvirtualmachinesresponse"];
        assert_eq!(inner["count"], 7);
        for v in inner["virtualmachine"].as_array().unwrap() {
            seen.push(v["id"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(seen, created);
    let beyond = h
        .api(&[
            ("command", "listVirtualMachines"),
            ("page", "4"),
            ("pagesize", "3"),
        ])
        .await;
    assert!(beyond.json["listvirtualmachinesresponse"]
        .get("virtualmachine")
        .is_none());
    h.server.shutdown().await;
}

#[tokio::test]
async fn visibility_filters_and_fields() {
    let h = start(role_world()).await;
    let mine = h
        .api_as(
            "capi-key",
            "capi-secret",
            &[("command", "listVirtualMachines")],
        )
        .await;
    let vms = mine.json["listvirtualmachinesresponse"]["virtualmachine"]
        .as_array()
        .unwrap()
        .clone();
    // Own non-project VMs only; Destroyed hidden from users.
    assert_eq!(names(&vms), ["capi-1", "capi-2"]);
    let vm = &vms[0];
    for f in [
        "id",
        "created",
        "lastupdated",
        "zoneid",
        "zonename",
        "hostcontrolstate",
    ] {
        assert!(vm.get(f).is_some(), "missing {f}: {vm}");
    }
    assert!(
        vm.get("hostid").is_none(),
        "host details are root-admin only"
    );
    let created = vm["created"].as_str().unwrap();
    assert!(
        created.ends_with("+0000") && created.len() == 24,
        "{created}"
    );
    let nic = &vm["nic"][0];
    assert_eq!(nic["traffictype"], "Guest");
    assert_eq!(nic["type"], "Shared");
    assert_eq!(nic["isdefault"], true);
    assert!(nic["ipaddress"].as_str().unwrap().starts_with("10.0."));

    let proj = h
        .api_as(
            "capi-key",
            "capi-secret",
            &[("command", "listVirtualMachines"), ("projectid", "-1")],
        )
        .await;
    let pv = proj.json["listvirtualmachinesresponse"]["virtualmachine"]
        .as_array()
        .unwrap();
    assert_eq!(names(pv), ["proj-1"]);
    assert!(pv[0]["projectid"].is_string());

    // Admin: listall sees everyone, including the Destroyed VM; state=Present hides it.
    let all = h.list_vms(&[]).await;
    assert_eq!(
        names(&all),
        ["admin-vm", "capi-1", "capi-2", "capi-gone", "other-1"]
    );
    assert!(all[0]["hostid"].is_string() && all[0]["instancename"].is_string());
    let present = h.list_vms(&[("state", "Present")]).await;
    assert!(!names(&present).contains(&"capi-gone".to_string()));
    let own = h.api(&[("command", "listVirtualMachines")]).await;
    assert_eq!(own.json["listvirtualmachinesresponse"]["count"], 1);

    // Tags are OR-ed.
    let tagged = h
        .list_vms(&[
            ("tags[0].key", "cluster"),
            ("tags[0].value", "c1"),
            ("tags[1].key", "cluster"),
            ("tags[1].value", "c2"),
        ])
        .await;
    assert_eq!(names(&tagged), ["capi-1", "capi-2"]);
    let kw = h.list_vms(&[("keyword", "OTHER")]).await;
    assert_eq!(names(&kw), ["other-1"]);
    let exact = h.list_vms(&[("name", "capi")]).await;
    assert!(exact.is_empty());

    // details=nics without stats; details=min without nics.
    let nics_only = h.list_vms(&[("details", "nics"), ("name", "capi-1")]).await;
    assert!(nics_only[0].get("nic").is_some());
    let min = h.list_vms(&[("details", "min"), ("name", "capi-1")]).await;
    assert!(min[0].get("nic").is_none());
    h.server.shutdown().await;
}

#[tokio::test]
async fn capabilities_nics_metrics_and_usage_history() {
    let mut world = default_world();
    world.settings.stats_interval_seconds = 10;
    let h = start(world).await;
    let id = h.create_vm(json!({"name": "m", "state": "Running"})).await;
    h.advance(35.0).await;

    let caps = h.api(&[("command", "listCapabilities")]).await;
    let c = &caps.json["listcapabilitiesresponse"]["capability"];
    assert_eq!(c["cloudstackversion"], "4.19.1.0");
    assert_eq!(
        c["instancesstatsretentiontime"], 720,
        "4.18+ default, minutes"
    );
    assert_eq!(c["instancesstatsuseronly"], false);
    assert!(c.get("apilimitmax").is_none(), "no throttling configured");

    let missing = h.api(&[("command", "listNics")]).await;
    assert_eq!(missing.status, 431);
    assert_eq!(
        err_of(&missing, "listnicsresponse")["errortext"],
        "Unable to execute API command listnics due to missing parameter virtualmachineid"
    );
    let nics = h
        .api(&[("command", "listNics"), ("virtualmachineid", &id)])
        .await;
    assert_eq!(nics.json["listnicsresponse"]["count"], 1);
    assert_eq!(
        nics.json["listnicsresponse"]["nic"][0]["virtualmachineid"],
        id
    );

    let m = h
        .api(&[("command", "listVirtualMachinesMetrics"), ("id", &id)])
        .await;
    let vm = &m.json["listvirtualmachinesmetricsresponse"]["virtualmachine"][0];
    assert!(vm["cputotal"].as_str().unwrap().ends_with("Ghz"));
    assert!(vm["networkwrite"].as_str().unwrap().ends_with("MiB"));
    assert!(vm["cpuused"].as_str().unwrap().ends_with('%'));
    assert!(vm["ipaddress"].is_string());

    let hist = h
        .api(&[("command", "listVirtualMachinesUsageHistory"), ("id", &id)])
        .await;
    assert_eq!(hist.status, 200, "{}", hist.body);
    let item = &hist.json["listvirtualmachinesusagehistoryresponse"]["virtualmachine"][0];
    let stats = item["stats"].as_array().unwrap();
    // 35 s at a 10 s interval crosses 3 or 4 boundaries depending on the start phase.
    assert!((3..=4).contains(&stats.len()), "{}", hist.body);
    let w: Vec<u64> = stats
        .iter()
        .map(|s| s["networkkbswrite"].as_u64().unwrap())
        .collect();
    // Per-interval KVM values: the first reading after the start sets the baseline (0), the
    // next hold one interval of boot traffic each (DHCP/cloud-init: a few KiB), not totals.
    assert_eq!(w[0], 0, "{w:?}");
    assert!(w[1..].iter().all(|x| (1..64).contains(x)), "{w:?}");
    assert!(stats[0]["timestamp"].as_str().unwrap().ends_with("+0000"));
    h.server.shutdown().await;
}

#[tokio::test]
async fn holds_20000_vms_and_serves_a_500_page() {
    let h = start(default_world()).await;
    let n = h
        .sim
        .add_vms(20_000, "bulk", &sim::VmSpec::new("t"))
        .unwrap();
    assert_eq!(n, 20_000);
    let t0 = std::time::Instant::now();
    let r = h
        .api(&[
            ("command", "listVirtualMachines"),
            ("page", "40"),
            ("pagesize", "500"),
            ("details", "nics,stats"),
        ])
        .await;
    let took = t0.elapsed();
    assert_eq!(r.status, 200);
    let inner = &r.json["listvirtualmachinesresponse"];
    assert_eq!(inner["count"], 20_000);
    let items = inner["virtualmachine"].as_array().unwrap();
    assert_eq!(items.len(), 500);
    assert_eq!(items[0]["name"], "bulk-19500");
    // Generous bound: debug build on a small machine.
    assert!(took.as_secs() < 5, "page took {took:?}");
    h.server.shutdown().await;
}
