//! Attempt logs as shipped by agents (and, while an agent is away, by the attempt's
//! supervisor): one file per attempt under the coordinator's data directory, appended at the
//! offset the sender names so a resent chunk is written once, whoever sends it, and kept to
//! a bound per attempt: past it, a line saying so, and the rest is taken and dropped (the
//! node's own copy of the log keeps it).

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use headroom_shared::AttemptId;

use crate::changes::{Change, Changes};

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("log chunk at offset {offset} leaves a gap: the log holds {len} bytes")]
    Gap { offset: u64, len: u64 },
    #[error("log file: {0}")]
    Io(#[from] std::io::Error),
}

/// The most an attempt's log keeps here, by default.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Clone)]
pub struct LogStore {
    dir: PathBuf,
    /// The most bytes of an attempt's output kept (the truncation line comes after them).
    max: u64,
    /// Bumped when a log grows, for `logs -f`.
    changes: Changes,
    /// Appends one at a time: an agent and a supervisor may ship the same bytes at once, and
    /// each reads the length before it writes.
    appending: Arc<Mutex<()>>,
}

impl LogStore {
    /// Logs under `dir`, each kept to `max` bytes of output.
    pub fn new(dir: PathBuf, max: u64) -> Result<Self, LogError> {
        fs::create_dir_all(&dir)?;
        Ok(Self {
            dir,
            max,
            changes: Changes::default(),
            appending: Arc::default(),
        })
    }

    /// The counter followers wait on; every append that adds bytes bumps it.
    pub fn changes(&self) -> &Changes {
        &self.changes
    }

    fn path(&self, attempt: AttemptId) -> PathBuf {
        self.dir.join(format!("{attempt}.log"))
    }

    /// Appends `bytes` that start at `offset` of the agent's log; returns how much of the
    /// agent's log is taken (its length here, or past the bound the sender's own end).
    pub fn append(&self, attempt: AttemptId, offset: u64, bytes: &[u8]) -> Result<u64, LogError> {
        let _one_at_a_time = self
            .appending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut f = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(self.path(attempt))?;
        let len = f.metadata()?.len();
        let end = offset.saturating_add(bytes.len() as u64);
        if len > self.max {
            // Past the bound, its line written: taken, and dropped.
            return Ok(len.max(end));
        }
        if offset > len {
            return Err(LogError::Gap { offset, len });
        }
        let skip = (len - offset) as usize;
        if skip < bytes.len() {
            let new = &bytes[skip..];
            let room = usize::try_from(self.max - len).unwrap_or(usize::MAX);
            if new.len() <= room {
                f.write_all(new)?;
            } else {
                f.write_all(&new[..room])?;
                f.write_all(self.truncated_line().as_bytes())?;
            }
            self.changes.bump(Change::Shown);
        }
        Ok(len.max(end))
    }

    fn truncated_line(&self) -> String {
        format!(
            "\n[headroom: this log is cut here, at {} of output (the coordinator's \
             --max-log-size); the rest is in the attempt's log file on its node]\n",
            bytesize::ByteSize::b(self.max).display().iec()
        )
    }

    /// Up to `max` bytes from `offset`; empty when nothing is there (yet).
    pub fn read(&self, attempt: AttemptId, offset: u64, max: usize) -> Result<Vec<u8>, LogError> {
        let mut f = match fs::File::open(self.path(attempt)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(e.into()),
        };
        f.seek(SeekFrom::Start(offset))?;
        let mut buf = Vec::new();
        f.take(max as u64).read_to_end(&mut buf)?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resent_chunks_are_written_once() -> Result<(), LogError> {
        let dir = tempfile::tempdir()?;
        let logs = LogStore::new(dir.path().to_path_buf(), DEFAULT_MAX_LOG_BYTES)?;
        let a = AttemptId::new();
        assert_eq!(logs.append(a, 0, b"hello ")?, 6);
        assert_eq!(logs.append(a, 0, b"hello ")?, 6);
        assert_eq!(logs.append(a, 3, b"lo world")?, 11);
        assert_eq!(logs.read(a, 0, 100)?, b"hello world");
        assert_eq!(logs.read(a, 6, 3)?, b"wor");
        assert!(matches!(
            logs.append(a, 50, b"x"),
            Err(LogError::Gap { .. })
        ));
        assert!(logs.read(AttemptId::new(), 0, 10)?.is_empty());
        Ok(())
    }

    /// A log past its bound keeps its first bytes and a line saying it was cut; the sender
    /// is told it was all taken (so it moves on), resent chunks change nothing, and a log
    /// ending exactly at the bound is cut only once more output comes.
    #[test]
    fn a_log_is_kept_to_its_bound_with_a_line_saying_so() -> Result<(), LogError> {
        let dir = tempfile::tempdir()?;
        let logs = LogStore::new(dir.path().to_path_buf(), 10)?;
        let a = AttemptId::new();
        assert_eq!(logs.append(a, 0, b"0123456")?, 7);
        assert_eq!(logs.append(a, 7, b"789abcdef")?, 16);
        let kept = String::from_utf8(logs.read(a, 0, 1000)?).expect("text");
        assert!(
            kept.starts_with("0123456789\n[headroom: this log is cut here, at 10 B"),
            "{kept}"
        );
        assert!(kept.contains("--max-log-size"), "{kept}");
        assert_eq!(logs.append(a, 16, &[b'x'; 5000])?, 5016);
        assert_eq!(logs.append(a, 7, b"789abcdef")?, kept.len() as u64);
        assert_eq!(
            String::from_utf8(logs.read(a, 0, 10_000)?).expect("text"),
            kept
        );

        let b = AttemptId::new();
        assert_eq!(logs.append(b, 0, b"0123456789")?, 10);
        assert_eq!(logs.read(b, 0, 100)?, b"0123456789");
        logs.append(b, 10, b"more")?;
        let cut = String::from_utf8(logs.read(b, 0, 1000)?).expect("text");
        assert!(
            cut.starts_with("0123456789\n[headroom: this log is cut"),
            "{cut}"
        );
        Ok(())
    }
}
