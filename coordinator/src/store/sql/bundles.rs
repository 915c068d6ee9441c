//! Code bundles: their statements, over `Exec`.

use async_trait::async_trait;

use super::super::exec::{Arg, Exec};
use super::super::rows::Cols;
use super::super::tx::BundlesTx;
use super::super::{Millis, Result};
use super::first;

#[async_trait]
impl<E: Exec> BundlesTx for E {
    async fn insert_bundle(
        &mut self,
        hash: &str,
        data: &[u8],
        by: &str,
        now: Millis,
    ) -> Result<bool> {
        let n = self
            .execute(
                "INSERT INTO bundles (hash, data, bytes, created_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (hash) DO NOTHING",
                &[
                    Arg::from(hash),
                    Arg::Bytes(data),
                    Arg::from(i64::try_from(data.len()).unwrap_or(i64::MAX)),
                    Arg::from(now),
                ],
            )
            .await?;
        self.execute(
            "INSERT INTO bundle_uploads (hash, uploaded_by) VALUES ($1, $2) \
             ON CONFLICT (hash, uploaded_by) DO NOTHING",
            args![hash, by],
        )
        .await?;
        Ok(n > 0)
    }

    async fn bundle_size(&mut self, hash: &str, uploaded_by: Option<&str>) -> Result<Option<u64>> {
        first(
            self,
            "SELECT b.bytes FROM bundles b WHERE b.hash = $1 AND (CAST($2 AS TEXT) IS NULL \
             OR EXISTS (SELECT 1 FROM bundle_uploads u WHERE u.hash = b.hash \
             AND u.uploaded_by = $2))",
            args![hash, uploaded_by],
            |r| Ok(u64::try_from(r.int(0)?).unwrap_or(0)),
        )
        .await
    }

    async fn bundle_leased_to(&mut self, hash: &str, node: &str) -> Result<bool> {
        // Through the node's live attempts (an index of their own), then their experiments.
        let found = first(
            self,
            "SELECT 1 FROM attempts a JOIN jobs j ON j.id = a.job_id \
             JOIN experiments e ON e.id = j.experiment_id \
             WHERE a.node = $1 AND a.phase != 'ended' \
             AND e.source -> 'snapshot' ->> 'hash' = $2 LIMIT 1",
            args![node, hash],
            |_| Ok(()),
        )
        .await?;
        Ok(found.is_some())
    }

    async fn bundle_data(&mut self, hash: &str) -> Result<Option<Vec<u8>>> {
        first(
            self,
            "SELECT data FROM bundles WHERE hash = $1",
            args![hash],
            |r| r.bytes(0),
        )
        .await
    }
}
