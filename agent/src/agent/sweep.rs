//! The restart sweep: processes of attempts this agent is not running (leftovers of an earlier
//! incarnation killed with `kill -9`, double-forked orphans included) are killed whatever the
//! coordinator says about those attempts.
//!
//! Several agents may share a host (tests do; so may nodes of a lab), so a process is this
//! agent's only when it carries both the attempt marker and [`AGENT_VAR`] naming this
//! agent's data directory. Blocking: async callers use `spawn_blocking`.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use headroom_shared::AttemptId;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::procscan;

/// Set on every job next to the attempt marker: the agent's canonical data directory, which
/// names one agent on a host across its restarts.
pub const AGENT_VAR: &str = "HEADROOM_AGENT_DIR";

/// How often the sweep scans again after killing: a process caught mid-`execve` reads with an
/// empty environment once, and a dying parent may fork one last time.
const ROUNDS: usize = 5;

/// The agent's scope value, as jobs carry it.
pub fn scope_of(data_dir: &Path) -> String {
    data_dir.display().to_string()
}

/// Live processes carrying `scope`'s marker, by attempt, leaving out the attempts in `keep`.
pub fn strays(scope: &str, keep: &HashSet<AttemptId>) -> HashMap<AttemptId, Vec<u32>> {
    let mut found = procscan::marked_processes_scoped(Some((AGENT_VAR, scope)));
    found.retain(|attempt, _| !keep.contains(attempt));
    found
}

/// SIGKILLs every stray of `scope` (see [`strays`]), scanning again until a scan finds none;
/// returns what it killed, by attempt.
pub fn kill_strays(scope: &str, keep: &HashSet<AttemptId>) -> HashMap<AttemptId, Vec<u32>> {
    let mut killed: HashMap<AttemptId, Vec<u32>> = HashMap::new();
    for _ in 0..ROUNDS {
        let found = strays(scope, keep);
        if found.is_empty() {
            break;
        }
        for (attempt, pids) in found {
            for &pid in &pids {
                if let Ok(p) = i32::try_from(pid) {
                    let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                }
            }
            let list = killed.entry(attempt).or_default();
            for pid in pids {
                if !list.contains(&pid) {
                    list.push(pid);
                }
            }
        }
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procscan::ATTEMPT_VAR;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    fn sleeper(attempt: AttemptId, scope: Option<&str>) -> std::process::Child {
        let mut cmd = Command::new("sleep");
        cmd.arg("600")
            .env(ATTEMPT_VAR, attempt.to_string())
            .stdin(Stdio::null());
        if let Some(s) = scope {
            cmd.env(AGENT_VAR, s);
        }
        cmd.spawn().expect("sleep")
    }

    fn wait_dead(child: &mut std::process::Child) -> bool {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn kills_only_this_agents_strays() {
        let dir = tempfile::tempdir().expect("tempdir");
        let scope = scope_of(dir.path());
        let (stray, kept, other) = (AttemptId::new(), AttemptId::new(), AttemptId::new());
        let mut a = sleeper(stray, Some(&scope));
        let mut b = sleeper(kept, Some(&scope));
        // Another agent's job on the same host, and one of an agent without a scope.
        let mut c = sleeper(other, Some(&format!("{scope}-other")));
        let mut d = sleeper(other, None);
        let pid = a.id();
        // The environment is readable once exec is done.
        let end = Instant::now() + Duration::from_secs(10);
        while strays(&scope, &HashSet::new()).len() < 2 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }

        let killed = kill_strays(&scope, &HashSet::from([kept]));
        assert_eq!(killed, HashMap::from([(stray, vec![pid])]));
        assert!(wait_dead(&mut a), "the stray dies");
        for (name, child) in [
            ("kept", &mut b),
            ("other agent's", &mut c),
            ("unscoped", &mut d),
        ] {
            assert!(
                child.try_wait().expect("try_wait").is_none(),
                "the {name} process lives"
            );
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
