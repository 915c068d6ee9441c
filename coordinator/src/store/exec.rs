//! What a backend's transaction must do for the shared SQL (`sql`) to run on it: `Exec`
//! runs a statement with `Arg` parameters and hands each row (`RowRef`, decoded through
//! `rows::Cols`), names the few words its dialect says differently, and runs the statements
//! only its database does well.

use async_trait::async_trait;
use headroom_shared::api::TelemetrySample;
use serde::de::DeserializeOwned;

use super::rows::Cols;
use super::{Millis, NewExperiment, Result, StoreError};

/// The words in which the two databases' SQL differs.
pub struct Dialect {
    /// Appended to a read that locks its row (`FOR UPDATE`; nothing on SQLite).
    pub lock: &'static str,
    /// The same, locking only the attempt (`a`), the job (`j`) or the node (`n`) of a join.
    pub lock_attempt: &'static str,
    pub lock_job: &'static str,
    pub lock_node: &'static str,
    /// The job, then its attempt, in one read: rows are locked in the order `OF` names them,
    /// the job first as every operation locks.
    pub lock_job_and_attempt: &'static str,
    /// Appended to the read of waiting jobs a claim considers.
    pub skip_locked: &'static str,
    /// After `FROM jobs` in the claim's windows of waiting jobs, of any jobs and of CPU-only
    /// ones: SQLite's planner, without statistics, prefers `jobs_pending` and a sort of every
    /// waiting job to the partial index in order (`INDEXED BY` there; nothing on PostgreSQL).
    pub waiting_index: &'static str,
    pub waiting_cpu_index: &'static str,
    /// The same for one user's waiting jobs (fair share reads each user's queue).
    pub waiting_user_index: &'static str,
    /// The function giving a JSON array's length.
    pub json_array_length: &'static str,
    /// The table function over a JSON array's elements, each in a column `value` that `->>`
    /// reads.
    pub json_elements: &'static str,
    /// The database's clock in ms since the epoch, as an SQL expression: lease times come
    /// from one clock, not each replica's. `None`: the process's own (SQLite, one process).
    pub clock: Option<&'static str>,
}

/// A statement parameter.
#[derive(Debug)]
pub enum Arg<'a> {
    Null,
    Int(i64),
    Text(&'a str),
    Bool(bool),
    /// JSON text, stored as JSON (TEXT on SQLite, JSONB on PostgreSQL).
    Json(String),
    /// Bytes (BLOB on SQLite, BYTEA on PostgreSQL).
    Bytes(&'a [u8]),
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

impl From<u32> for Arg<'_> {
    fn from(v: u32) -> Self {
        Arg::Int(i64::from(v))
    }
}

impl From<i32> for Arg<'_> {
    fn from(v: i32) -> Self {
        Arg::Int(i64::from(v))
    }
}

impl From<bool> for Arg<'_> {
    fn from(v: bool) -> Self {
        Arg::Bool(v)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(v)
    }
}

impl<'a, T: Into<Arg<'a>>> From<Option<T>> for Arg<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Arg::Null, Into::into)
    }
}

/// A value as JSON, for a JSON column.
pub fn json<T: serde::Serialize>(v: &T) -> Result<Arg<'static>> {
    Ok(Arg::Json(serde_json::to_string(v)?))
}

/// One result row as a backend reads it, in place: typed reads of its columns by position.
pub trait Raw {
    fn text_opt(&self, i: usize) -> Result<Option<String>>;
    fn int_opt(&self, i: usize) -> Result<Option<i64>>;
    fn flag_opt(&self, i: usize) -> Result<Option<bool>>;
    /// Hands a JSON column's text to `f` (`None` when NULL) without copying it.
    fn json_with(&self, i: usize, f: &mut dyn FnMut(Option<&str>) -> Result<()>) -> Result<()>;
    fn bytes_opt(&self, i: usize) -> Result<Option<Vec<u8>>>;
}

/// A row of either backend, decoded through `Cols` (by `rows`).
pub struct RowRef<'a>(pub &'a dyn Raw);

fn missing(i: usize, what: &str) -> StoreError {
    StoreError::Corrupt(format!("column {i}: {what} expected, found NULL"))
}

impl Cols for RowRef<'_> {
    fn text(&self, i: usize) -> Result<String> {
        self.0.text_opt(i)?.ok_or_else(|| missing(i, "text"))
    }
    fn text_opt(&self, i: usize) -> Result<Option<String>> {
        self.0.text_opt(i)
    }
    fn int(&self, i: usize) -> Result<i64> {
        self.0.int_opt(i)?.ok_or_else(|| missing(i, "integer"))
    }
    fn int_opt(&self, i: usize) -> Result<Option<i64>> {
        self.0.int_opt(i)
    }
    fn flag(&self, i: usize) -> Result<bool> {
        self.0.flag_opt(i)?.ok_or_else(|| missing(i, "boolean"))
    }
    fn flag_opt(&self, i: usize) -> Result<Option<bool>> {
        self.0.flag_opt(i)
    }
    fn bytes(&self, i: usize) -> Result<Vec<u8>> {
        self.0.bytes_opt(i)?.ok_or_else(|| missing(i, "bytes"))
    }
    fn json<T: DeserializeOwned>(&self, i: usize) -> Result<T> {
        self.json_opt(i)?.ok_or_else(|| missing(i, "JSON"))
    }
    fn json_opt<T: DeserializeOwned>(&self, i: usize) -> Result<Option<T>> {
        let mut out = None;
        self.0.json_with(i, &mut |text| {
            out = text.map(serde_json::from_str).transpose()?;
            Ok(())
        })?;
        Ok(out)
    }
}

/// Called with each row of a query.
pub type EachRow<'f> = dyn FnMut(&RowRef<'_>) -> Result<()> + Send + 'f;

/// What a backend's transaction must do for the SQL here to run on it.
#[async_trait]
pub trait Exec: Send {
    fn dialect(&self) -> &'static Dialect;
    /// Runs a query, handing each row to `each` in turn.
    async fn query(&mut self, sql: &str, args: &[Arg<'_>], each: &mut EachRow<'_>) -> Result<()>;
    /// Runs a statement; the rows it changed.
    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64>;

    /// Inserts an experiment's jobs (the experiment row is stored).
    async fn insert_jobs(&mut self, exp: &NewExperiment, now: Millis) -> Result<()>;
    /// See `Tx::insert_telemetry`.
    async fn insert_samples(&mut self, node: &str, samples: &[TelemetrySample]) -> Result<u64>;
    /// Serializes the writers of one memory key's floor until the transaction ends (nothing
    /// to do where a write transaction holds the whole database).
    async fn lock_key(&mut self, key: &str) -> Result<()>;
    /// Serializes one kind of round across replicas (a preemption round, the alerts sweep)
    /// until the transaction ends, in a lock class of its own: no memory key's floor lock
    /// can collide with it.
    async fn lock_round(&mut self, name: &str) -> Result<()>;
    /// See `Tx::cancel_requested`.
    async fn cancels_asked(
        &mut self,
        agent: &str,
        attempts: &[String],
    ) -> Result<Vec<(String, super::StopAsk)>>;
}
