//! The change feed: committed changes in a key range, in log order, for
//! user interfaces and caches ([`Database::watch`](crate::Database::watch)).
//!
//! The node hands every committed intention to [`Feeds::publish`] as it
//! melds it; each watcher whose range it touches gets one [`Commit`] with
//! the changes inside its range. A watcher's queue is bounded: one that
//! falls [`QUEUE`] commits behind is cut off and told so
//! ([`FeedError::Lagged`]) rather than holding the node back; it can read
//! the current state and watch again.

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use melddb::{Bytes, LogPos};

/// Commits a watcher may have queued before it is cut off.
pub const QUEUE: usize = 4096;

/// One key's change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The key.
    pub key: Bytes,
    /// Its new value; `None`: deleted.
    pub value: Option<Bytes>,
}

/// The changes one committed transaction made inside a watched range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// The transaction's log position.
    pub pos: LogPos,
    /// Its changes in the range, in key order.
    pub changes: Vec<Change>,
}

/// Why a change feed ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeedError {
    /// The watcher fell [`QUEUE`] commits behind and was cut off after
    /// the commit at `pos`; read the current state and watch again.
    #[error("the change feed fell {QUEUE} commits behind after position {pos} and was cut off; read the current state and watch again")]
    Lagged {
        /// The last commit delivered before the cut.
        pos: LogPos,
    },
    /// The database was closed.
    #[error("the database is closed")]
    Closed,
}

struct Watcher {
    start: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
    tx: SyncSender<Commit>,
    /// The last commit queued, for the message when it is cut off.
    last: LogPos,
    /// Cleared when the [`ChangeFeed`] is dropped.
    alive: Arc<AtomicBool>,
    /// Set (to the last position delivered + 1) when it is cut off.
    lagged: Arc<AtomicU64>,
}

impl Watcher {
    fn covers(&self, key: &[u8]) -> bool {
        let after_start = match &self.start {
            Bound::Included(s) => key >= &s[..],
            Bound::Excluded(s) => key > &s[..],
            Bound::Unbounded => true,
        };
        let before_end = match &self.end {
            Bound::Included(e) => key <= &e[..],
            Bound::Excluded(e) => key < &e[..],
            Bound::Unbounded => true,
        };
        after_start && before_end
    }
}

/// Every watcher of one node.
#[derive(Default)]
pub(crate) struct Feeds {
    watchers: Mutex<Vec<Watcher>>,
}

impl std::fmt::Debug for Feeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Feeds({} watchers)", self.lock().len())
    }
}

impl Feeds {
    /// A new watcher of the keys in `start..end`.
    pub fn watch(&self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> ChangeFeed {
        let (tx, rx) = sync_channel(QUEUE);
        let alive = Arc::new(AtomicBool::new(true));
        let lagged = Arc::new(AtomicU64::new(0));
        self.lock().push(Watcher {
            start: start.map(<[u8]>::to_vec),
            end: end.map(<[u8]>::to_vec),
            tx,
            last: 0,
            alive: alive.clone(),
            lagged: lagged.clone(),
        });
        ChangeFeed {
            rx,
            done: None,
            alive,
            lagged,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Watcher>> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether anyone watches (publishing costs a parse otherwise saved).
    pub fn any(&self) -> bool {
        !self.lock().is_empty()
    }

    /// The intention `bytes` committed at `pos`: hands its changes to
    /// every watcher whose range they touch. `present` says whether a key
    /// was in the state the intention was melded onto: a deletion of a
    /// key that was absent changed nothing and is left out.
    pub fn publish(&self, pos: LogPos, bytes: &[u8], present: impl Fn(&[u8]) -> bool) {
        let mut watchers = self.lock();
        if watchers.is_empty() {
            return;
        }
        let Ok(parsed) = melddb::parse(bytes) else {
            return;
        };
        let changes: Vec<Change> = parsed
            .changes()
            .into_iter()
            .filter(|(k, v)| v.is_some() || present(k))
            .map(|(k, v)| Change {
                key: Bytes::from(k),
                value: v.map(Bytes::from),
            })
            .collect();
        watchers.retain_mut(|w| {
            let mine: Vec<Change> = changes
                .iter()
                .filter(|c| w.covers(&c.key))
                .cloned()
                .collect();
            if !w.alive.load(Ordering::Relaxed) {
                return false;
            }
            if mine.is_empty() {
                return true;
            }
            match w.tx.try_send(Commit { pos, changes: mine }) {
                Ok(()) => {
                    w.last = pos;
                    true
                }
                Err(TrySendError::Full(_)) => {
                    // Cut off: the receiver drains its queue, then finds
                    // the channel closed and this mark.
                    w.lagged.store(w.last + 1, Ordering::Relaxed);
                    false
                }
                Err(TrySendError::Disconnected(_)) => false,
            }
        });
    }
}

/// Committed changes in a key range, in log order, from the moment
/// [`Database::watch`](crate::Database::watch) was called. Blocking:
/// [`ChangeFeed::next`] (it is an [`Iterator`]) waits for the next
/// commit; [`ChangeFeed::next_timeout`] waits at most a while. Dropping
/// it stops the feed.
pub struct ChangeFeed {
    rx: Receiver<Commit>,
    done: Option<FeedError>,
    alive: Arc<AtomicBool>,
    lagged: Arc<AtomicU64>,
}

impl Drop for ChangeFeed {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for ChangeFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeFeed")
            .field("done", &self.done)
            .finish()
    }
}

impl ChangeFeed {
    /// The next commit, waiting at most `timeout`: `Ok(None)` if none came.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Commit>, FeedError> {
        if let Some(e) = &self.done {
            return Err(e.clone());
        }
        match self.rx.recv_timeout(timeout) {
            Ok(c) => Ok(Some(c)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                let e = match self.lagged.load(Ordering::Relaxed) {
                    0 => FeedError::Closed,
                    p => FeedError::Lagged { pos: p - 1 },
                };
                Err(self.end(e))
            }
        }
    }

    fn end(&mut self, e: FeedError) -> FeedError {
        self.done = Some(e.clone());
        e
    }
}

impl Iterator for ChangeFeed {
    type Item = Result<Commit, FeedError>;

    /// Waits for the next commit; `None` once the feed ended (after the
    /// error that ended it was returned once).
    fn next(&mut self) -> Option<Self::Item> {
        if self.done.is_some() {
            return None;
        }
        loop {
            match self.next_timeout(Duration::from_secs(3600)) {
                Ok(Some(c)) => return Some(Ok(c)),
                Ok(None) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}
