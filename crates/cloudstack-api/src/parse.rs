//! Pure response parsing: HTTP status + body in, typed page or typed error out. No I/O.
//!
//! Wire facts followed here (`cloudstack-api.md` §2.3, §5.1, §8):
//! - a body is `{"<lowercase command>response": {...}}`; errors use the same wrapper or
//!   `errorresponse` and look like `{uuidList, errorcode, cserrorcode?, errortext}`;
//! - proxies rewrite CloudStack's non-standard statuses, so the JSON body decides, not the status;
//! - an empty list is `{"<cmd>response": {}}` (no `count`, no array).
//!
//! Recorded fixtures add quirks that are accepted too: a camelCase wrapper (`listVirtualMachines`),
//! any single top-level wrapper key, and a bare inner object.
//!
//! Items that do not parse are **reported, not dropped**: the controller treats "absent from a
//! complete listing" as evidence that a VM is gone, so a listing with an unreadable item must
//! say it is incomplete.

use serde::de::DeserializeOwned;
use serde::Deserialize as _;

use serde_json::{Map, Value};

use super::error::{body_snippet, sanitize_text, CloudStackError, MAX_ERRORTEXT_CHARS};
use super::model::Capabilities;

/// The one-pass read of a plain list page ([`healthy_list_page`]).
mod healthy;

/// One HTTP answer, as the parser sees it.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    pub status: u16,
    pub content_type: Option<&'a str>,
    pub body: &'a [u8],
}

impl<'a> Reply<'a> {
    pub fn new(status: u16, content_type: Option<&'a str>, body: &'a [u8]) -> Self {
        Self {
            status,
            content_type,
            body,
        }
    }

    /// A `200 application/json` answer.
    pub fn json(body: &'a [u8]) -> Self {
        Self::new(200, Some("application/json"), body)
    }
}

/// A CloudStack error envelope, as found in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorEnvelope {
    /// `errorcode` (falls back to the HTTP status when the body has none).
    pub errorcode: u16,
    pub cserrorcode: Option<u32>,
    pub errortext: Option<String>,
    /// UUIDs from `uuidList` (`{uuid, description}` objects or plain strings).
    pub uuids: Vec<String>,
    /// The wrapper key the envelope came in (`errorresponse` = unknown/unavailable command).
    pub wrapper: Option<String>,
}

impl ErrorEnvelope {
    pub fn into_error(self) -> CloudStackError {
        let unknown = self
            .wrapper
            .as_deref()
            .is_some_and(|w| w.eq_ignore_ascii_case("errorresponse"));
        CloudStackError::from_code(
            self.errorcode,
            self.cserrorcode,
            self.errortext.as_deref(),
            unknown,
        )
    }
}

/// An item of a list page that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemFailure {
    /// Position in the page's item array.
    pub index: usize,
    /// The item's `id`, when it was readable.
    pub id: Option<String>,
    pub reason: String,
}

/// One page of a list API.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage<T> {
    /// `count` (total matching rows for most list APIs; items on this page for usage history).
    /// Missing = 0.
    pub count: u64,
    /// Whether the page carried a `count` at all.
    pub count_present: bool,
    /// Items that parsed, in page order.
    pub items: Vec<T>,
    /// Items that did not parse.
    pub failures: Vec<ItemFailure>,
    /// Number of items on the page, parsed or not.
    pub received: usize,
}

impl<T> ListPage<T> {
    /// No item failed to parse.
    pub fn is_clean(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Reads the body as JSON; `NotJson` if it is not.
fn body_json(reply: Reply<'_>) -> Result<Value, CloudStackError> {
    let trimmed = trim_ascii(reply.body);
    let looks_json = matches!(trimmed.first(), Some(b'{') | Some(b'['));
    let parsed = if looks_json {
        serde_json::from_slice::<Value>(trimmed).ok()
    } else {
        None
    };
    match parsed {
        Some(v) => Ok(v),
        None => {
            if looks_json && is_json_content_type(reply.content_type) {
                // claims JSON and starts like JSON but does not parse: truncated or corrupt
                return Err(CloudStackError::Malformed {
                    detail: format!(
                        "HTTP {} body is declared JSON but does not parse, truncated or corrupt ({} bytes)",
                        reply.status,
                        reply.body.len()
                    ),
                });
            }
            Err(CloudStackError::NotJson {
                status: reply.status,
                content_type: reply
                    .content_type
                    .map(|c| sanitize_text(c, 80))
                    .filter(|c| !c.is_empty()),
                snippet: body_snippet(reply.body),
            })
        }
    }
}

fn is_json_content_type(ct: Option<&str>) -> bool {
    ct.is_some_and(|c| c.to_ascii_lowercase().contains("json"))
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    let b = &b[start..end.max(start)];
    // a UTF-8 byte-order mark before the JSON, maybe followed by whitespace
    b.strip_prefix(&[0xEF, 0xBB, 0xBF][..])
        .map_or(b, <[u8]>::trim_ascii_start)
}

/// The response name CloudStack uses for a command: `listvirtualmachinesresponse`.
pub fn response_key(command: &str) -> String {
    let mut k = command.to_ascii_lowercase();
    k.push_str("response");
    k
}

/// Finds the inner object: the `<cmd>response` wrapper, `errorresponse`, a camelCase wrapper,
/// the only top-level key, or the body itself when it is already the inner object.
/// Returns the wrapper key used (if any) and the inner object.
pub fn unwrap_response<'v>(
    command: &str,
    item_key: Option<&str>,
    value: &'v Value,
) -> Result<(Option<&'v str>, &'v Map<String, Value>), CloudStackError> {
    let Value::Object(top) = value else {
        return Err(CloudStackError::malformed(format!(
            "expected a JSON object for {command}, got {}",
            json_type(value)
        )));
    };
    let wanted = response_key(command);
    let by_key = |pred: &dyn Fn(&str) -> bool| {
        top.iter()
            .find(|(k, v)| pred(k) && v.is_object())
            .map(|(k, v)| (k.as_str(), v))
    };
    let found = by_key(&|k| k == wanted)
        .or_else(|| by_key(&|k| k.eq_ignore_ascii_case(&wanted)))
        .or_else(|| by_key(&|k| k == "errorresponse"))
        .or_else(|| by_key(&|k| k.eq_ignore_ascii_case(command)))
        .or_else(|| {
            // the only top-level key wraps the body, unless it is the body's own item key
            if top.len() == 1 {
                let (k, v) = top.iter().next()?;
                let is_item = item_key.is_some_and(|ik| k.eq_ignore_ascii_case(ik));
                let is_field = is_envelope_field(k) || k == "count";
                (!is_item && !is_field && v.is_object()).then_some((k.as_str(), v))
            } else {
                None
            }
        });
    match found {
        Some((k, Value::Object(inner))) => Ok((Some(k), inner)),
        _ => Ok((None, top)),
    }
}

fn is_envelope_field(k: &str) -> bool {
    matches!(k, "errorcode" | "cserrorcode" | "errortext" | "uuidList")
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn lenient_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Reads the error envelope out of an inner object, if it is one.
fn envelope_of(
    status: u16,
    wrapper: Option<&str>,
    inner: &Map<String, Value>,
) -> Option<ErrorEnvelope> {
    let has_code = inner.contains_key("errorcode");
    let has_text = inner.contains_key("errortext");
    if !has_code && !has_text {
        return None;
    }
    let errorcode = inner
        .get("errorcode")
        .and_then(lenient_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 100)
        .unwrap_or(if (200..300).contains(&status) {
            // an envelope without a usable code inside a 2xx: treat as an internal error
            530
        } else {
            status
        });
    let cserrorcode = inner
        .get("cserrorcode")
        .and_then(lenient_u64)
        .and_then(|c| u32::try_from(c).ok())
        .filter(|c| *c != 0);
    let errortext = match inner.get("errortext") {
        Some(Value::String(s)) => Some(sanitize_text(s, MAX_ERRORTEXT_CHARS)),
        Some(Value::Null) | None => None,
        Some(other) => Some(sanitize_text(&other.to_string(), MAX_ERRORTEXT_CHARS)),
    };
    let uuids = match inner.get("uuidList") {
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(|u| match u {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("uuid").and_then(Value::as_str).map(str::to_string),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    Some(ErrorEnvelope {
        errorcode,
        cserrorcode,
        errortext,
        uuids,
        wrapper: wrapper.map(str::to_string),
    })
}

/// The error envelope of a reply, if the body is JSON carrying one (whatever the status).
pub fn parse_error_envelope(command: &str, reply: Reply<'_>) -> Option<ErrorEnvelope> {
    let value = body_json(reply).ok()?;
    let (wrapper, inner) = unwrap_response(command, None, &value).ok()?;
    envelope_of(reply.status, wrapper, inner)
}

/// Common front half: JSON, unwrap, error envelope, HTTP status. Returns the inner object.
/// Borrowed from `value`: a page of 500 VMs is a large tree, and copying it cost as much as
/// parsing it.
fn inner_object<'v>(
    command: &str,
    item_key: Option<&str>,
    reply: Reply<'_>,
    value: &'v Value,
) -> Result<&'v Map<String, Value>, CloudStackError> {
    let (wrapper, inner) = unwrap_response(command, item_key, value)?;
    if let Some(env) = envelope_of(reply.status, wrapper, inner) {
        return Err(env.into_error());
    }
    if !(200..300).contains(&reply.status) {
        // JSON without a CloudStack envelope on an error status (a gateway's JSON error)
        return Err(CloudStackError::from_code(reply.status, None, None, false));
    }
    Ok(inner)
}

/// The unwrapped body of any command as JSON (for [`crate::client::CloudStackClient::call`]).
pub fn parse_value(command: &str, reply: Reply<'_>) -> Result<Value, CloudStackError> {
    let value = body_json(reply)?;
    inner_object(command, None, reply, &value).map(|inner| Value::Object(inner.clone()))
}

/// Parses one page of a list API: `{"<cmd>response": {"count": N, "<item_key>": [...]}}`.
pub fn parse_list_page<T: DeserializeOwned>(
    command: &str,
    item_key: &str,
    reply: Reply<'_>,
) -> Result<ListPage<T>, CloudStackError> {
    match healthy_list_page(command, item_key, reply) {
        Some(page) => Ok(page),
        None => tolerant_list_page(command, item_key, reply),
    }
}

/// Any page the tolerant way: the body as a JSON tree, unwrapped as [`unwrap_response`] finds
/// it, error envelopes and statuses mapped, each item read on its own.
fn tolerant_list_page<T: DeserializeOwned>(
    command: &str,
    item_key: &str,
    reply: Reply<'_>,
) -> Result<ListPage<T>, CloudStackError> {
    let value = body_json(reply)?;
    let inner = inner_object(command, Some(item_key), reply, &value)?;
    let (count, count_present) = match inner.get("count") {
        None | Some(Value::Null) => (0, false),
        Some(v) => match lenient_u64(v) {
            Some(n) => (n, true),
            None => {
                return Err(CloudStackError::malformed(format!(
                    "{command}: `count` is {}, not a number",
                    json_type(v)
                )))
            }
        },
    };
    let raw_items: Vec<&Value> = match inner.get(item_key) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.iter().collect(),
        Some(obj @ Value::Object(_)) => vec![obj],
        Some(other) => {
            return Err(CloudStackError::malformed(format!(
                "{command}: `{item_key}` is {}, expected an array",
                json_type(other)
            )))
        }
    };
    let mut items = Vec::with_capacity(raw_items.len());
    let mut failures = Vec::new();
    for (index, raw) in raw_items.iter().enumerate() {
        match T::deserialize(*raw) {
            Ok(item) => items.push(item),
            Err(e) => failures.push(item_failure(index, raw, &e)),
        }
    }
    Ok(ListPage {
        count,
        count_present,
        received: raw_items.len(),
        items,
        failures,
    })
}

/// The common case, read straight from the body in one pass: a 2xx reply whose only top-level
/// key is `<cmd>response` holding only `count` and the item array. The walk stops at each item
/// only to note where its text lies (a borrowed slice), and the item is then read from that
/// slice, so no JSON tree of the page is built and the body is scanned once before the typed
/// reads (at 10 000 VMs a tree and its copies were a third of a poll cycle's CPU; reading the
/// wrapper, the inner object and the array each as raw text was three scans). Anything else —
/// an error envelope, another wrapper, a `count` that is not a number, an item array that is
/// not an array, escaped or repeated keys — is `None`, and [`parse_list_page`] reads it the
/// tolerant way; on the pages this takes, both ways give the same page (a unit test holds them
/// to it).
fn healthy_list_page<T: DeserializeOwned>(
    command: &str,
    item_key: &str,
    reply: Reply<'_>,
) -> Option<ListPage<T>> {
    if !(200..300).contains(&reply.status) {
        return None;
    }
    let response_key = response_key(command);
    let mut de = serde_json::Deserializer::from_slice(trim_ascii(reply.body));
    let page = serde::Deserializer::deserialize_map(
        &mut de,
        healthy::Wrapper::<T> {
            response_key: &response_key,
            item_key,
            item: std::marker::PhantomData,
        },
    )
    .ok()?;
    de.end().ok()?;
    Some(page)
}

fn item_failure(index: usize, raw: &Value, e: &serde_json::Error) -> ItemFailure {
    ItemFailure {
        index,
        id: raw
            .get("id")
            .and_then(|v| match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
            .map(|s| sanitize_text(&s, 80)),
        reason: sanitize_text(&e.to_string(), 200),
    }
}

/// Parses `listCapabilities`: `{"listcapabilitiesresponse": {"capability": {...}}}`.
pub fn parse_capabilities(reply: Reply<'_>) -> Result<Capabilities, CloudStackError> {
    let value = body_json(reply)?;
    let inner = inner_object("listCapabilities", Some("capability"), reply, &value)?;
    let cap = match inner.get("capability") {
        Some(c @ Value::Object(_)) => c.clone(),
        // a bare capability object
        None if inner.contains_key("cloudstackversion") => Value::Object(inner.clone()),
        Some(other) => {
            return Err(CloudStackError::malformed(format!(
                "listCapabilities: `capability` is {}, expected an object",
                json_type(other)
            )))
        }
        None => {
            return Err(CloudStackError::malformed(
                "listCapabilities: no `capability` object in the response",
            ))
        }
    };
    Capabilities::deserialize(&cap)
        .map_err(|e| CloudStackError::malformed(format!("listCapabilities: {e}")))
}

/// Where an async job stands (`queryAsyncJobResult`, `AsyncJobResponse.java@e65c555a`).
#[derive(Debug, Clone, PartialEq)]
pub enum AsyncJobState {
    /// `jobstatus` 0.
    Pending,
    /// `jobstatus` 1: the job's result, read like cloudstack-go does (see [`single_result`]).
    Succeeded(Value),
    /// `jobstatus` 2: `errorcode` and the sanitized `errortext` of the job's result.
    Failed {
        errorcode: Option<u32>,
        text: String,
    },
}

/// The text of a failed job that came without an `errortext`.
pub const JOB_FAILED_WITHOUT_TEXT: &str = "the job failed without an error text";

/// Reads an async command's answer (`runDiagnostics` …): the job id it queued.
pub fn parse_job_id(command: &str, reply: Reply<'_>) -> Result<String, CloudStackError> {
    let value = body_json(reply)?;
    let inner = inner_object(command, None, reply, &value)?;
    let id = match inner.get("jobid") {
        Some(Value::String(s)) => s.trim().to_string(),
        Some(Value::Number(n)) => n.to_string(),
        None | Some(Value::Null) => {
            return Err(CloudStackError::malformed(format!(
                "{command}: no `jobid` in the answer of an async command"
            )))
        }
        Some(other) => {
            return Err(CloudStackError::malformed(format!(
                "{command}: `jobid` is {}, expected a string",
                json_type(other)
            )))
        }
    };
    // The id goes back to the server as a parameter and into logs: only what a UUID (or an
    // old numeric id) is made of.
    let plausible = !id.is_empty()
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if !plausible {
        return Err(CloudStackError::malformed(format!(
            "{command}: `jobid` {:?} is not an id",
            sanitize_text(&id, 80)
        )));
    }
    Ok(id)
}

/// Parses `queryAsyncJobResult`. `jobstatus` 0 is pending; 1 success and 2 failure as
/// cloudstack-go reads them (`cloudstack/cloudstack.go@e463cd1c` l. 501–512). A failed job's
/// `jobresult` carries `errorcode`/`errortext` instead of the object
/// (`ResponseObjectTypeAdapter.java@830f3061`).
pub fn parse_async_job(reply: Reply<'_>) -> Result<AsyncJobState, CloudStackError> {
    const COMMAND: &str = "queryAsyncJobResult";
    let value = body_json(reply)?;
    let inner = inner_object(COMMAND, None, reply, &value)?;
    let status = match inner.get("jobstatus") {
        None | Some(Value::Null) => {
            return Err(CloudStackError::malformed(format!(
                "{COMMAND}: no `jobstatus` in the answer"
            )))
        }
        Some(v) => lenient_u64(v).ok_or_else(|| {
            CloudStackError::malformed(format!(
                "{COMMAND}: `jobstatus` is {}, not a number",
                json_type(v)
            ))
        })?,
    };
    match status {
        0 => Ok(AsyncJobState::Pending),
        1 => {
            let result = inner.get("jobresult").ok_or_else(|| {
                CloudStackError::malformed(format!(
                    "{COMMAND}: the job succeeded but the answer has no `jobresult`"
                ))
            })?;
            single_result(result).map(|v| AsyncJobState::Succeeded(v.clone()))
        }
        2 => {
            let result = inner.get("jobresult");
            let code = |v: Option<&Value>| {
                v.and_then(lenient_u64)
                    .and_then(|c| u32::try_from(c).ok())
                    .filter(|c| *c != 0)
            };
            let errorcode = code(result.and_then(|r| r.get("errorcode")))
                .or_else(|| code(inner.get("jobresultcode")));
            let text = match result.and_then(|r| r.get("errortext")) {
                Some(Value::String(s)) => sanitize_text(s, MAX_ERRORTEXT_CHARS),
                Some(Value::Null) | None => String::new(),
                Some(other) => sanitize_text(&other.to_string(), MAX_ERRORTEXT_CHARS),
            };
            let text = if text.is_empty() {
                JOB_FAILED_WITHOUT_TEXT.to_string()
            } else {
                text
            };
            Ok(AsyncJobState::Failed { errorcode, text })
        }
        other => Err(CloudStackError::malformed(format!(
            "{COMMAND}: unknown `jobstatus` {other} (0 pending, 1 succeeded, 2 failed)"
        ))),
    }
}

/// The result inside a job's `jobresult`, read the way cloudstack-go's `getRawValue` does
/// (`cloudstack/cloudstack.go@e463cd1c` l. 639–671, docs/guest-probe.md §6): the value of the
/// one key, whatever its name (`diagnostics` today, `rundiagnosticsresponse` in older
/// releases, `RunDiagnosticsCmd.java@0ecc61aa`); with a `count` key, the first element of the
/// array under the other key. Zero keys, several keys or an empty list are malformed, where
/// cloudstack-go would pick one of several at random or index an empty array.
pub fn single_result(jobresult: &Value) -> Result<&Value, CloudStackError> {
    const WHAT: &str = "queryAsyncJobResult: `jobresult`";
    let Value::Object(map) = jobresult else {
        return Err(CloudStackError::malformed(format!(
            "{WHAT} is {}, expected an object",
            json_type(jobresult)
        )));
    };
    let has_count = map.contains_key("count");
    let others: Vec<(&String, &Value)> = map.iter().filter(|(k, _)| *k != "count").collect();
    let (key, value) = match others.as_slice() {
        [one] => *one,
        [] => {
            return Err(CloudStackError::malformed(format!(
                "{WHAT} holds no result (no key{})",
                if has_count { " besides `count`" } else { "" }
            )))
        }
        several => {
            let names: Vec<&str> = several.iter().take(5).map(|(k, _)| k.as_str()).collect();
            return Err(CloudStackError::malformed(format!(
                "{WHAT} holds {} results ({}{}), expected one",
                several.len(),
                sanitize_text(&names.join(", "), 120),
                if several.len() > names.len() {
                    ", …"
                } else {
                    ""
                }
            )));
        }
    };
    if !has_count {
        return Ok(value);
    }
    match value {
        Value::Array(items) => items.first().ok_or_else(|| {
            CloudStackError::malformed(format!(
                "{WHAT}: the list under `{}` is empty",
                sanitize_text(key, 60)
            ))
        }),
        other => Err(CloudStackError::malformed(format!(
            "{WHAT}: `{}` is {} next to `count`, expected an array",
            sanitize_text(key, 60),
            json_type(other)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{VirtualMachine, VmState};

    fn page(body: &str) -> Result<ListPage<VirtualMachine>, CloudStackError> {
        parse_list_page(
            "listVirtualMachines",
            "virtualmachine",
            Reply::json(body.as_bytes()),
        )
    }

    /// The fast read of a healthy page and the tolerant read give the same page, and the fast
    /// one declines whatever the tolerant one must judge (envelopes, other shapes).
    #[test]
    fn the_healthy_page_fast_path_reads_what_the_tolerant_path_reads() {
        let vm = |i: usize| {
            format!(
                r#"{{"id":"{i:08}-0000-4000-8000-000000000000","name":"vm-{i}","state":"Running","nic":[{{"id":"n{i}","ipaddress":"10.0.0.{}","isdefault":true}}],"tags":[]}}"#,
                i % 250
            )
        };
        let items: Vec<String> = (0..50).map(vm).collect();
        let clean = format!(
            r#"{{"listvirtualmachinesresponse":{{"count":50,"virtualmachine":[{}]}}}}"#,
            items.join(",")
        );
        let with_bad = format!(
            r#"{{"listvirtualmachinesresponse":{{"count":"3","virtualmachine":[{},{{"id":"b"}},{{"state":"Running"}}]}}}}"#,
            items[0]
        );
        let read = |body: &str| {
            let r = Reply::json(body.as_bytes());
            let fast =
                healthy_list_page::<VirtualMachine>("listVirtualMachines", "virtualmachine", r);
            let tolerant =
                tolerant_list_page::<VirtualMachine>("listVirtualMachines", "virtualmachine", r);
            (fast, tolerant)
        };
        // Our recorded pages too (what CloudStack sends, with every field the model reads).
        let wire = [
            include_str!("../../../cloudstack-fixtures/wire/list-vms-page-1.json"),
            include_str!("../../../cloudstack-fixtures/wire/list-vms-every-state.json"),
            include_str!("../../../cloudstack-fixtures/wire/list-vms-nic-variants.json"),
            include_str!("../../../cloudstack-fixtures/wire/list-vms-stats-variants.json"),
            include_str!("../../../cloudstack-fixtures/wire/list-vms-malformed-items.json"),
        ];
        for body in [
            clean.as_str(),
            with_bad.as_str(),
            r#"{"listvirtualmachinesresponse":{}}"#,
        ]
        .into_iter()
        .chain(wire)
        {
            let (fast, tolerant) = read(body);
            let fast =
                fast.unwrap_or_else(|| panic!("the fast path declined a healthy page: {body}"));
            assert_eq!(
                format!("{fast:?}"),
                format!("{:?}", tolerant.unwrap()),
                "{body}"
            );
        }
        assert_eq!(read(&clean).0.unwrap().items.len(), 50);
        for declined in [
            r#"{"listvirtualmachinesresponse":{"errorcode":431,"errortext":"x"}}"#,
            r#"{"listvirtualmachinesresponse":{"count":null,"virtualmachine":[]}}"#,
            r#"{"listvirtualmachinesresponse":{"virtualmachine":{"id":"a","state":"Running"}}}"#,
            r#"{"ListVirtualMachinesResponse":{"count":0}}"#,
            r#"{"virtualmachine":[]}"#,
            r#"{"listvirtualmachinesresponse":{"count":1,"count":2,"virtualmachine":[]}}"#,
            r#"{"listvirtualmachinesresponse":{"count":0},"listvirtualmachinesresponse":{}}"#,
            r#"{"listvirtualmachinesresponse":{"count":0,"other":1}}"#,
            r#"{"listvirtualmachinesresponse":{"count":0}} trailing"#,
            "<html>proxy</html>",
        ] {
            assert!(read(declined).0.is_none(), "{declined}");
        }
        let r = Reply::new(503, Some("application/json"), clean.as_bytes());
        assert!(
            healthy_list_page::<VirtualMachine>("listVirtualMachines", "virtualmachine", r)
                .is_none()
        );
    }

    #[test]
    fn empty_list_is_empty_and_complete() {
        let p = page(r#"{"listvirtualmachinesresponse":{}}"#).unwrap();
        assert_eq!((p.count, p.count_present, p.received), (0, false, 0));
        assert!(p.items.is_empty() && p.is_clean());
    }

    #[test]
    fn bad_item_is_reported_not_dropped() {
        let p = page(
            r#"{"listvirtualmachinesresponse":{"count":3,"virtualmachine":[
            {"id":"a","state":"Running"},{"id":"b"},{"state":"Running"}]}}"#,
        )
        .unwrap();
        assert_eq!(p.items.len(), 1);
        assert_eq!(p.items[0].state, VmState::Running);
        assert_eq!(p.received, 3);
        assert_eq!(p.failures.len(), 2);
        assert_eq!(p.failures[0].index, 1);
        assert_eq!(p.failures[0].id.as_deref(), Some("b"));
        assert!(
            p.failures[0].reason.contains("state"),
            "{:?}",
            p.failures[0]
        );
        assert_eq!(p.failures[1].id, None);
    }

    #[test]
    fn error_envelope_wins_over_a_200_status() {
        let e = page(r#"{"listvirtualmachinesresponse":{"uuidList":[],"errorcode":431,"cserrorcode":4350,"errortext":"Page size can't exceed max allowed page size value: 100"}}"#)
            .unwrap_err();
        assert_eq!(
            e,
            CloudStackError::InvalidParameter {
                page_size_max: Some(100),
                unknown_id: None,
                detail: crate::error::ErrorDetail::new(
                    Some(4350),
                    Some("Page size can't exceed max allowed page size value: 100")
                ),
            }
        );
    }

    #[test]
    fn json_without_envelope_on_error_status_maps_the_status() {
        let r = Reply::new(
            503,
            Some("application/json"),
            br#"{"message":"upstream down"}"#,
        );
        let e = parse_list_page::<VirtualMachine>("listVirtualMachines", "virtualmachine", r)
            .unwrap_err();
        assert_eq!(e.kind(), "server_error");
        assert_eq!(e.code(), Some(503));
    }

    #[test]
    fn non_json_is_not_json() {
        let r = Reply::new(200, Some("text/html"), b"<html><body>Login</body></html>");
        let e = parse_value("listApis", r).unwrap_err();
        assert!(
            matches!(e, CloudStackError::NotJson { status: 200, ref snippet, .. } if snippet == "Login")
        );
        let r = Reply::new(200, Some("application/json"), b"{\"listapisresponse\":{");
        assert_eq!(parse_value("listApis", r).unwrap_err().kind(), "malformed");
        let r = Reply::new(200, None, b"");
        assert_eq!(parse_value("listApis", r).unwrap_err().kind(), "not_json");
    }

    #[test]
    fn wrappers_are_found() {
        // camelCase wrapper, bare inner, single misspelled wrapper
        for body in [
            r#"{"listVirtualMachines":{"count":1,"virtualmachine":[{"id":"a","state":"Stopped"}]}}"#,
            r#"{"count":1,"virtualmachine":[{"id":"a","state":"Stopped"}]}"#,
            r#"{"virtualmachine":[{"id":"a","state":"Stopped"}]}"#,
            r#"{"listvmsresp":{"count":1,"virtualmachine":{"id":"a","state":"Stopped"}}}"#,
        ] {
            let p = page(body).unwrap();
            assert_eq!(p.items.len(), 1, "{body}");
            assert_eq!(p.items[0].state, VmState::Stopped);
        }
        assert_eq!(page("[]").unwrap_err().kind(), "malformed");
        assert_eq!(
            page(r#"{"listvirtualmachinesresponse":{"virtualmachine":"x"}}"#)
                .unwrap_err()
                .kind(),
            "malformed"
        );
    }

    fn job(body: &str) -> Result<AsyncJobState, CloudStackError> {
        parse_async_job(Reply::json(body.as_bytes()))
    }

    #[test]
    fn a_pending_job_is_pending() {
        for body in [
            r#"{"queryasyncjobresultresponse":{"jobid":"j-1","jobstatus":0,"jobprocstatus":0,"jobresultcode":0,"cmd":"org.apache.cloudstack.api.command.admin.diagnostics.RunDiagnosticsCmd"}}"#,
            r#"{"queryasyncjobresultresponse":{"jobid":"j-1","jobstatus":"0"}}"#,
        ] {
            assert_eq!(job(body).unwrap(), AsyncJobState::Pending, "{body}");
        }
    }

    #[test]
    fn a_finished_probe_gives_the_value_under_its_one_key() {
        // `diagnostics` today (RunDiagnosticsCmd@c098aaa2), `rundiagnosticsresponse` before
        let out = serde_json::json!({"stdout":"b'x'","stderr":"b''","exitcode":"0"});
        for key in ["diagnostics", "rundiagnosticsresponse", "anything"] {
            let body = serde_json::json!({"queryasyncjobresultresponse": {
                "jobid": "j-1", "jobstatus": 1, "jobresultcode": 0, "jobresulttype": "object",
                "jobresult": {key: out.clone()}}})
            .to_string();
            assert_eq!(
                job(&body).unwrap(),
                AsyncJobState::Succeeded(out.clone()),
                "{key}"
            );
        }
    }

    #[test]
    fn a_failed_job_gives_its_code_and_sanitized_text() {
        let e = job(r#"{"queryasyncjobresultresponse":{"jobid":"j-1","jobstatus":2,"jobresultcode":530,"jobresulttype":"object",
            "jobresult":{"uuidList":[],"errorcode":530,"cserrorcode":4250,
            "errortext":"Unable to find host for virtual machine instance: r-7-VM\n at /client/api?signature=AbC%2B"}}}"#)
        .unwrap();
        assert_eq!(
            e,
            AsyncJobState::Failed {
                errorcode: Some(530),
                text: "Unable to find host for virtual machine instance: r-7-VM at /client/api?signature=<redacted>".into(),
            }
        );
        // no jobresult: the code from jobresultcode, a text that says so
        let e = job(r#"{"queryasyncjobresultresponse":{"jobstatus":"2","jobresultcode":"530"}}"#)
            .unwrap();
        assert_eq!(
            e,
            AsyncJobState::Failed {
                errorcode: Some(530),
                text: JOB_FAILED_WITHOUT_TEXT.into()
            }
        );
        let e = job(
            r#"{"queryasyncjobresultresponse":{"jobstatus":2,"jobresult":{"errortext":["odd"]}}}"#,
        )
        .unwrap();
        assert!(
            matches!(&e, AsyncJobState::Failed { errorcode: None, text } if text.contains("odd")),
            "{e:?}"
        );
    }

    #[test]
    fn malformed_job_answers_are_malformed() {
        for body in [
            r#"{"queryasyncjobresultresponse":{"jobid":"j-1"}}"#,
            r#"{"queryasyncjobresultresponse":{"jobstatus":"done"}}"#,
            r#"{"queryasyncjobresultresponse":{"jobstatus":3}}"#,
            r#"{"queryasyncjobresultresponse":{"jobstatus":1}}"#,
            r#"{"queryasyncjobresultresponse":{"jobstatus":1,"jobresult":{}}}"#,
            r#"{"queryasyncjobresultresponse":{"jobstatus":1,"jobresult":{"a":{},"b":{}}}}"#,
            r#"{"queryasyncjobresultresponse":{"jobstatus":1,"jobresult":"ok"}}"#,
            r#"[1]"#,
        ] {
            let e = job(body).unwrap_err();
            assert_eq!(e.kind(), "malformed", "{body}: {e}");
            assert!(e.to_string().contains("could not be read"), "{e}");
        }
    }

    #[test]
    fn a_login_page_or_an_error_envelope_is_not_a_job() {
        let r = Reply::new(
            200,
            Some("text/html"),
            b"<html><body><h1>Login</h1></body></html>",
        );
        assert_eq!(parse_async_job(r).unwrap_err().kind(), "not_json");
        let e = job(r#"{"queryasyncjobresultresponse":{"uuidList":[],"errorcode":431,"cserrorcode":4350,"errortext":"Unable to execute API command queryasyncjobresult due to invalid value. Invalid parameter jobid value=0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11 due to incorrect long value format, or entity does not exist"}}"#)
            .unwrap_err();
        assert_eq!(e.kind(), "invalid_parameter");
    }

    #[test]
    fn single_result_follows_get_raw_value() {
        use serde_json::json;
        let one = json!({"diagnostics": {"exitcode": "0"}});
        assert_eq!(single_result(&one).unwrap(), &json!({"exitcode": "0"}));
        // a list answer: the first element of the array next to `count`
        let list = json!({"count": 2, "router": [{"id": "a"}, {"id": "b"}]});
        assert_eq!(single_result(&list).unwrap(), &json!({"id": "a"}));
        let scalar = json!({"success": true});
        assert_eq!(single_result(&scalar).unwrap(), &json!(true));
        for (bad, says) in [
            (json!({}), "no result"),
            (json!({"count": 0}), "besides `count`"),
            (json!({"count": 0, "router": []}), "is empty"),
            (
                json!({"count": 1, "router": {"id": "a"}}),
                "expected an array",
            ),
            (json!({"a": 1, "b": 2}), "holds 2 results (a, b)"),
            (json!({"a": 1, "b": 2, "count": 1}), "holds 2 results"),
            (json!(["x"]), "is an array"),
            (json!(null), "is null"),
        ] {
            let e = single_result(&bad).unwrap_err();
            assert_eq!(e.kind(), "malformed", "{bad}");
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
        let many: serde_json::Map<String, Value> =
            (0..9).map(|i| (format!("k{i}"), json!(i))).collect();
        let e = single_result(&Value::Object(many)).unwrap_err().to_string();
        assert!(e.contains("holds 9 results") && e.contains(", …"), "{e}");
    }

    #[test]
    fn the_job_id_of_an_async_command_is_read_and_checked() {
        let id = |body: &str| parse_job_id("runDiagnostics", Reply::json(body.as_bytes()));
        assert_eq!(
            id(r#"{"rundiagnosticsresponse":{"id":"r-1","jobid":"5f3c1f8e-7a0d-4d6f-9a1e-0c2b3d4e5f60"}}"#).unwrap(),
            "5f3c1f8e-7a0d-4d6f-9a1e-0c2b3d4e5f60"
        );
        assert_eq!(
            id(r#"{"rundiagnosticsresponse":{"jobid":42}}"#).unwrap(),
            "42"
        );
        for bad in [
            r#"{"rundiagnosticsresponse":{}}"#,
            r#"{"rundiagnosticsresponse":{"jobid":""}}"#,
            r#"{"rundiagnosticsresponse":{"jobid":"a&command=deleteAccount"}}"#,
            r#"{"rundiagnosticsresponse":{"jobid":{"x":1}}}"#,
        ] {
            assert_eq!(id(bad).unwrap_err().kind(), "malformed", "{bad}");
        }
        // the role checker's answer stays the typed error it is
        let e = id(r#"{"rundiagnosticsresponse":{"uuidList":[],"errorcode":432,"cserrorcode":9999,"errortext":"The API runDiagnostics is denied for the account's role."}}"#)
            .unwrap_err();
        assert_eq!(e.kind(), "not_allowed");
    }
}
