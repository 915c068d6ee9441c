//! The PostgreSQL store for clusters: a connection pool, one transaction per method, row
//! locks so several coordinator replicas can serve one database, and LISTEN/NOTIFY so a
//! change made through one replica wakes the long-polls of the others.
//!
//! Same semantics as the SQLite backend, statement for statement. Where SQLite relies on
//! its single writer, this backend locks rows, always in the order node -> jobs (by `seq`)
//! -> attempts, so concurrent transactions wait for each other instead of deadlocking.

use std::collections::{BTreeMap, HashMap};
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, Transaction,
};
use headroom_shared::api::{
    AttemptPhase, AttemptRef, AttemptView, ExperimentSummary, FinishReport, GpuInfo, GpuSample,
    Headroom, JobDetail, JobSummary, Lease, NodeView, QuarantineView, StateCounts,
};
use headroom_shared::{
    AgentId, AttemptId, ExperimentId, FailureClass, JobEvent, JobId, JobState, Plan,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::types::{FromSql, Json, ToSql};
use tokio_postgres::{AsyncMessage, Client, Connection, IsolationLevel, NoTls, Row, Socket};
use tokio_util::sync::CancellationToken;

use super::{
    AVOID_AFTER_HAND_BACK_MS, Active, ClaimInput, Claimed, ExportRow, JobFilter, Millis,
    NewExperiment, OOM_BUMP, OnChange, Registered, Registration, Renewed, Result, Store,
    StoreError, effective_estimate, gpu_views, node_snapshot, now_ms, retry_allowed,
};
use crate::placement::{self, Candidate};

mod embedded {
    refinery::embed_migrations!("migrations/postgres");
}

/// Pending jobs looked at (and locked) per claim; deeper ones wait for the next claim.
const CLAIM_WINDOW: i64 = 512;
/// Most pooled connections per coordinator; a request waits for a free one.
const POOL_SIZE: usize = 16;
/// A database that does not answer within this fails the request (503, the client retries)
/// instead of holding it forever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POOL_WAIT: Duration = Duration::from_secs(10);
/// The channel every state change is announced on.
const CHANNEL: &str = "headroom_changes";
/// Session advisory lock held while migrating, so replicas starting together migrate once.
const MIGRATION_LOCK: i64 = 0x6865_6164_726f_6f6d; // "headroom"
/// Reconnect backoff of the change listener.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// The listener pings its connection this often: a silently dead connection (a network
/// partition, not a clean close) would otherwise miss notifications until TCP gives up.
const PING_EVERY: Duration = Duration::from_secs(15);
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// `application_name` of the listener's connection, to find it in `pg_stat_activity`.
pub const LISTENER_APPLICATION_NAME: &str = "headroom-listen";

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    config: tokio_postgres::Config,
    /// Payload of this store's notifications: its own are skipped by its listener, since
    /// the API already woke this process's waiters.
    origin: String,
}

fn db_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        StoreError::Database(db_error(&e))
    }
}

impl From<PoolError> for StoreError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Backend(e) => e.into(),
            e => StoreError::Database(format!("connection pool: {e}")),
        }
    }
}

/// A connection URL with its password masked, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

type TxFuture<'t, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 't>>;

impl PostgresStore {
    /// Connects a pool to `url` (`postgres://user:password@host:port/dbname?...`) and runs
    /// pending migrations.
    pub async fn connect(url: &str) -> Result<Self> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            StoreError::Database(format!("bad database URL `{}`: {e}", redact_url(url)))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("headroom-coordinator");
        }
        migrate(&config).await?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                // A connection whose socket closed (database restart) is dropped on checkout.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Database(format!("connection pool: {e}")))?;
        Ok(Self {
            pool,
            config,
            origin: uuid::Uuid::new_v4().simple().to_string(),
        })
    }

    async fn client(&self) -> Result<Object> {
        Ok(self.pool.get().await?)
    }

    /// Runs `f` in one read-write transaction (READ COMMITTED plus explicit row locks).
    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send,
        F: for<'t> FnOnce(&'t Transaction<'t>) -> TxFuture<'t, T> + Send,
    {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let out = f(&tx).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Runs `f` in one read-only transaction on one snapshot, so a read of several
    /// statements sees one state of the database.
    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send,
        F: for<'t> FnOnce(&'t Transaction<'t>) -> TxFuture<'t, T> + Send,
    {
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let out = f(&tx).await?;
        tx.commit().await?;
        Ok(out)
    }
}

/// Runs pending migrations on a connection of its own, under an advisory lock.
async fn migrate(config: &tokio_postgres::Config) -> Result<()> {
    let (mut client, connection) = config.connect(NoTls).await?;
    let driver = tokio::spawn(connection);
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let report = embedded::migrations::runner().run_async(&mut client).await;
    // Closing the session releases the lock too; unlocking first is just tidier.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    drop(client);
    let _ = driver.await;
    report.map_err(|e| StoreError::Database(format!("migration failed: {e}")))?;
    unlocked?;
    Ok(())
}

// ---- statement helpers ------------------------------------------------------------

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

async fn rows(tx: &Transaction<'_>, sql: &str, params: Params<'_>) -> Result<Vec<Row>> {
    let stmt = tx.prepare_cached(sql).await?;
    Ok(tx.query(&stmt, params).await?)
}

async fn row_opt(tx: &Transaction<'_>, sql: &str, params: Params<'_>) -> Result<Option<Row>> {
    let stmt = tx.prepare_cached(sql).await?;
    Ok(tx.query_opt(&stmt, params).await?)
}

async fn row(tx: &Transaction<'_>, sql: &str, params: Params<'_>) -> Result<Row> {
    row_opt(tx, sql, params)
        .await?
        .ok_or_else(|| StoreError::Database(format!("no row returned by `{sql}`")))
}

async fn exec(tx: &Transaction<'_>, sql: &str, params: Params<'_>) -> Result<u64> {
    let stmt = tx.prepare_cached(sql).await?;
    Ok(tx.execute(&stmt, params).await?)
}

/// Announces a change to every replica's listener, delivered when the transaction commits
/// (and not at all if it rolls back).
async fn notify(tx: &Transaction<'_>, origin: &str) -> Result<()> {
    exec(tx, "SELECT pg_notify($1, $2)", &[&CHANNEL, &origin]).await?;
    Ok(())
}

fn get<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i)
        .map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))
}

fn get_json<T: DeserializeOwned>(row: &Row, i: usize) -> Result<T> {
    let Json(v) = get::<Json<T>>(row, i)?;
    Ok(v)
}

fn get_json_opt<T: DeserializeOwned>(row: &Row, i: usize) -> Result<Option<T>> {
    Ok(get::<Option<Json<T>>>(row, i)?.map(|Json(v)| v))
}

fn json<T: Serialize + std::fmt::Debug>(v: &T) -> Json<&T> {
    Json(v)
}

fn ts(ms: Millis) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn parse<T: std::str::FromStr>(s: &str, what: &str) -> Result<T> {
    s.parse()
        .map_err(|_| StoreError::Corrupt(format!("bad {what} `{s}`")))
}

fn opt_u64(v: Option<i64>) -> Option<u64> {
    v.map(|x| x.max(0) as u64)
}

fn opt_i64(v: Option<u64>) -> Option<i64> {
    v.map(|x| x.min(i64::MAX as u64) as i64)
}

fn i64_of(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

// ---- rows -----------------------------------------------------------------------

const JOB_SELECT: &str = "SELECT j.id, j.experiment_id, e.name, j.idx, j.config, j.run, j.state, \
     j.priority, j.params, j.attempts, j.max_attempts, j.gpus, j.estimate_mib, a.node, a.gpus, \
     j.last_failure, j.created_at \
     FROM jobs j JOIN experiments e ON e.id = j.experiment_id \
     LEFT JOIN attempts a ON a.job_id = j.id AND a.number = j.attempts";

fn job_summary(r: &Row) -> Result<JobSummary> {
    Ok(JobSummary {
        id: parse(&get::<String>(r, 0)?, "job id")?,
        experiment: parse(&get::<String>(r, 1)?, "experiment id")?,
        experiment_name: get(r, 2)?,
        index: get::<i64>(r, 3)? as u32,
        config: get::<i64>(r, 4)? as u32,
        run: get::<i64>(r, 5)? as u32,
        state: parse(&get::<String>(r, 6)?, "job state")?,
        priority: get::<i64>(r, 7)? as i32,
        params: get_json(r, 8)?,
        attempts: get::<i64>(r, 9)? as u32,
        max_attempts: get::<i64>(r, 10)? as u32,
        gpus: get::<i64>(r, 11)? as u32,
        estimate_mib: opt_u64(get(r, 12)?),
        node: get(r, 13)?,
        gpu_indices: get_json_opt(r, 14)?.unwrap_or_default(),
        last_failure: match get::<Option<String>>(r, 15)? {
            Some(f) => Some(parse(&f, "failure class")?),
            None => None,
        },
        created_at: ts(get(r, 16)?),
    })
}

const ATTEMPT_SELECT: &str = "SELECT id, job_id, number, node, gpus, fence, phase, leased_at, \
     started_at, ended_at, pid, exit_code, signal, failure_class, estimate_mib, peak_mem_mib, \
     cleanup_ms, cleanup_verified, log_tail, estimate_source, params, ladder_step, contaminated \
     FROM attempts";

fn attempt_view(r: &Row) -> Result<AttemptView> {
    let phase = match get::<String>(r, 6)?.as_str() {
        "leased" => AttemptPhase::Leased,
        "running" => AttemptPhase::Running,
        "ended" => AttemptPhase::Ended,
        other => return Err(StoreError::Corrupt(format!("bad attempt phase `{other}`"))),
    };
    let failure_class: Option<FailureClass> = match get::<Option<String>>(r, 13)? {
        Some(f) => Some(parse(&f, "failure class")?),
        None => None,
    };
    Ok(AttemptView {
        id: parse(&get::<String>(r, 0)?, "attempt id")?,
        job: parse(&get::<String>(r, 1)?, "job id")?,
        number: get::<i64>(r, 2)? as u32,
        node: get(r, 3)?,
        gpus: get_json(r, 4)?,
        fence: get(r, 5)?,
        phase,
        leased_at: ts(get(r, 7)?),
        started_at: get::<Option<i64>>(r, 8)?.map(ts),
        ended_at: get::<Option<i64>>(r, 9)?.map(ts),
        pid: get::<Option<i64>>(r, 10)?.map(|p| p as u32),
        exit_code: get::<Option<i64>>(r, 11)?.map(|c| c as i32),
        signal: get::<Option<i64>>(r, 12)?.map(|s| s as i32),
        success: (phase == AttemptPhase::Ended).then_some(failure_class.is_none()),
        failure_class,
        estimate_mib: opt_u64(get(r, 14)?),
        peak_mem_mib: opt_u64(get(r, 15)?),
        cleanup_ms: opt_u64(get(r, 16)?),
        cleanup_verified: get(r, 17)?,
        log_tail: get(r, 18)?,
        estimate_source: get(r, 19)?,
        params: get_json(r, 20)?,
        ladder_step: get::<i64>(r, 21)? as u32,
        contaminated: get(r, 22)?,
    })
}

// ---- transactions' building blocks --------------------------------------------------

/// Reads a job's state and locks its row until the transaction ends.
async fn lock_job(tx: &Transaction<'_>, job: &str) -> Result<JobState> {
    match row_opt(
        tx,
        "SELECT state FROM jobs WHERE id = $1 FOR UPDATE",
        &[&job],
    )
    .await?
    {
        Some(r) => parse(&get::<String>(&r, 0)?, "job state"),
        None => Err(StoreError::NotFound {
            what: "job",
            id: job.to_string(),
        }),
    }
}

/// The one place this backend changes a job's state: the state machine decides, the update
/// is conditional on the state read, and a lost race is an error, not a silent overwrite.
async fn transition(tx: &Transaction<'_>, job: &str, event: JobEvent) -> Result<JobState> {
    let from = lock_job(tx, job).await?;
    let to = from.on(event)?;
    if to != from {
        let n = exec(
            tx,
            "UPDATE jobs SET state = $1, updated_at = $2 WHERE id = $3 AND state = $4",
            &[&to.as_str(), &now_ms(), &job, &from.as_str()],
        )
        .await?;
        if n != 1 {
            return Err(StoreError::Database(format!(
                "job {job} changed state concurrently"
            )));
        }
    }
    Ok(to)
}

/// Records an active attempt as lost and requeues its job if the policy allows; false when
/// it had already ended (another replica's sweep, or its report, came first).
async fn lose_attempt(tx: &Transaction<'_>, attempt: &str) -> Result<bool> {
    let Some(r) = row_opt(tx, "SELECT job_id FROM attempts WHERE id = $1", &[&attempt]).await?
    else {
        return Ok(false);
    };
    let job: String = get(&r, 0)?;
    lock_job(tx, &job).await?;
    let Some(r) = row_opt(
        tx,
        "UPDATE attempts SET phase = 'ended', ended_at = $1, failure_class = 'lost', \
         log_tail = COALESCE(log_tail, 'lost: the agent went away before reporting an end') \
         WHERE id = $2 AND phase != 'ended' RETURNING started_at",
        &[&now_ms(), &attempt],
    )
    .await?
    else {
        return Ok(false);
    };
    let started: Option<i64> = get(&r, 0)?;
    let r = row(
        tx,
        "SELECT attempts, max_attempts, retry_on FROM jobs WHERE id = $1",
        &[&job],
    )
    .await?;
    let retry_on: Vec<FailureClass> = get_json(&r, 2)?;
    let retry = retry_allowed(
        FailureClass::Lost,
        started.is_some(),
        get::<i64>(&r, 0)? as u32,
        get::<i64>(&r, 1)? as u32,
        &retry_on,
    );
    if started.is_none() {
        // Never ran: it does not use up an attempt.
        exec(
            tx,
            "UPDATE jobs SET max_attempts = max_attempts + 1 WHERE id = $1",
            &[&job],
        )
        .await?;
    }
    exec(
        tx,
        "UPDATE jobs SET last_failure = 'lost' WHERE id = $1",
        &[&job],
    )
    .await?;
    transition(tx, &job, JobEvent::Fail { retry }).await?;
    Ok(true)
}

struct NodeRow {
    name: String,
    gpus: Vec<GpuInfo>,
    plan: Plan,
    headroom: Headroom,
}

/// The agent's node, locked: claims, heartbeats and reports of one node serialize on it.
async fn lock_node_of_agent(tx: &Transaction<'_>, agent: AgentId) -> Result<NodeRow> {
    let r = row_opt(
        tx,
        "SELECT name, gpus, plan, headroom FROM nodes WHERE agent_id = $1 FOR UPDATE",
        &[&agent.to_string()],
    )
    .await?
    .ok_or(StoreError::UnknownAgent { agent })?;
    Ok(NodeRow {
        name: get(&r, 0)?,
        gpus: get_json(&r, 1)?,
        plan: parse(&get::<String>(&r, 2)?, "plan")?,
        headroom: parse(&get::<String>(&r, 3)?, "headroom")?,
    })
}

/// Locks the node an attempt runs on (first, to keep the lock order) and names it.
async fn lock_node_of_attempt(tx: &Transaction<'_>, attempt: AttemptId) -> Result<String> {
    let r = row_opt(
        tx,
        "SELECT n.name FROM nodes n JOIN attempts a ON a.node = n.name WHERE a.id = $1 \
         FOR UPDATE OF n",
        &[&attempt.to_string()],
    )
    .await?
    .ok_or_else(|| StoreError::NotFound {
        what: "attempt",
        id: attempt.to_string(),
    })?;
    get(&r, 0)
}

/// Stores the latest samples; true when some GPU has more free memory than before, which
/// may let a waiting claim (on any replica) place work.
async fn record_telemetry(tx: &Transaction<'_>, node: &str, gpus: &[GpuSample]) -> Result<bool> {
    let before: Vec<GpuSample> =
        match row_opt(tx, "SELECT telemetry FROM nodes WHERE name = $1", &[&node]).await? {
            Some(r) => get_json_opt(&r, 0)?.unwrap_or_default(),
            None => vec![],
        };
    exec(
        tx,
        "UPDATE nodes SET telemetry = $1, last_seen = $2 WHERE name = $3",
        &[&json(&gpus), &now_ms(), &node],
    )
    .await?;
    Ok(gpus.iter().any(|g| {
        before
            .iter()
            .find(|b| b.index == g.index)
            .is_none_or(|b| g.free_mib > b.free_mib)
    }))
}

/// The node's active attempts, in job order: callers that lock their jobs lock them in the
/// order every other multi-job transaction does.
async fn active_on(tx: &Transaction<'_>, node: &str) -> Result<Vec<Active>> {
    rows(
        tx,
        "SELECT a.id, a.gpus, a.estimate_mib FROM attempts a JOIN jobs j ON j.id = a.job_id \
         WHERE a.node = $1 AND a.phase != 'ended' ORDER BY j.seq",
        &[&node],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(Active {
            id: get(r, 0)?,
            gpus: get_json(r, 1)?,
            estimate: opt_u64(get(r, 2)?),
        })
    })
    .collect()
}

/// Checks a report's fencing token, locking the job and then the attempt; returns the job
/// and the attempt's phase.
async fn check_fence(
    tx: &Transaction<'_>,
    attempt: AttemptId,
    fence: i64,
) -> Result<(String, String)> {
    let id = attempt.to_string();
    let not_found = || StoreError::NotFound {
        what: "attempt",
        id: id.clone(),
    };
    let r = row_opt(tx, "SELECT job_id FROM attempts WHERE id = $1", &[&id])
        .await?
        .ok_or_else(not_found)?;
    let job: String = get(&r, 0)?;
    lock_job(tx, &job).await?;
    let r = row_opt(
        tx,
        "SELECT a.phase, a.fence, j.fence FROM attempts a JOIN jobs j ON j.id = a.job_id \
         WHERE a.id = $1 FOR UPDATE OF a",
        &[&id],
    )
    .await?
    .ok_or_else(not_found)?;
    let (phase, a_fence, j_fence): (String, i64, i64) = (get(&r, 0)?, get(&r, 1)?, get(&r, 2)?);
    if phase == "ended" || a_fence != fence || j_fence != fence {
        return Err(StoreError::StaleFence { attempt });
    }
    Ok((job, phase))
}

async fn summaries(tx: &Transaction<'_>, sql: &str, params: Params<'_>) -> Result<Vec<JobSummary>> {
    rows(tx, sql, params)
        .await?
        .iter()
        .map(job_summary)
        .collect()
}

async fn counts_for(tx: &Transaction<'_>, experiment: Option<&str>) -> Result<StateCounts> {
    let mut counts = StateCounts::default();
    for r in rows(
        tx,
        "SELECT state, COUNT(*) FROM jobs WHERE ($1::TEXT IS NULL OR experiment_id = $1::TEXT) \
         GROUP BY state",
        &[&experiment],
    )
    .await?
    {
        counts.add(
            parse(&get::<String>(&r, 0)?, "job state")?,
            get::<i64>(&r, 1)? as u64,
        );
    }
    Ok(counts)
}

async fn experiment_summary(tx: &Transaction<'_>, id: &str) -> Result<ExperimentSummary> {
    let r = row_opt(
        tx,
        "SELECT id, name, seed, created_at FROM experiments WHERE id = $1",
        &[&id],
    )
    .await?
    .ok_or_else(|| StoreError::NotFound {
        what: "experiment",
        id: id.to_string(),
    })?;
    let id: String = get(&r, 0)?;
    Ok(ExperimentSummary {
        counts: counts_for(tx, Some(&id)).await?,
        id: parse(&id, "experiment id")?,
        name: get(&r, 1)?,
        seed: get::<i64>(&r, 2)? as u64,
        created_at: ts(get(&r, 3)?),
    })
}

/// Observed peaks and the OOM floor of a memory key.
async fn key_memory(tx: &Transaction<'_>, key: &str) -> Result<(Vec<u64>, Option<u64>)> {
    let peaks = rows(
        tx,
        "SELECT peak_mem_mib FROM attempts WHERE memory_key = $1 AND peak_mem_mib IS NOT NULL",
        &[&key],
    )
    .await?
    .iter()
    .map(|r| Ok(get::<i64>(r, 0)?.max(0) as u64))
    .collect::<Result<Vec<_>>>()?;
    let floor = match row_opt(
        tx,
        "SELECT floor_mib FROM memory_floors WHERE memory_key = $1",
        &[&key],
    )
    .await?
    {
        Some(r) => opt_u64(Some(get(&r, 0)?)),
        None => None,
    };
    Ok((peaks, floor))
}

/// After an OOM the key's estimate rises at once: the next placement must be safer than
/// this one, whatever the slower statistics say.
async fn raise_floor(tx: &Transaction<'_>, attempt: &str, peak: Option<u64>) -> Result<()> {
    let r = row(
        tx,
        "SELECT memory_key, estimate_mib FROM attempts WHERE id = $1",
        &[&attempt],
    )
    .await?;
    let key: String = get(&r, 0)?;
    let basis = opt_u64(get(&r, 1)?).max(peak);
    if let Some(basis) = basis.filter(|b| *b > 0) {
        let floor = (basis as f64 * OOM_BUMP).ceil() as i64;
        exec(
            tx,
            "INSERT INTO memory_floors (memory_key, floor_mib) VALUES ($1, $2) \
             ON CONFLICT (memory_key) DO UPDATE \
             SET floor_mib = GREATEST(memory_floors.floor_mib, EXCLUDED.floor_mib)",
            &[&key, &floor],
        )
        .await?;
    }
    Ok(())
}

/// Applies the job's next OOM ladder step (parameters and argv); false when none is left.
async fn next_ladder_step(tx: &Transaction<'_>, job: &str) -> Result<bool> {
    let r = row(
        tx,
        "SELECT ladder, ladder_step, params, command, shell, config, run FROM jobs WHERE id = $1",
        &[&job],
    )
    .await?;
    let ladder: Vec<BTreeMap<String, Value>> = get_json(&r, 0)?;
    let step: i64 = get(&r, 1)?;
    let Some(next) = ladder.get(step.max(0) as usize) else {
        return Ok(false);
    };
    let mut params: BTreeMap<String, Value> = get_json(&r, 2)?;
    headroom_shared::spec::apply_ladder_step(&mut params, next);
    let command: Vec<String> = get_json(&r, 3)?;
    let (shell, config, run): (bool, i64, i64) = (get(&r, 4)?, get(&r, 5)?, get(&r, 6)?);
    let argv = headroom_shared::expand::render(&command, shell, &params, config as u32, run as u32)
        .map_err(|e| StoreError::Corrupt(format!("re-rendering the command: {e}")))?;
    exec(
        tx,
        "UPDATE jobs SET params = $1, argv = $2, ladder_step = ladder_step + 1, \
         max_attempts = GREATEST(max_attempts, attempts + 1) WHERE id = $3",
        &[&json(&params), &json(&argv), &job],
    )
    .await?;
    Ok(true)
}

async fn cancel_one(tx: &Transaction<'_>, job: &str) -> Result<u64> {
    if lock_job(tx, job).await?.is_terminal() {
        return Ok(0);
    }
    transition(tx, job, JobEvent::Cancel).await?;
    exec(
        tx,
        "UPDATE attempts SET cancel_requested = TRUE WHERE job_id = $1 AND phase != 'ended'",
        &[&job],
    )
    .await?;
    Ok(1)
}

struct LeaseTo<'a> {
    node: &'a str,
    agent: AgentId,
    now: Millis,
    ttl_ms: u64,
}

async fn lease_job(
    tx: &Transaction<'_>,
    job: &str,
    to: &LeaseTo<'_>,
    gpus: &[u32],
    (estimate, source): (Option<u64>, &'static str),
) -> Result<Lease> {
    let r = row(
        tx,
        "SELECT j.argv, j.env, j.params, e.name, j.memory_key, j.timeout_ms, j.attempts, j.fence, \
         j.ladder_step FROM jobs j JOIN experiments e ON e.id = j.experiment_id WHERE j.id = $1",
        &[&job],
    )
    .await?;
    let params: BTreeMap<String, Value> = get_json(&r, 2)?;
    let memory_key: String = get(&r, 4)?;
    let (attempts, fence, ladder_step): (i64, i64, i64) = (get(&r, 6)?, get(&r, 7)?, get(&r, 8)?);
    let attempt = AttemptId::new();
    let number = attempts + 1;
    let fence = fence + 1;
    let gpus_json = gpus.to_vec();
    exec(
        tx,
        "INSERT INTO attempts (id, job_id, number, node, agent_id, gpus, fence, phase, \
         estimate_mib, leased_at, lease_expires_at, memory_key, estimate_source, params, \
         ladder_step) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'leased', $8, $9, $10, $11, $12, $13, $14)",
        &[
            &attempt.to_string(),
            &job,
            &number,
            &to.node,
            &to.agent.to_string(),
            &json(&gpus_json),
            &fence,
            &opt_i64(estimate),
            &to.now,
            &(to.now.saturating_add(i64_of(to.ttl_ms))),
            &memory_key,
            &source,
            &json(&params),
            &ladder_step,
        ],
    )
    .await?;
    exec(
        tx,
        "UPDATE jobs SET attempts = $1, fence = $2 WHERE id = $3",
        &[&number, &fence, &job],
    )
    .await?;
    transition(tx, job, JobEvent::Lease).await?;
    Ok(Lease {
        attempt,
        job: parse(job, "job id")?,
        fence,
        number: number as u32,
        experiment: get(&r, 3)?,
        argv: get_json(&r, 0)?,
        env: get_json(&r, 1)?,
        params,
        gpus: gpus.to_vec(),
        estimate_mib: estimate,
        timeout_ms: opt_u64(get(&r, 5)?),
    })
}

// ---- change listener --------------------------------------------------------------

/// Polls the listener's connection: notifications arrive only while it is polled. Returns
/// why the connection ended.
async fn deliver(
    connection: &mut Connection<Socket, NoTlsStream>,
    origin: &str,
    on_change: &OnChange,
) -> String {
    loop {
        match poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(n))) => {
                if n.payload() != origin {
                    on_change();
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return db_error(&e),
            None => return "connection closed".into(),
        }
    }
}

/// Subscribes, then pings until the connection fails; returns why.
async fn subscribe(client: &Client, on_change: &OnChange, backoff: &mut Duration) -> String {
    if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
        return db_error(&e);
    }
    *backoff = BACKOFF_MIN;
    // Changes made while no one listened were never delivered: wake the waiters once.
    on_change();
    let mut tick = tokio::time::interval(PING_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        match tokio::time::timeout(PING_TIMEOUT, client.simple_query("SELECT 1")).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return db_error(&e),
            Err(_) => return "ping timed out".into(),
        }
    }
}

/// One listening session on a dedicated connection; returns why it ended.
async fn listen_once(
    config: &tokio_postgres::Config,
    origin: &str,
    on_change: &OnChange,
    backoff: &mut Duration,
) -> String {
    let mut config = config.clone();
    config.application_name(LISTENER_APPLICATION_NAME);
    let (client, mut connection) = match config.connect(NoTls).await {
        Ok(c) => c,
        Err(e) => return db_error(&e),
    };
    let delivered = pin!(deliver(&mut connection, origin, on_change));
    let subscribed = pin!(subscribe(&client, on_change, backoff));
    tokio::select! {
        why = delivered => why,
        why = subscribed => why,
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn schema_version(&self) -> Result<i64> {
        self.read(|tx| {
            Box::pin(async move {
                let r = row(
                    tx,
                    "SELECT COALESCE(MAX(version), 0)::BIGINT FROM refinery_schema_history",
                    &[],
                )
                .await?;
                get(&r, 0)
            })
        })
        .await
    }

    async fn create_experiment(&self, exp: NewExperiment) -> Result<ExperimentSummary> {
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let now = now_ms();
                let id = exp.id.to_string();
                exec(
                    tx,
                    "INSERT INTO experiments (id, name, seed, spec, created_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                    &[&id, &exp.name, &(exp.seed as i64), &json(&exp.spec), &now],
                )
                .await?;
                // One statement for the whole matrix: a row per job from parallel arrays.
                let jobs = &exp.jobs;
                let ids: Vec<String> = jobs.iter().map(|j| j.id.to_string()).collect();
                let idx: Vec<i64> = jobs.iter().map(|j| i64::from(j.index)).collect();
                let config: Vec<i64> = jobs.iter().map(|j| i64::from(j.config)).collect();
                let run: Vec<i64> = jobs.iter().map(|j| i64::from(j.run)).collect();
                let priority: Vec<i64> = jobs.iter().map(|j| i64::from(j.priority)).collect();
                let params: Vec<_> = jobs.iter().map(|j| json(&j.params)).collect();
                let argv: Vec<_> = jobs.iter().map(|j| json(&j.argv)).collect();
                let env: Vec<_> = jobs.iter().map(|j| json(&j.env)).collect();
                let profile: Vec<&str> = jobs.iter().map(|j| j.profile.as_str()).collect();
                let gpus: Vec<i64> = jobs.iter().map(|j| i64::from(j.gpus)).collect();
                let estimate: Vec<Option<i64>> =
                    jobs.iter().map(|j| opt_i64(j.estimate_mib)).collect();
                let timeout: Vec<Option<i64>> =
                    jobs.iter().map(|j| opt_i64(j.timeout_ms)).collect();
                let max_attempts: Vec<i64> =
                    jobs.iter().map(|j| i64::from(j.max_attempts)).collect();
                let retry_on: Vec<_> = jobs.iter().map(|j| json(&j.retry_on)).collect();
                let memory_key: Vec<&str> = jobs.iter().map(|j| j.memory_key.as_str()).collect();
                let command: Vec<_> = jobs.iter().map(|j| json(&j.command)).collect();
                let shell: Vec<bool> = jobs.iter().map(|j| j.shell).collect();
                let ladder: Vec<_> = jobs.iter().map(|j| json(&j.oom_ladder)).collect();
                exec(
                    tx,
                    "INSERT INTO jobs (id, experiment_id, idx, config, run, state, priority, \
                     params, argv, env, profile, gpus, estimate_mib, timeout_ms, max_attempts, \
                     retry_on, created_at, updated_at, memory_key, command, shell, ladder) \
                     SELECT u.id, $1, u.idx, u.config, u.run, 'queued', u.priority, u.params, \
                     u.argv, u.env, u.profile, u.gpus, u.estimate_mib, u.timeout_ms, \
                     u.max_attempts, u.retry_on, $2, $2, u.memory_key, u.command, u.shell, \
                     u.ladder \
                     FROM UNNEST($3::TEXT[], $4::BIGINT[], $5::BIGINT[], $6::BIGINT[], \
                     $7::BIGINT[], $8::JSONB[], $9::JSONB[], $10::JSONB[], $11::TEXT[], \
                     $12::BIGINT[], $13::BIGINT[], $14::BIGINT[], $15::BIGINT[], $16::JSONB[], \
                     $17::TEXT[], $18::JSONB[], $19::BOOLEAN[], $20::JSONB[]) WITH ORDINALITY \
                     AS u(id, idx, config, run, priority, params, argv, env, profile, gpus, \
                     estimate_mib, timeout_ms, max_attempts, retry_on, memory_key, command, \
                     shell, ladder, ord) \
                     ORDER BY u.ord",
                    &[
                        &id,
                        &now,
                        &ids,
                        &idx,
                        &config,
                        &run,
                        &priority,
                        &params,
                        &argv,
                        &env,
                        &profile,
                        &gpus,
                        &estimate,
                        &timeout,
                        &max_attempts,
                        &retry_on,
                        &memory_key,
                        &command,
                        &shell,
                        &ladder,
                    ],
                )
                .await?;
                notify(tx, &origin).await?;
                experiment_summary(tx, &id).await
            })
        })
        .await
    }

    async fn list_experiments(&self) -> Result<Vec<ExperimentSummary>> {
        self.read(|tx| {
            Box::pin(async move {
                let ids = rows(
                    tx,
                    "SELECT id FROM experiments ORDER BY created_at, id",
                    &[],
                )
                .await?
                .iter()
                .map(|r| get::<String>(r, 0))
                .collect::<Result<Vec<_>>>()?;
                let mut out = Vec::with_capacity(ids.len());
                for id in ids {
                    out.push(experiment_summary(tx, &id).await?);
                }
                Ok(out)
            })
        })
        .await
    }

    async fn experiment(&self, id: ExperimentId) -> Result<ExperimentSummary> {
        self.read(move |tx| Box::pin(async move { experiment_summary(tx, &id.to_string()).await }))
            .await
    }

    async fn counts(&self, experiment: Option<ExperimentId>) -> Result<StateCounts> {
        self.read(move |tx| {
            Box::pin(async move {
                let id = experiment.map(|e| e.to_string());
                counts_for(tx, id.as_deref()).await
            })
        })
        .await
    }

    async fn list_jobs(&self, filter: JobFilter) -> Result<Vec<JobSummary>> {
        self.read(move |tx| {
            Box::pin(async move {
                let sql = format!(
                    "{JOB_SELECT} WHERE ($1::TEXT IS NULL OR j.experiment_id = $1::TEXT) \
                     AND ($2::TEXT IS NULL OR j.state = $2::TEXT) ORDER BY j.seq LIMIT $3"
                );
                let exp = filter.experiment.map(|e| e.to_string());
                let state = filter.state.map(|s| s.as_str());
                // LIMIT NULL is no limit.
                let limit = filter.limit.map(i64::from);
                summaries(tx, &sql, &[&exp, &state, &limit]).await
            })
        })
        .await
    }

    async fn job(&self, id: JobId) -> Result<JobDetail> {
        self.read(move |tx| {
            Box::pin(async move {
                let id = id.to_string();
                let not_found = || StoreError::NotFound {
                    what: "job",
                    id: id.clone(),
                };
                let summary = summaries(tx, &format!("{JOB_SELECT} WHERE j.id = $1"), &[&id])
                    .await?
                    .pop()
                    .ok_or_else(not_found)?;
                let r = row_opt(
                    tx,
                    "SELECT argv, env, profile, timeout_ms, retry_on, memory_key, ladder, \
                     ladder_step FROM jobs WHERE id = $1",
                    &[&id],
                )
                .await?
                .ok_or_else(not_found)?;
                let attempts_detail = rows(
                    tx,
                    &format!("{ATTEMPT_SELECT} WHERE job_id = $1 ORDER BY number"),
                    &[&id],
                )
                .await?
                .iter()
                .map(attempt_view)
                .collect::<Result<_>>()?;
                Ok(JobDetail {
                    summary,
                    argv: get_json(&r, 0)?,
                    env: get_json(&r, 1)?,
                    profile: get(&r, 2)?,
                    timeout_ms: opt_u64(get(&r, 3)?),
                    retry_on: get_json(&r, 4)?,
                    memory_key: get(&r, 5)?,
                    oom_ladder: get_json(&r, 6)?,
                    ladder_step: get::<i64>(&r, 7)? as u32,
                    attempts_detail,
                })
            })
        })
        .await
    }

    async fn attempt(&self, id: AttemptId) -> Result<AttemptView> {
        self.read(move |tx| {
            Box::pin(async move {
                let r = row_opt(
                    tx,
                    &format!("{ATTEMPT_SELECT} WHERE id = $1"),
                    &[&id.to_string()],
                )
                .await?
                .ok_or_else(|| StoreError::NotFound {
                    what: "attempt",
                    id: id.to_string(),
                })?;
                attempt_view(&r)
            })
        })
        .await
    }

    async fn cancel_job(&self, id: JobId) -> Result<u64> {
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let n = cancel_one(tx, &id.to_string()).await?;
                if n > 0 {
                    notify(tx, &origin).await?;
                }
                Ok(n)
            })
        })
        .await
    }

    async fn cancel_experiment(&self, id: ExperimentId) -> Result<u64> {
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let id = id.to_string();
                experiment_summary(tx, &id).await?;
                let jobs = rows(
                    tx,
                    "SELECT id FROM jobs WHERE experiment_id = $1 \
                     AND state NOT IN ('succeeded', 'failed', 'cancelled') ORDER BY seq",
                    &[&id],
                )
                .await?;
                let mut n = 0;
                for job in &jobs {
                    n += cancel_one(tx, &get::<String>(job, 0)?).await?;
                }
                if n > 0 {
                    notify(tx, &origin).await?;
                }
                Ok(n)
            })
        })
        .await
    }

    async fn retry_job(&self, id: JobId) -> Result<JobState> {
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let id = id.to_string();
                let state = transition(tx, &id, JobEvent::Retry).await?;
                // One more attempt than used so far: a manual retry is one new try.
                exec(
                    tx,
                    "UPDATE jobs SET max_attempts = attempts + 1 WHERE id = $1",
                    &[&id],
                )
                .await?;
                notify(tx, &origin).await?;
                Ok(state)
            })
        })
        .await
    }

    async fn export_rows(&self, experiment: Option<ExperimentId>) -> Result<Vec<ExportRow>> {
        self.read(move |tx| {
            Box::pin(async move {
                let exp = experiment.map(|e| e.to_string());
                let jobs = summaries(
                    tx,
                    &format!(
                        "{JOB_SELECT} WHERE ($1::TEXT IS NULL OR j.experiment_id = $1::TEXT) \
                         ORDER BY j.seq"
                    ),
                    &[&exp],
                )
                .await?;
                let attempts = rows(
                    tx,
                    &format!(
                        "{ATTEMPT_SELECT} WHERE job_id IN (SELECT id FROM jobs \
                         WHERE $1::TEXT IS NULL OR experiment_id = $1::TEXT) ORDER BY number"
                    ),
                    &[&exp],
                )
                .await?
                .iter()
                .map(attempt_view)
                .collect::<Result<Vec<_>>>()?;
                Ok(super::export_rows(jobs, attempts))
            })
        })
        .await
    }

    async fn register_agent(&self, reg: Registration) -> Result<Registered> {
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let now = now_ms();
                let stored = match row_opt(
                    tx,
                    "SELECT plan, headroom FROM nodes WHERE name = $1 FOR UPDATE",
                    &[&reg.node],
                )
                .await?
                {
                    Some(r) => Some((get::<String>(&r, 0)?, get::<String>(&r, 1)?)),
                    None => None,
                };
                let n_gpus = reg.gpus.len();
                let plan = match (&reg.plan, &stored) {
                    (Some(p), _) => {
                        p.check_gpus(n_gpus)?;
                        p.clone()
                    }
                    // Keep the stored plan unless the node's GPUs changed under it.
                    (None, Some((p, _))) => match Plan::parse_for(p, n_gpus) {
                        Ok(p) => p,
                        Err(_) => Plan::one_per_gpu(n_gpus),
                    },
                    (None, None) => Plan::one_per_gpu(n_gpus),
                };
                let headroom = match (reg.headroom, &stored) {
                    (Some(h), _) => h,
                    (None, Some((_, h))) => parse(h, "headroom")?,
                    (None, None) => Headroom::default(),
                };
                exec(
                    tx,
                    "INSERT INTO nodes (name, agent_id, gpus, plan, headroom, last_seen, \
                     registered_at) VALUES ($1, $2, $3, $4, $5, $6, $6) \
                     ON CONFLICT (name) DO UPDATE SET agent_id = $2, gpus = $3, plan = $4, \
                     headroom = $5, last_seen = $6, registered_at = $6, telemetry = NULL",
                    &[
                        &reg.node,
                        &reg.agent.to_string(),
                        &json(&reg.gpus),
                        &plan.to_string(),
                        &headroom.to_string(),
                        &now,
                    ],
                )
                .await?;
                // Attempts the agent still runs with a current token stay its own; the rest
                // belonged to an incarnation that is gone.
                let until = now.saturating_add(i64_of(reg.lease_ttl_ms));
                let mut lost = Vec::new();
                for a in active_on(tx, &reg.node).await? {
                    let presented = reg.resume.iter().find(|r| r.attempt.to_string() == a.id);
                    let resumed = match presented {
                        Some(r) => {
                            exec(
                                tx,
                                "UPDATE attempts SET agent_id = $1, lease_expires_at = $2 \
                                 WHERE id = $3 AND fence = $4 AND phase != 'ended'",
                                &[&reg.agent.to_string(), &until, &a.id, &r.fence],
                            )
                            .await?
                                == 1
                        }
                        None => false,
                    };
                    if !resumed && lose_attempt(tx, &a.id).await? {
                        lost.push(parse(&a.id, "attempt id")?);
                    }
                }
                notify(tx, &origin).await?;
                Ok(Registered { plan, lost })
            })
        })
        .await
    }

    async fn set_plan(&self, node: &str, plan: &str) -> Result<Plan> {
        let (node, plan) = (node.to_string(), plan.to_string());
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let r = row_opt(
                    tx,
                    "SELECT gpus FROM nodes WHERE name = $1 FOR UPDATE",
                    &[&node],
                )
                .await?
                .ok_or_else(|| StoreError::NotFound {
                    what: "node",
                    id: node.clone(),
                })?;
                let gpus: Vec<GpuInfo> = get_json(&r, 0)?;
                let plan = Plan::parse_for(&plan, gpus.len())?;
                exec(
                    tx,
                    "UPDATE nodes SET plan = $1 WHERE name = $2",
                    &[&plan.to_string(), &node],
                )
                .await?;
                notify(tx, &origin).await?;
                Ok(plan)
            })
        })
        .await
    }

    async fn list_nodes(&self, alive_within_ms: u64) -> Result<Vec<NodeView>> {
        self.read(move |tx| {
            Box::pin(async move {
                let nodes = rows(
                    tx,
                    "SELECT name, agent_id, gpus, plan, headroom, telemetry, last_seen FROM nodes \
                     ORDER BY name",
                    &[],
                )
                .await?;
                let now = now_ms();
                let mut out = Vec::with_capacity(nodes.len());
                for r in &nodes {
                    let name: String = get(r, 0)?;
                    let agent: Option<String> = get(r, 1)?;
                    let gpus: Vec<GpuInfo> = get_json(r, 2)?;
                    let plan: Plan = parse(&get::<String>(r, 3)?, "plan")?;
                    let headroom: Headroom = parse(&get::<String>(r, 4)?, "headroom")?;
                    let samples: Vec<GpuSample> = get_json_opt(r, 5)?.unwrap_or_default();
                    let last_seen: Option<i64> = get(r, 6)?;
                    let active = active_on(tx, &name).await?;
                    let quarantine = rows(
                        tx,
                        "SELECT gpu, attempt_id, reason, since FROM quarantine WHERE node = $1 \
                         ORDER BY since",
                        &[&name],
                    )
                    .await?
                    .iter()
                    .map(|q| {
                        Ok((
                            get::<i64>(q, 0)? as u32,
                            QuarantineView {
                                attempt: parse(&get::<String>(q, 1)?, "attempt id")?,
                                reason: get(q, 2)?,
                                since: ts(get(q, 3)?),
                            },
                        ))
                    })
                    .collect::<Result<Vec<_>>>()?;
                    let views = gpu_views(&gpus, &plan, &headroom, &samples, &active, &quarantine)?;
                    out.push(NodeView {
                        alive: agent.is_some()
                            && last_seen.is_some_and(|t| now - t <= i64_of(alive_within_ms)),
                        agent: agent.map(|a| parse(&a, "agent id")).transpose()?,
                        name,
                        plan: plan.to_string(),
                        headroom,
                        last_seen: last_seen.map(ts),
                        gpus: views,
                    });
                }
                Ok(out)
            })
        })
        .await
    }

    async fn max_node_gpus(&self) -> Result<Option<u32>> {
        self.read(|tx| {
            Box::pin(async move {
                let r = row(
                    tx,
                    "SELECT MAX(jsonb_array_length(gpus))::BIGINT FROM nodes",
                    &[],
                )
                .await?;
                Ok(get::<Option<i64>>(&r, 0)?.map(|n| n as u32))
            })
        })
        .await
    }

    async fn claim_jobs(&self, input: ClaimInput) -> Result<Claimed> {
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                // Claims for one node serialize on its row: each sees the slots the previous
                // one took.
                let node = lock_node_of_agent(tx, input.agent).await?;
                let samples: Vec<GpuSample> = match input.gpus {
                    Some(g) => {
                        record_telemetry(tx, &node.name, &g).await?;
                        g
                    }
                    None => {
                        let r = row(
                            tx,
                            "SELECT telemetry FROM nodes WHERE name = $1",
                            &[&node.name],
                        )
                        .await?;
                        get_json_opt(&r, 0)?.unwrap_or_default()
                    }
                };
                let now = now_ms();
                let active = active_on(tx, &node.name).await?;
                let quarantined = rows(
                    tx,
                    "SELECT gpu FROM quarantine WHERE node = $1 \
                     UNION SELECT gpu FROM gpu_avoid WHERE node = $1 AND until_ms > $2",
                    &[&node.name, &now],
                )
                .await?
                .iter()
                .map(|r| Ok(get::<i64>(r, 0)? as u32))
                .collect::<Result<Vec<u32>>>()?;
                let snapshot = node_snapshot(
                    &node.gpus,
                    &node.plan,
                    &node.headroom,
                    &samples,
                    &active,
                    &quarantined,
                    input.reserve_after_ms,
                );
                if input.max == 0 {
                    return Ok(Claimed {
                        leases: vec![],
                        plan: node.plan,
                    });
                }
                // Rows another replica's claim holds are skipped, not waited for: two nodes
                // never lease the same job, and neither blocks on the other.
                let pending = rows(
                    tx,
                    "SELECT id, gpus, estimate_mib, updated_at, memory_key FROM jobs \
                     WHERE state IN ('queued', 'retrying') AND gpus <= $1 \
                     ORDER BY priority DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED",
                    &[&(node.gpus.len() as i64), &CLAIM_WINDOW],
                )
                .await?
                .iter()
                .map(|r| {
                    Ok((
                        get::<String>(r, 0)?,
                        get::<i64>(r, 1)?,
                        get::<Option<i64>>(r, 2)?,
                        get::<i64>(r, 3)?,
                        get::<String>(r, 4)?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
                // What each memory key has taught so far, read once per key.
                let mut learned: HashMap<&str, (Vec<u64>, Option<u64>)> = HashMap::new();
                for (_, _, _, _, key) in &pending {
                    if !learned.contains_key(key.as_str()) {
                        learned.insert(key, key_memory(tx, key).await?);
                    }
                }
                let estimates: Vec<(Option<u64>, &'static str)> = pending
                    .iter()
                    .map(|(_, _, declared, _, key)| {
                        let (mut peaks, floor) =
                            learned.get(key.as_str()).cloned().unwrap_or_default();
                        effective_estimate(opt_u64(*declared), &mut peaks, floor)
                    })
                    .collect();
                let candidates: Vec<Candidate> = pending
                    .iter()
                    .zip(&estimates)
                    .map(|((_, g, _, t, _), (estimate, _))| Candidate {
                        gpus: *g as u32,
                        estimate_mib: *estimate,
                        waited_ms: (now - t).max(0) as u64,
                    })
                    .collect();
                let placements = placement::place(&snapshot, &candidates, input.max as usize);
                let to = LeaseTo {
                    node: &node.name,
                    agent: input.agent,
                    now,
                    ttl_ms: input.lease_ttl_ms,
                };
                let mut leases = Vec::with_capacity(placements.len());
                for p in placements {
                    let job = &pending[p.candidate].0;
                    leases.push(lease_job(tx, job, &to, &p.gpus, estimates[p.candidate]).await?);
                }
                if !leases.is_empty() {
                    notify(tx, &origin).await?;
                }
                Ok(Claimed {
                    leases,
                    plan: node.plan,
                })
            })
        })
        .await
    }

    async fn pending_cancels(
        &self,
        agent: AgentId,
        watching: &[AttemptId],
    ) -> Result<Vec<AttemptId>> {
        let watching: Vec<String> = watching.iter().map(|a| a.to_string()).collect();
        self.read(move |tx| {
            Box::pin(async move {
                let wanted = rows(
                    tx,
                    "SELECT id FROM attempts WHERE id = ANY($1) AND agent_id = $2 \
                     AND cancel_requested AND phase != 'ended'",
                    &[&watching, &agent.to_string()],
                )
                .await?
                .iter()
                .map(|r| get::<String>(r, 0))
                .collect::<Result<Vec<_>>>()?;
                // In the order the agent asked.
                watching
                    .iter()
                    .filter(|a| wanted.contains(a))
                    .map(|a| parse(a, "attempt id"))
                    .collect()
            })
        })
        .await
    }

    async fn renew_leases(
        &self,
        agent: AgentId,
        attempts: &[AttemptRef],
        gpus: &[GpuSample],
        lease_ttl_ms: u64,
    ) -> Result<Renewed> {
        let (attempts, gpus) = (attempts.to_vec(), gpus.to_vec());
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let node = lock_node_of_agent(tx, agent).await?;
                let freed = record_telemetry(tx, &node.name, &gpus).await?;
                let until = now_ms().saturating_add(i64_of(lease_ttl_ms));
                let (mut cancel, mut stale) = (Vec::new(), Vec::new());
                for a in attempts {
                    let renewed = row_opt(
                        tx,
                        "UPDATE attempts SET lease_expires_at = $1 WHERE id = $2 AND fence = $3 \
                         AND agent_id = $4 AND phase != 'ended' RETURNING cancel_requested",
                        &[&until, &a.attempt.to_string(), &a.fence, &agent.to_string()],
                    )
                    .await?;
                    match renewed {
                        None => stale.push(a.attempt),
                        Some(r) if get::<bool>(&r, 0)? => cancel.push(a.attempt),
                        Some(_) => {}
                    }
                }
                // Renewals change nothing anyone waits for; freed memory may let a claim
                // on another replica place work.
                if freed {
                    notify(tx, &origin).await?;
                }
                Ok(Renewed {
                    cancel,
                    stale,
                    plan: node.plan,
                })
            })
        })
        .await
    }

    async fn start_attempt(
        &self,
        attempt: AttemptId,
        fence: i64,
        pid: u32,
        started_at: Millis,
    ) -> Result<()> {
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let (job, phase) = check_fence(tx, attempt, fence).await?;
                if phase != "leased" {
                    return Ok(()); // a repeated report
                }
                exec(
                    tx,
                    "UPDATE attempts SET phase = 'running', pid = $1, started_at = $2 \
                     WHERE id = $3",
                    &[&i64::from(pid), &started_at, &attempt.to_string()],
                )
                .await?;
                if lock_job(tx, &job).await? != JobState::Cancelled {
                    transition(tx, &job, JobEvent::Start).await?;
                }
                notify(tx, &origin).await
            })
        })
        .await
    }

    async fn finish_attempt(&self, attempt: AttemptId, report: FinishReport) -> Result<JobState> {
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let node = lock_node_of_attempt(tx, attempt).await?;
                let (job, _) = check_fence(tx, attempt, report.fence).await?;
                let id = attempt.to_string();
                let ended_at = report.ended_at.timestamp_millis();
                let gpus = row(
                    tx,
                    "UPDATE attempts SET phase = 'ended', ended_at = $1, exit_code = $2, \
                     signal = $3, failure_class = $4, peak_mem_mib = $5, cleanup_ms = $6, \
                     cleanup_verified = $7, log_tail = $8, started_at = COALESCE(started_at, $1), \
                     contaminated = $10 WHERE id = $9 RETURNING gpus",
                    &[
                        &ended_at,
                        &report.exit_code.map(i64::from),
                        &report.signal.map(i64::from),
                        &report.failure.map(|f| f.as_str()),
                        &opt_i64(report.peak_mem_mib),
                        &i64_of(report.cleanup_ms),
                        &report.cleanup_verified,
                        &report.log_tail,
                        &id,
                        &report.contaminated,
                    ],
                )
                .await?;
                if !report.gpus.is_empty() {
                    record_telemetry(tx, &node, &report.gpus).await?;
                }
                if !report.cleanup_verified {
                    let reason = report
                        .unverified
                        .clone()
                        .unwrap_or_else(|| "cleanup could not be verified".into());
                    for gpu in get_json::<Vec<u32>>(&gpus, 0)? {
                        exec(
                            tx,
                            "INSERT INTO quarantine (node, gpu, attempt_id, reason, since) \
                             VALUES ($1, $2, $3, $4, $5) \
                             ON CONFLICT (node, gpu, attempt_id) \
                             DO UPDATE SET reason = EXCLUDED.reason, since = EXCLUDED.since",
                            &[&node, &i64::from(gpu), &id, &reason, &now_ms()],
                        )
                        .await?;
                    }
                }
                let event = match report.failure {
                    None => JobEvent::Succeed,
                    Some(class) => {
                        let r = row(
                            tx,
                            "SELECT attempts, max_attempts, retry_on FROM jobs WHERE id = $1",
                            &[&job],
                        )
                        .await?;
                        let retry_on: Vec<FailureClass> = get_json(&r, 2)?;
                        exec(
                            tx,
                            "UPDATE jobs SET last_failure = $1 WHERE id = $2",
                            &[&class.as_str(), &job],
                        )
                        .await?;
                        let mut retry = retry_allowed(
                            class,
                            true,
                            get::<i64>(&r, 0)? as u32,
                            get::<i64>(&r, 1)? as u32,
                            &retry_on,
                        );
                        if class == FailureClass::Oom {
                            raise_floor(tx, &id, report.peak_mem_mib).await?;
                            // The next ladder step is a retry of its own, on top of `retry.on`.
                            if next_ladder_step(tx, &job).await? {
                                retry = true;
                            }
                        }
                        JobEvent::Fail { retry }
                    }
                };
                let state = transition(tx, &job, event).await?;
                notify(tx, &origin).await?;
                Ok(state)
            })
        })
        .await
    }

    async fn hand_back(&self, attempt: AttemptId, fence: i64, gpus: &[GpuSample]) -> Result<()> {
        let gpus = gpus.to_vec();
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let node = lock_node_of_attempt(tx, attempt).await?;
                let (job, phase) = check_fence(tx, attempt, fence).await?;
                if phase != "leased" {
                    return Err(StoreError::StaleFence { attempt });
                }
                let a = row(
                    tx,
                    "SELECT gpus FROM attempts WHERE id = $1",
                    &[&attempt.to_string()],
                )
                .await?;
                let until = now_ms() + AVOID_AFTER_HAND_BACK_MS;
                for gpu in get_json::<Vec<u32>>(&a, 0)? {
                    exec(
                        tx,
                        "INSERT INTO gpu_avoid (node, gpu, until_ms) VALUES ($1, $2, $3) \
                         ON CONFLICT (node, gpu) DO UPDATE SET until_ms = EXCLUDED.until_ms",
                        &[&node, &i64::from(gpu), &until],
                    )
                    .await?;
                }
                exec(
                    tx,
                    "DELETE FROM attempts WHERE id = $1",
                    &[&attempt.to_string()],
                )
                .await?;
                let r = row(
                    tx,
                    "UPDATE jobs SET attempts = attempts - 1 WHERE id = $1 RETURNING attempts",
                    &[&job],
                )
                .await?;
                let had: i64 = get(&r, 0)?;
                record_telemetry(tx, &node, &gpus).await?;
                transition(
                    tx,
                    &job,
                    JobEvent::HandBack {
                        had_attempts: had > 0,
                    },
                )
                .await?;
                notify(tx, &origin).await
            })
        })
        .await
    }

    async fn expire_leases(&self) -> Result<Vec<AttemptId>> {
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let expired = rows(
                    tx,
                    "SELECT a.id FROM attempts a JOIN jobs j ON j.id = a.job_id \
                     WHERE a.phase != 'ended' AND a.lease_expires_at < $1 ORDER BY j.seq",
                    &[&now_ms()],
                )
                .await?
                .iter()
                .map(|r| get::<String>(r, 0))
                .collect::<Result<Vec<_>>>()?;
                // Every replica sweeps: an attempt another sweep (or a late report) ended
                // first is not lost twice.
                let mut lost = Vec::new();
                for a in expired {
                    if lose_attempt(tx, &a).await? {
                        lost.push(parse(&a, "attempt id")?);
                    }
                }
                if !lost.is_empty() {
                    notify(tx, &origin).await?;
                }
                Ok(lost)
            })
        })
        .await
    }

    async fn release_attempts(&self, agent: AgentId, attempts: &[AttemptId]) -> Result<u64> {
        let attempts: Vec<String> = attempts.iter().map(|a| a.to_string()).collect();
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let node = lock_node_of_agent(tx, agent).await?;
                let n = exec(
                    tx,
                    "DELETE FROM quarantine WHERE node = $1 AND attempt_id = ANY($2)",
                    &[&node.name, &attempts],
                )
                .await?;
                if n > 0 {
                    notify(tx, &origin).await?;
                }
                Ok(n)
            })
        })
        .await
    }

    async fn release_gpu(&self, node: &str, gpu: u32) -> Result<u64> {
        let node = node.to_string();
        let origin = self.origin.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let r = row_opt(
                    tx,
                    "SELECT gpus FROM nodes WHERE name = $1 FOR UPDATE",
                    &[&node],
                )
                .await?
                .ok_or_else(|| StoreError::NotFound {
                    what: "node",
                    id: node.clone(),
                })?;
                let gpus: Vec<GpuInfo> = get_json(&r, 0)?;
                if !gpus.iter().any(|g| g.index == gpu) {
                    return Err(StoreError::NotFound {
                        what: "GPU",
                        id: format!("{node}/{gpu}"),
                    });
                }
                let n = exec(
                    tx,
                    "DELETE FROM quarantine WHERE node = $1 AND gpu = $2",
                    &[&node, &i64::from(gpu)],
                )
                .await?;
                if n > 0 {
                    notify(tx, &origin).await?;
                }
                Ok(n)
            })
        })
        .await
    }

    /// Listens on a dedicated connection (not one of the pool's) and reconnects with
    /// backoff when it drops, e.g. across a database restart.
    async fn watch_changes(&self, on_change: OnChange, shutdown: CancellationToken) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let why = tokio::select! {
                _ = shutdown.cancelled() => return,
                why = listen_once(&self.config, &self.origin, &on_change, &mut backoff) => why,
            };
            tracing::warn!(
                "change notifications from PostgreSQL interrupted ({why}); reconnecting in {backoff:?}"
            );
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}
