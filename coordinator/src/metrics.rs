//! The coordinator's Prometheus metrics (`GET /metrics`): jobs by state, queue depth,
//! pending reasons, leases, agents, GPUs by status, attempts by outcome and jobs per user,
//! read from the store at each scrape (so every replica tells the same); this replica's
//! claim and submit-to-start latencies; the build.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::store::{Result, Store};
use headroom_shared::api::DriftDirection;

/// The content type of the text exposition this page is written in.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriftLabels {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlertTryLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuStatusLabels {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UserLabels {
    user: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareLabels {
    user: String,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// A GPU of a live node is one of these: running an attempt, quarantined (an attempt's
/// cleanup not verified), unreadable (its last reading failed), or idle.
const GPU_STATUSES: &[&str] = &["allocated", "idle", "quarantined", "unreadable"];

/// Every pending reason code, so a reason no job has now reads 0 rather than vanishing.
const REASONS: &[&str] = &[
    "not_considered",
    "no_live_node",
    "no_free_slot",
    "not_enough_memory",
    "not_enough_host_memory",
    "gpu_quarantined",
    "behind_reservation",
    "too_many_gpus",
    "larger_than_every_gpu",
    "concurrency_cap",
    "user_cap",
    "fair_share",
    "waits_for",
];

/// The coordinator's metrics; cheap to clone.
#[derive(Clone, Debug)]
pub struct CoordinatorMetrics {
    registry: Arc<Registry>,
    jobs: Family<StateLabels, Gauge>,
    queue_depth: Gauge,
    pending: Family<ReasonLabels, Gauge>,
    leases: Gauge,
    agents_up: Gauge,
    nodes: Gauge,
    claim: Histogram,
    claims_in_turn: Gauge,
    claims_waiting: Gauge,
    submit_to_start: Histogram,
    refused: Family<RefusedLabels, prometheus_client::metrics::counter::Counter>,
    alert_tries: Family<AlertTryLabels, prometheus_client::metrics::counter::Counter>,
    outcomes: Family<OutcomeLabels, Gauge>,
    gpus: Family<GpuStatusLabels, Gauge>,
    drifting: Family<DriftLabels, Gauge>,
    users: Family<UserLabels, Gauge>,
    share_used: Family<ShareLabels, FloatGauge>,
    share_weight: Family<ShareLabels, Gauge>,
    share_normalized: Family<ShareLabels, FloatGauge>,
    /// One render at a time on this replica: each sets the gauges, then encodes them (the
    /// per-user family is cleared and refilled, which a concurrent scrape must not see).
    rendering: Arc<tokio::sync::Mutex<()>>,
}

impl Default for CoordinatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl CoordinatorMetrics {
    pub fn new() -> Self {
        let mut r = Registry::default();
        let jobs = Family::<StateLabels, Gauge>::default();
        r.register("headroom_jobs", "Jobs by state", jobs.clone());
        let queue_depth = Gauge::default();
        r.register(
            "headroom_queue_depth",
            "Jobs waiting to run (queued or retrying)",
            queue_depth.clone(),
        );
        let pending = Family::<ReasonLabels, Gauge>::default();
        r.register(
            "headroom_pending_jobs",
            "Waiting jobs by pending reason (as the last claim that looked at them saw it)",
            pending.clone(),
        );
        let leases = Gauge::default();
        r.register(
            "headroom_leases",
            "Jobs holding a lease (leased or running)",
            leases.clone(),
        );
        let agents_up = Gauge::default();
        r.register(
            "headroom_agents_up",
            "Nodes whose agent was heard from within the lease TTL",
            agents_up.clone(),
        );
        let nodes = Gauge::default();
        r.register("headroom_nodes", "Nodes ever registered", nodes.clone());
        let claim = Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]);
        r.register_with_unit(
            "headroom_claim_duration",
            "Time one claim pass (placement and leasing, one transaction) took on this replica",
            Unit::Seconds,
            claim.clone(),
        );
        let claims_in_turn = Gauge::default();
        r.register(
            "headroom_claims_in_turn",
            "Claim rounds reading the store now on this replica (at most --max-claims)",
            claims_in_turn.clone(),
        );
        let claims_waiting = Gauge::default();
        r.register(
            "headroom_claims_waiting",
            "Claim rounds waiting for their turn at the store now on this replica",
            claims_waiting.clone(),
        );
        let submit_to_start = Histogram::new([
            0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
            86400.0,
        ]);
        r.register_with_unit(
            "headroom_submit_to_start",
            "From submission to the start of a job's first attempt (reported to this replica)",
            Unit::Seconds,
            submit_to_start.clone(),
        );
        let refused =
            Family::<RefusedLabels, prometheus_client::metrics::counter::Counter>::default();
        r.register(
            "headroom_refused_requests",
            "Requests refused by the access gate (401 no or wrong token, 403 role or owner, 429 \
             throttled) or as busy (503: a claim that waited too long for its turn, a token \
             verification for a slot), by route, on this replica",
            refused.clone(),
        );
        let alert_tries =
            Family::<AlertTryLabels, prometheus_client::metrics::counter::Counter>::default();
        r.register(
            "headroom_alert_tries",
            "Alerts' delivery tries on this replica, by how they ended: delivered, retry (tried \
             again later) or dead (given up)",
            alert_tries.clone(),
        );
        let outcomes = Family::<OutcomeLabels, Gauge>::default();
        r.register(
            "headroom_attempts_ended",
            "Attempts ended, by outcome (`succeeded` or the failure class)",
            outcomes.clone(),
        );
        let gpus = Family::<GpuStatusLabels, Gauge>::default();
        r.register(
            "headroom_gpus",
            "GPUs of live nodes by status: allocated (an attempt holds it), quarantined, \
             unreadable, idle",
            gpus.clone(),
        );
        let drifting = Family::<DriftLabels, Gauge>::default();
        r.register(
            "headroom_gpus_drifting",
            "GPUs of live nodes whose use and the estimates placed on them have stayed apart \
             past --alert-drift-after: over (using more) or under (using less)",
            drifting.clone(),
        );
        let users = Family::<UserLabels, Gauge>::default();
        r.register(
            "headroom_user_jobs",
            "Jobs per submitter: queued (waiting to run) and running (holding a lease)",
            users.clone(),
        );
        let share_used = Family::<ShareLabels, FloatGauge>::default();
        r.register(
            "headroom_user_share_used_gib_hours",
            "Fair share: each user's decayed usage in GiB-hours of reserved GPU memory",
            share_used.clone(),
        );
        let share_weight = Family::<ShareLabels, Gauge>::default();
        r.register(
            "headroom_user_share",
            "Fair share: each user's weight (`user create --share`)",
            share_weight.clone(),
        );
        let share_normalized = Family::<ShareLabels, FloatGauge>::default();
        r.register(
            "headroom_user_share_normalized",
            "Fair share: usage per unit of share (the lowest user's jobs go first)",
            share_normalized.clone(),
        );
        // `headroom_build_info{version="…"} 1`, an OpenMetrics info.
        r.register(
            "headroom_build",
            "The coordinator's build",
            prometheus_client::metrics::info::Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            }),
        );
        Self {
            registry: Arc::new(r),
            refused,
            alert_tries,
            outcomes,
            gpus,
            drifting,
            users,
            share_used,
            share_weight,
            share_normalized,
            rendering: Arc::default(),
            jobs,
            queue_depth,
            pending,
            leases,
            agents_up,
            nodes,
            claim,
            claims_in_turn,
            claims_waiting,
            submit_to_start,
        }
    }

    /// A request the gate refused (401, 403, 429, 503).
    pub fn refused(&self, route: &str, status: u16) {
        self.refused
            .get_or_create(&RefusedLabels {
                route: route.to_string(),
                status,
            })
            .inc();
    }

    /// How one try of an alert's delivery ended.
    pub fn alert_delivery(&self, outcome: &crate::store::DeliveryOutcome) {
        use crate::store::DeliveryOutcome as O;
        let outcome = match outcome {
            O::Delivered => "delivered",
            O::Retry { .. } => "retry",
            O::Dead { .. } => "dead",
        };
        self.alert_tries
            .get_or_create(&AlertTryLabels { outcome })
            .inc();
    }

    pub fn observe_claim(&self, seconds: f64) {
        self.claim.observe(seconds);
    }

    /// This replica's claim rounds in their turn and waiting for one (`crate::admission`).
    pub fn set_claim_turns(&self, in_turn: usize, waiting: usize) {
        self.claims_in_turn.set(in_turn as i64);
        self.claims_waiting.set(waiting as i64);
    }

    pub fn observe_submit_to_start(&self, seconds: f64) {
        self.submit_to_start.observe(seconds.max(0.0));
    }

    /// Reads the store's figures and renders the page (OpenMetrics text). `users`: whether
    /// the jobs per submitter (`headroom_user_jobs`, which names users) are shown: only to a
    /// scrape that holds a user's or an admin's token (so are the fair-share gauges, read with
    /// `half_life_ms`).
    pub async fn render(
        &self,
        store: &dyn Store,
        alive_within_ms: u64,
        users: bool,
        half_life_ms: u64,
    ) -> Result<String> {
        let _one_at_a_time = self.rendering.lock().await;
        let counts = store.counts(None).await?;
        let reasons = store.pending_reason_counts().await?;
        let nodes = store.list_nodes(alive_within_ms).await?;
        let to_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for (state, n) in [
            ("queued", counts.queued),
            ("leased", counts.leased),
            ("running", counts.running),
            ("retrying", counts.retrying),
            ("succeeded", counts.succeeded),
            ("failed", counts.failed),
            ("cancelled", counts.cancelled),
            ("pruned", counts.pruned),
        ] {
            self.jobs
                .get_or_create(&StateLabels {
                    state: state.into(),
                })
                .set(to_i64(n));
        }
        self.queue_depth
            .set(to_i64(counts.queued + counts.retrying));
        self.leases.set(to_i64(counts.leased + counts.running));
        for reason in REASONS {
            let n = reasons
                .iter()
                .find(|(r, _)| r == reason)
                .map_or(0, |(_, n)| *n);
            self.pending
                .get_or_create(&ReasonLabels {
                    reason: (*reason).into(),
                })
                .set(to_i64(n));
        }
        self.agents_up
            .set(nodes.iter().filter(|n| n.alive).count() as i64);
        self.nodes.set(nodes.len() as i64);
        for status in GPU_STATUSES {
            let n = nodes
                .iter()
                .filter(|n| n.alive)
                .flat_map(|n| &n.gpus)
                .filter(|g| gpu_status(g) == *status)
                .count();
            self.gpus
                .get_or_create(&GpuStatusLabels {
                    status: (*status).into(),
                })
                .set(n as i64);
        }
        for direction in [DriftDirection::Over, DriftDirection::Under] {
            let n = nodes
                .iter()
                .filter(|n| n.alive)
                .flat_map(|n| &n.gpus)
                .filter_map(|g| g.drift.as_ref())
                .filter(|d| d.lasting && d.direction == direction)
                .count();
            self.drifting
                .get_or_create(&DriftLabels {
                    direction: direction.as_str(),
                })
                .set(n as i64);
        }
        let tallies = store.tallies().await?;
        // Every outcome, so one that has not happened reads 0 rather than vanishing.
        let outcomes = std::iter::once("succeeded").chain(
            headroom_shared::FailureClass::ALL
                .iter()
                .map(|c| c.as_str()),
        );
        for outcome in outcomes {
            let n = tallies
                .outcomes
                .iter()
                .find(|(o, _)| o == outcome)
                .map_or(0, |(_, n)| *n);
            self.outcomes
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.into(),
                })
                .set(to_i64(n));
        }
        // Only users with jobs waiting or running now, and to a scrape that may see them.
        self.users.clear();
        for (user, jobs) in tallies.by_user.iter().filter(|_| users) {
            for (state, n) in [("queued", jobs.queued), ("running", jobs.running)] {
                self.users
                    .get_or_create(&UserLabels {
                        user: user.clone(),
                        state: state.into(),
                    })
                    .set(to_i64(n));
            }
        }
        self.share_used.clear();
        self.share_weight.clear();
        self.share_normalized.clear();
        if users {
            for s in store.share_standings(half_life_ms).await? {
                let labels = ShareLabels { user: s.user };
                self.share_used.get_or_create(&labels).set(s.used_gib_hours);
                self.share_weight
                    .get_or_create(&labels)
                    .set(i64::from(s.share));
                self.share_normalized
                    .get_or_create(&labels)
                    .set(s.normalized);
            }
        }
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("cannot encode metrics: {e}");
        }
        Ok(out)
    }
}

/// What a GPU of a live node is doing, for `headroom_gpus`.
fn gpu_status(g: &headroom_shared::api::GpuView) -> &'static str {
    if !g.quarantine.is_empty() {
        "quarantined"
    } else if g.error.is_some() || g.used_mib.is_none() {
        "unreadable"
    } else if !g.attempts.is_empty() {
        "allocated"
    } else {
        "idle"
    }
}
