//! Profiles: named bundles of allocator and threading environment for jobs.

/// `default`: the settings the seeds found to cut fragmentation and CPU oversubscription
/// when several training processes share a GPU.
const DEFAULT: &[(&str, &str)] = &[
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
    ("TOKENIZERS_PARALLELISM", "false"),
    ("OMP_NUM_THREADS", "1"),
    ("MKL_NUM_THREADS", "1"),
];

pub const DEFAULT_PROFILE: &str = "default";
pub const NAMES: &[&str] = &["default", "none"];

/// The variables of a built-in profile; `none` sets nothing.
pub fn builtin(name: &str) -> Option<&'static [(&'static str, &'static str)]> {
    match name {
        "default" => Some(DEFAULT),
        "none" => Some(&[]),
        _ => None,
    }
}
