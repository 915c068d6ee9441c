//! Processes a test holds: a background binary of this workspace (`Proc`), a child killed
//! when dropped (`KillOnDrop`) and a bystander of another owner.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};

use crate::binary;

/// `kill -9` a child we hold, if any, and reap it.
pub(crate) fn kill_and_reap(child: &mut Option<Child>) -> Result<()> {
    if let Some(mut c) = child.take() {
        c.kill()?;
        c.wait()?;
    }
    Ok(())
}

/// A background process of this workspace (a coordinator or an agent on its own), its
/// stderr in a log file, killed when dropped.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    pub fn start(name: &str, args: &[String], log: PathBuf) -> Result<Self> {
        Self::start_with_env(name, args, &[], log)
    }

    /// `start` with extra environment variables (`HEADROOM_*` settings).
    pub fn start_with_env(
        name: &str,
        args: &[String],
        env: &[(&str, &str)],
        log: PathBuf,
    ) -> Result<Self> {
        Self::start_program(&binary(name), args, env, log)
    }

    /// [`Proc::start_with_env`] of the program at `program` (a copy of a binary elsewhere).
    pub fn start_program(
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: PathBuf,
    ) -> Result<Self> {
        let name = program.display();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Self {
            child: Some(child),
            log,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn kill9(&mut self) -> Result<()> {
        kill_and_reap(&mut self.child)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        let pid = self.pid().ok_or_else(|| anyhow!("not running"))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)?;
        Ok(())
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` and waits up to `timeout` for the exit, failing with the output if it
    /// is still running.
    pub fn stop_with(
        &mut self,
        sig: nix::sys::signal::Signal,
        timeout: Duration,
    ) -> std::process::ExitStatus {
        if let Err(e) = self.signal(sig) {
            panic!("sending {sig}: {e:#}\n{}", self.output());
        }
        match self.wait_exit(timeout) {
            Ok(Some(status)) => status,
            Ok(None) => panic!(
                "{sig} did not stop it within {timeout:?}:\n{}",
                self.output()
            ),
            Err(e) => panic!("waiting for the exit: {e:#}\n{}", self.output()),
        }
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<std::process::ExitStatus>> {
        let c = self.child.as_mut().ok_or_else(|| anyhow!("not running"))?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = c.try_wait()? {
                self.child = None;
                return Ok(Some(st));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A process of another owner (a `sleep`), alive until dropped: something a job can leave
/// memory booked for, which cleanup cannot kill and so cannot verify gone.
pub fn bystander() -> KillOnDrop {
    KillOnDrop(Command::new("sleep").arg("600").spawn().expect("sleep"))
}

/// A child process killed when the test lets go of it, passing or failing.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
