//! Shared helpers of the `client_*` tests: a scripted CloudStack stand-in on 127.0.0.1:0 that
//! verifies every request's signature with the crate's own server-exact `signing` functions.
//! Included with `#[path]`; compiled alone it holds no tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::{Debug, Display};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use capc_health_shim::cloudstack::client::{
    ClientConfig, CloudStackClient, Credentials, RetryPolicy,
};
use capc_health_shim::cloudstack::model::CsTime;
use capc_health_shim::cloudstack::signing;
use tokio::time::Instant;

pub const SECRET: &str = "SENTINEL-SECRET-XYZ";
pub const API_KEY: &str = "test-api-key-0123456789abcdefghij";

/// What the server saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub raw_query: String,
    pub params: BTreeMap<String, String>,
    /// Everything wrong with the request (empty = a valid, correctly signed CloudStack call).
    pub problems: Vec<String>,
}

impl Seen {
    pub fn get(&self, k: &str) -> Option<&str> {
        self.params.get(k).map(String::as_str)
    }
    pub fn page(&self) -> u32 {
        self.get("page").and_then(|p| p.parse().ok()).unwrap_or(0)
    }
    pub fn pagesize(&self) -> u32 {
        self.get("pagesize")
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }
}

/// A canned answer.
#[derive(Debug, Clone)]
pub struct Canned {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
    pub delay: Duration,
}

impl Canned {
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "application/json; charset=UTF-8",
            body: body.into(),
            delay: Duration::ZERO,
        }
    }
    pub fn html(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/html",
            body: body.into(),
            delay: Duration::ZERO,
        }
    }
    pub fn delayed(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
}

type Script = Arc<dyn Fn(usize, &Seen) -> Canned + Send + Sync>;

#[derive(Clone)]
struct AppState {
    script: Script,
    seen: Arc<Mutex<Vec<Seen>>>,
}

pub struct TestServer {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Checks a request like CloudStack's `ApiServer.verifyRequest` does, plus our own rules.
fn inspect(raw_query: &str) -> Seen {
    let mut problems = Vec::new();
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(raw_query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let mut params = BTreeMap::new();
    for (k, v) in &pairs {
        if params.insert(k.clone(), v.clone()).is_some() {
            problems.push(format!("parameter {k} repeated"));
        }
        if k != "apiKey" && *k != k.to_ascii_lowercase() {
            problems.push(format!("parameter name {k} is not lowercase"));
        }
    }
    let unsigned: Vec<(&str, &str)> = pairs
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("signature"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    match params.get("signature") {
        None => problems.push("no signature".into()),
        Some(sig) => {
            let expected = signing::sign(SECRET, unsigned.iter().copied());
            if !signing::signature_matches(&expected, sig) {
                problems.push("signature does not verify".into());
            }
            // the wire form is exactly what the shared encoder produces
            if signing::signed_query(SECRET, unsigned.iter().copied()) != raw_query {
                problems.push("query on the wire differs from the canonical encoder".into());
            }
        }
    }
    if params.get("apiKey").map(String::as_str) != Some(API_KEY) {
        problems.push("apiKey missing or wrong".into());
    }
    if params.get("response").map(String::as_str) != Some("json") {
        problems.push("response=json missing".into());
    }
    if params.get("signatureversion").map(String::as_str) != Some("3") {
        problems.push("signatureversion=3 missing".into());
    }
    match params.get("expires") {
        None => problems.push("expires missing".into()),
        Some(e) => {
            if !e.ends_with("+0000") {
                problems.push(format!("expires {e} not in the +0000 form"));
            }
            match CsTime::parse(e) {
                Err(_) => problems.push("expires does not parse".into()),
                Ok(t) => {
                    let now = jiff::Timestamp::now();
                    if t.0 <= now {
                        problems.push("expires in the past".into());
                    }
                    if t.0 > now + jiff::SignedDuration::from_secs(5 * 60 + 5) {
                        problems.push("expires more than the signature lifetime ahead".into());
                    }
                }
            }
        }
    }
    if !params.contains_key("command") {
        problems.push("no command".into());
    }
    Seen {
        at: Instant::now(),
        raw_query: raw_query.to_string(),
        params,
        problems,
    }
}

async fn handle(State(st): State<AppState>, RawQuery(q): RawQuery) -> Response {
    let seen = inspect(q.as_deref().unwrap_or(""));
    let n = {
        let mut log = st.seen.lock().unwrap();
        log.push(seen.clone());
        log.len() - 1
    };
    let c = (st.script)(n, &seen);
    if !c.delay.is_zero() {
        tokio::time::sleep(c.delay).await;
    }
    let status = StatusCode::from_u16(c.status).unwrap();
    (status, [(header::CONTENT_TYPE, c.content_type)], c.body).into_response()
}

impl TestServer {
    /// Starts a server whose answer to request number `n` (0-based) is `script(n, &seen)`.
    pub async fn start(script: impl Fn(usize, &Seen) -> Canned + Send + Sync + 'static) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/client/api", axum::routing::get(handle))
            .with_state(AppState {
                script: Arc::new(script),
                seen: seen.clone(),
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url: format!("http://{addr}/client/api"),
            seen,
            task,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Asserts every request so far was a valid signed CloudStack call; returns them.
    pub fn all_valid(&self) -> Vec<Seen> {
        let seen = self.seen();
        for (i, s) in seen.iter().enumerate() {
            assert!(
                s.problems.is_empty(),
                "request {i}: {:?} ({})",
                s.problems,
                s.raw_query
            );
        }
        seen
    }

    /// Signatures the server received (decoded and as on the wire).
    pub fn signatures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in self.seen() {
            if let Some(sig) = s.params.get("signature") {
                out.push(sig.clone());
                out.push(signing::java_url_encode(sig));
            }
        }
        out
    }

    /// Neither the secret nor any signature this server received appears in `text`.
    pub fn assert_clean(&self, text: &str) {
        assert!(!text.contains(SECRET), "secret leaked: {text}");
        for sig in self.signatures() {
            assert!(!text.contains(&sig), "signature leaked: {text}");
        }
    }

    /// Debug and Display of `v` are clean.
    pub fn assert_redacted<T: Debug + Display>(&self, v: &T) {
        self.assert_clean(&format!("{v:?}"));
        self.assert_clean(&format!("{v}"));
    }
}

pub fn credentials() -> Credentials {
    Credentials::new(API_KEY, SECRET).unwrap()
}

/// Test defaults: fast retries, no rate limit, 5 s timeout.
pub fn config(url: &str) -> ClientConfig {
    let mut c = ClientConfig::new(url, credentials()).unwrap();
    c.retry = RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(40),
        jitter: 0.5,
        max_retry_after: Duration::from_secs(2),
    };
    c.rate_limit = None;
    c.request_timeout = Duration::from_secs(5);
    c
}

pub fn client(url: &str) -> CloudStackClient {
    CloudStackClient::new(config(url)).unwrap()
}

/// Runs `f` under a deadline.
pub async fn within<F: Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .unwrap_or_else(|_| panic!("test did not finish within {secs} s"))
}

pub fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("cloudstack-fixtures/wire")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}
