//! What an attempt waits for before its job starts (`exclusive: true`, `cooldown`), as the
//! coordinator stores it with each job and hands it to the agent in the lease, and what the
//! wait was (reported back with the attempt's end).

use serde::{Deserialize, Serialize};

/// Longest wait for an exclusive attempt's GPUs to empty when the spec gives no
/// `cooldown.max_wait`: past it the attempt fails with `gpu_busy`.
pub const DEFAULT_EXCLUSIVE_WAIT_MS: u64 = 10 * 60 * 1000;

/// A job's pre-start rules, resolved from its spec.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Prestart {
    /// Start only once the job's GPUs hold no process at all (foreign ones included), and
    /// place nothing else there while it runs.
    #[serde(default)]
    pub exclusive: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown: Option<Cooldown>,
}

impl Prestart {
    /// Whether the job needs a GPU to itself: an exclusive job, and a cooling one (the GPU
    /// must stay idle while it cools, so the simplest honest rule holds it for the whole
    /// attempt).
    pub fn holds_gpu(&self) -> bool {
        self.exclusive || self.cooldown.is_some()
    }

    /// `None` for a job that starts at once (nothing to store).
    pub fn into_option(self) -> Option<Self> {
        (self != Self::default()).then_some(self)
    }

    /// The bound on waiting for the GPUs to empty: the cooldown's `max_wait`, or the
    /// default.
    pub fn empty_wait_ms(&self) -> u64 {
        match &self.cooldown {
            Some(Cooldown::UntilTemp { max_wait_ms, .. }) => *max_wait_ms,
            _ => DEFAULT_EXCLUSIVE_WAIT_MS,
        }
    }
}

/// How an attempt cools its GPUs before its job starts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cooldown {
    /// Idle this long.
    Seconds { ms: u64 },
    /// Until every GPU of the attempt reads at most `temp_c`, at most `max_wait_ms`.
    UntilTemp {
        temp_c: f64,
        max_wait_ms: u64,
        on_timeout: OnCooldownTimeout,
    },
}

/// What an attempt does when its GPUs are not cool by `max_wait`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnCooldownTimeout {
    /// Fail the attempt with the failure class `cooldown_timeout` (retried only when
    /// `retry.on` lists it).
    #[default]
    Fail,
    /// Start the job anyway; the attempt records `cooldown_timed_out: true`.
    Start,
}

/// What an attempt's pre-start wait was, reported with its end.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PrestartReport {
    /// Time spent waiting for the GPUs to hold no process (exclusive attempts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_wait_ms: Option<u64>,
    /// Time spent cooling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_wait_ms: Option<u64>,
    /// The hottest GPU of the attempt when cooling began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_from_temp_c: Option<f64>,
    /// The hottest GPU of the attempt when cooling ended (the job's start temperature
    /// unless the wait failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_start_temp_c: Option<f64>,
    /// `max_wait` passed before the GPUs were cool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_timed_out: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_job_that_waits_stores_its_rules() {
        assert_eq!(Prestart::default().into_option(), None);
        let p = Prestart {
            exclusive: false,
            cooldown: Some(Cooldown::Seconds { ms: 1000 }),
        };
        assert!(p.holds_gpu());
        assert_eq!(p.empty_wait_ms(), DEFAULT_EXCLUSIVE_WAIT_MS);
        let json = serde_json::to_string(&p).expect("json");
        assert_eq!(
            json,
            r#"{"exclusive":false,"cooldown":{"kind":"seconds","ms":1000}}"#
        );
        assert_eq!(serde_json::from_str::<Prestart>(&json).expect("back"), p);
    }
}
