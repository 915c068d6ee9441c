//! The per-attempt supervisor is a program of its own: it must keep running its job, measure
//! it and clean up after it while no agent exists, so nothing of it may depend on the agent's
//! side of the crate.

use std::path::Path;

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_supervisor_imports_nothing_of_the_agents_side() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for shared in ["supervisor", "gpu"] {
        sources(&root.join(shared), &mut files);
    }
    files.push(root.join("procscan.rs"));
    files.push(root.join("outcomes.rs"));
    let offenders: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).expect("read source");
            text.lines()
                .enumerate()
                .filter(|(_, l)| {
                    let code = l.trim_start();
                    !code.starts_with("//") && code.contains("crate::agent")
                })
                .map(|(n, l)| format!("{}:{}: {}", f.display(), n + 1, l.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(files.len() > 10, "the supervisor's sources were found");
    assert!(offenders.is_empty(), "{offenders:#?}");
}
