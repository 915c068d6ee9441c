//! Fair share end to end, with the real binaries and two users' tokens: a user who submits
//! a few jobs while another's 200 hold the GPU gets theirs started as slots free up, before
//! the first user's remaining ones, and the waiting jobs say why; `headroom usage` and
//! `/metrics` show what each used.

use std::path::Path;
use std::time::Duration;

use headroom_integration_tests::standalone::{Agent, AgentOptions, Coordinator};
use headroom_integration_tests::{block_on, client_for, headroom_as, headroom_ok, wait_until};
use headroom_shared::api::JobSummary;
use headroom_shared::api::usage::UsageReport;
use headroom_shared::client::Client;
use headroom_shared::{ExperimentId, JobState};

const ADMIN: &str = "integration-admin-token-0123456789";

fn token(url: &str, name: &str, role: &str) -> String {
    headroom_ok(
        url,
        ADMIN,
        &["token", "create", "--name", name, "--role", role],
    )
    .trim()
    .to_string()
}

/// A spec of `runs` short jobs of 2 GiB each.
fn spec(dir: &Path, name: &str, runs: u32) -> String {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}\ncommand: [sleep, \"0.3\"]\nruns_per_config: {runs}\n\
             resources: {{gpus: 1, memory: 2GiB}}\n"
        ),
    )
    .expect("spec");
    path.display().to_string()
}

/// Each state's count of `exp`'s jobs, as `token`'s holder reads them.
fn jobs(c: &Client, exp: ExperimentId) -> Vec<JobSummary> {
    block_on(c.jobs(Some(exp), None))
        .expect("runtime")
        .expect("jobs")
}

fn count(js: &[JobSummary], f: impl Fn(JobState) -> bool) -> usize {
    js.iter().filter(|j| f(j.state)).count()
}

/// The id of the experiment named `name`.
fn experiment(c: &Client, name: &str) -> ExperimentId {
    block_on(c.experiments())
        .expect("runtime")
        .expect("experiments")
        .into_iter()
        .find(|e| e.name == name)
        .map(|e| e.id)
        .expect("the experiment")
}

#[test]
fn a_user_with_a_few_jobs_goes_before_the_one_who_holds_the_gpus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coord = Coordinator::start(dir.path(), &["--admin-token", ADMIN]).expect("coordinator");
    let url = coord.url.clone();
    let (alice, bob) = (token(&url, "alice", "user"), token(&url, "bob", "user"));
    let as_user = |t: &str| {
        client_for(&url)
            .and_then(|c| Ok(c.with_token(Some(t))?))
            .expect("client")
    };
    let (ca, cb) = (as_user(&alice), as_user(&bob));
    let node = token(&url, "node-a", "agent");
    let _agent = Agent::start(
        &url,
        dir.path(),
        AgentOptions::node("node-a")
            .env("HEADROOM_AGENT_TOKEN", &node)
            .flags(&["--plan", "2"]),
    )
    .expect("agent");

    // Alice's 200 take both slots of the one GPU; once she has run 20 (6 s at 2 GiB: more
    // than Bob's whole 10 will cost), Bob submits 10.
    headroom_ok(&url, &alice, &["submit", &spec(dir.path(), "sweep", 200)]);
    let sweep = experiment(&ca, "sweep");
    wait_until("Alice's first 20 to end", Duration::from_secs(90), || {
        (count(&jobs(&ca, sweep), |s| s == JobState::Succeeded) >= 20).then_some(())
    });
    headroom_ok(&url, &bob, &["submit", &spec(dir.path(), "probe", 10)]);
    let probe = experiment(&cb, "probe");
    let started = |js: &[JobSummary]| count(js, |s| s != JobState::Queued);
    let alice_before = started(&jobs(&ca, sweep));

    // While Bob's wait, Alice's waiting jobs say that Bob goes first, with the figures.
    let said = wait_until("a fair-share reason", Duration::from_secs(30), || {
        jobs(&ca, sweep)
            .into_iter()
            .filter(|j| j.state == JobState::Queued)
            .find_map(|j| j.pending_reason.filter(|r| r.code() == "fair_share"))
    });
    let text = said.to_string();
    assert!(
        text.contains("alice used") && text.contains("bob") && text.contains("goes first"),
        "{text}"
    );

    // Bob's 10 run to the end while Alice gets no more than the slots Bob's last ones free.
    wait_until("Bob's 10 to end", Duration::from_secs(60), || {
        let js = jobs(&cb, probe);
        (count(&js, |s| s == JobState::Succeeded) == 10).then_some(())
    });
    let alice_after = jobs(&ca, sweep);
    let overtook = started(&alice_after) - alice_before;
    assert!(
        overtook <= 4,
        "{overtook} of Alice's jobs started while Bob's 10 waited and ran"
    );
    assert!(count(&alice_after, |s| s == JobState::Queued) >= 100);

    // The report: both users, Alice's attempts and GiB-hours above Bob's, Bob's standing
    // first.
    let report: UsageReport = serde_json::from_str(&headroom_ok(
        &url,
        &bob,
        &["usage", "--since", "1h", "--output", "json"],
    ))
    .expect("report");
    let row = |u: &str| {
        report
            .rows
            .iter()
            .find(|r| r.key == u)
            .unwrap_or_else(|| panic!("{u} in {report:?}"))
            .clone()
    };
    let (a, b) = (row("alice"), row("bob"));
    assert_eq!(b.jobs.get("succeeded"), Some(&10), "{b:?}");
    assert!(
        a.attempts > b.attempts && a.gib_hours > b.gib_hours,
        "{a:?} {b:?}"
    );
    let rank = |u: &str| report.shares.iter().position(|s| s.user == u);
    assert!(rank("bob") < rank("alice"), "{:?}", report.shares);
    let table = headroom_ok(&url, &bob, &["usage"]);
    assert!(
        table.contains("fair share") && table.contains("alice"),
        "{table}"
    );
    let bad = headroom_as(&url, &bob, &["usage", "--since", "lately"]);
    assert!(
        !bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("since"),
        "{bad:?}"
    );
    block_on(ca.cancel_experiment(sweep))
        .expect("runtime")
        .expect("cancel");
}
