//! Where a configuration last fit: a run that succeeded at an OOM ladder step takes its
//! configuration's waiting runs, and later submissions of it, to that step.

use super::tx::Tx;
use super::{Result, StoreError, now_ms};
use crate::rules;

/// Takes a job that never ran to ladder step `step`, as its OOM retries would have (its
/// parameters, command and memory key, placed by that key's estimate); `why` is shown.
pub(super) async fn start_at_step(tx: &mut dyn Tx, job: &str, step: u32, why: &str) -> Result<()> {
    let mut r = tx
        .job_rules(job)
        .await?
        .ok_or_else(|| StoreError::not_found("job", job))?;
    let mut last = None;
    while r.ladder_step < step {
        let Some(l) = rules::next_ladder_step(&r)? else {
            break;
        };
        r.params = l.params.clone();
        r.ladder_step = l.ladder_step;
        r.max_attempts = l.max_attempts;
        last = Some(l);
    }
    if let Some(l) = last {
        tx.set_job_ladder(job, &l).await?;
        tx.set_ladder_from(job, why).await?;
    }
    Ok(())
}

/// A run of `job` succeeded at ladder step `step`: its configuration fits there, so its
/// runs that never ran start there (never lower: a step is only raised).
pub(super) async fn spread_fit(tx: &mut dyn Tx, job: &str, step: u32, attempt: &str) -> Result<()> {
    let Some(key) = tx.fit_of_job(job).await? else {
        return Ok(());
    };
    let step = tx.raise_ladder_fit(&key, step, attempt, now_ms()).await?;
    let why = fit_note(step, attempt);
    for other in tx.lock_unstarted_of_key(&key, step).await? {
        start_at_step(tx, &other, step, &why).await?;
    }
    Ok(())
}

/// Why a job starts at a ladder step.
pub(super) fn fit_note(step: u32, attempt: &str) -> String {
    format!(
        "starts at OOM ladder step {step}: a run of this configuration (attempt {attempt}) \
         fit only there"
    )
}
