//! One lease, from launch to report: starts the attempt's supervisor process (see
//! [`crate::supervisor`]) or follows one a former run of the agent started, ships its log, renews
//! its lease deadline, forwards stop requests, and reports its end (journalled by the
//! supervisor before it said so), retrying until the coordinator has heard it (a draining
//! agent gives up after a while: the lease then expires, and the next run reports the
//! journalled end).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use headroom_shared::AttemptId;
use headroom_shared::api::{FinishReport, Lease, StartReport};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::agent::attempts::{Left, StopReason, StopSignal};
use crate::agent::backoff::Backoff;
use crate::agent::client::{Client, ClientError};
use crate::agent::self_fence::SelfFenceBudget;
use crate::agent::{Shared, sample};
use crate::outcomes::Outcome;
use crate::supervisor::attempt::Restart;
use crate::supervisor::attempt::{self, Baseline, Launch};
use crate::supervisor::classify::{self, EndFacts, Unstarted};
use crate::supervisor::direct::Direct;
use crate::supervisor::proto::{Conn, FromSupervisor, Monotonic, ProtoError, Spec, ToSupervisor};

/// Tries at reporting an end once the agent drains (about half a minute with the backoff).
const DRAINING_TRIES: u32 = 10;

/// How the agent's exit reaches an attempt's task.
#[derive(Clone)]
pub(crate) struct Exit {
    /// Cancelled when the agent drains: reports are tried a few more times, then left to the
    /// journal.
    pub giving_up: CancellationToken,
    /// Cancelled when the agent exits leaving its attempts running: the task lets go of the
    /// supervisor (which fences itself unless an agent re-attaches in time).
    pub detach: CancellationToken,
}

/// A new lease: starts its supervisor process and follows it to the end. `baseline`: what
/// was on its GPUs at admission, just before.
pub(crate) async fn run(
    shared: Arc<Shared>,
    lease: Lease,
    baseline: Baseline,
    leased_until: Instant,
    budget: SelfFenceBudget,
    stop: StopSignal,
    exit: Exit,
) {
    let attempt = lease.attempt;
    // The supervisor's own line to the coordinator, for while this agent is away.
    let direct = lease.report_key.map(|key| Direct {
        server: shared.client.base().to_string(),
        key: key.0,
        fence_after_ms: millis(budget.fence_after),
        every_ms: millis(budget.every),
        ttl_ms: millis(budget.ttl),
        ca_file: shared.cfg.ca_file.clone(),
    });
    let fence = lease.fence;
    let gpus = lease.gpus.clone();
    let mut env = lease.env;
    // The agent's own marker wins over anything the job sets: the restart sweep finds this
    // agent's processes by it.
    env.insert(
        crate::agent::sweep::AGENT_VAR.to_string(),
        shared.scope.clone(),
    );
    let run_as = crate::runas::effective(lease.run_as, &shared.cfg.run_as_default);
    let source = lease.source.unwrap_or_default();
    let workdir = match &source.snapshot {
        Some(snap) => {
            if let Some(dir) = &source.workdir {
                // Where the code came from: a job may write its results back there.
                env.insert("HEADROOM_SUBMIT_DIR".to_string(), dir.clone());
            }
            // A cancel or the agent's exit does not wait for a fetch.
            let readied = tokio::select! {
                r = crate::agent::code::tree(&shared, snap, run_as.as_ref(), attempt) => r,
                _ = stop.cancel.cancelled() => {
                    let msg = "[headroom] stopped while its code was being readied\n".to_string();
                    let why = (Unstarted::Stopped, stop.reason());
                    return unlaunched(&shared, attempt, fence, gpus, why, msg, &exit).await;
                }
                _ = exit.detach.cancelled() => {
                    let msg = "[headroom] the agent left while its code was being readied\n";
                    let why = (Unstarted::Stopped, Some(StopReason::Shutdown));
                    return unlaunched(&shared, attempt, fence, gpus, why, msg.into(), &exit).await;
                }
            };
            match readied {
                Ok(tree) => Some(tree),
                Err(e) => {
                    tracing::error!(%attempt, "cannot ready the job's code: {e}");
                    let msg = format!("[headroom] cannot ready the job's code: {e}\n");
                    let why = (Unstarted::LaunchFailed, None);
                    return unlaunched(&shared, attempt, fence, gpus, why, msg, &exit).await;
                }
            }
        }
        None => source.workdir.map(PathBuf::from),
    };
    // Only where the GPUs can hold an attempt to a limit: elsewhere its supervisor must not
    // wait for its GPUs to open to find that out.
    let capped = match lease.estimate_mib.filter(|_| !lease.memory_cap_off) {
        Some(estimate) => {
            let backend = shared.backend.clone();
            tokio::task::spawn_blocking(move || backend.memory_caps().is_ok())
                .await
                .unwrap_or(false)
                .then(|| crate::supervisor::attempt::memory_cap_for(estimate))
        }
        None => None,
    };
    let launch = Launch {
        attempt,
        job: lease.job,
        argv: lease.argv,
        base_env: shared.job_base_env.clone(),
        env,
        params: lease.params,
        gpus: lease.gpus,
        timeout: lease.timeout_ms.map(Duration::from_millis),
        log_path: log_path(&shared, attempt),
        workdir,
        environment: source.environment,
        baseline: Some(baseline),
        prestart: lease.prestart.unwrap_or_default(),
        background: lease.background,
        run_as,
        results: lease.results,
        host_memory_mib: lease.host_memory_mib,
        restart: Restart {
            checkpoint: lease.checkpoint,
            job_dir: Some(crate::supervisor::attempt::job_dir(
                &shared.cfg.job_dirs,
                lease.job,
            )),
            count: lease.number.saturating_sub(1),
            previous_end: lease.previous_end,
        },
        memory_cap_mib: capped,
    };
    // Subscribed before the deadline is read for the launch: a renewal in between reaches
    // the supervisor as its first `renew`, rather than being taken as already sent.
    let mut deadlines = shared.attempts.fence_deadline();
    let renewed = *deadlines.borrow_and_update();
    let stop_at = renewed.map_or(leased_until, |d| d.max(leased_until));
    match spawn_supervisor(&shared, launch, fence, stop_at, direct).await {
        Ok(conn) => {
            follow(
                shared, attempt, fence, gpus, conn, None, deadlines, stop, exit, true,
            )
            .await
        }
        Err(e) => {
            tracing::error!(%attempt, "cannot start the attempt's supervisor: {e}");
            let msg = format!("[headroom] cannot start the attempt's supervisor: {e}\n");
            let why = (Unstarted::LaunchFailed, None);
            unlaunched(&shared, attempt, fence, gpus, why, msg, &exit).await;
        }
    }
}

/// An attempt whose supervisor never started (`why`, with the stop's reason if it was
/// stopped), journalled and reported.
async fn unlaunched(
    shared: &Arc<Shared>,
    attempt: AttemptId,
    fence: i64,
    gpus: Vec<u32>,
    why: (Unstarted, Option<StopReason>),
    msg: String,
    exit: &Exit,
) {
    let mut end = attempt::not_started(why.0, msg);
    end.facts = end.facts.told(why.1);
    let report = crate::supervisor::report(fence, end, None, sample(&shared.backend).await);
    let outcome = Outcome { attempt, report };
    journal(shared, &outcome).await;
    let left = Left {
        gpus,
        ..Left::default()
    };
    finish(shared, outcome, left, &exit.giving_up).await;
}

fn log_path(shared: &Shared, attempt: AttemptId) -> PathBuf {
    shared
        .cfg
        .data_dir
        .join("logs")
        .join(format!("{attempt}.log"))
}

/// Hands the launch to an attempt supervisor process (the agent's own binary, see
/// [`crate::supervisor`]), one started ahead of the lease when it could be
/// ([`crate::agent::standby`]).
async fn spawn_supervisor(
    shared: &Shared,
    launch: Launch,
    fence: i64,
    stop_at: Instant,
    direct: Option<Direct>,
) -> Result<Conn, ProtoError> {
    let stop_in = stop_at.saturating_duration_since(Instant::now());
    let cfg = &shared.cfg.supervisor;
    let spec = Spec {
        launch,
        fence,
        data_dir: shared.cfg.data_dir.clone(),
        scope: shared.scope.clone(),
        gpu: shared.cfg.gpu.clone(),
        job_env: shared.backend.job_env(),
        kill_grace_ms: millis(cfg.kill_grace),
        verify_timeout_ms: millis(cfg.verify_timeout),
        sample_every_ms: millis(cfg.sample_every),
        start_reading_wait_ms: millis(cfg.start_reading_wait),
        stop_in_ms: millis(stop_in),
        measured_at: Some(Monotonic::now()),
        spare: shared.outcomes.take_spare(),
        key: shared.attach_key.clone(),
        direct,
        cgroups: shared.cgroups.clone(),
    };
    let launch = ToSupervisor::Launch {
        spec: Box::new(spec),
    };
    // A waiting supervisor may have died meanwhile (killed by hand, OOM-killed): the next
    // one takes the launch, or, when none is left, one started now.
    while let Some(mut conn) = shared.standby.take_waiting() {
        match conn.send(&launch).await {
            Ok(()) => return Ok(conn),
            Err(e) => tracing::warn!("a waiting attempt supervisor is gone ({e}); trying another"),
        }
    }
    let mut conn = shared.standby.take_new()?;
    conn.send(&launch).await?;
    Ok(conn)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Follows an attempt's supervisor over `conn` until it ends (or, when the agent exits
/// leaving its attempts running, until then): start report, log shipping, lease deadlines
/// and stop requests; then reports the end. `started`: the job's pid and start, when a
/// re-attached supervisor said it runs (reported again: a former run may have died before it
/// could; a repeated start report changes nothing). `ours`: this agent process started the
/// supervisor (it runs this binary), so it may take the next attempt after a clean end.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn follow(
    shared: Arc<Shared>,
    attempt: AttemptId,
    fence: i64,
    gpus: Vec<u32>,
    mut conn: Conn,
    started: Option<(u32, DateTime<Utc>)>,
    mut deadlines: tokio::sync::watch::Receiver<Option<Instant>>,
    stop: StopSignal,
    exit: Exit,
    ours: bool,
) {
    let ship_stop = CancellationToken::new();
    let shipper = tokio::spawn(ship_log(
        shared.client.clone(),
        attempt,
        fence,
        log_path(&shared, attempt),
        ship_stop.clone(),
    ));
    // `deadlines`: the renewals since the supervisor's deadline was set (at launch, or for a
    // re-attached one by a former run, kept until this run has renewed the leases).
    let (mut stop_sent, mut now_sent) = (false, false);
    let mut start_report = started.map(|(pid, at)| {
        tokio::spawn(report_start(shared.client.clone(), attempt, fence, pid, at))
    });
    let ended = loop {
        tokio::select! {
            msg = conn.recv::<FromSupervisor>() => match msg {
                Ok(Some(FromSupervisor::Waiting { reason })) => {
                    shared.attempts.set_waiting(attempt, reason);
                }
                Ok(Some(FromSupervisor::Started { pid, started_at })) => {
                    shared.attempts.set_waiting(attempt, None);
                    start_report = Some(tokio::spawn(report_start(
                        shared.client.clone(), attempt, fence, pid, started_at,
                    )));
                }
                Ok(Some(FromSupervisor::Hello { .. })) => {}
                Ok(Some(FromSupervisor::Ended { held_by, ghost_limits, report, reusable })) => {
                    let left = Left { gpus: gpus.clone(), pids: held_by, ghost_limits };
                    break Some((left, *report, reusable && ours));
                }
                Ok(None) => break None,
                Err(ProtoError::Format { line, source }) => {
                    tracing::warn!(%attempt, "unreadable message from the supervisor: {source}: {line}");
                }
                Err(e) => {
                    tracing::warn!(%attempt, "supervisor connection: {e}");
                    break None;
                }
            },
            _ = stop.cancel.cancelled(), if !stop_sent => {
                stop_sent = true;
                let reason = stop.reason().unwrap_or(StopReason::Shutdown);
                if let Err(e) = conn.send(&ToSupervisor::Stop { reason }).await {
                    tracing::warn!(%attempt, "cannot tell the supervisor to stop: {e}");
                }
            }
            // After a requeue's stop, one that cannot wait for the checkpoint lead: the
            // supervisor stops the job at once on a second reason.
            _ = stop.now.cancelled(), if stop_sent && !now_sent => {
                now_sent = true;
                if let Some(reason) = stop.now_reason()
                    && let Err(e) = conn.send(&ToSupervisor::Stop { reason }).await
                {
                    tracing::warn!(%attempt, "cannot tell the supervisor to stop now: {e}");
                }
            }
            Ok(()) = deadlines.changed() => {
                let deadline = *deadlines.borrow_and_update();
                if let Some(d) = deadline {
                    let stop_in_ms = millis(d.saturating_duration_since(Instant::now()));
                    // A failure shows as the end of the connection.
                    let renew = ToSupervisor::Renew {
                        stop_in_ms,
                        measured_at: Some(Monotonic::now()),
                    };
                    let _ = conn.send(&renew).await;
                }
            }
            _ = exit.detach.cancelled() => {
                ship_stop.cancel();
                let _ = shipper.await;
                tracing::info!(%attempt, "left running under its supervisor");
                return;
            }
        }
    };
    if let Some(r) = start_report {
        let _ = r.await;
    }
    ship_stop.cancel();
    let _ = shipper.await;
    let (left, report, reusable) = match ended {
        Some(end) => end,
        None => {
            let (left, report) = gone(&shared, attempt, fence, &gpus).await;
            (left, report, false)
        }
    };
    finish(&shared, Outcome { attempt, report }, left, &exit.giving_up).await;
    // Only now, the end reported and out of the journal: until the supervisor hears from us
    // again (a launch) or loses the connection, it keeps the end, and reports it itself if
    // we go first.
    if reusable {
        shared.standby.put_back(conn);
    }
}

async fn report_start(
    client: Client,
    attempt: AttemptId,
    fence: i64,
    pid: u32,
    started_at: DateTime<Utc>,
) {
    let report = StartReport {
        fence,
        pid,
        started_at,
    };
    if let Err(e) = client.start(attempt, &report).await {
        tracing::warn!(%attempt, "start report failed: {e}");
    }
}

/// The supervisor went away without saying how the attempt ended: its journalled outcome if
/// it wrote one, else the attempt is lost and whatever is left of it is killed.
async fn gone(
    shared: &Arc<Shared>,
    attempt: AttemptId,
    fence: i64,
    gpus: &[u32],
) -> (Left, FinishReport) {
    let left = Left {
        gpus: gpus.to_vec(),
        ..Left::default()
    };
    let outcomes = shared.outcomes.clone();
    if let Ok(Ok(Some(o))) = tokio::task::spawn_blocking(move || outcomes.read(attempt)).await {
        return (left, o.report);
    }
    let killed = tokio::task::spawn_blocking(move || attempt::kill_marked(attempt))
        .await
        .unwrap_or_default();
    tracing::error!(%attempt, ?killed, "the attempt's supervisor died without an outcome: the attempt is lost");
    let why =
        format!("the attempt's supervisor process died; its processes {killed:?} were killed");
    let report = FinishReport {
        fence,
        failure: classify::decide(&EndFacts::unseen()),
        exit_code: None,
        signal: None,
        ended_at: Utc::now(),
        peak_mem_mib: None,
        peak_source: None,
        cleanup_ms: 0,
        // Not seen gone: the GPUs stay quarantined until the heartbeat finds them free.
        cleanup_verified: false,
        unverified: Some(why.clone()),
        contaminated: false,
        measurements: Default::default(),
        log_tail: format!("[headroom] {why}\n"),
        gpus: sample(&shared.backend).await,
        prestart: None,
        background: None,
        host_peak_mib: None,
        started: None,
        metrics: None,
        memory_cap_mib: None,
        oom_cause: None,
    };
    journal(
        shared,
        &Outcome {
            attempt,
            report: report.clone(),
        },
    )
    .await;
    (
        Left {
            pids: killed,
            ..left
        },
        report,
    )
}

async fn journal(shared: &Shared, outcome: &Outcome) {
    let journal = shared.outcomes.clone();
    let entry = outcome.clone();
    let attempt = outcome.attempt;
    match tokio::task::spawn_blocking(move || journal.write(&entry)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(%attempt, "cannot journal the outcome (reporting it anyway): {e}")
        }
        Err(e) => tracing::warn!(%attempt, "outcome journal task failed: {e}"),
    }
}

/// The attempt has ended (journalled): it leaves the running set, keeping its GPUs
/// quarantined if its cleanup was not verified, and its end is reported.
async fn finish(shared: &Shared, outcome: Outcome, left: Left, giving_up: &CancellationToken) {
    // Leave the running set first (the next claim must not watch this attempt any more).
    let unverified = (!outcome.report.cleanup_verified).then_some(left);
    shared.attempts.end(outcome.attempt, unverified).await;
    shared
        .metrics
        .attempt_ended(outcome.attempt, &outcome.report);
    if let Some(pause) = crate::outcomes::test_pause_before_report() {
        tokio::time::sleep(pause).await;
    }
    report_outcome(shared, &outcome, giving_up).await;
}

/// Reports an attempt's end, retrying until the coordinator has answered it (once
/// `giving_up` is cancelled, for a few more tries), then takes it out of the journal; one
/// left unanswered stays there for the agent's next run.
pub(crate) async fn report_outcome(
    shared: &Shared,
    outcome: &Outcome,
    giving_up: &CancellationToken,
) {
    let (attempt, report) = (outcome.attempt, &outcome.report);
    // The slot frees on the coordinator only when it hears of the end, so keep trying.
    let mut backoff = Backoff::coordinator();
    loop {
        match shared.client.finish(attempt, report).await {
            Ok(resp) => {
                tracing::info!(%attempt, failure = ?report.failure, job_state = %resp.job_state, "attempt reported");
                break;
            }
            Err(ClientError::Stale { message: m, .. }) => {
                tracing::warn!(%attempt, "finish refused, the lease is no longer ours: {m}");
                break;
            }
            Err(e) if e.is_transient() => {
                if giving_up.is_cancelled() && backoff.tries() >= DRAINING_TRIES {
                    tracing::warn!(%attempt, "giving up reporting the end (journalled for the next run): {e}");
                    return;
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
            // Refused for good: the same report would be refused again on the next run.
            Err(e) => {
                tracing::error!(%attempt, "finish refused: {e}");
                break;
            }
        }
    }
    let journal = shared.outcomes.clone();
    match tokio::task::spawn_blocking(move || journal.remove(attempt)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(%attempt, "cannot clear the journalled outcome: {e}"),
        Err(e) => tracing::warn!(%attempt, "outcome journal task failed: {e}"),
    }
}

/// Ships the attempt's log to the coordinator as it grows, and the rest at the end.
async fn ship_log(
    client: Client,
    attempt: AttemptId,
    fence: i64,
    path: PathBuf,
    stop: CancellationToken,
) {
    const CHUNK: usize = 1 << 20;
    let mut offset: u64 = 0;
    // The first look a tick after the start: the log of a job just started is empty.
    let every = Duration::from_millis(250);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tick.tick() => false,
        };
        // Ship everything there is; at the end, keep going until the file is drained.
        loop {
            let chunk = match attempt::read_from(&path, offset, CHUNK as u64).await {
                Ok(c) => c,
                Err(_) => break,
            };
            if chunk.is_empty() {
                break;
            }
            let n = chunk.len() as u64;
            match client.append_log(attempt, fence, offset, chunk).await {
                Ok(()) => offset += n,
                Err(ClientError::Stale { .. }) => return,
                Err(e) => {
                    tracing::debug!(%attempt, "log shipping failed, will retry: {e}");
                    break;
                }
            }
            if n < CHUNK as u64 {
                break;
            }
        }
        if last {
            return;
        }
    }
}
