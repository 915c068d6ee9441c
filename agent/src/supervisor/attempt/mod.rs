//! Runs one attempt of a job, in four rooms: `spawn` (its log, what was on its GPUs before,
//! its colocated background, its job in a session of its own), the run (here: exit, timeout,
//! cancel, the background's exit, sampling ticks), `watch` (peak memory, contamination,
//! telemetry, the log's OOM text and tail) and `stop` (every process of the attempt ended,
//! none left on its GPUs, verified). `launch` says what an attempt is given and gives back,
//! `command` how its job's command is built, `running` what a started attempt holds.

pub(crate) mod command;
pub(crate) mod launch;
mod log;
mod running;
mod spawn;
mod stop;
#[cfg(test)]
pub(crate) mod tests;
pub(crate) mod watch;
mod workspace;

use std::sync::Arc;
use std::time::Duration;

use headroom_shared::colocate::OnBackgroundExit;
use headroom_shared::results::AttemptMetrics;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use command::job_dir;
pub(crate) use launch::not_started;
pub use launch::{AttemptEnd, Launch, Restart, SupervisorConfig};
pub(crate) use log::{note_at, read_from};
use running::Running;
pub use running::kill_marked;
use stop::Stop;
pub use watch::Baseline;
use watch::lock;

use crate::gpu::GpuBackend;
use crate::supervisor::classify::{Stopped, Unstarted};
use crate::supervisor::colocate;

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot make the agent a child subreaper (prctl PR_SET_CHILD_SUBREAPER): {0}")]
    Subreaper(#[source] nix::Error),
}

/// Makes orphaned descendants of this process re-parent to it instead of init, so that the
/// supervisor can find, kill and reap double-forked processes of an attempt.
pub fn become_subreaper() -> Result<(), SupervisorError> {
    nix::sys::prctl::set_child_subreaper(true).map_err(SupervisorError::Subreaper)
}

/// Runs one attempt to its end and cleans up after it; never fails: problems are reported in
/// the returned [`AttemptEnd`]. `started` is called with the pid once the process runs.
///
/// Dropping the future kills the attempt's processes (best effort, unverified): stop an
/// attempt through `cancel` instead.
pub async fn run_attempt(
    launch: Launch,
    backend: Arc<dyn GpuBackend>,
    cfg: &SupervisorConfig,
    cancel: CancellationToken,
    started: impl FnOnce(u32) + Send,
) -> AttemptEnd {
    let checkpoint = CancellationToken::new();
    run_attempt_reporting(launch, backend, cfg, cancel, checkpoint, started, None).await
}

/// The hard GPU memory limit of an attempt placed by `estimate_mib` (its OOM ladder step
/// included): the estimate and a slack of 5% or 256 MiB, whichever is more, for what a
/// job's allocator rounds up and the CUDA context.
pub fn memory_cap_for(estimate_mib: u64) -> u64 {
    estimate_mib.saturating_add((estimate_mib / 20).max(256))
}

/// The latest metrics of a running attempt, for its supervisor to report.
pub type MetricsTx = tokio::sync::watch::Sender<Option<AttemptMetrics>>;

/// How often a running attempt's metrics are handed on when they changed (at once when the
/// job reached a rung of `early_stop`, whose decision should not wait).
pub const METRICS_EVERY: Duration = Duration::from_secs(5);

/// [`run_attempt`], handing its metrics to `metrics` while it runs (at most every
/// [`METRICS_EVERY`] when they changed, at the next sampling tick when a rung was reached).
/// `checkpoint` asks for a stop that requeues: the job gets its checkpoint signal, then
/// its `lead`, then the usual stop (a job without one is stopped at once, through `cancel`).
#[allow(clippy::too_many_arguments)]
pub async fn run_attempt_reporting(
    launch: Launch,
    backend: Arc<dyn GpuBackend>,
    cfg: &SupervisorConfig,
    cancel: CancellationToken,
    checkpoint: CancellationToken,
    started: impl FnOnce(u32) + Send,
    metrics: Option<MetricsTx>,
) -> AttemptEnd {
    if cancel.is_cancelled() {
        return not_started(Unstarted::Stopped, String::new());
    }
    let mut run = match spawn::start(&launch, &backend, cfg, &cancel).await {
        Ok(run) => run,
        Err(end) => {
            // Asked for: lifted whether or not it was set in time (a late set lands here).
            if launch.memory_cap_mib.is_some() {
                spawn::clear_cap(launch.attempt, &backend).await;
            }
            remove_tmp(&launch);
            return end;
        }
    };
    started(run.pid);
    // The start reading was taken before the job's exec ([`spawn::start`]). With a
    // colocated background the figures are the foreground's run on the GPU, background
    // included: its start and readiness wait come before that reading.
    let stop = until_stop(&mut run, &launch, &cancel, &checkpoint, metrics.as_ref()).await;
    let end = stop::end(run, stop, &launch, &backend, cfg).await;
    if launch.memory_cap_mib.is_some() {
        spawn::clear_cap(launch.attempt, &backend).await;
    }
    if end.cleanup_verified {
        remove_tmp(&launch);
    }
    end
}

/// The attempt's temporary directory goes with it, once nothing of it can write there any
/// more (the removal follows no link a job left in it; where the tree was not verified gone,
/// it stays, as the attempt's cgroup does). Only the attempt's own: a directory of that name
/// that is not its user's and private (one planted there, which the launch refused) stays.
fn remove_tmp(launch: &Launch) {
    let tmp = command::tmp_dir(launch);
    if !command::is_own_tmp(launch, &tmp) {
        return;
    }
    if let Err(e) = std::fs::remove_dir_all(&tmp)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(
            "cannot remove the attempt's temporary directory {}: {e}",
            tmp.display()
        );
    }
}

/// The run: waits for the job's exit, its timeout, a cancel, a requeue's checkpoint lead
/// or (with `on_background_exit: fail`) its background's exit, sampling its GPUs and log
/// meanwhile. With `checkpoint`, the job gets its signal `lead` before its timeout, and at
/// once on a requeue, whose stop comes `lead` later.
async fn until_stop(
    run: &mut Running,
    launch: &Launch,
    cancel: &CancellationToken,
    checkpoint: &CancellationToken,
    metrics: Option<&MetricsTx>,
) -> Stop {
    // Sample early and then less often: a short job must still be seen on its GPU once
    // (its peak teaches the estimate), a long one costs one sample per `sample_every`.
    let mut gap = Duration::from_millis(50).min(run.sample_every);
    let mut next_sample = Instant::now() + gap;
    let deadline = launch.timeout.map(|t| Instant::now() + t);
    let mut metrics_due = Instant::now() + METRICS_EVERY;
    let signal = launch.restart.checkpoint.as_ref().map(checkpoint_signal);
    // Before its timeout: the signal's time; after a requeue's signal: the stop's.
    let mut signal_at = match (deadline, signal) {
        (Some(d), Some((_, lead))) => Some(d.checked_sub(lead).unwrap_or(d)),
        _ => None,
    };
    let mut stop_at: Option<Instant> = None;
    // Why it was signalled, once it was: a job that exits after its signal was stopped.
    let mut signalled = None;
    loop {
        tokio::select! {
            // A job that has finished is reported as finished, whatever else is ready.
            biased;
            status = run.child.wait() => return match signalled {
                Some(why) => Stop::AfterSignal(status.ok(), why),
                None => Stop::Exited(status.ok()),
            },
            _ = cancel.cancelled() => return Stop::Cancelled,
            _ = sleep_until(deadline) => return Stop::Timeout,
            _ = sleep_until(stop_at) => return Stop::Cancelled,
            _ = checkpoint.cancelled(), if stop_at.is_none() => {
                let Some((sig, lead)) = signal else { return Stop::Cancelled };
                if signalled.is_none() {
                    send_checkpoint(run, sig, &format!("asked to stop and requeue: sent \
                        SIG{sig} (checkpoint), stopping the job in {}",
                        humantime::format_duration(lead)));
                }
                signalled = Some(Stopped::Cancel);
                stop_at = Some(Instant::now() + lead);
            }
            _ = sleep_until(signal_at) => {
                signal_at = None;
                if let Some((sig, lead)) = signal && signalled.is_none() {
                    send_checkpoint(run, sig, &format!("timeout in {}: sent SIG{sig} \
                        (checkpoint)", humantime::format_duration(lead)));
                    signalled = Some(Stopped::Timeout);
                }
            }
            _ = background_exit(&mut run.background) => {
                if let Some(bg) = run.background.as_mut() {
                    bg.exited_early = true;
                    let on_exit = launch.background.as_ref().map(|b| b.on_exit);
                    if on_exit == Some(OnBackgroundExit::Fail) {
                        log::note(&run.log, &format!(
                            "the background exited ({}) while the foreground ran: stopping the \
                             foreground (on_background_exit: fail)",
                            bg.describe_exit()
                        ));
                        return Stop::BackgroundExited;
                    }
                    log::note(&run.log, &format!(
                        "the background exited ({}) while the foreground ran; the foreground \
                         goes on (on_background_exit: flag)",
                        bg.describe_exit()
                    ));
                }
            }
            _ = tokio::time::sleep_until(next_sample) => {
                let w = run.watch.clone();
                let (wanted, due) = (metrics.is_some(), Instant::now() >= metrics_due);
                let latest = tokio::task::spawn_blocking(move || {
                    let mut w = lock(&w);
                    w.step();
                    let m = &mut w.log.metrics;
                    let now = wanted && (m.take_rung_reached() || due);
                    (now && m.take_changed()).then(|| m.live_snapshot())
                })
                .await;
                if let (Some(tx), Ok(Some(latest))) = (metrics, latest) {
                    tx.send_replace(Some(latest));
                    metrics_due = Instant::now() + METRICS_EVERY;
                }
                gap = (gap * 2).min(run.sample_every);
                next_sample = Instant::now() + gap;
            }
        }
    }
}

/// A job's checkpoint signal and lead.
fn checkpoint_signal(c: &headroom_shared::checkpoint::Checkpoint) -> (&str, Duration) {
    (c.signal.as_str(), Duration::from_millis(c.lead_ms))
}

/// Sends the job's process group its checkpoint signal, saying so in its log.
fn send_checkpoint(run: &Running, sig: &str, note: &str) {
    match format!("SIG{sig}").parse::<nix::sys::signal::Signal>() {
        Ok(s) => {
            log::note(&run.log, note);
            running::signal_group(run.pid, s);
        }
        Err(e) => log::note(&run.log, &format!("cannot send SIG{sig}: {e}")),
    }
}

/// Resolves when the colocated background (if any, still unreaped) exits.
async fn background_exit(bg: &mut Option<colocate::Running>) {
    match bg {
        Some(b) if b.exit.is_none() => {
            b.exited().await;
        }
        _ => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
