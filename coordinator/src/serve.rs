//! The HTTP server under the router: connections accepted and served by hyper, with bounds a
//! slow or idle client cannot outlast. A request's head must arrive within
//! [`Limits::header`] (which also bounds how long a kept-alive connection sits idle), its
//! body may pause at most [`Limits::body_idle`] between chunks, and at most
//! [`Limits::connections`] connections are served at once (past that, new ones wait in the
//! kernel's backlog). Stopping closes the listener, lets requests in flight finish, and
//! closes idle connections.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What one client may hold of the server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Longest a request's head may take to arrive, from the connection's start or the end
    /// of its previous request: a slowloris, or a kept-alive connection left idle, is
    /// closed past it.
    pub header: Duration,
    /// Longest a request's body may pause between chunks.
    pub body_idle: Duration,
    /// Most connections served at once.
    pub connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header: headroom_shared::routes::SERVER_IDLE_CLOSE,
            body_idle: Duration::from_secs(10),
            connections: 4096,
        }
    }
}

/// Serves `app` on `listener` until `stop` is cancelled, then until the connections have
/// finished what they were doing (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections));
    let mut full_said = false;
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if !full_said {
                    tracing::warn!(
                        limit = limits.connections,
                        "as many connections as allowed are open: new ones wait"
                    );
                    full_said = true;
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                }
            }
        };
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors (EMFILE) or a connection reset before it was
                    // taken: said, then tried again shortly rather than at once.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        full_said = false;
        let _ = stream.set_nodelay(true);
        let service = connection_service(app.clone(), peer, limits.body_idle);
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, "connection ended: {e}");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The router for one connection: each request knows its peer's address (the access
/// gate's throttle reads it) and has its body bounded in idle time.
fn connection_service(
    app: Router,
    peer: SocketAddr,
    body_idle: Duration,
) -> impl hyper::service::Service<
    hyper::Request<Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Send,
> {
    hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let mut req = req.map(|body| {
            axum::body::Body::new(tower_http::timeout::TimeoutBody::new(body_idle, body))
        });
        req.extensions_mut().insert(ConnectInfo(peer));
        tower::ServiceExt::oneshot(app.clone(), req)
    })
}
