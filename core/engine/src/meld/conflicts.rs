//! The conflict checks of one intention node against its twin in the
//! last committed state: versions, tombstones and dependency ranges.

use std::sync::Arc;

use crate::node::{find, Link, Node};
use crate::range::{KeyRange, RangeRef};

use super::{AbortReason, Cx, MeldStats, R};

impl<'a> Cx<'a, '_> {
    /// The conflict checks for one intention node against its LCS twin.
    ///
    /// Inlined: the common outcome (an unchanged twin, no dependency
    /// range) is a few comparisons, cheaper than the call; the rare parts
    /// (a conflict, a tombstone lookup, range checks) are out of line.
    #[inline(always)]
    pub(super) fn check(&mut self, n: &Node, twin: Option<&Arc<Node>>) -> R<()> {
        let fine = if n.scv != 0 {
            twin.is_some_and(|t| t.ncv() == n.scv) || (!n.altered() && !n.depends_on())
        } else {
            twin.is_none() && self.tombs.map.is_empty()
        };
        if fine && n.extra.is_none() {
            return Ok(());
        }
        self.check_slow(n, twin)
    }

    #[inline(never)]
    pub(super) fn check_slow(&mut self, n: &Node, twin: Option<&Arc<Node>>) -> R<()> {
        if n.scv != 0 {
            let changed = twin.is_none_or(|t| t.ncv() != n.scv);
            if changed {
                if n.altered() {
                    return Err(Box::new(AbortReason::WriteWrite { key: n.key.clone() }));
                }
                if n.depends_on() {
                    return Err(Box::new(AbortReason::ReadWrite { key: n.key.clone() }));
                }
            }
        } else if twin.is_some() || self.tombs.deleted_after(&n.key, self.snap_pos) {
            // Inserted here and by someone else (or inserted and deleted
            // again) in the conflict zone.
            return Err(Box::new(AbortReason::WriteWrite { key: n.key.clone() }));
        }
        if let Some(rs) = n.ranges() {
            for r in rs.iter() {
                if self.range_changed(r) {
                    return Err(Box::new(AbortReason::Phantom { range: r.clone() }));
                }
            }
        }
        Ok(())
    }

    /// Whether any key in `r` was inserted, updated or deleted between the
    /// writer's snapshot and the LCS.
    pub(super) fn range_changed(&mut self, r: &KeyRange) -> bool {
        let rr = r.as_ref();
        self.tombs.any_in(rr, self.snap_pos) || self.diff(self.snapshot, self.lcs_root, rr)
    }

    /// Compares two committed trees inside `r`, pruning equal structure
    /// versions (equal NSV means identical subtrees).
    pub(super) fn diff(&mut self, a: &Link, b: &Link, r: RangeRef<'_>) -> bool {
        if r.is_empty() {
            return false;
        }
        let a = narrow_committed(a, r, self.stats);
        let b = narrow_committed(b, r, self.stats);
        match (a, b) {
            (None, None) => false,
            (Some(_), None) | (None, Some(_)) => true,
            (Some(x), Some(y)) => {
                if Arc::ptr_eq(x, y) || x.nsv() == y.nsv() {
                    return false;
                }
                self.stats.range_nodes += 1;
                if x.key == y.key {
                    x.ncv() != y.ncv()
                        || self.diff(x.left(), y.left(), r.below(&y.key))
                        || self.diff(x.right(), y.right(), r.above(&y.key))
                } else {
                    match find(a, &y.key) {
                        Some(z) if z.ncv() == y.ncv() => {}
                        _ => return true,
                    }
                    self.diff(a, y.left(), r.below(&y.key))
                        || self.diff(a, y.right(), r.above(&y.key))
                }
            }
        }
    }
}

pub(super) fn narrow_committed<'t>(
    mut t: &'t Link,
    r: RangeRef<'_>,
    stats: &mut MeldStats,
) -> &'t Link {
    while let Some(n) = t {
        if r.all_above(&n.key) {
            t = n.right();
        } else if r.all_below(&n.key) {
            t = n.left();
        } else {
            break;
        }
        stats.range_nodes += 1;
    }
    t
}
