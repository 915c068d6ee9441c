//! `headroom-bench-stamp DIR NAME [SECONDS]`: the benches' job. Writes `DIR/NAME.start`
//! (nanoseconds since the epoch, read first thing), sleeps SECONDS, writes `DIR/NAME.end`.
//! NAME `-` is the job's id (`HEADROOM_JOB_ID`). File times are too coarse (a kernel tick)
//! for millisecond latencies, so the job reads the clock itself.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

fn main() -> anyhow::Result<()> {
    let start = now_ns();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, name, rest @ ..] = &args[..] else {
        anyhow::bail!("usage: headroom-bench-stamp DIR NAME [SECONDS]");
    };
    let name = if name == "-" {
        std::env::var("HEADROOM_JOB_ID")?
    } else {
        name.clone()
    };
    let dir = std::path::Path::new(dir);
    std::fs::write(dir.join(format!("{name}.start")), start.to_string())?;
    if let Some(s) = rest.first() {
        std::thread::sleep(Duration::from_secs_f64(s.parse()?));
        std::fs::write(dir.join(format!("{name}.end")), now_ns().to_string())?;
    }
    Ok(())
}
