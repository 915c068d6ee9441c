//! What an out-of-memory error's text says of the allocation that failed: read by the agent
//! (an OOM under a memory limit that held less than it, plus what it asked, is the GPU's
//! fault, not the attempt's) and by the coordinator (an OOMed run needs at least what it held
//! plus what it asked; its memory key learns that at once).

/// How much the failed allocation asked for, in MiB (rounded up), from the last such
/// sentence of an OOM's text: PyTorch's `Tried to allocate 2.00 GiB`, XLA's `while trying to
/// allocate 1073741824 bytes`. `None` when the text does not say.
pub fn tried_to_allocate_mib(log: &str) -> Option<u64> {
    let (at, phrase) = ["Tried to allocate ", "trying to allocate "]
        .iter()
        .filter_map(|p| log.rfind(p).map(|i| (i, *p)))
        .max_by_key(|(i, _)| *i)?;
    let mut words = log[at + phrase.len()..].split_whitespace();
    let number: f64 = words.next()?.trim_end_matches(',').parse().ok()?;
    let unit = words.next()?.trim_end_matches(['.', ',', ';', ')']);
    let mib = match unit {
        "bytes" | "B" => number / (1024.0 * 1024.0),
        "KiB" | "KB" => number / 1024.0,
        "MiB" | "MB" => number,
        "GiB" | "GB" => number * 1024.0,
        "TiB" | "TB" => number * 1024.0 * 1024.0,
        _ => return None,
    };
    (mib.is_finite() && mib >= 0.0).then(|| mib.ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failed_allocation_is_read_from_the_last_oom_sentence() {
        let torch = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. \
                     GPU 0 has a total capacity of 79.10 GiB";
        assert_eq!(tried_to_allocate_mib(torch), Some(2048));
        assert_eq!(
            tried_to_allocate_mib("Tried to allocate 20.00 MiB\nTried to allocate 6144 MiB."),
            Some(6144)
        );
        let xla = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes.";
        assert_eq!(tried_to_allocate_mib(xla), Some(1024));
        assert_eq!(
            tried_to_allocate_mib("RuntimeError: CUDA error: out of memory"),
            None
        );
        assert_eq!(tried_to_allocate_mib("Tried to allocate lots"), None);
    }
}
