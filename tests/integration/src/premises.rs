//! What the suite needs of the machine and its accounts: CI's premises (root, cgroup v2), a
//! second Unix user, and test directories jobs of another user can write into.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

/// Whether the suite runs as CI (`CI=true`): there, what a test needs of the machine (root,
/// cgroup v2) is a premise, and its absence fails the test rather than skipping its cases.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Under CI, fails the test: the machine lacks `what` the suite's cases need. Elsewhere,
/// says which cases are skipped.
pub fn premise_missing(what: &str) {
    premise_missing_under(ci(), what);
}

fn premise_missing_under(ci: bool, what: &str) {
    assert!(
        !ci,
        "CI=true, but this machine lacks {what}: its cases would pass without running"
    );
    eprintln!("{what} missing: its cases are skipped");
}

/// A second local Unix user for tests of what another account can do, made when missing;
/// `None` when this process cannot make one (not root): the caller skips those cases (under
/// CI, the test fails instead).
pub fn other_user() -> Option<nix::unistd::User> {
    const NAME: &str = "headroom-test-other";
    if !nix::unistd::geteuid().is_root() {
        premise_missing("root (to make a second Unix user)");
        return None;
    }
    if nix::unistd::User::from_name(NAME).ok().flatten().is_none() {
        let _ = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                NAME,
            ])
            .status();
    }
    let user = nix::unistd::User::from_name(NAME).ok().flatten();
    assert!(user.is_some(), "cannot make the test user {NAME}");
    user
}

/// Lets jobs write into a test's directory: an agent running as root (CI) runs them as
/// another user (`--run-as-default`, `nobody`), and tests give them paths in it.
pub fn open_to_jobs(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::premise_missing_under;

    #[test]
    #[should_panic(expected = "CI=true, but this machine lacks root")]
    fn under_ci_a_missing_premise_fails_the_test() {
        premise_missing_under(true, "root");
    }

    #[test]
    fn elsewhere_a_missing_premise_skips_its_cases() {
        premise_missing_under(false, "root");
    }
}
