//! Spec parsing, validation and expansion as users meet them.

use headroom_shared::expand::expand;
use headroom_shared::spec::{DEFAULT_MAX_JOBS, ExperimentSpec, SpecError};
use proptest::prelude::*;

const SWEEP: &str = r#"
name: lr-sweep
command: ["python", "train.py", "--lr", "{lr}", "--bs", "{batch_size}", "--model={model}"]
seed: 7
grid:
  batch_size: [32, 64]
  model: [resnet20, densenet121]
mutate:
  lr: {log_uniform: [1.0e-4, 1.0e-1]}
  dropout: {uniform: [0.0, 0.5]}
  opt: {choice: [adam, sgd]}
mutations: 3
runs_per_config: 2
resources: {gpus: 1, memory: 3.5GiB}
timeout: 2h
retry: {max_attempts: 2, on: [oom, lost]}
env: {WANDB_MODE: offline}
profile: default
"#;

fn parse(text: &str) -> ExperimentSpec {
    match ExperimentSpec::from_text(text) {
        Ok(s) => s,
        Err(e) => panic!("spec should parse: {e}"),
    }
}

fn refused(text: &str) -> SpecError {
    match ExperimentSpec::from_text(text).and_then(|s| s.validate(DEFAULT_MAX_JOBS)) {
        Ok(()) => panic!("spec should be refused:\n{text}"),
        Err(e) => e,
    }
}

#[test]
fn yaml_and_json_are_one_schema() {
    let yaml = parse(SWEEP);
    let json_text =
        serde_json::to_string(&serde_json::to_value(&yaml).expect("to json")).expect("serialize");
    assert_eq!(parse(&json_text), yaml);
}

#[test]
fn expansion_counts_grid_mutations_and_runs() {
    let spec = parse(SWEEP);
    let jobs = expand(&spec, 7, DEFAULT_MAX_JOBS).expect("expands");
    assert_eq!(jobs.len(), 2 * 2 * 3 * 2);
    assert_eq!(spec.job_count(), Some(24));
    // Runs of one configuration share their parameters.
    assert_eq!(jobs[0].params, jobs[1].params);
    assert_eq!((jobs[0].run, jobs[1].run), (0, 1));
    assert_ne!(jobs[0].params, jobs[2].params);
    for job in &jobs {
        let lr = job.params["lr"].as_f64().expect("lr is a number");
        assert!((1e-4..=1e-1).contains(&lr), "lr {lr} out of range");
        let bs = job.params["batch_size"].to_string();
        assert_eq!(job.argv[5], bs);
        assert!(job.argv[6].starts_with("--model="));
        assert!(!job.argv.iter().any(|a| a.contains('{')));
    }
}

#[test]
fn same_seed_same_jobs_other_seed_other_draws() {
    let spec = parse(SWEEP);
    let a = expand(&spec, 7, DEFAULT_MAX_JOBS).expect("expands");
    let b = expand(&spec, 7, DEFAULT_MAX_JOBS).expect("expands");
    let c = expand(&spec, 8, DEFAULT_MAX_JOBS).expect("expands");
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn shell_mode_quotes_values() {
    let spec = parse(
        r#"{"name": "q", "shell": true, "command": ["echo {msg} > out.txt"],
            "grid": {"msg": ["a b; rm -rf /"]}}"#,
    );
    let jobs = expand(&spec, 1, DEFAULT_MAX_JOBS).expect("expands");
    assert_eq!(jobs[0].argv[0], "sh");
    assert_eq!(jobs[0].argv[2], "echo 'a b; rm -rf /' > out.txt");
}

#[test]
fn refusals_name_the_field() {
    let cases: &[(&str, &str)] = &[
        ("name: a\ncommand: [x]\ncolour: red\n", "colour"),
        (
            "name: a\ncommand: [x]\nresources: {gpus: 1, memroy: 1GiB}\n",
            "resources.memroy",
        ),
        ("name: a\ncommand: [x]\ngrid: {lr: []}\n", "grid.lr"),
        (
            "name: a\ncommand: [x, '{lr}']\ngrid: {lr: [1]}\nmutate: {lr: {uniform: [0, 1]}}\n",
            "mutate.lr",
        ),
        ("name: a\ncommand: [x, '{lr}']\n", "command[1]"),
        (
            "name: a\ncommand: [x, '{lr']\ngrid: {lr: [1]}\n",
            "command[1]",
        ),
        (
            "name: a\ncommand: [x]\nresources: {memory: lots}\n",
            "resources.memory",
        ),
        (
            "name: a\ncommand: [x]\nresources: {memory: 12}\n",
            "resources.memory",
        ),
        ("name: a\ncommand: [x]\ntimeout: -5\n", "timeout"),
        ("name: a\ncommand: [x]\ntimeout: '-5s'\n", "timeout"),
        ("name: a\ncommand: [x]\ntimeout: soon\n", "timeout"),
        (
            "name: a\ncommand: [x]\nexpected_duration: soon\n",
            "expected_duration",
        ),
        (
            "name: a\ncommand: [x]\nexpected_duration: 0\n",
            "expected_duration",
        ),
        ("name: a\ncommand: [x]\ntimeout: 1e300\n", "timeout"),
        (
            "name: a\ncommand: [x]\nmutate: {lr: {uniform: [2, 1]}}\n",
            "mutate.lr",
        ),
        (
            "name: a\ncommand: [x]\nmutate: {lr: {log_uniform: [0, 1]}}\n",
            "mutate.lr",
        ),
        (
            "name: a\ncommand: [x]\nmutate: {lr: {log_uniform: [-1, 1]}}\n",
            "mutate.lr",
        ),
        (
            "name: a\ncommand: [x]\nmutate: {opt: {choice: []}}\n",
            "mutate.opt",
        ),
        (
            "name: a\ncommand: [x]\nruns_per_config: 0\n",
            "runs_per_config",
        ),
        (
            "name: a\ncommand: [x]\nruns_per_config: -1\n",
            "runs_per_config",
        ),
        ("name: a\ncommand: []\n", "command"),
        ("name: ''\ncommand: [x]\n", "name"),
        ("name: a b\ncommand: [x]\n", "name"),
        (
            "name: a\ncommand: [x]\nretry: {max_attempts: 0}\n",
            "retry.max_attempts",
        ),
        (
            "name: a\ncommand: [x]\nretry: {on: [typo]}\n",
            "retry.on[0]",
        ),
        ("name: a\ncommand: [x]\nprofile: turbo\n", "profile"),
        (
            "name: a\ncommand: [x]\non_throttle: ignore\n",
            "on_throttle",
        ),
        (
            "name: a\ncommand: [x]\nretry: {on: [throttled]}\n",
            "retry.on",
        ),
        (
            "name: a\ncommand: [x]\nenv: {CUDA_VISIBLE_DEVICES: '0'}\n",
            "env.CUDA_VISIBLE_DEVICES",
        ),
        ("name: a\ncommand: [x]\ngrid: {2lr: [1]}\n", "grid.2lr"),
        ("command: [x]\n", "spec"),
        ("name: a\ncommand: [x]\nmemory_key: [bs]\n", "memory_key[0]"),
        (
            "name: a\ncommand: [x]\ngrid: {bs: [1]}\noom_ladder: [{}]\n",
            "oom_ladder[0]",
        ),
        (
            "name: a\ncommand: [x]\ngrid: {bs: [1]}\noom_ladder: [{bs: '/0'}]\n",
            "oom_ladder[0].bs",
        ),
        (
            "name: a\ncommand: [x]\ngrid: {bs: [1]}\noom_ladder: [{lr: '*2'}]\n",
            "oom_ladder[0].lr",
        ),
    ];
    for (text, field) in cases {
        let err = refused(text);
        assert!(
            err.field.starts_with(field),
            "for\n{text}expected field {field}, got {err:?}"
        );
        assert!(!err.message.is_empty());
    }
}

#[test]
fn on_throttle_defaults_to_flag_and_takes_retry_and_fail() {
    use headroom_shared::spec::OnThrottle;
    assert_eq!(
        parse("name: a\ncommand: [x]\n").on_throttle,
        OnThrottle::Flag
    );
    for (text, want) in [("retry", OnThrottle::Retry), ("fail", OnThrottle::Fail)] {
        let spec = parse(&format!("name: a\ncommand: [x]\non_throttle: {text}\n"));
        assert_eq!(spec.on_throttle, want);
    }
}

#[test]
fn expansion_cap_is_enforced_before_expanding() {
    let spec =
        parse("name: big\ncommand: [x]\ngrid: {a: [1,2,3,4,5,6,7,8,9,10]}\nruns_per_config: 20\n");
    assert!(spec.validate(200).is_ok());
    let err = spec.validate(199).expect_err("over the cap");
    assert!(err.message.contains("200 jobs"), "{err}");
    // Overflowing products are refused, not wrapped.
    let huge: Vec<String> = (0..40)
        .map(|i| format!("a{i}: [1,2,3,4,5,6,7,8]"))
        .collect();
    let text = format!("name: huge\ncommand: [x]\ngrid: {{{}}}\n", huge.join(", "));
    let err = refused(&text);
    assert_eq!(err.field, "spec");
}

proptest! {
    #[test]
    fn expansion_is_deterministic_and_sized(seed in any::<u64>(), axes in 1usize..4, width in 1usize..4,
                                            runs in 1u32..4, mutations in 1u32..4) {
        let grid: Vec<String> = (0..axes).map(|a| {
            let vals: Vec<String> = (0..width).map(|v| (v * 10 + a).to_string()).collect();
            format!("p{a}: [{}]", vals.join(","))
        }).collect();
        let text = format!(
            "name: p\ncommand: [run, '{{p0}}', '{{x}}']\ngrid: {{{}}}\nmutate: {{x: {{uniform: [-1, 1]}}}}\nmutations: {mutations}\nruns_per_config: {runs}\n",
            grid.join(", "));
        let spec = ExperimentSpec::from_text(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let a = expand(&spec, seed, DEFAULT_MAX_JOBS).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let b = expand(&spec, seed, DEFAULT_MAX_JOBS).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a.len() as u64, width.pow(axes as u32) as u64 * u64::from(mutations) * u64::from(runs));
        for (i, job) in a.iter().enumerate() {
            prop_assert_eq!(job.index as usize, i);
            let x = job.params["x"].as_f64().unwrap_or(9.0);
            prop_assert!((-1.0..=1.0).contains(&x));
        }
    }

    #[test]
    fn arbitrary_documents_never_panic(text in ".{0,200}") {
        if let Ok(spec) = ExperimentSpec::from_text(&text)
            && spec.validate(1000).is_ok()
        {
            let jobs = expand(&spec, 1, 1000).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(!jobs.is_empty());
        }
    }
}

#[test]
fn the_oom_ladder_halves_doubles_and_sets() {
    use headroom_shared::spec::apply_ladder_step;
    let spec = parse(
        "name: l\ncommand: [x]\ngrid: {batch_size: [256], grad_accum: [1], lr: [0.5]}\n\
         oom_ladder: [{batch_size: '/2', grad_accum: '*2'}, {gradient_checkpointing: true, lr: '/4'}]\n",
    );
    assert!(spec.validate(DEFAULT_MAX_JOBS).is_ok());
    let mut params = expand(&spec, 1, 10).expect("expands")[0].params.clone();
    apply_ladder_step(&mut params, &spec.oom_ladder[0]);
    assert_eq!(params["batch_size"], serde_json::json!(128));
    assert_eq!(params["grad_accum"], serde_json::json!(2));
    apply_ladder_step(&mut params, &spec.oom_ladder[1]);
    assert_eq!(params["gradient_checkpointing"], serde_json::json!(true));
    assert_eq!(params["lr"], serde_json::json!(0.125));
    // Integers never reach zero.
    let mut tiny =
        std::collections::BTreeMap::from([("batch_size".to_string(), serde_json::json!(1))]);
    apply_ladder_step(&mut tiny, &spec.oom_ladder[0]);
    assert_eq!(tiny["batch_size"], serde_json::json!(1));
}

/// A NUL byte cannot pass through `execve` (argv or environment): such a spec is refused at
/// submit, naming the field, instead of every attempt failing later with `launch_error`.
#[test]
fn nul_bytes_are_refused_naming_the_field() {
    let base = || serde_json::json!({"name": "nul", "command": ["x", "{lr}"], "grid": {"lr": [1]}});
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (
            serde_json::json!({"command": ["x", "a\u{0}b"]}),
            "command[1]",
        ),
        (
            serde_json::json!({"command": ["x\u{0}", "{lr}"]}),
            "command[0]",
        ),
        (
            serde_json::json!({"grid": {"lr": [1, "0.1\u{0}"]}}),
            "grid.lr[1]",
        ),
        (
            serde_json::json!({"mutate": {"opt": {"choice": ["adam", "s\u{0}gd"]}}}),
            "mutate.opt.choice[1]",
        ),
        (
            serde_json::json!({"oom_ladder": [{"flag": "on\u{0}"}]}),
            "oom_ladder[0].flag",
        ),
        (
            serde_json::json!({"env": {"WANDB_MODE": "off\u{0}line"}}),
            "env.WANDB_MODE",
        ),
    ];
    for (patch, field) in cases {
        let mut doc = base();
        for (k, v) in patch.as_object().expect("object") {
            doc[k] = v.clone();
        }
        let err = ExperimentSpec::from_value(doc.clone())
            .and_then(|s| s.validate(DEFAULT_MAX_JOBS))
            .expect_err(&format!("{doc} should be refused"));
        assert_eq!(err.field, field, "{doc}: {err}");
        assert!(err.message.contains("NUL"), "{doc}: {err}");
    }
}

#[test]
fn exclusive_and_cooldown_resolve_for_every_job() {
    use headroom_shared::prestart::{Cooldown, OnCooldownTimeout, Prestart};
    let spec = parse(
        "name: e\ncommand: [x]\nexclusive: true\n\
         cooldown: {until_temp_c: 40, max_wait: 10m, on_timeout: start}\n",
    );
    spec.validate(DEFAULT_MAX_JOBS).expect("valid");
    assert_eq!(
        spec.prestart().expect("resolves"),
        Prestart {
            exclusive: true,
            cooldown: Some(Cooldown::UntilTemp {
                temp_c: 40.0,
                max_wait_ms: 600_000,
                on_timeout: OnCooldownTimeout::Start,
            }),
        }
    );
    let spec = parse("name: e\ncommand: [x]\ncooldown: {seconds: 1.5}\n");
    let p = spec.prestart().expect("resolves");
    assert_eq!(p.cooldown, Some(Cooldown::Seconds { ms: 1500 }));
    assert!(p.holds_gpu() && !p.exclusive);
    // Neither: nothing to store with the jobs.
    let plain = parse("name: e\ncommand: [x]\n")
        .prestart()
        .expect("resolves");
    assert_eq!(plain.into_option(), None);
}

#[test]
fn exclusive_and_cooldown_refusals_name_the_field() {
    let cases: &[(&str, &str, &str)] = &[
        ("cooldown: {}", "cooldown", "seconds"),
        (
            "cooldown: {seconds: 60, until_temp_c: 40, max_wait: 5m}",
            "cooldown.until_temp_c",
            "not both",
        ),
        (
            "cooldown: {until_temp_c: 40}",
            "cooldown.max_wait",
            "required",
        ),
        (
            "cooldown: {until_temp_c: -5, max_wait: 5m}",
            "cooldown.until_temp_c",
            "between",
        ),
        (
            "cooldown: {until_temp_c: 400, max_wait: 5m}",
            "cooldown.until_temp_c",
            "between",
        ),
        (
            "cooldown: {until_temp_c: 40, max_wait: soon}",
            "cooldown.max_wait",
            "duration",
        ),
        (
            "cooldown: {until_temp_c: 40, max_wait: 0}",
            "cooldown.max_wait",
            "positive",
        ),
        (
            "cooldown: {until_temp_c: 40, max_wait: 30d}",
            "cooldown.max_wait",
            "a day",
        ),
        ("cooldown: {seconds: 0}", "cooldown.seconds", "more than 0"),
        (
            "cooldown: {seconds: 60, max_wait: 5m}",
            "cooldown.max_wait",
            "until_temp_c",
        ),
        (
            "cooldown: {seconds: 60, on_timeout: start}",
            "cooldown.on_timeout",
            "until_temp_c",
        ),
        (
            "cooldown: {until_temp_c: 40, max_wait: 5m, on_timeout: later}",
            "cooldown.on_timeout",
            "unknown variant",
        ),
        (
            "cooldown: {seconds: 60, temp: 40}",
            "cooldown.temp",
            "unknown",
        ),
        ("exclusive: yes please", "exclusive", ""),
        (
            "exclusive: true\nresources: {gpus: 0}",
            "exclusive",
            "CPU-only",
        ),
        (
            "cooldown: {seconds: 5}\nresources: {gpus: 0}",
            "cooldown",
            "CPU-only",
        ),
    ];
    for (extra, field, words) in cases {
        let text = format!("name: a\ncommand: [x]\n{extra}\n");
        let err = refused(&text);
        assert_eq!(err.field, *field, "{text}: {err}");
        assert!(err.message.contains(words), "{text}: {err}");
    }
}

#[test]
fn the_energy_example_is_exclusive_and_cools_each_run() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/energy-cooldown.yaml"
    );
    let text = std::fs::read_to_string(path).expect("example");
    let spec = parse(&text);
    spec.validate(DEFAULT_MAX_JOBS).expect("valid");
    let p = spec.prestart().expect("resolves");
    assert!(p.exclusive);
    assert_eq!(
        p.cooldown,
        Some(headroom_shared::prestart::Cooldown::UntilTemp {
            temp_c: 40.0,
            max_wait_ms: 600_000,
            on_timeout: headroom_shared::prestart::OnCooldownTimeout::Fail,
        })
    );
    assert_eq!(spec.job_count(), Some(10));
}

const PAIR: &str = r#"
name: pair
command: ["train", "--model", "{model}"]
grid:
  model: [resnet20, densenet121]
  bg_mem: [800MiB, 1300MiB]
  mode: [alone, colocated]
resources: {memory: 2GiB}
colocate:
  command: ["bg-load", "--mem", "{bg_mem}", "--run", "{run}"]
  env: {BG: "1"}
  memory: "{bg_mem}"
  ready: {log: "^ready"}
  start_timeout: 90s
  on_background_exit: flag
  when: {mode: colocated}
"#;

#[test]
fn colocate_renders_per_job_and_only_where_when_holds() {
    let jobs = expand(&parse(PAIR), 1, DEFAULT_MAX_JOBS).expect("expands");
    assert_eq!(jobs.len(), 8);
    for j in &jobs {
        let colocated = j.params["mode"] == "colocated";
        assert_eq!(j.background.is_some(), colocated, "{j:?}");
        if let Some(bg) = &j.background {
            let mem = j.params["bg_mem"].as_str().expect("text");
            assert_eq!(bg.argv, vec!["bg-load", "--mem", mem, "--run", "0"]);
            assert_eq!(bg.memory_mib, if mem == "800MiB" { 800 } else { 1300 });
            assert_eq!(bg.ready_log.as_deref(), Some("^ready"));
            assert_eq!(bg.start_timeout_ms, 90_000);
            assert_eq!(
                bg.on_exit,
                headroom_shared::colocate::OnBackgroundExit::Flag
            );
        }
    }
}

#[test]
fn colocate_refusals_name_the_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "  start_timeout: 90s",
            "  start_timeout: soon",
            "colocate.start_timeout",
        ),
        (
            "  start_timeout: 90s",
            "  start_timeout: -5",
            "colocate.start_timeout",
        ),
        (
            "  ready: {log: \"^ready\"}",
            "  ready: {log: \"(\"}",
            "colocate.ready.log",
        ),
        (
            "  ready: {log: \"^ready\"}",
            "  ready: {regex: x}",
            "colocate.ready.regex",
        ),
        (
            "  memory: \"{bg_mem}\"",
            "  memory: \"{model}\"",
            "colocate.memory",
        ),
        (
            "  memory: \"{bg_mem}\"",
            "  memory: lots",
            "colocate.memory",
        ),
        (
            "  memory: \"{bg_mem}\"",
            "  memory: 0MiB",
            "colocate.memory",
        ),
        (
            "  when: {mode: colocated}",
            "  when: {phase: x}",
            "colocate.when.phase",
        ),
        (
            "  on_background_exit: flag",
            "  on_background_exit: ignore",
            "colocate.on_background_exit",
        ),
        (
            "\"--run\", \"{run}\"]",
            "\"--run\", \"{nope}\"]",
            "colocate.command[4]",
        ),
        (
            "  env: {BG: \"1\"}",
            "  env: {CUDA_VISIBLE_DEVICES: \"1\"}",
            "colocate.env.CUDA_VISIBLE_DEVICES",
        ),
        ("  env: {BG: \"1\"}", "  colour: red", "colocate.colour"),
        (
            "resources: {memory: 2GiB}",
            "resources: {memory: 2GiB, gpus: 2}",
            "colocate",
        ),
    ];
    for (from, to, field) in cases {
        assert!(PAIR.contains(from), "{from}");
        let e = refused(&PAIR.replace(from, to));
        assert!(
            e.field == *field,
            "{to}: refused on `{}` ({}), expected `{field}`",
            e.field,
            e.message
        );
    }
    let e = refused(&PAIR.replace(
        "  command: [\"bg-load\", \"--mem\", \"{bg_mem}\", \"--run\", \"{run}\"]",
        "  command: []",
    ));
    assert_eq!(e.field, "colocate.command");
}

/// `examples/seed-003.yaml`: the lab's 12 pairs, alone and colocated, 3 runs each.
#[test]
fn the_seed_003_matrix_is_one_spec() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/seed-003.yaml");
    let text = std::fs::read_to_string(path).expect("example");
    let jobs = expand(&parse(&text), 3, DEFAULT_MAX_JOBS).expect("expands");
    assert_eq!(jobs.len(), 12 * 2 * 3);
    let colocated: Vec<_> = jobs.iter().filter(|j| j.background.is_some()).collect();
    assert_eq!(colocated.len(), 36);
    assert!(colocated.iter().all(|j| j.params["mode"] == "colocated"));
    // A pair travels whole (a row): 12 of them, never mixed.
    let pairs: std::collections::BTreeSet<_> = colocated
        .iter()
        .map(|j| (j.params["fg"].to_string(), j.params["bg"].to_string()))
        .collect();
    assert_eq!(pairs.len(), 12);
    let first = colocated
        .iter()
        .find(|j| j.params["fg"] == "mnist_ff" && j.params["bg"] == "resnet20")
        .expect("pair 1");
    assert_eq!(first.argv[..3], ["headroom-fake-job", "--mem", "500MiB"]);
    let bg = first.background.as_ref().expect("bg");
    assert_eq!(
        bg.argv[..5],
        ["headroom-fake-job", "--delay", "1", "--mem", "800MiB"]
    );
    assert!(
        bg.argv.contains(&"background=resnet20".to_string()),
        "{:?}",
        bg.argv
    );
    assert_eq!(
        bg.memory_mib, 800,
        "its own background's memory (a rows column)"
    );
}

/// Seed 003's feasibility pairs: a foreground and a background that travel together.
const PAIRS: &str = r#"
name: pairs
command: [run, "{fg_model}", "{bg_model}", "--lr={lr}", "--bs={bs}"]
zip:
  fg_model: [resnet20, vgg16, densenet121]
  bg_model: [mobilenet, resnet20, vgg16]
rows:
  - {lr: 0.1, bs: 32}
  - {lr: 0.01, bs: 64}
grid: {seed_axis: [1, 2]}
runs_per_config: 2
"#;

#[test]
fn zipped_axes_advance_together_and_rows_are_taken_whole() {
    let spec = parse(PAIRS);
    assert_eq!(spec.job_count(), Some(2 * 3 * 2 * 2));
    let jobs = expand(&spec, 1, DEFAULT_MAX_JOBS).expect("expand");
    assert_eq!(jobs.len(), 24);
    let table: Vec<(String, String, String, String, u32)> = jobs
        .iter()
        .map(|j| {
            let t = |k: &str| headroom_shared::expand::value_text(&j.params[k]);
            (t("lr"), t("fg_model"), t("bg_model"), t("seed_axis"), j.run)
        })
        .collect();
    // Rows outermost, then the zip's positions, then the grid, then the runs.
    let first: Vec<_> = table.iter().take(5).cloned().collect();
    let row = |lr: &str, fg: &str, bg: &str, s: &str, run: u32| {
        (
            lr.to_string(),
            fg.to_string(),
            bg.to_string(),
            s.to_string(),
            run,
        )
    };
    assert_eq!(
        first,
        [
            row("0.1", "resnet20", "mobilenet", "1", 0),
            row("0.1", "resnet20", "mobilenet", "1", 1),
            row("0.1", "resnet20", "mobilenet", "2", 0),
            row("0.1", "resnet20", "mobilenet", "2", 1),
            row("0.1", "vgg16", "resnet20", "1", 0),
        ]
    );
    // A pair never splits, and every row keeps its own batch size.
    for j in &jobs {
        let pair = (j.params["fg_model"].clone(), j.params["bg_model"].clone());
        assert!(
            [
                ("resnet20", "mobilenet"),
                ("vgg16", "resnet20"),
                ("densenet121", "vgg16")
            ]
            .iter()
            .any(|(f, b)| pair == (serde_json::json!(f), serde_json::json!(b))),
            "{pair:?}"
        );
        let bs = if j.params["lr"] == serde_json::json!(0.1) {
            32
        } else {
            64
        };
        assert_eq!(j.params["bs"], serde_json::json!(bs));
    }
    assert_eq!(
        jobs[23].argv,
        ["run", "densenet121", "vgg16", "--lr=0.01", "--bs=64"]
    );
}

#[test]
fn zip_and_rows_refusals_name_the_field() {
    let base = "name: e\ncommand: [run]\n";
    for (extra, field, says) in [
        ("zip: {a: [1, 2], b: [1]}", "zip.b", "advance together"),
        ("zip: {a: []}", "zip.a", "no values"),
        (
            "zip: {a: [1]}\ngrid: {a: [1]}",
            "zip.a",
            "name each parameter once",
        ),
        ("rows: [{a: 1}, {b: 2}]", "rows[1]", "lacks `a`"),
        (
            "rows: [{a: 1}, {a: 2, b: 3}]",
            "rows[1].b",
            "not in rows[0]",
        ),
        (
            "rows: [{a: [1]}]",
            "rows[0].a",
            "strings, numbers or booleans",
        ),
        ("rows: [{}]", "rows[0]", "names no parameter"),
        (
            "rows: [{a: 1}]\nmutate: {a: {uniform: [0, 1]}}",
            "rows[0].a",
            "name each parameter once",
        ),
        (
            "rows: [{a: 1}]\nzip: {a: [1]}",
            "rows[0].a",
            "name each parameter once",
        ),
        ("rows: [{9a: 1}]", "rows[0].9a", "parameter names"),
    ] {
        let e = refused(&format!("{base}{extra}\n"));
        assert_eq!(e.field, field, "{extra}: {e:?}");
        assert!(e.message.contains(says), "{extra}: {e:?}");
    }
}

proptest! {
    #[test]
    fn zip_and_rows_multiply_the_grid_as_documented(seed in any::<u64>(), width in 1usize..4,
                                                     zip in 1usize..4, rows in 1usize..4,
                                                     runs in 1u32..3) {
        let z: Vec<String> = (0..zip).map(|i| i.to_string()).collect();
        let r: Vec<String> = (0..rows).map(|i| format!("{{r: {i}}}")).collect();
        let g: Vec<String> = (0..width).map(|i| i.to_string()).collect();
        let text = format!(
            "name: p\ncommand: [run, '{{r}}', '{{z1}}', '{{g}}']\ngrid: {{g: [{}]}}\nzip: {{z1: [{}], z2: [{}]}}\nrows: [{}]\nmutate: {{x: {{uniform: [0, 1]}}}}\nruns_per_config: {runs}\n",
            g.join(","), z.join(","), z.join(","), r.join(","));
        let spec = ExperimentSpec::from_text(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let a = expand(&spec, seed, DEFAULT_MAX_JOBS).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&a, &expand(&spec, seed, DEFAULT_MAX_JOBS).map_err(|e| TestCaseError::fail(e.to_string()))?);
        prop_assert_eq!(a.len(), width * zip * rows * runs as usize);
        prop_assert_eq!(spec.job_count(), Some(a.len() as u64));
        for j in &a {
            prop_assert_eq!(&j.params["z1"], &j.params["z2"], "zipped axes advance together");
        }
    }
}

#[test]
fn memory_cap_reads_on_and_off_as_words_or_yaml_booleans() {
    use headroom_shared::spec::MemoryCap;
    for (text, want) in [
        ("on", MemoryCap::On),
        ("off", MemoryCap::Off),
        ("true", MemoryCap::On),
        ("false", MemoryCap::Off),
    ] {
        let s = parse(&format!(
            "name: x\ncommand: [\"true\"]\nmemory_cap: {text}\n"
        ));
        assert_eq!(s.memory_cap, want, "{text}");
    }
    assert_eq!(
        parse("name: x\ncommand: [\"true\"]\n").memory_cap,
        MemoryCap::On
    );
    let e = ExperimentSpec::from_text("name: x\ncommand: [\"true\"]\nmemory_cap: sometimes\n")
        .expect_err("refused")
        .to_string();
    assert!(e.contains("memory_cap") && e.contains("sometimes"), "{e}");
}
