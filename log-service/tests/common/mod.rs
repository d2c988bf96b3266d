//! What the storage tests share (`tests/store_*.rs`, `tests/devices.rs`
//! and the others): a small configuration, random records, a model of
//! every log the store must agree with, concurrent bursts of appends, a
//! small file system that fills up, spares written ahead of an open; and,
//! in [`store`], helpers for segment files and their pages.

// Each test crate uses part of this module.
#![allow(dead_code)]

pub mod store;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use melddb_log::{Config, Store, StoreError};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Three zones under `dir`, 4 KiB pages and 64 KiB segments, so a few
/// hundred appends slide the windows many times. No spare segments: the
/// tests that want them ask for a count, and the others count files and
/// writes that a refill running beside them would change.
pub fn small_config(dir: &Path) -> Config {
    let zones: Vec<PathBuf> = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
    let mut c = Config::with_zones(zones);
    c.page_bytes = 4096;
    c.segment_bytes = 64 << 10;
    c.max_record_bytes = 256 << 10;
    c.prepared_segments = 0;
    c
}

/// Every log's first position and its records from there, as the store
/// must have them.
pub type Model = BTreeMap<String, (u64, Vec<Vec<u8>>)>;

/// A random record: one in ten spans several stripes (up to `max`
/// bytes), two in ten fill most of a stripe, the rest are small.
pub fn record(rng: &mut ChaCha8Rng, max: usize) -> Vec<u8> {
    let len = match rng.random_range(0..10) {
        0 => rng.random_range(8137..max), // multi-stripe
        1..=2 => rng.random_range(2000..8000),
        _ => rng.random_range(1..300),
    };
    (0..len).map(|_| rng.random()).collect()
}

/// The store agrees with the model: bounds, every record byte for byte,
/// `Trimmed` just below each log and `NotYetWritten` at its tail.
pub fn check(store: &Store, model: &Model) {
    check_at(store, model, "");
}

/// [`check`], with `what` (the step) in every message.
pub fn check_at(store: &Store, model: &Model, what: &str) {
    for (log, (first, recs)) in model {
        let (f, t) = store.bounds(log);
        assert_eq!(
            (f, t),
            (*first, *first + recs.len() as u64),
            "{what}: bounds of {log}"
        );
        for (i, r) in recs.iter().enumerate() {
            let pos = first + i as u64;
            let got = store
                .read(log, pos)
                .unwrap_or_else(|e| panic!("{what}: {log}@{pos}: {e}"));
            assert_eq!(&got[..], &r[..], "{what}: {log}@{pos}");
        }
        if *first > 0 {
            assert!(
                matches!(store.read(log, first - 1), Err(StoreError::Trimmed { .. })),
                "{what}: {log}@{} is trimmed",
                first - 1
            );
        }
        assert!(
            matches!(store.read(log, t), Err(StoreError::NotYetWritten { .. })),
            "{what}: {log}@{t} is not written yet"
        );
    }
}

/// Range reads agree with the model: each log read whole from its first
/// position by [`Store::read_range`] under several limits gives every
/// record once, in order, byte for byte; each range holds at least one
/// record, no more than its limits allow (a longer first record alone),
/// and stops only at a limit or the tail. At the tail a range is empty,
/// beyond it `NotYetWritten`, below the first position `Trimmed`.
pub fn check_ranges(store: &Store, model: &Model, what: &str) {
    for (log, (first, recs)) in model {
        let tail = *first + recs.len() as u64;
        for (max_records, max_bytes) in [(1, 1), (3, usize::MAX), (50, 9000), (4096, 1 << 20)] {
            let mut from = *first;
            while from < tail {
                let got = store
                    .read_range(log, from, max_records, max_bytes)
                    .unwrap_or_else(|e| panic!("{what}: {log} from {from}: {e}"));
                let at = (from - first) as usize;
                let n = got.len();
                assert!(
                    (1..=max_records).contains(&n),
                    "{what}: {log} from {from}: {n} records, limit {max_records}"
                );
                let bytes: usize = got.iter().map(|r| r.len()).sum();
                assert!(
                    n == 1 || bytes <= max_bytes,
                    "{what}: {log} from {from}: {bytes} bytes, limit {max_bytes}"
                );
                for (i, r) in got.iter().enumerate() {
                    assert_eq!(
                        &r[..],
                        &recs[at + i][..],
                        "{what}: {log}@{}",
                        from + i as u64
                    );
                }
                if let Some(next) = recs.get(at + n) {
                    assert!(
                        n == max_records || bytes + next.len() > max_bytes,
                        "{what}: {log} from {from}: stopped after {n} records ({bytes} bytes) with room for the next"
                    );
                }
                from += n as u64;
            }
        }
        let at_tail = store.read_range(log, tail, 10, 1 << 20);
        assert!(
            matches!(&at_tail, Ok(v) if v.is_empty()),
            "{what}: {log} at its tail: {at_tail:?}"
        );
        assert!(
            matches!(
                store.read_range(log, tail + 1, 10, 1 << 20),
                Err(StoreError::NotYetWritten { pos, tail: t, .. }) if pos == tail + 1 && t == tail
            ),
            "{what}: {log} beyond its tail"
        );
        if *first > 0 {
            assert!(
                matches!(
                    store.read_range(log, first - 1, 10, 1 << 20),
                    Err(StoreError::Trimmed { pos, first: f, .. }) if pos == first - 1 && f == *first
                ),
                "{what}: {log} below its first position"
            );
        }
    }
}

/// Appends `n` random records to three logs from four threads at once, so
/// the writer forms real batches, and adds them to the model (checking
/// each log's positions are dense).
pub fn append_burst(store: &Arc<Store>, model: &mut Model, rng: &mut ChaCha8Rng, n: usize) {
    let logs = ["alpha", "beta", "gamma"];
    let mut work: Vec<(String, Vec<u8>)> = Vec::new();
    for _ in 0..n {
        let log = logs[rng.random_range(0..logs.len())].to_string();
        work.push((log, record(rng, 40_000)));
    }
    let results: Vec<(String, Vec<u8>, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = work
            .chunks(n.div_ceil(4).max(1))
            .map(|chunk| {
                let store = store.clone();
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|(l, b)| {
                            (
                                l.clone(),
                                b.clone(),
                                store.append_blocking(l, 0, 0, b.clone()).unwrap(),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut by_log: BTreeMap<String, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
    for (l, b, p) in results {
        by_log.entry(l).or_default().push((p, b));
    }
    for (l, mut v) in by_log {
        v.sort_by_key(|x| x.0);
        let e = model.entry(l.clone()).or_insert((0, Vec::new()));
        for (p, b) in v {
            assert_eq!(p, e.0 + e.1.len() as u64, "positions of {l} are dense");
            e.1.push(b);
        }
    }
}

/// Whether `dir`'s file system is one where `flush_once_per_device`
/// applies to files on it (ext4, XFS).
pub fn write_back_supported(dir: &Path) -> bool {
    let st = rustix::fs::statfs(dir).unwrap();
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as i64;
    [0xEF53, 0x5846_5342].contains(&magic)
}

pub use melddb_testkit::skip;

/// Runs a command the test needs root for (`mount`, `losetup`) and gives
/// its output; `None`, with the reason printed, where this machine
/// refuses it (not root, no such tool or driver), so the test skips.
pub fn privileged(cmd: &mut std::process::Command) -> Option<std::process::Output> {
    let out = cmd.output().ok()?;
    if !out.status.success() {
        skip(&format!(
            "{} was refused: {}",
            cmd.get_program().to_string_lossy(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
        return None;
    }
    Some(out)
}

/// A 4 MiB tmpfs mounted on a temporary directory for one test,
/// unmounted when dropped (also when the test fails), before the
/// directory goes.
pub struct SmallFs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.path)
            .status();
    }
}

impl SmallFs {
    /// The mount, or `None` where this machine does not allow it (not
    /// root, no `mount`).
    pub fn mount() -> Option<SmallFs> {
        let dir = tempfile::tempdir().unwrap();
        privileged(
            std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
                .arg(dir.path()),
        )?;
        Some(SmallFs {
            path: dir.path().to_path_buf(),
            _dir: dir,
        })
    }

    /// Three zones on it, segments of 256 KiB.
    pub fn config(&self) -> Config {
        let mut cfg = small_config(&self.path);
        cfg.segment_bytes = 256 << 10;
        cfg
    }
}

/// Another program takes every byte left on the file system under `dir`.
pub fn take_every_byte(dir: &Path) -> PathBuf {
    use std::io::Write;
    let filler = dir.join("filler");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&filler)
        .unwrap();
    for size in [64 << 10, 4 << 10, 1] {
        let chunk = vec![1u8; size];
        while f.write_all(&chunk).is_ok() {}
    }
    filler
}

/// Free bytes for this user on the file system of `dir`.
pub fn free_bytes(dir: &Path) -> u64 {
    let st = rustix::fs::statvfs(dir).unwrap();
    st.f_bavail * st.f_frsize
}

/// Writes `cfg.prepared_segments` spare files per zone (segment-sized,
/// zeros) before a store's first open, as the refill would have written
/// them: the open adopts spares on disk, so the first window's segments
/// are made from them. The refill itself writes only after the open.
pub fn spares_on_disk(cfg: &Config) {
    for z in &cfg.zones {
        std::fs::create_dir_all(z).unwrap();
        for n in 0..u64::from(cfg.prepared_segments) {
            let spare = z.join(format!("spare-{n:016}.dat"));
            std::fs::write(spare, vec![0u8; cfg.segment_bytes as usize]).unwrap();
        }
    }
}

/// Waits (up to 30 s) until the store's stats satisfy `ready`.
pub fn wait_for_stats(store: &Store, what: &str, ready: impl Fn(&melddb_log::Stats) -> bool) {
    let t = std::time::Instant::now();
    while !ready(&store.stats()) {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "{what}: not after 30 s: {:?}",
            store.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

pub mod net;
