//! The embedded SQLite store (one file, WAL) for `headroom up` on one machine: how it runs
//! the SQL of `sql` (its `Exec`), and the statements SQLite does its own way. SQLite calls
//! block, so the one connection lives on a thread of its own and each operation runs whole
//! there, in the order they come (its statements never wait, so the operation's future is
//! driven there to completion; operations that arrive together run back to back). Write
//! transactions are `BEGIN IMMEDIATE`: they hold the database's write lock from the start,
//! which is why locking reads only read here. The WAL is checkpointed by a second connection
//! on a thread of its own (`checkpoint`), so no operation waits for its flushes.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::{Arc, mpsc};

use async_trait::async_trait;
use headroom_shared::api::TelemetrySample;
use rusqlite::config::DbConfig;
use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{Connection, Row, params};

use super::exec::{Arg, Dialect, EachRow, Exec, Raw, RowRef};
use super::rows::{self, i64_of, opt_i64};
use super::tx::{Backend, Op};
use super::{Millis, NewExperiment, Result, StoreError};
use crate::changes::{Change, Changes};

mod checkpoint;
mod embedded {
    refinery::embed_migrations!("migrations/sqlite");
}

pub use checkpoint::Checkpoints;

/// Prepared statements kept on the connection (the store's distinct statements, with room).
const STATEMENT_CACHE: usize = 512;

/// An operation for the connection's thread.
type Task = Box<dyn FnOnce(&mut Connection) + Send>;

#[derive(Clone)]
pub struct SqliteStore {
    /// To the thread that owns the connection; it ends when the last clone is dropped.
    tasks: mpsc::Sender<Task>,
    changes: Changes,
    /// How the WAL was checkpointed (a file's store; none in memory).
    checkpoints: Option<Arc<Checkpoints>>,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(e.to_string())
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and runs pending migrations.
    pub fn open(path: &Path) -> Result<Self> {
        let mut conn = configured(Connection::open(path)?)?;
        let checkpoints = checkpoint::start(&mut conn, path)?;
        Self::init(conn, Some(checkpoints))
    }

    pub fn open_in_memory() -> Result<Self> {
        Self::init(configured(Connection::open_in_memory()?)?, None)
    }

    /// How the WAL has been checkpointed so far; `None` for a store in memory.
    pub fn checkpoints(&self) -> Option<&Checkpoints> {
        self.checkpoints.as_deref()
    }

    fn init(conn: Connection, checkpoints: Option<Arc<Checkpoints>>) -> Result<Self> {
        let (tasks, queue) = mpsc::channel::<Task>();
        std::thread::Builder::new()
            .name("sqlite-store".into())
            .spawn(move || serve(conn, queue))
            .map_err(|e| StoreError::Database(format!("cannot start the store's thread: {e}")))?;
        Ok(Self {
            tasks,
            changes: Changes::default(),
            checkpoints,
        })
    }

    /// Runs `f` on the connection's thread, after the operations sent before it.
    async fn blocking<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.tasks
            .send(Box::new(move |conn: &mut Connection| {
                let _ = answer.send(f(conn));
            }))
            .map_err(|_| StoreError::Database("the store's thread has stopped".into()))?;
        answered
            .await
            .map_err(|_| StoreError::Database("a store operation panicked".into()))?
    }

    /// Runs `op` over the connection; a write inside `BEGIN IMMEDIATE`/`COMMIT`, rolled back
    /// when the operation fails.
    async fn run<T: Send + 'static>(&self, write: bool, op: Op<T>) -> Result<T> {
        self.blocking(move |conn| {
            if !write {
                return futures::executor::block_on(op(&mut SqliteTx { conn }));
            }
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let committed = match futures::executor::block_on(op(&mut SqliteTx { conn })) {
                Ok(v) => conn
                    .execute_batch("COMMIT")
                    .map(|()| v)
                    .map_err(StoreError::from),
                Err(e) => Err(e),
            };
            // What failed (the operation, or its commit) is the answer; a rollback that fails
            // too (SQLite may have rolled back already) is logged, not put in its place.
            if committed.is_err()
                && !conn.is_autocommit()
                && let Err(e) = conn.execute_batch("ROLLBACK")
            {
                tracing::error!("SQLite: rolling back a failed transaction failed: {e}");
            }
            committed
        })
        .await
    }
}

#[async_trait]
impl Backend for SqliteStore {
    fn changes(&self) -> Changes {
        self.changes.clone()
    }

    async fn schema_version(&self) -> Result<i64> {
        self.blocking(|c| {
            Ok(c.query_row(
                "SELECT COALESCE(MAX(version), 0) FROM refinery_schema_history",
                [],
                |r| r.get(0),
            )?)
        })
        .await
    }

    /// One connection, so no writer runs meanwhile: the reads see one state without a
    /// transaction of their own.
    async fn read<T: Send + 'static>(&self, op: Op<T>) -> Result<T> {
        self.run(false, op).await
    }

    async fn write<T: Send + 'static>(&self, op: Op<(T, Change)>) -> Result<T> {
        let (out, changed) = self.run(true, op).await?;
        self.changes.bump(changed);
        Ok(out)
    }
}

/// The connection with the store's settings, its schema migrated.
fn configured(mut conn: Connection) -> Result<Connection> {
    // WAL + NORMAL: durable at checkpoints, no fsync per job; a crash of the process
    // loses nothing, a power cut at most the last moments.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    // Every statement the store runs stays prepared: rusqlite keeps 16 by default, fewer
    // than a job's claim, start and finish use, so each was parsed again.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Plans never depend on bound values: without this, a statement whose parameter
    // meets a partial index's predicate or a LIMIT was compiled again whenever the value
    // changed (most of the claim's time). The partial indexes' predicates are literals in
    // the statements, so they are still used.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    embedded::migrations::runner()
        .run(&mut conn)
        .map_err(|e| StoreError::Database(format!("migration failed: {e}")))?;
    Ok(conn)
}

/// The connection's thread: each operation in turn until the store is dropped. A panicking
/// operation fails alone (its caller hears of it), its transaction rolled back.
fn serve(mut conn: Connection, queue: mpsc::Receiver<Task>) {
    while let Ok(task) = queue.recv() {
        let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| task(&mut conn))).is_err();
        if panicked
            && !conn.is_autocommit()
            && let Err(e) = conn.execute_batch("ROLLBACK")
        {
            tracing::error!("SQLite: rolling back after a panicked operation failed: {e}");
        }
    }
}

/// Where SQLite's SQL differs: one writer holds the database, so nothing to lock.
static DIALECT: Dialect = Dialect {
    lock: "",
    lock_attempt: "",
    lock_job: "",
    lock_node: "",
    lock_job_and_attempt: "",
    skip_locked: "",
    waiting_index: " INDEXED BY jobs_waiting",
    waiting_cpu_index: " INDEXED BY jobs_waiting_cpu",
    waiting_user_index: " INDEXED BY jobs_waiting_by_user",
    clock: None,
    json_array_length: "json_array_length",
    json_elements: "json_each",
};

fn json<T: serde::Serialize>(v: &T) -> Result<String> {
    Ok(serde_json::to_string(v)?)
}

/// The statement with PostgreSQL's `$n` placeholders written as SQLite's `?n`.
fn placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        let numbered = c == '$' && chars.peek().is_some_and(char::is_ascii_digit);
        out.push(if numbered { '?' } else { c });
    }
    out
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Arg::Null => ToSqlOutput::Owned(Value::Null),
            Arg::Int(v) => ToSqlOutput::Owned(Value::Integer(*v)),
            Arg::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
            Arg::Bool(b) => ToSqlOutput::Owned(Value::Integer(i64::from(*b))),
            Arg::Json(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
            Arg::Bytes(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
        })
    }
}

impl Raw for Row<'_> {
    fn text_opt(&self, i: usize) -> Result<Option<String>> {
        Ok(self.get(i)?)
    }
    fn int_opt(&self, i: usize) -> Result<Option<i64>> {
        Ok(self.get(i)?)
    }
    fn flag_opt(&self, i: usize) -> Result<Option<bool>> {
        Ok(self.get(i)?)
    }
    fn bytes_opt(&self, i: usize) -> Result<Option<Vec<u8>>> {
        Ok(self.get(i)?)
    }
    fn json_with(&self, i: usize, f: &mut dyn FnMut(Option<&str>) -> Result<()>) -> Result<()> {
        match self.get_ref(i)? {
            ValueRef::Null => f(None),
            ValueRef::Text(t) => f(Some(
                std::str::from_utf8(t).map_err(|e| StoreError::Corrupt(e.to_string()))?,
            )),
            other => Err(StoreError::Corrupt(format!(
                "column {i}: JSON text expected, found {other:?}"
            ))),
        }
    }
}

/// One transaction's statements over the connection.
struct SqliteTx<'c> {
    conn: &'c mut Connection,
}

#[async_trait]
impl Exec for SqliteTx<'_> {
    fn dialect(&self) -> &'static Dialect {
        &DIALECT
    }

    async fn query(&mut self, sql: &str, args: &[Arg<'_>], each: &mut EachRow<'_>) -> Result<()> {
        let mut stmt = self.conn.prepare_cached(&placeholders(sql))?;
        let mut rows = stmt.query(rusqlite::params_from_iter(args))?;
        while let Some(r) = rows.next()? {
            each(&RowRef(r))?;
        }
        Ok(())
    }

    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        let mut stmt = self.conn.prepare_cached(&placeholders(sql))?;
        Ok(stmt.execute(rusqlite::params_from_iter(args))? as u64)
    }

    async fn insert_jobs(&mut self, exp: &NewExperiment, now: Millis) -> Result<()> {
        let mut stmt = self.conn.prepare_cached(
            "INSERT INTO jobs (id, experiment_id, idx, config, run, state, priority, params, \
             argv, env, profile, gpus, estimate_mib, timeout_ms, max_attempts, retry_on, \
             created_at, updated_at, memory_key, command, shell, ladder, submitted_by, \
             prestart, background, background_mib) \
             VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
             ?15, ?16, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24)",
        )?;
        let id = exp.id.to_string();
        for j in &exp.jobs {
            stmt.execute(params![
                j.id.to_string(),
                id,
                j.index,
                j.config,
                j.run,
                j.priority,
                json(&j.params)?,
                json(&j.argv)?,
                json(&j.env)?,
                j.profile,
                j.gpus,
                opt_i64(j.estimate_mib),
                opt_i64(j.timeout_ms),
                j.max_attempts,
                json(&j.retry_on)?,
                now,
                j.memory_key,
                json(&j.command)?,
                j.shell,
                json(&j.oom_ladder)?,
                exp.submitted_by,
                j.prestart.as_ref().map(json).transpose()?,
                j.background.as_ref().map(json).transpose()?,
                j.background.as_ref().map(|b| i64_of(b.memory_mib)),
            ])?;
        }
        Ok(())
    }

    async fn insert_samples(&mut self, node: &str, samples: &[TelemetrySample]) -> Result<u64> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "INSERT OR IGNORE INTO gpu_telemetry (node, {}) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            rows::TELEMETRY_COLUMNS
        ))?;
        let mut stored = 0u64;
        for s in samples {
            let r = rows::telemetry_row(s);
            let throttle = r.throttle.as_ref().map(json).transpose()?;
            stored += stmt.execute(params![
                node,
                r.gpu,
                r.at,
                r.used_mib,
                r.free_mib,
                r.total_mib,
                r.utilization_pct,
                r.power_mw,
                r.energy_mj,
                r.temperature_mdeg,
                r.sm_clock_mhz,
                throttle,
                r.error,
            ])? as u64;
        }
        Ok(stored)
    }

    async fn lock_key(&mut self, _key: &str) -> Result<()> {
        Ok(())
    }

    async fn lock_round(&mut self, _name: &str) -> Result<()> {
        Ok(())
    }

    async fn cancels_asked(
        &mut self,
        agent: &str,
        attempts: &[String],
    ) -> Result<Vec<(String, super::StopAsk)>> {
        use rusqlite::OptionalExtension;
        let mut stmt = self.conn.prepare_cached(
            "SELECT requeue FROM attempts WHERE id = ?1 AND agent_id = ?2 \
             AND cancel_requested = 1 AND phase != 'ended'",
        )?;
        let mut out = Vec::new();
        for a in attempts {
            let asked: Option<Option<String>> =
                stmt.query_row(params![a, agent], |r| r.get(0)).optional()?;
            if let Some(requeue) = asked
                && let Some(ask) = super::StopAsk::of(true, requeue.as_deref())
            {
                out.push((a.clone(), ask));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's store has its WAL checkpointed mostly beside it: its commits checkpoint
    /// (only what is left) once per 4,000 pages, not once per 1,000 pages (each of which
    /// made every operation queued behind it wait for two flushes), and the WAL is still
    /// written over from its start again and again.
    #[tokio::test]
    async fn the_wal_is_checkpointed_beside_the_store_not_by_its_commits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("headroom.db");
        let store = SqliteStore::open(&path).expect("open");
        store
            .blocking(|c| Ok(c.execute_batch("CREATE TABLE scratch (v BLOB)")?))
            .await
            .expect("table");
        // Each commit adds a page or two to the WAL: several times the checkpoint threshold.
        const COMMITS: u64 = 4_000;
        for _ in 0..COMMITS {
            store
                .blocking(|c| Ok(c.execute("INSERT INTO scratch VALUES (zeroblob(3000))", [])?))
                .await
                .expect("insert");
        }
        let checkpoints = store.checkpoints().expect("a file's store is checkpointed");
        assert_eq!(checkpoints.failed(), 0);
        assert!(checkpoints.background() >= 1, "{checkpoints:?}");
        // Each commit writes at least three pages (a leaf, its parent, the header), and
        // SQLite's own checkpoint would have run in a commit once per 1,000 of them.
        assert!(
            checkpoints.inline() <= COMMITS / 1_000,
            "{checkpoints:?} after {COMMITS} commits"
        );
        // Never started over, it would hold a frame (a page and its header) per page written:
        // at least 3 x 4,000. A background checkpoint late under load lets it pass 4,000
        // frames before it starts over, never its bound.
        let wal = wal_len(dir.path());
        assert!(
            wal <= wal_bound(),
            "WAL of {wal} bytes, more than {}",
            wal_bound()
        );
    }

    /// A WAL's length in the file, whose frames (a page and its header) are never taken
    /// back: the most it held.
    fn wal_len(dir: &std::path::Path) -> u64 {
        std::fs::metadata(dir.join("headroom.db-wal"))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// The most a WAL may hold: its bound and the frames of the commit that found it there.
    fn wal_bound() -> u64 {
        32 + (checkpoint::WAIT_AFTER as u64 + 16) * (4096 + 24)
    }

    /// A checkpointer slow to finish (a loaded disk) does not let the WAL grow past its
    /// bound: the commit that finds it there waits for the checkpointer, then starts it over.
    #[tokio::test]
    #[expect(
        clippy::await_holding_lock,
        reason = "the guard is the slow checkpointer; the commits wait on the store's thread"
    )]
    async fn commits_wait_at_the_wal_s_bound_for_a_slow_checkpointer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("headroom.db")).expect("open");
        store
            .blocking(|c| Ok(c.execute_batch("CREATE TABLE scratch (v BLOB)")?))
            .await
            .expect("table");
        let writer = store.clone();
        // Each commit writes three pages or more: never held, the WAL would end three times
        // over its bound.
        let commits = tokio::spawn(async move {
            for _ in 0..checkpoint::WAIT_AFTER {
                writer
                    .blocking(|c| Ok(c.execute("INSERT INTO scratch VALUES (zeroblob(3000))", [])?))
                    .await
                    .expect("insert");
            }
        });
        let checkpoints = store.checkpoints().expect("a file's store is checkpointed");
        let held = checkpoints.hold();
        let at_bound = 32 + checkpoint::WAIT_AFTER as u64 * (4096 + 24);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while wal_len(dir.path()) < at_bound {
            assert!(
                std::time::Instant::now() < deadline && !commits.is_finished(),
                "the WAL never reached its bound ({} bytes)",
                wal_len(dir.path())
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        // The checkpointer still at it: the commits wait, the WAL stays where it is.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let waiting = wal_len(dir.path());
        assert!(
            waiting <= wal_bound(),
            "WAL of {waiting} bytes past its bound"
        );
        assert!(
            !commits.is_finished(),
            "the commits went on past the WAL's bound"
        );
        drop(held);
        commits.await.expect("the commits");
        assert!(checkpoints.waited() >= 1, "{checkpoints:?}");
        assert_eq!(checkpoints.failed(), 0);
        let wal = wal_len(dir.path());
        assert!(
            wal <= wal_bound(),
            "WAL of {wal} bytes, more than {}",
            wal_bound()
        );
    }

    /// The claim's window, read with other values bound each time (as every claim does), is
    /// not compiled again for each (it was, whenever the window's size changed).
    #[test]
    fn the_claims_window_stays_prepared() {
        let conn = configured(Connection::open_in_memory().expect("open")).expect("migrated");
        let sql = placeholders(&super::super::sql::pending_window(
            &DIALECT, false, false, true,
        ));
        let mut stmt = conn.prepare_cached(&sql).expect("prepare");
        for (gpus, priority, seq, limit) in
            [(8, None, 0, 32), (4, Some(0), 17, 64), (1, Some(5), 2, 8)]
        {
            stmt.query(params![gpus, priority, seq, limit])
                .expect("query")
                .next()
                .expect("step");
        }
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0);
    }

    /// The steps of SQLite's plan for `sql` (numbered placeholders) with `values` bound.
    fn plan_of(conn: &Connection, sql: &str, values: impl rusqlite::Params) -> Vec<String> {
        conn.prepare(&format!("EXPLAIN QUERY PLAN {}", placeholders(sql)))
            .expect("explain")
            .query_map(values, |r| r.get::<_, String>(3))
            .expect("plan")
            .collect::<rusqlite::Result<_>>()
            .expect("plan rows")
    }

    /// Plans that do not depend on bound values still use a partial index whose predicate the
    /// statement names as a literal: a key's latest peaks come from `attempts_key_peaks`.
    #[test]
    fn a_keys_latest_peaks_are_read_from_their_index() {
        let conn = configured(Connection::open_in_memory().expect("open")).expect("migrated");
        let plan = plan_of(&conn, super::super::sql::LATEST_PEAKS, params!["key", 256]);
        assert!(
            plan.iter().any(|step| step.contains("attempts_key_peaks")),
            "{plan:?}"
        );
    }

    /// A claim reads its node's live attempts, and an expiry sweep the live leases, from
    /// partial indexes of the live attempts: not through every attempt the node or the store
    /// ever ran (0.6 ms a claim after 3,000 jobs on one node). A progress count of one
    /// experiment reads its jobs' states from an index alone, not the whole table.
    #[test]
    fn live_attempts_and_progress_counts_are_read_from_their_indexes() {
        use super::super::sql;
        let conn = configured(Connection::open_in_memory().expect("open")).expect("migrated");
        let uses = |plan: &[String], what: &str| plan.iter().any(|step| step.contains(what));
        let active = plan_of(&conn, &sql::ACTIVE_ON, params!["node"]);
        assert!(
            uses(&active, "USING INDEX attempts_live (node=?)"),
            "{active:?}"
        );
        let expired = plan_of(&conn, sql::EXPIRED, params![0]);
        assert!(uses(&expired, "USING INDEX attempts_live"), "{expired:?}");
        let counts = plan_of(&conn, sql::EXPERIMENT_STATE_COUNTS, params!["experiment"]);
        assert!(
            uses(&counts, "USING COVERING INDEX jobs_experiment_state"),
            "{counts:?}"
        );
    }

    /// A claim's windows of waiting jobs are read in order from their partial indexes, a
    /// window at a time: never every waiting job sorted at each claim (SQLite's planner, left
    /// to itself, chose that), and, once the node's GPUs are taken, only jobs that need none.
    #[test]
    fn a_claims_windows_are_read_from_their_indexes_without_a_sort() {
        let conn = configured(Connection::open_in_memory().expect("open")).expect("migrated");
        for (cpu_only, by_user, index) in [
            (false, false, "jobs_waiting"),
            (true, false, "jobs_waiting_cpu"),
            (false, true, "jobs_waiting_by_user"),
        ] {
            let sql = super::super::sql::pending_window(&DIALECT, cpu_only, by_user, true);
            let plan = if by_user {
                plan_of(&conn, &sql, params![8, None::<i64>, 0, 32, "alice"])
            } else {
                plan_of(&conn, &sql, params![8, None::<i64>, 0, 32])
            };
            assert!(
                plan.iter()
                    .any(|step| step.contains(&format!("USING INDEX {index}"))),
                "{plan:?}"
            );
            assert!(
                !plan.iter().any(|step| step.contains("TEMP B-TREE")),
                "{plan:?}"
            );
        }
    }

    /// Fair share finds the users with waiting jobs by probing their index once per user,
    /// not by reading every waiting job.
    #[test]
    fn the_waiting_users_are_found_from_their_index() {
        let conn = configured(Connection::open_in_memory().expect("open")).expect("migrated");
        let sql = super::super::sql::shares::waiting_users(&DIALECT);
        let plan = plan_of(&conn, &sql, params![8]);
        assert!(
            plan.iter()
                .filter(|step| step.contains("jobs_waiting_by_user"))
                .count()
                >= 2,
            "{plan:?}"
        );
    }

    /// An operation that panics mid-transaction fails alone: its writes are rolled back and
    /// the store goes on serving (a poisoned lock used to fail every later operation).
    #[tokio::test]
    async fn a_panicking_operation_fails_alone_and_its_transaction_is_rolled_back() {
        let store = SqliteStore::open_in_memory().expect("store");
        store
            .blocking(|conn| Ok(conn.execute_batch("CREATE TABLE t (x INTEGER)")?))
            .await
            .expect("table");
        let failed = store
            .blocking(|conn| -> Result<()> {
                conn.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (1)")?;
                panic!("an operation's bug");
            })
            .await;
        assert!(failed.is_err());
        let after = store
            .blocking(|conn| {
                let rows: i64 = conn.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))?;
                Ok((rows, conn.is_autocommit()))
            })
            .await
            .expect("the store still serves");
        assert_eq!(after, (0, true));
    }

    #[test]
    fn numbered_placeholders_become_sqlites() {
        assert_eq!(
            placeholders("SELECT a ->> 'x' FROM t WHERE b = $1 AND c = $12 AND d = '$'"),
            "SELECT a ->> 'x' FROM t WHERE b = ?1 AND c = ?12 AND d = '$'"
        );
    }
}
