//! What is watched and measured while the attempt runs: its peak GPU memory, contamination
//! by other processes, its GPUs' telemetry, and its log (OOM text, the tail).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use headroom_shared::AttemptId;
use headroom_shared::api::{GpuProcess, GpuSample, Measurements, PeakSource, ghost_tolerance_mib};
use headroom_shared::memory_series::MemorySeries;
use headroom_shared::results::{AttemptMetrics, ResultsSpec};

use crate::gpu::{self, GpuBackend};
use crate::procscan::{self, ROLE_BACKGROUND, ROLE_VAR};
use crate::supervisor::measure::Meter;
use crate::supervisor::metrics::MetricScanner;
use crate::supervisor::oom::OomScanner;

use super::log::{note, open_log, read_tail};

/// Most log bytes scanned per sampling tick, so that a job flooding its log cannot stall
/// the watch loop; the rest is read on the next tick or at the end.
pub(super) const PUMP_LIMIT: u64 = 64 << 20;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What is watched while the attempt runs: its peak GPU memory and its log.
pub(crate) struct Watch {
    pub(super) backend: Arc<dyn GpuBackend>,
    pub(super) attempt: AttemptId,
    pub(super) peak: Peak,
    pub(super) log: LogFollower,
    /// The attempt's GPUs, and what was on them before it started.
    pub(super) gpus: Vec<u32>,
    pub(super) baseline: Baseline,
    pub(super) contaminated: bool,
    /// Telemetry of the attempt's GPUs over the run: energy, power, temperature, throttling.
    pub(super) meter: Meter,
    /// The first process that contaminated the attempt.
    pub(super) contamination: Option<Contamination>,
    /// Any process that is not the attempt's own on its GPUs contaminates it, another
    /// attempt's too.
    pub(super) exclusive: bool,
    /// The attempt has a colocated background: its processes are the attempt's own but not
    /// the foreground's peak, and any other attempt's process on the GPU contaminates it.
    pub(super) colocated: bool,
    /// Whether each of the attempt's pids is the background's (read once from its marker).
    pub(super) roles: HashMap<u32, bool>,
    /// The background has held GPU memory.
    pub(super) background_memory: bool,
    /// Unattributed memory on its GPUs beyond the baseline's: the most seen on one (0: none),
    /// `None` until a look could tell, and for good once one could not.
    pub(super) ghost: GhostLooks,
    /// Per GPU, its processes' SM utilization at the looks where they were on it.
    pub(super) own_util: HashMap<u32, UtilMean>,
    /// What its processes held over the run, from the job's exec (`exec_at`) on.
    pub(super) series: MemorySeries,
    pub(super) exec_at: Option<std::time::Instant>,
}

/// What the looks at an attempt's GPUs told of unattributed memory.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GhostLooks {
    most: u64,
    told: u32,
    unknown: bool,
}

impl GhostLooks {
    /// The figure to report: `None` unless every look could tell.
    fn result(&self) -> Option<u64> {
        (!self.unknown && self.told > 0).then_some(self.most)
    }
}

/// A mean of per-process utilization over looks; unknown once one look lacked it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct UtilMean {
    sum: f64,
    looks: u32,
    unknown: bool,
}

impl UtilMean {
    fn add(&mut self, pcts: impl Iterator<Item = Option<u32>>) {
        match pcts.map(|p| p.map(f64::from)).sum::<Option<f64>>() {
            Some(v) => {
                self.sum += v;
                self.looks += 1;
            }
            None => self.unknown = true,
        }
    }

    fn mean(&self) -> Option<f64> {
        (!self.unknown && self.looks > 0).then(|| self.sum / f64::from(self.looks))
    }
}

/// A process of no attempt (or, beside a colocated pair, of another attempt) seen on the
/// attempt's GPUs, described when it was seen.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Contamination {
    pub(super) reason: String,
    pub(super) pid: u32,
    pub(super) command: Option<String>,
}

impl Contamination {
    /// Blocking: reads the process's owner and command line from `/proc` when the backend
    /// did not give them.
    pub(super) fn of(gpu: u32, p: &GpuProcess) -> Self {
        let (user, command) = if p.user.is_some() || p.command.is_some() || p.outside_pid_namespace
        {
            (p.user.clone(), p.command.clone())
        } else {
            procscan::describe(p.pid)
        };
        let held = if p.used_mib_unknown {
            "memory the driver cannot size".to_string()
        } else {
            format!("{} MiB", p.used_mib)
        };
        let who = if p.outside_pid_namespace {
            "a process of another container".to_string()
        } else if let Some(other) = p.attempt {
            format!("a process of another attempt ({other})")
        } else {
            "a process of no attempt".to_string()
        };
        Self {
            reason: format!("{who} held {held} on GPU {gpu} during the run"),
            pid: p.pid,
            command: match (user, command) {
                (None, None) => None,
                (user, command) => Some(format!(
                    "{}: {}",
                    user.as_deref().unwrap_or("?"),
                    command.as_deref().unwrap_or("?")
                )),
            },
        }
    }
}

/// Reads the telemetry of the node's GPUs into the attempt's meter, off the runtime.
pub(super) fn take_reading(watch: &Arc<Mutex<Watch>>) -> tokio::task::JoinHandle<()> {
    let w = watch.clone();
    tokio::task::spawn_blocking(move || {
        let backend = {
            let w = lock(&w);
            if !w.meter.wants_readings() {
                return;
            }
            w.backend.clone()
        };
        // Read outside the lock, so a slow reading (NVML opening) holds up no one.
        let reading = backend.telemetry().map_err(|e| e.to_string());
        let at = std::time::Instant::now();
        lock(&w)
            .meter
            .record(at, reading.as_deref().map_err(Clone::clone));
    })
}

/// The attempt's peak memory, measured two ways.
#[derive(Default)]
pub(super) struct Peak {
    /// Sum of the attempt's processes' memory, when the driver gives it per process.
    pub(super) processes: Option<u64>,
    /// Growth of its GPUs' used memory over the baseline, at ticks where one of its
    /// processes was seen without per-process memory.
    pub(super) delta: Option<u64>,
    /// One of its processes was seen whose memory the driver cannot tell.
    pub(super) unknown: bool,
}

impl Peak {
    /// The figure to report: the per-process peak, or, when any process's memory was
    /// unknown, the device delta (`None`, never 0, when that could not be read either).
    pub(super) fn result(&self) -> (Option<u64>, PeakSource) {
        if self.unknown {
            // A process was on the GPU, so it held something: a growth of 0 means others
            // freed memory meanwhile and masked it, which is no measurement (and must not
            // teach an estimate of 0).
            (self.delta.filter(|&d| d > 0), PeakSource::DeviceDelta)
        } else {
            (self.processes, PeakSource::Processes)
        }
    }
}

/// `[headroom]` line saying that the peak is a device delta.
pub(super) fn peak_note(peak: Option<u64>) -> String {
    match peak {
        Some(mib) => format!(
            "peak memory {mib} MiB measured as the GPUs' used-memory growth since the start \
             (the driver gives no per-process memory here; other processes' growth counts too)"
        ),
        None => "peak memory unknown: the driver gives no per-process memory and the GPUs' \
                 used memory could not be read"
            .to_string(),
    }
}

/// What was on the attempt's GPUs before it started: cleanup returns to this, not to
/// "empty", and peak deltas count from it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Baseline {
    /// Processes of no attempt.
    foreign: HashSet<u32>,
    /// Used memory of each GPU that read fine.
    #[serde(with = "pairs")]
    used: HashMap<u32, u64>,
    /// Memory no listed process accounted for, of each GPU where that could be told.
    #[serde(with = "pairs", default)]
    unattributed: HashMap<u32, u64>,
    /// What more than that is noise: [`ghost_tolerance_mib`] of the GPU's memory.
    #[serde(with = "pairs", default)]
    tolerance: HashMap<u32, u64>,
}

/// A map with integer keys as a list of pairs: JSON object keys are strings, which serde
/// cannot read back as integers inside an internally tagged message.
mod pairs {
    use std::collections::HashMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(map: &HashMap<u32, u64>, s: S) -> Result<S::Ok, S::Error> {
        let mut v: Vec<(u32, u64)> = map.iter().map(|(k, v)| (*k, *v)).collect();
        v.sort_unstable();
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<HashMap<u32, u64>, D::Error> {
        Ok(Vec::<(u32, u64)>::deserialize(d)?.into_iter().collect())
    }
}

impl Baseline {
    /// Blocking.
    pub(super) fn read(backend: &dyn GpuBackend, gpus: &[u32]) -> Self {
        Self::of(&gpu::read(backend), gpus)
    }

    /// The baseline of `gpus` in a reading of the node's GPUs.
    pub fn of(samples: &[GpuSample], gpus: &[u32]) -> Self {
        let mut out = Baseline::default();
        for g in samples.iter().filter(|g| gpus.contains(&g.index)) {
            out.foreign.extend(
                g.processes
                    .iter()
                    .filter(|p| p.attempt.is_none())
                    .map(|p| p.pid),
            );
            if g.error.is_none() {
                out.used.insert(g.index, g.used_mib);
            }
            if let Some(u) = g.unattributed_mib() {
                out.unattributed.insert(g.index, u);
                let total = g.used_mib.saturating_add(g.free_mib);
                out.tolerance.insert(g.index, ghost_tolerance_mib(total));
            }
        }
        out
    }

    /// Unattributed memory on the attempt's `gpus` in `samples` beyond what there was before
    /// and the noise: the most on one GPU, with that GPU. `None` where there is none, or it
    /// cannot be told (no baseline for the GPU, or no figure now).
    pub(crate) fn ghost(&self, samples: &[GpuSample], gpus: &[u32]) -> Option<(u32, u64)> {
        samples
            .iter()
            .filter(|g| gpus.contains(&g.index))
            .filter_map(|g| {
                let (before, _) = self.limit(g.index)?;
                let excess = g.unattributed_mib()?.saturating_sub(before);
                let tolerance = *self.tolerance.get(&g.index)?;
                (excess > tolerance).then_some((g.index, excess))
            })
            .max_by_key(|&(_, excess)| excess)
    }

    /// Whether unattributed memory can be told on every one of `gpus` in `samples` (a
    /// figure before the attempt and one now).
    pub(crate) fn tells_ghost(&self, samples: &[GpuSample], gpus: &[u32]) -> bool {
        gpus.iter().all(|&g| {
            self.limit(g).is_some()
                && samples
                    .iter()
                    .find(|s| s.index == g)
                    .and_then(GpuSample::unattributed_mib)
                    .is_some()
        })
    }

    /// The most unattributed memory each of `gpus` may hold to be as before the attempt.
    pub(super) fn ghost_limits(&self, gpus: &[u32]) -> Vec<(u32, u64)> {
        gpus.iter()
            .filter_map(|&g| self.limit(g).map(|(_, limit)| (g, limit)))
            .collect()
    }

    /// GPU `gpu`'s unattributed memory before the attempt, and the most it may have after.
    fn limit(&self, gpu: u32) -> Option<(u64, u64)> {
        let before = *self.unattributed.get(&gpu)?;
        let tolerance = *self.tolerance.get(&gpu)?;
        Some((before, before.saturating_add(tolerance)))
    }
}

impl Watch {
    /// One sampling tick. Blocking.
    pub(super) fn step(&mut self) {
        let samples = gpu::read(self.backend.as_ref());
        self.observe(&samples);
        if self.meter.wants_readings() {
            let reading = self.backend.telemetry().map_err(|e| e.to_string());
            self.meter.record(
                std::time::Instant::now(),
                reading.as_deref().map_err(Clone::clone),
            );
        }
        self.log.pump(PUMP_LIMIT);
    }

    /// The run's figures and what contaminated it.
    pub(super) fn measurements(&self) -> Measurements {
        let c = self.contamination.clone();
        let mut figures = self.meter.result();
        for w in &mut figures.counters {
            w.util_pct = self.own_util.get(&w.gpu).and_then(UtilMean::mean);
        }
        Measurements {
            contamination_reason: c.as_ref().map(|c| c.reason.clone()),
            contamination_pid: c.as_ref().map(|c| c.pid),
            contamination_command: c.and_then(|c| c.command),
            ghost_mib: self.ghost.result(),
            ..figures
        }
    }

    /// One look for the colocated background's GPU memory (its readiness). Blocking.
    pub(crate) fn step_background_memory(&mut self) -> bool {
        let samples = gpu::read(self.backend.as_ref());
        self.observe(&samples);
        self.background_memory
    }

    /// Whether `pid` (one of the attempt's) is its colocated background's.
    pub(super) fn is_background(&mut self, pid: u32) -> bool {
        role_of(&mut self.roles, pid, |pid| {
            procscan::read_env_var(pid, ROLE_VAR)
        })
    }

    pub(super) fn observe(&mut self, samples: &[GpuSample]) {
        let mut seen = false;
        let mut unknown = false;
        let mut sum = 0u64;
        for p in samples.iter().flat_map(|g| &g.processes) {
            if p.attempt == Some(self.attempt) {
                if self.colocated && self.is_background(p.pid) {
                    self.background_memory |= p.used_mib > 0 || p.used_mib_unknown;
                    continue;
                }
                seen = true;
                unknown |= p.used_mib_unknown;
                sum = sum.saturating_add(p.used_mib);
            }
        }
        for g in samples
            .iter()
            .filter(|g| g.error.is_none() && self.gpus.contains(&g.index))
        {
            let mut own = g
                .processes
                .iter()
                .filter(|p| p.attempt == Some(self.attempt))
                .peekable();
            if own.peek().is_some() {
                self.own_util
                    .entry(g.index)
                    .or_default()
                    .add(own.map(|p| p.sm_util_pct));
            }
        }
        if !self.gpus.is_empty() {
            if self.baseline.tells_ghost(samples, &self.gpus) {
                self.ghost.told += 1;
                if let Some((_, excess)) = self.baseline.ghost(samples, &self.gpus) {
                    self.ghost.most = self.ghost.most.max(excess);
                }
            } else {
                self.ghost.unknown = true;
            }
        }
        if !self.contaminated
            && let Some((gpu, p)) = self.intruder(samples)
        {
            self.contaminated = true;
            self.contamination = Some(Contamination::of(gpu, p));
        }
        if seen && !unknown {
            self.peak.processes = Some(self.peak.processes.unwrap_or(0).max(sum));
            // A look that missed one of its GPUs saw less than the run held.
            if gpu::unreadable(samples, &self.gpus).is_some() {
                self.series.mark_unknown();
            } else if let Some(exec) = self.exec_at {
                let at = u64::try_from(exec.elapsed().as_millis()).unwrap_or(u64::MAX);
                self.series.record(at, sum);
            }
        }
        if unknown {
            self.series.mark_unknown();
            self.peak.unknown = true;
            if let Some(delta) = self.delta(samples) {
                self.peak.delta = Some(self.peak.delta.unwrap_or(0).max(delta));
            }
        }
    }

    /// Growth of the attempt's GPUs' used memory over the baseline; `None` when one of them
    /// cannot be read now or could not be then.
    pub(super) fn delta(&self, samples: &[GpuSample]) -> Option<u64> {
        self.gpus.iter().try_fold(0u64, |acc, g| {
            let now = samples
                .iter()
                .find(|s| s.index == *g && s.error.is_none())?;
            let before = self.baseline.used.get(g)?;
            Some(acc.saturating_add(now.used_mib.saturating_sub(*before)))
        })
    }

    /// Processes of no attempt holding memory on this attempt's GPUs (memory the driver
    /// cannot tell counts as held).
    pub(super) fn foreign_on_gpus<'a>(&self, samples: &'a [GpuSample]) -> Vec<&'a GpuProcess> {
        samples
            .iter()
            .filter(|g| self.gpus.contains(&g.index))
            .flat_map(|g| &g.processes)
            .filter(|p| holds_foreign(p))
            .collect()
    }

    /// The first process beyond the attempt on its GPUs, and its GPU: a process of no
    /// attempt; for an exclusive attempt any process not its own (another attempt's
    /// included); beside a colocated pair another attempt's process holding memory.
    pub(super) fn intruder<'a>(&self, samples: &'a [GpuSample]) -> Option<(u32, &'a GpuProcess)> {
        samples
            .iter()
            .filter(|g| self.gpus.contains(&g.index))
            .flat_map(|g| g.processes.iter().map(move |p| (g.index, p)))
            .find(|(_, p)| {
                if self.exclusive {
                    p.attempt != Some(self.attempt)
                } else {
                    // The background carries this attempt's marker: its processes are the
                    // attempt's own, never contamination; beside a colocated pair another
                    // attempt's process is.
                    holds_foreign(p) || (self.colocated && holds_other_attempt(p, self.attempt))
                }
            })
    }

    /// What keeps the GPUs from being clean: the attempt's own processes, and processes of
    /// no attempt that were not there before it (a leftover that shed its marker). `Err`
    /// when one of the attempt's GPUs cannot be read: unknown is never clean.
    pub(super) fn leftovers(&self, samples: &[GpuSample]) -> Result<Vec<(u32, u64)>, String> {
        if let Some(error) = gpu::unreadable(samples, &self.gpus) {
            return Err(error);
        }
        // Memory the attempt's processes held that nobody accounts for once they are gone
        // (a driver that has not released it yet, or never will): not clean while it stays.
        if let Some((gpu, excess)) = self.baseline.ghost(samples, &self.gpus)
            && !samples
                .iter()
                .filter(|g| g.index == gpu)
                .flat_map(|g| &g.processes)
                .any(|p| p.attempt == Some(self.attempt))
        {
            return Err(format!(
                "{excess} MiB on GPU {gpu} stayed unattributed (held by no process the driver \
                 lists) after the attempt's processes were gone"
            ));
        }
        let own = samples
            .iter()
            .flat_map(|g| &g.processes)
            .filter(|p| p.attempt == Some(self.attempt));
        let new_foreign = self
            .foreign_on_gpus(samples)
            .into_iter()
            .filter(|p| !self.baseline.foreign.contains(&p.pid));
        Ok(own
            .chain(new_foreign)
            .map(|p| (p.pid, p.used_mib))
            .collect())
    }
}

/// A process of no attempt holding memory (memory the driver cannot tell counts as held).
pub(super) fn holds_foreign(p: &GpuProcess) -> bool {
    p.attempt.is_none() && (p.used_mib > 0 || p.used_mib_unknown)
}

/// A process of another attempt than `attempt` holding memory: beyond the declared pair of a
/// colocated run.
pub(super) fn holds_other_attempt(p: &GpuProcess, attempt: AttemptId) -> bool {
    p.attempt.is_some_and(|a| a != attempt) && (p.used_mib > 0 || p.used_mib_unknown)
}

/// Reads the log as it grows and feeds the OOM and metric scanners; streaming, whatever the
/// log's size.
pub(super) struct LogFollower {
    pub(super) file: Option<File>,
    pub(super) scanner: OomScanner,
    pub(super) metrics: MetricScanner,
}

impl LogFollower {
    pub(super) fn open(path: &Path, start: u64, results: Option<&ResultsSpec>) -> Self {
        let file = File::open(path)
            .and_then(|mut f| f.seek(SeekFrom::Start(start)).map(|_| f))
            .map_err(|e| tracing::warn!(path = %path.display(), error = %e, "cannot read job log"))
            .ok();
        Self {
            file,
            scanner: OomScanner::new(),
            metrics: MetricScanner::new(results),
        }
    }

    /// Scans up to `limit` new bytes; whether it got to the log's end. Blocking.
    pub(super) fn pump(&mut self, limit: u64) -> bool {
        let Some(file) = self.file.as_mut() else {
            return true;
        };
        let mut buf = vec![0u8; 64 * 1024];
        let mut read = 0u64;
        while read < limit {
            match file.read(&mut buf) {
                Ok(0) | Err(_) => return true,
                Ok(n) => {
                    read += n as u64;
                    self.scanner.feed(&buf[..n]);
                    self.metrics.feed(&buf[..n]);
                }
            }
        }
        false
    }
}

/// Whether `pid` is the background, from its environment's role variable (`read`), and
/// remembered once its environment was read. One that could not be read (a background's
/// shell caught in `exec`, whose environment reads empty for that instant) counts as the
/// foreground's for this reading and is asked again at the next: remembered, it kept the
/// background's memory from ever being seen, and its attempt failed as not ready.
fn role_of(
    roles: &mut HashMap<u32, bool>,
    pid: u32,
    read: impl FnOnce(u32) -> Option<Option<String>>,
) -> bool {
    if let Some(&known) = roles.get(&pid) {
        return known;
    }
    match read(pid) {
        Some(role) => {
            let background = role.as_deref() == Some(ROLE_BACKGROUND);
            roles.insert(pid, background);
            background
        }
        None => false,
    }
}

/// What the watch saw over the whole run, once everything has stopped writing.
pub(super) struct Figures {
    pub(super) saw_oom: bool,
    pub(super) peak: Option<u64>,
    pub(super) peak_source: PeakSource,
    pub(super) contaminated: bool,
    pub(super) measurements: Measurements,
    pub(super) log_tail: String,
    /// What the run reported of itself; `None` when it reported nothing.
    pub(super) metrics: Option<AttemptMetrics>,
}

/// Scans the rest of the log and takes its tail (from `log_start`), with the run's peak and
/// measurements; a peak taken as a device delta says so in the log.
pub(super) async fn figures(watch: &Arc<Mutex<Watch>>, log: &Path, log_start: u64) -> Figures {
    // Most jobs leave little of their log unscanned by the end (the run's samples scan it):
    // that little is read on the runtime, as the journal is written there; a hand-off to the
    // blocking pool and back costs more. A long rest is scanned off it.
    {
        let mut w = lock(watch);
        if w.log.pump(SCAN_ON_RUNTIME) {
            return figures_of(&mut w, log, log_start);
        }
    }
    let w = watch.clone();
    let path = log.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut w = lock(&w);
        w.log.pump(u64::MAX);
        figures_of(&mut w, &path, log_start)
    })
    .await
    .unwrap_or_else(|_| Figures {
        saw_oom: false,
        peak: None,
        peak_source: PeakSource::Processes,
        contaminated: false,
        measurements: Measurements::default(),
        log_tail: String::new(),
        metrics: None,
    })
}

/// The most of a log [`figures`] scans on the runtime.
const SCAN_ON_RUNTIME: u64 = 64 * 1024;

/// [`figures`] of a log scanned to its end. Blocking.
fn figures_of(w: &mut Watch, path: &Path, log_start: u64) -> Figures {
    let (peak, peak_source) = w.peak.result();
    if peak_source == PeakSource::DeviceDelta {
        // In the log, so that `show` (the log tail) says how the peak was taken.
        if let Ok(log) = open_log(path) {
            note(&log, &peak_note(peak));
        }
    }
    w.log.metrics.finish();
    let metrics = Some(w.log.metrics.snapshot()).filter(|m| !m.is_empty());
    Figures {
        metrics,
        saw_oom: w.log.scanner.saw_oom(),
        peak,
        peak_source,
        contaminated: w.contaminated,
        measurements: w.measurements(),
        log_tail: read_tail(path, log_start),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_is_remembered_once_read_and_asked_again_when_it_could_not_be() {
        let mut roles = HashMap::new();
        let background = || Some(Some(ROLE_BACKGROUND.to_string()));
        // Caught in its exec: counted as the foreground's this time, not remembered.
        assert!(!role_of(&mut roles, 7, |_| None));
        assert!(role_of(&mut roles, 7, |_| background()));
        assert!(
            role_of(&mut roles, 7, |_| unreachable!("remembered")),
            "read once"
        );
        // Read, and without the variable: the foreground's, for good.
        assert!(!role_of(&mut roles, 8, |_| Some(None)));
        assert!(!role_of(&mut roles, 8, |_| background()));
    }
}
