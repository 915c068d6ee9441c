//! What a client sends is bounded after expansion, over real HTTP: a submission whose jobs
//! would be too large once expanded is refused naming the field, before it costs the
//! coordinator their size; a dry run's answer shows a bounded preview.

mod common;

use serde_json::{Value, json};

use common::{Server, peak_rss_mib};

async fn submit(s: &Server, body: &Value) -> (u16, Value, usize) {
    let resp = s
        .http
        .post(format!("{}/v1/experiments", s.base))
        .json(body)
        .send()
        .await
        .expect("submit");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let len = text.len();
    (status, serde_json::from_str(&text).expect("json"), len)
}

/// The reproduction: a 20 KB `env` copied into each of 100,000 jobs (2 GB), and large
/// parameter values rendered into each job's arguments; both refused with 422 naming the
/// field and the figures, memory barely moved, nothing stored.
#[tokio::test]
async fn a_submission_too_large_once_expanded_is_refused_before_it_costs_its_size() {
    let s = Server::start(|c| c).await;
    let before = peak_rss_mib();
    let values: Vec<u32> = (0..1000).collect();
    let big_env = json!({"spec": {
        "name": "huge-env",
        "command": ["true", "{x}"],
        "env": {"BLOB": "x".repeat(20_000)},
        "grid": {"x": values},
        "runs_per_config": 100,
    }});
    let started = std::time::Instant::now();
    let (status, v, _) = submit(&s, &big_env).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], "env", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("100000 jobs")
            && msg.contains("64.0 MiB")
            && msg.contains("--max-submit-size"),
        "{msg}"
    );
    // Values that only grow once rendered into each job's arguments: refused part way.
    let blobs: Vec<String> = (0..10)
        .map(|i| format!("{i}{}", "y".repeat(10_000)))
        .collect();
    let big_args = json!({"spec": {
        "name": "huge-args",
        "command": ["echo", "{x}", "{x}"],
        "grid": {"x": blobs},
        "runs_per_config": 10_000,
    }});
    let (status, v, _) = submit(&s, &big_args).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], "spec", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("first") && msg.contains("already take"),
        "{msg}"
    );
    let grew = peak_rss_mib().saturating_sub(before);
    // Unbounded, the first cost about 2 GB; bounded, at most the 64 MiB bound's worth.
    assert!(grew < 400, "memory grew {grew} MiB");
    eprintln!("refused in {:?}, peak RSS +{grew} MiB", started.elapsed());
    let (status, list, _) = {
        let r = s
            .http
            .get(format!("{}/v1/experiments", s.base))
            .send()
            .await
            .expect("list");
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.expect("json"), 0)
    };
    assert_eq!(status, 200);
    assert_eq!(list.as_array().map(Vec::len), Some(0), "{list}");

    // The bound is the coordinator's to set: a smaller one refuses a smaller matrix.
    let small = Server::start(|c| headroom_coordinator::CoordinatorConfig {
        max_submit_bytes: 1024 * 1024,
        ..c
    })
    .await;
    let spec = json!({"spec": {"name": "ok", "command": ["true", "{x}"],
                               "grid": {"x": (0..4000).collect::<Vec<u32>>()}}});
    let (status, v, _) = submit(&small, &spec).await;
    assert_eq!(status, 422, "{v}");
    let (status, v, _) = submit(&s, &spec).await;
    assert_eq!(status, 200, "{v}");
}

/// A dry run of 50,000 jobs answers their count, the first 1,000 and how many it left out:
/// a bounded answer, not the whole matrix.
#[tokio::test]
async fn a_dry_run_answers_a_bounded_preview() {
    let s = Server::start(|c| c).await;
    let spec = json!({"dry_run": true, "spec": {
        "name": "wide", "command": ["train", "--lr", "{lr}", "--seed", "{run}"],
        "grid": {"lr": (0..500).collect::<Vec<u32>>()}, "runs_per_config": 100}});
    let (status, v, len) = submit(&s, &spec).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["jobs"], 50_000);
    assert_eq!(v["preview"].as_array().map(Vec::len), Some(1_000));
    assert_eq!(v["preview_omitted"], 49_000);
    assert_eq!(v["preview"][999]["index"], 999);
    assert!(len < 1_000_000, "the answer took {len} bytes");
}
