//! A node's first credential from a join token (`--join-token-file`): exchanged once with
//! the coordinator (`POST /v1/agents/join`), kept in the agent's data directory (0600), and
//! used from then on, as kubelets bootstrap their certificates. The join token, shared by
//! many nodes, acts for none of them.

use std::path::{Path, PathBuf};

use headroom_shared::client::{BearerToken, Client, ClientError};
use headroom_shared::secret::{self, SecretError};

/// The node's credential in the agent's data directory.
pub const CREDENTIAL_FILE: &str = "node-token";

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("joining node {node} with the join token: {source}")]
    Exchange {
        node: String,
        #[source]
        source: ClientError,
    },
    #[error("cannot keep the node's credential in {path}: {source}")]
    Keep {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The node's credential: the one kept in `data_dir`, else (with a join token) one
/// exchanged for it now and kept; `None` without either.
pub async fn credential(
    data_dir: &Path,
    join_token_file: Option<&Path>,
    coordinator: &str,
    ca_file: Option<&Path>,
    node: &str,
) -> Result<Option<BearerToken>, JoinError> {
    let kept = data_dir.join(CREDENTIAL_FILE);
    if kept.exists() {
        let token = secret::read_file(&kept, "the node's credential")?;
        return Ok(Some(token.parse().unwrap_or_else(|e| match e {})));
    }
    let Some(file) = join_token_file else {
        return Ok(None);
    };
    let join = secret::read_file(file, "--join-token-file")?;
    let exchange = |source| JoinError::Exchange {
        node: node.to_string(),
        source,
    };
    let client = Client::new_with(coordinator, ca_file)
        .and_then(|c| c.with_token(Some(&join)))
        .map_err(exchange)?;
    let made = client.join(node).await.map_err(exchange)?;
    // Kept before it is used: a credential the node lost could not be made again.
    secret::write_private(&kept, &made.token).map_err(|source| JoinError::Keep {
        path: kept.clone(),
        source,
    })?;
    tracing::info!(node, id = %made.view.id, "joined: this node's credential is kept in {}", kept.display());
    Ok(Some(made.token.parse().unwrap_or_else(|e| match e {})))
}
