//! The embedded database: `Database::open(dir)`.
//!
//! A durable [`FileLog`] in `dir` and the melder, both behind one lock.
//! Any number of threads run transactions on snapshots; a committing
//! thread takes the lock, appends its intention and melds it itself (no
//! hand-over to another thread), then waits for a flush that covers it.
//! A sync thread does the flushes (group commit): each one covers every
//! record appended before it starts, and while committers keep waiting the
//! next starts the moment the previous ends. When a flush ends, the sync
//! thread publishes the state it made durable and wakes exactly the
//! committers it covered. Admission control: once `max_in_flight` commits
//! wait for a flush, the next commit waits for one before it appends. A
//! background thread appends checkpoint parts, sweeps the node cache and
//! answers checkpoint requests. Recovery on open replays the log from the
//! latest checkpoint.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use melddb::checkpoint;
use melddb::pipeline::trial_meld;
use melddb::{
    AbortReason, Bytes, Isolation, Log, LogPos, MeldState, Melder, Outcome, Settings, Snapshot,
    Transaction, TxnError,
};

use rand::Rng;

use crate::dirlock::DirLock;
pub use crate::dirlock::LOCK_FILE;
use crate::filelog::{FileLog, FileLogError, OpenReport};
use crate::nodestore::{LogStore, StoreStats};

/// Default of [`Options::checkpoint_part_bytes`]: 1 MiB, so appending one
/// part at a time holds commits up only briefly.
pub const DEFAULT_CHECKPOINT_PART_BYTES: usize = checkpoint::DEFAULT_PART_BYTES;

/// Default of [`Options::checkpoint_bytes`]: 64 MiB of log between checkpoints.
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 64 << 20;

/// Default of [`Options::cache_bytes`]: 1 GiB of tree in memory.
pub const DEFAULT_CACHE_BYTES: u64 = 1 << 30;

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
    /// Attempts [`Database::transact`] makes before giving up.
    pub max_attempts: u32,
    /// Trial meld (Hyder §5): before queuing a commit, check it against the
    /// latest state on the committing thread; one that already conflicts
    /// is answered [`Outcome::Rejected`] and never appended. Off by
    /// default: it costs one meld per commit on the client thread and only
    /// pays off under contention (measured in docs/benchmarks.md).
    pub trial_meld: bool,
    /// Write a checkpoint (melddb::checkpoint) once this many bytes were
    /// appended since the last one — and at least twice the last
    /// checkpoint's size, so a large database does not spend its log on
    /// checkpoints. Recovery starts from the latest checkpoint, so this
    /// bounds the log replayed on open. `0` turns automatic checkpoints
    /// off ([`Database::checkpoint`] still works). Needs premeld and group
    /// meld off; otherwise no checkpoint is written.
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
    /// Needs checkpoints (premeld and group meld off); otherwise ignored.
    pub cache_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            settings: Settings::default(),
            durability: Durability::Sync,
            max_in_flight: 1024,
            segment_bytes: crate::filelog::DEFAULT_SEGMENT_BYTES,
            max_attempts: 16,
            trial_meld: false,
            checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES,
            checkpoint_part_bytes: DEFAULT_CHECKPOINT_PART_BYTES,
            trim_log: true,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

/// Errors of the embedded database.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The log files could not be read or written.
    #[error(transparent)]
    Log(#[from] FileLogError),
    /// The log's first record is not a valid genesis record.
    #[error("{path}: not a MeldDB database (bad genesis record: {why})")]
    NotADatabase {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// Another open [`Database`] holds the directory (in this process or
    /// another): two would overwrite each other's commits. Nothing was
    /// read or written; close the other one first, or go through it.
    #[error("{}", crate::dirlock::locked_message(path, *holder))]
    Locked {
        /// The directory.
        path: PathBuf,
        /// The holder's process id, as it wrote it in the lock file.
        holder: Option<u32>,
    },
    /// The options are invalid.
    #[error("invalid option: {0}")]
    Options(String),
    /// The transaction itself failed (key or value too large, ...).
    #[error(transparent)]
    Txn(#[from] TxnError),
    /// [`Database::transact`] kept conflicting.
    #[error("transaction aborted {attempts} times; last: {last}")]
    Conflict {
        /// Attempts made.
        attempts: u32,
        /// Why the last one aborted.
        last: AbortReason,
    },
    /// No state to recover from: every checkpoint still in the log is
    /// damaged and the log before them was trimmed.
    #[error("{path}: cannot recover: {why}")]
    Unrecoverable {
        /// The directory.
        path: PathBuf,
        /// What was tried and failed.
        why: String,
    },
    /// A checkpoint could not be written.
    #[error("checkpoint failed: {0}")]
    Checkpoint(String),
    /// Part of the tree could not be read back from the log (node cache).
    #[error(transparent)]
    Store(#[from] melddb::StoreError),
    /// The database stopped taking commits (after an I/O error on its log,
    /// or because it was closed); reopen it.
    #[error("the database stopped: {0}")]
    Stopped(String),
}

struct Shared {
    latest: RwLock<MeldState>,
    settings: Settings,
    dir: PathBuf,
    log: std::sync::Mutex<LogStats>,
    store: Arc<LogStore>,
    cache: std::sync::Mutex<CacheStats>,
}

impl Shared {
    /// Makes `state` the one new transactions begin on.
    fn publish(&self, state: MeldState) {
        *self.latest.write().unwrap_or_else(PoisonError::into_inner) = state;
    }
    /// The published log figures.
    fn log_stats(&self) -> std::sync::MutexGuard<'_, LogStats> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
    /// The published cache figures.
    fn cache_stats(&self) -> std::sync::MutexGuard<'_, CacheStats> {
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
    /// Entries melded after the starting point.
    pub replayed: u64,
    /// Checkpoints that were found damaged and skipped (each with why);
    /// recovery then used an older one or the genesis record.
    pub skipped_checkpoints: Vec<String>,
}

/// An embedded MeldDB database in a directory. Cheap to share: wrap it in
/// an `Arc` and call it from any number of threads.
pub struct Database {
    shared: Arc<Shared>,
    engine: Arc<Engine>,
    background: Option<JoinHandle<()>>,
    syncer: Option<JoinHandle<()>>,
    max_attempts: u32,
    trial_meld: bool,
    recovery: Recovery,
    /// Held for the database's life; released after the shutdown in
    /// `drop` has stopped every thread that writes.
    _lock: DirLock,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("dir", &self.shared.dir)
            .finish()
    }
}

/// A commit appended and melded; [`CommitHandle::wait`] gives its outcome
/// once it is durable. Dropping the handle without waiting leaves the
/// commit to be flushed by the background thread.
pub struct CommitHandle {
    state: HandleState,
}

enum HandleState {
    /// Answered already (read-only, rejected by trial meld, or buffered).
    Ready(Result<Outcome, DbError>),
    /// Appended at `pos`; answered once a flush covers it.
    Pending {
        pos: LogPos,
        engine: Arc<Engine>,
        /// Meld decided it when the commit was appended.
        outcome: Outcome,
        /// What meld released for this commit, freed by the committing
        /// thread while it waits for the flush anyway.
        garbage: Option<melddb::Garbage>,
    },
    Taken,
}

impl std::fmt::Debug for CommitHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            HandleState::Ready(o) => write!(f, "CommitHandle(ready: {o:?})"),
            HandleState::Pending { pos, .. } => write!(f, "CommitHandle(pending at {pos})"),
            HandleState::Taken => write!(f, "CommitHandle(taken)"),
        }
    }
}

impl CommitHandle {
    fn ready(o: Result<Outcome, DbError>) -> CommitHandle {
        CommitHandle {
            state: HandleState::Ready(o),
        }
    }

    /// Blocks until the outcome is known and, with [`Durability::Sync`],
    /// the sync thread's flush made the commit durable.
    pub fn wait(mut self) -> Result<Outcome, DbError> {
        match std::mem::replace(&mut self.state, HandleState::Taken) {
            HandleState::Ready(o) => o,
            HandleState::Taken => Err(DbError::Stopped("the outcome was already taken".into())),
            HandleState::Pending {
                pos,
                engine,
                outcome,
                garbage,
            } => {
                // Freeing costs tens of microseconds of cache misses: done
                // while the flush runs.
                engine.make_durable(pos + 1, garbage)?;
                Ok(outcome)
            }
        }
    }
}

impl Drop for CommitHandle {
    fn drop(&mut self) {
        if let HandleState::Pending { pos, engine, .. } = &self.state {
            // Nobody waits: the background thread flushes the commit (so
            // its state gets published) if no one else does.
            let _ = engine.to_bg.try_send(Msg::Flush(*pos + 1));
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
    pub fn open_with(dir: impl AsRef<Path>, opts: Options) -> Result<Database, DbError> {
        let dir = dir.as_ref().to_path_buf();
        if opts.max_in_flight == 0 {
            return Err(DbError::Options("max_in_flight must be at least 1".into()));
        }
        if opts.checkpoint_part_bytes < 4096
            || opts.checkpoint_part_bytes > checkpoint::MAX_PART_BYTES
        {
            return Err(DbError::Options(format!(
                "checkpoint_part_bytes must be between 4096 and {}",
                checkpoint::MAX_PART_BYTES
            )));
        }
        let started = Instant::now();
        // Before anything in the directory is read or written.
        let lock = DirLock::take(&dir)?;
        let (mut log, report): (FileLog, OpenReport) =
            FileLog::open_with(&dir, opts.segment_bytes)?;
        let not_db = |why: String| DbError::NotADatabase {
            path: dir.clone(),
            why,
        };
        if log.tail() == 0 {
            opts.settings
                .validate()
                .map_err(|e| DbError::Options(e.to_string()))?;
            log.append(&opts.settings.encode())
                .map_err(|e| not_db(e.to_string()))?;
            log.sync()?;
        }
        let store = Arc::new(LogStore::new());
        // A database without checkpoints (premeld or group meld on) has no
        // checkpoint to load lazily, so the budget only matters below.
        let start = recover(
            &log,
            &dir,
            (opts.cache_bytes > 0).then_some(&store),
            opts.cache_bytes,
        )?;
        let mut melder = start.melder;
        melder.set_deferred_reclaim(false);
        let (mut replayed, mut replayed_bytes) = (0u64, 0u64);
        let _ = melddb::take_store_error();
        log.replay(melder.next_pos(), |_, e| {
            melder.apply(e);
            replayed += 1;
            replayed_bytes += e.len() as u64;
        })?;
        if let Some(e) = melddb::take_store_error() {
            return Err(DbError::Unrecoverable {
                path: dir.clone(),
                why: format!("replaying the log after the checkpoint: {e}"),
            });
        }
        close_pair(&mut log, &mut melder)?;
        // The cache needs checkpoints to make nodes evictable.
        let cache_bytes = if checkpoints_supported(melder.settings()) {
            opts.cache_bytes
        } else {
            0
        };
        log.sync()?;
        let log_stats = LogStats {
            first: log.first(),
            tail: log.tail(),
            synced: log.synced(),
            bytes: log.bytes(),
            last_checkpoint: start.checkpoint.clone(),
            checkpoints_written: 0,
            trims: 0,
            checkpoint_error: None,
            bytes_appended: 0,
        };
        let shared = Arc::new(Shared {
            latest: RwLock::new(
                melder
                    .meld_state(melder.lcs().pos())
                    .cloned()
                    .ok_or_else(|| not_db("no state after recovery".into()))?,
            ),
            settings: *melder.settings(),
            dir: dir.clone(),
            log: std::sync::Mutex::new(log_stats),
            store: store.clone(),
            cache: std::sync::Mutex::new(CacheStats {
                budget: cache_bytes,
                ..CacheStats::default()
            }),
        });
        let plan = CheckpointPlan {
            every: opts.checkpoint_bytes,
            part_bytes: opts.checkpoint_part_bytes,
            trim: opts.trim_log,
            last: start.checkpoint.clone(),
            previous_first: start.previous_first,
            // The log since the last checkpoint counts, not just this
            // process's share of it.
            appended: replayed_bytes,
            generation: start.generation,
            cache_bytes,
        };
        // Few messages go to the background thread (checkpoint parts, cache
        // pressure, flushes of dropped handles): a short queue is enough.
        let (tx, rx) = sync_channel::<Msg>(64);
        if plan.cache_bytes > 0 {
            // Readers that load a quarter of the budget wake the background
            // thread to sweep (no commit may come to notice it).
            let wake = tx.clone();
            store.on_pressure(plan.cache_bytes / 4, move || {
                let _ = wake.try_send(Msg::CachePressure);
            });
        }
        melder.set_deferred_reclaim(true);
        let durable = log.synced();
        let writer = Writer::new(log, melder, shared.clone(), store, plan, tx.clone());
        let engine = Arc::new(Engine {
            core: Mutex::new(writer),
            flush: Mutex::new(FlushState {
                durable,
                wanted: durable,
                sleepers: Vec::new(),
                idle: false,
                stop: false,
                failed: None,
            }),
            work: Condvar::new(),
            durability: opts.durability,
            max_in_flight: opts.max_in_flight,
            to_bg: tx,
        });
        let syncer = match opts.durability {
            Durability::Sync => {
                let e = engine.clone();
                Some(
                    thread::Builder::new()
                        .name("melddb-sync".into())
                        .spawn(move || sync_loop(&e))
                        .map_err(|e| {
                            DbError::Stopped(format!("cannot start the sync thread: {e}"))
                        })?,
                )
            }
            Durability::Buffered => None,
        };
        let bg_engine = engine.clone();
        let background = thread::Builder::new()
            .name("melddb-background".into())
            .spawn(move || background_loop(&bg_engine, rx))
            .map_err(|e| DbError::Stopped(format!("cannot start the background thread: {e}")))?;
        Ok(Database {
            shared,
            engine,
            background: Some(background),
            syncer,
            max_attempts: opts.max_attempts.max(1),
            trial_meld: opts.trial_meld,
            recovery: Recovery {
                records: report.records,
                torn_bytes: report.torn_bytes,
                elapsed: started.elapsed(),
                checkpoint: start.checkpoint.map(|c| c.first),
                replayed,
                skipped_checkpoints: start.skipped,
            },
            _lock: lock,
        })
    }

    /// What recovery found when the database was opened.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The database settings (from its genesis record).
    pub fn settings(&self) -> Settings {
        self.shared.settings
    }

    /// The latest committed state.
    pub fn snapshot(&self) -> Snapshot {
        self.shared
            .latest
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .snapshot()
            .clone()
    }

    fn latest(&self) -> MeldState {
        self.shared
            .latest
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads one key of the latest committed state.
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>, DbError> {
        Ok(self.snapshot().try_get(key)?)
    }

    /// The node cache's figures, as of the last measurement.
    pub fn cache_stats(&self) -> CacheStats {
        let mut c = self.shared.cache_stats().clone();
        c.store = self.shared.store.stats();
        c
    }

    /// Begins a transaction on the latest committed state.
    pub fn begin(&self, isolation: Isolation) -> Transaction {
        Transaction::begin(&self.snapshot(), isolation)
    }

    /// Finishes `tx`, appends its intention and melds it on this thread,
    /// and returns without waiting for the flush that makes it durable
    /// ([`CommitHandle::wait`] waits for it). Once
    /// [`Options::max_in_flight`] commits wait for a flush, this call waits
    /// for one before it appends.
    pub fn submit(&self, tx: Transaction) -> Result<CommitHandle, DbError> {
        let Some((bytes, local)) = tx.finish_local()? else {
            return Ok(CommitHandle::ready(Ok(Outcome::ReadOnly)));
        };
        if self.trial_meld {
            let mut stats = melddb::MeldStats::default();
            let latest = self.latest();
            let _ = melddb::take_store_error();
            let trial = trial_meld(&self.shared.settings, &local, &latest, &mut stats);
            // A failed read back makes the trial say nothing: let meld
            // decide.
            let unsure = melddb::take_store_error().is_some();
            if let (Err(reason), false) = (trial, unsure) {
                return Ok(CommitHandle::ready(Ok(Outcome::Rejected { reason })));
            }
        }
        let engine = &self.engine;
        let mut w = loop {
            let w = engine.lock();
            if let Some(e) = &w.failed {
                return Err(DbError::Stopped(e.clone()));
            }
            if engine.durability == Durability::Sync && w.unflushed.len() >= engine.max_in_flight {
                let tail = w.log.tail();
                drop(w);
                engine.make_durable(tail, None)?;
                continue;
            }
            break w;
        };
        let (pos, decided) = match w.commit(&bytes, local).and_then(|c| {
            w.after_commit()?;
            Ok(c)
        }) {
            Ok(c) => c,
            Err(e) => {
                engine.fail(&mut w, &e.to_string());
                return Err(e);
            }
        };
        let garbage = w.melder.take_garbage();
        match engine.durability {
            Durability::Buffered => {
                // Written is enough: answer at once.
                let tail = w.log.tail();
                w.unflushed.clear();
                w.release(tail);
                w.publish_log_stats();
            }
            Durability::Sync => {
                // Just the tail (the rest follows with the flush).
                w.shared.log_stats().tail = w.log.tail();
            }
        }
        drop(w);
        let outcome = decided.ok_or_else(|| {
            DbError::Stopped(format!(
                "entry {pos} was appended but meld did not decide it"
            ))
        })?;
        if engine.durability == Durability::Buffered {
            drop(garbage);
            return Ok(CommitHandle::ready(Ok(outcome)));
        }
        Ok(CommitHandle {
            state: HandleState::Pending {
                pos,
                engine: engine.clone(),
                outcome,
                garbage: Some(garbage),
            },
        })
    }

    /// Commits `tx` and waits for its outcome.
    pub fn commit(&self, tx: Transaction) -> Result<Outcome, DbError> {
        self.submit(tx)?.wait()
    }

    /// Runs `f` in a transaction and commits it, retrying on conflicts with
    /// exponential backoff (50 µs doubling to 10 ms, with jitter) up to
    /// `max_attempts` times. Returns `f`'s result from the attempt that
    /// committed (or was read-only).
    pub fn transact<T>(
        &self,
        isolation: Isolation,
        mut f: impl FnMut(&mut Transaction) -> Result<T, TxnError>,
    ) -> Result<T, DbError> {
        let mut delay = Duration::from_micros(50);
        let mut last = None;
        for attempt in 1..=self.max_attempts {
            let mut tx = self.begin(isolation);
            let value = f(&mut tx)?;
            match self.commit(tx)? {
                Outcome::Aborted { reason, .. } | Outcome::Rejected { reason } => {
                    last = Some(reason);
                    if attempt < self.max_attempts {
                        thread::sleep(delay.mul_f64(rand::rng().random_range(0.5..1.5)));
                        delay = (delay * 2).min(Duration::from_millis(10));
                    }
                }
                _ => return Ok(value),
            }
        }
        Err(DbError::Conflict {
            attempts: self.max_attempts,
            last: last.unwrap_or(AbortReason::SnapshotUnavailable { snapshot_pos: 0 }),
        })
    }

    /// Writes a checkpoint of the latest state now (after every commit
    /// queued before this call) and waits until it is durable. Recovery
    /// then starts from it, and with [`Options::trim_log`] the log below
    /// the previous checkpoint is deleted.
    pub fn checkpoint(&self) -> Result<CheckpointInfo, DbError> {
        if self.background.is_none() {
            return Err(DbError::Stopped("database is closed".into()));
        }
        let (reply, rx) = sync_channel(1);
        self.engine
            .to_bg
            .send(Msg::Checkpoint(reply))
            .map_err(|_| DbError::Stopped("the background thread has stopped".into()))?;
        match rx.recv() {
            Ok(Ok(info)) => Ok(info),
            Ok(Err(e)) => Err(DbError::Checkpoint(e)),
            Err(_) => Err(DbError::Stopped(
                "the background thread exited before answering".into(),
            )),
        }
    }

    /// The log's extent, the latest checkpoint and garbage collection
    /// counters, as of the last commit or background step.
    pub fn log_stats(&self) -> LogStats {
        self.shared.log_stats().clone()
    }

    /// Reachable ephemeral nodes of the latest state created since the
    /// latest checkpoint: the state only memory holds (a crash recomputes
    /// it by replaying the log after the checkpoint). Checkpoints bound it.
    pub fn unpersisted_nodes(&self) -> u64 {
        let since = self
            .shared
            .log_stats()
            .last_checkpoint
            .as_ref()
            .map_or(0, |c| c.csn);
        checkpoint::unpersisted_nodes(&self.snapshot(), since)
    }

    /// Flushes every commit, finishes a checkpoint whose parts are all
    /// encoded, and stops the background thread. Commits submitted and not
    /// waited for are durable afterwards.
    pub fn close(mut self) -> Result<(), DbError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), DbError> {
        let Some(bg) = self.background.take() else {
            return Ok(());
        };
        let _ = self.engine.to_bg.send(Msg::Shutdown);
        let joined = bg.join();
        let closed = self.engine.close();
        if let Some(s) = self.syncer.take() {
            let _ = s.join();
        }
        joined.map_err(|_| DbError::Stopped("the background thread panicked".into()))?;
        closed
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Where recovery starts: a melder at the latest usable checkpoint (or at
/// the genesis record), and what it found on the way.
struct Start {
    melder: Melder,
    checkpoint: Option<CheckpointInfo>,
    /// First part of the checkpoint used: the next one trims below it.
    previous_first: Option<LogPos>,
    skipped: Vec<String>,
    /// The next free node store generation.
    generation: u16,
}

/// Finds the complete checkpoints in the log (from the records' bytes,
/// as every melder does), loads the latest one that verifies, and falls
/// back to older ones, then to the genesis record if the log still has it.
fn recover(
    log: &FileLog,
    dir: &Path,
    store: Option<&Arc<LogStore>>,
    cache_bytes: u64,
) -> Result<Start, DbError> {
    let not_db = |why: String| DbError::NotADatabase {
        path: dir.to_path_buf(),
        why,
    };
    let first = log.first();
    let settings = if first == 0 {
        let head = log.read(0).map_err(|e| not_db(e.to_string()))?;
        Settings::decode(&head).map_err(|e| not_db(e.to_string()))?
    } else {
        // Trimmed: the log starts at a checkpoint's begin record, and the
        // settings are at the start of its first part, a little later.
        first_part_settings(log).map_err(|why| {
            not_db(format!(
                "the log was trimmed to {first}, but no checkpoint part after it holds the settings: {why}"
            ))
        })?
    };
    let mut tracker = checkpoint::Tracker::default();
    let mut complete: Vec<(LogPos, Vec<LogPos>)> = Vec::new();
    let mut parts = Vec::new();
    log.replay(first.max(1), |pos, e| {
        match tracker.feed(&settings, pos, e) {
            checkpoint::TrackEvent::Begin => parts.clear(),
            checkpoint::TrackEvent::Part => parts.push(pos),
            checkpoint::TrackEvent::Complete { begin } => {
                parts.push(pos);
                complete.push((begin, std::mem::take(&mut parts)));
            }
            _ => {}
        }
    })?;
    let mut skipped = Vec::new();
    let mut generation: u16 = 1;
    for (begin, positions) in complete.iter().rev() {
        let begin = *begin;
        let last = positions.last().copied().unwrap_or(begin);
        // Lazily only when the tree may not fit the budget: loading a
        // checkpoint whole is faster than reading it back node by node
        // (and checks its digest). Its nodes take about twice their
        // encoded size in memory.
        let encoded: u64 = positions
            .iter()
            .map(|p| log.record_len(*p).unwrap_or(u64::MAX / 4))
            .fold(0, u64::saturating_add);
        let lazy = store.filter(|_| encoded.saturating_mul(2) > cache_bytes);
        let loaded = match lazy {
            None => load_whole(log, positions),
            Some(store) => load_lazily(log, positions, store, generation, begin),
        }
        .and_then(|(c, bytes)| {
            if c.settings != settings {
                Err("its settings differ from the database's".into())
            } else if c.state.pos() != begin {
                Err("its parts name another begin record".into())
            } else {
                Ok((c, bytes))
            }
        });
        match loaded {
            Ok((c, bytes)) => {
                let info = CheckpointInfo {
                    first: begin,
                    pos: last,
                    csn: c.state.csn(),
                    nodes: c.nodes,
                    bytes,
                    flushed_ephemeral: 0,
                    micros: 0,
                };
                if let Some(store) = lazy {
                    store.complete(generation);
                }
                return Ok(Start {
                    melder: Melder::from_checkpoint(c),
                    checkpoint: Some(info),
                    // The next checkpoint trims below this one.
                    previous_first: Some(begin),
                    skipped,
                    generation: generation + 1,
                });
            }
            Err(why) => {
                if let Some(store) = store {
                    store.remove(generation);
                }
                skipped.push(format!("checkpoint begun at {begin}: {why}"));
                generation += 1;
            }
        }
    }
    if first > 0 {
        return Err(DbError::Unrecoverable {
            path: dir.to_path_buf(),
            why: format!(
                "the log starts at {first} (older entries were trimmed) and no checkpoint in it \
                 verifies: {}",
                skipped.join("; ")
            ),
        });
    }
    Ok(Start {
        melder: Melder::new(settings),
        checkpoint: None,
        previous_first: None,
        skipped,
        generation,
    })
}

/// Loads a checkpoint's parts into memory (no node cache).
fn load_whole(log: &FileLog, positions: &[LogPos]) -> Result<(checkpoint::Loaded, u64), String> {
    let records: Vec<_> = positions
        .iter()
        .map(|p| log.read(*p))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let refs: Vec<&[u8]> = records.iter().map(|p| &p[..]).collect();
    let bytes = refs.iter().map(|p| p.len() as u64).sum::<u64>();
    checkpoint::load(&refs)
        .map(|c| (c, bytes))
        .map_err(|e| e.to_string())
}

/// Verifies a checkpoint's parts one at a time, registering where each
/// one's body is for the node store, and returns a state whose root is a
/// stub: nothing of the tree is loaded until it is used.
fn load_lazily(
    log: &FileLog,
    positions: &[LogPos],
    store: &Arc<LogStore>,
    generation: u16,
    begin: LogPos,
) -> Result<(checkpoint::Loaded, u64), String> {
    let mut bytes = 0u64;
    let dyn_store: Arc<dyn melddb::NodeStore> = store.clone();
    // One part in memory at a time: each is read, registered, parsed and
    // dropped before the next.
    let parts = positions.iter().map(|p| -> Result<melddb::Entry, String> {
        let rec = log.read(*p).map_err(|e| e.to_string())?;
        bytes += rec.len() as u64;
        register_part(log, store, generation, begin, *p, &rec)?;
        Ok(rec)
    });
    let loaded = checkpoint::load_lazy(parts, dyn_store, generation).map_err(|e| e.to_string())?;
    Ok((loaded, bytes))
}

/// Fails if a node could not be read back from the log during the last
/// meld: its decisions are then meaningless, so the database stops (a
/// reopen recovers from the log).
fn read_back_ok() -> Result<(), DbError> {
    match melddb::take_store_error() {
        None => Ok(()),
        Some(e) => Err(DbError::Stopped(format!(
            "reading the database back from the log failed: {e}"
        ))),
    }
}

/// Registers the checkpoint part at `pos` (its bytes `rec`) with the node
/// store.
fn register_part(
    log: &FileLog,
    store: &LogStore,
    generation: u16,
    begin: LogPos,
    pos: LogPos,
    rec: &[u8],
) -> Result<(), String> {
    let chunk = match checkpoint::parse_record(rec) {
        Ok(checkpoint::Record::Part { chunk, .. }) => chunk,
        Ok(_) => return Err(format!("entry {pos} is not a checkpoint part")),
        Err(e) => return Err(e.to_string()),
    };
    let within = chunk.as_ptr() as usize - rec.as_ptr() as usize;
    let (path, payload) = log
        .locate(pos)
        .ok_or_else(|| format!("entry {pos} is not in the log"))?;
    store
        .add_part(
            generation,
            begin,
            &path,
            payload + within as u64,
            chunk.len() as u64,
        )
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// What the encoder thread hands over: a part, or its end.
enum Piece {
    Part(Vec<u8>),
    Done(Result<Encoded, String>),
}

/// What the encoder thread reports once it handed out every part.
#[derive(Debug, Clone, Copy)]
struct Encoded {
    nodes: u64,
    flushed: u64,
}

/// A checkpoint whose begin record is in the log and whose parts are not
/// all appended yet. The encoder thread hands parts over as it fills them
/// (at most two wait), so memory stays bounded whatever the state's size.
struct InProgress {
    begin: LogPos,
    generation: u16,
    csn: melddb::Vn,
    started: Instant,
    encoder: Option<JoinHandle<()>>,
    parts: Option<Receiver<Piece>>,
    bytes: u64,
    waiters: Vec<SyncSender<Result<CheckpointInfo, String>>>,
}

impl InProgress {
    /// Stops the encoder (it sees the parts channel closed) and waits for it.
    fn abandon(mut self) -> Vec<SyncSender<Result<CheckpointInfo, String>>> {
        self.parts = None;
        if let Some(h) = self.encoder.take() {
            let _ = h.join();
        }
        std::mem::take(&mut self.waiters)
    }
}

/// Whether the database's settings allow checkpoints.
fn checkpoints_supported(settings: &Settings) -> bool {
    !settings.premeld() && !settings.group_meld
}

/// The settings in the first checkpoint part found from the log's start.
fn first_part_settings(log: &FileLog) -> Result<Settings, String> {
    let mut why = "the log holds no checkpoint part".to_string();
    for pos in log.first()..log.tail() {
        let rec = log.read(pos).map_err(|e| e.to_string())?;
        if let Ok(checkpoint::Record::Part { index: 0, .. }) = checkpoint::parse_record(&rec) {
            match checkpoint::peek_settings(&rec) {
                Ok(s) => return Ok(s),
                Err(e) => why = e.to_string(),
            }
        }
    }
    Err(why)
}

/// When and how checkpoints are written.
struct CheckpointPlan {
    every: u64,
    part_bytes: usize,
    trim: bool,
    last: Option<CheckpointInfo>,
    previous_first: Option<LogPos>,
    appended: u64,
    /// Node store generation of the next checkpoint.
    generation: u16,
    /// Node cache budget (0: off).
    cache_bytes: u64,
}

/// With group meld on, an entry that ends the log in the middle of a pair
/// is decided only with its partner: append an empty filler (rejected as
/// malformed by every node) so it is decided now.
fn close_pair(log: &mut FileLog, melder: &mut Melder) -> Result<Vec<Outcome>, DbError> {
    if melder.next_pos() == melder.lcs().pos() + 1 {
        return Ok(Vec::new());
    }
    log.append(&[])
        .map_err(|e| DbError::Stopped(e.to_string()))?;
    Ok(melder.apply(&[]))
}

/// Messages to the background thread.
enum Msg {
    /// [`Database::checkpoint`]: write one now and answer here.
    Checkpoint(SyncSender<Result<CheckpointInfo, String>>),
    /// The encoder put one more part in the parts channel.
    PartReady,
    /// Readers loaded much of the cache budget since the last sweep.
    CachePressure,
    /// A commit saw a cache measurement due.
    Housekeeping,
    /// A handle was dropped unwaited: make everything before this durable.
    Flush(LogPos),
    /// [`Database::close`] or drop: finish up and stop.
    Shutdown,
}

/// What every committing thread and the background thread share: the log
/// and melder behind one lock, and the group-commit state behind another
/// (taken only after `core` when both are needed, never the other way
/// round).
struct Engine {
    core: Mutex<Writer>,
    flush: Mutex<FlushState>,
    /// Wakes the idle sync thread.
    work: Condvar,
    durability: Durability,
    max_in_flight: usize,
    to_bg: SyncSender<Msg>,
}

/// Group commit: what committers wait for, who is parked, and what is
/// durable.
struct FlushState {
    /// Every record before this position is durable and its state
    /// published.
    durable: LogPos,
    /// Committers wait for everything before this to be durable.
    wanted: LogPos,
    /// Parked committers and the position each waits for.
    sleepers: Vec<(LogPos, thread::Thread)>,
    /// The sync thread waits for work.
    idle: bool,
    /// The database is closing: the sync thread stops.
    stop: bool,
    /// Why the database stopped taking commits (an I/O error); everyone
    /// waiting gets it.
    failed: Option<String>,
}

impl FlushState {
    /// Wakes every parked committer (failure or close: they all return).
    fn wake_all(&mut self) {
        for (_, t) in self.sleepers.drain(..) {
            t.unpark();
        }
    }
}

impl Engine {
    fn lock(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn flush_state(&self) -> std::sync::MutexGuard<'_, FlushState> {
        self.flush.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns once every record before `upto` is durable and its state
    /// published: asks the sync thread for it (waking it if idle; a
    /// running one chains the next flush itself), frees `garbage` while
    /// the flush runs, and waits.
    fn make_durable(&self, upto: LogPos, garbage: Option<melddb::Garbage>) -> Result<(), DbError> {
        let mut st = self.flush_state();
        if st.wanted < upto {
            st.wanted = upto;
            if st.idle {
                self.work.notify_one();
            }
        }
        if let Some(g) = garbage {
            drop(st);
            drop(g);
            st = self.flush_state();
        }
        loop {
            if let Some(e) = &st.failed {
                return Err(DbError::Stopped(e.clone()));
            }
            if st.durable >= upto {
                return Ok(());
            }
            if st.stop {
                return Err(DbError::Stopped("the database is closed".into()));
            }
            // Parked until a flush covers `upto`: only the committers a
            // flush answers are woken, not every waiting one.
            let me = thread::current();
            if !st.sleepers.iter().any(|(_, t)| t.id() == me.id()) {
                st.sleepers.push((upto, me));
            }
            drop(st);
            thread::park();
            st = self.flush_state();
        }
    }

    /// One flush: everything appended before it starts is synced (the
    /// lock is not held meanwhile, so other threads keep appending), then
    /// the state there is published. Returns the durable position.
    fn flush_once(&self) -> Result<LogPos, DbError> {
        let handle = {
            let w = self.lock();
            if let Some(e) = &w.failed {
                return Err(DbError::Stopped(e.clone()));
            }
            if w.log.synced() < w.log.tail() {
                match w.log.sync_handle() {
                    Ok(h) => Some(h),
                    Err(e) => {
                        drop(w);
                        return Err(self.fail_now(&format!("cannot flush the log: {e}")));
                    }
                }
            } else {
                None
            }
        };
        let upto = match handle {
            Some((file, upto)) => {
                if let Err(e) = file.sync_data() {
                    return Err(self.fail_now(&format!("fdatasync failed: {e}")));
                }
                upto
            }
            None => 0,
        };
        let mut w = self.lock();
        // A checkpoint may have synced more meanwhile (inline, holding
        // the lock): publish whatever is durable.
        let upto = upto.max(w.log.synced());
        w.synced(upto);
        w.publish_log_stats();
        Ok(w.log.synced())
    }

    /// Stops taking commits after an I/O error: everyone waiting for a
    /// flush and every checkpoint request gets `msg`. The log may be
    /// damaged; the next open verifies the files and recovers.
    fn fail(&self, w: &mut Writer, msg: &str) {
        w.fail(msg);
        let mut st = self.flush_state();
        st.failed.get_or_insert_with(|| msg.to_string());
        st.wake_all();
    }

    fn fail_now(&self, msg: &str) -> DbError {
        let mut w = self.lock();
        self.fail(&mut w, msg);
        DbError::Stopped(msg.to_string())
    }

    /// At close (the background thread has stopped): syncs what is left
    /// and refuses further commits. Handles still held get their outcomes.
    fn close(&self) -> Result<(), DbError> {
        let mut w = self.lock();
        if w.failed.is_some() {
            return Ok(());
        }
        let synced = w.log.sync();
        let tail = w.log.tail();
        if synced.is_ok() {
            w.synced(tail);
        }
        w.failed = Some("the database is closed".into());
        drop(w);
        let mut st = self.flush_state();
        st.stop = true;
        self.work.notify_all();
        match synced {
            Ok(()) => st.durable = st.durable.max(tail),
            Err(ref e) => {
                st.failed.get_or_insert_with(|| e.to_string());
            }
        }
        st.wake_all();
        Ok(synced?)
    }
}

/// The log, the melder and their bookkeeping (behind [`Engine::core`]).
struct Writer {
    log: FileLog,
    melder: Melder,
    shared: Arc<Shared>,
    /// Positions of commits appended and not yet durable, oldest first.
    unflushed: std::collections::VecDeque<LogPos>,
    /// Set after an I/O error (or at close): no more commits.
    failed: Option<String>,
    to_bg: SyncSender<Msg>,
    /// A housekeeping message is on its way to the background thread.
    poked: bool,
    /// The log's tail when its figures were last published in full.
    stats_tail: LogPos,
    plan: CheckpointPlan,
    /// Intention bytes appended since the last checkpoint.
    appended: u64,
    /// Record bytes appended by this process.
    appended_total: u64,
    ckpt: Option<InProgress>,
    /// Who asked for a checkpoint that has not begun yet.
    ckpt_waiters: Vec<SyncSender<Result<CheckpointInfo, String>>>,
    store: Arc<LogStore>,
    /// Memory the tree held at the last measurement, and what was loaded
    /// and appended since (to know when to measure again).
    cache_measured: u64,
    cache_loaded_at: u64,
    cache_appended_at: u64,
    /// Memory filled up with what only memory holds: checkpoint now.
    cache_pressure: bool,
    /// Readers loaded a lot since the last sweep: measure now.
    cache_poked: bool,
}

impl Writer {
    fn new(
        log: FileLog,
        melder: Melder,
        shared: Arc<Shared>,
        store: Arc<LogStore>,
        plan: CheckpointPlan,
        to_bg: SyncSender<Msg>,
    ) -> Writer {
        // What the tree holds at the start (a checkpoint loaded whole can
        // be most of the budget): later estimates add growth to it.
        let cache_measured = if plan.cache_bytes > 0 {
            melder.lcs().approx_bytes()
        } else {
            0
        };
        Writer {
            log,
            melder,
            shared,
            unflushed: Default::default(),
            failed: None,
            to_bg,
            poked: false,
            stats_tail: 0,
            appended: plan.appended,
            appended_total: 0,
            ckpt: None,
            ckpt_waiters: Vec::new(),
            plan,
            store,
            cache_measured,
            cache_loaded_at: 0,
            cache_appended_at: 0,
            cache_pressure: false,
            cache_poked: false,
        }
    }

    /// Appends one intention and melds it. A group-meld pair left open is
    /// closed with a filler, so every entry is decided before the lock is
    /// let go: returns the commit's position and outcome (`None` only if
    /// meld broke that promise).
    fn commit(
        &mut self,
        bytes: &[u8],
        local: melddb::LocalIntention,
    ) -> Result<(LogPos, Option<Outcome>), DbError> {
        let pos = self
            .log
            .append(bytes)
            .map_err(|e| DbError::Stopped(e.to_string()))?;
        self.appended += bytes.len() as u64;
        self.appended_total += bytes.len() as u64;
        let mut outcomes = self.melder.apply_local(bytes, local);
        read_back_ok()?;
        outcomes.extend(close_pair(&mut self.log, &mut self.melder)?);
        self.unflushed.push_back(pos);
        Ok((pos, outcomes.into_iter().find(|o| o.pos() == Some(pos))))
    }

    /// After each commit: appends the checkpoint parts that are ready,
    /// begins a checkpoint when one is due (its begin record goes right
    /// after this commit; it is encoded on another thread), and
    /// asks the background thread to measure the node cache when enough
    /// was added (once until it has looked).
    fn after_commit(&mut self) -> Result<(), DbError> {
        // Parts the encoder handed over go in between commits, as they
        // come: left to the background thread alone, which competes with
        // every committer for the lock, a checkpoint could take much
        // longer under load.
        self.append_parts()?;
        self.maybe_begin_checkpoint()?;
        if !self.poked && self.sweep_wanted(false) && self.to_bg.try_send(Msg::Housekeeping).is_ok()
        {
            self.poked = true;
        }
        Ok(())
    }

    /// Everything before `upto` is durable: publish the state there.
    fn synced(&mut self, upto: LogPos) {
        self.log.mark_synced(upto);
        while self.unflushed.front().is_some_and(|p| *p < upto) {
            self.unflushed.pop_front();
        }
        self.release(upto);
    }

    /// Makes `state` the one new transactions begin on. The durable
    /// position goes out first: whoever sees the new state then sees a
    /// durable position that covers it.
    fn publish(&self, state: MeldState) {
        self.shared.log_stats().synced = self.log.synced();
        self.shared.publish(state);
    }

    /// Publishes the state up to `upto` (exclusive).
    fn release(&mut self, upto: LogPos) {
        let lcs = self.melder.lcs().pos();
        // Before a checkpoint's barrier no state is kept; the checkpoint's
        // own state is durable (it was synced when written). With no commit
        // waiting for a flush, every entry after `upto` is a checkpoint
        // record (no content): publish the latest state, so a quiet
        // database's snapshot is exactly the state a reopen recovers.
        let barrier = self.melder.barrier();
        let at = if self.unflushed.is_empty() {
            lcs
        } else {
            upto.saturating_sub(1).max(barrier)
        };
        if let Some(state) = self
            .melder
            .meld_state(at)
            .or_else(|| self.melder.meld_state(lcs))
            .cloned()
        {
            self.publish(state);
        }
    }

    /// Begins a checkpoint if one was asked for or is due and none is in
    /// progress. A checkpoint that cannot be written (settings) is
    /// reported to who asked and stops the automatic ones.
    fn maybe_begin_checkpoint(&mut self) -> Result<(), DbError> {
        if self.ckpt.is_some() || (self.ckpt_waiters.is_empty() && !self.due_for_checkpoint()) {
            return Ok(());
        }
        match self.begin_checkpoint() {
            Err(DbError::Checkpoint(e)) => {
                let waiters = std::mem::take(&mut self.ckpt_waiters);
                self.give_up_checkpoints(waiters, e);
                Ok(())
            }
            other => other,
        }
    }

    /// A checkpoint could not be written: tell who asked, stop the
    /// automatic ones and say why in the stats.
    fn give_up_checkpoints(
        &mut self,
        waiters: Vec<SyncSender<Result<CheckpointInfo, String>>>,
        e: String,
    ) {
        for w in waiters {
            let _ = w.send(Err(e.clone()));
        }
        self.plan.every = 0;
        self.shared.log_stats().checkpoint_error = Some(e);
    }

    /// Whether enough was written since the last checkpoint (at least
    /// `every` and twice the last one's size), or the node cache needs
    /// one to evict. [`Writer::maybe_begin_checkpoint`] checks that none
    /// is in progress.
    fn due_for_checkpoint(&self) -> bool {
        let last = self.plan.last.as_ref().map_or(0, |c| c.bytes);
        checkpoints_supported(self.melder.settings())
            && ((self.plan.every > 0 && self.appended >= self.plan.every.max(2 * last))
                || self.cache_pressure)
    }

    /// Starts a checkpoint: appends the begin record (the barrier), syncs,
    /// publishes the state there, and encodes that state on another
    /// thread; its parts are appended later, between commits
    /// ([`Writer::append_parts`]). `Err(Checkpoint)` wrote nothing;
    /// `Err(Stopped)` is fatal.
    fn begin_checkpoint(&mut self) -> Result<(), DbError> {
        let settings = *self.melder.settings();
        if !checkpoints_supported(&settings) {
            return Err(DbError::Checkpoint(
                "checkpoints need premeld and group meld off (a database setting)".into(),
            ));
        }
        let started = Instant::now();
        let begin = self.log.tail();
        let record = checkpoint::begin_record(settings.db_id);
        self.log
            .append(&record)
            .map_err(|e| DbError::Stopped(e.to_string()))?;
        self.appended_total += record.len() as u64;
        if let Some(o) = self
            .melder
            .apply(&record)
            .into_iter()
            .find(|o| !o.is_committed())
        {
            return Err(DbError::Stopped(format!(
                "the melder refused a checkpoint record this process wrote: {o:?}"
            )));
        }
        // Everything up to the barrier is durable after this sync, so its
        // state can be published at once (commits appended before it are
        // still answered by the usual flush path, in order). Transactions
        // begun on older states would abort at the barrier.
        self.log.sync()?;
        let Some(state) = self.melder.meld_state(begin).cloned() else {
            return Err(DbError::Stopped(
                "no state at the checkpoint barrier".into(),
            ));
        };
        self.publish(state.clone());
        let since = self.plan.last.as_ref().map_or(0, |c| c.csn);
        let snapshot = state.snapshot().clone();
        let part_bytes = self.plan.part_bytes;
        let tx = self.to_bg.clone();
        let generation = self.plan.generation;
        // Generation numbers wrap; 0 is never used.
        self.plan.generation = self.plan.generation.checked_add(1).unwrap_or(1);
        self.store.remove(generation);
        let (parts_tx, parts_rx) = sync_channel::<Piece>(2);
        let encoder = thread::Builder::new()
            .name("melddb-checkpoint".into())
            .spawn(move || {
                let flushed = checkpoint::unpersisted_nodes(&snapshot, since);
                let r = checkpoint::encode_streaming(
                    &settings,
                    &snapshot,
                    part_bytes,
                    Some(generation),
                    |p| {
                        // The wake-up never blocks: a full queue has
                        // messages waiting that wake the background thread.
                        parts_tx.send(Piece::Part(p)).is_ok()
                            && !matches!(
                                tx.try_send(Msg::PartReady),
                                Err(std::sync::mpsc::TrySendError::Disconnected(_))
                            )
                    },
                );
                // The end goes through the parts channel too, so whoever
                // appends parts (a committer, most often) also completes
                // the checkpoint: a background thread starved of the lock
                // by busy committers would hold it up otherwise.
                let done = r
                    .map(|e| Encoded {
                        nodes: e.nodes,
                        flushed,
                    })
                    .map_err(|e| e.to_string());
                if parts_tx.send(Piece::Done(done)).is_ok() {
                    // Only a wake-up for an idle database; never block on it.
                    let _ = tx.try_send(Msg::PartReady);
                }
            })
            .map_err(|e| DbError::Checkpoint(format!("cannot start the encoder thread: {e}")))?;
        self.appended = 0;
        if std::mem::take(&mut self.cache_pressure) {
            self.shared.cache_stats().pressure_checkpoints += 1;
        }
        self.ckpt = Some(InProgress {
            begin,
            generation,
            csn: self.melder.lcs().csn(),
            started,
            encoder: Some(encoder),
            parts: Some(parts_rx),
            bytes: 0,
            waiters: std::mem::take(&mut self.ckpt_waiters),
        });
        Ok(())
    }

    /// Appends the checkpoint parts the encoder handed over (at most two
    /// wait); once the encoder is done and every part is in, syncs, makes
    /// the checkpoint's nodes readable by the node cache, trims the log
    /// below the previous checkpoint (never below one a stub still reads
    /// from) and answers who asked.
    fn append_parts(&mut self) -> Result<(), DbError> {
        let Some(ck) = self.ckpt.as_mut() else {
            return Ok(());
        };
        let mut appended = false;
        let mut done = None;
        while let Some(piece) = ck.parts.as_ref().and_then(|rx| rx.try_recv().ok()) {
            let p = match piece {
                Piece::Part(p) => p,
                Piece::Done(r) => {
                    done = Some(r);
                    break;
                }
            };
            let pos = self
                .log
                .append(&p)
                .map_err(|e| DbError::Stopped(e.to_string()))?;
            self.appended_total += p.len() as u64;
            ck.bytes += p.len() as u64;
            register_part(&self.log, &self.store, ck.generation, ck.begin, pos, &p)
                .map_err(|e| DbError::Stopped(format!("registering a checkpoint part: {e}")))?;
            if let Some(o) = self
                .melder
                .apply(&p)
                .into_iter()
                .find(|o| !o.is_committed())
            {
                return Err(DbError::Stopped(format!(
                    "the melder refused a checkpoint part this process wrote: {o:?}"
                )));
            }
            read_back_ok()?;
            appended = true;
        }
        let enc = match done {
            None => {
                if appended && self.unflushed.is_empty() {
                    // No commit waits: the new entries are parts only.
                    self.release(self.log.tail());
                }
                return Ok(());
            }
            Some(Err(e)) => {
                // The barrier stays (harmless); the checkpoint is abandoned
                // and automatic ones stop, saying why.
                let waiters = self
                    .ckpt
                    .take()
                    .map(InProgress::abandon)
                    .unwrap_or_default();
                self.give_up_checkpoints(waiters, e);
                return Ok(());
            }
            Some(Ok(enc)) => enc,
        };
        let pos = self.log.tail() - 1;
        self.log.sync()?;
        // Everything appended is durable now: publish the latest state.
        if let Some(state) = self.melder.meld_state(pos).cloned() {
            self.publish(state);
        }
        let Some(ck) = self.ckpt.take() else {
            return Ok(());
        };
        let (generation, begin, csn, started, bytes) =
            (ck.generation, ck.begin, ck.csn, ck.started, ck.bytes);
        let waiters = ck.abandon();
        self.store.complete(generation);
        // Stubs read from this checkpoint from now on (before anything
        // older is trimmed).
        if self.plan.cache_bytes > 0 {
            self.sweep(true)?;
        }
        let mut trimmed = false;
        if self.plan.trim {
            if let Some(prev) = self.plan.previous_first {
                // Never below a checkpoint a stub (a long-held snapshot)
                // still reads from.
                let mut to = prev;
                for (g, b, _) in self.store.checkpoints() {
                    if b < prev && g != generation && self.store.pins(g) > 0 {
                        to = to.min(b);
                    }
                }
                if to < prev {
                    self.shared.cache_stats().trims_held += 1;
                }
                self.log
                    .trim(to)
                    .map_err(|e| DbError::Stopped(format!("trimming the log: {e}")))?;
                for (g, b, _) in self.store.checkpoints() {
                    if b < to {
                        self.store.remove(g);
                    }
                }
                trimmed = true;
            }
        }
        let info = CheckpointInfo {
            first: begin,
            pos,
            csn,
            nodes: enc.nodes,
            bytes,
            flushed_ephemeral: enc.flushed,
            micros: started.elapsed().as_micros() as u64,
        };
        self.plan.previous_first = Some(begin);
        self.plan.last = Some(info.clone());
        {
            let mut st = self.shared.log_stats();
            st.last_checkpoint = Some(info.clone());
            st.checkpoints_written += 1;
            st.trims += u64::from(trimmed);
        }
        for w in waiters {
            let _ = w.send(Ok(info.clone()));
        }
        Ok(())
    }

    /// Whether the node cache's memory should be measured now.
    fn sweep_wanted(&self, after_checkpoint: bool) -> bool {
        let budget = self.plan.cache_bytes;
        if budget == 0 {
            return false;
        }
        let loaded = self.store.stats().loaded_bytes;
        // Intentions take about four times their encoded size as nodes.
        let grown = loaded.saturating_sub(self.cache_loaded_at)
            + 4 * (self.appended_total - self.cache_appended_at);
        // Measure again once the tree may have outgrown the budget, but
        // not at every step while it holds more than the budget that
        // cannot leave yet (not in a checkpoint): a measurement walks all
        // of memory. After a checkpoint, measure unless the estimate is
        // far below the budget (then nothing needs evicting).
        let estimate = self.cache_measured + grown;
        self.cache_poked
            || if after_checkpoint {
                estimate >= budget / 2
            } else {
                estimate >= budget && grown >= budget / 4
            }
    }

    /// Node cache: measures the tree's memory when enough was loaded or
    /// appended since the last measurement, and sweeps when it is over the
    /// budget. `after_checkpoint`: a checkpoint just completed, so stubs
    /// must move to it (a sweep without eviction if under budget).
    fn sweep(&mut self, after_checkpoint: bool) -> Result<(), DbError> {
        let budget = self.plan.cache_bytes;
        if budget == 0 {
            return Ok(());
        }
        let loaded = self.store.stats().loaded_bytes;
        let measure = self.sweep_wanted(after_checkpoint);
        if !measure && !after_checkpoint {
            return Ok(());
        }
        // The complete checkpoints, looked up once rather than under the
        // store's lock at every node the sweep visits.
        let complete: Vec<u16> = self
            .store
            .checkpoints()
            .into_iter()
            .filter_map(|(g, _, done)| done.then_some(g))
            .collect();
        let persisted = |g: u16| complete.contains(&g);
        if !measure {
            // Stubs (if any) move to the new checkpoint, so older ones can
            // be trimmed; the growth counted so far keeps counting.
            self.melder.promote(&persisted);
            return Ok(());
        }
        self.cache_poked = false;
        let mut measured = self.melder.lcs().approx_bytes();
        let before = measured;
        let mut st = CacheStats::default();
        if measured > budget {
            let dyn_store: Arc<dyn melddb::NodeStore> = self.store.clone();
            // CLOCK: the first pass spares what was used since the last
            // one (and clears its mark); if that is still too much, what
            // was not used again meanwhile goes in a second pass.
            for _ in 0..2 {
                let ev = self.melder.evict(&dyn_store, &persisted);
                read_back_ok()?;
                st.sweeps += 1;
                st.stubbed += ev.stubbed;
                st.unloaded += ev.unloaded;
                measured = self.melder.lcs().approx_bytes();
                if measured <= budget {
                    break;
                }
            }
            // Readers move to the swept tree (same state, same position),
            // so the old one can be freed.
            let at = self
                .shared
                .latest
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .snapshot()
                .pos();
            if let Some(state) = self.melder.meld_state(at).cloned() {
                self.publish(state);
            }
            // What is left is mostly what only memory holds: a checkpoint
            // makes it evictable.
            if measured > budget / 2 && self.ckpt.is_none() && !after_checkpoint {
                self.cache_pressure = true;
            }
        } else if after_checkpoint {
            self.melder.promote(&persisted);
        }
        self.cache_measured = measured;
        self.cache_loaded_at = loaded;
        self.store.arm();
        self.cache_appended_at = self.appended_total;
        let mut c = self.shared.cache_stats();
        c.in_memory_bytes = measured;
        c.peak_bytes = c.peak_bytes.max(before);
        c.sweeps += st.sweeps;
        c.stubbed += st.stubbed;
        c.unloaded += st.unloaded;
        Ok(())
    }

    /// Publishes the log's extent for [`Database::log_stats`].
    fn publish_log_stats(&mut self) {
        let mut st = self.shared.log_stats();
        st.synced = self.log.synced();
        // Called after every flush and background step: skip the
        // per-segment byte sum when nothing was appended or trimmed.
        if self.stats_tail == self.log.tail() && st.first == self.log.first() {
            return;
        }
        self.stats_tail = self.log.tail();
        st.first = self.log.first();
        st.tail = self.log.tail();
        st.bytes = self.log.bytes();
        st.bytes_appended = self.appended_total;
    }

    /// Refuses further commits and answers every checkpoint request with
    /// `msg` (see [`Engine::fail`]).
    fn fail(&mut self, msg: &str) {
        self.failed.get_or_insert_with(|| msg.to_string());
        let waiting = self.ckpt.take().map(|c| c.waiters).unwrap_or_default();
        for reply in waiting.into_iter().chain(self.ckpt_waiters.drain(..)) {
            let _ = reply.send(Err(msg.to_string()));
        }
    }
}

/// The sync thread: flushes whatever committers wait for, one flush
/// right after the other while they keep asking (no wake-up between two
/// flushes), then publishes the state and wakes them.
fn sync_loop(engine: &Engine) {
    let mut st = engine.flush_state();
    loop {
        while st.wanted <= st.durable && !st.stop && st.failed.is_none() {
            st.idle = true;
            st = engine.work.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        st.idle = false;
        if st.stop || st.failed.is_some() {
            return;
        }
        drop(st);
        let flushed = engine.flush_once();
        st = engine.flush_state();
        match flushed {
            Ok(durable) => st.durable = st.durable.max(durable),
            Err(e) => {
                st.failed.get_or_insert_with(|| e.to_string());
                st.wake_all();
            }
        }
        let durable = st.durable;
        let mut woken = Vec::new();
        st.sleepers.retain(|(upto, t)| {
            let done = *upto <= durable;
            if done {
                woken.push(t.clone());
            }
            !done
        });
        drop(st);
        for t in woken {
            t.unpark();
        }
        st = engine.flush_state();
    }
}

/// How often the background thread checks the node cache's memory.
const CACHE_TICK: Duration = Duration::from_millis(20);

/// The background thread: begins checkpoints and appends their parts as
/// the encoder hands them over, measures and sweeps the node cache,
/// answers [`Database::checkpoint`], and flushes commits whose handles
/// were dropped. Commits never wait for it.
fn background_loop(engine: &Engine, rx: Receiver<Msg>) {
    let cache = engine.lock().plan.cache_bytes > 0;
    loop {
        // Checkpoint parts announce themselves, so waiting for the next
        // message is enough; with a node cache, wake up now and then
        // anyway: readers load nodes while no commit comes.
        let first = if cache {
            match rx.recv_timeout(CACHE_TICK) {
                Ok(m) => Some(m),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => break,
            }
        };
        let mut asked = Vec::new();
        let mut poked = false;
        let mut flush_to: LogPos = 0;
        let mut shutting_down = false;
        let mut next = first;
        while let Some(m) = next.take() {
            match m {
                Msg::Checkpoint(reply) => asked.push(reply),
                Msg::PartReady | Msg::Housekeeping => {}
                Msg::CachePressure => poked = true,
                Msg::Flush(upto) => flush_to = flush_to.max(upto),
                Msg::Shutdown => shutting_down = true,
            }
            next = rx.try_recv().ok();
        }
        let garbage = {
            let mut w = engine.lock();
            if let Some(e) = w.failed.clone() {
                for reply in asked {
                    let _ = reply.send(Err(e.clone()));
                }
                if shutting_down {
                    break;
                }
                continue;
            }
            w.poked = false;
            w.cache_poked |= poked;
            // A checkpoint already in progress holds an older state: who
            // asks now gets the next one.
            w.ckpt_waiters.append(&mut asked);
            let mut step = w.maybe_begin_checkpoint();
            if step.is_ok() {
                step = w.append_parts();
            }
            // One that just completed may have left askers for the next.
            if step.is_ok() {
                step = w.maybe_begin_checkpoint();
            }
            if step.is_ok() {
                step = w.sweep(false);
            }
            w.publish_log_stats();
            if let Err(e) = step {
                engine.fail(&mut w, &e.to_string());
            }
            w.melder.take_garbage()
        };
        drop(garbage);
        if flush_to > 0 && engine.durability == Durability::Sync {
            // An error here reached everyone through the flush state.
            let _ = engine.make_durable(flush_to, None);
        }
        if shutting_down {
            break;
        }
    }
    let mut w = engine.lock();
    // A checkpoint whose encoder is done is finished (its last parts and
    // its end wait in the channel: appending them is quick and saves
    // redoing the work after reopening); one still being encoded is
    // abandoned (its begin record is a harmless barrier).
    if w.failed.is_none()
        && w.ckpt
            .as_ref()
            .and_then(|c| c.encoder.as_ref())
            .is_some_and(JoinHandle::is_finished)
    {
        let _ = w.append_parts();
    }
    if let Some(ck) = w.ckpt.take() {
        drop(w);
        // Closing the parts channel stops a blocked encoder.
        let (parts, encoder) = (ck.parts, ck.encoder);
        drop(parts);
        for reply in ck.waiters {
            let _ = reply.send(Err(
                "the database closed before the checkpoint completed".into()
            ));
        }
        if let Some(h) = encoder {
            let _ = h.join();
        }
    }
}
