//! The CloudStack HTTP client: signed GET requests, retries, rate limiting and pagination.
//!
//! Every request carries `response=json`, `signatureversion=3` and a fresh `expires` in the
//! `+0000` form, and is signed again on every attempt (cloudstack-api.md §1, §10). Only read
//! commands (`list*`, `get*`, `query*`) are retried. Nothing here logs or returns a request
//! URL: it embeds the signature, which is a replayable credential until `expires`.

mod config;
mod diagnostics;
mod listing;

pub use config::{
    ClientConfig, Credentials, RetryPolicy, SECRET_KEY_API_KEY, SECRET_KEY_API_URL,
    SECRET_KEY_SECRET_KEY, SECRET_KEY_VERIFY_SSL,
};
pub use listing::{Listing, VmListQuery, VmListing, USAGE_IDS_PER_REQUEST};
// What the probe's calls take and give, next to the calls (`client/diagnostics.rs`).
pub use crate::diagnostics::DiagnosticsKind;
pub use crate::parse::AsyncJobState;

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
use super::model::{ApiInfo, Capabilities, CsTime, ListItem};
use super::parse::{
    parse_capabilities, parse_list_page, parse_value, ItemFailure, ListPage, Reply,
};
use super::ratelimit::TokenBucket;
use super::signing;

/// `default.page.size` of a stock CloudStack: the default and the maximum page size.
pub const DEFAULT_PAGE_SIZE: u32 = 500;
/// How many ids go into one `ids=` parameter (keeps request URLs far below proxy limits).
pub const IDS_PER_REQUEST: usize = 100;
/// Upper bound on pages of one listing (500 × 10 000 rows is far beyond any real scope).
pub const MAX_PAGES: u32 = 10_000;
/// Rows a listing makes room for up front from its first page's `count` (see `list_pages`).
const RESERVE_ROWS_MAX: u64 = 32_768;
/// Upper bound on a response body.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// How often one listing may shrink the page size after "Page size can't exceed …".
const MAX_PAGE_SIZE_SHRINKS: u32 = 4;

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
    /// Shared by every client of the same endpoint and key (see [`Self::sharing_rate_limit`]).
    limiter: Option<std::sync::Arc<TokenBucket>>,
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
        let http = config.http_client()?;
        let limiter = config
            .rate_limit
            .map(TokenBucket::new)
            .transpose()?
            .map(std::sync::Arc::new);
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

    /// This client, drawing on `other`'s rate limit instead of its own: clients of one endpoint
    /// and key (one CloudStack account, whose API limit is per account) listing different
    /// zones or projects share one budget.
    pub fn sharing_rate_limit(mut self, other: &CloudStackClient) -> Self {
        self.limiter = other.limiter.clone();
        self
    }

    /// Whether this client and `other` draw on the same rate-limit budget.
    pub fn shares_rate_limit_with(&self, other: &CloudStackClient) -> bool {
        match (&self.limiter, &other.limiter) {
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        }
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
                // Room for every row once, from the first count: grown page by page, a Vec of
                // 10 000 VMs doubled to 16 384 and held old and new buffers at once while it
                // moved (the poll's peak). Bounded, as the count is only the server's word; a
                // larger listing grows from there.
                if pages == 1 && count_is_total {
                    let rows = usize::try_from(page.count.min(RESERVE_ROWS_MAX)).unwrap_or(0);
                    items.reserve_exact(rows.saturating_sub(items.len()));
                }
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
        // The items live through the poll; a Vec grown page by page is up to twice their size.
        items.shrink_to_fit();
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

    fn limited_client() -> CloudStackClient {
        let data: std::collections::BTreeMap<String, String> = [
            ("api-url", "http://127.0.0.1:1/client/api"),
            ("api-key", "k"),
            ("secret-key", "s"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut cfg = ClientConfig::from_secret_data(&data).unwrap();
        cfg.rate_limit = Some(crate::RateLimit::new(1.0, 1).unwrap());
        CloudStackClient::new(cfg).unwrap()
    }

    #[test]
    fn clients_of_one_account_can_draw_on_one_rate_limit() {
        let a = limited_client();
        let b = limited_client();
        assert!(!a.shares_rate_limit_with(&b));
        let b = b.sharing_rate_limit(&a);
        assert!(a.shares_rate_limit_with(&b));
        // One budget: the token b takes is gone for a.
        let now = Instant::now();
        assert_eq!(b.limiter.as_ref().unwrap().reserve_at(now), Duration::ZERO);
        assert!(a.limiter.as_ref().unwrap().reserve_at(now) > Duration::ZERO);
    }

    #[test]
    fn read_commands() {
        assert!(is_read_command("listVirtualMachines"));
        assert!(is_read_command("queryAsyncJobResult"));
        assert!(!is_read_command("destroyVirtualMachine"));
    }
}
