//! API tokens: kept hashed, looked up by public id, revoked once.

use headroom_shared::api::TokenView;

use super::tx::Tx;
use super::{NewToken, Result, StoreError, StoredToken, now_ms};

pub(super) async fn by_id(tx: &mut dyn Tx, id: &str) -> Result<StoredToken> {
    tx.token(id)
        .await?
        .ok_or_else(|| StoreError::not_found("token", id))
}

pub(super) async fn create(tx: &mut dyn Tx, t: NewToken) -> Result<(TokenView, bool)> {
    if !tx.insert_token(&t, now_ms()).await? {
        return Err(StoreError::TokenExists { id: t.id });
    }
    Ok((by_id(tx, &t.id).await?.view, false))
}

pub(super) async fn list(tx: &mut dyn Tx) -> Result<Vec<TokenView>> {
    Ok(tx.tokens().await?.into_iter().map(|t| t.view).collect())
}

pub(super) async fn revoke(tx: &mut dyn Tx, id: String) -> Result<(TokenView, bool)> {
    if !tx.revoke_token(&id, now_ms()).await? {
        return Err(StoreError::not_found("token", id));
    }
    Ok((by_id(tx, &id).await?.view, false))
}
