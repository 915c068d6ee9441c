//! The typed HTTP client of the REST API (feature `client`): one pooled connection set, a
//! timeout on every call, errors decoded into `ErrorCode`s and classified once as transient
//! (retry with backoff) or permanent. Used by the agent, the CLI, the tests and the bench.

use std::fmt;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::MetricsQuery;
use crate::api::{
    Ack, AttemptSeries, AttemptTelemetry, CancelResponse, ClaimRequest, ClaimResponse,
    CreateTokenRequest, CreatedToken, ErrorBody, ErrorCode, ExperimentSummary, ExportQuery,
    FinishReport, FinishResponse, GpuSeries, HandBackRequest, Health, HeartbeatRequest,
    HeartbeatResponse, JobDetail, JobSummary, JobsQuery, LeaseRenewal, LeaseRenewed, LogAppended,
    LogChunkQuery, LogQuery, MetricsAnswer, MetricsReport, NodeView, Progress, ProgressQuery,
    RegisterRequest, RegisterResponse, Released, RetryResponse, SetPlanRequest, StartReport,
    SubmitRequest, SubmitResponse, TelemetryQuery, TokenView,
};
use crate::ids::{AgentId, AttemptId, ExperimentId, JobId};
use crate::routes::{
    self, BodyType, Endpoint, JsonAnswer, Method, NoBody, NoQuery, Query, RawBytes,
};

/// A path argument (an id, a node name); `Sync` so calls' futures stay `Send`.
type Arg<'a> = dyn fmt::Display + Sync + 'a;

/// A plain call's limit; long-polls get their wait on top of it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a code bundle's transfer may take (up to the default 100 MiB cap).
const BUNDLE_TIMEOUT: Duration = Duration::from_secs(300);
pub use crate::routes::SERVER_IDLE_CLOSE;
/// How long a client keeps an idle connection for reuse: at most half of
/// [`SERVER_IDLE_CLOSE`] (a test holds it to that), so
/// that no request is sent on a connection the coordinator is closing at that instant (it
/// would fail, and an agent's heartbeats, every 10 s with the default lease TTL, would meet
/// every close). httpx, under the Python client, keeps them 5 s too.
pub const POOL_IDLE: Duration = Duration::from_secs(5);
/// How long a claim asking to be held `wait_ms` is given to be answered: beyond its
/// long-poll, its turn at the store (10 s at most by default) and the store's own wait for
/// a connection (10 s); an answer given up on would strand the leases it carried.
pub fn claim_timeout(wait_ms: u64) -> Duration {
    Duration::from_millis(wait_ms) + DEFAULT_TIMEOUT
}

/// The longest `Retry-After` a client honours: a proxy's hour-long ask would park an agent
/// long past its leases.
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);

/// A `Retry-After` of delay-seconds (the form the coordinator sends; an HTTP date is not
/// read), capped at [`RETRY_AFTER_CAP`].
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(RETRY_AFTER_CAP))
}

/// How long `progress` holds a long-poll open by default.
pub const PROGRESS_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The coordinator could not be reached, timed out or hung up: worth retrying.
    #[error("cannot reach the coordinator at {base}: {source}")]
    Unreachable {
        base: String,
        #[source]
        source: reqwest::Error,
    },
    /// Our fencing token is stale: the lease is someone else's now. `attempt`: the one the
    /// coordinator named.
    #[error("stale lease: {message}")]
    Stale {
        message: String,
        attempt: Option<AttemptId>,
    },
    /// The coordinator no longer knows this agent: register again.
    #[error("agent unknown to the coordinator: {0}")]
    UnknownAgent(String),
    /// Any other refusal, with the server's code.
    #[error("{}", refusal_text(.field, .message))]
    Refused {
        status: u16,
        code: ErrorCode,
        message: String,
        field: Option<String>,
        /// How long the server asked to be left alone (`Retry-After` in seconds, capped at
        /// [`RETRY_AFTER_CAP`]).
        retry_after: Option<Duration>,
    },
    /// An answer this client cannot read (another version of headroom, a proxy's page).
    #[error("unexpected answer from {url} ({status}): {detail}")]
    Unexpected {
        url: String,
        status: u16,
        detail: String,
    },
    #[error("cannot build the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
    /// A token that cannot go in a header (a newline, a non-ASCII character).
    #[error("the token is not usable in an HTTP header (control or non-ASCII characters)")]
    BadToken,
    /// The CA file (`--ca-file`) cannot be used.
    #[error("CA file {}: {message}", path.display())]
    Ca {
        path: std::path::PathBuf,
        message: String,
    },
}

fn refusal_text(field: &Option<String>, message: &str) -> String {
    match field {
        Some(f) => format!("{f}: {message}"),
        None => message.to_string(),
    }
}

impl ClientError {
    /// The server's error code, when the server answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Stale { .. } => Some(ErrorCode::StaleFence),
            ClientError::UnknownAgent(_) => Some(ErrorCode::UnknownAgent),
            ClientError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The wait the server asked for before the same call is tried again (`Retry-After`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::Refused { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Transient: the same call may succeed later (retry with backoff). Everything else is
    /// permanent: retrying the same request gets the same answer.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } => true,
            ClientError::Refused { status, code, .. } => {
                *code == ErrorCode::StoreUnavailable || *status == 429 || *status >= 500
            }
            // A proxy's 502/503 page while the coordinator restarts.
            ClientError::Unexpected { status, .. } => *status >= 500,
            ClientError::Stale { .. }
            | ClientError::UnknownAgent(_)
            | ClientError::Build(_)
            | ClientError::BadToken
            | ClientError::Ca { .. } => false,
        }
    }
}

/// A bearer token as configured (flag, variable, file): `Debug` never shows it, and its
/// memory is wiped when it is dropped (`secrecy`).
#[derive(Clone)]
pub struct BearerToken(secrecy::SecretString);

impl BearerToken {
    pub fn expose(&self) -> &str {
        secrecy::ExposeSecret::expose_secret(&self.0)
    }
}

impl PartialEq for BearerToken {
    fn eq(&self, other: &Self) -> bool {
        use subtle::ConstantTimeEq;
        bool::from(self.expose().as_bytes().ct_eq(other.expose().as_bytes()))
    }
}

impl Eq for BearerToken {}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::str::FromStr for BearerToken {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.trim().into()))
    }
}

/// Log bytes and where the next read starts.
#[derive(Clone, Debug)]
pub struct LogChunk {
    pub bytes: Vec<u8>,
    pub next: u64,
    pub ended: bool,
}

/// A client of one coordinator. Cheap to clone: clones share the connection pool.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    /// `Bearer <token>`, marked sensitive so no debug output shows it.
    auth: Option<HeaderValue>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("base", &self.base).finish()
    }
}

/// An HTTP client builder with TLS ready and idle connections let go in time ([`POOL_IDLE`]):
/// every reqwest client of headroom's (and of its tests) is built from this, as TLS here is
/// rustls over ring, which must be the process's provider before a client is built (reqwest
/// panics otherwise).
pub fn http_builder() -> reqwest::ClientBuilder {
    // Once per process; a second install finds it done.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().pool_idle_timeout(POOL_IDLE)
}

impl Client {
    /// A client of the coordinator at `base` (`http://host:port` or `https://...`, trusted by
    /// the system's roots).
    pub fn new(base: &str) -> Result<Self, ClientError> {
        Self::new_with(base, None)
    }

    /// A client of the coordinator at `base`; an `https://` one is trusted by the system's
    /// roots and, when given, the certificates of `ca_file` (PEM: a lab's own CA, a
    /// self-signed proxy).
    pub fn new_with(base: &str, ca_file: Option<&std::path::Path>) -> Result<Self, ClientError> {
        let mut builder = http_builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_keepalive(Duration::from_secs(30));
        if let Some(path) = ca_file {
            let ca = |message: String| ClientError::Ca {
                path: path.to_path_buf(),
                message,
            };
            let pem = std::fs::read(path).map_err(|e| ca(e.to_string()))?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ca(e.to_string()))?;
            if certs.is_empty() {
                return Err(ca("holds no PEM certificate".to_string()));
            }
            builder = builder.tls_certs_merge(certs);
        }
        let http = builder.build().map_err(ClientError::Build)?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            auth: None,
        })
    }

    /// The same client sending `Authorization: Bearer <token>` on every call (none when
    /// `token` is `None` or blank).
    pub fn with_token(mut self, token: Option<&str>) -> Result<Self, ClientError> {
        self.auth = match token.map(str::trim).filter(|t| !t.is_empty()) {
            Some(t) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {t}"))
                    .map_err(|_| ClientError::BadToken)?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        Ok(self)
    }

    /// Whether calls carry a token.
    pub fn has_token(&self) -> bool {
        self.auth.is_some()
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn request<B, Q, A>(
        &self,
        ep: Endpoint<B, Q, A>,
        args: &[&Arg<'_>],
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        let route = ep.route;
        let args: Vec<&dyn fmt::Display> = args.iter().map(|a| *a as &dyn fmt::Display).collect();
        let url = format!("{}{}", self.base, route.path_with(&args));
        let method = match route.method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
        };
        self.authorized(self.http.request(method, url).timeout(timeout))
    }

    fn authorized(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.auth {
            Some(v) => req.header(AUTHORIZATION, v.clone()),
            None => req,
        }
    }

    /// Sends, and returns the headers and body of a 2xx answer, or the decoded error.
    async fn send_raw(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<(HeaderMap, Vec<u8>), ClientError> {
        let unreachable = |source| ClientError::Unreachable {
            base: self.base.clone(),
            source,
        };
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status().as_u16();
        let url = resp.url().to_string();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.map_err(unreachable)?;
        if (200..300).contains(&status) {
            return Ok((headers, body.to_vec()));
        }
        Err(match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(ErrorBody { error }) => match error.code {
                ErrorCode::StaleFence => ClientError::Stale {
                    message: error.message,
                    attempt: error.attempt,
                },
                ErrorCode::UnknownAgent => ClientError::UnknownAgent(error.message),
                code => ClientError::Refused {
                    status,
                    code,
                    message: error.message,
                    field: error.field,
                    retry_after: retry_after(&headers),
                },
            },
            Err(_) => ClientError::Unexpected {
                url,
                status,
                detail: String::from_utf8_lossy(&body).chars().take(500).collect(),
            },
        })
    }

    async fn send<R: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<R, ClientError> {
        let (_, body) = self.send_raw(req).await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Unexpected {
            url: self.base.clone(),
            status: 200,
            detail: format!("{e}: {}", String::from_utf8_lossy(&body)),
        })
    }

    /// `ep` with its JSON body, decoded as its answer.
    async fn call<B: BodyType, A: JsonAnswer>(
        &self,
        ep: Endpoint<B, NoQuery, A>,
        args: &[&Arg<'_>],
        body: Option<&B::Value>,
        timeout: Duration,
    ) -> Result<A::Value, ClientError>
    where
        B::Value: Serialize,
        A::Value: DeserializeOwned,
    {
        let mut req = self.request(ep, args, timeout);
        if let Some(b) = body {
            req = req.json(b);
        }
        self.send(req).await
    }

    async fn get<A: JsonAnswer>(
        &self,
        ep: Endpoint<NoBody, NoQuery, A>,
        args: &[&Arg<'_>],
    ) -> Result<A::Value, ClientError>
    where
        A::Value: DeserializeOwned,
    {
        self.call(ep, args, None, DEFAULT_TIMEOUT).await
    }

    /// `ep` with its query string, decoded as its answer.
    async fn get_query<Q: Serialize, A: JsonAnswer>(
        &self,
        ep: Endpoint<NoBody, Query<Q>, A>,
        args: &[&Arg<'_>],
        q: &Q,
        timeout: Duration,
    ) -> Result<A::Value, ClientError>
    where
        A::Value: DeserializeOwned,
    {
        self.send(self.request(ep, args, timeout).query(q)).await
    }

    // ---- people: experiments, jobs, nodes --------------------------------------------

    pub async fn health(&self) -> Result<Health, ClientError> {
        self.get(routes::HEALTH, &[]).await
    }

    pub async fn submit(&self, req: &SubmitRequest) -> Result<SubmitResponse, ClientError> {
        self.call(routes::SUBMIT, &[], Some(req), DEFAULT_TIMEOUT)
            .await
    }

    pub async fn experiments(&self) -> Result<Vec<ExperimentSummary>, ClientError> {
        self.get(routes::EXPERIMENTS, &[]).await
    }

    pub async fn experiment(&self, id: ExperimentId) -> Result<ExperimentSummary, ClientError> {
        self.get(routes::EXPERIMENT, &[&id]).await
    }

    /// Every attempt's metric series and final values.
    pub async fn experiment_metrics(
        &self,
        id: ExperimentId,
        query: &MetricsQuery,
    ) -> Result<Vec<AttemptSeries>, ClientError> {
        self.get_query(routes::EXPERIMENT_METRICS, &[&id], query, DEFAULT_TIMEOUT)
            .await
    }

    pub async fn cancel_experiment(&self, id: ExperimentId) -> Result<CancelResponse, ClientError> {
        let q = crate::api::CancelQuery::default();
        self.get_query(routes::CANCEL_EXPERIMENT, &[&id], &q, DEFAULT_TIMEOUT)
            .await
    }

    /// Stops the experiment's running jobs after their checkpoint signal and queues them
    /// again (`headroom cancel --requeue`).
    pub async fn requeue_experiment(
        &self,
        id: ExperimentId,
    ) -> Result<CancelResponse, ClientError> {
        let q = crate::api::CancelQuery { requeue: true };
        self.get_query(routes::CANCEL_EXPERIMENT, &[&id], &q, DEFAULT_TIMEOUT)
            .await
    }

    /// Jobs, optionally of one experiment and in one state (`queued`, `failed`, ...).
    pub async fn jobs(
        &self,
        experiment: Option<ExperimentId>,
        state: Option<&str>,
    ) -> Result<Vec<JobSummary>, ClientError> {
        self.jobs_where(&JobsQuery {
            experiment: experiment.map(|e| e.to_string()),
            state: state.map(str::to_string),
            limit: None,
            id_prefix: None,
            index: None,
        })
        .await
    }

    pub async fn jobs_where(&self, q: &JobsQuery) -> Result<Vec<JobSummary>, ClientError> {
        self.get_query(routes::JOBS, &[], q, DEFAULT_TIMEOUT).await
    }

    pub async fn job(&self, id: JobId) -> Result<JobDetail, ClientError> {
        self.get(routes::JOB, &[&id]).await
    }

    /// A job by id, `None` when no job has it (it may be an experiment or an attempt id).
    pub async fn find_job(&self, id: JobId) -> Result<Option<JobDetail>, ClientError> {
        match self.job(id).await {
            Ok(j) => Ok(Some(j)),
            Err(e) if e.code() == Some(ErrorCode::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn cancel_job(&self, id: JobId) -> Result<CancelResponse, ClientError> {
        let q = crate::api::CancelQuery::default();
        self.get_query(routes::CANCEL_JOB, &[&id], &q, DEFAULT_TIMEOUT)
            .await
    }

    /// Stops the running job after its checkpoint signal and queues it again, without
    /// spending an attempt (`headroom cancel --requeue`).
    pub async fn requeue_job(&self, id: JobId) -> Result<CancelResponse, ClientError> {
        let q = crate::api::CancelQuery { requeue: true };
        self.get_query(routes::CANCEL_JOB, &[&id], &q, DEFAULT_TIMEOUT)
            .await
    }

    pub async fn retry(&self, id: JobId) -> Result<RetryResponse, ClientError> {
        self.retry_with(id, &crate::api::RetryQuery::default())
            .await
    }

    /// [`Self::retry`], `cascade` also running again the jobs that wait for it.
    pub async fn retry_with(
        &self,
        id: JobId,
        q: &crate::api::RetryQuery,
    ) -> Result<RetryResponse, ClientError> {
        self.get_query(routes::RETRY_JOB, &[&id], q, DEFAULT_TIMEOUT)
            .await
    }

    /// Every failed job of the experiment runs once more.
    pub async fn retry_failed(
        &self,
        id: ExperimentId,
    ) -> Result<crate::api::RetryFailedResponse, ClientError> {
        self.call(routes::RETRY_FAILED, &[&id], None, DEFAULT_TIMEOUT)
            .await
    }

    pub async fn attempt(&self, id: AttemptId) -> Result<crate::api::AttemptView, ClientError> {
        self.get(routes::ATTEMPT, &[&id]).await
    }

    pub async fn nodes(&self) -> Result<Vec<NodeView>, ClientError> {
        self.get(routes::NODES, &[]).await
    }

    pub async fn set_plan(&self, node: &str, plan: &str) -> Result<NodeView, ClientError> {
        let req = SetPlanRequest {
            plan: plan.to_string(),
        };
        self.call(routes::SET_PLAN, &[&node], Some(&req), DEFAULT_TIMEOUT)
            .await
    }

    /// Lifts a GPU's quarantine; returns how many quarantines were lifted.
    pub async fn release_gpu(&self, node: &str, gpu: u32) -> Result<u64, ClientError> {
        let r: Released = self
            .call(routes::RELEASE_GPU, &[&node, &gpu], None, DEFAULT_TIMEOUT)
            .await?;
        Ok(r.released)
    }

    /// Lets another agent instance register as `node` at once (its live agent is gone for
    /// good, or must make way).
    pub async fn takeover(&self, node: &str) -> Result<(), ClientError> {
        let _: crate::api::Ack = self
            .call(routes::TAKEOVER, &[&node], None, DEFAULT_TIMEOUT)
            .await?;
        Ok(())
    }

    /// Job counts; with `after`, waits (up to `PROGRESS_WAIT`) for a change past that version.
    pub async fn progress(
        &self,
        experiment: Option<ExperimentId>,
        after: Option<u64>,
    ) -> Result<Progress, ClientError> {
        self.progress_within(experiment, after, PROGRESS_WAIT).await
    }

    pub async fn progress_within(
        &self,
        experiment: Option<ExperimentId>,
        after: Option<u64>,
        wait: Duration,
    ) -> Result<Progress, ClientError> {
        let q = ProgressQuery {
            experiment: experiment.map(|e| e.to_string()),
            after,
            timeout_ms: Some(wait.as_millis() as u64),
        };
        self.get_query(routes::PROGRESS, &[], &q, DEFAULT_TIMEOUT + wait)
            .await
    }

    /// One row per attempt, as CSV text.
    pub async fn export_csv(
        &self,
        experiment: Option<ExperimentId>,
        clean_only: bool,
    ) -> Result<String, ClientError> {
        let q = ExportQuery {
            experiment: experiment.map(|e| e.to_string()),
            clean_only,
            ..ExportQuery::default()
        };
        // Exports of big experiments take a while to write.
        let req = self
            .request(routes::EXPORT, &[], DEFAULT_TIMEOUT * 10)
            .query(&q);
        let (_, body) = self.send_raw(req).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// Log bytes of an attempt from `offset`, waiting up to `wait_ms` for some to appear.
    pub async fn log(
        &self,
        attempt: AttemptId,
        offset: u64,
        wait_ms: u64,
    ) -> Result<LogChunk, ClientError> {
        let q = LogQuery { offset, wait_ms };
        let req = self
            .request(
                routes::READ_LOG,
                &[&attempt],
                DEFAULT_TIMEOUT + Duration::from_millis(wait_ms),
            )
            .query(&q);
        let (headers, body) = self.send_raw(req).await?;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let next = header(routes::LOG_OFFSET_HEADER)
            .and_then(|v| v.parse().ok())
            .unwrap_or(offset + body.len() as u64);
        let ended = header(routes::ATTEMPT_ENDED_HEADER) == Some("true");
        Ok(LogChunk {
            bytes: body,
            next,
            ended,
        })
    }

    /// Keeps a code bundle under the SHA-256 of its bytes (`code: snapshot`).
    pub async fn put_bundle(
        &self,
        hash: &str,
        data: Vec<u8>,
    ) -> Result<crate::api::source::BundleStored, ClientError> {
        let req = self
            .request(routes::PUT_BUNDLE, &[&hash], BUNDLE_TIMEOUT)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(data);
        self.send(req).await
    }

    /// A code bundle's bytes (agents, for the jobs they run).
    pub async fn bundle(&self, hash: &str) -> Result<Vec<u8>, ClientError> {
        let req = self.request(routes::GET_BUNDLE, &[&hash], BUNDLE_TIMEOUT);
        Ok(self.send_raw(req).await?.1)
    }

    /// One GPU's telemetry series over `q`'s window.
    pub async fn gpu_telemetry(
        &self,
        node: &str,
        gpu: u32,
        q: &TelemetryQuery,
    ) -> Result<GpuSeries, ClientError> {
        self.get_query(routes::GPU_TELEMETRY, &[&node, &gpu], q, DEFAULT_TIMEOUT)
            .await
    }

    /// The telemetry of an attempt's GPUs over its run.
    pub async fn attempt_telemetry(
        &self,
        attempt: AttemptId,
    ) -> Result<AttemptTelemetry, ClientError> {
        let q = crate::api::AttemptTelemetryQuery::default();
        self.get_query(routes::ATTEMPT_TELEMETRY, &[&attempt], &q, DEFAULT_TIMEOUT)
            .await
    }

    // ---- tokens (admins) ---------------------------------------------------------------

    /// Creates a token (expiring after `expires_in` when given, a join token naming its
    /// nodes); the answer carries its secret, which is shown this once.
    pub async fn create_token(
        &self,
        req: &CreateTokenRequest,
    ) -> Result<CreatedToken, ClientError> {
        self.call(routes::CREATE_TOKEN, &[], Some(req), DEFAULT_TIMEOUT)
            .await
    }

    pub async fn tokens(&self) -> Result<Vec<TokenView>, ClientError> {
        self.get(routes::TOKENS, &[]).await
    }

    /// Revokes a token by its id (`token ls`); it stops working at once.
    pub async fn revoke_token(&self, id: &str) -> Result<TokenView, ClientError> {
        self.call(routes::REVOKE_TOKEN, &[&id], None, DEFAULT_TIMEOUT)
            .await
    }

    /// The caller's alert subscriptions and their newest deliveries.
    pub async fn alerts(&self) -> Result<crate::api::alerts::AlertsView, ClientError> {
        self.get(routes::ALERTS, &[]).await
    }

    pub async fn subscribe(
        &self,
        req: &crate::api::alerts::NewSubscription,
    ) -> Result<crate::api::alerts::SubscriptionView, ClientError> {
        self.call(routes::SUBSCRIBE, &[], Some(req), DEFAULT_TIMEOUT)
            .await
    }

    pub async fn unsubscribe(
        &self,
        id: &str,
    ) -> Result<crate::api::alerts::SubscriptionView, ClientError> {
        self.call(routes::UNSUBSCRIBE, &[&id], None, DEFAULT_TIMEOUT)
            .await
    }

    /// Who this client's token is, and which Unix user its jobs run as.
    pub async fn whoami(&self) -> Result<crate::api::WhoAmI, ClientError> {
        self.get(routes::WHOAMI, &[]).await
    }

    pub async fn users(&self) -> Result<Vec<crate::api::UserView>, ClientError> {
        self.get(routes::USERS, &[]).await
    }

    /// What each user (or experiment) used, and every user's fair-share standing.
    pub async fn usage(
        &self,
        q: &crate::api::usage::UsageQuery,
    ) -> Result<crate::api::usage::UsageReport, ClientError> {
        self.get_query(routes::USAGE, &[], q, DEFAULT_TIMEOUT).await
    }

    /// Creates or changes a user.
    pub async fn put_user(
        &self,
        name: &str,
        req: &crate::api::PutUserRequest,
    ) -> Result<crate::api::UserView, ClientError> {
        self.call(routes::PUT_USER, &[&name], Some(req), DEFAULT_TIMEOUT)
            .await
    }

    // ---- agents ----------------------------------------------------------------------

    /// With a join token: `node`'s first agent credential (its secret in `token`, once).
    pub async fn join(&self, node: &str) -> Result<CreatedToken, ClientError> {
        let req = crate::api::JoinRequest {
            node: node.to_string(),
        };
        self.call(routes::JOIN, &[], Some(&req), DEFAULT_TIMEOUT)
            .await
    }

    pub async fn register(&self, req: &RegisterRequest) -> Result<RegisterResponse, ClientError> {
        self.call(routes::REGISTER, &[], Some(req), DEFAULT_TIMEOUT)
            .await
    }

    /// Long-polls up to `req.wait_ms` for leases.
    pub async fn claim(
        &self,
        agent: AgentId,
        req: &ClaimRequest,
    ) -> Result<ClaimResponse, ClientError> {
        self.call(
            routes::CLAIM,
            &[&agent],
            Some(req),
            claim_timeout(req.wait_ms),
        )
        .await
    }

    /// Short limit: a heartbeat that takes long is as good as lost (the lease clock runs).
    pub async fn heartbeat(
        &self,
        agent: AgentId,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, ClientError> {
        self.call(
            routes::HEARTBEAT,
            &[&agent],
            Some(req),
            Duration::from_secs(10),
        )
        .await
    }

    pub async fn start(&self, attempt: AttemptId, req: &StartReport) -> Result<(), ClientError> {
        let _: Ack = self
            .call(
                routes::START,
                &[&attempt],
                Some(req),
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
        self.call(
            routes::FINISH,
            &[&attempt],
            Some(req),
            Duration::from_secs(10),
        )
        .await
    }

    /// An attempt's supervisor renews its lease itself (this client holds the attempt's
    /// key as its token); `timeout`: the supervisor's fence leaves it no longer.
    pub async fn renew_lease(
        &self,
        attempt: AttemptId,
        fence: i64,
        timeout: Duration,
    ) -> Result<LeaseRenewed, ClientError> {
        self.call(
            routes::RENEW_LEASE,
            &[&attempt],
            Some(&LeaseRenewal { fence }),
            timeout,
        )
        .await
    }

    /// An attempt's supervisor reports its end itself (with the attempt's key as token).
    pub async fn report_outcome(
        &self,
        attempt: AttemptId,
        req: &FinishReport,
    ) -> Result<FinishResponse, ClientError> {
        self.call(
            routes::REPORT_OUTCOME,
            &[&attempt],
            Some(req),
            Duration::from_secs(10),
        )
        .await
    }

    /// An attempt's supervisor reports its metrics so far (with the attempt's key as token).
    pub async fn report_metrics(
        &self,
        attempt: AttemptId,
        req: &MetricsReport,
    ) -> Result<MetricsAnswer, ClientError> {
        self.call(
            routes::REPORT_METRICS,
            &[&attempt],
            Some(req),
            Duration::from_secs(10),
        )
        .await
    }

    pub async fn hand_back(
        &self,
        attempt: AttemptId,
        req: &HandBackRequest,
    ) -> Result<(), ClientError> {
        let _: Ack = self
            .call(
                routes::HAND_BACK,
                &[&attempt],
                Some(req),
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
        self.log_chunk(routes::APPEND_LOG, attempt, fence, offset, bytes)
            .await
            .map(|_| ())
    }

    /// A log chunk to `ep`; the coordinator's length of the log after it.
    async fn log_chunk(
        &self,
        ep: Endpoint<RawBytes, Query<LogChunkQuery>, routes::Json<LogAppended>>,
        attempt: AttemptId,
        fence: i64,
        offset: u64,
        bytes: Vec<u8>,
    ) -> Result<u64, ClientError> {
        let req = self
            .request(ep, &[&attempt], DEFAULT_TIMEOUT)
            .query(&LogChunkQuery { fence, offset })
            .body(bytes);
        let appended: LogAppended = self.send(req).await?;
        Ok(appended.len)
    }

    /// An attempt's supervisor ships its log itself (with the attempt's key as token).
    pub async fn ship_log(
        &self,
        attempt: AttemptId,
        fence: i64,
        offset: u64,
        bytes: Vec<u8>,
    ) -> Result<u64, ClientError> {
        self.log_chunk(routes::SHIP_LOG, attempt, fence, offset, bytes)
            .await
    }

    // ---- raw access, for tests that send what no typed call would ---------------------

    /// Sends `body` (JSON) to `path` and returns the status and the JSON answer whatever the
    /// status (text that is not JSON comes back as a JSON string).
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, serde_json::Value), ClientError> {
        let method = match method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
        };
        let mut req = self.authorized(
            self.http
                .request(method, format!("{}{path}", self.base))
                .timeout(DEFAULT_TIMEOUT * 2),
        );
        if let Some(b) = body {
            req = req.json(b);
        }
        let unreachable = |source| ClientError::Unreachable {
            base: self.base.clone(),
            source,
        };
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(unreachable)?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_read_in_seconds_and_capped() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                reqwest::header::RETRY_AFTER,
                HeaderValue::from_str(v).expect("value"),
            );
            retry_after(&h)
        };
        assert_eq!(with("1"), Some(Duration::from_secs(1)));
        assert_eq!(with(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(with("3600"), Some(RETRY_AFTER_CAP));
        assert_eq!(with("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(with("-1"), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }
}
