//! Change notification: a version counter that long-polls (claims, progress, log follows)
//! wait on, so work is dispatched the moment it appears instead of on a polling tick.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The counter, with when it last moved and the gap before that.
#[derive(Clone, Copy, Debug)]
struct Stamp {
    version: u64,
    at: Instant,
    gap: Duration,
}

#[derive(Clone)]
pub struct Changes {
    tx: watch::Sender<Stamp>,
    /// Set when the server drains: waiters return at once so long-polls are answered.
    closing: CancellationToken,
}

impl Default for Changes {
    fn default() -> Self {
        Self {
            tx: watch::Sender::new(Stamp {
                version: 0,
                at: Instant::now(),
                gap: Duration::MAX,
            }),
            closing: CancellationToken::new(),
        }
    }
}

impl Changes {
    /// Something changed: wake every waiter.
    pub fn bump(&self) {
        self.tx.send_modify(|s| {
            let now = Instant::now();
            s.version = s.version.wrapping_add(1);
            s.gap = now.saturating_duration_since(s.at);
            s.at = now;
        });
    }

    pub fn version(&self) -> u64 {
        self.tx.borrow().version
    }

    /// Waits until the version differs from `seen`, `timeout` passes or the server drains;
    /// returns the version.
    pub async fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        let mut rx = self.tx.subscribe();
        tokio::select! {
            _ = tokio::time::timeout(timeout, rx.wait_for(|s| s.version != seen)) => {}
            _ = self.closing.cancelled() => {}
        }
        rx.borrow().version
    }

    /// The last change came less than `gap` after the one before it: changes come in a run
    /// (a matrix draining), and a watcher that wants the state rather than every step to it
    /// (a progress bar) may wait a moment for the rest.
    pub fn in_a_run(&self, gap: Duration) -> bool {
        self.tx.borrow().gap < gap
    }

    /// The server drains: answer every long-poll now, hold no new one open.
    pub fn close(&self) {
        self.closing.cancel();
    }

    /// Long-poll loops stop waiting once this is true.
    pub fn is_closing(&self) -> bool {
        self.closing.is_cancelled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waiters_wake_on_bump_and_time_out_otherwise() {
        let c = Changes::default();
        let v = c.version();
        assert_eq!(c.wait_past(v, Duration::from_secs(5)).await, v);
        let c2 = c.clone();
        let waiter = tokio::spawn(async move { c2.wait_past(v, Duration::from_secs(3600)).await });
        tokio::task::yield_now().await;
        c.bump();
        assert_eq!(waiter.await.ok(), Some(v + 1));
    }

    #[tokio::test(start_paused = true)]
    async fn closing_answers_waiters_at_once() {
        let c = Changes::default();
        let v = c.version();
        let c2 = c.clone();
        let waiter = tokio::spawn(async move { c2.wait_past(v, Duration::from_secs(3600)).await });
        tokio::task::yield_now().await;
        c.close();
        let t = tokio::time::Instant::now();
        assert_eq!(waiter.await.ok(), Some(v));
        assert!(c.is_closing());
        assert_eq!(c.wait_past(v, Duration::from_secs(3600)).await, v);
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn changes_close_together_are_a_run_and_a_pause_ends_it() {
        let gap = Duration::from_millis(20);
        let c = Changes::default();
        assert!(!c.in_a_run(gap), "no change yet");
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.bump();
        assert!(!c.in_a_run(gap), "a change after a quiet second is alone");
        tokio::time::sleep(Duration::from_millis(2)).await;
        c.bump();
        assert!(c.in_a_run(gap), "2 ms after the last");
        tokio::time::sleep(Duration::from_millis(25)).await;
        assert!(
            c.in_a_run(gap),
            "still the run's last change until another comes"
        );
        c.bump();
        assert!(!c.in_a_run(gap), "25 ms after the last: a new start");
    }
}
