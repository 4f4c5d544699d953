//! Scenario files (the shipped examples and error reporting) and the `cloudstack-sim` binary.

mod support;

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use cloudstack_sim as sim;
use serde_json::{json, Value};
use support::*;

fn scenario_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../cloudstack-fixtures/scenarios")
        .join(name)
}

/// Loads a shipped scenario and gives its root admin the harness keys.
fn load(name: &str) -> sim::World {
    let mut w = sim::load_scenario_file(&scenario_path(name), sim::real_now_ms(), ("k", "s"))
        .unwrap_or_else(|e| panic!("{e}"));
    let admin = w
        .accounts
        .iter()
        .position(|a| a.is_root_admin())
        .expect("root admin");
    w.accounts[admin].api_key = ADMIN_KEY.to_string();
    w.accounts[admin].secret_key = sim::world::Secret::new(ADMIN_SECRET);
    w
}

#[test]
fn every_example_scenario_loads() {
    for entry in std::fs::read_dir(scenario_path("")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "json") {
            sim::load_scenario_file(&p, 0, ("k", "s")).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    assert_eq!(load("scale-20k.json").vms().len(), 20_000);
}

async fn get_as_capi(h: &Harness, name: &str) -> Value {
    let r = h
        .api_as(
            "capi-api-key",
            "capi-secret-key",
            &[("command", "listVirtualMachines"), ("name", name)],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json["listvirtualmachinesresponse"]["virtualmachine"][0].clone()
}

#[tokio::test]
async fn seed_settles_into_the_demo_picture() {
    let h = start(load("seed.json")).await;
    // Before boot: everything but the Error VM is Starting.
    let vms = h.list_vms(&[]).await;
    let states: Vec<(String, String)> = vms
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().into(),
                v["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(states.len(), 5);
    assert!(states.contains(&("demo-md-0-c".into(), "Error".into())));
    assert!(states.contains(&("demo-cp-1".into(), "Starting".into())));

    h.advance(10.0).await;
    let b1 = get_as_capi(&h, "demo-md-0-b").await;
    let a1 = get_as_capi(&h, "demo-md-0-a").await;
    h.advance(20.0).await;
    let b2 = get_as_capi(&h, "demo-md-0-b").await;
    let a2 = get_as_capi(&h, "demo-md-0-a").await;
    assert_eq!(a2["state"], "Running");
    assert_eq!(b2["state"], "Running");
    assert!(a2["networkkbswrite"].as_u64() > a1["networkkbswrite"].as_u64());
    assert_eq!(
        b2["networkkbswrite"], b1["networkkbswrite"],
        "nic-down worker is flat"
    );

    let admin: Value = h.admin_get("/sim/vms").await.json;
    let joined = |n: &str| {
        admin["vms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == n)
            .unwrap()["joined"]
            .clone()
    };
    assert_eq!(joined("demo-cp-1"), true);
    assert_eq!(joined("demo-md-0-b"), false);
    assert_eq!(joined("demo-md-0-d"), true, "slow-boot finished after 15 s");

    // The least-privilege account cannot call anything else.
    let r = h
        .api_as(
            "capi-api-key",
            "capi-secret-key",
            &[("command", "listFlyingSaucers")],
        )
        .await;
    assert_eq!(r.status, 401);
    h.server.shutdown().await;
}

#[tokio::test]
async fn scheduled_faults_fire_at_their_time() {
    let h = start(load("faults-timeline.json")).await;
    h.advance(39.0).await;
    let a = h.admin_get("/sim/vms/tl-md-0-a").await;
    assert_eq!(a.json["faults"], json!([]));
    h.advance(2.0).await;
    let a = h.admin_get("/sim/vms/tl-md-0-a").await;
    assert_eq!(a.json["faults"], json!(["nic-down"]));
    h.advance(60.0).await;
    let b = h.admin_get("/sim/vms/tl-md-0-b").await;
    assert_eq!(b.json["host_control_state"], "Offline");
    h.advance(60.0).await;
    let names: Vec<Value> = h
        .list_vms(&[])
        .await
        .iter()
        .map(|v| v["name"].clone())
        .collect();
    assert_eq!(names, [json!("tl-cp-1"), json!("tl-md-0-b")]);
    h.server.shutdown().await;
}

fn write_temp(content: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    f.write_all(content.as_bytes()).unwrap();
    f
}

#[test]
fn bad_scenarios_name_file_field_and_reason() {
    let cases = [
        (
            r#"{"vms":[{"name":"a","guest":"zombie"}]}"#,
            "$.vms[0].guest",
            "unknown guest kind",
        ),
        (
            r#"{"vms":[{"name":"a"}],"faults":[{"at_seconds":5,"vm":"b","fault":"stop"}]}"#,
            "$.faults[0].vm",
            "unknown VM",
        ),
        (
            r#"{"vms":[{"name":"a"}],"faults":[{"at_seconds":5,"vm":"a","fault":"meteor"}]}"#,
            "$.faults[0].fault",
            "unknown fault",
        ),
        (
            r#"{"vms":[{"name":"a","id":"0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11"},
                       {"name":"b","id":"0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11"}]}"#,
            "$.vms[1].id",
            "duplicate VM id",
        ),
        (
            r#"{"vms":[{"name":"a","boot_seconds":"3"}]}"#,
            "$.vms[0].boot_seconds",
            "expected a number",
        ),
        (
            r#"{"vms":[{"name":"a","account":"ghost"}]}"#,
            "$.vms[0].account",
            "unknown account",
        ),
        (
            r#"{"networks":[{"name":"n","cidr":"10.0.0.0"}]}"#,
            "$.networks[0].cidr",
            "bad cidr",
        ),
        (
            r#"{"accounts":[{"name":"a","api_key":"k","secret_key":"s","role":{"rules":[{"rule":"x","permission":"maybe"}]}}]}"#,
            "$.accounts[0].role.rules[0].permission",
            "allow",
        ),
        (r#"[1,2]"#, "$", "expected an object"),
    ];
    for (content, path, why) in cases {
        let f = write_temp(content);
        let e = sim::load_scenario_file(f.path(), 0, ("k", "s")).unwrap_err();
        let text = e.to_string();
        assert_eq!(e.path, path, "{text}");
        assert!(e.message.contains(why), "{text}");
        assert!(text.starts_with(&f.path().display().to_string()), "{text}");
    }
    let e = sim::load_scenario_file(std::path::Path::new("/nonexistent/x.json"), 0, ("k", "s"))
        .unwrap_err();
    assert!(e.to_string().contains("/nonexistent/x.json"));
}

/// Kills the child process when dropped (also on test failure).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn binary_prints_listen_line_and_serves() {
    let mut child = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_cloudstack-sim"))
            .args(["--listen", "127.0.0.1:0", "--scenario"])
            .arg(scenario_path("seed.json"))
            .args(["--api-key", "cli-key", "--secret-key", "cli-secret"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn cloudstack-sim"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("listen line within the deadline");
    let base = line
        .trim_end()
        .strip_prefix("cloudstack-sim listening on ")
        .unwrap_or_else(|| panic!("unexpected line {line:?}"))
        .to_string();
    assert!(!base.ends_with(":0"), "{base}");
    let c = client();
    let q = cloudstack_api::signing::signed_query(
        "cli-secret",
        [
            ("apiKey", "cli-key"),
            ("command", "listVirtualMachines"),
            ("listall", "true"),
            ("response", "json"),
        ],
    );
    let r: Value = c
        .get(format!("{base}/client/api?{q}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["listvirtualmachinesresponse"]["count"], 5, "{r}");
    let clock: Value = c
        .get(format!("{base}/sim/clock"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(clock["time_scale"], 1.0);
}
