//! The binaries of this workspace a test runs (found next to the test's executable), and the
//! commands tests give fake jobs.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A binary of this workspace, built next to the executable running this code (a test in
/// `target/<profile>/deps/`, or a bench in `target/<profile>/`).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join(name))
        .collect();
    match candidates.iter().find(|p| p.exists()) {
        Some(p) => p.clone(),
        None => panic!(
            "{name} is missing next to {}: build the binaries first (`cargo build --workspace --bins`, done by scripts/test)",
            exe.display()
        ),
    }
}

/// Runs a binary of this workspace to its end with stdin closed: its exit status and stderr.
pub fn run_binary(name: &str, args: &[&str]) -> (std::process::ExitStatus, String) {
    let out = Command::new(binary(name))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"));
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `PATH` with this workspace's binaries first, as after an install: a spec names
/// `headroom-fake-job` by name.
pub fn path_with_binaries() -> std::ffi::OsString {
    let bin_dir = binary("headroom")
        .parent()
        .expect("binary dir")
        .to_path_buf();
    std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH")
}

pub fn fake_job() -> PathBuf {
    binary("headroom-fake-job")
}

/// A spec (YAML) of one `headroom-fake-job` run on one GPU: `args` as YAML flow items
/// (`--mem, 2GiB`), declaring `memory`, with `retry` (a YAML flow mapping).
pub fn fake_job_spec(name: &str, args: &str, memory: &str, retry: &str) -> String {
    format!(
        "name: {name}\ncommand: [{job}, {args}]\nresources: {{gpus: 1, memory: {memory}}}\n\
         retry: {retry}\n",
        job = fake_job().display()
    )
}

/// The command of a job that books 3 GiB on its GPU 0 for process `pid` as it exits (a
/// leftover in the fake GPU folder the agent gives its jobs).
pub fn books_for(pid: u32) -> serde_json::Value {
    serde_json::json!([
        "sh",
        "-c",
        format!("echo 0:3072 > \"$HEADROOM_FAKE_GPU_DIR/{pid}\"")
    ])
}

/// `headroom --server URL ARGS` as the holder of `token` (and of no token file), no stdin.
pub fn headroom_as(url: &str, token: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(binary("headroom"))
        .args(["--server", url])
        .env_remove("HEADROOM_TOKEN_FILE")
        .env("HEADROOM_TOKEN", token)
        .stdin(std::process::Stdio::null())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("headroom {args:?}: {e}"))
}

/// [`headroom_as`] that must succeed: its standard output.
pub fn headroom_ok(url: &str, token: &str, args: &[&str]) -> String {
    let out = headroom_as(url, token, args);
    assert!(
        out.status.success(),
        "headroom {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
