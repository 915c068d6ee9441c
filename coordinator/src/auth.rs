//! Who a request acts as: bearer tokens checked against the configured ones and the ones the
//! store keeps, the verified identity then kept in memory by a SHA-256 of the whole token so
//! agents' constant heartbeats and claims cost a lookup. A token the coordinator made is
//! checked by that SHA-256, which the store keeps beside its argon2 hash (its secret is 192
//! random bits; the argon2 hash is for replicas of earlier versions during a rolling
//! update). A token stored before its digest was verifies with argon2 once more and has its
//! digest kept; tokens-file entries, whose secret a person made, are argon2 only. Nothing
//! here logs a token.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use headroom_shared::api::{Principal, Role};
use sha2::{Digest, Sha256};

use crate::rules::TokenRefusal;
use crate::store::{Store, StoreError};

/// Tokens the coordinator makes look like `hr_<id>_<secret>`: the id finds the stored hash
/// without trying every one.
pub const TOKEN_PREFIX: &str = "hr_";
/// The shortest secret accepted for configured tokens (`--admin-token`).
pub const MIN_SECRET_LEN: usize = 32;
/// A verified stored token is checked against the store again after this long, so a
/// revocation made through another coordinator replica takes effect here too (by its id, no
/// hash: the digest in memory proves it is the secret that verified).
const CACHE_TTL: Duration = Duration::from_secs(30);
/// Bound on remembered identities; beyond it the oldest half is dropped.
const CACHE_MAX: usize = 10_000;
/// Argon2 verifications at once (each holds ~19 MiB): a flood of guesses queues here
/// instead of taking the coordinator's memory.
const HASH_SLOTS: usize = 2;
/// How long a request waits for a verification slot before it is answered 503.
const HASH_WAIT: Duration = Duration::from_secs(5);
/// A token that failed verification is refused without a hash for this long.
const FAILED_TTL: Duration = Duration::from_secs(60);
/// Failed verifications of one token id from one client address per window before that
/// address's guesses at that id are answered 429.
const FAILURES_PER_WINDOW: u32 = 20;
const FAILURE_WINDOW: Duration = Duration::from_secs(10);

/// A token's secret as configured: in the clear (the bootstrap admin token from the
/// environment, `headroom up`'s own agent) or as an argon2 hash (tokens file).
#[derive(Clone)]
pub enum Secret {
    Plain(String),
    Hash(String),
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Secret::Plain(_) => "Plain(<redacted>)",
            Secret::Hash(_) => "Hash(<redacted>)",
        })
    }
}

/// A token given by configuration rather than kept in the store.
#[derive(Clone, Debug)]
pub struct ConfigToken {
    /// The public id (`hr_<id>_...`) of a tokens-file entry, by which it is found.
    pub id: Option<String>,
    pub name: String,
    pub role: Role,
    pub secret: Secret,
    /// The Unix user the holder's jobs run as (tokens file).
    pub unix_user: Option<String>,
    /// A join token's nodes (names and patterns, [`crate::joins`]).
    pub nodes: Option<Vec<String>>,
    /// When it stops working (ms since the epoch); `None`: never.
    pub expires_at: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenConfigError {
    #[error("tokens file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tokens file {}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error(
        "--admin-token (HEADROOM_ADMIN_TOKEN) must be at least {MIN_SECRET_LEN} characters \
         (e.g. `openssl rand -hex 24`)"
    )]
    WeakAdminToken,
    #[error(
        "--bootstrap-join-token-file (HEADROOM_BOOTSTRAP_JOIN_TOKEN_FILE) must hold at least \
         {MIN_SECRET_LEN} characters (e.g. `openssl rand -hex 24`)"
    )]
    WeakJoinToken,
    #[error("--bootstrap-join-nodes (HEADROOM_BOOTSTRAP_JOIN_NODES): {0}")]
    JoinNodes(String),
    #[error("--bootstrap-join-expires-at (HEADROOM_BOOTSTRAP_JOIN_EXPIRES_AT): {0}")]
    JoinExpiry(String),
    #[error("{0}")]
    Secret(#[from] headroom_shared::secret::SecretError),
    #[error("{0}")]
    Alerts(#[from] crate::alert_settings::AlertConfigError),
}

/// The tokens file: `[[tokens]]` entries of `name`, `role` and `token_hash` (an argon2 PHC
/// string, from `headroom token hash`).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    tokens: Vec<FileToken>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToken {
    /// The id part of the token (`hr_<id>_<secret>`): the entry is found by it.
    id: String,
    name: String,
    role: Role,
    token_hash: String,
    #[serde(default)]
    unix_user: Option<String>,
    /// Role `join` only, and required there: the nodes it may make.
    #[serde(default)]
    nodes: Option<Vec<String>>,
}

/// Reads a tokens file, checking every entry (the name, and that the hash is argon2's).
pub fn read_tokens_file(path: &Path) -> Result<Vec<ConfigToken>, TokenConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |message: String| TokenConfigError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let file: TokensFile = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
        match line {
            Some(n) => invalid(format!("line {n}: {}", e.message())),
            None => invalid(e.message().to_string()),
        }
    })?;
    // One user, one role and one Unix user, however many tokens they hold; ids unique.
    for (i, t) in file.tokens.iter().enumerate() {
        if let Some(j) = file.tokens[..i].iter().position(|o| o.id == t.id) {
            return Err(invalid(format!(
                "tokens[{i}].id: `{}` is also tokens[{j}]'s: ids are unique",
                t.id
            )));
        }
        if t.id.is_empty() || !t.id.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(invalid(format!(
                "tokens[{i}].id: `{}` is not the id of a `hr_<id>_<secret>` token",
                t.id
            )));
        }
        if let Some((j, o)) = file.tokens[..i]
            .iter()
            .enumerate()
            .find(|(_, o)| o.name == t.name && (o.role != t.role || o.unix_user != t.unix_user))
        {
            return Err(invalid(format!(
                "tokens[{i}].name: user `{}` is also tokens[{j}] with role {} and unix_user \
                 {:?}: a user has one role and one Unix user",
                t.name, o.role, o.unix_user
            )));
        }
    }
    file.tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            check_name(&t.name).map_err(|m| invalid(format!("tokens[{i}].name: {m}")))?;
            if let Some(u) = &t.unix_user {
                check_unix_user(u, false)
                    .map_err(|m| invalid(format!("tokens[{i}].unix_user: {m}")))?;
            }
            check_join_nodes(t.role, t.nodes.as_deref())
                .map_err(|m| invalid(format!("tokens[{i}].nodes: {m}")))?;
            let hash = PasswordHash::new(&t.token_hash)
                .map_err(|e| invalid(format!("tokens[{i}].token_hash: not an argon2 hash: {e}")))?;
            if !hash.algorithm.as_str().starts_with("argon2") {
                return Err(invalid(format!(
                    "tokens[{i}].token_hash: `{}` is not argon2",
                    hash.algorithm
                )));
            }
            Ok(ConfigToken {
                id: Some(t.id),
                name: t.name,
                role: t.role,
                secret: Secret::Hash(t.token_hash),
                unix_user: t.unix_user,
                nodes: t.nodes,
                expires_at: None,
            })
        })
        .collect()
}

/// The bootstrap admin token given in the clear.
pub fn admin_token(secret: &str) -> Result<ConfigToken, TokenConfigError> {
    clear_token(
        secret,
        "admin",
        Role::Admin,
        TokenConfigError::WeakAdminToken,
    )
}

/// The bootstrap join token given in the clear (a Helm chart's generated Secret): it may only
/// exchange itself for the agent credentials of new nodes of `nodes`' names, which expire
/// when it does (`expires_at`, ms since the epoch).
pub fn join_token(
    secret: &str,
    nodes: Vec<String>,
    expires_at: Option<i64>,
) -> Result<ConfigToken, TokenConfigError> {
    crate::joins::check_patterns(&nodes).map_err(TokenConfigError::JoinNodes)?;
    Ok(ConfigToken {
        nodes: Some(nodes),
        expires_at,
        ..clear_token(secret, "join", Role::Join, TokenConfigError::WeakJoinToken)?
    })
}

/// A join token names the nodes it may make; no other token names any.
pub fn check_join_nodes(role: Role, nodes: Option<&[String]>) -> Result<(), String> {
    match (role, nodes) {
        (Role::Join, Some(n)) => crate::joins::check_patterns(n),
        (Role::Join, None) => crate::joins::check_patterns(&[]),
        (_, Some(_)) => Err("only a join token names nodes".to_string()),
        (_, None) => Ok(()),
    }
}

/// A configured token given in the clear: `weak` when it is too short to be one.
fn clear_token(
    secret: &str,
    name: &str,
    role: Role,
    weak: TokenConfigError,
) -> Result<ConfigToken, TokenConfigError> {
    let secret = secret.trim();
    if secret.chars().count() < MIN_SECRET_LEN {
        return Err(weak);
    }
    Ok(ConfigToken {
        id: None,
        name: name.into(),
        role,
        secret: Secret::Plain(secret.to_string()),
        unix_user: None,
        nodes: None,
        expires_at: None,
    })
}

/// A token holder's name: 1 to 64 of letters, digits and `_ - . @` (`bounds::TOKEN_NAME`).
pub fn check_name(name: &str) -> Result<(), String> {
    headroom_shared::api::bounds::TOKEN_NAME.check(name)
}

/// A Unix user jobs may run as: a user name, and not `root` unless `allow_root`. Whether
/// it exists is for the nodes to say, where the jobs run (the coordinator's host, or its
/// container, need not know the lab's users): a node that has no such user, or where it is
/// uid 0 without the admin's leave, fails the attempt at launch naming it.
pub fn check_unix_user(name: &str, allow_root: bool) -> Result<(), String> {
    headroom_shared::api::bounds::UNIX_USER.check(name)?;
    if name == "root" && !allow_root {
        return Err(format!(
            "`{name}` is root: jobs run as root only when the admin allows it for this user \
             (allow_root)"
        ));
    }
    Ok(())
}

/// A random secret for a configured token (not of the `hr_` form: no stored id).
pub fn random_secret() -> String {
    headroom_shared::secret::random_hex(24)
}

/// A fresh token: its public id and the whole token (`hr_<id>_<secret>`).
pub fn new_token() -> (String, String) {
    let id = headroom_shared::secret::random_hex(8);
    let token = format!(
        "{TOKEN_PREFIX}{id}_{}",
        headroom_shared::secret::random_hex(24)
    );
    (id, token)
}

/// What a token the coordinator made ([`new_token`]) is checked by: the hex SHA-256 of the
/// whole token. Its secret is 192 random bits, which no guess reaches, so a slow hash would
/// protect nothing and would cost each replica an argon2 per agent after every start.
pub fn digest_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether `key` (a token's SHA-256) is the digest `stored` keeps, in constant time. A
/// stored digest that is not one (a hand-edited row) matches nothing.
fn digest_matches(stored: &str, key: &[u8; 32]) -> bool {
    use subtle::ConstantTimeEq;
    <[u8; 32]>::try_from(hex::decode(stored).unwrap_or_default())
        .is_ok_and(|digest| bool::from(digest.ct_eq(key)))
}

/// The argon2id hash (PHC string, random salt) of a secret. Slow by design: call it off the
/// async runtime.
pub fn hash_secret(secret: &str) -> Result<String, String> {
    Argon2::default()
        .hash_password(secret.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| format!("argon2: {e}"))
}

/// Whether `secret` matches an argon2 PHC hash. Slow by design.
fn verify(secret: &str, hash: &str) -> bool {
    PasswordHash::new(hash)
        .map(|h| {
            Argon2::default()
                .verify_password(secret.as_bytes(), &h)
                .is_ok()
        })
        .unwrap_or(false)
}

/// `hr_<id>_<secret>` split into id and secret.
fn split_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.strip_prefix(TOKEN_PREFIX)?.split_once('_')?;
    (!id.is_empty() && !secret.is_empty()).then_some((id, secret))
}

/// Why a request has no identity.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("no token: send `Authorization: Bearer <token>` (the CLI: --token or HEADROOM_TOKEN)")]
    Missing,
    #[error("the Authorization header must be `Bearer <token>`")]
    Malformed,
    #[error("the token is not known to this coordinator (wrong, or revoked)")]
    Rejected,
    #[error("the token expired at {0}: an admin makes a new one with `headroom token create`")]
    Expired(String),
    #[error("cannot check the token: {0}")]
    Store(StoreError),
    /// Too many failed verifications from this address lately.
    #[error("too many requests with a wrong token from this address: wait {0} s")]
    Throttled(u64),
    /// Every verification slot stayed busy (a flood of guesses): try again.
    #[error("too many token verifications under way: try again shortly")]
    Busy,
}

struct Cached {
    principal: Principal,
    /// The stored token's id (revocation forgets it); `None` for a configured token.
    token_id: Option<String>,
    /// When a stored token must be checked again.
    until: Option<Instant>,
}

/// What memory says of a token, by digest.
enum Remembered {
    /// Verified, and still within its recheck time.
    Fresh(Principal),
    /// The stored token of this id verified with this very secret; its revocation and expiry
    /// are due to be read again.
    Due(String),
    Unknown,
}

/// Where failed guesses are counted: a client address and the token id it guessed at.
type GuessKey = (std::net::IpAddr, String);

/// Checks bearer tokens. With no configured token, every request is the anonymous admin
/// (the coordinator may then listen on loopback only).
pub struct Authenticator {
    config: Vec<ConfigToken>,
    store: Arc<dyn Store>,
    cache: Mutex<HashMap<[u8; 32], Cached>>,
    /// Tokens that failed verification lately (by digest): refused again without a hash.
    failed: Mutex<HashMap<[u8; 32], Instant>>,
    /// Failed verifications per client address and token id in the current window.
    failures: Mutex<HashMap<GuessKey, (Instant, u32)>>,
    /// How long a verified stored token is served from memory before its store row is read
    /// again ([`CACHE_TTL`]).
    recheck_after: Duration,
    hash_slots: tokio::sync::Semaphore,
    /// The verifier threads' queue (see [`Verifier`]).
    verifier: Verifier,
}

/// A verification for the verifier threads: the token, the hash, where the answer goes.
type VerifyJob = (String, String, tokio::sync::oneshot::Sender<bool>);

/// [`HASH_SLOTS`] threads of their own that run argon2: its ~19 MiB per hash stays in their
/// allocator arenas, rather than in those of whichever of the runtime's hundreds of blocking
/// threads ran it (freed memory stays in a thread's arena: a flood spread over many threads
/// held gigabytes). They end when the authenticator is dropped.
struct Verifier {
    jobs: std::sync::mpsc::SyncSender<VerifyJob>,
}

impl Verifier {
    fn start() -> Self {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<VerifyJob>(HASH_SLOTS);
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..HASH_SLOTS {
            let queue = queue.clone();
            let started = std::thread::Builder::new()
                .name(format!("hr-argon2-{i}"))
                .spawn(move || {
                    loop {
                        let job = match queue.lock() {
                            Ok(q) => q.recv(),
                            Err(_) => return,
                        };
                        let Ok((token, hash, answer)) = job else {
                            return;
                        };
                        let _ = answer.send(verify(&token, &hash));
                    }
                });
            if let Err(e) = started {
                tracing::error!("cannot start a token verifier thread: {e}");
            }
        }
        Self { jobs }
    }
}

impl Authenticator {
    pub fn new(config: Vec<ConfigToken>, store: Arc<dyn Store>) -> Self {
        Self {
            config,
            store,
            cache: Mutex::new(HashMap::new()),
            failed: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            recheck_after: CACHE_TTL,
            hash_slots: tokio::sync::Semaphore::new(HASH_SLOTS),
            verifier: Verifier::start(),
        }
    }

    /// Reads a verified stored token's row again after `every` instead of [`CACHE_TTL`]
    /// (tests).
    pub fn recheck_after(mut self, every: Duration) -> Self {
        self.recheck_after = every;
        self
    }

    /// Whether tokens are required (some token is configured).
    pub fn enabled(&self) -> bool {
        !self.config.is_empty()
    }

    /// The identity of a request with this `Authorization` header value, from `client`.
    /// A token that verified here is served whatever others send: from memory, or, when its
    /// row is due to be read again, by its id without a hash. A configured clear token costs
    /// a digest. Only a guess at a known token id costs a hash: a token that failed lately
    /// costs nothing, an address that failed too often at that id is throttled before any
    /// hash, and verifications run a few at a time.
    pub async fn identify(
        &self,
        header: Option<&str>,
        client: Option<std::net::IpAddr>,
    ) -> Result<Principal, AuthError> {
        if !self.enabled() {
            return Ok(Principal::anonymous());
        }
        let header = header.ok_or(AuthError::Missing)?;
        let token = match header.split_once(' ') {
            Some((scheme, t)) if scheme.eq_ignore_ascii_case("bearer") => t.trim(),
            _ => return Err(AuthError::Malformed),
        };
        if token.is_empty() {
            return Err(AuthError::Missing);
        }
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        match self.remembered(&key) {
            Remembered::Fresh(p) => return Ok(p),
            Remembered::Due(id) => return self.recheck(key, &id).await,
            Remembered::Unknown => {}
        }
        if let Some(t) = self.match_plain(key) {
            // A configured token that expires (the bootstrap join token) is checked each
            // time: it is never remembered.
            if let Some(at) = t.expires_at
                && at <= crate::store::now_ms()
            {
                let when = chrono::DateTime::from_timestamp_millis(at)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default();
                return Err(AuthError::Expired(when));
            }
            let p = Principal {
                name: t.name.clone(),
                role: t.role,
                token_id: None,
            };
            if t.expires_at.is_none() {
                self.remember(key, &p, None, None);
            }
            return Ok(p);
        }
        // Neither configured in the clear nor of the `hr_<id>_` form: no hash can match it.
        let Some((id, _)) = split_token(token) else {
            return Err(AuthError::Rejected);
        };
        if self.failed_lately(&key) {
            self.count_failure(client, id);
            return Err(AuthError::Rejected);
        }
        if let Some(wait) = self.throttled(client, id) {
            return Err(AuthError::Throttled(wait));
        }
        let (result, known) = self.verify_token(token, id, key, client).await;
        // Only guesses at a token's id count: one no token has costs nothing and is no step
        // towards a secret, and counting it would let a flood of made-up ids fill the
        // table that throttles the real guesses.
        if known && matches!(result, Err(AuthError::Rejected)) {
            self.remember_failure(key);
            self.count_failure(client, id);
        }
        result
    }

    /// A stored token that verified here, read again by its id: still usable (served and
    /// remembered for another while), or revoked or expired (forgotten, refused).
    async fn recheck(&self, key: [u8; 32], id: &str) -> Result<Principal, AuthError> {
        let stored = match self.store.token_by_id(id).await {
            Ok(t) => t,
            Err(StoreError::NotFound { .. }) => {
                self.forget(id);
                return Err(AuthError::Rejected);
            }
            Err(e) => return Err(AuthError::Store(e)),
        };
        let (principal, until) = match self.usable(&stored) {
            Ok(v) => v,
            Err(e) => {
                self.forget(id);
                return Err(e);
            }
        };
        self.remember(key, &principal, Some(stored.view.id), Some(until));
        Ok(principal)
    }

    /// Whether a stored token (whose secret matched) may be used now: its identity, and when
    /// to read its row again.
    fn usable(
        &self,
        stored: &crate::store::StoredToken,
    ) -> Result<(Principal, Instant), AuthError> {
        let now = crate::store::now_ms();
        let expires = stored.view.expires_at.map(|t| t.timestamp_millis());
        let revoked = stored.view.revoked_at.map(|t| t.timestamp_millis());
        match crate::rules::token_usable(revoked, expires, now) {
            Ok(()) => {}
            Err(TokenRefusal::Revoked) => return Err(AuthError::Rejected),
            Err(TokenRefusal::Expired) => {
                let at = stored.view.expires_at.map(|t| t.to_rfc3339());
                return Err(AuthError::Expired(at.unwrap_or_default()));
            }
        }
        // Read again after the recheck time, or when it expires if sooner.
        let mut until = Instant::now() + self.recheck_after;
        if let Some(e) = expires {
            let left = Duration::from_millis(u64::try_from(e - now).unwrap_or(0));
            until = until.min(Instant::now() + left);
        }
        let p = Principal {
            name: stored.view.name.clone(),
            role: stored.view.role,
            token_id: Some(stored.view.id.clone()),
        };
        Ok((p, until))
    }

    /// Checks a token of the `hr_<id>_` form not remembered either way: against the
    /// tokens file's entry or the stored token of its id, one hash at most; and whether a
    /// token has that id (only a guess at one counts towards a throttle).
    async fn verify_token(
        &self,
        token: &str,
        id: &str,
        key: [u8; 32],
        client: Option<std::net::IpAddr>,
    ) -> (Result<Principal, AuthError>, bool) {
        if let Some(t) = self.config.iter().find(|t| t.id.as_deref() == Some(id)) {
            let ok = match &t.secret {
                Secret::Hash(h) => match self.verify_slow(token, h, id, key, client).await {
                    Ok(ok) => ok,
                    Err(e) => return (Err(e), true),
                },
                Secret::Plain(_) => false,
            };
            if !ok {
                return (Err(AuthError::Rejected), true);
            }
            let p = Principal {
                name: t.name.clone(),
                role: t.role,
                token_id: t.id.clone(),
            };
            self.remember(key, &p, None, None);
            return (Ok(p), true);
        }
        let stored = match self.store.token_by_id(id).await {
            Ok(t) => t,
            Err(StoreError::NotFound { .. }) => return (Err(AuthError::Rejected), false),
            Err(e) => return (Err(AuthError::Store(e)), false),
        };
        // The digest and the hash are of the whole token, id included.
        let ok = match &stored.secret_digest {
            Some(digest) => digest_matches(digest, &key),
            None => match self
                .verify_slow(token, &stored.secret_hash, id, key, client)
                .await
            {
                Ok(ok) => ok,
                Err(e) => return (Err(e), true),
            },
        };
        if !ok {
            return (Err(AuthError::Rejected), true);
        }
        // Only the holder of the secret learns that it expired.
        let (principal, until) = match self.usable(&stored) {
            Ok(v) => v,
            Err(e) => return (Err(e), true),
        };
        if stored.secret_digest.is_none() {
            self.keep_digest(id, &key).await;
        }
        self.remember(key, &principal, Some(stored.view.id), Some(until));
        (Ok(principal), true)
    }

    /// A stored token that verified with argon2 has its digest kept from now on, so that no
    /// replica of this version hashes it again. Failing that, it verifies with argon2 next
    /// time too. `key` is the token's SHA-256, taken already to look it up in memory.
    async fn keep_digest(&self, id: &str, key: &[u8; 32]) {
        match self.store.keep_token_digest(id, hex::encode(key)).await {
            Ok(true) => tracing::info!(token = %id, "token's SHA-256 kept: no argon2 from now on"),
            Ok(false) => {}
            Err(e) => tracing::warn!(token = %id, "token's SHA-256 not kept: {e}"),
        }
    }

    /// The configured clear token (the bootstrap admin's, `up`'s agent's) this is, by digest:
    /// no hash. Tokens-file entries are found by id instead.
    fn match_plain(&self, key: [u8; 32]) -> Option<&ConfigToken> {
        self.config.iter().find(|t| match &t.secret {
            Secret::Plain(p) => {
                use subtle::ConstantTimeEq;
                bool::from(Sha256::digest(p.as_bytes()).as_slice().ct_eq(&key))
            }
            Secret::Hash(_) => false,
        })
    }

    /// One argon2 verification (tokens-file entries, tokens stored before their digest), off
    /// the runtime, a few at a time. A guess that waited for
    /// its turn costs no hash when its client has since failed too often, or when the same
    /// token has since failed (a flood arrives before any of it has failed).
    async fn verify_slow(
        &self,
        token: &str,
        hash: &str,
        id: &str,
        key: [u8; 32],
        client: Option<std::net::IpAddr>,
    ) -> Result<bool, AuthError> {
        let _slot = tokio::time::timeout(HASH_WAIT, self.hash_slots.acquire())
            .await
            .map_err(|_| AuthError::Busy)?
            .map_err(|_| AuthError::Busy)?;
        if let Some(wait) = self.throttled(client, id) {
            return Err(AuthError::Throttled(wait));
        }
        if self.failed_lately(&key) {
            return Ok(false);
        }
        let (answer, answered) = tokio::sync::oneshot::channel();
        // With a slot held, at most HASH_SLOTS jobs are queued or running: there is room.
        self.verifier
            .jobs
            .try_send((token.to_string(), hash.to_string(), answer))
            .map_err(|_| AuthError::Busy)?;
        // A verifier that is gone answers nothing: refused, never let through.
        Ok(answered.await.unwrap_or(false))
    }

    fn failed_lately(&self, key: &[u8; 32]) -> bool {
        let Ok(mut failed) = self.failed.lock() else {
            return false;
        };
        match failed.get(key) {
            Some(at) if at.elapsed() < FAILED_TTL => true,
            Some(_) => {
                failed.remove(key);
                false
            }
            None => false,
        }
    }

    fn remember_failure(&self, key: [u8; 32]) {
        if let Ok(mut failed) = self.failed.lock() {
            if failed.len() >= CACHE_MAX {
                failed.retain(|_, at| at.elapsed() < FAILED_TTL);
                if failed.len() >= CACHE_MAX {
                    failed.clear();
                }
            }
            failed.insert(key, Instant::now());
        }
    }

    fn count_failure(&self, client: Option<std::net::IpAddr>, id: &str) {
        let (Some(ip), Ok(mut failures)) = (client, self.failures.lock()) else {
            return;
        };
        if failures.len() >= CACHE_MAX {
            failures.retain(|_, (start, _)| start.elapsed() < FAILURE_WINDOW);
            // Still full of live windows (only hashed guesses at real ids count, two at a
            // time, so this takes many addresses): nothing is forgotten, nothing new
            // recorded; the verification slots still bound what guesses cost.
            if failures.len() >= CACHE_MAX && !failures.contains_key(&(ip, id.to_string())) {
                return;
            }
        }
        let entry = failures
            .entry((ip, id.to_string()))
            .or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= FAILURE_WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }

    /// Seconds `client` must wait before guessing at token `id` again, when it failed too
    /// often at it in the current window.
    fn throttled(&self, client: Option<std::net::IpAddr>, id: &str) -> Option<u64> {
        let ip = client?;
        let failures = self.failures.lock().ok()?;
        let (start, n) = failures.get(&(ip, id.to_string()))?;
        let left = FAILURE_WINDOW.checked_sub(start.elapsed())?;
        (*n >= FAILURES_PER_WINDOW).then(|| left.as_secs().max(1))
    }

    fn remembered(&self, key: &[u8; 32]) -> Remembered {
        let Ok(cache) = self.cache.lock() else {
            return Remembered::Unknown;
        };
        match cache.get(key) {
            None => Remembered::Unknown,
            Some(hit) => match (&hit.token_id, hit.until) {
                (Some(id), Some(u)) if u <= Instant::now() => Remembered::Due(id.clone()),
                _ => Remembered::Fresh(hit.principal.clone()),
            },
        }
    }

    fn remember(
        &self,
        key: [u8; 32],
        principal: &Principal,
        token_id: Option<String>,
        until: Option<Instant>,
    ) {
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        if cache.len() >= CACHE_MAX {
            // Expired stored tokens first; a full cache of live ones is simply cleared.
            let now = Instant::now();
            cache.retain(|_, c| c.until.is_none_or(|u| u > now));
            if cache.len() >= CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(
            key,
            Cached {
                principal: principal.clone(),
                token_id,
                until,
            },
        );
    }

    /// A revoked token stops working at once: its remembered identity goes.
    pub fn forget(&self, token_id: &str) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.retain(|_, c| c.token_id.as_deref() != Some(token_id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NewToken, Store};

    async fn sqlite_store(dir: &Path) -> anyhow::Result<Arc<dyn Store>> {
        let path = dir.join("s.db");
        Ok(Arc::new(
            tokio::task::spawn_blocking(move || crate::store::sqlite::SqliteStore::open(&path))
                .await??,
        ))
    }

    /// An agent token of node `name` as the admin made it, kept as `secret_hash` (argon2)
    /// and, when given, its digest.
    fn agent_token(
        id: &str,
        name: &str,
        secret_hash: String,
        secret_digest: Option<String>,
    ) -> NewToken {
        NewToken {
            id: id.into(),
            name: name.into(),
            role: Role::Agent,
            secret_hash,
            secret_digest,
            created_by: "admin".into(),
            expires_at: None,
            nodes: None,
        }
    }

    #[test]
    fn made_tokens_split_into_their_id_and_secret() {
        let (id, token) = new_token();
        let (i, s) = split_token(&token).expect("splits");
        assert_eq!(i, id);
        assert_eq!(s.len(), 48);
        assert_ne!(new_token().1, token, "tokens are random");
        assert!(split_token("hr__x").is_none());
        assert!(split_token("plain-secret").is_none());
    }

    #[test]
    fn hashes_verify_their_secret_only() {
        let h = hash_secret("s3cret-s3cret-s3cret").expect("hash");
        assert!(h.starts_with("$argon2id$"), "{h}");
        assert!(verify("s3cret-s3cret-s3cret", &h));
        assert!(!verify("s3cret-s3cret-s3creT", &h));
        assert!(!verify("s3cret-s3cret-s3cret", "not a hash"));
    }

    /// Someone else's wrong guesses never refuse a valid token: a job on an agent's node
    /// flooding the coordinator with wrong tokens (random ids, the agent's own id with wrong
    /// secrets, plain strings) is throttled at the ids it guessed, while the agent's stored
    /// token, due to be read again, is served, and so is another valid token first seen from
    /// that address, and the bootstrap admin's clear one.
    #[tokio::test]
    async fn a_valid_token_is_served_whatever_its_address_failed() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = sqlite_store(dir.path()).await?;
        let mut made = Vec::new();
        for name in ["node-a", "node-b"] {
            let (id, token) = new_token();
            let secret = token.clone();
            let secret_hash = tokio::task::spawn_blocking(move || hash_secret(&secret))
                .await?
                .map_err(anyhow::Error::msg)?;
            store
                .create_token(agent_token(&id, name, secret_hash, None))
                .await?;
            made.push((id, token));
        }
        let admin = admin_token("bootstrap-admin-secret-0123456789")?;
        let auth =
            Authenticator::new(vec![admin], store.clone()).recheck_after(Duration::from_millis(1));
        let node: std::net::IpAddr = "10.0.0.7".parse()?;
        let bearer = |t: &str| format!("Bearer {t}");
        let (a_id, a) = &made[0];
        assert_eq!(
            auth.identify(Some(&bearer(a)), Some(node)).await?.name,
            "node-a"
        );

        // The job's flood: wrong secrets for the agent's id, random ids, plain strings.
        let mut throttled = 0;
        for i in 0..25 {
            for guess in [
                format!("hr_{a_id}_wrong-secret-{i}"),
                format!("hr_{i:016x}_wrong-secret"),
                format!("not-a-token-{i}"),
            ] {
                match auth.identify(Some(&bearer(&guess)), Some(node)).await {
                    Err(AuthError::Throttled(_)) => throttled += 1,
                    Err(AuthError::Rejected) => {}
                    other => panic!("{guess}: {other:?}"),
                }
            }
        }
        assert!(throttled > 0, "guesses at one id were never throttled");
        // Made-up ids cost no hash and are not counted: a flood of them cannot fill the
        // table that throttles the guesses at a real id (and so make it forget them).
        let counted: Vec<String> = auth
            .failures
            .lock()
            .map(|f| f.keys().map(|(_, id)| id.clone()).collect())
            .unwrap_or_default();
        assert_eq!(counted, std::slice::from_ref(a_id));

        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(
            auth.identify(Some(&bearer(a)), Some(node)).await?.name,
            "node-a",
            "the agent's token, read again after its recheck time"
        );
        let (_, b) = &made[1];
        assert_eq!(
            auth.identify(Some(&bearer(b)), Some(node)).await?.name,
            "node-b",
            "a valid token first seen from the flooding address"
        );
        let p = auth
            .identify(Some("Bearer bootstrap-admin-secret-0123456789"), Some(node))
            .await?;
        assert_eq!(p.role, Role::Admin);

        // Revoked: refused at its next read, though memory knew it.
        store.revoke_token(a_id).await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(matches!(
            auth.identify(Some(&bearer(a)), Some(node)).await,
            Err(AuthError::Rejected)
        ));
        Ok(())
    }

    /// A token the coordinator makes is checked by its SHA-256, without argon2, so a replica
    /// just started serves its agents at once even while every argon2 slot is taken; one
    /// kept as argon2 only (by an earlier version) has its digest kept at its first
    /// verification, and another replica (or this one restarted) then serves it without
    /// argon2 too.
    #[tokio::test]
    async fn a_made_token_is_checked_by_its_digest_without_argon2() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = sqlite_store(dir.path()).await?;
        let argon2 = |token: &str| {
            let secret = token.to_string();
            tokio::task::spawn_blocking(move || hash_secret(&secret))
        };
        // As `token create` makes one: its argon2 hash (for replicas of earlier versions)
        // and its digest.
        let (new_id, new) = new_token();
        let digest = digest_token(&new);
        assert!(
            digest.len() == 64 && !digest.contains(&new[3..]),
            "{digest}"
        );
        let hash = argon2(&new).await?.map_err(anyhow::Error::msg)?;
        store
            .create_token(agent_token(&new_id, "node-new", hash, Some(digest)))
            .await?;
        // As an earlier version made one: argon2 only.
        let (old_id, old) = new_token();
        let old_hash = argon2(&old).await?.map_err(anyhow::Error::msg)?;
        store
            .create_token(agent_token(&old_id, "node-old", old_hash.clone(), None))
            .await?;
        let admin = admin_token("bootstrap-admin-secret-0123456789")?;
        let bearer = |t: &str| format!("Bearer {t}");

        // Every argon2 slot taken (guesses at a tokens-file entry, say): a made token is
        // served all the same, a wrong secret at its id refused, both without waiting.
        let replica = Authenticator::new(vec![admin.clone()], store.clone());
        let slots = replica.hash_slots.acquire_many(HASH_SLOTS as u32).await?;
        let quick = Duration::from_secs(1);
        let served =
            tokio::time::timeout(quick, replica.identify(Some(&bearer(&new)), None)).await??;
        assert_eq!(served.name, "node-new");
        let wrong = format!("hr_{new_id}_{}", "0".repeat(48));
        let refused =
            tokio::time::timeout(quick, replica.identify(Some(&bearer(&wrong)), None)).await?;
        assert!(matches!(refused, Err(AuthError::Rejected)), "{refused:?}");
        drop(slots);

        // The token kept as argon2 only verifies once with it, and has its digest kept; its
        // argon2 hash stays, for replicas of the earlier version.
        assert_eq!(
            replica.identify(Some(&bearer(&old)), None).await?.name,
            "node-old"
        );
        let kept = store.token_by_id(&old_id).await?;
        assert_eq!(kept.secret_digest, Some(digest_token(&old)));
        assert_eq!(kept.secret_hash, old_hash);
        let restarted = Authenticator::new(vec![admin], store.clone());
        let _slots = restarted.hash_slots.acquire_many(HASH_SLOTS as u32).await?;
        let served =
            tokio::time::timeout(quick, restarted.identify(Some(&bearer(&old)), None)).await??;
        assert_eq!(served.name, "node-old");
        Ok(())
    }

    #[test]
    fn digests_match_their_token_only() {
        let (_, token) = new_token();
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        assert!(digest_matches(&digest_token(&token), &key));
        let (_, other) = new_token();
        assert!(!digest_matches(&digest_token(&other), &key));
        assert!(!digest_matches("not-hex", &key));
        assert!(!digest_matches("abcd", &key));
        assert!(!digest_matches("", &key));
    }

    #[test]
    fn tokens_files_are_checked_entry_by_entry() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("tokens.toml");
        let hash = hash_secret("hr_a1_agent-secret-0123456789").map_err(anyhow::Error::msg)?;
        let entry = |id: &str, name: &str, role: &str, extra: &str| {
            format!(
                "[[tokens]]\nid = \"{id}\"\nname = \"{name}\"\nrole = \"{role}\"\n\
                 token_hash = \"{hash}\"\n{extra}"
            )
        };
        std::fs::write(&path, entry("a1", "node-1", "agent", ""))?;
        let t = read_tokens_file(&path)?;
        assert_eq!((t[0].name.as_str(), t[0].role), ("node-1", Role::Agent));
        assert_eq!(t[0].id.as_deref(), Some("a1"));
        let refused = |text: String, says: &str| -> anyhow::Result<()> {
            std::fs::write(&path, text)?;
            let e = read_tokens_file(&path).expect_err(says).to_string();
            assert!(e.contains(says) && e.contains("tokens.toml"), "{e}");
            Ok(())
        };
        refused(
            "[[tokens]]\nid = \"a\"\nname = \"x\"\nrole = \"agent\"\ntoken_hash = \"plain\"\n"
                .into(),
            "tokens[0].token_hash",
        )?;
        refused(entry("a1", "x", "root", ""), "root")?;
        // Without an id (tried entry by entry, once): refused, with the line.
        refused(
            format!("[[tokens]]\nname = \"x\"\nrole = \"agent\"\ntoken_hash = \"{hash}\"\n"),
            "line 1",
        )?;
        refused(
            entry("a1", "x", "agent", "") + &entry("a1", "y", "agent", ""),
            "tokens[1].id",
        )?;
        refused(
            entry("a1", "x", "agent", "") + &entry("b2", "x", "user", ""),
            "tokens[1].name",
        )?;
        refused(
            entry("a1", "x", "user", "unix_user = \"not a name\"\n"),
            "tokens[0].unix_user",
        )?;
        // A user this host lacks is the nodes' to know: taken.
        std::fs::write(
            &path,
            entry("a1", "x", "user", "unix_user = \"no-such-user-hr\"\n"),
        )?;
        assert_eq!(
            read_tokens_file(&path)?[0].unix_user.as_deref(),
            Some("no-such-user-hr")
        );
        assert!(admin_token("short").is_err());
        // 32 characters at least: a 31-character secret is refused, as a join token's.
        assert!(admin_token(&"s".repeat(MIN_SECRET_LEN - 1)).is_err());
        assert!(admin_token(&"s".repeat(MIN_SECRET_LEN)).is_ok());
        assert_eq!(MIN_SECRET_LEN, 32);
        assert!(join_token("short", vec!["gpu-*".into()], None).is_err());
        Ok(())
    }
}
