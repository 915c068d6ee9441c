//! `headroom simulate`: a finished experiment's jobs (each one's duration, peak memory, GPUs
//! and whether it ran alone, from its attempts) replayed on GPUs and a plan of your choosing under each packing
//! policy, through the coordinator's own placement: a plan tried before it is run on.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use headroom_agent::gpu::FakeGpuSpec;
use headroom_coordinator::simulate::{self, Cluster, Job};
use headroom_shared::Plan;
use headroom_shared::api::Headroom;

use crate::client::Api;

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// Experiment (id or name) whose attempts give each job's duration and peak memory.
    pub experiment: String,
    /// The GPUs to try, e.g. `7x23.5GiB` or `24GiB,24GiB,12GiB`.
    #[arg(long)]
    pub gpus: FakeGpuSpec,
    /// Slots per GPU to try, e.g. `2,2,2,2,1,1,1`.
    #[arg(long)]
    pub plan: String,
    /// GPU memory headroom keeps free: a share (`10%`) or a size (`2GiB`).
    #[arg(long, default_value = "10%")]
    pub headroom: Headroom,
}

pub async fn run(api: &Api, args: SimulateArgs) -> Result<()> {
    let gpus_mib: Vec<u64> = args.gpus.sizes().iter().map(|s| s.mib).collect();
    let plan =
        Plan::parse_for(&args.plan, gpus_mib.len()).map_err(|e| anyhow::anyhow!("--plan: {e}"))?;
    let exp = crate::resolve_experiment(api, Some(&args.experiment))
        .await?
        .context("no experiment given")?;
    let csv = api.export_csv(Some(exp), false).await?;
    let (jobs, left_out) = jobs_of(&csv)?;
    if jobs.is_empty() {
        bail!(
            "experiment {} has no attempt that ran to its end with its peak memory known: \
             nothing to replay yet",
            args.experiment
        );
    }
    let cluster = Cluster {
        headroom_mib: gpus_mib.iter().map(|&t| args.headroom.mib_of(t)).collect(),
        plan: (0..gpus_mib.len()).map(|g| plan.slots(g)).collect(),
        gpus_mib,
        nodes: Vec::new(),
    };
    outln!(
        "{} jobs of {} (each at its peak for its whole run{}), on {} GPUs with plan {}, \
         headroom {}:\n",
        jobs.len(),
        args.experiment,
        if left_out > 0 {
            format!("; {left_out} with no finished attempt left out")
        } else {
            String::new()
        },
        cluster.gpus_mib.len(),
        args.plan,
        args.headroom
    );
    out!("{}", simulate::comparison(&cluster, &jobs));
    outln!(
        "\nlower bound: no schedule ends sooner (the longest job, memory-time over the GPUs' \
         memory, run time over the slots); reserved bound: no queue order ends sooner while \
         each declared estimate is held for the whole run"
    );
    Ok(())
}

/// Each job's last attempt that ended (a successful one before any other), as a job to
/// replay: its peak memory held for its duration, its estimate as declared, its config as
/// what is learned together. Also how many jobs had none.
fn jobs_of(csv: &str) -> Result<(Vec<Job>, usize)> {
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let headers = reader.headers().context("the export's header")?.clone();
    let column = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .with_context(|| format!("the export has no `{name}` column"))
    };
    let (job_c, config_c, success_c) = (column("job_id")?, column("config")?, column("success")?);
    let (duration_c, peak_c, estimate_c) = (
        column("duration_s")?,
        column("peak_mem_mib")?,
        column("estimate_mib")?,
    );
    // GPUs it held (none: a CPU-only job) and whether it ran alone (`exclusive` records its
    // wait); an export without them replays 1-GPU shareable jobs.
    let (gpus_c, alone_c) = (column("gpus").ok(), column("exclusive_wait_ms").ok());
    // By job: (ran to success, job), the best attempt seen so far.
    let mut best: BTreeMap<String, Option<(bool, Job)>> = BTreeMap::new();
    for row in reader.records() {
        let row = row.context("a row of the export")?;
        let field = |c: usize| row.get(c).unwrap_or_default();
        let slot = best.entry(field(job_c).to_string()).or_default();
        let (Ok(duration), Ok(peak)) = (field(duration_c).parse::<f64>(), field(peak_c).parse())
        else {
            continue;
        };
        let success = field(success_c) == "true";
        if slot.as_ref().is_some_and(|(won, _)| *won && !success) {
            continue;
        }
        *slot = Some((
            success,
            Job {
                kind: field(config_c).parse().unwrap_or(0),
                steady_mib: peak,
                peak_mib: peak,
                peak_from: 0.0,
                peak_until: 1.0,
                duration_s: duration,
                declared_mib: field(estimate_c).parse().ok(),
                gpus: gpus_c.map_or(1, |c| {
                    field(c).split(';').filter(|g| !g.is_empty()).count() as u32
                }),
                alone: alone_c.is_some_and(|c| !field(c).is_empty()),
            },
        ));
    }
    let left_out = best.values().filter(|b| b.is_none()).count();
    let jobs = best.into_values().flatten().map(|(_, j)| j).collect();
    Ok((jobs, left_out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_job_replays_its_successful_attempt_and_jobs_without_one_are_counted() {
        let csv = "job_id,config,attempt,success,duration_s,peak_mem_mib,estimate_mib\n\
                   a,0,1,false,5.0,9000,4096\n\
                   a,0,2,true,60.5,3000,9000\n\
                   b,1,1,true,30.0,2048,\n\
                   c,1,1,false,,,\n";
        let (jobs, left_out) = jobs_of(csv).expect("parsed");
        assert_eq!(left_out, 1);
        assert_eq!(jobs.len(), 2);
        assert_eq!(
            (jobs[0].duration_s, jobs[0].peak_mib, jobs[0].declared_mib),
            (60.5, 3000, Some(9000))
        );
        assert_eq!((jobs[1].kind, jobs[1].declared_mib), (1, None));
        assert!(jobs_of("job_id,config\n").is_err());
    }

    #[test]
    fn a_job_replays_with_the_gpus_it_held_and_alone_when_it_ran_exclusive() {
        let csv = "job_id,config,attempt,success,duration_s,peak_mem_mib,estimate_mib,gpus,\
                   exclusive_wait_ms\n\
                   a,0,1,true,10,3000,4096,0;1,\n\
                   b,1,1,true,10,0,,,\n\
                   c,2,1,true,10,3000,4096,2,15\n";
        let (jobs, _) = jobs_of(csv).expect("parsed");
        let shape: Vec<(u32, bool)> = jobs.iter().map(|j| (j.gpus, j.alone)).collect();
        assert_eq!(shape, [(2, false), (0, false), (1, true)]);
    }
}
