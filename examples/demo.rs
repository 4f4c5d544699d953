//! `make demo-sim` (`cargo run --example demo`): starts `cloudstack-sim` with the embedded seed
//! scenario, polls it with the `check` machinery until the verdicts settle, prints them, stops
//! the simulator. A developer's quick look without Kubernetes — not part of the product binary.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use jiff::SignedDuration;

use capc_health_shim::check::{self, exit, Checker, UsageHistoryMode};
use capc_health_shim::cli::OutputFormat;
use capc_health_shim::cloudstack::client::{ClientConfig, CloudStackClient, VmListQuery};
use capc_health_shim::verdict::{Graces, MassFailureGuard, Status};

/// The seed scenario, embedded so the demo needs no files at run time.
pub const SEED_SCENARIO: &str = include_str!("../cloudstack-fixtures/scenarios/seed.json");

#[derive(Debug, Clone, Parser)]
#[command(
    name = "demo",
    about = "cloudstack-sim's seed scenario and the verdicts `check` reaches"
)]
pub struct DemoArgs {
    /// The cloudstack-sim binary (default: next to this binary, or beside the examples directory).
    #[arg(long)]
    pub sim_binary: Option<PathBuf>,
    /// Give up if the verdicts have not settled after this long.
    #[arg(long, default_value = "120s", value_parser = capc_health_shim::cli::parse_duration)]
    pub timeout: SignedDuration,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

/// Kills the simulator when dropped, whatever happens.
struct SimProcess(Child);

impl Drop for SimProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sim_binary(args: &DemoArgs) -> Result<PathBuf, String> {
    if let Some(p) = &args.sim_binary {
        return Ok(p.clone());
    }
    let me = std::env::current_exe().map_err(|e| format!("cannot locate this binary: {e}"))?;
    let sim = me.with_file_name("cloudstack-sim");
    // An example is built into target/<profile>/examples/, the simulator into target/<profile>/.
    let beside_examples = me
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("cloudstack-sim"));
    if sim.exists() {
        Ok(sim)
    } else if let Some(sim) = beside_examples.filter(|p| p.exists()) {
        Ok(sim)
    } else {
        Err(format!(
            "{} not found; build it first (`cargo build -p cloudstack-sim`) or pass --sim-binary",
            sim.display()
        ))
    }
}

/// Starts the simulator on a free loopback port and waits (with a deadline) for its
/// "listening on" line.
fn start_sim(
    binary: &PathBuf,
    scenario: &std::path::Path,
    key: &str,
    secret: &str,
) -> Result<(SimProcess, String), String> {
    let mut child = Command::new(binary)
        .args(["--listen", "127.0.0.1:0", "--scenario"])
        .arg(scenario)
        .env("CLOUDSTACK_SIM_API_KEY", key)
        .env("CLOUDSTACK_SIM_SECRET_KEY", secret)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout from cloudstack-sim")?;
    let sim = SimProcess(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(url) = line.split("listening on ").nth(1) {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(20))
        .map_err(|_| "cloudstack-sim did not report its address within 20 s".to_string())?;
    Ok((sim, url))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = DemoArgs::parse();
    std::process::ExitCode::from(match run(&args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("demo: {e}");
            1
        }
    })
}

async fn run(args: &DemoArgs) -> Result<u8, String> {
    let scenario: serde_json::Value =
        serde_json::from_str(SEED_SCENARIO).map_err(|e| format!("embedded seed scenario: {e}"))?;
    let stats_secs = scenario
        .pointer("/settings/stats_interval_seconds")
        .and_then(|v| v.as_f64())
        .unwrap_or(2.0);
    let dir = tempfile_dir()?;
    let scenario_path = dir.join("seed.json");
    std::fs::write(&scenario_path, SEED_SCENARIO)
        .map_err(|e| format!("cannot write scenario: {e}"))?;
    let key = "demo-api-key";
    let secret = format!("demo-secret-{}", uuid::Uuid::new_v4());
    let binary = sim_binary(args)?;
    let (sim, base) = start_sim(&binary, &scenario_path, key, &secret)?;
    println!("cloudstack-sim running at {base} with the seed scenario (stats every {stats_secs}s)");

    let mut cfg = ClientConfig::new(
        &format!("{base}/client/api"),
        check::credentials(key, &secret)?,
    )
    .map_err(|e| e.to_string())?;
    cfg.request_timeout = Duration::from_secs(5);
    cfg.rate_limit = None;
    let client = CloudStackClient::new(cfg).map_err(|e| e.to_string())?;
    // Timings scaled to the simulator: the table's graces in seconds instead of minutes.
    let interval = SignedDuration::from_secs(1);
    let graces = Graces {
        poll_interval: interval,
        stats_interval: SignedDuration::from_secs_f64(stats_secs),
        stopped: SignedDuration::from_secs(5),
        transition: SignedDuration::from_secs(60),
        host_unreachable: SignedDuration::from_secs(20),
        nic_detached: SignedDuration::from_secs(5),
        nic_no_address: SignedDuration::from_secs(10),
        ..Graces::default()
    };
    println!(
        "polling every 1s; graces scaled down (stopped 5s, NIC 5s, silent after {} flat samples of {stats_secs}s)",
        graces.silent_samples
    );
    let mut checker = Checker::new(
        client,
        VmListQuery::default(),
        &[],
        graces,
        MassFailureGuard::default(),
        UsageHistoryMode::Auto,
    );
    let deadline =
        Instant::now() + Duration::try_from(args.timeout).unwrap_or(Duration::from_secs(120));
    let mut settled = false;
    let mut reports = Vec::new();
    let mut last_line = String::new();
    while Instant::now() < deadline {
        let (r, code) = check::run_polls(&mut checker, 1, interval, false, |_, poll, _| {
            if let Some(e) = &poll.listing_error {
                eprintln!("poll failed: {e}");
            }
        })
        .await;
        if code != exit::RAN {
            return Err("the simulator stopped answering".into());
        }
        let counts = count(&r);
        if counts != last_line {
            println!("  {counts}");
            last_line = counts;
        }
        reports = r;
        if checker.settled(&reports, jiff::Timestamp::now()) {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!();
    print!("{}", check::render(&reports, args.output));
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);
    if !settled {
        return Err(format!(
            "verdicts did not settle within {}s",
            args.timeout.as_secs()
        ));
    }
    println!("\nverdicts settled; cloudstack-sim stopped.");
    Ok(exit::RAN)
}

fn count(reports: &[check::VmReport]) -> String {
    let n = |s: Status| reports.iter().filter(|r| r.verdict == s).count();
    format!(
        "{} VMs: {} True, {} False, {} Unknown",
        reports.len(),
        n(Status::True),
        n(Status::False),
        n(Status::Unknown)
    )
}

fn tempfile_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("capc-health-shim-demo-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}
