//! The GPU reading each heartbeat carries: one at a time, waited for only a bounded while,
//! so that a driver slow to answer (NVML on a busy or wedged node) does not hold the leases'
//! renewal, which would fence every job the node runs.

use std::sync::Arc;
use std::time::Duration;

use headroom_shared::api::GpuSample;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::gpu::GpuBackend;

/// A heartbeat's GPU reading.
pub(crate) struct Reading {
    pub samples: Vec<GpuSample>,
    /// Started for this heartbeat. A late one, started for an earlier heartbeat, may be
    /// older than what happened since: it goes to the coordinator, but shows nothing gone
    /// (a quarantine's release) and names no process to kill.
    pub fresh: bool,
}

/// The heartbeats' GPU readings.
pub(crate) struct Readings {
    backend: Arc<dyn GpuBackend>,
    /// A reading still going when the last heartbeat left, and since when.
    on_its_way: Option<(JoinHandle<Vec<GpuSample>>, Instant)>,
    /// Readings have been late since the last one in time: said once, and its end.
    slow: bool,
}

impl Readings {
    pub(crate) fn new(backend: Arc<dyn GpuBackend>) -> Self {
        Self {
            backend,
            on_its_way: None,
            slow: false,
        }
    }

    /// Every GPU as read now: the reading on its way (else a new one), waited for at most
    /// `wait`. One still going then is left to finish for the next heartbeat, and each GPU
    /// goes as unknown, which the coordinator places nothing on.
    pub(crate) async fn take(&mut self, wait: Duration) -> Reading {
        let late = self.on_its_way.is_some();
        let (mut reading, since) = self
            .on_its_way
            .take()
            .unwrap_or_else(|| (super::reading(&self.backend), Instant::now()));
        match tokio::time::timeout(wait, &mut reading).await {
            Ok(read) => {
                if !late && std::mem::take(&mut self.slow) {
                    tracing::info!("the GPU readings are in time again");
                }
                Reading {
                    samples: super::read_samples(read, &self.backend),
                    fresh: !late,
                }
            }
            Err(_) => {
                let took = since.elapsed();
                if !std::mem::replace(&mut self.slow, true) {
                    tracing::warn!(
                        "reading the GPUs has taken {took:?} so far: the heartbeat goes without \
                         it, to renew the leases in time; the GPUs are unknown (nothing is \
                         placed on them) until a reading comes back"
                    );
                }
                self.on_its_way = Some((reading, since));
                let why = format!("the GPU reading has taken {took:?} so far");
                Reading {
                    samples: crate::gpu::all_unknown(&self.backend.inventory(), &why),
                    fresh: false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::{FakeBackend, READ_DELAY_FILE};

    /// A reading slower than its bound goes as unknown GPUs, is not started again, and is
    /// what a later heartbeat carries once it is in, as a late one; the next is fresh.
    #[tokio::test]
    async fn a_slow_reading_goes_as_unknown_and_the_next_heartbeat_takes_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = dir.path().join("fake");
        let backend = FakeBackend::open("2x24GiB".parse().expect("spec"), &fake).expect("fake");
        std::fs::write(fake.join(READ_DELAY_FILE), "2s").expect("delay");
        let mut readings = Readings::new(Arc::new(backend));
        let began = Instant::now();
        let first = readings.take(Duration::from_millis(100)).await;
        assert!(began.elapsed() < Duration::from_millis(1_500));
        assert!(!first.fresh);
        assert_eq!(first.samples.len(), 2, "{:?}", first.samples);
        assert!(
            first.samples.iter().all(|g| g
                .error
                .as_deref()
                .is_some_and(|e| e.contains("the GPU reading has taken"))),
            "{:?}",
            first.samples
        );
        // The next heartbeat waits on the same reading: a new one, the delay gone, would be
        // in at once.
        std::fs::remove_file(fake.join(READ_DELAY_FILE)).expect("delay");
        let second = readings.take(Duration::from_secs(10)).await;
        assert!(began.elapsed() >= Duration::from_secs(2));
        assert!(!second.fresh, "a late reading is not fresh");
        assert!(
            second.samples.iter().all(|g| g.error.is_none()),
            "{:?}",
            second.samples
        );
        let third = readings.take(Duration::from_secs(10)).await;
        assert!(third.fresh);
        assert!(
            third.samples.iter().all(|g| g.error.is_none()),
            "{:?}",
            third.samples
        );
    }
}
