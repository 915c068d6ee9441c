//! The directories headroom keeps its state in (stores, logs, keys, fake GPUs): made when
//! missing, and taken when they exist only if this process's user owns them and no one else
//! may write in them, never through a symbolic link. A root process that took another user's
//! directory would follow the links that user planted there (a `fake-gpus` link to a root
//! directory, made world-writable by the chmod meant for it).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("data directory {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "data directory {} belongs to uid {owner}, not to this process's user (uid {me}): \
         refusing to take it, as its owner could steer this process through links planted in \
         it. Give a directory of this user's (--data-dir), or `chown` it",
        path.display()
    )]
    Foreign { path: PathBuf, owner: u32, me: u32 },
    #[error(
        "data directory {} may be written by other users (mode {mode:o}): refusing to take it. \
         `chmod go-w` it, or give another (--data-dir)",
        path.display()
    )]
    Writable { path: PathBuf, mode: u32 },
    #[error(
        "{} is a symbolic link: headroom keeps its state in directories of its own, never \
         through a link (remove it, or give the link's target itself)",
        path.display()
    )]
    Link { path: PathBuf },
}

/// A service's data directory when none is given: under `/var/lib` for root (a service
/// started by systemd or an init system runs in `/`, and a path relative to it, or to
/// whatever directory root happened to be in, is no place for a store or its keys), else
/// `relative` under the working directory, as a person running it by hand expects.
pub fn service_default(name: &str, relative: &str) -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        Path::new("/var/lib").join(name)
    } else {
        PathBuf::from(relative)
    }
}

/// The uids whose directories this process takes: its own, and, for root run through
/// `sudo`, the user who ran it (a `sudo headroom up` in their own project).
fn trusted_owners() -> Vec<u32> {
    let me = nix::unistd::geteuid().as_raw();
    let mut owners = vec![me];
    if me == 0
        && let Some(uid) = std::env::var("SUDO_UID")
            .ok()
            .and_then(|u| u.parse::<u32>().ok())
    {
        owners.push(uid);
    }
    owners
}

/// Makes `dir` (and its parents) when missing, or takes it when it is this user's and no
/// one else may write in it; its absolute path. A link given as the directory itself (a
/// `.headroom` that points at a scratch disk) is followed when the link is this user's too,
/// and its target checked: one another user planted where root runs (`/tmp/.headroom ->
/// /etc`) is refused, else root would make its target private.
pub fn adopt(dir: &Path) -> Result<PathBuf, DataDirError> {
    let io = |source| DataDirError::Io {
        path: dir.to_path_buf(),
        source,
    };
    if let Ok(link) = std::fs::symlink_metadata(dir)
        && link.file_type().is_symlink()
    {
        owned(dir, &link)?;
    }
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let path = dir.canonicalize().map_err(io)?;
    check(&path, std::fs::metadata(&path).map_err(io)?)?;
    Ok(path)
}

/// A directory inside a data directory (its logs, fake GPUs): made when missing; refused
/// when it is a link, or not this user's, or writable by others unless `shared` (a sticky
/// directory several users' jobs write to, as `/tmp`).
pub fn own_subdir(dir: &Path, shared: bool) -> Result<(), DataDirError> {
    let io = |source| DataDirError::Io {
        path: dir.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => Err(DataDirError::Link {
            path: dir.to_path_buf(),
        }),
        Ok(meta) if shared => owned(dir, &meta),
        Ok(meta) => check(dir, meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(io)?;
            // Made just now, unless another process raced us: looked at again.
            let meta = std::fs::symlink_metadata(dir).map_err(io)?;
            if meta.file_type().is_symlink() {
                return Err(DataDirError::Link {
                    path: dir.to_path_buf(),
                });
            }
            owned(dir, &meta)
        }
        Err(e) => Err(io(e)),
    }
}

/// Refuses a file this process is about to change (its mode, its owner) when it is a link.
pub fn not_a_link(path: &Path) -> Result<bool, DataDirError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(DataDirError::Link {
            path: path.to_path_buf(),
        }),
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(DataDirError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn owned(path: &Path, meta: &std::fs::Metadata) -> Result<(), DataDirError> {
    if !trusted_owners().contains(&meta.uid()) {
        return Err(DataDirError::Foreign {
            path: path.to_path_buf(),
            owner: meta.uid(),
            me: nix::unistd::geteuid().as_raw(),
        });
    }
    Ok(())
}

fn check(path: &Path, meta: std::fs::Metadata) -> Result<(), DataDirError> {
    owned(path, &meta)?;
    if meta.mode() & 0o022 != 0 {
        return Err(DataDirError::Writable {
            path: path.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_directory_of_this_user_is_taken_and_made_when_missing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let made = tmp.path().join("a").join(".headroom");
        let path = adopt(&made).expect("made");
        assert!(path.is_absolute() && path.is_dir());
        assert_eq!(adopt(&made).expect("taken again"), path);
        // Writable by others: refused, naming the mode.
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = adopt(&made).expect_err("world-writable");
        assert!(e.to_string().contains("777"), "{e}");
    }

    #[test]
    fn links_inside_a_data_directory_are_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let target = tmp.path().join("elsewhere");
        std::fs::create_dir(&target).expect("target");
        let link = tmp.path().join("fake-gpus");
        std::os::unix::fs::symlink(&target, &link).expect("link");
        let e = own_subdir(&link, true).expect_err("a link");
        assert!(matches!(e, DataDirError::Link { .. }), "{e}");
        assert!(not_a_link(&link).is_err());
        assert!(!not_a_link(&tmp.path().join("missing")).expect("missing"));
        own_subdir(&tmp.path().join("logs"), false).expect("made");
    }

    /// A service run as root keeps its state under `/var/lib`, never relative to wherever it
    /// was started; a person's run, in its working directory.
    #[test]
    fn a_root_service_keeps_its_state_under_var_lib() {
        let dir = service_default("headroom-agent", ".headroom-agent");
        if nix::unistd::geteuid().is_root() {
            assert_eq!(dir, Path::new("/var/lib/headroom-agent"));
        } else {
            assert_eq!(dir, Path::new(".headroom-agent"));
        }
    }

    /// Root takes no directory of another user (the test runs as root on CI).
    #[test]
    fn root_takes_no_directory_of_another_user() {
        if !nix::unistd::geteuid().is_root() {
            // Under CI (root) the case must run: it would otherwise pass without running.
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true, but not root: this case would pass without running"
            );
            return;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).expect("dir");
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
        let e = adopt(&theirs).expect_err("another user's");
        assert!(
            matches!(e, DataDirError::Foreign { owner: 65534, .. }),
            "{e}"
        );
        assert!(own_subdir(&theirs, true).is_err());
        // A link of theirs to a root directory, where root would take its data directory.
        let target = tmp.path().join("root-only");
        std::fs::create_dir(&target).expect("target");
        let link = tmp.path().join(".headroom");
        std::os::unix::fs::symlink(&target, &link).expect("link");
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).expect("lchown");
        let e = adopt(&link).expect_err("another user's link");
        assert!(
            matches!(e, DataDirError::Foreign { owner: 65534, .. }),
            "{e}"
        );
        // Root's own link is followed.
        std::os::unix::fs::lchown(&link, Some(0), Some(0)).expect("lchown");
        assert_eq!(
            adopt(&link).expect("root's link"),
            target.canonicalize().expect("path")
        );
    }
}
