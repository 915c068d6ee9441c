//! How attempts end: timeout, cancel (one job, a whole experiment), CUDA OOM classified
//! from the log and retried, manual retry.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, fake_job};
use headroom_shared::{FailureClass, JobState};

fn up() -> Headroom {
    Headroom::up(UpOptions::gpus("2x24GiB").plan("2,2").kill_grace("500ms"))
}

#[test]
fn a_job_past_its_timeout_is_killed_and_classified() {
    let h = up();
    let spec = format!(
        r#"{{"name": "slow", "command": ["{job}", "--seconds", "600", "--ignore-term"],
             "timeout": "1s", "resources": {{"memory": "1GiB"}}}}"#,
        job = fake_job().display()
    );
    let exp = h.submit("slow.json", &spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    let d = h.job(jobs[0].id).expect("job");
    assert_eq!(d.summary.state, JobState::Failed);
    let a = &d.attempts_detail[0];
    assert_eq!(a.failure_class, Some(FailureClass::Timeout));
    assert_eq!(a.cleanup_verified, Some(true));
    let pid = a.pid.expect("pid recorded");
    assert!(!headroom_integration_tests::alive(pid));
}

#[test]
fn cancel_one_job_then_the_rest_of_the_experiment() {
    let h = up();
    let spec = format!(
        r#"{{"name": "long", "command": ["{job}", "--seconds", "600"], "runs_per_config": 6,
             "resources": {{"memory": "1GiB"}}}}"#,
        job = fake_job().display()
    );
    let exp = h.submit("long.json", &spec).expect("submit");
    let running = h.wait_for("four jobs running", Duration::from_secs(30), || {
        let jobs = h.jobs(exp)?;
        let running: Vec<_> = jobs
            .into_iter()
            .filter(|j| j.state == JobState::Running)
            .collect();
        Ok((running.len() == 4).then_some(running))
    });
    let victim = running[0].id;
    let out = h.cli_ok(&["cancel", &victim.to_string()]);
    assert!(out.contains("cancelled 1 job"), "{out}");
    let d = h.wait_for(
        "the cancelled attempt to end",
        Duration::from_secs(30),
        || {
            let d = h.job(victim)?;
            Ok(d.attempts_detail[0].ended_at.is_some().then_some(d))
        },
    );
    assert_eq!(d.summary.state, JobState::Cancelled);
    assert_eq!(
        d.attempts_detail[0].failure_class,
        Some(FailureClass::Cancelled)
    );
    // Its slot is reused by a queued job.
    h.wait_for(
        "a queued job to take the slot",
        Duration::from_secs(30),
        || {
            let n = h
                .jobs(exp)?
                .iter()
                .filter(|j| j.state == JobState::Running)
                .count();
            Ok((n == 4).then_some(()))
        },
    );
    let out = h.cli_ok(&["cancel", "long"]);
    assert!(out.contains("cancelled 5 jobs"), "{out}");
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Cancelled),
        "{jobs:#?}"
    );
    h.wait_for("every attempt to end", Duration::from_secs(30), || {
        let busy = h.nodes()?[0].gpus.iter().map(|g| g.slots_used).sum::<u32>();
        Ok((busy == 0).then_some(()))
    });
    let code = h.cli(&["wait", "long"]).status.code();
    assert_eq!(
        code,
        Some(3),
        "wait exits 3 when jobs did not succeed (2 is bad usage)"
    );
}

#[test]
fn cuda_oom_in_the_log_is_classified_and_retried() {
    let h = up();
    let marker = h.path("first-attempt-done");
    // The first attempt prints the torch OOM text and exits 1; the second succeeds.
    let script = format!(
        "if [ -e {m} ]; then echo trained; else touch {m}; \
         echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB.' >&2; exit 1; fi",
        m = marker.display()
    );
    let spec = serde_json::json!({
        "name": "oomy", "command": ["sh", "-c", script],
        "retry": {"max_attempts": 2, "on": ["oom"]}, "resources": {"memory": "1GiB"}
    });
    let exp = h.submit_spec(spec);
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    let d = h.job(jobs[0].id).expect("job");
    assert_eq!(d.summary.state, JobState::Succeeded);
    let classes: Vec<_> = d.attempts_detail.iter().map(|a| a.failure_class).collect();
    assert_eq!(classes, vec![Some(FailureClass::Oom), None]);
    let csv = h.cli_ok(&["export", "--csv"]);
    assert!(
        csv.lines().nth(1).is_some_and(|l| l.contains(",oom,")),
        "{csv}"
    );
}

#[test]
fn fake_memory_beyond_the_gpu_is_an_oom_and_nonzero_is_not_retried() {
    let h = up();
    let spec = format!(
        r#"{{"name": "toobig", "command": ["{job}", "--mem", "30GiB"],
             "retry": {{"max_attempts": 3, "on": ["lost"]}}}}"#,
        job = fake_job().display()
    );
    let exp = h.submit("toobig.json", &spec).expect("submit");
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    let d = h.job(jobs[0].id).expect("job");
    assert_eq!(d.summary.state, JobState::Failed);
    assert_eq!(d.attempts_detail.len(), 1, "oom is not in retry.on");
    assert_eq!(d.attempts_detail[0].failure_class, Some(FailureClass::Oom));
    assert!(
        d.attempts_detail[0]
            .log_tail
            .as_deref()
            .unwrap_or("")
            .contains("CUDA out of memory"),
        "{:?}",
        d.attempts_detail[0].log_tail
    );
    // `headroom retry` runs it once more.
    h.cli_ok(&["retry", &jobs[0].id.to_string()]);
    h.wait_for("the retried attempt", Duration::from_secs(30), || {
        let d = h.job(jobs[0].id)?;
        Ok((d.attempts_detail.len() == 2 && d.summary.state.is_terminal()).then_some(()))
    });
    let out = h.cli_ok(&["show", &jobs[0].id.to_string()]);
    assert!(out.contains("#2") && out.contains("failed: oom"), "{out}");
}

#[test]
fn nonzero_exit_and_launch_errors() {
    let h = up();
    let spec = serde_json::json!({
        "name": "bad", "command": ["{prog}"],
        "grid": {"prog": ["false", "/no/such/program"]},
        "resources": {"memory": "1GiB"}
    });
    let exp = h.submit_spec(spec);
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    let class = |i: usize| h.first_attempt(jobs[i].id).failure_class;
    assert_eq!(class(0), Some(FailureClass::Nonzero));
    assert_eq!(class(1), Some(FailureClass::LaunchError));
}

/// `headroom retry EXPERIMENT` runs every failed job once more in one request; the JSON
/// export holds the CSV's rows, typed, in pages, with the parameters under `params`.
#[test]
fn an_experiment_s_failed_jobs_retry_at_once_and_the_json_export_pages_its_rows() {
    let h = up();
    let spec = serde_json::json!({
        "name": "halfbad", "command": ["sh", "-c", "echo loss=0.{x}; [ $(( {x} % 2 )) -eq 0 ]"],
        "grid": {"x": [1, 2, 3, 4]}, "resources": {"memory": "1GiB"}
    });
    let exp = h.submit_spec(spec);
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    let failed = jobs.iter().filter(|j| j.state == JobState::Failed).count();
    assert_eq!(failed, 2, "{jobs:#?}");
    let out = h.cli_ok(&["retry", "halfbad"]);
    assert!(
        out.contains("2 failed jobs of experiment halfbad (") && out.contains("queued"),
        "{out}"
    );
    h.wait_for(
        "both retried attempts to end",
        Duration::from_secs(30),
        || {
            let jobs = h.jobs(exp)?;
            let ended = jobs.iter().all(|j| j.state.is_terminal());
            Ok((ended && jobs.iter().map(|j| j.attempts).sum::<u32>() == 6).then_some(()))
        },
    );
    let csv = h.cli_ok(&["export", "--csv", "-e", "halfbad"]);
    assert_eq!(csv.lines().count(), 1 + 6, "{csv}");
    // Pages of 4: the first says where the next starts; the last says none.
    let first: serde_json::Value = h
        .get(&format!("/v1/export?experiment={exp}&format=json&limit=4"))
        .expect("page 1");
    assert_eq!(first["rows"].as_array().map(Vec::len), Some(4), "{first}");
    assert_eq!(first["next_after"], 4);
    let second: serde_json::Value = h
        .get(&format!(
            "/v1/export?experiment={exp}&format=json&limit=4&after=4"
        ))
        .expect("page 2");
    assert_eq!(second["rows"].as_array().map(Vec::len), Some(2), "{second}");
    assert!(second["next_after"].is_null(), "{second}");
    let columns: Vec<&str> = first["columns"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let header: Vec<&str> = csv.lines().next().expect("header").split(',').collect();
    let without_params: Vec<&str> = header.iter().copied().filter(|c| *c != "x").collect();
    assert_eq!(columns, without_params, "one column list for CSV and JSON");
    let energy = first["columns"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "energy_j"))
        .expect("energy_j");
    assert_eq!(energy["type"], "number");
    assert_eq!(energy["unit"], "J");
    assert_eq!(energy["figure"], true, "a figure to plot: {energy}");
    let success = first["columns"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "success"))
        .expect("success");
    assert_eq!(success["figure"], false);
    let rows: Vec<&serde_json::Value> = first["rows"]
        .as_array()
        .into_iter()
        .chain(second["rows"].as_array())
        .flatten()
        .collect();
    for (row, line) in rows.iter().zip(csv.lines().skip(1)) {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(row["attempt_id"], cells[6], "same order as the CSV");
        assert_eq!(row["params"]["x"].to_string(), cells[7], "{row}");
        assert!(row["success"].is_boolean(), "{row}");
        assert!(row["gpus"].is_array(), "{row}");
    }
    let x_of_failures: Vec<i64> = rows
        .iter()
        .filter(|r| r["success"] == false)
        .filter_map(|r| r["params"]["x"].as_i64())
        .collect();
    assert_eq!(
        x_of_failures.len(),
        4,
        "odd x fail twice each: {x_of_failures:?}"
    );
    assert!(x_of_failures.iter().all(|x| x % 2 == 1));
    // `clean` says of each row what `clean_only` keeps.
    let kept: serde_json::Value = h
        .get(&format!(
            "/v1/export?experiment={exp}&format=json&clean_only=true"
        ))
        .expect("clean page");
    let ids = |rows: Vec<&serde_json::Value>| -> Vec<String> {
        rows.iter().map(|r| r["attempt_id"].to_string()).collect()
    };
    let marked = rows
        .iter()
        .copied()
        .filter(|r| r["clean"] == true)
        .collect();
    let kept_rows = kept["rows"].as_array().into_iter().flatten().collect();
    assert_eq!(ids(marked), ids(kept_rows));
    assert!(rows.iter().all(|r| r["clean"].is_boolean()), "{rows:?}");
    let (status, refused) = h
        .post("/v1/experiments/not-an-id/retry", &serde_json::json!({}))
        .expect("post");
    assert_eq!(status, 400, "{refused}");
    let bad = h.get::<serde_json::Value>("/v1/export?format=json&limit=0");
    let err = format!("{:#}", bad.expect_err("limit 0 is refused"));
    assert!(err.contains("limit"), "{err}");
}
