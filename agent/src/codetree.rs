//! A code bundle unpacked for one attempt, by the job's own user: into `code/` of the
//! attempt's private temporary directory (its `TMPDIR`, 0700, gone with the attempt), so
//! every attempt starts from the code as submitted, and nothing is written as root into a
//! directory another user owns. A root agent runs this as a helper process of its own
//! binary ([`UNPACK_ARG`]) under the job's user, the bundle on its standard input.

use std::io::Read;
use std::path::{Path, PathBuf};

/// First argument that turns a headroom binary into the unpacking helper:
/// `UNPACK_ARG DEST SUBDIR`, the bundle's bytes on standard input.
pub const UNPACK_ARG: &str = "__headroom-unpack";

/// The most the helper reads from its input.
const MAX_INPUT: u64 = 2 * 1024 * 1024 * 1024;

/// Why a tree could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: it exists and is not this user's private directory: refused", .0.display())]
    Planted(PathBuf),
    #[error(transparent)]
    Bundle(#[from] headroom_shared::bundle::BundleError),
    #[error("`{0}` is not a path inside the bundle")]
    Subdir(String),
}

/// The attempt's temporary directory: under `tmp_base` (the node's `TMPDIR`, else `/tmp`),
/// named after the attempt.
pub fn attempt_tmp(tmp_base: Option<&str>, attempt: &str) -> PathBuf {
    let base = tmp_base
        .filter(|d| d.starts_with('/'))
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    base.join(format!("headroom-{attempt}"))
}

/// Unpacks `bundle` into `dest` (which must not exist) as this process's user, making its
/// parent (the attempt's temporary directory) private to that user if it is not there
/// yet; `subdir` is made inside when the bundle holds nothing there.
pub fn unpack_into(dest: &Path, subdir: &str, bundle: &[u8]) -> Result<PathBuf, TreeError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if !headroom_shared::api::source::is_relative_within(subdir) {
        return Err(TreeError::Subdir(subdir.to_string()));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TreeError::Io { path, source }
    };
    if let Some(parent) = dest.parent() {
        match std::fs::DirBuilder::new().mode(0o700).create(parent) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let m = std::fs::symlink_metadata(parent).map_err(io(parent))?;
                let me = nix::unistd::geteuid().as_raw();
                if !m.is_dir() || m.uid() != me || m.mode() & 0o077 != 0 {
                    return Err(TreeError::Planted(parent.to_path_buf()));
                }
            }
            Err(e) => return Err(io(parent)(e)),
        }
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dest)
        .map_err(io(dest))?;
    headroom_shared::bundle::unpack(bundle, dest)?;
    let workdir = dest.join(subdir);
    std::fs::create_dir_all(&workdir).map_err(io(&workdir))?;
    Ok(workdir)
}

/// Call first thing in `main` of a binary an agent runs: as the unpacking helper, this
/// process unpacks its input and exits; it never returns.
pub fn run_if_unpacker() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).map(|a| a.as_os_str()) != Some(std::ffi::OsStr::new(UNPACK_ARG)) {
        return;
    }
    let (Some(dest), Some(subdir)) = (args.get(2), args.get(3).and_then(|s| s.to_str())) else {
        eprintln!("usage: {UNPACK_ARG} DEST SUBDIR < bundle");
        std::process::exit(2);
    };
    let mut bundle = Vec::new();
    if let Err(e) = std::io::stdin().take(MAX_INPUT).read_to_end(&mut bundle) {
        eprintln!("reading the bundle: {e}");
        std::process::exit(1);
    }
    match unpack_into(Path::new(dest), subdir, &bundle) {
        Ok(_) => std::process::exit(0),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_s_code_is_unpacked_once_into_its_own_private_directory() {
        let src = tempfile::tempdir().expect("tempdir");
        std::fs::write(src.path().join("train.py"), "print('v1')\n").expect("write");
        let bundle =
            headroom_shared::bundle::make(src.path(), &[PathBuf::from("train.py")]).expect("make");
        let base = tempfile::tempdir().expect("base");
        let tmp = attempt_tmp(base.path().to_str(), "a1");
        let workdir = unpack_into(&tmp.join("code"), "exp/sub", &bundle).expect("unpack");
        assert_eq!(workdir, tmp.join("code/exp/sub"));
        assert!(workdir.is_dir());
        let read = std::fs::read_to_string(tmp.join("code/train.py")).expect("read");
        assert_eq!(read, "print('v1')\n");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&tmp).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // Never over a tree already there, nor outside the bundle.
        assert!(unpack_into(&tmp.join("code"), "", &bundle).is_err());
        assert!(matches!(
            unpack_into(&tmp.join("other"), "../x", &bundle),
            Err(TreeError::Subdir(_))
        ));
        // A directory of that name someone else made is not used.
        let planted = attempt_tmp(base.path().to_str(), "a2");
        std::fs::create_dir(&planted).expect("plant");
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(matches!(
            unpack_into(&planted.join("code"), "", &bundle),
            Err(TreeError::Planted(_))
        ));
    }
}
