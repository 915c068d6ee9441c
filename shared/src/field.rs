//! A refused field of a spec (`SpecError`: its dotted path and why), and the parsers of
//! field kinds every part of a spec uses.

use std::time::Duration;

use serde_json::Value;

/// A refused spec: the field (dotted path) and why.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

impl SpecError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Parses a timeout: seconds as a number or a `humantime` string; must be positive.
pub fn parse_timeout(v: Option<&Value>) -> Result<Option<Duration>, SpecError> {
    parse_duration(v, "timeout")
}

/// Parses a duration field: seconds as a number or a `humantime` string; must be positive.
pub fn parse_duration(v: Option<&Value>, field: &str) -> Result<Option<Duration>, SpecError> {
    let bad = |m: String| SpecError::new(field, m);
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let secs = n.as_f64().unwrap_or(f64::NAN);
            if !secs.is_finite() || secs <= 0.0 {
                return Err(bad(format!("must be a positive duration, got {n}")));
            }
            Duration::try_from_secs_f64(secs)
                .map(Some)
                .map_err(|_| bad(format!("{n} seconds is longer than any duration")))
        }
        Some(Value::String(s)) => {
            let t = s.trim();
            if t.starts_with('-') {
                return Err(bad(format!("must be a positive duration, got `{s}`")));
            }
            let d = humantime::parse_duration(t)
                .map_err(|e| bad(format!("`{s}` is not a duration like `2h` or `90s`: {e}")))?;
            if d.is_zero() {
                return Err(bad("must be more than 0".into()));
            }
            Ok(Some(d))
        }
        Some(_) => Err(bad(
            "write a duration like `2h` or a number of seconds".into()
        )),
    }
}
