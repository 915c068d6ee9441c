//! What the job runs in on this node: its working directory and its Python environment.
//! Both are looked at before any of the attempt's processes starts; one that is missing
//! here, or a directory the job's user may not enter, ends the attempt with a failure class
//! of its own and a message that names the path, the user and what is missing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use headroom_shared::api::source::Environment;

use super::launch::NotStarted;
use crate::runas::Identity;
use crate::supervisor::classify::Unstarted;

fn node() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// The working directory exists here (looked at as the supervisor: where it may not look,
/// the job's own entering decides).
pub(crate) fn check_workdir(dir: &Path) -> Result<(), NotStarted> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(NotStarted::new(
            Unstarted::Workdir,
            format!(
                "the job's working directory {} on node {} is not a directory",
                dir.display(),
                node()
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(NotStarted::new(
            Unstarted::Workdir,
            format!(
                "the job's working directory {} does not exist on node {}: jobs run in the \
                 directory they were submitted from, which a node must have (a shared file \
                 system); `code: snapshot` (`headroom submit --snapshot`) ships the code to \
                 nodes that lack it",
                dir.display(),
                node()
            ),
        )),
        Err(_) => Ok(()),
    }
}

/// Why the job's user could not enter `dir` (`errno` from its `chdir`).
pub(crate) fn cannot_enter(dir: &Path, identity: Option<&Identity>, errno: i32) -> NotStarted {
    let err = std::io::Error::from_raw_os_error(errno);
    let who = identity.map_or_else(
        || format!("uid {}", nix::unistd::geteuid()),
        |id| format!("`{}` (uid {})", id.name, id.uid),
    );
    let mut msg = format!(
        "the job's user {who} cannot enter its working directory {} on node {}: {err}",
        dir.display(),
        node()
    );
    if errno == nix::errno::Errno::EACCES as i32 {
        match identity.and_then(|id| crate::runas::first_unsearchable(dir, id)) {
            Some(blocked) => msg.push_str(&format!("; it may not search (x) {blocked}")),
            None => msg.push_str(
                "; the folders' modes allow it, so an ACL or the mount refuses it (a \
                 root-squashed NFS export maps root to nobody)",
            ),
        }
        msg.push_str(". ");
        msg.push_str(crate::runas::MAPPING_HINT);
    }
    NotStarted::new(Unstarted::Workdir, msg)
}

/// What a job's user was refused in running `program` (looked up in `path` as the exec
/// would, from `cwd`): the folder on the way it may not search, or the file it may not
/// execute, and the mappings that run it as someone who may.
pub(crate) fn cannot_run(
    program: &str,
    path: Option<&str>,
    cwd: Option<&Path>,
    id: &Identity,
) -> String {
    use std::os::unix::fs::MetadataExt;
    let found = if program.contains('/') {
        Some(cwd.map_or_else(|| PathBuf::from(program), |d| d.join(program)))
    } else {
        path.unwrap_or_default()
            .split(':')
            .map(|d| Path::new(d).join(program))
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
    };
    let mut msg = format!(" as `{}` (uid {})", id.name, id.uid);
    if let Some(file) = found {
        // Where it leads (a venv's `python` is a link to its base interpreter).
        let real = std::fs::canonicalize(&file).unwrap_or_else(|_| file.clone());
        let blocked = real
            .parent()
            .and_then(|dir| crate::runas::first_unsearchable(dir, id));
        match (blocked, std::fs::metadata(&real)) {
            (Some(b), _) => msg.push_str(&format!(
                ": {} is {}, and it may not search (x) {b}",
                file.display(),
                real.display()
            )),
            (None, Ok(m)) => msg.push_str(&format!(
                ": it may not execute {} (owner uid {}, mode {:o})",
                real.display(),
                m.uid(),
                m.mode() & 0o7777
            )),
            (None, Err(_)) => {}
        }
    }
    msg.push_str(". ");
    msg.push_str(crate::runas::MAPPING_HINT);
    msg
}

/// An environment made active for the job: its `bin` goes first on `PATH`, and these
/// variables are set.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Activation {
    pub bin: PathBuf,
    pub vars: Vec<(String, String)>,
}

/// The job's environment on this node, or why it is not here.
pub(crate) fn activate(
    env: &Environment,
    identity: Option<&Identity>,
    base_env: &BTreeMap<String, String>,
) -> Result<Activation, NotStarted> {
    let missing = |msg: String| NotStarted::new(Unstarted::Environment, msg);
    match env {
        Environment::Venv(dir) => {
            let dir = PathBuf::from(dir);
            if !looks_present(&dir.join("bin")) {
                return Err(missing(format!(
                    "environment.venv: {} is not a venv on node {} (it has no bin/)",
                    dir.display(),
                    node()
                )));
            }
            Ok(Activation {
                bin: dir.join("bin"),
                vars: vec![("VIRTUAL_ENV".into(), dir.display().to_string())],
            })
        }
        Environment::Conda(given) => {
            let (prefix, looked) = if given.starts_with('/') {
                let p = PathBuf::from(given);
                (is_conda_env(&p).then(|| p.clone()), vec![p])
            } else {
                find_conda(given, identity, base_env)
            };
            let Some(prefix) = prefix else {
                let looked: Vec<String> = looked.iter().map(|p| p.display().to_string()).collect();
                return Err(missing(format!(
                    "environment.conda: no conda environment `{given}` on node {} (looked for \
                     conda-meta/ in {})",
                    node(),
                    looked.join(", ")
                )));
            };
            let name = if given.starts_with('/') {
                prefix
                    .file_name()
                    .map_or_else(|| given.clone(), |n| n.to_string_lossy().into_owned())
            } else {
                given.clone()
            };
            Ok(Activation {
                bin: prefix.join("bin"),
                vars: vec![
                    ("CONDA_PREFIX".into(), prefix.display().to_string()),
                    ("CONDA_DEFAULT_ENV".into(), name),
                    ("CONDA_SHLVL".into(), "1".into()),
                ],
            })
        }
    }
}

/// Present, or where the supervisor may not look (the job's user may).
fn looks_present(p: &Path) -> bool {
    match std::fs::metadata(p) {
        Ok(m) => m.is_dir(),
        Err(e) => e.kind() == std::io::ErrorKind::PermissionDenied,
    }
}

fn is_conda_env(prefix: &Path) -> bool {
    looks_present(&prefix.join("conda-meta"))
}

fn find_conda(
    name: &str,
    identity: Option<&Identity>,
    base_env: &BTreeMap<String, String>,
) -> (Option<PathBuf>, Vec<PathBuf>) {
    crate::pyenv::find_conda(
        name,
        base_env.get("CONDA_EXE").map(String::as_str),
        identity.map(|id| id.home.as_path()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_or_environment_is_its_own_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let gone = dir.path().join("gone");
        let e = check_workdir(&gone).expect_err("missing");
        assert_eq!(e.why, Unstarted::Workdir);
        assert!(
            e.message.contains(&gone.display().to_string()),
            "{}",
            e.message
        );
        assert!(e.message.contains("--snapshot"), "{}", e.message);
        assert!(check_workdir(dir.path()).is_ok());

        let venv = Environment::Venv(gone.display().to_string());
        let e = activate(&venv, None, &BTreeMap::new()).expect_err("no venv");
        assert_eq!(e.why, Unstarted::Environment);
        assert!(e.message.starts_with("environment.venv"), "{}", e.message);
        let e = activate(&Environment::Conda("nope".into()), None, &BTreeMap::new())
            .expect_err("no conda");
        assert!(e.message.contains("`nope`") && e.message.contains("/opt/conda/envs/nope"));
    }

    #[test]
    fn an_environment_here_is_activated() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("venv/bin")).expect("venv");
        let venv = dir.path().join("venv").display().to_string();
        let a = activate(&Environment::Venv(venv.clone()), None, &BTreeMap::new()).expect("venv");
        assert_eq!(a.bin, dir.path().join("venv/bin"));
        assert_eq!(a.vars, vec![("VIRTUAL_ENV".to_string(), venv)]);
        // A conda installation found through the agent's CONDA_EXE.
        std::fs::create_dir_all(dir.path().join("conda/bin")).expect("conda");
        std::fs::create_dir_all(dir.path().join("conda/envs/torch/conda-meta")).expect("env");
        let base = BTreeMap::from([(
            "CONDA_EXE".to_string(),
            dir.path().join("conda/bin/conda").display().to_string(),
        )]);
        let a = activate(&Environment::Conda("torch".into()), None, &base).expect("conda");
        assert_eq!(a.bin, dir.path().join("conda/envs/torch/bin"));
        assert!(
            a.vars
                .contains(&("CONDA_DEFAULT_ENV".to_string(), "torch".to_string()))
        );
    }

    #[test]
    fn a_program_its_user_may_not_reach_is_named_with_the_folder_that_stops_it() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let id = crate::runas::resolve(&headroom_shared::api::RunAs {
            unix_user: "nobody".into(),
            allow_root: false,
        })
        .expect("nobody");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("bin")).expect("mkdir");
        let tool = dir.path().join("bin/tool");
        std::fs::write(&tool, "#!/bin/sh\n").expect("tool");
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        let path = dir.path().join("bin").display().to_string();
        let msg = cannot_run("tool", Some(&path), None, &id);
        let blocked = format!(
            "may not search (x) {} (owner root, mode 700)",
            dir.path().display()
        );
        assert!(
            msg.contains("as `nobody`") && msg.contains(&blocked),
            "{msg}"
        );
        assert!(msg.contains("--unix-user root --allow-root"), "{msg}");
    }
}
