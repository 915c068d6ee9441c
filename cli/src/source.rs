//! What `submit` says of where the jobs run from: the working directory (the spec's
//! `workdir`, resolved against the spec file, else the current directory), the state of
//! its git repository, the submitter's Python environment, and with `code: snapshot` the
//! bundle of its code. What this host can tell is checked here, before anything is sent.
//! Runs `git` and reads files (blocking: the CLI's own thread).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};
use headroom_shared::api::source::{Environment, GitState};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A field of the submission that this host shows to be wrong.
fn refused(field: &str, msg: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("{field}: {msg}")
}

/// Where the jobs run, as absolute path: the spec's `workdir` (relative: to the spec
/// file's directory), else the current directory; `local`: whether this host is the
/// coordinator's (an absolute path elsewhere may be a node's own).
pub fn workdir(spec: &Value, spec_file: &Path, local: bool) -> Result<PathBuf> {
    let given = match spec.get("workdir") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => bail!(refused("workdir", "must be a path")),
    };
    let (dir, here) = match given {
        Some(w) if w.starts_with('/') => (PathBuf::from(w), local),
        Some(w) => {
            let base = spec_file
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            (base.join(w), true)
        }
        None => (
            std::env::current_dir().context("the current directory")?,
            true,
        ),
    };
    if !here {
        return Ok(dir);
    }
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => Ok(std::fs::canonicalize(&dir).unwrap_or(dir)),
        Ok(_) => Err(refused(
            "workdir",
            format!("{} is not a directory", dir.display()),
        )),
        Err(e) => Err(refused("workdir", format!("{}: {e}", dir.display()))),
    }
}

/// Whether `user` (the Unix user the jobs run as, on this host) may enter `dir`, by the
/// modes of it and the folders above it; why not, naming the folder.
pub fn enterable_by(dir: &Path, user: &str) -> Result<()> {
    let run_as = headroom_shared::api::RunAs {
        unix_user: user.to_string(),
        allow_root: true,
    };
    // A user this host does not know is the nodes' to resolve.
    let Ok(id) = headroom_agent::runas::resolve(&run_as) else {
        return Ok(());
    };
    match headroom_agent::runas::first_unsearchable(dir, &id) {
        None => Ok(()),
        Some(blocked) => Err(refused(
            "workdir",
            format!(
                "your jobs run as `{user}` here, who may not enter {}: it may not search (x) \
                 {blocked}. Open the folder to them, submit from a directory they may enter, \
                 or map your user to another Unix user (`headroom user create NAME --unix-user \
                 USER`)",
                dir.display()
            ),
        )),
    }
}

/// Runs `git` in `dir`; its output when it succeeds.
fn git(dir: &Path, args: &[&str]) -> Option<Vec<u8>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        // Read-only: no lock on the user's index.
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status.success().then_some(out.stdout)
}

fn git_text(dir: &Path, args: &[&str]) -> Option<String> {
    let out = git(dir, args)?;
    Some(String::from_utf8_lossy(&out).trim().to_string())
}

/// The repository's top, where `dir` is inside a git work tree.
pub fn repo_root(dir: &Path) -> Option<PathBuf> {
    git_text(dir, &["rev-parse", "--show-toplevel"])
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
}

/// Untracked files git does not ignore, relative to the top, sorted.
fn untracked(root: &Path) -> Vec<PathBuf> {
    let mut v = git(root, &["ls-files", "-z", "--others", "--exclude-standard"])
        .map(|out| split_paths(&out))
        .unwrap_or_default();
    v.sort();
    v
}

/// Paths of NUL-separated output, as the bytes say (a name need not be UTF-8).
fn split_paths(out: &[u8]) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    out.split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| PathBuf::from(std::ffi::OsStr::from_bytes(s)))
        .collect()
}

/// What is never bundled, whatever the ignore files say: headroom's own state (a data
/// directory such as `up`'s `.headroom` or an agent's `.headroom-agent` holds credentials),
/// its token files, git's folder and Python's caches.
fn never_bundled(path: &Path) -> bool {
    path.components().any(|c| {
        let name = c.as_os_str().to_string_lossy();
        name.starts_with(".headroom") || name == ".git" || name == "__pycache__"
    }) || path
        .file_name()
        .is_some_and(|n| n == "admin-token" || n == "agent-token" || n == "join-token")
}

/// The git state of `dir` (nothing when it is no repository or has no commit yet), as the
/// Python client records it too.
pub fn git_state(dir: &Path) -> Option<GitState> {
    let root = repo_root(dir)?;
    let commit = git_text(&root, &["rev-parse", "--verify", "-q", "HEAD"])?;
    let branch =
        git_text(&root, &["symbolic-ref", "-q", "--short", "HEAD"]).filter(|b| !b.is_empty());
    let status = git(
        &root,
        &["status", "--porcelain", "--untracked-files=normal"],
    )?;
    let dirty = !status.is_empty();
    let diff_hash = dirty.then(|| {
        let mut h = Sha256::new();
        h.update(
            git(
                &root,
                &[
                    "diff",
                    "HEAD",
                    "--binary",
                    "--no-ext-diff",
                    "--no-textconv",
                    "--no-color",
                ],
            )
            .unwrap_or_default(),
        );
        for path in untracked(&root) {
            h.update(path.as_os_str().as_encoded_bytes());
            h.update([0]);
            let p = root.join(&path);
            match std::fs::read_link(&p) {
                Ok(target) => h.update(target.as_os_str().as_encoded_bytes()),
                // Streamed: an untracked dataset is not read into memory.
                Err(_) => {
                    if let Ok(mut f) = std::fs::File::open(&p) {
                        use std::io::Read;
                        let mut buf = [0u8; 64 * 1024];
                        while let Ok(n) = f.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            h.update(&buf[..n]);
                        }
                    }
                }
            }
        }
        hex::encode(h.finalize())
    });
    Some(GitState {
        commit,
        branch,
        dirty,
        diff_hash,
    })
}

/// The environment the jobs run with: the spec's (a relative venv made absolute against
/// the spec file), else, unless it says `none`, the submitter's activated venv or conda
/// environment. On the coordinator's own host, a conda environment named here must exist.
pub fn environment(
    spec: &Value,
    spec_file: &Path,
    vars: &BTreeMap<String, String>,
    local: bool,
) -> Result<Option<Environment>> {
    let base = spec_file.parent().unwrap_or(Path::new("."));
    match spec.get("environment") {
        None | Some(Value::Null) => Ok(inherited(vars)),
        Some(Value::String(k)) if k == "inherit" => Ok(inherited(vars)),
        Some(Value::String(k)) if k == "none" => Ok(None),
        Some(v) => match serde_json::from_value::<Environment>(v.clone()) {
            Ok(Environment::Venv(p)) => {
                let p = absolute(base, &p);
                // An absolute venv elsewhere may be the nodes' own.
                if local && !p.join("bin").is_dir() {
                    bail!(refused(
                        "environment.venv",
                        format!("{} is not a venv here (it has no bin/)", p.display())
                    ));
                }
                Ok(Some(Environment::Venv(p.display().to_string())))
            }
            Ok(Environment::Conda(n)) if n.contains('/') => Ok(Some(Environment::Conda(
                absolute(base, &n).display().to_string(),
            ))),
            Ok(Environment::Conda(n)) => {
                if local {
                    let (found, looked) = find_conda(&n, vars);
                    if found.is_none() {
                        bail!(refused(
                            "environment.conda",
                            format!(
                                "no conda environment `{n}` on this host, which runs the jobs \
                                 (looked in {})",
                                looked.join(", ")
                            )
                        ));
                    }
                }
                Ok(Some(Environment::Conda(n)))
            }
            Err(_) => bail!(refused(
                "environment",
                "must be `inherit`, `none`, {venv: PATH} or {conda: NAME}"
            )),
        },
    }
}

fn absolute(base: &Path, p: &str) -> PathBuf {
    let p = base.join(p);
    std::fs::canonicalize(&p).unwrap_or(p)
}

fn inherited(vars: &BTreeMap<String, String>) -> Option<Environment> {
    let set = |k: &str| vars.get(k).filter(|v| v.starts_with('/')).cloned();
    set("VIRTUAL_ENV")
        .map(Environment::Venv)
        .or_else(|| set("CONDA_PREFIX").map(Environment::Conda))
}

/// A conda environment by name on this host (`headroom_agent::pyenv`, as a node looks).
fn find_conda(name: &str, vars: &BTreeMap<String, String>) -> (Option<PathBuf>, Vec<String>) {
    let (found, looked) = headroom_agent::pyenv::find_conda(
        name,
        vars.get("CONDA_EXE").map(String::as_str),
        vars.get("HOME").map(Path::new),
    );
    (
        found,
        looked.iter().map(|p| p.display().to_string()).collect(),
    )
}

/// A bundle of the code, and where the working directory is in it.
#[derive(Debug)]
pub struct Bundle {
    pub bytes: Vec<u8>,
    pub hash: String,
    pub subdir: String,
}

/// The bundle of `workdir`'s code: in a git work tree, the files git tracks (as they are
/// now) and the untracked ones it does not ignore, from the repository's top; elsewhere,
/// the directory less `.headroomignore`'s patterns, venvs and caches. Over `max` bytes:
/// refused, naming the largest files.
pub fn bundle(workdir: &Path, max: u64) -> Result<Bundle> {
    let (root, files) = match repo_root(workdir) {
        Some(root) => {
            let listed = git(
                &root,
                &[
                    "ls-files",
                    "-z",
                    "--cached",
                    "--others",
                    "--exclude-standard",
                ],
            )
            .ok_or_else(|| anyhow!("git ls-files failed in {}", root.display()))?;
            let files: Vec<PathBuf> = split_paths(&listed)
                .into_iter()
                .filter(|p| !never_bundled(p))
                // Submodules are listed as folders (a link to one is kept as the link).
                .filter(|p| !std::fs::symlink_metadata(root.join(p)).is_ok_and(|m| m.is_dir()))
                .collect();
            (root, files)
        }
        None => (workdir.to_path_buf(), walk(workdir)?),
    };
    let subdir = workdir
        .canonicalize()
        .unwrap_or_else(|_| workdir.to_path_buf())
        .strip_prefix(root.canonicalize().unwrap_or_else(|_| root.clone()))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let bytes = headroom_shared::bundle::make(&root, &files).map_err(|e| refused("snapshot", e))?;
    if bytes.len() as u64 > max {
        let mut sizes: Vec<(u64, &PathBuf)> = files
            .iter()
            .filter_map(|f| Some((std::fs::symlink_metadata(root.join(f)).ok()?.len(), f)))
            .collect();
        sizes.sort_by_key(|s| std::cmp::Reverse(s.0));
        let largest: Vec<String> = sizes
            .iter()
            .take(5)
            .map(|(n, f)| {
                format!(
                    "{} ({})",
                    f.display(),
                    bytesize::ByteSize::b(*n).display().iec()
                )
            })
            .collect();
        bail!(refused(
            "snapshot",
            format!(
                "the bundle of {} is {}, over the {} cap; leave large files out \
                 (.gitignore, or .headroomignore outside git). Largest: {}",
                root.display(),
                bytesize::ByteSize::b(bytes.len() as u64).display().iec(),
                bytesize::ByteSize::b(max).display().iec(),
                largest.join(", ")
            )
        ));
    }
    Ok(Bundle {
        hash: headroom_shared::bundle::hash(&bytes),
        bytes,
        subdir,
    })
}

/// The files of a directory that is no repository, relative to it.
fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    // A home or the root is no project: it would bundle everything of the user's.
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let canon = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    if canon == Path::new("/") || home.is_some_and(|h| h.canonicalize().ok() == Some(canon.clone()))
    {
        bail!(refused(
            "snapshot",
            format!(
                "{} is not a project's directory (a home or the root): submit from the project",
                dir.display()
            )
        ));
    }
    let mut files = Vec::new();
    let walker = ignore::WalkBuilder::new(dir)
        .standard_filters(false)
        // A `.gitignore` applies outside git too (`up`'s data directory holds one of `*`).
        .git_ignore(true)
        .require_git(false)
        .add_custom_ignore_filename(".headroomignore")
        .filter_entry(|e| {
            let is_dir = e.file_type().is_some_and(|t| t.is_dir());
            let venv = is_dir && e.path().join("pyvenv.cfg").exists();
            !(venv || never_bundled(Path::new(e.file_name())))
        })
        .build();
    for entry in walker {
        let entry = entry.map_err(|e| refused("snapshot", e))?;
        let kind = entry.file_type();
        if kind.is_some_and(|t| t.is_file() || t.is_symlink())
            && let Ok(rel) = entry.path().strip_prefix(dir)
        {
            files.push(rel.to_path_buf());
        }
    }
    Ok(files)
}

/// Whether the coordinator at `base` is on this host (what the jobs see is what this host
/// sees).
pub fn is_local(base: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(base) else {
        return false;
    };
    match url.host_str() {
        Some(h) => h == "localhost" || h == "[::1]" || h.starts_with("127."),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dir: &Path, args: &[&str]) {
        let ok = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .expect("git")
            .status
            .success();
        assert!(ok, "git {args:?}");
    }

    #[test]
    fn a_checkout_is_recorded_and_bundled_as_git_sees_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        run(d, &["init", "-q", "-b", "main"]);
        std::fs::write(d.join("train.py"), "print('v1')\n").expect("write");
        std::fs::write(d.join(".gitignore"), "out/\n").expect("write");
        std::fs::create_dir_all(d.join("sub")).expect("mkdir");
        std::fs::write(d.join("sub/data.csv"), "1\n").expect("write");
        run(d, &["add", "."]);
        run(d, &["commit", "-q", "-m", "one"]);
        let clean = git_state(d).expect("state");
        assert_eq!(clean.branch.as_deref(), Some("main"));
        assert!(!clean.dirty && clean.diff_hash.is_none());
        assert_eq!(clean.commit.len(), 40);

        std::fs::write(d.join("train.py"), "print('v2')\n").expect("write");
        let edited = git_state(d).expect("state");
        assert!(edited.dirty);
        std::fs::write(d.join("notes.txt"), "x").expect("write");
        let untracked = git_state(d).expect("state");
        assert_ne!(untracked.diff_hash, edited.diff_hash);

        std::fs::create_dir_all(d.join("out")).expect("mkdir");
        std::fs::write(d.join("out/big.bin"), "ignored").expect("write");
        std::fs::create_dir_all(d.join(".headroom")).expect("mkdir");
        std::fs::write(d.join(".headroom/admin-token"), "secret").expect("write");
        let b = bundle(&d.join("sub"), 1 << 20).expect("bundle");
        assert_eq!(b.subdir, "sub");
        let out = tempfile::tempdir().expect("tempdir");
        headroom_shared::bundle::unpack(&b.bytes, out.path()).expect("unpack");
        let o = out.path();
        assert_eq!(
            std::fs::read_to_string(o.join("train.py")).expect("read"),
            "print('v2')\n"
        );
        assert!(o.join("notes.txt").exists() && o.join("sub/data.csv").exists());
        assert!(!o.join("out").exists() && !o.join(".headroom").exists());

        let err = bundle(d, 10).expect_err("over the cap");
        assert!(err.to_string().starts_with("snapshot:"), "{err}");
        assert!(git_state(tempfile::tempdir().expect("t").path()).is_none());
    }

    #[test]
    fn a_plain_directory_is_bundled_less_what_it_leaves_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        std::fs::write(d.join("train.py"), "x").expect("write");
        std::fs::write(d.join("model.ckpt"), "big").expect("write");
        std::fs::write(d.join(".headroomignore"), "*.ckpt\n").expect("write");
        std::fs::create_dir_all(d.join(".venv/bin")).expect("venv");
        std::fs::write(d.join(".venv/pyvenv.cfg"), "home = /usr\n").expect("write");
        std::fs::create_dir_all(d.join(".headroom")).expect("mkdir");
        std::fs::write(d.join(".headroom/admin-token"), "secret").expect("write");
        // An agent's data directory, a data directory of another name (its `.gitignore` of
        // `*` keeps it out), a token file: none of headroom's credentials travel.
        std::fs::create_dir_all(d.join(".headroom-agent")).expect("mkdir");
        std::fs::write(d.join(".headroom-agent/agent-token"), "secret").expect("write");
        std::fs::create_dir_all(d.join("state")).expect("mkdir");
        std::fs::write(d.join("state/.gitignore"), "*\n").expect("write");
        std::fs::write(d.join("state/headroom.db"), "db").expect("write");
        std::fs::write(d.join("agent-token"), "secret").expect("write");
        let mut files = walk(d).expect("walk");
        files.sort();
        assert_eq!(files, vec![PathBuf::from("train.py")]);
    }

    #[test]
    fn the_workdir_and_environment_are_resolved_against_the_spec_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        std::fs::create_dir_all(d.join("proj/.venv/bin")).expect("venv");
        let spec_file = d.join("proj/spec.yaml");
        let spec = serde_json::json!({"workdir": ".", "environment": {"venv": ".venv"}});
        let w = workdir(&spec, &spec_file, false).expect("workdir");
        assert_eq!(w, d.join("proj").canonicalize().expect("canon"));
        let env = environment(&spec, &spec_file, &BTreeMap::new(), true).expect("env");
        let venv = d.join("proj/.venv").canonicalize().expect("canon");
        assert_eq!(env, Some(Environment::Venv(venv.display().to_string())));
        let missing = serde_json::json!({"workdir": "gone"});
        let err = workdir(&missing, &spec_file, false).expect_err("missing");
        assert!(err.to_string().starts_with("workdir:"), "{err}");
        // An absolute venv this host lacks may be the nodes' own: checked only here.
        let remote = serde_json::json!({"environment": {"venv": "/opt/cluster/venv"}});
        assert!(environment(&remote, &spec_file, &BTreeMap::new(), false).is_ok());
        assert!(environment(&remote, &spec_file, &BTreeMap::new(), true).is_err());
        let conda = serde_json::json!({"environment": {"conda": "nope"}});
        let err = environment(&conda, &spec_file, &BTreeMap::new(), true).expect_err("conda");
        assert!(err.to_string().starts_with("environment.conda:"), "{err}");
        let vars = BTreeMap::from([("VIRTUAL_ENV".to_string(), "/p/.venv".to_string())]);
        assert_eq!(
            environment(&serde_json::json!({}), &spec_file, &vars, true).expect("inherit"),
            Some(Environment::Venv("/p/.venv".into()))
        );
        assert_eq!(
            environment(
                &serde_json::json!({"environment": "none"}),
                &spec_file,
                &vars,
                true
            )
            .expect("none"),
            None
        );
    }
}
