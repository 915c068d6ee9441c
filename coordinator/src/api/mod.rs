//! The REST API under `/v1`: routing and shared state. Handlers translate HTTP to store
//! calls and hold no SQL.

use std::sync::Arc;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use headroom_shared::api::{ErrorCode, GpuSample, Principal, Role};
use headroom_shared::routes::{self, Access, Method, Route};

use crate::auth::{AuthError, Authenticator};
use crate::changes::Changes;
use crate::config::CoordinatorConfig;
use crate::store::{NodeOf, Store};

mod agents;
mod alerts;
mod bundles;
mod dry_run;
pub mod error;
mod experiments;
mod jobs;
pub mod local;
mod nodes;
pub mod refusals;
mod submit;
mod supervisors;
mod telemetry;
mod tokens;
mod typed;
mod ui;
mod usage;

pub use error::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult};
use typed::Endpoints;

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    /// The store's change counter: long-polls wait on it, the store bumps it.
    pub changes: Changes,
    pub config: Arc<CoordinatorConfig>,
    pub metrics: crate::metrics::CoordinatorMetrics,
    /// Who each request is (bearer tokens).
    pub auth: Arc<Authenticator>,
    /// How often progress watchers may be answered (`experiments::progress`).
    pub progress: Arc<experiments::ProgressPace>,
    /// How many refusals are logged (`refusals`).
    pub refusals: Arc<refusals::RefusalLog>,
    /// Claims' turns at the store.
    pub admission: crate::admission::Admission,
    /// Which node each agent and attempt belongs to, once read.
    pub owners: crate::owners::Owners,
}

/// The router, built from the shared route table (`headroom_shared::routes`): the method
/// and path of each route are written there once; here each gets its handler.
pub fn router(state: AppState) -> Router {
    use headroom_shared::routes as r;
    Router::new()
        .endpoint(r::HEALTH, experiments::health)
        .endpoint(r::LIVE, experiments::live)
        .endpoint(r::SUBMIT, submit::submit)
        .endpoint(r::EXPERIMENTS, experiments::list)
        .endpoint(r::EXPERIMENT, experiments::get_one)
        .endpoint(r::CANCEL_EXPERIMENT, experiments::cancel)
        .endpoint(r::RETRY_FAILED, experiments::retry_failed)
        .endpoint(r::PROGRESS, experiments::progress)
        .endpoint(r::EXPORT, experiments::export)
        .endpoint(r::PUT_BUNDLE, bundles::put)
        .endpoint(r::GET_BUNDLE, bundles::get)
        .endpoint(r::JOBS, jobs::list)
        .endpoint(r::JOB, jobs::get_one)
        .endpoint(r::CANCEL_JOB, jobs::cancel)
        .endpoint(r::RETRY_JOB, jobs::retry)
        .endpoint(r::ATTEMPT, jobs::attempt)
        .endpoint(r::READ_LOG, jobs::read_log)
        .endpoint(r::APPEND_LOG, agents::append_log)
        .endpoint(r::START, agents::start)
        .endpoint(r::FINISH, agents::finish)
        .endpoint(r::HAND_BACK, agents::hand_back)
        .endpoint(r::RENEW_LEASE, supervisors::renew)
        .endpoint(r::REPORT_OUTCOME, supervisors::outcome)
        .endpoint(r::SHIP_LOG, supervisors::ship_log)
        .endpoint(r::REPORT_METRICS, supervisors::metrics)
        .endpoint(r::EXPERIMENT_METRICS, experiments::metrics)
        .endpoint(r::NODES, nodes::list)
        .endpoint(r::SET_PLAN, nodes::set_plan)
        .endpoint(r::RELEASE_GPU, nodes::release_gpu)
        .endpoint(r::TAKEOVER, nodes::takeover)
        .endpoint(r::REGISTER, agents::register)
        .endpoint(r::JOIN, tokens::join)
        .endpoint(r::CLAIM, agents::claim)
        .endpoint(r::HEARTBEAT, agents::heartbeat)
        .endpoint(r::GPU_TELEMETRY, telemetry::gpu)
        .endpoint(r::ATTEMPT_TELEMETRY, telemetry::attempt)
        .endpoint(r::TOKENS, tokens::list)
        .endpoint(r::CREATE_TOKEN, tokens::create)
        .endpoint(r::REVOKE_TOKEN, tokens::revoke)
        .endpoint(r::USERS, tokens::users)
        .endpoint(r::USAGE, usage::usage)
        .endpoint(r::PUT_USER, tokens::put_user)
        .endpoint(r::WHOAMI, tokens::whoami)
        .endpoint(r::ALERTS, alerts::list)
        .endpoint(r::SUBSCRIBE, alerts::subscribe)
        .endpoint(r::UNSUBSCRIBE, alerts::unsubscribe)
        // One gate for every route above, deciding by the route table's `access` (`authorize`).
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize))
        // Public, outside the table and the gate: the description of everything above, and
        // the Prometheus page (counts only; scrapers are set up per target).
        .route(OPENAPI_PATH, get(openapi_json))
        .route(crate::openapi::SPEC_SCHEMA_PATH, get(spec_schema))
        // The dashboard's page and assets: public (they hold no data; the page asks the API
        // with the token the person gives it).
        .route("/", get(ui::page))
        .route("/ui/{file}", get(ui::asset))
        // Prometheus text, outside the JSON API's endpoints.
        .route(r::METRICS.path, get(telemetry::metrics))
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such route (see /v1/...)") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        // Without tokens, before anything else: only this machine's own programs and pages.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            local::loopback_only,
        ))
        .layer(middleware::from_fn(request_span))
        .with_state(state)
}

/// One span per request: its method, path (with the ids in it) and route; the gate records
/// who called, and the status is recorded when the answer leaves. Store operations' spans
/// nest inside it.
async fn request_span(matched: Option<MatchedPath>, req: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        "request",
        method = %req.method(),
        path = %req.uri().path(),
        route = matched.as_ref().map_or("", |m| m.as_str()),
        who = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    let response = tracing::Instrument::instrument(next.run(req), span.clone()).await;
    span.record("status", response.status().as_u16());
    response
}

/// Where the OpenAPI document is served.
pub const OPENAPI_PATH: &str = "/openapi.json";

async fn openapi_json() -> axum::Json<&'static serde_json::Value> {
    axum::Json(crate::openapi::document())
}

/// The spec's JSON Schema: public, as the OpenAPI document is (editors fetch it without a
/// token).
async fn spec_schema() -> axum::Json<&'static serde_json::Value> {
    axum::Json(crate::openapi::spec_schema())
}

/// The route of the shared table that axum matched, by method and path template.
fn route_of(method: &axum::http::Method, path: &str) -> Option<&'static Route> {
    let method = match *method {
        axum::http::Method::GET => Method::Get,
        axum::http::Method::POST => Method::Post,
        axum::http::Method::PUT => Method::Put,
        _ => return None,
    };
    routes::ALL
        .iter()
        .find(|r| r.method == method && r.path == path)
}

/// The access gate: identifies the caller by bearer token and lets the request through only
/// when the route's `access` (`routes::ALL`) admits its role (`rules::may_call`). The
/// identity goes into the request's extensions for handlers (submitter, owner checks). A
/// route missing from the table is refused (fail closed).
async fn authorize(
    State(s): State<AppState>,
    matched: Option<MatchedPath>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(route) = matched.and_then(|m| route_of(req.method(), m.as_str())) else {
        return ApiError::new(ErrorCode::Forbidden, "this route has no access rule")
            .into_response();
    };
    if route.access == Access::Public {
        return next.run(req).await;
    }
    let path = req.uri().path().to_string();
    if route.access == Access::Attempt {
        // No role's token: only the key issued with this attempt's lease.
        let header = req
            .headers()
            .get(AUTHORIZATION)
            .map(|v| v.to_str().unwrap_or_default().to_string());
        return match attempt_caller(&s, route, &path, header.as_deref()).await {
            Ok(caller) => {
                tracing::Span::current().record("who", caller.0.to_string().as_str());
                req.extensions_mut().insert(caller);
                let response = next.run(req).await;
                // An end reported by a supervisor changes its job: audited (renewals and log
                // chunks are its steady traffic).
                if route.path == routes::REPORT_OUTCOME.path {
                    tracing::info!(
                        target: "headroom::audit",
                        actor = %format_args!("supervisor of attempt {}", caller.0),
                        action = %format_args!("{} {}", route.method, route.path),
                        target = %path,
                        status = response.status().as_u16(),
                        "audit"
                    );
                }
                response
            }
            Err(e) => {
                let answer = e.into_response();
                refused(&s, route, &path, None, None, answer.status().as_u16());
                answer
            }
        };
    }
    // Where the request came from (served with connect info), for throttling guesses.
    let client = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let who = if s.auth.enabled() {
        let header = req
            .headers()
            .get(AUTHORIZATION)
            .map(|v| v.to_str().unwrap_or_default());
        match s.auth.identify(header, client).await {
            Ok(p) => p,
            Err(e) => {
                let answer = ApiError::from(e).into_response();
                refused(&s, route, &path, None, client, answer.status().as_u16());
                return answer;
            }
        }
    } else {
        Principal::anonymous()
    };
    tracing::Span::current().record("who", who.name.as_str());
    if let Err(needed) = crate::rules::may_call(route.access, who.role)
        && s.auth.enabled()
    {
        let answer = ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "{} {} needs role {needed}; this token ({}) has role {}",
                route.method, route.path, who.name, who.role
            ),
        )
        .into_response();
        refused(&s, route, &path, Some(&who), client, 403);
        return answer;
    }
    req.extensions_mut().insert(who.clone());
    let response = next.run(req).await;
    let status = response.status().as_u16();
    if status == 403 {
        // Refused by a handler's own rule (owner, node binding).
        refused(&s, route, &path, Some(&who), client, status);
    } else if audited(route) {
        tracing::info!(
            target: "headroom::audit",
            actor = %who.name,
            role = %who.role,
            node = %if who.role == Role::Agent { who.name.as_str() } else { "" },
            action = %format_args!("{} {}", route.method, route.path),
            target = %path,
            status,
            "audit"
        );
    }
    response
}

/// The attempt a request under an [`Access::Attempt`] route acts for, proven by its key.
#[derive(Clone, Copy, Debug)]
pub struct AttemptCaller(pub headroom_shared::AttemptId);

/// Checks the bearer key against the one issued with the attempt the path names.
async fn attempt_caller(
    s: &AppState,
    route: &Route,
    path: &str,
    header: Option<&str>,
) -> Result<AttemptCaller, ApiError> {
    let raw = route
        .path
        .split('/')
        .zip(path.split('/'))
        .find(|(t, _)| *t == "{id}")
        .map(|(_, v)| v)
        .ok_or_else(|| ApiError::internal("an attempt route without an attempt id"))?;
    let unauthenticated = || {
        ApiError::new(
            ErrorCode::Unauthenticated,
            format!("{path} needs the key issued with this attempt's lease"),
        )
    };
    let presented = header
        .and_then(|h| h.strip_prefix("Bearer "))
        .ok_or_else(unauthenticated)?;
    // A malformed id has no key: refused as a wrong key is.
    let attempt: headroom_shared::AttemptId = raw.parse().map_err(|_| unauthenticated())?;
    let stored = match s.store.attempt_key(attempt).await {
        Ok(k) => k,
        // An unknown attempt reads as a wrong key: ids are not probed through this route.
        Err(crate::store::StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    match stored {
        Some(stored) if crate::attempt_keys::matches(&stored, presented) => {
            Ok(AttemptCaller(attempt))
        }
        _ => Err(unauthenticated()),
    }
}

/// State-changing requests are audited, but for an agent's steady traffic (claims,
/// heartbeats, log chunks) which would drown the rest.
fn audited(route: &Route) -> bool {
    use headroom_shared::routes as r;
    route.method != Method::Get
        && ![r::CLAIM.path, r::HEARTBEAT.path, r::APPEND_LOG.path].contains(&route.path)
}

/// A refused request: an audit event and the refusals metric, by route.
fn refused(
    s: &AppState,
    route: &Route,
    path: &str,
    who: Option<&Principal>,
    client: Option<std::net::IpAddr>,
    status: u16,
) {
    s.metrics.refused(route.path, status);
    let left_out = match s.refusals.admit(std::time::Instant::now()) {
        refusals::Verdict::Skip => return,
        refusals::Verdict::Log { left_out } => left_out,
    };
    if left_out > 0 {
        tracing::warn!(
            target: "headroom::audit",
            left_out,
            "refusals not logged in the second before (too many; headroom_refused_requests_total counts them)"
        );
    }
    tracing::warn!(
        target: "headroom::audit",
        actor = %who.map_or("", |w| w.name.as_str()),
        role = %who.map_or(String::new(), |w| w.role.to_string()),
        client = %client.map(|c| c.to_string()).unwrap_or_default(),
        action = %format_args!("{} {}", route.method, route.path),
        target = %path,
        status,
        "refused"
    );
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Store(s) => s.into(),
            AuthError::Throttled(_) => ApiError::new(ErrorCode::Throttled, e.to_string()),
            AuthError::Busy => ApiError::new(ErrorCode::Busy, e.to_string()),
            other => ApiError::new(ErrorCode::Unauthenticated, other.to_string()),
        }
    }
}

/// Cancel and retry: refused (403) unless the caller submitted it or is an admin.
fn check_owner(who: &Principal, submitted_by: &str, what: &str) -> Result<(), ApiError> {
    if crate::rules::may_act_on(who, submitted_by) {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "{what} was submitted by `{submitted_by}`: only they or an admin may do this \
                 (this token: `{}`, role {})",
                who.name, who.role
            ),
        ))
    }
}

/// Agent routes: refused (403) unless the caller's token is bound to the node the agent or
/// attempt belongs to (`rules::may_act_as_node`). An unknown agent or attempt passes here:
/// the store operation refuses it.
async fn check_node(s: &AppState, who: &Principal, of: NodeOf) -> Result<(), ApiError> {
    if who.role == Role::Admin {
        return Ok(());
    }
    if let Some(node) = s.owners.get(of) {
        return check_node_name(who, &node);
    }
    match s.store.node_of(of).await? {
        Some(node) => {
            s.owners.remember(of, &node);
            check_node_name(who, &node)
        }
        // Unknown: the operation itself answers that it is not found.
        None => Ok(()),
    }
}

/// As [`check_node`], for a node named in the request.
fn check_node_name(who: &Principal, node: &str) -> Result<(), ApiError> {
    if crate::rules::may_act_as_node(who, node) {
        return Ok(());
    }
    tracing::warn!(who = %who.name, node, "an agent token acted for another node: refused");
    Err(ApiError::new(
        ErrorCode::Forbidden,
        format!(
            "this agent token is bound to node `{}`: it may not act for node `{node}` \
             (an admin makes one per node with `headroom token create --role agent --name \
             NODE`)",
            who.name
        ),
    ))
}

/// Parses an id from the path, naming it in the error.
fn parse_id<T: std::str::FromStr>(raw: &str, what: &str) -> Result<T, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::new(
            ErrorCode::BadRequest,
            format!("`{raw}` is not a valid {what} id"),
        )
    })
}

/// Samples must name GPUs the node has; a typo'd index would be silently ignored.
fn check_samples(samples: &[GpuSample]) -> Result<(), ApiError> {
    for (i, s) in samples.iter().enumerate() {
        if samples[..i].iter().any(|o| o.index == s.index) {
            return Err(ApiError::invalid(
                format!("gpus[{i}].index"),
                format!("GPU {} is reported twice", s.index),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use headroom_shared::routes;
    use tokio_util::sync::CancellationToken;

    use crate::store::sqlite::SqliteStore;
    use crate::{Application, CoordinatorConfig};

    /// Every route of the shared table reaches a handler: it answers in the API's shape (an
    /// error body names a code), never with axum's bare 404/405 for an unknown route.
    #[tokio::test]
    async fn every_route_of_the_table_is_served() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("headroom.db");
        let store = tokio::task::spawn_blocking(move || SqliteStore::open(&db)).await??;
        let config = CoordinatorConfig::new("127.0.0.1:0".parse()?, dir.path().to_path_buf());
        let app = Application::build(config, Arc::new(store)).await?;
        let base = format!("http://{}", app.local_addr());
        let stop = CancellationToken::new();
        let server = tokio::spawn(app.run(stop.clone()));
        let http = headroom_shared::client::http_builder().build()?;
        for route in routes::ALL {
            let args: Vec<String> = route.params().map(|_| "0".to_string()).collect();
            let args: Vec<&dyn std::fmt::Display> =
                args.iter().map(|a| a as &dyn std::fmt::Display).collect();
            let url = format!("{base}{}", route.path_with(&args));
            let method = match route.method {
                routes::Method::Get => reqwest::Method::GET,
                routes::Method::Post => reqwest::Method::POST,
                routes::Method::Put => reqwest::Method::PUT,
            };
            let resp = http
                .request(method, &url)
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await?;
            let status = resp.status().as_u16();
            let text = resp.text().await?;
            assert_ne!(status, 405, "{} {url}: {text}", route.method);
            if status >= 400 {
                let body: serde_json::Value = serde_json::from_str(&text)
                    .unwrap_or_else(|_| panic!("{} {url}: {status} `{text}`", route.method));
                let code = body["error"]["code"].as_str().unwrap_or_default();
                assert!(
                    !code.is_empty() && code != "unknown",
                    "{} {url}: {text}",
                    route.method
                );
                assert!(
                    !(status == 404 && text.contains("no such route")),
                    "{} {url} is not routed",
                    route.method
                );
            }
        }
        let (status, text) = {
            let r = http.get(format!("{base}/v1/nope")).send().await?;
            (r.status().as_u16(), r.text().await?)
        };
        assert_eq!(status, 404);
        assert!(text.contains("not_found"), "{text}");
        // A path segment of the wrong type is a client's mistake in the API's error shape.
        let r = http
            .post(format!("{base}/v1/nodes/n1/gpus/-1/release"))
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 400);
        let body: serde_json::Value = r.json().await?;
        assert_eq!(body["error"]["code"], "bad_request", "{body}");
        // A node of no GPUs (or the same GPU twice) is refused naming the field, and stores
        // nothing that would break reading the nodes back (found by schemathesis).
        for gpus in [
            serde_json::json!([]),
            serde_json::json!([
                {"index": 0, "uuid": "GPU-a", "name": "x", "total_mib": 1024},
                {"index": 0, "uuid": "GPU-b", "name": "x", "total_mib": 1024}
            ]),
        ] {
            let r = http
                .post(format!("{base}/v1/agents/register"))
                .json(&serde_json::json!({"node": "n0", "gpus": gpus, "version": "t"}))
                .send()
                .await?;
            assert_eq!(r.status().as_u16(), 422);
            let body: serde_json::Value = r.json().await?;
            assert_eq!(
                body["error"]["field"]
                    .as_str()
                    .map(|f| f.starts_with("gpus")),
                Some(true),
                "{body}"
            );
        }
        let r = http.get(format!("{base}/v1/nodes")).send().await?;
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await?);
        // A known path with a method it does not take: 405 in the error shape, with `Allow`.
        let r = http.delete(format!("{base}/v1/health")).send().await?;
        assert_eq!(r.status().as_u16(), 405);
        let allow = r.headers().get("allow").cloned();
        let body: serde_json::Value = r.json().await?;
        assert_eq!(body["error"]["code"], "bad_request", "{body}");
        assert_eq!(
            allow.as_ref().and_then(|v| v.to_str().ok()),
            Some("GET,HEAD")
        );
        // The OpenAPI document is served, without a token, and names every route.
        let doc: serde_json::Value = http
            .get(format!("{base}{}", super::OPENAPI_PATH))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        for route in routes::ALL {
            let method = route.method.to_string().to_lowercase();
            assert!(
                doc["paths"][route.path][&method].is_object(),
                "{}",
                route.path
            );
        }
        stop.cancel();
        server.await??;
        Ok(())
    }
}
