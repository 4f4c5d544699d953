//! `make bench`, part three (issue 7 part 4): what the controller costs against a REAL
//! kube-apiserver, and `make soak` (issue 6 "Load"): an hour of simulated time at 10 000
//! Machines behind a slow API server and a throttling CloudStack.
//!
//! Cost (default, `CAPC_BENCH_CONTROLLER_PART=cost`): two fleets (issue 28). **Steady**: every
//! Machine has its Node (`status.nodeRef`), the common case, at 1 000, 5 000, 10 000 and 30 000
//! Machines (`CAPC_BENCH_CONTROLLER_SIZES=1000,5000` to change); **provisioning**: no Machine has
//! a Node, so every VM also takes the statistics path, the worst case, at 10 000
//! (`CAPC_BENCH_PROVISIONING_SIZES`). report.json keeps the old keys for the steady fleet and
//! ends the provisioning fleet's in `_provisioning`. Each run: a fresh etcd +
//! kube-apiserver (`target/hack/apiserver-run`, CAPI 1.9 CRDs, in `target/apiserver-bench`)
//! holding the Machines + CloudStackMachines (+ Clusters, failure domains, MHCs, the endpoint
//! Secret), an in-process `cloudstack-sim` holding the VMs, and the release
//! `capc-health-shim run` as a child process. Measured: settle time after a cold start (every
//! Machine has the condition, seen by the bench's own watch), then over steady cycles CPU
//! seconds per poll cycle (`/proc/<pid>/stat`, cycles from the shim's
//! `capc_health_poll_duration_seconds_count`), API server writes per cycle (the API server's
//! own `apiserver_request_total`, write verbs, Lease writes excluded — the shim runs without
//! leader election, so those are the API server's), peak RSS (`VmHWM`) and `/status` latency
//! over 50 GETs. → `target/bench/controller.json`, merged into `report.json` and section 4 of
//! `report.md`. The steady fleet is also measured spread over [`SCOPED`] scopes (one CloudStack
//! project per cluster, `CAPC_BENCH_SCOPED_SIZES`, keys ending in `_10_scopes`); the
//! controller's CloudStack calls per cycle in 1 and 10 scopes at 1 000 and 10 000 Machines,
//! beside CAPC's steady calls (`target/e2e/cloudstack-load.json`), make section 1b
//! (`users_load.rs`).
//!
//! `CAPC_BENCH_CONTROLLER_PART=users-load`: section 1b alone, again, from the calls per cycle
//! merged into `target/bench/report.json` and the current load file (seconds; nothing measured).
//!
//! Soak (`CAPC_BENCH_CONTROLLER_PART=soak`, `make soak`): 10 000 Machines; the shim reaches the
//! API server through a latency-injecting TCP proxy (`proxy.rs`), cloudstack-sim throttles
//! (429) and answers late; [`SOAK_CYCLES`] cycles at a 3 s interval stand for an hour at 30 s
//! (graces and the mass-failure window scaled by the same 10×). Faults are injected through
//! the sim's admin API in batches ([`SOAK_FAULTS`]); at the end exactly those Machines must be
//! `False` and no other may ever have been. RSS is sampled every [`RSS_EVERY`] cycles. → `target/bench/soak.json`, merged
//! into `report.json` and section 6 of `report.md`; exits 1 if a verdict was wrong or missed.
//!
//! Every child process (API server runner, etcd, kube-apiserver, the shim) is stopped when its
//! guard drops, also on error. Measurements, not tests.

mod anchor;
mod fleet;
mod phases;
mod procs;
mod proxy;
mod report;
mod users_load;

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use fleet::{machine_name, FleetKind, Kube, NAMESPACE};
use procs::{ApiServer, Shim};

/// Sizes of the steady fleet (`CAPC_BENCH_CONTROLLER_SIZES`) and of the provisioning fleet
/// (`CAPC_BENCH_PROVISIONING_SIZES`); an empty variable measures none of that fleet.
const DEFAULT_SIZES: [usize; 4] = [1_000, 5_000, 10_000, 30_000];
const PROVISIONING_SIZES: [usize; 1] = [10_000];
/// The steady fleet spread over this many scopes (one project each), at these sizes
/// (`CAPC_BENCH_SCOPED_SIZES`): section 1b's controller in 10 scopes.
const SCOPED: usize = 10;
const SCOPED_SIZES: [usize; 2] = [1_000, 10_000];
/// Poll interval of the cost part (and the simulator's stats interval).
const COST_POLL_SECS: u64 = 5;
/// Cycles after settling before the steady window, and the window.
const MAX_WARM_CYCLES: f64 = 12.0;
const STEADY_CYCLES: f64 = 6.0;
const STATUS_GETS: usize = 50;

const SOAK_MACHINES: usize = 10_000;
/// 120 cycles at 3 s = an hour at the default 30 s.
const SOAK_CYCLES: f64 = 120.0;
const SOAK_POLL_SECS: u64 = 3;
const RSS_EVERY: f64 = 5.0;
/// cloudstack-sim's answer delay and throttle (requests per second per account) in the soak;
/// the shim's own rate limit is off there, so its 20 listing pages per 3 s poll meet 429s.
const SIM_LATENCY_MS: u64 = 20;
const SIM_THROTTLE_PER_S: u64 = 10;
/// (soak cycle, machine index, fault): three batches of at most two, 30 cycles (15 simulated
/// min) apart, so the mass-failure guard (5 in its window, scaled to 60 s = 10 simulated min)
/// must not hold them: 5 at once in one scope is a mass failure by design (a first run did
/// that and all 5 were held as `RemediationHeld`).
const SOAK_FAULTS: [(f64, usize, &str); 5] = [
    (30.0, 137, "stop"),
    (30.0, 2_024, "error"),
    (60.0, 4_242, "stop"),
    (60.0, 8_888, "stop"),
    (90.0, 9_999, "error"),
];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `HEAD` and whether `src/` differs from it: the bench builds the working tree.
fn source_state() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let head = git(&["rev-parse", "--short", "HEAD"]);
    let dirty = git(&["status", "--porcelain", "--", "src"]);
    if dirty.is_empty() {
        format!("shim built from `{head}` (src/ clean)")
    } else {
        format!(
            "shim built from the working tree at `{head}` with uncommitted src/ changes: {}",
            dirty
                .lines()
                .map(|l| l.trim())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(60))
        .build()
        .expect("http client")
}

/// Everything one run needs: API server, simulator, objects, the bench's watch.
struct Setup {
    kube: Kube,
    sim_server: cloudstack_sim::SimServer,
    ids: Vec<String>,
    verdicts: std::sync::Arc<std::sync::Mutex<fleet::Verdicts>>,
    watch: tokio::task::JoinHandle<()>,
    setup_seconds: f64,
    // declared last: dropped after everything that talks to it
    api: ApiServer,
}

async fn setup(
    n: usize,
    dir: &str,
    stats_interval: u64,
    account_type: &str,
    kind: FleetKind,
    scopes: usize,
) -> Result<Setup> {
    let t = Instant::now();
    let api = ApiServer::start(dir).await?;
    let kube = Kube::connect(&api.kubeconfig).await?;
    let (_sim, sim_server, ids, projects) =
        fleet::simulator(n, stats_interval, account_type, scopes).await?;
    kube.populate(&sim_server.api_url(), &ids, kind, true, &projects)
        .await?;
    let (verdicts, watch) = fleet::watch_verdicts(&kube);
    Ok(Setup {
        kube,
        sim_server,
        ids,
        verdicts,
        watch,
        setup_seconds: t.elapsed().as_secs_f64(),
        api,
    })
}

impl Setup {
    async fn stop(self) {
        self.watch.abort();
        self.sim_server.shutdown().await;
        drop(self.kube);
        drop(self.api);
    }
}

/// Waits until every one of `n` Machines has the condition; seconds since `t0`.
async fn settle(s: &Setup, shim: &mut Shim, n: usize, t0: Instant, limit: Duration) -> Result<f64> {
    let mut last_print = Instant::now();
    loop {
        let have = s.verdicts.lock().unwrap().with_condition();
        if have >= n {
            return Ok(t0.elapsed().as_secs_f64());
        }
        shim.check_running()?;
        if t0.elapsed() > limit {
            bail!("only {have} of {n} Machines have the condition after {limit:?}");
        }
        if last_print.elapsed() > Duration::from_secs(15) {
            eprintln!(
                "  settling: {have}/{n} after {:.0} s",
                t0.elapsed().as_secs_f64()
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the shim has completed `target` cycles; returns the count.
async fn wait_cycles(
    http: &reqwest::Client,
    shim: &mut Shim,
    target: f64,
    limit: Duration,
) -> Result<f64> {
    let t = Instant::now();
    loop {
        if let Some(m) = procs::shim_metrics(http, &shim.addr).await {
            let c = procs::cycles(&m);
            if c >= target {
                return Ok(c);
            }
        }
        shim.check_running()?;
        if t.elapsed() > limit {
            bail!("the shim did not reach {target} cycles within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[derive(Debug, Clone, Default)]
struct CostRow {
    machines: usize,
    fleet: FleetKind,
    /// CloudStack scopes the Machines are spread over (one project each beyond one).
    scopes: usize,
    /// "this" (the build under test), "no-orphans" / "no-remnants" (the same build with
    /// `--no-orphan-report` / `--no-remnant-report`) or "baseline" (`CAPC_BENCH_BASELINE_SHIM`).
    build: &'static str,
    setup_seconds: f64,
    settle_seconds: f64,
    /// Until every Machine is True/VMHealthy.
    healthy_seconds: f64,
    /// Until the first cycle without writes (NaN: none within MAX_WARM_CYCLES).
    quiet_seconds: f64,
    /// Condition updates the bench's watch saw during the steady window.
    condition_changes_steady: f64,
    trace: Vec<String>,
    cpu_seconds_to_settle: f64,
    writes_cold_start: f64,
    cpu_seconds_per_cycle: f64,
    apiserver_cpu_seconds_per_cycle: f64,
    writes_per_cycle: f64,
    steady_writes: BTreeMap<String, f64>,
    steady_cycles: f64,
    poll_seconds_mean: f64,
    calls_per_cycle: f64,
    calls_by_command: String,
    rss_peak_mib: f64,
    rss_steady_mib: f64,
    status_p50_ms: f64,
    status_p99_ms: f64,
    /// `/status?cluster=<one of the 10>`: a tenth of the Machines.
    status_cluster_p50_ms: f64,
    status_cluster_p99_ms: f64,
    status_kib: f64,
    verdicts: String,
    load: String,
}

async fn measure_cost(
    n: usize,
    fleet: FleetKind,
    scopes: usize,
    build: &'static str,
    shim_binary: &Path,
    extra: &[&str],
) -> Result<CostRow> {
    let http = http();
    let load_start = loadavg();
    let s = setup(
        n,
        "target/apiserver-bench",
        COST_POLL_SECS,
        "Admin",
        fleet,
        scopes,
    )
    .await?;
    eprintln!(
        "  {n}: set-up (API server + {n} Machines + CloudStackMachines) {:.1} s",
        s.setup_seconds
    );
    let writes0 = procs::apiserver_writes(&http, &s.api).await?;
    let args: Vec<String> = [
        "--namespace",
        NAMESPACE,
        "--no-leader-election",
        "--poll-interval",
        &format!("{COST_POLL_SECS}s"),
        "--stats-interval",
        &format!("{COST_POLL_SECS}s"),
    ]
    .iter()
    .chain(extra)
    .map(|a| a.to_string())
    .collect();
    let log = Path::new(report::DIR).join(format!(
        "controller-shim-{n}-{}{}-{build}.log",
        fleet.name(),
        scopes_suffix(scopes)
    ));
    std::fs::create_dir_all(report::DIR)?;
    let t0 = Instant::now();
    let mut shim = Shim::spawn(shim_binary, &s.api.kubeconfig, &args, &log)?;
    let pid = shim.pid();
    let settle_seconds = settle(&s, &mut shim, n, t0, Duration::from_secs(900)).await?;
    let cpu_settle = procs::cpu_seconds(pid).context("shim cpu")?;
    let writes_settle = procs::apiserver_writes(&http, &s.api).await?;
    let writes_cold_start = procs::non_lease_writes(&procs::delta(&writes0, &writes_settle));
    let m = procs::shim_metrics(&http, &shim.addr)
        .await
        .context("shim metrics")?;
    let c_settle = procs::cycles(&m);
    eprintln!("  {n}: settled in {settle_seconds:.1} s ({c_settle} cycles, {cpu_settle:.2} CPU s, {writes_cold_start} writes)");

    // A poll at 10 000 Machines takes ~25 s at the default 5 requests/s.
    let limit = Duration::from_secs(900);
    // Final: every Machine True/VMHealthy (the evidence needs a few stats samples), or
    // True/VMRunning in the steady fleet (the Machines have their Nodes).
    let healthy = fleet.healthy_reason();
    let healthy_seconds = loop {
        if s.verdicts.lock().unwrap().with_reason(healthy) >= n {
            break t0.elapsed().as_secs_f64();
        }
        shim.check_running()?;
        if t0.elapsed() > Duration::from_secs(900) {
            bail!("not every Machine is {healthy} after 900 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let c_healthy = wait_cycles(&http, &mut shim, 0.0, limit).await?;
    let c_settle = c_healthy.max(c_settle);
    let writes_settle = procs::apiserver_writes(&http, &s.api).await?;
    let writes_cold_start = procs::non_lease_writes(&procs::delta(&writes0, &writes_settle));
    eprintln!("  {n}: all {healthy} after {healthy_seconds:.1} s (cycle {c_healthy})");
    // Quiet: until one whole cycle passes without a write (verdicts final), at most
    // MAX_WARM_CYCLES; then the steady window.
    let (mut c0, mut w0) = (c_settle, writes_settle.clone());
    let mut warm = 0.0;
    let quiet_seconds = loop {
        let c = wait_cycles(&http, &mut shim, c0 + 1.0, limit).await?;
        let w = procs::apiserver_writes(&http, &s.api).await?;
        let d = procs::non_lease_writes(&procs::delta(&w0, &w));
        warm += c - c0;
        (c0, w0) = (c, w);
        if d == 0.0 {
            break t0.elapsed().as_secs_f64();
        }
        if warm >= MAX_WARM_CYCLES {
            break f64::NAN;
        }
    };
    eprintln!("  {n}: quiet after {warm} more cycles ({quiet_seconds:.1} s)");
    let m0 = procs::shim_metrics(&http, &shim.addr)
        .await
        .context("shim metrics")?;
    let (cpu0, api0) = (
        procs::cpu_seconds(pid),
        s.api.apiserver_pid().and_then(procs::cpu_seconds),
    );
    let changes0 = s.verdicts.lock().unwrap().changes;
    let reads0 = procs::apiserver_reads(&http, &s.api).await?;
    let c1 = wait_cycles(&http, &mut shim, c0 + STEADY_CYCLES, limit).await?;
    let (cpu1, api1) = (
        procs::cpu_seconds(pid),
        s.api.apiserver_pid().and_then(procs::cpu_seconds),
    );
    let w1 = procs::apiserver_writes(&http, &s.api).await?;
    // Everyone's reads (the shim's, the bench's own watch), to tell a relisting watcher from
    // an API server that is merely busy.
    let reads = procs::delta(&reads0, &procs::apiserver_reads(&http, &s.api).await?);
    eprintln!(
        "  {n}: API server reads in the steady window: {}",
        reads
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let m1 = procs::shim_metrics(&http, &shim.addr)
        .await
        .context("shim metrics")?;
    let cycles = c1 - c0;
    let changes = s.verdicts.lock().unwrap().changes - changes0;
    let steady_writes = procs::delta(&w0, &w1);
    let poll_sum =
        |m: &str| procs::sum_metric(m, "capc_health_poll_duration_seconds_sum", |_| true);
    // Calls per cycle over whole cycles (one cycle polls every scope); the poll time per scope
    // poll.
    let poll_count = procs::scope_polls(&m1) - procs::scope_polls(&m0);
    let cycle_count = procs::cycles(&m1) - procs::cycles(&m0);
    let calls = |m: &str| procs::sum_metric(m, "capc_health_cloudstack_calls_total", |_| true);
    let calls_per_cycle = (calls(&m1) - calls(&m0)) / cycle_count.max(1.0);
    let calls_by_command: String =
        procs::delta(&procs::calls_by_command(&m0), &procs::calls_by_command(&m1))
            .iter()
            .map(|(c, n)| format!("{c} {:.1}", n / cycle_count.max(1.0)))
            .collect::<Vec<_>>()
            .join(", ");

    let mut lat = Vec::new();
    let mut bytes = 0usize;
    for _ in 0..STATUS_GETS {
        let t = Instant::now();
        let body = http
            .get(format!("http://{}/status", shim.addr))
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        bytes = body.len();
    }
    lat.sort_by(f64::total_cmp);
    // One cluster's view (`?cluster=`), as a person asks for it.
    let mut cluster_lat = Vec::new();
    for _ in 0..STATUS_GETS {
        let t = Instant::now();
        http.get(format!(
            "http://{}/status?cluster={NAMESPACE}/c0",
            shim.addr
        ))
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
        cluster_lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    cluster_lat.sort_by(f64::total_cmp);
    let (verdicts, trace) = {
        let v = s.verdicts.lock().unwrap();
        let trace: Vec<String> = v
            .trace
            .iter()
            .map(|(t, st, r, m)| {
                format!(
                    "{:.1} s {st}/{r} \"{m}\"",
                    t.saturating_duration_since(t0).as_secs_f64()
                )
            })
            .collect();
        (v.census(), trace)
    };
    let row = CostRow {
        build,
        machines: n,
        fleet,
        scopes,
        setup_seconds: s.setup_seconds,
        settle_seconds,
        healthy_seconds,
        quiet_seconds,
        condition_changes_steady: changes as f64,
        trace,
        cpu_seconds_to_settle: cpu_settle,
        writes_cold_start,
        cpu_seconds_per_cycle: (cpu1.unwrap_or(0.0) - cpu0.unwrap_or(0.0)) / cycles,
        apiserver_cpu_seconds_per_cycle: match (api0, api1) {
            (Some(a), Some(b)) => (b - a) / cycles,
            _ => f64::NAN,
        },
        writes_per_cycle: procs::non_lease_writes(&steady_writes) / cycles,
        steady_writes,
        steady_cycles: cycles,
        calls_per_cycle,
        calls_by_command,
        poll_seconds_mean: (poll_sum(&m1) - poll_sum(&m0)) / poll_count.max(1.0),
        rss_peak_mib: procs::status_mib(pid, "VmHWM").unwrap_or(f64::NAN),
        rss_steady_mib: procs::status_mib(pid, "VmRSS").unwrap_or(f64::NAN),
        status_p50_ms: percentile(&lat, 0.5),
        status_p99_ms: percentile(&lat, 0.99),
        status_cluster_p50_ms: percentile(&cluster_lat, 0.5),
        status_cluster_p99_ms: percentile(&cluster_lat, 0.99),
        status_kib: bytes as f64 / 1024.0,
        verdicts,
        load: format!("{load_start} → {}", loadavg()),
    };
    drop(shim);
    s.stop().await;
    Ok(row)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// The steady fleet keeps the keys of the reports from before fleets existed; the
/// provisioning fleet's end in `_provisioning`.
fn key_suffix(fleet: FleetKind) -> &'static str {
    match fleet {
        FleetKind::Steady => "",
        FleetKind::Provisioning => "_provisioning",
    }
}

/// One scope keeps the keys of the reports from before scopes; more end in `_<S>_scopes`.
fn scopes_suffix(scopes: usize) -> String {
    if scopes > 1 {
        format!("_{scopes}_scopes")
    } else {
        String::new()
    }
}

/// The CAPI core rows beside this build's steady rows of the same size.
fn anchor_report(
    rows: &[CostRow],
    anchors: &[anchor::AnchorRow],
    v: &mut BTreeMap<String, f64>,
    md: &mut String,
) {
    if anchors.is_empty() {
        return;
    }
    md.push_str(
        "\nThe anchor: CAPI core (the e2e's process B, `tests/e2e/capi-core`: Cluster, Machine, \
         MachineSet, MachineDeployment, MHC, KCP and CABPK controllers with their webhooks) holding \
         the same steady fleet in a fresh API server with the CAPI v1.13 CRDs, measured alone after \
         the rows above; RSS once every Machine carries CAPI's finalizer (its Machine controller \
         reconciled each) plus a 60 s idle window; CPU over that window per poll interval. The \
         fleet's owner MachineSets do not exist and CAPI never reaches the workload clusters (no \
         kubeconfig Secrets), so it retries those Machines with its backoff.\n\n\
         | Machines | process | peak RSS MiB | RSS MiB steady | CPU s per 5 s idle | ready s | all reconciled s | shim peak RSS ÷ CAPI core's |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for a in anchors {
        let shim = rows.iter().find(|r| {
            r.build == "this"
                && r.fleet == FleetKind::Steady
                && r.scopes == 1
                && r.machines == a.machines
        });
        let ratio_rss = shim.map_or(f64::NAN, |r| ratio(r.rss_peak_mib, a.rss_peak_mib));
        if let Some(r) = shim {
            let _ = writeln!(
                md,
                "| {} | capc-health-shim (this) | {:.1} | {:.1} | {:.3} | | {:.1} (settle) | |",
                r.machines,
                r.rss_peak_mib,
                r.rss_steady_mib,
                r.cpu_seconds_per_cycle,
                r.settle_seconds
            );
        }
        let _ = writeln!(
            md,
            "| {} | CAPI core {} | {:.1} | {:.1} | {:.3} | {:.1} | {:.1} ({} Machines) | {ratio_rss:.2} |",
            a.machines,
            a.capi_version,
            a.rss_peak_mib,
            a.rss_steady_mib,
            a.cpu_seconds_per_interval,
            a.ready_seconds,
            a.reconciled_seconds,
            a.reconciled
        );
        let k = |name: &str| format!("capi_core_{name}_{}_machines", a.machines);
        v.insert(k("rss_mib"), a.rss_peak_mib);
        v.insert(k("rss_mib_steady"), a.rss_steady_mib);
        v.insert(k("cpu_seconds_per_cycle_idle"), a.cpu_seconds_per_interval);
        v.insert(k("reconciled_seconds"), a.reconciled_seconds);
        v.insert(
            format!("shim_rss_over_capi_core_{}_machines", a.machines),
            ratio_rss,
        );
    }
}

fn cost_report(rows: &[CostRow], wall: f64, source: &str) -> (BTreeMap<String, f64>, String) {
    let mut v = BTreeMap::new();
    let mut md = format!(
        "## 4. Controller cost (real kube-apiserver)\n\n\
         `capc-health-shim run` (release build, a child process) against a real etcd + kube-apiserver \
         v1.34 (CAPI 1.9 CRDs, fresh per size) holding N Machines + CloudStackMachines over {} clusters \
         (one failure domain and MHC each, one endpoint Secret: one CloudStack scope; in the rows of \
         {SCOPED} scopes each cluster's failure domain names a project of its own) and an in-process \
         cloudstack-sim with N healthy Running VMs. Poll interval {COST_POLL_SECS} s, default rate limit \
         (5 requests/s: 2–20 pages of 500 per cycle). Settle: from process start (cold: initial LIST + \
         WATCH, first poll, a condition write per Machine) until the bench's own watch sees the \
         condition on every Machine; all VMHealthy: until every condition is True/VMHealthy (the verdict \
         needs 4 stats samples of rising traffic: VMRunning before); quiet: then until the first whole \
         cycle without a write (\
         at most {MAX_WARM_CYCLES} cycles), then a steady window of {STEADY_CYCLES} \
         cycles: CPU = utime+stime of the shim process ÷ cycles (cycles = \
         `capc_health_cycle_duration_seconds_count`; CloudStack calls ÷ the same cycles, poll s per \
         scope poll); writes = the API server's own \
         `apiserver_request_total` for POST/PUT/PATCH/APPLY/DELETE, Lease writes excluded (the shim runs \
         without leader election here; those are the API server's own leases); peak RSS = `VmHWM`; \
         `/status` = {STATUS_GETS} sequential GETs of the full document. Wall clock, 2 shared cores: the \
         load average (1/5/15 min, start → end) is in the last column. {source}.\n\n\
         | Machines | fleet | scopes | build | CPU s/cycle | peak RSS MiB | RSS MiB steady | settle s | all VMHealthy s | quiet s | CPU s to settle | writes until all VMHealthy | writes/cycle steady | /status p50 ms | /status p99 ms | /status KiB | CloudStack calls/cycle | poll s (mean) | kube-apiserver CPU s/cycle | set-up s | verdicts | load avg |\n\
         |---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n",
        fleet::CLUSTERS
    );
    for r in rows {
        let prefix = match r.build {
            "this" => String::new(),
            other => format!("{}_", other.replace('-', "_")),
        };
        let suffix = format!("{}{}", key_suffix(r.fleet), scopes_suffix(r.scopes));
        let k = |name: &str| format!("{prefix}{name}_{}_machines{suffix}", r.machines);
        v.insert(k("cpu_seconds_per_cycle"), r.cpu_seconds_per_cycle);
        v.insert(k("rss_mib"), r.rss_peak_mib);
        v.insert(k("rss_mib_steady"), r.rss_steady_mib);
        v.insert(k("settle_seconds"), r.settle_seconds);
        v.insert(k("settle_quiet_seconds"), r.quiet_seconds);
        v.insert(k("settle_healthy_seconds"), r.healthy_seconds);
        v.insert(k("condition_changes_steady"), r.condition_changes_steady);
        v.insert(k("cpu_seconds_to_settle"), r.cpu_seconds_to_settle);
        v.insert(k("apiserver_writes_cold_start"), r.writes_cold_start);
        v.insert(k("apiserver_writes_per_cycle_steady"), r.writes_per_cycle);
        v.insert(k("status_latency_p50_ms"), r.status_p50_ms);
        v.insert(k("status_latency_p99_ms"), r.status_p99_ms);
        v.insert(
            k("status_one_cluster_latency_p50_ms"),
            r.status_cluster_p50_ms,
        );
        v.insert(
            k("status_one_cluster_latency_p99_ms"),
            r.status_cluster_p99_ms,
        );
        v.insert(k("status_kib"), r.status_kib);
        v.insert(k("poll_seconds_mean"), r.poll_seconds_mean);
        v.insert(k("cloudstack_calls_per_cycle"), r.calls_per_cycle);
        v.insert(
            k("apiserver_cpu_seconds_per_cycle"),
            r.apiserver_cpu_seconds_per_cycle,
        );
        v.insert(k("setup_seconds"), r.setup_seconds);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.3} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.0} | {:.2} | {:.1} | {:.1} | {:.0} | {:.1} | {:.2} | {:.3} | {:.0} | {} | {} |",
            r.machines,
            r.fleet.name(),
            r.scopes,
            r.build,
            r.cpu_seconds_per_cycle,
            r.rss_peak_mib,
            r.rss_steady_mib,
            r.settle_seconds,
            r.healthy_seconds,
            r.quiet_seconds,
            r.cpu_seconds_to_settle,
            r.writes_cold_start,
            r.writes_per_cycle,
            r.status_p50_ms,
            r.status_p99_ms,
            r.status_kib,
            r.calls_per_cycle,
            r.poll_seconds_mean,
            r.apiserver_cpu_seconds_per_cycle,
            r.setup_seconds,
            r.verdicts,
            r.load
        );
    }
    let baselines: Vec<(&CostRow, &CostRow)> = rows
        .iter()
        .filter(|r| r.build == "this" && r.scopes == 1)
        .filter_map(|r| {
            let b = rows.iter().find(|b| {
                b.build == "baseline" && b.machines == r.machines && b.fleet == r.fleet
            })?;
            Some((r, b))
        })
        .collect();
    if !baselines.is_empty() {
        md.push_str(
            "\nThis build against the baseline binary, same run (this ÷ baseline; < 1 is better):\n\n\
             | Machines | fleet | CPU s/cycle | peak RSS | steady RSS | settle | writes until all healthy |\n\
             |---:|---|---:|---:|---:|---:|---:|\n",
        );
        for (r, b) in baselines {
            let key = |name: &str| {
                format!(
                    "{name}_ratio_this_vs_baseline_{}_machines{}",
                    r.machines,
                    key_suffix(r.fleet)
                )
            };
            let cpu = ratio(r.cpu_seconds_per_cycle, b.cpu_seconds_per_cycle);
            let rss = ratio(r.rss_peak_mib, b.rss_peak_mib);
            let steady = ratio(r.rss_steady_mib, b.rss_steady_mib);
            let settle = ratio(r.settle_seconds, b.settle_seconds);
            let writes = ratio(r.writes_cold_start, b.writes_cold_start);
            v.insert(key("cpu_seconds_per_cycle"), cpu);
            v.insert(key("rss_mib"), rss);
            v.insert(key("rss_mib_steady"), steady);
            v.insert(key("settle_seconds"), settle);
            v.insert(key("apiserver_writes_cold_start"), writes);
            let _ = writeln!(
                md,
                "| {} | {} | {cpu:.2} | {rss:.2} | {steady:.2} | {settle:.2} | {writes:.2} |",
                r.machines,
                r.fleet.name()
            );
        }
    }
    for (without, what, flag, key_word) in [
        (
            "no-orphans",
            "orphan report",
            "--no-orphan-report",
            "orphans",
        ),
        (
            "no-remnants",
            "remnant report",
            "--no-remnant-report",
            "remnants",
        ),
    ] {
        with_and_without(rows, without, what, flag, key_word, &mut md, &mut v);
    }
    for fleet in [FleetKind::Steady, FleetKind::Provisioning] {
        let this = |r: &&CostRow| r.build == "this" && r.fleet == fleet && r.scopes == 1;
        let Some(base) = rows.iter().filter(this).find(|r| r.machines == 1_000) else {
            continue;
        };
        let _ = write!(
            md,
            "\nGrowth against 1 000 Machines, {} fleet (linear = the Machine ratio; flat cost per \
             Machine = the same CPU per 1 000 Machines and the same RSS per Machine above the \
             1 000 row):\n\n\
             | Machines | ÷ 1 000 | CPU s/cycle | peak RSS | settle | /status p50 | /status p99 | CPU ms/cycle per 1 000 Machines | peak RSS KiB per Machine above 1 000 |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            fleet.name()
        );
        let per_thousand = |r: &CostRow| r.cpu_seconds_per_cycle * 1e6 / r.machines as f64;
        let _ = writeln!(
            md,
            "| 1000 | 1 | 1 | 1 | 1 | 1 | 1 | {:.1} | – |",
            per_thousand(base)
        );
        for r in rows.iter().filter(this).filter(|r| r.machines != 1_000) {
            let key = |name: &str| {
                format!(
                    "{name}_ratio_{}_vs_1000_machines{}",
                    r.machines,
                    key_suffix(fleet)
                )
            };
            let cpu = ratio(r.cpu_seconds_per_cycle, base.cpu_seconds_per_cycle);
            let rss = ratio(r.rss_peak_mib, base.rss_peak_mib);
            let settle = ratio(r.settle_seconds, base.settle_seconds);
            let p50 = ratio(r.status_p50_ms, base.status_p50_ms);
            let p99 = ratio(r.status_p99_ms, base.status_p99_ms);
            let cpu_per_k = per_thousand(r);
            let rss_per_machine = (r.rss_peak_mib - base.rss_peak_mib) * 1024.0
                / (r.machines as f64 - base.machines as f64);
            v.insert(key("cpu_seconds_per_cycle"), cpu);
            v.insert(key("rss_mib"), rss);
            v.insert(key("settle_seconds"), settle);
            v.insert(key("status_latency_p50_ms"), p50);
            v.insert(key("status_latency_p99_ms"), p99);
            v.insert(
                format!(
                    "cpu_ms_per_cycle_per_1000_machines_{}_machines{}",
                    r.machines,
                    key_suffix(fleet)
                ),
                cpu_per_k,
            );
            v.insert(
                format!(
                    "rss_kib_per_machine_above_1000_{}_machines{}",
                    r.machines,
                    key_suffix(fleet)
                ),
                rss_per_machine,
            );
            let _ = writeln!(
                md,
                "| {} | {:.0} | {cpu:.2} | {rss:.2} | {settle:.2} | {p50:.2} | {p99:.2} | {cpu_per_k:.1} | {rss_per_machine:.2} |",
                r.machines,
                r.machines as f64 / 1000.0
            );
        }
    }
    md.push_str("\nSteady-state writes by resource and verb (whole window):\n\n");
    for r in rows {
        let w: Vec<String> = r
            .steady_writes
            .iter()
            .map(|(k, n)| format!("{k} {n:.0}"))
            .collect();
        let _ = writeln!(
            md,
            "- {} Machines ({}, {} fleet, {} scope(s)), {:.0} cycles: {}; condition changes seen by the watch: {:.0}; CloudStack calls per cycle: {}",
            r.machines,
            r.build,
            r.fleet.name(),
            r.scopes,
            r.steady_cycles,
            if w.is_empty() {
                "none".to_string()
            } else {
                w.join(", ")
            },
            r.condition_changes_steady,
            r.calls_by_command
        );
    }
    md.push_str("\nThe condition of `m-00000` as the watch saw it change (seconds after the shim started):\n\n");
    for r in rows {
        let _ = writeln!(
            md,
            "- {} Machines ({}, {} fleet): {}",
            r.machines,
            r.build,
            r.fleet.name(),
            r.trace.join("; ")
        );
    }
    v.insert("bench_controller_wall_seconds".into(), wall);
    (v, md)
}

async fn run_cost() -> Result<()> {
    let started = Instant::now();
    let source = source_state();
    let sizes_from = |var: &str, default: &[usize]| -> Vec<usize> {
        std::env::var(var)
            .ok()
            .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_else(|| default.to_vec())
    };
    // The steady fleet (every Machine has its Node) at every size, up to 30 000 to show the
    // cost per Machine flat; the provisioning fleet (no Node: the statistics path) at 10 000.
    let steady_sizes = sizes_from("CAPC_BENCH_CONTROLLER_SIZES", &DEFAULT_SIZES);
    let provisioning_sizes = sizes_from("CAPC_BENCH_PROVISIONING_SIZES", &PROVISIONING_SIZES);
    // Before/after in one run: each size is measured with this build and then, when
    // `CAPC_BENCH_BASELINE_SHIM` names an older `capc-health-shim` binary, with that one.
    let this: std::path::PathBuf = env!("CARGO_BIN_EXE_capc-health-shim").into();
    let mut builds: Vec<(&'static str, std::path::PathBuf, &[&str])> =
        vec![("this", this.clone(), &[])];
    // The orphan report's cost: the same build without it, at the sizes named (10 000).
    builds.push(("no-orphans", this.clone(), &["--no-orphan-report"]));
    let orphan_sizes = sizes_from("CAPC_BENCH_ORPHAN_SIZES", &[10_000]);
    // The remnant report's likewise (`CAPC_BENCH_REMNANT_SIZES`).
    builds.push(("no-remnants", this, &["--no-remnant-report"]));
    let remnant_sizes = sizes_from("CAPC_BENCH_REMNANT_SIZES", &[10_000]);
    // The baseline at every size, or at those named (`CAPC_BENCH_BASELINE_SIZES`).
    let every_size: Vec<usize> = steady_sizes
        .iter()
        .chain(&provisioning_sizes)
        .copied()
        .collect();
    let baseline_sizes = sizes_from("CAPC_BENCH_BASELINE_SIZES", &every_size);
    if let Ok(baseline) = std::env::var("CAPC_BENCH_BASELINE_SHIM") {
        if !Path::new(&baseline).is_file() {
            bail!("CAPC_BENCH_BASELINE_SHIM={baseline}: no such file");
        }
        builds.push(("baseline", baseline.into(), &[]));
    }
    // The steady fleet in SCOPED scopes (one project each) at these sizes, this build only:
    // the controller's CloudStack calls per cycle for section 1b (`CAPC_BENCH_SCOPED_SIZES`).
    let scoped_sizes = sizes_from("CAPC_BENCH_SCOPED_SIZES", &SCOPED_SIZES);
    let runs = steady_sizes
        .iter()
        .map(|&n| (n, FleetKind::Steady, 1))
        .chain(
            provisioning_sizes
                .iter()
                .map(|&n| (n, FleetKind::Provisioning, 1)),
        )
        .chain(scoped_sizes.iter().map(|&n| (n, FleetKind::Steady, SCOPED)));
    let mut rows = Vec::new();
    for (n, fleet, scopes, (build, binary, extra)) in runs
        .flat_map(|(n, fleet, scopes)| builds.iter().map(move |b| (n, fleet, scopes, b)))
        .filter(|(_, _, scopes, (build, ..))| *scopes == 1 || *build == "this")
        .filter(|(n, _, _, (build, ..))| *build != "no-orphans" || orphan_sizes.contains(n))
        .filter(|(n, _, _, (build, ..))| *build != "no-remnants" || remnant_sizes.contains(n))
        .filter(|(n, _, _, (build, ..))| *build != "baseline" || baseline_sizes.contains(n))
    {
        let t = Instant::now();
        match measure_cost(n, fleet, scopes, build, binary, extra).await {
            Ok(r) => {
                eprintln!(
                    "controller ({build}, {} fleet): {n} Machines: {:.3} CPU s/cycle, peak RSS {:.1} MiB, settle {:.1} s, \
                     {:.2} writes/cycle, /status p50 {:.1} ms p99 {:.1} ms, one cluster p50 {:.1} ms p99 {:.1} ms ({:.0} s)",
                    fleet.name(),
                    r.cpu_seconds_per_cycle,
                    r.rss_peak_mib,
                    r.settle_seconds,
                    r.writes_per_cycle,
                    r.status_p50_ms,
                    r.status_p99_ms,
                    r.status_cluster_p50_ms,
                    r.status_cluster_p99_ms,
                    t.elapsed().as_secs_f64()
                );
                rows.push(r);
            }
            Err(e) => eprintln!(
                "controller ({build}, {} fleet, {scopes} scope(s)): {n} Machines skipped: {e:#}",
                fleet.name()
            ),
        }
    }
    if rows.is_empty() {
        bail!("no size measured");
    }
    // The anchor (issue 28): CAPI v1.13 core holding the same steady fleet, after the shim's
    // rows (`CAPC_BENCH_ANCHOR_SIZES`, default 10 000; empty: none).
    let mut anchors = Vec::new();
    for n in sizes_from("CAPC_BENCH_ANCHOR_SIZES", &[10_000]) {
        let t = Instant::now();
        match anchor::measure(n, COST_POLL_SECS).await {
            Ok(a) => {
                eprintln!(
                    "controller (CAPI core {}, steady fleet): {n} Machines: peak RSS {:.1} MiB, steady {:.1} MiB, \
                     {:.3} CPU s per {COST_POLL_SECS} s idle, all reconciled after {:.1} s ({:.0} s)",
                    a.capi_version,
                    a.rss_peak_mib,
                    a.rss_steady_mib,
                    a.cpu_seconds_per_interval,
                    a.reconciled_seconds,
                    t.elapsed().as_secs_f64()
                );
                anchors.push(a);
            }
            Err(e) => eprintln!("controller (CAPI core anchor): {n} Machines skipped: {e:#}"),
        }
    }
    let (mut values, mut md) = cost_report(&rows, started.elapsed().as_secs_f64(), &source);
    anchor_report(&rows, &anchors, &mut values, &mut md);
    report::write_and_merge("controller.json", &values, "## 4. Controller cost", &md)?;
    // Section 1b: the CloudStack load at 1 000 and 10 000 Machines from these rows.
    let measured: Vec<cloudstack_sim::load::ControllerCalls> = rows
        .iter()
        .filter(|r| r.build == "this" && r.fleet == FleetKind::Steady)
        .map(|r| cloudstack_sim::load::ControllerCalls {
            machines: r.machines as u64,
            scopes: r.scopes as u64,
            calls_per_cycle: r.calls_per_cycle,
        })
        .collect();
    let (values, section) = users_load::section(&measured, SCOPED as u64)?;
    report::write_and_merge(
        "controller-users-load.json",
        &values,
        users_load::HEADING,
        &section,
    )?;
    println!("{section}");
    println!("{md}\nwritten to target/bench/controller.json, report.json and report.md");
    Ok(())
}

#[derive(Debug, Clone)]
struct RssSample {
    cycle: f64,
    seconds: f64,
    rss_mib: f64,
}

async fn run_soak() -> Result<bool> {
    let started = Instant::now();
    let source = source_state();
    let n = env_or("CAPC_SOAK_MACHINES", SOAK_MACHINES);
    let soak_cycles = env_or("CAPC_SOAK_CYCLES", SOAK_CYCLES);
    let http = http();
    let stats_interval = 6; // 60 s scaled by 10
                            // A User account: CloudStack (and the simulator) exempt admins from API throttling.
    let s = setup(
        n,
        "target/apiserver-soak",
        stats_interval,
        "User",
        FleetKind::Provisioning,
        1,
    )
    .await?;
    eprintln!("soak: set-up {n} Machines in {:.1} s", s.setup_seconds);

    // The slow API server: a proxy in front of it, and a kubeconfig for the shim naming it.
    let delays = proxy::Delays {
        connect_ms: 200,
        chunk_min_ms: 50,
        chunk_max_ms: 200,
    };
    let px = proxy::start(s.api.host_port(), delays).await?;
    // Cold start at full speed (through the proxy, no delay): with the delays every condition
    // write costs two slow round trips and 10 000 take over an hour (seen: ~1.6 Machines/s).
    let kc = std::fs::read_to_string(&s.api.kubeconfig)?
        .replace(&s.api.url, &format!("https://{}", px.addr));
    let kc_path = Path::new(report::DIR).join("soak-kubeconfig");
    std::fs::create_dir_all(report::DIR)?;
    std::fs::write(&kc_path, kc)?;
    // The throttling, slow CloudStack.
    let sim_admin = s.sim_server.base_url();
    let throttle = serde_json::json!({"latency_ms": SIM_LATENCY_MS, "throttle": {"max": SIM_THROTTLE_PER_S, "interval_seconds": 1}});
    http.post(format!("{sim_admin}/sim/api"))
        .json(&throttle)
        .send()
        .await?
        .error_for_status()
        .context("sim throttle")?;

    let args: Vec<String> = [
        "--namespace",
        NAMESPACE,
        "--no-leader-election",
        "--poll-interval",
        &format!("{SOAK_POLL_SECS}s"),
        "--stats-interval",
        &format!("{stats_interval}s"),
        "--rate-limit",
        "0",
        "--stopped-grace",
        "6s",
        "--escalation-delay",
        "6s",
        "--mass-failure-window",
        "60s",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let t0 = Instant::now();
    let mut shim = Shim::spawn(
        Path::new(env!("CARGO_BIN_EXE_capc-health-shim")),
        &kc_path,
        &args,
        &Path::new(report::DIR).join("soak-shim.log"),
    )?;
    let pid = shim.pid();
    let settle_seconds = settle(&s, &mut shim, n, t0, Duration::from_secs(1800)).await?;
    let m = procs::shim_metrics(&http, &shim.addr)
        .await
        .context("shim metrics")?;
    let c_start = procs::cycles(&m);
    eprintln!("soak: settled through the proxy in {settle_seconds:.1} s at cycle {c_start}");
    px.stats
        .slow
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let w_start = procs::apiserver_writes(&http, &s.api).await?;
    let cpu_start = procs::cpu_seconds(pid).unwrap_or(f64::NAN);
    let soak_t0 = Instant::now();
    let load_start = loadavg();

    let mut series = Vec::new();
    let mut faulted: HashSet<String> = HashSet::new();
    let mut injected_at: std::collections::HashMap<String, (Instant, f64)> = Default::default();
    let mut next_sample: f64 = 0.0;
    let mut cycle;
    let per_cycle_limit = Duration::from_secs(300);
    loop {
        let m = wait_cycles(
            &http,
            &mut shim,
            c_start + next_sample.min(soak_cycles),
            per_cycle_limit,
        )
        .await?;
        cycle = m - c_start;
        let rss = procs::status_mib(pid, "VmRSS").unwrap_or(f64::NAN);
        series.push(RssSample {
            cycle,
            seconds: soak_t0.elapsed().as_secs_f64(),
            rss_mib: rss,
        });
        if cycle >= 10.0 && (cycle as u64).is_multiple_of(10) {
            eprintln!(
                "soak: cycle {cycle:.0}/{soak_cycles:.0}, RSS {rss:.1} MiB, {:.0} s",
                soak_t0.elapsed().as_secs_f64()
            );
        }
        for (at, i, fault) in SOAK_FAULTS.iter().filter(|(_, i, _)| *i < n) {
            let name = machine_name(*i);
            if cycle < at.min(soak_cycles - 20.0) || injected_at.contains_key(&name) {
                continue;
            }
            http.post(format!("{sim_admin}/sim/vms/{}/faults", s.ids[*i]))
                .json(&serde_json::json!({"fault": fault}))
                .send()
                .await?
                .error_for_status()
                .with_context(|| format!("inject {fault}"))?;
            eprintln!("soak: {name} {fault} at cycle {cycle:.0}");
            injected_at.insert(name.clone(), (Instant::now(), cycle));
            faulted.insert(name);
        }
        if cycle >= soak_cycles {
            break;
        }
        next_sample += RSS_EVERY;
    }
    // Give the watch a moment to see the last writes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m_end = procs::shim_metrics(&http, &shim.addr)
        .await
        .context("shim metrics")?;
    let w_end = procs::apiserver_writes(&http, &s.api).await?;
    let hwm = procs::status_mib(pid, "VmHWM").unwrap_or(f64::NAN);
    let cpu = procs::cpu_seconds(pid).unwrap_or(f64::NAN);
    let (final_false, ever_false, first_false) = {
        let v = s.verdicts.lock().unwrap();
        (
            v.false_now(),
            v.first_false.keys().cloned().collect::<HashSet<_>>(),
            v.first_false.clone(),
        )
    };
    let wrong: Vec<&String> = ever_false.difference(&faulted).collect();
    let missed: Vec<&String> = faulted.difference(&final_false).collect();
    let to_false: Vec<f64> = faulted
        .iter()
        .filter_map(|m| Some((first_false.get(m)?, injected_at.get(m)?.0)))
        .map(|(f, t)| f.saturating_duration_since(t).as_secs_f64())
        .collect();
    let held = s.verdicts.lock().unwrap().with_reason("RemediationHeld");
    let throttled = procs::sum_metric(&m_end, "capc_health_cloudstack_calls_total", |l| {
        l.contains("result=\"throttled\"")
    });
    let calls = procs::sum_metric(&m_end, "capc_health_cloudstack_calls_total", |_| true);
    let writes = procs::delta(&w_start, &w_end);
    let rss: Vec<f64> = series.iter().map(|r| r.rss_mib).collect();
    let rss_max = rss.iter().copied().fold(f64::NAN, f64::max);
    let rss_min = rss.iter().copied().fold(f64::NAN, f64::min);
    let wall_soak = soak_t0.elapsed().as_secs_f64();
    let load = format!("{load_start} → {}", loadavg());

    let mut v = BTreeMap::new();
    v.insert("soak_machines".into(), n as f64);
    v.insert("soak_cycles".into(), cycle);
    v.insert("soak_simulated_seconds".into(), cycle * 30.0);
    v.insert("soak_wall_seconds".into(), wall_soak);
    v.insert("soak_settle_seconds".into(), settle_seconds);
    v.insert(
        "soak_rss_mib_start".into(),
        rss.first().copied().unwrap_or(f64::NAN),
    );
    v.insert(
        "soak_rss_mib_end".into(),
        rss.last().copied().unwrap_or(f64::NAN),
    );
    v.insert("soak_rss_mib_max".into(), rss_max);
    v.insert("soak_rss_mib_min".into(), rss_min);
    v.insert("soak_rss_hwm_mib".into(), hwm);
    v.insert(
        "soak_cpu_seconds_per_cycle".into(),
        (cpu - cpu_start) / cycle.max(1.0),
    );
    v.insert("soak_faults_injected".into(), faulted.len() as f64);
    v.insert("soak_held_by_guard".into(), held as f64);
    v.insert("soak_false_verdicts_wrong".into(), wrong.len() as f64);
    v.insert("soak_missed_faults".into(), missed.len() as f64);
    v.insert("soak_cloudstack_calls".into(), calls);
    v.insert("soak_cloudstack_calls_throttled".into(), throttled);
    v.insert(
        "soak_apiserver_writes_per_cycle".into(),
        procs::non_lease_writes(&writes) / cycle.max(1.0),
    );
    v.insert(
        "soak_proxy_connections".into(),
        px.stats
            .connections
            .load(std::sync::atomic::Ordering::Relaxed) as f64,
    );
    v.insert(
        "soak_proxy_mib".into(),
        px.stats.bytes.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1048576.0,
    );
    if !to_false.is_empty() {
        let mut t = to_false.clone();
        t.sort_by(f64::total_cmp);
        v.insert("soak_fault_seconds_to_false_max".into(), *t.last().unwrap());
    }
    v.insert(
        "bench_soak_wall_seconds".into(),
        started.elapsed().as_secs_f64(),
    );

    let mut md = format!(
        "## 6. Soak (issue 6 \"Load\")\n\n\
         {n} Machines, {cycle:.0} poll cycles at {SOAK_POLL_SECS} s = {:.0} min of simulated time at the \
         default 30 s (graces scaled 10×: stats interval {stats_interval} s, stopped grace and escalation \
         delay 6 s). The shim reaches the kube-apiserver through a TCP proxy that, from the end of the cold \
         start on, delays each new connection {} ms and every chunk {}–{} ms (TLS untouched; the cold \
         start runs undelayed: its one-by-one condition writes would take over an hour at that latency, \
         ~1.6 Machines/s seen); cloudstack-sim answers {} ms late and throttles at \
         {SIM_THROTTLE_PER_S} requests/s per account (the shim's own rate limit off), so polls meet 429s. Mass-failure window 60 s (10 simulated \
         min). Faults through the sim's admin API (cycle: Machine fault): {}; held by the guard at the end: {held}. Settled through the proxy in {settle_seconds:.0} s; \
         {wall_soak:.0} s wall clock for the soak window; load average {load}. {source}.\n\n\
         | RSS MiB start | end | min | max | VmHWM | wrong `False` (ever) | missed faults | seconds to `False` (max) | CloudStack calls | of them 429 | API writes/cycle | proxy connections | proxy MiB |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n\
         | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {:.0} | {calls:.0} | {throttled:.0} | {:.2} | {} | {:.0} |\n\n",
        cycle * 30.0 / 60.0,
        delays.connect_ms,
        delays.chunk_min_ms,
        delays.chunk_max_ms,
        SIM_LATENCY_MS,
        SOAK_FAULTS
            .iter()
            .filter_map(|(_, i, f)| {
                let name = machine_name(*i);
                let c = injected_at.get(&name)?.1;
                Some(format!("{c:.0}: {name} `{f}`"))
            })
            .collect::<Vec<_>>()
            .join(", "),
        v["soak_rss_mib_start"],
        v["soak_rss_mib_end"],
        rss_min,
        rss_max,
        hwm,
        wrong.len(),
        missed.len(),
        v.get("soak_fault_seconds_to_false_max").copied().unwrap_or(f64::NAN),
        v["soak_apiserver_writes_per_cycle"],
        v["soak_proxy_connections"],
        v["soak_proxy_mib"],
    );
    if throttled == 0.0 {
        let _ = writeln!(
            md,
            "No call met a 429: the shim's sequential calls stayed under {SIM_THROTTLE_PER_S}/s \
             ({:.1} calls per cycle); 429 storms are covered by the fault matrix, not here.\n",
            calls / cycle.max(1.0)
        );
    }
    if !wrong.is_empty() || !missed.is_empty() {
        let _ = writeln!(md, "Wrong `False`: {wrong:?}; missed: {missed:?}.\n");
    }
    md.push_str("RSS (VmRSS) over the soak:\n\n| cycle | simulated min | wall s | RSS MiB |\n|---:|---:|---:|---:|\n");
    for r in &series {
        let _ = writeln!(
            md,
            "| {:.0} | {:.1} | {:.0} | {:.1} |",
            r.cycle,
            r.cycle * 30.0 / 60.0,
            r.seconds,
            r.rss_mib
        );
    }
    report::write_and_merge("soak.json", &v, "## 6. Soak", &md)?;
    println!("{md}\nwritten to target/bench/soak.json, report.json and report.md");
    drop(px);
    drop(shim);
    s.stop().await;
    Ok(wrong.is_empty() && missed.is_empty())
}

async fn run(part: &str) -> bool {
    match part {
        "phases" => {
            phases::run(&DEFAULT_SIZES);
            true
        }
        // Section 1b again from the calls per cycle of the last cost run (controller.json) and
        // the current load file: after `make e2e-load`, or after `scale` rewrote the report.
        "users-load" => match users_load::again(SCOPED as u64) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("section 1b failed: {e:#}");
                false
            }
        },
        "soak" => match run_soak().await {
            Ok(correct) => correct,
            Err(e) => {
                eprintln!("soak failed: {e:#}");
                false
            }
        },
        _ => match run_cost().await {
            Ok(()) => true,
            Err(e) => {
                eprintln!("controller bench failed: {e:#}");
                false
            }
        },
    }
}

fn main() {
    let part = std::env::var("CAPC_BENCH_CONTROLLER_PART").unwrap_or_else(|_| "cost".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let ok = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        // SIGINT/SIGTERM drop the work, and with it the guards that stop every child.
        tokio::select! {
            ok = run(&part) => ok,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("interrupted: stopping the children");
                false
            }
            _ = term.recv() => {
                eprintln!("terminated: stopping the children");
                false
            }
        }
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    std::process::exit(if ok { 0 } else { 1 });
}

/// The cost of one report: this build with it (the default) and without it (`flag`), same
/// binary, same run — a table in `md`, ratios in `v`.
fn with_and_without(
    rows: &[CostRow],
    without: &str,
    what: &str,
    flag: &str,
    key_word: &str,
    md: &mut String,
    v: &mut std::collections::BTreeMap<String, f64>,
) {
    let pairs: Vec<(&CostRow, &CostRow)> = rows
        .iter()
        .filter(|r| r.build == "this" && r.scopes == 1)
        .filter_map(|r| {
            let b = rows
                .iter()
                .find(|b| b.build == without && b.machines == r.machines && b.fleet == r.fleet)?;
            Some((r, b))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    let _ = write!(
        md,
        "\nThe {what}'s cost ({key_word} finder and what feeds it): this build with it (the default) and without it \
         (`{flag}`), same binary, same run:\n\n\
         | Machines | CPU s/cycle with | without | ratio | peak RSS MiB with | without | ratio | steady RSS MiB with | without | ratio |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (r, b) in pairs {
        let key = |name: &str| {
            format!(
                "{name}_ratio_with_vs_without_{key_word}_{}_machines{}",
                r.machines,
                key_suffix(r.fleet)
            )
        };
        let cpu = ratio(r.cpu_seconds_per_cycle, b.cpu_seconds_per_cycle);
        let rss = ratio(r.rss_peak_mib, b.rss_peak_mib);
        let steady = ratio(r.rss_steady_mib, b.rss_steady_mib);
        v.insert(key("cpu_seconds_per_cycle"), cpu);
        v.insert(key("rss_mib"), rss);
        v.insert(key("rss_mib_steady"), steady);
        let _ = writeln!(
            md,
            "| {} | {:.3} | {:.3} | {cpu:.2} | {:.1} | {:.1} | {rss:.2} | {:.1} | {:.1} | {steady:.2} |",
            r.machines,
            r.cpu_seconds_per_cycle,
            b.cpu_seconds_per_cycle,
            r.rss_peak_mib,
            b.rss_peak_mib,
            r.rss_steady_mib,
            b.rss_steady_mib
        );
    }
}
