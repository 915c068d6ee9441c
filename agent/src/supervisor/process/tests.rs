use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use super::*;

fn out_file(dir: &tempfile::TempDir) -> (std::path::PathBuf, OwnedFd, OwnedFd) {
    let path = dir.path().join("out");
    let f = std::fs::File::create(&path).expect("create output");
    let g = f.try_clone().expect("clone output");
    (path, OwnedFd::from(f), OwnedFd::from(g))
}

fn spec(
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
    dir: &tempfile::TempDir,
) -> (Spec, std::path::PathBuf) {
    let (path, stdout, stderr) = out_file(dir);
    let spec = Spec {
        program: program.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cwd: None,
        stdout,
        stderr,
        join: Vec::new(),
        identity: None,
    };
    (spec, path)
}

const PATH: (&str, &str) = ("PATH", "/nonexistent:/usr/bin:/bin");

#[tokio::test]
async fn a_program_is_found_on_its_own_path_and_gets_exactly_its_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, out) = spec(
        "env",
        &[],
        &[PATH, ("A", "1"), ("B", "two"), ("A", "3")],
        &dir,
    );
    let mut child = s.spawn().expect("spawn");
    let status = child.wait().await.expect("wait");
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(out).expect("read output");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    // Later entries of one name win; nothing of this process's environment leaks in.
    assert_eq!(
        lines,
        vec!["A=3", "B=two", "PATH=/nonexistent:/usr/bin:/bin"]
    );
}

#[tokio::test]
async fn an_exit_code_and_a_killing_signal_are_told_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = spec("sh", &["-c", "exit 7"], &[PATH], &dir);
    let mut child = s.spawn().expect("spawn");
    assert_eq!(child.wait().await.expect("wait").code(), Some(7));
    let (s, _) = spec("sh", &["-c", "kill -9 $$"], &[PATH], &dir);
    let mut child = s.spawn().expect("spawn");
    assert_eq!(child.wait().await.expect("wait").signal(), Some(9));
}

#[test]
fn a_program_that_cannot_run_is_an_error_of_the_spawn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = spec("no-such-program-here", &[], &[PATH], &dir);
    let e = s.spawn().err().expect("a missing program is an error");
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    let script = dir.path().join("not-executable");
    std::fs::write(&script, "#!/bin/sh\n").expect("write");
    let (s, _) = spec(script.to_str().expect("utf-8"), &[], &[PATH], &dir);
    let e = s
        .spawn()
        .err()
        .expect("a file that may not run is an error");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
}

#[tokio::test]
async fn the_job_starts_with_no_signal_blocked_and_sigpipe_at_its_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Read by the job's own process (a shell would clear its mask itself).
    let (s, out) = spec(
        "grep",
        &["-E", "^Sig(Blk|Ign)", "/proc/self/status"],
        &[PATH],
        &dir,
    );
    let mut child = s.spawn().expect("spawn");
    assert!(child.wait().await.expect("wait").success());
    let text = std::fs::read_to_string(out).expect("read output");
    let mask = |name: &str| {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        u64::from_str_radix(line.split_whitespace().nth(1).expect("a mask"), 16).expect("hex")
    };
    // The supervisor blocks every signal around the clone; none may stay blocked.
    assert_eq!(mask("SigBlk:"), 0, "{text}");
    // The Rust runtime ignores SIGPIPE; a job must not inherit that.
    assert_eq!(mask("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "{text}");
}

#[tokio::test]
async fn the_working_directory_is_the_one_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut s, out) = spec("pwd", &[], &[PATH], &dir);
    s.cwd = Some(dir.path().to_path_buf());
    let mut child = s.spawn().expect("spawn");
    assert!(child.wait().await.expect("wait").success());
    let text = std::fs::read_to_string(out).expect("read output");
    assert_eq!(
        std::path::Path::new(text.trim())
            .canonicalize()
            .expect("canonical"),
        dir.path().canonicalize().expect("canonical")
    );
}

#[tokio::test]
async fn a_killed_or_dropped_child_dies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = spec("sleep", &["100"], &[PATH], &dir);
    let mut child = s.spawn().expect("spawn");
    child.start_kill().expect("kill");
    assert_eq!(child.wait().await.expect("wait").signal(), Some(9));

    let (s, _) = spec("sleep", &["100"], &[PATH], &dir);
    let child = s.spawn().expect("spawn");
    let pid = child.id();
    drop(child);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        // Killed, and left for a reaper: a zombie (or gone, where something reaped it).
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit(')').next().map(|r| r.trim().chars().next()));
        if matches!(state, None | Some(Some('Z'))) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pid {pid} still runs: {state:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    crate::procscan::reap_pids([pid]);
}

/// The job runs as its user and groups, and the supervisor (all its threads) stays root.
#[tokio::test]
async fn the_job_becomes_its_user_and_the_supervisor_stays_root() {
    if !crate::runas::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    // A second thread of this process, alive across the spawn.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        let _ = rx.recv();
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut s, out) = spec("id", &[], &[PATH], &dir);
    s.identity = Some((vec![65534, 4242], 65534, 65534));
    let mut child = s.spawn().expect("spawn");
    assert!(child.wait().await.expect("wait").success());
    let text = std::fs::read_to_string(out).expect("read output");
    assert!(text.starts_with("uid=65534"), "{text}");
    assert!(text.contains("gid=65534"), "{text}");
    assert!(text.contains("4242"), "supplementary group missing: {text}");
    for task in std::fs::read_dir("/proc/self/task").expect("tasks") {
        let status =
            std::fs::read_to_string(task.expect("task").path().join("status")).expect("status");
        let uid = status.lines().find(|l| l.starts_with("Uid:")).expect("Uid");
        assert!(
            uid.split_whitespace().skip(1).all(|u| u == "0"),
            "a thread of the supervisor changed user: {uid}"
        );
    }
    let _ = tx.send(());
    let _ = other.join();
}
