//! Experiment specs (YAML or JSON, one schema): parsing and validation. A spec that passes
//! `validate` expands without error.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::colocate::ColocateSpec;
pub use crate::field::{SpecError, parse_duration, parse_timeout};
use crate::prestart::{Cooldown, OnCooldownTimeout, Prestart};
use crate::profile;
use crate::size::MemSize;
use crate::state::FailureClass;
pub use crate::template::{BUILTIN_PLACEHOLDERS, placeholders, render_with};

/// Default cap on the number of jobs one spec may expand into.
pub const DEFAULT_MAX_JOBS: u64 = 100_000;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExperimentSpec {
    /// Experiment name (letters, digits, `_`, `-`, `.`).
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9_.-]{1,128}$"))]
    pub name: String,
    /// argv template; `{param}` placeholders are replaced by parameter values.
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub command: Vec<String>,
    /// Run `command` joined by spaces through `sh -c`, values shell-quoted.
    #[serde(default)]
    pub shell: bool,
    /// Seed for `mutate` draws; same spec + seed = same jobs.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Axes whose cartesian product makes the configurations.
    #[serde(default)]
    pub grid: BTreeMap<String, Vec<Value>>,
    /// Randomly drawn parameters.
    #[serde(default)]
    pub mutate: BTreeMap<String, Distribution>,
    /// Axes that advance together: `zip: {fg_model: [a, b], bg_model: [x, y]}` is two
    /// configurations (`a` with `x`, `b` with `y`), times the grid's points.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub zip: BTreeMap<String, Vec<Value>>,
    /// Hand-picked configurations, each naming the same parameters: `rows: [{model: a, lr:
    /// 0.1}, {model: b, lr: 0.01}]`, times the grid's points and the zip's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rows: Vec<BTreeMap<String, Value>>,
    /// How many random draws of the `mutate` axes per grid point.
    #[serde(default = "one")]
    pub mutations: u32,
    #[serde(default = "one")]
    pub runs_per_config: u32,
    #[serde(default)]
    pub resources: Resources,
    /// `2h`, `90s`, or a number of seconds.
    #[serde(default)]
    pub timeout: Option<Value>,
    /// How long one run is expected to take (`40m`, `2h`, or a number of seconds), as
    /// `resources.memory` declares what it holds: a study queues its variants longest first
    /// (one that declares none by what its earlier runs took), so that its longest runs do
    /// not start last. Not a limit: see `timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_duration: Option<Value>,
    /// `{signal: USR1, lead: 120s}`: the signal the job gets `lead` before a timeout, a
    /// `cancel --requeue` or a preemption stops it, to save its state in `HEADROOM_JOB_DIR`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::checkpoint::CheckpointSpec>,
    /// Its running jobs may be stopped (after their `checkpoint` signal) and requeued for a
    /// user under their share, or a job of higher priority, who needs the memory they hold.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preemptible: bool,
    /// `on` (default): where the node can enforce one, each attempt is held to a hard GPU
    /// memory limit of its estimate plus a slack, so that it, not a neighbour, fails when it
    /// grows past it; `off`: no limit.
    #[serde(default, skip_serializing_if = "MemoryCap::is_on")]
    pub memory_cap: MemoryCap,
    #[serde(default)]
    pub retry: RetryPolicy,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub profile: Option<String>,
    /// Higher runs first.
    #[serde(default)]
    pub priority: i32,
    /// The most of its jobs leased or running at once (Slurm's array `%N`); none: as many
    /// as the plans and memory allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_concurrent: Option<u32>,
    /// Parameters that change a job's GPU memory (e.g. `batch_size`, `model`): jobs of one
    /// experiment with equal values share a learned memory estimate.
    #[serde(default)]
    pub memory_key: Vec<String>,
    /// Degrade steps tried in order after a CUDA OOM, e.g.
    /// `[{batch_size: "/2", grad_accum: "*2"}, {gradient_checkpointing: true}]`.
    #[serde(default)]
    pub oom_ladder: Vec<BTreeMap<String, Value>>,
    /// Nothing else is placed on the job's GPUs while an attempt runs, and the attempt
    /// starts only once they hold no process at all (foreign ones included).
    #[serde(default)]
    pub exclusive: bool,
    /// Before each attempt starts, its GPUs idle for `seconds`, or until they cool to
    /// `until_temp_c` (at most `max_wait`).
    #[serde(default)]
    pub cooldown: Option<CooldownSpec>,
    /// A background job on the same GPU, started first; the foreground waits for it to be
    /// ready and it is stopped whenever the foreground ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub colocate: Option<ColocateSpec>,
    /// What a run whose GPU slowed its clocks for temperature or power is: `flag` (default:
    /// a success, flagged and left out of `--clean-only`), `retry` (failure class
    /// `throttled`, tried again while attempts remain) or `fail` (failure class
    /// `throttled`, not tried again).
    #[serde(default)]
    pub on_throttle: OnThrottle,
    /// The directory the jobs run in: absolute, or relative to the spec file (the client
    /// resolves it). Without it, the directory the spec was submitted from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// `checkout` (default): jobs run in their working directory as it is when each starts;
    /// `snapshot`: from a bundle of the code the client takes at submit, on any node.
    #[serde(default)]
    pub code: CodeMode,
    /// The Python environment the jobs run with: `inherit` (default: the submitter's
    /// activated venv or conda environment, if any), `none`, `{venv: PATH}` (absolute, or
    /// relative to the spec file) or `{conda: NAME}` (a name or an absolute prefix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<EnvironmentSpec>,
    /// What the run achieved, read from its output: `val_acc: {pattern: 'Test Accuracy:
    /// ([0-9.]+)%', take: max, scale: 0.01}`; `HEADROOM_METRIC {json}` lines are read too.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, crate::results::MetricSpec>,
    /// A pattern whose first group is the step of the metric values after it (`Epoch
    /// ([0-9]+)`); without it, a value's step is the count of that metric's values so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_step: Option<String>,
    /// Stops attempts whose metric falls behind at a rung (successive halving); they end
    /// `pruned`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_stop: Option<crate::results::EarlyStop>,
    /// `{mlflow: URI}`: each attempt is logged as a run of that MLflow tracking server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<crate::results::Tracking>,
}

/// `memory_cap`: whether an attempt is held to a hard GPU memory limit where the node can:
/// `on` or `off` (YAML's `off` and `false`, read as booleans, mean the same).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum MemoryCap {
    #[default]
    On,
    Off,
}

impl MemoryCap {
    pub fn is_on(&self) -> bool {
        *self == MemoryCap::On
    }
}

impl<'de> Deserialize<'de> for MemoryCap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Word(String),
        }
        match Raw::deserialize(d)? {
            Raw::Flag(true) => Ok(MemoryCap::On),
            Raw::Flag(false) => Ok(MemoryCap::Off),
            Raw::Word(w) => match w.as_str() {
                "on" => Ok(MemoryCap::On),
                "off" => Ok(MemoryCap::Off),
                other => Err(serde::de::Error::custom(format!(
                    "`{other}` is neither `on` nor `off`"
                ))),
            },
        }
    }
}

/// `code`: what the jobs' code is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CodeMode {
    /// The working directory as it is when each attempt starts (its commit is recorded at
    /// submit).
    #[default]
    Checkout,
    /// A bundle of the working directory's tree taken at submit (git-tracked files with
    /// their uncommitted changes, and untracked files not ignored).
    Snapshot,
}

/// `environment`: a keyword or an environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum EnvironmentSpec {
    Keyword(EnvironmentKeyword),
    Given(crate::api::source::Environment),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EnvironmentKeyword {
    /// The submitter's activated venv or conda environment, if any.
    Inherit,
    /// None: the node's `PATH` as it is.
    None,
}

/// `on_throttle`: what a throttled run is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnThrottle {
    #[default]
    Flag,
    Retry,
    Fail,
}

impl OnThrottle {
    pub fn as_str(self) -> &'static str {
        match self {
            OnThrottle::Flag => "flag",
            OnThrottle::Retry => "retry",
            OnThrottle::Fail => "fail",
        }
    }
}

impl std::str::FromStr for OnThrottle {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [OnThrottle::Flag, OnThrottle::Retry, OnThrottle::Fail]
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| format!("unknown on_throttle `{s}`"))
    }
}

/// `cooldown: {seconds: 60}` or `cooldown: {until_temp_c: 40, max_wait: 10m}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CooldownSpec {
    /// Idle this many seconds before the job starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// Wait until every GPU of the attempt reads at most this temperature (°C).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_temp_c: Option<f64>,
    /// Bound on the wait for `until_temp_c` (required with it): `10m`, or seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<Value>,
    /// When `max_wait` passes: `fail` (default, failure class `cooldown_timeout`) or
    /// `start` (start anyway, recorded as timed out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnCooldownTimeout>,
}

/// Lowest and highest `cooldown.until_temp_c` taken: below room temperature a GPU never
/// gets there, above this it is already throttling.
pub const COOL_TEMP_RANGE_C: (f64, f64) = (15.0, 95.0);
/// Longest `cooldown.seconds` / `cooldown.max_wait`: a day.
pub const MAX_COOLDOWN_S: f64 = 86_400.0;

fn one() -> u32 {
    1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// GPUs per job (0 for a CPU-only job).
    #[serde(default = "one")]
    pub gpus: u32,
    /// GPU memory estimate per GPU; without it the job runs alone on its GPU.
    #[serde(default)]
    pub memory: Option<MemSize>,
    /// Host memory the job holds (its DataLoader workers included): admitted against its
    /// node's memory, and the limit of its cgroup; learned from its runs' peaks when larger.
    #[serde(default)]
    pub host_memory: Option<MemSize>,
    /// What a run holds outside its peak and where the peak falls (with `expected_duration`):
    /// runs whose peaks fall apart in time may then share a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_phases: Option<crate::phases::MemoryPhases>,
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            gpus: 1,
            memory: None,
            host_memory: None,
            memory_phases: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Failure classes that earn another attempt.
    #[serde(default = "default_retry_on")]
    pub on: Vec<FailureClass>,
}

fn default_max_attempts() -> u32 {
    3
}

fn default_retry_on() -> Vec<FailureClass> {
    vec![FailureClass::Lost]
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: default_max_attempts(),
            on: default_retry_on(),
        }
    }
}

impl RetryPolicy {
    pub fn retries(&self, class: FailureClass) -> bool {
        self.on.contains(&class)
    }
}

/// How a `mutate` axis draws its values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Distribution {
    Uniform([f64; 2]),
    LogUniform([f64; 2]),
    Choice(Vec<Value>),
}

impl ExperimentSpec {
    /// The environment profile's name: `default` where the spec names none.
    pub fn profile_name(&self) -> &str {
        self.profile.as_deref().unwrap_or(profile::DEFAULT_PROFILE)
    }

    /// The environment each of the spec's jobs runs with: its profile's variables, the
    /// spec's `env` over them.
    pub fn job_env(&self) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> = profile::builtin(self.profile_name())
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.extend(self.env.clone());
        env
    }

    /// Parses YAML or JSON text (JSON is read as YAML's subset).
    pub fn from_text(text: &str) -> Result<Self, SpecError> {
        let value: Value = serde_saphyr::from_str(text)
            .map_err(|e| SpecError::new("spec", format!("not valid YAML/JSON: {e}")))?;
        Self::from_value(value)
    }

    /// Parses an already decoded document; errors name the field's path.
    pub fn from_value(value: Value) -> Result<Self, SpecError> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." {
                "spec".to_string()
            } else {
                path
            };
            SpecError::new(field, e.into_inner().to_string())
        })
    }

    pub fn timeout(&self) -> Result<Option<Duration>, SpecError> {
        parse_timeout(self.timeout.as_ref())
    }

    /// Its `expected_duration`.
    pub fn expected_duration(&self) -> Result<Option<Duration>, SpecError> {
        parse_duration(self.expected_duration.as_ref(), "expected_duration")
    }

    /// Its memory over time (`resources.memory_phases`), checked against its peak and length.
    pub fn memory_phases(&self) -> Result<Option<crate::phases::Phases>, SpecError> {
        let Some(p) = &self.resources.memory_phases else {
            return Ok(None);
        };
        p.check(self.resources.memory, self.expected_duration()?)
            .map(Some)
    }

    /// Its checkpoint signal, validated against its timeout.
    pub fn checkpoint(&self) -> Result<Option<crate::checkpoint::Checkpoint>, SpecError> {
        let timeout = self.timeout()?;
        self.checkpoint
            .as_ref()
            .map(|c| c.check(timeout))
            .transpose()
    }

    /// The pre-start rules every job of this spec gets (`exclusive`, `cooldown`).
    pub fn prestart(&self) -> Result<Prestart, SpecError> {
        let cooldown = match &self.cooldown {
            None => None,
            Some(c) => Some(c.resolve()?),
        };
        if (self.exclusive || cooldown.is_some()) && self.resources.gpus == 0 {
            let field = if self.exclusive {
                "exclusive"
            } else {
                "cooldown"
            };
            return Err(SpecError::new(
                field,
                "a CPU-only job (resources.gpus: 0) has no GPU to wait for",
            ));
        }
        Ok(Prestart {
            exclusive: self.exclusive,
            cooldown,
        })
    }

    /// The results settings its experiment stores and its leases carry.
    pub fn results(&self) -> crate::results::ResultsSpec {
        crate::results::ResultsSpec {
            metrics: self.metrics.clone(),
            metric_step: self.metric_step.clone(),
            early_stop: self.early_stop.clone(),
            tracking: self.tracking.clone(),
        }
    }

    /// Parameter names: grid, mutate and zip axes, and the rows' columns.
    pub fn parameter_names(&self) -> BTreeSet<&str> {
        self.grid
            .keys()
            .chain(self.mutate.keys())
            .chain(self.zip.keys())
            .chain(self.rows.first().into_iter().flat_map(BTreeMap::keys))
            .map(String::as_str)
            .collect()
    }

    /// Positions of the zipped axes (1 without any).
    pub fn zip_len(&self) -> usize {
        self.zip.values().next().map_or(1, Vec::len)
    }

    /// Number of jobs the spec expands into: grid points x zip positions x rows x
    /// `mutations` x `runs_per_config`; `None` on overflow.
    pub fn job_count(&self) -> Option<u64> {
        let mut n: u64 = 1;
        for values in self.grid.values() {
            n = n.checked_mul(values.len() as u64)?;
        }
        n = n.checked_mul(self.zip_len() as u64)?;
        n = n.checked_mul(self.rows.len().max(1) as u64)?;
        n = n.checked_mul(u64::from(self.mutations))?;
        n.checked_mul(u64::from(self.runs_per_config))
    }

    /// `zip` and `rows`: names once each, zipped axes of one length, rows of one set of
    /// columns, scalar values; errors name the field.
    fn validate_linked(&self) -> Result<(), SpecError> {
        let taken = |name: &str, field: &str, by_zip: bool| {
            let other = if self.grid.contains_key(name) {
                Some("a grid axis")
            } else if self.mutate.contains_key(name) {
                Some("a mutate axis")
            } else if !by_zip && self.zip.contains_key(name) {
                Some("a zip axis")
            } else {
                None
            };
            match other {
                Some(o) => Err(SpecError::new(
                    field,
                    format!("parameter `{name}` is also {o}; name each parameter once"),
                )),
                None => Ok(()),
            }
        };
        let len = self.zip_len();
        let first = self.zip.keys().next().cloned().unwrap_or_default();
        for (axis, values) in &self.zip {
            let field = format!("zip.{axis}");
            validate_param_name(axis, &field)?;
            taken(axis, &field, true)?;
            if values.is_empty() {
                return Err(SpecError::new(field, "axis has no values"));
            }
            if values.len() != len {
                return Err(SpecError::new(
                    field,
                    format!(
                        "has {} values but `zip.{first}` has {len}: zipped axes advance together",
                        values.len()
                    ),
                ));
            }
            for (i, v) in values.iter().enumerate() {
                validate_scalar(v, &format!("{field}[{i}]"))?;
            }
        }
        let Some(columns) = self.rows.first() else {
            return Ok(());
        };
        if columns.is_empty() {
            return Err(SpecError::new("rows[0]", "names no parameter"));
        }
        for name in columns.keys() {
            let field = format!("rows[0].{name}");
            validate_param_name(name, &field)?;
            taken(name, &field, false)?;
        }
        for (i, row) in self.rows.iter().enumerate() {
            if let Some(missing) = columns.keys().find(|k| !row.contains_key(*k)) {
                return Err(SpecError::new(
                    format!("rows[{i}]"),
                    format!(
                        "lacks `{missing}`, which rows[0] has: every row names the same parameters"
                    ),
                ));
            }
            if let Some(extra) = row.keys().find(|k| !columns.contains_key(*k)) {
                return Err(SpecError::new(
                    format!("rows[{i}].{extra}"),
                    "is not in rows[0]: every row names the same parameters",
                ));
            }
            for (name, v) in row {
                validate_scalar(v, &format!("rows[{i}].{name}"))?;
            }
        }
        Ok(())
    }

    /// Checks everything that can be checked without a node.
    pub fn validate(&self, max_jobs: u64) -> Result<(), SpecError> {
        validate_name(&self.name)?;
        if self.command.is_empty() {
            return Err(SpecError::new("command", "must hold at least the program"));
        }
        if self.command[0].trim().is_empty() {
            return Err(SpecError::new("command[0]", "the program is empty"));
        }
        for (i, arg) in self.command.iter().enumerate() {
            refuse_nul(arg, &format!("command[{i}]"))?;
        }
        for (axis, values) in &self.grid {
            let field = format!("grid.{axis}");
            validate_param_name(axis, &field)?;
            if values.is_empty() {
                return Err(SpecError::new(field, "axis has no values"));
            }
            for (i, v) in values.iter().enumerate() {
                validate_scalar(v, &format!("{field}[{i}]"))?;
            }
        }
        for (axis, dist) in &self.mutate {
            let field = format!("mutate.{axis}");
            validate_param_name(axis, &field)?;
            if self.grid.contains_key(axis) {
                return Err(SpecError::new(
                    field,
                    format!("parameter `{axis}` is also a grid axis; name each parameter once"),
                ));
            }
            validate_distribution(dist, &field)?;
        }
        self.validate_linked()?;
        self.results().validate()?;
        crate::api::bounds::COUNT
            .check(self.mutations.into())
            .map_err(|m| SpecError::new("mutations", m))?;
        if self.mutations > 1 && self.mutate.is_empty() {
            return Err(SpecError::new(
                "mutations",
                "draws random values, but the spec has no `mutate` axes",
            ));
        }
        crate::api::bounds::COUNT
            .check(self.runs_per_config.into())
            .map_err(|m| SpecError::new("runs_per_config", m))?;
        if self.max_concurrent == Some(0) {
            return Err(SpecError::new(
                "max_concurrent",
                "must be at least 1 (leave it out for no bound)",
            ));
        }
        let params = self.parameter_names();
        for (i, arg) in self.command.iter().enumerate() {
            for name in placeholders(arg).map_err(|m| SpecError::new(format!("command[{i}]"), m))? {
                if !params.contains(name.as_str()) && !BUILTIN_PLACEHOLDERS.contains(&name.as_str())
                {
                    return Err(SpecError::new(
                        format!("command[{i}]"),
                        format!(
                            "placeholder {{{name}}} names no parameter (grid, mutate or zip axis, or a rows column)"
                        ),
                    ));
                }
            }
        }
        if self.resources.gpus > 64 {
            return Err(SpecError::new(
                "resources.gpus",
                "more than 64 GPUs per job",
            ));
        }
        if self.resources.memory == Some(MemSize::from_mib(0)) {
            return Err(SpecError::new("resources.memory", "must be more than 0"));
        }
        self.timeout()?;
        self.expected_duration()?;
        self.memory_phases()?;
        self.checkpoint()?;
        self.prestart()?;
        if self.retry.max_attempts == 0 || self.retry.max_attempts > 100 {
            return Err(SpecError::new(
                "retry.max_attempts",
                "must be between 1 and 100",
            ));
        }
        if self.retry.on.contains(&FailureClass::Cancelled) {
            return Err(SpecError::new(
                "retry.on",
                "a cancelled job is never retried by itself; use `headroom retry`",
            ));
        }
        if self.retry.on.contains(&FailureClass::Pruned) {
            return Err(SpecError::new(
                "retry.on",
                "a job `early_stop` pruned is never retried by itself; use `headroom retry`",
            ));
        }
        if let Some(c) = self.retry.on.iter().find(|c| c.is_requeue()) {
            return Err(SpecError::new(
                "retry.on",
                format!("a `{c}` attempt is always requeued, without spending an attempt"),
            ));
        }
        if self.retry.on.contains(&FailureClass::Throttled) {
            return Err(SpecError::new(
                "retry.on",
                "a throttled run is retried by `on_throttle: retry`, not by `retry.on`",
            ));
        }
        if let Some(w) = &self.workdir {
            if w.is_empty() {
                return Err(SpecError::new("workdir", "is empty"));
            }
            refuse_nul(w, "workdir")?;
        }
        if let Some(EnvironmentSpec::Given(e)) = &self.environment {
            match e {
                // A relative venv is resolved by the client, against the spec file.
                crate::api::source::Environment::Venv(p) => refuse_nul(p, "environment.venv")?,
                crate::api::source::Environment::Conda(_) => {
                    e.check().map_err(|(f, m)| SpecError::new(f, m))?
                }
            }
        }
        if self.retry.on.iter().any(|c| c.is_setup()) {
            return Err(SpecError::new(
                "retry.on",
                "a working directory or environment the node lacks is not retried: it would \
                 fail the same way",
            ));
        }
        for (key, value) in &self.env {
            let field = format!("env.{key}");
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(SpecError::new(field, "not a valid variable name"));
            }
            refuse_nul(value, &field)?;
            if key == "CUDA_VISIBLE_DEVICES" || key.starts_with("HEADROOM_") {
                return Err(SpecError::new(
                    field,
                    "set by the agent; a job cannot override it",
                ));
            }
        }
        for (i, name) in self.memory_key.iter().enumerate() {
            if !params.contains(name.as_str()) {
                return Err(SpecError::new(
                    format!("memory_key[{i}]"),
                    format!(
                        "`{name}` is not a parameter (grid, mutate or zip axis, or a rows column)"
                    ),
                ));
            }
        }
        for (i, step) in self.oom_ladder.iter().enumerate() {
            if step.is_empty() {
                return Err(SpecError::new(
                    format!("oom_ladder[{i}]"),
                    "a step changes at least one parameter",
                ));
            }
            for (name, change) in step {
                let field = format!("oom_ladder[{i}].{name}");
                validate_param_name(name, &field)?;
                if let Value::String(text) = change {
                    refuse_nul(text, &field)?;
                }
                match LadderChange::parse(change) {
                    Err(m) => return Err(SpecError::new(field, m)),
                    Ok(LadderChange::Scale { .. }) if !params.contains(name.as_str()) => {
                        return Err(SpecError::new(
                            field,
                            format!("`{name}` is not a parameter, so it cannot be scaled"),
                        ));
                    }
                    Ok(_) => {}
                }
            }
        }
        if let Some(c) = &self.colocate {
            if self.resources.gpus != 1 {
                return Err(SpecError::new(
                    "colocate",
                    "a background shares its foreground's one GPU: needs `resources.gpus: 1`",
                ));
            }
            // Every axis with its values: `colocate.memory` may name any of them.
            let mut axes = self.grid.clone();
            axes.extend(self.zip.clone());
            if let Some(columns) = self.rows.first() {
                for name in columns.keys() {
                    let values = self.rows.iter().filter_map(|r| r.get(name).cloned());
                    axes.insert(name.clone(), values.collect());
                }
            }
            c.validate(&params, &axes)?;
        }
        if let Some(p) = &self.profile
            && profile::builtin(p).is_none()
        {
            return Err(SpecError::new(
                "profile",
                format!(
                    "unknown profile `{p}` (known: {})",
                    profile::NAMES.join(", ")
                ),
            ));
        }
        match self.job_count() {
            Some(n) if n <= max_jobs => Ok(()),
            Some(n) => Err(SpecError::new(
                "spec",
                format!("expands to {n} jobs, above the cap of {max_jobs}"),
            )),
            None => Err(SpecError::new(
                "spec",
                "expands to more jobs than can be counted",
            )),
        }
    }
}

pub fn validate_name(name: &str) -> Result<(), SpecError> {
    if name.is_empty() || name.len() > 128 {
        return Err(SpecError::new("name", "must be 1 to 128 characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(SpecError::new(
            "name",
            "may hold only letters, digits, `_`, `-` and `.`",
        ));
    }
    Ok(())
}

/// Parameter names become `HP_<NAME>` variables, so they must be identifiers.
fn validate_param_name(name: &str, field: &str) -> Result<(), SpecError> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(SpecError::new(
            field,
            "parameter names are letters, digits and `_`, not starting with a digit",
        ));
    }
    if BUILTIN_PLACEHOLDERS.contains(&name) {
        return Err(SpecError::new(
            field,
            format!("`{name}` is a built-in placeholder"),
        ));
    }
    Ok(())
}

/// `execve` takes C strings: a NUL byte would make every attempt fail to launch.
fn refuse_nul(text: &str, field: &str) -> Result<(), SpecError> {
    match text.find('\0') {
        Some(at) => Err(SpecError::new(
            field,
            format!("holds a NUL byte (at byte {at}); arguments and variables cannot"),
        )),
        None => Ok(()),
    }
}

fn validate_scalar(v: &Value, field: &str) -> Result<(), SpecError> {
    match v {
        Value::String(s) => refuse_nul(s, field),
        Value::Number(_) | Value::Bool(_) => Ok(()),
        Value::Null => Err(SpecError::new(field, "empty value")),
        _ => Err(SpecError::new(
            field,
            "values are strings, numbers or booleans",
        )),
    }
}

fn validate_distribution(dist: &Distribution, field: &str) -> Result<(), SpecError> {
    match dist {
        Distribution::Uniform([lo, hi]) => {
            if !lo.is_finite() || !hi.is_finite() {
                return Err(SpecError::new(field, "bounds must be finite numbers"));
            }
            if lo > hi {
                return Err(SpecError::new(
                    field,
                    format!("low {lo} is above high {hi}"),
                ));
            }
        }
        Distribution::LogUniform([lo, hi]) => {
            if !lo.is_finite() || !hi.is_finite() {
                return Err(SpecError::new(field, "bounds must be finite numbers"));
            }
            if *lo <= 0.0 {
                return Err(SpecError::new(
                    field,
                    format!("log_uniform needs low > 0, got {lo}"),
                ));
            }
            if lo > hi {
                return Err(SpecError::new(
                    field,
                    format!("low {lo} is above high {hi}"),
                ));
            }
        }
        Distribution::Choice(values) => {
            if values.is_empty() {
                return Err(SpecError::new(field, "choice has no values"));
            }
            for (i, v) in values.iter().enumerate() {
                validate_scalar(v, &format!("{field}.choice[{i}]"))?;
            }
        }
    }
    Ok(())
}

impl CooldownSpec {
    /// Checks the combination and the figures; errors name `cooldown.<field>`.
    pub fn resolve(&self) -> Result<Cooldown, SpecError> {
        let bad = |f: &str, m: String| SpecError::new(format!("cooldown.{f}"), m);
        match (self.seconds, self.until_temp_c) {
            (Some(_), Some(_)) => Err(bad(
                "until_temp_c",
                "give either `seconds` or `until_temp_c`, not both".into(),
            )),
            (None, None) => Err(SpecError::new(
                "cooldown",
                "give `seconds: N` or `until_temp_c: T` with `max_wait`",
            )),
            (Some(secs), None) => {
                if self.max_wait.is_some() {
                    return Err(bad(
                        "max_wait",
                        "bounds `until_temp_c` only; `seconds` is the wait".into(),
                    ));
                }
                if self.on_timeout.is_some() {
                    return Err(bad(
                        "on_timeout",
                        "applies to `until_temp_c` only; `seconds` cannot time out".into(),
                    ));
                }
                if !secs.is_finite() || secs <= 0.0 || secs > MAX_COOLDOWN_S {
                    return Err(bad(
                        "seconds",
                        format!("must be more than 0 and at most {MAX_COOLDOWN_S}, got {secs}"),
                    ));
                }
                Ok(Cooldown::Seconds {
                    ms: (secs * 1000.0).round() as u64,
                })
            }
            (None, Some(temp)) => {
                let (lo, hi) = COOL_TEMP_RANGE_C;
                if !temp.is_finite() || !(lo..=hi).contains(&temp) {
                    return Err(bad(
                        "until_temp_c",
                        format!("must be a temperature between {lo} and {hi} °C, got {temp}"),
                    ));
                }
                let max_wait = parse_duration(self.max_wait.as_ref(), "cooldown.max_wait")?
                    .ok_or_else(|| {
                        bad(
                            "max_wait",
                            "is required with `until_temp_c` (e.g. `10m`): a GPU may never \
                             cool that far"
                                .into(),
                        )
                    })?;
                if max_wait.as_secs_f64() > MAX_COOLDOWN_S {
                    return Err(bad(
                        "max_wait",
                        format!("at most {MAX_COOLDOWN_S} seconds (a day)"),
                    ));
                }
                Ok(Cooldown::UntilTemp {
                    temp_c: temp,
                    max_wait_ms: u64::try_from(max_wait.as_millis()).unwrap_or(u64::MAX),
                    on_timeout: self.on_timeout.unwrap_or_default(),
                })
            }
        }
    }
}

/// One parameter change of an OOM ladder step.
#[derive(Clone, Debug, PartialEq)]
pub enum LadderChange {
    /// `"/2"` divides, `"*2"` multiplies (integers stay integers, at least 1).
    Scale { divide: bool, by: f64 },
    /// Any other value replaces the parameter (or adds it: `gradient_checkpointing: true`).
    Set(Value),
}

impl LadderChange {
    pub fn parse(v: &Value) -> Result<Self, String> {
        if let Value::String(s) = v {
            let t = s.trim();
            if let Some((op, num)) = t.split_at_checked(1)
                && (op == "/" || op == "*")
            {
                let by: f64 = num
                    .trim()
                    .parse()
                    .map_err(|_| format!("`{s}`: write `/2` or `*2`"))?;
                if !by.is_finite() || by <= 0.0 {
                    return Err(format!("`{s}`: the factor must be a positive number"));
                }
                return Ok(LadderChange::Scale {
                    divide: op == "/",
                    by,
                });
            }
        }
        match v {
            Value::Null => Err("empty value".into()),
            Value::Array(_) | Value::Object(_) => {
                Err("values are strings, numbers or booleans".into())
            }
            other => Ok(LadderChange::Set(other.clone())),
        }
    }

    /// The parameter's value after this change.
    pub fn apply(&self, current: Option<&Value>) -> Value {
        match self {
            LadderChange::Set(v) => v.clone(),
            LadderChange::Scale { divide, by } => {
                let Some(x) = current.and_then(Value::as_f64) else {
                    return current.cloned().unwrap_or(Value::Null);
                };
                let y = if *divide { x / by } else { x * by };
                if current.is_some_and(|c| c.is_i64() || c.is_u64()) {
                    Value::from((y.round() as i64).max(1))
                } else {
                    serde_json::Number::from_f64(y)
                        .map(Value::Number)
                        .unwrap_or(Value::Null)
                }
            }
        }
    }
}

/// Applies ladder step `step` to `params` (the spec was validated, so every change parses).
pub fn apply_ladder_step(params: &mut BTreeMap<String, Value>, step: &BTreeMap<String, Value>) {
    for (name, change) in step {
        if let Ok(c) = LadderChange::parse(change) {
            let next = c.apply(params.get(name));
            params.insert(name.clone(), next);
        }
    }
}
