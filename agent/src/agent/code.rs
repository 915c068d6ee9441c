//! Code bundles on this node (`code: snapshot`): fetched from the coordinator once per node
//! and kept in the data directory (checked against their hash), then unpacked once per job
//! user into a private directory of theirs that every attempt of that user runs from,
//! whatever has changed in the checkout since the submit.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use headroom_shared::api::RunAs;
use headroom_shared::api::source::Snapshot;
use headroom_shared::bundle;

use crate::agent::Shared;
use crate::agent::client::ClientError;

/// Tries at fetching a bundle while the coordinator answers with a transient error.
const FETCH_TRIES: u32 = 6;

/// One fetch and unpack per bundle at a time: the attempts of one experiment that start
/// together wait for the first one's.
#[derive(Default)]
pub(crate) struct Bundles {
    locks: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The directory the job runs from: `snap` unpacked for its user, fetched first if this
/// node has not got it yet.
pub(crate) async fn tree(
    shared: &Shared,
    snap: &Snapshot,
    run_as: Option<&RunAs>,
) -> Result<PathBuf, String> {
    let lock = {
        let mut locks = shared.bundles.locks.lock().await;
        locks.entry(snap.hash.clone()).or_default().clone()
    };
    let made = {
        let _held = lock.lock().await;
        ready(shared, snap, run_as.cloned()).await
    };
    // The last one through lets its lock go: the map holds the bundles being readied only.
    drop(lock);
    let mut locks = shared.bundles.locks.lock().await;
    if locks
        .get(&snap.hash)
        .is_some_and(|l| Arc::strong_count(l) == 1)
    {
        locks.remove(&snap.hash);
    }
    made
}

async fn ready(shared: &Shared, snap: &Snapshot, run_as: Option<RunAs>) -> Result<PathBuf, String> {
    let kept = shared
        .cfg
        .data_dir
        .join("bundles")
        .join(format!("{}.tar.gz", snap.hash));
    let path = kept.clone();
    if !blocking(move || Ok(path.is_file())).await? {
        let bytes = fetch(shared, &snap.hash).await?;
        let path = kept.clone();
        blocking(move || keep(&path, &bytes)).await?;
        tracing::info!(hash = %snap.hash, bytes = snap.bytes, "code bundle fetched");
    }
    let base = shared
        .job_base_env
        .get("TMPDIR")
        .filter(|d| d.starts_with('/'))
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    let hash = snap.hash.clone();
    blocking(move || {
        // Looked up off the runtime: a user database may be a network service.
        let (uid, gid) = match &run_as {
            Some(r) => {
                let id = crate::runas::resolve(r)?;
                (id.uid.as_raw(), id.gid.as_raw())
            }
            None => (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            ),
        };
        unpacked(&kept, &base, &hash, uid, gid)
    })
    .await
}

/// `f` on the blocking pool (file system and user database work).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| e.to_string())?
}

async fn fetch(shared: &Shared, hash: &str) -> Result<Vec<u8>, String> {
    let mut tries = 0;
    loop {
        tries += 1;
        match shared.client.bundle(hash).await {
            Ok(bytes) if bundle::hash(&bytes) == hash => return Ok(bytes),
            Ok(_) => {
                return Err(format!(
                    "the code bundle {hash} fetched from the coordinator does not match its hash"
                ));
            }
            Err(e) if is_transient(&e) && tries < FETCH_TRIES => {
                tracing::warn!(%hash, "fetching the code bundle: {e}; trying again");
                tokio::time::sleep(Duration::from_secs(1 << tries.min(4))).await;
            }
            Err(e) => return Err(format!("cannot fetch the code bundle {hash}: {e}")),
        }
    }
}

fn is_transient(e: &ClientError) -> bool {
    e.is_transient()
}

/// Keeps a fetched bundle in the data directory (the agent's alone).
fn keep(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .and_then(|()| bundle::write_whole(path, bytes))
        .map_err(|e| format!("cannot keep the code bundle at {}: {e}", path.display()))
}

/// The bundle at `kept` unpacked for `uid` under `base`: made once (unpacked in a private
/// directory of this process's, given to the user, then renamed into place, so a directory
/// of that name is always whole), then taken again only when it is that user's own and
/// no one else's (a name planted in a shared `/tmp` is refused).
fn unpacked(kept: &Path, base: &Path, hash: &str, uid: u32, gid: u32) -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let short = &hash[..16.min(hash.len())];
    let tree = base.join(format!("headroom-code-{short}-{uid}"));
    let refused = |why: String| format!("the code directory {}: {why}", tree.display());
    let owned = |p: &Path| -> Result<bool, String> {
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0 => Ok(true),
            Ok(m) => Err(refused(format!(
                "it exists and is not this user's (owner uid {}, mode {:o}): refused",
                m.uid(),
                m.mode() & 0o7777
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(refused(e.to_string())),
        }
    };
    if owned(&tree)? {
        return Ok(tree);
    }
    let bytes = std::fs::read(kept).map_err(|e| format!("{}: {e}", kept.display()))?;
    let partial = base.join(format!(
        ".headroom-code-{short}-{uid}.{}",
        rand::random::<u64>()
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&partial)
        .map_err(|e| format!("{}: {e}", partial.display()))?;
    let made = bundle::unpack(&bytes, &partial)
        .map_err(|e| e.to_string())
        .and_then(|()| give(&partial, uid, gid))
        .and_then(|()| std::fs::rename(&partial, &tree).map_err(|e| refused(e.to_string())));
    if let Err(e) = made {
        let _ = std::fs::remove_dir_all(&partial);
        // Another agent on this node may have made it meanwhile.
        return if owned(&tree).unwrap_or(false) {
            Ok(tree)
        } else {
            Err(e)
        };
    }
    Ok(tree)
}

/// Gives `dir` and everything under it to `uid:gid`, links themselves and not what they
/// point to.
fn give(dir: &Path, uid: u32, gid: u32) -> Result<(), String> {
    let chown = |p: &Path| {
        std::os::unix::fs::lchown(p, Some(uid), Some(gid))
            .map_err(|e| format!("cannot give {} to uid {uid}: {e}", p.display()))
    };
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        chown(&d)?;
        for entry in std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))? {
            let entry = entry.map_err(|e| format!("{}: {e}", d.display()))?;
            let kind = entry.file_type().map_err(|e| e.to_string())?;
            if kind.is_dir() {
                todo.push(entry.path());
            } else {
                chown(&entry.path())?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_is_unpacked_once_for_its_user_and_a_planted_name_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("train.py"), "print('v1')\n").expect("write");
        let bytes = bundle::make(dir.path(), &[PathBuf::from("train.py")]).expect("bundle");
        let hash = bundle::hash(&bytes);
        let kept = dir.path().join("kept.tar.gz");
        keep(&kept, &bytes).expect("keep");
        let base = tempfile::tempdir().expect("base");
        let (uid, gid) = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let tree = unpacked(&kept, base.path(), &hash, uid, gid).expect("unpacked");
        assert_eq!(
            std::fs::read_to_string(tree.join("train.py")).expect("read"),
            "print('v1')\n"
        );
        // Taken again as it is (a job's own changes to it stay).
        std::fs::write(tree.join("out.txt"), "x").expect("write");
        let again = unpacked(&kept, base.path(), &hash, uid, gid).expect("again");
        assert_eq!(again, tree);
        assert!(again.join("out.txt").exists());
        // Someone else's directory of that name is not used.
        let other = base
            .path()
            .join(format!("headroom-code-{}-{}", &hash[..16], uid + 1));
        std::fs::create_dir(&other).expect("plant");
        let err = unpacked(&kept, base.path(), &hash, uid + 1, gid).expect_err("planted");
        assert!(err.contains("refused"), "{err}");
    }
}
