//! Checkpoints (meld paper App. A, adapted): a committed state written to
//! the log so that a node can recover from it instead of replaying the log
//! from the genesis record, and so that the log before it can be trimmed.
//!
//! # Design
//!
//! Our tree lives in memory, so a checkpoint here is *self-contained*: it
//! serialises every node reachable from the state (ephemeral and logged
//! ones alike) with its identity (VN), content and structure versions and
//! OldestDescendant origin. Recovering from it needs no earlier log entry,
//! which is what lets garbage collection trim everything before it.
//!
//! A checkpoint is a *begin* record at position `m` followed, later, by
//! `count` *parts* carrying the encoded state after `m`. Parts may be
//! interleaved with ordinary intentions: the writer encodes the state on
//! another thread while commits go on. Whether records form a complete
//! checkpoint is decided from their bytes alone (the [`Tracker`]), so every
//! node — one that melded the whole log, one that recovered from an
//! earlier checkpoint, or a pipelined one — agrees.
//!
//! The begin record is a *barrier*: the state does not change, but every
//! node drops all states before it and its tombstones, and no intention
//! after it may use a snapshot older than it (a node that recovers from
//! this checkpoint starts with the state at `m` and nothing older). Such an
//! intention aborts with [`AbortReason::SnapshotUnavailable`] on every
//! node. Tombstones can go because every deletion they remember precedes
//! every snapshot still accepted. Parts change nothing; a node recovering
//! from the checkpoint loads the state at `m` and melds every entry after
//! `m`, parts included (as no-ops), exactly as the running node did.
//!
//! With premeld and group meld on, checkpoint records follow two more
//! rules, so that the state at a begin record exists and nothing needs a
//! state behind it: a record never joins a group-meld pair (the pair's
//! other member is melded alone), and premeld never reaches behind the
//! latest begin record (see [`crate::pipeline::premeld_input`]).
//!
//! The format is specified in `docs/format.md` ("Checkpoint records").

mod encode;
mod load;
mod node_record;
mod pointer;

pub use self::encode::{encode, encode_streaming, Encoded};
pub use self::load::{load, load_lazy, Loaded};
use self::node_record::put;
pub(crate) use self::node_record::read_node;
pub use self::pointer::Pointer;

use crate::codec::Reader;
use crate::error::DecodeError;
use crate::genesis::Settings;
use crate::node::{Link, LogPos, OwnerKind, Vn};
use crate::snapshot::Snapshot;

#[cfg(doc)]
use crate::meld::AbortReason;

/// Magic bytes of a checkpoint part.
pub const CHECKPOINT_MAGIC: &[u8; 4] = b"MLDC";
/// Checkpoint format version written and read by this build.
pub const CHECKPOINT_VERSION: u8 = 2;
/// Default largest chunk of the body one part carries.
pub const DEFAULT_PART_BYTES: usize = 1 << 20;
/// Most parts one checkpoint may have.
pub const MAX_PARTS: u64 = 1 << 16;
/// Largest accepted chunk in one part (the intention size limit).
pub const MAX_PART_BYTES: usize = crate::error::MAX_INTENTION_BYTES - 1024;

/// Whether the log entry `bytes` is a checkpoint record (well formed or
/// not): it starts with [`CHECKPOINT_MAGIC`].
pub fn applies(bytes: &[u8]) -> bool {
    bytes.starts_with(CHECKPOINT_MAGIC)
}

const KIND_BEGIN: u8 = 0;
const KIND_PART: u8 = 1;

/// A parsed checkpoint record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// The begin record (the barrier): the checkpoint holds the state here.
    Begin {
        /// Database the checkpoint belongs to.
        db_id: u64,
    },
    /// One part of the encoded state.
    Part {
        /// Database the checkpoint belongs to.
        db_id: u64,
        /// Log position of the checkpoint's begin record.
        begin: LogPos,
        /// 0-based index of this part.
        index: u64,
        /// Whether this is the checkpoint's last part.
        last: bool,
        /// This part's slice of the body.
        chunk: &'a [u8],
    },
}

/// Encodes the begin record of a checkpoint.
pub fn begin_record(db_id: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(CHECKPOINT_MAGIC);
    out.push(CHECKPOINT_VERSION);
    out.push(KIND_BEGIN);
    put(&mut out, db_id);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Parses one checkpoint record (begin or part).
pub fn parse_record(bytes: &[u8]) -> Result<Record<'_>, DecodeError> {
    if bytes.len() > crate::error::MAX_INTENTION_BYTES {
        return Err(DecodeError::Limit {
            field: "checkpoint part size",
            value: bytes.len() as u64,
            limit: crate::error::MAX_INTENTION_BYTES as u64,
        });
    }
    let body = crate::codec::checked_body(bytes, CHECKPOINT_MAGIC, "checkpoint", 10)?;
    if body[4] != CHECKPOINT_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            found: body[4],
            supported: CHECKPOINT_VERSION,
        });
    }
    let kind = body[5];
    let mut r = Reader { buf: body, at: 6 };
    let db_id = r.varint("checkpoint db_id")?;
    if kind == KIND_BEGIN {
        if r.at != body.len() {
            return Err(DecodeError::Trailing(body.len() - r.at));
        }
        return Ok(Record::Begin { db_id });
    }
    if kind != KIND_PART {
        return Err(DecodeError::Invalid {
            field: "checkpoint record kind",
            why: "neither begin nor part",
        });
    }
    let begin = r.varint("checkpoint begin position")?;
    let index = r.varint("checkpoint part index")?;
    if index >= MAX_PARTS {
        return Err(DecodeError::Limit {
            field: "checkpoint part index",
            value: index,
            limit: MAX_PARTS - 1,
        });
    }
    let last = match r.u8("checkpoint last-part flag")? {
        0 => false,
        1 => true,
        _ => {
            return Err(DecodeError::Invalid {
                field: "checkpoint last-part flag",
                why: "neither 0 nor 1",
            })
        }
    };
    Ok(Record::Part {
        db_id,
        begin,
        index,
        last,
        chunk: &body[r.at..],
    })
}

/// The database settings recorded at the start of a checkpoint's first
/// part (a log trimmed up to a checkpoint no longer has its genesis record).
pub fn peek_settings(first_part: &[u8]) -> Result<Settings, DecodeError> {
    let (db_id, chunk) = match parse_record(first_part)? {
        Record::Part {
            db_id,
            index: 0,
            chunk,
            ..
        } => (db_id, chunk),
        _ => {
            return Err(DecodeError::Invalid {
                field: "checkpoint part index",
                why: "settings are in the first part",
            })
        }
    };
    let mut r = Reader { buf: chunk, at: 0 };
    let settings = Settings::decode(r.bytes("checkpoint settings", 64)?)?;
    if settings.db_id != db_id {
        return Err(DecodeError::Invalid {
            field: "checkpoint settings",
            why: "db_id differs from the part's db_id",
        });
    }
    Ok(settings)
}

/// What one log entry means for checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackEvent {
    /// Not a checkpoint record.
    NotCheckpoint,
    /// A begin record: a barrier, and a checkpoint in progress from here.
    Begin,
    /// A valid part, not the last one.
    Part,
    /// The last part: the checkpoint begun at `begin` is complete here.
    Complete {
        /// Position of its begin record (the state it holds is the one there).
        begin: LogPos,
    },
    /// A checkpoint record that is malformed, of another database, or out
    /// of place; the entry aborts (a checkpoint in progress is unaffected).
    Invalid(DecodeError),
}

/// Follows checkpoint records through the log from their bytes alone (see
/// the module docs). Every node feeds it every entry in log order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tracker {
    /// `(begin position, next part index)` while a checkpoint is in
    /// progress.
    open: Option<(LogPos, u64)>,
}

impl Tracker {
    /// The tracker of a node that starts from the checkpoint begun at
    /// `begin`: it expects that checkpoint's parts next, as the node that
    /// wrote them did.
    pub fn resuming(begin: LogPos) -> Tracker {
        Tracker {
            open: Some((begin, 0)),
        }
    }

    /// Feeds the entry at `pos` and says what it is.
    pub fn feed(&mut self, settings: &Settings, pos: LogPos, bytes: &[u8]) -> TrackEvent {
        if !applies(bytes) {
            return TrackEvent::NotCheckpoint;
        }
        let rec = match parse_record(bytes) {
            Ok(r) => r,
            Err(e) => return TrackEvent::Invalid(e),
        };
        let db_id = match rec {
            Record::Begin { db_id } | Record::Part { db_id, .. } => db_id,
        };
        if db_id != settings.db_id {
            return TrackEvent::Invalid(DecodeError::Invalid {
                field: "checkpoint db_id",
                why: "belongs to another database",
            });
        }
        match rec {
            Record::Begin { .. } => {
                self.open = Some((pos, 0));
                TrackEvent::Begin
            }
            Record::Part {
                begin, index, last, ..
            } => {
                let Some((b, next)) = self.open else {
                    return TrackEvent::Invalid(DecodeError::Invalid {
                        field: "checkpoint part",
                        why: "no checkpoint in progress",
                    });
                };
                if begin != b || index != next {
                    return TrackEvent::Invalid(DecodeError::Invalid {
                        field: "checkpoint part",
                        why: "part out of place (not the next part of the checkpoint in progress)",
                    });
                }
                if last {
                    self.open = None;
                    return TrackEvent::Complete { begin };
                }
                self.open = Some((b, next + 1));
                TrackEvent::Part
            }
        }
    }
}

/// Counts the nodes reachable from `state` that are ephemeral (exist only
/// in memory, rebuilt by replaying the log) and newer than `since` (a
/// CSN, typically the last checkpoint's): the state a crash would have to
/// recompute. Skips every subtree whose root is no newer than `since`,
/// so the walk is proportional to what changed.
pub fn unpersisted_nodes(state: &Snapshot, since: Vn) -> u64 {
    fn walk(t: &Link, since: Vn) -> u64 {
        let Some(n) = t else { return 0 };
        // A parent is created after its children (nodes are immutable),
        // so no node below one at or before `since` is newer.
        if n.vn() <= since {
            return 0;
        }
        let own = u64::from(n.owner_kind() == OwnerKind::Ephemeral && n.vn() > since);
        own + walk(n.left(), since) + walk(n.right(), since)
    }
    walk(&state.root, since)
}
