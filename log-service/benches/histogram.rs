//! Criterion benchmark of the writer's per-append latency bookkeeping: a
//! client batch of 64 appends, which arrived together, counted in a stage
//! histogram one by one (what the writer did before) and as runs of equal
//! durations (`Histogram::record_runs`, what it does now).
//!
//! `cargo bench -p melddb-log --bench histogram`

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use melddb_log::latency::Histogram;

fn histogram(c: &mut Criterion) {
    let h = Histogram::default();
    // One client batch: 64 appends with the same arrival time.
    let batch = [Duration::from_micros(730); 64];
    c.bench_function("batch_of_64/one_by_one", |b| {
        b.iter(|| {
            for &d in black_box(&batch) {
                h.record(d);
            }
        })
    });
    c.bench_function("batch_of_64/runs", |b| {
        b.iter(|| h.record_runs(black_box(&batch).iter().copied()))
    });
}

criterion_group!(benches, histogram);
criterion_main!(benches);
