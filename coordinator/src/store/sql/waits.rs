//! A study's waits between jobs (`after`): their statements, over `Exec`.

use async_trait::async_trait;
use headroom_shared::JobState;

use super::super::exec::{Arg, Exec};
use super::super::rows::Cols;
use super::super::tx::{WaitRow, WaitsTx};
use super::super::{Millis, NewDependency, Result};
use super::{all, done};

/// Waits inserted per statement: four parameters each, well under either database's limit.
const WAITS_PER_INSERT: usize = 500;

#[async_trait]
impl<E: Exec> WaitsTx for E {
    async fn insert_waits(&mut self, waits: &[NewDependency]) -> Result<()> {
        for chunk in waits.chunks(WAITS_PER_INSERT) {
            let rows: Vec<[String; 4]> = chunk
                .iter()
                .map(|w| {
                    [
                        w.job.to_string(),
                        w.needs.to_string(),
                        w.when.as_str().to_string(),
                        w.on_failure.as_str().to_string(),
                    ]
                })
                .collect();
            let values: Vec<String> = (0..rows.len())
                .map(|i| {
                    let b = i * 4;
                    format!("(${}, ${}, ${}, ${})", b + 1, b + 2, b + 3, b + 4)
                })
                .collect();
            let args: Vec<Arg<'_>> = rows.iter().flatten().map(Arg::from).collect();
            done(
                self,
                &format!(
                    "INSERT INTO job_waits (job_id, needs_job_id, wait_when, on_failure) VALUES {}",
                    values.join(", ")
                ),
                &args,
            )
            .await?;
        }
        Ok(())
    }

    async fn dependants(&mut self, job: &str) -> Result<Vec<(String, JobState)>> {
        all(
            self,
            "SELECT j.id, j.state FROM job_waits w JOIN jobs j ON j.id = w.job_id \
             WHERE w.needs_job_id = $1 ORDER BY j.seq",
            args![job],
            |r| Ok((r.text(0)?, r.parsed(1, "job state")?)),
        )
        .await
    }

    async fn waits_of(&mut self, job: &str) -> Result<Vec<WaitRow>> {
        all(
            self,
            "SELECT n.id, n.state, e.name, w.wait_when, w.on_failure FROM job_waits w \
             JOIN jobs n ON n.id = w.needs_job_id JOIN experiments e ON e.id = n.experiment_id \
             WHERE w.job_id = $1 ORDER BY n.seq",
            args![job],
            |r| {
                Ok(WaitRow {
                    needs: r.text(0)?,
                    needs_state: r.parsed(1, "job state")?,
                    needs_experiment: r.text(2)?,
                    when: r.parsed(3, "wait_when")?,
                    on_failure: r.parsed(4, "on_failure")?,
                })
            },
        )
        .await
    }

    async fn set_waiting_on(&mut self, job: &str, unmet: u64) -> Result<()> {
        done(
            self,
            "UPDATE jobs SET waiting_on = $1 WHERE id = $2 AND waiting_on != $1",
            args![i64::try_from(unmet).unwrap_or(i64::MAX), job],
        )
        .await
    }

    async fn count_new_waits(&mut self, experiment: &str) -> Result<()> {
        done(
            self,
            "UPDATE jobs SET waiting_on = (SELECT COUNT(*) FROM job_waits w \
             WHERE w.job_id = jobs.id) WHERE experiment_id = $1",
            args![experiment],
        )
        .await
    }

    async fn note_wait_change(&mut self, job: &str, now: Millis) -> Result<()> {
        done(
            self,
            "INSERT INTO wait_changes (job_id, at) SELECT $1, $2 \
             WHERE EXISTS (SELECT 1 FROM job_waits WHERE needs_job_id = $1)",
            args![job, now],
        )
        .await
    }

    async fn wait_changes_due(&mut self, limit: u32) -> Result<Vec<(i64, String)>> {
        all(
            self,
            "SELECT id, job_id FROM wait_changes ORDER BY id LIMIT $1",
            args![limit],
            |r| Ok((r.int(0)?, r.text(1)?)),
        )
        .await
    }

    async fn drop_wait_changes(&mut self, ids: &[i64]) -> Result<()> {
        for id in ids {
            done(self, "DELETE FROM wait_changes WHERE id = $1", args![*id]).await?;
        }
        Ok(())
    }
}
