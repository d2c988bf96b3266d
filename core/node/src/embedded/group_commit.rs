//! Group commit: committers park until a flush covers them; the sync
//! thread runs one flush right after the other while they keep asking,
//! and wakes exactly the committers each flush covered.

use std::sync::mpsc::SyncSender;
use std::sync::{Condvar, Mutex, PoisonError};
use std::thread;

use melddb::{Log, LogPos};

use super::error::DbError;
use super::options::Durability;
use super::writer::{Msg, Writer};
use crate::filelog::FileLogError;

/// What every committing thread and the background thread share: the log
/// and melder behind one lock, and the group-commit state behind another
/// (taken only after `core` when both are needed, never the other way
/// round).
pub(super) struct Engine {
    pub(super) core: Mutex<Writer>,
    pub(super) flush: Mutex<FlushState>,
    /// Wakes the idle sync thread.
    pub(super) work: Condvar,
    pub(super) durability: Durability,
    pub(super) max_in_flight: usize,
    pub(super) to_bg: SyncSender<Msg>,
}

/// Group commit: what committers wait for, who is parked, and what is
/// durable.
pub(super) struct FlushState {
    /// Every record before this position is durable and its state
    /// published.
    pub(super) durable: LogPos,
    /// Committers wait for everything before this to be durable.
    pub(super) wanted: LogPos,
    /// Parked committers and the position each waits for.
    pub(super) sleepers: Vec<(LogPos, thread::Thread)>,
    /// The sync thread waits for work.
    pub(super) idle: bool,
    /// The database is closing: the sync thread stops.
    pub(super) stop: bool,
    /// Why the database stopped taking commits (an I/O error); everyone
    /// waiting gets it.
    pub(super) failed: Option<DbError>,
}

impl FlushState {
    /// Wakes every parked committer (failure or close: they all return).
    pub(super) fn wake_all(&mut self) {
        for (_, t) in self.sleepers.drain(..) {
            t.unpark();
        }
    }
}

impl Engine {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn flush_state(&self) -> std::sync::MutexGuard<'_, FlushState> {
        self.flush.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns once every record before `upto` is durable and its state
    /// published: asks the sync thread for it (waking it if idle; a
    /// running one chains the next flush itself), frees `garbage` while
    /// the flush runs, and waits.
    pub(super) fn make_durable(
        &self,
        upto: LogPos,
        garbage: Option<melddb::Garbage>,
    ) -> Result<(), DbError> {
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
                return Err(e.clone().stopping());
            }
            if st.durable >= upto {
                return Ok(());
            }
            if st.stop {
                return Err(DbError::Closed);
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
    pub(super) fn flush_once(&self) -> Result<LogPos, DbError> {
        let handle = {
            let w = self.lock();
            if let Some(e) = &w.failed {
                return Err(e.clone().stopping());
            }
            if w.log.synced() < w.log.tail() {
                match w.log.sync_handle() {
                    Ok(h) => Some(h),
                    Err(e) => {
                        drop(w);
                        return Err(self.fail_now(e.into()));
                    }
                }
            } else {
                None
            }
        };
        let upto = match handle {
            Some((file, upto, path)) => {
                if let Err(source) = file.sync_data() {
                    return Err(self.fail_now(FileLogError::Io { path, source }.into()));
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
    pub(super) fn fail(&self, w: &mut Writer, e: DbError) {
        w.fail(e.clone());
        let mut st = self.flush_state();
        st.failed.get_or_insert(e);
        st.wake_all();
    }

    pub(super) fn fail_now(&self, e: DbError) -> DbError {
        let mut w = self.lock();
        self.fail(&mut w, e.clone());
        e.stopping()
    }

    /// At close (the background thread has stopped): syncs what is left
    /// and refuses further commits. Handles still held get their outcomes.
    pub(super) fn close(&self) -> Result<(), DbError> {
        let mut w = self.lock();
        if w.failed.is_some() {
            return Ok(());
        }
        let synced = w.log.sync().map_err(DbError::from);
        let tail = w.log.tail();
        if synced.is_ok() {
            w.synced(tail);
        }
        w.failed = Some(DbError::Closed);
        drop(w);
        let mut st = self.flush_state();
        st.stop = true;
        self.work.notify_all();
        match synced {
            Ok(()) => st.durable = st.durable.max(tail),
            Err(ref e) => {
                st.failed.get_or_insert_with(|| e.clone());
            }
        }
        st.wake_all();
        synced
    }
}

/// The sync thread: flushes whatever committers wait for, one flush
/// right after the other while they keep asking (no wake-up between two
/// flushes), then publishes the state and wakes them.
pub(super) fn sync_loop(engine: &Engine) {
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
                st.failed.get_or_insert(e);
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
