//! Tree surgery during meld: applying deletions, and joining, rotating
//! and splitting subtrees so the result stays balanced.

use std::cmp::Ordering;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::node::{
    height, nsv_of, oldest_from, Bytes, Link, Node, Vn, NO_LOGGED_NODE, SUBTREE_ONLY_READ,
};
use crate::range::Gap;

use super::{AbortReason, Cx, R};

impl<'a> Cx<'a, '_> {
    pub(super) fn apply_deletes(&mut self, mut t: Link, gap: Gap<'_>) -> R<Link> {
        for (k, scv) in self.deletes_in(gap) {
            t = self.delete(&t, k, *scv)?;
        }
        Ok(t)
    }

    pub(super) fn delete(&mut self, t: &Link, key: &Bytes, scv: Vn) -> R<Link> {
        let Some(n) = t else {
            if scv == 0 && !self.tombs.deleted_after(key, self.snap_pos) {
                // Absent from the snapshot and still absent: nothing to do.
                return Ok(None);
            }
            return Err(Box::new(AbortReason::WriteWrite { key: key.clone() }));
        };
        self.stats.lcs_nodes += 1;
        match key[..].cmp(&n.key) {
            Ordering::Less => {
                let nl = self.delete(n.left(), key, scv)?;
                Ok(Some(self.join(nl, n, None, n.right().clone())))
            }
            Ordering::Greater => {
                let nr = self.delete(n.right(), key, scv)?;
                Ok(Some(self.join(n.left().clone(), n, None, nr)))
            }
            Ordering::Equal => {
                if n.ncv() != scv {
                    return Err(Box::new(AbortReason::WriteWrite { key: key.clone() }));
                }
                Ok(self.join2(n.left().clone(), n.right().clone()))
            }
        }
    }

    // ------------------------------------------------------------ building

    /// A new ephemeral node with `c`'s key and payload. If it reproduces its
    /// LCS `twin` exactly (same content, children with the same structure
    /// versions), it keeps the twin's structure version (§7.1 step 5).
    pub(super) fn make(
        &mut self,
        c: &Arc<Node>,
        left: Link,
        right: Link,
        twin: Option<&Arc<Node>>,
    ) -> Arc<Node> {
        self.eph_count += 1;
        let seq = self.eph_count;
        let vn = self.eph_base + seq as Vn;
        let read_only = twin.is_some_and(|t| {
            Arc::ptr_eq(c, t)
                && nsv_of(&left) == nsv_of(t.left())
                && nsv_of(&right) == nsv_of(t.right())
        });
        let (ssv, flags) = match (read_only, twin) {
            (true, Some(t)) => (t.nsv(), SUBTREE_ONLY_READ),
            _ => (0, 0),
        };
        let oldest = oldest_from(&left, &right, NO_LOGGED_NODE);
        let h = height(&left).max(height(&right)) + 1;
        Arc::new(Node {
            key: c.key.clone(),
            payload: c.val().clone(),
            left_link: left,
            right_link: right,
            owner: None,
            seq,
            vn_cache: AtomicU64::new(vn),
            scv: c.ncv(),
            ssv,
            flags,
            height: h,
            extra: None,
            addr: AtomicU64::new(0),
            oldest,
        })
    }

    /// AVL join: a balanced tree of `l`, `c` and `r` (all keys of `l` below
    /// `c`'s, all of `r` above).
    pub(super) fn join(
        &mut self,
        l: Link,
        c: &Arc<Node>,
        twin: Option<&Arc<Node>>,
        r: Link,
    ) -> Arc<Node> {
        let (hl, hr) = (height(&l), height(&r));
        if hl > hr + 1 {
            if let Some(ln) = l {
                return self.join_right(&ln, c, r);
            }
        }
        if hr > hl + 1 {
            if let Some(rn) = r {
                return self.join_left(l, c, &rn);
            }
        }
        self.make(c, l, r, twin)
    }

    pub(super) fn join_right(&mut self, l: &Arc<Node>, c: &Arc<Node>, r: Link) -> Arc<Node> {
        let ll = l.left().clone();
        match l.right() {
            Some(lr) if lr.height > height(&r) + 1 => {
                let t = self.join_right(lr, c, r);
                let th = t.height;
                let top = self.make(l, ll.clone(), Some(t), None);
                if th <= height(&ll) + 1 {
                    top
                } else {
                    self.rotate_left(&top)
                }
            }
            lr => {
                let t = self.make(c, lr.clone(), r, None);
                if t.height <= height(&ll) + 1 {
                    self.make(l, ll, Some(t), None)
                } else {
                    let t = self.rotate_right(&t);
                    let top = self.make(l, ll, Some(t), None);
                    self.rotate_left(&top)
                }
            }
        }
    }

    pub(super) fn join_left(&mut self, l: Link, c: &Arc<Node>, r: &Arc<Node>) -> Arc<Node> {
        let rr = r.right().clone();
        match r.left() {
            Some(rl) if rl.height > height(&l) + 1 => {
                let t = self.join_left(l, c, rl);
                let th = t.height;
                let top = self.make(r, Some(t), rr.clone(), None);
                if th <= height(&rr) + 1 {
                    top
                } else {
                    self.rotate_right(&top)
                }
            }
            rl => {
                let t = self.make(c, l, rl.clone(), None);
                if t.height <= height(&rr) + 1 {
                    self.make(r, Some(t), rr, None)
                } else {
                    let t = self.rotate_left(&t);
                    let top = self.make(r, Some(t), rr, None);
                    self.rotate_right(&top)
                }
            }
        }
    }

    pub(super) fn rotate_left(&mut self, x: &Arc<Node>) -> Arc<Node> {
        let Some(y) = x.right() else { return x.clone() };
        let nx = self.make(x, x.left().clone(), y.left().clone(), None);
        self.make(y, Some(nx), y.right().clone(), None)
    }

    pub(super) fn rotate_right(&mut self, x: &Arc<Node>) -> Arc<Node> {
        let Some(y) = x.left() else { return x.clone() };
        let nx = self.make(x, y.right().clone(), x.right().clone(), None);
        self.make(y, y.left().clone(), Some(nx), None)
    }

    /// Concatenates two trees (all keys of `l` below those of `r`).
    pub(super) fn join2(&mut self, l: Link, r: Link) -> Link {
        match (l, r) {
            (None, r) => r,
            (l, None) => l,
            (Some(ln), r) => {
                let (rest, last) = self.split_last(&ln);
                Some(self.join(rest, &last, None, r))
            }
        }
    }

    pub(super) fn split_last(&mut self, n: &Arc<Node>) -> (Link, Arc<Node>) {
        match n.right() {
            None => (n.left().clone(), n.clone()),
            Some(rn) => {
                let (rest, last) = self.split_last(rn);
                (Some(self.join(n.left().clone(), n, None, rest)), last)
            }
        }
    }
}
