//! The store every `recover` input starts from: a small configuration
//! (three zones, 4 KiB pages, 64 KiB segments) holding two logs with
//! records of every shape (packed small ones, pages' worth, records that
//! span several stripes), one of them trimmed, written once per process
//! and kept as file contents.

use std::path::{Path, PathBuf};

use melddb_log::{page, Config, Store};

/// The base store's files, relative to its directory, and where the pages
/// of each one start and end.
pub struct Base {
    /// `(relative path, contents)`, sorted by path.
    pub files: Vec<(PathBuf, Vec<u8>)>,
    /// Per file, `(start, len)` of every page, in file order.
    pub pages: Vec<Vec<(usize, usize)>>,
    /// The logs and their bounds when the base was closed.
    pub logs: Vec<(&'static str, (u64, u64))>,
    /// Every record appended, by log and position (trimmed ones too).
    pub records: std::collections::BTreeMap<(&'static str, u64), Vec<u8>>,
}

/// The configuration used for the base and for every fuzzed open.
pub fn config(dir: &Path) -> Config {
    let zones: Vec<PathBuf> = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
    let mut c = Config::with_zones(zones);
    c.page_bytes = 4096;
    c.segment_bytes = 64 << 10;
    c.max_record_bytes = 256 << 10;
    // Durability is not what is fuzzed, and each input opens a store.
    c.fsync = false;
    c.tuning.disable_transparent_huge_pages = false;
    // The default window (1M request ids) is allocated at every open,
    // which made each input cost half a second under the sanitizer.
    c.dedup_window = 1024;
    c.read_cache_stripes = 8;
    c
}

/// A record of `len` bytes that differs per position.
pub fn record(pos: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(pos * 7) as u8)
        .collect()
}

fn files_under(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read base dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files_under(root, &p, out);
        } else {
            let rel = p.strip_prefix(root).expect("under root").to_path_buf();
            out.push((rel, std::fs::read(&p).expect("read base file")));
        }
    }
}

fn page_map(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while let Ok(h) = page::header(&bytes[off..]) {
        let len = h.page_len() as usize;
        if off + len > bytes.len() {
            break;
        }
        out.push((off, len));
        off += len;
    }
    out
}

/// Writes the base store in `dir` (which must be empty) and reads it back.
pub fn build(dir: &Path) -> Base {
    let store = Store::open(config(dir)).expect("base store opens");
    let sizes = [1usize, 40, 300, 3000, 9000, 120, 7, 20_000, 64, 2];
    let mut records = std::collections::BTreeMap::new();
    for i in 0..60u64 {
        let log = if i % 3 == 0 { "b" } else { "a" };
        let len = sizes[(i as usize) % sizes.len()];
        // Half the appends carry request ids, so recovery rebuilds the
        // idempotency table too.
        let (client, request) = if i % 2 == 0 { (9, i + 1) } else { (0, 0) };
        let pos = store
            .append_blocking(log, client, request, record(i, len))
            .expect("base append");
        records.insert((log, pos), record(i, len));
    }
    store.trim_blocking("a", 5).expect("base trim");
    let logs = vec![("a", store.bounds("a")), ("b", store.bounds("b"))];
    drop(store);
    let mut files = Vec::new();
    files_under(dir, dir, &mut files);
    let pages = files.iter().map(|(_, b)| page_map(b)).collect();
    Base {
        files,
        pages,
        logs,
        records,
    }
}
