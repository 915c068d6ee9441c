//! Fencing over the wire: an attempt whose lease was lost, and whose job was leased again
//! to another agent, has every report refused with 409 (start, heartbeat, log, finish), and
//! none of them changes anything.

use std::time::Duration;

use chrono::Utc;
use headroom_integration_tests::standalone::{self, jobs_of};
use headroom_integration_tests::{
    http_get, http_get_text, http_post, http_post_text, wait_until as wait,
};
use headroom_shared::api::{
    AttemptRef, ClaimRequest, ClaimResponse, FinishReport, GpuInfo, GpuSample, HeartbeatRequest,
    JobDetail, Lease, RegisterRequest, RegisterResponse, StartReport, SubmitResponse,
};
use headroom_shared::{AgentId, FailureClass, JobState};

/// A coordinator spoken to by hand, as agents of its own.
struct Coordinator {
    url: String,
    _proc: standalone::Coordinator,
    _dir: tempfile::TempDir,
}

fn coordinator() -> Coordinator {
    let dir = tempfile::tempdir().expect("tempdir");
    let proc =
        standalone::Coordinator::start(dir.path(), &["--lease-ttl", "2s"]).expect("coordinator");
    Coordinator {
        url: proc.url.clone(),
        _proc: proc,
        _dir: dir,
    }
}

fn sample() -> Vec<GpuSample> {
    vec![GpuSample {
        index: 0,
        used_mib: 0,
        free_mib: 24 * 1024,
        utilization_pct: None,
        power_mw: None,
        temperature_c: None,
        processes: vec![],
        error: None,
    }]
}

impl Coordinator {
    fn post<T: serde::Serialize>(&self, path: &str, body: &T) -> (u16, serde_json::Value) {
        let body = serde_json::to_value(body).expect("json");
        http_post(&format!("{}{path}", self.url), &body).expect("POST")
    }

    /// An agent of its own node, speaking the protocol by hand.
    fn register(&self, node: &str) -> AgentId {
        let req = RegisterRequest {
            host_memory_mib: None,
            node: node.into(),
            gpus: vec![GpuInfo {
                index: 0,
                uuid: format!("GPU-{node}"),
                name: "hand-made".into(),
                total_mib: 24 * 1024,
            }],
            plan: None,
            headroom: None,
            version: "test".into(),
            running: vec![],
            previous: None,
        };
        let (status, body) = self.post("/v1/agents/register", &req);
        assert_eq!(status, 200, "{body}");
        serde_json::from_value::<RegisterResponse>(body)
            .expect("registered")
            .agent
    }

    fn claim(&self, agent: AgentId) -> Lease {
        let req = ClaimRequest {
            gpus: sample(),
            max: 1,
            watching: vec![],
            known_plan: None,
            wait_ms: 5000,
        };
        let (status, body) = self.post(&format!("/v1/agents/{agent}/claim"), &req);
        assert_eq!(status, 200, "{body}");
        let mut resp: ClaimResponse = serde_json::from_value(body).expect("claim");
        assert_eq!(resp.leases.len(), 1, "{resp:?}");
        resp.leases.remove(0)
    }

    fn start(&self, lease: &Lease) -> (u16, serde_json::Value) {
        let req = StartReport {
            fence: lease.fence,
            pid: std::process::id(),
            started_at: Utc::now(),
        };
        self.post(&format!("/v1/attempts/{}/start", lease.attempt), &req)
    }

    fn heartbeat(&self, agent: AgentId, lease: &Lease) -> (u16, serde_json::Value) {
        let req = HeartbeatRequest {
            gpus: sample(),
            attempts: vec![AttemptRef {
                attempt: lease.attempt,
                fence: lease.fence,
                waiting: None,
            }],
            released: vec![],
            telemetry: vec![],
            telemetry_dropped: 0,
        };
        self.post(&format!("/v1/agents/{agent}/heartbeat"), &req)
    }

    fn append_log(&self, lease: &Lease, text: &str) -> (u16, String) {
        let url = format!(
            "{}/v1/attempts/{}/log?fence={}&offset=0",
            self.url, lease.attempt, lease.fence
        );
        http_post_text(&url, text).expect("POST log")
    }

    /// The attempt's stored log, as bytes read back (whatever the format of the answer).
    fn read_log(&self, lease: &Lease) -> String {
        let url = format!("{}/v1/attempts/{}/log", self.url, lease.attempt);
        let (status, text) = http_get_text(&url).expect("GET log");
        assert!((200..300).contains(&status), "GET {url}: {status}");
        text
    }

    fn finish(&self, lease: &Lease) -> (u16, serde_json::Value) {
        let req = FinishReport {
            fence: lease.fence,
            failure: None,
            exit_code: Some(0),
            signal: None,
            ended_at: Utc::now(),
            peak_mem_mib: None,
            peak_source: None,
            cleanup_ms: 0,
            cleanup_verified: true,
            unverified: None,
            contaminated: false,
            measurements: Default::default(),
            log_tail: "stale success".into(),
            gpus: sample(),
            prestart: None,
            background: None,
            host_peak_mib: None,
            started: None,
            metrics: None,
            memory_cap_mib: None,
            oom_cause: None,
        };
        self.post(&format!("/v1/attempts/{}/finish", lease.attempt), &req)
    }

    fn job(&self, lease: &Lease) -> JobDetail {
        http_get(&format!("{}/v1/jobs/{}", self.url, lease.job)).expect("job")
    }
}

#[test]
fn every_report_of_a_lost_attempt_is_refused_with_409_and_changes_nothing() {
    let c = coordinator();
    let a = c.register("node-a");
    let (status, body) = c.post(
        "/v1/experiments",
        &serde_json::json!({"spec": {"name": "fenced", "command": ["true"],
            "resources": {"memory": "1GiB"}, "retry": {"max_attempts": 3, "on": ["lost"]}}}),
    );
    assert_eq!(status, 200, "{body}");
    let exp = serde_json::from_value::<SubmitResponse>(body)
        .expect("submitted")
        .experiment
        .expect("stored");
    let first = c.claim(a);
    let (status, body) = c.start(&first);
    assert_eq!(status, 200, "the current lease starts: {body}");

    // Agent A goes silent past the TTL: its attempt is lost, and B leases the job again.
    wait(
        "the first attempt to be lost",
        Duration::from_secs(30),
        || {
            let d = c.job(&first);
            (d.attempts_detail[0].failure_class == Some(FailureClass::Lost)).then_some(())
        },
    );
    let b = c.register("node-b");
    let second = c.claim(b);
    assert_eq!(second.job, first.job);
    assert!(second.fence > first.fence);
    let before = c.job(&first);

    // A comes back and reports on its old lease.
    let answers = [
        ("start", c.start(&first)),
        ("heartbeat", c.heartbeat(a, &first)),
        ("finish", c.finish(&first)),
    ];
    let refused = [
        ("start", answers[0].1.0),
        ("heartbeat", answers[1].1.0),
        ("log", c.append_log(&first, "stale line\n").0),
        ("finish", answers[2].1.0),
    ];
    // Every problem at once, so that one run tells which reports slip through.
    let mut problems: Vec<String> = refused
        .iter()
        .filter(|(_, s)| *s != 409)
        .map(|(what, s)| format!("a stale {what} got {s}, not 409"))
        .collect();
    // The refusal names the attempt in a field of its own (the agent acts on it; it never
    // reads the message).
    for (what, (_, body)) in &answers {
        if body["error"]["attempt"] != serde_json::json!(first.attempt.to_string()) {
            problems.push(format!("a stale {what} did not name its attempt: {body}"));
        }
    }
    let after = c.job(&first);
    if after.summary.state != before.summary.state || after.summary.state != JobState::Leased {
        problems.push(format!("the job went {}", after.summary.state));
    }
    if after.attempts_detail[0].failure_class != Some(FailureClass::Lost)
        || after.attempts_detail.len() != 2
    {
        problems.push(format!(
            "the attempts changed: {:#?}",
            after.attempts_detail
        ));
    }
    let log = c.read_log(&first);
    if log.contains("stale line") {
        problems.push(format!("the stale log append was stored: {log:?}"));
    }
    assert!(problems.is_empty(), "{problems:#?}");

    // The current lease is unaffected: its reports are accepted.
    assert_eq!(c.heartbeat(b, &second).0, 200);
    assert_eq!(c.start(&second).0, 200);
    let (status, body) = c.finish(&second);
    assert_eq!(status, 200, "{body}");
    let jobs = jobs_of(&c.url, exp).expect("jobs");
    assert_eq!(jobs[0].state, JobState::Succeeded);
}
