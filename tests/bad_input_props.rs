//! Bad input (issue 6): property tests of the five surfaces that read external data — the
//! CloudStack response parser, the error envelope, the signer's encoder, the simulator's
//! scenario loader and the condition upsert — plus the regression tests of what fuzzing found.
//!
//! The properties themselves live in `fuzz/src/props.rs`, compiled here and into the fuzz
//! targets (`make fuzz`), so proptest and libFuzzer check the same assertions against the same
//! crates (`cloudstack-api`, `verdict`, `cloudstack-sim`).

#[path = "../fuzz/src/props.rs"]
mod props;

use std::path::PathBuf;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Value};

use capc_health_shim::cloudstack::error::sanitize_text;
use capc_health_shim::cloudstack::model::VirtualMachine;
use capc_health_shim::cloudstack::parse::{parse_list_page, parse_value, Reply};

const KEYS: &[&str] = &[
    "listvirtualmachinesresponse",
    "errorresponse",
    "count",
    "virtualmachine",
    "errorcode",
    "cserrorcode",
    "errortext",
    "uuidList",
    "uuid",
    "id",
    "name",
    "state",
    "nic",
    "ipaddress",
    "isdefault",
    "type",
    "hostcontrolstate",
    "networkkbswrite",
    "created",
    "lastupdated",
    "stats",
    "capability",
    "cloudstackversion",
    "status",
    "conditions",
    "v1beta2",
    "lastTransitionTime",
];

const SCENARIO_KEYS: &[&str] = &[
    "description",
    "settings",
    "accounts",
    "zones",
    "networks",
    "hosts",
    "projects",
    "service_offerings",
    "templates",
    "disk_offerings",
    "vms",
    "faults",
    "name",
    "id",
    "type",
    "api_key",
    "secret_key",
    "role",
    "rules",
    "rule",
    "permission",
    "throttle",
    "max",
    "interval_seconds",
    "enabled",
    "zone",
    "cidr",
    "gateway",
    "control_state",
    "members",
    "cpu_number",
    "memory_mb",
    "disk_size_gb",
    "customized",
    "guest",
    "state",
    "boot_seconds",
    "count",
    "tags",
    "haenable",
    "at_seconds",
    "vm",
    "fault",
    "stats_interval_seconds",
    "default_page_size",
    "default_account",
    "network",
    "host",
    "account",
    "project",
];

const WORDS: &[&str] = &[
    "a",
    "b",
    "admin",
    "Admin",
    "User",
    "Sandbox-simulator",
    "Running",
    "Stopped",
    "nic-down",
    "stop",
    "allow",
    "deny",
    "listVirtualMachines",
    "L2",
    "Shared",
    "10.1.0.0/24",
    "10.0.0.0/31",
    "0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11",
    "True",
    "CloudStackVMHealthy",
    "2026-01-01T00:00:00Z",
    "signature=abc",
    "please retry after [218] ms.",
    "",
    " ",
];

/// JSON built from the given keys and words (and anything else), a few levels deep.
fn json_with(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter_map("finite", |f| f.is_finite().then(|| json!(f))),
        select(WORDS).prop_map(|s| json!(s)),
        any::<String>().prop_map(Value::String),
    ];
    let key = prop_oneof![
        4 => select(keys).prop_map(str::to_string),
        1 => "[a-z_]{0,8}",
    ];
    leaf.prop_recursive(4, 64, 6, move |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            vec((key.clone(), inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn with_mode(mode: u8, data: &[u8]) -> Vec<u8> {
    let mut d = vec![mode];
    d.extend_from_slice(data);
    d
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parser_gives_a_page_or_a_typed_error_for_any_bytes(data in vec(any::<u8>(), 0..600)) {
        props::parser(&with_mode(0, &data));
    }

    #[test]
    fn parser_round_trips_generated_pages(data in vec(any::<u8>(), 0..1024)) {
        props::parser(&with_mode(0xFF, &data));
    }

    #[test]
    fn parser_gives_a_page_or_a_typed_error_for_any_json(
        v in json_with(KEYS),
        status in 0..props::STATUSES.len(),
        ct in 0..props::CONTENT_TYPES.len(),
        wrap in any::<bool>(),
    ) {
        let v = if wrap { json!({ "listvirtualmachinesresponse": v }) } else { v };
        let body = serde_json::to_vec(&v).unwrap();
        props::check_reply(props::STATUSES[status], props::CONTENT_TYPES[ct], &body);
    }

    #[test]
    fn error_envelopes_round_trip(data in vec(any::<u8>(), 0..256)) {
        props::error_envelope(&with_mode(2, &data));
    }

    #[test]
    fn error_texts_are_sanitized_redacted_and_read_back(data in vec(any::<u8>(), 0..512)) {
        props::error_envelope(&with_mode(1, &data));
    }

    #[test]
    fn error_envelope_reader_takes_any_json(v in json_with(KEYS), status in any::<u8>()) {
        let mut d = vec![0, status];
        d.extend(serde_json::to_vec(&json!({ "listvirtualmachinesresponse": v })).unwrap());
        props::error_envelope(&d);
    }

    #[test]
    fn condition_upsert_keeps_one_entry_and_moves_the_time_only_on_a_flip(
        data in vec(any::<u8>(), 0..256),
    ) {
        props::condition_upsert(&data);
    }

    #[test]
    fn condition_read_takes_any_json_machine(v in json_with(KEYS)) {
        let machine = json!({ "status": { "conditions": v.clone(), "v1beta2": { "conditions": v } } });
        props::condition_upsert(&with_mode(0xF0, &serde_json::to_vec(&machine).unwrap()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn encoder_output_is_unreserved_or_percent_xx_and_decodes_back(s in any::<String>()) {
        props::check_encoder(&s);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn signing_is_deterministic_order_and_case_independent_and_an_hmac(
        secret in any::<String>(),
        params in vec(
            (prop_oneof![3 => "[A-Za-z0-9_.]{1,12}", 1 => select(&["signature", "Signature", "command"][..]).prop_map(str::to_string), 1 => any::<String>()],
             any::<String>()),
            0..8,
        ),
    ) {
        props::check_signing(&secret, &params);
    }

    #[test]
    fn signer_takes_any_bytes(data in vec(any::<u8>(), 0..256)) {
        props::signer(&data);
    }

    #[test]
    fn scenario_loader_takes_any_bytes(data in vec(any::<u8>(), 0..256)) {
        props::scenario(&data);
    }

    #[test]
    fn scenario_loader_gives_a_world_or_a_located_error_for_any_text(s in any::<String>()) {
        props::check_scenario(&s);
    }

    #[test]
    fn scenario_loader_gives_a_world_or_a_located_error_for_scenario_shaped_json(
        v in json_with(SCENARIO_KEYS),
    ) {
        props::check_scenario(&v.to_string());
    }
}

fn fixtures(dir: &str) -> Vec<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&d)
        .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("json" | "html")
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_fixture_satisfies_the_properties() {
    for f in fixtures("cloudstack-fixtures/wire") {
        let body = std::fs::read(&f).unwrap();
        let name = f.file_name().unwrap().to_str().unwrap();
        let status = name
            .split('-')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .filter(|_| name.starts_with("error-") || name.starts_with("proxy-"))
            .unwrap_or(200);
        for s in [status, 200] {
            props::check_reply(s, Some("application/json"), &body);
            props::check_reply(s, Some("text/html"), &body);
        }
    }
    for f in fixtures("cloudstack-fixtures/scenarios") {
        props::check_scenario(&std::fs::read_to_string(&f).unwrap());
    }
}

// ---------------------------------------------------------------------------------------------
// Regressions: what fuzzing found (fuzz/src/props.rs names the property each one broke).

/// cloudstack_parse: a byte-order mark followed by a newline before the JSON was `NotJson`
/// ("answered HTTP 200 with application/json instead of JSON").
#[test]
fn regression_bom_then_whitespace_before_the_json_parses() {
    for prefix in ["\u{feff}\n", "\u{feff} ", "\r\n\u{feff}\t"] {
        let body = format!(
            "{prefix}{{\"listvirtualmachinesresponse\":{{\"count\":1,\"virtualmachine\":[{{\"id\":\"a\",\"state\":\"Running\"}}]}}}}"
        );
        let page = parse_list_page::<VirtualMachine>(
            "listVirtualMachines",
            "virtualmachine",
            Reply::json(body.as_bytes()),
        )
        .unwrap_or_else(|e| panic!("{prefix:?}: {e}"));
        assert_eq!((page.count, page.items.len()), (1, 1));
    }
}

/// error_envelope: the envelope reader sanitizes `errortext`, the error sanitizes it again;
/// the second pass stacked a second `<redacted>` (`signature=<redacted><redacted>`) or ate the
/// `…` of a shortened text. Sanitizing is now idempotent and the error keeps the envelope's text.
#[test]
fn regression_sanitizing_twice_keeps_one_redaction_marker() {
    let once = sanitize_text("GET /client/api?signature=AbC%2B&apiKey=k failed", 400);
    assert_eq!(once, "GET /client/api?signature=<redacted>&apiKey=k failed");
    assert_eq!(sanitize_text(&once, 400), once);
    let cut = sanitize_text("retry after signature=abcdef", 30);
    assert_eq!(cut, "retry after signature=<redact…");
    assert_eq!(sanitize_text(&cut, 30), cut);
    let cut = sanitize_text("x signature=abc", 13);
    assert_eq!(cut, "x signature=…");
    assert_eq!(sanitize_text(&cut, 13), cut);
    let exact = sanitize_text("SIGNATURE=zz and more", 21);
    assert_eq!(exact, "SIGNATURE=<redacted>…");
    assert_eq!(sanitize_text(&exact, 21), exact);

    let body = br#"{"listvirtualmachinesresponse":{"errorcode":401,"errortext":"bad request signature=AbC%2B expired"}}"#;
    let e = parse_value("listVirtualMachines", Reply::json(body)).unwrap_err();
    assert_eq!(
        e.detail().unwrap().errortext.as_deref(),
        Some("bad request signature=<redacted> expired")
    );
}

/// cloudstack_parse: counters sent as strings went through f64 and lost digits above 2^53
/// (`"5497853136259320320"` read as 5497853136259319808).
#[test]
fn regression_string_counters_keep_every_digit() {
    let vm: VirtualMachine = serde_json::from_value(json!({
        "id": "a", "state": "Running",
        "networkkbsread": "5497853136259320320",
        "networkkbswrite": " 18446744073709551615 ",
        "jobstatus": "-9007199254740993",
    }))
    .unwrap();
    assert_eq!(vm.networkkbsread, Some(5_497_853_136_259_320_320));
    assert_eq!(vm.networkkbswrite, Some(u64::MAX));
    assert_eq!(vm.jobstatus, Some(-9_007_199_254_740_993));
    // the decimal forms CloudStack also sends still read
    let vm: VirtualMachine =
        serde_json::from_value(json!({"id": "a", "state": "Running", "networkkbsread": "1024.0"}))
            .unwrap();
    assert_eq!(vm.networkkbsread, Some(1024));
}
