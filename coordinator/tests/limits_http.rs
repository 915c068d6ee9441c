//! What a client sends is bounded after expansion, over real HTTP: a submission whose jobs
//! would be too large once expanded is refused naming the field, before it costs the
//! coordinator their size; a dry run's answer shows a bounded preview.

mod common;

use std::time::Duration;

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

/// Reads from `stream` until the server closes it (or `limit` passes): when it closed, and
/// what it sent.
async fn read_until_closed(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    limit: Duration,
) -> Option<(Duration, String)> {
    use tokio::io::AsyncReadExt;
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let left = limit.checked_sub(started.elapsed())?;
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => {
                return Some((
                    started.elapsed(),
                    String::from_utf8_lossy(&got).into_owned(),
                ));
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A slow client cannot hold a connection: a head trickled a byte at a time (slowloris), a
/// kept-alive connection left idle, and a body that stops part way are each closed within
/// the bounds, while a long-poll whose head arrived is answered when its wait ends, past
/// the header bound.
#[tokio::test]
async fn slow_and_idle_connections_are_closed_and_long_polls_are_not() {
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    let limits = headroom_coordinator::serve::Limits {
        header: Duration::from_secs(1),
        body_idle: Duration::from_secs(1),
        connections: 64,
    };
    let s = Server::start(|c| headroom_coordinator::CoordinatorConfig {
        http: limits,
        long_poll: Duration::from_millis(2500),
        ..c
    })
    .await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let bound = Duration::from_secs(4);

    // Slowloris: a header line every 300 ms, never the blank line that ends the head.
    let slow = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let (mut reader, mut writer) = slow.into_split();
    let trickle = tokio::spawn(async move {
        let _ = writer
            .write_all(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await;
        for i in 0..30 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let line = format!("X-Slow-{i}: x\r\n");
            if writer.write_all(line.as_bytes()).await.is_err() {
                return;
            }
        }
    });
    let closed = read_until_closed(&mut reader, bound).await;
    trickle.abort();
    assert!(
        closed.is_some(),
        "a trickled head held its connection past {bound:?}"
    );

    // A kept-alive connection left idle after one answer.
    let mut idle = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    idle.write_all(b"GET /v1/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    let (after, sent) = read_until_closed(&mut idle, bound)
        .await
        .expect("an idle kept-alive connection was held open");
    assert!(sent.starts_with("HTTP/1.1 200"), "{sent}");
    assert!(
        after >= Duration::from_millis(900),
        "closed after {after:?}"
    );

    // A body that stops part way.
    let mut body = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    body.write_all(
        b"POST /v1/experiments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
          Content-Length: 500\r\n\r\n{\"spec\": {\"name\": ",
    )
    .await
    .expect("write");
    read_until_closed(&mut body, bound)
        .await
        .expect("a stalled body held its connection");

    // A long-poll outlasts the header bound: its head arrived at once.
    let p: Value = s
        .http
        .get(format!("{}/v1/progress", s.base))
        .send()
        .await
        .expect("progress")
        .json()
        .await
        .expect("json");
    let started = std::time::Instant::now();
    let r = s
        .http
        .get(format!(
            "{}/v1/progress?after={}&timeout_ms=2000",
            s.base, p["version"]
        ))
        .send()
        .await
        .expect("long-poll");
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        started.elapsed()
    );
}

/// A client lets an idle connection go before the coordinator closes it. The coordinator
/// closes a connection idle for [`SERVER_IDLE_CLOSE`]; a request sent on it at that instant
/// fails ("error sending request"), and an agent's heartbeats, every 10 s with the default
/// TTL, would meet that instant again and again. Idle past [`POOL_IDLE`], the client's next
/// request opens a new connection (counted by a relay in front of the coordinator).
#[tokio::test]
async fn a_client_lets_an_idle_connection_go_before_the_coordinator_closes_it() {
    use headroom_shared::client::{Client, POOL_IDLE, SERVER_IDLE_CLOSE};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    assert!(POOL_IDLE * 2 <= SERVER_IDLE_CLOSE);
    assert_eq!(
        headroom_coordinator::serve::Limits::default().header,
        SERVER_IDLE_CLOSE
    );
    let s = Server::start(|c| c).await;
    let upstream = s.base.trim_start_matches("http://").to_string();
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = relay.local_addr().expect("addr").port();
    let opened = Arc::new(AtomicUsize::new(0));
    let counted = opened.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = relay.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    let client = Client::new(&format!("http://127.0.0.1:{port}")).expect("client");
    client.health().await.expect("health");
    client
        .health()
        .await
        .expect("health, on the same connection");
    assert_eq!(opened.load(Ordering::SeqCst), 1);
    tokio::time::sleep(POOL_IDLE + Duration::from_millis(500)).await;
    client.health().await.expect("health, after a while");
    assert_eq!(
        opened.load(Ordering::SeqCst),
        2,
        "a connection idle for {POOL_IDLE:?} was reused: the coordinator closes it at \
         {SERVER_IDLE_CLOSE:?}"
    );
}
