//! A lab's own project, as a researcher runs it: jobs run in the directory they were
//! submitted from, with the submitter's venv, from the code as submitted (`--snapshot`),
//! with the commit recorded; a directory the job's user may not enter fails on its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, binary};
use headroom_shared::JobState;
use serde_json::Value;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=Lab", "-c", "user.email=lab@example.org"])
        .args(args)
        .output()
        .expect("git");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository as the seeds' are: a training script that imports numpy and reads its
/// data by a relative path, printing its metrics as scripts do.
fn project(dir: &Path, version: &str) {
    std::fs::create_dir_all(dir.join("data")).expect("mkdir");
    std::fs::write(dir.join("data/values.csv"), "1,2,3\n4,5,6\n").expect("data");
    std::fs::write(
        dir.join("train.py"),
        format!(
            "import sys\nimport numpy as np\n\
             data = np.loadtxt('data/values.csv', delimiter=',')\n\
             print(f'version={version} mean={{data.mean():.2f}} prefix={{sys.prefix}}')\n"
        ),
    )
    .expect("script");
    std::fs::write(
        dir.join("spec.yaml"),
        "name: train\ncommand: [python, train.py]\nresources: {gpus: 1, memory: 1GiB}\n",
    )
    .expect("spec");
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["add", "."]);
    git(dir, &["commit", "-q", "-m", "first"]);
}

/// The venv the suite's Python tests use (numpy comes with pandas): a real venv holding
/// a real third-party package.
fn venv() -> Option<PathBuf> {
    let python = std::env::var_os("HEADROOM_TEST_PYTHON").map(PathBuf::from);
    let venv = python.and_then(|p| Some(p.parent()?.parent()?.to_path_buf()));
    if venv.is_none() {
        headroom_integration_tests::premise_missing("HEADROOM_TEST_PYTHON (a venv with numpy)");
    }
    venv
}

/// `up`, its admin's jobs run as root where the test is root (a container's way): the
/// suite's venv lives where another user may not read it.
fn up_as_the_lab() -> Headroom {
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    h.wait_agent();
    if nix::unistd::geteuid().is_root() {
        // Root, not through sudo: `up` says once at start whom its jobs run as, and how
        // to change it.
        let log = h.server_log();
        assert!(
            log.contains("your jobs run as `nobody`") && log.contains("--allow-root"),
            "{log}"
        );
        h.cli_ok(&[
            "user",
            "create",
            "admin",
            "--role",
            "admin",
            "--unix-user",
            "root",
            "--allow-root",
        ]);
    }
    h
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn submitted_id(out: &str) -> headroom_shared::ExperimentId {
    let id = out
        .split('(')
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap_or_else(|| panic!("no experiment id in `{out}`"));
    id.parse().expect("experiment id")
}

fn export_rows(h: &Headroom, exp: headroom_shared::ExperimentId) -> Vec<Value> {
    let page: Value = h
        .get(&format!("/v1/export?experiment={exp}&format=json"))
        .expect("export");
    page["rows"].as_array().cloned().unwrap_or_default()
}

fn log_of(h: &Headroom, exp: headroom_shared::ExperimentId) -> Vec<String> {
    h.jobs(exp)
        .expect("jobs")
        .iter()
        .map(|j| h.cli_ok(&["logs", &j.id.to_string()]))
        .collect()
}

/// Two checkouts of one script submitted one after the other from their own directories,
/// from an activated venv: each job runs its own checkout's code, reads its data by a
/// relative path, runs the venv's interpreter, and the export records each checkout.
#[test]
fn each_job_runs_its_own_checkout_with_the_submitter_s_venv() {
    let Some(venv) = venv() else {
        return;
    };
    let h = up_as_the_lab();
    let a = h.path("lab-a");
    let b = h.path("lab-b");
    project(&a, "A");
    project(&b, "B");
    // The second checkout has an edit not yet committed.
    std::fs::write(b.join("data/values.csv"), "10,20\n").expect("edit");
    let path = format!("{}/bin:/usr/bin:/bin", venv.display());
    let activated = [
        ("VIRTUAL_ENV", venv.to_str().expect("utf-8")),
        ("PATH", path.as_str()),
    ];
    let submit = |dir: &Path| {
        let out = h.cli_in(Some(dir), &activated, &["submit", "spec.yaml"]);
        submitted_id(&ok(out, "submit"))
    };
    let (ea, eb) = (submit(&a), submit(&b));
    for (exp, dir, version, mean) in [(ea, &a, "A", "3.50"), (eb, &b, "B", "15.00")] {
        let jobs = h.wait_done(exp, Duration::from_secs(60));
        assert_eq!(
            jobs[0].state,
            JobState::Succeeded,
            "{jobs:?}\n{:?}",
            log_of(&h, exp)
        );
        let log = &log_of(&h, exp)[0];
        assert!(
            log.contains(&format!(
                "version={version} mean={mean} prefix={}",
                venv.display()
            )),
            "{log}"
        );
        let rows = export_rows(&h, exp);
        let canon = dir.canonicalize().expect("canonical");
        assert_eq!(
            rows[0]["workdir"],
            canon.display().to_string(),
            "{}",
            rows[0]
        );
        assert_eq!(rows[0]["git_commit"], git(dir, &["rev-parse", "HEAD"]));
        assert_eq!(rows[0]["git_dirty"], version == "B");
        assert!(rows[0]["code_hash"].is_null());
    }
    // `show` names the directory, the commit and the environment taken.
    let job = h.jobs(eb).expect("jobs")[0].id.to_string();
    let shown = h.cli_ok(&["show", &job]);
    assert!(shown.contains("with uncommitted changes"), "{shown}");
    assert!(
        shown.contains(&format!("venv {} (the submitter's", venv.display())),
        "{shown}"
    );
}

/// `--snapshot`: the code as it was at submit, whatever the checkout holds when each job
/// starts; run by a node that never had the checkout (a second agent, its own data
/// directory, the checkout gone), each node fetching the bundle once.
#[test]
fn a_snapshot_runs_the_code_as_submitted_on_any_node() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("1"));
    h.wait_agent();
    let repo = h.path("snap");
    std::fs::create_dir_all(repo.join("data")).expect("mkdir");
    std::fs::write(repo.join("data/v.txt"), "submitted\n").expect("data");
    std::fs::write(
        repo.join("run.sh"),
        // A job that changes its tree: the next attempt starts from the code as submitted.
        "#!/bin/sh\nsleep 0.3\necho \"code=$(cat data/v.txt) from=$HEADROOM_SUBMIT_DIR \
         owner=$(stat -c %U .)\"\necho tampered >> data/v.txt\n",
    )
    .expect("script");
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    std::fs::write(
        repo.join("spec.yaml"),
        "name: snap\ncommand: [sh, run.sh]\nruns_per_config: 4\n\
         resources: {gpus: 1, memory: 1GiB}\n",
    )
    .expect("spec");
    let out = h.cli_in(Some(&repo), &[], &["submit", "spec.yaml", "--snapshot"]);
    let exp = submitted_id(&ok(out, "submit"));
    // Queued jobs meet a changed checkout.
    std::fs::write(repo.join("data/v.txt"), "edited\n").expect("edit");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "{jobs:?}"
    );
    let canon = repo.canonicalize().expect("canonical");
    // Unpacked for each attempt by the job's own user (`nobody` under a root agent).
    let owner = if nix::unistd::geteuid().is_root() {
        "nobody".to_string()
    } else {
        nix::unistd::User::from_uid(nix::unistd::geteuid())
            .ok()
            .flatten()
            .map(|u| u.name)
            .unwrap_or_default()
    };
    for log in log_of(&h, exp) {
        assert!(
            log.contains(&format!(
                "code=submitted from={} owner={owner}",
                canon.display()
            )),
            "{log}"
        );
    }
    let rows = export_rows(&h, exp);
    let hash = rows[0]["code_hash"]
        .as_str()
        .expect("code_hash")
        .to_string();
    assert_eq!(hash.len(), 64);
    let agent_log = h.server_log();
    assert_eq!(
        agent_log.matches("code bundle fetched").count(),
        1,
        "fetched once for 4 jobs on one node:\n{agent_log}"
    );

    // Node1's one slot held, only node2 can take the retries.
    let blocker = h.submit_spec(serde_json::json!({
        "name": "hold", "command": ["sleep", "30"], "resources": {"gpus": 1, "memory": "1GiB"}
    }));
    h.wait_for("the holder to run", Duration::from_secs(30), || {
        let j = h.jobs(blocker)?;
        Ok((j[0].state == JobState::Running).then_some(()))
    });
    // A second node that never had the checkout.
    std::fs::remove_dir_all(&repo).expect("checkout gone");
    let token = ok(
        h.cli(&["token", "create", "--name", "node2", "--role", "agent"]),
        "agent token",
    )
    .trim()
    .to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let node2 = headroom_integration_tests::standalone::Agent::start(
        &h.url,
        dir.path(),
        headroom_integration_tests::standalone::AgentOptions::node("node2")
            .env("HEADROOM_AGENT_TOKEN", &token),
    )
    .expect("second agent");
    h.wait_for("node2 to register", Duration::from_secs(30), || {
        Ok(h.nodes()?
            .iter()
            .any(|n| n.name == "node2" && n.alive)
            .then_some(()))
    });
    ok(h.cli(&["retry", &jobs[0].id.to_string()]), "retry");
    ok(h.cli(&["retry", &jobs[1].id.to_string()]), "retry");
    h.wait_for("both retries to end", Duration::from_secs(60), || {
        let j = h.jobs(exp)?;
        Ok(j.iter().all(|j| j.state.is_terminal()).then_some(()))
    });
    for j in &h.jobs(exp).expect("jobs")[..2] {
        let d = h.job(j.id).expect("job");
        let last = d.attempts_detail.last().expect("attempt");
        assert_eq!(last.node, "node2", "{d:?}");
        assert_eq!(j.state, JobState::Succeeded, "{d:?}");
        let log = h.cli_ok(&["logs", &last.id.to_string()]);
        assert!(log.contains("code=submitted"), "{log}");
    }
    let node2_log = node2.output();
    assert_eq!(
        node2_log.matches("code bundle fetched").count(),
        1,
        "{node2_log}"
    );
    ok(h.cli(&["cancel", &blocker.to_string()]), "cancel");
}

/// What a submit can tell on this host is refused before anything is stored, naming the
/// field: a working directory that does not exist, a conda environment this host lacks, a
/// snapshot over the coordinator's cap, a directory the jobs' Unix user may not enter.
#[test]
fn a_submission_this_host_shows_wrong_is_refused_naming_the_field() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").flags(&["--max-bundle-size", "1MiB"]));
    h.wait_agent();
    let dir = h.path("proj");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let refused = |spec: &str, flags: &[&str]| -> String {
        std::fs::write(dir.join("spec.yaml"), spec).expect("spec");
        let mut args = vec!["submit", "spec.yaml"];
        args.extend_from_slice(flags);
        let out = h.cli_in(Some(&dir), &[("VIRTUAL_ENV", "")], &args);
        assert!(!out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let base = "name: bad\ncommand: [\"true\"]\n";
    let err = refused(&format!("{base}workdir: missing\n"), &[]);
    assert!(err.contains("workdir:") && err.contains("missing"), "{err}");
    let err = refused(&format!("{base}environment: {{conda: no-such-env}}\n"), &[]);
    assert!(
        err.contains("environment.conda:") && err.contains("no-such-env"),
        "{err}"
    );
    // 2 MiB of noise does not compress under the coordinator's 1 MiB.
    let mut noise = vec![0u8; 2 << 20];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").expect("urandom"),
        &mut noise,
    )
    .expect("noise");
    std::fs::write(dir.join("weights.bin"), noise).expect("noise");
    let err = refused(base, &["--snapshot"]);
    assert!(
        err.contains("snapshot") && err.contains("--max-bundle-size"),
        "{err}"
    );
    // Jobs that run as another user, from a folder that user may not enter.
    if let Some(other) = headroom_integration_tests::other_user() {
        use std::os::unix::fs::PermissionsExt;
        h.cli_ok(&[
            "user",
            "create",
            "admin",
            "--role",
            "admin",
            "--unix-user",
            &other.name,
        ]);
        std::fs::remove_file(dir.join("weights.bin")).expect("rm");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let err = refused(base, &[]);
        assert!(
            err.contains("workdir:")
                && err.contains(&format!("`{}`", other.name))
                && err.contains(&format!("may not search (x) {}", dir.display())),
            "{err}"
        );
    }
    assert!(
        h.api(|c| async move { c.experiments().await })
            .expect("experiments")
            .is_empty(),
        "nothing stored"
    );
}

/// Root on a root-squashed NFS home is root without `CAP_DAC_OVERRIDE` and
/// `CAP_DAC_READ_SEARCH`: an agent with those dropped runs a job whose working directory
/// is its user's own private one (entered as that user); a directory that user may not
/// enter fails the attempt with class `workdir`, naming the path, the user and the folder
/// it may not search, and is not retried.
#[test]
fn a_job_enters_its_directory_as_its_user_even_where_root_may_not() {
    use std::os::unix::fs::PermissionsExt;
    let Some(other) = headroom_integration_tests::other_user() else {
        return;
    };
    if Command::new("capsh").arg("--help").output().is_err() {
        headroom_integration_tests::premise_missing("capsh (libcap2-bin)");
        return;
    }
    let wrapper_dir = tempfile::tempdir().expect("tempdir");
    let wrapper = wrapper_dir.path().join("squashed-agent");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec capsh --drop=cap_dac_override,cap_dac_read_search -- -c \
             'exec \"$0\" \"$@\"' {} \"$@\"\n",
            binary("headroom-agent").display()
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // Tokenless (this machine only): every job runs as the agent's default user.
    let coord_dir = tempfile::tempdir().expect("tempdir");
    let coord = headroom_integration_tests::standalone::Coordinator::start(coord_dir.path(), &[])
        .expect("coordinator");
    let cli = |args: &[&str]| {
        let out = Command::new(binary("headroom"))
            .args(["--server", &coord.url])
            .args(args)
            .current_dir(coord_dir.path())
            .output()
            .expect("cli");
        ok(out, &format!("{args:?}"))
    };
    let agent = headroom_integration_tests::standalone::Agent::start(
        &coord.url,
        coord_dir.path(),
        headroom_integration_tests::standalone::AgentOptions::node("sq1")
            .program(&wrapper)
            .flags(&["--run-as-default", &other.name]),
    )
    .expect("agent");
    agent.wait_registered(&coord.url);

    // The user's own private directory, which root without those capabilities may not read.
    let home = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let own = home.path().join("own");
    std::fs::create_dir(&own).expect("mkdir");
    std::fs::write(own.join("marker"), "mine\n").expect("marker");
    let ids = |p: &Path| {
        nix::unistd::chown(p, Some(other.uid), Some(other.gid)).expect("chown");
    };
    ids(&own);
    ids(&own.join("marker"));
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    // Root's, which the job's user may not enter.
    let closed = home.path().join("closed");
    std::fs::create_dir_all(closed.join("proj")).expect("mkdir");
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");

    let submit = |name: &str, workdir: &Path| {
        let body = serde_json::json!({
            "spec": {
                "name": name, "command": ["cat", "marker"],
                "resources": {"gpus": 1, "memory": "1GiB"},
                "retry": {"max_attempts": 3, "on": ["lost", "launch_error", "nonzero"]},
            },
            "workdir": workdir,
        });
        let (status, answer) =
            headroom_integration_tests::http_post(&format!("{}/v1/experiments", coord.url), &body)
                .expect("submit");
        assert_eq!(status, 200, "{answer}");
        serde_json::from_value::<headroom_shared::api::SubmitResponse>(answer)
            .expect("answer")
            .experiment
            .expect("stored")
    };
    let done = |exp| {
        let mut last = None;
        for _ in 0..300 {
            let jobs = headroom_integration_tests::standalone::jobs_of(&coord.url, exp);
            if let Some(j) = jobs.as_ref().and_then(|j| j.first())
                && j.state.is_terminal()
            {
                return j.clone();
            }
            last = jobs;
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("job did not end: {last:?}\n{}", agent.output());
    };
    let mine = done(submit("own-dir", &own));
    assert_eq!(
        mine.state,
        JobState::Succeeded,
        "{mine:?}\n{}",
        agent.output()
    );
    // Its log reaches the coordinator though root may not read the user's files.
    let log = cli(&["logs", &mine.id.to_string()]);
    assert!(log.contains("mine"), "{log}");
    let theirs = done(submit("closed-dir", &closed.join("proj")));
    assert_eq!(theirs.state, JobState::Failed, "{theirs:?}");
    assert_eq!(theirs.attempts, 1, "not retried: {theirs:?}");
    let detail = cli(&["show", &theirs.id.to_string(), "--output", "json"]);
    let detail: Value = serde_json::from_str(&detail).expect("json");
    let attempt = &detail["attempts_detail"][0];
    assert_eq!(attempt["failure_class"], "workdir", "{detail}");
    let log = attempt["log_tail"].as_str().unwrap_or_default().to_string();
    for needed in [
        closed.join("proj").display().to_string(),
        format!("`{}`", other.name),
        format!("may not search (x) {}", closed.display()),
        "mode 700".to_string(),
    ] {
        assert!(log.contains(&needed), "`{needed}` missing from:\n{log}");
    }
}
