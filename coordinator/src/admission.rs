//! Claims take turns at the store: at most a bound of claim rounds read and lease at once
//! on a replica, the others waiting their turn in arrival order, so that however many agents
//! claim together, heartbeats, starts and ends (which are not bounded) find a database
//! connection without queueing behind hundreds of claims: a fleet larger than its
//! coordinators can serve waits longer for new work, not for its leases' renewals. A claim
//! that waits past [`Admission::wait`] for its first turn is answered `503 busy` (with
//! `Retry-After`) and its agent claims again after its backoff; nothing was leased to it.
//! `headroom_claims_in_turn` and `headroom_claims_waiting` show the turns on `/metrics`.
//!
//! Claims wait in order rather than being refused at once past the bound: refused at once,
//! a fleet's retries, each on its own backoff, starve some agents for a minute while others
//! are let in (`bench/README.md`, 2026-12-02).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The default bound: three quarters of the PostgreSQL store's pool (16 connections), so a
/// quarter of the connections is always left to what keeps runs going.
pub const DEFAULT_CLAIMS: usize = 12;
/// The default longest wait for a turn: well within the time an agent gives a claim's
/// answer beyond its long-poll (15 s), and long enough that under a fleet's sustained
/// overload few claims are sent back to wait again (at 5 s, about 3,500 were in a minute
/// of 1,000 agents', and a claim's p99 from its first try was 40 s: `bench/README.md`).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// A claim that did not get its turn in time.
#[derive(Debug, thiserror::Error)]
#[error(
    "the coordinator is busy: {limit} claims at once and this one waited {waited:?} for its \
     turn; try again"
)]
pub struct Busy {
    pub limit: usize,
    pub waited: Duration,
}

/// The turns; cheap to clone.
#[derive(Clone, Debug)]
pub struct Admission {
    /// `None`: no bound (`--max-claims 0`).
    turns: Option<Arc<Semaphore>>,
    limit: usize,
    wait: Duration,
    /// Claim rounds waiting for a turn now.
    waiting: Arc<AtomicUsize>,
}

impl Admission {
    /// At most `limit` claim rounds at once, each waiting at most `wait` for its turn; a
    /// `limit` of 0 bounds nothing.
    pub fn new(limit: usize, wait: Duration) -> Self {
        Self {
            turns: (limit > 0).then(|| Arc::new(Semaphore::new(limit))),
            limit,
            wait,
            waiting: Arc::default(),
        }
    }

    /// The longest a claim waits for its turn before it is answered busy.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// A claim round's turn, waited for at most `within` and held until the returned guard
    /// is dropped; turns are given in the order they were asked for.
    pub async fn claim_turn(&self, within: Duration) -> Result<Turn, Busy> {
        let Some(turns) = &self.turns else {
            return Ok(Turn { _permit: None });
        };
        // Counted while it waits, however the wait ends (a turn, the time, the request
        // dropped).
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waited = Waiting(&self.waiting);
        match tokio::time::timeout(within, turns.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Turn {
                _permit: Some(permit),
            }),
            // The semaphore is never closed; read as a turn not given all the same.
            Ok(Err(_)) | Err(_) => Err(Busy {
                limit: self.limit,
                waited: within,
            }),
        }
    }

    /// Claim rounds that hold a turn now.
    pub fn claiming(&self) -> usize {
        self.turns
            .as_ref()
            .map_or(0, |t| self.limit - t.available_permits())
    }

    /// Claim rounds waiting for a turn now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

/// Counts a claim round out of the waiting ones when its wait ends.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A claim round's turn; the next waiting claim's when dropped.
#[derive(Debug)]
pub struct Turn {
    _permit: Option<OwnedSemaphorePermit>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn claims_take_turns_in_order_and_one_that_waits_too_long_is_busy() {
        let a = Admission::new(2, Duration::from_secs(5));
        let first = a.claim_turn(a.wait()).await.expect("a turn");
        let _second = a.claim_turn(a.wait()).await.expect("a turn");
        assert_eq!(a.claiming(), 2);
        let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        for n in [3, 4] {
            let (a, order_tx) = (a.clone(), order_tx.clone());
            tokio::spawn(async move {
                let turn = a.claim_turn(a.wait()).await;
                order_tx.send((n, turn.is_ok())).expect("send");
                // Held until the test ends.
                std::future::pending::<()>().await;
                drop(turn);
            });
            // The third asks before the fourth.
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(a.waiting(), 2);
        assert!(
            order.try_recv().is_err(),
            "both wait while the two turns are held"
        );
        drop(first);
        assert_eq!(
            order.recv().await,
            Some((3, true)),
            "the first to ask goes first"
        );
        // The fourth's wait runs out: busy, never a turn.
        assert_eq!(order.recv().await, Some((4, false)));
        assert_eq!(a.waiting(), 0, "neither waits any more");
        let busy = a
            .claim_turn(a.wait())
            .await
            .expect_err("still every turn held");
        assert_eq!((busy.limit, busy.waited), (2, Duration::from_secs(5)));
    }

    /// A first round waits a turn, and then the store's wait for a connection, before it
    /// reads: the agent's client waits longer than both beyond the long-poll, so a claim's
    /// answer, and the leases in it, is not given up on while the coordinator still works.
    #[test]
    fn a_claim_s_client_waits_out_its_turn_and_a_connection() {
        for wait_ms in [0, 500, 25_000] {
            let needed =
                Duration::from_millis(wait_ms) + DEFAULT_WAIT + crate::store::postgres::POOL_WAIT;
            assert!(
                headroom_shared::client::claim_timeout(wait_ms) > needed,
                "{wait_ms} ms"
            );
        }
    }

    #[tokio::test]
    async fn a_bound_of_zero_bounds_nothing() {
        let a = Admission::new(0, Duration::ZERO);
        let mut held = Vec::new();
        for _ in 0..1000 {
            held.push(a.claim_turn(a.wait()).await.expect("unbounded"));
        }
        assert_eq!(a.claiming(), 0);
    }
}
