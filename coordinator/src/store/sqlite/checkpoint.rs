//! The WAL's checkpoints, mostly off the store's thread. SQLite's own automatic checkpoint
//! runs inside the commit that finds the WAL over 1,000 pages, with the WAL's and the
//! database's flushes (5-30 ms here), and every operation queued behind that commit waits
//! for it, a claim among them. Here a commit asks a second connection, on a thread of its
//! own, for a passive checkpoint (it waits for no reader or writer) every 500 pages instead.
//! While commits keep coming, that checkpoint never catches up with the WAL's end, and only
//! a commit that finds the WAL wholly copied starts it over from its beginning: so a commit
//! that finds it over 4,000 pages checkpoints itself, copying (and flushing) only what the
//! checkpointer has not, and the WAL starts over. Durability is the same: with `synchronous
//! = NORMAL` a commit is durable against a crash of the process at once, and against a power
//! cut from the next checkpoint on.

use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};

use rusqlite::Connection;
use rusqlite::hooks::Wal;

use crate::store::{Result, StoreError};

/// WAL frames (pages) written after which a commit asks for a checkpoint (SQLite's own
/// automatic checkpoint comes every 1,000).
const CHECKPOINT_EVERY: c_int = 500;

/// WAL frames after which a commit checkpoints itself (what the checkpointer has not copied
/// yet), so that the WAL starts over and stays bounded.
pub(super) const INLINE_AFTER: c_int = 4_000;

/// WAL frames after which a commit waits for a running checkpointer to finish before it
/// checkpoints itself: the WAL's bound.
pub(super) const WAIT_AFTER: c_int = 2 * INLINE_AFTER;

/// How the WAL was checkpointed: by the checkpointer, or (far behind) by a commit itself.
#[derive(Debug, Default)]
pub struct Checkpoints {
    background: AtomicU64,
    inline: AtomicU64,
    failed: AtomicU64,
    waited: AtomicU64,
    /// Held by whoever checkpoints in this process: a commit far behind waits on it.
    busy: Mutex<()>,
}

impl Checkpoints {
    /// Checkpoints the checkpointer ran.
    pub fn background(&self) -> u64 {
        self.background.load(Ordering::Relaxed)
    }

    /// Checkpoints a commit ran itself, to start the WAL over.
    pub fn inline(&self) -> u64 {
        self.inline.load(Ordering::Relaxed)
    }

    /// Checkpoints that failed (logged; the next commit asks again).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Commits that found the WAL at its bound (each waited for the checkpointer, if it was
    /// at work, before checkpointing itself).
    pub fn waited(&self) -> u64 {
        self.waited.load(Ordering::Relaxed)
    }

    /// The right to checkpoint; `None` when someone has it and `wait` is false.
    fn take(&self, wait: bool) -> Option<MutexGuard<'_, ()>> {
        if wait {
            return Some(self.busy.lock().unwrap_or_else(PoisonError::into_inner));
        }
        match self.busy.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// A checkpointer that takes its time: holds the right to checkpoint until dropped.
    #[cfg(test)]
    pub(super) fn hold(&self) -> MutexGuard<'_, ()> {
        self.take(true).expect("a wait always takes it")
    }
}

/// Starts the checkpointer for the database at `path` and has `conn`'s commits call on it
/// (replacing SQLite's automatic checkpoint). It stops when `conn` is dropped.
pub(super) fn start(conn: &mut Connection, path: &Path) -> Result<Arc<Checkpoints>> {
    let own = Connection::open(path)?;
    let stats = Arc::new(Checkpoints::default());
    // One request waiting is enough: a checkpoint copies whatever the WAL holds by then.
    let (ask, asked) = mpsc::sync_channel::<()>(1);
    let s = stats.clone();
    std::thread::Builder::new()
        .name("sqlite-checkpoint".into())
        .spawn(move || run(own, asked, &s))
        .map_err(|e| StoreError::Database(format!("cannot start the store's checkpointer: {e}")))?;
    let s = stats.clone();
    // The WAL's length when the checkpointer was last asked.
    let mut asked_at: c_int = 0;
    conn.wal_hook(Some(move |wal: &mut Wal, frames: c_int| {
        if frames < asked_at {
            asked_at = 0; // started over
        }
        if frames >= INLINE_AFTER {
            let wait = frames >= WAIT_AFTER;
            // The checkpointer is at it: the next commit tries again, or, at the bound, this
            // one waits for it to finish.
            let Some(_own) = s.take(wait) else {
                return Ok(());
            };
            if wait {
                s.waited.fetch_add(1, Ordering::Relaxed);
            }
            match wal.checkpoint() {
                Ok(()) => {
                    s.inline.fetch_add(1, Ordering::Relaxed);
                }
                // Another process's checkpoint (the `sqlite3` shell): the next commit tries again.
                Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {}
                Err(e) => {
                    s.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("SQLite: checkpoint of a WAL of {frames} pages failed: {e}");
                }
            }
        } else if frames >= asked_at + CHECKPOINT_EVERY {
            asked_at = frames;
            // Full: one is asked for already.
            let _ = ask.try_send(());
        }
        // An error here would fail the statement whose commit has already happened.
        Ok(())
    }))?;
    Ok(stats)
}

/// The checkpointer's thread: a passive checkpoint per request, until the store's connection
/// (and with it the hook that asks) is dropped.
fn run(conn: Connection, asked: mpsc::Receiver<()>, stats: &Checkpoints) {
    while asked.recv().is_ok() {
        let _own = stats.take(true);
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0)) {
            Ok(0) => {
                stats.background.fetch_add(1, Ordering::Relaxed);
            }
            // Busy: another process checkpoints (the `sqlite3` shell); the next ask retries.
            Ok(_) => {}
            Err(e) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("SQLite: background checkpoint failed: {e}");
            }
        }
    }
}
