//! Running jobs outlive their agent: each attempt runs under a supervisor process of its own.
//! An agent killed with `kill -9` (or stopped for an upgrade) and started again on the same
//! data directory re-attaches to it: the job runs on with the same pid and is reported once.
//! An agent that stays away longer than the lease TTL leaves its supervisor to stop the job
//! before the coordinator may give it away, so the rerun elsewhere never overlaps it.
//! (An agent killed after its job ended and before it reported: `late_outcomes.rs`.)

use std::path::{Path, PathBuf};
use std::time::Duration;

use headroom_integration_tests::records::DeathWatch;
use headroom_integration_tests::standalone::{
    Agent, AgentOptions, Coordinator, job_of, running_pid, submit_json,
};
use headroom_integration_tests::{
    alive, binary, fake_job, http_get_text, is_waiting_supervisor, parent_of, read_records,
    scope_pids, supervisor_pids, wait_until as wait,
};
use headroom_shared::api::JobDetail;
use headroom_shared::{ExperimentId, FailureClass, JobState};
use nix::sys::signal::Signal;

fn agent(
    url: &str,
    dir: &Path,
    node: &str,
    opts: impl FnOnce(AgentOptions) -> AgentOptions,
) -> Agent {
    let base = AgentOptions::node(node)
        .kill_grace("300ms")
        .verify_timeout("5s");
    Agent::start(url, dir, opts(base)).expect("agent")
}

/// A job of `seconds` recording its start and end in `record`, retried when lost.
fn submit(url: &str, seconds: &str, record: &Path) -> ExperimentId {
    submit_json(
        url,
        &serde_json::json!({"name": "long", "command": [
            fake_job().display().to_string(), "--seconds", seconds, "--mem", "1GiB",
            "--record", record.display().to_string()],
            "retry": {"max_attempts": 3, "on": ["lost"]}}),
    )
}

fn ended(url: &str, exp: ExperimentId) -> JobDetail {
    wait("the job to end", Duration::from_secs(60), || {
        job_of(url, exp).filter(|d| d.summary.state.is_terminal())
    })
}

/// (start, end) records of each pid, in the order they started.
fn events(record: &Path) -> Vec<(String, u32)> {
    read_records(record)
        .expect("records")
        .into_iter()
        .map(|r| (r.event, r.pid))
        .collect()
}

/// The job succeeded with one attempt, whose process is `pid`, and which ran once.
fn ran_once_as(d: &JobDetail, pid: u32, record: &Path, log: &str) {
    assert_eq!(d.summary.state, JobState::Succeeded, "{d:#?}\n{log}");
    assert_eq!(d.attempts_detail.len(), 1, "{:#?}", d.attempts_detail);
    let a = &d.attempts_detail[0];
    assert_eq!((a.failure_class, a.exit_code), (None, Some(0)), "{a:#?}");
    assert_eq!(a.pid, Some(pid), "the same process ran on: {a:#?}");
    assert_eq!(a.cleanup_verified, Some(true), "{a:#?}");
    assert_eq!(
        events(record),
        vec![("start".to_string(), pid), ("end".to_string(), pid)],
        "started once, ran to its end once"
    );
}

#[test]
fn an_agent_killed_mid_attempt_and_restarted_within_the_ttl_re_attaches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--lease-ttl", "6s"]).expect("coordinator");
    let url = &coord.url;
    let record = dir.path().join("timeline.jsonl");
    let mut first = agent(url, dir.path(), "gpu-1", |o| o);
    let exp = submit(url, "4", &record);
    let pid = running_pid(url, exp);

    first.kill9().expect("kill -9");
    assert!(alive(pid), "the job survives its agent's death");
    // Its parent is its attempt's supervisor, named as such for `ps` and `top`.
    let parent = parent_of(pid).expect("the job's parent");
    let comm = std::fs::read_to_string(format!("/proc/{parent}/comm")).expect("comm");
    assert_eq!(
        comm.trim(),
        "hr-attempt",
        "the job's parent is its supervisor"
    );
    let again = agent(url, dir.path(), "gpu-1", |o| o.log("gpu-1-again.log"));
    let d = ended(url, exp);
    ran_once_as(&d, pid, &record, &again.output());
    assert!(
        again.output().contains("re-attached to a running attempt"),
        "{}",
        again.output()
    );
    wait(
        "nothing of the job to be left",
        Duration::from_secs(10),
        || (!alive(pid) && !alive(parent)).then_some(()),
    );
}

/// The supervisor an agent keeps waiting for its next lease runs nothing, and leaves when
/// its agent does, whether the agent exits or is killed.
#[test]
fn the_supervisor_waiting_for_the_next_lease_leaves_with_its_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--lease-ttl", "6s"]).expect("coordinator");
    let url = &coord.url;
    for (i, kill) in [true, false].into_iter().enumerate() {
        let mut a = agent(url, dir.path(), "gpu-1", |o| {
            o.log(&format!("agent-{i}.log"))
        });
        let waiting = wait(
            "a supervisor waiting for a lease",
            Duration::from_secs(10),
            || match supervisor_pids(&a.data_dir)[..] {
                [pid] if is_waiting_supervisor(pid) => Some(pid),
                _ => None,
            },
        );
        assert!(
            scope_pids(&a.data_dir)
                .iter()
                .all(|&p| parent_of(p) != Some(waiting)),
            "it runs nothing before a lease"
        );
        if kill {
            a.kill9().expect("kill -9");
        } else {
            let status = a.stop_with(Signal::SIGTERM, Duration::from_secs(30));
            assert!(status.success(), "{status}\n{}", a.output());
        }
        wait(
            "the waiting supervisor to leave",
            Duration::from_secs(10),
            || (!alive(waiting)).then_some(()),
        );
        assert!(scope_pids(&a.data_dir).is_empty(), "nothing is left");
    }
}

/// An upgrade as systemd does it with `KillMode=process`: SIGTERM to the agent only, the
/// binary replaced, the new one started from another path. The job (8 s: several heartbeats
/// and a full re-registration fit in it; the mechanism does not depend on the length, and
/// the suite must stay fast) runs on and succeeds once.
#[test]
fn an_upgrade_restarts_the_agent_from_another_binary_while_the_job_runs_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--lease-ttl", "6s"]).expect("coordinator");
    let url = &coord.url;
    let copy = |version: &str| -> PathBuf {
        let d = dir.path().join(version);
        std::fs::create_dir_all(&d).expect("dir");
        let to = d.join("headroom-agent");
        std::fs::copy(binary("headroom-agent"), &to).expect("copy the agent binary");
        to
    };
    let (old, new) = (copy("v1"), copy("v2"));
    let record = dir.path().join("timeline.jsonl");
    let mut first = agent(url, dir.path(), "gpu-1", |o| o.program(&old));
    let exp = submit(url, "8", &record);
    let pid = running_pid(url, exp);
    let supervisor = parent_of(pid).expect("the job's supervisor");

    let status = first.stop_with(Signal::SIGTERM, Duration::from_secs(30));
    assert!(status.success(), "{status}\n{}", first.output());
    assert!(
        alive(pid),
        "the job survives the agent's exit:\n{}",
        first.output()
    );
    // The old binary is gone, as a package upgrade replaces it.
    std::fs::remove_file(&old).expect("remove the old binary");
    let upgraded = agent(url, dir.path(), "gpu-1", |o| {
        o.program(&new).log("gpu-1-upgraded.log")
    });
    let d = ended(url, exp);
    ran_once_as(&d, pid, &record, &upgraded.output());
    wait(
        "nothing of the job to be left",
        Duration::from_secs(10),
        || (!alive(pid) && !alive(supervisor)).then_some(()),
    );
}

/// `kill -9` of the agent and no agent for longer than the TTL: the supervisor renews its
/// lease itself with the attempt's key and reports the end itself, so the job runs once, to
/// its end, on its node, while another agent waits for work beside it; the agent that comes
/// back finds nothing left to report.
#[test]
fn an_agent_away_longer_than_the_ttl_leaves_its_supervisor_to_keep_the_lease_and_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--lease-ttl", "2s"]).expect("coordinator");
    let url = &coord.url;
    let record = dir.path().join("timeline.jsonl");
    let mut first = agent(url, dir.path(), "gpu-1", |o| o);
    let exp = submit(url, "7", &record);
    let pid = running_pid(url, exp);
    first.kill9().expect("kill -9");
    let _other = agent(url, dir.path(), "gpu-2", |o| o);

    let d = ended(url, exp);
    ran_once_as(&d, pid, &record, &coord.output());
    assert_eq!(d.summary.node.as_deref(), Some("gpu-1"), "{d:#?}");
    assert!(
        coord.output().contains("reported by its supervisor"),
        "the end came from the supervisor:\n{}",
        coord.output()
    );
    // The agent comes back: its journal is empty, and it re-runs nothing.
    let back = agent(url, dir.path(), "gpu-1", |o| o.log("gpu-1-back.log"));
    back.wait_registered(url);
    let journal: Vec<_> = std::fs::read_dir(back.data_dir.join("outcomes"))
        .expect("journal")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .collect();
    assert!(journal.is_empty(), "{journal:?}");
    assert_eq!(job_of(url, exp).expect("job").attempts_detail.len(), 1);
}

/// `kill -9` of the agent while the coordinator cannot be reached either (frozen for longer
/// than the TTL): the supervisor stops the job before its lease may expire, the job runs
/// again on another node once the coordinator is back, and the real process spans of the
/// two attempts do not overlap. The first attempt's end is answered (refused: its job went
/// on elsewhere) by the time its agent comes back, and nothing of it is left to report.
#[test]
fn a_supervisor_cut_off_from_agent_and_coordinator_stops_the_job_in_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--lease-ttl", "3s"]).expect("coordinator");
    let url = &coord.url;
    let record = dir.path().join("timeline.jsonl");
    let watch = DeathWatch::start(record.clone());
    let mut first = agent(url, dir.path(), "gpu-1", |o| o);
    let exp = submit(url, "600", &record);
    let pid = running_pid(url, exp);

    first.kill9().expect("kill -9");
    coord
        .signal(Signal::SIGSTOP)
        .expect("freeze the coordinator");
    wait("the job to be stopped", Duration::from_secs(10), || {
        (!alive(pid)).then_some(())
    });
    coord.signal(Signal::SIGCONT).expect("thaw the coordinator");
    let _rescuer = agent(url, dir.path(), "gpu-2", |o| o);
    let d = wait("the job to run again", Duration::from_secs(60), || {
        job_of(url, exp)
            .filter(|d| d.attempts_detail.len() >= 2 && d.attempts_detail[1].pid.is_some())
    });
    let first_attempt = &d.attempts_detail[0];
    assert_eq!(
        first_attempt.failure_class,
        Some(FailureClass::Lost),
        "{d:#?}"
    );
    let attempts: Vec<String> = d.attempts_detail.iter().map(|a| a.id.to_string()).collect();
    let timeline = watch.finish().expect("timeline");
    timeline
        .assert_apart("the job", &attempts)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let first_end = timeline.spans(&attempts[0])[0].end;
    let second_start = timeline.spans(&attempts[1])[0].start;
    assert!(first_end < second_start, "{first_end} < {second_start}");

    let back = agent(url, dir.path(), "gpu-1", |o| o.log("gpu-1-back.log"));
    back.wait_registered(url);
    wait(
        "the journalled end to be answered",
        Duration::from_secs(30),
        || {
            let left = std::fs::read_dir(back.data_dir.join("outcomes"))
                .ok()?
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .count();
            (left == 0).then_some(())
        },
    );
    let supervisors =
        std::fs::read_to_string(back.data_dir.join("supervisors.log")).unwrap_or_default();
    assert!(
        supervisors.contains("lease not renewed in time"),
        "the supervisor stopped the job itself:\n{supervisors}"
    );
    let d = job_of(url, exp).expect("job");
    assert_eq!(d.attempts_detail[0].failure_class, Some(FailureClass::Lost));
}

/// The log of a job whose agent is gone for good reaches the coordinator whole: its
/// supervisor ships what the agent had not, before it reports the end.
#[test]
fn the_log_of_a_job_whose_agent_is_gone_reaches_the_coordinator_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--lease-ttl", "2s"]).expect("coordinator");
    let url = &coord.url;
    let mut first = agent(url, dir.path(), "gpu-1", |o| o);
    let exp = submit_json(
        url,
        &serde_json::json!({"name": "talks", "command": ["sh", "-c",
            "echo first line; sleep 4; seq 1 20000 | sed 's/^/line /'; echo last line"]}),
    );
    running_pid(url, exp);
    first.kill9().expect("kill -9");
    let d = ended(url, exp);
    assert_eq!(d.summary.state, JobState::Succeeded, "{d:#?}");
    let attempt = d.attempts_detail[0].id;
    let (status, log) = http_get_text(&format!("{url}/v1/attempts/{attempt}/log")).expect("log");
    assert_eq!(status, 200);
    assert!(
        log.starts_with("first line\n"),
        "{}",
        &log[..log.len().min(200)]
    );
    assert!(log.contains("line 12345\n"), "the middle is there");
    assert!(
        log.ends_with("last line\n"),
        "{}",
        &log[log.len().saturating_sub(200)..]
    );
}
