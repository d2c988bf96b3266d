//! Transactions: optimistic execution on a snapshot, producing an intention.
//!
//! A transaction never changes shared state. It builds a private
//! copy-on-write version of its snapshot's tree (App. E): every node it
//! writes, and under the stronger levels every node it reads, is copied
//! together with the path from the root, carrying the metadata meld needs
//! (SCV, SSV, Altered, DependsOn). Untouched subtrees stay shared with the
//! snapshot and become cross-intention pointers in the encoded intention.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::codec::{encode, EncodeInput};
use crate::error::{check_key, check_value, TxnError};
use crate::isolation::Isolation;
use crate::node::{
    height, Bytes, Extra, Link, Node, Owner, OwnerKind, Vn, ALTERED, DEPENDS_ON, DEPENDS_ON_TREE,
    DIRTY,
};
use crate::range::KeyRange;
use crate::snapshot::Snapshot;

mod range;
pub use range::TxnRange;

/// What a finished transaction hands to its host.
#[derive(Debug)]
pub enum Finished {
    /// The transaction wrote nothing: it is done, nothing is logged.
    ReadOnly,
    /// The intention bytes to append to the log; the outcome is known once
    /// meld processes that log entry.
    Intention(Vec<u8>),
}

/// A finished transaction's tree and lists, before encoding. A clone
/// shares the tree (converting a clone copies its nodes instead of moving
/// them).
#[derive(Debug, Clone)]
struct Sealed {
    root: Link,
    local: Arc<Owner>,
    isolation: Isolation,
    snapshot: Snapshot,
    deletes: Vec<(Bytes, Vn)>,
    header_ranges: Vec<KeyRange>,
}

impl Sealed {
    /// The intention record to append to the log.
    fn encode(&self) -> Result<Vec<u8>, TxnError> {
        encode(&EncodeInput {
            root: &self.root,
            local: &self.local,
            isolation: self.isolation,
            snapshot_pos: self.snapshot.pos,
            snapshot_csn: self.snapshot.csn,
            deletes: &self.deletes,
            header_ranges: &self.header_ranges,
        })
    }

    /// The same intention as decoded tree nodes at log position `pos`
    /// (what resolving [`Sealed::encode`]'s bytes there would give).
    fn intention(self, pos: crate::node::LogPos) -> crate::codec::Intention {
        crate::codec::from_local(
            self.root,
            &self.local,
            pos,
            self.snapshot,
            self.isolation,
            self.deletes,
            self.header_ranges,
        )
    }
}

/// A finished transaction's intention as tree nodes, kept next to its bytes
/// by a host that melds in the same process: [`crate::Melder::apply_local`]
/// uses it instead of decoding the bytes again (the result is identical).
#[derive(Debug, Clone)]
pub struct LocalIntention {
    sealed: Sealed,
}

impl LocalIntention {
    /// Log position of the snapshot the transaction read.
    pub fn snapshot_pos(&self) -> crate::node::LogPos {
        self.sealed.snapshot.pos
    }

    /// The snapshot the transaction read.
    pub(crate) fn snapshot(&self) -> &Snapshot {
        &self.sealed.snapshot
    }

    /// The decoded intention at log position `pos`, if `snapshot_root` is
    /// the very tree the transaction read (same nodes), else `None`.
    pub(crate) fn at(
        self,
        pos: crate::node::LogPos,
        snapshot: &Snapshot,
    ) -> Option<crate::codec::Intention> {
        let mine = &self.sealed.snapshot;
        if !crate::node::same(&mine.root, &snapshot.root)
            || mine.csn != snapshot.csn
            || mine.pos != snapshot.pos
            || mine.db != snapshot.db
        {
            return None;
        }
        Some(self.sealed.intention(pos))
    }
}

/// A transaction running on a snapshot. Sans-IO: it only computes.
#[derive(Debug)]
pub struct Transaction {
    snapshot: Snapshot,
    isolation: Isolation,
    local: Arc<Owner>,
    root: Link,
    /// Keys of the snapshot this transaction deleted, with their content version.
    deleted: BTreeMap<Bytes, Vn>,
    ranges: Vec<KeyRange>,
    wrote: bool,
    /// Whether a node was removed: from then on a subtree's key interval
    /// may be wider than in the snapshot (a boundary key is gone), so a new
    /// key inserted below a node may lie outside the interval its SSV vouches
    /// for. Inserts then void the SSV along their path.
    widened: bool,
    /// A read of the snapshot back from the log failed (node cache).
    failed: Option<crate::node::StoreError>,
    /// Keys read while the tree was still the snapshot's, whose read marks
    /// are not in the tree yet. Marking copies the path from the root, which
    /// only a transaction that writes needs (a read-only one logs nothing),
    /// so the marks wait for the first write ([`Transaction::mark_reads`])
    /// and are then made in read order: the tree ends exactly as if each
    /// read had marked at once.
    unmarked: Vec<Bytes>,
}

enum Dir {
    Here,
    Left,
    Right,
}

impl Transaction {
    /// Begins a transaction on `snapshot`.
    pub fn begin(snapshot: &Snapshot, isolation: Isolation) -> Transaction {
        Transaction {
            snapshot: snapshot.clone(),
            isolation,
            local: Owner::new(OwnerKind::Local, 0),
            root: snapshot.root.clone(),
            failed: None,
            unmarked: Vec::new(),
            deleted: BTreeMap::new(),
            ranges: Vec::new(),
            wrote: false,
            widened: false,
        }
    }

    /// The snapshot this transaction reads.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The isolation level.
    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    /// Whether the transaction has written anything so far.
    pub fn has_writes(&self) -> bool {
        self.wrote
    }

    /// Reads `key`, seeing this transaction's own writes.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, TxnError> {
        self.live()?;
        let r = self.get_inner(key);
        self.settle(r)
    }

    fn get_inner(&mut self, key: &[u8]) -> Result<Option<Bytes>, TxnError> {
        check_key(key)?;
        let found = crate::node::find(&self.root, key).cloned();
        match found {
            Some(n) => {
                if self.isolation.tracks_reads() {
                    self.note_read(key, &n);
                }
                Ok(Some(n.val().clone()))
            }
            None => {
                self.note_absent(key);
                Ok(None)
            }
        }
    }

    /// Writes `value` under `key` (insert or update).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), TxnError> {
        self.live()?;
        let r = self.put_inner(key, value);
        self.settle(r)
    }

    fn put_inner(&mut self, key: &[u8], value: &[u8]) -> Result<(), TxnError> {
        check_key(key)?;
        check_value(value)?;
        self.mark_reads();
        let root = self.root.clone();
        let v: Bytes = value.into();
        self.root = Some(self.insert(&root, key, &v).0);
        self.wrote = true;
        Ok(())
    }

    /// Deletes `key`; returns whether it existed. Deleting an absent key
    /// writes nothing and counts as a read of its absence.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool, TxnError> {
        self.live()?;
        let r = self.delete_inner(key);
        self.settle(r)
    }

    fn delete_inner(&mut self, key: &[u8]) -> Result<bool, TxnError> {
        check_key(key)?;
        self.mark_reads();
        let root = self.root.clone();
        match self.remove(&root, key) {
            Some((new_root, removed)) => {
                self.root = new_root;
                self.wrote = true;
                self.widened = true;
                let local = removed.same_owner(&self.local);
                // Source version 0: the key was absent from the snapshot and
                // inserted by this transaction. The delete is still a write
                // (log-order replay deletes whatever is there), so it is
                // listed and validated like any other.
                let source = if local { removed.scv } else { removed.ncv() };
                self.deleted.insert(removed.key.clone(), source);
                if local {
                    if let Some(rs) = removed.ranges() {
                        self.ranges.extend(rs.iter().cloned());
                    }
                }
                Ok(true)
            }
            None => {
                self.note_absent(key);
                Ok(false)
            }
        }
    }

    /// Fails if an earlier operation could not read the snapshot back;
    /// clears a read failure some other operation left on this thread.
    fn live(&self) -> Result<(), TxnError> {
        if let Some(e) = &self.failed {
            return Err(TxnError::Store(e.clone()));
        }
        let _ = crate::node::take_store_error();
        Ok(())
    }

    /// A read of the snapshot failed during the operation: its result and
    /// the transaction's tree may hold an empty node in its place, so the
    /// transaction is dead (every later call fails the same way).
    fn settle<T>(&mut self, r: Result<T, TxnError>) -> Result<T, TxnError> {
        if let Some(e) = crate::node::take_store_error() {
            self.failed = Some(e.clone());
            return Err(TxnError::Store(e));
        }
        r
    }

    /// Finishes the transaction: read-only transactions are done; others
    /// yield the intention to append to the log.
    pub fn finish(self) -> Result<Finished, TxnError> {
        Ok(match self.finish_local()? {
            None => Finished::ReadOnly,
            Some((bytes, _)) => Finished::Intention(bytes),
        })
    }

    /// Like [`Transaction::finish`], but also returns the intention as tree
    /// nodes for a host that melds in this process
    /// ([`crate::Melder::apply_local`]): the bytes still go to the log.
    pub fn finish_local(self) -> Result<Option<(Vec<u8>, LocalIntention)>, TxnError> {
        self.live()?;
        if !self.wrote {
            return Ok(None);
        }
        let sealed = self.seal();
        let bytes = sealed.encode()?;
        Ok(Some((bytes, LocalIntention { sealed })))
    }

    /// The final local tree, delete list and header ranges.
    fn seal(mut self) -> Sealed {
        self.mark_reads();
        let mut header_ranges = Vec::new();
        let ranges = std::mem::take(&mut self.ranges);
        // Dependency ranges go on the root: its interval is every key, so no
        // restructuring by this transaction (a deleted boundary key widens a
        // lower node's interval beyond its snapshot's) can hide a phantom
        // behind a serial graft below it.
        match &self.root {
            Some(root) if !ranges.is_empty() => {
                let mut c = self.local_copy(root);
                c.flags |= DEPENDS_ON_TREE;
                let mut all: Vec<KeyRange> = match c.extra.take().map(|e| *e) {
                    Some(Extra::Ranges(r)) => Vec::from(r),
                    _ => Vec::new(),
                };
                all.extend(ranges);
                c.extra = Some(Box::new(Extra::Ranges(all.into_boxed_slice())));
                self.root = Some(Arc::new(c));
            }
            Some(_) => {}
            None => header_ranges = ranges,
        }
        Sealed {
            root: self.root,
            local: self.local,
            isolation: self.isolation,
            snapshot: self.snapshot,
            deletes: self.deleted.into_iter().collect(),
            header_ranges,
        }
    }

    // ------------------------------------------------------------ tree edits

    /// Records that `key` was found absent: a point dependency under the
    /// read-validating levels, unless this transaction deleted it itself.
    fn note_absent(&mut self, key: &[u8]) {
        if self.isolation.tracks_reads() && !self.deleted.contains_key(key) {
            self.ranges.push(KeyRange::point(key));
        }
    }

    fn needs_read_mark(&self, n: &Node) -> bool {
        if n.same_owner(&self.local) {
            // Own inserts and own updates need no validation; an unaltered
            // copy of a snapshot node does, once.
            !n.altered() && n.scv != 0 && !n.depends_on()
        } else {
            true
        }
    }

    /// Records a read of `key`, found as `n` in the current tree: put off
    /// while the tree is the snapshot's (see [`Transaction::unmarked`]),
    /// marked at once otherwise.
    fn note_read(&mut self, key: &[u8], n: &Node) {
        let untouched = match (&self.root, &self.snapshot.root) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        };
        if untouched {
            self.unmarked.push(key.into());
        } else if self.needs_read_mark(n) {
            self.mark_read(key);
        }
    }

    /// Makes the read marks put off so far, in read order. Called before
    /// the first change to the tree; a key read twice is marked once, as
    /// it would have been at read time.
    fn mark_reads(&mut self) {
        for key in std::mem::take(&mut self.unmarked) {
            let found = crate::node::find(&self.root, &key).cloned();
            if let Some(n) = found {
                if self.needs_read_mark(&n) {
                    self.mark_read(&key);
                }
            }
        }
    }

    fn local_copy(&self, n: &Arc<Node>) -> Node {
        if n.same_owner(&self.local) {
            return (**n).clone();
        }
        Node {
            key: n.key.clone(),
            payload: n.val().clone(),
            left_link: n.left().clone(),
            right_link: n.right().clone(),
            owner: Some(self.local.clone()),
            seq: 0,
            vn_cache: AtomicU64::new(0),
            scv: n.ncv(),
            ssv: n.nsv(),
            flags: 0,
            height: n.height,
            extra: None,
            oldest: 0,
            addr: AtomicU64::new(0),
        }
    }

    fn mark_read(&mut self, key: &[u8]) {
        if let Some(root) = self.root.take() {
            self.root = Some(self.touch(root, &|n: &Node| match key.cmp(&n.key) {
                std::cmp::Ordering::Less => Dir::Left,
                std::cmp::Ordering::Greater => Dir::Right,
                std::cmp::Ordering::Equal => Dir::Here,
            }));
        }
    }

    /// Copies the path to the node `dir` selects and sets DependsOn on it.
    /// This transaction's own nodes on the path are changed in place when
    /// nothing else holds them (the usual case: every read walks down
    /// from the root, so the top of the tree was copied by earlier reads).
    fn touch(&self, n: Arc<Node>, dir: &dyn Fn(&Node) -> Dir) -> Arc<Node> {
        let mut c = if n.same_owner(&self.local) {
            n
        } else {
            Arc::new(self.local_copy(&n))
        };
        let m = Arc::make_mut(&mut c);
        match dir(m) {
            Dir::Left if m.left_link.is_some() => {
                m.left_link = m.left_link.take().map(|l| self.touch(l, dir));
            }
            Dir::Right if m.right_link.is_some() => {
                m.right_link = m.right_link.take().map(|r| self.touch(r, dir));
            }
            _ => m.flags |= DEPENDS_ON,
        }
        c
    }

    /// Inserts or updates; also returns whether a new node was created.
    fn insert(&mut self, t: &Link, key: &[u8], value: &Bytes) -> (Arc<Node>, bool) {
        let Some(n) = t else {
            let node = Arc::new(Node {
                key: key.into(),
                payload: value.clone(),
                left_link: None,
                right_link: None,
                owner: Some(self.local.clone()),
                seq: 0,
                vn_cache: AtomicU64::new(0),
                scv: self.deleted.remove(key).unwrap_or(0),
                ssv: 0,
                flags: ALTERED | DIRTY,
                height: 1,
                extra: None,
                oldest: 0,
                addr: AtomicU64::new(0),
            });
            return (node, true);
        };
        let mut c = self.local_copy(n);
        c.flags |= DIRTY;
        let created = match key.cmp(&n.key) {
            std::cmp::Ordering::Equal => {
                c.payload = value.clone();
                c.flags |= ALTERED;
                return (Arc::new(c), false);
            }
            std::cmp::Ordering::Less => {
                let (child, created) = self.insert(n.left(), key, value);
                c.left_link = Some(child);
                created
            }
            std::cmp::Ordering::Greater => {
                let (child, created) = self.insert(n.right(), key, value);
                c.right_link = Some(child);
                created
            }
        };
        if created && self.widened {
            c.ssv = 0;
        }
        (self.rebalance(c), created)
    }

    /// Removes `key`; returns the new subtree and the removed node.
    fn remove(&mut self, t: &Link, key: &[u8]) -> Option<(Link, Arc<Node>)> {
        let n = t.as_ref()?;
        match key.cmp(&n.key) {
            std::cmp::Ordering::Less => {
                let (nl, rem) = self.remove(n.left(), key)?;
                let mut c = self.local_copy(n);
                c.left_link = nl;
                c.flags |= DIRTY;
                Some((Some(self.rebalance(c)), rem))
            }
            std::cmp::Ordering::Greater => {
                let (nr, rem) = self.remove(n.right(), key)?;
                let mut c = self.local_copy(n);
                c.right_link = nr;
                c.flags |= DIRTY;
                Some((Some(self.rebalance(c)), rem))
            }
            std::cmp::Ordering::Equal => {
                let replacement = match (n.left(), n.right()) {
                    (None, r) => r.clone(),
                    (l, None) => l.clone(),
                    (Some(_), Some(r)) => {
                        // The successor moves into the deleted node's place:
                        // its subtree is new, so its structure version is void.
                        let (nr, succ) = self.remove_min(r);
                        let mut c = self.local_copy(&succ);
                        c.left_link = n.left().clone();
                        c.right_link = nr;
                        c.ssv = 0;
                        c.flags |= DIRTY;
                        Some(self.rebalance(c))
                    }
                };
                Some((replacement, n.clone()))
            }
        }
    }

    fn remove_min(&mut self, n: &Arc<Node>) -> (Link, Arc<Node>) {
        match n.left() {
            None => (n.right().clone(), n.clone()),
            Some(l) => {
                let (nl, min) = self.remove_min(l);
                let mut c = self.local_copy(n);
                c.left_link = nl;
                c.flags |= DIRTY;
                (Some(self.rebalance(c)), min)
            }
        }
    }

    fn rebalance(&self, mut c: Node) -> Arc<Node> {
        let (hl, hr) = (height(&c.left_link), height(&c.right_link));
        if hl > hr + 1 {
            if let Some(l) = c.left_link.clone() {
                if height(l.left()) < height(l.right()) {
                    c.left_link = Some(self.rotate_left(self.local_copy(&l)));
                }
            }
            return self.rotate_right(c);
        }
        if hr > hl + 1 {
            if let Some(r) = c.right_link.clone() {
                if height(r.right()) < height(r.left()) {
                    c.right_link = Some(self.rotate_right(self.local_copy(&r)));
                }
            }
            return self.rotate_left(c);
        }
        fix_height(&mut c);
        Arc::new(c)
    }

    fn rotate_right(&self, mut c: Node) -> Arc<Node> {
        let Some(l) = c.left_link.take() else {
            fix_height(&mut c);
            return Arc::new(c);
        };
        let mut top = self.local_copy(&l);
        c.left_link = top.right_link.take();
        restructured(&mut c);
        top.right_link = Some(Arc::new(c));
        restructured(&mut top);
        Arc::new(top)
    }

    fn rotate_left(&self, mut c: Node) -> Arc<Node> {
        let Some(r) = c.right_link.take() else {
            fix_height(&mut c);
            return Arc::new(c);
        };
        let mut top = self.local_copy(&r);
        c.right_link = top.left_link.take();
        restructured(&mut c);
        top.left_link = Some(Arc::new(c));
        restructured(&mut top);
        Arc::new(top)
    }
}

fn fix_height(n: &mut Node) {
    n.height = height(&n.left_link).max(height(&n.right_link)) + 1;
}

/// A node whose set of descendants changed by rotation: its subtree no
/// longer matches any snapshot version, so its structure version is void.
fn restructured(n: &mut Node) {
    n.ssv = 0;
    n.flags |= DIRTY;
    fix_height(n);
}

// ------------------------------------------------------------ replaying

/// The logical content of a decoded intention: what premeld and group meld
/// replay on a newer state. Writes and deletes never share a key (a put
/// after a delete turns back into an update).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Effects {
    /// Altered nodes: key and new value, in key order.
    pub(crate) writes: Vec<(Bytes, Bytes)>,
    /// Unaltered nodes with DependsOn, in key order.
    pub(crate) reads: Vec<Bytes>,
    /// Dependency ranges (node ranges, then header ranges).
    pub(crate) ranges: Vec<KeyRange>,
    /// The delete list: key and content version read (0: absent).
    pub(crate) deletes: Vec<(Bytes, Vn)>,
}

/// Why an intention could not be replayed on a state: the state disagrees
/// with what the intention read. Premeld only replays after meld found no
/// conflict, so this is a conflict that meld should have reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplayMismatch(pub(crate) Bytes);

impl Transaction {
    /// Re-executes `effects` on `base` and returns, as the intention at log
    /// position `pos`, what a transaction with these effects would have
    /// logged there (the same nodes the encoder and decoder would give,
    /// without the byte round trip). A pure function of its inputs: keys are
    /// replayed in a fixed order (deletes, then reads, then writes, each in
    /// key order).
    pub(crate) fn replay(
        base: &Snapshot,
        isolation: Isolation,
        effects: &Effects,
        pos: crate::node::LogPos,
    ) -> Result<crate::codec::Intention, ReplayMismatch> {
        let mut tx = Transaction::begin(base, isolation);
        for (k, scv) in &effects.deletes {
            if *scv != 0 {
                let root = tx.root.clone();
                let (new_root, removed) = tx
                    .remove(&root, k)
                    .ok_or_else(|| ReplayMismatch(k.clone()))?;
                if removed.ncv() != *scv {
                    return Err(ReplayMismatch(k.clone()));
                }
                tx.root = new_root;
                tx.widened = true;
            } else if crate::node::find(&tx.root, k).is_some() {
                return Err(ReplayMismatch(k.clone()));
            }
            tx.deleted.insert(k.clone(), *scv);
            tx.wrote = true;
        }
        for k in &effects.reads {
            if crate::node::find(&tx.root, k).is_none() {
                return Err(ReplayMismatch(k.clone()));
            }
            tx.mark_read(k);
        }
        for (k, v) in &effects.writes {
            let root = tx.root.clone();
            tx.root = Some(tx.insert(&root, k, v).0);
            tx.wrote = true;
        }
        tx.ranges.extend(effects.ranges.iter().cloned());
        Ok(tx.seal().intention(pos))
    }
}

#[cfg(test)]
mod tests;
