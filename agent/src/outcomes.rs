//! The outcome journal: each attempt's end report, kept in `<data dir>/outcomes/` from the
//! moment the attempt ended until the coordinator has answered it, so that an agent killed
//! in between (`kill -9`, OOM killer, crash) reports it on its next run instead of leaving
//! the attempt to be recorded lost and run again.
//!
//! One small file per attempt, written to a temporary name and renamed, so a reader finds
//! a whole report or none. There is no fsync: the journal guards against a killed agent,
//! whose written pages the kernel still holds, not against power loss, and an fsync per
//! job would slow dispatch down.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
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

/// The journal directory of one agent.
#[derive(Clone, Debug)]
pub struct Outcomes {
    dir: PathBuf,
}

impl Outcomes {
    /// Opens (creates) `<data_dir>/outcomes` (blocking).
    pub fn open(data_dir: &Path) -> Result<Self, OutcomesError> {
        let dir = data_dir.join("outcomes");
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        Ok(Self { dir })
    }

    fn path_of(&self, attempt: AttemptId) -> PathBuf {
        self.dir.join(format!("{attempt}.json"))
    }

    /// Journals an outcome (blocking): written whole under a temporary name, then renamed.
    pub fn write(&self, outcome: &Outcome) -> Result<(), OutcomesError> {
        let path = self.path_of(outcome.attempt);
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec(outcome).map_err(|source| OutcomesError::Format {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))
    }

    /// The coordinator has answered this outcome: it leaves the journal (blocking).
    pub fn remove(&self, attempt: AttemptId) -> Result<(), OutcomesError> {
        let path = self.path_of(attempt);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&path)(e)),
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
                log_tail: "done".into(),
                gpus: vec![],
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
}
