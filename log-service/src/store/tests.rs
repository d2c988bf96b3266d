use super::*;
use std::path::{Path, PathBuf};

/// Three zones under `dir`, 4 KiB pages, segments of `segment_bytes`.
fn small_config(dir: &Path, segment_bytes: u64) -> Config {
    let zones: Vec<PathBuf> = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
    let mut cfg = Config::with_zones(zones);
    cfg.page_bytes = 4096;
    cfg.segment_bytes = segment_bytes;
    cfg.max_record_bytes = 256 << 10;
    cfg
}

/// A panic while a lock is held (a bug elsewhere) poisons it; readers
/// go on with the data as it was rather than panicking in their turn
/// on every request, as the writer already does.
#[test]
fn readers_carry_on_past_poisoned_locks() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path(), 64 << 10);
    let store = Arc::new(Store::open(cfg).unwrap());
    assert_eq!(store.append_blocking("a", 0, 0, b"x".to_vec()).unwrap(), 0);
    let s = store.clone();
    let poisoned = std::thread::spawn(move || {
        // Only a writer's panic poisons an RwLock.
        let _index = s.shared.index.write().unwrap();
        let _files = s.shared.files.write().unwrap();
        let _cache = s.shared.cache.lock().unwrap();
        let _subs = s.shared.subs.lock().unwrap();
        panic!("poisoning the store's locks on purpose");
    })
    .join();
    assert!(poisoned.is_err());
    assert!(store.shared.index.is_poisoned() && store.shared.files.is_poisoned());
    assert!(store.shared.cache.is_poisoned() && store.shared.subs.is_poisoned());
    assert_eq!(store.bounds("a"), (0, 1));
    assert_eq!(&store.read("a", 0).unwrap()[..], b"x");
    assert_eq!(store.stats().segments, 9);
    assert_eq!(store.append_blocking("a", 0, 0, b"y".to_vec()).unwrap(), 1);
    assert_eq!(&store.read("a", 1).unwrap()[..], b"y");
}

/// Every buffered write of pages and end-writes into segments made
/// from spares ends on a file block boundary (padded with the zeros
/// already there), so none makes the file system read a block first
/// (`segment::Faults::write_padded_at`); and the records read back.
#[test]
fn writes_into_spare_segments_end_on_block_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path(), 1 << 20);
    cfg.prepared_segments = 4;
    // Spares on disk before the open, which adopts them, so the first
    // window's segments are made from them (the refill would write
    // them only after the open).
    for z in &cfg.zones {
        std::fs::create_dir_all(z).unwrap();
        for n in 0..4u64 {
            let spare = z.join(format!("spare-{n:016}.dat"));
            std::fs::write(spare, vec![0u8; cfg.segment_bytes as usize]).unwrap();
        }
    }
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(cfg, faults.clone()).unwrap();
    // Odd sizes, so that almost no write ends on a boundary by itself.
    let records: Vec<Vec<u8>> = (0..40u8)
        .map(|i| vec![i; 1 + 97 * usize::from(i)])
        .collect();
    for (pos, r) in records.iter().enumerate() {
        assert_eq!(
            store.append_blocking("a", 0, 0, r.clone()).unwrap(),
            pos as u64
        );
    }
    let writes = crate::locks::lock(&faults.writes).clone();
    // Pages and three end-write copies for every append.
    assert!(writes.len() >= 4 * records.len(), "{} writes", writes.len());
    for &(ino, start, end) in &writes {
        assert_eq!(
            end % crate::segment::PAD_MAX as u64,
            0,
            "inode {ino}: a write of {start}..{end} ends inside a block"
        );
    }
    for (pos, r) in records.iter().enumerate() {
        assert_eq!(&store.read("a", pos as u64).unwrap()[..], &r[..]);
    }
}

/// With pages written directly in the round, a batch's end-writes are
/// held back too and start only once every page file of the round is
/// written and synced: an end-write in the page cache before its pages
/// were even issued is what a kill -9 could keep, and recovery would
/// take the pages for damage. Page syncs are slowed, so an end-write
/// started alongside the pages would show first in the trace.
#[cfg(target_os = "linux")]
#[test]
fn end_writes_behind_direct_pages_start_after_the_pages_are_synced() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path(), 1 << 20);
    cfg.tuning.direct_writes = true;
    cfg.tuning.direct_write_min_bytes = 4096;
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
    // Which segment files hold end-writes and which pages, by inode.
    let class_of: BTreeMap<u64, u8> = store
        .segments_blocking()
        .iter()
        .map(|s| (s.id, s.class))
        .collect();
    let mut kind_of_inode = BTreeMap::new();
    for (&id, &class) in &class_of {
        let zone = &cfg.zones[crate::segment::zone(&cfg.zones, id)];
        let Ok(meta) = std::fs::metadata(zone.join(crate::segment::file_name(id))) else {
            continue;
        };
        kind_of_inode.insert(meta.ino(), class == crate::page::class::END_WRITE);
    }
    faults.slow_syncs(std::time::Duration::from_millis(30));
    crate::locks::lock(&faults.trace).clear();
    let record = vec![7u8; 40 << 10];
    assert_eq!(store.append_blocking("a", 0, 0, record.clone()).unwrap(), 0);
    faults.slow_syncs(std::time::Duration::ZERO);
    if store.stats().direct_write_bytes == 0 {
        eprintln!("no O_DIRECT under {}: not tested", dir.path().display());
        return;
    }
    let trace = crate::locks::lock(&faults.trace).clone();
    let is_sync = |what: &str| what == "fsync" || what == "write-back";
    // Each page file's own sync (the first after its write).
    let page_syncs: Vec<usize> = kind_of_inode
        .iter()
        .filter(|(_, &ew)| !ew)
        .filter_map(|(ino, _)| {
            let wrote = trace
                .iter()
                .position(|t| t.0 == "deferred-write" && t.1 == *ino)?;
            (wrote..trace.len()).find(|&i| is_sync(trace[i].0) && trace[i].1 == *ino)
        })
        .collect();
    let ew_writes: Vec<usize> = (0..trace.len())
        .filter(|&i| {
            trace[i].0 == "deferred-write" && kind_of_inode.get(&trace[i].1) == Some(&true)
        })
        .collect();
    assert_eq!(page_syncs.len(), 3, "three page files synced: {trace:?}");
    let ew_files: std::collections::BTreeSet<u64> = ew_writes.iter().map(|&i| trace[i].1).collect();
    assert_eq!(
        ew_files.len(),
        3,
        "three end-write copies held back: {trace:?}"
    );
    let last_page_sync = page_syncs.iter().max().copied().unwrap_or(0);
    assert!(
        ew_writes.iter().all(|&i| i > last_page_sync),
        "an end-write started before the pages were synced: {trace:?}"
    );
    assert_eq!(&store.read("a", 0).unwrap()[..], &record[..]);
}
