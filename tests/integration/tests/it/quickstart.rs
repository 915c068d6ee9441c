//! The README's first command, as a new user runs it: `headroom up ... --run
//! examples/quickstart.yaml` (debug binaries here) runs the sample experiment to the end and
//! exits 0, whatever GPUs the machine has.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use headroom_integration_tests::binary;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The arguments after `headroom up` in the README's first command block.
fn readme_up_args() -> Vec<String> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let block = readme
        .split("```")
        .nth(1)
        .expect("a command block in the README");
    let line = block
        .lines()
        .find(|l| l.contains("headroom up"))
        .expect("`headroom up` in the README's first command block");
    let args: Vec<String> = line
        .split("headroom up")
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--run" && w[1] == "examples/quickstart.yaml"),
        "the README's first command runs the quickstart: {line}"
    );
    args
}

#[test]
fn the_readmes_first_command_runs_the_quickstart_to_the_end() {
    run_readme_command(None);
}

/// The same on a machine with one GPU (where there is no driver, the fake GPUs `up` uses by
/// default are set through the environment, as a user's machine would differ).
#[test]
fn the_readmes_first_command_runs_on_a_one_gpu_machine() {
    run_readme_command(Some("1x24GiB"));
}

/// `headroom up` run at the root of a project's git checkout (its data directory the default
/// `./.headroom`) leaves nothing of its own for `git add -A` to commit: not its store, not
/// its admin token.
#[test]
fn up_in_a_git_checkout_leaves_nothing_to_commit() {
    let project = tempfile::tempdir().expect("tempdir");
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(project.path())
            .output()
    };
    if git(&["init", "-q"]).is_err() {
        headroom_integration_tests::premise_missing("git");
        return;
    }
    std::fs::write(
        project.path().join("study.yaml"),
        "name: study\ncommand: [\"true\"]\nresources: {memory: 1GiB}\n",
    )
    .expect("spec");
    let status = Command::new(binary("headroom"))
        .args(["up", "--run", "study.yaml", "--listen", "127.0.0.1:0"])
        .current_dir(project.path())
        .env("HEADROOM_FAKE_GPUS", "1x24GiB")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("headroom up");
    assert!(status.success(), "{status}");
    assert!(project.path().join(".headroom/admin-token").is_file());
    let out = git(&["status", "--porcelain", "--untracked-files=all"]).expect("git status");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "?? study.yaml\n");
}

fn run_readme_command(fake_gpus: Option<&str>) {
    let args = readme_up_args();
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = headroom_integration_tests::path_with_binaries();
    let out = std::fs::File::create(tmp.path().join("up.log")).expect("log");
    let mut child = Command::new(binary("headroom"))
        .arg("up")
        .args(&args)
        // Only what a test needs besides: its own data dir, and any free port.
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .args(["--listen", "127.0.0.1:0"])
        .current_dir(repo_root())
        .env("PATH", path)
        .envs(fake_gpus.map(|g| ("HEADROOM_FAKE_GPUS", g)))
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("headroom up");
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the quickstart did not finish in 180 s:\n{}",
                std::fs::read_to_string(tmp.path().join("up.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(tmp.path().join("up.log")).unwrap_or_default();
    assert!(
        status.success(),
        "headroom up {args:?} exited {status}:\n{log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "colour codes written to a file:\n{log}"
    );
}
