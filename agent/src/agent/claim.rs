//! The agent's `Serving` state: claims leases from the coordinator, admits each against its
//! GPUs' live memory (a lease that no longer fits goes back), and launches the rest.

use headroom_shared::api::{ClaimRequest, ErrorCode, HandBackRequest, Lease};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::agent::attempts::StopReason;
use crate::agent::backoff::Backoff;
use crate::agent::client::ClientError;
use crate::agent::self_fence::SelfFenceBudget;
use crate::agent::{Agent, Session, State, sample};

impl Agent {
    /// The `Serving` state: long-polls the coordinator for leases and cancels, and admits
    /// and launches each lease, while the heartbeats renew the leases of what runs.
    pub(super) async fn serve(&self, mut session: Session, shutdown: &CancellationToken) -> State {
        let heartbeats = CancellationToken::new();
        self.tasks.spawn(crate::agent::heartbeat::run(
            self.shared.clone(),
            session.clone(),
            heartbeats.clone(),
        ));
        let stop_heartbeats = heartbeats.clone().drop_guard();
        let draining = |stop: tokio_util::sync::DropGuard| State::Draining {
            outcome: Ok(()),
            heartbeats: Some(stop.disarm()),
        };
        let mut backoff = Backoff::coordinator();
        loop {
            let samples = sample(&self.shared.backend).await;
            let req = ClaimRequest {
                gpus: samples,
                max: 64,
                watching: self.shared.attempts.watching(),
                known_plan: Some(session.plan.clone()),
                wait_ms: self.shared.cfg.claim_wait.as_millis() as u64,
            };
            // A lease is the coordinator's from when the claim was sent: counted from here, it
            // surely lasts the fence budget.
            let sent = Instant::now();
            let reply = tokio::select! {
                _ = shutdown.cancelled() => return draining(stop_heartbeats),
                r = self.shared.client.claim(session.agent, &req) => r,
            };
            match reply {
                Ok(resp) => {
                    backoff.reset();
                    if resp.plan != session.plan {
                        tracing::info!(plan = %resp.plan, "plan changed");
                        self.shared.metrics.set_plan(&resp.plan);
                        session.plan = resp.plan;
                    }
                    for attempt in resp.cancel {
                        if self.shared.attempts.stop(attempt, StopReason::User) {
                            tracing::info!(%attempt, "cancelling attempt");
                        }
                    }
                    for o in resp.requeue {
                        if self
                            .shared
                            .attempts
                            .stop(o.attempt, StopReason::Requeue(o.why))
                        {
                            tracing::info!(attempt = %o.attempt, why = o.why.as_str(), "stopping the attempt to requeue its job");
                        }
                    }
                    if !resp.leases.is_empty() {
                        self.admit(resp.leases, sent, session.budget).await;
                    }
                }
                Err(ClientError::UnknownAgent(m)) => {
                    tracing::warn!("coordinator forgot this agent ({m}); registering again");
                    return State::Registering {
                        backoff: Backoff::coordinator(),
                    };
                }
                // Busy: no turn at the store came within the claim's wait (the fleet overruns
                // the coordinator), an answer given by design, not a fault; it says how long
                // to leave the coordinator be (`Retry-After`), as any refusal may.
                Err(e) if e.code() == Some(ErrorCode::Busy) => {
                    tracing::debug!("coordinator busy, claiming again after a pause: {e}");
                    if !backoff.wait_at_least(e.retry_after(), shutdown).await {
                        return draining(stop_heartbeats);
                    }
                }
                Err(e) => {
                    tracing::warn!("claim failed, retrying: {e}");
                    if !backoff.wait_at_least(e.retry_after(), shutdown).await {
                        return draining(stop_heartbeats);
                    }
                }
            }
        }
    }

    /// Admission at launch: re-read live memory; a lease that no longer fits goes back.
    /// `leased_until`: when the leases' own time (from the claim) runs out, less the fence
    /// budget; a launch's deadline is never earlier, whatever the last heartbeat said.
    async fn admit(&self, leases: Vec<Lease>, sent: Instant, budget: SelfFenceBudget) {
        let leased_until = budget.deadline(sent);
        let mut samples = sample(&self.shared.backend).await;
        let inventory = self.shared.backend.inventory();
        for lease in leases {
            // A GPU that cannot be read is never admitted to, whatever the estimate.
            // A run with memory phases needs room now for what it starts with: the
            // coordinator placed its later peak apart from its neighbours'.
            let needs_now = lease.starts_with_mib.or(lease.estimate_mib);
            let refusal = crate::gpu::unreadable(&samples, &lease.gpus).or_else(|| {
                let est = needs_now?;
                lease.gpus.iter().find_map(|g| {
                    let total = inventory.iter().find(|i| i.index == *g)?.total_mib;
                    let free = samples.iter().find(|s| s.index == *g)?.free_mib;
                    let usable = free.saturating_sub(self.shared.cfg.headroom.mib_of(total));
                    (usable < est).then(|| {
                        format!(
                            "GPU {g} has {usable} MiB free beyond headroom, the job needs {est} MiB"
                        )
                    })
                })
            });
            if let Some(reason) = refusal {
                tracing::info!(attempt = %lease.attempt, "handing lease back: {reason}");
                let req = HandBackRequest {
                    fence: lease.fence,
                    reason,
                    gpus: samples.clone(),
                };
                if let Err(e) = self.shared.client.hand_back(lease.attempt, &req).await {
                    tracing::warn!(attempt = %lease.attempt, "hand back failed (the lease will expire): {e}");
                }
                continue;
            }
            if let Some(est) = needs_now {
                // Later leases of this batch must not count on memory this one will take.
                for s in samples.iter_mut().filter(|s| lease.gpus.contains(&s.index)) {
                    s.free_mib = s.free_mib.saturating_sub(est);
                }
            }
            let baseline = crate::supervisor::attempt::Baseline::of(&samples, &lease.gpus);
            self.launch(lease, baseline, leased_until, budget);
        }
    }

    /// Hands an admitted lease to its own task (see [`crate::agent::lease`]).
    fn launch(
        &self,
        lease: Lease,
        baseline: crate::supervisor::attempt::Baseline,
        leased_until: Instant,
        budget: SelfFenceBudget,
    ) {
        let stop = self
            .shared
            .attempts
            .begin(lease.attempt, lease.fence, &self.stopping);
        tracing::info!(attempt = %lease.attempt, job = %lease.job, gpus = ?lease.gpus, "launching");
        self.shared
            .metrics
            .attempt_started(lease.attempt, &lease.gpus);
        self.attempt_tasks.spawn(crate::agent::lease::run(
            self.shared.clone(),
            lease,
            baseline,
            leased_until,
            budget,
            stop,
            self.exit.clone(),
        ));
    }
}
