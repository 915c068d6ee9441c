//! The REST API's routes, each declared once as an [`Endpoint`]: its method, path, who may
//! call it, its operation id and tag, and the types of its body, query and answer. The
//! coordinator's router checks each handler against its endpoint's types, the typed client
//! sends and decodes by them, and the OpenAPI document is written from them
//! ([`for_each_endpoint!`]), so a route whose handler, client or document disagree does not
//! compile.

use std::fmt;
use std::marker::PhantomData;

use crate::api::MetricsQuery;
use crate::api::alerts::{AlertsView, NewSubscription, SubscriptionView};
use crate::api::source::BundleStored;
use crate::api::usage::{UsageQuery, UsageReport};
use crate::api::{
    Ack, AttemptSeries, AttemptTelemetry, AttemptTelemetryQuery, AttemptView, CancelQuery,
    CancelResponse, ClaimRequest, ClaimResponse, CreateTokenRequest, CreatedToken,
    ExperimentSummary, ExportPage, ExportQuery, FinishReport, FinishResponse, GpuSeries,
    HandBackRequest, Health, HeartbeatRequest, HeartbeatResponse, JobDetail, JobSummary, JobsQuery,
    JoinRequest, LeaseRenewal, LeaseRenewed, LogAppended, LogChunkQuery, LogQuery, MetricsAnswer,
    MetricsReport, NodeView, Progress, ProgressQuery, PutUserRequest, RegisterRequest,
    RegisterResponse, Released, RetryFailedResponse, RetryQuery, RetryResponse, SetPlanRequest,
    StartReport, SubmitRequest, SubmitResponse, TelemetryQuery, TokenView, UserView, WhoAmI,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Get,
    Post,
    Put,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
        })
    }
}

/// Who may call a route. Roles are `admin`, `user` and `agent`; an admin may do whatever a
/// user may.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// No token needed (liveness probes).
    Public,
    /// Any user or admin (reads and submissions).
    User,
    /// A user acting on what they submitted, or an admin.
    Owner,
    /// Admins only (node plans, quarantines, tokens).
    Admin,
    /// Agents only (registration, leases, reports).
    Agent,
    /// Join tokens only: a node's first credential.
    Join,
    /// The attempt named in the path, by the credential issued with its lease (its
    /// supervisor, while its agent is away); no token of any role.
    Attempt,
}

/// One route: method, path template (axum's `{name}` segments) and what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub access: Access,
    pub summary: &'static str,
}

impl Route {
    const fn new(
        method: Method,
        path: &'static str,
        access: Access,
        summary: &'static str,
    ) -> Self {
        Self {
            method,
            path,
            access,
            summary,
        }
    }

    /// Names of the path's `{...}` segments, in order.
    pub fn params(&self) -> impl Iterator<Item = &'static str> {
        self.path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
    }

    /// The concrete path: each `{...}` segment replaced by the next of `args`, percent-encoded
    /// (a node name may hold any character). Panics in debug builds on a count mismatch.
    pub fn path_with(&self, args: &[&dyn fmt::Display]) -> String {
        debug_assert_eq!(self.params().count(), args.len(), "{}", self.path);
        let mut args = args.iter();
        let mut out = String::with_capacity(self.path.len() + 40);
        for seg in self.path.split('/').skip(1) {
            out.push('/');
            if seg.starts_with('{') {
                if let Some(a) = args.next() {
                    encode_segment(&a.to_string(), &mut out);
                }
            } else {
                out.push_str(seg);
            }
        }
        out
    }
}

/// How long the coordinator keeps a kept-alive connection that sits idle: it closes it then
/// (the deadline for a request's head, which also bounds a slow client). Clients let one go
/// sooner (`client::POOL_IDLE`).
pub const SERVER_IDLE_CLOSE: std::time::Duration = std::time::Duration::from_secs(10);

/// A route with its types: `B` its body, `Q` its query, `A` its answer (the markers below).
pub struct Endpoint<B, Q, A> {
    pub route: Route,
    /// The OpenAPI `operationId` and tag.
    pub operation_id: &'static str,
    pub tag: &'static str,
    /// It can refuse because of state: a stale fence, an unknown agent, a job in the wrong
    /// state (409).
    pub conflicts: bool,
    types: PhantomData<Types<B, Q, A>>,
}

/// What `Endpoint` holds of its types: nothing (a function pointer type is `Send`, `Sync`
/// and `Copy` whatever they are).
type Types<B, Q, A> = fn() -> (B, Q, A);

impl<B, Q, A> Clone for Endpoint<B, Q, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B, Q, A> Copy for Endpoint<B, Q, A> {}

impl<B, Q, A> std::ops::Deref for Endpoint<B, Q, A> {
    type Target = Route;
    fn deref(&self) -> &Route {
        &self.route
    }
}

impl<B, Q, A> Endpoint<B, Q, A> {
    const fn new(
        method: Method,
        path: &'static str,
        access: Access,
        summary: &'static str,
    ) -> Self {
        Self {
            route: Route::new(method, path, access, summary),
            operation_id: "",
            tag: "",
            conflicts: false,
            types: PhantomData,
        }
    }

    const fn doc(mut self, operation_id: &'static str, tag: &'static str) -> Self {
        self.operation_id = operation_id;
        self.tag = tag;
        self
    }

    const fn conflicts(mut self) -> Self {
        self.conflicts = true;
        self
    }
}

/// A JSON body or answer of `T`.
pub struct Json<T>(PhantomData<fn() -> T>);
/// A JSON answer of a list of `T`.
pub struct JsonList<T>(PhantomData<fn() -> T>);
/// No body.
pub enum NoBody {}
/// Raw bytes (`application/octet-stream`).
pub enum RawBytes {}
/// No query string.
pub enum NoQuery {}
/// A query string of `Q`'s fields.
pub struct Query<Q>(PhantomData<fn() -> Q>);
/// The export: CSV text, or with `format=json` a JSON page of `T`.
pub struct Export<T>(PhantomData<fn() -> T>);
/// Log bytes with the `x-log-offset` and `x-attempt-ended` headers.
pub enum LogBytes {}
/// Raw bytes (`application/octet-stream`), as an answer.
pub enum OctetStream {}

/// What a body marker carries, as the client sends it.
pub trait BodyType {
    type Value: ?Sized;
}

impl<T> BodyType for Json<T> {
    type Value = T;
}

impl BodyType for NoBody {
    type Value = ();
}

/// What a JSON answer marker decodes to, as the client reads it.
pub trait JsonAnswer {
    type Value;
}

impl<T> JsonAnswer for Json<T> {
    type Value = T;
}

impl<T> JsonAnswer for JsonList<T> {
    type Value = Vec<T>;
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode_segment(raw: &str, out: &mut String) {
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

use Access::{Admin, Agent, Attempt, Join, Owner, Public, User};
use Method::{Get, Post, Put};

pub const HEALTH: Endpoint<NoBody, NoQuery, Json<Health>> = Endpoint::new(
    Get,
    "/v1/health",
    Public,
    "Readiness: the store answers and its schema is migrated (503 when it does not)",
)
.doc("health", "meta");
pub const LIVE: Endpoint<NoBody, NoQuery, Json<Ack>> = Endpoint::new(
    Get,
    "/v1/live",
    Public,
    "Liveness: the process serves (the store is not asked)",
)
.doc("live", "meta");
pub const SUBMIT: Endpoint<Json<SubmitRequest>, NoQuery, Json<SubmitResponse>> =
    Endpoint::new(Post, "/v1/experiments", User, "Submit a spec")
        .doc("submitExperiment", "experiments");
pub const EXPERIMENTS: Endpoint<NoBody, NoQuery, JsonList<ExperimentSummary>> =
    Endpoint::new(Get, "/v1/experiments", User, "List experiments")
        .doc("listExperiments", "experiments");
pub const EXPERIMENT: Endpoint<NoBody, NoQuery, Json<ExperimentSummary>> =
    Endpoint::new(Get, "/v1/experiments/{id}", User, "One experiment")
        .doc("getExperiment", "experiments");
pub const CANCEL_EXPERIMENT: Endpoint<NoBody, Query<CancelQuery>, Json<CancelResponse>> =
    Endpoint::new(
        Post,
        "/v1/experiments/{id}/cancel",
        Owner,
        "Cancel every unfinished job of an experiment",
    )
    .doc("cancelExperiment", "experiments");
pub const RETRY_FAILED: Endpoint<NoBody, NoQuery, Json<RetryFailedResponse>> = Endpoint::new(
    Post,
    "/v1/experiments/{id}/retry",
    Owner,
    "Run every failed job of an experiment once more",
)
.doc("retryFailedJobs", "experiments");
pub const PROGRESS: Endpoint<NoBody, Query<ProgressQuery>, Json<Progress>> = Endpoint::new(
    Get,
    "/v1/progress",
    User,
    "Job counts per state; long-polls with `after`",
)
.doc("progress", "experiments");
pub const EXPORT: Endpoint<NoBody, Query<ExportQuery>, Export<ExportPage>> = Endpoint::new(
    Get,
    "/v1/export",
    User,
    "Attempts, one row each, as CSV or paged JSON (`format`)",
)
.doc("exportAttempts", "experiments");
pub const JOBS: Endpoint<NoBody, Query<JobsQuery>, JsonList<JobSummary>> =
    Endpoint::new(Get, "/v1/jobs", User, "List jobs").doc("listJobs", "jobs");
pub const JOB: Endpoint<NoBody, NoQuery, Json<JobDetail>> =
    Endpoint::new(Get, "/v1/jobs/{id}", User, "A job with its attempts").doc("getJob", "jobs");
pub const CANCEL_JOB: Endpoint<NoBody, Query<CancelQuery>, Json<CancelResponse>> =
    Endpoint::new(Post, "/v1/jobs/{id}/cancel", Owner, "Cancel a job").doc("cancelJob", "jobs");
pub const RETRY_JOB: Endpoint<NoBody, Query<RetryQuery>, Json<RetryResponse>> = Endpoint::new(
    Post,
    "/v1/jobs/{id}/retry",
    Owner,
    "Run a finished job once more",
)
.doc("retryJob", "jobs")
.conflicts();
pub const ATTEMPT: Endpoint<NoBody, NoQuery, Json<AttemptView>> =
    Endpoint::new(Get, "/v1/attempts/{id}", User, "One attempt").doc("getAttempt", "jobs");
pub const READ_LOG: Endpoint<NoBody, Query<LogQuery>, LogBytes> = Endpoint::new(
    Get,
    "/v1/attempts/{id}/log",
    User,
    "Log bytes from an offset; long-polls with `wait_ms`",
)
.doc("readLog", "jobs");
pub const APPEND_LOG: Endpoint<RawBytes, Query<LogChunkQuery>, Json<LogAppended>> = Endpoint::new(
    Post,
    "/v1/attempts/{id}/log",
    Agent,
    "Append log bytes (fenced)",
)
.doc("appendLog", "agents")
.conflicts();
pub const START: Endpoint<Json<StartReport>, NoQuery, Json<Ack>> = Endpoint::new(
    Post,
    "/v1/attempts/{id}/start",
    Agent,
    "An attempt's process started (fenced)",
)
.doc("startAttempt", "agents")
.conflicts();
pub const FINISH: Endpoint<Json<FinishReport>, NoQuery, Json<FinishResponse>> = Endpoint::new(
    Post,
    "/v1/attempts/{id}/finish",
    Agent,
    "An attempt ended (fenced)",
)
.doc("finishAttempt", "agents")
.conflicts();
pub const RENEW_LEASE: Endpoint<Json<LeaseRenewal>, NoQuery, Json<LeaseRenewed>> = Endpoint::new(
    Post,
    "/v1/attempts/{id}/lease",
    Attempt,
    "The attempt's supervisor renews its lease itself (fenced)",
)
.doc("renewLease", "supervisors")
.conflicts();
pub const REPORT_OUTCOME: Endpoint<Json<FinishReport>, NoQuery, Json<FinishResponse>> =
    Endpoint::new(
        Post,
        "/v1/attempts/{id}/outcome",
        Attempt,
        "The attempt's supervisor reports its end itself (fenced)",
    )
    .doc("reportOutcome", "supervisors")
    .conflicts();
pub const SHIP_LOG: Endpoint<RawBytes, Query<LogChunkQuery>, Json<LogAppended>> = Endpoint::new(
    Post,
    "/v1/attempts/{id}/outcome/log",
    Attempt,
    "The attempt's supervisor ships its log itself (fenced)",
)
.doc("shipLog", "supervisors")
.conflicts();
pub const REPORT_METRICS: Endpoint<Json<MetricsReport>, NoQuery, Json<MetricsAnswer>> =
    Endpoint::new(
        Post,
        "/v1/attempts/{id}/metrics",
        Attempt,
        "The attempt's supervisor reports its metrics so far; the answer says whether \
         `early_stop` stops it (fenced)",
    )
    .doc("reportMetrics", "supervisors")
    .conflicts();
pub const EXPERIMENT_METRICS: Endpoint<NoBody, Query<MetricsQuery>, JsonList<AttemptSeries>> =
    Endpoint::new(
        Get,
        "/v1/experiments/{id}/metrics",
        User,
        "Every attempt's metric series and final values (learning curves), one metric's or \
         all, thinned to `points` per series",
    )
    .doc("experimentMetrics", "experiments");
pub const HAND_BACK: Endpoint<Json<HandBackRequest>, NoQuery, Json<Ack>> = Endpoint::new(
    Post,
    "/v1/attempts/{id}/handback",
    Agent,
    "Give a lease back unlaunched (fenced)",
)
.doc("handBack", "agents")
.conflicts();
pub const NODES: Endpoint<NoBody, NoQuery, JsonList<NodeView>> =
    Endpoint::new(Get, "/v1/nodes", User, "Nodes, GPUs, memory and slots")
        .doc("listNodes", "nodes");
pub const SET_PLAN: Endpoint<Json<SetPlanRequest>, NoQuery, Json<NodeView>> = Endpoint::new(
    Put,
    "/v1/nodes/{name}/plan",
    Admin,
    "Set a node's concurrency plan",
)
.doc("setPlan", "nodes")
.conflicts();
pub const RELEASE_GPU: Endpoint<NoBody, NoQuery, Json<Released>> = Endpoint::new(
    Post,
    "/v1/nodes/{name}/gpus/{gpu}/release",
    Admin,
    "Lift a GPU's quarantine",
)
.doc("releaseGpu", "nodes");
pub const TAKEOVER: Endpoint<NoBody, NoQuery, Json<Ack>> = Endpoint::new(
    Post,
    "/v1/nodes/{name}/takeover",
    Admin,
    "Let another agent instance register as this node now (its agent is gone)",
)
.doc("takeoverNode", "nodes");
pub const REGISTER: Endpoint<Json<RegisterRequest>, NoQuery, Json<RegisterResponse>> =
    Endpoint::new(Post, "/v1/agents/register", Agent, "Register an agent")
        .doc("registerAgent", "agents")
        .conflicts();
pub const JOIN: Endpoint<Json<JoinRequest>, NoQuery, Json<CreatedToken>> = Endpoint::new(
    Post,
    "/v1/agents/join",
    Join,
    "Exchange a join token for a new node's agent credential (once per node)",
)
.doc("joinNode", "agents")
.conflicts();
pub const CLAIM: Endpoint<Json<ClaimRequest>, NoQuery, Json<ClaimResponse>> = Endpoint::new(
    Post,
    "/v1/agents/{id}/claim",
    Agent,
    "Lease fitting jobs; long-polls with `wait_ms`",
)
.doc("claim", "agents")
.conflicts();
pub const HEARTBEAT: Endpoint<Json<HeartbeatRequest>, NoQuery, Json<HeartbeatResponse>> =
    Endpoint::new(
        Post,
        "/v1/agents/{id}/heartbeat",
        Agent,
        "Renew leases, report telemetry",
    )
    .doc("heartbeat", "agents")
    .conflicts();
pub const GPU_TELEMETRY: Endpoint<NoBody, Query<TelemetryQuery>, Json<GpuSeries>> = Endpoint::new(
    Get,
    "/v1/nodes/{name}/gpus/{gpu}/telemetry",
    User,
    "A GPU's telemetry series over a time window",
)
.doc("gpuTelemetry", "nodes");
pub const ATTEMPT_TELEMETRY: Endpoint<
    NoBody,
    Query<AttemptTelemetryQuery>,
    Json<AttemptTelemetry>,
> = Endpoint::new(
    Get,
    "/v1/attempts/{id}/telemetry",
    User,
    "Telemetry of an attempt's GPUs over its run",
)
.doc("attemptTelemetry", "jobs");

/// Prometheus metrics (text exposition). Outside `/v1` and outside `ALL` (not part of the
/// JSON API): no token needed, because scrapers are configured per target and the page holds
/// only aggregate counts and histograms, no names, ids, commands or parameters.
pub const METRICS: Route = Route::new(Get, "/metrics", Public, "Prometheus metrics");

pub const TOKENS: Endpoint<NoBody, NoQuery, JsonList<TokenView>> =
    Endpoint::new(Get, "/v1/tokens", Admin, "Tokens the coordinator keeps")
        .doc("listTokens", "tokens");
pub const CREATE_TOKEN: Endpoint<Json<CreateTokenRequest>, NoQuery, Json<CreatedToken>> =
    Endpoint::new(
        Post,
        "/v1/tokens",
        Admin,
        "Create a token (its secret is returned once)",
    )
    .doc("createToken", "tokens")
    .conflicts();
pub const REVOKE_TOKEN: Endpoint<NoBody, NoQuery, Json<TokenView>> = Endpoint::new(
    Post,
    "/v1/tokens/{id}/revoke",
    Admin,
    "Revoke a token at once",
)
.doc("revokeToken", "tokens");

/// Calls `$callback!` with every endpoint of the API, in the order the API documents them:
/// the one list the route table (`ALL`), the router's test and the OpenAPI document read.
#[macro_export]
macro_rules! for_each_endpoint {
    ($callback:ident) => {
        $callback! {
            $crate::routes::HEALTH,
            $crate::routes::LIVE,
            $crate::routes::SUBMIT,
            $crate::routes::EXPERIMENTS,
            $crate::routes::EXPERIMENT,
            $crate::routes::CANCEL_EXPERIMENT,
            $crate::routes::RETRY_FAILED,
            $crate::routes::PROGRESS,
            $crate::routes::EXPORT,
            $crate::routes::PUT_BUNDLE,
            $crate::routes::GET_BUNDLE,
            $crate::routes::JOBS,
            $crate::routes::JOB,
            $crate::routes::CANCEL_JOB,
            $crate::routes::RETRY_JOB,
            $crate::routes::ATTEMPT,
            $crate::routes::READ_LOG,
            $crate::routes::APPEND_LOG,
            $crate::routes::START,
            $crate::routes::FINISH,
            $crate::routes::RENEW_LEASE,
            $crate::routes::REPORT_OUTCOME,
            $crate::routes::SHIP_LOG,
            $crate::routes::REPORT_METRICS,
            $crate::routes::EXPERIMENT_METRICS,
            $crate::routes::HAND_BACK,
            $crate::routes::NODES,
            $crate::routes::SET_PLAN,
            $crate::routes::RELEASE_GPU,
            $crate::routes::TAKEOVER,
            $crate::routes::REGISTER,
            $crate::routes::JOIN,
            $crate::routes::CLAIM,
            $crate::routes::HEARTBEAT,
            $crate::routes::GPU_TELEMETRY,
            $crate::routes::ATTEMPT_TELEMETRY,
            $crate::routes::TOKENS,
            $crate::routes::CREATE_TOKEN,
            $crate::routes::REVOKE_TOKEN,
            $crate::routes::USERS,
            $crate::routes::PUT_USER,
            $crate::routes::USAGE,
            $crate::routes::WHOAMI,
            $crate::routes::ALERTS,
            $crate::routes::SUBSCRIBE,
            $crate::routes::UNSUBSCRIBE,
        }
    };
}

macro_rules! route_table {
    ($($name:path,)*) => {
        /// Every route, in the order the API documents them.
        pub const ALL: &[Route] = &[$($name.route),*];
    };
}

for_each_endpoint!(route_table);

pub const PUT_BUNDLE: Endpoint<RawBytes, NoQuery, Json<BundleStored>> = Endpoint::new(
    Put,
    "/v1/bundles/{hash}",
    User,
    "Keep a code bundle (`code: snapshot`) under the SHA-256 of its bytes",
)
.doc("putBundle", "experiments");
pub const GET_BUNDLE: Endpoint<NoBody, NoQuery, OctetStream> = Endpoint::new(
    Get,
    "/v1/bundles/{hash}",
    Agent,
    "A code bundle's bytes, for the nodes that run its jobs",
)
.doc("getBundle", "agents");

pub const USAGE: Endpoint<NoBody, Query<UsageQuery>, Json<UsageReport>> = Endpoint::new(
    Get,
    "/v1/usage",
    User,
    "What each user or experiment used (GPU-hours, GiB-hours, energy, jobs by end state) and \
     every user's fair-share standing",
)
.doc("usage", "tokens");
pub const USERS: Endpoint<NoBody, NoQuery, JsonList<UserView>> =
    Endpoint::new(Get, "/v1/users", Admin, "Users and their Unix users").doc("listUsers", "tokens");
pub const WHOAMI: Endpoint<NoBody, NoQuery, Json<WhoAmI>> = Endpoint::new(
    Get,
    "/v1/whoami",
    User,
    "The caller: its token's name and role (the dashboard shows what the role may do)",
)
.doc("whoAmI", "tokens");
pub const PUT_USER: Endpoint<Json<PutUserRequest>, NoQuery, Json<UserView>> = Endpoint::new(
    Put,
    "/v1/users/{name}",
    Admin,
    "Create or change a user (role, Unix user)",
)
.doc("putUser", "tokens")
.conflicts();

/// Response headers of `READ_LOG`: where the next read starts, and whether the attempt ended.
pub const LOG_OFFSET_HEADER: &str = "x-log-offset";
pub const ATTEMPT_ENDED_HEADER: &str = "x-attempt-ended";

pub const ALERTS: Endpoint<NoBody, NoQuery, Json<AlertsView>> = Endpoint::new(
    Get,
    "/v1/alerts",
    User,
    "The caller's alert subscriptions (an admin's: every one) and their newest deliveries, \
     dead letters first",
)
.doc("listAlerts", "alerts");
pub const SUBSCRIBE: Endpoint<Json<NewSubscription>, NoQuery, Json<SubscriptionView>> =
    Endpoint::new(
        Post,
        "/v1/alerts",
        User,
        "Subscribe to alerts: events of the caller's jobs (every user's, lab-wide: admins) and \
         of the lab's machines, sent to a webhook or a mailbox",
    )
    .doc("subscribe", "alerts");
pub const UNSUBSCRIBE: Endpoint<NoBody, NoQuery, Json<SubscriptionView>> = Endpoint::new(
    Post,
    "/v1/alerts/{id}/remove",
    User,
    "Remove an alert subscription (its owner's or an admin's) and its deliveries",
)
.doc("unsubscribe", "alerts");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_unique_and_well_formed() {
        for (i, r) in ALL.iter().enumerate() {
            assert!(r.path.starts_with("/v1/"), "{}", r.path);
            assert!(
                !ALL[..i]
                    .iter()
                    .any(|o| o.method == r.method && o.path == r.path),
                "{} {} twice",
                r.method,
                r.path
            );
            assert!(!r.summary.is_empty());
        }
    }

    #[test]
    fn paths_fill_and_encode_their_segments() {
        assert_eq!(JOB.path_with(&[&"abc"]), "/v1/jobs/abc");
        assert_eq!(
            RELEASE_GPU.path_with(&[&"gpu box/1", &3]),
            "/v1/nodes/gpu%20box%2F1/gpus/3/release"
        );
        assert_eq!(HEALTH.path_with(&[]), "/v1/health");
        assert_eq!(RELEASE_GPU.params().collect::<Vec<_>>(), ["name", "gpu"]);
    }
}
