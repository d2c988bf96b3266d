//! Meld (meld paper §3–7, App. C; Hyder II §3.3): a pure function from an
//! intention and the last committed state (LCS) to a decision and, on commit,
//! a new LCS.
//!
//! The recursion walks the intention and the LCS together. Each call gets an
//! LCS subtree `l`, an intention subtree `i` and the open key interval `gap`
//! that `l` covers; it returns the subtree that replaces `l`. Keys of `i`
//! outside `gap` are left to the calls that own them.
//!
//! * symmetric case (same root key): if the LCS subtree is unchanged since the
//!   writer's snapshot (`SSV(i) == NSV(l)`) the intention subtree is grafted
//!   as is; otherwise the pair is checked and both sides recurse;
//! * asymmetric case: the LCS root key splits `gap`; the intention node with
//!   that key, if any, is checked, and `i` is melded into both halves;
//! * read-only intention subtrees (SubtreeIsOnlyReadDependent) are only
//!   checked (`MeldNoEphem`); with `keep_readset` an unchanged one is
//!   returned instead of the LCS twin so its readset survives (Hyder II §3.3);
//! * deletes use the delete list (§6, third approach), and keys deleted in the
//!   conflict zone are remembered for a bounded window (tombstones) so that an
//!   insert-then-delete by other transactions is still seen as a conflict;
//! * results are reassembled with AVL `join`, which rebalances; every node it
//!   creates is an ephemeral node whose VN is `CSN(I) + k` for the k-th node
//!   created, so identities are the same on every node.

mod conflicts;
mod tree;

use std::cmp::Ordering;
use std::ops::Bound;
use std::sync::Arc;

use imbl::OrdMap;

use crate::bytes::cmp_keys;
use crate::codec::Intention;
use crate::node::{same, Bytes, Link, LogPos, Node, Vn, LEFT_OWNED, RIGHT_OWNED};
use crate::range::{Gap, KeyRange, RangeRef};

/// Why meld aborted a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbortReason {
    /// A transaction in the conflict zone wrote (updated, inserted or
    /// deleted) a key this transaction also wrote or deleted.
    WriteWrite {
        /// The contested key.
        key: Bytes,
    },
    /// A transaction in the conflict zone changed a key this transaction read.
    ReadWrite {
        /// The key that was read.
        key: Bytes,
    },
    /// A transaction in the conflict zone inserted, updated or deleted a key
    /// inside a range this transaction scanned (or a key it found absent).
    Phantom {
        /// The range that was read.
        range: KeyRange,
    },
    /// The conflict zone is longer than the database's `max_conflict_zone`
    /// (App. B): the snapshot is too old. Retry on a newer snapshot.
    SnapshotTooOld {
        /// The transaction's snapshot position.
        snapshot_pos: LogPos,
        /// The oldest snapshot position still accepted.
        oldest_accepted: LogPos,
    },
    /// The snapshot is not a state any node can have: with group meld on,
    /// the first position of a pair has no state of its own. Retry on the
    /// latest state.
    SnapshotUnavailable {
        /// The transaction's snapshot position.
        snapshot_pos: LogPos,
    },
    /// The log entry is not a valid intention; every node rejects it alike.
    Malformed(crate::error::DecodeError),
}

impl AbortReason {
    /// The variant's name (`WriteWrite`, `ReadWrite`, `Phantom`,
    /// `SnapshotTooOld`, `SnapshotUnavailable`, `Malformed`): a stable code
    /// for bindings and tools.
    pub fn code(&self) -> &'static str {
        match self {
            AbortReason::WriteWrite { .. } => "WriteWrite",
            AbortReason::ReadWrite { .. } => "ReadWrite",
            AbortReason::Phantom { .. } => "Phantom",
            AbortReason::SnapshotTooOld { .. } => "SnapshotTooOld",
            AbortReason::SnapshotUnavailable { .. } => "SnapshotUnavailable",
            AbortReason::Malformed(_) => "Malformed",
        }
    }

    /// The key the conflict is about, where there is one: the contested or
    /// read key, or for a phantom the start of the range that was read.
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            AbortReason::WriteWrite { key } | AbortReason::ReadWrite { key } => Some(key),
            AbortReason::Phantom { range } => match &range.start {
                std::ops::Bound::Included(k) | std::ops::Bound::Excluded(k) => Some(k),
                std::ops::Bound::Unbounded => None,
            },
            _ => None,
        }
    }
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AbortReason::WriteWrite { key } => {
                write!(f, "write-write conflict on key {:?}", String::from_utf8_lossy(key))
            }
            AbortReason::ReadWrite { key } => {
                write!(f, "read-write conflict on key {:?}", String::from_utf8_lossy(key))
            }
            AbortReason::Phantom { range } => write!(f, "phantom in scanned range {range:?}"),
            AbortReason::SnapshotTooOld {
                snapshot_pos,
                oldest_accepted,
            } => write!(
                f,
                "snapshot at {snapshot_pos} is older than the oldest accepted ({oldest_accepted}); retry"
            ),
            AbortReason::SnapshotUnavailable { snapshot_pos } => write!(
                f,
                "no committed state exists at snapshot position {snapshot_pos} (inside a group-meld pair); retry"
            ),
            AbortReason::Malformed(e) => write!(f, "malformed intention: {e}"),
        }
    }
}

/// Work done by one meld, the figures of the paper's §8.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeldStats {
    /// Intention nodes visited.
    pub intention_nodes: u64,
    /// LCS nodes visited.
    pub lcs_nodes: u64,
    /// Ephemeral nodes created.
    pub ephemeral_nodes: u64,
    /// Nodes visited while checking dependency ranges.
    pub range_nodes: u64,
}

/// Keys deleted recently, with the log position of the deleting intention.
/// Entries older than the conflict-zone bound can never matter and are pruned.
///
/// Deletions of keys that were absent anyway (a transaction inserted and
/// deleted a key its snapshot did not hold) change no node, so the
/// structure versions that let meld graft unchanged subtrees cannot reveal
/// them; they are also kept in `noop`, which meld consults before grafting.
///
/// The maps are persistent (cloning shares structure), so every retained
/// state carries the tombstones as of its own position: premeld checks an
/// intention against an older state with exactly that state's deletions,
/// whatever final meld has done since.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tombstones {
    map: OrdMap<Bytes, LogPos>,
    noop: OrdMap<Bytes, LogPos>,
    noop_last: LogPos,
}

impl Tombstones {
    pub(crate) fn record(&mut self, key: &Bytes, pos: LogPos, noop: bool) {
        self.map.insert(key.clone(), pos);
        if noop {
            self.noop.insert(key.clone(), pos);
            self.noop_last = pos;
        }
    }
    /// Drops entries at or before `pos`.
    pub(crate) fn prune(&mut self, pos: LogPos) {
        for m in [&mut self.map, &mut self.noop] {
            let old: Vec<Bytes> = m
                .iter()
                .filter(|(_, p)| **p <= pos)
                .map(|(k, _)| k.clone())
                .collect();
            for k in old {
                m.remove(&k);
            }
        }
    }
    fn noop_in(&self, r: RangeRef<'_>, pos: LogPos) -> bool {
        self.noop_last > pos && deleted_in(&self.noop, r, pos)
    }
    fn deleted_after(&self, key: &[u8], pos: LogPos) -> bool {
        self.map.get(key).is_some_and(|p| *p > pos)
    }
    fn any_in(&self, r: RangeRef<'_>, pos: LogPos) -> bool {
        deleted_in(&self.map, r, pos)
    }
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

/// Whether `map` records a deletion after `pos` of a key inside `r`.
fn deleted_in(map: &OrdMap<Bytes, LogPos>, r: RangeRef<'_>, pos: LogPos) -> bool {
    !map.is_empty()
        && !r.is_empty()
        && map
            .range::<(Bound<&[u8]>, Bound<&[u8]>), [u8]>((r.start, r.end))
            .any(|(_, p)| *p > pos)
}

/// Inputs of one meld.
pub(crate) struct MeldInput<'a> {
    pub(crate) intention: &'a Intention,
    /// Root of the LCS and its CSN.
    pub(crate) lcs_root: &'a Link,
    pub(crate) lcs_csn: Vn,
    /// Root of the writer's snapshot.
    pub(crate) snapshot_root: &'a Link,
    pub(crate) tombstones: &'a Tombstones,
    pub(crate) keep_readset: bool,
}

/// A successful meld: the new LCS root and the number of ephemeral nodes.
pub(crate) struct Melded {
    pub(crate) root: Link,
    pub(crate) ephemeral: u32,
}

/// Results inside the recursion carry a boxed reason: conflicts are rare,
/// and a register-sized `Result` keeps every successful call cheap.
type R<T> = Result<T, Box<AbortReason>>;

/// A subtree of the intention being melded: `None` when empty or when it is
/// a pointer into the snapshot (which holds no change of the intention).
type ILink<'t> = Option<&'t Arc<Node>>;

/// The left child of an intention node, if it is in the same intention.
#[inline]
fn ileft(n: &Arc<Node>) -> ILink<'_> {
    if n.flag(LEFT_OWNED) {
        n.left().as_ref()
    } else {
        None
    }
}

/// The right child of an intention node, if it is in the same intention.
#[inline]
fn iright(n: &Arc<Node>) -> ILink<'_> {
    if n.flag(RIGHT_OWNED) {
        n.right().as_ref()
    } else {
        None
    }
}

/// Melds one intention into the LCS. Pure: the result depends only on the
/// inputs, so every node computes the same decision and the same nodes.
pub(crate) fn meld(input: &MeldInput<'_>, stats: &mut MeldStats) -> R<Melded> {
    let i = input.intention;
    // CSN(I) = CSN(LCS) + |I|; I's node VNs follow from their positions.
    i.owner.set_base(input.lcs_csn);
    let csn_i = input.lcs_csn + i.node_count as Vn;
    if same(input.snapshot_root, input.lcs_root) && input.tombstones.noop_last <= i.snapshot_pos {
        // Serial intention: nothing committed since its snapshot.
        stats.intention_nodes += 1;
        return Ok(Melded {
            root: i.root.clone(),
            ephemeral: 0,
        });
    }
    let mut cx = Cx {
        i,
        snapshot: input.snapshot_root,
        lcs_root: input.lcs_root,
        tombs: input.tombstones,
        snap_pos: i.snapshot_pos,
        keep_readset: input.keep_readset,
        eph_base: csn_i,
        eph_count: 0,
        stats,
    };
    for r in &i.header_ranges {
        if cx.range_changed(r) {
            return Err(Box::new(AbortReason::Phantom { range: r.clone() }));
        }
    }
    // The whole intention against the whole LCS: both cover every key.
    let root = cx.meld(input.lcs_root, i.owned_root(), Gap::ALL, true)?;
    cx.stats.ephemeral_nodes += cx.eph_count as u64;
    Ok(Melded {
        root,
        ephemeral: cx.eph_count,
    })
}

struct Cx<'a, 's> {
    i: &'a Intention,
    snapshot: &'a Link,
    lcs_root: &'a Link,
    tombs: &'a Tombstones,
    snap_pos: LogPos,
    keep_readset: bool,
    /// VN base of the ephemeral nodes this meld makes: `CSN(I)`.
    eph_base: Vn,
    eph_count: u32,
    stats: &'s mut MeldStats,
}

impl<'a> Cx<'a, '_> {
    /// Descends `t` through intention nodes outside `gap`; those belong to
    /// other calls of the recursion. When `aligned` (see [`Cx::meld`]) `t`
    /// is inside `gap` already and nothing is compared.
    ///
    /// Inlined: almost always `t` is already inside `gap`, and the call
    /// itself (saving and restoring registers) cost more than that check.
    #[inline(always)]
    fn narrow<'t>(&mut self, t: ILink<'t>, gap: Gap<'_>, aligned: bool) -> ILink<'t> {
        debug_assert!(!aligned || t.is_none_or(|n| gap.contains(&n.key)));
        if aligned {
            return t;
        }
        match t {
            Some(n) if gap.contains(&n.key) => t,
            None => None,
            Some(_) => self.narrow_out(t, gap),
        }
    }

    /// `narrow` when `t`'s root lies outside `gap`.
    #[inline(never)]
    fn narrow_out<'t>(&mut self, mut t: ILink<'t>, gap: Gap<'_>) -> ILink<'t> {
        while let Some(n) = t {
            match gap.cmp_key(&n.key) {
                Ordering::Less => t = iright(n),
                Ordering::Greater => t = ileft(n),
                Ordering::Equal => break,
            }
            self.stats.intention_nodes += 1;
        }
        t
    }

    /// The intention node with `key` below `t`, if the intention holds one.
    fn find_owned<'t>(&mut self, mut t: ILink<'t>, key: &[u8]) -> ILink<'t> {
        while let Some(n) = t {
            self.stats.intention_nodes += 1;
            match cmp_keys(key, &n.key) {
                Ordering::Less => t = ileft(n),
                Ordering::Greater => t = iright(n),
                Ordering::Equal => return Some(n),
            }
        }
        None
    }

    fn deletes_in(&self, gap: Gap<'_>) -> &'a [(Bytes, Vn)] {
        let d: &'a [(Bytes, Vn)] = &self.i.deletes;
        if d.is_empty() {
            return d;
        }
        let from = match gap.lo {
            None => 0,
            Some(lo) => d.partition_point(|(k, _)| &k[..] <= lo),
        };
        let to = match gap.hi {
            None => d.len(),
            Some(hi) => d.partition_point(|(k, _)| &k[..] < hi),
        };
        &d[from..to.max(from)]
    }

    fn deleted_scv(&self, key: &[u8]) -> Option<Vn> {
        let d = &self.i.deletes;
        d.binary_search_by(|(k, _)| k[..].cmp(key))
            .ok()
            .map(|ix| d[ix].1)
    }

    /// Whether intention subtree `n` can replace an LCS subtree of `gap` as
    /// is: no delete and no silent insert-then-delete inside, and all its
    /// keys inside `gap` (its own interval is; when `aligned`, that
    /// interval is `gap` itself, see [`Cx::meld`]).
    fn graftable(&self, n: &Arc<Node>, gap: Gap<'_>, aligned: bool) -> bool {
        self.deletes_in(gap).is_empty()
            && !self.tombs.noop_in(gap.as_range(), self.snap_pos)
            && self
                .i
                .bounds
                .get(n.seq as usize - 1)
                .is_some_and(|(lo, hi)| {
                    aligned
                        || gap.lo.is_none_or(|g| {
                            lo.as_deref()
                                .is_some_and(|l| cmp_keys(l, g) != Ordering::Less)
                        }) && gap.hi.is_none_or(|g| {
                            hi.as_deref()
                                .is_some_and(|h| cmp_keys(h, g) != Ordering::Greater)
                        })
                })
    }

    /// Melds intention subtree `i` into LCS subtree `l`, which covers `gap`.
    ///
    /// `aligned`: every call above this one was symmetric (same key on
    /// both sides), so the keys that bound `l`'s interval also bound `i`'s
    /// in the intention: `i` lies inside `gap` and its interval is `gap`.
    /// Then narrowing and the graft's interval test cannot change anything
    /// and are skipped; updates keep almost every call aligned.
    fn meld<'t>(&mut self, l: &'t Link, i: ILink<'t>, gap: Gap<'t>, aligned: bool) -> R<Link>
    where
        'a: 't,
    {
        let i = self.narrow(i, gap, aligned);
        let Some(inode) = i else {
            // No intention changes in this interval but its deletes.
            if self.i.deletes.is_empty() {
                return Ok(l.clone());
            }
            return self.apply_deletes(l.clone(), gap);
        };
        self.stats.intention_nodes += 1;
        if inode.only_read() {
            return self.meld_read_only(l, i, inode, gap, aligned);
        }
        let Some(lnode) = l else {
            return self.keep_inserts(i, gap);
        };
        self.stats.lcs_nodes += 1;
        let lk: &'t [u8] = &lnode.key;
        let symmetric = cmp_keys(&inode.key, &lnode.key) == Ordering::Equal;
        let twin = if symmetric {
            if inode.ssv != 0 && inode.ssv == lnode.nsv() && self.graftable(inode, gap, aligned) {
                // Serial case for this subtree: nothing under `l` changed
                // since the writer's snapshot.
                return Ok(Some(inode.clone()));
            }
            Some(inode)
        } else {
            self.find_owned(i, lk)
        };
        if let Some(t) = twin {
            self.check(t, Some(lnode))?;
        }
        let (li, ri) = if symmetric {
            (ileft(inode), iright(inode))
        } else {
            (i, i)
        };
        let aligned = aligned && symmetric;
        let left = self.meld_child(lnode.left(), li, gap.left_of(lk), aligned)?;
        let right = self.meld_child(lnode.right(), ri, gap.right_of(lk), aligned)?;
        let mid = self.mid(twin, lnode)?;
        Ok(self.assemble(lnode, left, mid, right))
    }

    /// `meld` for a child, skipping the call when the intention has nothing
    /// there (no node and no delete): the LCS child stays as it is.
    #[inline]
    fn meld_child<'t>(&mut self, l: &'t Link, i: ILink<'t>, gap: Gap<'t>, aligned: bool) -> R<Link>
    where
        'a: 't,
    {
        if i.is_none() && self.i.deletes.is_empty() {
            return Ok(l.clone());
        }
        self.meld(l, i, gap, aligned)
    }

    /// The content that ends up under the LCS node's key: the intention's
    /// version if it altered it, nothing if it deleted it, else the LCS's.
    fn mid<'t>(
        &self,
        twin: Option<&'t Arc<Node>>,
        lnode: &'t Arc<Node>,
    ) -> R<Option<&'t Arc<Node>>> {
        if let Some(scv) = self.deleted_scv(&lnode.key) {
            if scv != lnode.ncv() {
                return Err(Box::new(AbortReason::WriteWrite {
                    key: lnode.key.clone(),
                }));
            }
            return Ok(None);
        }
        Ok(match twin {
            Some(t) if t.altered() => Some(t),
            _ => Some(lnode),
        })
    }

    fn assemble(
        &mut self,
        lnode: &Arc<Node>,
        left: Link,
        mid: Option<&Arc<Node>>,
        right: Link,
    ) -> Link {
        match mid {
            Some(c)
                if Arc::ptr_eq(c, lnode)
                    && same(&left, lnode.left())
                    && same(&right, lnode.right()) =>
            {
                Some(lnode.clone())
            }
            Some(c) => Some(self.join(left, c, Some(lnode), right)),
            None => self.join2(left, right),
        }
    }

    /// `MeldNoEphem`: a subtree the intention only read.
    fn meld_read_only<'t>(
        &mut self,
        l: &'t Link,
        i: ILink<'t>,
        inode: &'t Arc<Node>,
        gap: Gap<'t>,
        aligned: bool,
    ) -> R<Link>
    where
        'a: 't,
    {
        let Some(lnode) = l else {
            return self.keep_inserts(i, gap);
        };
        let symmetric = cmp_keys(&inode.key, &lnode.key) == Ordering::Equal;
        if symmetric && inode.ssv == lnode.nsv() && self.graftable(inode, gap, aligned) {
            return Ok(if self.keep_readset {
                Some(inode.clone())
            } else {
                l.clone()
            });
        }
        self.check_only(l, i, gap, aligned)?;
        self.apply_deletes(l.clone(), gap)
    }

    /// Conflict detection without building anything (`aligned` as in
    /// [`Cx::meld`]).
    fn check_only<'t>(&mut self, l: &'t Link, i: ILink<'t>, gap: Gap<'t>, aligned: bool) -> R<()>
    where
        'a: 't,
    {
        let i = self.narrow(i, gap, aligned);
        let Some(inode) = i else {
            return Ok(());
        };
        self.stats.intention_nodes += 1;
        let Some(lnode) = l else {
            let mut kept = Vec::new();
            let mut clean = true;
            return self.collect(i, gap, &mut kept, &mut clean);
        };
        self.stats.lcs_nodes += 1;
        let lk: &'t [u8] = &lnode.key;
        if cmp_keys(&inode.key, &lnode.key) == Ordering::Equal {
            if inode.ssv != 0 && inode.ssv == lnode.nsv() {
                return Ok(());
            }
            self.check(inode, Some(lnode))?;
            self.check_only(lnode.left(), ileft(inode), gap.left_of(lk), aligned)?;
            self.check_only(lnode.right(), iright(inode), gap.right_of(lk), aligned)
        } else {
            if let Some(t) = self.find_owned(i, lk) {
                self.check(t, Some(lnode))?;
            }
            self.check_only(lnode.left(), i, gap.left_of(lk), false)?;
            self.check_only(lnode.right(), i, gap.right_of(lk), false)
        }
    }

    /// The LCS holds no key in `gap`: keep the intention's inserts there,
    /// after checking every intention node in `gap`.
    fn keep_inserts<'t>(&mut self, i: ILink<'t>, gap: Gap<'t>) -> R<Link>
    where
        'a: 't,
    {
        for (k, scv) in self.deletes_in(gap) {
            // A key the intention deleted is already gone (or, if it was
            // absent from the snapshot too, was inserted and deleted since).
            if *scv != 0 || self.tombs.deleted_after(k, self.snap_pos) {
                return Err(Box::new(AbortReason::WriteWrite { key: k.clone() }));
            }
        }
        let mut kept = Vec::new();
        let mut clean = true;
        self.collect(i, gap, &mut kept, &mut clean)?;
        if clean {
            // The subtree holds only this intention's inserts, all in `gap`.
            return Ok(i.cloned());
        }
        Ok(self.build(&kept))
    }

    /// Checks every intention node of `t` inside `gap` against an empty LCS
    /// interval and collects the inserts in key order. `clean` stays true if
    /// the subtree is exactly those inserts.
    fn collect<'t>(
        &mut self,
        t: ILink<'t>,
        gap: Gap<'t>,
        out: &mut Vec<&'t Arc<Node>>,
        clean: &mut bool,
    ) -> R<()>
    where
        'a: 't,
    {
        let Some(n) = t else { return Ok(()) };
        if (n.left().is_some() && !n.flag(LEFT_OWNED))
            || (n.right().is_some() && !n.flag(RIGHT_OWNED))
        {
            // Snapshot keys below that the LCS no longer holds (deleted
            // concurrently): the subtree cannot be kept as is.
            *clean = false;
        }
        self.stats.intention_nodes += 1;
        match gap.cmp_key(&n.key) {
            Ordering::Less => {
                *clean = false;
                self.collect(iright(n), gap, out, clean)
            }
            Ordering::Greater => {
                *clean = false;
                self.collect(ileft(n), gap, out, clean)
            }
            Ordering::Equal => {
                self.collect(ileft(n), gap, out, clean)?;
                self.check(n, None)?;
                if n.scv == 0 {
                    out.push(n);
                } else {
                    *clean = false;
                }
                self.collect(iright(n), gap, out, clean)
            }
        }
    }

    fn build(&mut self, nodes: &[&Arc<Node>]) -> Link {
        if nodes.is_empty() {
            return None;
        }
        let mid = nodes.len() / 2;
        let l = self.build(&nodes[..mid]);
        let r = self.build(&nodes[mid + 1..]);
        Some(self.make(nodes[mid], l, r, None))
    }
}
