//! Where a conda environment named by its name is on a host: in an installation's `envs/`
//! (the installation itself for `base`). Installations: the one `CONDA_EXE` belongs to, the
//! usual ones in a home, the system's. The CLI asks it of the submitting host, the
//! supervisor of its node.

use std::path::{Path, PathBuf};

/// Installation folders looked for in a home.
const IN_HOME: &[&str] = &[
    "miniconda3",
    "anaconda3",
    "miniforge3",
    "mambaforge",
    ".conda",
];
/// System-wide installations.
const SYSTEM: &[&str] = &[
    "/opt/conda",
    "/opt/miniconda3",
    "/opt/anaconda3",
    "/opt/miniforge3",
    "/usr/local/miniconda3",
    "/usr/local/anaconda3",
];

/// The prefix of the conda environment `name` (one holding `conda-meta/`), and every place
/// looked at (for a message that says where it is not).
pub fn find_conda(
    name: &str,
    conda_exe: Option<&str>,
    home: Option<&Path>,
) -> (Option<PathBuf>, Vec<PathBuf>) {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(root) = conda_exe.and_then(|e| Path::new(e).parent()?.parent()) {
        roots.push(root.to_path_buf());
    }
    if let Some(home) = home {
        roots.extend(IN_HOME.iter().map(|d| home.join(d)));
    }
    roots.extend(SYSTEM.iter().map(PathBuf::from));
    let candidates: Vec<PathBuf> = roots
        .into_iter()
        .map(|r| {
            if name == "base" {
                r
            } else {
                r.join("envs").join(name)
            }
        })
        .collect();
    let found = candidates
        .iter()
        .find(|p| std::fs::metadata(p.join("conda-meta")).is_ok_and(|m| m.is_dir()))
        .cloned();
    (found, candidates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_is_found_by_name_in_its_installation() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("conda/envs/torch/conda-meta")).expect("env");
        std::fs::create_dir_all(dir.path().join("conda/conda-meta")).expect("base");
        let exe = dir.path().join("conda/bin/conda").display().to_string();
        let (found, _) = find_conda("torch", Some(&exe), None);
        assert_eq!(found, Some(dir.path().join("conda/envs/torch")));
        let (found, _) = find_conda("base", Some(&exe), None);
        assert_eq!(found, Some(dir.path().join("conda")));
        let (found, looked) = find_conda("nope", None, Some(dir.path()));
        assert_eq!(found, None);
        assert!(looked.contains(&dir.path().join("miniconda3/envs/nope")));
        assert!(looked.contains(&PathBuf::from("/opt/conda/envs/nope")));
    }
}
