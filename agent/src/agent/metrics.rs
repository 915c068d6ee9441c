//! The agent's Prometheus metrics (`GET /metrics` on `--metrics-addr`): per GPU the last
//! telemetry reading, slots and quarantine; attempts by outcome and cleanup durations.
//! A reading the GPU could not give is left out of the page, never written as 0. The same
//! address answers probes: `GET /livez` (the agent serves) and `GET /readyz` (its
//! coordinator answered its heartbeat and its GPUs read, lately).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use headroom_shared::api::{FinishReport, GpuInfo, GpuSample};
use headroom_shared::{AttemptId, Plan};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use tokio_util::sync::CancellationToken;

use crate::agent::attempts::Attempts;
use crate::agent::telemetry::Telemetry;

/// The content type of the text exposition this page is written in.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A GPU's labels. `UUID` and `modelName` are the DCGM exporter's names for them, so that
/// these series join with its own (`on (UUID)`).
#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    node: String,
    gpu: String,
    UUID: String,
    modelName: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// Plan slots and the GPUs of running attempts, as this agent knows them.
#[derive(Debug, Default)]
struct Slots {
    plan: Option<Plan>,
    running: HashMap<AttemptId, Vec<u32>>,
}

/// How recent an answered heartbeat and a reading of every GPU must be for `/readyz`.
pub const READY_WITHIN: Duration = Duration::from_secs(60);

/// What `/readyz` tells from.
#[derive(Debug, Default)]
struct Probe {
    /// The coordinator last answered a heartbeat.
    answered: Option<Instant>,
    /// Every GPU last read without error, or why one could not be.
    gpus: Option<(Instant, Result<(), String>)>,
}

impl Probe {
    /// `Ok` when ready; else why not.
    fn ready(&self, now: Instant) -> Result<(), String> {
        let recent = |t: Instant| now.saturating_duration_since(t) <= READY_WITHIN;
        match self.answered {
            Some(t) if recent(t) => {}
            Some(_) => return Err("no heartbeat answered by the coordinator lately".into()),
            None => return Err("not registered with the coordinator yet".into()),
        }
        match &self.gpus {
            Some((t, Ok(()))) if recent(*t) => Ok(()),
            Some((t, Err(e))) if recent(*t) => Err(format!("GPUs cannot be read: {e}")),
            _ => Err("no reading of the GPUs lately".into()),
        }
    }
}

/// Per-GPU figures, read at each scrape.
struct GpuCollector {
    node: String,
    gpus: Vec<GpuInfo>,
    telemetry: Telemetry,
    attempts: Attempts,
    slots: Arc<Mutex<Slots>>,
    /// Each GPU's memory no listed process held at the last reading, where it could be told.
    unattributed: Arc<Mutex<HashMap<u32, u64>>>,
}

impl std::fmt::Debug for GpuCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCollector")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// One gauge family, one value per GPU that has it.
fn gauge_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    values: &[(GpuLabels, f64)],
) -> Result<(), std::fmt::Error> {
    if values.is_empty() {
        return Ok(());
    }
    let gauge = ConstGauge::new(0.0f64);
    let mut family = encoder.encode_descriptor(name, help, unit, gauge.metric_type())?;
    for (labels, v) in values {
        ConstGauge::new(*v).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for GpuCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let labels = |gpu: u32| {
            let info = self.gpus.iter().find(|g| g.index == gpu);
            GpuLabels {
                node: self.node.clone(),
                gpu: gpu.to_string(),
                UUID: info.map(|g| g.uuid.clone()).unwrap_or_default(),
                modelName: info.map(|g| g.name.clone()).unwrap_or_default(),
            }
        };
        let latest = self.telemetry.latest();
        let pick = |f: &dyn Fn(&headroom_shared::api::TelemetrySample) -> Option<f64>| {
            latest
                .iter()
                .filter_map(|s| f(s).map(|v| (labels(s.gpu), v)))
                .collect::<Vec<_>>()
        };
        const MIB: f64 = 1024.0 * 1024.0;
        let bytes = Unit::Bytes;
        gauge_family(
            &mut encoder,
            "headroom_gpu_memory_used",
            "GPU memory in use",
            Some(&bytes),
            &pick(&|s| s.used_mib.map(|m| m as f64 * MIB)),
        )?;
        gauge_family(
            &mut encoder,
            "headroom_gpu_memory_total",
            "GPU memory in all",
            Some(&bytes),
            &pick(&|s| s.total_mib.map(|m| m as f64 * MIB)),
        )?;
        gauge_family(
            &mut encoder,
            "headroom_gpu_utilization",
            "GPU utilization over the driver's last sample period (0 to 1)",
            Some(&Unit::Other("ratio".into())),
            &pick(&|s| s.utilization_pct.map(|u| f64::from(u) / 100.0)),
        )?;
        gauge_family(
            &mut encoder,
            "headroom_gpu_power",
            "GPU board power draw",
            Some(&Unit::Other("watts".into())),
            &pick(&|s| s.power_w),
        )?;
        gauge_family(
            &mut encoder,
            "headroom_gpu_temperature",
            "GPU temperature",
            Some(&Unit::Celsius),
            &pick(&|s| s.temperature_c),
        )?;
        gauge_family(
            &mut encoder,
            "headroom_gpu_sm_clock",
            "GPU SM clock",
            Some(&Unit::Other("hertz".into())),
            &pick(&|s| s.sm_clock_mhz.map(|m| f64::from(m) * 1e6)),
        )?;
        // The driver's total-energy counter: monotonic, so a counter (rate() gives watts).
        let energy: Vec<(GpuLabels, f64)> = pick(&|s| s.energy_j);
        if !energy.is_empty() {
            let c = ConstCounter::new(0.0f64);
            let mut family = encoder.encode_descriptor(
                "headroom_gpu_energy",
                "GPU total-energy counter (NVML: since the driver loaded)",
                Some(&Unit::Joules),
                c.metric_type(),
            )?;
            for (l, v) in &energy {
                ConstCounter::new(*v).encode(family.encode_family(l)?)?;
            }
        }
        let (plan, used) = {
            let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            let mut used: HashMap<u32, f64> = HashMap::new();
            for g in slots.running.values().flatten() {
                *used.entry(*g).or_default() += 1.0;
            }
            (slots.plan.clone(), used)
        };
        let quarantined: Vec<u32> = self
            .attempts
            .quarantined()
            .into_iter()
            .flat_map(|(_, q)| q.gpus)
            .collect();
        let per_gpu = |f: &dyn Fn(usize, u32) -> Option<f64>| {
            self.gpus
                .iter()
                .enumerate()
                .filter_map(|(i, g)| f(i, g.index).map(|v| (labels(g.index), v)))
                .collect::<Vec<_>>()
        };
        let unattributed = self
            .unattributed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        gauge_family(
            &mut encoder,
            "headroom_gpu_memory_unattributed",
            "GPU memory in use that no listed process holds (ghost memory; absent where it \
             cannot be told)",
            Some(&bytes),
            &per_gpu(&|_, g| unattributed.get(&g).map(|&m| m as f64 * MIB)),
        )?;
        gauge_family(
            &mut encoder,
            "headroom_gpu_slots",
            "Plan slots of the GPU",
            None,
            &per_gpu(&|i, _| plan.as_ref().map(|p| f64::from(p.slots(i)))),
        )?;
        gauge_family(
            &mut encoder,
            "headroom_gpu_slots_used",
            "Attempts running on the GPU",
            None,
            &per_gpu(&|_, g| Some(used.get(&g).copied().unwrap_or(0.0))),
        )?;
        gauge_family(
            &mut encoder,
            "headroom_gpu_quarantined",
            "1 while the GPU is quarantined (an attempt's cleanup not verified)",
            None,
            &per_gpu(&|_, g| Some(if quarantined.contains(&g) { 1.0 } else { 0.0 })),
        )?;
        let dropped = ConstCounter::new(self.telemetry.dropped());
        let enc = encoder.encode_descriptor(
            "headroom_telemetry_samples_dropped",
            "Telemetry samples dropped because the coordinator could not be reached",
            None,
            dropped.metric_type(),
        )?;
        dropped.encode(enc)?;
        Ok(())
    }
}

/// The agent's metrics; cheap to clone.
#[derive(Clone, Debug)]
pub struct AgentMetrics {
    registry: Arc<Registry>,
    probe: Arc<Mutex<Probe>>,
    slots: Arc<Mutex<Slots>>,
    attempts: Family<OutcomeLabels, Counter>,
    cleanup: Histogram,
    round_trips: Histogram,
    unattributed: Arc<Mutex<HashMap<u32, u64>>>,
}

impl AgentMetrics {
    pub fn new(node: &str, gpus: Vec<GpuInfo>, telemetry: Telemetry, attempts: Attempts) -> Self {
        let mut registry = Registry::default();
        let slots = Arc::new(Mutex::new(Slots::default()));
        let outcomes = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "headroom_attempts",
            "Attempts ended on this agent, by outcome (`succeeded` or the failure class)",
            outcomes.clone(),
        );
        // Cleanup is SIGTERM, grace (10 s by default), SIGKILL, sweep and verification.
        let cleanup = Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0]);
        registry.register_with_unit(
            "headroom_cleanup_duration",
            "Time from an attempt's end to its verified cleanup",
            Unit::Seconds,
            cleanup.clone(),
        );
        // Up to the fence's slack at the default TTL (7 s) and beyond: at a short TTL a
        // quarter of a second already counts.
        let round_trips = Histogram::new([
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ]);
        registry.register_with_unit(
            "headroom_heartbeat_round_trip",
            "Time from a heartbeat's sending to the coordinator's answer, for answered ones",
            Unit::Seconds,
            round_trips.clone(),
        );
        let unattributed = Arc::new(Mutex::new(HashMap::new()));
        registry.register_collector(Box::new(GpuCollector {
            node: node.to_string(),
            gpus,
            telemetry,
            attempts,
            slots: slots.clone(),
            unattributed: unattributed.clone(),
        }));
        Self {
            registry: Arc::new(registry),
            probe: Arc::default(),
            slots,
            attempts: outcomes,
            cleanup,
            round_trips,
            unattributed,
        }
    }

    /// The coordinator answered a heartbeat `round_trip` after it was sent.
    pub fn heartbeat_answered(&self, round_trip: Duration) {
        self.round_trips.observe(round_trip.as_secs_f64());
        self.probe().answered = Some(Instant::now());
    }

    fn probe(&self) -> std::sync::MutexGuard<'_, Probe> {
        self.probe.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `Ok` when the agent is ready for work; else why not.
    pub fn ready(&self) -> Result<(), String> {
        self.probe().ready(Instant::now())
    }

    /// The node's GPUs as the agent last read them (what the heartbeat sends).
    pub fn gpu_samples(&self, samples: &[GpuSample]) {
        let errors = crate::gpu::unreadable(
            samples,
            &samples.iter().map(|s| s.index).collect::<Vec<_>>(),
        );
        self.probe().gpus = Some((
            Instant::now(),
            match (errors, samples.is_empty()) {
                (Some(e), _) => Err(e),
                (None, true) => Err("no GPU reading".into()),
                (None, false) => Ok(()),
            },
        ));
        let mut u = self
            .unattributed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for s in samples {
            match s.unattributed_mib() {
                Some(mib) => u.insert(s.index, mib),
                None => u.remove(&s.index),
            };
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The node's plan as the coordinator last said it.
    pub fn set_plan(&self, plan: &str) {
        self.slots().plan = Plan::parse(plan).ok();
    }

    pub fn attempt_started(&self, attempt: AttemptId, gpus: &[u32]) {
        self.slots().running.insert(attempt, gpus.to_vec());
    }

    /// An attempt ended with `report`: its slots free, its outcome and cleanup count.
    pub fn attempt_ended(&self, attempt: AttemptId, report: &FinishReport) {
        self.slots().running.remove(&attempt);
        let outcome = report.failure.map_or("succeeded", |f| f.as_str());
        self.attempts
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
        self.cleanup.observe(report.cleanup_ms as f64 / 1000.0);
    }

    /// The page, in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("cannot encode metrics: {e}");
        }
        out
    }

    /// Serves `GET /metrics` on `listener` until `stop`.
    pub async fn serve(self, listener: std::net::TcpListener, stop: CancellationToken) {
        let addr: Option<SocketAddr> = listener.local_addr().ok();
        let listener = match listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
        {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(?addr, "metrics listener: {e}");
                return;
            }
        };
        let ready = self.clone();
        let app = axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let page = self.render();
                    async move { ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], page) }
                }),
            )
            .route("/livez", axum::routing::get(|| async { "ok\n" }))
            .route(
                "/readyz",
                axum::routing::get(move || {
                    let answer = match ready.ready() {
                        Ok(()) => (axum::http::StatusCode::OK, "ready\n".to_string()),
                        Err(why) => (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: {why}\n"),
                        ),
                    };
                    async move { answer }
                }),
            );
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::warn!(?addr, "metrics listener stopped: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_shared::api::TelemetrySample;
    use std::time::Duration;

    #[test]
    fn ready_once_heartbeats_are_answered_and_gpus_read_lately() {
        let t0 = Instant::now();
        let later = |s: u64| t0 + Duration::from_secs(s);
        let mut p = Probe::default();
        assert!(p.ready(t0).is_err_and(|e| e.contains("not registered")));
        p.answered = Some(t0);
        assert!(
            p.ready(t0)
                .is_err_and(|e| e.contains("no reading of the GPUs"))
        );
        p.gpus = Some((t0, Err("GPU 1 could not be read: lost".into())));
        assert!(p.ready(t0).is_err_and(|e| e.contains("GPU 1")));
        p.gpus = Some((t0, Ok(())));
        assert_eq!(p.ready(t0), Ok(()));
        // Nothing new for longer than READY_WITHIN: not ready any more.
        let stale = later(READY_WITHIN.as_secs() + 1);
        assert!(
            p.ready(stale)
                .is_err_and(|e| e.contains("no heartbeat answered"))
        );
        p.answered = Some(stale);
        assert!(
            p.ready(stale)
                .is_err_and(|e| e.contains("no reading of the GPUs"))
        );
    }

    #[test]
    fn readings_a_gpu_lacks_are_left_out_never_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        let telemetry = Telemetry::new(Duration::from_secs(1), 10);
        let attempts = Attempts::load(dir.path()).expect("attempts");
        let gpu = |index: u32| GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: "H100".into(),
            total_mib: 2048,
        };
        let m = AgentMetrics::new("n", vec![gpu(0), gpu(1)], telemetry.clone(), attempts);
        m.set_plan("2,1");
        let at = chrono::Utc::now();
        telemetry.push(vec![
            TelemetrySample {
                gpu: 0,
                at,
                used_mib: Some(1024),
                total_mib: Some(2048),
                power_w: Some(150.5),
                energy_j: Some(10.0),
                utilization_pct: Some(50),
                ..TelemetrySample::default()
            },
            TelemetrySample {
                gpu: 1,
                at,
                error: Some("NVML memory info: Unknown Error".into()),
                ..TelemetrySample::default()
            },
        ]);
        let attempt = AttemptId::new();
        m.attempt_started(attempt, &[0]);
        let page = m.render();
        let has = |line: &str| page.lines().any(|l| l == line);
        assert!(
            has(
                r#"headroom_gpu_memory_used_bytes{node="n",gpu="0",UUID="GPU-0",modelName="H100"} 1073741824.0"#
            ),
            "{page}"
        );
        assert!(
            has(
                r#"headroom_gpu_power_watts{node="n",gpu="0",UUID="GPU-0",modelName="H100"} 150.5"#
            ),
            "{page}"
        );
        assert!(
            has(
                r#"headroom_gpu_utilization_ratio{node="n",gpu="0",UUID="GPU-0",modelName="H100"} 0.5"#
            ),
            "{page}"
        );
        assert!(
            has(r#"headroom_gpu_slots{node="n",gpu="0",UUID="GPU-0",modelName="H100"} 2.0"#),
            "{page}"
        );
        assert!(
            has(r#"headroom_gpu_slots_used{node="n",gpu="0",UUID="GPU-0",modelName="H100"} 1.0"#),
            "{page}"
        );
        // GPU 1 could not be read: no figure of it at all, rather than zeros.
        for family in [
            "headroom_gpu_power_watts",
            "headroom_gpu_memory_used_bytes",
            "headroom_gpu_energy_joules_total",
        ] {
            assert!(
                !page
                    .lines()
                    .any(|l| l.starts_with(&format!("{family}{{")) && l.contains(r#"gpu="1""#)),
                "{page}"
            );
        }
        let report: FinishReport = serde_json::from_value(serde_json::json!({
            "fence": 1, "failure": "oom", "exit_code": 1, "signal": null,
            "ended_at": at, "peak_mem_mib": null, "cleanup_ms": 2500,
            "cleanup_verified": true, "log_tail": "", "gpus": [],
        }))
        .expect("report");
        m.attempt_ended(attempt, &report);
        let page = m.render();
        assert!(
            page.contains(r#"headroom_attempts_total{outcome="oom"} 1"#),
            "{page}"
        );
        assert!(
            page.contains("headroom_cleanup_duration_seconds_sum 2.5"),
            "{page}"
        );
        assert!(
            page.contains(
                r#"headroom_gpu_slots_used{node="n",gpu="0",UUID="GPU-0",modelName="H100"} 0.0"#
            ),
            "{page}"
        );
    }
}
