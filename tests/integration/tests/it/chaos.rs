//! Chaos, as a cluster operator tried it: two coordinator replicas on PostgreSQL, four
//! agents, 400 jobs of 0.3-2 s, and for 40 s an agent killed with `kill -9` every few
//! seconds and started again 1-6 s later, with a lease TTL of 4 s (so most outages outlast
//! it), and one agent killed once and never started again. Every job succeeds, none runs to
//! its end twice, no two attempts of a job overlap, and no process of any job is left.
//!
//! While an agent is away its supervisors renew their leases and report their ends
//! themselves (with the key issued with each lease), so an outage longer than the TTL loses
//! nothing that ran. Only a supervisor that could not renew in time (a machine so loaded
//! that a renewal came late) stops its job, before the lease may expire: that attempt is
//! lost and its job runs again, never beside it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use headroom_integration_tests::records::DeathWatch;
use headroom_integration_tests::{
    Postgres, Proc, children_of, fake_job, free_port, http_get, http_post, is_waiting_supervisor,
    scope_pids, wait_until as wait,
};
use headroom_shared::api::{JobDetail, JobSummary, Progress, SubmitResponse};
use headroom_shared::{FailureClass, JobState};

const AGENTS: usize = 4;

/// xorshift: the same chaos on every run, different per step.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        lo + self.0 % (hi - lo + 1)
    }
}

struct Site {
    _pg: Postgres,
    dir: tempfile::TempDir,
    urls: Vec<String>,
    _coords: Vec<Proc>,
    agents: Vec<Option<Proc>>,
}

impl Site {
    fn agent_dir(&self, j: usize) -> PathBuf {
        self.dir.path().join(format!("agent{j}"))
    }

    fn start_agent(&mut self, j: usize, life: usize) {
        let args: Vec<String> = [
            "--coordinator",
            &self.urls[j % self.urls.len()],
            "--node",
            &format!("node{j}"),
            "--gpu-backend",
            "fake",
            "--fake-gpus",
            "1x24GiB",
            "--plan",
            "3",
            "--kill-grace",
            "500ms",
            "--verify-timeout",
            "5s",
            "--data-dir",
            &self.agent_dir(j).display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        let log = self.dir.path().join(format!("agent{j}-{life}.log"));
        self.agents[j] = Some(Proc::start("headroom-agent", &args, log).expect("agent"));
    }

    fn jobs(&self) -> Vec<JobSummary> {
        http_get(&format!("{}/v1/jobs", self.urls[0])).expect("jobs")
    }

    /// Every warning and error of the agents, coordinators and attempt supervisors, and the
    /// tail of each log.
    fn logs(&self) -> String {
        let mut out = String::new();
        let supervisors = (0..self.agents.len()).map(|j| self.agent_dir(j).join("supervisors.log"));
        let logs = std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|f| f.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .chain(supervisors);
        for path in logs {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            out.push_str(&format!("==> {} (warnings)\n", path.display()));
            for l in text.lines().filter(|l| {
                l.contains("WARN")
                    || l.contains("ERROR")
                    || l.contains("lost")
                    || l.contains("supervisor")
            }) {
                out.push_str(&format!("{l}\n"));
            }
            out.push_str(&format!("==> {} (tail)\n", path.display()));
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out.extend(tail.into_iter().rev().map(|l| format!("{l}\n")));
        }
        out
    }
}

#[test]
fn agents_killed_every_few_seconds_lose_no_job_and_run_none_twice() {
    let pg = Postgres::start().expect("postgres");
    let dir = tempfile::tempdir().expect("tempdir");
    headroom_integration_tests::open_to_jobs(dir.path()).expect("open to jobs");
    let record = dir.path().join("timeline.jsonl");
    let deaths = DeathWatch::start(record.clone());
    let mut coords = vec![];
    let mut urls = vec![];
    for i in 0..2 {
        let port = free_port().expect("port");
        let args: Vec<String> = vec![
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--database-url".into(),
            pg.url(),
            "--data-dir".into(),
            dir.path().join(format!("coord{i}")).display().to_string(),
            "--lease-ttl".into(),
            "4s".into(),
        ];
        let log = dir.path().join(format!("coord{i}.log"));
        coords.push(Proc::start("headroom-coordinator", &args, log).expect("coordinator"));
        let url = format!("http://127.0.0.1:{port}");
        wait("a coordinator", Duration::from_secs(30), || {
            http_get::<serde_json::Value>(&format!("{url}/v1/health"))
                .ok()
                .map(|_| ())
        });
        urls.push(url);
    }
    let mut site = Site {
        _pg: pg,
        dir,
        urls,
        _coords: coords,
        agents: (0..AGENTS).map(|_| None).collect(),
    };
    let mut lives = [0usize; AGENTS];
    for j in 0..AGENTS {
        site.start_agent(j, 0);
    }
    let spec = serde_json::json!({"spec": {"name": "chaos",
        "command": [fake_job().display().to_string(), "--seconds", "{seconds}",
                    "--mem", "100MiB", "--record", record.display().to_string()],
        "grid": {"seconds": [0.3, 0.8, 1.4, 2.0]},
        "runs_per_config": 100, "resources": {"memory": "200MiB"},
        "retry": {"max_attempts": 10, "on": ["lost"]}}});
    let (status, body) =
        http_post(&format!("{}/v1/experiments", site.urls[1]), &spec).expect("submit");
    assert_eq!(status, 200, "{body}");
    let exp = serde_json::from_value::<SubmitResponse>(body)
        .expect("response")
        .experiment
        .expect("stored");

    // 40 s of kill -9s: one agent every 3-5 s, each back 1-6 s after its kill, but the
    // first one killed, which never comes back.
    let never_back = AGENTS - 1;
    let mut dice = Dice(0x5eed_1234_abcd_0042);
    let chaos_end = Instant::now() + Duration::from_secs(40);
    let mut back_at: Vec<Option<Instant>> = vec![None; AGENTS];
    let mut next_kill = Instant::now() + Duration::from_millis(dice.roll(3000, 5000));
    let mut kills = 0;
    loop {
        let now = Instant::now();
        for j in 0..AGENTS {
            if back_at[j].is_some_and(|t| t <= now) {
                back_at[j] = None;
                lives[j] += 1;
                site.start_agent(j, lives[j]);
            }
        }
        if now >= chaos_end && back_at.iter().all(Option::is_none) {
            break;
        }
        if now >= next_kill && now < chaos_end {
            next_kill = now + Duration::from_millis(dice.roll(3000, 5000));
            let up: Vec<usize> = (0..AGENTS).filter(|&j| site.agents[j].is_some()).collect();
            if !up.is_empty() {
                let j = if kills == 0 {
                    never_back
                } else {
                    up[dice.roll(0, up.len() as u64 - 1) as usize]
                };
                if let Some(mut p) = site.agents[j].take() {
                    p.kill9().expect("kill -9");
                    kills += 1;
                }
                if j != never_back {
                    back_at[j] = Some(now + Duration::from_millis(dice.roll(1000, 6000)));
                }
            }
        }
        let next = back_at
            .iter()
            .flatten()
            .copied()
            .chain([next_kill.min(chaos_end)])
            .filter(|&t| t > now)
            .min()
            .unwrap_or(now + Duration::from_millis(10));
        std::thread::sleep(next - now);
    }
    assert!(kills >= 8, "{kills} kills");

    wait("every job to end", Duration::from_secs(240), || {
        let p: Progress =
            http_get(&format!("{}/v1/progress?experiment={exp}", site.urls[0])).ok()?;
        (p.counts.finished() == p.counts.total()).then_some(())
    });
    // Ended supervisors exit or wait for the next lease (named `hr-standby`, running
    // nothing); strays of lost attempts are swept by their agent.
    wait(
        "no process of any job left",
        Duration::from_secs(30),
        || {
            (0..AGENTS)
                .all(|j| {
                    let (waiting, rest): (Vec<u32>, Vec<u32>) = scope_pids(&site.agent_dir(j))
                        .into_iter()
                        .partition(|&p| is_waiting_supervisor(p));
                    rest.is_empty() && waiting.iter().all(|&w| children_of(w).is_empty())
                })
                .then_some(())
        },
    );
    let timeline = deaths.finish().expect("the record file and its processes");

    let jobs = site.jobs();
    assert_eq!(jobs.len(), 400);
    let mut lost = 0;
    let mut unstarted_lost = 0;
    let mut reran = 0;
    for j in &jobs {
        assert_eq!(
            j.state,
            JobState::Succeeded,
            "job {}\n{}",
            j.id,
            site.logs()
        );
        let d: JobDetail = http_get(&format!("{}/v1/jobs/{}", site.urls[0], j.id)).expect("job");
        let wins = d
            .attempts_detail
            .iter()
            .filter(|a| a.success == Some(true))
            .count();
        assert_eq!(wins, 1, "job {} succeeded {wins} times", j.id);
        for a in d
            .attempts_detail
            .iter()
            .filter(|a| a.failure_class == Some(FailureClass::Lost))
        {
            // A lease granted in the moment between the claim's answer and the supervisor's
            // start dies with its agent: nothing of it ran, so losing it reruns nothing.
            let id = a.id.to_string();
            if a.started_at.is_none() && timeline.spans(&id).is_empty() {
                unstarted_lost += 1;
            } else {
                // One that ran was stopped by its supervisor's fence, never left running.
                let ev = timeline.events(&id);
                assert!(
                    ev.is_empty() || ev.contains(&"term"),
                    "lost attempt {id} of job {} was not stopped: {ev:?}\n{}",
                    j.id,
                    site.logs()
                );
                lost += 1;
            }
        }
        let attempts: Vec<String> = d.attempts_detail.iter().map(|a| a.id.to_string()).collect();
        if let Err(e) = timeline.assert_apart(&format!("job {}", j.id), &attempts) {
            panic!("{e:#}\n{:#?}", d.attempts_detail);
        }
        // Ran to its end: an `end` with no SIGTERM before it. Exactly once per job.
        let completed = attempts
            .iter()
            .filter(|a| {
                let ev = timeline.events(a);
                ev.last() == Some(&"end") && !ev.contains(&"term")
            })
            .count();
        assert_eq!(
            completed, 1,
            "job {} ran to its end {completed} times: {:#?}",
            j.id, d.attempts_detail
        );
        let started = d
            .attempts_detail
            .iter()
            .filter(|a| a.started_at.is_some() || !timeline.spans(&a.id.to_string()).is_empty())
            .count();
        reran += usize::from(started > 1);
        // Every process of every attempt is gone (seen dead by the watcher).
        for a in &attempts {
            for s in timeline.spans(a) {
                assert!(s.end < i64::MAX, "a process of attempt {a} still runs");
            }
        }
    }
    // Before supervisors reported themselves, outages longer than the TTL ran 8-11 of 400
    // jobs to their end twice; none does now (asserted above, per job).
    eprintln!(
        "chaos: {kills} kills (one agent never back), {lost} attempt(s) fenced and lost, \
         {reran} job(s) started again, {unstarted_lost} lease(s) died unstarted with their agent"
    );
    let starts: HashMap<&str, usize> =
        timeline
            .records
            .iter()
            .filter(|r| r.event == "start")
            .fold(HashMap::new(), |mut m, r| {
                *m.entry(r.job.as_str()).or_default() += 1;
                m
            });
    assert_eq!(starts.len(), 400, "every job started");
}
