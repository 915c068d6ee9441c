//! Change notification: a version counter that long-polls (claims, progress, log follows)
//! wait on, so work is dispatched the moment it appears instead of on a polling tick.

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
pub struct Changes {
    tx: watch::Sender<u64>,
    /// Set when the server drains: waiters return at once so long-polls are answered.
    closing: CancellationToken,
}

impl Default for Changes {
    fn default() -> Self {
        Self {
            tx: watch::Sender::new(0),
            closing: CancellationToken::new(),
        }
    }
}

impl Changes {
    /// Something changed: wake every waiter.
    pub fn bump(&self) {
        self.tx.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn version(&self) -> u64 {
        *self.tx.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    /// Waits until the version differs from `seen`, `timeout` passes or the server drains;
    /// returns the version.
    pub async fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        let mut rx = self.subscribe();
        tokio::select! {
            _ = tokio::time::timeout(timeout, rx.wait_for(|v| *v != seen)) => {}
            _ = self.closing.cancelled() => {}
        }
        *rx.borrow()
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
}
