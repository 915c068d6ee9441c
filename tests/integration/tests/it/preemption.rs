//! Preemption end to end, with the real binaries and two users' tokens: a job of a
//! `preemptible` experiment holds the fake GPU's memory, another user's job waits for it,
//! and the first is sent its checkpoint signal, saves its step in `HEADROOM_JOB_DIR`, is
//! requeued without spending an attempt, resumes from that step after the other's job and
//! succeeds, its energy counted over both attempts; `cancel --requeue` does the same on
//! demand.

use std::path::Path;
use std::time::Duration;

use headroom_integration_tests::standalone::{Agent, AgentOptions, Coordinator};
use headroom_integration_tests::{
    block_on, client_for, fake_job, headroom_as, headroom_ok, wait_until,
};
use headroom_shared::api::usage::UsageReport;
use headroom_shared::api::{JobDetail, JobSummary};
use headroom_shared::client::Client;
use headroom_shared::{ExperimentId, FailureClass, JobState};

const ADMIN: &str = "integration-admin-token-0123456789";

fn token(url: &str, name: &str) -> String {
    headroom_ok(
        url,
        ADMIN,
        &["token", "create", "--name", name, "--role", "user"],
    )
    .trim()
    .to_string()
}

/// A training script as a lab writes one: resumes from the step it saved, holds 16 GiB of
/// the fake GPU while it steps, and on SIGUSR1 saves its step and exits.
fn trainer(dir: &Path, steps: u32) -> String {
    let path = dir.join("train.sh");
    std::fs::write(
        &path,
        format!(
            "step=0\n\
             [ -f \"$HEADROOM_JOB_DIR/step\" ] && step=$(cat \"$HEADROOM_JOB_DIR/step\")\n\
             echo \"resuming at step $step (restart $HEADROOM_RESTART_COUNT, ${{HEADROOM_STOP_REASON:-first run}})\"\n\
             {fake} --mem 16GiB --util 90 --seconds 600 &\n\
             trap 'echo $step > \"$HEADROOM_JOB_DIR/step\"; echo \"saved at step $step\"; exit 0' USR1\n\
             while [ $step -lt {steps} ]; do step=$((step+1)); sleep 0.1; done\n\
             echo \"done at step $step\"\n",
            fake = fake_job().display()
        ),
    )
    .expect("script");
    path.display().to_string()
}

fn spec(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, format!("name: {name}\n{body}")).expect("spec");
    path.display().to_string()
}

fn jobs(c: &Client, exp: ExperimentId) -> Vec<JobSummary> {
    block_on(c.jobs(Some(exp), None))
        .expect("runtime")
        .expect("jobs")
}

fn detail(c: &Client, j: &JobSummary) -> JobDetail {
    block_on(c.job(j.id)).expect("runtime").expect("job")
}

fn experiment(c: &Client, name: &str) -> ExperimentId {
    block_on(c.experiments())
        .expect("runtime")
        .expect("experiments")
        .into_iter()
        .find(|e| e.name == name)
        .map(|e| e.id)
        .expect("the experiment")
}

fn log(c: &Client, attempt: headroom_shared::AttemptId) -> String {
    let chunk = block_on(c.log(attempt, 0, 0))
        .expect("runtime")
        .expect("log");
    String::from_utf8_lossy(&chunk.bytes).into_owned()
}

#[test]
fn a_preempted_job_saves_on_its_signal_resumes_from_its_job_dir_and_succeeds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--admin-token", ADMIN]).expect("coordinator");
    let url = coord.url.clone();
    let (alice, bob) = (token(&url, "alice"), token(&url, "bob"));
    let as_user = |t: &str| {
        client_for(&url)
            .and_then(|c| Ok(c.with_token(Some(t))?))
            .expect("client")
    };
    let (ca, cb) = (as_user(&alice), as_user(&bob));
    let node = headroom_ok(
        &url,
        ADMIN,
        &["token", "create", "--name", "node-a", "--role", "agent"],
    );
    let job_dirs = dir.path().join("job-dirs");
    std::fs::create_dir_all(&job_dirs).expect("job dirs");
    let _agent = Agent::start(
        &url,
        dir.path(),
        AgentOptions::node("node-a")
            .env("HEADROOM_AGENT_TOKEN", node.trim())
            .flags(&["--plan", "2", "--job-dirs", &job_dirs.display().to_string()]),
    )
    .expect("agent");

    // Alice's training takes 18 GiB of the GPU's 21.6 usable; Bob's 8 GiB job cannot fit.
    let script = trainer(dir.path(), 60);
    headroom_ok(
        &url,
        &alice,
        &[
            "submit",
            &spec(
                dir.path(),
                "train",
                &format!(
                    "command: [sh, {script}]\nresources: {{gpus: 1, memory: 18GiB}}\n\
                     retry: {{max_attempts: 1}}\npreemptible: true\n\
                     checkpoint: {{signal: USR1, lead: 30s}}\n"
                ),
            ),
        ],
    );
    let train = experiment(&ca, "train");
    wait_until("Alice's training to step", Duration::from_secs(30), || {
        let js = jobs(&ca, train);
        let d = detail(&ca, &js[0]);
        let a = d.attempts_detail.first()?;
        log(&ca, a.id).contains("resuming at step 0").then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    headroom_ok(
        &url,
        &bob,
        &[
            "submit",
            &spec(
                dir.path(),
                "probe",
                &format!(
                    "command: [{}, --mem, 6GiB, --seconds, \"1\"]\n\
                     resources: {{gpus: 1, memory: 8GiB}}\n",
                    fake_job().display()
                ),
            ),
        ],
    );
    let probe = experiment(&cb, "probe");

    // Bob's job ends first; then Alice's, resumed from where it saved.
    let done = |c: &Client, e| {
        let js = jobs(c, e);
        (js[0].state == JobState::Succeeded).then(|| js[0].clone())
    };
    let bobs = wait_until("Bob's job to succeed", Duration::from_secs(60), || {
        done(&cb, probe)
    });
    let alices = wait_until("Alice's job to succeed", Duration::from_secs(60), || {
        done(&ca, train)
    });
    let d = detail(&ca, &alices);
    let classes: Vec<Option<FailureClass>> =
        d.attempts_detail.iter().map(|a| a.failure_class).collect();
    assert_eq!(
        classes,
        vec![Some(FailureClass::Preempted), None],
        "preempted once, then succeeded: no failed attempt"
    );
    let (first, second) = (&d.attempts_detail[0], &d.attempts_detail[1]);
    let first_log = log(&ca, first.id);
    assert!(
        first_log.contains("sent SIGUSR1 (checkpoint)"),
        "{first_log}"
    );
    let saved: u32 = first_log
        .lines()
        .find_map(|l| l.strip_prefix("saved at step "))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no saved step in {first_log}"));
    assert!(saved >= 10, "{first_log}");
    let second_log = log(&ca, second.id);
    assert!(
        second_log.contains(&format!("resuming at step {saved} (restart 1, preempted)")),
        "{second_log}"
    );
    assert!(second_log.contains("done at step 60"), "{second_log}");
    // Bob's job ran in between, and Alice's job used its one attempt only once.
    let bob_started = detail(&cb, &bobs).attempts_detail[0]
        .started_at
        .expect("started");
    assert!(first.ended_at.expect("ended") <= bob_started);
    assert!(second.started_at.expect("started") >= bob_started);
    assert_eq!(alices.last_failure, Some(FailureClass::Preempted));

    // The experiment's energy counts both attempts.
    let energy: f64 = d
        .attempts_detail
        .iter()
        .map(|a| a.measurements.energy_j.expect("energy measured"))
        .sum();
    assert!(
        d.attempts_detail
            .iter()
            .all(|a| a.measurements.energy_j > Some(0.0))
    );
    let report: UsageReport = serde_json::from_str(&headroom_ok(
        &url,
        &alice,
        &[
            "usage",
            "--by",
            "experiment",
            "--since",
            "1h",
            "--output",
            "json",
        ],
    ))
    .expect("report");
    let row = report
        .rows
        .iter()
        .find(|r| r.key == train.to_string())
        .unwrap_or_else(|| panic!("{train} in {report:?}"));
    assert_eq!(row.attempts, 2, "{row:?}");
    let kwh = energy / 3.6e6;
    assert!(
        (row.energy_kwh - kwh).abs() <= kwh * 0.01 + 1e-6,
        "{} kWh reported, {kwh} kWh over the attempts",
        row.energy_kwh
    );

    // `cancel --requeue`: the same on demand, for the user's own running job.
    headroom_ok(
        &url,
        &alice,
        &[
            "submit",
            &spec(
                dir.path(),
                "again",
                &format!(
                    "command: [sh, {script}]\nresources: {{gpus: 1, memory: 18GiB}}\n\
         retry: {{max_attempts: 1}}\ncheckpoint: {{signal: USR1}}\n"
                ),
            ),
        ],
    );
    let again = experiment(&ca, "again");
    let job = wait_until("the job to run", Duration::from_secs(30), || {
        let js = jobs(&ca, again);
        (js[0].state == JobState::Running).then(|| js[0].clone())
    });
    std::thread::sleep(Duration::from_millis(500));
    let said = headroom_ok(&url, &alice, &["cancel", &job.id.to_string(), "--requeue"]);
    assert!(said.contains("requeued"), "{said}");
    let resumed = wait_until("it to succeed", Duration::from_secs(60), || {
        done(&ca, again)
    });
    let d = detail(&ca, &resumed);
    assert_eq!(
        d.attempts_detail[0].failure_class,
        Some(FailureClass::Requeued)
    );
    assert!(log(&ca, d.attempts_detail[1].id).contains("(restart 1, requeued)"));
    // Bob may not requeue Alice's job.
    let denied = headroom_as(&url, &bob, &["cancel", &job.id.to_string(), "--requeue"]);
    assert!(!denied.status.success());
}
