//! What the storage tests (`tests/store_*.rs`) share: reading segment
//! files and their pages, damaging them, and waiting for the store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use melddb_log::page::{self, class};
use melddb_log::{Config, Faults, SegmentInfo, Store};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{append_burst, check, small_config, Model, SmallFs};

/// The pages of a segment file's bytes in order, offset and header, up to
/// the first place that holds no page header (a segment made from a
/// spare holds zeros after its data).
pub fn pages(bytes: &[u8]) -> Vec<(usize, page::Header)> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while let Some(Ok(h)) = bytes.get(off..).map(page::header) {
        out.push((off, h));
        off += h.page_len() as usize;
    }
    out
}

/// Where the pages of a segment file's bytes end.
pub fn data_end(bytes: &[u8]) -> usize {
    pages(bytes)
        .last()
        .map_or(0, |(off, h)| off + h.page_len() as usize)
}

/// The stripe pages (root and fragment shards) among a segment file's
/// bytes.
pub fn stripe_pages(bytes: &[u8]) -> Vec<(usize, page::Header)> {
    pages(bytes)
        .into_iter()
        .filter(|(_, h)| matches!(h.kind, page::Kind::Ordered | page::Kind::Unordered))
        .collect()
}

/// Whether the windows have slid: some segment is sealed.
pub fn windows_slid(store: &Store) -> bool {
    store
        .segments_blocking()
        .iter()
        .any(|s| s.class == class::SEALED)
}

/// The store's segments, after asserting that classes never increase
/// with the segment id (sealed, end-write, ordered, unordered, empty).
pub fn segments_with_falling_classes(store: &Store, what: &str) -> Vec<SegmentInfo> {
    let segs = store.segments_blocking();
    let classes: Vec<(u64, u8)> = segs.iter().map(|s| (s.id, s.class)).collect();
    assert!(
        classes.windows(2).all(|w| w[0].1 >= w[1].1),
        "{what}: classes {classes:?}"
    );
    segs
}

/// Where a segment's pages end.
pub fn data_len(f: &Path) -> u64 {
    data_end(&std::fs::read(f).unwrap()) as u64
}

pub fn seg_files(dir: &Path) -> Vec<PathBuf> {
    let zones: Vec<PathBuf> = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
    seg_files_in(&zones)
}

/// The segment files of `zones`, by file name.
pub fn seg_files_in(zones: &[PathBuf]) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for zone in zones {
        for e in std::fs::read_dir(zone).unwrap() {
            let p = e.unwrap().path();
            let seg = p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("seg-") && n.ends_with(".dat"));
            if seg {
                v.push(p);
            }
        }
    }
    v.sort_by_key(|p| p.file_name().unwrap().to_owned());
    v
}

/// Every stripe page of the original is at the same offset, byte for byte,
/// in the rebuilt file. (Class markers cannot be told apart from unused
/// space once a file is gone: they become pads, and the class is declared
/// again at the end.)
pub fn assert_same_stripe_pages(original: &[u8], rebuilt: &[u8], f: &Path) {
    let mut stripe_pages = 0;
    for (off, h) in pages(original) {
        let end = off + h.page_len() as usize;
        if matches!(h.kind, page::Kind::Ordered | page::Kind::Unordered) {
            assert!(
                rebuilt.get(off..end) == Some(&original[off..end]),
                "{} page at {off}",
                f.display()
            );
            stripe_pages += 1;
        }
    }
    assert!(stripe_pages > 0, "{} had stripe pages", f.display());
    assert!(
        rebuilt.len() >= data_end(original),
        "the rebuilt file holds all the data"
    );
}

/// Damages every segment of one zone at a time (a stripe has one page
/// per zone and an end-write's copies are in different zones, so one
/// scrub repairs them all) and requires each repair to be the original
/// byte for byte, zeros after its end; how many segments were checked.
pub fn damage_every_zone_and_check_repairs(dir: &Path, store: &Store) -> usize {
    let mut checked = 0;
    for zone in 0..3 {
        let mut damaged = Vec::new();
        for f in seg_files(dir) {
            if !f
                .parent()
                .is_some_and(|d| d.ends_with(format!("zone{zone}")))
            {
                continue;
            }
            let before = std::fs::read(&f).unwrap();
            let end = data_end(&before);
            if end <= 100 {
                continue; // a window segment with nothing but its class yet
            }
            let mut bytes = before.clone();
            for i in (100..end).step_by(997) {
                bytes[i] ^= 0xff;
            }
            std::fs::write(&f, &bytes).unwrap();
            damaged.push((f, before));
        }
        let report = store.scrub_blocking();
        assert_eq!(
            report.repaired.len(),
            damaged.len(),
            "zone {zone}: {report:?}; damaged {:?}; refusing {:?}; segments {:?}",
            damaged
                .iter()
                .map(|d| d.0.file_name().unwrap().to_owned())
                .collect::<Vec<_>>(),
            store.appends_refused(),
            store.segments_blocking()
        );
        assert!(
            report.unrecoverable.is_empty() && report.failed.is_empty(),
            "{report:?}"
        );
        for (f, before) in damaged {
            let after = std::fs::read(&f).unwrap();
            assert!(after.len() <= before.len(), "{}", f.display());
            let differ = after.iter().zip(&before).filter(|(a, b)| a != b).count();
            assert!(
                differ == 0,
                "{}: the repaired file equals the original ({differ} bytes differ, first at {:?})",
                f.display(),
                after.iter().zip(&before).position(|(a, b)| a != b)
            );
            assert!(before[after.len()..].iter().all(|&b| b == 0));
            checked += 1;
        }
    }
    checked
}

/// A small store with injectable faults; with `direct`, data writes of a
/// whole block or more are held back for the round and written directly.
pub fn store_with_faults(direct: bool) -> (tempfile::TempDir, Config, Arc<Faults>, Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.tuning.direct_writes = direct;
    cfg.tuning.direct_write_min_bytes = 4096;
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
    (dir, cfg, faults, store)
}

/// A store in `dir` with 20 single appends of 100 bytes to log "b", each
/// its own batch.
pub fn twenty_appends(dir: &Path) -> (Config, Store) {
    let mut cfg = small_config(dir);
    cfg.segment_bytes = 1 << 20;
    let store = Store::open(cfg.clone()).unwrap();
    for i in 0..20u64 {
        store
            .append_blocking("b", 0, 0, vec![i as u8; 100])
            .unwrap();
    }
    (cfg, store)
}

/// Where each segment's pages end.
pub fn data_lens(dir: &Path) -> Vec<u64> {
    seg_files(dir).iter().map(|f| data_len(f)).collect()
}

/// After an open that dropped what followed [`twenty_appends`]: those
/// twenty read back, the next append takes position 20, and it is still
/// there after another open (the dropped stripe numbers stay discarded,
/// so that open does not take them for a hole and drop it).
pub fn twenty_kept_and_the_next_append_stays(cfg: &Config, store: Store) {
    for i in 0..20u64 {
        assert_eq!(&store.read("b", i).unwrap()[..], &vec![i as u8; 100][..]);
    }
    assert_eq!(
        store.append_blocking("b", 0, 0, b"after".to_vec()).unwrap(),
        20
    );
    drop(store);
    let store = Store::open(cfg.clone()).unwrap();
    assert_eq!(store.bounds("b"), (0, 21));
    assert_eq!(&store.read("b", 20).unwrap()[..], b"after");
}

/// Walks the pages of the segment files in order and lets `edit` change
/// the first one it accepts (returns true for), then seals that page again
/// so it passes its own checksum whatever it now says.
pub fn edit_first_page(dir: &Path, what: &str, edit: impl FnMut(&page::Header, &mut [u8]) -> bool) {
    edit_first_page_in(&seg_files(dir), what, true, edit);
}

/// [`edit_first_page`] over `files`; `reseal` false leaves the page
/// failing its checksum (unless the edit changed nothing). Returns the
/// file edited.
pub fn edit_first_page_in(
    files: &[PathBuf],
    what: &str,
    reseal: bool,
    mut edit: impl FnMut(&page::Header, &mut [u8]) -> bool,
) -> PathBuf {
    for f in files {
        let mut bytes = std::fs::read(f).unwrap();
        for (off, h) in pages(&bytes) {
            let page_bytes = &mut bytes[off..off + h.page_len() as usize];
            if edit(&h, page_bytes) {
                if reseal {
                    page::seal(page_bytes, 0);
                }
                std::fs::write(f, &bytes).unwrap();
                return f.clone();
            }
        }
    }
    panic!("no {what} page found");
}

/// The file of segment `seg` of a [`small_config`] store.
pub fn seg_path(dir: &Path, seg: u64) -> PathBuf {
    dir.join(format!("zone{}", seg % 3))
        .join(format!("seg-{seg:016}.dat"))
}

/// The segment file holding page `shard` of stripe `seq`.
pub fn file_of_page(dir: &Path, seq: u64, shard: u8) -> PathBuf {
    let mut found = None;
    for f in seg_files(dir) {
        for (_, h) in pages(&std::fs::read(&f).unwrap()) {
            let data = matches!(h.kind, page::Kind::Ordered | page::Kind::Unordered);
            if data && h.stripe == seq && h.shard == shard {
                assert!(found.is_none(), "one page {shard} of stripe {seq}");
                found = Some(f.clone());
            }
        }
    }
    found.unwrap_or_else(|| panic!("no page {shard} of stripe {seq}"))
}

/// Rewrites the first end-write record that `edit` applies to (returns
/// true for): one copy that looks intact but says something else.
pub fn rewrite_first_end_write(
    dir: &Path,
    edit: impl Fn(&mut melddb_log::stripe::EndWrite) -> bool,
) {
    use melddb_log::stripe::{decode_end_write, encode_end_write};
    edit_first_page(dir, "end-write", |h, bytes| {
        if h.kind != page::Kind::EndWrite {
            return false;
        }
        let mut ew = decode_end_write(&bytes[page::HEADER..]).unwrap();
        if !edit(&mut ew) {
            return false;
        }
        let body = encode_end_write(&ew);
        assert_eq!(
            body.len(),
            bytes.len() - page::HEADER,
            "fixed-width fields only"
        );
        bytes[page::HEADER..].copy_from_slice(&body);
        true
    });
}

/// Changes a byte of record bytes in the second half of the body of the
/// first page of `kind` (shard `shard`, at least 256 bytes; with `last`,
/// of the highest stripe that has such a page) and seals the page again,
/// so it passes its own checksum but holds other bytes than were written.
/// Returns the page's stripe.
///
/// Record bytes, not a root stripe's entry headers: a data page's byte
/// counts as a record's when the 16 bytes around it occur in one of
/// `model`'s (random) records. Until 2026-11-27 this took the body's
/// middle byte, which concurrent appends sometimes packed into an entry
/// header field that no read uses and no record checksum covers (a
/// record's position or request id): the scrub, trying the parity page
/// first, found its rebuild consistent with every record and blamed it
/// (a run under load repaired the parity page's segment instead of the
/// liar's). Such a lie changes nothing any read returns.
pub fn falsify_page(dir: &Path, kind: page::Kind, shard: u8, last: bool, model: &Model) -> u64 {
    let fits = |h: &page::Header| h.kind == kind && h.shard == shard && h.body_len >= 256;
    let from = if last {
        seg_files(dir)
            .iter()
            .flat_map(|f| pages(&std::fs::read(f).unwrap()))
            .filter(|(_, h)| fits(h))
            .map(|(_, h)| h.stripe)
            .max()
            .unwrap_or(0)
    } else {
        0
    };
    let windows: std::collections::HashSet<&[u8]> = model
        .values()
        .flat_map(|(_, recs)| recs.iter())
        .flat_map(|r| r.windows(16))
        .collect();
    let mut seq = 0;
    edit_first_page(dir, "data", |h, bytes| {
        if !fits(h) || h.stripe < from {
            return false;
        }
        let (start, end) = (page::HEADER, page::HEADER + h.body_len as usize);
        let parity = h.shard >= h.k;
        let Some(at) = (start + h.body_len as usize / 2..end - 8)
            .find(|&i| parity || windows.contains(&bytes[i - 8..i + 8]))
        else {
            return false;
        };
        bytes[at] ^= 0x5a;
        seq = h.stripe;
        true
    });
    seq
}

/// A [`small_config`] store in `dir`, changed by `edit`, with `n` records
/// appended (seed `seed`) and closed: its configuration, what it must
/// hold, and the generator to go on with.
pub fn appended_and_closed(
    dir: &Path,
    edit: impl FnOnce(&mut Config),
    seed: u64,
    n: usize,
) -> (Config, Model, ChaCha8Rng) {
    let mut cfg = small_config(dir);
    edit(&mut cfg);
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    let mut model = Model::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    append_burst(&store, &mut model, &mut rng, n);
    drop(store);
    (cfg, model, rng)
}

/// After a recovery: the store agrees with the model, takes `n` more
/// records, agrees again, and agrees once more after a reopen with `cfg`.
pub fn appends_go_on_and_survive_a_reopen(
    store: Arc<Store>,
    cfg: &Config,
    model: &mut Model,
    rng: &mut ChaCha8Rng,
    n: usize,
) {
    check(&store, model);
    append_burst(&store, model, rng, n);
    check(&store, model);
    drop(store);
    check(&Store::open(cfg.clone()).unwrap(), model);
}

/// Appends `n` records (seed `seed`, [`small_config`] changed by `edit`),
/// closes, lets `damage` change segment 3 (an ordered-window segment:
/// marker, then pages; it gets the file's bytes and the end of its data)
/// and reopens.
/// The reopened store, with what it must hold and the means to go on.
pub fn reopened_after_damage_to_segment_3(
    edit: impl FnOnce(&mut Config),
    seed: u64,
    n: usize,
    damage: impl FnOnce(&mut Vec<u8>, usize),
) -> (tempfile::TempDir, Config, Arc<Store>, Model, ChaCha8Rng) {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, model, rng) = appended_and_closed(dir.path(), edit, seed, n);
    let files = seg_files_in(&cfg.zones);
    let victim = &files[3];
    let mut bytes = std::fs::read(victim).unwrap();
    damage(&mut bytes, data_len(victim) as usize);
    std::fs::write(victim, &bytes).unwrap();
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    (dir, cfg, store, model, rng)
}

/// [`reopened_after_damage_to_segment_3`], then checks that segment 3 was
/// rebuilt, that every record reads back, and that appends and another
/// reopen after that are sound.
pub fn damaged_segment_3_is_rebuilt(
    seed: u64,
    n: usize,
    segment_bytes: u64,
    damage: impl FnOnce(&mut Vec<u8>, usize),
) {
    let (_dir, cfg, store, mut model, mut rng) =
        reopened_after_damage_to_segment_3(|c| c.segment_bytes = segment_bytes, seed, n, damage);
    assert!(
        store.recovery().repaired_segments.contains(&3),
        "{:?}",
        store.recovery()
    );
    check(&store, &model);
    append_burst(&store, &mut model, &mut rng, 60);
    check(&store, &model);
    assert_eq!(store.scrub_blocking().bad_pages, 0);
    drop(store);
    let store = Store::open(cfg).unwrap();
    check(&store, &model);
    assert_eq!(store.scrub_blocking().bad_pages, 0);
}

/// Zeroes what the batch between the lengths `from` and `to` wrote to
/// segments 3 and 4 (two of the three pages of its stripe), as if those
/// writes never reached the disk. Inside the zero-filled space, a write
/// that never happened reads back as zeros.
pub fn lose_pages(dir: &Path, from: &[u64], to: &[u64]) {
    use std::os::unix::fs::FileExt;
    let files = seg_files(dir);
    for i in [3usize, 4] {
        assert!(to[i] > from[i], "the batch wrote to segment {i}");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&files[i])
            .unwrap();
        f.write_all_at(&vec![0u8; (to[i] - from[i]) as usize], from[i])
            .unwrap();
    }
}

pub fn spare_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut v = Vec::new();
    for z in 0..3 {
        for e in std::fs::read_dir(dir.join(format!("zone{z}"))).unwrap() {
            let p = e.unwrap().path();
            if p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("spare-")
            {
                let len = std::fs::metadata(&p).unwrap().len();
                v.push((p, len));
            }
        }
    }
    v.sort();
    v
}

pub fn wait_for_spares(store: &Store, want: u64) {
    let t = std::time::Instant::now();
    while store.stats().spares_ready < want {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "the refill did not finish: {:?}",
            store.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// How far past an open data segment's data recovery looks for the rest
/// of a page whose header was lost: two pages with their headers, and a
/// read window (`near` in `recovery.rs`).
pub fn scan_reach() -> usize {
    2 * (small_config(Path::new("")).page_bytes as usize + 28) + (64 << 10)
}

/// Puts one non-zero byte at `at` of a segment's bytes, growing the file
/// to hold it.
pub fn stray_byte_at(bytes: &mut Vec<u8>, at: usize) {
    bytes.resize(bytes.len().max(at + 1), 0);
    bytes[at] = 0x5a;
}

/// No write of a failed batch landed after all: every segment file's
/// pages end where the writer's data does.
pub fn pages_end_where_the_writer_says(store: &Store, dir: &Path) {
    for s in store.segments_blocking() {
        let bytes = std::fs::read(seg_path(dir, s.id)).unwrap();
        assert_eq!(data_end(&bytes) as u64, s.len, "segment {}", s.id);
    }
}

/// Whether the file system under `dir` takes `O_DIRECT` (tmpfs does not;
/// the store then writes buffered, and the direct path is not tested).
pub fn o_direct_works(dir: &Path) -> bool {
    use rustix::fs::{Mode, OFlags};
    let probe = dir.join("o-direct-probe");
    let ok = rustix::fs::open(
        &probe,
        OFlags::WRONLY | OFlags::CREATE | OFlags::DIRECT,
        Mode::from_raw_mode(0o600),
    )
    .is_ok();
    let _ = std::fs::remove_file(&probe);
    if !ok {
        eprintln!(
            "no O_DIRECT under {}: direct writes not tested",
            dir.display()
        );
    }
    ok
}

/// The segment files under the store's zones, by zone and name, with
/// their bytes.
pub fn all_segment_bytes(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    seg_files(dir)
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p.strip_prefix(dir).unwrap().to_path_buf(), bytes)
        })
        .collect()
}

pub fn sealed_count(store: &Store) -> usize {
    store
        .segments_blocking()
        .iter()
        .filter(|s| s.class == class::SEALED)
        .count()
}

pub fn append_one(store: &Store, model: &mut Model, bytes: Vec<u8>) {
    let pos = store.append_blocking("log", 0, 0, bytes.clone()).unwrap();
    let e = model.entry("log".into()).or_insert((pos, Vec::new()));
    assert_eq!(pos, e.0 + e.1.len() as u64, "positions are dense");
    e.1.push(bytes);
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// The class markers in `after`'s segment files that `before`'s do not
/// hold: file (relative to the store), offset and page bytes.
pub fn new_markers(before: &Path, after: &Path) -> Vec<(PathBuf, u64, Vec<u8>)> {
    let mut out = Vec::new();
    for f in seg_files(after) {
        let rel = f.strip_prefix(after).unwrap().to_path_buf();
        let now = std::fs::read(&f).unwrap();
        let was = std::fs::read(before.join(&rel)).unwrap_or_default();
        for (off, h) in pages(&now) {
            let page = &now[off..off + h.page_len() as usize];
            if h.kind == page::Kind::Class && was.get(off..off + page.len()) != Some(page) {
                out.push((rel.clone(), off as u64, page.to_vec()));
            }
        }
    }
    out
}

/// The record the small file system tests append with request id `i`.
pub fn rec(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8; 6000]
}

/// A store on a fresh [`SmallFs`] with a fault injector, holding the
/// records of request ids 0..200 at positions 0..200 of `log`; `None`
/// where the machine cannot mount one.
pub fn small_fs_store(log: &str) -> Option<(SmallFs, Config, Arc<Faults>, Store)> {
    let fs = SmallFs::mount()?;
    let cfg = fs.config();
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
    for i in 0..200u64 {
        assert_eq!(store.append_blocking(log, 4, i, rec(i)).unwrap(), i);
    }
    Some((fs, cfg, faults, store))
}
