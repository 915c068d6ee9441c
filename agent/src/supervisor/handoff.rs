//! An attempt's end handed to the agent and not yet known to be reported: the supervisor
//! keeps it until the agent shows it reported it, and reports it itself when the agent goes
//! first (killed between the end and its report, never to come back within the lease).
//!
//! The agent reports an end, takes it out of the journal, and only then lets the supervisor
//! go (drops the connection) or gives it the next launch. So when the connection ends with
//! the end still in the journal, the agent went before reporting it.

use std::path::PathBuf;
use std::time::Duration;

use headroom_shared::AttemptId;
use headroom_shared::api::FinishReport;
use tokio::time::Instant;

use super::direct::{Delivery, DirectLink};
use super::proto::{Conn, ToSupervisor};
use crate::outcomes::Outcomes;

/// How long a supervisor whose attempt ended waits at least for its agent to report the
/// end and let it go, beyond the lease's own deadline.
const AGENT_REPORT_WAIT: Duration = Duration::from_secs(30);

pub(super) struct Handoff {
    pub(super) attempt: AttemptId,
    pub(super) report: FinishReport,
    /// The attempt's log, shipped before the end is reported.
    pub(super) log: PathBuf,
    pub(super) direct: DirectLink,
    pub(super) journal: Outcomes,
    /// Past it, a report that does not go through is left to the journal.
    pub(super) give_up_at: Instant,
}

impl Handoff {
    /// Reports the end unless the agent did: its journal entry is gone once it has.
    pub(super) async fn settle(mut self) {
        if !self.journal.holds(self.attempt) {
            return;
        }
        tracing::warn!(attempt = %self.attempt, "the agent went before reporting the end: reporting it");
        match self
            .direct
            .deliver(&self.report, &self.log, self.give_up_at)
            .await
        {
            Delivery::Undelivered => {}
            Delivery::Delivered | Delivery::Refused => {
                if let Err(e) = self.journal.discard(self.attempt) {
                    tracing::warn!(attempt = %self.attempt, "cannot clear the journalled outcome: {e}");
                }
            }
        }
    }

    /// Waits for the agent to let this supervisor go (no launch follows: the connection
    /// ends), then settles; past the lease's deadline and [`AGENT_REPORT_WAIT`], the journal
    /// is left to the agent's next run.
    pub(super) async fn wait_for_release(self, conn: &mut Conn) {
        let until = self.give_up_at.max(Instant::now() + AGENT_REPORT_WAIT);
        let released = async {
            // Nothing is sent after an end but by mistake: read past it.
            while let Ok(Some(_)) = conn.recv::<ToSupervisor>().await {}
        };
        if tokio::time::timeout_at(until, released).await.is_ok() {
            self.settle().await;
        } else {
            tracing::warn!(attempt = %self.attempt, "the agent has not reported the end yet: left in the journal for it");
        }
    }
}
