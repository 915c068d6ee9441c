//! `headroom submit`: a spec read, where its jobs run from worked out and checked
//! ([`crate::source`]), its code bundle uploaded where it asks for one, and the
//! submission sent, its jobs followed with `--wait`.

use anyhow::{Context, Result, anyhow, bail};
use headroom_shared::api::SubmitRequest;

use crate::client::Api;
use crate::output::{self, Format};
use crate::source;

/// Reads a spec file (YAML or JSON) into the JSON document the API takes.
pub fn read_spec(file: &std::path::Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    serde_saphyr::from_str(&text)
        .map_err(|e| anyhow!("{}: not valid YAML/JSON: {e}", file.display()))
}

/// How `submit` goes about it (its flags).
pub struct SubmitHow {
    pub wait: bool,
    pub dry_run: bool,
    pub seed: Option<u64>,
    /// `--snapshot`: as the spec's `code: snapshot`.
    pub snapshot: bool,
    pub format: Format,
}

pub async fn submit(api: &Api, file: &std::path::Path, how: SubmitHow) -> Result<i32> {
    let SubmitHow {
        wait,
        dry_run,
        seed,
        snapshot,
        format,
    } = how;
    let mut spec = read_spec(file)?;
    if snapshot && let Some(o) = spec.as_object_mut() {
        o.insert("code".into(), "snapshot".into());
    }
    let local = source::is_local(api.base());
    let workdir = source::workdir(&spec, file, local)?;
    let snapshot = spec.get("code").and_then(|c| c.as_str()) == Some("snapshot");
    // On the nodes' own host, a directory the jobs' user may not enter is known now (a
    // snapshot runs from its own copy, which that user unpacks).
    if local
        && !snapshot
        && let Some(user) = api.whoami().await?.unix_user
    {
        source::enterable_by(&workdir, &user)?;
    }
    if !local && !snapshot && format == Format::Table {
        eprintln!(
            "note: the jobs run in {} on the nodes, which must have it (a shared file system); \
             `--snapshot` ships the code instead",
            workdir.display()
        );
    }
    let vars: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let environment = source::environment(&spec, file, &vars, local)?;
    let git = source::git_state(&workdir);
    let mut bundle = None;
    if snapshot && !dry_run {
        let b = source::bundle(&workdir, headroom_shared::bundle::DEFAULT_MAX_BYTES)?;
        let stored = api
            .put_bundle(&b.hash, b.bytes)
            .await
            .context("uploading the code bundle")?;
        if format == Format::Table {
            eprintln!(
                "code bundle {} ({}) of {}",
                &b.hash[..12],
                bytesize::ByteSize::b(stored.bytes).display().iec(),
                workdir.display()
            );
        }
        bundle = Some(headroom_shared::api::source::Snapshot {
            hash: b.hash,
            subdir: b.subdir,
            bytes: 0,
        });
    }
    let req = SubmitRequest {
        spec,
        seed,
        dry_run,
        workdir: Some(workdir.display().to_string()),
        git,
        snapshot: bundle,
        environment,
    };
    let resp = api
        .submit(&req)
        .await
        .with_context(|| format!("{} was refused", file.display()))?;
    if format == Format::Json {
        output::json(&resp)?;
    } else {
        output::warnings(&resp);
    }
    if dry_run {
        if format == Format::Table {
            output::preview(&resp);
        }
        return Ok(0);
    }
    let Some(exp) = resp.experiment else {
        bail!("the coordinator stored nothing");
    };
    if format == Format::Table {
        outln!(
            "submitted experiment {} ({}): {} jobs, seed {}",
            resp.name,
            exp,
            resp.jobs,
            resp.seed
        );
    }
    if wait {
        return output::wait(api, Some(exp), Some(resp.name), format == Format::Table).await;
    }
    Ok(0)
}
