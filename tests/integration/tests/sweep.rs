//! The restart sweep: an agent killed with `kill -9` and down longer than the lease TTL (its
//! attempt already recorded lost, so the coordinator reports nothing to clean up) kills the
//! orphans of its former attempts before it takes new work, and leaves the jobs of another
//! agent on the same host alone. Quarantines a killed agent left behind lift by themselves
//! once their leftovers are gone.

use std::path::PathBuf;
use std::time::Duration;

use headroom_integration_tests::{
    Headroom, KillOnDrop, Proc, UpOptions, alive, fake_job, free_port, http_get, http_post,
    wait_until as wait,
};
use headroom_shared::api::{JobDetail, JobSummary, SubmitResponse};
use headroom_shared::{ExperimentId, FailureClass, JobState};

struct Site {
    dir: tempfile::TempDir,
    url: String,
    _coord: Proc,
}

impl Site {
    fn new(ttl: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port().expect("port");
        let args: Vec<String> = [
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
            &dir.path().join("coord").display().to_string(),
            "--lease-ttl",
            ttl,
        ]
        .map(String::from)
        .to_vec();
        let coord = Proc::start("headroom-coordinator", &args, dir.path().join("coord.log"))
            .expect("coordinator");
        let url = format!("http://127.0.0.1:{port}");
        wait("the coordinator", Duration::from_secs(30), || {
            http_get::<serde_json::Value>(&format!("{url}/v1/health"))
                .ok()
                .map(|_| ())
        });
        Self {
            dir,
            url,
            _coord: coord,
        }
    }

    fn agent(&self, node: &str, log: &str) -> Proc {
        let data: PathBuf = self.dir.path().join(node);
        let args: Vec<String> = [
            "--coordinator",
            &self.url,
            "--node",
            node,
            "--gpu-backend",
            "fake",
            "--fake-gpus",
            "1x24GiB",
            "--kill-grace",
            "300ms",
            "--verify-timeout",
            "5s",
            "--data-dir",
            &data.display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        Proc::start("headroom-agent", &args, self.dir.path().join(log)).expect("agent")
    }

    fn submit(&self, spec: serde_json::Value) -> ExperimentId {
        wait("a submission", Duration::from_secs(20), || {
            let (status, body) = http_post(
                &format!("{}/v1/experiments", self.url),
                &serde_json::json!({"spec": spec}),
            )
            .ok()?;
            (status == 200).then_some(())?;
            serde_json::from_value::<SubmitResponse>(body)
                .ok()?
                .experiment
        })
    }

    fn job(&self, exp: ExperimentId) -> Option<JobDetail> {
        let jobs: Vec<JobSummary> =
            http_get(&format!("{}/v1/jobs?experiment={exp}", self.url)).ok()?;
        http_get(&format!("{}/v1/jobs/{}", self.url, jobs.first()?.id)).ok()
    }

    fn running_pid(&self, exp: ExperimentId) -> u32 {
        wait("a job to run", Duration::from_secs(30), || {
            let d = self.job(exp)?;
            (d.summary.state == JobState::Running).then_some(())?;
            d.attempts_detail.last()?.pid
        })
    }
}

#[test]
fn an_agent_down_longer_than_the_ttl_kills_its_orphans_before_taking_work() {
    let site = Site::new("2s");
    // Another agent of the same host, with a job of its own.
    let _other = site.agent("other", "other.log");
    let neighbour = site.submit(serde_json::json!({"name": "neighbour",
        "command": [fake_job().display().to_string(), "--seconds", "600"]}));
    let neighbour_pid = site.running_pid(neighbour);

    let mut agent = site.agent("gpu-1", "agent.log");
    let pid_file = site.dir.path().join("orphan.pid");
    let orphaner = site.submit(serde_json::json!({"name": "orphaner", "command": [
        fake_job().display().to_string(), "--seconds", "600", "--orphan-mem", "2GiB",
        "--orphan-seconds", "600", "--orphan-pid-file", pid_file.display().to_string()],
        "retry": {"max_attempts": 1}, "resources": {"memory": "4GiB"}}));
    let orphan: u32 = wait("the orphan", Duration::from_secs(30), || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    });
    agent.kill9().expect("kill -9");
    // Down longer than the TTL: the coordinator records the attempt lost and will not name
    // it to the agent when it comes back.
    let d = wait(
        "the attempt to be recorded lost",
        Duration::from_secs(30),
        || site.job(orphaner).filter(|d| d.summary.state.is_terminal()),
    );
    assert_eq!(d.attempts_detail[0].failure_class, Some(FailureClass::Lost));
    assert!(alive(orphan), "the orphan outlives its agent");

    // New work waits for the agent; when it starts it looks for the orphan.
    let probe = site.dir.path().join("probe.txt");
    let script = format!(
        "if [ -r /proc/{orphan}/status ] && ! grep -q '^State:.*Z' /proc/{orphan}/status; \
         then echo alive > {p}; else echo gone > {p}; fi",
        p = probe.display()
    );
    let _probe_exp = site.submit(
        serde_json::json!({"name": "probe", "command": ["sh", "-c", script],
        "resources": {"memory": "1GiB"}}),
    );
    let restarted = site.agent("gpu-1", "agent2.log");
    let seen = wait("the probe job", Duration::from_secs(60), || {
        std::fs::read_to_string(&probe)
            .ok()
            .filter(|s| !s.is_empty())
    });
    assert_eq!(
        seen.trim(),
        "gone",
        "the orphan of the lost attempt was alive when new work started\n{}",
        restarted.output()
    );
    assert!(!alive(orphan));
    assert!(
        alive(neighbour_pid),
        "the other agent's job on the same host must survive the sweep"
    );
}

#[test]
fn a_quarantine_left_by_a_killed_agent_lifts_by_itself_after_its_restart() {
    let mut h = Headroom::start(UpOptions {
        fake_gpus: "1x24GiB".into(),
        kill_grace: "300ms".into(),
        lease_ttl: "3s".into(),
        extra: vec!["--verify-timeout".into(), "1s".into()],
        ..Default::default()
    })
    .expect("headroom up");
    // A process of another owner on which the job books 3 GiB as it exits: cleanup cannot
    // verify the GPU, which is quarantined until that process is gone.
    let holder = KillOnDrop(
        std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep"),
    );
    let script = format!(
        "echo 0:3072 > {}/{}",
        h.data_dir().join("fake-gpus").display(),
        holder.0.id()
    );
    let exp = h
        .submit_api(
            serde_json::json!({"name": "leak", "command": ["sh", "-c", script],
            "resources": {"memory": "1GiB"}}),
        )
        .expect("submit")
        .experiment
        .expect("stored");
    let jobs = h.wait_done(exp, Duration::from_secs(30));
    let a = &h.job(jobs[0].id).expect("job").attempts_detail[0];
    assert_eq!(a.cleanup_verified, Some(false));
    assert!(!h.nodes().expect("nodes")[0].gpus[0].quarantine.is_empty());

    // The agent dies; the leftover goes while it is down.
    h.kill9().expect("kill -9");
    drop(holder);
    h.restart().expect("restart");
    h.wait_for(
        "the quarantine to lift by itself",
        Duration::from_secs(30),
        || {
            Ok(h.nodes()?
                .first()
                .filter(|n| n.alive && n.gpus.first().is_some_and(|g| g.quarantine.is_empty()))
                .map(|_| ()))
        },
    );
    let after = h
        .submit_api(serde_json::json!({"name": "after", "command": ["true"],
            "resources": {"memory": "1GiB"}}))
        .expect("submit")
        .experiment
        .expect("stored");
    let jobs = h.wait_done(after, Duration::from_secs(30));
    assert_eq!(jobs[0].state, JobState::Succeeded);
}
