//! An attempt's processes (its job, its background): started the way `posix_spawn` starts
//! one, by a `clone` that shares the supervisor's memory and holds the supervisor's thread
//! until the exec, with what `posix_spawn` cannot do set in between (cgroups joined, its own
//! session, the job's user and groups, death with the supervisor); and the handle that waits
//! for it, reaps it and kills it.
//!
//! A fork would copy the supervisor's page tables only for the exec to throw them away, and
//! every page the supervisor then writes would be copied once more: about a tenth of all the
//! CPU a trivial job costs (`bench/README.md`). Sharing the memory makes the child's part
//! strict: between the clone and the exec it runs on a stack of its own, makes only raw
//! system calls over what [`Spec::spawn`] prepared, allocates nothing, takes no lock and
//! changes no state of the supervisor's. Identity calls are made as the kernel's per-thread
//! ones: the C library's `setuid` would ask every thread of the supervisor to change too. Its
//! errno is the supervisor's thread's (the same thread-local storage), which waits meanwhile.

use std::ffi::{CStr, CString, OsStr, OsString, c_int, c_void};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::libc;
use rustix::process::{Gid, Pid, Uid, WaitOptions};
use tokio::io::unix::AsyncFd;

/// The child's stack, above a guard page: its code calls nothing deep, and no signal
/// handler runs there (all are blocked until the exec).
const STACK: usize = 64 * 1024;

/// How often a child whose pid file descriptor said "exited" too soon is looked at again.
const RELOOK: std::time::Duration = std::time::Duration::from_millis(20);

/// The PATH an `execvp` uses where the environment has none.
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// What runs a file the kernel cannot (a script without `#!`), as `execvp` does.
const SHELL: &CStr = c"/bin/sh";

/// A process to start: everything the child needs, prepared before it exists.
pub struct Spec {
    /// The program as given: a path when it holds a `/`, else looked up in the `PATH` of `env`.
    pub program: String,
    /// Arguments after the program (`argv[0]` is the program as given).
    pub args: Vec<String>,
    /// The whole environment (later entries of one name win).
    pub env: Vec<(OsString, OsString)>,
    /// Its working directory (the supervisor's when none).
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

/// Where the child stopped, with its `errno`, when it could not exec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Stdio = 1,
    Cwd,
    Cgroup,
    Session,
    Groups,
    Group,
    User,
    NoNewPrivs,
    DeathSignal,
    CloseFds,
    Exec,
}

impl Step {
    fn from_code(code: i32) -> Option<Step> {
        [
            Step::Stdio,
            Step::Cwd,
            Step::Cgroup,
            Step::Session,
            Step::Groups,
            Step::Group,
            Step::User,
            Step::NoNewPrivs,
            Step::DeathSignal,
            Step::CloseFds,
            Step::Exec,
        ]
        .into_iter()
        .find(|s| *s as i32 == code)
    }

    fn describe(self) -> &'static str {
        match self {
            Step::Stdio => "cannot set up its standard input and output",
            Step::Cwd => "cannot enter its working directory",
            Step::Cgroup => "cannot join the attempt's cgroup",
            Step::Session => "cannot start a session of its own",
            Step::Groups => "cannot take the user's groups",
            Step::Group => "cannot take the user's group",
            Step::User => "cannot become the user",
            Step::NoNewPrivs => "cannot give up gaining privileges",
            Step::DeathSignal => "cannot tie it to its supervisor",
            Step::CloseFds => "cannot close the descriptors it must not inherit",
            Step::Exec => "exec",
        }
    }
}

/// What the child reads, and the one thing it writes (why it could not exec).
struct Prepared {
    /// Full paths to try in order (one when the program holds a `/`).
    paths: Vec<CString>,
    argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    /// For each path, `/bin/sh PATH ARGS...`: where the kernel cannot run the file itself.
    script_ptrs: Vec<Vec<*const libc::c_char>>,
    envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
    cwd: Option<CString>,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    join: Vec<File>,
    /// The supervisor: the child's parent, unless it died before the death signal was set.
    supervisor: Pid,
    groups: Vec<Gid>,
    ids: Option<(Gid, Uid)>,
    /// Above the highest descriptor the child may hold (its hard `RLIMIT_NOFILE`): where the
    /// kernel has no `close_range`, it closes them one by one up to here.
    fd_limit: u32,
    /// `step << 16 | errno`, written by the child when it gives up; 0 while it has not.
    failed: AtomicI32,
}

fn c_string(what: &str, bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{what} holds a NUL byte: {:?}",
                String::from_utf8_lossy(bytes)
            ),
        )
    })
}

/// `execvp`'s candidates for `program`: itself when it holds a `/`, else each directory of
/// `path` (an empty one is the working directory) joined to it.
fn candidates(program: &str, path: Option<&[u8]>) -> io::Result<Vec<CString>> {
    if program.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    if program.contains('/') {
        return Ok(vec![c_string("the program", program.as_bytes())?]);
    }
    path.unwrap_or(DEFAULT_PATH)
        .split(|&b| b == b':')
        .map(|dir| {
            let mut full = if dir.is_empty() {
                b".".to_vec()
            } else {
                dir.to_vec()
            };
            while full.len() > 1 && full.ends_with(b"/") {
                full.pop();
            }
            full.push(b'/');
            full.extend_from_slice(program.as_bytes());
            c_string("PATH", &full)
        })
        .collect()
}

/// `fd` numbered above the standard streams, so that setting those up in the child cannot
/// overwrite it or leave it close-on-exec (a supervisor whose own were closed).
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 3)?)
}

fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

impl Spec {
    /// Starts the process; returns once it has exec'd, or with why it could not.
    pub fn spawn(self) -> io::Result<Child> {
        let mut env: Vec<(OsString, OsString)> = Vec::with_capacity(self.env.len());
        for (k, v) in self.env {
            match env.iter_mut().find(|(name, _)| *name == k) {
                Some(slot) => slot.1 = v,
                None => env.push((k, v)),
            }
        }
        let path = env
            .iter()
            .find(|(k, _)| k == OsStr::new("PATH"))
            .map(|(_, v)| v.as_bytes());
        let paths = candidates(&self.program, path)?;
        let argv = std::iter::once(&self.program)
            .chain(&self.args)
            .map(|a| c_string("an argument", a.as_bytes()))
            .collect::<io::Result<Vec<_>>>()?;
        let envp = env
            .iter()
            .map(|(k, v)| {
                let k = k.as_bytes();
                if k.is_empty() || k.contains(&b'=') {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "an environment variable's name is not valid: {:?}",
                            String::from_utf8_lossy(k)
                        ),
                    ));
                }
                let mut entry = k.to_vec();
                entry.push(b'=');
                entry.extend_from_slice(v.as_bytes());
                c_string("an environment variable", &entry)
            })
            .collect::<io::Result<Vec<_>>>()?;
        let cwd = self
            .cwd
            .as_ref()
            .map(|d| c_string("the working directory", d.as_os_str().as_bytes()))
            .transpose()?;
        let stdin = above_stdio(OwnedFd::from(File::open("/dev/null")?))?;
        let (groups, ids) = match self.identity {
            Some((groups, gid, uid)) => (
                groups.into_iter().map(Gid::from_raw).collect(),
                Some((Gid::from_raw(gid), Uid::from_raw(uid))),
            ),
            None => (Vec::new(), None),
        };
        let mut prepared = Box::new(Prepared {
            paths,
            argv_ptrs: Vec::new(),
            script_ptrs: Vec::new(),
            argv,
            envp_ptrs: Vec::new(),
            envp,
            cwd,
            stdin,
            stdout: above_stdio(self.stdout)?,
            stderr: above_stdio(self.stderr)?,
            join: self
                .join
                .into_iter()
                .map(|f| above_stdio(OwnedFd::from(f)).map(File::from))
                .collect::<io::Result<_>>()?,
            supervisor: rustix::process::getpid(),
            groups,
            ids,
            // The hard limit: a descriptor inherited from before a lower soft limit was set
            // may sit above the soft one.
            fd_limit: rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .maximum
                .map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            failed: AtomicI32::new(0),
        });
        prepared.argv_ptrs = pointers(&prepared.argv);
        prepared.envp_ptrs = pointers(&prepared.envp);
        prepared.script_ptrs = prepared
            .paths
            .iter()
            .map(|path| {
                [SHELL.as_ptr(), path.as_ptr()]
                    .into_iter()
                    .chain(prepared.argv.iter().skip(1).map(|a| a.as_ptr()))
                    .chain(std::iter::once(std::ptr::null()))
                    .collect()
            })
            .collect();
        let stack = Stack::new()?;
        let pid = clone_and_exec(&prepared, &stack)?;
        drop(stack);
        let failed = prepared.failed.load(Ordering::SeqCst);
        if failed != 0 {
            // It has exited (the clone returns only after its exec or its exit): reap it.
            let _ = rustix::process::waitpid(Pid::from_raw(pid), WaitOptions::empty());
            let errno = io::Error::from_raw_os_error(failed & 0xffff);
            return Err(match Step::from_code(failed >> 16) {
                Some(Step::Exec) | None => errno,
                Some(step) => io::Error::new(errno.kind(), format!("{}: {errno}", step.describe())),
            });
        }
        let pid = u32::try_from(pid).map_err(|_| io::Error::other("clone returned no pid"))?;
        let raw = Pid::from_raw(pid as i32).ok_or_else(|| io::Error::other("pid 0"))?;
        // Opened at once, while the process cannot have been reaped by anyone else (it is
        // ours and unreaped): a pid file descriptor names this process and no later one.
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

/// The child's stack: mapped for it, with a page below that faults rather than let an
/// overflow write over the supervisor's memory.
struct Stack {
    base: *mut c_void,
    len: usize,
}

impl Stack {
    #[allow(unsafe_code)]
    fn new() -> io::Result<Stack> {
        // SAFETY: sysconf reads a constant of the system.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|&p| p > 0)
            .unwrap_or(4096);
        let len = STACK + page;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the lowest page of the mapping made above.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// Its top, where a stack growing down starts: 16-byte aligned.
    fn top(&self) -> *mut c_void {
        ((self.base as usize + self.len) & !15) as *mut c_void
    }
}

impl Drop for Stack {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, used by no one after the child's exec or exit.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// Sets this thread's signal mask to `mask` (the kernel's 64 bits) with the system call
/// itself; returns the mask before.
#[allow(unsafe_code)]
fn set_mask(mask: &[u8; 8]) -> [u8; 8] {
    let mut old = [0u8; 8];
    // SAFETY: rt_sigprocmask over two 8-byte sets on this stack, the size the kernel takes.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            mask.as_ptr(),
            old.as_mut_ptr(),
            8usize,
        );
    }
    old
}

/// Blocks every signal around the clone, so that none runs one of the supervisor's handlers
/// on the child's stack; the child puts back default handlers before it lets them in.
#[allow(unsafe_code)]
fn clone_and_exec(prepared: &Prepared, stack: &Stack) -> io::Result<i32> {
    // The C library's own two signals too, which its `pthread_sigmask` leaves open.
    let old = set_mask(&[0xff; 8]);
    // SAFETY: CLONE_VM | CLONE_VFORK: the child shares this memory and this thread waits
    // until it has exec'd or exited, so `prepared` and `stack` outlive its use of them. The
    // child runs `child_main` only, whose contract is above (no allocation, no lock, raw
    // system calls). SIGCHLD tells the supervisor of its exit like any child's.
    let pid = unsafe {
        libc::clone(
            child_main,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            prepared as *const Prepared as *mut c_void,
        )
    };
    let err = io::Error::last_os_error();
    set_mask(&old);
    if pid < 0 {
        return Err(err);
    }
    Ok(pid)
}

/// The child, between the clone and the exec. Nothing in it can panic (an abort here would
/// be raised on the supervisor's thread id, through its thread-local storage).
#[allow(unsafe_code)]
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Prepared` the parent passed, alive while it waits for us.
    let p = unsafe { &*(arg as *const Prepared) };
    let (step, errno) = child_setup(p);
    p.failed
        .store(((step as i32) << 16) | (errno & 0xffff), Ordering::SeqCst);
    127
}

/// Runs the child's steps; returns only where one failed (the exec included).
#[allow(unsafe_code)]
fn child_setup(p: &Prepared) -> (Step, i32) {
    let raw = |e: rustix::io::Errno| e.raw_os_error();
    // Handlers of the supervisor must not run here: back to the defaults (what an exec would
    // do), and SIGPIPE too, which the Rust runtime ignores and a job expects to kill it.
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction on this task's own table (no CLONE_SIGHAND: a copy of the
        // supervisor's), with structures on this stack.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if old.sa_sigaction != libc::SIG_DFL
                && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
            {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
    }
    if let Err(e) = rustix::stdio::dup2_stdin(p.stdin.as_fd())
        .and_then(|()| rustix::stdio::dup2_stdout(p.stdout.as_fd()))
        .and_then(|()| rustix::stdio::dup2_stderr(p.stderr.as_fd()))
    {
        return (Step::Stdio, raw(e));
    }
    if let Some(dir) = &p.cwd
        && let Err(e) = rustix::process::chdir(dir.as_c_str())
    {
        return (Step::Cwd, raw(e));
    }
    for f in &p.join {
        if let Err(e) = rustix::io::write(f, b"0") {
            return (Step::Cgroup, raw(e));
        }
    }
    if let Err(e) = rustix::process::setsid() {
        return (Step::Session, raw(e));
    }
    // Not the agent's private umask: the job's files are made as users expect.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    if let Some((gid, uid)) = p.ids {
        if let Err(e) = rustix::thread::set_thread_groups(&p.groups) {
            return (Step::Groups, raw(e));
        }
        if let Err(e) = rustix::thread::set_thread_gid(gid) {
            return (Step::Group, raw(e));
        }
        if let Err(e) = rustix::thread::set_thread_uid(uid) {
            return (Step::User, raw(e));
        }
        // A job started as its user by a root supervisor stays that user: a set-uid program
        // in its reach (an image's `sudo`, a privileged container's binaries) cannot make it
        // root again, as `allowPrivilegeEscalation: false` would have it.
        if let Err(e) = rustix::thread::set_no_new_privs(true) {
            return (Step::NoNewPrivs, raw(e));
        }
    }
    // Last: changing user clears it.
    if let Err(e) =
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
    {
        return (Step::DeathSignal, raw(e));
    }
    // A supervisor that died before the line above sends no signal: nothing to tie to.
    if rustix::process::getppid() != Some(p.supervisor) {
        return (Step::DeathSignal, libc::ESRCH);
    }
    // Its standard streams only: whatever the supervisor holds or inherited (a descriptor
    // that whoever started the agent left open, to a file the job's user may not read) is
    // not the job's. Last, as the cgroup's files were needed above.
    if let Err(errno) = close_above_stdio(p.fd_limit) {
        return (Step::CloseFds, errno);
    }
    // The job starts with no signal blocked.
    set_mask(&[0; 8]);
    // `execvp`'s search: a file the kernel cannot run is run by the shell; a directory that
    // does not hold it is passed over, one that may not be searched or run is remembered,
    // anything else ends the search.
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOENT)
    };
    let mut last = libc::ENOENT;
    let mut denied = false;
    for (path, script) in p.paths.iter().zip(&p.script_ptrs) {
        // SAFETY: NUL-terminated strings and NULL-terminated arrays prepared by the parent.
        unsafe {
            libc::execve(path.as_ptr(), p.argv_ptrs.as_ptr(), p.envp_ptrs.as_ptr());
        }
        last = errno();
        if last == libc::ENOEXEC {
            // SAFETY: as above.
            unsafe {
                libc::execve(SHELL.as_ptr(), script.as_ptr(), p.envp_ptrs.as_ptr());
            }
            last = errno();
        }
        match last {
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            _ => return (Step::Exec, last),
        }
    }
    (Step::Exec, if denied { libc::EACCES } else { last })
}

/// Closes every descriptor above 2 in the child (whose descriptor table is its own: no
/// `CLONE_FILES`): `close_range` at once, or, on a kernel older than 5.9, one by one below
/// `limit`.
#[allow(unsafe_code)]
fn close_above_stdio(limit: u32) -> Result<(), i32> {
    // SAFETY: close_range on this process's own table, with plain integers.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if r == 0 {
        return Ok(());
    }
    let errno = io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::ENOSYS);
    // No such call (before 5.9), or a seccomp profile that answers EPERM for calls it
    // does not know: one by one instead.
    if errno != libc::ENOSYS && errno != libc::EPERM {
        return Err(errno);
    }
    // The kernel's own ceiling on descriptors (`nr_open`, 1 << 20 by default).
    for fd in 3..limit.min(1 << 20) {
        // SAFETY: closing a descriptor number of this process's own table; one not open
        // answers EBADF, which is what is wanted.
        unsafe {
            libc::close(fd as c_int);
        }
    }
    Ok(())
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
