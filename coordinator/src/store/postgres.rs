//! The PostgreSQL store for clusters: the SQL of each `Tx` statement, a connection pool, row
//! locks (in the order `tx` states) so several coordinator replicas can serve one database,
//! batch inserts, `SKIP LOCKED` claims, and LISTEN/NOTIFY so a change made through one
//! replica wakes the long-polls of the others.

use std::future::poll_fn;
use std::pin::pin;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, Transaction,
};
use headroom_shared::api::{
    AttemptView, FinishReport, GpuInfo, GpuSample, Headroom, JobDetail, JobSummary, PeakSource,
    QuarantineView, StateCounts, TelemetrySample,
};
use headroom_shared::pending::PendingReason;
use headroom_shared::{AgentId, FailureClass, JobState, Plan};
use serde::de::DeserializeOwned;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::types::{FromSql, Json, ToSql};
use tokio_postgres::{AsyncMessage, Client, Connection, IsolationLevel, NoTls, Row, Socket};
use tokio_util::sync::CancellationToken;

use super::rows::{self, Cols, LeaseRow, NodeRow, i64_of, opt_i64};
use super::tx::{AttemptsWhere, Backend, Ended, JobsWhere, NewAttempt, Op, Tx};
use super::{
    Active, Millis, NewExperiment, NewToken, OnChange, Result, SeriesWindow, StoreError,
    StoredToken,
};
use crate::changes::Changes;
use crate::rules::{FenceRow, FinishRow, JobRules, LadderStep, PendingRow, RenewalRow};

mod embedded {
    refinery::embed_migrations!("migrations/postgres");
}

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
/// First key of the transaction advisory locks of memory floors (the second is the key's
/// hash).
const FLOOR_LOCK: i32 = 0x6866_6c72; // "hflr"
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
        // Two transactions that each waited for the other lost a race, not the database.
        let code = e.code();
        if code == Some(&SqlState::T_R_DEADLOCK_DETECTED)
            || code == Some(&SqlState::T_R_SERIALIZATION_FAILURE)
        {
            return StoreError::Conflict { job: None };
        }
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
impl Backend for PostgresStore {
    fn changes(&self) -> Changes {
        self.changes.clone()
    }

    async fn schema_version(&self) -> Result<i64> {
        let client = self.client().await?;
        let r = client
            .query_one(
                "SELECT COALESCE(MAX(version), 0)::BIGINT FROM refinery_schema_history",
                &[],
            )
            .await?;
        get(&r, 0)
    }

    /// A read-only transaction on one snapshot, so a read of several statements sees one
    /// state of the database.
    async fn read<T: Send + 'static>(&self, op: Op<T>) -> Result<T> {
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let out = op(&mut PgTx { tx: &tx }).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// READ COMMITTED plus explicit row locks (`tx` states their order). A change is
    /// announced to every replica at commit and to this process's waiters after it.
    async fn write<T: Send + 'static>(&self, op: Op<(T, bool)>) -> Result<T> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let (out, changed) = op(&mut PgTx { tx: &tx }).await?;
        if changed {
            exec(&tx, "SELECT pg_notify($1, $2)", &[&CHANNEL, &self.origin]).await?;
        }
        tx.commit().await?;
        if changed {
            self.changes.bump();
        }
        Ok(out)
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

/// One transaction's statements.
struct PgTx<'a> {
    tx: &'a Transaction<'a>,
}

fn int(v: u32) -> i64 {
    i64::from(v)
}

#[async_trait]
impl Tx for PgTx<'_> {
    async fn insert_experiment(&mut self, exp: &NewExperiment, now: Millis) -> Result<()> {
        let id = exp.id.to_string();
        exec(
            self.tx,
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
        let col = |f: fn(&super::NewJob) -> i64| -> Vec<i64> { jobs.iter().map(f).collect() };
        let ids: Vec<String> = jobs.iter().map(|j| j.id.to_string()).collect();
        let (idx, config, run) = (
            col(|j| int(j.index)),
            col(|j| int(j.config)),
            col(|j| int(j.run)),
        );
        let (priority, gpus, max_attempts) = (
            col(|j| i64::from(j.priority)),
            col(|j| int(j.gpus)),
            col(|j| int(j.max_attempts)),
        );
        let params: Vec<_> = jobs.iter().map(|j| json(&j.params)).collect();
        let argv: Vec<_> = jobs.iter().map(|j| json(&j.argv)).collect();
        let env: Vec<_> = jobs.iter().map(|j| json(&j.env)).collect();
        let profile: Vec<&str> = jobs.iter().map(|j| j.profile.as_str()).collect();
        let estimate: Vec<Option<i64>> = jobs.iter().map(|j| opt_i64(j.estimate_mib)).collect();
        let timeout: Vec<Option<i64>> = jobs.iter().map(|j| opt_i64(j.timeout_ms)).collect();
        let retry_on: Vec<_> = jobs.iter().map(|j| json(&j.retry_on)).collect();
        let memory_key: Vec<&str> = jobs.iter().map(|j| j.memory_key.as_str()).collect();
        let command: Vec<_> = jobs.iter().map(|j| json(&j.command)).collect();
        let shell: Vec<bool> = jobs.iter().map(|j| j.shell).collect();
        let ladder: Vec<_> = jobs.iter().map(|j| json(&j.oom_ladder)).collect();
        let prestart: Vec<Option<_>> = jobs.iter().map(|j| j.prestart.as_ref().map(json)).collect();
        let background: Vec<Option<_>> = jobs
            .iter()
            .map(|j| j.background.as_ref().map(json))
            .collect();
        let background_mib: Vec<Option<i64>> = jobs
            .iter()
            .map(|j| j.background.as_ref().map(|b| i64_of(b.memory_mib)))
            .collect();
        exec(
            self.tx,
            "INSERT INTO jobs (id, experiment_id, idx, config, run, state, priority, params, \
             argv, env, profile, gpus, estimate_mib, timeout_ms, max_attempts, retry_on, \
             created_at, updated_at, memory_key, command, shell, ladder, submitted_by, \
             prestart, background, background_mib) \
             SELECT u.id, $1, u.idx, u.config, u.run, 'queued', u.priority, u.params, u.argv, \
             u.env, u.profile, u.gpus, u.estimate_mib, u.timeout_ms, u.max_attempts, \
             u.retry_on, $2, $2, u.memory_key, u.command, u.shell, u.ladder, $21, u.prestart, \
             u.background, u.background_mib \
             FROM UNNEST($3::TEXT[], $4::BIGINT[], $5::BIGINT[], $6::BIGINT[], $7::BIGINT[], \
             $8::JSONB[], $9::JSONB[], $10::JSONB[], $11::TEXT[], $12::BIGINT[], \
             $13::BIGINT[], $14::BIGINT[], $15::BIGINT[], $16::JSONB[], $17::TEXT[], \
             $18::JSONB[], $19::BOOLEAN[], $20::JSONB[], $22::JSONB[], $23::JSONB[], \
             $24::BIGINT[]) WITH ORDINALITY \
             AS u(id, idx, config, run, priority, params, argv, env, profile, gpus, \
             estimate_mib, timeout_ms, max_attempts, retry_on, memory_key, command, shell, \
             ladder, prestart, background, background_mib, ord) \
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
        Ok(())
    }

    async fn experiment_ids(&mut self) -> Result<Vec<String>> {
        all(
            self.tx,
            "SELECT id FROM experiments ORDER BY created_at, id",
            &[],
            |r| r.text(0),
        )
        .await
    }

    async fn experiment_row(&mut self, id: &str) -> Result<Option<(String, i64, Millis, String)>> {
        first(
            self.tx,
            "SELECT name, seed, created_at, submitted_by FROM experiments WHERE id = $1",
            &[&id],
            |r| Ok((r.text(0)?, r.int(1)?, r.int(2)?, r.text(3)?)),
        )
        .await
    }

    async fn state_counts(&mut self, experiment: Option<&str>) -> Result<StateCounts> {
        let mut counts = StateCounts::default();
        for (state, n) in all(
            self.tx,
            "SELECT state, COUNT(*) FROM jobs \
             WHERE ($1::TEXT IS NULL OR experiment_id = $1::TEXT) GROUP BY state",
            &[&experiment],
            |r| Ok((r.parsed(0, "job state")?, r.int(1)?)),
        )
        .await?
        {
            counts.add(state, n.max(0) as u64);
        }
        Ok(counts)
    }

    async fn job_summaries(&mut self, which: JobsWhere<'_>) -> Result<Vec<JobSummary>> {
        let (cols, from) = (rows::JOB_COLUMNS, rows::JOB_FROM);
        match which {
            JobsWhere::Id(id) => {
                let sql = format!("SELECT {cols} {from} WHERE j.id = $1");
                all(self.tx, &sql, &[&id], rows::job_summary).await
            }
            JobsWhere::Filter {
                experiment,
                state,
                limit,
            } => {
                let sql = format!(
                    "SELECT {cols} {from} WHERE ($1::TEXT IS NULL OR j.experiment_id = $1::TEXT) \
                     AND ($2::TEXT IS NULL OR j.state = $2::TEXT) ORDER BY j.seq LIMIT $3"
                );
                let state = state.map(JobState::as_str);
                let limit = limit.map(i64::from);
                all(self.tx, &sql, &[&experiment, &state, &limit], rows::job_summary).await
            }
        }
    }

    async fn job_detail(
        &mut self,
        id: &str,
        summary: JobSummary,
        attempts: Vec<AttemptView>,
    ) -> Result<Option<JobDetail>> {
        let sql = format!("SELECT {} FROM jobs WHERE id = $1", rows::DETAIL_COLUMNS);
        first(self.tx, &sql, &[&id], |r| {
            rows::job_detail(summary.clone(), r, attempts.clone())
        })
        .await
    }

    async fn jobs_of_experiment(&mut self, experiment: &str) -> Result<Vec<(String, JobState)>> {
        all(
            self.tx,
            "SELECT id, state FROM jobs WHERE experiment_id = $1 ORDER BY seq",
            &[&experiment],
            |r| Ok((r.text(0)?, r.parsed(1, "job state")?)),
        )
        .await
    }

    async fn lock_job(&mut self, job: &str) -> Result<Option<JobState>> {
        first(
            self.tx,
            "SELECT state FROM jobs WHERE id = $1 FOR UPDATE",
            &[&job],
            |r| r.parsed(0, "job state"),
        )
        .await
    }

    async fn set_job_state(
        &mut self,
        job: &str,
        from: JobState,
        to: JobState,
        now: Millis,
    ) -> Result<u64> {
        exec(
            self.tx,
            "UPDATE jobs SET state = $1, updated_at = $2 WHERE id = $3 AND state = $4",
            &[&to.as_str(), &now, &job, &from.as_str()],
        )
        .await
    }

    async fn job_rules(&mut self, job: &str) -> Result<Option<JobRules>> {
        let sql = format!(
            "SELECT {}, e.spec->'memory_key' FROM jobs j \
             JOIN experiments e ON e.id = j.experiment_id WHERE j.id = $1",
            rows::RULES_COLUMNS
        );
        first(self.tx, &sql, &[&job], rows::job_rules).await
    }

    async fn set_job_tries(&mut self, job: &str, attempts: u32, max_attempts: u32) -> Result<()> {
        exec(
            self.tx,
            "UPDATE jobs SET attempts = $1, max_attempts = $2 WHERE id = $3",
            &[&int(attempts), &int(max_attempts), &job],
        )
        .await?;
        Ok(())
    }

    async fn set_last_failure(&mut self, job: &str, class: Option<FailureClass>) -> Result<()> {
        exec(
            self.tx,
            "UPDATE jobs SET last_failure = $1 WHERE id = $2",
            &[&class.map(FailureClass::as_str), &job],
        )
        .await?;
        Ok(())
    }

    async fn set_pending_reason(
        &mut self,
        job: &str,
        reason: Option<&PendingReason>,
    ) -> Result<()> {
        exec(
            self.tx,
            "UPDATE jobs SET pending_reason = $1 WHERE id = $2",
            &[&reason.map(json), &job],
        )
        .await?;
        Ok(())
    }

    async fn set_job_leased(&mut self, job: &str, attempts: u32, fence: i64) -> Result<()> {
        exec(
            self.tx,
            "UPDATE jobs SET attempts = $1, fence = $2, pending_reason = NULL WHERE id = $3",
            &[&int(attempts), &fence, &job],
        )
        .await?;
        Ok(())
    }

    async fn set_job_ladder(&mut self, job: &str, l: &LadderStep) -> Result<()> {
        exec(
            self.tx,
            "UPDATE jobs SET params = $1, argv = $2, memory_key = $3, ladder_step = $4, \
             max_attempts = $5 WHERE id = $6",
            &[
                &json(&l.params),
                &json(&l.argv),
                &l.memory_key,
                &int(l.ladder_step),
                &int(l.max_attempts),
                &job,
            ],
        )
        .await?;
        Ok(())
    }

    async fn background_mib(&mut self, job: &str) -> Result<Option<u64>> {
        Ok(first(
            self.tx,
            "SELECT background_mib FROM jobs WHERE id = $1",
            &[&job],
            |r| r.mib_opt(0),
        )
        .await?
        .flatten())
    }

    async fn lease_row(&mut self, job: &str) -> Result<Option<LeaseRow>> {
        let sql = format!(
            "SELECT {} FROM jobs j JOIN experiments e ON e.id = j.experiment_id WHERE j.id = $1",
            rows::LEASE_COLUMNS
        );
        first(self.tx, &sql, &[&job], rows::lease_row).await
    }

    /// Rows another replica's claim holds are skipped, not waited for: two nodes never lease
    /// the same job, and neither blocks on the other.
    async fn lock_pending(&mut self, max_gpus: u32, limit: u32) -> Result<Vec<PendingRow>> {
        let sql = format!(
            "SELECT {} FROM jobs WHERE state IN ('queued', 'retrying') AND gpus <= $1 \
             ORDER BY priority DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED",
            rows::PENDING_COLUMNS
        );
        all(self.tx, &sql, &[&int(max_gpus), &int(limit)], rows::pending).await
    }

    async fn pending_reason_counts(&mut self) -> Result<Vec<(String, u64)>> {
        all(
            self.tx,
            "SELECT COALESCE(pending_reason->>'reason', 'not_considered'), COUNT(*) \
             FROM jobs WHERE state IN ('queued', 'retrying') GROUP BY 1 ORDER BY 1",
            &[],
            |r| Ok((r.text(0)?, r.int(1)?.max(0) as u64)),
        )
        .await
    }

    async fn attempt_views(&mut self, which: AttemptsWhere<'_>) -> Result<Vec<AttemptView>> {
        let cols = rows::ATTEMPT_COLUMNS;
        let (filter, arg) = match which {
            AttemptsWhere::Id(id) => ("WHERE id = $1::TEXT", Some(id)),
            AttemptsWhere::Job(job) => ("WHERE job_id = $1::TEXT ORDER BY number", Some(job)),
            AttemptsWhere::Experiment(exp) => (
                "WHERE job_id IN (SELECT id FROM jobs \
                 WHERE $1::TEXT IS NULL OR experiment_id = $1::TEXT) ORDER BY number",
                exp,
            ),
        };
        let sql = format!("SELECT {cols} FROM attempts {filter}");
        all(self.tx, &sql, &[&arg], rows::attempt_view).await
    }

    async fn job_of_attempt(&mut self, attempt: &str) -> Result<Option<String>> {
        first(
            self.tx,
            "SELECT job_id FROM attempts WHERE id = $1",
            &[&attempt],
            |r| r.text(0),
        )
        .await
    }

    async fn lock_fence(&mut self, attempt: &str) -> Result<Option<FenceRow>> {
        first(
            self.tx,
            "SELECT a.phase, a.fence, j.fence FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.id = $1 FOR UPDATE OF a",
            &[&attempt],
            rows::fence_row,
        )
        .await
    }

    async fn lock_finish_row(&mut self, attempt: &str) -> Result<Option<FinishRow>> {
        first(
            self.tx,
            "SELECT a.phase, a.fence, j.fence, a.failure_class, a.started_at IS NOT NULL \
             FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.id = $1 FOR UPDATE OF a",
            &[&attempt],
            rows::finish_row,
        )
        .await
    }

    async fn renewal_row(
        &mut self,
        attempt: &str,
        agent: AgentId,
    ) -> Result<Option<(RenewalRow, i64)>> {
        first(
            self.tx,
            "SELECT a.phase, a.fence, j.fence, a.failure_class, a.agent_id = $2, j.seq \
             FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.id = $1",
            &[&attempt, &agent.to_string()],
            |r| Ok((rows::renewal_row(r)?, r.int(5)?)),
        )
        .await
    }

    async fn log_fence_row(
        &mut self,
        attempt: &str,
    ) -> Result<Option<(FenceRow, Option<FailureClass>)>> {
        first(
            self.tx,
            "SELECT a.phase, a.fence, j.fence, a.failure_class FROM attempts a \
             JOIN jobs j ON j.id = a.job_id WHERE a.id = $1",
            &[&attempt],
            |r| Ok((rows::fence_row(r)?, r.parsed_opt(3, "failure class")?)),
        )
        .await
    }

    async fn active_on(&mut self, node: &str) -> Result<Vec<Active>> {
        let sql = format!(
            "SELECT {} FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.node = $1 AND a.phase != 'ended' ORDER BY j.seq",
            rows::ACTIVE_COLUMNS
        );
        all(self.tx, &sql, &[&node], rows::active).await
    }

    async fn expired(&mut self, now: Millis) -> Result<Vec<String>> {
        all(
            self.tx,
            "SELECT a.id FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.phase != 'ended' AND a.lease_expires_at < $1 ORDER BY j.seq",
            &[&now],
            |r| r.text(0),
        )
        .await
    }

    async fn insert_attempt(&mut self, a: &NewAttempt<'_>) -> Result<()> {
        exec(
            self.tx,
            "INSERT INTO attempts (id, job_id, number, node, agent_id, gpus, fence, phase, \
             estimate_mib, leased_at, lease_expires_at, memory_key, estimate_source, params, \
             ladder_step, submitted_by) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'leased', $8, $9, $10, $11, $12, $13, $14, \
             (SELECT submitted_by FROM jobs WHERE id = $2))",
            &[
                &a.id,
                &a.job,
                &int(a.number),
                &a.node,
                &a.agent.to_string(),
                &json(&a.gpus),
                &a.fence,
                &opt_i64(a.estimate_mib),
                &a.leased_at,
                &a.expires_at,
                &a.memory_key,
                &a.estimate_source,
                &json(a.params),
                &a.ladder_step,
            ],
        )
        .await?;
        Ok(())
    }

    async fn end_lost(&mut self, attempt: &str, now: Millis) -> Result<Option<bool>> {
        first(
            self.tx,
            "UPDATE attempts SET phase = 'ended', ended_at = $1, failure_class = 'lost', \
             log_tail = COALESCE(log_tail, 'lost: the agent went away before reporting an end') \
             WHERE id = $2 AND phase != 'ended' RETURNING started_at IS NOT NULL",
            &[&now, &attempt],
            |r| r.flag(0),
        )
        .await
    }

    async fn resume_attempt(
        &mut self,
        attempt: &str,
        agent: AgentId,
        until: Millis,
    ) -> Result<bool> {
        Ok(exec(
            self.tx,
            "UPDATE attempts SET agent_id = $1, lease_expires_at = $2 \
             WHERE id = $3 AND phase != 'ended'",
            &[&agent.to_string(), &until, &attempt],
        )
        .await?
            == 1)
    }

    async fn renew_attempt(
        &mut self,
        attempt: &str,
        until: Millis,
        waiting: Option<&str>,
    ) -> Result<Option<bool>> {
        first(
            self.tx,
            "UPDATE attempts SET lease_expires_at = $1, waiting = $3 WHERE id = $2 \
             RETURNING cancel_requested",
            &[&until, &attempt, &waiting],
            |r| r.flag(0),
        )
        .await
    }

    async fn set_running(&mut self, attempt: &str, pid: u32, at: Millis) -> Result<()> {
        exec(
            self.tx,
            "UPDATE attempts SET phase = 'running', pid = $1, started_at = $2 WHERE id = $3",
            &[&int(pid), &at, &attempt],
        )
        .await?;
        Ok(())
    }

    async fn set_ended(
        &mut self,
        attempt: &str,
        report: &FinishReport,
        peak_source: Option<PeakSource>,
    ) -> Result<Option<Ended>> {
        let m = rows::measure_row(&report.measurements);
        let bg = report.background.as_ref();
        let ended = first(
            self.tx,
            "UPDATE attempts SET phase = 'ended', ended_at = $1, exit_code = $2, signal = $3, \
             failure_class = $4, peak_mem_mib = $5, cleanup_ms = $6, cleanup_verified = $7, \
             log_tail = $8, started_at = COALESCE(started_at, $1), contaminated = $10, \
             peak_source = $11, energy_mj = $12, energy_source = $13, mean_power_mw = $14, \
             max_power_mw = $15, max_temp_mdeg = $16, start_temp_mdeg = $17, \
             mean_util_mpct = $18, throttled_thermal = $19, throttled_power = $20, \
             throttle_reasons = $21, contamination_reason = $22, contamination_pid = $23, \
             contamination_command = $24, background_pid = $25, background_ready_ms = $26, \
             background_exit_code = $27, background_signal = $28, \
             background_exited_early = $29 \
             WHERE id = $9 RETURNING node, gpus, memory_key, estimate_mib",
            &[
                &report.ended_at.timestamp_millis(),
                &report.exit_code.map(i64::from),
                &report.signal.map(i64::from),
                &report.failure.map(|f| f.as_str()),
                &opt_i64(report.peak_mem_mib),
                &i64_of(report.cleanup_ms),
                &report.cleanup_verified,
                &report.log_tail,
                &attempt,
                &report.contaminated,
                &peak_source.map(PeakSource::as_str),
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
            rows::ended,
        )
        .await?;
        if let (Some(p), Some(_)) = (&report.prestart, &ended) {
            exec(
                self.tx,
                "UPDATE attempts SET exclusive_wait_ms = $1, cooldown_wait_ms = $2, \
                 cooldown_from_mdeg = $3, cooldown_start_mdeg = $4, cooldown_timed_out = $5 \
                 WHERE id = $6",
                &[
                    &opt_i64(p.exclusive_wait_ms),
                    &opt_i64(p.cooldown_wait_ms),
                    &rows::mdeg(p.cooldown_from_temp_c),
                    &rows::mdeg(p.cooldown_start_temp_c),
                    &p.cooldown_timed_out,
                    &attempt,
                ],
            )
            .await?;
        }
        Ok(ended)
    }

    async fn delete_attempt(&mut self, attempt: &str) -> Result<Option<(String, Vec<u32>)>> {
        first(
            self.tx,
            "DELETE FROM attempts WHERE id = $1 RETURNING node, gpus",
            &[&attempt],
            |r| Ok((r.text(0)?, r.json(1)?)),
        )
        .await
    }

    async fn request_cancel(&mut self, job: &str) -> Result<()> {
        exec(
            self.tx,
            "UPDATE attempts SET cancel_requested = TRUE WHERE job_id = $1 AND phase != 'ended'",
            &[&job],
        )
        .await?;
        Ok(())
    }

    async fn cancel_requested(
        &mut self,
        agent: AgentId,
        attempts: &[String],
    ) -> Result<Vec<String>> {
        all(
            self.tx,
            "SELECT id FROM attempts WHERE id = ANY($1) AND agent_id = $2 \
             AND cancel_requested AND phase != 'ended'",
            &[&attempts, &agent.to_string()],
            |r| r.text(0),
        )
        .await
    }

    async fn submitted_at(&mut self, attempt: &str) -> Result<Option<(Millis, u32)>> {
        first(
            self.tx,
            "SELECT j.created_at, a.number FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.id = $1",
            &[&attempt],
            |r| Ok((r.int(0)?, r.int(1)?.clamp(0, i64::from(u32::MAX)) as u32)),
        )
        .await
    }

    async fn peaks(&mut self, key: &str) -> Result<Vec<u64>> {
        all(
            self.tx,
            "SELECT peak_mem_mib FROM attempts WHERE memory_key = $1 AND peak_mem_mib IS NOT NULL",
            &[&key],
            |r| Ok(r.int(0)?.max(0) as u64),
        )
        .await
    }

    /// The key's advisory lock (held to the transaction's end) serializes its writers even
    /// before the key has a row to lock.
    async fn lock_floor(&mut self, key: &str) -> Result<Option<u64>> {
        exec(
            self.tx,
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            &[&FLOOR_LOCK, &key],
        )
        .await?;
        self.floor(key).await
    }

    async fn floor(&mut self, key: &str) -> Result<Option<u64>> {
        Ok(first(
            self.tx,
            "SELECT floor_mib FROM memory_floors WHERE memory_key = $1",
            &[&key],
            |r| r.mib_opt(0),
        )
        .await?
        .flatten())
    }

    async fn set_floor(&mut self, key: &str, mib: u64) -> Result<()> {
        exec(
            self.tx,
            "INSERT INTO memory_floors (memory_key, floor_mib) VALUES ($1, $2) \
             ON CONFLICT (memory_key) DO UPDATE SET floor_mib = EXCLUDED.floor_mib",
            &[&key, &i64_of(mib)],
        )
        .await?;
        Ok(())
    }

    async fn node_of_agent(&mut self, agent: AgentId, lock: bool) -> Result<Option<NodeRow>> {
        let sql = format!(
            "SELECT {} FROM nodes WHERE agent_id = $1{}",
            rows::NODE_COLUMNS,
            if lock { " FOR UPDATE" } else { "" }
        );
        first(self.tx, &sql, &[&agent.to_string()], rows::node).await
    }

    async fn lock_node_of_attempt(&mut self, attempt: &str) -> Result<Option<String>> {
        first(
            self.tx,
            "SELECT n.name FROM nodes n JOIN attempts a ON a.node = n.name WHERE a.id = $1 \
             FOR UPDATE OF n",
            &[&attempt],
            |r| r.text(0),
        )
        .await
    }

    async fn lock_node_settings(&mut self, node: &str) -> Result<Option<(String, String)>> {
        first(
            self.tx,
            "SELECT plan, headroom FROM nodes WHERE name = $1 FOR UPDATE",
            &[&node],
            |r| Ok((r.text(0)?, r.text(1)?)),
        )
        .await
    }

    async fn node_gpus(&mut self, node: &str, lock: bool) -> Result<Option<Vec<GpuInfo>>> {
        let sql = if lock {
            "SELECT gpus FROM nodes WHERE name = $1 FOR UPDATE"
        } else {
            "SELECT gpus FROM nodes WHERE name = $1"
        };
        first(self.tx, sql, &[&node], |r| r.json(0)).await
    }

    async fn nodes(&mut self) -> Result<Vec<NodeRow>> {
        let sql = format!("SELECT {} FROM nodes ORDER BY name", rows::NODE_COLUMNS);
        all(self.tx, &sql, &[], rows::node).await
    }

    async fn upsert_node(
        &mut self,
        node: &str,
        agent: AgentId,
        gpus: &[GpuInfo],
        plan: &Plan,
        headroom: &Headroom,
        now: Millis,
    ) -> Result<()> {
        exec(
            self.tx,
            "INSERT INTO nodes (name, agent_id, gpus, plan, headroom, last_seen, registered_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6) \
             ON CONFLICT (name) DO UPDATE SET agent_id = $2, gpus = $3, plan = $4, \
             headroom = $5, last_seen = $6, registered_at = $6, telemetry = NULL",
            &[
                &node,
                &agent.to_string(),
                &json(&gpus),
                &plan.to_string(),
                &headroom.to_string(),
                &now,
            ],
        )
        .await?;
        Ok(())
    }

    async fn set_plan(&mut self, node: &str, plan: &Plan) -> Result<()> {
        exec(
            self.tx,
            "UPDATE nodes SET plan = $1 WHERE name = $2",
            &[&plan.to_string(), &node],
        )
        .await?;
        Ok(())
    }

    async fn node_samples(&mut self, node: &str) -> Result<Vec<GpuSample>> {
        Ok(first(
            self.tx,
            "SELECT telemetry FROM nodes WHERE name = $1",
            &[&node],
            |r| r.json_opt(0),
        )
        .await?
        .flatten()
        .unwrap_or_default())
    }

    async fn set_node_samples(
        &mut self,
        node: &str,
        gpus: &[GpuSample],
        now: Millis,
    ) -> Result<()> {
        exec(
            self.tx,
            "UPDATE nodes SET telemetry = $1, last_seen = $2 WHERE name = $3",
            &[&json(&gpus), &now, &node],
        )
        .await?;
        Ok(())
    }

    async fn max_node_gpus(&mut self) -> Result<Option<u32>> {
        let r = row(
            self.tx,
            "SELECT MAX(jsonb_array_length(gpus))::BIGINT FROM nodes",
            &[],
        )
        .await?;
        Ok(get::<Option<i64>>(&r, 0)?.map(|n| n.max(0) as u32))
    }

    async fn blocked_gpus(&mut self, node: &str, now: Millis) -> Result<Vec<u32>> {
        all(
            self.tx,
            "SELECT gpu FROM quarantine WHERE node = $1 \
             UNION SELECT gpu FROM gpu_avoid WHERE node = $1 AND until_ms > $2",
            &[&node, &now],
            |r| Ok(r.int(0)? as u32),
        )
        .await
    }

    async fn quarantine_of(&mut self, node: &str) -> Result<Vec<(u32, QuarantineView)>> {
        all(
            self.tx,
            "SELECT gpu, attempt_id, reason, since FROM quarantine WHERE node = $1 \
             ORDER BY since",
            &[&node],
            rows::quarantine,
        )
        .await
    }

    async fn quarantine(
        &mut self,
        node: &str,
        gpu: u32,
        attempt: &str,
        reason: &str,
        now: Millis,
    ) -> Result<()> {
        exec(
            self.tx,
            "INSERT INTO quarantine (node, gpu, attempt_id, reason, since) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (node, gpu, attempt_id) \
             DO UPDATE SET reason = EXCLUDED.reason, since = EXCLUDED.since",
            &[&node, &int(gpu), &attempt, &reason, &now],
        )
        .await?;
        Ok(())
    }

    async fn avoid_gpu(&mut self, node: &str, gpu: u32, until: Millis) -> Result<()> {
        exec(
            self.tx,
            "INSERT INTO gpu_avoid (node, gpu, until_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (node, gpu) DO UPDATE SET until_ms = EXCLUDED.until_ms",
            &[&node, &int(gpu), &until],
        )
        .await?;
        Ok(())
    }

    async fn release_quarantine_of(&mut self, node: &str, attempts: &[String]) -> Result<u64> {
        exec(
            self.tx,
            "DELETE FROM quarantine WHERE node = $1 AND attempt_id = ANY($2)",
            &[&node, &attempts],
        )
        .await
    }

    async fn release_quarantine_on(&mut self, node: &str, gpu: u32) -> Result<u64> {
        exec(
            self.tx,
            "DELETE FROM quarantine WHERE node = $1 AND gpu = $2",
            &[&node, &int(gpu)],
        )
        .await
    }

    async fn insert_telemetry(
        &mut self,
        node: &str,
        samples: &[TelemetrySample],
    ) -> Result<u64> {
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
        exec(
            self.tx,
            "INSERT INTO gpu_telemetry (node, gpu, at, used_mib, free_mib, total_mib, \
             utilization_pct, power_mw, energy_mj, temperature_mdeg, sm_clock_mhz, throttle, \
             error) \
             SELECT $1, t.gpu, t.at, t.used, t.free, t.total, t.util, t.power, t.energy, \
             t.temp, t.sm, t.throttle::JSONB, t.error \
             FROM UNNEST($2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::BIGINT[], \
             $6::BIGINT[], $7::BIGINT[], $8::BIGINT[], $9::BIGINT[], $10::BIGINT[], \
             $11::BIGINT[], $12::TEXT[], $13::TEXT[]) \
             AS t(gpu, at, used, free, total, util, power, energy, temp, sm, throttle, error) \
             ON CONFLICT (node, gpu, at) DO NOTHING",
            &[
                &node, &gpu, &at, &used, &free, &total, &util, &power, &energy, &temp, &sm,
                &throttle, &error,
            ],
        )
        .await
    }

    async fn series(
        &mut self,
        node: &str,
        gpu: u32,
        w: &SeriesWindow,
    ) -> Result<Vec<TelemetrySample>> {
        let sql = format!(
            "SELECT {} FROM gpu_telemetry WHERE node = $1 AND gpu = $2 AND at >= $3 \
             AND at <= $4 ORDER BY at DESC, id DESC LIMIT $5",
            rows::TELEMETRY_COLUMNS
        );
        let mut out = all(
            self.tx,
            &sql,
            &[&node, &int(gpu), &w.since, &w.until, &int(w.limit)],
            rows::telemetry_sample,
        )
        .await?;
        out.reverse();
        Ok(out)
    }

    async fn prune_older(&mut self, older_than: Millis, batch: u32) -> Result<u64> {
        exec(
            self.tx,
            "DELETE FROM gpu_telemetry WHERE id IN \
             (SELECT id FROM gpu_telemetry WHERE at < $1 ORDER BY at LIMIT $2)",
            &[&older_than, &int(batch)],
        )
        .await
    }

    async fn series_cutoff(
        &mut self,
        node: &str,
        gpu: u32,
        keep: u64,
    ) -> Result<Option<(i64, i64)>> {
        first(
            self.tx,
            "SELECT at, id FROM gpu_telemetry WHERE node = $1 AND gpu = $2 \
             ORDER BY at DESC, id DESC LIMIT 1 OFFSET $3",
            &[&node, &int(gpu), &i64_of(keep)],
            |r| Ok((r.int(0)?, r.int(1)?)),
        )
        .await
    }

    async fn prune_to(
        &mut self,
        node: &str,
        gpu: u32,
        (at, id): (i64, i64),
        batch: u32,
    ) -> Result<u64> {
        exec(
            self.tx,
            "DELETE FROM gpu_telemetry WHERE id IN \
             (SELECT id FROM gpu_telemetry WHERE node = $1 AND gpu = $2 \
              AND (at < $3 OR (at = $3 AND id <= $4)) ORDER BY at LIMIT $5)",
            &[&node, &int(gpu), &at, &id, &int(batch)],
        )
        .await
    }

    async fn insert_token(&mut self, t: &NewToken, now: Millis) -> Result<bool> {
        Ok(exec(
            self.tx,
            "INSERT INTO tokens (id, name, role, secret_hash, created_by, created_at, \
             expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
            &[
                &t.id,
                &t.name,
                &t.role.as_str(),
                &t.secret_hash,
                &t.created_by,
                &now,
                &t.expires_at,
            ],
        )
        .await?
            == 1)
    }

    async fn token(&mut self, id: &str) -> Result<Option<StoredToken>> {
        let sql = format!("SELECT {} FROM tokens WHERE id = $1", rows::TOKEN_COLUMNS);
        first(self.tx, &sql, &[&id], rows::token_row).await
    }

    async fn tokens(&mut self) -> Result<Vec<StoredToken>> {
        let sql = format!(
            "SELECT {} FROM tokens ORDER BY created_at, id",
            rows::TOKEN_COLUMNS
        );
        all(self.tx, &sql, &[], rows::token_row).await
    }

    async fn revoke_token(&mut self, id: &str, now: Millis) -> Result<bool> {
        Ok(exec(
            self.tx,
            "UPDATE tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2",
            &[&now, &id],
        )
        .await?
            == 1)
    }
}
