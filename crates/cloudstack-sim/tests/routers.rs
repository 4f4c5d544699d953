//! Virtual routers (`listRouters`) and the probe inside them (`runDiagnostics`), over real
//! HTTP: visibility, router states, router-less networks, who may call, the job's errors,
//! its duration in simulated time and what arping prints for a guest that answers or not.

mod support;

use cloudstack_sim::{self as sim, RouterState, World};
use serde_json::{json, Value};
use support::*;

const SCENARIO: &str = r#"{
  "settings": {"stats_interval_seconds": 10, "boot_seconds": 5},
  "accounts": [
    {"name": "admin", "type": "Admin", "api_key": "admin-key", "secret_key": "admin-secret"},
    {"name": "dadmin", "type": "DomainAdmin", "api_key": "da-key", "secret_key": "da-secret"},
    {"name": "capi", "type": "User", "api_key": "capi-key", "secret_key": "capi-secret"}
  ],
  "zones": [{"name": "zone1"}],
  "hosts": [{"name": "host-1", "zone": "zone1"}],
  "networks": [
    {"name": "iso", "type": "Isolated", "cidr": "10.1.1.0/24", "account": "capi"},
    {"name": "proj-net", "type": "Isolated", "cidr": "10.2.2.0/24", "project": "team"},
    {"name": "bare", "type": "Shared", "cidr": "10.3.0.0/24", "virtual_router": false},
    {"name": "l2", "type": "L2", "cidr": "10.4.0.0/24"}
  ],
  "projects": [{"name": "team", "members": ["capi"]}],
  "vms": [
    {"name": "web", "network": "iso", "account": "capi", "state": "Running", "guest": "healthy"},
    {"name": "down", "network": "iso", "account": "capi", "state": "Running", "guest": "healthy"},
    {"name": "broken", "network": "iso", "account": "capi", "state": "Running", "guest": "services-fail"},
    {"name": "booting", "network": "iso", "account": "capi", "state": "Starting", "boot_seconds": 3600}
  ]
}"#;

fn world() -> World {
    sim::parse_scenario(SCENARIO, "inline", sim::real_now_ms(), ("x", "y")).unwrap()
}

fn routers(r: &Resp) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json["listroutersresponse"]["router"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn names(v: &[Value]) -> Vec<String> {
    v.iter()
        .map(|r| r["guestnetworkname"].as_str().unwrap().to_string())
        .collect()
}

async fn net_id(h: &Harness, name: &str) -> String {
    let r = h
        .api(&[
            ("command", "listNetworks"),
            ("name", name),
            ("listall", "true"),
        ])
        .await;
    r.json["listnetworksresponse"]["network"][0]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The router of network `name` (root admin, everything visible).
async fn router_of(h: &Harness, name: &str) -> Value {
    let n = net_id(h, name).await;
    let r = h
        .api(&[
            ("command", "listRouters"),
            ("networkid", &n),
            ("listall", "true"),
            ("projectid", "-1"),
        ])
        .await;
    routers(&r).into_iter().next().expect("a router")
}

async fn vm(h: &Harness, name: &str) -> Value {
    h.list_vms(&[("name", name)])
        .await
        .into_iter()
        .next()
        .unwrap()
}

/// Submits runDiagnostics as the root admin; returns the job id.
async fn diagnose(h: &Harness, router: &str, ip: &str, kind: &str, params: Option<&str>) -> String {
    let mut p = vec![
        ("command", "runDiagnostics"),
        ("targetid", router),
        ("ipaddress", ip),
        ("type", kind),
    ];
    if let Some(x) = params {
        p.push(("params", x));
    }
    let r = h.api(&p).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json["rundiagnosticsresponse"]["jobid"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn job(h: &Harness, id: &str) -> Value {
    let r = h
        .api(&[("command", "queryAsyncJobResult"), ("jobid", id)])
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json["queryasyncjobresultresponse"].clone()
}

/// A failed job's errortext.
async fn job_error(h: &Harness, id: &str) -> String {
    let j = job(h, id).await;
    assert_eq!(j["jobstatus"], 2, "{j}");
    assert_eq!(j["jobresult"]["errorcode"], 530, "{j}");
    j["jobresult"]["errortext"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn list_routers_visibility_follows_projects_and_roles() {
    let h = start(world()).await;
    // Without projectid, project routers are skipped; without listall, only the caller's own.
    let all = routers(
        &h.api(&[("command", "listRouters"), ("listall", "true")])
            .await,
    );
    assert_eq!(names(&all), ["iso"]);
    let own = h.api(&[("command", "listRouters")]).await;
    assert_eq!(own.json["listroutersresponse"], json!({}));
    // projectid=-1 with listall: everything, project routers included; alone: projects only.
    let everything = routers(
        &h.api(&[
            ("command", "listRouters"),
            ("listall", "true"),
            ("projectid", "-1"),
        ])
        .await,
    );
    assert_eq!(names(&everything), ["iso", "proj-net"]);
    assert_eq!(everything[1]["account"], "PrjAcct-team-1");
    assert_eq!(everything[1]["project"], "team");
    let projects = routers(
        &h.api(&[("command", "listRouters"), ("projectid", "-1")])
            .await,
    );
    assert_eq!(names(&projects), ["proj-net"]);
    // The probe's query: by network, Running, listall, projectid=-1.
    let pn = net_id(&h, "proj-net").await;
    let q = routers(
        &h.api(&[
            ("command", "listRouters"),
            ("networkid", &pn),
            ("state", "Running"),
            ("listall", "true"),
            ("projectid", "-1"),
        ])
        .await,
    );
    assert_eq!(q.len(), 1);
    let without = h
        .api(&[
            ("command", "listRouters"),
            ("networkid", &pn),
            ("listall", "true"),
        ])
        .await;
    assert_eq!(without.json["listroutersresponse"], json!({}));
    // Networks without a VirtualRouter service have no router.
    for n in ["bare", "l2"] {
        let id = net_id(&h, n).await;
        let r = h
            .api(&[
                ("command", "listRouters"),
                ("networkid", &id),
                ("listall", "true"),
                ("projectid", "-1"),
            ])
            .await;
        assert_eq!(r.json["listroutersresponse"], json!({}), "{n}");
    }
    // Fields.
    let r = &all[0];
    assert_eq!(r["role"], "VIRTUAL_ROUTER");
    assert_eq!(r["state"], "Running");
    assert_eq!(r["isredundantrouter"], false);
    assert_eq!(r["guestipaddress"], "10.1.1.1");
    assert_eq!(r["account"], "capi");
    assert!(r["hostid"].is_string() && r["hypervisor"] == "KVM");
    assert!(r.get("vpcid").is_none());
    let nic = &r["nic"][0];
    assert_eq!(nic["networkid"], r["guestnetworkid"]);
    assert_eq!(nic["ipaddress"], "10.1.1.1");
    assert_eq!(nic["traffictype"], "Guest");
    assert_eq!(nic["netmask"], "255.255.255.0");
    assert_eq!(nic["deviceid"], "0");
    assert!(nic["macaddress"].as_str().unwrap().starts_with("02:01:"));
    // A domain admin may call it (default role mapping); a user may not.
    let da = h
        .api_as(
            "da-key",
            "da-secret",
            &[("command", "listRouters"), ("listall", "true")],
        )
        .await;
    assert_eq!(names(&routers(&da)), ["iso"]);
    let user = h
        .api_as("capi-key", "capi-secret", &[("command", "listRouters")])
        .await;
    assert_eq!(user.status, 432, "{}", user.body);
    assert_eq!(
        user.json["errorresponse"]["errortext"],
        "The API listRouters does not exist or is not available for this account."
    );
    // Paging like other lists.
    let p = h
        .api(&[
            ("command", "listRouters"),
            ("listall", "true"),
            ("projectid", "-1"),
            ("page", "2"),
            ("pagesize", "1"),
        ])
        .await;
    assert_eq!(p.json["listroutersresponse"]["count"], 2);
    assert_eq!(names(&routers(&p)), ["proj-net"]);
    h.server.shutdown().await;
}

#[tokio::test]
async fn router_states_come_from_the_admin_api_and_the_library() {
    let h = start(world()).await;
    let r = router_of(&h, "iso").await;
    let id = r["id"].as_str().unwrap();
    let s = h
        .admin_post(&format!("/sim/routers/{id}"), json!({"state": "Stopped"}))
        .await;
    assert_eq!(s.status, 200, "{}", s.body);
    assert!(s.json["hostid"].is_null());
    let now = router_of(&h, "iso").await;
    assert_eq!(now["state"], "Stopped");
    assert!(now.get("hostid").is_none(), "a Stopped router has no host");
    let running = h
        .api(&[
            ("command", "listRouters"),
            ("state", "Running"),
            ("listall", "true"),
        ])
        .await;
    assert_eq!(running.json["listroutersresponse"], json!({}));
    h.sim.set_router_state(id, RouterState::Starting).unwrap();
    let now = router_of(&h, "iso").await;
    assert_eq!(now["state"], "Starting");
    assert!(now["hostid"].is_string());
    let bad = h
        .admin_post(&format!("/sim/routers/{id}"), json!({"state": "Exploded"}))
        .await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        h.admin_post("/sim/routers/nope", json!({"state": "Running"}))
            .await
            .status,
        404
    );
    // A network created without a router (admin API) lists none; one with a Stopped router.
    let n = h
        .admin_post(
            "/sim/networks",
            json!({"name": "extdhcp", "cidr": "10.9.0.0/24", "virtual_router": false}),
        )
        .await;
    assert_eq!(n.status, 201, "{}", n.body);
    assert_eq!(n.json["routers"], json!([]));
    let n = h
        .admin_post(
            "/sim/networks",
            json!({"name": "cold", "type": "Isolated", "cidr": "10.8.0.0/24",
                   "account": "capi", "router_state": "Stopped"}),
        )
        .await;
    assert_eq!(n.status, 201, "{}", n.body);
    assert_eq!(router_of(&h, "cold").await["state"], "Stopped");
    let lib = h
        .sim
        .add_network(&{
            let mut s = sim::NetworkSpec::new("lib-l2", "10.7.0.0/24", sim::NetworkType::L2);
            s.account = Some("capi".into());
            s
        })
        .unwrap();
    assert!(h.sim.routers_of(&lib).unwrap().is_empty());
    h.server.shutdown().await;
}

#[tokio::test]
async fn run_diagnostics_is_for_root_admins_and_checks_like_cloudstack() {
    let h = start(world()).await;
    h.advance(30.0).await;
    let r = router_of(&h, "iso").await;
    let rid = r["id"].as_str().unwrap();
    // Refused for other account types, with CloudStack's text for an unavailable API.
    for (k, s) in [("da-key", "da-secret"), ("capi-key", "capi-secret")] {
        let x = h
            .api_as(
                k,
                s,
                &[
                    ("command", "runDiagnostics"),
                    ("targetid", rid),
                    ("ipaddress", "10.1.1.10"),
                    ("type", "arping"),
                ],
            )
            .await;
        assert_eq!(x.status, 432, "{}", x.body);
        assert_eq!(
            x.json["errorresponse"]["errortext"],
            "The API runDiagnostics does not exist or is not available for this account."
        );
    }
    // Parameter processing before the job: required parameters, targetid must resolve.
    let missing = h
        .api(&[
            ("command", "runDiagnostics"),
            ("targetid", rid),
            ("type", "arping"),
        ])
        .await;
    assert_eq!(missing.status, 431, "{}", missing.body);
    let unknown = h
        .api(&[
            ("command", "runDiagnostics"),
            ("targetid", "0b9e4c1a-7d2f-4e3b-9a8c-1f2e3d4c5b6a"),
            ("ipaddress", "10.1.1.10"),
            ("type", "arping"),
        ])
        .await;
    assert_eq!(unknown.status, 431, "{}", unknown.body);
    // Inside the job: type, system VM, params (DiagnosticsServiceImpl's order).
    let j = diagnose(&h, rid, "10.1.1.10", "fping", None).await;
    assert_eq!(
        job_error(&h, &j).await,
        "fping Is not a valid diagnostics command type. "
    );
    let web = vm(&h, "web").await;
    let j = diagnose(&h, web["id"].as_str().unwrap(), "10.1.1.10", "arping", None).await;
    assert!(job_error(&h, &j)
        .await
        .starts_with("Unable to find a system vm with id "));
    let j = diagnose(&h, rid, "10.1.1.10", "arping", Some("-c 3; reboot")).await;
    assert_eq!(
        job_error(&h, &j).await,
        "Optional parameters contain unwanted characters: -c 3; reboot"
    );
    // ping6 prints nothing: "Command execution failed".
    let j = diagnose(&h, rid, "10.1.1.10", "PING6", None).await;
    assert!(job_error(&h, &j)
        .await
        .starts_with("Command execution failed"));
    // A Stopped router has no host.
    h.sim.set_router_state(rid, RouterState::Stopped).unwrap();
    let j = diagnose(&h, rid, "10.1.1.10", "arping", Some("-c 3 -f")).await;
    let name = r["name"].as_str().unwrap();
    assert_eq!(
        job_error(&h, &j).await,
        format!("Unable to find host for virtual machine instance: {name}")
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn arping_answers_follow_the_guest_and_the_job_lasts_as_long_as_the_tool() {
    let h = start(world()).await;
    h.advance(30.0).await;
    let r = router_of(&h, "iso").await;
    let rid = r["id"].as_str().unwrap().to_string();
    let web = vm(&h, "web").await;
    let ip = web["nic"][0]["ipaddress"].as_str().unwrap().to_string();
    let mac = web["nic"][0]["macaddress"].as_str().unwrap().to_uppercase();

    // A healthy guest answers the first request: 1 s, then the job is done.
    let j = diagnose(&h, &rid, &ip, "ARPING", Some("-c 3 -f")).await;
    let pending = job(&h, &j).await;
    assert_eq!(pending["jobstatus"], 0);
    assert!(pending.get("jobresult").is_none());
    assert_eq!(pending["jobinstancetype"], "SystemVm");
    assert_eq!(pending["jobinstanceid"], rid.as_str());
    assert_eq!(
        pending["cmd"],
        "org.apache.cloudstack.api.command.admin.diagnostics.RunDiagnosticsCmd"
    );
    h.advance(0.5).await;
    assert_eq!(job(&h, &j).await["jobstatus"], 0);
    h.advance(0.5).await;
    let done = job(&h, &j).await;
    assert_eq!(done["jobstatus"], 1, "{done}");
    let result = done["jobresult"].as_object().unwrap();
    assert_eq!(result.keys().collect::<Vec<_>>(), ["diagnostics"]);
    let d = &done["jobresult"]["diagnostics"];
    assert_eq!(d["exitcode"], "0");
    assert_eq!(d["stderr"], "b''");
    let out = d["stdout"].as_str().unwrap();
    let head = format!("b'ARPING {ip} from 10.1.1.1 eth0\\nUnicast reply from {ip} [{mac}]  0.");
    assert!(out.starts_with(&head), "{out}");
    assert!(
        out.ends_with("ms\\nSent 1 probes (1 broadcast(s))\\nReceived 1 response(s)\\n'"),
        "{out}"
    );
    assert!(
        !out.contains('\n'),
        "newlines arrive as the two characters \\n"
    );

    // A guest whose services failed still answers ARP (its kernel does).
    let broken = vm(&h, "broken").await;
    let bip = broken["nic"][0]["ipaddress"].as_str().unwrap();
    let j = diagnose(&h, &rid, bip, "arping", Some("-c 3 -f")).await;
    h.advance(1.0).await;
    assert_eq!(
        job(&h, &j).await["jobresult"]["diagnostics"]["exitcode"],
        "0"
    );

    // NIC down: no reply; 3 requests take 3 s; exit 1.
    let down = vm(&h, "down").await;
    let dip = down["nic"][0]["ipaddress"].as_str().unwrap().to_string();
    h.sim.inject_fault("down", sim::Fault::NicDown).unwrap();
    let j = diagnose(&h, &rid, &dip, "arping", Some("-c 3 -f")).await;
    h.advance(2.9).await;
    assert_eq!(job(&h, &j).await["jobstatus"], 0);
    h.advance(0.1).await;
    let done = job(&h, &j).await;
    assert_eq!(done["jobstatus"], 1, "{done}");
    let d = &done["jobresult"]["diagnostics"];
    assert_eq!(d["exitcode"], "1");
    assert_eq!(
        d["stdout"],
        format!(
            "b'ARPING {dip} from 10.1.1.1 eth0\\nSent 3 probes (3 broadcast(s))\\nReceived 0 response(s)\\n'"
        )
    );

    // Without -c, diagnostics.py appends `-c 4`; without -f all four are answered.
    let j = diagnose(&h, &rid, &ip, "arping", None).await;
    h.advance(4.0).await;
    let out = job(&h, &j).await["jobresult"]["diagnostics"]["stdout"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(out.matches("Unicast reply").count(), 4, "{out}");
    assert!(out.contains("Sent 4 probes (1 broadcast(s))\\nReceived 4 response(s)"));

    // A guest still booting (VM Starting) and an address nobody holds: no reply.
    let j = diagnose(&h, &rid, "10.1.1.13", "arping", Some("-c 1")).await;
    let k = diagnose(&h, &rid, "10.1.1.200", "arping", Some("-c 1")).await;
    // Probes on one router run one at a time: the second ends a second after the first.
    h.advance(1.0).await;
    assert_eq!(
        job(&h, &j).await["jobresult"]["diagnostics"]["exitcode"],
        "1"
    );
    assert_eq!(job(&h, &k).await["jobstatus"], 0);
    h.advance(1.0).await;
    assert_eq!(
        job(&h, &k).await["jobresult"]["diagnostics"]["exitcode"],
        "1"
    );

    // inetutils ping: a silent guest costs (count − 1) s + 10 s of linger, exit 1.
    let j = diagnose(&h, &rid, &dip, "ping", None).await;
    h.advance(12.9).await;
    assert_eq!(job(&h, &j).await["jobstatus"], 0);
    h.advance(0.1).await;
    let d = job(&h, &j).await["jobresult"]["diagnostics"].clone();
    assert_eq!(d["exitcode"], "1");
    assert!(d["stdout"]
        .as_str()
        .unwrap()
        .contains("4 packets transmitted, 0 packets received, 100% packet loss"));
    let j = diagnose(&h, &rid, &ip, "ping", Some("-c 2")).await;
    h.advance(1.0).await;
    let d = job(&h, &j).await["jobresult"]["diagnostics"].clone();
    assert_eq!(d["exitcode"], "0", "{d}");
    assert!(d["stdout"].as_str().unwrap().starts_with(&format!(
        "b'PING {ip} ({ip}): 56 data bytes\\n64 bytes from {ip}: icmp_seq=0 ttl=64 time="
    )));
    h.server.shutdown().await;
}

#[tokio::test]
async fn the_default_world_has_a_root_admin_and_a_router_on_its_shared_network() {
    let h = start(default_world()).await;
    assert_eq!(
        h.sim.root_admin_keys(),
        Some((ADMIN_KEY.to_string(), ADMIN_SECRET.to_string()))
    );
    let ra = h.admin_get("/sim/root-admin").await;
    assert_eq!(ra.json, json!({"account": "admin", "apikey": ADMIN_KEY}));
    let r = h
        .api(&[("command", "listRouters"), ("listall", "true")])
        .await;
    let all = routers(&r);
    assert_eq!(all.len(), 1);
    assert_eq!(all[0]["account"], "system");
    assert_eq!(all[0]["guestipaddress"], "10.0.255.254");
    assert_eq!(
        h.admin_get("/sim/networks").await.json["networks"][0]["routers"][0],
        all[0]["id"]
    );
    h.server.shutdown().await;
}

#[tokio::test]
async fn a_network_loses_and_regains_its_uplink_through_the_admin_api() {
    let h = start(world()).await;
    let lost = h
        .admin_post("/sim/networks/iso", json!({"uplink": false}))
        .await;
    assert_eq!(lost.status, 200, "{}", lost.body);
    assert_eq!(lost.json["uplink"], false);
    assert!(lost.json["gateway_lost_since"].is_string());
    // CloudStack sees nothing: its router still runs.
    assert_eq!(router_of(&h, "iso").await["state"], "Running");
    let back = h
        .admin_post("/sim/networks/iso", json!({"uplink": true}))
        .await;
    assert_eq!(back.json["uplink"], true);
    assert!(back.json["gateway_lost_since"].is_null());
    // The library does the same.
    h.sim.set_network_uplink("iso", false).unwrap();
    let nets = h.admin_get("/sim/networks").await.json;
    let iso = nets["networks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "iso")
        .unwrap()
        .clone();
    assert_eq!(iso["uplink"], false);
    let bad = h
        .admin_post("/sim/networks/iso", json!({"uplink": "no"}))
        .await;
    assert_eq!(bad.status, 400);
    let missing = h
        .admin_post("/sim/networks/nope", json!({"uplink": true}))
        .await;
    assert_eq!(missing.status, 404);
    assert!(h.sim.set_template_guest("nope", None).is_err());
    h.server.shutdown().await;
}
