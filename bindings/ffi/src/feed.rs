//! The change feed for foreign code: a listener called from a thread of
//! the binding's own, stopped by dropping or closing its handle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use melddb_runtime::{ChangeFeed, FeedError};

use crate::error::MeldError;

/// One key's committed change.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct Change {
    /// The key.
    pub key: Vec<u8>,
    /// Its new value; `None`: deleted.
    pub value: Option<Vec<u8>>,
}

/// The changes one committed transaction made under a watched prefix.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct Commit {
    /// The transaction's log position.
    pub position: u64,
    /// Its changes, in key order.
    pub changes: Vec<Change>,
}

/// Receives a watch's commits, in log order, on the watch's thread.
#[uniffi::export(with_foreign)]
pub trait ChangeListener: Send + Sync {
    /// A committed transaction's changes. An error (a throw) ends the
    /// watch: `on_end` follows with [`MeldError::Callback`].
    fn on_commit(&self, commit: Commit) -> Result<(), MeldError>;
    /// The feed ended: `error` says why (the listener threw, it fell more
    /// than the feed's queue behind, or the node closed). No call follows.
    fn on_end(&self, error: MeldError);
}

/// A running watch; dropping or closing it stops the listener's calls.
#[derive(uniffi::Object)]
pub struct WatchHandle {
    alive: Arc<AtomicBool>,
}

/// How often the watch's thread looks whether its handle is gone.
const POLL: Duration = Duration::from_millis(50);

impl WatchHandle {
    pub(crate) fn start(
        mut feed: ChangeFeed,
        listener: Arc<dyn ChangeListener>,
    ) -> Result<Arc<WatchHandle>, MeldError> {
        let alive = Arc::new(AtomicBool::new(true));
        let running = alive.clone();
        std::thread::Builder::new()
            .name("melddb-ffi-watch".into())
            .spawn(move || {
                while running.load(Ordering::Relaxed) {
                    let commit = match feed.next_timeout(POLL) {
                        Ok(Some(c)) => c,
                        Ok(None) => continue,
                        Err(e) => {
                            let detail = e.to_string();
                            listener.on_end(match e {
                                FeedError::Lagged { .. } | FeedError::Closed => {
                                    MeldError::State { detail }
                                }
                            });
                            return;
                        }
                    };
                    // Nothing is delivered once the handle is stopped.
                    if !running.load(Ordering::Relaxed) {
                        return;
                    }
                    let delivered = listener.on_commit(Commit {
                        position: commit.pos,
                        changes: commit
                            .changes
                            .into_iter()
                            .map(|ch| Change {
                                key: ch.key.to_vec(),
                                value: ch.value.map(|v| v.to_vec()),
                            })
                            .collect(),
                    });
                    if let Err(e) = delivered {
                        listener.on_end(match e {
                            MeldError::Callback { .. } => e,
                            other => MeldError::Callback {
                                detail: other.to_string(),
                            },
                        });
                        return;
                    }
                }
            })
            .map_err(|e| MeldError::Internal {
                detail: format!("could not start the watch's thread: {e}"),
            })?;
        Ok(Arc::new(WatchHandle { alive }))
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Relaxed);
    }
}

#[uniffi::export]
impl WatchHandle {
    /// Stops the listener's calls (within 50 ms; a call under way
    /// finishes), as releasing the handle does.
    pub fn stop(&self) {
        self.alive.store(false, Ordering::Relaxed);
    }
}
