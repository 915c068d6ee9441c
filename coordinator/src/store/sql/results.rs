//! What runs achieved: their statements, over `Exec`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use headroom_shared::results::{Point, RungDecision, RungValue};

use super::super::exec::{Arg, Exec, json};
use super::super::rows::{self, Cols};
use super::super::tx::{AttemptResults, ResultsTx, SeriesRow, TrackingRow};
use super::super::{Millis, Result};
use super::{all, done, first};

#[async_trait]
impl<E: Exec> ResultsTx for E {
    async fn set_attempt_metrics(
        &mut self,
        attempt: &str,
        finals: &BTreeMap<String, f64>,
        ignored: u64,
        series: &BTreeMap<String, Vec<Point>>,
    ) -> Result<()> {
        done(
            self,
            "UPDATE attempts SET metric_finals = $2, metrics_ignored = $3 WHERE id = $1",
            &[
                Arg::from(attempt),
                json(finals)?,
                Arg::from(i64::try_from(ignored).unwrap_or(i64::MAX)),
            ],
        )
        .await?;
        done(
            self,
            "INSERT INTO attempt_series (attempt_id, series) VALUES ($1, $2) \
             ON CONFLICT (attempt_id) DO UPDATE SET series = excluded.series",
            &[Arg::from(attempt), json(series)?],
        )
        .await
    }

    async fn results_of_attempt(&mut self, attempt: &str) -> Result<Option<AttemptResults>> {
        first(
            self,
            "SELECT j.experiment_id, e.results, a.rungs FROM attempts a \
             JOIN jobs j ON j.id = a.job_id JOIN experiments e ON e.id = j.experiment_id \
             WHERE a.id = $1",
            &[Arg::from(attempt)],
            |r| rows::attempt_results(r),
        )
        .await
    }

    async fn insert_rung_value(
        &mut self,
        experiment: &str,
        attempt: &str,
        at: &RungValue,
    ) -> Result<()> {
        done(
            self,
            "INSERT INTO metric_rungs (experiment_id, rung, attempt_id, job_id, value) \
             SELECT $1, $2, a.id, a.job_id, $4 FROM attempts a WHERE a.id = $3 \
             ON CONFLICT (experiment_id, rung, attempt_id) DO NOTHING",
            &[
                Arg::from(experiment),
                Arg::from(at.rung),
                Arg::from(attempt),
                json(&at.value)?,
            ],
        )
        .await
    }

    async fn rung_values(
        &mut self,
        experiment: &str,
        rung: u32,
        attempt: &str,
    ) -> Result<Vec<f64>> {
        // Another attempt of the same job is no competitor: as in Optuna, a job is one trial.
        all(
            self,
            "SELECT r.value FROM metric_rungs r WHERE r.experiment_id = $1 AND r.rung = $2 \
             AND r.job_id <> (SELECT a.job_id FROM attempts a WHERE a.id = $3)",
            &[Arg::from(experiment), Arg::from(rung), Arg::from(attempt)],
            |r| r.json(0),
        )
        .await
    }

    async fn set_attempt_rungs(&mut self, attempt: &str, rungs: &[RungDecision]) -> Result<()> {
        done(
            self,
            "UPDATE attempts SET rungs = $2 WHERE id = $1",
            &[Arg::from(attempt), json(&rungs)?],
        )
        .await
    }

    async fn experiment_series(
        &mut self,
        experiment: &str,
        metric: Option<&str>,
    ) -> Result<Vec<SeriesRow>> {
        // With a metric, only its array leaves the database (`->`), not every series.
        let series = if metric.is_some() {
            "s.series -> $2"
        } else {
            "s.series"
        };
        let sql = format!(
            "SELECT a.id, a.job_id, j.idx, a.number, a.params, j.state, a.phase, \
             a.metric_finals, a.metrics_ignored, a.rungs, {series} \
             FROM attempts a JOIN jobs j ON j.id = a.job_id \
             LEFT JOIN attempt_series s ON s.attempt_id = a.id \
             WHERE j.experiment_id = $1 AND (s.series IS NOT NULL OR a.metric_finals IS NOT NULL) \
             ORDER BY j.seq, a.number"
        );
        let mut args = vec![Arg::from(experiment)];
        if let Some(m) = metric {
            args.push(Arg::from(m));
        }
        all(self, &sql, &args, |r| {
            let series = match metric {
                Some(m) => r
                    .json_opt::<Vec<Point>>(10)?
                    .map(|s| BTreeMap::from([(m.to_string(), s)]))
                    .unwrap_or_default(),
                None => r.json_opt(10)?.unwrap_or_default(),
            };
            Ok(SeriesRow {
                attempt: r.text(0)?,
                job: r.text(1)?,
                index: r.int(2)?,
                number: r.int(3)?,
                params: r.json(4)?,
                state: r.text(5)?,
                phase: r.text(6)?,
                finals: r.json_opt(7)?.unwrap_or_default(),
                ignored: r.mib_opt(8)?.unwrap_or(0),
                rungs: r.json_opt(9)?.unwrap_or_default(),
                series,
            })
        })
        .await
    }

    async fn set_tracking(
        &mut self,
        attempt: &str,
        note: Option<&str>,
        due: Option<Millis>,
    ) -> Result<()> {
        done(
            self,
            "UPDATE attempts SET tracking = COALESCE($2, tracking), tracking_due = $3 \
             WHERE id = $1",
            &[
                Arg::from(attempt),
                note.map_or(Arg::Null, Arg::from),
                due.map_or(Arg::Null, Arg::from),
            ],
        )
        .await
    }

    async fn tracking_row(&mut self, attempt: &str) -> Result<Option<TrackingRow>> {
        first(
            self,
            "SELECT e.name, j.idx, e.results, e.source, s.series FROM attempts a \
             JOIN jobs j ON j.id = a.job_id JOIN experiments e ON e.id = j.experiment_id \
             LEFT JOIN attempt_series s ON s.attempt_id = a.id WHERE a.id = $1",
            &[Arg::from(attempt)],
            |r| {
                Ok(TrackingRow {
                    experiment: r.text(0)?,
                    index: r.int(1)?,
                    results: r.json_opt(2)?,
                    source: r.json_opt(3)?,
                    series: r.json_opt(4)?.unwrap_or_default(),
                })
            },
        )
        .await
    }

    async fn claim_tracking(
        &mut self,
        now: Millis,
        hold_until: Millis,
        limit: u32,
    ) -> Result<Vec<(String, u32)>> {
        // The outer `tracking_due <= $1` is checked again on a row another replica claimed
        // meanwhile (PostgreSQL re-reads a row it waited for): each is claimed once.
        all(
            self,
            "UPDATE attempts SET tracking_due = $2, tracking_tries = tracking_tries + 1 \
             WHERE tracking_due <= $1 AND id IN (SELECT id FROM attempts \
             WHERE tracking_due <= $1 ORDER BY tracking_due LIMIT $3) \
             RETURNING id, tracking_tries",
            &[Arg::from(now), Arg::from(hold_until), Arg::from(limit)],
            |r| Ok((r.text(0)?, u32::try_from(r.int(1)?).unwrap_or(u32::MAX))),
        )
        .await
    }
}
