//! [`Chunked`]: a double-ended sequence stored in fixed-size chunks.
//!
//! The index keeps one entry per record of a log, and a log grows without
//! bound until it is trimmed. A `VecDeque` doubles its buffer as it grows:
//! at a few million entries one push copies tens of megabytes while the
//! index lock is held and the writer waits, stalling every append for tens
//! of milliseconds (enough to set an open-loop load's p99). Here a
//! push allocates at most one new chunk, and dropping from the front (trim)
//! frees whole chunks.

use std::collections::VecDeque;

/// Entries per chunk (a chunk of 40-byte index entries is 160 KiB).
const CHUNK: usize = 4096;

/// A sequence with `push_back`, indexed reads and `drop_front`, stored in
/// chunks of [`CHUNK`] entries.
#[derive(Debug, Clone)]
pub(crate) struct Chunked<T> {
    chunks: VecDeque<Vec<T>>,
    /// Entries of the first chunk already dropped.
    head: usize,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked {
            chunks: VecDeque::new(),
            head: 0,
            len: 0,
        }
    }
}

impl<T> Chunked<T> {
    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no entries.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entry at `i` (0 is the front).
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        if i >= self.len {
            return None;
        }
        let at = self.head + i;
        self.chunks.get(at / CHUNK)?.get(at % CHUNK)
    }

    /// The first entry.
    pub(crate) fn front(&self) -> Option<&T> {
        self.get(0)
    }

    /// Appends an entry at the back.
    pub(crate) fn push_back(&mut self, v: T) {
        match self.chunks.back_mut() {
            Some(c) if c.len() < CHUNK => c.push(v),
            _ => {
                let mut c = Vec::with_capacity(CHUNK);
                c.push(v);
                self.chunks.push_back(c);
            }
        }
        self.len += 1;
    }

    /// The index of the first entry for which `pred` is false, the entries
    /// being partitioned by it (every true one first), as for a slice.
    pub(crate) fn partition_point(&self, mut pred: impl FnMut(&T) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid) {
                Some(v) if pred(v) => lo = mid + 1,
                _ => hi = mid,
            }
        }
        lo
    }

    /// Drops the first `n` entries (all of them if there are fewer).
    pub(crate) fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len);
        self.len -= n;
        self.head += n;
        while self.head >= CHUNK {
            self.chunks.pop_front();
            self.head -= CHUNK;
        }
        if self.len == 0 {
            // Keeps `head` inside the (now empty) first chunk's range.
            self.chunks.clear();
            self.head = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Push(u32),
        Drop(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => any::<u32>().prop_map(Op::Push),
            1 => (0usize..3 * CHUNK).prop_map(Op::Drop),
        ]
    }

    proptest! {
        /// Every operation leaves the same sequence as a `VecDeque`.
        #[test]
        fn agrees_with_a_vecdeque(
            ops in proptest::collection::vec(op(), 0..400),
            bulk in 0usize..3 * CHUNK,
        ) {
            let mut ours = Chunked::default();
            let mut model = VecDeque::new();
            // Enough entries to cross chunk boundaries.
            for v in 0..bulk as u32 {
                ours.push_back(v);
                model.push_back(v);
            }
            for op in ops {
                match op {
                    Op::Push(v) => {
                        ours.push_back(v);
                        model.push_back(v);
                    }
                    Op::Drop(n) => {
                        ours.drop_front(n);
                        model.drain(..n.min(model.len()));
                    }
                }
                prop_assert_eq!(ours.len(), model.len());
                prop_assert_eq!(ours.is_empty(), model.is_empty());
                prop_assert_eq!(ours.front(), model.front());
                prop_assert_eq!(ours.get(model.len()), None);
            }
            for (i, v) in model.iter().enumerate() {
                prop_assert_eq!(ours.get(i), Some(v));
            }
        }

        /// Bisection finds the same split as a slice's, across chunk
        /// boundaries and after drops from the front.
        #[test]
        fn partition_point_agrees_with_a_slice(
            mut values in proptest::collection::vec(any::<u16>(), 0..3 * CHUNK),
            dropped in 0usize..CHUNK + 7,
            probes in proptest::collection::vec(any::<u16>(), 1..20),
        ) {
            values.sort_unstable();
            let mut ours = Chunked::default();
            for &v in &values {
                ours.push_back(v);
            }
            ours.drop_front(dropped);
            let model = &values[dropped.min(values.len())..];
            for x in probes {
                prop_assert_eq!(
                    ours.partition_point(|v| *v < x),
                    model.partition_point(|v| *v < x)
                );
                prop_assert_eq!(
                    ours.partition_point(|v| *v <= x),
                    model.partition_point(|v| *v <= x)
                );
            }
        }
    }
}
