//! Criterion benchmark of the request-id table on the writer's path: for
//! every append of a client batch, a lookup of its id (a miss: the id is
//! new) and, once the batch is durable, a remember. The table holds the
//! default window (1 Mi ids) and is full before timing starts, so every
//! remember also forgets the oldest id.
//!
//! Baseline: the table the service used before runs, kept here as it was
//! (one foldhash entry per id, an order queue, both sized for the window
//! up front). Two workloads: the service's (64 clients, batches of 64
//! consecutive ids, interleaved by batch) and the worst case for runs
//! (every id a random request of one of 64 clients, so no run grows).
//!
//! `cargo bench -p melddb-log --bench request_ids`

use std::collections::{HashMap, VecDeque};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use melddb_log::request_ids::RequestIds;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const WINDOW: usize = 1 << 20;
const CLIENTS: u64 = 64;
const BATCH: u64 = 64;

/// The table before runs: one hash entry per id.
struct Flat {
    positions: HashMap<(u64, u64), u64, foldhash::fast::RandomState>,
    order: VecDeque<(u64, u64)>,
    window: usize,
}

impl Flat {
    fn new(window: usize) -> Flat {
        let n = window + 1;
        Flat {
            positions: HashMap::with_capacity_and_hasher(n, Default::default()),
            order: VecDeque::with_capacity(n),
            window,
        }
    }
    fn get(&self, id: (u64, u64)) -> Option<u64> {
        self.positions.get(&id).copied()
    }
    fn remember(&mut self, id: (u64, u64), pos: u64) {
        self.positions.insert(id, pos);
        self.order.push_back(id);
        while self.order.len() > self.window {
            if let Some(old) = self.order.pop_front() {
                self.positions.remove(&old);
            }
        }
    }
}

/// What both tables do for the writer.
trait Table {
    fn get(&self, id: (u64, u64)) -> Option<u64>;
    fn remember(&mut self, id: (u64, u64), pos: u64);
}

impl Table for Flat {
    fn get(&self, id: (u64, u64)) -> Option<u64> {
        Flat::get(self, id)
    }
    fn remember(&mut self, id: (u64, u64), pos: u64) {
        Flat::remember(self, id, pos)
    }
}

impl Table for RequestIds {
    fn get(&self, id: (u64, u64)) -> Option<u64> {
        RequestIds::get(self, id)
    }
    fn remember(&mut self, id: (u64, u64), pos: u64) {
        RequestIds::remember(self, id, pos)
    }
}

/// The ids of the next client batch.
trait Ids {
    fn next_batch(&mut self, out: &mut Vec<(u64, u64)>);
}

/// 64 clients in turn, each batch the client's next 64 request ids.
struct Batches {
    turn: u64,
}

impl Ids for Batches {
    fn next_batch(&mut self, out: &mut Vec<(u64, u64)>) {
        out.clear();
        let client = 1 + self.turn % CLIENTS;
        let first = (self.turn / CLIENTS) * BATCH;
        out.extend((0..BATCH).map(|i| (client, first + i)));
        self.turn += 1;
    }
}

/// Random request ids: runs never grow.
struct Scattered(ChaCha8Rng);

impl Ids for Scattered {
    fn next_batch(&mut self, out: &mut Vec<(u64, u64)>) {
        out.clear();
        let client = self.0.random_range(1..=CLIENTS);
        for _ in 0..BATCH {
            out.push((client, self.0.random::<u64>()));
        }
    }
}

/// One client batch through the table: a lookup per id, then a remember.
fn batch<T: Table>(t: &mut T, ids: &[(u64, u64)], pos: &mut u64) -> u64 {
    let mut found = 0;
    for &id in ids {
        found += u64::from(t.get(id).is_some());
    }
    for &id in ids {
        t.remember(id, *pos);
        *pos += 1;
    }
    found
}

fn run<T: Table, I: Ids>(c: &mut Criterion, name: &str, mut table: T, mut ids: I) {
    let mut buf = Vec::new();
    let mut pos = 0;
    // Fill the window, and a little more, before timing.
    while pos < (WINDOW as u64) * 5 / 4 {
        ids.next_batch(&mut buf);
        batch(&mut table, &buf, &mut pos);
    }
    c.bench_function(name, |b| {
        b.iter_batched_ref(
            || {
                let mut v = Vec::with_capacity(BATCH as usize);
                ids.next_batch(&mut v);
                v
            },
            |v| {
                let found = batch(&mut table, v, &mut pos);
                assert_eq!(found, 0, "new ids are never found");
            },
            BatchSize::SmallInput,
        )
    });
}

fn request_ids(c: &mut Criterion) {
    run(
        c,
        "batches_of_64/runs",
        RequestIds::new(WINDOW),
        Batches { turn: 0 },
    );
    run(
        c,
        "batches_of_64/flat",
        Flat::new(WINDOW),
        Batches { turn: 0 },
    );
    let rng = || Scattered(ChaCha8Rng::seed_from_u64(7));
    run(c, "scattered/runs", RequestIds::new(WINDOW), rng());
    run(c, "scattered/flat", Flat::new(WINDOW), rng());
}

criterion_group!(benches, request_ids);
criterion_main!(benches);
