//! Reads what a run reports of itself from its log, fed in chunks as the log grows (the same
//! reads the OOM scan makes): the spec's `metrics` patterns and `HEADROOM_METRIC {json}` lines,
//! into bounded series, final values and the rung values `early_stop` asks for.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Instant;

use headroom_shared::results::{
    self, AttemptMetrics, EarlyStop, MAX_LINE, MAX_METRICS, MAX_POINTS, MAX_RUNGS, METRIC_LINE,
    Point, ResultsSpec, RungValue, Take,
};
use memchr::{memchr, memmem};
use regex::{Regex, RegexSet};

/// headroom's own lines in the log (`[headroom] ...`): never read as the job's metrics.
const OWN_LINE: &[u8] = b"[headroom] ";

/// Points per metric a running attempt's reports carry (evenly spread, the latest kept);
/// its whole series goes with its end.
pub const LIVE_POINTS: usize = 64;

/// One metric of the spec read by a pattern.
#[derive(Debug)]
struct Pattern {
    name: String,
    regex: Regex,
    scale: f64,
}

/// A metric's values so far: its final value over all of them, and a bounded series.
#[derive(Debug, Default)]
struct Track {
    take: Take,
    last: Option<f64>,
    count: u64,
    /// Every `stride`-th value is kept; the stride doubles each time the series is halved.
    stride: u64,
    points: Vec<Point>,
    /// The latest point, when the stride skipped it.
    latest: Option<Point>,
}

impl Track {
    fn new(take: Take) -> Self {
        Self {
            take,
            stride: 1,
            ..Self::default()
        }
    }

    fn push(&mut self, p: Point) {
        self.last = Some(self.take.fold(self.last, p.value));
        self.count += 1;
        if !(self.count - 1).is_multiple_of(self.stride) {
            self.latest = Some(p);
            return;
        }
        self.latest = None;
        self.points.push(p);
        if self.points.len() > MAX_POINTS {
            // Every other point goes, the first stays: what is kept stays evenly spread.
            let mut i = 0;
            self.points.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            self.stride *= 2;
        }
    }

    fn series(&self) -> Vec<Point> {
        let mut s = self.points.clone();
        s.extend(self.latest);
        s
    }
}

/// Reads a job's log for metrics; streaming, whatever the log's size.
#[derive(Debug)]
pub struct MetricScanner {
    /// The line not yet ended, up to [`MAX_LINE`] bytes.
    partial: Vec<u8>,
    /// The line being read is longer than [`MAX_LINE`]: its rest is skipped.
    overlong: bool,
    patterns: Vec<Pattern>,
    /// Every pattern at once (the metrics', then the step's), so that a line no pattern
    /// matches costs one pass whatever their number.
    any: Option<RegexSet>,
    step_pattern: Option<Regex>,
    /// The step the last `metric_step` match gave.
    step: Option<u64>,
    takes: BTreeMap<String, Take>,
    tracks: BTreeMap<String, Track>,
    early_stop: Option<EarlyStop>,
    rungs: Vec<RungValue>,
    ignored: u64,
    /// The series' times count from here: the job's exec.
    started: Instant,
    changed: bool,
    /// A rung was reached since the last report: `early_stop` decides now.
    rung_reached: bool,
}

impl MetricScanner {
    /// A scanner for `spec`'s metrics (protocol lines are read whatever the spec). Patterns
    /// were checked at submit; one that does not compile here is left out and said.
    pub fn new(spec: Option<&ResultsSpec>) -> Self {
        let spec = spec.cloned().unwrap_or_default();
        let mut patterns = Vec::new();
        for (name, m) in &spec.metrics {
            if let Some(p) = &m.pattern {
                match results::compile(p) {
                    Ok(regex) => patterns.push(Pattern {
                        name: name.clone(),
                        regex,
                        scale: m.scale.unwrap_or(1.0),
                    }),
                    Err(e) => tracing::warn!(metric = %name, "pattern left out: {e}"),
                }
            }
        }
        let step_pattern = spec
            .metric_step
            .as_deref()
            .and_then(|p| results::compile(p).ok());
        let sources = patterns
            .iter()
            .map(|p| p.regex.as_str())
            .chain(step_pattern.iter().map(Regex::as_str));
        let any = RegexSet::new(sources).ok().filter(|set| !set.is_empty());
        Self {
            partial: Vec::new(),
            overlong: false,
            patterns,
            any,
            step_pattern,
            step: None,
            takes: spec
                .metrics
                .iter()
                .map(|(n, m)| (n.clone(), m.take))
                .collect(),
            tracks: BTreeMap::new(),
            early_stop: spec.early_stop,
            rungs: Vec::new(),
            ignored: 0,
            started: Instant::now(),
            changed: false,
            rung_reached: false,
        }
    }

    /// The job starts now: its series' times count from here.
    pub fn started(&mut self) {
        self.started = Instant::now();
    }

    /// Reads the next piece of the log.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while let Some(nl) = memchr(b'\n', rest) {
            let (line, after) = rest.split_at(nl);
            self.append(line);
            self.end_line();
            rest = &after[1..];
        }
        self.append(rest);
    }

    /// The log ended: its last line, unended, counts.
    pub fn finish(&mut self) {
        if !self.partial.is_empty() || self.overlong {
            self.end_line();
        }
    }

    /// Whether anything changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// Whether a rung was reached since the last call (its decision should not wait).
    pub fn take_rung_reached(&mut self) -> bool {
        std::mem::take(&mut self.rung_reached)
    }

    /// What a running attempt reports: finals and rungs whole, each series thinned to
    /// [`LIVE_POINTS`] (evenly spread, first and latest kept).
    pub fn live_snapshot(&self) -> AttemptMetrics {
        let mut m = self.snapshot();
        for points in m.series.values_mut() {
            *points = results::thin(points, LIVE_POINTS);
        }
        m
    }

    /// What was collected so far.
    pub fn snapshot(&self) -> AttemptMetrics {
        AttemptMetrics {
            finals: self
                .tracks
                .iter()
                .filter_map(|(n, t)| t.last.map(|v| (n.clone(), v)))
                .collect(),
            series: self
                .tracks
                .iter()
                .map(|(n, t)| (n.clone(), t.series()))
                .collect(),
            ignored: self.ignored,
            rungs: self.rungs.clone(),
        }
    }

    fn append(&mut self, bytes: &[u8]) {
        if self.overlong {
            return;
        }
        let room = MAX_LINE - self.partial.len();
        if bytes.len() > room {
            self.partial.extend_from_slice(&bytes[..room]);
            self.overlong = true;
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    fn end_line(&mut self) {
        let line = std::mem::take(&mut self.partial);
        let overlong = std::mem::take(&mut self.overlong);
        self.line(&line, overlong);
        // The buffer is reused: a job printing millions of lines allocates once.
        self.partial = line;
        self.partial.clear();
    }

    fn line(&mut self, line: &[u8], overlong: bool) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.starts_with(OWN_LINE) {
            return;
        }
        if let Some(at) = memmem::find(line, METRIC_LINE.as_bytes()) {
            let json = &line[at + METRIC_LINE.len()..];
            if overlong {
                self.ignored += 1;
                self.changed = true;
            } else {
                self.protocol(json);
            }
            return;
        }
        let Some(any) = &self.any else {
            return;
        };
        let text: Cow<'_, str> = String::from_utf8_lossy(line);
        let matched = any.matches(&text);
        if !matched.matched_any() {
            return;
        }
        if let Some(re) = &self.step_pattern
            && matched.matched(self.patterns.len())
            && let Some(step) = first_group(re, &text).and_then(|s| s.trim().parse::<u64>().ok())
        {
            self.step = Some(step);
        }
        for i in 0..self.patterns.len() {
            if !matched.matched(i) {
                continue;
            }
            let p = &self.patterns[i];
            let Some(found) = first_group(&p.regex, &text) else {
                continue;
            };
            let (name, scale) = (p.name.clone(), p.scale);
            match found.trim().parse::<f64>().map(|v| scaled(v, scale)) {
                Ok(v) if v.is_finite() => self.value(&name, None, v),
                _ => {
                    self.ignored += 1;
                    self.changed = true;
                }
            }
        }
    }

    /// A `HEADROOM_METRIC` line's JSON: `{"step": 3, "val_acc": 0.91}`.
    fn protocol(&mut self, json: &[u8]) {
        let parsed: Result<serde_json::Map<String, serde_json::Value>, _> =
            serde_json::from_slice(json);
        let Ok(map) = parsed else {
            self.ignored += 1;
            self.changed = true;
            return;
        };
        let step = match map.get("step") {
            None => None,
            Some(s) => match s.as_u64() {
                Some(s) => Some(s),
                None => {
                    self.ignored += 1;
                    self.changed = true;
                    return;
                }
            },
        };
        for (name, v) in &map {
            if name == "step" {
                continue;
            }
            match v.as_f64().filter(|v| v.is_finite()) {
                Some(v) if results::validate_metric_name(name).is_ok() => self.value(name, step, v),
                _ => {
                    self.ignored += 1;
                    self.changed = true;
                }
            }
        }
        if map.keys().all(|k| k == "step") {
            // Nothing to record (`{}`, a step alone): said, as any line that was no metric.
            self.ignored += 1;
            self.changed = true;
        }
    }

    fn value(&mut self, name: &str, step: Option<u64>, value: f64) {
        self.changed = true;
        if !self.tracks.contains_key(name) && self.tracks.len() >= MAX_METRICS {
            self.ignored += 1;
            return;
        }
        let take = self.takes.get(name).copied().unwrap_or_default();
        let track = self
            .tracks
            .entry(name.to_string())
            .or_insert_with(|| Track::new(take));
        let step = step.or(self.step).unwrap_or(track.count + 1);
        let t = self.started.elapsed().as_secs_f64();
        track.push(Point { step, t, value });
        if let Some(es) = &self.early_stop
            && es.metric == name
        {
            // As Optuna's pruner at each report: every rung this step reaches gets its value.
            while let Some(rung_step) = u32::try_from(self.rungs.len())
                .ok()
                .filter(|&r| r < MAX_RUNGS)
                .and_then(|r| es.rung_step(r))
                && step >= rung_step
            {
                let rung = self.rungs.len() as u32;
                self.rungs.push(RungValue { rung, step, value });
                self.rung_reached = true;
            }
        }
    }
}

/// `v * scale`, as a person reads it: a scale of `0.01` divides by 100 (91.2 % reads 0.912,
/// not 0.9120000000000001).
fn scaled(v: f64, scale: f64) -> f64 {
    let inverse = 1.0 / scale;
    if inverse.abs() >= 1.0 && (inverse - inverse.round()).abs() < 1e-9 {
        v / inverse.round()
    } else {
        v * scale
    }
}

/// The first capture group's text (the whole match without groups).
fn first_group<'t>(re: &Regex, text: &'t str) -> Option<&'t str> {
    let caps = re.captures(text)?;
    caps.get(1).or_else(|| caps.get(0)).map(|m| m.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_shared::results::{MetricSpec, Mode, Rule};

    fn seeds_spec() -> ResultsSpec {
        let mut r = ResultsSpec::default();
        r.metrics.insert(
            "val_acc".into(),
            MetricSpec {
                pattern: Some(r"Test Accuracy: ([0-9.]+)%".into()),
                take: Take::Max,
                scale: Some(0.01),
            },
        );
        r.metrics.insert(
            "never".into(),
            MetricSpec {
                pattern: Some("no such line ([0-9]+)".into()),
                take: Take::Last,
                scale: None,
            },
        );
        r.metric_step = Some(r"Epoch ([0-9]+)".into());
        r
    }

    #[test]
    fn the_seeds_lines_give_each_epoch_s_accuracy_and_the_best_as_final() {
        let mut s = MetricScanner::new(Some(&seeds_spec()));
        // Split mid-line, as reads of a growing log are.
        let log = "Epoch 1 loss 0.9 Test Accuracy: 80.5%\nEpoch 2 loss 0.5 Test Ac\
                   curacy: 91.2%\nEpoch 3 loss 0.6 Test Accuracy: 89.0%";
        let (a, b) = log.split_at(50);
        s.feed(a.as_bytes());
        s.feed(b.as_bytes());
        s.finish();
        let m = s.snapshot();
        assert_eq!(m.finals.get("val_acc").copied(), Some(0.912));
        let firsts: Vec<f64> = m.series["val_acc"].iter().map(|p| p.value).collect();
        assert_eq!(
            firsts,
            [0.805, 0.912, 0.89],
            "a percentage reads as written, over 100"
        );
        let steps: Vec<_> = m.series["val_acc"].iter().map(|p| p.step).collect();
        assert_eq!(steps, [1, 2, 3]);
        assert!(
            !m.finals.contains_key("never"),
            "no match is no value, not 0"
        );
        assert_eq!(m.ignored, 0);
    }

    #[test]
    fn protocol_lines_are_read_and_bad_ones_counted_never_fatal() {
        let mut s = MetricScanner::new(None);
        s.feed(
            b"HEADROOM_METRIC {\"step\": 10, \"loss\": 0.5, \"acc\": 0.7}\n\
              [rank0] HEADROOM_METRIC {\"loss\": 0.4}\n\
              HEADROOM_METRIC {not json\n\
              HEADROOM_METRIC {\"step\": -1, \"loss\": 1}\n\
              HEADROOM_METRIC {\"loss\": \"high\", \"9bad\": 1}\n\
              HEADROOM_METRIC {}\n\
              [headroom] HEADROOM_METRIC {\"loss\": 9}\n\
              plain output 12\n",
        );
        let m = s.snapshot();
        assert_eq!(m.finals["loss"], 0.4);
        assert_eq!(m.finals["acc"], 0.7);
        assert_eq!(
            m.series["loss"].iter().map(|p| p.step).collect::<Vec<_>>(),
            [10, 2],
            "without a step, the count of the metric's values"
        );
        assert_eq!(
            m.ignored, 5,
            "`{{}}` too; headroom's own line is no job's metric"
        );
    }

    #[test]
    fn a_live_report_carries_a_thinned_series_with_its_first_and_latest_points() {
        let mut s = MetricScanner::new(None);
        for i in 1..=300 {
            s.feed(format!("HEADROOM_METRIC {{\"step\": {i}, \"x\": {i}}}\n").as_bytes());
        }
        let live = s.live_snapshot();
        let steps: Vec<u64> = live.series["x"].iter().map(|p| p.step).collect();
        assert_eq!(steps.len(), LIVE_POINTS);
        assert_eq!((steps[0], steps[LIVE_POINTS - 1]), (1, 300));
        assert!(steps.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(live.finals["x"], 300.0);
        assert_eq!(
            s.snapshot().series["x"].len(),
            300,
            "the end's report has them all"
        );
    }

    #[test]
    fn headroom_s_own_notes_are_never_read_by_a_pattern() {
        let mut spec = ResultsSpec::default();
        spec.metrics.insert(
            "acc".into(),
            MetricSpec {
                pattern: Some("acc ([0-9.]+)".into()),
                take: Take::Last,
                scale: None,
            },
        );
        let mut s = MetricScanner::new(Some(&spec));
        s.feed(b"epoch 1 acc 0.5\n[headroom] early_stop: acc 0.9 was the cutoff\n");
        assert_eq!(s.snapshot().finals["acc"], 0.5);
    }

    #[test]
    fn a_million_values_keep_a_bounded_series_with_the_true_final_and_latest_point() {
        let mut spec = ResultsSpec::default();
        spec.metrics.insert(
            "loss".into(),
            MetricSpec {
                pattern: None,
                take: Take::Min,
                scale: None,
            },
        );
        let mut s = MetricScanner::new(Some(&spec));
        let mut chunk = String::new();
        for i in 1..=1_000_000u64 {
            let loss = if i == 777_777 { -1.0 } else { 1.0 / i as f64 };
            chunk.push_str(&format!(
                "HEADROOM_METRIC {{\"step\": {i}, \"loss\": {loss}}}\n"
            ));
            if chunk.len() > 1 << 16 {
                s.feed(chunk.as_bytes());
                chunk.clear();
            }
        }
        s.feed(chunk.as_bytes());
        let m = s.snapshot();
        let series = &m.series["loss"];
        assert!(series.len() <= MAX_POINTS + 1, "{}", series.len());
        assert!(series.len() > MAX_POINTS / 2);
        assert_eq!(series[0].step, 1);
        assert_eq!(series.last().map(|p| p.step), Some(1_000_000));
        assert!(series.windows(2).all(|w| w[0].step < w[1].step));
        assert_eq!(
            m.finals["loss"], -1.0,
            "taken over every value, kept or not"
        );
    }

    #[test]
    fn an_overlong_line_is_cut_not_buffered_whole() {
        let mut s = MetricScanner::new(None);
        let long = format!(
            "HEADROOM_METRIC {{\"x\": \"{}\"}}\n",
            "y".repeat(10 * MAX_LINE)
        );
        s.feed(long.as_bytes());
        s.feed(b"HEADROOM_METRIC {\"x\": 1}\n");
        let m = s.snapshot();
        assert_eq!(m.ignored, 1);
        assert_eq!(m.finals["x"], 1.0);
        assert!(s.partial.capacity() <= 2 * MAX_LINE);
    }

    #[test]
    fn names_past_the_bound_are_counted_not_kept() {
        let mut s = MetricScanner::new(None);
        for i in 0..MAX_METRICS + 3 {
            s.feed(format!("HEADROOM_METRIC {{\"m{i}\": 1}}\n").as_bytes());
        }
        let m = s.snapshot();
        assert_eq!(m.finals.len(), MAX_METRICS);
        assert_eq!(m.ignored, 3);
    }

    #[test]
    fn rungs_take_the_value_at_the_first_step_reaching_them() {
        let mut spec = ResultsSpec {
            early_stop: Some(EarlyStop {
                metric: "acc".into(),
                mode: Mode::Max,
                rule: Rule::Asha,
                grace_steps: 1,
                reduction_factor: 2,
                min_early_stopping_rate: 0,
                bootstrap_count: 0,
            }),
            ..ResultsSpec::default()
        };
        spec.metrics.clear();
        let mut s = MetricScanner::new(Some(&spec));
        for (step, v) in [(1, 0.1), (3, 0.3), (4, 0.4), (9, 0.9)] {
            s.feed(format!("HEADROOM_METRIC {{\"step\": {step}, \"acc\": {v}}}\n").as_bytes());
        }
        let rungs: Vec<_> = s
            .snapshot()
            .rungs
            .iter()
            .map(|r| (r.rung, r.step, r.value))
            .collect();
        // Rung steps 1, 2, 4, 8: step 3 reaches rung 1, step 9 rung 3.
        assert_eq!(rungs, [(0, 1, 0.1), (1, 3, 0.3), (2, 4, 0.4), (3, 9, 0.9)]);
    }
}
