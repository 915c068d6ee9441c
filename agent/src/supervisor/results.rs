//! A running attempt's metrics on their way to the coordinator, and `early_stop`'s answer:
//! one report in flight at a time, only the latest waiting behind it (each report holds
//! everything so far, so a skipped one loses nothing).

use headroom_shared::api::MetricsAnswer;
use headroom_shared::results::{AttemptMetrics, RungDecision};
use tokio::task::JoinHandle;

use super::direct::DirectLink;
use super::proto::Spec;

pub(super) struct MetricsLink {
    /// `None`: no line to the coordinator (the end report carries the metrics alone).
    direct: Option<DirectLink>,
    in_flight: Option<JoinHandle<Result<MetricsAnswer, String>>>,
    waiting: Option<AttemptMetrics>,
    /// A report failed and none got through since: said once in the log.
    failing: bool,
}

impl MetricsLink {
    pub(super) fn new(spec: &Spec) -> Self {
        Self {
            direct: spec
                .direct
                .clone()
                .map(|d| DirectLink::new(d, spec.launch.attempt, spec.fence)),
            in_flight: None,
            waiting: None,
            failing: false,
        }
    }

    /// Sends `metrics`, or keeps them for when the report in flight is answered.
    pub(super) fn send(&mut self, metrics: AttemptMetrics) {
        if self.in_flight.is_some() {
            self.waiting = Some(metrics);
            return;
        }
        if let Some(d) = self.direct.as_mut() {
            self.in_flight = Some(tokio::spawn(d.report_metrics(metrics)));
        }
    }

    /// The answer to the report in flight (pending while none is).
    pub(super) async fn answer(&mut self) -> Result<MetricsAnswer, String> {
        match self.in_flight.as_mut() {
            Some(h) => h.await.unwrap_or_else(|e| Err(e.to_string())),
            None => std::future::pending().await,
        }
    }

    /// Takes an answer: the rung that stops the attempt, if any. The next report waiting goes.
    pub(super) fn answered(
        &mut self,
        attempt: headroom_shared::AttemptId,
        answer: Result<MetricsAnswer, String>,
    ) -> Option<RungDecision> {
        self.in_flight = None;
        if let Some(next) = self.waiting.take() {
            self.send(next);
        }
        match answer {
            Ok(a) => {
                self.failing = false;
                a.prune
            }
            Err(e) => {
                if !self.failing {
                    tracing::warn!(%attempt, "cannot report the attempt's metrics: {e}");
                }
                self.failing = true;
                None
            }
        }
    }
}

/// The job log's line for a stop by `early_stop`.
pub(super) fn pruned_note(metric: &str, d: &RungDecision) -> String {
    let cutoff = match d.cutoff {
        Some(c) => format!(
            "behind the cutoff {c} of the {} attempts there",
            d.competitors
        ),
        None => format!(
            "reached by only {} attempts (bootstrap_count)",
            d.competitors
        ),
    };
    format!(
        "early_stop: {metric} was {} at step {} (rung {}), {cutoff}: stopping the job (pruned)",
        d.value, d.step, d.rung
    )
}
