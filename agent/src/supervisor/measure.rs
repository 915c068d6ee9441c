//! An attempt's energy, power, temperature, utilization and throttling over its run, from the
//! telemetry readings its supervisor takes before the job's exec, on its sampling ticks and
//! at the job's end. Pure bookkeeping: the supervisor reads, this adds up.
//!
//! A figure of a GPU is known from the first reading that carried it to the last reading of
//! the run, which must carry it (a failed reading in between is bridged); an attempt's
//! figure is known when it is known for every GPU of the attempt. Unknown is `None`, never
//! 0. Figures that begin after the job's exec (the start could not be read in time) are
//! given, and said not to cover the run (`covers_run`, `first_reading_ms`).

use std::collections::BTreeSet;
use std::time::Instant;

use chrono::{DateTime, Utc};
use headroom_shared::api::{CounterWindow, EnergySource, Measurements, TelemetrySample};

/// Clock event reasons that mean "slowed for temperature". `hw_slowdown` is the hardware's
/// own slowdown for temperature or power (NVML cannot tell which): it counts as both.
const THERMAL: &[&str] = &["sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown"];
/// Clock event reasons that mean "slowed for power".
const POWER: &[&str] = &["sw_power_cap", "hw_power_brake_slowdown", "hw_slowdown"];

/// One quantity of one GPU over the run: first and last values, maximum, and its
/// time-weighted area (trapezoid between consecutive readings that carried it).
#[derive(Clone, Debug, Default)]
struct Series {
    /// The first reading that carried it: (seconds, value).
    first: Option<(f64, f64)>,
    /// Whether the latest reading carried it.
    last_ok: bool,
    /// The latest reading that carried it: (seconds, value).
    last: Option<(f64, f64)>,
    max: Option<f64>,
    area: f64,
    span: f64,
}

impl Series {
    fn add(&mut self, t: f64, v: Option<f64>) {
        let v = v.filter(|v| v.is_finite());
        self.last_ok = v.is_some();
        let Some(v) = v else { return };
        self.first.get_or_insert((t, v));
        if let Some((t0, v0)) = self.last {
            let dt = (t - t0).max(0.0);
            self.area += (v0 + v) / 2.0 * dt;
            self.span += dt;
        }
        self.last = Some((t, v));
        self.max = Some(self.max.map_or(v, |m| m.max(v)));
    }

    /// Read at the run's last reading, and at some reading before: known from `first` on.
    fn known(&self) -> bool {
        self.first.is_some() && self.last_ok
    }

    /// Seconds of the first reading that carried it, when it is known.
    fn since(&self) -> Option<f64> {
        self.known().then_some(self.first.map(|f| f.0)).flatten()
    }

    /// The time-weighted mean; the one value when there was a single reading.
    fn mean(&self) -> Option<f64> {
        if !self.known() {
            return None;
        }
        if self.span > 0.0 {
            Some(self.area / self.span)
        } else {
            self.last.map(|(_, v)| v)
        }
    }
}

/// One GPU's readings over the run.
#[derive(Clone, Debug, Default)]
struct GpuMeter {
    power: Series,
    /// The total-energy counter, joules.
    counter: Series,
    util: Series,
    temp: Series,
    /// Whether the throttle reasons were read at the first and at the latest reading.
    throttle_first_ok: Option<bool>,
    throttle_last_ok: bool,
    /// The counter's first and latest values with the GPU's own reading times, for
    /// apportioning a shared GPU's energy across the attempts on it.
    counter_from: Option<(DateTime<Utc>, f64)>,
    counter_to: Option<(DateTime<Utc>, f64)>,
}

impl GpuMeter {
    /// Energy over the run, how it was measured, and from which second of the run on.
    fn energy(&self) -> Option<(f64, EnergySource, f64)> {
        if let (Some(since), Some((_, from)), Some((_, to))) =
            (self.counter.since(), self.counter.first, self.counter.last)
            && to >= from
        {
            // A counter that went back (the driver reloaded) is no measurement: integrate.
            return Some((to - from, EnergySource::Counter, since));
        }
        self.power
            .since()
            .map(|since| (self.power.area, EnergySource::Integrated, since))
    }

    /// The counter's window, when the counter is the energy's source.
    fn window(&self, gpu: u32) -> Option<CounterWindow> {
        let ((from, from_j), (to, to_j)) = self.counter_from.zip(self.counter_to)?;
        (self.counter.known() && to_j >= from_j).then_some(CounterWindow {
            gpu,
            from,
            to,
            from_j,
            to_j,
            // The watch, which sees the processes, adds it.
            util_pct: None,
        })
    }
}

/// The readings of an attempt's GPUs over its run.
#[derive(Debug)]
pub struct Meter {
    gpus: Vec<u32>,
    per_gpu: Vec<GpuMeter>,
    t0: Instant,
    /// Seconds of the latest reading taken into account: an older one arriving late (the
    /// start reading overtaken by a tick) is dropped.
    latest: Option<f64>,
    /// The highest total power of the attempt's GPUs at one reading.
    max_total_power: Option<f64>,
    reasons: BTreeSet<String>,
    /// Seconds at which the job was exec'd; `None` until it was.
    exec: Option<f64>,
}

impl Meter {
    pub fn new(gpus: &[u32]) -> Self {
        Self {
            gpus: gpus.to_vec(),
            per_gpu: vec![GpuMeter::default(); gpus.len()],
            t0: Instant::now(),
            latest: None,
            max_total_power: None,
            reasons: BTreeSet::new(),
            exec: None,
        }
    }

    /// The job is exec'd now (after any reading already recorded): figures that begin
    /// later do not cover its run.
    pub fn mark_exec(&mut self, at: Instant) {
        self.exec = Some(at.saturating_duration_since(self.t0).as_secs_f64());
    }

    /// Whether there is anything to read (a CPU-only attempt has no GPU).
    pub fn wants_readings(&self) -> bool {
        !self.gpus.is_empty()
    }

    /// Takes one reading of the node's GPUs, made at `at`; `Err`: the whole reading failed,
    /// every GPU of the attempt unknown at that instant.
    pub fn record(&mut self, at: Instant, reading: Result<&[TelemetrySample], String>) {
        let t = at.saturating_duration_since(self.t0).as_secs_f64();
        if self.latest.is_some_and(|l| t < l) {
            return;
        }
        self.latest = Some(t);
        let samples = reading.unwrap_or_default();
        let mut total = Some(0.0);
        for (gpu, m) in self.gpus.iter().zip(self.per_gpu.iter_mut()) {
            let s = samples.iter().find(|s| s.gpu == *gpu);
            let power = s.and_then(|s| s.power_w);
            total = total.zip(power).map(|(a, b)| a + b);
            m.power.add(t, power);
            let counter = s.and_then(|s| s.energy_j.map(|e| (s.at, e)));
            m.counter.add(t, counter.map(|c| c.1));
            if let Some(c) = counter.filter(|c| c.1.is_finite()) {
                m.counter_from.get_or_insert(c);
                m.counter_to = Some(c);
            }
            m.util
                .add(t, s.and_then(|s| s.utilization_pct).map(f64::from));
            m.temp.add(t, s.and_then(|s| s.temperature_c));
            let throttle = s.and_then(|s| s.throttle.as_ref());
            m.throttle_first_ok.get_or_insert(throttle.is_some());
            m.throttle_last_ok = throttle.is_some();
            self.reasons.extend(throttle.into_iter().flatten().cloned());
        }
        if let Some(total) = total.filter(|_| !self.gpus.is_empty()) {
            self.max_total_power = Some(self.max_total_power.map_or(total, |m| m.max(total)));
        }
    }

    /// The figures of the run so far (the last reading taken as its end).
    pub fn result(&self) -> Measurements {
        if self.gpus.is_empty() || self.latest.is_none() {
            return Measurements::default();
        }
        let all = |f: &dyn Fn(&GpuMeter) -> Option<f64>, fold: fn(f64, f64) -> f64| {
            self.per_gpu
                .iter()
                .map(f)
                .try_fold(None, |acc: Option<f64>, v| {
                    v.map(|v| Some(acc.map_or(v, |a| fold(a, v))))
                })
                .flatten()
        };
        let energy: Option<Vec<(f64, EnergySource, f64)>> =
            self.per_gpu.iter().map(GpuMeter::energy).collect();
        let (energy_j, energy_source, since) = match energy {
            Some(parts) => (
                Some(parts.iter().map(|p| p.0).sum()),
                Some(if parts.iter().all(|p| p.1 == EnergySource::Counter) {
                    EnergySource::Counter
                } else {
                    EnergySource::Integrated
                }),
                // The figure covers the run from its latest-starting GPU on.
                parts.iter().map(|p| p.2).reduce(f64::max),
            ),
            None => (None, None, None),
        };
        // How late after the exec the figures begin (0: read before it). Unknown figures
        // cover nothing; an attempt whose job never ran has no run to cover.
        let late_s = self.exec.zip(since).map(|(exec, since)| since - exec);
        let covers_run = self.exec.map(|_| late_s.is_some_and(|l| l <= 0.0));
        let power_covered = self.per_gpu.iter().all(|m| m.power.known());
        let reasons_read = self
            .per_gpu
            .iter()
            .all(|m| m.throttle_first_ok == Some(true) && m.throttle_last_ok);
        let seen = |names: &[&str]| self.reasons.iter().any(|r| names.contains(&r.as_str()));
        let flag = |names: &[&str]| {
            if seen(names) {
                Some(true)
            } else {
                reasons_read.then_some(false)
            }
        };
        let util = all(&|m| m.util.mean(), |a, b| a + b).map(|sum| sum / self.gpus.len() as f64);
        Measurements {
            energy_j,
            energy_source,
            mean_power_w: all(&|m| m.power.mean(), |a, b| a + b),
            max_power_w: self.max_total_power.filter(|_| power_covered),
            max_temp_c: all(
                &|m| m.temp.known().then_some(m.temp.max).flatten(),
                f64::max,
            ),
            start_temp_c: all(&|m| m.temp.first.map(|f| f.1), f64::max),
            mean_util_pct: util,
            throttled_thermal: flag(THERMAL),
            throttled_power: flag(POWER),
            throttle_reasons: (reasons_read || !self.reasons.is_empty())
                .then(|| self.reasons.iter().cloned().collect()),
            first_reading_ms: late_s.map(|l| (l.max(0.0) * 1000.0).round() as u64),
            covers_run,
            counters: if energy_source == Some(EnergySource::Counter) {
                self.gpus
                    .iter()
                    .zip(&self.per_gpu)
                    .filter_map(|(&gpu, m)| m.window(gpu))
                    .collect()
            } else {
                Vec::new()
            },
            ..Measurements::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sample(gpu: u32, power: f64, energy: f64) -> TelemetrySample {
        TelemetrySample {
            gpu,
            power_w: Some(power),
            energy_j: Some(energy),
            utilization_pct: Some(50),
            temperature_c: Some(40.0),
            throttle: Some(vec![]),
            ..TelemetrySample::default()
        }
    }

    fn at(m: &Meter, s: f64) -> Instant {
        m.t0 + Duration::from_secs_f64(s)
    }

    #[test]
    fn the_counter_delta_is_the_energy_summed_over_gpus() {
        let mut m = Meter::new(&[0, 2]);
        // GPU 1 is not the attempt's: its figures are not counted.
        let r0 = [
            sample(0, 100.0, 1000.0),
            sample(1, 300.0, 0.0),
            sample(2, 50.0, 10.0),
        ];
        m.record(at(&m, 0.0), Ok(&r0));
        let r1 = [sample(0, 200.0, 1150.0), sample(2, 50.0, 60.0)];
        m.record(at(&m, 1.0), Ok(&r1));
        let out = m.result();
        assert_eq!(out.energy_j, Some(150.0 + 50.0));
        assert_eq!(out.energy_source, Some(EnergySource::Counter));
        // Trapezoid mean of GPU 0 (150 W) plus GPU 2 (50 W).
        assert_eq!(out.mean_power_w, Some(200.0));
        assert_eq!(out.max_power_w, Some(250.0));
        assert_eq!(out.mean_util_pct, Some(50.0));
        assert_eq!(
            (out.throttled_thermal, out.throttled_power),
            (Some(false), Some(false))
        );
    }

    #[test]
    fn without_the_counter_power_is_integrated_and_unknown_is_none() {
        let mut m = Meter::new(&[0]);
        for (t, p) in [(0.0, 100.0), (1.0, 200.0), (3.0, 200.0)] {
            let mut s = sample(0, p, 0.0);
            s.energy_j = None;
            m.record(at(&m, t), Ok(&[s]));
        }
        let out = m.result();
        assert_eq!(out.energy_j, Some(150.0 + 400.0));
        assert_eq!(out.energy_source, Some(EnergySource::Integrated));

        // A counter that went back (driver reloaded) is integrated too.
        let mut m = Meter::new(&[0]);
        m.record(at(&m, 0.0), Ok(&[sample(0, 100.0, 5000.0)]));
        m.record(at(&m, 2.0), Ok(&[sample(0, 100.0, 10.0)]));
        assert_eq!(m.result().energy_source, Some(EnergySource::Integrated));
        assert_eq!(m.result().energy_j, Some(200.0));

        // The end reading failed: unknown, not the energy up to the last good reading.
        let mut m = Meter::new(&[0]);
        m.record(at(&m, 0.0), Ok(&[sample(0, 100.0, 0.0)]));
        m.record(at(&m, 1.0), Ok(&[sample(0, 100.0, 100.0)]));
        m.record(at(&m, 2.0), Err("NVML: GPU is lost".into()));
        let out = m.result();
        assert_eq!(
            (out.energy_j, out.mean_power_w, out.max_power_w),
            (None, None, None)
        );
        assert_eq!(
            out.throttled_thermal, None,
            "unknown throttling is not clean"
        );

        // A failed reading in between is bridged.
        let mut m = Meter::new(&[0]);
        m.record(at(&m, 0.0), Ok(&[sample(0, 100.0, 0.0)]));
        m.record(at(&m, 1.0), Ok(&[]));
        m.record(at(&m, 2.0), Ok(&[sample(0, 100.0, 200.0)]));
        assert_eq!(m.result().energy_j, Some(200.0));
        assert_eq!(m.result().energy_source, Some(EnergySource::Counter));

        // Nothing read at all, or no GPU: nothing known.
        assert_eq!(Meter::new(&[0]).result(), Measurements::default());
        assert_eq!(Meter::new(&[]).result(), Measurements::default());
    }

    #[test]
    fn figures_read_before_the_exec_cover_the_run_and_late_ones_say_how_late() {
        // Read before the exec: covered, 0 ms late, the counter's window kept.
        let mut m = Meter::new(&[0]);
        m.record(at(&m, 0.0), Ok(&[sample(0, 100.0, 1000.0)]));
        m.mark_exec(at(&m, 0.01));
        m.record(at(&m, 2.0), Ok(&[sample(0, 100.0, 1200.0)]));
        let out = m.result();
        assert_eq!(
            (out.covers_run, out.first_reading_ms),
            (Some(true), Some(0))
        );
        assert_eq!(out.energy_j, Some(200.0));
        assert_eq!(out.counters.len(), 1);
        assert_eq!(
            (out.counters[0].from_j, out.counters[0].to_j),
            (1000.0, 1200.0)
        );

        // The start could not be read: the figures begin at the first reading that could,
        // 1.5 s into the run, and say so.
        let mut m = Meter::new(&[0]);
        m.record(at(&m, 0.0), Err("NVML: not opened yet".into()));
        m.mark_exec(at(&m, 0.5));
        m.record(at(&m, 2.0), Ok(&[sample(0, 100.0, 5000.0)]));
        m.record(at(&m, 3.0), Ok(&[sample(0, 100.0, 5100.0)]));
        let out = m.result();
        assert_eq!(out.covers_run, Some(false));
        assert_eq!(out.first_reading_ms, Some(1500));
        assert_eq!(out.energy_j, Some(100.0));

        // Nothing could be read: nothing covered, nothing known.
        let mut m = Meter::new(&[0]);
        m.mark_exec(at(&m, 0.0));
        m.record(at(&m, 1.0), Err("GPU is lost".into()));
        let out = m.result();
        assert_eq!((out.covers_run, out.energy_j), (Some(false), None));
        assert!(out.counters.is_empty());

        // Without the counter (integrated), no window to apportion from.
        let mut m = Meter::new(&[0]);
        let mut s = sample(0, 100.0, 0.0);
        s.energy_j = None;
        m.record(at(&m, 0.0), Ok(&[s.clone()]));
        m.mark_exec(at(&m, 0.0));
        m.record(at(&m, 1.0), Ok(&[s]));
        let out = m.result();
        assert_eq!(out.covers_run, Some(true));
        assert!(out.counters.is_empty());
    }

    #[test]
    fn throttle_reasons_set_their_flags() {
        let mut m = Meter::new(&[0]);
        m.record(at(&m, 0.0), Ok(&[sample(0, 100.0, 0.0)]));
        let mut s = sample(0, 100.0, 10.0);
        s.throttle = Some(vec!["sw_power_cap".into()]);
        m.record(at(&m, 1.0), Ok(&[s]));
        m.record(at(&m, 2.0), Ok(&[sample(0, 100.0, 20.0)]));
        let out = m.result();
        assert_eq!(
            (out.throttled_thermal, out.throttled_power),
            (Some(false), Some(true))
        );
        assert_eq!(out.throttle_reasons, Some(vec!["sw_power_cap".to_string()]));

        let mut m = Meter::new(&[0]);
        let mut s = sample(0, 100.0, 0.0);
        s.throttle = Some(vec!["hw_thermal_slowdown".into()]);
        m.record(at(&m, 0.0), Ok(&[s]));
        assert_eq!(m.result().throttled_thermal, Some(true));
        assert_eq!(m.result().throttled_power, Some(false));
    }

    #[test]
    fn temperatures_start_and_peak_and_late_readings_are_dropped() {
        let mut m = Meter::new(&[0]);
        let mut s = sample(0, 100.0, 0.0);
        s.temperature_c = Some(41.0);
        m.record(at(&m, 1.0), Ok(&[s.clone()]));
        // The start reading, overtaken by a tick: dropped, not taken as a later reading.
        s.temperature_c = Some(90.0);
        m.record(at(&m, 0.5), Ok(&[s.clone()]));
        s.temperature_c = Some(63.5);
        s.energy_j = Some(100.0);
        m.record(at(&m, 2.0), Ok(&[s]));
        let out = m.result();
        assert_eq!(out.start_temp_c, Some(41.0));
        assert_eq!(out.max_temp_c, Some(63.5));
        assert_eq!(out.energy_j, Some(100.0));
    }
}
