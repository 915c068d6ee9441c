//! Coordinator scale: simulated agents in this process (real HTTP, one task each) on one or
//! more coordinator replicas sharing PostgreSQL (agents spread over them), each agent with 8
//! GPUs, claiming from a deep queue, reporting each job's start at once and its end after the
//! job's length, and renewing its leases as an agent does; an answer to try again (busy, a
//! timeout) is tried again as an agent does. Claim latency, jobs/s, leases lost, busy
//! answers, each replica's CPU and memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::Utc;
use headroom_agent::agent::backoff::Backoff;
use headroom_integration_tests::{Postgres, stat_fields};
use headroom_shared::AgentId;
use headroom_shared::api::{
    ClaimRequest, CreateTokenRequest, ErrorCode, FinishReport, GpuInfo, GpuSample,
    HeartbeatRequest, Measurements, RegisterRequest, Role, StartReport,
};
use headroom_shared::client::{Client, ClientError};

use super::{Report, Target, percentile};
use crate::system::Node;

pub struct Size {
    /// Coordinator replicas on the one database; agent i talks to replica i mod replicas.
    pub replicas: usize,
    pub agents: usize,
    pub gpus_per_agent: usize,
    pub queued: usize,
    /// How long the agents drain the queue (they stop early when it is empty).
    pub window: Duration,
    /// How long each simulated job holds its GPU before it ends: zero claims as fast as the
    /// coordinator answers (its ceiling); a few seconds is a node's real pace.
    pub job: Duration,
    /// Each agent holds an agent token of its own node (made by the admin before the run),
    /// so every request of the fleet is checked against its node, as in a lab; off, the
    /// coordinators have no tokens.
    pub agent_tokens: bool,
    /// The replicas are stopped and started again once every agent has registered, before
    /// the window: it then measures the fleet's first minute after a restart of every
    /// replica (with agent tokens, each token's first verification by its replica).
    pub restart: bool,
}

/// The admin token of the coordinators of a fleet with agent tokens.
const ADMIN_TOKEN: &str = "bench-admin-token-0123456789abcdefghij";

const GPU_MIB: u64 = 81_920;
/// How often a simulated agent heartbeats: as a real one does, three times a lease TTL (the
/// default 30 s).
const BEAT: Duration = Duration::from_secs(10);
/// A failed heartbeat is sent again after this, as a real agent's is (a third of its
/// pace, at most a second).
const BEAT_RETRY: Duration = Duration::from_secs(1);
/// Tries of a claim or report that failed for a while (about a minute with the agent's
/// backoff) before the bench gives up on the run.
const TRIES: u32 = 16;

/// Sends `call` until it is answered or refused for good, pacing the answers to try again
/// as an agent does (`Backoff::coordinator`); counts those that said busy.
async fn patiently<T, F>(
    busy: &AtomicUsize,
    mut call: impl FnMut() -> F,
) -> std::result::Result<T, ClientError>
where
    F: std::future::Future<Output = std::result::Result<T, ClientError>>,
{
    let mut backoff = Backoff::coordinator();
    let never = tokio_util::sync::CancellationToken::new();
    loop {
        match call().await {
            Err(e) if e.is_transient() && backoff.tries() < TRIES => {
                if e.code() == Some(ErrorCode::Busy) {
                    busy.fetch_add(1, Ordering::Relaxed);
                }
                backoff.wait_at_least(e.retry_after(), &never).await;
            }
            r => return r,
        }
    }
}

fn samples(gpus: usize) -> Vec<GpuSample> {
    (0..gpus as u32)
        .map(|index| GpuSample {
            index,
            used_mib: 0,
            free_mib: GPU_MIB,
            ..Default::default()
        })
        .collect()
}

fn finish(fence: i64, gpus: usize) -> FinishReport {
    FinishReport {
        fence,
        failure: None,
        exit_code: Some(0),
        signal: None,
        ended_at: Utc::now(),
        peak_mem_mib: Some(100),
        peak_source: None,
        cleanup_ms: 1,
        cleanup_verified: true,
        unverified: None,
        contaminated: false,
        measurements: Measurements::default(),
        log_tail: String::new(),
        gpus: samples(gpus),
        prestart: None,
        background: None,
        host_peak_mib: None,
        started: None,
        metrics: None,
        memory_cap_mib: None,
        oom_cause: None,
    }
}

/// Leases running on a simulated agent's GPUs: (when it ends, attempt, fence).
type Running = Arc<std::sync::Mutex<Vec<(Instant, headroom_shared::AttemptId, i64)>>>;

/// What a simulated agent saw: the latencies (ms) of claims that brought work.
#[derive(Default)]
struct Seen {
    claims_ms: Vec<f64>,
}

/// What a fleet's agents count together: jobs ended, leases lost (a heartbeat, start or end
/// refused as stale: the lease expired while the coordinators were behind, and the job went
/// back to the queue), heartbeats that failed otherwise (timed out, refused), and answers
/// that said busy (each tried again); and how long heartbeats and ends took to be answered
/// (ms; an end from its first try, after the window's first jobs).
#[derive(Default)]
struct Counts {
    /// Jobs ended (their end answered).
    done: AtomicUsize,
    lost: AtomicUsize,
    failed: AtomicUsize,
    busy: AtomicUsize,
    beats_ms: std::sync::Mutex<Vec<f64>>,
    ends_ms: std::sync::Mutex<Vec<f64>>,
}

impl Counts {
    /// p50 and p99 of `ms`'s figures.
    fn percentiles(ms: &std::sync::Mutex<Vec<f64>>) -> (f64, f64) {
        let mut v = ms.lock().map(|v| v.clone()).unwrap_or_default();
        v.sort_by(f64::total_cmp);
        (percentile(&v, 0.5), percentile(&v, 0.99))
    }
}

fn record(ms: &std::sync::Mutex<Vec<f64>>, since: Instant) {
    if let Ok(mut v) = ms.lock() {
        v.push(since.elapsed().as_secs_f64() * 1e3);
    }
}

/// Renews an agent's leases every [`BEAT`] (the first after `offset`, so a fleet's agents do
/// not beat together), beside its claims and reports as a real agent's heartbeat runs. A
/// lease refused as stale is dropped and counted in `lost`, and the rest are renewed at once
/// (the refusal renewed none); a heartbeat that fails otherwise is counted in `failed` (and
/// `busy`, where it said so) and tried again after [`BEAT_RETRY`].
async fn heartbeats(
    api: Client,
    agent: headroom_shared::AgentId,
    gpus: usize,
    running: Running,
    (offset, until): (Duration, Instant),
    counts: Arc<Counts>,
) -> Result<()> {
    let mut next = Instant::now() + offset;
    while next < until {
        tokio::time::sleep_until(next.into()).await;
        next += BEAT;
        let attempts = match running.lock() {
            Ok(r) => r
                .iter()
                .map(|(_, attempt, fence)| headroom_shared::api::AttemptRef {
                    attempt: *attempt,
                    fence: *fence,
                    waiting: None,
                })
                .collect(),
            Err(_) => bail!("an agent's task panicked"),
        };
        let sent = Instant::now();
        let beat = api
            .heartbeat(
                agent,
                &HeartbeatRequest {
                    gpus: samples(gpus),
                    attempts,
                    released: vec![],
                    telemetry: vec![],
                    telemetry_dropped: 0,
                },
            )
            .await;
        match beat {
            Ok(_) => record(&counts.beats_ms, sent),
            Err(ClientError::Stale {
                attempt: Some(a), ..
            }) => {
                let dropped = match running.lock() {
                    Ok(mut r) => {
                        let before = r.len();
                        r.retain(|(_, id, _)| *id != a);
                        before - r.len()
                    }
                    Err(_) => bail!("an agent's task panicked"),
                };
                // Its end may have been reported (and counted) meanwhile.
                counts.lost.fetch_add(dropped, Ordering::Relaxed);
                next = Instant::now();
            }
            Err(e) => {
                if e.code() == Some(ErrorCode::Busy) {
                    counts.busy.fetch_add(1, Ordering::Relaxed);
                }
                counts.failed.fetch_add(1, Ordering::Relaxed);
                next = Instant::now() + BEAT_RETRY;
            }
        }
    }
    Ok(())
}

/// A task aborted when its owner is dropped (an agent that returns early through `?`).
struct AbortOnDrop(tokio::task::JoinHandle<Result<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One simulated agent: register, then claim, start and (after `job`) end until the window
/// closes or the queue is empty.
/// The node simulated agent `i` registers.
fn node_name(i: usize) -> String {
    format!("sim{i:03}")
}

/// Registers simulated node `i` with `gpus` GPUs of plan 1 each: its agent's id.
async fn register(api: &Client, i: usize, gpus: usize) -> Result<AgentId> {
    let plan = vec!["1"; gpus].join(",");
    let register = RegisterRequest {
        host_memory_mib: None,
        node: node_name(i),
        gpus: (0..gpus as u32)
            .map(|g| GpuInfo {
                index: g,
                uuid: format!("GPU-sim-{i:03}-{g}"),
                name: "simulated".into(),
                total_mib: GPU_MIB,
            })
            .collect(),
        plan: Some(plan),
        headroom: None,
        version: env!("CARGO_PKG_VERSION").into(),
        running: vec![],
        previous: None,
    };
    let busy = AtomicUsize::new(0);
    let reg = patiently(&busy, || api.register(&register))
        .await
        .context("register")?;
    Ok(reg.agent)
}

/// Simulated agent `i`, registered (its client and its agent's id), until the window ends.
async fn agent(
    (api, agent_id): (Client, AgentId),
    i: usize,
    gpus: usize,
    until: Instant,
    total: usize,
    job: Duration,
    counts: Arc<Counts>,
) -> Result<Seen> {
    let plan = vec!["1"; gpus].join(",");
    let mut seen = Seen::default();
    let running: Running = Arc::default();
    let offset = BEAT.mul_f64((i % 100) as f64 / 100.0);
    let mut beats = AbortOnDrop(tokio::spawn(heartbeats(
        api.clone(),
        agent_id,
        gpus,
        running.clone(),
        (offset, until),
        counts.clone(),
    )));
    let steady = Instant::now() + job;
    let lock = || {
        running
            .lock()
            .map_err(|_| anyhow::anyhow!("an agent's heartbeat panicked"))
    };
    while Instant::now() < until && counts.done.load(Ordering::Relaxed) < total {
        if beats.0.is_finished() {
            break; // its error is reported below
        }
        let now = Instant::now();
        let ended: Vec<_> = {
            let mut r = lock()?;
            let ended = r.iter().filter(|r| r.0 <= now).copied().collect();
            r.retain(|r| r.0 > now);
            ended
        };
        for (_, attempt, fence) in ended {
            let report = finish(fence, gpus);
            let sent = Instant::now();
            match patiently(&counts.busy, || api.finish(attempt, &report)).await {
                Ok(_) => {
                    if sent >= steady {
                        record(&counts.ends_ms, sent);
                    }
                    counts.done.fetch_add(1, Ordering::Relaxed);
                }
                Err(ClientError::Stale { .. }) => {
                    counts.lost.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => return Err(e).context("finish report"),
            }
        }
        let (free, next_end) = {
            let r = lock()?;
            (gpus - r.len(), r.iter().map(|r| r.0).min())
        };
        if free == 0 {
            if let Some(t) = next_end {
                tokio::time::sleep_until(t.min(until).into()).await;
            }
            continue;
        }
        let wait = next_end.map_or(Duration::from_millis(500), |t| {
            t.saturating_duration_since(now)
                .min(Duration::from_millis(500))
        });
        let claim = ClaimRequest {
            gpus: samples(gpus),
            max: free as u32,
            watching: vec![],
            known_plan: Some(plan.clone()),
            wait_ms: wait.as_millis() as u64,
        };
        // From the first try: a claim answered busy waits as an agent's does.
        let t = Instant::now();
        let r = patiently(&counts.busy, || api.claim(agent_id, &claim))
            .await
            .context("claim")?;
        // Steady state only: the first round of claims, every GPU of every agent at once, is
        // start-up.
        if !r.leases.is_empty() && t >= steady {
            seen.claims_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        for l in &r.leases {
            let report = StartReport {
                fence: l.fence,
                pid: 1,
                started_at: Utc::now(),
            };
            match patiently(&counts.busy, || api.start(l.attempt, &report)).await {
                Ok(_) => {}
                Err(ClientError::Stale { .. }) => {
                    counts.lost.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(e) => return Err(e).context("start report"),
            }
            // Durations spread over 0.5-1.5x, so ends do not come in waves.
            let spread = 0.5 + f64::from(l.attempt.0.as_u128() as u16) / 65_535.0;
            lock()?.push((Instant::now() + job.mul_f64(spread), l.attempt, l.fence));
        }
    }
    beats.0.abort();
    match (&mut beats.0).await {
        Ok(r) => r?,
        Err(e) if e.is_cancelled() => {}
        Err(e) => bail!("an agent's heartbeat panicked: {e}"),
    }
    Ok(seen)
}

/// The ms of CPU in `/proc/PID/stat` fields `from..to` after the command (clock ticks of
/// 10 ms): 11..13 a process's own, 13..15 its reaped children's.
fn stat_cpu_ms(fields: &[String], from: usize, to: usize) -> f64 {
    fields
        .get(from..to)
        .map(|v| v.iter().filter_map(|x| x.parse::<f64>().ok()).sum::<f64>() * 10.0)
        .unwrap_or_default()
}

/// (CPU ms, resident MiB, peak resident MiB) of a process.
fn usage(pid: u32) -> (f64, f64, f64) {
    let cpu = stat_fields(pid).map_or(0.0, |f| stat_cpu_ms(&f, 11, 13));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
            / 1024.0
    };
    (cpu, kib("VmRSS:"), kib("VmHWM:"))
}

/// Most jobs one spec expands into by default (`--max-jobs`): a deeper queue is submitted
/// as several experiments.
const SPEC_JOBS: usize = headroom_shared::spec::DEFAULT_MAX_JOBS as usize;

/// CPU ms of a process and its children, live (their own time) and reaped (in its own
/// `cutime`/`cstime`): a PostgreSQL server with its backends.
fn tree_cpu_ms(pid: u32) -> f64 {
    let own = stat_fields(pid).map_or(0.0, |f| stat_cpu_ms(&f, 11, 15));
    let children: f64 = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat_fields)
        .filter(|f| f.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(pid))
        .map(|f| stat_cpu_ms(&f, 11, 13))
        .sum();
    own + children
}

/// One bench run of `size`: its figures (JSON), its table, claim p99 and jobs/s.
struct Measured {
    figures: serde_json::Value,
    table: String,
    p50: f64,
    p99: f64,
    rate: f64,
    /// Leases the simulated agents lost (refused as stale).
    lost: usize,
    db_pct: Option<f64>,
    coordinators_pct: f64,
}

/// The bench at one size: `scale` (each job holding its GPU a few seconds) or
/// `scale_ceiling` (each ending at once).
pub fn run(size: &Size) -> Result<Report> {
    let m = measure(size)?;
    let mut targets = vec![Target::new(
        "claim p99 at most 50 ms",
        format!("{:.1} ms", m.p99),
        m.p99 <= 50.0,
    )];
    if size.job.is_zero() {
        targets.push(Target::new(
            "ceiling at least 1,000 jobs/s with every replica",
            format!("{:.0} jobs/s with {}", m.rate, size.replicas.max(1)),
            m.rate >= 1000.0,
        ));
    }
    Ok(Report::new(
        if size.job.is_zero() {
            "scale_ceiling"
        } else {
            "scale"
        },
        m.figures,
        targets,
        m.table,
    ))
}

/// `scale_load`: the same fleet and queue at each of `sizes` (from the longest jobs to the
/// shortest, so from the least demand to the most), a fresh database each: what a claim
/// takes while the coordinators keep up with the fleet's ends, and where they stop keeping up.
pub fn load(sizes: &[Size]) -> Result<Report> {
    let mut rows = String::from(
        "| each job holds its GPU | the fleet's demand | jobs/s ended | claim p50 | claim p99 | leases lost | coordinators' CPU | PostgreSQL's CPU |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let (mut runs, mut targets, mut tables) = (Vec::new(), Vec::new(), String::new());
    for size in sizes {
        let m = measure(size)?;
        let demand = demand(size);
        rows.push_str(&format!(
            "| {:.0} s | {demand:.0} jobs/s | {:.0} | {:.1} ms | {:.1} ms | {} | {:.0} % of a core | {} |\n",
            size.job.as_secs_f64(),
            m.rate,
            m.p50,
            m.p99,
            m.lost,
            m.coordinators_pct,
            m.db_pct
                .map_or("not measured".into(), |p| format!("{p:.0} % of a core")),
        ));
        targets.push(Target::new(
            &format!("claim p99 at most 50 ms with the fleet ending {demand:.0} jobs/s"),
            format!("{:.1} ms ({:.0} jobs/s ended)", m.p99, m.rate),
            m.p99 <= 50.0,
        ));
        tables.push_str(&format!(
            "\n#### Jobs of {:.0} s\n\n{}",
            size.job.as_secs_f64(),
            m.table
        ));
        runs.push(m.figures);
    }
    let figures = serde_json::json!({ "runs": runs });
    Ok(Report::new(
        "scale_load",
        figures,
        targets,
        format!("{rows}{tables}"),
    ))
}

/// Jobs a second the fleet ends once it runs at its pace: a GPU ends a job every `job`
/// (spread over 0.5-1.5x of it, so on average `job`).
fn demand(size: &Size) -> f64 {
    let gpus = (size.agents * size.gpus_per_agent) as f64;
    if size.job.is_zero() {
        f64::INFINITY
    } else {
        gpus / size.job.as_secs_f64()
    }
}

fn measure(size: &Size) -> Result<Measured> {
    let pg = Postgres::start_durable()?;
    let admin = size.agent_tokens.then_some(ADMIN_TOKEN);
    let mut replicas = (0..size.replicas.max(1))
        .map(|_| Node::coordinator_as(Some(&pg.url()), admin))
        .collect::<Result<Vec<_>>>()?;
    let t = Instant::now();
    for (k, first) in (0..size.queued).step_by(SPEC_JOBS).enumerate() {
        let n = SPEC_JOBS.min(size.queued - first);
        replicas[k % replicas.len()].submit(&format!("deep{k}"), &["true"], n)?;
    }
    let submit_s = t.elapsed().as_secs_f64();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Each agent's token, made before the window (a token's first use on each replica
    // verifies its hash, once).
    let tokens: Vec<Option<String>> = if size.agent_tokens {
        rt.block_on(async {
            let mut tokens = Vec::new();
            for i in 0..size.agents {
                let req = CreateTokenRequest {
                    name: node_name(i),
                    role: Role::Agent,
                    expires_in: None,
                    nodes: None,
                };
                tokens.push(Some(replicas[0].api.create_token(&req).await?.token));
            }
            Ok::<_, anyhow::Error>(tokens)
        })?
    } else {
        vec![None; size.agents]
    };
    // Every agent registers before the window (with tokens, its token's first verification
    // by its replica, once after the replica starts): the window measures the fleet at work.
    let fleet: Vec<(Client, AgentId)> = rt.block_on(async {
        let tasks: Vec<_> = (0..size.agents)
            .map(|i| {
                let api = Client::new(&replicas[i % replicas.len()].url)?
                    .with_token(tokens[i].as_deref())?;
                let gpus = size.gpus_per_agent;
                Ok(tokio::spawn(async move {
                    let id = register(&api, i, gpus).await?;
                    Ok::<_, anyhow::Error>((api, id))
                }))
            })
            .collect::<Result<_>>()?;
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await??);
        }
        Ok::<_, anyhow::Error>(out)
    })?;
    if size.restart {
        for r in &mut replicas {
            r.restart_coordinator()?;
        }
    }
    let pids = replicas
        .iter()
        .map(|n| n.coordinator.pid().context("coordinator not running"))
        .collect::<Result<Vec<_>>>()?;
    let cpu0: Vec<f64> = pids.iter().map(|p| usage(*p).0).collect();
    // Where the rest of the machine's CPU goes: the database, and this process (the
    // simulated agents).
    let postmaster = pg.postmaster_pid();
    pg.reset_statements()?;
    let db0 = postmaster.map(tree_cpu_ms);
    let me = std::process::id();
    let agents0 = usage(me).0;
    let counts = Arc::new(Counts::default());
    let t = Instant::now();
    let until = t + size.window;
    let seen: Vec<Seen> = rt.block_on(async {
        let tasks: Vec<_> = fleet
            .into_iter()
            .enumerate()
            .map(|(i, registered)| {
                tokio::spawn(agent(
                    registered,
                    i,
                    size.gpus_per_agent,
                    until,
                    size.queued,
                    size.job,
                    counts.clone(),
                ))
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await??);
        }
        Ok::<_, anyhow::Error>(out)
    })?;
    let elapsed = t.elapsed().as_secs_f64();
    let after: Vec<(f64, f64, f64)> = pids.iter().map(|p| usage(*p)).collect();
    let share = |ms: f64| ms / (elapsed * 1e3) * 100.0;
    let db_pct = db0
        .zip(postmaster.map(tree_cpu_ms))
        .map(|(a, b)| share(b - a));
    let agents_pct = share(usage(me).0 - agents0);
    let statements = pg.top_statements(16)?;
    let jobs = counts.done.load(Ordering::Relaxed);
    if jobs == 0 {
        bail!("no job ran: {}", replicas[0].coordinator.output());
    }
    // Each replica's CPU over the window, and the whole of them.
    let each: Vec<serde_json::Value> = after
        .iter()
        .zip(&cpu0)
        .map(|((cpu1, rss, hwm), cpu0)| {
            serde_json::json!({
                "cpu_core_pct": share(cpu1 - cpu0),
                "cpu_ms_per_job": (cpu1 - cpu0) / jobs as f64,
                "rss_mib": rss, "peak_rss_mib": hwm,
            })
        })
        .collect();
    let per_replica = after
        .iter()
        .zip(&cpu0)
        .map(|((cpu1, rss, hwm), cpu0)| {
            format!(
                "{:.0} % of a core, {rss:.0} MiB ({hwm:.0})",
                share(cpu1 - cpu0)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let cpu0: f64 = cpu0.iter().sum();
    let cpu1: f64 = after.iter().map(|a| a.0).sum();
    let rss: f64 = after.iter().map(|a| a.1).sum();
    let hwm: f64 = after.iter().map(|a| a.2).sum();
    let lost = counts.lost.load(Ordering::Relaxed);
    let failed_beats = counts.failed.load(Ordering::Relaxed);
    let busy = counts.busy.load(Ordering::Relaxed);
    let (beat50, beat99) = Counts::percentiles(&counts.beats_ms);
    let (end50, end99) = Counts::percentiles(&counts.ends_ms);
    let mut claims: Vec<f64> = seen.into_iter().flat_map(|s| s.claims_ms).collect();
    claims.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&claims, 0.5), percentile(&claims, 0.99));
    let rate = jobs as f64 / elapsed;
    let cpu_share = share(cpu1 - cpu0);
    let table = format!(
        "| replicas | agents x GPUs | each job holds its GPU | queued | jobs run | jobs/s | claims | claim p50 | p99 | end p50 / p99 | heartbeat p50 / p99 | leases lost | busy answers | coordinators' CPU | per job | RSS (peak) | each replica | PostgreSQL's CPU | the simulated agents' CPU |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n\
         | {} | {} x {} | {:.1} s | {} (submitted in {submit_s:.1} s) | {jobs} in {elapsed:.1} s | {rate:.0} | {} | {p50:.1} ms | {p99:.1} ms | {end50:.1} / {end99:.1} ms | {beat50:.1} / {beat99:.1} ms | {lost} | {busy} | {cpu_share:.0} % of a core | {:.2} ms | {rss:.0} MiB ({hwm:.0}) | {per_replica} | {} | {agents_pct:.0} % of a core |\n",
        replicas.len(),
        size.agents,
        size.gpus_per_agent,
        size.job.as_secs_f64(),
        size.queued,
        claims.len(),
        (cpu1 - cpu0) / jobs as f64,
        db_pct.map_or("not measured".into(), |p| format!("{p:.0} % of a core")),
    );
    let figures = serde_json::json!({
        "replicas": each,
        "postgres_cpu_core_pct": db_pct, "agents_cpu_core_pct": agents_pct,
        "agents": size.agents, "gpus_per_agent": size.gpus_per_agent, "queued": size.queued,
        "agent_tokens": size.agent_tokens,
        "restarted": size.restart,
        "job_s": size.job.as_secs_f64(), "demand_jobs_per_s": demand(size).is_finite().then(|| demand(size)),
        "submit_s": submit_s, "jobs": jobs, "seconds": elapsed, "jobs_per_s": rate,
        "claims": claims.len(), "claim_ms": {"p50": p50, "p99": p99}, "leases_lost": lost, "heartbeats_failed": failed_beats, "busy_answers": busy,
        "end_ms": {"p50": end50, "p99": end99}, "heartbeat_ms": {"p50": beat50, "p99": beat99},
        "coordinator": {"cpu_core_pct": cpu_share, "cpu_ms_per_job": (cpu1 - cpu0) / jobs as f64,
            "rss_mib": rss, "peak_rss_mib": hwm},
        "top_statements": statements,
    });
    // The statements that took the database's time in the window, as psql prints them.
    let table = format!(
        "{table}\nThe database's time in the window, by statement (`pg_stat_statements`):\n\n```\n{}```\n",
        statements
    );
    Ok(Measured {
        figures,
        table,
        p50,
        p99,
        rate,
        lost,
        db_pct,
        coordinators_pct: cpu_share,
    })
}
