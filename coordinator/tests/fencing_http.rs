//! Fencing over real HTTP: a heartbeat or a log chunk carrying a stale token is refused with
//! 409 (`stale_fence`) and changes nothing.

mod common;

use headroom_shared::api::{ClaimResponse, Lease, NodeView, RegisterResponse};
use serde_json::{Value, json};

use common::Server;

impl Server {
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
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
        let gpus = json!([{"index": 0, "uuid": "GPU-0", "name": "t", "total_mib": 10_000}]);
        let previous = previous.map(|r| r.agent);
        self.ok(
            "/v1/agents/register",
            &json!({"node": "n1", "gpus": gpus, "version": "t", "previous": previous}),
        )
        .await
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
