//! GPU telemetry and Prometheus metrics end to end: `headroom up` on fake GPUs samples
//! power, temperature and energy as the fake model says, the coordinator serves the series
//! per GPU and per attempt and through `show --telemetry`, and both `/metrics` pages parse
//! with a real Prometheus parser and say what happened.

use std::time::Duration;

use headroom_integration_tests::prom::{self, Sample, value};
use headroom_integration_tests::{Headroom, UpOptions, fake_job, free_port};
use headroom_shared::JobState;
use headroom_shared::api::TelemetryQuery;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn scrape(url: &str) -> Vec<Sample> {
    let page = prom::fetch(url).unwrap_or_else(|e| panic!("GET {url}: {e:#}"));
    prom::parse(&page).unwrap_or_else(|e| panic!("{e:#}"))
}

#[test]
fn telemetry_series_and_metrics_say_what_ran() {
    let port = free_port().expect("port");
    let metrics_addr = format!("127.0.0.1:{port}");
    // A short TTL: heartbeats (and so telemetry) every second.
    let h = Headroom::up(UpOptions::gpus("2x24GiB").lease_ttl("3s").flags(&[
        "--telemetry-interval",
        "200ms",
        "--metrics-addr",
        &metrics_addr,
    ]));
    h.wait_agent();
    let job = fake_job();
    let exp = h.submit_spec(serde_json::json!({
        "name": "busy",
        "command": [job, "--mem", "6GiB", "--util", "100", "--seconds", "3"],
        "runs_per_config": 3,
        "resources": {"gpus": 1, "memory": "6GiB"},
    }));
    let jobs = h.wait_done(exp, Duration::from_secs(120));
    assert!(
        jobs.iter().all(|j| j.state == JobState::Succeeded),
        "{jobs:?}"
    );

    // The attempt's series: its GPU over its run, at the fake model's busy power.
    let attempt = h.first_attempt(jobs[0].id);
    let t = h
        .api(|c| async move { c.attempt_telemetry(attempt.id).await })
        .expect("attempt telemetry");
    assert_eq!(t.gpus.len(), 1, "{t:?}");
    assert_eq!(t.gpus[0].gpu, attempt.gpus[0]);
    let samples = &t.gpus[0].samples;
    assert!(samples.len() >= 5, "3 s at 5 Hz: {} samples", samples.len());
    let started = attempt.started_at.expect("started");
    let ended = attempt.ended_at.expect("ended");
    assert!(samples.iter().all(|s| s.at >= started && s.at <= ended));
    // 6 of 24 GiB held at 100 % utilization: 60 + 240 x (0.25 x 0.25 + 0.75) = 255 W.
    let busy = samples
        .iter()
        .filter(|s| s.power_w == Some(255.0))
        .collect::<Vec<_>>();
    assert!(busy.len() >= 3, "{samples:?}");
    // The energy counter integrates power: between two busy samples it grew by 255 W times
    // the time between them (the load it saw held in between).
    let (a, b) = (busy[1], busy[busy.len() - 1]);
    let dt = (b.at - a.at).num_milliseconds() as f64 / 1000.0;
    let de = b.energy_j.expect("energy") - a.energy_j.expect("energy");
    assert!(
        (de - 255.0 * dt).abs() <= 255.0 * dt * 0.01 + 255.0 * 0.25,
        "{de} J over {dt} s"
    );
    let temps: Vec<f64> = samples.iter().filter_map(|s| s.temperature_c).collect();
    assert!(
        temps.last() > temps.first(),
        "the GPU warms under load: {temps:?}"
    );

    // One GPU's series, by node and index.
    let series = h
        .api(|c| async move {
            c.gpu_telemetry("test-node", 1, &TelemetryQuery::default())
                .await
        })
        .expect("GPU series");
    assert!(!series.samples.is_empty());
    assert!(series.samples.windows(2).all(|w| w[0].at <= w[1].at));

    // `show --telemetry` prints the summary, with the figures.
    let out = h.cli_ok(&["show", &jobs[0].id.to_string(), "--telemetry"]);
    assert!(out.contains("telemetry of attempt #1, GPU"), "{out}");
    assert!(out.contains("max 255.0 W"), "{out}");
    assert!(!out.contains("energy       not available"), "{out}");

    // The agent's page: outcomes, cleanup, and a GPU's memory as the fake backend has it.
    let _notebook = h.foreign_job("2x24GiB", &["--mem", "3GiB", "--seconds", "60"]);
    let agent_url = format!("http://{metrics_addr}/metrics");
    let page = h.wait_for(
        "the notebook's memory on the page",
        Duration::from_secs(20),
        || {
            let page = scrape(&agent_url);
            let used = value(
                &page,
                "headroom_gpu_memory_used_bytes",
                &[("node", "test-node"), ("gpu", "0")],
            );
            Ok((used == Some(3.0 * GIB)).then_some(page))
        },
    );
    let get = |name: &str, labels: &[(&str, &str)]| {
        value(&page, name, labels).unwrap_or_else(|| panic!("{name} {labels:?} in {page:?}"))
    };
    assert_eq!(
        get("headroom_attempts_total", &[("outcome", "succeeded")]),
        3.0
    );
    assert_eq!(get("headroom_cleanup_duration_seconds_count", &[]), 3.0);
    assert_eq!(
        get("headroom_gpu_memory_total_bytes", &[("gpu", "1")]),
        24.0 * GIB
    );
    assert_eq!(get("headroom_gpu_slots", &[("gpu", "0")]), 1.0);
    assert_eq!(get("headroom_gpu_slots_used", &[("gpu", "0")]), 0.0);
    assert_eq!(get("headroom_gpu_quarantined", &[("gpu", "1")]), 0.0);
    assert_eq!(get("headroom_gpu_power_watts", &[("gpu", "1")]), 60.0);
    assert!(get("headroom_gpu_energy_joules_total", &[("gpu", "0")]) > 0.0);
    assert!(get("headroom_gpu_temperature_celsius", &[("gpu", "0")]) > 30.0);
    // Labelled as the DCGM exporter labels its GPUs, so the two join on `UUID`.
    assert_eq!(
        get(
            "headroom_gpu_power_watts",
            &[
                ("gpu", "1"),
                ("UUID", "GPU-fake-0000-0000-0000-000000000001"),
                ("modelName", "Fake GPU")
            ]
        ),
        60.0
    );
    // The notebook's memory is its own: none unattributed.
    assert_eq!(
        get("headroom_gpu_memory_unattributed_bytes", &[("gpu", "0")]),
        0.0
    );
    let energy = page
        .iter()
        .find(|s| s.family == "headroom_gpu_energy_joules")
        .expect("energy family");
    assert_eq!(
        (energy.kind.as_str(), energy.unit.as_str()),
        ("counter", "joules")
    );

    // The coordinator's page.
    let page = scrape(&format!("{}/metrics", h.url));
    let get = |name: &str, labels: &[(&str, &str)]| {
        value(&page, name, labels).unwrap_or_else(|| panic!("{name} {labels:?} in {page:?}"))
    };
    assert_eq!(get("headroom_jobs", &[("state", "succeeded")]), 3.0);
    assert_eq!(get("headroom_jobs", &[("state", "queued")]), 0.0);
    assert_eq!(get("headroom_queue_depth", &[]), 0.0);
    assert_eq!(get("headroom_leases", &[]), 0.0);
    assert_eq!(get("headroom_agents_up", &[]), 1.0);
    assert_eq!(
        get("headroom_pending_jobs", &[("reason", "no_free_slot")]),
        0.0
    );
    assert_eq!(get("headroom_submit_to_start_seconds_count", &[]), 3.0);
    assert_eq!(
        get("headroom_attempts_ended", &[("outcome", "succeeded")]),
        3.0
    );
    assert_eq!(get("headroom_attempts_ended", &[("outcome", "oom")]), 0.0);
    assert_eq!(get("headroom_gpus", &[("status", "idle")]), 2.0);
    assert_eq!(get("headroom_gpus", &[("status", "allocated")]), 0.0);
    assert_eq!(get("headroom_gpus", &[("status", "quarantined")]), 0.0);
    assert_eq!(
        get(
            "headroom_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    assert!(get("headroom_claim_duration_seconds_count", &[]) >= 1.0);
}

#[test]
fn impossible_telemetry_is_refused_naming_the_field_and_nothing_is_written() {
    // The test speaks for a probe agent (as the anonymous admin of an open `up`).
    let h = Headroom::up(UpOptions::gpus("1x24GiB").flags(&["--no-auth"]));
    let (status, reg) = h
        .post(
            "/v1/agents/register",
            &serde_json::json!({
                "node": "probe",
                "gpus": [{"index": 0, "uuid": "GPU-x", "name": "x", "total_mib": 1000}],
                "version": "test",
            }),
        )
        .expect("register");
    assert_eq!(status, 200, "{reg}");
    let agent = reg["agent"].as_str().expect("agent id").to_string();
    let at = chrono::Utc::now().to_rfc3339();
    let heartbeat = |power: f64, gpu: u32| {
        h.post(
            &format!("/v1/agents/{agent}/heartbeat"),
            &serde_json::json!({
                "gpus": [], "attempts": [],
                "telemetry": [
                    {"gpu": 0, "at": at, "power_w": 100.0},
                    {"gpu": gpu, "at": chrono::Utc::now().to_rfc3339(), "power_w": power},
                ],
            }),
        )
        .expect("heartbeat")
    };
    let (status, body) = heartbeat(-5.0, 0);
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "telemetry[1].power_w", "{body}");
    let (status, body) = heartbeat(5.0, 3);
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "telemetry[1].gpu", "{body}");
    let none = h
        .api(|c| async move {
            c.gpu_telemetry("probe", 0, &TelemetryQuery::default())
                .await
        })
        .expect("series");
    assert!(none.samples.is_empty(), "{none:?}");
    let (status, body) = heartbeat(5.0, 0);
    assert_eq!(status, 200, "{body}");
}
