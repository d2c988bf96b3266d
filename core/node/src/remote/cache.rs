//! The roll-forward thread's side of a shared-log node's own checkpoints
//! and node cache: when to hand a state to the local checkpoint thread
//! ([`super::local`]), when to ask the log for a begin record, and the
//! CLOCK sweep that evicts what a local checkpoint holds once the tree is
//! over its budget (the same policy as the embedded node's).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};

use melddb::{checkpoint, Melder, Settings, Snapshot};
use melddb_log::Client;

use super::local::LocalCheckpoints;
use crate::embedded::{CacheStats, CheckpointInfo, DbError};
use crate::nodestore::{evict_to, LogStore};

/// What the local checkpoint thread reports, for `Database::log_stats`
/// and `cache_stats`.
#[derive(Default)]
pub(crate) struct LocalStatus {
    pub written: u64,
    pub last: Option<CheckpointInfo>,
    pub error: Option<DbError>,
    pub trims_held: u64,
}

/// Shared between the roll-forward thread, the local checkpoint thread
/// and the node's callers.
#[derive(Default)]
pub(crate) struct LocalShared {
    pub status: Mutex<LocalStatus>,
    pub cache: Mutex<CacheStats>,
    /// The local checkpoint thread is writing one.
    pub busy: AtomicBool,
    /// The last bare begin record this node appended failed.
    pub begin_failed: AtomicBool,
}

impl LocalShared {
    pub fn status(&self) -> std::sync::MutexGuard<'_, LocalStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }
    pub fn cache(&self) -> std::sync::MutexGuard<'_, CacheStats> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The local checkpoint thread: writes each state it is handed, until
/// the roll-forward thread drops its sender.
pub(crate) fn checkpointer(
    mut local: LocalCheckpoints,
    settings: Settings,
    part_bytes: usize,
    states: Receiver<Snapshot>,
    shared: Arc<LocalShared>,
) {
    for state in states {
        let r = local.write(&settings, &state, part_bytes);
        shared.busy.store(false, Ordering::Release);
        let mut st = shared.status();
        st.trims_held = local.trims_held;
        match r {
            Ok(info) => {
                st.written += 1;
                st.last = Some(info);
                st.error = None;
            }
            Err(e) => st.error = Some(e),
        }
    }
}

/// The roll-forward thread's cache and local checkpoint state.
pub(crate) struct CacheSide {
    pub states: SyncSender<Snapshot>,
    pub shared: Arc<LocalShared>,
    pub store: Arc<LogStore>,
    /// Local checkpoint every this many bytes of log melded (0: only
    /// under cache pressure).
    pub every: u64,
    /// Log bytes without any begin record after which this node appends
    /// a bare one: between two and three times `every`, drawn once per
    /// node, so that nodes which all see the same log do not all append
    /// one at the same position (the first one resets everyone's count).
    pub bare_after: u64,
    /// Node cache budget (0: off).
    pub budget: u64,
    /// A client and log to append a bare begin record with, when this
    /// node does not publish checkpoints (`None`: it does).
    pub appender: Option<(Arc<super::Rt>, Client, String)>,
    /// Bytes of the log's own entries melded since the last local
    /// checkpoint was handed over.
    pub since: u64,
    /// What the cache measured last, and growth since then.
    pub measured: u64,
    pub grown: u64,
    pub loaded_at: u64,
    /// The complete local checkpoints the cache last saw.
    pub known: Vec<u16>,
    /// Most of memory could not be evicted: a checkpoint is wanted.
    pub pressure: bool,
    /// A bare begin record was asked for and has not been melded yet.
    pub begin_asked: bool,
}

impl CacheSide {
    /// An entry that is not a checkpoint record was melded.
    pub fn melded(&mut self, bytes: u64) {
        self.since += bytes;
        // Intentions take about four times their encoded size as nodes.
        self.grown += 4 * bytes;
    }

    /// A begin record was melded: `state` is the state there. Hands it to
    /// the local checkpoint thread when one is due (and that thread is
    /// free).
    pub fn begin(&mut self, state: &Snapshot) {
        self.begin_asked = false;
        let due = (self.every > 0 && self.since >= self.every) || self.pressure;
        if !due || self.shared.busy.swap(true, Ordering::AcqRel) {
            return;
        }
        // `busy` is set before the hand-over: the thread clears it once
        // done, which may be before `try_send` returns.
        match self.states.try_send(state.clone()) {
            Ok(()) => {
                self.since = 0;
                if std::mem::take(&mut self.pressure) {
                    self.shared.cache().pressure_checkpoints += 1;
                }
            }
            // Not taken: the next begin record will do.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.shared.busy.store(false, Ordering::Release);
            }
        }
    }

    /// Whether this node should append a bare begin record now: it does
    /// not publish, no local checkpoint is being written, and either no
    /// begin record came for `bare_after` bytes of log or the
    /// cache needs a checkpoint (then after a sixteenth of its budget of
    /// log since the last begin record, so that a checkpoint that cannot
    /// relieve the pressure does not fill the log with barriers).
    pub fn wants_begin(&mut self, since_any_begin: u64) -> bool {
        if self.shared.begin_failed.swap(false, Ordering::AcqRel) {
            self.begin_asked = false;
        }
        self.appender.is_some()
            && !self.begin_asked
            && !self.shared.busy.load(Ordering::Acquire)
            && ((self.pressure && since_any_begin >= self.budget / 16)
                || (self.every > 0 && since_any_begin >= self.bare_after))
    }

    /// Appends a bare begin record (without waiting for it).
    pub fn ask_begin(&mut self, db_id: u64) {
        let Some((rt, client, log)) = &self.appender else {
            return;
        };
        self.begin_asked = true;
        self.shared.begin_failed.store(false, Ordering::Release);
        let (c, l, shared) = (client.clone(), log.clone(), self.shared.clone());
        rt.spawn(async move {
            // A failure lets the roll-forward thread ask again.
            if c.append(&l, checkpoint::begin_record(db_id)).await.is_err() {
                shared.begin_failed.store(true, Ordering::Release);
            }
        });
    }

    /// After a batch of entries: measures the tree when enough was added
    /// or loaded since the last time, or a local checkpoint completed, and
    /// evicts what a complete local checkpoint holds when it is over the
    /// budget. Returns whether the LCS's tree was replaced (so readers
    /// should move to it).
    pub fn sweep(&mut self, melder: &mut Melder) -> Result<bool, DbError> {
        if self.budget == 0 {
            return Ok(false);
        }
        let complete = self.store.complete_generations();
        let new_checkpoint = complete != self.known;
        let loaded = self.store.stats().loaded_bytes;
        let grown = self.grown + loaded.saturating_sub(self.loaded_at);
        let due = self.measured + grown >= self.budget && grown >= self.budget / 4;
        if !due && !new_checkpoint {
            return Ok(false);
        }
        self.known = complete;
        let persisted = |g: u16| self.known.contains(&g);
        let mut measured = melder.lcs().approx_bytes();
        let before = measured;
        let mut replaced = false;
        let mut c = self.shared.cache();
        if measured > self.budget {
            let swept =
                evict_to(melder, &self.store, &persisted, self.budget).map_err(DbError::Store)?;
            c.sweeps += swept.sweeps;
            c.stubbed += swept.stubbed;
            c.unloaded += swept.unloaded;
            measured = swept.measured;
            replaced = true;
            if measured > self.budget / 2 {
                self.pressure = true;
            }
        } else if new_checkpoint {
            melder.promote(&persisted);
        }
        c.budget = self.budget;
        c.in_memory_bytes = measured;
        c.peak_bytes = c.peak_bytes.max(before);
        c.trims_held = self.shared.status().trims_held;
        self.measured = measured;
        self.grown = 0;
        self.loaded_at = loaded;
        Ok(replaced)
    }
}
