//! The error taxonomy of the CloudStack client.
//!
//! Every variant carries what an operator needs to act on it and nothing secret: no secret
//! key, no signature, no request URL (a CloudStack request URL embeds a replayable signature).
//! Server-provided text (`errortext`, proxy pages) is shortened and sanitized before it is
//! stored, so it is safe to print, log, put in a Kubernetes Event or a `/status` page.

use std::fmt;
use std::time::Duration;

/// `cserrorcode` and `errortext` from a CloudStack error envelope, when the server sent them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorDetail {
    pub cserrorcode: Option<u32>,
    pub errortext: Option<String>,
}

impl ErrorDetail {
    pub fn new(cserrorcode: Option<u32>, errortext: Option<&str>) -> Self {
        Self {
            cserrorcode,
            errortext: errortext
                .map(|t| sanitize_text(t, MAX_ERRORTEXT_CHARS))
                .filter(|t| !t.is_empty()),
        }
    }
}

/// Renders `, cserrorcode 4350: <errortext>` (each part only when present).
impl fmt::Display for ErrorDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(cs) = self.cserrorcode {
            write!(f, ", cserrorcode {cs}")?;
        }
        if let Some(text) = &self.errortext {
            write!(f, ": \"{text}\"")?;
        }
        Ok(())
    }
}

/// Maximum length of server error text kept in an error.
pub const MAX_ERRORTEXT_CHARS: usize = 400;
/// Maximum length of a non-JSON body snippet kept in an error.
pub const MAX_SNIPPET_CHARS: usize = 120;

/// What went wrong talking to CloudStack.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CloudStackError {
    /// HTTP/`errorcode` 401: unknown or disabled API key, wrong signature, expired `expires`,
    /// an API denied by a role rule, or an unknown command.
    #[error(
        "CloudStack rejected the credentials or the request signature (401{detail}); check \
         api-key/secret-key, that the user and account are enabled, that the role allows this \
         API, and the clock of this host (signatureversion=3 requests expire)"
    )]
    Unauthorized {
        detail: ErrorDetail,
        /// The server answered with the `errorresponse` wrapper or said the command does not
        /// exist: the API is unknown to this CloudStack version (or hidden from the role).
        command_unknown: bool,
    },

    /// A 401 whose `Date` header shows that, on the management server's clock, the request's
    /// `expires` had already passed when it arrived: the clocks disagree by more than the
    /// signature lifetime (CloudStack's 401 text is the same as for a wrong key).
    #[error(
        "CloudStack rejected the request signature as expired (401{detail}): clock skew — the \
         management server's clock (its HTTP Date header) is {} ahead of this host's, more than \
         the {} signature lifetime (signatureversion=3 expires); fix the time (NTP) on the \
         management server or on this host",
        fmt_duration(*server_ahead),
        fmt_duration(*lifetime)
    )]
    SignatureExpired {
        server_ahead: Duration,
        lifetime: Duration,
        detail: ErrorDetail,
    },

    /// HTTP/`errorcode` 429: the account's API limit (`api.throttling.max` per
    /// `api.throttling.interval`) is exhausted.
    #[error(
        "CloudStack throttled the request (429{detail}){}; lower the poll rate or the rate \
         limit, or raise api.throttling.max for this account",
        fmt_retry_after(retry_after)
    )]
    Throttled {
        retry_after: Option<Duration>,
        detail: ErrorDetail,
    },

    /// HTTP/`errorcode` 431: a parameter was rejected.
    #[error(
        "CloudStack rejected a request parameter (431{detail}){}{}",
        fmt_page_size_hint(page_size_max),
        fmt_unknown_id_hint(unknown_id)
    )]
    InvalidParameter {
        /// From "Page size can't exceed max allowed page size value: N" (`default.page.size`).
        page_size_max: Option<u32>,
        /// The UUID named in "Invalid parameter id(s) value=<uuid> …": an id CloudStack does
        /// not know at all (expunged VMs still resolve and simply list nothing).
        unknown_id: Option<String>,
        detail: ErrorDetail,
    },

    /// HTTP/`errorcode` 432: the API is not available to the key's role.
    #[error(
        "the CloudStack role of this API key does not allow this API (432{detail}); add an \
         allow rule for it to the role (listVirtualMachines, listVirtualMachinesMetrics, \
         listVirtualMachinesUsageHistory, listNics, listCapabilities, listApis, listAsyncJobs)"
    )]
    NotAllowed { detail: ErrorDetail },

    /// 530–537 and any other 5xx.
    #[error(
        "CloudStack server error {code}{} ({detail_plain}); usually transient, the request \
         is retried later",
        server_code_name(*code),
        detail_plain = DetailPlain(detail)
    )]
    Server { code: u16, detail: ErrorDetail },

    /// Any other `errorcode`.
    #[error("CloudStack API error {code}{detail}")]
    Api { code: u16, detail: ErrorDetail },

    /// The HTTP exchange failed (DNS, connect, TLS, connection reset). Never contains the URL.
    #[error(
        "could not reach the CloudStack API: {detail}; check api-url, DNS, network policies, \
         proxies and the TLS settings (verify-ssl, CA bundle)"
    )]
    Transport { detail: String },

    /// No complete answer within the request timeout.
    #[error(
        "the CloudStack API did not answer within {}; the management server or the network \
         to it is slow or overloaded",
        fmt_duration(*after)
    )]
    Timeout { after: Duration },

    /// The endpoint answered with something that is not JSON (a proxy, load balancer or
    /// login page, or an empty body).
    #[error(
        "the CloudStack endpoint answered HTTP {status} with {} instead of JSON{}; check that \
         api-url points at the management server's /client/api and what proxies sit in front of it",
        content_type.as_deref().unwrap_or("no content type"),
        fmt_snippet(snippet)
    )]
    NotJson {
        status: u16,
        content_type: Option<String>,
        snippet: String,
    },

    /// Declared JSON but unreadable (truncated, corrupt), or JSON of a shape CloudStack does not
    /// send for this command.
    #[error("the CloudStack response could not be read: {detail}")]
    Malformed { detail: String },

    /// The client configuration cannot work (bad URL, bad CA bundle, missing Secret key …).
    #[error("invalid CloudStack client configuration: {detail}")]
    Config { detail: String },

    /// The API does not exist on this CloudStack version or is hidden from the role
    /// (e.g. `listVirtualMachinesUsageHistory` before 4.17).
    #[error(
        "CloudStack does not offer {command} to this API key (older CloudStack version, or \
         the role does not allow it){detail}"
    )]
    Unsupported {
        command: String,
        detail: ErrorDetail,
    },
}

struct DetailPlain<'a>(&'a ErrorDetail);

impl fmt::Display for DetailPlain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.0.cserrorcode, &self.0.errortext) {
            (None, None) => f.write_str("no error text"),
            (Some(cs), None) => write!(f, "cserrorcode {cs}"),
            (None, Some(t)) => write!(f, "\"{t}\""),
            (Some(cs), Some(t)) => write!(f, "cserrorcode {cs}: \"{t}\""),
        }
    }
}

fn fmt_duration(d: Duration) -> String {
    if d.as_millis() < 10_000 && d.subsec_millis() != 0 {
        format!("{} ms", d.as_millis())
    } else {
        format!("{} s", d.as_secs())
    }
}

fn fmt_retry_after(r: &Option<Duration>) -> String {
    match r {
        Some(d) => format!(", server asks to retry after {} ms", d.as_millis()),
        None => String::new(),
    }
}

fn fmt_page_size_hint(p: &Option<u32>) -> String {
    match p {
        Some(n) => format!("; the server's maximum page size (default.page.size) is {n}"),
        None => String::new(),
    }
}

fn fmt_unknown_id_hint(id: &Option<String>) -> String {
    match id {
        Some(id) => format!(
            "; CloudStack does not know the id {id} (it never existed or was purged): \
             match VMs client-side instead of passing unknown ids"
        ),
        None => String::new(),
    }
}

fn fmt_snippet(s: &str) -> String {
    if s.is_empty() {
        " (empty body)".to_string()
    } else {
        format!(" (\"{s}\")")
    }
}

fn server_code_name(code: u16) -> &'static str {
    match code {
        530 => " INTERNAL_ERROR",
        531 => " ACCOUNT_ERROR",
        532 => " ACCOUNT_RESOURCE_LIMIT_ERROR",
        533 => " INSUFFICIENT_CAPACITY_ERROR",
        534 => " RESOURCE_UNAVAILABLE_ERROR",
        535 => " RESOURCE_ALLOCATION_ERROR",
        536 => " RESOURCE_IN_USE_ERROR",
        537 => " NETWORK_RULE_CONFLICT_ERROR",
        _ => "",
    }
}

impl CloudStackError {
    /// Builds the typed error for an `errorcode` (or, without an envelope, the HTTP status).
    /// `command_unknown` says the server used the `errorresponse` wrapper.
    pub fn from_code(
        code: u16,
        cserrorcode: Option<u32>,
        errortext: Option<&str>,
        command_unknown: bool,
    ) -> Self {
        let detail = ErrorDetail::new(cserrorcode, errortext);
        let text = errortext.unwrap_or("");
        match code {
            401 => Self::Unauthorized {
                command_unknown: command_unknown || mentions_unknown_command(text),
                detail,
            },
            429 => Self::Throttled {
                retry_after: parse_retry_after(text),
                detail,
            },
            431 => Self::InvalidParameter {
                page_size_max: parse_page_size_max(text),
                unknown_id: parse_unknown_id(text),
                detail,
            },
            432 => Self::NotAllowed { detail },
            500..=599 => Self::Server { code, detail },
            _ => Self::Api { code, detail },
        }
    }

    /// The text for a condition message: the same for the same trouble on every poll (Display,
    /// for logs and `/status`, keeps the retry-after, skew, ids and sizes that [`mask_volatile`]
    /// masks here; a timeout's and a bad configuration's text is stable as it is).
    pub fn stable_summary(&self) -> String {
        match self {
            Self::Timeout { .. } | Self::Config { .. } => self.to_string(),
            _ => mask_volatile(&self.to_string()),
        }
    }

    /// Whether repeating the same read later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Throttled { .. } | Self::Server { .. } | Self::Transport { .. } => true,
            Self::Timeout { .. } => true,
            Self::NotJson { status, .. } => matches!(status, 429 | 502 | 503 | 504),
            Self::Unauthorized { .. }
            | Self::SignatureExpired { .. }
            | Self::InvalidParameter { .. }
            | Self::NotAllowed { .. }
            | Self::Api { .. }
            | Self::Malformed { .. }
            | Self::Config { .. }
            | Self::Unsupported { .. } => false,
        }
    }

    /// A short, stable label for metrics and status pages.
    pub fn kind(&self) -> &'static str {
        match self {
            // A 401 like the others (`check` exits 4 on it); the message tells them apart.
            Self::Unauthorized { .. } | Self::SignatureExpired { .. } => "unauthorized",
            Self::Throttled { .. } => "throttled",
            Self::InvalidParameter { .. } => "invalid_parameter",
            Self::NotAllowed { .. } => "not_allowed",
            Self::Server { .. } => "server_error",
            Self::Api { .. } => "api_error",
            Self::Transport { .. } => "transport",
            Self::Timeout { .. } => "timeout",
            Self::NotJson { .. } => "not_json",
            Self::Malformed { .. } => "malformed",
            Self::Config { .. } => "config",
            Self::Unsupported { .. } => "unsupported",
        }
    }

    /// The wait the server asked for (429 only).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Throttled { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The envelope details, for the variants built from an error envelope.
    pub fn detail(&self) -> Option<&ErrorDetail> {
        match self {
            Self::Unauthorized { detail, .. }
            | Self::SignatureExpired { detail, .. }
            | Self::Throttled { detail, .. }
            | Self::InvalidParameter { detail, .. }
            | Self::NotAllowed { detail }
            | Self::Server { detail, .. }
            | Self::Api { detail, .. }
            | Self::Unsupported { detail, .. } => Some(detail),
            _ => None,
        }
    }

    /// The CloudStack `errorcode` (or HTTP status) behind this error, where there is one.
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Unauthorized { .. } | Self::SignatureExpired { .. } => Some(401),
            Self::Throttled { .. } => Some(429),
            Self::InvalidParameter { .. } => Some(431),
            Self::NotAllowed { .. } => Some(432),
            Self::Server { code, .. } | Self::Api { code, .. } => Some(*code),
            Self::NotJson { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// A 431 about the page size (the client shrinks the page and retries).
    pub fn is_page_size_error(&self) -> bool {
        match self {
            Self::InvalidParameter {
                page_size_max,
                detail,
                ..
            } => {
                page_size_max.is_some()
                    || detail
                        .errortext
                        .as_deref()
                        .is_some_and(|t| t.to_ascii_lowercase().contains("page size"))
            }
            _ => false,
        }
    }

    /// The command is unknown to the server or not available to the role (401 with the
    /// `errorresponse` wrapper / "does not exist" text, or 432).
    pub fn is_command_unavailable(&self) -> bool {
        match self {
            Self::Unauthorized {
                command_unknown, ..
            } => *command_unknown,
            Self::NotAllowed { .. } | Self::Unsupported { .. } => true,
            _ => false,
        }
    }

    /// Replaces every occurrence of the given strings (a request's signature in raw and
    /// encoded form, the secret key) in the free-text parts of the error.
    pub fn redact(mut self, needles: &[&str]) -> Self {
        fn scrub(s: &mut String, needles: &[&str]) {
            for n in needles {
                if n.len() >= 4 && s.contains(n) {
                    *s = s.replace(n, "<redacted>");
                }
            }
        }
        match &mut self {
            Self::Transport { detail } | Self::Malformed { detail } | Self::Config { detail } => {
                scrub(detail, needles)
            }
            Self::NotJson {
                snippet,
                content_type,
                ..
            } => {
                scrub(snippet, needles);
                if let Some(ct) = content_type {
                    scrub(ct, needles);
                }
            }
            Self::Timeout { .. } => {}
            Self::Unauthorized { detail, .. }
            | Self::SignatureExpired { detail, .. }
            | Self::Throttled { detail, .. }
            | Self::InvalidParameter { detail, .. }
            | Self::NotAllowed { detail }
            | Self::Server { detail, .. }
            | Self::Api { detail, .. }
            | Self::Unsupported { detail, .. } => {
                if let Some(t) = &mut detail.errortext {
                    scrub(t, needles);
                }
            }
        }
        self
    }

    /// A 401 turned into [`CloudStackError::SignatureExpired`] when the server's clock (its
    /// `Date` header, `server_now`) had passed the request's `expires`; anything else as is.
    #[cfg(feature = "client")]
    pub(crate) fn with_server_clock(
        self,
        server_now: Option<jiff::Timestamp>,
        sent_at: jiff::Timestamp,
        lifetime: Duration,
    ) -> Self {
        let (Self::Unauthorized { detail, .. }, Some(server_now)) = (&self, server_now) else {
            return self;
        };
        // The Date header has whole seconds: only a clear miss counts.
        let Ok(ahead) = Duration::try_from(server_now.duration_since(sent_at)) else {
            return self;
        };
        if ahead <= lifetime + Duration::from_secs(1) {
            return self;
        }
        Self::SignatureExpired {
            server_ahead: Duration::from_secs(ahead.as_secs()),
            lifetime,
            detail: detail.clone(),
        }
    }

    #[cfg(feature = "client")]
    pub(crate) fn config(detail: impl Into<String>) -> Self {
        Self::Config {
            detail: detail.into(),
        }
    }

    pub(crate) fn malformed(detail: impl Into<String>) -> Self {
        Self::Malformed {
            detail: sanitize_text(&detail.into(), MAX_ERRORTEXT_CHARS),
        }
    }
}

fn mentions_unknown_command(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    t.contains("does not exist") || t.contains("unknown command")
}

/// `…` for a number before a unit (`[218] ms`, `3600 s`, `512 bytes`) and for a word with 3+
/// digits among other characters (request ids, times, UUIDs); codes (`4400`, `HTTP/1.1`) stay.
pub fn mask_volatile(text: &str) -> String {
    const UNITS: [&str; 7] = ["ms", "s", "sec", "secs", "seconds", "bytes", "kib"];
    let core: fn(&str) -> &str = |w| w.trim_matches(|c: char| !c.is_alphanumeric());
    let words: Vec<&str> = text.split(' ').collect();
    let mut out = Vec::with_capacity(words.len());
    for (i, w) in words.iter().enumerate() {
        let c = core(w);
        let unit = words
            .get(i + 1)
            .map_or(String::new(), |n| core(n).to_ascii_lowercase());
        let digits = c.bytes().filter(u8::is_ascii_digit).count();
        let volatile = if digits > 0 && digits == c.len() {
            UNITS.contains(&unit.as_str())
        } else {
            digits >= 3
        };
        out.push(w.replacen(c, "…", usize::from(volatile)));
    }
    out.join(" ")
}

/// Parses the `<ms>` of "… please retry after [<ms>] ms." (brackets optional).
pub fn parse_retry_after(text: &str) -> Option<Duration> {
    let lower = text.to_ascii_lowercase();
    let start = lower.find("retry after")? + "retry after".len();
    let rest = lower[start..]
        .trim_start()
        .trim_start_matches('[')
        .trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let after = rest[digits.len()..]
        .trim_start()
        .trim_start_matches(']')
        .trim_start();
    if after.starts_with("ms") || after.starts_with("milli") {
        Some(Duration::from_millis(n))
    } else if after.starts_with('s') {
        Some(Duration::from_secs(n))
    } else {
        // CloudStack always says ms; assume ms when the unit is missing.
        Some(Duration::from_millis(n))
    }
}

/// Parses `N` of "Page size can't exceed max allowed page size value: N".
pub fn parse_page_size_max(text: &str) -> Option<u32> {
    let lower = text.to_ascii_lowercase();
    if !lower.contains("page size") {
        return None;
    }
    let idx = lower.find("page size value")?;
    let rest = &lower[idx + "page size value".len()..];
    let rest = rest.trim_start_matches(|c: char| c == ':' || c.is_whitespace());
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok().filter(|n| *n > 0)
}

/// Parses the UUID of "… Invalid parameter id value=<uuid> due to … entity does not exist …".
pub fn parse_unknown_id(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let p = lower.find("invalid parameter ")?;
    let rest = &text[p + "invalid parameter ".len()..];
    let v = rest.find("value=")?;
    // only the parameter name may sit between "Invalid parameter " and "value="
    if rest[..v].trim().contains(char::is_whitespace) {
        return None;
    }
    let value: String = rest[v + "value=".len()..]
        .chars()
        .take_while(|c| c.is_ascii_hexdigit() || *c == '-')
        .collect();
    (!value.is_empty()).then_some(value)
}

/// Makes server-provided text safe and short: control characters become spaces, whitespace
/// runs collapse, anything that looks like a signature or secret key value is redacted, and
/// the result is cut to `max` characters.
pub fn sanitize_text(text: &str, max: usize) -> String {
    let mut collapsed = String::with_capacity(text.len().min(max * 2));
    let mut last_space = true;
    for c in text.chars() {
        let c = if c.is_control() || c.is_whitespace() {
            ' '
        } else {
            c
        };
        if c == ' ' {
            if !last_space {
                collapsed.push(' ');
            }
            last_space = true;
        } else {
            collapsed.push(c);
            last_space = false;
        }
    }
    let redacted = redact_params(collapsed.trim_end());
    truncate_chars(&redacted, max)
}

fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Replaces the values of `signature=` / `secretkey=` (any case) with `<redacted>`.
fn redact_params(s: &str) -> String {
    const NAMES: [&str; 2] = ["signature=", "secretkey="];
    let lower = s.to_ascii_lowercase();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let hit = NAMES
            .iter()
            .find(|n| lower[i..].starts_with(*n) && s.is_char_boundary(i + n.len()));
        if let Some(name) = hit {
            out.push_str(&s[i..i + name.len()]);
            out.push_str("<redacted>");
            i += name.len();
            // an already redacted value is left as it is: sanitizing twice (the envelope
            // reader, then the error) must not stack markers or eat what follows
            if s[i..].starts_with("<redacted>") {
                i += "<redacted>".len();
                continue;
            }
            while i < s.len() {
                let b = s.as_bytes()[i];
                if matches!(b, b'&' | b' ' | b'"' | b'\'' | b'<' | b'>' | b',' | b')') {
                    break;
                }
                i += 1;
            }
            // `i` only advanced over ASCII bytes or stopped at one, so it is a boundary
            // unless a multi-byte char followed; step to the next boundary.
            while i < s.len() && !s.is_char_boundary(i) {
                i += 1;
            }
        } else {
            let ch = s[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8().max(1);
        }
    }
    out
}

/// Text of an HTML (or other non-JSON) body, tags dropped, for [`CloudStackError::NotJson`].
pub fn body_snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(8192)]);
    let mut plain = String::with_capacity(text.len().min(1024));
    let mut in_tag = false;
    for c in text.chars() {
        match c {
            '<' => {
                in_tag = true;
                plain.push(' ');
            }
            '>' if in_tag => in_tag = false,
            _ if in_tag => {}
            _ => plain.push(c),
        }
    }
    sanitize_text(&plain, MAX_SNIPPET_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_parsed_from_the_throttling_text() {
        let t =
            "The given user has reached his/her account api limit, please retry after [218] ms.";
        assert_eq!(parse_retry_after(t), Some(Duration::from_millis(218)));
        assert_eq!(
            parse_retry_after("please retry after 5 ms"),
            Some(Duration::from_millis(5))
        );
        assert_eq!(parse_retry_after("slow down"), None);
        assert_eq!(parse_retry_after("retry after [] ms"), None);
    }

    #[test]
    fn page_size_and_unknown_id_are_parsed() {
        assert_eq!(
            parse_page_size_max("Page size can't exceed max allowed page size value: 200"),
            Some(200)
        );
        assert_eq!(parse_page_size_max("Page size can't exceed"), None);
        let t = "Unable to execute API command listvirtualmachines due to invalid value. Invalid parameter ids value=0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11 due to incorrect long value format, or entity does not exist or due to incorrect parameter annotation for the field in api cmd class.";
        assert_eq!(
            parse_unknown_id(t).as_deref(),
            Some("0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11")
        );
        assert_eq!(parse_unknown_id("Invalid parameter value"), None);
    }

    #[test]
    fn sanitize_redacts_signatures_and_shortens() {
        let s = sanitize_text(
            "GET /client/api?command=x&signature=AbC%2B%3D&apiKey=k\n\tfailed",
            400,
        );
        assert_eq!(
            s,
            "GET /client/api?command=x&signature=<redacted>&apiKey=k failed"
        );
        let long = "é".repeat(500);
        assert_eq!(sanitize_text(&long, 10).chars().count(), 10);
        assert_eq!(sanitize_text("SIGNATURE=zz", 50), "SIGNATURE=<redacted>");
    }

    #[test]
    fn snippet_drops_tags() {
        let s = body_snippet(b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1><hr>nginx</body></html>");
        assert_eq!(s, "502 Bad Gateway 502 Bad Gateway nginx");
    }

    #[test]
    fn codes_map_to_variants_and_labels() {
        let e = CloudStackError::from_code(
            401,
            None,
            Some("unable to verify user credentials and/or request signature"),
            false,
        );
        assert_eq!(e.kind(), "unauthorized");
        assert!(!e.is_retryable());
        assert!(!e.is_command_unavailable());
        assert!(e.to_string().contains("clock"));
        let e =
            CloudStackError::from_code(429, Some(9999), Some("please retry after [50] ms."), false);
        assert_eq!(e.retry_after(), Some(Duration::from_millis(50)));
        assert!(e.is_retryable());
        assert!(e.to_string().contains("cserrorcode 9999"));
        let e = CloudStackError::from_code(534, Some(4380), Some("host down"), false);
        assert_eq!(e.kind(), "server_error");
        assert!(e.is_retryable());
        assert!(e.to_string().contains("RESOURCE_UNAVAILABLE_ERROR"));
        let e = CloudStackError::from_code(432, Some(4555), None, true);
        assert_eq!(e.kind(), "not_allowed");
        assert!(e.is_command_unavailable());
        assert!(!e.is_retryable());
        let e = CloudStackError::from_code(430, None, None, false);
        assert_eq!(e.kind(), "api_error");
        assert!(!e.is_retryable());
    }

    #[test]
    #[cfg(feature = "client")]
    fn a_401_from_a_server_clock_past_expires_is_named_clock_skew() {
        let sent: jiff::Timestamp = "2030-01-01T00:00:00Z".parse().unwrap();
        let lifetime = Duration::from_secs(300);
        let e = || CloudStackError::from_code(401, None, Some("unable to verify"), false);
        // The Date header as a server sends it.
        let date = jiff::fmt::rfc2822::parse("Tue, 01 Jan 2030 01:00:00 GMT")
            .unwrap()
            .timestamp();
        let skewed = e().with_server_clock(Some(date), sent, lifetime);
        assert!(
            matches!(skewed, CloudStackError::SignatureExpired { server_ahead, .. } if server_ahead == Duration::from_secs(3600)),
            "{skewed:?}"
        );
        let text = skewed.to_string();
        assert!(
            text.contains("clock skew") && text.contains("expired"),
            "{text}"
        );
        assert_eq!(skewed.kind(), "unauthorized");
        assert_eq!(skewed.code(), Some(401));
        assert!(!skewed.is_retryable());
        // Within the lifetime, without a Date header, or not a 401: unchanged.
        let near = sent
            .checked_add(jiff::SignedDuration::from_secs(290))
            .unwrap();
        assert_eq!(e().with_server_clock(Some(near), sent, lifetime), e());
        assert_eq!(e().with_server_clock(None, sent, lifetime), e());
        let other = CloudStackError::from_code(530, None, None, false);
        assert_eq!(
            other.clone().with_server_clock(Some(date), sent, lifetime),
            other
        );
    }

    #[test]
    fn the_stable_summary_of_a_429_does_not_change_with_retry_after() {
        let e = |ms: u32| {
            CloudStackError::from_code(
                429,
                Some(4400),
                Some(&format!(
                    "The given user has reached his/her account api limit, please retry after [{ms}] ms."
                )),
                false,
            )
        };
        let (a, b) = (e(218), e(37));
        assert_eq!(a.stable_summary(), b.stable_summary());
        let stable = a.stable_summary();
        assert!(
            stable.contains("throttled") && stable.contains("429"),
            "{stable}"
        );
        assert!(stable.contains("cserrorcode 4400"), "{stable}");
        assert!(!stable.contains("218"), "{stable}");
        // The full text (logs, /status) keeps the numbers.
        assert!(a.to_string().contains("retry after 218 ms"), "{a}");
        assert!(b.to_string().contains("37"), "{b}");
        assert_ne!(a.to_string(), b.to_string());
    }

    #[test]
    fn the_stable_summary_of_clock_skew_does_not_change_with_the_skew() {
        let e = |ahead: u64| CloudStackError::SignatureExpired {
            server_ahead: Duration::from_secs(ahead),
            lifetime: Duration::from_secs(300),
            detail: ErrorDetail::new(None, Some("unable to verify user credentials")),
        };
        let (a, b) = (e(3600), e(3607));
        assert_eq!(a.stable_summary(), b.stable_summary());
        let stable = a.stable_summary();
        assert!(
            stable.contains("clock skew") && stable.contains("401") && stable.contains("lifetime"),
            "{stable}"
        );
        assert!(!stable.contains("3600"), "{stable}");
        assert!(a.to_string().contains("3600 s") && b.to_string().contains("3607 s"));
    }

    #[test]
    fn the_stable_summary_drops_per_response_numbers_and_ids() {
        let page = |id: &str, bytes: usize| {
            (
                CloudStackError::NotJson {
                    status: 502,
                    content_type: Some("text/html".into()),
                    snippet: format!("502 Bad Gateway Request ID: {id}"),
                },
                CloudStackError::malformed(format!(
                    "HTTP 200 body is declared JSON but does not parse, truncated or corrupt ({bytes} bytes)"
                )),
            )
        };
        let (a1, a2) = page("7f3a9c2e1b4d", 512);
        let (b1, b2) = page("0c1d2e3f4a5b", 8191);
        assert_eq!(a1.stable_summary(), b1.stable_summary());
        assert_eq!(a2.stable_summary(), b2.stable_summary());
        assert!(
            a1.stable_summary().contains("HTTP 502"),
            "{}",
            a1.stable_summary()
        );
        assert!(a1.to_string().contains("7f3a9c2e1b4d"));
        // What does not change per request is kept as it is.
        let e = CloudStackError::from_code(534, Some(4380), Some("host down"), false);
        assert_eq!(e.stable_summary(), e.to_string());
        let t = CloudStackError::Timeout {
            after: Duration::from_secs(15),
        };
        assert_eq!(t.stable_summary(), t.to_string());
    }

    #[test]
    fn masking_keeps_the_words_and_short_codes() {
        assert_eq!(
            mask_volatile("please retry after [218] ms. Wait 5 s, got 512 bytes"),
            "please retry after […] ms. Wait … s, got … bytes"
        );
        assert_eq!(
            mask_volatile(
                "502 Bad Gateway (os error 111) at 2030-01-01T00:00:00Z id=0d1e6f3a-8a43"
            ),
            "502 Bad Gateway (os error 111) at … …"
        );
        for odd in ["", "...", ": .", "…", "é.ü:", "a...b", "1", "[1]"] {
            let _ = mask_volatile(odd);
        }
        assert_eq!(mask_volatile("..."), "...");
    }
}
