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

/// Expands `spec` (validated against `max_jobs` first) with `seed`.
pub fn expand(
    spec: &ExperimentSpec,
    seed: u64,
    max_jobs: u64,
) -> Result<Vec<ExpandedJob>, SpecError> {
    spec.validate(max_jobs)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let axes: Vec<(&String, &Vec<Value>)> = spec.grid.iter().collect();
    let grid_points: usize = axes.iter().map(|(_, v)| v.len()).product();
    let mut jobs = Vec::with_capacity(spec.job_count().unwrap_or(0) as usize);
    let mut config: u32 = 0;
    for point in 0..grid_points {
        // Mixed-radix decoding of `point`: the last axis varies fastest.
        let mut rest = point;
        let mut base = BTreeMap::new();
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
                jobs.push(ExpandedJob {
                    index: jobs.len() as u32,
                    config,
                    run,
                    params: params.clone(),
                    argv,
                    background,
                });
            }
            config += 1;
        }
    }
    Ok(jobs)
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
