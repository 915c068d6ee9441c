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
