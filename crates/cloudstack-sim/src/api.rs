//! The `/client/api` servlet: parameter collection, request verification (in CloudStack's
//! order), role and throttle checks, pagination rules, dispatch through the command table
//! and the JSON envelopes (success and error).
//!
//! Verification order follows `ApiServer.verifyRequest`: unknown command → 401 (before the
//! signature), missing `signature`/`apiKey` → 401, `signatureversion=3` without a valid
//! future `expires` → 401, unknown api key or disabled account → 401, then the access
//! checkers (throttle → 429, role deny → 401 with CloudStack's text, no rule → 432), and
//! only then the HMAC comparison → 401. Secrets and signatures never appear in error text.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde_json::{json, Map, Value};

use super::commands::{self, CommandSpec};
use super::world::{AccountType, Ms, RoleDecision, Throttle, World};
use cloudstack_api::signing::{canonical_string, sign_canonical, signature_matches};

/// Request parameters after servlet-style collection: exact (case-sensitive) names, one
/// value each, already URL-decoded.
pub type Params = BTreeMap<String, String>;

/// Collects parameters like CloudStack's servlet: the form body (first value of a repeated
/// name wins), then the query string re-parsed and put over it (last value wins).
pub fn collect_params(query: Option<&str>, form_body: Option<&[u8]>) -> Params {
    let mut out = Params::new();
    if let Some(body) = form_body {
        for (k, v) in url::form_urlencoded::parse(body) {
            out.entry(k.into_owned()).or_insert_with(|| v.into_owned());
        }
    }
    if let Some(q) = query {
        for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
            out.insert(k.into_owned(), v.into_owned());
        }
    }
    out
}

/// An API error as CloudStack serializes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    /// `cserrorcode`; absent for errors built without an exception (signature 401).
    pub cs: Option<u32>,
    pub text: String,
    /// Forces the `errorresponse` wrapper (unknown command, 432).
    pub error_wrapper: bool,
}

pub const UNAUTHORIZED_TEXT: &str = "unable to verify user credentials and/or request signature";

impl ApiError {
    /// The generic 401 of a failed `verifyRequest` (no `cserrorcode`).
    pub fn unauthorized() -> Self {
        Self {
            code: 401,
            cs: None,
            text: UNAUTHORIZED_TEXT.to_string(),
            error_wrapper: false,
        }
    }

    /// A `ServerApiException` without a cause (`cserrorcode` 9999).
    pub fn server(code: u16, text: impl Into<String>) -> Self {
        Self {
            code,
            cs: Some(9999),
            text: text.into(),
            error_wrapper: false,
        }
    }

    /// `InvalidParameterValueException` → 431 with `cserrorcode` 4350.
    pub fn invalid_value(text: impl Into<String>) -> Self {
        Self {
            code: 431,
            cs: Some(4350),
            text: text.into(),
            error_wrapper: false,
        }
    }

    /// The 431 of `ParamProcessWorker` for a value that does not parse or resolve.
    pub fn bad_param(cmd: &CommandSpec, name: &str, value: &str) -> Self {
        Self::server(
            431,
            format!(
                "Unable to execute API command {} due to invalid value. Invalid parameter {name} value={value} due to incorrect long value format, or entity does not exist or due to incorrect parameter annotation for the field in api cmd class.",
                cmd.short_name()
            ),
        )
    }

    /// The 431 for a missing required parameter.
    pub fn missing(cmd: &CommandSpec, name: &str) -> Self {
        Self::server(
            431,
            format!(
                "Unable to execute API command {} due to missing parameter {name}",
                cmd.short_name()
            ),
        )
    }

    fn with_error_wrapper(mut self) -> Self {
        self.error_wrapper = true;
        self
    }
}

/// A finished answer of the API servlet.
#[derive(Debug, Clone)]
pub struct ApiReply {
    pub status: u16,
    pub body: String,
    /// `X-Description` header (set for `ServerApiException`s, as the servlet does).
    pub description: Option<String>,
    /// The command name as sent (for call statistics).
    pub command: String,
}

pub fn error_body(wrapper: &str, e: &ApiError) -> String {
    let mut inner = Map::new();
    inner.insert("uuidList".into(), Value::Array(Vec::new()));
    inner.insert("errorcode".into(), json!(e.code));
    if let Some(cs) = e.cs {
        inner.insert("cserrorcode".into(), json!(cs));
    }
    inner.insert("errortext".into(), json!(e.text));
    let mut outer = Map::new();
    outer.insert(wrapper.to_string(), Value::Object(inner));
    Value::Object(outer).to_string()
}

fn error_reply(command: &str, spec: Option<&CommandSpec>, e: ApiError) -> ApiReply {
    let wrapper = match spec {
        Some(s) if !e.error_wrapper => s.response,
        _ => "errorresponse",
    };
    ApiReply {
        status: e.code,
        body: error_body(wrapper, &e),
        description: e.cs.map(|_| e.text.clone()),
        command: command.to_string(),
    }
}

/// What a handler returns; the dispatcher wraps it in `{"<cmd>response": …}`.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A list: `count` (omitted when 0) and the items under the command's item key
    /// (omitted when empty). An empty result is `{}`.
    List { items: Vec<Value>, count: usize },
    /// A single object under a key, e.g. `{"capability": {…}}`.
    Object(&'static str, Value),
    /// The inner object as is.
    Raw(Map<String, Value>),
}

/// Page window computed from `page`/`pagesize` and `default.page.size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paging {
    pub start: usize,
    /// `None` = unlimited (`pagesize=-1`).
    pub size: Option<usize>,
}

impl Paging {
    pub fn slice<T>(&self, all: &[T]) -> std::ops::Range<usize> {
        let start = self.start.min(all.len());
        let end = match self.size {
            Some(s) => start.saturating_add(s).min(all.len()),
            None => all.len(),
        };
        start..end
    }
}

/// Per-account fixed-window counters (real time, like CloudStack's rate limiter cache).
#[derive(Debug, Default)]
pub struct ThrottleTable {
    windows: HashMap<usize, (Instant, u64)>,
}

impl ThrottleTable {
    pub fn clear(&mut self) {
        self.windows.clear();
    }

    /// Counts `n` calls; returns the ms until the window expires when over the limit.
    pub fn hit(&mut self, account: usize, t: Throttle, n: u64) -> Option<u64> {
        let now = Instant::now();
        let interval_ms = t.interval_seconds.saturating_mul(1000);
        let w = self.windows.entry(account).or_insert((now, 0));
        let elapsed = now.duration_since(w.0).as_millis() as u64;
        if elapsed >= interval_ms {
            *w = (now, 0);
        }
        w.1 = w.1.saturating_add(n);
        if w.1 > t.max {
            let elapsed = now.duration_since(w.0).as_millis() as u64;
            Some(interval_ms.saturating_sub(elapsed))
        } else {
            None
        }
    }
}

/// Everything a handler may use.
pub struct Call<'a> {
    pub world: &'a mut World,
    pub caller: usize,
    pub params: &'a Params,
    pub spec: &'static CommandSpec,
    pub paging: Paging,
    /// The caller's effective throttle (None = off or exempt).
    pub throttle: Option<Throttle>,
    /// Extra calls to charge to the caller's throttle window (listApis quirk).
    pub extra_throttle_hits: u64,
}

impl Call<'_> {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    /// A non-empty parameter value.
    pub fn get_nonempty(&self, name: &str) -> Option<&str> {
        self.get(name).filter(|v| !v.is_empty())
    }

    pub fn bool_param(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get_nonempty(name) {
            None => Ok(None),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(Some(true)),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(Some(false)),
            Some(v) => Err(ApiError::bad_param(self.spec, name, v)),
        }
    }

    pub fn require(&self, name: &str) -> Result<&str, ApiError> {
        self.get_nonempty(name)
            .ok_or_else(|| ApiError::missing(self.spec, name))
    }

    pub fn caller_account(&self) -> &super::world::Account {
        &self.world.accounts[self.caller]
    }

    pub fn bad(&self, name: &str, value: &str) -> ApiError {
        ApiError::bad_param(self.spec, name, value)
    }
}

/// Parses `expires` in the formats a recent `DateUtil.parseTZDateString` accepts:
/// `yyyy-MM-dd'T'HH:mm:ssZ` (`+0000`), ISO offset (`+00:00`, `Z`) with optional fractions.
pub fn parse_expires(s: &str) -> Option<Ms> {
    if let Ok(t) =
        jiff::fmt::strtime::parse("%Y-%m-%dT%H:%M:%S%z", s).and_then(|t| t.to_timestamp())
    {
        return Some(t.as_millisecond());
    }
    s.parse::<jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

/// Inputs besides the world that one API request needs.
pub struct Env<'a> {
    pub throttle: &'a mut ThrottleTable,
    /// Wall-clock ms (for `expires`).
    pub real_now_ms: Ms,
}

/// Handles one `/client/api` request against an already advanced world.
pub fn handle(world: &mut World, env: Env<'_>, params: &Params) -> ApiReply {
    let command = params.get("command").cloned().unwrap_or_default();
    let spec = commands::find(&command);
    match run(world, env, params, spec) {
        Ok(body) => ApiReply {
            status: 200,
            body,
            description: None,
            command,
        },
        Err(e) => error_reply(&command, spec, e),
    }
}

fn run(
    world: &mut World,
    env: Env<'_>,
    params: &Params,
    spec: Option<&'static CommandSpec>,
) -> Result<String, ApiError> {
    // 1. The command must exist (checked before anything else, wrapper `errorresponse`).
    let Some(spec) = spec else {
        return Err(ApiError::unauthorized().with_error_wrapper());
    };
    // 2. Signature and api key must be present; `apiKey` is matched case-insensitively.
    let mut signature = None;
    let mut api_key = None;
    let mut sigver = None;
    let mut expires = None;
    for (k, v) in params {
        if k.eq_ignore_ascii_case("signature") {
            signature = Some(v.as_str());
        } else if k.eq_ignore_ascii_case("apikey") {
            api_key = Some(v.as_str());
        } else if k.eq_ignore_ascii_case("signatureversion") {
            sigver = Some(v.as_str());
        } else if k.eq_ignore_ascii_case("expires") {
            expires = Some(v.as_str());
        }
    }
    let (Some(signature), Some(api_key)) = (signature, api_key) else {
        return Err(ApiError::unauthorized());
    };
    // 3. Signature version 3 needs a parseable, not yet passed `expires`.
    if sigver == Some("3") {
        let ok = expires
            .and_then(parse_expires)
            .is_some_and(|t| t >= env.real_now_ms);
        if !ok {
            return Err(ApiError::unauthorized());
        }
    }
    // 4. The key must belong to an enabled account.
    let Some(caller) = world.account_by_api_key(api_key) else {
        return Err(ApiError::unauthorized());
    };
    let account = &world.accounts[caller];
    if !account.enabled {
        return Err(ApiError::unauthorized());
    }
    // 5. Access checkers: rate limit, then dynamic roles (before the signature check).
    let throttle = if account.is_root_admin() {
        None
    } else {
        account.throttle.or(world.settings.throttle)
    };
    if let Some(t) = throttle {
        if let Some(retry_ms) = env.throttle.hit(caller, t, 1) {
            return Err(ApiError::server(
                429,
                format!(
                    "The given user has reached his/her account api limit, please retry after [{retry_ms}] ms."
                ),
            ));
        }
    }
    match access(world, caller, spec) {
        Access::Allowed => {}
        Access::Denied => {
            return Err(ApiError::server(
                401,
                format!(
                    "The given command '{}' either does not exist, is not available for user.",
                    spec.name
                ),
            ))
        }
        Access::Unavailable => {
            return Err(ApiError::server(
                432,
                format!(
                    "The API {} does not exist or is not available for this account.",
                    spec.name
                ),
            )
            .with_error_wrapper())
        }
    }
    // 6. The HMAC, compared in constant time.
    let canonical = canonical_string(
        params
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("signature"))
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    let expected = sign_canonical(world.accounts[caller].secret_key.expose(), &canonical);
    if !signature_matches(&expected, signature) {
        return Err(ApiError::unauthorized());
    }
    // 7. Parameter processing and execution.
    let paging = if spec.is_list {
        paging(params, spec, world.settings.default_page_size)?
    } else {
        Paging {
            start: 0,
            size: None,
        }
    };
    let mut call = Call {
        world,
        caller,
        params,
        spec,
        paging,
        throttle,
        extra_throttle_hits: 0,
    };
    let reply = (spec.handler)(&mut call)?;
    if let (Some(t), n) = (throttle, call.extra_throttle_hits) {
        if n > 0 {
            let _ = env.throttle.hit(caller, t, n);
        }
    }
    Ok(render(spec, reply))
}

/// Outcome of the role check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Allowed,
    Denied,
    Unavailable,
}

/// Dynamic-role evaluation: root admin → everything; rules in order, first match decides;
/// no match → the command's annotation (only when the role enables the fallback, or when
/// the account has no role at all) → else unavailable.
pub fn access(world: &World, caller: usize, spec: &CommandSpec) -> Access {
    let a = &world.accounts[caller];
    if a.is_root_admin() && a.role.is_none() {
        return Access::Allowed;
    }
    let annotated = |t: AccountType| spec.authorized.contains(&t);
    match &a.role {
        None => {
            if annotated(a.kind) {
                Access::Allowed
            } else {
                Access::Unavailable
            }
        }
        Some(role) => match role.decide(spec.name) {
            RoleDecision::Allow => Access::Allowed,
            RoleDecision::Deny => Access::Denied,
            RoleDecision::NoRule if role.annotation_fallback && annotated(role.kind) => {
                Access::Allowed
            }
            RoleDecision::NoRule => Access::Unavailable,
        },
    }
}

fn paging(params: &Params, spec: &CommandSpec, max: u64) -> Result<Paging, ApiError> {
    let parse = |name: &str| -> Result<Option<i64>, ApiError> {
        match params.get(name).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<i64>()
                .ok()
                .filter(|n| i32::try_from(*n).is_ok())
                .map(Some)
                .ok_or_else(|| ApiError::bad_param(spec, name, v)),
        }
    };
    let page = parse("page")?;
    let pagesize = parse("pagesize")?;
    if page.is_none() && pagesize.is_some_and(|s| s != -1) {
        return Err(ApiError::server(
            431,
            "\"page\" parameter is required when \"pagesize\" is specified",
        ));
    }
    if pagesize.is_none() && page.is_some() {
        return Err(ApiError::server(
            431,
            "\"pagesize\" parameter is required when \"page\" is specified",
        ));
    }
    if let Some(s) = pagesize {
        if s > max as i64 {
            return Err(ApiError::invalid_value(format!(
                "Page size can't exceed max allowed page size value: {max}"
            )));
        }
        if s == -1 && page.is_some() {
            return Err(ApiError::invalid_value(
                "Can't specify page parameter when pagesize is -1 (Unlimited)",
            ));
        }
        if s < -1 {
            return Err(ApiError::bad_param(spec, "pagesize", &s.to_string()));
        }
    }
    let size = match pagesize {
        Some(-1) => None,
        Some(s) => Some(s as usize),
        None => Some(max as usize),
    };
    let start = match (page, size) {
        (Some(p), Some(s)) if p > 0 => ((p - 1) as usize).saturating_mul(s),
        _ => 0,
    };
    Ok(Paging { start, size })
}

fn render(spec: &CommandSpec, reply: Reply) -> String {
    let inner = match reply {
        Reply::List { items, count } => {
            let mut m = Map::new();
            if count > 0 {
                m.insert("count".into(), json!(count));
            }
            if !items.is_empty() {
                m.insert(spec.item_key.to_string(), Value::Array(items));
            }
            m
        }
        Reply::Object(key, v) => {
            let mut m = Map::new();
            m.insert(key.to_string(), v);
            m
        }
        Reply::Raw(m) => m,
    };
    let mut outer = Map::new();
    outer.insert(spec.response.to_string(), Value::Object(inner));
    Value::Object(outer).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloudstack_api::signing::signed_query;

    const T0: Ms = 1_700_000_000_000;

    fn world() -> World {
        World::default_world("KEY", "SECRET", T0)
    }

    fn call(w: &mut World, query: &str) -> ApiReply {
        let mut t = ThrottleTable::default();
        let p = collect_params(Some(query), None);
        handle(
            w,
            Env {
                throttle: &mut t,
                real_now_ms: T0,
            },
            &p,
        )
    }

    /// Python's `quote(value, safe="*")`: leaves `A-Za-z0-9_.-~` and `*` unescaped.
    fn python_quote(v: &str) -> String {
        let mut out = String::new();
        for b in v.bytes() {
            if b.is_ascii_alphanumeric() || b"_.-~*".contains(&b) {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    }

    #[test]
    fn cs_style_tilde_encoding_is_rejected_like_cloudstack() {
        let mut w = world();
        let params = [
            ("apiKey", "KEY"),
            ("command", "listVirtualMachines"),
            ("keyword", "a~b"),
            ("response", "json"),
        ];
        // What the `cs` client signs: values quoted with safe="*", `~` left as is.
        let client_canonical = params
            .iter()
            .map(|(k, v)| format!("{k}={}", python_quote(v)))
            .collect::<Vec<_>>()
            .join("&")
            .to_lowercase();
        assert!(client_canonical.contains("keyword=a~b"));
        let sig = sign_canonical("SECRET", &client_canonical);
        let wire = format!(
            "apiKey=KEY&command=listVirtualMachines&keyword=a~b&response=json&signature={}",
            cloudstack_api::signing::java_url_encode(sig.expose())
        );
        let r = call(&mut w, &wire);
        assert_eq!(r.status, 401);
        assert!(r.body.contains(UNAUTHORIZED_TEXT));
        // The same request signed like the server (Java encoding) is accepted.
        let ok = signed_query("SECRET", params);
        assert_eq!(call(&mut w, &ok).status, 200);
    }

    #[test]
    fn unknown_command_is_401_errorresponse_even_unsigned() {
        let mut w = world();
        let r = call(&mut w, "command=listFoo&response=json");
        assert_eq!(r.status, 401);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["errorresponse"]["errorcode"], 401);
        assert!(v["errorresponse"].get("cserrorcode").is_none());
    }

    #[test]
    fn expires_formats() {
        assert!(parse_expires("2030-01-01T00:00:00+0000").is_some());
        assert!(parse_expires("2030-01-01T00:00:00Z").is_some());
        assert!(parse_expires("2030-01-01T00:00:00+00:00").is_some());
        assert!(parse_expires("2030-01-01T00:00:00.123Z").is_some());
        assert!(parse_expires("2030-01-01 00:00:00").is_none());
        assert!(parse_expires("tomorrow").is_none());
    }

    #[test]
    fn params_query_overrides_body_and_last_query_value_wins() {
        let p = collect_params(Some("a=1&a=2&b=%2B+x"), Some(b"a=0&c=3&c=4"));
        assert_eq!(p["a"], "2");
        assert_eq!(p["b"], "+ x");
        assert_eq!(p["c"], "3");
    }

    #[test]
    fn error_leaks_no_secret() {
        let mut w = world();
        let q = signed_query(
            "WRONG",
            [("apiKey", "KEY"), ("command", "listVirtualMachines")],
        );
        let sent = q.rsplit("signature=").next().unwrap().to_string();
        let r = call(&mut w, &q);
        assert_eq!(r.status, 401);
        assert!(!r.body.contains("SECRET") && !r.body.contains(&sent));
        let expected = sign_canonical("SECRET", "apikey=key&command=listvirtualmachines");
        assert!(!r.body.contains(expected.expose()));
        assert!(r.description.is_none());
    }
}
