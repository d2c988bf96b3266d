//! [`Database`]: one MeldDB node, on a local log or on a shared log of the
//! log service, with one contract.

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::thread;

use melddb::pipeline::trial_meld;
use melddb::{AbortReason, Bytes, Isolation, MeldState, Outcome, Settings, Snapshot, Transaction};
use rand::Rng;

use crate::embedded::{
    CacheStats, CheckpointInfo, DbError, Local, LocalHandle, LogStats, Options, Recovery,
    RetryPolicy, TransactError,
};
use crate::feed::{ChangeFeed, Feeds};
use crate::read::{prefix_end, ReadTransaction};
use crate::remote::{Remote, RemoteHandle};

/// A MeldDB node. Cheap to share: wrap it in an `Arc` and call it from
/// any number of threads.
///
/// [`Database::open`] runs it on a durable log of its own in a directory
/// (the embedded database); [`Database::connect`] joins a log on the log
/// service that any number of nodes, in any number of processes, share.
/// Either way it begins transactions on its own copy of the latest
/// committed state and decides commits by melding the log.
#[derive(Debug)]
pub struct Database {
    backend: Backend,
    retry: RetryPolicy,
    trial_meld: bool,
    feeds: Arc<Feeds>,
}

#[derive(Debug)]
enum Backend {
    Local(Local),
    Remote(Box<Remote>),
}

/// A commit on its way; [`CommitHandle::wait`] gives its outcome.
#[derive(Debug)]
pub struct CommitHandle {
    inner: Handle,
}

#[derive(Debug)]
enum Handle {
    Ready(Result<Outcome, DbError>),
    Local(LocalHandle),
    Remote(RemoteHandle),
}

impl std::fmt::Debug for RemoteHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteHandle(at {})", self.pos())
    }
}

impl CommitHandle {
    /// Blocks until the outcome is known and the commit is durable: on a
    /// local log once a flush covers it (with the default
    /// [`Durability::Sync`](crate::Durability::Sync)); on the log service
    /// once this node has melded it (the service acknowledges only
    /// durable appends).
    pub fn wait(self) -> Result<Outcome, DbError> {
        match self.inner {
            Handle::Ready(o) => o,
            Handle::Local(h) => h.wait(),
            Handle::Remote(h) => h.wait(),
        }
    }
}

impl Database {
    /// Opens the database in `dir`, creating it with default settings if
    /// the directory is empty or missing.
    pub fn open(dir: impl AsRef<Path>) -> Result<Database, DbError> {
        Database::open_with(dir, Options::default())
    }

    /// Opens (or creates) the database in `dir` with `opts`.
    ///
    /// The directory is locked until the database is dropped (the `lock`
    /// file in it, [`LOCK_FILE`](crate::embedded::LOCK_FILE)): while it is
    /// open, another open of `dir`, in this process or another, fails with
    /// [`DbError::Locked`] and changes nothing.
    pub fn open_with(dir: impl AsRef<Path>, opts: Options) -> Result<Database, DbError> {
        let feeds = Arc::new(Feeds::default());
        Ok(Database {
            backend: Backend::Local(Local::open_with(dir.as_ref(), &opts, feeds.clone())?),
            retry: opts.retry,
            trial_meld: opts.trial_meld,
            feeds,
        })
    }

    /// Joins the log at `url` (`melddb://host:port/LOG`) on the log
    /// service, creating it with `opts.settings` if it is empty. `dir` is
    /// the node's own directory, locked for its life. `opts.token` is
    /// sent to the service; of the other options, `max_in_flight`,
    /// `retry`, `trial_meld` and, for a node that publishes checkpoints
    /// (`publish_checkpoints`), `checkpoint_bytes`,
    /// `checkpoint_part_bytes` and `trim_log` apply. It loads the latest
    /// checkpoint published for the log (readable with the token) and
    /// melds the log after it, or the whole log if there is none.
    ///
    /// Returns once the node has melded every entry the log held when it
    /// connected. It then follows the log as the service pushes entries;
    /// when the service goes away it subscribes again where it stopped.
    pub fn connect(url: &str, dir: impl AsRef<Path>, opts: Options) -> Result<Database, DbError> {
        let feeds = Arc::new(Feeds::default());
        Ok(Database {
            backend: Backend::Remote(Box::new(Remote::connect(
                url,
                dir.as_ref(),
                &opts,
                opts.token.clone(),
                feeds.clone(),
            )?)),
            retry: opts.retry,
            trial_meld: opts.trial_meld,
            feeds,
        })
    }

    /// A change feed of the keys in `start..end`: every transaction this
    /// node melds as committed from now on, with its changes in the range,
    /// in log order (on the log service, every node's commits). Combine it
    /// with [`Database::snapshot`] taken before the call to keep a view of
    /// the range up to date.
    pub fn watch(&self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> ChangeFeed {
        self.feeds.watch(start, end)
    }

    /// A change feed of the keys that start with `prefix`.
    pub fn watch_prefix(&self, prefix: &[u8]) -> ChangeFeed {
        match prefix_end(prefix) {
            Some(end) => self
                .feeds
                .watch(Bound::Included(prefix), Bound::Excluded(&end)),
            None => self.feeds.watch(Bound::Included(prefix), Bound::Unbounded),
        }
    }

    /// What opening or connecting found and did.
    pub fn recovery(&self) -> &Recovery {
        match &self.backend {
            Backend::Local(l) => l.recovery(),
            Backend::Remote(r) => r.recovery(),
        }
    }

    /// The database settings (from its genesis record).
    pub fn settings(&self) -> Settings {
        match &self.backend {
            Backend::Local(l) => l.settings(),
            Backend::Remote(r) => r.settings(),
        }
    }

    fn latest(&self) -> MeldState {
        match &self.backend {
            Backend::Local(l) => l.latest(),
            Backend::Remote(r) => r.latest(),
        }
    }

    /// The latest committed state this node has.
    pub fn snapshot(&self) -> Snapshot {
        self.latest().snapshot().clone()
    }

    /// Reads one key of the latest committed state.
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>, DbError> {
        Ok(self.snapshot().get(key)?)
    }

    /// Waits until this node has every commit that was answered anywhere
    /// before the call began (on a local log there is nothing to wait
    /// for). A transaction begun afterwards reads an up-to-date state.
    pub fn sync_with_log(&self) -> Result<(), DbError> {
        match &self.backend {
            Backend::Local(_) => Ok(()),
            Backend::Remote(r) => r.sync_with_log(),
        }
    }

    /// Makes every commit answered so far durable: with
    /// [`Durability::Buffered`](crate::Durability::Buffered), one flush of
    /// the log (`fdatasync`); with the default `Sync`, and on the log
    /// service (which acknowledges only durable appends), they already are
    /// and this returns at once.
    pub fn sync(&self) -> Result<(), DbError> {
        match &self.backend {
            Backend::Local(l) => l.sync(),
            Backend::Remote(_) => Ok(()),
        }
    }

    /// The node cache's figures, as of the last measurement (a node on the
    /// log service keeps its whole tree in memory).
    pub fn cache_stats(&self) -> CacheStats {
        match &self.backend {
            Backend::Local(l) => l.cache_stats(),
            Backend::Remote(r) => r.cache_stats(),
        }
    }

    /// Begins a read-write transaction on the latest committed state this
    /// node has; [`Database::commit`] or [`Database::submit`] ends it.
    pub fn begin(&self, isolation: Isolation) -> Transaction {
        Transaction::begin(&self.snapshot(), isolation)
    }

    /// Begins a read-only transaction on the latest committed state this
    /// node has. It needs no commit and never aborts. On the log service
    /// this state may lack commits other nodes had answered when it
    /// began; [`Database::begin_read_latest`] waits for them.
    pub fn begin_read(&self) -> ReadTransaction {
        ReadTransaction::new(self.snapshot())
    }

    /// Begins a read-only transaction that sees every commit answered
    /// anywhere before this call (Minuet's up-to-date read): on the log
    /// service it learns the log's tail first and waits until this node
    /// has melded up to it; on a local log it is [`Database::begin_read`].
    pub fn begin_read_latest(&self) -> Result<ReadTransaction, DbError> {
        self.sync_with_log()?;
        Ok(self.begin_read())
    }

    /// Finishes `tx`, appends its intention and returns without waiting
    /// for its outcome ([`CommitHandle::wait`] does). With
    /// [`Options::trial_meld`], a transaction that already conflicts with
    /// the latest state is answered [`Outcome::Rejected`] and never
    /// appended. Once [`Options::max_in_flight`] commits wait, this call
    /// waits for one first.
    pub fn submit(&self, tx: Transaction) -> Result<CommitHandle, DbError> {
        let ready = |o| CommitHandle {
            inner: Handle::Ready(o),
        };
        let Some((bytes, local)) = tx.finish_local()? else {
            return Ok(ready(Ok(Outcome::ReadOnly)));
        };
        if self.trial_meld {
            let mut stats = melddb::MeldStats::default();
            let latest = self.latest();
            // A failed read back makes the trial say nothing: meld decides.
            if let Err(reason) = trial_meld(&self.settings(), &local, &latest, &mut stats) {
                return Ok(ready(Ok(Outcome::Rejected { reason })));
            }
        }
        let inner = match &self.backend {
            Backend::Local(l) => Handle::Local(l.submit(&bytes, local)?),
            Backend::Remote(r) => Handle::Remote(r.submit(bytes, local)?),
        };
        Ok(CommitHandle { inner })
    }

    /// Commits `tx` and waits for its outcome.
    pub fn commit(&self, tx: Transaction) -> Result<Outcome, DbError> {
        self.submit(tx)?.wait()
    }

    /// Runs `f` in a transaction and commits it, retrying on conflicts as
    /// [`Options::retry`] says; returns `f`'s result from the attempt that
    /// committed (or was read-only).
    ///
    /// `f` returns the caller's own error type `E`; an error from `f` ends
    /// the transaction at once, nothing committed
    /// ([`TransactError::Aborted`]). For `?` on the transaction's
    /// operations inside `f`, `E` implements `From<TxnError>`; with
    /// `E = TxnError`, the result converts into [`DbError`] with `?`.
    pub fn transact<T, E>(
        &self,
        isolation: Isolation,
        mut f: impl FnMut(&mut Transaction) -> Result<T, E>,
    ) -> Result<T, TransactError<E>> {
        let policy = self.retry;
        let attempts = policy.max_attempts.max(1);
        let mut delay = policy.first_backoff;
        let mut last = None;
        for attempt in 1..=attempts {
            let mut tx = self.begin(isolation);
            let value = f(&mut tx).map_err(TransactError::Aborted)?;
            match self.commit(tx)? {
                Outcome::Aborted { reason, .. } | Outcome::Rejected { reason } => {
                    last = Some(reason);
                    if attempt < attempts {
                        thread::sleep(delay.mul_f64(rand::rng().random_range(0.5..1.5)));
                        delay = (delay * 2).min(policy.max_backoff);
                    }
                }
                _ => return Ok(value),
            }
        }
        Err(TransactError::Db(DbError::Conflict {
            attempts,
            last: last.unwrap_or(AbortReason::SnapshotUnavailable { snapshot_pos: 0 }),
        }))
    }

    /// Writes a checkpoint of the latest state now (after every commit
    /// queued before this call) and waits until it is durable. Recovery
    /// then starts from it, and with [`Options::trim_log`] the log below
    /// the previous checkpoint is deleted. On the log service, a node with
    /// [`Options::publish_checkpoints`] publishes one now; any other
    /// answers [`DbError::Unsupported`].
    pub fn checkpoint(&self) -> Result<CheckpointInfo, DbError> {
        match &self.backend {
            Backend::Local(l) => l.checkpoint(),
            Backend::Remote(r) => r.checkpoint(),
        }
    }

    /// The log's extent, the latest checkpoint and garbage collection
    /// counters, as of the last commit or background step (on the log
    /// service: as far as this node has melded).
    pub fn log_stats(&self) -> LogStats {
        match &self.backend {
            Backend::Local(l) => l.log_stats(),
            Backend::Remote(r) => r.log_stats(),
        }
    }

    /// Reachable ephemeral nodes of the latest state created since the
    /// latest checkpoint: the state only memory holds (a crash recomputes
    /// it by replaying the log after the checkpoint). Checkpoints bound it.
    pub fn unpersisted_nodes(&self) -> u64 {
        match &self.backend {
            Backend::Local(l) => l.unpersisted_nodes(),
            Backend::Remote(_) => melddb::checkpoint::unpersisted_nodes(&self.snapshot(), 0),
        }
    }

    /// Flushes every commit, finishes a checkpoint whose parts are all
    /// encoded, and stops the node's threads. Commits submitted and not
    /// waited for are durable afterwards. On the log service, appended
    /// commits are durable already, and a checkpoint being published is
    /// left incomplete (nothing points at it).
    pub fn close(mut self) -> Result<(), DbError> {
        match &mut self.backend {
            Backend::Local(l) => l.close(),
            Backend::Remote(r) => r.close(),
        }
    }
}
