//! The agent's `Registering` state: before the coordinator hears of it, strays of earlier
//! runs are killed and verified gone from the GPUs; then it registers, keeps the agent id it
//! got, and reports what an earlier run left unreported.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use headroom_shared::api::{ErrorCode, RegisterRequest};
use headroom_shared::{AgentId, AttemptId};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::agent::backoff::Backoff;
use crate::agent::self_fence::SelfFenceBudget;
use crate::agent::{Agent, AgentError, Session, State, drained, sample};
use crate::outcomes::Outcome;
use crate::supervisor::attempt;

/// Where an agent instance keeps the agent id it registered with last.
const AGENT_ID_FILE: &str = "agent.id";

impl Agent {
    /// The `Registering` state: sweeps what an earlier run left, registers (renewing the
    /// leases of the attempts it runs), kills what the coordinator lost, and reports the
    /// outcomes an earlier run left unreported before any new work is taken.
    pub(super) async fn register(
        &self,
        mut backoff: Backoff,
        shutdown: &CancellationToken,
    ) -> State {
        // Before the coordinator hears of us: whatever it thinks of those attempts, processes
        // of attempts this agent does not run must go, and the GPUs be free of them.
        let killed = self.sweep().await;
        let req = RegisterRequest {
            host_memory_mib: self.shared.cfg.host_memory_mib,
            node: self.shared.cfg.node.clone(),
            gpus: self.shared.backend.inventory(),
            // The plan given at start applies once: a later re-registration (coordinator
            // restart) must not undo a `plan set` made since.
            plan: if self.registered_once.load(Ordering::SeqCst) {
                None
            } else {
                self.shared.cfg.plan.clone()
            },
            headroom: Some(self.shared.cfg.headroom),
            version: env!("CARGO_PKG_VERSION").to_string(),
            // Attempts whose end is journalled keep their leases until it is reported, so
            // that their jobs are not given away meanwhile.
            running: self
                .shared
                .attempts
                .refs()
                .into_iter()
                .chain(self.unreported().iter().map(Outcome::attempt_ref))
                .collect(),
            previous: self.previous_agent(),
        };
        let sent = Instant::now();
        let resp = match self.shared.client.register(&req).await {
            Ok(resp) => resp,
            Err(e) if e.is_transient() => {
                tracing::warn!("registration failed, retrying: {e}");
                if !killed.is_empty() {
                    self.verify_gone(&killed, &[]).await;
                }
                return if backoff.wait(shutdown).await {
                    State::Registering { backoff }
                } else {
                    drained(Ok(()))
                };
            }
            Err(e)
                if matches!(
                    e.code(),
                    Some(ErrorCode::Unauthenticated | ErrorCode::Forbidden)
                ) =>
            {
                return drained(Err(AgentError::NotAuthorized(e)));
            }
            // Another agent instance is alive on this node (or won a race): it may stop, go
            // silent past the lease TTL, or an admin may let this one take over.
            Err(e) if e.code() == Some(ErrorCode::Conflict) => {
                tracing::warn!("cannot register yet, waiting: {e}");
                return if backoff.wait(shutdown).await {
                    State::Registering { backoff }
                } else {
                    drained(Ok(()))
                };
            }
            // A refused registration (bad plan, ...) will not fix itself.
            Err(e) => return drained(Err(AgentError::Refused(e))),
        };
        let ttl = Duration::from_millis(resp.lease_ttl_ms);
        let budget = match SelfFenceBudget::new(ttl, self.shared.cfg.supervisor.kill_grace) {
            Ok(b) => b,
            Err(e) => return drained(Err(e.into())),
        };
        self.registered_once.store(true, Ordering::SeqCst);
        self.remember_agent(resp.agent);
        // The registration renewed the leases of the attempts it named.
        self.shared.attempts.renewed_until(budget.deadline(sent));
        tracing::info!(agent = %resp.agent, plan = %resp.plan, gpus = req.gpus.len(), backend = self.shared.backend.kind(), "registered with the coordinator");
        self.shared.metrics.set_plan(&resp.plan);
        if !resp.lost_attempts.is_empty() {
            // Unscoped: also the leftovers of an agent version that did not mark its scope.
            let lost = resp.lost_attempts.clone();
            let n = tokio::task::spawn_blocking(move || {
                lost.into_iter()
                    .map(|a| attempt::kill_marked(a).len())
                    .sum::<usize>()
            })
            .await
            .unwrap_or(0);
            if n > 0 {
                tracing::warn!(
                    processes = n,
                    "killed leftovers of attempts the coordinator lost"
                );
            }
        }
        if !killed.is_empty() || !resp.lost_attempts.is_empty() {
            self.verify_gone(&killed, &resp.lost_attempts).await;
        }
        let unreported = std::mem::take(&mut *self.unreported());
        for outcome in &unreported {
            crate::agent::lease::report_outcome(&self.shared, outcome, shutdown).await;
        }
        State::Serving(Session {
            agent: resp.agent,
            plan: resp.plan,
            budget,
            renewed: sent,
        })
    }

    /// The agent id this instance (its data directory) last registered with.
    fn previous_agent(&self) -> Option<AgentId> {
        std::fs::read_to_string(self.shared.cfg.data_dir.join(AGENT_ID_FILE))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Kept so that this instance, restarted, registers again as its node's live agent.
    fn remember_agent(&self, agent: AgentId) {
        let dir = &self.shared.cfg.data_dir;
        let tmp = dir.join(format!("{AGENT_ID_FILE}.tmp"));
        let written = std::fs::write(&tmp, agent.to_string())
            .and_then(|()| std::fs::rename(&tmp, dir.join(AGENT_ID_FILE)));
        if let Err(e) = written {
            tracing::warn!("cannot keep the agent id in {}: {e}", dir.display());
        }
    }

    /// Kills every process of this agent's scope whose attempt it does not run.
    async fn sweep(&self) -> HashMap<AttemptId, Vec<u32>> {
        let keep = self.shared.attempts.running_ids();
        let scope = self.shared.scope.clone();
        let cgroups = self.shared.cgroups.clone();
        let killed = tokio::task::spawn_blocking(move || {
            let mut killed = crate::agent::sweep::kill_strays(&scope, &keep);
            // Whatever a job did to its environment, its cgroup still holds it.
            for (attempt, pids) in cgroups.map(|c| c.kill_strays(&keep)).unwrap_or_default() {
                let list = killed.entry(attempt).or_default();
                for p in pids {
                    if !list.contains(&p) {
                        list.push(p);
                    }
                }
            }
            killed
        })
        .await
        .unwrap_or_default();
        if !killed.is_empty() {
            let pids: Vec<u32> = killed.values().flatten().copied().collect();
            tracing::warn!(
                attempts = killed.len(),
                ?pids,
                "killed processes of attempts this agent does not run (left by an earlier run)"
            );
        }
        killed
    }

    /// Waits (bounded by the verify timeout) until none of the `killed` pids lives and no
    /// process of those attempts or of `lost` is on a GPU, so new work is not admitted next
    /// to memory that is about to be freed. Polls, as cleanup does.
    async fn verify_gone(&self, killed: &HashMap<AttemptId, Vec<u32>>, lost: &[AttemptId]) -> bool {
        let attempts: HashSet<AttemptId> = killed.keys().chain(lost).copied().collect();
        let pids: Vec<u32> = killed.values().flatten().copied().collect();
        let deadline = Instant::now() + self.shared.cfg.supervisor.verify_timeout;
        loop {
            let samples = sample(&self.shared.backend).await;
            let p = pids.clone();
            let alive = tokio::task::spawn_blocking(move || {
                p.into_iter()
                    .filter(|&p| crate::procscan::is_alive(p))
                    .collect::<Vec<u32>>()
            })
            .await
            .unwrap_or_default();
            let on_gpus: Vec<u32> = samples
                .iter()
                .flat_map(|g| &g.processes)
                .filter(|p| {
                    p.attempt.is_some_and(|a| attempts.contains(&a)) || pids.contains(&p.pid)
                })
                .map(|p| p.pid)
                .collect();
            // No GPU reading is no proof, and a GPU that cannot be read is not verified free.
            let unknown = samples.is_empty() || samples.iter().any(|g| g.error.is_some());
            if !unknown && alive.is_empty() && on_gpus.is_empty() {
                tracing::info!(
                    attempts = attempts.len(),
                    "GPUs verified free of an earlier run's attempts"
                );
                return true;
            }
            if Instant::now() >= deadline {
                tracing::error!(
                    ?alive,
                    ?on_gpus,
                    unknown,
                    "processes of an earlier run could not be verified gone; their memory stays \
                     counted as used by live free memory"
                );
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
