//! `headroom up` and `headroom doctor` run in `headroom-node`, installed beside `headroom`:
//! the client's commands start without the coordinator's, the agent's and the supervisors'
//! code, which is most of a process start's cost (its pages and relocations).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// The binary that runs `up` and `doctor`, looked for in `headroom`'s own directory.
pub const NODE_BINARY: &str = "headroom-node";

/// The build of the `headroom` that started `headroom-node`, set in its environment: two
/// binaries of different builds refuse to run together rather than misread each other's
/// flags and files.
pub const CLIENT_VERSION_VAR: &str = "HEADROOM_CLIENT_VERSION";

/// This build: the version and, built from a git checkout, the commit (`build.rs`); the same
/// in both binaries of one build, and what `--version` prints.
pub const VERSION: &str = env!("HEADROOM_BUILD");

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(
        "`headroom {command}` runs {NODE_BINARY} beside headroom, but headroom's own path cannot be read: {source}"
    )]
    OwnPath {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "`headroom {command}` runs {}, which is missing: install {NODE_BINARY} beside headroom \
         (`cargo build --release` builds both into target/release)",
        path.display()
    )]
    Missing { command: String, path: PathBuf },
    #[error("`headroom {command}` runs {}, which could not be started: {source}", path.display())]
    Exec {
        command: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "headroom {client} started {NODE_BINARY} {VERSION} (beside it): install both from the \
         same build (`cargo install --path cli` installs both)"
    )]
    Skew { client: String },
}

/// In `headroom-node`: refuses to run for a `headroom` of another build (an upgrade that
/// replaced one binary of the two). Run without `headroom` (no variable), it runs.
pub fn check_client_version() -> Result<(), NodeError> {
    match std::env::var_os(CLIENT_VERSION_VAR) {
        Some(client) if client != VERSION => Err(NodeError::Skew {
            client: client.to_string_lossy().into_owned(),
        }),
        _ => Ok(()),
    }
}

/// Where `headroom-node` is: beside this program (links resolved).
fn path(command: &str) -> Result<PathBuf, NodeError> {
    std::env::current_exe()
        .map(|exe| exe.with_file_name(NODE_BINARY))
        .map_err(|source| NodeError::OwnPath {
            command: command.to_string(),
            source,
        })
}

/// Becomes `headroom-node` with this process's arguments (its name too: `ps` and usage
/// errors say `headroom`), environment and descriptors (the same pid, so whatever started
/// `headroom up` still holds it); returns only on failure.
pub fn exec(command: &str) -> NodeError {
    let path = match path(command) {
        Ok(path) => path,
        Err(e) => return e,
    };
    let mut args = std::env::args_os();
    let name = args.next().unwrap_or_else(|| "headroom".into());
    let source = std::process::Command::new(&path)
        .arg0(name)
        .args(args)
        .env(CLIENT_VERSION_VAR, VERSION)
        .exec();
    let command = command.to_string();
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
