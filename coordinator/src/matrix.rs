//! Turning a submitted experiment spec into the jobs the store keeps: each expanded point of
//! the matrix with the profile's environment, the spec's limits and rules resolved once; and
//! a study's `after` into the jobs each job waits for, and its variants' expected run lengths
//! (declared, or learned from earlier runs) into the order they are queued in.

use std::collections::BTreeMap;

use headroom_shared::api::LengthFrom;
use headroom_shared::expand::{ExpandedJob, memory_key};
use headroom_shared::spec::{ExperimentSpec, SpecError};
use headroom_shared::study::{StudySpec, VARIANTS_KEY};
use headroom_shared::template::value_text;
use headroom_shared::{ExperimentId, JobId};

use crate::store::{NewDependency, NewExperiment, NewJob};

/// Most waits (a job and a job it waits for) one study may hold: `after` without `match`
/// pairs every job with every job of the other variant.
pub const MAX_DEPENDENCIES: usize = 200_000;

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
        study: None,
        max_concurrent: spec.max_concurrent,
        host_memory_mib: spec.resources.host_memory.map(|m| m.mib),
        checkpoint: spec.checkpoint()?,
        preemptible: spec.preemptible,
        memory_cap_off: !spec.memory_cap.is_on(),
        memory_phases: spec.memory_phases()?,
    })
}

/// Memory keys whose history is read for a variant that declares no length, at most this
/// many of each variant (its first configurations'): a submit reads no more than that.
pub const KEYS_LEARNED_FROM: usize = 16;

/// The memory keys to read the run times of: up to [`KEYS_LEARNED_FROM`] of each variant
/// that declares no length (`declared[i]` is `None`).
pub fn keys_to_learn_lengths(declared: &[Option<u64>], exps: &[NewExperiment]) -> Vec<String> {
    let mut keys = std::collections::BTreeSet::new();
    for (e, d) in exps.iter().zip(declared) {
        if d.is_none() {
            let mut own = std::collections::BTreeSet::new();
            for j in &e.jobs {
                if own.len() == KEYS_LEARNED_FROM {
                    break;
                }
                own.insert(j.memory_key.as_str());
            }
            keys.extend(own.into_iter().map(str::to_string));
        }
    }
    keys.into_iter().collect()
}

/// Each variant's expected run length (ms) and where it comes from: its declared one, else
/// the longest that its configurations' earlier runs took (`learned`, by memory key), else
/// none.
pub fn expected_lengths(
    declared: &[Option<u64>],
    exps: &[NewExperiment],
    learned: &BTreeMap<String, u64>,
) -> Vec<Option<(u64, LengthFrom)>> {
    exps.iter()
        .zip(declared)
        .map(|(e, d)| match d {
            Some(ms) => Some((*ms, LengthFrom::Declared)),
            None => e
                .jobs
                .iter()
                .filter_map(|j| learned.get(&j.memory_key))
                .max()
                .map(|ms| (*ms, LengthFrom::Learned)),
        })
        .collect()
}

/// The waits of `study`'s jobs (`exps` in the study's variant order): each job of a variant
/// with `after` waits for the jobs of the named variant whose `match` parameters hold the
/// same values (all of them without `match`).
pub fn dependencies(
    study: &StudySpec,
    exps: &[NewExperiment],
) -> Result<Vec<NewDependency>, SpecError> {
    let mut out = Vec::new();
    for (i, v) in study.variants.iter().enumerate() {
        for (k, a) in v.after.iter().enumerate() {
            let Some(j) = study.variants.iter().position(|o| o.name == a.experiment) else {
                continue; // refused when the study was parsed
            };
            // Numbers pair by value (`1` and `1.0` are one learning rate).
            let key = |params: &BTreeMap<String, serde_json::Value>| -> String {
                a.matching
                    .iter()
                    .map(|m| match params.get(m) {
                        Some(serde_json::Value::Number(n)) => {
                            n.as_f64().map_or_else(|| n.to_string(), |f| f.to_string())
                        }
                        Some(v) => v.to_string(),
                        None => String::new(),
                    })
                    .collect::<Vec<_>>()
                    .join("\u{1f}")
            };
            let mut theirs: BTreeMap<String, Vec<JobId>> = BTreeMap::new();
            for job in &exps[j].jobs {
                theirs.entry(key(&job.params)).or_default().push(job.id);
            }
            for job in &exps[i].jobs {
                // A job that pairs with none would start at once: refused, not guessed.
                let Some(needs) = theirs.get(&key(&job.params)) else {
                    let values: Vec<String> = a
                        .matching
                        .iter()
                        .map(|m| {
                            let v = job.params.get(m).map(value_text).unwrap_or_default();
                            format!("{m}={v}")
                        })
                        .collect();
                    return Err(SpecError::new(
                        format!("{VARIANTS_KEY}[{i}].after[{k}].match"),
                        format!(
                            "job {} of `{}` ({}) matches no job of `{}`: every job needs one \
                             to wait for",
                            job.index,
                            v.name,
                            values.join(" "),
                            a.experiment
                        ),
                    ));
                };
                for &needs in needs {
                    out.push(NewDependency {
                        job: job.id,
                        needs,
                        when: a.when,
                        on_failure: a.on_failure,
                    });
                }
                if out.len() > MAX_DEPENDENCIES {
                    return Err(SpecError::new(
                        format!("{VARIANTS_KEY}[{i}].after[{k}].match"),
                        format!(
                            "the study's jobs would wait for more than {MAX_DEPENDENCIES} jobs \
                             in all: name the parameters that pair a job of `{}` with the \
                             jobs of `{}` it needs",
                            v.name, a.experiment
                        ),
                    ));
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_shared::expand::expand_within;
    use serde_json::json;

    /// Each variant of `study` expanded into the experiment a submit would store.
    fn experiments_of(study: &StudySpec) -> Vec<NewExperiment> {
        study
            .variants
            .iter()
            .map(|v| {
                let jobs = expand_within(&v.spec, 1, 1000, 1 << 20).expect("expand");
                new_experiment(&v.spec, jobs, 1, "a".into(), None).expect("experiment")
            })
            .collect()
    }

    fn study_jobs(v: serde_json::Value) -> Result<usize, SpecError> {
        let study = headroom_shared::study::parse(&v)?.expect("a study");
        dependencies(&study, &experiments_of(&study)).map(|d| d.len())
    }

    #[test]
    fn a_variant_without_a_length_learns_the_longest_of_its_configurations() {
        let study = headroom_shared::study::parse(&json!({"name": "s", "experiments": [
            {"name": "a", "command": ["t", "{lr}"], "grid": {"lr": [1, 2, 3]}, "memory_key": ["lr"]},
            {"name": "b", "command": ["t"], "expected_duration": "1m"},
            {"name": "c", "command": ["t"]},
        ]}))
        .expect("parses")
        .expect("a study");
        let exps = experiments_of(&study);
        let declared = [None, Some(60_000), None];
        let keys = keys_to_learn_lengths(&declared, &exps);
        assert_eq!(keys.len(), 4, "a's three configurations and c: {keys:?}");
        assert!(!keys.iter().any(|k| k.starts_with("s.b")), "{keys:?}");
        // Two of a's configurations ran before, c's never did.
        let learned: BTreeMap<String, u64> = keys
            .iter()
            .filter(|k| k.starts_with("s.a"))
            .take(2)
            .zip([90_000, 30_000])
            .map(|(k, ms)| (k.clone(), ms))
            .collect();
        let lengths = expected_lengths(&declared, &exps, &learned);
        assert_eq!(
            lengths,
            vec![
                Some((90_000, LengthFrom::Learned)),
                Some((60_000, LengthFrom::Declared)),
                None
            ]
        );
        let ms: Vec<Option<u64>> = lengths.iter().map(|l| l.map(|(ms, _)| ms)).collect();
        assert_eq!(headroom_shared::study::queue_order(&ms), vec![0, 1, 2]);
    }

    #[test]
    fn jobs_pair_by_value_and_one_without_a_partner_is_refused() {
        // `1` and `1.0` are one learning rate; each eval waits for its own training's runs.
        let n = study_jobs(json!({"name": "s", "experiments": [
            {"name": "train", "command": ["t", "{lr}"], "grid": {"lr": [1, 0.5]}, "runs_per_config": 2},
            {"name": "eval", "command": ["e", "{lr}"], "grid": {"lr": [1.0, 0.5]},
             "after": [{"experiment": "train", "match": ["lr"]}]},
        ]}));
        assert_eq!(n, Ok(4));
        let e = study_jobs(json!({"name": "s", "experiments": [
            {"name": "train", "command": ["t", "{lr}"], "grid": {"lr": [1]}},
            {"name": "eval", "command": ["e", "{lr}"], "grid": {"lr": [1, 2]},
             "after": [{"experiment": "train", "match": ["lr"]}]},
        ]}))
        .expect_err("no partner");
        assert_eq!(e.field, "experiments[1].after[0].match");
        assert!(
            e.message
                .contains("job 1 of `eval` (lr=2) matches no job of `train`"),
            "{}",
            e.message
        );
    }
}
