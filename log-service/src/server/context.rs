//! What every connection and route of a running service shares (the
//! store, the network counters, the connection limit, the stop signal),
//! and the rule for what a token's rights allow, which the binary
//! protocol and HTTP both apply.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tokio::sync::{watch, Semaphore};

use crate::config::Rights;
use crate::protocol::Request;
use crate::store::Store;

/// Network counters, served on `/metrics`.
#[derive(Debug, Default)]
pub struct NetMetrics {
    pub(super) connections_total: AtomicU64,
    pub(super) connections_open: AtomicU64,
    pub(super) connections_refused: AtomicU64,
    pub(super) frames_in: AtomicU64,
    pub(super) error_frames: AtomicU64,
    pub(super) auth_failures: AtomicU64,
    pub(super) http_requests: AtomicU64,
}

/// What every connection and route of one running service shares.
pub(super) struct Ctx {
    pub(super) store: Arc<Store>,
    pub(super) metrics: NetMetrics,
    pub(super) conns: Arc<Semaphore>,
    pub(super) stop: watch::Receiver<bool>,
}

impl Ctx {
    fn all_rights() -> Rights {
        Rights {
            logs: vec!["*".into()],
            read: true,
            append: true,
        }
    }

    /// The rights of `token`; every right when the service has no tokens.
    pub(super) fn rights_for(&self, token: &str) -> Option<Rights> {
        let tokens = &self.store.config().tokens;
        if tokens.is_empty() {
            return Some(Ctx::all_rights());
        }
        tokens.get(token).cloned()
    }

    /// Every right when the service has no tokens, so nothing needs a
    /// token; otherwise none until one is given.
    pub(super) fn open_rights(&self) -> Option<Rights> {
        self.store.config().tokens.is_empty().then(Ctx::all_rights)
    }
}

/// Whether rights `r` allow `req`: Ping and Hello need nothing; appends,
/// batches and trims need the log and the append right; reads (single
/// and ranges), bounds and subscriptions (single and batched) need the
/// log and the read right. `Err` says why not.
pub(super) fn allowed(r: &Rights, req: &Request) -> Result<(), String> {
    let (log, need_append) = match req {
        Request::Append { log, .. }
        | Request::AppendBatch { log, .. }
        | Request::Trim { log, .. } => (log, true),
        Request::Read { log, .. }
        | Request::ReadRange { log, .. }
        | Request::Bounds { log }
        | Request::Subscribe { log, .. }
        | Request::SubscribeBatches { log, .. } => (log, false),
        Request::Ping | Request::Hello { .. } => return Ok(()),
    };
    if !r.covers(log) {
        return Err(format!("token has no rights on log {log:?}"));
    }
    if need_append && !r.append {
        return Err("token may not append or trim".into());
    }
    if !need_append && !r.read {
        return Err("token may not read".into());
    }
    Ok(())
}
