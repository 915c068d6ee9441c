//! Attempt logs: their statements, over `Exec`.

use async_trait::async_trait;

use super::super::Result;
use super::super::exec::{Arg, Exec};
use super::super::rows::Cols;
use super::super::tx::LogsTx;
use super::{all, first};

fn i64_of(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl<E: Exec> LogsTx for E {
    async fn lock_log(&mut self, attempt: &str) -> Result<(u64, bool)> {
        // Made first, so that there is a row to lock; a concurrent first chunk's insert
        // waits on this one's until it commits, then finds the row.
        self.execute(
            "INSERT INTO attempt_logs (attempt_id, kept, cut) VALUES ($1, 0, $2) \
             ON CONFLICT (attempt_id) DO NOTHING",
            args![attempt, false],
        )
        .await?;
        let sql = format!(
            "SELECT kept, cut FROM attempt_logs WHERE attempt_id = $1{}",
            self.dialect().lock
        );
        first(self, &sql, args![attempt], |r| {
            Ok((u64::try_from(r.int(0)?).unwrap_or(0), r.flag(1)?))
        })
        .await?
        .ok_or_else(|| super::super::StoreError::Database("the log's row vanished".into()))
    }

    async fn set_log(&mut self, attempt: &str, kept: u64, cut: bool) -> Result<()> {
        self.execute(
            "UPDATE attempt_logs SET kept = $2, cut = $3 WHERE attempt_id = $1",
            args![attempt, i64_of(kept), cut],
        )
        .await?;
        Ok(())
    }

    async fn insert_log_chunk(&mut self, attempt: &str, at: u64, data: &[u8]) -> Result<()> {
        self.execute(
            "INSERT INTO attempt_log_chunks (attempt_id, at, data) VALUES ($1, $2, $3)",
            &[Arg::from(attempt), Arg::from(i64_of(at)), Arg::Bytes(data)],
        )
        .await?;
        Ok(())
    }

    async fn log_chunks(
        &mut self,
        attempt: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        // The chunk that holds `from` starts at or before it: the last one there, and every
        // one after it below `to`.
        all(
            self,
            "SELECT at, data FROM attempt_log_chunks WHERE attempt_id = $1 AND at < $3 \
             AND at >= COALESCE((SELECT MAX(at) FROM attempt_log_chunks \
             WHERE attempt_id = $1 AND at <= $2), 0) ORDER BY at",
            args![attempt, i64_of(from), i64_of(to)],
            |r| Ok((u64::try_from(r.int(0)?).unwrap_or(0), r.bytes(1)?)),
        )
        .await
    }
}
