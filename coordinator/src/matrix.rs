//! Turning a submitted experiment spec into the jobs the store keeps: each expanded point of
//! the matrix with the profile's environment, the spec's limits and rules resolved once.

use headroom_shared::expand::{ExpandedJob, memory_key};
use headroom_shared::spec::{ExperimentSpec, SpecError};
use headroom_shared::{ExperimentId, JobId};

use crate::store::{NewExperiment, NewJob};

/// The experiment to store for `spec`, expanded (with `seed`) into `expanded`.
pub fn new_experiment(
    spec: &ExperimentSpec,
    expanded: Vec<ExpandedJob>,
    seed: u64,
    submitted_by: String,
    source: Option<headroom_shared::api::source::Source>,
) -> Result<NewExperiment, SpecError> {
    let env = spec.job_env();
    let timeout_ms = spec.timeout()?.map(|d| d.as_millis() as u64);
    let prestart = spec.prestart()?.into_option();
    let jobs = expanded
        .into_iter()
        .map(|j| NewJob {
            id: JobId::new(),
            index: j.index,
            config: j.config,
            run: j.run,
            argv: j.argv,
            env: env.clone(),
            profile: spec.profile_name().to_string(),
            gpus: spec.resources.gpus,
            estimate_mib: spec.resources.memory.map(|m| m.mib),
            timeout_ms,
            max_attempts: spec.retry.max_attempts,
            retry_on: spec.retry.on.clone(),
            priority: spec.priority,
            memory_key: memory_key(&spec.name, &spec.memory_key, &j.params),
            params: j.params,
            command: spec.command.clone(),
            shell: spec.shell,
            oom_ladder: spec.oom_ladder.clone(),
            prestart: prestart.clone(),
            background: j.background,
        })
        .collect();
    Ok(NewExperiment {
        id: ExperimentId::new(),
        name: spec.name.clone(),
        seed,
        spec: serde_json::to_value(spec).map_err(|e| SpecError {
            field: "spec".into(),
            message: e.to_string(),
        })?,
        jobs,
        submitted_by,
        source,
        results: Some(spec.results()).filter(|r| !r.is_empty()),
    })
}
