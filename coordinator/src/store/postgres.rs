//! The PostgreSQL store for clusters: the SQL of each `Tx` statement, a connection pool, row
//! locks (in the order `tx` states) so several coordinator replicas can serve one database,
//! batch inserts, `SKIP LOCKED` claims, and LISTEN/NOTIFY so a change made through one
//! replica wakes the long-polls of the others.

use std::future::poll_fn;
use std::pin::pin;
use std::time::Duration;

use async_trait::async_trait;
use bytes::BytesMut;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, Transaction,
};
use headroom_shared::api::TelemetrySample;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, IsNull, Json, ToSql, Type, to_sql_checked};
use tokio_postgres::{AsyncMessage, Client, Connection, IsolationLevel, Row, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::CancellationToken;

use super::exec::{Arg, Dialect, EachRow, Exec, Raw, RowRef};
use super::rows::{self, i64_of, opt_i64};
use super::tx::{Backend, Op};
use super::{Millis, NewExperiment, OnChange, Result, StoreError};
use crate::changes::{Change, Changes};

mod embedded {
    refinery::embed_migrations!("migrations/postgres");
}

/// Most pooled connections per coordinator; a request waits for a free one.
const POOL_SIZE: usize = 16;
/// A database that does not answer within this fails the request (503, the client retries)
/// instead of holding it forever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const POOL_WAIT: Duration = Duration::from_secs(10);
/// The channel every state change is announced on.
const CHANNEL: &str = "headroom_changes";
/// Session advisory lock held while migrating, so replicas starting together migrate once.
const MIGRATION_LOCK: i64 = 0x6865_6164_726f_6f6d; // "headroom"
/// First key of the transaction advisory locks of memory floors (the second is the key's
/// hash).
const FLOOR_LOCK: i32 = 0x6866_6c72; // "hflr"
/// The advisory lock class of rounds one replica runs at a time (`Exec::lock_round`).
const ROUND_LOCK: i32 = 0x6872_6e64; // "hrnd"
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
    /// How connections are made over TLS (`sslmode`, `sslrootcert`: `pgtls`).
    tls: MakeRustlsConnect,
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
        let bad = |e: String| {
            StoreError::Database(format!("bad database URL `{}`: {e}", redact_url(url)))
        };
        let (mut config, tls) = super::pgtls::resolve(url).map_err(bad)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("headroom-coordinator");
        }
        migrate(&config, tls.clone()).await?;
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
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
            tls,
            origin: uuid::Uuid::new_v4().simple().to_string(),
            changes: Changes::default(),
        })
    }

    async fn client(&self) -> Result<Object> {
        Ok(self.pool.get().await?)
    }
}

/// Runs pending migrations on a connection of its own, under an advisory lock.
async fn migrate(config: &tokio_postgres::Config, tls: MakeRustlsConnect) -> Result<()> {
    let (mut client, connection) = config.connect(tls).await?;
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

// ---- statements ----------------------------------------------------------------------

/// Where PostgreSQL's SQL differs: row locks, held to the transaction's end.
pub(crate) static DIALECT: Dialect = Dialect {
    lock: " FOR UPDATE",
    lock_attempt: " FOR UPDATE OF a",
    lock_job: " FOR UPDATE OF j",
    lock_node: " FOR UPDATE OF n",
    lock_job_and_attempt: " FOR UPDATE OF j, a",
    skip_locked: " FOR UPDATE SKIP LOCKED",
    waiting_index: "",
    waiting_cpu_index: "",
    waiting_user_index: "",
    clock: Some("CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"),
    json_array_length: "jsonb_array_length",
    json_elements: "jsonb_array_elements",
};

fn json<T: serde::Serialize + std::fmt::Debug>(v: &T) -> Json<&T> {
    Json(v)
}

fn int(v: u32) -> i64 {
    i64::from(v)
}

type BoxError = Box<dyn std::error::Error + Sync + Send>;

impl ToSql for Arg<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> std::result::Result<IsNull, BoxError> {
        match self {
            Arg::Null => Ok(IsNull::Yes),
            Arg::Int(v) if *ty == Type::INT4 => i32::try_from(*v)?.to_sql_checked(ty, out),
            Arg::Int(v) => v.to_sql_checked(ty, out),
            Arg::Text(s) => s.to_sql_checked(ty, out),
            Arg::Bool(b) => b.to_sql_checked(ty, out),
            // JSONB's binary form is a version byte and the text.
            Arg::Json(s) if *ty == Type::JSONB => {
                out.extend_from_slice(&[1]);
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            Arg::Json(s) if *ty == Type::JSON => {
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            Arg::Json(_) => Err(format!("JSON bound to a {ty} parameter").into()),
            Arg::Bytes(b) => b.to_sql_checked(ty, out),
        }
    }

    /// Each variant checks the type it is bound to in `to_sql`.
    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// A JSON or JSONB column's text, borrowed from the row.
struct JsonStr<'a>(&'a str);

impl<'a> FromSql<'a> for JsonStr<'a> {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> std::result::Result<Self, BoxError> {
        let text = if *ty == Type::JSONB {
            match raw.split_first() {
                Some((1, text)) => text,
                _ => return Err("unknown JSONB version".into()),
            }
        } else {
            raw
        };
        Ok(JsonStr(std::str::from_utf8(text)?))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }
}

fn column<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i)
        .map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))
}

impl Raw for Row {
    fn text_opt(&self, i: usize) -> Result<Option<String>> {
        column(self, i)
    }
    fn int_opt(&self, i: usize) -> Result<Option<i64>> {
        if self
            .columns()
            .get(i)
            .is_some_and(|c| *c.type_() == Type::INT4)
        {
            return Ok(column::<Option<i32>>(self, i)?.map(i64::from));
        }
        column(self, i)
    }
    fn flag_opt(&self, i: usize) -> Result<Option<bool>> {
        column(self, i)
    }
    fn bytes_opt(&self, i: usize) -> Result<Option<Vec<u8>>> {
        column(self, i)
    }
    fn json_with(&self, i: usize, f: &mut dyn FnMut(Option<&str>) -> Result<()>) -> Result<()> {
        f(column::<Option<JsonStr<'_>>>(self, i)?.map(|j| j.0))
    }
}

async fn exec(tx: &Transaction<'_>, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
    let stmt = tx.prepare_cached(sql).await?;
    Ok(tx.execute(&stmt, params).await?)
}

fn params<'a>(args: &'a [Arg<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn ToSql + Sync)).collect()
}

// ---- change listener --------------------------------------------------------------

/// A change's notification payload: the replica that made it, then `shown` (watchers
/// only) or `freed <node>`; the origin alone is work for every node.
fn notice(origin: &str, change: &Change) -> String {
    match change {
        Change::Shown => format!("{origin} shown"),
        Change::Freed(node) => format!("{origin} freed {node}"),
        Change::None | Change::Work => origin.to_string(),
    }
}

/// The change another replica announced (`None`: this replica's own). A payload of no
/// known kind (a replica of another version) is taken as work, so no claim sleeps through
/// it.
fn noticed(payload: &str, origin: &str) -> Option<Change> {
    let (from, kind) = payload.split_once(' ').unwrap_or((payload, ""));
    if from == origin {
        return None;
    }
    let freed = kind.strip_prefix("freed ").filter(|node| !node.is_empty());
    Some(match (kind, freed) {
        ("shown", _) => Change::Shown,
        (_, Some(node)) => Change::Freed(node.to_string()),
        _ => Change::Work,
    })
}

/// Polls the listener's connection: notifications arrive only while it is polled. Returns
/// why the connection ended.
async fn deliver<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    connection: &mut Connection<Socket, T>,
    origin: &str,
    on_change: &OnChange,
) -> String {
    loop {
        match poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(n))) => {
                if let Some(change) = noticed(n.payload(), origin) {
                    on_change(change);
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
    on_change(Change::Work);
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
    tls: MakeRustlsConnect,
    origin: &str,
    on_change: &OnChange,
    backoff: &mut Duration,
) -> String {
    let mut config = config.clone();
    config.application_name(LISTENER_APPLICATION_NAME);
    let (client, mut connection) = match config.connect(tls).await {
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
        r.try_get(0)
            .map_err(|e| StoreError::Corrupt(format!("schema version: {e}")))
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
    async fn write<T: Send + 'static>(&self, op: Op<(T, Change)>) -> Result<T> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let (out, changed) = op(&mut PgTx { tx: &tx }).await?;
        if changed != Change::None {
            let payload = notice(&self.origin, &changed);
            exec(&tx, "SELECT pg_notify($1, $2)", &[&CHANNEL, &payload]).await?;
        }
        tx.commit().await?;
        self.changes.bump(changed);
        Ok(out)
    }

    /// Listens on a dedicated connection (not one of the pool's) and reconnects with
    /// backoff when it drops, e.g. across a database restart.
    async fn watch_changes(&self, on_change: OnChange, shutdown: CancellationToken) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let why = tokio::select! {
                _ = shutdown.cancelled() => return,
                why = listen_once(&self.config, self.tls.clone(), &self.origin, &on_change, &mut backoff) => why,
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

#[async_trait]
impl Exec for PgTx<'_> {
    fn dialect(&self) -> &'static Dialect {
        &DIALECT
    }

    async fn query(&mut self, sql: &str, args: &[Arg<'_>], each: &mut EachRow<'_>) -> Result<()> {
        let stmt = self.tx.prepare_cached(sql).await?;
        for row in self.tx.query(&stmt, &params(args)).await? {
            each(&RowRef(&row))?;
        }
        Ok(())
    }

    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        exec(self.tx, sql, &params(args)).await
    }

    async fn insert_jobs(&mut self, exp: &NewExperiment, now: Millis) -> Result<()> {
        let id = exp.id.to_string();
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

    async fn insert_samples(&mut self, node: &str, samples: &[TelemetrySample]) -> Result<u64> {
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

    /// The key's advisory lock (held to the transaction's end) serializes its writers even
    /// before the key has a row to lock.
    async fn lock_key(&mut self, key: &str) -> Result<()> {
        let sql = "SELECT pg_advisory_xact_lock($1, hashtext($2))";
        exec(self.tx, sql, &[&FLOOR_LOCK, &key]).await.map(drop)
    }

    async fn lock_round(&mut self, name: &str) -> Result<()> {
        let sql = "SELECT pg_advisory_xact_lock($1, hashtext($2))";
        exec(self.tx, sql, &[&ROUND_LOCK, &name]).await.map(drop)
    }

    async fn cancels_asked(
        &mut self,
        agent: &str,
        attempts: &[String],
    ) -> Result<Vec<(String, super::StopAsk)>> {
        let sql = "SELECT id, requeue FROM attempts WHERE id = ANY($1) AND agent_id = $2 \
                   AND cancel_requested AND phase != 'ended'";
        let stmt = self.tx.prepare_cached(sql).await?;
        let rows = self.tx.query(&stmt, &[&attempts, &agent]).await?;
        let corrupt = |e: tokio_postgres::Error| StoreError::Corrupt(e.to_string());
        let mut out = Vec::new();
        for r in &rows {
            let id: String = r.try_get(0).map_err(corrupt)?;
            let requeue: Option<String> = r.try_get(1).map_err(corrupt)?;
            if let Some(ask) = super::StopAsk::of(true, requeue.as_deref()) {
                out.push((id, ask));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_carry_their_kind_and_an_unknown_one_is_work() {
        let freed = Change::Freed("gpu box 7".into());
        assert_eq!(
            noticed(&notice("r1", &Change::Shown), "r2"),
            Some(Change::Shown)
        );
        assert_eq!(
            noticed(&notice("r1", &Change::Work), "r2"),
            Some(Change::Work)
        );
        assert_eq!(noticed(&notice("r1", &freed), "r2"), Some(freed.clone()));
        assert_eq!(noticed(&notice("r1", &Change::Work), "r1"), None, "its own");
        assert_eq!(noticed(&notice("r1", &freed), "r1"), None, "its own");
        assert_eq!(
            noticed("r1 freed ", "r2"),
            Some(Change::Work),
            "no node named"
        );
        // A replica of an earlier version sends its origin alone, for any change.
        assert_eq!(noticed("r1", "r2"), Some(Change::Work));
        assert_eq!(noticed("r1 later-kind", "r2"), Some(Change::Work));
    }
}
