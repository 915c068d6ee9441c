//! Telemetry series: their statements, over `Exec`.

use async_trait::async_trait;
use headroom_shared::api::TelemetrySample;

use super::super::exec::{Arg, Exec};
use super::super::rows::{self, Cols, i64_of};
use super::super::tx::TelemetryTx;
use super::super::{Millis, Result, SeriesWindow};
use super::{all, first};

#[async_trait]
impl<E: Exec> TelemetryTx for E {
    async fn insert_telemetry(&mut self, node: &str, samples: &[TelemetrySample]) -> Result<u64> {
        self.insert_samples(node, samples).await
    }

    async fn series(
        &mut self,
        node: &str,
        gpu: u32,
        w: &SeriesWindow,
    ) -> Result<Vec<TelemetrySample>> {
        let sql = format!(
            "SELECT {} FROM gpu_telemetry WHERE node = $1 AND gpu = $2 AND at >= $3 \
             AND at <= $4 ORDER BY at DESC, id DESC LIMIT $5",
            rows::TELEMETRY_COLUMNS
        );
        let args = args![node, gpu, w.since, w.until, w.limit];
        let mut out = all(self, &sql, args, |r| rows::telemetry_sample(r)).await?;
        out.reverse();
        Ok(out)
    }

    async fn prune_older(&mut self, older_than: Millis, batch: u32) -> Result<u64> {
        let sql = "DELETE FROM gpu_telemetry WHERE id IN \
                   (SELECT id FROM gpu_telemetry WHERE at < $1 ORDER BY at LIMIT $2)";
        self.execute(sql, args![older_than, batch]).await
    }

    async fn series_cutoff(
        &mut self,
        node: &str,
        gpu: u32,
        keep: u64,
    ) -> Result<Option<(i64, i64)>> {
        first(
            self,
            "SELECT at, id FROM gpu_telemetry WHERE node = $1 AND gpu = $2 \
             ORDER BY at DESC, id DESC LIMIT 1 OFFSET $3",
            args![node, gpu, i64_of(keep)],
            |r| Ok((r.int(0)?, r.int(1)?)),
        )
        .await
    }

    async fn prune_to(
        &mut self,
        node: &str,
        gpu: u32,
        (at, id): (i64, i64),
        batch: u32,
    ) -> Result<u64> {
        let sql = "DELETE FROM gpu_telemetry WHERE id IN \
                   (SELECT id FROM gpu_telemetry WHERE node = $1 AND gpu = $2 \
                    AND (at < $3 OR (at = $3 AND id <= $4)) ORDER BY at LIMIT $5)";
        self.execute(sql, args![node, gpu, at, id, batch]).await
    }
}
