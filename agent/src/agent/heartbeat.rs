//! Lease renewal and self-fencing: heartbeats carry GPU telemetry and the running attempts'
//! fencing tokens; their answers carry cancellations and stale leases. When no heartbeat
//! sent at or after time `t` has been answered by `t + fence_after` (see
//! [`crate::agent::self_fence::SelfFenceBudget`]), every attempt is stopped: the coordinator may soon give
//! the jobs to another node, and a job must never run twice.

use std::collections::HashSet;
use std::sync::Arc;

use headroom_shared::AttemptId;
use headroom_shared::api::{GpuSample, HeartbeatRequest};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::agent::attempts::{Attempts, StopReason};
use crate::agent::readings::Readings;
use crate::agent::{Session, Shared};

pub(crate) async fn run(shared: Arc<Shared>, session: Session, done: CancellationToken) {
    let budget = session.budget;
    let attempts = &shared.attempts;
    // When the last heartbeat that the coordinator answered was sent: the coordinator renewed
    // the leases on receiving it, which was later.
    let mut renewed = session.renewed;
    let mut next = Instant::now() + budget.every;
    // Foreign pids seen at the last heartbeat: only a process foreign twice in a row is
    // killed, never one caught for an instant without its marker (mid-exec).
    let mut suspects = HashSet::new();
    let mut readings = Readings::new(shared.backend.clone());
    loop {
        loop {
            tokio::select! {
                _ = done.cancelled() => return,
                _ = tokio::time::sleep_until(next) => break,
                _ = fence_due(attempts, budget.deadline(renewed)) => fence(attempts, &session, None),
            }
        }
        // Orphans re-parented to this subreaper that died between attempts are reaped here.
        let _ = tokio::task::spawn_blocking(crate::procscan::reap_orphans).await;
        // Half the time the coordinator has to answer, at most: the other half is its own.
        let reading = readings.take(budget.answer_within() / 2).await;
        let gpus = reading.samples;
        shared.metrics.gpu_samples(&gpus);
        let (released, foreign) = if reading.fresh {
            (attempts.releasable(&gpus).await, gpus.as_slice())
        } else {
            (vec![], &[][..])
        };
        if shared.cfg.kill_foreign {
            // A process is killed only when seen in two fresh readings in a row.
            kill_foreign_processes(foreign, &mut suspects);
        }
        let mut req = HeartbeatRequest {
            gpus,
            attempts: attempts.refs(),
            released: released.clone(),
            telemetry: shared
                .telemetry
                .take(crate::agent::telemetry::MAX_PER_HEARTBEAT),
            telemetry_dropped: shared.telemetry.dropped(),
        };
        let sent = Instant::now();
        let reply = {
            // Bounded: a request lost in a partition that drops packets must not hold the loop.
            let request = tokio::time::timeout(
                budget.request_timeout,
                shared.client.heartbeat(session.agent, &req),
            );
            tokio::pin!(request);
            loop {
                tokio::select! {
                    _ = done.cancelled() => return,
                    r = &mut request => break r,
                    _ = fence_due(attempts, budget.deadline(renewed)) => {
                        fence(attempts, &session, Some(sent.elapsed()));
                    }
                }
            }
        };
        match &reply {
            Ok(Ok(_)) => {}
            // Not stored: sent again with the next heartbeat.
            Ok(Err(e))
                if e.is_transient()
                    || matches!(e, crate::agent::client::ClientError::Stale { .. }) =>
            {
                shared
                    .telemetry
                    .put_back(std::mem::take(&mut req.telemetry));
            }
            Err(_) => shared
                .telemetry
                .put_back(std::mem::take(&mut req.telemetry)),
            // Refused for good (a reading the coordinator will never take): sending it again
            // would refuse every heartbeat after this one.
            Ok(Err(e)) if !req.telemetry.is_empty() => {
                tracing::warn!(
                    samples = req.telemetry.len(),
                    "telemetry refused, dropped: {e}"
                );
            }
            Ok(Err(_)) => {}
        }
        match reply {
            Ok(Ok(resp)) => {
                shared.metrics.heartbeat_answered(sent.elapsed());
                renewed = renewed.max(sent);
                // Every attempt's supervisor learns its new deadline.
                attempts.renewed_until(budget.deadline(renewed));
                // Paced from the sending: a slow answer does not delay the next renewal.
                next = sent + budget.every;
                attempts.released(&released).await;
                for id in resp.cancel {
                    attempts.stop(id, StopReason::User);
                }
                for order in resp.requeue {
                    if attempts.stop(order.attempt, StopReason::Requeue(order.why)) {
                        tracing::info!(attempt = %order.attempt, why = order.why.as_str(), "stopping the attempt to requeue its job");
                    }
                }
                for id in resp.stale {
                    if attempts.stop(id, StopReason::LeaseLost) {
                        tracing::warn!(attempt = %id, "lease is stale: stopping the attempt");
                    }
                }
            }
            Ok(Err(crate::agent::client::ClientError::Stale {
                message: msg,
                attempt,
            })) => {
                // The whole heartbeat was refused for the lease it names: stop that attempt,
                // leave it out, and renew the others at once.
                let named: Vec<AttemptId> = req
                    .attempts
                    .iter()
                    .map(|r| r.attempt)
                    .filter(|id| attempt == Some(*id))
                    .collect();
                for id in &named {
                    attempts.mark_stale(*id);
                    tracing::warn!(attempt = %id, "lease is stale: stopping the attempt");
                }
                next = if named.is_empty() {
                    tracing::warn!("heartbeat refused: {msg}");
                    Instant::now() + budget.retry
                } else {
                    Instant::now()
                };
            }
            Ok(Err(e)) => {
                tracing::warn!("heartbeat failed: {e}");
                next = Instant::now() + budget.retry;
            }
            Err(_) => {
                tracing::warn!("heartbeat unanswered after {:?}", budget.request_timeout);
                next = Instant::now() + budget.retry;
            }
        }
    }
}

/// Resolves at `deadline` once some attempt is running and not yet stopping.
async fn fence_due(attempts: &Attempts, deadline: Instant) {
    let mut launches = attempts.launches();
    while attempts.watching().is_empty() {
        if launches.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
    tokio::time::sleep_until(deadline).await;
}

/// Stops every attempt, saying why: `unanswered`, how long the heartbeat on its way has
/// waited for its answer.
fn fence(attempts: &Attempts, session: &Session, unanswered: Option<std::time::Duration>) {
    let n = attempts.stop_all(StopReason::LeaseLost);
    if n == 0 {
        return;
    }
    let budget = session.budget;
    let on_its_way = match unanswered {
        Some(waited) => format!("the heartbeat sent {waited:?} ago is still unanswered"),
        None => "no heartbeat is on its way".to_string(),
    };
    tracing::error!(
        attempts = n,
        "leases not renewed for {:?} (lease TTL {:?}): stopping every attempt before the \
         coordinator can give them away; {on_its_way}. At this lease TTL and kill grace the \
         coordinator must answer a heartbeat within {:?} (the agent's \
         headroom_heartbeat_round_trip_seconds shows how long it takes)",
        budget.fence_after,
        budget.ttl,
        budget.answer_within()
    );
}

/// Kills processes of no attempt holding GPU memory, for nodes configured to own their GPUs.
fn kill_foreign_processes(samples: &[GpuSample], suspects: &mut std::collections::HashSet<u32>) {
    // Nothing on a GPU whose reading failed, nor a pid of another namespace, is killed.
    let foreign: Vec<(u32, u64, Option<String>, Option<String>)> = samples
        .iter()
        .filter(|g| g.error.is_none())
        .flat_map(|g| &g.processes)
        .filter(|p| {
            p.attempt.is_none()
                && (p.used_mib > 0 || p.used_mib_unknown)
                && !p.outside_pid_namespace
                && p.pid != std::process::id()
        })
        .map(|p| (p.pid, p.used_mib, p.user.clone(), p.command.clone()))
        .collect();
    let seen_before = std::mem::replace(suspects, foreign.iter().map(|f| f.0).collect());
    for (pid, mib, user, command) in foreign.into_iter().filter(|f| seen_before.contains(&f.0)) {
        tracing::warn!(
            pid,
            mib,
            ?user,
            ?command,
            "killing a foreign process on the GPUs (--kill-foreign)"
        );
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use headroom_shared::api::HeartbeatResponse;
    use headroom_shared::{AgentId, AttemptId};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::agent::AgentConfig;
    use crate::agent::attempts::StopSignal;
    use crate::agent::self_fence::SelfFenceBudget;
    use crate::gpu::fake::FakeBackend;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// A coordinator that answers the first `answered` heartbeats after `delay`, and then
    /// swallows every request without a word (a partition that drops packets).
    async fn coordinator(answered: usize, delay: Duration) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let mut held: Vec<TcpStream> = vec![];
            let mut left = answered;
            while let Ok((mut conn, _)) = listener.accept().await {
                if left == 0 {
                    held.push(conn);
                    continue;
                }
                left -= 1;
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 1 << 16];
                    let _ = conn.read(&mut buf).await;
                    tokio::time::sleep(delay).await;
                    let body = serde_json::to_string(&HeartbeatResponse {
                        requeue: vec![],
                        cancel: vec![],
                        stale: vec![],
                        plan: "1".into(),
                    })
                    .expect("json");
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(resp.as_bytes()).await;
                    // Held open: the black hole that follows must not look like a closed socket.
                    tokio::time::sleep(S(3600)).await;
                });
            }
        });
        url
    }

    /// Runs the heartbeats of a session started now against `url`; returns its attempts.
    async fn session(url: &str, budget: SelfFenceBudget) -> (Attempts, Instant, tempfile::TempDir) {
        let telemetry = crate::agent::telemetry::Telemetry::new(Duration::ZERO, 10);
        session_with(url, budget, telemetry, None).await
    }

    /// An agent's metrics page, its attempts' state in `dir`.
    fn metrics_in(dir: &std::path::Path) -> crate::agent::metrics::AgentMetrics {
        crate::agent::metrics::AgentMetrics::new(
            "n",
            vec![],
            crate::agent::telemetry::Telemetry::new(Duration::ZERO, 10),
            Attempts::load(dir).expect("attempts"),
        )
    }

    /// [`session`] whose heartbeats ship `telemetry`'s samples and show on `metrics` (else
    /// on a page of its own).
    async fn session_with(
        url: &str,
        budget: SelfFenceBudget,
        telemetry: crate::agent::telemetry::Telemetry,
        metrics: Option<crate::agent::metrics::AgentMetrics>,
    ) -> (Attempts, Instant, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let metrics = metrics.unwrap_or_else(|| metrics_in(dir.path()));
        let backend = FakeBackend::open("1x24GiB".parse().expect("spec"), &dir.path().join("fake"))
            .expect("fake backend");
        let shared = Arc::new(Shared {
            cfg: AgentConfig {
                coordinator: url.to_string(),
                node: "n".into(),
                plan: None,
                headroom: "10%".parse().expect("headroom"),
                host_memory_mib: None,
                data_dir: dir.path().to_path_buf(),
                supervisor: Default::default(),
                claim_wait: S(1),
                kill_foreign: false,
                cgroups: false,
                telemetry_interval: Duration::ZERO,
                telemetry_buffer: 10,
                metrics_addr: None,
                token: None,
                ca_file: None,
                gpu: crate::gpu::BackendChoice::Nvml,
                on_exit: Default::default(),
                supervisor_exe: crate::supervisor::SELF_EXE.into(),
                pass_env: vec![],
                job_dirs: "/var/tmp".into(),
                run_as_default: "nobody".into(),
            },
            client: crate::agent::client::Client::new(url).expect("client"),
            backend: Arc::new(backend),
            attempts: Attempts::load(dir.path()).expect("attempts"),
            outcomes: crate::outcomes::Outcomes::open(dir.path()).expect("outcomes"),
            scope: "test".into(),
            cgroups: None,
            telemetry,
            metrics,
            standby: crate::agent::standby::Standby::new(
                crate::supervisor::SELF_EXE.into(),
                "test".into(),
                None,
                None,
            ),
            job_base_env: Default::default(),
            attach_key: "k".repeat(64),
            bundles: Default::default(),
        });
        let attempts = shared.attempts.clone();
        let start = Instant::now();
        let session = Session {
            agent: AgentId::new(),
            plan: "1".into(),
            budget,
            renewed: start,
        };
        tokio::spawn(run(shared, session, CancellationToken::new()));
        (attempts, start, dir)
    }

    /// [`session`] with one attempt running from the start.
    async fn heartbeats(
        url: &str,
        budget: SelfFenceBudget,
    ) -> (StopSignal, Instant, tempfile::TempDir) {
        let (attempts, start, dir) = session(url, budget).await;
        let stop = attempts.begin(AttemptId::new(), 1, &CancellationToken::new());
        (stop, start, dir)
    }

    #[tokio::test(start_paused = true)]
    async fn a_black_holed_heartbeat_does_not_hold_off_the_fence() {
        // TTL 30 s, grace 10 s: fence 17 s after the last renewal, dead by 27 s < 30 s.
        let budget = SelfFenceBudget::new(S(30), S(10)).expect("budget");
        let url = coordinator(0, S(0)).await;
        let (stop, start, _dir) = heartbeats(&url, budget).await;
        stop.cancel.cancelled().await;
        let at = start.elapsed();
        assert_eq!(stop.reason(), Some(StopReason::LeaseLost));
        assert!(
            at >= budget.fence_after && at < budget.fence_after + Duration::from_millis(200),
            "fenced after {at:?}, due at {:?}",
            budget.fence_after
        );
    }

    #[tokio::test(start_paused = true)]
    async fn renewal_counts_from_the_sending_of_the_heartbeat_not_its_answer() {
        let budget = SelfFenceBudget::new(S(30), S(10)).expect("budget");
        // The first heartbeat leaves at 10 s and is answered at 15 s; nothing after.
        let url = coordinator(1, S(5)).await;
        let (stop, start, _dir) = heartbeats(&url, budget).await;
        stop.cancel.cancelled().await;
        let at = start.elapsed();
        let due = budget.every + budget.fence_after;
        // Counted from the answer, the agent would fence at 32 s and its job could still be
        // dying at 42 s, while the coordinator, which may have renewed at 10 s, expires the
        // lease at 40 s.
        assert!(
            at >= due && at < due + Duration::from_millis(200),
            "fenced after {at:?}, due at {due:?}"
        );
    }

    /// How long the coordinator takes to answer is what decides, at a short TTL, whether a
    /// node fences its jobs: the agent's page shows each answered heartbeat's round trip.
    #[tokio::test(start_paused = true)]
    async fn each_answered_heartbeat_s_round_trip_is_on_the_metrics_page() {
        let budget = SelfFenceBudget::new(S(30), S(10)).expect("budget");
        // Two heartbeats answered, each 3 s after it was sent; nothing after.
        let url = coordinator(2, S(3)).await;
        let metrics_dir = tempfile::tempdir().expect("tempdir");
        let metrics = metrics_in(metrics_dir.path());
        let telemetry = crate::agent::telemetry::Telemetry::new(Duration::ZERO, 10);
        let (attempts, _start, _dir) =
            session_with(&url, budget, telemetry, Some(metrics.clone())).await;
        let stop = attempts.begin(AttemptId::new(), 1, &CancellationToken::new());
        stop.cancel.cancelled().await;
        let page = metrics.render();
        let line = |name: &str| {
            page.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} in\n{page}"))
                .to_string()
        };
        assert_eq!(
            line("headroom_heartbeat_round_trip_seconds_count"),
            "headroom_heartbeat_round_trip_seconds_count 2"
        );
        let sum: f64 = line("headroom_heartbeat_round_trip_seconds_sum ")
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a sum");
        assert!((6.0..6.1).contains(&sum), "{sum}");
        assert!(
            page.contains(r#"headroom_heartbeat_round_trip_seconds_bucket{le="5.0"} 2"#)
                && page.contains(r#"headroom_heartbeat_round_trip_seconds_bucket{le="2.5"} 0"#),
            "{page}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_launched_after_the_deadline_is_fenced_at_once() {
        let budget = SelfFenceBudget::new(S(30), S(10)).expect("budget");
        let url = coordinator(0, S(0)).await;
        let (attempts, start, _dir) = session(&url, budget).await;
        tokio::time::sleep(S(20)).await;
        let stop = attempts.begin(AttemptId::new(), 1, &CancellationToken::new());
        stop.cancel.cancelled().await;
        assert_eq!(stop.reason(), Some(StopReason::LeaseLost));
        let at = start.elapsed();
        assert!(
            at < S(20) + Duration::from_millis(200),
            "fenced after {at:?}"
        );
    }

    /// A coordinator that answers the first heartbeat 503 (store unavailable) and every
    /// later one 200, passing on the bodies it answered 200.
    async fn flaky_coordinator() -> (
        String,
        tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
    ) {
        let down = r#"{"error": {"code": "store_unavailable", "message": "down"}}"#;
        answering_first("503 Service Unavailable", down.to_string()).await
    }

    /// A coordinator that answers the first heartbeat with `status` and `answer` and every
    /// later one 200, passing on the bodies it answered 200.
    async fn answering_first(
        status: &'static str,
        answer: String,
    ) -> (
        String,
        tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
    ) {
        let first_answer = (status, answer);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut first = true;
            while let Ok((mut conn, _)) = listener.accept().await {
                // One request per connection, read whole (headers, then content-length bytes).
                let mut buf = Vec::new();
                let body = loop {
                    let mut chunk = [0u8; 8192];
                    let Ok(n) = conn.read(&mut chunk).await else {
                        break None;
                    };
                    if n == 0 {
                        break None;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse().ok())?
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            break Some(body.to_string());
                        }
                    }
                };
                let Some(body) = body else { continue };
                let (status, answer) = if first {
                    first = false;
                    first_answer.clone()
                } else {
                    let _ = tx.send(serde_json::from_str(&body).expect("json body"));
                    (
                        "200 OK",
                        serde_json::to_string(&HeartbeatResponse {
                            requeue: vec![],
                            cancel: vec![],
                            stale: vec![],
                            plan: "1".into(),
                        })
                        .expect("json"),
                    )
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = conn.write_all(resp.as_bytes()).await;
            }
        });
        (url, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn telemetry_a_heartbeat_could_not_deliver_goes_with_the_next() {
        let budget = SelfFenceBudget::new(S(30), S(10)).expect("budget");
        let (url, mut delivered) = flaky_coordinator().await;
        let telemetry = crate::agent::telemetry::Telemetry::new(Duration::ZERO, 10);
        let at = |ms| chrono::DateTime::from_timestamp_millis(ms).expect("time");
        telemetry.push(vec![headroom_shared::api::TelemetrySample {
            gpu: 0,
            at: at(1_000),
            power_w: Some(100.0),
            ..Default::default()
        }]);
        let (_attempts, _start, _dir) = session_with(&url, budget, telemetry.clone(), None).await;
        // Taken by the first heartbeat (refused) before this one is pushed.
        tokio::time::sleep(budget.every + Duration::from_millis(100)).await;
        telemetry.push(vec![headroom_shared::api::TelemetrySample {
            gpu: 0,
            at: at(2_000),
            power_w: Some(200.0),
            ..Default::default()
        }]);
        // Whatever heartbeats carry them, both arrive, each once, oldest first.
        let mut shipped: Vec<i64> = Vec::new();
        while shipped.len() < 2 {
            // Virtual time: a lost sample fails here, after a few heartbeats, not never.
            let body = tokio::time::timeout(S(120), delivered.recv())
                .await
                .unwrap_or_else(|_| panic!("delivered so far: {shipped:?}"))
                .expect("a delivered heartbeat");
            shipped.extend(
                body["telemetry"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .map(|s| {
                        s["at"]
                            .as_str()
                            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                            .expect("at")
                            .timestamp_millis()
                    }),
            );
        }
        assert_eq!(shipped, vec![1_000, 2_000], "oldest first, nothing lost");
        assert_eq!(telemetry.dropped(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_refused_for_one_stale_lease_stops_that_attempt_only() {
        let budget = SelfFenceBudget::new(S(30), S(10)).expect("budget");
        let stale = AttemptId::new();
        // The attempt is named in the answer's `attempt` field, not in its message.
        let refusal = format!(
            r#"{{"error": {{"code": "stale_fence", "message": "the lease was lost", "attempt": "{stale}"}}}}"#
        );
        let (url, mut renewed) = answering_first("409 Conflict", refusal).await;
        let (attempts, _start, _dir) = session(&url, budget).await;
        let lost = attempts.begin(stale, 1, &CancellationToken::new());
        let other = AttemptId::new();
        let kept = attempts.begin(other, 1, &CancellationToken::new());
        // The first heartbeat leaves at `every` (10 s) and is refused at once.
        tokio::time::timeout(budget.every + S(1), lost.cancel.cancelled())
            .await
            .expect("the attempt the refusal named is stopped");
        assert_eq!(lost.reason(), Some(StopReason::LeaseLost));
        let next = renewed.recv().await.expect("the next heartbeat");
        let named: Vec<String> = next["attempts"]
            .as_array()
            .expect("attempts")
            .iter()
            .filter_map(|a| a["attempt"].as_str().map(str::to_string))
            .collect();
        assert_eq!(named, vec![other.to_string()], "{next}");
        assert_eq!(
            kept.reason(),
            None,
            "the other lease is renewed, not stopped"
        );
    }
}
