//! The CloudStack HTTP client: signed GET requests, retries, rate limiting and pagination.
//!
//! Every request carries `response=json`, `signatureversion=3` and a fresh `expires` in the
//! `+0000` form, and is signed again on every attempt (cloudstack-api.md §1, §10). Only read
//! commands (`list*`, `get*`, `query*`) are retried. Nothing here logs or returns a request
//! URL: it embeds the signature, which is a replayable credential until `expires`.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rand::Rng as _;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::error::{sanitize_text, CloudStackError, MAX_ERRORTEXT_CHARS};
use super::model::{ApiInfo, Capabilities, CsTime, ListItem, UsageHistoryVm, VirtualMachine};
use super::parse::{
    parse_capabilities, parse_list_page, parse_value, ItemFailure, ListPage, Reply,
};
use super::ratelimit::{RateLimit, TokenBucket};
use super::signing;

/// `default.page.size` of a stock CloudStack: the default and the maximum page size.
pub const DEFAULT_PAGE_SIZE: u32 = 500;
/// How many ids go into one `ids=` parameter (keeps request URLs far below proxy limits).
pub const IDS_PER_REQUEST: usize = 100;
/// Upper bound on pages of one listing (500 × 10 000 rows is far beyond any real scope).
pub const MAX_PAGES: u32 = 10_000;
/// Upper bound on a response body.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// How often one listing may shrink the page size after "Page size can't exceed …".
const MAX_PAGE_SIZE_SHRINKS: u32 = 4;

/// API key and secret key. `Debug` shows a shortened API key and never the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    api_key: String,
    secret_key: String,
}

impl Credentials {
    pub fn new(
        api_key: impl Into<String>,
        secret_key: impl Into<String>,
    ) -> Result<Self, CloudStackError> {
        let api_key = api_key.into();
        let secret_key = secret_key.into();
        if api_key.trim().is_empty() {
            return Err(CloudStackError::config("the api-key is empty"));
        }
        if secret_key.trim().is_empty() {
            return Err(CloudStackError::config("the secret-key is empty"));
        }
        Ok(Self {
            api_key,
            secret_key,
        })
    }

    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// The API key shortened for logs: `plgW…66mg`.
    pub fn api_key_hint(&self) -> String {
        let chars: Vec<char> = self.api_key.chars().collect();
        if chars.len() <= 12 {
            "<short key>".to_string()
        } else {
            let head: String = chars[..4].iter().collect();
            let tail: String = chars[chars.len() - 4..].iter().collect();
            format!("{head}…{tail}")
        }
    }

    pub(crate) fn secret_key(&self) -> &str {
        &self.secret_key
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("api_key", &self.api_key_hint())
            .field("secret_key", &"<redacted>")
            .finish()
    }
}

/// Back-off for retryable errors of read commands.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in total, including the first (1 = no retries).
    pub max_attempts: u32,
    /// Delay before the first retry; doubles on each further retry.
    pub base_delay: Duration,
    /// Cap of the exponential delay.
    pub max_delay: Duration,
    /// Fraction (0–1) of each delay that is randomised away ("equal jitter" at 0.5).
    pub jitter: f64,
    /// Longest server-requested wait (429 "retry after") honoured inside one call; longer
    /// requests end the call with `Throttled` so the caller's poll loop backs off instead.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(5),
            jitter: 0.5,
            max_retry_after: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The delay before retry number `retry` (1-based), with `unit` ∈ [0, 1) as the random draw.
    pub fn delay_with(&self, retry: u32, unit: f64) -> Duration {
        let exp = retry.saturating_sub(1).min(30);
        let raw = self
            .base_delay
            .checked_mul(1u32 << exp)
            .unwrap_or(self.max_delay)
            .min(self.max_delay);
        let jitter = self.jitter.clamp(0.0, 1.0) * unit.clamp(0.0, 1.0);
        raw.mul_f64(1.0 - jitter)
    }

    fn delay(&self, retry: u32) -> Duration {
        self.delay_with(retry, rand::rng().random::<f64>())
    }

    fn validate(&self) -> Result<(), CloudStackError> {
        if self.max_attempts == 0 {
            return Err(CloudStackError::config(
                "retry max_attempts must be at least 1",
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(CloudStackError::config(
                "retry jitter must be between 0 and 1",
            ));
        }
        if self.base_delay > self.max_delay {
            return Err(CloudStackError::config(
                "retry base_delay must not exceed max_delay",
            ));
        }
        Ok(())
    }
}

/// Everything the client needs for one CloudStack endpoint.
#[derive(Clone)]
pub struct ClientConfig {
    /// The API endpoint, e.g. `https://cloud.example.com/client/api`.
    pub api_url: url::Url,
    pub credentials: Credentials,
    /// TLS certificate verification (the CAPC Secret's `verify-ssl: "false"` turns it off).
    pub verify_tls: bool,
    /// Extra CA certificates (PEM bundle) trusted in addition to the system roots.
    pub extra_ca_pem: Option<Vec<u8>>,
    /// Whole-request timeout (connect + send + complete body).
    pub request_timeout: Duration,
    /// Lifetime of each signature (`expires` = now + this).
    pub signature_lifetime: Duration,
    /// Requested page size; shrunk automatically when the server's maximum is lower.
    pub page_size: u32,
    pub retry: RetryPolicy,
    /// Client-side rate limit for this endpoint (`None` = unlimited).
    pub rate_limit: Option<RateLimit>,
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("api_url", &self.api_url.as_str())
            .field("credentials", &self.credentials)
            .field("verify_tls", &self.verify_tls)
            .field(
                "extra_ca_pem",
                &self
                    .extra_ca_pem
                    .as_ref()
                    .map(|p| format!("<{} bytes>", p.len())),
            )
            .field("request_timeout", &self.request_timeout)
            .field("signature_lifetime", &self.signature_lifetime)
            .field("page_size", &self.page_size)
            .field("retry", &self.retry)
            .field("rate_limit", &self.rate_limit)
            .finish()
    }
}

/// Keys of the CAPC credentials Secret.
pub const SECRET_KEY_API_URL: &str = "api-url";
pub const SECRET_KEY_API_KEY: &str = "api-key";
pub const SECRET_KEY_SECRET_KEY: &str = "secret-key";
pub const SECRET_KEY_VERIFY_SSL: &str = "verify-ssl";

impl ClientConfig {
    /// A configuration with defaults: TLS verified, 30 s timeout, 5 min signatures,
    /// 500-row pages, 4 attempts, 5 requests/s with a burst of 10.
    pub fn new(api_url: &str, credentials: Credentials) -> Result<Self, CloudStackError> {
        Ok(Self {
            api_url: parse_api_url(api_url)?,
            credentials,
            verify_tls: true,
            extra_ca_pem: None,
            request_timeout: Duration::from_secs(30),
            signature_lifetime: Duration::from_secs(300),
            page_size: DEFAULT_PAGE_SIZE,
            retry: RetryPolicy::default(),
            rate_limit: Some(RateLimit {
                per_second: 5.0,
                burst: 10,
            }),
        })
    }

    /// From the data of a CAPC-style Secret (`api-url`, `api-key`, `secret-key`, optional
    /// `verify-ssl`). Values may carry surrounding whitespace (e.g. a trailing newline).
    /// Errors name the missing or bad key and never include a value.
    pub fn from_secret_data<I, K, V>(data: I) -> Result<Self, CloudStackError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<[u8]>,
    {
        let map: BTreeMap<String, Vec<u8>> = data
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_vec()))
            .collect();
        let present = || {
            let keys: Vec<&str> = map.keys().map(String::as_str).collect();
            if keys.is_empty() {
                "none".to_string()
            } else {
                keys.join(", ")
            }
        };
        let get = |key: &str, required: bool| -> Result<Option<String>, CloudStackError> {
            let Some(raw) = map.get(key) else {
                return if required {
                    Err(CloudStackError::config(format!(
                        "the CloudStack credentials Secret has no `{key}` key (required: \
                         {SECRET_KEY_API_URL}, {SECRET_KEY_API_KEY}, {SECRET_KEY_SECRET_KEY}; \
                         optional: {SECRET_KEY_VERIFY_SSL}; present: {})",
                        present()
                    )))
                } else {
                    Ok(None)
                };
            };
            let text = std::str::from_utf8(raw).map_err(|_| {
                CloudStackError::config(format!(
                    "the `{key}` value of the CloudStack credentials Secret is not UTF-8 text"
                ))
            })?;
            let text = text.trim();
            if text.is_empty() && !required {
                return Ok(None);
            }
            if text.is_empty() {
                return Err(CloudStackError::config(format!(
                    "the `{key}` value of the CloudStack credentials Secret is empty"
                )));
            }
            Ok(Some(text.to_string()))
        };
        let api_url = get(SECRET_KEY_API_URL, true)?.unwrap_or_default();
        let api_key = get(SECRET_KEY_API_KEY, true)?.unwrap_or_default();
        let secret_key = get(SECRET_KEY_SECRET_KEY, true)?.unwrap_or_default();
        let verify_tls = match get(SECRET_KEY_VERIFY_SSL, false)? {
            None => true,
            Some(v) => parse_bool(&v).ok_or_else(|| {
                CloudStackError::config(format!(
                    "the `{SECRET_KEY_VERIFY_SSL}` value of the CloudStack credentials Secret \
                     is not a boolean (use \"true\" or \"false\")"
                ))
            })?,
        };
        let mut cfg = Self::new(&api_url, Credentials::new(api_key, secret_key)?)
            .map_err(|e| match e {
                CloudStackError::Config { detail } => CloudStackError::config(format!(
                    "the `{SECRET_KEY_API_URL}` value of the CloudStack credentials Secret: {detail}"
                )),
                other => other,
            })?;
        cfg.verify_tls = verify_tls;
        Ok(cfg)
    }

    /// Checks the numbers; the client calls this on construction.
    pub fn validate(&self) -> Result<(), CloudStackError> {
        if self.page_size == 0 {
            return Err(CloudStackError::config("page_size must be at least 1"));
        }
        if self.request_timeout.is_zero() {
            return Err(CloudStackError::config("request_timeout must be positive"));
        }
        if self.signature_lifetime < Duration::from_secs(10)
            || self.signature_lifetime > Duration::from_secs(24 * 3600)
        {
            return Err(CloudStackError::config(
                "signature_lifetime must be between 10 s and 24 h (a few minutes is best)",
            ));
        }
        self.retry.validate()?;
        if let Some(rl) = &self.rate_limit {
            rl.validate()?;
        }
        Ok(())
    }
}

/// Go-`strconv.ParseBool`-style booleans.
fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "t" | "1" | "yes" => Some(true),
        "false" | "f" | "0" | "no" => Some(false),
        _ => None,
    }
}

fn parse_api_url(s: &str) -> Result<url::Url, CloudStackError> {
    let url = url::Url::parse(s.trim())
        .map_err(|e| CloudStackError::config(format!("api-url is not a valid URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(CloudStackError::config(
            "api-url must be an http:// or https:// URL",
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(CloudStackError::config("api-url has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(CloudStackError::config(
            "api-url must not contain user:password@ (use api-key and secret-key)",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(CloudStackError::config(
            "api-url must not contain a query string or fragment (it should end in /client/api)",
        ));
    }
    Ok(url)
}

/// Which VMs to list. All scoping fields are optional; `ids` are matched exactly
/// (an id CloudStack never knew fails the whole request with 431 — prefer client-side matching).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmListQuery {
    /// Project UUID, or `-1` for all projects the caller can see.
    pub project_id: Option<String>,
    pub zone_id: Option<String>,
    /// Account name (must be combined with `domain_id`).
    pub account: Option<String>,
    pub domain_id: Option<String>,
    pub ids: Vec<String>,
    /// Use `listVirtualMachinesMetrics` (CAPC's call) instead of `listVirtualMachines`.
    pub use_metrics_api: bool,
}

/// The outcome of a paginated listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing<T> {
    /// Unique items (by id) in server order.
    pub items: Vec<T>,
    /// Items that could not be parsed; `index` is the row position across pages.
    pub failures: Vec<ItemFailure>,
    /// `true` only when every page was read, every item parsed and the rows add up to the
    /// server's `count`. Only a complete listing proves that a VM is absent.
    pub complete: bool,
    /// Pages read.
    pub pages: u32,
    /// HTTP requests made (including retries).
    pub calls: u32,
    /// The largest `count` the server reported (when it reported one).
    pub count: Option<u64>,
}

/// A `listVirtualMachines` result.
#[derive(Debug, Clone, PartialEq)]
pub struct VmListing {
    pub vms: Vec<VirtualMachine>,
    pub failures: Vec<ItemFailure>,
    /// See [`Listing::complete`]. An incomplete listing must not be used as evidence that a
    /// VM is gone.
    pub complete: bool,
    pub pages: u32,
    pub calls: u32,
}

/// Counters of what the client did (for metrics and `/status`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallStats {
    /// HTTP requests sent.
    pub calls: u64,
    /// Requests per (command, outcome); outcome = `ok` or [`CloudStackError::kind`].
    pub by_command: BTreeMap<(String, String), u64>,
    /// Retries performed.
    pub retries: u64,
    /// Total time spent waiting for the rate limiter.
    pub rate_limit_wait: Duration,
    /// Requests that had to wait for the rate limiter.
    pub rate_limited_calls: u64,
}

/// A CloudStack API client for one endpoint and one key pair.
pub struct CloudStackClient {
    http: reqwest::Client,
    base_url: String,
    credentials: Credentials,
    request_timeout: Duration,
    signature_lifetime: Duration,
    retry: RetryPolicy,
    limiter: Option<TokenBucket>,
    page_size: AtomicU32,
    calls: AtomicU64,
    stats: Mutex<CallStats>,
}

impl fmt::Debug for CloudStackClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudStackClient")
            .field("api_url", &self.base_url)
            .field("credentials", &self.credentials)
            .field("page_size", &self.page_size())
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

/// Read commands, safe to repeat.
fn is_read_command(command: &str) -> bool {
    let c = command.to_ascii_lowercase();
    c.starts_with("list") || c.starts_with("get") || c.starts_with("query")
}

/// Parameters the client sets itself; callers cannot override them.
fn is_reserved_param(name: &str) -> bool {
    matches!(
        name,
        "apikey" | "command" | "response" | "signature" | "signatureversion" | "expires"
    )
}

impl CloudStackClient {
    pub fn new(config: ClientConfig) -> Result<Self, CloudStackError> {
        config.validate()?;
        // reqwest is built without a crypto provider (style.md §1); installing ring is
        // idempotent: a provider installed earlier stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("capc-health-shim/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = &config.extra_ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|_| {
                CloudStackError::config("the extra CA bundle is not a valid PEM certificate bundle")
            })?;
            if certs.is_empty() {
                return Err(CloudStackError::config(
                    "the extra CA bundle contains no PEM certificates",
                ));
            }
            builder = builder.tls_certs_merge(certs);
        }
        if !config.verify_tls {
            warn!(
                api_url = %config.api_url,
                "TLS certificate verification is disabled for this CloudStack endpoint (verify-ssl=false)"
            );
            builder = builder.tls_danger_accept_invalid_certs(true);
        }
        let http = builder.build().map_err(|e| {
            CloudStackError::config(format!(
                "cannot set up the HTTP client (check the CA bundle): {}",
                error_chain(&e.without_url())
            ))
        })?;
        let limiter = config.rate_limit.map(TokenBucket::new).transpose()?;
        let mut base_url = config.api_url.clone();
        base_url.set_query(None);
        base_url.set_fragment(None);
        Ok(Self {
            http,
            base_url: base_url.to_string(),
            credentials: config.credentials,
            request_timeout: config.request_timeout,
            signature_lifetime: config.signature_lifetime,
            retry: config.retry,
            limiter,
            page_size: AtomicU32::new(config.page_size),
            calls: AtomicU64::new(0),
            stats: Mutex::new(CallStats::default()),
        })
    }

    /// HTTP requests sent so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// A snapshot of the call counters.
    pub fn stats(&self) -> CallStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The page size in use (shrinks after a page-size 431).
    pub fn page_size(&self) -> u32 {
        self.page_size.load(Ordering::Relaxed)
    }

    pub fn api_url(&self) -> &str {
        &self.base_url
    }

    /// Builds the signed query for one attempt. Returns the URL, the signature (raw and
    /// as encoded on the wire) for redaction, and the time `expires` was computed from.
    fn signed_url(
        &self,
        command: &str,
        params: &[(&str, &str)],
    ) -> Result<(reqwest::Url, [String; 2], jiff::Timestamp), CloudStackError> {
        let lifetime = jiff::SignedDuration::try_from(self.signature_lifetime)
            .map_err(|_| CloudStackError::config("signature_lifetime out of range"))?;
        let signed_at = jiff::Timestamp::now();
        let expires = signed_at
            .checked_add(lifetime)
            .map_err(|_| CloudStackError::config("signature_lifetime out of range"))?;
        let expires = CsTime(expires).to_cloudstack_string();
        // one value per name (the server signs only one), names lowercase
        let mut user: BTreeMap<String, &str> = BTreeMap::new();
        for (k, v) in params {
            let k = k.to_ascii_lowercase();
            if !is_reserved_param(&k) {
                user.insert(k, v);
            }
        }
        let mut all: Vec<(&str, &str)> = vec![
            ("apiKey", self.credentials.api_key()),
            ("command", command),
            ("response", "json"),
            ("signatureversion", "3"),
            ("expires", &expires),
        ];
        all.extend(user.iter().map(|(k, v)| (k.as_str(), *v)));
        let query = signing::signed_query(self.credentials.secret_key(), all.iter().copied());
        let encoded_sig = query
            .rsplit_once("&signature=")
            .map(|(_, s)| s.to_string())
            .unwrap_or_default();
        let raw_sig = percent_decode(&encoded_sig);
        let url = reqwest::Url::parse(&format!("{}?{}", self.base_url, query))
            .map_err(|e| CloudStackError::config(format!("cannot build the request URL ({e})")))?;
        Ok((url, [raw_sig, encoded_sig], signed_at))
    }

    fn record(&self, command: &str, outcome: &str, waited: Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut st = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        st.calls += 1;
        *st.by_command
            .entry((command.to_string(), outcome.to_string()))
            .or_insert(0) += 1;
        if !waited.is_zero() {
            st.rate_limit_wait += waited;
            st.rate_limited_calls += 1;
        }
    }

    /// One HTTP exchange: status, content type, body, and the server's `Date` header.
    async fn send_once(
        &self,
        url: reqwest::Url,
    ) -> Result<(u16, Option<String>, Vec<u8>, Option<jiff::Timestamp>), CloudStackError> {
        let map = |e: reqwest::Error| self.map_reqwest_error(e);
        let mut resp = self
            .http
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(map)?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let date = resp
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| jiff::fmt::rfc2822::parse(v).ok())
            .map(|z| z.timestamp());
        let mut body = Vec::with_capacity(resp.content_length().unwrap_or(0).min(1 << 20) as usize);
        while let Some(chunk) = resp.chunk().await.map_err(map)? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(CloudStackError::malformed(format!(
                    "response body larger than {} MiB",
                    MAX_BODY_BYTES >> 20
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, content_type, body, date))
    }

    fn map_reqwest_error(&self, e: reqwest::Error) -> CloudStackError {
        let e = e.without_url();
        if e.is_timeout() {
            CloudStackError::Timeout {
                after: self.request_timeout,
            }
        } else if e.is_builder() {
            CloudStackError::config(error_chain(&e))
        } else {
            CloudStackError::Transport {
                detail: error_chain(&e),
            }
        }
    }

    /// Sends `command` with retries; `parse` turns each reply into the result (and decides
    /// which answers are errors, so error envelopes in a 200 are retried like real statuses).
    async fn request<R>(
        &self,
        command: &str,
        params: &[(&str, &str)],
        calls: &mut u32,
        parse: impl Fn(Reply<'_>) -> Result<R, CloudStackError>,
    ) -> Result<R, CloudStackError> {
        let retry_allowed = is_read_command(command);
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let waited = match &self.limiter {
                Some(l) => l.acquire().await,
                None => Duration::ZERO,
            };
            let (url, sig, signed_at) = self.signed_url(command, params)?;
            let started = Instant::now();
            debug!(
                command,
                attempt,
                waited_ms = waited.as_millis() as u64,
                "CloudStack request"
            );
            *calls += 1;
            let outcome = match self.send_once(url).await {
                Ok((status, ct, body, date)) => {
                    debug!(
                        command,
                        status,
                        bytes = body.len(),
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "CloudStack response"
                    );
                    parse(Reply::new(status, ct.as_deref(), &body))
                        .map_err(|e| e.with_server_clock(date, signed_at, self.signature_lifetime))
                }
                Err(e) => Err(e),
            };
            let outcome = outcome.map_err(|e| {
                e.redact(&[
                    sig[0].as_str(),
                    sig[1].as_str(),
                    self.credentials.secret_key(),
                ])
            });
            self.record(
                command,
                match &outcome {
                    Ok(_) => "ok",
                    Err(e) => e.kind(),
                },
                waited,
            );
            let err = match outcome {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            if !retry_allowed || !err.is_retryable() || attempt >= self.retry.max_attempts {
                return Err(err);
            }
            let delay = match err.retry_after() {
                Some(ra) if ra > self.retry.max_retry_after => return Err(err),
                // honour the server's wait, plus up to 10 % so throttled clients spread out
                Some(ra) => ra + ra.mul_f64(0.1 * rand::rng().random::<f64>()),
                None if matches!(err, CloudStackError::Throttled { .. }) => self
                    .retry
                    .delay(attempt)
                    .max(Duration::from_secs(1))
                    .min(self.retry.max_retry_after),
                None => self.retry.delay(attempt),
            };
            debug!(
                command,
                attempt,
                error = err.kind(),
                delay_ms = delay.as_millis() as u64,
                "retrying CloudStack request"
            );
            self.stats.lock().unwrap_or_else(|p| p.into_inner()).retries += 1;
            tokio::time::sleep(delay).await;
        }
    }

    /// Any command, returning the unwrapped response object as JSON.
    pub async fn call(
        &self,
        command: &str,
        params: &[(&str, &str)],
    ) -> Result<Value, CloudStackError> {
        let mut calls = 0;
        self.request(command, params, &mut calls, |r| parse_value(command, r))
            .await
    }

    /// A paginated list API: every page of `command`, items under `item_key`.
    pub async fn list<T: DeserializeOwned + ListItem>(
        &self,
        command: &str,
        item_key: &str,
        params: &[(&str, &str)],
    ) -> Result<Listing<T>, CloudStackError> {
        self.list_pages(command, item_key, params, true).await
    }

    async fn list_pages<T: DeserializeOwned + ListItem>(
        &self,
        command: &str,
        item_key: &str,
        params: &[(&str, &str)],
        count_is_total: bool,
    ) -> Result<Listing<T>, CloudStackError> {
        let params: Vec<(&str, &str)> = params
            .iter()
            .filter(|(k, _)| !matches!(k.to_ascii_lowercase().as_str(), "page" | "pagesize"))
            .copied()
            .collect();
        let mut seen: HashSet<String> = HashSet::new();
        let mut items: Vec<T> = Vec::new();
        let mut failures: Vec<ItemFailure> = Vec::new();
        let mut rows_before_page: usize = 0;
        let mut page_no: u32 = 1;
        let mut pages: u32 = 0;
        let mut calls: u32 = 0;
        let mut shrinks: u32 = 0;
        let mut counts: Vec<u64> = Vec::new();
        let mut exhausted = false;
        while pages < MAX_PAGES {
            let size = self.page_size();
            let page_s = page_no.to_string();
            let size_s = size.to_string();
            let mut p = params.clone();
            p.push(("page", &page_s));
            p.push(("pagesize", &size_s));
            let res: Result<ListPage<T>, _> = self
                .request(command, &p, &mut calls, |r| {
                    parse_list_page::<T>(command, item_key, r)
                })
                .await;
            let page = match res {
                Ok(page) => page,
                Err(e) if e.is_page_size_error() && shrinks < MAX_PAGE_SIZE_SHRINKS && size > 1 => {
                    let max = match &e {
                        CloudStackError::InvalidParameter { page_size_max, .. } => *page_size_max,
                        _ => None,
                    };
                    let new = match max {
                        Some(m) if m < size => m,
                        _ => size / 2,
                    }
                    .max(1);
                    warn!(
                        command,
                        from = size,
                        to = new,
                        "CloudStack rejected the page size; using the server's maximum"
                    );
                    // another task may have shrunk it already: only ever go down
                    self.page_size.fetch_min(new, Ordering::Relaxed);
                    shrinks += 1;
                    // rows are aligned to the page size: start over (ids de-duplicate)
                    page_no = 1;
                    rows_before_page = 0;
                    continue;
                }
                Err(e) => return Err(e),
            };
            pages += 1;
            if page.count_present {
                counts.push(page.count);
            }
            for mut f in page.failures {
                f.index += rows_before_page;
                failures.push(f);
            }
            for item in page.items {
                match item.item_id() {
                    Some(id) => {
                        if seen.insert(id.to_string()) {
                            items.push(item);
                        }
                    }
                    None => items.push(item),
                }
            }
            rows_before_page += page.received;
            let collected = items.len() + failures.len();
            let short = page.received < size as usize;
            let reached_count =
                count_is_total && page.count_present && collected as u64 >= page.count;
            if page.received == 0 || short || reached_count {
                exhausted = true;
                break;
            }
            page_no += 1;
        }
        if !exhausted {
            warn!(
                command,
                pages, "CloudStack listing stopped at the page limit"
            );
        }
        let max_count = counts.iter().copied().max();
        let counts_agree = counts.windows(2).all(|w| w[0] == w[1]);
        let adds_up = match (count_is_total, max_count) {
            (true, Some(c)) => (items.len() + failures.len()) as u64 >= c && counts_agree,
            _ => true,
        };
        let complete = exhausted && failures.is_empty() && adds_up;
        if !failures.is_empty() {
            warn!(
                command,
                failed = failures.len(),
                "CloudStack listing has items that could not be read; treating it as incomplete"
            );
        } else if !complete {
            debug!(
                command,
                pages, "CloudStack listing is incomplete (rows shifted between pages)"
            );
        }
        Ok(Listing {
            items,
            failures,
            complete,
            pages,
            calls,
            count: max_count,
        })
    }

    /// Lists the VMs of a scope (`listall=true`, `details=nics,stats`), all pages.
    pub async fn list_virtual_machines(
        &self,
        query: &VmListQuery,
    ) -> Result<VmListing, CloudStackError> {
        let command = if query.use_metrics_api {
            "listVirtualMachinesMetrics"
        } else {
            "listVirtualMachines"
        };
        let mut base: Vec<(&str, &str)> = vec![("listall", "true"), ("details", "nics,stats")];
        if let Some(v) = &query.project_id {
            base.push(("projectid", v));
        }
        if let Some(v) = &query.zone_id {
            base.push(("zoneid", v));
        }
        if let Some(v) = &query.account {
            base.push(("account", v));
        }
        if let Some(v) = &query.domain_id {
            base.push(("domainid", v));
        }
        let chunks: Vec<String> = id_chunks(&query.ids, IDS_PER_REQUEST);
        let mut out = VmListing {
            vms: Vec::new(),
            failures: Vec::new(),
            complete: true,
            pages: 0,
            calls: 0,
        };
        let runs: Vec<Option<&str>> = if chunks.is_empty() {
            vec![None]
        } else {
            chunks.iter().map(|c| Some(c.as_str())).collect()
        };
        let mut seen: HashSet<String> = HashSet::new();
        for ids in runs {
            let mut p = base.clone();
            if let Some(ids) = ids {
                p.push(("ids", ids));
            }
            let l: Listing<VirtualMachine> = self.list(command, "virtualmachine", &p).await?;
            out.complete &= l.complete;
            out.pages += l.pages;
            out.calls += l.calls;
            out.failures.extend(l.failures);
            out.vms
                .extend(l.items.into_iter().filter(|vm| seen.insert(vm.id.clone())));
        }
        Ok(out)
    }

    /// Stats samples of the given VMs (`listVirtualMachinesUsageHistory`, CloudStack 4.17+).
    /// An older server or a role without the API gives [`CloudStackError::Unsupported`].
    /// `start_date` limits the samples (sent as `yyyy-MM-dd HH:mm:ss`, UTC).
    /// Unreadable items are skipped with a warning (usage history is only a liveness hint).
    pub async fn list_usage_history(
        &self,
        ids: &[String],
        start_date: Option<CsTime>,
    ) -> Result<Vec<UsageHistoryVm>, CloudStackError> {
        const COMMAND: &str = "listVirtualMachinesUsageHistory";
        let chunk = IDS_PER_REQUEST.min(self.page_size() as usize).max(1);
        let start = start_date.map(|t| t.0.strftime("%Y-%m-%d %H:%M:%S").to_string());
        let mut out: Vec<UsageHistoryVm> = Vec::new();
        for ids in id_chunks(ids, chunk) {
            let mut p: Vec<(&str, &str)> = vec![("ids", &ids)];
            if let Some(s) = &start {
                p.push(("startdate", s));
            }
            let l: Listing<UsageHistoryVm> = self
                .list_pages(COMMAND, "virtualmachine", &p, false)
                .await
                .map_err(|e| {
                    if e.is_command_unavailable() {
                        CloudStackError::Unsupported {
                            command: COMMAND.to_string(),
                            detail: e.detail().cloned().unwrap_or_default(),
                        }
                    } else {
                        e
                    }
                })?;
            if !l.failures.is_empty() {
                warn!(
                    command = COMMAND,
                    failed = l.failures.len(),
                    "skipping usage-history items that could not be read"
                );
            }
            out.extend(l.items);
        }
        Ok(out)
    }

    /// `listCapabilities`: version, API limits, stats retention.
    pub async fn list_capabilities(&self) -> Result<Capabilities, CloudStackError> {
        let mut calls = 0;
        self.request("listCapabilities", &[], &mut calls, parse_capabilities)
            .await
    }

    /// Whether this key's role may call `name` (`listApis name=<name>`; an unfiltered
    /// `listApis` can exhaust the throttling budget by itself, cloudstack-api.md §5.3).
    pub async fn api_allowed(&self, name: &str) -> Result<bool, CloudStackError> {
        let mut calls = 0;
        self.request("listApis", &[("name", name)], &mut calls, |r| {
            match parse_list_page::<ApiInfo>("listApis", "api", r) {
                Ok(page) => Ok(page.items.iter().any(|a| a.name.eq_ignore_ascii_case(name))),
                // the discovery plugin answers 530 "unable to find an api by that name" for
                // an API that is unknown or denied to the caller
                Err(CloudStackError::Server { code: 530, detail })
                    if detail.errortext.as_deref().is_some_and(|t| {
                        t.to_ascii_lowercase().contains("unable to find an api")
                    }) =>
                {
                    Ok(false)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }
}

/// Lower-cased, de-duplicated ids joined with commas, `per` ids per chunk.
fn id_chunks(ids: &[String], per: usize) -> Vec<String> {
    let mut seen = HashSet::new();
    let clean: Vec<String> = ids
        .iter()
        .map(|i| i.trim().to_ascii_lowercase())
        .filter(|i| !i.is_empty() && seen.insert(i.clone()))
        .collect();
    clean.chunks(per.max(1)).map(|c| c.join(",")).collect()
}

/// `e` and its sources, de-duplicated, sanitized.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        src = s.source();
    }
    sanitize_text(&parts.join(": "), MAX_ERRORTEXT_CHARS)
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_jitters() {
        let p = RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(350),
            jitter: 0.5,
            max_retry_after: Duration::from_secs(1),
        };
        assert_eq!(p.delay_with(1, 0.0), Duration::from_millis(100));
        assert_eq!(p.delay_with(2, 0.0), Duration::from_millis(200));
        assert_eq!(p.delay_with(3, 0.0), Duration::from_millis(350));
        assert_eq!(p.delay_with(40, 0.0), Duration::from_millis(350));
        assert_eq!(p.delay_with(2, 1.0), Duration::from_millis(100));
    }

    #[test]
    fn ids_are_chunked_lowercased_and_deduplicated() {
        let ids: Vec<String> = ["A", "b", "a", " c ", ""]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(id_chunks(&ids, 2), vec!["a,b".to_string(), "c".to_string()]);
        assert!(id_chunks(&[], 2).is_empty());
    }

    #[test]
    fn api_url_validation() {
        assert!(parse_api_url("https://cloud.example.com/client/api").is_ok());
        for bad in [
            "cloud.example.com/client/api",
            "ftp://x/client/api",
            "https://u:p@x/client/api",
            "https://x/client/api?command=x",
        ] {
            let e = parse_api_url(bad).unwrap_err();
            assert_eq!(e.kind(), "config", "{bad}");
            assert!(!e.to_string().contains("u:p"));
        }
    }

    #[test]
    fn read_commands() {
        assert!(is_read_command("listVirtualMachines"));
        assert!(is_read_command("queryAsyncJobResult"));
        assert!(!is_read_command("destroyVirtualMachine"));
    }
}
