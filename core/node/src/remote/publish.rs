//! The publishing thread of a node with `Options::publish_checkpoints`:
//! writes a checkpoint into the shared log whenever enough of it was
//! melded since the latest one, points the companion log at it once it
//! is complete, and trims the log below the checkpoint before it.
//!
//! Any node may publish, and two may at once: the engine decides from the
//! records alone which checkpoint completes (a later begin record ends an
//! earlier checkpoint in progress, on every node alike), so a publisher
//! whose checkpoint lost gives it up and tries again when the next one is
//! due. Only a complete checkpoint that this node melded itself is ever
//! pointed at.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use melddb::checkpoint;
use melddb::{LogPos, Settings};
use melddb_log::Client;

use super::follow::Follow;
use super::published::{companion, Pointer};
use crate::embedded::{CheckpointFailure, CheckpointInfo, DbError};

/// What the publishing thread needs.
pub(crate) struct Publisher {
    pub rt: Arc<super::Rt>,
    pub client: Client,
    pub log: String,
    pub settings: Settings,
    pub follow: Arc<Follow>,
    pub part_bytes: usize,
    pub trim: bool,
    /// The begin of the latest published checkpoint when the node
    /// started (the next trim goes below it).
    pub previous: Option<LogPos>,
}

impl Publisher {
    /// Runs until the node closes.
    pub fn run(mut self) {
        loop {
            {
                let mut st = self.follow.lock();
                while !st.due {
                    if st.stopped().is_some() {
                        return;
                    }
                    st = self
                        .follow
                        .melded
                        .wait(st)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                st.due = false;
                st.publishing = true;
                st.published.attempts += 1;
            }
            let result = self.publish_one();
            let mut st = self.follow.lock();
            st.publishing = false;
            match result {
                Ok((info, trimmed_to)) => {
                    st.published.written += 1;
                    st.published.last = Some(info);
                    st.published.error = None;
                    if let Some(t) = trimmed_to {
                        st.published.trims += 1;
                        st.published.first = t;
                    }
                }
                Err(e) => {
                    st.published.error = Some(e);
                    st.published.error_attempt = st.published.attempts;
                }
            }
        }
    }

    /// Waits until the node has melded `pos`; false if it stopped.
    fn wait_melded(&self, pos: LogPos) -> bool {
        let mut st = self.follow.lock();
        while st.next <= pos {
            if st.stopped().is_some() {
                return false;
            }
            st = self
                .follow
                .melded
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
        true
    }

    /// One checkpoint: the begin record, the parts encoding the state
    /// there, and once melded complete, its pointer; then the trim.
    fn publish_one(&mut self) -> Result<(CheckpointInfo, Option<LogPos>), DbError> {
        let started = Instant::now();
        // Checked when the node connected.
        let comp = companion(&self.log).ok_or(DbError::Internal(
            "a publishing node's log name leaves no room for `.ckpt`",
        ))?;
        let failed = |f: CheckpointFailure| DbError::Checkpoint(f);
        let append = |bytes: Vec<u8>| {
            self.rt
                .block_on(self.client.append(&self.log, bytes))
                .map_err(|source| CheckpointFailure::Append {
                    log: self.log.clone(),
                    source,
                })
        };
        let begin = append(checkpoint::begin_record(self.settings.db_id)).map_err(failed)?;
        if !self.wait_melded(begin) {
            return Err(failed(CheckpointFailure::Closed));
        }
        let state = match &self.follow.lock().last_begin {
            Some((p, s)) if *p == begin => s.snapshot().clone(),
            _ => return Err(failed(CheckpointFailure::Superseded { begin })),
        };
        let mut parts = Vec::new();
        let mut bytes = 0u64;
        let mut stopped = None;
        let encoded =
            checkpoint::encode_streaming(&self.settings, &state, self.part_bytes, None, |part| {
                // Closing: stop (the checkpoint stays incomplete, unused).
                if self.follow.lock().stopped().is_some() {
                    stopped = Some(CheckpointFailure::Closed);
                    return false;
                }
                // Another begin record ends this checkpoint on every node:
                // stop writing parts nobody will take.
                if self
                    .follow
                    .lock()
                    .last_begin
                    .as_ref()
                    .is_some_and(|(p, _)| *p != begin)
                {
                    stopped = Some(CheckpointFailure::Superseded { begin });
                    return false;
                }
                bytes += part.len() as u64;
                match append(part) {
                    Ok(p) => {
                        parts.push(p);
                        true
                    }
                    Err(e) => {
                        stopped = Some(e);
                        false
                    }
                }
            })
            .map_err(|source| failed(CheckpointFailure::Encode { begin, source }))?;
        if let Some(f) = stopped {
            return Err(failed(f));
        }
        let last = *parts
            .last()
            .ok_or(DbError::Internal("a checkpoint without parts"))?;
        if !self.wait_melded(last) {
            return Err(failed(CheckpointFailure::Closed));
        }
        if self.follow.lock().last_complete.as_ref() != Some(&(begin, parts.clone())) {
            return Err(failed(CheckpointFailure::Superseded { begin }));
        }
        let ptr = Pointer {
            db_id: self.settings.db_id,
            begin,
            parts,
        };
        let at = self
            .rt
            .block_on(self.client.append(&comp, ptr.encode()))
            .map_err(|source| {
                failed(CheckpointFailure::Append {
                    log: comp.clone(),
                    source,
                })
            })?;
        // Joiners read only the newest pointers: the companion log keeps
        // those and no more.
        if let Some(below) = at
            .checked_sub(super::published::TRIES - 1)
            .filter(|b| *b > 0)
        {
            self.rt
                .block_on(self.client.trim(&comp, below))
                .map_err(|source| {
                    failed(CheckpointFailure::Trim {
                        log: comp.clone(),
                        below,
                        source,
                    })
                })?;
        }
        // Two checkpoints stay readable: a joiner that read the previous
        // pointer a moment ago still finds its parts.
        let mut trimmed = None;
        if let Some(prev) = self.previous.filter(|_| self.trim) {
            self.rt
                .block_on(self.client.trim(&self.log, prev))
                .map_err(|source| {
                    failed(CheckpointFailure::Trim {
                        log: self.log.clone(),
                        below: prev,
                        source,
                    })
                })?;
            trimmed = Some(prev);
        }
        self.previous = Some(begin);
        Ok((
            CheckpointInfo {
                first: begin,
                pos: last,
                csn: state.csn(),
                nodes: encoded.nodes,
                bytes,
                flushed_ephemeral: 0,
                micros: started.elapsed().as_micros() as u64,
            },
            trimmed,
        ))
    }
}

/// How long `Database::checkpoint` on a publishing node waits at most.
pub(crate) const CHECKPOINT_WAIT: Duration = Duration::from_secs(600);
