//! What an agent does first at start: re-attaches to the supervisors a former run of it
//! left running their attempts (or kills those it cannot trust), and collects the outcomes
//! that run journalled and never got answered.

use std::collections::HashSet;
use std::time::Duration;

use headroom_shared::AttemptId;

use crate::agent::{Agent, AgentError};
use crate::outcomes::Outcome;
use crate::supervisor::proto::FromSupervisor;

impl Agent {
    /// Re-attaches to the supervisors of attempts a former run of this agent started that
    /// still run them, then collects the outcomes it journalled and did not report (but those
    /// of re-attached attempts, whose tasks report them).
    pub(super) async fn recover(&self) -> Result<(), AgentError> {
        let scope = self.shared.scope.clone();
        // Supervisors by their sockets (they carry no marker), and attempts whose processes
        // do (a supervisor of an earlier version is marked; a job outlives its supervisor).
        let found = tokio::task::spawn_blocking(move || {
            let mut found: HashSet<AttemptId> = crate::procscan::marked_processes_scoped(Some((
                crate::agent::sweep::AGENT_VAR,
                &scope,
            )))
            .into_keys()
            .collect();
            match crate::supervisor::proto::listening(&scope) {
                Ok(listening) => found.extend(listening),
                Err(e) => tracing::warn!("cannot list attempt supervisors' sockets: {e}"),
            }
            found
        })
        .await
        .unwrap_or_default();
        for attempt in found {
            let hello = crate::supervisor::proto::connect(
                &self.shared.scope,
                attempt,
                &self.shared.attach_key,
                Duration::from_secs(2),
            )
            .await;
            // Of this agent's user and holding its key, and also a process this agent's data
            // directory started (its marker): nothing else is followed or signalled.
            let scope = self.shared.scope.as_str();
            let ours = |pid: Option<u32>| {
                pid.and_then(|p| crate::procscan::env_var(p, crate::agent::sweep::AGENT_VAR))
                    .as_deref()
                    == Some(scope)
            };
            let hello = match hello {
                Ok((conn, _)) if !ours(conn.peer_pid()) => {
                    tracing::warn!(
                        %attempt,
                        pid = ?conn.peer_pid(),
                        "a process that this agent did not start answers on the attempt's socket: left alone"
                    );
                    continue;
                }
                other => other,
            };
            match hello {
                Ok((
                    conn,
                    FromSupervisor::Hello {
                        fence,
                        gpus,
                        pid,
                        started_at,
                        ..
                    },
                )) => {
                    tracing::info!(%attempt, ?pid, "re-attached to a running attempt");
                    let stop = self.shared.attempts.begin(attempt, fence, &self.stopping);
                    // It keeps the deadline a former run gave it until this one renews.
                    let mut deadlines = self.shared.attempts.fence_deadline();
                    deadlines.borrow_and_update();
                    self.attempt_tasks.spawn(crate::agent::lease::follow(
                        self.shared.clone(),
                        attempt,
                        fence,
                        gpus,
                        conn,
                        pid.zip(started_at),
                        deadlines,
                        stop,
                        self.exit.clone(),
                        false,
                    ));
                }
                Ok(_) => {}
                // A supervisor that answers but cannot be re-attached (silent, another
                // protocol) is killed; its job's processes are swept as strays; a journalled
                // end is reported below.
                Err(e) => {
                    tracing::warn!(%attempt, "cannot re-attach to the attempt's supervisor: {e}");
                    // Only a process this agent's data directory started (its marker), of
                    // this agent's user: anyone may bind a name in the abstract namespace.
                    let killed =
                        crate::supervisor::proto::supervisor_pid(&self.shared.scope, attempt)
                            .filter(|&pid| {
                                crate::procscan::env_var(pid, crate::agent::sweep::AGENT_VAR)
                                    .as_deref()
                                    == Some(self.shared.scope.as_str())
                            })
                            .filter(|&pid| {
                                i32::try_from(pid).is_ok_and(|raw| {
                                    nix::sys::signal::kill(
                                        nix::unistd::Pid::from_raw(raw),
                                        nix::sys::signal::Signal::SIGKILL,
                                    )
                                    .is_ok()
                                })
                            });
                    if let Some(pid) = killed {
                        tracing::warn!(%attempt, pid, "killed the attempt's supervisor");
                    }
                }
            }
        }
        let journal = self.shared.outcomes.clone();
        let (pending, unreadable) = tokio::task::spawn_blocking(move || journal.pending())
            .await
            .map_err(std::io::Error::other)??;
        for e in unreadable {
            tracing::error!("a journalled outcome cannot be reported: {e}");
        }
        let attached = self.shared.attempts.running_ids();
        let unreported: Vec<Outcome> = pending
            .into_iter()
            .filter(|o| !attached.contains(&o.attempt))
            .collect();
        if !unreported.is_empty() {
            tracing::info!(
                outcomes = unreported.len(),
                "found outcomes an earlier run did not report; reporting them first"
            );
        }
        *self.unreported() = unreported;
        Ok(())
    }
}
