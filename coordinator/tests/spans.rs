//! Every HTTP request and every store operation runs in a tracing span of its own, with the
//! ids it concerns recorded on it, so that whatever is logged inside says where it belongs.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use headroom_coordinator::store::Store;
use headroom_coordinator::store::sqlite::SqliteStore;
use headroom_shared::JobId;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// A span as it was opened and recorded: its name and fields.
#[derive(Clone, Debug)]
struct Seen {
    name: String,
    fields: BTreeMap<String, String>,
}

type Spans = Arc<Mutex<Vec<(u64, Seen)>>>;

struct Recorder(Spans);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_string(),
            format!("{value:?}").replace('"', ""),
        );
    }
}

impl<S: tracing::Subscriber> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let seen = Seen {
            name: attrs.metadata().name().to_string(),
            fields,
        };
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id.into_u64(), seen));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, seen)) = spans.iter_mut().rev().find(|(i, _)| *i == id.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }
}

/// The spans seen by this test binary's subscriber (installed once, every level).
fn spans() -> Spans {
    static SPANS: OnceLock<Spans> = OnceLock::new();
    SPANS
        .get_or_init(|| {
            let spans = Spans::default();
            let subscriber = tracing_subscriber::registry().with(Recorder(spans.clone()));
            tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
            spans
        })
        .clone()
}

fn find(spans: &Spans, name: &str, field: &str, value: &str) -> Option<Seen> {
    spans
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(_, s)| s)
        .find(|s| s.name == name && s.fields.get(field).is_some_and(|v| v == value))
        .cloned()
}

#[tokio::test]
async fn a_store_operation_runs_in_a_span_naming_it_and_its_ids() {
    let spans = spans();
    let store = SqliteStore::open_in_memory().expect("store");
    let job = JobId::new();
    assert!(store.job(job).await.is_err(), "no such job");
    let seen = find(&spans, "store", "job", &job.to_string()).expect("a span for the read");
    assert_eq!(seen.fields.get("op").map(String::as_str), Some("job"));
}

#[tokio::test]
async fn an_http_request_runs_in_a_span_with_its_path_and_status() {
    let spans = spans();
    let server = common::Server::start(|c| c).await;
    let job = JobId::new();
    let path = format!("/v1/jobs/{job}");
    let status = server
        .http
        .get(format!("{}{path}", server.base))
        .send()
        .await
        .expect("answer")
        .status();
    assert_eq!(status, 404);
    let seen = find(&spans, "request", "path", &path).expect("a span for the request");
    assert_eq!(seen.fields.get("method").map(String::as_str), Some("GET"));
    assert_eq!(seen.fields.get("status").map(String::as_str), Some("404"));
    // The store's read of the job ran inside it, in a span of its own.
    assert!(find(&spans, "store", "job", &job.to_string()).is_some());
}

/// The `store` spans of `op` whose `field` names `id`.
fn count(spans: &Spans, op: &str, field: &str, id: &str) -> usize {
    spans
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(_, s)| {
            s.name == "store"
                && s.fields.get("op").is_some_and(|o| o == op)
                && s.fields.get(field).is_some_and(|v| v.contains(id))
        })
        .count()
}

/// An agent token is checked against its node on every request, but the node an agent or an
/// attempt belongs to never changes: it is read once (the agent's, at its first claim), and
/// the attempts its claim leased are known from that claim; their start and end read nothing
/// more for it.
#[tokio::test]
async fn an_agent_token_s_node_is_read_once_not_at_each_report() {
    use headroom_shared::routes;
    use serde_json::{Value, json};
    const ADMIN: &str = "bootstrap-admin-secret-0123456789";
    let spans = spans();
    let s = common::Server::start(|c| headroom_coordinator::CoordinatorConfig {
        tokens: vec![headroom_coordinator::auth::admin_token(ADMIN).expect("admin token")],
        ..c
    })
    .await;
    let call = async |path: &str, token: &str, body: Value| -> Value {
        let resp = s
            .http
            .post(format!("{}{path}", s.base))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status().as_u16(), 200, "{path}");
        resp.json().await.expect("json")
    };
    let token = call(
        routes::CREATE_TOKEN.path,
        ADMIN,
        json!({"name": "n1", "role": "agent"}),
    )
    .await["token"]
        .as_str()
        .expect("token")
        .to_string();
    let gpus = json!([{"index": 0, "uuid": "GPU-0", "name": "t", "total_mib": 10_000}]);
    let agent = call(
        routes::REGISTER.path,
        &token,
        json!({"node": "n1", "gpus": gpus, "version": "t"}),
    )
    .await["agent"]
        .as_str()
        .expect("agent")
        .to_string();
    let free = json!([{"index": 0, "used_mib": 0, "free_mib": 10_000}]);
    let claim = json!({"gpus": free, "max": 1, "wait_ms": 0});
    let claim_path = routes::CLAIM.path_with(&[&agent]);
    call(
        routes::SUBMIT.path,
        ADMIN,
        json!({"spec": {"name": "t", "command": ["true"]}}),
    )
    .await;
    let lease = call(&claim_path, &token, claim.clone()).await["leases"][0].clone();
    let attempt = lease["attempt"].as_str().expect("attempt").to_string();
    let fence = lease["fence"].as_i64().expect("fence");
    call(
        &routes::START.path_with(&[&attempt]),
        &token,
        json!({"fence": fence, "pid": 1, "started_at": "2026-12-02T10:00:00Z"}),
    )
    .await;
    call(
        &routes::FINISH.path_with(&[&attempt]),
        &token,
        json!({"fence": fence, "failure": null, "exit_code": 0, "signal": null,
               "ended_at": "2026-12-02T10:00:01Z", "peak_mem_mib": null, "cleanup_ms": 0,
               "cleanup_verified": true, "log_tail": "", "gpus": free}),
    )
    .await;
    call(&claim_path, &token, claim).await;
    assert_eq!(
        count(&spans, "node_of", "of", &attempt),
        0,
        "the attempt's node"
    );
    assert_eq!(
        count(&spans, "node_of", "of", &agent),
        1,
        "the agent's node"
    );
    // The reports themselves were stored.
    assert_eq!(count(&spans, "end_attempt", "attempt", &attempt), 1);
}
