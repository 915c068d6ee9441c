//! Retry pacing for every call the agent repeats (register, claim, finish): exponential
//! with a cap, and jitter so that many agents cut off together do not come back in step.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Exponential backoff: each delay doubles up to `cap`; the delay handed out is drawn in
/// `[d/2, d]` ("equal jitter"), so it never collapses to zero and never exceeds the cap.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    next: Duration,
    tries: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        let base = base.min(cap);
        Self {
            base,
            cap,
            next: base,
            tries: 0,
        }
    }

    /// The agent's usual pacing towards the coordinator: 100 ms doubling to 5 s.
    pub fn coordinator() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(5))
    }

    /// After a success: the next failure starts from the base delay again.
    pub fn reset(&mut self) {
        self.next = self.base;
        self.tries = 0;
    }

    /// Failures since the last reset.
    pub fn tries(&self) -> u32 {
        self.tries
    }

    /// The delay before the next try (jittered), advancing the sequence.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.cap);
        self.tries = self.tries.saturating_add(1);
        let half = d / 2;
        half + half.mul_f64(unit_random())
    }

    /// Sleeps the next delay; `false` when `cancel` fired first.
    pub async fn wait(&mut self, cancel: &CancellationToken) -> bool {
        self.wait_at_least(None, cancel).await
    }

    /// [`Backoff::wait`], for at least what the server asked (`Retry-After`), plus up to a
    /// quarter of it: agents turned away at one instant do not come back at one instant.
    pub async fn wait_at_least(
        &mut self,
        asked: Option<Duration>,
        cancel: &CancellationToken,
    ) -> bool {
        let mut d = self.next_delay();
        if let Some(asked) = asked {
            d = d.max(asked + (asked / 4).mul_f64(unit_random()));
        }
        tokio::select! {
            _ = cancel.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }
}

/// A number in `[0, 1)`: std's randomly keyed hasher is enough for jitter, without a crate.
fn unit_random() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_with_jitter_inside_each_step() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(800));
        for expected in [100, 200, 400, 800, 800, 800] {
            let d = b.next_delay();
            assert!(
                d >= ms(expected) / 2 && d <= ms(expected),
                "{d:?} outside [{}, {expected}] ms",
                expected / 2
            );
        }
        assert_eq!(b.tries(), 6);
        b.reset();
        assert!(b.next_delay() <= ms(100));
        assert_eq!(b.tries(), 1);
    }

    #[test]
    fn jitter_spreads_agents_apart() {
        let delays: std::collections::HashSet<Duration> = (0..20)
            .map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_delay())
            .collect();
        assert!(delays.len() > 1, "every agent would retry in step");
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_s_ask_to_wait_is_kept_past_a_shorter_delay() {
        let cancel = CancellationToken::new();
        let mut b = Backoff::coordinator();
        let asked = Duration::from_secs(1);
        for _ in 0..3 {
            let t0 = tokio::time::Instant::now();
            assert!(b.wait_at_least(Some(asked), &cancel).await);
            let waited = t0.elapsed();
            assert!(
                waited >= asked && waited <= asked + asked / 4,
                "{waited:?} for an ask of {asked:?}"
            );
        }
        // A longer delay of its own stands.
        let mut b = Backoff::new(Duration::from_secs(4), Duration::from_secs(4));
        let t0 = tokio::time::Instant::now();
        assert!(b.wait_at_least(Some(asked), &cancel).await);
        assert!(t0.elapsed() >= Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_stops_when_cancelled() {
        let cancel = CancellationToken::new();
        let mut b = Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
        assert!(b.wait(&cancel).await, "a plain wait completes");
        cancel.cancel();
        assert!(!b.wait(&cancel).await);
    }
}
