//! The attempt supervisor process driven over its protocol, as the agent drives it: after a
//! clean end it takes the next launch on the same connection, whatever the agent sent for
//! the attempt before while that one was ending; let go, it exits.

mod common;

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};

use common::spec;
use headroom_agent::supervisor::SUPERVISOR_ARG;
use headroom_agent::supervisor::proto::{Conn, FromSupervisor, ToSupervisor};

#[tokio::test]
async fn a_supervisor_takes_the_next_launch_after_a_clean_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    // As the agent leaves them: where logs and journalled outcomes go.
    for d in ["logs", "outcomes"] {
        std::fs::create_dir_all(dir.path().join(d)).expect("data dir");
    }
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom-agent"))
        .arg(SUPERVISOR_ARG)
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .spawn()
        .expect("supervisor");
    let mut conn = Conn::new(ours).expect("conn");
    let mut parents = Vec::new();
    for i in 0..3 {
        let out = dir.path().join(format!("parent-{i}"));
        let script = format!("echo $PPID > {}", out.display());
        let s = spec(dir.path(), &["sh", "-c", &script]);
        conn.send(&ToSupervisor::Launch { spec: Box::new(s) })
            .await
            .expect("launch");
        let (report, reusable) = loop {
            match conn.recv::<FromSupervisor>().await.expect("message") {
                Some(FromSupervisor::Ended {
                    report, reusable, ..
                }) => break (report, reusable),
                Some(_) => {}
                None => panic!("the supervisor exited during attempt {i}"),
            }
        };
        assert_eq!(
            (report.failure, report.exit_code),
            (None, Some(0)),
            "{report:?}"
        );
        assert!(report.cleanup_verified, "{report:?}");
        assert!(reusable, "a clean end hands the supervisor back");
        parents.push(
            std::fs::read_to_string(&out)
                .expect("the job ran")
                .trim()
                .parse::<u32>()
                .expect("pid"),
        );
        // The agent renewed the leases while the attempt was ending: the renewal is read
        // only now, and must not end the supervisor.
        conn.send(&ToSupervisor::Renew {
            stop_in_ms: 60_000,
            measured_at: None,
        })
        .await
        .expect("renew");
    }
    assert_eq!(
        parents,
        vec![child.id(); 3],
        "one supervisor ran the three jobs"
    );
    // Let go, it exits at once and cleanly.
    drop(conn);
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
}
