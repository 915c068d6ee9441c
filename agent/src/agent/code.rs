//! Code bundles on this node (`code: snapshot`): fetched from the coordinator once per node
//! and kept in the data directory (checked against their hash), then unpacked for each
//! attempt by the job's own user into its private temporary directory
//! ([`crate::codetree`]), so every attempt starts from the code as submitted, whatever has
//! changed in the checkout, or in an earlier attempt's tree, since.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use headroom_shared::AttemptId;
use headroom_shared::api::RunAs;
use headroom_shared::api::source::Snapshot;
use headroom_shared::bundle;

use crate::agent::Shared;

/// Tries at fetching a bundle while the coordinator answers with a transient error.
const FETCH_TRIES: u32 = 6;

/// A kept bundle no attempt has used for this long is deleted (the next use fetches it
/// again): the cache holds what the node runs, not every bundle it ever ran.
const KEEP_UNUSED: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why an attempt's code could not be readied on this node.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CodeError {
    #[error("cannot fetch the code bundle {hash}: {source}")]
    Fetch {
        hash: String,
        source: crate::agent::client::ClientError,
    },
    #[error("the code bundle {0} fetched from the coordinator does not match its hash")]
    Mismatch(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the job's user: {0}")]
    User(String),
    #[error("unpacking the code as `{user}`: {message}")]
    Unpack { user: String, message: String },
    #[error(transparent)]
    Tree(#[from] crate::codetree::TreeError),
    #[error("the blocking pool: {0}")]
    Pool(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CodeError + use<> {
    let path = path.to_path_buf();
    move |source| CodeError::Io { path, source }
}

/// One fetch and unpack per bundle at a time: the attempts of one experiment that start
/// together wait for the first one's.
#[derive(Default)]
pub(crate) struct Bundles {
    locks: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The directory the attempt's job runs from: `snap` unpacked for its user (`run_as`;
/// `None`: this process's), fetched first if this node has not got it yet.
pub(crate) async fn tree(
    shared: &Shared,
    snap: &Snapshot,
    run_as: Option<&RunAs>,
    attempt: AttemptId,
) -> Result<PathBuf, CodeError> {
    let lock = {
        let mut locks = shared.bundles.locks.lock().await;
        locks.entry(snap.hash.clone()).or_default().clone()
    };
    let kept = {
        let _held = lock.lock().await;
        fetched(shared, snap).await
    };
    // The last one through lets its lock go: the map holds the bundles being fetched only.
    drop(lock);
    {
        let mut locks = shared.bundles.locks.lock().await;
        if locks
            .get(&snap.hash)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            locks.remove(&snap.hash);
        }
    }
    let kept = kept?;
    let dest = crate::codetree::attempt_tmp(
        shared.job_base_env.get("TMPDIR").map(String::as_str),
        &attempt.to_string(),
    )
    .join("code");
    let (run_as, subdir, exe) = (
        run_as.cloned(),
        snap.subdir.clone(),
        shared.cfg.supervisor_exe.clone(),
    );
    blocking(move || {
        let bytes = std::fs::read(&kept).map_err(io(&kept))?;
        match run_as {
            // As the job's user, in a process of its own: nothing is written as root into
            // a directory another user owns.
            Some(r) => {
                // Looked up off the runtime: a user database may be a network service.
                let id = crate::runas::resolve(&r).map_err(CodeError::User)?;
                unpack_as(&exe, &id, &dest, &subdir, &bytes)
            }
            None => Ok(crate::codetree::unpack_into(&dest, &subdir, &bytes)?),
        }
    })
    .await
}

/// The bundle kept on this node, fetched first if it is not; marked used (what has not
/// been for [`KEEP_UNUSED`] is deleted when another is fetched).
async fn fetched(shared: &Shared, snap: &Snapshot) -> Result<PathBuf, CodeError> {
    let kept = shared
        .cfg
        .data_dir
        .join("bundles")
        .join(format!("{}.tar.gz", snap.hash));
    let path = kept.clone();
    let here = blocking(move || {
        Ok(std::fs::File::options()
            .append(true)
            .open(&path)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()))
            .is_ok())
    })
    .await?;
    if !here {
        let bytes = fetch(shared, &snap.hash).await?;
        let path = kept.clone();
        blocking(move || {
            keep(&path, &bytes)?;
            forget_unused(path.parent().unwrap_or(Path::new(".")), KEEP_UNUSED);
            Ok(())
        })
        .await?;
        tracing::info!(hash = %snap.hash, bytes = snap.bytes, "code bundle fetched");
    }
    Ok(kept)
}

/// Deletes the kept bundles in `dir` not used for `unused` (best effort).
fn forget_unused(dir: &Path, unused: Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > unused);
        if stale {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Runs the unpacking helper (this binary, [`crate::codetree::UNPACK_ARG`]) as `id`, the
/// bundle on its standard input. Blocking.
fn unpack_as(
    exe: &Path,
    id: &crate::runas::Identity,
    dest: &Path,
    subdir: &str,
    bytes: &[u8],
) -> Result<PathBuf, CodeError> {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(exe);
    cmd.arg(crate::codetree::UNPACK_ARG)
        .arg(dest)
        .arg(subdir)
        .env_clear()
        .current_dir("/")
        // Its primary group only (the standard library drops root's supplementary groups):
        // what it writes is the user's own.
        .gid(id.gid.as_raw())
        .uid(id.uid.as_raw())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child =
        crate::procscan::spawn_owned(|| cmd.spawn(), |c| Some(c.id())).map_err(io(exe))?;
    let pid = child.id();
    // Its input closed once written (dropped), so that it reads to the end.
    let fed = child.stdin.take().map(|mut i| i.write_all(bytes));
    let out = child.wait_with_output();
    crate::procscan::disown(pid);
    let out = out.map_err(io(exe))?;
    let failed = |message: String| CodeError::Unpack {
        user: id.name.clone(),
        message,
    };
    if !out.status.success() {
        return Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    if let Some(Err(e)) = fed {
        return Err(failed(format!("its input: {e}")));
    }
    Ok(dest.join(subdir))
}

/// `f` on the blocking pool (file system and user database work).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, CodeError> + Send + 'static,
) -> Result<T, CodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CodeError::Pool(e.to_string()))?
}

async fn fetch(shared: &Shared, hash: &str) -> Result<Vec<u8>, CodeError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match shared.client.bundle(hash).await {
            Ok(bytes) if bundle::hash(&bytes) == hash => return Ok(bytes),
            Ok(_) => return Err(CodeError::Mismatch(hash.to_string())),
            Err(e) if e.is_transient() && tries < FETCH_TRIES => {
                tracing::warn!(%hash, "fetching the code bundle: {e}; trying again");
                tokio::time::sleep(Duration::from_secs(1 << tries.min(4))).await;
            }
            Err(source) => {
                return Err(CodeError::Fetch {
                    hash: hash.to_string(),
                    source,
                });
            }
        }
    }
}

/// Keeps a fetched bundle in the data directory (the agent's alone).
fn keep(path: &Path, bytes: &[u8]) -> Result<(), CodeError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .and_then(|()| bundle::write_whole(path, bytes))
        .map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_bundle_unused_for_long_is_forgotten_and_a_recent_one_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = dir.path().join("old.tar.gz");
        let new = dir.path().join("new.tar.gz");
        keep(&old, b"old").expect("keep");
        keep(&new, b"new").expect("keep");
        let long_ago = std::time::SystemTime::now() - Duration::from_secs(30 * 24 * 3600);
        std::fs::File::options()
            .append(true)
            .open(&old)
            .and_then(|f| f.set_modified(long_ago))
            .expect("age");
        forget_unused(dir.path(), KEEP_UNUSED);
        assert!(!old.exists() && new.exists());
    }
}
