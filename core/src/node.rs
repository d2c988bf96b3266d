//! Tree nodes, their meld metadata (meld paper §4, App. C) and node identity.
//!
//! Node identity is defined here and nowhere else: every node that is part of a
//! committed state has a *version number* (VN) that is unique in the database.
//! VNs are never stored per node in the log. A node belongs to an [`Owner`] (the
//! intention it was logged in, or the ephemeral intention meld created it in) and
//! has a 1-based post-order sequence number inside it; its VN is
//! `owner.base + seq`, where `base` is the CSN of the state the owner was melded
//! into (meld paper §4.1 and App. E). An intention's CSN is therefore
//! `base + node_count`, and an ephemeral intention created while melding
//! intention `I` starts at `CSN(I)`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::range::KeyRange;

/// A version number: the identity of a committed node. `0` means "none".
pub type Vn = u64;
/// A position in the shared log. Positions only grow and are never reused.
pub type LogPos = u64;
pub use crate::bytes::Bytes;
/// A child pointer: `None` is an empty subtree.
pub(crate) type Link = Option<Arc<Node>>;

/// What kind of container a node lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnerKind {
    /// Decoded from the intention at this log position.
    Intention(LogPos),
    /// Created by meld in an ephemeral intention (memory only, deterministic).
    Ephemeral,
    /// Created by a running transaction; not yet logged, has no VN.
    Local,
}

/// The container of a set of nodes; it fixes their VN base once melded.
#[derive(Debug)]
pub(crate) struct Owner {
    base: AtomicU64,
    pub(crate) kind: OwnerKind,
}

impl Owner {
    pub(crate) fn new(kind: OwnerKind, base: Vn) -> Arc<Owner> {
        Arc::new(Owner {
            base: AtomicU64::new(base),
            kind,
        })
    }
    /// Sets the VN base. Meld calls this once, before it compares any VN of the
    /// owner's nodes; it is a pure function of the log, so every node agrees.
    pub(crate) fn set_base(&self, base: Vn) {
        self.base.store(base, Ordering::Relaxed);
    }
    pub(crate) fn base(&self) -> Vn {
        self.base.load(Ordering::Relaxed)
    }
}

pub(crate) const ALTERED: u8 = 1;
pub(crate) const DEPENDS_ON: u8 = 2;
pub(crate) const DEPENDS_ON_TREE: u8 = 4;
pub(crate) const SUBTREE_ONLY_READ: u8 = 8;
/// Transaction-local only: a write (update, insert, delete, rotation) happened
/// at this node or below it. Encoded as the negation of SUBTREE_ONLY_READ.
pub(crate) const DIRTY: u8 = 16;
/// Decoded intention nodes only: the left (right) child is a node of the same
/// intention, not a pointer into the snapshot. Lets meld tell without
/// touching the (usually cold) child.
pub(crate) const LEFT_OWNED: u8 = 32;
pub(crate) const RIGHT_OWNED: u8 = 64;

/// `oldest` of a subtree that holds no logged node (only ephemeral ones).
pub const NO_LOGGED_NODE: LogPos = u64::MAX;

/// One node of the copy-on-write binary search tree.
///
/// `repr(C)` keeps the fields meld reads on every visit (key, children, VN,
/// SCV, flags, height) in the first 64-byte cache line.
#[derive(Debug)]
#[repr(C)]
pub struct Node {
    pub(crate) key: Bytes,
    pub(crate) left: Link,
    pub(crate) right: Link,
    /// The VN once computed (0 before): a cache of `owner.base + seq`,
    /// filled at creation for ephemeral nodes and on first use otherwise,
    /// so meld rarely has to load the (often cold) owner.
    pub(crate) vn_cache: AtomicU64,
    /// Source content version: VN of the node that first produced this payload
    /// as seen by the writer's snapshot (0 if the key did not exist there).
    pub(crate) scv: Vn,
    pub(crate) flags: u8,
    /// AVL height of the subtree (a leaf has height 1).
    pub(crate) height: u8,
    /// 1-based post-order position inside the owner.
    pub(crate) seq: u32,
    /// Source structure version: oldest version with exactly this subtree as
    /// seen in the writer's snapshot (0 if invalidated by a restructuring).
    pub(crate) ssv: Vn,
    pub(crate) owner: Arc<Owner>,
    pub(crate) value: Bytes,
    /// DependencyRange of a DependsOnTree node (phantom protection).
    pub(crate) ranges: Option<Box<[KeyRange]>>,
    /// OldestDescendant (App. B): the smallest log position of any logged
    /// intention with a node in this subtree, or NO_LOGGED_NODE.
    pub(crate) oldest: LogPos,
}

impl Node {
    /// The node's key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
    /// The node's value.
    pub fn value(&self) -> &[u8] {
        &self.value
    }
    /// The node's version number (identity). Only meaningful for committed nodes.
    #[inline]
    pub fn vn(&self) -> Vn {
        match self.vn_cache.load(Ordering::Relaxed) {
            0 => {
                let base = self.owner.base();
                let vn = base + self.seq as Vn;
                // Only a committed owner's VNs are final (its base is set
                // and never changes again); a local node's are not VNs.
                if base != 0 && self.owner.kind != OwnerKind::Local {
                    self.vn_cache.store(vn, Ordering::Relaxed);
                }
                vn
            }
            v => v,
        }
    }

    #[inline]
    pub(crate) fn flag(&self, f: u8) -> bool {
        self.flags & f != 0
    }
    #[inline]
    pub(crate) fn altered(&self) -> bool {
        self.flag(ALTERED)
    }
    #[inline]
    pub(crate) fn depends_on(&self) -> bool {
        self.flag(DEPENDS_ON)
    }
    #[inline]
    pub(crate) fn only_read(&self) -> bool {
        self.flag(SUBTREE_ONLY_READ)
    }
    /// New content version: the VN that produced this node's payload.
    #[inline]
    pub fn ncv(&self) -> Vn {
        if self.altered() {
            self.vn()
        } else {
            self.scv
        }
    }
    /// New structure version: the oldest version with exactly this subtree.
    #[inline]
    pub fn nsv(&self) -> Vn {
        if self.only_read() {
            self.ssv
        } else {
            self.vn()
        }
    }
    /// OldestDescendant (App. B): the smallest log position of any logged
    /// intention holding a node of this subtree (the node closest to the log
    /// head), or [`NO_LOGGED_NODE`] if all of them are ephemeral. Garbage
    /// collection sweeps subtrees whose value is below its threshold.
    pub fn oldest_descendant(&self) -> LogPos {
        self.oldest
    }
    /// Whether both nodes belong to the same owner (same intention).
    #[inline]
    pub(crate) fn same_owner(&self, other: &Arc<Owner>) -> bool {
        Arc::ptr_eq(&self.owner, other)
    }
}

impl Clone for Node {
    fn clone(&self) -> Node {
        Node {
            key: self.key.clone(),
            value: self.value.clone(),
            left: self.left.clone(),
            right: self.right.clone(),
            owner: self.owner.clone(),
            seq: self.seq,
            vn_cache: AtomicU64::new(self.vn_cache.load(Ordering::Relaxed)),
            scv: self.scv,
            ssv: self.ssv,
            flags: self.flags,
            height: self.height,
            ranges: self.ranges.clone(),
            oldest: self.oldest,
        }
    }
}

#[inline]
pub(crate) fn height(l: &Link) -> u8 {
    l.as_ref().map_or(0, |n| n.height)
}

#[inline]
pub(crate) fn nsv_of(l: &Link) -> Vn {
    l.as_ref().map_or(0, |n| n.nsv())
}

#[inline]
pub(crate) fn same(a: &Link, b: &Link) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => Arc::ptr_eq(x, y),
        _ => false,
    }
}

/// OldestDescendant of a node whose own log position is `own` (or
/// [`NO_LOGGED_NODE`] for an ephemeral node) with children `l` and `r`.
#[inline]
pub(crate) fn oldest_from(l: &Link, r: &Link, own: LogPos) -> LogPos {
    let f = |x: &Link| x.as_ref().map_or(NO_LOGGED_NODE, |n| n.oldest);
    own.min(f(l)).min(f(r))
}

/// Looks up `key` in a committed tree.
pub(crate) fn find<'a>(mut t: &'a Link, key: &[u8]) -> Option<&'a Arc<Node>> {
    while let Some(n) = t {
        match crate::bytes::cmp_keys(key, &n.key) {
            std::cmp::Ordering::Less => t = &n.left,
            std::cmp::Ordering::Greater => t = &n.right,
            std::cmp::Ordering::Equal => return Some(n),
        }
    }
    None
}

/// The smallest key of a non-empty subtree.
pub(crate) fn min_key(n: &Arc<Node>) -> &[u8] {
    let mut n = n;
    while let Some(l) = &n.left {
        n = l;
    }
    &n.key
}

/// The largest key of a non-empty subtree.
pub(crate) fn max_key(n: &Arc<Node>) -> &[u8] {
    let mut n = n;
    while let Some(r) = &n.right {
        n = r;
    }
    &n.key
}
