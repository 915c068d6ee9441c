//! Who a job runs as: an agent running as root runs each job as its submitter's Unix user
//! (or the configured default), never as root unless the admin allowed it for that user; an
//! agent not running as root runs every job as its own user.

use std::ffi::CString;
use std::path::PathBuf;

use headroom_shared::api::RunAs;
use nix::unistd::{Gid, Uid, User};

/// Whether this process runs as root (and so runs jobs as their users).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The user a launch runs as: `None` when this process is not root (it cannot change user:
/// jobs run as its own), else the lease's user or the default.
pub fn effective(lease: Option<RunAs>, default: &str) -> Option<RunAs> {
    if !is_root() {
        return None;
    }
    Some(lease.unwrap_or_else(|| RunAs {
        unix_user: default.to_string(),
        allow_root: false,
    }))
}

/// Checks the default user at start: `Ok(Some(me))` when this process is not root (every
/// job runs as `me`); an error when, running as root, the default does not exist or is root.
pub fn check_default(default: &str) -> Result<Option<String>, String> {
    if !is_root() {
        let me = nix::unistd::geteuid();
        let name = User::from_uid(me)
            .ok()
            .flatten()
            .map_or_else(|| format!("uid {me}"), |u| format!("{} (uid {me})", u.name));
        return Ok(Some(name));
    }
    let id = resolve(&RunAs {
        unix_user: default.to_string(),
        allow_root: false,
    })?;
    debug_assert!(!id.uid.is_root());
    Ok(None)
}

/// What runs a job as a Unix user who may read its files, said wherever a job's user was
/// refused.
pub const MAPPING_HINT: &str = "A job runs as the Unix user its headroom user maps to \
     (`headroom user create NAME --unix-user USER`; where everything is root's, as in many \
     containers, `--unix-user root --allow-root`), else as the agent's --run-as-default; \
     `sudo headroom up` runs your own jobs as you";

/// A Unix user resolved on this node, ready for the job's process to become.
#[derive(Clone, Debug)]
pub struct Identity {
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
    /// Supplementary groups, the primary one included.
    pub groups: Vec<Gid>,
    pub home: PathBuf,
    pub shell: PathBuf,
}

/// Looks the user up; refuses one that does not exist here, and root unless allowed.
pub fn resolve(run_as: &RunAs) -> Result<Identity, String> {
    let name = &run_as.unix_user;
    let user = User::from_name(name)
        .map_err(|e| format!("cannot look up Unix user `{name}`: {e}"))?
        .ok_or_else(|| format!("there is no Unix user `{name}` on this node"))?;
    if user.uid.is_root() && !run_as.allow_root {
        return Err(format!(
            "refusing to run the job as root (`{name}`): an admin allows it per user with \
             `headroom user create NAME --unix-user root --allow-root`"
        ));
    }
    let cname = CString::new(name.as_bytes()).map_err(|_| format!("`{name}` has a NUL"))?;
    let groups = nix::unistd::getgrouplist(&cname, user.gid)
        .map_err(|e| format!("cannot list the groups of `{name}`: {e}"))?;
    Ok(Identity {
        name: user.name,
        uid: user.uid,
        gid: user.gid,
        groups,
        home: user.dir,
        shell: user.shell,
    })
}

/// The part of `path` (a `PATH` value) that `id` may use: the directories it may search,
/// every folder above them included. A root agent's `PATH` may name root's own tool folders
/// (`/root/.cargo/bin`), which another user's job would only try and be refused; relative
/// and empty entries (the working directory) are dropped too. Where nothing is left, the
/// system's default.
pub fn path_for(path: &str, id: &Identity) -> String {
    let kept: Vec<&str> = path
        .split(':')
        .filter(|dir| dir.starts_with('/') && searchable(std::path::Path::new(dir), id))
        .collect();
    if kept.is_empty() {
        "/usr/local/bin:/usr/bin:/bin".to_string()
    } else {
        kept.join(":")
    }
}

/// Whether `id` may search `dir` and every folder above it, by their modes (the supervisor
/// is root: `access` would answer for root).
fn searchable(dir: &std::path::Path, id: &Identity) -> bool {
    if id.uid.is_root() {
        return true;
    }
    dir.ancestors()
        .all(|d| std::fs::metadata(d).is_ok_and(|meta| meta.is_dir() && may_search(&meta, id)))
}

/// Whether `id` may search a folder of `meta`, by its mode.
fn may_search(meta: &std::fs::Metadata, id: &Identity) -> bool {
    use std::os::unix::fs::MetadataExt;
    let bit = if meta.uid() == id.uid.as_raw() {
        0o100
    } else if meta.gid() == id.gid.as_raw() || id.groups.iter().any(|g| g.as_raw() == meta.gid()) {
        0o010
    } else {
        0o001
    };
    meta.mode() & bit != 0
}

/// The first folder on the way to `dir` (itself included) that `id` may not search by its
/// mode, with its owner and mode; `None` where the modes allow every one, or a folder
/// cannot be looked at from here.
pub fn first_unsearchable(dir: &std::path::Path, id: &Identity) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mut way: Vec<&std::path::Path> = dir.ancestors().collect();
    way.reverse();
    for d in way {
        let meta = std::fs::metadata(d).ok()?;
        if !may_search(&meta, id) {
            let name = |uid| {
                User::from_uid(Uid::from_raw(uid))
                    .ok()
                    .flatten()
                    .map_or_else(|| format!("uid {uid}"), |u| u.name)
            };
            return Some(format!(
                "{} (owner {}, mode {:o})",
                d.display(),
                name(meta.uid()),
                meta.mode() & 0o7777
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_refused_unless_allowed_and_unknown_users_are_named() {
        let root = RunAs {
            unix_user: "root".into(),
            allow_root: false,
        };
        let e = resolve(&root).expect_err("root refused");
        assert!(e.contains("refusing to run the job as root"), "{e}");
        let allowed = resolve(&RunAs {
            allow_root: true,
            ..root
        })
        .expect("root allowed");
        assert!(allowed.uid.is_root());
        let e = resolve(&RunAs {
            unix_user: "no-such-user-hr".into(),
            allow_root: false,
        })
        .expect_err("unknown");
        assert!(e.contains("no Unix user `no-such-user-hr`"), "{e}");
        if is_root() {
            assert!(check_default("root").is_err());
            assert_eq!(check_default("nobody"), Ok(None));
            assert_eq!(
                effective(None, "nobody").map(|r| r.unix_user),
                Some("nobody".to_string())
            );
        }
    }

    /// A root agent's `PATH` as seen by another user: root's private tool folder (and one
    /// under a private parent) and relative entries are dropped, the rest kept in order.
    #[test]
    fn a_jobs_path_holds_what_its_user_may_search() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let mode = |p: &std::path::Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
        };
        mode(dir.path(), 0o755);
        let private = dir.path().join("root-home");
        let open = dir.path().join("opt");
        for d in [private.join("bin"), open.join("bin")] {
            std::fs::create_dir_all(&d).expect("mkdir");
            mode(&d, 0o755);
        }
        mode(&private, 0o700);
        mode(&open, 0o755);
        let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
            .ok()
            .flatten()
            .expect("this user");
        let other = Identity {
            name: "other".into(),
            uid: Uid::from_raw(me.uid.as_raw() + 4242),
            gid: Gid::from_raw(me.gid.as_raw() + 4242),
            groups: vec![],
            home: "/nonexistent".into(),
            shell: "/bin/sh".into(),
        };
        let path = format!(
            "{}:.::{}:/usr/bin:relative/bin:/no/such/dir",
            private.join("bin").display(),
            open.join("bin").display()
        );
        assert_eq!(
            path_for(&path, &other),
            format!("{}:/usr/bin", open.join("bin").display())
        );
        assert_eq!(
            path_for("relative:", &other),
            "/usr/local/bin:/usr/bin:/bin"
        );
        // Its owner, and a member of its group where the group may search, keep it.
        let owner = Identity {
            uid: me.uid,
            ..other.clone()
        };
        assert!(path_for(&path, &owner).starts_with(&private.join("bin").display().to_string()));
    }
}
