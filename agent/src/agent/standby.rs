//! Attempt supervisors waiting for a lease, so that starting a job costs one message to a
//! waiting process rather than an exec on the way. A supervisor whose attempt ended clean
//! comes back here (its exec, loading and runtime are paid once for many attempts); when
//! none waits, a lease starts one and another is started to wait for the lease after.
//! A supervisor carries no attempt marker (none is known when it starts): a restarted agent
//! finds launched ones by their sockets ([`crate::supervisor::proto::listening`]). A waiting one exits
//! when the agent lets it go or closes its channel (exits or dies).

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};

use crate::gpu::BackendChoice;
use crate::supervisor::proto::{Conn, ProtoError, ToSupervisor};

/// Supervisors kept waiting at most; more that come back exit. Enough for the starts of a
/// burst, few enough that an idle node holds little.
const MAX_WAITING: usize = 16;

/// Starts attempt supervisors and keeps the ones waiting for a lease.
pub(crate) struct Standby {
    exe: PathBuf,
    scope: String,
    /// What supervisors start with instead of the agent's environment (read once).
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// Where supervisors write what goes wrong.
    stderr: Option<std::fs::File>,
    /// What each supervisor is told first ([`ToSupervisor::Prepare`]): the GPU backend to
    /// open while it waits.
    prepare: Option<Vec<u8>>,
    pool: Mutex<Pool>,
}

#[derive(Default)]
struct Pool {
    /// The agent's ends of the waiting supervisors' channels, most recently used last.
    waiting: Vec<Conn>,
    /// A supervisor is being started to wait.
    starting: bool,
    /// The agent is leaving: none is kept or started any more.
    closed: bool,
}

impl Standby {
    pub fn new(
        exe: PathBuf,
        scope: String,
        stderr: Option<std::fs::File>,
        gpu: Option<BackendChoice>,
    ) -> Arc<Self> {
        let prepare = gpu.and_then(|gpu| {
            let mut line = serde_json::to_vec(&ToSupervisor::Prepare { gpu }).ok()?;
            line.push(b'\n');
            Some(line)
        });
        Arc::new(Self {
            exe,
            scope,
            env: crate::jobenv::for_supervisor(std::env::vars_os()),
            stderr,
            prepare,
            pool: Mutex::new(Pool::default()),
        })
    }

    /// A waiting supervisor, the most recently used first.
    pub fn take_waiting(&self) -> Option<Conn> {
        self.pool().waiting.pop()
    }

    /// A supervisor started now (none waits), and another started to wait.
    pub fn take_new(self: &Arc<Self>) -> Result<Conn, ProtoError> {
        let conn = self.start()?;
        self.refill();
        Ok(conn)
    }

    /// A supervisor whose attempt ended clean, waiting for another launch on `conn`: kept
    /// for the next lease, unless enough wait already (dropped, it exits).
    pub fn put_back(&self, conn: Conn) {
        let mut pool = self.pool();
        if !pool.closed && pool.waiting.len() < MAX_WAITING {
            pool.waiting.push(conn);
        }
    }

    /// Starts a supervisor to wait unless one waits or is being started. On the runtime's
    /// thread: a spawn holds it for about the exec (a millisecond), as a lease's own spawn
    /// would.
    pub fn refill(self: &Arc<Self>) {
        {
            let mut pool = self.pool();
            if pool.closed || pool.starting || !pool.waiting.is_empty() {
                return;
            }
            pool.starting = true;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let started = this.start();
            let mut pool = this.pool();
            pool.starting = false;
            match started {
                Ok(conn) if !pool.closed => pool.waiting.push(conn),
                Ok(_) => {}
                Err(e) => tracing::warn!("cannot start an attempt supervisor to wait: {e}"),
            }
        });
    }

    /// Lets the waiting supervisors go (they exit at once): the agent is leaving.
    pub fn close(&self) {
        let mut pool = self.pool();
        pool.closed = true;
        pool.waiting.clear();
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the agent's own binary as a supervisor with one end of a socketpair as its
    /// stdin; returns the agent's end.
    fn start(&self) -> Result<Conn, ProtoError> {
        let (ours, theirs) = UnixStream::pair()?;
        let mut cmd = tokio::process::Command::new(&self.exe);
        // `ps` shows `headroom-attempt __headroom-attempt`, not the `/proc/self/exe` it runs.
        // Not the agent's environment (its token may be in it): what the supervisor reads.
        cmd.arg0(crate::supervisor::PROCESS_NAME)
            .arg(crate::supervisor::SUPERVISOR_ARG)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env(crate::agent::sweep::AGENT_VAR, &self.scope)
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
        // Written before anything else is sent (a fresh socket's buffer takes it whole), so
        // the supervisor opens its GPUs while the lease is still on its way. A supervisor
        // that cannot be told exits when `ours` is dropped, and is reaped above.
        if let Some(line) = &self.prepare {
            use std::io::Write;
            (&ours).write_all(line)?;
        }
        Conn::new(ours)
    }
}
