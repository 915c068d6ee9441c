//! `headroom-bench-simulate`: the packing policies side by side on the seeds' workloads and
//! a synthetic matrix, through the coordinator's own placement (see `headroom_bench::sim`).
//!
//! cargo run --release -p headroom-bench --bin headroom-bench-simulate [SEED] [JOBS]

use anyhow::{Context, Result};
use headroom_bench::sim::{Cluster, Job, Order, Policy, Submission, comparison, simulate_queue};
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

/// Two users on one workload: the first submits every job but the last `late` at once, the
/// second those `late` after `after_s`; each queue order's waits, side by side.
fn shared(name: &str, cluster: &Cluster, jobs: &[Job], late: usize, after_s: f64) {
    let n = jobs.len();
    let subs: Vec<Submission> = (0..n)
        .map(|j| {
            let second = j + late >= n;
            Submission {
                user: usize::from(second),
                at_s: if second { after_s } else { 0.0 },
            }
        })
        .collect();
    println!(
        "\n{name}: user A submits {} jobs, user B {late} more {after_s} s later (headroom, declared)",
        n - late
    );
    println!("| queue order | B's mean wait | A's mean wait | makespan |");
    println!("| --- | --- | --- | --- |");
    let fair = Order::FairShare {
        shares: vec![1, 1],
        half_life_s: 7.0 * 86_400.0,
    };
    let mut waits = Vec::new();
    for (label, order) in [("FIFO", Order::Fifo), ("fair share", fair)] {
        let r = simulate_queue(cluster, jobs, Policy::Declared, &[], &subs, &order);
        let w = |u: usize| r.mean_wait_by_user.get(u).copied().unwrap_or(0.0);
        println!(
            "| {label} | {:.0} s | {:.0} s | {:.0} s |",
            w(1),
            w(0),
            r.makespan_s
        );
        waits.push(w(1));
    }
    if waits[1] > 0.0 {
        println!("B waits {:.1}x less under fair share", waits[0] / waits[1]);
    }
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
    let (c, j) = workloads::seed_matrix()?;
    shared("seed matrix, two users", &c, &j, 10, 60.0);
    let (c, j) = workloads::synthetic(seed, n.min(1000));
    shared(
        &format!("synthetic (seed {seed}), two users"),
        &c,
        &j,
        10,
        60.0,
    );
    Ok(())
}
