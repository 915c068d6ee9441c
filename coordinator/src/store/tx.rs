//! The transaction interface every store operation is written over: the statements a
//! transaction is made of, named by what they read or write (`Tx`, the sum of one trait
//! per section: `JobsTx`, `AttemptsTx`, `NodesTx`, `TelemetryTx`, `AccessTx`, `LogsTx`), and how a
//! backend opens transactions (`Backend`). The operations (`experiments`, `jobs`, `nodes`, `leases`,
//! `telemetry`, `tokens`) are written once over `Tx`; its SQL is written once in `sql`, over
//! what each backend (`sqlite`, `postgres`) implements of `exec::Exec`.
//!
//! # Locks
//! `lock_*` methods lock what they read until the transaction ends on PostgreSQL (row locks
//! and, for memory floors, an advisory lock); on SQLite they only read, since every write
//! transaction holds the database's one write lock (`BEGIN IMMEDIATE`) from its start. Locks
//! are always taken in one order, so concurrent transactions wait for each other instead of
//! deadlocking:
//!
//! **node → jobs (by `seq`) → attempts → memory floors.**
//!
//! Claims of jobs with `max_concurrent`, or of a capped user's, also take one advisory lock
//! (`lock_concurrency_caps`) after their jobs; nothing that holds an attempt or a floor ever
//! asks for it. Charging usage locks ended attempts (skipping locked ones), then users'
//! ledgers in name order; nothing else locks a ledger. A preemption round takes one advisory
//! lock (`lock_preemption`) before anything else, then the jobs it preempts in `seq` order;
//! the alerts sweep takes one too (`lock_alerts`), then nodes, quarantines, experiments and
//! jobs (skipping locked ones) as it reads them. Both locks are in a class of their own
//! (`Exec::lock_round`), apart from the floors'.
//!
//! A job's change never locks the jobs of a study that wait for it: it notes itself
//! (`note_wait_change`) and a transaction of its own settles those, locking them alone, in
//! `seq` order (`store::waits`).
//!
//! Read transactions (`Backend::read`) see one snapshot and must not call `lock_*` methods.

use async_trait::async_trait;
use futures::future::BoxFuture;
use headroom_shared::api::{
    AttemptView, FinishReport, GpuInfo, GpuSample, Headroom, JobDetail, JobSummary, PeakSource,
    QuarantineView, Role, StateCounts, TelemetrySample, UserLimits, UserView,
};
use headroom_shared::pending::PendingReason;
use headroom_shared::{AgentId, FailureClass, JobState, Plan};
use std::collections::HashMap;
use tokio_util::sync::CancellationToken;

pub use super::rows::{AttemptResults, Ended, FinishRead};
use super::rows::{ExperimentRow, LeaseRow, NodeRow};
use super::{
    Active, Millis, NewExperiment, NewToken, OnChange, Result, SeriesWindow, StopAsk, StoredToken,
};
use crate::changes::{Change, Changes};
use crate::fair::{Held, Ledger, Run};
use crate::rules::{FenceRow, JobRules, LadderStep, PendingRow, QueueCursor, RenewalRow};
use headroom_shared::api::source::Source;
use headroom_shared::checkpoint::Requeue;

/// Which jobs a summary read returns, in `seq` order.
#[derive(Clone, Copy, Debug)]
pub enum JobsWhere<'a> {
    Id(&'a str),
    Filter {
        experiment: Option<&'a str>,
        state: Option<JobState>,
        limit: Option<u32>,
        id_prefix: Option<&'a str>,
        index: Option<u32>,
    },
}

/// Which attempts a read returns: one, a job's (by number), or an experiment's (every
/// experiment's when `None`; by number).
#[derive(Clone, Copy, Debug)]
pub enum AttemptsWhere<'a> {
    Id(&'a str),
    Job(&'a str),
    Experiment(Option<&'a str>),
    /// Attempts whose job ran on `node` at some time between `from` and `to` (ms).
    RanOn {
        node: &'a str,
        from: i64,
        to: i64,
    },
}

/// A lease's columns of its job, written with its state: its attempt count and token (its
/// pending reason cleared). One update of the row, not two (on PostgreSQL a second update
/// of a row the transaction wrote also checks its foreign keys again).
#[derive(Clone, Copy, Debug)]
pub struct JobLeased {
    pub attempts: u32,
    pub fence: i64,
}

/// An attempt row about to be written by a lease.
/// A memory key's latest observed peaks (newest first), and what the latest of their runs
/// that ended well taught: each one's peak and its shape (`None`: no shape told).
#[derive(Clone, Debug, Default)]
pub struct KeyPeaks {
    pub peaks: Vec<u64>,
    pub profiles: Vec<(u64, Option<headroom_shared::phases::Phases>)>,
}

pub struct NewAttempt<'a> {
    pub id: String,
    pub job: &'a str,
    pub number: u32,
    pub node: &'a str,
    pub agent: AgentId,
    pub gpus: &'a [u32],
    pub fence: i64,
    pub estimate_mib: Option<u64>,
    pub estimate_source: &'a str,
    pub leased_at: Millis,
    pub expires_at: Millis,
    pub memory_key: &'a str,
    pub params: &'a std::collections::BTreeMap<String, serde_json::Value>,
    pub ladder_step: i64,
    /// Digest of the attempt's key (`attempt_keys`).
    pub report_key_hash: &'a str,
    /// GPU memory the lease reserves over all its GPUs (fair share charges it).
    pub reserved_mib: u64,
    /// Host memory it is admitted with (its cgroup's limit).
    pub host_mib: Option<u64>,
    /// The memory phases it is placed by, declared or learned.
    pub phases: Option<headroom_shared::phases::Phases>,
}

/// The statements of one transaction: every section's.
pub trait Tx:
    JobsTx
    + AttemptsTx
    + NodesTx
    + TelemetryTx
    + AccessTx
    + LogsTx
    + BundlesTx
    + ResultsTx
    + WaitsTx
    + SharesTx
    + AlertsTx
{
}

impl<
    T: JobsTx
        + AttemptsTx
        + NodesTx
        + TelemetryTx
        + AccessTx
        + LogsTx
        + BundlesTx
        + ResultsTx
        + WaitsTx
        + SharesTx
        + AlertsTx
        + ?Sized,
> Tx for T
{
}

/// Experiments and jobs: inserting, reading and changing them.
#[async_trait]
pub trait JobsTx: Send {
    /// Serializes the claims of jobs with `max_concurrent` until the transaction ends
    /// (nothing to do where a write transaction holds the whole database).
    async fn lock_concurrency_caps(&mut self) -> Result<()>;
    /// How many of an experiment's jobs are leased or running.
    async fn active_jobs_of(&mut self, experiment: &str) -> Result<u32>;
    /// Inserts an experiment and all its jobs (`queued`), each with its own columns.
    async fn insert_experiment(&mut self, exp: &NewExperiment, now: Millis) -> Result<()>;
    async fn experiment_ids(&mut self) -> Result<Vec<String>>;
    /// `name, seed, created_at, submitted_by, source` of an experiment.
    async fn experiment_row(&mut self, id: &str) -> Result<Option<ExperimentRow>>;
    /// The sources of an experiment (or of every one), by id.
    async fn experiment_sources(
        &mut self,
        experiment: Option<&str>,
    ) -> Result<Vec<(String, Option<Source>)>>;
    async fn state_counts(&mut self, experiment: Option<&str>) -> Result<StateCounts>;
    /// Whether some job (of the experiment, or any) has not ended: one index probe, where a
    /// count reads every job.
    async fn unfinished(&mut self, experiment: Option<&str>) -> Result<bool>;
    async fn job_summaries(&mut self, which: JobsWhere<'_>) -> Result<Vec<JobSummary>>;
    /// The job's detail columns around its summary and attempts.
    async fn job_detail(
        &mut self,
        id: &str,
        summary: JobSummary,
        attempts: Vec<AttemptView>,
    ) -> Result<Option<JobDetail>>;
    /// An experiment's jobs with their states, in `seq` order.
    async fn jobs_of_experiment(&mut self, experiment: &str) -> Result<Vec<(String, JobState)>>;
    /// A job's state, the job locked.
    async fn lock_job(&mut self, job: &str) -> Result<Option<JobState>>;
    /// Sets the state if it still is `from`, and on a lease the lease's columns in the same
    /// update; the rows changed (0: another transaction won).
    async fn set_job_state(
        &mut self,
        job: &str,
        from: JobState,
        to: JobState,
        now: Millis,
        leased: Option<JobLeased>,
    ) -> Result<u64>;
    /// The job's columns the outcome rules read (the job is locked by the caller).
    async fn job_rules(&mut self, job: &str) -> Result<Option<JobRules>>;
    async fn set_job_tries(&mut self, job: &str, attempts: u32, max_attempts: u32) -> Result<()>;
    async fn set_last_failure(&mut self, job: &str, class: Option<FailureClass>) -> Result<()>;
    async fn set_pending_reason(&mut self, job: &str, reason: Option<&PendingReason>)
    -> Result<()>;
    async fn set_job_ladder(&mut self, job: &str, step: &LadderStep) -> Result<()>;
    /// The memory key the job had before any ladder step (`None`: not known).
    async fn fit_of_job(&mut self, job: &str) -> Result<Option<String>>;
    /// Records that a run of `key` fit at ladder step `step` (kept when a higher one is); the
    /// step kept.
    async fn raise_ladder_fit(
        &mut self,
        key: &str,
        step: u32,
        attempt: &str,
        now: Millis,
    ) -> Result<u32>;
    /// Jobs of the experiment whose key fit at a higher step than theirs: (job, step, the
    /// attempt that fit).
    async fn fits_of_experiment(&mut self, experiment: &str) -> Result<Vec<(String, u32, String)>>;
    /// Locks the waiting jobs of `key` that never ran, below ladder step `below` (a job a
    /// claim holds is skipped on PostgreSQL).
    async fn lock_unstarted_of_key(&mut self, key: &str, below: u32) -> Result<Vec<String>>;
    /// Why the job starts at its ladder step.
    async fn set_ladder_from(&mut self, job: &str, why: &str) -> Result<()>;
    /// The columns a new lease of the job is made of.
    async fn lease_row(&mut self, job: &str) -> Result<Option<LeaseRow>>;
    /// Waiting jobs fitting `max_gpus` (of `user` alone when given), highest priority first
    /// then oldest, at most `limit`; on PostgreSQL locked, skipping those another transaction
    /// holds.
    async fn lock_pending(
        &mut self,
        user: Option<&str>,
        max_gpus: u32,
        after: Option<QueueCursor>,
        limit: u32,
    ) -> Result<Vec<PendingRow>>;
    /// Waiting jobs per pending reason code (`not_considered` without one).
    async fn pending_reason_counts(&mut self) -> Result<Vec<(String, u64)>>;
    /// Ended attempts by `failure_class` (`succeeded` for none).
    async fn outcome_counts(&mut self) -> Result<Vec<(String, u64)>>;
    /// Jobs not ended and not cancelled, by submitter and state.
    async fn user_job_counts(&mut self) -> Result<Vec<(String, JobState, u64)>>;
}

/// Attempts: leases, fences, starts, ends, cancellations and what ends teach.
#[async_trait]
pub trait AttemptsTx: Send {
    async fn attempt_views(&mut self, which: AttemptsWhere<'_>) -> Result<Vec<AttemptView>>;
    /// The job of an attempt and its state, the job locked (not the attempt: callers lock
    /// it next, the job first as every operation locks).
    async fn lock_job_of_attempt(&mut self, attempt: &str) -> Result<Option<(String, JobState)>>;
    /// An attempt's fencing columns, with its job and the job's state: the job and then the
    /// attempt locked, in one read.
    async fn lock_job_and_fence(
        &mut self,
        attempt: &str,
    ) -> Result<Option<(String, JobState, FenceRow)>>;
    /// What a finish report is checked against and what its end reads before it writes (its
    /// job and node, a stop asked of it, its job's rules, its experiment's results
    /// settings): the job and then the attempt locked, in one read.
    async fn lock_finish_read(&mut self, attempt: &str) -> Result<Option<FinishRead>>;
    /// What a heartbeat of `agent` is checked against, for each of `attempts` that exists,
    /// by id: its rows locked in job order (as the lease sweep locks them), in one read.
    async fn lock_renewal_rows(
        &mut self,
        attempts: &[String],
        agent: AgentId,
    ) -> Result<HashMap<String, RenewalRow>>;
    /// Fencing columns and failure class, for log chunks.
    async fn log_fence_row(
        &mut self,
        attempt: &str,
    ) -> Result<Option<(FenceRow, Option<FailureClass>)>>;
    /// The node's attempts not ended, in job (`seq`) order.
    async fn active_on(&mut self, node: &str) -> Result<Vec<Active>>;
    /// Attempts not ended whose lease ran out before `now`, in job order.
    async fn expired(&mut self, now: Millis) -> Result<Vec<String>>;
    async fn insert_attempt(&mut self, a: &NewAttempt<'_>) -> Result<()>;
    /// Ends an attempt not yet ended as `lost` (with `expired_before`, only if its lease
    /// still ran out before then); whether it had started, `None` when it did not end it.
    async fn end_lost(
        &mut self,
        attempt: &str,
        now: Millis,
        expired_before: Option<Millis>,
    ) -> Result<Option<bool>>;
    /// Moves a live attempt to `agent` with a new expiry; false when it had ended.
    async fn resume_attempt(
        &mut self,
        attempt: &str,
        agent: AgentId,
        until: Millis,
    ) -> Result<bool>;
    /// Renews the leases of `renew` (each attempt with what it waits on) in one write; what
    /// was asked of each, by id (an attempt missing from it does not exist).
    async fn renew_attempts(
        &mut self,
        renew: &[(String, Option<String>)],
        until: Millis,
    ) -> Result<HashMap<String, Option<StopAsk>>>;
    /// Now, by the clock every replica shares (the database's), in ms since the epoch.
    async fn clock(&mut self) -> Result<Millis>;
    /// Renews a lease for its supervisor, leaving what the agent said of its wait as it
    /// is; what was asked of it (`None`: no such attempt).
    async fn extend_lease(
        &mut self,
        attempt: &str,
        until: Millis,
    ) -> Result<Option<Option<StopAsk>>>;
    /// The digest of the attempt's key (`None`: no such attempt; `Some(None)`: none issued).
    async fn attempt_key(&mut self, attempt: &str) -> Result<Option<Option<String>>>;
    /// Records the attempt running; returns when its job was submitted, the attempt's number
    /// and, where it was placed by memory phases (which count from its start), its node
    /// (`None`: no such attempt).
    async fn set_running(
        &mut self,
        attempt: &str,
        pid: u32,
        at: Millis,
    ) -> Result<Option<(Millis, u32, Option<String>)>>;
    /// The attempt's memory key (`None`: no such attempt).
    async fn memory_key_of(&mut self, attempt: &str) -> Result<Option<String>>;
    /// Records the attempt's end as its report says, measurements and wait included.
    async fn set_ended(
        &mut self,
        attempt: &str,
        report: &FinishReport,
        peak_source: Option<PeakSource>,
    ) -> Result<Option<Ended>>;
    /// Deletes a leased attempt; its GPUs.
    async fn delete_attempt(&mut self, attempt: &str) -> Result<Option<Vec<u32>>>;
    /// Asks the job's live attempts to stop (a user's cancel wins over a requeue).
    async fn request_cancel(&mut self, job: &str) -> Result<()>;
    /// Asks the job's live attempts not asked anything yet to stop after their checkpoint
    /// signal and requeue; how many were asked.
    async fn request_requeue(&mut self, job: &str, why: Requeue) -> Result<u64>;
    /// Why the ended attempt ran out of GPU memory.
    async fn set_oom_cause(
        &mut self,
        attempt: &str,
        cause: headroom_shared::api::OomCause,
        neighbour: Option<&str>,
    ) -> Result<()>;
    /// How many of the job's attempts ran out of memory for a neighbour that grew.
    async fn neighbour_grew_count(&mut self, job: &str) -> Result<u32>;
    /// Of `attempts`, those of `agent` not ended that were asked to stop, and how.
    async fn cancel_requested(
        &mut self,
        agent: AgentId,
        attempts: &[String],
    ) -> Result<Vec<(String, StopAsk)>>;
    /// Observed peaks of a memory key's attempts.
    async fn peaks(&mut self, key: &str) -> Result<KeyPeaks>;
    /// Observed host memory peaks of a memory key's latest attempts that succeeded or were
    /// killed at their memory limit.
    async fn host_peaks(&mut self, key: &str) -> Result<Vec<u64>>;
    /// The mean run time of a memory key's latest successful attempts, if it had any.
    async fn key_duration_ms(&mut self, key: &str) -> Result<Option<u64>>;
    /// A memory key's OOM floor, locked (an advisory lock on PostgreSQL, so writers of a key
    /// with no floor yet serialize too).
    async fn lock_floor(&mut self, key: &str) -> Result<Option<u64>>;
    /// A memory key's OOM floor, read without a lock.
    async fn floor(&mut self, key: &str) -> Result<Option<u64>>;
    async fn set_floor(&mut self, key: &str, mib: u64) -> Result<()>;
}

/// Nodes: registration, plans, samples and quarantine.
#[async_trait]
pub trait NodesTx: Send {
    /// The node an agent registered as; locked when `lock`.
    async fn node_of_agent(&mut self, agent: AgentId, lock: bool) -> Result<Option<NodeRow>>;
    /// The node an attempt runs on, locked; its name.
    async fn lock_node_of_attempt(&mut self, attempt: &str) -> Result<Option<String>>;
    /// The node an attempt was leased on (not locked).
    async fn node_of_attempt(&mut self, attempt: &str) -> Result<Option<String>>;
    /// A node's current agent and when it was last heard of (read under the node's lock).
    async fn node_holder(&mut self, node: &str)
    -> Result<Option<(Option<String>, Option<Millis>)>>;
    /// Forgets when the node was last heard of (its agent counts as gone); rows changed.
    async fn forget_node_seen(&mut self, node: &str) -> Result<u64>;
    /// A node's stored plan and headroom, locked.
    async fn lock_node_settings(&mut self, node: &str) -> Result<Option<(String, String)>>;
    /// A node's GPUs; locked when `lock`.
    async fn node_gpus(&mut self, node: &str, lock: bool) -> Result<Option<Vec<GpuInfo>>>;
    async fn nodes(&mut self) -> Result<Vec<NodeRow>>;
    /// Inserts or replaces a node's registration (its latest samples cleared).
    #[allow(clippy::too_many_arguments)]
    /// Sets the node's host memory usable by jobs (after its row exists).
    async fn set_host_memory(&mut self, node: &str, mib: Option<u64>) -> Result<()>;
    async fn upsert_node(
        &mut self,
        node: &str,
        agent: AgentId,
        gpus: &[GpuInfo],
        plan: &Plan,
        headroom: &Headroom,
        now: Millis,
    ) -> Result<()>;
    async fn set_plan(&mut self, node: &str, plan: &Plan) -> Result<()>;
    /// Stores the node's latest samples and when it was last heard of.
    async fn set_node_samples(&mut self, node: &str, gpus: &[GpuSample], now: Millis)
    -> Result<()>;
    /// Stores the samples an attempt's end on the node brought, outside the node's row, at
    /// the clock `clock` reads (as of the write).
    async fn set_end_samples(&mut self, node: &str, gpus: &[GpuSample]) -> Result<()>;
    /// The samples the node's latest attempt end brought, and when.
    async fn end_samples(&mut self, node: &str) -> Result<Option<(Vec<GpuSample>, Millis)>>;
    async fn max_node_gpus(&mut self) -> Result<Option<u32>>;
    /// GPUs claims skip: quarantined, or avoided until after `now`.
    async fn blocked_gpus(&mut self, node: &str, now: Millis) -> Result<Vec<u32>>;
    async fn quarantine_of(&mut self, node: &str) -> Result<Vec<(u32, QuarantineView)>>;
    async fn quarantine(
        &mut self,
        node: &str,
        gpu: u32,
        attempt: &str,
        reason: &str,
        now: Millis,
    ) -> Result<()>;
    async fn avoid_gpu(&mut self, node: &str, gpu: u32, until: Millis) -> Result<()>;
    async fn release_quarantine_of(&mut self, node: &str, attempts: &[String]) -> Result<u64>;
    async fn release_quarantine_on(&mut self, node: &str, gpu: u32) -> Result<u64>;
}

/// Telemetry series: stored, read and pruned.
#[async_trait]
pub trait TelemetryTx: Send {
    /// Stores samples of a node's GPUs; a sample already stored (GPU and instant) is not
    /// stored twice. How many were new.
    async fn insert_telemetry(&mut self, node: &str, samples: &[TelemetrySample]) -> Result<u64>;
    /// One GPU's samples in `w`, oldest first (the newest `w.limit` of them).
    async fn series(
        &mut self,
        node: &str,
        gpu: u32,
        w: &SeriesWindow,
    ) -> Result<Vec<TelemetrySample>>;
    /// Deletes at most `batch` samples older than `older_than`, oldest first.
    async fn prune_older(&mut self, older_than: Millis, batch: u32) -> Result<u64>;
    /// `(at, id)` of one GPU's newest sample beyond the newest `keep`.
    async fn series_cutoff(
        &mut self,
        node: &str,
        gpu: u32,
        keep: u64,
    ) -> Result<Option<(i64, i64)>>;
    /// Deletes at most `batch` of one GPU's samples up to the cutoff, oldest first.
    async fn prune_to(
        &mut self,
        node: &str,
        gpu: u32,
        cutoff: (i64, i64),
        batch: u32,
    ) -> Result<u64>;
}

/// Tokens and users.
#[async_trait]
pub trait AccessTx: Send {
    /// Inserts a token; false when one with its id exists.
    async fn insert_token(&mut self, token: &NewToken, now: Millis) -> Result<bool>;
    async fn token(&mut self, id: &str) -> Result<Option<StoredToken>>;
    async fn tokens(&mut self) -> Result<Vec<StoredToken>>;
    /// Sets a token's revocation time unless it has one; false when no such token.
    async fn revoke_token(&mut self, id: &str, now: Millis) -> Result<bool>;
    /// Sets a token's digest unless it has one; false when it has, or no such token.
    async fn keep_token_digest(&mut self, id: &str, digest: &str) -> Result<bool>;

    // ---- users ----
    /// Adds the user unless one of that name exists; the role the name has now.
    async fn ensure_user(&mut self, name: &str, role: Role, now: Millis) -> Result<Role>;
    /// Makes a user of `name` with `role`; false (nothing written) when the name exists,
    /// whatever its role. The unique name decides between concurrent callers.
    async fn insert_new_user(&mut self, name: &str, role: Role, now: Millis) -> Result<bool>;
    /// Creates or changes a user; `false` when the name has another role.
    async fn put_user(&mut self, u: &UserView) -> Result<bool>;
    /// Sets a user's fair-share weight and caps.
    async fn set_user_limits(&mut self, name: &str, limits: &UserLimits) -> Result<()>;
    /// Every user, or the one named.
    async fn users(&mut self, name: Option<&str>) -> Result<Vec<UserView>>;
}

/// Attempt logs: how much of each is kept, and its chunks.
#[async_trait]
pub trait LogsTx: Send {
    /// How many bytes of the attempt's log are kept, and whether it was cut (nothing yet:
    /// its row is made). Locks the attempt's log until the transaction ends, its first
    /// chunk's included (two first chunks at once: the second waits for the first's row).
    async fn lock_log(&mut self, attempt: &str) -> Result<(u64, bool)>;
    /// Sets how much of the attempt's log is kept.
    async fn set_log(&mut self, attempt: &str, kept: u64, cut: bool) -> Result<()>;
    /// Stores a chunk at `at` in the kept text.
    async fn insert_log_chunk(&mut self, attempt: &str, at: u64, data: &[u8]) -> Result<()>;
    /// The chunks that hold bytes of `[from, to)`, in order: each with where it starts.
    async fn log_chunks(
        &mut self,
        attempt: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, Vec<u8>)>>;
}

/// Code bundles, by the SHA-256 of their bytes.
#[async_trait]
pub trait BundlesTx: Send {
    /// Keeps a bundle unless one of that hash is kept, and that `by` uploaded it; whether
    /// the bundle was new.
    async fn insert_bundle(
        &mut self,
        hash: &str,
        data: &[u8],
        by: &str,
        now: Millis,
    ) -> Result<bool>;
    /// The bundle's size, if one is kept (and `uploaded_by` uploaded it, where given).
    async fn bundle_size(&mut self, hash: &str, uploaded_by: Option<&str>) -> Result<Option<u64>>;
    /// Whether an attempt not ended on `node` runs from the bundle `hash`.
    async fn bundle_leased_to(&mut self, hash: &str, node: &str) -> Result<bool>;
    async fn bundle_data(&mut self, hash: &str) -> Result<Option<Vec<u8>>>;
}

/// A store operation over one transaction.
pub type Op<T> = Box<dyn for<'t> FnOnce(&'t mut dyn Tx) -> BoxFuture<'t, Result<T>> + Send>;

/// A database a store runs on: how it opens transactions and announces changes.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The counter bumped after each committed transaction that changed something a waiter
    /// may care about.
    fn changes(&self) -> Changes;
    async fn schema_version(&self) -> Result<i64>;
    /// Runs `op` in one read-only transaction on one snapshot.
    async fn read<T: Send + 'static>(&self, op: Op<T>) -> Result<T>;
    /// Runs `op` in one write transaction; the change it says it made is announced (to
    /// other replicas at commit, to this process's waiters after it).
    async fn write<T: Send + 'static>(&self, op: Op<(T, Change)>) -> Result<T>;
    /// See `Store::watch_changes`.
    async fn watch_changes(&self, on_change: OnChange, shutdown: CancellationToken) {
        let _ = (on_change, shutdown);
    }
}

/// An attempt's row of [`ResultsTx::experiment_series`].
#[derive(Clone, Debug)]
pub struct SeriesRow {
    pub attempt: String,
    pub job: String,
    pub index: i64,
    pub number: i64,
    pub params: std::collections::BTreeMap<String, serde_json::Value>,
    pub state: String,
    pub phase: String,
    pub finals: std::collections::BTreeMap<String, f64>,
    pub ignored: u64,
    pub rungs: Vec<headroom_shared::results::RungDecision>,
    pub series: std::collections::BTreeMap<String, Vec<headroom_shared::results::Point>>,
}

/// An attempt's row of [`ResultsTx::tracking_row`].
#[derive(Clone, Debug)]
pub struct TrackingRow {
    pub experiment: String,
    pub index: i64,
    pub results: Option<headroom_shared::results::ResultsSpec>,
    pub source: Option<Source>,
    pub series: std::collections::BTreeMap<String, Vec<headroom_shared::results::Point>>,
}

/// What runs achieved: attempts' metrics, early stopping's rungs, the tracking outbox.
#[async_trait]
pub trait ResultsTx: Send {
    /// Replaces an attempt's final values, ignored count and series.
    async fn set_attempt_metrics(
        &mut self,
        attempt: &str,
        finals: &std::collections::BTreeMap<String, f64>,
        ignored: u64,
        series: &std::collections::BTreeMap<String, Vec<headroom_shared::results::Point>>,
    ) -> Result<()>;
    /// The attempt's experiment, its results settings and the attempt's rung decisions.
    async fn results_of_attempt(&mut self, attempt: &str) -> Result<Option<AttemptResults>>;
    /// Records an attempt's value at a rung in the experiment's ledger (once).
    async fn insert_rung_value(
        &mut self,
        experiment: &str,
        attempt: &str,
        at: &headroom_shared::results::RungValue,
    ) -> Result<()>;
    /// The values other jobs' attempts had at `rung` of the experiment.
    async fn rung_values(&mut self, experiment: &str, rung: u32, attempt: &str)
    -> Result<Vec<f64>>;
    async fn set_attempt_rungs(
        &mut self,
        attempt: &str,
        rungs: &[headroom_shared::results::RungDecision],
    ) -> Result<()>;
    /// Every attempt of the experiment that reported metrics, in job and attempt order;
    /// with `metric`, only its series is read.
    async fn experiment_series(
        &mut self,
        experiment: &str,
        metric: Option<&str>,
    ) -> Result<Vec<SeriesRow>>;
    /// Sets the attempt's tracking note (kept when `None`) and when it is due again (`None`:
    /// never).
    async fn set_tracking(
        &mut self,
        attempt: &str,
        note: Option<&str>,
        due: Option<Millis>,
    ) -> Result<()>;
    /// What an attempt's tracked run is made of besides its view: its experiment's name, its
    /// job's index, the experiment's results settings and source, the attempt's series.
    async fn tracking_row(&mut self, attempt: &str) -> Result<Option<TrackingRow>>;
    /// Claims up to `limit` attempts whose tracking is due at `now`, holding them until
    /// `hold_until`; each with its number of tries so far (this one included).
    async fn claim_tracking(
        &mut self,
        now: Millis,
        hold_until: Millis,
        limit: u32,
    ) -> Result<Vec<(String, u32)>>;
}

/// One wait of a job (`after`), with the state of the job it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitRow {
    pub needs: String,
    pub needs_state: JobState,
    pub needs_experiment: String,
    pub when: headroom_shared::study::AfterWhen,
    pub on_failure: headroom_shared::study::OnDependencyFailure,
}

/// A study's waits between jobs (`after`).
#[async_trait]
pub trait WaitsTx: Send {
    async fn insert_waits(&mut self, waits: &[super::NewDependency]) -> Result<()>;
    /// The jobs that wait for `job`, in `seq` order, with their states.
    async fn dependants(&mut self, job: &str) -> Result<Vec<(String, JobState)>>;
    /// The waits of `job`.
    async fn waits_of(&mut self, job: &str) -> Result<Vec<WaitRow>>;
    /// Sets how many of the job's waits are not met yet (a claim reads only jobs with none).
    async fn set_waiting_on(&mut self, job: &str, unmet: u64) -> Result<()>;
    /// Every job of the experiment that waits: as many waits unmet as it has (a study's jobs
    /// are all queued when stored).
    async fn count_new_waits(&mut self, experiment: &str) -> Result<()>;
    /// Notes that `job` changed so that the jobs waiting for it must be counted again; a
    /// job no one waits for notes nothing.
    async fn note_wait_change(&mut self, job: &str, now: Millis) -> Result<()>;
    /// The oldest notes, at most `limit`: (note id, job).
    async fn wait_changes_due(&mut self, limit: u32) -> Result<Vec<(i64, String)>>;
    async fn drop_wait_changes(&mut self, ids: &[i64]) -> Result<()>;
}

/// Fair share, users' caps and preemption: who waits, each user's ledger and runs not yet
/// charged, the usage report's reads, and who holds what on nodes that run preemptible jobs.
#[async_trait]
pub trait SharesTx: Send {
    /// Nodes with a live attempt of a `preemptible` experiment, by name.
    async fn preemptible_nodes(&mut self) -> Result<Vec<String>>;
    /// The live attempts of `node`, as preemption weighs them.
    async fn holders_on(&mut self, node: &str) -> Result<Vec<HolderRow>>;
    /// [`JobsTx::lock_pending`] for `user`, without locking: the head of their queue.
    async fn read_pending(
        &mut self,
        user: &str,
        max_gpus: u32,
        limit: u32,
    ) -> Result<Vec<PendingRow>>;
    /// Taken by each preemption round: one replica's at a time, so that two do not each
    /// make room for the same job.
    async fn lock_preemption(&mut self) -> Result<()>;
    /// When the job was last preempted.
    async fn set_preempted_at(&mut self, job: &str, at: Millis) -> Result<()>;
    /// The users with jobs waiting that fit `max_gpus`, by name.
    async fn waiting_users(&mut self, max_gpus: u32) -> Result<Vec<String>>;
    /// Users whose share or caps differ from the defaults (share 1, no cap).
    async fn user_limits(&mut self) -> Result<Vec<(String, UserLimits)>>;
    /// Every user's ledger.
    async fn ledgers(&mut self) -> Result<Vec<(String, Ledger)>>;
    /// Attempts not yet charged (running, or ended since the last charge).
    async fn uncharged_runs(&mut self) -> Result<Vec<Run>>;
    /// What `user`'s attempts not ended hold.
    async fn held_by(&mut self, user: &str) -> Result<Held>;
    /// Ended attempts not yet charged, at most `limit`, locked (skipping locked ones).
    async fn lock_uncharged_ended(&mut self, limit: u32) -> Result<Vec<(String, Run)>>;
    /// Locks `user`'s ledger (made empty when missing).
    async fn lock_ledger(&mut self, user: &str, now: Millis) -> Result<Ledger>;
    async fn set_ledger(&mut self, user: &str, ledger: Ledger) -> Result<()>;
    async fn mark_charged(&mut self, attempts: &[String]) -> Result<()>;
    /// Attempts that ran (or were leased) in `[from, to)`, for the usage report.
    async fn usage_attempts(&mut self, from: Millis, to: Millis) -> Result<Vec<UsageAttempt>>;
    /// Jobs that ended in `[from, to)`: (user, experiment id, experiment name, state).
    async fn ended_jobs(
        &mut self,
        from: Millis,
        to: Millis,
    ) -> Result<Vec<(String, String, String, JobState)>>;
}

/// A live attempt as preemption reads it.
#[derive(Clone, Debug)]
pub struct HolderRow {
    pub attempt: String,
    pub job: String,
    /// Its job's place in submission order (the order jobs are locked in).
    pub seq: i64,
    pub user: String,
    pub priority: i64,
    /// Its experiment is `preemptible`.
    pub preemptible: bool,
    /// Its cancel or requeue was asked.
    pub stopping: bool,
    pub preempted_at: Option<Millis>,
}

/// An attempt as the usage report reads it.
#[derive(Clone, Debug)]
pub struct UsageAttempt {
    pub user: String,
    pub experiment: String,
    pub experiment_name: String,
    pub gpus: u32,
    pub reserved_mib: Option<u64>,
    pub started: Option<Millis>,
    pub ended: Option<Millis>,
    pub energy_mj: Option<u64>,
    /// Its GPUs' energy was not its own (another process, or another attempt, shared them).
    pub contaminated: bool,
}

/// An event to keep in the alerts outbox.
#[derive(Clone, Debug)]
pub struct NewAlertEvent {
    pub kind: headroom_shared::api::alerts::AlertKind,
    /// Whose jobs it is about (`None`: the lab's machines).
    pub subject: Option<String>,
    pub summary: String,
    pub details: serde_json::Value,
    pub at: Millis,
}

/// A delivery with what its try sends and where.
#[derive(Clone, Debug)]
pub struct DeliveryRow {
    pub id: String,
    pub event: i64,
    pub kind: headroom_shared::api::alerts::AlertKind,
    pub summary: String,
    pub details: serde_json::Value,
    pub at: Millis,
    pub target: headroom_shared::api::alerts::AlertTarget,
    pub tries: u32,
}

/// An experiment as the alerts sweep reads it: who submitted it, its failures in a row, and
/// whether its end was told.
#[derive(Clone, Debug)]
pub struct ExperimentAlerts {
    pub name: String,
    pub submitted_by: String,
    pub failure_streak: u32,
    pub ended_alerted: bool,
}

/// A job's end (or its return from one), as noted for the alerts sweep.
#[derive(Clone, Debug)]
pub struct AlertNote {
    pub id: i64,
    pub job: String,
    pub experiment: String,
    pub state: JobState,
    pub at: Millis,
}

/// A job that has waited in the queue past the alert's threshold.
#[derive(Clone, Debug)]
pub struct LongWait {
    pub job: String,
    pub experiment: String,
    pub experiment_name: String,
    pub submitted_by: String,
    /// When it last changed state: since when it has waited.
    pub waiting_since: Millis,
    pub pending_reason: Option<PendingReason>,
}

/// Alerts: subscriptions, the outbox of events and their deliveries, and the marks that
/// make an event be taken once (an experiment's failures in a row, a node's loss, a job's
/// long wait).
#[async_trait]
pub trait AlertsTx: Send {
    async fn insert_subscription(
        &mut self,
        view: &headroom_shared::api::alerts::SubscriptionView,
    ) -> Result<()>;
    /// Subscriptions, oldest first: `owner`'s only where given.
    async fn subscriptions(
        &mut self,
        owner: Option<&str>,
    ) -> Result<Vec<headroom_shared::api::alerts::SubscriptionView>>;
    /// Deletes a subscription and its deliveries; the rows deleted of the subscription.
    async fn delete_subscription(&mut self, id: &str) -> Result<u64>;
    /// Keeps an event; its number.
    async fn insert_alert_event(&mut self, event: &NewAlertEvent) -> Result<i64>;
    async fn insert_delivery(
        &mut self,
        id: &str,
        event: i64,
        subscription: &str,
        due: Millis,
    ) -> Result<()>;
    /// Claims up to `limit` pending deliveries due at `now`, holding them until
    /// `hold_until` (another replica leaves them alone meanwhile); each with its tries so
    /// far, this one counted.
    async fn claim_deliveries(
        &mut self,
        now: Millis,
        hold_until: Millis,
        limit: u32,
    ) -> Result<Vec<(String, u32)>>;
    async fn delivery(&mut self, id: &str) -> Result<Option<DeliveryRow>>;
    /// Sets a delivery's state, when it is due again (`None`: never) and its last error,
    /// if it is still pending at `tries` (the claim that made this try is still the latest);
    /// whether it was.
    #[allow(clippy::too_many_arguments)]
    async fn set_delivery(
        &mut self,
        id: &str,
        tries: u32,
        state: headroom_shared::api::alerts::DeliveryState,
        due: Option<Millis>,
        error: Option<&str>,
        delivered_at: Option<Millis>,
    ) -> Result<bool>;
    /// The newest `limit` deliveries (of `owner`'s subscriptions, where given), dead
    /// letters first.
    async fn deliveries(
        &mut self,
        owner: Option<&str>,
        limit: u32,
    ) -> Result<Vec<headroom_shared::api::alerts::DeliveryView>>;
    /// Notes that the job ended (or, `state` not terminal, came back from its end), for the
    /// alerts sweep: an insert only, taking no lock another transaction waits on.
    async fn note_job_end(&mut self, job: &str, state: JobState, at: Millis) -> Result<()>;
    /// The oldest `limit` notes, in the order they were written.
    async fn alert_notes(&mut self, limit: u32) -> Result<Vec<AlertNote>>;
    /// Drops these notes (those read: a note of a lower number may commit after them).
    async fn drop_alert_notes(&mut self, ids: &[i64]) -> Result<()>;
    /// Taken by each alerts sweep: one replica's at a time, so that notes are read in order
    /// and an event is taken once.
    async fn lock_alerts(&mut self) -> Result<()>;
    async fn experiment_alerts(&mut self, experiment: &str) -> Result<Option<ExperimentAlerts>>;
    async fn set_experiment_alerts(
        &mut self,
        experiment: &str,
        failure_streak: u32,
        ended_alerted: bool,
    ) -> Result<()>;
    /// Who submitted the job, and its experiment's id and name.
    async fn job_owner(&mut self, job: &str) -> Result<Option<(String, String, String)>>;
    /// Quarantines in place since before `cutoff` and not yet told of as lasting, now marked
    /// told: (node, GPU, attempt, reason, since).
    async fn mark_lasting_quarantines(
        &mut self,
        cutoff: Millis,
    ) -> Result<Vec<(String, u32, String, String, Millis)>>;
    /// Every GPU's drift as last seen: (node, GPU, drift).
    async fn drifts(&mut self) -> Result<Vec<(String, u32, headroom_shared::api::DriftView)>>;
    async fn put_drift(
        &mut self,
        node: &str,
        gpu: u32,
        drift: &headroom_shared::api::DriftView,
    ) -> Result<()>;
    async fn clear_drift(&mut self, node: &str, gpu: u32) -> Result<()>;
    /// Nodes silent since before `cutoff` and not yet told of, now marked told.
    async fn mark_lost_nodes(&mut self, cutoff: Millis) -> Result<Vec<String>>;
    /// Up to `limit` jobs waiting (queued or retrying, for no other job) since before
    /// `cutoff` and not yet told of, now marked told.
    async fn mark_long_waits(&mut self, cutoff: Millis, limit: u32) -> Result<Vec<LongWait>>;
    /// Delivered deliveries and dead letters settled before `before`, and events left
    /// without deliveries from before it, go; how many rows went.
    async fn prune_alerts(&mut self, before: Millis) -> Result<u64>;
}
