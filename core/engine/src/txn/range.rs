//! [`TxnRange`]: a lazy range walk inside a transaction. It sees the
//! transaction's own writes and records what it observed for validation as
//! it goes, so a caller that stops early is only checked for the keys it
//! actually saw.

use std::ops::Bound;

use super::Transaction;
use crate::error::{check_key, TxnError};
use crate::isolation::Isolation;
use crate::node::{find, guarded, Bytes};
use crate::range::{KeyRange, Order};
use crate::range_iter::Range;

/// The pairs of a key range as a transaction sees them (its own writes
/// included), in order, at most a limit, one at a time
/// ([`Transaction::range`]). It borrows the transaction: finish or drop it
/// before the next operation.
///
/// Under `Serializable` the part of the range read so far is protected
/// against phantoms: all of it once the walk ended by itself, up to the
/// last pair returned when the limit or the caller stopped it. Under
/// `RepeatableRead` each returned pair is validated like a `get`.
#[derive(Debug)]
pub struct TxnRange<'t> {
    tx: &'t mut Transaction,
    walk: Range,
    order: Order,
    /// A failure to report as the next item (bad bound, dead transaction).
    pending: Option<TxnError>,
    /// Index in `tx.ranges` of the range recorded for this walk.
    recorded: Option<usize>,
    last: Option<Bytes>,
    /// The walk returned `None`: the whole range was observed.
    ended: bool,
}

impl Transaction {
    /// The pairs between `start` and `end` in `order`, at most `limit`,
    /// seeing this transaction's own writes, produced lazily (memory
    /// O(tree height) however long the range). Items fail with the
    /// transaction's error (a bound longer than the key limit, or a read
    /// of the snapshot back from the log that failed, which ends the
    /// transaction).
    pub fn range(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        order: Order,
        limit: Option<usize>,
    ) -> TxnRange<'_> {
        let mut pending = self.live().err();
        for b in [start, end] {
            if let Bound::Included(k) | Bound::Excluded(k) = b {
                if let (Err(e), None) = (check_key(k), &pending) {
                    pending = Some(e);
                }
            }
        }
        let walk = Range::new(&self.root, start, end, order, limit);
        let mut recorded = None;
        if pending.is_none() && self.isolation == Isolation::Serializable {
            // Recorded whole now and narrowed when the walk stops early, so
            // a walk that is leaked is over-protected, never under.
            let r = KeyRange {
                start: start.map(Bytes::from),
                end: end.map(Bytes::from),
            };
            if !r.is_empty() && limit != Some(0) {
                self.ranges.push(r);
                recorded = Some(self.ranges.len() - 1);
            }
        }
        TxnRange {
            tx: self,
            walk,
            order,
            pending,
            recorded,
            last: None,
            ended: false,
        }
    }
}

impl TxnRange<'_> {
    fn fail(&mut self, e: crate::StoreError) -> TxnError {
        self.tx.failed = Some(e.clone());
        self.ended = true;
        TxnError::Store(e)
    }
}

impl Iterator for TxnRange<'_> {
    type Item = Result<(Bytes, Bytes), TxnError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.pending.take() {
            self.ended = true;
            return Some(Err(e));
        }
        if self.ended {
            return None;
        }
        let (k, v) = match self.walk.next() {
            None => {
                self.ended = true;
                // A walk cut by its limit observed only up to its last pair.
                return None;
            }
            Some(Err(e)) => return Some(Err(self.fail(e))),
            Some(Ok(pair)) => pair,
        };
        if self.tx.isolation == Isolation::RepeatableRead {
            let tx = &mut *self.tx;
            let marked = guarded(|| {
                if let Some(n) = find(&tx.root, &k).cloned() {
                    tx.note_read(&k, &n);
                }
            });
            if let Err(e) = marked {
                return Some(Err(self.fail(e)));
            }
        }
        self.last = Some(k.clone());
        Some(Ok((k, v)))
    }
}

impl Drop for TxnRange<'_> {
    /// Narrows the recorded range to what was observed, unless the walk
    /// covered the whole range (it ended without a limit cutting it).
    fn drop(&mut self) {
        let Some(i) = self.recorded else { return };
        if self.ended && !self.walk.cut_by_limit() {
            return;
        }
        match self.last.take() {
            None => {
                self.tx.ranges.remove(i);
            }
            Some(last) => {
                let r = &mut self.tx.ranges[i];
                match self.order {
                    Order::Forward => r.end = Bound::Included(last),
                    Order::Reverse => r.start = Bound::Included(last),
                }
            }
        }
    }
}
