//! The node directory's own checkpoints, for a node on a shared log.
//!
//! Whenever the node melds a checkpoint begin record of the shared log
//! (anyone's: a publisher's, or a bare one some node appended) and enough
//! of the log was melded since its last local checkpoint, it encodes the
//! state at that record into a segment-file log of its own,
//! `DIR/checkpoints`, on a thread of its own. That gives the node two
//! things the shared log cannot: addresses for its node cache (stubs read
//! evicted subtrees back from these files, as the embedded node's do from
//! its log), and a start for a restart that needs neither the service's
//! published checkpoints nor a replay from genesis.
//!
//! The file holds checkpoint parts only, exactly as the engine encodes
//! them; each names the shared log's position of its begin record, which
//! is where a node that loads it goes on melding. Consecutive parts 0 to
//! the last with the same begin form a complete checkpoint; anything else
//! (a part cut by a crash) is ignored. After each new one, the file is
//! trimmed below the one before it, unless a stub still reads from there.
//!
//! A node directory belongs to one log: `DIR/shared-log` holds the URL it
//! was connected to. Connected to another, the node discards the
//! checkpoints (they hold another database) and starts the file afresh.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use melddb::{checkpoint, Log, LogPos, Settings, Snapshot};

use crate::embedded::recovery::{load_lazily, load_whole, register_part};
use crate::embedded::{CheckpointFailure, CheckpointInfo, DbError};
use crate::filelog::{FileLog, FileLogError};
use crate::nodestore::LogStore;

/// Name of the checkpoint file log inside the node directory.
pub(crate) const DIR_NAME: &str = "checkpoints";

/// Name of the file naming the log the directory belongs to.
const IDENTITY: &str = "shared-log";

/// One complete checkpoint in the file.
#[derive(Debug, Clone)]
struct Local {
    /// The shared log's position of its begin record.
    begin: LogPos,
    /// Its node store generation (0: not registered with the store).
    generation: u16,
    /// Its parts' positions in the file.
    parts: Vec<LogPos>,
}

/// The checkpoint file log of a node on a shared log, and the node store
/// that reads evicted nodes back from it.
pub(crate) struct LocalCheckpoints {
    /// `None` until the first checkpoint is written, when the directory
    /// has none yet (creating a segment file costs two fsyncs, which a
    /// node joining a log should not wait for).
    log: Option<FileLog>,
    path: PathBuf,
    segment_bytes: u64,
    store: Arc<LogStore>,
    /// Complete checkpoints, oldest first.
    complete: Vec<Local>,
    next_generation: u16,
    /// Times a trim waited for stubs that still read below it.
    pub trims_held: u64,
}

/// A checkpoint of the file, loaded.
pub(crate) struct Loaded {
    pub begin: LogPos,
    pub loaded: checkpoint::Loaded,
}

impl LocalCheckpoints {
    /// Opens (or creates) `dir/checkpoints` for the log at `url` and finds
    /// its complete checkpoints (none if the directory belonged to
    /// another log).
    pub fn open(
        dir: &Path,
        url: &str,
        segment_bytes: u64,
        store: Arc<LogStore>,
    ) -> Result<LocalCheckpoints, DbError> {
        let path = dir.join(DIR_NAME);
        let mut log = match path.exists() {
            true => Some(FileLog::open_with(&path, segment_bytes)?.0),
            false => None,
        };
        let id_path = dir.join(IDENTITY);
        let io = |source: std::io::Error| {
            DbError::from(FileLogError::Io {
                path: id_path.clone(),
                source,
            })
        };
        let ours = std::fs::read_to_string(&id_path).ok().as_deref() == Some(url);
        if !ours {
            // Written from another log (or before this file existed):
            // nothing in it may start this node.
            if let Some(log) = log.as_mut() {
                log.trim(log.tail())?;
            }
            let tmp = dir.join(format!("{IDENTITY}.tmp"));
            std::fs::write(&tmp, url).map_err(io)?;
            std::fs::rename(&tmp, &id_path).map_err(io)?;
        }
        let mut complete = Vec::new();
        let mut open: Option<Local> = None;
        let mut scan = |pos: LogPos, e: &[u8]| {
            let Ok(checkpoint::Record::Part {
                begin, index, last, ..
            }) = checkpoint::parse_record(e)
            else {
                open = None;
                return;
            };
            let mut cur = match open.take() {
                Some(c) if c.begin == begin && c.parts.len() as u64 == index => c,
                _ if index == 0 => Local {
                    begin,
                    generation: 0,
                    parts: Vec::new(),
                },
                _ => return,
            };
            cur.parts.push(pos);
            if last {
                complete.push(cur);
            } else {
                open = Some(cur);
            }
        };
        if let Some(log) = &log {
            log.replay(log.first(), |pos, e| scan(pos, e))?;
        }
        Ok(LocalCheckpoints {
            log,
            path,
            segment_bytes,
            store,
            complete,
            next_generation: 1,
            trims_held: 0,
        })
    }

    /// The shared log's position of the newest complete checkpoint.
    pub fn newest_begin(&self) -> Option<LogPos> {
        self.complete.last().map(|c| c.begin)
    }

    /// Loads the newest checkpoint that verifies, begun at `min_begin` or
    /// later and with `settings` (if known): whole, or lazily behind the
    /// node cache when its tree may not fit `cache_bytes`. Each one
    /// skipped is described in `skipped`.
    pub fn load_newest(
        &mut self,
        min_begin: LogPos,
        settings: Option<&Settings>,
        cache_bytes: u64,
        skipped: &mut Vec<String>,
    ) -> Option<Loaded> {
        let log = self.log.as_ref()?;
        for i in (0..self.complete.len()).rev() {
            let c = self.complete[i].clone();
            if c.begin < min_begin {
                break;
            }
            let encoded: u64 = c
                .parts
                .iter()
                .map(|p| log.record_len(*p).unwrap_or(u64::MAX / 4))
                .fold(0, u64::saturating_add);
            let lazy = cache_bytes > 0 && encoded.saturating_mul(2) > cache_bytes;
            let generation = take_generation(&mut self.next_generation, &self.store);
            let result = if lazy {
                load_lazily(log, &c.parts, &self.store, generation, c.begin)
            } else {
                load_whole(log, &c.parts)
            };
            let result = result.and_then(|(l, _)| {
                if settings.is_some_and(|s| *s != l.settings) {
                    Err("its settings differ from the log's".to_string())
                } else if l.state.pos() != c.begin {
                    Err("its parts name another begin record".into())
                } else {
                    Ok(l)
                }
            });
            match result {
                Ok(loaded) => {
                    if lazy {
                        self.store.complete(generation);
                        self.complete[i].generation = generation;
                    }
                    return Some(Loaded {
                        begin: c.begin,
                        loaded,
                    });
                }
                Err(why) => {
                    self.store.remove(generation);
                    skipped.push(format!(
                        "{}: checkpoint begun at {}: {why}",
                        DIR_NAME, c.begin
                    ));
                }
            }
        }
        None
    }

    /// Writes a checkpoint of `state`, the state at the shared log's begin
    /// record at `state.pos()`, registers it with the node store once it
    /// is durable, and trims the file below the checkpoint before it.
    pub fn write(
        &mut self,
        settings: &Settings,
        state: &Snapshot,
        part_bytes: usize,
    ) -> Result<CheckpointInfo, DbError> {
        let started = Instant::now();
        let begin = state.pos();
        let generation = take_generation(&mut self.next_generation, &self.store);
        if self.log.is_none() {
            self.log = Some(FileLog::open_with(&self.path, self.segment_bytes)?.0);
        }
        let log = self
            .log
            .as_mut()
            .ok_or(DbError::Internal("the checkpoint file log was just opened"))?;
        // Each part is registered as it is appended (the store reads none
        // until the checkpoint is complete), so no more than one part is
        // held in memory.
        let (mut parts, mut bytes) = (Vec::new(), 0u64);
        let mut failed: Option<DbError> = None;
        let store = &self.store;
        let encoded =
            checkpoint::encode_streaming(settings, state, part_bytes, Some(generation), |part| {
                match log.append(&part) {
                    Ok(pos) => {
                        bytes += part.len() as u64;
                        parts.push(pos);
                        match register_part(log, store, generation, begin, pos, &part) {
                            Ok(()) => true,
                            Err(_) => {
                                failed = Some(DbError::Internal(
                                    "a checkpoint part just written does not parse",
                                ));
                                false
                            }
                        }
                    }
                    Err(e) => {
                        failed = Some(e.into());
                        false
                    }
                }
            })
            .map_err(|source| DbError::Checkpoint(CheckpointFailure::Encode { begin, source }))?;
        if let Some(e) = failed {
            self.store.remove(generation);
            return Err(e);
        }
        log.sync()?;
        self.store.complete(generation);
        let last = parts.last().copied().unwrap_or(0);
        self.complete.push(Local {
            begin,
            generation,
            parts,
        });
        self.trim()?;
        Ok(CheckpointInfo {
            first: begin,
            pos: last,
            csn: state.csn(),
            nodes: encoded.nodes,
            bytes,
            flushed_ephemeral: 0,
            micros: started.elapsed().as_micros() as u64,
        })
    }

    /// Trims the file below the second newest checkpoint (two stay, so a
    /// damaged one leaves another), unless a stub still reads below it.
    fn trim(&mut self) -> Result<(), DbError> {
        let Some(keep) = self.complete.len().checked_sub(2) else {
            return Ok(());
        };
        let below = self.complete[keep].parts[0];
        let dropped = &self.complete[..keep];
        if dropped
            .iter()
            .any(|c| c.generation != 0 && self.store.pins(c.generation) > 0)
        {
            self.trims_held += 1;
            return Ok(());
        }
        for c in dropped {
            if c.generation != 0 {
                self.store.remove(c.generation);
            }
        }
        self.complete.drain(..keep);
        if let Some(log) = self.log.as_mut().filter(|l| below > l.first()) {
            log.trim(below)?;
        }
        Ok(())
    }
}

/// The next node store generation (they wrap; 0 is never used), forgotten
/// by `store` in case an old checkpoint still had it.
fn take_generation(next: &mut u16, store: &LogStore) -> u16 {
    let g = *next;
    *next = g.checked_add(1).unwrap_or(1);
    store.remove(g);
    g
}
