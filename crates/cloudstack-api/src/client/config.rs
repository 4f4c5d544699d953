//! The client's configuration: endpoint and credentials (also from a CAPC Secret), TLS
//! verification and extra CA certificates, timeouts, page size, the retry back-off policy and
//! the rate limit.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use rand::Rng as _;
use tracing::warn;

use super::{error_chain, DEFAULT_PAGE_SIZE};
use crate::error::CloudStackError;
use crate::ratelimit::RateLimit;

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

    pub(super) fn delay(&self, retry: u32) -> Duration {
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

    /// The HTTP client for this endpoint: timeouts, no redirects, and the TLS settings
    /// (extra CA certificates, `verify-ssl=false`).
    pub(super) fn http_client(&self) -> Result<reqwest::Client, CloudStackError> {
        // reqwest is built without a crypto provider (style.md §1); installing ring is
        // idempotent: a provider installed earlier stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .timeout(self.request_timeout)
            .connect_timeout(self.request_timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("capc-health-shim/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = &self.extra_ca_pem {
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
        if !self.verify_tls {
            warn!(
                api_url = %self.api_url,
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
        Ok(http)
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
}
