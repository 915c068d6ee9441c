//! An attempt supervisor started ahead of the next lease: it has exec'd, loaded the binary
//! and built its runtime before the lease comes, so starting a job costs one message to a
//! waiting process rather than an exec on the way. One waits at a time; taking it starts the
//! next. A supervisor carries no attempt marker (no attempt is known when it starts): a
//! restarted agent finds launched ones by their sockets ([`super::proto::listening`]). One
//! that never got a launch exits when the agent closes its channel (exits or dies).

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};

use super::proto::{Conn, ProtoError};

/// Starts attempt supervisors and keeps one waiting.
pub(crate) struct Standby {
    exe: PathBuf,
    scope: String,
    /// Where supervisors write what goes wrong.
    stderr: Option<std::fs::File>,
    /// The agent's end of the waiting supervisor's channel.
    waiting: Mutex<Option<UnixStream>>,
}

impl Standby {
    pub fn new(exe: PathBuf, scope: String, stderr: Option<std::fs::File>) -> Arc<Self> {
        Arc::new(Self {
            exe,
            scope,
            stderr,
            waiting: Mutex::new(None),
        })
    }

    /// A supervisor for the next attempt: the waiting one, or one started now when none
    /// waits; either way another is started to wait for the lease after.
    pub fn take(self: &Arc<Self>) -> Result<Conn, ProtoError> {
        let waiting = self.slot().take();
        let channel = match waiting {
            Some(c) => c,
            None => self.start()?,
        };
        self.refill();
        Conn::new(channel)
    }

    /// Starts a supervisor to wait, unless one already does. On a runtime worker: a spawn
    /// blocks for about the exec, as a lease's own spawn did.
    pub fn refill(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            if this.slot().is_some() {
                return;
            }
            match this.start() {
                Ok(channel) => {
                    let mut slot = this.slot();
                    // Another refill won the race: this one exits when its channel drops.
                    if slot.is_none() {
                        *slot = Some(channel);
                    }
                }
                Err(e) => tracing::warn!("cannot start a standby attempt supervisor: {e}"),
            }
        });
    }

    /// Lets the waiting supervisor go (it exits at once): the agent is leaving.
    pub fn close(&self) {
        self.slot().take();
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<UnixStream>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the agent's own binary as a supervisor with one end of a socketpair as its
    /// stdin; returns the agent's end.
    fn start(&self) -> std::io::Result<UnixStream> {
        let (ours, theirs) = UnixStream::pair()?;
        let mut cmd = tokio::process::Command::new(&self.exe);
        // `ps` shows `headroom-attempt __headroom-attempt`, not the `/proc/self/exe` it runs.
        cmd.arg0(super::PROCESS_NAME)
            .arg(super::SHIM_ARG)
            .env(crate::sweep::AGENT_VAR, &self.scope)
            .env_remove(crate::procscan::ATTEMPT_VAR)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(match self.stderr.as_ref().map(std::fs::File::try_clone) {
                Some(Ok(f)) => Stdio::from(f),
                _ => Stdio::null(),
            });
        let mut child = crate::procscan::spawn_owned(|| cmd.spawn(), tokio::process::Child::id)?;
        drop(cmd);
        // Reaped when it exits, while this agent lives; it is never killed with the agent.
        tokio::spawn(async move {
            let pid = child.id();
            let _ = child.wait().await;
            if let Some(pid) = pid {
                crate::procscan::disown(pid);
            }
        });
        Ok(ours)
    }
}
