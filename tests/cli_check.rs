//! `capc-health-shim check` as an operator runs it: exit codes, error text, no secrets.

use std::process::Command;

const SENTINEL: &str = "SENTINEL-SECRET-XYZ";

fn shim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn an_unreachable_endpoint_exits_3_and_never_prints_the_secret() {
    let port = free_port();
    let out = shim()
        .args(["check", "--polls", "1", "--request-timeout", "2s"])
        .env(
            "CLOUDSTACK_API_URL",
            format!("http://127.0.0.1:{port}/client/api"),
        )
        .env("CLOUDSTACK_API_KEY", "some-api-key-value")
        .env("CLOUDSTACK_SECRET_KEY", SENTINEL)
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(3),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("poll 1:"), "{all}");
    assert!(!all.contains(SENTINEL), "{all}");
    assert!(!all.contains("signature="), "{all}");
}

#[test]
fn missing_credentials_exit_2_naming_what_is_missing() {
    let out = shim()
        .args(["check", "--api-url", "http://127.0.0.1:1/client/api"])
        .env_remove("CLOUDSTACK_API_KEY")
        .env_remove("CLOUDSTACK_SECRET_KEY")
        .env_remove("CLOUDSTACK_CREDENTIALS_FILE")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("api-key") && err.contains("secret-key"),
        "{err}"
    );
}

#[test]
fn a_credentials_file_with_a_bad_line_is_reported_by_line_without_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("creds");
    std::fs::write(
        &file,
        format!("api-url: http://127.0.0.1:1/client/api\n{SENTINEL}\n"),
    )
    .expect("write");
    let out = shim()
        .args(["check", "--credentials-file"])
        .arg(&file)
        .env_remove("CLOUDSTACK_API_KEY")
        .env_remove("CLOUDSTACK_SECRET_KEY")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("creds:2"), "{err}");
    assert!(!err.contains(SENTINEL), "{err}");
}

#[test]
fn bad_flags_are_rejected_with_a_clear_message() {
    let out = shim()
        .args(["check", "--polls", "0"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let out = shim()
        .args(["check", "--interval", "soon"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a duration"));
}

/// A real `cloudstack-sim` process with the seed scenario; killed on drop.
struct SimProcess {
    child: std::process::Child,
    api_url: String,
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sim() -> SimProcess {
    use std::io::{BufRead, BufReader};
    let scenario = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("cloudstack-fixtures/scenarios/seed.json");
    let mut child = Command::new(test_support::binaries::workspace_binary("cloudstack-sim"))
        .args(["--listen", "127.0.0.1:0", "--scenario"])
        .arg(scenario)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start cloudstack-sim");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.split("listening on ").nth(1) {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let base = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("cloudstack-sim announces its address within 20 s");
    SimProcess {
        child,
        api_url: format!("{base}/client/api"),
    }
}

#[test]
fn json_output_against_the_simulator_has_one_object_per_vm() {
    let sim = start_sim();
    let dir = tempfile::tempdir().expect("tempdir");
    let creds = dir.path().join("creds");
    // The seed scenario's least-privilege account, from a file as an operator would pass it.
    std::fs::write(
        &creds,
        format!(
            "api-url: {}\napi-key: capi-api-key\nsecret-key: capi-secret-key\n",
            sim.api_url
        ),
    )
    .expect("write");
    let out = shim()
        .args([
            "check",
            "-o",
            "json",
            "--polls",
            "3",
            "--interval",
            "0.2s",
            "--credentials-file",
        ])
        .arg(&creds)
        .env_remove("CLOUDSTACK_API_URL")
        .env_remove("CLOUDSTACK_API_KEY")
        .env_remove("CLOUDSTACK_SECRET_KEY")
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let reports = reports.as_array().expect("a list");
    assert_eq!(reports.len(), 5);
    for r in reports {
        for field in [
            "vm_id", "name", "state", "verdict", "reason", "message", "since",
        ] {
            assert!(r.get(field).is_some(), "{field} missing in {r}");
        }
    }
    // The VM that is in Error from the start is confirmed by the second of three polls.
    let error_vm = reports
        .iter()
        .find(|r| r["name"] == "demo-md-0-c")
        .expect("demo-md-0-c");
    assert_eq!(error_vm["state"], "Error");
    assert_eq!(error_vm["verdict"], "False");
    assert_eq!(error_vm["reason"], "VMError");
    let cp = reports
        .iter()
        .find(|r| r["name"] == "demo-cp-1")
        .expect("demo-cp-1");
    assert_ne!(cp["verdict"], "False", "{cp}");
}

#[test]
fn a_rejected_secret_exits_4_and_even_trace_logs_carry_no_secret_or_signature() {
    let sim = start_sim();
    let out = shim()
        .args(["--log", "trace", "check", "--polls", "1"])
        .env("CLOUDSTACK_API_URL", &sim.api_url)
        .env("CLOUDSTACK_API_KEY", "capi-api-key")
        .env("CLOUDSTACK_SECRET_KEY", SENTINEL)
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(4),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("401"), "{err}");
    assert!(
        err.contains("CloudStack request"),
        "trace logging was on: {err}"
    );
    assert!(!err.contains(SENTINEL), "{err}");
    assert!(!err.contains("signature="), "{err}");
}
