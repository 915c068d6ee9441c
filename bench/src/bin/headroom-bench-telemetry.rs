//! `headroom-bench-telemetry`: what storing GPU telemetry adds to a heartbeat, on the
//! embedded SQLite store and on PostgreSQL. Heartbeats of an 8-GPU node without telemetry and
//! with 80 samples (10 s at 1 Hz) alternate on one coordinator, so both see the same
//! conditions; the result is their latency ratio.
//!
//! cargo build --release -p headroom-coordinator -p headroom-bench &&
//!   target/release/headroom-bench-telemetry [HEARTBEATS]

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use headroom_bench::suite::percentile;
use headroom_integration_tests::{Postgres, Proc, block_on, client_for, free_port};
use headroom_shared::api::{GpuInfo, HeartbeatRequest, RegisterRequest, TelemetrySample};

const GPUS: u32 = 8;
const PER_HEARTBEAT: i64 = 10;

struct Row {
    store: &'static str,
    bare: Vec<f64>,
    with: Vec<f64>,
}

fn measure(store: &'static str, dir: &Path, database_url: Option<&str>, n: usize) -> Result<Row> {
    let port = free_port()?;
    let url = format!("http://127.0.0.1:{port}");
    let args = headroom_bench::system::coordinator_args(port, &dir.join(store), database_url);
    let coordinator = Proc::start(
        "headroom-coordinator",
        &args,
        dir.join(format!("{store}.log")),
    )?;
    let api = client_for(&url)?;
    headroom_bench::system::wait_healthy(&api, &coordinator)?;
    let reg = block_on(
        api.register(&RegisterRequest {
            host_memory_mib: None,
            node: "bench".into(),
            gpus: (0..GPUS)
                .map(|i| GpuInfo {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    name: "bench".into(),
                    total_mib: 81920,
                })
                .collect(),
            plan: None,
            headroom: None,
            version: "bench".into(),
            running: vec![],
            previous: None,
        }),
    )??;
    let base = chrono::Utc::now().timestamp_millis() - 1_000_000_000;
    let mut tick = 0i64;
    let mut beat = |telemetry: bool| -> Result<f64> {
        let samples = if telemetry {
            let mut v = Vec::new();
            for _ in 0..PER_HEARTBEAT {
                tick += 1;
                for gpu in 0..GPUS {
                    v.push(TelemetrySample {
                        gpu,
                        at: chrono::DateTime::from_timestamp_millis(base + tick * 1000)
                            .context("time")?,
                        used_mib: Some(40_000),
                        free_mib: Some(41_920),
                        total_mib: Some(81_920),
                        utilization_pct: Some(97),
                        power_w: Some(612.5),
                        energy_j: Some(1.5e7 + tick as f64),
                        temperature_c: Some(71.0),
                        sm_clock_mhz: Some(1980),
                        throttle: Some(vec![]),
                        error: None,
                    });
                }
            }
            v
        } else {
            vec![]
        };
        let req = HeartbeatRequest {
            gpus: vec![],
            attempts: vec![],
            released: vec![],
            telemetry: samples,
            telemetry_dropped: 0,
        };
        let t = Instant::now();
        block_on(api.heartbeat(reg.agent, &req))??;
        Ok(t.elapsed().as_secs_f64() * 1000.0)
    };
    for _ in 0..20 {
        beat(false)?;
        beat(true)?;
    }
    let (mut bare, mut with) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        bare.push(beat(false)?);
        with.push(beat(true)?);
    }
    bare.sort_by(f64::total_cmp);
    with.sort_by(f64::total_cmp);
    drop(coordinator);
    Ok(Row { store, bare, with })
}

fn main() -> Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir()?;
    let sqlite = measure("SQLite", dir.path(), None, n)?;
    let pg = Postgres::start()?;
    let postgres = measure("PostgreSQL", dir.path(), Some(&pg.url()), n)?;
    let samples = PER_HEARTBEAT * i64::from(GPUS);
    println!(
        "| store | heartbeat p50 | p95 | with {samples} samples p50 | p95 | p50 ratio | ({n} each, alternating) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for r in [&sqlite, &postgres] {
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} | |",
            r.store,
            percentile(&r.bare, 0.5),
            percentile(&r.bare, 0.95),
            percentile(&r.with, 0.5),
            percentile(&r.with, 0.95),
            percentile(&r.with, 0.5) / percentile(&r.bare, 0.5),
        );
    }
    Ok(())
}
