//! The embedded SQLite store (one file, WAL) for `headroom up` on one machine. SQLite calls
//! are blocking, so every method runs on the blocking pool behind one connection. The job
//! rules live in `crate::rules` and the row decoding in `rows`: this file holds SQL.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use headroom_shared::api::{
    AttemptPhase, AttemptTelemetry, AttemptView, ExperimentSummary, FinishReport, GpuSample,
    GpuSeries, JobDetail, JobSummary, Lease, NodeView, PeakSource, StateCounts, TelemetrySample,
};
use headroom_shared::pending::PendingReason;
use headroom_shared::{AgentId, AttemptId, ExperimentId, JobEvent, JobId, JobState, Plan};
use rusqlite::{Connection, Row, Transaction, TransactionBehavior, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::rows::{self, Cols, NodeRow, i64_of, opt_i64, opt_u64, parse};
use super::{
    Active, ClaimInput, Claimed, ExportRow, JobFilter, LeaseTo, Millis, NewExperiment, NewToken,
    Registered, Registration, Renewal, Renewed, Result, Retention, SeriesWindow, Store, StoreError,
    StoredToken, node_snapshot, node_view, now_ms,
};
use crate::changes::Changes;
use crate::rules::{self, AVOID_AFTER_HAND_BACK_MS, Learned, Slot};
use headroom_shared::api::TokenView;

mod embedded {
    refinery::embed_migrations!("migrations/sqlite");
}

/// Pending jobs looked at per claim; deeper ones wait for the next claim.
const CLAIM_WINDOW: i64 = 512;

#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    changes: Changes,
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
            changes: Changes::default(),
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

    /// Runs `f` in one write transaction; announces a change after the commit when `f`
    /// says it made one.
    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>, &mut bool) -> Result<T> + Send + 'static,
    {
        let (out, changed) = self
            .with(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let mut changed = false;
                let out = f(&tx, &mut changed)?;
                tx.commit()?;
                Ok((out, changed))
            })
            .await?;
        if changed {
            self.changes.bump();
        }
        Ok(out)
    }
}

// ---- statement helpers ------------------------------------------------------------

impl Cols for Row<'_> {
    fn text(&self, i: usize) -> Result<String> {
        Ok(self.get(i)?)
    }
    fn text_opt(&self, i: usize) -> Result<Option<String>> {
        Ok(self.get(i)?)
    }
    fn int(&self, i: usize) -> Result<i64> {
        Ok(self.get(i)?)
    }
    fn int_opt(&self, i: usize) -> Result<Option<i64>> {
        Ok(self.get(i)?)
    }
    fn flag(&self, i: usize) -> Result<bool> {
        Ok(self.get(i)?)
    }
    fn flag_opt(&self, i: usize) -> Result<Option<bool>> {
        Ok(self.get(i)?)
    }
    fn json<T: DeserializeOwned>(&self, i: usize) -> Result<T> {
        Ok(serde_json::from_str(&self.get::<_, String>(i)?)?)
    }
    fn json_opt<T: DeserializeOwned>(&self, i: usize) -> Result<Option<T>> {
        match self.get::<_, Option<String>>(i)? {
            Some(s) => Ok(Some(serde_json::from_str(&s)?)),
            None => Ok(None),
        }
    }
}

fn json<T: Serialize>(v: &T) -> Result<String> {
    Ok(serde_json::to_string(v)?)
}

/// Every row of `sql`, decoded by `f`.
fn all<T>(
    conn: &Connection,
    sql: &str,
    args: impl rusqlite::Params,
    f: impl Fn(&Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(args)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(f(r)?);
    }
    Ok(out)
}

/// The row of `sql` (by key: at most one), decoded by `f`, if there is one.
fn first<T>(
    conn: &Connection,
    sql: &str,
    args: impl rusqlite::Params,
    f: impl Fn(&Row<'_>) -> Result<T>,
) -> Result<Option<T>> {
    Ok(all(conn, sql, args, f)?.into_iter().next())
}

fn job_state(tx: &Transaction<'_>, job: &str) -> Result<JobState> {
    first(tx, "SELECT state FROM jobs WHERE id = ?1", [job], |r| {
        r.parsed(0, "job state")
    })?
    .ok_or_else(|| StoreError::not_found("job", job.to_string()))
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
        super::one_row(n as u64, job)?;
    }
    Ok(to)
}

/// The job columns the outcome rules read.
fn job_rules(tx: &Transaction<'_>, job: &str) -> Result<rules::JobRules> {
    let sql = format!(
        "SELECT {}, json_extract(e.spec, '$.memory_key') FROM jobs j \
         JOIN experiments e ON e.id = j.experiment_id WHERE j.id = ?1",
        rows::RULES_COLUMNS
    );
    first(tx, &sql, [job], |r| rows::job_rules(r))?
        .ok_or_else(|| StoreError::not_found("job", job.to_string()))
}

/// Records an active attempt as lost and requeues its job if the policy allows; false when
/// it had already ended.
fn lose_attempt(tx: &Transaction<'_>, attempt: &str) -> Result<bool> {
    let Some((job, started)) = first(
        tx,
        "SELECT job_id, started_at FROM attempts WHERE id = ?1 AND phase != 'ended'",
        [attempt],
        |r| Ok((r.text(0)?, r.int_opt(1)?)),
    )?
    else {
        return Ok(false);
    };
    tx.execute(
        "UPDATE attempts SET phase = 'ended', ended_at = ?1, failure_class = 'lost', \
         log_tail = COALESCE(log_tail, 'lost: the agent went away before reporting an end') \
         WHERE id = ?2",
        params![now_ms(), attempt],
    )?;
    let loss = rules::lose(&job_rules(tx, &job)?, started.is_some());
    tx.execute(
        "UPDATE jobs SET last_failure = 'lost', max_attempts = max_attempts + ?1 WHERE id = ?2",
        params![i64::from(loss.refund_attempt), job],
    )?;
    transition(tx, &job, loss.event)?;
    Ok(true)
}

fn node_of_agent(tx: &Connection, agent: AgentId) -> Result<NodeRow> {
    let sql = format!(
        "SELECT {} FROM nodes WHERE agent_id = ?1",
        rows::NODE_COLUMNS
    );
    first(tx, &sql, [agent.to_string()], |r| rows::node(r))?
        .ok_or(StoreError::UnknownAgent { agent })
}

/// Stores the latest samples; true when some GPU has more free memory than before.
fn record_telemetry(tx: &Transaction<'_>, node: &str, gpus: &[GpuSample]) -> Result<bool> {
    let before: Vec<GpuSample> = first(
        tx,
        "SELECT telemetry FROM nodes WHERE name = ?1",
        [node],
        |r| r.json_opt(0),
    )?
    .flatten()
    .unwrap_or_default();
    tx.execute(
        "UPDATE nodes SET telemetry = ?1, last_seen = ?2 WHERE name = ?3",
        params![json(&gpus)?, now_ms(), node],
    )?;
    Ok(rules::memory_freed(&before, gpus))
}

fn active_on(conn: &Connection, node: &str) -> Result<Vec<Active>> {
    all(
        conn,
        &format!(
            "SELECT {} FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.node = ?1 AND a.phase != 'ended'",
            rows::ACTIVE_COLUMNS
        ),
        [node],
        |r| rows::active(r),
    )
}

/// Checks a report's fencing token; returns the attempt's job and phase.
fn check_fence(
    tx: &Transaction<'_>,
    attempt: AttemptId,
    fence: i64,
) -> Result<(String, AttemptPhase)> {
    let row = first(
        tx,
        "SELECT a.phase, a.fence, j.fence, a.job_id FROM attempts a \
         JOIN jobs j ON j.id = a.job_id WHERE a.id = ?1",
        [attempt.to_string()],
        |r| Ok((rows::fence_row(r)?, r.text(3)?)),
    )?;
    let Some((row, job)) = row else {
        return Err(StoreError::not_found("attempt", attempt.to_string()));
    };
    rules::check_fence(attempt, fence, &row)?;
    Ok((job, row.phase))
}

/// The fence check of a finish report, which may also be the late end of a lost attempt
/// (`rules::check_finish`); returns the job and how the report stands.
fn check_finish_fence(
    tx: &Transaction<'_>,
    attempt: AttemptId,
    fence: i64,
) -> Result<(String, rules::Report)> {
    let row = first(
        tx,
        "SELECT a.phase, a.fence, j.fence, a.job_id, a.failure_class, \
         a.started_at IS NOT NULL FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.id = ?1",
        [attempt.to_string()],
        |r| {
            let row = rules::FinishRow {
                fence: rows::fence_row(r)?,
                failure: r.parsed_opt(4, "failure class")?,
                started: r.flag(5)?,
            };
            Ok((row, r.text(3)?))
        },
    )?;
    let Some((row, job)) = row else {
        return Err(StoreError::not_found("attempt", attempt.to_string()));
    };
    Ok((job, rules::check_finish(attempt, fence, &row)?))
}

/// Undoes what recording an attempt lost wrote to its job, before its late report applies.
fn undo_loss(tx: &Transaction<'_>, job: &str, refunded: bool) -> Result<()> {
    tx.execute(
        "UPDATE jobs SET last_failure = NULL, pending_reason = NULL, \
         max_attempts = max_attempts - ?1 WHERE id = ?2",
        params![i64::from(refunded), job],
    )?;
    Ok(())
}

fn summaries(
    conn: &Connection,
    filter: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<JobSummary>> {
    let sql = format!("SELECT {} {} {filter}", rows::JOB_COLUMNS, rows::JOB_FROM);
    all(conn, &sql, args, |r| rows::job_summary(r))
}

fn attempts(
    conn: &Connection,
    filter: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<AttemptView>> {
    let sql = format!("SELECT {} FROM attempts {filter}", rows::ATTEMPT_COLUMNS);
    all(conn, &sql, args, |r| rows::attempt_view(r))
}

fn counts_for(conn: &Connection, experiment: Option<&str>) -> Result<StateCounts> {
    let mut counts = StateCounts::default();
    for (state, n) in all(
        conn,
        "SELECT state, COUNT(*) FROM jobs WHERE (?1 IS NULL OR experiment_id = ?1) GROUP BY state",
        [experiment],
        |r| Ok((r.parsed(0, "job state")?, r.int(1)?)),
    )? {
        counts.add(state, n as u64);
    }
    Ok(counts)
}

fn experiment_summary(conn: &Connection, id: &str) -> Result<ExperimentSummary> {
    let row = first(
        conn,
        "SELECT name, seed, created_at, submitted_by FROM experiments WHERE id = ?1",
        [id],
        |r| Ok((r.text(0)?, r.int(1)?, r.time(2)?, r.text(3)?)),
    )?
    .ok_or_else(|| StoreError::not_found("experiment", id))?;
    rows::experiment(id, row, counts_for(conn, Some(id))?)
}

/// Observed peaks and the OOM floor of a memory key.
fn key_memory(conn: &Connection, key: &str) -> Result<(Vec<u64>, Option<u64>)> {
    let peaks = all(
        conn,
        "SELECT peak_mem_mib FROM attempts WHERE memory_key = ?1 AND peak_mem_mib IS NOT NULL",
        [key],
        |r| Ok(r.int(0)?.max(0) as u64),
    )?;
    let floor = first(
        conn,
        "SELECT floor_mib FROM memory_floors WHERE memory_key = ?1",
        [key],
        |r| r.mib_opt(0),
    )?
    .flatten();
    Ok((peaks, floor))
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

fn lease_job(tx: &Transaction<'_>, to: &LeaseTo<'_>, job: &str, slot: &Slot) -> Result<Lease> {
    let (gpus, estimate, source) = (&slot.gpus, slot.estimate, slot.source);
    let sql = format!(
        "SELECT {} FROM jobs j JOIN experiments e ON e.id = j.experiment_id WHERE j.id = ?1",
        rows::LEASE_COLUMNS
    );
    let row = first(tx, &sql, [job], |r| rows::lease_row(r))?
        .ok_or_else(|| StoreError::not_found("job", job.to_string()))?;
    let lease = rows::lease_row_into(row, AttemptId::new(), job, gpus, estimate)?;
    tx.execute(
        "INSERT INTO attempts (id, job_id, number, node, agent_id, gpus, fence, phase, \
         estimate_mib, leased_at, lease_expires_at, memory_key, estimate_source, params, \
         ladder_step, submitted_by) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'leased', ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
         (SELECT submitted_by FROM jobs WHERE id = ?2))",
        params![
            lease.lease.attempt.to_string(),
            job,
            lease.lease.number,
            to.node,
            to.agent.to_string(),
            json(&gpus)?,
            lease.lease.fence,
            opt_i64(estimate),
            to.now,
            to.now.saturating_add(i64_of(to.ttl_ms)),
            lease.memory_key,
            source,
            json(&lease.lease.params)?,
            lease.ladder_step
        ],
    )?;
    tx.execute(
        "UPDATE jobs SET attempts = ?1, fence = ?2, pending_reason = NULL WHERE id = ?3",
        params![lease.lease.number, lease.lease.fence, job],
    )?;
    transition(tx, job, JobEvent::Lease)?;
    Ok(lease.lease)
}

#[async_trait]
impl Store for SqliteStore {
    fn changes(&self) -> Changes {
        self.changes.clone()
    }

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
        self.write(move |tx, changed| {
            let now = now_ms();
            let id = exp.id.to_string();
            tx.execute(
                "INSERT INTO experiments (id, name, seed, spec, created_at, submitted_by) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![id, exp.name, exp.seed as i64, json(&exp.spec)?, now, exp.submitted_by],
            )?;
            let mut stmt = tx.prepare_cached(
                "INSERT INTO jobs (id, experiment_id, idx, config, run, state, priority, params, \
                 argv, env, profile, gpus, estimate_mib, timeout_ms, max_attempts, retry_on, \
                 created_at, updated_at, memory_key, command, shell, ladder, submitted_by, \
                 prestart, background, background_mib) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?16, \
                 ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24)",
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
                    exp.submitted_by,
                    j.prestart.as_ref().map(json).transpose()?,
                    j.background.as_ref().map(json).transpose()?,
                    j.background.as_ref().map(|b| i64_of(b.memory_mib)),
                ])?;
            }
            drop(stmt);
            *changed = true;
            experiment_summary(tx, &id)
        })
        .await
    }

    async fn list_experiments(&self) -> Result<Vec<ExperimentSummary>> {
        self.with(|c| {
            let ids = all(
                c,
                "SELECT id FROM experiments ORDER BY created_at, id",
                [],
                |r| r.text(0),
            )?;
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
            let exp = filter.experiment.map(|e| e.to_string());
            let state = filter.state.map(|s| s.as_str().to_string());
            let limit = filter.limit.map(i64::from).unwrap_or(-1);
            summaries(
                c,
                "WHERE (?1 IS NULL OR j.experiment_id = ?1) AND (?2 IS NULL OR j.state = ?2) \
                 ORDER BY j.seq LIMIT ?3",
                params![exp, state, limit],
            )
        })
        .await
    }

    async fn job(&self, id: JobId) -> Result<JobDetail> {
        self.with(move |c| {
            let id = id.to_string();
            let not_found = || StoreError::not_found("job", id.clone());
            let summary = summaries(c, "WHERE j.id = ?1", [&id])?
                .pop()
                .ok_or_else(not_found)?;
            let attempts = attempts(c, "WHERE job_id = ?1 ORDER BY number", [&id])?;
            let sql = format!("SELECT {} FROM jobs WHERE id = ?1", rows::DETAIL_COLUMNS);
            first(c, &sql, [&id], |r| {
                rows::job_detail(summary.clone(), r, attempts.clone())
            })?
            .ok_or_else(not_found)
        })
        .await
    }

    async fn attempt(&self, id: AttemptId) -> Result<AttemptView> {
        self.with(move |c| {
            attempts(c, "WHERE id = ?1", [id.to_string()])?
                .pop()
                .ok_or_else(|| StoreError::not_found("attempt", id.to_string()))
        })
        .await
    }

    async fn check_log_fence(&self, attempt: AttemptId, fence: i64) -> Result<()> {
        self.with(move |c| {
            let (row, failure) = first(
                c,
                "SELECT a.phase, a.fence, j.fence, a.failure_class FROM attempts a \
                 JOIN jobs j ON j.id = a.job_id WHERE a.id = ?1",
                [attempt.to_string()],
                |r| Ok((rows::fence_row(r)?, r.parsed_opt(3, "failure class")?)),
            )?
            .ok_or_else(|| StoreError::not_found("attempt", attempt.to_string()))?;
            rules::check_log_fence(attempt, fence, &row, failure)
        })
        .await
    }

    async fn cancel_job(&self, id: JobId) -> Result<u64> {
        self.write(move |tx, changed| {
            let n = cancel_one(tx, &id.to_string())?;
            *changed = n > 0;
            Ok(n)
        })
        .await
    }

    async fn cancel_experiment(&self, id: ExperimentId) -> Result<u64> {
        self.write(move |tx, changed| {
            let id = id.to_string();
            experiment_summary(tx, &id)?;
            let jobs = all(
                tx,
                "SELECT id FROM jobs WHERE experiment_id = ?1 \
                 AND state NOT IN ('succeeded', 'failed', 'cancelled')",
                [&id],
                |r| r.text(0),
            )?;
            let mut n = 0;
            for job in jobs {
                n += cancel_one(tx, &job)?;
            }
            *changed = n > 0;
            Ok(n)
        })
        .await
    }

    async fn retry_job(&self, id: JobId) -> Result<JobState> {
        self.write(move |tx, changed| {
            let id = id.to_string();
            let state = transition(tx, &id, JobEvent::Retry)?;
            // One more attempt than used so far: a manual retry is one new try.
            tx.execute(
                "UPDATE jobs SET max_attempts = attempts + 1 WHERE id = ?1",
                [&id],
            )?;
            *changed = true;
            Ok(state)
        })
        .await
    }

    async fn export_rows(&self, experiment: Option<ExperimentId>) -> Result<Vec<ExportRow>> {
        self.with(move |c| {
            let exp = experiment.map(|e| e.to_string());
            let jobs = summaries(
                c,
                "WHERE (?1 IS NULL OR j.experiment_id = ?1) ORDER BY j.seq",
                [&exp],
            )?;
            let attempts = attempts(
                c,
                "WHERE job_id IN (SELECT id FROM jobs WHERE ?1 IS NULL OR experiment_id = ?1) \
                 ORDER BY number",
                [&exp],
            )?;
            Ok(super::export_rows(jobs, attempts))
        })
        .await
    }

    async fn register_agent(&self, reg: Registration) -> Result<Registered> {
        self.write(move |tx, changed| {
            let now = now_ms();
            let stored = first(
                tx,
                "SELECT plan, headroom FROM nodes WHERE name = ?1",
                [&reg.node],
                |r| Ok((r.text(0)?, r.text(1)?)),
            )?;
            let (plan, headroom) = rules::merge_registration(&reg, stored)?;
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
            let until = now.saturating_add(i64_of(reg.lease_ttl_ms));
            let mut lost = Vec::new();
            for a in active_on(tx, &reg.node)? {
                let resumed = rules::resumes(&reg.resume, &a.id, a.fence)
                    && tx.execute(
                        "UPDATE attempts SET agent_id = ?1, lease_expires_at = ?2 \
                         WHERE id = ?3 AND phase != 'ended'",
                        params![reg.agent.to_string(), until, a.id],
                    )? == 1;
                if !resumed && lose_attempt(tx, &a.id)? {
                    lost.push(parse(&a.id, "attempt id")?);
                }
            }
            *changed = true;
            Ok(Registered { plan, lost })
        })
        .await
    }

    async fn set_plan(&self, node: &str, plan: &str) -> Result<Plan> {
        let (node, plan) = (node.to_string(), plan.to_string());
        self.write(move |tx, changed| {
            let gpus: Vec<headroom_shared::api::GpuInfo> =
                first(tx, "SELECT gpus FROM nodes WHERE name = ?1", [&node], |r| {
                    r.json(0)
                })?
                .ok_or_else(|| StoreError::not_found("node", node.clone()))?;
            let plan = Plan::parse_for(&plan, gpus.len())?;
            tx.execute(
                "UPDATE nodes SET plan = ?1 WHERE name = ?2",
                params![plan.to_string(), node],
            )?;
            *changed = true;
            Ok(plan)
        })
        .await
    }

    async fn list_nodes(&self, alive_within_ms: u64) -> Result<Vec<NodeView>> {
        self.with(move |c| {
            let sql = format!("SELECT {} FROM nodes ORDER BY name", rows::NODE_COLUMNS);
            let now = now_ms();
            let mut out = Vec::new();
            for row in all(c, &sql, [], |r| rows::node(r))? {
                let active = active_on(c, &row.name)?;
                let quarantine = all(
                    c,
                    "SELECT gpu, attempt_id, reason, since FROM quarantine WHERE node = ?1 \
                     ORDER BY since",
                    [&row.name],
                    |r| rows::quarantine(r),
                )?;
                out.push(node_view(row, &active, &quarantine, alive_within_ms, now)?);
            }
            Ok(out)
        })
        .await
    }

    async fn max_node_gpus(&self) -> Result<Option<u32>> {
        self.with(|c| {
            let counts = all(c, "SELECT json_array_length(gpus) FROM nodes", [], |r| {
                r.int(0)
            })?;
            Ok(counts.into_iter().max().map(|n| n as u32))
        })
        .await
    }

    async fn claim_jobs(&self, mut input: ClaimInput) -> Result<Claimed> {
        self.write(move |tx, changed| {
            let node = node_of_agent(tx, input.agent)?;
            let samples = match input.gpus.take() {
                Some(g) => {
                    *changed |= record_telemetry(tx, &node.name, &g)?;
                    g
                }
                None => node.samples.clone(),
            };
            let now = now_ms();
            let to = LeaseTo::new(&node, &input, now);
            let active = active_on(tx, &node.name)?;
            let blocked = all(
                tx,
                "SELECT gpu FROM quarantine WHERE node = ?1 \
                 UNION SELECT gpu FROM gpu_avoid WHERE node = ?1 AND until_ms > ?2",
                params![node.name, now],
                |r| Ok(r.int(0)? as u32),
            )?;
            let snapshot = node_snapshot(&node, &samples, &active, &blocked, &input);
            if input.max == 0 {
                return Ok(Claimed {
                    leases: vec![],
                    plan: node.plan,
                });
            }
            let pending = all(
                tx,
                &format!(
                    "SELECT {} FROM jobs WHERE state IN ('queued', 'retrying') AND gpus <= ?1 \
                     ORDER BY priority DESC, seq LIMIT ?2",
                    rows::PENDING_COLUMNS
                ),
                params![node.gpus.len() as i64, CLAIM_WINDOW],
                |r| rows::pending(r),
            )?;
            // What each memory key has taught so far, read once per key.
            let mut learned = Learned::new();
            for p in &pending {
                if !learned.contains_key(&p.memory_key) {
                    learned.insert(p.memory_key.clone(), key_memory(tx, &p.memory_key)?);
                }
            }
            let plan = rules::claim(&snapshot, &pending, &learned, now, input.max as usize);
            let mut leases = Vec::with_capacity(plan.leases.len());
            for slot in &plan.leases {
                leases.push(lease_job(tx, &to, &pending[slot.candidate].id, slot)?);
            }
            for (i, reason) in &plan.reasons {
                set_reason(tx, &pending[*i].id, reason)?;
            }
            *changed |= !leases.is_empty();
            Ok(Claimed {
                leases,
                plan: node.plan,
            })
        })
        .await
    }

    async fn pending_cancels(&self, agent: AgentId, of: &[AttemptId]) -> Result<Vec<AttemptId>> {
        let watching: Vec<String> = of.iter().map(AttemptId::to_string).collect();
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

    async fn renew_leases(&self, r: Renewal) -> Result<Renewed> {
        let (agent, attempts, gpus, lease_ttl_ms) = (r.agent, r.attempts, r.gpus, r.lease_ttl_ms);
        self.write(move |tx, changed| {
            let node = node_of_agent(tx, agent)?;
            // A stale token for any attempt refuses the whole heartbeat, before it writes.
            let mut renew = Vec::new();
            for a in &attempts {
                let row = first(
                    tx,
                    "SELECT a.phase, a.fence, j.fence, a.failure_class, a.agent_id = ?2 \
                     FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.id = ?1",
                    params![a.attempt.to_string(), agent.to_string()],
                    |r| rows::renewal_row(r),
                )?;
                if rules::renewal(a.attempt, a.fence, row.as_ref())? {
                    renew.push((a.attempt, a.waiting.clone()));
                }
            }
            *changed = record_telemetry(tx, &node.name, &gpus)?;
            let until = now_ms().saturating_add(i64_of(lease_ttl_ms));
            let mut cancel = Vec::new();
            for (a, waiting) in renew {
                let wanted = first(
                    tx,
                    "UPDATE attempts SET lease_expires_at = ?1, waiting = ?3 WHERE id = ?2 \
                     RETURNING cancel_requested",
                    params![until, a.to_string(), waiting],
                    |r| r.flag(0),
                )?;
                if wanted == Some(true) {
                    cancel.push(a);
                }
            }
            Ok(Renewed {
                cancel,
                plan: node.plan,
            })
        })
        .await
    }

    async fn start_attempt(&self, a: AttemptId, fence: i64, pid: u32, at: Millis) -> Result<()> {
        let (attempt, started_at) = (a, at);
        self.write(move |tx, changed| {
            let (job, phase) = check_fence(tx, attempt, fence)?;
            if phase != AttemptPhase::Leased {
                return Ok(()); // a repeated report
            }
            tx.execute(
                "UPDATE attempts SET phase = 'running', pid = ?1, started_at = ?2 WHERE id = ?3",
                params![pid, started_at, attempt.to_string()],
            )?;
            if job_state(tx, &job)? != JobState::Cancelled {
                transition(tx, &job, JobEvent::Start)?;
            }
            *changed = true;
            Ok(())
        })
        .await
    }

    async fn finish_attempt(&self, attempt: AttemptId, report: FinishReport) -> Result<JobState> {
        self.write(move |tx, changed| {
            let (job, standing) = check_finish_fence(tx, attempt, report.fence)?;
            if let rules::Report::Late { refunded } = standing {
                undo_loss(tx, &job, refunded)?;
            }
            let id = attempt.to_string();
            let m = rows::measure_row(&report.measurements);
            let bg = report.background.as_ref();
            let (node, gpus, key, estimate) = first(
                tx,
                "UPDATE attempts SET phase = 'ended', ended_at = ?1, exit_code = ?2, signal = ?3, \
                 failure_class = ?4, peak_mem_mib = ?5, cleanup_ms = ?6, cleanup_verified = ?7, \
                 log_tail = ?8, started_at = COALESCE(started_at, ?1), contaminated = ?10, \
                 peak_source = ?11, energy_mj = ?12, energy_source = ?13, mean_power_mw = ?14, \
                 max_power_mw = ?15, max_temp_mdeg = ?16, start_temp_mdeg = ?17, \
                 mean_util_mpct = ?18, throttled_thermal = ?19, throttled_power = ?20, \
                 throttle_reasons = ?21, contamination_reason = ?22, contamination_pid = ?23, \
                 contamination_command = ?24, background_pid = ?25, background_ready_ms = ?26, \
                 background_exit_code = ?27, background_signal = ?28, \
                 background_exited_early = ?29 \
                 WHERE id = ?9 RETURNING node, gpus, memory_key, estimate_mib",
                params![
                    report.ended_at.timestamp_millis(),
                    report.exit_code,
                    report.signal,
                    report.failure.map(|f| f.as_str()),
                    opt_i64(report.peak_mem_mib),
                    i64_of(report.cleanup_ms),
                    report.cleanup_verified,
                    report.log_tail,
                    id,
                    report.contaminated,
                    rules::peak_source(&report).map(PeakSource::as_str),
                    m.energy_mj,
                    m.energy_source,
                    m.mean_power_mw,
                    m.max_power_mw,
                    m.max_temp_mdeg,
                    m.start_temp_mdeg,
                    m.mean_util_mpct,
                    m.throttled_thermal,
                    m.throttled_power,
                    m.throttle_reasons.as_ref().map(json).transpose()?,
                    m.contamination_reason,
                    m.contamination_pid,
                    m.contamination_command,
                    bg.and_then(|b| b.pid),
                    bg.and_then(|b| opt_i64(b.ready_ms)),
                    bg.and_then(|b| b.exit_code),
                    bg.and_then(|b| b.signal),
                    bg.map(|b| b.exited_early),
                ],
                |r| {
                    Ok((
                        r.text(0)?,
                        r.json::<Vec<u32>>(1)?,
                        r.text(2)?,
                        r.mib_opt(3)?,
                    ))
                },
            )?
            .ok_or_else(|| StoreError::not_found("attempt", id.clone()))?;
            if let Some(p) = &report.prestart {
                tx.execute(
                    "UPDATE attempts SET exclusive_wait_ms = ?1, cooldown_wait_ms = ?2, \
                     cooldown_from_mdeg = ?3, cooldown_start_mdeg = ?4, cooldown_timed_out = ?5 \
                     WHERE id = ?6",
                    params![
                        opt_i64(p.exclusive_wait_ms),
                        opt_i64(p.cooldown_wait_ms),
                        rows::mdeg(p.cooldown_from_temp_c),
                        rows::mdeg(p.cooldown_start_temp_c),
                        p.cooldown_timed_out,
                        id,
                    ],
                )?;
            }
            if !report.gpus.is_empty() {
                record_telemetry(tx, &node, &report.gpus)?;
            }
            // The attempt was placed by the pair's memory; the job's own key learns its own.
            let background_mib: Option<i64> = first(
                tx,
                "SELECT background_mib FROM jobs WHERE id = ?1",
                params![job],
                |r| r.int_opt(0),
            )?
            .flatten();
            let estimate = rules::foreground_estimate(estimate, opt_u64(background_mib));
            let mut f = rules::finish(&job_rules(tx, &job)?, estimate, &report)?;
            if standing != rules::Report::OnTime {
                f.event = rules::late_event(f.event);
            }
            if let Some(reason) = &f.quarantine {
                for gpu in gpus {
                    tx.execute(
                        "INSERT INTO quarantine (node, gpu, attempt_id, reason, since) \
                         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (node, gpu, attempt_id) \
                         DO UPDATE SET reason = excluded.reason, since = excluded.since",
                        params![node, gpu, id, reason, now_ms()],
                    )?;
                }
            }
            if let Some(class) = f.last_failure {
                tx.execute(
                    "UPDATE jobs SET last_failure = ?1 WHERE id = ?2",
                    params![class.as_str(), job],
                )?;
            }
            if let Some(floor) = f.floor {
                tx.execute(
                    "INSERT INTO memory_floors (memory_key, floor_mib) VALUES (?1, ?2) \
                     ON CONFLICT (memory_key) DO UPDATE SET floor_mib = MAX(floor_mib, ?2)",
                    params![key, i64_of(floor)],
                )?;
            }
            if let Some(l) = &f.ladder {
                tx.execute(
                    "UPDATE jobs SET params = ?1, argv = ?2, memory_key = ?3, ladder_step = ?4, \
                     max_attempts = ?5 WHERE id = ?6",
                    params![
                        json(&l.params)?,
                        json(&l.argv)?,
                        l.memory_key,
                        l.ladder_step,
                        l.max_attempts,
                        job
                    ],
                )?;
            }
            *changed = true;
            transition(tx, &job, f.event)
        })
        .await
    }

    async fn hand_back(&self, attempt: AttemptId, fence: i64, gpus: &[GpuSample]) -> Result<()> {
        let gpus = gpus.to_vec();
        self.write(move |tx, changed| {
            let (job, phase) = check_fence(tx, attempt, fence)?;
            if phase != AttemptPhase::Leased {
                return Err(StoreError::StaleFence { attempt });
            }
            let (node, on): (String, Vec<u32>) = first(
                tx,
                "DELETE FROM attempts WHERE id = ?1 RETURNING node, gpus",
                [attempt.to_string()],
                |r| Ok((r.text(0)?, r.json(1)?)),
            )?
            .ok_or(StoreError::StaleFence { attempt })?;
            let until = now_ms() + AVOID_AFTER_HAND_BACK_MS;
            for gpu in on {
                tx.execute(
                    "INSERT INTO gpu_avoid (node, gpu, until_ms) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (node, gpu) DO UPDATE SET until_ms = excluded.until_ms",
                    params![node, gpu, until],
                )?;
            }
            let left = first(
                tx,
                "UPDATE jobs SET attempts = attempts - 1 WHERE id = ?1 RETURNING attempts",
                [&job],
                |r| r.int(0),
            )?
            .unwrap_or(0);
            record_telemetry(tx, &node, &gpus)?;
            transition(tx, &job, rules::hand_back(left.max(0) as u32))?;
            *changed = true;
            Ok(())
        })
        .await
    }

    async fn expire_leases(&self) -> Result<Vec<AttemptId>> {
        self.write(|tx, changed| {
            let expired = all(
                tx,
                "SELECT id FROM attempts WHERE phase != 'ended' AND lease_expires_at < ?1",
                [now_ms()],
                |r| r.text(0),
            )?;
            let mut lost = Vec::new();
            for a in expired {
                if lose_attempt(tx, &a)? {
                    lost.push(parse(&a, "attempt id")?);
                }
            }
            *changed = !lost.is_empty();
            Ok(lost)
        })
        .await
    }

    async fn release_attempts(&self, agent: AgentId, attempts: &[AttemptId]) -> Result<u64> {
        let attempts: Vec<String> = attempts.iter().map(|a| a.to_string()).collect();
        self.write(move |tx, changed| {
            let node = node_of_agent(tx, agent)?;
            let mut n = 0;
            for a in attempts {
                n += tx.execute(
                    "DELETE FROM quarantine WHERE node = ?1 AND attempt_id = ?2",
                    params![node.name, a],
                )? as u64;
            }
            *changed = n > 0;
            Ok(n)
        })
        .await
    }

    async fn release_gpu(&self, node: &str, gpu: u32) -> Result<u64> {
        let node = node.to_string();
        self.write(move |tx, changed| {
            let gpus: Vec<headroom_shared::api::GpuInfo> =
                first(tx, "SELECT gpus FROM nodes WHERE name = ?1", [&node], |r| {
                    r.json(0)
                })?
                .ok_or_else(|| StoreError::not_found("node", node.clone()))?;
            super::check_gpu(&node, &gpus, gpu)?;
            let n = tx.execute(
                "DELETE FROM quarantine WHERE node = ?1 AND gpu = ?2",
                params![node, gpu],
            )? as u64;
            *changed = n > 0;
            Ok(n)
        })
        .await
    }

    async fn record_telemetry(&self, agent: AgentId, samples: Vec<TelemetrySample>) -> Result<u64> {
        if samples.is_empty() {
            return Ok(0);
        }
        self.write(move |tx, _changed| {
            let node = node_of_agent(tx, agent)?;
            super::check_telemetry_gpus(&node.gpus, &samples)?;
            let mut stmt = tx.prepare_cached(&format!(
                "INSERT OR IGNORE INTO gpu_telemetry (node, {}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                rows::TELEMETRY_COLUMNS
            ))?;
            let mut stored = 0u64;
            for s in &samples {
                let r = rows::telemetry_row(s);
                let throttle = r.throttle.as_ref().map(json).transpose()?;
                stored += stmt.execute(params![
                    node.name,
                    r.gpu,
                    r.at,
                    r.used_mib,
                    r.free_mib,
                    r.total_mib,
                    r.utilization_pct,
                    r.power_mw,
                    r.energy_mj,
                    r.temperature_mdeg,
                    r.sm_clock_mhz,
                    throttle,
                    r.error,
                ])? as u64;
            }
            Ok(stored)
        })
        .await
    }

    async fn create_token(&self, t: NewToken) -> Result<TokenView> {
        self.write(move |tx, _| {
            let n = tx.execute(
                "INSERT INTO tokens (id, name, role, secret_hash, created_by, created_at, \
                 expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (id) DO NOTHING",
                params![
                    t.id,
                    t.name,
                    t.role.as_str(),
                    t.secret_hash,
                    t.created_by,
                    now_ms(),
                    t.expires_at
                ],
            )?;
            if n != 1 {
                return Err(StoreError::Database(format!("token id {} exists", t.id)));
            }
            Ok(token_by_id(tx, &t.id)?.view)
        })
        .await
    }

    async fn telemetry_of_gpu(
        &self,
        node: &str,
        gpu: u32,
        window: SeriesWindow,
    ) -> Result<Vec<TelemetrySample>> {
        let node = node.to_string();
        self.with(move |c| {
            let gpus: Vec<headroom_shared::api::GpuInfo> =
                first(c, "SELECT gpus FROM nodes WHERE name = ?1", [&node], |r| {
                    r.json(0)
                })?
                .ok_or_else(|| StoreError::not_found("node", node.clone()))?;
            super::check_gpu(&node, &gpus, gpu)?;
            series(c, &node, gpu, &window)
        })
        .await
    }

    async fn token_by_id(&self, id: &str) -> Result<StoredToken> {
        let id = id.to_string();
        self.with(move |c| token_by_id(c, &id)).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenView>> {
        self.with(move |c| {
            let sql = format!(
                "SELECT {} FROM tokens ORDER BY created_at, id",
                rows::TOKEN_COLUMNS
            );
            Ok(all(c, &sql, [], |r| rows::token_row(r))?
                .into_iter()
                .map(|t| t.view)
                .collect())
        })
        .await
    }

    async fn telemetry_of_attempt(
        &self,
        attempt: AttemptId,
        limit: u32,
    ) -> Result<AttemptTelemetry> {
        self.with(move |c| {
            let a = attempts(c, "WHERE id = ?1", [attempt.to_string()])?
                .pop()
                .ok_or_else(|| StoreError::not_found("attempt", attempt.to_string()))?;
            let window = super::attempt_window(&a, limit);
            let mut gpus = Vec::new();
            for &gpu in &a.gpus {
                let samples = match &window {
                    Some(w) => series(c, &a.node, gpu, w)?,
                    None => Vec::new(),
                };
                gpus.push(GpuSeries {
                    node: a.node.clone(),
                    gpu,
                    samples,
                });
            }
            Ok(super::attempt_telemetry(&a, gpus))
        })
        .await
    }

    async fn prune_telemetry(&self, keep: Retention) -> Result<u64> {
        self.write(move |tx, _changed| {
            let batch = i64::from(keep.batch);
            let mut gone = tx.execute(
                "DELETE FROM gpu_telemetry WHERE id IN \
                 (SELECT id FROM gpu_telemetry WHERE at < ?1 ORDER BY at LIMIT ?2)",
                params![keep.older_than, batch],
            )? as u64;
            let nodes = all(tx, "SELECT name, gpus FROM nodes", [], |r| {
                Ok((r.text(0)?, r.json::<Vec<headroom_shared::api::GpuInfo>>(1)?))
            })?;
            for (node, gpus) in nodes {
                for g in gpus {
                    let left = batch - gone as i64;
                    if left <= 0 {
                        return Ok(gone);
                    }
                    // The newest sample beyond the count kept: it and older ones go.
                    let cutoff = first(
                        tx,
                        "SELECT at, id FROM gpu_telemetry WHERE node = ?1 AND gpu = ?2 \
                         ORDER BY at DESC, id DESC LIMIT 1 OFFSET ?3",
                        params![node, g.index, i64_of(keep.keep_per_gpu)],
                        |r| Ok((r.int(0)?, r.int(1)?)),
                    )?;
                    if let Some((at, id)) = cutoff {
                        gone += tx.execute(
                            "DELETE FROM gpu_telemetry WHERE id IN \
                             (SELECT id FROM gpu_telemetry WHERE node = ?1 AND gpu = ?2 \
                              AND (at < ?3 OR (at = ?3 AND id <= ?4)) ORDER BY at LIMIT ?5)",
                            params![node, g.index, at, id, left],
                        )? as u64;
                    }
                }
            }
            Ok(gone)
        })
        .await
    }

    async fn submitted_at(&self, attempt: AttemptId) -> Result<(Millis, u32)> {
        self.with(move |c| {
            first(
                c,
                "SELECT j.created_at, a.number FROM attempts a JOIN jobs j ON j.id = a.job_id \
                 WHERE a.id = ?1",
                [attempt.to_string()],
                |r| Ok((r.int(0)?, r.int(1)?.clamp(0, i64::from(u32::MAX)) as u32)),
            )?
            .ok_or_else(|| StoreError::not_found("attempt", attempt.to_string()))
        })
        .await
    }

    async fn pending_reason_counts(&self) -> Result<Vec<(String, u64)>> {
        self.with(|c| {
            all(
                c,
                "SELECT COALESCE(json_extract(pending_reason, '$.reason'), 'not_considered'), \
                 COUNT(*) FROM jobs WHERE state IN ('queued', 'retrying') GROUP BY 1 ORDER BY 1",
                [],
                |r| Ok((r.text(0)?, r.int(1)?.max(0) as u64)),
            )
        })
        .await
    }

    async fn revoke_token(&self, id: &str) -> Result<TokenView> {
        let id = id.to_string();
        self.write(move |tx, _| {
            let n = tx.execute(
                "UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?1) WHERE id = ?2",
                params![now_ms(), id],
            )?;
            if n != 1 {
                return Err(StoreError::not_found("token", id));
            }
            Ok(token_by_id(tx, &id)?.view)
        })
        .await
    }
}

/// One GPU's samples in `w`, oldest first (the newest `w.limit` of them).
fn series(c: &Connection, node: &str, gpu: u32, w: &SeriesWindow) -> Result<Vec<TelemetrySample>> {
    let sql = format!(
        "SELECT {} FROM gpu_telemetry WHERE node = ?1 AND gpu = ?2 AND at >= ?3 AND at <= ?4 \
         ORDER BY at DESC, id DESC LIMIT ?5",
        rows::TELEMETRY_COLUMNS
    );
    let mut out = all(
        c,
        &sql,
        params![node, gpu, w.since, w.until, i64::from(w.limit)],
        |r| rows::telemetry_sample(r),
    )?;
    out.reverse();
    Ok(out)
}

fn token_by_id(conn: &Connection, id: &str) -> Result<StoredToken> {
    let sql = format!("SELECT {} FROM tokens WHERE id = ?1", rows::TOKEN_COLUMNS);
    first(conn, &sql, [id], |r| rows::token_row(r))?
        .ok_or_else(|| StoreError::not_found("token", id))
}

/// Stores a job's pending reason, as the claim that looked at it saw it.
fn set_reason(tx: &Transaction<'_>, job: &str, reason: &PendingReason) -> Result<()> {
    tx.execute(
        "UPDATE jobs SET pending_reason = ?1 WHERE id = ?2",
        params![json(reason)?, job],
    )?;
    Ok(())
}
