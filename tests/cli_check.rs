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
