//! The supervisor's own line to the coordinator, for while its agent is away (killed,
//! restarting, wedged): with the key issued with its lease, valid for this attempt only, it
//! renews the lease when no renewal reached it for longer than the agent's heartbeats take,
//! and it reports the attempt's end itself when no agent took it, as slurmstepd reports a
//! step's end to slurmctld whatever became of slurmd. It self-fences only when it cannot
//! reach the coordinator either.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use headroom_shared::AttemptId;
use headroom_shared::api::{ErrorCode, FinishReport, LeaseRenewed, MetricsAnswer, MetricsReport};
use headroom_shared::client::{Client, ClientError};
use headroom_shared::results::AttemptMetrics;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// How a supervisor reaches the coordinator, sent in its launch (never in the job's
/// environment or argv).
#[derive(Clone, Serialize, Deserialize)]
pub struct Direct {
    /// The coordinator's base URL, as the agent reaches it.
    pub server: String,
    /// The attempt's key, issued with its lease.
    pub key: String,
    /// A renewal sent at `t` keeps the lease until `t + ttl` on the coordinator; the
    /// supervisor must have stopped its job by `t + fence_after` unless renewed again (the
    /// agent's fence budget: kill grace and margin taken off the TTL).
    pub fence_after_ms: u64,
    /// How often the agent renews: the supervisor renews itself once a renewal is overdue.
    pub every_ms: u64,
    /// The lease TTL the fence budget was made for; a coordinator that answers a renewal
    /// with a shorter one brings the fence in by the difference.
    #[serde(default)]
    pub ttl_ms: u64,
    /// Certificates to trust for an `https://` coordinator (the agent's `--ca-file`).
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
}

impl fmt::Debug for Direct {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Direct")
            .field("server", &self.server)
            .field("key", &"<redacted>")
            .field("fence_after_ms", &self.fence_after_ms)
            .field("every_ms", &self.every_ms)
            .field("ttl_ms", &self.ttl_ms)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// The shortest wait between tries, and the shortest request timeout.
const FLOOR: Duration = Duration::from_millis(100);

/// What a renewal came to.
#[derive(Debug)]
pub enum Renewal {
    /// Renewed: the fence may fall at `until`; `cancel`: a user cancelled the job;
    /// `requeue`: stop it after its checkpoint signal, to run again later.
    Renewed {
        until: Instant,
        cancel: bool,
        requeue: Option<headroom_shared::checkpoint::Requeue>,
    },
    /// The lease is not this attempt's any more (lost, ended, another's): stop now.
    Gone(String),
    /// Not reached (or refused for now): try again after `retry`.
    Failed(String),
}

/// What delivering the outcome came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    Delivered,
    /// The coordinator refused it for good (the lease is another's): nobody can deliver it.
    Refused,
    /// Not reached in time: left in the journal for the agent's next run.
    Undelivered,
}

pub struct DirectLink {
    params: Direct,
    attempt: AttemptId,
    fence: i64,
    client: Option<Client>,
    /// How much earlier than the rule this supervisor renews, drawn once: the supervisors
    /// of a node whose agent went away all see its heartbeats stop at once, and would
    /// otherwise renew together (after a coordinator's failover too, all at one moment).
    /// Earlier is always safe.
    jitter: Duration,
}

impl DirectLink {
    pub fn new(params: Direct, attempt: AttemptId, fence: i64) -> Self {
        let spread = Duration::from_millis(params.every_ms) / 4;
        let jitter = spread.mul_f64(rand::random::<f64>());
        Self {
            params,
            attempt,
            fence,
            client: None,
            jitter,
        }
    }

    pub fn fence_after(&self) -> Duration {
        Duration::from_millis(self.params.fence_after_ms)
    }

    fn every(&self) -> Duration {
        Duration::from_millis(self.params.every_ms)
    }

    /// Between failed tries, spread as the renewals are.
    pub fn retry(&self) -> Duration {
        (self.every() / 4).max(FLOOR) + self.jitter / 4
    }

    /// When a renewal is due for a fence falling at `deadline`: once no renewal came for a
    /// quarter beat longer than the agent's heartbeats take (or three quarters of the fence
    /// budget, when the budget is that short), leaving the rest for the request.
    pub fn due(&self, deadline: Instant) -> Instant {
        let overdue = (self.every() * 5 / 4).min(self.fence_after() * 3 / 4);
        let due = deadline
            .checked_sub(self.fence_after().saturating_sub(overdue))
            .unwrap_or(deadline);
        due.checked_sub(self.jitter).unwrap_or(due)
    }

    /// The client, built on first use (most attempts never need it).
    fn client(&mut self) -> Result<Client, ClientError> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let c = Client::new_with(&self.params.server, self.params.ca_file.as_deref())?
            .with_token(Some(&self.params.key))?;
        self.client = Some(c.clone());
        Ok(c)
    }

    /// A renewal to run aside (the supervisor goes on meanwhile); `deadline`: the fence,
    /// after which an answer no longer helps.
    pub fn renew(
        &mut self,
        deadline: Instant,
    ) -> impl std::future::Future<Output = Renewal> + Send + 'static {
        let client = self.client();
        let (attempt, fence, fence_after) = (self.attempt, self.fence, self.fence_after());
        let budget_ttl = Duration::from_millis(self.params.ttl_ms);
        async move {
            let client = match client {
                Ok(c) => c,
                Err(e) => return Renewal::Failed(format!("no client for the coordinator: {e}")),
            };
            let sent = Instant::now();
            let timeout = deadline.saturating_duration_since(sent).max(FLOOR);
            match client.renew_lease(attempt, fence, timeout).await {
                Ok(LeaseRenewed {
                    cancel,
                    ttl_ms,
                    requeue,
                }) => Renewal::Renewed {
                    until: sent + fence_after_for(fence_after, budget_ttl, ttl_ms),
                    cancel,
                    requeue,
                },
                Err(e) if permanent(&e) => Renewal::Gone(e.to_string()),
                Err(e) => Renewal::Failed(e.to_string()),
            }
        }
    }

    /// Ships what the coordinator lacks of the attempt's log at `log` (from what it has:
    /// the agent may have shipped most of it), then reports the attempt's end, trying again
    /// until `give_up_at`.
    /// Reports the running attempt's metrics so far; the answer says whether `early_stop`
    /// stops it.
    pub fn report_metrics(
        &mut self,
        metrics: AttemptMetrics,
    ) -> impl std::future::Future<Output = Result<MetricsAnswer, String>> + Send + 'static {
        let client = self.client();
        let (attempt, fence) = (self.attempt, self.fence);
        async move {
            let client = client.map_err(|e| format!("no client for the coordinator: {e}"))?;
            client
                .report_metrics(attempt, &MetricsReport { fence, metrics })
                .await
                .map_err(|e| e.to_string())
        }
    }

    pub async fn deliver(
        &mut self,
        report: &FinishReport,
        log: &Path,
        give_up_at: Instant,
    ) -> Delivery {
        let client = match self.client() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(attempt = %self.attempt, "cannot report the end: {e}");
                return Delivery::Undelivered;
            }
        };
        if let Err(e) = self.ship_log(&client, log, give_up_at).await {
            // The end matters more than the log: its tail travels in the report.
            tracing::warn!(attempt = %self.attempt, "cannot ship the log: {e}");
        }
        loop {
            match client.report_outcome(self.attempt, report).await {
                Ok(r) => {
                    tracing::info!(attempt = %self.attempt, job_state = %r.job_state, "end reported by the supervisor");
                    return Delivery::Delivered;
                }
                Err(e) if permanent(&e) => {
                    tracing::warn!(attempt = %self.attempt, "end refused: {e}");
                    return Delivery::Refused;
                }
                Err(e) => {
                    if Instant::now() + self.retry() > give_up_at {
                        tracing::warn!(attempt = %self.attempt, "cannot report the end, left in the journal: {e}");
                        return Delivery::Undelivered;
                    }
                    tokio::time::sleep(self.retry()).await;
                }
            }
        }
    }
}

/// The fence after a renewal answered with `ttl_ms`: the budget's, brought in by however
/// much shorter the coordinator's TTL is than the one the budget was made for (one restarted
/// with another `--lease-ttl` expires the lease sooner); never later.
fn fence_after_for(fence_after: Duration, budget_ttl: Duration, ttl_ms: u64) -> Duration {
    fence_after.saturating_sub(budget_ttl.saturating_sub(Duration::from_millis(ttl_ms)))
}

impl DirectLink {
    /// Ships the log from where the coordinator's copy ends (an empty chunk asks for it).
    async fn ship_log(
        &self,
        client: &Client,
        path: &Path,
        give_up_at: Instant,
    ) -> Result<(), String> {
        const CHUNK: u64 = 1 << 20;
        let mut offset = 0;
        let mut chunk = Vec::new();
        loop {
            match client
                .ship_log(self.attempt, self.fence, offset, chunk.clone())
                .await
            {
                Ok(len) => offset = len,
                Err(e) if permanent(&e) => return Err(e.to_string()),
                Err(e) => {
                    if Instant::now() + self.retry() > give_up_at {
                        return Err(e.to_string());
                    }
                    tokio::time::sleep(self.retry()).await;
                    continue;
                }
            }
            chunk = crate::supervisor::attempt::read_from(path, offset, CHUNK)
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if chunk.is_empty() {
                return Ok(());
            }
        }
    }
}

/// The coordinator's own word that the lease is not ours: stale, or the attempt's key
/// refused (how an unknown or ended attempt is answered on these routes). Anything else is
/// retried until the fence falls: a proxy's page, a client that cannot be built, and
/// `not_found`, which is what an older replica without these routes answers during a
/// rolling upgrade. A healthy job is not stopped, nor its end dropped, for an answer that
/// does not say so.
fn permanent(e: &ClientError) -> bool {
    matches!(
        e.code(),
        Some(ErrorCode::StaleFence | ErrorCode::Unauthenticated)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(fence_after_ms: u64, every_ms: u64) -> DirectLink {
        DirectLink::new(
            Direct {
                server: "http://127.0.0.1:1".into(),
                key: "k".into(),
                fence_after_ms,
                every_ms,
                ttl_ms: 0,
                ca_file: None,
            },
            AttemptId::new(),
            1,
        )
    }

    #[test]
    fn a_renewal_is_due_a_quarter_beat_after_the_agents_would_have_come() {
        // TTL 4 s, grace 1 s: fence after 2.6 s, the agent beats every 1.33 s.
        let mut l = link(2_600, 1_333);
        l.jitter = Duration::ZERO;
        let now = Instant::now();
        let deadline = now + Duration::from_millis(2_600);
        let due = l.due(deadline) - now;
        assert!(
            (Duration::from_millis(1_660)..=Duration::from_millis(1_670)).contains(&due),
            "{due:?}"
        );
        // A fence budget no longer than a beat: due at three quarters of it.
        let mut short = link(1_000, 1_000);
        short.jitter = Duration::ZERO;
        let due = short.due(now + Duration::from_millis(1_000)) - now;
        assert_eq!(due, Duration::from_millis(750));
    }

    /// The supervisors of one node renew spread over a quarter beat, never later than the
    /// rule: a node's worth of them, whose agent went away at once, do not renew together.
    #[test]
    fn supervisors_renew_spread_out_and_never_late() {
        let now = Instant::now();
        let deadline = now + Duration::from_millis(2_600);
        let dues: Vec<Duration> = (0..64)
            .map(|_| link(2_600, 1_333).due(deadline) - now)
            .collect();
        let (lo, hi) = (
            dues.iter().min().copied().unwrap_or_default(),
            dues.iter().max().copied().unwrap_or_default(),
        );
        assert!(
            hi <= Duration::from_millis(1_670),
            "later than the rule: {hi:?}"
        );
        assert!(lo >= Duration::from_millis(1_660 - 334), "{lo:?}");
        assert!(
            hi - lo >= Duration::from_millis(100),
            "not spread: {lo:?}..{hi:?}"
        );
    }

    /// Only the coordinator's word that the lease is not ours stops a job: `not_found` (an
    /// older replica without the supervisors' routes, in a rolling upgrade) is retried.
    #[test]
    fn only_a_stale_or_refused_lease_is_gone() {
        let refused = |code| ClientError::Refused {
            status: 404,
            code,
            message: "no such route (see /v1/...)".into(),
            field: None,
            retry_after: None,
        };
        assert!(!permanent(&refused(ErrorCode::NotFound)));
        assert!(!permanent(&refused(ErrorCode::StoreUnavailable)));
        assert!(permanent(&refused(ErrorCode::Unauthenticated)));
        assert!(permanent(&ClientError::Stale {
            message: "stale".into(),
            attempt: None
        }));
    }

    #[test]
    fn a_shorter_ttl_in_the_answer_brings_the_fence_in() {
        let ms = Duration::from_millis;
        assert_eq!(fence_after_for(ms(2_600), ms(4_000), 4_000), ms(2_600));
        assert_eq!(fence_after_for(ms(2_600), ms(4_000), 3_000), ms(1_600));
        assert_eq!(
            fence_after_for(ms(2_600), ms(4_000), 9_000),
            ms(2_600),
            "never later"
        );
        assert_eq!(
            fence_after_for(ms(2_600), ms(4_000), 1_000),
            ms(0),
            "stop at once"
        );
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let shown = format!("{:?}", link(1, 1).params);
        assert!(!shown.contains("\"k\""), "{shown}");
        assert!(shown.contains("redacted"));
    }

    #[tokio::test]
    async fn an_unreachable_coordinator_is_retried_and_then_left_to_the_journal() {
        let mut l = link(1_000, 400);
        let report = crate::supervisor::report(
            1,
            crate::supervisor::attempt::not_started(
                crate::supervisor::classify::Unstarted::LaunchFailed,
                String::new(),
            ),
            None,
            vec![],
        );
        let start = Instant::now();
        let give_up_at = start + Duration::from_millis(350);
        let got = l
            .deliver(&report, Path::new("/nonexistent"), give_up_at)
            .await;
        assert_eq!(got, Delivery::Undelivered);
        assert!(start.elapsed() >= Duration::from_millis(200), "retried");
        match l.renew(Instant::now() + Duration::from_millis(300)).await {
            Renewal::Failed(_) => {}
            other => panic!("an unreachable coordinator is a failure to retry: {other:?}"),
        }
    }
}
