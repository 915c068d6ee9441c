//! The PostgreSQL store for clusters: a connection pool, one transaction per method, row
//! locks so several coordinator replicas can serve one database, and LISTEN/NOTIFY so a
//! change made through one replica wakes the long-polls of the others.
//!
//! Same semantics as the SQLite backend, statement for statement. Where SQLite relies on
//! its single writer, this backend locks rows, always in the order node -> jobs (by `seq`)
//! -> attempts, so concurrent transactions wait for each other instead of deadlocking.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, Transaction,
};
use headroom_shared::api::{
    AttemptPhase, AttemptTelemetry, AttemptView, ExperimentSummary, FinishReport, GpuInfo,
    GpuSample, GpuSeries, JobDetail, JobSummary, Lease, NodeView, PeakSource, StateCounts,
    TelemetrySample,
};
use headroom_shared::{AgentId, AttemptId, ExperimentId, JobEvent, JobId, JobState, Plan};
use serde::de::DeserializeOwned;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::types::{FromSql, Json, ToSql};
use tokio_postgres::{AsyncMessage, Client, Connection, IsolationLevel, NoTls, Row, Socket};
use tokio_util::sync::CancellationToken;

use super::rows::{self, Cols, NodeRow, i64_of, opt_i64, opt_u64, parse};
use super::{
    Active, ClaimInput, Claimed, ExportRow, JobFilter, LeaseTo, Millis, NewExperiment, NewToken,
    OnChange, Registered, Registration, Renewal, Renewed, Result, Retention, SeriesWindow, Store,
    StoreError, StoredToken, node_snapshot, node_view, now_ms,
};
use crate::changes::Changes;
use crate::rules::{self, AVOID_AFTER_HAND_BACK_MS, Learned, Slot};
use headroom_shared::api::TokenView;

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
    /// the store already woke this process's waiters.
    origin: String,
    changes: Changes,
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
            changes: Changes::default(),
        })
    }

    async fn client(&self) -> Result<Object> {
        Ok(self.pool.get().await?)
    }

    /// Runs `f` in one read-write transaction (READ COMMITTED plus explicit row locks).
    /// When `f` says it changed something, the change is announced to every replica (at
    /// commit) and to this process's waiters (after it).
    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send,
        F: for<'t> FnOnce(&'t Transaction<'t>) -> TxFuture<'t, (T, bool)> + Send,
    {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let (out, changed) = f(&tx).await?;
        if changed {
            exec(&tx, "SELECT pg_notify($1, $2)", &[&CHANNEL, &self.origin]).await?;
        }
        tx.commit().await?;
        if changed {
            self.changes.bump();
        }
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

impl Cols for Row {
    fn text(&self, i: usize) -> Result<String> {
        get(self, i)
    }
    fn text_opt(&self, i: usize) -> Result<Option<String>> {
        get(self, i)
    }
    fn int(&self, i: usize) -> Result<i64> {
        get(self, i)
    }
    fn int_opt(&self, i: usize) -> Result<Option<i64>> {
        get(self, i)
    }
    fn flag(&self, i: usize) -> Result<bool> {
        get(self, i)
    }
    fn flag_opt(&self, i: usize) -> Result<Option<bool>> {
        get(self, i)
    }
    fn json<T: DeserializeOwned>(&self, i: usize) -> Result<T> {
        let Json(v) = get::<Json<T>>(self, i)?;
        Ok(v)
    }
    fn json_opt<T: DeserializeOwned>(&self, i: usize) -> Result<Option<T>> {
        Ok(get::<Option<Json<T>>>(self, i)?.map(|Json(v)| v))
    }
}

fn get<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i)
        .map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))
}

fn json<T: serde::Serialize + std::fmt::Debug>(v: &T) -> Json<&T> {
    Json(v)
}

/// Every row of `sql`, decoded by `f`.
async fn all<T>(
    tx: &Transaction<'_>,
    sql: &str,
    params: Params<'_>,
    f: impl Fn(&Row) -> Result<T>,
) -> Result<Vec<T>> {
    rows(tx, sql, params).await?.iter().map(f).collect()
}

/// The first row of `sql`, decoded by `f`, if there is one.
async fn first<T>(
    tx: &Transaction<'_>,
    sql: &str,
    params: Params<'_>,
    f: impl Fn(&Row) -> Result<T>,
) -> Result<Option<T>> {
    row_opt(tx, sql, params).await?.as_ref().map(f).transpose()
}

// ---- transactions' building blocks --------------------------------------------------

/// Reads a job's state and locks its row until the transaction ends.
async fn lock_job(tx: &Transaction<'_>, job: &str) -> Result<JobState> {
    first(
        tx,
        "SELECT state FROM jobs WHERE id = $1 FOR UPDATE",
        &[&job],
        |r| r.parsed(0, "job state"),
    )
    .await?
    .ok_or_else(|| StoreError::not_found("job", job.to_string()))
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
        super::one_row(n as u64, job)?;
    }
    Ok(to)
}

/// The job columns the outcome rules read (the job is locked by the caller).
async fn job_rules(tx: &Transaction<'_>, job: &str) -> Result<rules::JobRules> {
    let sql = format!(
        "SELECT {}, e.spec->'memory_key' FROM jobs j \
         JOIN experiments e ON e.id = j.experiment_id WHERE j.id = $1",
        rows::RULES_COLUMNS
    );
    first(tx, &sql, &[&job], rows::job_rules)
        .await?
        .ok_or_else(|| StoreError::not_found("job", job.to_string()))
}

/// The job of an attempt, locked (the job first, as every transition locks); `None` when no
/// such attempt exists.
async fn lock_job_of(tx: &Transaction<'_>, attempt: &str) -> Result<Option<String>> {
    let job = first(
        tx,
        "SELECT job_id FROM attempts WHERE id = $1",
        &[&attempt],
        |r| r.text(0),
    )
    .await?;
    if let Some(job) = &job {
        lock_job(tx, job).await?;
    }
    Ok(job)
}

/// Records an active attempt as lost and requeues its job if the policy allows; false when
/// it had already ended (another replica's sweep, or its report, came first).
async fn lose_attempt(tx: &Transaction<'_>, attempt: &str) -> Result<bool> {
    let Some(job) = lock_job_of(tx, attempt).await? else {
        return Ok(false);
    };
    let Some(started) = first(
        tx,
        "UPDATE attempts SET phase = 'ended', ended_at = $1, failure_class = 'lost', \
         log_tail = COALESCE(log_tail, 'lost: the agent went away before reporting an end') \
         WHERE id = $2 AND phase != 'ended' RETURNING started_at",
        &[&now_ms(), &attempt],
        |r| r.int_opt(0),
    )
    .await?
    else {
        return Ok(false);
    };
    let loss = rules::lose(&job_rules(tx, &job).await?, started.is_some());
    exec(
        tx,
        "UPDATE jobs SET last_failure = 'lost', max_attempts = max_attempts + $1 WHERE id = $2",
        &[&i64::from(loss.refund_attempt), &job],
    )
    .await?;
    transition(tx, &job, loss.event).await?;
    Ok(true)
}

/// One GPU's samples in `w`, oldest first (the newest `w.limit` of them).
async fn series(
    tx: &Transaction<'_>,
    node: &str,
    gpu: u32,
    w: &SeriesWindow,
) -> Result<Vec<TelemetrySample>> {
    let sql = format!(
        "SELECT {} FROM gpu_telemetry WHERE node = $1 AND gpu = $2 AND at >= $3 AND at <= $4 \
         ORDER BY at DESC, id DESC LIMIT $5",
        rows::TELEMETRY_COLUMNS
    );
    let mut out = all(
        tx,
        &sql,
        &[
            &node,
            &i64::from(gpu),
            &w.since,
            &w.until,
            &i64::from(w.limit),
        ],
        rows::telemetry_sample,
    )
    .await?;
    out.reverse();
    Ok(out)
}

/// The agent's node, locked: claims, heartbeats and reports of one node serialize on it.
async fn lock_node_of_agent(tx: &Transaction<'_>, agent: AgentId) -> Result<NodeRow> {
    let sql = format!(
        "SELECT {} FROM nodes WHERE agent_id = $1 FOR UPDATE",
        rows::NODE_COLUMNS
    );
    first(tx, &sql, &[&agent.to_string()], rows::node)
        .await?
        .ok_or(StoreError::UnknownAgent { agent })
}

/// Locks the node an attempt runs on (first, to keep the lock order) and names it.
async fn lock_node_of_attempt(tx: &Transaction<'_>, attempt: AttemptId) -> Result<String> {
    first(
        tx,
        "SELECT n.name FROM nodes n JOIN attempts a ON a.node = n.name WHERE a.id = $1 \
         FOR UPDATE OF n",
        &[&attempt.to_string()],
        |r| r.text(0),
    )
    .await?
    .ok_or_else(|| StoreError::not_found("attempt", attempt.to_string()))
}

/// Stores the latest samples; true when some GPU has more free memory than before, which
/// may let a waiting claim (on any replica) place work.
async fn record_telemetry(tx: &Transaction<'_>, node: &str, gpus: &[GpuSample]) -> Result<bool> {
    let before: Vec<GpuSample> = first(
        tx,
        "SELECT telemetry FROM nodes WHERE name = $1",
        &[&node],
        |r| r.json_opt(0),
    )
    .await?
    .flatten()
    .unwrap_or_default();
    exec(
        tx,
        "UPDATE nodes SET telemetry = $1, last_seen = $2 WHERE name = $3",
        &[&json(&gpus), &now_ms(), &node],
    )
    .await?;
    Ok(rules::memory_freed(&before, gpus))
}

/// The node's active attempts, in job order: callers that lock their jobs lock them in the
/// order every other multi-job transaction does.
async fn active_on(tx: &Transaction<'_>, node: &str) -> Result<Vec<Active>> {
    all(
        tx,
        &format!(
            "SELECT {} FROM attempts a JOIN jobs j \
             ON j.id = a.job_id WHERE a.node = $1 AND a.phase != 'ended' ORDER BY j.seq",
            rows::ACTIVE_COLUMNS
        ),
        &[&node],
        rows::active,
    )
    .await
}

/// Checks a report's fencing token, locking the job and then the attempt; returns the job
/// and the attempt's phase.
async fn check_fence(
    tx: &Transaction<'_>,
    attempt: AttemptId,
    fence: i64,
) -> Result<(String, AttemptPhase)> {
    let id = attempt.to_string();
    let not_found = || StoreError::not_found("attempt", id.clone());
    let job = lock_job_of(tx, &id).await?.ok_or_else(not_found)?;
    let row = first(
        tx,
        "SELECT a.phase, a.fence, j.fence FROM attempts a JOIN jobs j ON j.id = a.job_id \
         WHERE a.id = $1 FOR UPDATE OF a",
        &[&id],
        rows::fence_row,
    )
    .await?
    .ok_or_else(not_found)?;
    rules::check_fence(attempt, fence, &row)?;
    Ok((job, row.phase))
}

/// The fence check of a finish report, which may also be the late end of a lost attempt
/// (`rules::check_finish`): locks the job and the attempt as `check_fence` does.
async fn check_finish_fence(
    tx: &Transaction<'_>,
    attempt: AttemptId,
    fence: i64,
) -> Result<(String, rules::Report)> {
    let id = attempt.to_string();
    let not_found = || StoreError::not_found("attempt", id.clone());
    let job = lock_job_of(tx, &id).await?.ok_or_else(not_found)?;
    let row = first(
        tx,
        "SELECT a.phase, a.fence, j.fence, a.failure_class, a.started_at IS NOT NULL \
         FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.id = $1 FOR UPDATE OF a",
        &[&id],
        |r| {
            Ok(rules::FinishRow {
                fence: rows::fence_row(r)?,
                failure: r.parsed_opt(3, "failure class")?,
                started: r.flag(4)?,
            })
        },
    )
    .await?
    .ok_or_else(not_found)?;
    Ok((job, rules::check_finish(attempt, fence, &row)?))
}

/// Undoes what recording an attempt lost wrote to its job, before its late report applies.
async fn undo_loss(tx: &Transaction<'_>, job: &str, refunded: bool) -> Result<()> {
    exec(
        tx,
        "UPDATE jobs SET last_failure = NULL, pending_reason = NULL, \
         max_attempts = max_attempts - $1 WHERE id = $2",
        &[&i64::from(refunded), &job],
    )
    .await?;
    Ok(())
}

async fn summaries(
    tx: &Transaction<'_>,
    filter: &str,
    params: Params<'_>,
) -> Result<Vec<JobSummary>> {
    let sql = format!("SELECT {} {} {filter}", rows::JOB_COLUMNS, rows::JOB_FROM);
    all(tx, &sql, params, rows::job_summary).await
}

async fn attempts(
    tx: &Transaction<'_>,
    filter: &str,
    params: Params<'_>,
) -> Result<Vec<AttemptView>> {
    let sql = format!("SELECT {} FROM attempts {filter}", rows::ATTEMPT_COLUMNS);
    all(tx, &sql, params, rows::attempt_view).await
}

async fn counts_for(tx: &Transaction<'_>, experiment: Option<&str>) -> Result<StateCounts> {
    let mut counts = StateCounts::default();
    for (state, n) in all(
        tx,
        "SELECT state, COUNT(*) FROM jobs WHERE ($1::TEXT IS NULL OR experiment_id = $1::TEXT) \
         GROUP BY state",
        &[&experiment],
        |r| Ok((r.parsed(0, "job state")?, r.int(1)?)),
    )
    .await?
    {
        counts.add(state, n as u64);
    }
    Ok(counts)
}

async fn experiment_summary(tx: &Transaction<'_>, id: &str) -> Result<ExperimentSummary> {
    let row = first(
        tx,
        "SELECT name, seed, created_at, submitted_by FROM experiments WHERE id = $1",
        &[&id],
        |r| Ok((r.text(0)?, r.int(1)?, r.time(2)?, r.text(3)?)),
    )
    .await?
    .ok_or_else(|| StoreError::not_found("experiment", id))?;
    rows::experiment(id, row, counts_for(tx, Some(id)).await?)
}

async fn token_by_id(tx: &Transaction<'_>, id: &str) -> Result<StoredToken> {
    let sql = format!("SELECT {} FROM tokens WHERE id = $1", rows::TOKEN_COLUMNS);
    first(tx, &sql, &[&id], rows::token_row)
        .await?
        .ok_or_else(|| StoreError::not_found("token", id))
}

/// Observed peaks and the OOM floor of a memory key.
async fn key_memory(tx: &Transaction<'_>, key: &str) -> Result<(Vec<u64>, Option<u64>)> {
    let peaks = all(
        tx,
        "SELECT peak_mem_mib FROM attempts WHERE memory_key = $1 AND peak_mem_mib IS NOT NULL",
        &[&key],
        |r| Ok(r.int(0)?.max(0) as u64),
    )
    .await?;
    let floor = first(
        tx,
        "SELECT floor_mib FROM memory_floors WHERE memory_key = $1",
        &[&key],
        |r| r.mib_opt(0),
    )
    .await?
    .flatten();
    Ok((peaks, floor))
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

async fn lease_job(
    tx: &Transaction<'_>,
    to: &LeaseTo<'_>,
    job: &str,
    slot: &Slot,
) -> Result<Lease> {
    let (gpus, estimate, source) = (&slot.gpus, slot.estimate, slot.source);
    let sql = format!(
        "SELECT {} FROM jobs j JOIN experiments e ON e.id = j.experiment_id WHERE j.id = $1",
        rows::LEASE_COLUMNS
    );
    let row = first(tx, &sql, &[&job], rows::lease_row)
        .await?
        .ok_or_else(|| StoreError::not_found("job", job.to_string()))?;
    let new = rows::lease_row_into(row, AttemptId::new(), job, gpus, estimate)?;
    let (number, fence) = (i64::from(new.lease.number), new.lease.fence);
    exec(
        tx,
        "INSERT INTO attempts (id, job_id, number, node, agent_id, gpus, fence, phase, \
         estimate_mib, leased_at, lease_expires_at, memory_key, estimate_source, params, \
         ladder_step, submitted_by) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'leased', $8, $9, $10, $11, $12, $13, $14, \
         (SELECT submitted_by FROM jobs WHERE id = $2))",
        &[
            &new.lease.attempt.to_string(),
            &job,
            &number,
            &to.node,
            &to.agent.to_string(),
            &json(&gpus),
            &fence,
            &opt_i64(estimate),
            &to.now,
            &(to.now.saturating_add(i64_of(to.ttl_ms))),
            &new.memory_key,
            &source,
            &json(&new.lease.params),
            &new.ladder_step,
        ],
    )
    .await?;
    exec(
        tx,
        "UPDATE jobs SET attempts = $1, fence = $2, pending_reason = NULL WHERE id = $3",
        &[&number, &fence, &job],
    )
    .await?;
    transition(tx, job, JobEvent::Lease).await?;
    Ok(new.lease)
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
    fn changes(&self) -> Changes {
        self.changes.clone()
    }

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
        self.write(move |tx| {
            Box::pin(async move {
                let now = now_ms();
                let id = exp.id.to_string();
                exec(
                    tx,
                    "INSERT INTO experiments (id, name, seed, spec, created_at, submitted_by) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[
                        &id,
                        &exp.name,
                        &(exp.seed as i64),
                        &json(&exp.spec),
                        &now,
                        &exp.submitted_by,
                    ],
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
                // Matrix-independent: one value for every job of the experiment.
                let prestart = jobs.first().and_then(|j| j.prestart.as_ref()).map(json);
                let background: Vec<Option<_>> = jobs
                    .iter()
                    .map(|j| j.background.as_ref().map(json))
                    .collect();
                let background_mib: Vec<Option<i64>> = jobs
                    .iter()
                    .map(|j| j.background.as_ref().map(|b| i64_of(b.memory_mib)))
                    .collect();
                exec(
                    tx,
                    "INSERT INTO jobs (id, experiment_id, idx, config, run, state, priority, \
                     params, argv, env, profile, gpus, estimate_mib, timeout_ms, max_attempts, \
                     retry_on, created_at, updated_at, memory_key, command, shell, ladder, \
                     submitted_by, prestart, background, background_mib) \
                     SELECT u.id, $1, u.idx, u.config, u.run, 'queued', u.priority, u.params, \
                     u.argv, u.env, u.profile, u.gpus, u.estimate_mib, u.timeout_ms, \
                     u.max_attempts, u.retry_on, $2, $2, u.memory_key, u.command, u.shell, \
                     u.ladder, $21, $22, u.background, u.background_mib \
                     FROM UNNEST($3::TEXT[], $4::BIGINT[], $5::BIGINT[], $6::BIGINT[], \
                     $7::BIGINT[], $8::JSONB[], $9::JSONB[], $10::JSONB[], $11::TEXT[], \
                     $12::BIGINT[], $13::BIGINT[], $14::BIGINT[], $15::BIGINT[], $16::JSONB[], \
                     $17::TEXT[], $18::JSONB[], $19::BOOLEAN[], $20::JSONB[], $23::JSONB[], \
                     $24::BIGINT[]) WITH ORDINALITY \
                     AS u(id, idx, config, run, priority, params, argv, env, profile, gpus, \
                     estimate_mib, timeout_ms, max_attempts, retry_on, memory_key, command, \
                     shell, ladder, background, background_mib, ord) \
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
                        &exp.submitted_by,
                        &prestart,
                        &background,
                        &background_mib,
                    ],
                )
                .await?;
                Ok((experiment_summary(tx, &id).await?, true))
            })
        })
        .await
    }

    async fn list_experiments(&self) -> Result<Vec<ExperimentSummary>> {
        self.read(|tx| {
            Box::pin(async move {
                let ids = all(
                    tx,
                    "SELECT id FROM experiments ORDER BY created_at, id",
                    &[],
                    |r| r.text(0),
                )
                .await?;
                let mut out = Vec::with_capacity(ids.len());
                for id in &ids {
                    out.push(experiment_summary(tx, id).await?);
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
                let exp = filter.experiment.map(|e| e.to_string());
                let state = filter.state.map(|s| s.as_str().to_string());
                let limit = filter.limit.map(i64::from);
                summaries(
                    tx,
                    "WHERE ($1::TEXT IS NULL OR j.experiment_id = $1::TEXT) \
                     AND ($2::TEXT IS NULL OR j.state = $2::TEXT) ORDER BY j.seq LIMIT $3",
                    &[&exp, &state, &limit],
                )
                .await
            })
        })
        .await
    }

    async fn job(&self, id: JobId) -> Result<JobDetail> {
        self.read(move |tx| {
            Box::pin(async move {
                let id = id.to_string();
                let not_found = || StoreError::not_found("job", id.clone());
                let summary = summaries(tx, "WHERE j.id = $1", &[&id])
                    .await?
                    .pop()
                    .ok_or_else(not_found)?;
                let attempts = attempts(tx, "WHERE job_id = $1 ORDER BY number", &[&id]).await?;
                let sql = format!("SELECT {} FROM jobs WHERE id = $1", rows::DETAIL_COLUMNS);
                first(tx, &sql, &[&id], |r| {
                    rows::job_detail(summary.clone(), r, attempts.clone())
                })
                .await?
                .ok_or_else(not_found)
            })
        })
        .await
    }

    async fn attempt(&self, id: AttemptId) -> Result<AttemptView> {
        self.read(move |tx| {
            Box::pin(async move {
                attempts(tx, "WHERE id = $1", &[&id.to_string()])
                    .await?
                    .pop()
                    .ok_or_else(|| StoreError::not_found("attempt", id.to_string()))
            })
        })
        .await
    }

    async fn check_log_fence(&self, attempt: AttemptId, fence: i64) -> Result<()> {
        self.read(move |tx| {
            Box::pin(async move {
                let (row, failure) = first(
                    tx,
                    "SELECT a.phase, a.fence, j.fence, a.failure_class FROM attempts a \
                     JOIN jobs j ON j.id = a.job_id WHERE a.id = $1",
                    &[&attempt.to_string()],
                    |r| Ok((rows::fence_row(r)?, r.parsed_opt(3, "failure class")?)),
                )
                .await?
                .ok_or_else(|| StoreError::not_found("attempt", attempt.to_string()))?;
                rules::check_log_fence(attempt, fence, &row, failure)
            })
        })
        .await
    }

    async fn cancel_job(&self, id: JobId) -> Result<u64> {
        self.write(move |tx| {
            Box::pin(async move {
                let n = cancel_one(tx, &id.to_string()).await?;
                Ok((n, n > 0))
            })
        })
        .await
    }

    async fn cancel_experiment(&self, id: ExperimentId) -> Result<u64> {
        self.write(move |tx| {
            Box::pin(async move {
                let id = id.to_string();
                experiment_summary(tx, &id).await?;
                let jobs = all(
                    tx,
                    "SELECT id FROM jobs WHERE experiment_id = $1 \
                     AND state NOT IN ('succeeded', 'failed', 'cancelled') ORDER BY seq",
                    &[&id],
                    |r| r.text(0),
                )
                .await?;
                let mut n = 0;
                for job in &jobs {
                    n += cancel_one(tx, job).await?;
                }
                Ok((n, n > 0))
            })
        })
        .await
    }

    async fn retry_job(&self, id: JobId) -> Result<JobState> {
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
                Ok((state, true))
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
                    "WHERE ($1::TEXT IS NULL OR j.experiment_id = $1::TEXT) ORDER BY j.seq",
                    &[&exp],
                )
                .await?;
                let attempts = attempts(
                    tx,
                    "WHERE job_id IN (SELECT id FROM jobs \
                     WHERE $1::TEXT IS NULL OR experiment_id = $1::TEXT) ORDER BY number",
                    &[&exp],
                )
                .await?;
                Ok(super::export_rows(jobs, attempts))
            })
        })
        .await
    }

    async fn register_agent(&self, reg: Registration) -> Result<Registered> {
        self.write(move |tx| {
            Box::pin(async move {
                let now = now_ms();
                let stored = first(
                    tx,
                    "SELECT plan, headroom FROM nodes WHERE name = $1 FOR UPDATE",
                    &[&reg.node],
                    |r| Ok((r.text(0)?, r.text(1)?)),
                )
                .await?;
                let (plan, headroom) = rules::merge_registration(&reg, stored)?;
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
                    let resumed = rules::resumes(&reg.resume, &a.id, a.fence)
                        && exec(
                            tx,
                            "UPDATE attempts SET agent_id = $1, lease_expires_at = $2 \
                             WHERE id = $3 AND phase != 'ended'",
                            &[&reg.agent.to_string(), &until, &a.id],
                        )
                        .await?
                            == 1;
                    if !resumed && lose_attempt(tx, &a.id).await? {
                        lost.push(parse(&a.id, "attempt id")?);
                    }
                }
                Ok((Registered { plan, lost }, true))
            })
        })
        .await
    }

    async fn set_plan(&self, node: &str, plan: &str) -> Result<Plan> {
        let (node, plan) = (node.to_string(), plan.to_string());
        self.write(move |tx| {
            Box::pin(async move {
                let gpus: Vec<GpuInfo> = first(
                    tx,
                    "SELECT gpus FROM nodes WHERE name = $1 FOR UPDATE",
                    &[&node],
                    |r| r.json(0),
                )
                .await?
                .ok_or_else(|| StoreError::not_found("node", node.clone()))?;
                let plan = Plan::parse_for(&plan, gpus.len())?;
                exec(
                    tx,
                    "UPDATE nodes SET plan = $1 WHERE name = $2",
                    &[&plan.to_string(), &node],
                )
                .await?;
                Ok((plan, true))
            })
        })
        .await
    }

    async fn list_nodes(&self, alive_within_ms: u64) -> Result<Vec<NodeView>> {
        self.read(move |tx| {
            Box::pin(async move {
                let sql = format!("SELECT {} FROM nodes ORDER BY name", rows::NODE_COLUMNS);
                let now = now_ms();
                let mut out = Vec::new();
                for row in all(tx, &sql, &[], rows::node).await? {
                    let active = active_on(tx, &row.name).await?;
                    let quarantine = all(
                        tx,
                        "SELECT gpu, attempt_id, reason, since FROM quarantine WHERE node = $1 \
                         ORDER BY since",
                        &[&row.name],
                        rows::quarantine,
                    )
                    .await?;
                    out.push(node_view(row, &active, &quarantine, alive_within_ms, now)?);
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

    async fn claim_jobs(&self, mut input: ClaimInput) -> Result<Claimed> {
        self.write(move |tx| {
            Box::pin(async move {
                // Claims for one node serialize on its row: each sees the slots the previous
                // one took.
                let node = lock_node_of_agent(tx, input.agent).await?;
                let mut changed = false;
                let samples = match input.gpus.take() {
                    Some(g) => {
                        changed |= record_telemetry(tx, &node.name, &g).await?;
                        g
                    }
                    None => node.samples.clone(),
                };
                let now = now_ms();
                let to = LeaseTo::new(&node, &input, now);
                let active = active_on(tx, &node.name).await?;
                let blocked = all(
                    tx,
                    "SELECT gpu FROM quarantine WHERE node = $1 \
                     UNION SELECT gpu FROM gpu_avoid WHERE node = $1 AND until_ms > $2",
                    &[&node.name, &now],
                    |r| Ok(r.int(0)? as u32),
                )
                .await?;
                let snapshot = node_snapshot(&node, &samples, &active, &blocked, &input);
                if input.max == 0 {
                    let claimed = Claimed {
                        leases: vec![],
                        plan: node.plan,
                    };
                    return Ok((claimed, changed));
                }
                // Rows another replica's claim holds are skipped, not waited for: two nodes
                // never lease the same job, and neither blocks on the other.
                let pending = all(
                    tx,
                    &format!(
                        "SELECT {} FROM jobs WHERE state IN ('queued', 'retrying') \
                         AND gpus <= $1 ORDER BY priority DESC, seq LIMIT $2 \
                         FOR UPDATE SKIP LOCKED",
                        rows::PENDING_COLUMNS
                    ),
                    &[&(node.gpus.len() as i64), &CLAIM_WINDOW],
                    rows::pending,
                )
                .await?;
                // What each memory key has taught so far, read once per key.
                let mut learned = Learned::new();
                for p in &pending {
                    if !learned.contains_key(&p.memory_key) {
                        learned.insert(p.memory_key.clone(), key_memory(tx, &p.memory_key).await?);
                    }
                }
                let plan = rules::claim(&snapshot, &pending, &learned, now, input.max as usize);
                let mut leases = Vec::with_capacity(plan.leases.len());
                for slot in &plan.leases {
                    leases.push(lease_job(tx, &to, &pending[slot.candidate].id, slot).await?);
                }
                for (i, reason) in &plan.reasons {
                    exec(
                        tx,
                        "UPDATE jobs SET pending_reason = $1 WHERE id = $2",
                        &[&json(reason), &pending[*i].id],
                    )
                    .await?;
                }
                changed |= !leases.is_empty();
                let claimed = Claimed {
                    leases,
                    plan: node.plan,
                };
                Ok((claimed, changed))
            })
        })
        .await
    }

    async fn pending_cancels(&self, agent: AgentId, of: &[AttemptId]) -> Result<Vec<AttemptId>> {
        let watching: Vec<String> = of.iter().map(AttemptId::to_string).collect();
        self.read(move |tx| {
            Box::pin(async move {
                let wanted = all(
                    tx,
                    "SELECT id FROM attempts WHERE id = ANY($1) AND agent_id = $2 \
                     AND cancel_requested AND phase != 'ended'",
                    &[&watching, &agent.to_string()],
                    |r| r.text(0),
                )
                .await?;
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

    async fn renew_leases(&self, r: Renewal) -> Result<Renewed> {
        let (agent, attempts, gpus, lease_ttl_ms) = (r.agent, r.attempts, r.gpus, r.lease_ttl_ms);
        self.write(move |tx| {
            Box::pin(async move {
                let node = lock_node_of_agent(tx, agent).await?;
                // A stale token for any attempt refuses the whole heartbeat, before it writes.
                let mut renew = Vec::new();
                for a in &attempts {
                    let row = first(
                        tx,
                        "SELECT a.phase, a.fence, j.fence, a.failure_class, a.agent_id = $2, \
                         j.seq FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.id = $1",
                        &[&a.attempt.to_string(), &agent.to_string()],
                        |r| Ok((rows::renewal_row(r)?, r.int(5)?)),
                    )
                    .await?;
                    if rules::renewal(a.attempt, a.fence, row.as_ref().map(|(r, _)| r))? {
                        renew.push((row.map_or(0, |(_, seq)| seq), a.attempt, a.waiting.clone()));
                    }
                }
                // Attempt rows are locked in job order, as the lease sweep locks them: in
                // the agent's order, a heartbeat and a sweep could each wait for the other.
                renew.sort_unstable();
                let renew = renew.into_iter().map(|(_, a, waiting)| (a, waiting));
                // Renewals change nothing anyone waits for; freed memory may let a claim
                // on another replica place work.
                let freed = record_telemetry(tx, &node.name, &gpus).await?;
                let until = now_ms().saturating_add(i64_of(lease_ttl_ms));
                let mut cancel = Vec::new();
                for (a, waiting) in renew {
                    let wanted = first(
                        tx,
                        "UPDATE attempts SET lease_expires_at = $1, waiting = $3 WHERE id = $2 \
                         RETURNING cancel_requested",
                        &[&until, &a.to_string(), &waiting],
                        |r| r.flag(0),
                    )
                    .await?;
                    if wanted == Some(true) {
                        cancel.push(a);
                    }
                }
                let renewed = Renewed {
                    cancel,
                    plan: node.plan,
                };
                Ok((renewed, freed))
            })
        })
        .await
    }

    async fn start_attempt(&self, a: AttemptId, fence: i64, pid: u32, at: Millis) -> Result<()> {
        let (attempt, started_at) = (a, at);
        self.write(move |tx| {
            Box::pin(async move {
                let (job, phase) = check_fence(tx, attempt, fence).await?;
                if phase != AttemptPhase::Leased {
                    return Ok(((), false)); // a repeated report
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
                Ok(((), true))
            })
        })
        .await
    }

    async fn finish_attempt(&self, attempt: AttemptId, report: FinishReport) -> Result<JobState> {
        self.write(move |tx| {
            Box::pin(async move {
                let node = lock_node_of_attempt(tx, attempt).await?;
                let (job, standing) = check_finish_fence(tx, attempt, report.fence).await?;
                if let rules::Report::Late { refunded } = standing {
                    undo_loss(tx, &job, refunded).await?;
                }
                let id = attempt.to_string();
                let ended_at = report.ended_at.timestamp_millis();
                let m = rows::measure_row(&report.measurements);
                let bg = report.background.as_ref();
                let (gpus, key, estimate) = first(
                    tx,
                    "UPDATE attempts SET phase = 'ended', ended_at = $1, exit_code = $2, \
                     signal = $3, failure_class = $4, peak_mem_mib = $5, cleanup_ms = $6, \
                     cleanup_verified = $7, log_tail = $8, started_at = COALESCE(started_at, $1), \
                     contaminated = $10, peak_source = $11, energy_mj = $12, \
                     energy_source = $13, mean_power_mw = $14, max_power_mw = $15, \
                     max_temp_mdeg = $16, start_temp_mdeg = $17, mean_util_mpct = $18, \
                     throttled_thermal = $19, throttled_power = $20, throttle_reasons = $21, \
                     contamination_reason = $22, contamination_pid = $23, \
                     contamination_command = $24, background_pid = $25, \
                     background_ready_ms = $26, background_exit_code = $27, \
                     background_signal = $28, background_exited_early = $29 WHERE id = $9 \
                     RETURNING gpus, memory_key, estimate_mib",
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
                        &rules::peak_source(&report).map(PeakSource::as_str),
                        &m.energy_mj,
                        &m.energy_source,
                        &m.mean_power_mw,
                        &m.max_power_mw,
                        &m.max_temp_mdeg,
                        &m.start_temp_mdeg,
                        &m.mean_util_mpct,
                        &m.throttled_thermal,
                        &m.throttled_power,
                        &m.throttle_reasons.as_ref().map(json),
                        &m.contamination_reason,
                        &m.contamination_pid,
                        &m.contamination_command,
                        &bg.and_then(|b| b.pid).map(i64::from),
                        &bg.and_then(|b| opt_i64(b.ready_ms)),
                        &bg.and_then(|b| b.exit_code).map(i64::from),
                        &bg.and_then(|b| b.signal).map(i64::from),
                        &bg.map(|b| b.exited_early),
                    ],
                    |r| Ok((r.json::<Vec<u32>>(0)?, r.text(1)?, r.mib_opt(2)?)),
                )
                .await?
                .ok_or_else(|| StoreError::not_found("attempt", id.clone()))?;
                if let Some(p) = &report.prestart {
                    exec(
                        tx,
                        "UPDATE attempts SET exclusive_wait_ms = $1, cooldown_wait_ms = $2, \
                         cooldown_from_mdeg = $3, cooldown_start_mdeg = $4, \
                         cooldown_timed_out = $5 WHERE id = $6",
                        &[
                            &opt_i64(p.exclusive_wait_ms),
                            &opt_i64(p.cooldown_wait_ms),
                            &rows::mdeg(p.cooldown_from_temp_c),
                            &rows::mdeg(p.cooldown_start_temp_c),
                            &p.cooldown_timed_out,
                            &id,
                        ],
                    )
                    .await?;
                }
                if !report.gpus.is_empty() {
                    record_telemetry(tx, &node, &report.gpus).await?;
                }
                // The attempt was placed by the pair's memory; the job's key learns its own.
                let background_mib: Option<i64> = first(
                    tx,
                    "SELECT background_mib FROM jobs WHERE id = $1",
                    &[&job],
                    |r| r.int_opt(0),
                )
                .await?
                .flatten();
                let estimate = rules::foreground_estimate(estimate, opt_u64(background_mib));
                let mut f = rules::finish(&job_rules(tx, &job).await?, estimate, &report)?;
                if standing != rules::Report::OnTime {
                    f.event = rules::late_event(f.event);
                }
                if let Some(reason) = &f.quarantine {
                    for gpu in gpus {
                        exec(
                            tx,
                            "INSERT INTO quarantine (node, gpu, attempt_id, reason, since) \
                             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (node, gpu, attempt_id) \
                             DO UPDATE SET reason = EXCLUDED.reason, since = EXCLUDED.since",
                            &[&node, &i64::from(gpu), &id, reason, &now_ms()],
                        )
                        .await?;
                    }
                }
                if let Some(class) = f.last_failure {
                    exec(
                        tx,
                        "UPDATE jobs SET last_failure = $1 WHERE id = $2",
                        &[&class.as_str(), &job],
                    )
                    .await?;
                }
                if let Some(floor) = f.floor {
                    exec(
                        tx,
                        "INSERT INTO memory_floors (memory_key, floor_mib) VALUES ($1, $2) \
                         ON CONFLICT (memory_key) DO UPDATE \
                         SET floor_mib = GREATEST(memory_floors.floor_mib, EXCLUDED.floor_mib)",
                        &[&key, &i64_of(floor)],
                    )
                    .await?;
                }
                if let Some(l) = &f.ladder {
                    exec(
                        tx,
                        "UPDATE jobs SET params = $1, argv = $2, memory_key = $3, \
                         ladder_step = $4, max_attempts = $5 WHERE id = $6",
                        &[
                            &json(&l.params),
                            &json(&l.argv),
                            &l.memory_key,
                            &i64::from(l.ladder_step),
                            &i64::from(l.max_attempts),
                            &job,
                        ],
                    )
                    .await?;
                }
                Ok((transition(tx, &job, f.event).await?, true))
            })
        })
        .await
    }

    async fn hand_back(&self, attempt: AttemptId, fence: i64, gpus: &[GpuSample]) -> Result<()> {
        let gpus = gpus.to_vec();
        self.write(move |tx| {
            Box::pin(async move {
                let node = lock_node_of_attempt(tx, attempt).await?;
                let (job, phase) = check_fence(tx, attempt, fence).await?;
                if phase != AttemptPhase::Leased {
                    return Err(StoreError::StaleFence { attempt });
                }
                let on: Vec<u32> = first(
                    tx,
                    "DELETE FROM attempts WHERE id = $1 RETURNING gpus",
                    &[&attempt.to_string()],
                    |r| r.json(0),
                )
                .await?
                .ok_or(StoreError::StaleFence { attempt })?;
                let until = now_ms() + AVOID_AFTER_HAND_BACK_MS;
                for gpu in on {
                    exec(
                        tx,
                        "INSERT INTO gpu_avoid (node, gpu, until_ms) VALUES ($1, $2, $3) \
                         ON CONFLICT (node, gpu) DO UPDATE SET until_ms = EXCLUDED.until_ms",
                        &[&node, &i64::from(gpu), &until],
                    )
                    .await?;
                }
                let left = first(
                    tx,
                    "UPDATE jobs SET attempts = attempts - 1 WHERE id = $1 RETURNING attempts",
                    &[&job],
                    |r| r.int(0),
                )
                .await?
                .unwrap_or(0);
                record_telemetry(tx, &node, &gpus).await?;
                transition(tx, &job, rules::hand_back(left.max(0) as u32)).await?;
                Ok(((), true))
            })
        })
        .await
    }

    async fn expire_leases(&self) -> Result<Vec<AttemptId>> {
        self.write(move |tx| {
            Box::pin(async move {
                let expired = all(
                    tx,
                    "SELECT a.id FROM attempts a JOIN jobs j ON j.id = a.job_id \
                     WHERE a.phase != 'ended' AND a.lease_expires_at < $1 ORDER BY j.seq",
                    &[&now_ms()],
                    |r| r.text(0),
                )
                .await?;
                // Every replica sweeps: an attempt another sweep (or a late report) ended
                // first is not lost twice.
                let mut lost = Vec::new();
                for a in expired {
                    if lose_attempt(tx, &a).await? {
                        lost.push(parse(&a, "attempt id")?);
                    }
                }
                let changed = !lost.is_empty();
                Ok((lost, changed))
            })
        })
        .await
    }

    async fn release_attempts(&self, agent: AgentId, attempts: &[AttemptId]) -> Result<u64> {
        let attempts: Vec<String> = attempts.iter().map(|a| a.to_string()).collect();
        self.write(move |tx| {
            Box::pin(async move {
                let node = lock_node_of_agent(tx, agent).await?;
                let n = exec(
                    tx,
                    "DELETE FROM quarantine WHERE node = $1 AND attempt_id = ANY($2)",
                    &[&node.name, &attempts],
                )
                .await?;
                Ok((n, n > 0))
            })
        })
        .await
    }

    async fn release_gpu(&self, node: &str, gpu: u32) -> Result<u64> {
        let node = node.to_string();
        self.write(move |tx| {
            Box::pin(async move {
                let gpus: Vec<GpuInfo> = first(
                    tx,
                    "SELECT gpus FROM nodes WHERE name = $1 FOR UPDATE",
                    &[&node],
                    |r| r.json(0),
                )
                .await?
                .ok_or_else(|| StoreError::not_found("node", node.clone()))?;
                super::check_gpu(&node, &gpus, gpu)?;
                let n = exec(
                    tx,
                    "DELETE FROM quarantine WHERE node = $1 AND gpu = $2",
                    &[&node, &i64::from(gpu)],
                )
                .await?;
                Ok((n, n > 0))
            })
        })
        .await
    }

    async fn record_telemetry(&self, agent: AgentId, samples: Vec<TelemetrySample>) -> Result<u64> {
        if samples.is_empty() {
            return Ok(0);
        }
        self.write(move |tx| {
            Box::pin(async move {
                // No row lock: telemetry must not queue behind the node's claims.
                let sql = format!("SELECT {} FROM nodes WHERE agent_id = $1", rows::NODE_COLUMNS);
                let node = first(tx, &sql, &[&agent.to_string()], rows::node)
                    .await?
                    .ok_or(StoreError::UnknownAgent { agent })?;
                super::check_telemetry_gpus(&node.gpus, &samples)?;
                let r: Vec<rows::TelemetryRow> = samples.iter().map(rows::telemetry_row).collect();
                let col = |f: fn(&rows::TelemetryRow) -> Option<i64>| -> Vec<Option<i64>> {
                    r.iter().map(f).collect()
                };
                let gpu: Vec<i64> = r.iter().map(|x| x.gpu).collect();
                let at: Vec<i64> = r.iter().map(|x| x.at).collect();
                let throttle: Vec<Option<String>> = r
                    .iter()
                    .map(|x| x.throttle.as_ref().map(serde_json::to_string).transpose())
                    .collect::<std::result::Result<_, _>>()
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                let error: Vec<Option<String>> = r.iter().map(|x| x.error.clone()).collect();
                let (used, free, total, util) = (
                    col(|x| x.used_mib),
                    col(|x| x.free_mib),
                    col(|x| x.total_mib),
                    col(|x| x.utilization_pct),
                );
                let (power, energy, temp, sm) = (
                    col(|x| x.power_mw),
                    col(|x| x.energy_mj),
                    col(|x| x.temperature_mdeg),
                    col(|x| x.sm_clock_mhz),
                );
                let n = exec(
                    tx,
                    "INSERT INTO gpu_telemetry (node, gpu, at, used_mib, free_mib, total_mib, \
                     utilization_pct, power_mw, energy_mj, temperature_mdeg, sm_clock_mhz, \
                     throttle, error) \
                     SELECT $1, t.gpu, t.at, t.used, t.free, t.total, t.util, t.power, t.energy, \
                     t.temp, t.sm, t.throttle::JSONB, t.error \
                     FROM UNNEST($2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::BIGINT[], \
                     $6::BIGINT[], $7::BIGINT[], $8::BIGINT[], $9::BIGINT[], $10::BIGINT[], \
                     $11::BIGINT[], $12::TEXT[], $13::TEXT[]) \
                     AS t(gpu, at, used, free, total, util, power, energy, temp, sm, throttle, error) \
                     ON CONFLICT (node, gpu, at) DO NOTHING",
                    &[
                        &node.name, &gpu, &at, &used, &free, &total, &util, &power, &energy,
                        &temp, &sm, &throttle, &error,
                    ],
                )
                .await?;
                Ok((n, false))
            })
        })
        .await
    }

    async fn telemetry_of_gpu(
        &self,
        node: &str,
        gpu: u32,
        window: SeriesWindow,
    ) -> Result<Vec<TelemetrySample>> {
        let node = node.to_string();
        self.read(move |tx| {
            Box::pin(async move {
                let gpus: Vec<GpuInfo> = first(
                    tx,
                    "SELECT gpus FROM nodes WHERE name = $1",
                    &[&node],
                    |r| r.json(0),
                )
                .await?
                .ok_or_else(|| StoreError::not_found("node", node.clone()))?;
                super::check_gpu(&node, &gpus, gpu)?;
                series(tx, &node, gpu, &window).await
            })
        })
        .await
    }

    async fn telemetry_of_attempt(
        &self,
        attempt: AttemptId,
        limit: u32,
    ) -> Result<AttemptTelemetry> {
        self.read(move |tx| {
            Box::pin(async move {
                let a = attempts(tx, "WHERE id = $1", &[&attempt.to_string()])
                    .await?
                    .pop()
                    .ok_or_else(|| StoreError::not_found("attempt", attempt.to_string()))?;
                let window = super::attempt_window(&a, limit);
                let mut gpus = Vec::new();
                for &gpu in &a.gpus {
                    let samples = match &window {
                        Some(w) => series(tx, &a.node, gpu, w).await?,
                        None => Vec::new(),
                    };
                    gpus.push(GpuSeries {
                        node: a.node.clone(),
                        gpu,
                        samples,
                    });
                }
                Ok(super::attempt_telemetry(&a, gpus))
            })
        })
        .await
    }

    async fn create_token(&self, t: NewToken) -> Result<TokenView> {
        self.write(move |tx| {
            Box::pin(async move {
                let n = exec(
                    tx,
                    "INSERT INTO tokens (id, name, role, secret_hash, created_by, created_at, \
                     expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
                    &[
                        &t.id,
                        &t.name,
                        &t.role.as_str(),
                        &t.secret_hash,
                        &t.created_by,
                        &now_ms(),
                        &t.expires_at,
                    ],
                )
                .await?;
                if n != 1 {
                    return Err(StoreError::Database(format!("token id {} exists", t.id)));
                }
                Ok((token_by_id(tx, &t.id).await?.view, false))
            })
        })
        .await
    }

    async fn prune_telemetry(&self, keep: Retention) -> Result<u64> {
        self.write(move |tx| {
            Box::pin(async move {
                let batch = i64::from(keep.batch);
                let mut gone = exec(
                    tx,
                    "DELETE FROM gpu_telemetry WHERE id IN \
                     (SELECT id FROM gpu_telemetry WHERE at < $1 ORDER BY at LIMIT $2)",
                    &[&keep.older_than, &batch],
                )
                .await?;
                let nodes = all(tx, "SELECT name, gpus FROM nodes", &[], |r| {
                    Ok((r.text(0)?, r.json::<Vec<GpuInfo>>(1)?))
                })
                .await?;
                let keep_n = i64_of(keep.keep_per_gpu);
                'nodes: for (node, gpus) in nodes {
                    for g in gpus {
                        let left = batch - gone as i64;
                        if left <= 0 {
                            break 'nodes;
                        }
                        let gpu = i64::from(g.index);
                        // The newest sample beyond the count kept: it and older ones go.
                        let cutoff = first(
                            tx,
                            "SELECT at, id FROM gpu_telemetry WHERE node = $1 AND gpu = $2 \
                             ORDER BY at DESC, id DESC LIMIT 1 OFFSET $3",
                            &[&node, &gpu, &keep_n],
                            |r| Ok((r.int(0)?, r.int(1)?)),
                        )
                        .await?;
                        if let Some((at, id)) = cutoff {
                            gone += exec(
                                tx,
                                "DELETE FROM gpu_telemetry WHERE id IN \
                                 (SELECT id FROM gpu_telemetry WHERE node = $1 AND gpu = $2 \
                                  AND (at < $3 OR (at = $3 AND id <= $4)) ORDER BY at LIMIT $5)",
                                &[&node, &gpu, &at, &id, &left],
                            )
                            .await?;
                        }
                    }
                }
                Ok((gone, false))
            })
        })
        .await
    }

    async fn submitted_at(&self, attempt: AttemptId) -> Result<(Millis, u32)> {
        self.read(move |tx| {
            Box::pin(async move {
                first(
                    tx,
                    "SELECT j.created_at, a.number FROM attempts a JOIN jobs j ON j.id = a.job_id \
                     WHERE a.id = $1",
                    &[&attempt.to_string()],
                    |r| Ok((r.int(0)?, r.int(1)?.clamp(0, i64::from(u32::MAX)) as u32)),
                )
                .await?
                .ok_or_else(|| StoreError::not_found("attempt", attempt.to_string()))
            })
        })
        .await
    }

    async fn pending_reason_counts(&self) -> Result<Vec<(String, u64)>> {
        self.read(|tx| {
            Box::pin(async move {
                all(
                    tx,
                    "SELECT COALESCE(pending_reason->>'reason', 'not_considered'), COUNT(*) \
                     FROM jobs WHERE state IN ('queued', 'retrying') GROUP BY 1 ORDER BY 1",
                    &[],
                    |r| Ok((r.text(0)?, r.int(1)?.max(0) as u64)),
                )
                .await
            })
        })
        .await
    }

    async fn token_by_id(&self, id: &str) -> Result<StoredToken> {
        let id = id.to_string();
        self.read(move |tx| Box::pin(async move { token_by_id(tx, &id).await }))
            .await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenView>> {
        self.read(move |tx| {
            Box::pin(async move {
                let sql = format!(
                    "SELECT {} FROM tokens ORDER BY created_at, id",
                    rows::TOKEN_COLUMNS
                );
                Ok(all(tx, &sql, &[], rows::token_row)
                    .await?
                    .into_iter()
                    .map(|t| t.view)
                    .collect())
            })
        })
        .await
    }

    async fn revoke_token(&self, id: &str) -> Result<TokenView> {
        let id = id.to_string();
        self.write(move |tx| {
            Box::pin(async move {
                let n = exec(
                    tx,
                    "UPDATE tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2",
                    &[&now_ms(), &id],
                )
                .await?;
                if n != 1 {
                    return Err(StoreError::not_found("token", id));
                }
                Ok((token_by_id(tx, &id).await?.view, false))
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
