//! The typed client against real sockets: errors decode into codes, and the transient /
//! permanent split is the one the agent's retries rely on.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

use headroom_shared::api::{ErrorCode, HeartbeatRequest};
use headroom_shared::client::{Client, ClientError};
use headroom_shared::{AgentId, JobId};

/// A one-connection-per-answer HTTP server replying `answers` in order; returns its URL.
fn canned(answers: Vec<(u16, &'static str, String)>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for (status, content_type, body) in answers {
            let Ok((stream, _)) = listener.accept() else {
                return;
            };
            let mut reader = BufReader::new(stream);
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body_in = vec![0; length];
            let _ = reader.read_exact(&mut body_in);
            let mut stream = reader.into_inner();
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

fn error(code: &str, field: Option<&str>) -> String {
    serde_json::json!({"error": {"code": code, "message": "why", "field": field}}).to_string()
}

#[tokio::test]
async fn errors_decode_into_codes_and_are_classified_once() {
    let json = "application/json";
    let url = canned(vec![
        (409, json, error("stale_fence", None)),
        (409, json, error("unknown_agent", None)),
        (422, json, error("invalid", Some("plan"))),
        (404, json, error("not_found", None)),
        (503, json, error("store_unavailable", None)),
        (502, "text/html", "<html>bad gateway</html>".into()),
        (409, json, error("some_new_code", None)),
    ]);
    let c = Client::new(&url).expect("client");
    let hb = HeartbeatRequest {
        gpus: vec![],
        attempts: vec![],
        released: vec![],
        telemetry: vec![],
        telemetry_dropped: 0,
    };
    let agent = AgentId::new();
    let e = c.heartbeat(agent, &hb).await.expect_err("stale");
    assert!(
        matches!(e, ClientError::Stale { .. }) && !e.is_transient(),
        "{e:?}"
    );
    let e = c.heartbeat(agent, &hb).await.expect_err("unknown agent");
    assert!(
        matches!(e, ClientError::UnknownAgent(_)) && !e.is_transient(),
        "{e:?}"
    );
    let e = c.set_plan("n", "2,2").await.expect_err("invalid");
    assert_eq!(e.code(), Some(ErrorCode::Invalid));
    assert!(!e.is_transient());
    assert_eq!(e.to_string(), "plan: why");
    // Not found is an answer, not an error, for `find_job`.
    assert!(c.find_job(JobId::new()).await.expect("answer").is_none());
    let e = c.nodes().await.expect_err("store down");
    assert_eq!(e.code(), Some(ErrorCode::StoreUnavailable));
    assert!(e.is_transient(), "{e:?}");
    let e = c.nodes().await.expect_err("proxy page");
    assert!(
        matches!(e, ClientError::Unexpected { status: 502, .. }),
        "{e:?}"
    );
    assert!(e.is_transient());
    let e = c.nodes().await.expect_err("newer server");
    assert_eq!(e.code(), Some(ErrorCode::Unknown));
    assert!(!e.is_transient());
}

#[tokio::test]
async fn an_unreachable_coordinator_is_transient_and_named() {
    // A port nobody listens on: bind, note it, close.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let e = Client::new(&url)
        .expect("client")
        .nodes()
        .await
        .expect_err("nothing listens");
    assert!(matches!(e, ClientError::Unreachable { .. }), "{e:?}");
    assert!(e.is_transient());
    assert!(e.to_string().contains(&url), "{e}");
}

#[test]
fn error_code_names_match_their_wire_form() {
    for code in [
        ErrorCode::Invalid,
        ErrorCode::BadRequest,
        ErrorCode::NotFound,
        ErrorCode::StaleFence,
        ErrorCode::UnknownAgent,
        ErrorCode::Conflict,
        ErrorCode::StoreUnavailable,
        ErrorCode::Internal,
        ErrorCode::Unknown,
    ] {
        assert_eq!(
            serde_json::to_value(code).expect("encodes"),
            code.as_str(),
            "{code:?}"
        );
    }
}
