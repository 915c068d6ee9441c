//! The `headroom` command line: user commands over the REST API, and `headroom up`.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand};
use headroom_shared::api::SubmitRequest;
use headroom_shared::{ExperimentId, JobId};

pub mod client;
pub mod config;
pub mod output;
pub mod up;

use client::Api;

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7420";

#[derive(Parser, Debug)]
#[command(
    name = "headroom",
    version,
    about = "Run experiment matrices on GPUs: packed by plan and memory, cleaned up completely"
)]
pub struct Cli {
    /// Coordinator URL.
    #[arg(long, global = true, env = "HEADROOM_SERVER", default_value = DEFAULT_SERVER)]
    pub server: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Coordinator and a local agent in one process, on the embedded store.
    Up(Box<up::UpArgs>),
    /// Submit an experiment spec (YAML or JSON).
    Submit {
        file: PathBuf,
        /// Wait for every job to end, showing progress.
        #[arg(long)]
        wait: bool,
        /// Print the expanded jobs; store nothing.
        #[arg(long)]
        dry_run: bool,
        /// Seed for `mutate` draws (overrides the spec's).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// List jobs.
    Ls {
        /// Experiment id or name.
        #[arg(long, short)]
        experiment: Option<String>,
        /// Only jobs in this state (queued, running, failed, ...).
        #[arg(long, short)]
        state: Option<String>,
    },
    /// List experiments with their progress.
    Experiments,
    /// A job with its attempts.
    Show {
        id: JobId,
        /// Also each attempt's GPU telemetry over its run: power, energy, temperature,
        /// utilization, memory, clocks and throttling.
        #[arg(long)]
        telemetry: bool,
    },
    /// The log of a job's latest attempt (or of an attempt).
    Logs {
        id: String,
        /// Follow the log until the attempt ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Cancel a job, or every unfinished job of an experiment (id or name).
    Cancel { id: String },
    /// Run a finished job once more.
    Retry { id: JobId },
    /// Nodes, their GPUs, memory and slots in use.
    Nodes,
    /// Concurrency plans.
    Plan {
        #[command(subcommand)]
        command: PlanCommand,
    },
    /// Node maintenance.
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// Wait for an experiment (or everything) to finish, with a progress bar.
    Wait {
        /// Experiment id or name; all jobs when left out.
        experiment: Option<String>,
    },
    /// Export attempts as CSV (one row per attempt, parameters as columns).
    Export {
        /// CSV is the one format (the flag is accepted for clarity).
        #[arg(long)]
        csv: bool,
        #[arg(long, short)]
        experiment: Option<String>,
        /// Write to this file instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum NodeCommand {
    /// Lift a GPU's quarantine after looking at what was left on it (`headroom nodes`).
    Release { node: String, gpu: u32 },
}

#[derive(Subcommand, Debug)]
pub enum PlanCommand {
    /// Set a node's plan, e.g. `headroom plan set gpu-box "2,2,1,1"`; applies to new placements at once.
    Set { node: String, plan: String },
}

pub use config::parse_args;

pub async fn run(cli: Cli) -> Result<i32> {
    let api = Api::new(&cli.server)?;
    command(&api, cli.command).await.map_err(client::with_hint)
}

async fn command(api: &Api, command: Command) -> Result<i32> {
    match command {
        Command::Up(args) => return up::run(*args).await,
        Command::Submit {
            file,
            wait,
            dry_run,
            seed,
        } => return submit(api, &file, wait, dry_run, seed).await,
        Command::Ls { experiment, state } => {
            let exp = resolve_experiment(api, experiment.as_deref()).await?;
            output::jobs_table(&api.jobs(exp, state.as_deref()).await?);
        }
        Command::Experiments => output::experiments_table(&api.experiments().await?),
        Command::Show { id, telemetry } => {
            let job = api.job(id).await?;
            output::job_detail(&job);
            if telemetry {
                for a in &job.attempts_detail {
                    let t = api.attempt_telemetry(a.id).await?;
                    output::attempt_telemetry(a.number, &t);
                }
            }
        }
        Command::Logs { id, follow } => output::logs(api, &id, follow).await?,
        Command::Cancel { id } => {
            if let Ok(job) = id.parse::<JobId>()
                && api.find_job(job).await?.is_some()
            {
                let r = api.cancel_job(job).await?;
                println!("cancelled {} job", r.cancelled);
                return Ok(0);
            }
            let exp = resolve_experiment(api, Some(&id))
                .await?
                .ok_or_else(|| anyhow!("no job or experiment `{id}`"))?;
            let r = api.cancel_experiment(exp).await?;
            println!("cancelled {} jobs of experiment {exp}", r.cancelled);
        }
        Command::Retry { id } => {
            api.retry(id).await?;
            println!("job {id} queued for another attempt");
        }
        Command::Nodes => output::nodes_table(&api.nodes().await?),
        Command::Plan {
            command: PlanCommand::Set { node, plan },
        } => {
            let n = api.set_plan(&node, &plan).await?;
            println!("node {} plan is now {}", n.name, n.plan);
        }
        Command::Node {
            command: NodeCommand::Release { node, gpu },
        } => {
            let n = api.release_gpu(&node, gpu).await?;
            println!("node {node} GPU {gpu}: {n} quarantine(s) lifted");
        }
        Command::Wait { experiment } => {
            let exp = resolve_experiment(api, experiment.as_deref()).await?;
            return output::wait(api, exp).await;
        }
        Command::Export {
            csv: _,
            experiment,
            output: out,
        } => {
            let exp = resolve_experiment(api, experiment.as_deref()).await?;
            let text = api.export_csv(exp).await?;
            match out {
                Some(path) => {
                    std::fs::write(&path, text)
                        .with_context(|| format!("writing {}", path.display()))?;
                }
                None => print!("{text}"),
            }
        }
    }
    Ok(0)
}

/// Reads a spec file (YAML or JSON) into the JSON document the API takes.
pub fn read_spec(file: &std::path::Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    serde_saphyr::from_str(&text)
        .map_err(|e| anyhow!("{}: not valid YAML/JSON: {e}", file.display()))
}

pub async fn submit(
    api: &Api,
    file: &std::path::Path,
    wait: bool,
    dry_run: bool,
    seed: Option<u64>,
) -> Result<i32> {
    let req = SubmitRequest {
        spec: read_spec(file)?,
        seed,
        dry_run,
    };
    let resp = api
        .submit(&req)
        .await
        .with_context(|| format!("{} was refused", file.display()))?;
    output::warnings(&resp);
    if dry_run {
        output::preview(&resp);
        return Ok(0);
    }
    let Some(exp) = resp.experiment else {
        bail!("the coordinator stored nothing");
    };
    println!(
        "submitted experiment {} ({}): {} jobs, seed {}",
        resp.name, exp, resp.jobs, resp.seed
    );
    if wait {
        return output::wait(api, Some(exp)).await;
    }
    Ok(0)
}

/// An experiment given by id or by name (the newest of that name).
pub async fn resolve_experiment(api: &Api, given: Option<&str>) -> Result<Option<ExperimentId>> {
    let Some(given) = given else { return Ok(None) };
    if let Ok(id) = given.parse::<ExperimentId>() {
        return Ok(Some(id));
    }
    api.experiments()
        .await?
        .into_iter()
        .rev()
        .find(|e| e.name == given)
        .map(|e| Some(e.id))
        .ok_or_else(|| anyhow!("no experiment named `{given}`"))
}
