//! Stop signals: SIGTERM (how Kubernetes and systemd stop a service) and SIGINT (Ctrl-C) mean
//! the same to every headroom binary: drain, then exit 0.

use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
#[error("cannot listen for {signal}: {source}")]
pub struct SignalError {
    signal: &'static str,
    source: std::io::Error,
}

/// Catches SIGTERM and SIGINT from this call on and cancels `stop` at the first one. Call it
/// first thing in `main` (inside the runtime): a signal that arrives while the process starts
/// must drain it too, not kill it with the default action. The task ends with `stop`.
pub fn cancel_on_stop_signal(
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, SignalError> {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = |kind: SignalKind, name: &'static str| {
        signal(kind).map_err(|source| SignalError {
            signal: name,
            source,
        })
    };
    let mut term = listen(SignalKind::terminate(), "SIGTERM")?;
    let mut int = listen(SignalKind::interrupt(), "SIGINT")?;
    Ok(tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = stop.cancelled() => return,
        };
        tracing::info!("{name}: shutting down");
        stop.cancel();
    }))
}
