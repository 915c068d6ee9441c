//! Tokens and roles end to end, with the real binaries: agents need an agent token (a user
//! token is refused at registration, with a clear log line), runs record their submitter,
//! the CLI says what to do when the server is unreachable, the token missing or wrong, or
//! the action forbidden; `--output json` speaks the API's field names; completions.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use headroom_integration_tests::standalone::{Agent, AgentOptions, Coordinator};
use headroom_integration_tests::{Headroom, UpOptions, binary, free_port, wait_until};
use headroom_shared::api::{ExperimentSummary, JobDetail, JobSummary, NodeView, TokenView};

const ADMIN: &str = "integration-admin-token-0123456789";

/// The CLI against `url` with `token` (none: no token at all).
fn cli(url: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(binary("headroom"));
    cmd.args(["--server", url])
        .env_remove("HEADROOM_TOKEN")
        .env_remove("HEADROOM_TOKEN_FILE")
        .stdin(Stdio::null());
    if let Some(t) = token {
        cmd.env("HEADROOM_TOKEN", t);
    }
    cmd.args(args)
        .output()
        .unwrap_or_else(|e| panic!("headroom {args:?}: {e}"))
}

fn ok(url: &str, token: Option<&str>, args: &[&str]) -> String {
    let out = cli(url, token, args);
    assert!(
        out.status.success(),
        "headroom {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails(url: &str, token: Option<&str>, args: &[&str]) -> String {
    let out = cli(url, token, args);
    assert!(!out.status.success(), "headroom {args:?} must fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn create(url: &str, name: &str, role: &str) -> String {
    ok(
        url,
        Some(ADMIN),
        &["token", "create", "--name", name, "--role", role],
    )
    .trim()
    .to_string()
}

fn spec_file(dir: &Path, name: &str) -> String {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!("name: {name}\ncommand: [\"true\"]\nresources: {{gpus: 1, memory: 1GiB}}\n"),
    )
    .expect("spec");
    path.display().to_string()
}

#[test]
fn agents_need_an_agent_token_and_runs_record_their_submitter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--admin-token", ADMIN]).expect("coordinator");
    let url = coord.url.clone();
    let alice = create(&url, "alice", "user");
    let node_token = create(&url, "node-a", "agent");
    assert!(alice.starts_with("hr_") && node_token.starts_with("hr_"));

    // A user token cannot make an agent: it stops, saying why and how to fix it.
    let mut wrong = Agent::start(
        &url,
        dir.path(),
        AgentOptions::node("wrong").env("HEADROOM_AGENT_TOKEN", &alice),
    )
    .expect("agent");
    let status = wrong
        .wait_exit(Duration::from_secs(30))
        .expect("wait")
        .expect("the agent stops");
    assert!(!status.success());
    let log = wrong.output();
    assert!(
        log.contains("needs role agent") && log.contains("HEADROOM_AGENT_TOKEN"),
        "{log}"
    );
    assert!(!log.contains(&alice), "the agent logged its token:\n{log}");

    // An agent token works: it registers, claims, runs and reports.
    let agent = Agent::start(
        &url,
        dir.path(),
        AgentOptions::node("node-a").env("HEADROOM_AGENT_TOKEN", &node_token),
    )
    .expect("agent");
    wait_until("the agent to register", Duration::from_secs(30), || {
        let out = cli(&url, Some(&alice), &["nodes", "--output", "json"]);
        let nodes: Vec<NodeView> = serde_json::from_slice(&out.stdout).ok()?;
        nodes
            .iter()
            .any(|n| n.name == "node-a" && n.alive)
            .then_some(())
    });
    let spec = spec_file(dir.path(), "alices");
    ok(&url, Some(&alice), &["submit", &spec, "--wait"]);
    let jobs: Vec<JobSummary> =
        serde_json::from_str(&ok(&url, Some(&alice), &["ls", "--output", "json"])).expect("json");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].state.as_str(), "succeeded", "{jobs:?}");
    assert_eq!(jobs[0].submitted_by, "alice");
    let job: JobDetail = serde_json::from_str(&ok(
        &url,
        Some(&alice),
        &["show", &jobs[0].id.to_string(), "--output", "json"],
    ))
    .expect("json");
    assert_eq!(job.attempts_detail[0].submitted_by, "alice");
    let table = ok(&url, Some(&alice), &["ls"]);
    assert!(table.contains("BY") && table.contains("alice"), "{table}");

    // No log line of the coordinator or the agent carries a token.
    let logs =
        std::fs::read_to_string(dir.path().join("coord.log")).unwrap_or_default() + &agent.output();
    for secret in [ADMIN, &alice, &node_token] {
        assert!(!logs.contains(secret), "a token was logged");
    }

    // Tokens are listed without secrets and revoked at once.
    let tokens: Vec<TokenView> =
        serde_json::from_str(&ok(&url, Some(ADMIN), &["token", "ls", "--output", "json"]))
            .expect("json");
    let id = &tokens
        .iter()
        .find(|t| t.name == "alice")
        .expect("alice's")
        .id;
    ok(&url, Some(ADMIN), &["token", "revoke", id]);
    let err = fails(&url, Some(&alice), &["ls"]);
    assert!(err.contains("refused the token"), "{err}");
}

#[test]
fn cli_errors_say_what_went_wrong_and_how_to_fix_it() {
    // Nothing listens here.
    let port = free_port().expect("port");
    let nowhere = format!("http://127.0.0.1:{port}");
    let err = fails(&nowhere, None, &["ls"]);
    assert!(
        err.contains(&format!(
            "cannot reach the coordinator at {nowhere}: connection refused (set --server or HEADROOM_SERVER"
        )),
        "{err}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--admin-token", ADMIN]).expect("coordinator");
    let url = coord.url.clone();
    let err = fails(&url, None, &["ls"]);
    assert!(
        err.contains("requires a token: set --token or HEADROOM_TOKEN"),
        "{err}"
    );
    let err = fails(&url, Some("hr_0011223344556677_wrong"), &["ls"]);
    assert!(
        err.contains("refused the token") && err.contains("HEADROOM_TOKEN"),
        "{err}"
    );
    let alice = create(&url, "alice", "user");
    let bob = create(&url, "bob", "user");
    let err = fails(&url, Some(&alice), &["plan", "set", "any-node", "1"]);
    assert!(
        err.contains("forbidden") && err.contains("needs role admin") && err.contains("alice"),
        "{err}"
    );
    let err = fails(
        &url,
        Some(&alice),
        &["token", "create", "--name", "x", "--role", "admin"],
    );
    assert!(err.contains("needs role admin"), "{err}");
    // Alice may not cancel Bob's experiment; an admin may.
    let spec = spec_file(dir.path(), "bobs");
    ok(&url, Some(&bob), &["submit", &spec]);
    let err = fails(&url, Some(&alice), &["cancel", "bobs"]);
    assert!(
        err.contains("forbidden") && err.contains("submitted by `bob`"),
        "{err}"
    );
    let out = ok(&url, Some(ADMIN), &["cancel", "bobs"]);
    assert!(out.contains("cancelled 1 jobs"), "{out}");
    // A token file works as the variable does.
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{bob}\n")).expect("write");
    let exps: Vec<ExperimentSummary> = serde_json::from_str(&ok(
        &url,
        None,
        &[
            "--token-file",
            file.to_str().unwrap_or_default(),
            "experiments",
            "--output",
            "json",
        ],
    ))
    .expect("json");
    assert_eq!(exps[0].submitted_by, "bob");
}

#[test]
fn json_output_has_the_api_field_names_and_completions_are_printed() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    h.wait_agent();
    let exp = h.submit_spec(serde_json::json!({"name": "j", "command": ["true"]}));
    h.wait_done(exp, Duration::from_secs(60));
    // The CLI's JSON is the API's document, key for key.
    for (args, path) in [
        (vec!["ls"], "/v1/jobs".to_string()),
        (vec!["experiments"], "/v1/experiments".to_string()),
        (vec!["nodes"], "/v1/nodes".to_string()),
    ] {
        let mut full = args.clone();
        full.extend(["--output", "json"]);
        let cli: serde_json::Value =
            serde_json::from_str(&h.cli_ok(&full)).expect("the CLI printed JSON");
        let api: serde_json::Value = h.get(&path).expect("api");
        let keys = |v: &serde_json::Value| -> Vec<String> {
            v[0].as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default()
        };
        assert!(!keys(&api).is_empty(), "{path}: {api}");
        assert_eq!(keys(&cli), keys(&api), "{args:?} vs {path}");
    }
    let jobs: Vec<JobSummary> = h.jobs(exp).expect("jobs");
    let show: serde_json::Value =
        serde_json::from_str(&h.cli_ok(&["show", &jobs[0].id.to_string(), "--output", "json"]))
            .expect("json");
    assert_eq!(show["submitted_by"], "admin", "up's own admin token");
    assert!(show["attempts_detail"].is_array());

    for (shell, mark) in [
        ("bash", "_headroom()"),
        ("zsh", "#compdef headroom"),
        ("fish", "complete -c headroom"),
    ] {
        let script = h.cli_ok(&["completions", shell]);
        assert!(script.contains(mark) && script.contains("token"), "{shell}");
    }
    // The bash script is valid bash.
    let path = h.path("headroom.bash");
    std::fs::write(&path, h.cli_ok(&["completions", "bash"])).expect("write");
    let status = Command::new("bash")
        .arg("-n")
        .arg(&path)
        .status()
        .expect("bash");
    assert!(status.success());
}

#[test]
fn headroom_up_with_tokens_runs_its_own_agent_and_open_coordinators_stay_on_loopback() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").flags(&["--admin-token", ADMIN]));
    let alice = create(&h.url, "alice", "user");
    wait_until("the local agent", Duration::from_secs(30), || {
        let out = cli(&h.url, Some(&alice), &["nodes", "--output", "json"]);
        let nodes: Vec<NodeView> = serde_json::from_slice(&out.stdout).ok()?;
        nodes.iter().any(|n| n.alive).then_some(())
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = spec_file(dir.path(), "ups");
    let out = ok(&h.url, Some(&alice), &["submit", &spec, "--wait"]);
    assert!(out.contains("1 succeeded"), "{out}");
    let err = fails(&h.url, None, &["ls"]);
    assert!(err.contains("requires a token"), "{err}");

    // Listening beyond loopback without tokens is refused, saying why.
    let port = free_port().expect("port");
    let out = Command::new(binary("headroom-coordinator"))
        .args(["--listen", &format!("0.0.0.0:{port}")])
        .arg("--data-dir")
        .arg(dir.path().join("open"))
        .env_remove("HEADROOM_ADMIN_TOKEN")
        .env_remove("HEADROOM_TOKENS_FILE")
        .stdin(Stdio::null())
        .output()
        .expect("coordinator");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to listen on 0.0.0.0") && err.contains("HEADROOM_ADMIN_TOKEN"),
        "{err}"
    );
}
