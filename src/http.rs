//! The controller's HTTP endpoints (product.md §7), read-only views of shared state:
//!
//! - `GET /status`: the [`StatusReport`] as JSON.
//! - `GET /metrics`: [`Metrics::encode`] as OpenMetrics text.
//! - `GET /healthz`: `ok` while the process serves (liveness).
//! - `GET /readyz`: `ready` once discovery succeeded and the caches are synced, else 503 with
//!   a one-line reason (readiness).
//! - anything else: 404 with a small JSON body.

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio::sync::RwLock;

use crate::metrics::{self, Metrics};
use crate::status::StatusReport;

/// What the handlers read. The controller writes `report` after every poll cycle.
#[derive(Clone)]
pub struct HttpState {
    pub report: Arc<RwLock<StatusReport>>,
    pub metrics: Arc<Metrics>,
}

impl HttpState {
    pub fn new(report: StatusReport, metrics: Metrics) -> Self {
        Self {
            report: Arc::new(RwLock::new(report)),
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

/// The routes, for [`serve`] or for tests that drive the router directly.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(state)
}

/// Serves the routes on `listener` until `shutdown` completes, then finishes in-flight
/// requests and returns.
pub async fn serve(
    listener: TcpListener,
    state: HttpState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn status(State(state): State<HttpState>) -> Json<StatusReport> {
    Json(state.report.read().await.clone())
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
