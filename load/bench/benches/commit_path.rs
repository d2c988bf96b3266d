//! Criterion benchmark of the CPU an embedded commit costs, without the
//! disk and the thread hand-offs: the embedded suite's 8r2w transaction
//! (200,000 keys of 8 bytes, 100-byte values, 8 random reads and 2 random
//! writes, serializable) run on the latest state, sealed into its
//! intention (`finish_local`), and melded from its nodes (`apply_local`),
//! as the client thread and the writer thread do it. `client` times the
//! transaction and its sealing, `meld` the meld, `free` freeing what meld
//! replaced. Single-threaded CPU work is far steadier than the
//! embedded suite's durable cells, so this is how changes to that path are
//! compared (`--save-baseline` / `--baseline`).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use melddb::{Isolation, Melder, Settings, Transaction};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const KEYS: u64 = 200_000;

fn key(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

fn loaded() -> Melder {
    let mut m = Melder::new(Settings::default());
    let value = [7u8; 100];
    let mut i = 0;
    while i < KEYS {
        let mut tx = Transaction::begin(m.lcs(), Isolation::SnapshotIsolation);
        for j in i..(i + 10_000).min(KEYS) {
            tx.put(&key(j), &value).expect("valid pair");
        }
        i += 10_000;
        if let Ok(Some((bytes, local))) = tx.finish_local() {
            m.apply_local(&bytes, local);
        }
    }
    m
}

/// Times (client, meld, free) over `iters` transactions.
fn run(m: &mut Melder, rng: &mut ChaCha8Rng, iters: u64) -> [Duration; 3] {
    let mut t = [Duration::ZERO; 3];
    let mut value = [9u8; 100];
    for _ in 0..iters {
        let t0 = Instant::now();
        let mut tx = Transaction::begin(m.lcs(), Isolation::Serializable);
        for _ in 0..8 {
            std::hint::black_box(tx.get(&key(rng.random_range(0..KEYS))).expect("read"));
        }
        value[..8].copy_from_slice(&rng.random::<u64>().to_le_bytes());
        for _ in 0..2 {
            tx.put(&key(rng.random_range(0..KEYS)), &value)
                .expect("write");
        }
        let (bytes, local) = tx
            .finish_local()
            .expect("seal")
            .expect("a writing transaction");
        let t1 = Instant::now();
        std::hint::black_box(m.apply_local(&bytes, local));
        let t2 = Instant::now();
        drop(m.take_garbage());
        let t3 = Instant::now();
        t[0] += t1 - t0;
        t[1] += t2 - t1;
        t[2] += t3 - t2;
    }
    t
}

fn commit_path(c: &mut Criterion) {
    let mut m = loaded();
    m.set_deferred_reclaim(true);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut g = c.benchmark_group("commit_path_8r2w");
    g.sample_size(30);
    for (i, part) in ["client", "meld", "free"].into_iter().enumerate() {
        g.bench_function(part, |b| {
            b.iter_custom(|iters| run(&mut m, &mut rng, iters)[i])
        });
    }
    g.finish();
}

criterion_group!(benches, commit_path);
criterion_main!(benches);
