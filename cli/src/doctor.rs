//! `headroom doctor`: the node checks of `headroom_agent::doctor`, printed for people or as
//! JSON; exits 1 when a check failed.

use std::path::PathBuf;

use anyhow::Result;
use headroom_agent::agent::settings::GpuBackendKind;
use headroom_agent::doctor::{self, Options, Report, Status};
use headroom_agent::gpu::{BackendChoice, FakeGpuSpec};

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// The GPU backend to check: `auto` (NVML when an NVIDIA driver is found), `nvml`, `fake`.
    #[arg(long, value_enum, env = "HEADROOM_GPU_BACKEND", default_value = "auto")]
    pub gpu_backend: GpuBackendKind,
    /// Fake GPUs (with `--gpu-backend fake`, or when no driver is found).
    #[arg(long, env = "HEADROOM_FAKE_GPUS", default_value = "4x24GiB")]
    pub fake_gpus: FakeGpuSpec,
    /// The data directory whose fake GPUs to check (an agent's or `headroom up`'s).
    #[arg(long, env = "HEADROOM_DATA_DIR", default_value = ".headroom")]
    pub data_dir: PathBuf,
    /// Do not start a process on each GPU to see its allocation and release.
    #[arg(long)]
    pub no_allocate: bool,
    /// The Python to allocate with through PyTorch (default `python3`).
    #[arg(long)]
    pub python: Option<String>,
    /// The report as JSON: `{"ok", "backend", "checks": [{"name", "status", "detail",
    /// "meaning"}]}`.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: DoctorArgs) -> Result<i32> {
    let dir = headroom_shared::datadir::adopt(&args.data_dir)?.join("fake-gpus");
    let choice = match args.gpu_backend {
        GpuBackendKind::Nvml => BackendChoice::Nvml,
        GpuBackendKind::Fake => BackendChoice::Fake {
            spec: args.fake_gpus,
            dir,
        },
        GpuBackendKind::Auto => BackendChoice::Auto {
            fake_fallback: args.fake_gpus,
            dir,
        },
    };
    let opts = Options {
        no_allocate: args.no_allocate,
        python: args.python,
    };
    let report = tokio::task::spawn_blocking(move || doctor::run(&choice, &opts)).await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print(&report);
    }
    Ok(if report.ok { 0 } else { 1 })
}

fn print(report: &Report) {
    outln!("headroom doctor: {}", report.backend);
    for c in &report.checks {
        let status = match c.status {
            Status::Fail => "FAIL",
            other => other.as_str(),
        };
        outln!("  {status:<11}  {:<16}  {}", c.name, c.detail);
        outln!("  {:<11}  {:<16}  -> {}", "", "", c.meaning);
    }
    let failed = report
        .checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .count();
    if failed == 0 {
        outln!("no check failed");
    } else {
        outln!("{failed} check(s) failed");
    }
}
