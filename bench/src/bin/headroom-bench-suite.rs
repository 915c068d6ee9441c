//! `headroom-bench-suite [BENCH...] [--tiny] [--out DIR]`: the real system against
//! task-spooler (see `bench/README.md`); prints each report and writes it to `DIR`
//! (default `bench/results`). Benches: dispatch latency makespan slot_free scale agent_cpu
//! scale_ceiling (default all; `scale` holds each simulated job 5 s, `scale_ceiling` ends it
//! at once). `--tiny` runs each at a size that only checks it still works.

use std::path::PathBuf;

use anyhow::{Result, bail};
use headroom_bench::suite::{ALL, run};

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
