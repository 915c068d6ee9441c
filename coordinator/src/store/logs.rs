//! Attempt logs, kept in the store so that coordinator replicas share nothing but the
//! database: appended at the offset their sender names (an agent's and its supervisor's
//! chunks of the same bytes are written once, whoever sends them first), and kept to a
//! bound per attempt: past it, a line saying so, and the rest is taken and dropped (the
//! node's own file keeps it).

use headroom_shared::AttemptId;

use super::tx::Tx;
use super::{Result, StoreError};
use crate::changes::Change;

/// The most an attempt's log keeps, by default.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 64 * 1024 * 1024;

/// The line that ends a log cut at `max` bytes of output.
pub fn cut_line(max: u64) -> String {
    format!(
        "\n[headroom: this log is cut here, at {} of output (the coordinator's \
         --max-log-size); the rest is in the attempt's log file on its node]\n",
        bytesize::ByteSize::b(max).display().iec()
    )
}

/// Appends `bytes`, which start at `offset` of the sender's log, keeping `max` bytes of
/// output at most; how much of the sender's log is taken (past the bound, the sender's own
/// end, so that it moves on).
pub(super) async fn append(
    tx: &mut dyn Tx,
    attempt: AttemptId,
    offset: u64,
    bytes: Vec<u8>,
    max: u64,
) -> Result<(u64, Change)> {
    let id = attempt.to_string();
    let (kept, cut) = tx.lock_log(&id).await?;
    let end = offset.saturating_add(bytes.len() as u64);
    if cut {
        return Ok((kept.max(end), Change::None));
    }
    if offset > kept {
        return Err(StoreError::Invalid {
            field: "offset".into(),
            message: format!(
                "log chunk at offset {offset} leaves a gap: the log holds {kept} bytes"
            ),
        });
    }
    let skip = usize::try_from(kept - offset).unwrap_or(usize::MAX);
    let Some(new) = bytes.get(skip..).filter(|n| !n.is_empty()) else {
        return Ok((kept.max(end), Change::None));
    };
    let room = usize::try_from(max.saturating_sub(kept)).unwrap_or(usize::MAX);
    let (chunk, cut) = if new.len() <= room {
        (new.to_vec(), false)
    } else {
        let mut c = new[..room].to_vec();
        c.extend_from_slice(cut_line(max).as_bytes());
        (c, true)
    };
    tx.insert_log_chunk(&id, kept, &chunk).await?;
    tx.set_log(&id, kept + chunk.len() as u64, cut).await?;
    // Followers (`logs -f`) wake on it, on every replica.
    Ok((kept.max(end), Change::Shown))
}

/// Up to `max` bytes of the kept log from `offset`; empty when nothing is there (yet).
pub(super) async fn read(
    tx: &mut dyn Tx,
    attempt: AttemptId,
    offset: u64,
    max: u64,
) -> Result<Vec<u8>> {
    let to = offset.saturating_add(max);
    let mut out = Vec::new();
    for (at, data) in tx.log_chunks(&attempt.to_string(), offset, to).await? {
        let from = usize::try_from(offset.saturating_sub(at)).unwrap_or(usize::MAX);
        let until = usize::try_from(to.saturating_sub(at)).unwrap_or(usize::MAX);
        if let Some(part) = data.get(from.min(data.len())..until.min(data.len())) {
            out.extend_from_slice(part);
        }
    }
    Ok(out)
}
