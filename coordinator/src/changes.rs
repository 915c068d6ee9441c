//! Change notification: a version counter that long-polls (claims, progress, log follows)
//! wait on, so work is dispatched the moment it appears instead of on a polling tick.

use std::time::Duration;

use tokio::sync::watch;

#[derive(Clone)]
pub struct Changes {
    tx: watch::Sender<u64>,
}

impl Default for Changes {
    fn default() -> Self {
        Self {
            tx: watch::Sender::new(0),
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

    /// Waits until the version differs from `seen` or `timeout` passes; returns the version.
    pub async fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        let mut rx = self.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|v| *v != seen)).await;
        *rx.borrow()
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
}
