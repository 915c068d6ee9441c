//! How an attempt's process is made: cloned straight into its attempt's cgroup where the
//! kernel can (`clone3` with `CLONE_INTO_CGROUP`, Linux 5.7), else forked (it then joins by a
//! write, [`super::ChildSetup`]); and its exec, the child's last act.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::libc;
use rustix::process::Pid;

use super::invalid;

/// The kernel's `struct clone_args` (`linux/sched.h`), to `cgroup` (its second version).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `linux/sched.h`; not in the C library's headers.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Set once `clone3` was refused as unknown (a kernel before 5.7, a seccomp profile that
/// answers for calls it does not know): every later child is forked.
static FORK_ONLY: AtomicBool = AtomicBool::new(false);

/// Which side of the fork this is.
pub(super) enum Forked {
    /// The child; `in_cgroup`: it was born in the cgroup asked for.
    Child { in_cgroup: bool },
    /// The parent, with the child's pid and whether it was born in the cgroup asked for.
    Parent { pid: Pid, in_cgroup: bool },
}

/// Why no child was made.
#[derive(Debug)]
pub(super) enum ForkError {
    /// The kernel would not place it in the cgroup (gone, or one a process may not join).
    IntoCgroup(io::Error),
    /// No process could be made (out of processes or memory).
    Fork(io::Error),
}

/// Makes the child, in `cgroup` (a v2 directory) where the kernel can.
///
/// As with `fork(2)` in a threaded process, the child has only this thread: until it execs
/// or exits it may make system calls over memory prepared before (no allocation, no lock).
/// Unlike the C library's fork, `clone3` does not reset the allocator's locks in the child,
/// so nothing there may allocate: `execvp` does not (glibc 2.24 and later; earlier ones run
/// on kernels without `clone3` and are forked).
#[allow(unsafe_code)]
pub(super) fn fork(cgroup: Option<BorrowedFd<'_>>) -> Result<Forked, ForkError> {
    if !forks_only() {
        let mut args = CloneArgs {
            exit_signal: libc::SIGCHLD as u64,
            ..CloneArgs::default()
        };
        if let Some(dir) = cgroup {
            args.flags |= CLONE_INTO_CGROUP;
            args.cgroup = dir.as_raw_fd() as u64;
        }
        // SAFETY: no stack is given, so the child goes on with a copy of this one as after
        // fork(2); the caller's child side keeps to system calls until it execs or exits.
        let r = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &raw mut args,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        let in_cgroup = cgroup.is_some();
        if r == 0 {
            return Ok(Forked::Child { in_cgroup });
        }
        if r > 0 {
            let pid = Pid::from_raw(r as i32)
                .ok_or_else(|| ForkError::Fork(io::Error::other("pid 0")))?;
            return Ok(Forked::Parent { pid, in_cgroup });
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // Not known here: the call (ENOSYS, or EPERM from a seccomp profile), its size or
            // its flags (E2BIG, EINVAL: before 5.7).
            Some(libc::ENOSYS | libc::EPERM | libc::E2BIG | libc::EINVAL) => {
                if !FORK_ONLY.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "clone3 into a cgroup refused ({e}): jobs are forked and moved into \
                         their attempt's cgroup, a move that waits for an RCU grace period on \
                         a host whose cgroup v2 mount lacks favordynmods (`headroom doctor`)"
                    );
                }
            }
            Some(libc::EAGAIN | libc::ENOMEM) | None => return Err(ForkError::Fork(e)),
            Some(_) if in_cgroup => return Err(ForkError::IntoCgroup(e)),
            Some(_) => return Err(ForkError::Fork(e)),
        }
    }
    // SAFETY: as above; the C library's fork runs its own handlers around it.
    match unsafe { libc::fork() } {
        0 => Ok(Forked::Child { in_cgroup: false }),
        r if r > 0 => Ok(Forked::Parent {
            pid: Pid::from_raw(r).ok_or_else(|| ForkError::Fork(io::Error::other("pid 0")))?,
            in_cgroup: false,
        }),
        _ => Err(ForkError::Fork(io::Error::last_os_error())),
    }
}

// The C library's environment, which `execvp` searches the `PATH` of.
#[allow(unsafe_code)]
unsafe extern "C" {
    static mut environ: *const *const libc::c_char;
}

/// A program with its arguments and whole environment, as `execvp` takes them: made before
/// the fork, since the child may not allocate.
pub(super) struct Program {
    program: CString,
    /// Owned by the pointers below.
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

impl Program {
    /// `env`: later entries of one name win.
    pub(super) fn new(
        program: &str,
        args: &[String],
        env: &[(OsString, OsString)],
    ) -> io::Result<Program> {
        let c = |what: &str, bytes: &[u8]| {
            CString::new(bytes).map_err(|_| {
                invalid(format!(
                    "{what} holds a NUL byte: {:?}",
                    String::from_utf8_lossy(bytes)
                ))
            })
        };
        let mut vars: std::collections::BTreeMap<&[u8], &[u8]> = std::collections::BTreeMap::new();
        for (k, v) in env {
            let k = k.as_bytes();
            if k.is_empty() || k.contains(&b'=') {
                return Err(invalid(format!(
                    "an environment variable's name is not valid: {:?}",
                    String::from_utf8_lossy(k)
                )));
            }
            vars.insert(k, v.as_bytes());
        }
        let program = c("the program", program.as_bytes())?;
        let mut argv_strings = vec![program.clone()];
        for a in args {
            argv_strings.push(c("an argument", a.as_bytes())?);
        }
        let mut env_strings = Vec::with_capacity(vars.len());
        for (k, v) in vars {
            env_strings.push(c("an environment variable", &[k, b"=", v].concat())?);
        }
        let pointers = |strings: &[CString]| {
            strings
                .iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        let (argv, envp) = (pointers(&argv_strings), pointers(&env_strings));
        argv_strings.extend(env_strings);
        Ok(Program {
            program,
            _strings: argv_strings,
            argv,
            envp,
        })
    }

    /// Runs in the child: the exec, over the job's own environment (its `PATH` searched, a
    /// script without `#!` run by `sh`, as the standard library's spawn does). Returns only
    /// if it failed, with the error number.
    #[allow(unsafe_code)]
    pub(super) fn exec(&self) -> i32 {
        // SAFETY: the child is one thread; every pointer is into strings `self` owns, and
        // both arrays end with a null pointer.
        unsafe {
            environ = self.envp.as_ptr();
            libc::execvp(self.program.as_ptr(), self.argv.as_ptr());
        }
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOEXEC)
    }
}

#[cfg(test)]
thread_local! {
    static TEST_FORK_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes every later child of this thread forked, as where `clone3` is refused (a thread's,
/// so that tests run side by side in one process keep their own).
#[cfg(test)]
pub(super) fn fork_only() {
    TEST_FORK_ONLY.with(|f| f.set(true));
}

fn forks_only() -> bool {
    #[cfg(test)]
    if TEST_FORK_ONLY.with(|f| f.get()) {
        return true;
    }
    FORK_ONLY.load(Ordering::Relaxed)
}
