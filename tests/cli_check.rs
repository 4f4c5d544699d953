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

// --- flag validation: every numeric flag refuses what would spin, overflow or silently do
// nothing, at parse time, naming the flag and the allowed range.

use clap::Parser;

#[derive(Debug, Parser)]
struct RunFlags {
    #[command(flatten)]
    run: capc_health_shim::controller::RunArgs,
}

#[derive(Debug, Parser)]
struct CheckFlags {
    #[command(flatten)]
    check: capc_health_shim::check::CheckArgs,
}

/// The `run` flags parsed as the binary parses them, with no environment fallback in play.
fn parse_run(args: &[&str]) -> Result<RunFlags, clap::Error> {
    RunFlags::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
}

fn parse_check(args: &[&str]) -> Result<CheckFlags, clap::Error> {
    CheckFlags::try_parse_from(std::iter::once("check").chain(args.iter().copied()))
}

/// `(flag, bad value, what the error must say about the allowed values)`.
const BAD_RUN_VALUES: &[(&str, &str, &str)] = &[
    ("--poll-interval", "0", "1s"),
    ("--poll-interval", "500ms", "1s"),
    ("--poll-interval", "2h", "1h"),
    ("--rate-limit", "3e9", "1000"),
    ("--rate-limit", "1001", "1000"),
    ("--rate-limit", "NaN", "1000"),
    ("--rate-limit", "inf", "1000"),
    ("--rate-limit", "-1", "1000"),
    ("--silent-samples", "0", "1..=12"),
    ("--silent-samples", "13", "1..=12"),
    ("--silent-samples", "16", "1..=12"),
    ("--kube-timeout", "0", "1s"),
    ("--kube-timeout", "15s", "5s"),
    ("--kube-timeout", "8s", "5s"),
    ("--request-timeout", "0", "1s"),
    ("--workload-timeout", "0", "1s"),
    ("--stats-interval", "0", "1s"),
    ("--stale-poll-intervals", "0", "1..=1000"),
    ("--stale-poll-intervals", "4294967295", "1..=1000"),
    ("--not-found-polls", "0", "1..=1000"),
    ("--error-confirm-polls", "4294967295", "0..=1000"),
    ("--mass-failure-count", "1", "2.."),
    ("--stopped-grace", "1e20", "366"),
    ("--escalation-delay", "100000000h", "366"),
];

#[test]
fn run_refuses_each_bad_numeric_flag_naming_the_flag_and_the_range() {
    let mut accepted = Vec::new();
    for (flag, value, range) in BAD_RUN_VALUES {
        // A panic inside a parser (duration overflow) is a failure to refuse, too.
        let arg = format!("{flag}={value}");
        let parsed = std::panic::catch_unwind(|| parse_run(&[&arg]));
        match parsed {
            Ok(Err(e)) => {
                let text = e.to_string();
                assert!(
                    text.contains(flag) && text.contains(range),
                    "{flag} {value}: {text}"
                );
            }
            Ok(Ok(_)) => accepted.push(format!("{flag} {value}")),
            Err(_) => accepted.push(format!("{flag} {value} (panicked)")),
        }
    }
    assert!(accepted.is_empty(), "accepted: {accepted:?}");
}

#[test]
fn run_still_takes_good_values_at_both_ends_of_each_range() {
    let f = parse_run(&[
        "--poll-interval",
        "1s",
        "--rate-limit",
        "1000",
        "--silent-samples",
        "12",
        "--kube-timeout",
        "5s",
        "--stale-poll-intervals",
        "1",
        "--mass-failure-count",
        "2",
        "--error-confirm-polls",
        "0",
        "--escalation-delay",
        "0s",
    ])
    .expect("good values");
    assert_eq!(f.run.poll_interval, jiff::SignedDuration::from_secs(1));
    assert_eq!(f.run.rate_limit, 1000.0);
    assert_eq!(f.run.graces.silent_samples, 12);
    let f = parse_run(&[
        "--poll-interval",
        "1h",
        "--rate-limit",
        "0",
        "--silent-samples",
        "1",
    ])
    .expect("0 turns the rate limit off");
    assert_eq!(f.run.rate_limit, 0.0);
    assert_eq!(f.run.poll_interval, jiff::SignedDuration::from_hours(1));
    let f = parse_run(&["--rate-limit", "2.5"]).expect("a fractional rate");
    assert_eq!(f.run.rate_limit, 2.5);
    let f = parse_run(&[]).expect("the defaults");
    assert_eq!(f.run.graces.silent_samples, 3);
}

#[test]
fn check_refuses_bad_grace_flags_and_takes_good_ones() {
    for (flag, value, range) in [
        ("--silent-samples", "16", "1..=12"),
        ("--silent-samples", "0", "1..=12"),
        ("--stats-interval", "0", "1s"),
        ("--stale-poll-intervals", "0", "1..=1000"),
        ("--interval", "0s", "100ms..=1h"),
        ("--request-timeout", "0s", "1s..=10m"),
    ] {
        let e = parse_check(&[&format!("{flag}={value}")]).expect_err(&format!("{flag} {value}"));
        let text = e.to_string();
        assert!(text.contains(flag) && text.contains(range), "{text}");
    }
    let f = parse_check(&["--silent-samples", "12"]).expect("12 is allowed");
    assert_eq!(f.check.graces.silent_samples, 12);
}

/// The binary, with no Kubernetes or CloudStack to talk to; killed if it does not exit soon.
fn shim_exit(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = shim()
        .args(args)
        .env("KUBECONFIG", dir.path().join("no-such-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("CLOUDSTACK_API_URL", "http://127.0.0.1:1/client/api")
        .env("CLOUDSTACK_API_KEY", "k")
        .env("CLOUDSTACK_SECRET_KEY", "s")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    use std::io::Read;
    let _ = child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err);
    (status, err)
}

#[test]
fn the_binary_exits_2_on_bad_numbers_naming_flag_and_range() {
    for (args, flag, range) in [
        (
            &["run", "--poll-interval", "0"][..],
            "--poll-interval",
            "1s",
        ),
        (&["run", "--rate-limit", "3e9"][..], "--rate-limit", "1000"),
        (
            &["run", "--silent-samples", "16"][..],
            "--silent-samples",
            "1..=12",
        ),
        (
            &["check", "--polls", "1", "--silent-samples", "16"][..],
            "--silent-samples",
            "1..=12",
        ),
        (
            &["check", "--polls", "1", "--stopped-grace", "1e20"][..],
            "--stopped-grace",
            "366",
        ),
    ] {
        let (code, err) = shim_exit(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(flag) && err.contains(range), "{args:?}: {err}");
    }
    // A good value passes parsing and the command goes on to fail for want of an endpoint.
    let (code, err) = shim_exit(&[
        "check",
        "--polls",
        "1",
        "--request-timeout",
        "2s",
        "--silent-samples",
        "12",
    ]);
    assert_eq!(code, Some(3), "{err}");
    assert!(!err.contains("invalid value"), "{err}");
}
