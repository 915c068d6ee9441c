//! The embedded SQLite store (one file, WAL) for `headroom up` on one machine: the SQL of
//! each `Tx` statement. SQLite calls block, so each operation runs whole on the blocking
//! pool behind the one connection (its statements never wait, so the operation's future is
//! driven there to completion). Write transactions are `BEGIN IMMEDIATE`: they hold the
//! database's write lock from the start, which is why `lock_*` statements only read here.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use headroom_shared::api::{
    AttemptView, FinishReport, GpuInfo, GpuSample, Headroom, JobDetail, JobSummary, PeakSource,
    QuarantineView, StateCounts, TelemetrySample,
};
use headroom_shared::pending::PendingReason;
use headroom_shared::{AgentId, FailureClass, JobState, Plan};
use rusqlite::{Connection, Row, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::rows::{self, Cols, LeaseRow, NodeRow, i64_of, opt_i64};
use super::tx::{AttemptsWhere, Backend, Ended, JobsWhere, NewAttempt, Op, Tx};
use super::{
    Active, Millis, NewExperiment, NewToken, Result, SeriesWindow, StoreError, StoredToken,
};
use crate::changes::Changes;
use crate::rules::{FenceRow, FinishRow, JobRules, LadderStep, PendingRow, RenewalRow};

mod embedded {
    refinery::embed_migrations!("migrations/sqlite");
}

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

    /// Runs `op` on the blocking pool over the connection, inside `begin`/`COMMIT` when
    /// `begin` is given (rolled back when the operation fails).
    async fn run<T: Send + 'static>(&self, begin: Option<&'static str>, op: Op<T>) -> Result<T> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn
                .lock()
                .map_err(|_| StoreError::Database("connection lock poisoned".into()))?;
            let conn: &mut Connection = &mut guard;
            if let Some(begin) = begin {
                conn.execute_batch(begin)?;
            }
            let out = futures::executor::block_on(op(&mut SqliteTx { conn }));
            if begin.is_some() {
                let end = match &out {
                    Ok(_) => conn.execute_batch("COMMIT"),
                    Err(_) => conn.execute_batch("ROLLBACK"),
                };
                if let Err(e) = end {
                    let _ = conn.execute_batch("ROLLBACK");
                    return Err(e.into());
                }
            }
            out
        })
        .await
        .map_err(|e| StoreError::Database(format!("store task failed: {e}")))?
    }
}

#[async_trait]
impl Backend for SqliteStore {
    fn changes(&self) -> Changes {
        self.changes.clone()
    }

    async fn schema_version(&self) -> Result<i64> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let c = conn
                .lock()
                .map_err(|_| StoreError::Database("connection lock poisoned".into()))?;
            Ok(c.query_row(
                "SELECT COALESCE(MAX(version), 0) FROM refinery_schema_history",
                [],
                |r| r.get(0),
            )?)
        })
        .await
        .map_err(|e| StoreError::Database(format!("store task failed: {e}")))?
    }

    /// One connection, so no writer runs meanwhile: the reads see one state without a
    /// transaction of their own.
    async fn read<T: Send + 'static>(&self, op: Op<T>) -> Result<T> {
        self.run(None, op).await
    }

    async fn write<T: Send + 'static>(&self, op: Op<(T, bool)>) -> Result<T> {
        let (out, changed) = self.run(Some("BEGIN IMMEDIATE"), op).await?;
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

fn exec(conn: &Connection, sql: &str, args: impl rusqlite::Params) -> Result<u64> {
    Ok(conn.prepare_cached(sql)?.execute(args)? as u64)
}

/// One transaction's statements over the connection.
struct SqliteTx<'c> {
    conn: &'c mut Connection,
}

#[async_trait]
impl Tx for SqliteTx<'_> {
    async fn insert_experiment(&mut self, exp: &NewExperiment, now: Millis) -> Result<()> {
        let c = &*self.conn;
        let id = exp.id.to_string();
        exec(
            c,
            "INSERT INTO experiments (id, name, seed, spec, created_at, submitted_by) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![id, exp.name, exp.seed as i64, json(&exp.spec)?, now, exp.submitted_by],
        )?;
        let mut stmt = c.prepare_cached(
            "INSERT INTO jobs (id, experiment_id, idx, config, run, state, priority, params, \
             argv, env, profile, gpus, estimate_mib, timeout_ms, max_attempts, retry_on, \
             created_at, updated_at, memory_key, command, shell, ladder, submitted_by, \
             prestart, background, background_mib) \
             VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
             ?15, ?16, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24)",
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
        Ok(())
    }

    async fn experiment_ids(&mut self) -> Result<Vec<String>> {
        all(
            self.conn,
            "SELECT id FROM experiments ORDER BY created_at, id",
            [],
            |r| r.text(0),
        )
    }

    async fn experiment_row(&mut self, id: &str) -> Result<Option<(String, i64, Millis, String)>> {
        first(
            self.conn,
            "SELECT name, seed, created_at, submitted_by FROM experiments WHERE id = ?1",
            [id],
            |r| Ok((r.text(0)?, r.int(1)?, r.int(2)?, r.text(3)?)),
        )
    }

    async fn state_counts(&mut self, experiment: Option<&str>) -> Result<StateCounts> {
        let mut counts = StateCounts::default();
        for (state, n) in all(
            self.conn,
            "SELECT state, COUNT(*) FROM jobs WHERE (?1 IS NULL OR experiment_id = ?1) \
             GROUP BY state",
            [experiment],
            |r| Ok((r.parsed(0, "job state")?, r.int(1)?)),
        )? {
            counts.add(state, n.max(0) as u64);
        }
        Ok(counts)
    }

    async fn job_summaries(&mut self, which: JobsWhere<'_>) -> Result<Vec<JobSummary>> {
        let (cols, from) = (rows::JOB_COLUMNS, rows::JOB_FROM);
        match which {
            JobsWhere::Id(id) => all(
                self.conn,
                &format!("SELECT {cols} {from} WHERE j.id = ?1"),
                [id],
                |r| rows::job_summary(r),
            ),
            JobsWhere::Filter {
                experiment,
                state,
                limit,
            } => all(
                self.conn,
                &format!(
                    "SELECT {cols} {from} WHERE (?1 IS NULL OR j.experiment_id = ?1) \
                     AND (?2 IS NULL OR j.state = ?2) ORDER BY j.seq LIMIT ?3"
                ),
                params![
                    experiment,
                    state.map(JobState::as_str),
                    limit.map_or(-1, i64::from)
                ],
                |r| rows::job_summary(r),
            ),
        }
    }

    async fn job_detail(
        &mut self,
        id: &str,
        summary: JobSummary,
        attempts: Vec<AttemptView>,
    ) -> Result<Option<JobDetail>> {
        let sql = format!("SELECT {} FROM jobs WHERE id = ?1", rows::DETAIL_COLUMNS);
        first(self.conn, &sql, [id], |r| {
            rows::job_detail(summary.clone(), r, attempts.clone())
        })
    }

    async fn jobs_of_experiment(&mut self, experiment: &str) -> Result<Vec<(String, JobState)>> {
        all(
            self.conn,
            "SELECT id, state FROM jobs WHERE experiment_id = ?1 ORDER BY seq",
            [experiment],
            |r| Ok((r.text(0)?, r.parsed(1, "job state")?)),
        )
    }

    async fn lock_job(&mut self, job: &str) -> Result<Option<JobState>> {
        first(self.conn, "SELECT state FROM jobs WHERE id = ?1", [job], |r| {
            r.parsed(0, "job state")
        })
    }

    async fn set_job_state(
        &mut self,
        job: &str,
        from: JobState,
        to: JobState,
        now: Millis,
    ) -> Result<u64> {
        exec(
            self.conn,
            "UPDATE jobs SET state = ?1, updated_at = ?2 WHERE id = ?3 AND state = ?4",
            params![to.as_str(), now, job, from.as_str()],
        )
    }

    async fn job_rules(&mut self, job: &str) -> Result<Option<JobRules>> {
        let sql = format!(
            "SELECT {}, json_extract(e.spec, '$.memory_key') FROM jobs j \
             JOIN experiments e ON e.id = j.experiment_id WHERE j.id = ?1",
            rows::RULES_COLUMNS
        );
        first(self.conn, &sql, [job], |r| rows::job_rules(r))
    }

    async fn set_job_tries(&mut self, job: &str, attempts: u32, max_attempts: u32) -> Result<()> {
        exec(
            self.conn,
            "UPDATE jobs SET attempts = ?1, max_attempts = ?2 WHERE id = ?3",
            params![attempts, max_attempts, job],
        )?;
        Ok(())
    }

    async fn set_last_failure(&mut self, job: &str, class: Option<FailureClass>) -> Result<()> {
        exec(
            self.conn,
            "UPDATE jobs SET last_failure = ?1 WHERE id = ?2",
            params![class.map(FailureClass::as_str), job],
        )?;
        Ok(())
    }

    async fn set_pending_reason(
        &mut self,
        job: &str,
        reason: Option<&PendingReason>,
    ) -> Result<()> {
        exec(
            self.conn,
            "UPDATE jobs SET pending_reason = ?1 WHERE id = ?2",
            params![reason.map(json).transpose()?, job],
        )?;
        Ok(())
    }

    async fn set_job_leased(&mut self, job: &str, attempts: u32, fence: i64) -> Result<()> {
        exec(
            self.conn,
            "UPDATE jobs SET attempts = ?1, fence = ?2, pending_reason = NULL WHERE id = ?3",
            params![attempts, fence, job],
        )?;
        Ok(())
    }

    async fn set_job_ladder(&mut self, job: &str, l: &LadderStep) -> Result<()> {
        exec(
            self.conn,
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
        Ok(())
    }

    async fn background_mib(&mut self, job: &str) -> Result<Option<u64>> {
        Ok(first(
            self.conn,
            "SELECT background_mib FROM jobs WHERE id = ?1",
            [job],
            |r| r.mib_opt(0),
        )?
        .flatten())
    }

    async fn lease_row(&mut self, job: &str) -> Result<Option<LeaseRow>> {
        let sql = format!(
            "SELECT {} FROM jobs j JOIN experiments e ON e.id = j.experiment_id WHERE j.id = ?1",
            rows::LEASE_COLUMNS
        );
        first(self.conn, &sql, [job], |r| rows::lease_row(r))
    }

    async fn lock_pending(&mut self, max_gpus: u32, limit: u32) -> Result<Vec<PendingRow>> {
        let sql = format!(
            "SELECT {} FROM jobs WHERE state IN ('queued', 'retrying') AND gpus <= ?1 \
             ORDER BY priority DESC, seq LIMIT ?2",
            rows::PENDING_COLUMNS
        );
        all(self.conn, &sql, params![max_gpus, limit], |r| {
            rows::pending(r)
        })
    }

    async fn pending_reason_counts(&mut self) -> Result<Vec<(String, u64)>> {
        all(
            self.conn,
            "SELECT COALESCE(json_extract(pending_reason, '$.reason'), 'not_considered'), \
             COUNT(*) FROM jobs WHERE state IN ('queued', 'retrying') GROUP BY 1 ORDER BY 1",
            [],
            |r| Ok((r.text(0)?, r.int(1)?.max(0) as u64)),
        )
    }

    async fn attempt_views(&mut self, which: AttemptsWhere<'_>) -> Result<Vec<AttemptView>> {
        let cols = rows::ATTEMPT_COLUMNS;
        let (filter, arg) = match which {
            AttemptsWhere::Id(id) => ("WHERE id = ?1", Some(id)),
            AttemptsWhere::Job(job) => ("WHERE job_id = ?1 ORDER BY number", Some(job)),
            AttemptsWhere::Experiment(exp) => (
                "WHERE job_id IN (SELECT id FROM jobs WHERE ?1 IS NULL OR experiment_id = ?1) \
                 ORDER BY number",
                exp,
            ),
        };
        all(
            self.conn,
            &format!("SELECT {cols} FROM attempts {filter}"),
            [arg],
            |r| rows::attempt_view(r),
        )
    }

    async fn job_of_attempt(&mut self, attempt: &str) -> Result<Option<String>> {
        first(
            self.conn,
            "SELECT job_id FROM attempts WHERE id = ?1",
            [attempt],
            |r| r.text(0),
        )
    }

    async fn lock_fence(&mut self, attempt: &str) -> Result<Option<FenceRow>> {
        first(
            self.conn,
            "SELECT a.phase, a.fence, j.fence FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.id = ?1",
            [attempt],
            |r| rows::fence_row(r),
        )
    }

    async fn lock_finish_row(&mut self, attempt: &str) -> Result<Option<FinishRow>> {
        first(
            self.conn,
            "SELECT a.phase, a.fence, j.fence, a.failure_class, a.started_at IS NOT NULL \
             FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.id = ?1",
            [attempt],
            |r| rows::finish_row(r),
        )
    }

    async fn renewal_row(
        &mut self,
        attempt: &str,
        agent: AgentId,
    ) -> Result<Option<(RenewalRow, i64)>> {
        first(
            self.conn,
            "SELECT a.phase, a.fence, j.fence, a.failure_class, a.agent_id = ?2, j.seq \
             FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.id = ?1",
            params![attempt, agent.to_string()],
            |r| Ok((rows::renewal_row(r)?, r.int(5)?)),
        )
    }

    async fn log_fence_row(
        &mut self,
        attempt: &str,
    ) -> Result<Option<(FenceRow, Option<FailureClass>)>> {
        first(
            self.conn,
            "SELECT a.phase, a.fence, j.fence, a.failure_class FROM attempts a \
             JOIN jobs j ON j.id = a.job_id WHERE a.id = ?1",
            [attempt],
            |r| Ok((rows::fence_row(r)?, r.parsed_opt(3, "failure class")?)),
        )
    }

    async fn active_on(&mut self, node: &str) -> Result<Vec<Active>> {
        let sql = format!(
            "SELECT {} FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.node = ?1 AND a.phase != 'ended' ORDER BY j.seq",
            rows::ACTIVE_COLUMNS
        );
        all(self.conn, &sql, [node], |r| rows::active(r))
    }

    async fn expired(&mut self, now: Millis) -> Result<Vec<String>> {
        all(
            self.conn,
            "SELECT a.id FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.phase != 'ended' AND a.lease_expires_at < ?1 ORDER BY j.seq",
            [now],
            |r| r.text(0),
        )
    }

    async fn insert_attempt(&mut self, a: &NewAttempt<'_>) -> Result<()> {
        exec(
            self.conn,
            "INSERT INTO attempts (id, job_id, number, node, agent_id, gpus, fence, phase, \
             estimate_mib, leased_at, lease_expires_at, memory_key, estimate_source, params, \
             ladder_step, submitted_by) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'leased', ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
             (SELECT submitted_by FROM jobs WHERE id = ?2))",
            params![
                a.id,
                a.job,
                a.number,
                a.node,
                a.agent.to_string(),
                json(&a.gpus)?,
                a.fence,
                opt_i64(a.estimate_mib),
                a.leased_at,
                a.expires_at,
                a.memory_key,
                a.estimate_source,
                json(a.params)?,
                a.ladder_step
            ],
        )?;
        Ok(())
    }

    async fn end_lost(&mut self, attempt: &str, now: Millis) -> Result<Option<bool>> {
        first(
            self.conn,
            "UPDATE attempts SET phase = 'ended', ended_at = ?1, failure_class = 'lost', \
             log_tail = COALESCE(log_tail, 'lost: the agent went away before reporting an end') \
             WHERE id = ?2 AND phase != 'ended' RETURNING started_at IS NOT NULL",
            params![now, attempt],
            |r| r.flag(0),
        )
    }

    async fn resume_attempt(
        &mut self,
        attempt: &str,
        agent: AgentId,
        until: Millis,
    ) -> Result<bool> {
        Ok(exec(
            self.conn,
            "UPDATE attempts SET agent_id = ?1, lease_expires_at = ?2 \
             WHERE id = ?3 AND phase != 'ended'",
            params![agent.to_string(), until, attempt],
        )? == 1)
    }

    async fn renew_attempt(
        &mut self,
        attempt: &str,
        until: Millis,
        waiting: Option<&str>,
    ) -> Result<Option<bool>> {
        first(
            self.conn,
            "UPDATE attempts SET lease_expires_at = ?1, waiting = ?3 WHERE id = ?2 \
             RETURNING cancel_requested",
            params![until, attempt, waiting],
            |r| r.flag(0),
        )
    }

    async fn set_running(&mut self, attempt: &str, pid: u32, at: Millis) -> Result<()> {
        exec(
            self.conn,
            "UPDATE attempts SET phase = 'running', pid = ?1, started_at = ?2 WHERE id = ?3",
            params![pid, at, attempt],
        )?;
        Ok(())
    }

    async fn set_ended(
        &mut self,
        attempt: &str,
        report: &FinishReport,
        peak_source: Option<PeakSource>,
    ) -> Result<Option<Ended>> {
        let m = rows::measure_row(&report.measurements);
        let bg = report.background.as_ref();
        let ended = first(
            self.conn,
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
                attempt,
                report.contaminated,
                peak_source.map(PeakSource::as_str),
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
            |r| rows::ended(r),
        )?;
        if let (Some(p), Some(_)) = (&report.prestart, &ended) {
            exec(
                self.conn,
                "UPDATE attempts SET exclusive_wait_ms = ?1, cooldown_wait_ms = ?2, \
                 cooldown_from_mdeg = ?3, cooldown_start_mdeg = ?4, cooldown_timed_out = ?5 \
                 WHERE id = ?6",
                params![
                    opt_i64(p.exclusive_wait_ms),
                    opt_i64(p.cooldown_wait_ms),
                    rows::mdeg(p.cooldown_from_temp_c),
                    rows::mdeg(p.cooldown_start_temp_c),
                    p.cooldown_timed_out,
                    attempt,
                ],
            )?;
        }
        Ok(ended)
    }

    async fn delete_attempt(&mut self, attempt: &str) -> Result<Option<(String, Vec<u32>)>> {
        first(
            self.conn,
            "DELETE FROM attempts WHERE id = ?1 RETURNING node, gpus",
            [attempt],
            |r| Ok((r.text(0)?, r.json(1)?)),
        )
    }

    async fn request_cancel(&mut self, job: &str) -> Result<()> {
        exec(
            self.conn,
            "UPDATE attempts SET cancel_requested = 1 WHERE job_id = ?1 AND phase != 'ended'",
            [job],
        )?;
        Ok(())
    }

    async fn cancel_requested(
        &mut self,
        agent: AgentId,
        attempts: &[String],
    ) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT 1 FROM attempts WHERE id = ?1 AND agent_id = ?2 AND cancel_requested = 1 \
             AND phase != 'ended'",
        )?;
        let agent = agent.to_string();
        let mut out = Vec::new();
        for a in attempts {
            if stmt.exists(params![a, agent])? {
                out.push(a.clone());
            }
        }
        Ok(out)
    }

    async fn submitted_at(&mut self, attempt: &str) -> Result<Option<(Millis, u32)>> {
        first(
            self.conn,
            "SELECT j.created_at, a.number FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.id = ?1",
            [attempt],
            |r| Ok((r.int(0)?, r.int(1)?.clamp(0, i64::from(u32::MAX)) as u32)),
        )
    }

    async fn peaks(&mut self, key: &str) -> Result<Vec<u64>> {
        all(
            self.conn,
            "SELECT peak_mem_mib FROM attempts WHERE memory_key = ?1 AND peak_mem_mib IS NOT NULL",
            [key],
            |r| Ok(r.int(0)?.max(0) as u64),
        )
    }

    async fn lock_floor(&mut self, key: &str) -> Result<Option<u64>> {
        self.floor(key).await
    }

    async fn floor(&mut self, key: &str) -> Result<Option<u64>> {
        Ok(first(
            self.conn,
            "SELECT floor_mib FROM memory_floors WHERE memory_key = ?1",
            [key],
            |r| r.mib_opt(0),
        )?
        .flatten())
    }

    async fn set_floor(&mut self, key: &str, mib: u64) -> Result<()> {
        exec(
            self.conn,
            "INSERT INTO memory_floors (memory_key, floor_mib) VALUES (?1, ?2) \
             ON CONFLICT (memory_key) DO UPDATE SET floor_mib = excluded.floor_mib",
            params![key, i64_of(mib)],
        )?;
        Ok(())
    }

    async fn node_of_agent(&mut self, agent: AgentId, _lock: bool) -> Result<Option<NodeRow>> {
        let sql = format!(
            "SELECT {} FROM nodes WHERE agent_id = ?1",
            rows::NODE_COLUMNS
        );
        first(self.conn, &sql, [agent.to_string()], |r| rows::node(r))
    }

    async fn lock_node_of_attempt(&mut self, attempt: &str) -> Result<Option<String>> {
        first(
            self.conn,
            "SELECT n.name FROM nodes n JOIN attempts a ON a.node = n.name WHERE a.id = ?1",
            [attempt],
            |r| r.text(0),
        )
    }

    async fn lock_node_settings(&mut self, node: &str) -> Result<Option<(String, String)>> {
        first(
            self.conn,
            "SELECT plan, headroom FROM nodes WHERE name = ?1",
            [node],
            |r| Ok((r.text(0)?, r.text(1)?)),
        )
    }

    async fn node_gpus(&mut self, node: &str, _lock: bool) -> Result<Option<Vec<GpuInfo>>> {
        first(
            self.conn,
            "SELECT gpus FROM nodes WHERE name = ?1",
            [node],
            |r| r.json(0),
        )
    }

    async fn nodes(&mut self) -> Result<Vec<NodeRow>> {
        let sql = format!("SELECT {} FROM nodes ORDER BY name", rows::NODE_COLUMNS);
        all(self.conn, &sql, [], |r| rows::node(r))
    }

    async fn upsert_node(
        &mut self,
        node: &str,
        agent: AgentId,
        gpus: &[GpuInfo],
        plan: &Plan,
        headroom: &Headroom,
        now: Millis,
    ) -> Result<()> {
        exec(
            self.conn,
            "INSERT INTO nodes (name, agent_id, gpus, plan, headroom, last_seen, registered_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
             ON CONFLICT (name) DO UPDATE SET agent_id = ?2, gpus = ?3, plan = ?4, \
             headroom = ?5, last_seen = ?6, registered_at = ?6, telemetry = NULL",
            params![
                node,
                agent.to_string(),
                json(&gpus)?,
                plan.to_string(),
                headroom.to_string(),
                now
            ],
        )?;
        Ok(())
    }

    async fn set_plan(&mut self, node: &str, plan: &Plan) -> Result<()> {
        exec(
            self.conn,
            "UPDATE nodes SET plan = ?1 WHERE name = ?2",
            params![plan.to_string(), node],
        )?;
        Ok(())
    }

    async fn node_samples(&mut self, node: &str) -> Result<Vec<GpuSample>> {
        Ok(first(
            self.conn,
            "SELECT telemetry FROM nodes WHERE name = ?1",
            [node],
            |r| r.json_opt(0),
        )?
        .flatten()
        .unwrap_or_default())
    }

    async fn set_node_samples(
        &mut self,
        node: &str,
        gpus: &[GpuSample],
        now: Millis,
    ) -> Result<()> {
        exec(
            self.conn,
            "UPDATE nodes SET telemetry = ?1, last_seen = ?2 WHERE name = ?3",
            params![json(&gpus)?, now, node],
        )?;
        Ok(())
    }

    async fn max_node_gpus(&mut self) -> Result<Option<u32>> {
        Ok(first(
            self.conn,
            "SELECT MAX(json_array_length(gpus)) FROM nodes",
            [],
            |r| r.int_opt(0),
        )?
        .flatten()
        .map(|n| n.max(0) as u32))
    }

    async fn blocked_gpus(&mut self, node: &str, now: Millis) -> Result<Vec<u32>> {
        all(
            self.conn,
            "SELECT gpu FROM quarantine WHERE node = ?1 \
             UNION SELECT gpu FROM gpu_avoid WHERE node = ?1 AND until_ms > ?2",
            params![node, now],
            |r| Ok(r.int(0)? as u32),
        )
    }

    async fn quarantine_of(&mut self, node: &str) -> Result<Vec<(u32, QuarantineView)>> {
        all(
            self.conn,
            "SELECT gpu, attempt_id, reason, since FROM quarantine WHERE node = ?1 \
             ORDER BY since",
            [node],
            |r| rows::quarantine(r),
        )
    }

    async fn quarantine(
        &mut self,
        node: &str,
        gpu: u32,
        attempt: &str,
        reason: &str,
        now: Millis,
    ) -> Result<()> {
        exec(
            self.conn,
            "INSERT INTO quarantine (node, gpu, attempt_id, reason, since) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (node, gpu, attempt_id) \
             DO UPDATE SET reason = excluded.reason, since = excluded.since",
            params![node, gpu, attempt, reason, now],
        )?;
        Ok(())
    }

    async fn avoid_gpu(&mut self, node: &str, gpu: u32, until: Millis) -> Result<()> {
        exec(
            self.conn,
            "INSERT INTO gpu_avoid (node, gpu, until_ms) VALUES (?1, ?2, ?3) \
             ON CONFLICT (node, gpu) DO UPDATE SET until_ms = excluded.until_ms",
            params![node, gpu, until],
        )?;
        Ok(())
    }

    async fn release_quarantine_of(&mut self, node: &str, attempts: &[String]) -> Result<u64> {
        let mut n = 0;
        for a in attempts {
            n += exec(
                self.conn,
                "DELETE FROM quarantine WHERE node = ?1 AND attempt_id = ?2",
                params![node, a],
            )?;
        }
        Ok(n)
    }

    async fn release_quarantine_on(&mut self, node: &str, gpu: u32) -> Result<u64> {
        exec(
            self.conn,
            "DELETE FROM quarantine WHERE node = ?1 AND gpu = ?2",
            params![node, gpu],
        )
    }

    async fn insert_telemetry(
        &mut self,
        node: &str,
        samples: &[TelemetrySample],
    ) -> Result<u64> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "INSERT OR IGNORE INTO gpu_telemetry (node, {}) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            rows::TELEMETRY_COLUMNS
        ))?;
        let mut stored = 0u64;
        for s in samples {
            let r = rows::telemetry_row(s);
            let throttle = r.throttle.as_ref().map(json).transpose()?;
            stored += stmt.execute(params![
                node,
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
    }

    async fn series(
        &mut self,
        node: &str,
        gpu: u32,
        w: &SeriesWindow,
    ) -> Result<Vec<TelemetrySample>> {
        let sql = format!(
            "SELECT {} FROM gpu_telemetry WHERE node = ?1 AND gpu = ?2 AND at >= ?3 \
             AND at <= ?4 ORDER BY at DESC, id DESC LIMIT ?5",
            rows::TELEMETRY_COLUMNS
        );
        let mut out = all(
            self.conn,
            &sql,
            params![node, gpu, w.since, w.until, i64::from(w.limit)],
            |r| rows::telemetry_sample(r),
        )?;
        out.reverse();
        Ok(out)
    }

    async fn prune_older(&mut self, older_than: Millis, batch: u32) -> Result<u64> {
        exec(
            self.conn,
            "DELETE FROM gpu_telemetry WHERE id IN \
             (SELECT id FROM gpu_telemetry WHERE at < ?1 ORDER BY at LIMIT ?2)",
            params![older_than, batch],
        )
    }

    async fn series_cutoff(
        &mut self,
        node: &str,
        gpu: u32,
        keep: u64,
    ) -> Result<Option<(i64, i64)>> {
        first(
            self.conn,
            "SELECT at, id FROM gpu_telemetry WHERE node = ?1 AND gpu = ?2 \
             ORDER BY at DESC, id DESC LIMIT 1 OFFSET ?3",
            params![node, gpu, i64_of(keep)],
            |r| Ok((r.int(0)?, r.int(1)?)),
        )
    }

    async fn prune_to(
        &mut self,
        node: &str,
        gpu: u32,
        (at, id): (i64, i64),
        batch: u32,
    ) -> Result<u64> {
        exec(
            self.conn,
            "DELETE FROM gpu_telemetry WHERE id IN \
             (SELECT id FROM gpu_telemetry WHERE node = ?1 AND gpu = ?2 \
              AND (at < ?3 OR (at = ?3 AND id <= ?4)) ORDER BY at LIMIT ?5)",
            params![node, gpu, at, id, batch],
        )
    }

    async fn insert_token(&mut self, t: &NewToken, now: Millis) -> Result<bool> {
        Ok(exec(
            self.conn,
            "INSERT INTO tokens (id, name, role, secret_hash, created_by, created_at, \
             expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (id) DO NOTHING",
            params![
                t.id,
                t.name,
                t.role.as_str(),
                t.secret_hash,
                t.created_by,
                now,
                t.expires_at
            ],
        )? == 1)
    }

    async fn token(&mut self, id: &str) -> Result<Option<StoredToken>> {
        let sql = format!("SELECT {} FROM tokens WHERE id = ?1", rows::TOKEN_COLUMNS);
        first(self.conn, &sql, [id], |r| rows::token_row(r))
    }

    async fn tokens(&mut self) -> Result<Vec<StoredToken>> {
        let sql = format!(
            "SELECT {} FROM tokens ORDER BY created_at, id",
            rows::TOKEN_COLUMNS
        );
        all(self.conn, &sql, [], |r| rows::token_row(r))
    }

    async fn revoke_token(&mut self, id: &str, now: Millis) -> Result<bool> {
        Ok(exec(
            self.conn,
            "UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?1) WHERE id = ?2",
            params![now, id],
        )? == 1)
    }
}
