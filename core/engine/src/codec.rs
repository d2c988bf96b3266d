//! The intention codec: a compact, versioned, checksummed binary format
//! (specified in `docs/format.md`).
//!
//! Decoding happens in two steps. [`parse`] checks the framing, checksum,
//! limits and field validity of untrusted bytes without touching any tree.
//! `resolve` then turns the parsed nodes into tree nodes, resolving
//! cross-intention pointers and unaltered payloads against the snapshot the
//! writer read, and checks that the result is an ordered, balanced tree.
//! Both steps are pure functions of the log, so every node accepts or rejects
//! the same bytes with the same error.

use std::ops::Bound;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use integer_encoding::VarInt;

use crate::error::{
    DecodeError, TxnError, MAX_INTENTION_BYTES, MAX_INTENTION_NODES, MAX_KEY_LEN,
    MAX_RANGES_PER_NODE, MAX_VALUE_LEN,
};
use crate::isolation::Isolation;
use crate::node::{
    find, height, max_key, min_key, oldest_from, touch, Bytes, Extra, Link, LogPos, Node, Owner,
    OwnerKind, Vn, ALTERED, DEPENDS_ON, DEPENDS_ON_TREE, LEFT_OWNED, RIGHT_OWNED,
    SUBTREE_ONLY_READ,
};
use crate::range::KeyRange;

/// Magic bytes at the start of every intention record.
pub const INTENTION_MAGIC: &[u8; 4] = b"MLDI";
/// Intention format version written by this build.
pub const INTENTION_VERSION: u8 = 1;

const F_ALTERED: u8 = 1;
const F_DEPENDS_ON: u8 = 2;
const F_DEPENDS_ON_TREE: u8 = 4;
const F_ONLY_READ: u8 = 8;
const F_HAS_SCV: u8 = 16;
const F_HAS_SSV: u8 = 32;
const F_KNOWN: u8 = 63;

const CHILD_NONE: u8 = 0;
const CHILD_LOCAL: u8 = 1;
const CHILD_CROSS: u8 = 2;

// ---------------------------------------------------------------- writing

pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    /// Appends `v` as an unsigned LEB128 varint, the encoding
    /// `integer_encoding` reads back. Written out here because it runs
    /// hundreds of times per intention: going through a scratch buffer cost
    /// a `memcpy` call per varint, more than the encoding itself.
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }
    fn bound(&mut self, b: &Bound<Bytes>) {
        match b {
            Bound::Unbounded => self.buf.push(0),
            Bound::Included(k) => {
                self.buf.push(1);
                self.bytes(k);
            }
            Bound::Excluded(k) => {
                self.buf.push(2);
                self.bytes(k);
            }
        }
    }
    fn ranges(&mut self, rs: &[KeyRange]) {
        self.varint(rs.len() as u64);
        for r in rs {
            self.bound(&r.start);
            self.bound(&r.end);
        }
    }
}

/// Everything the encoder needs from a finished transaction.
pub(crate) struct EncodeInput<'a> {
    pub(crate) root: &'a Link,
    pub(crate) local: &'a Arc<Owner>,
    pub(crate) isolation: Isolation,
    pub(crate) snapshot_pos: LogPos,
    pub(crate) snapshot_csn: Vn,
    pub(crate) deletes: &'a [(Bytes, Vn)],
    pub(crate) header_ranges: &'a [KeyRange],
}

/// Encodes a transaction's local tree as an intention record.
pub(crate) fn encode(input: &EncodeInput<'_>) -> Result<Vec<u8>, TxnError> {
    let count = count_local(input.root, input.local);
    if count > MAX_INTENTION_NODES {
        return Err(TxnError::TooLarge { what: "node count" });
    }
    // About what a node of a read path takes (flags, key, versions, one
    // cross pointer with its key): growing the buffer by doubling from a
    // small start copied the record several times.
    let mut w = Writer {
        buf: Vec::with_capacity(64 + count * 40),
    };
    w.buf.extend_from_slice(INTENTION_MAGIC);
    w.buf.push(INTENTION_VERSION);
    w.buf.push(input.isolation.code());
    w.varint(input.snapshot_pos);
    w.varint(input.snapshot_csn);
    w.varint(count as u64);
    match input.root {
        Some(root) if root.same_owner(input.local) => {
            encode_node(&mut w, root, input);
            w.buf.push(CHILD_LOCAL);
        }
        Some(root) => {
            // Deletes alone can leave an untouched snapshot subtree as root.
            w.buf.push(CHILD_CROSS);
            w.varint(input.snapshot_csn - root.vn());
            w.bytes(&root.key);
        }
        None => w.buf.push(CHILD_NONE),
    }
    w.varint(input.deletes.len() as u64);
    for (k, scv) in input.deletes {
        w.bytes(k);
        // 0: absent from the snapshot; otherwise 1 + (csn - scv).
        w.varint(if *scv == 0 {
            0
        } else {
            input.snapshot_csn - scv + 1
        });
    }
    w.ranges(input.header_ranges);
    let crc = crc32fast::hash(&w.buf);
    w.buf.extend_from_slice(&crc.to_le_bytes());
    if w.buf.len() > MAX_INTENTION_BYTES {
        return Err(TxnError::TooLarge { what: "byte size" });
    }
    Ok(w.buf)
}

fn count_local(t: &Link, local: &Arc<Owner>) -> usize {
    match t {
        Some(n) if n.same_owner(local) => {
            1 + count_local(n.left(), local) + count_local(n.right(), local)
        }
        _ => 0,
    }
}

fn child_kind(c: &Link, local: &Arc<Owner>) -> u8 {
    match c {
        None => CHILD_NONE,
        Some(n) if n.same_owner(local) => CHILD_LOCAL,
        Some(_) => CHILD_CROSS,
    }
}

fn encode_node(w: &mut Writer, n: &Arc<Node>, input: &EncodeInput<'_>) {
    // Post-order: both children before the node, so a decoder can rebuild
    // the tree with a stack and VNs follow from the position (App. E).
    let local = input.local;
    for c in [n.left(), n.right()].into_iter().flatten() {
        if c.same_owner(local) {
            encode_node(w, c, input);
        }
    }
    let ranges = n.ranges().unwrap_or(&[]);
    let mut flags = 0u8;
    if n.altered() {
        flags |= F_ALTERED;
    }
    if n.depends_on() {
        flags |= F_DEPENDS_ON;
    }
    if !ranges.is_empty() {
        flags |= F_DEPENDS_ON_TREE;
    }
    // A transaction-local node's subtree is only read-dependent when nothing
    // was written at it or below it.
    if !n.flag(crate::node::DIRTY) && !n.altered() {
        flags |= F_ONLY_READ;
    }
    if n.scv != 0 {
        flags |= F_HAS_SCV;
    }
    if n.ssv != 0 {
        flags |= F_HAS_SSV;
    }
    w.buf.push(flags);
    w.buf
        .push(child_kind(n.left(), local) | (child_kind(n.right(), local) << 2));
    w.bytes(&n.key);
    if n.altered() {
        w.bytes(n.val());
    }
    if n.scv != 0 {
        w.varint(input.snapshot_csn - n.scv);
    }
    if n.ssv != 0 {
        w.varint(input.snapshot_csn - n.ssv);
    }
    for c in [n.left(), n.right()].into_iter().flatten() {
        if !c.same_owner(local) {
            w.varint(input.snapshot_csn - c.vn());
            w.bytes(&c.key);
        }
    }
    if !ranges.is_empty() {
        w.ranges(ranges);
    }
}

// ---------------------------------------------------------------- parsing

/// A node as read from the bytes, before resolution.
#[derive(Debug, Clone)]
pub(crate) struct ParsedNode<'a> {
    flags: u8,
    kinds: [u8; 2],
    key: &'a [u8],
    value: Option<&'a [u8]>,
    scv: Vn,
    ssv: Vn,
    cross: [Option<(Vn, &'a [u8])>; 2],
    ranges: Vec<KeyRange>,
}

/// An intention record whose framing and fields have been validated.
#[derive(Debug, Clone)]
pub struct ParsedIntention<'a> {
    /// The writer's isolation level.
    pub isolation: Isolation,
    /// Log position of the last intention melded into the writer's snapshot.
    pub snapshot_pos: LogPos,
    /// CSN of the writer's snapshot.
    pub snapshot_csn: Vn,
    pub(crate) nodes: Vec<ParsedNode<'a>>,
    pub(crate) root: u8,
    pub(crate) root_cross: Option<(Vn, &'a [u8])>,
    pub(crate) deletes: Vec<(&'a [u8], Vn)>,
    pub(crate) header_ranges: Vec<KeyRange>,
    /// Bytes of node keys and altered values (payload, not metadata).
    pub payload_bytes: usize,
    /// Total encoded size.
    pub total_bytes: usize,
}

impl ParsedIntention<'_> {
    /// Number of tree nodes in the intention.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }
    /// Number of keys in the delete list.
    pub fn delete_count(&self) -> usize {
        self.deletes.len()
    }
    /// Average bytes per node that are not the node's own key or value:
    /// flags, versions, pointers, dependency ranges and the share of the
    /// header and delete list (the paper's "metadata per node", §4.3).
    pub fn metadata_bytes_per_node(&self) -> f64 {
        if self.nodes.is_empty() {
            return 0.0;
        }
        (self.total_bytes - self.payload_bytes) as f64 / self.nodes.len() as f64
    }
}

/// Reads fields from a record, never past its end (shared by the
/// intention and checkpoint decoders).
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) at: usize,
}

impl<'a> Reader<'a> {
    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }
    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        let b = *self
            .buf
            .get(self.at)
            .ok_or(DecodeError::Truncated { field })?;
        self.at += 1;
        Ok(b)
    }
    pub(crate) fn varint(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let rest = &self.buf[self.at..];
        if rest.is_empty() {
            return Err(DecodeError::Truncated { field });
        }
        match u64::decode_var(rest) {
            Some((v, n)) => {
                self.at += n;
                Ok(v)
            }
            None if rest.len() < 10 && rest.iter().all(|b| b & 0x80 != 0) => {
                Err(DecodeError::Truncated { field })
            }
            None => Err(DecodeError::BadVarint { field }),
        }
    }
    pub(crate) fn count(
        &mut self,
        field: &'static str,
        limit: usize,
    ) -> Result<usize, DecodeError> {
        let v = self.varint(field)?;
        if v > limit as u64 {
            return Err(DecodeError::Limit {
                field,
                value: v,
                limit: limit as u64,
            });
        }
        Ok(v as usize)
    }
    /// A length-prefixed byte string of at most `limit` bytes.
    pub(crate) fn bytes(
        &mut self,
        field: &'static str,
        limit: usize,
    ) -> Result<&'a [u8], DecodeError> {
        let len = self.count(field, limit)?;
        self.take(len, field)
    }
    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated { field });
        }
        let b = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(b)
    }
    /// Reads `csn - v` and returns `v`, which must lie in `1..=csn`.
    fn version(&mut self, field: &'static str, csn: Vn) -> Result<Vn, DecodeError> {
        let d = self.varint(field)?;
        if d >= csn {
            return Err(DecodeError::Invalid {
                field,
                why: "version is not older than the snapshot",
            });
        }
        Ok(csn - d)
    }
    fn bound(&mut self) -> Result<Bound<Bytes>, DecodeError> {
        Ok(match self.u8("range bound")? {
            0 => Bound::Unbounded,
            1 => Bound::Included(self.bytes("range key", MAX_KEY_LEN)?.into()),
            2 => Bound::Excluded(self.bytes("range key", MAX_KEY_LEN)?.into()),
            _ => {
                return Err(DecodeError::Invalid {
                    field: "range bound",
                    why: "unknown tag",
                })
            }
        })
    }
    fn ranges(&mut self) -> Result<Vec<KeyRange>, DecodeError> {
        let n = self.count("range count", MAX_RANGES_PER_NODE)?;
        // Every range takes at least two bytes: never allocate more than the
        // remaining input could describe.
        let mut out = Vec::with_capacity(n.min((self.buf.len() - self.at) / 2));
        for _ in 0..n {
            let start = self.bound()?;
            let end = self.bound()?;
            out.push(KeyRange { start, end });
        }
        Ok(out)
    }
}

/// Checks a record's magic, minimum length and trailing CRC-32; returns the
/// bytes before the checksum.
pub(crate) fn checked_body<'a>(
    bytes: &'a [u8],
    magic: &[u8; 4],
    what: &'static str,
    min_len: usize,
) -> Result<&'a [u8], DecodeError> {
    if bytes.len() < 4 || &bytes[..4] != magic {
        return Err(DecodeError::BadMagic { what });
    }
    if bytes.len() < min_len {
        return Err(DecodeError::Truncated { field: what });
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let mut crc_bytes = [0u8; 4];
    crc_bytes.copy_from_slice(crc);
    if crc32fast::hash(body) != u32::from_le_bytes(crc_bytes) {
        return Err(DecodeError::Checksum);
    }
    Ok(body)
}

/// Validates the framing, checksum, limits and fields of an intention record.
/// Never panics and never allocates more than the input size justifies.
pub fn parse(bytes: &[u8]) -> Result<ParsedIntention<'_>, DecodeError> {
    if bytes.len() > MAX_INTENTION_BYTES {
        return Err(DecodeError::Limit {
            field: "intention size",
            value: bytes.len() as u64,
            limit: MAX_INTENTION_BYTES as u64,
        });
    }
    let body = checked_body(bytes, INTENTION_MAGIC, "intention", 10)?;
    let mut r = Reader { buf: body, at: 4 };
    let version = r.u8("version")?;
    if version != INTENTION_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            found: version,
            supported: INTENTION_VERSION,
        });
    }
    let isolation = Isolation::from_code(r.u8("isolation")?).ok_or(DecodeError::Invalid {
        field: "isolation",
        why: "unknown level",
    })?;
    let snapshot_pos = r.varint("snapshot position")?;
    let snapshot_csn = r.varint("snapshot csn")?;
    let count = r.count("node count", MAX_INTENTION_NODES)?;
    // A node takes at least four bytes.
    let mut nodes = Vec::with_capacity(count.min(body.len() / 4));
    let mut payload = 0usize;
    for _ in 0..count {
        let flags = r.u8("node flags")?;
        if flags & !F_KNOWN != 0 {
            return Err(DecodeError::Invalid {
                field: "node flags",
                why: "unknown flag bits",
            });
        }
        let kinds_byte = r.u8("child kinds")?;
        let kinds = [kinds_byte & 3, (kinds_byte >> 2) & 3];
        if kinds_byte >> 4 != 0 || kinds.contains(&3) {
            return Err(DecodeError::Invalid {
                field: "child kinds",
                why: "unknown child kind",
            });
        }
        let altered = flags & F_ALTERED != 0;
        if flags & F_HAS_SCV == 0 && !altered {
            return Err(DecodeError::Invalid {
                field: "node flags",
                why: "a node without a source version must be an insert",
            });
        }
        if flags & F_ONLY_READ != 0 && (altered || flags & F_HAS_SSV == 0) {
            return Err(DecodeError::Invalid {
                field: "node flags",
                why: "a read-only subtree cannot be altered and needs a structure version",
            });
        }
        let key = r.bytes("node key", MAX_KEY_LEN)?;
        let value = if altered {
            Some(r.bytes("node value", MAX_VALUE_LEN)?)
        } else {
            None
        };
        payload += key.len() + value.map_or(0, |v| v.len());
        let scv = if flags & F_HAS_SCV != 0 {
            r.version("scv", snapshot_csn)?
        } else {
            0
        };
        let ssv = if flags & F_HAS_SSV != 0 {
            r.version("ssv", snapshot_csn)?
        } else {
            0
        };
        let mut cross = [None, None];
        for (i, kind) in kinds.iter().enumerate() {
            if *kind == CHILD_CROSS {
                let vn = r.version("pointer", snapshot_csn)?;
                cross[i] = Some((vn, r.bytes("pointer key", MAX_KEY_LEN)?));
            }
        }
        let ranges = if flags & F_DEPENDS_ON_TREE != 0 {
            let rs = r.ranges()?;
            if rs.is_empty() {
                return Err(DecodeError::Invalid {
                    field: "dependency ranges",
                    why: "DependsOnTree without a range",
                });
            }
            rs
        } else {
            Vec::new()
        };
        nodes.push(ParsedNode {
            flags,
            kinds,
            key,
            value,
            scv,
            ssv,
            cross,
            ranges,
        });
    }
    let root = r.u8("root kind")?;
    let root_cross = match root {
        CHILD_NONE | CHILD_LOCAL => None,
        CHILD_CROSS => {
            let vn = r.version("root pointer", snapshot_csn)?;
            Some((vn, r.bytes("root pointer key", MAX_KEY_LEN)?))
        }
        _ => {
            return Err(DecodeError::Invalid {
                field: "root kind",
                why: "unknown kind",
            })
        }
    };
    if (root == CHILD_LOCAL) != (count > 0) {
        return Err(DecodeError::Invalid {
            field: "root kind",
            why: "a local root needs nodes, and nodes need a local root",
        });
    }
    let ndel = r.count("delete count", MAX_INTENTION_NODES)?;
    let mut deletes: Vec<(&[u8], Vn)> = Vec::with_capacity(ndel.min(body.len() / 2));
    for _ in 0..ndel {
        let k = r.bytes("deleted key", MAX_KEY_LEN)?;
        let scv = match r.varint("deleted scv")? {
            0 => 0,
            d if d - 1 < snapshot_csn => snapshot_csn - (d - 1),
            _ => {
                return Err(DecodeError::Invalid {
                    field: "deleted scv",
                    why: "version is not older than the snapshot",
                })
            }
        };
        if let Some((prev, _)) = deletes.last() {
            if *prev >= k {
                return Err(DecodeError::Invalid {
                    field: "delete list",
                    why: "keys not strictly ascending",
                });
            }
        }
        deletes.push((k, scv));
    }
    let header_ranges = r.ranges()?;
    if r.at != body.len() {
        return Err(DecodeError::Trailing(body.len() - r.at));
    }
    Ok(ParsedIntention {
        isolation,
        snapshot_pos,
        snapshot_csn,
        nodes,
        root,
        root_cross,
        deletes,
        header_ranges,
        payload_bytes: payload,
        total_bytes: bytes.len(),
    })
}

// ---------------------------------------------------------------- resolving

/// An intention decoded into tree nodes, ready to be melded.
#[derive(Debug)]
pub struct Intention {
    pub(crate) root: Link,
    pub(crate) owner: Arc<Owner>,
    /// The open key interval each node's subtree lies in (from its
    /// ancestors' keys; `None` is unbounded), by `seq - 1`.
    pub(crate) bounds: Vec<Interval>,
    pub(crate) node_count: u32,
    pub(crate) deletes: Vec<(Bytes, Vn)>,
    pub(crate) header_ranges: Vec<KeyRange>,
    /// Log position of this intention.
    pub pos: LogPos,
    /// Log position of the writer's snapshot (after premeld: of the
    /// premeld input state the intention was re-expressed on).
    pub snapshot_pos: LogPos,
    /// Root of that snapshot: pointers were resolved in it, and meld
    /// compares it with the LCS for range dependencies.
    pub(crate) snapshot_root: Link,
    /// CSN of the writer's snapshot.
    pub snapshot_csn: Vn,
    /// The writer's isolation level.
    pub isolation: Isolation,
}

impl Intention {
    /// The root, if it is a node of this intention (not a snapshot pointer).
    pub(crate) fn owned_root(&self) -> Option<&Arc<Node>> {
        self.root.as_ref().filter(|n| self.owns(n))
    }
    /// Number of tree nodes.
    pub fn node_count(&self) -> u32 {
        self.node_count
    }
    pub(crate) fn owns(&self, n: &Node) -> bool {
        n.same_owner(&self.owner)
    }
}

/// Deepest intention tree accepted: an AVL tree of 4M nodes (the node
/// limit) is at most 32 levels high, so anything deeper is hostile, and
/// the bound keeps the recursion below shallow.
const MAX_DEPTH: u32 = 96;

/// An open key interval; `None` ends are unbounded.
pub(crate) type Interval = (Option<Bytes>, Option<Bytes>);

/// Whether every key of a subtree inside the open interval `inner` is
/// inside `(lo, hi)` as well.
fn within(inner: &Interval, lo: Option<&[u8]>, hi: Option<&[u8]>) -> bool {
    lo.is_none_or(|l| inner.0.as_deref().is_some_and(|il| il >= l))
        && hi.is_none_or(|h| inner.1.as_deref().is_some_and(|ih| ih <= h))
}

/// Where a node's snapshot twin probably is, and the open key interval of
/// that snapshot node (from its snapshot ancestors).
#[derive(Clone)]
struct Hint<'s> {
    node: &'s Arc<Node>,
    interval: Interval,
}

/// A child of a parsed node: none, a node of the same intention (its
/// index), or a pointer into the snapshot.
#[derive(Clone, Copy)]
enum Kid<'a> {
    None,
    Local(u32),
    Cross(Option<(Vn, &'a [u8])>),
}

/// Builds tree nodes from a parsed intention, resolving pointers and the
/// payloads of unaltered nodes in `snapshot` (the committed tree at
/// `parsed.snapshot_pos`, whose CSN the caller has checked).
///
/// The intention copies paths of the snapshot, so the walk goes top-down
/// along the snapshot at the same time: a node's snapshot twin is usually
/// the hint handed down by its parent, and its pointers are usually the
/// twin's children, which makes resolving O(1) per node instead of a
/// lookup from the root. Where the shapes differ (rotations) it falls back
/// to the lookup; either way every pointer's version is checked.
pub(crate) fn resolve(
    parsed: &ParsedIntention<'_>,
    pos: LogPos,
    snapshot: &Link,
) -> Result<Intention, DecodeError> {
    let n = parsed.nodes.len();
    let mut kids: Vec<[Kid<'_>; 2]> = Vec::with_capacity(n);
    let mut stack: Vec<(u32, u32)> = Vec::with_capacity(64);
    for (idx, p) in parsed.nodes.iter().enumerate() {
        let mut k = [Kid::None, Kid::None];
        let mut depth = 0;
        for side in [1usize, 0] {
            k[side] = match p.kinds[side] {
                CHILD_LOCAL => {
                    let (c, d) = stack.pop().ok_or(DecodeError::BadTree {
                        why: "post-order child missing",
                    })?;
                    depth = depth.max(d);
                    Kid::Local(c)
                }
                CHILD_CROSS => Kid::Cross(p.cross[side]),
                _ => Kid::None,
            };
        }
        if depth + 1 > MAX_DEPTH {
            return Err(DecodeError::BadTree {
                why: "intention tree deeper than any balanced tree",
            });
        }
        kids.push(k);
        stack.push((idx as u32, depth + 1));
    }
    let owner = Owner::new(OwnerKind::Intention(pos), 0);
    let mut b = Builder {
        parsed,
        kids: &kids,
        snapshot,
        owner: owner.clone(),
        pos,
        bounds: vec![(None, None); n],
    };
    let root = match (parsed.root, stack.pop(), stack.is_empty()) {
        (CHILD_LOCAL, Some((r, _)), true) => {
            let hint = snapshot.as_ref().map(|node| Hint {
                node,
                interval: (None, None),
            });
            Some(b.build(r, hint, (None, None))?)
        }
        (CHILD_CROSS, None, _) => Some(resolve_pointer(parsed.root_cross, snapshot, None)?),
        (CHILD_NONE, None, _) => None,
        _ => {
            return Err(DecodeError::BadTree {
                why: "nodes do not form exactly one tree",
            })
        }
    };
    Ok(Intention {
        root,
        owner,
        bounds: b.bounds,
        node_count: n as u32,
        deletes: parsed
            .deletes
            .iter()
            .map(|(k, v)| (Bytes::from(*k), *v))
            .collect(),
        header_ranges: parsed.header_ranges.clone(),
        pos,
        snapshot_pos: parsed.snapshot_pos,
        snapshot_root: snapshot.clone(),
        snapshot_csn: parsed.snapshot_csn,
        isolation: parsed.isolation,
    })
}

/// A transaction's local tree (already sealed) as the decoded intention at
/// `pos`: the nodes, flags, numbering and intervals that encoding and
/// resolving it would give, without the byte round trip. Premeld uses it.
///
/// The local tree is consumed: its nodes belong to the sealed transaction
/// alone, so each becomes the intention's node in place, keeping its key,
/// value and snapshot children. Cloning them instead costs an atomic
/// increment on a committed node's (cold) cache line per field, and
/// dropping the local tree afterwards a decrement, which profiles showed
/// as a large share of the commit path.
pub(crate) fn from_local(
    root: Link,
    local: &Arc<Owner>,
    pos: LogPos,
    snapshot: crate::snapshot::Snapshot,
    isolation: Isolation,
    deletes: Vec<(Bytes, Vn)>,
    header_ranges: Vec<KeyRange>,
) -> Intention {
    struct Conv<'l> {
        local: &'l Arc<Owner>,
        owner: Arc<Owner>,
        pos: LogPos,
        bounds: Vec<Interval>,
    }
    impl Conv<'_> {
        fn node(&mut self, mut n: Arc<Node>, range: Interval) -> Arc<Node> {
            // The node is rewritten in place: a sealed transaction's local
            // nodes are held by nobody else, and since commits meld on the
            // thread that made them, the allocation is still in this
            // core's cache (when a writer thread did this, a new
            // allocation was faster than writing to the client's cache
            // lines). Someone else holding one only costs a copy.
            let m = Arc::make_mut(&mut n);
            let mut kids: [Link; 2] = [m.left_link.take(), m.right_link.take()];
            let mut flags = 0u16;
            for (side, kid) in kids.iter_mut().enumerate() {
                match kid.take() {
                    Some(c) if c.same_owner(self.local) => {
                        flags |= if side == 0 { LEFT_OWNED } else { RIGHT_OWNED };
                        let r = if side == 0 {
                            (range.0.clone(), Some(m.key.clone()))
                        } else {
                            (Some(m.key.clone()), range.1.clone())
                        };
                        *kid = Some(self.node(c, r));
                    }
                    other => *kid = other,
                }
            }
            if m.altered() {
                flags |= ALTERED;
            }
            if m.depends_on() {
                flags |= DEPENDS_ON;
            }
            let has_ranges = m.ranges().is_some_and(|r| !r.is_empty());
            if has_ranges {
                flags |= DEPENDS_ON_TREE;
            }
            if !m.flag(crate::node::DIRTY) && !m.altered() {
                flags |= SUBTREE_ONLY_READ;
            }
            self.bounds.push(range);
            let [left, right] = kids;
            m.height = height(&left).max(height(&right)).saturating_add(1);
            m.oldest = oldest_from(&left, &right, self.pos);
            m.left_link = left;
            m.right_link = right;
            m.owner = Some(self.owner.clone());
            m.seq = self.bounds.len() as u32;
            m.vn_cache = AtomicU64::new(0);
            m.flags = flags;
            if !has_ranges {
                m.extra = None;
            }
            m.addr = AtomicU64::new(0);
            n
        }
    }
    let mut c = Conv {
        local,
        owner: Owner::new(OwnerKind::Intention(pos), 0),
        pos,
        bounds: Vec::new(),
    };
    let root = match root {
        Some(r) if r.same_owner(local) => Some(c.node(r, (None, None))),
        other => other,
    };
    Intention {
        root,
        owner: c.owner,
        node_count: c.bounds.len() as u32,
        bounds: c.bounds,
        deletes,
        header_ranges,
        pos,
        snapshot_pos: snapshot.pos,
        snapshot_root: snapshot.root,
        snapshot_csn: snapshot.csn,
        isolation,
    }
}

struct Builder<'p, 'a> {
    parsed: &'p ParsedIntention<'a>,
    kids: &'p [[Kid<'a>; 2]],
    snapshot: &'p Link,
    owner: Arc<Owner>,
    pos: LogPos,
    bounds: Vec<Interval>,
}

impl<'s> Builder<'s, '_> {
    /// Builds node `idx`, whose subtree must lie in the open interval
    /// `range`; `hint` is where its snapshot twin probably is. Key order is
    /// checked top-down: each key against its interval, each pointer's
    /// subtree by its snapshot interval when it is the twin's own child
    /// (a valid tree keeps it there), by its extreme keys otherwise.
    fn build(
        &mut self,
        idx: u32,
        hint: Option<Hint<'s>>,
        range: Interval,
    ) -> Result<Arc<Node>, DecodeError> {
        let p = &self.parsed.nodes[idx as usize];
        let out_of_order = DecodeError::BadTree {
            why: "keys out of order",
        };
        if !in_interval(p.key, &range) {
            return Err(out_of_order);
        }
        let key: Bytes = p.key.into();
        let twin = hint.filter(|h| h.node.key[..] == *p.key);
        if let Some(t) = &twin {
            // The snapshot tree is cold here (decoding runs far behind the
            // tail): start the loads this node will need later, the twin's
            // value for an unaltered node and the twin's children (the
            // hints of this node's children), so their cache misses overlap
            // with each other and with the walk instead of stalling it one
            // after another.
            if p.value.is_none() {
                t.node.payload.touch();
            }
            touch(&t.node.left_link);
            touch(&t.node.right_link);
        }
        let mut links: [Link; 2] = [None, None];
        for side in [0usize, 1] {
            let child_range: Interval = if side == 0 {
                (range.0.clone(), Some(key.clone()))
            } else {
                (Some(key.clone()), range.1.clone())
            };
            let child_hint = twin.as_ref().and_then(|t| {
                let (c, interval) = if side == 0 {
                    (
                        t.node.left().as_ref(),
                        (t.interval.0.clone(), Some(t.node.key.clone())),
                    )
                } else {
                    (
                        t.node.right().as_ref(),
                        (Some(t.node.key.clone()), t.interval.1.clone()),
                    )
                };
                c.map(|node| Hint { node, interval })
            });
            links[side] = match self.kids[idx as usize][side] {
                Kid::None => None,
                Kid::Local(c) => Some(self.build(c, child_hint, child_range)?),
                Kid::Cross(ptr) => {
                    let x =
                        resolve_pointer(ptr, self.snapshot, child_hint.as_ref().map(|h| h.node))?;
                    let (lo, hi) = (child_range.0.as_deref(), child_range.1.as_deref());
                    let fits = match &child_hint {
                        Some(h) if Arc::ptr_eq(h.node, &x) && within(&h.interval, lo, hi) => true,
                        _ => {
                            lo.is_none_or(|l| min_key(&x) > l) && hi.is_none_or(|h| max_key(&x) < h)
                        }
                    };
                    if !fits {
                        return Err(out_of_order);
                    }
                    Some(x)
                }
            };
        }
        let [left, right] = links;
        let value: Bytes = match p.value {
            Some(v) => v.into(),
            None => {
                let n = match &twin {
                    Some(t) => t.node,
                    None => find(self.snapshot, p.key).ok_or(DecodeError::Unresolved {
                        why: "unaltered node's key not in snapshot",
                    })?,
                };
                if n.ncv() != p.scv {
                    return Err(DecodeError::Unresolved {
                        why: "unaltered node's content version does not match the snapshot",
                    });
                }
                n.val().clone()
            }
        };
        self.bounds[idx as usize] = range;
        let (hl, hr) = (height(&left), height(&right));
        if hl.abs_diff(hr) > 1 {
            return Err(DecodeError::BadTree {
                why: "subtree heights differ by more than one",
            });
        }
        let mut flags = 0u16;
        if p.kinds[0] == CHILD_LOCAL {
            flags |= LEFT_OWNED;
        }
        if p.kinds[1] == CHILD_LOCAL {
            flags |= RIGHT_OWNED;
        }
        for (f, g) in [
            (F_ALTERED, ALTERED),
            (F_DEPENDS_ON, DEPENDS_ON),
            (F_DEPENDS_ON_TREE, DEPENDS_ON_TREE),
            (F_ONLY_READ, SUBTREE_ONLY_READ),
        ] {
            if p.flags & f != 0 {
                flags |= g;
            }
        }
        let oldest = oldest_from(&left, &right, self.pos);
        Ok(Arc::new(Node {
            key,
            payload: value,
            left_link: left,
            right_link: right,
            owner: Some(self.owner.clone()),
            seq: idx + 1,
            vn_cache: AtomicU64::new(0),
            scv: p.scv,
            ssv: p.ssv,
            flags,
            height: hl.max(hr).saturating_add(1),
            extra: if p.ranges.is_empty() {
                None
            } else {
                Some(Box::new(Extra::Ranges(p.ranges.clone().into_boxed_slice())))
            },
            oldest,
            addr: AtomicU64::new(0),
        }))
    }
}

fn resolve_pointer(
    p: Option<(Vn, &[u8])>,
    snapshot: &Link,
    hint: Option<&Arc<Node>>,
) -> Result<Arc<Node>, DecodeError> {
    let (vn, key) = p.ok_or(DecodeError::BadTree {
        why: "pointer missing",
    })?;
    if let Some(h) = hint {
        if h.key[..] == *key && h.vn() == vn {
            return Ok(h.clone());
        }
    }
    let n = find(snapshot, key).ok_or(DecodeError::Unresolved {
        why: "pointer key not in snapshot",
    })?;
    if n.vn() != vn {
        return Err(DecodeError::Unresolved {
            why: "pointer version does not match the snapshot",
        });
    }
    Ok(n.clone())
}

fn in_interval(key: &[u8], r: &Interval) -> bool {
    r.0.as_deref().is_none_or(|lo| key > lo) && r.1.as_deref().is_none_or(|hi| key < hi)
}

#[cfg(test)]
mod tests {
    use integer_encoding::VarInt;
    use proptest::prelude::*;

    use super::Writer;

    fn both(v: u64) -> (Vec<u8>, Vec<u8>) {
        let mut w = Writer { buf: Vec::new() };
        w.varint(v);
        (w.buf, v.encode_var_vec())
    }

    #[test]
    fn varint_edges_match_the_crate_the_decoder_uses() {
        for shift in 0..64 {
            for v in [(1u64 << shift) - 1, 1u64 << shift, (1u64 << shift) + 1] {
                let (ours, theirs) = both(v);
                assert_eq!(ours, theirs, "varint of {v}");
            }
        }
        let (ours, theirs) = both(u64::MAX);
        assert_eq!(ours, theirs);
    }

    proptest! {
        #[test]
        fn varint_matches_the_crate_the_decoder_uses(v in any::<u64>()) {
            let (ours, theirs) = both(v);
            prop_assert_eq!(&ours, &theirs);
            prop_assert_eq!(u64::decode_var(&ours), Some((v, ours.len())));
        }
    }
}
