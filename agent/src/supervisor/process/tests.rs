use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use super::*;

const PATH: &str = "/nonexistent:/usr/bin:/bin";

fn spec(program: &str, args: &[&str], env: &[(&str, &str)], dir: &Path) -> (Spec, PathBuf) {
    let path = dir.join("out");
    let f = File::create(&path).expect("create output");
    let g = f.try_clone().expect("clone output");
    let spec = Spec {
        program: program.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: env
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect(),
        cwd: None,
        stdout: OwnedFd::from(f),
        stderr: OwnedFd::from(g),
        join: None,
        identity: None,
    };
    (spec, path)
}

/// Whether this test runs as root, which its case needs; under CI it must (the case would
/// otherwise pass without running).
fn root() -> bool {
    if crate::runas::is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true, but not root: this case would pass without running"
    );
    eprintln!("skipped: needs root");
    false
}

/// Spawned as the supervisor spawns: recorded, so that no reaper of this test process
/// (other tests reap orphans) takes its exit status.
fn start(s: Spec) -> io::Result<Child> {
    crate::procscan::spawn_owned(|| s.spawn().map_err(Into::into), |c| Some(c.id()))
}

async fn run(s: Spec) -> ExitStatus {
    let mut child = start(s).expect("spawn");
    let status = child.wait().await.expect("wait");
    crate::procscan::disown(child.id());
    status
}

fn executable(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[tokio::test]
async fn a_program_is_found_on_its_own_path_and_gets_exactly_its_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    // Only on the job's PATH, not on this process's nor on the default one.
    executable(&bin.join("hr-test-env"), "#!/bin/sh\nexec env\n", 0o755);
    let path = format!("/nonexistent:{}:/usr/bin:/bin", bin.display());
    let (s, out) = spec(
        "hr-test-env",
        &[],
        &[("PATH", &path), ("A", "1"), ("B", "two"), ("A", "3")],
        dir.path(),
    );
    assert!(run(s).await.success());
    let text = std::fs::read_to_string(out).expect("read output");
    let mut lines: Vec<&str> = text.lines().filter(|l| !l.starts_with("PWD=")).collect();
    lines.sort_unstable();
    // Later entries of one name win; nothing of this process's environment leaks in.
    assert_eq!(lines, vec!["A=3", "B=two", format!("PATH={path}").as_str()]);
}

#[tokio::test]
async fn the_path_search_passes_over_a_file_that_may_not_run_and_runs_a_script_without_shebang() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    std::fs::create_dir(&first).expect("first");
    std::fs::create_dir(&second).expect("second");
    // Not executable in the first directory: remembered, and the search goes on.
    executable(
        &first.join("hr-test-prog"),
        "#!/bin/sh\necho first\n",
        0o644,
    );
    // No `#!` line: the shell runs it, with its arguments.
    executable(&second.join("hr-test-prog"), "echo second \"$1\"\n", 0o755);
    let path = format!("{}:{}", first.display(), second.display());
    let (s, out) = spec("hr-test-prog", &["arg"], &[("PATH", &path)], dir.path());
    assert!(run(s).await.success());
    assert_eq!(std::fs::read_to_string(out).expect("read"), "second arg\n");

    // Only the one that may not run: that is the error, not "not found".
    let (s, _) = spec(
        "hr-test-prog",
        &[],
        &[("PATH", &first.display().to_string())],
        dir.path(),
    );
    let e = start(s).err().expect("a file that may not run is an error");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
}

#[tokio::test]
async fn an_exit_code_and_a_killing_signal_are_told_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = spec("sh", &["-c", "exit 7"], &[("PATH", PATH)], dir.path());
    assert_eq!(run(s).await.code(), Some(7));
    let (s, _) = spec("sh", &["-c", "kill -9 $$"], &[("PATH", PATH)], dir.path());
    assert_eq!(run(s).await.signal(), Some(9));
}

#[test]
fn a_program_that_cannot_start_is_an_error_of_the_spawn_naming_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = spec("no-such-program-here", &[], &[("PATH", PATH)], dir.path());
    let e = start(s).err().expect("a missing program is an error");
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    let (mut s, _) = spec("true", &[], &[("PATH", PATH)], dir.path());
    s.cwd = Some(dir.path().join("gone"));
    let e = start(s)
        .err()
        .expect("a missing working directory is an error");
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    assert!(
        e.to_string()
            .starts_with("cannot enter its working directory"),
        "{e}"
    );
}

#[tokio::test]
async fn the_job_starts_with_no_signal_blocked_and_sigpipe_at_its_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Read by the job's own process (a shell would clear its mask itself).
    let (s, out) = spec(
        "grep",
        &["-E", "^Sig(Blk|Ign)", "/proc/self/status"],
        &[("PATH", PATH)],
        dir.path(),
    );
    assert!(run(s).await.success());
    let text = std::fs::read_to_string(out).expect("read output");
    let mask = |name: &str| {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        u64::from_str_radix(line.split_whitespace().nth(1).expect("a mask"), 16).expect("hex")
    };
    // Whatever the supervisor's thread has blocked, the job starts with nothing blocked.
    assert_eq!(mask("SigBlk:"), 0, "{text}");
    // The Rust runtime ignores SIGPIPE; a job must not inherit that.
    assert_eq!(mask("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "{text}");
}

/// Its own session and process group, which the supervisor signals as a whole.
#[tokio::test]
async fn the_job_leads_a_session_of_its_own_in_the_working_directory_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut s, out) = spec(
        "sh",
        &["-c", "echo $$; cut -d' ' -f5,6 /proc/$$/stat; pwd"],
        &[("PATH", PATH)],
        dir.path(),
    );
    s.cwd = Some(dir.path().to_path_buf());
    assert!(run(s).await.success());
    let text = std::fs::read_to_string(out).expect("read output");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let pid = lines[0];
    assert_eq!(
        lines[1],
        format!("{pid} {pid}"),
        "process group and session: {text}"
    );
    assert_eq!(
        Path::new(lines[2]).canonicalize().expect("canonical"),
        dir.path().canonicalize().expect("canonical")
    );
}

#[tokio::test]
async fn a_wait_given_up_keeps_its_pid_descriptor_and_sees_the_exit_later() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = spec("sleep", &["0.3"], &[("PATH", PATH)], dir.path());
    let mut child = start(s).expect("spawn");
    let mut given_up = 0;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.expect("wait"),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                given_up += 1;
                assert!(child.by_pidfd(), "the pid descriptor was lost after {given_up} waits");
            }
        }
    };
    crate::procscan::disown(child.id());
    assert!(status.success());
    assert!(given_up >= 5, "{given_up}");
}

#[tokio::test]
async fn a_killed_or_dropped_child_dies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = spec("sleep", &["100"], &[("PATH", PATH)], dir.path());
    let mut child = start(s).expect("spawn");
    child.start_kill().expect("kill");
    assert_eq!(child.wait().await.expect("wait").signal(), Some(9));
    crate::procscan::disown(child.id());

    let (s, _) = spec("sleep", &["100"], &[("PATH", PATH)], dir.path());
    let child = start(s).expect("spawn");
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
    if !root() {
        return;
    }
    // A second thread of this process, alive across the spawn.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        let _ = rx.recv();
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut s, out) = spec("id", &[], &[("PATH", PATH)], dir.path());
    s.identity = Some((vec![65534, 4242], 65534, 65534));
    assert!(run(s).await.success());
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

/// A job holds its standard streams only: a descriptor the supervisor inherited without
/// close-on-exec (from whoever started the agent, to a file the job's user may not read) is
/// closed before the exec.
#[tokio::test]
async fn a_job_inherits_no_descriptor_but_its_standard_streams() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("root-only");
    std::fs::write(&secret, "the-secret-content\n").expect("secret");
    let held = File::open(&secret).expect("open");
    nix::fcntl::fcntl(
        &held,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .expect("clear close-on-exec");
    let fd = held.as_raw_fd();
    let script = format!("cat <&{fd}; echo status=$?; ls /proc/$$/fd");
    let (s, out) = spec("sh", &["-c", &script], &[("PATH", PATH)], dir.path());
    run(s).await;
    let text = std::fs::read_to_string(out).expect("output");
    assert!(!text.contains("the-secret-content"), "{text}");
    assert!(
        text.contains("status=") && !text.contains("status=0"),
        "{text}"
    );
    let fds: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("status="))
        .skip(1)
        .collect();
    assert_eq!(fds, ["0", "1", "2"], "{text}");
    drop(held);
}

/// A job a root supervisor starts as its user cannot become root again through a set-uid
/// program (`no_new_privs`): a set-uid-root copy of `id` still says the job's user.
#[tokio::test]
async fn a_job_started_as_its_user_gains_no_privilege_through_a_setuid_program() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let id = dir.path().join("setuid-id");
    std::fs::copy("/usr/bin/id", &id).expect("copy id");
    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).expect("setuid");
    let program = id.display().to_string();
    let (mut s, out) = spec(&program, &["-u"], &[("PATH", PATH)], dir.path());
    s.identity = Some((vec![65534], 65534, 65534));
    assert!(run(s).await.success());
    let text = std::fs::read_to_string(out).expect("read output");
    assert_eq!(
        text.trim(),
        "65534",
        "the set-uid program made the job root"
    );
}

/// The working directory is entered as the job's user, after the change of user: one only
/// root may enter is refused, naming the step (a root-squashed NFS home is the converse:
/// the user may enter it, root may not), and one the user may enter is its directory.
#[tokio::test]
async fn the_working_directory_is_entered_as_the_job_s_user() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let closed = dir.path().join("root-only");
    std::fs::create_dir(&closed).expect("mkdir");
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let (mut s, _) = spec("true", &[], &[("PATH", PATH)], dir.path());
    s.cwd = Some(closed.clone());
    s.identity = Some((vec![65534], 65534, 65534));
    let e = s
        .spawn()
        .err()
        .expect("nobody may not enter a root-only directory");
    assert_eq!(e.step, Some(Step::Cwd), "{e}");
    assert_eq!(e.source.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(
        e.to_string()
            .starts_with("cannot enter its working directory"),
        "{e}"
    );
    // Root itself may: the same directory without the change of user.
    let (mut s, out) = spec("pwd", &[], &[("PATH", PATH)], dir.path());
    s.cwd = Some(closed.clone());
    assert!(run(s).await.success());
    let text = std::fs::read_to_string(out).expect("read output");
    assert_eq!(text.trim(), closed.display().to_string());
}

/// An attempt's cgroups for a test (root): removed, with the agent's directory, at its end.
fn attempt_cgroup() -> Option<(crate::cgroup::Tidy, crate::cgroup::AttemptCgroup, String)> {
    if !root() {
        return None;
    }
    let scope = format!("process-test-{}", headroom_shared::AttemptId::new());
    let cgroups = crate::cgroup::Cgroups::setup(&scope).expect("cgroups as root");
    let attempt = headroom_shared::AttemptId::new();
    let cg = cgroups.attempt(attempt);
    cg.create().expect("create the attempt's cgroup");
    let v2 = format!("0::{}/{attempt}", cgroups.relative);
    Some((crate::cgroup::Tidy(Some(cgroups)), cg, v2))
}

/// Whether this process may clone into a cgroup: Linux 5.7, and no seccomp filter (a
/// container's profile may refuse `clone3`).
fn clones_into_cgroups() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    crate::cgroup::kernel_at_least(release.trim(), (5, 7))
        && status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .is_none_or(|mode| mode.trim() == "0")
}

/// The job's own first read of its cgroups, from its spawn with the attempt's join.
async fn cgroups_seen(cg: &crate::cgroup::AttemptCgroup) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut s, out) = spec("cat", &["/proc/self/cgroup"], &[("PATH", PATH)], dir.path());
    s.join = Some(cg.join().expect("open the cgroup's files"));
    let mut child = start(s).expect("spawn");
    let born = child.born_in_cgroup();
    assert!(child.wait().await.expect("wait").success());
    crate::procscan::disown(child.id());
    (born, std::fs::read_to_string(out).expect("read output"))
}

/// A job's process is born in its attempt's cgroup (no move, which on a host without
/// `favordynmods` waits for an RCU grace period at every start), and in its v1 memory cgroup
/// where memory is still v1.
#[tokio::test]
async fn a_job_is_born_in_its_attempt_s_cgroups() {
    let Some((_tidy, cg, v2)) = attempt_cgroup() else {
        return;
    };
    let (born, text) = cgroups_seen(&cg).await;
    assert!(text.lines().any(|l| l == v2), "{v2} not in {text}");
    if let Some(name) = cg.dir().file_name().and_then(|n| n.to_str()) {
        assert!(
            text.lines()
                .filter(|l| l.contains(":memory:"))
                .all(|l| l.ends_with(name)),
            "the v1 memory cgroup is not the attempt's: {text}"
        );
    }
    assert_eq!(born, clones_into_cgroups(), "{text}");
}

/// Where the kernel refuses to clone into a cgroup, the child moves itself in before its
/// exec: the job still starts nowhere else.
#[tokio::test]
async fn a_job_that_cannot_be_born_in_its_cgroup_is_moved_in_before_its_exec() {
    let Some((_tidy, cg, v2)) = attempt_cgroup() else {
        return;
    };
    fork::fork_only();
    let (born, text) = cgroups_seen(&cg).await;
    assert!(!born);
    assert!(text.lines().any(|l| l == v2), "{v2} not in {text}");
}

/// A cgroup gone before the start (removed under the agent) fails the spawn, cloned or
/// forked: the job never runs outside it.
#[test]
fn a_job_whose_cgroup_is_gone_does_not_start() {
    let Some((_tidy, cg, _)) = attempt_cgroup() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    for fork_only in [false, true] {
        let join = cg.join().expect("open the cgroup's files");
        cg.remove().expect("remove the cgroup");
        if fork_only {
            fork::fork_only();
        }
        let (mut s, _) = spec("true", &[], &[("PATH", PATH)], dir.path());
        s.join = Some(join);
        let e = s.spawn().err().expect("no start outside the cgroup");
        assert_eq!(e.step, Some(Step::Cgroup), "{e}");
        cg.create().expect("create it again");
    }
}
