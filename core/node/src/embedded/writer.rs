//! The writer: the log and the melder behind one lock, where a commit is
//! appended and melded, and what it publishes when a flush covers it.

use std::collections::VecDeque;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

use melddb::{Log, LogPos, MeldState, Melder, Outcome};

use super::checkpoint_state::{CheckpointPlan, InProgress};
use super::error::DbError;
use super::recovery::close_pair;
use super::stats::{CheckpointInfo, Shared};
use crate::filelog::FileLog;
use crate::nodestore::LogStore;

#[cfg(doc)]
use crate::Database;

/// Fails if a node could not be read back from the log during the last
/// meld: its decisions are then meaningless, so the database stops (a
/// reopen recovers from the log).
pub(super) fn read_back_ok(melder: &Melder) -> Result<(), DbError> {
    match melder.read_error() {
        None => Ok(()),
        Some(e) => Err(DbError::Store(e.clone())),
    }
}

/// Messages to the background thread.
pub(super) enum Msg {
    /// [`Database::checkpoint`]: write one now and answer here.
    Checkpoint(SyncSender<Result<CheckpointInfo, DbError>>),
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

/// The log, the melder and their bookkeeping (behind `Engine::core`).
pub(super) struct Writer {
    pub(super) log: FileLog,
    pub(super) melder: Melder,
    pub(super) shared: Arc<Shared>,
    /// Positions of commits appended and not yet durable, oldest first.
    pub(super) unflushed: VecDeque<LogPos>,
    /// Set after an I/O error (or at close): no more commits.
    pub(super) failed: Option<DbError>,
    pub(super) to_bg: SyncSender<Msg>,
    /// A housekeeping message is on its way to the background thread.
    pub(super) poked: bool,
    /// The log's tail when its figures were last published in full.
    pub(super) stats_tail: LogPos,
    pub(super) plan: CheckpointPlan,
    /// Intention bytes appended since the last checkpoint.
    pub(super) appended: u64,
    /// Record bytes appended by this process.
    pub(super) appended_total: u64,
    pub(super) ckpt: Option<InProgress>,
    /// Who asked for a checkpoint that has not begun yet.
    pub(super) ckpt_waiters: Vec<SyncSender<Result<CheckpointInfo, DbError>>>,
    pub(super) store: Arc<LogStore>,
    /// Memory the tree held at the last measurement, and what was loaded
    /// and appended since (to know when to measure again).
    pub(super) cache_measured: u64,
    pub(super) cache_loaded_at: u64,
    pub(super) cache_appended_at: u64,
    /// Memory filled up with what only memory holds: checkpoint now.
    pub(super) cache_pressure: bool,
    /// Readers loaded a lot since the last sweep: measure now.
    pub(super) cache_poked: bool,
}

impl Writer {
    pub(super) fn new(
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
    pub(super) fn commit(
        &mut self,
        bytes: &[u8],
        local: melddb::LocalIntention,
    ) -> Result<(LogPos, Option<Outcome>), DbError> {
        let pos = self.log.append(bytes)?;
        self.appended += bytes.len() as u64;
        self.appended_total += bytes.len() as u64;
        let mut outcomes = self.melder.apply_local(bytes, local);
        read_back_ok(&self.melder)?;
        outcomes.extend(close_pair(&mut self.log, &mut self.melder)?);
        self.unflushed.push_back(pos);
        Ok((pos, outcomes.into_iter().find(|o| o.pos() == Some(pos))))
    }

    /// After each commit: appends one checkpoint part if one is ready,
    /// begins a checkpoint when one is due (its begin record goes right
    /// after this commit; it is encoded on another thread), and
    /// asks the background thread to measure the node cache when enough
    /// was added (once until it has looked).
    pub(super) fn after_commit(&mut self) -> Result<(), DbError> {
        // Parts the encoder handed over go in between commits, one per
        // commit: left to the background thread alone, which competes with
        // every committer for the lock, a checkpoint could take much
        // longer under load; more than one would make this commit (and
        // every one waiting for the lock) wait for megabytes of writes.
        // Finishing the checkpoint (a sync of all of it, the trim) is the
        // background thread's.
        if self.append_parts(1)? {
            let _ = self.to_bg.try_send(Msg::PartReady);
        }
        self.maybe_begin_checkpoint()?;
        if !self.poked && self.sweep_wanted(false) && self.to_bg.try_send(Msg::Housekeeping).is_ok()
        {
            self.poked = true;
        }
        Ok(())
    }

    /// Everything before `upto` is durable: publish the state there.
    pub(super) fn synced(&mut self, upto: LogPos) {
        self.log.mark_synced(upto);
        while self.unflushed.front().is_some_and(|p| *p < upto) {
            self.unflushed.pop_front();
        }
        self.release(upto);
    }

    /// Makes `state` the one new transactions begin on. The durable
    /// position goes out first: whoever sees the new state then sees a
    /// durable position that covers it.
    pub(super) fn publish(&self, state: MeldState) {
        self.shared.log_stats().synced = self.log.synced();
        self.shared.publish(state);
    }

    /// Publishes the state up to `upto` (exclusive).
    pub(super) fn release(&mut self, upto: LogPos) {
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
            .snapshot_state(at)
            .or_else(|| self.melder.snapshot_state(lcs))
            .cloned()
        {
            self.publish(state);
        }
    }

    /// Publishes the log's extent for [`Database::log_stats`].
    pub(super) fn publish_log_stats(&mut self) {
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
    /// `e` (see `Engine::fail`).
    pub(super) fn fail(&mut self, e: DbError) {
        let stopped = e.clone().stopping();
        self.failed.get_or_insert(e);
        let waiting = self.ckpt.take().map(|c| c.waiters).unwrap_or_default();
        for reply in waiting.into_iter().chain(self.ckpt_waiters.drain(..)) {
            let _ = reply.send(Err(stopped.clone()));
        }
    }
}
