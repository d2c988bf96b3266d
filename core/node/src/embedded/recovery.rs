//! Recovery on open: the latest checkpoint that verifies (loaded whole,
//! or lazily behind the node cache), older ones or the genesis record as
//! fallbacks.

use std::path::Path;
use std::sync::Arc;

use melddb::{checkpoint, DecodeError, Log, LogPos, Melder, Outcome, Settings};

use super::error::{DbError, Unrecoverable};
use super::stats::CheckpointInfo;
use crate::filelog::{FileLog, FileLogError};
use crate::nodestore::LogStore;

/// Where recovery starts: a melder at the latest usable checkpoint (or at
/// the genesis record), and what it found on the way.
pub(super) struct Start {
    pub(super) melder: Melder,
    pub(super) checkpoint: Option<CheckpointInfo>,
    /// First part of the checkpoint used: the next one trims below it.
    pub(super) previous_first: Option<LogPos>,
    pub(super) skipped: Vec<String>,
    /// The next free node store generation.
    pub(super) generation: u16,
}

/// Finds the complete checkpoints in the log (from the records' bytes,
/// as every melder does), loads the latest one that verifies, and falls
/// back to older ones, then to the genesis record if the log still has it.
pub(super) fn recover(
    log: &FileLog,
    dir: &Path,
    store: Option<&Arc<LogStore>>,
    cache_bytes: u64,
) -> Result<Start, DbError> {
    let not_db = |source: DecodeError| DbError::NotADatabase {
        path: dir.to_path_buf(),
        source,
    };
    let first = log.first();
    let settings = if first == 0 {
        let head = log.read(0)?;
        Settings::decode(&head).map_err(not_db)?
    } else {
        // Trimmed: the log starts at a checkpoint's begin record, and the
        // settings are at the start of its first part, a little later.
        match first_part_settings(log)? {
            Some(Ok(s)) => s,
            Some(Err(e)) => return Err(not_db(e)),
            None => {
                return Err(DbError::Unrecoverable {
                    path: dir.to_path_buf(),
                    cause: Unrecoverable::NoCheckpoint {
                        first,
                        tried: Vec::new(),
                    },
                })
            }
        }
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
            cause: Unrecoverable::NoCheckpoint {
                first,
                tried: skipped,
            },
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
pub(crate) fn load_whole(
    log: &FileLog,
    positions: &[LogPos],
) -> Result<(checkpoint::Loaded, u64), String> {
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
pub(crate) fn load_lazily(
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

/// Registers the checkpoint part at `pos` (its bytes `rec`) with the node
/// store.
pub(crate) fn register_part(
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

/// The settings in the first checkpoint part found from the log's start.
pub(super) fn first_part_settings(
    log: &FileLog,
) -> Result<Option<Result<Settings, DecodeError>>, FileLogError> {
    let mut found = None;
    for pos in log.first()..log.tail() {
        let rec = log.read(pos)?;
        if let Ok(checkpoint::Record::Part { index: 0, .. }) = checkpoint::parse_record(&rec) {
            match checkpoint::peek_settings(&rec) {
                Ok(s) => return Ok(Some(Ok(s))),
                Err(e) => found = Some(Err(e)),
            }
        }
    }
    Ok(found)
}

/// With group meld on, an entry that ends the log in the middle of a pair
/// is decided only with its partner: append an empty filler (rejected as
/// malformed by every node) so it is decided now.
pub(super) fn close_pair(log: &mut FileLog, melder: &mut Melder) -> Result<Vec<Outcome>, DbError> {
    if melder.next_pos() == melder.lcs().pos() + 1 {
        return Ok(Vec::new());
    }
    log.append(&[])?;
    Ok(melder.apply(&[]))
}
