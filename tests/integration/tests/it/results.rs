//! What runs achieved, end to end through the real binaries on fake GPUs: metrics read from
//! an unmodified script's lines and from `HEADROOM_METRIC` lines into the export, `show` and
//! the API; early stopping that ends attempts behind at a rung `pruned`, frees their GPU at
//! once and keeps their joules out of `--clean-only` only.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, csv_table};
use headroom_shared::api::AttemptSeries;
use headroom_shared::{FailureClass, JobState};
use serde_json::json;

/// The seeds' way of printing (`Epoch 3 ... Test Accuracy: 91.2%`), and a script that
/// reports: both in one job, one line malformed (`{{`: a literal brace in a command).
const SEEDS_SCRIPT: &str = r#"
for e in 1 2 3; do
  acc=$(( 80 + e * $1 ))
  echo "Epoch $e/3 loss 0.$(( 9 - e )) Test Accuracy: $acc.2%"
  echo "HEADROOM_METRIC {{\"step\": $e, \"lr\": 0.$e, \"energy_j\": $e}}"
done
echo 'HEADROOM_METRIC {{"step": 4, "lr": oops}}'
"#;

#[test]
fn a_run_s_own_metrics_reach_the_export_show_and_api_named_apart_from_parameters() {
    let h = Headroom::up(UpOptions::gpus("2x24GiB"));
    let exp = h.submit_spec(json!({
        "name": "seeds",
        "command": ["sh", "-c", SEEDS_SCRIPT, "train", "{k}", "{lr}"],
        "grid": {"k": [3, 1], "lr": [0.001]},
        "resources": {"memory": "1GiB"},
        "metric_step": "Epoch ([0-9]+)/",
        "metrics": {
            "val_acc": {"pattern": "Test Accuracy: ([0-9.]+)%", "take": "max", "scale": 0.01},
            "never": {"pattern": "no such line ([0-9]+)"},
            "lr": {"take": "min"},
        },
    }));
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "a malformed metric line fails no job: {jobs:?}"
    );

    let csv = h.cli_ok(&["export", "--experiment", "seeds"]);
    let (header, rows) = csv_table(&csv);
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name} in {header:?}"))
    };
    // The parameter `lr` and the metric `lr`, the fixed `energy_j` and the metric
    // `energy_j`: four columns.
    for name in [
        "lr",
        "metric.lr",
        "energy_j",
        "metric.energy_j",
        "metric.val_acc",
    ] {
        col(name);
    }
    assert!(
        !header.iter().any(|h| h == "metric.never"),
        "a metric never seen has no value: {header:?}"
    );
    let row = |k: &str| {
        rows.iter()
            .find(|r| r[col("k")] == k)
            .unwrap_or_else(|| panic!("no row with k={k}"))
    };
    // k=3: 83.2, 86.2, 89.2 % -> max 0.892; k=1: 0.832.
    let num = |r: &Vec<String>, c: &str| r[col(c)].parse::<f64>().expect(c);
    assert!((num(row("3"), "metric.val_acc") - 0.892).abs() < 1e-9);
    assert!((num(row("1"), "metric.val_acc") - 0.832).abs() < 1e-9);
    assert_eq!(row("3")[col("lr")], "0.001", "the parameter");
    assert!((num(row("3"), "metric.lr") - 0.1).abs() < 1e-9, "take: min");
    assert!((num(row("3"), "metric.energy_j") - 3.0).abs() < 1e-9);
    assert_ne!(row("3")[col("energy_j")], "3", "headroom's own figure");

    let series: Vec<AttemptSeries> = h
        .get(&format!("/v1/experiments/{exp}/metrics"))
        .expect("series");
    assert_eq!(series.len(), 2);
    for s in &series {
        let steps: Vec<u64> = s.series["val_acc"].iter().map(|p| p.step).collect();
        assert_eq!(steps, [1, 2, 3], "the step pattern gives the x axis");
        assert_eq!(s.ignored, 1, "the malformed line, counted");
        assert!(!s.live);
    }
    let shown = h.cli_ok(&["show", "seeds/0"]);
    assert!(
        shown.contains("metrics energy_j=3 lr=0.1 val_acc=0.892")
            && shown.contains("1 metric line(s) ignored"),
        "{shown}"
    );
}

/// A job whose accuracy climbs `scale` per step for 20 steps, one step per 0.3 s.
const CURVE: &str = r#"
for s in $(seq 1 20); do
  echo "HEADROOM_METRIC {{\"step\": $s, \"acc\": $(( $1 * s ))}}"
  sleep 0.3
done
"#;

#[test]
fn early_stop_prunes_the_attempts_behind_at_a_rung_frees_their_gpu_and_keeps_their_joules() {
    // One GPU, one slot: the jobs run one after another, in order.
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    let exp = h.submit_spec(json!({
        "name": "halving",
        "command": ["sh", "-c", CURVE, "curve", "{scale}"],
        "grid": {"scale": [9, 5, 10, 1]},
        "resources": {"memory": "1GiB"},
        "retry": {"max_attempts": 3, "on": ["lost", "nonzero", "signal"]},
        "early_stop": {"metric": "acc", "mode": "max", "grace_steps": 1, "reduction_factor": 2},
    }));
    let jobs = h.wait_done(exp, Duration::from_secs(120));
    let states: Vec<JobState> = jobs.iter().map(|j| j.state).collect();
    // Rung 0 (step 1): scale 9 alone goes on; 5 < 9 of two is behind; 10 beats them;
    // 1 is behind 10 and 9 of four (the best two go on).
    assert_eq!(
        states,
        [
            JobState::Succeeded,
            JobState::Pruned,
            JobState::Succeeded,
            JobState::Pruned
        ]
    );
    for j in jobs.iter().filter(|j| j.state == JobState::Pruned) {
        let d = h.job(j.id).expect("job");
        assert_eq!(d.attempts_detail.len(), 1, "a pruned job is not retried");
        let a = &d.attempts_detail[0];
        assert_eq!(a.failure_class, Some(FailureClass::Pruned));
        assert_eq!(a.cleanup_verified, Some(true));
        let rung = a.rungs.last().expect("its decision");
        assert!(
            rung.pruned && rung.rung == 0 && rung.cutoff.is_some(),
            "{rung:?}"
        );
        let ran = (a.ended_at.expect("ended") - a.started_at.expect("started")).num_seconds();
        // A rung reached is reported at the next sampling tick, not after the usual
        // interval: stopped within a few seconds of step 1, far before its 6 s end.
        assert!(ran < 4, "stopped at once, not run to its end: {ran} s");
        assert!(
            a.log_tail
                .as_deref()
                .is_some_and(|t| t.contains("early_stop: acc")),
            "{a:?}"
        );
    }
    let shown = h.cli_ok(&["show", "halving/1"]);
    assert!(
        shown.contains("pruned (early_stop)") && shown.contains("early_stop rung 0 at step"),
        "{shown}"
    );
    let progress = h.cli_ok(&["wait", "halving"]);
    assert!(progress.contains("2 pruned"), "{progress}");

    // Its joules count in the whole export, not among the clean rows.
    let (header, all) = csv_table(&h.cli_ok(&["export", "--experiment", "halving"]));
    let (_, clean) = csv_table(&h.cli_ok(&["export", "--experiment", "halving", "--clean-only"]));
    let class = header
        .iter()
        .position(|c| c == "failure_class")
        .expect("class");
    let energy = header.iter().position(|c| c == "energy_j").expect("energy");
    let pruned: Vec<_> = all.iter().filter(|r| r[class] == "pruned").collect();
    assert_eq!(pruned.len(), 2);
    assert!(pruned.iter().all(|r| !r[energy].is_empty()), "{pruned:?}");
    assert_eq!(clean.len(), 2, "only the finished runs are clean");
    assert!(clean.iter().all(|r| r[class].is_empty()));
}

#[test]
fn results_go_only_to_a_tracking_server_the_admin_allowed_and_bad_fields_are_named() {
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB").flags(&["--mlflow-servers", "http://127.0.0.1:9/"]),
    );
    let refused = |spec: serde_json::Value, field: &str| {
        let (status, body) = h
            .post("/v1/experiments", &json!({ "spec": spec }))
            .expect("post");
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["field"], field, "{body}");
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let spec = |extra: serde_json::Value| {
        let mut s = json!({"name": "e", "command": ["true"]});
        if let (Some(o), Some(x)) = (s.as_object_mut(), extra.as_object()) {
            o.extend(x.clone());
        }
        s
    };
    // A server a user names is never written to unless an admin listed it.
    let why = refused(
        spec(json!({"tracking": {"mlflow": "http://169.254.169.254"}})),
        "tracking.mlflow",
    );
    assert!(
        why.contains("--mlflow-servers") && !why.contains("127.0.0.1:9"),
        "says how to allow one, not which are listed: {why}"
    );
    refused(
        spec(json!({"metrics": {"acc": {"pattern": "(unclosed"}}})),
        "metrics.acc.pattern",
    );
    refused(
        spec(json!({"early_stop": {"metric": "acc", "mode": "max", "reduction_factor": 1}})),
        "early_stop.reduction_factor",
    );
    refused(
        spec(json!({"early_stop": {"metric": "acc", "mode": "best"}})),
        "early_stop.mode",
    );
    refused(
        spec(json!({"tracking": {"mlflow": "http://lab:secret@127.0.0.1:9"}})),
        "tracking.mlflow",
    );
    refused(spec(json!({"retry": {"on": ["pruned"]}})), "retry.on");
    let listed = h
        .post(
            "/v1/experiments",
            &json!({ "spec": spec(json!({"tracking": {"mlflow": "http://127.0.0.1:9"}})) }),
        )
        .expect("post");
    assert_eq!(listed.0, 200, "{}", listed.1);
}
