//! Where a commit's time goes on a node on the log service: the append
//! (until the service acknowledges it) against the wait for the node to
//! meld it, one committing thread, median of each.
use std::sync::Arc;
use std::time::Instant;

use melddb::Isolation;
use melddb_runtime::{Database, DbOptions};

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let zones = (0..5)
        .map(|z| tmp.path().join(format!("zone{z}")))
        .collect();
    let cfg = melddb_log::Config::with_zones(zones);
    let store = Arc::new(melddb_log::Store::open(cfg).unwrap());
    let running = rt
        .block_on(melddb_log::start_on(
            store.clone(),
            "127.0.0.1:0",
            "127.0.0.1:0",
        ))
        .unwrap();
    let url = format!("melddb://{}/bank", running.tcp);
    let db = Database::connect(&url, tmp.path().join("n"), DbOptions::default()).unwrap();
    let threads: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let db = Arc::new(db);
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || {
                let (mut app, mut meld) = (Vec::new(), Vec::new());
                for i in 0..2000u64 {
                    let mut tx = db.begin(Isolation::Serializable);
                    tx.put(format!("k{t}/{}", i % 500).as_bytes(), &[7u8; 100])
                        .unwrap();
                    let t0 = Instant::now();
                    let h = db.submit(tx).unwrap();
                    let t1 = Instant::now();
                    h.wait().unwrap();
                    let t2 = Instant::now();
                    app.push((t1 - t0).as_micros() as u64);
                    meld.push((t2 - t1).as_micros() as u64);
                }
                (app, meld)
            })
        })
        .collect();
    let (mut app, mut meld) = (Vec::new(), Vec::new());
    for h in handles {
        let (a, m) = h.join().unwrap();
        app.extend(a);
        meld.extend(m);
    }
    println!(
        "{threads} threads: {:.0} commits/s",
        (threads * 2000) as f64 / started.elapsed().as_secs_f64()
    );
    let db = Arc::try_unwrap(db).unwrap();
    app.sort_unstable();
    meld.sort_unstable();
    let q = |v: &Vec<u64>, f: f64| v[((v.len() as f64) * f) as usize];
    println!(
        "append p50 {} p99 {} us; meld wait p50 {} p99 {} us",
        q(&app, 0.5),
        q(&app, 0.99),
        q(&meld, 0.5),
        q(&meld, 0.99)
    );
    drop(db);
    rt.block_on(running.shutdown());
    store.shutdown();
}
