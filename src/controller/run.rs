//! `capc-health-shim run`: wiring. Start the HTTP side, discover what the cluster serves
//! (readiness stays false until it does), start the watches, take the leader Lease, then poll
//! on a jittered interval until SIGTERM — which stops intake, lets the cycle in flight finish,
//! stops the writer (queued writes are dropped, those being sent get [`SHUTDOWN_WRITES`], then
//! the writer is aborted), closes the Lease gate, releases the Lease and stops the HTTP server:
//! once the Lease is released this process sends no write.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use rand::Rng;
use tokio::sync::watch;

use super::config::RunArgs;
use super::cycle::Controller;
use super::kube_io::{self, Resources, Stores};
use super::leadership::{LeaseGate, Refusal};
use crate::cli::to_std;
use crate::http::{self, HttpState};
use crate::k8s::watched::ConditionReader;
use crate::metrics::Metrics;
use crate::status::board::StatusBoard;
use crate::status::StatusReport;
use capi_model::apis::{choose, ApiChoice};

/// Exit codes of `run`.
pub mod exit {
    pub const STOPPED: u8 = 0;
    pub const STARTUP: u8 = 1;
    /// Leadership was lost: exit so that Kubernetes restarts this replica as a follower.
    pub const LOST_LEASE: u8 = 5;
    /// The served CAPI/CAPC versions changed (an upgrade): exit so the restart re-discovers.
    pub const APIS_CHANGED: u8 = 6;
}

use super::config::{LEASE_RENEW_BEFORE_SECONDS, LEASE_SECONDS};

/// How long a stopping leader waits for the writes being sent (queued ones are dropped).
const SHUTDOWN_WRITES: Duration = Duration::from_secs(10);

/// How often discovery runs again while leading (CAPI upgrades flip served versions).
const REDISCOVERY_EVERY: Duration = Duration::from_secs(600);

fn jittered(interval: Duration) -> Duration {
    let factor = rand::rng().random_range(0.9..1.1);
    interval.mul_f64(factor)
}

/// Resolves on SIGTERM or Ctrl-C.
async fn termination() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// While this replica stands by: the Lease's holder into `/status`, whenever it changes. A
/// failed read keeps the last holder seen (the standby's view of it is informative only).
async fn follow_leader(leases: kube::Api<Lease>, name: String, report: Arc<StatusBoard>) {
    let mut shown: Option<String> = None;
    loop {
        let read = tokio::time::timeout(Duration::from_secs(5), leases.get_opt(&name)).await;
        if let Ok(Ok(Some(lease))) = read {
            let holder = lease.spec.and_then(|s| s.holder_identity);
            if holder != shown {
                report.write().await.leader_identity = holder.clone();
                shown = holder;
            }
        }
        tokio::time::sleep(Duration::from_secs(LEASE_RENEW_BEFORE_SECONDS)).await;
    }
}

async fn set_problem(report: &StatusBoard, problem: String) {
    let mut r = report.write().await;
    r.ready = false;
    r.problems = vec![problem];
}

pub async fn main(args: RunArgs) -> u8 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let report = Arc::new(StatusBoard::new(StatusReport {
        version: env!("CARGO_PKG_VERSION").to_string(),
        ..Default::default()
    }));
    let metrics = Arc::new(Metrics::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        termination().await;
        tracing::info!("termination requested");
        let _ = stop_tx.send(true);
    });
    let stopped = {
        let rx = stop_rx.clone();
        move || {
            let mut rx = rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        }
    };

    // The serving certificate first, so a bad --tls-* file fails the start with its reason.
    let source = match args.serving.cert_source() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("run: {e}");
            return exit::STARTUP;
        }
    };
    let tls = match source {
        None => None,
        Some(source) => match http::tls::load(&source) {
            Ok((config, files)) => Some((source, config, files)),
            Err(e) => {
                eprintln!("run: {e}");
                return exit::STARTUP;
            }
        },
    };
    let listener = match tokio::net::TcpListener::bind(&args.status_addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "run: cannot listen on --status-addr {}: {e}",
                args.status_addr
            );
            return exit::STARTUP;
        }
    };

    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("run: no Kubernetes configuration (in-cluster or KUBECONFIG): {e}");
            return exit::STARTUP;
        }
    };

    let state = HttpState {
        report: report.clone(),
        metrics: metrics.clone(),
    };
    let mut reload_task = None;
    let http_task = match tls {
        None => {
            let loopback = listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
            if loopback {
                tracing::info!(addr = %args.status_addr, "serving /status, /metrics, /healthz, /readyz over plain HTTP without authentication (--insecure-serving)");
            } else {
                tracing::warn!(addr = %args.status_addr, "serving /status and /metrics over plain HTTP to anyone who can reach this address (--insecure-serving)");
            }
            tokio::spawn(http::serve(listener, state, stopped()))
        }
        Some((source, config, files)) => {
            if let (http::tls::CertSource::Files { cert, key }, Some(pem)) = (&source, files) {
                reload_task = Some(tokio::spawn(http::tls::reload_on_change(
                    config.clone(),
                    cert.clone(),
                    key.clone(),
                    pem,
                )));
            }
            tracing::info!(addr = %args.status_addr, certificate = ?source,
                "serving /status and /metrics over HTTPS to bearer tokens the Kubernetes API authorizes; /healthz, /readyz open");
            let authorizer = Arc::new(http::auth::Authorizer::new(
                client.clone(),
                to_std(args.kube_timeout),
            ));
            tokio::spawn(http::serve_tls(
                listener,
                config,
                http::secured_router(state, authorizer),
                stopped(),
            ))
        }
    };

    // Discovery: retry until the APIs are there; readiness stays false meanwhile.
    let choice: ApiChoice = loop {
        let (served, notes) = kube_io::discover(&client).await;
        match choose(&served, args.mode.forced()) {
            Ok(c) => {
                let mut r = report.write().await;
                r.problems = notes;
                break c;
            }
            Err(e) => {
                tracing::error!(error = %e, "discovery failed; retrying in 10s");
                set_problem(&report, e.to_string()).await;
                tokio::select! {
                    _ = stopped() => return exit::STARTUP,
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
        }
    };
    tracing::info!(mode = %choice.mode, source = %choice.mode_source, layout = ?choice.layout,
        cloudstack_machine = %choice.cloudstack_machine_version, "discovered Cluster API and CAPC");
    if args.no_workload_node_lookup {
        tracing::info!("--no-workload-node-lookup: no <cluster>-kubeconfig Secret is read; the NodeNotLinked guard is off");
    }
    let resources = Resources::for_choice(&choice);
    let stores = Stores::start(
        &client,
        &resources,
        ConditionReader {
            layout: choice.layout,
            condition_type: args.condition_type.clone(),
        },
        &args.namespaces,
    );
    // The remnant report's metadata watches: they sync in the background and do not hold up
    // readiness (a kind RBAC refuses stays out of the report, named in /status).
    let remnant_watches = if args.no_remnant_report {
        None
    } else {
        let kinds = super::remnants::discover_remnant_kinds(&client).await;
        Some(super::remnants::MetadataWatches::start(
            &client,
            kinds,
            &args.namespaces,
        ))
    };
    if !stores.wait_until_ready(Duration::from_secs(120)).await {
        set_problem(&report, "watches did not sync within 120s".into()).await;
        tracing::error!("watches did not sync within 120s");
        return exit::STARTUP;
    }

    // The shim's own namespace: its Lease and its memory ConfigMap live there.
    let namespace = args
        .lease_namespace
        .clone()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok()
        })
        .unwrap_or_else(|| "default".to_string());
    // Leader election: only the leader polls and writes.
    let mut lease = None;
    let mut own_identity = None;
    let mut gate = LeaseGate::unelected(to_std(args.kube_timeout));
    if !args.no_leader_election {
        let identity = std::env::var("HOSTNAME")
            .unwrap_or_else(|_| format!("capc-health-shim-{}", uuid::Uuid::new_v4()));
        own_identity = Some(identity.clone());
        gate = LeaseGate::leading(
            kube::Api::<Lease>::namespaced(client.clone(), namespace.trim()),
            &args.lease_name,
            &identity,
            to_std(args.kube_timeout),
        );
        let manager =
            match kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &args.lease_name)
                .with_namespace(namespace.trim())
                .with_identity(identity)
                .with_duration(LEASE_SECONDS)
                .with_grace(LEASE_RENEW_BEFORE_SECONDS)
                .build()
                .await
            {
                Ok(m) => m,
                Err(e) => {
                    set_problem(&report, format!("cannot set up the leader Lease: {e}")).await;
                    return exit::STARTUP;
                }
            };
        let (mut rx, task) = manager.watch().await;
        tracing::info!("waiting for the leader Lease");
        // A standby's /status says where the verdicts are: the Lease's holder, read again
        // every renewal period (a port-forward or the Service may land here).
        let follow = tokio::spawn(follow_leader(
            kube::Api::<Lease>::namespaced(client.clone(), namespace.trim()),
            args.lease_name.clone(),
            report.clone(),
        ));
        {
            let mut r = report.write().await;
            r.ready = true;
        }
        // A follower is ready too: it serves /status and takes over when the leader goes.
        metrics.set_ready(true);
        let became_leader = tokio::select! {
            _ = stopped() => false,
            _ = rx.wait_for(|leader| *leader) => true,
        };
        follow.abort();
        if !became_leader {
            drop(rx);
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
            return exit::STOPPED;
        }
        lease = Some((rx, task));
    }
    metrics.set_leader(true);
    {
        let mut r = report.write().await;
        r.leader = true;
        r.leader_identity = own_identity;
        r.ready = true;
    }
    metrics.set_ready(true);
    tracing::info!("leading: polling CloudStack and publishing verdicts");

    let gate = Arc::new(gate);
    // The renewal reports the Lease lost (or the renewer ended): the gate closes at once, not
    // at the next cycle, so a cycle in progress writes nothing more. Holds a receiver of the
    // renewal watch: aborted before the Lease is released (releasing waits for every receiver).
    let renewal_watch = lease.as_ref().map(|(rx, _)| {
        let (mut rx, gate) = (rx.clone(), gate.clone());
        tokio::spawn(async move {
            let _ = rx.wait_for(|leader| !*leader).await;
            gate.revoke("the leader Lease renewal lost it");
        })
    });
    let mut controller = Controller::new(
        client.clone(),
        args.clone(),
        choice.clone(),
        resources,
        stores,
        report.clone(),
        metrics.clone(),
    )
    .leading_by(gate.clone())
    .detached_writes();
    if let Some(watches) = remnant_watches {
        controller = controller.with_remnant_report(watches);
    }
    controller = controller.with_memory(super::memory::MemoryStore::new(
        &client,
        namespace.trim(),
        &args.orphan_memory_configmap,
    ));
    controller = controller.with_scorecard_memory(super::scorecard_memory::ScorecardStore::new(
        &client,
        namespace.trim(),
        &args.orphan_memory_configmap,
    ));
    // What an earlier leader remembered, before the first cycle judges anything.
    controller.restore_memory().await;
    controller.restore_scorecard().await;
    let interval = Duration::try_from(args.poll_interval).unwrap_or(Duration::from_secs(30));
    let mut code = exit::STOPPED;
    let mut last_discovery = std::time::Instant::now();
    loop {
        // Confirmed here once so a cut-off leader skips the whole cycle; the act phase confirms
        // again before every write, since a cycle can outlast the Lease.
        let lease_lost = match gate.confirm().await {
            Ok(()) => {
                let summary = controller.cycle(Timestamp::now()).await;
                tracing::debug!(?summary, "cycle done");
                summary.lost_lease
            }
            Err(Refusal::Lost(why)) => {
                tracing::error!(reason = %why, "the leader Lease is someone else's");
                true
            }
            Err(Refusal::Unconfirmed(why)) => {
                report.write().await.problems = vec![format!(
                    "not writing until the leader Lease is confirmed: {why}"
                )];
                false
            }
        };
        if lease_lost {
            tracing::error!("no longer the leader; stopping writes and exiting");
            code = exit::LOST_LEASE;
            break;
        }
        if last_discovery.elapsed() >= REDISCOVERY_EVERY {
            last_discovery = std::time::Instant::now();
            let (served, _) = kube_io::discover(&client).await;
            if let Ok(now_choice) = choose(&served, args.mode.forced()) {
                if now_choice != choice {
                    tracing::warn!(before = ?choice, after = ?now_choice, "served Cluster API/CAPC versions changed; exiting to restart with them");
                    code = exit::APIS_CHANGED;
                    break;
                }
            }
        }
        let lost = async {
            match lease.as_mut() {
                Some((rx, _)) => {
                    let _ = rx.wait_for(|leader| !*leader).await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = stopped() => break,
            _ = lost => {
                tracing::error!("no longer the leader (the Lease renewal lost it); stopping writes and exiting");
                code = exit::LOST_LEASE;
                break;
            }
            _ = controller.wait_probing(jittered(interval)) => {}
        }
    }
    // Writes end before the Lease is released: nothing queued is started, what is being sent
    // gets SHUTDOWN_WRITES (none when leadership is lost: the gate refuses them anyway), then
    // the writer is aborted.
    let wait = if code == exit::STOPPED {
        SHUTDOWN_WRITES
    } else {
        Duration::ZERO
    };
    let queued = controller.writes_in_flight();
    let left = controller.stop_writes(wait).await;
    if queued > 0 {
        tracing::warn!(
            queued,
            cut_off = left,
            "stopping with writes not sent; the next leader decides them again"
        );
    }
    // Closed before the release: a cached confirmation must not let anything through after.
    gate.revoke("the leader Lease was released (shutdown)");
    metrics.set_leader(false);
    if let Some(watch) = renewal_watch {
        watch.abort();
        let _ = watch.await;
    }
    if let Some((rx, task)) = lease {
        drop(rx); // dropping every receiver releases the Lease
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(6), http_task).await;
    if let Some(t) = reload_task {
        t.abort();
    }
    code
}
