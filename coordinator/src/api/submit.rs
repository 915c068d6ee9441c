//! Submitting a spec: one experiment, or a study's variants (`experiments:`) stored together
//! in one transaction; a dry run expands and checks the same way and stores nothing.

use axum::Extension;
use axum::extract::State;
use headroom_shared::api::{
    Principal, Role, SubmitRequest, SubmitResponse, SubmittedVariant, VariantSource,
};
use headroom_shared::expand::{ExpandedJob, expand_within, expanded_bytes};
use headroom_shared::pending::PendingReason;
use headroom_shared::spec::{ExperimentSpec, SpecError};
use headroom_shared::study::{self, StudySpec};
use headroom_shared::{StudyId, api::source::Source};

use super::{ApiError, ApiJson, ApiResult, AppState, dry_run};
use crate::store::StudyOf;

/// Most jobs a dry run's answer shows (it says how many more there are).
const PREVIEW_MAX: usize = 1_000;

pub async fn submit(
    State(s): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiJson(req): ApiJson<SubmitRequest>,
) -> ApiResult<SubmitResponse> {
    if let Some(study) = study::parse(&req.spec)? {
        return submit_study(&s, who, req, study).await;
    }
    if let Some(name) = req.variants.keys().next() {
        return Err(ApiError::invalid(
            format!("variants.{name}"),
            "a source per variant belongs to a study (a spec with `experiments:`)",
        ));
    }
    let spec = ExperimentSpec::from_value(req.spec.clone())?;
    let seed = req.seed.or(spec.seed).unwrap_or_else(rand::random);
    let bounds = (s.config.max_jobs, s.config.max_submit_bytes);
    let ready = prepare(&s, &who, &spec, &req, seed, bounds).await?;
    if req.dry_run {
        let schedule = dry_run::schedule(
            &s,
            &[dry_run::Group {
                name: &spec.name,
                spec: &spec,
                jobs: &ready.expanded,
            }],
            &[],
        )
        .await?;
        let jobs = ready.expanded.len() as u64;
        // The answer is bounded too: the first jobs, and how many more there are.
        let mut preview = ready.expanded;
        preview.truncate(PREVIEW_MAX);
        return Ok(ApiJson(SubmitResponse {
            experiment: None,
            name: spec.name,
            seed,
            jobs,
            dry_run: true,
            preview_omitted: jobs - preview.len() as u64,
            preview: Some(preview),
            warnings: ready.warnings,
            study: None,
            variants: vec![],
            schedule: Some(schedule),
        }));
    }
    let exp = crate::matrix::new_experiment(&spec, ready.expanded, seed, who.name, ready.source)?;
    let count = exp.jobs.len() as u64;
    let stored = s.store.create_experiment(exp).await?;
    tracing::info!(experiment = %stored.id, name = %stored.name, jobs = count, by = %stored.submitted_by, "experiment submitted");
    Ok(ApiJson(SubmitResponse {
        experiment: Some(stored.id),
        name: stored.name,
        seed,
        jobs: count,
        dry_run: false,
        preview: None,
        preview_omitted: 0,
        warnings: ready.warnings,
        study: None,
        variants: vec![],
        schedule: None,
    }))
}

/// A study: every variant checked and expanded first (a refusal names the variant's field and
/// stores nothing), then all of them stored in one transaction under one study id.
async fn submit_study(
    s: &AppState,
    who: Principal,
    req: SubmitRequest,
    study: StudySpec,
) -> ApiResult<SubmitResponse> {
    if let Some(name) = req
        .variants
        .keys()
        .find(|n| !study.variants.iter().any(|v| &v.name == *n))
    {
        return Err(ApiError::invalid(
            format!("variants.{name}"),
            format!("the study has no variant `{name}`"),
        ));
    }
    let study_seed = req.seed.or(study.seed).unwrap_or_else(rand::random);
    // The jobs and bytes one submission may hold are the study's, shared by its variants.
    let (mut jobs_left, mut bytes_left) = (s.config.max_jobs, s.config.max_submit_bytes);
    let mut ready = Vec::with_capacity(study.variants.len());
    for v in &study.variants {
        let vreq = variant_request(&req, req.variants.get(&v.name));
        let seed = req.seed.or(v.spec.seed).unwrap_or(study_seed);
        let r = prepare(s, &who, &v.spec, &vreq, seed, (jobs_left, bytes_left))
            .await
            .map_err(|e| e.in_variant(v))?;
        jobs_left -= r.expanded.len() as u64;
        bytes_left = bytes_left.saturating_sub(expanded_bytes(&v.spec, &r.expanded));
        ready.push((v, seed, r));
    }
    let jobs: u64 = ready.iter().map(|(_, _, r)| r.expanded.len() as u64).sum();
    let warnings: Vec<String> = ready
        .iter()
        .flat_map(|(v, _, r)| r.warnings.iter().map(move |w| format!("{}: {w}", v.name)))
        .collect();
    let listed = |v: &study::Variant, seed: u64, jobs: u64, id| SubmittedVariant {
        variant: v.name.clone(),
        name: v.spec.name.clone(),
        experiment: id,
        jobs,
        seed,
        gpus: v.spec.resources.gpus,
        memory: v.spec.resources.memory,
        memory_key: v.spec.memory_key.clone(),
        after: v.after.iter().map(|a| a.experiment.clone()).collect(),
    };
    if req.dry_run {
        // Checked as a submission would be (the waits included), then dropped.
        let mut exps = Vec::with_capacity(ready.len());
        for (v, seed, r) in &ready {
            let exp = crate::matrix::new_experiment(
                &v.spec,
                r.expanded.clone(),
                *seed,
                who.name.clone(),
                r.source.clone(),
            )
            .map_err(|e| v.refusal(e))?;
            exps.push(exp);
        }
        let waits = crate::matrix::dependencies(&study, &exps)?;
        // The schedule places a job that waits once what it waits for has ended.
        let position: std::collections::BTreeMap<headroom_shared::JobId, usize> = exps
            .iter()
            .flat_map(|e| e.jobs.iter())
            .enumerate()
            .map(|(i, j)| (j.id, i))
            .collect();
        let after: Vec<(usize, usize)> = waits
            .iter()
            .filter_map(|w| Some((*position.get(&w.job)?, *position.get(&w.needs)?)))
            .collect();
        drop(exps);
        let groups: Vec<dry_run::Group<'_>> = ready
            .iter()
            .map(|(v, _, r)| dry_run::Group {
                name: &v.spec.name,
                spec: &v.spec,
                jobs: &r.expanded,
            })
            .collect();
        let schedule = dry_run::schedule(s, &groups, &after).await?;
        let mut preview: Vec<ExpandedJob> = Vec::new();
        let mut variants = Vec::with_capacity(ready.len());
        for (v, seed, r) in ready {
            variants.push(listed(v, seed, r.expanded.len() as u64, None));
            let room = PREVIEW_MAX.saturating_sub(preview.len());
            preview.extend(r.expanded.into_iter().take(room));
        }
        return Ok(ApiJson(SubmitResponse {
            experiment: None,
            name: study.name,
            seed: study_seed,
            jobs,
            dry_run: true,
            preview_omitted: jobs - preview.len() as u64,
            preview: Some(preview),
            warnings,
            study: None,
            variants,
            schedule: Some(schedule),
        }));
    }
    let id = StudyId::new();
    let of = StudyOf {
        id,
        name: study.name.clone(),
    };
    let mut exps = Vec::with_capacity(ready.len());
    let mut counts = Vec::with_capacity(ready.len());
    for (v, seed, r) in ready {
        let mut exp =
            crate::matrix::new_experiment(&v.spec, r.expanded, seed, who.name.clone(), r.source)
                .map_err(|e| v.refusal(e))?;
        exp.study = Some(of.clone());
        counts.push((v, seed, exp.jobs.len() as u64, exp.id));
        exps.push(exp);
    }
    let deps = crate::matrix::dependencies(&study, &exps)?;
    s.store.create_study(exps, deps).await?;
    tracing::info!(study = %id, name = %study.name, variants = counts.len(), jobs, by = %who.name, "study submitted");
    Ok(ApiJson(SubmitResponse {
        experiment: None,
        name: study.name.clone(),
        seed: study_seed,
        jobs,
        dry_run: false,
        preview: None,
        preview_omitted: 0,
        warnings,
        study: Some(id),
        variants: counts
            .into_iter()
            .map(|(v, seed, n, id)| listed(v, seed, n, Some(id)))
            .collect(),
        schedule: None,
    }))
}

/// The request one variant is resolved with: its own source where the client sent one.
fn variant_request(req: &SubmitRequest, own: Option<&VariantSource>) -> SubmitRequest {
    let mut out = SubmitRequest {
        spec: serde_json::Value::Null,
        seed: req.seed,
        dry_run: req.dry_run,
        workdir: req.workdir.clone(),
        git: req.git.clone(),
        snapshot: req.snapshot.clone(),
        environment: req.environment.clone(),
        variants: Default::default(),
    };
    if let Some(v) = own {
        out.workdir = v.workdir.clone();
        out.git = v.git.clone();
        out.snapshot = v.snapshot.clone();
        out.environment = v.environment.clone();
    }
    out
}

/// A spec checked against this coordinator and expanded: where its jobs run from, its jobs
/// and what may keep them waiting.
struct Ready {
    source: Option<Source>,
    expanded: Vec<ExpandedJob>,
    warnings: Vec<String>,
}

/// A refusal of one spec, to be placed under its variant's field in a study.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("{0:?}")]
    Other(ApiError),
}

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Self {
        Refused::Other(e)
    }
}

impl From<crate::store::StoreError> for Refused {
    fn from(e: crate::store::StoreError) -> Self {
        Refused::Other(e.into())
    }
}

impl From<Refused> for ApiError {
    fn from(r: Refused) -> Self {
        match r {
            Refused::Spec(e) => e.into(),
            Refused::Other(e) => e,
        }
    }
}

impl Refused {
    fn in_variant(self, v: &study::Variant) -> ApiError {
        match self {
            Refused::Spec(e) => v.refusal(e).into(),
            Refused::Other(e) => e,
        }
    }
}

async fn prepare(
    s: &AppState,
    who: &Principal,
    spec: &ExperimentSpec,
    req: &SubmitRequest,
    seed: u64,
    (max_jobs, max_bytes): (u64, u64),
) -> Result<Ready, Refused> {
    let mut source = crate::source::resolve(spec, req)?;
    if let Some(snap) = &mut source.snapshot {
        // Only a bundle the submitter uploaded (its bytes sent, so held): a hash seen in an
        // export runs no one else's code. An admin may name any.
        let by = (who.role != Role::Admin).then(|| who.name.clone());
        snap.bytes = s
            .store
            .bundle_size(snap.hash.clone(), by)
            .await?
            .ok_or_else(|| {
                SpecError::new(
                    "snapshot.hash",
                    format!(
                        "no bundle {} of `{}` is kept here: upload it first (`PUT \
                         /v1/bundles/{{hash}}`)",
                        snap.hash, who.name
                    ),
                )
            })?;
    }
    if let Some(t) = &spec.tracking
        && !s.config.mlflow_allowed(&t.mlflow)
    {
        // The list is not told: an admin's server URLs are not every user's to read.
        return Err(SpecError::new(
            "tracking.mlflow",
            format!(
                "{} is not a tracking server this coordinator may write to (its admin lists \
                 them with --mlflow-servers or HEADROOM_MLFLOW_SERVERS)",
                t.mlflow
            ),
        )
        .into());
    }
    let expanded = expand_within(spec, seed, max_jobs, max_bytes)?;
    if let Some(max) = s.store.max_node_gpus().await?
        && spec.resources.gpus > max
    {
        return Err(SpecError::new(
            "resources.gpus",
            format!(
                "asks for {} GPUs per job but the largest node has {max}",
                spec.resources.gpus
            ),
        )
        .into());
    }
    let warnings = fit_warnings(s, spec).await?;
    Ok(Ready {
        source: (!source.is_empty()).then_some(source),
        expanded,
        warnings,
    })
}

/// What would keep the jobs waiting for ever on the live nodes: a declared memory larger
/// than every live GPU (less headroom). Said at submit as well as in the jobs' reasons.
async fn fit_warnings(s: &AppState, spec: &ExperimentSpec) -> Result<Vec<String>, ApiError> {
    let Some(needed) = spec.resources.memory.map(|m| m.mib) else {
        return Ok(vec![]);
    };
    if spec.resources.gpus == 0 {
        return Ok(vec![]);
    }
    let nodes = s
        .store
        .list_nodes(s.config.lease_ttl.as_millis() as u64)
        .await?;
    let largest = nodes
        .iter()
        .filter(|n| n.alive)
        .flat_map(|n| n.gpus.iter())
        .map(|g| g.total_mib.saturating_sub(g.headroom_mib))
        .max();
    Ok(match largest {
        Some(largest) if needed > largest => vec![format!(
            "resources.memory: {}",
            PendingReason::LargerThanEveryGpu {
                needed_mib: needed,
                largest_mib: largest,
            }
        )],
        _ => vec![],
    })
}
