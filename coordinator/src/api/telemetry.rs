//! GPU telemetry series (per GPU, per attempt), the heartbeat's telemetry checks, and the
//! Prometheus page.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use headroom_shared::AttemptId;
use headroom_shared::api::{
    AttemptTelemetry, AttemptTelemetryQuery, GpuSeries, Measurements, Role, TelemetryQuery,
    TelemetrySample,
};

use super::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, AppState, parse_id};
use crate::store::SeriesWindow;

/// Samples per GPU when the request names no limit.
pub const DEFAULT_SAMPLES: u32 = 10_000;
/// Most samples one heartbeat may carry (agents send at most 2,000; this many stays well
/// under axum's 2 MB default body limit).
pub const MAX_PER_HEARTBEAT: usize = 5_000;

fn limit_of(limit: Option<u32>) -> Result<u32, ApiError> {
    match limit {
        None => Ok(DEFAULT_SAMPLES),
        Some(n) => headroom_shared::api::bounds::SAMPLES
            .check(n.into())
            .map(|()| n)
            .map_err(|m| ApiError::invalid("limit", m)),
    }
}

pub async fn gpu(
    State(s): State<AppState>,
    ApiPath((name, gpu)): ApiPath<(String, u32)>,
    ApiQuery(q): ApiQuery<TelemetryQuery>,
) -> ApiResult<GpuSeries> {
    let until = q.until.unwrap_or_else(Utc::now);
    let since = q
        .since
        .unwrap_or_else(|| until - chrono::Duration::hours(1));
    if since > until {
        return Err(ApiError::invalid("since", "`since` is after `until`"));
    }
    let window = SeriesWindow {
        since: since.timestamp_millis(),
        until: until.timestamp_millis(),
        limit: limit_of(q.limit)?,
    };
    let samples = s.store.telemetry_of_gpu(&name, gpu, window).await?;
    Ok(ApiJson(GpuSeries {
        node: name,
        gpu,
        samples,
    }))
}

pub async fn attempt(
    State(s): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<AttemptTelemetryQuery>,
) -> ApiResult<AttemptTelemetry> {
    let attempt: AttemptId = parse_id(&id, "attempt")?;
    Ok(ApiJson(
        s.store
            .telemetry_of_attempt(attempt, limit_of(q.limit)?)
            .await?,
    ))
}

/// A heartbeat's telemetry must be figures a GPU can give: checked whole before anything of
/// the heartbeat is written, each refusal naming the sample and field.
pub(super) fn check_telemetry(samples: &[TelemetrySample]) -> Result<(), ApiError> {
    if samples.len() > MAX_PER_HEARTBEAT {
        return Err(ApiError::invalid(
            "telemetry",
            format!(
                "{} samples in one heartbeat; at most {MAX_PER_HEARTBEAT}",
                samples.len()
            ),
        ));
    }
    for (i, t) in samples.iter().enumerate() {
        let field = |name: &str| format!("telemetry[{i}].{name}");
        let figure = |name: &str, v: Option<f64>, lo: f64, hi: f64| match v {
            Some(x) if !x.is_finite() || x < lo || x > hi => Err(ApiError::invalid(
                field(name),
                format!("{x} is not a possible reading ({lo} to {hi})"),
            )),
            _ => Ok(()),
        };
        figure("power_w", t.power_w, 0.0, 100_000.0)?;
        // Millijoules since driver load fit an i64 many times over below this.
        figure("energy_j", t.energy_j, 0.0, 1e15)?;
        figure("temperature_c", t.temperature_c, -273.15, 1000.0)?;
        if let Some(u) = t.utilization_pct.filter(|&u| u > 100) {
            return Err(ApiError::invalid(
                field("utilization_pct"),
                format!("{u} is above 100"),
            ));
        }
        if let (Some(used), Some(total)) = (t.used_mib, t.total_mib)
            && used > total
        {
            return Err(ApiError::invalid(
                field("used_mib"),
                format!("{used} MiB used of a {total} MiB GPU"),
            ));
        }
        // Stored as i64 milliseconds and MiB.
        for (name, v) in [
            ("used_mib", t.used_mib),
            ("free_mib", t.free_mib),
            ("total_mib", t.total_mib),
        ] {
            if v.is_some_and(|v| v > i64::MAX as u64) {
                return Err(ApiError::invalid(field(name), "too large"));
            }
        }
        if samples[..i].iter().any(|o| o.gpu == t.gpu && o.at == t.at) {
            return Err(ApiError::invalid(
                field("at"),
                format!("GPU {} has two samples at {}", t.gpu, t.at),
            ));
        }
    }
    Ok(())
}

/// An end report's measurements must be figures GPUs can give (they are stored in
/// milli-units as i64): a refusal names the field.
pub(super) fn check_measurements(m: &Measurements) -> Result<(), ApiError> {
    for f in headroom_shared::api::FIGURES {
        let (name, lo, hi) = (f.name, f.min, f.max);
        if let Some(x) = (f.get)(m).filter(|x| !x.is_finite() || *x < lo || *x > hi) {
            return Err(ApiError::invalid(
                name,
                format!("{x} is not a possible figure ({lo} to {hi})"),
            ));
        }
    }
    if let Some(p) = &m.memory_profile {
        let shares = p.peak_from.is_finite()
            && p.peak_until.is_finite()
            && 0.0 <= p.peak_from
            && p.peak_from < p.peak_until
            && p.peak_until <= 1.0;
        if !shares || p.steady_mib == 0 || p.expected_ms == 0 {
            return Err(ApiError::invalid(
                "memory_profile",
                format!(
                    "not a run's shape: steady {} MiB, peak [{}, {}] of {} ms (a steady use \
                     and length above 0, 0 <= from < until <= 1)",
                    p.steady_mib, p.peak_from, p.peak_until, p.expected_ms
                ),
            ));
        }
    }
    Ok(())
}

/// `GET /metrics`: the Prometheus page.
/// `/metrics`, public: counts and GPU gauges for any scraper; the jobs per submitter, which
/// name users, only for a scrape with a user's or an admin's token (a wrong one is counted
/// as any wrong token is, and shows the public page).
pub async fn metrics(
    State(s): State<AppState>,
    client: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let alive = s.config.lease_ttl.as_millis() as u64;
    let users = match headers.get(header::AUTHORIZATION) {
        None => !s.auth.enabled(),
        Some(h) => s
            .auth
            .identify(h.to_str().ok(), client.map(|c| c.0.0.ip()))
            .await
            .is_ok_and(|who| matches!(who.role, Role::User | Role::Admin)),
    };
    let half_life = s.config.half_life.as_millis() as u64;
    s.metrics
        .set_claim_turns(s.admission.claiming(), s.admission.waiting());
    match s
        .metrics
        .render(s.store.as_ref(), alive, users, half_life)
        .await
    {
        Ok(page) => ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], page).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(gpu: u32) -> TelemetrySample {
        TelemetrySample {
            gpu,
            at: Utc::now(),
            power_w: Some(250.0),
            energy_j: Some(1e6),
            temperature_c: Some(60.0),
            utilization_pct: Some(90),
            used_mib: Some(10),
            total_mib: Some(100),
            ..TelemetrySample::default()
        }
    }

    fn refusal(samples: &[TelemetrySample]) -> Option<String> {
        check_telemetry(samples)
            .err()
            .map(|e| e.field.unwrap_or_default())
    }

    #[test]
    fn impossible_attempt_measurements_are_refused_naming_the_field() {
        let ok = Measurements {
            energy_j: Some(5e5),
            mean_power_w: Some(250.0),
            max_temp_c: Some(70.0),
            mean_util_pct: Some(100.0),
            ..Measurements::default()
        };
        assert!(check_measurements(&ok).is_ok());
        assert!(check_measurements(&Measurements::default()).is_ok());
        let field = |m: Measurements| check_measurements(&m).err().and_then(|e| e.field);
        assert_eq!(
            field(Measurements {
                energy_j: Some(-1.0),
                ..ok.clone()
            })
            .as_deref(),
            Some("energy_j")
        );
        assert_eq!(
            field(Measurements {
                mean_util_pct: Some(100.5),
                ..ok.clone()
            })
            .as_deref(),
            Some("mean_util_pct")
        );
        assert_eq!(
            field(Measurements {
                max_power_w: Some(f64::INFINITY),
                ..ok.clone()
            })
            .as_deref(),
            Some("max_power_w")
        );
        let shape = |from: f64, until: f64, steady: u64| Measurements {
            memory_profile: Some(headroom_shared::phases::Phases {
                steady_mib: steady,
                peak_from: from,
                peak_until: until,
                expected_ms: 60_000,
                margin_permille: headroom_shared::phases::DECLARED_MARGIN_PERMILLE,
            }),
            ..ok.clone()
        };
        assert!(check_measurements(&shape(0.9, 1.0, 2000)).is_ok());
        for bad in [
            shape(0.9, 0.9, 2000),
            shape(-0.1, 0.5, 2000),
            shape(0.5, 1.5, 2000),
            shape(f64::NAN, 1.0, 2000),
            shape(0.9, 1.0, 0),
        ] {
            assert_eq!(field(bad).as_deref(), Some("memory_profile"));
        }
    }

    #[test]
    fn impossible_readings_are_refused_naming_the_field() {
        assert_eq!(refusal(&[sample(0), sample(1)]), None);
        let bad = |f: fn(&mut TelemetrySample)| {
            let mut s = vec![sample(0), sample(1)];
            f(&mut s[1]);
            refusal(&s)
        };
        assert_eq!(
            bad(|s| s.power_w = Some(-1.0)).as_deref(),
            Some("telemetry[1].power_w")
        );
        assert_eq!(
            bad(|s| s.power_w = Some(f64::NAN)).as_deref(),
            Some("telemetry[1].power_w")
        );
        assert_eq!(
            bad(|s| s.energy_j = Some(f64::INFINITY)).as_deref(),
            Some("telemetry[1].energy_j")
        );
        assert_eq!(
            bad(|s| s.temperature_c = Some(-300.0)).as_deref(),
            Some("telemetry[1].temperature_c")
        );
        assert_eq!(
            bad(|s| s.utilization_pct = Some(101)).as_deref(),
            Some("telemetry[1].utilization_pct")
        );
        assert_eq!(
            bad(|s| s.used_mib = Some(101)).as_deref(),
            Some("telemetry[1].used_mib")
        );
        // Absent readings are fine: a GPU without them.
        assert_eq!(
            bad(|s| {
                s.power_w = None;
                s.energy_j = None;
                s.temperature_c = None;
            }),
            None
        );
        let mut twice = vec![sample(0)];
        twice.push(twice[0].clone());
        assert_eq!(refusal(&twice).as_deref(), Some("telemetry[1].at"));
    }
}
