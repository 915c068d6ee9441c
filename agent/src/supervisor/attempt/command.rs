//! The job's command: its own session, the attempt's environment, GPUs and marker, and its
//! output appended to the attempt's log.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use headroom_shared::expand::value_text;

use crate::gpu::GpuBackend;
use crate::procscan::ATTEMPT_VAR;
use crate::supervisor::process::{Child, Spec, Step};

use super::launch::{Launch, NotStarted};
use super::workspace;

/// Starts `spec` (`what`: how the log names the process), recording it as the agent's own;
/// a working directory its user could not enter is the attempt's `workdir` failure.
pub(crate) fn spawn(spec: Spec, launch: &Launch, what: &str) -> Result<Child, NotStarted> {
    let cwd = spec.cwd.clone();
    let program = spec.program.clone();
    let path = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.to_string_lossy().into_owned());
    let mut refused = None;
    let spawned = crate::procscan::spawn_owned(
        || {
            spec.spawn().map_err(|e| {
                if e.step == Some(Step::Cwd) {
                    refused = e.source.raw_os_error();
                }
                e.into()
            })
        },
        |c| Some(c.id()),
    );
    match (spawned, refused, cwd) {
        (Ok(child), _, _) => Ok(child),
        // Missing, refused, or a link loop: the directory is the node's to fix; another
        // error (a stale NFS handle) is the launch's, retried as its policy says.
        (Err(_), Some(errno), Some(dir)) if is_workdir_errno(errno) => {
            let identity = launch
                .run_as
                .as_ref()
                .and_then(|r| crate::runas::resolve(r).ok());
            Err(workspace::cannot_enter(&dir, identity.as_ref(), errno))
        }
        (Err(e), _, cwd) => {
            let mut msg = format!("cannot start {what}: {e}");
            let identity = launch
                .run_as
                .as_ref()
                .and_then(|r| crate::runas::resolve(r).ok());
            if e.kind() == std::io::ErrorKind::PermissionDenied
                && let Some(id) = &identity
            {
                msg.push_str(&workspace::cannot_run(
                    &program,
                    path.as_deref(),
                    cwd.as_deref(),
                    id,
                ));
            }
            Err(msg.into())
        }
    }
}

fn is_workdir_errno(errno: i32) -> bool {
    use nix::errno::Errno;
    [Errno::ENOENT, Errno::ENOTDIR, Errno::EACCES, Errno::ELOOP]
        .iter()
        .any(|e| *e as i32 == errno)
}

/// `HP_<NAME>`: parameter names are identifiers (the spec validates them); anything else is
/// made one so that the variable can be read from a shell.
pub(super) fn param_var(name: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("HP_{name}")
}

/// Where the attempt's own temporary directory is: under the node's (the agent's `TMPDIR`,
/// else `/tmp`), named after the attempt.
pub(crate) fn tmp_dir(launch: &Launch) -> PathBuf {
    crate::codetree::attempt_tmp(
        launch.base_env.get("TMPDIR").map(String::as_str),
        &launch.attempt.to_string(),
    )
}

/// The job's own directory under `base` (the agent's `--job-dirs`): the same for each of
/// its attempts on the node (`HEADROOM_JOB_DIR`), where it keeps what a restart resumes from.
pub fn job_dir(base: &std::path::Path, job: headroom_shared::JobId) -> PathBuf {
    base.join(format!("headroom-job-{job}"))
}

/// The attempt's own temporary directory (its `TMPDIR`), made for its user (0700) when the
/// first of its processes starts, and taken again by the second (a colocated background's
/// foreground) only when it is that same user's directory and no link: a name planted
/// in a shared `/tmp` is refused rather than used.
fn private_tmp(
    launch: &Launch,
    identity: Option<&crate::runas::Identity>,
) -> Result<PathBuf, String> {
    private_dir(
        tmp_dir(launch),
        identity,
        "the attempt's temporary directory",
    )
}

/// `dir`, made for the job's user (0700), or taken as it is when it is that user's already
/// and private (a job directory its earlier attempts made); anything else there is refused.
fn private_dir(
    dir: PathBuf,
    identity: Option<&crate::runas::Identity>,
    what: &str,
) -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    let (uid, gid) = owner(identity);
    let refused = |why: String| format!("{what} {}: {why}", dir.display());
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => std::os::unix::fs::lchown(&dir, Some(uid), Some(gid))
            .map_err(|e| refused(e.to_string()))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            private_dir_of(&dir, uid).map_err(refused)?;
        }
        Err(e) => return Err(refused(e.to_string())),
    }
    Ok(dir)
}

/// Whose the attempt's temporary directory is: its user's, else this process's.
fn owner(identity: Option<&crate::runas::Identity>) -> (u32, u32) {
    match identity {
        Some(id) => (id.uid.as_raw(), id.gid.as_raw()),
        None => (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        ),
    }
}

/// Whether `dir` is the attempt's own temporary directory: a directory (no link) of its
/// user's that no one else may enter.
pub(crate) fn is_own_tmp(launch: &Launch, dir: &std::path::Path) -> bool {
    let identity = launch
        .run_as
        .as_ref()
        .and_then(|r| crate::runas::resolve(r).ok());
    private_dir_of(dir, owner(identity.as_ref()).0).is_ok()
}

/// `dir` is a directory (no link) of `uid`'s that no one else may enter; else why not.
fn private_dir_of(dir: &std::path::Path, uid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "it exists and is not this attempt's (owner uid {}, mode {:o}): refused",
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// The command for the attempt, or why it cannot be built.
pub(super) fn command(
    launch: &Launch,
    backend: &dyn GpuBackend,
    log: &File,
) -> Result<Spec, NotStarted> {
    if launch.argv.is_empty() {
        return Err("the job has an empty command".to_string().into());
    }
    build_command(launch, &launch.argv, &BTreeMap::new(), backend, log)
}

/// `argv` as one of the attempt's processes: in the attempt's cgroup, its own session and
/// process group (so the group can be signalled without touching its supervisor), as the
/// job's user (groups, then group, then user: after that it can take none back), killed by
/// the kernel if the supervisor's thread dies; the attempt's environment, GPUs and marker,
/// `extra` variables over the job's, output to `log` (see [`crate::supervisor::process`]).
pub(crate) fn build_command(
    launch: &Launch,
    argv: &[String],
    extra: &BTreeMap<String, String>,
    backend: &dyn GpuBackend,
    log: &File,
) -> Result<Spec, NotStarted> {
    let Some((program, args)) = argv.split_first() else {
        return Err("empty command".to_string().into());
    };
    let identity = launch
        .run_as
        .as_ref()
        .map(crate::runas::resolve)
        .transpose()?;
    // Into the attempt's cgroup before it can start anything, where attempts have one.
    let join = match crate::cgroup::attribution() {
        Some(c) => {
            let cg = c.attempt(launch.attempt);
            cg.create()
                .and_then(|()| match launch.host_memory_mib {
                    Some(mib) => cg.limit_memory(mib),
                    None => Ok(()),
                })
                .and_then(|()| cg.join())
                .map(Some)
                .map_err(|e| {
                    format!(
                        "cannot set up the attempt's cgroup {}: {e}",
                        cg.dir().display()
                    )
                })?
        }
        None => None,
    };
    let cwd = if let Some(dir) = &launch.workdir {
        workspace::check_workdir(dir)?;
        Some(dir.clone())
    } else {
        // Not the agent's directory (the user may not enter it): the user's home.
        identity.as_ref().map(|id| {
            if id.home.is_dir() {
                id.home.clone()
            } else {
                PathBuf::from("/")
            }
        })
    };
    let activated = launch
        .environment
        .as_ref()
        .map(|e| workspace::activate(e, identity.as_ref(), &launch.base_env))
        .transpose()?;
    // Nothing inherited (the supervisor's environment is the agent's, credentials and all):
    // the pass-through variables, the user's own, then the job's, then what headroom owns.
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    let text = |k: &str, v: &str| (OsString::from(k), OsString::from(v));
    env.extend(launch.base_env.iter().map(|(k, v)| text(k, v)));
    let base_path = launch.base_env.get("PATH").map(|path| match &identity {
        Some(id) => crate::runas::path_for(path, id),
        None => path.clone(),
    });
    // The job's environment first on `PATH`, as its `activate` would put it.
    if let Some(a) = &activated {
        let path = match &base_path {
            Some(p) => format!("{}:{p}", a.bin.display()),
            None => a.bin.display().to_string(),
        };
        env.push(text("PATH", &path));
        env.extend(a.vars.iter().map(|(k, v)| text(k, v)));
    } else if let Some(path) = &base_path {
        env.push(text("PATH", path));
    }
    if let Some(id) = &identity {
        // Paths as they are (not made text).
        env.push(("HOME".into(), id.home.clone().into()));
        env.push(text("USER", &id.name));
        env.push(text("LOGNAME", &id.name));
        env.push(("SHELL".into(), id.shell.clone().into()));
        // The log is the user's: what the job writes, and what it may read back. Its group
        // stays the supervisor's, which reads it back by that (0640): root without
        // CAP_DAC_OVERRIDE (a root-squashed node) may not read another user's 0600 file.
        use std::os::unix::fs::PermissionsExt;
        log.set_permissions(std::fs::Permissions::from_mode(0o640))
            .and_then(|()| std::os::unix::fs::fchown(log, Some(id.uid.as_raw()), None))
            .map_err(|e| format!("cannot give the log to `{}`: {e}", id.name))?;
    }
    env.extend(launch.env.iter().chain(extra).map(|(k, v)| text(k, v)));
    // Over the agent's and the spec's: the attempt's own, which no other user can read or
    // plant files in, gone with the attempt.
    env.push((
        "TMPDIR".into(),
        private_tmp(launch, identity.as_ref())?.into(),
    ));
    // Its job's: where it saves what its next attempt resumes from, and why it restarts.
    let restart = &launch.restart;
    if let Some(dir) = &restart.job_dir {
        let dir = private_dir(dir.clone(), identity.as_ref(), "the job's directory")?;
        env.push(("HEADROOM_JOB_DIR".into(), dir.into()));
    }
    env.push(text("HEADROOM_RESTART_COUNT", &restart.count.to_string()));
    if let Some(end) = restart.previous_end {
        env.push(text("HEADROOM_STOP_REASON", end.as_str()));
    }
    let gpus: Vec<String> = launch.gpus.iter().map(u32::to_string).collect();
    env.push(text("CUDA_VISIBLE_DEVICES", &gpus.join(",")));
    env.push(text("CUDA_DEVICE_ORDER", "PCI_BUS_ID"));
    env.push(text("HEADROOM_JOB_ID", &launch.job.to_string()));
    env.push(text(ATTEMPT_VAR, &launch.attempt.to_string()));
    for (name, value) in &launch.params {
        env.push(text(&param_var(name), &value_text(value)));
    }
    env.extend(backend.job_env().iter().map(|(k, v)| text(k, v)));

    let handle = || {
        log.try_clone()
            .map(OwnedFd::from)
            .map_err(|e| format!("cannot share the log file with the job: {e}"))
    };
    Ok(Spec {
        program: program.clone(),
        args: args.to_vec(),
        env,
        cwd,
        stdout: handle()?,
        stderr: handle()?,
        join,
        identity: identity.map(|id| {
            (
                id.groups.iter().map(|g| g.as_raw()).collect(),
                id.gid.as_raw(),
                id.uid.as_raw(),
            )
        }),
    })
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;

    /// Missing, refused or looping: the node's directory to fix (`workdir`); a stale NFS
    /// handle or an I/O error is the launch's.
    #[test]
    fn only_a_directory_the_node_lacks_or_refuses_is_a_workdir_failure() {
        for e in [Errno::ENOENT, Errno::ENOTDIR, Errno::EACCES, Errno::ELOOP] {
            assert!(super::is_workdir_errno(e as i32), "{e}");
        }
        for e in [Errno::ESTALE, Errno::EIO, Errno::ENOMEM] {
            assert!(!super::is_workdir_errno(e as i32), "{e}");
        }
    }
}
