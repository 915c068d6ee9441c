//! `headroom-bench`: how fast a coordinator and one agent start and churn through jobs, on
//! the embedded SQLite store and on PostgreSQL, against the machine's raw process-spawn rate
//! measured in the same run (results are ratios and percentiles, not absolutes).
//!
//! cargo build --release --workspace --bins && target/release/headroom-bench [JOBS]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use headroom_integration_tests::{Postgres, Proc, block_on, client_for, free_port};
use headroom_shared::ExperimentId;
use headroom_shared::api::{Role, SubmitRequest};
use headroom_shared::client::Client;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Sequential spawn-and-wait of `true`: the floor any process launcher pays.
fn raw_spawn_rate(n: usize) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..n {
        Command::new("true").status().context("spawning true")?;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

struct Setup {
    api: Client,
    _coordinator: Proc,
    _agent: Proc,
}

/// The bootstrap admin token of the runs with tokens on.
const BENCH_ADMIN: &str = "bench-admin-token-0123456789";

/// `tokens`: the coordinator requires tokens (bootstrap admin; the agent gets a stored agent
/// token), so every claim, heartbeat and report goes through token checks.
fn start(dir: &Path, database_url: Option<&str>, tokens: bool) -> Result<Setup> {
    let port = free_port()?;
    let url = format!("http://127.0.0.1:{port}");
    let mut args = vec![
        "--listen".to_string(),
        format!("127.0.0.1:{port}"),
        "--data-dir".into(),
        dir.join("coord").display().to_string(),
    ];
    if let Some(db) = database_url {
        args.extend(["--database-url".to_string(), db.to_string()]);
    }
    if tokens {
        args.extend(["--admin-token".to_string(), BENCH_ADMIN.to_string()]);
    }
    let coordinator = Proc::start("headroom-coordinator", &args, dir.join("coord.log"))?;
    let api = client_for(&url)?.with_token(tokens.then_some(BENCH_ADMIN))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while block_on(api.health())?.is_err() {
        if Instant::now() > deadline {
            bail!("coordinator did not start: {}", coordinator.output());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut agent_args: Vec<String> = [
        "--coordinator",
        &url,
        "--node",
        "bench",
        "--gpu-backend",
        "fake",
        "--fake-gpus",
        "4x80GiB",
        "--plan",
        "16,16,16,16",
        "--kill-grace",
        "1s",
        "--data-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([dir.join("agent").display().to_string()])
    .collect();
    if tokens {
        let t = block_on(api.create_token("bench-agent", Role::Agent, None))??;
        agent_args.extend(["--agent-token".to_string(), t.token]);
    }
    let agent = Proc::start("headroom-agent", &agent_args, dir.join("agent.log"))?;
    while block_on(api.nodes())??.is_empty() {
        if Instant::now() > deadline {
            bail!("agent did not register: {}", agent.output());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Setup {
        api,
        _coordinator: coordinator,
        _agent: agent,
    })
}

fn submit(api: &Client, name: &str, runs: usize) -> Result<ExperimentId> {
    let req = SubmitRequest {
        spec: serde_json::json!({"name": name, "command": ["true"],
            "runs_per_config": runs, "resources": {"memory": "100MiB"}}),
        seed: None,
        dry_run: false,
    };
    let r = block_on(api.submit(&req))?.context("submit refused")?;
    r.experiment.context("stored")
}

fn wait_done(api: &Client, exp: ExperimentId) -> Result<()> {
    let mut after = None;
    loop {
        let p = block_on(api.progress_within(Some(exp), after, Duration::from_secs(2)))??;
        if p.counts.finished() == p.counts.total() {
            return Ok(());
        }
        after = Some(p.version);
    }
}

/// Per job: (submit -> lease, submit -> start) in ms.
fn latencies(api: &Client, exp: ExperimentId) -> Result<Vec<(f64, f64)>> {
    let jobs = block_on(api.jobs(Some(exp), None))??;
    let mut out = Vec::new();
    for j in jobs {
        let d = block_on(api.job(j.id))??;
        if let Some(a) = d.attempts_detail.first()
            && let Some(started) = a.started_at
        {
            let ms = |t: chrono::DateTime<chrono::Utc>| {
                (t - d.summary.created_at).num_microseconds().unwrap_or(0) as f64 / 1000.0
            };
            out.push((ms(a.leased_at), ms(started)));
        }
    }
    Ok(out)
}

struct Row {
    store: &'static str,
    claim: Vec<f64>,
    start: Vec<f64>,
    rate: f64,
}

fn measure(
    store: &'static str,
    database_url: Option<&str>,
    tokens: bool,
    jobs: usize,
) -> Result<Row> {
    let dir = tempfile::tempdir()?;
    let s = start(dir.path(), database_url, tokens)?;
    let (mut claim, mut start_ms) = (Vec::new(), Vec::new());
    for i in 0..40 {
        let exp = submit(&s.api, &format!("idle{i}"), 1)?;
        wait_done(&s.api, exp)?;
        for (c, st) in latencies(&s.api, exp)? {
            claim.push(c);
            start_ms.push(st);
        }
    }
    claim.sort_by(f64::total_cmp);
    start_ms.sort_by(f64::total_cmp);
    let t = Instant::now();
    let exp = submit(&s.api, "burst", jobs)?;
    wait_done(&s.api, exp)?;
    let rate = jobs as f64 / t.elapsed().as_secs_f64();
    Ok(Row {
        store,
        claim,
        start: start_ms,
        rate,
    })
}

fn main() -> Result<()> {
    let jobs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(400);
    let raw = raw_spawn_rate(jobs)?;
    // Tokens off and on in the order A B B A, so drift over the run weighs on both alike.
    let sqlite = measure("SQLite", None, false, jobs)?;
    let sqlite_tokens = measure("SQLite, tokens on", None, true, jobs)?;
    let tokens_again = measure("SQLite, tokens on", None, true, jobs)?;
    let sqlite_again = measure("SQLite", None, false, jobs)?;
    let pg = Postgres::start()?;
    let postgres = measure("PostgreSQL", Some(&pg.url()), false, jobs)?;

    println!("raw spawn+wait of `true`: {raw:.0}/s ({jobs} spawns)\n");
    println!(
        "| store | submit->lease p50 | p99 | submit->start p50 | p99 | {jobs} jobs of `true` | vs raw spawn |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for r in [
        &sqlite,
        &sqlite_tokens,
        &tokens_again,
        &sqlite_again,
        &postgres,
    ] {
        println!(
            "| {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.0}/s | {:.2} |",
            r.store,
            percentile(&r.claim, 0.5),
            percentile(&r.claim, 0.99),
            percentile(&r.start, 0.5),
            percentile(&r.start, 0.99),
            r.rate,
            r.rate / raw
        );
    }
    println!(
        "\ntokens on / off (SQLite, A B B A in one run): throughput {:.0} vs {:.0}/s = {:.2} \
         (second pair alone {:.2}), submit->start p50 {:.1} vs {:.1} ms",
        sqlite_tokens.rate + tokens_again.rate,
        sqlite.rate + sqlite_again.rate,
        (sqlite_tokens.rate + tokens_again.rate) / (sqlite.rate + sqlite_again.rate),
        tokens_again.rate / sqlite_again.rate,
        percentile(&tokens_again.start, 0.5),
        percentile(&sqlite_again.start, 0.5)
    );
    Ok(())
}
