//! What the writer publishes for readers: the state new transactions
//! begin on, and the figures behind [`Database::log_stats`],
//! [`Database::cache_stats`] and [`Database::recovery`].

use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use melddb::{LogPos, MeldState, Settings};

use crate::nodestore::{LogStore, StoreStats};

#[cfg(doc)]
use super::{Durability, Options};
#[cfg(doc)]
use crate::Database;

/// The latest state and the published figures, shared by the database,
/// the committing threads and the background threads.
pub(super) struct Shared {
    pub(super) latest: RwLock<MeldState>,
    pub(super) settings: Settings,
    pub(super) dir: PathBuf,
    pub(super) log: std::sync::Mutex<LogStats>,
    pub(super) store: Arc<LogStore>,
    pub(super) cache: std::sync::Mutex<CacheStats>,
}

impl Shared {
    /// Makes `state` the one new transactions begin on.
    pub(super) fn publish(&self, state: MeldState) {
        *self.latest.write().unwrap_or_else(PoisonError::into_inner) = state;
    }
    /// The published log figures.
    pub(super) fn log_stats(&self) -> std::sync::MutexGuard<'_, LogStats> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
    /// The published cache figures.
    pub(super) fn cache_stats(&self) -> std::sync::MutexGuard<'_, CacheStats> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The node cache as last measured (see
/// [`Database::cache_stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// The budget ([`Options::cache_bytes`]; 0: everything in memory).
    pub budget: u64,
    /// Tree memory at the last measurement (after the last sweep).
    pub in_memory_bytes: u64,
    /// Largest tree memory measured.
    pub peak_bytes: u64,
    /// Sweeps that evicted.
    pub sweeps: u64,
    /// Persisted subtrees replaced by stubs, over all sweeps.
    pub stubbed: u64,
    /// Loaded stubs whose body left memory, over all sweeps.
    pub unloaded: u64,
    /// Checkpoints written early because memory filled up.
    pub pressure_checkpoints: u64,
    /// Trims held back because a stub still read from an older checkpoint.
    pub trims_held: u64,
    /// Reads from the log.
    pub store: StoreStats,
}

/// A checkpoint that was written (or recovered from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Position of its begin record: the state it holds is the state there.
    pub first: LogPos,
    /// Position of its last part (where it became complete).
    pub pos: LogPos,
    /// CSN of that state.
    pub csn: melddb::Vn,
    /// Tree nodes it holds.
    pub nodes: u64,
    /// Bytes of its records.
    pub bytes: u64,
    /// Ephemeral nodes created since the previous checkpoint that were
    /// still reachable when it was written: state that existed only in
    /// memory (a crash would have recomputed it by replay) and that this
    /// checkpoint persisted — the job of the paper's flush intentions.
    pub flushed_ephemeral: u64,
    /// Time to encode, append, sync and trim (0 for a recovered one).
    pub micros: u64,
}

/// The log as last published (see [`Database::log_stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogStats {
    /// First position still in the log (earlier ones were trimmed).
    pub first: LogPos,
    /// Next position to be written.
    pub tail: LogPos,
    /// Every record before this position is durable (flushed to disk).
    /// Updated before a state is published: with [`Durability::Sync`], no
    /// snapshot holds a commit at or after it.
    pub synced: LogPos,
    /// Bytes in the segment files.
    pub bytes: u64,
    /// The latest checkpoint, if any.
    pub last_checkpoint: Option<CheckpointInfo>,
    /// Checkpoints written by this process.
    pub checkpoints_written: u64,
    /// Times the log was trimmed by this process.
    pub trims: u64,
    /// Why automatic checkpoints stopped, if they did.
    pub checkpoint_error: Option<String>,
    /// Record bytes appended by this process (intentions and checkpoints).
    pub bytes_appended: u64,
    /// On the log service: times this node found the log trimmed past its
    /// position (it was away) and went on from the latest published
    /// checkpoint instead of the entries it missed.
    pub rejoins: u64,
    /// On the log service: the latest checkpoint of the node directory's
    /// own (`DIR/checkpoints`, for the node cache and restarts), how many
    /// this process wrote, and why the latest attempt failed, if it did.
    pub local_checkpoint: Option<CheckpointInfo>,
    /// See [`LogStats::local_checkpoint`].
    pub local_checkpoints_written: u64,
    /// See [`LogStats::local_checkpoint`].
    pub local_checkpoint_error: Option<String>,
}

/// What opening the database found.
#[derive(Debug, Clone)]
pub struct Recovery {
    /// Log records verified.
    pub records: u64,
    /// Bytes of an unacknowledged torn tail that were cut off.
    pub torn_bytes: u64,
    /// Time spent verifying and replaying the log.
    pub elapsed: Duration,
    /// Position of the begin record of the checkpoint recovery started
    /// from (`None`: from the genesis record).
    pub checkpoint: Option<LogPos>,
    /// On a shared log: whether that checkpoint was the node directory's
    /// own (`DIR/checkpoints`) rather than one published on the service.
    pub local_checkpoint: bool,
    /// Entries melded after the starting point.
    pub replayed: u64,
    /// Checkpoints that were found damaged and skipped (each with why);
    /// recovery then used an older one or the genesis record.
    pub skipped_checkpoints: Vec<String>,
}
