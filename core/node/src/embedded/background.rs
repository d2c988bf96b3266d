//! The background thread: checkpoints, node cache sweeps, checkpoint
//! requests and flushes for commits nobody waits for.

use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::Duration;

use melddb::LogPos;

use super::error::{CheckpointFailure, DbError};
use super::group_commit::Engine;
use super::options::Durability;
use super::writer::Msg;

#[cfg(doc)]
use crate::Database;

/// How often the background thread checks the node cache's memory.
pub(super) const CACHE_TICK: Duration = Duration::from_millis(20);

/// The background thread: begins checkpoints and appends their parts as
/// the encoder hands them over, measures and sweeps the node cache,
/// answers [`Database::checkpoint`], and flushes commits whose handles
/// were dropped. Commits never wait for it.
pub(super) fn background_loop(engine: &Engine, rx: Receiver<Msg>) {
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
                    let _ = reply.send(Err(e.clone().stopping()));
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
            let mut done = false;
            if step.is_ok() {
                match w.append_parts(usize::MAX) {
                    Ok(d) => done = d,
                    Err(e) => step = Err(e),
                }
            }
            if done {
                // Most of the checkpoint's sync happens with the lock let
                // go, so commits go on meanwhile; what finishing syncs
                // under the lock is only what came after.
                if let Ok((file, upto, _)) = w.log.sync_handle() {
                    drop(w);
                    let synced = file.sync_data().is_ok();
                    w = engine.lock();
                    if synced {
                        w.log.mark_synced(upto);
                    }
                }
                if step.is_ok() && w.failed.is_none() {
                    step = w.finish_checkpoint();
                }
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
                engine.fail(&mut w, e);
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
        && w.append_parts(usize::MAX).is_ok()
    {
        let _ = w.finish_checkpoint();
    }
    if let Some(ck) = w.ckpt.take() {
        drop(w);
        // Closing the parts channel stops a blocked encoder.
        let (parts, encoder) = (ck.parts, ck.encoder);
        drop(parts);
        for reply in ck.waiters {
            let _ = reply.send(Err(DbError::Checkpoint(CheckpointFailure::Closed)));
        }
        if let Some(h) = encoder {
            let _ = h.join();
        }
    }
}
