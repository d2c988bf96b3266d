//! # MeldDB native runtime: the threaded meld pipeline
//!
//! Runs the stages of [`melddb::pipeline`] on threads (Hyder II §5): worker
//! threads decode log entries into node structures, premeld them and group
//! them into pairs, ahead of final meld; final meld runs on its own thread
//! and only ever consumes prepared entries, in log order, through bounded
//! queues.
//!
//! Determinism does not depend on the threads: every stage is a pure
//! function of the log entry and of one committed state that the log
//! positions and the genesis settings name, and a worker that needs a state
//! final meld has not produced yet waits for it. So the pipeline produces
//! byte-identical states to the single-threaded driver ([`Melder::apply`]),
//! whatever the worker count or timing; the tests check this with injected
//! random delays.
//!
//! ```
//! use melddb::{Finished, Isolation, Melder, Settings, Transaction};
//! use melddb_runtime::{run_log, Options};
//!
//! let settings = Settings { premeld_threads: 2, premeld_distance: 1, ..Settings::default() };
//! let mut m = Melder::new(settings);
//! let mut log = Vec::new();
//! for i in 0..10u8 {
//!     let mut tx = Transaction::begin(m.lcs(), Isolation::Serializable);
//!     tx.put(&[i], b"v").unwrap();
//!     let Finished::Intention(bytes) = tx.finish().unwrap() else { unreachable!() };
//!     m.apply(&bytes);
//!     log.push(bytes);
//! }
//! let report = run_log(&settings.encode(), &log, &Options::default()).unwrap();
//! assert_eq!(report.melder.lcs().digest(), m.lcs().digest());
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

/// The examples of `docs/api.md`, run as doctests.
#[doc = include_str!("../../../docs/api.md")]
#[cfg(doctest)]
pub struct ApiDoc;

mod database;
mod embedded;
mod feed;
mod filelog;
mod nodestore;
mod read;
mod remote;

pub use database::{CommitHandle, Database};
pub use embedded::{
    CacheStats, CheckpointFailure, CheckpointInfo, DbError, Durability, LogStats,
    Options as DbOptions, Recovery, RetryPolicy, TransactError, Unrecoverable, Unsupported,
    DEFAULT_CACHE_BYTES, DEFAULT_CHECKPOINT_BYTES, DEFAULT_CHECKPOINT_PART_BYTES,
    DEFAULT_COMMIT_TIMEOUT, LOCK_FILE,
};
pub use feed::{Change, ChangeFeed, Commit, FeedError, QUEUE as FEED_QUEUE};
pub use filelog::{FileLogError, DEFAULT_SEGMENT_BYTES};
pub use nodestore::StoreStats;
pub use read::{prefix_end, ReadRange, ReadTransaction};
pub use remote::{is_log_url, SCHEME};

use std::collections::BTreeMap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use melddb::pipeline::{self, is_pair_head, Prepared};
use melddb::{
    decode_with, AbortReason, DecodeError, LogPos, MeldState, MeldStats, Melder, Outcome,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Runtime options. None of them changes a decision or a node identity
/// (those are fixed by the genesis settings); they only change timing.
#[derive(Debug, Clone)]
pub struct Options {
    /// Worker threads for decode, premeld and group meld (default: the
    /// premeld thread count `t` of the settings, at least 1).
    pub workers: Option<usize>,
    /// Prepared entries each worker may have queued for final meld.
    pub queue: usize,
    /// Test hook: sleep a random 0..=N microseconds before every stage,
    /// with this seed, to shake out any dependence on timing.
    pub jitter: Option<(u64, u64)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            workers: None,
            queue: 256,
            jitter: None,
        }
    }
}

/// Why the pipeline could not run.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The first entry is not a valid genesis record.
    #[error("invalid genesis record: {0}")]
    Genesis(#[from] DecodeError),
    /// A pipeline thread panicked (a bug); the run is void.
    #[error("a pipeline thread failed: {0}")]
    Thread(String),
}

/// Work counters of one stage, summed over the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageStats {
    /// Nodes visited (intention, LCS and range-check nodes).
    pub nodes: u64,
    /// Ephemeral nodes created.
    pub ephemeral: u64,
}

impl StageStats {
    fn add(&mut self, s: &MeldStats) {
        self.nodes += s.intention_nodes + s.lcs_nodes + s.range_nodes;
        self.ephemeral += s.ephemeral_nodes;
    }
}

/// What a run of the pipeline produced.
#[derive(Debug)]
pub struct Report {
    /// The final melder (its LCS is the state after the last entry).
    pub melder: Melder,
    /// The outcome of every entry, in log order.
    pub outcomes: Vec<Outcome>,
    /// Work done by premeld and group meld (on the workers).
    pub prep: StageStats,
    /// Work done by final meld.
    pub final_meld: StageStats,
    /// Sum over intentions reaching final meld of the conflict-zone length
    /// final meld had to cover (entries between its snapshot and itself).
    pub final_zone_sum: u64,
    /// Number of intentions (or groups) that reached final meld.
    pub final_melds: u64,
    /// Time final meld spent melding (the rest it waited for workers).
    pub final_busy: Duration,
    /// Wall-clock time of the run.
    pub elapsed: Duration,
}

/// Committed states published by final meld, for the workers.
struct Board {
    inner: Mutex<BoardInner>,
    cond: Condvar,
}

struct BoardInner {
    states: BTreeMap<LogPos, MeldState>,
    /// Highest position final meld has finished.
    done: LogPos,
    /// Set when final meld stopped early; waiting workers give up.
    closed: bool,
}

impl Board {
    /// The state after `pos`, waiting until final meld has produced it.
    /// `None` if that position has no state (inside a committed pair) or
    /// the run is over.
    fn wait(&self, pos: LogPos) -> Option<MeldState> {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        while g.done < pos && !g.closed {
            g = self.cond.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        g.states.get(&pos).cloned()
    }

    fn publish(&self, melder: &Melder, from: LogPos, to: LogPos, keep: u64) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for p in from..=to {
            if let Some(s) = melder.meld_state(p) {
                g.states.insert(p, s.clone());
            }
        }
        g.done = to;
        let horizon = to.saturating_sub(keep);
        while g
            .states
            .first_key_value()
            .is_some_and(|(p, _)| *p < horizon)
        {
            g.states.pop_first();
        }
        drop(g);
        self.cond.notify_all();
    }

    fn close(&self) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed = true;
        self.cond.notify_all();
    }
}

/// One unit of work for final meld, with the preparation counters.
struct Unit {
    prepared: Prepared,
    stats: MeldStats,
}

/// Melds `entries` (log positions 1, 2, …) after the genesis record
/// `genesis` through the threaded pipeline and returns the final state and
/// every outcome. Under group meld a last entry whose pair is incomplete is
/// left undecided (it has no outcome), as with [`Melder::apply`].
pub fn run_log(
    genesis: &[u8],
    entries: &[Vec<u8>],
    opts: &Options,
) -> Result<Report, PipelineError> {
    run_from(Melder::from_genesis(genesis)?, entries, opts)
}

/// Like [`run_log`], but continues from `melder` (for example a loaded
/// database): `entries` are the log entries from `melder.next_pos()` on.
/// A melder holding the first member of an unfinished pair is refused.
pub fn run_from(
    melder: Melder,
    entries: &[Vec<u8>],
    opts: &Options,
) -> Result<Report, PipelineError> {
    let base = melder.lcs().pos();
    if melder.next_pos() != base + 1 {
        return Err(PipelineError::Thread(
            "the melder holds half a group-meld pair; feed it the next entry first".into(),
        ));
    }
    let settings = *melder.settings();
    if let (true, Some((first, rest))) = (is_pair_head(&settings, base), entries.split_first()) {
        // The melder stands at a checkpoint record that sat at the head of
        // a pair: the next entry goes alone; pairs start after it.
        let mut melder = melder;
        let started = Instant::now();
        let mut head = melder.apply(first);
        let mut report = run_from(melder, rest, opts)?;
        head.append(&mut report.outcomes);
        report.outcomes = head;
        report.elapsed = started.elapsed();
        return Ok(report);
    }
    let workers = opts
        .workers
        .unwrap_or(settings.premeld_threads as usize)
        .max(1);
    let started = Instant::now();
    let board = Arc::new(Board {
        inner: Mutex::new(BoardInner {
            states: BTreeMap::new(),
            done: 0,
            closed: false,
        }),
        cond: Condvar::new(),
    });
    let oldest = base.saturating_sub(settings.max_conflict_zone as u64 + 1);
    board.publish(&melder, oldest, base, u64::MAX);
    let unit_len: u64 = if settings.group_meld { 2 } else { 1 };
    // Under group meld a last entry without its partner goes to the
    // melder after the pipeline, as in the single-threaded driver: it stays
    // undecided as the head of a pair, unless it is a checkpoint record.
    let units = entries.len() as u64 / unit_len;
    let leftover = entries.get((units * unit_len) as usize).cloned();
    let keep = settings.max_conflict_zone as u64 + 2;
    // Checkpoint barriers follow from the entries' bytes alone: the one in
    // force for each entry tells its worker which snapshots final meld will
    // no longer have (melddb::checkpoint), so both agree on the outcome.
    let mut tracker = melder.tracker().clone();
    let mut barrier = melder.barrier();
    let barriers: Arc<[LogPos]> = entries
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            let in_force = barrier;
            let pos = base + 1 + i as u64;
            if let melddb::checkpoint::TrackEvent::Begin = tracker.feed(&settings, pos, bytes) {
                barrier = pos;
            }
            in_force
        })
        .collect();
    let entries: Arc<[Vec<u8>]> = entries.into();

    thread::scope(|scope| {
        let mut queues: Vec<Receiver<Result<Unit, PipelineError>>> = Vec::with_capacity(workers);
        for w in 0..workers {
            let (tx, rx) = sync_channel::<Result<Unit, PipelineError>>(opts.queue.max(1));
            queues.push(rx);
            let board = board.clone();
            let entries = entries.clone();
            let barriers = barriers.clone();
            let jitter = opts
                .jitter
                .map(|(seed, max)| (ChaCha8Rng::seed_from_u64(seed ^ (w as u64 + 1)), max));
            scope.spawn(move || {
                worker(
                    w as u64,
                    workers as u64,
                    units,
                    unit_len,
                    base,
                    &settings,
                    &entries,
                    &barriers,
                    &board,
                    &tx,
                    jitter,
                )
            });
        }
        let result = final_meld(melder, units, &queues, &board, keep, entries.len() as u64);
        board.close();
        drop(queues);
        result.map(|(mut melder, mut outcomes, prep, fin, zone, count, busy)| {
            if let Some(last) = leftover {
                outcomes.extend(melder.apply(&last));
            }
            Report {
                final_busy: busy,
                melder,
                outcomes,
                prep,
                final_meld: fin,
                final_zone_sum: zone,
                final_melds: count,
                elapsed: started.elapsed(),
            }
        })
    })
}

type FinalResult = (
    Melder,
    Vec<Outcome>,
    StageStats,
    StageStats,
    u64,
    u64,
    Duration,
);

fn final_meld(
    mut melder: Melder,
    units: u64,
    queues: &[Receiver<Result<Unit, PipelineError>>],
    board: &Board,
    keep: u64,
    total: u64,
) -> Result<FinalResult, PipelineError> {
    let mut outcomes = Vec::with_capacity(total as usize);
    let (mut prep, mut fin) = (StageStats::default(), StageStats::default());
    let (mut zone, mut count) = (0u64, 0u64);
    let mut busy = Duration::ZERO;
    for u in 0..units {
        let q = &queues[(u % queues.len() as u64) as usize];
        let unit = q
            .recv()
            .map_err(|_| PipelineError::Thread(format!("worker for unit {u} stopped")))??;
        prep.add(&unit.stats);
        let from = unit.prepared.first_pos();
        let n = unit.prepared.entries();
        if let Some(z) = final_zone(&unit.prepared) {
            zone += z;
            count += 1;
        }
        let t0 = Instant::now();
        let out = melder.apply_prepared(unit.prepared);
        busy += t0.elapsed();
        fin.add(&melder.last_stats());
        outcomes.extend(out);
        board.publish(&melder, from, from + n - 1, keep);
    }
    Ok((melder, outcomes, prep, fin, zone, count, busy))
}

/// The conflict zone final meld covers for this unit, if it melds anything.
fn final_zone(p: &Prepared) -> Option<u64> {
    match p {
        Prepared::One(pos, Ok(i)) => Some(pos - i.snapshot_pos - 1),
        Prepared::Group { first, group } => Some(first - group.snapshot_pos - 1),
        Prepared::Split((pa, a), (pb, b)) => match (a, b) {
            (Ok(i), _) => Some(pa - i.snapshot_pos - 1),
            (_, Ok(i)) => Some(pb - i.snapshot_pos - 1),
            _ => None,
        },
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)]
fn worker(
    w: u64,
    workers: u64,
    units: u64,
    unit_len: u64,
    base: LogPos,
    settings: &melddb::Settings,
    entries: &[Vec<u8>],
    barriers: &[LogPos],
    board: &Board,
    out: &SyncSender<Result<Unit, PipelineError>>,
    jitter: Option<(ChaCha8Rng, u64)>,
) {
    let jitter = std::cell::RefCell::new(jitter);
    let pause = || {
        if let Some((rng, max)) = jitter.borrow_mut().as_mut() {
            let us = rng.random_range(0..=*max);
            thread::sleep(Duration::from_micros(us));
        }
    };
    let mut u = w;
    while u < units {
        let mut stats = MeldStats::default();
        let first = base + u * unit_len + 1;
        let prepare = |pos: LogPos,
                       stats: &mut MeldStats|
         -> Result<Result<melddb::Intention, AbortReason>, PipelineError> {
            let bytes = &entries[(pos - base - 1) as usize];
            let barrier = barriers[(pos - base - 1) as usize];
            pause();
            let int = match decode_with(settings, pos, bytes, |p| {
                if p < barrier {
                    return None;
                }
                board.wait(p).map(|s| s.snapshot().clone())
            }) {
                Ok(int) => int,
                Err(e) => return Ok(Err(e)),
            };
            pause();
            pipeline::premeld(settings, int, |m| board.wait(m), stats)
                .map_err(|e| PipelineError::Thread(format!("premeld of {pos}: {e}")))
        };
        let record = |pos: LogPos| {
            let bytes = &entries[(pos - base - 1) as usize];
            melddb::checkpoint::applies(bytes).then(|| Prepared::Checkpoint(pos, bytes.clone()))
        };
        let prepared = (|| {
            let alone = |pos: LogPos, stats: &mut MeldStats| match record(pos) {
                Some(r) => Ok(r),
                None => Ok(Prepared::One(pos, prepare(pos, stats)?)),
            };
            if unit_len == 1 {
                return alone(first, &mut stats);
            }
            if record(first).is_some() || record(first + 1).is_some() {
                // A checkpoint record never pairs (melddb::pipeline).
                let a = alone(first, &mut stats)?;
                let b = alone(first + 1, &mut stats)?;
                return Ok(Prepared::Apart(Box::new(a), Box::new(b)));
            }
            let a = prepare(first, &mut stats)?;
            let b = prepare(first + 1, &mut stats)?;
            pause();
            pipeline::group(first, a, b, |q| board.wait(q), &mut stats)
                .map_err(|e| PipelineError::Thread(format!("group meld of {first}: {e}")))
        })();
        if out
            .send(prepared.map(|prepared| Unit { prepared, stats }))
            .is_err()
        {
            return;
        }
        u += workers;
    }
}
