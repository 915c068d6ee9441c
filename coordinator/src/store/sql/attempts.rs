//! Attempts: their statements, over `Exec`.

use std::collections::HashMap;

use async_trait::async_trait;
use headroom_shared::api::{AttemptView, FinishReport, PeakSource};
use headroom_shared::{AgentId, FailureClass, JobState};

use super::super::exec::{Arg, Exec, json};
use super::super::rows::{self, Cols, i64_of, opt_i64};
use super::super::tx::{AttemptsTx, AttemptsWhere, Ended, FinishRead, KeyPeaks, NewAttempt};
use super::super::{Active, Millis, Result, StopAsk};
use super::{ACTIVE_ON, EXPIRED, LATEST_PEAKS, all, done, first, id_list, in_ids, text};
use crate::rules::{FenceRow, RenewalRow};
use headroom_shared::checkpoint::Requeue;
use headroom_shared::phases::Phases;

/// An attempt's end: its outcome, then each figure of `Measurements::FIGURES` into its own
/// column (parameters from 29 on, in that order), then the shape its run taught.
static ENDED_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let n = headroom_shared::api::FIGURES.len();
    let figures: String = headroom_shared::api::FIGURES
        .iter()
        .enumerate()
        .map(|(i, f)| format!(", {} = ${}", f.column, 29 + i))
        .chain(std::iter::once(format!(", memory_profile = ${}", 29 + n)))
        .collect();
    format!(
        "UPDATE attempts SET phase = 'ended', ended_at = $1, exit_code = $2, signal = $3, \
         failure_class = $4, peak_mem_mib = $5, cleanup_ms = $6, cleanup_verified = $7, \
         log_tail = $8, started_at = COALESCE(started_at, $1), contaminated = $10, \
         peak_source = $11, energy_source = $12, throttled_thermal = $13, \
         throttled_power = $14, throttle_reasons = $15, contamination_reason = $16, \
         contamination_pid = $17, contamination_command = $18, background_pid = $19, \
         background_ready_ms = $20, background_exit_code = $21, background_signal = $22, \
         background_exited_early = $23, host_peak_mib = $24, first_reading_ms = $25, \
         covers_run = $26, energy_counters = $27, ghost_mib = $28{figures} \
         WHERE id = $9 RETURNING node, gpus, memory_key, estimate_mib"
    )
});

#[async_trait]
impl<E: Exec> AttemptsTx for E {
    async fn attempt_views(&mut self, which: AttemptsWhere<'_>) -> Result<Vec<AttemptView>> {
        let cols = rows::ATTEMPT_COLUMNS.as_str();
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

    async fn lock_job_of_attempt(&mut self, attempt: &str) -> Result<Option<(String, JobState)>> {
        let sql = format!(
            "SELECT j.id, j.state FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.id = $1{}",
            self.dialect().lock_job
        );
        first(self, &sql, args![attempt], |r| {
            Ok((r.text(0)?, r.parsed(1, "job state")?))
        })
        .await
    }

    async fn lock_job_and_fence(
        &mut self,
        attempt: &str,
    ) -> Result<Option<(String, JobState, FenceRow)>> {
        let sql = format!(
            "SELECT a.phase, a.fence, j.fence, j.id, j.state FROM attempts a \
             JOIN jobs j ON j.id = a.job_id WHERE a.id = $1{}",
            self.dialect().lock_job_and_attempt
        );
        first(self, &sql, args![attempt], |r| {
            Ok((r.text(3)?, r.parsed(4, "job state")?, rows::fence_row(r)?))
        })
        .await
    }

    async fn lock_finish_read(&mut self, attempt: &str) -> Result<Option<FinishRead>> {
        let sql = format!(
            "SELECT {} FROM attempts a JOIN jobs j ON j.id = a.job_id \
             JOIN experiments e ON e.id = j.experiment_id WHERE a.id = $1{}",
            rows::finish_read_columns(),
            self.dialect().lock_job_and_attempt
        );
        first(self, &sql, args![attempt], |r| rows::finish_read(r)).await
    }

    async fn lock_renewal_rows(
        &mut self,
        attempts: &[String],
        agent: AgentId,
    ) -> Result<HashMap<String, RenewalRow>> {
        let d = self.dialect();
        let sql = format!(
            "SELECT a.phase, a.fence, j.fence, a.failure_class, a.agent_id = $2, a.id \
             FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.id {} ORDER BY j.seq{}",
            in_ids(d, 1),
            d.lock_attempt
        );
        let rows = all(
            self,
            &sql,
            &[id_list(attempts)?, Arg::from(&agent.to_string())],
            |r| Ok((r.text(5)?, rows::renewal_row(r)?)),
        )
        .await?;
        Ok(rows.into_iter().collect())
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
             ladder_step, report_key_hash, submitted_by, reserved_mib, charged, \
             host_estimate_mib, placed_phases) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'leased', $8, $9, $10, $11, $12, $13, $14, \
             $15, (SELECT submitted_by FROM jobs WHERE id = $2), $16, 0, $17, $18)",
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
                a.report_key_hash,
                i64_of(a.reserved_mib),
                opt_i64(a.host_mib),
                match &a.phases {
                    Some(p) => json(p)?,
                    None => Arg::Null,
                }
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

    async fn renew_attempts(
        &mut self,
        renew: &[(String, Option<String>)],
        until: Millis,
    ) -> Result<HashMap<String, Option<StopAsk>>> {
        if renew.is_empty() {
            return Ok(HashMap::new());
        }
        let each: Vec<serde_json::Value> = renew
            .iter()
            .map(|(id, waiting)| serde_json::json!({ "id": id, "waiting": waiting }))
            .collect();
        let sql = format!(
            "UPDATE attempts SET lease_expires_at = $1, waiting = t.waiting \
             FROM (SELECT value ->> 'id' AS id, value ->> 'waiting' AS waiting \
             FROM {}($2)) t WHERE attempts.id = t.id \
             RETURNING attempts.id, attempts.cancel_requested, attempts.requeue",
            self.dialect().json_elements
        );
        let rows = all(self, &sql, &[Arg::from(until), json(&each)?], |r| {
            Ok((
                r.text(0)?,
                StopAsk::of(r.flag(1)?, r.text_opt(2)?.as_deref()),
            ))
        })
        .await?;
        Ok(rows.into_iter().collect())
    }

    async fn clock(&mut self) -> Result<Millis> {
        match self.dialect().clock {
            Some(now) => first(self, &format!("SELECT {now}"), &[], |r| r.int(0))
                .await?
                .ok_or_else(|| super::super::StoreError::Database("the clock read no row".into())),
            None => Ok(super::super::now_ms()),
        }
    }

    async fn extend_lease(
        &mut self,
        attempt: &str,
        until: Millis,
    ) -> Result<Option<Option<StopAsk>>> {
        first(
            self,
            "UPDATE attempts SET lease_expires_at = $1 WHERE id = $2 \
             RETURNING cancel_requested, requeue",
            args![until, attempt],
            |r| Ok(StopAsk::of(r.flag(0)?, r.text_opt(1)?.as_deref())),
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
    ) -> Result<Option<(Millis, u32, Option<String>)>> {
        first(
            self,
            "UPDATE attempts SET phase = 'running', pid = $1, started_at = $2 WHERE id = $3 \
             RETURNING (SELECT j.created_at FROM jobs j WHERE j.id = job_id), number, \
             CASE WHEN placed_phases IS NULL THEN NULL ELSE node END",
            args![pid, at, attempt],
            |r| {
                Ok((
                    r.int(0)?,
                    r.int(1)?.clamp(0, i64::from(u32::MAX)) as u32,
                    r.text_opt(2)?,
                ))
            },
        )
        .await
    }

    async fn memory_key_of(&mut self, attempt: &str) -> Result<Option<String>> {
        first(
            self,
            "SELECT memory_key FROM attempts WHERE id = $1",
            args![attempt],
            |r| r.text(0),
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
        let mut args = arg_vec![
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
            m.energy_source,
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
        ];
        // The figures, one parameter each after the rest (`ENDED_SQL`).
        args.extend(m.figures.iter().map(|f| Arg::from(*f)));
        // Only a run that ended well and alone on its memory teaches of its shape: the shape
        // it told, or JSON `null` where it told none (its next runs are not placed by an
        // older run's); NULL where it teaches nothing.
        let taught = report.failure.is_none() && !report.contaminated;
        args.push(match taught {
            true => json(&report.measurements.memory_profile)?,
            false => Arg::Null,
        });
        let ended = first(self, &ENDED_SQL, &args, |r| rows::ended(r)).await?;
        if ended.is_some() && (report.memory_cap_mib.is_some() || report.oom_cause.is_some()) {
            done(
                self,
                "UPDATE attempts SET memory_cap_mib = $1, oom_cause = $2 WHERE id = $3",
                args![
                    opt_i64(report.memory_cap_mib),
                    report.oom_cause.map(|c| c.as_str()),
                    attempt
                ],
            )
            .await?;
        }
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
        let sql = "UPDATE attempts SET cancel_requested = TRUE, requeue = NULL \
                   WHERE job_id = $1 AND phase != 'ended'";
        done(self, sql, args![job]).await
    }

    async fn request_requeue(&mut self, job: &str, why: Requeue) -> Result<u64> {
        let sql = "UPDATE attempts SET cancel_requested = TRUE, requeue = $2 \
                   WHERE job_id = $1 AND phase != 'ended' AND NOT cancel_requested";
        self.execute(sql, args![job, why.as_str()]).await
    }

    async fn neighbour_grew_count(&mut self, job: &str) -> Result<u32> {
        let n = first(
            self,
            "SELECT COUNT(*) FROM attempts WHERE job_id = $1 AND oom_cause = 'neighbour_grew'",
            args![job],
            |r| r.int(0),
        )
        .await?
        .unwrap_or(0);
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    async fn set_oom_cause(
        &mut self,
        attempt: &str,
        cause: headroom_shared::api::OomCause,
        neighbour: Option<&str>,
    ) -> Result<()> {
        done(
            self,
            "UPDATE attempts SET oom_cause = $2, oom_neighbour = $3 WHERE id = $1",
            &[
                Arg::from(attempt),
                Arg::from(cause.as_str()),
                neighbour.map_or(Arg::Null, Arg::from),
            ],
        )
        .await
    }

    async fn cancel_requested(
        &mut self,
        agent: AgentId,
        attempts: &[String],
    ) -> Result<Vec<(String, StopAsk)>> {
        self.cancels_asked(&agent.to_string(), attempts).await
    }

    async fn host_peaks(&mut self, key: &str) -> Result<Vec<u64>> {
        let window = i64::from(crate::rules::LEARNED_WINDOW);
        all(
            self,
            // Runs that ended well, and those killed at their limit (what they reached
            // raises the next one's): not an early failure's small peak.
            "SELECT host_peak_mib FROM attempts \
             WHERE memory_key = $1 AND host_peak_mib IS NOT NULL \
             AND (failure_class IS NULL OR failure_class = 'host_oom') \
             ORDER BY leased_at DESC LIMIT $2",
            args![key, window],
            |r| Ok(r.int(0)?.max(0) as u64),
        )
        .await
    }

    async fn peaks(&mut self, key: &str) -> Result<KeyPeaks> {
        // The most recent ones only (by the coordinator's clock: an end's time is the
        // agent's): a claim reads them for every key in its window, and a key of a large
        // matrix has as many as its attempts.
        let window = i64::from(crate::rules::LEARNED_WINDOW);
        // A shape is JSON `null` where a run that ended well told none, NULL where the run
        // did not end well (it teaches nothing of its shape).
        let rows = all(self, LATEST_PEAKS, args![key, window], |r| {
            Ok((r.int(0)?.max(0) as u64, r.json_opt::<Option<Phases>>(1)?))
        })
        .await?;
        let profiles = rows
            .iter()
            .filter_map(|(peak, p)| p.map(|p| (*peak, p)))
            .take(crate::rules::PROFILES_WINDOW)
            .collect();
        Ok(KeyPeaks {
            peaks: rows.into_iter().map(|(peak, _)| peak).collect(),
            profiles,
        })
    }

    async fn key_duration_ms(&mut self, key: &str) -> Result<Option<u64>> {
        // The latest successful runs, from the partial index `attempts_key_runs`; those
        // without a GPU peak count too (a CPU-only job's runs have none).
        let window = i64::from(crate::rules::LEARNED_WINDOW);
        let sql = "SELECT CAST(AVG(d) AS BIGINT) FROM (SELECT ended_at - started_at AS d \
                   FROM attempts WHERE memory_key = $1 \
                   AND failure_class IS NULL AND ended_at IS NOT NULL \
                   AND started_at IS NOT NULL ORDER BY leased_at DESC LIMIT $2) latest";
        Ok(first(self, sql, args![key, window], |r| r.mib_opt(0))
            .await?
            .flatten())
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
}
