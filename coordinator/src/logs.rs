//! Attempt logs as shipped by agents (and, while an agent is away, by the attempt's
//! supervisor): one file per attempt under the coordinator's data directory, appended at the
//! offset the sender names so a resent chunk is written once, whoever sends it.

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

#[derive(Clone)]
pub struct LogStore {
    dir: PathBuf,
    /// Bumped when a log grows, for `logs -f`.
    changes: Changes,
    /// Appends one at a time: an agent and a supervisor may ship the same bytes at once, and
    /// each reads the length before it writes.
    appending: Arc<Mutex<()>>,
}

impl LogStore {
    pub fn new(dir: PathBuf) -> Result<Self, LogError> {
        fs::create_dir_all(&dir)?;
        Ok(Self {
            dir,
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

    /// Appends `bytes` that start at `offset` of the agent's log; returns the new length.
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
        if offset > len {
            return Err(LogError::Gap { offset, len });
        }
        let skip = (len - offset) as usize;
        if skip < bytes.len() {
            f.write_all(&bytes[skip..])?;
            self.changes.bump(Change::Shown);
        }
        Ok(len.max(offset + bytes.len() as u64))
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
        let logs = LogStore::new(dir.path().to_path_buf())?;
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
}
