//! A supervisor's self-fence when it reads its agent's renewals late: held up (stopped here;
//! on a node, its one thread blocked on a busy disk while its job starts), it wakes to find
//! its fence fallen and renewals waiting. A renewal sent before the fence fell keeps the
//! job, and each counts from its sending, as the agent's own fence does, never from its
//! reading.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{ends, launch, started};
use headroom_agent::supervisor::proto::{Conn, Monotonic, Spec, StopReason, ToSupervisor};
use headroom_shared::FailureClass;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A supervisor running `sleep 60` under `dir`, fenced `stop_in` after its launch unless
/// renewed; returned once the job runs.
async fn running(dir: &Path, stop_in: Duration) -> (std::process::Child, Conn) {
    std::fs::create_dir_all(dir).expect("dir");
    let spec = Spec {
        stop_in_ms: u64::try_from(stop_in.as_millis()).expect("ms"),
        ..common::spec(dir, &["sleep", "60"])
    };
    let (child, mut conn) = launch(dir, spec).await;
    started(&mut conn).await;
    (child, conn)
}

fn signal(child: &std::process::Child, signal: Signal) {
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    kill(pid, signal).expect("signal the supervisor");
}

/// As the agent renews: `stop_in` from now.
fn renew(stop_in: Duration) -> ToSupervisor {
    ToSupervisor::Renew {
        stop_in_ms: u64::try_from(stop_in.as_millis()).expect("ms"),
        measured_at: Some(Monotonic::now()),
    }
}

#[tokio::test]
async fn a_renewal_waiting_to_be_read_when_the_fence_falls_keeps_the_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Four at once: which of a fallen fence and a waiting renewal a supervisor takes first
    // must not be chance. Their first fences fall 3 s after their launches, long after all
    // four are renewed.
    let first = Duration::from_secs(3);
    let mut runs = vec![];
    let mut last_launch = Instant::now();
    for i in 0..4 {
        last_launch = Instant::now();
        runs.push(running(&dir.path().join(i.to_string()), first).await);
    }
    for (child, conn) in &mut runs {
        signal(child, Signal::SIGSTOP);
        conn.send(&renew(Duration::from_secs(30)))
            .await
            .expect("renew");
    }
    // Past every first deadline, then awake with the renewal waiting.
    tokio::time::sleep_until((last_launch + first + Duration::from_millis(500)).into()).await;
    for (child, _) in &runs {
        signal(child, Signal::SIGCONT);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut ended = vec![];
    for (mut child, mut conn) in runs {
        // Still running: stopped now, it ends cancelled, not lost.
        let _ = conn
            .send(&ToSupervisor::Stop {
                reason: StopReason::User,
            })
            .await;
        ended.push(ends(conn).await);
        let _ = child.wait();
    }
    for (i, ends) in ended.iter().enumerate() {
        assert_eq!(ends.len(), 1, "{ends:?}");
        assert_eq!(
            ends[0].failure,
            Some(FailureClass::Cancelled),
            "supervisor {i} fenced its job with a renewal waiting: {:?}",
            ends[0]
        );
    }
}

#[tokio::test]
async fn a_renewal_read_late_counts_from_its_sending() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, mut conn) = running(dir.path(), Duration::from_secs(60)).await;
    signal(&child, Signal::SIGSTOP);
    let sent = Instant::now();
    conn.send(&renew(Duration::from_secs(2)))
        .await
        .expect("renew");
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal(&child, Signal::SIGCONT);
    // Nothing renews it again: the fence falls 2 s after the sending, so at once on
    // waking; counted from the reading it would fall 2 s later, after the agent's own
    // fence and maybe the coordinator's expiry of the lease.
    let ends = ends(conn).await;
    let at = sent.elapsed();
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert_eq!(ends[0].failure, Some(FailureClass::Lost), "{:?}", ends[0]);
    assert!(
        at < Duration::from_millis(3_300),
        "ended {at:?} after the renewal of 2 s was sent"
    );
    let _ = child.wait();
}
