//! The disk under the service, measured without it: raw sequential
//! write bandwidth, fsync rounds on the idle disk, and the wait for the
//! trims of removed files.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{pct, sorted};

/// Raw sequential write bandwidth: 1 MiB writes, fdatasync every 8 MiB.
pub fn disk_seq_write(dir: &Path, mib: usize) -> Result<f64, String> {
    raw_write(dir, Some(mib), None)
}

/// Removes `dir` (a stopped service's files) and waits until the disk has
/// discarded the freed blocks. A file system mounted with `discard` trims
/// them after the deletion commits, and a raw write or load
/// point that overlaps tens of GiB of trims measures a fraction of the
/// disk. So this commits the deletion (an fsync of the parent directory),
/// then polls the discarded-sector counters in `/proc/diskstats` until
/// they have not moved for a second, for at most a minute. Without that
/// file it only commits. Returns the seconds spent.
pub(super) fn remove_and_settle(dir: &Path) -> Result<f64, String> {
    let t = Instant::now();
    std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    settle_trims(dir)?;
    let waited = t.elapsed().as_secs_f64();
    eprintln!(
        "  removed {} and waited {waited:.1} s for the disk's trims",
        dir.display()
    );
    Ok(waited)
}

/// The wait of [`remove_and_settle`], after `removed` (a file or a
/// directory) was deleted.
pub fn settle_trims(removed: &Path) -> Result<(), String> {
    let t = Instant::now();
    if let Some(parent) = removed.parent() {
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("committing the removal of {}: {e}", removed.display()))?;
    }
    // Field 14 after the device name: sectors discarded (Linux 4.18+).
    let discarded = || -> Option<u64> {
        let text = std::fs::read_to_string("/proc/diskstats").ok()?;
        Some(
            text.lines()
                .filter_map(|l| l.split_whitespace().nth(16)?.parse::<u64>().ok())
                .sum(),
        )
    };
    let Some(mut last) = discarded() else {
        return Ok(());
    };
    let mut still = Instant::now();
    while still.elapsed() < Duration::from_secs(1) && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
        let now = discarded().unwrap_or(last);
        if now != last {
            last = now;
            still = Instant::now();
        }
    }
    Ok(())
}

/// [`disk_seq_write`] for `secs` seconds instead of a fixed size: the disk
/// as it is right then, for as long as a load point runs.
pub fn disk_seq_write_for(dir: &Path, secs: f64) -> Result<f64, String> {
    raw_write(dir, None, Some(Duration::from_secs_f64(secs)))
}

fn raw_write(dir: &Path, mib: Option<usize>, secs: Option<Duration>) -> Result<f64, String> {
    let path = dir.join("raw.dat");
    let mut f = std::fs::File::create(&path).map_err(|e| e.to_string())?;
    let block = vec![0x5au8; 1 << 20];
    let t = Instant::now();
    let mut written = 0usize;
    while mib.is_none_or(|m| written < m) && secs.is_none_or(|d| t.elapsed() < d) {
        f.write_all(&block).map_err(|e| e.to_string())?;
        written += 1;
        if written.is_multiple_of(8) {
            f.sync_data().map_err(|e| e.to_string())?;
        }
    }
    f.sync_data().map_err(|e| e.to_string())?;
    let s = t.elapsed().as_secs_f64();
    drop(f);
    // The load point after this must not meet the trims of this file.
    let _ = std::fs::remove_file(&path);
    settle_trims(&path)?;
    Ok(written as f64 / s)
}

/// Latency of one fsync round on the idle disk, the floor under the
/// service's append latency: what a round costs before any load.
#[derive(Debug, Clone, Serialize)]
pub struct RoundFloor {
    /// Which floor this is; the JSON's metrics are `disk_{name}_p50_ms`
    /// and `disk_{name}_p99_ms`.
    pub name: &'static str,
    /// Files written and fdatasync'd per round.
    pub files: usize,
    /// Bytes appended to each file per round.
    pub bytes: usize,
    /// Rounds timed.
    pub rounds: usize,
    /// Median round (ms).
    pub p50_ms: f64,
    /// 99th percentile round (ms).
    pub p99_ms: f64,
    /// Bytes written per second over the rounds, back to back (MiB/s).
    pub mib_s: f64,
}

/// Times `rounds` fsync rounds as the service's writer runs them: append
/// `bytes` to each of `files` files, then fdatasync them all in parallel
/// on long-lived helper threads (one per file, as the service's sync
/// pool has) and wait for the last. Nothing else runs meanwhile, so this
/// is the least a round of that many files costs on this disk; an append
/// is acknowledged only after at least one such round.
pub fn fsync_round_floor(
    dir: &Path,
    name: &'static str,
    files: usize,
    bytes: usize,
    rounds: usize,
) -> Result<RoundFloor, String> {
    use std::os::unix::fs::FileExt as _;
    use std::sync::mpsc;
    let dir = dir.join(format!("floor{files}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut handles = Vec::new();
    for f in 0..files {
        let file = std::fs::File::create(dir.join(format!("f{f}"))).map_err(|e| e.to_string())?;
        handles.push(Arc::new(file));
    }
    let (done_tx, done_rx) = mpsc::channel::<std::io::Result<()>>();
    let mut go = Vec::new();
    let mut helpers = Vec::new();
    for file in &handles {
        let (tx, rx) = mpsc::channel::<()>();
        let (file, done) = (file.clone(), done_tx.clone());
        go.push(tx);
        helpers.push(std::thread::spawn(move || {
            while rx.recv().is_ok() {
                if done.send(file.sync_data()).is_err() {
                    return;
                }
            }
        }));
    }
    drop(done_tx);
    let page = vec![0xa5u8; bytes];
    let mut lat = Vec::with_capacity(rounds);
    let t0 = Instant::now();
    let mut result = Ok(());
    'rounds: for r in 0..rounds {
        let t = Instant::now();
        for file in &handles {
            if let Err(e) = file.write_all_at(&page, (r * bytes) as u64) {
                result = Err(e.to_string());
                break 'rounds;
            }
        }
        for tx in &go {
            let _ = tx.send(());
        }
        for _ in 0..files {
            match done_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    result = Err(e.to_string());
                    break 'rounds;
                }
                Err(_) => {
                    result = Err("an fsync helper stopped".into());
                    break 'rounds;
                }
            }
        }
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mib_s = (lat.len() * files * bytes) as f64 / t0.elapsed().as_secs_f64() / (1 << 20) as f64;
    drop(go);
    for h in helpers {
        let _ = h.join();
    }
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    let lat = sorted(lat);
    Ok(RoundFloor {
        name,
        files,
        bytes,
        rounds: lat.len(),
        p50_ms: pct(&lat, 0.5),
        p99_ms: pct(&lat, 0.99),
        mib_s,
    })
}
