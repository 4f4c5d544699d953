//! The child processes of the controller bench — a real etcd + kube-apiserver (through
//! `target/hack/apiserver-run`) and the release `capc-health-shim run` — as guards that stop
//! them on drop (also when a measurement fails or panics), plus `/proc` and `/metrics` readers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// etcd + kube-apiserver of one profile in `dir`, stopped (runner SIGTERM, then SIGKILL of the
/// runner and of the two servers it started) when dropped.
pub struct ApiServer {
    child: Child,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub url: String,
    pub token: String,
}

impl ApiServer {
    pub async fn start(dir: &str) -> Result<Self> {
        Self::start_profile(dir, "capi-1.9").await
    }

    /// As [`ApiServer::start`] with the CRDs of `profile` (`hack/apiserver/README.md`).
    pub async fn start_profile(dir: &str, profile: &str) -> Result<Self> {
        let runner = std::env::var("APISERVER_RUNNER")
            .unwrap_or_else(|_| "target/hack/apiserver-run".into());
        if !Path::new(&runner).exists() {
            bail!("{runner} missing: run `make apiserver-runner`");
        }
        let dir = PathBuf::from(dir);
        let _ = std::fs::remove_file(dir.join("kubeconfig"));
        let log_path = PathBuf::from(format!("{}.log", dir.display()));
        let log = std::fs::File::create(&log_path).context("apiserver log")?;
        let child = Command::new(&runner)
            .args(["--profile", profile, "--dir"])
            .arg(&dir)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {runner}"))?;
        let mut s = Self {
            child,
            kubeconfig: dir.join("kubeconfig"),
            dir,
            url: String::new(),
            token: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(600);
        while !s.kubeconfig.exists() {
            if let Ok(Some(status)) = s.child.try_wait() {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                bail!("the API server runner exited with {status}: {log}");
            }
            if Instant::now() > deadline {
                bail!("no kubeconfig after 600 s (log {})", log_path.display());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let env = std::fs::read_to_string(s.dir.join("env")).context("apiserver env file")?;
        s.url = env
            .lines()
            .find_map(|l| l.strip_prefix("APISERVER_URL="))
            .context("APISERVER_URL in env")?
            .to_string();
        s.token = std::fs::read_to_string(s.dir.join("token"))?
            .trim()
            .to_string();
        Ok(s)
    }

    /// The kube-apiserver process (for its CPU time).
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.server_pid("kube-apiserver.pid")
    }

    fn server_pid(&self, file: &str) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        // Only a process of this directory (pid files can outlive their process).
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let dir = self.dir.file_name()?.to_string_lossy().into_owned();
        String::from_utf8_lossy(&cmdline)
            .contains(&dir)
            .then_some(pid)
    }

    /// `host:port` of the API server.
    pub fn host_port(&self) -> String {
        self.url.trim_start_matches("https://").to_string()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let servers: Vec<u32> = ["kube-apiserver.pid", "etcd.pid"]
            .iter()
            .filter_map(|f| self.server_pid(f))
            .collect();
        signal(self.child.id(), "-TERM");
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in servers {
            if alive(pid) {
                signal(pid, "-KILL");
            }
        }
    }
}

/// `capc-health-shim run` as a child process, killed when dropped.
pub struct Shim {
    child: Child,
    pub addr: String,
}

impl Shim {
    /// `binary`: this build's `capc-health-shim`, or a baseline to compare with.
    pub fn spawn(binary: &Path, kubeconfig: &Path, args: &[String], log: &Path) -> Result<Self> {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(log).context("shim log")?;
        let child = Command::new(binary)
            .args(["--log", "warn", "run", "--status-addr", &addr])
            .args(args)
            // Plain HTTP without tokens for the measurements; as an environment variable, so a
            // baseline binary from before --insecure-serving starts too (it ignores it).
            .env("CAPC_HEALTH_INSECURE_SERVING", "true")
            .env("KUBECONFIG", kubeconfig)
            .env("HOSTNAME", "capc-health-shim-bench")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start capc-health-shim run")?;
        Ok(Self { child, addr })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error when the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            Some(status) => bail!("capc-health-shim run exited with {status}"),
            None => Ok(()),
        }
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of a process, seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // fields 14 and 15 of stat(5); `rest` starts at field 3
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks())
}

/// A `kB` line of /proc/<pid>/status (`VmHWM`, `VmRSS`), in MiB.
pub fn status_mib(pid: u32, key: &str) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(&format!("{key}:")))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The value of label `name` in a Prometheus sample line.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

fn sample_value(line: &str) -> Option<f64> {
    line.rsplit(' ').next()?.parse().ok()
}

/// Sum of every sample of `metric` (any labels) whose labels satisfy `keep`.
pub fn sum_metric(text: &str, metric: &str, keep: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
                && keep(l)
        })
        .filter_map(sample_value)
        .fold(0.0, |a, b| a + b)
}

pub const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// Writes the API server has answered, by `resource[/subresource] VERB`, from its own
/// `apiserver_request_total`.
pub async fn apiserver_writes(
    http: &reqwest::Client,
    api: &ApiServer,
) -> Result<BTreeMap<String, f64>> {
    apiserver_requests(http, api, |verb| WRITE_VERBS.contains(&verb)).await
}

/// Reads (GET, LIST, WATCH) the API server has answered, keyed as [`apiserver_writes`]: a
/// relisting watcher shows here.
pub async fn apiserver_reads(
    http: &reqwest::Client,
    api: &ApiServer,
) -> Result<BTreeMap<String, f64>> {
    apiserver_requests(http, api, |verb| matches!(verb, "GET" | "LIST" | "WATCH")).await
}

async fn apiserver_requests(
    http: &reqwest::Client,
    api: &ApiServer,
    wanted: impl Fn(&str) -> bool,
) -> Result<BTreeMap<String, f64>> {
    let text = http
        .get(format!("{}/metrics", api.url))
        .bearer_auth(&api.token)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let verb = label(line, "verb").unwrap_or("");
        if !wanted(verb) {
            continue;
        }
        let resource = label(line, "resource").unwrap_or("");
        let sub = label(line, "subresource").unwrap_or("");
        let key = if sub.is_empty() {
            format!("{resource} {verb}")
        } else {
            format!("{resource}/{sub} {verb}")
        };
        *out.entry(key).or_insert(0.0) += sample_value(line).unwrap_or(0.0);
    }
    Ok(out)
}

/// `after - before` per key, zero deltas dropped.
pub fn delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

/// Writes that are not Lease renewals: the shim runs without leader election here, so every
/// Lease write is the API server's own (its identity and endpoint leases).
pub fn non_lease_writes(d: &BTreeMap<String, f64>) -> f64 {
    d.iter()
        .filter(|(k, _)| !k.starts_with("leases "))
        .map(|(_, v)| v)
        .fold(0.0, |a, b| a + b)
}

/// The shim's `/metrics` text.
pub async fn shim_metrics(http: &reqwest::Client, addr: &str) -> Option<String> {
    http.get(format!("http://{addr}/metrics"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()
}

/// Poll cycles the shim has completed: the count of `capc_health_cycle_duration_seconds` (one
/// observation per cycle, however many scopes it polls).
pub fn cycles(metrics: &str) -> f64 {
    sum_metric(metrics, "capc_health_cycle_duration_seconds_count", |_| {
        true
    })
}

/// Scope polls the shim has completed: the count of `capc_health_poll_duration_seconds` (one
/// observation per scope per cycle).
pub fn scope_polls(metrics: &str) -> f64 {
    sum_metric(metrics, "capc_health_poll_duration_seconds_count", |_| true)
}

/// `capc_health_cloudstack_calls_total` by `command`.
pub fn calls_by_command(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("capc_health_cloudstack_calls_total{"))
    {
        let command = label(line, "command").unwrap_or("").to_string();
        *out.entry(command).or_insert(0.0) += sample_value(line).unwrap_or(0.0);
    }
    out
}
