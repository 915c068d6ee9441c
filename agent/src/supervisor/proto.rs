//! The line protocol between the agent and an attempt's supervisor process: serde JSON, one
//! message a line, over a unix stream socket. The first connection is a socketpair the agent
//! hands over at spawn (no round trip, no race with the listener); a restarted agent connects
//! to the supervisor's socket, named from the agent's scope and the attempt in the abstract
//! namespace (no file to create and unlink per job, nothing left behind by a killed process).
//! Every connection opens with the supervisor's `hello`, which carries [`PROTOCOL`], so an
//! upgraded agent finds out when it talks to a supervisor it cannot understand.
//!
//! Only the agent steers its supervisors. Both ends refuse a peer of another user (root
//! included: a root supervisor obeys only root), and a re-attaching agent must first prove
//! that it holds the agent's attach key ([`attach_key`], 0600 in the data directory, handed
//! to each supervisor in its launch over the inherited socketpair).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use headroom_shared::api::FinishReport;
use headroom_shared::{AttemptId, JobId};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::gpu::BackendChoice;
use crate::supervisor::attempt::Launch;
/// Why the agent stopped an attempt, as the protocol carries it (a fact the class is
/// decided from).
pub use crate::supervisor::classify::StopReason;

/// Version of this protocol; a supervisor speaking another one is not re-attached.
pub const PROTOCOL: u32 = 1;

/// What the supervisor process needs to run an attempt, sent as its first message.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spec {
    pub launch: Launch,
    pub fence: i64,
    /// The agent's data directory: the outcome is journalled in `<data_dir>/outcomes`.
    pub data_dir: PathBuf,
    /// The agent's scope ([`crate::agent::sweep::AGENT_VAR`]): names the supervisor's socket.
    pub scope: String,
    /// The GPU backend the supervisor opens, as the agent opened its own.
    pub gpu: BackendChoice,
    /// What jobs need from the GPU backend (the agent's opened backend says), so the
    /// supervisor can start the job before it opens the backend itself.
    #[serde(default)]
    pub job_env: Vec<(String, String)>,
    pub kill_grace_ms: u64,
    pub verify_timeout_ms: u64,
    pub sample_every_ms: u64,
    /// Longest wait for a job's start reading before its exec.
    #[serde(default = "twenty_seconds")]
    pub start_reading_wait_ms: u64,
    /// The job is stopped this long after `measured_at` (else after the spec is read) unless
    /// a `renew` comes first.
    pub stop_in_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_at: Option<Monotonic>,
    /// A spare journal file to write the outcome through (see [`crate::outcomes`]).
    pub spare: Option<PathBuf>,
    /// The agent's attach key: a connection to the supervisor's socket must send it first
    /// ([`ToSupervisor::Attach`]). Empty: no connection is ever taken.
    #[serde(default)]
    pub key: String,
    /// How the supervisor reaches the coordinator itself while the agent is away (`None`:
    /// it cannot, and only fences itself).
    #[serde(default)]
    pub direct: Option<crate::supervisor::direct::Direct>,
    /// Where the attempt's cgroup goes (`None`: no cgroups; markers and the process tree).
    #[serde(default)]
    pub cgroups: Option<crate::cgroup::Cgroups>,
}

fn twenty_seconds() -> u64 {
    20_000
}

/// A moment on the machine's `CLOCK_MONOTONIC`, which an agent and its supervisors share,
/// in nanoseconds: a deadline the agent measured counts from then, however late the
/// supervisor reads it (its one thread may be blocked on a busy disk as its job starts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Monotonic(u64);

impl Monotonic {
    pub fn now() -> Self {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let ns = u64::try_from(t.tv_sec)
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0));
        Self(ns)
    }

    /// Time since this moment (none for one ahead of now).
    pub fn elapsed(self) -> Duration {
        Duration::from_nanos(Self::now().0.saturating_sub(self.0))
    }
}

/// What is left now of `stop_in_ms` measured at `measured_at` (all of it, unmeasured).
pub fn left_of(stop_in_ms: u64, measured_at: Option<Monotonic>) -> Duration {
    let waited = measured_at.map_or(Duration::ZERO, Monotonic::elapsed);
    Duration::from_millis(stop_in_ms).saturating_sub(waited)
}

/// Agent -> supervisor.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum ToSupervisor {
    /// First on the spawn channel, as the supervisor starts: the GPU backend its attempts
    /// will read, opened now, while it waits for a lease, so that a job's start reading is
    /// taken before its exec without waiting for NVML to open.
    Prepare { gpu: BackendChoice },
    /// On the spawn channel: run this attempt.
    Launch { spec: Box<Spec> },
    /// First message of a re-attaching agent on the supervisor's socket: the agent's attach
    /// key. The supervisor answers with its hello, or closes the connection.
    Attach { key: String },
    /// The leases were renewed: stop the job if nothing renews them again within
    /// `stop_in_ms` of `measured_at` (else of its reading).
    Renew {
        stop_in_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        measured_at: Option<Monotonic>,
    },
    /// Stop the job now (SIGTERM, grace, SIGKILL, verified cleanup) and report why.
    Stop { reason: StopReason },
}

/// Supervisor -> agent.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum FromSupervisor {
    Hello {
        version: u32,
        attempt: AttemptId,
        job: JobId,
        fence: i64,
        gpus: Vec<u32>,
        /// The job's pid and start, once it runs.
        pid: Option<u32>,
        started_at: Option<DateTime<Utc>>,
    },
    Started {
        pid: u32,
        started_at: DateTime<Utc>,
    },
    /// Before the job starts: what the attempt waits for (an empty GPU, cooling), for
    /// users to see; `None` when the wait is over. An agent that does not know this
    /// message logs it and goes on.
    Waiting {
        reason: Option<String>,
    },
    /// The attempt's end, journalled before this is sent; `held_by`: pids still holding
    /// GPU memory when verification gave up (the agent quarantines the GPUs until they are
    /// gone).
    Ended {
        held_by: Vec<u32>,
        /// GPUs whose unattributed ("ghost") memory stayed above these limits (MiB): the
        /// agent quarantines them until it is at or below.
        #[serde(default)]
        ghost_limits: Vec<(u32, u64)>,
        report: Box<FinishReport>,
        /// The supervisor waits for another launch on this connection (a clean end); else
        /// it exits.
        #[serde(default)]
        reusable: bool,
    },
}

/// The abstract socket name of `attempt`'s supervisor under `scope`.
pub fn socket_addr(scope: &str, attempt: AttemptId) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("{}{attempt}", socket_prefix(scope)))
}

/// What the socket names of `scope`'s supervisors start with.
fn socket_prefix(scope: &str) -> String {
    // Hashed: the name must fit 107 bytes.
    format!("headroom-attempt/{}/", crate::scope_hash(scope))
}

/// The attempts whose supervisors under `scope` listen in this network namespace, from
/// `/proc/net/unix`: how a restarted agent finds them (they carry no attempt marker; see
/// [`crate::agent::standby`]). Blocking.
pub fn listening(scope: &str) -> std::io::Result<Vec<AttemptId>> {
    let table = std::fs::read_to_string("/proc/net/unix")?;
    Ok(listening_in(&table, scope))
}

fn listening_in(table: &str, scope: &str) -> Vec<AttemptId> {
    // `Num RefCount Protocol Flags Type St Inode Path`; an abstract name reads `@name`; a
    // listening socket has `__SO_ACCEPTCON` (0x10000) in its flags.
    let prefix = format!("@{}", socket_prefix(scope));
    let mut found: Vec<AttemptId> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let flags = u32::from_str_radix(cols.get(3)?, 16).ok()?;
            if flags & 0x10000 == 0 {
                return None;
            }
            cols.get(7)?.strip_prefix(&prefix)?.parse().ok()
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The pid of `attempt`'s supervisor under `scope`, from its socket's peer credentials:
/// how one that cannot be re-attached is found to be killed. `None` for a listener of
/// another user (anyone may bind a name in the abstract namespace).
pub fn supervisor_pid(scope: &str, attempt: AttemptId) -> Option<u32> {
    let stream =
        std::os::unix::net::UnixStream::connect_addr(&socket_addr(scope, attempt).ok()?).ok()?;
    Conn::new(stream).ok()?.peer_pid()
}

/// One end of a connection, either side.
pub struct Conn {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
    /// The peer's uid and pid when it connected (`SO_PEERCRED`).
    peer: (u32, Option<i32>),
}

#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("supervisor socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("unreadable message `{line}`: {source}")]
    Format {
        line: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the peer (pid {pid:?}) runs as uid {uid}, not as this process's user")]
    Foreign { uid: u32, pid: Option<i32> },
    #[error("the peer (uid {uid}, pid {pid:?}) did not send the agent's attach key")]
    BadKey { uid: u32, pid: Option<i32> },
    #[error("no hello within {0:?}")]
    Silent(Duration),
    #[error("expected hello, got {0:?}")]
    NoHello(Box<FromSupervisor>),
    #[error("the supervisor speaks protocol {0}, this agent {PROTOCOL}")]
    Version(u32),
}

impl Conn {
    /// Wraps a connected socket, refusing a peer of another user, root no exception: only
    /// the agent's user may steer its supervisors, and an agent talks only to supervisors of
    /// its user.
    pub fn new(stream: std::os::unix::net::UnixStream) -> Result<Self, ProtoError> {
        stream.set_nonblocking(true)?;
        let stream = UnixStream::from_std(stream)?;
        let cred = stream.peer_cred()?;
        let (uid, pid) = (cred.uid(), cred.pid());
        if uid != nix::unistd::geteuid().as_raw() {
            return Err(ProtoError::Foreign { uid, pid });
        }
        let (read, write) = stream.into_split();
        Ok(Self {
            lines: BufReader::new(read).lines(),
            write,
            peer: (uid, pid),
        })
    }

    /// The peer's pid when it connected.
    pub fn peer_pid(&self) -> Option<u32> {
        self.peer
            .1
            .and_then(|p| u32::try_from(p).ok())
            .filter(|&p| p > 0)
    }

    /// A connection accepted on a supervisor's socket, taken only once it proved that it
    /// holds `key` (its first message, within `wait`).
    pub async fn accept_attach(
        stream: std::os::unix::net::UnixStream,
        key: &str,
        wait: Duration,
    ) -> Result<Self, ProtoError> {
        let mut conn = Self::new(stream)?;
        let (uid, pid) = conn.peer;
        let refused = ProtoError::BadKey { uid, pid };
        match tokio::time::timeout(wait, conn.recv::<ToSupervisor>()).await {
            Ok(Ok(Some(ToSupervisor::Attach { key: given })))
                if !key.is_empty() && same_key(&given, key) =>
            {
                Ok(conn)
            }
            Err(_) => Err(ProtoError::Silent(wait)),
            Ok(Err(e)) => Err(e),
            Ok(_) => Err(refused),
        }
    }

    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), ProtoError> {
        let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.write.write_all(&line).await?;
        Ok(())
    }

    /// The next message; `Ok(None)` when the peer has closed the connection.
    pub async fn recv<T: for<'de> Deserialize<'de>>(&mut self) -> Result<Option<T>, ProtoError> {
        let Some(line) = self.lines.next_line().await? else {
            return Ok(None);
        };
        serde_json::from_str(&line)
            .map(Some)
            .map_err(|source| ProtoError::Format { line, source })
    }
}

/// Compares keys in time independent of where they differ.
fn same_key(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The agent's attach key, from `<data_dir>/attach.key` (0600), made at the first start.
/// Blocking.
pub fn attach_key(data_dir: &std::path::Path) -> std::io::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = data_dir.join("attach.key");
    match std::fs::read_to_string(&path) {
        Ok(key) if key.trim().len() >= 32 => {
            // Readable by others, it proves nothing: made private again.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            return Ok(key.trim().to_string());
        }
        Ok(_) => std::fs::remove_file(&path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let key = headroom_shared::secret::random_hex(32);
    headroom_shared::secret::write_private(&path, &key)?;
    Ok(key)
}

/// Connects to `attempt`'s supervisor, proves the agent's `key` and reads its hello
/// (blocking connect, then async). A peer of another user is refused before it learns
/// anything.
pub async fn connect(
    scope: &str,
    attempt: AttemptId,
    key: &str,
    wait: Duration,
) -> Result<(Conn, FromSupervisor), ProtoError> {
    let stream = std::os::unix::net::UnixStream::connect_addr(&socket_addr(scope, attempt)?)?;
    let mut conn = Conn::new(stream)?;
    conn.send(&ToSupervisor::Attach {
        key: key.to_string(),
    })
    .await?;
    let hello = match tokio::time::timeout(wait, conn.recv::<FromSupervisor>()).await {
        Err(_) => return Err(ProtoError::Silent(wait)),
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) => {
            return Err(ProtoError::Io(std::io::Error::from(
                std::io::ErrorKind::UnexpectedEof,
            )));
        }
        Ok(Err(e)) => return Err(e),
    };
    match &hello {
        FromSupervisor::Hello { version, .. } if *version != PROTOCOL => {
            Err(ProtoError::Version(*version))
        }
        FromSupervisor::Hello { .. } => Ok((conn, hello)),
        other => Err(ProtoError::NoHello(Box::new(other.clone()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_supervisors_of_one_scope_are_found_in_the_socket_table() {
        let (a, b) = (AttemptId::new(), AttemptId::new());
        let ours = socket_prefix("/data/agent");
        let theirs = socket_prefix("/data/other");
        // A listener of ours, a connection accepted from it (same name, no accept flag),
        // another agent's listener, a path socket and a header.
        let table = format!(
            "Num       RefCount Protocol Flags    Type St Inode Path\n\
             0000000000000000: 00000002 00000000 00010000 0001 01 4242 @{ours}{a}\n\
             0000000000000000: 00000003 00000000 00000000 0001 03 4243 @{ours}{b}\n\
             0000000000000000: 00000002 00000000 00010000 0001 01 4244 @{theirs}{b}\n\
             0000000000000000: 00000002 00000000 00010000 0001 01 4245 /run/x.sock\n\
             0000000000000000: 00000002 00000000 00010000 0001 01 4246 @{ours}not-an-id\n"
        );
        assert_eq!(listening_in(&table, "/data/agent"), vec![a]);
    }

    #[tokio::test]
    async fn a_bound_supervisor_socket_is_listed_and_gives_its_pid() {
        let scope = format!("/test/{}", AttemptId::new());
        let attempt = AttemptId::new();
        assert!(!listening(&scope).expect("table").contains(&attempt));
        let listener = std::os::unix::net::UnixListener::bind_addr(
            &socket_addr(&scope, attempt).expect("addr"),
        )
        .expect("bind");
        assert_eq!(listening(&scope).expect("table"), vec![attempt]);
        assert_eq!(supervisor_pid(&scope, attempt), Some(std::process::id()));
        drop(listener);
        assert!(listening(&scope).expect("table").is_empty());
    }

    #[test]
    fn messages_are_one_tagged_json_line() {
        let m = serde_json::to_string(&ToSupervisor::Renew {
            stop_in_ms: 1500,
            measured_at: None,
        })
        .expect("json");
        assert_eq!(m, r#"{"msg":"renew","stop_in_ms":1500}"#);
        let m = serde_json::to_string(&ToSupervisor::Renew {
            stop_in_ms: 1500,
            measured_at: Some(Monotonic(7)),
        })
        .expect("json");
        assert_eq!(m, r#"{"msg":"renew","stop_in_ms":1500,"measured_at":7}"#);
        let m = serde_json::to_string(&ToSupervisor::Stop {
            reason: StopReason::LeaseLost,
        })
        .expect("json");
        assert_eq!(m, r#"{"msg":"stop","reason":"lease_lost"}"#);
        let back: FromSupervisor = serde_json::from_str(
            r#"{"msg":"started","pid":12,"started_at":"2026-11-23T10:00:00Z"}"#,
        )
        .expect("parse");
        assert!(
            matches!(back, FromSupervisor::Started { pid: 12, .. }),
            "{back:?}"
        );
    }

    /// The launch goes through the tagged message whole, the baseline's GPU map included.
    #[test]
    fn a_launch_reads_back() {
        let samples = vec![headroom_shared::api::GpuSample {
            index: 3,
            used_mib: 512,
            ..Default::default()
        }];
        let launch = Launch {
            attempt: AttemptId::new(),
            job: JobId::new(),
            argv: vec!["true".into()],
            base_env: Default::default(),
            env: Default::default(),
            params: Default::default(),
            gpus: vec![3],
            timeout: Some(Duration::from_secs(5)),
            log_path: "/tmp/x.log".into(),
            workdir: None,
            environment: None,
            baseline: Some(crate::supervisor::attempt::Baseline::of(&samples, &[3])),
            prestart: Default::default(),
            background: None,
            run_as: None,
            results: None,
            host_memory_mib: None,
            restart: Default::default(),
            memory_cap_mib: None,
        };
        let msg = ToSupervisor::Launch {
            spec: Box::new(Spec {
                launch,
                fence: 7,
                data_dir: "/data".into(),
                scope: "/data".into(),
                gpu: BackendChoice::Fake {
                    spec: "1x24GiB".parse().expect("spec"),
                    dir: "/data/fake".into(),
                },
                job_env: vec![("HEADROOM_FAKE_GPU_DIR".into(), "/data/fake".into())],
                kill_grace_ms: 1,
                verify_timeout_ms: 2,
                sample_every_ms: 3,
                start_reading_wait_ms: 20_000,
                stop_in_ms: 4,
                measured_at: None,
                spare: None,
                key: "k".repeat(64),
                direct: None,
                cgroups: None,
            }),
        };
        let line = serde_json::to_string(&msg).expect("json");
        let ToSupervisor::Launch { spec } = serde_json::from_str(&line).expect("reads back") else {
            panic!("{line}")
        };
        assert_eq!(spec.fence, 7);
        assert_eq!(
            spec.launch.baseline,
            Some(crate::supervisor::attempt::Baseline::of(&samples, &[3]))
        );
        assert_eq!(spec.job_env[0].1, "/data/fake");
    }

    #[test]
    fn socket_names_fit_and_differ_by_scope_and_attempt() {
        let a = AttemptId::new();
        let long = "/x".repeat(500);
        let name = |s: &str, a| {
            socket_addr(s, a)
                .expect("fits")
                .as_abstract_name()
                .map(<[u8]>::to_vec)
                .expect("abstract")
        };
        assert_ne!(name(&long, a), name("/data", a));
        assert_ne!(name("/data", a), name("/data", AttemptId::new()));
        assert_eq!(name("/data", a), name("/data", a));
    }
}
