//! `headroom-agent`: the agent of one GPU node, pulling work from a coordinator.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use headroom_agent::agent::{Agent, AgentConfig};
use headroom_agent::gpu::{self, BackendChoice, FakeGpuSpec};
use headroom_agent::supervisor::SupervisorConfig;
use headroom_shared::api::Headroom;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    Auto,
    Nvml,
    Fake,
}

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
    /// This node's name (default: the host name).
    #[arg(long, env = "HEADROOM_NODE")]
    node: Option<String>,
    /// Slots per GPU, e.g. "2,2,1,1"; default keeps the coordinator's plan for this node.
    #[arg(long, env = "HEADROOM_PLAN")]
    plan: Option<String>,
    #[arg(long, env = "HEADROOM_HEADROOM", default_value = "10%")]
    headroom: Headroom,
    #[arg(long, value_enum, env = "HEADROOM_GPU_BACKEND", default_value = "auto")]
    gpu_backend: Backend,
    #[arg(long, env = "HEADROOM_FAKE_GPUS", default_value = "4x24GiB")]
    fake_gpus: FakeGpuSpec,
    /// Attempt logs and fake GPU files.
    #[arg(long, env = "HEADROOM_DATA_DIR", default_value = ".headroom-agent")]
    data_dir: PathBuf,
    #[arg(long, env = "HEADROOM_KILL_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    kill_grace: Duration,
    /// How long cleanup may take to verify an attempt's GPUs are clean before quarantining them.
    #[arg(long, env = "HEADROOM_VERIFY_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    verify_timeout: Duration,
    /// Kill processes that belong to no job and hold GPU memory (default: report, never kill).
    #[arg(long, env = "HEADROOM_KILL_FOREIGN")]
    kill_foreign: bool,
}

fn main() -> anyhow::Result<()> {
    // A job being launched: becomes the job, before any runtime thread exists.
    headroom_agent::launcher::run_if_launcher();
    tokio::runtime::Runtime::new()?.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HEADROOM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    // First: a stop signal during start-up must stop us cleanly too.
    let stop = CancellationToken::new();
    headroom_shared::signals::cancel_on_stop_signal(stop.clone())?;
    let args = Args::parse();
    std::fs::create_dir_all(&args.data_dir)?;
    let fake_dir = args.data_dir.canonicalize()?.join("fake-gpus");
    let choice = match args.gpu_backend {
        Backend::Nvml => BackendChoice::Nvml,
        Backend::Fake => BackendChoice::Fake {
            spec: args.fake_gpus,
            dir: fake_dir,
        },
        Backend::Auto => BackendChoice::Auto {
            fake_fallback: args.fake_gpus,
            dir: fake_dir,
        },
    };
    let backend = gpu::open(&choice).context("opening the GPU backend")?;
    let node = args.node.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "localhost".into())
    });
    let supervisor = SupervisorConfig {
        kill_grace: args.kill_grace,
        verify_timeout: args.verify_timeout,
        launcher: Some(headroom_agent::launcher::SELF_EXE.into()),
        ..SupervisorConfig::default()
    };
    let agent = Agent::new(
        AgentConfig {
            coordinator: args.coordinator,
            node,
            plan: args.plan,
            headroom: args.headroom,
            data_dir: args.data_dir,
            supervisor,
            claim_wait: Duration::from_secs(20),
            kill_foreign: args.kill_foreign,
        },
        backend,
    )?;
    agent.run(stop).await?;
    Ok(())
}
