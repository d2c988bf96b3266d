//! The options of [`Database::open_with`](crate::Database::open_with) and
//! their defaults.

use std::time::Duration;

use melddb::{checkpoint, Settings};

#[cfg(doc)]
use melddb::{Outcome, Snapshot};

#[cfg(doc)]
use crate::{Database, DbError};

/// Default of [`Options::checkpoint_part_bytes`]: 1 MiB, so appending one
/// part at a time holds commits up only briefly.
pub const DEFAULT_CHECKPOINT_PART_BYTES: usize = checkpoint::DEFAULT_PART_BYTES;

/// Default of [`Options::checkpoint_bytes`]: 64 MiB of log between checkpoints.
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 64 << 20;

/// Default of [`Options::cache_bytes`]: 1 GiB of tree in memory.
pub const DEFAULT_CACHE_BYTES: u64 = 1 << 30;

/// Default of [`Options::commit_timeout`]: 60 s.
pub const DEFAULT_COMMIT_TIMEOUT: Duration = Duration::from_secs(60);

/// When a commit is acknowledged relative to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// After a flush (`fdatasync`) that covers it (default): an
    /// acknowledged commit survives a crash or power loss.
    Sync,
    /// After it was written to its segment file (handed to the OS):
    /// survives a process crash, not a power loss. Faster on slow disks.
    Buffered,
}

/// How [`Database::transact`] retries a transaction that meld aborted
/// (or trial meld rejected): attempts in all, and the pause before each
/// new attempt, doubling from `first_backoff` up to `max_backoff`, each
/// drawn at random between half and one and a half times that (so
/// conflicting clients do not retry in step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1; 0 counts as 1).
    pub max_attempts: u32,
    /// The pause after the first abort.
    pub first_backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 16 attempts, pauses from 50 µs doubling to 10 ms.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 16,
            first_backoff: Duration::from_micros(50),
            max_backoff: Duration::from_millis(10),
        }
    }
}

/// Options of [`Database::open_with`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Settings written into the genesis record when the directory holds
    /// no database yet; ignored otherwise (the log's settings win).
    pub settings: Settings,
    /// Acknowledgement policy.
    pub durability: Durability,
    /// Commits appended and waiting for a flush before the next commit
    /// flushes them itself before it appends (back-pressure instead of an
    /// unbounded backlog of unflushed commits). Matters with
    /// [`Database::submit`], which returns before the flush.
    pub max_in_flight: usize,
    /// Segment file size.
    pub segment_bytes: u64,
    /// How [`Database::transact`] retries a transaction meld aborted.
    pub retry: RetryPolicy,
    /// Trial meld (Hyder §5): before queuing a commit, check it against the
    /// latest state on the committing thread; one that already conflicts
    /// is answered [`Outcome::Rejected`] and never appended. Off by
    /// default: it costs one meld per commit on the client thread and only
    /// pays off under contention (measured in docs/embedded.md).
    pub trial_meld: bool,
    /// Write a checkpoint (melddb::checkpoint) once this many bytes were
    /// appended since the last one — and at least twice the last
    /// checkpoint's size, so a large database does not spend its log on
    /// checkpoints. Recovery starts from the latest checkpoint, so this
    /// bounds the log replayed on open. `0` turns automatic checkpoints
    /// off ([`Database::checkpoint`] still works). On the log service
    /// ([`Database::connect`]): the interval of the node directory's own
    /// checkpoints (taken at begin records of the log, for restarts and
    /// the node cache), and of published ones on a publishing node.
    pub checkpoint_bytes: u64,
    /// Largest chunk of a checkpoint in one log record (at least 4 KiB;
    /// default 1 MiB). The background thread appends one part at a time,
    /// holding commits up only briefly.
    pub checkpoint_part_bytes: usize,
    /// Garbage collection: after a checkpoint, delete the log segments
    /// that hold only entries before the *previous* checkpoint (two are
    /// kept, so one damaged checkpoint still leaves a way to recover), and
    /// none that a stub still reads from (see [`Options::cache_bytes`]).
    pub trim_log: bool,
    /// Node cache budget: the memory the tree may hold, in bytes
    /// (estimated like [`Snapshot::approx_bytes`]). Past it, subtrees that
    /// a complete checkpoint holds leave memory and are read back from the
    /// log on use (CLOCK eviction), and checkpoints are written early when
    /// what only memory holds fills the budget. `0` keeps the whole
    /// database in memory. Recovery with a budget does not load the
    /// checkpoint: it verifies it and reads nodes back as they are used.
    /// On the log service, evicted subtrees are read back from the node
    /// directory's own checkpoints.
    pub cache_bytes: u64,
    /// The bearer token [`Database::connect`] sends to the log service
    /// (`None`: the service must allow anonymous access). Unused by
    /// [`Database::open`].
    pub token: Option<String>,
    /// On a shared log ([`Database::connect`]): this node writes
    /// checkpoints into the log every `checkpoint_bytes` of log melded
    /// and points the companion log `LOG.ckpt` at each, so nodes that
    /// join (or restart) load the latest one instead of replaying from
    /// genesis; with `trim_log` it then trims the log below the
    /// checkpoint before. Needs append (and trim) rights on both logs.
    /// One or a few trusted nodes publish; off by default.
    pub publish_checkpoints: bool,
    /// On a shared log ([`Database::connect`]): how long a commit waits
    /// for its outcome (append and meld) before it answers
    /// [`DbError::TimedOut`] (default 60 s; `None`: forever). Unused by
    /// [`Database::open`], whose commits only wait for the local disk.
    pub commit_timeout: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            settings: Settings::default(),
            durability: Durability::Sync,
            max_in_flight: 1024,
            segment_bytes: crate::filelog::DEFAULT_SEGMENT_BYTES,
            retry: RetryPolicy::default(),
            trial_meld: false,
            checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES,
            checkpoint_part_bytes: DEFAULT_CHECKPOINT_PART_BYTES,
            trim_log: true,
            cache_bytes: DEFAULT_CACHE_BYTES,
            token: None,
            publish_checkpoints: false,
            commit_timeout: Some(DEFAULT_COMMIT_TIMEOUT),
        }
    }
}
