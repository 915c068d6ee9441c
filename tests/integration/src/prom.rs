//! Prometheus pages parsed by a real parser: the Python `prometheus_client` OpenMetrics
//! parser (`scripts/test` installs it into `target/py-venv` and sets `HEADROOM_TEST_PYTHON`),
//! so a page a scraper would reject fails the test.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// The interpreter that has `prometheus_client`.
pub const PYTHON_ENV: &str = "HEADROOM_TEST_PYTHON";

const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.append({"family": family.name, "type": family.type, "unit": family.unit,
                    "name": s.name, "labels": s.labels, "value": s.value})
json.dump(out, sys.stdout)
"#;

/// One sample of a parsed page.
#[derive(Clone, Debug, Deserialize)]
pub struct Sample {
    pub family: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub unit: String,
    pub name: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub value: f64,
}

/// The test tools' interpreter.
pub fn python() -> String {
    std::env::var(PYTHON_ENV).unwrap_or_else(|_| "python3".into())
}

/// Parses an OpenMetrics page; an error when the parser rejects it.
pub fn parse(page: &str) -> Result<Vec<Sample>> {
    let py = python();
    let mut child = Command::new(&py)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {py} (set {PYTHON_ENV}, or run scripts/test)"))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(page.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "the Prometheus parser ({py}) refused the page (is prometheus_client installed? \
             run scripts/test, or set {PYTHON_ENV}): {}\npage:\n{page}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The value of the sample `name` whose labels include `labels`.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

/// GETs a page over plain HTTP/1.1 (no client library between the test and the bytes).
pub fn fetch(url: &str) -> Result<String> {
    let resp = crate::block_on(async {
        headroom_shared::client::http_builder()
            .build()?
            .get(url)
            .send()
            .await?
            .error_for_status()?
            .text()
            .await
    })??;
    Ok(resp)
}
