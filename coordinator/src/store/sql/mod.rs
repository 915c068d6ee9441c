//! The SQL both backends run, written once: every `Tx` statement over `exec::Exec`, the
//! small interface each backend implements (run a statement, its dialect's few words, and
//! the statements only one database does well: batch inserts, advisory locks, arrays).
//!
//! # Layout
//! One file per section of `Tx`: `jobs` (experiments and jobs), `attempts`, `nodes`,
//! `telemetry`, `access` (tokens and users), `logs` (attempt logs), `bundles` (code bundles), `results` (metrics, rungs, tracking), `alerts`; here the helpers they
//! share and the statements
//! a backend also plans in its own tests.
//!
//! Statements use PostgreSQL's `$n` placeholders (SQLite's `Exec` reads them as `?n`), and
//! only SQL both databases speak: `CAST(.. AS TEXT)` where a parameter's type is not implied,
//! `->`/`->>` for JSON, `ON CONFLICT`, `RETURNING`. What differs is in `Dialect`.

use headroom_shared::JobState;

use super::Result;
use super::exec::{Arg, Dialect, Exec, RowRef};
use super::rows::{self, Cols};

/// A statement's parameters: `args![a, b]`.
macro_rules! args {
    ($($a:expr),* $(,)?) => { &[$(Arg::from($a)),*] };
}

/// `args!`, owned: for a statement that takes more after them.
macro_rules! arg_vec {
    ($($a:expr),* $(,)?) => { vec![$(Arg::from($a)),*] };
}

/// The job states `which` holds, as an SQL list (`'queued', 'retrying'`): the state machine
/// says which states those are, not the SQL.
fn states(which: fn(&JobState) -> bool) -> String {
    JobState::ALL
        .iter()
        .filter(|s| which(s))
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The states of a job waiting for a lease (`JobState::is_pending`).
static WAITING: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| states(|s| s.is_pending()));

async fn all<E: Exec + ?Sized, T: Send>(
    e: &mut E,
    sql: &str,
    args: &[Arg<'_>],
    f: impl Fn(&RowRef<'_>) -> Result<T> + Send + Sync,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    e.query(sql, args, &mut |r| {
        out.push(f(r)?);
        Ok(())
    })
    .await?;
    Ok(out)
}

async fn first<E: Exec + ?Sized, T: Send>(
    e: &mut E,
    sql: &str,
    args: &[Arg<'_>],
    f: impl Fn(&RowRef<'_>) -> Result<T> + Send + Sync,
) -> Result<Option<T>> {
    let mut out = None;
    e.query(sql, args, &mut |r| {
        if out.is_none() {
            out = Some(f(r)?);
        }
        Ok(())
    })
    .await?;
    Ok(out)
}

async fn done<E: Exec + ?Sized>(e: &mut E, sql: &str, args: &[Arg<'_>]) -> Result<()> {
    e.execute(sql, args).await.map(drop)
}

fn text(r: &RowRef<'_>) -> Result<String> {
    r.text(0)
}

/// Attempt ids as one JSON argument, for [`in_ids`]: a statement for many rows, not one a row.
fn id_list(ids: &[String]) -> Result<Arg<'static>> {
    let ids: Vec<serde_json::Value> = ids.iter().map(|a| serde_json::json!({ "id": a })).collect();
    super::exec::json(&ids)
}

/// `IN (...)` over the ids of an [`id_list`] given as parameter `param`.
fn in_ids(d: &Dialect, param: u32) -> String {
    format!(
        "IN (SELECT value ->> 'id' FROM {}(${param}))",
        d.json_elements
    )
}

mod access;
mod alerts;
mod attempts;
mod bundles;
mod jobs;
mod logs;
mod nodes;
mod results;
pub(super) mod shares;
mod telemetry;
mod waits;

/// How many jobs of experiment `$1` are in each state, from the index `jobs_experiment_state`
/// alone.
pub(super) const EXPERIMENT_STATE_COUNTS: &str =
    "SELECT state, COUNT(*) FROM jobs WHERE experiment_id = $1 GROUP BY state";

/// How many jobs are in each state.
pub(super) const STATE_COUNTS: &str = "SELECT state, COUNT(*) FROM jobs GROUP BY state";

/// A job of experiment `$1` that has not ended, if any (one probe of `jobs_experiment_state`).
static EXPERIMENT_UNFINISHED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT 1 FROM jobs WHERE experiment_id = $1 AND state IN ({}) LIMIT 1",
        states(|s| !s.is_terminal())
    )
});

/// A job that has not ended, if any (one probe of `jobs_pending`, whose first column is the
/// state).
static UNFINISHED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT 1 FROM jobs WHERE state IN ({}) LIMIT 1",
        states(|s| !s.is_terminal())
    )
});

/// The live attempts of node `$1` (each claim reads them), from the partial index
/// `attempts_live`: not through every attempt the node ever ran. Written once, not at each
/// claim.
pub(super) static ACTIVE_ON: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {} FROM attempts a JOIN jobs j ON j.id = a.job_id \
         WHERE a.node = $1 AND a.phase != 'ended' ORDER BY j.seq",
        rows::ACTIVE_COLUMNS
    )
});

/// Live attempts whose lease ran out before `$1`, read through the partial index of the live
/// attempts (`attempts_live`): no index holds a lease's expiry, so that a renewal writes no
/// index entry.
pub(super) const EXPIRED: &str = "SELECT a.id FROM attempts a JOIN jobs j ON j.id = a.job_id \
     WHERE a.phase != 'ended' AND a.lease_expires_at < $1 ORDER BY j.seq";

/// A memory key's (`$1`) latest observed peaks, at most `$2`, newest first (from the partial
/// index `attempts_key_peaks`), each with the shape its run taught, if any.
pub(super) const LATEST_PEAKS: &str = "SELECT peak_mem_mib, memory_profile FROM attempts \
     WHERE memory_key = $1 AND peak_mem_mib IS NOT NULL \
     AND (oom_cause IS NULL OR oom_cause != 'neighbour_grew') \
     ORDER BY leased_at DESC LIMIT $2";

/// The read of a claim's window of waiting jobs (`$1` the node's GPUs, `$2`, `$3` the cursor,
/// `$4` the window's size), in the order placement considers them: priority, then the longest
/// waiting; a window starts after the last job of the one before. With `$1` zero, only jobs
/// that need no GPU, from their own index (`jobs_waiting_cpu`).
pub(super) fn pending_window(
    dialect: &Dialect,
    cpu_only: bool,
    by_user: bool,
    lock: bool,
) -> String {
    // `gpus = 0` is the CPU index's own predicate, so the database reads from it; `$1` stays
    // named (PostgreSQL types every parameter from the statement). One user's window reads
    // their own index (`$5` the user), which `gpus <= 0` narrows to CPU-only jobs.
    let (index, gpus) = if by_user {
        (
            dialect.waiting_user_index,
            "submitted_by = $5 AND gpus <= $1",
        )
    } else if cpu_only {
        (dialect.waiting_cpu_index, "gpus = 0 AND gpus <= $1")
    } else {
        (dialect.waiting_index, "gpus <= $1")
    };
    format!(
        "SELECT {} FROM jobs{index} WHERE state IN ({}) AND waiting_on = 0 AND {gpus} \
         AND (CAST($2 AS BIGINT) IS NULL OR priority < $2 OR (priority = $2 AND seq > $3)) \
         ORDER BY priority DESC, seq LIMIT $4{}",
        rows::PENDING_COLUMNS,
        *WAITING,
        if lock { dialect.skip_locked } else { "" }
    )
}

#[cfg(test)]
mod tests {
    /// The partial indexes the claim reads its windows from (`jobs_waiting`, migration V14;
    /// `jobs_waiting_cpu`, V15) name the waiting states in their predicates; the database
    /// uses them only while the claim's list is the same.
    #[test]
    fn the_waiting_states_are_those_the_claim_index_holds() {
        assert_eq!(*super::WAITING, "'queued', 'retrying'");
        let migrations = [
            "V14__waiting_order",
            "V15__waiting_cpu_jobs",
            "V25__studies_and_waits",
            "V28__fair_share_and_user_caps",
        ];
        for (backend, migration) in ["postgres", "sqlite"]
            .into_iter()
            .flat_map(|b| migrations.map(|m| (b, m)))
        {
            let path = format!(
                "{}/migrations/{backend}/{migration}.sql",
                env!("CARGO_MANIFEST_DIR")
            );
            let sql = std::fs::read_to_string(&path).expect("the migration");
            assert!(
                sql.contains(&format!("WHERE state IN ({})", *super::WAITING)),
                "{path}"
            );
            // Since studies, the claim's indexes hold only jobs free to start.
            if migration >= "V25" {
                assert!(
                    sql.contains(&format!(
                        "WHERE state IN ({}) AND waiting_on = 0",
                        *super::WAITING
                    )),
                    "{path}"
                );
            }
        }
        // The claim's windows name the indexes' predicate whole (SQLite uses a partial index
        // only then).
        for (cpu_only, by_user) in [(false, false), (true, false), (false, true)] {
            let sql =
                super::pending_window(&crate::store::postgres::DIALECT, cpu_only, by_user, true);
            assert!(
                sql.contains(&format!(
                    "WHERE state IN ({}) AND waiting_on = 0",
                    *super::WAITING
                )),
                "{sql}"
            );
        }
    }
}
