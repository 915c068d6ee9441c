//! The outcome journal: each attempt's end report, kept in `<data dir>/outcomes/` from the
//! moment the attempt ended until the coordinator has answered it, so that an agent killed
//! in between (`kill -9`, OOM killer, crash) reports it on its next run instead of leaving
//! the attempt to be recorded lost and run again.
//!
//! One small file per attempt, written to a temporary name, flushed to disk, and renamed
//! (the directory flushed too), so a reader finds a whole report or none, and an end
//! reported to anyone survives a power loss of the node as well as a killed agent.
//!
//! Answered files are renamed aside as spares and reused for the next outcome rather than
//! unlinked and created again: on ext4 without a journal every inode allocation skips the
//! inodes freed in the last seconds one by one, so a create and an unlink per job made each
//! later create in the data directory slower, the more so the faster jobs ran. A spare is
//! overwritten in place and cut to length, so its data block is reused too.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use headroom_shared::AttemptId;
use headroom_shared::api::{AttemptRef, FinishReport};
use serde::{Deserialize, Serialize};

/// TEST-ONLY: milliseconds the agent waits between journalling an outcome and reporting it,
/// so that tests can kill it in that window. Never set it in production.
pub const TEST_PAUSE_BEFORE_REPORT_VAR: &str = "HEADROOM_TEST_PAUSE_BEFORE_REPORT";

/// A journalled outcome: the report the agent was about to send (its fence included).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Outcome {
    pub attempt: AttemptId,
    pub report: FinishReport,
}

impl Outcome {
    pub fn attempt_ref(&self) -> AttemptRef {
        AttemptRef {
            attempt: self.attempt,
            fence: self.report.fence,
            waiting: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OutcomesError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a journalled outcome: {source}")]
    Format {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OutcomesError + '_ {
    move |source| OutcomesError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Spare files kept for reuse at most (more are unlinked): about the slots of a large node.
const MAX_SPARES: usize = 256;

/// Prefix of spare files: answered outcomes waiting to be overwritten (never read).
const SPARE_PREFIX: &str = "spare-";

/// Answered files renamed aside, to be overwritten by the next outcomes.
#[derive(Debug, Default)]
struct Spares {
    paths: Mutex<Vec<PathBuf>>,
    next: AtomicU64,
    /// Names this run's spares apart from an earlier run's, which supervisors still running
    /// from it may hold as their temporary file.
    run: String,
}

/// The journal directory of one agent.
#[derive(Clone, Debug)]
pub struct Outcomes {
    dir: PathBuf,
    spares: Arc<Spares>,
}

impl Outcomes {
    /// Opens (creates) `<data_dir>/outcomes` (blocking).
    pub fn open(data_dir: &Path) -> Result<Self, OutcomesError> {
        let dir = data_dir.join("outcomes");
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        // Spares of an earlier run hold answered outcomes only: the names are reused, so they go.
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))?.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(SPARE_PREFIX)
            {
                let path = entry.path();
                std::fs::remove_file(&path).map_err(io(&path))?;
            }
        }
        Ok(Self {
            dir,
            spares: Arc::new(Spares {
                run: headroom_shared::secret::random_hex(4),
                ..Spares::default()
            }),
        })
    }

    /// Opens `<data_dir>/outcomes` as a writer only, leaving spares alone: an attempt's
    /// supervisor process journals its outcome here while the agent owns the spares.
    pub fn writer(data_dir: &Path) -> Self {
        Self {
            dir: data_dir.join("outcomes"),
            spares: Arc::default(),
        }
    }

    /// A spare file for another process to write one outcome through (see
    /// [`Outcomes::write_through`]); `None` when there is none.
    pub fn take_spare(&self) -> Option<PathBuf> {
        self.spares.paths.lock().ok()?.pop()
    }

    /// The journalled outcome of `attempt`, if there is one (blocking).
    pub fn read(&self, attempt: AttemptId) -> Result<Option<Outcome>, OutcomesError> {
        let path = self.path_of(attempt);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| OutcomesError::Format { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn path_of(&self, attempt: AttemptId) -> PathBuf {
        self.dir.join(format!("{attempt}.json"))
    }

    /// Journals an outcome (blocking): written whole under a temporary name, then renamed.
    pub fn write(&self, outcome: &Outcome) -> Result<(), OutcomesError> {
        self.write_through(outcome, self.take_spare())
    }

    /// [`Outcomes::write`] through the temporary file `spare` (a spare handed out by the
    /// agent's journal), or a fresh one when `None`.
    pub fn write_through(
        &self,
        outcome: &Outcome,
        spare: Option<PathBuf>,
    ) -> Result<(), OutcomesError> {
        let path = self.path_of(outcome.attempt);
        // A spare, when there is one, is the temporary file: its inode is reused. A kill
        // before the rename leaves it a spare, never read (the report was not sent yet).
        let tmp = spare.unwrap_or_else(|| path.with_extension("json.tmp"));
        let bytes = serde_json::to_vec(outcome).map_err(|source| OutcomesError::Format {
            path: path.clone(),
            source,
        })?;
        // Overwritten in place and cut to length, not truncated first: a spare's data block
        // stays allocated, so the write frees and allocates none (nor discards one).
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&tmp)
            .map_err(io(&tmp))?;
        file.write_all_at(&bytes, 0).map_err(io(&tmp))?;
        file.set_len(bytes.len() as u64).map_err(io(&tmp))?;
        file.sync_data().map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.dir))
    }

    /// The coordinator has answered this outcome: it leaves the journal (blocking).
    pub fn remove(&self, attempt: AttemptId) -> Result<(), OutcomesError> {
        let path = self.path_of(attempt);
        if let Ok(mut spares) = self.spares.paths.lock()
            && spares.len() < MAX_SPARES
        {
            let n = self.spares.next.fetch_add(1, Ordering::Relaxed);
            let spare = self
                .dir
                .join(format!("{SPARE_PREFIX}{}-{n}", self.spares.run));
            return match std::fs::rename(&path, &spare) {
                Ok(()) => {
                    spares.push(spare);
                    Ok(())
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io(&path)(e)),
            };
        }
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Whether the attempt's end is journalled and not yet taken out (reported).
    pub fn holds(&self, attempt: AttemptId) -> bool {
        self.path_of(attempt).exists()
    }

    /// The coordinator has answered this outcome, and no agent will read it: unlinked
    /// (blocking). For a supervisor that reported its end itself.
    pub fn discard(&self, attempt: AttemptId) -> Result<(), OutcomesError> {
        let path = self.path_of(attempt);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&path)(e)),
            _ => Ok(()),
        }
    }

    /// The outcomes an earlier run left unanswered (blocking), oldest end first. Temporary
    /// files of a write the kill cut short are removed (their report was never sent: the
    /// report is journalled before it is sent). An entry that cannot be read is returned as
    /// an error beside the others and left in place for a person to look at.
    pub fn pending(&self) -> Result<(Vec<Outcome>, Vec<OutcomesError>), OutcomesError> {
        let mut found = Vec::new();
        let mut bad = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let path = entry.map_err(io(&self.dir))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".json.tmp") {
                if let Err(e) = std::fs::remove_file(&path) {
                    bad.push(io(&path)(e));
                }
                continue;
            }
            if !name.ends_with(".json") {
                continue;
            }
            let read = std::fs::read(&path).map_err(io(&path)).and_then(|bytes| {
                serde_json::from_slice::<Outcome>(&bytes).map_err(|source| OutcomesError::Format {
                    path: path.clone(),
                    source,
                })
            });
            match read {
                Ok(o) => found.push(o),
                Err(e) => bad.push(e),
            }
        }
        found.sort_by_key(|o| o.report.ended_at);
        Ok((found, bad))
    }
}

/// TEST-ONLY: the pause of [`TEST_PAUSE_BEFORE_REPORT_VAR`], read once; unset (or not a
/// number of milliseconds) is no pause.
pub fn test_pause_before_report() -> Option<Duration> {
    static PAUSE: OnceLock<Option<Duration>> = OnceLock::new();
    *PAUSE.get_or_init(|| {
        let raw = std::env::var(TEST_PAUSE_BEFORE_REPORT_VAR).ok()?;
        match raw.trim().parse::<u64>() {
            Ok(ms) => {
                tracing::warn!(
                    "{TEST_PAUSE_BEFORE_REPORT_VAR}={ms}: end reports are held back (for tests only)"
                );
                Some(Duration::from_millis(ms))
            }
            Err(_) => {
                tracing::warn!(
                    "{TEST_PAUSE_BEFORE_REPORT_VAR}=`{raw}` is not a number of milliseconds; ignored"
                );
                None
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spares are named apart per run: a supervisor of an earlier run may still hold one of
    /// its spares as the temporary file it writes its outcome through.
    #[test]
    fn spares_of_two_runs_never_share_a_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut names = Vec::new();
        for _ in 0..2 {
            let journal = Outcomes::open(dir.path()).expect("open");
            let o = outcome(1, 0);
            journal.write(&o).expect("write");
            journal.remove(o.attempt).expect("remove");
            names.push(journal.take_spare().expect("a spare"));
        }
        assert_ne!(names[0], names[1], "{names:?}");
    }

    fn outcome(fence: i64, secs_ago: i64) -> Outcome {
        Outcome {
            attempt: AttemptId::new(),
            report: FinishReport {
                fence,
                failure: None,
                exit_code: Some(0),
                signal: None,
                ended_at: chrono::Utc::now() - chrono::Duration::seconds(secs_ago),
                peak_mem_mib: Some(10),
                peak_source: None,
                cleanup_ms: 1,
                cleanup_verified: true,
                unverified: None,
                contaminated: false,
                measurements: Default::default(),
                log_tail: "done".into(),
                gpus: vec![],
                prestart: None,
                background: None,
                host_peak_mib: None,
                started: None,
                metrics: None,
                memory_cap_mib: None,
                oom_cause: None,
            },
        }
    }

    #[test]
    fn journalled_outcomes_outlive_the_journal_until_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let j = Outcomes::open(dir.path()).expect("open");
        let (older, newer) = (outcome(3, 10), outcome(4, 1));
        j.write(&newer).expect("write");
        j.write(&older).expect("write");
        // A write a kill cut short, and an entry that is not an outcome.
        std::fs::write(dir.path().join("outcomes/x.json.tmp"), b"{\"att").expect("tmp");
        std::fs::write(dir.path().join("outcomes/y.json"), b"not json").expect("bad");

        let again = Outcomes::open(dir.path()).expect("reopen");
        let (found, bad) = again.pending().expect("pending");
        let ids: Vec<AttemptId> = found.iter().map(|o| o.attempt).collect();
        assert_eq!(ids, vec![older.attempt, newer.attempt], "oldest end first");
        assert_eq!(found[0].attempt_ref().fence, 3);
        assert_eq!(found[1].report.log_tail, "done");
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(matches!(bad[0], OutcomesError::Format { .. }));
        assert!(!dir.path().join("outcomes/x.json.tmp").exists());
        assert!(
            dir.path().join("outcomes/y.json").exists(),
            "left for a person"
        );

        again.remove(older.attempt).expect("remove");
        again.remove(older.attempt).expect("removing twice is fine");
        let (found, _) = again.pending().expect("pending");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].attempt, newer.attempt);
    }

    /// Answered files are reused, not unlinked and created again (each inode freed makes
    /// later creates slower on ext4 without a journal), and never read back as outcomes.
    #[test]
    fn answered_files_are_reused_for_the_next_outcome() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let j = Outcomes::open(dir.path()).expect("open");
        // Longer than the next: the reused file must not keep the end of it.
        let mut first = outcome(1, 2);
        first.report.log_tail = "a long last line of the log\n".repeat(40);
        j.write(&first).expect("write");
        let inode = std::fs::metadata(j.path_of(first.attempt))
            .expect("journalled")
            .ino();
        j.remove(first.attempt).expect("remove");
        assert!(
            !j.path_of(first.attempt).exists(),
            "answered: out of the journal"
        );
        // Another file created meanwhile (a job's log) would take an unlinked inode.
        let other = dir.path().join("outcomes/other");
        std::fs::write(&other, b"").expect("other file");
        let (found, bad) = j.pending().expect("pending");
        assert!(found.is_empty() && bad.is_empty(), "{found:?} {bad:?}");

        let second = outcome(2, 1);
        j.write(&second).expect("write");
        let reused = std::fs::metadata(j.path_of(second.attempt)).expect("journalled");
        assert_eq!(reused.ino(), inode, "the answered file's inode is reused");
        let (found, _) = j.pending().expect("pending");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].attempt, second.attempt);
        assert_eq!(
            found[0].report.fence, 2,
            "the reused file holds the new outcome only"
        );

        // A spare left by a killed run is neither an outcome nor kept by the next run.
        std::fs::remove_file(&other).expect("remove other");
        j.remove(second.attempt).expect("remove");
        drop(j);
        let again = Outcomes::open(dir.path()).expect("reopen");
        let (found, bad) = again.pending().expect("pending");
        assert!(found.is_empty() && bad.is_empty(), "{found:?} {bad:?}");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("outcomes"))
            .expect("dir")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
