//! `capc-health-shim`: feeds CloudStack VM evidence into CAPI Machine health.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use capc_health_shim::{check, cli, controller};

// jemalloc: less memory held and less time in malloc than glibc's for the shim's many small,
// short-lived allocations per cycle (Cargo.toml, feature `jemalloc`).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// `--version`: the release and the commit it was built from (build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CAPC_HEALTH_SHIM_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "capc-health-shim",
    version = VERSION,
    about = "CloudStack VM health for Cluster API Machines: signal, never delete"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `capc_health_shim=debug`.
    #[arg(long, env = "CAPC_HEALTH_LOG", default_value = "warn", global = true)]
    log: String,
    /// Log line format.
    #[arg(
        long,
        env = "CAPC_HEALTH_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller next to CAPC (in-cluster config or KUBECONFIG).
    Run(Box<controller::RunArgs>),
    /// Poll a CloudStack endpoint for VMs and print verdicts (no Kubernetes needed).
    Check(Box<check::CheckArgs>),
    /// Render a running shim's /status for humans.
    Status(cli::status::StatusArgs),
    /// List the VMs a running shim reports as orphans, with the CloudMonkey commands to remove them (never run).
    Orphans(cli::orphans::OrphansArgs),
    /// What a running shim did, or would have done, on the fleet: outcomes since counting began, the latest ones, boot times per template and the warnings (e.g. an MHC timer below the boot p95).
    Scorecard(cli::scorecard::ScorecardArgs),
    /// Print the MachineHealthCheck (or the patch to an existing one) that recycles a Cluster's Machines on the shim's verdict.
    Mhc(cli::mhc::MhcArgs),
    /// After uninstalling: list what the shim left (its Lease and memory ConfigMap, its condition entries and annotations on Machines, MHC entries naming its condition); --yes removes it.
    Cleanup(cli::cleanup::CleanupArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = match tracing_subscriber::EnvFilter::try_new(&cli.log) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("--log {:?} is not a valid filter: {e}", cli.log);
            return ExitCode::from(2);
        }
    };
    // Colours only on a terminal: in a pod's log (a pipe) escape codes are noise.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => controller::run::main(*args).await,
            Command::Check(args) => check::main(*args).await,
            Command::Status(args) => cli::status::main(args).await,
            Command::Orphans(args) => cli::orphans::main(args).await,
            Command::Scorecard(args) => cli::scorecard::main(args).await,
            Command::Mhc(args) => cli::mhc::main(args).await,
            Command::Cleanup(args) => cli::cleanup::main(args).await,
        }
    });
    ExitCode::from(code)
}
