//! `headroom submit`: a spec read, where its jobs run from worked out and checked
//! ([`crate::source`]), its code bundle uploaded where it asks for one, and the
//! submission sent, its jobs followed with `--wait`.

use std::collections::BTreeMap;

use anyhow::{Context, Result, anyhow, bail};
use headroom_shared::api::source::{Environment, GitState, Snapshot};
use headroom_shared::api::{SubmitRequest, VariantSource};
use headroom_shared::study;

use crate::client::Api;
use crate::output::{self, Format};
use crate::source;

/// Reads a spec file (YAML or JSON) into the JSON document the API takes; `rows: FILE.csv`
/// (relative to the spec; in a study's variants too) is read here and sent inline.
pub fn read_spec(file: &std::path::Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut spec: serde_json::Value = serde_saphyr::from_str(&text)
        .map_err(|e| anyhow!("{}: not valid YAML/JSON: {e}", file.display()))?;
    inline_rows(&mut spec, file, "rows")?;
    if let Some(variants) = spec
        .get_mut(study::VARIANTS_KEY)
        .and_then(|v| v.as_array_mut())
    {
        for (i, v) in variants.iter_mut().enumerate() {
            inline_rows(v, file, &format!("{}[{i}].rows", study::VARIANTS_KEY))?;
        }
    }
    Ok(spec)
}

/// `rows: FILE.csv` of `spec` (a spec or a variant) read and put inline.
fn inline_rows(spec: &mut serde_json::Value, file: &std::path::Path, field: &str) -> Result<()> {
    let Some(name) = spec
        .get("rows")
        .and_then(|r| r.as_str())
        .map(str::to_string)
    else {
        return Ok(());
    };
    let path = file
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join(&name);
    let csv = std::fs::read_to_string(&path)
        .with_context(|| format!("{field}: reading {}", path.display()))?;
    let rows = rows_of_csv(&csv).map_err(|e| anyhow!("{field}: {}: {e}", path.display()))?;
    spec["rows"] = serde_json::Value::Array(rows);
    Ok(())
}

/// A rows file: a header of parameter names, then one configuration a line. A cell reads as
/// an integer, a number, `true`/`false`, or else text; an empty one is refused.
pub fn rows_of_csv(text: &str) -> Result<Vec<serde_json::Value>, String> {
    let mut r = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let header: Vec<String> = r
        .headers()
        .map_err(|e| e.to_string())?
        .iter()
        .map(str::to_string)
        .collect();
    if header.iter().all(String::is_empty) {
        return Err("no header line of parameter names".into());
    }
    let mut rows = Vec::new();
    for (i, rec) in r.records().enumerate() {
        // Line numbers as an editor shows them: the header is line 1.
        let line = i + 2;
        let rec = rec.map_err(|e| format!("line {line}: {e}"))?;
        let mut row = serde_json::Map::new();
        for (name, cell) in header.iter().zip(rec.iter()) {
            if cell.is_empty() {
                return Err(format!("line {line}: `{name}` is empty"));
            }
            let value = if let Ok(n) = cell.parse::<i64>() {
                n.into()
            } else if let Some(x) = cell.parse::<f64>().ok().filter(|x| x.is_finite()) {
                x.into()
            } else {
                match cell {
                    "true" => true.into(),
                    "false" => false.into(),
                    _ => cell.into(),
                }
            };
            row.insert(name.clone(), value);
        }
        rows.push(serde_json::Value::Object(row));
    }
    if rows.is_empty() {
        return Err("no row under the header".into());
    }
    Ok(rows)
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

/// Where one spec's (or variant's) jobs run from, as this client resolves it.
#[derive(Clone, Debug, PartialEq)]
struct Resolved {
    workdir: std::path::PathBuf,
    git: Option<GitState>,
    environment: Option<Environment>,
    snapshot: Option<Snapshot>,
}

/// What resolving sources needs besides the spec, shared by a study's variants: a bundle
/// and a repository state are taken once per directory.
struct Resolver<'a> {
    api: &'a Api,
    file: &'a std::path::Path,
    local: bool,
    dry_run: bool,
    table: bool,
    unix_user: Option<String>,
    vars: BTreeMap<String, String>,
    bundles: BTreeMap<std::path::PathBuf, Snapshot>,
    /// Each directory's repository state (a few `git` runs), read once.
    gits: BTreeMap<std::path::PathBuf, Option<GitState>>,
    /// The directories the note on shared file systems was printed for.
    noted: std::collections::BTreeSet<std::path::PathBuf>,
}

impl Resolver<'_> {
    async fn resolve(&mut self, spec: &serde_json::Value) -> Result<Resolved> {
        let workdir = source::workdir(spec, self.file, self.local)?;
        let snapshot = spec.get("code").and_then(|c| c.as_str()) == Some("snapshot");
        // On the nodes' own host, a directory the jobs' user may not enter is known now (a
        // snapshot runs from its own copy, which that user unpacks).
        if self.local
            && !snapshot
            && let Some(user) = &self.unix_user
        {
            source::enterable_by(&workdir, user)?;
        }
        let environment = source::environment(spec, self.file, &self.vars, self.local)?;
        let git = self
            .gits
            .entry(workdir.clone())
            .or_insert_with(|| source::git_state(&workdir))
            .clone();
        let mut bundle = None;
        if snapshot && !self.dry_run {
            if let Some(b) = self.bundles.get(&workdir) {
                bundle = Some(b.clone());
            } else {
                let b = source::bundle(&workdir, headroom_shared::bundle::DEFAULT_MAX_BYTES)?;
                let stored = self
                    .api
                    .put_bundle(&b.hash, b.bytes)
                    .await
                    .context("uploading the code bundle")?;
                if self.table {
                    eprintln!(
                        "code bundle {} ({}) of {}",
                        &b.hash[..12],
                        bytesize::ByteSize::b(stored.bytes).display().iec(),
                        workdir.display()
                    );
                }
                let snap = Snapshot {
                    hash: b.hash,
                    subdir: b.subdir,
                    bytes: 0,
                };
                self.bundles.insert(workdir.clone(), snap.clone());
                bundle = Some(snap);
            }
        } else if !snapshot && !self.local && self.table && self.noted.insert(workdir.clone()) {
            eprintln!(
                "note: the jobs run in {} on the nodes, which must have it (a shared file \
                 system); `--snapshot` ships the code instead",
                workdir.display()
            );
        }
        Ok(Resolved {
            workdir,
            git,
            environment,
            snapshot: bundle,
        })
    }
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
    let mut resolver = Resolver {
        api,
        file,
        local,
        dry_run,
        table: format == Format::Table,
        unix_user: if local {
            api.whoami().await?.unix_user
        } else {
            None
        },
        vars: std::env::vars().collect(),
        bundles: BTreeMap::new(),
        gits: BTreeMap::new(),
        noted: Default::default(),
    };
    let top = resolver.resolve(&spec).await?;
    // A study's variants with a source of their own (another `workdir`, `environment` or
    // `code`) say so; the others run from the top's.
    let mut variants = BTreeMap::new();
    if let (Some(list), Some(top_map)) = (
        spec.get(study::VARIANTS_KEY).and_then(|v| v.as_array()),
        spec.as_object(),
    ) {
        let defaults = study::defaults(top_map);
        for v in list {
            let (Some(name), Some(over)) = (v.get("name").and_then(|n| n.as_str()), v.as_object())
            else {
                continue; // the coordinator refuses it, naming the field
            };
            let merged = serde_json::Value::Object(study::merged(&defaults, over));
            let own = resolver
                .resolve(&merged)
                .await
                .with_context(|| format!("{}: variant `{name}`", study::VARIANTS_KEY))?;
            if own != top {
                variants.insert(
                    name.to_string(),
                    VariantSource {
                        workdir: Some(own.workdir.display().to_string()),
                        git: own.git,
                        snapshot: own.snapshot,
                        environment: own.environment,
                    },
                );
            }
        }
    }
    let req = SubmitRequest {
        spec,
        seed,
        dry_run,
        workdir: Some(top.workdir.display().to_string()),
        git: top.git,
        snapshot: top.snapshot,
        environment: top.environment,
        variants,
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
    if let Some(study) = resp.study {
        if format == Format::Table {
            output::study_submitted(&resp, study);
        }
        if !wait {
            return Ok(0);
        }
        // Every variant followed to its end; the exit code is the worst of them.
        let mut rc = 0;
        for v in &resp.variants {
            if let Some(exp) = v.experiment {
                let r = output::wait(
                    api,
                    Some(exp),
                    Some(v.name.clone()),
                    format == Format::Table,
                )
                .await?;
                rc = rc.max(r);
            }
        }
        return Ok(rc);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rows_file_reads_typed_cells_and_refuses_gaps_naming_the_line() {
        let rows =
            rows_of_csv("model, lr, bs, amp\nresnet20, 0.1, 32, true\nvgg16, 1e-3, 64, false\n")
                .expect("rows");
        assert_eq!(
            rows,
            [
                serde_json::json!({"model": "resnet20", "lr": 0.1, "bs": 32, "amp": true}),
                serde_json::json!({"model": "vgg16", "lr": 0.001, "bs": 64, "amp": false}),
            ]
        );
        let e = rows_of_csv("model,lr\nresnet20,0.1\nvgg16\n").expect_err("short line");
        assert!(e.contains("line 3"), "{e}");
        let e = rows_of_csv("model,lr\nresnet20,\n").expect_err("empty cell");
        assert!(e.contains("line 2: `lr` is empty"), "{e}");
        assert!(rows_of_csv("model,lr\n").is_err(), "no rows");
    }

    #[test]
    fn a_spec_s_rows_file_is_read_beside_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("pairs.csv"), "fg,bg\na,b\nc,d\n").expect("csv");
        let spec = dir.path().join("spec.yaml");
        std::fs::write(
            &spec,
            "name: p\ncommand: [run, '{fg}', '{bg}']\nrows: pairs.csv\n",
        )
        .expect("spec");
        let v = read_spec(&spec).expect("read");
        assert_eq!(
            v["rows"],
            serde_json::json!([{"fg": "a", "bg": "b"}, {"fg": "c", "bg": "d"}])
        );
        std::fs::write(&spec, "name: p\ncommand: [run]\nrows: missing.csv\n").expect("spec");
        let e = read_spec(&spec).expect_err("missing");
        assert!(format!("{e:#}").contains("rows: reading"), "{e:#}");
    }
}
