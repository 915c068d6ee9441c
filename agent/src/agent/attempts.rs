//! The attempts an agent owns: those it runs, and ended ones whose cleanup could not be
//! verified (their GPUs are quarantined on the coordinator until the leftovers are gone).
//!
//! Quarantines outlive the agent: they are kept in `<data dir>/quarantine.json`, so that a
//! restarted agent checks them again and lifts them by itself (heartbeat `released`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use headroom_shared::AttemptId;
use headroom_shared::api::{AttemptRef, GpuSample};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::procscan;
pub use crate::supervisor::proto::StopReason;

/// Handle of a running attempt, for its own task: how it is told to stop, and why.
#[derive(Clone)]
pub struct StopSignal {
    pub cancel: CancellationToken,
    reason: Arc<OnceLock<StopReason>>,
    /// A stop that cannot wait after a requeue's (a user's cancel, a lost lease, the
    /// agent's shutdown while the job has its checkpoint lead): fired with its reason.
    pub now: CancellationToken,
    later: Arc<OnceLock<StopReason>>,
}

impl StopSignal {
    /// Why the attempt was stopped; `None` if it was not.
    pub fn reason(&self) -> Option<StopReason> {
        self.reason.get().copied()
    }

    /// Why a stop that cannot wait came after a requeue's, if one did.
    pub fn now_reason(&self) -> Option<StopReason> {
        self.later.get().copied()
    }

    /// Whether this was its first stop.
    fn stop(&self, reason: StopReason) -> bool {
        // The first reason wins: a cancel that arrives while fencing stays a fence. But a
        // requeue's stop waits for the job's checkpoint lead, which no other stop should.
        let first = self.reason.set(reason).is_ok();
        if !first
            && matches!(self.reason(), Some(StopReason::Requeue(_)))
            && !matches!(reason, StopReason::Requeue(_))
            && self.later.set(reason).is_ok()
        {
            self.now.cancel();
        }
        self.cancel.cancel();
        first
    }
}

struct Running {
    fence: i64,
    stop: StopSignal,
    /// The coordinator refused this lease as stale: it is no longer renewed (a heartbeat
    /// presenting it would be refused whole).
    stale: bool,
    /// Why its job has not started yet (cooling, waiting for an empty GPU), as its
    /// supervisor last said; sent with the heartbeats.
    waiting: Option<String>,
}

/// A pid that held memory when verification gave up, with its start time so that a pid
/// recycled while the agent was down is not taken for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldPid {
    pub pid: u32,
    /// Seconds since the epoch; `None` when it could not be read.
    pub started: Option<u64>,
}

impl HeldPid {
    /// Reads the pid's start time (blocking).
    fn of(pid: u32) -> Self {
        Self {
            pid,
            started: start_secs(pid),
        }
    }

    /// Whether this very process still lives (blocking).
    fn alive(&self) -> bool {
        procscan::is_alive(self.pid)
            && match (self.started, start_secs(self.pid)) {
                (Some(then), Some(now)) => then == now,
                // Unknown is not "gone": keep the quarantine.
                _ => true,
            }
    }
}

fn start_secs(pid: u32) -> Option<u64> {
    procscan::start_time(pid)?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

/// An ended attempt whose cleanup was not verified.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantine {
    pub gpus: Vec<u32>,
    pub held_by: Vec<HeldPid>,
    /// GPUs whose unattributed memory must come down to these limits (MiB).
    #[serde(default)]
    pub ghost_limits: Vec<(u32, u64)>,
}

/// What an attempt whose cleanup was not verified left on its GPUs.
#[derive(Clone, Debug, Default)]
pub struct Left {
    pub gpus: Vec<u32>,
    /// Pids that still held memory.
    pub pids: Vec<u32>,
    /// GPUs whose unattributed memory stayed above these limits (MiB).
    pub ghost_limits: Vec<(u32, u64)>,
}

#[derive(Default, Serialize, Deserialize)]
struct Persisted {
    quarantined: HashMap<AttemptId, Quarantine>,
}

#[derive(Default)]
struct Inner {
    running: HashMap<AttemptId, Running>,
    quarantined: HashMap<AttemptId, Quarantine>,
}

/// Owner of the agent's attempts; cheap to clone, shared by the agent's tasks.
#[derive(Clone)]
pub struct Attempts {
    inner: Arc<Mutex<Inner>>,
    file: Arc<QuarantineFile>,
    /// Counts launches, so that waiters (the fence) learn of new attempts without polling.
    launches: Arc<tokio::sync::watch::Sender<u64>>,
    /// When the attempts must be stopped unless a heartbeat renews their leases (see
    /// [`crate::agent::self_fence`]); `None` before the first registration. Each attempt's task pushes
    /// it to its supervisor process, which stops the job by itself once it passes.
    fence_deadline: Arc<tokio::sync::watch::Sender<Option<tokio::time::Instant>>>,
}

#[derive(Debug, thiserror::Error)]
pub enum AttemptsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a quarantine file: {source}")]
    Format {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl Attempts {
    /// Loads the quarantines a former run of the agent left in `data_dir` (blocking).
    pub fn load(data_dir: &Path) -> Result<Self, AttemptsError> {
        let path = data_dir.join("quarantine.json");
        let quarantined = match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice::<Persisted>(&bytes)
                    .map_err(|source| AttemptsError::Format {
                        path: path.clone(),
                        source,
                    })?
                    .quarantined
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
            Err(source) => return Err(AttemptsError::Io { path, source }),
        };
        Ok(Self {
            inner: Arc::new(Mutex::new(Inner {
                running: HashMap::new(),
                quarantined,
            })),
            file: Arc::new(QuarantineFile {
                path,
                version: AtomicU64::new(0),
                written: Mutex::new(0),
            }),
            launches: Arc::new(tokio::sync::watch::Sender::new(0)),
            fence_deadline: Arc::new(tokio::sync::watch::Sender::new(None)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a running attempt; its stop signal is a child of `parent`.
    pub fn begin(&self, attempt: AttemptId, fence: i64, parent: &CancellationToken) -> StopSignal {
        let stop = StopSignal {
            cancel: parent.child_token(),
            reason: Arc::default(),
            now: CancellationToken::new(),
            later: Arc::default(),
        };
        self.lock().running.insert(
            attempt,
            Running {
                fence,
                stop: stop.clone(),
                stale: false,
                waiting: None,
            },
        );
        self.launches.send_modify(|n| *n = n.wrapping_add(1));
        stop
    }

    /// A registration or heartbeat renewed the leases: attempts must stop at `deadline`
    /// unless renewed again.
    pub fn renewed_until(&self, deadline: tokio::time::Instant) {
        self.fence_deadline.send_replace(Some(deadline));
    }

    /// The current fence deadline, and its changes.
    pub fn fence_deadline(&self) -> tokio::sync::watch::Receiver<Option<tokio::time::Instant>> {
        self.fence_deadline.subscribe()
    }

    /// Changes whenever an attempt begins (subscribe before looking at the running set).
    pub fn launches(&self) -> tokio::sync::watch::Receiver<u64> {
        self.launches.subscribe()
    }

    /// Leases to renew: every running attempt with its fencing token, but those the
    /// coordinator refused as stale.
    pub fn refs(&self) -> Vec<AttemptRef> {
        self.lock()
            .running
            .iter()
            .filter(|(_, r)| !r.stale)
            .map(|(id, r)| AttemptRef {
                attempt: *id,
                fence: r.fence,
                waiting: r.waiting.clone(),
            })
            .collect()
    }

    /// What an attempt's job waits for before it starts; `None` once it runs.
    pub fn set_waiting(&self, attempt: AttemptId, waiting: Option<String>) {
        if let Some(r) = self.lock().running.get_mut(&attempt) {
            r.waiting = waiting;
        }
    }

    /// Running attempts not asked to stop (cancellations for them are still of interest).
    pub fn watching(&self) -> Vec<AttemptId> {
        self.lock()
            .running
            .iter()
            .filter(|(_, r)| !r.stop.cancel.is_cancelled())
            .map(|(id, _)| *id)
            .collect()
    }

    pub fn running_ids(&self) -> HashSet<AttemptId> {
        self.lock().running.keys().copied().collect()
    }

    pub fn running_count(&self) -> usize {
        self.lock().running.len()
    }

    /// Stops one attempt; `false` if it is not running here or was stopped already (a
    /// cancel named again by the next answer).
    pub fn stop(&self, attempt: AttemptId, reason: StopReason) -> bool {
        match self.lock().running.get(&attempt) {
            Some(r) => r.stop.stop(reason),
            None => false,
        }
    }

    /// The coordinator refused this attempt's lease (lost, or someone else's now): stop it
    /// and renew it no more. `false` if it is not running here.
    pub fn mark_stale(&self, attempt: AttemptId) -> bool {
        match self.lock().running.get_mut(&attempt) {
            Some(r) => {
                r.stale = true;
                r.stop.stop(StopReason::LeaseLost);
                true
            }
            None => false,
        }
    }

    /// Stops every running attempt not already stopping; returns how many.
    pub fn stop_all(&self, reason: StopReason) -> usize {
        let inner = self.lock();
        let live = inner
            .running
            .values()
            .filter(|r| !r.stop.cancel.is_cancelled());
        live.filter(|r| r.stop.stop(reason)).count()
    }

    /// The attempt has ended and its cleanup is over: it leaves the running set (the next
    /// claim must not watch it), and its GPUs stay quarantined while `held_by` is not empty
    /// or cleanup was not verified.
    pub async fn end(&self, attempt: AttemptId, unverified: Option<Left>) {
        let Some(Left {
            gpus,
            pids,
            ghost_limits,
        }) = unverified
        else {
            self.lock().running.remove(&attempt);
            return;
        };
        let held_by = tokio::task::spawn_blocking(move || {
            pids.into_iter().map(HeldPid::of).collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        {
            let mut inner = self.lock();
            inner.running.remove(&attempt);
            inner.quarantined.insert(
                attempt,
                Quarantine {
                    gpus,
                    held_by,
                    ghost_limits,
                },
            );
        }
        self.persist().await;
    }

    pub fn quarantined(&self) -> Vec<(AttemptId, Quarantine)> {
        self.lock()
            .quarantined
            .iter()
            .map(|(a, q)| (*a, q.clone()))
            .collect()
    }

    /// Quarantined attempts whose leftovers are gone: none of the pids that held memory lives
    /// or is on its GPUs, and no process carries the attempt's marker. Reads `/proc`.
    pub async fn releasable(&self, samples: &[GpuSample]) -> Vec<AttemptId> {
        let held = self.quarantined();
        if held.is_empty() {
            return vec![];
        }
        // No reading of the GPUs: nothing can be shown to be gone.
        if samples.is_empty() {
            return vec![];
        }
        let samples = samples.to_vec();
        tokio::task::spawn_blocking(move || {
            let marked = procscan::marked_processes();
            held.into_iter()
                .filter(|(attempt, q)| {
                    let on_gpus = samples
                        .iter()
                        .filter(|g| q.gpus.contains(&g.index))
                        .flat_map(|g| &g.processes)
                        .any(|p| {
                            q.held_by.iter().any(|h| h.pid == p.pid) || p.attempt == Some(*attempt)
                        });
                    // Memory nobody accounts for must have come down (unknown is not down).
                    let ghost_gone = q.ghost_limits.iter().all(|&(gpu, limit)| {
                        samples
                            .iter()
                            .find(|g| g.index == gpu)
                            .and_then(GpuSample::unattributed_mib)
                            .is_some_and(|u| u <= limit)
                    });
                    // An unreadable GPU keeps its quarantine: unknown is not clean.
                    ghost_gone
                        && !on_gpus
                        && crate::gpu::unreadable(&samples, &q.gpus).is_none()
                        && !marked.contains_key(attempt)
                        && !q.held_by.iter().any(HeldPid::alive)
                })
                .map(|(a, _)| a)
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    /// The coordinator has lifted these quarantines.
    pub async fn released(&self, attempts: &[AttemptId]) {
        if attempts.is_empty() {
            return;
        }
        {
            let mut inner = self.lock();
            for a in attempts {
                if inner.quarantined.remove(a).is_some() {
                    tracing::info!(attempt = %a, "leftovers gone: GPU quarantine lifted");
                }
            }
        }
        self.persist().await;
    }

    /// Writes the quarantines to the data dir, off the runtime. Concurrent writers never
    /// replace a newer state with an older one. A failure is logged: the quarantine still
    /// holds in memory, and on the coordinator.
    async fn persist(&self) {
        let version = self.file.version.fetch_add(1, Ordering::SeqCst) + 1;
        let snapshot = Persisted {
            quarantined: self.lock().quarantined.clone(),
        };
        let file = self.file.clone();
        let written = tokio::task::spawn_blocking(move || file.write(version, &snapshot)).await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(
                "cannot keep quarantines in {}: {e}; a restart will not lift them by itself",
                self.file.path.display()
            ),
            Err(e) => tracing::warn!("quarantine write task failed: {e}"),
        }
    }
}

struct QuarantineFile {
    path: PathBuf,
    version: AtomicU64,
    /// The version on disk; held while writing.
    written: Mutex<u64>,
}

impl QuarantineFile {
    fn write(&self, version: u64, state: &Persisted) -> std::io::Result<()> {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        if *written >= version {
            return Ok(());
        }
        if state.quarantined.is_empty() {
            match std::fs::remove_file(&self.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        } else {
            // Write then rename: a crash mid-write leaves the old file, never half of one.
            let tmp = self.path.with_extension("json.tmp");
            let bytes = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, &self.path)?;
        }
        *written = version;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn quarantines_survive_a_restart_until_released() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attempts::load(dir.path()).expect("load");
        let (gone, held) = (AttemptId::new(), AttemptId::new());
        let stop = CancellationToken::new();
        a.begin(gone, 1, &stop);
        a.begin(held, 2, &stop);
        assert_eq!(a.running_count(), 2);
        a.end(gone, None).await;
        a.end(
            held,
            Some(Left {
                gpus: vec![1],
                pids: vec![std::process::id()],
                ..Left::default()
            }),
        )
        .await;
        assert_eq!(a.running_count(), 0);

        // A new incarnation finds the quarantine, not the clean end.
        let b = Attempts::load(dir.path()).expect("reload");
        let q = b.quarantined();
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].0, held);
        assert_eq!(q[0].1.gpus, vec![1]);
        assert_eq!(q[0].1.held_by[0].pid, std::process::id());
        b.released(&[held]).await;
        assert!(
            Attempts::load(dir.path())
                .expect("reload")
                .quarantined()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn a_quarantine_holds_while_its_pid_lives_and_lifts_when_it_is_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attempts::load(dir.path()).expect("load");
        let attempt = AttemptId::new();
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep");
        a.begin(attempt, 1, &CancellationToken::new());
        a.end(
            attempt,
            Some(Left {
                gpus: vec![0],
                pids: vec![child.id()],
                ..Left::default()
            }),
        )
        .await;
        let gpu = GpuSample {
            index: 0,
            ..Default::default()
        };
        assert!(a.releasable(std::slice::from_ref(&gpu)).await.is_empty());
        assert!(
            a.releasable(&[]).await.is_empty(),
            "no reading is not clean"
        );
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert_eq!(a.releasable(&[gpu]).await, vec![attempt]);
    }

    #[test]
    fn a_recycled_pid_is_not_the_process_that_held_memory() {
        let me = HeldPid::of(std::process::id());
        assert!(me.alive());
        let impostor = HeldPid {
            pid: me.pid,
            started: me.started.map(|s| s.saturating_sub(3600)),
        };
        assert!(!impostor.alive());
    }

    #[test]
    fn stop_reasons_stick_and_stop_all_counts_the_live_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attempts::load(dir.path()).expect("load");
        let parent = CancellationToken::new();
        let (x, y) = (AttemptId::new(), AttemptId::new());
        let sx = a.begin(x, 1, &parent);
        let sy = a.begin(y, 1, &parent);
        assert!(a.stop(x, StopReason::User));
        assert!(!a.stop(x, StopReason::User), "stopped already");
        assert!(
            !sx.now.is_cancelled(),
            "a stop after a stop that does not wait"
        );
        assert!(!a.stop(AttemptId::new(), StopReason::User));
        assert_eq!(a.watching(), vec![y]);
        assert_eq!(a.stop_all(StopReason::LeaseLost), 1);
        assert_eq!(sx.reason(), Some(StopReason::User));
        assert_eq!(sy.reason(), Some(StopReason::LeaseLost));
        assert!(sy.cancel.is_cancelled());
    }

    /// A user's cancel (or a lost lease) that comes while a requeued job has its checkpoint
    /// lead is passed on at once; another requeue is not.
    #[test]
    fn a_stop_that_cannot_wait_overtakes_a_requeue_s_lead() {
        use headroom_shared::checkpoint::Requeue;
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attempts::load(dir.path()).expect("load");
        let parent = CancellationToken::new();
        let x = AttemptId::new();
        let sx = a.begin(x, 1, &parent);
        assert!(a.stop(x, StopReason::Requeue(Requeue::Preempted)));
        assert!(!a.stop(x, StopReason::Requeue(Requeue::Requeued)));
        assert!(
            !sx.now.is_cancelled(),
            "a second requeue waits as the first"
        );
        a.stop(x, StopReason::User);
        assert!(sx.now.is_cancelled());
        assert_eq!(sx.now_reason(), Some(StopReason::User));
        assert_eq!(sx.reason(), Some(StopReason::Requeue(Requeue::Preempted)));
    }
}
