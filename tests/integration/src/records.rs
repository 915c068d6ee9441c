//! When each fake job's process really ran: its own `start`/`term`/`end` records, and its
//! death as seen from outside by a watcher that outlives it (a SIGKILLed job writes nothing
//! at its end, so its end cannot come from its own records).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};

/// One line of a `headroom-fake-job --record` file.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Record {
    pub event: String,
    pub job: String,
    #[serde(default)]
    pub attempt: String,
    #[serde(default)]
    pub pid: u32,
    pub gpus: String,
    pub mem_mib: u64,
    pub t_ms: i64,
}

pub fn read_records(path: &Path) -> Result<Vec<Record>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad record line `{l}`")))
        .collect()
}

/// How often the watcher looks at the record file and at the processes it lists.
const TICK: Duration = Duration::from_millis(10);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A process of an attempt: the attempt's id and the pid.
type ProcKey = (String, u32);

/// Whether `pid` is still the process of `attempt`: alive (a zombie's environment reads
/// empty) and carrying the attempt's marker (a pid reused by someone else does not).
fn still_running(key: &ProcKey) -> Result<bool> {
    match std::fs::read(format!("/proc/{}/environ", key.1)) {
        Ok(env) => {
            let marker = format!("HEADROOM_ATTEMPT_ID={}", key.0);
            Ok(env.split(|&b| b == 0).any(|v| v == marker.as_bytes()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) if e.raw_os_error() == Some(nix::libc::ESRCH) => Ok(false),
        // Jobs run as this test's user: a pid we may not inspect that belongs to another
        // user is someone else's (the pid was reused). Our own user's, unreadable, is unknown.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            use std::os::unix::fs::MetadataExt;
            match std::fs::metadata(format!("/proc/{}", key.1)) {
                Err(m) if m.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Ok(m) if m.uid() != nix::unistd::geteuid().as_raw() => Ok(false),
                _ => Err(anyhow!("cannot read /proc/{}/environ: {e}", key.1)),
            }
        }
        Err(e) => Err(anyhow!("cannot read /proc/{}/environ: {e}", key.1)),
    }
}

/// Follows a `--record` file while jobs run and notes when each recorded process died: the
/// first time it is seen gone, an upper bound on its real end within a tick (or the moment
/// its start record was first read, when it had died already). Start it before the jobs.
pub struct DeathWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Timeline>>>,
}

impl DeathWatch {
    pub fn start(path: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || watch(&path, &flag));
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops watching and returns what was seen. Every error (the file unreadable, a line
    /// that is not a record, a process that cannot be inspected) is an error, never "nothing".
    pub fn finish(mut self) -> Result<Timeline> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .ok_or_else(|| anyhow!("finished twice"))?
            .join()
            .map_err(|_| anyhow!("the death watcher panicked"))?
    }
}

impl Drop for DeathWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn watch(path: &Path, stop: &AtomicBool) -> Result<Timeline> {
    let mut file: Option<std::fs::File> = None;
    let mut pending = Vec::new();
    let mut t = Timeline::default();
    let mut running: Vec<ProcKey> = Vec::new();
    loop {
        // Read the flag first: one more full pass follows it, so nothing written before the
        // caller stopped us is missed.
        let last = stop.load(Ordering::SeqCst);
        if file.is_none() {
            match std::fs::File::open(path) {
                Ok(f) => file = Some(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !last => {}
                Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
            }
        }
        if let Some(f) = file.as_mut() {
            f.read_to_end(&mut pending)
                .with_context(|| format!("reading {}", path.display()))?;
            // Only whole lines: a line being written is read on the next tick.
            if let Some(end) = pending.iter().rposition(|&b| b == b'\n') {
                let seen = now_ms();
                let whole: Vec<u8> = pending.drain(..=end).collect();
                let text = std::str::from_utf8(&whole)
                    .with_context(|| format!("{} is not UTF-8", path.display()))?;
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    let r: Record = serde_json::from_str(line)
                        .with_context(|| format!("bad record line `{line}`"))?;
                    if r.event == "start" {
                        let key = (r.attempt.clone(), r.pid);
                        if still_running(&key)? {
                            running.push(key);
                        } else {
                            t.deaths.insert(key, seen);
                        }
                    }
                    t.records.push(r);
                }
            }
        }
        let now = now_ms();
        let mut i = 0;
        while i < running.len() {
            if still_running(&running[i])? {
                i += 1;
            } else {
                t.deaths.insert(running.swap_remove(i), now);
            }
        }
        if last {
            if !pending.is_empty() {
                bail!(
                    "{} ends in half a line: `{}`",
                    path.display(),
                    String::from_utf8_lossy(&pending)
                );
            }
            return Ok(t);
        }
        std::thread::sleep(TICK);
    }
}

/// When one process of an attempt ran, in Unix milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span {
    /// Its `start` record (written once it holds its memory).
    pub start: i64,
    /// Its real end: seen dead from outside; `i64::MAX` while it still runs.
    pub end: i64,
}

/// Everything a record file said, and the deaths the watcher saw.
#[derive(Debug, Default)]
pub struct Timeline {
    pub records: Vec<Record>,
    deaths: HashMap<ProcKey, i64>,
}

impl Timeline {
    /// The processes an attempt started (normally one).
    pub fn spans(&self, attempt: &str) -> Vec<Span> {
        self.records
            .iter()
            .filter(|r| r.event == "start" && r.attempt == attempt)
            .map(|r| Span {
                start: r.t_ms,
                end: self
                    .deaths
                    .get(&(r.attempt.clone(), r.pid))
                    .copied()
                    .unwrap_or(i64::MAX),
            })
            .collect()
    }

    /// Checks that the processes of these attempts (one job's, in any order) never ran at
    /// the same time: each one's real end comes before the next one's start.
    pub fn assert_apart(&self, what: &str, attempts: &[String]) -> Result<()> {
        let mut spans = Vec::new();
        for a in attempts {
            let s = self.spans(a);
            if s.len() > 1 {
                bail!("{what}: attempt {a} started {} processes: {s:?}", s.len());
            }
            spans.extend(s);
        }
        spans.sort();
        for w in spans.windows(2) {
            if w[0].end > w[1].start {
                bail!(
                    "{what}: attempts overlapped: one ran until {} (seen dead), the next \
                     started at {}: {spans:?}",
                    w[0].end,
                    w[1].start
                );
            }
        }
        Ok(())
    }

    /// The events recorded by the process of an attempt, in order.
    pub fn events(&self, attempt: &str) -> Vec<&str> {
        self.records
            .iter()
            .filter(|r| r.attempt == attempt)
            .map(|r| r.event.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(event: &str, attempt: &str, pid: u32, t_ms: i64) -> String {
        format!(
            "{{\"event\":\"{event}\",\"job\":\"j\",\"attempt\":\"{attempt}\",\"gpus\":\"0\",\
             \"pid\":{pid},\"mem_mib\":0,\"t_ms\":{t_ms}}}\n"
        )
    }

    #[test]
    fn a_malformed_line_fails_instead_of_reading_as_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.jsonl");
        std::fs::write(
            &path,
            format!("{}not json\n", line("start", "a", 999_999_990, 1)),
        )
        .expect("write");
        let err = DeathWatch::start(path).finish().expect_err("malformed");
        assert!(format!("{err:#}").contains("bad record line"), "{err:#}");
    }

    #[test]
    fn a_missing_file_or_half_a_line_fails() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = DeathWatch::start(dir.path().join("none.jsonl")).finish();
        assert!(missing.is_err(), "{missing:?}");
        let path = dir.path().join("half.jsonl");
        std::fs::write(&path, "{\"event\":\"sta").expect("write");
        let half = DeathWatch::start(path).finish();
        assert!(half.is_err(), "{half:?}");
    }

    #[test]
    fn a_dead_process_ends_where_it_was_seen_gone_and_overlaps_are_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.jsonl");
        // Pids no live process carries this marker for: seen dead at once.
        let now = now_ms();
        let text = line("start", "a1", 999_999_991, now - 10_000)
            + &line("start", "a2", 999_999_992, now - 5_000);
        std::fs::write(&path, text).expect("write");
        let t = DeathWatch::start(path).finish().expect("timeline");
        let s = t.spans("a1");
        assert_eq!(s.len(), 1);
        assert!(s[0].end >= now, "{s:?}");
        // a1 was seen dead only after a2 started: that cannot be told from an overlap.
        let err = t
            .assert_apart("job", &["a1".into(), "a2".into()])
            .expect_err("overlap");
        assert!(format!("{err:#}").contains("overlapped"), "{err:#}");
    }
}
