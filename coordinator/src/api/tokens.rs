//! Tokens the coordinator keeps (admins only, by the route table): create (the secret is
//! answered once, the store keeps an argon2 hash), list, revoke; and a join token's
//! exchange for a new node's agent credential.

use axum::Extension;
use axum::extract::State;
use headroom_shared::api::{
    CreateTokenRequest, CreatedToken, ErrorCode, JoinRequest, Principal, PutUserRequest, Role,
    TokenView, UserLimits, UserView, WhoAmI,
};

use super::{ApiError, ApiJson, ApiPath, ApiResult, AppState};
use crate::auth;
use crate::store::NewToken;

pub async fn create(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiJson(req): ApiJson<CreateTokenRequest>,
) -> ApiResult<CreatedToken> {
    if !s.auth.enabled() {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "this coordinator runs without tokens (loopback, everyone is admin): start it with \
             --admin-token (HEADROOM_ADMIN_TOKEN) to use tokens",
        ));
    }
    auth::check_name(&req.name).map_err(|m| ApiError::invalid("name", m))?;
    auth::check_join_nodes(req.role, req.nodes.as_deref())
        .map_err(|m| ApiError::invalid("nodes", m))?;
    if let Some(owner) = &s.config.single_user
        && matches!(req.role, Role::User | Role::Admin)
        && req.name != *owner
    {
        return Err(single_user_refusal(owner, &req.name));
    }
    let expires_at = match req.expires_in.as_deref() {
        None => None,
        Some(text) => {
            let d = humantime::parse_duration(text.trim()).map_err(|e| {
                ApiError::invalid(
                    "expires_in",
                    format!("`{text}` is not a duration like `90d` or `12h`: {e}"),
                )
            })?;
            let ms = i64::try_from(d.as_millis())
                .ok()
                .filter(|ms| *ms > 0)
                .ok_or_else(|| ApiError::invalid("expires_in", "must be above zero"))?;
            Some(crate::store::now_ms().saturating_add(ms))
        }
    };
    let (id, token, secret_hash, secret_digest) = new_hashed_token().await?;
    let view = s
        .store
        .create_token(NewToken {
            id,
            name: req.name,
            role: req.role,
            secret_hash,
            secret_digest: Some(secret_digest),
            created_by: who.name,
            expires_at,
            nodes: req.nodes,
        })
        .await?;
    tracing::info!(id = %view.id, name = %view.name, role = %view.role, by = %view.created_by, nodes = ?view.nodes, "token created");
    Ok(ApiJson(CreatedToken { token, view }))
}

/// Joins hashing their credential at once, at most.
static JOIN_HASHES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
/// How long a join waits for one of them.
const JOIN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What a join token may make: its nodes, and when the credentials it makes expire (with it).
struct Grant {
    nodes: Vec<String>,
    expires_at: Option<i64>,
}

/// The grant of the join token `who` presented: from the store, or from the configuration
/// (the bootstrap join token, a tokens file's entry). A join token that names no nodes (one
/// kept from before they were named) grants nothing.
async fn grant_of(s: &AppState, who: &Principal) -> Result<Grant, ApiError> {
    let configured = s.config.tokens.iter().find(|t| {
        t.role == Role::Join
            && match &who.token_id {
                Some(id) => t.id.as_deref() == Some(id.as_str()),
                None => t.id.is_none() && t.name == who.name,
            }
    });
    let (nodes, expires_at) = match (configured, &who.token_id) {
        (Some(t), _) => (t.nodes.clone(), t.expires_at),
        (None, Some(id)) => {
            let view = s.store.token_by_id(id).await?.view;
            // Revoked on another replica, and still in this one's memory for a while: it
            // makes nothing more.
            if view.revoked_at.is_some() {
                return Err(ApiError::new(
                    ErrorCode::Unauthenticated,
                    "the token is not known to this coordinator (wrong, or revoked)",
                ));
            }
            (view.nodes, view.expires_at.map(|t| t.timestamp_millis()))
        }
        (None, None) => (None, None),
    };
    let nodes = nodes.filter(|n| !n.is_empty()).ok_or_else(|| {
        ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "join token `{}` names no nodes it may make (made before join tokens named \
                 them): an admin makes a new one with `headroom token create --role join \
                 --nodes 'gpu-*'`",
                who.name
            ),
        )
    })?;
    Ok(Grant { nodes, expires_at })
}

/// A join token's exchange: the agent credential of a node that has none, made now and
/// shown this once (the agent keeps it in its data directory). Only a node the join token
/// names (the admin's decision), and the credential expires when the join token does. A
/// node that is registered or has ever had an agent token of its name is refused: a join
/// token makes first credentials, it never replaces one.
pub async fn join(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiJson(req): ApiJson<JoinRequest>,
) -> ApiResult<CreatedToken> {
    if !s.auth.enabled() {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "this coordinator runs without tokens: there is no credential to join for",
        ));
    }
    auth::check_name(&req.node).map_err(|m| ApiError::invalid("node", m))?;
    let grant = grant_of(&s, &who).await?;
    if !crate::joins::allows(&grant.nodes, &req.node) {
        tracing::warn!(join = %who.name, node = %req.node, "a join for a node its token does not name: refused");
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "join token `{}` may make nodes {} only: `{}` is not one of them (an admin \
                 decides which nodes join)",
                who.name,
                grant.nodes.join(", "),
                req.node
            ),
        ));
    }
    // Refused before anything is hashed (argon2 costs ~19 MiB a time), and hashes made two
    // at a time: a flood of joins must not cost the coordinator its memory.
    s.store.joinable(&req.node).await?;
    let _slot = tokio::time::timeout(JOIN_WAIT, JOIN_HASHES.acquire())
        .await
        .map_err(|_| ApiError::new(ErrorCode::Busy, "too many joins at once: try again"))?
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let (id, token, secret_hash, secret_digest) = new_hashed_token().await?;
    let view = s
        .store
        .join_node(NewToken {
            id,
            name: req.node,
            role: Role::Agent,
            secret_hash,
            secret_digest: Some(secret_digest),
            created_by: who.name,
            // What a join made lives no longer than what made it.
            expires_at: grant.expires_at,
            nodes: None,
        })
        .await?;
    tracing::info!(id = %view.id, node = %view.name, by = %view.created_by, "node joined: its agent credential made");
    Ok(ApiJson(CreatedToken { token, view }))
}

/// Why a coordinator whose jobs all run as one account serves no second user.
fn single_user_refusal(owner: &str, name: &str) -> ApiError {
    ApiError::new(
        ErrorCode::Conflict,
        format!(
            "this coordinator's jobs all run as one account (a `headroom up` not run as root), \
             whose user is `{owner}`: `{name}`'s jobs would run as that account too and could \
             read its files, its admin token among them. To serve several users, run \
             `sudo headroom up` (each user's jobs then run as their own Unix user) or a \
             coordinator with root agents"
        ),
    )
}

/// A new token: its id, its secret (answered once), the argon2 hash the store keeps for
/// replicas of earlier versions (made off the runtime) and the digest it is checked by.
async fn new_hashed_token() -> Result<(String, String, String, String), ApiError> {
    let (id, token) = auth::new_token();
    let secret = token.clone();
    let secret_hash = tokio::task::spawn_blocking(move || auth::hash_secret(&secret))
        .await
        .map_err(|e| ApiError::internal(format!("hashing task: {e}")))?
        .map_err(ApiError::internal)?;
    let digest = auth::digest_token(&token);
    Ok((id, token, secret_hash, digest))
}

pub async fn whoami(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
) -> ApiResult<WhoAmI> {
    let unix_user = s
        .store
        .users()
        .await?
        .into_iter()
        .find(|u| u.name == who.name)
        .and_then(|u| u.unix_user);
    Ok(ApiJson(WhoAmI {
        name: who.name,
        role: who.role,
        unix_user,
    }))
}

pub async fn list(State(s): State<AppState>) -> ApiResult<Vec<TokenView>> {
    Ok(ApiJson(s.store.list_tokens().await?))
}

pub async fn revoke(
    State(s): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<TokenView> {
    let view = s.store.revoke_token(&id).await?;
    s.auth.forget(&view.id);
    tracing::info!(id = %view.id, name = %view.name, "token revoked");
    Ok(ApiJson(view))
}

pub async fn users(State(s): State<AppState>) -> ApiResult<Vec<UserView>> {
    Ok(ApiJson(s.store.users().await?))
}

/// A request's share and caps, each at least 1 (a cap of 0 would hold every job forever
/// without saying who meant it: revoke the user's tokens instead).
fn user_limits(req: &PutUserRequest) -> Result<UserLimits, ApiError> {
    let at_least_one = |field: &str, v: Option<u64>| match v {
        Some(0) => Err(ApiError::invalid(
            field,
            format!("{field} must be at least 1"),
        )),
        _ => Ok(()),
    };
    at_least_one("share", Some(u64::from(req.share)))?;
    at_least_one("max_jobs", req.max_jobs.map(u64::from))?;
    at_least_one("max_gpus", req.max_gpus.map(u64::from))?;
    at_least_one("max_gpu_mib", req.max_gpu_mib)?;
    Ok(UserLimits {
        share: req.share,
        max_jobs: req.max_jobs,
        max_gpus: req.max_gpus,
        max_gpu_mib: req.max_gpu_mib,
    })
}

/// Creates a user or changes its Unix user, share and caps; its role is fixed once it
/// exists.
pub async fn put_user(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<PutUserRequest>,
) -> ApiResult<UserView> {
    // Without tokens every local account is this anonymous admin: mapping a user (root
    // above all) would let any of them run jobs as another Unix user.
    if !s.auth.enabled() {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "this coordinator runs without tokens (every local account is its anonymous \
             admin), so its jobs run as the agent's own or default user and users cannot be \
             mapped to Unix users: start it with --admin-token (HEADROOM_ADMIN_TOKEN) to use \
             users",
        ));
    }
    auth::check_name(&name).map_err(|m| ApiError::invalid("name", m))?;
    if let Some(owner) = &s.config.single_user
        && (name != *owner || req.unix_user.is_some())
    {
        return Err(single_user_refusal(owner, &name));
    }
    if let Some(u) = &req.unix_user {
        auth::check_unix_user(u, req.allow_root).map_err(|m| ApiError::invalid("unix_user", m))?;
    }
    let limits = user_limits(&req)?;
    let user = s
        .store
        .put_user(UserView {
            name,
            role: req.role,
            unix_user: req.unix_user,
            allow_root: req.allow_root,
            limits,
            created_at: chrono::Utc::now(),
        })
        .await?;
    tracing::info!(user = %user.name, role = %user.role, unix_user = ?user.unix_user, by = %who.name, "user changed");
    Ok(ApiJson(user))
}
