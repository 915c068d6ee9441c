//! `headroom-bench`: how fast a coordinator and one agent start and churn through jobs, on
//! the embedded SQLite store and on PostgreSQL, against the machine's raw process-spawn rate
//! measured in the same run (results are ratios and percentiles, not absolutes).
//!
//! cargo build --release --workspace --bins && target/release/headroom-bench [JOBS] [--no-tokens]
//!
//! CPU per job (coordinator, agent, and the agent's children: attempt supervisors and the
//! jobs under them) is read from `/proc`, which machine load disturbs far less than rates.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use headroom_bench::suite::dispatch::raw_spawn_rate;
use headroom_bench::suite::percentile;
use headroom_bench::system::{
    agent_args, coordinator_args, submit, wait_done, wait_healthy, wait_registered,
};
use headroom_integration_tests::{
    Postgres, Proc, block_on, children_of, client_for, free_port, stat_fields,
};
use headroom_shared::ExperimentId;
use headroom_shared::api::Role;
use headroom_shared::client::Client;

struct Setup {
    api: Client,
    coordinator: Proc,
    agent: Proc,
}

/// CPU time in ms: of the coordinator, of the agent itself, and of the agent's children
/// (reaped ones, with what they reaped, and live ones: supervisors waiting for a lease).
#[derive(Clone, Copy, Default)]
struct Cpu {
    coordinator: f64,
    agent: f64,
    children: f64,
}

impl Cpu {
    fn read(s: &Setup) -> Self {
        let (c, a) = (s.coordinator.pid(), s.agent.pid());
        let (coordinator, _) = c.map(own_and_reaped).unwrap_or_default();
        let (agent, reaped) = a.map(own_and_reaped).unwrap_or_default();
        let live: f64 = a
            .map(|a| {
                children_of(a)
                    .into_iter()
                    .map(|p| {
                        let (own, reaped) = own_and_reaped(p);
                        own + reaped
                    })
                    .sum()
            })
            .unwrap_or_default();
        Self {
            coordinator,
            agent,
            children: reaped + live,
        }
    }

    fn per_job_since(self, before: Cpu, jobs: usize) -> Cpu {
        let n = jobs as f64;
        Cpu {
            coordinator: (self.coordinator - before.coordinator) / n,
            agent: (self.agent - before.agent) / n,
            children: (self.children - before.children) / n,
        }
    }

    fn total(self) -> f64 {
        self.coordinator + self.agent + self.children
    }
}

fn ticks_ms(f: &[String], range: std::ops::Range<usize>) -> f64 {
    // USER_HZ is 100 on Linux whatever the kernel's tick.
    f.get(range)
        .map(|v| v.iter().filter_map(|x| x.parse::<f64>().ok()).sum::<f64>() * 10.0)
        .unwrap_or_default()
}

/// (own CPU, CPU of the children it reaped) in ms.
fn own_and_reaped(pid: u32) -> (f64, f64) {
    stat_fields(pid).map_or((0.0, 0.0), |f| (ticks_ms(&f, 11..13), ticks_ms(&f, 13..15)))
}

/// Longest a run of the bench's jobs may take.
const WAIT: Duration = Duration::from_secs(900);

/// The bootstrap admin token of the runs with tokens on.
const BENCH_ADMIN: &str = "bench-admin-token-0123456789abcdef";

/// `tokens`: the coordinator requires tokens (bootstrap admin; the agent gets a stored agent
/// token), so every claim, heartbeat and report goes through token checks.
fn start(dir: &Path, database_url: Option<&str>, tokens: bool) -> Result<Setup> {
    let port = free_port()?;
    let url = format!("http://127.0.0.1:{port}");
    let mut args = coordinator_args(port, &dir.join("coord"), database_url);
    if tokens {
        args.extend(["--admin-token".to_string(), BENCH_ADMIN.to_string()]);
    }
    let coordinator = Proc::start("headroom-coordinator", &args, dir.join("coord.log"))?;
    let api = client_for(&url)?.with_token(tokens.then_some(BENCH_ADMIN))?;
    wait_healthy(&api, &coordinator)?;
    let mut agent_args = agent_args(&url, "4x80GiB", "16,16,16,16", &dir.join("agent"));
    if tokens {
        // An agent token is its node's: named after it, kept in a file (not in argv).
        let t = block_on(api.create_token(&headroom_shared::api::CreateTokenRequest {
            name: "bench".into(),
            role: Role::Agent,
            expires_in: None,
            nodes: None,
        }))??;
        let file = dir.join("agent-token");
        std::fs::write(&file, &t.token)?;
        agent_args.extend(["--agent-token-file".to_string(), file.display().to_string()]);
    }
    let agent = Proc::start("headroom-agent", &agent_args, dir.join("agent.log"))?;
    wait_registered(&api, &agent)?;
    Ok(Setup {
        api,
        coordinator,
        agent,
    })
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
    /// Per job of the burst.
    cpu: Cpu,
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
        let exp = submit(&s.api, &format!("idle{i}"), &["true"], 1)?;
        wait_done(&s.api, exp, WAIT)?;
        for (c, st) in latencies(&s.api, exp)? {
            claim.push(c);
            start_ms.push(st);
        }
    }
    claim.sort_by(f64::total_cmp);
    start_ms.sort_by(f64::total_cmp);
    let cpu_before = Cpu::read(&s);
    let t = Instant::now();
    let exp = submit(&s.api, "burst", &["true"], jobs)?;
    wait_done(&s.api, exp, WAIT)?;
    let rate = jobs as f64 / t.elapsed().as_secs_f64();
    // The last ends are reported before their supervisors finish exiting.
    std::thread::sleep(Duration::from_millis(500));
    let cpu = Cpu::read(&s).per_job_since(cpu_before, jobs);
    Ok(Row {
        store,
        claim,
        start: start_ms,
        rate,
        cpu,
    })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let jobs: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(400);
    // Without the token runs, this bench also drives builds from before tokens existed (put
    // it beside their binaries), for a comparison within one run.
    let tokens = !args.iter().any(|a| a == "--no-tokens");
    // Sequential spawn-and-wait: the floor any process launcher pays.
    let raw = raw_spawn_rate(jobs, 1)?;
    let sqlite = measure("SQLite", None, false, jobs)?;
    let pg = Postgres::start()?;
    let postgres = measure("PostgreSQL", Some(&pg.url()), false, jobs)?;
    let mut rows = vec![sqlite, postgres];
    if tokens {
        // Tokens off and on in the order A B B A, so drift over the run weighs on both alike.
        rows.push(measure("SQLite, tokens on", None, true, jobs)?);
        rows.push(measure("SQLite, tokens on", None, true, jobs)?);
        rows.push(measure("SQLite", None, false, jobs)?);
    }

    println!("raw spawn+wait of `true`: {raw:.0}/s ({jobs} spawns)\n");
    println!(
        "| store | submit->lease p50 | p99 | submit->start p50 | p99 | {jobs} jobs of `true` | vs raw spawn | CPU ms/job: coordinator + agent + supervisors and jobs |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.0}/s | {:.2} | {:.2} + {:.2} + {:.2} = {:.2} |",
            r.store,
            percentile(&r.claim, 0.5),
            percentile(&r.claim, 0.99),
            percentile(&r.start, 0.5),
            percentile(&r.start, 0.99),
            r.rate,
            r.rate / raw,
            r.cpu.coordinator,
            r.cpu.agent,
            r.cpu.children,
            r.cpu.total()
        );
    }
    let [sqlite, _, sqlite_tokens, tokens_again, sqlite_again] = &rows[..] else {
        return Ok(());
    };
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
