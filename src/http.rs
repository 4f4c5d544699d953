//! The controller's HTTP endpoints (product.md §7), read-only views of shared state:
//!
//! - `GET /status`: the [`StatusReport`] as JSON, rendered once per change (`ETag`, gzip);
//!   `?cluster=<namespace>/<name>` and `?problems=true` cut smaller views.
//! - `GET /metrics`: [`Metrics::encode`] as OpenMetrics text.
//! - `GET /healthz`: `ok` while the process serves (liveness).
//! - `GET /readyz`: `ready` once discovery succeeded and the caches are synced, else 503 with
//!   a one-line reason (readiness).
//! - anything else: 404 with a small JSON body.
//!
//! `run` serves them on one listener (`--status-addr`), by default over HTTPS ([`tls`]) with
//! `/status` and `/metrics` open only to bearer tokens the Kubernetes API authenticates and
//! authorizes ([`auth`]); `/healthz` and `/readyz` stay open to anyone, as on
//! kube-controller-manager's secure port (`--authorization-always-allow-paths`), so kubelet
//! probes need no token. `--insecure-serving` serves all four over plain HTTP to anyone.

pub mod auth;
pub mod tls;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use axum_server::tls_rustls::RustlsConfig;
use clap::Args;
use tokio::net::TcpListener;

use self::auth::Authorizer;
use self::tls::CertSource;
use crate::metrics::{self, Metrics};
use crate::status::board::{StatusBoard, StatusQuery};
use crate::status::StatusReport;

/// How `run` serves its endpoints (flags of `run`, flattened into its flag list).
#[derive(Debug, Clone, Args)]
pub struct ServingArgs {
    /// Serve /status and /metrics over plain HTTP to anyone who reaches --status-addr: no TLS,
    /// no token, no authorization. For loopback and tests only: on a pod network every pod
    /// could read every Machine's verdict and the shim's metrics.
    #[arg(long, env = "CAPC_HEALTH_INSECURE_SERVING")]
    pub insecure_serving: bool,
    /// PEM certificate (chain) of the HTTPS listener, re-read when it changes [default: a
    /// self-signed certificate made at start].
    #[arg(
        long,
        env = "CAPC_HEALTH_TLS_CERT_FILE",
        value_name = "PATH",
        requires = "tls_private_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(
        long,
        env = "CAPC_HEALTH_TLS_PRIVATE_KEY_FILE",
        value_name = "PATH",
        requires = "tls_cert_file"
    )]
    pub tls_private_key_file: Option<PathBuf>,
}

impl ServingArgs {
    /// Where the HTTPS certificate comes from; `None` with `--insecure-serving`. (Checked here,
    /// not by clap: clap counts `CAPC_HEALTH_INSECURE_SERVING=false` as the flag given.)
    pub fn cert_source(&self) -> Result<Option<CertSource>, String> {
        let files = (&self.tls_cert_file, &self.tls_private_key_file);
        if self.insecure_serving {
            if files.0.is_some() || files.1.is_some() {
                return Err("--insecure-serving serves plain HTTP: it takes no \
                     --tls-cert-file/--tls-private-key-file"
                    .to_string());
            }
            return Ok(None);
        }
        Ok(Some(match files {
            (Some(cert), Some(key)) => CertSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            (None, None) => CertSource::SelfSigned,
            _ => return Err("--tls-cert-file and --tls-private-key-file go together".to_string()),
        }))
    }
}

/// What the handlers read. The controller writes `report` after every poll cycle.
#[derive(Clone)]
pub struct HttpState {
    pub report: Arc<StatusBoard>,
    pub metrics: Arc<Metrics>,
}

impl HttpState {
    pub fn new(report: StatusReport, metrics: Metrics) -> Self {
        Self {
            report: Arc::new(StatusBoard::new(report)),
            metrics: Arc::new(metrics),
        }
    }
}

/// The reason `/readyz` gives when the report is not ready.
pub fn not_ready_reason(report: &StatusReport) -> String {
    let reason = report
        .problems
        .first()
        .map(|p| p.split(['\r', '\n']).next().unwrap_or_default().trim())
        .filter(|p| !p.is_empty())
        .unwrap_or("discovery/caches not done");
    format!("not ready: {reason}")
}

/// The routes, open to anyone (`--insecure-serving`, tests that drive the router directly).
pub fn router(state: HttpState) -> Router {
    routes(state, None)
}

/// The routes with `/status` and `/metrics` behind [`auth::require_access`]; `/healthz`,
/// `/readyz` and the 404 stay open.
pub fn secured_router(state: HttpState, authorizer: Arc<Authorizer>) -> Router {
    routes(state, Some(authorizer))
}

fn routes(state: HttpState, authorizer: Option<Arc<Authorizer>>) -> Router {
    let guarded = Router::new()
        .route("/status", get(status))
        .route("/metrics", get(metrics_text));
    let guarded = match authorizer {
        Some(a) => guarded.route_layer(middleware::from_fn_with_state(a, auth::require_access)),
        None => guarded,
    };
    guarded
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(state)
}

/// Serves the open routes over plain HTTP on `listener` until `shutdown` completes, then
/// finishes in-flight requests and returns (`--insecure-serving`).
pub async fn serve(
    listener: TcpListener,
    state: HttpState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// How long in-flight HTTPS requests may take to finish after `shutdown`.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves `app` over HTTPS with `tls` on `listener` until `shutdown` completes, then lets
/// in-flight requests finish (at most 5 s) and returns.
pub async fn serve_tls(
    listener: TcpListener,
    tls: RustlsConfig,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    let stop = tokio::spawn(async move {
        shutdown.await;
        stopper.graceful_shutdown(Some(DRAIN));
    });
    let served = axum_server::from_tcp_rustls(listener.into_std()?, tls)?
        .handle(handle)
        .serve(app.into_make_service())
        .await;
    stop.abort();
    served
}

/// `GET /status[?cluster=ns/name][&problems=true]`: the whole document from the rendering
/// made once per change (gzip when accepted), or the part asked for; `ETag` and
/// `If-None-Match` (304) on both, so a poller that saw this cycle's document gets no body.
async fn status(
    State(state): State<HttpState>,
    query: Result<Query<StatusQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let Ok(Query(q)) = query else {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({
                "error": "bad query: /status takes cluster=<namespace>/<name> and problems=true|false",
            })),
        )
            .into_response();
    };
    let matches = |etag: &str| {
        headers
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim() == etag || t.trim() == "*")
    };
    let json = [(header::CONTENT_TYPE, "application/json")];
    if q.is_whole() {
        let rendered = state.report.rendered().await;
        let tagged = [
            (header::ETAG, rendered.etag.clone()),
            (header::VARY, "accept-encoding".to_string()),
        ];
        if matches(&rendered.etag) {
            return (StatusCode::NOT_MODIFIED, tagged).into_response();
        }
        if accepts_gzip(&headers) {
            let gz = [(header::CONTENT_ENCODING, "gzip")];
            return (tagged, json, gz, rendered.gzip().clone()).into_response();
        }
        return (tagged, json, rendered.json.clone()).into_response();
    }
    let etag = state.report.etag_of_view(&q.tag());
    if matches(&etag) {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    match state.report.rendered_view(&q).await {
        Ok((etag, body)) => ([(header::ETAG, etag)], json, body).into_response(),
        Err(e) => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or_default().trim();
            // `gzip;q=0` refuses it.
            let refused = parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
            name.eq_ignore_ascii_case("gzip") && !refused
        })
}

async fn metrics_text(State(state): State<HttpState>) -> Response {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.encode(),
    )
        .into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<HttpState>) -> Response {
    let report = state.report.read().await;
    if report.ready {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        let reason = not_ready_reason(&report);
        (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response()
    }
}

async fn not_found(uri: Uri) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({
            "error": "not found",
            "path": uri.path(),
            "endpoints": ["/status", "/metrics", "/healthz", "/readyz"],
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_is_https_with_a_self_signed_certificate_unless_told_otherwise() {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            s: ServingArgs,
        }
        use clap::Parser;
        let parse = |args: &[&str]| {
            P::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
                .map(|p| p.s.cert_source())
        };
        assert_eq!(parse(&[]).unwrap(), Ok(Some(CertSource::SelfSigned)));
        assert_eq!(parse(&["--insecure-serving"]).unwrap(), Ok(None));
        assert_eq!(
            parse(&["--tls-cert-file", "/c", "--tls-private-key-file", "/k"]).unwrap(),
            Ok(Some(CertSource::Files {
                cert: "/c".into(),
                key: "/k".into()
            }))
        );
        assert!(
            parse(&["--tls-cert-file", "/c"]).is_err(),
            "a pair or nothing"
        );
        let both = parse(&[
            "--insecure-serving",
            "--tls-cert-file",
            "/c",
            "--tls-private-key-file",
            "/k",
        ])
        .unwrap()
        .unwrap_err();
        assert!(both.contains("plain HTTP"), "{both}");
    }

    #[test]
    fn not_ready_names_the_first_problem_on_one_line() {
        let mut r = StatusReport::default();
        assert_eq!(not_ready_reason(&r), "not ready: discovery/caches not done");
        r.problems = vec![
            "Cluster API Machine API is not served\nsecond line".into(),
            "later".into(),
        ];
        assert_eq!(
            not_ready_reason(&r),
            "not ready: Cluster API Machine API is not served"
        );
        r.problems = vec!["  \n".into()];
        assert_eq!(not_ready_reason(&r), "not ready: discovery/caches not done");
    }
}
