//! `headroom-bench-simulate`: the packing policies side by side on the seeds' workloads and
//! a synthetic matrix, through the coordinator's own placement (see `headroom_bench::sim`).
//!
//! cargo run --release -p headroom-bench --bin headroom-bench-simulate [SEED] [JOBS]

use anyhow::{Context, Result};
use headroom_bench::sim::{Cluster, Job, comparison};
use headroom_bench::workloads;

fn table(name: &str, cluster: &Cluster, jobs: &[Job]) {
    println!(
        "\n{name}: {} jobs, {} GPUs, plan {}",
        jobs.len(),
        cluster.gpus_mib.len(),
        cluster
            .plan
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    print!("{}", comparison(cluster, jobs));
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let seed: u64 = args.next().map_or(Ok(1), |s| s.parse()).context("SEED")?;
    let n: usize = args
        .next()
        .map_or(Ok(3000), |s| s.parse())
        .context("JOBS")?;
    let (c, j) = workloads::seed_matrix()?;
    table("seed matrix (seeds 001 and 003)", &c, &j);
    let (c, j) = workloads::lora_farm()?;
    table("LoRA farm (seed 004)", &c, &j);
    let (c, j) = workloads::synthetic(seed, n);
    table(&format!("synthetic (seed {seed})"), &c, &j);
    Ok(())
}
