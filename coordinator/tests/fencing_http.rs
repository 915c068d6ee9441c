//! The agents' API over real HTTP: a heartbeat or a log chunk carrying a stale token is
//! refused with 409 (`stale_fence`) and changes nothing; a claim held open is answered when
//! an end frees a slot on its own node, and held on through ends elsewhere; claims take
//! turns at the store, heartbeats do not wait for them.

mod common;

use std::time::Duration;

use headroom_shared::api::{ClaimResponse, Lease, NodeView, RegisterResponse};
use serde_json::{Value, json};

use common::Server;

/// Posts `body` to `url`: the status and the JSON answered (null when none).
async fn post_to(http: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let resp = http.post(url).json(body).send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

impl Server {
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        post_to(&self.http, &format!("{}{path}", self.base), body).await
    }

    /// [`Server::post`] from a task of its own, so the test goes on while it waits.
    fn spawn_post(&self, path: &str, body: &Value) -> tokio::task::JoinHandle<(u16, Value)> {
        let (http, url, body) = (
            self.http.clone(),
            format!("{}{path}", self.base),
            body.clone(),
        );
        tokio::spawn(async move { post_to(&http, &url, &body).await })
    }

    /// An experiment of one `true` job named `name`.
    async fn submit_true(&self, name: &str) {
        let _: Value = self
            .ok(
                "/v1/experiments",
                &json!({"spec": {"name": name, "command": ["true"]}}),
            )
            .await;
    }

    /// A coordinator with one claim turn, waited for at most `wait`.
    async fn with_one_turn(wait: Duration) -> Self {
        Server::start(|mut c| {
            c.max_claims = 1;
            c.claim_turn_wait = wait;
            c
        })
        .await
    }

    /// The only claim turn of a coordinator started with `max_claims = 1`.
    async fn take_the_turn(&self) -> headroom_coordinator::admission::Turn {
        self.admission
            .claim_turn(self.admission.wait())
            .await
            .expect("the one turn")
    }

    async fn ok<T: serde::de::DeserializeOwned>(&self, path: &str, body: &Value) -> T {
        let (status, v) = self.post(path, body).await;
        assert_eq!(status, 200, "{path}: {v}");
        serde_json::from_value(v).expect("decode")
    }

    async fn log(&self, lease: &Lease, fence: i64, offset: u64, bytes: &str) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}/v1/attempts/{}/log", self.base, lease.attempt))
            .query(&[("fence", fence.to_string()), ("offset", offset.to_string())])
            .body(bytes.to_string())
            .send()
            .await
            .expect("log");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Registers node n1; `previous`: as the same agent instance again (restarted).
    async fn register(&self, previous: Option<&RegisterResponse>) -> RegisterResponse {
        self.register_node("n1", previous).await
    }

    /// Registers `node`, one GPU of 10,000 MiB.
    async fn register_node(
        &self,
        node: &str,
        previous: Option<&RegisterResponse>,
    ) -> RegisterResponse {
        let gpus =
            json!([{"index": 0, "uuid": format!("GPU-{node}"), "name": "t", "total_mib": 10_000}]);
        let previous = previous.map(|r| r.agent);
        self.ok(
            "/v1/agents/register",
            &json!({"node": node, "gpus": gpus, "version": "t", "previous": previous}),
        )
        .await
    }

    async fn start_attempt(&self, lease: &Lease) {
        let _: Value = self
            .ok(
                &format!("/v1/attempts/{}/start", lease.attempt),
                &json!({"fence": lease.fence, "pid": 42, "started_at": chrono::Utc::now()}),
            )
            .await;
    }

    /// A clean end of `lease`, its GPU free again (the report's required fields).
    async fn finish(&self, lease: &Lease) {
        let report = json!({"fence": lease.fence, "exit_code": 0, "ended_at": chrono::Utc::now(),
                            "cleanup_ms": 0, "cleanup_verified": true, "log_tail": "",
                            "gpus": samples(10_000)});
        let _: Value = self
            .ok(&format!("/v1/attempts/{}/finish", lease.attempt), &report)
            .await;
    }

    async fn claim(&self, agent: &RegisterResponse) -> Vec<Lease> {
        let r: ClaimResponse = self
            .ok(
                &format!("/v1/agents/{}/claim", agent.agent),
                &json!({"gpus": samples(10_000), "max": 4, "wait_ms": 0}),
            )
            .await;
        r.leases
    }

    async fn free_mib(&self) -> Option<u64> {
        let nodes: Vec<NodeView> = self
            .http
            .get(format!("{}/v1/nodes", self.base))
            .send()
            .await
            .expect("nodes")
            .json()
            .await
            .expect("decode");
        nodes[0].gpus[0].free_mib
    }
}

fn samples(free: u64) -> Value {
    json!([{"index": 0, "used_mib": 10_000 - free, "free_mib": free}])
}

#[tokio::test]
async fn stale_heartbeats_and_log_chunks_get_409_and_change_nothing() {
    let s = Server::start(|c| c).await;
    let agent = s.register(None).await;
    let spec =
        json!({"name": "f", "command": ["true"], "retry": {"max_attempts": 3, "on": ["lost"]}});
    let _: Value = s.ok("/v1/experiments", &json!({"spec": spec})).await;
    let lease = s.claim(&agent).await.remove(0);
    let _: Value = s
        .ok(
            &format!("/v1/attempts/{}/start", lease.attempt),
            &json!({"fence": lease.fence, "pid": 42, "started_at": chrono::Utc::now()}),
        )
        .await;
    let before = s.free_mib().await;

    // A heartbeat with a stale token for its attempt: 409, its samples are not stored.
    let (status, body) = s
        .post(
            &format!("/v1/agents/{}/heartbeat", agent.agent),
            &json!({"gpus": samples(1_234), "attempts": [{"attempt": lease.attempt, "fence": lease.fence - 1}]}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "stale_fence", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&lease.attempt.to_string())),
        "the refusal names the attempt: {body}"
    );
    assert_eq!(
        s.free_mib().await,
        before,
        "a refused heartbeat stores nothing"
    );

    // The current token ships log bytes.
    let (status, body) = s.log(&lease, lease.fence, 0, "first ").await;
    assert_eq!(status, 200, "{body}");

    // The node's agent comes back without it: the attempt is lost and the job leased again.
    let agent2 = s.register(Some(&agent)).await;
    assert_eq!(agent2.lost_attempts, vec![lease.attempt]);
    let again = s.claim(&agent2).await;
    assert_eq!(again.len(), 1, "requeued after the loss");

    // The lost attempt's late log chunk: 409, the log is unchanged.
    let (status, body) = s.log(&lease, lease.fence, 6, "late").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "stale_fence", "{body}");
    let log = s
        .http
        .get(format!("{}/v1/attempts/{}/log", s.base, lease.attempt))
        .send()
        .await
        .expect("read log")
        .text()
        .await
        .expect("text");
    assert_eq!(log, "first ");
}

#[tokio::test]
async fn a_claim_held_open_is_answered_by_an_end_on_its_node_and_not_by_one_elsewhere() {
    let s = Server::start(|c| headroom_coordinator::CoordinatorConfig {
        long_poll: Duration::from_secs(60),
        ..c
    })
    .await;
    let n1 = s.register_node("n1", None).await;
    let n2 = s.register_node("n2", None).await;
    let spec = json!({"name": "w", "command": ["true"], "runs_per_config": 3});
    let _: Value = s.ok("/v1/experiments", &json!({"spec": spec})).await;
    // One slot per GPU: each node takes one job, the third waits.
    let on_n1 = s.claim(&n1).await;
    let on_n2 = s.claim(&n2).await;
    assert_eq!((on_n1.len(), on_n2.len()), (1, 1));
    s.start_attempt(&on_n1[0]).await;
    s.start_attempt(&on_n2[0]).await;

    // n1 waits for work, with a deadline far beyond what this test waits for; it knows its
    // plan, so only work (or the deadline) answers it.
    let mut held = tokio::spawn(
        s.http
            .post(format!("{}/v1/agents/{}/claim", s.base, n1.agent))
            .json(
                &json!({"gpus": samples(10_000), "max": 4, "known_plan": n1.plan,
                          "wait_ms": 50_000}),
            )
            .send(),
    );
    // n2's end frees n2's slot, not n1's: n1's claim looks again and waits on.
    s.finish(&on_n2[0]).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(800), &mut held)
            .await
            .is_err(),
        "an end on another node answered the claim of a node with no free slot"
    );
    // n1's own end frees its slot: the held claim is answered with the third job, long
    // before its deadline.
    s.finish(&on_n1[0]).await;
    let answer: ClaimResponse = tokio::time::timeout(Duration::from_secs(20), held)
        .await
        .expect("the held claim was not answered by its node's end")
        .expect("claim task")
        .expect("claim")
        .json()
        .await
        .expect("decode");
    assert_eq!(answer.leases.len(), 1, "{answer:?}");
    let third = &answer.leases[0];
    assert!(
        third.job != on_n1[0].job && third.job != on_n2[0].job,
        "the waiting job, not one that ran: {third:?}"
    );
}

/// The reproduction of a fleet claiming faster than its coordinator serves, with one turn:
/// while a claim round holds it, another claim waits its turn, and is answered 503 `busy`
/// with `Retry-After` once its wait runs out, having leased nothing; a heartbeat meanwhile is
/// answered while a claim still waits; given back, the turn goes to the waiting claim, which
/// leases the job the refused one did not take.
#[tokio::test]
async fn claims_wait_their_turn_and_heartbeats_do_not() {
    let s = Server::with_one_turn(Duration::from_secs(5)).await;
    let n1 = s.register_node("n1", None).await;
    s.submit_true("a").await;
    let running = s.claim(&n1).await.remove(0);
    s.start_attempt(&running).await;
    let n2 = s.register_node("n2", None).await;
    let claim_path = format!("/v1/agents/{}/claim", n2.agent);
    let claim = json!({"gpus": samples(10_000), "max": 4, "wait_ms": 0});

    let held = s.take_the_turn().await;
    s.submit_true("b").await;
    let asked = std::time::Instant::now();
    let resp = s
        .http
        .post(format!("{}{claim_path}", s.base))
        .json(&claim)
        .send()
        .await
        .expect("claim");
    assert!(
        asked.elapsed() >= Duration::from_secs(5),
        "it waited its turn"
    );
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "busy", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("1 claims at once")),
        "{v}"
    );

    let waiting = s.spawn_post(&claim_path, &claim);
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    while s.admission.waiting() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the claim never waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let page = metrics(&s).await;
    for line in ["headroom_claims_in_turn 1", "headroom_claims_waiting 1"] {
        assert!(page.lines().any(|l| l == line), "{line} in:\n{page}");
    }
    let beat = json!({"gpus": samples(1_000),
                      "attempts": [{"attempt": running.attempt, "fence": running.fence}]});
    let (status, v) = s
        .post(&format!("/v1/agents/{}/heartbeat", n1.agent), &beat)
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(
        !waiting.is_finished(),
        "answered while a claim waits its turn"
    );
    drop(held);
    let (status, v) = waiting.await.expect("the waiting claim");
    assert_eq!(status, 200, "{v}");
    let r: ClaimResponse = serde_json::from_value(v).expect("decode");
    assert_eq!(r.leases.len(), 1, "the job the refused claim did not take");
    assert_ne!(r.leases[0].attempt, running.attempt);

    let metrics = metrics(&s).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("headroom_refused_requests_total")
                && l.contains("route=\"/v1/agents/{id}/claim\"")
                && l.contains("status=\"503\"")),
        "the busy claim in the metrics:\n{metrics}"
    );
}

/// An agent's client reads how long a busy answer asks it to wait (`Retry-After`): the agent
/// waits at least that before it claims again, not its backoff's first 100 ms.
#[tokio::test]
async fn a_busy_claim_tells_the_agent_s_client_how_long_to_wait() {
    use headroom_shared::api::{ClaimRequest, ErrorCode};
    let s = Server::with_one_turn(Duration::from_millis(200)).await;
    let n1 = s.register_node("n1", None).await;
    let client = headroom_shared::client::Client::new(&s.base).expect("client");
    let held = s.take_the_turn().await;
    let req = ClaimRequest {
        gpus: serde_json::from_value(samples(10_000)).expect("samples"),
        max: 1,
        watching: vec![],
        known_plan: None,
        wait_ms: 0,
    };
    let e = client
        .claim(n1.agent, &req)
        .await
        .expect_err("no turn within its wait");
    assert_eq!(e.code(), Some(ErrorCode::Busy), "{e}");
    assert!(e.is_transient(), "a busy answer is tried again");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(1)));
    drop(held);
    client.claim(n1.agent, &req).await.expect("its turn now");
}

/// The `/metrics` page.
async fn metrics(s: &Server) -> String {
    s.http
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// A claim held open whose later round finds every turn taken waits for one only to its
/// long-poll's end, then answers that nothing came (200, no lease), as that end does: never
/// busy after holding a long-poll, never a turn's wait past the time its client gives it.
/// The job that came meanwhile is leased by the next claim, once a turn is free.
#[tokio::test]
async fn a_claim_held_open_answers_at_its_long_poll_s_end_when_every_turn_is_taken() {
    let s = Server::with_one_turn(Duration::from_secs(30)).await;
    let n1 = s.register_node("n1", None).await;
    let claim_path = format!("/v1/agents/{}/claim", n1.agent);
    let known: RegisterResponse = n1;
    let held_open = json!({"gpus": samples(10_000), "max": 4, "wait_ms": 1_500,
                           "known_plan": known.plan});
    let asked = std::time::Instant::now();
    let waiting = s.spawn_post(&claim_path, &held_open);
    // Its first round found nothing and it waits for work; then every turn is taken and
    // work comes.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while !metrics(&s)
        .await
        .lines()
        .any(|l| l == "headroom_claim_duration_seconds_count 1")
    {
        assert!(std::time::Instant::now() < deadline, "no first round");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let held = s.take_the_turn().await;
    s.submit_true("c").await;
    let (status, v) = waiting.await.expect("the held claim");
    let took = asked.elapsed();
    assert_eq!(status, 200, "{v}");
    let r: ClaimResponse = serde_json::from_value(v).expect("decode");
    assert!(r.leases.is_empty());
    assert_eq!(r.plan, known.plan);
    assert!(
        took >= Duration::from_millis(1_500) && took < Duration::from_secs(15),
        "answered at its long-poll's end, not a turn's wait (30 s) later: {took:?}"
    );
    drop(held);
    assert_eq!(s.claim(&known).await.len(), 1, "the job that woke it");
}
