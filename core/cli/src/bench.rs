//! `melddb bench`: a timed workload against the node, with a progress bar.

use melddb::Isolation;
use melddb_runtime::Database;
use rand::{Rng, SeedableRng};

fn bench_key(i: u64) -> Vec<u8> {
    format!("bench/{i:010}").into_bytes()
}

/// `melddb bench`: loads `keys` keys if needed, runs `threads` clients for
/// `seconds` with a progress bar, then prints tps and latency percentiles.
pub fn bench(
    db: Database,
    mix: &str,
    threads: usize,
    seconds: f64,
    keys: u64,
    json: bool,
    isolation: Isolation,
) -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let (reads, writes) = match mix {
        "8r2w" => (8, 2),
        "2op" => (1, 1),
        "ro" => (10, 0),
        other => return Err(format!("unknown mix {other:?}: use 8r2w, 2op or ro")),
    };
    if threads == 0 || keys == 0 || seconds.is_nan() || seconds <= 0.0 {
        return Err("threads, keys and seconds must be positive".into());
    }
    let db = Arc::new(db);
    if db
        .get(&bench_key(keys - 1))
        .map_err(|e| e.to_string())?
        .is_none()
    {
        let bar = (!json).then(|| indicatif::ProgressBar::new(keys).with_message("loading"));
        let mut i = 0;
        while i < keys {
            let end = (i + 5_000).min(keys);
            db.transact(Isolation::SnapshotIsolation, |tx| {
                for j in i..end {
                    tx.put(&bench_key(j), &[b'v'; 100])?;
                }
                Ok::<_, melddb::TxnError>(())
            })
            .map_err(|e| e.to_string())?;
            i = end;
            if let Some(b) = &bar {
                b.set_position(i);
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (db, stop, done) = (db.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || -> Result<(Vec<f64>, u64), String> {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(t as u64 + 1);
                let mut lat = Vec::new();
                let mut aborts = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    loop {
                        let mut tx = db.begin(isolation);
                        for _ in 0..reads {
                            tx.get(&bench_key(rng.random_range(0..keys)))
                                .map_err(|e| e.to_string())?;
                        }
                        let mut v = [b'v'; 100];
                        v[..8].copy_from_slice(&rng.random::<u64>().to_le_bytes());
                        for _ in 0..writes {
                            tx.put(&bench_key(rng.random_range(0..keys)), &v)
                                .map_err(|e| e.to_string())?;
                        }
                        if db.commit(tx).map_err(|e| e.to_string())?.is_committed() {
                            break;
                        }
                        aborts += 1;
                    }
                    lat.push(t0.elapsed().as_secs_f64() * 1e3);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok((lat, aborts))
            })
        })
        .collect();
    let start = Instant::now();
    let total = Duration::from_secs_f64(seconds);
    let bar = (!json).then(|| {
        let b = indicatif::ProgressBar::new(total.as_millis() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {elapsed_precise} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    while start.elapsed() < total {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(b) = &bar {
            b.set_position(start.elapsed().as_millis() as u64);
            let n = done.load(Ordering::Relaxed);
            b.set_message(format!(
                "{n} committed, {:.0} tps",
                n as f64 / start.elapsed().as_secs_f64()
            ));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    let mut aborts = 0;
    for h in handles {
        let (l, a) = h
            .join()
            .map_err(|_| "client thread panicked".to_string())??;
        lat.extend(l);
        aborts += a;
    }
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let tps = lat.len() as f64 / elapsed;
    let v = serde_json::json!({
        "mix": mix, "threads": threads, "seconds": elapsed, "keys": keys,
        "committed": lat.len(), "aborted_attempts": aborts, "tps": tps,
        "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": lat.last().copied().unwrap_or(0.0),
        "durability": "sync (fdatasync per group commit)",
    });
    if json {
        println!("{v}");
    } else {
        println!(
            "{:<8} {:>7} {:>10} {:>10} {:>9} {:>9} {:>9}",
            "mix", "threads", "committed", "tps", "p50 ms", "p99 ms", "aborts"
        );
        println!(
            "{:<8} {:>7} {:>10} {:>10.0} {:>9.3} {:>9.3} {:>9}",
            mix,
            threads,
            lat.len(),
            tps,
            pct(0.5),
            pct(0.99),
            aborts
        );
    }
    Ok(())
}
