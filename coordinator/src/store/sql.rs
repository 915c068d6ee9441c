//! The SQL both backends run, written once: every `Tx` statement over `exec::Exec`, the
//! small interface each backend implements (run a statement, its dialect's few words, and
//! the statements only one database does well: batch inserts, advisory locks, arrays).
//!
//! Statements use PostgreSQL's `$n` placeholders (SQLite's `Exec` reads them as `?n`), and
//! only SQL both databases speak: `CAST(.. AS TEXT)` where a parameter's type is not implied,
//! `->`/`->>` for JSON, `ON CONFLICT`, `RETURNING`. What differs is in `Dialect`.

use async_trait::async_trait;
use headroom_shared::api::{
    AttemptView, FinishReport, GpuInfo, GpuSample, Headroom, JobDetail, JobSummary, PeakSource,
    QuarantineView, Role, StateCounts, TelemetrySample, UserView,
};
use headroom_shared::pending::PendingReason;
use headroom_shared::{AgentId, FailureClass, JobState, Plan};

use super::exec::{Arg, Dialect, Exec, RowRef, json};
use super::rows::{self, Cols, LeaseRow, NodeRow, i64_of, opt_i64};
use super::tx::{AttemptsWhere, Ended, JobsWhere, NewAttempt, Tx};
use super::{Active, Millis, NewExperiment, NewToken, Result, SeriesWindow, StoredToken};
use crate::rules::{
    FenceRow, FinishRow, JobRules, LadderStep, PendingRow, QueueCursor, RenewalRow,
};

/// A statement's parameters: `args![a, b]`.
macro_rules! args {
    ($($a:expr),* $(,)?) => { &[$(Arg::from($a)),*] };
}

/// The states of a job waiting for a lease, as the SQL list `'queued', 'retrying'`: the
/// state machine says which they are (`JobState::is_pending`), not the SQL.
static WAITING: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    JobState::ALL
        .iter()
        .filter(|s| s.is_pending())
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
});

async fn all<E: Exec + ?Sized, T: Send>(
    e: &mut E,
    sql: &str,
    args: &[Arg<'_>],
    f: impl Fn(&RowRef<'_>) -> Result<T> + Send + Sync,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    e.query(sql, args, &mut |r| {
        out.push(f(r)?);
        Ok(())
    })
    .await?;
    Ok(out)
}

async fn first<E: Exec + ?Sized, T: Send>(
    e: &mut E,
    sql: &str,
    args: &[Arg<'_>],
    f: impl Fn(&RowRef<'_>) -> Result<T> + Send + Sync,
) -> Result<Option<T>> {
    let mut out = None;
    e.query(sql, args, &mut |r| {
        if out.is_none() {
            out = Some(f(r)?);
        }
        Ok(())
    })
    .await?;
    Ok(out)
}

async fn done<E: Exec + ?Sized>(e: &mut E, sql: &str, args: &[Arg<'_>]) -> Result<()> {
    e.execute(sql, args).await.map(drop)
}

fn text(r: &RowRef<'_>) -> Result<String> {
    r.text(0)
}

#[async_trait]
impl<E: Exec> Tx for E {
    async fn insert_experiment(&mut self, exp: &NewExperiment, now: Millis) -> Result<()> {
        let id = exp.id.to_string();
        done(
            self,
            "INSERT INTO experiments (id, name, seed, spec, created_at, submitted_by) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            args![
                &id,
                &exp.name,
                exp.seed as i64,
                json(&exp.spec)?,
                now,
                &exp.submitted_by
            ],
        )
        .await?;
        self.insert_jobs(exp, now).await
    }

    async fn experiment_ids(&mut self) -> Result<Vec<String>> {
        let sql = "SELECT id FROM experiments ORDER BY created_at, id";
        all(self, sql, &[], text).await
    }

    async fn experiment_row(&mut self, id: &str) -> Result<Option<(String, i64, Millis, String)>> {
        first(
            self,
            "SELECT name, seed, created_at, submitted_by FROM experiments WHERE id = $1",
            args![id],
            |r| Ok((r.text(0)?, r.int(1)?, r.int(2)?, r.text(3)?)),
        )
        .await
    }

    async fn state_counts(&mut self, experiment: Option<&str>) -> Result<StateCounts> {
        let mut counts = StateCounts::default();
        // Two statements, not one with `$1 IS NULL OR ...`: a plan made once for any value
        // could use no index for that, so every progress count read the whole table.
        let one = |r: &RowRef<'_>| Ok((r.parsed(0, "job state")?, r.int(1)?));
        let counted = match experiment {
            Some(e) => all(self, EXPERIMENT_STATE_COUNTS, args![e], one).await?,
            None => all(self, STATE_COUNTS, args![], one).await?,
        };
        for (state, n) in counted {
            counts.add(state, n.max(0) as u64);
        }
        Ok(counts)
    }

    async fn job_summaries(&mut self, which: JobsWhere<'_>) -> Result<Vec<JobSummary>> {
        let (cols, from) = (rows::JOB_COLUMNS, rows::JOB_FROM);
        match which {
            JobsWhere::Id(id) => {
                let sql = format!("SELECT {cols} {from} WHERE j.id = $1");
                all(self, &sql, args![id], |r| rows::job_summary(r)).await
            }
            JobsWhere::Filter {
                experiment,
                state,
                limit,
            } => {
                // Bound, not written into the SQL: one prepared statement whatever the limit.
                let bound = if limit.is_some() { " LIMIT $3" } else { "" };
                let sql = format!(
                    "SELECT {cols} {from} WHERE (CAST($1 AS TEXT) IS NULL OR j.experiment_id = $1) \
                     AND (CAST($2 AS TEXT) IS NULL OR j.state = $2) ORDER BY j.seq{bound}"
                );
                let state = state.map(JobState::as_str);
                let args = match limit {
                    Some(n) => vec![Arg::from(experiment), Arg::from(state), Arg::from(n)],
                    None => vec![Arg::from(experiment), Arg::from(state)],
                };
                all(self, &sql, &args, |r| rows::job_summary(r)).await
            }
        }
    }

    async fn job_detail(
        &mut self,
        id: &str,
        summary: JobSummary,
        attempts: Vec<AttemptView>,
    ) -> Result<Option<JobDetail>> {
        let sql = format!("SELECT {} FROM jobs WHERE id = $1", rows::DETAIL_COLUMNS);
        first(self, &sql, args![id], |r| {
            rows::job_detail(summary.clone(), r, attempts.clone())
        })
        .await
    }

    async fn jobs_of_experiment(&mut self, experiment: &str) -> Result<Vec<(String, JobState)>> {
        all(
            self,
            "SELECT id, state FROM jobs WHERE experiment_id = $1 ORDER BY seq",
            args![experiment],
            |r| Ok((r.text(0)?, r.parsed(1, "job state")?)),
        )
        .await
    }

    async fn lock_job(&mut self, job: &str) -> Result<Option<JobState>> {
        let sql = format!(
            "SELECT state FROM jobs WHERE id = $1{}",
            self.dialect().lock
        );
        first(self, &sql, args![job], |r| r.parsed(0, "job state")).await
    }

    async fn set_job_state(
        &mut self,
        job: &str,
        from: JobState,
        to: JobState,
        now: Millis,
    ) -> Result<u64> {
        self.execute(
            "UPDATE jobs SET state = $1, updated_at = $2 WHERE id = $3 AND state = $4",
            args![to.as_str(), now, job, from.as_str()],
        )
        .await
    }

    async fn job_rules(&mut self, job: &str) -> Result<Option<JobRules>> {
        let sql = format!(
            "SELECT {}, e.spec -> 'memory_key', e.spec -> 'on_throttle', j.background_mib \
             FROM jobs j JOIN experiments e ON e.id = j.experiment_id WHERE j.id = $1",
            rows::RULES_COLUMNS
        );
        first(self, &sql, args![job], |r| rows::job_rules(r)).await
    }

    async fn set_job_tries(&mut self, job: &str, attempts: u32, max_attempts: u32) -> Result<()> {
        done(
            self,
            "UPDATE jobs SET attempts = $1, max_attempts = $2 WHERE id = $3",
            args![attempts, max_attempts, job],
        )
        .await
    }

    async fn set_last_failure(&mut self, job: &str, class: Option<FailureClass>) -> Result<()> {
        done(
            self,
            "UPDATE jobs SET last_failure = $1 WHERE id = $2",
            args![class.map(FailureClass::as_str), job],
        )
        .await
    }

    async fn set_pending_reason(
        &mut self,
        job: &str,
        reason: Option<&PendingReason>,
    ) -> Result<()> {
        let reason = match reason {
            Some(r) => json(r)?,
            None => Arg::Null,
        };
        done(
            self,
            // A reason that stays as it was is not written again: each claim sets the reasons
            // of the jobs it looked at, and most are what the last claim set.
            "UPDATE jobs SET pending_reason = $1 \
             WHERE id = $2 AND pending_reason IS DISTINCT FROM $1",
            &[reason, job.into()],
        )
        .await
    }

    async fn set_job_leased(&mut self, job: &str, attempts: u32, fence: i64) -> Result<()> {
        done(
            self,
            "UPDATE jobs SET attempts = $1, fence = $2, pending_reason = NULL WHERE id = $3",
            args![attempts, fence, job],
        )
        .await
    }

    async fn set_job_ladder(&mut self, job: &str, l: &LadderStep) -> Result<()> {
        done(
            self,
            "UPDATE jobs SET params = $1, argv = $2, memory_key = $3, ladder_step = $4, \
             max_attempts = $5 WHERE id = $6",
            args![
                json(&l.params)?,
                json(&l.argv)?,
                &l.memory_key,
                l.ladder_step,
                l.max_attempts,
                job
            ],
        )
        .await
    }

    async fn lease_row(&mut self, job: &str) -> Result<Option<LeaseRow>> {
        let sql = format!(
            "SELECT {} FROM jobs j JOIN experiments e ON e.id = j.experiment_id \
             LEFT JOIN users u ON u.name = e.submitted_by WHERE j.id = $1",
            rows::LEASE_COLUMNS
        );
        first(self, &sql, args![job], |r| rows::lease_row(r)).await
    }

    async fn lock_pending(
        &mut self,
        max_gpus: u32,
        after: Option<QueueCursor>,
        limit: u32,
    ) -> Result<Vec<PendingRow>> {
        let sql = pending_window(self.dialect(), max_gpus == 0);
        let (priority, seq) = match after {
            Some(c) => (Some(c.priority), c.seq),
            None => (None, 0),
        };
        all(self, &sql, args![max_gpus, priority, seq, limit], |r| {
            rows::pending(r)
        })
        .await
    }

    async fn outcome_counts(&mut self) -> Result<Vec<(String, u64)>> {
        all(
            self,
            "SELECT COALESCE(failure_class, 'succeeded'), COUNT(*) FROM attempts \
             WHERE phase = 'ended' GROUP BY 1 ORDER BY 1",
            &[],
            |r| Ok((r.text(0)?, r.int(1)?.max(0) as u64)),
        )
        .await
    }

    async fn user_job_counts(&mut self) -> Result<Vec<(String, JobState, u64)>> {
        let sql = format!(
            "SELECT submitted_by, state, COUNT(*) FROM jobs \
             WHERE state IN ({}, 'leased', 'running') GROUP BY 1, 2 ORDER BY 1, 2",
            *WAITING
        );
        all(self, &sql, &[], |r| {
            Ok((
                r.text(0)?,
                r.parsed(1, "job state")?,
                r.int(2)?.max(0) as u64,
            ))
        })
        .await
    }

    async fn pending_reason_counts(&mut self) -> Result<Vec<(String, u64)>> {
        let sql = format!(
            "SELECT COALESCE(pending_reason ->> 'reason', 'not_considered'), COUNT(*) \
             FROM jobs WHERE state IN ({}) GROUP BY 1 ORDER BY 1",
            *WAITING
        );
        all(self, &sql, &[], |r| {
            Ok((r.text(0)?, r.int(1)?.max(0) as u64))
        })
        .await
    }

    async fn attempt_views(&mut self, which: AttemptsWhere<'_>) -> Result<Vec<AttemptView>> {
        let cols = rows::ATTEMPT_COLUMNS;
        let (sql, args): (String, Vec<Arg>) = match which {
            AttemptsWhere::Id(id) => (
                format!("SELECT {cols} FROM attempts WHERE id = $1"),
                vec![id.into()],
            ),
            AttemptsWhere::Job(job) => (
                format!("SELECT {cols} FROM attempts WHERE job_id = $1 ORDER BY number"),
                vec![job.into()],
            ),
            AttemptsWhere::Experiment(exp) => (
                format!(
                    "SELECT {cols} FROM attempts WHERE job_id IN (SELECT id FROM jobs \
                     WHERE CAST($1 AS TEXT) IS NULL OR experiment_id = $1) ORDER BY number"
                ),
                vec![exp.into()],
            ),
            // Two ranges of the (node, ended_at) index: those that ended after `from`, and
            // those still running; each started before `to`.
            AttemptsWhere::RanOn { node, from, to } => (
                format!(
                    "SELECT {cols} FROM attempts WHERE node = $1 AND ended_at > $2 \
                     AND started_at < $3 \
                     UNION ALL SELECT {cols} FROM attempts WHERE node = $1 \
                     AND ended_at IS NULL AND started_at < $3"
                ),
                vec![node.into(), from.into(), to.into()],
            ),
        };
        all(self, &sql, &args, |r| rows::attempt_view(r)).await
    }

    async fn lock_job_of_attempt(
        &mut self,
        attempt: &str,
    ) -> Result<Option<(String, JobState, String)>> {
        let sql = format!(
            "SELECT j.id, j.state, a.node FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.id = $1{}",
            self.dialect().lock_job
        );
        first(self, &sql, args![attempt], |r| {
            Ok((r.text(0)?, r.parsed(1, "job state")?, r.text(2)?))
        })
        .await
    }

    async fn lock_fence(&mut self, attempt: &str) -> Result<Option<FenceRow>> {
        let sql = format!(
            "SELECT a.phase, a.fence, j.fence FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.id = $1{}",
            self.dialect().lock_attempt
        );
        first(self, &sql, args![attempt], |r| rows::fence_row(r)).await
    }

    async fn lock_finish_row(&mut self, attempt: &str) -> Result<Option<FinishRow>> {
        let sql = format!(
            "SELECT a.phase, a.fence, j.fence, a.failure_class, a.started_at IS NOT NULL \
             FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.id = $1{}",
            self.dialect().lock_attempt
        );
        first(self, &sql, args![attempt], |r| rows::finish_row(r)).await
    }

    async fn renewal_row(
        &mut self,
        attempt: &str,
        agent: AgentId,
    ) -> Result<Option<(RenewalRow, i64)>> {
        first(
            self,
            "SELECT a.phase, a.fence, j.fence, a.failure_class, a.agent_id = $2, j.seq \
             FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.id = $1",
            args![attempt, &agent.to_string()],
            |r| Ok((rows::renewal_row(r)?, r.int(5)?)),
        )
        .await
    }

    async fn log_fence_row(
        &mut self,
        attempt: &str,
    ) -> Result<Option<(FenceRow, Option<FailureClass>)>> {
        first(
            self,
            "SELECT a.phase, a.fence, j.fence, a.failure_class FROM attempts a \
             JOIN jobs j ON j.id = a.job_id WHERE a.id = $1",
            args![attempt],
            |r| Ok((rows::fence_row(r)?, r.parsed_opt(3, "failure class")?)),
        )
        .await
    }

    async fn active_on(&mut self, node: &str) -> Result<Vec<Active>> {
        all(self, &ACTIVE_ON, args![node], |r| rows::active(r)).await
    }

    async fn expired(&mut self, now: Millis) -> Result<Vec<String>> {
        all(self, EXPIRED, args![now], text).await
    }

    async fn insert_attempt(&mut self, a: &NewAttempt<'_>) -> Result<()> {
        done(
            self,
            "INSERT INTO attempts (id, job_id, number, node, agent_id, gpus, fence, phase, \
             estimate_mib, leased_at, lease_expires_at, memory_key, estimate_source, params, \
             ladder_step, report_key_hash, submitted_by) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'leased', $8, $9, $10, $11, $12, $13, $14, \
             $15, (SELECT submitted_by FROM jobs WHERE id = $2))",
            args![
                &a.id,
                a.job,
                a.number,
                a.node,
                &a.agent.to_string(),
                json(&a.gpus)?,
                a.fence,
                opt_i64(a.estimate_mib),
                a.leased_at,
                a.expires_at,
                a.memory_key,
                a.estimate_source,
                json(a.params)?,
                a.ladder_step,
                a.report_key_hash
            ],
        )
        .await
    }

    async fn end_lost(
        &mut self,
        attempt: &str,
        now: Millis,
        expired_before: Option<Millis>,
    ) -> Result<Option<bool>> {
        // `expired_before`: a renewal that committed since the sweep read the lease wins.
        first(
            self,
            "UPDATE attempts SET phase = 'ended', ended_at = $1, failure_class = 'lost', \
             log_tail = COALESCE(log_tail, 'lost: the agent went away before reporting an end') \
             WHERE id = $2 AND phase != 'ended' \
             AND (CAST($3 AS BIGINT) IS NULL OR lease_expires_at < $3) \
             RETURNING started_at IS NOT NULL",
            args![now, attempt, expired_before],
            |r| r.flag(0),
        )
        .await
    }

    async fn resume_attempt(
        &mut self,
        attempt: &str,
        agent: AgentId,
        until: Millis,
    ) -> Result<bool> {
        let sql = "UPDATE attempts SET agent_id = $1, lease_expires_at = $2 \
                   WHERE id = $3 AND phase != 'ended'";
        let n = self
            .execute(sql, args![&agent.to_string(), until, attempt])
            .await?;
        Ok(n == 1)
    }

    async fn renew_attempt(
        &mut self,
        attempt: &str,
        until: Millis,
        waiting: Option<&str>,
    ) -> Result<Option<bool>> {
        first(
            self,
            "UPDATE attempts SET lease_expires_at = $1, waiting = $3 WHERE id = $2 \
             RETURNING cancel_requested",
            args![until, attempt, waiting],
            |r| r.flag(0),
        )
        .await
    }

    async fn clock(&mut self) -> Result<Millis> {
        match self.dialect().clock {
            Some(now) => first(self, &format!("SELECT {now}"), &[], |r| r.int(0))
                .await?
                .ok_or_else(|| super::StoreError::Database("the clock read no row".into())),
            None => Ok(super::now_ms()),
        }
    }

    async fn extend_lease(&mut self, attempt: &str, until: Millis) -> Result<Option<bool>> {
        first(
            self,
            "UPDATE attempts SET lease_expires_at = $1 WHERE id = $2 RETURNING cancel_requested",
            args![until, attempt],
            |r| r.flag(0),
        )
        .await
    }

    async fn attempt_key(&mut self, attempt: &str) -> Result<Option<Option<String>>> {
        first(
            self,
            "SELECT report_key_hash FROM attempts WHERE id = $1",
            args![attempt],
            |r| r.text_opt(0),
        )
        .await
    }

    async fn set_running(
        &mut self,
        attempt: &str,
        pid: u32,
        at: Millis,
    ) -> Result<Option<(Millis, u32)>> {
        first(
            self,
            "UPDATE attempts SET phase = 'running', pid = $1, started_at = $2 WHERE id = $3 \
             RETURNING (SELECT j.created_at FROM jobs j WHERE j.id = job_id), number",
            args![pid, at, attempt],
            |r| Ok((r.int(0)?, r.int(1)?.clamp(0, i64::from(u32::MAX)) as u32)),
        )
        .await
    }

    async fn set_ended(
        &mut self,
        attempt: &str,
        report: &FinishReport,
        peak_source: Option<PeakSource>,
    ) -> Result<Option<Ended>> {
        let m = rows::measure_row(&report.measurements);
        let bg = report.background.as_ref();
        let throttle = match &m.throttle_reasons {
            Some(t) => json(t)?,
            None => Arg::Null,
        };
        let counters = match &report.measurements.counters[..] {
            [] => Arg::Null,
            c => json(&c)?,
        };
        let ended = first(
            self,
            "UPDATE attempts SET phase = 'ended', ended_at = $1, exit_code = $2, signal = $3, \
             failure_class = $4, peak_mem_mib = $5, cleanup_ms = $6, cleanup_verified = $7, \
             log_tail = $8, started_at = COALESCE(started_at, $1), contaminated = $10, \
             peak_source = $11, energy_mj = $12, energy_source = $13, mean_power_mw = $14, \
             max_power_mw = $15, max_temp_mdeg = $16, start_temp_mdeg = $17, \
             mean_util_mpct = $18, throttled_thermal = $19, throttled_power = $20, \
             throttle_reasons = $21, contamination_reason = $22, contamination_pid = $23, \
             contamination_command = $24, background_pid = $25, background_ready_ms = $26, \
             background_exit_code = $27, background_signal = $28, \
             background_exited_early = $29, host_peak_mib = $30, first_reading_ms = $31, \
             covers_run = $32, energy_counters = $33, ghost_mib = $34 \
             WHERE id = $9 RETURNING node, gpus, memory_key, estimate_mib",
            args![
                report.ended_at.timestamp_millis(),
                report.exit_code,
                report.signal,
                report.failure.map(|f| f.as_str()),
                opt_i64(report.peak_mem_mib),
                i64_of(report.cleanup_ms),
                report.cleanup_verified,
                &report.log_tail,
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
                throttle,
                m.contamination_reason.as_deref(),
                m.contamination_pid,
                m.contamination_command.as_deref(),
                bg.and_then(|b| b.pid),
                bg.and_then(|b| opt_i64(b.ready_ms)),
                bg.and_then(|b| b.exit_code),
                bg.and_then(|b| b.signal),
                bg.map(|b| b.exited_early),
                opt_i64(report.host_peak_mib),
                opt_i64(report.measurements.first_reading_ms),
                report.measurements.covers_run,
                counters,
                opt_i64(report.measurements.ghost_mib),
            ],
            |r| rows::ended(r),
        )
        .await?;
        if let (Some(p), Some(_)) = (&report.prestart, &ended) {
            done(
                self,
                "UPDATE attempts SET exclusive_wait_ms = $1, cooldown_wait_ms = $2, \
                 cooldown_from_mdeg = $3, cooldown_start_mdeg = $4, cooldown_timed_out = $5 \
                 WHERE id = $6",
                args![
                    opt_i64(p.exclusive_wait_ms),
                    opt_i64(p.cooldown_wait_ms),
                    rows::mdeg(p.cooldown_from_temp_c),
                    rows::mdeg(p.cooldown_start_temp_c),
                    p.cooldown_timed_out,
                    attempt,
                ],
            )
            .await?;
        }
        Ok(ended)
    }

    async fn delete_attempt(&mut self, attempt: &str) -> Result<Option<Vec<u32>>> {
        let sql = "DELETE FROM attempts WHERE id = $1 RETURNING gpus";
        first(self, sql, args![attempt], |r| r.json(0)).await
    }

    async fn request_cancel(&mut self, job: &str) -> Result<()> {
        let sql = "UPDATE attempts SET cancel_requested = TRUE \
                   WHERE job_id = $1 AND phase != 'ended'";
        done(self, sql, args![job]).await
    }

    async fn cancel_requested(
        &mut self,
        agent: AgentId,
        attempts: &[String],
    ) -> Result<Vec<String>> {
        self.cancels_asked(&agent.to_string(), attempts).await
    }

    async fn peaks(&mut self, key: &str) -> Result<Vec<u64>> {
        // The most recent ones only (by the coordinator's clock: an end's time is the
        // agent's): a claim reads them for every key in its window, and a key of a large
        // matrix has as many as its attempts.
        let window = i64::from(crate::rules::LEARNED_WINDOW);
        all(self, LATEST_PEAKS, args![key, window], |r| {
            Ok(r.int(0)?.max(0) as u64)
        })
        .await
    }

    async fn lock_floor(&mut self, key: &str) -> Result<Option<u64>> {
        self.lock_key(key).await?;
        self.floor(key).await
    }

    async fn floor(&mut self, key: &str) -> Result<Option<u64>> {
        let sql = "SELECT floor_mib FROM memory_floors WHERE memory_key = $1";
        Ok(first(self, sql, args![key], |r| r.mib_opt(0))
            .await?
            .flatten())
    }

    async fn set_floor(&mut self, key: &str, mib: u64) -> Result<()> {
        done(
            self,
            "INSERT INTO memory_floors (memory_key, floor_mib) VALUES ($1, $2) \
             ON CONFLICT (memory_key) DO UPDATE SET floor_mib = excluded.floor_mib",
            args![key, i64_of(mib)],
        )
        .await
    }

    async fn node_of_agent(&mut self, agent: AgentId, lock: bool) -> Result<Option<NodeRow>> {
        let lock = if lock { self.dialect().lock } else { "" };
        let sql = format!(
            "SELECT {} FROM nodes WHERE agent_id = $1{lock}",
            rows::NODE_COLUMNS
        );
        first(self, &sql, args![&agent.to_string()], |r| rows::node(r)).await
    }

    async fn lock_node_of_attempt(&mut self, attempt: &str) -> Result<Option<String>> {
        let sql = format!(
            "SELECT n.name FROM nodes n JOIN attempts a ON a.node = n.name WHERE a.id = $1{}",
            self.dialect().lock_node
        );
        first(self, &sql, args![attempt], text).await
    }

    async fn node_of_attempt(&mut self, attempt: &str) -> Result<Option<String>> {
        let sql = "SELECT node FROM attempts WHERE id = $1";
        first(self, sql, args![attempt], text).await
    }

    async fn node_holder(
        &mut self,
        node: &str,
    ) -> Result<Option<(Option<String>, Option<Millis>)>> {
        let sql = "SELECT agent_id, last_seen FROM nodes WHERE name = $1";
        first(self, sql, args![node], |r| {
            Ok((r.text_opt(0)?, r.int_opt(1)?))
        })
        .await
    }

    async fn forget_node_seen(&mut self, node: &str) -> Result<u64> {
        let sql = "UPDATE nodes SET last_seen = NULL WHERE name = $1";
        self.execute(sql, args![node]).await
    }

    async fn lock_node_settings(&mut self, node: &str) -> Result<Option<(String, String)>> {
        let sql = format!(
            "SELECT plan, headroom FROM nodes WHERE name = $1{}",
            self.dialect().lock
        );
        first(self, &sql, args![node], |r| Ok((r.text(0)?, r.text(1)?))).await
    }

    async fn node_gpus(&mut self, node: &str, lock: bool) -> Result<Option<Vec<GpuInfo>>> {
        let lock = if lock { self.dialect().lock } else { "" };
        let sql = format!("SELECT gpus FROM nodes WHERE name = $1{lock}");
        first(self, &sql, args![node], |r| r.json(0)).await
    }

    async fn nodes(&mut self) -> Result<Vec<NodeRow>> {
        let sql = format!("SELECT {} FROM nodes ORDER BY name", rows::NODE_COLUMNS);
        all(self, &sql, &[], |r| rows::node(r)).await
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
        done(
            self,
            "INSERT INTO nodes (name, agent_id, gpus, plan, headroom, last_seen, registered_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6) \
             ON CONFLICT (name) DO UPDATE SET agent_id = $2, gpus = $3, plan = $4, \
             headroom = $5, last_seen = $6, registered_at = $6, telemetry = NULL",
            args![
                node,
                &agent.to_string(),
                json(&gpus)?,
                &plan.to_string(),
                &headroom.to_string(),
                now
            ],
        )
        .await
    }

    async fn set_plan(&mut self, node: &str, plan: &Plan) -> Result<()> {
        let sql = "UPDATE nodes SET plan = $1 WHERE name = $2";
        done(self, sql, args![&plan.to_string(), node]).await
    }

    async fn set_node_samples(
        &mut self,
        node: &str,
        gpus: &[GpuSample],
        now: Millis,
    ) -> Result<()> {
        let sql = "UPDATE nodes SET telemetry = $1, last_seen = $2 WHERE name = $3";
        done(self, sql, args![json(&gpus)?, now, node]).await
    }

    async fn set_end_samples(&mut self, node: &str, gpus: &[GpuSample]) -> Result<()> {
        // The database's clock, where it has one, is read in the statement itself: no round
        // trip of its own.
        let clock = self.dialect().clock;
        let sql = format!(
            "INSERT INTO node_end_samples (node, samples, at) VALUES ($1, $2, {}) \
             ON CONFLICT (node) DO UPDATE SET samples = excluded.samples, at = excluded.at",
            clock.unwrap_or("$3")
        );
        let all = args![node, json(&gpus)?, super::now_ms()];
        let args = if clock.is_some() { &all[..2] } else { all };
        done(self, &sql, args).await
    }

    async fn end_samples(&mut self, node: &str) -> Result<Option<(Vec<GpuSample>, Millis)>> {
        let sql = "SELECT samples, at FROM node_end_samples WHERE node = $1";
        first(self, sql, args![node], |r| Ok((r.json(0)?, r.int(1)?))).await
    }

    async fn max_node_gpus(&mut self) -> Result<Option<u32>> {
        let sql = format!(
            "SELECT CAST(MAX({}(gpus)) AS BIGINT) FROM nodes",
            self.dialect().json_array_length
        );
        let max = first(self, &sql, &[], |r| r.int_opt(0)).await?.flatten();
        Ok(max.map(|n| n.max(0) as u32))
    }

    async fn blocked_gpus(&mut self, node: &str, now: Millis) -> Result<Vec<u32>> {
        all(
            self,
            "SELECT gpu FROM quarantine WHERE node = $1 \
             UNION SELECT gpu FROM gpu_avoid WHERE node = $1 AND until_ms > $2",
            args![node, now],
            |r| Ok(r.int(0)? as u32),
        )
        .await
    }

    async fn quarantine_of(&mut self, node: &str) -> Result<Vec<(u32, QuarantineView)>> {
        let sql = "SELECT gpu, attempt_id, reason, since FROM quarantine WHERE node = $1 \
                   ORDER BY since";
        all(self, sql, args![node], |r| rows::quarantine(r)).await
    }

    async fn quarantine(
        &mut self,
        node: &str,
        gpu: u32,
        attempt: &str,
        reason: &str,
        now: Millis,
    ) -> Result<()> {
        done(
            self,
            "INSERT INTO quarantine (node, gpu, attempt_id, reason, since) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (node, gpu, attempt_id) \
             DO UPDATE SET reason = excluded.reason, since = excluded.since",
            args![node, gpu, attempt, reason, now],
        )
        .await
    }

    async fn avoid_gpu(&mut self, node: &str, gpu: u32, until: Millis) -> Result<()> {
        done(
            self,
            "INSERT INTO gpu_avoid (node, gpu, until_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (node, gpu) DO UPDATE SET until_ms = excluded.until_ms",
            args![node, gpu, until],
        )
        .await
    }

    async fn release_quarantine_of(&mut self, node: &str, attempts: &[String]) -> Result<u64> {
        let sql = "DELETE FROM quarantine WHERE node = $1 AND attempt_id = $2";
        let mut n = 0;
        for a in attempts {
            n += self.execute(sql, args![node, a]).await?;
        }
        Ok(n)
    }

    async fn release_quarantine_on(&mut self, node: &str, gpu: u32) -> Result<u64> {
        let sql = "DELETE FROM quarantine WHERE node = $1 AND gpu = $2";
        self.execute(sql, args![node, gpu]).await
    }

    async fn insert_telemetry(&mut self, node: &str, samples: &[TelemetrySample]) -> Result<u64> {
        self.insert_samples(node, samples).await
    }

    async fn series(
        &mut self,
        node: &str,
        gpu: u32,
        w: &SeriesWindow,
    ) -> Result<Vec<TelemetrySample>> {
        let sql = format!(
            "SELECT {} FROM gpu_telemetry WHERE node = $1 AND gpu = $2 AND at >= $3 \
             AND at <= $4 ORDER BY at DESC, id DESC LIMIT $5",
            rows::TELEMETRY_COLUMNS
        );
        let args = args![node, gpu, w.since, w.until, w.limit];
        let mut out = all(self, &sql, args, |r| rows::telemetry_sample(r)).await?;
        out.reverse();
        Ok(out)
    }

    async fn prune_older(&mut self, older_than: Millis, batch: u32) -> Result<u64> {
        let sql = "DELETE FROM gpu_telemetry WHERE id IN \
                   (SELECT id FROM gpu_telemetry WHERE at < $1 ORDER BY at LIMIT $2)";
        self.execute(sql, args![older_than, batch]).await
    }

    async fn series_cutoff(
        &mut self,
        node: &str,
        gpu: u32,
        keep: u64,
    ) -> Result<Option<(i64, i64)>> {
        first(
            self,
            "SELECT at, id FROM gpu_telemetry WHERE node = $1 AND gpu = $2 \
             ORDER BY at DESC, id DESC LIMIT 1 OFFSET $3",
            args![node, gpu, i64_of(keep)],
            |r| Ok((r.int(0)?, r.int(1)?)),
        )
        .await
    }

    async fn prune_to(
        &mut self,
        node: &str,
        gpu: u32,
        (at, id): (i64, i64),
        batch: u32,
    ) -> Result<u64> {
        let sql = "DELETE FROM gpu_telemetry WHERE id IN \
                   (SELECT id FROM gpu_telemetry WHERE node = $1 AND gpu = $2 \
                    AND (at < $3 OR (at = $3 AND id <= $4)) ORDER BY at LIMIT $5)";
        self.execute(sql, args![node, gpu, at, id, batch]).await
    }

    async fn insert_token(&mut self, t: &NewToken, now: Millis) -> Result<bool> {
        let n = self
            .execute(
                "INSERT INTO tokens (id, name, role, secret_hash, created_by, created_at, \
                 expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
                args![
                    &t.id,
                    &t.name,
                    t.role.as_str(),
                    &t.secret_hash,
                    &t.created_by,
                    now,
                    t.expires_at
                ],
            )
            .await?;
        Ok(n == 1)
    }

    async fn token(&mut self, id: &str) -> Result<Option<StoredToken>> {
        let sql = format!("SELECT {} FROM tokens WHERE id = $1", rows::TOKEN_COLUMNS);
        first(self, &sql, args![id], |r| rows::token_row(r)).await
    }

    async fn tokens(&mut self) -> Result<Vec<StoredToken>> {
        let sql = format!(
            "SELECT {} FROM tokens ORDER BY created_at, id",
            rows::TOKEN_COLUMNS
        );
        all(self, &sql, &[], |r| rows::token_row(r)).await
    }

    async fn revoke_token(&mut self, id: &str, now: Millis) -> Result<bool> {
        let sql = "UPDATE tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2";
        Ok(self.execute(sql, args![now, id]).await? == 1)
    }

    async fn ensure_user(&mut self, name: &str, role: Role, now: Millis) -> Result<Role> {
        self.execute(
            "INSERT INTO users (name, role, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO NOTHING",
            args![name, role.as_str(), now],
        )
        .await?;
        let sql = "SELECT role FROM users WHERE name = $1";
        first(self, sql, args![name], |r| r.parsed(0, "role"))
            .await?
            .ok_or_else(|| super::StoreError::not_found("user", name))
    }

    async fn insert_new_user(&mut self, name: &str, role: Role, now: Millis) -> Result<bool> {
        let n = self
            .execute(
                "INSERT INTO users (name, role, created_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO NOTHING",
                args![name, role.as_str(), now],
            )
            .await?;
        Ok(n == 1)
    }

    async fn put_user(&mut self, u: &UserView) -> Result<bool> {
        let n = self
            .execute(
                "INSERT INTO users (name, role, unix_user, allow_root, created_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO UPDATE SET \
                 unix_user = excluded.unix_user, allow_root = excluded.allow_root \
                 WHERE users.role = excluded.role",
                args![
                    &u.name,
                    u.role.as_str(),
                    u.unix_user.as_deref(),
                    u.allow_root,
                    u.created_at.timestamp_millis()
                ],
            )
            .await?;
        Ok(n == 1)
    }

    async fn users(&mut self, name: Option<&str>) -> Result<Vec<UserView>> {
        let sql = "SELECT name, role, unix_user, allow_root, created_at FROM users \
                   WHERE CAST($1 AS TEXT) IS NULL OR name = $1 ORDER BY name";
        all(self, sql, args![name], |r| {
            Ok(UserView {
                name: r.text(0)?,
                role: r.parsed(1, "role")?,
                unix_user: r.text_opt(2)?,
                allow_root: r.flag(3)?,
                created_at: rows::ts(r.int(4)?),
            })
        })
        .await
    }
}

/// How many jobs of experiment `$1` are in each state, from the index `jobs_experiment_state`
/// alone.
pub(super) const EXPERIMENT_STATE_COUNTS: &str =
    "SELECT state, COUNT(*) FROM jobs WHERE experiment_id = $1 GROUP BY state";

/// How many jobs are in each state.
pub(super) const STATE_COUNTS: &str = "SELECT state, COUNT(*) FROM jobs GROUP BY state";

/// The live attempts of node `$1` (each claim reads them), from the partial index
/// `attempts_live`: not through every attempt the node ever ran. Written once, not at each
/// claim.
pub(super) static ACTIVE_ON: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {} FROM attempts a JOIN jobs j ON j.id = a.job_id \
         WHERE a.node = $1 AND a.phase != 'ended' ORDER BY j.seq",
        rows::ACTIVE_COLUMNS
    )
});

/// Live attempts whose lease ran out before `$1`, from the partial index
/// `attempts_live_expiry`.
pub(super) const EXPIRED: &str = "SELECT a.id FROM attempts a JOIN jobs j ON j.id = a.job_id \
     WHERE a.phase != 'ended' AND a.lease_expires_at < $1 ORDER BY j.seq";

/// A memory key's (`$1`) latest observed peaks, at most `$2`, newest first (from the partial
/// index `attempts_key_peaks`).
pub(super) const LATEST_PEAKS: &str = "SELECT peak_mem_mib FROM attempts \
     WHERE memory_key = $1 AND peak_mem_mib IS NOT NULL \
     ORDER BY leased_at DESC LIMIT $2";

/// The read of a claim's window of waiting jobs (`$1` the node's GPUs, `$2`, `$3` the cursor,
/// `$4` the window's size), in the order placement considers them: priority, then the longest
/// waiting; a window starts after the last job of the one before. With `$1` zero, only jobs
/// that need no GPU, from their own index (`jobs_waiting_cpu`).
pub(super) fn pending_window(dialect: &Dialect, cpu_only: bool) -> String {
    // `gpus = 0` is the CPU index's own predicate, so the database reads from it; `$1` stays
    // named (PostgreSQL types every parameter from the statement).
    let (index, gpus) = if cpu_only {
        (dialect.waiting_cpu_index, "gpus = 0 AND gpus <= $1")
    } else {
        (dialect.waiting_index, "gpus <= $1")
    };
    format!(
        "SELECT {} FROM jobs{index} WHERE state IN ({}) AND {gpus} \
         AND (CAST($2 AS BIGINT) IS NULL OR priority < $2 OR (priority = $2 AND seq > $3)) \
         ORDER BY priority DESC, seq LIMIT $4{}",
        rows::PENDING_COLUMNS,
        *WAITING,
        dialect.skip_locked
    )
}

#[cfg(test)]
mod tests {
    /// The partial indexes the claim reads its windows from (`jobs_waiting`, migration V14;
    /// `jobs_waiting_cpu`, V15) name the waiting states in their predicates; the database
    /// uses them only while the claim's list is the same.
    #[test]
    fn the_waiting_states_are_those_the_claim_index_holds() {
        assert_eq!(*super::WAITING, "'queued', 'retrying'");
        let migrations = ["V14__waiting_order", "V15__waiting_cpu_jobs"];
        for (backend, migration) in ["postgres", "sqlite"]
            .into_iter()
            .flat_map(|b| migrations.map(|m| (b, m)))
        {
            let path = format!(
                "{}/migrations/{backend}/{migration}.sql",
                env!("CARGO_MANIFEST_DIR")
            );
            let sql = std::fs::read_to_string(&path).expect("the migration");
            assert!(
                sql.contains(&format!("WHERE state IN ({})", *super::WAITING)),
                "{path}"
            );
        }
    }
}
