//! Times the recovery of a store directory, with the page cache dropped
//! first (a cold start, as after a reboot) or not.
//!
//! ```text
//! # fill DIR with about 8 GiB of 1 KiB records (the log suite's geometry:
//! # five zones, 4 data + 1 parity pages of 256 KiB, 256 MiB segments), then
//! # time three cold opens
//! cargo run --release -p melddb-log --example recover -- DIR --fill-gib 8 --opens 3 --cold
//! ```
//!
//! Dropping the page cache writes `/proc/sys/vm/drop_caches`, which needs
//! root; without it the opens are reported as hot. The directory is kept:
//! delete it when done.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use melddb_log::config::Config;
use melddb_log::store::Store;

fn config(dir: &Path, spares: u32) -> Config {
    let zones: Vec<PathBuf> = (0..5).map(|z| dir.join(format!("zone{z}"))).collect();
    let mut c = Config::with_zones(zones);
    c.data_shards = 4;
    c.parity_shards = 1;
    c.page_bytes = 256 << 10;
    c.segment_bytes = 256 << 20;
    c.max_segments = 100_000;
    c.prepared_segments = spares;
    c
}

struct Args {
    dir: PathBuf,
    fill_gib: f64,
    opens: usize,
    cold: bool,
    spares: u32,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        dir: PathBuf::new(),
        fill_gib: 0.0,
        opens: 1,
        cold: false,
        spares: 0,
    };
    let num = |v: Option<String>, what: &str| -> Result<f64, String> {
        v.ok_or(format!("{what} needs a value"))?
            .parse::<f64>()
            .map_err(|e| format!("{what}: {e}"))
    };
    while let Some(x) = it.next() {
        match x.as_str() {
            "--fill-gib" => a.fill_gib = num(it.next(), "--fill-gib")?,
            "--opens" => a.opens = num(it.next(), "--opens")? as usize,
            "--spares" => a.spares = num(it.next(), "--spares")? as u32,
            "--cold" => a.cold = true,
            d if !d.starts_with("--") && a.dir.as_os_str().is_empty() => a.dir = d.into(),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.dir.as_os_str().is_empty() {
        return Err("usage: recover DIR [--fill-gib N] [--opens N] [--cold] [--spares N]".into());
    }
    Ok(a)
}

/// Appends about `gib` GiB of 1 KiB records: 64 writers, batches of 64.
fn fill(store: Arc<Store>, gib: f64) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .map_err(|e| e.to_string())?;
    let per_task = ((gib * (1u64 << 30) as f64) / 1024.0 / 64.0 / 64.0).ceil() as u64;
    let t = Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for w in 0..64u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let rec = Bytes::from(vec![w as u8 + 1; 1024]);
                for b in 0..per_task {
                    let batch = vec![rec.clone(); 64];
                    store
                        .append_many("fill", w + 1, b * 64, batch)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<(), String>(())
            }));
        }
        for t in tasks {
            t.await.map_err(|e| e.to_string())??;
        }
        Ok::<(), String>(())
    })?;
    eprintln!(
        "filled {:.2} GiB in {:.1} s",
        (per_task * 64 * 64 * 1024) as f64 / (1u64 << 30) as f64,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn drop_caches() -> bool {
    // Dirty pages first, or they stay cached.
    let synced = std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

fn main() -> Result<(), String> {
    let a = args()?;
    let cfg = config(&a.dir, a.spares);
    if a.fill_gib > 0.0 {
        let store = Arc::new(Store::open(cfg.clone()).map_err(|e| e.to_string())?);
        fill(store.clone(), a.fill_gib)?;
        store.shutdown();
    }
    for i in 0..a.opens {
        let cold = a.cold && drop_caches();
        if a.cold && !cold {
            eprintln!("could not drop the page cache (needs root): this open is hot");
        }
        let t = Instant::now();
        let store = Store::open(cfg.clone()).map_err(|e| e.to_string())?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "open {}: {} {secs:.3} s; {:?}",
            i + 1,
            if cold { "cold" } else { "hot" },
            store.recovery()
        );
        store.shutdown();
    }
    Ok(())
}
