//! What a run achieved: the spec's `metrics`, `metric_step`, `early_stop` and `tracking`, the
//! bounds of what an attempt's metrics may hold, and the rungs of successive halving.
//!
//! Metrics come from the job's output two ways: patterns over its lines (an unmodified
//! script), and `HEADROOM_METRIC {json}` lines (a script that reports, e.g. through the
//! Python client's `report()`). Each attempt keeps, per metric, a bounded series and a final
//! value taken over every value seen.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::field::SpecError;

/// The start of a reporting line: `HEADROOM_METRIC {"step": 3, "val_acc": 0.91}`.
pub const METRIC_LINE: &str = "HEADROOM_METRIC";
/// Distinct metric names an attempt keeps; values of further names are ignored and counted.
pub const MAX_METRICS: usize = 32;
/// Points kept per metric and attempt. Past it the series is halved (every other point
/// dropped, the first kept) and from then on only every 2nd (4th, ...) value is recorded; the
/// latest value is always kept, and the final value is taken over every value seen.
pub const MAX_POINTS: usize = 512;
/// The longest line read for metrics (bytes); the rest of a longer line is not looked at.
pub const MAX_LINE: usize = 4096;
/// The longest pattern (bytes) and metric name.
pub const MAX_PATTERN: usize = 512;
pub const MAX_NAME: usize = 64;
/// The most rungs an attempt climbs: rung steps grow geometrically, so this is never the
/// bound in practice.
pub const MAX_RUNGS: u32 = 32;

/// How a metric's final value is taken from its values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Take {
    #[default]
    Last,
    Max,
    Min,
}

impl Take {
    /// `current` with `value` seen after it.
    pub fn fold(self, current: Option<f64>, value: f64) -> f64 {
        match (self, current) {
            (_, None) | (Take::Last, _) => value,
            (Take::Max, Some(c)) => c.max(value),
            (Take::Min, Some(c)) => c.min(value),
        }
    }
}

/// One metric of `metrics:`: `val_acc: {pattern: 'Test Accuracy: ([0-9.]+)%', take: max,
/// scale: 0.01}`. Without `pattern` the metric is one the job reports by `HEADROOM_METRIC`
/// lines, and the entry says how its final value is taken.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MetricSpec {
    /// A regular expression (Rust `regex` syntax) over each line of the job's output; its
    /// first capture group (or the whole match) is the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    #[serde(default)]
    pub take: Take,
    /// Multiplies each value (`0.01` turns a percentage into a fraction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<f64>,
}

/// `max`: higher is better; `min`: lower is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Max,
    Min,
}

/// The early-stopping rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// Asynchronous successive halving (ASHA), as Optuna's `SuccessiveHalvingPruner`.
    #[default]
    Asha,
}

/// `early_stop: {metric: val_acc, mode: max, rule: asha, grace_steps: 1, reduction_factor:
/// 4}`: at each rung (step `grace_steps * reduction_factor^(min_early_stopping_rate + k)`)
/// an attempt goes on only if its value is in the top `1/reduction_factor` of the values the
/// experiment's attempts had at that rung; otherwise it ends `pruned`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EarlyStop {
    pub metric: String,
    pub mode: Mode,
    #[serde(default)]
    pub rule: Rule,
    /// The first rung's step (Optuna's `min_resource`).
    #[serde(default = "one")]
    pub grace_steps: u64,
    #[serde(default = "four")]
    pub reduction_factor: u64,
    #[serde(default)]
    pub min_early_stopping_rate: u32,
    /// An attempt is stopped at a rung until more than this many attempts reached it.
    #[serde(default)]
    pub bootstrap_count: u32,
}

fn one() -> u64 {
    1
}

fn four() -> u64 {
    4
}

impl EarlyStop {
    /// The step of rung `rung` (`None` past `u64`).
    pub fn rung_step(&self, rung: u32) -> Option<u64> {
        let exp = self.min_early_stopping_rate.checked_add(rung)?;
        self.reduction_factor
            .checked_pow(exp)?
            .checked_mul(self.grace_steps)
    }
}

/// `tracking: {mlflow: URI}`: each attempt becomes a run of that MLflow tracking server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Tracking {
    /// The tracking server's base URL (`http://mlflow.lab:5000`).
    pub mlflow: String,
}

/// An experiment's results settings, as stored with it and given with each lease.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResultsSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, MetricSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_stop: Option<EarlyStop>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<Tracking>,
}

impl ResultsSpec {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// How `name`'s final value is taken: as declared, else its last value.
    pub fn take(&self, name: &str) -> Take {
        self.metrics.get(name).map(|m| m.take).unwrap_or_default()
    }

    /// Checks the fields; errors name them.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.metrics.len() > MAX_METRICS {
            return Err(SpecError::new(
                "metrics",
                format!("at most {MAX_METRICS} metrics"),
            ));
        }
        for (name, m) in &self.metrics {
            let field = format!("metrics.{name}");
            validate_metric_name(name).map_err(|e| SpecError::new(&field, e))?;
            if let Some(p) = &m.pattern {
                validate_pattern(p).map_err(|e| SpecError::new(format!("{field}.pattern"), e))?;
            }
            if let Some(s) = m.scale
                && (!s.is_finite() || s == 0.0)
            {
                return Err(SpecError::new(
                    format!("{field}.scale"),
                    "must be a finite number other than 0",
                ));
            }
        }
        if let Some(p) = &self.metric_step {
            validate_pattern(p).map_err(|e| SpecError::new("metric_step", e))?;
        }
        if let Some(es) = &self.early_stop {
            validate_metric_name(&es.metric).map_err(|e| SpecError::new("early_stop.metric", e))?;
            if es.grace_steps == 0 {
                return Err(SpecError::new(
                    "early_stop.grace_steps",
                    "must be at least 1",
                ));
            }
            if !(2..=100).contains(&es.reduction_factor) {
                return Err(SpecError::new(
                    "early_stop.reduction_factor",
                    "must be from 2 to 100",
                ));
            }
            if es.rung_step(0).is_none() {
                return Err(SpecError::new(
                    "early_stop.min_early_stopping_rate",
                    "puts the first rung past any step",
                ));
            }
        }
        if let Some(t) = &self.tracking {
            let rest = t
                .mlflow
                .strip_prefix("http://")
                .or_else(|| t.mlflow.strip_prefix("https://"));
            let ok = rest.is_some_and(|r| !r.is_empty())
                && t.mlflow.len() <= 2048
                && !t
                    .mlflow
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control());
            if !ok {
                return Err(SpecError::new(
                    "tracking.mlflow",
                    "must be the tracking server's http:// or https:// URL",
                ));
            }
            // A URL is shown to every user and in every log: no password in it.
            let host = rest
                .unwrap_or_default()
                .split('/')
                .next()
                .unwrap_or_default();
            if host.contains('@') {
                return Err(SpecError::new(
                    "tracking.mlflow",
                    "holds a user or password: headroom sends the tracking server no credential",
                ));
            }
        }
        Ok(())
    }
}

/// Metric names: letters, digits, `_`, `.`, `/`, `-`, starting with a letter or `_`, at most
/// 64 bytes (W&B-style `val/acc` included).
pub fn validate_metric_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-'))
        && name.len() <= MAX_NAME;
    if ok {
        Ok(())
    } else {
        Err(format!(
            "metric names are letters, digits, `_`, `.`, `/` and `-`, starting with a letter \
             or `_`, at most {MAX_NAME} bytes"
        ))
    }
}

fn validate_pattern(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > MAX_PATTERN {
        return Err(format!("must be 1 to {MAX_PATTERN} bytes"));
    }
    compile(p).map(|_| ())
}

/// The pattern compiled as the supervisor uses it; a refused one says why.
pub fn compile(p: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(p)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("not a valid regular expression: {e}"))
}

/// A point of a metric's series.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Point {
    pub step: u64,
    /// Seconds since the job started.
    pub t: f64,
    pub value: f64,
}

/// A value an attempt had at a rung of `early_stop` (the first value at or past the rung's
/// step).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RungValue {
    pub rung: u32,
    pub step: u64,
    pub value: f64,
}

/// An attempt's metrics, as its supervisor collected them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptMetrics {
    /// Each metric's final value (`take`); a metric never seen is absent.
    #[serde(default)]
    pub finals: BTreeMap<String, f64>,
    /// Each metric's points, oldest first, bounded as [`MAX_POINTS`] says.
    #[serde(default)]
    pub series: BTreeMap<String, Vec<Point>>,
    /// Metric lines ignored: malformed `HEADROOM_METRIC` lines, values that are no finite
    /// number, names past [`MAX_METRICS`].
    #[serde(default)]
    pub ignored: u64,
    /// The `early_stop` metric's value at each rung reached, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rungs: Vec<RungValue>,
}

impl AttemptMetrics {
    pub fn is_empty(&self) -> bool {
        self.finals.is_empty() && self.series.is_empty() && self.ignored == 0
    }

    /// Checks a report's bounds (a supervisor's report is read as input, as any other).
    pub fn check(&self) -> Result<(), String> {
        if self.series.len() > MAX_METRICS || self.finals.len() > MAX_METRICS {
            return Err(format!("more than {MAX_METRICS} metrics"));
        }
        for (name, points) in &self.series {
            validate_metric_name(name)?;
            if points.len() > MAX_POINTS + 1 {
                return Err(format!(
                    "metric {name}: more than {} points",
                    MAX_POINTS + 1
                ));
            }
        }
        for name in self.finals.keys() {
            validate_metric_name(name)?;
        }
        if self.rungs.len() > MAX_RUNGS as usize {
            return Err(format!("more than {MAX_RUNGS} rungs"));
        }
        Ok(())
    }
}

/// What the coordinator decided for an attempt at a rung.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RungDecision {
    pub rung: u32,
    pub step: u64,
    pub value: f64,
    /// The value it had to reach (at least, `max`; at most, `min`); `None` when stopped
    /// before enough attempts reached the rung (`bootstrap_count`).
    pub cutoff: Option<f64>,
    /// Attempts whose values at this rung it was compared with, its own included.
    pub competitors: u32,
    pub pruned: bool,
}

/// At most `n` of `points`: evenly spread, the first and the latest kept.
pub fn thin(points: &[Point], n: usize) -> Vec<Point> {
    if points.len() <= n || n < 2 {
        return points.to_vec();
    }
    let last = points.len() - 1;
    (0..n).map(|i| points[i * last / (n - 1)]).collect()
}

/// The names of `series` and `finals` in order, once each.
pub fn names(m: &AttemptMetrics) -> BTreeSet<&str> {
    m.finals
        .keys()
        .chain(m.series.keys())
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asha(grace: u64, rf: u64, rate: u32) -> EarlyStop {
        EarlyStop {
            metric: "acc".into(),
            mode: Mode::Max,
            rule: Rule::Asha,
            grace_steps: grace,
            reduction_factor: rf,
            min_early_stopping_rate: rate,
            bootstrap_count: 0,
        }
    }

    #[test]
    fn rungs_grow_geometrically_from_the_grace_steps() {
        let es = asha(2, 3, 0);
        assert_eq!(
            (0..4).map(|r| es.rung_step(r)).collect::<Vec<_>>(),
            [Some(2), Some(6), Some(18), Some(54)]
        );
        assert_eq!(asha(1, 4, 1).rung_step(0), Some(4));
        assert_eq!(asha(1, 100, 0).rung_step(20), None, "past u64");
    }

    #[test]
    fn fields_are_named_in_errors() {
        let mut r = ResultsSpec::default();
        r.metrics.insert(
            "acc".into(),
            MetricSpec {
                pattern: Some("(unclosed".into()),
                take: Take::Max,
                scale: None,
            },
        );
        assert_eq!(
            r.validate().expect_err("refused").field,
            "metrics.acc.pattern"
        );
        r.metrics.clear();
        r.metrics.insert(
            "9lives".into(),
            MetricSpec {
                pattern: None,
                take: Take::Last,
                scale: None,
            },
        );
        assert_eq!(r.validate().expect_err("refused").field, "metrics.9lives");
        r.metrics.clear();
        r.early_stop = Some(asha(0, 4, 0));
        assert_eq!(
            r.validate().expect_err("refused").field,
            "early_stop.grace_steps"
        );
        r.early_stop = Some(asha(1, 1, 0));
        assert_eq!(
            r.validate().expect_err("refused").field,
            "early_stop.reduction_factor"
        );
        r.early_stop = None;
        r.tracking = Some(Tracking {
            mlflow: "file:///tmp/mlruns".into(),
        });
        assert_eq!(r.validate().expect_err("refused").field, "tracking.mlflow");
        r.tracking = Some(Tracking {
            mlflow: "https://lab:secret@mlflow.lab".into(),
        });
        let e = r.validate().expect_err("refused");
        assert!(
            e.field == "tracking.mlflow" && e.message.contains("credential"),
            "{e:?}"
        );
        r.tracking = Some(Tracking {
            mlflow: "http://mlflow.lab:5000/path@x".into(),
        });
        assert!(
            r.validate().is_ok(),
            "an `@` past the host is no credential"
        );
    }

    #[test]
    fn a_take_folds_values_as_named() {
        let fold = |t: Take| {
            [3.0, 5.0, 1.0]
                .iter()
                .fold(None, |c, &v| Some(t.fold(c, v)))
        };
        assert_eq!(fold(Take::Last), Some(1.0));
        assert_eq!(fold(Take::Max), Some(5.0));
        assert_eq!(fold(Take::Min), Some(1.0));
    }

    #[test]
    fn metric_names_may_hold_slashes_but_not_spaces() {
        assert!(validate_metric_name("val/acc").is_ok());
        assert!(validate_metric_name("_loss.ema-3").is_ok());
        assert!(validate_metric_name("val acc").is_err());
        assert!(validate_metric_name("").is_err());
        assert!(validate_metric_name(&"a".repeat(65)).is_err());
    }
}
