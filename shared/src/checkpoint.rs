//! `checkpoint: {signal: USR1, lead: 120s}`: the signal a job gets before headroom stops it
//! to run it again later (a timeout, a cancel with `--requeue`, a preemption), and how long
//! it has to save its state before the usual stop; and why a requeued attempt was stopped.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::field::{SpecError, parse_duration};

/// The signals a job may ask for: those a training script can catch to save and exit.
pub const SIGNALS: [&str; 6] = ["USR1", "USR2", "TERM", "INT", "HUP", "URG"];

/// The grace a job gets when its spec names a signal and no `lead`.
pub const DEFAULT_LEAD: Duration = Duration::from_secs(120);

/// `checkpoint`, as written in a spec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// `USR1` (default), `USR2`, `TERM`, `INT`, `HUP` or `URG`, with or without `SIG`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// How long before the stop the signal comes: `120s` (default), `5m`, or seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lead: Option<Value>,
}

/// A job's checkpoint signal, validated: what its agent sends, and how long before the stop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Checkpoint {
    /// The signal's name without `SIG` (`USR1`).
    pub signal: String,
    pub lead_ms: u64,
}

impl CheckpointSpec {
    /// The checkpoint it asks for; `timeout`: the job's, which the lead must leave time in.
    pub fn check(&self, timeout: Option<Duration>) -> Result<Checkpoint, SpecError> {
        let signal = match self.signal.as_deref().map(str::trim) {
            None => "USR1".to_string(),
            Some(s) => {
                let name = s.strip_prefix("SIG").unwrap_or(s).to_ascii_uppercase();
                if !SIGNALS.contains(&name.as_str()) {
                    return Err(SpecError::new(
                        "checkpoint.signal",
                        format!("`{s}` is not one of {}", SIGNALS.join(", ")),
                    ));
                }
                name
            }
        };
        let lead = parse_duration(self.lead.as_ref(), "checkpoint.lead")?.unwrap_or(DEFAULT_LEAD);
        if let Some(t) = timeout
            && lead >= t
        {
            return Err(SpecError::new(
                "checkpoint.lead",
                format!(
                    "{} leaves no run before the signal: it must be less than the timeout ({})",
                    humantime::format_duration(lead),
                    humantime::format_duration(t)
                ),
            ));
        }
        Ok(Checkpoint {
            signal,
            lead_ms: u64::try_from(lead.as_millis()).unwrap_or(u64::MAX),
        })
    }
}

/// Why headroom stops a running attempt to run its job again later. The job is requeued
/// without spending one of its `max_attempts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Requeue {
    /// A user asked (`headroom cancel --requeue`).
    Requeued,
    /// A user under their share, or a job of higher priority, needs the memory it holds.
    Preempted,
}

impl Requeue {
    pub fn as_str(self) -> &'static str {
        match self {
            Requeue::Requeued => "requeued",
            Requeue::Preempted => "preempted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Requeue::Requeued, Requeue::Preempted]
            .into_iter()
            .find(|r| r.as_str() == s)
    }

    /// The failure class of the attempt it stopped.
    pub fn class(self) -> crate::FailureClass {
        match self {
            Requeue::Requeued => crate::FailureClass::Requeued,
            Requeue::Preempted => crate::FailureClass::Preempted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(signal: Option<&str>, lead: Option<Value>) -> CheckpointSpec {
        CheckpointSpec {
            signal: signal.map(str::to_string),
            lead,
        }
    }

    #[test]
    fn a_checkpoint_names_a_catchable_signal_and_a_lead_within_the_timeout() {
        let c = spec(None, None).check(None).expect("defaults");
        assert_eq!((c.signal.as_str(), c.lead_ms), ("USR1", 120_000));
        let c = spec(Some("SIGusr2"), Some(json!("30s")))
            .check(Some(Duration::from_secs(60)))
            .expect("usr2");
        assert_eq!((c.signal.as_str(), c.lead_ms), ("USR2", 30_000));
        let e = spec(Some("KILL"), None).check(None).expect_err("refused");
        assert_eq!(e.field, "checkpoint.signal");
        let e = spec(None, Some(json!("2m")))
            .check(Some(Duration::from_secs(120)))
            .expect_err("refused");
        assert_eq!(e.field, "checkpoint.lead");
        let e = spec(None, Some(json!(0))).check(None).expect_err("refused");
        assert_eq!(e.field, "checkpoint.lead");
    }

    #[test]
    fn a_requeue_reads_back_as_written_and_has_its_class() {
        for r in [Requeue::Requeued, Requeue::Preempted] {
            assert_eq!(Requeue::parse(r.as_str()), Some(r));
            assert_eq!(r.class().as_str(), r.as_str());
        }
        assert_eq!(Requeue::parse("cancelled"), None);
    }
}
