//! Only the owner acts, end to end with the real binaries: no credential of headroom's
//! reaches a job (under `headroom up`, an agent given its token in the environment, in a
//! file, or as a systemd credential); a node has one live agent; `up` is private to its
//! account; jobs run as their user; refusals are audited.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use headroom_integration_tests::standalone::{Agent, AgentOptions, Coordinator};
use headroom_integration_tests::{Headroom, UpOptions, binary, wait_until};
use headroom_shared::api::JobSummary;

const ADMIN: &str = "trust-admin-token-0123456789abcdef";
/// A secret of the lab's in the agent's environment: not passed unless the operator says.
const LAB_SECRET: (&str, &str) = ("LAB_API_KEY", "lab-secret-value-42");

/// The only `HEADROOM_*` variables a job may see: the attempt's own, and where the fake GPUs
/// are.
const ATTEMPT_VARS: &[&str] = &[
    "HEADROOM_JOB_ID",
    "HEADROOM_ATTEMPT_ID",
    "HEADROOM_AGENT_DIR",
    "HEADROOM_FAKE_GPU_DIR",
    "HEADROOM_FAKE_GPUS",
    // The job's own directory and why it restarts (`checkpoint`): no credential.
    "HEADROOM_JOB_DIR",
    "HEADROOM_RESTART_COUNT",
    "HEADROOM_STOP_REASON",
];

/// Checks the `env` printed by a job: no headroom credential by name or value, and no
/// variable of the agent's beyond the pass-through list.
fn assert_clean(env: &str, secrets: &[&str]) {
    assert!(env.contains("PATH="), "the job got no PATH:\n{env}");
    for line in env.lines() {
        let name = line.split('=').next().unwrap_or_default();
        if name.starts_with("HEADROOM") {
            assert!(ATTEMPT_VARS.contains(&name), "the job got {name}:\n{env}");
        }
    }
    for s in secrets {
        assert!(!env.contains(s), "a secret reached the job:\n{env}");
    }
    assert!(!env.contains(LAB_SECRET.0), "{env}");
}

fn cli(url: &str, token: &str, args: &[&str]) -> String {
    let out = Command::new(binary("headroom"))
        .args(["--server", url])
        .env("HEADROOM_TOKEN", token)
        .args(args)
        .output()
        .expect("cli");
    assert!(
        out.status.success(),
        "headroom {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Submits `env` (and `printenv WANTED` when given) as the admin and returns its log.
fn job_env(url: &str, dir: &Path, name: &str) -> String {
    let spec = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &spec,
        format!("name: {name}\ncommand: [\"env\"]\nresources: {{gpus: 1, memory: 1GiB}}\n"),
    )
    .expect("spec");
    cli(
        url,
        ADMIN,
        &["submit", &spec.display().to_string(), "--wait"],
    );
    let jobs: Vec<JobSummary> =
        serde_json::from_str(&cli(url, ADMIN, &["ls", "--output", "json"])).expect("json");
    let job = jobs
        .iter()
        .find(|j| j.experiment_name == name)
        .expect("the job");
    assert_eq!(job.state.as_str(), "succeeded", "{job:?}");
    cli(url, ADMIN, &["logs", &job.id.to_string()])
}

#[test]
fn no_headroom_credential_reaches_a_job() {
    // `headroom up`, its admin token and the CLI's token in its environment.
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .env("HEADROOM_ADMIN_TOKEN", ADMIN)
            .env("HEADROOM_TOKEN", ADMIN)
            .env(LAB_SECRET.0, LAB_SECRET.1),
    );
    h.wait_agent();
    let env = job_env(&h.url, h.dir.path(), "under-up");
    assert_clean(&env, &[ADMIN, LAB_SECRET.1]);

    // A coordinator and two agents: one given its token in the environment, one in a file
    // (and an operator-chosen variable passed on purpose).
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--admin-token", ADMIN]).expect("coordinator");
    let url = coord.url.clone();
    let token = |node: &str| {
        cli(
            &url,
            ADMIN,
            &["token", "create", "--name", node, "--role", "agent"],
        )
        .trim()
        .to_string()
    };
    let env_token = token("by-env");
    let agent = Agent::start(
        &url,
        dir.path(),
        AgentOptions::node("by-env")
            .env("HEADROOM_AGENT_TOKEN", &env_token)
            .env(LAB_SECRET.0, LAB_SECRET.1),
    )
    .expect("agent");
    wait_until("the agent", Duration::from_secs(30), || {
        cli(&url, ADMIN, &["nodes"])
            .contains("by-env")
            .then_some(())
    });
    let env = job_env(&url, dir.path(), "agent-env");
    assert_clean(&env, &[ADMIN, &env_token, LAB_SECRET.1]);
    drop(agent);

    let file_token = token("by-file");
    let file = dir.path().join("agent-token");
    std::fs::write(&file, format!("{file_token}\n")).expect("token file");
    let _agent = Agent::start(
        &url,
        dir.path(),
        AgentOptions::node("by-file")
            .flags(&["--agent-token-file", &file.display().to_string()])
            .flags(&["--pass-env", "WANTED_BY_JOBS"])
            .env("WANTED_BY_JOBS", "yes")
            .env(LAB_SECRET.0, LAB_SECRET.1),
    )
    .expect("agent");
    let env = job_env(&url, dir.path(), "agent-file");
    assert_clean(&env, &[ADMIN, &file_token, &env_token, LAB_SECRET.1]);
    assert!(env.contains("WANTED_BY_JOBS=yes"), "{env}");
    drop(_agent);

    // systemd's credentials (`LoadCredential=agent-token:...`), as the service gets them.
    let cred_token = token("by-cred");
    let creds = dir.path().join("credentials");
    std::fs::create_dir_all(&creds).expect("dir");
    std::fs::write(creds.join("agent-token"), format!("{cred_token}\n")).expect("credential");
    let _agent = Agent::start(
        &url,
        dir.path(),
        AgentOptions::node("by-cred").env("CREDENTIALS_DIRECTORY", &creds.display().to_string()),
    )
    .expect("agent");
    let env = job_env(&url, dir.path(), "agent-cred");
    assert_clean(&env, &[ADMIN, &cred_token, LAB_SECRET.1]);
    assert!(!env.contains("CREDENTIALS_DIRECTORY"), "{env}");
}

/// One agent per data directory, and one live agent per node: a second agent on the same
/// directory refuses to start; a second instance of the node elsewhere waits (saying why)
/// without taking the node, and registers once an admin allows a takeover.
#[test]
fn a_node_has_one_live_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--admin-token", ADMIN]).expect("coordinator");
    let url = coord.url.clone();
    let token = cli(
        &url,
        ADMIN,
        &["token", "create", "--name", "gpu-01", "--role", "agent"],
    )
    .trim()
    .to_string();
    let mut first = Agent::start(
        &url,
        dir.path(),
        AgentOptions::node("gpu-01").env("HEADROOM_AGENT_TOKEN", &token),
    )
    .expect("agent");
    wait_until("the agent", Duration::from_secs(30), || {
        cli(&url, ADMIN, &["nodes"])
            .contains("gpu-01")
            .then_some(())
    });

    // The same data directory: refused at start.
    let mut same_dir = Agent::start(
        &url,
        dir.path(),
        AgentOptions::node("gpu-01")
            .log("same-dir.log")
            .env("HEADROOM_AGENT_TOKEN", &token),
    )
    .expect("agent");
    let status = same_dir
        .wait_exit(Duration::from_secs(30))
        .expect("wait")
        .expect("it stops");
    assert!(!status.success());
    assert!(
        same_dir
            .output()
            .contains("another agent is using the data dir"),
        "{}",
        same_dir.output()
    );

    // Another instance of the node (its own data directory): waits, saying why.
    let other_dir = dir.path().join("elsewhere");
    std::fs::create_dir_all(&other_dir).expect("dir");
    let second = Agent::start(
        &url,
        &other_dir,
        AgentOptions::node("gpu-01").env("HEADROOM_AGENT_TOKEN", &token),
    )
    .expect("agent");
    wait_until(
        "the second instance to wait",
        Duration::from_secs(30),
        || {
            let log = second.output();
            (log.contains("cannot register yet") && log.contains("held by a live agent"))
                .then_some(())
        },
    );
    assert!(
        first.wait_exit(Duration::ZERO).expect("wait").is_none(),
        "the first agent runs on"
    );
    // The node's own token may not allow a takeover: refused, logged and counted.
    let out = Command::new(binary("headroom"))
        .args(["--server", &url, "node", "takeover", "gpu-01"])
        .env("HEADROOM_TOKEN", &token)
        .output()
        .expect("cli");
    assert!(!out.status.success());
    // An admin lets it take over.
    cli(&url, ADMIN, &["node", "takeover", "gpu-01"]);
    // Without the terminal colours the log may carry.
    let log = regex::Regex::new("\x1b\\[[0-9;]*m")
        .expect("regex")
        .replace_all(&coord.output(), "")
        .into_owned();
    // The admin token was given on the command line: it works, with a warning.
    assert!(
        log.contains("--admin-token on the command line can be read by every local user"),
        "{log}"
    );
    let audit = |needles: &[&str]| {
        log.lines()
            .any(|l| l.contains("headroom::audit") && needles.iter().all(|n| l.contains(n)))
    };
    assert!(
        audit(&[
            "refused",
            "actor=gpu-01",
            "/v1/nodes/gpu-01/takeover",
            "status=403"
        ]),
        "{log}"
    );
    assert!(
        audit(&[
            "actor=admin",
            "role=admin",
            "/v1/nodes/gpu-01/takeover",
            "status=200"
        ]),
        "{log}"
    );
    assert!(
        audit(&[
            "actor=gpu-01",
            "role=agent",
            "node=gpu-01",
            "/v1/agents/register"
        ]),
        "{log}"
    );
    let (_, metrics) =
        headroom_integration_tests::http_get_text(&format!("{url}/metrics")).expect("metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("headroom_refused_requests_total")
                && l.contains("route=\"/v1/nodes/{name}/takeover\"")
                && l.contains("status=\"403\"")),
        "{metrics}"
    );
    wait_until(
        "the second instance to register",
        Duration::from_secs(30),
        || {
            second
                .output()
                .contains("registered with the coordinator")
                .then_some(())
        },
    );
}

/// `headroom up` is private by default: it makes an admin token (0600 in its data
/// directory); this account's CLI finds it without flags, a request without a token is
/// refused, and another local account's CLI gets 401.
#[test]
fn up_is_private_to_its_account() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let home = tempfile::tempdir().expect("home");
    let home_dir = home.path().display().to_string();
    let h = Headroom::up(UpOptions::gpus("1x24GiB").env("HOME", &home_dir));
    h.wait_agent();
    let token_file = h.data_dir().join("admin-token");
    let mode_of = |p: &Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode_of(&token_file), 0o600);
    // Nobody else lists or reads the store, the logs or the keys.
    let data = h.data_dir();
    for (path, mode) in [
        (data.clone(), 0o711),
        (data.join("headroom.db"), 0o600),
        (data.join("agent").join("logs"), 0o700),
        (data.join("agent").join("attach.key"), 0o600),
    ] {
        assert_eq!(mode_of(&path), mode, "{}", path.display());
    }

    let cli_as = |home: &str, uid: Option<u32>, args: &[&str]| {
        let mut cmd = Command::new(binary("headroom"));
        cmd.args(["--server", &h.url])
            .args(args)
            .env("HOME", home)
            .env_remove("HEADROOM_TOKEN")
            .env_remove("HEADROOM_TOKEN_FILE")
            .current_dir("/");
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        cmd.output().expect("cli")
    };
    // This account: no flag, no variable.
    let out = cli_as(&home_dir, None, &["nodes"]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("test-node"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No token at all: refused (401, not a connection that failed).
    let (status, body) =
        headroom_integration_tests::http_get_text(&format!("{}/v1/jobs", h.url)).expect("GET");
    assert_eq!(status, 401, "a tokenless request: {body}");
    // Another account (its own home, which holds no token): 401.
    if let Some(other) = headroom_integration_tests::other_user() {
        let out = cli_as("/nonexistent", Some(other.uid.as_raw()), &["ls"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("token"), "{err}");
    }
}

/// Jobs run as their user: a user mapped to a Unix user runs as it (`id -u`, and owns its
/// log), one without a mapping as the agent's default (`nobody`), never as root; a mapping
/// to root without the admin's leave is refused naming the field; a user that does not exist
/// is for the node to say (the coordinator's host need not know the lab's users): its job
/// fails at launch naming it, once; a name has one role, so a user token cannot be named
/// like the admin.
#[test]
fn jobs_run_as_their_users_unix_user() {
    let Some(other) = headroom_integration_tests::other_user() else {
        return;
    };
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    h.wait_agent();
    let admin = h.admin_token().expect("up's admin token");
    let uid_of = |token: &str, name: &str| -> u32 {
        let spec = h.path(&format!("{name}.yaml"));
        std::fs::write(
            &spec,
            format!(
                "name: {name}\ncommand: [\"id\", \"-u\"]\nresources: {{gpus: 1, memory: 1GiB}}\n"
            ),
        )
        .expect("spec");
        cli(
            &h.url,
            token,
            &["submit", &spec.display().to_string(), "--wait"],
        );
        let jobs: Vec<JobSummary> =
            serde_json::from_str(&cli(&h.url, &admin, &["ls", "--output", "json"])).expect("json");
        let job = jobs
            .iter()
            .find(|j| j.experiment_name == name)
            .expect("job");
        assert_eq!(job.state.as_str(), "succeeded", "{job:?}");
        let log = cli(&h.url, &admin, &["logs", &job.id.to_string()]);
        log.lines()
            .find_map(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("no uid in the log: {log}"))
    };
    cli(
        &h.url,
        &admin,
        &["user", "create", "alice", "--unix-user", &other.name],
    );
    let alice = cli(
        &h.url,
        &admin,
        &["token", "create", "--name", "alice", "--role", "user"],
    )
    .trim()
    .to_string();
    assert_eq!(uid_of(&alice, "as-alice"), other.uid.as_raw());
    let nobody = nix::unistd::User::from_name("nobody")
        .expect("getpwnam")
        .expect("nobody");
    assert_eq!(uid_of(&admin, "as-default"), nobody.uid.as_raw());
    // The job's log belongs to its user.
    use std::os::unix::fs::MetadataExt;
    let owners: Vec<u32> = std::fs::read_dir(h.data_dir().join("agent").join("logs"))
        .expect("logs")
        .filter_map(|e| e.ok()?.metadata().ok().map(|m| m.uid()))
        .collect();
    assert!(owners.contains(&other.uid.as_raw()), "{owners:?}");
    assert!(!owners.contains(&0), "a job's log is root's: {owners:?}");

    let refused = |args: &[&str], says: &str| {
        let out = Command::new(binary("headroom"))
            .args(["--server", &h.url])
            .env("HEADROOM_TOKEN", &admin)
            .args(args)
            .output()
            .expect("cli");
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    };
    // A user the node lacks: taken here, refused where the job runs.
    cli(
        &h.url,
        &admin,
        &["user", "create", "bob", "--unix-user", "no-such-user-hr"],
    );
    let bob = cli(
        &h.url,
        &admin,
        &["token", "create", "--name", "bob", "--role", "user"],
    )
    .trim()
    .to_string();
    let spec = h.path("as-bob.yaml");
    std::fs::write(
        &spec,
        "name: as-bob\ncommand: [\"id\", \"-u\"]\nretry: {max_attempts: 3}\n",
    )
    .expect("spec");
    cli(&h.url, &bob, &["submit", &spec.display().to_string()]);
    let job = wait_until("bob's job to end", Duration::from_secs(30), || {
        let jobs: Vec<JobSummary> =
            serde_json::from_str(&cli(&h.url, &admin, &["ls", "--output", "json"])).ok()?;
        jobs.into_iter()
            .find(|j| j.experiment_name == "as-bob" && j.state.is_terminal())
    });
    assert_eq!(job.state.as_str(), "failed", "{job:?}");
    let shown = cli(&h.url, &admin, &["show", &job.id.to_string()]);
    assert!(shown.contains("no Unix user `no-such-user-hr`"), "{shown}");
    assert!(shown.contains("launch_error"), "{shown}");
    refused(&["user", "create", "carol", "--unix-user", "root"], "root");
    refused(
        &["token", "create", "--name", "admin", "--role", "user"],
        "role admin",
    );
    let users = cli(&h.url, &admin, &["user", "ls"]);
    assert!(users.contains("bob") && !users.contains("carol"), "{users}");
}

/// A job starts with its standard streams only: `up` inherited a descriptor to a file its
/// jobs' user may not read (as a service manager or a wrapper may leave one), and the job
/// cannot read through it. Under root, its `PATH` holds only what its user may search (not
/// the agent's private tool folder).
#[test]
fn a_job_inherits_no_descriptor_of_its_agent() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("root-only");
    std::fs::write(&secret, "inherited-secret-42\n").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // The agent's own tool folder, in a folder private to it.
    let private_bin = dir.path().join("private").join("bin");
    std::fs::create_dir_all(&private_bin).expect("bin");
    std::fs::set_permissions(
        dir.path().join("private"),
        std::fs::Permissions::from_mode(0o700),
    )
    .expect("chmod");
    let path = format!(
        "{}:{}",
        private_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let h = Headroom::up(UpOptions::gpus("1x24GiB").fd3(&secret).env("PATH", &path));
    h.wait_agent();
    let spec = h.path("fd3.yaml");
    std::fs::write(
        &spec,
        "name: fd3\ncommand: [\"sh\", \"-c\", \"echo PATH=$PATH; stat -c tmp=%U:%a $TMPDIR; \
         cat <&3; ls /proc/$$/fd | tr '\\\\n' ' '\"]\n\
         retry: {max_attempts: 1}\n",
    )
    .expect("spec");
    h.cli(&["submit", &spec.display().to_string(), "--wait"]);
    let jobs: Vec<JobSummary> =
        serde_json::from_str(&h.cli_ok(&["ls", "--output", "json"])).expect("json");
    let log = h.cli_ok(&["logs", &jobs[0].id.to_string()]);
    assert!(!log.contains("inherited-secret-42"), "{log}");
    assert!(log.contains("0 1 2 "), "{log}");
    assert!(!log.contains("0 1 2 3"), "{log}");
    let job_path = log
        .lines()
        .find_map(|l| l.strip_prefix("PATH="))
        .unwrap_or_else(|| panic!("no PATH in {log}"));
    if nix::unistd::geteuid().is_root() {
        assert!(
            !job_path.contains(&private_bin.display().to_string()),
            "{job_path}"
        );
        assert!(job_path.contains("/usr/bin"), "{job_path}");
        // Its temporary directory is its own user's, and no one else's to enter.
        assert!(log.contains("tmp=nobody:700"), "{log}");
    }
}

/// `headroom up --no-auth` on a root machine, as any local account would try it: mapping the
/// anonymous admin to root is refused, and its jobs run as the default user (`nobody`),
/// never as root, even under `sudo` (no `SUDO_USER` mapping without tokens).
#[test]
fn a_tokenless_up_runs_no_job_as_root() {
    if !nix::unistd::geteuid().is_root() {
        headroom_integration_tests::premise_missing("root");
        return;
    }
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .flags(&["--no-auth"])
            .env("SUDO_USER", "root"),
    );
    h.wait_agent();
    let out = h.cli(&[
        "user",
        "create",
        "anonymous",
        "--role",
        "admin",
        "--unix-user",
        "root",
        "--allow-root",
    ]);
    assert!(
        !out.status.success(),
        "the anonymous admin mapped itself to root"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without tokens"), "{err}");
    let spec = h.path("whoami.yaml");
    std::fs::write(
        &spec,
        "name: whoami\ncommand: [\"id\", \"-u\"]\nresources: {gpus: 1, memory: 1GiB}\n",
    )
    .expect("spec");
    h.cli_ok(&["submit", &spec.display().to_string(), "--wait"]);
    let jobs: Vec<JobSummary> =
        serde_json::from_str(&h.cli_ok(&["ls", "--output", "json"])).expect("json");
    assert_eq!(jobs[0].state.as_str(), "succeeded", "{jobs:?}");
    let log = h.cli_ok(&["logs", &jobs[0].id.to_string()]);
    let nobody = nix::unistd::User::from_name("nobody")
        .expect("getpwnam")
        .expect("nobody");
    let uid: u32 = log
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no uid in the log: {log}"));
    assert_eq!(uid, nobody.uid.as_raw(), "{log}");
}

/// `sudo headroom up`: the admin is the account that ran sudo, and its jobs run as it.
#[test]
fn sudo_up_runs_the_admins_jobs_as_the_sudo_user() {
    let Some(other) = headroom_integration_tests::other_user() else {
        return;
    };
    let h = Headroom::up(UpOptions::gpus("1x24GiB").env("SUDO_USER", &other.name));
    h.wait_agent();
    let admin = h.admin_token().expect("admin token");
    let spec = h.path("whoami.yaml");
    std::fs::write(
        &spec,
        "name: whoami\ncommand: [\"id\", \"-u\"]\nresources: {gpus: 1, memory: 1GiB}\n",
    )
    .expect("spec");
    cli(
        &h.url,
        &admin,
        &["submit", &spec.display().to_string(), "--wait"],
    );
    let jobs: Vec<JobSummary> =
        serde_json::from_str(&cli(&h.url, &admin, &["ls", "--output", "json"])).expect("json");
    let log = cli(&h.url, &admin, &["logs", &jobs[0].id.to_string()]);
    assert!(
        log.lines()
            .any(|l| l.trim() == other.uid.as_raw().to_string()),
        "{log}"
    );
}

/// `sudo headroom up`: the account that ran sudo finds the admin token as its own `up`'s,
/// in its own home (its CLI needs no token given), and no other account does; it is gone
/// when `up` stops.
#[test]
fn sudo_up_leaves_its_token_to_the_sudo_user_s_own_cli() {
    use std::os::unix::process::CommandExt;
    let Some(other) = headroom_integration_tests::other_user() else {
        return;
    };
    own_home(&other);
    let mut h = Headroom::up(UpOptions::gpus("1x24GiB").env("SUDO_USER", &other.name));
    h.wait_agent();
    let as_other = |args: &[&str]| {
        Command::new(binary("headroom"))
            .args(["--server", &h.url])
            .args(args)
            .env_clear()
            .env("HOME", &other.dir)
            .current_dir("/")
            .uid(other.uid.as_raw())
            .gid(other.gid.as_raw())
            .output()
            .expect("cli")
    };
    let out = as_other(&["nodes"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port = h.url.rsplit(':').next().expect("port").to_string();
    let kept = other.dir.join(format!(".headroom/local/127.0.0.1_{port}"));
    let meta = std::fs::metadata(&kept).expect("the token file");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (meta.uid(), meta.mode() & 0o777),
        (other.uid.as_raw(), 0o600)
    );
    h.stop().expect("stop");
    assert!(!kept.exists(), "left behind after up stopped");
}

/// A DaemonSet's agents share one join token: each exchanges it once for its node's own
/// credential, kept in its data directory (0600); neither reaches a job; restarted without
/// the join token, the agent goes on with the credential it kept; a second node joins with
/// the same token, and gets a credential of its own.
#[test]
fn agents_sharing_a_join_token_each_get_their_nodes_own_credential() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--admin-token", ADMIN]).expect("coordinator");
    let url = coord.url.clone();
    let join = cli(
        &url,
        ADMIN,
        &[
            "token", "create", "--name", "lab-join", "--role", "join", "--nodes", "gpu-*",
        ],
    )
    .trim()
    .to_string();
    let join_file = dir.path().join("join-token");
    std::fs::write(&join_file, format!("{join}\n")).expect("join token file");
    // The agent instance now alive on `node`, once one other than `before` is.
    let registered = |node: &str, before: Option<&str>| -> String {
        wait_until(&format!("node {node}"), Duration::from_secs(30), || {
            let nodes: Vec<headroom_shared::api::NodeView> =
                serde_json::from_str(&cli(&url, ADMIN, &["nodes", "--output", "json"])).ok()?;
            let n = nodes.into_iter().find(|n| n.name == node && n.alive)?;
            let agent = n.agent?.to_string();
            (Some(agent.as_str()) != before).then_some(agent)
        })
    };
    let joined = |node: &str| {
        AgentOptions::node(node).flags(&["--join-token-file", &join_file.display().to_string()])
    };
    let agent = Agent::start(&url, dir.path(), joined("gpu-a")).expect("agent");
    let first = registered("gpu-a", None);
    let kept = dir.path().join("gpu-a").join("node-token");
    let credential = std::fs::read_to_string(&kept).expect("the node's credential is kept");
    assert_ne!(credential.trim(), join);
    assert_eq!(
        std::fs::metadata(&kept).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    let env = job_env(&url, dir.path(), "joined");
    assert_clean(&env, &[ADMIN, &join, credential.trim()]);
    drop(agent);

    // Without the join token now: the kept credential is enough.
    std::fs::remove_file(&join_file).expect("join token gone");
    let agent = Agent::start(&url, dir.path(), AgentOptions::node("gpu-a")).expect("agent");
    registered("gpu-a", Some(&first));
    drop(agent);
    std::fs::write(&join_file, format!("{join}\n")).expect("join token file");
    let _b = Agent::start(&url, dir.path(), joined("gpu-b")).expect("agent");
    registered("gpu-b", None);
    let other = std::fs::read_to_string(dir.path().join("gpu-b").join("node-token")).expect("b");
    assert_ne!(other, credential);
    let tokens = cli(&url, ADMIN, &["token", "ls"]);
    assert!(
        tokens.contains("gpu-a") && tokens.contains("gpu-b") && tokens.contains("lab-join"),
        "{tokens}"
    );

    // `--join-only` (the chart's init container): the credential made and kept, the agent
    // gone; the agent then starts without the join token. A node the join token does not
    // name gets nothing, and the refusal says which nodes it names.
    let join_only = |node: &str| {
        Command::new(binary("headroom-agent"))
            .args(["--join-only", "--coordinator", &url, "--node", node])
            .arg("--data-dir")
            .arg(dir.path().join(node))
            .arg("--join-token-file")
            .arg(&join_file)
            .output()
            .expect("headroom-agent --join-only")
    };
    let out = join_only("gpu-c");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join("gpu-c").join("node-token").exists());
    let _c = Agent::start(&url, dir.path(), AgentOptions::node("gpu-c")).expect("agent");
    registered("gpu-c", None);
    let out = join_only("cpu-x");
    assert!(
        !out.status.success(),
        "a node the join token does not name joined"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpu-*") && err.contains("cpu-x"), "{err}");
    assert!(!dir.path().join("cpu-x").join("node-token").exists());
}

/// A `headroom up` not run as root runs every job as its own account, which holds its admin
/// token: it serves that one user. A second user's token (or a user mapping) is refused,
/// saying why and what to run instead, and the admin's own jobs run as that account.
#[test]
fn a_non_root_up_serves_one_user() {
    let Some(other) = headroom_integration_tests::other_user() else {
        return;
    };
    let h = Headroom::up(UpOptions::gpus("1x24GiB").account(&other));
    h.wait_agent();
    let out = h.cli(&["token", "create", "--name", "alice", "--role", "user"]);
    assert!(!out.status.success(), "a second user was given a token");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sudo headroom up"), "{err}");
    let out = h.cli(&["user", "create", "alice", "--unix-user", "nobody"]);
    assert!(!out.status.success(), "a user was mapped");
    let spec = h.path("whoami.yaml");
    std::fs::write(
        &spec,
        "name: whoami\ncommand: [\"id\", \"-u\"]\nresources: {gpus: 1, memory: 1GiB}\n",
    )
    .expect("spec");
    h.cli_ok(&["submit", &spec.display().to_string(), "--wait"]);
    let jobs: Vec<JobSummary> =
        serde_json::from_str(&h.cli_ok(&["ls", "--output", "json"])).expect("json");
    let log = h.cli_ok(&["logs", &jobs[0].id.to_string()]);
    assert!(
        log.lines()
            .any(|l| l.trim() == other.uid.as_raw().to_string()),
        "{log}"
    );
}

/// A root `up`, agent or doctor takes no data directory of another user, and follows no link
/// planted in its own: the reproduction (a `fake-gpus` link to a root directory, which the
/// chmod meant for the fake GPUs' folder made world-writable) leaves the target as it was.
#[test]
fn a_root_process_takes_no_other_users_data_directory_nor_its_links() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !nix::unistd::geteuid().is_root() {
        headroom_integration_tests::premise_missing("root");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    // `headroom up` or `headroom doctor` on `data`: whether it refused, and what it said.
    let start = |data: &Path, command: &str| -> (bool, String) {
        let data = data.display().to_string();
        let mut args = vec![command, "--data-dir", &data, "--gpu-backend", "fake"];
        args.extend(["--fake-gpus", "1x8GiB"]);
        if command == "up" {
            args.extend(["--listen", "127.0.0.1:0"]);
        }
        let log = tmp.path().join(format!("{command}.log"));
        let mut p = headroom_integration_tests::Proc::start_program(
            &binary("headroom"),
            &args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            &[("HOME", &tmp.path().display().to_string())],
            log.clone(),
        )
        .expect("start");
        let exited = p.wait_exit(Duration::from_secs(20)).expect("wait");
        (
            exited.is_some_and(|s| !s.success()),
            std::fs::read_to_string(&log).unwrap_or_default(),
        )
    };
    // Another user's directory.
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).expect("dir");
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
    for command in ["up", "doctor"] {
        let (refused, log) = start(&theirs, command);
        assert!(refused, "{command} took another user's directory:\n{log}");
        assert!(log.contains("belongs to uid 65534"), "{command}: {log}");
    }
    // Root's own, with a link planted where the fake GPUs' folder goes.
    let target = tmp.path().join("root-only");
    std::fs::create_dir(&target).expect("target");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let ours = tmp.path().join("ours");
    std::fs::create_dir(&ours).expect("dir");
    std::os::unix::fs::symlink(&target, ours.join("fake-gpus")).expect("link");
    let (refused, log) = start(&ours, "up");
    assert!(refused, "up followed the link:\n{log}");
    assert!(log.contains("symbolic link"), "{log}");
    let mode = std::fs::metadata(&target).expect("meta").mode() & 0o7777;
    assert_eq!(mode, 0o700, "the link's target was changed");
}

/// A coordinator behind TLS (a lab's proxy or ingress with its own CA): the CLI and an agent
/// reach its `https://` address with the CA given (`--ca-file`, `HEADROOM_CA_FILE`), run a
/// job through it end to end, and without the CA the CLI says the certificate is not
/// trusted and what to give, rather than that the scheme is not http.
#[test]
fn the_cli_and_agents_reach_a_coordinator_behind_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--admin-token", ADMIN]).expect("coordinator");
    let plain = coord.url.trim_start_matches("http://").to_string();
    let front = headroom_integration_tests::tls::TlsFront::start(&plain, dir.path()).expect("tls");
    let ca = front.ca_file.display().to_string();
    let https = |args: &[&str], ca: Option<&str>| {
        let mut cmd = Command::new(binary("headroom"));
        cmd.args(["--server", &front.url])
            .env("HEADROOM_TOKEN", ADMIN)
            .env_remove("HEADROOM_CA_FILE");
        if let Some(ca) = ca {
            cmd.env("HEADROOM_CA_FILE", ca);
        }
        cmd.args(args).output().expect("cli")
    };
    let out = https(&["nodes"], None);
    assert!(!out.status.success(), "an unknown CA was trusted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--ca-file") && !err.contains("scheme"),
        "{err}"
    );
    let out = https(&["nodes"], Some(&ca));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let token = cli(
        &coord.url,
        ADMIN,
        &["token", "create", "--name", "tls-node", "--role", "agent"],
    )
    .trim()
    .to_string();
    let _agent = Agent::start(
        &front.url,
        dir.path(),
        AgentOptions::node("tls-node")
            .env("HEADROOM_AGENT_TOKEN", &token)
            .flags(&["--ca-file", &ca]),
    )
    .expect("agent");
    wait_until("the agent over TLS", Duration::from_secs(30), || {
        cli(&coord.url, ADMIN, &["nodes"])
            .contains("tls-node")
            .then_some(())
    });
    let spec = dir.path().join("tls.yaml");
    std::fs::write(
        &spec,
        "name: over-tls\ncommand: [\"echo\", \"hello over tls\"]\n",
    )
    .expect("spec");
    let out = https(
        &["submit", &spec.display().to_string(), "--wait"],
        Some(&ca),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `sudo headroom up` started in the operator's home would make their `~/.headroom` (where
/// their CLI finds the tokens it is given) its own root-private data directory and leave
/// them no token: refused before anything is made, naming the flag.
#[test]
fn sudo_up_refuses_the_sudo_user_s_token_folder_as_its_data_dir() {
    let Some(other) = headroom_integration_tests::other_user() else {
        return;
    };
    own_home(&other);
    let tokens = other.dir.join(".headroom");
    let _ = std::fs::remove_dir_all(&tokens);
    // From the home, as `cd ~ && sudo headroom up`: the default `.headroom` is that folder.
    let out = Command::new(binary("headroom"))
        .args(["up", "--fake-gpus", "1x24GiB", "--listen", "127.0.0.1:0"])
        .current_dir(&other.dir)
        .env("SUDO_USER", &other.name)
        .env("HOME", &other.dir)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("headroom up");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--data-dir:") && err.contains("keep the tokens they are given"),
        "{err}"
    );
    assert!(!tokens.exists(), "nothing made");
}

/// The test user's home, made where missing: its own and private, as a person's is.
fn own_home(user: &nix::unistd::User) {
    use std::os::unix::fs::PermissionsExt;
    if !user.dir.is_dir() {
        std::fs::create_dir_all(&user.dir).expect("home");
    }
    nix::unistd::chown(&user.dir, Some(user.uid), Some(user.gid)).expect("chown");
    std::fs::set_permissions(&user.dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
}
