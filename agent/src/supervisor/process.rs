//! An attempt's processes (its job, its background): made by a fork of the supervisor's own
//! (`fork`: cloned straight into the attempt's cgroup where the kernel can, no move that
//! waits on it), set up in the child by raw system calls over what [`Spec::spawn`] prepared
//! (the attempt's v1 cgroup, standard streams, signals as a program expects them, a session
//! of its own, the job's user *with its supplementary groups*, no new privileges, death with
//! the supervisor, its working directory entered as that user, no inherited descriptor) and
//! exec'd as the standard library would; and the handle that waits for it, reaps it and
//! kills it.
//!
//! Not `std::process::Command`: it cannot clone into a cgroup, its `uid`/`gid` drop the
//! user's supplementary groups (setting them is unstable in std), and it enters
//! `current_dir` as root before a `pre_exec` runs, which a root-squashed NFS home refuses.
//! What the child does between the fork and the exec allocates nothing and takes no lock.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;

use nix::libc;
use rustix::pipe::PipeFlags;
use rustix::process::{Gid, Pid, Uid, WaitOptions};
use tokio::io::unix::AsyncFd;

use crate::cgroup::Join;

mod fork;

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
    /// The attempt's cgroups, which it is born in or joins first (as the supervisor's user).
    pub join: Option<Join>,
    /// Supplementary groups, group and user it becomes (after joining): none keeps the
    /// supervisor's.
    pub identity: Option<(Vec<u32>, u32, u32)>,
}

/// Where the child stopped before its exec, sent to the supervisor as one byte (the
/// standard library reports only the `errno`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Cgroup = 1,
    Streams,
    Signals,
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
    const ALL: [Step; 11] = [
        Step::Cgroup,
        Step::Streams,
        Step::Signals,
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
            Step::Streams => "cannot set up its standard streams",
            Step::Signals => "cannot reset its signals",
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
    program: fork::Program,
    /// Its standard input, output and error, each above 2 (so that none is overwritten
    /// before it is put in place).
    streams: [OwnedFd; 3],
    join: Option<Join>,
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
    /// Where a failure is written (close-on-exec, so the parent reads nothing once the
    /// exec is done): the step's code (0: the exec), then the error number.
    report: OwnedFd,
}

impl ChildSetup {
    /// Runs in the child, after the fork: its setup, then the exec; a failure is reported
    /// and ends it.
    #[allow(unsafe_code)]
    fn exec(&self, in_cgroup: bool) -> ! {
        let (code, errno) = match self.steps(in_cgroup) {
            Ok(()) => (0, self.program.exec()),
            Err((step, errno)) => (step as u8, errno),
        };
        let mut report = [0u8; 5];
        report[0] = code;
        report[1..].copy_from_slice(&errno.to_le_bytes());
        let _ = rustix::io::write(&self.report, &report);
        // SAFETY: ends this process at once, running none of the supervisor's exit handlers.
        unsafe { libc::_exit(127) }
    }

    fn steps(&self, in_cgroup: bool) -> Result<(), (Step, i32)> {
        let fail = |step: Step| move |e: rustix::io::Errno| (step, e.raw_os_error());
        if let Some(join) = &self.join {
            if !in_cgroup {
                rustix::io::write(&join.procs, b"0").map_err(fail(Step::Cgroup))?;
            }
            if let Some(tasks) = &join.tasks_v1 {
                rustix::io::write(tasks, b"0").map_err(fail(Step::Cgroup))?;
            }
        }
        let [stdin, stdout, stderr] = &self.streams;
        rustix::stdio::dup2_stdin(stdin).map_err(fail(Step::Streams))?;
        rustix::stdio::dup2_stdout(stdout).map_err(fail(Step::Streams))?;
        rustix::stdio::dup2_stderr(stderr).map_err(fail(Step::Streams))?;
        reset_signals().map_err(|errno| (Step::Signals, errno))?;
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
        // not read) is closed at the exec. Marked, not closed: the report of a failed exec
        // travels on one of them.
        mark_close_on_exec(self.fd_limit).map_err(|errno| (Step::CloseFds, errno))
    }
}

/// In the child: no signal blocked and `SIGPIPE` at its default, as programs expect and the
/// standard library's spawn leaves them (the Rust runtime ignores `SIGPIPE`, and an ignored
/// signal stays ignored across an exec).
#[allow(unsafe_code)]
fn reset_signals() -> Result<(), i32> {
    use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, pthread_sigmask, signal};
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None).map_err(|e| e as i32)?;
    // SAFETY: the default disposition installs no handler of ours.
    unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) }.map_err(|e| e as i32)?;
    Ok(())
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

/// A descriptor moved above the standard streams (close-on-exec), so that putting one
/// stream in place cannot overwrite another's source.
fn above_streams(fd: OwnedFd) -> io::Result<OwnedFd> {
    if rustix::fd::AsRawFd::as_raw_fd(&fd) > 2 {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 3)?)
}

/// The parent's read of the child's report: `None` once the exec closed it unwritten, else
/// the failed step's code and the error number.
fn read_report(fd: &OwnedFd) -> io::Result<Option<(u8, i32)>> {
    let mut report = [0u8; 5];
    let mut got = 0;
    while got < report.len() {
        match rustix::io::read(fd, &mut report[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match got {
        0 => Ok(None),
        5 => Ok(Some((
            report[0],
            i32::from_le_bytes([report[1], report[2], report[3], report[4]]),
        ))),
        _ => Err(io::Error::other(
            "the child's report of its start was cut short",
        )),
    }
}

impl Spec {
    /// Starts the process; returns once it has exec'd, or with why it could not.
    pub fn spawn(self) -> Result<Child, SpawnError> {
        let plain = |source: io::Error| SpawnError { step: None, source };
        let program = fork::Program::new(&self.program, &self.args, &self.env).map_err(plain)?;
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
        let stdin = OwnedFd::from(File::open("/dev/null").map_err(plain)?);
        let streams = [
            above_streams(stdin).map_err(plain)?,
            above_streams(self.stdout).map_err(plain)?,
            above_streams(self.stderr).map_err(plain)?,
        ];
        let (reports, report) =
            rustix::pipe::pipe_with(PipeFlags::CLOEXEC).map_err(|e| plain(e.into()))?;
        // Above the streams too, so that putting them in place cannot overwrite it.
        let report = above_streams(report).map_err(plain)?;
        let setup = ChildSetup {
            program,
            streams,
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
        let cgroup = setup.join.as_ref().map(|j| j.dir.as_fd());
        let (pid, in_cgroup) = match fork::fork(cgroup) {
            Ok(fork::Forked::Child { in_cgroup }) => setup.exec(in_cgroup),
            Ok(fork::Forked::Parent { pid, in_cgroup }) => (pid, in_cgroup),
            Err(fork::ForkError::IntoCgroup(source)) => {
                return Err(SpawnError {
                    step: Some(Step::Cgroup),
                    source,
                });
            }
            Err(fork::ForkError::Fork(source)) => return Err(plain(source)),
        };
        // The report's writing end closes here: the read below ends at the exec.
        drop(setup);
        let failed = read_report(&reports);
        if !matches!(failed, Ok(None)) {
            // It exits after its report (else it is killed): reaped here, as no one else
            // will.
            if failed.is_err() {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
        }
        match failed {
            Ok(None) => {}
            Ok(Some((code, errno))) => {
                return Err(SpawnError {
                    step: Step::from_code(code),
                    source: io::Error::from_raw_os_error(errno),
                });
            }
            Err(source) => return Err(plain(source)),
        }
        // Opened while it cannot have been reaped by anyone else (it is ours and unreaped), so
        // it names this process and no later one with its pid.
        let exits = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .ok()
            .map(Exits::Fd);
        Ok(Child {
            pid: pid.as_raw_nonzero().get() as u32,
            status: None,
            exits,
            in_cgroup,
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
    in_cgroup: bool,
}

impl Child {
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Whether it was born in its attempt's cgroup (else it joined by a move, which waits
    /// for an RCU grace period on a host without `favordynmods`).
    pub fn born_in_cgroup(&self) -> bool {
        self.in_cgroup
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
