//! `headroom up` and `headroom doctor` run in `headroom-node`, installed beside `headroom`:
//! the client's commands start without the coordinator's, the agent's and the supervisors'
//! code, which is most of a process start's cost (its pages and relocations).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// The binary that runs `up` and `doctor`, looked for in `headroom`'s own directory.
pub const NODE_BINARY: &str = "headroom-node";

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(
        "`headroom {command}` runs {NODE_BINARY} beside headroom, but headroom's own path cannot be read: {source}"
    )]
    OwnPath {
        command: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "`headroom {command}` runs {}, which is missing: install {NODE_BINARY} beside headroom \
         (`cargo build --release` builds both into target/release)",
        path.display()
    )]
    Missing {
        command: &'static str,
        path: PathBuf,
    },
    #[error("`headroom {command}` runs {}, which could not be started: {source}", path.display())]
    Exec {
        command: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where `headroom-node` is: beside this program (links resolved).
pub fn path(command: &'static str) -> Result<PathBuf, NodeError> {
    std::env::current_exe()
        .map(|exe| exe.with_file_name(NODE_BINARY))
        .map_err(|source| NodeError::OwnPath { command, source })
}

/// Becomes `headroom-node` with this process's arguments, environment and descriptors (the
/// same pid, so whatever started `headroom up` still holds it); returns only on failure.
pub fn exec(command: &'static str) -> NodeError {
    let path = match path(command) {
        Ok(path) => path,
        Err(e) => return e,
    };
    let source = std::process::Command::new(&path)
        .args(std::env::args_os().skip(1))
        .exec();
    if source.kind() == std::io::ErrorKind::NotFound {
        NodeError::Missing { command, path }
    } else {
        NodeError::Exec {
            command,
            path,
            source,
        }
    }
}
