//! The supervisor's self-fence: its job is stopped when the lease deadline its agent last
//! pushed passes (the agent dead, wedged or cut off from the coordinator), before the
//! coordinator may give the job to another node. The agent pushes the deadline after every
//! renewed heartbeat (`agent::self_fence` says when it falls).

use std::time::Duration;

use tokio::time::Instant;

/// When the supervisor stops its job unless the agent pushes the deadline again.
#[derive(Debug)]
pub struct SelfFence {
    deadline: Instant,
}

impl SelfFence {
    /// A deadline `stop_in` from now (the launch carries the first).
    pub fn new(stop_in: Duration) -> Self {
        Self {
            deadline: Instant::now() + stop_in,
        }
    }

    /// A renewal from the agent: the deadline is `stop_in` from now, earlier or later than
    /// the one before (the agent's own fence moved).
    pub fn renew(&mut self, stop_in: Duration) {
        self.deadline = Instant::now() + stop_in;
    }

    /// The supervisor renewed the lease itself: the fence falls at `until` (never earlier
    /// than it already does: a renewal's answer may come after the agent's).
    pub fn extend_to(&mut self, until: Instant) {
        self.deadline = self.deadline.max(until);
    }

    /// When the job is stopped unless renewed.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// Whether the fence falls within `within` of now, on the paused clock.
    async fn falls_within(fence: &SelfFence, within: Duration) -> bool {
        tokio::time::timeout(within, tokio::time::sleep_until(fence.deadline()))
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_renewal_the_job_is_stopped_at_the_deadline_and_not_before() {
        let start = Instant::now();
        let fence = SelfFence::new(S(17));
        assert!(!falls_within(&fence, S(17) - Duration::from_millis(1)).await);
        tokio::time::sleep_until(fence.deadline()).await;
        assert_eq!(start.elapsed(), S(17));
    }

    #[tokio::test(start_paused = true)]
    async fn each_renewal_counts_from_its_arrival() {
        let start = Instant::now();
        let mut fence = SelfFence::new(S(17));
        tokio::time::sleep(S(10)).await;
        fence.renew(S(17));
        assert!(
            !falls_within(&fence, S(16)).await,
            "renewed at 10 s: due at 27 s"
        );
        tokio::time::sleep_until(fence.deadline()).await;
        assert_eq!(start.elapsed(), S(27));
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_renewal_brings_the_deadline_in() {
        let start = Instant::now();
        let mut fence = SelfFence::new(S(17));
        tokio::time::sleep(S(5)).await;
        fence.renew(S(2));
        tokio::time::sleep_until(fence.deadline()).await;
        assert_eq!(start.elapsed(), S(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_already_past_is_due_at_once() {
        let fence = SelfFence::new(Duration::ZERO);
        assert!(falls_within(&fence, Duration::from_millis(1)).await);
    }
}
