//! Change notification: version counters that long-polls (claims, progress, log follows)
//! wait on, so work is dispatched the moment it appears instead of on a polling tick. Every
//! change moves one counter, the one watchers wait on. Claims wait on two others: work for
//! every node (jobs queued or requeued, a plan, a cancel) wakes them at once; capacity freed
//! on one node (an end) wakes that node's claim at once and the others only a moment later,
//! once per moment however many ends come in it (an end may teach an estimate that lets a
//! job fit elsewhere). A job's start or another node's lease wakes no claim.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a committed transaction changed, for who waits on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing anyone waits on.
    None,
    /// Something watchers show (a job started, leased, a sample stored), nothing a claim
    /// could act on.
    Shown,
    /// Capacity or memory freed on this node (an attempt ended, a quarantine lifted):
    /// work for its claim, and perhaps for others (an end teaches its memory key).
    Freed(String),
    /// Work for any node's claim: jobs queued or requeued, a plan changed, a cancel asked.
    Work,
}

impl Change {
    /// `Work` when `yes`, else `None`.
    pub fn work_if(yes: bool) -> Self {
        if yes { Change::Work } else { Change::None }
    }

    /// `Freed(node)` when `yes`, else `None`.
    pub fn freed_if(yes: bool, node: &str) -> Self {
        if yes {
            Change::Freed(node.to_string())
        } else {
            Change::None
        }
    }
}

/// The counters, with when the first last moved and the gap before that. One value, so a
/// claim reads all its counters at one instant.
#[derive(Clone, Debug)]
struct Stamp {
    version: u64,
    work: u64,
    /// Capacity freed, per node.
    freed_on: Arc<HashMap<String, u64>>,
    at: Instant,
    gap: Duration,
}

impl Stamp {
    fn seen(&self, node: Option<&str>) -> WorkSeen {
        WorkSeen {
            work: self.work,
            freed: self.freed_on.values().fold(0, |a, n| a.wrapping_add(*n)),
            own: node.map(|n| self.freed_on.get(n).copied().unwrap_or(0)),
        }
    }
}

/// What a claim saw of the counters before it read the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkSeen {
    work: u64,
    freed: u64,
    /// `None`: its node not known yet.
    own: Option<u64>,
}

impl WorkSeen {
    /// Whether `now` holds what wakes this claim at once: work for every node, or capacity
    /// freed on its own.
    pub fn at_once(&self, now: &WorkSeen) -> bool {
        let own_freed = matches!((self.own, now.own), (Some(a), Some(b)) if a != b);
        self.work != now.work || own_freed
    }

    /// Whether `now` holds capacity freed on some node (another's wakes it a moment later).
    pub fn freed(&self, now: &WorkSeen) -> bool {
        self.freed != now.freed
    }
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
                freed_on: Arc::default(),
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
            match change {
                Change::Work => s.work = s.work.wrapping_add(1),
                Change::Freed(node) => {
                    let n = Arc::make_mut(&mut s.freed_on).entry(node).or_default();
                    *n = n.wrapping_add(1);
                }
                Change::None | Change::Shown => {}
            }
            s.gap = now.saturating_duration_since(s.at);
            s.at = now;
        });
    }

    /// The count of every change.
    pub fn version(&self) -> u64 {
        self.tx.borrow().version
    }

    /// `seen`, taken before its claim knew its node, completed with `node`'s count; `None`
    /// when some node's end came since (it may have been this node's: the claim looks
    /// again).
    pub fn with_node(&self, seen: WorkSeen, node: &str) -> Option<WorkSeen> {
        let now = self.tx.borrow().seen(Some(node));
        (now.freed == seen.freed).then_some(WorkSeen {
            own: now.own,
            ..seen
        })
    }

    /// The work counters as a claim for `node` sees them (`None`: its node not known yet;
    /// see [`Self::with_node`]).
    pub fn work_seen(&self, node: Option<&str>) -> WorkSeen {
        self.tx.borrow().seen(node)
    }

    /// Waits until work for every node or capacity freed on `node` comes (then at once),
    /// capacity freed elsewhere came `others_after` ago, `timeout` passes or the server
    /// drains.
    pub async fn wait_for_work(
        &self,
        node: &str,
        seen: WorkSeen,
        timeout: Duration,
        others_after: Duration,
    ) {
        let deadline = Instant::now() + timeout;
        let mut rx = self.tx.subscribe();
        let mut due = deadline;
        loop {
            let now = rx.borrow_and_update().seen(Some(node));
            if seen.at_once(&now) {
                return;
            }
            if seen.freed(&now) {
                due = due.min(Instant::now() + others_after);
            }
            if Instant::now() >= due || self.closing.is_cancelled() {
                return;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = tokio::time::sleep_until(due) => return,
                _ = self.closing.cancelled() => return,
            }
        }
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
        c.bump(Change::Shown);
        assert_eq!(waiter.await.ok(), Some(v + 1));
        c.bump(Change::None);
        assert_eq!(c.version(), v + 1, "no change moves nothing");
    }

    /// The time a claim of `node` waited for the changes `then` makes, from what it saw
    /// knowing its node or not.
    async fn waited_from(
        c: &Changes,
        node: &'static str,
        known: bool,
        then: impl FnOnce(&Changes),
    ) -> Duration {
        let seen = c.work_seen(known.then_some(node));
        let c2 = c.clone();
        let t = Instant::now();
        let claim = tokio::spawn(async move {
            c2.wait_for_work(
                node,
                seen,
                Duration::from_secs(20),
                Duration::from_millis(200),
            )
            .await;
            t.elapsed()
        });
        tokio::task::yield_now().await;
        then(c);
        claim.await.unwrap_or(Duration::MAX)
    }

    async fn waited(c: &Changes, node: &'static str, then: impl FnOnce(&Changes)) -> Duration {
        waited_from(c, node, true, then).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_wakes_at_once_for_work_and_its_node_s_ends_later_for_others_and_never_for_starts()
     {
        let c = Changes::default();
        let v = c.version();
        let shown = waited(&c, "a", |c| {
            c.bump(Change::Shown);
            c.bump(Change::Shown);
        })
        .await;
        assert_eq!(
            shown,
            Duration::from_secs(20),
            "starts and leases wake no claim"
        );
        assert_eq!(c.version(), v + 2, "watchers see them");

        let work = waited(&c, "a", |c| c.bump(Change::Work)).await;
        assert_eq!(work, Duration::ZERO, "queued work: at once");
        let own = waited(&c, "a", |c| c.bump(Change::Freed("a".into()))).await;
        assert_eq!(own, Duration::ZERO, "its own node's end: at once");

        // Another node's ends: one wake a moment after the first, however many come.
        let c2 = c.clone();
        let ends = tokio::spawn(async move {
            for _ in 0..50 {
                c2.bump(Change::Freed("b".into()));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let other = waited(&c, "a", |_| {}).await;
        assert_eq!(
            other,
            Duration::from_millis(200),
            "another node's ends: once, later"
        );
        ends.await.ok();

        // A claim that looked before it knew its node: its node's end counts as another's
        // (it did not wake it at once for every end there had ever been).
        c.bump(Change::Freed("a".into()));
        let unknown = waited_from(&c, "a", false, |_| {}).await;
        assert_eq!(unknown, Duration::from_secs(20), "nothing new: it waits");
        let unknown = waited_from(&c, "a", false, |c| c.bump(Change::Freed("a".into()))).await;
        assert_eq!(unknown, Duration::from_millis(200));

        // Work while another node's end is being gathered still wakes at once.
        let c2 = c.clone();
        let mixed = waited(&c, "a", move |c| {
            c.bump(Change::Freed("b".into()));
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                c2.bump(Change::Work);
            });
        })
        .await;
        assert_eq!(mixed, Duration::from_millis(50));
    }

    #[test]
    fn a_claim_that_learns_its_node_looks_again_when_an_end_came_meanwhile() {
        let c = Changes::default();
        c.bump(Change::Freed("a".into()));
        let before = c.work_seen(None);
        let seen = c.with_node(before, "a").expect("no end since");
        assert!(
            !seen.at_once(&c.work_seen(Some("a"))),
            "the earlier end is not new"
        );
        c.bump(Change::Freed("a".into()));
        assert!(
            seen.at_once(&c.work_seen(Some("a"))),
            "a later one wakes it"
        );
        c.bump(Change::Freed("b".into()));
        assert_eq!(
            c.with_node(before, "a"),
            None,
            "an end during its round: look again"
        );
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
