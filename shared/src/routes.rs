//! The REST API's routes in one table (`ALL`): the coordinator's router, the typed client and
//! the OpenAPI document are built from it, so a path is written once.

use std::fmt;

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

pub const HEALTH: Route = Route::new(
    Get,
    "/v1/health",
    Public,
    "Readiness: the store answers and its schema is migrated (503 when it does not)",
);
pub const LIVE: Route = Route::new(
    Get,
    "/v1/live",
    Public,
    "Liveness: the process serves (the store is not asked)",
);
pub const SUBMIT: Route = Route::new(Post, "/v1/experiments", User, "Submit a spec");
pub const EXPERIMENTS: Route = Route::new(Get, "/v1/experiments", User, "List experiments");
pub const EXPERIMENT: Route = Route::new(Get, "/v1/experiments/{id}", User, "One experiment");
pub const CANCEL_EXPERIMENT: Route = Route::new(
    Post,
    "/v1/experiments/{id}/cancel",
    Owner,
    "Cancel every unfinished job of an experiment",
);
pub const RETRY_FAILED: Route = Route::new(
    Post,
    "/v1/experiments/{id}/retry",
    Owner,
    "Run every failed job of an experiment once more",
);
pub const PROGRESS: Route = Route::new(
    Get,
    "/v1/progress",
    User,
    "Job counts per state; long-polls with `after`",
);
pub const EXPORT: Route = Route::new(
    Get,
    "/v1/export",
    User,
    "Attempts, one row each, as CSV or paged JSON (`format`)",
);
pub const JOBS: Route = Route::new(Get, "/v1/jobs", User, "List jobs");
pub const JOB: Route = Route::new(Get, "/v1/jobs/{id}", User, "A job with its attempts");
pub const CANCEL_JOB: Route = Route::new(Post, "/v1/jobs/{id}/cancel", Owner, "Cancel a job");
pub const RETRY_JOB: Route = Route::new(
    Post,
    "/v1/jobs/{id}/retry",
    Owner,
    "Run a finished job once more",
);
pub const ATTEMPT: Route = Route::new(Get, "/v1/attempts/{id}", User, "One attempt");
pub const READ_LOG: Route = Route::new(
    Get,
    "/v1/attempts/{id}/log",
    User,
    "Log bytes from an offset; long-polls with `wait_ms`",
);
pub const APPEND_LOG: Route = Route::new(
    Post,
    "/v1/attempts/{id}/log",
    Agent,
    "Append log bytes (fenced)",
);
pub const START: Route = Route::new(
    Post,
    "/v1/attempts/{id}/start",
    Agent,
    "An attempt's process started (fenced)",
);
pub const FINISH: Route = Route::new(
    Post,
    "/v1/attempts/{id}/finish",
    Agent,
    "An attempt ended (fenced)",
);
pub const RENEW_LEASE: Route = Route::new(
    Post,
    "/v1/attempts/{id}/lease",
    Attempt,
    "The attempt's supervisor renews its lease itself (fenced)",
);
pub const REPORT_OUTCOME: Route = Route::new(
    Post,
    "/v1/attempts/{id}/outcome",
    Attempt,
    "The attempt's supervisor reports its end itself (fenced)",
);
pub const SHIP_LOG: Route = Route::new(
    Post,
    "/v1/attempts/{id}/outcome/log",
    Attempt,
    "The attempt's supervisor ships its log itself (fenced)",
);
pub const HAND_BACK: Route = Route::new(
    Post,
    "/v1/attempts/{id}/handback",
    Agent,
    "Give a lease back unlaunched (fenced)",
);
pub const NODES: Route = Route::new(Get, "/v1/nodes", User, "Nodes, GPUs, memory and slots");
pub const SET_PLAN: Route = Route::new(
    Put,
    "/v1/nodes/{name}/plan",
    Admin,
    "Set a node's concurrency plan",
);
pub const RELEASE_GPU: Route = Route::new(
    Post,
    "/v1/nodes/{name}/gpus/{gpu}/release",
    Admin,
    "Lift a GPU's quarantine",
);
pub const TAKEOVER: Route = Route::new(
    Post,
    "/v1/nodes/{name}/takeover",
    Admin,
    "Let another agent instance register as this node now (its agent is gone)",
);
pub const REGISTER: Route = Route::new(Post, "/v1/agents/register", Agent, "Register an agent");
pub const JOIN: Route = Route::new(
    Post,
    "/v1/agents/join",
    Join,
    "Exchange a join token for a new node's agent credential (once per node)",
);
pub const CLAIM: Route = Route::new(
    Post,
    "/v1/agents/{id}/claim",
    Agent,
    "Lease fitting jobs; long-polls with `wait_ms`",
);
pub const HEARTBEAT: Route = Route::new(
    Post,
    "/v1/agents/{id}/heartbeat",
    Agent,
    "Renew leases, report telemetry",
);
pub const GPU_TELEMETRY: Route = Route::new(
    Get,
    "/v1/nodes/{name}/gpus/{gpu}/telemetry",
    User,
    "A GPU's telemetry series over a time window",
);
pub const ATTEMPT_TELEMETRY: Route = Route::new(
    Get,
    "/v1/attempts/{id}/telemetry",
    User,
    "Telemetry of an attempt's GPUs over its run",
);

/// Prometheus metrics (text exposition). Outside `/v1` and outside `ALL` (not part of the
/// JSON API): no token needed, because scrapers are configured per target and the page holds
/// only aggregate counts and histograms, no names, ids, commands or parameters.
pub const METRICS: Route = Route::new(Get, "/metrics", Public, "Prometheus metrics");

pub const TOKENS: Route = Route::new(Get, "/v1/tokens", Admin, "Tokens the coordinator keeps");
pub const CREATE_TOKEN: Route = Route::new(
    Post,
    "/v1/tokens",
    Admin,
    "Create a token (its secret is returned once)",
);
pub const REVOKE_TOKEN: Route = Route::new(
    Post,
    "/v1/tokens/{id}/revoke",
    Admin,
    "Revoke a token at once",
);

/// Every route, in the order the API documents them.
pub const ALL: &[Route] = &[
    HEALTH,
    LIVE,
    SUBMIT,
    EXPERIMENTS,
    EXPERIMENT,
    CANCEL_EXPERIMENT,
    RETRY_FAILED,
    PROGRESS,
    EXPORT,
    JOBS,
    JOB,
    CANCEL_JOB,
    RETRY_JOB,
    ATTEMPT,
    READ_LOG,
    APPEND_LOG,
    START,
    FINISH,
    RENEW_LEASE,
    REPORT_OUTCOME,
    SHIP_LOG,
    HAND_BACK,
    NODES,
    SET_PLAN,
    RELEASE_GPU,
    TAKEOVER,
    REGISTER,
    JOIN,
    CLAIM,
    HEARTBEAT,
    GPU_TELEMETRY,
    ATTEMPT_TELEMETRY,
    TOKENS,
    CREATE_TOKEN,
    REVOKE_TOKEN,
    USERS,
    PUT_USER,
    WHOAMI,
];

pub const USERS: Route = Route::new(Get, "/v1/users", Admin, "Users and their Unix users");
pub const WHOAMI: Route = Route::new(
    Get,
    "/v1/whoami",
    User,
    "The caller: its token's name and role (the dashboard shows what the role may do)",
);
pub const PUT_USER: Route = Route::new(
    Put,
    "/v1/users/{name}",
    Admin,
    "Create or change a user (role, Unix user)",
);

/// Response headers of `READ_LOG`: where the next read starts, and whether the attempt ended.
pub const LOG_OFFSET_HEADER: &str = "x-log-offset";
pub const ATTEMPT_ENDED_HEADER: &str = "x-attempt-ended";

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
