//! `colocate`: a background job pinned to its foreground's GPU, started first; the
//! foreground starts once the background is ready. The spec part, its validation, and the
//! resolved form each job carries (rendered with the job's parameters).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::field::{SpecError, parse_duration};
use crate::size::MemSize;
use crate::template::{BUILTIN_PLACEHOLDERS, placeholders, render, value_text};

/// Default bound on the wait for the background to be ready.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(120);

/// The spec's `colocate` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ColocateSpec {
    /// The background's argv template (same placeholders as `command`).
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub command: Vec<String>,
    /// Run `command` joined by spaces through `sh -c`, values shell-quoted.
    #[serde(default)]
    pub shell: bool,
    /// Added to the job's variables for the background only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The background's GPU memory (`8GiB`), or `{param}` naming a grid axis whose values are
    /// sizes: placement needs the foreground's estimate plus this on one GPU.
    pub memory: String,
    /// When the background counts as ready; default: its first GPU memory is seen.
    #[serde(default)]
    pub ready: Option<ReadySpec>,
    /// Longest wait for readiness (`2m`, or seconds); default 2 minutes.
    #[serde(default)]
    pub start_timeout: Option<Value>,
    /// What a background that exits while the foreground runs does to the attempt.
    #[serde(default)]
    pub on_background_exit: OnBackgroundExit,
    /// Only jobs whose parameters have these values get the background (the others run
    /// alone): `{mode: colocated}` makes "alone" vs "colocated" one matrix axis.
    #[serde(default)]
    pub when: BTreeMap<String, Value>,
}

/// `ready: {log: "regex"}`: ready when a line of the background's log matches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReadySpec {
    pub log: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnBackgroundExit {
    /// Stop the foreground and fail the attempt (`background_exited`).
    #[default]
    Fail,
    /// Let the foreground run on; the attempt records `background_exited_early`.
    Flag,
}

/// A job's background, resolved: what the agent runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Background {
    pub argv: Vec<String>,
    /// Over the job's variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub memory_mib: u64,
    /// Regex over the background's log lines; `None`: ready at its first GPU memory.
    #[serde(default)]
    pub ready_log: Option<String>,
    pub start_timeout_ms: u64,
    #[serde(default)]
    pub on_exit: OnBackgroundExit,
}

impl ColocateSpec {
    /// Checks the section; `params` are the spec's parameter names, `grid` its axes.
    pub fn validate(
        &self,
        params: &BTreeSet<&str>,
        grid: &BTreeMap<String, Vec<Value>>,
    ) -> Result<(), SpecError> {
        if self.command.is_empty() {
            return Err(SpecError::new(
                "colocate.command",
                "must hold at least the program",
            ));
        }
        if self.command[0].trim().is_empty() {
            return Err(SpecError::new(
                "colocate.command[0]",
                "the program is empty",
            ));
        }
        for (i, arg) in self.command.iter().enumerate() {
            let field = format!("colocate.command[{i}]");
            if arg.contains('\0') {
                return Err(SpecError::new(field, "holds a NUL byte"));
            }
            for name in placeholders(arg).map_err(|m| SpecError::new(&field, m))? {
                known_placeholder(&name, params, &field)?;
            }
        }
        for (key, value) in &self.env {
            let field = format!("colocate.env.{key}");
            if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
                return Err(SpecError::new(field, "not a valid variable"));
            }
            if key == "CUDA_VISIBLE_DEVICES" || key.starts_with("HEADROOM_") {
                return Err(SpecError::new(
                    field,
                    "set by the agent; a job cannot override it",
                ));
            }
        }
        match memory_axis(&self.memory).map_err(|m| SpecError::new("colocate.memory", m))? {
            None => {
                parse_memory(&self.memory).map_err(|m| SpecError::new("colocate.memory", m))?;
            }
            Some(axis) => {
                let values = grid.get(axis).ok_or_else(|| {
                    SpecError::new(
                        "colocate.memory",
                        format!(
                            "`{{{axis}}}` must name a grid or zip axis or a rows column whose \
                             values are sizes"
                        ),
                    )
                })?;
                for (i, v) in values.iter().enumerate() {
                    parse_memory(&value_text(v)).map_err(|m| {
                        SpecError::new("colocate.memory", format!("{axis}[{i}]: {m}"))
                    })?;
                }
            }
        }
        if let Some(ready) = &self.ready {
            regex_check(&ready.log).map_err(|m| SpecError::new("colocate.ready.log", m))?;
        }
        self.start_timeout()?;
        for (name, value) in &self.when {
            let field = format!("colocate.when.{name}");
            if !params.contains(name.as_str()) {
                return Err(SpecError::new(
                    field,
                    format!(
                        "`{name}` is not a parameter (grid, mutate or zip axis, or a rows column)"
                    ),
                ));
            }
            if matches!(value, Value::Null | Value::Array(_) | Value::Object(_)) {
                return Err(SpecError::new(
                    field,
                    "values are strings, numbers or booleans",
                ));
            }
        }
        Ok(())
    }

    pub fn start_timeout(&self) -> Result<Duration, SpecError> {
        Ok(
            parse_duration(self.start_timeout.as_ref(), "colocate.start_timeout")?
                .unwrap_or(DEFAULT_START_TIMEOUT),
        )
    }

    /// The background of the job with `params` (`None` when `when` leaves it out).
    pub fn resolve(
        &self,
        params: &BTreeMap<String, Value>,
        config: u32,
        run: u32,
    ) -> Result<Option<Background>, SpecError> {
        let applies = self.when.iter().all(|(k, v)| {
            params
                .get(k)
                .is_some_and(|p| value_text(p) == value_text(v))
        });
        if !applies {
            return Ok(None);
        }
        let argv = render(&self.command, self.shell, params, config, run)
            .map_err(|e| SpecError::new(format!("colocate.{}", e.field), e.message))?;
        let memory =
            match memory_axis(&self.memory).map_err(|m| SpecError::new("colocate.memory", m))? {
                Some(axis) => params.get(axis).map(value_text).unwrap_or_default(),
                None => self.memory.clone(),
            };
        let memory_mib = parse_memory(&memory).map_err(|m| SpecError::new("colocate.memory", m))?;
        Ok(Some(Background {
            argv,
            env: self.env.clone(),
            memory_mib,
            ready_log: self.ready.as_ref().map(|r| r.log.clone()),
            start_timeout_ms: u64::try_from(self.start_timeout()?.as_millis()).unwrap_or(u64::MAX),
            on_exit: self.on_background_exit,
        }))
    }
}

fn known_placeholder(name: &str, params: &BTreeSet<&str>, field: &str) -> Result<(), SpecError> {
    if params.contains(name) || BUILTIN_PLACEHOLDERS.contains(&name) {
        Ok(())
    } else {
        Err(SpecError::new(
            field,
            format!(
                "placeholder {{{name}}} names no parameter (grid, mutate or zip axis, or a rows column)"
            ),
        ))
    }
}

/// `Some(axis)` when `memory` is one whole placeholder `{axis}`; other placeholders are refused.
fn memory_axis(memory: &str) -> Result<Option<&str>, String> {
    let names = placeholders(memory)?;
    if names.is_empty() {
        return Ok(None);
    }
    let t = memory.trim();
    match t.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        Some(inner) if names.len() == 1 && !inner.contains(['{', '}']) => Ok(Some(inner.trim())),
        _ => Err("write a size (`8GiB`) or one placeholder (`{bg_memory}`)".into()),
    }
}

fn parse_memory(text: &str) -> Result<u64, String> {
    let size: MemSize = text
        .parse()
        .map_err(|e: crate::size::SizeError| e.to_string())?;
    if size.mib == 0 {
        return Err("must be more than 0".into());
    }
    Ok(size.mib)
}

/// The readiness pattern must compile in the agent: a small, bounded-size check here.
fn regex_check(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("an empty pattern matches any line; leave `ready` out instead".into());
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map(|_| ())
        .map_err(|e| format!("not a valid regex: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(memory: &str) -> ColocateSpec {
        ColocateSpec {
            command: vec!["bg".into(), "--mem={bg_mem}".into()],
            shell: false,
            env: BTreeMap::new(),
            memory: memory.into(),
            ready: None,
            start_timeout: None,
            on_background_exit: OnBackgroundExit::Fail,
            when: BTreeMap::from([("mode".to_string(), Value::from("colocated"))]),
        }
    }

    #[test]
    fn resolves_per_job_and_only_where_when_matches() {
        let s = spec("{bg_mem}");
        let mut params = BTreeMap::from([
            ("bg_mem".to_string(), Value::from("800MiB")),
            ("mode".to_string(), Value::from("colocated")),
        ]);
        let bg = s
            .resolve(&params, 0, 0)
            .expect("resolves")
            .expect("applies");
        assert_eq!(bg.argv, vec!["bg", "--mem=800MiB"]);
        assert_eq!(bg.memory_mib, 800);
        assert_eq!(bg.start_timeout_ms, 120_000);
        params.insert("mode".into(), Value::from("alone"));
        assert_eq!(s.resolve(&params, 0, 0).expect("resolves"), None);
    }

    #[test]
    fn memory_placeholders_are_one_grid_axis_of_sizes() {
        let params = BTreeSet::from(["bg_mem", "mode"]);
        let grid = BTreeMap::from([
            (
                "bg_mem".to_string(),
                vec![Value::from("800MiB"), Value::from(12)],
            ),
            ("mode".to_string(), vec![Value::from("colocated")]),
        ]);
        let e = spec("{bg_mem}")
            .validate(&params, &grid)
            .expect_err("12 has no unit");
        assert_eq!(e.field, "colocate.memory");
        assert!(e.message.contains("bg_mem[1]"), "{e}");
        let e = spec("{bg_mem}GiB")
            .validate(&params, &grid)
            .expect_err("not whole");
        assert_eq!(e.field, "colocate.memory");
    }
}
