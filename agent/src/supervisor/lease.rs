//! The lease as an attempt's supervisor holds it while the attempt runs: its self-fence
//! (pushed by the agent's renewals, or by its own through the coordinator while the agent is
//! away), and the one stop it asks of the attempt, with why. Its one owner of that state.

use std::time::Duration;

use headroom_shared::AttemptId;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::direct::{DirectLink, Renewal};
use super::proto::{Spec, StopReason};
use super::self_fence::SelfFence;

/// The lease while its attempt runs.
pub(super) struct HeldLease {
    attempt: AttemptId,
    fence: SelfFence,
    /// Fired once, at the first stop (a requeue's, after its checkpoint lead).
    cancel: CancellationToken,
    /// Fired at a requeueing stop of a started job with a checkpoint signal: the attempt
    /// signals it, and stops it `lead` later.
    checkpoint: CancellationToken,
    /// The job has a checkpoint signal, and it has started.
    checkpoints: bool,
    started: bool,
    /// Why the job was stopped: the first stop asked wins.
    reason: Option<StopReason>,
    /// The line to the coordinator for while the agent is away.
    direct: Option<DirectLink>,
    /// When our own next renewal is due; none while one is on its way.
    renew_due: Option<Instant>,
    renewing: Option<JoinHandle<Renewal>>,
    /// We renewed the lease ourselves since the agent last did: the agent is not renewing
    /// it, and may not report the end either.
    renewed_itself: bool,
}

/// Who hears of the end besides the journal.
pub(super) struct Reporter {
    pub(super) direct: Option<DirectLink>,
    /// The agent did not renew the lease lately, or is not attached.
    pub(super) away: bool,
    pub(super) give_up_at: Instant,
}

impl HeldLease {
    /// The lease of `spec`'s launch; `cancel` stops its attempt, `checkpoint` stops it after
    /// its checkpoint signal and lead.
    pub(super) fn new(
        spec: &Spec,
        cancel: CancellationToken,
        checkpoint: CancellationToken,
    ) -> Self {
        let attempt = spec.launch.attempt;
        let fence = SelfFence::new(super::proto::left_of(spec.stop_in_ms, spec.measured_at));
        let direct = spec
            .direct
            .clone()
            .map(|d| DirectLink::new(d, attempt, spec.fence));
        let renew_due = direct.as_ref().map(|d| d.due(fence.deadline()));
        Self {
            attempt,
            fence,
            cancel,
            checkpoints: spec.launch.restart.checkpoint.is_some(),
            checkpoint,
            started: false,
            reason: None,
            direct,
            renew_due,
            renewing: None,
            renewed_itself: false,
        }
    }

    /// Stops the attempt for `reason` (the first reason stays): a requeue of a started job
    /// with a checkpoint signal after its signal and lead, any other at once.
    pub(super) fn stop(&mut self, reason: StopReason) {
        let first = self.reason.is_none();
        self.reason.get_or_insert(reason);
        match reason {
            StopReason::Requeue(_) if first && self.checkpoints && self.started => {
                self.checkpoint.cancel();
            }
            // A second requeue leaves the first's lead as it is.
            StopReason::Requeue(_) if !first => {}
            _ => self.cancel.cancel(),
        }
    }

    /// Its job has started: a requeue now gives it its checkpoint signal first.
    pub(super) fn job_started(&mut self) {
        self.started = true;
    }

    /// Whether the job is being stopped.
    pub(super) fn stopping(&self) -> bool {
        self.reason.is_some()
    }

    /// Whether the job is past any grace: the lease no longer needs keeping (a job within
    /// its checkpoint lead still runs, and is fenced and renewed as any running job).
    fn stopped(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The agent renewed the lease: the fence falls `stop_in` from now, and the end is the
    /// agent's to report.
    pub(super) fn renewed_by_agent(&mut self, stop_in: Duration) {
        self.fence.renew(stop_in);
        self.renewed_itself = false;
        if let Some(d) = &self.direct
            && self.renewing.is_none()
        {
            self.renew_due = Some(d.due(self.fence.deadline()));
        }
    }

    /// When our own renewal is due: never once the job is stopped or while one is on its way.
    pub(super) fn renewal_due(&self) -> Option<Instant> {
        if self.stopped() || self.renewing.is_some() {
            return None;
        }
        self.renew_due
    }

    /// Sends our own renewal, aside.
    pub(super) fn renew(&mut self) {
        self.renew_due = None;
        if let Some(d) = self.direct.as_mut() {
            self.renewing = Some(tokio::spawn(d.renew(self.fence.deadline())));
        }
    }

    /// The answer of the renewal on its way; pending while none is.
    pub(super) async fn answer(&mut self) -> Renewal {
        match self.renewing.as_mut() {
            Some(h) => h
                .await
                .unwrap_or_else(|e| Renewal::Failed(format!("renewal task: {e}"))),
            None => std::future::pending().await,
        }
    }

    /// Takes our own renewal's answer: the fence moves, or the job stops, or we retry.
    pub(super) fn answered(&mut self, renewal: Renewal) {
        let attempt = self.attempt;
        self.renewing = None;
        match renewal {
            Renewal::Renewed {
                until,
                cancel,
                requeue,
            } => {
                self.fence.extend_to(until);
                self.renewed_itself = true;
                self.renew_due = self.direct.as_ref().map(|d| d.due(self.fence.deadline()));
                if let Some(why) = requeue {
                    self.stop(StopReason::Requeue(why));
                } else if cancel && !self.stopped() {
                    self.stop(StopReason::User);
                }
            }
            Renewal::Gone(why) => {
                tracing::warn!(%attempt, "the lease is no longer this attempt's ({why}): stopping the job");
                self.stop(StopReason::LeaseLost);
            }
            Renewal::Failed(why) => {
                tracing::warn!(%attempt, "cannot renew the lease itself, retrying: {why}");
                self.renew_due = self.direct.as_ref().map(|d| Instant::now() + d.retry());
            }
        }
    }

    /// When the fence falls; never once the job is stopped (within its checkpoint lead it
    /// still runs, and a fallen fence stops it then).
    pub(super) fn fence_due(&self) -> Option<Instant> {
        (!self.stopped()).then(|| self.fence.deadline())
    }

    /// The fence fell with no renewal: the job stops before the coordinator may give it away.
    pub(super) fn fence_fell(&mut self) {
        tracing::warn!(attempt = %self.attempt, "lease not renewed in time: stopping the job");
        self.stop(StopReason::LeaseLost);
    }

    /// Once the attempt ended: why it was stopped, and who reports its end.
    pub(super) fn end(self) -> (Option<StopReason>, Reporter) {
        if let Some(r) = self.renewing {
            r.abort();
        }
        // Past the fence and one more budget, the coordinator has long given the lease up.
        let give_up_at = self.fence.deadline()
            + self
                .direct
                .as_ref()
                .map_or(Duration::ZERO, DirectLink::fence_after);
        let reporter = Reporter {
            direct: self.direct,
            // The agent is away, or was not renewing: the end goes to the coordinator directly.
            away: self.renewed_itself,
            give_up_at,
        };
        (self.reason, reporter)
    }
}

/// Resolves at `when`; never when `None`.
pub(super) async fn at(when: Option<Instant>) {
    match when {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
