//! API tokens: kept hashed, looked up by public id, revoked once.

use headroom_shared::api::{Role, TokenView, UserView};

use super::tx::Tx;
use super::{NewToken, Result, StoreError, StoredToken, now_ms};
use crate::changes::Change;

pub(super) async fn by_id(tx: &mut dyn Tx, id: &str) -> Result<StoredToken> {
    tx.token(id)
        .await?
        .ok_or_else(|| StoreError::not_found("token", id))
}

pub(super) async fn create(tx: &mut dyn Tx, t: NewToken) -> Result<(TokenView, Change)> {
    // A token belongs to the user of its name, who has one role.
    let role = tx.ensure_user(&t.name, t.role, now_ms()).await?;
    if role != t.role {
        return Err(StoreError::UserRole { name: t.name, role });
    }
    if !tx.insert_token(&t, now_ms()).await? {
        return Err(StoreError::TokenExists { id: t.id });
    }
    Ok((by_id(tx, &t.id).await?.view, Change::None))
}

/// Whether `node` may still be given its first credential by a join token: it is not
/// registered and no user (of a token, stored or configured) bears its name.
pub(super) async fn joinable(tx: &mut dyn Tx, node: String) -> Result<()> {
    refusal(tx, &node, false).await?.map_or(Ok(()), Err)
}

/// `lock`: in a write transaction, the node's row (where there is one) is locked.
async fn refusal(tx: &mut dyn Tx, node: &str, lock: bool) -> Result<Option<StoreError>> {
    let refused = |why: &str| StoreError::NodeJoined {
        node: node.to_string(),
        why: why.to_string(),
    };
    if tx.node_gpus(node, lock).await?.is_some() {
        return Ok(Some(refused("it is registered")));
    }
    if !tx.users(Some(node)).await?.is_empty() {
        return Ok(Some(refused("a user or token of its name exists")));
    }
    Ok(None)
}

/// A new node's first agent credential: the node is not registered and its name is no
/// user's yet, which the user row made here settles between concurrent joins (a join token
/// makes first credentials, it never replaces one).
pub(super) async fn join_node(tx: &mut dyn Tx, t: NewToken) -> Result<(TokenView, Change)> {
    if let Some(refused) = refusal(tx, &t.name, true).await? {
        return Err(refused);
    }
    if !tx.insert_new_user(&t.name, t.role, now_ms()).await? {
        return Err(StoreError::NodeJoined {
            node: t.name,
            why: "another join of it came first".to_string(),
        });
    }
    if !tx.insert_token(&t, now_ms()).await? {
        return Err(StoreError::TokenExists { id: t.id });
    }
    Ok((by_id(tx, &t.id).await?.view, Change::None))
}

pub(super) async fn list(tx: &mut dyn Tx) -> Result<Vec<TokenView>> {
    Ok(tx.tokens().await?.into_iter().map(|t| t.view).collect())
}

pub(super) async fn revoke(tx: &mut dyn Tx, id: String) -> Result<(TokenView, Change)> {
    if !tx.revoke_token(&id, now_ms()).await? {
        return Err(StoreError::not_found("token", id));
    }
    Ok((by_id(tx, &id).await?.view, Change::None))
}

/// Keeps the digest of a token that verified with its argon2 hash (see
/// [`crate::auth::digest_token`]); false when another replica kept it first.
pub(super) async fn keep_digest(
    tx: &mut dyn Tx,
    id: String,
    digest: String,
) -> Result<(bool, Change)> {
    Ok((tx.keep_token_digest(&id, &digest).await?, Change::None))
}

/// The users configuration names (admin token, tokens file, a local agent): made when
/// missing, refused when the name has another role in the store.
pub(super) async fn ensure_users(
    tx: &mut dyn Tx,
    users: Vec<(String, Role, Option<String>)>,
) -> Result<((), Change)> {
    for (name, role, unix_user) in users {
        let stored = tx.ensure_user(&name, role, now_ms()).await?;
        if stored != role {
            return Err(StoreError::UserRole { name, role: stored });
        }
        if unix_user.is_some() {
            let u = UserView {
                name,
                role,
                unix_user,
                allow_root: false,
                limits: Default::default(),
                created_at: chrono::Utc::now(),
            };
            tx.put_user(&u).await?;
        }
    }
    Ok(((), Change::Work))
}

pub(super) async fn put_user(tx: &mut dyn Tx, u: UserView) -> Result<(UserView, Change)> {
    if !tx.put_user(&u).await? {
        let role = tx.ensure_user(&u.name, u.role, now_ms()).await?;
        return Err(StoreError::UserRole { name: u.name, role });
    }
    tx.set_user_limits(&u.name, &u.limits).await?;
    let stored = tx.users(Some(&u.name)).await?.pop();
    Ok((
        stored.ok_or_else(|| StoreError::not_found("user", &u.name))?,
        Change::Work,
    ))
}

pub(super) async fn users(tx: &mut dyn Tx) -> Result<Vec<UserView>> {
    tx.users(None).await
}
