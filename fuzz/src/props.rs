//! Properties of the bad-input surfaces (issue 6), shared by the fuzz targets (`fuzz/`) and the
//! proptests (`tests/bad_input_props.rs`). Each entry point takes raw bytes, builds its input
//! from them, runs the code under test and panics when a property does not hold.
//!
//! The code under test comes from the workspace's crates (`cloudstack-api`, `verdict`,
//! `cloudstack-sim`), which both the fuzz crate and the product's tests depend on.

use base64::Engine as _;
use jiff::{tz::TimeZone, Timestamp};
use serde_json::{json, Map, Value};

use capi_model::apis::ConditionLayout;
use capi_model::condition::{apply_body, read};
use cloudstack_api::error::{
    body_snippet, parse_page_size_max, parse_retry_after, parse_unknown_id, sanitize_text,
    CloudStackError, MAX_ERRORTEXT_CHARS, MAX_SNIPPET_CHARS,
};
use cloudstack_api::model::{
    ApiInfo, CsTime, Host, HostControlState, Nic, UsageHistoryVm, VirtualMachine, VmState,
};
use cloudstack_api::parse::{
    parse_capabilities, parse_error_envelope, parse_list_page, parse_value, response_key, ListPage,
    Reply,
};
use cloudstack_api::signing::{
    canonical_string, encoded_query, java_url_encode, java_url_encode_into, sign, sign_canonical,
    signature_matches, signed_query,
};
use cloudstack_sim::scenario::parse_scenario;
use verdict::condition::{is_unchanged, next_condition, whole_seconds, DEFAULT_CONDITION_TYPE};
use verdict::{reason, ConditionState, Status, Verdict};

// ---------------------------------------------------------------------------------------------
// A tiny, total reader of fuzz bytes (no `arbitrary` dependency, so the proptests can use it).

/// Reads choices from bytes; an exhausted input reads as zeros, so every input is valid.
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// A number that is often small: `u64 >> 0..64`.
    pub fn small_u64(&mut self) -> u64 {
        let shift = self.below(64) as u32;
        self.u64() >> shift
    }

    /// `0..n` (0 when `n` is 0); one byte for `n <= 256`, so seeds can name an index.
    pub fn below(&mut self, n: usize) -> usize {
        match n {
            0 => 0,
            1..=256 => self.u8() as usize % n,
            _ => self.u16() as usize % n,
        }
    }

    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }

    /// Up to `max_pieces` pieces of [`PIECES`]: text with the characters and words that
    /// matter to the code under test.
    pub fn text(&mut self, max_pieces: usize) -> String {
        let n = self.below(max_pieces + 1);
        let mut s = String::new();
        for _ in 0..n {
            s.push_str(self.pick(PIECES));
        }
        s
    }

    pub fn opt_text(&mut self, max_pieces: usize) -> Option<String> {
        if self.bool() {
            Some(self.text(max_pieces)).filter(|s| !s.is_empty())
        } else {
            None
        }
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

/// Building blocks of generated text.
pub const PIECES: &[&str] = &[
    "a",
    "Z",
    "k",
    "0",
    "7",
    ".",
    "-",
    "*",
    "_",
    "~",
    " ",
    "  ",
    "+",
    "/",
    "=",
    "&",
    "%",
    "?",
    "#",
    "\"",
    "'",
    "<",
    ">",
    ",",
    ")",
    "[",
    "]",
    ":",
    "\n",
    "\t",
    "\r",
    "\0",
    "\u{7f}",
    "\u{85}",
    "\u{a0}",
    "é",
    "€",
    "😀",
    "\u{200b}",
    "\u{2028}",
    "\u{feff}",
    "K",
    "İ",
    "ſ",
    "signature=",
    "SIGNATURE=",
    "secretKey=",
    "<redacted>",
    "retry after ",
    "please ",
    "ms",
    "page size",
    " value: ",
    "Invalid parameter ",
    "ids ",
    "value=",
    "does not exist",
    "42",
    "4350",
    "0x",
    "0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11",
    "Running",
    "True",
    "null",
    "{",
    "}",
];

/// Every label [`CloudStackError::kind`] returns.
pub const ERROR_KINDS: &[&str] = &[
    "unauthorized",
    "throttled",
    "invalid_parameter",
    "not_allowed",
    "server_error",
    "api_error",
    "transport",
    "timeout",
    "not_json",
    "malformed",
    "config",
    "unsupported",
];

/// HTTP statuses a reply may come with (index 0 = 200, for seeds).
pub const STATUSES: &[u16] = &[
    200, 200, 201, 204, 301, 400, 401, 404, 429, 431, 432, 500, 502, 503, 530, 537, 99, 0, 999,
    65535,
];

/// Content types a reply may come with (index 0 = JSON, for seeds).
pub const CONTENT_TYPES: &[Option<&str>] = &[
    Some("application/json"),
    Some("application/json; charset=UTF-8"),
    Some("text/javascript"),
    Some("text/html"),
    None,
    Some(""),
    Some("\u{1}JSON\nwith\u{85}controls"),
];

// ---------------------------------------------------------------------------------------------
// Shared checks.

fn no_controls(s: &str) -> bool {
    !s.chars().any(char::is_control)
}

fn chars(s: &str) -> usize {
    s.chars().count()
}

/// Every `signature=` / `secretkey=` (any case) in `s` is followed by `<redacted>` (or by a
/// prefix of it cut by the `…` of a shortened text).
pub fn check_redacted(s: &str) {
    let lower = s.to_ascii_lowercase();
    for name in ["signature=", "secretkey="] {
        let mut from = 0;
        while let Some(p) = lower[from..].find(name) {
            let at = from + p + name.len();
            let rest = &s[at..];
            let ok = rest.starts_with("<redacted>")
                || rest
                    .find('…')
                    .is_some_and(|k| "<redacted>".starts_with(&rest[..k]));
            assert!(ok, "an unredacted {name} value in {s:?}");
            from = at;
        }
    }
}

/// A text the error taxonomy keeps: sanitized (no control characters, no whitespace runs,
/// secrets redacted), at most `max` characters, and stable under sanitizing again.
pub fn check_kept_text(t: &str, max: usize) {
    assert!(chars(t) <= max, "{} chars > {max}: {t:?}", chars(t));
    assert!(no_controls(t), "control characters in {t:?}");
    check_redacted(t);
    assert_eq!(
        sanitize_text(t, max),
        t,
        "sanitizing kept text again changes it"
    );
}

/// Any error the parser returns: a known kind, a printable message, bounded server text.
pub fn check_error(e: &CloudStackError, status: u16) {
    assert!(ERROR_KINDS.contains(&e.kind()), "{e:?}");
    let shown = e.to_string();
    assert!(!shown.is_empty());
    assert!(no_controls(&shown), "control characters in {shown:?}");
    check_redacted(&shown);
    if let Some(d) = e.detail() {
        if let Some(t) = &d.errortext {
            assert!(!t.is_empty());
            check_kept_text(t, MAX_ERRORTEXT_CHARS);
        }
    }
    match e {
        CloudStackError::NotJson {
            status: s,
            content_type,
            snippet,
        } => {
            assert_eq!(*s, status);
            check_kept_text(snippet, MAX_SNIPPET_CHARS);
            if let Some(ct) = content_type {
                check_kept_text(ct, 80);
            }
        }
        CloudStackError::Malformed { detail } => check_kept_text(detail, MAX_ERRORTEXT_CHARS),
        CloudStackError::Transport { .. }
        | CloudStackError::Timeout { .. }
        | CloudStackError::Config { .. }
        | CloudStackError::Unsupported { .. } => panic!("the parser never builds {e:?}"),
        _ => {}
    }
}

fn check_page<T>(status: u16, r: &Result<ListPage<T>, CloudStackError>) {
    match r {
        Ok(p) => {
            assert!((200..300).contains(&status), "a page from HTTP {status}");
            assert_eq!(p.items.len() + p.failures.len(), p.received);
            for w in p.failures.windows(2) {
                assert!(w[0].index < w[1].index, "failures out of order");
            }
            for f in &p.failures {
                assert!(f.index < p.received);
                check_kept_text(&f.reason, 200);
                if let Some(id) = &f.id {
                    check_kept_text(id, 80);
                }
            }
            if !p.count_present {
                assert_eq!(p.count, 0);
            }
        }
        Err(e) => check_error(e, status),
    }
}

// ---------------------------------------------------------------------------------------------
// (1) The response parser: parse.rs + model.rs.

/// Fuzz entry: mode byte ≥ 0xC0 → a generated page that must round-trip; otherwise
/// `[mode, status index, content-type index, body…]` through every parser.
pub fn parser(data: &[u8]) {
    let mut b = Bytes::new(data);
    if b.u8() >= 0xC0 {
        return page_round_trip(&mut b);
    }
    let status = b.pick(STATUSES);
    let ct = b.pick(CONTENT_TYPES);
    check_reply(status, ct, b.rest());
}

/// Any reply through every parser: `Ok` only for 2xx, otherwise a clean typed error; the
/// parsers agree on bodies that are not JSON and on error envelopes.
pub fn check_reply(status: u16, ct: Option<&str>, body: &[u8]) {
    let reply = Reply::new(status, ct, body);
    let value = parse_value("listVirtualMachines", reply);
    match &value {
        Ok(v) => {
            assert!((200..300).contains(&status));
            assert!(v.is_object());
        }
        Err(e) => check_error(e, status),
    }
    let not_json = value
        .as_ref()
        .err()
        .filter(|e| e.kind() == "not_json")
        .cloned();
    macro_rules! page {
        ($t:ty, $cmd:expr, $key:expr) => {{
            let r = parse_list_page::<$t>($cmd, $key, reply);
            check_page(status, &r);
            if let Some(nj) = &not_json {
                assert_eq!(
                    r.as_ref().err(),
                    Some(nj),
                    "parsers disagree on a non-JSON body"
                );
            }
        }};
    }
    page!(VirtualMachine, "listVirtualMachines", "virtualmachine");
    page!(
        VirtualMachine,
        "listVirtualMachinesMetrics",
        "virtualmachine"
    );
    page!(
        UsageHistoryVm,
        "listVirtualMachinesUsageHistory",
        "virtualmachine"
    );
    page!(Host, "listHosts", "host");
    page!(ApiInfo, "listApis", "api");
    page!(Nic, "listNics", "nic");
    page!(Value, "listVirtualMachines", "virtualmachine");
    match parse_capabilities(reply) {
        Ok(_) => assert!((200..300).contains(&status)),
        Err(e) => check_error(&e, status),
    }
    if let Some(env) = parse_error_envelope("listVirtualMachines", reply) {
        assert!(env.errorcode >= 100 || env.errorcode == status);
        if let Some(t) = &env.errortext {
            check_kept_text(t, MAX_ERRORTEXT_CHARS);
        }
        assert_eq!(
            value.as_ref().err(),
            Some(&env.clone().into_error()),
            "an error envelope is the parse result"
        );
    }
}

const KNOWN_STATES: &[&str] = &[
    "Starting",
    "Running",
    "Stopping",
    "Stopped",
    "Destroyed",
    "Expunging",
    "Migrating",
    "Error",
    "Unknown",
    "Shutdown",
    "Restoring",
];

const HOST_STATES: &[&str] = &["Enabled", "Disabled", "Offline", "Maintenance", "Unknown"];

/// Items that do not parse as a VM (no id, no state, wrong types, not an object).
const BAD_ITEMS: &[&str] = &[
    r#"{"id":"x"}"#,
    r#"{"state":"Running"}"#,
    r#"{"id":"y","state":5}"#,
    r#"{"id":7,"state":"Running"}"#,
    r#"{"id":"z","state":null}"#,
    r#"[]"#,
    r#""vm""#,
    r#"null"#,
    r#"{"id":"w","state":"Running","nic":[{"isdefault":true},"eth0"]}"#,
];

fn gen_time(b: &mut Bytes<'_>) -> CsTime {
    // 1970 … 2199, whole seconds: the dates the parser accepts (later ones are refused, see
    // `CsTime::parse`; the any-bytes properties cover them).
    let secs = (b.u64() % 7_258_118_400) as i64;
    CsTime(Timestamp::from_second(secs).expect("in range"))
}

/// `t` in one of the forms CloudStack and its proxies send.
fn time_json(b: &mut Bytes<'_>, t: &CsTime) -> Value {
    let offset_minutes = (b.below(105) as i32 - 48) * 15; // -12:00 … +14:00
    let offset = jiff::tz::Offset::from_seconds(offset_minutes * 60).expect("valid offset");
    let zoned = t.0.to_zoned(TimeZone::fixed(offset));
    let s = match b.below(5) {
        0 => t.to_cloudstack_string(),
        1 => zoned.strftime("%Y-%m-%dT%H:%M:%S%z").to_string(),
        2 => t.0.to_string(),
        3 => zoned.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string(),
        _ => format!(" {} ", t.to_cloudstack_string()),
    };
    Value::String(s)
}

fn gen_nic(b: &mut Bytes<'_>) -> Nic {
    Nic {
        id: b.opt_text(4),
        networkid: b.opt_text(3),
        networkname: b.opt_text(3),
        ipaddress: b.opt_text(3),
        ip6address: b.opt_text(3),
        isdefault: b.bool(),
        traffictype: b.opt_text(2),
        network_type: b.opt_text(2),
        macaddress: b.opt_text(3),
    }
}

fn gen_vm(b: &mut Bytes<'_>, i: usize) -> VirtualMachine {
    let state = if b.bool() {
        VmState::parse(b.pick(KNOWN_STATES))
    } else {
        VmState::parse(&b.text(3))
    };
    let hostcontrolstate = match b.below(3) {
        0 => None,
        1 => Some(HostControlState::parse(b.pick(HOST_STATES))),
        _ => Some(HostControlState::parse(&b.text(3))),
    };
    let opt_u64 = |b: &mut Bytes<'_>| b.bool().then(|| b.small_u64());
    let n_nics = b.below(4);
    VirtualMachine {
        id: format!("vm-{i}-{}", b.text(3)),
        name: b.text(4),
        displayname: b.opt_text(4),
        state,
        zoneid: b.opt_text(3),
        zonename: b.opt_text(3),
        account: b.opt_text(3),
        domainid: b.opt_text(3),
        projectid: b.opt_text(3),
        hostid: b.opt_text(3),
        hostname: b.opt_text(3),
        hostcontrolstate,
        haenable: b.bool().then(|| b.bool()),
        created: b.bool().then(|| gen_time(b)),
        lastupdated: b.bool().then(|| gen_time(b)),
        nics: (0..n_nics).map(|_| gen_nic(b)).collect(),
        networkkbswrite: opt_u64(b),
        networkkbsread: opt_u64(b),
        cpuused: b.opt_text(3),
        jobid: b.opt_text(3),
        jobstatus: b.bool().then(|| b.u64() as i64 >> b.below(64)),
        hypervisor: b.opt_text(3),
        templatename: None,
        serviceofferingname: None,
    }
}

/// Rewrites a serialized field into another wire form CloudStack uses for the same value.
fn vary(b: &mut Bytes<'_>, key: &str, v: &mut Value) {
    match v {
        // numbers as strings
        Value::Number(n) if b.bool() => *v = Value::String(n.to_string()),
        // booleans as strings
        Value::Bool(x) if b.bool() => {
            *v = Value::String(if b.bool() {
                x.to_string()
            } else {
                x.to_string().to_uppercase()
            })
        }
        // digit-only text as a number
        Value::String(s)
            if !matches!(key, "id" | "name" | "hostcontrolstate")
                && s.parse::<u64>().is_ok_and(|n| n.to_string() == *s)
                && b.bool() =>
        {
            *v = json!(s.parse::<u64>().unwrap());
        }
        _ => {}
    }
}

fn vm_json(b: &mut Bytes<'_>, vm: &VirtualMachine) -> Value {
    let mut v = serde_json::to_value(vm).expect("a VM serializes");
    let obj = v.as_object_mut().expect("an object");
    for key in ["created", "lastupdated"] {
        if let Some(t) = key_time(vm, key) {
            obj.insert(key.to_string(), time_json(b, &t));
        }
    }
    for (k, field) in obj.iter_mut() {
        if k != "created" && k != "lastupdated" && k != "state" && k != "nic" {
            vary(b, k, field);
        }
    }
    if let Some(Value::Array(nics)) = obj.get_mut("nic") {
        for nic in nics.iter_mut() {
            for (k, field) in nic.as_object_mut().expect("an object").iter_mut() {
                vary(b, k, field);
            }
        }
        if nics.len() == 1 && b.bool() {
            // a single NIC object instead of an array
            let one = nics.pop().expect("one");
            obj.insert("nic".into(), one);
        } else if nics.is_empty() && b.bool() {
            obj.remove("nic");
        }
    }
    if b.bool() {
        // fields a newer CloudStack adds
        obj.insert("brandnewfield".into(), json!({"x": [1, "two", null]}));
        obj.insert("details".into(), json!(b.text(3)));
    }
    v
}

fn key_time(vm: &VirtualMachine, key: &str) -> Option<CsTime> {
    match key {
        "created" => vm.created,
        _ => vm.lastupdated,
    }
}

/// A generated page (VMs in varied wire forms, unreadable items at known positions, a
/// wrapper CloudStack or a recording uses) parses back to exactly the VMs, the unreadable
/// items reported at their positions, and the page's `count`.
fn page_round_trip(b: &mut Bytes<'_>) {
    let n = b.below(6);
    let vms: Vec<VirtualMachine> = (0..n).map(|i| gen_vm(b, i)).collect();
    let mut items: Vec<Value> = vms.iter().map(|vm| vm_json(b, vm)).collect();
    let mut bad_positions: Vec<usize> = Vec::new();
    for _ in 0..b.below(3) {
        let pos = b.below(items.len() + 1);
        let bad: Value = serde_json::from_str(b.pick(BAD_ITEMS)).expect("valid JSON");
        items.insert(pos, bad);
        for p in bad_positions.iter_mut() {
            if *p >= pos {
                *p += 1;
            }
        }
        bad_positions.push(pos);
    }
    bad_positions.sort_unstable();
    let received = items.len();
    let count = b.bool().then(|| b.small_u64());
    let mut inner = Map::new();
    if let Some(c) = count {
        inner.insert(
            "count".into(),
            if b.bool() {
                json!(c)
            } else {
                json!(c.to_string())
            },
        );
    }
    if !(items.is_empty() && b.bool()) {
        // one object may come bare instead of in an array
        let list = if items.len() == 1 && items[0].is_object() && b.bool() {
            items.pop().expect("one")
        } else {
            Value::Array(items)
        };
        inner.insert("virtualmachine".into(), list);
    }
    let body = match b.below(5) {
        0 => json!({ "listvirtualmachinesresponse": inner }),
        1 => json!({ "LISTVIRTUALMACHINESRESPONSE": inner }),
        2 => json!({ "listVirtualMachines": inner }),
        3 => json!({ "listvmsresp": inner }),
        _ => Value::Object(inner),
    };
    let mut bytes = b
        .pick(&["", " \n", "\u{feff}", "\u{feff}\n", "\r\n\u{feff}"])
        .as_bytes()
        .to_vec();
    bytes.extend(serde_json::to_vec(&body).expect("serializes"));
    bytes.extend(b.pick(&["", "\n", "  \r\n"]).as_bytes());

    let page = parse_list_page::<VirtualMachine>(
        "listVirtualMachines",
        "virtualmachine",
        Reply::json(&bytes),
    )
    .unwrap_or_else(|e| {
        panic!(
            "a valid page does not parse: {e}\n{}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert_eq!(page.items, vms, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(
        page.failures.iter().map(|f| f.index).collect::<Vec<_>>(),
        bad_positions,
        "unreadable items are reported at their positions"
    );
    assert_eq!(page.received, received);
    assert_eq!(page.count_present, count.is_some());
    assert_eq!(page.count, count.unwrap_or(0));
}

// ---------------------------------------------------------------------------------------------
// (2) The error envelope and the error taxonomy: error.rs (+ the envelope reader of parse.rs).

/// Fuzz entry: `[mode, …]`; mode % 3 = 0: `[status index, body…]` through the envelope
/// reader; 1: server text through the text helpers; 2: a generated envelope that must
/// round-trip.
pub fn error_envelope(data: &[u8]) {
    let mut b = Bytes::new(data);
    match b.u8() % 3 {
        0 => {
            let status = b.pick(STATUSES);
            let body = b.rest();
            check_reply(status, Some("application/json"), body);
            for cmd in ["listApis", "listCapabilities", "errorresponse"] {
                if let Some(env) = parse_error_envelope(cmd, Reply::new(status, None, body)) {
                    let e = env.clone().into_error();
                    check_error(&e, status);
                    assert_eq!(e.code(), Some(env.errorcode));
                }
            }
        }
        1 => error_text(&mut b),
        _ => envelope_round_trip(&mut b),
    }
}

fn error_text(b: &mut Bytes<'_>) {
    let text = b.text(40);
    let max = 1 + b.below(500);
    let s = sanitize_text(&text, max);
    check_kept_text(&s, max);
    assert!(
        !s.contains("  ") && !s.starts_with(' ') && !s.ends_with(' '),
        "{s:?}"
    );

    let lower = text.to_ascii_lowercase();
    if parse_retry_after(&text).is_some() {
        assert!(lower.contains("retry after"));
    }
    if parse_page_size_max(&text).is_some() {
        assert!(lower.contains("page size value"));
    }
    if let Some(id) = parse_unknown_id(&text) {
        assert!(!id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
    }

    // the numbers and ids CloudStack puts in its texts are read back
    let n = b.small_u64();
    if !lower.contains("retry after") {
        let (lb, rb) = if b.bool() { ("[", "]") } else { ("", "") };
        let unit = b.pick(&["ms", "milliseconds", "s", ""]);
        let t = format!("{text}please retry after {lb}{n}{rb} {unit}.");
        let want = if unit == "s" {
            std::time::Duration::from_secs(n)
        } else {
            std::time::Duration::from_millis(n)
        };
        assert_eq!(parse_retry_after(&t), Some(want), "{t:?}");
    }
    if !lower.contains("page size value") {
        let t = format!("{text}Page size can't exceed max allowed page size value: {n}");
        let want = u32::try_from(n).ok().filter(|n| *n > 0);
        assert_eq!(parse_page_size_max(&t), want, "{t:?}");
    }
    if !lower.contains("invalid parameter ") {
        let u = b.u64();
        let id = format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            u >> 32,
            (u >> 16) & 0xffff,
            u & 0xffff,
            b.u16(),
            b.u64() & 0xffff_ffff_ffff
        );
        let t =
            format!("{text}Invalid parameter ids value={id} due to incorrect long value format");
        assert_eq!(parse_unknown_id(&t), Some(id), "{t:?}");
    }

    let snippet = body_snippet(text.as_bytes());
    check_kept_text(&snippet, MAX_SNIPPET_CHARS);
    // every `<` left is a (maybe shortened) `<redacted>`, never a tag
    for (at, _) in snippet.match_indices('<') {
        let rest = &snippet[at..];
        let ok = rest.starts_with("<redacted>")
            || rest
                .strip_suffix('…')
                .is_some_and(|cut| "<redacted>".starts_with(cut));
        assert!(ok, "a tag survived: {snippet:?}");
    }
    let raw = b.rest();
    check_kept_text(&body_snippet(raw), MAX_SNIPPET_CHARS);

    // any code: the typed error keeps it and says whether a retry can help
    let code = b.u16();
    let cs = b.bool().then(|| b.u32());
    let unknown = b.bool();
    let e = CloudStackError::from_code(code, cs, Some(&text), unknown);
    check_error(&e, code);
    assert_eq!(e.code(), Some(code));
    let want_kind = match code {
        401 => "unauthorized",
        429 => "throttled",
        431 => "invalid_parameter",
        432 => "not_allowed",
        500..=599 => "server_error",
        _ => "api_error",
    };
    assert_eq!(e.kind(), want_kind);
    assert_eq!(e.is_retryable(), matches!(code, 429 | 500..=599));
    if code == 429 {
        assert_eq!(e.retry_after(), parse_retry_after(&text));
    }
    if code == 401 && unknown {
        assert!(e.is_command_unavailable());
    }

    // redaction removes what it is told to from every free-text field
    let needle: String = (0..4 + b.below(12))
        .map(|_| b.pick(b"Az09+/=%") as char)
        .collect();
    if !"<redacted>".contains(&needle) {
        let t = format!("{text}{needle}{}", b.text(3));
        for e in [
            CloudStackError::from_code(code, cs, Some(&t), unknown),
            CloudStackError::Transport { detail: t.clone() },
            CloudStackError::Malformed {
                detail: sanitize_text(&t, MAX_ERRORTEXT_CHARS),
            },
            CloudStackError::NotJson {
                status: code,
                content_type: Some(t.clone()),
                snippet: t.clone(),
            },
        ] {
            let r = e.redact(&[needle.as_str(), "x"]);
            let texts: Vec<String> = match &r {
                CloudStackError::Transport { detail } | CloudStackError::Malformed { detail } => {
                    vec![detail.clone()]
                }
                CloudStackError::NotJson {
                    content_type,
                    snippet,
                    ..
                } => vec![snippet.clone(), content_type.clone().unwrap_or_default()],
                other => other
                    .detail()
                    .and_then(|d| d.errortext.clone())
                    .into_iter()
                    .collect(),
            };
            for t in texts {
                assert!(!t.contains(&needle), "{needle:?} survived redaction: {t:?}");
            }
        }
    }
}

fn envelope_round_trip(b: &mut Bytes<'_>) {
    let command = b.pick(&[
        "listVirtualMachines",
        "listApis",
        "listCapabilities",
        "listVirtualMachinesUsageHistory",
    ]);
    let status = b.pick(STATUSES);
    let mut inner = Map::new();
    let fallback = if (200..300).contains(&status) {
        530
    } else {
        status
    };
    let code = b.u16();
    let want_code = match b.below(5) {
        0 => {
            inner.insert("errorcode".into(), json!(code));
            if code >= 100 {
                code
            } else {
                fallback
            }
        }
        1 => {
            inner.insert("errorcode".into(), json!(format!(" {code} ")));
            if code >= 100 {
                code
            } else {
                fallback
            }
        }
        2 => fallback,
        3 => {
            inner.insert(
                "errorcode".into(),
                b.pick(&[
                    json!("x"),
                    json!(null),
                    json!(-431),
                    json!(4.31e2),
                    json!(70000),
                ]),
            );
            fallback
        }
        _ => {
            inner.insert("errorcode".into(), json!(u64::from(b.u32()) + 65536));
            fallback
        }
    };
    let cs = b.u64() >> b.below(64);
    let want_cs = match b.below(4) {
        0 => None,
        1 => {
            inner.insert("cserrorcode".into(), json!(cs));
            u32::try_from(cs).ok().filter(|c| *c != 0)
        }
        2 => {
            inner.insert("cserrorcode".into(), json!(cs.to_string()));
            u32::try_from(cs).ok().filter(|c| *c != 0)
        }
        _ => {
            inner.insert("cserrorcode".into(), json!([cs]));
            None
        }
    };
    let text = b.text(30);
    let want_text = match b.below(4) {
        0 => None,
        1 => {
            inner.insert("errortext".into(), Value::Null);
            None
        }
        2 => {
            inner.insert("errortext".into(), json!(text));
            Some(sanitize_text(&text, MAX_ERRORTEXT_CHARS))
        }
        _ => {
            let v = json!({ "message": text });
            inner.insert("errortext".into(), v.clone());
            Some(sanitize_text(&v.to_string(), MAX_ERRORTEXT_CHARS))
        }
    };
    let mut uuids = Vec::new();
    let mut list = Vec::new();
    for i in 0..b.below(4) {
        let u = format!("uuid-{i}-{}", b.text(2));
        match b.below(4) {
            0 => {
                list.push(json!(u));
                uuids.push(u);
            }
            1 => {
                list.push(json!({ "uuid": u, "description": b.text(2) }));
                uuids.push(u);
            }
            2 => list.push(json!({ "description": u })),
            _ => list.push(json!(i)),
        }
    }
    if b.bool() || !list.is_empty() {
        inner.insert("uuidList".into(), Value::Array(list));
    }
    let is_envelope = inner.contains_key("errorcode") || inner.contains_key("errortext");
    let (wrapper, body) = match b.below(5) {
        0 => {
            let k = response_key(command);
            (Some(k.clone()), json!({ k: inner }))
        }
        1 => (
            Some("errorresponse".to_string()),
            json!({ "errorresponse": inner }),
        ),
        2 => (Some(command.to_string()), json!({ command: inner })),
        3 => (
            Some("someresponse".to_string()),
            json!({ "someresponse": inner }),
        ),
        _ => (None, Value::Object(inner)),
    };
    let bytes = serde_json::to_vec(&body).expect("serializes");
    let reply = Reply::new(status, b.pick(CONTENT_TYPES), &bytes);
    let env = parse_error_envelope(command, reply);
    if !is_envelope {
        assert_eq!(env, None, "{body}");
        return;
    }
    let env = env.unwrap_or_else(|| panic!("no envelope in {body}"));
    assert_eq!(env.errorcode, want_code, "{body}");
    assert_eq!(env.cserrorcode, want_cs, "{body}");
    assert_eq!(env.errortext, want_text, "{body}");
    assert_eq!(env.uuids, uuids, "{body}");
    assert_eq!(env.wrapper, wrapper, "{body}");
    let e = parse_value(command, reply).expect_err("an envelope is an error");
    assert_eq!(e, env.clone().into_error());
    check_error(&e, status);
    assert_eq!(e.code(), Some(want_code));
    let detail = e.detail().expect("built from an envelope");
    assert_eq!(detail.cserrorcode, want_cs);
    assert_eq!(
        detail.errortext,
        want_text.filter(|t| !t.is_empty()),
        "the error keeps the server's text as the envelope read it"
    );
    if want_code == 401 && env.wrapper.as_deref() == Some("errorresponse") {
        assert!(e.is_command_unavailable());
    }
}

// ---------------------------------------------------------------------------------------------
// (3) The signer: signing.rs.

/// Fuzz entry: `secret 0xFF name=value 0xFF name=value …` (0xFF never occurs in UTF-8).
pub fn signer(data: &[u8]) {
    let mut parts = data.split(|&b| b == 0xFF);
    let secret = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let params: Vec<(String, String)> = parts
        .map(|p| {
            let s = String::from_utf8_lossy(p);
            match s.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (s.into_owned(), String::new()),
            }
        })
        .collect();
    check_encoder(&secret);
    check_signing(&secret, &params);
}

fn is_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'*' | b'_')
}

/// Decodes `%XX` (uppercase hex) and the unreserved characters; `None` for anything else.
pub fn java_url_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            if !hex
                .iter()
                .all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(c))
            {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else if is_safe(b[i]) {
            out.push(b[i]);
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

/// The encoder's output is only unreserved characters and `%XX`, decodes back to the input,
/// keeps unreserved bytes as they are, and appends.
pub fn check_encoder(v: &str) {
    let e = java_url_encode(v);
    let decoded = java_url_decode(&e).unwrap_or_else(|| panic!("not [A-Za-z0-9.*_-] + %XX: {e:?}"));
    assert_eq!(decoded, v.as_bytes(), "{e:?} does not decode to {v:?}");
    let want_len: usize = v.bytes().map(|b| if is_safe(b) { 1 } else { 3 }).sum();
    assert_eq!(e.len(), want_len);
    let mut out = String::from("x=");
    java_url_encode_into(&mut out, v);
    assert_eq!(out, format!("x={e}"));
}

/// HMAC-SHA1 from its definition (RFC 2104), independent of the `hmac` crate.
fn reference_hmac_sha1(key: &[u8], msg: &[u8]) -> [u8; 20] {
    use sha1::{Digest, Sha1};
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..20].copy_from_slice(&Sha1::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha1::new().chain_update(&ipad).chain_update(msg).finalize();
    let outer = Sha1::new()
        .chain_update(&opad)
        .chain_update(inner)
        .finalize();
    let mut out = [0u8; 20];
    out.copy_from_slice(&outer);
    out
}

fn is_api_name(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'[' | b']'))
}

/// The signer: the wire query is `name=enc(value)` sorted by name without `signature`, the
/// canonical string is it lowercased, the signature is Base64(HMAC-SHA1) of that and is
/// deterministic, independent of the parameter order and of the values' ASCII case.
pub fn check_signing(secret: &str, params: &[(String, String)]) {
    for (k, v) in params {
        check_encoder(k);
        check_encoder(v);
    }
    let refs: Vec<(&str, &str)> = params
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let query = encoded_query(refs.iter().copied());
    let canonical = canonical_string(refs.iter().copied());
    assert_eq!(canonical, query.to_lowercase());

    if params.iter().all(|(k, _)| is_api_name(k)) {
        let mut kept: Vec<(&str, &str)> = refs
            .iter()
            .copied()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("signature"))
            .collect();
        kept.sort_by(|a, b| a.0.cmp(b.0));
        let pairs: Vec<(String, Vec<u8>)> = if query.is_empty() {
            Vec::new()
        } else {
            query
                .split('&')
                .map(|p| {
                    let (k, v) = p.split_once('=').expect("name=value");
                    (k.to_string(), java_url_decode(v).expect("encoded value"))
                })
                .collect()
        };
        let want: Vec<(String, Vec<u8>)> = kept
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(pairs, want, "the query is the sorted, encoded parameters");
        assert!(canonical
            .bytes()
            .all(|c| c.is_ascii() && !c.is_ascii_uppercase()));
    }

    let sig = sign(secret, refs.iter().copied());
    assert_eq!(sig, sign(secret, refs.iter().copied()), "deterministic");
    assert_eq!(sig, sign_canonical(secret, &canonical));
    let want = base64::engine::general_purpose::STANDARD
        .encode(reference_hmac_sha1(secret.as_bytes(), canonical.as_bytes()));
    assert_eq!(sig.expose(), want, "Base64(HMAC-SHA1(secret, canonical))");

    let mut names: Vec<&str> = refs.iter().map(|(k, _)| *k).collect();
    names.sort_unstable();
    names.dedup();
    if names.len() == refs.len() {
        let reversed: Vec<(&str, &str)> = refs.iter().rev().copied().collect();
        assert_eq!(
            sign(secret, reversed),
            sig,
            "parameter order does not matter"
        );
    }
    let upper: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (k.clone(), v.to_ascii_uppercase()))
        .collect();
    assert_eq!(
        sign(secret, upper.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        sig,
        "the server lowercases the canonical string"
    );

    assert!(signature_matches(&sig, sig.expose()));
    let mut wrong = sig.expose().to_string();
    let first = if wrong.starts_with('A') { "B" } else { "A" };
    wrong.replace_range(..1, first);
    assert!(!signature_matches(&sig, &wrong));
    assert!(!signature_matches(&sig, ""));
    assert!(!format!("{sig:?}{sig}").contains(sig.expose()));

    let signed = signed_query(secret, refs.iter().copied());
    assert_eq!(
        signed,
        format!("{query}&signature={}", java_url_encode(sig.expose()))
    );
}

// ---------------------------------------------------------------------------------------------
// (4) The simulator's scenario loader: sim/scenario.rs.

pub const SCENARIO_FILE: &str = "fuzz.json";
const START_MS: i64 = 1_800_000_000_000;

/// Fuzz entry: the bytes as scenario text.
pub fn scenario(data: &[u8]) {
    check_scenario(&String::from_utf8_lossy(data));
}

/// Any text: a world, or an error naming the file, a JSON path and a reason. A world holds
/// what the scenario asked for (every VM, every fault in time order) plus the defaults.
pub fn check_scenario(text: &str) {
    let keys = ("fuzz-api-key", "fuzz-secret-key");
    match parse_scenario(text, SCENARIO_FILE, START_MS, keys) {
        Err(e) => {
            assert_eq!(e.file, SCENARIO_FILE);
            assert!(e.path.starts_with('$'), "{e}");
            assert!(!e.message.is_empty(), "{e}");
            assert_eq!(
                e.to_string(),
                format!("{}: {}: {}", e.file, e.path, e.message)
            );
            if serde_json::from_str::<Value>(text).is_err() {
                assert_eq!(e.path, "$");
                assert!(e.message.starts_with("not valid JSON"), "{e}");
            }
            let again = parse_scenario(text, SCENARIO_FILE, START_MS, keys).unwrap_err();
            assert_eq!(again.path, e.path, "deterministic");
        }
        Ok(w) => {
            let v: Value = serde_json::from_str(text).expect("a world from valid JSON");
            assert!(!w.zones.is_empty() && !w.networks.is_empty() && !w.hosts.is_empty());
            assert!(!w.accounts.is_empty());
            let vms = v
                .get("vms")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let want: u64 = vms
                .iter()
                .map(|vm| vm.get("count").and_then(Value::as_u64).unwrap_or(1))
                .sum();
            assert_eq!(w.vms().len() as u64, want, "every VM of the scenario");
            for vm in &vms {
                if vm.get("count").and_then(Value::as_u64).unwrap_or(1) == 1 {
                    let name = vm["name"].as_str().expect("a VM has a name").trim();
                    let idx = w
                        .vm_index(name)
                        .unwrap_or_else(|| panic!("VM {name:?} missing"));
                    if let Some(id) = vm.get("id").and_then(Value::as_str) {
                        assert_eq!(w.vms()[idx].id, id);
                    }
                }
            }
            let faults = v
                .get("faults")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let pending = w.pending_faults();
            assert_eq!(pending.len(), faults, "every fault is scheduled");
            assert!(pending.windows(2).all(|f| f[0].at_ms <= f[1].at_ms));
            assert!(pending
                .iter()
                .all(|f| f.at_ms >= START_MS && f.vm < w.vms().len()));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// (5) The condition upsert: k8s/conditions.rs (read, SSA body) with verdict::condition.

const OTHER_TYPES: &[&str] = &[
    "Ready",
    "InfrastructureReady",
    "BootstrapReady",
    "HealthCheckSucceeded",
    "OwnerRemediated",
    "Deleting",
    "cloudstackvmhealthy",
    "",
];

fn gen_ltt(b: &mut Bytes<'_>) -> Option<Value> {
    let t = Timestamp::from_second(1_500_000_000 + i64::from(b.u32())).expect("in range");
    match b.below(7) {
        0 => None,
        1 => Some(json!(t.to_string())),
        2 => Some(json!(format!(
            "{}",
            t + jiff::SignedDuration::from_millis(123)
        ))),
        3 => Some(json!(t
            .to_zoned(TimeZone::fixed(jiff::tz::offset(5)))
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string())),
        4 => Some(json!("yesterday")),
        5 => Some(json!(t.as_second())),
        _ => Some(json!(t.to_string())),
    }
}

fn gen_entry(b: &mut Bytes<'_>, ty: &str) -> Value {
    let mut e = Map::new();
    e.insert("type".into(), json!(ty));
    match b.below(8) {
        0 => {}
        1 => {
            e.insert("status".into(), json!(1));
        }
        2 => {
            e.insert("status".into(), json!(b.pick(&["Maybe", "true", ""])));
        }
        _ => {
            e.insert(
                "status".into(),
                json!(b.pick(&["True", "False", "Unknown"])),
            );
        }
    }
    if let Some(t) = gen_ltt(b) {
        e.insert("lastTransitionTime".into(), t);
    }
    if b.below(4) != 0 {
        e.insert("reason".into(), json!(b.pick(reason::ALL)));
    }
    if b.bool() {
        e.insert("message".into(), json!(b.text(4)));
    }
    if b.bool() {
        e.insert("observedGeneration".into(), json!(b.u8()));
    }
    Value::Object(e)
}

/// What `read` must return for `list`: the first entry of the type, when its status is one of
/// the three and its time parses.
fn expected_read(list: &[Value], ty: &str) -> Option<ConditionState> {
    let c = list
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))?;
    let status = match c.get("status")?.as_str()? {
        "True" => Status::True,
        "False" => Status::False,
        "Unknown" => Status::Unknown,
        _ => return None,
    };
    let ltt: Timestamp = c.get("lastTransitionTime")?.as_str()?.parse().ok()?;
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    Some(ConditionState {
        type_: ty.to_string(),
        status,
        reason: s("reason"),
        message: s("message"),
        last_transition_time: ltt,
    })
}

fn machine_with(layout: ConditionLayout, list: &[Value], decoy: &[Value]) -> Value {
    let mut m = json!({
        "apiVersion": layout.api_version(),
        "kind": "Machine",
        "metadata": {"name": "m", "namespace": "ns"},
        "status": {"phase": "Provisioned"},
    });
    let status = m["status"].as_object_mut().expect("an object");
    match layout {
        ConditionLayout::V1Beta1WithV1Beta2Conditions => {
            // the legacy clusterv1 list next to the metav1 one
            status.insert("conditions".into(), Value::Array(decoy.to_vec()));
            status.insert("v1beta2".into(), json!({ "conditions": list }));
        }
        ConditionLayout::V1Beta2 => {
            status.insert("conditions".into(), Value::Array(list.to_vec()));
            status.insert(
                "deprecated".into(),
                json!({"v1beta1": {"conditions": decoy}}),
            );
        }
    }
    m
}

/// Server-side apply of the shim's body onto a `listType=map` list keyed by `type`: the entry
/// of the same type is merged field by field (fields owned by others stay), or appended.
fn ssa_merge(existing: &[Value], patch: &[Value]) -> Vec<Value> {
    let mut out = existing.to_vec();
    for p in patch {
        let key = p.get("type");
        match out.iter_mut().find(|e| e.get("type") == key) {
            Some(Value::Object(e)) => {
                for (k, v) in p.as_object().expect("an object") {
                    e.insert(k.clone(), v.clone());
                }
            }
            _ => out.push(p.clone()),
        }
    }
    out
}

/// Fuzz entry: a Machine's condition list (CAPI's entries, maybe ours, in every readable and
/// unreadable form), a verdict and a time, through read → next_condition → apply_body → SSA.
/// Exactly one entry of the type results, every other entry is untouched, the body carries
/// only that entry, `lastTransitionTime` moves only when the status changes, reading back
/// gives what was computed, and publishing the same verdict again changes nothing.
pub fn condition_upsert(data: &[u8]) {
    let mut b = Bytes::new(data);
    if b.u8() >= 0xF0 {
        // any JSON as the Machine: read finds the first entry of the type or nothing
        if let Ok(m) = serde_json::from_slice::<Value>(b.rest()) {
            for layout in [
                ConditionLayout::V1Beta1WithV1Beta2Conditions,
                ConditionLayout::V1Beta2,
            ] {
                let got = read(&m, layout, DEFAULT_CONDITION_TYPE);
                let list = m
                    .pointer(layout.conditions_pointer())
                    .and_then(Value::as_array)
                    .map_or(&[][..], Vec::as_slice);
                assert_eq!(got, expected_read(list, DEFAULT_CONDITION_TYPE));
            }
        }
        return;
    }
    let layout = if b.bool() {
        ConditionLayout::V1Beta1WithV1Beta2Conditions
    } else {
        ConditionLayout::V1Beta2
    };
    let ty = b.pick(&[
        DEFAULT_CONDITION_TYPE,
        DEFAULT_CONDITION_TYPE,
        "VMHealthy.example.com",
    ]);
    let mut list: Vec<Value> = Vec::new();
    for _ in 0..b.below(7) {
        let t = match b.below(4) {
            0 => ty.to_string(),
            1 => b.text(2),
            _ => b.pick(OTHER_TYPES).to_string(),
        };
        // a map list has one entry per type
        if !list.iter().any(|e| e["type"] == t.as_str()) {
            list.push(gen_entry(&mut b, &t));
        }
    }
    let decoy: Vec<Value> = (0..b.below(3)).map(|_| gen_entry(&mut b, ty)).collect();
    let machine = machine_with(layout, &list, &decoy);
    let status = b.pick(&[Status::True, Status::False, Status::Unknown]);
    let verdict = Verdict::new(status, b.pick(reason::ALL), b.text(6));
    let now = Timestamp::from_second(1_500_000_000 + i64::from(b.u32())).expect("in range")
        + jiff::SignedDuration::from_nanos(i64::from(b.u32() % 1_000_000_000));

    let prev = read(&machine, layout, ty);
    assert_eq!(
        prev,
        expected_read(&list, ty),
        "read picks our entry of the right list"
    );
    let next = next_condition(prev.as_ref(), ty, &verdict, now);
    let body = apply_body(layout, "ns", "m", &next);

    // the body: only our entry, at the layout's place
    assert_eq!(body["apiVersion"], layout.api_version());
    assert_eq!(body["kind"], "Machine");
    assert_eq!(body["metadata"], json!({"name": "m", "namespace": "ns"}));
    let patch = body
        .pointer(layout.conditions_pointer())
        .and_then(Value::as_array)
        .expect("the condition list");
    assert_eq!(patch.len(), 1, "only our entry");
    let expected_status = match layout {
        ConditionLayout::V1Beta1WithV1Beta2Conditions => json!({"v1beta2": {"conditions": patch}}),
        ConditionLayout::V1Beta2 => json!({"conditions": patch}),
    };
    assert_eq!(
        body["status"], expected_status,
        "nothing but our entry in the body"
    );
    let entry = &patch[0];
    assert_eq!(entry["type"], ty);
    assert_eq!(entry["status"], status.as_str());
    assert_eq!(entry["reason"], verdict.reason);
    assert_eq!(entry["message"], verdict.message.as_str());
    let written: Timestamp = entry["lastTransitionTime"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("an RFC 3339 time");
    assert_eq!(
        written.subsec_nanosecond(),
        0,
        "metav1.Time has whole seconds"
    );
    match &prev {
        Some(p) if p.status == status => assert_eq!(
            written,
            whole_seconds(p.last_transition_time),
            "same status: lastTransitionTime stays"
        ),
        _ => assert_eq!(
            written,
            whole_seconds(now),
            "status changed: lastTransitionTime = now"
        ),
    }

    // the API server's merge: one entry of the type, the others untouched and in order
    let merged = ssa_merge(&list, patch);
    assert_eq!(merged.iter().filter(|e| e["type"] == ty).count(), 1);
    let others =
        |l: &[Value]| -> Vec<Value> { l.iter().filter(|e| e["type"] != ty).cloned().collect() };
    assert_eq!(
        others(&merged),
        others(&list),
        "other conditions are untouched"
    );
    let after = machine_with(layout, &merged, &decoy);

    // reading back gives what was computed; the same verdict later writes nothing
    let back = read(&after, layout, ty).expect("our entry reads back");
    assert_eq!(
        (back.status, back.reason.as_str()),
        (status, verdict.reason)
    );
    assert_eq!(back.message, verdict.message);
    assert_eq!(back.last_transition_time, written);
    let later = now + jiff::SignedDuration::from_secs(1 + i64::from(b.u16()));
    let again = next_condition(Some(&back), ty, &verdict, later);
    assert!(
        is_unchanged(Some(&back), &again),
        "the same verdict rewrites nothing"
    );
    // a status flip later moves the time to then
    let flipped = match status {
        Status::True => Status::False,
        _ => Status::True,
    };
    let flip = next_condition(
        Some(&back),
        ty,
        &Verdict::new(flipped, verdict.reason, ""),
        later,
    );
    assert_eq!(flip.last_transition_time, whole_seconds(later));
}
