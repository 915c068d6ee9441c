//! Secrets given to the binaries (tokens, a database URL with its password): from a file
//! (`--…-file`, or systemd's `$CREDENTIALS_DIRECTORY/<name>`), or as a value, which on the
//! command line every local user can read in `/proc/*/cmdline` and is warned about.

use std::path::{Path, PathBuf};

/// Where one secret may come from.
#[derive(Clone, Copy, Debug)]
pub struct SecretSource {
    /// The flag of the value, e.g. `--agent-token`.
    pub flag: &'static str,
    /// The flag of the file, e.g. `--agent-token-file`.
    pub file_flag: &'static str,
    /// Its name under `$CREDENTIALS_DIRECTORY` (systemd `LoadCredential=`).
    pub credential: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{flag} {}: {source}", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} {}: {message}", path.display())]
    Malformed {
        flag: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{flag} and {file_flag} are both given: give one")]
    Both {
        flag: &'static str,
        file_flag: &'static str,
    },
}

/// The secret of a file: its one line (a trailing newline is fine). An empty file, a second
/// line or spaces inside are refused, naming the file and line.
pub fn read_file(path: &Path, flag: &'static str) -> Result<String, SecretError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecretError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })?;
    let malformed = |message: String| SecretError::Malformed {
        flag,
        path: path.to_path_buf(),
        message,
    };
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, secret)) = lines.next() else {
        return Err(malformed(
            "is empty: it must hold the secret on one line".into(),
        ));
    };
    if let Some((n, _)) = lines.next() {
        return Err(malformed(format!(
            "line {}: a second line; the file must hold the secret alone on one line",
            n + 1
        )));
    }
    let secret = secret.trim();
    if secret.chars().any(char::is_whitespace) {
        return Err(malformed(
            "the secret has spaces inside: one word expected".into(),
        ));
    }
    Ok(secret.to_string())
}

/// Whether `flag` was given on this process's command line (not from the environment or a
/// config file).
pub fn on_command_line(flag: &str) -> bool {
    let eq = format!("{flag}=");
    std::env::args_os()
        .filter_map(|a| a.into_string().ok())
        .any(|a| a == flag || a.starts_with(&eq))
}

/// The secret: from its file flag, else its value (warning when that was on the command
/// line), else `$CREDENTIALS_DIRECTORY/<credential>` when that exists.
pub fn resolve(
    src: SecretSource,
    value: Option<&str>,
    file: Option<&Path>,
) -> Result<Option<String>, SecretError> {
    match (value, file) {
        (Some(_), Some(_)) => Err(SecretError::Both {
            flag: src.flag,
            file_flag: src.file_flag,
        }),
        (None, Some(path)) => read_file(path, src.file_flag).map(Some),
        (Some(v), None) => {
            if on_command_line(src.flag) {
                eprintln!(
                    "warning: {} on the command line can be read by every local user \
                     (/proc/*/cmdline); use {} or systemd's LoadCredential={}",
                    src.flag, src.file_flag, src.credential
                );
            }
            Ok(Some(v.trim().to_string()))
        }
        (None, None) => match std::env::var_os("CREDENTIALS_DIRECTORY") {
            Some(dir) => {
                let path = Path::new(&dir).join(src.credential);
                if path.exists() {
                    read_file(&path, "$CREDENTIALS_DIRECTORY").map(Some)
                } else {
                    Ok(None)
                }
            }
            None => Ok(None),
        },
    }
}

/// A random secret: `bytes` random bytes in hex.
pub fn random_hex(bytes: usize) -> String {
    use rand::Rng;
    let mut b = vec![0u8; bytes];
    rand::rng().fill(&mut b[..]);
    hex::encode(b)
}

/// Writes a secret file whole or not at all, readable by its owner only (0600): a temporary
/// file beside it, synced, then renamed over it.
pub fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("secret");
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    // A new file of its own: never an existing one, nor through a link planted in its name
    // (one left by a crash of this same pid is removed first; removing follows no link).
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Where a local `headroom up` leaves its admin token for its own user's CLI and Python
/// client (as Jupyter leaves its server's token): `~/.headroom/local/<host>_<port>`, in a
/// 0700 directory, 0600. `None` without a home or for a URL without a port.
pub fn local_token_path(url: &str) -> Option<PathBuf> {
    let name = local_token_name(url)?;
    let home = std::env::var_os("HOME")?;
    Some(Path::new(&home).join(".headroom").join("local").join(name))
}

/// The file name of a local `up`'s token at `url` (`127.0.0.1_7420`).
fn local_token_name(url: &str) -> Option<String> {
    let authority = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = authority.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = if host.eq_ignore_ascii_case("localhost") {
        "127.0.0.1"
    } else {
        host.trim_matches(|c| c == '[' || c == ']')
    };
    if host.is_empty()
        || !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".:-".contains(c))
    {
        return None;
    }
    Some(format!("{}_{port}", host.replace(':', ".")))
}

/// As [`write_local_token`], for another account (`sudo headroom up`'s operator): in its
/// home, the folders made and the file given to `uid:gid`. `None` when the path would not
/// be its own home's (no such home).
pub fn write_local_token_for(
    url: &str,
    token: &str,
    home: &Path,
    uid: u32,
    gid: u32,
) -> std::io::Result<Option<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let Some(name) = local_token_name(url) else {
        return Ok(None);
    };
    if !std::fs::metadata(home).is_ok_and(|m| m.is_dir() && m.uid() == uid) {
        return Ok(None);
    }
    let dirs = [home.join(".headroom"), home.join(".headroom").join("local")];
    for dir in &dirs {
        if !own_folder(dir, uid, gid)? {
            return Ok(None);
        }
    }
    let path = dirs[1].join(name);
    write_private(&path, &format!("{token}\n"))?;
    std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
    Ok(Some(path))
}

/// `dir` as the account `uid`'s own folder (a directory, no link), made for it (0700) when
/// it is not there; `false` when something else is. A folder is made aside and moved into
/// place already the account's, so that a second writer (another `sudo headroom up` started
/// at once) never finds it half made, still root's, and takes it for someone else's.
fn own_folder(dir: &Path, uid: u32, gid: u32) -> std::io::Result<bool> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    use std::sync::atomic::{AtomicU64, Ordering};
    let theirs = |m: std::fs::Metadata| m.is_dir() && m.uid() == uid;
    match std::fs::symlink_metadata(dir) {
        Ok(m) => return Ok(theirs(m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    static MADE: AtomicU64 = AtomicU64::new(0);
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("folder");
    let aside = dir.with_file_name(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        MADE.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&aside)?;
    let moved = std::os::unix::fs::lchown(&aside, Some(uid), Some(gid)).and_then(|()| {
        use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
        match renameat2(
            AT_FDCWD,
            &aside,
            AT_FDCWD,
            dir,
            RenameFlags::RENAME_NOREPLACE,
        ) {
            // A file system without it (NFS): a plain rename, which fails on a folder
            // with anything in it.
            Err(nix::errno::Errno::EINVAL) => std::fs::rename(&aside, dir),
            r => r.map_err(std::io::Error::from),
        }
    });
    match moved {
        Ok(()) => Ok(true),
        Err(e) => {
            let _ = std::fs::remove_dir(&aside);
            let made_meanwhile = e.kind() == std::io::ErrorKind::AlreadyExists
                || e.raw_os_error() == Some(nix::libc::ENOTEMPTY);
            if made_meanwhile {
                return std::fs::symlink_metadata(dir).map(theirs);
            }
            Err(e)
        }
    }
}

/// Writes `token` where [`local_token_path`] says, private to this user.
pub fn write_local_token(url: &str, token: &str) -> std::io::Result<Option<PathBuf>> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let Some(path) = local_token_path(url) else {
        return Ok(None);
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    write_private(&path, &format!("{token}\n"))?;
    Ok(Some(path))
}

/// The token a local `headroom up` left for `url`, when there is one, with its file.
pub fn read_local_token(url: &str) -> Option<(String, PathBuf)> {
    let path = local_token_path(url)?;
    let token = read_file(&path, "local token").ok()?;
    Some((token, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: SecretSource = SecretSource {
        flag: "--agent-token",
        file_flag: "--agent-token-file",
        credential: "agent-token",
    };

    #[test]
    fn local_tokens_are_kept_per_host_and_port() {
        let home = std::env::var_os("HOME");
        let a = local_token_path("http://127.0.0.1:7420");
        assert_eq!(a, local_token_path("http://localhost:7420/"));
        assert_ne!(a, local_token_path("http://127.0.0.1:7421"));
        assert_eq!(local_token_path("http://127.0.0.1"), None);
        assert_eq!(local_token_path("http://../x:1"), None);
        if home.is_some() {
            assert!(a.expect("path").ends_with(".headroom/local/127.0.0.1_7420"));
        }
    }

    /// Two `sudo headroom up` for the same account, started at once, each leave it their
    /// token: neither finds the other's `.headroom` half made (made by root, not yet the
    /// account's) and takes it for a folder that is not the account's own.
    #[test]
    fn two_operators_tokens_written_at_once_are_both_kept() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            // Under CI (root) this is a premise: the case must run there.
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true, but not root: the folders cannot be given to another account"
            );
            eprintln!("not root: cannot give folders to another account; skipped");
            return;
        }
        let (uid, gid) = (65534, 65534);
        for round in 0..200 {
            let base = tempfile::tempdir().expect("tempdir");
            let home = base.path().join("home");
            std::fs::create_dir(&home).expect("home");
            std::os::unix::fs::lchown(&home, Some(uid), Some(gid)).expect("chown");
            let start = std::sync::Barrier::new(2);
            let written: Vec<_> = std::thread::scope(|s| {
                let both: Vec<_> = [7420, 7421]
                    .map(|port| {
                        let (home, start) = (&home, &start);
                        s.spawn(move || {
                            start.wait();
                            let url = format!("http://127.0.0.1:{port}");
                            write_local_token_for(&url, "hr_x", home, uid, gid)
                        })
                    })
                    .into_iter()
                    .collect();
                both.into_iter()
                    .map(|t| t.join().expect("thread"))
                    .collect()
            });
            for w in written {
                let path = w.expect("written").unwrap_or_else(|| {
                    panic!("round {round}: a token was not left for the account")
                });
                assert_eq!(std::fs::metadata(&path).expect("token").uid(), uid);
            }
            for dir in [".headroom", ".headroom/local"] {
                let m = std::fs::symlink_metadata(home.join(dir)).expect("folder");
                assert_eq!((m.uid(), m.mode() & 0o777), (uid, 0o700), "{dir}");
            }
            let left: Vec<_> = std::fs::read_dir(&home)
                .expect("home")
                .map(|e| e.expect("entry").file_name())
                .collect();
            assert_eq!(left, [".headroom"], "round {round}: nothing else is left");
        }
    }

    /// A link planted in the temporary file's name (another file's name, where a crash or
    /// someone left it) is not written through: what it points at stays as it was.
    #[test]
    fn a_secret_is_written_through_no_planted_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("someone-elses");
        std::fs::write(&target, "theirs\n").expect("write");
        let path = dir.path().join("admin-token");
        let tmp = dir
            .path()
            .join(format!(".admin-token.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&target, &tmp).expect("plant a link");
        write_private(&path, "secret\n").expect("written");
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "theirs\n");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "secret\n");
        assert!(!std::fs::symlink_metadata(&path).expect("meta").is_symlink());
    }

    #[test]
    fn a_secret_file_holds_one_word_on_one_line() {
        let dir = std::env::temp_dir().join(format!("hr-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("token");
        std::fs::write(&path, "hr_abc_def\n").expect("write");
        assert_eq!(
            resolve(SRC, None, Some(&path)).expect("read").as_deref(),
            Some("hr_abc_def")
        );
        for (text, says) in [
            ("", "is empty"),
            ("\n\n", "is empty"),
            ("a\nb\n", "line 2"),
            ("a b\n", "spaces inside"),
        ] {
            std::fs::write(&path, text).expect("write");
            let e = read_file(&path, "--agent-token-file")
                .expect_err(text)
                .to_string();
            assert!(e.contains(says) && e.contains("--agent-token-file"), "{e}");
            assert!(e.contains(&path.display().to_string()), "{e}");
        }
        let e = resolve(SRC, Some("x"), Some(&path)).expect_err("both");
        assert!(matches!(e, SecretError::Both { .. }), "{e}");
        let e = read_file(&dir.join("missing"), "--agent-token-file").expect_err("missing");
        assert!(matches!(e, SecretError::Read { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
