//! Matrix expansion: a validated spec and a seed become the list of jobs, deterministically.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{Distribution, ExperimentSpec, SpecError};
pub use crate::template::{render, value_text};

/// One job of an expansion, before it is stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExpandedJob {
    /// Position in the expansion (0-based).
    pub index: u32,
    /// Which configuration (grid point x mutation draw).
    pub config: u32,
    /// Which run of that configuration.
    pub run: u32,
    pub params: BTreeMap<String, Value>,
    pub argv: Vec<String>,
    /// The colocated background this job runs with (`colocate`), rendered with its
    /// parameters; absent when it runs alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<crate::colocate::Background>,
}

/// The most bytes the jobs of one spec may take once expanded, by default: what a client
/// sends is bounded after expansion, not only as it arrives (a 20 KB `env` copied into each of
/// 100,000 jobs is 2 GB).
pub const DEFAULT_MAX_EXPANDED_BYTES: u64 = 64 * 1024 * 1024;

/// Expands `spec` (validated against `max_jobs` first) with `seed`, within
/// [`DEFAULT_MAX_EXPANDED_BYTES`].
pub fn expand(
    spec: &ExperimentSpec,
    seed: u64,
    max_jobs: u64,
) -> Result<Vec<ExpandedJob>, SpecError> {
    expand_within(spec, seed, max_jobs, DEFAULT_MAX_EXPANDED_BYTES)
}

/// Expands `spec` with `seed`: at most `max_jobs` jobs, taking at most `max_bytes` as the
/// store keeps them (each job carries the spec's `env`, command and ladder beside its own
/// parameters and arguments). Refused before anything is expanded where the parts every
/// job copies are already too large, and otherwise as soon as the expansion passes the
/// bound, so a refusal costs at most `max_bytes`.
pub fn expand_within(
    spec: &ExperimentSpec,
    seed: u64,
    max_jobs: u64,
    max_bytes: u64,
) -> Result<Vec<ExpandedJob>, SpecError> {
    spec.validate(max_jobs)?;
    let budget = Budget::of(spec, max_bytes);
    budget.check_before(spec.job_count().unwrap_or(u64::MAX))?;
    let mut used: u64 = 0;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let axes: Vec<(&String, &Vec<Value>)> = spec.grid.iter().collect();
    let grid_points: usize = axes.iter().map(|(_, v)| v.len()).product();
    let no_row = BTreeMap::new();
    let rows: Vec<&BTreeMap<String, Value>> = if spec.rows.is_empty() {
        vec![&no_row]
    } else {
        spec.rows.iter().collect()
    };
    let mut jobs = Vec::with_capacity(spec.job_count().unwrap_or(0) as usize);
    let mut config: u32 = 0;
    // Configurations: each row, in order; within it each zip position; within that each
    // grid point (the last axis fastest); then the draws and the runs.
    let points = rows.iter().flat_map(|row| {
        (0..spec.zip_len()).flat_map(move |z| (0..grid_points).map(move |g| (*row, z, g)))
    });
    for (row, z, point) in points {
        // Mixed-radix decoding of `point`: the last axis varies fastest.
        let mut rest = point;
        let mut base = row.clone();
        for (name, values) in &spec.zip {
            base.insert(name.clone(), values[z].clone());
        }
        for (name, values) in axes.iter().rev() {
            base.insert((*name).clone(), values[rest % values.len()].clone());
            rest /= values.len();
        }
        for _ in 0..spec.mutations {
            let mut params = base.clone();
            for (name, dist) in &spec.mutate {
                params.insert(name.clone(), draw(dist, &mut rng));
            }
            for run in 0..spec.runs_per_config {
                let argv = render_argv(spec, &params, config, run)?;
                let background = match &spec.colocate {
                    Some(c) => c.resolve(&params, config, run)?,
                    None => None,
                };
                let job = ExpandedJob {
                    index: jobs.len() as u32,
                    config,
                    run,
                    params: params.clone(),
                    argv,
                    background,
                };
                used = used.saturating_add(budget.of_job(&job));
                budget.check(used, jobs.len() as u64 + 1, spec)?;
                jobs.push(job);
            }
            config += 1;
        }
    }
    Ok(jobs)
}

/// The bytes a spec's jobs may take, and what each of them copies from the spec.
/// The bytes `jobs` (expanded from `spec`) count against the bound of
/// [`expand_within`]: a study's variants share one.
pub fn expanded_bytes(spec: &ExperimentSpec, jobs: &[ExpandedJob]) -> u64 {
    let budget = Budget::of(spec, 0);
    jobs.iter()
        .fold(0u64, |n, j| n.saturating_add(budget.of_job(j)))
}

struct Budget {
    max: u64,
    /// JSON bytes every job carries whatever its parameters: the profile's and the spec's
    /// `env`, the command template, the OOM ladder, the colocated background's template.
    per_job: u64,
    /// Of which `env`.
    env: u64,
}

impl Budget {
    fn of(spec: &ExperimentSpec, max: u64) -> Self {
        use erased::Json;
        let env = spec.job_env().json_len();
        let per_job = env
            + spec.command.json_len()
            + spec.oom_ladder.json_len()
            + spec.colocate.json_len()
            // The job's own columns: ids, states, counters, the memory key's name.
            + 256
            + spec.name.len() as u64;
        Self { max, per_job, env }
    }

    /// The bytes one expanded job takes beyond what every job copies.
    fn of_job(&self, job: &ExpandedJob) -> u64 {
        use erased::Json;
        self.per_job + job.params.json_len() + job.argv.json_len() + job.background.json_len()
    }

    /// Refuses at once when the parts every job copies already pass the bound.
    fn check_before(&self, jobs: u64) -> Result<(), SpecError> {
        if self.per_job.saturating_mul(jobs) > self.max {
            return Err(self.refusal(jobs, self.per_job.saturating_mul(jobs), None));
        }
        Ok(())
    }

    fn check(&self, used: u64, made: u64, spec: &ExperimentSpec) -> Result<(), SpecError> {
        if used > self.max {
            let total = spec.job_count().unwrap_or(made);
            return Err(self.refusal(total, used, Some(made)));
        }
        Ok(())
    }

    fn refusal(&self, jobs: u64, bytes: u64, made: Option<u64>) -> SpecError {
        let size = |b: u64| bytesize::ByteSize::b(b).display().iec().to_string();
        let so_far = match made {
            Some(n) => format!("its first {n} of {jobs} jobs already take {}", size(bytes)),
            None => format!("its {jobs} jobs would take at least {}", size(bytes)),
        };
        // `env` is named when it is what makes the jobs large: it is copied into every job.
        let field = if self.env * 2 >= self.per_job && self.env > 1024 {
            "env"
        } else {
            "spec"
        };
        SpecError::new(
            field,
            format!(
                "too large once expanded: {so_far} (each carries {} of the spec's own, `env` \
                 {}), over the {} one submission may expand into. Keep large values in a file \
                 the jobs read rather than in `env` or arguments, or submit the matrix in \
                 parts (the coordinator's --max-submit-size)",
                size(self.per_job),
                size(self.env),
                size(self.max)
            ),
        )
    }
}

/// JSON sizes without building the JSON text (counted by a writer that keeps nothing).
mod erased {
    pub trait Json {
        fn json_len(&self) -> u64;
    }

    impl<T: serde::Serialize> Json for T {
        fn json_len(&self) -> u64 {
            let mut counter = Counter(0);
            match serde_json::to_writer(&mut counter, self) {
                Ok(()) => counter.0,
                Err(_) => 0,
            }
        }
    }

    struct Counter(u64);

    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}

fn draw(dist: &Distribution, rng: &mut ChaCha8Rng) -> Value {
    match dist {
        Distribution::Uniform([lo, hi]) => float(lo + (hi - lo) * rng.random::<f64>()),
        Distribution::LogUniform([lo, hi]) => {
            let (a, b) = (lo.ln(), hi.ln());
            float((a + (b - a) * rng.random::<f64>()).exp())
        }
        Distribution::Choice(values) => values[rng.random_range(0..values.len())].clone(),
    }
}

/// Six significant digits: `0.000316228`, not `0.00031622776601683794`.
fn float(x: f64) -> Value {
    let rounded: f64 = format!("{x:.5e}").parse().unwrap_or(x);
    serde_json::Number::from_f64(rounded)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

fn render_argv(
    spec: &ExperimentSpec,
    params: &BTreeMap<String, Value>,
    config: u32,
    run: u32,
) -> Result<Vec<String>, SpecError> {
    render(&spec.command, spec.shell, params, config, run)
}

/// The memory key of a job: experiment name and the memory-relevant parameters. Attempts
/// of one key teach the estimate for the next.
pub fn memory_key(
    experiment: &str,
    relevant: &[String],
    params: &BTreeMap<String, Value>,
) -> String {
    let mut key = experiment.to_string();
    for name in relevant {
        if let Some(v) = params.get(name) {
            key.push_str(&format!(";{name}={}", value_text(v)));
        }
    }
    key
}
