//! The job's command: its own session, the attempt's environment, GPUs and marker, and its
//! output appended to the attempt's log.

use std::collections::BTreeMap;
use std::fs::File;
use std::process::Stdio;

use headroom_shared::expand::value_text;
use nix::sys::signal::Signal;
use tokio::process::Command;

use crate::gpu::GpuBackend;
use crate::procscan::ATTEMPT_VAR;

use super::launch::Launch;

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

/// The command for the attempt, or a message saying why it cannot be built.
pub(super) fn command(
    launch: &Launch,
    backend: &dyn GpuBackend,
    log: &File,
) -> Result<Command, String> {
    if launch.argv.is_empty() {
        return Err("the job has an empty command".to_string());
    }
    build_command(launch, &launch.argv, &BTreeMap::new(), backend, log)
}

/// `argv` as one of the attempt's processes: its own session, the attempt's environment,
/// GPUs and marker, `extra` variables over the job's, output to `log`.
pub(crate) fn build_command(
    launch: &Launch,
    argv: &[String],
    extra: &BTreeMap<String, String>,
    backend: &dyn GpuBackend,
    log: &File,
) -> Result<Command, String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("empty command".to_string());
    };
    // Forked from the attempt's supervisor process (small, one thread doing the work), not
    // from the agent.
    let mut cmd = Command::new(program);
    cmd.args(args);
    let identity = launch
        .run_as
        .as_ref()
        .map(crate::runas::resolve)
        .transpose()?;
    // Into the attempt's cgroup before it can start anything, where attempts have one.
    let join = match crate::cgroup::attribution() {
        Some(c) => {
            let cg = c.attempt(launch.attempt);
            cg.create().and_then(|()| cg.join_files()).map_err(|e| {
                format!(
                    "cannot set up the attempt's cgroup {}: {e}",
                    cg.dir().display()
                )
            })?
        }
        None => Vec::new(),
    };
    own_session_and_pdeathsig(&mut cmd, identity.as_ref(), join);
    if let Some(dir) = &launch.workdir {
        // Spawning would report a missing directory as a missing program.
        if !dir.is_dir() {
            return Err(format!(
                "working directory {} does not exist",
                dir.display()
            ));
        }
        cmd.current_dir(dir);
    } else if let Some(id) = &identity {
        // Not the agent's directory (the user may not enter it): the user's home.
        cmd.current_dir(if id.home.is_dir() {
            id.home.as_path()
        } else {
            std::path::Path::new("/")
        });
    }
    // Nothing inherited (the supervisor's environment is the agent's, credentials and all):
    // the pass-through variables, the user's own, then the job's, then what headroom owns.
    cmd.env_clear();
    cmd.envs(&launch.base_env);
    if let Some(id) = &identity {
        cmd.env("HOME", &id.home)
            .env("USER", &id.name)
            .env("LOGNAME", &id.name)
            .env("SHELL", &id.shell);
        // The log is the user's: what the job writes, and what it may read back.
        std::os::unix::fs::fchown(log, Some(id.uid.as_raw()), Some(id.gid.as_raw()))
            .map_err(|e| format!("cannot give the log to `{}`: {e}", id.name))?;
    }
    cmd.envs(&launch.env);
    cmd.envs(extra);
    let gpus: Vec<String> = launch.gpus.iter().map(u32::to_string).collect();
    cmd.env("CUDA_VISIBLE_DEVICES", gpus.join(","));
    cmd.env("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    cmd.env("HEADROOM_JOB_ID", launch.job.to_string());
    cmd.env(ATTEMPT_VAR, launch.attempt.to_string());
    for (name, value) in &launch.params {
        cmd.env(param_var(name), value_text(value));
    }
    cmd.envs(backend.job_env());

    let handle = || {
        log.try_clone()
            .map(Stdio::from)
            .map_err(|e| format!("cannot share the log file with the job: {e}"))
    };
    cmd.stdin(Stdio::null())
        .stdout(handle()?)
        .stderr(handle()?)
        .kill_on_drop(true);
    Ok(cmd)
}

/// Moves the child into the cgroups whose `cgroup.procs` are `join` (opened before the fork),
/// puts it in a session and process group of its own (so the group can be signalled
/// without touching its supervisor), makes it `identity` (groups, then group, then user:
/// after that it can take none back), and has the kernel SIGKILL it if the supervisor
/// process (the thread that forked it: the runtime's only worker) dies: set last, since
/// changing user clears it.
#[allow(unsafe_code)]
pub(super) fn own_session_and_pdeathsig(
    cmd: &mut Command,
    identity: Option<&crate::runas::Identity>,
    join: Vec<File>,
) {
    let ids = identity.map(|id| (id.groups.clone(), id.gid, id.uid));
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // work is allowed. It makes plain syscalls (write, setsid, setgroups, setgid, setuid,
    // prctl) over data and files prepared before the fork, allocates nothing (an io::Error from an errno is
    // not boxed), takes no lock and touches no parent state.
    unsafe {
        cmd.pre_exec(move || {
            // Still as the supervisor's user, who may move processes into these.
            for f in &join {
                nix::unistd::write(f, b"0")?;
            }
            nix::unistd::setsid()?;
            // Not the agent's private umask: the job's files are made as users expect.
            nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
            if let Some((groups, gid, uid)) = &ids {
                nix::unistd::setgroups(groups)?;
                nix::unistd::setgid(*gid)?;
                nix::unistd::setuid(*uid)?;
            }
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            Ok(())
        });
    }
}
