//! What the tests driving a supervisor process share: the spec of an attempt on fake GPUs,
//! and a supervisor launched on it. Each test binary uses a part of it.
#![allow(dead_code)]

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};

use headroom_agent::gpu::BackendChoice;
use headroom_agent::supervisor::SUPERVISOR_ARG;
use headroom_agent::supervisor::attempt::Launch;
use headroom_agent::supervisor::proto::{Conn, FromSupervisor, Spec, ToSupervisor};
use headroom_shared::{AttemptId, JobId};

/// An attempt of `argv` on one fake GPU, its data (logs, journal) in `dir`, its lease renewed
/// for a minute, with an attach key.
pub fn spec(dir: &Path, argv: &[&str]) -> Spec {
    let attempt = AttemptId::new();
    Spec {
        launch: Launch {
            attempt,
            job: JobId::new(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            base_env: headroom_agent::jobenv::for_jobs(std::env::vars_os(), &[]),
            env: Default::default(),
            params: Default::default(),
            gpus: vec![0],
            timeout: None,
            log_path: dir.join("logs").join(format!("{attempt}.log")),
            workdir: None,
            environment: None,
            baseline: None,
            prestart: Default::default(),
            background: None,
            run_as: None,
            results: None,
            host_memory_mib: None,
            restart: Default::default(),
            memory_cap_mib: None,
        },
        fence: 1,
        data_dir: dir.to_path_buf(),
        scope: dir.display().to_string(),
        gpu: BackendChoice::Fake {
            spec: "1x8GiB".parse().expect("spec"),
            dir: dir.join("fake-gpus"),
        },
        job_env: vec![],
        kill_grace_ms: 300,
        verify_timeout_ms: 5_000,
        sample_every_ms: 50,
        start_reading_wait_ms: 20_000,
        stop_in_ms: 60_000,
        measured_at: None,
        spare: None,
        key: "k".repeat(64),
        direct: None,
        cgroups: None,
    }
}

/// A supervisor running `spec`, its stderr in `dir/supervisor.log`; our end of its channel.
pub async fn launch(dir: &Path, spec: Spec) -> (std::process::Child, Conn) {
    for d in ["logs", "outcomes"] {
        std::fs::create_dir_all(dir.join(d)).expect("data dir");
    }
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    let log = std::fs::File::create(dir.join("supervisor.log")).expect("log");
    let child = Command::new(env!("CARGO_BIN_EXE_headroom-agent"))
        .arg(SUPERVISOR_ARG)
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stderr(log)
        .spawn()
        .expect("supervisor");
    let mut conn = Conn::new(ours).expect("conn");
    conn.send(&ToSupervisor::Launch {
        spec: Box::new(spec),
    })
    .await
    .expect("launch");
    (child, conn)
}

/// Waits for the job to start (its socket is bound by then).
pub async fn started(conn: &mut Conn) {
    loop {
        match conn.recv::<FromSupervisor>().await.expect("message") {
            Some(FromSupervisor::Started { .. }) => return,
            Some(_) => {}
            None => panic!("the supervisor exited before the job started"),
        }
    }
}

/// The attempt's end reports until the supervisor exits or waits for another launch (let
/// go then: it exits).
pub async fn ends(mut conn: Conn) -> Vec<headroom_shared::api::FinishReport> {
    let mut ends = vec![];
    while let Some(msg) = conn.recv::<FromSupervisor>().await.expect("message") {
        if let FromSupervisor::Ended {
            report, reusable, ..
        } = msg
        {
            ends.push(*report);
            if reusable {
                break;
            }
        }
    }
    ends
}
