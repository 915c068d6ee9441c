//! What the tests driving a supervisor process share: the spec of an attempt on fake GPUs.

use std::path::Path;

use headroom_agent::gpu::BackendChoice;
use headroom_agent::supervisor::attempt::Launch;
use headroom_agent::supervisor::proto::Spec;
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
        spare: None,
        key: "k".repeat(64),
        direct: None,
        cgroups: None,
    }
}
