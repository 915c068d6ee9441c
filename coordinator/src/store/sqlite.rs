//! The embedded SQLite store (one file, WAL) for `headroom up` on one machine. SQLite calls
//! are blocking, so every method runs on the blocking pool behind one connection.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use headroom_shared::api::{
    AttemptPhase, AttemptRef, AttemptView, ExperimentSummary, FinishReport, GpuInfo, GpuSample,
    Headroom, JobDetail, JobSummary, Lease, NodeView, QuarantineView, StateCounts,
};
use headroom_shared::{
    AgentId, AttemptId, ExperimentId, FailureClass, JobEvent, JobId, JobState, Plan,
};
use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{
    AVOID_AFTER_HAND_BACK_MS, Active, ClaimInput, Claimed, ExportRow, JobFilter, Millis,
    NewExperiment, OOM_BUMP, Registered, Registration, Renewed, Result, Store, StoreError,
    effective_estimate, gpu_views, node_snapshot, now_ms, retry_allowed,
};
use crate::placement::{self, Candidate};

mod embedded {
    refinery::embed_migrations!("migrations/sqlite");
}

/// Pending jobs looked at per claim; deeper ones wait for the next claim.
const CLAIM_WINDOW: i64 = 512;

#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(e.to_string())
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and runs pending migrations.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)?;
        Self::init(conn)
    }

    pub fn open_in_memory() -> Result<Self> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<Self> {
        // WAL + NORMAL: durable at checkpoints, no fsync per job; a crash of the process
        // loses nothing, a power cut at most the last moments.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        embedded::migrations::runner()
            .run(&mut conn)
            .map_err(|e| StoreError::Database(format!("migration failed: {e}")))?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn with<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn
                .lock()
                .map_err(|_| StoreError::Database("connection lock poisoned".into()))?;
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Database(format!("store task failed: {e}")))?
    }

    /// Runs `f` in one write transaction.
    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static,
    {
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }
}

// ---- row helpers ------------------------------------------------------------------

fn json<T: Serialize>(v: &T) -> Result<String> {
    Ok(serde_json::to_string(v)?)
}

fn from_json<T: DeserializeOwned>(s: &str) -> Result<T> {
    Ok(serde_json::from_str(s)?)
}

fn ts(ms: Millis) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn parse<T: std::str::FromStr>(s: &str, what: &str) -> Result<T> {
    s.parse()
        .map_err(|_| StoreError::Corrupt(format!("bad {what} `{s}`")))
}

fn opt_u64(v: Option<i64>) -> Option<u64> {
    v.map(|x| x.max(0) as u64)
}

fn opt_i64(v: Option<u64>) -> Option<i64> {
    v.map(|x| x.min(i64::MAX as u64) as i64)
}

const JOB_SELECT: &str = "SELECT j.id, j.experiment_id, e.name, j.idx, j.config, j.run, j.state, \
     j.priority, j.params, j.attempts, j.max_attempts, j.gpus, j.estimate_mib, a.node, a.gpus, \
     j.last_failure, j.created_at \
     FROM jobs j JOIN experiments e ON e.id = j.experiment_id \
     LEFT JOIN attempts a ON a.job_id = j.id AND a.number = j.attempts";

/// Raw columns of `JOB_SELECT`, decoded outside rusqlite's row closure so errors keep
/// their meaning.
struct JobRow {
    id: String,
    experiment: String,
    experiment_name: String,
    index: i64,
    config: i64,
    run: i64,
    state: String,
    priority: i64,
    params: String,
    attempts: i64,
    max_attempts: i64,
    gpus: i64,
    estimate_mib: Option<i64>,
    node: Option<String>,
    gpu_indices: Option<String>,
    last_failure: Option<String>,
    created_at: i64,
}

impl JobRow {
    fn read(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: r.get(0)?,
            experiment: r.get(1)?,
            experiment_name: r.get(2)?,
            index: r.get(3)?,
            config: r.get(4)?,
            run: r.get(5)?,
            state: r.get(6)?,
            priority: r.get(7)?,
            params: r.get(8)?,
            attempts: r.get(9)?,
            max_attempts: r.get(10)?,
            gpus: r.get(11)?,
            estimate_mib: r.get(12)?,
            node: r.get(13)?,
            gpu_indices: r.get(14)?,
            last_failure: r.get(15)?,
            created_at: r.get(16)?,
        })
    }

    fn decode(self) -> Result<JobSummary> {
        Ok(JobSummary {
            id: parse(&self.id, "job id")?,
            experiment: parse(&self.experiment, "experiment id")?,
            experiment_name: self.experiment_name,
            index: self.index as u32,
            config: self.config as u32,
            run: self.run as u32,
            state: parse(&self.state, "job state")?,
            priority: self.priority as i32,
            params: from_json(&self.params)?,
            attempts: self.attempts as u32,
            max_attempts: self.max_attempts as u32,
            gpus: self.gpus as u32,
            estimate_mib: opt_u64(self.estimate_mib),
            node: self.node,
            gpu_indices: match self.gpu_indices {
                Some(g) => from_json(&g)?,
                None => vec![],
            },
            last_failure: match self.last_failure {
                Some(f) => Some(parse(&f, "failure class")?),
                None => None,
            },
            created_at: ts(self.created_at),
        })
    }
}

const ATTEMPT_SELECT: &str = "SELECT id, job_id, number, node, gpus, fence, phase, leased_at, \
     started_at, ended_at, pid, exit_code, signal, failure_class, estimate_mib, peak_mem_mib, \
     cleanup_ms, cleanup_verified, log_tail, estimate_source, params, ladder_step, contaminated \
     FROM attempts";

struct AttemptRow {
    id: String,
    job: String,
    number: i64,
    node: String,
    gpus: String,
    fence: i64,
    phase: String,
    leased_at: i64,
    started_at: Option<i64>,
    ended_at: Option<i64>,
    pid: Option<i64>,
    exit_code: Option<i64>,
    signal: Option<i64>,
    failure_class: Option<String>,
    estimate_mib: Option<i64>,
    peak_mem_mib: Option<i64>,
    cleanup_ms: Option<i64>,
    cleanup_verified: Option<bool>,
    log_tail: Option<String>,
    estimate_source: String,
    params: String,
    ladder_step: i64,
    contaminated: Option<bool>,
}

impl AttemptRow {
    fn read(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: r.get(0)?,
            job: r.get(1)?,
            number: r.get(2)?,
            node: r.get(3)?,
            gpus: r.get(4)?,
            fence: r.get(5)?,
            phase: r.get(6)?,
            leased_at: r.get(7)?,
            started_at: r.get(8)?,
            ended_at: r.get(9)?,
            pid: r.get(10)?,
            exit_code: r.get(11)?,
            signal: r.get(12)?,
            failure_class: r.get(13)?,
            estimate_mib: r.get(14)?,
            peak_mem_mib: r.get(15)?,
            cleanup_ms: r.get(16)?,
            cleanup_verified: r.get(17)?,
            log_tail: r.get(18)?,
            estimate_source: r.get(19)?,
            params: r.get(20)?,
            ladder_step: r.get(21)?,
            contaminated: r.get(22)?,
        })
    }

    fn decode(self) -> Result<AttemptView> {
        let phase = match self.phase.as_str() {
            "leased" => AttemptPhase::Leased,
            "running" => AttemptPhase::Running,
            "ended" => AttemptPhase::Ended,
            other => return Err(StoreError::Corrupt(format!("bad attempt phase `{other}`"))),
        };
        let failure_class: Option<FailureClass> = match self.failure_class {
            Some(f) => Some(parse(&f, "failure class")?),
            None => None,
        };
        Ok(AttemptView {
            id: parse(&self.id, "attempt id")?,
            job: parse(&self.job, "job id")?,
            number: self.number as u32,
            node: self.node,
            gpus: from_json(&self.gpus)?,
            fence: self.fence,
            phase,
            leased_at: ts(self.leased_at),
            started_at: self.started_at.map(ts),
            ended_at: self.ended_at.map(ts),
            pid: self.pid.map(|p| p as u32),
            exit_code: self.exit_code.map(|c| c as i32),
            signal: self.signal.map(|s| s as i32),
            success: (phase == AttemptPhase::Ended).then_some(failure_class.is_none()),
            failure_class,
            estimate_mib: opt_u64(self.estimate_mib),
            peak_mem_mib: opt_u64(self.peak_mem_mib),
            cleanup_ms: opt_u64(self.cleanup_ms),
            cleanup_verified: self.cleanup_verified,
            log_tail: self.log_tail,
            estimate_source: self.estimate_source,
            params: from_json(&self.params)?,
            ladder_step: self.ladder_step as u32,
            contaminated: self.contaminated,
        })
    }
}

fn job_state(tx: &Transaction<'_>, job: &str) -> Result<JobState> {
    let s: Option<String> = tx
        .query_row("SELECT state FROM jobs WHERE id = ?1", [job], |r| r.get(0))
        .optional()?;
    match s {
        Some(s) => parse(&s, "job state"),
        None => Err(StoreError::NotFound {
            what: "job",
            id: job.to_string(),
        }),
    }
}

/// The one place this backend changes a job's state: the state machine decides, the update
/// is conditional on the state read, and a lost race is an error, not a silent overwrite.
fn transition(tx: &Transaction<'_>, job: &str, event: JobEvent) -> Result<JobState> {
    let from = job_state(tx, job)?;
    let to = from.on(event)?;
    if to != from {
        let n = tx.execute(
            "UPDATE jobs SET state = ?1, updated_at = ?2 WHERE id = ?3 AND state = ?4",
            params![to.as_str(), now_ms(), job, from.as_str()],
        )?;
        if n != 1 {
            return Err(StoreError::Database(format!(
                "job {job} changed state concurrently"
            )));
        }
    }
    Ok(to)
}

/// Records an active attempt as lost and requeues its job if the policy allows.
fn lose_attempt(tx: &Transaction<'_>, attempt: &str) -> Result<()> {
    let (job, started): (String, Option<i64>) = tx.query_row(
        "SELECT job_id, started_at FROM attempts WHERE id = ?1",
        [attempt],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let now = now_ms();
    tx.execute(
        "UPDATE attempts SET phase = 'ended', ended_at = ?1, failure_class = 'lost', \
         log_tail = COALESCE(log_tail, 'lost: the agent went away before reporting an end') \
         WHERE id = ?2 AND phase != 'ended'",
        params![now, attempt],
    )?;
    let (attempts, max_attempts, retry_on): (i64, i64, String) = tx.query_row(
        "SELECT attempts, max_attempts, retry_on FROM jobs WHERE id = ?1",
        [&job],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let retry_on: Vec<FailureClass> = from_json(&retry_on)?;
    let retry = retry_allowed(
        FailureClass::Lost,
        started.is_some(),
        attempts as u32,
        max_attempts as u32,
        &retry_on,
    );
    if started.is_none() {
        // Never ran: it does not use up an attempt.
        tx.execute(
            "UPDATE jobs SET max_attempts = max_attempts + 1 WHERE id = ?1",
            [&job],
        )?;
    }
    tx.execute(
        "UPDATE jobs SET last_failure = 'lost' WHERE id = ?1",
        [&job],
    )?;
    transition(tx, &job, JobEvent::Fail { retry })?;
    Ok(())
}

struct NodeRow {
    name: String,
    gpus: Vec<GpuInfo>,
    plan: Plan,
    headroom: Headroom,
}

fn node_of_agent(tx: &Connection, agent: AgentId) -> Result<NodeRow> {
    let row: Option<(String, String, String, String)> = tx
        .query_row(
            "SELECT name, gpus, plan, headroom FROM nodes WHERE agent_id = ?1",
            [agent.to_string()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let (name, gpus, plan, headroom) = row.ok_or(StoreError::UnknownAgent { agent })?;
    Ok(NodeRow {
        name,
        gpus: from_json(&gpus)?,
        plan: parse(&plan, "plan")?,
        headroom: parse(&headroom, "headroom")?,
    })
}

fn record_telemetry(tx: &Transaction<'_>, node: &str, gpus: &[GpuSample]) -> Result<()> {
    tx.execute(
        "UPDATE nodes SET telemetry = ?1, last_seen = ?2 WHERE name = ?3",
        params![json(&gpus)?, now_ms(), node],
    )?;
    Ok(())
}

fn active_on(conn: &Connection, node: &str) -> Result<Vec<Active>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, gpus, estimate_mib FROM attempts WHERE node = ?1 AND phase != 'ended'",
    )?;
    let rows = stmt
        .query_map([node], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<i64>>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter()
        .map(|(id, g, e)| {
            Ok(Active {
                id,
                gpus: from_json(&g)?,
                estimate: opt_u64(e),
            })
        })
        .collect()
}

fn check_fence(tx: &Transaction<'_>, attempt: AttemptId, fence: i64) -> Result<(String, String)> {
    let row: Option<(String, String, i64, i64)> = tx
        .query_row(
            "SELECT a.job_id, a.phase, a.fence, j.fence FROM attempts a \
             JOIN jobs j ON j.id = a.job_id WHERE a.id = ?1",
            [attempt.to_string()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let Some((job, phase, a_fence, j_fence)) = row else {
        return Err(StoreError::NotFound {
            what: "attempt",
            id: attempt.to_string(),
        });
    };
    if phase == "ended" || a_fence != fence || j_fence != fence {
        return Err(StoreError::StaleFence { attempt });
    }
    Ok((job, phase))
}

fn summaries(
    conn: &Connection,
    sql: &str,
    args: &[&dyn rusqlite::ToSql],
) -> Result<Vec<JobSummary>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt
        .query_map(args, JobRow::read)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter().map(JobRow::decode).collect()
}

fn counts_for(conn: &Connection, experiment: Option<&str>) -> Result<StateCounts> {
    let mut stmt = conn.prepare_cached(
        "SELECT state, COUNT(*) FROM jobs WHERE (?1 IS NULL OR experiment_id = ?1) GROUP BY state",
    )?;
    let rows = stmt
        .query_map([experiment], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut counts = StateCounts::default();
    for (state, n) in rows {
        counts.add(parse(&state, "job state")?, n as u64);
    }
    Ok(counts)
}

fn experiment_summary(conn: &Connection, id: &str) -> Result<ExperimentSummary> {
    let row: Option<(String, String, i64, i64)> = conn
        .query_row(
            "SELECT id, name, seed, created_at FROM experiments WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let (id, name, seed, created_at) = row.ok_or_else(|| StoreError::NotFound {
        what: "experiment",
        id: id.to_string(),
    })?;
    Ok(ExperimentSummary {
        counts: counts_for(conn, Some(&id))?,
        id: parse(&id, "experiment id")?,
        name,
        seed: seed as u64,
        created_at: ts(created_at),
    })
}

#[async_trait]
impl Store for SqliteStore {
    async fn schema_version(&self) -> Result<i64> {
        self.with(|c| {
            Ok(c.query_row(
                "SELECT COALESCE(MAX(version), 0) FROM refinery_schema_history",
                [],
                |r| r.get(0),
            )?)
        })
        .await
    }

    async fn create_experiment(&self, exp: NewExperiment) -> Result<ExperimentSummary> {
        self.write(move |tx| {
            let now = now_ms();
            let id = exp.id.to_string();
            tx.execute(
                "INSERT INTO experiments (id, name, seed, spec, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id, exp.name, exp.seed as i64, json(&exp.spec)?, now],
            )?;
            let mut stmt = tx.prepare_cached(
                "INSERT INTO jobs (id, experiment_id, idx, config, run, state, priority, params, \
                 argv, env, profile, gpus, estimate_mib, timeout_ms, max_attempts, retry_on, \
                 created_at, updated_at, memory_key, command, shell, ladder) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?16, \
                 ?17, ?18, ?19, ?20)",
            )?;
            for j in &exp.jobs {
                stmt.execute(params![
                    j.id.to_string(),
                    id,
                    j.index,
                    j.config,
                    j.run,
                    j.priority,
                    json(&j.params)?,
                    json(&j.argv)?,
                    json(&j.env)?,
                    j.profile,
                    j.gpus,
                    opt_i64(j.estimate_mib),
                    opt_i64(j.timeout_ms),
                    j.max_attempts,
                    json(&j.retry_on)?,
                    now,
                    j.memory_key,
                    json(&j.command)?,
                    j.shell,
                    json(&j.oom_ladder)?,
                ])?;
            }
            drop(stmt);
            experiment_summary(tx, &id)
        })
        .await
    }

    async fn list_experiments(&self) -> Result<Vec<ExperimentSummary>> {
        self.with(|c| {
            let ids = c
                .prepare_cached("SELECT id FROM experiments ORDER BY created_at, id")?
                .query_map([], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            ids.iter().map(|id| experiment_summary(c, id)).collect()
        })
        .await
    }

    async fn experiment(&self, id: ExperimentId) -> Result<ExperimentSummary> {
        self.with(move |c| experiment_summary(c, &id.to_string()))
            .await
    }

    async fn counts(&self, experiment: Option<ExperimentId>) -> Result<StateCounts> {
        self.with(move |c| {
            let id = experiment.map(|e| e.to_string());
            counts_for(c, id.as_deref())
        })
        .await
    }

    async fn list_jobs(&self, filter: JobFilter) -> Result<Vec<JobSummary>> {
        self.with(move |c| {
            let sql = format!(
                "{JOB_SELECT} WHERE (?1 IS NULL OR j.experiment_id = ?1) AND (?2 IS NULL OR j.state = ?2) \
                 ORDER BY j.seq LIMIT ?3"
            );
            let exp = filter.experiment.map(|e| e.to_string());
            let state = filter.state.map(|s| s.as_str().to_string());
            let limit = filter.limit.map(i64::from).unwrap_or(-1);
            summaries(c, &sql, &[&exp, &state, &limit])
        })
        .await
    }

    async fn job(&self, id: JobId) -> Result<JobDetail> {
        self.with(move |c| {
            let id = id.to_string();
            let sql = format!("{JOB_SELECT} WHERE j.id = ?1");
            let summary =
                summaries(c, &sql, &[&id])?
                    .pop()
                    .ok_or_else(|| StoreError::NotFound {
                        what: "job",
                        id: id.clone(),
                    })?;
            #[allow(clippy::type_complexity)]
            let (argv, env, profile, timeout_ms, retry_on, memory_key, ladder, ladder_step): (
                String,
                String,
                String,
                Option<i64>,
                String,
                String,
                String,
                i64,
            ) = c.query_row(
                "SELECT argv, env, profile, timeout_ms, retry_on, memory_key, ladder, ladder_step \
                 FROM jobs WHERE id = ?1",
                [&id],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                    ))
                },
            )?;
            let attempts = c
                .prepare_cached(&format!(
                    "{ATTEMPT_SELECT} WHERE job_id = ?1 ORDER BY number"
                ))?
                .query_map([&id], AttemptRow::read)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(JobDetail {
                summary,
                argv: from_json(&argv)?,
                env: from_json(&env)?,
                profile,
                timeout_ms: opt_u64(timeout_ms),
                retry_on: from_json(&retry_on)?,
                memory_key,
                oom_ladder: from_json(&ladder)?,
                ladder_step: ladder_step as u32,
                attempts_detail: attempts
                    .into_iter()
                    .map(AttemptRow::decode)
                    .collect::<Result<_>>()?,
            })
        })
        .await
    }

    async fn attempt(&self, id: AttemptId) -> Result<AttemptView> {
        self.with(move |c| {
            let row = c
                .query_row(
                    &format!("{ATTEMPT_SELECT} WHERE id = ?1"),
                    [id.to_string()],
                    AttemptRow::read,
                )
                .optional()?
                .ok_or_else(|| StoreError::NotFound {
                    what: "attempt",
                    id: id.to_string(),
                })?;
            row.decode()
        })
        .await
    }

    async fn cancel_job(&self, id: JobId) -> Result<u64> {
        self.write(move |tx| cancel_one(tx, &id.to_string())).await
    }

    async fn cancel_experiment(&self, id: ExperimentId) -> Result<u64> {
        self.write(move |tx| {
            let id = id.to_string();
            experiment_summary(tx, &id)?;
            let jobs = tx
                .prepare_cached(
                    "SELECT id FROM jobs WHERE experiment_id = ?1 \
                     AND state NOT IN ('succeeded', 'failed', 'cancelled')",
                )?
                .query_map([&id], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut n = 0;
            for job in jobs {
                n += cancel_one(tx, &job)?;
            }
            Ok(n)
        })
        .await
    }

    async fn retry_job(&self, id: JobId) -> Result<JobState> {
        self.write(move |tx| {
            let id = id.to_string();
            let state = transition(tx, &id, JobEvent::Retry)?;
            // One more attempt than used so far: a manual retry is one new try.
            tx.execute(
                "UPDATE jobs SET max_attempts = attempts + 1 WHERE id = ?1",
                [&id],
            )?;
            Ok(state)
        })
        .await
    }

    async fn export_rows(&self, experiment: Option<ExperimentId>) -> Result<Vec<ExportRow>> {
        self.with(move |c| {
            let exp = experiment.map(|e| e.to_string());
            let jobs = summaries(
                c,
                &format!("{JOB_SELECT} WHERE (?1 IS NULL OR j.experiment_id = ?1) ORDER BY j.seq"),
                &[&exp],
            )?;
            let attempts = c
                .prepare_cached(&format!(
                    "{ATTEMPT_SELECT} WHERE job_id IN (SELECT id FROM jobs WHERE ?1 IS NULL OR experiment_id = ?1) \
                     ORDER BY number"
                ))?
                .query_map([&exp], AttemptRow::read)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let attempts = attempts
                .into_iter()
                .map(AttemptRow::decode)
                .collect::<Result<Vec<_>>>()?;
            Ok(super::export_rows(jobs, attempts))
        })
        .await
    }

    async fn register_agent(&self, reg: Registration) -> Result<Registered> {
        self.write(move |tx| {
            let now = now_ms();
            let stored: Option<(String, String)> = tx
                .query_row(
                    "SELECT plan, headroom FROM nodes WHERE name = ?1",
                    [&reg.node],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let n_gpus = reg.gpus.len();
            let plan = match (&reg.plan, &stored) {
                (Some(p), _) => {
                    p.check_gpus(n_gpus)?;
                    p.clone()
                }
                // Keep the stored plan unless the node's GPUs changed under it.
                (None, Some((p, _))) => match Plan::parse_for(p, n_gpus) {
                    Ok(p) => p,
                    Err(_) => Plan::one_per_gpu(n_gpus),
                },
                (None, None) => Plan::one_per_gpu(n_gpus),
            };
            let headroom = match (reg.headroom, &stored) {
                (Some(h), _) => h,
                (None, Some((_, h))) => parse(h, "headroom")?,
                (None, None) => Headroom::default(),
            };
            tx.execute(
                "INSERT INTO nodes (name, agent_id, gpus, plan, headroom, last_seen, registered_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
                 ON CONFLICT (name) DO UPDATE SET agent_id = ?2, gpus = ?3, plan = ?4, headroom = ?5, \
                 last_seen = ?6, registered_at = ?6, telemetry = NULL",
                params![
                    reg.node,
                    reg.agent.to_string(),
                    json(&reg.gpus)?,
                    plan.to_string(),
                    headroom.to_string(),
                    now
                ],
            )?;
            // Attempts the agent still runs with a current token stay its own; the rest
            // belonged to an incarnation that is gone.
            let until = now + reg.lease_ttl_ms as i64;
            let mut lost = Vec::new();
            for a in active_on(tx, &reg.node)? {
                let fence: i64 =
                    tx.query_row("SELECT fence FROM attempts WHERE id = ?1", [&a.id], |r| r.get(0))?;
                let resumed = reg
                    .resume
                    .iter()
                    .any(|r| r.attempt.to_string() == a.id && r.fence == fence);
                if resumed {
                    tx.execute(
                        "UPDATE attempts SET agent_id = ?1, lease_expires_at = ?2 WHERE id = ?3",
                        params![reg.agent.to_string(), until, a.id],
                    )?;
                } else {
                    lose_attempt(tx, &a.id)?;
                    lost.push(a.id);
                }
            }
            Ok(Registered {
                plan,
                lost: lost
                    .iter()
                    .map(|a| parse(a, "attempt id"))
                    .collect::<Result<_>>()?,
            })
        })
        .await
    }

    async fn set_plan(&self, node: &str, plan: &str) -> Result<Plan> {
        let (node, plan) = (node.to_string(), plan.to_string());
        self.write(move |tx| {
            let gpus: Option<String> = tx
                .query_row("SELECT gpus FROM nodes WHERE name = ?1", [&node], |r| {
                    r.get(0)
                })
                .optional()?;
            let gpus: Vec<GpuInfo> = from_json(&gpus.ok_or_else(|| StoreError::NotFound {
                what: "node",
                id: node.clone(),
            })?)?;
            let plan = Plan::parse_for(&plan, gpus.len())?;
            tx.execute(
                "UPDATE nodes SET plan = ?1 WHERE name = ?2",
                params![plan.to_string(), node],
            )?;
            Ok(plan)
        })
        .await
    }

    async fn list_nodes(&self, alive_within_ms: u64) -> Result<Vec<NodeView>> {
        self.with(move |c| {
            let rows = c
                .prepare_cached(
                    "SELECT name, agent_id, gpus, plan, headroom, telemetry, last_seen FROM nodes ORDER BY name",
                )?
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Option<String>>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, Option<String>>(5)?,
                        r.get::<_, Option<i64>>(6)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let now = now_ms();
            let mut out = Vec::new();
            for (name, agent, gpus, plan, headroom, telemetry, last_seen) in rows {
                let gpus: Vec<GpuInfo> = from_json(&gpus)?;
                let plan: Plan = parse(&plan, "plan")?;
                let headroom: Headroom = parse(&headroom, "headroom")?;
                let samples: Vec<GpuSample> = match telemetry {
                    Some(t) => from_json(&t)?,
                    None => vec![],
                };
                let active = active_on(c, &name)?;
                let quarantine = c
                    .prepare_cached(
                        "SELECT gpu, attempt_id, reason, since FROM quarantine WHERE node = ?1 ORDER BY since",
                    )?
                    .query_map([&name], |r| {
                        Ok((
                            r.get::<_, u32>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, i64>(3)?,
                        ))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?
                    .into_iter()
                    .map(|(gpu, attempt, reason, since)| {
                        Ok((
                            gpu,
                            QuarantineView {
                                attempt: parse(&attempt, "attempt id")?,
                                reason,
                                since: ts(since),
                            },
                        ))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let views = gpu_views(&gpus, &plan, &headroom, &samples, &active, &quarantine)?;
                out.push(NodeView {
                    alive: agent.is_some()
                        && last_seen.is_some_and(|t| now - t <= alive_within_ms as i64),
                    agent: agent.map(|a| parse(&a, "agent id")).transpose()?,
                    name,
                    plan: plan.to_string(),
                    headroom,
                    last_seen: last_seen.map(ts),
                    gpus: views,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn max_node_gpus(&self) -> Result<Option<u32>> {
        self.with(|c| {
            let rows = c
                .prepare_cached("SELECT gpus FROM nodes")?
                .query_map([], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut max = None;
            for g in rows {
                let gpus: Vec<GpuInfo> = from_json(&g)?;
                max = max.max(Some(gpus.len() as u32));
            }
            Ok(max)
        })
        .await
    }

    async fn claim_jobs(&self, input: ClaimInput) -> Result<Claimed> {
        self.write(move |tx| {
            let node = node_of_agent(tx, input.agent)?;
            let samples: Vec<GpuSample> = match input.gpus {
                Some(g) => {
                    record_telemetry(tx, &node.name, &g)?;
                    g
                }
                None => {
                    let t: Option<String> = tx.query_row(
                        "SELECT telemetry FROM nodes WHERE name = ?1",
                        [&node.name],
                        |r| r.get(0),
                    )?;
                    match t {
                        Some(t) => from_json(&t)?,
                        None => vec![],
                    }
                }
            };
            let now = now_ms();
            let active = active_on(tx, &node.name)?;
            let quarantined: Vec<u32> = tx
                .prepare_cached(
                    "SELECT gpu FROM quarantine WHERE node = ?1 \
                     UNION SELECT gpu FROM gpu_avoid WHERE node = ?1 AND until_ms > ?2",
                )?
                .query_map(params![node.name, now], |r| r.get::<_, u32>(0))?
                .collect::<rusqlite::Result<_>>()?;
            let snapshot = node_snapshot(
                &node.gpus,
                &node.plan,
                &node.headroom,
                &samples,
                &active,
                &quarantined,
                input.reserve_after_ms,
            );
            if input.max == 0 {
                return Ok(Claimed {
                    leases: vec![],
                    plan: node.plan,
                });
            }
            let pending = tx
                .prepare_cached(
                    "SELECT id, gpus, estimate_mib, updated_at, memory_key FROM jobs \
                     WHERE state IN ('queued', 'retrying') AND gpus <= ?1 \
                     ORDER BY priority DESC, seq LIMIT ?2",
                )?
                .query_map(params![node.gpus.len() as i64, CLAIM_WINDOW], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, Option<i64>>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, String>(4)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            // What each memory key has taught so far, read once per key.
            let mut learned: HashMap<&str, (Vec<u64>, Option<u64>)> = HashMap::new();
            for (_, _, _, _, key) in &pending {
                if !learned.contains_key(key.as_str()) {
                    learned.insert(key, key_memory(tx, key)?);
                }
            }
            let estimates: Vec<(Option<u64>, &'static str)> = pending
                .iter()
                .map(|(_, _, declared, _, key)| {
                    let (mut peaks, floor) = learned.get(key.as_str()).cloned().unwrap_or_default();
                    effective_estimate(opt_u64(*declared), &mut peaks, floor)
                })
                .collect();
            let candidates: Vec<Candidate> = pending
                .iter()
                .zip(&estimates)
                .map(|((_, g, _, t, _), (estimate, _))| Candidate {
                    gpus: *g as u32,
                    estimate_mib: *estimate,
                    waited_ms: (now - t).max(0) as u64,
                })
                .collect();
            let placements = placement::place(&snapshot, &candidates, input.max as usize);
            let mut leases = Vec::with_capacity(placements.len());
            for p in placements {
                let job = &pending[p.candidate].0;
                leases.push(lease_job(
                    tx,
                    job,
                    &node.name,
                    input.agent,
                    &p.gpus,
                    estimates[p.candidate],
                    now,
                    input.lease_ttl_ms,
                )?);
            }
            Ok(Claimed {
                leases,
                plan: node.plan,
            })
        })
        .await
    }

    async fn pending_cancels(
        &self,
        agent: AgentId,
        watching: &[AttemptId],
    ) -> Result<Vec<AttemptId>> {
        let watching: Vec<String> = watching.iter().map(|a| a.to_string()).collect();
        self.with(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT 1 FROM attempts WHERE id = ?1 AND agent_id = ?2 AND cancel_requested = 1 \
                 AND phase != 'ended'",
            )?;
            let mut out = Vec::new();
            for a in watching {
                if stmt.exists(params![a, agent.to_string()])? {
                    out.push(parse(&a, "attempt id")?);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn renew_leases(
        &self,
        agent: AgentId,
        attempts: &[AttemptRef],
        gpus: &[GpuSample],
        lease_ttl_ms: u64,
    ) -> Result<Renewed> {
        let (attempts, gpus) = (attempts.to_vec(), gpus.to_vec());
        self.write(move |tx| {
            let node = node_of_agent(tx, agent)?;
            record_telemetry(tx, &node.name, &gpus)?;
            let until = now_ms() + lease_ttl_ms as i64;
            let (mut cancel, mut stale) = (Vec::new(), Vec::new());
            for a in attempts {
                let n = tx.execute(
                    "UPDATE attempts SET lease_expires_at = ?1 WHERE id = ?2 AND fence = ?3 \
                     AND agent_id = ?4 AND phase != 'ended'",
                    params![until, a.attempt.to_string(), a.fence, agent.to_string()],
                )?;
                if n == 0 {
                    stale.push(a.attempt);
                    continue;
                }
                let wanted: bool = tx.query_row(
                    "SELECT cancel_requested FROM attempts WHERE id = ?1",
                    [a.attempt.to_string()],
                    |r| r.get(0),
                )?;
                if wanted {
                    cancel.push(a.attempt);
                }
            }
            Ok(Renewed {
                cancel,
                stale,
                plan: node.plan,
            })
        })
        .await
    }

    async fn start_attempt(
        &self,
        attempt: AttemptId,
        fence: i64,
        pid: u32,
        started_at: Millis,
    ) -> Result<()> {
        self.write(move |tx| {
            let (job, phase) = check_fence(tx, attempt, fence)?;
            if phase != "leased" {
                return Ok(()); // a repeated report
            }
            tx.execute(
                "UPDATE attempts SET phase = 'running', pid = ?1, started_at = ?2 WHERE id = ?3",
                params![pid, started_at, attempt.to_string()],
            )?;
            if job_state(tx, &job)? != JobState::Cancelled {
                transition(tx, &job, JobEvent::Start)?;
            }
            Ok(())
        })
        .await
    }

    async fn finish_attempt(&self, attempt: AttemptId, report: FinishReport) -> Result<JobState> {
        self.write(move |tx| {
            let (job, _) = check_fence(tx, attempt, report.fence)?;
            let id = attempt.to_string();
            let node: String =
                tx.query_row("SELECT node FROM attempts WHERE id = ?1", [&id], |r| {
                    r.get(0)
                })?;
            tx.execute(
                "UPDATE attempts SET phase = 'ended', ended_at = ?1, exit_code = ?2, signal = ?3, \
                 failure_class = ?4, peak_mem_mib = ?5, cleanup_ms = ?6, cleanup_verified = ?7, \
                 log_tail = ?8, started_at = COALESCE(started_at, ?1), contaminated = ?10 WHERE id = ?9",
                params![
                    report.ended_at.timestamp_millis(),
                    report.exit_code,
                    report.signal,
                    report.failure.map(|f| f.as_str()),
                    opt_i64(report.peak_mem_mib),
                    report.cleanup_ms as i64,
                    report.cleanup_verified,
                    report.log_tail,
                    id,
                    report.contaminated
                ],
            )?;
            if !report.gpus.is_empty() {
                record_telemetry(tx, &node, &report.gpus)?;
            }
            if !report.cleanup_verified {
                let gpus: String =
                    tx.query_row("SELECT gpus FROM attempts WHERE id = ?1", [&id], |r| r.get(0))?;
                let reason = report
                    .unverified
                    .clone()
                    .unwrap_or_else(|| "cleanup could not be verified".into());
                for gpu in from_json::<Vec<u32>>(&gpus)? {
                    tx.execute(
                        "INSERT OR REPLACE INTO quarantine (node, gpu, attempt_id, reason, since) \
                         VALUES (?1, ?2, ?3, ?4, ?5)",
                        params![node, gpu, id, reason, now_ms()],
                    )?;
                }
            }
            let event = match report.failure {
                None => JobEvent::Succeed,
                Some(class) => {
                    let (attempts, max_attempts, retry_on): (i64, i64, String) = tx.query_row(
                        "SELECT attempts, max_attempts, retry_on FROM jobs WHERE id = ?1",
                        [&job],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                    )?;
                    let retry_on: Vec<FailureClass> = from_json(&retry_on)?;
                    tx.execute(
                        "UPDATE jobs SET last_failure = ?1 WHERE id = ?2",
                        params![class.as_str(), job],
                    )?;
                    let mut retry = retry_allowed(
                        class,
                        true,
                        attempts as u32,
                        max_attempts as u32,
                        &retry_on,
                    );
                    if class == FailureClass::Oom {
                        raise_floor(tx, &id, report.peak_mem_mib)?;
                        // The next ladder step is a retry of its own, on top of `retry.on`.
                        if next_ladder_step(tx, &job)? {
                            retry = true;
                        }
                    }
                    JobEvent::Fail { retry }
                }
            };
            transition(tx, &job, event)
        })
        .await
    }

    async fn hand_back(&self, attempt: AttemptId, fence: i64, gpus: &[GpuSample]) -> Result<()> {
        let gpus = gpus.to_vec();
        self.write(move |tx| {
            let (job, phase) = check_fence(tx, attempt, fence)?;
            if phase != "leased" {
                return Err(StoreError::StaleFence { attempt });
            }
            let node: String = tx.query_row(
                "SELECT node FROM attempts WHERE id = ?1",
                [attempt.to_string()],
                |r| r.get(0),
            )?;
            let gpus_json: String = tx.query_row(
                "SELECT gpus FROM attempts WHERE id = ?1",
                [attempt.to_string()],
                |r| r.get(0),
            )?;
            for gpu in from_json::<Vec<u32>>(&gpus_json)? {
                tx.execute(
                    "INSERT INTO gpu_avoid (node, gpu, until_ms) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (node, gpu) DO UPDATE SET until_ms = ?3",
                    params![node, gpu, now_ms() + AVOID_AFTER_HAND_BACK_MS],
                )?;
            }
            tx.execute("DELETE FROM attempts WHERE id = ?1", [attempt.to_string()])?;
            tx.execute(
                "UPDATE jobs SET attempts = attempts - 1 WHERE id = ?1",
                [&job],
            )?;
            let had: i64 =
                tx.query_row("SELECT attempts FROM jobs WHERE id = ?1", [&job], |r| {
                    r.get(0)
                })?;
            record_telemetry(tx, &node, &gpus)?;
            transition(
                tx,
                &job,
                JobEvent::HandBack {
                    had_attempts: had > 0,
                },
            )?;
            Ok(())
        })
        .await
    }

    async fn expire_leases(&self) -> Result<Vec<AttemptId>> {
        self.write(|tx| {
            let expired = tx
                .prepare_cached(
                    "SELECT id FROM attempts WHERE phase != 'ended' AND lease_expires_at < ?1",
                )?
                .query_map([now_ms()], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            for a in &expired {
                lose_attempt(tx, a)?;
            }
            expired.iter().map(|a| parse(a, "attempt id")).collect()
        })
        .await
    }

    async fn release_attempts(&self, agent: AgentId, attempts: &[AttemptId]) -> Result<u64> {
        let attempts: Vec<String> = attempts.iter().map(|a| a.to_string()).collect();
        self.write(move |tx| {
            let node = node_of_agent(tx, agent)?;
            let mut n = 0;
            for a in attempts {
                n += tx.execute(
                    "DELETE FROM quarantine WHERE node = ?1 AND attempt_id = ?2",
                    params![node.name, a],
                )? as u64;
            }
            Ok(n)
        })
        .await
    }

    async fn release_gpu(&self, node: &str, gpu: u32) -> Result<u64> {
        let node = node.to_string();
        self.write(move |tx| {
            let gpus: Option<String> = tx
                .query_row("SELECT gpus FROM nodes WHERE name = ?1", [&node], |r| {
                    r.get(0)
                })
                .optional()?;
            let gpus: Vec<GpuInfo> = from_json(&gpus.ok_or_else(|| StoreError::NotFound {
                what: "node",
                id: node.clone(),
            })?)?;
            if !gpus.iter().any(|g| g.index == gpu) {
                return Err(StoreError::NotFound {
                    what: "GPU",
                    id: format!("{node}/{gpu}"),
                });
            }
            Ok(tx.execute(
                "DELETE FROM quarantine WHERE node = ?1 AND gpu = ?2",
                params![node, gpu],
            )? as u64)
        })
        .await
    }
}

/// After an OOM the key's estimate rises at once: the next placement must be safer than
/// this one, whatever the slower statistics say.
fn raise_floor(tx: &Transaction<'_>, attempt: &str, peak: Option<u64>) -> Result<()> {
    let (key, estimate): (String, Option<i64>) = tx.query_row(
        "SELECT memory_key, estimate_mib FROM attempts WHERE id = ?1",
        [attempt],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let basis = opt_u64(estimate).max(peak);
    if let Some(basis) = basis.filter(|b| *b > 0) {
        let floor = (basis as f64 * OOM_BUMP).ceil() as i64;
        tx.execute(
            "INSERT INTO memory_floors (memory_key, floor_mib) VALUES (?1, ?2) \
             ON CONFLICT (memory_key) DO UPDATE SET floor_mib = MAX(floor_mib, ?2)",
            params![key, floor],
        )?;
    }
    Ok(())
}

/// Applies the job's next OOM ladder step (parameters and argv); false when none is left.
fn next_ladder_step(tx: &Transaction<'_>, job: &str) -> Result<bool> {
    let (ladder, step, params_json, command, shell, config, run): (
        String,
        i64,
        String,
        String,
        bool,
        i64,
        i64,
    ) = tx.query_row(
        "SELECT ladder, ladder_step, params, command, shell, config, run FROM jobs WHERE id = ?1",
        [job],
        |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ))
        },
    )?;
    let ladder: Vec<BTreeMap<String, serde_json::Value>> = from_json(&ladder)?;
    let Some(next) = ladder.get(step as usize) else {
        return Ok(false);
    };
    let mut params: BTreeMap<String, serde_json::Value> = from_json(&params_json)?;
    headroom_shared::spec::apply_ladder_step(&mut params, next);
    let command: Vec<String> = from_json(&command)?;
    let argv = headroom_shared::expand::render(&command, shell, &params, config as u32, run as u32)
        .map_err(|e| StoreError::Corrupt(format!("re-rendering the command: {e}")))?;
    tx.execute(
        "UPDATE jobs SET params = ?1, argv = ?2, ladder_step = ladder_step + 1, \
         max_attempts = MAX(max_attempts, attempts + 1) WHERE id = ?3",
        params![json(&params)?, json(&argv)?, job],
    )?;
    Ok(true)
}

/// Observed peaks and the OOM floor of a memory key.
fn key_memory(conn: &Connection, key: &str) -> Result<(Vec<u64>, Option<u64>)> {
    let peaks = conn
        .prepare_cached(
            "SELECT peak_mem_mib FROM attempts WHERE memory_key = ?1 AND peak_mem_mib IS NOT NULL",
        )?
        .query_map([key], |r| r.get::<_, i64>(0))?
        .map(|r| r.map(|p| p.max(0) as u64))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let floor: Option<i64> = conn
        .query_row(
            "SELECT floor_mib FROM memory_floors WHERE memory_key = ?1",
            [key],
            |r| r.get(0),
        )
        .optional()?;
    Ok((peaks, opt_u64(floor)))
}

fn cancel_one(tx: &Transaction<'_>, job: &str) -> Result<u64> {
    if job_state(tx, job)?.is_terminal() {
        return Ok(0);
    }
    transition(tx, job, JobEvent::Cancel)?;
    tx.execute(
        "UPDATE attempts SET cancel_requested = 1 WHERE job_id = ?1 AND phase != 'ended'",
        [job],
    )?;
    Ok(1)
}

#[allow(clippy::too_many_arguments)]
fn lease_job(
    tx: &Transaction<'_>,
    job: &str,
    node: &str,
    agent: AgentId,
    gpus: &[u32],
    (estimate, source): (Option<u64>, &'static str),
    now: Millis,
    ttl_ms: u64,
) -> Result<Lease> {
    #[allow(clippy::type_complexity)]
    let row: (
        String,
        String,
        String,
        String,
        String,
        Option<i64>,
        i64,
        i64,
        i64,
    ) = tx.query_row(
        "SELECT j.argv, j.env, j.params, e.name, j.memory_key, j.timeout_ms, j.attempts, j.fence, \
         j.ladder_step FROM jobs j JOIN experiments e ON e.id = j.experiment_id WHERE j.id = ?1",
        [job],
        |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
            ))
        },
    )?;
    let (argv, env, params_json, experiment, memory_key, timeout, attempts, fence, ladder_step) =
        row;
    let attempt = AttemptId::new();
    let number = attempts + 1;
    let fence = fence + 1;
    tx.execute(
        "INSERT INTO attempts (id, job_id, number, node, agent_id, gpus, fence, phase, estimate_mib, \
         leased_at, lease_expires_at, memory_key, estimate_source, params, ladder_step) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'leased', ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        params![
            attempt.to_string(),
            job,
            number,
            node,
            agent.to_string(),
            json(&gpus)?,
            fence,
            opt_i64(estimate),
            now,
            now + ttl_ms as i64,
            memory_key,
            source,
            params_json,
            ladder_step
        ],
    )?;
    tx.execute(
        "UPDATE jobs SET attempts = ?1, fence = ?2 WHERE id = ?3",
        params![number, fence, job],
    )?;
    transition(tx, job, JobEvent::Lease)?;
    Ok(Lease {
        attempt,
        job: parse(job, "job id")?,
        fence,
        number: number as u32,
        experiment,
        argv: from_json(&argv)?,
        env: from_json(&env)?,
        params: from_json(&params_json)?,
        gpus: gpus.to_vec(),
        estimate_mib: estimate,
        timeout_ms: opt_u64(timeout),
    })
}
