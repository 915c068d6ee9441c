//! An attempt's processes (its job, its background): started by `std::process::Command`
//! with one `pre_exec` for what the standard library cannot do in the child (join the
//! attempt's cgroups, a session of its own, the job's user *with its supplementary groups*,
//! no new privileges, death with the supervisor, its working directory entered as that
//! user, no inherited descriptor); and the handle that waits for it, reaps it and kills it.
//!
//! The identity is set in the `pre_exec`, not by `CommandExt::uid`/`gid`: those drop the
//! user's supplementary groups (setting them is unstable in std), and the standard library
//! enters `current_dir` before a `pre_exec` runs, as root, which a root-squashed NFS home
//! refuses. What the child does between the fork and the exec is raw system calls over what
//! [`Spec::spawn`] prepared: no allocation, no lock.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};

use nix::libc;
use rustix::pipe::PipeFlags;
use rustix::process::{Gid, Pid, Uid, WaitOptions};
use tokio::io::unix::AsyncFd;

/// How often a child whose pid file descriptor said "exited" too soon is looked at again.
const RELOOK: std::time::Duration = std::time::Duration::from_millis(20);

/// A process to start: everything the child needs, prepared before it exists.
pub struct Spec {
    /// The program as given: a path when it holds a `/`, else looked up in the `PATH` of `env`.
    pub program: String,
    /// Arguments after the program (`argv[0]` is the program as given).
    pub args: Vec<String>,
    /// The whole environment (later entries of one name win).
    pub env: Vec<(OsString, OsString)>,
    /// Its working directory (the supervisor's when none), entered as the job's user.
    pub cwd: Option<PathBuf>,
    /// Its standard output and error (its standard input is `/dev/null`).
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// `cgroup.procs` files it joins first, as the supervisor's user, who may move it.
    pub join: Vec<File>,
    /// Supplementary groups, group and user it becomes (after joining): none keeps the
    /// supervisor's.
    pub identity: Option<(Vec<u32>, u32, u32)>,
}

/// Where the child stopped before its exec, sent to the supervisor as one byte (the
/// standard library reports only the `errno`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Cgroup = 1,
    Session,
    Groups,
    Group,
    User,
    NoNewPrivs,
    DeathSignal,
    Cwd,
    CloseFds,
}

impl Step {
    const ALL: [Step; 9] = [
        Step::Cgroup,
        Step::Session,
        Step::Groups,
        Step::Group,
        Step::User,
        Step::NoNewPrivs,
        Step::DeathSignal,
        Step::Cwd,
        Step::CloseFds,
    ];

    fn from_code(code: u8) -> Option<Step> {
        Step::ALL.into_iter().find(|s| *s as u8 == code)
    }

    fn describe(self) -> &'static str {
        match self {
            Step::Cgroup => "cannot join the attempt's cgroup",
            Step::Session => "cannot start a session of its own",
            Step::Groups => "cannot take the user's groups",
            Step::Group => "cannot take the user's group",
            Step::User => "cannot become the user",
            Step::NoNewPrivs => "cannot give up gaining privileges",
            Step::DeathSignal => "cannot tie it to its supervisor",
            Step::Cwd => "cannot enter its working directory",
            Step::CloseFds => "cannot close the descriptors it must not inherit",
        }
    }
}

/// Why a process could not start: the step of the child's setup that failed, if one did
/// (else the exec, or the fork), and the system's error.
#[derive(Debug, thiserror::Error)]
#[error("{}{source}", step.map(|s| format!("{}: ", s.describe())).unwrap_or_default())]
pub struct SpawnError {
    pub step: Option<Step>,
    #[source]
    pub source: io::Error,
}

impl From<SpawnError> for io::Error {
    fn from(e: SpawnError) -> io::Error {
        match e.step {
            None => e.source,
            Some(_) => io::Error::new(e.source.kind(), e.to_string()),
        }
    }
}

/// What the child does between the fork and the exec, all prepared in the supervisor.
struct ChildSetup {
    join: Vec<File>,
    groups: Vec<Gid>,
    ids: Option<(Gid, Uid)>,
    cwd: Option<CString>,
    /// The supervisor: the child's parent, unless it died before the death signal was set.
    supervisor: Pid,
    /// Above the highest descriptor opened since the supervisor started (its soft
    /// `RLIMIT_NOFILE`): where the kernel cannot mark them all at once, they are marked one
    /// by one up to here (the inherited ones, which may sit higher, were marked at its start:
    /// [`mark_inherited_close_on_exec`]).
    fd_limit: u32,
    /// Where a failed step is written (close-on-exec; non-blocking).
    report: OwnedFd,
}

impl ChildSetup {
    /// Runs in the child; an error ends it before the exec, its step written to `report`.
    fn run(&self) -> io::Result<()> {
        self.steps().map_err(|(step, errno)| {
            let _ = rustix::io::write(&self.report, &[step as u8]);
            io::Error::from_raw_os_error(errno)
        })
    }

    fn steps(&self) -> Result<(), (Step, i32)> {
        let fail = |step: Step| move |e: rustix::io::Errno| (step, e.raw_os_error());
        for f in &self.join {
            rustix::io::write(f, b"0").map_err(fail(Step::Cgroup))?;
        }
        rustix::process::setsid().map_err(fail(Step::Session))?;
        // Not the agent's private umask: the job's files are made as users expect.
        rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
        if let Some((gid, uid)) = self.ids {
            // The kernel's per-task calls: the child is one thread, and the C library's
            // `setuid` would signal threads of the supervisor's it has not got.
            rustix::thread::set_thread_groups(&self.groups).map_err(fail(Step::Groups))?;
            rustix::thread::set_thread_gid(gid).map_err(fail(Step::Group))?;
            rustix::thread::set_thread_uid(uid).map_err(fail(Step::User))?;
            // A job started as its user by a root supervisor stays that user: a set-uid
            // program in its reach (an image's `sudo`) cannot make it root again, as
            // `allowPrivilegeEscalation: false` would have it.
            rustix::thread::set_no_new_privs(true).map_err(fail(Step::NoNewPrivs))?;
        }
        // After the change of user, which clears it.
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
            .map_err(fail(Step::DeathSignal))?;
        // A supervisor that died before the line above sends no signal: nothing to tie to.
        if rustix::process::getppid() != Some(self.supervisor) {
            return Err((Step::DeathSignal, libc::ESRCH));
        }
        // As the job's user: a directory root may not enter (root-squashed NFS) is entered,
        // one the user may not is refused.
        if let Some(dir) = &self.cwd {
            rustix::process::chdir(dir.as_c_str()).map_err(fail(Step::Cwd))?;
        }
        // Its standard streams only: whatever the supervisor holds or inherited (a
        // descriptor left open by whoever started the agent, to a file the job's user may
        // not read) is closed at the exec. Marked, not closed: the standard library's own
        // report of a failed exec travels on one of them.
        mark_close_on_exec(self.fd_limit).map_err(|errno| (Step::CloseFds, errno))
    }
}

/// Marks every descriptor above 2 close-on-exec: `close_range` at once (Linux 5.11), or one
/// by one below `limit` (the soft limit: a few thousand calls at most).
#[allow(unsafe_code)]
fn mark_close_on_exec(limit: u32) -> Result<(), i32> {
    // SAFETY: close_range over this process's own table with plain integers; with
    // CLOSE_RANGE_CLOEXEC it closes nothing, it marks.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let errno = io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::ENOSYS);
    // No such call or flag (before 5.11), or a seccomp profile that answers EPERM for
    // calls it does not know: one by one instead.
    if !matches!(errno, libc::ENOSYS | libc::EINVAL | libc::EPERM) {
        return Err(errno);
    }
    // The kernel's own ceiling on descriptors (`nr_open`, 1 << 20 by default).
    for fd in 3..limit.min(1 << 20) {
        // SAFETY: fcntl on a descriptor number of this process's own table; one not open
        // answers EBADF, which is what is wanted.
        unsafe {
            libc::fcntl(fd as libc::c_int, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    Ok(())
}

/// Marks every descriptor this process inherited above the standard streams close-on-exec,
/// once, at its start: whatever whoever started the agent left open (to a file the job's user
/// may not read) never reaches a job, even where a job's start must mark descriptors one by
/// one below the soft limit and an inherited one sits above it. Everything the process opens
/// itself is opened close-on-exec.
#[allow(unsafe_code)]
pub fn mark_inherited_close_on_exec() -> io::Result<()> {
    let fds: Vec<libc::c_int> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: fcntl on a descriptor number of this process's own table; the directory's
        // own descriptor, closed by now, answers EBADF.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    Ok(())
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

impl Spec {
    /// Starts the process; returns once it has exec'd, or with why it could not.
    pub fn spawn(self) -> Result<Child, SpawnError> {
        let plain = |source: io::Error| SpawnError { step: None, source };
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).env_clear();
        for (k, v) in &self.env {
            if k.is_empty() || k.as_bytes().contains(&b'=') {
                return Err(plain(invalid(format!(
                    "an environment variable's name is not valid: {k:?}"
                ))));
            }
            // Later entries of one name win.
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(self.stdout))
            .stderr(Stdio::from(self.stderr));
        let cwd = self
            .cwd
            .as_ref()
            .map(|d| {
                CString::new(d.as_os_str().as_bytes())
                    .map_err(|_| invalid(format!("the working directory holds a NUL byte: {d:?}")))
            })
            .transpose()
            .map_err(plain)?;
        let (groups, ids) = match self.identity {
            Some((groups, gid, uid)) => (
                groups.into_iter().map(Gid::from_raw).collect(),
                Some((Gid::from_raw(gid), Uid::from_raw(uid))),
            ),
            None => (Vec::new(), None),
        };
        let (steps, report) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)
            .map_err(|e| plain(e.into()))?;
        let setup = ChildSetup {
            join: self.join,
            groups,
            ids,
            cwd,
            supervisor: rustix::process::getpid(),
            fd_limit: rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .current
                .map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            report,
        };
        // SAFETY: the closure runs in the forked child before the exec and makes system
        // calls only, over data prepared above; it allocates nothing and takes no lock.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || setup.run());
        }
        let child = cmd.spawn().map_err(|source| {
            // The child has exited (the standard library reaped it): its step, if it said.
            let mut code = [0u8; 1];
            let step = match rustix::io::read(steps.as_fd(), &mut code) {
                Ok(1) => Step::from_code(code[0]),
                _ => None,
            };
            SpawnError { step, source }
        })?;
        let pid = child.id();
        // The standard library's handle is let go (dropping it neither waits nor kills):
        // this one waits through a pid file descriptor, opened while the process cannot
        // have been reaped by anyone else (it is ours and unreaped), so it names this
        // process and no later one with its pid.
        drop(child);
        let raw = Pid::from_raw(pid as i32).ok_or_else(|| plain(io::Error::other("pid 0")))?;
        let exits = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty())
            .ok()
            .map(Exits::Fd);
        Ok(Child {
            pid,
            status: None,
            exits,
        })
    }
}

/// How a child's exit is awaited: its pid file descriptor (registered with the runtime at
/// the first wait), or (a kernel without them) SIGCHLD.
enum Exits {
    Fd(OwnedFd),
    Registered(AsyncFd<OwnedFd>),
}

impl Exits {
    fn fd(&self) -> &OwnedFd {
        match self {
            Exits::Fd(fd) => fd,
            Exits::Registered(fd) => fd.get_ref(),
        }
    }
}

/// A started process of the attempt. Dropped unreaped, it is killed and left to the
/// supervisor's reaper (`procscan::reap_orphans`).
pub struct Child {
    pid: u32,
    status: Option<ExitStatus>,
    exits: Option<Exits>,
}

impl Child {
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Its exit status if it has exited (reaping it), else `None`.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let pid = Pid::from_raw(self.pid as i32).ok_or_else(|| io::Error::other("pid 0"))?;
        match rustix::process::waitpid(Some(pid), WaitOptions::NOHANG) {
            Ok(Some((_, status))) => {
                let status = ExitStatus::from_raw(status.as_raw());
                self.status = Some(status);
                self.exits = None;
                Ok(Some(status))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Its pid file descriptor registered with the runtime, where it has one and it can be.
    #[allow(unsafe_code)]
    fn registered(&mut self) -> Option<&AsyncFd<OwnedFd>> {
        if let Some(Exits::Fd(_)) = self.exits
            && let Some(Exits::Fd(fd)) = self.exits.take()
        {
            // SAFETY: the `AsyncFd` owns the descriptor: it stays open and the same until
            // the `AsyncFd` is dropped.
            self.exits = unsafe { AsyncFd::register(fd) }.ok().map(Exits::Registered);
        }
        match &self.exits {
            Some(Exits::Registered(fd)) => Some(fd),
            _ => None,
        }
    }

    /// Waits for it to exit and reaps it. Cancel-safe: dropped before the exit, it can be
    /// called again.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let mut told = false;
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(s);
            }
            if told {
                // Said "exited" yet not reapable: look again a moment later.
                tokio::time::sleep(RELOOK).await;
                continue;
            }
            match self.registered() {
                Some(fd) => {
                    // An exit is final: its readiness is kept (a wait given up and called
                    // again sees it at once), and a child not reapable yet (a tracer has it
                    // first) is looked at again shortly.
                    drop(fd.readable().await?);
                    told = true;
                }
                None => {
                    // No pid file descriptor: SIGCHLD, registered before the look below,
                    // so an exit between the two is not missed.
                    let mut chld =
                        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
                    if let Some(s) = self.try_wait()? {
                        return Ok(s);
                    }
                    chld.recv().await;
                }
            }
        }
    }

    /// Sends it SIGKILL, unless it has been reaped: through its pid file descriptor where it
    /// has one, which cannot name a later process with its pid.
    pub fn start_kill(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        if let Some(exits) = &self.exits {
            return rustix::process::pidfd_send_signal(exits.fd(), rustix::process::Signal::KILL)
                .map_err(Into::into);
        }
        let pid = Pid::from_raw(self.pid as i32).ok_or_else(|| io::Error::other("pid 0"))?;
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).map_err(Into::into)
    }

    /// Whether it is awaited through its pid file descriptor.
    #[cfg(test)]
    fn by_pidfd(&self) -> bool {
        self.exits.is_some()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.status.is_none() {
            match self.try_wait() {
                Ok(Some(_)) => {}
                Ok(None) => {
                    let _ = self.start_kill();
                }
                // Reaped by someone else (the reaper, once it was disowned): its pid may
                // be another process's by now, so nothing is signalled.
                Err(_) => self.exits = None,
            }
            crate::procscan::disown(self.pid);
        }
    }
}

#[cfg(test)]
mod tests;
