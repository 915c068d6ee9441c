//! The wait before an attempt's job starts: an exclusive attempt waits until its GPUs hold
//! no process at all (foreign ones included), then a cooldown idles `seconds` or until the
//! hottest of its GPUs reads `until_temp_c`. Checked on the supervisor's sampling tick,
//! bounded, cancellable; a GPU that cannot be read is never taken as empty or cool.

use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use headroom_shared::api::GpuSample;
use headroom_shared::prestart::{Cooldown, OnCooldownTimeout, Prestart, PrestartReport};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::gpu::{self, GpuBackend};
use crate::supervisor::classify::Unstarted;

/// What the wait reads of the attempt's GPUs (the backend, or a script in tests).
pub trait Probe: Send {
    /// The processes on the GPUs, described (`pid 4242 (alice: python) holds 512 MiB`);
    /// empty when there are none. `Err` when a GPU cannot be read.
    fn occupants(&mut self) -> impl Future<Output = Result<Vec<String>, String>> + Send;
    /// The hottest GPU's temperature; `Err` when one of them cannot be read.
    fn hottest_c(&mut self) -> impl Future<Output = Result<f64, String>> + Send;
}

/// The GPU backend as a [`Probe`], keeping its last process reading (the job's baseline).
pub struct BackendProbe {
    backend: Arc<dyn GpuBackend>,
    gpus: Vec<u32>,
    pub last: Option<Vec<GpuSample>>,
}

impl BackendProbe {
    pub fn new(backend: Arc<dyn GpuBackend>, gpus: &[u32]) -> Self {
        Self {
            backend,
            gpus: gpus.to_vec(),
            last: None,
        }
    }
}

impl Probe for BackendProbe {
    async fn occupants(&mut self) -> Result<Vec<String>, String> {
        let b = self.backend.clone();
        let samples = tokio::task::spawn_blocking(move || gpu::read(b.as_ref()))
            .await
            .map_err(|e| format!("GPU reading failed: {e}"))?;
        let found = occupants_of(&samples, &self.gpus);
        self.last = Some(samples);
        found
    }

    async fn hottest_c(&mut self) -> Result<f64, String> {
        let (b, gpus) = (self.backend.clone(), self.gpus.clone());
        tokio::task::spawn_blocking(move || {
            let readings = b.telemetry().map_err(|e| e.to_string())?;
            hottest_of(&readings, &gpus)
        })
        .await
        .map_err(|e| format!("GPU reading failed: {e}"))?
    }
}

/// Every process on `gpus`, or why they cannot be known.
fn occupants_of(samples: &[GpuSample], gpus: &[u32]) -> Result<Vec<String>, String> {
    if let Some(error) = gpu::unreadable(samples, gpus) {
        return Err(error);
    }
    Ok(samples
        .iter()
        .filter(|s| gpus.contains(&s.index))
        .flat_map(|s| {
            s.processes.iter().map(move |p| {
                format!(
                    "GPU {}: pid {} ({}: {}) holds {} MiB",
                    s.index,
                    p.pid,
                    p.user.as_deref().unwrap_or("?"),
                    p.command.as_deref().unwrap_or("?"),
                    p.used_mib
                )
            })
        })
        .collect())
}

/// The highest temperature of `gpus`; an error when one has none (failed, unsupported).
fn hottest_of(
    readings: &[headroom_shared::api::TelemetrySample],
    gpus: &[u32],
) -> Result<f64, String> {
    let mut hottest = f64::MIN;
    for g in gpus {
        let t = readings
            .iter()
            .find(|r| r.gpu == *g)
            .and_then(|r| r.temperature_c.filter(|t| t.is_finite()))
            .ok_or_else(|| format!("GPU {g}'s temperature cannot be read"))?;
        hottest = hottest.max(t);
    }
    Ok(hottest)
}

/// Why the job did not start.
#[derive(Clone, Debug, PartialEq)]
pub struct NotStarted {
    /// `Stopped` (a cancel came first), `GpusBusy` or `CooldownTimedOut`.
    pub why: Unstarted,
    pub message: String,
    pub report: PrestartReport,
}

/// Waits as `rules` say. `tick`: how often the GPUs are read; `status` is told what the
/// attempt waits for as it changes (`None` at the end); `log`: the attempt's log, which
/// gets a line at each stage. `Ok`: start the job.
pub async fn wait<P: Probe>(
    rules: &Prestart,
    probe: &mut P,
    tick: Duration,
    cancel: &CancellationToken,
    log: Option<&Path>,
    mut status: impl FnMut(Option<String>) + Send,
) -> Result<PrestartReport, NotStarted> {
    let begin = Instant::now();
    let mut report = PrestartReport::default();
    let mut ticker = tokio::time::interval(tick.max(Duration::from_millis(10)));
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut said: Option<String> = None;
    let mut say = |what: String, status: &mut dyn FnMut(Option<String>)| {
        if said.as_ref() != Some(&what) {
            status(Some(what.clone()));
            said = Some(what);
        }
    };
    let stop = |why, message: String, report: &PrestartReport| {
        note(log, &message);
        Err(NotStarted {
            why,
            message,
            report: report.clone(),
        })
    };

    if rules.exclusive {
        let deadline = begin + Duration::from_millis(rules.empty_wait_ms());
        let mut first = true;
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    return stop(Unstarted::Stopped, "cancelled while waiting for its GPUs to empty".into(), &report);
                }
                _ = ticker.tick() => {}
            }
            let why = match probe.occupants().await {
                Ok(list) if list.is_empty() => break,
                Ok(list) => format!("waiting for its GPUs to empty: {}", list.join("; ")),
                // Unknown is not empty: keep waiting, and say why.
                Err(e) => format!("waiting for its GPUs to read as empty: {e}"),
            };
            if first {
                note(log, &why);
                first = false;
            }
            say(why.clone(), &mut status);
            if Instant::now() >= deadline {
                let waited = begin.elapsed();
                report.exclusive_wait_ms = Some(ms(waited));
                return stop(
                    Unstarted::GpusBusy,
                    format!("not started: its GPUs did not empty within {waited:.0?} ({why})"),
                    &report,
                );
            }
        }
        report.exclusive_wait_ms = Some(ms(begin.elapsed()));
        if report.exclusive_wait_ms > Some(0) {
            note(
                log,
                &format!("its GPUs are empty after {:.1?}", begin.elapsed()),
            );
        }
    }

    if let Some(cooldown) = &rules.cooldown {
        let began = Instant::now();
        let from = probe.hottest_c().await;
        report.cooldown_from_temp_c = from.as_ref().ok().copied();
        match cooldown {
            Cooldown::Seconds { ms: idle } => {
                let idle = Duration::from_millis(*idle);
                let what = match &from {
                    Ok(t) => format!("cooling: idle {idle:.0?} from {t:.0} °C"),
                    Err(_) => format!("cooling: idle {idle:.0?}"),
                };
                note(log, &what);
                say(what, &mut status);
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => {
                        report.cooldown_wait_ms = Some(ms(began.elapsed()));
                        return stop(Unstarted::Stopped, "cancelled while cooling".into(), &report);
                    }
                    _ = tokio::time::sleep(idle) => {}
                }
                report.cooldown_start_temp_c = probe.hottest_c().await.ok();
            }
            Cooldown::UntilTemp {
                temp_c,
                max_wait_ms,
                on_timeout,
            } => {
                // `max_wait` bounds the whole wait before the start, emptying included.
                let deadline = begin + Duration::from_millis(*max_wait_ms);
                let mut reading = from;
                let mut first = true;
                loop {
                    let why = match &reading {
                        Ok(t) if *t <= *temp_c => {
                            report.cooldown_start_temp_c = Some(*t);
                            break;
                        }
                        Ok(t) => format!("cooling: {t:.0} °C → {temp_c:.0} °C"),
                        // Unknown is not cool: keep waiting, and say why.
                        Err(e) => format!("cooling to {temp_c:.0} °C: {e}"),
                    };
                    if first {
                        note(log, &why);
                        first = false;
                    }
                    say(why.clone(), &mut status);
                    if Instant::now() >= deadline {
                        report.cooldown_wait_ms = Some(ms(began.elapsed()));
                        report.cooldown_start_temp_c = reading.as_ref().ok().copied();
                        report.cooldown_timed_out = Some(true);
                        let waited = Duration::from_millis(*max_wait_ms);
                        match on_timeout {
                            OnCooldownTimeout::Fail => {
                                return stop(
                                    Unstarted::CooldownTimedOut,
                                    format!(
                                        "not started: not cool within max_wait {waited:.0?} ({why})"
                                    ),
                                    &report,
                                );
                            }
                            OnCooldownTimeout::Start => {
                                note(
                                    log,
                                    &format!(
                                        "not cool within max_wait {waited:.0?} ({why}): \
                                         starting anyway (on_timeout: start)"
                                    ),
                                );
                                status(None);
                                return Ok(report);
                            }
                        }
                    }
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => {
                            report.cooldown_wait_ms = Some(ms(began.elapsed()));
                            return stop(Unstarted::Stopped, "cancelled while cooling".into(), &report);
                        }
                        _ = ticker.tick() => {}
                    }
                    reading = probe.hottest_c().await;
                }
            }
        }
        report.cooldown_wait_ms = Some(ms(began.elapsed()));
        report.cooldown_timed_out.get_or_insert(false);
        note(
            log,
            &match report.cooldown_start_temp_c {
                Some(t) => format!("cooled for {:.1?}: {t:.0} °C at the start", began.elapsed()),
                None => format!("cooled for {:.1?}", began.elapsed()),
            },
        );
    }
    status(None);
    Ok(report)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A `[headroom]` line in the attempt's log. Best effort: a full disk must not change the
/// outcome.
fn note(log: Option<&Path>, msg: &str) {
    let Some(path) = log else { return };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(parent);
    }
    if let Ok(mut f) = std::fs::File::options()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(format!("[headroom] {msg}\n").as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Readings in order, one per call; the last one repeats.
    struct Script {
        occupants: VecDeque<Result<Vec<String>, String>>,
        temps: VecDeque<Result<f64, String>>,
    }

    fn next<T: Clone>(q: &mut VecDeque<T>) -> T {
        if q.len() > 1 {
            q.pop_front().expect("non-empty")
        } else {
            q.front().cloned().expect("a reading")
        }
    }

    impl Probe for Script {
        async fn occupants(&mut self) -> Result<Vec<String>, String> {
            next(&mut self.occupants)
        }
        async fn hottest_c(&mut self) -> Result<f64, String> {
            next(&mut self.temps)
        }
    }

    fn script(
        occupants: Vec<Result<Vec<String>, String>>,
        temps: Vec<Result<f64, String>>,
    ) -> Script {
        Script {
            occupants: occupants.into(),
            temps: temps.into(),
        }
    }

    fn until(temp_c: f64, max_wait_s: u64, on_timeout: OnCooldownTimeout) -> Prestart {
        Prestart {
            exclusive: false,
            cooldown: Some(Cooldown::UntilTemp {
                temp_c,
                max_wait_ms: max_wait_s * 1000,
                on_timeout,
            }),
        }
    }

    const TICK: Duration = Duration::from_secs(1);

    /// [`wait`] on the test tick, with no log, saying what it waits for to `said`.
    async fn wait_on(
        rules: &Prestart,
        p: &mut Script,
        cancel: &CancellationToken,
        said: impl FnMut(Option<String>) + Send,
    ) -> Result<PrestartReport, NotStarted> {
        wait(rules, p, TICK, cancel, None, said).await
    }

    #[tokio::test(start_paused = true)]
    async fn cooling_waits_until_the_hottest_gpu_reads_the_target() {
        let mut p = script(vec![], vec![Ok(52.0), Ok(48.0), Ok(44.0), Ok(40.0)]);
        let mut said = Vec::new();
        let start = Instant::now();
        let r = wait_on(
            &until(40.0, 600, OnCooldownTimeout::Fail),
            &mut p,
            &CancellationToken::new(),
            |s| said.push(s),
        )
        .await
        .expect("cooled");
        // Three ticks after the first reading (the first tick is immediate).
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert_eq!(r.cooldown_from_temp_c, Some(52.0));
        assert_eq!(r.cooldown_start_temp_c, Some(40.0));
        assert_eq!(r.cooldown_wait_ms, Some(2000));
        assert_eq!(r.cooldown_timed_out, Some(false));
        assert_eq!(said[0].as_deref(), Some("cooling: 52 °C → 40 °C"));
        assert_eq!(said.last(), Some(&None));
    }

    #[tokio::test(start_paused = true)]
    async fn max_wait_fails_the_attempt_or_starts_it_flagged() {
        let hot = || script(vec![], vec![Ok(70.0)]);
        let start = Instant::now();
        let e = wait_on(
            &until(40.0, 30, OnCooldownTimeout::Fail),
            &mut hot(),
            &CancellationToken::new(),
            |_| {},
        )
        .await
        .expect_err("never cools");
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        assert_eq!(e.why, Unstarted::CooldownTimedOut);
        assert!(e.message.contains("70 °C → 40 °C"), "{}", e.message);
        assert_eq!(e.report.cooldown_timed_out, Some(true));
        assert_eq!(e.report.cooldown_start_temp_c, Some(70.0));
        let r = wait_on(
            &until(40.0, 30, OnCooldownTimeout::Start),
            &mut hot(),
            &CancellationToken::new(),
            |_| {},
        )
        .await
        .expect("starts anyway");
        assert_eq!(r.cooldown_timed_out, Some(true));
        assert_eq!(r.cooldown_wait_ms, Some(30_000));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreadable_temperature_is_never_cool() {
        let mut p = script(
            vec![],
            vec![Err("GPU 0's temperature cannot be read".into())],
        );
        let mut said = Vec::new();
        let e = wait_on(
            &until(80.0, 5, OnCooldownTimeout::Fail),
            &mut p,
            &CancellationToken::new(),
            |s| said.push(s),
        )
        .await
        .expect_err("unknown is not cool");
        assert_eq!(e.why, Unstarted::CooldownTimedOut);
        assert_eq!(e.report.cooldown_start_temp_c, None);
        assert!(
            said[0]
                .as_deref()
                .is_some_and(|s| s.contains("cannot be read")),
            "{said:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn seconds_idle_that_long() {
        let mut p = script(vec![], vec![Ok(60.0), Ok(50.0)]);
        let rules = Prestart {
            exclusive: false,
            cooldown: Some(Cooldown::Seconds { ms: 60_000 }),
        };
        let start = Instant::now();
        let r = wait_on(&rules, &mut p, &CancellationToken::new(), |_| {})
            .await
            .expect("cooled");
        assert_eq!(start.elapsed(), Duration::from_secs(60));
        assert_eq!(r.cooldown_wait_ms, Some(60_000));
        assert_eq!(
            (r.cooldown_from_temp_c, r.cooldown_start_temp_c),
            (Some(60.0), Some(50.0))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn exclusive_waits_for_every_process_to_leave_and_unknown_is_not_empty() {
        let busy = Ok(vec![
            "GPU 0: pid 42 (alice: python) holds 512 MiB".to_string(),
        ]);
        let mut p = script(
            vec![
                busy,
                Err("GPU 0 could not be read: process list".into()),
                Ok(vec![]),
            ],
            vec![],
        );
        let rules = Prestart {
            exclusive: true,
            cooldown: None,
        };
        let mut said = Vec::new();
        let r = wait_on(&rules, &mut p, &CancellationToken::new(), |s| said.push(s))
            .await
            .expect("emptied");
        assert_eq!(r.exclusive_wait_ms, Some(2000));
        assert!(said[0].as_deref().is_some_and(|s| s.contains("pid 42")));
        assert!(
            said[1]
                .as_deref()
                .is_some_and(|s| s.contains("process list"))
        );
        // Never empty: `gpu_busy` at the bound (the default, without a max_wait).
        let mut p = script(
            vec![Ok(vec![
                "GPU 0: pid 42 (alice: python) holds 512 MiB".into(),
            ])],
            vec![],
        );
        let start = Instant::now();
        let e = wait_on(&rules, &mut p, &CancellationToken::new(), |_| {})
            .await
            .expect_err("busy");
        assert_eq!(e.why, Unstarted::GpusBusy);
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(headroom_shared::prestart::DEFAULT_EXCLUSIVE_WAIT_MS)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_wait_at_once() {
        let mut p = script(vec![], vec![Ok(70.0)]);
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            c.cancel();
        });
        let start = Instant::now();
        let e = wait_on(
            &until(40.0, 600, OnCooldownTimeout::Fail),
            &mut p,
            &cancel,
            |_| {},
        )
        .await
        .expect_err("stopped");
        assert_eq!(e.why, Unstarted::Stopped);
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }
}
