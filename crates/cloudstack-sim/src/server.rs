//! HTTP front: `/client/api` (CloudStack servlet) and the `/sim/…` admin JSON API, plus the
//! API-level fault injections (outage, latency, 530s, hangs, truncated JSON, proxy HTML).

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

pub use super::admin::vm_admin_json;
use super::admin::*;
use super::api::{self, collect_params, error_body, ApiError, Env};
use super::clock::real_now_ms;
use super::commands;
use super::world::Throttle;
use super::Simulator;

const JSON_CT: &str = "application/json; charset=UTF-8";

const PROXY_502: &str = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n";
const OUTAGE_503: &str = "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n";

/// A running simulator server.
pub struct SimServer {
    addr: SocketAddr,
    scheme: &'static str,
    stop: watch::Sender<bool>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl SimServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (`https://` when serving TLS)
    pub fn base_url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// `http://127.0.0.1:PORT/client/api`
    pub fn api_url(&self) -> String {
        format!("{}/client/api", self.base_url())
    }

    /// Stops accepting, releases hanging requests and waits for the server task.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Waits until the server stops (it runs until `shutdown` or an I/O error).
    pub async fn wait(self) -> std::io::Result<()> {
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }
}

#[derive(Clone)]
pub(crate) struct App {
    pub(crate) sim: Simulator,
    stop: watch::Receiver<bool>,
}

/// Serves `world` on a free port of 127.0.0.1 with its clock at `time_scale` (0: frozen, moved
/// by the caller) — what in-process tests and benches want.
pub async fn serve_loopback(
    world: crate::World,
    time_scale: f64,
) -> std::io::Result<(Simulator, SimServer)> {
    let sim = Simulator::with_time_scale(world, time_scale);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let server = serve(listener, sim.clone()).await?;
    Ok((sim, server))
}

/// Serves the simulator on an already bound listener.
pub async fn serve(listener: TcpListener, sim: Simulator) -> std::io::Result<SimServer> {
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let (tx, rx) = oneshot::channel::<()>();
    let app = router(App { sim, stop: stop_rx });
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await
    });
    Ok(SimServer {
        addr,
        scheme: "http",
        stop: stop_tx,
        shutdown: Some(tx),
        task,
    })
}

/// A TLS server configuration from PEM data (certificate chain, private key), on the ring
/// provider the rest of the process uses.
pub fn tls_config(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<std::sync::Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("TLS certificate PEM: {e}"))?;
    if certs.is_empty() {
        return Err("TLS certificate PEM holds no certificate".into());
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("TLS private key PEM: {e}"))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS certificate/key: {e}"))?;
    Ok(std::sync::Arc::new(config))
}

/// Serves the simulator over HTTPS (CloudStack is usually reached through TLS; this lets
/// tests exercise certificate verification, `verify-ssl: false` and extra CA bundles).
pub async fn serve_tls(
    listener: TcpListener,
    sim: Simulator,
    tls: std::sync::Arc<rustls::ServerConfig>,
) -> std::io::Result<SimServer> {
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let (tx, mut rx) = oneshot::channel::<()>();
    let app = router(App { sim, stop: stop_rx });
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut rx => break,
                accepted = listener.accept() => {
                    let Ok((tcp, _)) = accepted else { continue };
                    let acceptor = acceptor.clone();
                    let app = app.clone();
                    tokio::spawn(async move {
                        // A failed handshake (e.g. a client rejecting our certificate) ends
                        // only that connection.
                        let Ok(stream) = acceptor.accept(tcp).await else { return };
                        let service = hyper_util::service::TowerToHyperService::new(app);
                        let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        }
        Ok(())
    });
    Ok(SimServer {
        addr,
        scheme: "https",
        stop: stop_tx,
        shutdown: Some(tx),
        task,
    })
}

fn router(app: App) -> Router {
    Router::new()
        .route("/client/api", any(api_handler))
        .route("/client/api/", any(api_handler))
        .route("/sim/vms", get(admin_list_vms).post(admin_create_vm))
        .route("/sim/vms/{id}", get(admin_get_vm))
        .route(
            "/sim/vms/{id}/faults",
            post(admin_add_fault).delete(admin_clear_faults),
        )
        .route("/sim/vms/{id}/guest", post(admin_set_guest))
        .route("/sim/hosts", get(admin_list_hosts))
        .route("/sim/hosts/{id}", get(admin_get_host).post(admin_set_host))
        .route(
            "/sim/settings",
            get(admin_get_settings).post(admin_set_settings),
        )
        .route("/sim/api", get(admin_get_api).post(admin_set_api))
        .route("/sim/calls", get(admin_calls))
        .route("/sim/reset", post(admin_reset))
        .route("/sim/clock", get(admin_get_clock).post(admin_set_clock))
        .route(
            "/sim/networks",
            get(admin_list_networks).post(admin_create_network),
        )
        .route("/sim/networks/{id}", post(admin_set_network))
        .route("/sim/routers", get(admin_list_routers))
        .route(
            "/sim/routers/{id}",
            get(admin_get_router).post(admin_set_router),
        )
        .route("/sim/root-admin", get(admin_root_admin))
        .with_state(app)
}

/// API-level fault injection settings (`POST /sim/api`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApiFaults {
    /// Every API request gets a proxy-style 503 page.
    pub outage: bool,
    /// Delay before every API answer.
    pub latency_ms: u64,
    /// Probability (0..1) that an authenticated request gets a 530 envelope instead.
    pub server_error_rate: f64,
    /// Number of upcoming requests that hang until the server stops.
    pub timeout_next: u64,
    /// Number of upcoming requests answered with truncated JSON.
    pub malformed_next: u64,
    /// Number of upcoming requests answered with a proxy-style HTML 502 page.
    pub html_next: u64,
    /// Number of upcoming requests answered normally before `timeout_next`, `html_next` and
    /// `malformed_next` apply (e.g. 1 = a listing's second page is the broken one).
    pub fault_after: u64,
    /// Offset of the server's wall clock from the real one, in ms: `expires` is checked
    /// against (and the `Date` header shows) real time + this (clock skew).
    pub clock_skew_ms: i64,
}

impl ApiFaults {
    pub fn to_json(&self, throttle: Option<Throttle>) -> Value {
        json!({
            "outage": self.outage,
            "throttle": throttle,
            "latency_ms": self.latency_ms,
            "server_error_rate": self.server_error_rate,
            "timeout_next": self.timeout_next,
            "malformed_next": self.malformed_next,
            "html_next": self.html_next,
            "fault_after": self.fault_after,
            "clock_skew_seconds": self.clock_skew_ms as f64 / 1000.0,
        })
    }
}

enum Injection {
    None,
    /// Answered normally, counted against `fault_after`.
    Passed,
    Outage,
    Hang,
    Html,
}

fn text_response(status: u16, ct: &'static str, body: String) -> Response {
    let mut r = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        body,
    )
        .into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    r
}

fn header_safe(s: &str) -> HeaderValue {
    let cleaned: String = s
        .chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .collect();
    HeaderValue::from_str(&cleaned).unwrap_or_else(|_| HeaderValue::from_static("error"))
}

async fn api_handler(
    State(app): State<App>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let is_form = method == Method::POST
        && headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.to_ascii_lowercase()
                    .starts_with("application/x-www-form-urlencoded")
            });
    let params = collect_params(query.as_deref(), is_form.then_some(&body[..]));
    let command = params.get("command").cloned().unwrap_or_default();

    let (latency, injection, skew_ms, caller) = {
        let mut st = app.sim.lock();
        // Whose request this is, by account name (`/sim/calls` `by_account`), resolved once
        // on arrival: every answer below counts for it, injected ones included.
        let caller = st.caller_of(&params);
        if let Some((_, sig)) = params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("signature"))
        {
            st.record_signature(sig);
        }
        let f = &mut st.api_faults;
        let passed = f.fault_after > 0 && !f.outage;
        let inj = if f.outage {
            Injection::Outage
        } else if passed {
            f.fault_after -= 1;
            Injection::Passed
        } else if f.timeout_next > 0 {
            f.timeout_next -= 1;
            Injection::Hang
        } else if f.html_next > 0 {
            f.html_next -= 1;
            Injection::Html
        } else {
            Injection::None
        };
        (f.latency_ms, inj, f.clock_skew_ms, caller)
    };
    let server_now_ms = real_now_ms().saturating_add(skew_ms);
    if latency > 0 {
        let mut stop = app.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(latency)) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }
    match injection {
        Injection::Outage => {
            app.sim.lock().record_call(&caller, &command, "503");
            return text_response(503, "text/html", OUTAGE_503.to_string());
        }
        Injection::Html => {
            app.sim.lock().record_call(&caller, &command, "502");
            return text_response(502, "text/html", PROXY_502.to_string());
        }
        Injection::Hang => {
            app.sim.lock().record_call(&caller, &command, "hang");
            let mut stop = app.stop.clone();
            let _ = stop.wait_for(|s| *s).await;
            return text_response(504, "text/html", String::new());
        }
        Injection::None | Injection::Passed => {}
    }

    let (reply, truncate) = {
        let mut guard = app.sim.lock();
        let st = &mut *guard;
        let now = st.clock.now_ms();
        st.world.advance_to(now);
        let rows_before = st.world.stats_rows_read;
        let mut reply = api::handle(
            &mut st.world,
            Env {
                throttle: &mut st.throttle,
                real_now_ms: server_now_ms,
            },
            &params,
        );
        if reply.status == 200
            && st.api_faults.server_error_rate > 0.0
            && rand::random::<f64>() < st.api_faults.server_error_rate
        {
            let e = ApiError {
                code: 530,
                cs: Some(4250),
                text: "Internal error executing command, please contact your system administrator"
                    .into(),
                error_wrapper: false,
            };
            let wrapper = commands::find(&reply.command)
                .map(|s| s.response)
                .unwrap_or("errorresponse");
            reply.body = error_body(wrapper, &e);
            reply.status = 530;
            reply.description = Some(e.text);
        }
        let truncate =
            if !matches!(injection, Injection::Passed) && st.api_faults.malformed_next > 0 {
                st.api_faults.malformed_next -= 1;
                true
            } else {
                false
            };
        let label = if truncate {
            format!("{}-malformed", reply.status)
        } else {
            reply.status.to_string()
        };
        st.record_call(&caller, &reply.command, &label);
        let rows = st.world.stats_rows_read - rows_before;
        st.record_stats_rows(&caller, &reply.command, rows);
        (reply, truncate)
    };
    tracing::debug!(command = %reply.command, status = reply.status, "api call");
    let mut body = reply.body;
    if truncate {
        let mut cut = body.len() / 2;
        while cut > 0 && !body.is_char_boundary(cut) {
            cut -= 1;
        }
        body.truncate(cut);
    }
    let mut r = text_response(reply.status, JSON_CT, body);
    if let Some(d) = reply.description {
        r.headers_mut().insert("X-Description", header_safe(&d));
    }
    if skew_ms != 0 {
        // The server's own idea of the time, as a skewed management server would send it.
        if let Ok(t) = jiff::Timestamp::from_millisecond(server_now_ms) {
            let date = jiff::fmt::rfc2822::DateTimePrinter::new().timestamp_to_rfc9110_string(&t);
            if let Ok(date) = date {
                r.headers_mut().insert(header::DATE, header_safe(&date));
            }
        }
    }
    r
}
