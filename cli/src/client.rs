//! The user-facing HTTP client: one method per REST call the CLI makes.

use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use headroom_shared::api::{
    CancelResponse, ErrorBody, ExperimentSummary, JobDetail, JobSummary, NodeView, Progress,
    SetPlanRequest, SubmitRequest, SubmitResponse,
};
use headroom_shared::{AttemptId, ExperimentId, JobId};
use serde::de::DeserializeOwned;

pub struct Api {
    http: reqwest::Client,
    base: String,
}

/// Log bytes and where the next read starts.
pub struct LogChunk {
    pub bytes: Vec<u8>,
    pub next: u64,
    pub ended: bool,
}

impl Api {
    pub fn new(base: &str) -> Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .build()?,
            base: base.trim_end_matches('/').to_string(),
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Result<T> {
        let resp = req.send().await.with_context(|| {
            format!(
                "cannot reach the coordinator at {} (is `headroom up` running? see --server)",
                self.base
            )
        })?;
        let status = resp.status();
        let text = resp.text().await?;
        if status.is_success() {
            return serde_json::from_str(&text)
                .with_context(|| format!("unexpected answer: {text}"));
        }
        Err(match serde_json::from_str::<ErrorBody>(&text) {
            Ok(b) => match b.error.field {
                Some(f) => anyhow!("{f}: {}", b.error.message),
                None => anyhow!("{}", b.error.message),
            },
            Err(_) => anyhow!("coordinator answered {status}: {text}"),
        })
    }

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.get(format!("{}{path}", self.base))
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.post(format!("{}{path}", self.base))
    }

    pub async fn submit(&self, req: &SubmitRequest) -> Result<SubmitResponse> {
        self.send(self.post("/v1/experiments").json(req)).await
    }

    pub async fn experiments(&self) -> Result<Vec<ExperimentSummary>> {
        self.send(self.get("/v1/experiments")).await
    }

    pub async fn experiment(&self, id: ExperimentId) -> Result<ExperimentSummary> {
        self.send(self.get(&format!("/v1/experiments/{id}"))).await
    }

    pub async fn jobs(
        &self,
        experiment: Option<ExperimentId>,
        state: Option<&str>,
    ) -> Result<Vec<JobSummary>> {
        let mut q: Vec<(&str, String)> = vec![];
        if let Some(e) = experiment {
            q.push(("experiment", e.to_string()));
        }
        if let Some(s) = state {
            q.push(("state", s.to_string()));
        }
        self.send(self.get("/v1/jobs").query(&q)).await
    }

    pub async fn job(&self, id: JobId) -> Result<JobDetail> {
        self.send(self.get(&format!("/v1/jobs/{id}"))).await
    }

    /// A job by id, `None` when no job has it (it may be an experiment).
    pub async fn find_job(&self, id: JobId) -> Result<Option<JobDetail>> {
        let resp = self.get(&format!("/v1/jobs/{id}")).send().await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        Ok(Some(resp.error_for_status()?.json().await?))
    }

    pub async fn cancel_job(&self, id: JobId) -> Result<CancelResponse> {
        self.send(self.post(&format!("/v1/jobs/{id}/cancel"))).await
    }

    pub async fn cancel_experiment(&self, id: ExperimentId) -> Result<CancelResponse> {
        self.send(self.post(&format!("/v1/experiments/{id}/cancel")))
            .await
    }

    pub async fn retry(&self, id: JobId) -> Result<serde_json::Value> {
        self.send(self.post(&format!("/v1/jobs/{id}/retry"))).await
    }

    pub async fn nodes(&self) -> Result<Vec<NodeView>> {
        self.send(self.get("/v1/nodes")).await
    }

    pub async fn set_plan(&self, node: &str, plan: &str) -> Result<NodeView> {
        let req = SetPlanRequest {
            plan: plan.to_string(),
        };
        self.send(
            self.http
                .put(format!("{}/v1/nodes/{node}/plan", self.base))
                .json(&req),
        )
        .await
    }

    pub async fn release_gpu(&self, node: &str, gpu: u32) -> Result<u64> {
        let v: serde_json::Value = self
            .send(self.post(&format!("/v1/nodes/{node}/gpus/{gpu}/release")))
            .await?;
        Ok(v["released"].as_u64().unwrap_or(0))
    }

    pub async fn progress(
        &self,
        experiment: Option<ExperimentId>,
        after: Option<u64>,
    ) -> Result<Progress> {
        let mut q: Vec<(&str, String)> = vec![("timeout_ms", "10000".into())];
        if let Some(e) = experiment {
            q.push(("experiment", e.to_string()));
        }
        if let Some(a) = after {
            q.push(("after", a.to_string()));
        }
        self.send(self.get("/v1/progress").query(&q)).await
    }

    pub async fn export_csv(&self, experiment: Option<ExperimentId>) -> Result<String> {
        let mut req = self.get("/v1/export");
        if let Some(e) = experiment {
            req = req.query(&[("experiment", e.to_string())]);
        }
        let resp = req.send().await?;
        if !resp.status().is_success() {
            return Err(anyhow!("export failed: {}", resp.text().await?));
        }
        Ok(resp.text().await?)
    }

    pub async fn log(&self, attempt: AttemptId, offset: u64, wait_ms: u64) -> Result<LogChunk> {
        let resp = self
            .get(&format!("/v1/attempts/{attempt}/log"))
            .query(&[
                ("offset", offset.to_string()),
                ("wait_ms", wait_ms.to_string()),
            ])
            .send()
            .await?;
        if !resp.status().is_success() {
            return Err(anyhow!("log: {}", resp.text().await?));
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let next = header("x-log-offset")
            .and_then(|v| v.parse().ok())
            .unwrap_or(offset);
        let ended = header("x-attempt-ended").as_deref() == Some("true");
        Ok(LogChunk {
            bytes: resp.bytes().await?.to_vec(),
            next,
            ended,
        })
    }
}
