//! The embedded database: `Database::open(dir)`.
//!
//! A durable [`FileLog`] in `dir`, the melder, and one writer thread that
//! owns both. Any number of threads run transactions on snapshots and hand
//! their intentions to the writer through a bounded queue (admission
//! control: when `max_in_flight` commits wait, the next `commit` blocks).
//! The writer takes everything queued (up to a batch), appends it, syncs
//! the log once for the whole batch (group commit), melds the new entries
//! and only then answers each commit with its outcome and publishes the
//! new state. Recovery on open replays the log from the genesis record.

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

use crate::filelog::{FileLog, FileLogError, OpenReport};
use crate::nodestore::{LogStore, StoreStats};

/// Default of [`Options::checkpoint_part_bytes`]: 1 MiB, so appending one
/// part between two commit batches holds commits up only briefly.
pub const DEFAULT_CHECKPOINT_PART_BYTES: usize = checkpoint::DEFAULT_PART_BYTES;

/// Default of [`Options::checkpoint_bytes`]: 64 MiB of log between checkpoints.
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 64 << 20;

/// Default of [`Options::cache_bytes`]: 1 GiB of tree in memory.
pub const DEFAULT_CACHE_BYTES: u64 = 1 << 30;

/// When a commit is acknowledged relative to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// After the batch holding it was written and `fdatasync`ed (default):
    /// an acknowledged commit survives a crash or power loss.
    Sync,
    /// After the batch was handed to the OS: survives a process crash, not
    /// a power loss. Faster on slow disks.
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
    /// Commits that may wait for the writer before `commit` blocks.
    pub max_in_flight: usize,
    /// Largest number of intentions appended and synced together.
    pub max_batch: usize,
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
    /// default 1 MiB). The writer appends about one part between two
    /// commit batches.
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
            max_batch: 256,
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
    /// The writer thread stopped (after an I/O error it reported, or at
    /// shutdown); reopen the database.
    #[error("the database writer stopped: {0}")]
    Stopped(String),
}

struct Request {
    bytes: Vec<u8>,
    /// The same intention as tree nodes: the writer melds it without
    /// decoding the bytes (identical result, much less work).
    local: Option<melddb::LocalIntention>,
    reply: SyncSender<Result<Outcome, String>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Request({} bytes)", self.bytes.len())
    }
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
    /// The writer's published log figures.
    fn log_stats(&self) -> std::sync::MutexGuard<'_, LogStats> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
    /// The writer's published cache figures.
    fn cache_stats(&self) -> std::sync::MutexGuard<'_, CacheStats> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The node cache as the writer last measured it (see
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

/// The log as the writer last saw it (see [`Database::log_stats`]).
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
    queue: Option<SyncSender<Msg>>,
    writer: Option<JoinHandle<()>>,
    max_attempts: u32,
    trial_meld: bool,
    recovery: Recovery,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("dir", &self.shared.dir)
            .finish()
    }
}

/// An intention handed to the writer; [`CommitHandle::wait`] gives its outcome.
#[derive(Debug)]
pub struct CommitHandle {
    rx: Option<Receiver<Result<Outcome, String>>>,
}

impl CommitHandle {
    /// Blocks until the outcome is known.
    pub fn wait(self) -> Result<Outcome, DbError> {
        match self.rx {
            None => Ok(Outcome::ReadOnly),
            Some(rx) => match rx.recv() {
                Ok(Ok(o)) => Ok(o),
                Ok(Err(e)) => Err(DbError::Stopped(e)),
                Err(_) => Err(DbError::Stopped("writer exited before answering".into())),
            },
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
        if opts.max_in_flight == 0 || opts.max_batch == 0 {
            return Err(DbError::Options(
                "max_in_flight and max_batch must be at least 1".into(),
            ));
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
        let (tx, rx) = sync_channel::<Msg>(opts.max_in_flight);
        let w_shared = shared.clone();
        let durability = opts.durability;
        let max_batch = opts.max_batch;
        let to_writer = tx.clone();
        if plan.cache_bytes > 0 {
            // Readers that load a quarter of the budget wake the writer
            // to sweep (it may be idle: no commit to wake it).
            let wake = tx.clone();
            store.on_pressure(plan.cache_bytes / 4, move || {
                let _ = wake.try_send(Msg::CachePressure);
            });
        }
        let w_store = store.clone();
        let writer = thread::Builder::new()
            .name("melddb-writer".into())
            .spawn(move || {
                writer_loop(
                    log,
                    melder,
                    rx,
                    to_writer,
                    w_shared,
                    w_store,
                    WriterSetup {
                        durability,
                        max_batch,
                        plan,
                    },
                )
            })
            .map_err(|e| DbError::Stopped(format!("cannot start the writer thread: {e}")))?;
        Ok(Database {
            shared,
            queue: Some(tx),
            writer: Some(writer),
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

    /// The node cache's figures, as of the writer's last measurement.
    pub fn cache_stats(&self) -> CacheStats {
        let mut c = self.shared.cache_stats().clone();
        c.store = self.shared.store.stats();
        c
    }

    /// Begins a transaction on the latest committed state.
    pub fn begin(&self, isolation: Isolation) -> Transaction {
        Transaction::begin(&self.snapshot(), isolation)
    }

    /// Finishes `tx` and hands its intention to the writer without waiting
    /// (blocks only while `max_in_flight` commits are already queued).
    pub fn submit(&self, tx: Transaction) -> Result<CommitHandle, DbError> {
        let Some((bytes, local)) = tx.finish_local()? else {
            return Ok(CommitHandle { rx: None });
        };
        if self.trial_meld {
            let mut stats = melddb::MeldStats::default();
            let latest = self.latest();
            let _ = melddb::take_store_error();
            let trial = trial_meld(&self.shared.settings, &local, &latest, &mut stats);
            // A failed read back makes the trial say nothing: let the
            // writer decide.
            let unsure = melddb::take_store_error().is_some();
            if let (Err(reason), false) = (trial, unsure) {
                let (reply, rx) = sync_channel(1);
                let _ = reply.send(Ok(Outcome::Rejected { reason }));
                return Ok(CommitHandle { rx: Some(rx) });
            }
        }
        let (reply, rx) = sync_channel(1);
        let q = self
            .queue
            .as_ref()
            .ok_or_else(|| DbError::Stopped("database is closed".into()))?;
        q.send(Msg::Commit(Request {
            bytes,
            local: Some(local),
            reply,
        }))
        .map_err(|_| DbError::Stopped("the writer thread has stopped".into()))?;
        Ok(CommitHandle { rx: Some(rx) })
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
        let (reply, rx) = sync_channel(1);
        let q = self
            .queue
            .as_ref()
            .ok_or_else(|| DbError::Stopped("database is closed".into()))?;
        q.send(Msg::Checkpoint(reply))
            .map_err(|_| DbError::Stopped("the writer thread has stopped".into()))?;
        match rx.recv() {
            Ok(Ok(info)) => Ok(info),
            Ok(Err(e)) => Err(DbError::Checkpoint(e)),
            Err(_) => Err(DbError::Stopped("writer exited before answering".into())),
        }
    }

    /// The log's extent, the latest checkpoint and garbage collection
    /// counters, as of the writer's last step.
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

    /// Stops the writer after it answered every queued commit.
    pub fn close(mut self) -> Result<(), DbError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), DbError> {
        if let Some(q) = self.queue.take() {
            // The sync thread holds a sender too, so say it explicitly.
            let _ = q.send(Msg::Shutdown);
        }
        if let Some(w) = self.writer.take() {
            w.join()
                .map_err(|_| DbError::Stopped("the writer thread panicked".into()))?;
        }
        Ok(())
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
/// meld: its decisions are then meaningless, so the writer stops (a
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

/// What the encoder thread reports once it handed out every part.
#[derive(Debug, Default, Clone, Copy)]
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
    parts: Option<Receiver<Vec<u8>>>,
    /// Set when the encoder finished (every part was sent).
    encoded: Option<Encoded>,
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

/// When and how the writer checkpoints.
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

/// Messages to the writer thread: commits from clients, flush results
/// from the sync thread, and the shutdown request.
enum Msg {
    Commit(Request),
    /// Every record before this position is durable (or the flush failed).
    Synced(LogPos, std::io::Result<()>),
    Checkpoint(SyncSender<Result<CheckpointInfo, String>>),
    /// The encoder put one more part in the parts channel.
    PartReady,
    /// Readers loaded much of the cache budget since the last sweep.
    CachePressure,
    Encoded(Result<Encoded, String>),
    Shutdown,
}

/// A thread that flushes segment files, so the writer keeps appending and
/// melding the next commits while the disk flushes the previous ones
/// (pipelined group commit). The writer posts the position it wants
/// durable whenever it likes, also while a flush runs; the thread starts
/// the next flush as soon as one ends if more was asked for, without a
/// round trip through the writer. It reports back through the writer's
/// queue.
struct Syncer {
    want: Arc<(Mutex<SyncWant>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

/// What the writer asked the sync thread to make durable.
struct SyncWant {
    /// A handle on the segment holding the records before `upto` that are
    /// not durable yet (the file log syncs a segment before it starts the
    /// next one, so one segment is enough).
    file: Option<std::fs::File>,
    upto: LogPos,
    stop: bool,
}

impl Syncer {
    fn start(report: SyncSender<Msg>) -> std::io::Result<Syncer> {
        let want = Arc::new((
            Mutex::new(SyncWant {
                file: None,
                upto: 0,
                stop: false,
            }),
            Condvar::new(),
        ));
        let theirs = want.clone();
        let handle = thread::Builder::new()
            .name("melddb-sync".into())
            .spawn(move || {
                let (lock, cv) = &*theirs;
                let mut done: LogPos = 0;
                loop {
                    let (file, upto) = {
                        let mut w = lock.lock().unwrap_or_else(PoisonError::into_inner);
                        while w.upto <= done && !w.stop {
                            w = cv.wait(w).unwrap_or_else(PoisonError::into_inner);
                        }
                        if w.upto <= done {
                            return;
                        }
                        (w.file.take(), w.upto)
                    };
                    let r = file.map_or(Ok(()), |f| f.sync_data());
                    done = upto;
                    if report.send(Msg::Synced(upto, r)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Syncer {
            want,
            handle: Some(handle),
        })
    }

    /// Asks for every record before `upto` (all in `file`) to be made
    /// durable.
    fn post(&self, file: std::fs::File, upto: LogPos) {
        let (lock, cv) = &*self.want;
        let mut w = lock.lock().unwrap_or_else(PoisonError::into_inner);
        w.file = Some(file);
        w.upto = w.upto.max(upto);
        cv.notify_one();
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        {
            let (lock, cv) = &*self.want;
            lock.lock().unwrap_or_else(PoisonError::into_inner).stop = true;
            cv.notify_one();
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The writer's bookkeeping between messages.
struct Writer {
    log: FileLog,
    melder: Melder,
    shared: Arc<Shared>,
    durability: Durability,
    /// Outcomes decided but not yet answered, by position.
    outcomes: std::collections::BTreeMap<LogPos, Outcome>,
    /// Appended and melded, not covered by a flush yet.
    unsynced: Vec<(Request, LogPos)>,
    /// Appended and melded, covered by a flush asked for (in progress or
    /// next in line).
    syncing: Vec<(Request, LogPos)>,
    /// The sync thread was asked to make everything before this durable.
    requested: LogPos,
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
    /// Appends `batch` to the log without melding it yet: the flush of
    /// these records can then start before meld runs (see
    /// [`Writer::meld`]), so the disk and the CPU work at once.
    fn write(&mut self, batch: Vec<Request>) -> Result<Vec<(Request, LogPos)>, DbError> {
        let mut written = Vec::with_capacity(batch.len());
        for r in batch {
            let pos = self
                .log
                .append(&r.bytes)
                .map_err(|e| DbError::Stopped(e.to_string()))?;
            self.appended += r.bytes.len() as u64;
            self.appended_total += r.bytes.len() as u64;
            written.push((r, pos));
        }
        Ok(written)
    }

    /// Melds what [`Writer::write`] appended (closing a group-meld pair
    /// with a filler) and files each request with the flush that covers
    /// it: the one in progress if it started before this meld, otherwise
    /// the next.
    fn meld(&mut self, written: Vec<(Request, LogPos)>) -> Result<(), DbError> {
        for (mut r, pos) in written {
            let outcomes = match r.local.take() {
                Some(l) => self.melder.apply_local(&r.bytes, l),
                None => self.melder.apply(&r.bytes),
            };
            read_back_ok()?;
            for o in outcomes {
                if let Some(p) = o.pos() {
                    self.outcomes.insert(p, o);
                }
            }
            if pos < self.requested {
                self.syncing.push((r, pos));
            } else {
                self.unsynced.push((r, pos));
            }
        }
        for o in close_pair(&mut self.log, &mut self.melder)? {
            if let Some(p) = o.pos() {
                self.outcomes.insert(p, o);
            }
        }
        Ok(())
    }

    /// Starts the flush of records appended but not melded yet, so the
    /// disk works while meld runs. Only with a sync thread: its answer is
    /// read after this batch is melded, so every request it covers has
    /// its outcome by then. Not with group meld: a batch ends with the
    /// filler that closes its last pair, appended by meld, and a flush
    /// that stopped inside a pair would have no state of its own to
    /// publish.
    fn flush_early(&mut self, syncer: Option<&Syncer>) -> Result<(), DbError> {
        match syncer {
            Some(s)
                if self.durability == Durability::Sync && !self.melder.settings().group_meld =>
            {
                self.start_sync(s)
            }
            _ => Ok(()),
        }
    }

    /// Asks the sync thread for everything appended so far; what is
    /// unsynced now is answered when it reports back.
    fn start_sync(&mut self, s: &Syncer) -> Result<(), DbError> {
        let (f, upto) = self.log.sync_handle()?;
        if upto <= self.requested {
            return Ok(());
        }
        s.post(f, upto);
        self.requested = upto;
        self.syncing.append(&mut self.unsynced);
        Ok(())
    }

    /// Whether the sync thread is flushing (or has a flush in line).
    fn flush_in_flight(&self) -> bool {
        self.requested > self.log.synced()
    }

    /// The sync thread made everything before `upto` durable: answer
    /// what that covers. Returns how many commits that answered.
    fn synced(&mut self, upto: LogPos) -> usize {
        self.log.mark_synced(upto);
        let n = self.syncing.partition_point(|(_, p)| *p < upto);
        let rest = self.syncing.split_off(n);
        let done = std::mem::replace(&mut self.syncing, rest);
        self.release(upto, done);
        n
    }

    /// Makes `state` the one new transactions begin on. The durable
    /// position goes out first: whoever sees the new state then sees a
    /// durable position that covers it.
    fn publish(&self, state: MeldState) {
        self.shared.log_stats().synced = self.log.synced();
        self.shared.publish(state);
    }

    /// Publishes the state up to `upto` (exclusive) and answers `done`.
    fn release(&mut self, upto: LogPos, done: Vec<(Request, LogPos)>) {
        let lcs = self.melder.lcs().pos();
        // Before a checkpoint's barrier no state is kept; the checkpoint's
        // own state is durable (it was synced when written). With no commit
        // waiting for a flush, every entry after `upto` is a checkpoint
        // record (no content): publish the latest state, so a quiet
        // database's snapshot is exactly the state a reopen recovers.
        let barrier = self.melder.barrier();
        let quiet = self.unsynced.is_empty() && self.syncing.is_empty();
        let at = if quiet {
            lcs
        } else {
            upto.saturating_sub(1).max(barrier)
        };
        let Some(state) = self
            .melder
            .meld_state(at)
            .or_else(|| self.melder.meld_state(lcs))
            .cloned()
        else {
            return;
        };
        self.publish(state);
        for (req, pos) in done {
            let o = self
                .outcomes
                .remove(&pos)
                .ok_or_else(|| format!("entry {pos} was appended but not decided"));
            let _ = req.reply.send(o);
        }
        // Fillers have outcomes nobody waits for.
        while self
            .outcomes
            .first_key_value()
            .is_some_and(|(p, _)| *p < upto)
        {
            self.outcomes.pop_first();
        }
    }

    /// Starts a flush of everything unsynced (or releases it at once
    /// without `Durability::Sync`).
    fn flush(&mut self, syncer: Option<&Syncer>) -> Result<(), DbError> {
        if self.unsynced.is_empty() {
            return Ok(());
        }
        let tail = self.log.tail();
        match (self.durability, syncer) {
            (Durability::Buffered, _) => {
                let batch = std::mem::take(&mut self.unsynced);
                self.release(tail, batch)
            }
            (Durability::Sync, Some(s)) => self.start_sync(s)?,
            (Durability::Sync, None) => {
                let batch = std::mem::take(&mut self.unsynced);
                self.log.sync()?;
                self.release(tail, batch);
            }
        }
        Ok(())
    }

    /// Begins a checkpoint if one was asked for or is due and none is in
    /// progress. A checkpoint that cannot be written (settings) is
    /// reported to who asked and stops the automatic ones.
    fn maybe_begin_checkpoint(&mut self, to_writer: &SyncSender<Msg>) -> Result<(), DbError> {
        if self.ckpt.is_some() || (self.ckpt_waiters.is_empty() && !self.due_for_checkpoint()) {
            return Ok(());
        }
        match self.begin_checkpoint(to_writer) {
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

    fn due_for_checkpoint(&self) -> bool {
        let last = self.plan.last.as_ref().map_or(0, |c| c.bytes);
        self.ckpt.is_none()
            && checkpoints_supported(self.melder.settings())
            && ((self.plan.every > 0 && self.appended >= self.plan.every.max(2 * last))
                || self.cache_pressure)
    }

    /// Starts a checkpoint: appends the begin record (the barrier), syncs,
    /// publishes the state there, and encodes that state on another
    /// thread; its parts are appended later, between commits
    /// ([`Writer::append_parts`]). `Err(Checkpoint)` wrote nothing;
    /// `Err(Stopped)` is fatal.
    fn begin_checkpoint(&mut self, to_writer: &SyncSender<Msg>) -> Result<(), DbError> {
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
        let tx = to_writer.clone();
        let generation = self.plan.generation;
        // Generation numbers wrap; 0 is never used.
        self.plan.generation = self.plan.generation.checked_add(1).unwrap_or(1);
        self.store.remove(generation);
        let (parts_tx, parts_rx) = sync_channel::<Vec<u8>>(2);
        let encoder = thread::Builder::new()
            .name("melddb-checkpoint".into())
            .spawn(move || {
                let flushed = checkpoint::unpersisted_nodes(&snapshot, since);
                let r = checkpoint::encode_streaming(
                    &settings,
                    &snapshot,
                    part_bytes,
                    Some(generation),
                    |p| parts_tx.send(p).is_ok() && tx.send(Msg::PartReady).is_ok(),
                );
                drop(parts_tx);
                let _ = tx.send(Msg::Encoded(
                    r.map(|e| Encoded {
                        nodes: e.nodes,
                        flushed,
                    })
                    .map_err(|e| e.to_string()),
                ));
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
            encoded: None,
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
        while let Some(p) = ck.parts.as_ref().and_then(|rx| rx.try_recv().ok()) {
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
        if ck.encoded.is_none() {
            if appended && self.unsynced.is_empty() && self.syncing.is_empty() {
                // No commit waits: the new entries are parts only.
                self.release(self.log.tail(), Vec::new());
            }
            return Ok(());
        }
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
        let enc = ck.encoded.unwrap_or_default();
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

    /// The encoder thread finished (every part it made is in the parts
    /// channel or already appended).
    fn encoded(&mut self, result: Result<Encoded, String>) {
        let Some(ck) = self.ckpt.as_mut() else {
            return;
        };
        if let Some(h) = ck.encoder.take() {
            let _ = h.join();
        }
        match result {
            Ok(enc) => ck.encoded = Some(enc),
            Err(e) => {
                // The barrier stays (harmless); the checkpoint is abandoned
                // and automatic ones stop, saying why.
                let waiters = self
                    .ckpt
                    .take()
                    .map(InProgress::abandon)
                    .unwrap_or_default();
                self.give_up_checkpoints(waiters, e);
            }
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
        // Intentions take about four times their encoded size as nodes.
        let grown =
            (loaded - self.cache_loaded_at) + 4 * (self.appended_total - self.cache_appended_at);
        // Measure again once the tree may have outgrown the budget, but
        // not at every step while it holds more than the budget that
        // cannot leave yet (not in a checkpoint): a measurement walks all
        // of memory. After a checkpoint, measure unless the estimate is
        // far below the budget (then nothing needs evicting).
        let estimate = self.cache_measured + grown;
        let measure = self.cache_poked
            || if after_checkpoint {
                estimate >= budget / 2
            } else {
                estimate >= budget && grown >= budget / 4
            };
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

    fn publish_log_stats(&self) {
        let mut st = self.shared.log_stats();
        st.synced = self.log.synced();
        // Called after every writer step: skip the per-segment byte sum
        // when nothing was appended or trimmed.
        if st.tail == self.log.tail() && st.first == self.log.first() {
            return;
        }
        st.first = self.log.first();
        st.tail = self.log.tail();
        st.bytes = self.log.bytes();
        st.bytes_appended = self.appended_total;
    }

    fn fail(&mut self, msg: &str, rx: &Receiver<Msg>) {
        let mut all: Vec<Request> = self.unsynced.drain(..).map(|(r, _)| r).collect();
        all.extend(self.syncing.drain(..).map(|(r, _)| r));
        for r in all {
            let _ = r.reply.send(Err(msg.to_string()));
        }
        while let Ok(m) = rx.try_recv() {
            match m {
                Msg::Commit(r) => {
                    let _ = r.reply.send(Err(msg.to_string()));
                }
                Msg::Checkpoint(reply) => {
                    let _ = reply.send(Err(msg.to_string()));
                }
                _ => {}
            }
        }
        let waiting = self.ckpt.take().map(|c| c.waiters).unwrap_or_default();
        for reply in waiting.into_iter().chain(self.ckpt_waiters.drain(..)) {
            let _ = reply.send(Err(msg.to_string()));
        }
    }
}

/// How often an idle writer checks the node cache's memory.
const CACHE_TICK: Duration = Duration::from_millis(20);

/// Retired roots and intentions the writer frees per step while idle.
const GARBAGE_STEP: usize = 8;

/// Frees what meld retired a step at a time until it is gone (`None`) or a
/// message arrives (returned).
fn free_while_idle(melder: &mut Melder, rx: &Receiver<Msg>) -> Option<Msg> {
    while melder.free_garbage(GARBAGE_STEP) {
        if let Ok(m) = rx.try_recv() {
            return Some(m);
        }
    }
    None
}

/// How the writer thread runs (from [`Options`]).
struct WriterSetup {
    durability: Durability,
    max_batch: usize,
    plan: CheckpointPlan,
}

/// Whether `waiting` commits should be flushed now (adaptive group
/// commit): at shutdown; while a flush runs (the sync thread then starts
/// the next one the moment it ends, with everything appended by then);
/// once as many wait as the last flush answered (those clients usually
/// commit again at once); or when the gathering deadline has passed.
fn flush_due(
    w: &Writer,
    waiting: usize,
    expect: usize,
    deadline: Option<Instant>,
    shutting_down: bool,
) -> bool {
    shutting_down
        || w.flush_in_flight()
        || waiting >= expect
        || deadline.is_some_and(|d| Instant::now() >= d)
}

fn writer_loop(
    log: FileLog,
    mut melder: Melder,
    rx: Receiver<Msg>,
    report: SyncSender<Msg>,
    shared: Arc<Shared>,
    store: Arc<LogStore>,
    setup: WriterSetup,
) {
    let WriterSetup {
        durability,
        max_batch,
        plan,
    } = setup;
    // The checkpoint encoder reports through the writer's own queue.
    let to_self = report.clone();
    let syncer = if durability == Durability::Sync {
        Syncer::start(report).ok()
    } else {
        drop(report);
        None
    };
    melder.set_deferred_reclaim(true);
    // What the tree holds at the start (a checkpoint loaded whole can be
    // most of the budget): later estimates add growth to it.
    let cache_measured = if plan.cache_bytes > 0 {
        melder.lcs().approx_bytes()
    } else {
        0
    };
    let mut w = Writer {
        log,
        melder,
        shared,
        durability,
        outcomes: Default::default(),
        unsynced: Vec::new(),
        syncing: Vec::new(),
        requested: 0,
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
    };
    let mut shutting_down = false;
    // Adaptive group commit: clients just answered usually commit again
    // within microseconds, so the next flush waits briefly (at most
    // GATHER) until as many commits are queued as were just answered.
    const GATHER: Duration = Duration::from_micros(200);
    let mut expect = 0usize;
    let mut deadline: Option<Instant> = None;
    loop {
        if shutting_down && w.syncing.is_empty() && w.unsynced.is_empty() {
            break;
        }
        // Checkpoint parts announce themselves (PartReady), so waiting for
        // the next message is enough; with a node cache, wake up now and
        // then anyway: readers load nodes while no commit comes.
        let tick = (w.plan.cache_bytes > 0).then(|| Instant::now() + CACHE_TICK);
        // Free what meld replaced while no message waits; one that
        // arrives meanwhile is handled first.
        let first = match free_while_idle(&mut w.melder, &rx) {
            Some(m) => Some(m),
            None => match deadline.or(tick) {
                None => match rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => break,
                },
                Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                    Ok(m) => Some(m),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                },
            },
        };
        let mut batch = Vec::new();
        let mut asked: Vec<SyncSender<Result<CheckpointInfo, String>>> = Vec::new();
        let mut next = first;
        while let Some(m) = next.take() {
            match m {
                Msg::Commit(r) => batch.push(r),
                Msg::Synced(upto, Ok(())) => expect = w.synced(upto),
                Msg::Synced(_, Err(e)) => {
                    w.fail(&format!("fdatasync failed: {e}"), &rx);
                    return;
                }
                Msg::Checkpoint(reply) => asked.push(reply),
                Msg::PartReady => {}
                Msg::CachePressure => w.cache_poked = true,
                Msg::Encoded(r) => w.encoded(r),
                Msg::Shutdown => shutting_down = true,
            }
            if batch.len() < max_batch {
                next = rx.try_recv().ok();
            }
        }
        let mut step = w.write(batch).and_then(|written| {
            // Start the flush before melding when it is due anyway: meld
            // and the disk then overlap instead of taking turns.
            let waiting = written.len() + w.unsynced.len();
            if !written.is_empty() && flush_due(&w, waiting, expect, deadline, shutting_down) {
                deadline = None;
                w.flush_early(syncer.as_ref())?;
            }
            w.meld(written)
        });
        if step.is_ok() {
            // A checkpoint already in progress holds an older state: who
            // asks now gets the next one.
            w.ckpt_waiters.append(&mut asked);
            step = w.maybe_begin_checkpoint(&to_self);
            if step.is_ok() {
                step = w.append_parts();
            }
            // One that just completed may have left askers for the next.
            if step.is_ok() {
                step = w.maybe_begin_checkpoint(&to_self);
            }
            if step.is_ok() {
                step = w.sweep(false);
            }
        }
        w.publish_log_stats();
        if step.is_ok() && !w.unsynced.is_empty() {
            if durability == Durability::Buffered
                || flush_due(&w, w.unsynced.len(), expect, deadline, shutting_down)
            {
                deadline = None;
                step = w.flush(syncer.as_ref());
            } else if deadline.is_none() {
                deadline = Some(Instant::now() + GATHER);
            }
        }
        if let Err(e) = step {
            // The log may be damaged: answer everyone and stop; the next
            // open verifies the files and recovers.
            w.fail(&e.to_string(), &rx);
            return;
        }
        // The trees meld replaced stay retired in the melder and are freed
        // when the writer has nothing else to do (at the top of the loop),
        // a few at a time: the frees are cache misses on cold reference
        // counts, a fifth of the writer's time, and done in one piece
        // (inside meld, or at the end of the round) they held up the flush
        // results and commits that arrived meanwhile. Under constant load
        // the melder's own bound frees them at once, so memory stays
        // bounded.
    }
    // A checkpoint whose encoder is done is finished (its last parts wait
    // in the channel: appending them is quick and saves redoing the work
    // after reopening); one still being encoded is abandoned (its begin
    // record is a harmless barrier).
    if w.ckpt.as_ref().is_some_and(|c| c.encoded.is_some()) {
        let _ = w.append_parts();
    }
    let _ = w.log.sync();
    if let Some(ck) = w.ckpt.take() {
        // Closing the parts channel stops a blocked encoder; closing the
        // queue then lets one blocked on announcing a part finish.
        let (parts, encoder) = (ck.parts, ck.encoder);
        drop(parts);
        drop(rx);
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
