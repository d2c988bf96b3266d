//! [`Range`]: a lazy, ordered walk over the keys of a snapshot between two
//! bounds. It holds the path from the root to the next key (a stack of
//! shared nodes), so it costs O(height) memory whatever the range's size,
//! and the snapshot it walks stays alive and unchanged while it runs.

use std::ops::Bound;
use std::sync::Arc;

use crate::node::{guarded, Link, Node};
use crate::range::Order;
use crate::{Bytes, StoreError};

/// Pairs of a snapshot in a key range, in `order`, produced one at a time
/// ([`Snapshot::range`](crate::Snapshot::range)). With a node cache, a
/// node that cannot be read back from the log ends the walk with
/// [`StoreError`] as its last item.
pub struct Range {
    /// Nodes whose own key (and the side of them still to walk) is next,
    /// innermost last.
    stack: Vec<Arc<Node>>,
    start: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
    order: Order,
    left: usize,
    /// A read-back failure to report as the next item.
    pending: Option<StoreError>,
}

impl std::fmt::Debug for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Range")
            .field("order", &self.order)
            .field("left", &self.left)
            .finish()
    }
}

fn below_end(key: &[u8], end: &Bound<Vec<u8>>) -> bool {
    match end {
        Bound::Unbounded => true,
        Bound::Included(e) => key <= &e[..],
        Bound::Excluded(e) => key < &e[..],
    }
}

fn above_start(key: &[u8], start: &Bound<Vec<u8>>) -> bool {
    match start {
        Bound::Unbounded => true,
        Bound::Included(s) => key >= &s[..],
        Bound::Excluded(s) => key > &s[..],
    }
}

impl Range {
    pub(crate) fn new(
        root: &Link,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        order: Order,
        limit: Option<usize>,
    ) -> Range {
        let mut r = Range {
            stack: Vec::new(),
            start: start.map(<[u8]>::to_vec),
            end: end.map(<[u8]>::to_vec),
            order,
            left: limit.unwrap_or(usize::MAX),
            pending: None,
        };
        if let Err(e) = guarded(|| r.descend(root.clone())) {
            r.fail(e);
        }
        r
    }

    /// Whether `key` is past the far bound of the walk (nothing after it
    /// in walk order is in range).
    fn beyond(&self, key: &[u8]) -> bool {
        match self.order {
            Order::Forward => !below_end(key, &self.end),
            Order::Reverse => !above_start(key, &self.start),
        }
    }

    /// Whether `key` is before the near bound (it and everything on its
    /// near side are out of range).
    fn before(&self, key: &[u8]) -> bool {
        match self.order {
            Order::Forward => !above_start(key, &self.start),
            Order::Reverse => !below_end(key, &self.end),
        }
    }

    /// Pushes the path from `link` towards the first key in range.
    fn descend(&mut self, mut link: Link) {
        while let Some(n) = link {
            if self.before(n.key()) {
                // This node and its near side are out of range.
                link = self.far(&n).clone();
            } else {
                link = self.near(&n).clone();
                self.stack.push(n);
            }
        }
    }

    fn near<'a>(&self, n: &'a Node) -> &'a Link {
        match self.order {
            Order::Forward => n.left(),
            Order::Reverse => n.right(),
        }
    }

    fn far<'a>(&self, n: &'a Node) -> &'a Link {
        match self.order {
            Order::Forward => n.right(),
            Order::Reverse => n.left(),
        }
    }

    /// Whether the limit stopped the walk (so it may not have seen the
    /// whole range).
    pub(crate) fn cut_by_limit(&self) -> bool {
        self.left == 0
    }

    fn fail(&mut self, e: StoreError) {
        self.stack.clear();
        self.pending = Some(e);
    }
}

impl Iterator for Range {
    type Item = Result<(Bytes, Bytes), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.pending.take() {
            return Some(Err(e));
        }
        if self.left == 0 {
            return None;
        }
        let n = self.stack.pop()?;
        let step = guarded(|| {
            if self.beyond(n.key()) {
                self.stack.clear();
                return None;
            }
            let pair = (n.key.clone(), n.val().clone());
            let far = self.far(&n).clone();
            self.descend(far);
            Some(pair)
        });
        match step {
            Ok(Some(pair)) => {
                self.left -= 1;
                Some(Ok(pair))
            }
            Ok(None) => None,
            Err(e) => {
                self.stack.clear();
                Some(Err(e))
            }
        }
    }
}
