//! Tokens and roles over real HTTP: every route of the shared table (`routes::ALL`) against
//! every role, no token and bad tokens; the owner rule; revocation; and the refusal to listen
//! beyond loopback without tokens.

mod common;

use std::sync::Arc;

use headroom_coordinator::app::AppError;
use headroom_coordinator::auth::{self, ConfigToken, Secret};
use headroom_coordinator::store::sqlite::SqliteStore;
use headroom_coordinator::{Application, CoordinatorConfig};
use headroom_shared::api::Role;
use headroom_shared::routes::{self, Access, Method, Route};
use serde_json::{Value, json};

use common::{Server, peak_rss_mib};

const ADMIN: &str = "bootstrap-admin-secret-0123456789";

async fn start(tokens: Vec<ConfigToken>) -> Server {
    Server::start(|config| CoordinatorConfig { tokens, ..config }).await
}

impl Server {
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> (u16, Value) {
        let m = match method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
        };
        let mut req = self
            .http
            .request(m, format!("{}{path}", self.base))
            .json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn create_token(&self, name: &str, role: &str) -> String {
        self.create_token_with(json!({"name": name, "role": role}))
            .await
    }

    /// A join token that may make the nodes `gpu-*`.
    async fn create_join_token(&self, name: &str) -> String {
        self.create_token_with(json!({"name": name, "role": "join", "nodes": ["gpu-*"]}))
            .await
    }

    async fn create_token_with(&self, body: Value) -> String {
        let (status, v) = self
            .call(Method::Post, routes::CREATE_TOKEN.path, Some(ADMIN), &body)
            .await;
        assert_eq!(status, 200, "{v}");
        v["token"].as_str().expect("token").to_string()
    }

    /// Registers `node` (one 10 GiB GPU) with its agent `token`, then claims one lease for
    /// it (a job must be waiting): the agent's id and the lease.
    async fn node_with_lease(&self, token: &str, node: &str) -> (String, Value) {
        self.node_with_lease_as(Some(token), node).await
    }

    /// As [`Server::node_with_lease`], with no token where the coordinator has none.
    async fn node_with_lease_as(&self, token: Option<&str>, node: &str) -> (String, Value) {
        let gpus = json!([{"index": 0, "uuid": "GPU-0", "name": "t", "total_mib": 10_000}]);
        let (status, reg) = self
            .call(
                Method::Post,
                routes::REGISTER.path,
                token,
                &json!({"node": node, "gpus": gpus, "version": "t"}),
            )
            .await;
        assert_eq!(status, 200, "{reg}");
        let agent = reg["agent"].as_str().expect("agent id").to_string();
        let (status, claimed) = self
            .call(
                Method::Post,
                &routes::CLAIM.path_with(&[&agent]),
                token,
                &json!({"gpus": samples(), "max": 1, "wait_ms": 0}),
            )
            .await;
        assert_eq!(status, 200, "{claimed}");
        (agent, claimed["leases"][0].clone())
    }

    /// A job on a coordinator without tokens.
    async fn submit_open(&self) {
        let spec = json!({"spec": {"name": "open", "command": ["true"]}});
        let (status, v) = self
            .call(Method::Post, routes::SUBMIT.path, None, &spec)
            .await;
        assert_eq!(status, 200, "{v}");
    }

    async fn submit(&self, token: &str) -> String {
        let spec = json!({"spec": {"name": "own", "command": ["true"]}});
        let (status, v) = self
            .call(Method::Post, routes::SUBMIT.path, Some(token), &spec)
            .await;
        assert_eq!(status, 200, "{v}");
        v["experiment"].as_str().expect("experiment id").to_string()
    }
}

/// The one GPU of the nodes these tests register, empty.
fn samples() -> Value {
    json!([{"index": 0, "used_mib": 0, "free_mib": 10_000}])
}

fn admin_config() -> Vec<ConfigToken> {
    vec![auth::admin_token(ADMIN).expect("admin token")]
}

/// A tokens-file entry: `token` (`hr_<id>_<secret>`) of `name` with `role`, kept as argon2.
fn file_token(token: &str, name: &str, role: Role) -> ConfigToken {
    let id = token
        .strip_prefix(auth::TOKEN_PREFIX)
        .and_then(|t| t.split_once('_'))
        .map(|(id, _)| id.to_string());
    ConfigToken {
        id,
        name: name.into(),
        role,
        secret: Secret::Hash(auth::hash_secret(token).expect("hash")),
        unix_user: None,
        nodes: None,
        expires_at: None,
    }
}

/// The concrete path of a route, with `0` for every path parameter.
fn path_of(route: &Route) -> String {
    let args: Vec<String> = route.params().map(|_| "0".to_string()).collect();
    let args: Vec<&dyn std::fmt::Display> =
        args.iter().map(|a| a as &dyn std::fmt::Display).collect();
    route.path_with(&args)
}

fn assert_error(v: &Value, code: &str, what: &str) {
    assert_eq!(v["error"]["code"], code, "{what}: {v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{what}: {v}"
    );
}

/// Which roles a route admits. Exhaustive on purpose: a new access class must be decided
/// here; a new route is covered by iterating the table.
fn admits(access: Access, role: Role) -> bool {
    match access {
        Access::Public => true,
        Access::User | Access::Owner => matches!(role, Role::User | Role::Admin),
        Access::Admin => role == Role::Admin,
        Access::Agent => role == Role::Agent,
        Access::Join => role == Role::Join,
        // Only the key issued with the attempt's lease: no role's token is it.
        Access::Attempt => false,
    }
}

#[tokio::test]
async fn every_route_admits_its_roles_and_refuses_the_rest() {
    let s = start(admin_config()).await;
    let user = s.create_token("alice", "user").await;
    let agent = s.create_token("node-1", "agent").await;
    let join = s.create_join_token("lab-join").await;
    let roles = [
        (Role::Admin, ADMIN),
        (Role::User, &user),
        (Role::Agent, &agent),
        (Role::Join, &join),
    ];
    // A made-up stored token, a known id with the wrong secret, and a plain wrong secret.
    let known_id = agent.rsplit_once('_').map(|(id, _)| id).expect("id part");
    let bad = [
        "hr_0123456789abcdef_wrongwrongwrong".to_string(),
        format!("{known_id}_not-the-secret"),
        "not-a-token-at-all-0123456789".to_string(),
    ];
    let body = json!({});
    for route in routes::ALL {
        let path = path_of(route);
        let what = format!("{} {}", route.method, route.path);
        let (status, v) = s.call(route.method, &path, None, &body).await;
        if route.access == Access::Public {
            assert_eq!(status, 200, "{what} is public: {v}");
            continue;
        }
        assert_eq!(status, 401, "{what} without a token: {v}");
        assert_error(&v, "unauthenticated", &what);
        for b in &bad {
            let (status, v) = s.call(route.method, &path, Some(b), &body).await;
            assert_eq!(status, 401, "{what} with a bad token: {v}");
            assert_error(&v, "unauthenticated", &what);
            assert!(
                !v.to_string().contains(b.as_str()),
                "the answer repeats the token: {v}"
            );
        }
        for (role, token) in roles {
            let (status, v) = s.call(route.method, &path, Some(token), &body).await;
            if route.access == Access::Attempt {
                assert_eq!(status, 401, "{what} as {role}: {v}");
                assert_error(&v, "unauthenticated", &what);
            } else if admits(route.access, role) {
                assert!(
                    status != 401 && status != 403,
                    "{what} as {role} must be let through: {status} {v}"
                );
            } else {
                assert_eq!(status, 403, "{what} as {role}: {v}");
                assert_error(&v, "forbidden", &what);
                let needed = match route.access {
                    Access::Agent => "needs role agent",
                    Access::Join => "needs role join",
                    Access::Admin => "needs role admin",
                    _ => "needs role user or admin",
                };
                let msg = v["error"]["message"].as_str().unwrap_or_default();
                assert!(msg.contains(needed), "{what} as {role}: {msg}");
            }
        }
    }
    // The unknown-route fallback is unaffected (404, not 401).
    let (status, _) = s.call(Method::Get, "/v1/nope", None, &body).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn users_cancel_and_retry_only_their_own_runs_admins_any() {
    let s = start(admin_config()).await;
    let alice = s.create_token("alice", "user").await;
    let bob = s.create_token("bob", "user").await;
    let bobs = s.submit(&bob).await;
    let (status, v) = s
        .call(
            Method::Get,
            &routes::EXPERIMENT.path_with(&[&bobs]),
            Some(&alice),
            &json!({}),
        )
        .await;
    assert_eq!(status, 200, "users see everything: {v}");
    assert_eq!(v["submitted_by"], "bob");
    let cancel = routes::CANCEL_EXPERIMENT.path_with(&[&bobs]);
    let (status, v) = s
        .call(Method::Post, &cancel, Some(&alice), &json!({}))
        .await;
    assert_eq!(status, 403, "alice cancels bob's experiment: {v}");
    assert_error(&v, "forbidden", "cancel");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("bob")
    );
    // Nothing was cancelled.
    let (_, jobs) = s
        .call(
            Method::Get,
            &format!("/v1/jobs?experiment={bobs}"),
            Some(&bob),
            &json!({}),
        )
        .await;
    let job = jobs[0]["id"].as_str().expect("job id").to_string();
    assert_eq!(jobs[0]["state"], "queued");
    assert_eq!(jobs[0]["submitted_by"], "bob");
    let (status, _) = s
        .call(
            Method::Post,
            &routes::CANCEL_JOB.path_with(&[&job]),
            Some(&alice),
            &json!({}),
        )
        .await;
    assert_eq!(status, 403, "nor one of its jobs");
    let (status, _) = s
        .call(
            Method::Post,
            &routes::RETRY_JOB.path_with(&[&job]),
            Some(&alice),
            &json!({}),
        )
        .await;
    assert_eq!(status, 403, "nor retry it");
    // The admin may; bob may cancel his own.
    let (status, v) = s.call(Method::Post, &cancel, Some(ADMIN), &json!({})).await;
    assert_eq!(status, 200, "admin cancels bob's: {v}");
    assert_eq!(v["cancelled"], 1);
    let own = s.submit(&alice).await;
    let (status, v) = s
        .call(
            Method::Post,
            &routes::CANCEL_EXPERIMENT.path_with(&[&own]),
            Some(&alice),
            &json!({}),
        )
        .await;
    assert_eq!(status, 200, "alice cancels her own: {v}");
    let (status, v) = s
        .call(
            Method::Post,
            &routes::RETRY_JOB.path_with(&[&job]),
            Some(&bob),
            &json!({}),
        )
        .await;
    assert_eq!(status, 200, "bob retries his cancelled job: {v}");
    // An experiment's failed jobs in one request: its owner's or an admin's to ask.
    let retry_all = routes::RETRY_FAILED.path_with(&[&bobs]);
    let (status, v) = s
        .call(Method::Post, &retry_all, Some(&alice), &json!({}))
        .await;
    assert_eq!(status, 403, "alice retries bob's experiment: {v}");
    assert_error(&v, "forbidden", "experiment");
    for who in [&bob, ADMIN] {
        let (status, v) = s
            .call(Method::Post, &retry_all, Some(who), &json!({}))
            .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["experiment"], bobs.as_str());
        assert_eq!(v["retried"], json!([]), "nothing of bob's had failed: {v}");
    }
}

#[tokio::test]
async fn revoked_tokens_stop_working_at_once_and_secrets_are_never_listed() {
    let s = start(admin_config()).await;
    let user = s.create_token("carol", "user").await;
    let (status, _) = s
        .call(Method::Get, routes::JOBS.path, Some(&user), &json!({}))
        .await;
    assert_eq!(status, 200, "the new token works (and is now remembered)");
    let (status, list) = s
        .call(Method::Get, routes::TOKENS.path, Some(ADMIN), &json!({}))
        .await;
    assert_eq!(status, 200);
    assert!(
        !list.to_string().contains(&user),
        "a listing shows no secret"
    );
    let digest = auth::digest_token(&user);
    assert!(
        !list.to_string().contains("argon2") && !list.to_string().contains(&digest),
        "nor its hash: {list}"
    );
    let id = list[0]["id"].as_str().expect("id").to_string();
    assert_eq!(list[0]["name"], "carol");
    assert_eq!(list[0]["created_by"], "admin");
    let (status, v) = s
        .call(
            Method::Post,
            &routes::REVOKE_TOKEN.path_with(&[&id]),
            Some(ADMIN),
            &json!({}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = s
        .call(Method::Get, routes::JOBS.path, Some(&user), &json!({}))
        .await;
    assert_eq!(status, 401, "revoked: {v}");
    assert_error(&v, "unauthenticated", "revoked");
    // An expired token: 401, saying so (verifying the secret alone outlasts 1 ms).
    let (status, v) = s
        .call(
            Method::Post,
            routes::CREATE_TOKEN.path,
            Some(ADMIN),
            &json!({"name": "erin", "role": "user", "expires_in": "1ms"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(v["expires_at"].is_string(), "{v}");
    let short = v["token"].as_str().expect("token").to_string();
    let (status, v) = s
        .call(Method::Get, routes::JOBS.path, Some(&short), &json!({}))
        .await;
    assert_eq!(status, 401, "expired: {v}");
    assert_error(&v, "unauthenticated", "expired");
    assert!(v.to_string().contains("expired"), "{v}");
    let (status, v) = s
        .call(
            Method::Post,
            routes::CREATE_TOKEN.path,
            Some(ADMIN),
            &json!({"name": "erin", "role": "user", "expires_in": "soon"}),
        )
        .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], "expires_in");
    // Bad input names the field.
    let (status, v) = s
        .call(
            Method::Post,
            routes::CREATE_TOKEN.path,
            Some(ADMIN),
            &json!({"name": "bad name!", "role": "user"}),
        )
        .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], "name");
    let (status, v) = s
        .call(
            Method::Post,
            routes::CREATE_TOKEN.path,
            Some(ADMIN),
            &json!({"name": "dave", "role": "root"}),
        )
        .await;
    assert!(status == 400 || status == 422, "{status} {v}");
    assert!(v.to_string().contains("role"), "{v}");
}

#[tokio::test]
async fn configured_hashed_tokens_work_and_open_coordinators_allow_everything_on_loopback() {
    let secret = "hr_f11e70c3_agent-secret-from-a-tokens-file";
    let hashed = file_token(secret, "node-9", Role::Agent);
    let s = start(vec![hashed]).await;
    let (status, v) = s
        .call(
            Method::Post,
            routes::REGISTER.path,
            Some(secret),
            &json!({}),
        )
        .await;
    assert!(status != 401 && status != 403, "{status} {v}");
    let (status, _) = s
        .call(Method::Get, routes::JOBS.path, Some(secret), &json!({}))
        .await;
    assert_eq!(status, 403, "an agent token reads no jobs");

    // No tokens: today's behaviour, everyone is the anonymous admin; tokens cannot be made.
    let open = start(vec![]).await;
    let (status, _) = open
        .call(Method::Get, routes::JOBS.path, None, &json!({}))
        .await;
    assert_eq!(status, 200);
    let (status, v) = open
        .call(
            Method::Post,
            routes::CREATE_TOKEN.path,
            None,
            &json!({"name": "x", "role": "user"}),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert!(v.to_string().contains("--admin-token"), "{v}");
}

/// A tokenless coordinator is no road to another Unix user: its anonymous admin cannot map a
/// user (root above all), a mapping its store kept from a run with tokens is not handed to
/// agents, and a foreign `Host` (DNS rebinding) or a foreign page's `Origin` is refused.
#[tokio::test]
async fn a_tokenless_coordinator_maps_no_user_and_answers_only_its_own_machine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(&dir.path().join("store.db")).expect("store");
    // What a run with tokens may have left: the anonymous user mapped to root.
    use headroom_coordinator::store::Store;
    store
        .put_user(headroom_shared::api::UserView {
            name: "anonymous".into(),
            role: Role::Admin,
            unix_user: Some("root".into()),
            allow_root: true,
            limits: Default::default(),
            created_at: chrono::Utc::now(),
        })
        .await
        .expect("a stored mapping");
    let open = Server::start_on(dir, store, |c| c).await;

    let (status, v) = open
        .call(
            Method::Put,
            &routes::PUT_USER.path_with(&[&"anonymous"]),
            None,
            &json!({"role": "admin", "unix_user": "root", "allow_root": true}),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert!(v.to_string().contains("without tokens"), "{v}");
    let (status, v) = open
        .call(
            Method::Put,
            &routes::PUT_USER.path_with(&[&"mallory"]),
            None,
            &json!({"role": "user", "unix_user": "nobody"}),
        )
        .await;
    assert_eq!(status, 409, "{v}");

    // The job of the anonymous admin leases with no Unix user: the agent runs it as its own
    // or default user.
    let spec = json!({"spec": {"name": "shadow", "command": ["cat", "/etc/shadow"]}});
    let (status, v) = open
        .call(Method::Post, routes::SUBMIT.path, None, &spec)
        .await;
    assert_eq!(status, 200, "{v}");
    let (_, lease) = open.node_with_lease_as(None, "node-x").await;
    assert_eq!(lease["argv"][0], "cat", "{lease}");
    assert!(
        lease["run_as"].is_null(),
        "a mapped user reached the agent: {lease}"
    );

    // DNS rebinding: a foreign name resolved to 127.0.0.1.
    for (method, path) in [
        (reqwest::Method::GET, routes::JOBS.path.to_string()),
        (
            reqwest::Method::POST,
            routes::CANCEL_EXPERIMENT.path_with(&[&"x"]),
        ),
    ] {
        let r = open
            .http
            .request(method.clone(), format!("{}{path}", open.base))
            .header("host", "rebound.evil.example:7420")
            .send()
            .await
            .expect("request");
        assert_eq!(r.status().as_u16(), 403, "{method} {path}");
        let v: Value = r.json().await.expect("json");
        assert_error(&v, "forbidden", "a foreign Host");
        assert!(v.to_string().contains("rebound.evil.example"), "{v}");
    }
    // A foreign page's body-less POST (no preflight) and a cross-site fetch.
    let host = open.base.trim_start_matches("http://").to_string();
    for (origin, site) in [
        (Some("http://evil.example"), None),
        (Some("null"), None),
        (None, Some("cross-site")),
    ] {
        let mut req = open.http.post(format!(
            "{}{}",
            open.base,
            routes::CANCEL_EXPERIMENT.path_with(&[&"x"])
        ));
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        if let Some(s) = site {
            req = req.header("sec-fetch-site", s);
        }
        let r = req.send().await.expect("request");
        assert_eq!(r.status().as_u16(), 403, "{origin:?} {site:?}");
    }
    // Its own page, and a loopback name with the port of an SSH tunnel, are served.
    let r = open
        .http
        .get(format!("{}{}", open.base, routes::JOBS.path))
        .header("origin", format!("http://{host}"))
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
    let r = open
        .http
        .get(format!("{}{}", open.base, routes::JOBS.path))
        .header("host", "localhost:8080")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);

    // With tokens, the same store's mapping is the admin's decision and reaches the agent.
    let s = start(admin_config()).await;
    let (status, v) = s
        .call(
            Method::Put,
            &routes::PUT_USER.path_with(&[&"admin"]),
            Some(ADMIN),
            &json!({"role": "admin", "unix_user": "nobody"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    s.submit(ADMIN).await;
    let agent = s.create_token("node-y", "agent").await;
    let (_, lease) = s.node_with_lease(&agent, "node-y").await;
    assert_eq!(lease["run_as"]["unix_user"], "nobody", "{lease}");
}

#[tokio::test]
async fn a_coordinator_open_to_the_network_needs_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.db")).expect("store"));
    let config = CoordinatorConfig::new("0.0.0.0:0".parse().expect("addr"), dir.path().into());
    let err = Application::build(config.clone(), store.clone())
        .await
        .err()
        .expect("refused without tokens");
    assert!(matches!(err, AppError::OpenToTheNetwork { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("0.0.0.0") && text.contains("HEADROOM_ADMIN_TOKEN"),
        "{text}"
    );
    let with_tokens = CoordinatorConfig {
        tokens: admin_config(),
        ..config
    };
    assert!(Application::build(with_tokens, store).await.is_ok());
}

/// An agent token acts only as the node it is named after: another node's token cannot
/// register as it, claim or heartbeat for its agent, or start, finish, log or hand back its
/// attempts (each 403, nothing changed); a second instance with the right token cannot
/// register over the live agent (409 naming it) until an admin allows a takeover.
#[tokio::test]
async fn an_agent_token_acts_only_for_its_own_node() {
    let s = start(admin_config()).await;
    let a = s.create_token("node-a", "agent").await;
    let b = s.create_token("node-b", "agent").await;
    let gpus = json!([{"index": 0, "uuid": "GPU-0", "name": "t", "total_mib": 10_000}]);
    let register = |node: &str, previous: Option<&str>| json!({"node": node, "gpus": gpus, "version": "t", "previous": previous});
    let samples = samples();
    s.submit(ADMIN).await;
    let (agent, lease) = s.node_with_lease(&a, "node-a").await;
    let claim_path = routes::CLAIM.path_with(&[&agent]);
    let claim = json!({"gpus": samples, "max": 1, "wait_ms": 0});
    let attempt = lease["attempt"].as_str().expect("attempt").to_string();
    let fence = lease["fence"].as_i64().expect("fence");
    let job = lease["job"].as_str().expect("job").to_string();

    let report = json!({
        "fence": fence, "failure": null, "exit_code": 0, "signal": null,
        "ended_at": "2026-11-24T10:00:00Z", "peak_mem_mib": null, "cleanup_ms": 0,
        "cleanup_verified": true, "log_tail": "", "gpus": samples
    });
    let cells: Vec<(&str, Method, String, Value)> = vec![
        (
            "register as node-a",
            Method::Post,
            routes::REGISTER.path.to_string(),
            register("node-a", Some(&agent)),
        ),
        ("claim", Method::Post, claim_path.clone(), claim.clone()),
        (
            "heartbeat",
            Method::Post,
            routes::HEARTBEAT.path_with(&[&agent]),
            json!({"attempts": [{"attempt": attempt, "fence": fence}], "gpus": samples}),
        ),
        (
            "start",
            Method::Post,
            routes::START.path_with(&[&attempt]),
            json!({"fence": fence, "pid": 1, "started_at": "2026-11-24T10:00:00Z"}),
        ),
        (
            "finish",
            Method::Post,
            routes::FINISH.path_with(&[&attempt]),
            report,
        ),
        (
            "hand back",
            Method::Post,
            routes::HAND_BACK.path_with(&[&attempt]),
            json!({"fence": fence, "reason": "x", "gpus": samples}),
        ),
    ];
    for (what, method, path, body) in &cells {
        let (status, v) = s.call(*method, path, Some(&b), body).await;
        assert_eq!(status, 403, "node-b's token: {what}: {v}");
        assert_error(&v, "forbidden", what);
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("node-b") && msg.contains("node-a"),
            "{what}: {msg}"
        );
    }
    // A log chunk (a body of bytes, not JSON).
    let resp = s
        .http
        .post(format!(
            "{}{}",
            s.base,
            routes::APPEND_LOG.path_with(&[&attempt])
        ))
        .query(&[("fence", fence.to_string()), ("offset", "0".to_string())])
        .bearer_auth(&b)
        .body("forged\n")
        .send()
        .await
        .expect("log");
    assert_eq!(resp.status().as_u16(), 403, "node-b's token: log");

    // Nothing changed: the job is still leased to node-a's agent, its log empty.
    let (_, detail) = s
        .call(
            Method::Get,
            &routes::JOB.path_with(&[&job]),
            Some(ADMIN),
            &json!({}),
        )
        .await;
    assert_eq!(detail["state"], "leased", "{detail}");
    assert_eq!(detail["node"], "node-a", "{detail}");
    let resp = s
        .http
        .get(format!(
            "{}{}",
            s.base,
            routes::READ_LOG.path_with(&[&attempt])
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("read log");
    assert!(!resp.text().await.expect("log").contains("forged"));

    // node-a's own token, as another instance (no previous id): 409, naming the live agent.
    let a2 = s.create_token("node-a", "agent").await;
    let (status, v) = s
        .call(
            Method::Post,
            routes::REGISTER.path,
            Some(&a2),
            &register("node-a", None),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(&agent) && msg.contains("takeover"), "{msg}");
    // Only an admin allows a takeover; then the other instance registers.
    let takeover = routes::TAKEOVER.path_with(&[&"node-a"]);
    let (status, _) = s.call(Method::Post, &takeover, Some(&a), &json!({})).await;
    assert_eq!(status, 403);
    let (status, v) = s
        .call(Method::Post, &takeover, Some(ADMIN), &json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = s
        .call(
            Method::Post,
            routes::REGISTER.path,
            Some(&a2),
            &register("node-a", None),
        )
        .await;
    assert_eq!(status, 200, "{v}");
}

/// Hundreds of concurrent guesses at a known token id cost a bounded number of argon2
/// hashes at a time (each ~19 MiB): memory stays bounded, the guesser is throttled (429),
/// and a valid caller is answered meanwhile. Guesses that arrived together and waited for a
/// hash are throttled at their turn once their client has failed too often: the flood costs
/// the window's 20 failures and the two in flight, not a hash per guess (150 of 300 were
/// hashed before). A guess repeated costs no hash at all. Guesses at a token the coordinator
/// made cost no argon2 at all (it is kept as its SHA-256): none waits for a verification
/// slot, and they are throttled too.
#[tokio::test]
async fn a_flood_of_wrong_tokens_leaves_memory_bounded_and_valid_callers_answered() {
    // A tokens-file entry (argon2: its secret is a person's) and a token made here.
    let file_secret = "hr_f100d000_a-tokens-file-secret-0123456789abcdef";
    let mut config = admin_config();
    config.push(file_token(file_secret, "alice", Role::User));
    let s = start(config).await;
    let made = s.create_token("bob", "user").await;
    for (token, hashed) in [(file_secret, true), (made.as_str(), false)] {
        // Used once: remembered, as a working client's token is.
        let (status, _) = s
            .call(Method::Get, routes::JOBS.path, Some(token), &json!({}))
            .await;
        assert_eq!(status, 200);
        let known_id = token
            .rsplit_once('_')
            .map(|(id, _)| id)
            .expect("id")
            .to_string();
        let before = peak_rss_mib();
        let mut guesses = Vec::new();
        for i in 0..300 {
            let (http, base, id) = (s.http.clone(), s.base.clone(), known_id.clone());
            guesses.push(tokio::spawn(async move {
                http.get(format!("{base}{}", routes::JOBS.path))
                    .bearer_auth(format!("{id}_wrong-guess-{i:04}-padding-padding"))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            }));
        }
        // While they are under way: the admin and the token's holder are answered.
        let started = std::time::Instant::now();
        for valid in [ADMIN, token] {
            let (status, v) = s
                .call(Method::Get, routes::JOBS.path, Some(valid), &json!({}))
                .await;
            assert_eq!(status, 200, "{v}");
        }
        let answered_in = started.elapsed();
        let mut statuses = std::collections::BTreeMap::new();
        for g in guesses {
            *statuses.entry(g.await.expect("guess")).or_insert(0) += 1;
        }
        let grew = peak_rss_mib().saturating_sub(before);
        let allowed: &[u16] = if hashed {
            &[401, 429, 503]
        } else {
            &[401, 429]
        };
        assert!(
            statuses.keys().all(|s| allowed.contains(s)),
            "hashed {hashed}: {statuses:?}"
        );
        assert!(
            statuses.get(&429).copied().unwrap_or(0) > 0,
            "not throttled (hashed {hashed}): {statuses:?}"
        );
        // Each 401 is a guess that was hashed: 20 failures per window, 2 verifications at
        // once.
        if hashed {
            assert!(
                statuses.get(&401).copied().unwrap_or(0) <= 20 + 2,
                "guesses hashed after their client was throttled: {statuses:?}"
            );
        }
        // Unbounded, 300 hashes at once held ~5.7 GiB; bounded, a few hashes' worth.
        assert!(
            grew < 1024,
            "memory grew {grew} MiB under the flood ({statuses:?})"
        );
        assert!(
            answered_in < std::time::Duration::from_secs(10),
            "valid callers waited {answered_in:?}"
        );
        eprintln!(
            "flood (argon2 {hashed}): {statuses:?}, peak RSS +{grew} MiB, valid answered in \
             {answered_in:?}"
        );
    }
}

/// Users see each other's jobs' parameters and states but not their `env` values nor their
/// logs, unless the lab shares them (`shared_visibility`); the owner and admins see all.
#[tokio::test]
async fn other_users_see_no_env_values_nor_logs_unless_shared() {
    for shared in [false, true] {
        let s = Server::start(|config| CoordinatorConfig {
            tokens: admin_config(),
            shared_visibility: shared,
            ..config
        })
        .await;
        let alice = s.create_token("alice", "user").await;
        let bob = s.create_token("bob", "user").await;
        let agent = s.create_token("n1", "agent").await;
        let spec = json!({"spec": {"name": "private", "command": ["true"],
            "grid": {"lr": [0.1]}, "env": {"WANDB_API_KEY": "alices-secret"}}});
        let (status, v) = s
            .call(Method::Post, routes::SUBMIT.path, Some(&alice), &spec)
            .await;
        assert_eq!(status, 200, "{v}");
        // An attempt, so that there is a log to read.
        let (_, lease) = s.node_with_lease(&agent, "n1").await;
        let (job, attempt) = (
            lease["job"].as_str().expect("job").to_string(),
            lease["attempt"].as_str().expect("attempt").to_string(),
        );
        let job_path = routes::JOB.path_with(&[&job]);
        let log_path = routes::READ_LOG.path_with(&[&attempt]);
        for (who, token, sees) in [
            ("alice", &alice, true),
            ("admin", &ADMIN.to_string(), true),
            ("bob", &bob, shared),
        ] {
            let (status, d) = s
                .call(Method::Get, &job_path, Some(token), &json!({}))
                .await;
            assert_eq!(status, 200, "{who}: {d}");
            assert_eq!(d["params"]["lr"], 0.1, "{who} sees the parameters: {d}");
            let value = d["env"]["WANDB_API_KEY"].as_str().unwrap_or_default();
            if sees {
                assert_eq!(value, "alices-secret", "{who} (shared {shared}): {d}");
            } else {
                assert_eq!(value, "<redacted>", "{who} (shared {shared}): {d}");
            }
            let (status, v) = s
                .call(Method::Get, &log_path, Some(token), &json!({}))
                .await;
            assert_eq!(
                status,
                if sees { 200 } else { 403 },
                "{who} (shared {shared}) log: {v}"
            );
        }
    }
}

/// The key issued with a lease lets that attempt's supervisor renew that lease and report
/// that attempt's end, and nothing else: no key, a wrong one, another attempt's, or any
/// role's token is 401; a stale fence is 409; the end is recorded once, whether the
/// supervisor, the agent or both report it.
#[tokio::test]
async fn an_attempt_key_acts_for_its_own_attempt_only() {
    let s = start(admin_config()).await;
    let a = s.create_token("node-a", "agent").await;
    let b = s.create_token("node-b", "agent").await;
    s.submit(ADMIN).await;
    let (_, lease) = s.node_with_lease(&a, "node-a").await;
    s.submit(ADMIN).await;
    let (_, other) = s.node_with_lease(&b, "node-b").await;
    let attempt = lease["attempt"].as_str().expect("attempt").to_string();
    let fence = lease["fence"].as_i64().expect("fence");
    let job = lease["job"].as_str().expect("job").to_string();
    let key = lease["report_key"]
        .as_str()
        .expect("a lease carries its key");
    let other_key = other["report_key"].as_str().expect("key");
    assert_ne!(key, other_key);
    let renew = routes::RENEW_LEASE.path_with(&[&attempt]);
    let outcome = routes::REPORT_OUTCOME.path_with(&[&attempt]);
    let body = json!({"fence": fence});

    let (status, v) = s.call(Method::Post, &renew, Some(key), &body).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["ttl_ms"].as_u64().is_some_and(|t| t > 0), "{v}");
    assert_eq!(v["cancel"], false);
    // One character off (never the key itself, whatever its last character is).
    let last = if key.ends_with('0') { '1' } else { '0' };
    let wrong = format!("{}{last}", &key[..key.len() - 1]);
    for (who, token) in [
        ("no key", None),
        ("a wrong key", Some(wrong.as_str())),
        ("another attempt's key", Some(other_key)),
        ("the admin", Some(ADMIN)),
        ("the node's agent", Some(a.as_str())),
    ] {
        let (status, v) = s.call(Method::Post, &renew, token, &body).await;
        assert_eq!(status, 401, "{who}: {v}");
        assert_error(&v, "unauthenticated", who);
    }
    let (status, v) = s
        .call(
            Method::Post,
            &renew,
            Some(key),
            &json!({"fence": fence + 1}),
        )
        .await;
    assert_eq!(status, 409, "a stale fence: {v}");

    // A user's cancel reaches the supervisor through its renewal.
    let (status, _) = s
        .call(
            Method::Post,
            &routes::CANCEL_JOB.path_with(&[&job]),
            Some(ADMIN),
            &json!({}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, v) = s.call(Method::Post, &renew, Some(key), &body).await;
    assert_eq!(v["cancel"], true, "{v}");

    let report = json!({
        "fence": fence, "failure": "cancelled", "exit_code": null, "signal": 15,
        "ended_at": "2026-11-24T10:00:00Z", "peak_mem_mib": null, "cleanup_ms": 0,
        "cleanup_verified": true, "log_tail": "", "gpus": samples()
    });
    let (status, v) = s
        .call(Method::Post, &outcome, Some(other_key), &report)
        .await;
    assert_eq!(status, 401, "another attempt's key: {v}");
    let (status, v) = s.call(Method::Post, &outcome, Some(key), &report).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["job_state"], "cancelled");
    // The same end again, from the supervisor and then from the agent's journal: answered,
    // recorded once.
    let (status, v) = s.call(Method::Post, &outcome, Some(key), &report).await;
    assert_eq!((status, &v["job_state"]), (200, &json!("cancelled")), "{v}");
    let finish = routes::FINISH.path_with(&[&attempt]);
    let (status, v) = s.call(Method::Post, &finish, Some(&a), &report).await;
    assert_eq!(status, 200, "{v}");
    let (_, detail) = s
        .call(
            Method::Get,
            &routes::JOB.path_with(&[&job]),
            Some(ADMIN),
            &json!({}),
        )
        .await;
    assert_eq!(detail["attempts_detail"].as_array().map(Vec::len), Some(1));
    // An ended attempt's lease is not renewed.
    let (status, v) = s.call(Method::Post, &renew, Some(key), &body).await;
    assert_eq!(status, 409, "{v}");
    // The key of the lease is never stored as it is, nor shown to users.
    let shown = detail.to_string();
    assert!(!shown.contains(key), "{shown}");
}

/// A join token, shared by a DaemonSet's agents as kubelets share a bootstrap token, gets
/// each new node its own agent credential, once: that credential acts for its node only;
/// the join token itself does nothing else; a node that joined, is registered, or whose
/// name a token bears cannot be given another credential through it.
#[tokio::test]
async fn a_join_token_gets_each_new_node_its_own_credential_once() {
    let s = start(admin_config()).await;
    let join = s.create_join_token("lab-join").await;
    let path = routes::JOIN.path_with(&[]);
    let ask = |node: &str| json!({ "node": node });
    let gpus = json!([{"index": 0, "uuid": "GPU-0", "name": "t", "total_mib": 10_000}]);
    let register = |node: &str, previous: Option<&str>| json!({"node": node, "gpus": gpus, "version": "t", "previous": previous});
    let (status, v) = s
        .call(Method::Post, &path, Some(&join), &ask("gpu-07"))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (&v["name"], &v["role"], &v["created_by"]),
        (&json!("gpu-07"), &json!("agent"), &json!("lab-join"))
    );
    let node_token = v["token"]
        .as_str()
        .expect("the credential, once")
        .to_string();

    // It acts as its node, and no other.
    s.submit(ADMIN).await;
    let (_, lease) = s.node_with_lease(&node_token, "gpu-07").await;
    assert!(lease["attempt"].is_string(), "{lease}");
    let (status, v) = s
        .call(
            Method::Post,
            routes::REGISTER.path,
            Some(&node_token),
            &register("gpu-08", None),
        )
        .await;
    assert_eq!(status, 403, "{v}");
    // The join token registers nothing itself.
    let (status, v) = s
        .call(
            Method::Post,
            routes::REGISTER.path,
            Some(&join),
            &register("gpu-07", None),
        )
        .await;
    assert_eq!(status, 403, "{v}");
    assert_error(&v, "forbidden", "join registers");

    // Once per node: joined (and registered), or a name an admin gave a token.
    let (status, v) = s
        .call(Method::Post, &path, Some(&join), &ask("gpu-07"))
        .await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("gpu-07 has joined already"),
        "{v}"
    );
    s.create_token("gpu-09", "agent").await;
    // Nor a name a user of another role bears.
    s.create_token("gpu-alice", "user").await;
    let (status, v) = s
        .call(Method::Post, &path, Some(&join), &ask("gpu-alice"))
        .await;
    assert_eq!(status, 409, "{v}");
    let (status, v) = s
        .call(Method::Post, &path, Some(&join), &ask("gpu-09"))
        .await;
    assert_eq!(status, 409, "{v}");
    // A name that is no name is refused naming the field; an agent's token cannot join.
    let (status, v) = s.call(Method::Post, &path, Some(&join), &ask("a b")).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], "node");
    let (status, _) = s
        .call(Method::Post, &path, Some(&node_token), &ask("gpu-10"))
        .await;
    assert_eq!(status, 403);
    let (status, v) = s
        .call(Method::Post, &path, Some(&join), &ask("gpu-10"))
        .await;
    assert_eq!(status, 200, "{v}");
}

/// Replicas share one store: a join token revoked through one replica makes no node through
/// another, though that one still remembers the token as verified for a while.
#[tokio::test]
async fn a_join_token_revoked_on_another_replica_makes_nothing_more() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("store.db");
    let one = SqliteStore::open(&db).expect("store");
    let two = SqliteStore::open(&db).expect("the same store");
    let configure = |config| CoordinatorConfig {
        tokens: admin_config(),
        ..config
    };
    let a = Server::start_on(dir, one, configure).await;
    let b = Server::start_on(tempfile::tempdir().expect("tempdir"), two, configure).await;
    let (status, made) = a
        .call(
            Method::Post,
            routes::CREATE_TOKEN.path,
            Some(ADMIN),
            &json!({"name": "lab-join", "role": "join", "nodes": ["gpu-*"]}),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let join = made["token"].as_str().expect("token");
    let id = made["id"].as_str().expect("id");
    let path = routes::JOIN.path_with(&[]);
    // Verified once on `a`, which remembers it.
    let (status, v) = a
        .call(Method::Post, &path, Some(join), &json!({"node": "gpu-01"}))
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = b
        .call(
            Method::Post,
            &routes::REVOKE_TOKEN.path_with(&[&id]),
            Some(ADMIN),
            &json!({}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = a
        .call(Method::Post, &path, Some(join), &json!({"node": "gpu-02"}))
        .await;
    assert_eq!(status, 401, "{v}");
    assert_error(&v, "unauthenticated", "revoked");
    let (status, tokens) = b
        .call(Method::Get, routes::TOKENS.path, Some(ADMIN), &json!({}))
        .await;
    assert_eq!(status, 200, "{tokens}");
    assert!(!tokens.to_string().contains("gpu-02"), "{tokens}");
}

/// A node identity is the admin's decision and lives no longer than what made it: a join
/// token names the nodes it may make (required; a name outside them is refused, 403, and
/// nothing is made), and the credentials it makes expire when it does. A join token kept
/// from before join tokens named nodes joins none; the bootstrap join token given in the
/// clear is held to its nodes and expiry too.
#[tokio::test]
async fn a_join_token_makes_only_the_nodes_it_names_for_no_longer_than_it_lives() {
    let s = start(admin_config()).await;
    // Nodes are required, for join tokens only, and checked.
    for (body, field) in [
        (json!({"name": "j", "role": "join"}), "nodes"),
        (json!({"name": "j", "role": "join", "nodes": []}), "nodes"),
        (
            json!({"name": "j", "role": "join", "nodes": ["gpu-[0-9]"]}),
            "nodes",
        ),
        (
            json!({"name": "u", "role": "user", "nodes": ["gpu-*"]}),
            "nodes",
        ),
    ] {
        let (status, v) = s
            .call(Method::Post, routes::CREATE_TOKEN.path, Some(ADMIN), &body)
            .await;
        assert_eq!(status, 422, "{body}: {v}");
        assert_eq!(v["error"]["field"], field, "{v}");
    }
    let join = s
        .create_token_with(json!({"name": "burst-join", "role": "join",
                                  "nodes": ["gpu-*", "dgx-a"], "expires_in": "3s"}))
        .await;
    let path = routes::JOIN.path_with(&[]);
    // The reproduction: a name the admin never decided on mints nothing.
    for node in ["rogue-1", "dgx-b", "xgpu-1"] {
        let (status, v) = s
            .call(Method::Post, &path, Some(&join), &json!({ "node": node }))
            .await;
        assert_eq!(status, 403, "{node}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("gpu-*, dgx-a") && msg.contains(node), "{msg}");
    }
    let (_, tokens) = s
        .call(Method::Get, routes::TOKENS.path, Some(ADMIN), &json!({}))
        .await;
    assert!(!tokens.to_string().contains("rogue-1"), "{tokens}");
    let listed = tokens
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == "burst-join"))
        .cloned()
        .expect("listed");
    assert_eq!(listed["nodes"], json!(["gpu-*", "dgx-a"]), "{listed}");

    let (status, made) = s
        .call(Method::Post, &path, Some(&join), &json!({"node": "gpu-11"}))
        .await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["expires_at"], listed["expires_at"], "{made}");
    let node = made["token"].as_str().expect("credential").to_string();
    let gpus = json!([{"index": 0, "uuid": "GPU-0", "name": "t", "total_mib": 10_000}]);
    let register = json!({"node": "gpu-11", "gpus": gpus, "version": "t"});
    let (status, v) = s
        .call(Method::Post, routes::REGISTER.path, Some(&node), &register)
        .await;
    assert_eq!(status, 200, "{v}");
    // The join token expires: so does what it made.
    tokio::time::sleep(std::time::Duration::from_millis(3200)).await;
    let (status, v) = s
        .call(Method::Post, routes::REGISTER.path, Some(&node), &register)
        .await;
    assert_eq!(status, 401, "{v}");
    assert!(v.to_string().contains("expired"), "{v}");

    // The bootstrap join token given in the clear: held to its nodes and its expiry.
    let secret = "bootstrap-join-secret-0123456789";
    let past = chrono::Utc::now().timestamp_millis() - 1000;
    let open = start(vec![
        auth::admin_token(ADMIN).expect("admin"),
        auth::join_token(secret, vec!["node-?".into()], None).expect("join"),
    ])
    .await;
    let (status, v) = open
        .call(
            Method::Post,
            &path,
            Some(secret),
            &json!({"node": "node-12"}),
        )
        .await;
    assert_eq!(status, 403, "{v}");
    let (status, v) = open
        .call(
            Method::Post,
            &path,
            Some(secret),
            &json!({"node": "node-1"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(v["expires_at"].is_null(), "{v}");
    let expired = start(vec![
        auth::admin_token(ADMIN).expect("admin"),
        auth::join_token(secret, vec!["node-?".into()], Some(past)).expect("join"),
    ])
    .await;
    let (status, v) = expired
        .call(
            Method::Post,
            &path,
            Some(secret),
            &json!({"node": "node-2"}),
        )
        .await;
    assert_eq!(status, 401, "{v}");
    assert!(v.to_string().contains("expired"), "{v}");
    assert!(auth::join_token(secret, vec![], None).is_err(), "no nodes");
}

/// A coordinator whose jobs all run as one account (a `headroom up` not run as root) serves
/// one user: tokens for another user or admin, and user mappings, are refused (409, saying
/// why); the admin's own tokens, agents' and join tokens are made as ever.
#[tokio::test]
async fn a_single_account_coordinator_serves_one_user() {
    let s = Server::start(|config| CoordinatorConfig {
        tokens: admin_config(),
        single_user: Some("admin".into()),
        ..config
    })
    .await;
    for (body, who) in [
        (json!({"name": "alice", "role": "user"}), "alice"),
        (json!({"name": "bob", "role": "admin"}), "bob"),
    ] {
        let (status, v) = s
            .call(Method::Post, routes::CREATE_TOKEN.path, Some(ADMIN), &body)
            .await;
        assert_eq!(status, 409, "{v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(who) && msg.contains("sudo headroom up"),
            "{msg}"
        );
    }
    for (name, body) in [
        ("alice", json!({"role": "user"})),
        ("admin", json!({"role": "admin", "unix_user": "nobody"})),
    ] {
        let (status, v) = s
            .call(
                Method::Put,
                &routes::PUT_USER.path_with(&[&name]),
                Some(ADMIN),
                &body,
            )
            .await;
        assert_eq!(status, 409, "{name}: {v}");
    }
    s.create_token("admin", "admin").await;
    s.create_token("node-1", "agent").await;
    s.create_join_token("lab-join").await;
}

/// `/metrics` is public, but who has jobs waiting is not: the jobs per submitter (which
/// name users) are on the page only for a scrape with a user's or an admin's token; without
/// one, or with an agent's or a wrong one, the counts stay and the names go.
#[tokio::test]
async fn metrics_name_users_only_to_a_scrape_with_a_users_token() {
    let s = start(admin_config()).await;
    let alice = s.create_token("alice", "user").await;
    let agent = s.create_token("node-1", "agent").await;
    s.submit(&alice).await;
    let page = |token: Option<String>| {
        let (http, url) = (s.http.clone(), format!("{}/metrics", s.base));
        async move {
            let mut req = http.get(url);
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let r = req.send().await.expect("scrape");
            assert_eq!(r.status().as_u16(), 200);
            r.text().await.expect("page")
        }
    };
    let named = "headroom_user_jobs{user=\"alice\"";
    for token in [None, Some(agent), Some("hr_0123_wrong".to_string())] {
        let p = page(token.clone()).await;
        assert!(!p.contains(named), "{token:?}: {p}");
        assert!(p.contains("headroom_jobs{state=\"queued\"} 1"), "{p}");
    }
    for token in [alice, ADMIN.to_string()] {
        assert!(page(Some(token)).await.contains(named));
    }
}

/// An attempt that runs across an upgrade from a version that kept logs as files: its
/// sender goes on from its offset, the bytes before it are taken from the file into the
/// store, and the whole log reads back in order.
#[tokio::test]
async fn a_log_begun_in_an_earlier_versions_file_goes_on_in_the_store() {
    let s = start(vec![]).await;
    s.submit_open().await;
    let (_, lease) = s.node_with_lease_as(None, "gpu-1").await;
    let attempt = lease["attempt"].as_str().expect("attempt").to_string();
    let fence = lease["fence"].as_i64().expect("fence");
    std::fs::create_dir_all(s.data_dir.join("logs")).expect("logs");
    std::fs::write(
        s.data_dir.join("logs").join(format!("{attempt}.log")),
        "hello ",
    )
    .expect("the earlier version's file");
    let r = s
        .http
        .post(format!(
            "{}{}",
            s.base,
            routes::APPEND_LOG.path_with(&[&attempt])
        ))
        .query(&[("fence", fence.to_string()), ("offset", "6".to_string())])
        .body("world")
        .send()
        .await
        .expect("append");
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.text().await.unwrap_or_default()
    );
    let text = s
        .http
        .get(format!(
            "{}{}",
            s.base,
            routes::READ_LOG.path_with(&[&attempt])
        ))
        .send()
        .await
        .expect("read")
        .text()
        .await
        .expect("text");
    assert_eq!(text, "hello world");
}

/// A code bundle is named by a submission only of someone who uploaded it (its bytes sent)
/// and fetched only by an agent whose node runs an attempt from it; a body whose hash is
/// not its name is refused naming `hash`.
#[tokio::test]
async fn a_bundle_is_named_only_by_its_uploaders_and_fetched_only_by_the_node_running_it() {
    use sha2::{Digest, Sha256};
    let s = start(admin_config()).await;
    let alice = s.create_token("alice", "user").await;
    let bob = s.create_token("bob", "user").await;
    let node_a = s.create_token("node-a", "agent").await;
    let node_b = s.create_token("node-b", "agent").await;
    let bytes = b"alice's code".to_vec();
    let hash = hex::encode(Sha256::digest(&bytes));
    let path = routes::PUT_BUNDLE.path_with(&[&hash]);
    let put = |token: &str, body: Vec<u8>| {
        s.http
            .put(format!("{}{path}", s.base))
            .bearer_auth(token)
            .header("content-type", "application/octet-stream")
            .body(body)
            .send()
    };
    let resp = put(&alice, bytes.clone()).await.expect("put");
    assert_eq!(resp.status().as_u16(), 200);
    let resp = put(&bob, b"other bytes".to_vec()).await.expect("put");
    assert_eq!(resp.status().as_u16(), 422);
    let v: Value = resp.json().await.expect("json");
    assert_error(&v, "invalid", "a body that is not its hash's");
    assert_eq!(v["error"]["field"], "hash");

    let submit = |token: &str| {
        let body = json!({
            "spec": {"name": "snap", "command": ["true"], "code": "snapshot",
                     "resources": {"gpus": 1, "memory": "1GiB"}},
            "workdir": "/home/alice/proj",
            "snapshot": {"hash": hash, "subdir": ""},
        });
        let token = token.to_string();
        let s = &s;
        async move {
            s.call(Method::Post, routes::SUBMIT.path, Some(&token), &body)
                .await
        }
    };
    let (status, v) = submit(&bob).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], "snapshot.hash", "{v}");
    let (status, v) = submit(&alice).await;
    assert_eq!(status, 200, "{v}");

    let get = |token: &str| {
        s.http
            .get(format!(
                "{}{}",
                s.base,
                routes::GET_BUNDLE.path_with(&[&hash])
            ))
            .bearer_auth(token)
            .send()
    };
    // Before any node runs it, and for a node that does not: refused.
    assert_eq!(get(&node_a).await.expect("get").status().as_u16(), 403);
    let (_, lease) = s.node_with_lease(&node_a, "node-a").await;
    assert_eq!(lease["source"]["snapshot"]["hash"], hash, "{lease}");
    let resp = get(&node_a).await.expect("get");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.bytes().await.expect("bytes").to_vec(), bytes);
    assert_eq!(get(&node_b).await.expect("get").status().as_u16(), 403);
    assert_eq!(get(&bob).await.expect("get").status().as_u16(), 403);
}
