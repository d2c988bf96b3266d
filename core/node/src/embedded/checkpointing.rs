//! Checkpoints while commits go on: the begin record is appended after a
//! commit, the state is encoded on its own thread, and its parts are
//! appended between commits as they come; the last one completes it, and
//! the log below the previous checkpoint is trimmed.

use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread;
use std::time::Instant;

use melddb::pipeline::is_pair_head;
use melddb::{checkpoint, Log};

use super::checkpoint_state::{Encoded, InProgress, Piece};
use super::error::{CheckpointFailure, DbError};
use super::recovery::register_part;
use super::stats::CheckpointInfo;
use super::writer::{read_back_ok, Msg, Writer};

impl Writer {
    /// Begins a checkpoint if one was asked for or is due and none is in
    /// progress. A checkpoint that cannot be written (settings) is
    /// reported to who asked and stops the automatic ones.
    pub(super) fn maybe_begin_checkpoint(&mut self) -> Result<(), DbError> {
        if self.ckpt.is_some() || (self.ckpt_waiters.is_empty() && !self.due_for_checkpoint()) {
            return Ok(());
        }
        match self.begin_checkpoint() {
            Err(
                e @ (DbError::Checkpoint(_) | DbError::Unsupported(_) | DbError::Thread { .. }),
            ) => {
                let waiters = std::mem::take(&mut self.ckpt_waiters);
                self.give_up_checkpoints(waiters, e);
                Ok(())
            }
            other => other,
        }
    }

    /// A checkpoint could not be written: tell who asked, stop the
    /// automatic ones and say why in the stats.
    pub(super) fn give_up_checkpoints(
        &mut self,
        waiters: Vec<SyncSender<Result<CheckpointInfo, DbError>>>,
        e: DbError,
    ) {
        self.shared.log_stats().checkpoint_error = Some(e.to_string());
        for w in waiters {
            let _ = w.send(Err(e.clone()));
        }
        self.plan.every = 0;
    }

    /// Whether enough was written since the last checkpoint (at least
    /// `every` and twice the last one's size), or the node cache needs
    /// one to evict. [`Writer::maybe_begin_checkpoint`] checks that none
    /// is in progress.
    pub(super) fn due_for_checkpoint(&self) -> bool {
        let last = self.plan.last.as_ref().map_or(0, |c| c.bytes);
        (self.plan.every > 0 && self.appended >= self.plan.every.max(2 * last))
            || self.cache_pressure
    }

    /// Starts a checkpoint: appends the begin record (the barrier), syncs,
    /// publishes the state there, and encodes that state on another
    /// thread; its parts are appended later, between commits
    /// ([`Writer::append_parts`]). `Err(Checkpoint)` wrote nothing;
    /// `Err(Stopped)` is fatal.
    pub(super) fn begin_checkpoint(&mut self) -> Result<(), DbError> {
        let settings = *self.melder.settings();
        let started = Instant::now();
        if is_pair_head(&settings, self.log.tail()) {
            // Group meld: the begin record goes at a pair's second member,
            // so the state it holds is one transactions may begin on. The
            // filler before it (rejected as malformed) is melded alone.
            self.log.append(&[])?;
            self.melder.apply(&[]);
        }
        let begin = self.log.tail();
        let record = checkpoint::begin_record(settings.db_id);
        self.log.append(&record)?;
        self.appended_total += record.len() as u64;
        let outcomes = self.melder.apply(&record);
        if outcomes
            .iter()
            .any(|o| o.pos() == Some(begin) && !o.is_committed())
        {
            return Err(DbError::Internal(
                "the melder refused a checkpoint begin record this process wrote",
            ));
        }
        // Everything up to the barrier is durable after this sync, so its
        // state can be published at once (commits appended before it are
        // still answered by the usual flush path, in order). Transactions
        // begun on older states would abort at the barrier.
        self.log.sync()?;
        let Some(state) = self.melder.meld_state(begin).cloned() else {
            return Err(DbError::Internal("no state at the checkpoint barrier"));
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
                    .map_err(|source| {
                        DbError::Checkpoint(CheckpointFailure::Encode { begin, source })
                    });
                if parts_tx.send(Piece::Done(done)).is_ok() {
                    // Only a wake-up for an idle database; never block on it.
                    let _ = tx.try_send(Msg::PartReady);
                }
            })
            .map_err(|e| DbError::thread("checkpoint encoder", e))?;
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
            done: None,
            bytes: 0,
            waiters: std::mem::take(&mut self.ckpt_waiters),
        });
        Ok(())
    }

    /// Appends up to `most` of the checkpoint parts the encoder handed
    /// over (at most two wait), and keeps its end, once it comes, for
    /// [`Writer::finish_checkpoint`]. Returns whether that end is in.
    pub(super) fn append_parts(&mut self, most: usize) -> Result<bool, DbError> {
        let Some(ck) = self.ckpt.as_mut() else {
            return Ok(false);
        };
        let mut appended = 0;
        while appended < most && ck.done.is_none() {
            let Some(piece) = ck.parts.as_ref().and_then(|rx| rx.try_recv().ok()) else {
                break;
            };
            let p = match piece {
                Piece::Part(p) => p,
                Piece::Done(r) => {
                    ck.done = Some(r);
                    break;
                }
            };
            let pos = self.log.append(&p)?;
            self.appended_total += p.len() as u64;
            ck.bytes += p.len() as u64;
            register_part(&self.log, &self.store, ck.generation, ck.begin, pos, &p).map_err(
                |_| DbError::Internal("a checkpoint part this process wrote does not parse"),
            )?;
            if self.melder.apply(&p).iter().any(|o| !o.is_committed()) {
                return Err(DbError::Internal(
                    "the melder refused a checkpoint part this process wrote",
                ));
            }
            read_back_ok(&self.melder)?;
            appended += 1;
        }
        let done = ck.done.is_some();
        if appended > 0 && !done && self.unflushed.is_empty() {
            // No commit waits: the new entries are parts only.
            self.release(self.log.tail());
        }
        Ok(done)
    }

    /// Once the encoder is done and every part is in: syncs, makes the
    /// checkpoint's nodes readable by the node cache, trims the log below
    /// the previous checkpoint (never below one a stub still reads from)
    /// and answers who asked. The background thread's work: the sync and
    /// the trim would hold up the commit that did it.
    pub(super) fn finish_checkpoint(&mut self) -> Result<(), DbError> {
        let Some(done) = self.ckpt.as_mut().and_then(|ck| ck.done.take()) else {
            return Ok(());
        };
        let enc = match done {
            Err(e) => {
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
            Ok(enc) => enc,
        };
        let pos = self.log.tail() - 1;
        self.log.sync()?;
        // Everything appended is durable now: publish the latest state.
        if let Some(state) = self.melder.snapshot_state(pos).cloned() {
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
                self.log.trim(to)?;
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
}
