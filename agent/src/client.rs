//! The coordinator client: the agent protocol over HTTP, one pooled connection set.

use std::time::Duration;

use headroom_shared::api::{
    ClaimRequest, ClaimResponse, ErrorBody, FinishReport, FinishResponse, HandBackRequest,
    HeartbeatRequest, HeartbeatResponse, RegisterRequest, RegisterResponse, StartReport,
};
use headroom_shared::{AgentId, AttemptId};
use reqwest::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The coordinator could not be reached (or answered garbage): worth retrying.
    #[error("coordinator unreachable: {0}")]
    Unreachable(#[from] reqwest::Error),
    /// Our fencing token is stale: the lease is someone else's now.
    #[error("stale lease: {0}")]
    Stale(String),
    /// The coordinator no longer knows this agent: register again.
    #[error("agent unknown to the coordinator: {0}")]
    UnknownAgent(String),
    #[error("coordinator refused ({status}): {message}")]
    Refused { status: StatusCode, message: String },
}

impl ClientError {
    /// Transient: retry with backoff.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable(_) => true,
            ClientError::Refused { status, .. } => status.is_server_error(),
            _ => false,
        }
    }
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    pub fn new(base: &str) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(90))
            .build()?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
        })
    }

    async fn post<B: Serialize, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<R, ClientError> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .timeout(timeout)
            .json(body)
            .send()
            .await?;
        decode(resp).await
    }

    pub async fn register(&self, req: &RegisterRequest) -> Result<RegisterResponse, ClientError> {
        self.post("/v1/agents/register", req, Duration::from_secs(30))
            .await
    }

    pub async fn claim(
        &self,
        agent: AgentId,
        req: &ClaimRequest,
    ) -> Result<ClaimResponse, ClientError> {
        let timeout = Duration::from_millis(req.wait_ms) + Duration::from_secs(15);
        self.post(&format!("/v1/agents/{agent}/claim"), req, timeout)
            .await
    }

    pub async fn heartbeat(
        &self,
        agent: AgentId,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, ClientError> {
        self.post(
            &format!("/v1/agents/{agent}/heartbeat"),
            req,
            Duration::from_secs(10),
        )
        .await
    }

    pub async fn start(&self, attempt: AttemptId, req: &StartReport) -> Result<(), ClientError> {
        let _: serde_json::Value = self
            .post(
                &format!("/v1/attempts/{attempt}/start"),
                req,
                Duration::from_secs(10),
            )
            .await?;
        Ok(())
    }

    pub async fn finish(
        &self,
        attempt: AttemptId,
        req: &FinishReport,
    ) -> Result<FinishResponse, ClientError> {
        self.post(
            &format!("/v1/attempts/{attempt}/finish"),
            req,
            Duration::from_secs(10),
        )
        .await
    }

    pub async fn hand_back(
        &self,
        attempt: AttemptId,
        req: &HandBackRequest,
    ) -> Result<(), ClientError> {
        let _: serde_json::Value = self
            .post(
                &format!("/v1/attempts/{attempt}/handback"),
                req,
                Duration::from_secs(10),
            )
            .await?;
        Ok(())
    }

    /// Ships log bytes that start at `offset` of the attempt's log.
    pub async fn append_log(
        &self,
        attempt: AttemptId,
        fence: i64,
        offset: u64,
        bytes: Vec<u8>,
    ) -> Result<(), ClientError> {
        let resp = self
            .http
            .post(format!("{}/v1/attempts/{attempt}/log", self.base))
            .query(&[("fence", fence.to_string()), ("offset", offset.to_string())])
            .timeout(Duration::from_secs(30))
            .body(bytes)
            .send()
            .await?;
        let _: serde_json::Value = decode(resp).await?;
        Ok(())
    }
}

async fn decode<R: DeserializeOwned>(resp: reqwest::Response) -> Result<R, ClientError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp.json().await?);
    }
    let text = resp.text().await.unwrap_or_default();
    let (code, message) = match serde_json::from_str::<ErrorBody>(&text) {
        Ok(b) => (b.error.code, b.error.message),
        Err(_) => (String::new(), text),
    };
    Err(match code.as_str() {
        "stale_fence" => ClientError::Stale(message),
        "unknown_agent" => ClientError::UnknownAgent(message),
        _ => ClientError::Refused { status, message },
    })
}
