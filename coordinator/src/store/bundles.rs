//! Code bundles (`code: snapshot`): kept once per content hash, read by agents.

use super::Result;
use super::now_ms;
use super::tx::Tx;
use crate::changes::Change;

/// Keeps a bundle unless one of that hash is kept, and that `by` uploaded it; whether the
/// bundle was new.
pub(super) async fn put(
    tx: &mut dyn Tx,
    hash: String,
    data: Vec<u8>,
    by: String,
) -> Result<(bool, Change)> {
    let new = tx.insert_bundle(&hash, &data, &by, now_ms()).await?;
    Ok((new, Change::None))
}

pub(super) async fn size(
    tx: &mut dyn Tx,
    hash: String,
    uploaded_by: Option<String>,
) -> Result<Option<u64>> {
    tx.bundle_size(&hash, uploaded_by.as_deref()).await
}

pub(super) async fn data(tx: &mut dyn Tx, hash: String) -> Result<Option<Vec<u8>>> {
    tx.bundle_data(&hash).await
}

pub(super) async fn leased_to(tx: &mut dyn Tx, hash: String, node: String) -> Result<bool> {
    tx.bundle_leased_to(&hash, &node).await
}
