//! The request-id table: the last `window` (client, request) ids and the
//! position each was appended at, so that a retried append is answered
//! with its first position instead of being written again. Recovery
//! rebuilds it from the end-writes; the writer adds to it as batches are
//! answered.

use std::collections::VecDeque;

use crate::writer::IdMap;

/// Ids the table is sized for up front (at most the configured window).
/// The default window, 1 Mi ids, takes about 66 MB (table and order),
/// resident from the open on (see [`RequestIds::new`]).
const PRESIZE: usize = 4 << 20;

/// The last `window` request ids and their positions.
pub(crate) struct RequestIds {
    positions: IdMap<u64>,
    /// The ids in the order they were remembered, oldest first.
    order: VecDeque<(u64, u64)>,
    window: usize,
}

impl RequestIds {
    /// An empty table for `window` ids, reserved and made resident now.
    ///
    /// Sized for the whole window (capped at [`PRESIZE`], so a huge
    /// configured window does not reserve gigabytes): growing it later
    /// rehashes every id while the writer waits, which stalled appends
    /// for tens of milliseconds each time the table doubled under load.
    ///
    /// Every page of the table and its order queue is touched here. The
    /// table becomes resident page by page and ids land at random places
    /// in it, so the first appends after a start faulted in a new page
    /// almost every time. On a VM whose host backs guest memory lazily
    /// (this benchmark machine) such a first touch took about 2.5 ms, and
    /// a fresh service's first batches stalled for 25–70 ms while
    /// recording their ids (2 of 6 four-second light-load probes: p99
    /// 39–51 ms against 4–6 ms; docs/benchmarks-log-history.md). Paying it
    /// here costs the open about 65 ms with the default window.
    pub(crate) fn new(window: usize) -> RequestIds {
        let n = window.min(PRESIZE) + 1;
        let mut positions = IdMap::with_capacity_and_hasher(n, Default::default());
        let mut order = VecDeque::with_capacity(n);
        // Distinct keys, so they spread over the whole table; the queue is
        // filled in order, so any value touches all of it.
        positions.extend((0..n as u64).map(|i| ((u64::MAX, i), 0)));
        order.resize(n, (0, 0));
        positions.clear();
        order.clear();
        RequestIds {
            positions,
            order,
            window,
        }
    }

    /// The position `(client, request)` was appended at, if it is among
    /// the last `window` ids.
    #[inline]
    pub(crate) fn get(&self, id: (u64, u64)) -> Option<u64> {
        self.positions.get(&id).copied()
    }

    /// Remembers that `id` was appended at `pos`, forgetting the oldest
    /// id once there are more than `window`.
    #[inline]
    pub(crate) fn remember(&mut self, id: (u64, u64), pos: u64) {
        self.positions.insert(id, pos);
        self.order.push_back(id);
        while self.order.len() > self.window {
            if let Some(old) = self.order.pop_front() {
                self.positions.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_window_of_ids_is_remembered() {
        let mut ids = RequestIds::new(3);
        assert_eq!(ids.get((7, 0)), None);
        for r in 0..5u64 {
            ids.remember((7, r), 100 + r);
        }
        assert_eq!(ids.get((7, 0)), None);
        assert_eq!(ids.get((7, 1)), None);
        for r in 2..5u64 {
            assert_eq!(ids.get((7, r)), Some(100 + r), "request {r}");
        }
        assert_eq!(ids.get((8, 4)), None, "another client's id");
        let mut none = RequestIds::new(0);
        none.remember((1, 1), 5);
        assert_eq!(none.get((1, 1)), None, "a window of 0 remembers nothing");
    }
}
