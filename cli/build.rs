//! Names the build `headroom` and `headroom-node` come from (`HEADROOM_BUILD`: the version and
//! the commit), so that the two refuse to run together when they come from different builds;
//! the version alone where there is no git checkout (a source archive, an image's context).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let build = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(commit) => {
            // Built again when the checkout moves to another commit.
            if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) {
                watch(&dir.join("HEAD"));
                watch(&dir.join("packed-refs"));
                if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    watch(&dir.join(head));
                }
            }
            format!("{version}+{commit}")
        }
        None => version,
    };
    println!("cargo:rustc-env=HEADROOM_BUILD={build}");
}

/// A path whose change reruns this script (only one that exists: a missing one would rerun
/// it at every build).
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// `git ARGS` in this package's directory, its output trimmed; `None` when git or a checkout
/// is missing.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}
