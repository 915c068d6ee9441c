//! The binaries as operators run them: signals stop them cleanly, a config file works for
//! each of them, a client's mistake is a 4xx naming the field, `headroom` and
//! `headroom-node` of different builds refuse to run together, and `up --run` submits as the
//! coordinator it starts.

use std::time::{Duration, Instant};

use headroom_integration_tests::standalone::{
    Agent, AgentOptions, Coordinator, nodes_of, wait_healthy, wait_registered,
};
use headroom_integration_tests::{
    Headroom, Proc, UpOptions, binary, free_port, http_get, run_binary,
};
use nix::sys::signal::Signal;

/// Kubernetes and systemd stop a service with SIGTERM: the coordinator stops accepting,
/// answers the long-polls it holds, and exits 0 at once (not after the long-poll timeout).
#[test]
fn coordinator_drains_and_exits_zero_on_sigterm_and_sigint() {
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut coord = Coordinator::start(dir.path(), &[]).expect("coordinator");
        let url = coord.url.clone();
        let p: serde_json::Value = http_get(&format!("{url}/v1/progress")).expect("progress");
        let version = p["version"].as_u64().expect("version");
        // A long-poll that would wait 20 s for a change that never comes.
        let poll_url = format!("{url}/v1/progress?after={version}&timeout_ms=20000");
        let poll = std::thread::spawn(move || {
            let t = Instant::now();
            (http_get::<serde_json::Value>(&poll_url), t.elapsed())
        });
        // Give the request time to reach the server: the point is one held open.
        std::thread::sleep(Duration::from_millis(500));
        let sent = Instant::now();
        let status = coord.stop_with(sig, Duration::from_secs(10));
        assert_eq!(
            status.code(),
            Some(0),
            "{sig}: coordinator exit {status}:\n{}",
            coord.output()
        );
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "{sig}: draining took {:?}",
            sent.elapsed()
        );
        let (answer, took) = poll.join().expect("poll thread");
        let answer = answer.unwrap_or_else(|e| panic!("{sig}: the long-poll was dropped: {e:#}"));
        assert!(answer["counts"].is_object(), "{answer}");
        assert!(
            took < Duration::from_secs(10),
            "{sig}: long-poll held {took:?}"
        );
    }
}

/// `headroom up` and `headroom-agent` stop on SIGTERM as on SIGINT, with exit 0.
#[test]
fn up_and_agent_exit_zero_on_sigterm() {
    let mut h = Headroom::up(UpOptions::default());
    let status = h.stop().expect("stop");
    assert_eq!(status.code(), Some(0), "{}", h.server_log());

    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &[]).expect("coordinator");
    let mut agent =
        Agent::start(&coord.url, dir.path(), AgentOptions::node("sig-node")).expect("agent");
    agent.wait_registered(&coord.url);
    let status = agent.stop_with(Signal::SIGTERM, Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", agent.output());
}

/// `headroom up` becomes `headroom-node` in the same process: whatever started it (a shell,
/// systemd, a test) holds the server's pid and stops it with a signal, and the supervisors
/// of its jobs are `headroom-node`'s. The client's commands need only `headroom`; without
/// `headroom-node` beside it, `up` and `doctor` say what is missing and where.
#[test]
fn up_runs_as_headroom_node_and_the_client_runs_alone() {
    let mut h = Headroom::up(UpOptions::default());
    let pid = h.pid().expect("pid");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    assert_eq!(
        exe.file_name().and_then(|n| n.to_str()),
        Some("headroom-node"),
        "{}",
        exe.display()
    );
    // The client reaches the server it started (`cli_ok` fails on any error).
    h.cli_ok(&["experiments"]);
    let status = h.stop().expect("stop");
    assert_eq!(status.code(), Some(0), "{}", h.server_log());

    let dir = tempfile::tempdir().expect("tempdir");
    let alone = dir.path().join("headroom");
    install(&headroom_integration_tests::binary("headroom"), &alone);
    let out = std::process::Command::new(&alone)
        .args(["completions", "bash"])
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("headroom__subcmd__up") && text.contains("headroom__subcmd__submit"),
        "{text}"
    );
    for command in ["up", "doctor"] {
        let out = std::process::Command::new(&alone)
            .arg(command)
            .env("HEADROOM_DATA_DIR", dir.path().join("data"))
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}: {err}");
        let missing = dir.path().join("headroom-node");
        assert!(
            err.contains(&format!(
                "`headroom {command}` runs {}, which is missing",
                missing.display()
            )),
            "{command}: {err}"
        );
    }
}

/// `headroom` names its version to the `headroom-node` it starts, and a `headroom-node` of
/// another release (an upgrade that replaced one of the two) refuses to run, naming both,
/// before it reads or creates anything.
#[test]
fn headroom_node_of_another_release_refuses_to_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    for command in ["up", "doctor"] {
        let err_file = dir.path().join(format!("{command}.err"));
        let mut child =
            std::process::Command::new(headroom_integration_tests::binary("headroom-node"))
                .arg(command)
                .env("HEADROOM_CLIENT_VERSION", "0.0.0-older")
                .env("HEADROOM_DATA_DIR", &data)
                // Were it to run: on no one's port, leaving nothing in anyone's home.
                .env("HEADROOM_LISTEN", "127.0.0.1:0")
                .env("HOME", dir.path())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(&err_file).expect("stderr file"))
                .spawn()
                .expect("run");
        // `up` that does not refuse serves until stopped.
        let status = exit_within(&mut child, Duration::from_secs(20)).unwrap_or_else(|| {
            panic!("{command} ran for another release's headroom instead of refusing")
        });
        let err = std::fs::read_to_string(&err_file).expect("stderr");
        assert_eq!(status.code(), Some(1), "{command}: {err}");
        assert!(
            err.contains("headroom 0.0.0-older started headroom-node ")
                && err.contains("install both from the same build"),
            "{command}: {err}"
        );
        assert!(!data.exists(), "{command} created its data directory");
    }

    // What `headroom` hands over: a stand-in `headroom-node` beside a copy of it writes down
    // the version it was given.
    let version = std::process::Command::new(headroom_integration_tests::binary("headroom"))
        .arg("--version")
        .output()
        .expect("run");
    let version = String::from_utf8_lossy(&version.stdout);
    let version = version
        .split_whitespace()
        .nth(1)
        .expect("a version")
        .to_string();
    let alone = dir.path().join("headroom");
    install(&headroom_integration_tests::binary("headroom"), &alone);
    let seen = dir.path().join("seen");
    let script = dir.path().join("stand-in");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf %s \"$HEADROOM_CLIENT_VERSION\" > {}\n",
            seen.display()
        ),
    )
    .expect("write");
    install(&script, &dir.path().join("headroom-node"));
    let out = std::process::Command::new(&alone)
        .arg("doctor")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&seen).expect("seen"), version);
}

/// `headroom up --run` submits as the admin of the coordinator it starts, not with a token
/// another coordinator left for the CLI's default server (an `up` there killed before it
/// could remove its file) nor the one a shell set up for another coordinator holds in
/// `HEADROOM_TOKEN`: either would be refused, and the run with it.
#[test]
fn up_run_submits_as_its_own_admin_whatever_another_server_left() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let local = home.join(".headroom").join("local");
    std::fs::create_dir_all(&local).expect("mkdir");
    let stale = local.join("127.0.0.1_7420");
    std::fs::write(&stale, "hr_stale0_0123456789abcdef\n").expect("write");
    std::fs::set_permissions(&stale, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let spec = dir.path().join("one.json");
    std::fs::write(
        &spec,
        r#"{"name": "one", "command": ["true"], "resources": {"memory": "100MiB"}}"#,
    )
    .expect("spec");
    let log = dir.path().join("up.log");
    let out = std::fs::File::create(&log).expect("log");
    let mut child = std::process::Command::new(headroom_integration_tests::binary("headroom"))
        .args(["up", "--run"])
        .arg(&spec)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--gpu-backend",
            "fake",
            "--fake-gpus",
            "1x24GiB",
        ])
        .env("HOME", &home)
        // A shell set up for another coordinator (README: remote use) changes nothing.
        .env("HEADROOM_SERVER", "http://127.0.0.1:7420")
        .env("HEADROOM_TOKEN", "hr_elsewhere0_0123456789abcdef")
        .env_remove("HEADROOM_TOKEN_FILE")
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("headroom up");
    let status = exit_within(&mut child, Duration::from_secs(60)).unwrap_or_else(|| {
        panic!(
            "the run did not end in 60 s:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(status.success(), "{status}:\n{text}");
    assert!(text.contains("submitted experiment one"), "{text}");
}

/// A client command that sent the token a local `headroom up` left for this address (an `up`
/// stopped without removing it, and another coordinator there now) says which file it came
/// from, rather than pointing at flags the user never set.
#[test]
fn a_refused_token_left_by_a_local_up_is_named_by_its_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(
        dir.path(),
        &["--admin-token", "binaries-admin-token-0123456789abcdef"],
    )
    .expect("coordinator");
    let port = coord.url.rsplit(':').next().expect("port");
    let home = dir.path().join("home");
    let local = home.join(".headroom").join("local");
    std::fs::create_dir_all(&local).expect("mkdir");
    let stale = local.join(format!("127.0.0.1_{port}"));
    std::fs::write(&stale, "hr_stale0_0123456789abcdef\n").expect("write");
    std::fs::set_permissions(&stale, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let out = std::process::Command::new(headroom_integration_tests::binary("headroom"))
        .args(["experiments", "--server", &coord.url])
        .env("HOME", &home)
        .env_remove("HEADROOM_TOKEN")
        .env_remove("HEADROOM_TOKEN_FILE")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&stale.display().to_string()) && err.contains("left by a `headroom up`"),
        "{err}"
    );
}

/// The child's exit status once it exits, or `None` (it killed) when it runs past `limit`.
fn exit_within(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Copies an executable with `install(1)`, in a process of its own: a file this process had
/// open for writing could be inherited by a process another test forks meanwhile, and then
/// fail to run ("text file busy").
fn install(from: &std::path::Path, to: &std::path::Path) {
    let status = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(from)
        .arg(to)
        .status()
        .expect("install");
    assert!(
        status.success(),
        "install {} {}",
        from.display(),
        to.display()
    );
}

/// Writes `toml` to `file` and starts `bin --config FILE`.
fn with_config(bin: &str, file: &std::path::Path, toml: &str, log: std::path::PathBuf) -> Proc {
    std::fs::write(file, toml).expect("write");
    Proc::start(
        bin,
        &["--config".to_string(), file.display().to_string()],
        log,
    )
    .expect(bin)
}

/// `--config FILE` works for the coordinator and the agent as for `headroom up`: the file
/// fills what flags and variables leave, and an unknown key is refused by name.
#[test]
fn config_files_are_honoured_by_coordinator_and_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port().expect("port");
    let coord_toml = dir.path().join("coordinator.toml");
    let coord = with_config(
        "headroom-coordinator",
        &coord_toml,
        &format!(
            "listen = \"127.0.0.1:{port}\"\ndata-dir = \"{}\"\nlease_ttl = \"7s\"\n",
            dir.path().join("coord").display()
        ),
        dir.path().join("coord.log"),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_healthy(&url);
    assert!(coord.output().contains(&url), "{}", coord.output());
    assert!(dir.path().join("coord").join("headroom.db").exists());

    let agent_toml = dir.path().join("agent.toml");
    let agent = with_config(
        "headroom-agent",
        &agent_toml,
        &format!(
            "coordinator = \"{url}\"\nnode = \"from-file\"\ngpu_backend = \"fake\"\n\
             fake-gpus = \"3x12GiB\"\nplan = \"2,1,1\"\ndata_dir = \"{}\"\n",
            dir.path().join("agent").display()
        ),
        dir.path().join("agent.log"),
    );
    wait_registered(&url, "from-file", &agent);
    let nodes = nodes_of(&url).expect("nodes");
    let node = nodes.iter().find(|n| n.name == "from-file").expect("node");
    assert_eq!(node.plan, "2,1,1");
    assert_eq!(node.gpus.len(), 3);
    assert_eq!(node.gpus[0].total_mib, 12 * 1024);

    // A variable wins over the file, a flag over both.
    let env_agent = Proc::start_with_env(
        "headroom-agent",
        &[
            "--config".to_string(),
            agent_toml.display().to_string(),
            "--plan".into(),
            "1,1,1".into(),
            "--data-dir".into(),
            dir.path().join("agent2").display().to_string(),
        ],
        &[("HEADROOM_NODE", "from-env"), ("HEADROOM_PLAN", "3,3,3")],
        dir.path().join("agent2.log"),
    )
    .expect("agent");
    wait_registered(&url, "from-env", &env_agent);
    let nodes = nodes_of(&url).expect("nodes");
    let node = nodes.iter().find(|n| n.name == "from-env").expect("node");
    assert_eq!(node.plan, "1,1,1");
    assert_eq!(node.gpus.len(), 3, "fake-gpus still comes from the file");
}

#[test]
fn unknown_config_keys_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bad.toml");
    // `data-dir` is a setting of all three; `leese_ttl` of none.
    std::fs::write(
        &file,
        format!(
            "data-dir = \"{}\"\nleese_ttl = \"9s\"\n",
            dir.path().join("data").display()
        ),
    )
    .expect("write");
    for bin in ["headroom-coordinator", "headroom-agent"] {
        let out = std::process::Command::new(headroom_integration_tests::binary(bin))
            .args(["--config", &file.display().to_string()])
            .env("HEADROOM_DATA_DIR", dir.path().join(bin))
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{bin} accepted an unknown key: {err}"
        );
        assert!(err.contains("leese_ttl"), "{bin}: {err}");
    }
    let out = std::process::Command::new(headroom_integration_tests::binary("headroom"))
        .args(["up", "--config", &file.display().to_string()])
        .env("HEADROOM_DATA_DIR", dir.path().join("up"))
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "up accepted an unknown key: {err}");
    assert!(err.contains("leese_ttl"), "up: {err}");

    // A config file that can be read once (a pipe: `--config <(...)`, `/dev/stdin`) reaches
    // `up` whole: `headroom` leaves it to `headroom-node`. Read first by `headroom`, it
    // reached `up` empty, and `up` started on its defaults. Its data directory here cannot
    // be made, so `up` stops at once when, and only when, it has read the file.
    let piped = dir.path().join("piped");
    std::fs::create_dir_all(&piped).expect("mkdir");
    let mut child = std::process::Command::new(headroom_integration_tests::binary("headroom"))
        .args(["up", "--config", "/dev/stdin", "--listen", "127.0.0.1:0"])
        .current_dir(&piped)
        .env_remove("HEADROOM_DATA_DIR")
        .env("HEADROOM_FAKE_GPUS", "1x1GiB")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run");
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        stdin
            .write_all(b"data-dir = \"/proc/headroom-none/data\"\n")
            .expect("write the config");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let started = child.try_wait().expect("wait").is_none();
    if started {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !started,
        "up started without the piped config's data dir: {err}"
    );
    assert!(err.contains("/proc/headroom-none/data"), "up, piped: {err}");
}

/// A NUL byte cannot reach `execve`: refused at submit with 422 naming the field (it used
/// to be stored, and every attempt then failed with `launch_error`).
#[test]
fn nul_bytes_are_refused_at_submit() {
    let h = Headroom::up(UpOptions::default());
    let cases = [
        (
            serde_json::json!({"name": "nul", "command": ["echo", "a\u{0}b"]}),
            "command[1]",
        ),
        (
            serde_json::json!({"name": "nul", "command": ["echo", "{x}"], "grid": {"x": ["a\u{0}"]}}),
            "grid.x[0]",
        ),
    ];
    for (spec, field) in cases {
        let (status, body) = h
            .post("/v1/experiments", &serde_json::json!({ "spec": spec }))
            .expect("post");
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["code"], "invalid", "{body}");
        assert_eq!(body["error"]["field"], field, "{body}");
    }
    let exps: Vec<serde_json::Value> = h.get("/v1/experiments").expect("experiments");
    assert!(exps.is_empty(), "{exps:?}");
}

/// `headroom doctor --json` on fake GPUs: every check passes, the allocation on each GPU
/// seen with its memory and released. A node whose GPU 0 has no energy counter and whose
/// GPU 1 cannot list its processes fails those two checks, naming the GPU and the reason,
/// and exits 1; so does one whose agent could not map GPU pids, or whose driver is torn
/// down between clients (GPUs that open slowly).
#[test]
fn doctor_passes_on_fake_gpus_and_names_what_fails() {
    let doctor = |dir: &std::path::Path| {
        let out = std::process::Command::new(headroom_integration_tests::binary("headroom"))
            .args([
                "doctor",
                "--gpu-backend",
                "fake",
                "--fake-gpus",
                "2x24GiB",
                "--json",
            ])
            .arg("--data-dir")
            .arg(dir)
            .output()
            .expect("doctor runs");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        (out.status.code(), report)
    };
    let status = |report: &serde_json::Value, name: &str| {
        let c = report["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {report:#}"))
            .clone();
        (c["status"].as_str().unwrap_or_default().to_string(), c)
    };

    let dir = tempfile::tempdir().expect("tempdir");
    // Asked to check this node (the default backend) where no driver is found: fake GPUs
    // stand in, and the doctor says the node cannot run GPU jobs, exit 1, rather than pass.
    let out = std::process::Command::new(headroom_integration_tests::binary("headroom"))
        .args(["doctor", "--json", "--no-allocate"])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .expect("doctor runs");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let fell_back = report["backend"]
        .as_str()
        .is_some_and(|b| b.starts_with("no NVIDIA driver"));
    // Only a machine with a driver has no fallback to check.
    assert!(
        fell_back || std::path::Path::new("/dev/nvidiactl").exists(),
        "{report:#}"
    );
    // No per-attempt GPU memory limit on this machine (no driver, no fake caps).
    assert_eq!(status(&report, "memory_cap").0, "unavailable", "{report:#}");
    if fell_back {
        assert_eq!(out.status.code(), Some(1), "{report:#}");
        let (s, c) = status(&report, "backend");
        assert_eq!(s, "fail", "{c:#}");
        assert!(
            c["meaning"]
                .as_str()
                .unwrap_or_default()
                .contains("cannot run GPU jobs")
        );
    }
    let (code, report) = doctor(dir.path());
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["ok"], true);
    // Fake GPUs hold attempts to a memory cap only when told to, as a node whose driver or
    // kernel enforces one.
    assert_eq!(status(&report, "memory_cap").0, "unavailable", "{report:#}");
    std::fs::write(dir.path().join("fake-gpus/memory-caps"), "").expect("caps on");
    let (_, capped) = doctor(dir.path());
    assert_eq!(status(&capped, "memory_cap").0, "pass", "{capped:#}");
    std::fs::remove_file(dir.path().join("fake-gpus/memory-caps")).expect("caps off");
    for name in [
        "backend",
        "driver",
        "memory",
        "processes",
        "pid_namespace",
        "energy",
        "power",
        "temperature",
        "clocks",
        "throttle_reasons",
        "persistence",
        "mig",
        "allocation",
    ] {
        assert_eq!(status(&report, name).0, "pass", "{name}: {report:#}");
    }
    // Where attempts get cgroups (root, as CI), the doctor says how a job gets into them and
    // what its start takes: born in them where the kernel clones into a cgroup (5.7), with no
    // move (which waits for an RCU grace period on a host without `favordynmods`).
    let (cg, check) = status(&report, "cgroups");
    if cg == "pass" {
        let detail = check["detail"].as_str().unwrap_or_default();
        let ms: f64 = detail
            .split("a job starts in its attempt's cgroups in ")
            .nth(1)
            .and_then(|rest| rest.split(" ms").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no start cost in {detail}"));
        assert!(ms.is_finite() && ms > 0.0, "{detail}");
        // Linux 5.7, and no seccomp filter (a container's profile may refuse `clone3`).
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
        let mut v = release
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let filtered = std::fs::read_to_string("/proc/self/status")
            .expect("status")
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .is_some_and(|mode| mode.trim() != "0");
        if (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (5, 7) && !filtered {
            assert!(detail.contains("(born in them: no move)"), "{detail}");
        }
    }
    let (_, alloc) = status(&report, "allocation");
    let detail = alloc["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("GPU 0: pid")
            && detail.contains("GPU 1: pid")
            && detail.contains("512 MiB"),
        "{alloc:#}"
    );
    // Cgroups are this machine's to have or not: said either way, never failed.
    assert_ne!(status(&report, "cgroups").0, "fail", "{report:#}");

    let gpus = dir.path().join("fake-gpus");
    std::fs::write(gpus.join("gpu0.no-energy"), "").expect("fault");
    std::fs::write(gpus.join("gpu1.fail-processes"), "GPU is lost").expect("fault");
    std::fs::write(gpus.join("pid-namespace"), "isolated").expect("fault");
    std::fs::write(gpus.join("open-delay"), "200ms").expect("fault");
    let (code, report) = doctor(dir.path());
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["ok"], false);
    let (energy, c) = status(&report, "energy");
    assert_eq!(energy, "fail");
    assert!(
        c["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("GPU 0: no total-energy counter"),
        "{c:#}"
    );
    assert!(
        c["meaning"]
            .as_str()
            .unwrap_or_default()
            .contains("integrated"),
        "{c:#}"
    );
    let (processes, c) = status(&report, "processes");
    assert_eq!(processes, "fail");
    assert!(
        c["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("GPU 1: process list: GPU is lost"),
        "{c:#}"
    );
    assert_eq!(status(&report, "pid_namespace").0, "fail", "{report:#}");
    assert_eq!(status(&report, "persistence").0, "fail", "{report:#}");
    // GPU 1's power still reads: only the energy counter of GPU 0 is gone.
    assert_eq!(status(&report, "power").0, "pass", "{report:#}");
    // Nothing can be seen allocated where processes cannot be listed: not tried.
    assert_eq!(status(&report, "allocation").0, "unavailable", "{report:#}");
}

/// What Kubernetes probes: the coordinator's `/v1/live` (the process serves) and
/// `/v1/health` (the store answers, its schema migrated); the agent's `/livez` and `/readyz`
/// on its metrics address, ready once its coordinator answered a heartbeat and its GPUs
/// read, not ready (503, saying why) while a GPU cannot be read.
#[test]
fn probes_say_live_and_ready_and_why_not() {
    use headroom_integration_tests::http_get_text;
    let port = free_port().expect("port");
    let metrics = format!("http://127.0.0.1:{port}");
    let h = Headroom::up(
        UpOptions::gpus("2x24GiB")
            .lease_ttl("3s")
            .flags(&["--metrics-addr", &format!("127.0.0.1:{port}")]),
    );
    h.wait_agent();
    let (status, body) = http_get_text(&format!("{}/v1/live", h.url)).expect("live");
    assert_eq!(status, 200, "{body}");
    let (status, body) = http_get_text(&format!("{}/v1/health", h.url)).expect("health");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("schema_version"), "{body}");
    assert_eq!(
        http_get_text(&format!("{metrics}/livez")).expect("livez").0,
        200
    );
    h.wait_for("the agent to be ready", Duration::from_secs(20), || {
        Ok((http_get_text(&format!("{metrics}/readyz"))?.0 == 200).then_some(()))
    });
    // GPU 1's memory cannot be read: not ready, and it says which GPU.
    std::fs::write(h.fake_gpu_dir().join("gpu1.fail-memory"), "GPU is lost").expect("fault");
    let why = h.wait_for(
        "the agent to say it is not ready",
        Duration::from_secs(20),
        || {
            let (status, body) = http_get_text(&format!("{metrics}/readyz"))?;
            Ok((status == 503).then_some(body))
        },
    );
    assert!(why.contains("GPU 1 could not be read"), "{why}");
    assert_eq!(
        http_get_text(&format!("{metrics}/livez")).expect("livez").0,
        200,
        "alive all the same"
    );
}

/// `--require-doctor`: a node whose GPUs' processes cannot be listed refuses to start,
/// saying which check failed and what it means, and so never takes work; a sound one starts.
#[test]
fn require_doctor_keeps_a_node_that_cannot_list_processes_from_taking_work() {
    let mut h = Headroom::up(UpOptions::gpus("2x24GiB").flags(&["--require-doctor"]));
    h.wait_agent();
    std::fs::write(
        h.fake_gpu_dir().join("gpu1.fail-processes"),
        "Insufficient Permissions",
    )
    .expect("fault");
    h.stop().expect("stop");
    assert!(h.restart().is_err(), "started on GPUs it cannot verify");
    let log = h.server_log();
    assert!(
        log.contains("this node must not take work")
            && log.contains("processes: GPU 1: process list: Insufficient Permissions"),
        "{log}"
    );
}

/// `HEADROOM_LOG_FORMAT=json`: every line the coordinator logs is one JSON object (what
/// `kubectl logs` and Loki read); a file or a pipe never gets colour codes, either format.
#[test]
fn logs_are_json_lines_when_asked_and_never_coloured_in_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    for format in ["json", "text"] {
        let port = free_port().expect("port");
        let log = dir.path().join(format!("{format}.log"));
        let mut coord = Proc::start_with_env(
            "headroom-coordinator",
            &[
                "--listen".to_string(),
                format!("127.0.0.1:{port}"),
                "--data-dir".into(),
                dir.path().join(format).display().to_string(),
            ],
            &[("HEADROOM_LOG_FORMAT", format)],
            log.clone(),
        )
        .expect("coordinator");
        wait_healthy(&format!("http://127.0.0.1:{port}"));
        coord.stop_with(nix::sys::signal::Signal::SIGTERM, Duration::from_secs(10));
        let text = std::fs::read_to_string(&log).expect("log");
        assert!(!text.contains('\u{1b}'), "colour codes in a file: {text}");
        // Standard output's one plain line (the address, for scripts) aside: the log's.
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("headroom: coordinator listening"))
            .collect();
        assert!(!lines.is_empty(), "nothing logged");
        let parsed = lines
            .iter()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v["level"].is_string())
            })
            .count();
        match format {
            "json" => assert_eq!(parsed, lines.len(), "{text}"),
            _ => assert_eq!(parsed, 0, "{text}"),
        }
    }
}

/// `headroom man` prints a manual page naming every command; `--dir` writes one per command.
#[test]
fn the_manual_page_is_generated_from_the_commands() {
    let out = std::process::Command::new(binary("headroom"))
        .arg("man")
        .output()
        .expect("headroom man");
    assert!(out.status.success(), "{out:?}");
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains(".TH headroom 1"), "{page}");
    for command in ["submit", "retry", "export", "logs", "man"] {
        assert!(
            page.contains(&format!("headroom\\-{command}")),
            "{command} missing: {page}"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let pages = dir.path().join("man1");
    let (status, err) = run_binary("headroom", &["man", "--dir", pages.to_str().expect("dir")]);
    assert!(status.success(), "{err}");
    let logs = std::fs::read_to_string(pages.join("headroom-logs.1")).expect("logs page");
    assert!(logs.contains("\\-\\-tail"), "{logs}");
}
