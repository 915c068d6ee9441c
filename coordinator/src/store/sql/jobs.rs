//! Experiments and jobs: their statements, over `Exec`.

use async_trait::async_trait;
use headroom_shared::api::{AttemptView, JobDetail, JobSummary, StateCounts};
use headroom_shared::pending::PendingReason;
use headroom_shared::{FailureClass, JobState};

use super::super::exec::{Arg, Exec, RowRef, json};
use super::super::rows::{self, Cols, ExperimentRow, LeaseRow};
use super::super::tx::{JobLeased, JobsTx, JobsWhere};
use super::super::{Millis, NewExperiment, Result};
use super::{
    EXPERIMENT_STATE_COUNTS, EXPERIMENT_UNFINISHED, STATE_COUNTS, UNFINISHED, WAITING, all, done,
    first, pending_window, states, text,
};
use crate::rules::{JobRules, LadderStep, PendingRow, QueueCursor};
use headroom_shared::api::source::Source;

#[async_trait]
impl<E: Exec> JobsTx for E {
    async fn insert_experiment(&mut self, exp: &NewExperiment, now: Millis) -> Result<()> {
        let id = exp.id.to_string();
        let source = match &exp.source {
            Some(s) => json(s)?,
            None => Arg::Null,
        };
        let results = match &exp.results {
            Some(r) => json(r)?,
            None => Arg::Null,
        };
        let study_id = exp.study.as_ref().map(|s| s.id.to_string());
        done(
            self,
            "INSERT INTO experiments (id, name, seed, spec, created_at, submitted_by, source, \
             results, study_id, study_name, max_concurrent, host_memory_mib, checkpoint, \
             preemptible, memory_cap_off, memory_phases) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
            &[
                Arg::from(&id),
                Arg::from(&exp.name),
                Arg::from(exp.seed as i64),
                json(&exp.spec)?,
                Arg::from(now),
                Arg::from(&exp.submitted_by),
                source,
                results,
                Arg::from(study_id.as_ref()),
                Arg::from(exp.study.as_ref().map(|s| &s.name)),
                Arg::from(exp.max_concurrent),
                Arg::from(exp.host_memory_mib.map(super::super::rows::i64_of)),
                match &exp.checkpoint {
                    Some(c) => json(c)?,
                    None => Arg::Null,
                },
                Arg::from(exp.preemptible),
                Arg::from(exp.memory_cap_off),
                match &exp.memory_phases {
                    Some(p) => json(p)?,
                    None => Arg::Null,
                },
            ],
        )
        .await?;
        self.insert_jobs(exp, now).await?;
        // Each job's configuration (its submitter's spec, its parameters before any ladder
        // step, its ladder): where a configuration last fit is kept under it.
        let spec_of = format!("{};{}", exp.submitted_by, exp.name);
        done(
            self,
            "UPDATE jobs SET base_memory_key = CAST($2 AS TEXT) || ';' || CAST(params AS TEXT) \
             || ';' || CAST(ladder AS TEXT) WHERE experiment_id = $1",
            &[Arg::from(&id), Arg::from(&spec_of)],
        )
        .await
    }

    async fn lock_concurrency_caps(&mut self) -> Result<()> {
        // A memory floor's lock class, under a name no memory key has (names hold no space).
        self.lock_key("headroom max_concurrent").await
    }

    async fn active_jobs_of(&mut self, experiment: &str) -> Result<u32> {
        let n = first(
            self,
            &format!(
                "SELECT COUNT(*) FROM jobs WHERE experiment_id = $1 AND state IN ({})",
                states(|s| s.is_active())
            ),
            args![experiment],
            |r| r.int(0),
        )
        .await?
        .unwrap_or(0);
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    async fn experiment_ids(&mut self) -> Result<Vec<String>> {
        let sql = "SELECT id FROM experiments ORDER BY created_at, id";
        all(self, sql, &[], text).await
    }

    async fn experiment_row(&mut self, id: &str) -> Result<Option<ExperimentRow>> {
        first(
            self,
            "SELECT name, seed, created_at, submitted_by, source, study_id, study_name \
             FROM experiments WHERE id = $1",
            args![id],
            |r| {
                Ok(ExperimentRow {
                    name: r.text(0)?,
                    seed: r.int(1)?,
                    created_at: r.int(2)?,
                    submitted_by: r.text(3)?,
                    source: r.json_opt(4)?,
                    study: match (r.text_opt(5)?, r.text_opt(6)?) {
                        (Some(id), Some(name)) => Some(headroom_shared::api::StudyRef {
                            id: rows::parse(&id, "study id")?,
                            name,
                        }),
                        _ => None,
                    },
                })
            },
        )
        .await
    }

    async fn experiment_sources(
        &mut self,
        experiment: Option<&str>,
    ) -> Result<Vec<(String, Option<Source>)>> {
        all(
            self,
            "SELECT id, source FROM experiments WHERE CAST($1 AS TEXT) IS NULL OR id = $1",
            args![experiment],
            |r| Ok((r.text(0)?, r.json_opt(1)?)),
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

    async fn unfinished(&mut self, experiment: Option<&str>) -> Result<bool> {
        // Two statements, as for the counts: each plans with its own index.
        let found = match experiment {
            Some(e) => first(self, &EXPERIMENT_UNFINISHED, args![e], |_| Ok(())).await?,
            None => first(self, &UNFINISHED, args![], |_| Ok(())).await?,
        };
        Ok(found.is_some())
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
                id_prefix,
                index,
            } => {
                // Bound, not written into the SQL: one prepared statement whatever the limit.
                let bound = if limit.is_some() { " LIMIT $5" } else { "" };
                let sql = format!(
                    "SELECT {cols} {from} WHERE (CAST($1 AS TEXT) IS NULL OR j.experiment_id = $1) \
                     AND (CAST($2 AS TEXT) IS NULL OR j.state = $2) \
                     AND (CAST($3 AS TEXT) IS NULL OR j.id LIKE $3) \
                     AND (CAST($4 AS BIGINT) IS NULL OR j.idx = $4) ORDER BY j.seq{bound}"
                );
                let state = state.map(JobState::as_str);
                // The caller checked it holds no pattern character.
                let like = id_prefix.map(|p| format!("{p}%"));
                let mut args = vec![
                    Arg::from(experiment),
                    Arg::from(state),
                    Arg::from(like.as_deref()),
                    Arg::from(index),
                ];
                args.extend(limit.map(Arg::from));
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
        leased: Option<JobLeased>,
    ) -> Result<u64> {
        let (sql, args): (&str, &[Arg]) = match leased {
            None => (
                // A job back in the queue may be told of again when it waits long.
                "UPDATE jobs SET state = $1, updated_at = $2, pending_alerted = 0 \
                 WHERE id = $3 AND state = $4",
                args![to.as_str(), now, job, from.as_str()],
            ),
            Some(l) => (
                "UPDATE jobs SET state = $1, updated_at = $2, attempts = $5, fence = $6, \
                 pending_reason = NULL WHERE id = $3 AND state = $4",
                args![to.as_str(), now, job, from.as_str(), l.attempts, l.fence],
            ),
        };
        self.execute(sql, args).await
    }

    async fn job_rules(&mut self, job: &str) -> Result<Option<JobRules>> {
        let sql = format!(
            "SELECT {} FROM jobs j JOIN experiments e ON e.id = j.experiment_id WHERE j.id = $1",
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

    async fn fit_of_job(&mut self, job: &str) -> Result<Option<String>> {
        first(
            self,
            "SELECT base_memory_key FROM jobs WHERE id = $1",
            args![job],
            |r| r.text_opt(0),
        )
        .await
        .map(Option::flatten)
    }

    async fn raise_ladder_fit(
        &mut self,
        key: &str,
        step: u32,
        attempt: &str,
        now: Millis,
    ) -> Result<u32> {
        done(
            self,
            "INSERT INTO ladder_fits (memory_key, step, attempt_id, fitted_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (memory_key) DO UPDATE \
             SET step = excluded.step, attempt_id = excluded.attempt_id, \
             fitted_at = excluded.fitted_at WHERE ladder_fits.step < excluded.step",
            args![key, step, attempt, now],
        )
        .await?;
        first(
            self,
            "SELECT step FROM ladder_fits WHERE memory_key = $1",
            args![key],
            |r| r.int(0),
        )
        .await
        .map(|s| s.map_or(step, |s| u32::try_from(s).unwrap_or(step)))
    }

    async fn fits_of_experiment(&mut self, experiment: &str) -> Result<Vec<(String, u32, String)>> {
        all(
            self,
            "SELECT j.id, f.step, f.attempt_id FROM jobs j \
             JOIN ladder_fits f ON f.memory_key = j.base_memory_key \
             WHERE j.experiment_id = $1 AND j.ladder_step < f.step ORDER BY j.seq",
            args![experiment],
            |r| {
                Ok((
                    r.text(0)?,
                    u32::try_from(r.int(1)?).unwrap_or(0),
                    r.text(2)?,
                ))
            },
        )
        .await
    }

    async fn lock_unstarted_of_key(&mut self, key: &str, below: u32) -> Result<Vec<String>> {
        // Skipped when a claim holds one: it starts where it is, and learns as any run.
        let sql = format!(
            "SELECT id FROM jobs WHERE base_memory_key = $1 AND state = 'queued' \
             AND attempts = 0 AND ladder_step < $2 ORDER BY seq{}",
            self.dialect().skip_locked
        );
        all(self, &sql, args![key, below], |r| r.text(0)).await
    }

    async fn set_ladder_from(&mut self, job: &str, why: &str) -> Result<()> {
        done(
            self,
            "UPDATE jobs SET ladder_from = $1 WHERE id = $2",
            args![why, job],
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
        user: Option<&str>,
        max_gpus: u32,
        after: Option<QueueCursor>,
        limit: u32,
    ) -> Result<Vec<PendingRow>> {
        let sql = pending_window(self.dialect(), max_gpus == 0, user.is_some(), true);
        let (priority, seq) = match after {
            Some(c) => (Some(c.priority), c.seq),
            None => (None, 0),
        };
        let mut args = arg_vec![max_gpus, priority, seq, limit];
        if let Some(u) = user {
            args.push(Arg::from(u));
        }
        all(self, &sql, &args, |r| rows::pending(r)).await
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
}
