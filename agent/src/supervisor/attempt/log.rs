//! The attempt's log file: opened for appending, headroom's own lines in it, and the tail
//! an attempt's end carries.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// Bytes of log kept in an attempt's end (`AttemptEnd::log_tail`).
pub(super) const TAIL_BYTES: u64 = 4096;

pub(super) fn open_log(path: &Path) -> io::Result<File> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    File::options().create(true).append(true).open(path)
}

/// Appends a line of the agent's own to the job's log, so that a user reading it sees why the
/// job stopped. Best effort: a full disk must not change the outcome.
/// Up to `max` bytes of the log at `path` from `offset` (for shipping it).
pub(crate) async fn read_from(path: &Path, offset: u64, max: u64) -> io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut f = tokio::fs::File::open(path).await?;
    f.seek(SeekFrom::Start(offset)).await?;
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf).await?;
    Ok(buf)
}

/// [`note`] in the log at `path`.
pub(crate) fn note_at(path: &Path, msg: &str) {
    if let Ok(log) = open_log(path) {
        note(&log, msg);
    }
}

pub(super) fn note(log: &File, msg: &str) {
    let mut log = log;
    let _ = log.write_all(format!("[headroom] {msg}\n").as_bytes());
}

/// The last [`TAIL_BYTES`] of the log written since `start`, from a line start when possible.
pub(super) fn read_tail(path: &Path, start: u64) -> String {
    let read = || -> io::Result<Vec<u8>> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        let from = start.max(len.saturating_sub(TAIL_BYTES));
        f.seek(SeekFrom::Start(from))?;
        let mut buf = Vec::with_capacity(usize::try_from(len - from).unwrap_or(0));
        f.take(TAIL_BYTES).read_to_end(&mut buf)?;
        if from > start {
            // Cut mid-line: drop the partial first line, unless that leaves too little.
            if let Some(nl) = buf.iter().position(|&b| b == b'\n')
                && nl < buf.len() / 2
            {
                buf.drain(..=nl);
            }
        }
        Ok(buf)
    };
    read()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}
