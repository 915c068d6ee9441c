//! Where an experiment's jobs run from, as its submitter's client recorded it: the working
//! directory, the state of its code (git, a snapshot bundle) and the Python environment.
//! Sent with a submission, stored per experiment, shown by `show`, the API and the export,
//! and given to each lease.

use serde::{Deserialize, Serialize};

use super::bounds;

/// The repository state of the working directory at submit (nothing when it is not a git
/// checkout).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GitState {
    /// `HEAD`'s commit (hex).
    pub commit: String,
    /// The branch checked out; `None` on a detached `HEAD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Whether tracked files differ from `HEAD` or untracked files (not ignored) exist.
    pub dirty: bool,
    /// SHA-256 (hex) of the uncommitted changes (`git diff HEAD --binary`, then each
    /// untracked file's path and content); `None` when clean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_hash: Option<String>,
}

/// A Python environment activated for the job on its node: its `bin` first on `PATH`, and
/// `VIRTUAL_ENV` or `CONDA_PREFIX`/`CONDA_DEFAULT_ENV` set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Environment {
    /// A venv's directory (absolute).
    Venv(String),
    /// A conda environment: its name (looked up on the node), or its prefix (absolute).
    Conda(String),
}

impl Environment {
    /// The field of a request or spec that names it (`environment.venv`).
    pub fn field(&self) -> &'static str {
        match self {
            Environment::Venv(_) => "environment.venv",
            Environment::Conda(_) => "environment.conda",
        }
    }

    /// Checks the form (an absolute path, or a conda environment's name).
    pub fn check(&self) -> Result<(), (String, String)> {
        let bad = |msg: String| Err((self.field().to_string(), msg));
        match self {
            Environment::Venv(p) if !is_absolute(p) => {
                bad(format!("`{p}` is not an absolute path"))
            }
            Environment::Conda(n) if !is_absolute(n) => bounds::CONDA_NAME.check(n).or_else(bad),
            Environment::Venv(_) | Environment::Conda(_) => Ok(()),
        }
    }
}

impl std::fmt::Display for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Environment::Venv(p) => write!(f, "venv {p}"),
            Environment::Conda(n) => write!(f, "conda {n}"),
        }
    }
}

/// Whence the environment a job runs with came.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EnvironmentFrom {
    /// The spec's `environment:`.
    Spec,
    /// The submitter's shell (its `VIRTUAL_ENV` or `CONDA_PREFIX`).
    Submitter,
}

/// The code bundle an experiment's jobs run from (`code: snapshot`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// SHA-256 (hex) of the bundle as uploaded (`PUT /v1/bundles/{hash}`).
    pub hash: String,
    /// The working directory within the bundle (`""`: its root, the repository's top).
    #[serde(default)]
    pub subdir: String,
    /// The bundle's size; set by the coordinator.
    #[serde(default)]
    pub bytes: u64,
}

/// Where an experiment's jobs run from, as stored and shown.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Source {
    /// The directory the jobs run in (absolute, on the node); `None`: the job user's home.
    /// With a snapshot, the directory it was taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitState>,
    /// The bundle the jobs run from instead of `workdir` (`code: snapshot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Environment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_from: Option<EnvironmentFrom>,
}

impl Source {
    pub fn is_empty(&self) -> bool {
        *self == Source::default()
    }
}

/// A bundle kept (`PUT /v1/bundles/{hash}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BundleStored {
    pub hash: String,
    pub bytes: u64,
    /// Whether it was new (`false`: one of that hash was kept already).
    pub stored: bool,
}

/// Checks what a submission says of its source, naming the field at fault.
pub fn check(
    workdir: Option<&str>,
    git: Option<&GitState>,
    snapshot: Option<&Snapshot>,
    environment: Option<&Environment>,
) -> Result<(), (String, String)> {
    let bad = |field: &str, msg: String| Err((field.to_string(), msg));
    if let Some(w) = workdir {
        if !is_absolute(w) {
            return bad(
                "workdir",
                format!(
                    "`{w}` is not an absolute path (a spec's relative `workdir` is resolved \
                     by the client, against the spec file's directory)"
                ),
            );
        }
        if w.contains('\0') || w.len() > 4096 {
            return bad("workdir", "holds a NUL byte or is over 4096 bytes".into());
        }
    }
    if let Some(g) = git {
        bounds::GIT_COMMIT
            .check(&g.commit)
            .or_else(|m| bad("git.commit", m))?;
        if let Some(h) = &g.diff_hash {
            bounds::SHA256
                .check(h)
                .or_else(|m| bad("git.diff_hash", m))?;
        }
        if let Some(b) = &g.branch
            && (b.is_empty() || b.len() > 255 || b.contains('\0'))
        {
            return bad("git.branch", "must be 1 to 255 bytes, no NUL".into());
        }
    }
    if let Some(s) = snapshot {
        bounds::SHA256
            .check(&s.hash)
            .or_else(|m| bad("snapshot.hash", m))?;
        if !is_relative_within(&s.subdir) {
            return bad(
                "snapshot.subdir",
                format!(
                    "`{}` is not a path inside the bundle (relative, no `..`)",
                    s.subdir
                ),
            );
        }
    }
    if let Some(e) = environment {
        e.check()?;
    }
    Ok(())
}

fn is_absolute(p: &str) -> bool {
    p.starts_with('/') && !p.contains('\0')
}

/// A relative path that stays inside its root: no leading `/`, no `..`, no NUL (`""` is
/// the root).
pub fn is_relative_within(p: &str) -> bool {
    !p.starts_with('/')
        && !p.contains('\0')
        && p.split('/').all(|seg| seg != "..")
        && p.len() <= 4096
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_checked_field_by_field() {
        let field = |r: Result<(), (String, String)>| r.expect_err("refused").0;
        assert_eq!(field(check(Some("proj"), None, None, None)), "workdir");
        let git = GitState {
            commit: "xyz".into(),
            branch: None,
            dirty: false,
            diff_hash: None,
        };
        assert_eq!(field(check(None, Some(&git), None, None)), "git.commit");
        let snap = Snapshot {
            hash: "a".repeat(64),
            subdir: "../etc".into(),
            bytes: 0,
        };
        assert_eq!(
            field(check(None, None, Some(&snap), None)),
            "snapshot.subdir"
        );
        let env = Environment::Conda("bad name!".into());
        assert_eq!(
            field(check(None, None, None, Some(&env))),
            "environment.conda"
        );
        let env = Environment::Venv(".venv".into());
        assert_eq!(
            field(check(None, None, None, Some(&env))),
            "environment.venv"
        );
        let good = Snapshot {
            hash: "0f".repeat(32),
            subdir: "train/sub".into(),
            bytes: 0,
        };
        assert!(
            check(
                Some("/home/a/proj"),
                None,
                Some(&good),
                Some(&Environment::Conda("torch-2.4".into()))
            )
            .is_ok()
        );
    }

    #[test]
    fn an_environment_reads_as_its_kind_and_value() {
        let e: Environment = serde_json::from_str(r#"{"venv": "/p/.venv"}"#).expect("venv");
        assert_eq!(e, Environment::Venv("/p/.venv".into()));
        assert_eq!(e.to_string(), "venv /p/.venv");
        assert!(serde_json::from_str::<Environment>(r#"{"pip": "x"}"#).is_err());
    }
}
