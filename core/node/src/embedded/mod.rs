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
//! latest checkpoint. One open database per directory: the directory is
//! locked from the open until the database is dropped.

mod background;
mod cache;
pub(crate) mod checkpoint_state;
mod checkpointing;
pub(crate) mod dir_lock;
mod error;
mod group_commit;
mod options;
pub(crate) mod recovery;
mod stats;
mod writer;

use std::path::Path;
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use melddb::checkpoint;
use melddb::{Log, LogPos, MeldState, Outcome, Settings};

pub use self::dir_lock::LOCK_FILE;
pub use self::error::{CheckpointFailure, DbError, TransactError, Unrecoverable, Unsupported};
pub use self::options::{
    Durability, Options, RetryPolicy, DEFAULT_CACHE_BYTES, DEFAULT_CHECKPOINT_BYTES,
    DEFAULT_CHECKPOINT_PART_BYTES, DEFAULT_COMMIT_TIMEOUT,
};
pub use self::stats::{CacheStats, CheckpointInfo, LogStats, Recovery};

use self::background::background_loop;
use self::checkpoint_state::CheckpointPlan;
use self::dir_lock::DirLock;
use self::group_commit::{sync_loop, Engine, FlushState};
use self::recovery::{close_pair, recover};
use self::stats::Shared;
use self::writer::{Msg, Writer};
use crate::filelog::{FileLog, OpenReport};
use crate::nodestore::LogStore;

/// A database on a local log in a directory: the backend of
/// [`Database::open`](crate::Database::open).
pub(crate) struct Local {
    shared: Arc<Shared>,
    engine: Arc<Engine>,
    background: Option<JoinHandle<()>>,
    syncer: Option<JoinHandle<()>>,
    recovery: Recovery,
    feeds: Arc<crate::feed::Feeds>,
    /// Held for the database's life; released after the shutdown in
    /// `drop` has stopped every thread that writes.
    _lock: DirLock,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("dir", &self.shared.dir)
            .finish()
    }
}

/// A commit appended and melded; [`LocalHandle::wait`] gives its outcome
/// once it is durable. Dropping the handle without waiting leaves the
/// commit to be flushed by the background thread.
pub(crate) struct LocalHandle {
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

impl std::fmt::Debug for LocalHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            HandleState::Ready(o) => write!(f, "LocalHandle(ready: {o:?})"),
            HandleState::Pending { pos, .. } => write!(f, "LocalHandle(pending at {pos})"),
            HandleState::Taken => write!(f, "LocalHandle(taken)"),
        }
    }
}

impl LocalHandle {
    fn ready(o: Result<Outcome, DbError>) -> LocalHandle {
        LocalHandle {
            state: HandleState::Ready(o),
        }
    }

    /// Blocks until the outcome is known and, with [`Durability::Sync`],
    /// the sync thread's flush made the commit durable.
    pub(crate) fn wait(mut self) -> Result<Outcome, DbError> {
        match std::mem::replace(&mut self.state, HandleState::Taken) {
            HandleState::Ready(o) => o,
            HandleState::Taken => Err(DbError::Internal("a commit outcome was taken twice")),
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

impl Drop for LocalHandle {
    fn drop(&mut self) {
        if let HandleState::Pending { pos, engine, .. } = &self.state {
            // Nobody waits: the background thread flushes the commit (so
            // its state gets published) if no one else does.
            let _ = engine.to_bg.try_send(Msg::Flush(*pos + 1));
        }
    }
}

impl Local {
    /// Opens (or creates) the database in `dir` with `opts`, the directory
    /// locked until it is dropped.
    pub(crate) fn open_with(
        dir: &Path,
        opts: &Options,
        feeds: Arc<crate::feed::Feeds>,
    ) -> Result<Local, DbError> {
        let dir = dir.to_path_buf();
        if opts.max_in_flight == 0 {
            return Err(DbError::OptionOutOfRange {
                option: "max_in_flight",
                value: 0,
                min: 1,
                max: usize::MAX as u64,
            });
        }
        if opts.checkpoint_part_bytes < 4096
            || opts.checkpoint_part_bytes > checkpoint::MAX_PART_BYTES
        {
            return Err(DbError::OptionOutOfRange {
                option: "checkpoint_part_bytes",
                value: opts.checkpoint_part_bytes as u64,
                min: 4096,
                max: checkpoint::MAX_PART_BYTES as u64,
            });
        }
        let started = Instant::now();
        // Before anything in the directory is read or written.
        let lock = DirLock::take(&dir)?;
        let (mut log, report): (FileLog, OpenReport) =
            FileLog::open_with(&dir, opts.segment_bytes)?;
        if log.tail() == 0 {
            opts.settings.validate().map_err(DbError::Settings)?;
            log.append(&opts.settings.encode())?;
            log.sync()?;
        }
        let store = Arc::new(LogStore::new());
        let start = recover(
            &log,
            &dir,
            (opts.cache_bytes > 0).then_some(&store),
            opts.cache_bytes,
        )?;
        let mut melder = start.melder;
        melder.set_deferred_reclaim(false);
        let (mut replayed, mut replayed_bytes) = (0u64, 0u64);
        log.replay(melder.next_pos(), |_, e| {
            melder.apply(e);
            replayed += 1;
            replayed_bytes += e.len() as u64;
        })?;
        if let Some(e) = melder.read_error() {
            return Err(DbError::Unrecoverable {
                path: dir.clone(),
                cause: Unrecoverable::Replay(e.clone()),
            });
        }
        close_pair(&mut log, &mut melder)?;
        let cache_bytes = opts.cache_bytes;
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
            rejoins: 0,
            local_checkpoint: None,
            local_checkpoints_written: 0,
            local_checkpoint_error: None,
        };
        let shared = Arc::new(Shared {
            latest: RwLock::new(
                melder
                    .snapshot_state(melder.lcs().pos())
                    .or_else(|| melder.meld_state(melder.lcs().pos()))
                    .cloned()
                    .ok_or(DbError::Internal("no state after recovery"))?,
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
                        .map_err(|e| DbError::thread("sync", e))?,
                )
            }
            Durability::Buffered => None,
        };
        let bg_engine = engine.clone();
        let background = thread::Builder::new()
            .name("melddb-background".into())
            .spawn(move || background_loop(&bg_engine, rx))
            .map_err(|e| DbError::thread("background", e))?;
        Ok(Local {
            shared,
            engine,
            background: Some(background),
            syncer,
            recovery: Recovery {
                records: report.records,
                torn_bytes: report.torn_bytes,
                elapsed: started.elapsed(),
                checkpoint: start.checkpoint.map(|c| c.first),
                local_checkpoint: false,
                replayed,
                skipped_checkpoints: start.skipped,
            },
            feeds,
            _lock: lock,
        })
    }

    /// What recovery found when the database was opened.
    pub(crate) fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The database settings (from its genesis record).
    pub(crate) fn settings(&self) -> Settings {
        self.shared.settings
    }

    /// The latest committed state.
    pub(crate) fn latest(&self) -> MeldState {
        self.shared
            .latest
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Makes every commit appended so far durable (one flush of the log).
    pub(crate) fn sync(&self) -> Result<(), DbError> {
        self.engine.flush_once().map(|_| ())
    }

    /// The node cache's figures, as of the last measurement.
    pub(crate) fn cache_stats(&self) -> CacheStats {
        let mut c = self.shared.cache_stats().clone();
        c.store = self.shared.store.stats();
        c
    }

    /// Appends an intention and melds it on this thread, and returns
    /// without waiting for the flush that makes it durable
    /// ([`LocalHandle::wait`] waits for it). Once
    /// [`Options::max_in_flight`] commits wait for a flush, this call waits
    /// for one before it appends.
    pub(crate) fn submit(
        &self,
        bytes: &[u8],
        local: melddb::LocalIntention,
    ) -> Result<LocalHandle, DbError> {
        let engine = &self.engine;
        let mut w = loop {
            let w = engine.lock();
            if let Some(e) = &w.failed {
                return Err(e.clone().stopping());
            }
            if engine.durability == Durability::Sync && w.unflushed.len() >= engine.max_in_flight {
                let tail = w.log.tail();
                drop(w);
                engine.make_durable(tail, None)?;
                continue;
            }
            break w;
        };
        // The state the commit is melded onto, for the change feed.
        let before = self.feeds.any().then(|| w.melder.lcs().clone());
        let (pos, decided) = match w.commit(bytes, local).and_then(|c| {
            w.after_commit()?;
            Ok(c)
        }) {
            Ok(c) => c,
            Err(e) => {
                engine.fail(&mut w, e.clone());
                return Err(e.stopping());
            }
        };
        if let (Some(before), Some(Outcome::Committed { .. })) = (&before, &decided) {
            // Under the writer's lock: watchers get commits in log order.
            self.feeds
                .publish(pos, bytes, |k| before.get(k).ok().flatten().is_some());
        }
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
        let outcome = decided.ok_or(DbError::Internal(
            "an entry was appended but meld did not decide it",
        ))?;
        if engine.durability == Durability::Buffered {
            drop(garbage);
            return Ok(LocalHandle::ready(Ok(outcome)));
        }
        Ok(LocalHandle {
            state: HandleState::Pending {
                pos,
                engine: engine.clone(),
                outcome,
                garbage: Some(garbage),
            },
        })
    }

    /// Writes a checkpoint of the latest state now (after every commit
    /// queued before this call) and waits until it is durable. Recovery
    /// then starts from it, and with [`Options::trim_log`] the log below
    /// the previous checkpoint is deleted.
    pub(crate) fn checkpoint(&self) -> Result<CheckpointInfo, DbError> {
        if self.background.is_none() {
            return Err(DbError::Closed);
        }
        let (reply, rx) = sync_channel(1);
        self.engine
            .to_bg
            .send(Msg::Checkpoint(reply))
            .map_err(|_| DbError::Closed)?;
        match rx.recv() {
            Ok(Ok(info)) => Ok(info),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(DbError::Closed),
        }
    }

    /// The log's extent, the latest checkpoint and garbage collection
    /// counters, as of the last commit or background step.
    pub(crate) fn log_stats(&self) -> LogStats {
        self.shared.log_stats().clone()
    }

    /// Reachable ephemeral nodes of the latest state created since the
    /// latest checkpoint: the state only memory holds (a crash recomputes
    /// it by replaying the log after the checkpoint). Checkpoints bound it.
    pub(crate) fn unpersisted_nodes(&self) -> u64 {
        let since = self
            .shared
            .log_stats()
            .last_checkpoint
            .as_ref()
            .map_or(0, |c| c.csn);
        checkpoint::unpersisted_nodes(self.latest().snapshot(), since)
    }

    /// Flushes every commit, finishes a checkpoint whose parts are all
    /// encoded, and stops the background thread. Commits submitted and not
    /// waited for are durable afterwards.
    pub(crate) fn close(&mut self) -> Result<(), DbError> {
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
        joined.map_err(|_| DbError::Internal("the background thread panicked"))?;
        closed
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
