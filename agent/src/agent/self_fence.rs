//! Self-fencing: how an agent cut off from the coordinator paces its heartbeats and when it
//! stops its own attempts, so that they are dead before the coordinator may expire their
//! leases and give the jobs to another node.
//!
//! The coordinator renews a lease when it *receives* a heartbeat, which is after the agent
//! sent it: counted from the moment of sending, the lease surely lasts `ttl`. Within that,
//! the agent must notice (heartbeats and their timeouts included), stop the attempt
//! (SIGTERM, the kill grace, SIGKILL) and keep a margin for clocks and the kill itself.

use std::time::Duration;

use tokio::time::Instant;

/// The heartbeat and fencing schedule for one lease TTL and kill grace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SelfFenceBudget {
    pub ttl: Duration,
    /// Time between heartbeats when they succeed.
    pub every: Duration,
    /// Time between heartbeats after a failure.
    pub retry: Duration,
    /// Longest a heartbeat request is waited for before a fresh one is tried. As long as the
    /// fence itself: the fence fires at its deadline whatever requests are in flight, and a
    /// request dropped early may be dropped by the coordinator too (it would not renew).
    pub request_timeout: Duration,
    /// Counted from the *sending* of the last renewed heartbeat: when the agent stops every
    /// attempt it runs. `fence_after + kill grace + margin = ttl`.
    pub fence_after: Duration,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelfFenceError {
    #[error(
        "--kill-grace {grace:?} does not fit --lease-ttl {ttl:?}: an agent cut off from the \
         coordinator must stop its jobs, kill grace included, before their leases expire and \
         another node may start them; with --lease-ttl {ttl:?} the kill grace can be at most \
         {max:?} (or raise --lease-ttl to at least {min_ttl:?})"
    )]
    GraceTooLong {
        grace: Duration,
        ttl: Duration,
        max: Duration,
        min_ttl: Duration,
    },
    #[error("--lease-ttl must be at least 300ms, got {0:?}")]
    TtlTooShort(Duration),
}

/// Part of the TTL kept between the death of the attempt and the lease's expiry: the
/// SIGKILL and its reaping, and clock rate differences between agent and coordinator.
const MARGIN_DIVISOR: u32 = 10;
/// Heartbeats per TTL.
const BEATS_PER_TTL: u32 = 3;

impl SelfFenceBudget {
    /// The schedule for `ttl` and `kill_grace`, or why the guarantee cannot hold: the agent
    /// must be able to send at least one regular heartbeat before it would fence itself.
    pub fn new(ttl: Duration, kill_grace: Duration) -> Result<Self, SelfFenceError> {
        if ttl < Duration::from_millis(300) {
            return Err(SelfFenceError::TtlTooShort(ttl));
        }
        let every = ttl / BEATS_PER_TTL;
        let margin = ttl / MARGIN_DIVISOR;
        // grace <= ttl - every - margin, i.e. ttl >= grace / (1 - 1/3 - 1/10).
        let max = ttl - every - margin;
        if kill_grace > max {
            let min_ttl = kill_grace.mul_f64(
                f64::from(BEATS_PER_TTL * MARGIN_DIVISOR)
                    / f64::from(BEATS_PER_TTL * MARGIN_DIVISOR - MARGIN_DIVISOR - BEATS_PER_TTL),
            );
            return Err(SelfFenceError::GraceTooLong {
                grace: kill_grace,
                ttl,
                max,
                min_ttl: round_up_ms(min_ttl),
            });
        }
        Ok(Self {
            ttl,
            every,
            retry: (every / 3).min(Duration::from_secs(1)),
            request_timeout: ttl - kill_grace - margin,
            fence_after: ttl - kill_grace - margin,
        })
    }

    /// When attempts must be stopped if no heartbeat sent at or after `renewed` (the sending
    /// time of the last one the coordinator answered) is answered.
    pub fn deadline(&self, renewed: Instant) -> Instant {
        renewed + self.fence_after
    }

    /// Longest the coordinator may take to answer a heartbeat sent on time before the
    /// agent fences itself: the next one leaves `every` after the last answered one.
    pub fn answer_within(&self) -> Duration {
        self.fence_after.saturating_sub(self.every)
    }
}

fn round_up_ms(d: Duration) -> Duration {
    Duration::from_millis(
        u64::try_from(d.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn attempts_are_dead_before_the_lease_can_expire() {
        for (ttl, grace) in [(30, 10), (30, 0), (10, 4), (5, 1), (2, 0), (30, 17)] {
            let b = SelfFenceBudget::new(S(ttl), S(grace)).expect("fits");
            assert!(
                b.fence_after + S(grace) < S(ttl),
                "ttl {ttl} grace {grace}: {b:?} too late"
            );
            // The agent gets to renew at least once before fencing itself.
            assert!(b.fence_after >= b.every, "ttl {ttl} grace {grace}: {b:?}");
            assert!(b.request_timeout <= b.fence_after);
        }
    }

    /// The figures the README gives for how slow an answer may be.
    #[test]
    fn an_answer_may_take_7_s_by_default_and_a_quarter_second_at_a_1_s_ttl() {
        let default = SelfFenceBudget::new(S(30), S(10)).expect("fits");
        assert_eq!(default.answer_within(), S(7));
        let short = SelfFenceBudget::new(S(1), Duration::from_millis(300)).expect("fits");
        assert_eq!(short.answer_within().as_millis(), 266);
    }

    #[test]
    fn no_floor_pushes_the_fence_past_the_grace() {
        // The old `ttl/3` floor fenced at 10 s with a 25 s grace of a 30 s TTL: dead at 35 s.
        let err = SelfFenceBudget::new(S(30), S(25)).expect_err("cannot hold");
        assert!(matches!(err, SelfFenceError::GraceTooLong { .. }));
    }

    #[test]
    fn a_grace_as_long_as_the_ttl_is_refused_naming_both_settings() {
        let err = SelfFenceBudget::new(S(10), S(10)).expect_err("cannot hold");
        let msg = err.to_string();
        assert!(
            msg.contains("--kill-grace 10s") && msg.contains("--lease-ttl 10s"),
            "{msg}"
        );
        let SelfFenceError::GraceTooLong { max, min_ttl, .. } = err else {
            panic!("{err:?}")
        };
        // The advice given holds.
        assert!(SelfFenceBudget::new(S(10), max).is_ok());
        assert!(SelfFenceBudget::new(min_ttl, S(10)).is_ok(), "{min_ttl:?}");
    }
}
