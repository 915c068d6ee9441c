//! Studies: one spec file of variants over shared defaults, each variant an experiment of its
//! own under one study id; jobs that wait for others (`after`); refusals that name the
//! variant's field and store nothing.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use headroom_integration_tests::{Headroom, UpOptions, path_with_binaries};
use headroom_shared::api::{ExperimentSummary, JobSummary};
use headroom_shared::{JobId, JobState};

fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// `headroom up` with the built binaries first on its `PATH`, as after an install: the
/// example's `headroom-fake-job` is found by name.
fn up(gpus: &str, plan: Option<&str>) -> Headroom {
    let path = path_with_binaries();
    let mut opts = UpOptions::gpus(gpus).env("PATH", path.to_str().expect("PATH"));
    if let Some(p) = plan {
        opts = opts.plan(p);
    }
    Headroom::up(opts)
}

fn experiments(h: &Headroom) -> Vec<ExperimentSummary> {
    h.get("/v1/experiments").expect("experiments")
}

/// The jobs of the study's experiment named `STUDY.VARIANT`.
fn jobs_of(h: &Headroom, name: &str) -> Vec<JobSummary> {
    let exp = experiments(h)
        .into_iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no experiment {name}"));
    h.jobs(exp.id).expect("jobs")
}

/// The seed's runs per model: 160 in all (seed 001, `mutation_all_models_2x_dynamic.json`).
const SEED_001_RUNS: [(&str, usize); 11] = [
    ("mnist", 12),
    ("mnist_rnn", 12),
    ("mnist_ff", 12),
    ("siamese", 12),
    ("mrt-oast", 20),
    ("densenet121", 16),
    ("hrnet18", 16),
    ("pcb", 16),
    ("resnet20", 16),
    ("vulberta-mlp", 16),
    ("bug-localization", 12),
];

#[test]
fn the_seed_s_study_file_is_one_submit_of_160_runs_each_model_with_its_own_parameters() {
    let h = up("2x10GiB", Some("4,4"));
    let spec = repo_root().join("examples/seed-001-study.yaml");
    let spec = spec.to_str().expect("path");
    let out = h.cli_ok(&["submit", spec, "--wait"]);
    assert!(
        out.contains("submitted study mutation-2x") && out.contains("160 jobs in 11 experiments"),
        "{out}"
    );
    let exps = experiments(&h);
    assert_eq!(exps.len(), 11, "{exps:?}");
    let study = exps[0].study.clone().expect("a study");
    assert_eq!(study.name, "mutation-2x");
    let mut total = 0;
    for (variant, runs) in SEED_001_RUNS {
        let exp = exps
            .iter()
            .find(|e| e.name == format!("mutation-2x.{variant}"))
            .unwrap_or_else(|| panic!("no variant {variant}"));
        assert_eq!(exp.study.as_ref(), Some(&study), "one study id for all");
        assert_eq!(exp.counts.total(), runs as u64, "{variant}");
        assert_eq!(
            exp.counts.succeeded, runs as u64,
            "{variant}: {:?}",
            exp.counts
        );
        total += runs;
    }
    assert_eq!(total, 160);
    // Each variant its own parameters: MRT-OAST mutates dropout, mnist_ff keeps the batch
    // that fit, the re-ID models share a droprate range (a YAML alias), none has another's.
    let mrt = jobs_of(&h, "mutation-2x.mrt-oast");
    assert!(mrt.iter().all(|j| j.params.contains_key("dropout")));
    assert!(mrt.iter().all(|j| !j.params.contains_key("droprate")));
    let ff = jobs_of(&h, "mutation-2x.mnist_ff");
    assert!(ff.iter().all(|j| j.params["batch_size"] == 10000));
    let pcb = jobs_of(&h, "mutation-2x.pcb");
    assert!(pcb.iter().all(|j| {
        let d = j.params["droprate"].as_f64().unwrap_or(-1.0);
        (0.2..=0.7).contains(&d)
    }));
    // Its declared memory is each model's own.
    assert!(pcb.iter().all(|j| j.estimate_mib == Some(2300)));
    assert!(ff.iter().all(|j| j.estimate_mib == Some(600)));
}

#[test]
fn a_dry_run_of_the_study_lists_each_variant_and_stores_nothing() {
    let h = up("1x10GiB", None);
    let spec = repo_root().join("examples/seed-001-study.yaml");
    let out = h.cli_ok(&["submit", spec.to_str().expect("path"), "--dry-run"]);
    assert!(
        out.contains("study mutation-2x expands to 160 jobs in 11 experiments"),
        "{out}"
    );
    assert!(
        out.contains("study mutation-2x expands to 160 jobs in 11 experiments (seed 2025)")
            && out.contains("mutation-2x.densenet121 (16 jobs, seed 2025): 1 GPU, 4GiB each"),
        "{out}"
    );
    // Each model's epoch, declared: the longest first, ties as written.
    assert!(
        out.contains(
            "queued longest first: bug-localization, densenet121, hrnet18, pcb, mrt-oast, \
             resnet20, vulberta-mlp, siamese, mnist, mnist_rnn, mnist_ff"
        ) && out.contains("mutation-2x.bug-localization (12 jobs, seed 2025): 1 GPU, 2.2GiB each, runs of 12m 30s (declared)"),
        "{out}"
    );
    // A job that waits is not among those that run at once.
    h.wait_agent();
    let chain = h.path("chain.yaml");
    std::fs::write(&chain, train_eval_study(h.dir.path(), "cancel")).expect("spec");
    let out = h.cli_ok(&["submit", chain.to_str().expect("path"), "--dry-run"]);
    assert!(out.contains("lab.eval: 4 jobs, 0 at once"), "{out}");
    assert!(!out.contains("lab.train: 4 jobs, 0 at once"), "{out}");
    assert!(experiments(&h).is_empty());
}

/// A study's train (4 configurations by rows) and eval matched on `model, lr`: train's
/// configuration `a, 2` fails while its flag file exists.
fn train_eval_study(dir: &Path, eval_on_failure: &str) -> String {
    format!(
        r#"name: lab
rows: [{{model: a, lr: 1}}, {{model: a, lr: 2}}, {{model: b, lr: 1}}, {{model: b, lr: 2}}]
resources: {{gpus: 1, memory: 1GiB}}
experiments:
  - name: train
    shell: true
    command: ["headroom-fake-job --mem 1GiB --seconds 1.5 && test ! -e {dir}/fail-{{model}}-{{lr}}"]
  - name: eval
    command: [headroom-fake-job, --seconds, "0.2", --print, "eval {{model}} {{lr}}"]
    after: [{{experiment: train, match: [model, lr], on_failure: {eval_on_failure}}}]
"#,
        dir = dir.display()
    )
}

fn by_params(jobs: &[JobSummary]) -> BTreeMap<String, &JobSummary> {
    jobs.iter()
        .map(|j| (format!("{}-{}", j.params["model"], j.params["lr"]), j))
        .collect()
}

fn wait_until(h: &Headroom, what: &str, done: impl Fn(&Headroom) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done(h) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn all_ended(h: &Headroom, name: &str) -> bool {
    jobs_of(h, name).iter().all(|j| j.state.is_terminal())
}

#[test]
fn eval_waits_for_its_own_training_and_a_failure_cancels_only_its_eval() {
    let h = up("2x10GiB", Some("4,4"));
    std::fs::write(h.path("fail-a-2"), "").expect("flag");
    let spec = h.path("study.yaml");
    std::fs::write(&spec, train_eval_study(h.dir.path(), "cancel")).expect("spec");
    h.cli_ok(&["submit", spec.to_str().expect("path")]);
    // While training runs, every eval job waits and says what for.
    let evals = jobs_of(&h, "lab.eval");
    assert_eq!(evals.len(), 4);
    for j in &evals {
        assert_eq!(j.state, JobState::Queued, "{j:?}");
        let why = j.pending_reason.as_ref().map(|r| r.to_string());
        assert_eq!(
            why.as_deref(),
            Some("waits for 1 job of `lab.train` to succeed"),
            "{j:?}"
        );
    }
    wait_until(&h, "the study's end", |h| {
        all_ended(h, "lab.train") && all_ended(h, "lab.eval")
    });
    let train = jobs_of(&h, "lab.train");
    let evals = jobs_of(&h, "lab.eval");
    let (train, evals) = (by_params(&train), by_params(&evals));
    for (k, j) in &evals {
        if k == "\"a\"-2" {
            assert_eq!(train[k].state, JobState::Failed);
            assert_eq!(
                j.state,
                JobState::Cancelled,
                "only its own eval is cancelled"
            );
            assert_eq!(j.attempts, 0, "it never ran");
            continue;
        }
        assert_eq!(j.state, JobState::Succeeded, "{k}: {j:?}");
        // It started only once the training it needs had ended.
        let trained = h.first_attempt(train[k].id).ended_at.expect("ended");
        let started = h.first_attempt(j.id).leased_at;
        assert!(
            started >= trained,
            "{k}: eval leased {started} before train ended {trained}"
        );
    }
    // `retry --cascade` runs the failed training and its cancelled eval again.
    std::fs::remove_file(h.path("fail-a-2")).expect("unflag");
    let failed: JobId = train["\"a\"-2"].id;
    let out = h.cli_ok(&["retry", &failed.to_string(), "--cascade"]);
    assert!(out.contains("and 1 job waiting for it"), "{out}");
    wait_until(&h, "the retried pair", |h| {
        all_ended(h, "lab.train") && all_ended(h, "lab.eval")
    });
    let states: Vec<JobState> = jobs_of(&h, "lab.eval").iter().map(|j| j.state).collect();
    assert!(
        states.iter().all(|s| *s == JobState::Succeeded),
        "{states:?}"
    );
}

#[test]
fn with_on_failure_wait_the_eval_waits_for_a_retry_and_says_so() {
    let h = up("2x10GiB", Some("4,4"));
    std::fs::write(h.path("fail-a-2"), "").expect("flag");
    let spec = h.path("study.yaml");
    std::fs::write(&spec, train_eval_study(h.dir.path(), "wait")).expect("spec");
    h.cli_ok(&["submit", spec.to_str().expect("path")]);
    wait_until(&h, "training's end", |h| all_ended(h, "lab.train"));
    wait_until(&h, "three evals", |h| {
        jobs_of(h, "lab.eval")
            .iter()
            .filter(|j| j.state == JobState::Succeeded)
            .count()
            == 3
    });
    let evals = jobs_of(&h, "lab.eval");
    let waiting = by_params(&evals)["\"a\"-2"].clone();
    assert_eq!(waiting.state, JobState::Queued);
    let train = jobs_of(&h, "lab.train");
    let failed = by_params(&train)["\"a\"-2"].id;
    // It names the job to run again.
    let why = waiting.pending_reason.as_ref().map(|r| r.to_string());
    let want = format!("1 ended otherwise: `headroom retry {failed} --cascade`");
    assert!(why.as_deref().is_some_and(|w| w.contains(&want)), "{why:?}");
    // A plain retry of the training is enough: the eval waiting for it starts once it
    // succeeds.
    std::fs::remove_file(h.path("fail-a-2")).expect("unflag");
    h.cli_ok(&["retry", &failed.to_string()]);
    wait_until(&h, "the waiting eval", |h| all_ended(h, "lab.eval"));
    let eval = h.job(waiting.id).expect("job");
    assert_eq!(eval.summary.state, JobState::Succeeded);
}

#[test]
fn bad_studies_are_refused_naming_the_variant_s_field_and_store_nothing() {
    let h = up("2x24GiB", None);
    std::fs::write(h.path("short.csv"), "model\na\nb\n").expect("csv");
    std::fs::write(h.path("ragged.csv"), "model,lr\na,1\nb\n").expect("csv");
    let cases: &[(&str, &str)] = &[
        (
            "name: s\ncommand: [x]\nexperiments: [{name: a, colour: red}]\n",
            "experiments[0].colour",
        ),
        (
            "name: s\ncommand: [x]\nexperiments: [{name: a}, {name: a}]\n",
            "experiments[1].name: `a` names two variants",
        ),
        (
            "name: s\ncommand: [x, '{p}', '{q}']\nexperiments:\n  - {name: a, zip: {p: [1, 2], q: [1]}}\n",
            "experiments[0].zip",
        ),
        (
            "name: s\ncommand: [x, '{model}', '{lr}']\nexperiments: [{name: a, rows: short.csv}]\n",
            "command[2]: placeholder {lr} names no parameter (grid, mutate or zip axis, or a rows \
             column) (in variant `a`)",
        ),
        (
            "name: s\ncommand: [x, '{model}', '{lr}']\nexperiments: [{name: a, rows: ragged.csv}]\n",
            "experiments[0].rows: ",
        ),
        (
            "name: s\ncommand: [x]\nexperiments:\n  - {name: a, after: [{experiment: b}]}\n  - {name: b, after: [{experiment: a}]}\n",
            "experiments[0].after: variants wait for each other in a circle: a → b → a",
        ),
        (
            "name: s\ncommand: [x]\nexperiments: [{name: a, after: [{experiment: nope}]}]\n",
            "experiments[0].after[0].experiment: no variant `nope`",
        ),
        (
            "name: s\ncommand: [x]\nexperiments: [{name: a, resources: {gpus: 3}}]\n",
            "experiments[0].resources.gpus",
        ),
        (
            "name: s\ncommand: [x]\nexperiments: [{name: a}, {name: b, expected_duration: 1 fortnight}]\n",
            "experiments[1].expected_duration: `1 fortnight` is not a duration",
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
    assert!(experiments(&h).is_empty(), "nothing stored");
    let jobs: Vec<serde_json::Value> = h.get("/v1/jobs").expect("jobs");
    assert!(jobs.is_empty());
}

/// A study spec written beside `h` whose jobs append their variant to a log (`LOG` in `yaml`
/// names it): its path, and the log's.
fn one_slot_study(h: &Headroom, yaml: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = h.path("order");
    std::fs::create_dir_all(&dir).expect("dir");
    // The jobs run as the test's job user, who writes there.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("mode");
    let log = dir.join("started.txt");
    let spec = h.path("study.yaml");
    let yaml = yaml.replace("LOG", &log.display().to_string());
    std::fs::write(&spec, yaml).expect("spec");
    (spec, log)
}

/// The variants that declare how long a run takes are queued longest first, ahead of those
/// that declare none (in the file's order): on one slot, the 2-hour variant written last runs
/// first, and the undeclared one written first runs last.
#[test]
fn a_study_queues_its_longest_declared_runs_first() {
    let h = up("1x10GiB", Some("1"));
    let (spec, log) = one_slot_study(
        &h,
        "name: lengths\nresources: {gpus: 1}\ncommand: [sh, -c, 'echo {v} >> LOG']\n\
         experiments:\n\
         \x20 - {name: plain, grid: {v: [plain]}}\n\
         \x20 - {name: quick, grid: {v: [quick]}, expected_duration: 1m}\n\
         \x20 - {name: long, grid: {v: [long]}, expected_duration: 2h}\n\
         \x20 - {name: plain2, grid: {v: [plain2]}}\n",
    );
    let out = h.cli_ok(&["submit", spec.to_str().expect("path"), "--wait"]);
    assert!(
        out.contains("4 experiments")
            && out.contains("queued longest first: long, quick, plain, plain2")
            && out.contains("runs of 2h (declared)"),
        "{out}"
    );
    let started = std::fs::read_to_string(&log).expect("the jobs' log");
    assert_eq!(
        started.lines().collect::<Vec<_>>(),
        ["long", "quick", "plain", "plain2"],
        "one slot takes the queue in its order"
    );
    // Listed as written, whatever their queue order.
    let names: Vec<String> = experiments(&h).into_iter().map(|e| e.name).collect();
    assert_eq!(
        names,
        [
            "lengths.plain",
            "lengths.quick",
            "lengths.long",
            "lengths.plain2"
        ]
    );
}

/// A variant that declares no length is queued by what its earlier runs took: the same study
/// submitted again runs its slow variant first, where the first submission ran the file's
/// order; `submit` says so.
#[test]
fn a_study_submitted_again_queues_the_variant_whose_runs_took_longest_first() {
    let h = up("1x10GiB", Some("1"));
    let (spec, log) = one_slot_study(
        &h,
        "name: again\nresources: {gpus: 1, memory: 1GiB}\n\
         command: [sh, -c, 'echo {v} >> LOG && headroom-fake-job --mem 100MiB --seconds {s}']\n\
         experiments:\n\
         \x20 - {name: quick, grid: {v: [quick], s: [0.1]}}\n\
         \x20 - {name: slow, grid: {v: [slow], s: [1.5]}}\n",
    );
    let first = h.cli_ok(&["submit", spec.to_str().expect("path"), "--wait"]);
    assert!(!first.contains("queued longest first"), "{first}");
    let again = h.cli_ok(&["submit", spec.to_str().expect("path"), "--wait"]);
    assert!(
        again.contains("queued longest first: slow, quick")
            && again.contains("(learned from its earlier runs)"),
        "{again}"
    );
    let started = std::fs::read_to_string(&log).expect("the jobs' log");
    assert_eq!(
        started.lines().collect::<Vec<_>>(),
        ["quick", "slow", "slow", "quick"],
        "the file's order, then the slow variant first"
    );
}

/// Lengths are learned from runs that left no GPU peak too: a CPU-only study's variants (and
/// jobs whose GPU memory could not be read) are ordered by how long their runs took.
#[test]
fn a_study_of_cpu_jobs_learns_its_variants_lengths_from_their_earlier_runs() {
    let h = up("1x10GiB", Some("1"));
    let (spec, _) = one_slot_study(
        &h,
        "name: cpu-again\nresources: {gpus: 0}\ncommand: [sleep, '{s}']\n\
         experiments:\n\
         \x20 - {name: quick, grid: {s: [0.1]}}\n\
         \x20 - {name: slow, grid: {s: [1.5]}}\n",
    );
    let first = h.cli_ok(&["submit", spec.to_str().expect("path"), "--wait"]);
    assert!(!first.contains("queued longest first"), "{first}");
    let again = h.cli_ok(&["submit", spec.to_str().expect("path"), "--dry-run"]);
    assert!(
        again.contains("queued longest first: slow, quick")
            && again.contains("(learned from its earlier runs)")
            && again.contains("0 GPUs (a CPU slot of its node)")
            && again.contains("cpu-again.slow: 1 job, 1 at once, on CPU slots (no GPU)"),
        "{again}"
    );
}

#[test]
fn each_variant_runs_in_its_own_directory() {
    let h = up("1x10GiB", None);
    for d in ["repo-a", "repo-b"] {
        std::fs::create_dir_all(h.path(d)).expect("dir");
        // The jobs run as the test's job user, who writes there.
        std::fs::set_permissions(h.path(d), std::fs::Permissions::from_mode(0o777)).expect("mode");
    }
    let spec = h.path("study.yaml");
    std::fs::write(
        &spec,
        "name: two-repos\nresources: {gpus: 0}\ncommand: [sh, -c, 'pwd > ran-{x}.txt']\n\
         grid: {x: [1]}\nexperiments:\n  - {name: a, workdir: repo-a}\n  - {name: b, workdir: repo-b}\n",
    )
    .expect("spec");
    let out = h.cli_ok(&["submit", spec.to_str().expect("path"), "--wait"]);
    assert!(out.contains("2 experiments"), "{out}");
    for d in ["repo-a", "repo-b"] {
        let ran = std::fs::read_to_string(h.path(d).join("ran-1.txt"))
            .unwrap_or_else(|e| panic!("{d}: {e}"));
        assert!(ran.trim().ends_with(d), "{d}: {ran}");
    }
}
