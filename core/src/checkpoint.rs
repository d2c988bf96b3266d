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
//! Checkpoints are only recognised with premeld and group meld off (their
//! states at fixed distances would cross barriers); with either on, a
//! checkpoint entry is just malformed and aborts like any other.
//!
//! The format is specified in `docs/format.md` ("Checkpoint records").

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use integer_encoding::VarInt;

use crate::codec::Reader;
use crate::error::{CheckpointError, DecodeError, MAX_KEY_LEN, MAX_VALUE_LEN};
use crate::genesis::Settings;
use crate::node::{
    height, oldest_from, Bytes, Link, LogPos, Node, Owner, OwnerKind, Vn, NO_LOGGED_NODE,
    SUBTREE_ONLY_READ,
};
use crate::snapshot::{Digest, Snapshot};

#[cfg(doc)]
use crate::meld::AbortReason;

/// Magic bytes of a checkpoint part.
pub const CHECKPOINT_MAGIC: &[u8; 4] = b"MLDC";
/// Checkpoint format version written and read by this build.
pub const CHECKPOINT_VERSION: u8 = 1;
/// Default largest chunk of the body one part carries.
pub const DEFAULT_PART_BYTES: usize = 1 << 20;
/// Most parts one checkpoint may have.
pub const MAX_PARTS: u64 = 1 << 16;
/// Largest accepted chunk in one part (the intention size limit).
pub const MAX_PART_BYTES: usize = crate::error::MAX_INTENTION_BYTES - 1024;

const NODE_LEFT: u8 = 1;
const NODE_RIGHT: u8 = 2;
const NODE_LOGGED: u8 = 4;
/// Deepest tree accepted (an AVL tree of 2^64 keys is shallower).
const MAX_HEIGHT: u8 = 100;

/// Whether `bytes` is a checkpoint part that this database recognises:
/// it starts with [`CHECKPOINT_MAGIC`] and premeld and group meld are off.
pub fn applies(settings: &Settings, bytes: &[u8]) -> bool {
    !settings.premeld() && !settings.group_meld && bytes.starts_with(CHECKPOINT_MAGIC)
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
        /// Number of parts.
        count: u64,
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
    let count = r.varint("checkpoint part count")?;
    if count == 0 || count > MAX_PARTS {
        return Err(DecodeError::Limit {
            field: "checkpoint part count",
            value: count,
            limit: MAX_PARTS,
        });
    }
    if index >= count {
        return Err(DecodeError::Invalid {
            field: "checkpoint part index",
            why: "not below the part count",
        });
    }
    Ok(Record::Part {
        db_id,
        begin,
        index,
        count,
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
    /// Not a checkpoint record (for this database's settings).
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
    /// `(begin position, next index, part count once known)` while a
    /// checkpoint is in progress.
    open: Option<(LogPos, u64, Option<u64>)>,
}

impl Tracker {
    /// The tracker of a node that starts from the checkpoint begun at
    /// `begin`: it expects that checkpoint's parts next, as the node that
    /// wrote them did.
    pub fn resuming(begin: LogPos) -> Tracker {
        Tracker {
            open: Some((begin, 0, None)),
        }
    }

    /// Feeds the entry at `pos` and says what it is.
    pub fn feed(&mut self, settings: &Settings, pos: LogPos, bytes: &[u8]) -> TrackEvent {
        if !applies(settings, bytes) {
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
                self.open = Some((pos, 0, None));
                TrackEvent::Begin
            }
            Record::Part {
                begin,
                index,
                count,
                ..
            } => {
                let Some((b, next, known)) = self.open else {
                    return TrackEvent::Invalid(DecodeError::Invalid {
                        field: "checkpoint part",
                        why: "no checkpoint in progress",
                    });
                };
                if begin != b || index != next || known.is_some_and(|c| c != count) {
                    return TrackEvent::Invalid(DecodeError::Invalid {
                        field: "checkpoint part",
                        why: "part out of place (not the next part of the checkpoint in progress)",
                    });
                }
                if index + 1 == count {
                    self.open = None;
                    return TrackEvent::Complete { begin };
                }
                self.open = Some((b, next + 1, Some(count)));
                TrackEvent::Part
            }
        }
    }
}

/// Encodes `state`, the state at the checkpoint's begin record (its
/// position is `state.pos()`), as parts of at most `part_bytes` of body
/// each, to be appended after the begin record in order (other entries may
/// come between them). The state's digest is recorded so a loader can
/// verify what it rebuilt.
pub fn encode(
    settings: &Settings,
    state: &Snapshot,
    part_bytes: usize,
) -> Result<Vec<Vec<u8>>, CheckpointError> {
    let part_bytes = part_bytes.clamp(1, MAX_PART_BYTES);
    let mut nodes = Vec::new();
    let count_nodes = encode_tree(&state.root, &mut nodes);
    let genesis = settings.encode();
    let mut head = Vec::with_capacity(genesis.len() + 32);
    put(&mut head, genesis.len() as u64);
    head.extend_from_slice(&genesis);
    put(&mut head, state.csn);
    put(&mut head, count_nodes);
    let len = head.len() + 32 + nodes.len() + 4;
    let count = len.div_ceil(part_bytes) as u64;
    if count > MAX_PARTS {
        return Err(CheckpointError::TooLarge { bytes: len as u64 });
    }
    let digest = state.digest();
    let mut body = head;
    body.reserve_exact(32 + nodes.len() + 4);
    body.extend_from_slice(&digest);
    body.extend_from_slice(&nodes);
    drop(nodes);
    // The digest covers what the state means; this covers every byte
    // (a node's origin, say, can change without changing the digest).
    let crc = crc32fast::hash(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    let chunks: Vec<&[u8]> = body.chunks(part_bytes).collect();
    Ok(frame(settings.db_id, state.pos, &chunks))
}

fn frame(db_id: u64, begin: LogPos, chunks: &[&[u8]]) -> Vec<Vec<u8>> {
    let count = chunks.len() as u64;
    chunks
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let mut out = Vec::with_capacity(chunk.len() + 40);
            out.extend_from_slice(CHECKPOINT_MAGIC);
            out.push(CHECKPOINT_VERSION);
            out.push(KIND_PART);
            put(&mut out, db_id);
            put(&mut out, begin);
            put(&mut out, i as u64);
            put(&mut out, count);
            out.extend_from_slice(chunk);
            let crc = crc32fast::hash(&out);
            out.extend_from_slice(&crc.to_le_bytes());
            out
        })
        .collect()
}

fn put(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 10];
    let n = v.encode_var(&mut buf);
    out.extend_from_slice(&buf[..n]);
}

/// Post-order: children before parents, so the loader needs only a stack.
fn encode_tree(t: &Link, out: &mut Vec<u8>) -> u64 {
    let Some(n) = t else { return 0 };
    let count = encode_tree(&n.left, out) + encode_tree(&n.right, out) + 1;
    let origin = match n.owner.kind {
        OwnerKind::Intention(pos) => Some(pos),
        _ => None,
    };
    let mut tag = 0;
    if n.left.is_some() {
        tag |= NODE_LEFT;
    }
    if n.right.is_some() {
        tag |= NODE_RIGHT;
    }
    if origin.is_some() {
        tag |= NODE_LOGGED;
    }
    out.push(tag);
    put(out, n.key.len() as u64);
    out.extend_from_slice(&n.key);
    put(out, n.value.len() as u64);
    out.extend_from_slice(&n.value);
    let vn = n.vn();
    put(out, vn);
    put(out, vn.saturating_sub(n.ncv()));
    put(out, n.nsv());
    if let Some(p) = origin {
        put(out, p);
    }
    count
}

/// A checkpoint rebuilt from its parts.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The database settings recorded in it.
    pub settings: Settings,
    /// The state at the checkpoint's begin record.
    pub state: Snapshot,
    /// Nodes rebuilt.
    pub nodes: u64,
}

/// Rebuilds the state of a complete checkpoint from its parts, in order.
/// Verifies every part, that they belong together, the tree (key order,
/// AVL balance, depth), the body checksum and the recorded digest. Never
/// panics.
pub fn load(parts: &[&[u8]]) -> Result<Loaded, CheckpointError> {
    let mut body = Vec::new();
    let mut first: Option<(u64, LogPos)> = None;
    for (i, p) in parts.iter().enumerate() {
        let rec = parse_record(p).map_err(|e| CheckpointError::Part {
            index: i as u64,
            source: e,
        })?;
        let Record::Part {
            db_id,
            begin,
            index,
            count,
            chunk,
        } = rec
        else {
            return Err(CheckpointError::Incomplete {
                index: i as u64,
                why: "a begin record where a part was expected",
            });
        };
        if index != i as u64 || count != parts.len() as u64 {
            return Err(CheckpointError::Incomplete {
                index: i as u64,
                why: "parts are not the parts of one checkpoint, in order",
            });
        }
        if *first.get_or_insert((db_id, begin)) != (db_id, begin) {
            return Err(CheckpointError::Incomplete {
                index: i as u64,
                why: "parts belong to different checkpoints",
            });
        }
        body.extend_from_slice(chunk);
    }
    let Some((db_id, begin)) = first else {
        return Err(CheckpointError::Incomplete {
            index: 0,
            why: "no parts",
        });
    };
    let Some(split) = body.len().checked_sub(4) else {
        return Err(CheckpointError::Body(DecodeError::Truncated {
            field: "checkpoint body",
        }));
    };
    let (content, crc) = body.split_at(split);
    if crc32fast::hash(content).to_le_bytes() != crc {
        return Err(CheckpointError::Body(DecodeError::Checksum));
    }
    let body = content;
    let mut r = Reader { buf: body, at: 0 };
    let settings = Settings::decode(r.bytes("checkpoint settings", 64)?)?;
    if settings.db_id != db_id {
        return Err(CheckpointError::Body(DecodeError::Invalid {
            field: "checkpoint settings",
            why: "db_id differs from the parts' db_id",
        }));
    }
    let csn = r.varint("checkpoint csn")?;
    let count = r.varint("checkpoint node count")?;
    let digest: Digest =
        r.take(32, "checkpoint digest")?
            .try_into()
            .map_err(|_| DecodeError::Truncated {
                field: "checkpoint digest",
            })?;
    // A node takes at least 6 bytes: no count beyond that can be honest.
    if count > r.remaining() as u64 / 6 {
        return Err(CheckpointError::Body(DecodeError::Limit {
            field: "checkpoint node count",
            value: count,
            limit: r.remaining() as u64 / 6,
        }));
    }
    let root = build_tree(&mut r, count, csn)?;
    if r.at != body.len() {
        return Err(CheckpointError::Body(DecodeError::Trailing(
            body.len() - r.at,
        )));
    }
    let state = Snapshot {
        root,
        pos: begin,
        csn,
        db: settings.db_id,
    };
    if state.digest() != digest {
        return Err(CheckpointError::Digest);
    }
    Ok(Loaded {
        settings,
        state,
        nodes: count,
    })
}

/// A subtree on the loader's stack with its key bounds.
struct Built {
    node: Arc<Node>,
    min: Bytes,
    max: Bytes,
}

fn build_tree(r: &mut Reader<'_>, count: u64, csn: Vn) -> Result<Link, CheckpointError> {
    let bad = |why| CheckpointError::Body(DecodeError::BadTree { why });
    let ephemeral = Owner::new(OwnerKind::Ephemeral, 0);
    let mut owners: BTreeMap<LogPos, Arc<Owner>> = BTreeMap::new();
    let mut stack: Vec<Built> = Vec::new();
    for _ in 0..count {
        let tag = r.u8("checkpoint node tag")?;
        if tag & !(NODE_LEFT | NODE_RIGHT | NODE_LOGGED) != 0 {
            return Err(bad("unknown node tag bits"));
        }
        let key = Bytes::from(r.bytes("checkpoint key", MAX_KEY_LEN)?);
        let value = Bytes::from(r.bytes("checkpoint value", MAX_VALUE_LEN)?);
        let vn = r.varint("checkpoint vn")?;
        let ncv_delta = r.varint("checkpoint content version")?;
        let nsv = r.varint("checkpoint structure version")?;
        if vn == 0 || vn > csn || ncv_delta >= vn || nsv > csn {
            return Err(bad("version numbers out of range"));
        }
        let origin = if tag & NODE_LOGGED != 0 {
            let p = r.varint("checkpoint node origin")?;
            if p == NO_LOGGED_NODE {
                return Err(bad("node origin out of range"));
            }
            Some(p)
        } else {
            None
        };
        let right = if tag & NODE_RIGHT != 0 {
            Some(stack.pop().ok_or_else(|| bad("child missing"))?)
        } else {
            None
        };
        let left = if tag & NODE_LEFT != 0 {
            Some(stack.pop().ok_or_else(|| bad("child missing"))?)
        } else {
            None
        };
        if left.as_ref().is_some_and(|l| l.max[..] >= key[..])
            || right.as_ref().is_some_and(|r| r.min[..] <= key[..])
        {
            return Err(bad("keys out of order"));
        }
        let (min, max) = (
            left.as_ref().map_or_else(|| key.clone(), |l| l.min.clone()),
            right
                .as_ref()
                .map_or_else(|| key.clone(), |r| r.max.clone()),
        );
        let l: Link = left.map(|b| b.node);
        let rr: Link = right.map(|b| b.node);
        let (hl, hr) = (height(&l), height(&rr));
        if hl.abs_diff(hr) > 1 {
            return Err(bad("unbalanced subtree"));
        }
        let h = hl.max(hr) + 1;
        if h > MAX_HEIGHT {
            return Err(bad("tree too deep"));
        }
        let owner = match origin {
            Some(p) => owners
                .entry(p)
                .or_insert_with(|| Owner::new(OwnerKind::Intention(p), 0))
                .clone(),
            None => ephemeral.clone(),
        };
        let oldest = oldest_from(&l, &rr, origin.unwrap_or(NO_LOGGED_NODE));
        let node = Node {
            key: key.clone(),
            left: l,
            right: rr,
            vn_cache: AtomicU64::new(vn),
            scv: vn - ncv_delta,
            flags: SUBTREE_ONLY_READ,
            height: h,
            seq: 0,
            ssv: nsv,
            owner,
            value,
            ranges: None,
            oldest,
        };
        stack.push(Built {
            node: Arc::new(node),
            min,
            max,
        });
    }
    match stack.len() {
        0 if count == 0 => Ok(None),
        1 => Ok(stack.pop().map(|b| b.node)),
        _ => Err(bad("more than one root")),
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
        let own = u64::from(n.owner.kind == OwnerKind::Ephemeral && n.vn() > since);
        own + walk(&n.left, since) + walk(&n.right, since)
    }
    walk(&state.root, since)
}
