//! Writing an intention from a finished transaction.

use std::ops::Bound;
use std::sync::Arc;

use super::{
    CHILD_CROSS, CHILD_LOCAL, CHILD_NONE, F_ALTERED, F_DEPENDS_ON, F_DEPENDS_ON_TREE, F_HAS_SCV,
    F_HAS_SSV, F_ONLY_READ, INTENTION_MAGIC, INTENTION_VERSION,
};
use crate::error::{TxnError, MAX_INTENTION_BYTES, MAX_INTENTION_NODES};
use crate::isolation::Isolation;
use crate::node::{Bytes, Link, LogPos, Node, Owner, Vn};
use crate::range::KeyRange;

pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    /// Appends `v` as an unsigned LEB128 varint, the encoding
    /// `integer_encoding` reads back. Written out here because it runs
    /// hundreds of times per intention: going through a scratch buffer cost
    /// a `memcpy` call per varint, more than the encoding itself.
    pub(super) fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }
    pub(super) fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }
    pub(super) fn bound(&mut self, b: &Bound<Bytes>) {
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
    pub(super) fn ranges(&mut self, rs: &[KeyRange]) {
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

pub(super) fn count_local(t: &Link, local: &Arc<Owner>) -> usize {
    match t {
        Some(n) if n.same_owner(local) => {
            1 + count_local(n.left(), local) + count_local(n.right(), local)
        }
        _ => 0,
    }
}

pub(super) fn child_kind(c: &Link, local: &Arc<Owner>) -> u8 {
    match c {
        None => CHILD_NONE,
        Some(n) if n.same_owner(local) => CHILD_LOCAL,
        Some(_) => CHILD_CROSS,
    }
}

pub(super) fn encode_node(w: &mut Writer, n: &Arc<Node>, input: &EncodeInput<'_>) {
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
