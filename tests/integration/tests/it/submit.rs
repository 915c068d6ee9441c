//! Submitting: refused specs name the field and store nothing; dry runs store nothing;
//! expansion is deterministic for a seed; logs reach the user.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions};
use headroom_shared::JobState;

fn up() -> Headroom {
    Headroom::up(UpOptions::default())
}

#[test]
fn refused_specs_name_the_field_and_store_nothing() {
    let h = up();
    let cases: &[(&str, &str)] = &[
        ("name: a\ncommand: [x]\nbogus: 1\n", "bogus"),
        ("name: a\ncommand: [x, '{lr}']\n", "command[1]"),
        ("name: a\ncommand: [x]\ngrid: {lr: []}\n", "grid.lr"),
        (
            "name: a\ncommand: [x]\nresources: {memory: big}\n",
            "resources.memory",
        ),
        (
            "name: a\ncommand: [x]\nresources: {gpus: 3}\n",
            "resources.gpus",
        ),
        ("name: a\ncommand: [x]\ntimeout: -3\n", "timeout"),
        (
            "name: a\ncommand: [x]\nmutate: {lr: {log_uniform: [0, 1]}}\n",
            "mutate.lr",
        ),
        (
            "name: a\ncommand: [x]\nruns_per_config: 0\n",
            "runs_per_config",
        ),
        (
            "name: a\ncommand: [x]\ngrid: {a: [1,2,3,4,5,6,7,8,9,10]}\nruns_per_config: 20000\n",
            "cap",
        ),
    ];
    for (i, (yaml, needle)) in cases.iter().enumerate() {
        let path = h.path(&format!("bad{i}.yaml"));
        std::fs::write(&path, yaml).expect("write");
        let out = h.cli(&["submit", path.to_str().expect("path")]);
        assert!(!out.status.success(), "{yaml} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(needle),
            "error for\n{yaml}does not name {needle}: {err}"
        );
    }
    // The API answers 422 in the documented shape.
    let (status, body) = h
        .post(
            "/v1/experiments",
            &serde_json::json!({"spec": {"name": "a", "command": ["x"], "runs_per_config": 0}}),
        )
        .expect("post");
    assert_eq!(status, 422);
    assert_eq!(body["error"]["field"], "runs_per_config");
    assert_eq!(body["error"]["code"], "invalid");
    let (status, body) = h
        .post("/v1/experiments", &serde_json::json!({"nope": 1}))
        .expect("post");
    assert!((400..500).contains(&status), "{status} {body}");
    assert!(body["error"]["message"].is_string());
    // Nothing was stored.
    let exps: Vec<serde_json::Value> = h.get("/v1/experiments").expect("experiments");
    assert!(exps.is_empty(), "{exps:?}");
    let jobs: Vec<serde_json::Value> = h.get("/v1/jobs").expect("jobs");
    assert!(jobs.is_empty());
}

#[test]
fn dry_run_expands_deterministically_and_stores_nothing() {
    let h = up();
    // The schedule a dry run prints is the live nodes': the same once the node is there.
    h.wait_agent();
    let path = h.path("sweep.yaml");
    std::fs::write(
        &path,
        "name: sweep\ncommand: [train, '--lr={lr}', '--opt={opt}']\ngrid: {bs: [32, 64]}\n\
         mutate: {lr: {log_uniform: [1.0e-4, 1.0e-2]}, opt: {choice: [adam, sgd]}}\nmutations: 3\n",
    )
    .expect("write");
    let a = h.cli_ok(&[
        "submit",
        "--dry-run",
        "--seed",
        "11",
        path.to_str().expect("path"),
    ]);
    let b = h.cli_ok(&[
        "submit",
        "--dry-run",
        "--seed",
        "11",
        path.to_str().expect("path"),
    ]);
    let c = h.cli_ok(&[
        "submit",
        "--dry-run",
        "--seed",
        "12",
        path.to_str().expect("path"),
    ]);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(
        a.contains("expands to 6 jobs") && a.contains("nothing stored"),
        "{a}"
    );
    assert!(a.contains("--lr=0.0"), "{a}");
    let jobs: Vec<serde_json::Value> = h.get("/v1/jobs").expect("jobs");
    assert!(jobs.is_empty());
}

#[test]
fn jobs_get_their_environment_and_logs_reach_the_user() {
    let h = up();
    let spec = serde_json::json!({
        "name": "env", "command": ["sh", "-c", "env | sort; echo done-{bs}"],
        "grid": {"bs": [64]}, "env": {"EXTRA": "yes"}, "resources": {"memory": "1GiB"}
    });
    let exp = h.submit_spec(spec);
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let log = h.cli_ok(&["logs", &jobs[0].id.to_string()]);
    for line in [
        "HP_BS=64",
        "EXTRA=yes",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "OMP_NUM_THREADS=1",
        "TOKENIZERS_PARALLELISM=false",
        "MKL_NUM_THREADS=1",
        "done-64",
    ] {
        assert!(log.lines().any(|l| l == line), "log lacks {line}:\n{log}");
    }
    let gpu = &jobs[0].gpu_indices;
    assert!(
        log.contains(&format!("CUDA_VISIBLE_DEVICES={}", gpu[0])),
        "{log}"
    );
    assert!(log.contains(&format!("HEADROOM_JOB_ID={}", jobs[0].id)));
    assert!(log.contains("HEADROOM_ATTEMPT_ID="));
    let followed = h.cli_ok(&["logs", "-f", &jobs[0].id.to_string()]);
    assert_eq!(followed, log);
    let ls = h.cli_ok(&["ls"]);
    assert!(ls.contains("succeeded") && ls.contains("bs=64"), "{ls}");
}

/// A job that prints more than the coordinator keeps: its log there (in the store, which
/// replicas share) holds the bound's worth and a line saying it was cut, not 3 MB; the job
/// succeeds, and its node's own log file keeps every byte.
#[test]
fn a_log_past_its_bound_is_cut_with_a_line_saying_so() {
    let h = Headroom::up(UpOptions::default().flags(&["--max-log-size", "1MiB"]));
    let spec = serde_json::json!({
        "name": "chatty", "command": ["sh", "-c",
            "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo the-very-end"],
    });
    let exp = h.submit_spec(spec);
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let log = h.cli_ok(&["logs", &jobs[0].id.to_string()]);
    assert!(log.len() < 1024 * 1024 + 1024, "{} bytes kept", log.len());
    assert!(log.starts_with(&"x".repeat(1000)));
    assert!(
        log.contains("[headroom: this log is cut here, at 1.0 MiB of output"),
        "{}",
        &log[log.len().saturating_sub(300)..]
    );
    assert!(!log.contains("the-very-end"));
    // In the store (which replicas share), not in files beside it.
    assert!(!h.data_dir().join("logs").exists());
    // The node's own file has it all.
    let node_logs = h.data_dir().join("agent").join("logs");
    let whole = std::fs::read_dir(&node_logs)
        .expect("the node's logs")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .any(|text| text.contains("the-very-end") && text.len() > 3_000_000);
    assert!(whole, "the node's log lost the end");
}

/// `headroom submit --dry-run ... | head -1`: the reader goes away after a line, and the
/// command ends quietly as `ls` would (141, nothing on stderr), not with a panic (101). A
/// dry run of 50,000 jobs prints its first 1,000 and says how many more.
#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    use std::io::BufRead;
    let h = up();
    let path = h.path("wide.yaml");
    std::fs::write(
        &path,
        "name: wide\ncommand: [train, '--lr={lr}', '--padding-to-fill-the-pipe-well-past-its-sixty-four-kilobytes-of-buffer-{run}']\n\
         grid: {lr: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\nruns_per_config: 5000\n",
    )
    .expect("write");
    let whole = h.cli_ok(&["submit", "--dry-run", path.to_str().expect("path")]);
    assert!(whole.contains("expands to 50000 jobs"), "{}", &whole[..200]);
    assert!(whole.contains("and 49000 more jobs, not shown"));
    let mut child = std::process::Command::new(headroom_integration_tests::binary("headroom"))
        .args(["--server", &h.url, "submit", "--dry-run"])
        .arg(&path)
        .env("HEADROOM_TOKEN", h.admin_token().expect("token"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let mut first = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut first)
        .expect("a line");
    assert!(first.starts_with("dry run"), "{first}");
    // `head -1` is done: its end of the pipe closes here.
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(141), "{err}");
}

/// A job is named as people name it: `EXPERIMENT/INDEX`, or a unique start of its id (as git
/// takes a short commit id); a start several ids share is refused naming them, so nothing
/// acts on the wrong job.
#[test]
fn jobs_are_named_by_experiment_and_index_or_a_unique_start_of_their_id() {
    let h = up();
    let exp = h.submit_spec(serde_json::json!({"name": "named",
        "command": ["sh", "-c", "echo job-{x}"], "grid": {"x": [0, 1, 2]}}));
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    let by_index = |i: u32| jobs.iter().find(|j| j.index == i).expect("job").id;
    let shown = h.cli_ok(&["show", "named/1", "--output", "json"]);
    let detail: serde_json::Value = serde_json::from_str(&shown).expect("json");
    assert_eq!(detail["id"], by_index(1).to_string(), "{detail}");
    assert!(h.cli_ok(&["logs", "named/2"]).contains("job-2"));
    // The whole id but its last character: one job.
    let full = by_index(0).to_string();
    let log = h.cli_ok(&["logs", &full[..full.len() - 1]]);
    assert!(log.contains("job-0"), "{log}");
    // Ids of one experiment share their first characters: refused, naming the candidates.
    let out = h.cli(&["retry", &full[..8]]);
    assert!(!out.status.success(), "a shared start retried some job");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("give more of it") && err.contains(&full[..8]),
        "{err}"
    );
    let out = h.cli(&["show", "named/7"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no job of index 7"));
    let retried = h.cli_ok(&["retry", "named/0"]);
    assert!(retried.contains(&full), "{retried}");
}

/// The edges a script touches: `submit --output json` prints the API's answer (the id in a
/// field, no prose); `logs --attempt N --tail K` reads the last lines of one attempt; `ls`
/// keeps its columns in line whatever the experiment names' lengths; a failed job makes
/// `submit --wait` exit 3, not 2 (bad usage).
#[test]
fn submit_speaks_json_logs_take_an_attempt_and_a_tail_and_ls_keeps_its_columns() {
    let h = up();
    let spec = h.path("count.yaml");
    std::fs::write(
        &spec,
        "name: a-rather-long-experiment-name-for-the-table\ncommand: [sh, -c, 'for i in 1 2 3 4 5; do echo line$i; done; exit 1']\nretry: {max_attempts: 2, on: [nonzero]}\n",
    )
    .expect("spec");
    let out = h.cli(&[
        "submit",
        "--wait",
        "--output",
        "json",
        spec.to_str().expect("path"),
    ]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let answer: serde_json::Value =
        serde_json::from_str(&stdout).expect("stdout is one JSON document");
    assert_eq!(
        answer["name"],
        "a-rather-long-experiment-name-for-the-table"
    );
    assert_eq!(answer["jobs"], 1);
    let exp = answer["experiment"]
        .as_str()
        .expect("experiment id")
        .to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("a-rather-long-experiment-name-for-the-table done:"),
        "the progress names the experiment: {stderr}"
    );
    let job = format!("{exp}/0");
    assert_eq!(
        h.cli_ok(&["logs", &job, "--attempt", "1", "--tail", "2"]),
        "line4\nline5\n"
    );
    assert_eq!(h.cli_ok(&["logs", &job, "-n", "1"]), "line5\n");
    let refused = h.cli(&["logs", &job, "--attempt", "3"]);
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("no attempt #3 (it has 2)"), "{err}");

    h.submit_spec(serde_json::json!({"name": "b", "command": ["true"]}));
    let table = h.cli_ok(&["ls"]);
    let state_at: Vec<usize> = table
        .lines()
        .map(|l| {
            [
                "STATE",
                "failed",
                "queued",
                "leased",
                "running",
                "succeeded",
            ]
            .iter()
            .filter_map(|w| l.find(&format!("  {w}")))
            .min()
            .expect("a state on every line")
        })
        .collect();
    assert!(state_at.windows(2).all(|w| w[0] == w[1]), "{table}");
}

/// Seed 004's farm: plan `2,2,2,2,2,2,2` on 7 x 23.52 GiB. Declared at its steady 10 GiB the
/// dry run fills the 14 slots; once runs of each task have peaked at 15 GiB (evaluation),
/// the learned estimate says no two share a GPU: 7 at once, said in words, with the makespan
/// from those runs' times. Nothing is stored by either dry run.
#[test]
fn a_dry_run_schedules_the_farm_on_the_live_nodes_with_learned_peaks() {
    let h = Headroom::up(UpOptions::gpus("7x23.52GiB").plan("2,2,2,2,2,2,2"));
    h.wait_agent();
    let farm =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lora-farm.yaml");
    let farm = farm.to_str().expect("path");
    let out = h.cli_ok(&["submit", farm, "--dry-run"]);
    assert!(
        out.contains("schedule on the live nodes (14 slots in their plans): 14 jobs at once"),
        "{out}"
    );
    assert!(
        out.contains("gla-lora: 14 jobs, 14 at once, 10GiB declared"),
        "{out}"
    );
    assert!(out.contains("makespan unknown: 14 jobs"), "{out}");
    // One run of each task, peaking at its evaluation's 15 GiB (as the seed found, two of
    // them meeting on a GPU OOM; their retries run with the raised estimate).
    let learn = h.path("learn.yaml");
    std::fs::write(
        &learn,
        format!(
            "name: gla-lora\ncommand: [{}, --mem, 15GiB, --seconds, '0.5']\n\
             grid: {{task: [qnli, sst2, mnli, rte, cola, mrpc, qqp], batch_size: [4], grad_accum: [8]}}\n\
             memory_key: [task, batch_size]\nresources: {{gpus: 1, memory: 10GiB}}\n\
             retry: {{max_attempts: 3, on: [oom]}}\n",
            headroom_integration_tests::fake_job().display()
        ),
    )
    .expect("spec");
    let exp = h
        .submit("learn", &std::fs::read_to_string(&learn).expect("spec"))
        .expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(120));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "{jobs:?}"
    );
    let before: Vec<serde_json::Value> = h.get("/v1/experiments").expect("experiments");
    // The farm with the same memory key, as the example declares it.
    let keyed = h.path("farm.yaml");
    let spec = std::fs::read_to_string(farm).expect("farm") + "memory_key: [task, batch_size]\n";
    std::fs::write(&keyed, spec).expect("spec");
    let out = h.cli_ok(&["submit", keyed.to_str().expect("path"), "--dry-run"]);
    assert!(
        out.contains("14 slots in their plans): 7 jobs at once"),
        "{out}"
    );
    assert!(
        out.contains("gla-lora: 14 jobs, 7 at once, 16.5GiB learned"),
        "{out}"
    );
    assert!(
        out.contains("no two share a GPU") && out.contains("21.2 GiB usable"),
        "{out}"
    );
    assert!(out.contains("expected makespan: "), "{out}");
    let after: Vec<serde_json::Value> = h.get("/v1/experiments").expect("experiments");
    assert_eq!(before.len(), after.len(), "a dry run stores nothing");
}

/// `max_concurrent: 3` (Slurm's array `%3`): 9 jobs on 8 free slots never run more than 3
/// at a time, and all of them end.
#[test]
fn max_concurrent_never_runs_one_more_than_asked() {
    let h = Headroom::up(UpOptions::gpus("2x24GiB").plan("4,4"));
    let spec = format!(
        "name: capped\ncommand: [{}, --seconds, '0.6']\nruns_per_config: 9\n\
         resources: {{gpus: 1, memory: 1GiB}}\nmax_concurrent: 3\n",
        headroom_integration_tests::fake_job().display()
    );
    let exp = h.submit("capped", &spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(120));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "{jobs:?}"
    );
    // Each attempt held its job from its lease to its end: at no moment more than 3 at once.
    let spans: Vec<(i64, i64)> = jobs
        .iter()
        .map(|j| {
            let a = h.first_attempt(j.id);
            let end = a.ended_at.expect("ended");
            (a.leased_at.timestamp_millis(), end.timestamp_millis())
        })
        .collect();
    let most = spans
        .iter()
        .map(|&(at, _)| spans.iter().filter(|&&(s, e)| s <= at && at < e).count())
        .max()
        .unwrap_or(0);
    assert!(most <= 3, "{most} at once: {spans:?}");
    assert!(
        most >= 2,
        "the cap, not a single slot, bounds it: {spans:?}"
    );
    // A cap of 0 is refused, naming the field.
    let zero = h.path("zero.yaml");
    std::fs::write(&zero, "name: z\ncommand: [x]\nmax_concurrent: 0\n").expect("spec");
    let out = h.cli(&["submit", zero.to_str().expect("path")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_concurrent: must be at least 1"), "{err}");
}
