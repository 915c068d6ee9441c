//! The `Store`: every durable state change of the coordinator, one transaction per method,
//! named by intent. Two backends (embedded SQLite, PostgreSQL) pass one conformance suite.
//!
//! # Layout
//! - `Store` (here): the operations handlers call, implemented once for every `Backend`.
//! - `experiments`, `jobs`, `nodes`, `leases`, `telemetry`, `tokens`, `logs`: the operations, one
//!   file per resource, each written once over the transaction interface; `sharing`: the
//!   neighbours an attempt view is labelled shared by; `waits` and `waiting`: a study's
//!   jobs that wait for others (`after`): storing and settling them, and counting one's
//!   waits; `history`: what earlier runs of a memory key tell a dry run; `shares`: fair
//!   share's ledgers; `preemption`: a round of preemption; `alerts`: subscriptions, the
//!   outbox of events and their deliveries.
//! - `tx`: that interface (`Tx`, the statements; `Backend`, transactions) and the lock order.
//! - `sql`: every `Tx` statement's SQL, once, over `exec::Exec` (a file per section of
//!   `Tx`): what a backend must run.
//! - `sqlite`, `postgres`: the backends: `Exec` in their dialect, transactions, and what only
//!   one has (pools, batch inserts, advisory locks, NOTIFY, migrations; SQLite's WAL
//!   checkpointer, `sqlite::checkpoint`; PostgreSQL's TLS in libpq's words, `pgtls`).
//! - `rows`: one row decoder for both backends.
//!
//! The decisions live in `crate::rules` (pure); this module reads their facts and writes
//! what they return.

use std::collections::BTreeMap;

use async_trait::async_trait;
use headroom_shared::api::{
    AttemptRef, AttemptTelemetry, AttemptView, ExperimentSummary, FinishReport, GpuInfo, GpuSample,
    Headroom, JobDetail, JobSummary, Lease, NodeView, Role, StateCounts, TelemetrySample,
    TokenView, UserView,
};
use headroom_shared::plan::PlanError;
use headroom_shared::state::TransitionError;
use headroom_shared::{AgentId, AttemptId, ExperimentId, FailureClass, JobId, JobState, Plan};
use serde_json::Value;

use crate::changes::Changes;
pub use alerts::{AlertSweep, DeliveryOutcome};
pub use preemption::{PreemptInput, Preempted};
use tokio_util::sync::CancellationToken;
pub use tx::DeliveryRow;

mod alerts;
mod bundles;
mod exec;
mod experiments;
mod history;
mod jobs;
mod ladder;
mod leases;
pub mod logs;
mod nodes;
mod pgtls;
pub mod postgres;
mod preemption;
mod results;
pub(crate) mod rows;
mod shares;
mod sharing;
mod sql;
pub mod sqlite;
mod telemetry;
mod tokens;
pub(crate) mod tx;
mod waiting;
mod waits;
pub use history::KeyHistory;
pub use tx::TrackingRow;

use tx::{Backend, Op, Tx};

/// An attempt holding a lease on a node, as placement and node views see it.
pub struct Active {
    pub id: String,
    pub gpus: Vec<u32>,
    pub estimate: Option<u64>,
    pub fence: i64,
    /// Its job is exclusive or cools first: nothing else goes on its GPUs.
    pub alone: bool,
    /// Host memory it was admitted with.
    pub host_mib: Option<u64>,
    /// When it started, once its start was reported.
    pub started_ms: Option<Millis>,
    /// The memory phases it was placed by (declared or learned), if any.
    pub phases: Option<headroom_shared::phases::Phases>,
}

impl Active {
    /// Its memory over time, where it was placed by an estimate and memory phases and its
    /// start was reported: its phases count from its start, and until it is known the run is
    /// counted at its estimate (a start may come long after the lease: a code bundle to
    /// unpack, a background to get ready).
    pub fn timed(&self) -> Option<crate::timeline::TimedRun> {
        Some(crate::timeline::TimedRun::new(
            self.estimate?,
            self.phases?,
            self.started_ms?,
        ))
    }

    /// What it is counted to hold at `now`: its estimate, or where its phases put it.
    pub fn held_now(&self, now: Millis) -> Option<u64> {
        match self.timed() {
            Some(run) => Some(run.held_at(now, now)),
            None => self.estimate,
        }
    }
}

/// Called when another process sharing the database changed something.
pub type OnChange = std::sync::Arc<dyn Fn(crate::changes::Change) + Send + Sync>;

pub use crate::rules::Millis;

/// What was asked of a live attempt: to stop (a user's cancel), or to stop after its
/// checkpoint signal and requeue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopAsk {
    Cancel,
    Requeue(headroom_shared::checkpoint::Requeue),
}

impl StopAsk {
    /// From an attempt's `cancel_requested` and `requeue` columns.
    pub(crate) fn of(cancel: bool, requeue: Option<&str>) -> Option<Self> {
        match requeue.and_then(headroom_shared::checkpoint::Requeue::parse) {
            Some(r) => Some(StopAsk::Requeue(r)),
            None => cancel.then_some(StopAsk::Cancel),
        }
    }
}

pub fn now_ms() -> Millis {
    chrono::Utc::now().timestamp_millis()
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no {what} with id {id}")]
    NotFound { what: &'static str, id: String },
    #[error("stale fencing token for attempt {attempt}: the lease was lost or reassigned")]
    StaleFence { attempt: AttemptId },
    #[error("agent {agent} is not registered (or was replaced): register again")]
    UnknownAgent { agent: AgentId },
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("plan: {0}")]
    InvalidPlan(#[from] PlanError),
    #[error("database: {0}")]
    Database(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// A field of what was to be stored is wrong (422 naming it).
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// Another transaction changed the job (or, `None`, rows this one waited for) first:
    /// 409, a lost race, not an outage.
    #[error("{}", match job {
        Some(job) => format!("job {job} changed state concurrently; try again"),
        None => "a concurrent change won the race; try again".to_string(),
    })]
    Conflict { job: Option<String> },
    #[error("a token with id {id} exists")]
    TokenExists { id: String },
    /// The name is a user of another role: 409.
    #[error("user `{name}` exists with role {role}: a name has one role")]
    UserRole {
        name: String,
        role: headroom_shared::api::Role,
    },
    /// A join token asked for the credential of a node that has or had one: 409.
    #[error(
        "node {node} has joined already ({why}): its agent keeps its credential in its data \
         directory; to give it a new one, an admin makes it (`headroom token create --role \
         agent --name {node}`) and puts it there"
    )]
    NodeJoined { node: String, why: String },
    /// Another agent instance is alive on the node: 409.
    #[error(
        "node {node} is held by a live agent (agent {agent}, last heard of {:.1} s ago): stop \
         that agent, wait until it has been silent for the lease TTL, or have an admin run \
         `headroom node takeover {node}`",
        *seen_ms_ago as f64 / 1000.0
    )]
    NodeHeld {
        node: String,
        agent: String,
        seen_ms_ago: i64,
    },
}

/// What a node is looked up by, to check that an agent acts on its own node only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeOf {
    Agent(AgentId),
    Attempt(AttemptId),
}

impl From<crate::rules::Refusal> for StoreError {
    fn from(r: crate::rules::Refusal) -> Self {
        use crate::rules::Refusal;
        match r {
            Refusal::StaleFence { attempt } => StoreError::StaleFence { attempt },
            Refusal::InvalidPlan(e) => StoreError::InvalidPlan(e),
            Refusal::Corrupt(m) => StoreError::Corrupt(m),
        }
    }
}

impl StoreError {
    pub fn not_found(what: &'static str, id: impl ToString) -> Self {
        StoreError::NotFound {
            what,
            id: id.to_string(),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A job as expanded and resolved, ready to store.
#[derive(Clone, Debug)]
pub struct NewJob {
    pub id: JobId,
    pub index: u32,
    pub config: u32,
    pub run: u32,
    pub params: BTreeMap<String, Value>,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub profile: String,
    pub gpus: u32,
    pub estimate_mib: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub max_attempts: u32,
    pub retry_on: Vec<FailureClass>,
    pub priority: i32,
    /// Experiment name and memory-relevant parameters: the key estimates are learned by.
    pub memory_key: String,
    /// The command template and shell flag, to render argv again after an OOM ladder step.
    pub command: Vec<String>,
    pub shell: bool,
    pub oom_ladder: Vec<BTreeMap<String, Value>>,
    /// `exclusive` / `cooldown`; `None`: the job starts at once.
    pub prestart: Option<headroom_shared::prestart::Prestart>,
    /// The colocated background (`colocate`); placement adds its memory to the estimate.
    pub background: Option<headroom_shared::colocate::Background>,
}

#[derive(Clone, Debug)]
pub struct NewExperiment {
    pub id: ExperimentId,
    pub name: String,
    pub seed: u64,
    pub spec: Value,
    pub jobs: Vec<NewJob>,
    /// The submitting token's name; its jobs and their attempts record it too.
    pub submitted_by: String,
    /// Where its jobs run from (`None`: a submission that said nothing of it).
    pub source: Option<headroom_shared::api::source::Source>,
    /// What its runs' output is read for, early stopping and tracking (`None`: nothing).
    pub results: Option<headroom_shared::results::ResultsSpec>,
    /// The study it was submitted in (`None`: submitted alone).
    pub study: Option<StudyOf>,
    /// The most of its jobs leased or running at once (`max_concurrent`).
    pub max_concurrent: Option<u32>,
    /// Host memory each of its jobs holds (`resources.host_memory`).
    pub host_memory_mib: Option<u64>,
    /// The signal its jobs get before a requeueing stop or their timeout (`checkpoint`).
    pub checkpoint: Option<headroom_shared::checkpoint::Checkpoint>,
    /// Its running jobs may be preempted (`preemptible`).
    pub preemptible: bool,
    /// `memory_cap: off`: its attempts get no hard GPU memory limit.
    pub memory_cap_off: bool,
    /// Its jobs' memory over time (`resources.memory_phases` with `expected_duration`).
    pub memory_phases: Option<headroom_shared::phases::Phases>,
}

/// The study an experiment is stored in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StudyOf {
    pub id: headroom_shared::StudyId,
    pub name: String,
}

/// A job of a study that waits for another (`after`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewDependency {
    pub job: headroom_shared::JobId,
    pub needs: headroom_shared::JobId,
    pub when: headroom_shared::study::AfterWhen,
    pub on_failure: headroom_shared::study::OnDependencyFailure,
}

/// A token to keep: its public id, holder, role, the argon2 hash of its secret and, for a
/// token the coordinator made, its SHA-256 ([`crate::auth::digest_token`]), which is what
/// is checked.
#[derive(Clone)]
pub struct NewToken {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub secret_hash: String,
    pub secret_digest: Option<String>,
    pub created_by: String,
    pub expires_at: Option<Millis>,
    /// A join token's nodes (names and patterns); `None` for other tokens.
    pub nodes: Option<Vec<String>>,
}

/// A kept token with the hashes its secret is checked against: its SHA-256 where known,
/// else its argon2 hash.
#[derive(Clone)]
pub struct StoredToken {
    pub view: TokenView,
    pub secret_hash: String,
    pub secret_digest: Option<String>,
}

// Hashes stay out of every log line and error (a digest is as good as a password to check
// guesses offline against).
impl std::fmt::Debug for NewToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewToken")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("role", &self.role)
            .field("created_by", &self.created_by)
            .field("expires_at", &self.expires_at)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for StoredToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredToken")
            .field("view", &self.view)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug)]
pub struct Registration {
    pub agent: AgentId,
    pub node: String,
    pub gpus: Vec<GpuInfo>,
    /// Replaces the stored plan when given.
    pub plan: Option<Plan>,
    pub headroom: Option<Headroom>,
    /// Attempts the agent still runs; kept (moved to the new registration, lease renewed)
    /// when their fencing tokens are current, every other active attempt of the node is lost.
    pub resume: Vec<AttemptRef>,
    pub lease_ttl_ms: u64,
    /// The agent id this instance registered with before (see `rules::may_register`).
    pub previous: Option<AgentId>,
    /// The node's host memory usable by jobs.
    pub host_memory_mib: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct Registered {
    pub plan: Plan,
    /// Active attempts of the node not resumed, now lost.
    pub lost: Vec<AttemptId>,
}

#[derive(Clone, Debug)]
pub struct ClaimInput {
    pub agent: AgentId,
    /// Fresh samples from the agent; `None` re-uses the node's latest telemetry (a long-poll
    /// waking later must not place by the memory it saw when the request arrived).
    pub gpus: Option<Vec<GpuSample>>,
    pub max: u32,
    pub lease_ttl_ms: u64,
    pub reserve_after_ms: u64,
    /// Fair share's half-life: how fast past usage stops counting.
    pub half_life_ms: u64,
    /// The agent's attempts whose cancellation it watches for: those a user cancelled come
    /// back in [`Claimed::cancel`].
    pub watching: Vec<AttemptId>,
}

#[derive(Clone, Debug)]
pub struct Claimed {
    pub leases: Vec<Lease>,
    /// Of the attempts watched, those a user asked to cancel, in the order asked.
    pub cancel: Vec<AttemptId>,
    /// Of the attempts watched, those to stop after their checkpoint signal and requeue.
    pub requeue: Vec<headroom_shared::api::RequeueOrder>,
    pub plan: Plan,
    /// The agent's node, whose ends wake its next claim at once.
    pub node: String,
    /// A job waits that may fit in this long though nothing else happens: a run with memory
    /// phases on the node reaches or leaves its peak then.
    pub recheck_in_ms: Option<u64>,
}

/// A heartbeat: the agent's attempts with their tokens, and its samples.
#[derive(Clone, Debug)]
pub struct Renewal {
    pub agent: AgentId,
    pub attempts: Vec<AttemptRef>,
    pub gpus: Vec<GpuSample>,
    pub lease_ttl_ms: u64,
}

/// A job's start as just recorded: when the job was submitted, and which of its attempts
/// started (the queue wait is a first attempt's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Started {
    pub submitted_at: Millis,
    pub number: u32,
}

/// An attempt's end as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    pub job_state: JobState,
    /// The report's start, recorded with it (no start report had been taken).
    pub started: Option<Started>,
}

#[derive(Clone, Debug)]
pub struct Renewed {
    pub cancel: Vec<AttemptId>,
    /// Attempts to stop after their checkpoint signal and requeue.
    pub requeue: Vec<headroom_shared::api::RequeueOrder>,
    pub plan: Plan,
}

/// A window of one GPU's telemetry series.
#[derive(Clone, Debug)]
pub struct SeriesWindow {
    pub since: Millis,
    pub until: Millis,
    /// Most samples: the newest of the window are kept.
    pub limit: u32,
}

/// How much telemetry to keep: samples older than `older_than` go, and beyond
/// `keep_per_gpu` samples of one GPU the oldest go; at most `batch` rows per call.
#[derive(Clone, Copy, Debug)]
pub struct Retention {
    pub older_than: Millis,
    pub keep_per_gpu: u64,
    pub batch: u32,
}

#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    pub experiment: Option<ExperimentId>,
    pub state: Option<JobState>,
    pub limit: Option<u32>,
    /// Jobs whose id starts with this (hex digits and dashes only: no pattern characters).
    pub id_prefix: Option<String>,
    /// The job of this index in its experiment.
    pub index: Option<u32>,
}

/// Counts for `/metrics` that every replica reads alike from the store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tallies {
    /// Ended attempts by outcome: `succeeded` or the failure class.
    pub outcomes: Vec<(String, u64)>,
    /// Per submitter (token or user name): jobs waiting (queued, retrying) and holding a
    /// lease (leased, running).
    pub by_user: Vec<(String, UserJobs)>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserJobs {
    pub queued: u64,
    pub running: u64,
}

/// One row of `export --csv`: an attempt with its job's parameters.
#[derive(Clone, Debug)]
pub struct ExportRow {
    pub experiment: String,
    pub job: JobSummary,
    pub attempt: AttemptView,
    /// Where the experiment's jobs ran from (shared by its rows).
    pub source: Option<std::sync::Arc<headroom_shared::api::source::Source>>,
}

pub use crate::rules::{
    AVOID_AFTER_HAND_BACK_MS, LEARNED_MARGIN, OOM_BUMP, effective_estimate, retry_allowed,
};

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The change counter this store bumps after each transaction that changed something a
    /// waiter may care about (and, through `watch_changes`, for other replicas' changes).
    fn changes(&self) -> Changes;

    /// Backend name and schema version, for `/v1/health` and the parity test.
    async fn schema_version(&self) -> Result<i64>;

    async fn create_experiment(&self, exp: NewExperiment) -> Result<ExperimentSummary>;
    async fn list_experiments(&self) -> Result<Vec<ExperimentSummary>>;
    async fn experiment(&self, id: ExperimentId) -> Result<ExperimentSummary>;
    async fn counts(&self, experiment: Option<ExperimentId>) -> Result<StateCounts>;
    /// Whether some job of the experiment (of any, with `None`) has not ended; cheap where
    /// [`Store::counts`] reads every job.
    async fn unfinished(&self, experiment: Option<ExperimentId>) -> Result<bool>;

    async fn list_jobs(&self, filter: JobFilter) -> Result<Vec<JobSummary>>;
    async fn job(&self, id: JobId) -> Result<JobDetail>;
    /// An attempt, labelled `shared` or not by the attempts that ran beside it.
    async fn attempt(&self, id: AttemptId) -> Result<AttemptView>;
    /// An attempt as stored, without reading its neighbours (`shared` unset): for checks of
    /// its owner and phase on hot paths.
    async fn attempt_row(&self, id: AttemptId) -> Result<AttemptView>;
    /// Whether a log chunk with this token may be appended (`rules::check_log_fence`).
    async fn check_log_fence(&self, attempt: AttemptId, fence: i64) -> Result<()>;
    /// Appends a chunk of an attempt's log that starts at `offset` of its sender's, keeping
    /// `max` bytes of output at most (`logs::append`); how much of the sender's log is taken.
    async fn append_log(
        &self,
        attempt: AttemptId,
        offset: u64,
        bytes: Vec<u8>,
        max: u64,
    ) -> Result<u64>;
    /// Up to `max` bytes of an attempt's kept log from `offset`.
    async fn read_log(&self, attempt: AttemptId, offset: u64, max: u64) -> Result<Vec<u8>>;

    /// Keeps a code bundle under its hash unless one is kept; whether it was new.
    async fn put_bundle(&self, hash: String, data: Vec<u8>, by: String) -> Result<bool>;
    /// The size of the bundle kept under `hash`, if one is (and, where `uploaded_by` is
    /// given, that one uploaded it).
    async fn bundle_size(&self, hash: String, uploaded_by: Option<String>) -> Result<Option<u64>>;
    /// The bytes of the bundle kept under `hash`, if one is.
    async fn bundle(&self, hash: String) -> Result<Option<Vec<u8>>>;
    /// Whether an attempt not ended on `node` runs from the bundle `hash`.
    async fn bundle_leased_to(&self, hash: String, node: String) -> Result<bool>;
    async fn cancel_job(&self, id: JobId) -> Result<u64>;
    async fn cancel_experiment(&self, id: ExperimentId) -> Result<u64>;
    /// Asks the running job's attempt to stop after its checkpoint signal and requeue
    /// (`cancel --requeue`); 1 when it did, 0 when the job runs no attempt.
    async fn requeue_job(&self, id: JobId) -> Result<u64>;
    /// [`Store::requeue_job`] for every running job of the experiment.
    async fn requeue_experiment(&self, id: ExperimentId) -> Result<u64>;
    async fn retry_job(&self, id: JobId) -> Result<JobState>;
    /// The job and every ended job that waits for it (`after`, on down) run once more; the
    /// jobs retried, the job first.
    async fn retry_cascade(&self, id: JobId) -> Result<Vec<JobId>>;
    /// The history of each memory key (peaks, floor, run time), those with one.
    async fn key_history(
        &self,
        keys: Vec<String>,
    ) -> Result<std::collections::BTreeMap<String, KeyHistory>>;
    /// The mean run time (ms) of each memory key's latest successful attempts, those with one.
    async fn key_durations(
        &self,
        keys: Vec<String>,
    ) -> Result<std::collections::BTreeMap<String, u64>>;
    /// Jobs that changed while others wait for them, at most `limit`: (job, its notes).
    async fn wait_changes_due(&self, limit: u32) -> Result<Vec<(JobId, Vec<i64>)>>;
    /// Counts again the waits of the jobs waiting for `job` (each locked), cancels those its
    /// other end calls for, and drops the notes `ids`; how many waiting jobs it counted.
    async fn settle_waits(&self, job: JobId, ids: Vec<i64>) -> Result<u32>;
    /// A study's experiments and their waits, stored all or none.
    async fn create_study(
        &self,
        exps: Vec<NewExperiment>,
        waits: Vec<NewDependency>,
    ) -> Result<Vec<ExperimentSummary>>;
    /// Every failed job of the experiment runs once more; the jobs retried.
    async fn retry_failed(&self, experiment: ExperimentId) -> Result<Vec<JobId>>;
    async fn export_rows(&self, experiment: Option<ExperimentId>) -> Result<Vec<ExportRow>>;

    async fn register_agent(&self, reg: Registration) -> Result<Registered>;
    async fn set_plan(&self, node: &str, plan: &str) -> Result<Plan>;
    async fn list_nodes(&self, alive_within_ms: u64) -> Result<Vec<NodeView>>;
    /// Largest GPU count of any known node, to refuse jobs no node can run.
    async fn max_node_gpus(&self) -> Result<Option<u32>>;

    /// Leases fitting pending jobs to the agent's node, placed by `placement::place`.
    async fn claim_jobs(&self, input: ClaimInput) -> Result<Claimed>;
    /// Renews the leases of the agent's attempts and stores its samples. A stale token for
    /// any attempt refuses the whole heartbeat (`StaleFence`, nothing written).
    async fn renew_leases(&self, r: Renewal) -> Result<Renewed>;
    /// Records the job's start; `None` for a repeated report (nothing recorded again).
    async fn start_attempt(
        &self,
        a: AttemptId,
        fence: i64,
        pid: u32,
        at: Millis,
    ) -> Result<Option<Started>>;
    /// Records an attempt's end (and its start, when the report carries one not recorded).
    async fn end_attempt(&self, attempt: AttemptId, report: FinishReport) -> Result<Finished>;
    async fn hand_back(&self, attempt: AttemptId, fence: i64, gpus: &[GpuSample]) -> Result<()>;
    /// A running attempt's metrics so far (fenced); whether `early_stop` stops it.
    async fn report_metrics(
        &self,
        attempt: AttemptId,
        fence: i64,
        metrics: headroom_shared::results::AttemptMetrics,
    ) -> Result<headroom_shared::api::MetricsAnswer>;
    /// Every attempt's metric series of an experiment (`metric`'s only, where given), each
    /// thinned to `points`.
    async fn experiment_series(
        &self,
        id: ExperimentId,
        metric: Option<String>,
        points: usize,
    ) -> Result<Vec<headroom_shared::api::AttemptSeries>>;
    /// Claims up to `limit` ended attempts whose results are due to their tracking server,
    /// for `hold_ms`; each with its tries so far.
    async fn claim_tracking(&self, hold_ms: i64, limit: u32) -> Result<Vec<(AttemptId, u32)>>;
    /// An attempt's view and its experiment's row, for its tracked run.
    async fn tracking_record(&self, attempt: AttemptId) -> Result<(AttemptView, TrackingRow)>;
    /// Where an attempt's results went, or why not; `due`: when to try again.
    async fn set_tracking(
        &self,
        attempt: AttemptId,
        note: String,
        due: Option<Millis>,
    ) -> Result<()>;
    /// The attempt's supervisor renews its lease for `ttl_ms` (its agent is away); whether
    /// the job's cancel was asked.
    async fn renew_lease(
        &self,
        attempt: AttemptId,
        fence: i64,
        ttl_ms: u64,
    ) -> Result<Option<StopAsk>>;
    /// The digest of the key issued with the attempt's lease, if one was.
    async fn attempt_key(&self, attempt: AttemptId) -> Result<Option<String>>;
    /// Attempts whose lease ran out before `now` become `lost`; returns them. (The time is
    /// an input: the sweep passes the clock's, tests any instant, without waiting for it.)
    async fn expire_leases(&self, now: Millis) -> Result<Vec<AttemptId>>;
    /// [`Store::expire_leases`] now by the database's clock (every replica's sweep reads the
    /// same one: a replica whose own clock is off expires nothing early).
    async fn expire_due_leases(&self) -> Result<Vec<AttemptId>>;
    /// Lifts the quarantine that these ended attempts of the agent's node put on GPUs.
    async fn release_attempts(&self, agent: AgentId, attempts: &[AttemptId]) -> Result<u64>;
    /// Lifts every quarantine on one GPU (a person looked); returns how many were lifted.
    async fn release_gpu(&self, node: &str, gpu: u32) -> Result<u64>;
    /// The node an agent or attempt belongs to (`None`: unknown).
    async fn node_of(&self, of: NodeOf) -> Result<Option<String>>;
    /// Lets another agent instance register as `node` now.
    async fn takeover(&self, node: &str) -> Result<()>;

    /// Stores the telemetry samples an agent shipped (one heartbeat's batch, one
    /// transaction) as its node's GPU series; returns how many were new (a sample of a GPU
    /// at an instant already stored is not stored twice, so a batch may be sent again).
    async fn record_telemetry(&self, agent: AgentId, samples: Vec<TelemetrySample>) -> Result<u64>;
    /// One GPU's samples in a window, oldest first.
    async fn telemetry_of_gpu(
        &self,
        node: &str,
        gpu: u32,
        window: SeriesWindow,
    ) -> Result<Vec<TelemetrySample>>;
    /// The samples of an attempt's GPUs over its run (start to end, or now), at most
    /// `limit` per GPU (the newest).
    async fn telemetry_of_attempt(
        &self,
        attempt: AttemptId,
        limit: u32,
    ) -> Result<AttemptTelemetry>;
    /// Deletes telemetry beyond `keep` (at most `keep.batch` rows, one transaction);
    /// returns how many rows went, so callers repeat while it is a full batch.
    async fn prune_telemetry(&self, keep: Retention) -> Result<u64>;
    /// Waiting (queued or retrying) jobs per pending reason code, for `/metrics`.
    async fn pending_reason_counts(&self) -> Result<Vec<(String, u64)>>;
    /// Ended attempts by outcome, and waiting and holding jobs by who submitted them, for
    /// `/metrics`.
    async fn tallies(&self) -> Result<Tallies>;
    /// Keeps a new token (hashed); a second token with the same id is refused.
    async fn create_token(&self, token: NewToken) -> Result<TokenView>;
    /// Keeps a new node's first agent credential (`token`, named after the node): refused
    /// (409) when the node is registered or a token of its name was ever made.
    async fn join_node(&self, token: NewToken) -> Result<TokenView>;
    /// Whether a join token may still give `node` its first credential (the cheap check
    /// before a secret is hashed for it); `Err(NodeJoined)` says why not.
    async fn joinable(&self, node: &str) -> Result<()>;
    /// A token by its public id, revoked or not (`NotFound` when none has it).
    async fn token_by_id(&self, id: &str) -> Result<StoredToken>;
    /// Every kept token, oldest first.
    async fn list_tokens(&self) -> Result<Vec<TokenView>>;
    /// Revokes a token (a second revocation keeps the first time); `NotFound` when none
    /// has that id.
    async fn revoke_token(&self, id: &str) -> Result<TokenView>;
    /// Keeps the SHA-256 of a token that verified with its argon2 hash (made before digests
    /// were kept); false when it has one already, or no such token.
    async fn keep_token_digest(&self, id: &str, digest: String) -> Result<bool>;
    /// Makes the users configuration names, refusing a name of another role.
    async fn ensure_users(&self, users: Vec<(String, Role, Option<String>)>) -> Result<()>;
    /// Creates or changes a user (its role stays).
    async fn put_user(&self, user: UserView) -> Result<UserView>;
    async fn users(&self) -> Result<Vec<UserView>>;
    /// Charges up to `limit` ended runs to their users' fair-share ledgers; how many.
    async fn charge_usage(&self, half_life_ms: u64, limit: u32) -> Result<usize>;
    /// A preemption round: running jobs of `preemptible` experiments asked to stop after
    /// their checkpoint signal and requeue, for waiting jobs of users under their share or
    /// of higher priority; those asked.
    async fn preempt(&self, input: PreemptInput) -> Result<Vec<Preempted>>;
    /// Every user's fair-share standing now, lowest first.
    async fn share_standings(
        &self,
        half_life_ms: u64,
    ) -> Result<Vec<headroom_shared::api::usage::ShareStanding>>;
    /// What each user (or experiment) used since `from`, and every user's standing now.
    async fn usage_report(
        &self,
        from: Millis,
        by: headroom_shared::api::usage::UsageBy,
        half_life_ms: u64,
    ) -> Result<headroom_shared::api::usage::UsageReport>;

    /// Keeps a subscription to alerts.
    async fn subscribe(
        &self,
        view: headroom_shared::api::alerts::SubscriptionView,
    ) -> Result<headroom_shared::api::alerts::SubscriptionView>;
    /// Subscriptions (`owner`'s only, where given), oldest first.
    async fn subscriptions(
        &self,
        owner: Option<String>,
    ) -> Result<Vec<headroom_shared::api::alerts::SubscriptionView>>;
    /// Deletes a subscription with its deliveries (`NotFound` when none has that id).
    async fn unsubscribe(&self, id: String) -> Result<()>;
    /// Subscriptions and their newest `limit` deliveries, dead letters first (`owner`'s
    /// only, where given).
    async fn alerts(
        &self,
        owner: Option<String>,
        limit: u32,
    ) -> Result<headroom_shared::api::alerts::AlertsView>;
    /// Claims up to `limit` deliveries due now, for `hold_ms`; each with its tries, this
    /// one counted.
    async fn claim_deliveries(&self, hold_ms: i64, limit: u32) -> Result<Vec<(String, u32)>>;
    /// A delivery with what it sends, and where.
    async fn delivery(&self, id: String) -> Result<DeliveryRow>;
    /// How the try a claim made at `tries` ended; false (nothing written) when another claim
    /// took the delivery since.
    async fn settle_delivery(
        &self,
        id: String,
        tries: u32,
        outcome: DeliveryOutcome,
    ) -> Result<bool>;
    /// Takes the events no single transaction can tell (`alerts::sweep`); how many.
    async fn alert_sweep(&self, input: AlertSweep) -> Result<usize>;

    /// Calls `on_change` whenever another process sharing the database (a coordinator
    /// replica) may have changed something, until `shutdown`, so this process's long-polls
    /// wake for it too. A store only one process uses has nothing to watch.
    async fn watch_changes(&self, on_change: OnChange, shutdown: CancellationToken) {
        let _ = (on_change, shutdown);
    }
}

/// Runs one operation of `ops` as a read or write transaction of the backend, in a span
/// named after the operation with its ids recorded.
macro_rules! run {
    ($b:expr, $kind:ident, $op:literal, |$tx:ident| $body:expr ; $($field:tt)*) => {{
        let span = tracing::debug_span!("store", op = $op, $($field)*);
        let op = op(move |$tx| $body);
        tracing::Instrument::instrument($b.$kind(op), span).await
    }};
    ($b:expr, $kind:ident, $op:literal, $f:path $(, $arg:expr)* ; $($field:tt)*) => {
        run!($b, $kind, $op, |tx| Box::pin($f(tx $(, $arg)*)); $($field)*)
    };
}

/// An operation as a backend runs it (the bound gives the closure its higher-ranked type).
fn op<T, F>(f: F) -> Op<T>
where
    F: for<'t> FnOnce(&'t mut dyn Tx) -> futures::future::BoxFuture<'t, Result<T>> + Send + 'static,
{
    Box::new(f)
}

/// Every store operation, written once (in the resource files) for every backend.
#[async_trait]
impl<B: Backend> Store for B {
    fn changes(&self) -> Changes {
        Backend::changes(self)
    }

    async fn schema_version(&self) -> Result<i64> {
        Backend::schema_version(self).await
    }

    async fn create_experiment(&self, exp: NewExperiment) -> Result<ExperimentSummary> {
        let id = exp.id;
        run!(self, write, "create_experiment", experiments::create, exp; experiment = %id, jobs = exp.jobs.len())
    }

    async fn list_experiments(&self) -> Result<Vec<ExperimentSummary>> {
        run!(self, read, "list_experiments", experiments::list;)
    }

    async fn experiment(&self, id: ExperimentId) -> Result<ExperimentSummary> {
        run!(self, read, "experiment", experiments::get, id; experiment = %id)
    }

    async fn counts(&self, experiment: Option<ExperimentId>) -> Result<StateCounts> {
        run!(self, read, "counts", experiments::counts, experiment; experiment = ?experiment)
    }

    async fn unfinished(&self, experiment: Option<ExperimentId>) -> Result<bool> {
        run!(self, read, "unfinished", experiments::unfinished, experiment; experiment = ?experiment)
    }

    async fn list_jobs(&self, filter: JobFilter) -> Result<Vec<JobSummary>> {
        run!(self, read, "list_jobs", jobs::list, filter; experiment = ?filter.experiment)
    }

    async fn job(&self, id: JobId) -> Result<JobDetail> {
        run!(self, read, "job", jobs::detail, id; job = %id)
    }

    async fn attempt(&self, id: AttemptId) -> Result<AttemptView> {
        run!(self, read, "attempt", leases::attempt, id, true; attempt = %id)
    }

    async fn attempt_row(&self, id: AttemptId) -> Result<AttemptView> {
        run!(self, read, "attempt_row", leases::attempt, id, false; attempt = %id)
    }

    async fn check_log_fence(&self, attempt: AttemptId, fence: i64) -> Result<()> {
        run!(self, read, "check_log_fence", leases::check_log_fence, attempt, fence; attempt = %attempt, fence)
    }

    async fn append_log(
        &self,
        attempt: AttemptId,
        offset: u64,
        bytes: Vec<u8>,
        max: u64,
    ) -> Result<u64> {
        let len = bytes.len();
        run!(self, write, "append_log", logs::append, attempt, offset, bytes, max; attempt = %attempt, offset, len)
    }

    async fn read_log(&self, attempt: AttemptId, offset: u64, max: u64) -> Result<Vec<u8>> {
        run!(self, read, "read_log", logs::read, attempt, offset, max; attempt = %attempt, offset)
    }

    async fn put_bundle(&self, hash: String, data: Vec<u8>, by: String) -> Result<bool> {
        let len = data.len();
        run!(self, write, "put_bundle", bundles::put, hash.clone(), data, by; hash = %hash, len)
    }

    async fn bundle_size(&self, hash: String, uploaded_by: Option<String>) -> Result<Option<u64>> {
        run!(self, read, "bundle_size", bundles::size, hash.clone(), uploaded_by; hash = %hash)
    }

    async fn bundle(&self, hash: String) -> Result<Option<Vec<u8>>> {
        run!(self, read, "bundle", bundles::data, hash.clone(); hash = %hash)
    }

    async fn bundle_leased_to(&self, hash: String, node: String) -> Result<bool> {
        run!(self, read, "bundle_leased_to", bundles::leased_to, hash.clone(), node.clone(); hash = %hash, node = %node)
    }

    async fn cancel_job(&self, id: JobId) -> Result<u64> {
        run!(self, write, "cancel_job", jobs::cancel, id; job = %id)
    }

    async fn cancel_experiment(&self, id: ExperimentId) -> Result<u64> {
        run!(self, write, "cancel_experiment", jobs::cancel_experiment, id; experiment = %id)
    }

    async fn requeue_job(&self, id: JobId) -> Result<u64> {
        run!(self, write, "requeue_job", jobs::requeue, id; job = %id)
    }

    async fn requeue_experiment(&self, id: ExperimentId) -> Result<u64> {
        run!(self, write, "requeue_experiment", jobs::requeue_experiment, id; experiment = %id)
    }

    async fn retry_job(&self, id: JobId) -> Result<JobState> {
        run!(self, write, "retry_job", jobs::retry, id; job = %id)
    }

    async fn retry_cascade(&self, id: JobId) -> Result<Vec<JobId>> {
        run!(self, write, "retry_cascade", waits::retry_cascade, id; job = %id)
    }

    async fn key_history(
        &self,
        keys: Vec<String>,
    ) -> Result<std::collections::BTreeMap<String, KeyHistory>> {
        let n = keys.len();
        run!(self, read, "key_history", history::of_keys, keys; keys = n)
    }

    async fn key_durations(
        &self,
        keys: Vec<String>,
    ) -> Result<std::collections::BTreeMap<String, u64>> {
        let n = keys.len();
        run!(self, read, "key_durations", history::durations, keys; keys = n)
    }

    async fn wait_changes_due(&self, limit: u32) -> Result<Vec<(JobId, Vec<i64>)>> {
        let due = run!(self, read, "wait_changes_due", waits::due, limit;)?;
        due.into_iter()
            .map(|(job, ids)| Ok((rows::parse(&job, "job id")?, ids)))
            .collect()
    }

    async fn settle_waits(&self, job: JobId, ids: Vec<i64>) -> Result<u32> {
        let job = job.to_string();
        run!(self, write, "settle_waits", |tx| Box::pin(waits::settle(tx, job, ids)); notes = 1)
    }

    async fn create_study(
        &self,
        exps: Vec<NewExperiment>,
        waits: Vec<NewDependency>,
    ) -> Result<Vec<ExperimentSummary>> {
        let n = exps.len();
        run!(self, write, "create_study", waits::create_study, exps, waits; experiments = n)
    }

    async fn retry_failed(&self, experiment: ExperimentId) -> Result<Vec<JobId>> {
        run!(self, write, "retry_failed", jobs::retry_failed, experiment; experiment = %experiment)
    }

    async fn export_rows(&self, experiment: Option<ExperimentId>) -> Result<Vec<ExportRow>> {
        run!(self, read, "export_rows", experiments::export, experiment; experiment = ?experiment)
    }

    async fn register_agent(&self, reg: Registration) -> Result<Registered> {
        let (agent, node) = (reg.agent, reg.node.clone());
        run!(self, write, "register_agent", nodes::register, reg; agent = %agent, node = %node)
    }

    async fn set_plan(&self, node: &str, plan: &str) -> Result<Plan> {
        let (node, plan) = (node.to_string(), plan.to_string());
        let n = node.clone();
        run!(self, write, "set_plan", nodes::set_plan, node, plan; node = %n)
    }

    async fn list_nodes(&self, alive_within_ms: u64) -> Result<Vec<NodeView>> {
        run!(self, read, "list_nodes", nodes::list, alive_within_ms;)
    }

    async fn max_node_gpus(&self) -> Result<Option<u32>> {
        run!(self, read, "max_node_gpus", |tx| tx.max_node_gpus();)
    }

    async fn claim_jobs(&self, input: ClaimInput) -> Result<Claimed> {
        let agent = input.agent;
        run!(self, write, "claim_jobs", leases::claim, input; agent = %agent)
    }

    async fn renew_leases(&self, r: Renewal) -> Result<Renewed> {
        let agent = r.agent;
        run!(self, write, "renew_leases", leases::renew, r; agent = %agent)
    }

    async fn start_attempt(
        &self,
        a: AttemptId,
        fence: i64,
        pid: u32,
        at: Millis,
    ) -> Result<Option<Started>> {
        run!(self, write, "start_attempt", leases::start, a, fence, pid, at; attempt = %a, fence)
    }

    async fn report_metrics(
        &self,
        attempt: AttemptId,
        fence: i64,
        metrics: headroom_shared::results::AttemptMetrics,
    ) -> Result<headroom_shared::api::MetricsAnswer> {
        run!(self, write, "report_metrics", leases::report_metrics, attempt, fence, metrics; attempt = %attempt, fence)
    }

    async fn experiment_series(
        &self,
        id: ExperimentId,
        metric: Option<String>,
        points: usize,
    ) -> Result<Vec<headroom_shared::api::AttemptSeries>> {
        run!(self, read, "experiment_series", results::series, id, metric, points; experiment = %id)
    }

    async fn claim_tracking(&self, hold_ms: i64, limit: u32) -> Result<Vec<(AttemptId, u32)>> {
        let now = now_ms();
        run!(self, write, "claim_tracking", results::claim_tracking, now, hold_ms, limit;)
    }

    async fn tracking_record(&self, attempt: AttemptId) -> Result<(AttemptView, TrackingRow)> {
        run!(self, read, "tracking_record", leases::tracking_record, attempt; attempt = %attempt)
    }

    async fn set_tracking(
        &self,
        attempt: AttemptId,
        note: String,
        due: Option<Millis>,
    ) -> Result<()> {
        run!(self, write, "set_tracking", results::set_tracking, attempt, note, due; attempt = %attempt)
    }

    async fn end_attempt(&self, attempt: AttemptId, report: FinishReport) -> Result<Finished> {
        let fence = report.fence;
        run!(self, write, "end_attempt", leases::finish, attempt, report; attempt = %attempt, fence)
    }

    async fn renew_lease(
        &self,
        attempt: AttemptId,
        fence: i64,
        ttl_ms: u64,
    ) -> Result<Option<StopAsk>> {
        run!(self, write, "renew_lease", leases::renew_one, attempt, fence, ttl_ms; attempt = %attempt, fence)
    }

    async fn attempt_key(&self, attempt: AttemptId) -> Result<Option<String>> {
        run!(self, read, "attempt_key", leases::attempt_key, attempt; attempt = %attempt)
    }

    async fn hand_back(&self, attempt: AttemptId, fence: i64, gpus: &[GpuSample]) -> Result<()> {
        let gpus = gpus.to_vec();
        run!(self, write, "hand_back", leases::hand_back, attempt, fence, gpus; attempt = %attempt, fence)
    }

    async fn expire_leases(&self, now: Millis) -> Result<Vec<AttemptId>> {
        run!(self, write, "expire_leases", leases::expire, now;)
    }

    async fn expire_due_leases(&self) -> Result<Vec<AttemptId>> {
        run!(self, write, "expire_due_leases", leases::expire_due;)
    }

    async fn release_attempts(&self, agent: AgentId, attempts: &[AttemptId]) -> Result<u64> {
        let attempts = attempts.to_vec();
        run!(self, write, "release_attempts", nodes::release_attempts, agent, attempts; agent = %agent)
    }

    async fn release_gpu(&self, node: &str, gpu: u32) -> Result<u64> {
        let node = node.to_string();
        let n = node.clone();
        run!(self, write, "release_gpu", nodes::release_gpu, node, gpu; node = %n, gpu)
    }

    async fn node_of(&self, of: NodeOf) -> Result<Option<String>> {
        run!(self, read, "node_of", nodes::node_of, of; of = ?of)
    }

    async fn takeover(&self, node: &str) -> Result<()> {
        let node = node.to_string();
        let n = node.clone();
        run!(self, write, "takeover", nodes::takeover, node; node = %n)
    }

    async fn record_telemetry(&self, agent: AgentId, samples: Vec<TelemetrySample>) -> Result<u64> {
        if samples.is_empty() {
            return Ok(0);
        }
        run!(self, write, "record_telemetry", telemetry::record, agent, samples; agent = %agent)
    }

    async fn telemetry_of_gpu(
        &self,
        node: &str,
        gpu: u32,
        window: SeriesWindow,
    ) -> Result<Vec<TelemetrySample>> {
        let node = node.to_string();
        let n = node.clone();
        run!(self, read, "telemetry_of_gpu", telemetry::of_gpu, node, gpu, window; node = %n, gpu)
    }

    async fn telemetry_of_attempt(
        &self,
        attempt: AttemptId,
        limit: u32,
    ) -> Result<AttemptTelemetry> {
        run!(self, read, "telemetry_of_attempt", telemetry::of_attempt, attempt, limit; attempt = %attempt)
    }

    async fn prune_telemetry(&self, keep: Retention) -> Result<u64> {
        run!(self, write, "prune_telemetry", telemetry::prune, keep;)
    }

    async fn pending_reason_counts(&self) -> Result<Vec<(String, u64)>> {
        run!(self, read, "pending_reason_counts", |tx| tx.pending_reason_counts();)
    }

    async fn tallies(&self) -> Result<Tallies> {
        run!(self, read, "tallies", experiments::tallies;)
    }

    async fn joinable(&self, node: &str) -> Result<()> {
        let node = node.to_string();
        run!(self, read, "joinable", tokens::joinable, node.clone(); node = %node)
    }

    async fn join_node(&self, token: NewToken) -> Result<TokenView> {
        let node = token.name.clone();
        run!(self, write, "join_node", tokens::join_node, token; node = %node)
    }

    async fn create_token(&self, token: NewToken) -> Result<TokenView> {
        let id = token.id.clone();
        run!(self, write, "create_token", tokens::create, token; token = %id)
    }

    async fn subscribe(
        &self,
        view: headroom_shared::api::alerts::SubscriptionView,
    ) -> Result<headroom_shared::api::alerts::SubscriptionView> {
        let id = view.id.clone();
        run!(self, write, "subscribe", alerts::subscribe, view; subscription = %id)
    }

    async fn subscriptions(
        &self,
        owner: Option<String>,
    ) -> Result<Vec<headroom_shared::api::alerts::SubscriptionView>> {
        run!(self, read, "subscriptions", alerts::subscriptions, owner;)
    }

    async fn unsubscribe(&self, id: String) -> Result<()> {
        run!(self, write, "unsubscribe", alerts::unsubscribe, id.clone(); subscription = %id)
    }

    async fn alerts(
        &self,
        owner: Option<String>,
        limit: u32,
    ) -> Result<headroom_shared::api::alerts::AlertsView> {
        run!(self, read, "alerts", alerts::view, owner, limit;)
    }

    async fn claim_deliveries(&self, hold_ms: i64, limit: u32) -> Result<Vec<(String, u32)>> {
        let now = now_ms();
        run!(self, write, "claim_deliveries", alerts::claim, now, hold_ms, limit;)
    }

    async fn delivery(&self, id: String) -> Result<DeliveryRow> {
        run!(self, read, "delivery", alerts::delivery, id.clone(); delivery = %id)
    }

    async fn settle_delivery(
        &self,
        id: String,
        tries: u32,
        outcome: DeliveryOutcome,
    ) -> Result<bool> {
        let now = now_ms();
        run!(self, write, "settle_delivery", alerts::settle, id.clone(), tries, outcome, now; delivery = %id, tries)
    }

    async fn alert_sweep(&self, input: AlertSweep) -> Result<usize> {
        run!(self, write, "alert_sweep", alerts::sweep, input;)
    }

    async fn token_by_id(&self, id: &str) -> Result<StoredToken> {
        let id = id.to_string();
        run!(self, read, "token_by_id", |tx| Box::pin(async move { tokens::by_id(tx, &id).await }); token = %id)
    }

    async fn list_tokens(&self) -> Result<Vec<TokenView>> {
        run!(self, read, "list_tokens", tokens::list;)
    }

    async fn revoke_token(&self, id: &str) -> Result<TokenView> {
        let id = id.to_string();
        let t = id.clone();
        run!(self, write, "revoke_token", tokens::revoke, id; token = %t)
    }

    async fn keep_token_digest(&self, id: &str, digest: String) -> Result<bool> {
        let id = id.to_string();
        let t = id.clone();
        run!(self, write, "keep_token_digest", tokens::keep_digest, id, digest; token = %t)
    }

    async fn ensure_users(&self, users: Vec<(String, Role, Option<String>)>) -> Result<()> {
        run!(self, write, "ensure_users", tokens::ensure_users, users;)
    }

    async fn put_user(&self, user: UserView) -> Result<UserView> {
        let n = user.name.clone();
        run!(self, write, "put_user", tokens::put_user, user; user = %n)
    }

    async fn users(&self) -> Result<Vec<UserView>> {
        run!(self, read, "users", tokens::users;)
    }

    async fn charge_usage(&self, half_life_ms: u64, limit: u32) -> Result<usize> {
        run!(self, write, "charge_usage", shares::charge, half_life_ms, limit;)
    }

    async fn preempt(&self, input: PreemptInput) -> Result<Vec<Preempted>> {
        run!(self, write, "preempt", preemption::preempt, input;)
    }

    async fn share_standings(
        &self,
        half_life_ms: u64,
    ) -> Result<Vec<headroom_shared::api::usage::ShareStanding>> {
        run!(self, read, "share_standings", |tx| Box::pin(async move {
            let now = tx.clock().await?;
            shares::standings(tx, now, half_life_ms).await
        });)
    }

    async fn usage_report(
        &self,
        from: Millis,
        by: headroom_shared::api::usage::UsageBy,
        half_life_ms: u64,
    ) -> Result<headroom_shared::api::usage::UsageReport> {
        run!(self, read, "usage_report", shares::report, from, by, half_life_ms;)
    }

    async fn watch_changes(&self, on_change: OnChange, shutdown: CancellationToken) {
        Backend::watch_changes(self, on_change, shutdown).await
    }
}
