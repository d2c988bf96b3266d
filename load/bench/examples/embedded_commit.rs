//! Where an embedded commit's time goes under the embedded suite's 8r2w
//! workload (200,000 keys, 100-byte values): building the transaction,
//! `submit` (encode, append and meld under the writer's lock) and the
//! wait for the flush, each as p50 / p99 / p99.9 in microseconds.
//!
//! `embedded_commit [THREADS] [SECS] [buffered] [ckpt=MIB] [inflight=N]`.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use melddb::Isolation;
use melddb_bench::embedded::{key, load_meld, VALUE};
use melddb_runtime::{Database, DbOptions, Durability};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[global_allocator]
static GLOBAL: melddb_alloc::MeldAlloc = melddb_alloc::MeldAlloc;

const KEYS: u64 = 200_000;

fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0)
}

fn main() {
    melddb_alloc::configure();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(4);
    let secs: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let mut opts = DbOptions::default();
    for a in &args {
        if a == "buffered" {
            opts.durability = Durability::Buffered;
        } else if let Some(m) = a.strip_prefix("ckpt=") {
            opts.checkpoint_bytes = m.parse::<u64>().expect("ckpt=MIB") << 20;
        } else if let Some(n) = a.strip_prefix("inflight=") {
            opts.max_in_flight = n.parse().expect("inflight=N");
        }
    }
    let tmp = tempfile::tempdir().expect("temporary directory");
    let db = Arc::new(Database::open_with(tmp.path(), opts).expect("open"));
    load_meld(&db, KEYS).expect("load");
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (db, stop) = (db.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(t + 1);
                let (mut build, mut submit, mut wait) = (Vec::new(), Vec::new(), Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let mut tx = db.begin(Isolation::Serializable);
                    for _ in 0..8 {
                        tx.get(&key(rng.random_range(0..KEYS))).expect("get");
                    }
                    let mut value = VALUE;
                    value[..8].copy_from_slice(&rng.random::<u64>().to_le_bytes());
                    for _ in 0..2 {
                        tx.put(&key(rng.random_range(0..KEYS)), &value)
                            .expect("put");
                    }
                    let t1 = Instant::now();
                    let h = db.submit(tx).expect("submit");
                    let t2 = Instant::now();
                    h.wait().expect("wait");
                    let t3 = Instant::now();
                    build.push((t1 - t0).as_micros() as u64);
                    submit.push((t2 - t1).as_micros() as u64);
                    wait.push((t3 - t2).as_micros() as u64);
                }
                (build, submit, wait)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let (mut build, mut submit, mut wait) = (Vec::new(), Vec::new(), Vec::new());
    for h in handles {
        let (b, s, w) = h.join().expect("client thread");
        build.extend(b);
        submit.extend(s);
        wait.extend(w);
    }
    let n = build.len();
    let mut total: Vec<u64> = (0..n).map(|i| build[i] + submit[i] + wait[i]).collect();
    println!(
        "{} txns, {:.0} tps; µs p50/p99/p99.9",
        n,
        n as f64 / secs as f64
    );
    for (name, v) in [
        ("build", &mut build),
        ("submit", &mut submit),
        ("wait", &mut wait),
        ("total", &mut total),
    ] {
        println!(
            "{name:>7} {:>6} {:>6} {:>6}",
            pct(v, 0.5),
            pct(v, 0.99),
            pct(v, 0.999)
        );
    }
    println!("{:?}", db.log_stats());
}
