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
) -> Result<PathBuf, String> {
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
        let bytes = std::fs::read(&kept).map_err(|e| format!("{}: {e}", kept.display()))?;
        match run_as {
            // As the job's user, in a process of its own: nothing is written as root into
            // a directory another user owns.
            Some(r) => {
                // Looked up off the runtime: a user database may be a network service.
                let id = crate::runas::resolve(&r)?;
                unpack_as(&exe, &id, &dest, &subdir, &bytes)
            }
            None => crate::codetree::unpack_into(&dest, &subdir, &bytes).map_err(|e| e.to_string()),
        }
    })
    .await
}

/// The bundle kept on this node, fetched first if it is not.
async fn fetched(shared: &Shared, snap: &Snapshot) -> Result<PathBuf, String> {
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
    Ok(kept)
}

/// Runs the unpacking helper (this binary, [`crate::codetree::UNPACK_ARG`]) as `id`, the
/// bundle on its standard input. Blocking.
fn unpack_as(
    exe: &Path,
    id: &crate::runas::Identity,
    dest: &Path,
    subdir: &str,
    bytes: &[u8],
) -> Result<PathBuf, String> {
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
    let mut child = crate::procscan::spawn_owned(|| cmd.spawn(), |c| Some(c.id()))
        .map_err(|e| format!("cannot start the unpacking helper as `{}`: {e}", id.name))?;
    let pid = child.id();
    // Its input closed once written (dropped), so that it reads to the end.
    let fed = child.stdin.take().map(|mut i| i.write_all(bytes));
    let out = child.wait_with_output();
    crate::procscan::disown(pid);
    let out = out.map_err(|e| format!("the unpacking helper: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "unpacking the code as `{}`: {}",
            id.name,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    if let Some(Err(e)) = fed {
        return Err(format!("feeding the unpacking helper: {e}"));
    }
    Ok(dest.join(subdir))
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
            Err(e) if e.is_transient() && tries < FETCH_TRIES => {
                tracing::warn!(%hash, "fetching the code bundle: {e}; trying again");
                tokio::time::sleep(Duration::from_secs(1 << tries.min(4))).await;
            }
            Err(e) => return Err(format!("cannot fetch the code bundle {hash}: {e}")),
        }
    }
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
