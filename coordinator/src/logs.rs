//! Attempt logs that a coordinator of an earlier version kept as files beside its store
//! (`<data dir>/logs/<attempt>.log`), read where the store holds none of an attempt's log.
//! New logs live in the store (`store::logs`), which coordinator replicas share.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use headroom_shared::AttemptId;

/// Up to `max` bytes from `offset` of the attempt's log file under `data_dir`; empty when
/// there is none.
pub fn read_legacy(
    data_dir: &Path,
    attempt: AttemptId,
    offset: u64,
    max: u64,
) -> std::io::Result<Vec<u8>> {
    let path = data_dir.join("logs").join(format!("{attempt}.log"));
    let mut f = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e),
    };
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_versions_log_file_is_read_by_offset() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let a = AttemptId::new();
        fs::create_dir(dir.path().join("logs"))?;
        fs::write(
            dir.path().join("logs").join(format!("{a}.log")),
            "hello world",
        )?;
        assert_eq!(read_legacy(dir.path(), a, 6, 3)?, b"wor");
        assert!(read_legacy(dir.path(), AttemptId::new(), 0, 10)?.is_empty());
        Ok(())
    }
}
