//! The anchor a user compares the shim's cost with (issue 28): CAPI v1.13 core — the e2e's
//! process B (`tests/e2e/capi-core`: the Cluster, Machine, MachineSet, MachineDeployment, MHC,
//! KCP and CABPK controllers with their webhooks, built by `make e2e-build`) — holding the same
//! steady fleet in a fresh API server of the `capi-1.13` profile. Measured after the shim's
//! rows, alone on the machine: CAPI's status writes would otherwise be changes the shim has to
//! follow.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use kube::api::{Api, DynamicObject, ListParams};

use crate::fleet::{FleetKind, Kube, NAMESPACE};
use crate::procs::{self, ApiServer};
use crate::report;

/// How long CAPI core gets to start (webhooks, caches) and then to reconcile every Machine.
const READY_LIMIT: Duration = Duration::from_secs(600);
const RECONCILE_LIMIT: Duration = Duration::from_secs(900);
/// The idle window after every Machine was reconciled, for CPU and the RSS it settles at.
const IDLE_WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct AnchorRow {
    pub machines: usize,
    pub capi_version: String,
    /// Process start → ready file (webhooks answer, caches synced).
    pub ready_seconds: f64,
    /// Process start → every Machine carries CAPI's finalizer (its Machine controller has
    /// reconciled each once); NaN when not all did within [`RECONCILE_LIMIT`] (`reconciled`
    /// says how many).
    pub reconciled_seconds: f64,
    pub reconciled: usize,
    pub rss_peak_mib: f64,
    pub rss_steady_mib: f64,
    /// CPU seconds per poll interval of the shim's rows, over [`IDLE_WINDOW`].
    pub cpu_seconds_per_interval: f64,
}

/// The CAPI core binary: `CAPC_BENCH_CAPI_CORE` or `make e2e-build`'s.
pub fn binary() -> PathBuf {
    std::env::var("CAPC_BENCH_CAPI_CORE")
        .unwrap_or_else(|_| "target/e2e/bin/capi-core-v1.13".into())
        .into()
}

/// Child process killed (and reaped) when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub async fn measure(n: usize, interval_secs: u64) -> Result<AnchorRow> {
    let core = binary();
    if !core.is_file() {
        bail!(
            "{} missing: `make e2e-build` builds CAPI v1.13 core",
            core.display()
        );
    }
    let api = ApiServer::start_profile("target/apiserver-anchor", "capi-1.13").await?;
    let kube = Kube::connect(&api.kubeconfig).await?;
    // The Machines point at VMs nobody asks for here: CAPI core never calls CloudStack.
    let ids: Vec<String> = (0..n).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    kube.populate(
        "https://127.0.0.1:9/client/api",
        &ids,
        FleetKind::Steady,
        false,
        &Vec::new(),
    )
    .await?;
    std::fs::create_dir_all(report::DIR)?;
    let ready_file = api.dir.join("capi-core-ready");
    let _ = std::fs::remove_file(&ready_file);
    let log_path = Path::new(report::DIR).join(format!("controller-capi-core-{n}.log"));
    let log = std::fs::File::create(&log_path).context("capi-core log")?;
    let t0 = Instant::now();
    let mut child = Child(
        std::process::Command::new(&core)
            .arg("--kubeconfig")
            .arg(&api.kubeconfig)
            .arg("--ready-file")
            .arg(&ready_file)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", core.display()))?,
    );
    let pid = child.0.id();
    let running = |child: &mut Child| -> Result<()> {
        match child.0.try_wait()? {
            Some(status) => bail!(
                "capi-core exited with {status} (log {})",
                log_path.display()
            ),
            None => Ok(()),
        }
    };
    while !ready_file.exists() {
        running(&mut child)?;
        if t0.elapsed() > READY_LIMIT {
            bail!(
                "capi-core not ready after {READY_LIMIT:?} (log {})",
                log_path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let ready_seconds = t0.elapsed().as_secs_f64();
    let capi_version = std::fs::read_to_string(&ready_file)?.trim().to_string();
    eprintln!("  anchor: CAPI core {capi_version} ready after {ready_seconds:.1} s");
    let machines: Api<DynamicObject> =
        Api::namespaced_with(kube.client.clone(), NAMESPACE, &kube.resources.machine);
    let (reconciled_seconds, reconciled) = loop {
        running(&mut child)?;
        let done = count_reconciled(&machines).await?;
        if done >= n {
            break (t0.elapsed().as_secs_f64(), done);
        }
        if t0.elapsed() > RECONCILE_LIMIT {
            eprintln!("  anchor: only {done} of {n} Machines reconciled after {RECONCILE_LIMIT:?}");
            break (f64::NAN, done);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    eprintln!("  anchor: {reconciled} Machines reconciled after {reconciled_seconds:.1} s");
    let cpu0 = procs::cpu_seconds(pid);
    tokio::time::sleep(IDLE_WINDOW).await;
    running(&mut child)?;
    let cpu1 = procs::cpu_seconds(pid);
    let row = AnchorRow {
        machines: n,
        capi_version,
        ready_seconds,
        reconciled_seconds,
        reconciled,
        rss_peak_mib: procs::status_mib(pid, "VmHWM").unwrap_or(f64::NAN),
        rss_steady_mib: procs::status_mib(pid, "VmRSS").unwrap_or(f64::NAN),
        cpu_seconds_per_interval: match (cpu0, cpu1) {
            (Some(a), Some(b)) => (b - a) / (IDLE_WINDOW.as_secs_f64() / interval_secs as f64),
            _ => f64::NAN,
        },
    };
    drop(child);
    drop(kube);
    drop(api);
    Ok(row)
}

/// CAPI's Machine controller adds this finalizer on its first reconcile of a Machine, before
/// it looks for the owner (the fleet's MachineSets do not exist, so it goes no further and
/// retries with its backoff, as for any Machine whose owner is missing).
const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";

/// Machines CAPI's Machine controller has reconciled (its finalizer is on them), listed in
/// pages.
async fn count_reconciled(machines: &Api<DynamicObject>) -> Result<usize> {
    let mut done = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = machines.list(&params).await?;
        done += page
            .items
            .iter()
            .filter(|m| {
                m.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| f.iter().any(|f| f == MACHINE_FINALIZER))
            })
            .count();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => return Ok(done),
        }
    }
}
