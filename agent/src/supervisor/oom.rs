//! Finds CUDA out-of-memory text in a job's log, fed in chunks as it grows: the evidence
//! [`crate::supervisor::classify`] weighs for an `oom` end. How much the failed allocation
//! asked for is read by [`headroom_shared::oom`], which the coordinator reads too.

use std::borrow::Cow;

/// Text that frameworks print when the GPU runs out of memory. Matched case-sensitively, as
/// printed; the torch and `RuntimeError` forms contain the shorter ones.
pub const OOM_PATTERNS: &[&str] = &[
    // PyTorch: `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...`
    // (also `torch.cuda.OutOfMemoryError` and `RuntimeError: CUDA out of memory`).
    "CUDA out of memory",
    // CUDA runtime errors surfaced by PyTorch: `RuntimeError: CUDA error: out of memory`.
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    // Driver API name (JAX, CuPy, numba) and runtime API name (CuPy).
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
    // XLA (JAX) and TensorFlow.
    "RESOURCE_EXHAUSTED: Out of memory",
    "OOM when allocating tensor",
];

/// Watches a log fed in chunks of any size for CUDA out-of-memory text.
#[derive(Debug, Default)]
pub struct OomScanner {
    /// The end of the previous chunk, so that a pattern split across two chunks is found.
    tail: Vec<u8>,
    seen: bool,
}

impl OomScanner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Scans the next piece of the log; returns whether OOM text has been seen so far.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        if self.seen || chunk.is_empty() {
            return self.seen;
        }
        let overlap = Self::overlap();
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(chunk);
        // The patterns are ASCII: replacing invalid UTF-8 cannot hide or invent a match, and
        // the lossy view borrows (no copy) when the log is valid UTF-8.
        let text: Cow<'_, str> = String::from_utf8_lossy(&window);
        self.seen = OOM_PATTERNS.iter().any(|p| text.contains(p));
        let keep = window.len().min(overlap);
        window.drain(..window.len() - keep);
        self.tail = window;
        self.seen
    }

    pub fn saw_oom(&self) -> bool {
        self.seen
    }

    /// Bytes kept between chunks: one less than the longest pattern.
    fn overlap() -> usize {
        OOM_PATTERNS
            .iter()
            .map(|p| p.len())
            .max()
            .unwrap_or(1)
            .saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn finds_every_known_oom_text() {
        for text in [
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be ...",
            "RuntimeError: CUDA out of memory.",
            "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while",
        ] {
            let mut s = OomScanner::new();
            assert!(s.feed(text.as_bytes()), "{text}");
        }
        let mut s = OomScanner::new();
        assert!(!s.feed(b"epoch 1 loss 0.3\nout of memory? no: cuda fine\n"));
        assert!(!s.saw_oom());
    }

    #[test]
    fn finds_text_split_across_chunks_and_stays_set() {
        let text = b"step 9\ntorch.OutOfMemoryError: CUDA out of memory. Tried\n";
        for cut in 0..text.len() {
            let mut s = OomScanner::new();
            s.feed(&text[..cut]);
            assert!(s.feed(&text[cut..]), "cut at {cut}");
        }
        // One byte at a time.
        let mut s = OomScanner::new();
        for b in text {
            s.feed(std::slice::from_ref(b));
        }
        assert!(s.saw_oom());
        assert!(s.feed(b"later lines"));
    }

    proptest! {
        #[test]
        fn any_chunking_finds_the_pattern(
            before in proptest::collection::vec(any::<u8>(), 0..300),
            after in proptest::collection::vec(any::<u8>(), 0..300),
            cuts in proptest::collection::vec(0usize..700, 0..6),
            which in 0..OOM_PATTERNS.len(),
        ) {
            let mut log = before.clone();
            log.extend_from_slice(OOM_PATTERNS[which].as_bytes());
            log.extend_from_slice(&after);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(log.len())).collect();
            cuts.sort_unstable();
            let mut s = OomScanner::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([log.len()]) {
                s.feed(&log[at..c]);
                at = c;
            }
            prop_assert!(s.saw_oom());
        }
    }
}
