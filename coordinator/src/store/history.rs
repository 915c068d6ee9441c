//! What earlier runs of a memory key tell a spec not yet run (`submit --dry-run`): the
//! peaks its estimate is learned from, its OOM floor and how long a run of it took (which a
//! study's queue order reads too).

use std::collections::BTreeMap;

use super::Result;
use super::tx::Tx;

/// A memory key's history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyHistory {
    /// Its latest observed peaks (MiB), as a claim reads them.
    pub peaks: Vec<u64>,
    pub floor: Option<u64>,
    /// The mean run time of its latest successful attempts.
    pub duration_ms: Option<u64>,
}

/// The history of each key (those with none are left out).
pub(super) async fn of_keys(
    tx: &mut dyn Tx,
    keys: Vec<String>,
) -> Result<BTreeMap<String, KeyHistory>> {
    let mut out = BTreeMap::new();
    for key in keys {
        let memory = super::leases::key_memory(tx, &key).await?;
        let h = KeyHistory {
            peaks: memory.peaks,
            floor: memory.floor,
            duration_ms: tx.key_duration_ms(&key).await?,
        };
        if h != KeyHistory::default() {
            out.insert(key, h);
        }
    }
    Ok(out)
}

/// How long a run of each key took (the mean of its latest successful attempts), for the keys
/// with one.
pub(super) async fn durations(tx: &mut dyn Tx, keys: Vec<String>) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for key in keys {
        if let Some(ms) = tx.key_duration_ms(&key).await? {
            out.insert(key, ms);
        }
    }
    Ok(out)
}
