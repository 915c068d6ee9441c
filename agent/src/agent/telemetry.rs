//! The GPU telemetry sampler: one task reads every GPU through the backend at a fixed rate
//! (off the runtime) into a bounded buffer that heartbeats ship to the coordinator, and keeps
//! the latest reading for the agent's `/metrics`. While the coordinator cannot be reached the
//! buffer drops its oldest samples and counts them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use headroom_shared::api::TelemetrySample;
use tokio_util::sync::CancellationToken;

use crate::gpu::GpuBackend;

/// Most samples one heartbeat carries; the rest go with the next ones.
pub const MAX_PER_HEARTBEAT: usize = 2000;

#[derive(Debug, Default)]
struct Buffer {
    pending: VecDeque<TelemetrySample>,
    latest: Vec<TelemetrySample>,
    dropped: u64,
}

/// The sampler's shared state; cheap to clone.
#[derive(Clone, Debug)]
pub struct Telemetry {
    inner: Arc<Mutex<Buffer>>,
    /// How often to sample; zero: never.
    pub every: Duration,
    /// Most samples kept unsent.
    pub capacity: usize,
}

impl Telemetry {
    pub fn new(every: Duration, capacity: usize) -> Self {
        Self {
            inner: Arc::default(),
            every,
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffer> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds one reading of every GPU; the oldest unsent samples go when the buffer is full.
    pub fn push(&self, samples: Vec<TelemetrySample>) {
        let mut b = self.lock();
        b.latest.clone_from(&samples);
        b.pending.extend(samples);
        let over = b.pending.len().saturating_sub(self.capacity);
        if over > 0 {
            b.pending.drain(..over);
            b.dropped += over as u64;
        }
    }

    /// Up to `max` unsent samples, oldest first, for a heartbeat.
    pub fn take(&self, max: usize) -> Vec<TelemetrySample> {
        let mut b = self.lock();
        let n = b.pending.len().min(max);
        b.pending.drain(..n).collect()
    }

    /// Samples a heartbeat could not deliver go back in front of newer ones (within the
    /// capacity: what does not fit is the oldest, dropped and counted).
    pub fn put_back(&self, samples: Vec<TelemetrySample>) {
        let mut b = self.lock();
        let room = self.capacity.saturating_sub(b.pending.len());
        let skip = samples.len().saturating_sub(room);
        b.dropped += skip as u64;
        for s in samples.into_iter().skip(skip).rev() {
            b.pending.push_front(s);
        }
    }

    /// The last reading of every GPU (empty before the first).
    pub fn latest(&self) -> Vec<TelemetrySample> {
        self.lock().latest.clone()
    }

    /// Samples dropped since the agent started.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Samples every `every` until `stop`. A backend failure marks every GPU's reading as
    /// failed (an error, no figures), never a reading of zeros.
    pub async fn run(self, backend: Arc<dyn GpuBackend>, stop: CancellationToken) {
        if self.every.is_zero() {
            return;
        }
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let b = backend.clone();
            let read = tokio::task::spawn_blocking(move || read(b.as_ref())).await;
            match read {
                Ok(samples) => self.push(samples),
                Err(e) => tracing::warn!("telemetry sample task failed: {e}"),
            }
        }
    }
}

/// Every GPU of the inventory, once; a failed backend gives each GPU its error.
pub fn read(backend: &dyn GpuBackend) -> Vec<TelemetrySample> {
    match backend.telemetry() {
        Ok(samples) => samples,
        Err(e) => {
            let at = chrono::Utc::now();
            backend
                .inventory()
                .iter()
                .map(|g| TelemetrySample {
                    gpu: g.index,
                    at,
                    error: Some(e.to_string()),
                    ..TelemetrySample::default()
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::FakeBackend;
    use crate::gpu::fake::{Fault, fault_file};

    fn sample(gpu: u32, n: i64) -> TelemetrySample {
        TelemetrySample {
            gpu,
            at: chrono::DateTime::from_timestamp_millis(n).expect("time"),
            ..TelemetrySample::default()
        }
    }

    fn ats(v: &[TelemetrySample]) -> Vec<i64> {
        v.iter().map(|s| s.at.timestamp_millis()).collect()
    }

    #[test]
    fn a_full_buffer_drops_the_oldest_and_counts_them() {
        let t = Telemetry::new(Duration::from_secs(1), 3);
        t.push(vec![sample(0, 1), sample(1, 1)]);
        t.push(vec![sample(0, 2), sample(1, 2)]);
        assert_eq!(t.dropped(), 1);
        assert_eq!(t.latest().len(), 2);
        let sent = t.take(2);
        assert_eq!(ats(&sent), vec![1, 2]);
        // Not delivered: back in front of newer ones, as far as there is room (the oldest
        // of them is dropped and counted).
        t.push(vec![sample(0, 3)]);
        t.put_back(sent);
        assert_eq!(t.dropped(), 2);
        assert_eq!(ats(&t.take(10)), vec![2, 2, 3]);
    }

    #[test]
    fn put_back_keeps_within_capacity() {
        let t = Telemetry::new(Duration::from_secs(1), 2);
        t.push(vec![sample(0, 5)]);
        t.put_back(vec![sample(0, 1), sample(0, 2), sample(0, 3)]);
        assert_eq!(t.dropped(), 2);
        assert_eq!(ats(&t.take(10)), vec![3, 5]);
    }

    #[test]
    fn fake_readings_follow_declared_load_and_fail_closed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let backend = FakeBackend::open("2x1GiB".parse().expect("spec"), tmp.path()).expect("open");
        let dir = backend.dir().to_path_buf();
        // This test process declares half of GPU 1 at 100 % utilization.
        crate::gpu::fake::write_usage_util(&dir, std::process::id(), &[(1, 512, 100)])
            .expect("usage");
        let first = read(&backend);
        std::thread::sleep(Duration::from_millis(50));
        let s = read(&backend);
        let model = backend.power_model();
        assert_eq!(s.len(), 2);
        assert_eq!((s[1].used_mib, s[1].total_mib), (Some(512), Some(1024)));
        assert_eq!(s[1].utilization_pct, Some(100));
        let busy = model.power_w(0.5, 1.0);
        assert_eq!(s[1].power_w, Some(busy));
        assert_eq!(s[0].power_w, Some(model.idle_w));
        // The busy GPU's counter grew by its power over the time between the readings.
        let de = s[1].energy_j.expect("energy") - first[1].energy_j.expect("energy");
        let dt = (s[1].at - first[1].at).num_microseconds().expect("dt") as f64 / 1e6;
        assert!(
            (de - busy * dt).abs() <= busy * 0.02 + 0.5,
            "{de} J over {dt} s at {busy} W"
        );
        // A GPU without power readings reports none, and a memory fault no memory: never 0.
        std::fs::write(fault_file(&dir, 0, Fault::NoPower), "").expect("fault");
        std::fs::write(fault_file(&dir, 1, Fault::Memory), "").expect("fault");
        let s = read(&backend);
        assert_eq!((s[0].power_w, s[0].energy_j), (None, None));
        assert!(s[0].temperature_c.is_some());
        assert_eq!((s[1].used_mib, s[1].free_mib), (None, None));
        assert!(s[1].error.as_deref().is_some_and(|e| e.contains("memory")));
        crate::gpu::fake::remove_usage(&dir, std::process::id()).expect("rm");
    }
}
