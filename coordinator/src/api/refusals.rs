//! How refusals are logged: each one while they are few, then at most [`PER_SECOND`] a second
//! with a count of those left out, so that a flood of bad requests cannot fill a disk with
//! log lines or drown the rest (the refusals metric still counts every one).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusals logged per second at most.
pub const PER_SECOND: u32 = 20;

#[derive(Default)]
pub struct RefusalLog {
    window: Mutex<Option<Window>>,
}

struct Window {
    start: Instant,
    logged: u32,
    left_out: u64,
}

/// Whether to log a refusal now.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `left_out` refusals of the window before were not logged.
    Log { left_out: u64 },
    /// Count it as left out.
    Skip,
}

impl RefusalLog {
    pub fn admit(&self, now: Instant) -> Verdict {
        let mut guard = self
            .window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(w) = guard.as_mut()
            && now.duration_since(w.start) < Duration::from_secs(1)
        {
            return if w.logged < PER_SECOND {
                w.logged += 1;
                Verdict::Log { left_out: 0 }
            } else {
                w.left_out += 1;
                Verdict::Skip
            };
        }
        let left_out = guard.as_ref().map_or(0, |w| w.left_out);
        *guard = Some(Window {
            start: now,
            logged: 1,
            left_out: 0,
        });
        Verdict::Log { left_out }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_logged_a_few_lines_a_second_with_what_was_left_out() {
        let log = RefusalLog::default();
        let t0 = Instant::now();
        let verdicts: Vec<Verdict> = (0..1000).map(|_| log.admit(t0)).collect();
        let logged = verdicts.iter().filter(|v| **v != Verdict::Skip).count();
        assert_eq!(logged, PER_SECOND as usize);
        // The next second's first line says how many the last one left out.
        assert_eq!(
            log.admit(t0 + Duration::from_millis(1001)),
            Verdict::Log {
                left_out: 1000 - u64::from(PER_SECOND)
            }
        );
        assert_eq!(
            log.admit(t0 + Duration::from_millis(1002)),
            Verdict::Log { left_out: 0 }
        );
    }
}
