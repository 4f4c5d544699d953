//! The commands a cluster provider (CAPC) needs: identity lookups, catalogue lookups,
//! deployVirtualMachine / destroyVirtualMachine with their async jobs, affinity groups,
//! public addresses and volumes — including CloudStack's error codes and texts.

mod support;

use base64::Engine as _;
use cloudstack_sim::{self as sim, World};
use serde_json::{json, Value};
use support::*;

const UNKNOWN: &str = "0b9e4c1a-7d2f-4e3b-9a8c-1f2e3d4c5b6a";

const SCENARIO: &str = r#"{
  "settings": {"stats_interval_seconds": 10, "boot_seconds": 5,
               "expunge_delay_seconds": 20, "expunge_seconds": 4},
  "accounts": [
    {"name": "admin", "type": "Admin", "api_key": "admin-key", "secret_key": "admin-secret"},
    {"name": "capi", "type": "User", "api_key": "capi-key", "secret_key": "capi-secret"},
    {"name": "ro", "type": "User", "api_key": "ro-key", "secret_key": "ro-secret",
     "role": {"name": "ro", "type": "User", "rules": [
        {"rule": "listUsers", "permission": "allow"},
        {"rule": "listZones", "permission": "deny"}]}}
  ],
  "zones": [{"name": "zone1"}, {"name": "zone2"}],
  "networks": [
    {"name": "shared-net", "zone": "zone1", "cidr": "10.10.0.0/24"},
    {"name": "shared-net-2", "zone": "zone1", "cidr": "10.20.0.0/24"},
    {"name": "far-net", "zone": "zone2", "cidr": "10.30.0.0/24"}
  ],
  "hosts": [{"name": "host-1", "zone": "zone1"}, {"name": "host-2", "zone": "zone1"},
            {"name": "host-9", "zone": "zone2"}],
  "service_offerings": [{"name": "small", "cpu_number": 2, "memory_mb": 2048},
                        {"name": "far-only", "cpu_number": 1, "memory_mb": 512, "zones": ["zone2"]}],
  "templates": [{"name": "ubuntu", "zones": ["zone1"]}],
  "disk_offerings": [{"name": "fixed", "disk_size_gb": 10}, {"name": "custom", "customized": true}]
}"#;

fn world() -> World {
    sim::parse_scenario(SCENARIO, "inline", sim::real_now_ms(), ("x", "y")).unwrap()
}

/// The inner object of a reply.
fn inner<'a>(r: &'a Resp, wrapper: &str) -> &'a Value {
    assert!(r.json[wrapper].is_object(), "no {wrapper}: {}", r.body);
    &r.json[wrapper]
}

fn items<'a>(r: &'a Resp, wrapper: &str, key: &str) -> Vec<&'a Value> {
    assert_eq!(r.status, 200, "{}", r.body);
    inner(r, wrapper)[key]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// A JSON string field as an owned string (ids the next call passes on).
fn str_of(v: &Value) -> String {
    v.as_str().unwrap().to_string()
}

/// The `id` of the first `key` item that `command` lists with `filters`.
async fn first_id(h: &Harness, command: &str, filters: &[(&str, &str)], key: &str) -> String {
    let mut p = vec![("command", command)];
    p.extend_from_slice(filters);
    let r = h.api(&p).await;
    str_of(&items(&r, &format!("{}response", command.to_lowercase()), key)[0]["id"])
}

/// A call as the plain user `capi`.
async fn as_capi(h: &Harness, params: &[(&str, &str)]) -> Resp {
    h.api_as("capi-key", "capi-secret", params).await
}

fn error_text(r: &Resp, wrapper: &str, code: u16) -> String {
    assert_eq!(r.status, code, "{}", r.body);
    let e = inner(r, wrapper);
    assert_eq!(e["errorcode"], code, "{}", r.body);
    e["errortext"].as_str().unwrap_or_default().to_string()
}

/// Ids the deploy calls need: (zone1, small offering, ubuntu template, shared-net).
async fn ids(h: &Harness) -> (String, String, String, String) {
    let zone = first_id(h, "listZones", &[("name", "zone1")], "zone").await;
    let so = first_id(
        h,
        "listServiceOfferings",
        &[("name", "small"), ("zoneid", &zone)],
        "serviceoffering",
    )
    .await;
    let t = first_id(
        h,
        "listTemplates",
        &[
            ("templatefilter", "executable"),
            ("name", "ubuntu"),
            ("zoneid", &zone),
        ],
        "template",
    )
    .await;
    let n = h
        .api(&[
            ("command", "listNetworks"),
            ("keyword", "shared-net"),
            ("zoneid", &zone),
        ])
        .await;
    let nets = items(&n, "listnetworksresponse", "network");
    assert_eq!(nets.len(), 2, "keyword is a substring match");
    let n = str_of(&nets.iter().find(|n| n["name"] == "shared-net").unwrap()["id"]);
    (zone, so, t, n)
}

/// The parameters every deploy call carries.
fn deploy_base<'a>(zone: &'a str, so: &'a str, t: &'a str) -> [(&'static str, &'a str); 3] {
    [
        ("zoneid", zone),
        ("serviceofferingid", so),
        ("templateid", t),
    ]
}

async fn deploy(h: &Harness, base: &[(&str, &str)], extra: &[(&str, &str)]) -> Resp {
    let mut p = vec![("command", "deployVirtualMachine")];
    p.extend_from_slice(base);
    p.extend_from_slice(extra);
    h.api_post(&p).await
}

async fn job(h: &Harness, jobid: &str) -> Value {
    let r = h
        .api(&[("command", "queryAsyncJobResult"), ("jobid", jobid)])
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json["queryasyncjobresultresponse"].clone()
}

#[tokio::test]
async fn identity_lookups_as_capc_makes_them() {
    let h = start(world()).await;
    // Without listall only the caller's user; with it every user.
    let mine = h.api(&[("command", "listUsers")]).await;
    let mine = items(&mine, "listusersresponse", "user");
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0]["account"], "admin");
    assert_eq!(mine[0]["domain"], "ROOT");
    let domain = str_of(&mine[0]["domainid"]);
    let user = str_of(&mine[0]["id"]);
    let all = h
        .api(&[("command", "listUsers"), ("listall", "true")])
        .await;
    assert_eq!(inner(&all, "listusersresponse")["count"], 3);

    // Pagination rules apply to the new list commands too.
    let p2 = h
        .api(&[
            ("command", "listUsers"),
            ("listall", "true"),
            ("page", "2"),
            ("pagesize", "2"),
        ])
        .await;
    let p2u = items(&p2, "listusersresponse", "user");
    assert_eq!(p2u.len(), 1);
    assert_eq!(inner(&p2, "listusersresponse")["count"], 3);
    assert_eq!(p2u[0]["account"], "ro");
    let no_page = h.api(&[("command", "listUsers"), ("pagesize", "2")]).await;
    assert!(
        error_text(&no_page, "listusersresponse", 431).contains("\"page\" parameter is required")
    );

    // listDomains: by id (exactly one), by name + level, unknown id is 431.
    let d = h
        .api(&[
            ("command", "listDomains"),
            ("listall", "true"),
            ("id", &domain),
        ])
        .await;
    let ds = items(&d, "listdomainsresponse", "domain");
    assert_eq!((ds.len(), &ds[0]["path"]), (1, &json!("ROOT")));
    assert_eq!(ds[0]["vmavailable"], "Unlimited");
    let d = h
        .api(&[
            ("command", "listDomains"),
            ("listall", "true"),
            ("name", "ROOT"),
            ("level", "0"),
        ])
        .await;
    assert_eq!(inner(&d, "listdomainsresponse")["count"], 1);
    let d = h.api(&[("command", "listDomains"), ("level", "1")]).await;
    assert_eq!(d.json["listdomainsresponse"], json!({}));
    let bad = h.api(&[("command", "listDomains"), ("id", UNKNOWN)]).await;
    assert!(error_text(&bad, "listdomainsresponse", 431)
        .contains(&format!("Invalid parameter id value={UNKNOWN} due to incorrect long value format, or entity does not exist")));

    // listAccounts by domain and name; listProjects with an unknown name is empty.
    let a = h
        .api(&[
            ("command", "listAccounts"),
            ("domainid", &domain),
            ("name", "capi"),
        ])
        .await;
    let acc = items(&a, "listaccountsresponse", "account");
    assert_eq!(
        (acc.len(), &acc[0]["cpuavailable"]),
        (1, &json!("Unlimited"))
    );
    let p = h
        .api(&[
            ("command", "listProjects"),
            ("listall", "true"),
            ("name", "nope"),
        ])
        .await;
    assert_eq!(p.json["listprojectsresponse"], json!({}));

    // getUserKeys: the double-wrapped keys; wrong ids and other users' keys are refused.
    let k = h.api(&[("command", "getUserKeys"), ("id", &user)]).await;
    assert_eq!(k.status, 200, "{}", k.body);
    assert_eq!(
        k.json["getuserkeysresponse"]["userkeys"],
        json!({"apikey": "admin-key", "secretkey": "admin-secret"})
    );
    let k = h.api(&[("command", "getUserKeys"), ("id", UNKNOWN)]).await;
    assert!(error_text(&k, "getuserkeysresponse", 431).contains("Invalid parameter id value="));
    let k = as_capi(&h, &[("command", "getUserKeys"), ("id", &user)]).await;
    error_text(&k, "getuserkeysresponse", 531);
    let k = h.api(&[("command", "getUserKeys")]).await;
    assert!(error_text(&k, "getuserkeysresponse", 431).contains("missing parameter id"));

    // A plain user sees only its own account; listDomains is not annotated for users.
    let a = as_capi(&h, &[("command", "listAccounts")]).await;
    assert_eq!(inner(&a, "listaccountsresponse")["count"], 1);
    let d = as_capi(&h, &[("command", "listDomains")]).await;
    assert_eq!(d.status, 432, "{}", d.body);

    // Roles apply: an allow rule passes, a deny rule is 401, no rule is 432.
    let ok = h
        .api_as("ro-key", "ro-secret", &[("command", "listUsers")])
        .await;
    assert_eq!(ok.status, 200);
    let denied = h
        .api_as("ro-key", "ro-secret", &[("command", "listZones")])
        .await;
    assert!(error_text(&denied, "listzonesresponse", 401).contains("is not available for user"));
    let none = h
        .api_as(
            "ro-key",
            "ro-secret",
            &[("command", "deployVirtualMachine")],
        )
        .await;
    assert_eq!(none.status, 432, "{}", none.body);
    h.server.shutdown().await;
}

#[tokio::test]
async fn catalogue_lookups_filter_like_cloudstack() {
    let h = start(world()).await;
    let (zone, so, t, net) = ids(&h).await;
    let z = h.api(&[("command", "listZones"), ("id", UNKNOWN)]).await;
    assert!(error_text(&z, "listzonesresponse", 431).contains("Invalid parameter id value="));
    // Offerings restricted to another zone are not listed for zone1.
    let all = h
        .api(&[("command", "listServiceOfferings"), ("zoneid", &zone)])
        .await;
    let names: Vec<_> = items(&all, "listserviceofferingsresponse", "serviceoffering")
        .iter()
        .map(|o| o["name"].clone())
        .collect();
    assert_eq!(names, [json!("small")]);
    let one = h
        .api(&[("command", "listServiceOfferings"), ("id", &so)])
        .await;
    let o = items(&one, "listserviceofferingsresponse", "serviceoffering");
    assert_eq!(
        (&o[0]["cpunumber"], &o[0]["memory"]),
        (&json!(2), &json!(2048))
    );
    // templatefilter is required and checked.
    let nf = h.api(&[("command", "listTemplates"), ("id", &t)]).await;
    assert!(
        error_text(&nf, "listtemplatesresponse", 431).contains("missing parameter templatefilter")
    );
    let bf = h
        .api(&[("command", "listTemplates"), ("templatefilter", "nope")])
        .await;
    error_text(&bf, "listtemplatesresponse", 431);
    let by_id = h
        .api(&[
            ("command", "listTemplates"),
            ("templatefilter", "executable"),
            ("id", &t),
        ])
        .await;
    assert_eq!(inner(&by_id, "listtemplatesresponse")["count"], 1);
    // Disk offerings: fixed and custom.
    let d = h
        .api(&[("command", "listDiskOfferings"), ("name", "custom")])
        .await;
    assert_eq!(
        items(&d, "listdiskofferingsresponse", "diskoffering")[0]["iscustomized"],
        true
    );
    // Networks by id carry type and cidr.
    let n = h.api(&[("command", "listNetworks"), ("id", &net)]).await;
    let n = items(&n, "listnetworksresponse", "network");
    assert_eq!(
        (&n[0]["type"], &n[0]["cidr"]),
        (&json!("Shared"), &json!("10.10.0.0/24"))
    );
    // Capabilities: admins may expunge, users not (allow.user.expunge.recover.vm is false).
    let c = h.api(&[("command", "listCapabilities")]).await;
    assert_eq!(
        c.json["listcapabilitiesresponse"]["capability"]["allowuserexpungerecovervm"],
        true
    );
    let c = as_capi(&h, &[("command", "listCapabilities")]).await;
    assert_eq!(
        c.json["listcapabilitiesresponse"]["capability"]["allowuserexpungerecovervm"],
        false
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn deploy_boots_a_vm_and_its_job_finishes_when_it_runs() {
    let h = start(world()).await;
    let (zone, so, t, net) = ids(&h).await;
    let base = deploy_base(&zone, &so, &t);
    let userdata = base64::engine::general_purpose::STANDARD.encode([0x1f, 0x8b, 8, 0, 1, 2, 3]);
    let r = deploy(
        &h,
        &base,
        &[
            ("networkids", &net),
            ("name", "md-0"),
            ("displayname", "machine md-0"),
            ("userdata", &userdata),
            ("keypair", "ops"),
            ("details[0].cpuOvercommitRatio", "2"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = inner(&r, "deployvirtualmachineresponse");
    let id = str_of(&answer["id"]);
    let jobid = str_of(&answer["jobid"]);

    let j = job(&h, &jobid).await;
    assert_eq!(
        (&j["jobstatus"], &j["jobresultcode"]),
        (&json!(0), &json!(0))
    );
    assert!(j.get("jobresult").is_none());
    assert_eq!(j["jobinstanceid"], id.as_str());
    let vm = h.vm_by_id(&id).await.unwrap();
    assert_eq!(vm["state"], "Starting");
    assert_eq!(vm["serviceofferingname"], "small");
    assert_eq!(vm["templatename"], "ubuntu");
    assert_eq!(vm["keypairs"], "ops");
    assert_eq!(vm["details"]["cpuOvercommitRatio"], "2");
    assert_eq!(vm["nic"][0]["ipaddress"], "10.10.0.10");

    h.advance(6.0).await;
    let j = job(&h, &jobid).await;
    assert_eq!(
        (&j["jobstatus"], &j["jobresulttype"]),
        (&json!(1), &json!("object"))
    );
    assert_eq!(j["jobresult"]["virtualmachine"]["id"], id.as_str());
    assert_eq!(j["jobresult"]["virtualmachine"]["state"], "Running");
    assert!(j["completed"].is_string());

    // The admin view shows the deployed VM like the others.
    let a = h.admin_get(&format!("/sim/vms/{id}")).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json["state"], "Running");
    assert_eq!(a.json["deployed"], true);
    assert_eq!(a.json["guest"], "healthy");
    assert_eq!(a.json["joined"], true);
    assert_eq!(a.json["userdata_bytes"], 7);
    assert_eq!(a.json["userdata_gzip"], true);
    assert_eq!(a.json["ipaddress"], "10.10.0.10");
    // Faults work on it, by id.
    let f = h
        .admin_post(
            &format!("/sim/vms/{id}/faults"),
            json!({"fault": "nic-down"}),
        )
        .await;
    assert_eq!(f.status, 200, "{}", f.body);
    assert_eq!(
        h.admin_get(&format!("/sim/vms/{id}")).await.json["joined"],
        false
    );

    // The name filter of both list commands (CAPC reads metrics by name).
    for cmd in ["listVirtualMachines", "listVirtualMachinesMetrics"] {
        let l = h.api(&[("command", cmd), ("name", "md-0")]).await;
        assert_eq!(
            l.json[format!("{}response", cmd.to_lowercase())]["count"],
            1,
            "{}",
            l.body
        );
    }
    let l = h
        .api(&[
            ("command", "listVirtualMachines"),
            ("templateid", &t),
            ("networkid", &net),
            ("zoneid", &zone),
            ("name", "md-0"),
        ])
        .await;
    assert_eq!(
        l.json["listvirtualmachinesresponse"]["count"], 1,
        "{}",
        l.body
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn deploy_refuses_what_cloudstack_refuses() {
    let h = start(world()).await;
    let (zone, so, t, net) = ids(&h).await;
    let base = deploy_base(&zone, &so, &t);
    let w = "deployvirtualmachineresponse";
    let ok = deploy(&h, &base, &[("name", "dup")]).await;
    assert_eq!(ok.status, 200, "{}", ok.body);

    let dup = deploy(&h, &base, &[("name", "dup")]).await;
    assert!(error_text(&dup, w, 431).contains("The vm with hostName dup already exists"));
    let r = deploy(
        &h,
        &[
            ("zoneid", &zone),
            ("serviceofferingid", &so),
            ("templateid", UNKNOWN),
        ],
        &[],
    )
    .await;
    let text = error_text(&r, w, 431);
    assert!(text.starts_with(&format!("Unable to execute API command deployvirtualmachine due to invalid value. Invalid parameter templateid value={UNKNOWN}")), "{text}");
    let r = deploy(&h, &[("serviceofferingid", &so), ("templateid", &t)], &[]).await;
    assert!(error_text(&r, w, 431).contains("missing parameter zoneid"));
    let r = deploy(&h, &base, &[("networkids", UNKNOWN)]).await;
    assert!(error_text(&r, w, 431).contains("Invalid parameter networkids"));
    let r = deploy(&h, &base, &[("name", "9lives")]).await;
    assert!(error_text(&r, w, 431).contains("Invalid name"));
    let r = deploy(&h, &base, &[("name", "ud"), ("userdata", "***")]).await;
    assert!(error_text(&r, w, 431).contains("not base64"));
    // A far zone's network, an offering of another zone.
    let far = first_id(&h, "listNetworks", &[("name", "far-net")], "network").await;
    let r = deploy(&h, &base, &[("networkids", &far)]).await;
    assert!(error_text(&r, w, 431).contains("doesn't belong to zone"));
    let fo = first_id(
        &h,
        "listServiceOfferings",
        &[("name", "far-only")],
        "serviceoffering",
    )
    .await;
    let r = deploy(
        &h,
        &[
            ("zoneid", &zone),
            ("serviceofferingid", &fo),
            ("templateid", &t),
        ],
        &[],
    )
    .await;
    assert!(error_text(&r, w, 431).contains("not available in zone"));
    // A customized disk offering needs a size.
    let d = first_id(
        &h,
        "listDiskOfferings",
        &[("name", "custom")],
        "diskoffering",
    )
    .await;
    let r = deploy(&h, &base, &[("name", "disk"), ("diskofferingid", &d)]).await;
    assert!(error_text(&r, w, 431).contains("requires a custom size"));
    // A requested address that is taken: the first VM holds 10.10.0.10.
    let r = deploy(
        &h,
        &base,
        &[
            ("name", "ip"),
            ("iptonetworklist[0].networkid", &net),
            ("iptonetworklist[0].ip", "10.10.0.10"),
        ],
    )
    .await;
    assert!(error_text(&r, w, 533).contains("10.10.0.10"));
    let r = deploy(
        &h,
        &base,
        &[
            ("name", "ip"),
            ("iptonetworklist[0].networkid", &net),
            ("iptonetworklist[0].ip", "10.10.0.77"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let id = str_of(&inner(&r, w)["id"]);
    assert_eq!(
        h.vm_by_id(&id).await.unwrap()["nic"][0]["ipaddress"],
        "10.10.0.77"
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn strict_anti_affinity_without_a_free_host_fails_the_job() {
    let h = start(world()).await;
    let (zone, so, t, _) = ids(&h).await;
    let base = deploy_base(&zone, &so, &t);
    let g = h
        .api(&[
            ("command", "createAffinityGroup"),
            ("name", "cp"),
            ("type", "host anti-affinity"),
        ])
        .await;
    assert_eq!(g.status, 200, "{}", g.body);
    let gid = str_of(&inner(&g, "createaffinitygroupresponse")["id"]);
    let again = h
        .api(&[
            ("command", "createAffinityGroup"),
            ("name", "cp"),
            ("type", "host anti-affinity"),
        ])
        .await;
    assert!(error_text(&again, "createaffinitygroupresponse", 431).contains("already exists"));
    let badtype = h
        .api(&[
            ("command", "createAffinityGroup"),
            ("name", "x"),
            ("type", "sideways"),
        ])
        .await;
    error_text(&badtype, "createaffinitygroupresponse", 431);

    let mut hosts = Vec::new();
    for name in ["cp-0", "cp-1", "cp-2"] {
        let r = deploy(&h, &base, &[("name", name), ("affinitygroupids", &gid)]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let a = inner(&r, "deployvirtualmachineresponse");
        hosts.push((str_of(&a["id"]), str_of(&a["jobid"])));
    }
    h.advance(6.0).await;
    let h0 = h.vm_by_id(&hosts[0].0).await.unwrap();
    let h1 = h.vm_by_id(&hosts[1].0).await.unwrap();
    assert_ne!(h0["hostid"], h1["hostid"], "anti-affinity spreads");
    assert_eq!(job(&h, &hosts[1].1).await["jobstatus"], 1);
    // zone1 has two hosts: the third VM cannot be placed, lands in Error, its job fails.
    let third = h.vm_by_id(&hosts[2].0).await.unwrap();
    assert_eq!(third["state"], "Error");
    let j = job(&h, &hosts[2].1).await;
    assert_eq!(
        (&j["jobstatus"], &j["jobresultcode"]),
        (&json!(2), &json!(533))
    );
    assert!(j["jobresult"]["errortext"]
        .as_str()
        .unwrap()
        .contains("Unable to create a deployment"));

    let l = h
        .api(&[("command", "listAffinityGroups"), ("name", "cp")])
        .await;
    let gs = items(&l, "listaffinitygroupsresponse", "affinitygroup");
    assert_eq!(gs[0]["virtualmachineIds"].as_array().unwrap().len(), 3);
    // In use: the delete job fails; the group stays.
    let d = h
        .api(&[("command", "deleteAffinityGroup"), ("id", &gid)])
        .await;
    let dj = str_of(&inner(&d, "deleteaffinitygroupresponse")["jobid"]);
    assert_eq!(job(&h, &dj).await["jobresultcode"], 536);
    let d = h.api(&[("command", "deleteAffinityGroup")]).await;
    error_text(&d, "deleteaffinitygroupresponse", 431);
    h.server.shutdown().await;
}

#[tokio::test]
async fn destroy_fails_fault_fails_every_destroy_job_until_cleared() {
    let h = start(world()).await;
    let (zone, so, t, _) = ids(&h).await;
    let base = deploy_base(&zone, &so, &t);
    let r = deploy(&h, &base, &[("name", "stuck")]).await;
    let id = str_of(&inner(&r, "deployvirtualmachineresponse")["id"]);
    h.advance(6.0).await;
    let f = h
        .admin_post(
            &format!("/sim/vms/{id}/faults"),
            json!({"fault": "destroy-fails"}),
        )
        .await;
    assert_eq!(f.status, 200, "{}", f.body);
    for _ in 0..2 {
        let d = h
            .api(&[("command", "destroyVirtualMachine"), ("id", &id)])
            .await;
        assert_eq!(d.status, 200, "{}", d.body);
        let jobid = str_of(&inner(&d, "destroyvirtualmachineresponse")["jobid"]);
        let j = job(&h, &jobid).await;
        assert_eq!(
            (&j["jobstatus"], &j["jobresultcode"]),
            (&json!(2), &json!(530)),
            "{j}"
        );
        assert_eq!(j["jobresult"]["errortext"], "Failed to destroy Instance");
        assert_eq!(j["jobresult"]["cserrorcode"], 9999);
        h.advance(30.0).await;
        assert_eq!(h.vm_by_id(&id).await.unwrap()["state"], "Running");
    }
    let c = h.admin_delete(&format!("/sim/vms/{id}/faults")).await;
    assert_eq!(c.status, 200, "{}", c.body);
    let d = h
        .api(&[("command", "destroyVirtualMachine"), ("id", &id)])
        .await;
    let jobid = str_of(&inner(&d, "destroyvirtualmachineresponse")["jobid"]);
    let j = job(&h, &jobid).await;
    assert_eq!(j["jobstatus"], 1, "{j}");
    assert_eq!(j["jobresult"]["virtualmachine"]["state"], "Destroyed");
    h.server.shutdown().await;
}

#[tokio::test]
async fn destroy_walks_the_expunge_timers_and_a_gone_vm_is_already_gone() {
    let h = start(world()).await;
    let (zone, so, t, _) = ids(&h).await;
    let base = deploy_base(&zone, &so, &t);
    let r = deploy(&h, &base, &[("name", "gone")]).await;
    let id = str_of(&inner(&r, "deployvirtualmachineresponse")["id"]);
    h.advance(6.0).await;

    let d = h
        .api(&[("command", "destroyVirtualMachine"), ("id", &id)])
        .await;
    assert_eq!(d.status, 200, "{}", d.body);
    let answer = inner(&d, "destroyvirtualmachineresponse");
    assert!(
        answer.get("id").is_none(),
        "non-create async commands answer only the job id"
    );
    let j = job(&h, answer["jobid"].as_str().unwrap()).await;
    assert_eq!(j["jobstatus"], 1);
    assert_eq!(j["jobresult"]["virtualmachine"]["state"], "Destroyed");
    h.advance(21.0).await;
    assert_eq!(h.vm_by_id(&id).await.unwrap()["state"], "Expunging");
    h.advance(5.0).await;
    assert!(h.vm_by_id(&id).await.is_none());
    // The expunged VM's id still resolves: destroy fails with CAPC's "already gone" text.
    let again = h
        .api(&[("command", "destroyVirtualMachine"), ("id", &id)])
        .await;
    assert!(error_text(&again, "destroyvirtualmachineresponse", 530)
        .to_lowercase()
        .contains("unable to find uuid for id"));
    let unknown = h
        .api(&[("command", "destroyVirtualMachine"), ("id", UNKNOWN)])
        .await;
    assert!(
        error_text(&unknown, "destroyvirtualmachineresponse", 431).contains("Invalid parameter id")
    );
    // Its address is free again.
    let ip = h
        .api(&[
            ("command", "listPublicIpAddresses"),
            ("allocatedonly", "false"),
            ("ipaddress", "10.10.0.10"),
        ])
        .await;
    assert_eq!(
        items(&ip, "listpublicipaddressesresponse", "publicipaddress")[0]["state"],
        "Free"
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn expunge_data_disks_and_job_ownership() {
    let h = start(world()).await;
    let (zone, so, t, _) = ids(&h).await;
    let base = deploy_base(&zone, &so, &t);
    let d = first_id(
        &h,
        "listDiskOfferings",
        &[("name", "custom")],
        "diskoffering",
    )
    .await;
    let r = deploy(
        &h,
        &base,
        &[
            ("name", "disky"),
            ("diskofferingid", &d),
            ("size", "20"),
            ("account", "capi"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let id = str_of(&inner(&r, "deployvirtualmachineresponse")["id"]);
    let jobid = str_of(&inner(&r, "deployvirtualmachineresponse")["jobid"]);
    // The job belongs to its submitter (admin); another account may not read it.
    let other = as_capi(&h, &[("command", "queryAsyncJobResult"), ("jobid", &jobid)]).await;
    error_text(&other, "queryasyncjobresultresponse", 531);
    let unknown = h
        .api(&[("command", "queryAsyncJobResult"), ("jobid", UNKNOWN)])
        .await;
    assert!(error_text(&unknown, "queryasyncjobresultresponse", 431)
        .contains("Invalid parameter jobid"));

    let v = as_capi(
        &h,
        &[
            ("command", "listVolumes"),
            ("virtualmachineid", &id),
            ("type", "DATADISK"),
        ],
    )
    .await;
    let vols = items(&v, "listvolumesresponse", "volume");
    assert_eq!(vols.len(), 1);
    assert_eq!(vols[0]["size"], 20u64 * 1024 * 1024 * 1024);
    let vol = str_of(&vols[0]["id"]);
    let all = h
        .api(&[("command", "listVolumes"), ("virtualmachineid", &id)])
        .await;
    assert_eq!(inner(&all, "listvolumesresponse")["count"], 2);

    // A user may not expunge (allow.user.expunge.recover.vm is false): the job fails.
    let d = as_capi(
        &h,
        &[
            ("command", "destroyVirtualMachine"),
            ("id", &id),
            ("expunge", "true"),
        ],
    )
    .await;
    assert_eq!(d.status, 200, "{}", d.body);
    let dj = str_of(&inner(&d, "destroyvirtualmachineresponse")["jobid"]);
    let j = as_capi(&h, &[("command", "queryAsyncJobResult"), ("jobid", &dj)]).await;
    assert_eq!(
        j.json["queryasyncjobresultresponse"]["jobstatus"], 2,
        "{}",
        j.body
    );
    assert_eq!(j.json["queryasyncjobresultresponse"]["jobresultcode"], 531);
    // listAsyncJobs: the caller's jobs whose command class matches the keyword; a root admin
    // sees every account's with listall=true only.
    let jobs = as_capi(
        &h,
        &[("command", "listAsyncJobs"), ("keyword", "destroyvmcmd")],
    )
    .await;
    let listed = items(&jobs, "listasyncjobsresponse", "asyncjobs");
    assert_eq!(listed.len(), 1, "{}", jobs.body);
    assert_eq!(listed[0]["jobid"], dj.as_str());
    assert_eq!(listed[0]["jobstatus"], 2);
    assert_eq!(listed[0]["jobinstanceid"], id.as_str());
    assert!(listed[0]["cmd"]
        .as_str()
        .is_some_and(|c| c.contains("DestroyVMCmd")));
    assert!(listed[0]["jobresult"]["errortext"]
        .as_str()
        .is_some_and(|t| t.contains("expunge")));
    let own = h
        .api(&[("command", "listAsyncJobs"), ("keyword", "DestroyVMCmd")])
        .await;
    assert!(items(&own, "listasyncjobsresponse", "asyncjobs").is_empty());
    let all = h
        .api(&[
            ("command", "listAsyncJobs"),
            ("keyword", "DestroyVMCmd"),
            ("listall", "true"),
        ])
        .await;
    assert_eq!(items(&all, "listasyncjobsresponse", "asyncjobs").len(), 1);
    // Volume ids must be the VM's data disks.
    let bad = h
        .api(&[
            ("command", "destroyVirtualMachine"),
            ("id", &id),
            ("volumeids", UNKNOWN),
        ])
        .await;
    error_text(&bad, "destroyvirtualmachineresponse", 431);
    // The admin expunges with the data disk: straight to Expunging, then gone.
    let d = h
        .api_post(&[
            ("command", "destroyVirtualMachine"),
            ("id", &id),
            ("expunge", "true"),
            ("volumeids", &vol),
        ])
        .await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(h.vm_by_id(&id).await.unwrap()["state"], "Expunging");
    let v = h
        .api(&[
            ("command", "listVolumes"),
            ("virtualmachineid", &id),
            ("type", "DATADISK"),
        ])
        .await;
    assert_eq!(v.json["listvolumesresponse"], json!({}));
    h.advance(5.0).await;
    assert!(h.vm_by_id(&id).await.is_none());
    h.server.shutdown().await;
}

#[tokio::test]
async fn public_addresses_of_a_shared_network_page_and_show_holders() {
    let h = start(world()).await;
    let (zone, so, t, net) = ids(&h).await;
    let base = deploy_base(&zone, &so, &t);
    let r = deploy(&h, &base, &[("name", "holder"), ("networkids", &net)]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // 10.10.0.0/24: .10 … .254 → 245 addresses; allocatedonly defaults to true.
    let alloc = h
        .api(&[("command", "listPublicIpAddresses"), ("networkid", &net)])
        .await;
    let a = items(&alloc, "listpublicipaddressesresponse", "publicipaddress");
    // The VM's address and the top of the range, held by the network's virtual router.
    assert_eq!(a.len(), 2);
    assert_eq!(
        (&a[0]["state"], &a[0]["virtualmachinename"]),
        (&json!("Allocated"), &json!("holder"))
    );
    assert_eq!(
        (&a[1]["ipaddress"], &a[1]["state"]),
        (&json!("10.10.0.254"), &json!("Allocated"))
    );
    let page = h
        .api(&[
            ("command", "listPublicIpAddresses"),
            ("networkid", &net),
            ("allocatedonly", "false"),
            ("forvirtualnetwork", "false"),
            ("listall", "true"),
            ("page", "2"),
            ("pagesize", "100"),
        ])
        .await;
    let p = items(&page, "listpublicipaddressesresponse", "publicipaddress");
    assert_eq!(inner(&page, "listpublicipaddressesresponse")["count"], 245);
    assert_eq!(
        (p.len(), &p[0]["ipaddress"], &p[0]["state"]),
        (100, &json!("10.10.0.110"), &json!("Free"))
    );
    let virt = h
        .api(&[
            ("command", "listPublicIpAddresses"),
            ("networkid", &net),
            ("forvirtualnetwork", "true"),
        ])
        .await;
    assert_eq!(virt.json["listpublicipaddressesresponse"], json!({}));
    let bad = h
        .api(&[("command", "listPublicIpAddresses"), ("networkid", UNKNOWN)])
        .await;
    error_text(&bad, "listpublicipaddressesresponse", 431);
    h.server.shutdown().await;
}

#[test]
fn scenario_catalogue_errors_name_their_path() {
    let parse = |s: &str| sim::parse_scenario(s, "t.json", 0, ("k", "s"));
    let e = parse(r#"{"service_offerings":[{"name":"a","colour":"red"}]}"#).unwrap_err();
    assert_eq!(e.path, "$.service_offerings[0].colour");
    let e = parse(r#"{"zones":[{"name":"z"}],"templates":[{"name":"t","zones":["z","y"]}]}"#)
        .unwrap_err();
    assert_eq!(e.path, "$.templates[0].zones[1]");
    assert!(e.message.contains("unknown zone"));
    let e = parse(r#"{"disk_offerings":[{"name":"d"}]}"#).unwrap_err();
    assert_eq!(e.path, "$.disk_offerings[0].disk_size_gb");
    let e = parse(r#"{"service_offerings":[{"name":"a","cpu_number":0}]}"#).unwrap_err();
    assert_eq!(e.path, "$.service_offerings[0].cpu_number");
    let e = parse(r#"{"vms":[{"name":"v","template":"nope"}]}"#).unwrap_err();
    assert_eq!(e.path, "$.vms[0].template");
    let e = parse(r#"{"settings":{"allow_user_expunge_recover_vm":"yes"}}"#).unwrap_err();
    assert_eq!(e.path, "$.settings.allow_user_expunge_recover_vm");
    // The e2e scenario loads, with the names the harness relies on.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../cloudstack-fixtures/scenarios/capc-e2e.json");
    let w = sim::load_scenario_file(&path, 0, ("k", "s")).unwrap();
    assert_eq!(w.zones[0].name, "zone1");
    assert_eq!(w.networks[0].name, "shared-net");
    assert_eq!(w.hosts.len(), 3);
    assert_eq!(
        (
            w.service_offerings[0].name.as_str(),
            w.service_offerings[0].cpu_number,
            w.service_offerings[0].memory_mb
        ),
        ("small", 2, 2048)
    );
    assert_eq!(w.templates[0].name, "ubuntu-2204-kube-v1.31.3");
    assert_eq!(w.accounts[0].api_key, "e2e-admin-key");
}
