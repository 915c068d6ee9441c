//! Per-attempt measurements end to end, through the real binaries on fake GPUs: energy and
//! power per attempt, the throttle and contamination flags, in `show`, the API and
//! `export --csv`, and `export --clean-only` leaving the flagged rows out.

use std::time::Duration;

use headroom_integration_tests::{Headroom, UpOptions, csv_table, fake_job};
use headroom_shared::JobState;
use headroom_shared::api::{EnergySource, ShareMethod};
use headroom_shared::pending::PendingReason;

fn read_pid(path: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[test]
fn export_has_the_measurements_and_clean_only_leaves_out_flagged_rows() {
    // One GPU, one slot: the runs go one at a time, as a lab measures.
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    let job = fake_job().display().to_string();
    let dir = h.fake_gpu_dir();
    let run = |spec: serde_json::Value| {
        let exp = h.submit_spec(spec);
        h.wait_done(exp, Duration::from_secs(60))
    };

    // Alone on its GPU at a known load: 1 GiB of 24 at 50 % draws, by the fake model,
    // 60 W + 240 W x (0.25 x 1/24 + 0.75 x 0.5).
    let clean = run(serde_json::json!({"name": "clean",
        "command": [job, "--mem", "1GiB", "--util", "50", "--seconds", "2"],
        "resources": {"memory": "2GiB"}}));
    assert_eq!(clean[0].state, JobState::Succeeded);
    let a = h.first_attempt(clean[0].id);
    let m = &a.measurements;
    let power = 60.0 + 240.0 * (0.25 / 24.0 + 0.75 * 0.5);
    assert_eq!(m.energy_source, Some(EnergySource::Counter), "{a:#?}");
    assert!(
        m.energy_j
            .is_some_and(|e| (e - power * 2.0).abs() < power * 2.0 * 0.05),
        "{a:#?}: want about {} J",
        power * 2.0
    );
    assert!(
        m.max_power_w.is_some_and(|p| (p - power).abs() < 0.01),
        "{a:#?}"
    );
    assert_eq!(
        (m.throttled_thermal, m.throttled_power),
        (Some(false), Some(false))
    );
    let shown = h.cli_ok(&["show", &clean[0].id.to_string()]);
    assert!(shown.contains("J (counter)  power mean"), "{shown}");

    // The GPU caps its power while this one runs (as the fake GPUs' own user sets it).
    let pid_file = h.path("throttled.pid");
    let exp = h.submit_spec(serde_json::json!({"name": "throttled",
        "command": [job, "--mem", "1GiB", "--util", "90", "--seconds", "2",
                    "--pid-file", pid_file.display().to_string()],
        "resources": {"memory": "2GiB"}}));
    h.wait_for("the job to start", Duration::from_secs(30), || {
        Ok(read_pid(&pid_file))
    });
    std::fs::write(dir.join("gpu0.throttle"), "sw_power_cap").expect("throttle");
    let throttled = h.wait_done(exp, Duration::from_secs(60));
    std::fs::remove_file(dir.join("gpu0.throttle")).expect("unthrottle");
    let a = h.first_attempt(throttled[0].id);
    assert_eq!(a.measurements.throttled_power, Some(true), "{a:#?}");
    assert_eq!(a.measurements.throttled_thermal, Some(false), "{a:#?}");
    let shown = h.cli_ok(&["show", &throttled[0].id.to_string()]);
    assert!(shown.contains("THROTTLED power"), "{shown}");

    // A job of another user cannot fake its GPU's faults for the others: its control file
    // is not the fake GPUs' user's, and is ignored.
    let faked = nix::unistd::geteuid().is_root();
    if !faked {
        headroom_integration_tests::premise_missing("root (a job of another user)");
    }
    if faked {
        let script = format!(
            "{job} --mem 1GiB --util 90 --seconds 1.5 & \
             echo sw_power_cap > {d}/gpu0.throttle; wait; rm -f {d}/gpu0.throttle",
            d = dir.display()
        );
        let faked = run(serde_json::json!({"name": "faked",
            "command": ["sh", "-c", script], "resources": {"memory": "2GiB"}}));
        let a = h.first_attempt(faked[0].id);
        assert_eq!(a.measurements.throttled_power, Some(false), "{a:#?}");
    }

    // Someone's process shares the GPU for a while.
    let pid_file = h.path("job.pid");
    let exp = h.submit_spec(serde_json::json!({"name": "shared",
        "command": [job, "--mem", "1GiB", "--seconds", "4",
                    "--pid-file", pid_file.display().to_string()],
        "resources": {"memory": "2GiB"}}));
    h.wait_for(
        "the job to hold its memory",
        Duration::from_secs(30),
        || Ok(read_pid(&pid_file)),
    );
    let foreign = h.foreign_job("1x24GiB", &["--mem", "1GiB", "--seconds", "2"]);
    let shared = h.wait_done(exp, Duration::from_secs(60));
    drop(foreign);
    assert_eq!(h.first_attempt(shared[0].id).contaminated, Some(true));

    // A failure is no reason to leave a row out: `success` says it. Its parameter reads
    // like a spreadsheet formula, which the export must not hand a spreadsheet to run.
    let failed = run(serde_json::json!({"name": "failed",
        "command": ["sh", "-c", "exit 3"], "grid": {"note": ["=1+1"]},
        "resources": {"memory": "1GiB"},
        "retry": {"max_attempts": 1}}));
    assert_eq!(failed[0].state, JobState::Failed);

    let (header, rows) = csv_table(&h.cli_ok(&["export", "--csv"]));
    for col in [
        "energy_j",
        "energy_source",
        "mean_power_w",
        "max_power_w",
        "max_temp_c",
        "start_temp_c",
        "mean_util_pct",
        "throttled_thermal",
        "throttled_power",
        "contaminated",
        "contamination_reason",
    ] {
        assert!(
            header.iter().any(|h| h == col),
            "no column {col}: {header:?}"
        );
    }
    let col = |name: &str| header.iter().position(|h| h == name).expect("column");
    let by_name = |rows: &[Vec<String>], name: &str| {
        rows.iter()
            .find(|r| r[col("experiment")] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no row of {name}: {rows:?}"))
    };
    let clean_row = by_name(&rows, "clean");
    assert_eq!(clean_row[col("energy_source")], "counter");
    assert_eq!(clean_row[col("throttled_power")], "false");
    assert!(
        clean_row[col("energy_j")]
            .parse::<f64>()
            .is_ok_and(|e| e > 0.0)
    );
    assert_eq!(by_name(&rows, "throttled")[col("throttled_power")], "true");
    let shared_row = by_name(&rows, "shared");
    assert_eq!(shared_row[col("contaminated")], "true");
    assert!(
        shared_row[col("contamination_reason")].contains("on GPU 0"),
        "{shared_row:?}"
    );
    assert_eq!(by_name(&rows, "failed")[col("note")], "'=1+1");
    assert_eq!(rows.len(), 4 + usize::from(faked));

    let (_, kept) = csv_table(&h.cli_ok(&["export", "--csv", "--clean-only"]));
    let mut names: Vec<&str> = kept.iter().map(|r| r[col("experiment")].as_str()).collect();
    names.sort_unstable();
    let clean: &[&str] = if faked {
        &["clean", "failed", "faked"]
    } else {
        &["clean", "failed"]
    };
    assert_eq!(names, clean, "{kept:?}");
}

/// A colocated attempt through the binaries: its figures are its GPU's (foreground and
/// background), its background is no contamination, and `export --csv` carries the
/// background's record after the measurements, empty for an attempt that ran alone.
#[test]
fn export_has_a_colocated_attempts_background_and_its_gpus_figures() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    let job = fake_job().display().to_string();
    // `mode` switches the background on (`colocate.when`): alone and colocated, one GPU,
    // one at a time. Foreground and background each hold 1 GiB at 40 %.
    let exp = h.submit_spec(serde_json::json!({"name": "pair",
        "command": [&job, "--mem", "1GiB", "--util", "40", "--seconds", "2"],
        "grid": {"mode": ["alone", "colocated"]},
        "resources": {"gpus": 1, "memory": "2GiB"},
        "retry": {"max_attempts": 1},
        "colocate": {"command": [&job, "--mem", "1GiB", "--util", "40", "--seconds", "3600"],
                     "memory": "2GiB", "when": {"mode": "colocated"}}}));
    let jobs = h.wait_done(exp, Duration::from_secs(90));
    let of = |mode: &str| {
        let j = jobs
            .iter()
            .find(|j| j.params.get("mode").and_then(|v| v.as_str()) == Some(mode))
            .unwrap_or_else(|| panic!("no {mode} job: {jobs:?}"));
        assert_eq!(j.state, JobState::Succeeded, "{j:?}");
        h.first_attempt(j.id)
    };
    let (alone, pair) = (of("alone"), of("colocated"));
    let bg_pid = pair.background_pid.expect("the background ran");
    assert_eq!(alone.background_pid, None);
    assert_eq!(pair.contaminated, Some(false), "{pair:#?}");
    assert_eq!(pair.measurements.contamination_reason, None, "{pair:#?}");
    // The GPU draws for both: 60 W + 240 W x (0.25 x memory share + 0.75 x utilization).
    let power = |gib: f64, util: f64| 60.0 + 240.0 * (0.25 * gib / 24.0 + 0.75 * util);
    for (a, want) in [(&alone, power(1.0, 0.4)), (&pair, power(2.0, 0.8))] {
        let m = &a.measurements;
        assert_eq!(m.energy_source, Some(EnergySource::Counter), "{a:#?}");
        // The peak draw (the mean also counts the job's own start-up, below its load).
        assert!(
            m.max_power_w
                .is_some_and(|p| (p - want).abs() < want * 0.01),
            "{a:#?}: want a peak of {want} W"
        );
    }

    let (header, rows) = csv_table(&h.cli_ok(&["export", "--csv"]));
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name}: {header:?}"))
    };
    assert!(
        col("background_pid") > col("contamination_command"),
        "{header:?}"
    );
    let row = |mode: &str| {
        rows.iter()
            .find(|r| r[col("mode")] == mode)
            .cloned()
            .unwrap_or_else(|| panic!("no {mode} row: {rows:?}"))
    };
    let (alone_row, pair_row) = (row("alone"), row("colocated"));
    assert_eq!(pair_row[col("background_pid")], bg_pid.to_string());
    assert!(
        pair_row[col("background_ready_ms")].parse::<u64>().is_ok(),
        "{pair_row:?}"
    );
    assert_eq!(pair_row[col("background_exited_early")], "false");
    assert_eq!(pair_row[col("contaminated")], "false");
    for c in [
        "background_pid",
        "background_ready_ms",
        "background_exit_code",
        "background_signal",
        "background_exited_early",
    ] {
        assert_eq!(alone_row[col(c)], "", "{c}: {alone_row:?}");
    }
    // A background is no reason to leave a row out.
    let (_, kept) = csv_table(&h.cli_ok(&["export", "--csv", "--clean-only"]));
    assert_eq!(kept.len(), 2, "{kept:?}");
}

/// NVML may take seconds to open on a node without persistence mode. A job shorter than
/// that still gets figures from its first joule: its supervisor opened the GPUs while it
/// waited for the lease and took the start reading before the job's exec.
#[test]
fn a_short_jobs_energy_covers_its_run_when_the_gpus_open_slowly() {
    let mut h = Headroom::up(UpOptions::gpus("1x24GiB"));
    // Every open of these fake GPUs takes 3 s from now on: the agent's and its supervisors'.
    std::fs::write(h.fake_gpu_dir().join("open-delay"), "3s").expect("open delay");
    h.stop().expect("stop");
    h.restart().expect("restart");
    // The supervisor waiting for the first lease opens its GPUs meanwhile.
    std::thread::sleep(Duration::from_secs(4));
    // An idle GPU draws the fake model's 60 W.
    let exp = h.submit_spec(serde_json::json!({"name": "short",
        "command": ["sleep", "1"], "resources": {"memory": "1GiB"}}));
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let a = h.first_attempt(jobs[0].id);
    let m = &a.measurements;
    let run_s = match (a.started_at, a.ended_at) {
        (Some(s), Some(e)) => (e - s).num_milliseconds() as f64 / 1000.0,
        _ => panic!("no run: {a:#?}"),
    };
    assert_eq!(
        (m.covers_run, m.first_reading_ms),
        (Some(true), Some(0)),
        "{a:#?}"
    );
    // Opened ahead of the lease: the job did not wait the 3 s open for its start reading.
    let waited = a.started_at.expect("started") - a.leased_at;
    assert!(
        waited < chrono::TimeDelta::milliseconds(1500),
        "the job waited {waited} for its start reading: {a:#?}"
    );
    assert_eq!(m.energy_source, Some(EnergySource::Counter), "{a:#?}");
    let want = 60.0 * run_s;
    assert!(
        m.energy_j.is_some_and(|e| (e - want).abs() <= want * 0.05),
        "{a:#?}: want about {want} J over {run_s} s"
    );
}

/// Figures that begin after the job started (its GPUs could not be read then) are given,
/// flagged with how late they begin, and left out of `--clean-only`.
#[test]
fn figures_that_begin_late_are_flagged_and_not_clean() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB"));
    let fault = h.fake_gpu_dir().join("gpu0.fail-telemetry");
    std::fs::write(&fault, "GPU is lost").expect("fault");
    let exp = h.submit_spec(serde_json::json!({"name": "late",
        "command": ["sleep", "3"], "resources": {"memory": "1GiB"}}));
    let job = h.wait_for("the job to start", Duration::from_secs(30), || {
        Ok(h.jobs(exp)?
            .into_iter()
            .find(|j| j.state == JobState::Running))
    });
    std::thread::sleep(Duration::from_millis(1000));
    std::fs::remove_file(&fault).expect("GPU back");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let a = h.first_attempt(job.id);
    let m = &a.measurements;
    assert_eq!(m.covers_run, Some(false), "{a:#?}");
    assert!(
        m.first_reading_ms
            .is_some_and(|ms| (900..3000).contains(&ms)),
        "{a:#?}"
    );
    assert!(m.energy_j.is_some_and(|e| e > 0.0), "{a:#?}");
    let shown = h.cli_ok(&["show", &job.id.to_string()]);
    assert!(shown.contains("PARTIAL: figures begin"), "{shown}");
    let (header, rows) = csv_table(&h.cli_ok(&["export", "--csv"]));
    let col = |name: &str| header.iter().position(|h| h == name).expect(name);
    assert_eq!(rows[0][col("covers_run")], "false");
    let (_, kept) = csv_table(&h.cli_ok(&["export", "--csv", "--clean-only"]));
    assert!(kept.is_empty(), "{kept:?}");
}

/// Two attempts that ran on one GPU together are both `shared`: their energy is the GPU's
/// (so the two add up to more than the GPU drew), an apportioned share is given beside it
/// (the shares add up to the GPU's counter delta over both runs), and `--clean-only` leaves
/// both out.
#[test]
fn attempts_sharing_a_gpu_are_labelled_with_apportioned_shares_and_not_clean() {
    let h = Headroom::up(UpOptions::gpus("1x24GiB").plan("2"));
    let job = fake_job().display().to_string();
    let exp = h.submit_spec(serde_json::json!({"name": "pair",
        "command": [job, "--mem", "1GiB", "--util", "{util}", "--seconds", "3"],
        "grid": {"util": [30, 60]},
        "resources": {"memory": "2GiB"}}));
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    let attempts: Vec<_> = jobs.iter().map(|j| h.first_attempt(j.id)).collect();
    for a in &attempts {
        let s = a
            .sharing
            .as_ref()
            .unwrap_or_else(|| panic!("not shared: {a:#?}"));
        assert!(a.shared);
        assert!(s.overlap > 0.5, "{a:#?}");
        assert_eq!(a.measurements.covers_run, Some(true), "{a:#?}");
    }
    let windows: Vec<_> = attempts
        .iter()
        .map(|a| a.measurements.counters[0].clone())
        .collect();
    let first = windows
        .iter()
        .map(|w| w.from_j)
        .fold(f64::INFINITY, f64::min);
    let last = windows.iter().map(|w| w.to_j).fold(0.0, f64::max);
    let gpu_delta = last - first;
    let shares: f64 = attempts
        .iter()
        .map(|a| {
            a.sharing
                .as_ref()
                .and_then(|s| s.energy_share_j)
                .expect("share")
        })
        .sum();
    assert!((shares - gpu_delta).abs() < 1e-3, "{shares} vs {gpu_delta}");
    let whole: f64 = attempts
        .iter()
        .filter_map(|a| a.measurements.energy_j)
        .sum();
    assert!(
        whole > gpu_delta * 1.5,
        "each counts the GPU's: {whole} vs {gpu_delta}"
    );
    // The fake driver gives each process's utilization: the shares follow it.
    let by_util = |util: i64| {
        let (job, a) = jobs
            .iter()
            .zip(&attempts)
            .find(|(j, _)| j.params.get("util").and_then(|v| v.as_i64()) == Some(util))
            .unwrap_or_else(|| panic!("no util {util} job"));
        let s = a.sharing.clone().expect("shared");
        assert_eq!(
            s.share_method,
            ShareMethod::UtilizationWeighted,
            "{job:?}: {a:#?}"
        );
        let w = &a.measurements.counters[0];
        assert!(
            w.util_pct.is_some_and(|u| (u - util as f64).abs() < 1.0),
            "{w:?}"
        );
        s.energy_share_j.expect("share")
    };
    assert!(by_util(60) > by_util(30), "the busier attempt drew more");

    let (header, rows) = csv_table(&h.cli_ok(&["export", "--csv"]));
    let col = |name: &str| header.iter().position(|h| h == name).expect(name);
    for r in &rows {
        assert_eq!(r[col("shared")], "true");
        assert_eq!(r[col("energy_share_method")], "utilization_weighted");
        assert!(r[col("energy_share_j")].parse::<f64>().is_ok(), "{r:?}");
    }
    let (_, kept) = csv_table(&h.cli_ok(&["export", "--csv", "--clean-only"]));
    assert!(kept.is_empty(), "{kept:?}");
    let shown = h.cli_ok(&["show", &jobs[0].id.to_string()]);
    assert!(
        shown.contains("SHARED") && shown.contains("utilization_weighted, an estimate"),
        "{shown}"
    );
}

/// Memory no listed process accounts for ("ghost" memory: a process the driver does not
/// list, memory a dead one left behind) is shown per GPU in `nodes` and the API, flags the
/// attempt it appeared under (left out of `--clean-only`), and, when it stays after the
/// attempt's processes are gone, quarantines the GPU with that reason until it is gone.
#[test]
fn ghost_memory_is_shown_flagged_and_quarantines_until_it_is_gone() {
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .kill_grace("300ms")
            .flags(&["--verify-timeout", "1s"]),
    );
    let job = fake_job().display().to_string();
    let ghost = h.fake_gpu_dir().join("gpu0.ghost");
    let pid_file = h.path("job.pid");
    let exp = h.submit_spec(serde_json::json!({"name": "haunted",
        "command": [job, "--mem", "1GiB", "--seconds", "3",
                    "--pid-file", pid_file.display().to_string()],
        "resources": {"memory": "2GiB"}, "retry": {"max_attempts": 1}}));
    h.wait_for(
        "the job to hold its memory",
        Duration::from_secs(30),
        || Ok(read_pid(&pid_file)),
    );
    // 2 GiB appear on the GPU that no process accounts for, and stay.
    std::fs::write(&ghost, "2048").expect("ghost");
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    let a = h.first_attempt(jobs[0].id);
    assert_eq!(a.measurements.ghost_mib, Some(2048), "{a:#?}");
    assert_eq!(a.cleanup_verified, Some(false), "{a:#?}");
    let gpu = h.nodes().expect("nodes")[0].gpus[0].clone();
    assert_eq!(gpu.unattributed_mib, Some(2048), "{gpu:#?}");
    let q = gpu
        .quarantine
        .first()
        .unwrap_or_else(|| panic!("not quarantined: {gpu:#?}"));
    assert!(
        q.reason.contains("2048 MiB on GPU 0 stayed unattributed"),
        "{q:?}"
    );
    let nodes = h.cli_ok(&["nodes"]);
    assert!(
        nodes.contains("GHOST memory") && nodes.contains("QUARANTINED"),
        "{nodes}"
    );
    let shown = h.cli_ok(&["show", &jobs[0].id.to_string()]);
    assert!(shown.contains("GHOST memory: 2048 MiB"), "{shown}");
    let (header, rows) = csv_table(&h.cli_ok(&["export", "--csv"]));
    let col = |name: &str| header.iter().position(|h| h == name).expect(name);
    assert_eq!(rows[0][col("ghost_mib")], "2048");
    let (_, kept) = csv_table(&h.cli_ok(&["export", "--csv", "--clean-only"]));
    assert!(kept.is_empty(), "{kept:?}");

    // Nothing is placed on the GPU while the memory stays; it is lifted once it is gone.
    let next = h.submit_spec(serde_json::json!({"name": "after",
        "command": ["true"], "resources": {"memory": "1GiB"}}));
    let why = h.wait_refused(next, Duration::from_secs(30));
    assert_eq!(
        why,
        PendingReason::GpuQuarantined,
        "placed beside ghost memory?"
    );
    std::fs::remove_file(&ghost).expect("ghost gone");
    let jobs = h.wait_done(next, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let gpu = h.nodes().expect("nodes")[0].gpus[0].clone();
    assert!(gpu.quarantine.is_empty(), "{gpu:#?}");
    assert_eq!(gpu.unattributed_mib, Some(0), "{gpu:#?}");
}

/// A job whose GPUs cannot be read within `--start-reading-wait` (its supervisor still
/// opening NVML) starts anyway, its figures beginning at the first reading that came and
/// saying how late; that reading, still on its way at the job's start, is taken before the
/// end reading.
#[test]
fn a_job_whose_gpus_open_past_the_wait_starts_and_says_how_late_its_figures_begin() {
    let mut h = Headroom::up(UpOptions::gpus("1x24GiB").flags(&["--start-reading-wait", "500ms"]));
    std::fs::write(h.fake_gpu_dir().join("open-delay"), "6s").expect("open delay");
    h.stop().expect("stop");
    h.restart().expect("restart");
    // At once: the supervisor waiting for this lease is still opening its GPUs.
    let exp = h.submit_spec(serde_json::json!({"name": "early",
        "command": ["sleep", "8"], "resources": {"memory": "1GiB"}}));
    let jobs = h.wait_done(exp, Duration::from_secs(60));
    assert_eq!(jobs[0].state, JobState::Succeeded);
    let a = h.first_attempt(jobs[0].id);
    let m = &a.measurements;
    assert_eq!(m.covers_run, Some(false), "{a:#?}");
    assert!(
        m.first_reading_ms
            .is_some_and(|ms| (500..7_000).contains(&ms)),
        "{a:#?}"
    );
    assert!(m.energy_j.is_some_and(|e| e > 0.0), "{a:#?}");
    let waited = a.started_at.expect("started") - a.leased_at;
    assert!(
        waited < chrono::TimeDelta::milliseconds(3_000),
        "the job waited {waited} for the GPUs to open: {a:#?}"
    );
    let log = h.cli_ok(&["logs", &jobs[0].id.to_string()]);
    assert!(
        log.contains("the GPUs could not be read within 500ms"),
        "{log}"
    );
}
