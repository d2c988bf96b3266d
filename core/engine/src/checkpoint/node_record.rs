//! One node as a checkpoint stores it, and reading a node back from its
//! record (the node cache's stubs load their bodies this way).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use integer_encoding::VarInt;

use crate::codec::Reader;
use crate::error::{DecodeError, MAX_KEY_LEN, MAX_VALUE_LEN};
use crate::node::{
    Bytes, Link, LogPos, Node, NodeAddr, NodeStore, Owner, OwnerKind, StoreError, Vn,
    NO_LOGGED_NODE, SUBTREE_ONLY_READ,
};

/// Tag bits of a node record: which children it has, and whether it
/// was logged (has an origin).
pub(super) const NODE_LEFT: u8 = 1;
pub(super) const NODE_RIGHT: u8 = 2;
pub(super) const NODE_LOGGED: u8 = 4;
/// Deepest tree accepted (an AVL tree of 2^64 keys is shallower).
pub(super) const MAX_HEIGHT: u8 = 100;

/// Appends `v` as a varint.
pub(super) fn put(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 10];
    let n = v.encode_var(&mut buf);
    out.extend_from_slice(&buf[..n]);
}

/// A subtree on the loader's stack: its root (a node, or a summary when
/// loading lazily) with its key bounds and where its record is.
pub(super) struct Built {
    pub(super) node: Option<Arc<Node>>,
    pub(super) key: Bytes,
    pub(super) vn: Vn,
    pub(super) ncv: Vn,
    pub(super) nsv: Vn,
    pub(super) origin: Option<LogPos>,
    pub(super) height: u8,
    pub(super) oldest: LogPos,
    pub(super) offset: u64,
    pub(super) min: Bytes,
    pub(super) max: Bytes,
}

/// The stub of a node known from its record's summary.
pub(super) fn stub_from(b: &Built, addr: NodeAddr, store: Arc<dyn NodeStore>) -> Arc<Node> {
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
/// One node as a checkpoint stores it:
///
/// ```text
/// len varint (of what follows up to the CRC) | tag u8 | height u8
/// | key (varint length, bytes) | value (varint length, bytes)
/// | vn | vn - ncv | nsv | origin (if tag & LOGGED) | oldest + 1 (0: none)
/// | offset - left child's offset (if tag & LEFT)
/// | offset - right child's offset (if tag & RIGHT) | crc32 u32 LE
/// ```
pub(super) struct NodeRecord<'a> {
    pub(super) key: &'a [u8],
    pub(super) value: &'a [u8],
    pub(super) vn: Vn,
    pub(super) ncv: Vn,
    pub(super) nsv: Vn,
    pub(super) origin: Option<LogPos>,
    pub(super) oldest: LogPos,
    pub(super) height: u8,
    pub(super) left: Option<u64>,
    pub(super) right: Option<u64>,
}

/// Fewest bytes a node record takes (len, tag, height, two empty lengths,
/// three versions, oldest, CRC).
pub(super) const MIN_RECORD: u64 = 13;

impl<'a> NodeRecord<'a> {
    pub(super) fn encode(&self, offset: u64) -> Vec<u8> {
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
    pub(super) fn parse(
        buf: &'a [u8],
        offset: u64,
        csn: Vn,
    ) -> Result<(NodeRecord<'a>, usize), DecodeError> {
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
    pub(super) fn owner(&self) -> Option<Arc<Owner>> {
        self.origin.map(|p| Owner::new(OwnerKind::Intention(p), 0))
    }

    /// The node, with the given children (loaded nodes are normalised:
    /// NCV kept as SCV, NSV as SSV).
    pub(super) fn node(
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

/// Reads one record through `store`.
pub(super) fn read_record(
    store: &Arc<dyn NodeStore>,
    addr: NodeAddr,
) -> Result<(Vec<u8>, usize), StoreError> {
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
pub(super) const WINDOW_BEFORE: u64 = 2048;
