//! Alerts end to end: a quarantine posted to a webhook and mailed through a real SMTP server
//! within seconds, once; an alert that outlives a `kill -9` of the coordinator and a
//! receiver that was down, delivered once after; one whose receiver never comes back kept
//! as a dead letter that `headroom alerts` shows. (Two replicas delivering once between
//! them: `cluster::two_replicas_four_agents_a_thousand_jobs_each_succeed_once`.)

use std::time::{Duration, Instant};

use headroom_integration_tests::receivers::{SmtpServer, WebhookReceiver};
use headroom_integration_tests::{Headroom, UpOptions, books_for, bystander};
use headroom_shared::api::alerts::{AlertTarget, AlertsView, DeliveryState, DeliveryView};

fn kind_of(r: &headroom_integration_tests::receivers::Received) -> String {
    r.json()["kind"].as_str().unwrap_or_default().to_string()
}

/// A job leaves 3 GiB booked on a process of another owner: its GPU is quarantined, and
/// the subscribers hear of it within 5 s: one POST (headroom's JSON, its idempotency key
/// in a header and the body, no token anywhere) and one mail.
#[test]
fn a_quarantine_is_posted_and_mailed_once_within_seconds() {
    let hook = WebhookReceiver::start().expect("receiver");
    let dir = tempfile::tempdir().expect("tempdir");
    let smtp = SmtpServer::start(dir.path()).expect("aiosmtpd");
    let hosts = format!("127.0.0.1:{}", hook.port);
    let smtp_url = format!("smtp://127.0.0.1:{}", smtp.port);
    let h = Headroom::up(
        UpOptions::gpus("1x24GiB")
            .kill_grace("300ms")
            .flags(&["--verify-timeout", "1s", "--alert-webhook-hosts", &hosts])
            .flags(&["--smtp-url", &smtp_url, "--alert-from", "headroom@lab.test"]),
    );
    h.wait_agent();
    let out = h.cli_ok(&[
        "alerts",
        "add",
        "--on",
        "gpu-quarantined,experiment-ended",
        "--webhook",
        &hook.url("/hooks/T0/secret-path"),
    ]);
    assert!(out.contains("subscription"), "{out}");
    assert!(
        !out.contains("secret-path"),
        "the URL is shown redacted: {out}"
    );
    h.cli_ok(&[
        "alerts",
        "add",
        "--on",
        "gpu-quarantined",
        "--email",
        "ada@lab.test",
    ]);
    // The same event in Slack's words, the URL read from a file.
    let hook_file = dir.path().join("slack-hook");
    std::fs::write(&hook_file, hook.url("/slack")).expect("write");
    h.cli_ok(&[
        "alerts",
        "add",
        "--on",
        "gpu-quarantined",
        "--webhook-file",
        &hook_file.display().to_string(),
        "--slack",
    ]);
    // A bad one is refused, naming its field.
    let refused = h.cli(&[
        "alerts",
        "add",
        "--on",
        "gpu-quarantined",
        "--webhook",
        "http://198.51.100.7/x",
    ]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("target.webhook.url"),
        "{err}"
    );

    let holder = bystander();
    let exp = h.submit_spec(serde_json::json!({"name": "leak",
        "command": books_for(holder.0.id()), "resources": {"memory": "1GiB"}}));
    h.wait_done(exp, Duration::from_secs(30));
    let ended = Instant::now();
    let posted = h.wait_for("the quarantine's POST", Duration::from_secs(10), || {
        Ok(hook
            .received()
            .into_iter()
            .find(|r| kind_of(r) == "gpu-quarantined"))
    });
    assert!(
        posted.at <= ended + Duration::from_secs(5),
        "posted {:?} after the job's end",
        posted.at.saturating_duration_since(ended)
    );
    let mail = h.wait_for("the quarantine's mail", Duration::from_secs(10), || {
        Ok(smtp.mails().into_iter().next())
    });
    // The figure: from the event (the attempt's end recorded) to the POST's arrival.
    let event_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(posted.json()["at"].clone()).expect("the event's time");
    let arrived: chrono::DateTime<chrono::Utc> = posted.wall.into();
    eprintln!(
        "the quarantine's POST came {} ms after its event; its mail within {:?} of the job's \
         end being seen",
        (arrived - event_at).num_milliseconds(),
        ended.elapsed()
    );
    assert!(
        Instant::now() <= ended + Duration::from_secs(5),
        "mailed late"
    );
    let body = posted.json();
    assert_eq!(posted.path, "/hooks/T0/secret-path");
    assert_eq!(
        posted.headers.get("idempotency-key").map(String::as_str),
        body["id"].as_str(),
        "{:?}",
        posted.headers
    );
    assert_eq!(body["details"]["gpu"], 0);
    assert!(
        body["summary"]
            .as_str()
            .is_some_and(|s| s.contains("quarantined")),
        "{body}"
    );
    assert!(
        mail.contains("Subject: [headroom] GPU 0 of node test-node quarantined"),
        "{mail}"
    );
    // The mail's key is its own delivery's.
    let v: AlertsView = h.get("/v1/alerts").expect("alerts");
    let mailbox = v
        .subscriptions
        .iter()
        .find(|s| matches!(s.target, AlertTarget::Email { .. }))
        .expect("the mail subscription");
    let mailed = v
        .deliveries
        .iter()
        .find(|d| d.subscription == mailbox.id)
        .expect("its delivery");
    assert!(
        mail.contains(&format!("Message-ID: <{}@headroom>", mailed.id)),
        "{mail}"
    );
    // No credential of headroom's in what left it.
    let token = h.admin_token().expect("the admin token");
    for text in hook
        .received()
        .iter()
        .map(|r| format!("{:?}{}", r.headers, r.body))
        .chain([mail])
    {
        assert!(!text.contains(&token) && !text.contains("hr_"), "{text}");
    }
    // Once each, and the experiment's end beside it.
    h.wait_for("the experiment's end", Duration::from_secs(10), || {
        Ok(hook
            .received()
            .iter()
            .any(|r| kind_of(r) == "experiment-ended")
            .then_some(()))
    });
    std::thread::sleep(Duration::from_secs(2));
    let (slack, ours): (Vec<_>, Vec<_>) = hook
        .received()
        .into_iter()
        .partition(|r| r.path == "/slack");
    assert_eq!(slack.len(), 1);
    let text = slack[0].json()["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        text.contains("GPU 0 of node test-node quarantined"),
        "{text}"
    );
    let kinds: Vec<String> = ours.iter().map(kind_of).collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "gpu-quarantined").count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(kinds.len(), 2, "{kinds:?}");
    assert_eq!(smtp.mails().len(), 1);
    let listed = h.cli_ok(&["alerts"]);
    assert!(
        listed.contains("delivered") && listed.contains("gpu-quarantined"),
        "{listed}"
    );
    assert!(!listed.contains("secret-path"), "{listed}");
}

/// The delivery's state of the subscription whose target names `port`.
fn delivery_to(h: &Headroom, port: u16) -> Option<(DeliveryState, u32)> {
    delivery_view(h, port).map(|d| (d.state, d.tries))
}

fn delivery_view(h: &Headroom, port: u16) -> Option<DeliveryView> {
    let v: AlertsView = h.get("/v1/alerts").ok()?;
    let sub = v
        .subscriptions
        .iter()
        .find(|s| s.target.to_string().contains(&format!(":{port}")))?;
    v.deliveries.into_iter().find(|d| d.subscription == sub.id)
}

/// The delivery failed at least `tries` times and waits for its next try, not held by a
/// claim (a claim holds it two minutes; one cut by a kill -9 is waited out, which is right
/// but long for a test).
fn backing_off(h: &Headroom, port: u16, tries: u32) -> bool {
    let now = chrono::Utc::now();
    delivery_view(h, port).is_some_and(|d| {
        d.state == DeliveryState::Pending
            && d.tries >= tries
            && d.next_try_at.is_some_and(|t| {
                t > now + chrono::Duration::milliseconds(300)
                    && t < now + chrono::Duration::seconds(60)
            })
    })
}

/// The experiment's end is due to two receivers that are down. The coordinator is killed
/// -9 between the event and its delivery and started again; one receiver comes back and
/// gets the alert once, the other never does and it becomes a dead letter. Retries run 50x
/// faster than the defaults (the first after 200 ms instead of 10 s, doubling), so the ~5 s
/// the receiver is down stand for four minutes at a lab's settings.
#[test]
fn an_alert_outlives_a_kill_9_and_a_receiver_that_was_down() {
    let mut back = WebhookReceiver::down().expect("receiver");
    let never = WebhookReceiver::down().expect("receiver");
    let hosts = format!("127.0.0.1:{},127.0.0.1:{}", back.port, never.port);
    let mut h = Headroom::up(UpOptions::gpus("1x24GiB").flags(&[
        "--alert-webhook-hosts",
        &hosts,
        "--alert-retry",
        "200ms",
        "--alert-tries",
        "7",
    ]));
    h.wait_agent();
    for r in [&back, &never] {
        h.cli_ok(&[
            "alerts",
            "add",
            "--on",
            "experiment-ended",
            "--webhook",
            &r.url("/hook"),
        ]);
    }
    let exp = h.submit_spec(serde_json::json!({"name": "short", "command": ["true"]}));
    h.wait_done(exp, Duration::from_secs(30));
    h.wait_for(
        "both backing off after failed tries",
        Duration::from_secs(20),
        || Ok((backing_off(&h, back.port, 3) && backing_off(&h, never.port, 3)).then_some(())),
    );
    h.kill9().expect("kill -9");
    h.restart().expect("restart");
    back.listen().expect("listen again");
    let got = h.wait_for(
        "the delivery after the restart",
        Duration::from_secs(60),
        || Ok(back.received().into_iter().next()),
    );
    assert_eq!(kind_of(&got), "experiment-ended");
    h.wait_for("the dead letter", Duration::from_secs(60), || {
        Ok(delivery_to(&h, never.port).filter(|(s, _)| *s == DeliveryState::Dead))
    });
    assert_eq!(
        delivery_to(&h, back.port).map(|d| d.0),
        Some(DeliveryState::Delivered)
    );
    assert_eq!(back.received().len(), 1, "delivered once");
    let listed = h.cli_ok(&["alerts"]);
    assert!(listed.contains("1 dead letter(s)"), "{listed}");
    assert!(listed.contains("given up after 7 tries"), "{listed}");
}

/// A job declared at 1 GiB holds 5: its GPU's use and its ledger part. The drift is shown by
/// `headroom nodes`, counted on `/metrics` once it lasts, and told to the webhook once.
#[test]
fn a_gpu_that_drifts_from_its_ledger_is_shown_counted_and_told() {
    let hook = WebhookReceiver::start().expect("receiver");
    let hosts = format!("127.0.0.1:{}", hook.port);
    // A short TTL: heartbeats, which carry the node's readings, every 2 s.
    let h = Headroom::up(UpOptions::gpus("1x24GiB").lease_ttl("6s").flags(&[
        "--alert-webhook-hosts",
        &hosts,
        "--alert-drift-after",
        "2s",
    ]));
    h.wait_agent();
    h.cli_ok(&[
        "alerts",
        "add",
        "--on",
        "gpu-drift",
        "--webhook",
        &hook.url("/drift"),
    ]);
    let job = headroom_integration_tests::fake_job().display().to_string();
    let exp = h.submit_spec(serde_json::json!({"name": "bigger-than-said",
        "command": [job, "--mem", "5GiB", "--seconds", "10"], "resources": {"memory": "1GiB"}}));
    let told = h.wait_for("the drift's POST", Duration::from_secs(20), || {
        Ok(hook.received().into_iter().next())
    });
    let body = told.json();
    assert_eq!(body["kind"], "gpu-drift", "{body}");
    assert_eq!(body["details"]["direction"], "over", "{body}");
    assert_eq!(body["details"]["placed_mib"], 1024, "{body}");
    let nodes = h.cli_ok(&["nodes"]);
    assert!(nodes.contains("DRIFT over by"), "{nodes}");
    let (_, page) =
        headroom_integration_tests::http_get_text(&format!("{}/metrics", h.url)).expect("metrics");
    assert!(
        page.contains("headroom_gpus_drifting{direction=\"over\"} 1"),
        "{page}"
    );
    h.wait_done(exp, Duration::from_secs(30));
    assert_eq!(hook.received().len(), 1, "told once");
}
