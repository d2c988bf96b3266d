//! Oracles for testing and benchmarking meld.
//!
//! [`BruteForce`] evaluates the same conflict predicates as meld without
//! any of its shortcuts: it extracts every intention's read, range and write
//! sets by visiting all of its nodes and compares them with the write set of
//! every committed intention in the conflict zone. [`check_tree`] verifies
//! the invariants of a committed tree.

use std::collections::VecDeque;

use crate::codec::Intention;
use crate::genesis::Settings;
use crate::node::{height, Bytes, Link, LogPos};
use crate::range::{Gap, KeyRange};
use crate::snapshot::Snapshot;

/// The keys an intention read, the ranges it depends on, and the keys it wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IntentionSets {
    /// Keys read that must be unchanged (DependsOn).
    pub reads: Vec<Bytes>,
    /// Ranges that must hold no change (DependsOnTree ranges, absent reads).
    pub ranges: Vec<KeyRange>,
    /// Keys written: updated, inserted or deleted. Sorted, no duplicates.
    pub writes: Vec<Bytes>,
}

impl IntentionSets {
    /// Extracts the sets by visiting every node the intention holds.
    pub fn of(int: &Intention) -> IntentionSets {
        let mut s = IntentionSets::default();
        fn walk(t: &Link, int: &Intention, s: &mut IntentionSets) {
            let Some(n) = t else { return };
            if !int.owns(n) {
                return;
            }
            // The owned flags say which children belong to the intention,
            // so the walk never loads a snapshot node just to learn that it
            // is not the intention's (those are cold: a quarter of this
            // validator's time went to such loads).
            if n.flag(crate::node::LEFT_OWNED) {
                walk(n.left(), int, s);
            }
            if n.altered() {
                s.writes.push(n.key.clone());
            } else if n.depends_on() {
                s.reads.push(n.key.clone());
            }
            if let Some(rs) = n.ranges() {
                s.ranges.extend(rs.iter().cloned());
            }
            if n.flag(crate::node::RIGHT_OWNED) {
                walk(n.right(), int, s);
            }
        }
        walk(&int.root, int, &mut s);
        s.ranges.extend(int.header_ranges.iter().cloned());
        s.writes.extend(int.deletes.iter().map(|(k, _)| k.clone()));
        s.writes.sort();
        s.writes.dedup();
        s
    }
}

/// Which predicate the brute-force validator found violated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BruteAbort {
    /// A written key was written in the conflict zone.
    WriteWrite(Bytes),
    /// A read key was written in the conflict zone.
    ReadWrite(Bytes),
    /// A key inside a dependency range was written in the conflict zone.
    Phantom(KeyRange),
    /// The conflict zone is longer than the database allows.
    SnapshotTooOld,
    /// The entry is not a valid intention.
    Malformed,
}

/// The brute-force validator.
#[derive(Debug)]
pub struct BruteForce {
    max_zone: u64,
    /// Write sets of committed intentions, oldest first.
    committed: VecDeque<(LogPos, Vec<Bytes>)>,
}

impl BruteForce {
    /// A validator for a database with these settings.
    pub fn new(settings: &Settings) -> BruteForce {
        BruteForce {
            max_zone: settings.max_conflict_zone as u64,
            committed: VecDeque::new(),
        }
    }

    /// Decides the intention at `pos` whose snapshot is `snapshot_pos`, and
    /// remembers its writes if it commits.
    pub fn decide(
        &mut self,
        pos: LogPos,
        snapshot_pos: LogPos,
        sets: IntentionSets,
    ) -> Result<(), BruteAbort> {
        let verdict = self.check(pos, snapshot_pos, &sets);
        if verdict.is_ok() {
            self.committed.push_back((pos, sets.writes));
        }
        self.trim(pos);
        verdict
    }

    /// Decides a group-meld pair `a` (at `a.0`) and `b` (at `a.0 + 1`), each
    /// `(pos, snapshot_pos, sets)`, `None` sets meaning the entry is not a
    /// valid intention. `q` is the state both were brought to before
    /// grouping ([`crate::pipeline::group_input`] after premeld). The rule
    /// (docs/pipeline.md): conflicts up to `q` abort a member alone; a
    /// conflict of `b` with `a` aborts `b` alone; a conflict in `(q, a)`
    /// aborts both.
    pub fn decide_pair(
        &mut self,
        a: (LogPos, LogPos, Option<IntentionSets>),
        b: (LogPos, LogPos, Option<IntentionSets>),
        q: LogPos,
    ) -> (Result<(), BruteAbort>, Result<(), BruteAbort>) {
        let (Some(sa), Some(sb)) = (&a.2, &b.2) else {
            let ra = match a.2 {
                Some(s) => self.decide(a.0, a.1, s),
                None => Err(BruteAbort::Malformed),
            };
            let rb = match b.2 {
                Some(s) => self.decide(b.0, b.1, s),
                None => Err(BruteAbort::Malformed),
            };
            return (ra, rb);
        };
        let ia = self.check_between(a.0, a.1, q, sa);
        let ib = self.check_between(b.0, b.1, q, sb);
        if ia.is_err() || ib.is_err() {
            // Decided alone, each over its whole zone (an aborted first
            // member is not in the second's zone).
            let ra = ia.and_then(|()| self.decide(a.0, a.1, sa.clone()));
            let rb = ib.and_then(|()| self.decide(b.0, b.1, sb.clone()));
            return (ra, rb);
        }
        if let Err(e) = conflict(sb, &sa.writes) {
            let ra = self.decide(a.0, a.1, sa.clone());
            return (ra, Err(e));
        }
        let shared = self
            .check_between(a.0, q, a.0 - 1, sa)
            .and_then(|()| self.check_between(a.0, q, a.0 - 1, sb));
        if shared.is_ok() {
            self.committed.push_back((a.0, sa.writes.clone()));
            self.committed.push_back((b.0, sb.writes.clone()));
        }
        self.trim(b.0);
        (shared.clone(), shared)
    }

    fn trim(&mut self, pos: LogPos) {
        let horizon = pos.saturating_sub(self.max_zone + 1);
        while self.committed.front().is_some_and(|(p, _)| *p < horizon) {
            self.committed.pop_front();
        }
    }

    fn check(
        &self,
        pos: LogPos,
        snapshot_pos: LogPos,
        sets: &IntentionSets,
    ) -> Result<(), BruteAbort> {
        self.check_between(pos, snapshot_pos, pos - 1, sets)
    }

    /// Checks `sets` (of the entry at `pos`) against the writes committed
    /// at positions in `(from, to]`.
    fn check_between(
        &self,
        pos: LogPos,
        from: LogPos,
        to: LogPos,
        sets: &IntentionSets,
    ) -> Result<(), BruteAbort> {
        if pos - from - 1 > self.max_zone {
            return Err(BruteAbort::SnapshotTooOld);
        }
        // `committed` is in log order: start at the first position after
        // `from` rather than walking the whole retained window.
        let start = self.committed.partition_point(|(p, _)| *p <= from);
        for (p, writes) in self.committed.range(start..) {
            if *p > to {
                break;
            }
            conflict(sets, writes)?;
        }
        Ok(())
    }
}

/// The conflict predicates of `sets` against one committed write set.
fn conflict(sets: &IntentionSets, writes: &[Bytes]) -> Result<(), BruteAbort> {
    {
        {
            for k in &sets.writes {
                if writes.binary_search(k).is_ok() {
                    return Err(BruteAbort::WriteWrite(k.clone()));
                }
            }
            for k in &sets.reads {
                if writes.binary_search(k).is_ok() {
                    return Err(BruteAbort::ReadWrite(k.clone()));
                }
            }
            for r in &sets.ranges {
                let rr = r.as_ref();
                let from = writes.partition_point(|w| !rr.above_start(w));
                if writes.get(from).is_some_and(|w| rr.below_end(w)) {
                    return Err(BruteAbort::Phantom(r.clone()));
                }
            }
        }
    }
    Ok(())
}

/// A violated tree invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeViolation(pub String);

/// Checks a committed tree: keys strictly ordered (so no duplicates), AVL
/// balance and stored heights, and metadata consistency (no
/// transaction-local nodes, read-only subtrees really unchanged: a node
/// flagged SubtreeIsOnlyReadDependent must not be altered).
pub fn check_tree(s: &Snapshot) -> Result<(), TreeViolation> {
    fn walk(t: &Link, gap: Gap<'_>) -> Result<u8, TreeViolation> {
        let Some(n) = t else { return Ok(0) };
        if !gap.contains(&n.key) {
            return Err(TreeViolation(format!("key {:?} out of order", n.key)));
        }
        if n.owner_kind() == crate::node::OwnerKind::Local {
            return Err(TreeViolation(
                "transaction-local node in a committed tree".into(),
            ));
        }
        if n.only_read() && n.altered() {
            return Err(TreeViolation("altered node flagged read-only".into()));
        }
        if n.ncv() == 0 || n.ncv() > n.vn() {
            return Err(TreeViolation(format!(
                "content version {} not in 1..={} (VN)",
                n.ncv(),
                n.vn()
            )));
        }
        let own = match n.owner_kind() {
            crate::node::OwnerKind::Intention(pos) => pos,
            _ => crate::node::NO_LOGGED_NODE,
        };
        // A stub's body is read back for the walk and not kept.
        let (hl, hr, expect) = n.with_body(|b| {
            let hl = walk(&b.left_link, gap.left_of(&n.key))?;
            let hr = walk(&b.right_link, gap.right_of(&n.key))?;
            let expect = crate::node::oldest_from(&b.left_link, &b.right_link, own);
            Ok::<_, TreeViolation>((hl, hr, expect))
        })?;
        if hl.abs_diff(hr) > 1 {
            return Err(TreeViolation(format!("unbalanced at {:?}", n.key)));
        }
        let h = hl.max(hr) + 1;
        if h != n.height || h != height(t) {
            return Err(TreeViolation(format!("stale height at {:?}", n.key)));
        }
        if n.oldest_descendant() != expect {
            return Err(TreeViolation(format!(
                "OldestDescendant {} at {:?}, expected {expect}",
                n.oldest_descendant(),
                n.key
            )));
        }
        Ok(h)
    }
    let _ = crate::node::take_store_error();
    let r = walk(&s.root, Gap::ALL).map(|_| ());
    match crate::node::take_store_error() {
        Some(e) => Err(TreeViolation(format!(
            "part of the tree cannot be read back: {e}"
        ))),
        None => r,
    }
}

/// Every VN reachable in the tree, in key order (for uniqueness checks).
pub fn vns(s: &Snapshot) -> Vec<u64> {
    fn walk(t: &Link, out: &mut Vec<u64>) {
        if let Some(n) = t {
            n.with_body(|b| {
                walk(&b.left_link, out);
                out.push(n.vn());
                walk(&b.right_link, out);
            });
        }
    }
    let mut out = Vec::new();
    walk(&s.root, &mut out);
    out
}

/// The VN of every reachable ephemeral node (created by meld, held only in
/// memory), in key order: a full walk, the reference for
/// [`crate::checkpoint::unpersisted_nodes`].
pub fn ephemeral_vns(s: &Snapshot) -> Vec<u64> {
    fn walk(t: &Link, out: &mut Vec<u64>) {
        if let Some(n) = t {
            n.with_body(|b| {
                walk(&b.left_link, out);
                if n.owner_kind() == crate::node::OwnerKind::Ephemeral {
                    out.push(n.vn());
                }
                walk(&b.right_link, out);
            });
        }
    }
    let mut out = Vec::new();
    walk(&s.root, &mut out);
    out
}
