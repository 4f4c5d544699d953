//! `cloudstack-sim`: serve a simulated CloudStack API (see `cloudstack_sim`).

use std::io::Write as _;
use std::path::PathBuf;

use clap::Parser;

use cloudstack_sim::{self as sim, AccountType, Simulator, World};

#[derive(Debug, Parser)]
#[command(name = "cloudstack-sim", version, about = "CloudStack API simulator")]
struct Args {
    /// Address to listen on, e.g. 127.0.0.1:8080 (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Scenario file (JSON) to preload.
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// API key of the root admin account.
    #[arg(long, env = "CLOUDSTACK_SIM_API_KEY", default_value = "sim-api-key")]
    api_key: String,
    /// Secret key of the root admin account.
    #[arg(
        long,
        env = "CLOUDSTACK_SIM_SECRET_KEY",
        default_value = "sim-secret-key",
        hide_env_values = true,
        hide_default_value = true
    )]
    secret_key: String,
    /// Simulated seconds per real second (0 freezes time: only POST /sim/clock moves it).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) for --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Once listening, write the bound port (e.g. `41237`, for --listen 127.0.0.1:0) to this
    /// file; it appears complete (written to a temporary file, then renamed).
    #[arg(long, value_name = "FILE")]
    port_file: Option<PathBuf>,
}

/// Writes `port` to `path` atomically, so that a reader never sees a partial file.
fn write_port_file(path: &std::path::Path, port: u16) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, format!("{port}\n"))
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| anyhow::anyhow!("cannot rename to {}: {e}", path.display()))?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if !(args.time_scale.is_finite() && args.time_scale >= 0.0) {
        anyhow::bail!("--time-scale must be a non-negative number");
    }
    let start = sim::real_now_ms();
    let keys = (args.api_key.as_str(), args.secret_key.as_str());
    let mut world = match &args.scenario {
        Some(p) => sim::load_scenario_file(p, start, keys)?,
        None => World::default_world(keys.0, keys.1, start),
    };
    // Explicit keys (flags/env) always work for a root admin: reuse the first root admin of
    // the scenario, or add one.
    let explicit = std::env::args()
        .any(|a| a.starts_with("--api-key") || a.starts_with("--secret-key"))
        || std::env::var_os("CLOUDSTACK_SIM_API_KEY").is_some();
    if args.scenario.is_some() && explicit && world.account_by_api_key(keys.0).is_none() {
        match world
            .accounts
            .iter()
            .position(|a| a.kind == AccountType::Admin)
        {
            Some(i) => {
                world.accounts[i].api_key = keys.0.to_string();
                world.accounts[i].secret_key = sim::world::Secret::new(keys.1);
            }
            None => {
                world.add_account(
                    "admin",
                    None,
                    AccountType::Admin,
                    keys.0,
                    keys.1,
                    None,
                    None,
                )?;
            }
        }
    }
    let sim = Simulator::with_time_scale(world, args.time_scale);
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    let server = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let read = |p: &PathBuf| {
                std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))
            };
            let tls = sim::tls_config(&read(cert)?, &read(key)?).map_err(anyhow::Error::msg)?;
            sim::serve_tls(listener, sim, tls).await?
        }
        _ => sim::serve(listener, sim).await?,
    };
    if let Some(p) = &args.port_file {
        write_port_file(p, server.addr().port())?;
    }
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "cloudstack-sim listening on {}", server.base_url())?;
        out.flush()?;
    }
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    server.shutdown().await;
    Ok(())
}
