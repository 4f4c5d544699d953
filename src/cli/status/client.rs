//! The request side of `status` and `orphans`: the URL, the bearer token (`--token-file`,
//! `--token`, or in a pod its ServiceAccount's, over https only), the certificate check
//! (`--ca-file`, `--insecure-skip-tls-verify`), the GET, and errors that say what to do.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::{exit, printable};
use crate::status::StatusReport;

/// The largest answer `status` reads.
const MAX_BODY: usize = 256 * 1024 * 1024;

/// The token a pod's ServiceAccount mounts; sent by default, over HTTPS only.
pub const IN_CLUSTER_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// A bearer token; never printed (its `Debug` is redacted).
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl BearerToken {
    /// A token as given on the command line or read from a file: trimmed, not empty, printable
    /// ASCII without spaces (what an `Authorization` header can carry).
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.is_empty() {
            return Err("the bearer token is empty".to_string());
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "the bearer token holds spaces or characters an HTTP header cannot carry"
                    .to_string(),
            );
        }
        Ok(Self(t.to_string()))
    }

    fn header(&self) -> Result<reqwest::header::HeaderValue, String> {
        let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", self.0))
            .map_err(|_| "the bearer token cannot be sent in a header".to_string())?;
        v.set_sensitive(true);
        Ok(v)
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// How `status` and `orphans` authenticate to the shim and check its certificate.
#[derive(Debug, Clone, Args)]
pub struct ClientAuthArgs {
    /// File holding the bearer token to send, e.g. `kubectl create token NAME > FILE`
    /// [default: the pod's ServiceAccount token when it exists, sent over https only].
    #[arg(long, env = "CAPC_HEALTH_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// The bearer token itself (prefer --token-file or the environment variable: a command
    /// line is visible to other users of the machine).
    #[arg(
        long,
        env = "CAPC_HEALTH_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true,
        value_parser = BearerToken::parse
    )]
    pub token: Option<BearerToken>,
    /// PEM CA bundle to verify the shim's certificate with, instead of the system's roots (for a
    /// certificate given to the shim with --tls-cert-file). Without --url the certificate must
    /// name the pod; without --ca-file the certificate at the port-forward's far end (the pod
    /// the API server forwarded to) is not verified.
    #[arg(long, env = "CAPC_HEALTH_CA_FILE", value_name = "PATH")]
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate, e.g. the shim's self-signed one: still encrypted, but anyone
    /// who can intercept the connection could pose as the shim and receive the token.
    #[arg(long, env = "CAPC_HEALTH_INSECURE_SKIP_TLS_VERIFY")]
    pub insecure_skip_tls_verify: bool,
}

/// Where the token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    Flag,
    File(PathBuf),
    InCluster,
    None,
}

/// The token source for these flags and URL scheme: `--token`, else `--token-file`, else the
/// in-cluster token when it exists and the URL is https (never sent in the clear unasked).
pub fn token_source(
    args: &ClientAuthArgs,
    scheme: &str,
    in_cluster_exists: bool,
) -> Result<TokenSource, String> {
    match (&args.token, &args.token_file) {
        (Some(_), Some(_)) => Err("give --token or --token-file, not both".to_string()),
        (Some(_), None) => Ok(TokenSource::Flag),
        (None, Some(p)) => Ok(TokenSource::File(p.clone())),
        (None, None) if in_cluster_exists && scheme == "https" => Ok(TokenSource::InCluster),
        (None, None) => Ok(TokenSource::None),
    }
}

fn read_token(path: &Path, what: &str) -> Result<BearerToken, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    BearerToken::parse(&text).map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// What one request sends and trusts.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    pub timeout: Duration,
    pub token: Option<BearerToken>,
    /// PEM CA bundle that replaces the system roots.
    pub ca_pem: Option<Vec<u8>>,
    pub insecure_skip_tls_verify: bool,
    /// A host name of the URL and the address to connect to for it (the port-forward's
    /// loopback bridge), so that the certificate is checked for that name.
    pub resolve: Option<(String, std::net::SocketAddr)>,
}

/// `--ca-file`: read, and holding at least one PEM certificate.
pub fn read_ca(p: &Path) -> Result<Vec<u8>, String> {
    let pem =
        std::fs::read(p).map_err(|e| format!("cannot read --ca-file {}: {e}", p.display()))?;
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(certs) if !certs.is_empty() => Ok(pem),
        _ => Err(format!(
            "--ca-file {} holds no PEM certificate",
            p.display()
        )),
    }
}

impl ClientAuthArgs {
    /// The request options for `url`: the token read, the CA bundle read and checked. Errors
    /// are usage errors (exit 2); the second value holds warnings for stderr.
    pub fn options(
        &self,
        url: &url::Url,
        timeout: Duration,
    ) -> Result<(FetchOptions, Vec<String>), String> {
        let mut warnings = Vec::new();
        if self.insecure_skip_tls_verify && self.ca_file.is_some() {
            return Err("give --ca-file or --insecure-skip-tls-verify, not both".to_string());
        }
        let source = token_source(self, url.scheme(), Path::new(IN_CLUSTER_TOKEN).is_file())?;
        let token = match &source {
            TokenSource::Flag => self.token.clone(),
            TokenSource::File(p) => Some(read_token(p, "--token-file")?),
            TokenSource::InCluster => Some(read_token(
                Path::new(IN_CLUSTER_TOKEN),
                "the ServiceAccount token",
            )?),
            TokenSource::None => None,
        };
        if token.is_some() && url.scheme() == "http" && !is_loopback(url) {
            warnings.push(format!(
                "sending the bearer token over plain HTTP to {}: anyone on the way can read it",
                url.host_str().unwrap_or("?")
            ));
        }
        let ca_pem = match &self.ca_file {
            None => None,
            Some(p) => Some(read_ca(p)?),
        };
        if self.insecure_skip_tls_verify && url.scheme() == "https" {
            warnings.push(
                "not verifying the shim's certificate (--insecure-skip-tls-verify)".to_string(),
            );
        }
        Ok((
            FetchOptions {
                timeout,
                token,
                ca_pem,
                insecure_skip_tls_verify: self.insecure_skip_tls_verify,
                resolve: None,
            },
            warnings,
        ))
    }
}

fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// The URL to GET: `url` with `/status` when its path is empty or `/`.
pub fn status_url(url: &str) -> Result<url::Url, String> {
    let mut parsed =
        url::Url::parse(url.trim()).map_err(|e| format!("{:?} is not a URL: {e}", redact(url)))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("{} is not an http(s) URL", redact_url(&parsed)));
    }
    if parsed.path().is_empty() || parsed.path() == "/" {
        parsed.set_path("/status");
    }
    Ok(parsed)
}

/// The URL without user name and password, for messages.
fn redact_url(url: &url::Url) -> String {
    let mut u = url.clone();
    if !u.username().is_empty() || u.password().is_some() {
        let _ = u.set_username("");
        let _ = u.set_password(None);
    }
    u.to_string()
}

/// Best effort for a string that did not even parse as a URL: drop anything before an `@`.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}{}", &url[..s + 3], &url[at + 1..]),
        _ => url.to_string(),
    }
}

/// Why fetching failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    Unreachable(String),
    NotAStatus(String),
    /// 401 or 403.
    Refused(String),
}

impl FetchError {
    pub fn exit_code(&self) -> u8 {
        match self {
            FetchError::Unreachable(_) => exit::UNREACHABLE,
            FetchError::NotAStatus(_) => exit::NOT_A_STATUS,
            FetchError::Refused(_) => exit::REFUSED,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            FetchError::Unreachable(m) | FetchError::NotAStatus(m) | FetchError::Refused(m) => m,
        }
    }
}

/// What to try when a request failed below HTTP: the scheme or the certificate.
fn transport_hint(scheme: &str, detail: &str) -> Option<&'static str> {
    let d = detail.to_ascii_lowercase();
    if scheme == "https" && d.contains("certificate") {
        return Some(
            "the shim's certificate is self-signed unless it runs with --tls-cert-file: pass \
             --insecure-skip-tls-verify, or --ca-file with the CA that signed it",
        );
    }
    if scheme == "https" && (d.contains("corrupt message") || d.contains("invalidcontenttype")) {
        return Some("is the shim serving plain HTTP (--insecure-serving)? then use http://");
    }
    if scheme == "http"
        && (d.contains("connection closed")
            || d.contains("reset by peer")
            || d.contains("incomplete message"))
    {
        return Some("the shim serves HTTPS unless it runs with --insecure-serving: try https://");
    }
    None
}

/// The 401/403 message: what the shim said, and what to do about it.
fn refusal_message(
    shown: &str,
    status: reqwest::StatusCode,
    first: &str,
    token_sent: bool,
) -> String {
    let said = if first.is_empty() {
        String::new()
    } else {
        format!(": {first}")
    };
    let hint = match (status.as_u16(), token_sent) {
        (401, false) => {
            "; no token was sent: pass --token-file (e.g. from `kubectl create token \
             <service-account>`)"
        }
        (401, true) => {
            "; the Kubernetes API did not accept the token (expired, or of another cluster?)"
        }
        _ => {
            "; the token's user needs the ClusterRole capc-health-shim-metrics-reader (bound \
             with a ClusterRoleBinding)"
        }
    };
    format!("{shown} refused the request with HTTP {status}{said}{hint}")
}

fn transport_error(shown: &str, scheme: &str, e: reqwest::Error) -> FetchError {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    let mut detail = String::new();
    let mut source: Option<&dyn std::error::Error> = Some(&e);
    // The chain names the root cause (e.g. "Connection refused"); strip URLs from reqwest's own text.
    while let Some(err) = source {
        let text = match err.downcast_ref::<reqwest::Error>() {
            Some(_) => String::new(),
            None => err.to_string(),
        };
        if !text.is_empty() && !detail.contains(&text) {
            if !detail.is_empty() {
                detail.push_str(": ");
            }
            detail.push_str(&text);
        }
        source = err.source();
    }
    let hint = transport_hint(scheme, &detail)
        .map(|h| format!(" ({h})"))
        .unwrap_or_default();
    if detail.is_empty() {
        FetchError::Unreachable(format!("cannot reach {shown}: {what}{hint}"))
    } else {
        FetchError::Unreachable(format!("cannot reach {shown}: {what}: {detail}{hint}"))
    }
}

/// First line of a body, short and printable, for error messages.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(400)]);
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let clean: String = line.chars().map(printable).take(120).collect();
    clean
}

/// GETs `url` with `opts` and parses the answer as a [`StatusReport`].
pub async fn fetch(url: &url::Url, opts: &FetchOptions) -> Result<StatusReport, FetchError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let shown = redact_url(url);
    let scheme = url.scheme().to_string();
    let mut builder = reqwest::Client::builder()
        .timeout(opts.timeout)
        .connect_timeout(opts.timeout)
        .redirect(reqwest::redirect::Policy::none());
    if let Some(pem) = &opts.ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|_| FetchError::Unreachable("the --ca-file bundle is not PEM".to_string()))?;
        builder = builder.tls_certs_only(certs);
    }
    if opts.insecure_skip_tls_verify {
        builder = builder.tls_danger_accept_invalid_certs(true);
    }
    if let Some((host, addr)) = &opts.resolve {
        builder = builder.resolve(host, *addr);
    }
    let client = builder
        .build()
        .map_err(|e| FetchError::Unreachable(format!("cannot build an HTTP client: {e}")))?;
    let mut request = client
        .get(url.clone())
        .header(reqwest::header::ACCEPT, "application/json");
    if let Some(token) = &opts.token {
        request = request.header(
            reqwest::header::AUTHORIZATION,
            token.header().map_err(FetchError::Unreachable)?,
        );
    }
    let mut response = request
        .send()
        .await
        .map_err(|e| transport_error(&shown, &scheme, e))?;
    let status = response.status();
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("no content type")
        .to_string();
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| transport_error(&shown, &scheme, e))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(FetchError::NotAStatus(format!(
                "{shown} answered more than {} MiB; that is not a status document",
                MAX_BODY / (1024 * 1024)
            )));
        }
        body.extend_from_slice(&chunk);
    }
    if matches!(status.as_u16(), 401 | 403) {
        return Err(FetchError::Refused(refusal_message(
            &shown,
            status,
            &snippet(&body),
            opts.token.is_some(),
        )));
    }
    if status != reqwest::StatusCode::OK {
        let first = snippet(&body);
        return Err(FetchError::NotAStatus(format!(
            "{shown} answered HTTP {status} ({content_type}), not a status document{}",
            if first.is_empty() {
                String::new()
            } else {
                format!(": {first}")
            }
        )));
    }
    let value: serde_json::Value = serde_json::from_slice(&body).map_err(|_| {
        let first = snippet(&body);
        FetchError::NotAStatus(format!(
            "{shown} answered HTTP 200 with {content_type} that is not JSON, so not a status \
             document (is this the shim's HTTP port?){}",
            if first.is_empty() {
                String::new()
            } else {
                format!(": {first}")
            }
        ))
    })?;
    serde_json::from_value(value).map_err(|e| {
        FetchError::NotAStatus(format!(
            "{shown} answered JSON that is not a status document: {e}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_appended_only_to_a_bare_address() {
        assert_eq!(
            status_url("http://127.0.0.1:8080").unwrap().as_str(),
            "http://127.0.0.1:8080/status"
        );
        assert_eq!(
            status_url("http://h:1/").unwrap().as_str(),
            "http://h:1/status"
        );
        assert_eq!(
            status_url("https://h/shim/status?x=1").unwrap().as_str(),
            "https://h/shim/status?x=1"
        );
        assert!(status_url("ftp://h/").unwrap_err().contains("not an http"));
        assert!(status_url("nonsense").unwrap_err().contains("not a URL"));
    }

    #[test]
    fn credentials_in_a_url_never_reach_messages() {
        let u = url::Url::parse("http://user:hunter2@h:1/status").unwrap();
        assert_eq!(redact_url(&u), "http://h:1/status");
        assert!(!redact("http://user:hunter2@[bad").contains("hunter2"));
        assert!(!status_url("ftp://user:hunter2@h/")
            .unwrap_err()
            .contains("hunter2"));
    }

    fn auth(args: &[&str]) -> ClientAuthArgs {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: ClientAuthArgs,
        }
        use clap::Parser;
        P::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .unwrap()
            .a
    }

    #[test]
    fn the_token_comes_from_a_flag_a_file_or_in_https_the_pod() {
        let none = auth(&[]);
        assert_eq!(
            token_source(&none, "https", true),
            Ok(TokenSource::InCluster)
        );
        assert_eq!(
            token_source(&none, "http", true),
            Ok(TokenSource::None),
            "the pod's token never goes out in the clear unasked"
        );
        assert_eq!(token_source(&none, "https", false), Ok(TokenSource::None));
        let file = auth(&["--token-file", "/t"]);
        assert_eq!(
            token_source(&file, "http", true),
            Ok(TokenSource::File("/t".into()))
        );
        assert_eq!(
            token_source(&auth(&["--token", "abc"]), "https", true),
            Ok(TokenSource::Flag)
        );
        assert!(token_source(
            &auth(&["--token", "a", "--token-file", "/t"]),
            "https",
            false
        )
        .unwrap_err()
        .contains("not both"));
    }

    #[test]
    fn tokens_are_checked_read_from_files_and_never_printed() {
        let t = BearerToken::parse(" eyJhbGciOi.abc-def_1\n").unwrap();
        assert_eq!(format!("{t:?}"), "BearerToken(<redacted>)");
        assert!(format!("{:?}", auth(&["--token", "hunter2-token"])).contains("<redacted>"));
        assert!(!format!("{:?}", auth(&["--token", "hunter2-token"])).contains("hunter2"));
        assert!(BearerToken::parse("  \n").unwrap_err().contains("empty"));
        assert!(BearerToken::parse("a b").is_err());

        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let url = url::Url::parse("https://127.0.0.1:8443/status").unwrap();
        let t = Duration::from_secs(1);
        let e = auth(&["--token-file", empty.to_str().unwrap()])
            .options(&url, t)
            .unwrap_err();
        assert!(e.contains("--token-file") && e.contains("empty"), "{e}");
        let e = auth(&["--token-file", "/nonexistent/tok"])
            .options(&url, t)
            .unwrap_err();
        assert!(
            e.contains("cannot read --token-file /nonexistent/tok"),
            "{e}"
        );
        let good = dir.path().join("token");
        std::fs::write(&good, "tok-1\n").unwrap();
        let (opts, warnings) = auth(&["--token-file", good.to_str().unwrap()])
            .options(&url, t)
            .unwrap();
        assert_eq!(opts.token, Some(BearerToken::parse("tok-1").unwrap()));
        assert!(warnings.is_empty());
        let remote = url::Url::parse("http://shim.example:8443/status").unwrap();
        let (_, warnings) = auth(&["--token-file", good.to_str().unwrap()])
            .options(&remote, t)
            .unwrap();
        assert!(warnings[0].contains("plain HTTP"), "{warnings:?}");

        let e = auth(&["--ca-file", "/c", "--insecure-skip-tls-verify"])
            .options(&url, t)
            .unwrap_err();
        assert!(e.contains("not both"), "{e}");
        let bad_ca = dir.path().join("ca.pem");
        std::fs::write(&bad_ca, "no certificate here").unwrap();
        let e = auth(&["--ca-file", bad_ca.to_str().unwrap()])
            .options(&url, t)
            .unwrap_err();
        assert!(e.contains("holds no PEM certificate"), "{e}");
    }

    #[test]
    fn refusals_and_transport_failures_say_what_to_do() {
        let m = refusal_message(
            "https://h/status",
            reqwest::StatusCode::UNAUTHORIZED,
            "Unauthorized: no bearer token",
            false,
        );
        assert!(m.contains("HTTP 401") && m.contains("--token-file"), "{m}");
        let m = refusal_message(
            "https://h/status",
            reqwest::StatusCode::UNAUTHORIZED,
            "",
            true,
        );
        assert!(m.contains("did not accept the token"), "{m}");
        let m = refusal_message(
            "https://h/status",
            reqwest::StatusCode::FORBIDDEN,
            "Forbidden",
            true,
        );
        assert!(m.contains("capc-health-shim-metrics-reader"), "{m}");
        assert!(
            transport_hint("https", "invalid peer certificate: UnknownIssuer")
                .unwrap()
                .contains("--insecure-skip-tls-verify")
        );
        assert!(
            transport_hint("http", "connection closed before message completed")
                .unwrap()
                .contains("https://")
        );
        assert_eq!(
            transport_hint("http", "Connection refused (os error 111)"),
            None
        );
        assert_eq!(FetchError::Refused("x".into()).exit_code(), exit::REFUSED);
    }
}
