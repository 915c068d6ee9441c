//! `headroom-bench-suite [BENCH...] [--tiny] [--out DIR]`: the real system against
//! task-spooler (see `bench/README.md`); prints each report and writes it to `DIR`
//! (default `bench/results`). Benches: dispatch latency makespan slot_free scale agent_cpu
//! scale_ceiling (default all; `scale` holds each simulated job 5 s, `scale_ceiling` ends it
//! at once). `--tiny` runs each at a size that only checks it still works.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use headroom_bench::suite::{self, Report};

const ALL: [&str; 7] = [
    "dispatch",
    "latency",
    "makespan",
    "slot_free",
    "scale",
    "scale_ceiling",
    "agent_cpu",
];

fn run(name: &str, tiny: bool) -> Result<Report> {
    use suite::*;
    match (name, tiny) {
        ("dispatch", false) => dispatch::run(&dispatch::Size { jobs: 990, gpus: 8 }),
        ("dispatch", true) => dispatch::run(&dispatch::Size { jobs: 16, gpus: 2 }),
        ("latency", false) => latency::run(200),
        ("latency", true) => latency::run(3),
        ("makespan", false) => makespan::run(&makespan::Size {
            jobs: 64,
            slots: 16,
            seconds: 1.0,
        }),
        ("makespan", true) => makespan::run(&makespan::Size {
            jobs: 4,
            slots: 2,
            seconds: 0.2,
        }),
        ("slot_free", false) => slot_free::run(100),
        ("slot_free", true) => slot_free::run(3),
        ("scale", false) => scale::run(&scale::Size {
            agents: 100,
            gpus_per_agent: 8,
            queued: 100_000,
            window: Duration::from_secs(60),
            job: Duration::from_secs(5),
        }),
        ("scale_ceiling", false) => scale::run(&scale::Size {
            agents: 100,
            gpus_per_agent: 8,
            queued: 100_000,
            window: Duration::from_secs(60),
            job: Duration::ZERO,
        }),
        ("scale" | "scale_ceiling", true) => scale::run(&scale::Size {
            agents: 2,
            gpus_per_agent: 2,
            queued: 20,
            window: Duration::from_secs(30),
            job: Duration::from_millis(50),
        }),
        ("agent_cpu", false) => agent_cpu::run(Duration::from_secs(30)),
        ("agent_cpu", true) => agent_cpu::run(Duration::from_secs(1)),
        _ => bail!("unknown bench `{name}`: one of {}", ALL.join(" ")),
    }
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut names, mut tiny, mut out) = (Vec::new(), false, PathBuf::from("bench/results"));
    while let Some(a) = args.next() {
        match a.as_str() {
            "--tiny" => tiny = true,
            "--out" => match args.next() {
                Some(d) => out = d.into(),
                None => bail!("--out needs a directory"),
            },
            _ => names.push(a),
        }
    }
    if names.is_empty() {
        names = ALL.iter().map(|s| s.to_string()).collect();
    }
    for n in &names {
        let r = run(n, tiny)?;
        println!("{}", r.markdown);
        for p in r.write(&out)? {
            eprintln!("wrote {}", p.display());
        }
    }
    Ok(())
}
