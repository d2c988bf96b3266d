//! Criterion benchmark of the meld operator (paper §8 workload: 128K keys,
//! 8-byte keys and values, serializable, read:update 1:1, concurrency
//! degree 16). One iteration is one meld; decoding happens untimed ahead of
//! it, as the paper's pre-deserialization did.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use melddb_bench::workload::{generate, loaded, Spec, Write};

fn meld(c: &mut Criterion) {
    let base = loaded(128 * 1024);
    let mut g = c.benchmark_group("meld");
    g.sample_size(20);
    for ops in [2usize, 8] {
        let spec = Spec {
            experiment: "criterion",
            keys: 128 * 1024,
            ops,
            degree: 16,
            read_pct: 50,
            write: Write::Update,
            txns: 3000,
            brute: false,
        };
        let log = generate(&spec, &base, 7);
        g.bench_function(format!("{ops}op_deg16"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut done = 0u64;
                while done < iters {
                    let mut m = base.clone();
                    m.set_deferred_reclaim(true);
                    let mut idx = 0;
                    while idx < log.len() && done < iters {
                        let first = m.next_pos();
                        let chunk = &log[idx..(idx + 17).min(log.len())];
                        let decoded: Vec<_> = chunk
                            .iter()
                            .enumerate()
                            .map(|(j, b)| m.decode(first + j as u64, b))
                            .collect();
                        for d in decoded {
                            let t = Instant::now();
                            let out = m.apply_decoded(d);
                            total += t.elapsed();
                            std::hint::black_box(out);
                            done += 1;
                        }
                        drop(m.take_garbage());
                        idx += chunk.len();
                    }
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, meld);
criterion_main!(benches);
