//! Each ended attempt of an experiment with `tracking: {mlflow: URI}` becomes an MLflow run,
//! written through MLflow's REST API from the store's outbox (`tracking_due`): its parameters,
//! its metric series, headroom's figures (energy, share, peak memory, flags, `clean`), the job
//! and attempt ids as tags and the commit when known. Each attempt is claimed by one replica
//! at a time and tried again with backoff; a tracker that stays unreachable never fails a job,
//! and the attempt's `tracking` note (`show`) says what became of it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use headroom_shared::AttemptId;
use headroom_shared::api::AttemptView;
use headroom_shared::results::Point;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::AppState;
use crate::store::TrackingRow;

/// Tries before an attempt's run is given up.
pub const MAX_TRIES: u32 = 8;
/// How long a claimed attempt is another replica's to leave alone: longer than its write
/// can take (a few requests per 1,000 points, each at most [`REQUEST_TIMEOUT`]).
const HOLD_MS: i64 = 600_000;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// The most of an answer read: MLflow's are small.
const MAX_ANSWER: usize = 1 << 20;
/// MLflow's `log-batch` takes at most 1000 metrics (and 100 params) per request.
const METRICS_PER_BATCH: usize = 1000;
const PARAMS_PER_BATCH: usize = 100;
/// MLflow keeps param values up to this many characters.
const PARAM_VALUE_MAX: usize = 6000;

#[derive(Debug, thiserror::Error)]
pub enum TrackingError {
    #[error("cannot reach {url}: {source}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered {status}: {body}")]
    Refused {
        url: String,
        status: reqwest::StatusCode,
        body: String,
    },
    #[error("{url} answered something unexpected: {what}")]
    Unexpected { url: String, what: String },
}

/// Writes due runs until `shutdown`, polling the outbox every second.
pub async fn run(state: AppState, shutdown: CancellationToken) {
    // No redirect is followed: the allowed server is the only host written to.
    let http = match headroom_shared::client::http_builder()
        .connect_timeout(Duration::from_secs(3))
        .timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("no HTTP client for tracking servers: {e}");
            return;
        }
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // One attempt at a time, each claimed just before it is written, until none is due.
        loop {
            let due = match state.store.claim_tracking(HOLD_MS, 1).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!("tracking outbox: {e}");
                    break;
                }
            };
            let Some(&(attempt, tries)) = due.first() else {
                break;
            };
            let written = tokio::select! {
                // Left claimed: another replica (or this one, restarted) takes it once its
                // hold runs out.
                _ = shutdown.cancelled() => return,
                w = write_one(&state, &http, attempt) => w,
            };
            let (note, due) = outcome(attempt, tries, written);
            if let Err(e) = state.store.set_tracking(attempt, note, due).await {
                tracing::warn!(%attempt, "cannot record the tracking note: {e}");
            }
        }
    }
}

/// The attempt's tracking note after a try, and when to try again (`None`: never).
fn outcome(
    attempt: AttemptId,
    tries: u32,
    written: Result<String, String>,
) -> (String, Option<crate::store::Millis>) {
    match written {
        Ok(run) => (format!("mlflow run {run}"), None),
        Err(e) if tries >= MAX_TRIES => {
            tracing::warn!(%attempt, "tracking given up after {tries} tries: {e}");
            (
                format!("mlflow unreachable, given up after {tries} tries: {e}"),
                None,
            )
        }
        Err(e) => {
            let wait = backoff(tries);
            tracing::warn!(%attempt, tries, "tracking failed, trying again in {wait:?}: {e}");
            (
                format!(
                    "mlflow unreachable (try {tries} of {MAX_TRIES}, again in {}s): {e}",
                    wait.as_secs()
                ),
                Some(crate::store::now_ms() + wait.as_millis() as i64),
            )
        }
    }
}

/// The wait after `tries` failed tries: 1 s, doubling, at most a minute.
pub fn backoff(tries: u32) -> Duration {
    Duration::from_secs(1u64 << tries.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}

async fn write_one(
    state: &AppState,
    http: &reqwest::Client,
    attempt: AttemptId,
) -> Result<String, String> {
    let (view, row) = state
        .store
        .tracking_record(attempt)
        .await
        .map_err(|e| e.to_string())?;
    let Some(uri) = row.results.as_ref().and_then(|r| r.tracking.as_ref()) else {
        return Err("the experiment has no tracking server".into());
    };
    // Allowed at submit; checked again, as the list may have changed since.
    if !state.config.mlflow_allowed(&uri.mlflow) {
        return Err(format!(
            "{} is not among the MLflow servers this coordinator may write to \
             (--mlflow-servers)",
            uri.mlflow
        ));
    }
    let mlflow = Mlflow {
        http,
        base: uri.mlflow.trim_end_matches('/').to_string(),
    };
    mlflow.write(&view, &row).await.map_err(|e| e.to_string())
}

/// One MLflow tracking server.
struct Mlflow<'a> {
    http: &'a reqwest::Client,
    base: String,
}

impl Mlflow<'_> {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Value>,
    ) -> Result<Result<Value, (reqwest::StatusCode, Value)>, TrackingError> {
        let url = format!("{}/api/2.0/mlflow/{path}", self.base);
        let mut req = self.http.request(method, &url).query(query);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let unreachable = |source| TrackingError::Unreachable {
            url: url.clone(),
            source,
        };
        let mut resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(unreachable)? {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_ANSWER {
                return Err(self.unexpected(path, "an answer past 1 MiB"));
            }
        }
        let text = String::from_utf8_lossy(&body);
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            Ok(Ok(value))
        } else if status.is_client_error() && value.get("error_code").is_some() {
            Ok(Err((status, value)))
        } else {
            Err(TrackingError::Refused {
                url,
                status,
                body: text.chars().take(300).collect(),
            })
        }
    }

    /// `call`, where any MLflow error is a failure.
    async fn post(&self, path: &str, body: Value) -> Result<Value, TrackingError> {
        match self
            .call(reqwest::Method::POST, path, &[], Some(body))
            .await?
        {
            Ok(v) => Ok(v),
            Err((status, body)) => Err(TrackingError::Refused {
                url: format!("{}/api/2.0/mlflow/{path}", self.base),
                status,
                body: body.to_string(),
            }),
        }
    }

    fn unexpected(&self, path: &str, what: &str) -> TrackingError {
        TrackingError::Unexpected {
            url: format!("{}/api/2.0/mlflow/{path}", self.base),
            what: what.to_string(),
        }
    }

    /// The experiment named `name`, made if there is none.
    async fn experiment(&self, name: &str) -> Result<String, TrackingError> {
        for _ in 0..2 {
            let found = self
                .call(
                    reqwest::Method::GET,
                    "experiments/get-by-name",
                    &[("experiment_name", name)],
                    None,
                )
                .await?;
            if let Ok(v) = found {
                return v["experiment"]["experiment_id"]
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| self.unexpected("experiments/get-by-name", "no experiment_id"));
            }
            let made = self
                .call(
                    reqwest::Method::POST,
                    "experiments/create",
                    &[],
                    Some(json!({ "name": name })),
                )
                .await?;
            match made {
                Ok(v) => {
                    return v["experiment_id"]
                        .as_str()
                        .map(str::to_string)
                        .ok_or_else(|| self.unexpected("experiments/create", "no experiment_id"));
                }
                // Made meanwhile by another writer: read it again.
                Err((_, e)) if e["error_code"] == "RESOURCE_ALREADY_EXISTS" => continue,
                Err((status, body)) => {
                    return Err(TrackingError::Refused {
                        url: format!("{}/api/2.0/mlflow/experiments/create", self.base),
                        status,
                        body: body.to_string(),
                    });
                }
            }
        }
        Err(self.unexpected("experiments/get-by-name", "the experiment vanished"))
    }

    /// The attempt's run: the one a try before made (found by its tag), or a new one.
    async fn run_of(
        &self,
        experiment_id: &str,
        name: &str,
        attempt: AttemptId,
        start: DateTime<Utc>,
        tags: &[(String, String)],
    ) -> Result<String, TrackingError> {
        let found = self
            .post(
                "runs/search",
                json!({
                    "experiment_ids": [experiment_id],
                    "filter": format!("tags.`headroom.attempt` = '{attempt}'"),
                    "max_results": 1,
                }),
            )
            .await?;
        if let Some(id) = found["runs"][0]["info"]["run_id"].as_str() {
            return Ok(id.to_string());
        }
        let made = self
            .post(
                "runs/create",
                json!({
                    "experiment_id": experiment_id,
                    "run_name": name,
                    "start_time": start.timestamp_millis(),
                    "tags": tags.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>(),
                }),
            )
            .await?;
        made["run"]["info"]["run_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| self.unexpected("runs/create", "no run_id"))
    }

    /// Writes the attempt's run whole; its id.
    async fn write(&self, a: &AttemptView, row: &TrackingRow) -> Result<String, TrackingError> {
        let experiment_id = self.experiment(&row.experiment).await?;
        let start = a.started_at.unwrap_or(a.leased_at);
        let name = format!("{}-{}-{}", row.experiment, row.index, a.number);
        let run = self
            .run_of(&experiment_id, &name, a.id, start, &tags(a, row))
            .await?;
        let params = params(a);
        let metrics = metrics(a, &row.series, start);
        let mut first = true;
        let (mut ps, mut ms) = (params.as_slice(), metrics.as_slice());
        while first || !ps.is_empty() || !ms.is_empty() {
            first = false;
            let (p, rest_p) = ps.split_at(ps.len().min(PARAMS_PER_BATCH));
            let (m, rest_m) = ms.split_at(ms.len().min(METRICS_PER_BATCH - p.len()));
            self.post(
                "runs/log-batch",
                json!({ "run_id": run, "params": p, "metrics": m, "tags": [] }),
            )
            .await?;
            (ps, ms) = (rest_p, rest_m);
        }
        let status = match (a.success, a.failure_class) {
            (Some(true), _) => "FINISHED",
            (_, Some(headroom_shared::FailureClass::Pruned)) => "KILLED",
            _ => "FAILED",
        };
        let end = a.ended_at.unwrap_or_else(Utc::now);
        self.post(
            "runs/update",
            json!({ "run_id": run, "status": status, "end_time": end.timestamp_millis() }),
        )
        .await?;
        Ok(run)
    }
}

/// The run's tags: what it is in headroom, and its code.
fn tags(a: &AttemptView, row: &TrackingRow) -> Vec<(String, String)> {
    let mut t = vec![
        ("headroom.experiment".into(), row.experiment.clone()),
        ("headroom.job".into(), a.job.to_string()),
        ("headroom.job_index".into(), row.index.to_string()),
        ("headroom.attempt".into(), a.id.to_string()),
        ("headroom.attempt_number".into(), a.number.to_string()),
        ("headroom.node".into(), a.node.clone()),
    ];
    if let Some(c) = a.failure_class {
        t.push(("headroom.failure_class".into(), c.to_string()));
    }
    if let Some(git) = row.source.as_ref().and_then(|s| s.git.as_ref()) {
        t.push(("mlflow.source.git.commit".into(), git.commit.clone()));
        t.push(("headroom.git_dirty".into(), git.dirty.to_string()));
    }
    t
}

fn params(a: &AttemptView) -> Vec<Value> {
    a.params
        .iter()
        .map(|(k, v)| {
            let text = headroom_shared::expand::value_text(v);
            json!({ "key": k, "value": text.chars().take(PARAM_VALUE_MAX).collect::<String>() })
        })
        .collect()
}

/// The series as MLflow metrics (the step as MLflow's), then headroom's figures at the end.
fn metrics(
    a: &AttemptView,
    series: &std::collections::BTreeMap<String, Vec<Point>>,
    start: DateTime<Utc>,
) -> Vec<Value> {
    let ms = |t: f64| start.timestamp_millis() + (t * 1000.0) as i64;
    let mut out: Vec<Value> = series
        .iter()
        .flat_map(|(k, points)| {
            points.iter().map(move |p| {
                json!({ "key": k, "value": p.value, "step": p.step, "timestamp": ms(p.t) })
            })
        })
        .collect();
    // A final value without a series point (none kept): logged at step 0.
    for (k, v) in &a.metrics {
        if !series.contains_key(k) {
            out.push(json!({ "key": k, "value": v, "step": 0, "timestamp": ms(0.0) }));
        }
    }
    let end = a.ended_at.unwrap_or_else(Utc::now).timestamp_millis();
    let m = &a.measurements;
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    let figures = [
        ("energy_j", m.energy_j),
        (
            "energy_share_j",
            a.sharing.as_ref().and_then(|s| s.energy_share_j),
        ),
        ("mean_power_w", m.mean_power_w),
        ("peak_mem_mib", a.peak_mem_mib.map(|p| p as f64)),
        (
            "duration_s",
            a.started_at
                .zip(a.ended_at)
                .map(|(s, e)| (e - s).num_milliseconds() as f64 / 1000.0),
        ),
        ("clean", Some(flag(crate::export::is_clean(a)))),
        ("shared", Some(flag(a.shared))),
        ("contaminated", a.contaminated.map(flag)),
        ("throttled", Some(flag(m.throttled()))),
    ];
    for (k, v) in figures {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            out.push(
                json!({ "key": format!("headroom.{k}"), "value": v, "step": 0, "timestamp": end }),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_minute() {
        let waits: Vec<u64> = (1..=9).map(|t| backoff(t).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }
}
