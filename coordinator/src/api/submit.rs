//! Submitting a spec: one experiment, or a study's variants (`experiments:`) stored together
//! in one transaction; a dry run expands and checks the same way and stores nothing.

use axum::Extension;
use axum::extract::State;
use headroom_shared::api::{
    NodeView, Principal, Role, SubmitRequest, SubmitResponse, SubmittedVariant, VariantSource,
};
use headroom_shared::expand::{ExpandedJob, expand_within, expanded_bytes};
use headroom_shared::pending::PendingReason;
use headroom_shared::spec::{ExperimentSpec, SpecError};
use headroom_shared::study::{self, StudySpec};
use headroom_shared::{StudyId, api::source::Source};

use super::{ApiError, ApiJson, ApiResult, AppState, dry_run};
use crate::store::{NewExperiment, StudyOf};

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
    let fleet = Fleet::load(&s, req.dry_run || declares_memory(&spec)).await?;
    let bounds = (s.config.max_jobs, s.config.max_submit_bytes);
    let ready = prepare(&s, &who, &spec, &req, seed, bounds, &fleet).await?;
    let exp = crate::matrix::new_experiment(&spec, ready.expanded, seed, who.name, ready.source)?;
    let count = exp.jobs.len() as u64;
    if req.dry_run {
        let schedule = dry_run::schedule(&s, &fleet.live, std::slice::from_ref(&exp), &[]).await?;
        let (preview, preview_omitted) = preview_of(std::slice::from_ref(&exp));
        return Ok(ApiJson(SubmitResponse {
            experiment: None,
            name: spec.name,
            seed,
            jobs: count,
            dry_run: true,
            preview_omitted,
            preview: Some(preview),
            warnings: ready.warnings,
            study: None,
            variants: vec![],
            schedule: Some(schedule),
        }));
    }
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
    let need_live = req.dry_run || study.variants.iter().any(|v| declares_memory(&v.spec));
    let fleet = Fleet::load(s, need_live).await?;
    // The jobs and bytes one submission may hold are the study's, shared by its variants.
    let (mut jobs_left, mut bytes_left) = (s.config.max_jobs, s.config.max_submit_bytes);
    let id = StudyId::new();
    let of = StudyOf {
        id,
        name: study.name.clone(),
    };
    let mut exps = Vec::with_capacity(study.variants.len());
    let mut listed = Vec::with_capacity(study.variants.len());
    let mut warnings = Vec::new();
    for v in &study.variants {
        let vreq = variant_request(&req, req.variants.get(&v.name));
        let seed = req.seed.or(v.spec.seed).unwrap_or(study_seed);
        let r = prepare(
            s,
            &who,
            &v.spec,
            &vreq,
            seed,
            (jobs_left, bytes_left),
            &fleet,
        )
        .await
        .map_err(|e| e.in_variant(v))?;
        jobs_left -= r.expanded.len() as u64;
        bytes_left = bytes_left.saturating_sub(expanded_bytes(&v.spec, &r.expanded));
        warnings.extend(r.warnings.iter().map(|w| format!("{}: {w}", v.name)));
        let mut exp =
            crate::matrix::new_experiment(&v.spec, r.expanded, seed, who.name.clone(), r.source)
                .map_err(|e| v.refusal(e))?;
        exp.study = Some(of.clone());
        listed.push(SubmittedVariant {
            variant: v.name.clone(),
            name: v.spec.name.clone(),
            experiment: (!req.dry_run).then_some(exp.id),
            jobs: exp.jobs.len() as u64,
            seed,
            gpus: v.spec.resources.gpus,
            memory: v.spec.resources.memory,
            memory_key: v.spec.memory_key.clone(),
            after: v.after.iter().map(|a| a.experiment.clone()).collect(),
            expected_ms: None,
            expected_from: None,
        });
        exps.push(exp);
    }
    let jobs: u64 = exps.iter().map(|e| e.jobs.len() as u64).sum();
    let waits = crate::matrix::dependencies(&study, &exps)?;
    // The preview in the file's order; the jobs queued longest first (the store gives jobs
    // their queue places in the order their experiments are stored).
    let preview = req.dry_run.then(|| preview_of(&exps));
    // Queued longest first: by each variant's declared length, else what its configurations'
    // earlier runs took (an earlier submission of the same names).
    let declared = study
        .variants
        .iter()
        .map(|v| {
            let d = v.spec.expected_duration().map_err(|e| v.refusal(e))?;
            Ok(d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
        })
        .collect::<Result<Vec<_>, SpecError>>()?;
    let keys = crate::matrix::keys_to_learn_lengths(&declared, &exps);
    let learned = if keys.is_empty() {
        Default::default()
    } else {
        s.store.key_durations(keys).await?
    };
    let expected = crate::matrix::expected_lengths(&declared, &exps, &learned);
    for (v, e) in listed.iter_mut().zip(&expected) {
        v.expected_ms = e.map(|(ms, _)| ms);
        v.expected_from = e.map(|(_, from)| from);
    }
    let order: Vec<Option<u64>> = expected.iter().map(|e| e.map(|(ms, _)| ms)).collect();
    let mut exps: Vec<Option<NewExperiment>> = exps.into_iter().map(Some).collect();
    let exps: Vec<NewExperiment> = study::queue_order(&order)
        .into_iter()
        .filter_map(|i| exps.get_mut(i).and_then(Option::take))
        .collect();
    if req.dry_run {
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
        let schedule = dry_run::schedule(s, &fleet.live, &exps, &after).await?;
        let (preview, preview_omitted) = preview.unwrap_or_default();
        return Ok(ApiJson(SubmitResponse {
            experiment: None,
            name: study.name,
            seed: study_seed,
            jobs,
            dry_run: true,
            preview_omitted,
            preview: Some(preview),
            warnings,
            study: None,
            variants: listed,
            schedule: Some(schedule),
        }));
    }
    s.store.create_study(exps, waits).await?;
    tracing::info!(study = %id, name = %study.name, variants = listed.len(), jobs, by = %who.name, "study submitted");
    Ok(ApiJson(SubmitResponse {
        experiment: None,
        name: study.name,
        seed: study_seed,
        jobs,
        dry_run: false,
        preview: None,
        preview_omitted: 0,
        warnings,
        study: Some(id),
        variants: listed,
        schedule: None,
    }))
}

/// A dry run's answer is bounded too: the first jobs as expanded, and how many more there are.
fn preview_of(exps: &[NewExperiment]) -> (Vec<ExpandedJob>, u64) {
    let all = exps.iter().flat_map(|e| e.jobs.iter());
    let preview: Vec<ExpandedJob> = all
        .clone()
        .take(PREVIEW_MAX)
        .map(|j| ExpandedJob {
            index: j.index,
            config: j.config,
            run: j.run,
            params: j.params.clone(),
            argv: j.argv.clone(),
            background: j.background.clone(),
        })
        .collect();
    let omitted = (all.count() - preview.len()) as u64;
    (preview, omitted)
}

/// Whether a spec's jobs declare GPU memory (checked against the live GPUs at submit).
fn declares_memory(spec: &ExperimentSpec) -> bool {
    spec.resources.memory.is_some() && spec.resources.gpus > 0
}

/// What a submission checks its specs against, read once: the largest GPU count of any known
/// node, and the live nodes (their GPUs and plans) where a dry run or a declared memory
/// needs them (a node's view is not read for every submit of a large cluster).
struct Fleet {
    max_gpus: Option<u32>,
    live: Vec<NodeView>,
}

impl Fleet {
    async fn load(s: &AppState, live_too: bool) -> Result<Self, ApiError> {
        let max_gpus = s.store.max_node_gpus().await?;
        let mut live = Vec::new();
        if live_too {
            live = s
                .store
                .list_nodes(s.config.lease_ttl.as_millis() as u64)
                .await?;
            live.retain(|n| n.alive);
        }
        Ok(Self { max_gpus, live })
    }

    /// The most memory any live GPU offers, less headroom.
    fn largest_usable_mib(&self) -> Option<u64> {
        self.live
            .iter()
            .flat_map(|n| n.gpus.iter())
            .map(|g| g.total_mib.saturating_sub(g.headroom_mib))
            .max()
    }
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
    fleet: &Fleet,
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
    if let Some(max) = fleet.max_gpus
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
    let warnings = fit_warnings(spec, fleet);
    Ok(Ready {
        source: (!source.is_empty()).then_some(source),
        expanded,
        warnings,
    })
}

/// What would keep the jobs waiting for ever on the live nodes: a declared memory larger
/// than every live GPU (less headroom). Said at submit as well as in the jobs' reasons.
fn fit_warnings(spec: &ExperimentSpec, fleet: &Fleet) -> Vec<String> {
    let Some(needed) = spec.resources.memory.map(|m| m.mib) else {
        return vec![];
    };
    match fleet.largest_usable_mib() {
        Some(largest) if declares_memory(spec) && needed > largest => vec![format!(
            "resources.memory: {}",
            PendingReason::LargerThanEveryGpu {
                needed_mib: needed,
                largest_mib: largest,
            }
        )],
        _ => vec![],
    }
}
