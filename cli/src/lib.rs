//! The `headroom` command line: user commands over the REST API, and `headroom up`.
//!
//! # Layout
//! - here: the commands (`clap`) and what each does, over `client::Api`;
//! - `client` (the shared typed client with the CLI's token and server), `config` (the CLI's
//!   settings file), `output` (tables, JSON, progress);
//! - `up`: the coordinator, an agent and a sample experiment in one process, on SQLite;
//! - `doctor`: the node checks, printed;
//! - `node`: `up` and `doctor` run in the second binary, `headroom-node` (`src/bin/`), which
//!   holds the coordinator, the agent and the attempt supervisors; `headroom` (`main.rs`)
//!   holds the client's commands only and becomes `headroom-node` for those two;
//! - `alerts`: subscriptions to alerts and their deliveries;
//! - `simulate`: an experiment replayed under other GPUs, plans and policies;
//! - `submit` (a spec sent, with `source`: where its jobs run from, their working
//!   directory, git state, environment and code bundle).
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand};
use headroom_shared::api::Role;
use headroom_shared::client::BearerToken;
use headroom_shared::{ExperimentId, JobId};

/// `println!` for what a command prints: a reader that went away (`headroom ls | head -1`)
/// ends the command quietly, as it ends `ls`, rather than with a panic.
macro_rules! outln {
    () => { $crate::stdout_text(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::stdout_text(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!`, as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdout_text(format_args!($($arg)*)) };
}

pub mod alerts;
pub mod client;
pub mod config;
pub mod doctor;
pub mod node;
pub mod output;
pub mod simulate;
pub mod source;
pub mod submit;
pub use submit::{SubmitHow, read_spec, submit};
pub mod up;

use client::Api;
use output::Format;

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7420";

#[derive(Parser, Debug)]
#[command(
    name = "headroom",
    version = node::VERSION,
    about = "Run experiment matrices on GPUs: packed by plan and memory, cleaned up completely"
)]
pub struct Cli {
    /// Coordinator URL.
    #[arg(long, global = true, env = "HEADROOM_SERVER", default_value = DEFAULT_SERVER)]
    pub server: String,
    /// Bearer token, for a coordinator that requires one (`headroom token create`).
    #[arg(long, global = true, env = "HEADROOM_TOKEN", hide_env_values = true)]
    pub token: Option<BearerToken>,
    /// A file holding the token (first line), kept out of shell history and `ps`.
    #[arg(
        long,
        global = true,
        env = "HEADROOM_TOKEN_FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,
    /// A PEM file of certificates to trust for an `https://` coordinator, beside the system's
    /// (a lab's own CA, a proxy's self-signed certificate).
    #[arg(long, global = true, env = "HEADROOM_CA_FILE")]
    pub ca_file: Option<PathBuf>,
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
        /// Run every job from a bundle of the code as it is now (`code: snapshot`): on any
        /// node, whatever changes in the checkout afterwards.
        #[arg(long)]
        snapshot: bool,
        /// `table`, or `json`: the API's answer (`experiment`, `name`, `jobs`, `seed`, ...),
        /// for scripts; with `--wait`, progress goes to standard error only.
        #[arg(long, value_enum, default_value_t)]
        output: Format,
    },
    /// List jobs.
    Ls {
        /// Experiment id or name.
        #[arg(long, short)]
        experiment: Option<String>,
        /// Only jobs in this state (queued, running, failed, ...).
        #[arg(long, short)]
        state: Option<String>,
        /// `table`, or `json`: the API's documents, with its field names.
        #[arg(long, value_enum, default_value_t)]
        output: Format,
    },
    /// List experiments with their progress.
    Experiments {
        /// `table`, or `json`: the API's documents, with its field names.
        #[arg(long, value_enum, default_value_t)]
        output: Format,
    },
    /// A job with its attempts.
    Show {
        /// The job: its id, a unique start of it (`0193ab7c`), or `EXPERIMENT/INDEX`.
        id: String,
        /// Also each attempt's GPU telemetry over its run: power, energy, temperature,
        /// utilization, memory, clocks and throttling.
        #[arg(long)]
        telemetry: bool,
        /// `table`, or `json`: the API's documents, with its field names.
        #[arg(long, value_enum, default_value_t)]
        output: Format,
    },
    /// The log of a job's latest attempt (or of an attempt).
    Logs {
        /// The job (its id, a unique start of it, or `EXPERIMENT/INDEX`) or an attempt's id.
        id: String,
        /// Follow the log until the attempt ends.
        #[arg(long, short)]
        follow: bool,
        /// Only the last N lines (then follow, with `-f`).
        #[arg(long, short = 'n', value_name = "N")]
        tail: Option<usize>,
        /// Attempt N of the job (1 is the first) instead of its latest.
        #[arg(long, value_name = "N")]
        attempt: Option<u32>,
    },
    /// Cancel a job (its id, a unique start of it, or `EXPERIMENT/INDEX`), or every unfinished
    /// job of an experiment (id or name).
    Cancel {
        id: String,
        /// Instead of cancelling: stop the running job(s) after their `checkpoint` signal and
        /// queue them again, without spending an attempt.
        #[arg(long)]
        requeue: bool,
    },
    /// Run a finished job once more (its id, a unique start of it, or `EXPERIMENT/INDEX`), or
    /// every failed job of an experiment (id or name) in one request.
    Retry {
        id: String,
        /// With a job: also the jobs of its study that wait for it (`after`), on down, that
        /// have ended (cancelled when it failed, say).
        #[arg(long)]
        cascade: bool,
    },
    /// Nodes, their GPUs, memory and slots in use.
    Nodes {
        /// `table`, or `json`: the API's documents, with its field names.
        #[arg(long, value_enum, default_value_t)]
        output: Format,
    },
    /// Tokens and roles (admins): create, list, revoke; hash one for a tokens file.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Alerts sent to a webhook or by mail: experiment ended, failures in a row, GPU
    /// quarantined, node lost, job pending long, pruned or preempted. Without a subcommand:
    /// the subscriptions and their deliveries (`ls`).
    Alerts {
        #[command(subcommand)]
        command: Option<alerts::AlertsCommand>,
    },
    /// Users (admins): who they are, their role, the Unix user their jobs run as.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Print a shell completion script, e.g. `headroom completions bash > /etc/bash_completion.d/headroom`.
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff), e.g. `headroom man > ~/.local/share/man/man1/headroom.1`;
    /// with `--dir`, one page per command (`headroom-submit.1`, ...) written there.
    Man {
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
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
    /// Check this node for headroom: driver, NVML readings (energy counter, power,
    /// temperature, clocks, throttle reasons), process listing and pid mapping, persistence
    /// and MIG, cgroups, and an allocation on each GPU and its release.
    Doctor(doctor::DoctorArgs),
    /// Wait for an experiment (or everything) to finish, with a progress bar.
    Wait {
        /// Experiment id or name; all jobs when left out.
        experiment: Option<String>,
    },
    /// Replay a finished experiment's jobs (their durations and peak memory) on other GPUs
    /// and another plan, under each packing policy: exclusive, plan only, and headroom's.
    Simulate(simulate::SimulateArgs),
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
        /// Leave out attempts that are contaminated (another process used their GPU),
        /// shared their GPU with another attempt, saw ghost memory, were throttled
        /// (thermal or power clock slowdown), whose figures do not cover their whole run,
        /// and those that ran on GPUs whose throttle reasons could not be read. Failed
        /// attempts stay: filter them by the `success` column.
        #[arg(long)]
        clean_only: bool,
    },
    /// What each user (or experiment) used: GPU-hours, GiB-hours of reserved GPU memory,
    /// energy (all, and of clean runs), jobs by end state; then every user's fair-share
    /// standing (the lowest goes first).
    Usage {
        /// How far back: `30d`, `12h`.
        #[arg(long, default_value = "30d")]
        since: String,
        #[arg(long, value_enum, default_value_t)]
        by: headroom_shared::api::usage::UsageBy,
        #[arg(long, value_enum, default_value_t)]
        output: Format,
    },
}

/// The commands `headroom-node` runs, by name: `headroom` hands them over before reading
/// their config file ([`parse_client_args`]).
pub const NODE_COMMANDS: &[&str] = &["up", "doctor"];

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a token; its secret is printed this once (the coordinator keeps a hash).
    Create {
        /// Who holds it (`alice`, `gpu-node-3`); runs they submit record this name.
        #[arg(long)]
        name: String,
        /// admin, user, agent or join.
        #[arg(long)]
        role: Role,
        /// How long it works (`90d`, `12h`); never expires when left out. The credentials a
        /// join token makes expire with it.
        #[arg(long)]
        expires_in: Option<String>,
        /// A join token's nodes, required for one: names and patterns, comma-separated
        /// (`gpu-*,dgx-a`; `*` any run of characters, `?` one).
        #[arg(long)]
        nodes: Option<String>,
        /// `table`, or `json`: the API's documents, with its field names.
        #[arg(long, value_enum, default_value_t)]
        output: Format,
    },
    /// List the tokens the coordinator keeps (never their secrets).
    Ls {
        /// `table`, or `json`: the API's documents, with its field names.
        #[arg(long, value_enum, default_value_t)]
        output: Format,
    },
    /// Revoke a token by its id (`token ls`); it stops working at once.
    Revoke { id: String },
    /// Read a token from standard input and print its argon2 hash, for `--tokens-file`.
    Hash,
}

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Create a user, or change its Unix user, share and caps: `headroom user create alice
    /// --unix-user alice --share 2 --max-gpus 4` (each run sets them all).
    /// Its tokens (`token create --name alice`) act as it; where an agent runs as root, its
    /// jobs run as the Unix user (never root unless `--allow-root`).
    Create {
        name: String,
        /// admin, user or agent (fixed once the user exists).
        #[arg(long, default_value = "user")]
        role: Role,
        /// The Unix user its jobs run as on the nodes.
        #[arg(long)]
        unix_user: Option<String>,
        /// Let its jobs run as root (only with `--unix-user root`).
        #[arg(long)]
        allow_root: bool,
        /// Weight in fair share: a user of share 2 is due twice the GPU memory-time of one
        /// of share 1.
        #[arg(long, default_value_t = 1)]
        share: u32,
        /// The most of their jobs leased or running at once.
        #[arg(long)]
        max_jobs: Option<u32>,
        /// The most GPUs their jobs hold at once.
        #[arg(long)]
        max_gpus: Option<u32>,
        /// The most GPU memory their jobs reserve at once, e.g. `80GiB`.
        #[arg(long)]
        max_gpu_memory: Option<headroom_shared::MemSize>,
    },
    /// List users.
    Ls {
        #[arg(long, value_enum, default_value_t)]
        output: Format,
    },
}

#[derive(Subcommand, Debug)]
pub enum NodeCommand {
    /// Lift a GPU's quarantine after looking at what was left on it (`headroom nodes`).
    Release { node: String, gpu: u32 },
    /// Let another agent register as this node now, when its live agent is gone for good
    /// (its running attempts are recorded lost when the next agent registers).
    Takeover { node: String },
}

#[derive(Subcommand, Debug)]
pub enum PlanCommand {
    /// Set a node's plan, e.g. `headroom plan set gpu-box "2,2,1,1"`; applies to new placements at once.
    Set { node: String, plan: String },
}

pub use config::{Parsed, parse_args, parse_client_args};

/// The runtime `headroom-node` runs a command on: `up` serves a coordinator and an agent on
/// every core; the others make a few requests, on this thread (worker threads would cost a
/// short command a good part of its start).
pub fn runtime_for(command: &Command) -> std::io::Result<tokio::runtime::Runtime> {
    match command {
        Command::Up(_) => tokio::runtime::Runtime::new(),
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    }
}

/// Exits with a command's code, or prints its error and exits 1: both binaries end this way.
pub fn exit_with(result: Result<i32>) -> ! {
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) if is_broken_pipe(&e) => std::process::exit(BROKEN_PIPE_EXIT),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// How a command whose reader went away ends: as a process SIGPIPE killed (128 + 13).
const BROKEN_PIPE_EXIT: i32 = 141;

/// `wait`, `submit --wait` and `up --run` when some job did not succeed (failed or was
/// cancelled): not 1 (an error of the command) nor 2 (clap's bad usage).
pub const JOBS_FAILED_EXIT: i32 = 3;

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Writes what a command prints to standard output (see [`outln!`]).
pub fn stdout_text(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(text).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(BROKEN_PIPE_EXIT);
        }
        eprintln!("error: writing to standard output: {e}");
        std::process::exit(1);
    }
}

/// The token a command acts with: `--token`, else `--token-file`, else the one a local
/// `headroom up` of this account left for this server (with that file, for what a refusal
/// says).
fn token_of(cli: &Cli) -> Result<(Option<BearerToken>, Option<PathBuf>)> {
    Ok(match (&cli.token, &cli.token_file) {
        (Some(t), _) => (Some(t.clone()), None),
        (None, Some(path)) => (Some(client::read_token_file(path)?), None),
        (None, None) => headroom_shared::secret::read_local_token(&cli.server)
            .and_then(|(t, file)| Some((t.parse().ok()?, file)))
            .map_or((None, None), |(t, file)| (Some(t), Some(file))),
    })
}

/// The token `up --run` submits with besides its own admin: `--token` or `--token-file` on
/// its command line. It submits to the coordinator it starts, so a token left for `--server`
/// (another coordinator's, or a killed `up`'s) is not one of its, nor what `HEADROOM_TOKEN` or
/// `HEADROOM_TOKEN_FILE` hold (the server a shell is set up for).
fn token_for_up(cli: &Cli, args: &up::UpArgs) -> Result<Option<BearerToken>> {
    if args.run.is_none() {
        return Ok(None);
    }
    let from_env =
        |var: &str, given: &std::ffi::OsStr| std::env::var_os(var).as_deref() == Some(given);
    if let Some(t) = &cli.token
        && !from_env("HEADROOM_TOKEN", t.expose().as_ref())
    {
        return Ok(Some(t.clone()));
    }
    match &cli.token_file {
        Some(path) if !from_env("HEADROOM_TOKEN_FILE", path.as_os_str()) => {
            Ok(Some(client::read_token_file(path)?))
        }
        _ => Ok(None),
    }
}

/// `headroom`: the client's commands. `up` and `doctor` are `headroom-node`'s ([`run_node`]):
/// `headroom` becomes it ([`node::exec`]), so that a client command loads none of their code.
pub async fn run(cli: Cli) -> Result<i32> {
    let (token, left_by_up) = token_of(&cli)?;
    let api = Api::new_with(&cli.server, cli.ca_file.as_deref())?
        .with_token(token.as_ref().map(BearerToken::expose))?;
    match cli.command {
        Command::Completions { shell } => {
            // Into a buffer first: the generator panics when its writer fails (`| head`).
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "headroom", &mut script);
            std::io::Write::write_all(&mut std::io::stdout(), &script)
                .context("writing the completion script")?;
            Ok(0)
        }
        Command::Man { dir } => {
            let cmd = <Cli as clap::CommandFactory>::command();
            match dir {
                Some(dir) => {
                    std::fs::create_dir_all(&dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                    clap_mangen::generate_to(cmd, &dir)
                        .with_context(|| format!("writing manual pages to {}", dir.display()))?;
                }
                None => {
                    let mut page = Vec::new();
                    clap_mangen::Man::new(cmd).render(&mut page)?;
                    std::io::Write::write_all(&mut std::io::stdout(), &page)
                        .context("writing the manual page")?;
                }
            }
            Ok(0)
        }
        Command::Token {
            command: TokenCommand::Hash,
        } => token_hash(),
        command => command_on(&api, command)
            .await
            .map_err(|e| client::with_hint(e, &api, left_by_up.as_deref())),
    }
}

/// `headroom-node`: `up` and `doctor`, and every other command as [`run`] does it.
pub async fn run_node(cli: Cli) -> Result<i32> {
    let token = match &cli.command {
        Command::Up(args) => token_for_up(&cli, args)?,
        _ => None,
    };
    match cli.command {
        Command::Up(args) => up::run(*args, token).await,
        Command::Doctor(args) => doctor::run(args).await,
        _ => run(cli).await,
    }
}

/// `token hash`: the argon2 hash of a token read from standard input.
/// Reads a `hr_<id>_<secret>` token and prints its tokens-file fields (`id`, `token_hash`):
/// the coordinator finds the entry by id, so a wrong token costs one hash at most.
fn token_hash() -> Result<i32> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading the token from standard input")?;
    let token = line.trim();
    let how = "make one with `echo hr_$(openssl rand -hex 8)_$(openssl rand -hex 24)`";
    let Some((id, secret)) = token
        .strip_prefix(headroom_coordinator::auth::TOKEN_PREFIX)
        .and_then(|t| t.split_once('_'))
    else {
        bail!("a tokens-file token looks like hr_<id>_<secret>: {how}");
    };
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric()) {
        bail!("the token's id (`{id}`) must be letters and digits: {how}");
    }
    if secret.chars().count() < headroom_coordinator::auth::MIN_SECRET_LEN {
        bail!(
            "the token's secret needs at least {} characters: {how}",
            headroom_coordinator::auth::MIN_SECRET_LEN
        );
    }
    let hash = headroom_coordinator::auth::hash_secret(token).map_err(anyhow::Error::msg)?;
    outln!("id = \"{id}\"\ntoken_hash = \"{hash}\"");
    Ok(0)
}

async fn command_on(api: &Api, command: Command) -> Result<i32> {
    match command {
        Command::Up(_) | Command::Doctor(_) | Command::Completions { .. } | Command::Man { .. } => {
            unreachable_command()?
        }
        Command::Submit {
            file,
            wait,
            dry_run,
            snapshot,
            seed,
            output: format,
        } => {
            let how = SubmitHow {
                wait,
                dry_run,
                seed,
                snapshot,
                format,
            };
            return submit(api, &file, how).await;
        }
        Command::Ls {
            experiment,
            state,
            output: format,
        } => {
            let exp = resolve_experiment(api, experiment.as_deref()).await?;
            let jobs = api.jobs(exp, state.as_deref()).await?;
            match format {
                Format::Table => output::jobs_table(&jobs),
                Format::Json => output::json(&jobs)?,
            }
        }
        Command::Experiments { output: format } => {
            let exps = api.experiments().await?;
            match format {
                Format::Table => output::experiments_table(&exps),
                Format::Json => output::json(&exps)?,
            }
        }
        Command::Show {
            id,
            telemetry,
            output: format,
        } => {
            let job = api.job(resolve_job(api, &id).await?).await?;
            let mut series = Vec::new();
            if telemetry {
                for a in &job.attempts_detail {
                    series.push((a.number, api.attempt_telemetry(a.id).await?));
                }
            }
            match format {
                Format::Table => {
                    let exp = api.experiment(job.summary.experiment).await?;
                    output::job_detail(&job, &exp);
                    for (number, t) in &series {
                        output::attempt_telemetry(*number, t);
                    }
                }
                // With --telemetry: the job and its attempts' series, each as the API gives it.
                Format::Json if telemetry => output::json(&serde_json::json!({
                    "job": job,
                    "telemetry": series.iter().map(|(_, t)| t).collect::<Vec<_>>(),
                }))?,
                Format::Json => output::json(&job)?,
            }
        }
        Command::Logs {
            id,
            follow,
            tail,
            attempt,
        } => output::logs(api, &id, follow, attempt, tail).await?,
        Command::Cancel { id, requeue: true } => match job_or_experiment(api, &id).await? {
            Target::Job(job) => {
                let r = api.requeue_job(job).await?;
                if r.requeued == 0 {
                    outln!("job {job} runs no attempt: nothing to requeue");
                } else {
                    outln!(
                        "job {job} requeued: it stops after its checkpoint signal and runs again"
                    );
                }
            }
            Target::Experiment(exp, name) => {
                let r = api.requeue_experiment(exp).await?;
                outln!(
                    "requeued {} running job{} of experiment {name} ({exp}): they stop after \
                     their checkpoint signal and run again",
                    r.requeued,
                    if r.requeued == 1 { "" } else { "s" }
                );
            }
        },
        Command::Cancel { id, requeue: false } => match job_or_experiment(api, &id).await? {
            Target::Job(job) => {
                let r = api.cancel_job(job).await?;
                outln!("cancelled {} job", r.cancelled);
            }
            Target::Experiment(exp, name) => {
                let r = api.cancel_experiment(exp).await?;
                outln!(
                    "cancelled {} jobs of experiment {name} ({exp})",
                    r.cancelled
                );
            }
        },
        Command::Retry { id, cascade } => match job_or_experiment(api, &id).await? {
            Target::Job(job) if cascade => {
                let r = api
                    .retry_with(job, &headroom_shared::api::RetryQuery { cascade })
                    .await?;
                outln!(
                    "job {job} and {} job{} waiting for it queued for another attempt",
                    r.retried.len().saturating_sub(1),
                    if r.retried.len() == 2 { "" } else { "s" }
                );
            }
            Target::Job(job) => {
                api.retry(job).await?;
                outln!("job {job} queued for another attempt");
            }
            Target::Experiment(..) if cascade => {
                bail!("--cascade takes a job: the one whose dependants should run again too")
            }
            Target::Experiment(exp, name) => {
                let r = api.retry_failed(exp).await?;
                outln!(
                    "{} failed job{} of experiment {name} ({exp}) queued for another attempt",
                    r.retried.len(),
                    if r.retried.len() == 1 { "" } else { "s" }
                );
            }
        },
        Command::Nodes { output: format } => {
            let nodes = api.nodes().await?;
            match format {
                Format::Table => output::nodes_table(&nodes),
                Format::Json => output::json(&nodes)?,
            }
        }
        Command::Token { command } => token(api, command).await?,
        Command::Alerts { command } => alerts::run(api, command).await?,
        Command::Plan {
            command: PlanCommand::Set { node, plan },
        } => {
            let n = api.set_plan(&node, &plan).await?;
            outln!("node {} plan is now {}", n.name, n.plan);
        }
        Command::Node {
            command: NodeCommand::Release { node, gpu },
        } => {
            let n = api.release_gpu(&node, gpu).await?;
            outln!("node {node} GPU {gpu}: {n} quarantine(s) lifted");
        }
        Command::User {
            command:
                UserCommand::Create {
                    name,
                    role,
                    unix_user,
                    allow_root,
                    share,
                    max_jobs,
                    max_gpus,
                    max_gpu_memory,
                },
        } => {
            let req = headroom_shared::api::PutUserRequest {
                role,
                unix_user,
                allow_root,
                share,
                max_jobs,
                max_gpus,
                max_gpu_mib: max_gpu_memory.map(|m| m.mib),
            };
            let u = api.put_user(&name, &req).await?;
            outln!(
                "user {} (role {}): jobs run as {}; share {}, caps {}",
                u.name,
                u.role,
                u.unix_user.as_deref().unwrap_or("the agents' default user"),
                u.limits.share,
                output::caps_text(&u.limits)
            );
        }
        Command::User {
            command: UserCommand::Ls { output: format },
        } => {
            let users = api.users().await?;
            match format {
                Format::Table => output::users_table(&users),
                Format::Json => output::json(&users)?,
            }
        }
        Command::Node {
            command: NodeCommand::Takeover { node },
        } => {
            api.takeover(&node).await?;
            outln!("node {node}: another agent may register as it now");
        }
        Command::Wait { experiment } => {
            let exp = resolve_experiment(api, experiment.as_deref()).await?;
            return output::wait(api, exp, None, true).await;
        }
        Command::Simulate(args) => simulate::run(api, args).await?,
        Command::Usage { since, by, output } => {
            let q = headroom_shared::api::usage::UsageQuery {
                since: Some(since),
                by,
            };
            let report = api.usage(&q).await?;
            match output {
                Format::Table => output::usage_table(&report),
                Format::Json => output::json(&report)?,
            }
        }
        Command::Export {
            csv: _,
            experiment,
            output: out,
            clean_only,
        } => {
            let exp = resolve_experiment(api, experiment.as_deref()).await?;
            let text = api.export_csv(exp, clean_only).await?;
            match out {
                Some(path) => {
                    std::fs::write(&path, text)
                        .with_context(|| format!("writing {}", path.display()))?;
                }
                None => out!("{text}"),
            }
        }
    }
    Ok(0)
}

/// A command `run` handles itself, or `headroom-node`'s (`run_node`).
fn unreachable_command() -> Result<()> {
    bail!("internal: command dispatched to the wrong place (`up` and `doctor` are headroom-node's)")
}

async fn token(api: &Api, command: TokenCommand) -> Result<()> {
    match command {
        TokenCommand::Create {
            name,
            role,
            expires_in,
            nodes,
            output: format,
        } => {
            let nodes = nodes
                .as_deref()
                .map(headroom_coordinator::joins::parse_list);
            let t = api
                .create_token(&headroom_shared::api::CreateTokenRequest {
                    name,
                    role,
                    expires_in,
                    nodes,
                })
                .await?;
            match format {
                Format::Json => output::json(&t)?,
                Format::Table => {
                    outln!("{}", t.token);
                    eprintln!(
                        "token {} for {} (role {}): shown this once, keep it secret; \
                         revoke with `headroom token revoke {}`",
                        t.view.id, t.view.name, t.view.role, t.view.id
                    );
                }
            }
        }
        TokenCommand::Ls { output: format } => {
            let tokens = api.tokens().await?;
            match format {
                Format::Table => output::tokens_table(&tokens),
                Format::Json => output::json(&tokens)?,
            }
        }
        TokenCommand::Revoke { id } => {
            let t = api.revoke_token(&id).await?;
            outln!("token {} ({}, role {}) revoked", t.id, t.name, t.role);
        }
        TokenCommand::Hash => token_hash().map(|_| ())?,
    }
    Ok(())
}

/// The fewest characters of a job id taken as a short id.
const SHORT_ID_MIN: usize = 4;

/// What `cancel` and `retry` act on: one job, or an experiment's jobs (with its name).
enum Target {
    Job(JobId),
    Experiment(ExperimentId, String),
}

/// A job (its id, `EXPERIMENT/INDEX`), else an experiment (id or name), else a short job id.
async fn job_or_experiment(api: &Api, id: &str) -> Result<Target> {
    let job = match id.parse::<JobId>() {
        Ok(job) => api.find_job(job).await?.map(|_| job),
        Err(_) if id.contains('/') => Some(resolve_job(api, id).await?),
        Err(_) => None,
    };
    if let Some(job) = job {
        return Ok(Target::Job(job));
    }
    match resolve_experiment(api, Some(id)).await {
        Ok(Some(exp)) => {
            let name = api
                .experiment(exp)
                .await
                .with_context(|| format!("no job or experiment `{id}`"))?
                .name;
            Ok(Target::Experiment(exp, name))
        }
        Ok(None) => Err(anyhow!("no job or experiment `{id}`")),
        Err(e) => match resolve_job(api, id).await {
            Ok(job) => Ok(Target::Job(job)),
            // What looks like the start of a job id is answered as one (`give more of it`).
            Err(job) if headroom_shared::api::bounds::ID_PREFIX.accepts(id) => Err(job),
            Err(_) => Err(e.context(format!("no job or experiment `{id}`"))),
        },
    }
}

/// A job given by its id, by a unique start of it (as git takes a short commit id), or as
/// `EXPERIMENT/INDEX` (the experiment by id or name, the job's index in it).
pub async fn resolve_job(api: &Api, given: &str) -> Result<JobId> {
    use headroom_shared::api::JobsQuery;
    if let Ok(id) = given.parse::<JobId>() {
        return Ok(id);
    }
    if let Some((exp, index)) = given.rsplit_once('/') {
        let index: u32 = index.parse().map_err(|_| {
            anyhow!("`{given}`: after the `/` comes the job's index in its experiment (0, 1, ...)")
        })?;
        let exp = resolve_experiment(api, Some(exp))
            .await?
            .ok_or_else(|| anyhow!("`{given}`: no experiment"))?;
        let found = api
            .jobs_where(&JobsQuery {
                experiment: Some(exp.to_string()),
                index: Some(index),
                ..Default::default()
            })
            .await?;
        return found
            .first()
            .map(|j| j.id)
            .ok_or_else(|| anyhow!("experiment {exp} has no job of index {index}"));
    }
    let prefix = given.to_ascii_lowercase();
    let hex = prefix.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    if !hex || prefix.len() < SHORT_ID_MIN {
        bail!(
            "`{given}` is not a job: give its id, at least {SHORT_ID_MIN} of its first characters, \
             or EXPERIMENT/INDEX"
        );
    }
    let found = api
        .jobs_where(&JobsQuery {
            id_prefix: Some(prefix),
            limit: Some(5),
            ..Default::default()
        })
        .await?;
    match found.as_slice() {
        [] => bail!("no job id starts with `{given}`"),
        [one] => Ok(one.id),
        several => bail!(
            "`{given}` starts {} job ids ({}): give more of it",
            if several.len() >= 5 {
                "at least 5"
            } else {
                "several"
            },
            several
                .iter()
                .map(|j| j.id.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
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
