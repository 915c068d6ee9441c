//! Command templates: `{name}` placeholders (`{{`/`}}` literal braces), how a parameter
//! value reads as text, and a command rendered with a job's parameters.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::field::SpecError;

/// Placeholders every spec may use besides its parameters.
pub const BUILTIN_PLACEHOLDERS: &[&str] = &["run", "config"];

/// The placeholder names in one argv entry; `{{` and `}}` are literal braces.
pub fn placeholders(arg: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    render_with(arg, |name| {
        out.push(name.to_string());
        Some(String::new())
    })?;
    Ok(out)
}

/// Replaces each `{name}` by `lookup(name)`; errors on unbalanced braces or unknown names.
pub fn render_with(
    arg: &str,
    mut lookup: impl FnMut(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(arg.len());
    let mut chars = arg.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(ch) => name.push(ch),
                        None => return Err(format!("`{{{name}` has no closing `}}`")),
                    }
                }
                let name = name.trim();
                if name.is_empty() {
                    return Err("empty placeholder `{}`".into());
                }
                let value = lookup(name)
                    .ok_or_else(|| format!("placeholder {{{name}}} names no parameter"))?;
                out.push_str(&value);
            }
            '}' => return Err("`}` without an opening `{` (write `}}` for a literal)".into()),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// How a parameter value reads on a command line and in `HP_<NAME>`.
pub fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Renders a command template with a job's parameters (also after the OOM ladder changed
/// them): `{param}`, `{run}`, `{config}`; values shell-quoted when `shell`.
pub fn render(
    command: &[String],
    shell: bool,
    params: &BTreeMap<String, Value>,
    config: u32,
    run: u32,
) -> Result<Vec<String>, SpecError> {
    let lookup = |name: &str| -> Option<String> {
        let text = match name {
            "run" => run.to_string(),
            "config" => config.to_string(),
            _ => value_text(params.get(name)?),
        };
        Some(if shell {
            shlex::try_quote(&text)
                .map(|q| q.into_owned())
                .unwrap_or(text)
        } else {
            text
        })
    };
    let mut argv = Vec::with_capacity(command.len());
    for (i, arg) in command.iter().enumerate() {
        argv.push(render_with(arg, lookup).map_err(|m| SpecError {
            field: format!("command[{i}]"),
            message: m,
        })?);
    }
    if shell {
        Ok(vec!["sh".into(), "-c".into(), argv.join(" ")])
    } else {
        Ok(argv)
    }
}
