//! `headroom-agent`: the agent of one GPU node, pulling work from a coordinator.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use headroom_agent::agent::Agent;
use headroom_agent::agent::settings::AgentSettings;
use headroom_agent::gpu;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "headroom-agent",
    version,
    about = "headroom agent: runs jobs on this node's GPUs"
)]
struct Args {
    /// Coordinator URL.
    #[arg(
        long,
        env = "HEADROOM_COORDINATOR",
        default_value = "http://127.0.0.1:7420"
    )]
    coordinator: String,
    /// Its journal, credential, attempt logs and fake GPU files: `/var/lib/headroom-agent`
    /// as root, else `.headroom-agent` in the working directory.
    #[arg(long, env = "HEADROOM_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// A TOML file of settings (keys are the flags' names); variables and flags win over it.
    #[arg(long, env = "HEADROOM_CONFIG")]
    config: Option<PathBuf>,
    /// Get this node's credential and exit: exchange the join token for it where the data
    /// directory keeps none yet. The Helm chart's init container does this, so that the
    /// agent's own container, where jobs run, never holds the join token.
    #[arg(long)]
    join_only: bool,
    #[command(flatten)]
    settings: AgentSettings,
}

fn main() -> anyhow::Result<()> {
    // An attempt's supervisor process: supervises its attempt and exits.
    headroom_agent::supervisor::run_if_supervisor();
    // One thread: the agent waits on the network, its supervisors and (on blocking threads)
    // its GPUs. Worker threads woke one another several times per job, each wake-up a
    // cross-CPU interrupt: a burst of trivial jobs cost its agent 20 context switches and
    // about 1.0 ms of CPU per job on two workers, 13 and 0.85 ms on one.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    // First: a stop signal during start-up must stop us cleanly too.
    let stop = CancellationToken::new();
    headroom_shared::signals::cancel_on_stop_signal(stop.clone())?;
    headroom_shared::logging::init("info");
    let args: Args = headroom_shared::settings::parse()?;
    // What it writes (logs, journal, keys) is for it alone; jobs get their own umask.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let given = args.data_dir.clone().unwrap_or_else(|| {
        headroom_shared::datadir::service_default("headroom-agent", ".headroom-agent")
    });
    let data_dir = headroom_shared::datadir::adopt(&given)?;
    if args.join_only {
        let node = args.settings.node_name();
        let kept = headroom_agent::agent::join::credential(
            &data_dir,
            args.settings.join_token_file.as_deref(),
            &args.coordinator,
            args.settings.ca_file.as_deref(),
            &node,
        )
        .await?;
        anyhow::ensure!(
            kept.is_some(),
            "--join-only: {} keeps no credential of node {node}, and no join token \
             (--join-token-file) was given to get one",
            data_dir.display()
        );
        eprintln!(
            "headroom-agent: node {node}'s credential is kept in {}",
            data_dir
                .join(headroom_agent::agent::join::CREDENTIAL_FILE)
                .display()
        );
        return Ok(());
    }
    let backend =
        gpu::open(&args.settings.backend_choice(&data_dir)).context("opening the GPU backend")?;
    eprintln!("headroom-agent: {}", backend.describe());
    if args.settings.require_doctor {
        let b = backend.clone();
        tokio::task::spawn_blocking(move || headroom_agent::doctor::gate(b.as_ref()))
            .await?
            .map_err(anyhow::Error::msg)?;
    }
    let mut config = args.settings.agent_config(args.coordinator, data_dir)?;
    if config.token.is_none() {
        config.token = headroom_agent::agent::join::credential(
            &config.data_dir,
            args.settings.join_token_file.as_deref(),
            &config.coordinator,
            config.ca_file.as_deref(),
            &config.node,
        )
        .await?;
    }
    let agent = Agent::new(config, backend)?;
    agent.run(stop).await?;
    Ok(())
}
