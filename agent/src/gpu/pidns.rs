//! Which pid namespace the driver's pids belong to, and how they map to the agent's own.
//!
//! NVML reports pids of the host's (initial) pid namespace. An agent in a pid namespace of
//! its own (a container without `hostPID: true`) sees other numbers in its `/proc`: a pid
//! from NVML may name nothing there, or a different process. The kernel gives the mapping in
//! the `NSpid:` line of `/proc/<pid>/status` read from a procfs of an ancestor namespace (the
//! host's `/proc` mounted into the container); without one, no pid can be attributed and the
//! agent must neither verify nor kill.

use std::fs;
use std::path::{Path, PathBuf};

/// `/proc/self/ns/pid` of the initial pid namespace (`PROC_PID_INIT_INO`, fixed since Linux 3.8).
pub const INIT_PID_NS: &str = "pid:[4026531836]";
/// A procfs of the host's pid namespace mounted into the agent's container, e.g. `/host/proc`.
pub const HOST_PROC_VAR: &str = "HEADROOM_HOST_PROC";

/// What an agent in its own pid namespace must be given; part of every refusal.
pub const NEEDS_HOST_PID: &str = "the agent runs in a pid namespace of its own and cannot map \
     the driver's (host) pids to its processes: run it in the host's pid namespace \
     (Kubernetes `hostPID: true`, docker `--pid=host`) or mount the host's /proc and set \
     HEADROOM_HOST_PROC";

/// The pids of `NSpid:` in a `/proc/<pid>/status` text: outermost namespace first, the
/// pid in the process's own namespace last. `None` when the line is missing (Linux < 4.1)
/// or malformed.
pub fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Option<Vec<u32>> = line.split_whitespace().map(|p| p.parse().ok()).collect();
    pids.filter(|p| !p.is_empty())
}

/// How the driver's pids relate to the agent's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PidView {
    /// The agent runs in the initial pid namespace: the driver's pids are its own.
    Host,
    /// The agent runs in a nested namespace with its own `/proc`, and `proc` is a procfs of
    /// the driver's (host) namespace mounted in ([`HOST_PROC_VAR`]), where the agent's own
    /// `NSpid` line has `depth` entries and its namespace reads as `own_ns`.
    Mapped {
        proc: PathBuf,
        depth: usize,
        own_ns: String,
    },
    /// A nested namespace with no procfs to map through: `reason` says what to do.
    Isolated { reason: String },
}

/// What a pid the driver reported is, seen from the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// A process of the agent's namespace, by its pid there.
    Local(u32),
    /// A process of another pid namespace (another container): never the agent's, never
    /// signalled; the pid is the driver's.
    Elsewhere,
    /// Cannot be told: the reading that holds it is unknown.
    Unknown(String),
}

impl PidView {
    /// The view of this process, from `/proc` and [`HOST_PROC_VAR`]. Blocking (reads /proc).
    pub fn detect() -> Self {
        let host = std::env::var_os(HOST_PROC_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        Self::detect_in(Path::new("/proc"), host.as_deref())
    }

    /// [`detect`](Self::detect) with the procfs paths given.
    pub fn detect_in(proc: &Path, host_proc: Option<&Path>) -> Self {
        let own_ns = match fs::read_link(proc.join("self/ns/pid")) {
            Ok(link) => link.to_string_lossy().into_owned(),
            Err(e) => {
                // Fail closed: without the namespace, no pid can be trusted.
                return PidView::Isolated {
                    reason: format!("cannot read {}/self/ns/pid ({e})", proc.display()),
                };
            }
        };
        if own_ns == INIT_PID_NS {
            return PidView::Host;
        }
        let depth = |root: &Path| {
            fs::read_to_string(root.join("self/status"))
                .ok()
                .as_deref()
                .and_then(parse_nspid)
                .map_or(0, |p| p.len())
        };
        // /proc of an ancestor namespace (never remounted): its pids are not the ones
        // `kill` and the marker scan work with, so nothing read there can be trusted.
        if depth(proc) > 1 {
            return PidView::Isolated {
                reason: format!(
                    "{} shows an outer pid namespace, not the agent's: mount a procfs of the \
                     agent's own namespace on /proc; {NEEDS_HOST_PID}",
                    proc.display()
                ),
            };
        }
        // The host's procfs mounted in: the agent's NSpid there has more than one entry.
        if let Some(root) = host_proc {
            let depth = depth(root);
            if depth > 1 {
                return PidView::Mapped {
                    proc: root.to_path_buf(),
                    depth,
                    own_ns,
                };
            }
        }
        PidView::Isolated {
            reason: NEEDS_HOST_PID.to_string(),
        }
    }

    /// What the driver's `pid` is here. Blocking (reads /proc).
    pub fn resolve(&self, pid: u32) -> Resolved {
        match self {
            PidView::Host => {
                if Path::new(&format!("/proc/{pid}")).exists() {
                    Resolved::Local(pid)
                } else {
                    Resolved::Unknown(format!(
                        "pid {pid} is on the GPU but not in /proc (exiting, or of a pid \
                         namespace the agent cannot see)"
                    ))
                }
            }
            PidView::Mapped {
                proc,
                depth,
                own_ns,
            } => {
                let dir = proc.join(pid.to_string());
                let Some(nspid) = fs::read_to_string(dir.join("status"))
                    .ok()
                    .as_deref()
                    .and_then(parse_nspid)
                else {
                    return Resolved::Unknown(format!(
                        "pid {pid} is on the GPU but not in {}",
                        proc.display()
                    ));
                };
                let ns = fs::read_link(dir.join("ns/pid"))
                    .map(|l| l.to_string_lossy().into_owned())
                    .ok();
                match nspid.last() {
                    Some(&local) if nspid.len() == *depth && ns.as_deref() == Some(own_ns) => {
                        Resolved::Local(local)
                    }
                    _ => Resolved::Elsewhere,
                }
            }
            PidView::Isolated { reason } => Resolved::Unknown(reason.clone()),
        }
    }

    /// A few words for the start line: empty on the host.
    pub fn describe(&self) -> String {
        match self {
            PidView::Host => String::new(),
            PidView::Mapped { proc, .. } => {
                format!("own pid namespace, pids mapped through {}", proc.display())
            }
            PidView::Isolated { .. } => "own pid namespace, GPU processes cannot be attributed \
                 (jobs will not be verified: needs hostPID)"
                .to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn nspid_lines_parse() {
        let status = "Name:\tpython\nTgid:\t4242\nPid:\t4242\nNSpid:\t4242\t17\t3\nPPid:\t1\n";
        assert_eq!(parse_nspid(status), Some(vec![4242, 17, 3]));
        assert_eq!(parse_nspid("NSpid:\t99\n"), Some(vec![99]));
        assert_eq!(parse_nspid("Name:\tx\nPid:\t5\n"), None, "kernel < 4.1");
        assert_eq!(parse_nspid("NSpid:\t12\tx\n"), None);
        assert_eq!(parse_nspid("NSpid:\n"), None);
    }

    /// A procfs tree of the host's namespace as a container sees it mounted at `/host/proc`.
    fn fake_proc(root: &Path, entries: &[(&str, &str, &str)]) {
        for (name, nspid, ns) in entries {
            let dir = root.join(name);
            fs::create_dir_all(dir.join("ns")).expect("mkdir");
            fs::write(dir.join("status"), format!("Name:\tx\nNSpid:\t{nspid}\n")).expect("status");
            symlink(ns, dir.join("ns/pid")).expect("symlink");
        }
    }

    #[test]
    fn host_pids_map_to_the_agents_namespace_through_nspid() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let own = "pid:[4026532999]";
        let host = tmp.path().join("host");
        fake_proc(
            &host,
            &[
                ("self", "5000\t1", own),
                // The agent's job: host pid 5123, pid 40 in the agent's namespace.
                ("5123", "5123\t40", own),
                // Another container's process at the same depth.
                ("6000", "6000\t40", "pid:[4026533000]"),
                // A host process.
                ("7000", "7000", INIT_PID_NS),
            ],
        );
        // The container's own /proc: one NSpid entry, a namespace that is not the initial one.
        let own_proc = tmp.path().join("proc");
        fake_proc(&own_proc, &[("self", "1", own)]);

        let view = PidView::detect_in(&own_proc, Some(&host));
        assert_eq!(
            view,
            PidView::Mapped {
                proc: host.clone(),
                depth: 2,
                own_ns: own.to_string()
            }
        );
        assert_eq!(view.resolve(5123), Resolved::Local(40));
        assert_eq!(view.resolve(6000), Resolved::Elsewhere);
        assert_eq!(view.resolve(7000), Resolved::Elsewhere);
        assert!(matches!(view.resolve(8000), Resolved::Unknown(_)));

        // Without the host's procfs nothing maps: refuse, naming hostPID.
        let view = PidView::detect_in(&own_proc, None);
        let Resolved::Unknown(reason) = view.resolve(5123) else {
            panic!("an isolated agent attributed a pid: {view:?}");
        };
        assert!(reason.contains("hostPID: true"), "{reason}");

        // /proc never remounted shows the outer namespace's pids: not usable.
        let shared = tmp.path().join("shared");
        fake_proc(&shared, &[("self", "5000\t1", own)]);
        assert!(matches!(
            PidView::detect_in(&shared, Some(&host)),
            PidView::Isolated { .. }
        ));

        // An unreadable namespace is not the host's.
        assert!(matches!(
            PidView::detect_in(&tmp.path().join("missing"), None),
            PidView::Isolated { .. }
        ));
        // The initial namespace needs no mapping.
        let init = tmp.path().join("init");
        fake_proc(&init, &[("self", "1234", INIT_PID_NS)]);
        assert_eq!(PidView::detect_in(&init, None), PidView::Host);
    }

    /// Set when this test binary runs inside a new pid namespace for [`in_a_pid_namespace`].
    const CHILD_VAR: &str = "HEADROOM_TEST_PIDNS_CHILD";

    /// The namespace side of [`real_pid_namespaces_map_through_the_hosts_procfs`]: a no-op
    /// unless started by it.
    #[test]
    fn pid_namespace_child_side() {
        let Ok(mode) = std::env::var(CHILD_VAR) else {
            return;
        };
        let view = PidView::detect();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let local = child.id();
        match (mode.as_str(), &view) {
            ("isolated", PidView::Isolated { .. }) => {
                assert!(matches!(view.resolve(local), Resolved::Unknown(_)));
            }
            ("host-proc", PidView::Mapped { proc, depth, .. }) => {
                // The sleeper's pid in the host's namespace, as NVML would report it.
                let host = fs::read_dir(proc)
                    .expect("host proc")
                    .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                    .find(|p| {
                        fs::read_to_string(proc.join(format!("{p}/status")))
                            .ok()
                            .as_deref()
                            .and_then(parse_nspid)
                            .is_some_and(|n| n.len() == *depth && n.last() == Some(&local))
                    })
                    .expect("the sleeper in the host's procfs");
                assert_ne!(host, local);
                assert_eq!(view.resolve(host), Resolved::Local(local));
                // The host's init is not of this namespace.
                assert_eq!(view.resolve(1), Resolved::Elsewhere);
            }
            _ => panic!("mode {mode}: unexpected view {view:?}"),
        }
        let _ = child.kill();
        let _ = child.wait();
        println!("PIDNS-CHILD-OK {mode}");
    }

    /// Runs [`pid_namespace_child_side`] in a new pid namespace with its own /proc, once
    /// without and once with the host's procfs mounted in. Needs `unshare` and the right to
    /// make namespaces (root): skipped, with the reason, without them.
    #[test]
    fn real_pid_namespaces_map_through_the_hosts_procfs() {
        if std::env::var(CHILD_VAR).is_ok() {
            return;
        }
        let exe = std::env::current_exe().expect("test binary");
        let tmp = tempfile::tempdir().expect("tempdir");
        let host_proc = tmp.path().join("host-proc");
        fs::create_dir(&host_proc).expect("mkdir");
        let script = r#"set -e
            [ "$MODE" = host-proc ] && mount --bind /proc "$HOST_PROC_DIR"
            mount -t proc proc /proc
            [ "$MODE" = host-proc ] && export HEADROOM_HOST_PROC="$HOST_PROC_DIR"
            exec "$EXE" --exact gpu::pidns::tests::pid_namespace_child_side --nocapture"#;
        for mode in ["isolated", "host-proc"] {
            let out = std::process::Command::new("unshare")
                .args(["--mount", "--pid", "--fork", "sh", "-c", script])
                .env("MODE", mode)
                .env("HOST_PROC_DIR", &host_proc)
                .env("EXE", &exe)
                .env(CHILD_VAR, mode)
                .env_remove(HOST_PROC_VAR)
                .output();
            let out = match out {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("SKIPPED real pid namespaces: cannot run unshare: {e}");
                    return;
                }
            };
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if !out.status.success() && text.contains("unshare failed") {
                eprintln!("SKIPPED real pid namespaces: not allowed here: {text}");
                return;
            }
            assert!(
                out.status.success() && text.contains(&format!("PIDNS-CHILD-OK {mode}")),
                "{mode}: {text}"
            );
        }
    }

    #[test]
    fn on_the_host_a_pid_is_ours_only_while_it_exists() {
        let me = std::process::id();
        assert_eq!(PidView::Host.resolve(me), Resolved::Local(me));
        // Above the kernel's largest pid_max: never a process.
        assert!(matches!(
            PidView::Host.resolve(99_999_999),
            Resolved::Unknown(_)
        ));
    }
}
