//! A supervisor obeys its agent only: a second local Unix user (made by the test; CI runs as
//! root) connecting to its socket, or a process of its own user without the agent's attach
//! key, cannot stop it, renew its lease or take it over; a listener of another user bound
//! under the agent's socket prefix is neither talked to nor signalled. Each attempt runs on
//! and ends once, and every refusal is logged.

mod common;

use common::{ends, launch, started};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use headroom_agent::supervisor::proto::{self, ProtoError, Spec};
use headroom_shared::{AttemptId, FailureClass, JobId};

const OTHER_USER: &str = "headroom-test-other";
const KEY_LEN: usize = 64;

/// The uid of a second local user, made when missing; `None` when this test cannot make
/// one (not root).
fn other_uid() -> Option<u32> {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true, but not root: the cross-user cases would pass without running"
        );
        eprintln!("not root: cannot make a second Unix user; the cross-user cases are skipped");
        return None;
    }
    if nix::unistd::User::from_name(OTHER_USER)
        .ok()
        .flatten()
        .is_none()
    {
        let status = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(OTHER_USER)
            .status()
            .expect("useradd");
        // Another test may have made it meanwhile.
        assert!(
            status.success()
                || nix::unistd::User::from_name(OTHER_USER)
                    .ok()
                    .flatten()
                    .is_some(),
            "useradd {OTHER_USER}: {status}"
        );
    }
    let user = nix::unistd::User::from_name(OTHER_USER)
        .expect("getpwnam")
        .expect("the user exists");
    Some(user.uid.as_raw())
}

fn spec(dir: &Path, argv: &[&str], stop_in_ms: u64, key: &str) -> Spec {
    Spec {
        stop_in_ms,
        key: key.to_string(),
        ..common::spec(dir, argv)
    }
}

/// Runs [`attacker`] as `uid` (or as ourselves): it connects to the supervisor of `attempt`
/// under `scope`, sends `key` (when given), a stop and a renewal of a day, and reports
/// whether it got an answer.
fn attack(uid: Option<u32>, scope: &str, attempt: AttemptId, key: Option<&str>) -> String {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args(["--exact", "attacker", "--ignored", "--nocapture"])
        .env("HR_ATTACK", "connect")
        .env("HR_SCOPE", scope)
        .env("HR_ATTEMPT", attempt.to_string())
        .env("HR_KEY", key.unwrap_or_default())
        .current_dir("/");
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let out = cmd.output().expect("attacker");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// TEST HELPER, run by the tests above as another process (and user): see [`attack`].
#[test]
#[ignore = "run by the other tests as a second user"]
fn attacker() {
    let Ok(mode) = std::env::var("HR_ATTACK") else {
        return;
    };
    let scope = std::env::var("HR_SCOPE").expect("scope");
    let attempt: AttemptId = std::env::var("HR_ATTEMPT")
        .expect("attempt")
        .parse()
        .expect("id");
    let addr = proto::socket_addr(&scope, attempt).expect("addr");
    match mode.as_str() {
        "connect" => {
            use std::io::{BufRead, BufReader, Write};
            let Ok(mut s) = UnixStream::connect_addr(&addr) else {
                println!("RESULT no-connection");
                return;
            };
            let key = std::env::var("HR_KEY").unwrap_or_default();
            let mut lines = String::new();
            if !key.is_empty() {
                lines.push_str(&format!("{{\"msg\":\"attach\",\"key\":\"{key}\"}}\n"));
            }
            lines.push_str("{\"msg\":\"renew\",\"stop_in_ms\":86400000}\n");
            lines.push_str("{\"msg\":\"stop\",\"reason\":\"user\"}\n");
            let _ = s.write_all(lines.as_bytes());
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut answer = String::new();
            let _ = BufReader::new(s).read_line(&mut answer);
            if answer.trim().is_empty() {
                println!("RESULT refused");
            } else {
                println!("RESULT answered {answer}");
            }
        }
        "listen" => {
            // A fake supervisor: accepts and greets like one, until killed.
            use std::io::Write;
            let l = std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind");
            println!("RESULT listening");
            for mut s in l.incoming().flatten() {
                let _ = writeln!(
                    s,
                    "{{\"msg\":\"hello\",\"version\":{},\"attempt\":\"{attempt}\",\"job\":\"{}\",\"fence\":99,\"gpus\":[0],\"pid\":1,\"started_at\":null}}",
                    proto::PROTOCOL,
                    JobId::new()
                );
            }
        }
        other => panic!("unknown mode {other}"),
    }
}

#[tokio::test]
async fn another_user_or_a_keyless_peer_cannot_stop_renew_or_take_over_a_supervisor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = "a".repeat(KEY_LEN);
    // The job runs 2 s; the lease must be renewed within 4 s (nobody renews it here).
    let s = spec(dir.path(), &["sleep", "2"], 4_000, &key);
    let (scope, attempt) = (s.scope.clone(), s.launch.attempt);
    let (mut child, mut conn) = launch(dir.path(), s).await;
    started(&mut conn).await;

    let other = other_uid();
    if let Some(uid) = other {
        let r = attack(Some(uid), &scope, attempt, Some(&key));
        assert!(r.contains("RESULT refused"), "another user: {r}");
    }
    // Our own user, without the key, and with a wrong one.
    let r = attack(None, &scope, attempt, None);
    assert!(r.contains("RESULT refused"), "no key: {r}");
    let r = attack(None, &scope, attempt, Some(&"b".repeat(KEY_LEN)));
    assert!(r.contains("RESULT refused"), "wrong key: {r}");

    // The job ran on to its own end (no stop obeyed) and ended once, to its agent.
    let ends = ends(conn).await;
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert_eq!(
        (ends[0].failure, ends[0].exit_code),
        (None, Some(0)),
        "{:?}",
        ends[0]
    );
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.path().join("supervisor.log")).expect("log");
    let refused = log.matches("refused a connection").count();
    assert_eq!(refused, 2 + usize::from(other.is_some()), "{log}");
    if let Some(uid) = other {
        assert!(log.contains(&format!("uid {uid}")), "{log}");
    }
}

#[tokio::test]
async fn a_renewal_without_the_key_does_not_switch_self_fencing_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = "c".repeat(KEY_LEN);
    // A long job whose lease nobody renews: its supervisor stops it after 1.5 s.
    let s = spec(dir.path(), &["sleep", "60"], 1_500, &key);
    let (scope, attempt) = (s.scope.clone(), s.launch.attempt);
    let (mut child, mut conn) = launch(dir.path(), s).await;
    started(&mut conn).await;
    let begun = Instant::now();
    if let Some(uid) = other_uid() {
        attack(Some(uid), &scope, attempt, Some(&key));
    }
    attack(None, &scope, attempt, None);
    let ends = ends(conn).await;
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert_eq!(ends[0].failure, Some(FailureClass::Lost), "{:?}", ends[0]);
    assert!(
        begun.elapsed() < Duration::from_secs(20),
        "the day-long renewal was obeyed"
    );
    let _ = child.wait();
}

#[tokio::test]
async fn an_agent_neither_talks_to_nor_signals_another_users_listener() {
    let Some(uid) = other_uid() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let scope = dir.path().display().to_string();
    let attempt = AttemptId::new();
    let mut fake = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "attacker", "--ignored", "--nocapture"])
        .env("HR_ATTACK", "listen")
        .env("HR_SCOPE", &scope)
        .env("HR_ATTEMPT", attempt.to_string())
        .current_dir("/")
        .uid(uid)
        .gid(uid)
        .stdout(Stdio::null())
        .spawn()
        .expect("fake listener");
    // Listed among the scope's sockets (anyone can bind there)...
    let deadline = Instant::now() + Duration::from_secs(10);
    while !proto::listening(&scope).expect("table").contains(&attempt) {
        assert!(Instant::now() < deadline, "the fake listener did not bind");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ...but refused before it learns the key, and never named as a pid to kill.
    let got = proto::connect(
        &scope,
        attempt,
        &"d".repeat(KEY_LEN),
        Duration::from_secs(2),
    )
    .await;
    assert!(
        matches!(got, Err(ProtoError::Foreign { uid: u, .. }) if u == uid),
        "{:?}",
        got.map(|(_, hello)| hello)
    );
    assert_eq!(proto::supervisor_pid(&scope, attempt), None);
    let _ = fake.kill();
    let _ = fake.wait();
}
