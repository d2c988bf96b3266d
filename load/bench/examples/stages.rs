//! Per-stage timing of the pipeline workload on one thread: decode,
//! premeld and final meld, in microseconds per intention.
//! `cargo run --release -p melddb-bench --example stages [-- KEYS TXNS ZONE]`

use std::time::{Duration, Instant};

use melddb::pipeline::premeld;
use melddb::{MeldStats, Settings};
use melddb_bench::pipeline::{generate, loaded, Generated, Sizes};

fn main() {
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let s = Sizes {
        keys: *a.first().unwrap_or(&100_000),
        txns: *a.get(1).unwrap_or(&6_000) as usize,
        zone_min: *a.get(2).unwrap_or(&600) / 2,
        zone_max: *a.get(2).unwrap_or(&600),
    };
    for (t, d) in [(0, 0), (2, 5)] {
        let settings = Settings {
            max_conflict_zone: s.zone_max as u32 + 64,
            premeld_threads: t,
            premeld_distance: d,
            ..Settings::default()
        };
        let base = loaded(settings, s.keys);
        let Generated {
            warm: mut m, log, ..
        } = generate(&base, &s, 1);
        let (mut dec, mut pre, mut fin) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let mut nodes = 0u64;
        let mut st = MeldStats::default();
        for e in &log {
            let pos = m.next_pos();
            let t0 = Instant::now();
            let int = m.decode(pos, e);
            dec += t0.elapsed();
            if let Ok(i) = &int {
                nodes += i.node_count() as u64;
            }
            let t1 = Instant::now();
            let int = int.and_then(|i| {
                premeld(&settings, i, |p| m.meld_state(p).cloned(), &mut st)
                    .expect("state retained")
            });
            pre += t1.elapsed();
            let t2 = Instant::now();
            m.apply_decoded(int);
            fin += t2.elapsed();
        }
        let n = log.len() as f64;
        println!(
            "t={t} d={d}: {:.1} nodes/intention; decode {:.1} us, premeld {:.1} us, final meld {:.1} us per intention",
            nodes as f64 / n,
            dec.as_secs_f64() * 1e6 / n,
            pre.as_secs_f64() * 1e6 / n,
            fin.as_secs_f64() * 1e6 / n
        );
    }
}
