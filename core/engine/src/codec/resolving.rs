//! Turning parsed nodes into tree nodes against the snapshot the writer
//! read, and checking that the result is an ordered, balanced tree.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::error::DecodeError;
use crate::isolation::Isolation;
use crate::node::{
    find, height, max_key, min_key, oldest_from, touch, Bytes, Extra, Link, LogPos, Node, Owner,
    OwnerKind, Vn, ALTERED, DEPENDS_ON, DEPENDS_ON_TREE, LEFT_OWNED, RIGHT_OWNED,
    SUBTREE_ONLY_READ,
};
use crate::range::KeyRange;

use super::parsing::ParsedIntention;
use super::{
    CHILD_CROSS, CHILD_LOCAL, CHILD_NONE, F_ALTERED, F_DEPENDS_ON, F_DEPENDS_ON_TREE, F_ONLY_READ,
};

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
pub(super) const MAX_DEPTH: u32 = 96;

/// An open key interval; `None` ends are unbounded.
pub(crate) type Interval = (Option<Bytes>, Option<Bytes>);

/// Whether every key of a subtree inside the open interval `inner` is
/// inside `(lo, hi)` as well.
pub(super) fn within(inner: &Interval, lo: Option<&[u8]>, hi: Option<&[u8]>) -> bool {
    lo.is_none_or(|l| inner.0.as_deref().is_some_and(|il| il >= l))
        && hi.is_none_or(|h| inner.1.as_deref().is_some_and(|ih| ih <= h))
}

/// Where a node's snapshot twin probably is, and the open key interval of
/// that snapshot node (from its snapshot ancestors).
#[derive(Clone)]
pub(super) struct Hint<'s> {
    pub(super) node: &'s Arc<Node>,
    pub(super) interval: Interval,
}

/// A child of a parsed node: none, a node of the same intention (its
/// index), or a pointer into the snapshot.
#[derive(Clone, Copy)]
pub(super) enum Kid<'a> {
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
/// dropping the local tree afterwards a decrement: a large share of the
/// commit path.
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
            // core's cache. Someone else holding one only costs a copy.
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

pub(super) struct Builder<'p, 'a> {
    pub(super) parsed: &'p ParsedIntention<'a>,
    pub(super) kids: &'p [[Kid<'a>; 2]],
    pub(super) snapshot: &'p Link,
    pub(super) owner: Arc<Owner>,
    pub(super) pos: LogPos,
    pub(super) bounds: Vec<Interval>,
}

impl<'s> Builder<'s, '_> {
    /// Builds node `idx`, whose subtree must lie in the open interval
    /// `range`; `hint` is where its snapshot twin probably is. Key order is
    /// checked top-down: each key against its interval, each pointer's
    /// subtree by its snapshot interval when it is the twin's own child
    /// (a valid tree keeps it there), by its extreme keys otherwise.
    pub(super) fn build(
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

pub(super) fn resolve_pointer(
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

pub(super) fn in_interval(key: &[u8], r: &Interval) -> bool {
    r.0.as_deref().is_none_or(|lo| key > lo) && r.1.as_deref().is_none_or(|hi| key < hi)
}
