//! Cluster faults on PostgreSQL: coordinator replicas, many agents, kill -9s, a database
//! restart and a partition. Each test asserts that every job ends with exactly one
//! successful attempt, that no two attempts of a job ever ran at the same time, and that
//! nothing is lost.

use std::collections::HashMap;
use std::time::Duration;

use headroom_integration_tests::receivers::WebhookReceiver;
use headroom_integration_tests::records::{DeathWatch, Timeline};
use headroom_integration_tests::standalone::wait_registered;
use headroom_integration_tests::{
    Link, Postgres, Proc, alive, fake_job, free_port, http_get, http_post, wait_until as wait,
};
use headroom_shared::api::{JobDetail, JobSummary, Progress, SubmitResponse};
use headroom_shared::{ExperimentId, FailureClass, JobState};

/// Short, so that fault tests see leases expire quickly.
const TTL: &str = "3s";

struct Cluster {
    /// The coordinators' lease TTL.
    ttl: &'static str,
    pg: Postgres,
    dir: tempfile::TempDir,
    ports: Vec<u16>,
    coords: Vec<Option<Proc>>,
    agents: Vec<Option<Proc>>,
    links: HashMap<usize, Link>,
    record: std::path::PathBuf,
    /// Sees every recorded job process die, from outside.
    deaths: Option<DeathWatch>,
    /// Where the replicas may send alerts.
    hook: WebhookReceiver,
}

impl Cluster {
    fn new(replicas: usize) -> Self {
        Self::with_ttl(replicas, TTL)
    }

    fn with_ttl(replicas: usize, ttl: &'static str) -> Self {
        let pg = Postgres::start().expect("postgres");
        let dir = tempfile::tempdir().expect("tempdir");
        headroom_integration_tests::open_to_jobs(dir.path()).expect("open to jobs");
        let record = dir.path().join("timeline.jsonl");
        let mut c = Self {
            ttl,
            pg,
            dir,
            ports: (0..replicas).map(|_| free_port().expect("port")).collect(),
            coords: vec![],
            agents: vec![],
            links: HashMap::new(),
            deaths: Some(DeathWatch::start(record.clone())),
            record,
            hook: WebhookReceiver::start().expect("webhook receiver"),
        };
        for i in 0..replicas {
            c.coords.push(None);
            c.start_coordinator(i);
        }
        c
    }

    fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    /// Any replica that answers.
    fn api(&self) -> String {
        for i in 0..self.ports.len() {
            if self.coords[i].is_some()
                && http_get::<serde_json::Value>(&format!("{}/v1/health", self.url(i))).is_ok()
            {
                return self.url(i);
            }
        }
        panic!("no coordinator answers");
    }

    fn start_coordinator(&mut self, i: usize) {
        self.start_coordinator_at(i, None);
    }

    /// Starts replica `i`, its wall clock `skew` (`+3s`) off the machine's when given (by
    /// libfaketime preloaded into the coordinator itself, not the `faketime` wrapper, whose
    /// child outlived it; the monotonic clock left alone).
    fn start_coordinator_at(&mut self, i: usize, skew: Option<&str>) {
        let args: Vec<String> = vec![
            "--listen".into(),
            format!("127.0.0.1:{}", self.ports[i]),
            "--database-url".into(),
            self.pg.url(),
            "--data-dir".into(),
            self.dir
                .path()
                .join(format!("coord{i}"))
                .display()
                .to_string(),
            "--lease-ttl".into(),
            self.ttl.into(),
            "--alert-webhook-hosts".into(),
            format!("127.0.0.1:{}", self.hook.port),
        ];
        let log = self.dir.path().join(format!("coord{i}.log"));
        let p = match skew {
            None => Proc::start("headroom-coordinator", &args, log),
            Some(skew) => {
                let lib = FAKETIME_LIBS
                    .iter()
                    .find(|l| std::path::Path::new(l).exists())
                    .unwrap_or_else(|| {
                        panic!("no libfaketime in {FAKETIME_LIBS:?} (apt: faketime)")
                    });
                Proc::start_with_env(
                    "headroom-coordinator",
                    &args,
                    &[
                        ("LD_PRELOAD", lib),
                        ("FAKETIME", skew),
                        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
                    ],
                    log,
                )
            }
        }
        .expect("coordinator");
        let url = self.url(i);
        wait("a coordinator", Duration::from_secs(30), || {
            http_get::<serde_json::Value>(&format!("{url}/v1/health"))
                .ok()
                .map(|_| ())
        });
        self.coords[i] = Some(p);
    }

    /// Adds an agent on replica `replica`; through a cuttable link when `linked`.
    fn add_agent(&mut self, replica: usize, gpus: &str, plan: &str, linked: bool) -> usize {
        let j = self.agents.len();
        let port = if linked {
            let link = Link::new(self.ports[replica]).expect("link");
            let port = link.port;
            self.links.insert(j, link);
            port
        } else {
            self.ports[replica]
        };
        let args: Vec<String> = [
            "--coordinator",
            &format!("http://127.0.0.1:{port}"),
            "--node",
            &format!("node{j}"),
            "--gpu-backend",
            "fake",
            "--fake-gpus",
            gpus,
            "--plan",
            plan,
            "--kill-grace",
            "500ms",
            "--verify-timeout",
            "5s",
            "--data-dir",
            &self
                .dir
                .path()
                .join(format!("agent{j}"))
                .display()
                .to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = self.dir.path().join(format!("agent{j}.log"));
        let agent = Proc::start("headroom-agent", &args, log).expect("agent");
        // Fails with the agent's output, which tells why (it once timed out under load).
        wait_registered(&self.api(), &format!("node{j}"), &agent);
        self.agents.push(Some(agent));
        j
    }

    fn submit(&self, name: &str, runs: u32, seconds: f64) -> ExperimentId {
        self.submit_to(&self.api(), name, runs, seconds)
    }

    /// Submits through the coordinator at `api`.
    fn submit_to(&self, api: &str, name: &str, runs: u32, seconds: f64) -> ExperimentId {
        let spec = serde_json::json!({"spec": {"name": name,
            "command": [fake_job().display().to_string(), "--seconds", seconds.to_string(),
                        "--mem", "100MiB", "--record", self.record.display().to_string()],
            "runs_per_config": runs, "resources": {"memory": "200MiB"},
            "retry": {"max_attempts": 5, "on": ["lost"]}}});
        let (status, body) = http_post(&format!("{api}/v1/experiments"), &spec).expect("submit");
        assert_eq!(status, 200, "{body}");
        let r: SubmitResponse = serde_json::from_value(body).expect("response");
        r.experiment.expect("stored")
    }

    fn wait_done(&self, exp: ExperimentId, timeout: Duration) {
        wait("every job to end", timeout, || {
            let p: Progress =
                http_get(&format!("{}/v1/progress?experiment={exp}", self.api())).ok()?;
            (p.counts.finished() == p.counts.total()).then_some(())
        });
    }

    /// Waits until at least `n` jobs succeeded: work is under way.
    fn wait_succeeded(&self, exp: ExperimentId, n: usize) {
        wait("work under way", Duration::from_secs(30), || {
            let done = self
                .jobs(exp)
                .iter()
                .filter(|j| j.state == JobState::Succeeded)
                .count();
            (done >= n).then_some(())
        });
    }

    fn jobs(&self, exp: ExperimentId) -> Vec<JobSummary> {
        http_get(&format!("{}/v1/jobs?experiment={exp}", self.api())).expect("jobs")
    }

    fn job(&self, id: headroom_shared::JobId) -> JobDetail {
        http_get(&format!("{}/v1/jobs/{id}", self.api())).expect("job")
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for f in std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if f.path().extension().is_some_and(|e| e == "log") {
                out.push_str(&format!("==> {}\n", f.path().display()));
                out.push_str(&std::fs::read_to_string(f.path()).unwrap_or_default());
            }
        }
        out
    }

    /// Every job succeeded exactly once, and no two of its attempts' processes ran at the
    /// same time: the real end of each (seen dead from outside, SIGKILLed ones included)
    /// came before the next one's start. Returns how many attempts were lost on the way, and
    /// the timeline.
    fn assert_exactly_once(&mut self, exp: ExperimentId) -> (usize, Timeline) {
        let jobs = self.jobs(exp);
        let timeline = self
            .deaths
            .take()
            .expect("checked once")
            .finish()
            .expect("the record file and the processes it lists");
        let mut lost = 0;
        for j in &jobs {
            assert_eq!(
                j.state,
                JobState::Succeeded,
                "job {} ended {}\n{}",
                j.id,
                j.state,
                self.logs()
            );
            let d = self.job(j.id);
            let wins = d
                .attempts_detail
                .iter()
                .filter(|a| a.success == Some(true))
                .count();
            assert_eq!(wins, 1, "job {} succeeded {wins} times", j.id);
            lost += d
                .attempts_detail
                .iter()
                .filter(|a| a.failure_class == Some(FailureClass::Lost))
                .count();
            let attempts: Vec<String> =
                d.attempts_detail.iter().map(|a| a.id.to_string()).collect();
            if let Err(e) = timeline.assert_apart(&format!("job {}", j.id), &attempts) {
                panic!("{e:#}\n{:#?}", d.attempts_detail);
            }
        }
        (lost, timeline)
    }
}

#[test]
fn two_replicas_four_agents_a_thousand_jobs_each_succeed_once() {
    // No fault here, so no lease may be lost: a TTL long enough that a heavily loaded test
    // machine (heartbeats answered seconds late) does not fence healthy agents.
    let mut c = Cluster::with_ttl(2, "10s");
    // Both replicas send alerts: the experiment's end reaches the webhook once.
    let sub = serde_json::json!({"on": ["experiment-ended"],
        "target": {"webhook": {"url": c.hook.url("/hook")}}});
    let (status, body) = http_post(&format!("{}/v1/alerts", c.url(0)), &sub).expect("subscribe");
    assert_eq!(status, 200, "{body}");
    for j in 0..4 {
        c.add_agent(j % 2, "2x24GiB", "8,8", false);
    }
    let exp = c.submit("many", 1000, 0.01);
    c.wait_done(exp, Duration::from_secs(400));
    let (lost, timeline) = c.assert_exactly_once(exp);
    assert_eq!(lost, 0);
    let starts = timeline.records.iter().filter(|r| r.event == "start");
    assert_eq!(starts.count(), 1000);
    wait(
        "the experiment's end at the webhook",
        Duration::from_secs(30),
        || (!c.hook.received().is_empty()).then_some(()),
    );
    std::thread::sleep(Duration::from_secs(3));
    let got = c.hook.received();
    assert_eq!(
        got.len(),
        1,
        "{:?}",
        got.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    assert!(got[0].body.contains("1000 succeeded"), "{}", got[0].body);
}

/// An agent killed for good mid-attempts: its supervisors renew their leases themselves
/// (TTL 3 s, the jobs run 6 s) and report their ends themselves, so each job runs once, to
/// its end, on the dead agent's node, and none is lost or run again by the agent beside it.
#[test]
fn an_agent_killed_for_good_leaves_its_attempts_to_end_and_report_once() {
    let mut c = Cluster::new(1);
    let victim = c.add_agent(0, "1x24GiB", "4", false);
    let exp = c.submit("orphans", 4, 6.0);
    wait(
        "four jobs running on the victim",
        Duration::from_secs(30),
        || {
            let running = c
                .jobs(exp)
                .iter()
                .filter(|j| j.state == JobState::Running)
                .count();
            (running == 4).then_some(())
        },
    );
    let pids: Vec<u32> = wait("four start records", Duration::from_secs(30), || {
        let records = headroom_integration_tests::read_records(&c.record).ok()?;
        let pids: Vec<u32> = records.iter().map(|r| r.pid).collect();
        (pids.len() == 4).then_some(pids)
    });
    c.agents[victim]
        .as_mut()
        .expect("victim")
        .kill9()
        .expect("kill -9");
    c.add_agent(0, "1x24GiB", "4", false);
    c.wait_done(exp, Duration::from_secs(60));
    let (lost, timeline) = c.assert_exactly_once(exp);
    assert_eq!(lost, 0, "no attempt of the dead agent was lost");
    for j in c.jobs(exp) {
        let d = c.job(j.id);
        assert_eq!(d.attempts_detail.len(), 1, "{:#?}", d.attempts_detail);
        assert!(pids.contains(&d.attempts_detail[0].pid.unwrap_or(0)));
    }
    // Each ran to its own end: never told to stop.
    for &pid in &pids {
        let attempt = &timeline
            .records
            .iter()
            .find(|r| r.pid == pid)
            .expect("record")
            .attempt;
        let events = timeline.events(attempt);
        assert_eq!(events, ["start", "end"], "pid {pid}");
    }
}

/// Lease time is the database's clock: a replica whose wall clock runs 1.2 TTL ahead of the
/// others (faketime) sweeps beside them, yet expires no lease early, so no job renewed
/// through the other replica is lost or run beside itself.
#[test]
fn a_replica_with_a_skewed_clock_expires_no_lease_early() {
    let mut c = Cluster::with_ttl(1, "2500ms");
    c.coords.push(None);
    c.ports.push(free_port().expect("port"));
    c.start_coordinator_at(1, Some("+3s"));
    let skewed = c.url(1);
    let health: serde_json::Value = http_get(&format!("{skewed}/v1/health")).expect("health");
    assert!(health.is_object());
    // Its clock is ahead indeed (the `Date` it answers with).
    let ahead = server_date(c.ports[1]) - chrono::Utc::now();
    assert!(
        ahead >= chrono::Duration::seconds(2),
        "the skewed replica's clock is {ahead} ahead"
    );
    c.add_agent(0, "1x24GiB", "4", false);
    let exp = c.submit("skew", 4, 6.0);
    c.wait_done(exp, Duration::from_secs(60));
    let (lost, _) = c.assert_exactly_once(exp);
    assert_eq!(
        lost,
        0,
        "the skewed replica expired leases early\n{}",
        c.logs()
    );
    for j in c.jobs(exp) {
        assert_eq!(c.job(j.id).attempts_detail.len(), 1);
    }
}

/// Where Debian (and others) keep libfaketime.
const FAKETIME_LIBS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];

/// The `Date` header a server on this port answers with.
fn server_date(port: u16) -> chrono::DateTime<chrono::Utc> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(b"GET /v1/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("answer");
    let date = answer
        .lines()
        .find_map(|l| {
            l.strip_prefix("date: ")
                .or_else(|| l.strip_prefix("Date: "))
        })
        .unwrap_or_else(|| panic!("no Date header: {answer}"));
    chrono::DateTime::parse_from_rfc2822(date.trim())
        .unwrap_or_else(|e| panic!("`{date}`: {e}"))
        .with_timezone(&chrono::Utc)
}

#[test]
fn a_coordinator_killed_under_load_loses_and_duplicates_nothing() {
    let mut c = Cluster::new(2);
    c.add_agent(0, "2x24GiB", "4,4", false);
    c.add_agent(1, "2x24GiB", "4,4", false);
    let exp = c.submit("load", 200, 0.2);
    c.wait_succeeded(exp, 30);
    c.coords[0]
        .as_mut()
        .expect("replica 0")
        .kill9()
        .expect("kill -9");
    std::thread::sleep(Duration::from_millis(1000));
    c.start_coordinator(0);
    c.wait_done(exp, Duration::from_secs(120));
    c.assert_exactly_once(exp);
}

#[test]
fn the_database_restarting_under_load_is_survived() {
    let mut c = Cluster::new(1);
    c.add_agent(0, "2x24GiB", "4,4", false);
    c.add_agent(0, "2x24GiB", "4,4", false);
    let exp = c.submit("dbload", 200, 0.2);
    c.wait_succeeded(exp, 30);
    c.pg.restart().expect("pg_ctl restart");
    c.wait_done(exp, Duration::from_secs(120));
    c.assert_exactly_once(exp);
}

#[test]
fn a_partitioned_agent_stops_its_attempts_and_its_stale_reports_are_refused() {
    let mut c = Cluster::new(1);
    let cut_off = c.add_agent(0, "1x24GiB", "1", true);
    let exp = c.submit("partitioned", 1, 8.0);
    let job = wait(
        "the job to run on the cut-off agent",
        Duration::from_secs(30),
        || {
            let jobs = c.jobs(exp);
            (jobs[0].state == JobState::Running).then(|| jobs[0].id)
        },
    );
    let first = c.job(job).attempts_detail[0].clone();
    assert_eq!(first.node, "node0");
    c.add_agent(0, "1x24GiB", "1", false);
    c.links[&cut_off].cut();
    // The cut-off agent stops the job itself before the coordinator gives it away.
    let pid = first.pid.expect("pid");
    wait(
        "the cut-off agent to stop its attempt",
        Duration::from_secs(10),
        || (!alive(pid)).then_some(()),
    );
    wait(
        "the job to run on the other node",
        Duration::from_secs(30),
        || {
            let d = c.job(job);
            d.attempts_detail
                .iter()
                .any(|a| a.node == "node1")
                .then_some(())
        },
    );
    c.links[&cut_off].heal();
    c.wait_done(exp, Duration::from_secs(60));
    let d = c.job(job);
    assert_eq!(
        d.attempts_detail[0].failure_class,
        Some(FailureClass::Lost),
        "the stale report changed nothing"
    );
    let (lost, timeline) = c.assert_exactly_once(exp);
    assert_eq!(lost, 1);
    // The cut-off attempt's process was stopped by SIGTERM (its record says when; it may
    // hear it more than once), not left to run out its 8 s.
    let events = timeline.events(&first.id.to_string());
    assert!(
        events.first() == Some(&"start")
            && events.last() == Some(&"end")
            && events[1..events.len() - 1].iter().all(|e| *e == "term")
            && events.len() >= 3,
        "the first attempt's process: {events:?}"
    );
    let t: Vec<i64> = timeline
        .records
        .iter()
        .filter(|r| r.attempt == first.id.to_string())
        .map(|r| r.t_ms)
        .collect();
    assert!(t[t.len() - 1] - t[0] < 8000, "it ran its full 8 s: {t:?}");
    // The cut-off agent heard its report was stale.
    let agent_log = c.agents[cut_off]
        .as_ref()
        .map(Proc::output)
        .unwrap_or_default();
    assert!(
        agent_log.contains("no longer ours") || agent_log.contains("stale"),
        "{agent_log}"
    );
}

/// Four agents, two on each replica, race for every job: submissions go through both
/// replicas in turn, then through both at once. Every job is leased once, and agents of both
/// replicas win some.
#[test]
fn agents_racing_through_both_replicas_lease_each_job_once() {
    let mut c = Cluster::new(2);
    for j in 0..4 {
        c.add_agent(j % 2, "1x24GiB", "1", false);
    }
    let mut exps = vec![];
    for i in 0..20 {
        let exp = c.submit_to(&c.url(i % 2), &format!("race{i}"), 1, 0.01);
        c.wait_done(exp, Duration::from_secs(30));
        exps.push(exp);
    }
    let (u0, u1) = (c.url(0), c.url(1));
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| c.submit_to(&u0, "burst0", 30, 0.01));
        let b = s.spawn(|| c.submit_to(&u1, "burst1", 30, 0.01));
        (a.join().expect("submit"), b.join().expect("submit"))
    });
    exps.extend([a, b]);
    let mut winners = std::collections::HashSet::new();
    for &exp in &exps {
        c.wait_done(exp, Duration::from_secs(60));
        for j in c.jobs(exp) {
            let d = c.job(j.id);
            assert_eq!(
                d.attempts_detail.len(),
                1,
                "leased twice: {:#?}",
                d.attempts_detail
            );
            assert_eq!(j.state, JobState::Succeeded, "{}", c.logs());
            winners.insert(d.attempts_detail[0].node.clone());
        }
    }
    let replica = |n: &str| n.trim_start_matches("node").parse::<usize>().map(|j| j % 2);
    let replicas: std::collections::HashSet<_> =
        winners.iter().filter_map(|n| replica(n).ok()).collect();
    assert_eq!(replicas.len(), 2, "only some agents ever won: {winners:?}");
    let timeline = c.deaths.take().expect("once").finish().expect("records");
    let starts = timeline.records.iter().filter(|r| r.event == "start");
    assert_eq!(starts.count(), 80, "one process per job");
}
