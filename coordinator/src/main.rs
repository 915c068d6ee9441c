//! `headroom-coordinator`: the REST API on its own (agents run elsewhere).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use headroom_coordinator::store::sqlite::SqliteStore;
use headroom_coordinator::{Application, CoordinatorConfig};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "headroom-coordinator",
    version,
    about = "headroom coordinator: REST API, store, placement"
)]
struct Args {
    #[arg(long, env = "HEADROOM_LISTEN", default_value = "127.0.0.1:7420")]
    listen: SocketAddr,
    /// Attempt logs and the embedded store live here.
    #[arg(long, env = "HEADROOM_DATA_DIR", default_value = ".headroom")]
    data_dir: PathBuf,
    /// An agent silent this long loses its leases.
    #[arg(long, env = "HEADROOM_LEASE_TTL", default_value = "30s", value_parser = humantime::parse_duration)]
    lease_ttl: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HEADROOM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    std::fs::create_dir_all(&args.data_dir)?;
    let db = args.data_dir.join("headroom.db");
    let store = tokio::task::spawn_blocking(move || SqliteStore::open(&db))
        .await?
        .context("opening the store")?;
    let mut config = CoordinatorConfig::new(args.listen, args.data_dir);
    config.lease_ttl = args.lease_ttl;
    let app = Application::build(config, Arc::new(store)).await?;
    println!(
        "headroom: coordinator listening on http://{}",
        app.local_addr()
    );
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        s.cancel();
    });
    app.run(stop).await?;
    Ok(())
}
