//! Change notification: version counters that long-polls (claims, progress, log follows)
//! wait on, so work is dispatched the moment it appears instead of on a polling tick. Every
//! change moves one counter; a change that may give a claim something to do (work queued,
//! capacity freed, a plan or a cancel) moves a second one too, the only one claims wait on:
//! a job's start or another node's lease wakes watchers, not every idle agent's claim.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a committed transaction changed, for who waits on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// Nothing anyone waits on.
    None,
    /// Something watchers show (a job started, leased, a sample stored), nothing a claim
    /// could act on.
    Shown,
    /// Something a claim may act on: jobs queued or requeued, capacity or memory freed, a
    /// plan changed, a cancel asked. Shown too.
    Work,
}

impl Change {
    /// `Work` when `yes`, else `None`.
    pub fn work_if(yes: bool) -> Self {
        if yes { Change::Work } else { Change::None }
    }
}

/// The counters, with when the first last moved and the gap before that.
#[derive(Clone, Copy, Debug)]
struct Stamp {
    version: u64,
    work: u64,
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
                work: 0,
                at: Instant::now(),
                gap: Duration::MAX,
            }),
            closing: CancellationToken::new(),
        }
    }
}

impl Changes {
    /// Something changed: wake the waiters it concerns.
    pub fn bump(&self, change: Change) {
        if change == Change::None {
            return;
        }
        self.tx.send_modify(|s| {
            let now = Instant::now();
            s.version = s.version.wrapping_add(1);
            if change == Change::Work {
                s.work = s.work.wrapping_add(1);
            }
            s.gap = now.saturating_duration_since(s.at);
            s.at = now;
        });
    }

    /// The count of every change.
    pub fn version(&self) -> u64 {
        self.tx.borrow().version
    }

    /// The count of changes a claim may act on.
    pub fn work_version(&self) -> u64 {
        self.tx.borrow().work
    }

    /// Waits until the version differs from `seen`, `timeout` passes or the server drains;
    /// returns the version.
    pub async fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        self.wait(timeout, |s| s.version != seen).await.version
    }

    /// Waits until the count of work changes differs from `seen`, `timeout` passes or the
    /// server drains; returns that count.
    pub async fn wait_for_work(&self, seen: u64, timeout: Duration) -> u64 {
        self.wait(timeout, |s| s.work != seen).await.work
    }

    async fn wait(&self, timeout: Duration, past: impl FnMut(&Stamp) -> bool) -> Stamp {
        let mut rx = self.tx.subscribe();
        tokio::select! {
            _ = tokio::time::timeout(timeout, rx.wait_for(past)) => {}
            _ = self.closing.cancelled() => {}
        }
        *rx.borrow()
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
        c.bump(Change::Shown);
        assert_eq!(waiter.await.ok(), Some(v + 1));
        c.bump(Change::None);
        assert_eq!(c.version(), v + 1, "no change moves nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_waits_through_changes_it_cannot_act_on() {
        let c = Changes::default();
        let (v, w) = (c.version(), c.work_version());
        let c2 = c.clone();
        let claim =
            tokio::spawn(async move { c2.wait_for_work(w, Duration::from_secs(3600)).await });
        tokio::task::yield_now().await;
        c.bump(Change::Shown);
        c.bump(Change::Shown);
        tokio::task::yield_now().await;
        assert!(!claim.is_finished(), "a shown change woke a claim");
        assert_eq!(c.version(), v + 2, "watchers see both");
        c.bump(Change::Work);
        assert_eq!(claim.await.ok(), Some(w + 1));
        assert_eq!(c.version(), v + 3, "work is shown too");
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
        c.bump(Change::Work);
        assert!(!c.in_a_run(gap), "a change after a quiet second is alone");
        tokio::time::sleep(Duration::from_millis(2)).await;
        c.bump(Change::Shown);
        assert!(c.in_a_run(gap), "2 ms after the last");
        tokio::time::sleep(Duration::from_millis(25)).await;
        assert!(
            c.in_a_run(gap),
            "still the run's last change until another comes"
        );
        c.bump(Change::Shown);
        assert!(!c.in_a_run(gap), "25 ms after the last: a new start");
    }
}
