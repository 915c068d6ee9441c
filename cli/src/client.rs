//! The CLI's client of the REST API (the shared typed client, `headroom_shared::client`), and
//! the words people need when a call fails for reasons of setup: the coordinator cannot be
//! reached, the token is missing or wrong, or its role may not do this.

use std::path::Path;

use anyhow::{Context, anyhow};
use headroom_shared::api::ErrorCode;
pub use headroom_shared::client::{BearerToken, Client as Api, ClientError, LogChunk};

/// The token in a file (its first line; a trailing newline is fine).
pub fn read_token_file(path: &Path) -> anyhow::Result<BearerToken> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--token-file (HEADROOM_TOKEN_FILE) {}", path.display()))?;
    let line = text.lines().next().unwrap_or_default().trim();
    if line.is_empty() {
        anyhow::bail!(
            "--token-file (HEADROOM_TOKEN_FILE) {} is empty",
            path.display()
        );
    }
    Ok(line.parse()?)
}

/// Why a connection failed, in a few words (`connection refused`), from the innermost cause.
fn cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return "connection refused".into(),
                std::io::ErrorKind::TimedOut => return "timed out".into(),
                _ => {}
            }
        }
        last = s.to_string();
        src = s.source();
    }
    if let Some(r) = e.downcast_ref::<reqwest::Error>()
        && r.is_timeout()
    {
        return "timed out".into();
    }
    last
}

/// Replaces setup failures with what to do about them; other errors pass unchanged.
/// `left_by_up`: the file the token came from, when a local `headroom up` left it.
pub fn with_hint(e: anyhow::Error, api: &Api, left_by_up: Option<&Path>) -> anyhow::Error {
    let Some(ce) = e.downcast_ref::<ClientError>() else {
        return e;
    };
    match ce {
        ClientError::Unreachable { base, source } if cause(source).contains("certificate") => {
            anyhow!(
                "cannot reach the coordinator at {base}: {} (its certificate is not one this \
                 machine trusts: give its CA with --ca-file or HEADROOM_CA_FILE)",
                cause(source)
            )
        }
        ClientError::Unreachable { base, source } => anyhow!(
            "cannot reach the coordinator at {base}: {} (set --server or HEADROOM_SERVER; is \
             `headroom up` running?)",
            cause(source)
        ),
        ClientError::Refused {
            code: ErrorCode::Unauthenticated,
            message,
            ..
        } => {
            if let Some(file) = left_by_up {
                anyhow!(
                    "the coordinator at {} refused the token left by a `headroom up` in {}: \
                     {message} (an `up` there that stopped without removing it, most likely: \
                     remove the file, or give --token, HEADROOM_TOKEN or --token-file)",
                    api.base(),
                    file.display()
                )
            } else if api.has_token() {
                anyhow!(
                    "the coordinator at {} refused the token: {message} (check --token, \
                     HEADROOM_TOKEN or --token-file; an admin makes a new one with \
                     `headroom token create --role user --name NAME`)",
                    api.base()
                )
            } else {
                anyhow!(
                    "the coordinator at {} requires a token: set --token or HEADROOM_TOKEN \
                     (or --token-file); an admin makes one with `headroom token create --role \
                     user --name NAME`",
                    api.base()
                )
            }
        }
        ClientError::Refused {
            code: ErrorCode::Forbidden,
            message,
            ..
        } => anyhow!("forbidden: {message}"),
        ClientError::BadToken => anyhow!(
            "the token (--token, HEADROOM_TOKEN or --token-file) holds characters an HTTP \
             header cannot carry"
        ),
        _ => e,
    }
}
