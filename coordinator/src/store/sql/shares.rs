//! Fair share and users' caps: their statements, over `Exec`.

use async_trait::async_trait;
use headroom_shared::JobState;
use headroom_shared::api::UserLimits;

use super::super::exec::{Arg, Dialect, Exec};
use super::super::rows::{self, Cols};
use super::super::tx::{HolderRow, SharesTx, UsageAttempt};
use super::super::{Millis, Result};
use super::{WAITING, all, done, first, id_list, in_ids, states, text};
use crate::fair::{Held, Ledger, Run};
use crate::rules::PendingRow;

/// The columns of a run (`submitted_by, reserved_mib, gpus, started_at, ended_at`).
const RUN_COLUMNS: &str = "submitted_by, reserved_mib, gpus, started_at, ended_at";

fn run(r: &impl Cols, i: usize) -> Result<Run> {
    let gpus: Vec<u32> = r.json(i + 2)?;
    Ok(Run {
        user: r.text(i)?,
        reserved_mib: r.mib_opt(i + 1)?.unwrap_or(0),
        gpus: u32::try_from(gpus.len()).unwrap_or(u32::MAX),
        started: r.int_opt(i + 3)?,
        ended: r.int_opt(i + 4)?,
    })
}

/// The users with waiting jobs that fit `$1` GPUs: one probe of `jobs_waiting_by_user` per
/// user (a loose index scan), not a read of every waiting job.
pub(in crate::store) fn waiting_users(dialect: &Dialect) -> String {
    let from = format!(
        "FROM jobs{} WHERE state IN ({}) AND waiting_on = 0 AND gpus <= $1",
        dialect.waiting_user_index, *WAITING
    );
    format!(
        "WITH RECURSIVE u(name) AS ( \
           SELECT MIN(submitted_by) {from} \
           UNION ALL \
           SELECT (SELECT MIN(submitted_by) {from} AND submitted_by > u.name) \
           FROM u WHERE u.name IS NOT NULL) \
         SELECT name FROM u WHERE name IS NOT NULL"
    )
}

#[async_trait]
impl<E: Exec> SharesTx for E {
    async fn preemptible_nodes(&mut self) -> Result<Vec<String>> {
        let sql = "SELECT DISTINCT a.node FROM attempts a JOIN jobs j ON j.id = a.job_id \
                   JOIN experiments e ON e.id = j.experiment_id \
                   WHERE a.phase != 'ended' AND e.preemptible ORDER BY a.node";
        all(self, sql, &[], text).await
    }

    async fn holders_on(&mut self, node: &str) -> Result<Vec<HolderRow>> {
        let sql = "SELECT a.id, a.job_id, j.submitted_by, j.priority, e.preemptible, \
                   a.cancel_requested, j.preempted_at, j.seq \
                   FROM attempts a JOIN jobs j ON j.id = a.job_id \
                   JOIN experiments e ON e.id = j.experiment_id \
                   WHERE a.node = $1 AND a.phase != 'ended' ORDER BY j.seq";
        all(self, sql, args![node], |r| {
            Ok(HolderRow {
                attempt: r.text(0)?,
                job: r.text(1)?,
                user: r.text(2)?,
                priority: r.int(3)?,
                preemptible: r.flag(4)?,
                stopping: r.flag(5)?,
                preempted_at: r.int_opt(6)?,
                seq: r.int(7)?,
            })
        })
        .await
    }

    async fn read_pending(
        &mut self,
        user: &str,
        max_gpus: u32,
        limit: u32,
    ) -> Result<Vec<PendingRow>> {
        let sql = super::pending_window(self.dialect(), false, true, false);
        let none: Option<i64> = None;
        all(self, &sql, args![max_gpus, none, 0i64, limit, user], |r| {
            rows::pending(r)
        })
        .await
    }

    async fn lock_preemption(&mut self) -> Result<()> {
        self.lock_round("preemption").await
    }

    async fn set_preempted_at(&mut self, job: &str, at: Millis) -> Result<()> {
        done(
            self,
            "UPDATE jobs SET preempted_at = $2 WHERE id = $1",
            args![job, at],
        )
        .await
    }

    async fn waiting_users(&mut self, max_gpus: u32) -> Result<Vec<String>> {
        let sql = waiting_users(self.dialect());
        all(self, &sql, args![max_gpus], text).await
    }

    async fn user_limits(&mut self) -> Result<Vec<(String, UserLimits)>> {
        let sql = "SELECT name, share, max_jobs, max_gpus, max_gpu_mib FROM users \
                   WHERE share != 1 OR max_jobs IS NOT NULL OR max_gpus IS NOT NULL \
                   OR max_gpu_mib IS NOT NULL";
        all(self, sql, &[], |r| {
            Ok((r.text(0)?, rows::user_limits(r, 1)?))
        })
        .await
    }

    async fn ledgers(&mut self) -> Result<Vec<(String, Ledger)>> {
        all(self, "SELECT name, mib_ms, at FROM share_usage", &[], |r| {
            Ok((
                r.text(0)?,
                Ledger {
                    mib_ms: r.int(1)?,
                    at: r.int(2)?,
                },
            ))
        })
        .await
    }

    async fn uncharged_runs(&mut self) -> Result<Vec<Run>> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM attempts WHERE charged = 0");
        all(self, &sql, &[], |r| run(r, 0)).await
    }

    async fn held_by(&mut self, user: &str) -> Result<Held> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM attempts \
             WHERE submitted_by = $1 AND charged = 0 AND phase != 'ended'"
        );
        let runs = all(self, &sql, args![user], |r| run(r, 0)).await?;
        Ok(Held::of(&runs))
    }

    async fn lock_uncharged_ended(&mut self, limit: u32) -> Result<Vec<(String, Run)>> {
        let sql = format!(
            "SELECT id, {RUN_COLUMNS} FROM attempts WHERE charged = 0 AND phase = 'ended' \
             ORDER BY id LIMIT $1{}",
            self.dialect().skip_locked
        );
        all(self, &sql, args![limit], |r| Ok((r.text(0)?, run(r, 1)?))).await
    }

    async fn lock_ledger(&mut self, user: &str, now: Millis) -> Result<Ledger> {
        done(
            self,
            "INSERT INTO share_usage (name, mib_ms, at) VALUES ($1, 0, $2) \
             ON CONFLICT (name) DO NOTHING",
            args![user, now],
        )
        .await?;
        let sql = format!(
            "SELECT mib_ms, at FROM share_usage WHERE name = $1{}",
            self.dialect().lock
        );
        let ledger = first(self, &sql, args![user], |r| {
            Ok(Ledger {
                mib_ms: r.int(0)?,
                at: r.int(1)?,
            })
        })
        .await?;
        Ok(ledger.unwrap_or(Ledger { mib_ms: 0, at: now }))
    }

    async fn set_ledger(&mut self, user: &str, l: Ledger) -> Result<()> {
        done(
            self,
            "UPDATE share_usage SET mib_ms = $2, at = $3 WHERE name = $1",
            args![user, l.mib_ms, l.at],
        )
        .await
    }

    async fn mark_charged(&mut self, attempts: &[String]) -> Result<()> {
        // One statement for the round's runs, not one a run: a busy fleet ends hundreds a
        // second, and each statement is a round trip the database serves.
        let sql = format!(
            "UPDATE attempts SET charged = 1 WHERE id {}",
            in_ids(self.dialect(), 1)
        );
        done(self, &sql, &[id_list(attempts)?]).await
    }

    async fn usage_attempts(&mut self, from: Millis, to: Millis) -> Result<Vec<UsageAttempt>> {
        let sql = "SELECT a.submitted_by, j.experiment_id, e.name, a.gpus, a.reserved_mib, \
                   a.started_at, a.ended_at, a.energy_mj, a.contaminated \
                   FROM attempts a JOIN jobs j ON j.id = a.job_id \
                   JOIN experiments e ON e.id = j.experiment_id \
                   WHERE a.started_at < $2 AND (a.ended_at IS NULL OR a.ended_at >= $1)";
        all(self, sql, args![from, to], |r| {
            let gpus: Vec<u32> = r.json(3)?;
            Ok(UsageAttempt {
                user: r.text(0)?,
                experiment: r.text(1)?,
                experiment_name: r.text(2)?,
                gpus: u32::try_from(gpus.len()).unwrap_or(u32::MAX),
                reserved_mib: r.mib_opt(4)?,
                started: r.int_opt(5)?,
                ended: r.int_opt(6)?,
                energy_mj: r.mib_opt(7)?,
                contaminated: r.flag_opt(8)?.unwrap_or(true),
            })
        })
        .await
    }

    async fn ended_jobs(
        &mut self,
        from: Millis,
        to: Millis,
    ) -> Result<Vec<(String, String, String, JobState)>> {
        let sql = format!(
            "SELECT j.submitted_by, j.experiment_id, e.name, j.state \
             FROM jobs j JOIN experiments e ON e.id = j.experiment_id \
             WHERE j.state IN ({}) AND j.updated_at >= $1 AND j.updated_at < $2",
            states(|s| s.is_terminal())
        );
        all(self, &sql, args![from, to], |r| {
            Ok((
                r.text(0)?,
                r.text(1)?,
                r.text(2)?,
                r.parsed(3, "job state")?,
            ))
        })
        .await
    }
}
