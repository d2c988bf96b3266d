//! The network face: the binary protocol over TCP and WebSocket, and
//! HTTP/JSON for health, Prometheus metrics and tools. Every connection
//! is bounded: frames by `max_frame_bytes` (checked before allocation),
//! requests in flight by `max_in_flight` (the server stops reading a
//! connection that reaches it), connections by `max_connections`; HTTP
//! append bodies by `max_record_bytes`.
//!
//! `context` holds what every connection shares and the rights rule;
//! `connection` serves one connection's frames for both `tcp` and
//! `websocket`, which write what it queues (`outgoing`); `ranges` answers
//! range reads and `subscriptions` pushes entries; `http` and `metrics`
//! are the HTTP routes.

mod connection;
mod context;
mod http;
mod metrics;
mod outgoing;
mod ranges;
mod subscriptions;
mod tcp;
#[cfg(test)]
mod tests;
mod websocket;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use context::Ctx;
pub use context::NetMetrics;

use crate::store::Store;

/// A running service: its addresses and the handle to stop it.
pub struct Running {
    /// Binary protocol address.
    pub tcp: SocketAddr,
    /// HTTP address.
    pub http: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, lets in-flight requests finish, closes
    /// connections, and returns when the listeners are down. The store is
    /// left open for the caller to shut down.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Starts the TCP and HTTP listeners from the store's configuration.
pub async fn start(store: Arc<Store>) -> std::io::Result<Running> {
    let listen = store.config().listen.clone();
    start_on(store, &listen.tcp, &listen.http).await
}

/// Starts listeners on the given addresses (port 0 picks a free one).
pub async fn start_on(store: Arc<Store>, tcp: &str, http: &str) -> std::io::Result<Running> {
    let (stop_tx, stop) = watch::channel(false);
    let max_conns = store.config().limits.max_connections;
    let ctx = Arc::new(Ctx {
        store,
        metrics: NetMetrics::default(),
        conns: Arc::new(Semaphore::new(max_conns)),
        stop: stop.clone(),
    });
    let tcp_l = TcpListener::bind(tcp).await?;
    let http_l = TcpListener::bind(http).await?;
    let (tcp_addr, http_addr) = (tcp_l.local_addr()?, http_l.local_addr()?);
    let mut tasks = Vec::new();
    {
        let ctx = ctx.clone();
        let mut stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    acc = tcp_l.accept() => match acc {
                        Ok((sock, _)) => { tokio::spawn(tcp::tcp_conn(ctx.clone(), sock)); }
                        Err(e) => tracing::warn!(error = %e, "accept failed"),
                    }
                }
            }
        }));
    }
    {
        let app = router(ctx.clone());
        let mut stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let r = axum::serve(http_l, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.changed().await;
                })
                .await;
            if let Err(e) = r {
                tracing::error!(error = %e, "http server stopped");
            }
        }));
    }
    tracing::info!(%tcp_addr, %http_addr, "log service listening");
    Ok(Running {
        tcp: tcp_addr,
        http: http_addr,
        stop: stop_tx,
        tasks,
    })
}

/// The HTTP routes, the WebSocket's among them.
fn router(ctx: Arc<Ctx>) -> Router {
    // An append's body is one record: take it up to max_record_bytes, not
    // axum's default of 2 MB. The other routes read no body.
    let record_limit = ctx.store.config().max_record_bytes as usize;
    Router::new()
        .route("/health", get(http::health))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/stats", get(http::stats))
        .route("/v1/segments", get(http::segments))
        .route(
            "/v1/logs/{log}/append",
            post(http::http_append).layer(DefaultBodyLimit::max(record_limit)),
        )
        .route("/v1/logs/{log}/entries/{pos}", get(http::http_read))
        .route("/v1/logs/{log}/tail", get(http::http_tail))
        .route("/v1/logs/{log}/trim/{pos}", post(http::http_trim))
        .route("/v1/ws", get(websocket::ws_upgrade))
        .with_state(ctx)
}
