//! The exec launcher: jobs start as a re-execution of the agent's own binary that moves into a
//! session of its own, arms `PR_SET_PDEATHSIG`, and `exec`s the job. The agent can then spawn
//! with `posix_spawn` instead of `fork`ing its whole multi-threaded address space per job.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;

use nix::sys::signal::Signal;

/// First argument that turns a headroom binary into the launcher.
pub const LAUNCH_ARG: &str = "__headroom-launch";
/// Written to the job's log when the launcher cannot become the job.
pub const LAUNCH_FAILED: &str = "[headroom] cannot execute";
/// Exit code of a launch that failed (as shells report a command that cannot run).
pub const LAUNCH_FAILED_CODE: i32 = 127;
/// The running binary, whatever happened to its file since it started.
pub const SELF_EXE: &str = "/proc/self/exe";

/// Call first thing in `main` of every binary that runs jobs: when started as the launcher,
/// this process becomes the job (or exits with [`LAUNCH_FAILED_CODE`]) and never returns.
pub fn run_if_launcher() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(LAUNCH_ARG)) {
        return;
    }
    let parent: Option<i32> = args.next().and_then(|p| p.to_str()?.parse().ok());
    let argv: Vec<OsString> = args.collect();
    std::process::exit(launch(parent, &argv));
}

/// The launcher's command line for `argv`, run on behalf of this process.
pub fn launcher_args(argv: &[String]) -> Vec<String> {
    let mut args = vec![LAUNCH_ARG.to_string(), std::process::id().to_string()];
    args.extend(argv.iter().cloned());
    args
}

fn launch(parent: Option<i32>, argv: &[OsString]) -> i32 {
    let fail = |what: String| {
        eprintln!("{LAUNCH_FAILED} {what}");
        LAUNCH_FAILED_CODE
    };
    if let Err(e) = nix::unistd::setsid() {
        return fail(format!("(setsid: {e})"));
    }
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        return fail(format!("(prctl PR_SET_PDEATHSIG: {e})"));
    }
    // The agent may have died before the death signal was armed: then nobody supervises us.
    if Some(nix::unistd::getppid().as_raw()) != parent {
        return fail("(the agent is gone)".to_string());
    }
    let Some((program, args)) = argv.split_first() else {
        return fail("(empty command)".to_string());
    };
    let err = std::process::Command::new(program).args(args).exec();
    fail(format!("`{}`: {err}", program.to_string_lossy()))
}
