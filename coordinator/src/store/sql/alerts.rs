//! Alerts: subscriptions, the outbox of events, their deliveries and the marks that make an
//! event be taken once, over `Exec`.

use async_trait::async_trait;
use headroom_shared::api::alerts::{DeliveryState, DeliveryView, SubscriptionView};

use super::super::exec::{Arg, Exec, json};
use super::super::rows::{Cols, ts};
use headroom_shared::JobState;
use headroom_shared::api::DriftView;

use super::super::tx::{
    AlertNote, AlertsTx, DeliveryRow, ExperimentAlerts, LongWait, NewAlertEvent,
};
use super::super::{Millis, Result, StoreError};
use super::{all, done, first};

fn tries(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn state(r: &impl Cols, i: usize) -> Result<DeliveryState> {
    let s = r.text(i)?;
    DeliveryState::parse(&s).ok_or_else(|| StoreError::Corrupt(format!("bad delivery state `{s}`")))
}

#[async_trait]
impl<E: Exec> AlertsTx for E {
    async fn insert_subscription(&mut self, v: &SubscriptionView) -> Result<()> {
        done(
            self,
            "INSERT INTO alert_subscriptions (id, owner, kinds, target, lab_wide, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                Arg::from(&v.id),
                Arg::from(&v.owner),
                json(&v.on)?,
                json(&v.target)?,
                Arg::from(v.lab_wide),
                Arg::from(v.created_at.timestamp_millis()),
            ],
        )
        .await
    }

    async fn subscriptions(&mut self, owner: Option<&str>) -> Result<Vec<SubscriptionView>> {
        all(
            self,
            "SELECT id, owner, kinds, target, lab_wide, created_at FROM alert_subscriptions \
             WHERE CAST($1 AS TEXT) IS NULL OR owner = $1 ORDER BY created_at, id",
            &[owner.map_or(Arg::Null, Arg::from)],
            |r| {
                Ok(SubscriptionView {
                    id: r.text(0)?,
                    owner: r.text(1)?,
                    on: r.json(2)?,
                    target: r.json(3)?,
                    lab_wide: r.flag(4)?,
                    created_at: r.time(5)?,
                })
            },
        )
        .await
    }

    async fn delete_subscription(&mut self, id: &str) -> Result<u64> {
        self.execute(
            "DELETE FROM alert_deliveries WHERE subscription_id = $1",
            args![id],
        )
        .await?;
        self.execute("DELETE FROM alert_subscriptions WHERE id = $1", args![id])
            .await
    }

    async fn insert_alert_event(&mut self, e: &NewAlertEvent) -> Result<i64> {
        first(
            self,
            "INSERT INTO alert_events (kind, subject, summary, details, at) \
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
            &[
                Arg::from(e.kind.as_str()),
                e.subject.as_deref().map_or(Arg::Null, Arg::from),
                Arg::from(&e.summary),
                json(&e.details)?,
                Arg::from(e.at),
            ],
            |r| r.int(0),
        )
        .await?
        .ok_or_else(|| StoreError::Database("an inserted event returned no id".to_string()))
    }

    async fn insert_delivery(
        &mut self,
        id: &str,
        event: i64,
        subscription: &str,
        due: Millis,
    ) -> Result<()> {
        done(
            self,
            "INSERT INTO alert_deliveries (id, event_id, subscription_id, state, due) \
             VALUES ($1, $2, $3, 'pending', $4)",
            args![id, event, subscription, due],
        )
        .await
    }

    async fn claim_deliveries(
        &mut self,
        now: Millis,
        hold_until: Millis,
        limit: u32,
    ) -> Result<Vec<(String, u32)>> {
        // As `claim_tracking`: the outer `due <= $1` is checked again on a row another
        // replica claimed meanwhile, so each is claimed once.
        all(
            self,
            "UPDATE alert_deliveries SET due = $2, tries = tries + 1 \
             WHERE due <= $1 AND id IN (SELECT id FROM alert_deliveries \
             WHERE due <= $1 ORDER BY due LIMIT $3) \
             RETURNING id, tries",
            args![now, hold_until, limit],
            |r| Ok((r.text(0)?, tries(r.int(1)?))),
        )
        .await
    }

    async fn delivery(&mut self, id: &str) -> Result<Option<DeliveryRow>> {
        first(
            self,
            "SELECT d.id, e.id, e.kind, e.summary, e.details, e.at, s.target, d.tries \
             FROM alert_deliveries d JOIN alert_events e ON e.id = d.event_id \
             JOIN alert_subscriptions s ON s.id = d.subscription_id WHERE d.id = $1",
            args![id],
            |r| {
                Ok(DeliveryRow {
                    id: r.text(0)?,
                    event: r.int(1)?,
                    kind: r.parsed(2, "alert kind")?,
                    summary: r.text(3)?,
                    details: r.json(4)?,
                    at: r.int(5)?,
                    target: r.json(6)?,
                    tries: tries(r.int(7)?),
                })
            },
        )
        .await
    }

    async fn set_delivery(
        &mut self,
        id: &str,
        tries: u32,
        state: DeliveryState,
        due: Option<Millis>,
        error: Option<&str>,
        delivered_at: Option<Millis>,
    ) -> Result<bool> {
        let n = self
            .execute(
                "UPDATE alert_deliveries SET state = $2, due = $3, last_error = $4, \
                 delivered_at = $5 WHERE id = $1 AND tries = $6 AND state = 'pending'",
                &[
                    Arg::from(id),
                    Arg::from(state.as_str()),
                    due.map_or(Arg::Null, Arg::from),
                    error.map_or(Arg::Null, Arg::from),
                    delivered_at.map_or(Arg::Null, Arg::from),
                    Arg::from(tries),
                ],
            )
            .await?;
        Ok(n == 1)
    }

    async fn deliveries(&mut self, owner: Option<&str>, limit: u32) -> Result<Vec<DeliveryView>> {
        all(
            self,
            "SELECT d.id, d.subscription_id, e.kind, e.summary, d.state, d.tries, \
             d.last_error, e.at, d.delivered_at, d.due \
             FROM alert_deliveries d JOIN alert_events e ON e.id = d.event_id \
             JOIN alert_subscriptions s ON s.id = d.subscription_id \
             WHERE CAST($1 AS TEXT) IS NULL OR s.owner = $1 \
             ORDER BY CASE WHEN d.state = 'dead' THEN 0 ELSE 1 END, d.event_id DESC, d.id \
             LIMIT $2",
            &[owner.map_or(Arg::Null, Arg::from), Arg::from(limit)],
            |r| {
                let state = state(r, 4)?;
                Ok(DeliveryView {
                    id: r.text(0)?,
                    subscription: r.text(1)?,
                    kind: r.parsed(2, "alert kind")?,
                    summary: r.text(3)?,
                    state,
                    tries: tries(r.int(5)?),
                    last_error: r.text_opt(6)?,
                    event_at: r.time(7)?,
                    delivered_at: r.int_opt(8)?.map(ts),
                    next_try_at: r
                        .int_opt(9)?
                        .filter(|_| state == DeliveryState::Pending)
                        .map(ts),
                })
            },
        )
        .await
    }

    async fn note_job_end(&mut self, job: &str, state: JobState, at: Millis) -> Result<()> {
        done(
            self,
            "INSERT INTO alert_notes (job_id, experiment_id, state, at) \
             SELECT id, experiment_id, $2, $3 FROM jobs WHERE id = $1",
            args![job, state.as_str(), at],
        )
        .await
    }

    async fn alert_notes(&mut self, limit: u32) -> Result<Vec<AlertNote>> {
        all(
            self,
            "SELECT id, job_id, experiment_id, state, at FROM alert_notes ORDER BY id LIMIT $1",
            args![limit],
            |r| {
                Ok(AlertNote {
                    id: r.int(0)?,
                    job: r.text(1)?,
                    experiment: r.text(2)?,
                    state: r.parsed(3, "job state")?,
                    at: r.int(4)?,
                })
            },
        )
        .await
    }

    async fn drop_alert_notes(&mut self, ids: &[i64]) -> Result<()> {
        for chunk in ids.chunks(100) {
            // Numbers the database gave: written into the statement as they are.
            let list: Vec<String> = chunk.iter().map(i64::to_string).collect();
            let sql = format!("DELETE FROM alert_notes WHERE id IN ({})", list.join(", "));
            done(self, &sql, &[]).await?;
        }
        Ok(())
    }

    async fn lock_alerts(&mut self) -> Result<()> {
        self.lock_round("alerts").await
    }

    async fn experiment_alerts(&mut self, experiment: &str) -> Result<Option<ExperimentAlerts>> {
        first(
            self,
            "SELECT name, submitted_by, failure_streak, ended_alerted FROM experiments \
             WHERE id = $1",
            args![experiment],
            |r| {
                Ok(ExperimentAlerts {
                    name: r.text(0)?,
                    submitted_by: r.text(1)?,
                    failure_streak: tries(r.int(2)?),
                    ended_alerted: r.int(3)? != 0,
                })
            },
        )
        .await
    }

    async fn set_experiment_alerts(
        &mut self,
        experiment: &str,
        failure_streak: u32,
        ended_alerted: bool,
    ) -> Result<()> {
        done(
            self,
            "UPDATE experiments SET failure_streak = $2, ended_alerted = $3 WHERE id = $1",
            args![experiment, failure_streak, i64::from(ended_alerted)],
        )
        .await
    }

    async fn job_owner(&mut self, job: &str) -> Result<Option<(String, String, String)>> {
        first(
            self,
            "SELECT j.submitted_by, e.id, e.name FROM jobs j \
             JOIN experiments e ON e.id = j.experiment_id WHERE j.id = $1",
            args![job],
            |r| Ok((r.text(0)?, r.text(1)?, r.text(2)?)),
        )
        .await
    }

    async fn mark_lasting_quarantines(
        &mut self,
        cutoff: Millis,
    ) -> Result<Vec<(String, u32, String, String, Millis)>> {
        all(
            self,
            "UPDATE quarantine SET lasting_alerted = 1 \
             WHERE lasting_alerted = 0 AND since < $1 \
             RETURNING node, gpu, attempt_id, reason, since",
            args![cutoff],
            |r| {
                Ok((
                    r.text(0)?,
                    u32::try_from(r.int(1)?).unwrap_or(u32::MAX),
                    r.text(2)?,
                    r.text(3)?,
                    r.int(4)?,
                ))
            },
        )
        .await
    }

    async fn drifts(&mut self) -> Result<Vec<(String, u32, DriftView)>> {
        all(
            self,
            "SELECT node, gpu, direction, gap_mib, since, lasting FROM gpu_drift \
             ORDER BY node, gpu",
            &[],
            |r| {
                Ok((
                    r.text(0)?,
                    u32::try_from(r.int(1)?).unwrap_or(u32::MAX),
                    DriftView {
                        direction: r.parsed(2, "drift direction")?,
                        gap_mib: r.int(3)?.max(0) as u64,
                        since: r.time(4)?,
                        lasting: r.int(5)? != 0,
                    },
                ))
            },
        )
        .await
    }

    async fn put_drift(&mut self, node: &str, gpu: u32, d: &DriftView) -> Result<()> {
        done(
            self,
            "INSERT INTO gpu_drift (node, gpu, direction, gap_mib, since, lasting) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (node, gpu) DO UPDATE SET \
             direction = excluded.direction, gap_mib = excluded.gap_mib, \
             since = excluded.since, lasting = excluded.lasting",
            &[
                Arg::from(node),
                Arg::from(gpu),
                Arg::from(d.direction.as_str()),
                Arg::from(i64::try_from(d.gap_mib).unwrap_or(i64::MAX)),
                Arg::from(d.since.timestamp_millis()),
                Arg::from(i64::from(d.lasting)),
            ],
        )
        .await
    }

    async fn clear_drift(&mut self, node: &str, gpu: u32) -> Result<()> {
        done(
            self,
            "DELETE FROM gpu_drift WHERE node = $1 AND gpu = $2",
            args![node, gpu],
        )
        .await
    }

    async fn mark_lost_nodes(&mut self, cutoff: Millis) -> Result<Vec<String>> {
        all(
            self,
            "UPDATE nodes SET lost_alerted = 1 \
             WHERE lost_alerted = 0 AND last_seen IS NOT NULL AND last_seen < $1 \
             RETURNING name",
            args![cutoff],
            |r| r.text(0),
        )
        .await
    }

    async fn mark_long_waits(&mut self, cutoff: Millis, limit: u32) -> Result<Vec<LongWait>> {
        // Locked in `seq` order, as every transaction locks jobs; one a claim holds is left
        // to the next sweep.
        let lock = self.dialect().lock_job;
        let skip = if lock.is_empty() { "" } else { " SKIP LOCKED" };
        let sql = format!(
            "SELECT j.id, j.experiment_id, e.name, j.submitted_by, j.updated_at, \
             j.pending_reason FROM jobs j JOIN experiments e ON e.id = j.experiment_id \
             WHERE j.state IN ('queued', 'retrying') AND j.pending_alerted = 0 \
             AND j.updated_at < $1 AND j.waiting_on = 0 ORDER BY j.seq LIMIT $2{lock}{skip}"
        );
        let waits = all(self, &sql, args![cutoff, limit], |r| {
            Ok(LongWait {
                job: r.text(0)?,
                experiment: r.text(1)?,
                experiment_name: r.text(2)?,
                submitted_by: r.text(3)?,
                waiting_since: r.int(4)?,
                pending_reason: r.json_opt(5)?,
            })
        })
        .await?;
        for w in &waits {
            done(
                self,
                "UPDATE jobs SET pending_alerted = 1 WHERE id = $1",
                args![&w.job],
            )
            .await?;
        }
        Ok(waits)
    }

    async fn prune_alerts(&mut self, before: Millis) -> Result<u64> {
        let deliveries = self
            .execute(
                "DELETE FROM alert_deliveries WHERE due IS NULL \
                 AND event_id IN (SELECT id FROM alert_events WHERE at < $1)",
                args![before],
            )
            .await?;
        let events = self
            .execute(
                "DELETE FROM alert_events WHERE at < $1 AND NOT EXISTS \
                 (SELECT 1 FROM alert_deliveries d WHERE d.event_id = alert_events.id)",
                args![before],
            )
            .await?;
        Ok(deliveries + events)
    }
}
