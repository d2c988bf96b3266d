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
    take_store_error, Bytes, Link, LogPos, Node, NodeAddr, NodeStore, Owner, OwnerKind, StoreError,
    Vn, NO_LOGGED_NODE, SUBTREE_ONLY_READ,
};
use crate::snapshot::{Digest, Snapshot};

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

/// Encodes `state`, the state at the checkpoint's begin record (its
/// position is `state.pos()`), as parts of at most `part_bytes` of body
/// each, to be appended after the begin record in order (other entries may
/// come between them). The state's digest is recorded so a loader can
/// verify what it rebuilt. Holds the whole checkpoint in memory; hosts
/// with a node cache use [`encode_streaming`].
pub fn encode(
    settings: &Settings,
    state: &Snapshot,
    part_bytes: usize,
) -> Result<Vec<Vec<u8>>, CheckpointError> {
    let mut parts = Vec::new();
    encode_streaming(settings, state, part_bytes, None, |p| {
        parts.push(p);
        true
    })?;
    Ok(parts)
}

/// What [`encode_streaming`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    /// Parts handed to the sink.
    pub parts: u64,
    /// Nodes written.
    pub nodes: u64,
    /// Body bytes (all parts' chunks together).
    pub body_bytes: u64,
}

/// Encodes `state` like [`encode`], handing each part to `sink` as soon as
/// it is full, so at most about one part is held in memory (subtrees that
/// are stubs are read back one node at a time and not kept). `sink`
/// returns `false` to stop early (the checkpoint then stays incomplete).
///
/// With `generation`, every node written records its address in this
/// checkpoint (a [`NodeAddr`] of that generation), which is what lets the
/// node cache replace it by a stub once the checkpoint is complete.
pub fn encode_streaming(
    settings: &Settings,
    state: &Snapshot,
    part_bytes: usize,
    generation: Option<u16>,
    sink: impl FnMut(Vec<u8>) -> bool,
) -> Result<Encoded, CheckpointError> {
    // Loads below record their failures here; start clean.
    let _ = take_store_error();
    let digest = state.digest();
    if let Some(e) = take_store_error() {
        return Err(CheckpointError::Store(e));
    }
    let mut out = Chunker {
        db_id: settings.db_id,
        begin: state.pos,
        part_bytes: part_bytes.clamp(1, MAX_PART_BYTES),
        buf: Vec::new(),
        offset: 0,
        crc: crc32fast::Hasher::new(),
        index: 0,
        sink,
        stopped: false,
    };
    let genesis = settings.encode();
    let mut head = Vec::with_capacity(genesis.len() + 16);
    put(&mut head, genesis.len() as u64);
    head.extend_from_slice(&genesis);
    put(&mut head, state.csn);
    out.write(&head)?;
    let mut nodes = 0u64;
    let root = match &state.root {
        Some(n) => encode_node(n, &mut out, generation, &mut nodes)?.offset,
        None => 0,
    };
    let mut trailer = Vec::with_capacity(48);
    trailer.extend_from_slice(&nodes.to_le_bytes());
    trailer.extend_from_slice(&root.to_le_bytes());
    trailer.extend_from_slice(&digest);
    out.write(&trailer)?;
    if let Some(e) = take_store_error() {
        return Err(CheckpointError::Store(e));
    }
    let body_bytes = out.offset + 4;
    let parts = out.finish()?;
    Ok(Encoded {
        parts,
        nodes,
        body_bytes,
    })
}

/// Cuts the body into parts as it is written.
struct Chunker<F: FnMut(Vec<u8>) -> bool> {
    db_id: u64,
    begin: LogPos,
    part_bytes: usize,
    buf: Vec<u8>,
    /// Body bytes written so far (the next record's offset).
    offset: u64,
    crc: crc32fast::Hasher,
    index: u64,
    sink: F,
    stopped: bool,
}

impl<F: FnMut(Vec<u8>) -> bool> Chunker<F> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), CheckpointError> {
        self.crc.update(bytes);
        self.buf.extend_from_slice(bytes);
        self.offset += bytes.len() as u64;
        self.emit_full()
    }

    /// Hands out full parts while more than a part is buffered (strictly
    /// more: the last part is never empty).
    fn emit_full(&mut self) -> Result<(), CheckpointError> {
        while self.buf.len() > self.part_bytes {
            let rest = self.buf.split_off(self.part_bytes);
            let chunk = std::mem::replace(&mut self.buf, rest);
            self.emit(&chunk, false)?;
        }
        Ok(())
    }

    fn emit(&mut self, chunk: &[u8], last: bool) -> Result<(), CheckpointError> {
        if self.index >= MAX_PARTS {
            return Err(CheckpointError::TooLarge { bytes: self.offset });
        }
        // A failed read-back means the bytes so far may be an empty
        // node's: never hand out a part built from them.
        if let Some(e) = take_store_error() {
            return Err(CheckpointError::Store(e));
        }
        if !self.stopped && !(self.sink)(frame(self.db_id, self.begin, self.index, last, chunk)) {
            self.stopped = true;
        }
        self.index += 1;
        if self.stopped {
            return Err(CheckpointError::Stopped);
        }
        Ok(())
    }

    fn finish(mut self) -> Result<u64, CheckpointError> {
        let crc = std::mem::take(&mut self.crc).finalize();
        self.buf.extend_from_slice(&crc.to_le_bytes());
        self.emit_full()?;
        let chunk = std::mem::take(&mut self.buf);
        self.emit(&chunk, true)?;
        Ok(self.index)
    }
}

fn frame(db_id: u64, begin: LogPos, index: u64, last: bool, chunk: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunk.len() + 40);
    out.extend_from_slice(CHECKPOINT_MAGIC);
    out.push(CHECKPOINT_VERSION);
    out.push(KIND_PART);
    put(&mut out, db_id);
    put(&mut out, begin);
    put(&mut out, index);
    out.push(u8::from(last));
    out.extend_from_slice(chunk);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn put(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 10];
    let n = v.encode_var(&mut buf);
    out.extend_from_slice(&buf[..n]);
}

/// Where a written node's record is.
#[derive(Clone, Copy)]
struct Written {
    offset: u64,
}

/// Post-order (children before parents) so a full loader needs only a
/// stack; each record also names its children's offsets so a single node
/// can be read back alone.
fn encode_node<F: FnMut(Vec<u8>) -> bool>(
    n: &Arc<Node>,
    out: &mut Chunker<F>,
    generation: Option<u16>,
    count: &mut u64,
) -> Result<Written, CheckpointError> {
    let (left, right, value) =
        n.with_body(|b| (b.left_link.clone(), b.right_link.clone(), b.payload.clone()));
    let l = match &left {
        Some(c) => Some(encode_node(c, out, generation, count)?),
        None => None,
    };
    let r = match &right {
        Some(c) => Some(encode_node(c, out, generation, count)?),
        None => None,
    };
    drop((left, right));
    let offset = out.offset;
    let rec = NodeRecord {
        key: &n.key,
        value: &value,
        vn: n.vn(),
        ncv: n.ncv(),
        nsv: n.nsv(),
        origin: match n.owner_kind() {
            OwnerKind::Intention(pos) => Some(pos),
            _ => None,
        },
        oldest: n.oldest,
        height: n.height,
        left: l.map(|w| w.offset),
        right: r.map(|w| w.offset),
    };
    out.write(&rec.encode(offset))?;
    if let Some(a) = generation.and_then(|g| NodeAddr::new(g, offset)) {
        n.record_addr(a);
    }
    *count += 1;
    Ok(Written { offset })
}

/// One node as a checkpoint stores it:
///
/// ```text
/// len varint (of what follows up to the CRC) | tag u8 | height u8
/// | key (varint length, bytes) | value (varint length, bytes)
/// | vn | vn - ncv | nsv | origin (if tag & LOGGED) | oldest + 1 (0: none)
/// | offset - left child's offset (if tag & LEFT)
/// | offset - right child's offset (if tag & RIGHT) | crc32 u32 LE
/// ```
struct NodeRecord<'a> {
    key: &'a [u8],
    value: &'a [u8],
    vn: Vn,
    ncv: Vn,
    nsv: Vn,
    origin: Option<LogPos>,
    oldest: LogPos,
    height: u8,
    left: Option<u64>,
    right: Option<u64>,
}

/// Fewest bytes a node record takes (len, tag, height, two empty lengths,
/// three versions, oldest, CRC).
const MIN_RECORD: u64 = 13;

impl<'a> NodeRecord<'a> {
    fn encode(&self, offset: u64) -> Vec<u8> {
        let mut inner = Vec::with_capacity(self.key.len() + self.value.len() + 48);
        let mut tag = 0;
        if self.left.is_some() {
            tag |= NODE_LEFT;
        }
        if self.right.is_some() {
            tag |= NODE_RIGHT;
        }
        if self.origin.is_some() {
            tag |= NODE_LOGGED;
        }
        inner.push(tag);
        inner.push(self.height);
        put(&mut inner, self.key.len() as u64);
        inner.extend_from_slice(self.key);
        put(&mut inner, self.value.len() as u64);
        inner.extend_from_slice(self.value);
        put(&mut inner, self.vn);
        put(&mut inner, self.vn.saturating_sub(self.ncv));
        put(&mut inner, self.nsv);
        if let Some(p) = self.origin {
            put(&mut inner, p);
        }
        put(
            &mut inner,
            if self.oldest == NO_LOGGED_NODE {
                0
            } else {
                self.oldest + 1
            },
        );
        for c in [self.left, self.right].into_iter().flatten() {
            put(&mut inner, offset - c);
        }
        let mut rec = Vec::with_capacity(inner.len() + 14);
        put(&mut rec, inner.len() as u64);
        rec.extend_from_slice(&inner);
        rec.extend_from_slice(&crc32fast::hash(&inner).to_le_bytes());
        rec
    }

    /// Parses the record at the start of `buf`, written at body `offset`;
    /// returns it and its length. Checks its CRC and field ranges (not its
    /// place in the tree).
    fn parse(buf: &'a [u8], offset: u64, csn: Vn) -> Result<(NodeRecord<'a>, usize), DecodeError> {
        let bad = |why| DecodeError::BadTree { why };
        let mut r = Reader { buf, at: 0 };
        let len = r.varint("checkpoint node length")?;
        if len > (MAX_KEY_LEN + MAX_VALUE_LEN + 128) as u64 {
            return Err(DecodeError::Limit {
                field: "checkpoint node length",
                value: len,
                limit: (MAX_KEY_LEN + MAX_VALUE_LEN + 128) as u64,
            });
        }
        let inner = r.take(len as usize, "checkpoint node")?;
        let crc = r.take(4, "checkpoint node checksum")?;
        if crc32fast::hash(inner).to_le_bytes()[..] != *crc {
            return Err(DecodeError::Checksum);
        }
        let total = r.at;
        let mut r = Reader { buf: inner, at: 0 };
        let tag = r.u8("checkpoint node tag")?;
        if tag & !(NODE_LEFT | NODE_RIGHT | NODE_LOGGED) != 0 {
            return Err(bad("unknown node tag bits"));
        }
        let height = r.u8("checkpoint node height")?;
        let key = r.bytes("checkpoint key", MAX_KEY_LEN)?;
        let value = r.bytes("checkpoint value", MAX_VALUE_LEN)?;
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
        let oldest = match r.varint("checkpoint oldest descendant")? {
            0 => NO_LOGGED_NODE,
            p => p - 1,
        };
        let mut child = |flag: u8, field| -> Result<Option<u64>, DecodeError> {
            if tag & flag == 0 {
                return Ok(None);
            }
            let d = r.varint(field)?;
            if d < MIN_RECORD || d > offset {
                return Err(bad("child offset out of range"));
            }
            Ok(Some(offset - d))
        };
        let left = child(NODE_LEFT, "checkpoint left child offset")?;
        let right = child(NODE_RIGHT, "checkpoint right child offset")?;
        if r.at != inner.len() {
            return Err(DecodeError::Trailing(inner.len() - r.at));
        }
        if height == 0 || height > MAX_HEIGHT {
            return Err(bad("node height out of range"));
        }
        Ok((
            NodeRecord {
                key,
                value,
                vn,
                ncv: vn - ncv_delta,
                nsv,
                origin,
                oldest,
                height,
                left,
                right,
            },
            total,
        ))
    }

    /// The owner a loaded node gets: an intention of its own origin, or
    /// none for an ephemeral node (its VN is cached).
    fn owner(&self) -> Option<Arc<Owner>> {
        self.origin.map(|p| Owner::new(OwnerKind::Intention(p), 0))
    }

    /// The node, with the given children (loaded nodes are normalised:
    /// NCV kept as SCV, NSV as SSV).
    fn node(
        &self,
        owner: Option<Arc<Owner>>,
        left: Link,
        right: Link,
        addr: Option<NodeAddr>,
    ) -> Node {
        Node {
            key: Bytes::from(self.key),
            left_link: left,
            right_link: right,
            vn_cache: AtomicU64::new(self.vn),
            scv: self.ncv,
            flags: SUBTREE_ONLY_READ,
            height: self.height,
            seq: 0,
            ssv: self.nsv,
            owner,
            payload: Bytes::from(self.value),
            extra: None,
            oldest: self.oldest,
            addr: AtomicU64::new(addr.map_or(0, NodeAddr::raw)),
        }
    }
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

/// Rebuilds the state of a complete checkpoint from its parts, in order,
/// entirely in memory. Verifies every part, that they belong together,
/// every node's checksum, the tree (key order, AVL balance, depth,
/// OldestDescendant, child offsets), the body checksum and the recorded
/// digest. Never panics.
pub fn load(parts: &[&[u8]]) -> Result<Loaded, CheckpointError> {
    load_with(parts.iter().map(|p| Ok::<_, CheckpointError>(*p)), None)
}

/// Like [`load`], but keeps no node in memory: it verifies the parts as
/// they come (every node's checksum and place in the tree, the body
/// checksum; not the digest, which needs the whole tree) and returns a
/// state whose root is a stub read back through `store` from checkpoint
/// `generation` (the host maps that number to these parts). Parts may be
/// read one at a time: none is kept after it was parsed.
pub fn load_lazy<B: AsRef<[u8]>, E>(
    parts: impl IntoIterator<Item = Result<B, E>>,
    store: Arc<dyn NodeStore>,
    generation: u16,
) -> Result<Loaded, CheckpointError>
where
    CheckpointError: From<E>,
{
    load_with(parts, Some((store, generation)))
}

fn load_with<B: AsRef<[u8]>, E>(
    parts: impl IntoIterator<Item = Result<B, E>>,
    lazy: Option<(Arc<dyn NodeStore>, u16)>,
) -> Result<Loaded, CheckpointError>
where
    CheckpointError: From<E>,
{
    let mut loader = Loader {
        lazy,
        buf: Vec::new(),
        consumed: 0,
        crc: crc32fast::Hasher::new(),
        head: None,
        stack: Vec::new(),
        owners: BTreeMap::new(),
        nodes: 0,
        trailer: None,
    };
    let mut first: Option<(u64, LogPos)> = None;
    let mut done = false;
    for (i, p) in parts.into_iter().enumerate() {
        let p = p?;
        let p = p.as_ref();
        let i = i as u64;
        if done {
            return Err(CheckpointError::Incomplete {
                index: i,
                why: "parts after the last part",
            });
        }
        let rec = parse_record(p).map_err(|e| CheckpointError::Part {
            index: i,
            source: e,
        })?;
        let Record::Part {
            db_id,
            begin,
            index,
            last,
            chunk,
        } = rec
        else {
            return Err(CheckpointError::Incomplete {
                index: i,
                why: "a begin record where a part was expected",
            });
        };
        if index != i {
            return Err(CheckpointError::Incomplete {
                index: i,
                why: "parts are not the parts of one checkpoint, in order",
            });
        }
        if *first.get_or_insert((db_id, begin)) != (db_id, begin) {
            return Err(CheckpointError::Incomplete {
                index: i,
                why: "parts belong to different checkpoints",
            });
        }
        loader.feed(chunk, last)?;
        done = last;
    }
    let Some((db_id, begin)) = first else {
        return Err(CheckpointError::Incomplete {
            index: 0,
            why: "no parts",
        });
    };
    if !done {
        return Err(CheckpointError::Incomplete {
            index: 0,
            why: "the last part is missing",
        });
    }
    loader.finish(db_id, begin)
}

/// A subtree on the loader's stack: its root (a node, or a summary when
/// loading lazily) with its key bounds and where its record is.
struct Built {
    node: Option<Arc<Node>>,
    key: Bytes,
    vn: Vn,
    ncv: Vn,
    nsv: Vn,
    origin: Option<LogPos>,
    height: u8,
    oldest: LogPos,
    offset: u64,
    min: Bytes,
    max: Bytes,
}

struct Loader {
    lazy: Option<(Arc<dyn NodeStore>, u16)>,
    /// Body bytes received and not yet parsed.
    buf: Vec<u8>,
    /// Body offset of `buf[0]`.
    consumed: u64,
    crc: crc32fast::Hasher,
    /// Settings and CSN once the head is parsed.
    head: Option<(Settings, Vn)>,
    stack: Vec<Built>,
    owners: BTreeMap<LogPos, Arc<Owner>>,
    nodes: u64,
    /// The 48-byte trailer and CRC once the body ended.
    trailer: Option<Vec<u8>>,
}

/// Node count (8), root offset (8), digest (32), then the body CRC (4).
const TRAILER: usize = 8 + 8 + 32 + 4;

impl Loader {
    fn feed(&mut self, chunk: &[u8], last: bool) -> Result<(), CheckpointError> {
        self.buf.extend_from_slice(chunk);
        if last && self.buf.len() < TRAILER {
            return Err(DecodeError::Truncated {
                field: "checkpoint trailer",
            }
            .into());
        }
        let mut at = 0usize;
        loop {
            // The last TRAILER bytes received may be the trailer, not node
            // records: hold them back until the body is complete.
            let avail = &self.buf[at..];
            let limit = avail.len().saturating_sub(TRAILER);
            if limit == 0 {
                break;
            }
            let window = &avail[..limit];
            let offset = self.consumed + at as u64;
            let Some((_, csn)) = &self.head else {
                let mut r = Reader { buf: window, at: 0 };
                let parsed = (|| {
                    let s = Settings::decode(r.bytes("checkpoint settings", 64)?)?;
                    let csn = r.varint("checkpoint csn")?;
                    Ok::<_, DecodeError>((s, csn))
                })();
                match parsed {
                    Ok(h) => {
                        self.head = Some(h);
                        at += r.at;
                        continue;
                    }
                    Err(DecodeError::Truncated { .. }) if !last => break,
                    Err(e) => return Err(e.into()),
                }
            };
            match NodeRecord::parse(window, offset, *csn) {
                Ok((rec, len)) => {
                    let owners = (self.lazy.is_none()).then_some(&mut self.owners);
                    push(&mut self.stack, owners, &rec, offset)?;
                    self.nodes += 1;
                    at += len;
                }
                Err(DecodeError::Truncated { .. }) if !last => break,
                Err(e) => return Err(e.into()),
            }
        }
        self.crc.update(&self.buf[..at]);
        self.buf.drain(..at);
        self.consumed += at as u64;
        if last {
            if self.buf.len() != TRAILER {
                return Err(DecodeError::Trailing(self.buf.len() - TRAILER).into());
            }
            self.trailer = Some(std::mem::take(&mut self.buf));
        }
        Ok(())
    }
}

/// Checks a parsed record against the subtrees on the loader's stack (its
/// children) and pushes its own.
fn push(
    stack: &mut Vec<Built>,
    owners: Option<&mut BTreeMap<LogPos, Arc<Owner>>>,
    rec: &NodeRecord<'_>,
    offset: u64,
) -> Result<(), CheckpointError> {
    let bad = |why| CheckpointError::Body(DecodeError::BadTree { why });
    let mut pop = |want: Option<u64>| -> Result<Option<Built>, CheckpointError> {
        let Some(o) = want else { return Ok(None) };
        let b = stack.pop().ok_or_else(|| bad("child missing"))?;
        if b.offset != o {
            return Err(bad("child offset does not match the child"));
        }
        Ok(Some(b))
    };
    let right = pop(rec.right)?;
    let left = pop(rec.left)?;
    let key = Bytes::from(rec.key);
    if left.as_ref().is_some_and(|l| l.max[..] >= key[..])
        || right.as_ref().is_some_and(|r| r.min[..] <= key[..])
    {
        return Err(bad("keys out of order"));
    }
    let (hl, hr) = (
        left.as_ref().map_or(0, |b| b.height),
        right.as_ref().map_or(0, |b| b.height),
    );
    if hl.abs_diff(hr) > 1 {
        return Err(bad("unbalanced subtree"));
    }
    if rec.height != hl.max(hr) + 1 {
        return Err(bad("recorded height is not the subtree's"));
    }
    let f = |b: &Option<Built>| b.as_ref().map_or(NO_LOGGED_NODE, |b| b.oldest);
    let oldest = rec
        .origin
        .unwrap_or(NO_LOGGED_NODE)
        .min(f(&left))
        .min(f(&right));
    if oldest != rec.oldest {
        return Err(bad("recorded OldestDescendant is not the subtree's"));
    }
    let min = left.as_ref().map_or_else(|| key.clone(), |l| l.min.clone());
    let max = right
        .as_ref()
        .map_or_else(|| key.clone(), |r| r.max.clone());
    // Kept in memory (a full load): one owner per origin, shared.
    let node = owners.map(|owners| {
        let owner = rec.origin.map(|p| {
            owners
                .entry(p)
                .or_insert_with(|| Owner::new(OwnerKind::Intention(p), 0))
                .clone()
        });
        let l = left.and_then(|b| b.node);
        let r = right.and_then(|b| b.node);
        Arc::new(rec.node(owner, l, r, None))
    });
    stack.push(Built {
        node,
        key,
        vn: rec.vn,
        ncv: rec.ncv,
        nsv: rec.nsv,
        origin: rec.origin,
        height: rec.height,
        oldest: rec.oldest,
        offset,
        min,
        max,
    });
    Ok(())
}

impl Loader {
    fn finish(mut self, db_id: u64, begin: LogPos) -> Result<Loaded, CheckpointError> {
        let Some((settings, csn)) = self.head.take() else {
            return Err(DecodeError::Truncated {
                field: "checkpoint head",
            }
            .into());
        };
        if settings.db_id != db_id {
            return Err(CheckpointError::Body(DecodeError::Invalid {
                field: "checkpoint settings",
                why: "db_id differs from the parts' db_id",
            }));
        }
        let t = self.trailer.take().unwrap_or_default();
        if t.len() != TRAILER {
            return Err(DecodeError::Truncated {
                field: "checkpoint trailer",
            }
            .into());
        }
        self.crc.update(&t[..TRAILER - 4]);
        if self.crc.clone().finalize().to_le_bytes()[..] != t[TRAILER - 4..] {
            return Err(CheckpointError::Body(DecodeError::Checksum));
        }
        let le = |b: &[u8]| {
            let mut x = [0u8; 8];
            x.copy_from_slice(b);
            u64::from_le_bytes(x)
        };
        let (count, root_offset) = (le(&t[..8]), le(&t[8..16]));
        let mut digest: Digest = [0; 32];
        digest.copy_from_slice(&t[16..48]);
        let bad = |why| CheckpointError::Body(DecodeError::BadTree { why });
        if count != self.nodes {
            return Err(bad("node count differs from the nodes found"));
        }
        let root = match (self.stack.pop(), self.stack.is_empty()) {
            (None, _) if count == 0 && root_offset == 0 => None,
            (Some(b), true) if b.offset == root_offset => Some(b),
            _ => return Err(bad("not exactly one root where the trailer says")),
        };
        let root: Link = match (root, &self.lazy) {
            (None, _) => None,
            (Some(b), None) => b.node,
            (Some(b), Some((store, generation))) => {
                let addr = NodeAddr::new(*generation, b.offset)
                    .ok_or_else(|| bad("checkpoint too large to address"))?;
                Some(stub_from(&b, addr, store.clone()))
            }
        };
        let state = Snapshot {
            root,
            pos: begin,
            csn,
            db: settings.db_id,
        };
        if self.lazy.is_none() && state.digest() != digest {
            return Err(CheckpointError::Digest);
        }
        Ok(Loaded {
            settings,
            state,
            nodes: count,
        })
    }
}

/// The stub of a node known from its record's summary.
fn stub_from(b: &Built, addr: NodeAddr, store: Arc<dyn NodeStore>) -> Arc<Node> {
    let owner = b.origin.map(|p| Owner::new(OwnerKind::Intention(p), 0));
    let plain = Node {
        key: b.key.clone(),
        left_link: None,
        right_link: None,
        vn_cache: AtomicU64::new(b.vn),
        scv: b.ncv,
        flags: SUBTREE_ONLY_READ,
        height: b.height,
        seq: 0,
        ssv: b.nsv,
        owner,
        payload: Bytes::default(),
        extra: None,
        oldest: b.oldest,
        addr: AtomicU64::new(0),
    };
    plain.to_stub(addr, store, read_node)
}

/// Reads one record through `store`.
fn read_record(store: &Arc<dyn NodeStore>, addr: NodeAddr) -> Result<(Vec<u8>, usize), StoreError> {
    // Most records are small: one read usually does.
    const FIRST: usize = 512;
    let mut buf = store.read(addr, FIRST)?;
    let corrupt = |why| StoreError::Corrupt { addr, why };
    let (len, n) = u64::decode_var(&buf).ok_or(corrupt("record length unreadable"))?;
    let total = n + len as usize + 4;
    if len > (MAX_KEY_LEN + MAX_VALUE_LEN + 128) as u64 {
        return Err(corrupt("record length out of range"));
    }
    if total > buf.len() {
        buf = store.read(addr, total)?;
        if buf.len() < total {
            return Err(corrupt("record runs past the end of the checkpoint"));
        }
    }
    Ok((buf, total))
}

/// Reads the node at `addr` back through `store`: its key, value and
/// versions, with stubs for its children (read from their records, which
/// carry what a stub must know without its body). Every record's checksum
/// is verified. The CSN bound for versions is not known here, so versions
/// are only checked for consistency with the stub that asked.
pub(crate) fn read_node(
    store: &Arc<dyn NodeStore>,
    addr: NodeAddr,
) -> Result<Arc<Node>, StoreError> {
    let corrupt = |why| StoreError::Corrupt { addr, why };
    // Post-order puts a node's children just before it, so one read of
    // the bytes before and at the node usually holds all three records:
    // one positional read instead of three for most nodes.
    let offset = addr.offset();
    let start = offset.saturating_sub(WINDOW_BEFORE);
    let window = NodeAddr::new(addr.generation(), start)
        .map(|w| store.read(w, (offset - start) as usize + 512))
        .transpose()?
        .unwrap_or_default();
    let at = (offset - start) as usize;
    let own;
    let buf: &[u8] = match window
        .get(at..)
        .map(|b| NodeRecord::parse(b, offset, Vn::MAX))
    {
        Some(Ok(_)) => &window[at..],
        // Not all in the window (a large value), or damaged: read it alone.
        _ => {
            own = read_record(store, addr)?.0;
            &own
        }
    };
    let (rec, _) = NodeRecord::parse(buf, offset, Vn::MAX)
        .map_err(|_| corrupt("node record does not verify"))?;
    let mut kids: [Link; 2] = [None, None];
    for (side, off) in [rec.left, rec.right].into_iter().enumerate() {
        let Some(off) = off else { continue };
        let caddr = NodeAddr::new(addr.generation(), off).ok_or(corrupt("child offset"))?;
        let in_window = off
            .checked_sub(start)
            .and_then(|i| window.get(i as usize..at))
            .and_then(|b| NodeRecord::parse(b, off, Vn::MAX).ok().map(|_| b));
        let cown;
        let cbuf: &[u8] = match in_window {
            Some(b) => b,
            None => {
                cown = read_record(store, caddr)?.0;
                &cown
            }
        };
        let (c, _) = NodeRecord::parse(cbuf, off, Vn::MAX).map_err(|_| StoreError::Corrupt {
            addr: caddr,
            why: "node record does not verify",
        })?;
        let ordered = if side == 0 {
            c.key < rec.key
        } else {
            c.key > rec.key
        };
        if !ordered || c.height >= rec.height {
            return Err(corrupt("child record does not fit under its parent"));
        }
        let b = Built {
            node: None,
            key: Bytes::from(c.key),
            vn: c.vn,
            ncv: c.ncv,
            nsv: c.nsv,
            origin: c.origin,
            height: c.height,
            oldest: c.oldest,
            offset: off,
            min: Bytes::default(),
            max: Bytes::default(),
        };
        kids[side] = Some(stub_from(&b, caddr, store.clone()));
    }
    let [l, r] = kids;
    Ok(Arc::new(rec.node(rec.owner(), l, r, Some(addr))))
}

/// Bytes before a node that [`read_node`] reads along with it, hoping to
/// find its children's records there.
const WINDOW_BEFORE: u64 = 2048;

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
