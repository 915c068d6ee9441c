//! One conformance suite for every `Store` backend: the same behaviour, asserted against a
//! real database (never a mock).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::Utc;
use headroom_coordinator::changes::{Change, WorkSeen};
use headroom_coordinator::store::postgres::PostgresStore;
use headroom_coordinator::store::sqlite::SqliteStore;
use headroom_coordinator::store::{AlertSweep, DeliveryOutcome};
use headroom_coordinator::store::{
    ClaimInput, Finished, JobFilter, NewExperiment, NewJob, NewToken, NodeOf, Registration,
    Renewal, Renewed, Retention, SeriesWindow, Started, Store, StoreError, now_ms,
};
use headroom_shared::api::alerts::{
    AlertKind, AlertTarget, DeliveryState, SubscriptionView, WebhookFormat,
};
use headroom_shared::api::{
    AttemptRef, EnergySource, FinishReport, GpuInfo, GpuSample, JobStarted, JobSummary, Lease,
    Measurements, PeakSource, Role, TelemetrySample, UserLimits, UserView,
};
use headroom_shared::pending::PendingReason;
use headroom_shared::{AgentId, AttemptId, ExperimentId, FailureClass, JobId, JobState, Plan};

type Backend = Arc<dyn Store>;

async fn sqlite() -> (Backend, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(&dir.path().join("store.db")).expect("open sqlite");
    (Arc::new(store), dir)
}

/// The server the PostgreSQL tests create their databases on.
const PG_ADMIN_ENV: &str = "HEADROOM_TEST_DATABASE_URL";

fn pg_admin_url() -> String {
    match std::env::var(PG_ADMIN_ENV) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "{PG_ADMIN_ENV} is not set: the PostgreSQL conformance tests need a server. Run \
             `scripts/test` (it starts a throwaway PostgreSQL 15 cluster), or export \
             {PG_ADMIN_ENV}=postgres://postgres@127.0.0.1:PORT/postgres"
        ),
    }
}

/// `url` with its database name replaced.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let authority_at = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[authority_at..]
        .find('/')
        .map_or(base.len(), |i| authority_at + i);
    format!("{}/{name}{query}", &base[..host_end])
}

async fn pg_admin() -> tokio_postgres::Client {
    let url = pg_admin_url();
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {PG_ADMIN_ENV} ({url}): {e}"));
    tokio::spawn(connection);
    client
}

/// A database of its own for one test, dropped when the guard is.
struct PgDatabase {
    name: String,
    url: String,
}

impl PgDatabase {
    async fn create() -> Self {
        let name = format!("hr_test_{}", uuid::Uuid::new_v4().simple());
        pg_admin()
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create test database");
        let url = with_database(&pg_admin_url(), &name);
        Self { name, url }
    }

    async fn store(&self) -> PostgresStore {
        PostgresStore::connect(&self.url)
            .await
            .expect("connect postgres store")
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime: drop the database from a thread of its own.
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                pg_admin()
                    .await
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .map_err(std::io::Error::other)
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}: {dropped:?}", self.name);
        }
    }
}

async fn postgres() -> (Backend, PgDatabase) {
    let db = PgDatabase::create().await;
    (Arc::new(db.store().await), db)
}

fn job(
    index: u32,
    estimate: Option<u64>,
    retry_on: Vec<FailureClass>,
    max_attempts: u32,
) -> NewJob {
    NewJob {
        id: JobId::new(),
        index,
        config: index,
        run: 0,
        params: BTreeMap::from([("i".to_string(), serde_json::json!(index))]),
        argv: vec!["true".into()],
        env: BTreeMap::new(),
        profile: "default".into(),
        gpus: 1,
        estimate_mib: estimate,
        timeout_ms: None,
        max_attempts,
        retry_on,
        priority: 0,
        memory_key: "exp".into(),
        command: vec!["train".into(), "--bs={batch_size}".into()],
        shell: false,
        oom_ladder: vec![],
        prestart: None,
        background: None,
    }
}

async fn submit(s: &Backend, jobs: Vec<NewJob>) -> ExperimentId {
    submit_as(s, "anonymous", jobs).await
}

async fn submit_as(s: &Backend, who: &str, jobs: Vec<NewJob>) -> ExperimentId {
    let exp = NewExperiment {
        host_memory_mib: None,
        checkpoint: None,
        preemptible: false,
        memory_cap_off: false,
        memory_phases: None,
        submitted_by: who.into(),
        ..experiment("exp", jobs)
    };
    let id = exp.id;
    s.create_experiment(exp).await.expect("create experiment");
    id
}

/// An experiment of `jobs` named `name`, of `anonymous`, with nothing else set.
fn experiment(name: &str, jobs: Vec<NewJob>) -> NewExperiment {
    NewExperiment {
        host_memory_mib: None,
        checkpoint: None,
        preemptible: false,
        memory_cap_off: false,
        memory_phases: None,
        id: ExperimentId::new(),
        name: name.into(),
        seed: 1,
        spec: serde_json::json!({}),
        jobs,
        submitted_by: "anonymous".into(),
        source: None,
        results: None,
        study: None,
        max_concurrent: None,
    }
}

fn gpus(n: u32, total: u64) -> Vec<GpuInfo> {
    (0..n)
        .map(|i| GpuInfo {
            index: i,
            uuid: format!("GPU-{i}"),
            name: "test".into(),
            total_mib: total,
        })
        .collect()
}

fn free(n: u32, total: u64) -> Vec<GpuSample> {
    (0..n)
        .map(|i| GpuSample {
            index: i,
            used_mib: 0,
            free_mib: total,
            ..Default::default()
        })
        .collect()
}

async fn register(s: &Backend, node: &str, n: u32, plan: Option<&str>) -> AgentId {
    register_gpus(s, node, gpus(n, 10_000), plan).await
}

/// [`register`] with these GPUs.
async fn register_gpus(s: &Backend, node: &str, gpus: Vec<GpuInfo>, plan: Option<&str>) -> AgentId {
    let agent = AgentId::new();
    s.register_agent(Registration {
        host_memory_mib: None,
        agent,
        node: node.into(),
        gpus,
        plan: plan.map(|p| Plan::parse(p).expect("plan")),
        headroom: None,
        resume: vec![],
        lease_ttl_ms: 30_000,
        previous: None,
    })
    .await
    .expect("register");
    agent
}

/// The same agent instance registering its node again (restarted): a new agent id, its
/// node's earlier attempts not resumed.
async fn register_again(s: &Backend, node: &str, n: u32, previous: AgentId) -> AgentId {
    let agent = AgentId::new();
    s.register_agent(Registration {
        host_memory_mib: None,
        agent,
        node: node.into(),
        gpus: gpus(n, 10_000),
        plan: None,
        headroom: None,
        resume: vec![],
        lease_ttl_ms: 30_000,
        previous: Some(previous),
    })
    .await
    .expect("register again");
    agent
}

/// An attempt's end recorded, for the job's new state alone.
async fn finish_attempt(
    s: &Backend,
    attempt: AttemptId,
    report: FinishReport,
) -> headroom_coordinator::store::Result<JobState> {
    Ok(s.end_attempt(attempt, report).await?.job_state)
}

async fn claim(s: &Backend, agent: AgentId, n: u32) -> Vec<Lease> {
    claim_with(s, agent, Some(free(n, 10_000)), 64).await
}

/// A claim of at most `max` leases with these samples (`None`: the node's stored ones).
async fn claim_with(
    s: &Backend,
    agent: AgentId,
    gpus: Option<Vec<GpuSample>>,
    max: u32,
) -> Vec<Lease> {
    s.claim_jobs(claim_input(agent, gpus, max))
        .await
        .expect("claim")
        .leases
}

/// A claim of at most `max` leases with these samples, a 30 s lease, no reservations.
fn claim_input(agent: AgentId, gpus: Option<Vec<GpuSample>>, max: u32) -> ClaimInput {
    ClaimInput {
        agent,
        gpus,
        max,
        lease_ttl_ms: 30_000,
        reserve_after_ms: u64::MAX,
        half_life_ms: headroom_coordinator::fair::DEFAULT_HALF_LIFE_MS,
        watching: vec![],
    }
}

fn report_peak(fence: i64, failure: Option<FailureClass>, peak: u64) -> FinishReport {
    FinishReport {
        peak_mem_mib: Some(peak),
        ..report(fence, failure)
    }
}

fn report(fence: i64, failure: Option<FailureClass>) -> FinishReport {
    FinishReport {
        fence,
        failure,
        exit_code: Some(if failure.is_none() { 0 } else { 1 }),
        signal: None,
        ended_at: Utc::now(),
        peak_mem_mib: Some(100),
        peak_source: None,
        cleanup_ms: 3,
        cleanup_verified: true,
        unverified: None,
        contaminated: false,
        measurements: Measurements::default(),
        log_tail: "tail".into(),
        gpus: vec![],
        prestart: None,
        background: None,
        host_peak_mib: Some(321),
        started: None,
        metrics: None,
        memory_cap_mib: None,
        oom_cause: None,
    }
}

async fn renew(
    s: &Backend,
    agent: AgentId,
    attempts: Vec<AttemptRef>,
    gpus: Vec<GpuSample>,
) -> Result<Renewed, StoreError> {
    s.renew_leases(Renewal {
        agent,
        attempts,
        gpus,
        lease_ttl_ms: 30_000,
    })
    .await
}

/// The attempts of `leases` as a heartbeat presents them.
fn presented(leases: &[Lease]) -> Vec<AttemptRef> {
    leases
        .iter()
        .map(|l| AttemptRef {
            attempt: l.attempt,
            fence: l.fence,
            waiting: None,
        })
        .collect()
}

async fn state(s: &Backend, job: JobId) -> JobState {
    s.job(job).await.expect("job").summary.state
}

/// Claims wait on the changes that may give them work: a submit, a requeue or a cancel
/// wakes every claim at once, an end its own node's at once (others only later: see
/// `changes`); another node's lease or a start wakes none. With an idle agent on every
/// node, each start and each end woke every claim to find nothing.
async fn claims_wake_for_work_and_sleep_through_starts_and_leases(s: Backend) {
    let changes = s.changes();
    let busy = register(&s, "n1", 1, None).await;
    register(&s, "n2", 1, None).await;
    // What moved for each node's claim, and whether watchers saw a change.
    let look = || {
        (
            changes.version(),
            changes.work_seen(Some("n1")),
            changes.work_seen(Some("n2")),
        )
    };
    let moved = |before: (u64, WorkSeen, WorkSeen)| {
        let now = look();
        (
            now.0 != before.0,
            before.1.at_once(&now.1),
            before.2.at_once(&now.2),
            before.2.freed(&now.2),
        )
    };
    // (watchers saw it, the busy node's claim wakes at once, the idle node's at once, the
    // idle node's later)
    const FOR_ALL: (bool, bool, bool, bool) = (true, true, true, false);
    const SHOWN: (bool, bool, bool, bool) = (true, false, false, false);
    let before = look();
    submit(
        &s,
        vec![
            job(0, Some(10), vec![], 1),
            job(1, Some(10), vec![FailureClass::Nonzero], 2),
        ],
    )
    .await;
    assert_eq!(moved(before), FOR_ALL, "a submit queues work for all");

    let before = look();
    let lease = claim(&s, busy, 1).await.pop().expect("a lease");
    assert_eq!(moved(before), SHOWN, "a lease is only shown");

    let before = look();
    s.start_attempt(lease.attempt, lease.fence, 42, 0)
        .await
        .expect("start");
    assert_eq!(moved(before), SHOWN, "a start is only shown");
    let before = look();
    s.start_attempt(lease.attempt, lease.fence, 42, 0)
        .await
        .expect("start again");
    assert_eq!(
        moved(before),
        (false, false, false, false),
        "a repeated start: nothing"
    );

    let before = look();
    finish_attempt(&s, lease.attempt, report(lease.fence, None))
        .await
        .expect("finish");
    assert_eq!(
        moved(before),
        (true, true, false, true),
        "an end frees its own node's slot; other nodes hear of it, to look later"
    );

    let retried = claim(&s, busy, 1)
        .await
        .pop()
        .expect("the freed slot's lease");
    let before = look();
    let failed = report(retried.fence, Some(FailureClass::Nonzero));
    assert_eq!(
        finish_attempt(&s, retried.attempt, failed)
            .await
            .expect("finish"),
        JobState::Retrying
    );
    assert_eq!(moved(before), FOR_ALL, "a requeued job is work for all");

    let next = claim(&s, busy, 1).await.pop().expect("the retry's lease");
    let before = look();
    assert_eq!(s.cancel_job(next.job).await.expect("cancel"), 1);
    assert_eq!(moved(before), FOR_ALL, "a claim answers with cancels");
}

async fn plan_slots_bound_leases(s: Backend) {
    let agent = register(&s, "n1", 2, Some("2,1")).await;
    submit(&s, (0..5).map(|i| job(i, Some(1000), vec![], 1)).collect()).await;
    let first = claim(&s, agent, 2).await;
    assert_eq!(first.len(), 3, "plan 2,1 gives three slots");
    assert!(claim(&s, agent, 2).await.is_empty(), "no slot left");
    let on_gpu0 = first.iter().filter(|l| l.gpus == vec![0]).count();
    assert_eq!(on_gpu0, 2);
    s.start_attempt(first[0].attempt, first[0].fence, 42, 0)
        .await
        .expect("start");
    assert_eq!(state(&s, first[0].job).await, JobState::Running);
    finish_attempt(&s, first[0].attempt, report(first[0].fence, None))
        .await
        .expect("finish");
    assert_eq!(state(&s, first[0].job).await, JobState::Succeeded);
    assert_eq!(
        claim(&s, agent, 2).await.len(),
        1,
        "the freed slot is reused"
    );
    let counts = s.counts(None).await.expect("counts");
    assert_eq!(
        (
            counts.succeeded,
            counts.leased + counts.running,
            counts.queued
        ),
        (1, 3, 1)
    );
}

/// Runs that declare memory phases are placed by time: of two runs of 4 s holding 2,000
/// MiB and 6,000 at their last tenth, started together their peaks would meet past the
/// GPU's memory less headroom. One is leased, told what it starts with, and the claim says
/// when to look again (1.2 s on: the second's widened peak then opens as the first is due);
/// then the second is leased beside the first. The phases are read back from the store. A
/// retry may resume partway through its run, so it is placed by its peak throughout: the
/// first run's retry, which by its phases would fit beside the second 1.2 s on, waits.
async fn runs_with_memory_phases_share_a_gpu_when_their_peaks_fall_apart(s: Backend) {
    let agent = register(&s, "n1", 1, Some("4")).await;
    let exp = NewExperiment {
        memory_phases: Some(headroom_shared::phases::Phases {
            steady_mib: 2000,
            peak_from: 0.9,
            peak_until: 1.0,
            expected_ms: 4000,
            margin_permille: headroom_shared::phases::DECLARED_MARGIN_PERMILLE,
        }),
        ..experiment(
            "phased",
            (0..2)
                .map(|i| job(i, Some(6000), vec![FailureClass::Oom], 2))
                .collect(),
        )
    };
    s.create_experiment(exp).await.expect("create experiment");
    let input = claim_input(agent, Some(free(1, 10_000)), 4);
    let first = s.claim_jobs(input.clone()).await.expect("claim");
    assert_eq!(first.leases.len(), 1, "their peaks would meet");
    assert_eq!(first.leases[0].estimate_mib, Some(6000));
    assert_eq!(first.leases[0].starts_with_mib, Some(2000));
    let recheck = first.recheck_in_ms.expect("a time to look again");
    assert!((1..=1200).contains(&recheck), "{recheck} ms");
    started_now(&s, &first.leases[0]).await;
    tokio::time::sleep(std::time::Duration::from_millis(recheck)).await;
    let second = s.claim_jobs(input.clone()).await.expect("claim");
    assert_eq!(
        second.leases.len(),
        1,
        "its peak comes after the first is due"
    );
    assert_eq!(second.recheck_in_ms, None, "nothing waits");

    let first = &first.leases[0];
    finish_attempt(
        &s,
        first.attempt,
        report(first.fence, Some(FailureClass::Oom)),
    )
    .await
    .expect("an OOM");
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let retry = s.claim_jobs(input).await.expect("claim");
    assert!(
        retry.leases.is_empty(),
        "a retry is placed by its peak beside the second's: {:?}",
        retry.leases
    );
}

/// A configuration's run that ended well teaches its shape (its steady use, where its peak
/// fell, its length): its next runs, declaring none, are placed by it and share a GPU their
/// peaks could not share at once. A contaminated run teaches none, and once a run of the
/// configuration ran out of memory its runs are placed by their peak throughout again.
async fn a_configuration_s_learned_shape_lets_its_runs_share_a_gpu(s: Backend) {
    let agent = register(&s, "n1", 1, Some("4")).await;
    submit(
        &s,
        (0..5)
            .map(|i| job(i, Some(6000), vec![FailureClass::Oom], 2))
            .collect(),
    )
    .await;
    let shape = late_peak();
    let taught = |fence: i64, contaminated: bool| FinishReport {
        contaminated,
        ..ended_with_shape(fence, Some(shape))
    };
    let input = claim_input(agent, Some(free(1, 10_000)), 4);
    let mut leases = Vec::new();
    for contaminated in [true, false] {
        let c = s.claim_jobs(input.clone()).await.expect("claim");
        assert_eq!(c.leases.len(), 1, "nothing taught yet: {:?}", c.leases);
        assert_eq!(c.leases[0].starts_with_mib, None, "placed by its peak");
        let l = &c.leases[0];
        finish_attempt(&s, l.attempt, taught(l.fence, contaminated))
            .await
            .expect("end");
        let kept = s.attempt(l.attempt).await.expect("attempt");
        let expected = (!contaminated).then_some(shape);
        assert_eq!(kept.measurements.memory_profile, expected, "{contaminated}");
    }
    let third = s.claim_jobs(input.clone()).await.expect("claim");
    assert_eq!(third.leases.len(), 1, "their peaks would meet");
    assert_eq!(third.leases[0].estimate_mib, Some(6000));
    assert_eq!(
        third.leases[0].starts_with_mib,
        Some(2200),
        "its learned steady use, with the learned margin"
    );
    let recheck = third.recheck_in_ms.expect("a time to look again");
    assert!((1..=1200).contains(&recheck), "{recheck} ms");
    tokio::time::sleep(std::time::Duration::from_millis(recheck)).await;
    // Until its start says where its phases fall, the third is counted at its peak.
    let early = s.claim_jobs(input.clone()).await.expect("claim");
    assert!(early.leases.is_empty(), "{:?}", early.leases);
    assert_eq!(early.recheck_in_ms, None, "its start is what changes it");
    started_now(&s, &third.leases[0]).await;
    let after_start = s.claim_jobs(input.clone()).await.expect("claim");
    assert!(after_start.leases.is_empty(), "{:?}", after_start.leases);
    let recheck = after_start.recheck_in_ms.expect("a time to look again");
    assert!((1..=1200).contains(&recheck), "{recheck} ms");
    tokio::time::sleep(std::time::Duration::from_millis(recheck)).await;
    let fourth = s.claim_jobs(input.clone()).await.expect("claim");
    assert_eq!(
        fourth.leases.len(),
        1,
        "its peak comes after the third is due"
    );
    leases.extend(third.leases);
    leases.extend(fourth.leases);

    // An OOM of the configuration: it is placed by its peak throughout from then on.
    finish_attempt(
        &s,
        leases[0].attempt,
        report_peak(leases[0].fence, Some(FailureClass::Oom), 6000),
    )
    .await
    .expect("an OOM");
    finish_attempt(&s, leases[1].attempt, taught(leases[1].fence, false))
        .await
        .expect("end");
    let after = s.claim_jobs(input.clone()).await.expect("claim");
    assert_eq!(after.leases.len(), 1, "two peaks of 7,500 MiB do not fit");
    assert_eq!(after.leases[0].starts_with_mib, None, "{:?}", after.leases);
    // The rest of its runs (the OOMed one's retry among them) end.
    let mut left = after.leases;
    while !left.is_empty() {
        for l in &left {
            finish_attempt(&s, l.attempt, report(l.fence, None))
                .await
                .expect("end");
        }
        left = s.claim_jobs(input.clone()).await.expect("claim").leases;
    }

    // Another configuration: a run that ended well and told no shape counts at its peak
    // throughout. One that held 5,000 MiB all along raises the steady use its next runs are
    // counted at to that (x1.1), whatever an older run's shape says.
    let other = |i| NewJob {
        memory_key: "other".into(),
        ..job(i, Some(6000), vec![], 1)
    };
    submit(&s, (10..13).map(other).collect()).await;
    let mut taught_by = vec![Some(shape), None];
    for expected in [None, Some(2200), Some(5500)] {
        let c = s.claim_jobs(input.clone()).await.expect("claim");
        assert_eq!(c.leases.len(), 1, "{:?}", c.leases);
        let l = &c.leases[0];
        assert_eq!(l.starts_with_mib, expected);
        let told = match taught_by.is_empty() {
            true => None,
            false => taught_by.remove(0),
        };
        finish_attempt(&s, l.attempt, ended_with_shape(l.fence, told))
            .await
            .expect("end");
    }
}

/// A run placed by learned phases that holds more than they count it at now, when its
/// neighbour runs out of memory within its own estimate, is blamed for it (the neighbour is
/// tried again for free), and its configuration's runs hold their peak throughout from then
/// on: its key's floor rises to what it was placed by.
async fn a_run_that_outgrows_its_learned_phase_is_blamed_and_its_key_holds_its_peak(s: Backend) {
    let agent = register(&s, "n1", 1, Some("4")).await;
    submit(
        &s,
        (0..3)
            .map(|i| job(i, Some(6000), vec![FailureClass::Oom], 2))
            .collect(),
    )
    .await;
    let input = claim_input(agent, Some(free(1, 10_000)), 4);
    let teacher = s.claim_jobs(input.clone()).await.expect("claim").leases;
    let taught = ended_with_shape(teacher[0].fence, Some(late_peak()));
    finish_attempt(&s, teacher[0].attempt, taught)
        .await
        .expect("end");
    let grower = s.claim_jobs(input.clone()).await.expect("claim").leases;
    assert_eq!(
        grower[0].starts_with_mib,
        Some(2200),
        "placed by learned phases"
    );
    started_now(&s, &grower[0]).await;
    let recheck = s
        .claim_jobs(input.clone())
        .await
        .expect("claim")
        .recheck_in_ms
        .expect("a time to look again");
    tokio::time::sleep(std::time::Duration::from_millis(recheck)).await;
    let victim = s.claim_jobs(input.clone()).await.expect("claim").leases;
    assert_eq!(victim.len(), 1, "its peak comes after the first's");
    let key = |s: &Backend| {
        let s = s.clone();
        async move {
            s.key_history(vec!["exp".into()])
                .await
                .expect("history")
                .get("exp")
                .and_then(|h| h.floor)
        }
    };
    assert_eq!(key(&s).await, None);
    // Well before its peak, the first holds 6,000 MiB where its phases count 2,200.
    let oom = FinishReport {
        gpus: vec![GpuSample {
            index: 0,
            used_mib: 10_000,
            free_mib: 0,
            processes: vec![headroom_shared::api::GpuProcess {
                pid: 7,
                used_mib: 6000,
                attempt: Some(grower[0].attempt),
                user: None,
                command: None,
                used_mib_unknown: false,
                outside_pid_namespace: false,
                sm_util_pct: None,
            }],
            ..Default::default()
        }],
        ..report_peak(victim[0].fence, Some(FailureClass::Oom), 4000)
    };
    finish_attempt(&s, victim[0].attempt, oom)
        .await
        .expect("an OOM");
    let v = s.attempt(victim[0].attempt).await.expect("attempt");
    assert_eq!(
        v.oom_cause,
        Some(headroom_shared::api::OomCause::NeighbourGrew),
        "{v:?}"
    );
    assert_eq!(v.oom_neighbour, Some(grower[0].attempt));
    assert_eq!(
        key(&s).await,
        Some(6000),
        "its key holds its peak from now on"
    );
}

/// A run of 4 s holding 2,000 MiB, its peak in its last tenth.
fn late_peak() -> headroom_shared::phases::Phases {
    headroom_shared::phases::Phases {
        steady_mib: 2000,
        peak_from: 0.9,
        peak_until: 1.0,
        expected_ms: 4000,
        margin_permille: headroom_shared::phases::DECLARED_MARGIN_PERMILLE,
    }
}

/// A run that ended well with a peak of 5,000 MiB, telling `shape` (or none).
fn ended_with_shape(fence: i64, shape: Option<headroom_shared::phases::Phases>) -> FinishReport {
    FinishReport {
        measurements: Measurements {
            memory_profile: shape,
            ..Default::default()
        },
        ..report_peak(fence, None, 5000)
    }
}

/// `lease`'s job started now, as its agent reports it.
async fn started_now(s: &Backend, lease: &Lease) {
    s.start_attempt(
        lease.attempt,
        lease.fence,
        42,
        Utc::now().timestamp_millis(),
    )
    .await
    .expect("start");
}

/// A job that needs no GPU starts on a node whose GPUs are all taken, with more GPU jobs
/// waiting ahead of it than the claim's first window holds: past that window the claim reads
/// on only for such jobs (from their own index), not every waiting job.
async fn a_cpu_job_behind_a_full_node_s_queue_still_starts(s: Backend) {
    let agent = register(&s, "n1", 1, Some("1")).await;
    let mut jobs: Vec<NewJob> = (0..700).map(|i| job(i, Some(1000), vec![], 1)).collect();
    let mut cpu = job(700, None, vec![], 1);
    cpu.gpus = 0;
    let cpu_id = cpu.id;
    jobs.push(cpu);
    submit(&s, jobs).await;

    let first = claim(&s, agent, 1).await;
    let ids: Vec<JobId> = first.iter().map(|l| l.job).collect();
    assert_eq!(ids.len(), 2, "the GPU's one slot and a CPU slot: {ids:?}");
    assert!(
        ids.contains(&cpu_id),
        "the CPU-only job, 700 jobs back, starts"
    );
    assert_ne!(ids[0], cpu_id, "the queue's head takes the GPU first");

    // The GPU taken and the CPU job leased: nothing more to lease, however often asked.
    assert!(claim(&s, agent, 1).await.is_empty());
    // The first window's jobs were looked at and say why they wait; the GPU jobs behind it
    // were not read (a full node's claim read every waiting job before).
    let jobs = s.list_jobs(JobFilter::default()).await.expect("jobs");
    let reason = |index: u32| {
        let j = jobs.iter().find(|j| j.index == index).expect("job");
        j.pending_reason.clone()
    };
    assert_eq!(reason(1), Some(PendingReason::NoFreeSlot));
    assert_eq!(reason(600), None, "not read");
}

/// A claim reads the queue in windows sized by what its node has open, not by what its
/// agent asks for (64): a node with one GPU slot and its CPU slots reads the smallest window.
async fn a_claim_reads_a_window_sized_by_the_node_s_open_slots(s: Backend) {
    let agent = register(&s, "n1", 1, Some("1")).await;
    submit(
        &s,
        (0..100).map(|i| job(i, Some(1000), vec![], 1)).collect(),
    )
    .await;
    assert_eq!(claim(&s, agent, 1).await.len(), 1, "the GPU's one slot");
    let jobs = s.list_jobs(JobFilter::default()).await.expect("jobs");
    let reason = |index: u32| {
        let j = jobs.iter().find(|j| j.index == index).expect("job");
        j.pending_reason.clone()
    };
    assert_eq!(reason(31), Some(PendingReason::NoFreeSlot), "in the window");
    // A window sized by the 64 asked for held 256 jobs.
    assert_eq!(reason(32), None, "past the window: not read");
}

/// A job that ends before its start was reported is started by its end's report, in the
/// same write: its attempt shows its pid and start, and its job ran. A start already taken
/// is kept, whatever an end's report says of it.
async fn an_end_carries_a_start_not_yet_reported(s: Backend) {
    let agent = register(&s, "n1", 2, Some("1,1")).await;
    submit(&s, (0..2).map(|i| job(i, Some(1000), vec![], 1)).collect()).await;
    let leases = claim(&s, agent, 2).await;
    let (quick, slow) = (&leases[0], &leases[1]);
    let at = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).expect("time");
    // An end whose report carries a start at `ms` by `pid`, and what a success records.
    let end = |l: &Lease, pid: u32, ms: i64| {
        let report = FinishReport {
            started: Some(JobStarted {
                pid,
                started_at: at(ms),
            }),
            ..report(l.fence, None)
        };
        s.end_attempt(l.attempt, report)
    };
    let succeeded = |started| Finished {
        job_state: JobState::Succeeded,
        started,
    };

    let submitted_at = s.job(quick.job).await.expect("job").summary.created_at;
    let submitted_at = submitted_at.timestamp_millis();
    let finished = end(quick, 4242, 1_700_000_000_123).await.expect("finish");
    let started = Started {
        submitted_at,
        number: 1,
    };
    assert_eq!(finished, succeeded(Some(started)));
    let a = s.attempt(quick.attempt).await.expect("attempt");
    assert_eq!(a.pid, Some(4242));
    assert_eq!(a.started_at, Some(at(1_700_000_000_123)));

    let started = s
        .start_attempt(slow.attempt, slow.fence, 7, 1_700_000_000_000)
        .await
        .expect("start");
    assert_eq!(started.map(|st| st.number), Some(1));
    let again = s.start_attempt(slow.attempt, slow.fence, 7, 1_700_000_000_000);
    assert_eq!(
        again.await.expect("again"),
        None,
        "a repeated report records nothing"
    );
    let finished = end(slow, 99, 1_700_000_000_500).await.expect("finish");
    assert_eq!(finished, succeeded(None));
    let a = s.attempt(slow.attempt).await.expect("attempt");
    assert_eq!(a.pid, Some(7), "the start report's pid stays");
    assert_eq!(a.started_at, Some(at(1_700_000_000_000)));
}

async fn stale_fences_are_refused(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    submit(&s, vec![job(0, Some(1000), vec![], 1)]).await;
    let l = claim(&s, agent, 1).await.remove(0);
    let wrong = finish_attempt(&s, l.attempt, report(l.fence + 1, None)).await;
    assert!(
        matches!(wrong, Err(StoreError::StaleFence { .. })),
        "{wrong:?}"
    );
    finish_attempt(&s, l.attempt, report(l.fence, None))
        .await
        .expect("finish");
    // The end again with its token (the supervisor reported it, then the agent's journal
    // did): answered with the job's state, and nothing changes, whatever it says.
    let again = finish_attempt(&s, l.attempt, report(l.fence, None)).await;
    assert!(matches!(again, Ok(JobState::Succeeded)), "{again:?}");
    let other = finish_attempt(&s, l.attempt, report(l.fence, Some(FailureClass::Nonzero))).await;
    assert!(matches!(other, Ok(JobState::Succeeded)), "{other:?}");
    assert_eq!(state(&s, l.job).await, JobState::Succeeded);
    let d = s.job(l.job).await.expect("job");
    assert_eq!(d.attempts_detail.len(), 1);
    assert_eq!(d.attempts_detail[0].failure_class, None, "recorded once");
    assert_eq!(
        d.attempts_detail[0].host_peak_mib,
        Some(321),
        "host RAM peak stored"
    );
}

/// One job of this retry policy, leased on a one-GPU node `n1` and started.
async fn one_running(s: &Backend, retry_on: Vec<FailureClass>, max: u32) -> (AgentId, Lease) {
    let agent = register(s, "n1", 1, None).await;
    submit(s, vec![job(0, Some(1000), retry_on, max)]).await;
    let l = claim(s, agent, 1).await.remove(0);
    s.start_attempt(l.attempt, l.fence, 1, 0)
        .await
        .expect("start");
    (agent, l)
}

async fn retry_policy_decides_requeue(s: Backend) {
    let (agent, l) = one_running(&s, vec![FailureClass::Oom], 2).await;
    let st = finish_attempt(&s, l.attempt, report(l.fence, Some(FailureClass::Oom)))
        .await
        .expect("finish");
    assert_eq!(st, JobState::Retrying);
    let l2 = claim(&s, agent, 1).await.remove(0);
    assert_eq!(l2.job, l.job);
    assert_eq!(l2.number, 2);
    assert!(l2.fence > l.fence);
    let st = finish_attempt(&s, l2.attempt, report(l2.fence, Some(FailureClass::Oom)))
        .await
        .expect("finish");
    assert_eq!(st, JobState::Failed, "max_attempts reached");
    let d = s.job(l.job).await.expect("job");
    assert_eq!(d.attempts_detail.len(), 2);
    assert_eq!(d.summary.last_failure, Some(FailureClass::Oom));
    // A class not in `retry.on` fails at once.
    submit(&s, vec![job(1, Some(1000), vec![FailureClass::Oom], 3)]).await;
    let l3 = claim(&s, agent, 1).await.remove(0);
    let st = finish_attempt(
        &s,
        l3.attempt,
        report(l3.fence, Some(FailureClass::Nonzero)),
    )
    .await
    .expect("finish");
    assert_eq!(st, JobState::Failed);
    // A manual retry makes one more attempt.
    assert_eq!(
        s.retry_job(l3.job).await.expect("retry"),
        JobState::Retrying
    );
    assert_eq!(claim(&s, agent, 1).await[0].job, l3.job);
}

/// An experiment's failed jobs run once more, all in one operation; its succeeded jobs are
/// left as they are, and another experiment's failed and queued ones too.
async fn retry_failed_requeues_every_failed_job_of_the_experiment_only(s: Backend) {
    let agent = register(&s, "n1", 3, None).await;
    let exp = submit(&s, (0..3).map(|i| job(i, Some(1000), vec![], 1)).collect()).await;
    let leases = claim(&s, agent, 3).await;
    assert_eq!(leases.len(), 3);
    let ends = [Some(FailureClass::Nonzero), None, Some(FailureClass::Oom)];
    for (l, end) in leases.iter().zip(ends) {
        s.start_attempt(l.attempt, l.fence, 1, 0)
            .await
            .expect("start");
        finish_attempt(&s, l.attempt, report(l.fence, end))
            .await
            .expect("finish");
    }
    let other = submit(&s, (0..2).map(|i| job(i, Some(1000), vec![], 1)).collect()).await;
    let o = claim_with(&s, agent, Some(free(3, 10_000)), 1)
        .await
        .remove(0);
    finish_attempt(&s, o.attempt, report(o.fence, Some(FailureClass::Nonzero)))
        .await
        .expect("finish");
    let mut retried = s.retry_failed(exp).await.expect("retry failed");
    retried.sort();
    let mut failed = vec![leases[0].job, leases[2].job];
    failed.sort();
    assert_eq!(retried, failed);
    for job in &failed {
        assert_eq!(state(&s, *job).await, JobState::Retrying);
    }
    assert_eq!(state(&s, leases[1].job).await, JobState::Succeeded);
    assert_eq!(
        state(&s, o.job).await,
        JobState::Failed,
        "{other}'s job is left"
    );
    let queued = queued_of(&s, other).await;
    assert_eq!(queued.len(), 1, "{other}'s queued job is left");
    // Nothing failed any more: nothing to retry, and no error.
    assert!(s.retry_failed(exp).await.expect("again").is_empty());
    let unknown = s.retry_failed(ExperimentId::new()).await;
    assert!(
        matches!(unknown, Err(StoreError::NotFound { .. })),
        "{unknown:?}"
    );
}

/// Every figure `Measurements` declares (`FIGURES`) is stored by its end report and read back
/// as it was: a figure added to the table is kept by the store once its migration adds its
/// column, with nothing else written for it.
async fn every_figure_round_trips_through_the_store(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    submit(&s, vec![job(0, Some(1000), vec![], 1)]).await;
    let l = claim(&s, agent, 1).await.remove(0);
    s.start_attempt(l.attempt, l.fence, 1, 0)
        .await
        .expect("start");
    let mut end = report(l.fence, Some(FailureClass::Oom));
    for (i, f) in headroom_shared::api::FIGURES.iter().enumerate() {
        (f.set)(&mut end.measurements, Some(10.0 + i as f64 + 0.125));
    }
    end.memory_cap_mib = Some(1306);
    end.oom_cause = Some(headroom_shared::api::OomCause::CapHit);
    finish_attempt(&s, l.attempt, end).await.expect("finish");
    let a = s.attempt(l.attempt).await.expect("attempt");
    // The limit it ran under and why it ran out of memory.
    assert_eq!(a.memory_cap_mib, Some(1306));
    assert_eq!(a.oom_cause, Some(headroom_shared::api::OomCause::CapHit));
    for (i, f) in headroom_shared::api::FIGURES.iter().enumerate() {
        assert_eq!(
            (f.get)(&a.measurements),
            Some(10.0 + i as f64 + 0.125),
            "{} (column {})",
            f.name,
            f.column
        );
    }
}

async fn reregistration_loses_old_attempts(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    submit(&s, vec![job(0, Some(1000), vec![FailureClass::Lost], 3)]).await;
    let l = claim(&s, agent, 1).await.remove(0);
    s.start_attempt(l.attempt, l.fence, 7, 0)
        .await
        .expect("start");
    let agent2 = register_again(&s, "n1", 1, agent).await;
    assert_eq!(state(&s, l.job).await, JobState::Retrying);
    let a = s.attempt(l.attempt).await.expect("attempt");
    assert_eq!(a.failure_class, Some(FailureClass::Lost));
    let unknown = s
        .claim_jobs(ClaimInput {
            agent,
            gpus: None,
            max: 1,
            lease_ttl_ms: 1000,
            reserve_after_ms: 0,
            half_life_ms: headroom_coordinator::fair::DEFAULT_HALF_LIFE_MS,
            watching: vec![],
        })
        .await;
    assert!(matches!(unknown, Err(StoreError::UnknownAgent { .. })));
    assert_eq!(claim(&s, agent2, 1).await[0].job, l.job);
    // The old incarnation's report comes after the job was leased again: refused.
    let old = finish_attempt(&s, l.attempt, report(l.fence, None)).await;
    assert!(matches!(old, Err(StoreError::StaleFence { .. })));
}

async fn reregistration_resumes_current_attempts(s: Backend) {
    let agent = register(&s, "n1", 2, None).await;
    submit(&s, (0..2).map(|i| job(i, Some(1000), vec![], 1)).collect()).await;
    let leases = claim(&s, agent, 2).await;
    assert_eq!(leases.len(), 2);
    for l in &leases {
        s.start_attempt(l.attempt, l.fence, 7, 0)
            .await
            .expect("start");
    }
    // The agent comes back (coordinator restart, partition) still running both; one token
    // it presents is stale.
    let agent2 = AgentId::new();
    let reg = s
        .register_agent(Registration {
            host_memory_mib: None,
            agent: agent2,
            node: "n1".into(),
            gpus: gpus(2, 10_000),
            plan: None,
            headroom: None,
            resume: vec![
                AttemptRef {
                    attempt: leases[0].attempt,
                    fence: leases[0].fence,
                    waiting: None,
                },
                AttemptRef {
                    attempt: leases[1].attempt,
                    fence: leases[1].fence + 7,
                    waiting: None,
                },
            ],
            lease_ttl_ms: 30_000,
            previous: Some(agent),
        })
        .await
        .expect("register");
    assert_eq!(reg.lost, vec![leases[1].attempt]);
    assert_eq!(state(&s, leases[0].job).await, JobState::Running);
    assert_eq!(state(&s, leases[1].job).await, JobState::Failed);
    let renewed = renew(
        &s,
        agent2,
        vec![AttemptRef {
            attempt: leases[0].attempt,
            fence: leases[0].fence,
            waiting: None,
        }],
        vec![],
    )
    .await
    .expect("renew");
    assert!(renewed.cancel.is_empty());
    finish_attempt(&s, leases[0].attempt, report(leases[0].fence, None))
        .await
        .expect("finish");
    assert_eq!(state(&s, leases[0].job).await, JobState::Succeeded);
}

async fn lost_without_retry_fails(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    submit(&s, vec![job(0, Some(1000), vec![FailureClass::Lost], 1)]).await;
    let l = claim(&s, agent, 1).await.remove(0);
    s.start_attempt(l.attempt, l.fence, 7, 0)
        .await
        .expect("start");
    register_again(&s, "n1", 1, agent).await;
    assert_eq!(state(&s, l.job).await, JobState::Failed);
}

/// A node whose agent is alive is registered again only by that agent's instance (its
/// previous agent id), or by any once an admin allowed a takeover; agents and attempts are
/// traced to their node.
async fn a_live_node_is_registered_again_only_by_its_instance(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    submit(&s, vec![job(0, Some(1000), vec![], 1)]).await;
    let l = claim(&s, agent, 1).await.remove(0);
    let second = AgentId::new();
    let reg = |previous: Option<AgentId>| Registration {
        host_memory_mib: None,
        agent: second,
        node: "n1".into(),
        gpus: gpus(1, 10_000),
        plan: None,
        headroom: None,
        resume: vec![],
        lease_ttl_ms: 30_000,
        previous,
    };
    match s.register_agent(reg(None)).await {
        Err(StoreError::NodeHeld {
            node, agent: held, ..
        }) => {
            assert_eq!((node.as_str(), held), ("n1", agent.to_string()));
        }
        other => panic!("another instance registered a live node: {other:?}"),
    }
    let wrong = s.register_agent(reg(Some(AgentId::new()))).await;
    assert!(
        matches!(wrong, Err(StoreError::NodeHeld { .. })),
        "{wrong:?}"
    );
    // Nothing changed: the first agent still holds its lease.
    assert_eq!(state(&s, l.job).await, JobState::Leased);
    assert_eq!(
        s.node_of(NodeOf::Agent(agent)).await.expect("node of"),
        Some("n1".to_string())
    );
    assert_eq!(
        s.node_of(NodeOf::Attempt(l.attempt))
            .await
            .expect("node of"),
        Some("n1".to_string())
    );
    assert_eq!(
        s.node_of(NodeOf::Agent(AgentId::new()))
            .await
            .expect("node of"),
        None
    );
    // An admin lets another instance in: the first one's attempt is lost with it.
    s.takeover("n1").await.expect("takeover");
    s.register_agent(reg(None))
        .await
        .expect("registers after takeover");
    assert_ne!(state(&s, l.job).await, JobState::Leased);
    assert!(matches!(
        s.takeover("nope").await,
        Err(StoreError::NotFound { .. })
    ));
}

/// A name has one role: a token of a name another role holds is refused, and so is a
/// configured name the store gives another role. A user's Unix user reaches its jobs'
/// leases as it is when they are leased.
async fn users_have_one_role_and_their_unix_user_reaches_their_leases(s: Backend) {
    use headroom_shared::api::{Role, UserView};
    s.ensure_users(vec![("admin".into(), Role::Admin, None)])
        .await
        .expect("configured admin");
    let token = |name: &str, role| NewToken {
        id: format!("id{name}{role}"),
        name: name.into(),
        role,
        secret_hash: "$argon2id$x".into(),
        secret_digest: None,
        created_by: "admin".into(),
        expires_at: None,
        nodes: None,
    };
    let named_admin = s.create_token(token("admin", Role::User)).await;
    assert!(
        matches!(
            named_admin,
            Err(StoreError::UserRole {
                role: Role::Admin,
                ..
            })
        ),
        "{named_admin:?}"
    );
    s.create_token(token("alice", Role::User))
        .await
        .expect("alice's token");
    assert!(matches!(
        s.ensure_users(vec![("alice".into(), Role::Agent, None)])
            .await,
        Err(StoreError::UserRole { .. })
    ));
    let user = |unix_user: Option<&str>, role| UserView {
        name: "alice".into(),
        role,
        unix_user: unix_user.map(String::from),
        allow_root: false,
        limits: Default::default(),
        created_at: chrono::Utc::now(),
    };
    assert!(matches!(
        s.put_user(user(Some("alice"), Role::Admin)).await,
        Err(StoreError::UserRole { .. })
    ));
    let agent = register(&s, "n1", 2, None).await;
    submit_as(&s, "alice", vec![job(0, Some(1000), vec![], 1)]).await;
    submit_as(&s, "bob", vec![job(1, Some(1000), vec![], 1)]).await;
    // Mapped after submission, before the lease: the lease says it.
    let u = s
        .put_user(user(Some("alice-unix"), Role::User))
        .await
        .expect("put");
    assert_eq!(u.unix_user.as_deref(), Some("alice-unix"));
    let leases = claim(&s, agent, 2).await;
    assert_eq!(leases.len(), 2);
    for l in &leases {
        let run_as = l.run_as.as_ref().map(|r| r.unix_user.as_str());
        let owner = s.job(l.job).await.expect("job").summary.submitted_by;
        match owner.as_str() {
            "alice" => assert_eq!(run_as, Some("alice-unix")),
            _ => assert_eq!(run_as, None, "bob maps to no Unix user"),
        }
    }
    let users = s.users().await.expect("users");
    let names: Vec<_> = users.iter().map(|u| (u.name.as_str(), u.role)).collect();
    assert_eq!(names, [("admin", Role::Admin), ("alice", Role::User)]);
}

/// What a progress watcher asks before counting: whether any job (of the experiment, or of
/// any) has not ended, through queued, leased, running and ended.
async fn unfinished_is_true_until_every_job_has_ended(s: Backend) {
    let agent = register(&s, "n1", 2, None).await;
    assert!(
        !s.unfinished(None).await.expect("unfinished"),
        "no jobs at all"
    );
    let a = submit(&s, (0..2).map(|i| job(i, Some(1000), vec![], 1)).collect()).await;
    assert!(s.unfinished(Some(a)).await.expect("unfinished"), "queued");
    let leases = claim(&s, agent, 2).await;
    assert_eq!(leases.len(), 2);
    assert!(s.unfinished(Some(a)).await.expect("unfinished"), "leased");
    s.start_attempt(leases[0].attempt, leases[0].fence, 7, 0)
        .await
        .expect("start");
    finish_attempt(&s, leases[1].attempt, report(leases[1].fence, None))
        .await
        .expect("finish");
    assert!(
        s.unfinished(Some(a)).await.expect("unfinished"),
        "one running"
    );
    // Another experiment's queued job is unfinished work of all, not of `a`.
    let b = submit(&s, vec![job(0, Some(1000), vec![], 1)]).await;
    finish_attempt(
        &s,
        leases[0].attempt,
        report(leases[0].fence, Some(FailureClass::Nonzero)),
    )
    .await
    .expect("finish");
    assert!(
        !s.unfinished(Some(a)).await.expect("unfinished"),
        "all ended"
    );
    assert!(s.unfinished(Some(b)).await.expect("unfinished"));
    assert!(s.unfinished(None).await.expect("unfinished"));
    let c = s.counts(Some(a)).await.expect("counts");
    assert_eq!(c.finished(), c.total());
}

async fn cancel_stops_queued_and_flags_running(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    let exp = submit(&s, (0..3).map(|i| job(i, Some(1000), vec![], 1)).collect()).await;
    let l = claim(&s, agent, 1).await.remove(0);
    s.start_attempt(l.attempt, l.fence, 7, 0)
        .await
        .expect("start");
    assert_eq!(s.cancel_experiment(exp).await.expect("cancel"), 3);
    // The agent's next claim, watching the attempt, is told; the slot stays held until
    // the agent reports the end.
    let claimed = s
        .claim_jobs(ClaimInput {
            agent,
            gpus: None,
            max: 1,
            lease_ttl_ms: 30_000,
            reserve_after_ms: u64::MAX,
            half_life_ms: headroom_coordinator::fair::DEFAULT_HALF_LIFE_MS,
            watching: vec![l.attempt],
        })
        .await
        .expect("claim");
    assert_eq!(claimed.cancel, vec![l.attempt]);
    assert!(claimed.leases.is_empty());
    let st = finish_attempt(
        &s,
        l.attempt,
        report(l.fence, Some(FailureClass::Cancelled)),
    )
    .await
    .expect("finish");
    assert_eq!(st, JobState::Cancelled);
    assert!(
        claim(&s, agent, 1).await.is_empty(),
        "cancelled jobs are not leased"
    );
    assert_eq!(s.counts(Some(exp)).await.expect("counts").cancelled, 3);
    assert_eq!(s.cancel_experiment(exp).await.expect("cancel"), 0);
}

async fn plans_change_at_run_time(s: Backend) {
    let agent = register(&s, "n1", 2, None).await;
    submit(&s, (0..6).map(|i| job(i, Some(1000), vec![], 1)).collect()).await;
    assert_eq!(claim(&s, agent, 2).await.len(), 2);
    let bad = s.set_plan("n1", "2,2,2").await;
    assert!(matches!(bad, Err(StoreError::InvalidPlan(_))), "{bad:?}");
    let bad = s.set_plan("n1", "2,x").await;
    assert!(matches!(bad, Err(StoreError::InvalidPlan(_))));
    assert!(matches!(
        s.set_plan("nope", "1").await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        s.set_plan("n1", "3, 2").await.expect("plan").to_string(),
        "3,2"
    );
    assert_eq!(claim(&s, agent, 2).await.len(), 3);
    let nodes = s.list_nodes(60_000).await.expect("nodes");
    assert_eq!(nodes[0].plan, "3,2");
    assert_eq!(nodes[0].gpus[0].slots_used, 3);
    assert_eq!(nodes[0].gpus[0].estimated_mib, 3000);
}

async fn hand_back_requeues_without_cost(s: Backend) {
    let agent = register(&s, "n1", 2, None).await;
    submit(&s, vec![job(0, Some(1000), vec![], 1)]).await;
    let l = claim(&s, agent, 2).await.remove(0);
    s.hand_back(l.attempt, l.fence, &free(2, 10_000))
        .await
        .expect("hand back");
    assert_eq!(state(&s, l.job).await, JobState::Queued);
    // Not counted as an attempt, and placed away from the GPU that did not fit.
    let l2 = claim(&s, agent, 2).await.remove(0);
    assert_eq!((l2.job, l2.number), (l.job, 1));
    assert_ne!(
        l2.gpus, l.gpus,
        "the handed-back GPU is avoided for a while"
    );
    assert!(s.hand_back(l.attempt, l.fence, &[]).await.is_err());
    // With nowhere else to go, the job waits rather than bouncing on the same GPU.
    s.hand_back(l2.attempt, l2.fence, &free(2, 10_000))
        .await
        .expect("hand back");
    assert!(claim(&s, agent, 2).await.is_empty());
}

async fn expired_leases_become_lost(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    submit(&s, vec![job(0, Some(1000), vec![FailureClass::Lost], 2)]).await;
    let leases = claim_with(&s, agent, Some(free(1, 10_000)), 4).await;
    s.start_attempt(leases[0].attempt, leases[0].fence, 1, 0)
        .await
        .expect("start");
    let now = now_ms();
    assert!(
        s.expire_leases(now + 29_000)
            .await
            .expect("expire")
            .is_empty(),
        "a lease lasts its TTL"
    );
    assert_eq!(state(&s, leases[0].job).await, JobState::Running);
    assert_eq!(
        s.expire_leases(now + 30_100).await.expect("expire"),
        vec![leases[0].attempt]
    );
    assert_eq!(state(&s, leases[0].job).await, JobState::Retrying);
    assert!(
        s.expire_leases(now + 60_000)
            .await
            .expect("expire")
            .is_empty(),
        "lost once"
    );
}

async fn exports_one_row_per_attempt(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    let exp = submit(&s, vec![job(0, Some(1000), vec![FailureClass::Nonzero], 2)]).await;
    let l = claim(&s, agent, 1).await.remove(0);
    finish_attempt(&s, l.attempt, report(l.fence, Some(FailureClass::Nonzero)))
        .await
        .expect("finish");
    let l = claim(&s, agent, 1).await.remove(0);
    finish_attempt(&s, l.attempt, report(l.fence, None))
        .await
        .expect("finish");
    let rows = s.export_rows(Some(exp)).await.expect("export");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].attempt.success, Some(false));
    assert_eq!(rows[1].attempt.success, Some(true));
    assert_eq!(rows[1].job.params["i"], serde_json::json!(0));
    let jobs = s
        .list_jobs(JobFilter {
            experiment: Some(exp),
            ..Default::default()
        })
        .await
        .expect("jobs");
    assert_eq!(jobs.len(), 1);
}

/// A key's estimate follows its latest 256 peaks: jobs that once peaked high no longer hold
/// the key up once 256 newer attempts peaked lower (over all of them the p95 would still be
/// the old peak).
async fn estimates_follow_the_latest_peaks(s: Backend) {
    let agent = register(&s, "n1", 1, Some("64")).await;
    submit(&s, (0..320).map(|i| job(i, Some(100), vec![], 1)).collect()).await;
    let old = claim_with(&s, agent, Some(free(1, 10_000)), 20).await;
    assert_eq!(old.len(), 20);
    for l in &old {
        finish_attempt(&s, l.attempt, report_peak(l.fence, None, 3000))
            .await
            .expect("finish");
    }
    let mut newer = 0;
    while newer < 300 {
        // Later leases than the old ones' (the store's clock counts milliseconds).
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        let leases = claim(&s, agent, 1).await;
        assert!(!leases.is_empty(), "nothing leased after {newer}");
        for l in &leases {
            finish_attempt(&s, l.attempt, report_peak(l.fence, None, 1000))
                .await
                .expect("finish");
        }
        newer += leases.len();
    }
    submit(&s, vec![job(999, Some(100), vec![], 1)]).await;
    let last = claim(&s, agent, 1).await;
    assert_eq!(last.len(), 1);
    assert_eq!(
        last[0].estimate_mib,
        Some(1100),
        "p95 of the latest 256 x 1.1"
    );
}

/// How long a key's runs take is the mean of its successful runs, those that left no GPU
/// peak too (a CPU-only job's, a GPU whose per-process memory could not be read); failed
/// runs teach nothing.
async fn run_lengths_are_learned_from_successful_runs_with_or_without_a_peak(s: Backend) {
    let agent = register(&s, "n1", 1, Some("8")).await;
    let keyed = |i: u32, key: &str| NewJob {
        memory_key: key.into(),
        ..job(i, Some(100), vec![], 1)
    };
    // (key, run time, failure, GPU peak)
    let runs = [
        ("a", 2_000, None, Some(500)),
        ("a", 4_000, None, None),
        ("b", 9_000, Some(FailureClass::Nonzero), Some(500)),
        ("c", 1_000, None, None),
    ];
    let jobs: Vec<NewJob> = (0..).zip(&runs).map(|(i, r)| keyed(i, r.0)).collect();
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    submit(&s, jobs).await;
    let leases = claim(&s, agent, 1).await;
    assert_eq!(leases.len(), runs.len());
    let t0 = now_ms() - 60_000;
    for l in &leases {
        let at = ids
            .iter()
            .position(|id| *id == l.job)
            .expect("a job of ours");
        let (_, ms, failure, peak) = runs[at];
        s.start_attempt(l.attempt, l.fence, 42, t0)
            .await
            .expect("start");
        let r = FinishReport {
            ended_at: chrono::DateTime::from_timestamp_millis(t0 + ms).expect("time"),
            peak_mem_mib: peak,
            ..report(l.fence, failure)
        };
        finish_attempt(&s, l.attempt, r).await.expect("finish");
    }
    let learned = s
        .key_durations(vec!["a".into(), "b".into(), "c".into(), "d".into()])
        .await
        .expect("durations");
    assert_eq!(
        learned,
        BTreeMap::from([("a".to_string(), 3_000), ("c".to_string(), 1_000)]),
        "the mean of each key's successful runs, with or without a peak"
    );
}

async fn estimates_are_learned_per_memory_key(s: Backend) {
    let agent = register(&s, "n1", 1, Some("4")).await;
    // No declared memory: the first job of the key runs alone.
    submit(&s, (0..3).map(|i| job(i, None, vec![], 1)).collect()).await;
    let first = claim(&s, agent, 1).await;
    assert_eq!(first.len(), 1, "unknown memory: alone on the GPU");
    assert_eq!(first[0].estimate_mib, None);
    assert!(claim(&s, agent, 1).await.is_empty());
    finish_attempt(
        &s,
        first[0].attempt,
        report_peak(first[0].fence, None, 2000),
    )
    .await
    .expect("finish");
    // Now the key has a peak: 2000 x 1.1, and the rest pack.
    let next = claim(&s, agent, 1).await;
    assert_eq!(next.len(), 2);
    assert_eq!(next[0].estimate_mib, Some(2200));
    let a = s.attempt(next[0].attempt).await.expect("attempt");
    assert_eq!(a.estimate_source, "learned");
    // An OOM raises the key's estimate at once (x1.25 of what the attempt had).
    finish_attempt(
        &s,
        next[0].attempt,
        report_peak(next[0].fence, Some(FailureClass::Oom), 2100),
    )
    .await
    .expect("finish");
    submit(&s, vec![job(9, Some(1000), vec![], 1)]).await;
    let after = claim(&s, agent, 1).await;
    assert_eq!(
        after[0].estimate_mib,
        Some(2750),
        "declared 1000 < floor 2750"
    );
    // Whose OOM it was, as its own figures tell: within its estimate (2100 of 2200), not
    // said; past it (2600 of 2200), its own (`cap_hit`).
    let within = s.attempt(next[0].attempt).await.expect("attempt");
    assert_eq!(within.oom_cause, None);
    finish_attempt(
        &s,
        next[1].attempt,
        report_peak(next[1].fence, Some(FailureClass::Oom), 2600),
    )
    .await
    .expect("finish");
    let grew = s.attempt(next[1].attempt).await.expect("attempt");
    assert_eq!(grew.oom_cause, Some(headroom_shared::api::OomCause::CapHit));
}

/// A declared estimate that its runs kept to stands as declared: the learned margin is not
/// laid on a figure runs confirmed. Once a run peaks past it, the learned p95 with its
/// margin is taken.
async fn a_declared_estimate_its_runs_kept_to_stands(s: Backend) {
    let agent = register(&s, "n1", 1, Some("4")).await;
    assert_eq!(
        declared_4000_ended_at(&s, agent, 0, 4000).await.0,
        Some(4000)
    );
    assert_eq!(
        declared_4000_ended_at(&s, agent, 1, 4100).await,
        (Some(4000), "declared".to_string()),
        "not 4400: the run kept to it"
    );
    assert_eq!(
        declared_4000_ended_at(&s, agent, 2, 4100).await,
        (Some(4510), "learned".to_string()),
        "4100 x 1.1: a run went past it"
    );
}

/// One job declaring 4,000 MiB, submitted once the one before it ended, claimed and ended
/// with `peak`: the estimate it was placed by, and where that came from.
async fn declared_4000_ended_at(
    s: &Backend,
    agent: AgentId,
    index: u32,
    peak: u64,
) -> (Option<u64>, String) {
    submit(s, vec![job(index, Some(4000), vec![], 1)]).await;
    let lease = claim(s, agent, 1).await.remove(0);
    let source = s
        .attempt(lease.attempt)
        .await
        .expect("attempt")
        .estimate_source;
    finish_attempt(s, lease.attempt, report_peak(lease.fence, None, peak))
        .await
        .expect("finish");
    (lease.estimate_mib, source)
}

/// An OOM whose text says what it asked for raises its key past this node's GPUs: the job
/// waits for a live node whose GPU it fits and runs there; once its need passes every live
/// GPU, it runs alone on an idle GPU rather than waiting for one no node has.
async fn a_need_past_this_node_waits_for_a_larger_one_and_past_every_gpu_runs_alone(s: Backend) {
    let small = register(&s, "small", 1, Some("2")).await; // 10_000 MiB, 9_000 usable
    submit(&s, vec![job(0, Some(2000), vec![FailureClass::Oom], 3)]).await;
    let first = claim(&s, small, 1).await;
    assert_eq!(first[0].estimate_mib, Some(2000));
    let oom = |fence: i64, asked: &str| FinishReport {
        log_tail: format!("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {asked}"),
        ..report_peak(fence, Some(FailureClass::Oom), 1500)
    };
    let st = finish_attempt(&s, first[0].attempt, oom(first[0].fence, "12.00 GiB"))
        .await
        .expect("finish");
    assert_eq!(st, JobState::Retrying);
    // (1500 + 12288) x 1.1: more than the small node's 9,000, within the big one's.
    let big = register_gpus(&s, "big", gpus(1, 81_920), None).await;
    assert!(
        claim(&s, small, 1).await.is_empty(),
        "a larger GPU is live: it waits for it"
    );
    let second = claim_with(&s, big, Some(free(1, 81_920)), 64).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].estimate_mib, Some(15_167));
    // It asks for 80 GiB there: no live GPU offers that.
    let st = finish_attempt(&s, second[0].attempt, oom(second[0].fence, "80.00 GiB"))
        .await
        .expect("finish");
    assert_eq!(st, JobState::Retrying);
    let third = claim(&s, small, 1).await;
    assert_eq!(third.len(), 1, "it runs rather than waiting for ever");
    assert_eq!(third[0].estimate_mib, None, "alone on an idle GPU");
    let a = s.attempt(third[0].attempt).await.expect("attempt");
    assert_eq!(a.estimate_source, "none");
    assert!(
        claim(&s, small, 1).await.is_empty(),
        "nothing joins a GPU a job with no estimate holds"
    );
}

/// A colocated job: its background reaches the agent with the lease, the pair is placed by
/// the sum of both memories, the attempt records what became of the background, and the
/// job's memory key learns from the foreground's share only.
async fn colocated_jobs_carry_their_background_and_record_it(s: Backend) {
    use headroom_shared::api::BackgroundReport;
    use headroom_shared::colocate::{Background, OnBackgroundExit};
    let agent = register(&s, "n1", 1, Some("2")).await;
    let bg = Background {
        argv: vec!["bg-load".into(), "--mem=4000MiB".into()],
        env: BTreeMap::from([("BG".to_string(), "1".to_string())]),
        memory_mib: 4_000,
        ready_log: Some("^ready".into()),
        start_timeout_ms: 60_000,
        on_exit: OnBackgroundExit::Flag,
    };
    // 10000 MiB GPU, 10% headroom: 5000 + 4000 fits once; a second pair does not.
    let pair = |i| NewJob {
        background: Some(bg.clone()),
        ..job(i, Some(5_000), vec![], 1)
    };
    let (first, second) = (pair(0), pair(1));
    let second_id = second.id;
    submit(&s, vec![first, second]).await;
    let leases = claim(&s, agent, 1).await;
    assert_eq!(leases.len(), 1, "two pairs need 18000 MiB");
    let lease = &leases[0];
    assert_eq!(lease.estimate_mib, Some(9_000));
    assert_eq!(lease.background.as_ref(), Some(&bg));
    let job_id = lease.job;
    s.start_attempt(
        lease.attempt,
        lease.fence,
        42,
        Utc::now().timestamp_millis(),
    )
    .await
    .expect("start");
    let record = BackgroundReport {
        pid: Some(41),
        ready_ms: Some(1_234),
        exit_code: Some(3),
        signal: None,
        exited_early: true,
    };
    finish_attempt(
        &s,
        lease.attempt,
        FinishReport {
            background: Some(record),
            ..report_peak(lease.fence, Some(FailureClass::Oom), 5_200)
        },
    )
    .await
    .expect("finish");
    let a = s.attempt(lease.attempt).await.expect("attempt");
    assert_eq!(a.background_pid, Some(41));
    assert_eq!(a.background_ready_ms, Some(1_234));
    assert_eq!(a.background_exit_code, Some(3));
    assert_eq!(a.background_signal, None);
    assert_eq!(a.background_exited_early, Some(true));
    assert_eq!(state(&s, job_id).await, JobState::Failed);
    // The OOM floor is the foreground's (max(5000, 5200) x 1.25 = 6500), not the pair's
    // (9000 x 1.25): the next pair needs 6500 + 4000, above the GPU's 9000.
    assert!(claim(&s, agent, 1).await.is_empty());
    let waiting = s.job(second_id).await.expect("job");
    assert_eq!(
        waiting.summary.pending_reason,
        Some(PendingReason::LargerThanEveryGpu {
            needed_mib: 6_500 + 4_000,
            largest_mib: 9_000
        })
    );
}

async fn oom_ladder_degrades_and_retries(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    let mut j = job(0, Some(1000), vec![], 1);
    j.params = BTreeMap::from([("batch_size".to_string(), serde_json::json!(256))]);
    j.argv = vec!["train".into(), "--bs=256".into()];
    j.oom_ladder = vec![BTreeMap::from([(
        "batch_size".to_string(),
        serde_json::json!("/2"),
    )])];
    submit(&s, vec![j]).await;
    let l = claim(&s, agent, 1).await.remove(0);
    let st = finish_attempt(&s, l.attempt, report(l.fence, Some(FailureClass::Oom)))
        .await
        .expect("finish");
    assert_eq!(
        st,
        JobState::Retrying,
        "a ladder step retries even outside retry.on"
    );
    let l2 = claim(&s, agent, 1).await.remove(0);
    assert_eq!(l2.argv, vec!["train".to_string(), "--bs=128".into()]);
    assert_eq!(l2.params["batch_size"], serde_json::json!(128));
    let st = finish_attempt(&s, l2.attempt, report(l2.fence, Some(FailureClass::Oom)))
        .await
        .expect("finish");
    assert_eq!(st, JobState::Failed, "the ladder is exhausted");
    let d = s.job(l.job).await.expect("job");
    assert_eq!(d.ladder_step, 1);
    let steps: Vec<u32> = d.attempts_detail.iter().map(|a| a.ladder_step).collect();
    assert_eq!(steps, vec![0, 1]);
    assert_eq!(
        d.attempts_detail[0].params["batch_size"],
        serde_json::json!(256)
    );
}

/// One GPU's samples: `used` MiB of 10,000 taken.
fn used(used_mib: u64) -> Vec<GpuSample> {
    vec![GpuSample {
        index: 0,
        used_mib,
        free_mib: 10_000 - used_mib,
        ..Default::default()
    }]
}

/// A claim woken without samples of its own (a long-poll's later rounds) places with the
/// newer of the node's samples and those its latest end brought (kept apart from the node's
/// row): the memory an end freed is placed at once and shown, and a later reading of the
/// node wins over an older end's.
async fn a_claim_without_samples_places_with_what_the_latest_end_freed(s: Backend) {
    let agent = register(&s, "n1", 1, Some("2")).await;
    submit(&s, vec![job(0, Some(6000), vec![], 1)]).await;
    let first = claim_with(&s, agent, Some(used(0)), 8).await;
    assert_eq!(first.len(), 1);
    submit(&s, vec![job(1, Some(6000), vec![], 1)]).await;
    // The first job holds 6,000 MiB: the second does not fit beside it.
    assert!(claim_with(&s, agent, Some(used(6000)), 8).await.is_empty());
    let mut r = report(first[0].fence, None);
    r.gpus = used(0);
    finish_attempt(&s, first[0].attempt, r)
        .await
        .expect("finish");
    let view = s.list_nodes(60_000).await.expect("nodes");
    assert_eq!(
        view[0].gpus[0].free_mib,
        Some(10_000),
        "`headroom nodes` shows it too"
    );
    let second = claim_with(&s, agent, None, 8).await;
    assert_eq!(second.len(), 1, "the end's samples show the GPU free");
    // The node read later (something else took 9,000 MiB): that reading wins.
    finish_attempt(&s, second[0].attempt, {
        let mut r = report(second[0].fence, None);
        r.gpus = used(0);
        r
    })
    .await
    .expect("finish");
    submit(&s, vec![job(2, Some(6000), vec![], 1)]).await;
    // A reading in the same millisecond as the end counts as the end's: this one is later.
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    assert!(claim_with(&s, agent, Some(used(9000)), 0).await.is_empty());
    assert!(
        claim_with(&s, agent, None, 8).await.is_empty(),
        "the node's newer samples, not the older end's, say the GPU is taken"
    );
}

async fn unverified_cleanup_quarantines_gpus(s: Backend) {
    let agent = register(&s, "n1", 2, Some("2,2")).await;
    submit(&s, (0..4).map(|i| job(i, Some(1000), vec![], 1)).collect()).await;
    let leases = claim(&s, agent, 2).await;
    let on0 = leases
        .iter()
        .find(|l| l.gpus == vec![0])
        .expect("a lease on GPU 0");
    let mut r = report(on0.fence, None);
    r.cleanup_verified = false;
    r.unverified = Some("pid 4242 (python) still holds 5.5 GiB".into());
    finish_attempt(&s, on0.attempt, r).await.expect("finish");
    let nodes = s.list_nodes(60_000).await.expect("nodes");
    let q = &nodes[0].gpus[0].quarantine;
    assert_eq!(q.len(), 1);
    assert!(q[0].reason.contains("4242"));
    // GPU 0 takes nothing while quarantined, GPU 1 still does.
    for l in leases.iter().filter(|l| l.attempt != on0.attempt) {
        finish_attempt(&s, l.attempt, report(l.fence, None))
            .await
            .expect("finish");
    }
    let more = claim(&s, agent, 2).await;
    assert!(more.iter().all(|l| l.gpus == vec![1]), "{more:?}");
    // Released by the agent once the leftover is gone.
    assert_eq!(
        s.release_attempts(agent, &[on0.attempt])
            .await
            .expect("release"),
        1
    );
    assert!(
        s.list_nodes(60_000).await.expect("nodes")[0].gpus[0]
            .quarantine
            .is_empty()
    );
    assert!(matches!(
        s.release_gpu("n1", 7).await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(s.release_gpu("n1", 0).await.expect("release"), 0);
}

/// One heartbeat renews each of its agent's attempts with what that one waits on, and says
/// which of them a user cancelled; a stale token for any one refuses all of it.
async fn one_heartbeat_renews_each_attempt_and_says_which_were_cancelled(s: Backend) {
    let agent = register(&s, "n1", 3, None).await;
    submit(&s, (0..3).map(|i| job(i, Some(1000), vec![], 1)).collect()).await;
    let leases = claim(&s, agent, 3).await;
    assert_eq!(leases.len(), 3);
    assert_eq!(s.cancel_job(leases[1].job).await.expect("cancel"), 1);
    let each = |stale: usize| -> Vec<AttemptRef> {
        leases
            .iter()
            .enumerate()
            .map(|(i, l)| AttemptRef {
                attempt: l.attempt,
                fence: if i == stale { l.fence - 1 } else { l.fence },
                waiting: (i == 2).then(|| format!("cooling {i}")),
            })
            .collect()
    };
    let refused = renew(&s, agent, each(2), free(3, 10_000)).await;
    assert!(
        matches!(refused, Err(StoreError::StaleFence { .. })),
        "{refused:?}"
    );
    assert_eq!(
        s.attempt(leases[2].attempt).await.expect("attempt").waiting,
        None
    );
    let r = renew(&s, agent, each(usize::MAX), free(3, 10_000))
        .await
        .expect("renew");
    assert_eq!(r.cancel, vec![leases[1].attempt]);
    let mut waiting = Vec::new();
    for l in &leases {
        waiting.push(s.attempt(l.attempt).await.expect("attempt").waiting);
    }
    assert_eq!(waiting, vec![None, None, Some("cooling 2".to_string())]);
}

async fn stale_heartbeats_and_logs_are_refused_and_change_nothing(s: Backend) {
    let (agent, l) = one_running(&s, vec![FailureClass::Lost], 3).await;
    let before = s.list_nodes(60_000).await.expect("nodes")[0].gpus[0].free_mib;
    // A heartbeat presenting a stale token for its attempt: refused, telemetry not stored.
    let mut samples = free(1, 10_000);
    samples[0].free_mib = 1234;
    let stale = renew(
        &s,
        agent,
        vec![AttemptRef {
            attempt: l.attempt,
            fence: l.fence - 1,
            waiting: None,
        }],
        samples,
    )
    .await;
    assert!(
        matches!(stale, Err(StoreError::StaleFence { .. })),
        "{stale:?}"
    );
    assert_eq!(
        s.list_nodes(60_000).await.expect("nodes")[0].gpus[0].free_mib,
        before,
        "a refused heartbeat stores nothing"
    );
    // A current log chunk is accepted; once the attempt is lost and the job leased again,
    // its log chunks are refused.
    s.check_log_fence(l.attempt, l.fence)
        .await
        .expect("current");
    let agent2 = register_again(&s, "n1", 1, agent).await;
    let again = claim(&s, agent2, 1).await;
    assert_eq!(again.len(), 1, "the lost attempt's job is leased again");
    let late = s.check_log_fence(l.attempt, l.fence).await;
    assert!(
        matches!(late, Err(StoreError::StaleFence { .. })),
        "{late:?}"
    );
    // The old agent's heartbeat for the lost attempt is refused as well.
    let old = renew(
        &s,
        agent2,
        vec![AttemptRef {
            attempt: l.attempt,
            fence: l.fence,
            waiting: None,
        }],
        vec![],
    )
    .await;
    assert!(matches!(old, Err(StoreError::StaleFence { .. })), "{old:?}");
}

/// An attempt that ended by its own report while a heartbeat naming it was on its way is
/// not stale: the heartbeat renews the others (busy nodes hit this race all the time).
async fn heartbeats_racing_a_normal_end_renew_the_rest(s: Backend) {
    let agent = register(&s, "n1", 1, Some("2")).await;
    submit(&s, (0..3).map(|i| job(i, Some(1000), vec![], 1)).collect()).await;
    let leases = claim(&s, agent, 1).await;
    assert_eq!(leases.len(), 2);
    for l in &leases {
        s.start_attempt(l.attempt, l.fence, 7, 0)
            .await
            .expect("start");
    }
    finish_attempt(&s, leases[0].attempt, report(leases[0].fence, None))
        .await
        .expect("finish");
    // The freed slot goes to the third job at once.
    assert_eq!(claim(&s, agent, 1).await.len(), 1);
    let refs = presented(&leases);
    let renewed = renew(&s, agent, refs, free(1, 10_000))
        .await
        .expect("a heartbeat racing a finish is accepted");
    assert!(renewed.cancel.is_empty());
    finish_attempt(&s, leases[1].attempt, report(leases[1].fence, None))
        .await
        .expect("the other attempt is still ours");
}

/// A job with no declared memory that OOMs near the GPU's size: its ladder step is placed by
/// the estimate of the parameters it runs with, and the last step repeats.
async fn oom_ladder_steps_get_their_own_estimate_and_repeat(s: Backend) {
    let agent = register(&s, "n1", 1, None).await; // 10_000 MiB, headroom 1_000
    let mut j = job(0, None, vec![], 4);
    j.params = BTreeMap::from([("batch_size".to_string(), serde_json::json!(64))]);
    j.argv = vec!["train".into(), "--bs=64".into()];
    j.oom_ladder = vec![BTreeMap::from([(
        "batch_size".to_string(),
        serde_json::json!("/2"),
    )])];
    submit(&s, vec![j]).await;
    let mut bs = vec![];
    for _ in 0..4 {
        let leases = claim(&s, agent, 1).await;
        assert_eq!(
            leases.len(),
            1,
            "each laddered attempt is placed (bs {bs:?})"
        );
        let l = &leases[0];
        bs.push(l.params["batch_size"].clone());
        // OOM at 9_500 MiB: the key's floor (11_875) exceeds the GPU.
        let st = finish_attempt(
            &s,
            l.attempt,
            report_peak(l.fence, Some(FailureClass::Oom), 9_500),
        )
        .await
        .expect("finish");
        if bs.len() < 4 {
            assert_eq!(st, JobState::Retrying, "bs {bs:?}");
        } else {
            assert_eq!(st, JobState::Failed, "max_attempts spent");
        }
    }
    assert_eq!(
        bs,
        vec![
            serde_json::json!(64),
            serde_json::json!(32),
            serde_json::json!(16),
            serde_json::json!(8)
        ]
    );
}

/// Every write a long-poll may wait for announces itself through the store's change counter
/// (handlers no longer bump it): submit, claim, start, finish and hand-back.
async fn writes_announce_their_changes(s: Backend) {
    let changes = s.changes();
    let agent = register(&s, "n1", 2, None).await;
    let mut seen = changes.version();
    let mut advanced = |what: &str| {
        let now = changes.version();
        assert!(now > seen, "{what} did not announce a change");
        seen = now;
    };
    submit(
        &s,
        vec![job(0, Some(1000), vec![], 1), job(1, Some(1000), vec![], 1)],
    )
    .await;
    advanced("submit");
    let mut leases = claim(&s, agent, 2).await;
    advanced("claim");
    let (a, b) = (leases.remove(0), leases.remove(0));
    s.start_attempt(a.attempt, a.fence, 1, 0)
        .await
        .expect("start");
    advanced("start");
    finish_attempt(&s, a.attempt, report(a.fence, None))
        .await
        .expect("finish");
    advanced("finish");
    s.hand_back(b.attempt, b.fence, &free(2, 10_000))
        .await
        .expect("hand back");
    advanced("hand back");
}

async fn pending_jobs_say_why(s: Backend) {
    let agent = register(&s, "n1", 1, None).await; // one slot, 10_000 MiB
    submit(
        &s,
        vec![
            job(0, Some(1000), vec![], 1),
            job(1, Some(1000), vec![], 1),
            job(2, Some(10 * 1024 * 1024 * 1024), vec![], 1),
        ],
    )
    .await;
    let leases = claim(&s, agent, 1).await;
    assert_eq!(leases.len(), 1);
    let jobs = s.list_jobs(JobFilter::default()).await.expect("jobs");
    assert_eq!(jobs[0].pending_reason, None, "leased jobs do not wait");
    assert_eq!(jobs[1].pending_reason, Some(PendingReason::NoFreeSlot));
    assert!(
        matches!(
            jobs[2].pending_reason,
            Some(PendingReason::LargerThanEveryGpu {
                largest_mib: 9_000,
                ..
            })
        ),
        "{:?}",
        jobs[2].pending_reason
    );
    let shown = s.job(jobs[2].id).await.expect("job");
    assert_eq!(shown.summary.pending_reason, jobs[2].pending_reason);
}

/// A job leased and back in the queue (its attempt failed and is retried) shows no reason
/// from before its lease: what a claim said of it then no longer holds, and no claim has
/// looked at it since.
async fn a_requeued_job_shows_no_reason_from_before_its_lease(s: Backend) {
    let agent = register(&s, "n1", 1, None).await; // one slot
    submit(
        &s,
        vec![
            job(0, Some(1000), vec![], 1),
            job(1, Some(1000), vec![FailureClass::Oom], 2),
        ],
    )
    .await;
    let first = claim(&s, agent, 1).await.remove(0);
    let reason = |jobs: &[JobSummary], index: u32| {
        let j = jobs.iter().find(|j| j.index == index).expect("job");
        j.pending_reason.clone()
    };
    let jobs = s.list_jobs(JobFilter::default()).await.expect("jobs");
    assert_eq!(reason(&jobs, 1), Some(PendingReason::NoFreeSlot));

    finish_attempt(&s, first.attempt, report(first.fence, None))
        .await
        .expect("finish");
    let second = claim(&s, agent, 1).await.remove(0);
    let st = finish_attempt(
        &s,
        second.attempt,
        report(second.fence, Some(FailureClass::Oom)),
    )
    .await
    .expect("finish");
    assert_eq!(st, JobState::Retrying);
    let jobs = s.list_jobs(JobFilter::default()).await.expect("jobs");
    assert_eq!(
        reason(&jobs, 1),
        None,
        "the reason from before its lease is gone"
    );
    let shown = s.job(second.job).await.expect("job");
    assert_eq!(shown.summary.pending_reason, None);
}

async fn peak_sources_are_stored_and_device_deltas_teach(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    let exp = submit(&s, (0..3).map(|i| job(i, None, vec![], 1)).collect()).await;
    // The driver gave no per-process memory: the peak is the GPU's used-memory growth.
    let l = claim(&s, agent, 1).await.remove(0);
    let delta = FinishReport {
        peak_source: Some(PeakSource::DeviceDelta),
        ..report_peak(l.fence, None, 2000)
    };
    finish_attempt(&s, l.attempt, delta).await.expect("finish");
    let a = s.attempt(l.attempt).await.expect("attempt");
    assert_eq!(a.peak_mem_mib, Some(2000));
    assert_eq!(a.peak_source, Some(PeakSource::DeviceDelta));
    // Others' growth meanwhile counts too, so it errs high: the key learns from it.
    let l = claim(&s, agent, 1).await.remove(0);
    assert_eq!(l.estimate_mib, Some(2200));
    // An older agent sends no source: its peak is per process.
    finish_attempt(&s, l.attempt, report_peak(l.fence, None, 1000))
        .await
        .expect("finish");
    assert_eq!(
        s.attempt(l.attempt).await.expect("attempt").peak_source,
        Some(PeakSource::Processes)
    );
    // No peak at all: no source either.
    let l = claim(&s, agent, 1).await.remove(0);
    let none = FinishReport {
        peak_mem_mib: None,
        peak_source: Some(PeakSource::DeviceDelta),
        ..report(l.fence, None)
    };
    finish_attempt(&s, l.attempt, none).await.expect("finish");
    let rows = s.export_rows(Some(exp)).await.expect("export");
    let sources: Vec<_> = rows.iter().map(|r| r.attempt.peak_source).collect();
    assert_eq!(
        sources,
        [
            Some(PeakSource::DeviceDelta),
            Some(PeakSource::Processes),
            None
        ]
    );
}

async fn attempt_measurements_are_stored_and_read_back(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    let exp = submit(&s, (0..2).map(|i| job(i, None, vec![], 1)).collect()).await;
    let measured = Measurements {
        energy_j: Some(701.448),
        energy_source: Some(EnergySource::Integrated),
        mean_power_w: Some(233.6),
        max_power_w: Some(234.0),
        max_temp_c: Some(42.63),
        start_temp_c: Some(39.0),
        mean_util_pct: Some(79.816),
        throttled_thermal: Some(true),
        throttled_power: Some(false),
        throttle_reasons: Some(vec!["sw_thermal_slowdown".into()]),
        contamination_reason: Some("a process of no attempt held 700 MiB on GPU 0".into()),
        contamination_pid: Some(4242),
        contamination_command: Some("alice: python notebook.py".into()),
        first_reading_ms: Some(1_250),
        covers_run: Some(false),
        counters: vec![headroom_shared::api::CounterWindow {
            gpu: 0,
            from: chrono::DateTime::from_timestamp_millis(1_800_000_000_000).expect("t"),
            to: chrono::DateTime::from_timestamp_millis(1_800_000_004_000).expect("t"),
            from_j: 10.5,
            to_j: 711.948,
            util_pct: Some(37.5),
        }],
        ghost_mib: Some(2_048),
        // A contaminated run teaches no shape.
        memory_profile: None,
    };
    let l = claim(&s, agent, 1).await.remove(0);
    let full = FinishReport {
        contaminated: true,
        measurements: measured.clone(),
        ..report(l.fence, None)
    };
    finish_attempt(&s, l.attempt, full).await.expect("finish");
    let a = s.attempt(l.attempt).await.expect("attempt");
    assert_eq!(a.measurements, measured);
    assert_eq!(a.contaminated, Some(true));
    // An older supervisor's report carries none: every figure unknown, none 0.
    let l = claim(&s, agent, 1).await.remove(0);
    finish_attempt(&s, l.attempt, report(l.fence, None))
        .await
        .expect("finish");
    let rows = s.export_rows(Some(exp)).await.expect("export");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].attempt.measurements, measured);
    assert_eq!(rows[1].attempt.measurements, Measurements::default());
}

/// What `/metrics` counts from the store: ended attempts by outcome, and per submitter the
/// jobs waiting and the jobs holding a lease.
async fn tallies_count_outcomes_and_each_users_jobs(s: Backend) {
    use headroom_coordinator::store::{Tallies, UserJobs};
    let agent = register(&s, "n1", 1, None).await;
    submit_as(
        &s,
        "alice",
        (0..3).map(|i| job(i, Some(1_000), vec![], 1)).collect(),
    )
    .await;
    submit_as(&s, "bob", vec![job(0, Some(1_000), vec![], 1)]).await;
    assert_eq!(
        s.tallies().await.expect("tallies"),
        Tallies {
            outcomes: vec![],
            by_user: vec![
                (
                    "alice".into(),
                    UserJobs {
                        queued: 3,
                        running: 0
                    }
                ),
                (
                    "bob".into(),
                    UserJobs {
                        queued: 1,
                        running: 0
                    }
                ),
            ],
        }
    );
    // One slot: alice's first job runs and fails, her second then runs and succeeds.
    let l = claim(&s, agent, 1).await.remove(0);
    finish_attempt(&s, l.attempt, report(l.fence, Some(FailureClass::Oom)))
        .await
        .expect("finish");
    let l = claim(&s, agent, 1).await.remove(0);
    finish_attempt(&s, l.attempt, report(l.fence, None))
        .await
        .expect("finish");
    let _running = claim(&s, agent, 1).await.remove(0);
    let t = s.tallies().await.expect("tallies");
    assert_eq!(
        t.outcomes,
        vec![("oom".to_string(), 1), ("succeeded".to_string(), 1)]
    );
    let of = |who: &str| t.by_user.iter().find(|(u, _)| u == who).map(|(_, j)| *j);
    let (alice, bob) = (of("alice"), of("bob"));
    // The third running is alice's or bob's (same priority: submission order says alice's).
    assert_eq!(
        alice,
        Some(UserJobs {
            queued: 0,
            running: 1
        })
    );
    assert_eq!(
        bob,
        Some(UserJobs {
            queued: 1,
            running: 0
        })
    );
}

/// `on_throttle` from the stored spec: a throttled success is retried (`retry`), failed
/// (`fail`) or kept (`flag`, and specs stored before the field existed), the attempt's
/// failure class `throttled` either way.
async fn a_throttled_run_is_what_its_specs_on_throttle_says(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    let throttled = |fence| FinishReport {
        measurements: Measurements {
            throttled_thermal: Some(true),
            throttled_power: Some(false),
            throttle_reasons: Some(vec!["sw_thermal_slowdown".into()]),
            ..Measurements::default()
        },
        ..report(fence, None)
    };
    for (on_throttle, state, class) in [
        (
            Some("retry"),
            JobState::Retrying,
            Some(FailureClass::Throttled),
        ),
        (
            Some("fail"),
            JobState::Failed,
            Some(FailureClass::Throttled),
        ),
        (Some("flag"), JobState::Succeeded, None),
        (None, JobState::Succeeded, None),
    ] {
        let spec = match on_throttle {
            Some(o) => serde_json::json!({"on_throttle": o}),
            None => serde_json::json!({}),
        };
        let j = NewJob {
            retry_on: vec![FailureClass::Lost],
            ..job(0, Some(1_000), vec![], 3)
        };
        let job_id = j.id;
        s.create_experiment(NewExperiment {
            host_memory_mib: None,
            checkpoint: None,
            preemptible: false,
            memory_cap_off: false,
            memory_phases: None,
            id: ExperimentId::new(),
            name: "hot".into(),
            seed: 1,
            spec,
            jobs: vec![j],
            submitted_by: "anonymous".into(),
            source: None,
            results: None,
            study: None,
            max_concurrent: None,
        })
        .await
        .expect("create experiment");
        let l = claim(&s, agent, 1).await.remove(0);
        s.start_attempt(l.attempt, l.fence, 7, Utc::now().timestamp_millis())
            .await
            .expect("start");
        let got = finish_attempt(&s, l.attempt, throttled(l.fence))
            .await
            .expect("finish");
        assert_eq!(got, state, "on_throttle {on_throttle:?}");
        let a = s.attempt(l.attempt).await.expect("attempt");
        assert_eq!(a.failure_class, class, "on_throttle {on_throttle:?}");
        if class.is_some() {
            assert!(
                a.log_tail
                    .unwrap_or_default()
                    .contains("sw_thermal_slowdown")
            );
        }
        if state == JobState::Retrying {
            // The retry runs; it is not throttled this time.
            let again = claim(&s, agent, 1).await.remove(0);
            assert_eq!(again.job, job_id);
            finish_attempt(&s, again.attempt, report(again.fence, None))
                .await
                .expect("finish");
        }
    }
}

/// Two attempts whose jobs ran on one GPU at the same time are both `shared`, wherever an
/// attempt is read (the attempt, its job, the export), with their overlap and energy shares
/// that add up to the GPU's counter delta over both runs; one that ran after them, or on
/// another GPU, is not.
async fn attempts_that_ran_on_one_gpu_together_are_labelled_shared(s: Backend) {
    use headroom_shared::api::{CounterWindow, ShareMethod};
    let agent = register(&s, "n1", 2, Some("2,1")).await;
    let exp = submit(&s, (0..4).map(|i| job(i, Some(1_000), vec![], 1)).collect()).await;
    let leases = claim(&s, agent, 2).await;
    assert_eq!(leases.len(), 3, "two on GPU 0, one on GPU 1");
    let on = |gpu: u32| leases.iter().filter(move |l| l.gpus == [gpu]);
    let (a, b) = {
        let mut zero = on(0);
        (zero.next().expect("a"), zero.next().expect("b"))
    };
    let c = on(1).next().expect("c");
    let t0 = Utc::now().timestamp_millis() - 60_000;
    let t = |ms: i64| chrono::DateTime::from_timestamp_millis(t0 + ms).expect("time");
    // GPU 0's counter: 100 W, 300 W while both run.
    let joules = |ms: i64| match ms {
        ..=5_000 => ms as f64 / 10.0,
        5_001..=10_000 => 500.0 + (ms - 5_000) as f64 * 0.3,
        _ => 2_000.0 + (ms - 10_000) as f64 / 10.0,
    };
    let run = |lease: &Lease, gpu: u32, from: i64, to: i64| {
        let (attempt, fence) = (lease.attempt, lease.fence);
        let s = &s;
        async move {
            s.start_attempt(attempt, fence, 7, t0 + from)
                .await
                .expect("start");
            let finish = FinishReport {
                ended_at: t(to),
                measurements: Measurements {
                    energy_j: Some(joules(to) - joules(from)),
                    energy_source: Some(EnergySource::Counter),
                    covers_run: Some(true),
                    first_reading_ms: Some(0),
                    counters: vec![CounterWindow {
                        gpu,
                        from: t(from),
                        to: t(to),
                        from_j: joules(from),
                        to_j: joules(to),
                        util_pct: None,
                    }],
                    ..Measurements::default()
                },
                ..report(fence, None)
            };
            finish_attempt(s, attempt, finish).await.expect("finish");
        }
    };
    run(a, 0, 0, 10_000).await;
    run(b, 0, 5_000, 15_000).await;
    run(c, 1, 0, 10_000).await;
    let later = claim(&s, agent, 2).await.remove(0);
    run(&later, later.gpus[0], 20_000, 21_000).await;

    let (va, vb) = (
        s.attempt(a.attempt).await.expect("a"),
        s.attempt(b.attempt).await.expect("b"),
    );
    let (sa, sb) = (
        va.sharing.clone().expect("a shared"),
        vb.sharing.clone().expect("b shared"),
    );
    assert!(va.shared && vb.shared);
    assert_eq!(
        (sa.with.clone(), sb.with.clone()),
        (vec![b.attempt], vec![a.attempt])
    );
    assert_eq!((sa.overlap, sb.overlap), (0.5, 0.5));
    assert_eq!(sa.share_method, ShareMethod::TimeWeighted);
    let (ea, eb) = (sa.energy_share_j.expect("a"), sb.energy_share_j.expect("b"));
    assert!((ea + eb - joules(15_000)).abs() < 1e-6, "{ea} + {eb}");
    assert!((ea - (500.0 + 750.0)).abs() < 1e-6, "{ea}");
    // Each one's energy stays its GPU's over its run, others' draw included.
    assert_eq!(va.measurements.energy_j, Some(2_000.0));
    for alone in [c.attempt, later.attempt] {
        let v = s.attempt(alone).await.expect("alone");
        assert!(!v.shared && v.sharing.is_none(), "{v:?}");
    }
    let detail = s.job(va.job).await.expect("job");
    assert!(detail.attempts_detail[0].shared);
    let rows = s.export_rows(Some(exp)).await.expect("export");
    let shared: Vec<bool> = rows.iter().map(|r| r.attempt.shared).collect();
    assert_eq!(shared.iter().filter(|&&x| x).count(), 2, "{shared:?}");
}

/// One job of this policy leased with a lease that has already run out, started (unless
/// `start` is false) and then expired: its attempt is recorded lost.
async fn one_lost(s: &Backend, agent: AgentId, job: NewJob, start: bool) -> Lease {
    submit(s, vec![job]).await;
    let l = s
        .claim_jobs(ClaimInput {
            agent,
            gpus: Some(free(1, 10_000)),
            max: 1,
            lease_ttl_ms: 0,
            reserve_after_ms: u64::MAX,
            half_life_ms: headroom_coordinator::fair::DEFAULT_HALF_LIFE_MS,
            watching: vec![],
        })
        .await
        .expect("claim")
        .leases
        .remove(0);
    if start {
        s.start_attempt(l.attempt, l.fence, 1, 0)
            .await
            .expect("start");
    }
    let past_ttl = now_ms() + 1;
    assert_eq!(
        s.expire_leases(past_ttl).await.expect("expire"),
        vec![l.attempt]
    );
    l
}

/// The real end of an attempt recorded lost (its agent was away past the TTL) arrives
/// later: taken as the attempt really ended while its job was not leased again (no second
/// attempt), refused with a stale fence once it was, the new attempt unaffected.
async fn late_outcomes_of_lost_attempts(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    // Lost by lease expiry, requeued, not leased again: the late success stands.
    let l = one_lost(
        &s,
        agent,
        job(0, Some(1000), vec![FailureClass::Lost], 3),
        true,
    )
    .await;
    assert_eq!(state(&s, l.job).await, JobState::Retrying);
    let mut late = report(l.fence, None);
    late.ended_at = Utc::now() - chrono::Duration::seconds(3);
    late.log_tail = "the real tail".into();
    let st = finish_attempt(&s, l.attempt, late.clone())
        .await
        .expect("a late outcome of a job not leased again is taken");
    assert_eq!(st, JobState::Succeeded);
    let d = s.job(l.job).await.expect("job");
    assert_eq!(d.summary.state, JobState::Succeeded);
    assert_eq!(d.summary.last_failure, None, "the loss is replaced");
    assert_eq!(d.attempts_detail.len(), 1, "{:#?}", d.attempts_detail);
    let a = &d.attempts_detail[0];
    assert_eq!(
        (a.failure_class, a.success, a.exit_code),
        (None, Some(true), Some(0))
    );
    assert_eq!(
        a.ended_at.map(|t| t.timestamp_millis()),
        Some(late.ended_at.timestamp_millis()),
        "recorded as it really ended"
    );
    assert_eq!(a.log_tail.as_deref(), Some("the real tail"));
    assert!(claim(&s, agent, 1).await.is_empty(), "no second attempt");
    let again = finish_attempt(&s, l.attempt, late).await;
    assert!(
        matches!(again, Ok(JobState::Succeeded)),
        "taken once: {again:?}"
    );
    assert!(
        claim(&s, agent, 1).await.is_empty(),
        "still no second attempt"
    );

    // Lost, then leased again: the late report is refused and changes nothing.
    let l = one_lost(
        &s,
        agent,
        job(1, Some(1000), vec![FailureClass::Lost], 3),
        true,
    )
    .await;
    let l2 = claim(&s, agent, 1).await.remove(0);
    assert_eq!((l2.job, l2.number), (l.job, 2));
    s.start_attempt(l2.attempt, l2.fence, 2, 0)
        .await
        .expect("start");
    let refused = finish_attempt(&s, l.attempt, report(l.fence, None)).await;
    assert!(
        matches!(refused, Err(StoreError::StaleFence { .. })),
        "{refused:?}"
    );
    let d = s.job(l.job).await.expect("job");
    assert_eq!(
        d.summary.state,
        JobState::Running,
        "the new attempt is unaffected"
    );
    assert_eq!(d.attempts_detail[0].failure_class, Some(FailureClass::Lost));
    assert_eq!(d.attempts_detail[1].ended_at, None);
    assert_eq!(
        finish_attempt(&s, l2.attempt, report(l2.fence, None))
            .await
            .expect("the new attempt reports"),
        JobState::Succeeded
    );

    // Lost with no retry left (the job failed): the late success still stands.
    let l = one_lost(&s, agent, job(2, Some(1000), vec![], 1), true).await;
    assert_eq!(state(&s, l.job).await, JobState::Failed);
    assert_eq!(
        finish_attempt(&s, l.attempt, report(l.fence, None))
            .await
            .expect("late"),
        JobState::Succeeded
    );

    // Lost before its start was heard (the loss gave the attempt back): a late failure
    // counts the attempt again, as the policy says.
    let l = one_lost(
        &s,
        agent,
        job(3, Some(1000), vec![FailureClass::Nonzero], 1),
        false,
    )
    .await;
    assert_eq!(state(&s, l.job).await, JobState::Retrying);
    assert_eq!(
        finish_attempt(&s, l.attempt, report(l.fence, Some(FailureClass::Nonzero)))
            .await
            .expect("late"),
        JobState::Failed,
        "max_attempts 1: the attempt it ran was its one"
    );
    let d = s.job(l.job).await.expect("job");
    assert_eq!(d.summary.last_failure, Some(FailureClass::Nonzero));
    assert_eq!(d.attempts_detail.len(), 1);
}

/// A telemetry sample of `gpu` at `ms`, with every reading set from `v`.
fn tsample(gpu: u32, ms: i64, v: f64) -> TelemetrySample {
    TelemetrySample {
        gpu,
        at: chrono::DateTime::from_timestamp_millis(ms).expect("time"),
        used_mib: Some(1000),
        free_mib: Some(9000),
        total_mib: Some(10_000),
        utilization_pct: Some(80),
        power_w: Some(v),
        energy_j: Some(v * 10.0),
        temperature_c: Some(40.25),
        sm_clock_mhz: Some(1980),
        throttle: Some(vec!["sw_power_cap".into()]),
        error: None,
    }
}

fn all_time() -> SeriesWindow {
    SeriesWindow {
        since: 0,
        until: i64::MAX,
        limit: 1000,
    }
}

async fn telemetry_is_stored_per_gpu_and_served_per_attempt(s: Backend) {
    let agent = register(&s, "n1", 2, None).await;
    submit(&s, vec![job(0, Some(1000), vec![], 1)]).await;
    let lease = claim(&s, agent, 2).await.remove(0);
    let gpu = lease.gpus[0];
    let before = s
        .telemetry_of_attempt(lease.attempt, 100)
        .await
        .expect("leased");
    assert!(before.from.is_none(), "{before:?}");
    assert!(before.gpus.iter().all(|g| g.samples.is_empty()));

    let base = (Utc::now().timestamp_millis() / 1000 - 60) * 1000;
    let mut batch: Vec<TelemetrySample> = (0..5)
        .flat_map(|i| {
            [
                tsample(0, base + i * 1000, 100.0 + i as f64),
                tsample(1, base + i * 1000, 7.0),
            ]
        })
        .collect();
    // A GPU that cannot give power, energy or throttle reasons: absent, never 0.
    batch[1].power_w = None;
    batch[1].energy_j = None;
    batch[1].throttle = None;
    batch[1].error = Some("NVML power: Not Supported".into());
    assert_eq!(
        s.record_telemetry(agent, batch.clone())
            .await
            .expect("record"),
        10
    );
    // Sent again (its answer was lost): stored once.
    assert_eq!(
        s.record_telemetry(agent, batch.clone())
            .await
            .expect("again"),
        0
    );

    let g0 = s
        .telemetry_of_gpu("n1", 0, all_time())
        .await
        .expect("series");
    assert_eq!(g0.len(), 5);
    assert_eq!(g0[0], batch[0], "round trip, oldest first");
    assert_eq!(g0[4].power_w, Some(104.0));
    assert_eq!(g0[4].energy_j, Some(1040.0));
    let g1 = s
        .telemetry_of_gpu("n1", 1, all_time())
        .await
        .expect("series");
    assert_eq!(g1[0], batch[1]);
    assert_eq!((g1[0].power_w, g1[0].throttle.clone()), (None, None));
    // A window, and a limit that keeps the newest.
    let window = SeriesWindow {
        since: base + 1000,
        until: base + 3000,
        limit: 2,
    };
    let w = s.telemetry_of_gpu("n1", 0, window).await.expect("window");
    assert_eq!(
        w.iter()
            .map(|x| x.at.timestamp_millis() - base)
            .collect::<Vec<_>>(),
        vec![2000, 3000]
    );

    // A sample naming a GPU the node lacks refuses the batch, naming it; nothing is written.
    let bad = vec![tsample(0, base + 9000, 1.0), tsample(5, base + 9000, 1.0)];
    match s.record_telemetry(agent, bad).await {
        Err(StoreError::Invalid { field, .. }) => assert_eq!(field, "telemetry[1].gpu"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.telemetry_of_gpu("n1", 0, all_time())
            .await
            .expect("series")
            .len(),
        5
    );
    assert!(matches!(
        s.record_telemetry(AgentId::new(), vec![tsample(0, base, 1.0)])
            .await,
        Err(StoreError::UnknownAgent { .. })
    ));
    assert!(matches!(
        s.telemetry_of_gpu("nope", 0, all_time()).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        s.telemetry_of_gpu("n1", 9, all_time()).await,
        Err(StoreError::NotFound { .. })
    ));

    // The attempt ran from base+1 s to base+3 s on its GPU: those samples, that GPU only.
    s.start_attempt(lease.attempt, lease.fence, 1, base + 1000)
        .await
        .expect("start");
    let mut end = report(lease.fence, None);
    end.ended_at = chrono::DateTime::from_timestamp_millis(base + 3000).expect("time");
    finish_attempt(&s, lease.attempt, end)
        .await
        .expect("finish");
    let t = s
        .telemetry_of_attempt(lease.attempt, 100)
        .await
        .expect("attempt");
    assert_eq!(t.node, "n1");
    assert_eq!(t.gpus.len(), 1);
    assert_eq!(t.gpus[0].gpu, gpu);
    assert_eq!(
        t.gpus[0]
            .samples
            .iter()
            .map(|x| x.at.timestamp_millis() - base)
            .collect::<Vec<_>>(),
        vec![1000, 2000, 3000]
    );
    assert!(matches!(
        s.telemetry_of_attempt(headroom_shared::AttemptId::new(), 10)
            .await,
        Err(StoreError::NotFound { .. })
    ));
}

/// Tokens are kept with their hash, listed without it, revoked once (the first time stays),
/// and ids are unique.
/// A join gives a node its first credential once: of two at the same time exactly one gets
/// it; a registered node, or a name a user or token bears, gets none.
async fn a_node_joins_once_whoever_asks_at_the_same_time(s: Backend) {
    let new = |id: &str, name: &str| NewToken {
        id: id.into(),
        name: name.into(),
        role: Role::Agent,
        secret_hash: format!("$argon2id$hash-of-{id}"),
        secret_digest: Some(format!("digest-of-{id}")),
        created_by: "lab-join".into(),
        expires_at: None,
        nodes: None,
    };
    let (a, b) = tokio::join!(
        s.join_node(new("j1", "gpu-1")),
        s.join_node(new("j2", "gpu-1"))
    );
    assert!(a.is_ok() != b.is_ok(), "exactly one: {a:?} {b:?}");
    let lost = a.err().or(b.err()).expect("one refused");
    assert!(matches!(lost, StoreError::NodeJoined { .. }), "{lost:?}");
    assert!(s.joinable("gpu-1").await.is_err());
    // A name a user bears, of any role; a node registered with a credential made by hand.
    s.create_token(NewToken {
        role: Role::User,
        ..new("u1", "alice")
    })
    .await
    .expect("alice");
    assert!(matches!(
        s.join_node(new("j3", "alice")).await,
        Err(StoreError::NodeJoined { .. })
    ));
    register(&s, "gpu-2", 1, None).await;
    assert!(matches!(
        s.join_node(new("j4", "gpu-2")).await,
        Err(StoreError::NodeJoined { .. })
    ));
    assert!(s.joinable("gpu-3").await.is_ok());
    let made = s.join_node(new("j5", "gpu-3")).await.expect("gpu-3 joins");
    assert_eq!((made.name.as_str(), made.role), ("gpu-3", Role::Agent));
}

async fn tokens_are_created_found_listed_and_revoked(s: Backend) {
    let new = |id: &str, name: &str, role| NewToken {
        id: id.into(),
        name: name.into(),
        role,
        secret_hash: format!("$argon2id$hash-of-{id}"),
        secret_digest: Some(format!("digest-of-{id}")),
        created_by: "admin".into(),
        expires_at: (id == "n1").then_some(4_102_444_800_000),
        nodes: (role == Role::Join).then(|| vec!["gpu-*".to_string(), "dgx-a".to_string()]),
    };
    let alice = s
        .create_token(new("a1", "alice", Role::User))
        .await
        .expect("create alice");
    assert_eq!(
        (alice.id.as_str(), alice.name.as_str(), alice.role),
        ("a1", "alice", Role::User)
    );
    assert_eq!(alice.created_by, "admin");
    assert!(alice.revoked_at.is_none());
    s.create_token(new("n1", "node-1", Role::Agent))
        .await
        .expect("create agent");
    let dup = s.create_token(new("a1", "mallory", Role::Admin)).await;
    assert!(
        matches!(&dup, Err(StoreError::TokenExists { id }) if id == "a1"),
        "a second token with id a1 is refused as a conflict: {dup:?}"
    );
    let found = s.token_by_id("a1").await.expect("by id");
    assert_eq!(found.secret_hash, "$argon2id$hash-of-a1");
    assert_eq!(found.secret_digest.as_deref(), Some("digest-of-a1"));
    // A digest is kept once: a token without one (made by an earlier version) gets it, a
    // second keeping changes nothing, and no token is made by keeping one.
    s.create_token(NewToken {
        secret_digest: None,
        ..new("o1", "olga", Role::User)
    })
    .await
    .expect("create olga");
    assert!(
        s.token_by_id("o1")
            .await
            .expect("o1")
            .secret_digest
            .is_none()
    );
    assert!(
        s.keep_token_digest("o1", "digest-1".into())
            .await
            .expect("keep")
    );
    assert!(
        !s.keep_token_digest("o1", "digest-2".into())
            .await
            .expect("keep again")
    );
    assert!(
        !s.keep_token_digest("a1", "other".into())
            .await
            .expect("a1 has one")
    );
    assert!(
        !s.keep_token_digest("zz", "x".into())
            .await
            .expect("no such token")
    );
    let o1 = s.token_by_id("o1").await.expect("o1");
    assert_eq!(o1.secret_digest.as_deref(), Some("digest-1"));
    assert_eq!(
        o1.secret_hash, "$argon2id$hash-of-o1",
        "the argon2 hash stays"
    );
    assert_eq!(found.view.name, "alice", "the duplicate changed nothing");
    assert!(found.view.expires_at.is_none());
    // A join token keeps the nodes it may make; others name none.
    s.create_token(new("j1", "lab-join", Role::Join))
        .await
        .expect("create join");
    let join = s.token_by_id("j1").await.expect("by id").view;
    assert_eq!(
        join.nodes.as_deref(),
        Some(&["gpu-*".to_string(), "dgx-a".to_string()][..])
    );
    assert!(found.view.nodes.is_none());
    let agent = s.token_by_id("n1").await.expect("by id").view;
    assert_eq!(
        agent.expires_at.map(|t| t.timestamp_millis()),
        Some(4_102_444_800_000)
    );
    assert!(matches!(
        s.token_by_id("nope").await,
        Err(StoreError::NotFound { .. })
    ));
    let listed = s.list_tokens().await.expect("list");
    let mut ids: Vec<&str> = listed.iter().map(|t| t.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["a1", "j1", "n1", "o1"]);
    let revoked = s.revoke_token("a1").await.expect("revoke");
    let at = revoked.revoked_at.expect("revoked time");
    let again = s.revoke_token("a1").await.expect("revoke again");
    assert_eq!(
        again.revoked_at,
        Some(at),
        "the first revocation time stays"
    );
    assert!(
        s.token_by_id("a1")
            .await
            .expect("by id")
            .view
            .revoked_at
            .is_some()
    );
    assert!(
        s.token_by_id("n1")
            .await
            .expect("by id")
            .view
            .revoked_at
            .is_none(),
        "only that token"
    );
    assert!(matches!(
        s.revoke_token("nope").await,
        Err(StoreError::NotFound { .. })
    ));
}

async fn telemetry_retention_prunes_by_age_and_count_in_batches(s: Backend) {
    let agent = register(&s, "n1", 2, None).await;
    let base = 1_700_000_000_000;
    let mut samples: Vec<TelemetrySample> =
        (0..30).map(|i| tsample(0, base + i * 1000, 1.0)).collect();
    samples.extend((20..25).map(|i| tsample(1, base + i * 1000, 1.0)));
    s.record_telemetry(agent, samples).await.expect("record");
    let keep = Retention {
        older_than: base + 10_000,
        keep_per_gpu: 15,
        batch: 4,
    };
    let mut total = 0;
    loop {
        let n = s.prune_telemetry(keep).await.expect("prune");
        assert!(n <= 4, "a batch deletes at most its size: {n}");
        total += n;
        if n < 4 {
            break;
        }
    }
    // 10 too old on GPU 0, then 5 more beyond the 15 kept; GPU 1's five all stay.
    assert_eq!(total, 15);
    let g0 = s
        .telemetry_of_gpu("n1", 0, all_time())
        .await
        .expect("series");
    assert_eq!(
        g0.iter()
            .map(|x| (x.at.timestamp_millis() - base) / 1000)
            .collect::<Vec<_>>(),
        (15..30).collect::<Vec<_>>()
    );
    assert_eq!(
        s.telemetry_of_gpu("n1", 1, all_time())
            .await
            .expect("series")
            .len(),
        5
    );
    assert_eq!(s.prune_telemetry(keep).await.expect("prune"), 0);
}

async fn pending_reasons_are_counted(s: Backend) {
    submit(
        &s,
        vec![job(0, Some(1000), vec![], 1), job(1, Some(1000), vec![], 1)],
    )
    .await;
    let counts = s.pending_reason_counts().await.expect("counts");
    assert_eq!(counts, vec![("not_considered".to_string(), 2)]);
    // One node of one slot: one job runs, the other waits for a slot.
    let agent = register(&s, "n1", 1, None).await;
    assert_eq!(claim(&s, agent, 1).await.len(), 1);
    let counts = s.pending_reason_counts().await.expect("counts");
    assert_eq!(counts, vec![("no_free_slot".to_string(), 1)]);
}

/// The submitter is recorded on the experiment, each of its jobs and each attempt.
async fn runs_record_who_submitted_them(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    let exp = submit_as(&s, "alice", vec![job(0, Some(1000), vec![], 1)]).await;
    let other = submit_as(&s, "bob", vec![job(1, Some(1000), vec![], 1)]).await;
    assert_eq!(s.experiment(exp).await.expect("exp").submitted_by, "alice");
    let listed = s.list_experiments().await.expect("list");
    let by: Vec<(ExperimentId, &str)> = listed
        .iter()
        .map(|e| (e.id, e.submitted_by.as_str()))
        .collect();
    assert!(
        by.contains(&(exp, "alice")) && by.contains(&(other, "bob")),
        "{by:?}"
    );
    let jobs = s
        .list_jobs(JobFilter {
            experiment: Some(exp),
            ..Default::default()
        })
        .await
        .expect("jobs");
    assert_eq!(jobs[0].submitted_by, "alice");
    let leases = claim(&s, agent, 1).await;
    assert_eq!(leases.len(), 1, "one GPU, one slot");
    let attempt = s.attempt(leases[0].attempt).await.expect("attempt");
    let owner = if leases[0].job == jobs[0].id {
        "alice"
    } else {
        "bob"
    };
    assert_eq!(attempt.submitted_by, owner);
    let detail = s.job(leases[0].job).await.expect("job");
    assert_eq!(detail.summary.submitted_by, owner);
    assert_eq!(detail.attempts_detail[0].submitted_by, owner);
}

/// `exclusive` / `cooldown` travel with the job into its lease, an exclusive attempt holds
/// its GPU alone whatever the plan, the waiting reason a heartbeat carries shows while the
/// job has not started, and the wait's figures are stored with the attempt's end.
async fn exclusive_jobs_hold_their_gpu_and_record_their_wait(s: Backend) {
    use headroom_shared::prestart::{Cooldown, OnCooldownTimeout, Prestart, PrestartReport};
    let rules = Prestart {
        exclusive: true,
        cooldown: Some(Cooldown::UntilTemp {
            temp_c: 40.0,
            max_wait_ms: 60_000,
            on_timeout: OnCooldownTimeout::Fail,
        }),
    };
    let agent = register(&s, "n1", 1, Some("4")).await;
    let mut alone = job(0, Some(1000), vec![], 1);
    alone.prestart = Some(rules.clone());
    submit(&s, vec![alone]).await;
    submit(&s, vec![job(1, Some(1000), vec![], 1)]).await;
    let leases = claim(&s, agent, 1).await;
    assert_eq!(
        leases.len(),
        1,
        "nothing joins the exclusive job: {leases:?}"
    );
    let l = &leases[0];
    assert_eq!(l.prestart.as_ref(), Some(&rules));
    assert_eq!(
        s.job(l.job).await.expect("job").prestart.as_ref(),
        Some(&rules)
    );
    assert!(claim(&s, agent, 1).await.is_empty(), "its GPU stays alone");
    let waiting = "cooling: 52 °C → 40 °C".to_string();
    renew(
        &s,
        agent,
        vec![AttemptRef {
            attempt: l.attempt,
            fence: l.fence,
            waiting: Some(waiting.clone()),
        }],
        free(1, 10_000),
    )
    .await
    .expect("renew");
    assert_eq!(
        s.attempt(l.attempt).await.expect("attempt").waiting,
        Some(waiting)
    );
    s.start_attempt(l.attempt, l.fence, 42, Utc::now().timestamp_millis())
        .await
        .expect("start");
    assert_eq!(s.attempt(l.attempt).await.expect("attempt").waiting, None);
    let wait = PrestartReport {
        exclusive_wait_ms: Some(1200),
        cooldown_wait_ms: Some(30_500),
        cooldown_from_temp_c: Some(52.25),
        cooldown_start_temp_c: Some(39.5),
        cooldown_timed_out: Some(false),
    };
    finish_attempt(
        &s,
        l.attempt,
        FinishReport {
            prestart: Some(wait.clone()),
            ..report(l.fence, None)
        },
    )
    .await
    .expect("finish");
    let a = s.attempt(l.attempt).await.expect("attempt");
    assert_eq!(
        (
            a.exclusive_wait_ms,
            a.cooldown_wait_ms,
            a.cooldown_from_temp_c,
            a.cooldown_start_temp_c,
            a.cooldown_timed_out
        ),
        (
            wait.exclusive_wait_ms,
            wait.cooldown_wait_ms,
            wait.cooldown_from_temp_c,
            wait.cooldown_start_temp_c,
            wait.cooldown_timed_out
        )
    );
    // Its GPU is free again: the ordinary job goes there, with no rules to wait for.
    let next = claim(&s, agent, 1).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].prestart, None);
    assert_eq!(s.job(next[0].job).await.expect("job").prestart, None);
}

/// Jobs of one experiment keep their own exclusive/cooldown rules (PostgreSQL once stored the
/// first job's for all of them).
async fn prestart_is_stored_per_job(s: Backend) {
    use headroom_shared::prestart::Prestart;
    let alone = Prestart {
        exclusive: true,
        cooldown: None,
    };
    let mut first = job(0, Some(10), vec![], 1);
    first.prestart = Some(alone.clone());
    let second = job(1, Some(10), vec![], 1);
    let (a, b) = (first.id, second.id);
    submit(&s, vec![first, second]).await;
    assert_eq!(s.job(a).await.expect("job").prestart, Some(alone));
    assert_eq!(s.job(b).await.expect("job").prestart, None);
}

/// More waiting jobs than one claim's window holds (at most 512), so racing claims on PostgreSQL each find
/// rows of their own (`SKIP LOCKED`): only the node's lock keeps them from overfilling it.
const BEYOND_CLAIM_WINDOW: u32 = 600;

/// A claim as a long-poll waking makes it: by the node's stored samples, writing nothing to
/// the node's row (so only the node's lock orders it against another claim).
async fn claim_by_stored_samples(s: &Backend, agent: AgentId) -> Vec<Lease> {
    claim_with(s, agent, None, 64).await
}

/// Stores the node's samples without leasing anything.
async fn store_samples(s: &Backend, agent: AgentId, n: u32) {
    claim_with(s, agent, Some(free(n, 10_000)), 0).await;
}

/// Claims for one node serialize on the node: claims racing for it never lease more than
/// its plan holds.
async fn concurrent_claims_for_one_node_never_overfill_it(s: Backend) {
    let agent = register(&s, "n1", 1, Some("3")).await;
    let jobs = (0..BEYOND_CLAIM_WINDOW).map(|i| job(i, Some(10), vec![], 1));
    submit(&s, jobs.collect()).await;
    store_samples(&s, agent, 1).await;
    let claims = (0..8).map(|_| claim_by_stored_samples(&s, agent));
    let leased: usize = futures::future::join_all(claims)
        .await
        .iter()
        .map(Vec::len)
        .sum();
    assert_eq!(
        leased, 3,
        "a plan of 3 holds 3 leases, however many claims race"
    );
    let counts = s.counts(None).await.expect("counts");
    assert_eq!(
        (counts.leased, counts.queued),
        (3, u64::from(BEYOND_CLAIM_WINDOW) - 3)
    );
}

/// A job that fits starts however many jobs that fit nowhere wait ahead of it: the claim
/// reads the queue past its first window while the node could take more.
async fn a_job_that_fits_starts_behind_any_number_that_do_not(s: Backend) {
    let agent = register(&s, "n1", 1, Some("2")).await;
    let ahead = 2 * BEYOND_CLAIM_WINDOW;
    submit(
        &s,
        (0..ahead)
            .map(|i| job(i, Some(20_000), vec![], 1))
            .collect(),
    )
    .await;
    let fits = submit(&s, vec![job(0, Some(1_000), vec![], 1)]).await;
    let leases = claim(&s, agent, 1).await;
    assert_eq!(
        leases.len(),
        1,
        "the 1 GiB job starts on the idle 10 GiB GPU"
    );
    let job = s.job(leases[0].job).await.expect("job");
    assert_eq!(job.summary.experiment, fits);
    let counts = s.counts(None).await.expect("counts");
    assert_eq!((counts.leased, counts.queued), (1, u64::from(ahead)));
    // The ones ahead say why they wait.
    let waiting = s
        .list_jobs(JobFilter {
            state: Some(JobState::Queued),
            ..Default::default()
        })
        .await
        .expect("jobs");
    let last = waiting.last().expect("a waiting job");
    assert!(
        matches!(
            last.pending_reason,
            Some(PendingReason::LargerThanEveryGpu { .. })
        ),
        "{:?}",
        last.pending_reason
    );
}

/// Job lists filter by experiment and state, keep submission order, and stop at the limit.
async fn jobs_are_listed_by_experiment_state_and_limit(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    let first = submit(&s, (0..3).map(|i| job(i, Some(10), vec![], 1)).collect()).await;
    let second = submit(&s, (0..4).map(|i| job(i, Some(10), vec![], 1)).collect()).await;
    let leased = claim(&s, agent, 1).await.remove(0);
    let list = |experiment, state, limit| {
        let s = s.clone();
        async move {
            s.list_jobs(JobFilter {
                experiment,
                state,
                limit,
                ..Default::default()
            })
            .await
            .expect("jobs")
        }
    };
    assert_eq!(list(None, None, None).await.len(), 7);
    let of_second = list(Some(second), None, None).await;
    assert_eq!(of_second.len(), 4);
    assert!(of_second.iter().all(|j| j.experiment == second));
    let indices: Vec<u32> = of_second.iter().map(|j| j.index).collect();
    assert_eq!(indices, vec![0, 1, 2, 3], "in submission order");
    let two = list(Some(second), None, Some(2)).await;
    assert_eq!(
        two.iter().map(|j| j.id).collect::<Vec<_>>(),
        [of_second[0].id, of_second[1].id]
    );
    assert_eq!(list(None, None, Some(5)).await.len(), 5);
    let leased_jobs = list(None, Some(JobState::Leased), None).await;
    assert_eq!(leased_jobs.len(), 1);
    assert_eq!(leased_jobs[0].id, leased.job);
    assert_eq!(
        leased_jobs[0].experiment, first,
        "the oldest job is leased first"
    );
    assert_eq!(
        list(Some(second), Some(JobState::Queued), Some(3))
            .await
            .len(),
        3
    );
    // A short id, as git takes one: a prefix names the jobs whose id starts with it, and an
    // experiment's index names its job.
    let target = of_second[2].id.to_string();
    let by_prefix = |p: String| {
        let s = s.clone();
        async move {
            s.list_jobs(JobFilter {
                id_prefix: Some(p),
                limit: Some(2),
                ..Default::default()
            })
            .await
            .expect("jobs")
        }
    };
    let found = by_prefix(target.clone()).await;
    assert_eq!(
        found.iter().map(|j| j.id).collect::<Vec<_>>(),
        [of_second[2].id]
    );
    // Ids of one experiment share their first characters: a short prefix matches several.
    assert_eq!(by_prefix(target[..4].to_string()).await.len(), 2);
    assert!(by_prefix("ffffffff-ffff".to_string()).await.is_empty());
    let third = s
        .list_jobs(JobFilter {
            experiment: Some(second),
            index: Some(3),
            ..Default::default()
        })
        .await
        .expect("jobs");
    assert_eq!(third.iter().map(|j| j.index).collect::<Vec<_>>(), [3]);
}

/// Where an experiment's jobs run from is kept with it, read back by the experiment, given
/// to each lease and written in the export; code bundles are kept once per hash.
async fn an_experiment_s_source_reaches_its_leases_and_bundles_are_kept_by_hash(s: Backend) {
    use headroom_shared::api::source::{Environment, EnvironmentFrom, GitState, Snapshot, Source};
    let source = Source {
        workdir: Some("/home/alice/proj".into()),
        git: Some(GitState {
            commit: "a".repeat(40),
            branch: Some("main".into()),
            dirty: true,
            diff_hash: Some("b".repeat(64)),
        }),
        snapshot: Some(Snapshot {
            hash: "c".repeat(64),
            subdir: "train".into(),
            bytes: 3,
        }),
        environment: Some(Environment::Venv("/home/alice/proj/.venv".into())),
        environment_from: Some(EnvironmentFrom::Submitter),
    };
    let id = ExperimentId::new();
    s.create_experiment(NewExperiment {
        host_memory_mib: None,
        checkpoint: None,
        preemptible: false,
        memory_cap_off: false,
        memory_phases: None,
        id,
        name: "exp".into(),
        seed: 1,
        spec: serde_json::json!({}),
        jobs: vec![job(0, Some(1000), vec![], 1)],
        submitted_by: "anonymous".into(),
        source: Some(source.clone()),
        results: None,
        study: None,
        max_concurrent: None,
    })
    .await
    .expect("create experiment");
    assert_eq!(s.experiment(id).await.expect("experiment").source, source);
    let agent = register(&s, "n1", 1, None).await;
    let leases = claim(&s, agent, 1).await;
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].source.as_ref(), Some(&source));
    let rows = s.export_rows(Some(id)).await.expect("export");
    assert_eq!(rows[0].source.as_deref(), Some(&source));
    // A node fetches the code of its own live attempts only.
    let leased = |hash: String, node: &str| s.bundle_leased_to(hash, node.into());
    assert!(leased("c".repeat(64), "n1").await.expect("leased"));
    assert!(!leased("c".repeat(64), "n2").await.expect("other node"));
    assert!(!leased("e".repeat(64), "n1").await.expect("other bundle"));

    let hash = "d".repeat(64);
    let size = |by: Option<&str>| s.bundle_size(hash.clone(), by.map(str::to_string));
    assert_eq!(size(None).await.expect("size"), None);
    assert!(
        s.put_bundle(hash.clone(), b"abc".to_vec(), "alice".into())
            .await
            .expect("put")
    );
    // Kept once; each uploader may name it, no one else.
    assert_eq!(size(Some("bob")).await.expect("bob's"), None);
    assert!(
        !s.put_bundle(hash.clone(), b"abc".to_vec(), "bob".into())
            .await
            .expect("again")
    );
    assert_eq!(size(None).await.expect("size"), Some(3));
    assert_eq!(size(Some("alice")).await.expect("alice's"), Some(3));
    assert_eq!(size(Some("bob")).await.expect("bob's"), Some(3));
    assert_eq!(size(Some("carol")).await.expect("carol's"), None);
    assert_eq!(s.bundle(hash).await.expect("bundle"), Some(b"abc".to_vec()));
}

/// Attempt logs live in the store: chunks resent by an agent and its supervisor are kept
/// once, whoever sends them first (concurrently too); a chunk past the end is refused naming
/// the offset; reads go by offset across chunks; past the bound, the log keeps its first
/// bytes and a line saying it was cut, and the sender is told it was all taken.
async fn attempt_logs_are_kept_once_by_offset_and_to_their_bound(s: Backend) {
    let a = AttemptId::new();
    assert_eq!(
        s.append_log(a, 0, b"hello ".to_vec(), 1000)
            .await
            .expect("append"),
        6
    );
    assert_eq!(
        s.append_log(a, 0, b"hello ".to_vec(), 1000)
            .await
            .expect("resent"),
        6
    );
    assert_eq!(
        s.append_log(a, 3, b"lo world".to_vec(), 1000)
            .await
            .expect("overlap"),
        11
    );
    assert_eq!(s.read_log(a, 0, 100).await.expect("read"), b"hello world");
    assert_eq!(s.read_log(a, 6, 3).await.expect("read"), b"wor");
    assert_eq!(s.read_log(a, 4, 4).await.expect("across chunks"), b"o wo");
    assert!(
        s.read_log(a, 11, 10)
            .await
            .expect("past the end")
            .is_empty()
    );
    assert!(matches!(
        s.append_log(a, 50, b"x".to_vec(), 1000).await,
        Err(StoreError::Invalid { ref field, .. }) if field == "offset"
    ));
    assert!(
        s.read_log(AttemptId::new(), 0, 10)
            .await
            .expect("none")
            .is_empty()
    );

    // An agent and its supervisor ship the same bytes at once: kept once.
    let b = AttemptId::new();
    let chunk: Vec<u8> = (0..200u8).collect();
    let (x, y) = tokio::join!(
        s.append_log(b, 0, chunk.clone(), 1000),
        s.append_log(b, 0, chunk.clone(), 1000)
    );
    assert_eq!((x.expect("one"), y.expect("other")), (200, 200));
    assert_eq!(s.read_log(b, 0, 1000).await.expect("read"), chunk);

    // Kept to 10 bytes of output, then the line; what comes after is taken and dropped.
    let c = AttemptId::new();
    s.append_log(c, 0, b"0123456".to_vec(), 10)
        .await
        .expect("append");
    assert_eq!(
        s.append_log(c, 7, b"789abcdef".to_vec(), 10)
            .await
            .expect("cut"),
        16
    );
    let kept = String::from_utf8(s.read_log(c, 0, 1000).await.expect("read")).expect("text");
    assert!(
        kept.starts_with("0123456789\n[headroom: this log is cut here, at 10 B"),
        "{kept}"
    );
    assert_eq!(
        s.append_log(c, 16, vec![b'x'; 5000], 10)
            .await
            .expect("dropped"),
        5016
    );
    let again = String::from_utf8(s.read_log(c, 0, 10_000).await.expect("read")).expect("text");
    assert_eq!(again, kept);
}

/// `max_concurrent`: claims for two nodes never lease more of an experiment than its cap
/// between them, the others say why, and an end makes room for one more.
async fn an_experiment_s_cap_holds_across_nodes(s: Backend) {
    let a = register(&s, "n1", 2, Some("8,8")).await;
    let b = register(&s, "n2", 2, Some("8,8")).await;
    let capped = NewExperiment {
        host_memory_mib: None,
        checkpoint: None,
        preemptible: false,
        memory_cap_off: false,
        memory_phases: None,
        max_concurrent: Some(2),
        ..experiment(
            "capped",
            (0..5).map(|i| job(i, Some(1000), vec![], 1)).collect(),
        )
    };
    let exp = capped.id;
    s.create_experiment(capped)
        .await
        .expect("create experiment");
    let first = claim(&s, a, 2).await;
    let second = claim(&s, b, 2).await;
    assert_eq!(first.len() + second.len(), 2, "{first:?} {second:?}");
    let waiting = queued_of(&s, exp).await;
    assert_eq!(waiting.len(), 3);
    for j in &waiting {
        assert_eq!(
            j.pending_reason.as_ref().map(|r| r.to_string()).as_deref(),
            Some("its experiment's max_concurrent: 2 of at most 2 leased or running"),
            "{j:?}"
        );
    }
    let l = first.into_iter().chain(second).next().expect("a lease");
    s.start_attempt(l.attempt, l.fence, 1, 0)
        .await
        .expect("start");
    finish_attempt(&s, l.attempt, report(l.fence, None))
        .await
        .expect("finish");
    let third = claim(&s, b, 2).await;
    assert_eq!(third.len(), 1, "one more once one ended");
    // Claims of both nodes at the same moment: still no more than the cap between them.
    for round in 0..4 {
        let race = NewExperiment {
            host_memory_mib: None,
            checkpoint: None,
            preemptible: false,
            memory_cap_off: false,
            memory_phases: None,
            max_concurrent: Some(3),
            ..experiment(
                &format!("race{round}"),
                (0..10).map(|i| job(i, Some(100), vec![], 1)).collect(),
            )
        };
        let exp = race.id;
        s.create_experiment(race).await.expect("create experiment");
        let leased = || async {
            s.list_jobs(JobFilter {
                experiment: Some(exp),
                state: Some(JobState::Leased),
                ..JobFilter::default()
            })
            .await
            .expect("jobs")
            .len()
        };
        let (x, y) = tokio::join!(claim(&s, a, 4), claim(&s, b, 4));
        // Each may skip the jobs the other holds locked: at most the cap, never past it.
        assert!(
            leased().await <= 3,
            "round {round}: {} + {}",
            x.len(),
            y.len()
        );
        claim(&s, a, 4).await;
        claim(&s, b, 4).await;
        assert_eq!(
            leased().await,
            3,
            "round {round}: filled to its cap, not past it"
        );
    }
}

/// The experiment's queued jobs, in order.
async fn queued_of(s: &Backend, exp: ExperimentId) -> Vec<JobSummary> {
    s.list_jobs(JobFilter {
        experiment: Some(exp),
        state: Some(JobState::Queued),
        ..JobFilter::default()
    })
    .await
    .expect("jobs")
}

/// Runs a lease's job for `hours` (started that long ago, ended now).
async fn run_for(s: &Backend, l: &Lease, hours: i64) {
    let started = now_ms() - hours * 3_600_000;
    s.start_attempt(l.attempt, l.fence, 1, started)
        .await
        .expect("start");
    finish_attempt(s, l.attempt, report(l.fence, None))
        .await
        .expect("finish");
}

/// A round of the usage charge takes every ended run it reads, once: three runs ended, three
/// charged in one round to their users' ledgers, none in the next.
async fn ended_runs_are_charged_once_in_one_round(s: Backend) {
    const H: u64 = 7 * 24 * 3_600_000;
    let n1 = register(&s, "n1", 1, Some("1")).await;
    submit_as(
        &s,
        "carol",
        (0..3).map(|i| job(i, Some(1000), vec![], 1)).collect(),
    )
    .await;
    for _ in 0..3 {
        let l = claim(&s, n1, 1).await;
        assert_eq!(l.len(), 1);
        run_for(&s, &l[0], 1).await;
    }
    assert_eq!(s.charge_usage(H, 100).await.expect("charge"), 3);
    assert_eq!(s.charge_usage(H, 100).await.expect("again"), 0);
    let used = s
        .share_standings(H)
        .await
        .expect("standings")
        .into_iter()
        .find(|u| u.user == "carol")
        .expect("carol")
        .used_gib_hours;
    // Three runs of 1000 MiB for an hour each, decayed by minutes of a week's half-life.
    assert!((2.9..=3.0).contains(&used), "{used}");
}

/// Sets a user's share and caps (the user made if new).
async fn limit(s: &Backend, user: &str, limits: UserLimits) {
    s.put_user(UserView {
        name: user.into(),
        role: Role::User,
        unix_user: None,
        allow_root: false,
        limits,
        created_at: Utc::now(),
    })
    .await
    .expect("put user");
}

/// Fair share on both stores: the user who has used less GPU memory-time per unit of share
/// goes first whoever submitted first, a job held back says why with the figures, ended runs
/// are charged to the ledger once, and a user's GPU cap is never passed.
async fn users_go_by_usage_per_share_and_their_caps_hold(s: Backend) {
    const H: u64 = 7 * 24 * 3_600_000;
    let n1 = register(&s, "n1", 1, Some("1")).await;
    let jobs = |n: u32| (0..n).map(|i| job(i, Some(1000), vec![], 1)).collect();
    let alice = submit_as(&s, "alice", jobs(6)).await;
    let bob = submit_as(&s, "bob", jobs(3)).await;
    let of = |exp: ExperimentId| {
        let s = s.clone();
        async move {
            s.list_jobs(JobFilter {
                experiment: Some(exp),
                ..JobFilter::default()
            })
            .await
            .expect("jobs")
            .into_iter()
            .map(|j| j.id)
            .collect::<Vec<_>>()
        }
    };
    let (alices, bobs) = (of(alice).await, of(bob).await);
    // Neither has used anything: the older submission goes first.
    let first = claim(&s, n1, 1).await;
    assert_eq!(first[0].job, alices[0]);
    run_for(&s, &first[0], 1).await;
    // Alice used 1000 MiB for an hour, Bob nothing: Bob's later jobs go first now.
    let second = claim(&s, n1, 1).await;
    assert_eq!(second[0].job, bobs[0], "the user who used less goes first");
    let waiting = queued_of(&s, alice).await;
    let reason = waiting[0].pending_reason.clone().expect("a reason");
    assert!(
        matches!(&reason, PendingReason::FairShare { user, ahead, used_mib_h: 1000, share: 1, .. }
            if user == "alice" && ahead == "bob"),
        "{reason:?}"
    );
    assert!(reason.to_string().contains("bob"), "{reason}");
    // Ended runs are charged once, whichever replica's task gets there.
    assert_eq!(s.charge_usage(H, 100).await.expect("charge"), 1);
    assert_eq!(s.charge_usage(H, 100).await.expect("charge"), 0);
    let standings = s.share_standings(H).await.expect("standings");
    let alice_used = standings
        .iter()
        .find(|u| u.user == "alice")
        .expect("alice")
        .used_gib_hours;
    assert!((alice_used - 1000.0 / 1024.0).abs() < 0.01, "{standings:?}");
    // Bob runs two hours: 2000 MiB-h against Alice's 1000, so Alice goes first again.
    run_for(&s, &second[0], 2).await;
    let third = claim(&s, n1, 1).await;
    assert_eq!(third[0].job, alices[1]);
    run_for(&s, &third[0], 2).await;
    // 3000 (Alice) against 2000 (Bob): Bob. With a share of 2 Bob stays first at 4000
    // against 3000 (2000 per share).
    limit(
        &s,
        "bob",
        UserLimits {
            share: 2,
            ..Default::default()
        },
    )
    .await;
    let fourth = claim(&s, n1, 1).await;
    assert_eq!(fourth[0].job, bobs[1]);
    run_for(&s, &fourth[0], 2).await;
    let fifth = claim(&s, n1, 1).await;
    assert_eq!(fifth[0].job, bobs[2], "share 2: 4000 / 2 < 3000");
    run_for(&s, &fifth[0], 0).await;
    // Caps: Alice may hold 2 GPUs; a node with four free slots gives her two.
    limit(
        &s,
        "alice",
        UserLimits {
            max_gpus: Some(2),
            ..Default::default()
        },
    )
    .await;
    let n2 = register(&s, "n2", 2, Some("2,2")).await;
    let capped = claim(&s, n2, 4).await;
    assert_eq!(capped.len(), 2, "{capped:?}");
    assert_eq!(claim(&s, n1, 1).await.len(), 0, "not a third, on any node");
    let waiting = queued_of(&s, alice).await;
    assert_eq!(waiting.len(), 2);
    for j in waiting {
        assert_eq!(
            j.pending_reason.map(|r| r.to_string()).as_deref(),
            Some("alice's cap: holds 2 GPUs, at most 2"),
        );
    }
    // One ends: one more starts, still two.
    run_for(&s, &capped[0], 0).await;
    assert_eq!(claim(&s, n2, 4).await.len(), 1);
    let held = s.share_standings(H).await.expect("standings");
    let alice_now = held.iter().find(|u| u.user == "alice").expect("alice");
    assert_eq!((alice_now.running_jobs, alice_now.running_gpus), (2, 2));
}

/// Preemption on both stores: with a `preemptible` experiment holding the GPU and another
/// user, under their share, waiting for memory, a round asks the fewest of its attempts to
/// stop after their checkpoint signal (one here), the next round asks no more while that
/// memory is on its way, the agent hears it at its heartbeat, and the stopped attempt's job
/// goes back to the queue spending no attempt; the waiting job starts first, and the
/// requeued one is told why and is not preempted again within the interval.
async fn a_preemptible_job_makes_room_for_a_user_under_their_share(s: Backend) {
    use headroom_coordinator::store::PreemptInput;
    use headroom_shared::checkpoint::{Checkpoint, Requeue};
    let round = PreemptInput {
        half_life_ms: headroom_coordinator::fair::DEFAULT_HALF_LIFE_MS,
        interval_ms: 3_600_000,
    };
    // Alice hears of her job's preemption with the round that asks it.
    s.subscribe(subscription("alice", &[AlertKind::JobPreempted], false))
        .await
        .expect("subscribe");
    let n1 = register(&s, "n1", 1, Some("2")).await;
    let checkpoint = Checkpoint {
        signal: "USR1".into(),
        lead_ms: 120_000,
    };
    let alices = NewExperiment {
        submitted_by: "alice".into(),
        preemptible: true,
        memory_cap_off: false,
        memory_phases: None,
        checkpoint: Some(checkpoint.clone()),
        ..experiment(
            "alice",
            (0..2).map(|i| job(i, Some(4500), vec![], 1)).collect(),
        )
    };
    s.create_experiment(alices).await.expect("create");
    let held = claim(&s, n1, 1).await;
    assert_eq!(held.len(), 2, "two slots, 9000 MiB usable: both of Alice's");
    assert_eq!(held[0].checkpoint.as_ref(), Some(&checkpoint));
    for l in &held {
        s.start_attempt(l.attempt, l.fence, 1, now_ms() - 3_600_000)
            .await
            .expect("start");
    }
    assert!(
        s.preempt(round).await.expect("round").is_empty(),
        "nobody waits"
    );

    let bob = submit_as(&s, "bob", vec![job(0, Some(4000), vec![], 1)]).await;
    assert!(claim(&s, n1, 1).await.is_empty(), "no slot is free");
    let waiting = queued_of(&s, bob).await;
    assert_eq!(waiting[0].pending_reason, Some(PendingReason::NoFreeSlot));
    // Two replicas' rounds at once: one makes room, the other finds it on its way.
    let (one, two) = tokio::join!(s.preempt(round), s.preempt(round));
    let mut preempted = one.expect("round");
    preempted.extend(two.expect("round"));
    assert_eq!(
        preempted.len(),
        1,
        "one of Alice's makes room: {preempted:?}"
    );
    assert_eq!(preempted[0].for_job, waiting[0].id.to_string());
    assert!(
        s.preempt(round).await.expect("round").is_empty(),
        "room is on its way"
    );
    assert_eq!(
        delivered_kinds(&s, "alice").await,
        vec![AlertKind::JobPreempted],
        "told once"
    );
    let victim = held
        .iter()
        .find(|l| l.attempt.to_string() == preempted[0].attempt)
        .expect("one of Alice's");
    let refs = presented(&held);
    let heard = renew(&s, n1, refs, free(1, 10_000)).await.expect("renew");
    assert!(heard.cancel.is_empty());
    assert_eq!(heard.requeue.len(), 1);
    assert_eq!(
        (heard.requeue[0].attempt, heard.requeue[0].why),
        (victim.attempt, Requeue::Preempted)
    );
    // It saved and stopped: back in the queue although it had used its one attempt.
    let after = finish_attempt(
        &s,
        victim.attempt,
        report(victim.fence, Some(FailureClass::Preempted)),
    )
    .await
    .expect("finish");
    assert_eq!(after, JobState::Retrying);
    // Bob's job goes first; Alice's goes when there is room again, told why it restarts.
    let next = claim(&s, n1, 1).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].job, waiting[0].id);
    run_for(&s, &next[0], 0).await;
    let again = claim(&s, n1, 1).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].job, victim.job);
    assert_eq!(
        (again[0].number, again[0].previous_end),
        (2, Some(FailureClass::Preempted))
    );
    s.start_attempt(again[0].attempt, again[0].fence, 1, now_ms())
        .await
        .expect("start");
    // Bob waits again: Alice's other job is preempted, not the one preempted within the hour.
    let bob2 = submit_as(&s, "bob", vec![job(0, Some(4000), vec![], 1)]).await;
    assert!(claim(&s, n1, 1).await.is_empty());
    assert_eq!(queued_of(&s, bob2).await.len(), 1);
    let preempted = s.preempt(round).await.expect("round");
    assert_eq!(preempted.len(), 1, "{preempted:?}");
    assert_ne!(preempted[0].job, victim.job.to_string());

    // `cancel --requeue`: only a running job's attempt is asked; a queued one is left alone.
    assert_eq!(s.requeue_job(again[0].job).await.expect("requeue"), 1);
    assert_eq!(s.requeue_job(waiting[0].id).await.expect("ended job"), 0);
    // An end claiming a requeue nobody asked for is taken as lost.
    assert_eq!(
        finish_attempt(
            &s,
            again[0].attempt,
            report(again[0].fence, Some(FailureClass::Preempted))
        )
        .await
        .expect("finish"),
        JobState::Failed,
        "asked to requeue, not preempted: lost, and its one attempt is spent"
    );
}

/// Host memory on both stores: a node's memory for jobs admits jobs by their declared host
/// memory (two of 3 GiB in 8 GiB, the third waits saying so), their leases carry it as their
/// cgroups' limit, and a run that peaked higher raises the next one's.
async fn host_memory_is_admitted_on_the_node_and_learned_from_runs(s: Backend) {
    let agent = AgentId::new();
    s.register_agent(Registration {
        host_memory_mib: Some(8 * 1024),
        agent,
        node: "n1".into(),
        gpus: gpus(1, 10_000),
        plan: Some(Plan::parse("4").expect("plan")),
        headroom: None,
        resume: vec![],
        lease_ttl_ms: 30_000,
        previous: None,
    })
    .await
    .expect("register");
    let exp = NewExperiment {
        host_memory_mib: Some(3 * 1024),
        checkpoint: None,
        preemptible: false,
        memory_cap_off: false,
        memory_phases: None,
        ..experiment(
            "hostmem",
            (0..3).map(|i| job(i, Some(1000), vec![], 1)).collect(),
        )
    };
    let id = exp.id;
    s.create_experiment(exp).await.expect("create experiment");
    let first = claim(&s, agent, 1).await;
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(first.iter().all(|l| l.host_memory_mib == Some(3 * 1024)));
    let waiting = queued_of(&s, id).await;
    assert_eq!(
        waiting[0].pending_reason,
        Some(PendingReason::NotEnoughHostMemory {
            needed_mib: 3 * 1024,
            available_mib: 2 * 1024
        })
    );
    // One run peaked at 4000 MiB: the next is admitted with (and limited to) 4400.
    s.start_attempt(first[0].attempt, first[0].fence, 1, now_ms())
        .await
        .expect("start");
    let peaked = FinishReport {
        host_peak_mib: Some(4000),
        ..report(first[0].fence, None)
    };
    finish_attempt(&s, first[0].attempt, peaked)
        .await
        .expect("finish");
    let next = claim(&s, agent, 1).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].host_memory_mib, Some(4400));
}

/// Settles every note of a changed job that others wait for, as the coordinator's task does.
async fn settle_all(s: &Backend) {
    loop {
        let due = s.wait_changes_due(64).await.expect("due");
        if due.is_empty() {
            return;
        }
        for (job, ids) in due {
            s.settle_waits(job, ids).await.expect("settle");
        }
    }
}

/// A study's waits (`after`): a job waiting for another is never claimed until it has
/// succeeded, says what it waits for, is cancelled with it (and its own waiting job after
/// it) when it fails, and `retry_cascade` runs the chain again in order.
async fn a_study_s_jobs_wait_for_theirs_and_a_failure_cancels_only_its_chain(s: Backend) {
    use headroom_coordinator::store::NewDependency;
    use headroom_shared::study::{AfterWhen, OnDependencyFailure};
    let agent = register(&s, "n1", 2, Some("4,4")).await;
    let study = headroom_coordinator::store::StudyOf {
        id: headroom_shared::StudyId::new(),
        name: "lab".into(),
    };
    let exp = |name: &str, jobs: Vec<NewJob>| NewExperiment {
        host_memory_mib: None,
        checkpoint: None,
        preemptible: false,
        memory_cap_off: false,
        memory_phases: None,
        study: Some(study.clone()),
        ..experiment(&format!("lab.{name}"), jobs)
    };
    let train = exp(
        "train",
        (0..2).map(|i| job(i, Some(1000), vec![], 1)).collect(),
    );
    let eval = exp(
        "eval",
        (0..2).map(|i| job(i, Some(1000), vec![], 1)).collect(),
    );
    let report_ = exp(
        "report",
        (0..2).map(|i| job(i, Some(1000), vec![], 1)).collect(),
    );
    let wait = |job: &NewJob, needs: &NewJob| NewDependency {
        job: job.id,
        needs: needs.id,
        when: AfterWhen::Succeeded,
        on_failure: OnDependencyFailure::Cancel,
    };
    let waits = (0..2)
        .flat_map(|i| {
            [
                wait(&eval.jobs[i], &train.jobs[i]),
                wait(&report_.jobs[i], &eval.jobs[i]),
            ]
        })
        .collect();
    let (t, e, r) = (
        [train.jobs[0].id, train.jobs[1].id],
        [eval.jobs[0].id, eval.jobs[1].id],
        [report_.jobs[0].id, report_.jobs[1].id],
    );
    let stored = s
        .create_study(vec![train, eval, report_], waits)
        .await
        .expect("study");
    assert_eq!(stored.len(), 3);
    assert!(
        stored
            .iter()
            .all(|x| x.study.as_ref().map(|st| &st.id) == Some(&study.id))
    );
    // Only the training is claimed; the rest says what it waits for.
    let leases = claim(&s, agent, 2).await;
    let mut claimed: Vec<JobId> = leases.iter().map(|l| l.job).collect();
    claimed.sort();
    let mut want = t.to_vec();
    want.sort();
    assert_eq!(claimed, want);
    let eval0 = s.job(e[0]).await.expect("job");
    assert_eq!(
        eval0
            .summary
            .pending_reason
            .map(|r| r.to_string())
            .as_deref(),
        Some("waits for 1 job of `lab.train` to succeed")
    );
    // Training 0 succeeds, training 1 fails: eval 0 is free, eval 1 and report 1 cancelled.
    let by_job = |j: JobId| leases.iter().find(|l| l.job == j).expect("lease").clone();
    for (j, end) in [(t[0], None), (t[1], Some(FailureClass::Nonzero))] {
        let l = by_job(j);
        s.start_attempt(l.attempt, l.fence, 1, 0)
            .await
            .expect("start");
        finish_attempt(&s, l.attempt, report(l.fence, end))
            .await
            .expect("finish");
    }
    // An end locks no other job: the jobs waiting for it move once its note is settled.
    assert_eq!(state(&s, e[1]).await, JobState::Queued, "not yet settled");
    assert!(
        claim(&s, agent, 2).await.is_empty(),
        "nothing is free before it is"
    );
    settle_all(&s).await;
    assert_eq!(state(&s, e[1]).await, JobState::Cancelled);
    assert_eq!(
        state(&s, r[1]).await,
        JobState::Cancelled,
        "and the chain below"
    );
    assert_eq!(state(&s, r[0]).await, JobState::Queued);
    let next = claim(&s, agent, 2).await;
    assert_eq!(next.iter().map(|l| l.job).collect::<Vec<_>>(), [e[0]]);
    // The chain again: training 1, then its eval and report, each waiting for the one before.
    let retried = s.retry_cascade(t[1]).await.expect("cascade");
    assert_eq!(retried, [t[1], e[1], r[1]]);
    assert_eq!(state(&s, e[1]).await, JobState::Retrying);
    let again = claim(&s, agent, 2).await;
    assert_eq!(
        again.iter().map(|l| l.job).collect::<Vec<_>>(),
        [t[1]],
        "eval 1 waits again"
    );
    // A job that has not ended is not retried.
    assert!(s.retry_cascade(e[1]).await.is_err());
}

fn subscription(owner: &str, on: &[AlertKind], lab_wide: bool) -> SubscriptionView {
    SubscriptionView {
        id: uuid::Uuid::new_v4().to_string(),
        owner: owner.into(),
        on: on.to_vec(),
        target: AlertTarget::Webhook {
            url: format!("http://127.0.0.1:9/{owner}"),
            format: WebhookFormat::Json,
        },
        lab_wide,
        created_at: Utc::now(),
    }
}

fn sweep_input(lost_after_ms: u64, pending_after_ms: Option<u64>) -> AlertSweep {
    AlertSweep {
        lost_after_ms,
        pending_after_ms,
        quarantine_after_ms: pending_after_ms,
        drift_after_ms: None,
        check_drift: false,
        failure_streak: 3,
        keep_ms: 86_400_000,
    }
}

/// The kinds of `owner`'s deliveries, sorted.
async fn delivered_kinds(s: &Backend, owner: &str) -> Vec<AlertKind> {
    let mut kinds: Vec<AlertKind> = s
        .alerts(Some(owner.into()), 100)
        .await
        .expect("alerts")
        .deliveries
        .iter()
        .map(|d| d.kind)
        .collect();
    kinds.sort();
    kinds
}

/// Events are kept with what tells of them (a quarantine with its end; an experiment's end
/// and failures in a row by the sweep, once, from the notes its jobs' ends left), each sent
/// to the subscriptions that want it; deliveries are claimed by one claimer at a time, tried
/// again when due, and kept as dead letters when given up.
async fn alerts_are_kept_with_what_they_tell_of_and_claimed_once(s: Backend) {
    use AlertKind as K;
    let ada = subscription("ada", &AlertKind::ALL, false);
    let bob = subscription("bob", &[K::ExperimentEnded, K::GpuQuarantined], false);
    let lab = subscription("root", &[K::ExperimentEnded], true);
    for sub in [&ada, &bob, &lab] {
        s.subscribe(sub.clone()).await.expect("subscribe");
    }
    let agent = register(&s, "n1", 4, Some("1,1,1,1")).await;
    let exp = submit_as(
        &s,
        "ada",
        (0..4).map(|i| job(i, Some(1000), vec![], 1)).collect(),
    )
    .await;
    let leases = claim(&s, agent, 4).await;
    assert_eq!(leases.len(), 4);
    // The first end leaves something on its GPU: the quarantine is told with it, to every
    // subscriber who asked (the lab's machines are everyone's).
    let mut r = report(leases[0].fence, Some(FailureClass::Nonzero));
    r.cleanup_verified = false;
    r.unverified = Some("pid 4242 still holds 5.5 GiB".into());
    finish_attempt(&s, leases[0].attempt, r)
        .await
        .expect("finish");
    assert_eq!(delivered_kinds(&s, "ada").await, vec![K::GpuQuarantined]);
    assert_eq!(delivered_kinds(&s, "bob").await, vec![K::GpuQuarantined]);
    assert!(delivered_kinds(&s, "root").await.is_empty());
    for l in &leases[1..3] {
        finish_attempt(&s, l.attempt, report(l.fence, Some(FailureClass::Nonzero)))
            .await
            .expect("finish");
    }
    // Three failures in a row: told by the sweep, once.
    s.alert_sweep(sweep_input(60_000, None))
        .await
        .expect("sweep");
    assert_eq!(
        delivered_kinds(&s, "ada").await,
        vec![K::FailuresInARow, K::GpuQuarantined]
    );
    finish_attempt(&s, leases[3].attempt, report(leases[3].fence, None))
        .await
        .expect("finish");
    for _ in 0..2 {
        s.alert_sweep(sweep_input(60_000, None))
            .await
            .expect("sweep");
    }
    assert_eq!(
        delivered_kinds(&s, "ada").await,
        vec![K::ExperimentEnded, K::FailuresInARow, K::GpuQuarantined],
        "the experiment's end is told once"
    );
    assert_eq!(
        delivered_kinds(&s, "bob").await,
        vec![K::GpuQuarantined],
        "not bob's jobs"
    );
    assert_eq!(
        delivered_kinds(&s, "root").await,
        vec![K::ExperimentEnded],
        "lab-wide"
    );
    let ended = s
        .alerts(Some("root".into()), 10)
        .await
        .expect("alerts")
        .deliveries
        .remove(0);
    assert!(
        ended.summary.contains("1 succeeded, 3 failed"),
        "{}",
        ended.summary
    );
    let row = s.delivery(ended.id.clone()).await.expect("delivery");
    assert_eq!(row.details["counts"]["failed"], 3);
    assert_eq!(row.target, lab.target);

    // Claimed by one claimer at a time: two claims share the five out between them (ada's
    // three, bob's and the lab's one each).
    let (a, b) = tokio::join!(s.claim_deliveries(60_000, 4), s.claim_deliveries(60_000, 4));
    let (a, b) = (a.expect("claim"), b.expect("claim"));
    let mut ids: Vec<&String> = a.iter().chain(&b).map(|(id, _)| id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), a.len() + b.len(), "claimed twice: {a:?} {b:?}");
    let mut rest = s.claim_deliveries(60_000, 16).await.expect("claim");
    assert_eq!(a.len() + b.len() + rest.len(), 5);
    assert!(
        s.claim_deliveries(60_000, 16)
            .await
            .expect("claim")
            .is_empty(),
        "held while claimed"
    );
    // A failed try comes back when due, its tries counted; given up, it is a dead letter.
    let (id, tries) = rest.pop().or_else(|| a.first().cloned()).expect("one");
    assert_eq!(tries, 1);
    let retry = DeliveryOutcome::Retry {
        error: "connection refused".into(),
        at: now_ms() - 1,
    };
    assert!(
        s.settle_delivery(id.clone(), 1, retry.clone())
            .await
            .expect("settle")
    );
    let again = s.claim_deliveries(60_000, 16).await.expect("claim");
    assert_eq!(again, vec![(id.clone(), 2)]);
    // The first try's claim ran out and another took it: what the first try says later is
    // not written over the second's.
    assert!(
        !s.settle_delivery(id.clone(), 1, DeliveryOutcome::Delivered)
            .await
            .expect("settle")
    );
    let dead = DeliveryOutcome::Dead {
        error: "given up".into(),
    };
    assert!(
        s.settle_delivery(id.clone(), 2, dead.clone())
            .await
            .expect("settle")
    );
    assert!(
        !s.settle_delivery(id.clone(), 2, retry)
            .await
            .expect("settle"),
        "settled once"
    );
    let all = s.alerts(None, 100).await.expect("alerts");
    assert_eq!(all.subscriptions.len(), 3);
    assert_eq!(all.deliveries[0].id, id, "dead letters first");
    assert_eq!(all.deliveries[0].state, DeliveryState::Dead);
    assert_eq!(all.deliveries[0].last_error.as_deref(), Some("given up"));

    // A retried experiment's next end is told again.
    s.retry_failed(exp).await.expect("retry");
    let more = claim(&s, agent, 4).await;
    assert_eq!(more.len(), 3, "GPU 0 is still quarantined, the rest run");
    for l in &more {
        finish_attempt(&s, l.attempt, report(l.fence, None))
            .await
            .expect("finish");
    }
    s.alert_sweep(sweep_input(60_000, None))
        .await
        .expect("sweep");
    let ends = delivered_kinds(&s, "root").await;
    assert_eq!(ends, vec![K::ExperimentEnded, K::ExperimentEnded]);

    // GPU 0's quarantine lasts: told again, once.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    for _ in 0..2 {
        s.alert_sweep(sweep_input(60_000, Some(1)))
            .await
            .expect("sweep");
    }
    let told = |kinds: Vec<AlertKind>| kinds.iter().filter(|k| **k == K::GpuQuarantined).count();
    assert_eq!(told(delivered_kinds(&s, "ada").await), 2);
    assert_eq!(told(delivered_kinds(&s, "bob").await), 2);

    // A job stopped by early stopping is told as pruned.
    submit_as(&s, "ada", vec![job(0, Some(1000), vec![], 1)]).await;
    let l = claim(&s, agent, 4).await.remove(0);
    finish_attempt(&s, l.attempt, report(l.fence, Some(FailureClass::Pruned)))
        .await
        .expect("finish");
    s.alert_sweep(sweep_input(60_000, None))
        .await
        .expect("sweep");
    assert!(delivered_kinds(&s, "ada").await.contains(&K::JobPruned));

    // A removed subscription takes its deliveries with it.
    s.unsubscribe(bob.id.clone()).await.expect("unsubscribe");
    assert!(delivered_kinds(&s, "bob").await.is_empty());
    assert!(matches!(
        s.unsubscribe(bob.id.clone()).await,
        Err(StoreError::NotFound { .. })
    ));
}

/// A node silent past the TTL is told lost once, and again after it came back and went
/// silent again; a job queued past the threshold is told once.
async fn lost_nodes_and_long_waits_are_told_once(s: Backend) {
    use AlertKind as K;
    s.subscribe(subscription("ada", &[K::NodeLost, K::JobPending], false))
        .await
        .expect("subscribe");
    let agent = register(&s, "n1", 1, Some("1")).await;
    submit_as(
        &s,
        "ada",
        (0..2).map(|i| job(i, Some(1000), vec![], 1)).collect(),
    )
    .await;
    submit_as(&s, "bob", vec![job(0, Some(1000), vec![], 1)]).await;
    s.alert_sweep(sweep_input(60_000, Some(60_000)))
        .await
        .expect("sweep");
    assert!(delivered_kinds(&s, "ada").await.is_empty(), "nothing yet");
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    for _ in 0..2 {
        s.alert_sweep(sweep_input(10, Some(10)))
            .await
            .expect("sweep");
    }
    assert_eq!(
        delivered_kinds(&s, "ada").await,
        vec![K::NodeLost, K::JobPending, K::JobPending],
        "ada's two jobs, not bob's; the node once"
    );
    // Heard of again, then silent again: lost again.
    renew(&s, agent, vec![], free(1, 10_000))
        .await
        .expect("heartbeat");
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    s.alert_sweep(sweep_input(10, Some(10)))
        .await
        .expect("sweep");
    assert_eq!(
        delivered_kinds(&s, "ada").await,
        vec![K::NodeLost, K::NodeLost, K::JobPending, K::JobPending]
    );
}

/// One GPU's samples with `used` MiB used, of 10,000.
fn used_of(used: u64) -> Vec<GpuSample> {
    let mut g = free(1, 10_000);
    g[0].used_mib = used;
    g[0].free_mib = 10_000 - used;
    g
}

/// A GPU whose use and the estimates placed on it part is shown drifting from the sweep that
/// sees it, told once when it has lasted, cleared when they agree again, and seen the other
/// way round too.
async fn a_gpu_s_drift_is_kept_told_once_when_it_lasts_and_cleared(s: Backend) {
    use headroom_shared::api::DriftDirection;
    s.subscribe(subscription("ada", &[AlertKind::GpuDrift], false))
        .await
        .expect("subscribe");
    let agent = register(&s, "n1", 1, Some("2")).await;
    submit(&s, vec![job(0, Some(3000), vec![], 1)]).await;
    let lease = claim_with(&s, agent, Some(used_of(0)), 4).await.remove(0);
    let sweep = |after: u64| AlertSweep {
        drift_after_ms: Some(after),
        check_drift: true,
        ..sweep_input(60_000, None)
    };
    let drift_of = |s: &Backend| {
        let s = s.clone();
        async move {
            s.list_nodes(60_000).await.expect("nodes")[0].gpus[0]
                .drift
                .clone()
        }
    };
    let at = |_: u32| AttemptRef {
        attempt: lease.attempt,
        fence: lease.fence,
        waiting: None,
    };
    // 3000 MiB placed, 7000 used: over, not yet lasting.
    renew(&s, agent, vec![at(0)], used_of(7000))
        .await
        .expect("heartbeat");
    s.alert_sweep(sweep(60_000)).await.expect("sweep");
    let d = drift_of(&s).await.expect("drifting");
    assert_eq!(
        (d.direction, d.gap_mib, d.lasting),
        (DriftDirection::Over, 4000, false)
    );
    assert!(delivered_kinds(&s, "ada").await.is_empty());
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    for _ in 0..2 {
        s.alert_sweep(sweep(5)).await.expect("sweep");
    }
    let lasting = drift_of(&s).await.expect("drifting");
    assert!(lasting.lasting && lasting.since == d.since, "{lasting:?}");
    assert_eq!(
        delivered_kinds(&s, "ada").await,
        vec![AlertKind::GpuDrift],
        "told once"
    );
    // Back within the tolerance: cleared.
    renew(&s, agent, vec![at(0)], used_of(3500))
        .await
        .expect("heartbeat");
    s.alert_sweep(sweep(5)).await.expect("sweep");
    assert_eq!(drift_of(&s).await, None);
    // Placed and idle: under.
    renew(&s, agent, vec![at(0)], used_of(100))
        .await
        .expect("heartbeat");
    s.alert_sweep(sweep(60_000)).await.expect("sweep");
    let under = drift_of(&s).await.expect("drifting");
    assert_eq!(
        (under.direction, under.gap_mib),
        (DriftDirection::Under, 2900)
    );
    // Not looked at on a sweep that skips drift.
    renew(&s, agent, vec![at(0)], used_of(3000))
        .await
        .expect("heartbeat");
    s.alert_sweep(AlertSweep {
        check_drift: false,
        ..sweep(5)
    })
    .await
    .expect("sweep");
    assert!(drift_of(&s).await.is_some());
}

/// Every test, on every backend: `conformance!(a, b: [tests])` makes a module per backend.
macro_rules! conformance {
    ($($backend:ident),+ : $tests:tt) => {
        $(conformance!(@backend $backend $tests);)+
    };
    (@backend $backend:ident [$($test:ident),* $(,)?]) => {
        mod $backend {
            $(
                #[tokio::test]
                async fn $test() {
                    let (store, _guard) = super::$backend().await;
                    super::$test(store).await;
                }
            )*
        }
    };
}

conformance!(sqlite, postgres: [
    runs_with_memory_phases_share_a_gpu_when_their_peaks_fall_apart,
    a_configuration_s_learned_shape_lets_its_runs_share_a_gpu,
    a_run_that_outgrows_its_learned_phase_is_blamed_and_its_key_holds_its_peak,
    a_gpu_s_drift_is_kept_told_once_when_it_lasts_and_cleared,
    alerts_are_kept_with_what_they_tell_of_and_claimed_once,
    lost_nodes_and_long_waits_are_told_once,
    plan_slots_bound_leases,
    host_memory_is_admitted_on_the_node_and_learned_from_runs,
    users_go_by_usage_per_share_and_their_caps_hold,
    ended_runs_are_charged_once_in_one_round,
    a_preemptible_job_makes_room_for_a_user_under_their_share,
    an_experiment_s_cap_holds_across_nodes,
    a_study_s_jobs_wait_for_theirs_and_a_failure_cancels_only_its_chain,
    early_stop_decides_each_rung_once_against_the_experiment_s_other_attempts,
    runs_of_a_configuration_start_where_it_last_fit,
    an_experiment_s_source_reaches_its_leases_and_bundles_are_kept_by_hash,
    claims_wake_for_work_and_sleep_through_starts_and_leases,
    a_cpu_job_behind_a_full_node_s_queue_still_starts,
    a_claim_reads_a_window_sized_by_the_node_s_open_slots,
    an_end_carries_a_start_not_yet_reported,
    stale_fences_are_refused,
    retry_policy_decides_requeue,
    retry_failed_requeues_every_failed_job_of_the_experiment_only,
    every_figure_round_trips_through_the_store,
    reregistration_loses_old_attempts,
    reregistration_resumes_current_attempts,
    lost_without_retry_fails,
    a_live_node_is_registered_again_only_by_its_instance,
    users_have_one_role_and_their_unix_user_reaches_their_leases,
    cancel_stops_queued_and_flags_running,
    unfinished_is_true_until_every_job_has_ended,
    plans_change_at_run_time,
    hand_back_requeues_without_cost,
    expired_leases_become_lost,
    exports_one_row_per_attempt,
    estimates_are_learned_per_memory_key,
    a_declared_estimate_its_runs_kept_to_stands,
    a_need_past_this_node_waits_for_a_larger_one_and_past_every_gpu_runs_alone,
    estimates_follow_the_latest_peaks,
    run_lengths_are_learned_from_successful_runs_with_or_without_a_peak,
    oom_ladder_degrades_and_retries,
    unverified_cleanup_quarantines_gpus,
    a_claim_without_samples_places_with_what_the_latest_end_freed,
    stale_heartbeats_and_logs_are_refused_and_change_nothing,
    one_heartbeat_renews_each_attempt_and_says_which_were_cancelled,
    heartbeats_racing_a_normal_end_renew_the_rest,
    oom_ladder_steps_get_their_own_estimate_and_repeat,
    pending_jobs_say_why,
    a_requeued_job_shows_no_reason_from_before_its_lease,
    writes_announce_their_changes,
    peak_sources_are_stored_and_device_deltas_teach,
    attempt_measurements_are_stored_and_read_back,
    attempts_that_ran_on_one_gpu_together_are_labelled_shared,
    a_throttled_run_is_what_its_specs_on_throttle_says,
    tallies_count_outcomes_and_each_users_jobs,
    late_outcomes_of_lost_attempts,
    telemetry_is_stored_per_gpu_and_served_per_attempt,
    telemetry_retention_prunes_by_age_and_count_in_batches,
    pending_reasons_are_counted,
    tokens_are_created_found_listed_and_revoked,
    attempt_logs_are_kept_once_by_offset_and_to_their_bound,
    a_node_joins_once_whoever_asks_at_the_same_time,
    runs_record_who_submitted_them,
    exclusive_jobs_hold_their_gpu_and_record_their_wait,
    colocated_jobs_carry_their_background_and_record_it,
    prestart_is_stored_per_job,
    concurrent_claims_for_one_node_never_overfill_it,
    a_job_that_fits_starts_behind_any_number_that_do_not,
    jobs_are_listed_by_experiment_state_and_limit,
]);

// ---- both backends side by side, and what only PostgreSQL does --------------------------

fn migration_names(backend: &str) -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(backend);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn backends_share_migrations_and_schema_version() {
    let sqlite_names = migration_names("sqlite");
    assert!(!sqlite_names.is_empty());
    assert_eq!(
        sqlite_names,
        migration_names("postgres"),
        "every migration exists for both backends, under the same version and name"
    );
    let latest: i64 = sqlite_names
        .iter()
        .filter_map(|n| n.strip_prefix('V')?.split("__").next()?.parse().ok())
        .max()
        .expect("versioned names");
    let (sq, _dir) = sqlite().await;
    let (pg, _db) = postgres().await;
    assert_eq!(sq.schema_version().await.expect("sqlite version"), latest);
    assert_eq!(pg.schema_version().await.expect("postgres version"), latest);
}

fn many_slots() -> Option<&'static str> {
    Some("64,64,64,64")
}

/// A clean end does not take its node's row, so it does not wait for a claim (or anything)
/// holding it: on PostgreSQL a node's finishes and claims used to run one at a time. An end
/// that quarantines its GPUs still takes it first, so no claim places on them meanwhile.
#[tokio::test]
async fn postgres_only_an_end_that_quarantines_waits_for_its_node_s_row() {
    use std::time::Duration;
    let db = PgDatabase::create().await;
    let s: Backend = Arc::new(db.store().await);
    let agent = register(&s, "n1", 2, Some("1,1")).await;
    submit(&s, (0..2).map(|i| job(i, Some(100), vec![], 1)).collect()).await;
    let leases = claim(&s, agent, 2).await;
    assert_eq!(leases.len(), 2);
    // Another transaction holds the node's row, as a claim of the node does.
    let (holder, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    holder
        .batch_execute("BEGIN; SELECT 1 FROM nodes WHERE name = 'n1' FOR UPDATE")
        .await
        .expect("lock the node");
    let mut clean = report(leases[0].fence, None);
    clean.gpus = free(2, 10_000);
    tokio::time::timeout(
        Duration::from_secs(10),
        finish_attempt(&s, leases[0].attempt, clean),
    )
    .await
    .expect("a clean end waits for no lock of its node")
    .expect("finish");
    let mut dirty = report(leases[1].fence, None);
    dirty.cleanup_verified = false;
    dirty.unverified = Some("pid 4242 still holds memory".into());
    let (s2, attempt) = (s.clone(), leases[1].attempt);
    let quarantining = tokio::spawn(async move { finish_attempt(&s2, attempt, dirty).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !quarantining.is_finished(),
        "an end that quarantines waits for its node's row"
    );
    holder.batch_execute("ROLLBACK").await.expect("release");
    tokio::time::timeout(Duration::from_secs(10), quarantining)
        .await
        .expect("it ends once the row is free")
        .expect("task")
        .expect("finish");
    let nodes = s.list_nodes(60_000).await.expect("nodes");
    assert_eq!(
        nodes[0].gpus[leases[1].gpus[0] as usize].quarantine.len(),
        1
    );
}

/// A start and an end lock their job before their attempt, as every operation does (a claim,
/// a heartbeat, the lease sweep), though each takes both in one read: while another
/// transaction holds the job, the report waits holding nothing of the attempt.
#[tokio::test]
async fn postgres_only_reports_lock_the_job_before_the_attempt() {
    use std::time::Duration;
    let db = PgDatabase::create().await;
    let s: Backend = Arc::new(db.store().await);
    let agent = register(&s, "n1", 1, Some("1")).await;
    submit(&s, vec![job(0, Some(100), vec![], 1)]).await;
    let lease = claim(&s, agent, 1).await.remove(0);
    let connect = || async {
        let (c, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        c
    };
    let (holder, prober) = (connect().await, connect().await);
    let lock_job = format!(
        "BEGIN; SELECT 1 FROM jobs WHERE id = '{}' FOR UPDATE",
        lease.job
    );
    let probe = format!(
        "BEGIN; SELECT 1 FROM attempts WHERE id = '{}' FOR UPDATE NOWAIT; ROLLBACK",
        lease.attempt
    );
    let waits_on_the_job_alone = async |report: tokio::task::JoinHandle<()>| {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!report.is_finished(), "the report waits for its job's row");
        prober
            .batch_execute(&probe)
            .await
            .expect("the waiting report holds no lock of its attempt");
        holder.batch_execute("ROLLBACK").await.expect("release");
        tokio::time::timeout(Duration::from_secs(10), report)
            .await
            .expect("it goes on once the job is free")
            .expect("report");
    };

    holder.batch_execute(&lock_job).await.expect("lock the job");
    let (s2, l) = (s.clone(), lease.clone());
    let start = tokio::spawn(async move {
        s2.start_attempt(l.attempt, l.fence, 42, now_ms())
            .await
            .expect("start");
    });
    waits_on_the_job_alone(start).await;

    holder.batch_execute(&lock_job).await.expect("lock the job");
    let (s2, l) = (s.clone(), lease.clone());
    let end = tokio::spawn(async move {
        finish_attempt(&s2, l.attempt, report(l.fence, None))
            .await
            .expect("finish");
    });
    waits_on_the_job_alone(end).await;
    assert_eq!(state(&s, lease.job).await, JobState::Succeeded);
}

/// A heartbeat renews its node's attempts in place: no index of `attempts` holds what a
/// renewal writes, so PostgreSQL updates the rows as heap-only tuples, writing no index entry,
/// wherever their page has room (with the lease's expiry indexed, none was: every renewal
/// wrote an entry in each index holding the row). Most, not all: a page that a concurrent
/// snapshot keeps from being pruned sends an update elsewhere (64 of 80 were in place under
/// the suite's parallel load, 80 alone).
#[tokio::test]
async fn postgres_lease_renewals_update_their_rows_in_place() {
    use std::time::{Duration, Instant};
    const RENEWALS: i64 = 20;
    let db = PgDatabase::create().await;
    let s: Backend = Arc::new(db.store().await);
    let agent = register(&s, "n1", 1, Some("4")).await;
    submit(&s, (0..4).map(|i| job(i, Some(100), vec![], 1)).collect()).await;
    let leases = claim(&s, agent, 1).await;
    assert_eq!(leases.len(), 4);
    for l in &leases {
        s.start_attempt(l.attempt, l.fence, 42, now_ms())
            .await
            .expect("start");
    }
    let (stats, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    // Updates of `attempts` so far, and those in place (a backend reports its counts once
    // idle, within 10 s).
    let updates = || async {
        let row = stats
            .query_one(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
                 WHERE relname = 'attempts'",
                &[],
            )
            .await
            .expect("stats");
        (row.get::<_, i64>(0), row.get::<_, i64>(1))
    };
    let (all0, hot0) = updates().await;
    for _ in 0..RENEWALS {
        renew(&s, agent, presented(&leases), vec![])
            .await
            .expect("renew");
    }
    let renewed = RENEWALS * leases.len() as i64;
    // Every renewal counted (the starts' updates may be counted late too: a few more).
    let until = Instant::now() + Duration::from_secs(30);
    let (mut all, mut hot) = updates().await;
    while all - all0 < renewed && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        (all, hot) = updates().await;
    }
    assert!(
        all - all0 >= renewed,
        "the renewals were not counted: {all}"
    );
    assert!(
        2 * (hot - hot0) >= renewed,
        "{} of {renewed} renewals updated their rows in place ({all0}/{hot0} -> {all}/{hot})",
        hot - hot0
    );
}

/// Two coordinator replicas on one database, each serving one node, claiming at the same
/// time: every job is leased exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_replicas_never_lease_a_job_twice() {
    const JOBS: u32 = 300;
    let db = PgDatabase::create().await;
    // Replicas start together: migrations run once, under the advisory lock.
    let (a, b) = tokio::join!(db.store(), db.store());
    let (a, b): (Backend, Backend) = (Arc::new(a), Arc::new(b));
    let agent_a = register(&a, "node-a", 4, many_slots()).await;
    let agent_b = register(&b, "node-b", 4, many_slots()).await;
    submit(&a, (0..JOBS).map(|i| job(i, Some(10), vec![], 1)).collect()).await;
    let take = |s: Backend, agent: AgentId| async move {
        s.claim_jobs(ClaimInput {
            agent,
            gpus: Some(free(4, 10_000)),
            max: 7,
            lease_ttl_ms: 60_000,
            reserve_after_ms: u64::MAX,
            half_life_ms: headroom_coordinator::fair::DEFAULT_HALF_LIFE_MS,
            watching: vec![],
        })
        .await
        .expect("claim")
        .leases
    };
    let mut leased: BTreeMap<JobId, String> = BTreeMap::new();
    let mut rounds = 0;
    loop {
        let (la, lb) = tokio::join!(take(a.clone(), agent_a), take(b.clone(), agent_b));
        if la.is_empty() && lb.is_empty() {
            break;
        }
        rounds += 1;
        assert!(rounds < 1000, "claims stopped making progress");
        for (node, l) in la
            .iter()
            .map(|l| ("node-a", l))
            .chain(lb.iter().map(|l| ("node-b", l)))
        {
            if let Some(first) = leased.insert(l.job, node.to_string()) {
                panic!("job {} leased twice: to {first} and to {node}", l.job);
            }
        }
    }
    assert_eq!(leased.len(), JOBS as usize, "every job leased");
    let counts = a.counts(None).await.expect("counts");
    assert_eq!((counts.leased, counts.queued), (u64::from(JOBS), 0));
    for j in a.list_jobs(JobFilter::default()).await.expect("jobs") {
        assert_eq!(j.attempts, 1, "job {} has exactly one attempt", j.id);
        assert_eq!(j.node.as_deref(), leased.get(&j.id).map(String::as_str));
    }
    let nodes = b.list_nodes(60_000).await.expect("nodes");
    let slots_used: u32 = nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .map(|g| g.slots_used)
        .sum();
    assert_eq!(slots_used, JOBS);
}

/// One node's claims arriving through two replicas (an agent behind a load balancer) wait
/// for each other on the node's row: the node is filled once, every job leased at most once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_one_nodes_claims_through_two_replicas_fill_it_once() {
    let db = PgDatabase::create().await;
    let (a, b): (Backend, Backend) = (Arc::new(db.store().await), Arc::new(db.store().await));
    let agent = register(&a, "n1", 2, Some("5,5")).await;
    let jobs = (0..BEYOND_CLAIM_WINDOW).map(|i| job(i, Some(10), vec![], 1));
    submit(&a, jobs.collect()).await;
    store_samples(&a, agent, 2).await;
    let mut leased: BTreeMap<JobId, usize> = BTreeMap::new();
    for _ in 0..5 {
        let claims = (0..6).map(|i| {
            let s = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { claim_by_stored_samples(&s, agent).await })
        });
        for leases in futures::future::join_all(claims).await {
            for l in leases.expect("claim task") {
                *leased.entry(l.job).or_default() += 1;
            }
        }
    }
    assert_eq!(
        leased.len(),
        10,
        "two GPUs of 5 slots hold 10 leases: {leased:?}"
    );
    assert!(
        leased.values().all(|n| *n == 1),
        "a job leased twice: {leased:?}"
    );
    let counts = b.counts(None).await.expect("counts");
    assert_eq!(
        (counts.leased, counts.queued),
        (10, u64::from(BEYOND_CLAIM_WINDOW) - 10)
    );
}

/// Replicas starting together on a new database: one migrates (under the advisory lock),
/// the others wait and find the schema done; every migration runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stores_starting_together_migrate_once() {
    let db = PgDatabase::create().await;
    let stores = futures::future::join_all((0..4).map(|_| {
        let url = db.url.clone();
        tokio::spawn(async move { PostgresStore::connect(&url).await })
    }))
    .await;
    for s in stores {
        let s = s.expect("task").expect("every replica starts");
        assert_eq!(
            Store::schema_version(&s).await.expect("version") as usize,
            migration_names("postgres").len()
        );
    }
    let (client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let rows = client
        .query(
            "SELECT version, COUNT(*) FROM refinery_schema_history GROUP BY version",
            &[],
        )
        .await
        .expect("history");
    assert_eq!(rows.len(), migration_names("postgres").len());
    for r in rows {
        assert_eq!(
            r.get::<_, i64>(1),
            1,
            "migration {} ran once",
            r.get::<_, i32>(0)
        );
    }
}

/// Counts `on_change` calls, for waiting on them, and keeps the last one's kind.
#[derive(Clone, Default)]
struct Wakes(
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::Mutex<Option<Change>>>,
);

impl Wakes {
    fn hook(&self) -> headroom_coordinator::store::OnChange {
        let (n, last) = (self.0.clone(), self.1.clone());
        Arc::new(move |c| {
            *last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(c);
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
    }

    fn last(&self) -> Option<Change> {
        self.1
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn get(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn wait_past(&self, seen: usize, what: &str) -> usize {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let now = self.get();
            if now > seen {
                return now;
            }
            assert!(tokio::time::Instant::now() < deadline, "no wake-up: {what}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn postgres_changes_wake_other_replicas_and_survive_reconnects() {
    let db = PgDatabase::create().await;
    let (a, b): (Backend, Backend) = (Arc::new(db.store().await), Arc::new(db.store().await));
    let wakes = Wakes::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let watcher = tokio::spawn({
        let (b, hook, stop) = (b.clone(), wakes.hook(), stop.clone());
        async move { b.watch_changes(hook, stop).await }
    });
    // Listening: one wake right after subscribing, for changes it may have missed.
    let seen = wakes.wait_past(0, "after subscribing").await;
    submit(&a, vec![job(0, Some(10), vec![], 1)]).await;
    let seen = wakes
        .wait_past(seen, "a change through the other replica")
        .await;
    assert_eq!(
        wakes.last(),
        Some(Change::Work),
        "a submit is work for claims"
    );

    // The listener's connection dies (database restart, failover): it reconnects, and
    // wakes its waiters once since notifications may have been lost meanwhile.
    let admin = pg_admin().await;
    let killed = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND application_name = $2",
            &[
                &db.name,
                &headroom_coordinator::store::postgres::LISTENER_APPLICATION_NAME,
            ],
        )
        .await
        .expect("terminate the listener");
    assert_eq!(killed.len(), 1, "one listener connection");
    let seen = wakes.wait_past(seen, "after reconnecting").await;
    let agent = register(&a, "n1", 1, None).await;
    let seen = wakes.wait_past(seen, "a change after reconnecting").await;
    let lease = claim(&a, agent, 1).await.pop().expect("a lease");
    let seen = wakes.wait_past(seen, "a lease").await;
    assert_eq!(
        wakes.last(),
        Some(Change::Shown),
        "another replica's lease wakes watchers, not claims"
    );
    finish_attempt(&a, lease.attempt, report(lease.fence, None))
        .await
        .expect("finish");
    wakes.wait_past(seen, "an end").await;
    assert_eq!(
        wakes.last(),
        Some(Change::Freed("n1".into())),
        "an end frees a slot on its node"
    );

    stop.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(5), watcher)
        .await
        .expect("the watch ends on shutdown")
        .expect("watch task");
}

#[tokio::test]
async fn postgres_unreachable_or_bad_urls_are_database_errors() {
    let refused = PostgresStore::connect("postgres://postgres@127.0.0.1:1/headroom").await;
    assert!(
        matches!(refused, Err(StoreError::Database(_))),
        "{:?}",
        refused.err()
    );
    let bad = PostgresStore::connect("postgres://u:secret@host:notaport/db").await;
    match bad {
        Err(StoreError::Database(m)) => {
            assert!(m.contains("bad database URL"), "{m}");
            assert!(!m.contains("secret"), "the password is not echoed: {m}");
        }
        other => panic!("{:?}", other.err()),
    }
}

/// A running attempt's metrics as its supervisor reports them (rung values in order).
fn reported(
    acc: &[(u64, f64)],
    rungs: &[(u32, u64, f64)],
) -> headroom_shared::results::AttemptMetrics {
    use headroom_shared::results::{AttemptMetrics, Point, RungValue};
    let points: Vec<Point> = acc
        .iter()
        .map(|&(step, value)| Point {
            step,
            t: step as f64,
            value,
        })
        .collect();
    AttemptMetrics {
        finals: points
            .last()
            .map(|p| ("acc".to_string(), p.value))
            .into_iter()
            .collect(),
        series: [("acc".to_string(), points)].into_iter().collect(),
        ignored: 0,
        rungs: rungs
            .iter()
            .map(|&(rung, step, value)| RungValue { rung, step, value })
            .collect(),
    }
}

async fn early_stop_decides_each_rung_once_against_the_experiment_s_other_attempts(s: Backend) {
    use headroom_shared::results::{EarlyStop, Mode, ResultsSpec, Rule, Tracking};
    let results = ResultsSpec {
        early_stop: Some(EarlyStop {
            metric: "acc".into(),
            mode: Mode::Max,
            rule: Rule::Asha,
            grace_steps: 1,
            reduction_factor: 2,
            min_early_stopping_rate: 0,
            bootstrap_count: 0,
        }),
        tracking: Some(Tracking {
            mlflow: "http://127.0.0.1:9".into(),
        }),
        ..ResultsSpec::default()
    };
    let id = ExperimentId::new();
    s.create_experiment(NewExperiment {
        host_memory_mib: None,
        checkpoint: None,
        preemptible: false,
        memory_cap_off: false,
        memory_phases: None,
        id,
        name: "exp".into(),
        seed: 1,
        spec: serde_json::json!({}),
        jobs: vec![job(0, Some(1000), vec![], 1), job(1, Some(1000), vec![], 1)],
        submitted_by: "anonymous".into(),
        source: None,
        results: Some(results.clone()),
        study: None,
        max_concurrent: None,
    })
    .await
    .expect("create experiment");
    let agent = register(&s, "n1", 2, Some("1,1")).await;
    let leases = claim(&s, agent, 2).await;
    assert_eq!(leases.len(), 2);
    assert_eq!(
        leases[0].results.as_ref(),
        Some(&results),
        "the lease carries them"
    );
    let (a, b) = (&leases[0], &leases[1]);

    // The first at rung 0 goes on; a report again decides nothing twice.
    let first = reported(&[(1, 0.9)], &[(0, 1, 0.9)]);
    for _ in 0..2 {
        let answer = s
            .report_metrics(a.attempt, a.fence, first.clone())
            .await
            .expect("report");
        assert!(answer.prune.is_none());
    }
    // A stale token is refused, and writes nothing.
    let stale = s
        .report_metrics(b.attempt, b.fence - 1, reported(&[(1, 1.0)], &[]))
        .await;
    assert!(
        matches!(stale, Err(StoreError::StaleFence { .. })),
        "{stale:?}"
    );
    // Behind the other at rung 0: stopped, with the cutoff; asked again, the same answer.
    for _ in 0..2 {
        let answer = s
            .report_metrics(
                b.attempt,
                b.fence,
                reported(&[(1, 0.4), (2, 0.5)], &[(0, 1, 0.4), (1, 2, 0.5)]),
            )
            .await
            .expect("report");
        let d = answer.prune.expect("pruned");
        assert_eq!(
            (d.rung, d.value, d.cutoff, d.competitors),
            (0, 0.4, Some(0.9), 2)
        );
    }
    let view = s.attempt(b.attempt).await.expect("attempt");
    assert_eq!(
        view.rungs.len(),
        1,
        "no rung after the one that stopped it: {view:?}"
    );
    assert_eq!(view.metrics.get("acc"), Some(&0.5));

    // Its end: pruned, not retried, its results due to the tracking server.
    let mut end = report(b.fence, Some(FailureClass::Pruned));
    end.metrics = Some(reported(&[(1, 0.4), (2, 0.5)], &[(0, 1, 0.4), (1, 2, 0.5)]));
    assert_eq!(
        finish_attempt(&s, b.attempt, end).await.expect("end"),
        JobState::Pruned
    );
    assert_eq!(s.counts(Some(id)).await.expect("counts").pruned, 1);
    let series = s.experiment_series(id, None, 513).await.expect("series");
    assert_eq!(series.len(), 2);
    let mine = series.iter().find(|r| r.attempt == b.attempt).expect("b's");
    assert_eq!(mine.series["acc"].len(), 2);
    assert!(!mine.live && series.iter().any(|r| r.live));
    // One metric's series alone, thinned; a metric none reported reads empty.
    let mut three = reported(&[(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)], &[(0, 1, 0.9)]);
    three.finals.insert("other".into(), 1.0);
    s.report_metrics(a.attempt, a.fence, three)
        .await
        .expect("report");
    let thin = s
        .experiment_series(id, Some("acc".into()), 2)
        .await
        .expect("thinned");
    let a_series = thin.iter().find(|r| r.attempt == a.attempt).expect("a's");
    let steps: Vec<u64> = a_series.series["acc"].iter().map(|p| p.step).collect();
    assert_eq!(steps, [1, 4], "the first and the latest");
    assert_eq!(a_series.finals.keys().collect::<Vec<_>>(), ["acc"]);
    let none = s
        .experiment_series(id, Some("nothing".into()), 10)
        .await
        .expect("none");
    assert!(
        none.iter()
            .all(|r| r.series.is_empty() && r.finals.is_empty())
    );

    // Claimed once, however many replicas ask, until its hold runs out.
    let claimed = s.claim_tracking(60_000, 8).await.expect("claim");
    assert_eq!(claimed, vec![(b.attempt, 1)]);
    assert!(s.claim_tracking(60_000, 8).await.expect("again").is_empty());
    s.set_tracking(b.attempt, "mlflow run r1".into(), None)
        .await
        .expect("note");
    assert_eq!(
        s.attempt(b.attempt)
            .await
            .expect("attempt")
            .tracking
            .as_deref(),
        Some("mlflow run r1")
    );
    // A metric report after the end is refused, and changes nothing.
    let late = s
        .report_metrics(b.attempt, b.fence, reported(&[(9, 9.0)], &[]))
        .await;
    assert!(
        matches!(late, Err(StoreError::StaleFence { .. })),
        "{late:?}"
    );
    assert_eq!(
        s.attempt(b.attempt)
            .await
            .expect("attempt")
            .metrics
            .get("acc"),
        Some(&0.5)
    );
}

/// A configuration whose first run needed two OOM ladder steps: its other runs, and later
/// runs of its key, start at step 2; another configuration is left as it is.
async fn runs_of_a_configuration_start_where_it_last_fit(s: Backend) {
    let agent = register(&s, "n1", 1, None).await;
    let config = |index: u32, run: u32, bs: u64| {
        let mut j = job(index, Some(1000), vec![], 1);
        j.run = run;
        j.config = if bs == 256 { 0 } else { 1 };
        j.params = BTreeMap::from([("batch_size".to_string(), serde_json::json!(bs))]);
        j.argv = vec!["train".into(), format!("--bs={bs}")];
        j.memory_key = format!("exp/batch_size={bs}");
        j.oom_ladder = vec![
            BTreeMap::from([("batch_size".to_string(), serde_json::json!("/2"))]),
            BTreeMap::from([("batch_size".to_string(), serde_json::json!("/2"))]),
        ];
        j
    };
    let exp = submit(
        &s,
        vec![
            config(0, 0, 256),
            config(1, 1, 256),
            config(2, 2, 256),
            config(3, 0, 64),
            // Another configuration that shares the memory key (`memory_key` names no
            // parameter that tells them apart): it is not the one that needed the step.
            {
                let mut j = config(4, 0, 512);
                j.memory_key = "exp/batch_size=256".into();
                j
            },
        ],
    )
    .await;
    let first = s
        .list_jobs(JobFilter {
            experiment: Some(exp),
            ..Default::default()
        })
        .await
        .expect("jobs")[0]
        .id;
    for (bs, failure) in [
        (256, Some(FailureClass::Oom)),
        (128, Some(FailureClass::Oom)),
        (64, None),
    ] {
        let l = claim(&s, agent, 1).await.remove(0);
        assert_eq!(
            (l.job, l.params["batch_size"].clone()),
            (first, serde_json::json!(bs))
        );
        finish_attempt(&s, l.attempt, report(l.fence, failure))
            .await
            .expect("finish");
    }
    let jobs = s
        .list_jobs(JobFilter {
            experiment: Some(exp),
            ..Default::default()
        })
        .await
        .expect("jobs");
    for j in &jobs[1..3] {
        let d = s.job(j.id).await.expect("job");
        assert_eq!(d.ladder_step, 2, "{d:?}");
        assert_eq!(d.argv, ["train", "--bs=64"]);
        assert!(
            d.ladder_from
                .as_deref()
                .is_some_and(|w| w.contains("step 2")),
            "{:?}",
            d.ladder_from
        );
    }
    for other in &jobs[3..] {
        let other = s.job(other.id).await.expect("job");
        assert_eq!((other.ladder_step, other.ladder_from.as_deref()), (0, None));
    }
    // Placed by the stepped key, where the run that fit taught its peak.
    let l = claim(&s, agent, 1).await.remove(0);
    assert_eq!(l.params["batch_size"], serde_json::json!(64));
    // A later submission of the same configuration starts there too.
    let later = submit(&s, vec![config(0, 0, 256)]).await;
    let j = s
        .list_jobs(JobFilter {
            experiment: Some(later),
            ..Default::default()
        })
        .await
        .expect("jobs")[0]
        .id;
    assert_eq!(s.job(j).await.expect("job").ladder_step, 2);
}
