//! Nodes: their statements, over `Exec`.

use async_trait::async_trait;
use headroom_shared::api::{GpuInfo, GpuSample, Headroom, QuarantineView};
use headroom_shared::{AgentId, Plan};

use super::super::exec::{Arg, Exec, json};
use super::super::rows::{self, Cols, NodeRow};
use super::super::tx::NodesTx;
use super::super::{Millis, Result};
use super::{all, done, first, text};

#[async_trait]
impl<E: Exec> NodesTx for E {
    async fn node_of_agent(&mut self, agent: AgentId, lock: bool) -> Result<Option<NodeRow>> {
        let lock = if lock { self.dialect().lock } else { "" };
        let sql = format!(
            "SELECT {} FROM nodes WHERE agent_id = $1{lock}",
            rows::NODE_COLUMNS
        );
        first(self, &sql, args![&agent.to_string()], |r| rows::node(r)).await
    }

    async fn lock_node_of_attempt(&mut self, attempt: &str) -> Result<Option<String>> {
        let sql = format!(
            "SELECT n.name FROM nodes n JOIN attempts a ON a.node = n.name WHERE a.id = $1{}",
            self.dialect().lock_node
        );
        first(self, &sql, args![attempt], text).await
    }

    async fn node_of_attempt(&mut self, attempt: &str) -> Result<Option<String>> {
        let sql = "SELECT node FROM attempts WHERE id = $1";
        first(self, sql, args![attempt], text).await
    }

    async fn node_holder(
        &mut self,
        node: &str,
    ) -> Result<Option<(Option<String>, Option<Millis>)>> {
        let sql = "SELECT agent_id, last_seen FROM nodes WHERE name = $1";
        first(self, sql, args![node], |r| {
            Ok((r.text_opt(0)?, r.int_opt(1)?))
        })
        .await
    }

    async fn forget_node_seen(&mut self, node: &str) -> Result<u64> {
        let sql = "UPDATE nodes SET last_seen = NULL WHERE name = $1";
        self.execute(sql, args![node]).await
    }

    async fn lock_node_settings(&mut self, node: &str) -> Result<Option<(String, String)>> {
        let sql = format!(
            "SELECT plan, headroom FROM nodes WHERE name = $1{}",
            self.dialect().lock
        );
        first(self, &sql, args![node], |r| Ok((r.text(0)?, r.text(1)?))).await
    }

    async fn node_gpus(&mut self, node: &str, lock: bool) -> Result<Option<Vec<GpuInfo>>> {
        let lock = if lock { self.dialect().lock } else { "" };
        let sql = format!("SELECT gpus FROM nodes WHERE name = $1{lock}");
        first(self, &sql, args![node], |r| r.json(0)).await
    }

    async fn nodes(&mut self) -> Result<Vec<NodeRow>> {
        let sql = format!("SELECT {} FROM nodes ORDER BY name", rows::NODE_COLUMNS);
        all(self, &sql, &[], |r| rows::node(r)).await
    }

    async fn upsert_node(
        &mut self,
        node: &str,
        agent: AgentId,
        gpus: &[GpuInfo],
        plan: &Plan,
        headroom: &Headroom,
        now: Millis,
    ) -> Result<()> {
        done(
            self,
            "INSERT INTO nodes (name, agent_id, gpus, plan, headroom, last_seen, registered_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6) \
             ON CONFLICT (name) DO UPDATE SET agent_id = $2, gpus = $3, plan = $4, \
             headroom = $5, last_seen = $6, registered_at = $6, telemetry = NULL, \
             lost_alerted = 0",
            args![
                node,
                &agent.to_string(),
                json(&gpus)?,
                &plan.to_string(),
                &headroom.to_string(),
                now
            ],
        )
        .await
    }

    async fn set_host_memory(&mut self, node: &str, mib: Option<u64>) -> Result<()> {
        let sql = "UPDATE nodes SET host_memory_mib = $2 WHERE name = $1";
        done(self, sql, args![node, mib.map(rows::i64_of)]).await
    }

    async fn set_plan(&mut self, node: &str, plan: &Plan) -> Result<()> {
        let sql = "UPDATE nodes SET plan = $1 WHERE name = $2";
        done(self, sql, args![&plan.to_string(), node]).await
    }

    async fn set_node_samples(
        &mut self,
        node: &str,
        gpus: &[GpuSample],
        now: Millis,
    ) -> Result<()> {
        // A node heard of again may be told of when it is lost again.
        let sql =
            "UPDATE nodes SET telemetry = $1, last_seen = $2, lost_alerted = 0 WHERE name = $3";
        done(self, sql, args![json(&gpus)?, now, node]).await
    }

    async fn set_end_samples(&mut self, node: &str, gpus: &[GpuSample]) -> Result<()> {
        // The database's clock, where it has one, is read in the statement itself: no round
        // trip of its own.
        let clock = self.dialect().clock;
        let sql = format!(
            "INSERT INTO node_end_samples (node, samples, at) VALUES ($1, $2, {}) \
             ON CONFLICT (node) DO UPDATE SET samples = excluded.samples, at = excluded.at",
            clock.unwrap_or("$3")
        );
        let all = args![node, json(&gpus)?, super::super::now_ms()];
        let args = if clock.is_some() { &all[..2] } else { all };
        done(self, &sql, args).await
    }

    async fn end_samples(&mut self, node: &str) -> Result<Option<(Vec<GpuSample>, Millis)>> {
        let sql = "SELECT samples, at FROM node_end_samples WHERE node = $1";
        first(self, sql, args![node], |r| Ok((r.json(0)?, r.int(1)?))).await
    }

    async fn max_node_gpus(&mut self) -> Result<Option<u32>> {
        let sql = format!(
            "SELECT CAST(MAX({}(gpus)) AS BIGINT) FROM nodes",
            self.dialect().json_array_length
        );
        let max = first(self, &sql, &[], |r| r.int_opt(0)).await?.flatten();
        Ok(max.map(|n| n.max(0) as u32))
    }

    async fn blocked_gpus(&mut self, node: &str, now: Millis) -> Result<Vec<u32>> {
        all(
            self,
            "SELECT gpu FROM quarantine WHERE node = $1 \
             UNION SELECT gpu FROM gpu_avoid WHERE node = $1 AND until_ms > $2",
            args![node, now],
            |r| Ok(r.int(0)? as u32),
        )
        .await
    }

    async fn quarantine_of(&mut self, node: &str) -> Result<Vec<(u32, QuarantineView)>> {
        let sql = "SELECT gpu, attempt_id, reason, since FROM quarantine WHERE node = $1 \
                   ORDER BY since";
        all(self, sql, args![node], |r| rows::quarantine(r)).await
    }

    async fn quarantine(
        &mut self,
        node: &str,
        gpu: u32,
        attempt: &str,
        reason: &str,
        now: Millis,
    ) -> Result<()> {
        done(
            self,
            "INSERT INTO quarantine (node, gpu, attempt_id, reason, since) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (node, gpu, attempt_id) \
             DO UPDATE SET reason = excluded.reason, since = excluded.since",
            args![node, gpu, attempt, reason, now],
        )
        .await
    }

    async fn avoid_gpu(&mut self, node: &str, gpu: u32, until: Millis) -> Result<()> {
        done(
            self,
            "INSERT INTO gpu_avoid (node, gpu, until_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (node, gpu) DO UPDATE SET until_ms = excluded.until_ms",
            args![node, gpu, until],
        )
        .await
    }

    async fn release_quarantine_of(&mut self, node: &str, attempts: &[String]) -> Result<u64> {
        let sql = "DELETE FROM quarantine WHERE node = $1 AND attempt_id = $2";
        let mut n = 0;
        for a in attempts {
            n += self.execute(sql, args![node, a]).await?;
        }
        Ok(n)
    }

    async fn release_quarantine_on(&mut self, node: &str, gpu: u32) -> Result<u64> {
        let sql = "DELETE FROM quarantine WHERE node = $1 AND gpu = $2";
        self.execute(sql, args![node, gpu]).await
    }
}
