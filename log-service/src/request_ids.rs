//! The request-id table: the last `window` (client, request) ids and the
//! position each was appended at, so that a retried append is answered
//! with its first position instead of being written again. Recovery
//! rebuilds it from the end-writes; the writer adds to it as batches are
//! answered.
//!
//! Ids are kept as runs, not one entry each. A client batch takes
//! consecutive request ids and lands at consecutive positions, so the 64
//! ids of a batch are one or two runs `first request -> first position,
//! length`, each within one bucket of 64 request ids of one client. A
//! table of one hash entry per id (1 Mi ids in a 66 MB table sized up
//! front) costs a cache and TLB miss per append on the writer thread for
//! the lookup, and two more for the insert and the eviction; runs keep
//! the table to a few tens of thousands of buckets that stay in cache
//! (`log-service/benches/request_ids.rs` compares the two). Ids that are
//! not consecutive cost a bucket each, more memory and CPU per id than a
//! table of one entry per id (docs/log-service.md has the figures).
//!
//! Which ids are in the window is decided by counting: every remember is
//! an occurrence with a number, and an id answers only while its latest
//! occurrence is among the last `window`. A run is dropped when all of it
//! is out of the window; the ids of a run partly out are refused by their
//! number until then.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;

/// Request ids per bucket, as a power of two: a run never crosses a
/// bucket, so a client batch of 64 is one or two runs.
const BUCKET_BITS: u32 = 6;

/// Ids the table is sized for up front (at most the configured window);
/// see [`RequestIds::new`].
const PRESIZE: usize = 4 << 20;

/// The bucket map is split into this many shards, each a hash map of its
/// own, so that growing one rehashes a sixty-fourth of the table.
const SHARDS: usize = 64;

/// Remembers between two looks for a shard to grow ahead of need
/// ([`RequestIds::grow_ahead`]).
const GROW_EVERY: u64 = 1024;

/// One shard of the bucket map: runs by (client, request id / 64).
type Shard = HashMap<(u64, u64), Runs, foldhash::fast::RandomState>;

/// A run: consecutive request ids of one bucket, at consecutive
/// positions, remembered one after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    /// The first id's offset in the bucket.
    first: u8,
    /// Ids in the run (1 to 64).
    len: u8,
    /// Position of the first id.
    first_pos: u64,
    /// Occurrence number of the first id; the run's ids follow it.
    first_occ: u64,
    /// The entry of the remember order this run is (part of), named by
    /// its first occurrence: a run is split when one of its ids is
    /// remembered again, and the parts are dropped together.
    origin: u64,
}

impl Run {
    /// The id at `off` in the bucket, as an index into the run.
    fn index_of(&self, off: u8) -> Option<u8> {
        let i = off.checked_sub(self.first)?;
        (i < self.len).then_some(i)
    }
}

/// A bucket's runs: almost always one (a batch aligned to the buckets) or
/// two (batches that are not); inline for the one.
#[derive(Debug)]
enum Runs {
    One(Run),
    Many(Vec<Run>),
}

impl Runs {
    fn as_slice(&self) -> &[Run] {
        match self {
            Runs::One(r) => std::slice::from_ref(r),
            Runs::Many(v) => v,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [Run] {
        match self {
            Runs::One(r) => std::slice::from_mut(r),
            Runs::Many(v) => v,
        }
    }

    fn push(&mut self, run: Run) {
        match self {
            Runs::One(r) => *self = Runs::Many(vec![*r, run]),
            Runs::Many(v) => v.push(run),
        }
    }

    /// Keeps the runs `keep` says to; whether any are left.
    fn retain(&mut self, keep: impl Fn(&Run) -> bool) -> bool {
        match self {
            Runs::One(r) => keep(r),
            Runs::Many(v) => {
                v.retain(keep);
                !v.is_empty()
            }
        }
    }

    /// Takes the id at `off` out of the run holding it, if one does.
    fn take_out(&mut self, off: u8) {
        let Some((k, i)) = self
            .as_slice()
            .iter()
            .enumerate()
            .find_map(|(k, r)| Some((k, r.index_of(off)?)))
        else {
            return;
        };
        let run = self.as_slice()[k];
        let mut parts = Vec::with_capacity(2);
        if i > 0 {
            parts.push(Run { len: i, ..run });
        }
        if i + 1 < run.len {
            let skip = i + 1;
            parts.push(Run {
                first: off + 1,
                len: run.len - skip,
                first_pos: run.first_pos + u64::from(skip),
                first_occ: run.first_occ + u64::from(skip),
                origin: run.origin,
            });
        }
        let mut all: Vec<Run> = self.as_slice().to_vec();
        all.splice(k..=k, parts);
        // Left empty only for a moment: the one caller, remember, puts
        // the id back at once.
        *self = match all.len() {
            1 => Runs::One(all[0]),
            _ => Runs::Many(all),
        };
    }
}

/// One entry of the remember order: a run as it was remembered.
#[derive(Debug, Clone, Copy)]
struct Remembered {
    client: u64,
    first_request: u64,
    first_pos: u64,
    /// Ids remembered; their occurrences are `origin..origin + len`.
    len: u64,
    /// The first occurrence.
    origin: u64,
}

/// The last `window` request ids and their positions.
pub struct RequestIds {
    /// Runs by (client, request id / 64), in [`SHARDS`] shards.
    shards: Vec<Shard>,
    /// Picks a key's shard. Seeded apart from the shards' own hashers:
    /// theirs place a key within its shard, and keys that share this
    /// hash's bits must not share those.
    pick: foldhash::fast::RandomState,
    /// The runs in the order they were remembered, oldest first.
    order: VecDeque<Remembered>,
    /// Occurrences so far: the next remember's number.
    total: u64,
    window: u64,
}

impl RequestIds {
    /// An empty table for the last `window` ids.
    ///
    /// The buckets are sized for the window's ids in runs of 32 (for at
    /// most 4 Mi ids), so batched clients never make the table grow,
    /// and every page of it is touched here: the first touch of a page
    /// can cost up to milliseconds (the kernel finds and zeroes it), and
    /// a fresh service's first batches would stall on them on the writer
    /// thread. Clients whose ids are not consecutive take a bucket per
    /// id, and the table grows on the way to the window a sixty-fourth at
    /// a time, ahead of need, so no remember waits for the whole table to
    /// rehash.
    pub fn new(window: usize) -> RequestIds {
        let n = window.min(PRESIZE) / 32 + 1;
        let per_shard = n / SHARDS + 1;
        let placeholder = Run {
            first: 0,
            len: 1,
            first_pos: 0,
            first_occ: 0,
            origin: 0,
        };
        let shards = (0..SHARDS)
            .map(|_| {
                let mut shard = Shard::with_capacity_and_hasher(per_shard, Default::default());
                // Distinct keys, so they spread over the whole shard.
                for i in 0..per_shard as u64 {
                    shard.insert((u64::MAX, i), Runs::One(placeholder));
                }
                shard.clear();
                shard
            })
            .collect();
        let mut order = VecDeque::with_capacity(n);
        // Filled in order, so any value touches all of it.
        order.resize(
            n,
            Remembered {
                client: 0,
                first_request: 0,
                first_pos: 0,
                len: 0,
                origin: 0,
            },
        );
        order.clear();
        RequestIds {
            shards,
            pick: Default::default(),
            order,
            total: 0,
            window: window as u64,
        }
    }

    /// The shard `key` lives in.
    fn shard_of(&self, key: &(u64, u64)) -> usize {
        (self.pick.hash_one(key) % SHARDS as u64) as usize
    }

    /// Grows the first shard with less than a quarter of its room left,
    /// doubling it to twice what it holds, if there is one.
    ///
    /// Called every [`GROW_EVERY`] remembers, so the shards grow one at a
    /// time, each a sixty-fourth of the table. Left to themselves they
    /// would grow when full, and with ids spread evenly they fill at the
    /// same pace: the table would double all at once, holding the writer
    /// for as long as a rehash of the whole (tens of milliseconds for one
    /// window of random ids). A shard past
    /// 4,096 entries takes at least 64 looks to fill its last quarter,
    /// time enough for every other shard's turn.
    fn grow_ahead(&mut self) {
        if let Some(shard) = self
            .shards
            .iter_mut()
            .find(|s| s.len() * 4 > s.capacity() * 3)
        {
            let held = shard.len();
            shard.reserve(held);
        }
    }

    /// The lowest occurrence number still in the window.
    fn oldest_kept(&self) -> u64 {
        self.total.saturating_sub(self.window)
    }

    /// The position `(client, request)` was last appended at, if that
    /// append is among the last `window` remembered.
    pub fn get(&self, (client, request): (u64, u64)) -> Option<u64> {
        let key = (client, request >> BUCKET_BITS);
        let runs = self.shards[self.shard_of(&key)].get(&key)?;
        let off = offset(request);
        runs.as_slice().iter().find_map(|r| {
            let i = u64::from(r.index_of(off)?);
            (r.first_occ + i >= self.oldest_kept()).then(|| r.first_pos + i)
        })
    }

    /// Remembers that `id` was appended at `pos`, forgetting what falls
    /// out of the window.
    pub fn remember(&mut self, id: (u64, u64), pos: u64) {
        if self.window == 0 {
            return;
        }
        let (client, request) = id;
        let occ = self.total;
        self.total += 1;
        let key = (client, request >> BUCKET_BITS);
        let off = offset(request);
        // The next id of the run remembered last, in the same bucket, at
        // the next position: the run grows (every id of a client batch
        // but the first of each bucket).
        let follows = self.order.back().copied().filter(|l| {
            l.client == client
                && l.first_request >> BUCKET_BITS == key.1
                && l.first_request.checked_add(l.len) == Some(request)
                && l.first_pos.checked_add(l.len) == Some(pos)
        });
        let origin = follows.map_or(occ, |l| l.origin);
        let new = Run {
            first: off,
            len: 1,
            first_pos: pos,
            first_occ: occ,
            origin,
        };
        let shard = self.shard_of(&key);
        match self.shards[shard].entry(key) {
            Entry::Vacant(e) => {
                e.insert(Runs::One(new));
            }
            Entry::Occupied(mut e) => {
                let runs = e.get_mut();
                // Held already (the window grew since it was appended
                // twice, or an occurrence out of the window not dropped
                // yet): the new occurrence replaces it.
                runs.take_out(off);
                let before = follows.and_then(|_| {
                    runs.as_mut_slice()
                        .iter_mut()
                        .find(|r| r.origin == origin && r.first + r.len == off)
                });
                match before {
                    Some(r) => r.len += 1,
                    None => runs.push(new),
                }
            }
        }
        match (follows, self.order.back_mut()) {
            (Some(_), Some(l)) => l.len += 1,
            _ => self.order.push_back(Remembered {
                client,
                first_request: request,
                first_pos: pos,
                len: 1,
                origin: occ,
            }),
        }
        self.drop_expired();
        if occ % GROW_EVERY == 0 {
            self.grow_ahead();
        }
    }

    /// Drops the remembered runs whose every occurrence is out of the
    /// window, with their parts in the buckets.
    fn drop_expired(&mut self) {
        let kept = self.oldest_kept();
        while let Some(r) = self.order.front().copied() {
            if r.origin + r.len > kept {
                break;
            }
            self.order.pop_front();
            let key = (r.client, r.first_request >> BUCKET_BITS);
            let shard = self.shard_of(&key);
            if let Entry::Occupied(mut e) = self.shards[shard].entry(key) {
                if !e.get_mut().retain(|run| run.origin != r.origin) {
                    e.remove();
                }
            }
        }
    }

    /// Runs held, runs in the order, and the ids those cover (for the
    /// memory bound's tests).
    #[cfg(test)]
    fn held_runs(&self) -> (usize, usize, u64) {
        let runs = self
            .shards
            .iter()
            .flat_map(|s| s.values())
            .map(|r| r.as_slice().len())
            .sum();
        let ids = self.order.iter().map(|r| r.len).sum();
        (runs, self.order.len(), ids)
    }
}

/// `request`'s offset in its bucket.
fn offset(request: u64) -> u8 {
    // Masked to BUCKET_BITS bits, so it fits.
    (request & ((1 << BUCKET_BITS) - 1)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    /// The table's meaning with nothing left out: every remember kept,
    /// numbered; an id answers with its latest remember while that one is
    /// among the last `window`.
    struct Model {
        latest: HashMap<(u64, u64), (u64, u64)>,
        total: u64,
        window: u64,
    }

    impl Model {
        fn new(window: usize) -> Model {
            Model {
                latest: HashMap::new(),
                total: 0,
                window: window as u64,
            }
        }
        fn remember(&mut self, id: (u64, u64), pos: u64) {
            if self.window == 0 {
                return;
            }
            self.latest.insert(id, (pos, self.total));
            self.total += 1;
        }
        fn get(&self, id: (u64, u64)) -> Option<u64> {
            let (pos, occ) = *self.latest.get(&id)?;
            (occ + self.window >= self.total).then_some(pos)
        }
    }

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
        assert_eq!(ids.get((6, 4)), None, "another client's id");
        let mut none = RequestIds::new(0);
        none.remember((1, 1), 5);
        assert_eq!(none.get((1, 1)), None, "a window of 0 remembers nothing");
    }

    #[test]
    fn a_client_batch_is_one_run_and_dropped_runs_free_their_memory() {
        let mut ids = RequestIds::new(1000);
        // 64 clients, batches of 64 consecutive ids at consecutive
        // positions, interleaved by batch, as the service sees them.
        let mut pos = 0;
        for batch in 0..200u64 {
            for client in 1..=64u64 {
                for i in 0..64 {
                    ids.remember((client, batch * 64 + i), pos);
                    pos += 1;
                }
            }
        }
        let (runs, order, _) = ids.held_runs();
        // 1,000 ids span at most 17 runs of 64, and one more partly out.
        assert!(runs <= 18 && order <= 18, "{runs} runs, {order} in order");
        assert_eq!(ids.get((64, 199 * 64 + 63)), Some(pos - 1));
        assert_eq!(ids.get((64, 199 * 64 - 1000)), None);
    }

    #[test]
    fn random_ids_grow_the_table_a_shard_at_a_time_ahead_of_need() {
        // Random ids fill the default window with a bucket each. Once a
        // shard is large enough for its growth to cost, it must grow in
        // `grow_ahead`, not when an insert finds it full, and never with
        // another shard in the same remember.
        let mut ids = RequestIds::new(1 << 20);
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let caps =
            |ids: &RequestIds| -> Vec<usize> { ids.shards.iter().map(|s| s.capacity()).collect() };
        let mut before = caps(&ids);
        let mut paced = 0;
        for n in 0..700_000u64 {
            ids.remember((1 + n % 64, rng.random::<u64>()), n);
            let after = caps(&ids);
            let grown: Vec<usize> = (0..SHARDS).filter(|&i| after[i] != before[i]).collect();
            // A small shard may still grow when an insert finds it full,
            // in the same remember as `grow_ahead` grows another: only
            // the costly growths must come one at a time. (Counting every
            // shard failed once in a full run of the library's tests, on
            // line "grew shards"; which shards grew was not recorded, and
            // 60 runs of this test alone did not repeat it.)
            let costly: Vec<usize> = grown
                .iter()
                .copied()
                .filter(|&i| before[i] >= 4096)
                .collect();
            assert!(
                costly.len() <= 1,
                "remember {n} grew large shards {costly:?}"
            );
            for &i in &grown {
                if before[i] >= 4096 {
                    assert_eq!(
                        n % GROW_EVERY,
                        0,
                        "remember {n}: shard {i} of {} grew when full",
                        before[i]
                    );
                    paced += 1;
                }
            }
            before = after;
        }
        assert!(paced >= SHARDS, "only {paced} shards grew ahead");
        assert_eq!(ids.get((1 + 699_999 % 64, 0)), None);
    }

    #[test]
    fn an_id_remembered_again_answers_with_its_latest_position() {
        let mut ids = RequestIds::new(10);
        for r in 0..6u64 {
            ids.remember((1, r), r);
        }
        // Request 2 again, elsewhere (the window grew after a restart).
        ids.remember((1, 2), 50);
        assert_eq!(ids.get((1, 2)), Some(50));
        for r in [0, 1, 3, 4, 5] {
            assert_eq!(ids.get((1, r)), Some(r), "request {r}");
        }
        // The first run's ids fall out one by one; request 2's newer
        // occurrence stays until its own turn.
        for r in 100..106u64 {
            ids.remember((2, r), r);
        }
        assert_eq!(ids.get((1, 0)), None);
        assert_eq!(ids.get((1, 2)), Some(50));
        assert_eq!(ids.get((1, 5)), Some(5));
        for r in 106..110u64 {
            ids.remember((2, r), r);
        }
        assert_eq!(ids.get((1, 5)), None);
        assert_eq!(ids.get((1, 2)), None);
    }

    #[test]
    fn taking_an_id_out_of_a_run_leaves_no_empty_run_behind() {
        // Splitting a run at its first or last id leaves one part, not a
        // part and an empty one: empty runs would answer nothing but hold
        // memory until their batch left the window.
        let mut ids = RequestIds::new(100);
        for r in 0..6u64 {
            ids.remember((1, r), r);
        }
        assert_eq!(ids.held_runs().0, 1);
        // The first id again: the rest (1..=5) and the new occurrence.
        ids.remember((1, 0), 60);
        assert_eq!(ids.held_runs().0, 2);
        // The last id again: 1..=4, 0 at 60 and 5 at 65.
        ids.remember((1, 5), 65);
        assert_eq!(ids.held_runs().0, 3);
        // A middle id again: 1, 3..=4, 0, 5 and 2 at 62.
        ids.remember((1, 2), 62);
        assert_eq!(ids.held_runs().0, 5);
        for (r, pos) in [(0, 60), (1, 1), (2, 62), (3, 3), (4, 4), (5, 65)] {
            assert_eq!(ids.get((1, r)), Some(pos), "request {r}");
        }
    }

    #[test]
    fn a_run_leaves_the_table_with_its_last_id_out_of_the_window() {
        // Runs of one id each (a client apiece): with a window of 4, the
        // table holds exactly the last four, not one more until the next
        // remember.
        let mut ids = RequestIds::new(4);
        for n in 0..10u64 {
            ids.remember((n + 1, 7), n);
            let held = (n + 1).min(4);
            assert_eq!(
                ids.held_runs(),
                (held as usize, held as usize, held),
                "after {n}"
            );
        }
        // A run of three leaves only when its third id does.
        for r in 0..3u64 {
            ids.remember((20, r), 100 + r);
        }
        ids.remember((21, 0), 200);
        assert_eq!(ids.held_runs(), (2, 2, 4));
        ids.remember((22, 0), 201);
        assert_eq!(ids.held_runs(), (3, 3, 5), "one of the run's ids is out");
        ids.remember((23, 0), 202);
        assert_eq!(ids.held_runs(), (4, 4, 6), "two of the run's ids are out");
        assert_eq!(ids.get((20, 1)), None);
        assert_eq!(ids.get((20, 2)), Some(102));
        ids.remember((24, 0), 203);
        assert_eq!(ids.held_runs(), (4, 4, 4));
        assert_eq!(ids.get((20, 2)), None);
    }

    #[test]
    fn extreme_ids_neither_overflow_nor_merge() {
        let mut ids = RequestIds::new(8);
        ids.remember((u64::MAX, u64::MAX - 1), u64::MAX - 1);
        ids.remember((u64::MAX, u64::MAX), u64::MAX);
        ids.remember((u64::MAX, 0), 0);
        ids.remember((0, u64::MAX), 3);
        assert_eq!(ids.get((u64::MAX, u64::MAX)), Some(u64::MAX));
        assert_eq!(ids.get((u64::MAX, u64::MAX - 1)), Some(u64::MAX - 1));
        assert_eq!(ids.get((u64::MAX, 0)), Some(0));
        assert_eq!(ids.get((0, u64::MAX)), Some(3));
        assert_eq!(ids.get((0, 0)), None);
    }

    /// An operation of the property test: remember an id at a position
    /// that continues the previous one or not.
    #[derive(Debug, Clone)]
    struct Op {
        client: u64,
        request: u64,
        next_pos: bool,
        pos: u64,
    }

    fn op() -> impl Strategy<Value = Op> {
        (0u64..3, 0u64..24, any::<bool>(), 0u64..40).prop_map(|(client, request, next_pos, pos)| {
            Op {
                client,
                request,
                next_pos,
                pos,
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Against the model after every remember, on every id of a small
        /// space, so runs grow, split, repeat ids and fall out.
        #[test]
        fn agrees_with_the_model(window in 0usize..12, ops in prop::collection::vec(op(), 0..120), runs_of in 1u64..6) {
            let mut ids = RequestIds::new(window);
            let mut model = Model::new(window);
            let (mut last_client, mut last_req, mut last_pos) = (0u64, 0u64, 0u64);
            for (n, o) in ops.iter().enumerate() {
                // Every few ops, continue the last id's run.
                let (client, request, pos) = if n as u64 % runs_of != 0 {
                    (last_client, last_req + 1, last_pos + 1)
                } else {
                    (o.client, o.request, if o.next_pos { last_pos + 1 } else { o.pos })
                };
                ids.remember((client, request), pos);
                model.remember((client, request), pos);
                (last_client, last_req, last_pos) = (client, request, pos);
                for c in 0..3 {
                    for r in 0..(24 + ops.len() as u64) {
                        prop_assert_eq!(ids.get((c, r)), model.get((c, r)), "id ({}, {}) after op {}", c, r, n);
                    }
                }
                let (runs, order, held) = ids.held_runs();
                // Only runs with an id in the window stay in the order, and
                // no id is held in two runs.
                prop_assert!(order <= window + 1, "{} runs in order, window {}", order, window);
                prop_assert!(runs as u64 <= held, "{} runs held for {} ids", runs, held);
            }
        }
    }
}
