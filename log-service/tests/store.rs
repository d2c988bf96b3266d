//! The storage engine against a model: every acknowledged record reads
//! back byte for byte, across reopen, trim, torn tails, corrupt pages,
//! deleted segment files and injected write faults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use melddb_log::page::{self, class};
use melddb_log::store::check_log_name;
use melddb_log::{Config, Faults, SegmentInfo, Store, StoreError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::{
    append_burst, check, check_at, free_bytes, record, small_config, take_every_byte,
    write_back_supported, Model, SmallFs,
};

/// The pages of a segment file's bytes in order, offset and header, up to
/// the first place that holds no page header (a segment made from a
/// spare holds zeros after its data).
fn pages(bytes: &[u8]) -> Vec<(usize, page::Header)> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while let Some(Ok(h)) = bytes.get(off..).map(page::header) {
        out.push((off, h));
        off += h.page_len() as usize;
    }
    out
}

/// Where the pages of a segment file's bytes end.
fn data_end(bytes: &[u8]) -> usize {
    pages(bytes)
        .last()
        .map_or(0, |(off, h)| off + h.page_len() as usize)
}

/// The stripe pages (root and fragment shards) among a segment file's
/// bytes.
fn stripe_pages(bytes: &[u8]) -> Vec<(usize, page::Header)> {
    pages(bytes)
        .into_iter()
        .filter(|(_, h)| matches!(h.kind, page::Kind::Ordered | page::Kind::Unordered))
        .collect()
}

/// Whether the windows have slid: some segment is sealed.
fn windows_slid(store: &Store) -> bool {
    store
        .segments_blocking()
        .iter()
        .any(|s| s.class == class::SEALED)
}

/// The store's segments, after asserting that classes never increase
/// with the segment id (sealed, end-write, ordered, unordered, empty).
fn segments_with_falling_classes(store: &Store, what: &str) -> Vec<SegmentInfo> {
    let segs = store.segments_blocking();
    let classes: Vec<(u64, u8)> = segs.iter().map(|s| (s.id, s.class)).collect();
    assert!(
        classes.windows(2).all(|w| w[0].1 >= w[1].1),
        "{what}: classes {classes:?}"
    );
    segs
}

/// Where a segment's pages end.
fn data_len(f: &Path) -> u64 {
    data_end(&std::fs::read(f).unwrap()) as u64
}

fn seg_files(dir: &Path) -> Vec<PathBuf> {
    let zones: Vec<PathBuf> = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
    seg_files_in(&zones)
}

/// The segment files of `zones`, by file name.
fn seg_files_in(zones: &[PathBuf]) -> Vec<PathBuf> {
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

#[test]
fn random_history_matches_the_model_across_reopen_trim_and_damage() {
    for seed in 0..8u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path());
        // Both end-write orders: one fsync round (default) and the paper's two.
        cfg.tuning.strict_end_writes = seed % 2 == 1;
        // Data segments appended to empty files, and renamed from spares
        // written full of zeros.
        cfg.prepared_segments = if seed % 3 == 0 { 2 } else { 0 };
        // Six of eight seeds write every data write with a whole 4 KiB
        // block directly, in the round (held-back writes, and slides that
        // seal segments with writes still held back); two never do.
        cfg.tuning.direct_writes = seed % 3 != 2;
        cfg.tuning.direct_write_min_bytes = 4096;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut model = Model::new();
        let mut store = Arc::new(Store::open(cfg.clone()).unwrap());
        for step in 0..14 {
            let n = rng.random_range(1..60);
            append_burst(&store, &mut model, &mut rng, n);
            check(&store, &model);
            let action = rng.random_range(0..4);
            match action {
                0 => {
                    // Trim a random log part of the way.
                    let logs: Vec<String> = model.keys().cloned().collect();
                    let log = &logs[rng.random_range(0..logs.len())];
                    let (first, recs) = model.get_mut(log).unwrap();
                    let cut = rng.random_range(0..=recs.len());
                    store.trim_blocking(log, *first + cut as u64).unwrap();
                    recs.drain(..cut);
                    *first += cut as u64;
                }
                1 => {
                    // Reopen.
                    drop(store);
                    store = Arc::new(Store::open(cfg.clone()).unwrap());
                }
                2 => {
                    // Delete one segment file while closed; recovery rebuilds it.
                    drop(store);
                    let files = seg_files(dir.path());
                    let victim = &files[rng.random_range(0..files.len())];
                    std::fs::remove_file(victim).unwrap();
                    store = Arc::new(Store::open(cfg.clone()).unwrap());
                    assert!(
                        victim.exists() || store.recovery().repaired_segments.is_empty(),
                        "seed {seed} step {step}: a rebuilt segment must exist again: {} {:?}",
                        victim.display(),
                        store.recovery()
                    );
                }
                _ => {
                    // Flip a byte in the middle of a random segment; reads
                    // must still be right, and a scrub repairs it.
                    let files = seg_files(dir.path());
                    let victim = &files[rng.random_range(0..files.len())];
                    let mut bytes = std::fs::read(victim).unwrap();
                    if !bytes.is_empty() {
                        let i = rng.random_range(0..bytes.len());
                        bytes[i] ^= 0x5a;
                        std::fs::write(victim, &bytes).unwrap();
                    }
                    check(&store, &model);
                    let report = store.scrub_blocking();
                    assert!(
                        report.unrecoverable.is_empty() && report.failed.is_empty(),
                        "seed {seed} step {step}: {report:?}"
                    );
                    assert_eq!(
                        store.scrub_blocking().bad_pages,
                        0,
                        "scrub after repair is clean"
                    );
                }
            }
            check(&store, &model);
        }
        // Classes never increase with the segment id, and a stripe's
        // pages are in distinct zones.
        let segs = segments_with_falling_classes(&store, "random history");
        assert!(
            segs.iter().any(|s| s.class == class::SEALED),
            "the windows slid"
        );
        drop(store);
        let store = Store::open(cfg.clone()).unwrap();
        check(&store, &model);
    }
}

/// Every stripe page of the original is at the same offset, byte for byte,
/// in the rebuilt file. (Class markers cannot be told apart from unused
/// space once a file is gone: they become pads, and the class is declared
/// again at the end.)
fn assert_same_stripe_pages(original: &[u8], rebuilt: &[u8], f: &Path) {
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

#[test]
fn a_deleted_segment_is_rebuilt_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    // Segments of 1 MiB: no sliding, so every file is still live.
    let (cfg, model, _) = appended_and_closed(dir.path(), |c| c.segment_bytes = 1 << 20, 7, 80);
    let files = seg_files(dir.path());
    let originals: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    // Every data segment (the ordered and unordered windows) in turn.
    for (i, f) in files.iter().enumerate().skip(3) {
        std::fs::remove_file(f).unwrap();
        let store = Store::open(cfg.clone()).unwrap();
        assert_eq!(
            store.recovery().repaired_segments.len(),
            1,
            "{:?}",
            store.recovery()
        );
        check(&store, &model);
        drop(store);
        let rebuilt = std::fs::read(f).unwrap();
        assert_same_stripe_pages(&originals[i], &rebuilt, f);
    }
    // An end-write segment: the other two copies carry the records, and
    // the rebuilt file holds them again.
    std::fs::remove_file(&files[0]).unwrap();
    let store = Store::open(cfg.clone()).unwrap();
    check(&store, &model);
    let rebuilt = data_len(&files[0]);
    let original = data_end(&originals[0]) as u64;
    assert!(rebuilt >= original / 2, "{rebuilt} vs {original}");
    drop(store);
    std::fs::remove_file(&files[1]).unwrap();
    std::fs::remove_file(&files[2]).unwrap();
    // Two copies gone at once is within budget only because the first was
    // rebuilt: the records still come from it.
    let store = Store::open(cfg).unwrap();
    check(&store, &model);
}

#[test]
fn corruption_while_open_is_survived_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.segment_bytes = 1 << 20;
    cfg.read_cache_stripes = 0; // every read goes to the files
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    let mut model = Model::new();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    append_burst(&store, &mut model, &mut rng, 50);
    let files = seg_files(dir.path());
    let data = &files[3]; // first ordered segment
    let before = std::fs::read(data).unwrap();
    let mut bytes = before.clone();
    for i in (100..bytes.len()).step_by(997) {
        bytes[i] ^= 0xff;
    }
    std::fs::write(data, &bytes).unwrap();
    check(&store, &model);
    store.barrier_blocking(); // reads queued repairs; wait for them
    assert!(store.stats().pages_rebuilt > 0);
    assert!(store.stats().segments_repaired >= 1);
    // The repaired file is the original's data, byte for byte (without
    // any zeros the original had after it).
    let after = std::fs::read(data).unwrap();
    assert!(after.len() <= before.len());
    assert!(
        after[..] == before[..after.len()],
        "repaired file equals the original"
    );
    assert!(before[after.len()..].iter().all(|&b| b == 0));
}

#[test]
fn reads_of_intact_records_use_their_bytes_alone_and_others_the_whole_stripe() {
    // A record is read from its bytes in the data pages and checked
    // against its own checksum; only a record spanning stripes, or bytes
    // that fail that check, go through the whole stripe (page checksums,
    // parity). A broken fast path would still answer right, only slower:
    // the count is what tells.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.segment_bytes = 1 << 20;
    let store = Store::open(cfg.clone()).unwrap();
    let record = |i: u64| format!("record {i:03} ").repeat(9).into_bytes();
    // Batches of four, one stripe each: records in the middle of a
    // stripe's payload as well as at its end.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for b in 0..5u64 {
        let batch = (4 * b..4 * b + 4).map(|i| record(i).into()).collect();
        let at = rt.block_on(store.append_many("f", 0, 0, batch)).unwrap();
        assert_eq!(at, (4 * b..4 * b + 4).collect::<Vec<_>>());
    }
    let large = vec![0x3c; 20_000]; // more than a 2 × 4 KiB stripe
    assert_eq!(store.append_blocking("f", 0, 0, large.clone()).unwrap(), 20);
    for round in 0..2 {
        for i in 0..20 {
            assert_eq!(&store.read("f", i).unwrap()[..], &record(i)[..]);
        }
        assert_eq!(
            store.stats().reads_whole_stripe,
            round,
            "{:?}",
            store.stats()
        );
        assert_eq!(&store.read("f", 20).unwrap()[..], &large[..]);
        assert_eq!(store.stats().reads_whole_stripe, round + 1);
    }
    drop(store);
    // One byte of record 7 changed on disk (a stripe's payload is split
    // over its two data pages; one piece of the record is looked for): its read
    // takes the whole stripe, where parity stands in for the bad page.
    let needle = b"record 007 record 007 ";
    let (file, at) = seg_files(dir.path())
        .into_iter()
        .find_map(|f| {
            let bytes = std::fs::read(&f).unwrap();
            let at = bytes.windows(needle.len()).position(|w| w == &needle[..])?;
            Some((f, at))
        })
        .expect("a piece of record 7 in a data page");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[at + 3] ^= 0x5a;
    std::fs::write(&file, &bytes).unwrap();
    let store = Store::open(cfg).unwrap();
    for i in 0..20 {
        assert_eq!(&store.read("f", i).unwrap()[..], &record(i)[..]);
    }
    assert_eq!(store.stats().reads_whole_stripe, 1, "{:?}", store.stats());
}

/// Every record size around a stripe's capacity is appended, read back
/// and found again after a reopen: those that fit one root stripe with
/// its entry, those just too large for that (split into a fragment and
/// a root), for short and long log names and two stripe geometries, and
/// batches of two records that just fit one root stripe or just do not.
/// The stripes written are counted against the documented layout, and no
/// page may be larger than `page_bytes`. A few sizes just under the
/// capacity used to be refused as too large, and with them every append
/// of their batch.
#[test]
fn records_of_every_size_around_a_stripes_capacity_are_appended() {
    for data_shards in [2usize, 4] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path());
        // One zone per page of a stripe.
        cfg.zones = (0..=data_shards)
            .map(|z| dir.path().join(format!("zone{z}")))
            .collect();
        cfg.data_shards = data_shards;
        cfg.parity_shards = 1;
        cfg.segment_bytes = 1 << 20;
        let cap = data_shards * (cfg.page_bytes as usize - page::HEADER);
        let store = Store::open(cfg.clone()).unwrap();
        let logs = ["a".to_string(), "l".repeat(60)];
        let mut expect: Vec<(String, Vec<u8>)> = Vec::new();
        // The documented layout: a record whole in a root stripe when it
        // fits there with its entry and the entry count; else its last
        // bytes (at most a quarter stripe) in the root and the rest in
        // fragment stripes.
        let count = melddb_log::stripe::ROOT_COUNT_BYTES;
        let mut stripes = 0;
        for log in &logs {
            for len in cap - 140..cap + 20 {
                let entry = melddb_log::stripe::root_entry_overhead(log, 0);
                stripes += if count + entry + len <= cap {
                    1
                } else {
                    (len - len.min(cap / 4)).div_ceil(cap) + 1
                };
                let body: Vec<u8> = (0..len).map(|i| (i % 253) as u8 ^ len as u8).collect();
                let pos = store
                    .append_blocking(log, 0, 0, body.clone())
                    .unwrap_or_else(|e| {
                        panic!("{data_shards} data pages, log {log:?}, {len} bytes: {e}")
                    });
                let n = expect.iter().filter(|(l, _)| l == log).count() as u64;
                assert_eq!(pos, n, "{len} bytes");
                assert_eq!(store.read(log, pos).unwrap()[..], body[..], "{len} bytes");
                expect.push((log.clone(), body));
            }
        }
        // Batches of two records whose root entries together come to
        // just under, exactly at and just over a root stripe's room.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let log = "pairs".to_string();
        let entry = melddb_log::stripe::root_entry_overhead(&log, 0);
        for total in cap - 8..cap + 8 {
            let first = 100 + total % 7;
            let second = total - melddb_log::stripe::ROOT_COUNT_BYTES - 2 * entry - first;
            let bodies = vec![vec![0xa5u8; first], vec![total as u8; second]];
            stripes += if total <= cap { 1 } else { 2 };
            let positions = rt
                .block_on(
                    store.append_many(
                        &log,
                        0,
                        0,
                        bodies
                            .iter()
                            .map(|b| bytes::Bytes::from(b.clone()))
                            .collect(),
                    ),
                )
                .unwrap_or_else(|e| panic!("a pair coming to {total} bytes of {cap}: {e}"));
            let n = expect.iter().filter(|(l, _)| *l == log).count() as u64;
            assert_eq!(positions, vec![n, n + 1], "a pair coming to {total}");
            for (pos, b) in positions.iter().zip(&bodies) {
                assert_eq!(store.read(&log, *pos).unwrap()[..], b[..]);
                expect.push((log.clone(), b.clone()));
            }
        }
        drop(store);
        // No stripe page is larger than `page_bytes`, header included.
        let mut stripe_pages = 0;
        for f in seg_files_in(&cfg.zones) {
            for (off, h) in pages(&std::fs::read(&f).unwrap()) {
                if matches!(h.kind, page::Kind::Ordered | page::Kind::Unordered) {
                    assert!(
                        h.page_len() <= u64::from(cfg.page_bytes),
                        "{} at {off}: a page of {} bytes",
                        f.display(),
                        h.page_len()
                    );
                    stripe_pages += 1;
                }
            }
        }
        assert_eq!(
            stripe_pages,
            stripes * (data_shards + 1),
            "{data_shards} data pages: stripes as the layout says"
        );
        let store = Store::open(cfg).unwrap();
        let mut next: BTreeMap<String, u64> = BTreeMap::new();
        for (log, body) in &expect {
            let pos = next.entry(log.clone()).or_default();
            assert_eq!(store.read(log, *pos).unwrap()[..], body[..], "{log} {pos}");
            *pos += 1;
        }
    }
}

/// Damages every segment of one zone at a time (a stripe has one page
/// per zone and an end-write's copies are in different zones, so one
/// scrub repairs them all) and requires each repair to be the original
/// byte for byte, zeros after its end; how many segments were checked.
fn damage_every_zone_and_check_repairs(dir: &Path, store: &Store) -> usize {
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

/// Batches that fail part-way are rolled back, and the writer's own
/// account of every segment they touched (the class markers and end-write
/// pages it knows of) must be cut back with the bytes: a repair rebuilds
/// a segment from that account, so each segment damaged afterwards must
/// come back as the original, byte for byte. The failures land on every
/// write of a batch in turn (pages, end-write copies, the markers of a
/// window slide), on batches of one stripe and of several, in segments
/// small enough that the windows slide; with pages written buffered, and
/// directly.
#[test]
fn segments_repaired_after_roll_backs_are_the_originals_byte_for_byte() {
    for direct in [false, true] {
        repaired_after_roll_backs_case(direct);
    }
}

fn repaired_after_roll_backs_case(direct: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.tuning.direct_writes = direct;
    cfg.tuning.direct_write_min_bytes = 4096;
    cfg.read_cache_stripes = 0; // every read goes to the files
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
    let body = |i: u64| {
        let len = match i % 5 {
            0 => 100_000, // groups of stripes, a window slide between them
            1 => 20_000,  // several stripes
            2 => 7_000,
            _ => 300 + (i as usize * 37) % 900,
        };
        vec![(i % 251) as u8; len]
    };
    let mut expect = Vec::new();
    let mut failed = 0;
    for i in 0..240u64 {
        if i % 2 == 1 {
            // The nth write of this append fails, torn or not; an append
            // with fewer writes succeeds and the fault is disarmed.
            // One time in three a second write fails soon after: one of
            // the roll back's own (the markers of a slide it redoes), and
            // the next append finishes the roll back first.
            let then = if i / 2 % 3 == 2 {
                (i / 6 % 4) as i64
            } else {
                -1
            };
            faults.fail_two_writes((i / 2 % 29) as i64, then, i % 4 == 1);
            let r = store.append_blocking("r", 3, i, body(i));
            faults.fail_write_after(-1, false);
            match r {
                Ok(pos) => {
                    assert_eq!(pos, expect.len() as u64);
                    expect.push(body(i));
                    continue;
                }
                Err(StoreError::WriteFailed(_)) => failed += 1,
                Err(e) => panic!("append {i}: {e}"),
            }
        }
        let pos = store.append_blocking("r", 3, i, body(i)).unwrap();
        assert_eq!(pos, expect.len() as u64, "append {i}");
        expect.push(body(i));
    }
    assert!(failed >= 30, "{failed} appends failed and were rolled back");
    assert!(windows_slid(&store), "the windows slid");
    let checked = damage_every_zone_and_check_repairs(dir.path(), &store);
    assert!(checked >= 8, "{checked} segments damaged and repaired");
    let read_all = |s: &Store| {
        assert_eq!(s.bounds("r"), (0, expect.len() as u64));
        for (i, e) in expect.iter().enumerate() {
            assert_eq!(s.read("r", i as u64).unwrap()[..], e[..], "record {i}");
        }
    };
    read_all(&store);
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert!(store.recovery().repaired_segments.is_empty());
    read_all(&store);
    assert_eq!(store.scrub_blocking().bad_pages, 0);
}

/// Appends that arrive while a round is syncing are written into one
/// batch, and with pages written directly each part's writes are held
/// back for that batch's round. A part that fails is rolled back alone:
/// its held-back writes must go and the earlier parts' must stay (they
/// are acknowledged with the batch). Four threads append at once while
/// syncs are slowed (so parts join) and faults come at random: a write
/// failing (torn or not), or every sync failing, or a full disk, for a
/// few milliseconds. Every acknowledged record must read back, before and
/// after a reopen, and every segment damaged afterwards must be repaired
/// to its original bytes (a rolled-back part's bytes left on disk break
/// that). Six runs with failing writes only and large batches written
/// directly; six with all three faults, buffered too.
#[test]
fn parts_of_a_batch_rolled_back_during_a_round_keep_the_parts_before_them() {
    // (direct, other faults than failed writes too)
    let writes_only = [(true, false)];
    let mixed = [(true, true), (false, true)];
    let runs = writes_only.into_iter().cycle().take(6);
    let runs = runs.chain(mixed.into_iter().cycle().take(6));
    for (run, (direct, mixed)) in runs.enumerate() {
        let seed = run as u64 * 10;
        let what = format!(
            "{}, run {run}",
            if direct { "large batches" } else { "buffered" }
        );
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path());
        cfg.tuning.direct_writes = direct;
        cfg.tuning.direct_write_min_bytes = 4096;
        cfg.read_cache_stripes = 0;
        let faults = Arc::new(Faults::none());
        faults.slow_syncs(std::time::Duration::from_millis(4));
        let store = Arc::new(Store::open_with_faults(cfg.clone(), faults.clone()).unwrap());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let appenders: Vec<_> = (0..4u64)
            .map(|t| {
                let store = store.clone();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut rng = ChaCha8Rng::seed_from_u64(seed + t);
                    let (mut acked, mut failed) = (Vec::new(), 0u32);
                    let mut i = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let body = record(&mut rng, 20_000);
                        match store.append_blocking("j", t + 1, i, body.clone()) {
                            Ok(pos) => acked.push((pos, body)),
                            Err(StoreError::WriteFailed(_)) | Err(StoreError::NoSpace(_)) => {
                                failed += 1
                            }
                            Err(e) => panic!("thread {t}: {e}"),
                        }
                        i += 1;
                    }
                    (acked, failed)
                })
            })
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(seed + 99);
        for _ in 0..120 {
            // One write fails (torn or not); or, mixed, half the time
            // every sync fails or the disk is full for a few milliseconds.
            match if mixed { rng.random_range(0..4) } else { 0 } {
                0 | 1 => faults.fail_write_after(rng.random_range(0..24), rng.random_bool(0.5)),
                2 => faults.fail_syncs(true),
                _ => faults.fill_disk(true),
            }
            std::thread::sleep(std::time::Duration::from_millis(rng.random_range(2..9)));
            faults.fail_syncs(false);
            faults.fill_disk(false);
        }
        faults.fail_write_after(-1, false);
        // The fault loop is timed, so on a loaded machine it may end with
        // few segments written. Keep appending without faults until enough
        // segments hold data for the damage below to mean something, so the
        // check of what it repaired does not depend on the machine's speed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while store
            .segments_blocking()
            .iter()
            .filter(|s| s.class != 0 && s.len > 4096)
            .count()
            < 10
        {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: too few segments written in 120 s: {:?}",
                store.segments_blocking()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut acked = BTreeMap::new();
        let mut failed = 0;
        for a in appenders {
            let (mine, f) = a.join().unwrap();
            failed += f;
            for (pos, body) in mine {
                assert!(acked.insert(pos, body).is_none(), "{what}: {pos} twice");
            }
        }
        assert!(failed >= 5, "{what}: {failed} appends failed");
        assert!(acked.len() >= 20, "{what}: {} appended", acked.len());
        let store = Arc::into_inner(store).unwrap();
        faults.slow_syncs(std::time::Duration::ZERO);
        let read_all = |s: &Store, when: &str| {
            assert_eq!(s.bounds("j"), (0, acked.len() as u64), "{what}, {when}");
            for (&pos, body) in &acked {
                let got = s.read("j", pos);
                assert!(
                    got.as_deref().ok() == Some(&body[..]),
                    "{what}, {when}: j@{pos}: {:?}",
                    got.map(|e| e.len())
                );
            }
        };
        read_all(&store, "before the damage");
        assert_eq!(store.scrub_blocking().bad_pages, 0, "{what}");
        let checked = damage_every_zone_and_check_repairs(dir.path(), &store);
        assert!(
            checked >= 8,
            "{what}: {checked} segments damaged and repaired"
        );
        read_all(&store, "after the repairs");
        drop(store);
        let store = Store::open(cfg).unwrap();
        read_all(&store, "after a reopen");
        assert_eq!(store.scrub_blocking().bad_pages, 0, "{what}");
    }
}

#[test]
fn torn_tails_are_cut_and_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, mut model, mut rng) = appended_and_closed(dir.path(), |_| {}, 3, 30);
    // Half a page where the next page would have gone in every segment,
    // plus zeros at the end of one.
    let files = seg_files(dir.path());
    for f in &files {
        let mut bytes = std::fs::read(f).unwrap();
        bytes.truncate(data_end(&bytes));
        let fake = page::encode(
            &page::Header {
                kind: page::Kind::Ordered,
                shard: 0,
                k: 2,
                m: 1,
                body_len: 1000,
                stripe: 999_999,
                payload_len: 2000,
            },
            &[7u8; 1000],
        );
        bytes.extend_from_slice(&fake[..500]);
        std::fs::write(f, &bytes).unwrap();
    }
    let mut z = std::fs::read(&files[4]).unwrap();
    z.extend_from_slice(&[0u8; 3000]);
    std::fs::write(&files[4], z).unwrap();
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    // Every half page that runs past the end of its file is a torn tail;
    // the one followed by zeros fits the file and is kept as a corrupt,
    // unreferenced page instead.
    assert!(
        store.recovery().torn_bytes >= 500 * (files.len() as u64 - 1),
        "{:?}",
        store.recovery()
    );
    assert!(
        store.recovery().corrupt_pages >= 1,
        "{:?}",
        store.recovery()
    );
    assert!(store.recovery().repaired_segments.is_empty());
    appends_go_on_and_survive_a_reopen(store, &cfg, &mut model, &mut rng, 30);
}

#[test]
fn request_ids_make_appends_idempotent_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let store = Store::open(cfg.clone()).unwrap();
    let a = store.append_blocking("l", 42, 1, b"one".to_vec()).unwrap();
    let b = store.append_blocking("l", 42, 2, b"two".to_vec()).unwrap();
    assert_eq!(
        store.append_blocking("l", 42, 1, b"one".to_vec()).unwrap(),
        a
    );
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(
        store.append_blocking("l", 42, 2, b"two".to_vec()).unwrap(),
        b
    );
    assert_eq!(store.bounds("l"), (0, 2));
    // Client 0 opts out.
    let c = store.append_blocking("l", 0, 1, b"x".to_vec()).unwrap();
    let d = store.append_blocking("l", 0, 1, b"x".to_vec()).unwrap();
    assert_eq!((c, d), (2, 3));
}

#[test]
fn a_reopen_remembers_exactly_the_last_window_of_request_ids() {
    // Recovery inserts only the ids that stay in the window; trimmed
    // records and appends without an id (client 0) do not count.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.dedup_window = 50;
    let store = Store::open(cfg.clone()).unwrap();
    for r in 0..120u64 {
        assert_eq!(
            store.append_blocking("l", 7, r, vec![r as u8; 40]).unwrap(),
            2 * r
        );
        store.append_blocking("l", 0, 0, b"no id".to_vec()).unwrap();
    }
    store.trim_blocking("l", 60).unwrap(); // requests 0..30 trimmed
    drop(store);
    let store = Store::open(cfg).unwrap();
    // The last 50 ids (requests 70..120) answer with their positions.
    for r in 70..120u64 {
        assert_eq!(
            store.append_blocking("l", 7, r, b"retry".to_vec()).unwrap(),
            2 * r,
            "request {r}"
        );
    }
    assert_eq!(store.bounds("l"), (60, 240));
    // Request 69 fell out of the window: appended again.
    assert_eq!(
        store
            .append_blocking("l", 7, 69, b"again".to_vec())
            .unwrap(),
        240
    );
}

#[test]
fn injected_write_faults_never_acknowledge_and_retries_do_not_duplicate() {
    for direct in [false, true] {
        injected_write_faults_case(direct);
    }
}

/// A small store with injectable faults; with `direct`, data writes of a
/// whole block or more are held back for the round and written directly.
fn store_with_faults(direct: bool) -> (tempfile::TempDir, Config, Arc<Faults>, Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.tuning.direct_writes = direct;
    cfg.tuning.direct_write_min_bytes = 4096;
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
    (dir, cfg, faults, store)
}

/// With `direct`, data writes with a whole block are held back for the
/// round, so the faults land there too (a torn one in the round).
fn injected_write_faults_case(direct: bool) {
    let (dir, cfg, faults, store) = store_with_faults(direct);
    let mut expect = Vec::new();
    for i in 0..40u64 {
        let body = format!("record {i}")
            .repeat(1 + (i as usize % 7) * 300)
            .into_bytes();
        if i % 5 == 2 {
            // Tear the nth write of this append (data page, end-write...).
            faults.fail_write_after((i % 4) as i64, i % 2 == 0);
            let r = store.append_blocking("f", 9, i, body.clone());
            assert!(matches!(r, Err(StoreError::WriteFailed(_))), "{r:?}");
            // A shorter append next: a write of the failed batch done
            // after all would show past its pages.
            let short = format!("short {i}").into_bytes();
            let pos = store.append_blocking("f", 9, 10_000 + i, short.clone());
            assert_eq!(pos.unwrap(), expect.len() as u64);
            expect.push(short);
            pages_end_where_the_writer_says(&store, dir.path());
        }
        if i % 11 == 3 {
            faults.fail_syncs(true);
            let r = store.append_blocking("f", 9, i, body.clone());
            assert!(matches!(r, Err(StoreError::WriteFailed(_))), "{r:?}");
            faults.fail_syncs(false);
        }
        let pos = store.append_blocking("f", 9, i, body.clone()).unwrap();
        assert_eq!(pos, expect.len() as u64, "a failed append took no position");
        expect.push(body);
    }
    faults.slow_writes(std::time::Duration::from_millis(2));
    let pos = store
        .append_blocking("f", 9, 1000, b"slow".to_vec())
        .unwrap();
    assert_eq!(pos, expect.len() as u64);
    expect.push(b"slow".to_vec());
    assert!(store.stats().write_failures >= 8);
    if direct && o_direct_works(dir.path()) {
        assert!(store.stats().direct_write_bytes > 0, "the direct path ran");
    }
    pages_end_where_the_writer_says(&store, dir.path());
    let check_all = |s: &Store| {
        assert_eq!(s.bounds("f"), (0, expect.len() as u64));
        for (i, e) in expect.iter().enumerate() {
            assert_eq!(&s.read("f", i as u64).unwrap()[..], &e[..]);
        }
    };
    check_all(&store);
    drop(store);
    let store = Store::open(cfg).unwrap();
    check_all(&store);
    assert_eq!(store.scrub_blocking().bad_pages, 0);
}

/// A class marker is read by no append and no read, only by the next
/// open, which takes a segment whose marker is damaged as another class
/// or as ending there. A scrub reads every marker the writer recorded: one
/// failing its checksum, and one rewritten as a valid marker of another
/// class, each mark their segment, which is rebuilt with the marker
/// written; a second scrub finds nothing, and every record survives a
/// reopen.
#[test]
fn a_scrub_finds_damaged_class_markers_and_rebuilds_their_segments() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    let mut model = Model::new();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    append_burst(&store, &mut model, &mut rng, 60);
    let clean = store.scrub_blocking();
    assert_eq!(clean.bad_markers, 0, "{clean:?}");
    assert!(clean.markers >= 9, "{clean:?}");
    // Two segments whose first page is their class marker.
    let mut damaged = Vec::new();
    for info in store.segments_blocking() {
        let f = seg_path(dir.path(), info.id);
        let bytes = std::fs::read(&f).unwrap();
        let Some((0, h)) = pages(&bytes).first().copied() else {
            continue;
        };
        if h.kind != page::Kind::Class || damaged.len() == 2 {
            continue;
        }
        let mut edited = bytes.clone();
        if damaged.is_empty() {
            edited[page::HEADER] ^= 0x40; // fails its checksum
        } else {
            let other = page::class_marker(bytes[page::HEADER] ^ 1);
            edited[..other.len()].copy_from_slice(&other); // valid, wrong class
        }
        std::fs::write(&f, &edited).unwrap();
        damaged.push((info.id, f, bytes));
    }
    assert_eq!(damaged.len(), 2, "two segments start with a marker");
    let report = store.scrub_blocking();
    assert_eq!(report.bad_markers, 2, "{report:?}");
    let mut want: Vec<u64> = damaged.iter().map(|d| d.0).collect();
    want.sort();
    assert_eq!(report.repaired, want, "{report:?}");
    let marker = page::class_marker(0).len();
    for (_, f, before) in &damaged {
        let after = std::fs::read(f).unwrap();
        assert_eq!(
            after[..marker],
            before[..marker],
            "{}: the marker is back",
            f.display()
        );
    }
    let again = store.scrub_blocking();
    assert_eq!(
        (again.bad_markers, again.repaired.len()),
        (0, 0),
        "{again:?}"
    );
    check(&store, &model);
    drop(store);
    let store = Store::open(cfg).unwrap();
    check(&store, &model);
    assert_eq!(store.scrub_blocking().bad_markers, 0);
}

/// While every sync fails, each append is refused and its roll back
/// redoes the window slide it started, and the next append finishes it:
/// each attempt raises the same segments again. A marker the last
/// attempt wrote, with nothing after it, is synced again rather than
/// written again, so a segment holds at most one marker per class it
/// reached however long the disk fails (a device slot has room for a few
/// thousand markers past its segment; a pile-up could fill it).
#[test]
fn raises_retried_while_syncs_fail_do_not_pile_up_markers() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
    let body = |i: u64| vec![(i % 251) as u8; 500 + (i as usize * 997) % 9000];
    for i in 0..100u64 {
        faults.fail_syncs(true);
        for _ in 0..4 {
            let r = store.append_blocking("s", 9, i, body(i));
            assert!(
                matches!(r, Err(StoreError::WriteFailed(_))),
                "append {i}: {r:?}"
            );
        }
        faults.fail_syncs(false);
        assert_eq!(store.append_blocking("s", 9, i, body(i)).unwrap(), i);
    }
    assert!(windows_slid(&store), "the windows slid");
    for f in seg_files(dir.path()) {
        let bytes = std::fs::read(&f).unwrap();
        let classes: Vec<u8> = pages(&bytes)
            .into_iter()
            .filter(|(_, h)| h.kind == page::Kind::Class)
            .map(|(off, _)| bytes[off + page::HEADER])
            .collect();
        let mut distinct = classes.clone();
        distinct.dedup();
        assert_eq!(classes, distinct, "{}: markers {classes:?}", f.display());
    }
    drop(store);
    let store = Store::open(cfg).unwrap();
    for i in 0..100u64 {
        assert_eq!(store.read("s", i).unwrap()[..], body(i)[..], "s@{i}");
    }
}

/// A full disk at every append in turn, window slides included, over
/// spares and over empty segment files: each append is refused once (its
/// batch rolled back; a slide it started is redone by the roll back,
/// refused too, and finished by the next append), then appended with
/// space back at the position it would have had. Every segment damaged
/// afterwards must be repaired to its original bytes, and nothing is lost
/// across a reopen.
#[test]
fn a_disk_full_at_every_append_in_turn_across_window_slides_loses_nothing() {
    for spares in [true, false] {
        let what = if spares { "spares" } else { "empty files" };
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path());
        cfg.prepared_segments = if spares { 4 } else { 0 };
        cfg.read_cache_stripes = 0;
        let faults = Arc::new(Faults::none());
        let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
        if spares {
            wait_for_spares(&store, 12);
        }
        let body = |i: u64| vec![(i % 251) as u8; 300 + (i as usize * 997) % 9000];
        let mut refused = 0;
        for i in 0..120u64 {
            faults.fill_disk(true);
            match store.append_blocking("f", 5, i, body(i)) {
                Err(StoreError::NoSpace(_)) => refused += 1,
                Err(e) => panic!("{what}: append {i}: {e}"),
                Ok(p) => panic!("{what}: append {i} acknowledged at {p} on a full disk"),
            }
            faults.fill_disk(false);
            let pos = store
                .append_blocking("f", 5, i, body(i))
                .unwrap_or_else(|e| panic!("{what}: append {i} with space: {e}"));
            assert_eq!(pos, i, "{what}");
        }
        assert_eq!(refused, 120, "{what}");
        assert!(windows_slid(&store), "{what}: the windows slid");
        let read_all = |s: &Store, when: &str| {
            for i in 0..120u64 {
                assert_eq!(
                    s.read("f", i).unwrap()[..],
                    body(i)[..],
                    "{what}, {when}: f@{i}"
                );
            }
        };
        read_all(&store, "written");
        let checked = damage_every_zone_and_check_repairs(dir.path(), &store);
        assert!(
            checked >= 8,
            "{what}: {checked} segments damaged and repaired"
        );
        read_all(&store, "repaired");
        drop(store);
        let store = Store::open(cfg).unwrap();
        read_all(&store, "reopened");
        assert_eq!(store.scrub_blocking().bad_pages, 0, "{what}");
    }
}

#[test]
fn a_full_disk_answers_no_space_loses_nothing_and_the_same_appends_go_on_once_space_is_back() {
    for direct in [false, true] {
        full_disk_case(direct);
    }
}

/// Every page write fails with "no space" (injected) while four threads
/// append: every append is answered `NoSpace` (not a generic write
/// failure, and never acknowledged), also one in a batch written during
/// the failed batch's round and rolled back with it (it happens when the
/// writer runs behind; 2 runs in 5 of the whole file hit it). With space back, the same request
/// ids append once each; asked again they answer the same positions.
fn full_disk_case(direct: bool) {
    let (_dir, cfg, faults, store) = store_with_faults(direct);
    let store = Arc::new(store);
    let body = |t: u64, i: u64| format!("t{t} r{i} ").repeat(1 + (i as usize * 131) % 900);
    let mut expect = BTreeMap::new();
    for i in 0..20u64 {
        let pos = store
            .append_blocking("d", 1, i, body(9, i).into_bytes())
            .unwrap();
        expect.insert(pos, body(9, i));
    }
    faults.fill_disk(true);
    let failures_before = store.stats().write_failures;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let store = &store;
            s.spawn(move || {
                for i in 0..10u64 {
                    let r = store.append_blocking("d", 10 + t, i, body(t, i).into_bytes());
                    match r {
                        Err(StoreError::NoSpace(m)) => assert!(!m.is_empty()),
                        other => panic!("thread {t} append {i} on a full disk: {other:?}"),
                    }
                }
            });
        }
    });
    assert!(store.stats().write_failures > failures_before);
    // Nothing acknowledged was lost, and the failed appends took nothing.
    assert_eq!(store.bounds("d"), (0, 20));
    for (&p, b) in &expect {
        assert_eq!(&store.read("d", p).unwrap()[..], b.as_bytes());
    }
    faults.fill_disk(false);
    let mut again = BTreeMap::new();
    for t in 0..4u64 {
        for i in 0..10u64 {
            let pos = store
                .append_blocking("d", 10 + t, i, body(t, i).into_bytes())
                .unwrap();
            assert!(
                expect.insert(pos, body(t, i)).is_none(),
                "position {pos} twice"
            );
            again.insert((t, i), pos);
        }
    }
    for (&(t, i), &pos) in &again {
        let r = store.append_blocking("d", 10 + t, i, body(t, i).into_bytes());
        assert_eq!(r.unwrap(), pos, "a retried request id appended again");
    }
    assert_eq!(store.bounds("d"), (0, 60));
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.bounds("d"), (0, 60));
    for (&p, b) in &expect {
        assert_eq!(&store.read("d", p).unwrap()[..], b.as_bytes());
    }
    assert_eq!(store.scrub_blocking().bad_pages, 0);
}

#[test]
fn trim_frees_segments_and_positions_are_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let store = Store::open(cfg.clone()).unwrap();
    for i in 0..400u64 {
        store
            .append_blocking("t", 0, 0, vec![i as u8; 3000])
            .unwrap();
    }
    let before = store.stats().segments;
    store.trim_blocking("t", 400).unwrap();
    assert!(store.stats().segments_freed > 0, "{:?}", store.stats());
    assert!(store.stats().segments < before);
    assert!(matches!(
        store.trim_blocking("t", 401),
        Err(StoreError::TrimBeyondTail { .. })
    ));
    drop(store);
    let store = Store::open(cfg.clone()).unwrap();
    assert_eq!(store.bounds("t"), (400, 400));
    assert_eq!(
        store.append_blocking("t", 0, 0, b"next".to_vec()).unwrap(),
        400
    );
    assert!(matches!(
        store.read("t", 399),
        Err(StoreError::Trimmed { .. })
    ));
    assert_eq!(&store.read("t", 400).unwrap()[..], b"next");
}

/// At `max_segments` an append is refused with `Full` and nothing else
/// changes: a trim lets appends go on at the next position, without a
/// restart. (Until 2026-11-27 the failed slide left the store refusing
/// every append until restarted.)
#[test]
fn a_log_at_max_segments_refuses_appends_until_a_trim() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    // The windows take 9 segments: room for a few slides.
    cfg.max_segments = 15;
    let store = Store::open(cfg.clone()).unwrap();
    let rec = vec![3u8; 3000];
    let mut acked = 0u64;
    let err = loop {
        match store.append_blocking("t", 0, 0, rec.clone()) {
            Ok(p) => {
                assert_eq!(p, acked);
                acked += 1;
            }
            Err(e) => break e,
        }
        assert!(acked < 10_000, "never full");
    };
    assert!(matches!(err, StoreError::Full(_)), "{err}");
    // Refused again, the same way, while nothing is trimmed.
    let again = store.append_blocking("t", 0, 0, rec.clone()).unwrap_err();
    assert!(matches!(again, StoreError::Full(_)), "{again}");
    for p in 0..acked {
        assert_eq!(&store.read("t", p).unwrap()[..], &rec[..]);
    }
    store.trim_blocking("t", acked).unwrap();
    assert_eq!(
        store.append_blocking("t", 0, 0, rec.clone()).unwrap(),
        acked
    );
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.bounds("t"), (acked, acked + 1));
}

#[test]
fn bad_arguments_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let store = Store::open(cfg.clone()).unwrap();
    assert!(matches!(
        store.append_blocking("no spaces", 0, 0, b"x".to_vec()),
        Err(StoreError::BadLogName(_))
    ));
    assert!(matches!(
        store.append_blocking("", 0, 0, b"x".to_vec()),
        Err(StoreError::BadLogName(_))
    ));
    // The documented rule, 1-64 bytes of `A-Z a-z 0-9 _ . -`, at each of
    // its edges, for appends, reads, trims and the rule's own check.
    let long = "n".repeat(64);
    for ok in ["A", "z", "0", "9", "_", ".", "-", "a_b.c-D9", long.as_str()] {
        assert_eq!(check_log_name(ok), Ok(()), "{ok:?}");
        let p = store.append_blocking(ok, 0, 0, ok.as_bytes().to_vec());
        let p = p.unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        assert_eq!(&store.read(ok, p).unwrap()[..], ok.as_bytes(), "{ok:?}");
    }
    let too_long = "n".repeat(65);
    for bad in [
        too_long.as_str(),
        "a b",
        "a/b",
        "é",
        "a\0",
        "a:b",
        "*",
        "\u{7f}",
    ] {
        assert!(
            matches!(check_log_name(bad), Err(StoreError::BadLogName(_))),
            "{bad:?}"
        );
        assert!(
            matches!(
                store.append_blocking(bad, 0, 0, b"x".to_vec()),
                Err(StoreError::BadLogName(_))
            ),
            "{bad:?}"
        );
        assert!(
            matches!(store.read(bad, 0), Err(StoreError::BadLogName(_))),
            "{bad:?}"
        );
        assert!(
            matches!(store.trim_blocking(bad, 0), Err(StoreError::BadLogName(_))),
            "{bad:?}"
        );
    }
    // Empty records are records (the core's group-meld filler is one).
    let p = store.append_blocking("l", 0, 0, Vec::new()).unwrap();
    assert_eq!(store.read("l", p).unwrap().len(), 0);
    // A record of exactly `max_record_bytes` is taken; one byte more is
    // refused, and the error says by how much.
    let limit = cfg.max_record_bytes as usize;
    let at_limit: Vec<u8> = (0..limit).map(|i| (i % 253) as u8).collect();
    let p = store.append_blocking("l", 0, 0, at_limit.clone()).unwrap();
    assert_eq!(&store.read("l", p).unwrap()[..], &at_limit[..]);
    match store.append_blocking("l", 0, 0, vec![0; limit + 1]) {
        Err(StoreError::TooLarge { len, limit: l }) => assert_eq!((len, l), (limit + 1, limit)),
        other => panic!("a record one byte over the limit: {other:?}"),
    }
    assert_eq!(
        store.bounds("l"),
        (0, 2),
        "the refused record took no position"
    );
    assert!(matches!(
        store.read("l", 2),
        Err(StoreError::NotYetWritten { .. })
    ));
    let mut bad = cfg.clone();
    bad.zones.truncate(2);
    assert!(Store::open(bad).is_err());
}

/// The largest `max_record_bytes` validation takes is the documented
/// rule's edge (a root stripe lists 8 bytes per fragment stripe beside
/// 128 bytes for the entry and a quarter-stripe tail: with `cap` payload
/// bytes per stripe, at most `(cap - 128 - cap / 4) / 8` fragments of
/// `cap` bytes), one byte more is refused with what to change, and the
/// writer really places a record of exactly that size under the longest
/// log name, spanning hundreds of stripes, read back intact after a
/// reopen.
#[test]
fn the_largest_record_validation_takes_is_written_under_the_longest_name() {
    // The last geometry puts the edge exactly on the rule's equality:
    // 8192 payload bytes, 752 fragments filling the root to its last byte.
    for (data_shards, page_bytes) in [(1usize, 4096u32), (2, 4096), (2, 4124)] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path());
        cfg.data_shards = data_shards;
        cfg.page_bytes = page_bytes;
        cfg.segment_bytes = 1 << 20;
        let cap = (data_shards * (cfg.page_bytes as usize - page::HEADER)) as u32;
        let room = cap - 128 - cap / 4;
        if page_bytes == 4124 {
            assert_eq!(room % 8, 0, "this geometry's edge fills the root exactly");
        }
        let edge = room / 8 * cap;
        cfg.max_record_bytes = edge;
        if let Err(e) = cfg.validate() {
            panic!("k = {data_shards}: the edge {edge} is refused: {e}");
        }
        let mut over = cfg.clone();
        over.max_record_bytes = edge + 1;
        let e = over
            .validate()
            .expect_err("one byte past the edge")
            .to_string();
        assert!(
            e.contains(&format!("max_record_bytes {}", edge + 1)) && e.contains("raise page_bytes"),
            "{e}"
        );
        let store = Store::open(cfg.clone()).unwrap();
        let log = "L".repeat(64);
        let rec: Vec<u8> = (0..edge).map(|i| (i % 251) as u8).collect();
        let p = store.append_blocking(&log, 1, 1, rec.clone()).unwrap();
        assert!(
            store.read(&log, p).unwrap()[..] == rec[..],
            "k = {data_shards}"
        );
        let stripes = store.stats().stripes;
        assert!(stripes > 300, "k = {data_shards}: {stripes} stripes");
        drop(store);
        let store = Store::open(cfg).unwrap();
        assert!(
            store.read(&log, p).unwrap()[..] == rec[..],
            "k = {data_shards}"
        );
    }
}

/// A store in `dir` with 20 single appends of 100 bytes to log "b", each
/// its own batch.
fn twenty_appends(dir: &Path) -> (Config, Store) {
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
fn data_lens(dir: &Path) -> Vec<u64> {
    seg_files(dir).iter().map(|f| data_len(f)).collect()
}

#[test]
fn a_last_batch_whose_pages_did_not_reach_the_disk_is_dropped_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, store) = twenty_appends(dir.path());
    let len_before = data_lens(dir.path());
    // One batch of five records: one root stripe, end-writes on 0,1,2.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let pos = rt
        .block_on(store.append_many(
            "b",
            0,
            0,
            (0..5).map(|i| vec![0xb0 + i; 300].into()).collect(),
        ))
        .unwrap();
    assert_eq!(pos, vec![20, 21, 22, 23, 24]);
    let len_after = data_lens(dir.path());
    drop(store);
    // As if the machine died with the end-writes on disk but two of the
    // three pages of the stripe not.
    lose_pages(dir.path(), &len_before, &len_after);
    let store = Store::open(cfg.clone()).unwrap();
    assert!(
        store.recovery().dropped_stripes >= 1,
        "{:?}",
        store.recovery()
    );
    assert_eq!(
        store.bounds("b"),
        (0, 20),
        "the whole unacknowledged batch is gone"
    );
    // And it stays gone: the dropped stripe numbers are never trusted again.
    twenty_kept_and_the_next_append_stays(&cfg, store);
}

/// After an open that dropped what followed [`twenty_appends`]: those
/// twenty read back, the next append takes position 20, and it is still
/// there after another open (the dropped stripe numbers stay discarded,
/// so that open does not take them for a hole and drop it).
fn twenty_kept_and_the_next_append_stays(cfg: &Config, store: Store) {
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
fn edit_first_page(dir: &Path, what: &str, edit: impl FnMut(&page::Header, &mut [u8]) -> bool) {
    edit_first_page_in(&seg_files(dir), what, true, edit);
}

/// [`edit_first_page`] over `files`; `reseal` false leaves the page
/// failing its checksum (unless the edit changed nothing). Returns the
/// file edited.
fn edit_first_page_in(
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
fn seg_path(dir: &Path, seg: u64) -> PathBuf {
    dir.join(format!("zone{}", seg % 3))
        .join(format!("seg-{seg:016}.dat"))
}

/// The segment file holding page `shard` of stripe `seq`.
fn file_of_page(dir: &Path, seq: u64, shard: u8) -> PathBuf {
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
fn rewrite_first_end_write(dir: &Path, edit: impl Fn(&mut melddb_log::stripe::EndWrite) -> bool) {
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

#[test]
fn an_end_write_copy_that_passes_its_checksum_but_cannot_be_true_is_damage() {
    // Found by the `log_recover` fuzz target: a sealed end-write whose page
    // offset lay 159 GB into a segment made repair build an image of that
    // size. Each edit below makes one copy impossible or different from
    // the other two; those two must be used and every record read back.
    // (With two good copies the vote alone outvotes an impossible one;
    // `plausible` itself, which matters when a copy has no others, is
    // pinned by a unit test in recovery.rs.)
    type Edit = fn(&mut melddb_log::stripe::EndWrite) -> bool;
    let edits: [(&str, Edit); 8] = [
        ("page offset past any segment", |ew| {
            ew.stripe.pages[0].1 = 1 << 40;
            true
        }),
        ("shard longer than a segment", |ew| {
            ew.stripe.shard_len = u32::MAX;
            true
        }),
        ("two pages on one segment", |ew| {
            ew.stripe.pages[1].0 = ew.stripe.pages[0].0;
            true
        }),
        // Also found by the fuzz target: recovery added the copy set's
        // size to this base and overflowed.
        ("a copy set that does not hold the copy", |ew| {
            ew.ew_base = u64::MAX - 1;
            true
        }),
        ("pages on segments that never existed", |ew| {
            for (i, p) in ew.stripe.pages.iter_mut().enumerate() {
                p.0 = (1 << 40) + i as u64;
            }
            true
        }),
        ("pages out of their window's order", |ew| {
            ew.stripe.pages.swap(0, 1);
            true
        }),
        // Plausible, but not what the other two copies say: the copies
        // most of them agree on win.
        ("a record's checksum", |ew| {
            ew.entries.first_mut().map(|e| e.crc ^= 0xffff).is_some()
        }),
        ("a record's position", |ew| {
            ew.entries.first_mut().map(|e| e.pos += 1000).is_some()
        }),
    ];
    for (what, edit) in edits {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, mut model, mut rng) = appended_and_closed(dir.path(), |_| {}, 5, 40);
        rewrite_first_end_write(dir.path(), edit);
        let store = Arc::new(Store::open(cfg.clone()).unwrap());
        assert!(
            store.recovery().corrupt_pages >= 1,
            "{what}: the copy counts as damage: {:?}",
            store.recovery()
        );
        appends_go_on_and_survive_a_reopen(store, &cfg, &mut model, &mut rng, 10);
    }
}

#[test]
fn a_log_taken_as_trimmed_at_recovery_stays_so_across_later_opens() {
    // Found by the `log_recover` fuzz target. The metadata of a trimmed
    // log says which positions are live; when no record of them is left
    // (every end-write copy lost, or a newer trim's metadata lost),
    // recovery takes them as trimmed. It did not write that down, so once
    // an append was acknowledged on top, the next open counted from the
    // old first position again and refused to open.
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let store = Store::open(cfg.clone()).unwrap();
    for i in 0..10u8 {
        store.append_blocking("a", 0, 0, vec![i; 50]).unwrap();
    }
    store.trim_blocking("a", 3).unwrap();
    drop(store);
    // Every end-write copy is on segments 0, 1 and 2 (the first era).
    for (z, seg) in [(0, 0), (1, 1), (2, 2)] {
        std::fs::remove_file(
            dir.path()
                .join(format!("zone{z}"))
                .join(format!("seg-{seg:016}.dat")),
        )
        .unwrap();
    }
    let store = Store::open(cfg.clone()).unwrap();
    assert_eq!(store.bounds("a"), (10, 10), "positions are never reused");
    assert_eq!(
        store.append_blocking("a", 0, 0, b"after".to_vec()).unwrap(),
        10
    );
    drop(store);
    let store = Store::open(cfg.clone()).expect("the store opens again");
    assert_eq!(store.bounds("a"), (10, 11));
    assert_eq!(&store.read("a", 10).unwrap()[..], b"after");
    drop(store);
    let store = Store::open(cfg).expect("and again");
    assert_eq!(store.bounds("a"), (10, 11));
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
fn falsify_page(dir: &Path, kind: page::Kind, shard: u8, last: bool, model: &Model) -> u64 {
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

#[test]
fn a_scrub_finds_a_page_that_lies_under_a_valid_checksum_before_parity_is_needed() {
    // Every page passes its own checksum, so only the stripe's parity
    // shows that one holds other bytes than were written. A scrub that
    // checked checksums alone left it there; once another page of the
    // stripe was lost, its rebuild used the lie and the records were
    // gone. The scrub must find the page (parity says one is wrong, the
    // records' checksums say which), rebuild it, and leave the stripe
    // able to lose any other page.
    let cases = [
        (page::Kind::Ordered, 0u8, 2u8, false),
        (page::Kind::Unordered, 1, 2, false),
        // The last fragment stripe: the records on it are found by
        // bisecting each log near its end, not its start.
        (page::Kind::Unordered, 1, 2, true),
        // The parity page itself (small_config: 2 data + 1 parity).
        (page::Kind::Ordered, 2, 0, false),
        (page::Kind::Unordered, 2, 1, false),
    ];
    for (kind, shard, then_lose, last) in cases {
        let what = format!("{kind:?} page {shard} (last: {last}), then page {then_lose} lost");
        let dir = tempfile::tempdir().unwrap();
        let (cfg, model, _) = appended_and_closed(dir.path(), |_| {}, 11, 60);
        let seq = falsify_page(dir.path(), kind, shard, last, &model);
        let liar = file_of_page(dir.path(), seq, shard);
        let store = Store::open(cfg.clone()).unwrap();
        let report = store.scrub_blocking();
        assert_eq!(report.parity_mismatches, 1, "{what}: {report:?}");
        assert_eq!(report.bad_pages, 1, "{what}: {report:?}");
        assert!(report.unrecoverable.is_empty(), "{what}: {report:?}");
        let liar_seg = liar
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| {
                n.strip_prefix("seg-")?
                    .strip_suffix(".dat")?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap();
        assert_eq!(report.repaired, vec![liar_seg], "{what}: {report:?}");
        let again = store.scrub_blocking();
        assert_eq!(
            (again.parity_mismatches, again.bad_pages),
            (0, 0),
            "{what}: {again:?}"
        );
        drop(store);
        // Now lose another page of that stripe: its rebuild needs the page
        // that lied.
        std::fs::remove_file(file_of_page(dir.path(), seq, then_lose)).unwrap();
        let store = Store::open(cfg).unwrap();
        check(&store, &model);
        let last = store.scrub_blocking();
        assert_eq!(
            (last.parity_mismatches, last.bad_pages),
            (0, 0),
            "{what}: {last:?}"
        );
    }
}

#[test]
fn scrub_progress_counts_every_stripe_and_page_byte_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(small_config(dir.path())).unwrap());
    let mut model = Model::new();
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    append_burst(&store, &mut model, &mut rng, 30);
    let mut seen = Vec::new();
    let report = store.scrub_with_progress(&mut |p| seen.push(p));
    let last = *seen.last().expect("progress was reported");
    assert_eq!(seen.len() as u64, report.stripes);
    assert_eq!(
        (last.stripes_done, last.stripes),
        (report.stripes, report.stripes)
    );
    assert_eq!(last.bytes_done, last.bytes);
    assert!(seen
        .windows(2)
        .all(|w| w[0].stripes_done + 1 == w[1].stripes_done && w[0].bytes_done < w[1].bytes_done));
    // Every page of every stripe, headers included: no less than the
    // records it holds.
    let records: u64 = model
        .values()
        .flat_map(|(_, recs)| recs.iter().map(|r| r.len() as u64))
        .sum();
    assert!(
        last.bytes > records,
        "{} page bytes for {records} record bytes",
        last.bytes
    );
    // The exact figures: nothing was trimmed or rolled back, so every
    // stripe page in the segment files is a live stripe's, and the scrub
    // must count those pages' bytes, headers included, and those stripes.
    let mut on_disk = 0u64;
    let mut stripes = std::collections::BTreeSet::new();
    for f in seg_files(dir.path()) {
        for (_, h) in stripe_pages(&std::fs::read(&f).unwrap()) {
            on_disk += h.page_len();
            stripes.insert(h.stripe);
        }
    }
    assert_eq!(
        (last.bytes, report.stripes),
        (on_disk, stripes.len() as u64)
    );
}

#[test]
fn a_scrub_counts_every_damaged_page_of_a_segment_once() {
    // Damage the body of every stripe page of one segment while the store
    // is open: the scrub must count each of them (every stripe page here
    // is live: nothing was trimmed or rolled back), rebuild that segment
    // alone, and leave nothing for a second scrub.
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(small_config(dir.path())).unwrap());
    let mut model = Model::new();
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    append_burst(&store, &mut model, &mut rng, 30);
    let victim = seg_files(dir.path())
        .into_iter()
        .max_by_key(|f| stripe_pages(&std::fs::read(f).unwrap()).len())
        .unwrap();
    let mut bytes = std::fs::read(&victim).unwrap();
    let hit = stripe_pages(&bytes);
    assert!(
        hit.len() >= 2,
        "{}: {} stripe pages",
        victim.display(),
        hit.len()
    );
    for (off, h) in &hit {
        bytes[off + page::HEADER + h.body_len as usize / 2] ^= 0x5a;
    }
    std::fs::write(&victim, &bytes).unwrap();
    let seg = victim
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(melddb_log::segment::parse_name)
        .unwrap();
    let report = store.scrub_blocking();
    assert_eq!(report.bad_pages, hit.len() as u64, "{report:?}");
    assert_eq!(report.parity_mismatches, 0, "{report:?}");
    assert_eq!(report.repaired, vec![seg], "{report:?}");
    assert!(
        report.unrecoverable.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
    let again = store.scrub_blocking();
    assert_eq!((again.bad_pages, again.repaired.len()), (0, 0), "{again:?}");
    check(&store, &model);
}

#[test]
fn repairing_one_lying_page_does_not_copy_another_stripes_lie() {
    // Two root stripes on the same three segments, each with one page that
    // lies under a valid checksum, on different segments. Repair used to
    // rebuild every stripe page of a segment from the stripe's other
    // pages, so rebuilding the first liar's segment rebuilt the second
    // stripe's good page there from the second liar: two wrong pages in a
    // one-parity stripe, its records gone. Intact pages are now kept
    // unless they are the ones found to lie.
    let dir = tempfile::tempdir().unwrap();
    let (cfg, model, _) = appended_and_closed(dir.path(), |_| {}, 13, 60);
    // Root stripes by their pages' segments, with bodies long enough.
    let mut by_place: BTreeMap<(PathBuf, PathBuf), Vec<u64>> = BTreeMap::new();
    let mut long = std::collections::BTreeSet::new();
    let mut places: BTreeMap<(u64, u8), PathBuf> = BTreeMap::new();
    for f in seg_files(dir.path()) {
        for (_, h) in pages(&std::fs::read(&f).unwrap()) {
            if h.kind == page::Kind::Ordered {
                places.insert((h.stripe, h.shard), f.clone());
                if h.body_len >= 256 && h.shard < 2 {
                    long.insert((h.stripe, h.shard));
                }
            }
        }
    }
    for (&(seq, shard), f) in &places {
        if shard == 0 {
            if let Some(g) = places.get(&(seq, 1)) {
                by_place
                    .entry((f.clone(), g.clone()))
                    .or_default()
                    .push(seq);
            }
        }
    }
    let (y, z) = by_place
        .values()
        .find_map(|seqs| {
            let y = seqs.iter().find(|&&s| long.contains(&(s, 0)))?;
            let z = seqs.iter().find(|&&s| s != *y && long.contains(&(s, 1)))?;
            Some((*y, *z))
        })
        .expect("two root stripes on the same segments");
    for (seq, shard) in [(y, 0u8), (z, 1u8)] {
        edit_first_page(dir.path(), "data", |h, bytes| {
            if h.kind != page::Kind::Ordered || h.stripe != seq || h.shard != shard {
                return false;
            }
            bytes[page::HEADER + h.body_len as usize / 2] ^= 0x5a;
            true
        });
    }
    let store = Store::open(cfg.clone()).unwrap();
    let report = store.scrub_blocking();
    assert_eq!(report.parity_mismatches, 2, "{report:?}");
    assert_eq!(report.repaired.len(), 2, "{report:?}");
    assert!(report.unrecoverable.is_empty(), "{report:?}");
    let again = store.scrub_blocking();
    assert_eq!(
        (again.parity_mismatches, again.bad_pages),
        (0, 0),
        "{again:?}"
    );
    check(&store, &model);
    drop(store);
    let store = Store::open(cfg).unwrap();
    check(&store, &model);
}

#[test]
fn a_scrub_rebuilds_end_write_copies_from_the_version_written() {
    // Scrub read no end-write copy, so a lost or outvoted one stayed until
    // the next open, and repair copied the first intact copy it found,
    // even one recovery had outvoted: rebuilt next to the lie, a second
    // wrong copy won the next open's vote and a record became unreadable.
    use melddb_log::stripe::{decode_end_write, encode_end_write};
    let dir = tempfile::tempdir().unwrap();
    let (cfg, model, _) = appended_and_closed(dir.path(), |_| {}, 12, 40);
    // A root stripe's end-write on segment 0, the first of the first
    // copy set (segments 0, 1 and 2): its record checksum is changed and
    // the page sealed again.
    let mut seq = 0;
    edit_first_page_in(&[seg_path(dir.path(), 0)], "end-write", true, |h, bytes| {
        if h.kind != page::Kind::EndWrite {
            return false;
        }
        let mut ew = decode_end_write(&bytes[page::HEADER..]).unwrap();
        if ew.ew_base != 0 || ew.entries.is_empty() {
            return false;
        }
        ew.entries[0].crc ^= 0xffff;
        bytes[page::HEADER..].copy_from_slice(&encode_end_write(&ew));
        seq = h.stripe;
        true
    });
    let store = Store::open(cfg.clone()).unwrap();
    assert_eq!(store.recovery().corrupt_pages, 1, "the lie is outvoted");
    check(&store, &model);
    // The copy on segment 1 is then damaged (fails its checksum).
    edit_first_page_in(
        &[seg_path(dir.path(), 1)],
        "end-write",
        false,
        |h, bytes| {
            if h.kind != page::Kind::EndWrite || h.stripe != seq {
                return false;
            }
            bytes[page::HEADER] ^= 0xff;
            true
        },
    );
    let report = store.scrub_blocking();
    assert_eq!(report.bad_end_write_copies, 2, "{report:?}");
    assert!(report.end_writes > 0, "{report:?}");
    assert_eq!(report.repaired, vec![0, 1], "{report:?}");
    assert_eq!(store.scrub_blocking().bad_end_write_copies, 0);
    check(&store, &model);
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(
        store.recovery().corrupt_pages,
        0,
        "every copy is the one written: {:?}",
        store.recovery()
    );
    check(&store, &model);
}

#[test]
fn a_page_that_passes_its_checksum_but_lies_is_outvoted_by_parity() {
    // Found by the `log_recover` fuzz target: a data page rewritten and
    // sealed again passes its own checksum, and the read path that uses
    // whole stripes returned its bytes without checking the record's
    // checksum. Now the record is rebuilt from parity without the lying
    // page, and the segment is repaired.
    for (kind, shard) in [
        (page::Kind::Ordered, 0),
        (page::Kind::Unordered, 0),
        (page::Kind::Unordered, 1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, model, _) = appended_and_closed(dir.path(), |_| {}, 9, 60);
        falsify_page(dir.path(), kind, shard, false, &model);
        let store = Arc::new(Store::open(cfg.clone()).unwrap());
        check(&store, &model);
        assert!(
            store.stats().pages_rebuilt >= 1,
            "{kind:?} shard {shard}: a page was rebuilt from parity"
        );
        // The repair the read asked for rewrites the page, and a reopen
        // (no stripe cache) reads the right bytes.
        store.barrier_blocking();
        drop(store);
        let store = Store::open(cfg).unwrap();
        check(&store, &model);
        assert_eq!(
            store.stats().pages_rebuilt,
            0,
            "{kind:?} shard {shard}: the repair rewrote the page"
        );
    }
}

#[test]
fn a_sealed_page_that_names_another_stripe_is_rebuilt_and_parity_is_read_only_when_needed() {
    // A page can pass its own checksum and still not be the page the
    // index points at (a misdirected write, a stale page of an earlier
    // life of the file): its header names another stripe. Its body is
    // left as written, so the record's checksum would pass; only the
    // header check tells, and the page must count as lost. And a read
    // whose data pages are intact leaves parity alone, even damaged.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.segment_bytes = 1 << 20;
    cfg.read_cache_stripes = 0; // every read goes to the files
    let store = Store::open(cfg.clone()).unwrap();
    // Spans stripes, so every read takes whole stripes, page by page.
    let large: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(store.append_blocking("f", 0, 0, large.clone()).unwrap(), 0);
    let data = |h: &page::Header| matches!(h.kind, page::Kind::Ordered | page::Kind::Unordered);
    let mut parity_of = None;
    edit_first_page_in(&seg_files(dir.path()), "parity", false, |h, bytes| {
        if !data(h) || h.shard < h.k {
            return false;
        }
        bytes[page::HEADER + h.body_len as usize / 2] ^= 0x5a;
        parity_of = Some(h.stripe);
        true
    });
    assert_eq!(&store.read("f", 0).unwrap()[..], &large[..]);
    assert_eq!(
        store.stats().pages_rebuilt,
        0,
        "intact data pages: the damaged parity page is not read"
    );
    edit_first_page(dir.path(), "data", |h, bytes| {
        if !data(h) || h.shard != 0 || Some(h.stripe) == parity_of {
            return false;
        }
        let other = page::Header {
            stripe: h.stripe + 1_000,
            ..*h
        };
        let renamed = page::encode(&other, &bytes[page::HEADER..]);
        bytes.copy_from_slice(&renamed);
        true
    });
    assert_eq!(&store.read("f", 0).unwrap()[..], &large[..]);
    assert_eq!(
        store.stats().pages_rebuilt,
        1,
        "the page naming another stripe is rebuilt: {:?}",
        store.stats()
    );
    store.barrier_blocking(); // the read queued a repair; wait for it
    assert!(store.stats().segments_repaired >= 1, "{:?}", store.stats());
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(&store.read("f", 0).unwrap()[..], &large[..]);
    assert_eq!(
        store.stats().pages_rebuilt,
        0,
        "the repair wrote the page back under its own stripe"
    );
}

/// A [`small_config`] store in `dir`, changed by `edit`, with `n` records
/// appended (seed `seed`) and closed: its configuration, what it must
/// hold, and the generator to go on with.
fn appended_and_closed(
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
fn appends_go_on_and_survive_a_reopen(
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
fn reopened_after_damage_to_segment_3(
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
fn damaged_segment_3_is_rebuilt(
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

#[test]
fn a_corrupt_length_in_a_header_is_damage_not_a_torn_tail() {
    // Found by the random history: a flipped length byte makes the first
    // page "run past the end of the file"; cutting there would drop every
    // live page after it and let new pages land on their offsets.
    damaged_segment_3_is_rebuilt(21, 60, 1 << 20, |bytes, _| {
        bytes[15] ^= 0x5a; // high byte of the marker's body length
    });
}

#[test]
fn a_short_torn_tail_that_is_a_live_page_is_damage_not_cut() {
    // The last page of segment 3 belongs to an acknowledged stripe. A
    // flipped length byte makes it "run past the end of the file" with
    // nothing after it: a candidate as short as a real torn write. Only
    // its being live tells it apart; cutting it would zero an acknowledged
    // page (and scrub would then find the stripe short of it).
    damaged_segment_3_is_rebuilt(45, 60, 1 << 20, |bytes, len| {
        let mut last = 0usize;
        let mut at = 0usize;
        while at < len {
            last = at;
            at += page::header(&bytes[at..]).unwrap().page_len() as usize;
        }
        let h = page::header(&bytes[last..]).unwrap();
        assert!(
            matches!(h.kind, page::Kind::Ordered | page::Kind::Unordered),
            "the last page of segment 3 is a data page ({:?})",
            h.kind
        );
        assert!(last > 0, "segment 3 holds data pages after its marker");
        bytes[last + 15] ^= 0x5a; // high byte of its body length
    });
}

#[test]
fn a_torn_tail_is_cut_up_to_two_pages_a_data_shard_and_is_damage_past_that() {
    // A last page that runs past the end of its file, with data after its
    // start, is cut as a torn write only while that data is no longer
    // than one write could have torn: two pages per data shard and a
    // block. One byte more is damage, and the segment is rebuilt. Four
    // zones and three data shards, so that the bound's factors differ.
    let (k, page_bytes) = (3usize, 4096usize);
    let bound = 2 * k * page_bytes + 4096;
    for extra in [0, 1] {
        let (_dir, cfg, store, mut model, mut rng) = reopened_after_damage_to_segment_3(
            |c| {
                c.zones.push(c.zones[0].with_file_name("zone3"));
                c.data_shards = k;
                c.page_bytes = page_bytes as u32;
                c.segment_bytes = 1 << 20;
            },
            61,
            60,
            |bytes, len| {
                bytes.truncate(len);
                let body = vec![7u8; 2 * bound];
                let torn = page::encode(
                    &page::Header {
                        kind: page::Kind::Ordered,
                        shard: 0,
                        k: k as u8,
                        m: 1,
                        body_len: body.len() as u32,
                        stripe: 999_999,
                        payload_len: body.len() as u32,
                    },
                    &body,
                );
                bytes.extend_from_slice(&torn[..bound + extra]);
            },
        );
        let r = store.recovery().clone();
        if extra == 0 {
            assert_eq!(r.torn_bytes, bound as u64, "{r:?}");
            assert!(r.repaired_segments.is_empty(), "{r:?}");
        } else {
            assert_eq!(r.torn_bytes, 0, "{r:?}");
            assert_eq!(r.repaired_segments, vec![3], "{r:?}");
        }
        appends_go_on_and_survive_a_reopen(store, &cfg, &mut model, &mut rng, 30);
    }
}

/// Zeroes what the batch between the lengths `from` and `to` wrote to
/// segments 3 and 4 (two of the three pages of its stripe), as if those
/// writes never reached the disk. Inside the zero-filled space, a write
/// that never happened reads back as zeros.
fn lose_pages(dir: &Path, from: &[u64], to: &[u64]) {
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

#[test]
fn of_the_last_two_batches_a_torn_one_is_dropped_with_what_follows_it() {
    // The writer writes a batch while the one before it syncs, so the last
    // two batches can both be torn at a crash. Batches A then B (five
    // records each, one root stripe each) after 20 single appends.
    for torn in ["A", "B"] {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, store) = twenty_appends(dir.path());
        let lens = || data_lens(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let batch = |first: u8| -> Vec<bytes::Bytes> {
            (0..5).map(|i| vec![first + i; 300].into()).collect()
        };
        let l0 = lens();
        let a = rt
            .block_on(store.append_many("b", 0, 0, batch(0xa0)))
            .unwrap();
        let l1 = lens();
        let b = rt
            .block_on(store.append_many("b", 0, 0, batch(0xb0)))
            .unwrap();
        let l2 = lens();
        assert_eq!((a[0], b[0]), (20, 25));
        drop(store);
        if torn == "A" {
            lose_pages(dir.path(), &l0, &l1);
        } else {
            lose_pages(dir.path(), &l1, &l2);
        }
        let store = Store::open(cfg.clone()).unwrap();
        assert!(
            store.recovery().dropped_stripes >= 1,
            "{torn}: {:?}",
            store.recovery()
        );
        // A torn A takes B with it (neither was acknowledged); a torn B
        // leaves A, which may have been acknowledged before B was written.
        let tail = if torn == "A" { 20 } else { 25 };
        assert_eq!(store.bounds("b"), (0, tail), "torn {torn}");
        for i in 0..20u64 {
            assert_eq!(&store.read("b", i).unwrap()[..], &vec![i as u8; 100][..]);
        }
        for pos in 20..tail {
            let want = vec![0xa0 + (pos - 20) as u8; 300];
            assert_eq!(&store.read("b", pos).unwrap()[..], &want[..], "torn {torn}");
        }
        assert_eq!(
            store.append_blocking("b", 0, 0, b"after".to_vec()).unwrap(),
            tail
        );
        drop(store);
        let store = Store::open(cfg).unwrap();
        assert_eq!(store.bounds("b"), (0, tail + 1), "torn {torn}, reopened");
        assert_eq!(&store.read("b", tail).unwrap()[..], b"after");
    }
}

#[test]
fn a_batch_whose_end_writes_are_lost_from_every_copy_is_dropped_with_what_follows_it() {
    // The writer writes a batch while the round of the one before it
    // syncs, so a crash can leave the later batch's end-writes on disk and
    // none of the earlier one's: a hole in the stripe numbers. Neither
    // batch was acknowledged (answers go out in order), so both go, and
    // the open must not fail on the records after the hole.
    let dir = tempfile::tempdir().unwrap();
    let (cfg, store) = twenty_appends(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let batch =
        |first: u8| -> Vec<bytes::Bytes> { (0..5).map(|i| vec![first + i; 300].into()).collect() };
    let a = rt
        .block_on(store.append_many("b", 0, 0, batch(0xa0)))
        .unwrap();
    let b = rt
        .block_on(store.append_many("b", 0, 0, batch(0xb0)))
        .unwrap();
    assert_eq!((a[0], b[0]), (20, 25));
    drop(store);
    // Every copy of A's end-write fails its checksum; B's are intact.
    let holds_a = |bytes: &[u8]| {
        melddb_log::stripe::decode_end_write(&bytes[page::HEADER..])
            .is_ok_and(|ew| ew.entries.iter().any(|e| e.log == "b" && e.pos == 20))
    };
    let mut edited = Vec::new();
    for _ in 0..3 {
        edited.push(edit_first_page_in(
            &seg_files(dir.path()),
            "end-write of batch A",
            false,
            |h, bytes| {
                if h.kind != page::Kind::EndWrite || !holds_a(bytes) {
                    return false;
                }
                // A version no decoder takes, so the next look skips it.
                bytes[page::HEADER] ^= 0xff;
                true
            },
        ));
    }
    edited.sort();
    edited.dedup();
    assert_eq!(edited.len(), 3, "three copies on three segments");
    let store = Store::open(cfg.clone()).unwrap();
    let report = store.recovery().clone();
    assert!(report.dropped_stripes >= 1, "{report:?}");
    assert_eq!(report.records, 20, "{report:?}");
    assert_eq!(store.bounds("b"), (0, 20), "A and B are gone");
    twenty_kept_and_the_next_append_stays(&cfg, store);
}

#[test]
fn appends_arriving_while_a_batch_syncs_get_the_next_positions_and_retries_join_it() {
    // Slow fsyncs hold each batch in flight while the writer takes the next
    // one: positions must continue after the syncing batch, a retry of a
    // request in it must be answered with it (not appended again), and a
    // failed round must fail the batch written after it too.
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let faults = Arc::new(Faults::none());
    let store = Arc::new(Store::open_with_faults(cfg.clone(), faults.clone()).unwrap());
    let hold = std::time::Duration::from_millis(400);
    let later = std::time::Duration::from_millis(150);
    let append = |client: u64, request: u64, body: &'static [u8]| {
        let store = store.clone();
        std::thread::spawn(move || store.append_blocking("p", client, request, body.to_vec()))
    };
    faults.slow_syncs(hold);
    let first = append(7, 1, b"first");
    std::thread::sleep(later);
    let retry = append(7, 1, b"first");
    let second = append(7, 2, b"second");
    let anonymous = append(0, 0, b"third");
    let first = first.join().unwrap().unwrap();
    assert_eq!(first, 0);
    assert_eq!(
        retry.join().unwrap().unwrap(),
        0,
        "the retry joined the syncing batch"
    );
    let mut rest = [
        second.join().unwrap().unwrap(),
        anonymous.join().unwrap().unwrap(),
    ];
    rest.sort();
    assert_eq!(rest, [1, 2], "positions continue after the syncing batch");
    assert_eq!(store.bounds("p"), (0, 3));

    // A round that fails: the batch written while it ran fails with it.
    faults.fail_syncs(true);
    let doomed = append(7, 3, b"doomed");
    std::thread::sleep(later);
    let behind = append(7, 4, b"behind");
    for r in [doomed.join().unwrap(), behind.join().unwrap()] {
        let e = r.expect_err("a failed round acknowledges nothing");
        assert!(matches!(e, StoreError::WriteFailed(_)), "{e}");
        // One prefix, not the error wrapped in itself.
        assert_eq!(e.to_string().matches("write failed").count(), 1, "{e}");
    }
    faults.fail_syncs(false);
    faults.slow_syncs(std::time::Duration::ZERO);
    assert_eq!(
        store
            .append_blocking("p", 7, 4, b"behind".to_vec())
            .unwrap(),
        3
    );
    assert_eq!(store.bounds("p"), (0, 4));
    let want: [&[u8]; 4] = [b"first", b"second", b"third", b"behind"];
    let check = |s: &Store| {
        let got: Vec<Vec<u8>> = (0..4).map(|i| s.read("p", i).unwrap().to_vec()).collect();
        let mut sorted_mid = [got[1].clone(), got[2].clone()];
        sorted_mid.sort();
        assert_eq!(got[0], want[0]);
        assert_eq!(sorted_mid, [want[1].to_vec(), want[2].to_vec()]);
        assert_eq!(got[3], want[3]);
    };
    check(&store);
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.bounds("p"), (0, 4));
    check(&store);
}

#[test]
fn stage_histograms_put_a_slow_disk_and_a_slow_write_where_they_belong() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(small_config(dir.path()), faults.clone()).unwrap();
    let ms = |s: f64| std::time::Duration::from_secs_f64(s / 1e3);

    // Slow fsyncs: every round, and so every acknowledgement, takes at
    // least the delay.
    faults.slow_syncs(ms(40.0));
    let t0 = store.stages();
    for i in 0..4u64 {
        store.append_blocking("s", 7, i, vec![1u8; 100]).unwrap();
    }
    let d = store.stages().since(&t0).summary();
    assert_eq!(d.queued.count, 4);
    assert_eq!(d.acked.count, 4);
    assert!(d.round.count >= 4, "{d:?}");
    // One answer per batch (one append each). The answer stage ends after
    // the replies, so the last batch's may be counted just after its
    // append returned.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut answered = d.answer.count;
    while answered < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(ms(1.0));
        answered = store.stages().since(&t0).summary().answer.count;
    }
    assert_eq!(answered, 4, "{d:?}");
    assert!(d.round.p50_ms >= 40.0, "{d:?}");
    assert!(d.acked.p50_ms >= 40.0, "{d:?}");
    assert!(d.acked.mean_ms >= 40.0, "{d:?}");

    // Slow writes instead: the write stage carries the delay.
    faults.slow_syncs(ms(0.0));
    faults.slow_writes(ms(40.0));
    let t1 = store.stages();
    for i in 4..8u64 {
        store.append_blocking("s", 7, i, vec![2u8; 100]).unwrap();
    }
    let d = store.stages().since(&t1).summary();
    assert_eq!(d.write.count, 4, "one batch per blocking append");
    assert!(d.write.p50_ms >= 40.0, "{d:?}");
    assert!(d.acked.p50_ms >= 40.0, "{d:?}");

    // The totals since open are in `stats` too.
    let s = store.stats();
    assert_eq!(s.stages.acked.count, 8);
    assert_eq!(s.stages.acked.count, s.appends);

    // Filling segments (64 KiB here) slides the windows, each slide timed.
    faults.slow_writes(ms(0.0));
    let t2 = store.stages();
    for i in 8..60u64 {
        store.append_blocking("s", 7, i, vec![3u8; 4096]).unwrap();
    }
    let d = store.stages().since(&t2).summary();
    assert!(d.slide.count > 0, "{d:?}");
    assert_eq!(d.acked.count, 52);
}

#[test]
fn appends_during_a_round_join_one_batch_and_a_failed_join_fails_alone() {
    // While a slow round syncs batch A, each arriving append is written at
    // once into the one batch that syncs next: retries of its requests are
    // answered with them, a write that fails takes only its own appends
    // down, and a reopen sees exactly what was acknowledged.
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let faults = Arc::new(Faults::none());
    let store = Arc::new(Store::open_with_faults(cfg.clone(), faults.clone()).unwrap());
    let append = |request: u64, body: &'static [u8]| {
        let store = store.clone();
        std::thread::spawn(move || store.append_blocking("j", 5, request, body.to_vec()))
    };
    let pause = || std::thread::sleep(std::time::Duration::from_millis(40));
    let batches_before = store.stats().batches;
    faults.slow_syncs(std::time::Duration::from_millis(500));
    let a = append(0, b"a");
    std::thread::sleep(std::time::Duration::from_millis(100));
    let b1 = append(1, b"b1");
    pause();
    let b2 = append(2, b"b2");
    pause();
    let retry = append(1, b"b1");
    pause();
    // The next write fails (torn): only b3, written during the round too.
    faults.fail_write_after(0, true);
    let b3 = append(3, b"b3");
    let b3 = b3.join().unwrap();
    assert!(
        matches!(b3, Err(StoreError::WriteFailed(_))),
        "the failed write fails its own append: {b3:?}"
    );
    assert_eq!(a.join().unwrap().unwrap(), 0);
    assert_eq!(b1.join().unwrap().unwrap(), 1);
    assert_eq!(b2.join().unwrap().unwrap(), 2);
    assert_eq!(retry.join().unwrap().unwrap(), 1, "the retry joined b1");
    assert_eq!(
        store.stats().batches - batches_before,
        2,
        "a, then b1 and b2 together"
    );
    faults.slow_syncs(std::time::Duration::ZERO);
    assert_eq!(store.append_blocking("j", 5, 3, b"b3".to_vec()).unwrap(), 3);
    let want: [&[u8]; 4] = [b"a", b"b1", b"b2", b"b3"];
    let check = |s: &Store| {
        assert_eq!(s.bounds("j"), (0, 4));
        for (i, w) in want.iter().enumerate() {
            assert_eq!(&s.read("j", i as u64).unwrap()[..], *w);
        }
    };
    check(&store);
    drop(store);
    let store = Store::open(cfg).unwrap();
    check(&store);
    assert_eq!(store.scrub_blocking().bad_pages, 0);
}

/// Opening a store faults in its request-id table by filling it with
/// placeholder ids and emptying it again (recovery's `prefault`). None of
/// them may answer a real append, before or after a reopen, and real ids
/// must still deduplicate.
#[test]
fn no_placeholder_request_id_survives_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.dedup_window = 4096;
    let bodies: [&[u8]; 3] = [b"zero", b"one", b"five"];
    let requests = [0u64, 1, 5];
    {
        let store = Store::open(cfg.clone()).unwrap();
        for (i, (&req, body)) in requests.iter().zip(bodies).enumerate() {
            let pos = store.append_blocking("l", u64::MAX, req, body).unwrap();
            assert_eq!(
                pos, i as u64,
                "request {req} was answered without being written"
            );
        }
        assert_eq!(
            store
                .append_blocking("l", u64::MAX, 1, &b"one"[..])
                .unwrap(),
            1,
            "a retry is answered with its first position"
        );
    }
    let store = Store::open(cfg).unwrap();
    assert_eq!(
        store
            .append_blocking("l", u64::MAX, 5, &b"five"[..])
            .unwrap(),
        2,
        "a retry after a reopen is answered with its first position"
    );
    assert_eq!(
        store
            .append_blocking("l", u64::MAX, 7, &b"seven"[..])
            .unwrap(),
        3
    );
    for (i, body) in bodies.iter().chain([&&b"seven"[..]]).enumerate() {
        assert_eq!(&store.read("l", i as u64).unwrap()[..], *body);
    }
}

fn spare_files(dir: &Path) -> Vec<(PathBuf, u64)> {
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

fn wait_for_spares(store: &Store, want: u64) {
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

/// With the default configuration a store keeps spares, and its open
/// does not wait for them: it returns with the pool short (the refill
/// writes nothing until the log has been quiet for a while, and then at
/// `prepare_mib_s`, 48 MiB here), and the pool fills afterwards, in the
/// background, while the store takes appends.
#[test]
fn a_default_open_returns_before_its_spares_and_they_become_ready_afterwards() {
    let dir = tempfile::tempdir().unwrap();
    let zones: Vec<PathBuf> = (0..3)
        .map(|z| dir.path().join(format!("zone{z}")))
        .collect();
    let mut cfg = Config::with_zones(zones);
    cfg.page_bytes = 4096;
    cfg.segment_bytes = 4 << 20;
    cfg.max_record_bytes = 256 << 10;
    let want = 3 * u64::from(cfg.prepared_segments);
    assert!(want > 0, "spares are on by default");
    let store = Store::open(cfg).unwrap();
    let at_open = store.stats();
    assert!(
        at_open.spares_ready < want && at_open.segments_prepared < want,
        "the open waited for its spares: {at_open:?}"
    );
    assert_eq!(store.append_blocking("a", 0, 0, b"x".to_vec()).unwrap(), 0);
    wait_for_spares(&store, want);
    assert_eq!(store.stats().spares_ready, want);
    assert_eq!(spare_files(dir.path()).len() as u64, want);
    assert_eq!(&store.read("a", 0).unwrap()[..], b"x");
}

#[test]
fn spares_become_data_segments_and_leftovers_are_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.prepared_segments = 2;
    let seg_bytes = cfg.segment_bytes;
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    assert_eq!(store.segments_blocking().len(), 9);
    // The refill writes two spares per zone in the background while
    // nothing is appended.
    wait_for_spares(&store, 6);
    assert_eq!(store.stats().segments_prepared, 6);
    let spares = spare_files(dir.path());
    assert_eq!(spares.len(), 6, "{spares:?}");
    assert!(
        spares.iter().all(|(_, len)| *len == seg_bytes),
        "{spares:?}"
    );

    // Slide the windows several times; everything reads back, across a
    // reopen that adopts the spares on disk instead of writing new ones.
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut model = Model::new();
    for _ in 0..6 {
        append_burst(&store, &mut model, &mut rng, 40);
        check(&store, &model);
    }
    assert!(windows_slid(&store), "the windows slid");
    wait_for_spares(&store, 6);
    // The slides took spares, and the refill made new ones.
    assert!(store.stats().segments_prepared > 6, "{:?}", store.stats());
    drop(store);
    // A spare cut short by a crash and one of another size are removed.
    let zone0 = dir.path().join("zone0");
    std::fs::write(zone0.join("spare-0000000000009998.tmp"), vec![0u8; 100]).unwrap();
    std::fs::write(zone0.join("spare-0000000000009999.dat"), vec![0u8; 100]).unwrap();
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    assert_eq!(store.stats().segments_prepared, 0, "adopted, not rewritten");
    let spares = spare_files(dir.path());
    assert_eq!(spares.len(), 6, "{spares:?}");
    assert!(
        spares.iter().all(|(_, len)| *len == seg_bytes),
        "{spares:?}"
    );
    check(&store, &model);
    append_burst(&store, &mut model, &mut rng, 40);
    check(&store, &model);
    drop(store);

    // Wanting one more spare per zone: the new ones are numbered past
    // every spare on disk, so none replaces one adopted. One spare per
    // zone, the highest number in zone 0, which takes the first new one.
    for (path, _) in spare_files(dir.path()) {
        std::fs::remove_file(path).unwrap();
    }
    for (z, n) in [(0, 99), (1, 97), (2, 98)] {
        let name = format!("spare-{n:016}.dat");
        let path = dir.path().join(format!("zone{z}")).join(name);
        std::fs::write(path, vec![0u8; seg_bytes as usize]).unwrap();
    }
    cfg.prepared_segments = 3;
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    wait_for_spares(&store, 9);
    let spares = spare_files(dir.path());
    assert_eq!(spares.len(), 9, "{spares:?}");
    assert_eq!(store.stats().segments_prepared, 6);
    check(&store, &model);
    drop(store);

    // Without spares configured, the open removes them and segments
    // start empty again.
    cfg.prepared_segments = 0;
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    assert!(spare_files(dir.path()).is_empty());
    appends_go_on_and_survive_a_reopen(store, &cfg, &mut model, &mut rng, 40);
}

#[test]
fn live_pages_past_a_long_zeroed_run_are_found_through_their_end_writes() {
    // Recovery looks only a little way past the end of an open data
    // segment's data for the rest of a page whose header was lost. Damage
    // that zeroes more than that (a header and the pages after it) hides
    // live pages from the scan; their end-writes still name them, and the
    // segment must be rebuilt instead of new pages landing on them.
    let near = scan_reach();
    damaged_segment_3_is_rebuilt(33, 400, 8 << 20, |bytes, len| {
        assert!(
            len > 29 + near + 1000,
            "the test needs more data in the segment than the scan looks past ({len})"
        );
        // Everything after the class marker but the last kilobyte.
        bytes[29..len - 1000].fill(0);
    });
}

#[test]
fn the_recovery_report_counts_the_segments_their_data_and_what_was_read() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, model, _) = appended_and_closed(dir.path(), |c| c.segment_bytes = 1 << 20, 5, 200);
    let files = seg_files(dir.path());
    // One copy of an end-write fails its checksum: one corrupt page, the
    // other two copies still index its stripe.
    edit_first_page_in(&files, "end-write", false, |h, bytes| {
        let ew = h.kind == page::Kind::EndWrite;
        if ew {
            bytes[page::HEADER] ^= 0x01;
        }
        ew
    });
    let data: u64 = files.iter().map(|f| data_len(f)).sum();
    let on_disk: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    let store = Store::open(cfg).unwrap();
    let r = store.recovery();
    assert_eq!(r.segments, files.len(), "{r:?}");
    assert_eq!(r.bytes, data, "{r:?}");
    assert!(r.bytes_read > 0 && r.bytes_read <= on_disk, "{r:?}");
    assert_eq!(r.corrupt_pages, 1, "{r:?}");
    // Three copies of each stripe's end-write, one of them lost.
    assert!(r.stripes > 0, "{r:?}");
    assert_eq!(r.end_writes, 3 * r.stripes - 1, "{r:?}");
    check(&store, &model);
}

/// How far past an open data segment's data recovery looks for the rest
/// of a page whose header was lost: two pages with their headers, and a
/// read window (`near` in `recovery.rs`).
fn scan_reach() -> usize {
    2 * (small_config(Path::new("")).page_bytes as usize + 28) + (64 << 10)
}

/// Puts one non-zero byte at `at` of a segment's bytes, growing the file
/// to hold it.
fn stray_byte_at(bytes: &mut Vec<u8>, at: usize) {
    bytes.resize(bytes.len().max(at + 1), 0);
    bytes[at] = 0x5a;
}

#[test]
fn stray_bytes_at_the_far_end_of_the_scans_reach_are_damage() {
    // A crash that loses a page's header can leave the page after it on
    // disk; its last byte lies at the far end of the reach. Found, the
    // segment is rebuilt.
    damaged_segment_3_is_rebuilt(33, 400, 8 << 20, |bytes, len| {
        stray_byte_at(bytes, len + scan_reach() - 1)
    });
}

#[test]
fn stray_bytes_past_the_scans_reach_are_not_read() {
    // Past the reach an open segment's tail can be a whole spare's zeros,
    // which recovery must not read at every start. A byte just past it is
    // not seen: nothing is rebuilt, the log is whole, and appends go on.
    let (_dir, cfg, store, mut model, mut rng) = reopened_after_damage_to_segment_3(
        |c| c.segment_bytes = 8 << 20,
        33,
        400,
        |bytes, len| stray_byte_at(bytes, len + scan_reach()),
    );
    assert!(
        store.recovery().repaired_segments.is_empty(),
        "{:?}",
        store.recovery()
    );
    appends_go_on_and_survive_a_reopen(store, &cfg, &mut model, &mut rng, 60);
}

/// Set in the child process of
/// [`a_disk_that_refuses_spares_opens_and_appends_without_them`].
const FULL_DISK_CHILD: &str = "MELDDB_LOG_TEST_FULL_DISK_DIR";

#[test]
fn a_disk_that_refuses_spares_opens_and_appends_without_them() {
    // A full disk, as the process sees it: the child runs under a file
    // size limit (`ulimit -f`, SIGXFSZ ignored so a write past it fails
    // with EFBIG instead of killing the process) smaller than one spare.
    // Spares only make appends faster, so the open must go on without
    // them, leave no partial spare behind, and the log must work; the
    // refill's retries must not keep the store from closing.
    if let Some(dir) = std::env::var_os(FULL_DISK_CHILD) {
        full_disk_child(Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 512; exec \"$0\" \"$@\"")
        .arg(&exe)
        .args([
            "--exact",
            "a_disk_that_refuses_spares_opens_and_appends_without_them",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FULL_DISK_CHILD, dir.path())
        .output()
        .expect("bash runs the child");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("full-disk child done"),
        "the child did not run the checks:\n{text}"
    );
}

fn full_disk_child(dir: &Path) {
    use std::io::Write;
    // The limit is in force: 600 KiB cannot be written.
    let probe = dir.join("probe");
    let big = std::fs::File::create(&probe)
        .unwrap()
        .write_all(&vec![0u8; 600 << 10]);
    assert_eq!(
        big.err().and_then(|e| e.raw_os_error()),
        Some(27), // EFBIG
        "the file size limit is not in force"
    );
    std::fs::remove_file(&probe).unwrap();

    let mut cfg = small_config(dir);
    cfg.segment_bytes = 1 << 20; // a spare is twice the limit
    cfg.prepared_segments = 2;
    let store = Store::open(cfg.clone()).expect("opens without spares");
    common::wait_for_stats(&store, "a failed spare", |s| s.spares_failed >= 1);
    assert_eq!(store.stats().spares_ready, 0, "{:?}", store.stats());
    assert_eq!(store.stats().segments_prepared, 0);
    assert!(spare_files(dir).is_empty(), "{:?}", spare_files(dir));
    for i in 0..60u64 {
        let rec = vec![i as u8; 1000];
        assert_eq!(store.append_blocking("a", 0, 0, rec).unwrap(), i);
    }
    // Quiet long enough for the refill to try (and fail) again; the
    // failure is counted.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while store.stats().spares_failed < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(store.stats().spares_failed >= 2, "{:?}", store.stats());
    // ...and then tried again only every 10 s, not in a busy loop (a
    // slower host makes fewer tries, never more).
    let failed = store.stats().spares_failed;
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(
        store.stats().spares_failed <= failed + 1,
        "the refill retried {} times in 1 s",
        store.stats().spares_failed - failed
    );
    for i in 0..60u64 {
        assert_eq!(&store.read("a", i).unwrap()[..], &vec![i as u8; 1000][..]);
    }
    drop(store);
    assert!(spare_files(dir).is_empty(), "{:?}", spare_files(dir));
    let store = Store::open(cfg).expect("reopens without spares");
    assert_eq!(store.bounds("a"), (0, 60));
    assert_eq!(store.append_blocking("a", 0, 0, b"x".to_vec()).unwrap(), 60);
    drop(store);
    println!("full-disk child done");
}

/// `flush_once_per_device`: rounds write segments made from spares back
/// and flush the device once; segments that are not from spares, and
/// every segment with the option off, are fsynced one by one. Records
/// read back either way, across a reopen.
#[test]
fn rounds_write_back_spare_segments_and_fsync_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let supported = write_back_supported(dir.path());
    for (spares, once) in [(2, true), (2, false), (0, true)] {
        let sub = dir.path().join(format!("s{spares}-{once}"));
        let mut cfg = small_config(&sub);
        cfg.prepared_segments = spares;
        cfg.tuning.flush_once_per_device = once;
        common::spares_on_disk(&cfg);
        let store = Arc::new(Store::open(cfg.clone()).unwrap());
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut model = Model::new();
        for _ in 0..4 {
            append_burst(&store, &mut model, &mut rng, 40);
            check(&store, &model);
        }
        let s = store.stats();
        let what = format!("spares {spares}, flush once {once}: {s:?}");
        if spares > 0 && once && supported {
            assert!(s.write_backs > 0, "{what}");
            assert!(s.flushes > 0 && s.flushes <= s.batches, "{what}");
        } else {
            assert_eq!((s.write_backs, s.flushes), (0, 0), "{what}");
        }
        drop(store);
        let store = Store::open(cfg).unwrap();
        check(&store, &model);
    }
}

/// A failed batch is cut off the segments it wrote, zeros of their spares
/// included: from there on those segments are fsynced, not written back
/// (their pages now extend the file); the others still are.
#[test]
fn a_rolled_back_spare_segment_is_fsynced_from_then_on() {
    let dir = tempfile::tempdir().unwrap();
    if !write_back_supported(dir.path()) {
        common::skip("the temporary directory is not on ext4 or XFS");
        return;
    }
    let mut cfg = small_config(dir.path());
    cfg.segment_bytes = 1 << 20;
    cfg.prepared_segments = 2;
    common::spares_on_disk(&cfg);
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
    let mut model = Model::new();
    let append = |store: &Store, model: &mut Model, i: u32| {
        let bytes = format!("record {i}").into_bytes();
        let pos = store.append_blocking("log", 0, 0, bytes.clone()).unwrap();
        let e = model.entry("log".into()).or_insert((pos, Vec::new()));
        e.1.push(bytes);
    };
    // The open's window markers are written back too (the segments are
    // spares): counted from here.
    let opened = store.stats();
    for i in 0..20 {
        append(&store, &mut model, i);
    }
    // Each batch writes a root stripe's three pages (one per data
    // segment) and three end-writes, all six to segments made from spares.
    let before = store.stats();
    assert_eq!(
        before.write_backs - opened.write_backs,
        6 * 20,
        "{before:?}"
    );
    // The batch's second write fails: the first segment it wrote is cut
    // back, the batch fails.
    faults.fail_write_after(1, false);
    assert!(store
        .append_blocking("log", 0, 0, b"lost".to_vec())
        .is_err());
    let failed = store.stats();
    for i in 20..40 {
        append(&store, &mut model, i);
    }
    let after = store.stats();
    assert_eq!(after.write_backs - failed.write_backs, 5 * 20, "{after:?}");
    check(&store, &model);
    drop(store);
    check(&Store::open(cfg).unwrap(), &model);
}

/// No write of a failed batch landed after all: every segment file's
/// pages end where the writer's data does.
fn pages_end_where_the_writer_says(store: &Store, dir: &Path) {
    for s in store.segments_blocking() {
        let bytes = std::fs::read(seg_path(dir, s.id)).unwrap();
        assert_eq!(data_end(&bytes) as u64, s.len, "segment {}", s.id);
    }
}

/// Whether the file system under `dir` takes `O_DIRECT` (tmpfs does not;
/// the store then writes buffered, and the direct path is not tested).
fn o_direct_works(dir: &Path) -> bool {
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
fn all_segment_bytes(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    seg_files(dir)
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p.strip_prefix(dir).unwrap().to_path_buf(), bytes)
        })
        .collect()
}

/// Direct writes change how pages reach the disk, never what: the same
/// appends, one batch at a time, leave every segment file byte for byte
/// as buffered writes do, across slides, seals, multi-stripe records and
/// a reopen; and the direct path really ran.
#[test]
fn direct_writes_leave_the_same_bytes_as_buffered_ones() {
    let mut files = Vec::new();
    for direct in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path());
        cfg.tuning.direct_writes = direct;
        cfg.tuning.direct_write_min_bytes = 4096;
        let mut rng = ChaCha8Rng::seed_from_u64(77);
        let mut model = Model::new();
        let mut store = Store::open(cfg.clone()).unwrap();
        let mut direct_bytes = 0;
        for i in 0..300u64 {
            if i == 150 {
                direct_bytes += store.stats().direct_write_bytes;
                drop(store);
                store = Store::open(cfg.clone()).unwrap();
            }
            let log = ["d", "e"][rng.random_range(0..2)];
            let body = record(&mut rng, 120_000);
            let pos = store.append_blocking(log, 3, i, body.clone()).unwrap();
            let e = model.entry(log.to_string()).or_insert((0, Vec::new()));
            assert_eq!(pos, e.1.len() as u64);
            e.1.push(body);
        }
        check(&store, &model);
        direct_bytes += store.stats().direct_write_bytes;
        if !direct {
            assert_eq!(direct_bytes, 0);
        } else if o_direct_works(dir.path()) {
            assert!(
                direct_bytes > 1 << 20,
                "{direct_bytes} bytes written directly"
            );
        }
        assert!(windows_slid(&store), "the windows slid");
        drop(store);
        files.push(all_segment_bytes(dir.path()));
    }
    let (base, other) = (&files[0], &files[1]);
    assert_eq!(
        base.keys().collect::<Vec<_>>(),
        other.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in base {
        assert!(bytes == &other[name], "{} differs", name.display());
    }
}

fn sealed_count(store: &Store) -> usize {
    store
        .segments_blocking()
        .iter()
        .filter(|s| s.class == class::SEALED)
        .count()
}

fn append_one(store: &Store, model: &mut Model, bytes: Vec<u8>) {
    let pos = store.append_blocking("log", 0, 0, bytes.clone()).unwrap();
    let e = model.entry("log".into()).or_insert((pos, Vec::new()));
    assert_eq!(pos, e.0 + e.1.len() as u64, "positions are dense");
    e.1.push(bytes);
}

/// The data segments fill in step; when they do, the base moves past all
/// of them, and past the end-write window they would join, in one step
/// (one slide, whose markers become durable together), not one segment
/// at a time with an fsync per marker.
#[test]
fn a_full_data_window_slides_past_every_full_segment_in_one_step() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let width = cfg.stripe_width();
    let store = Store::open(cfg.clone()).unwrap();
    let mut model = Model::new();
    let mut steps = 0;
    for i in 0..200u32 {
        let (slides, sealed) = (store.stats().stages.slide.count, sealed_count(&store));
        append_one(&store, &mut model, vec![i as u8; 3000]);
        let slid = store.stats().stages.slide.count - slides;
        let newly_sealed = sealed_count(&store) - sealed;
        assert!(slid <= 1, "append {i}: {slid} slides");
        if newly_sealed >= width {
            assert_eq!(slid, 1, "append {i}: {newly_sealed} sealed");
            steps += 1;
        }
    }
    assert!(steps >= 2, "the data window filled {steps} times");
    check(&store, &model);
    drop(store);
    check(&Store::open(cfg).unwrap(), &model);
}

/// With `fsync = false` no round syncs anything, window slides
/// included: a slide's class markers go to the page cache like pages
/// (they used to be synced, which made a slide wait for every page
/// written since the last one, 2.3 s in a 150K appends/s probe). What was
/// appended still reads back after the store closes and opens again, and
/// with fsync on, the same appends do sync (the count is not stuck at 0).
#[test]
fn without_fsync_window_slides_sync_nothing_and_lose_nothing() {
    for fsync in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path());
        cfg.fsync = fsync;
        let store = Store::open(cfg.clone()).unwrap();
        let mut model = Model::new();
        for i in 0..120u32 {
            append_one(&store, &mut model, vec![i as u8; 3000]);
        }
        let st = store.stats();
        assert!(
            st.stages.slide.count >= 2,
            "fsync {fsync}: {} slides",
            st.stages.slide.count
        );
        assert_eq!(st.durable, fsync, "the stats report the mode");
        let synced = st.fsyncs + st.write_backs + st.flushes;
        if fsync {
            assert!(synced > 0, "with fsync on, nothing was synced");
        } else {
            assert_eq!(
                (st.fsyncs, st.write_backs, st.flushes),
                (0, 0, 0),
                "without fsync, fsyncs, write-backs and flushes"
            );
        }
        check(&store, &model);
        drop(store);
        check(&Store::open(cfg).unwrap(), &model);
    }
}

fn copy_dir(from: &Path, to: &Path) {
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
fn new_markers(before: &Path, after: &Path) -> Vec<(PathBuf, u64, Vec<u8>)> {
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

/// A window slide writes its markers (seals, raised classes) and makes
/// them durable together, in no order among themselves. So a crash
/// during the slide may keep any subset of them. From each such state
/// the store must open with every acknowledged append, none of the
/// append whose batch came after the slide, classes that never increase
/// with the segment id, and go on appending. Both with new segments made
/// empty and made from spares (renamed, full of zeros).
#[test]
fn any_subset_of_a_slides_markers_recovers() {
    for spares in [0, 2] {
        any_subset_of_a_slides_markers_recovers_case(spares);
    }
}

fn any_subset_of_a_slides_markers_recovers_case(spares: u32) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let before = dir.path().join("before");
    let config = |dir: &Path| Config {
        prepared_segments: spares,
        ..small_config(dir)
    };
    let mut model = Model::new();
    // Append one record per open until one makes the windows slide,
    // keeping a copy of the store as it was before that append.
    drop(Store::open(config(&live)).unwrap());
    let mut slid = false;
    for i in 0..200u32 {
        let _ = std::fs::remove_dir_all(&before);
        copy_dir(&live, &before);
        let store = Store::open(config(&live)).unwrap();
        if spares > 0 {
            wait_for_spares(&store, 3 * u64::from(spares));
        }
        let mut next = model.clone();
        append_one(&store, &mut next, vec![i as u8; 3000]);
        slid = store.stats().stages.slide.count > 0;
        drop(store);
        if slid {
            break;
        }
        model = next;
    }
    assert!(slid, "the windows never slid");
    let markers = new_markers(&before, &live);
    let made: Vec<u64> = seg_files(&live)
        .iter()
        .filter(|f| !before.join(f.strip_prefix(&live).unwrap()).exists())
        .map(|f| std::fs::metadata(f).unwrap().len())
        .collect();
    let from_spares = made.iter().filter(|&&len| len == 64 << 10).count();
    assert!(!made.is_empty(), "the slide made no segment");
    assert_eq!(from_spares > 0, spares > 0, "segments made: {made:?}");
    let width = config(&live).stripe_width();
    assert!(
        markers.len() > width,
        "a slide past the full data window wrote {} markers",
        markers.len()
    );
    // Which markers survive: none, all, each alone, all but each, and
    // random subsets.
    let n = markers.len();
    let mut subsets: Vec<Vec<bool>> = vec![vec![false; n], vec![true; n]];
    for i in 0..n {
        subsets.push((0..n).map(|j| j == i).collect());
        subsets.push((0..n).map(|j| j != i).collect());
    }
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..16 {
        subsets.push((0..n).map(|_| rng.random_bool(0.5)).collect());
    }
    for (k, keep) in subsets.iter().enumerate() {
        let crashed = dir.path().join(format!("crash{k}"));
        copy_dir(&before, &crashed);
        // The files are as the slide left them, names durable before any
        // marker was written: spares it took are gone, the segments it
        // made exist (empty, or a spare's zeros)...
        for z in 0..3 {
            for e in std::fs::read_dir(crashed.join(format!("zone{z}"))).unwrap() {
                let p = e.unwrap().path();
                let rel = p.strip_prefix(&crashed).unwrap();
                if !live.join(rel).exists() {
                    std::fs::remove_file(&p).unwrap();
                }
            }
        }
        for f in seg_files(&live) {
            let path = crashed.join(f.strip_prefix(&live).unwrap());
            if !path.exists() {
                let new = std::fs::File::create(&path).unwrap();
                if spares > 0 {
                    new.set_len(std::fs::metadata(&f).unwrap().len()).unwrap();
                }
            }
        }
        // ...and the kept markers are in place.
        for ((rel, off, page), _) in markers.iter().zip(keep).filter(|(_, &k)| k) {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(crashed.join(rel))
                .unwrap();
            f.write_all_at(page, *off).unwrap();
        }
        let what = format!("spares {spares}, markers kept {keep:?}");
        let store = Store::open(config(&crashed)).unwrap_or_else(|e| panic!("{what}: {e}"));
        check(&store, &model);
        segments_with_falling_classes(&store, &what);
        let mut model = model.clone();
        for i in 0..40u32 {
            append_one(&store, &mut model, vec![i as u8; 3000]);
        }
        check(&store, &model);
        drop(store);
        check(&Store::open(config(&crashed)).unwrap(), &model);
        std::fs::remove_dir_all(&crashed).unwrap();
    }
}

/// A classed segment file far past the windows (foreign or damaged: no
/// crash leaves one there) moves the base past it at the open in one
/// step, and the store goes on: the open must not count up to it one
/// segment at a time (2^40 steps here).
#[test]
fn a_classed_segment_far_past_the_windows_does_not_stall_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, mut model, mut rng) = appended_and_closed(dir.path(), |_| {}, 5, 30);
    let far = 1u64 << 40;
    std::fs::write(
        seg_path(dir.path(), far),
        page::class_marker(class::ORDERED),
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let c = cfg.clone();
    std::thread::spawn(move || {
        let _ = tx.send(Store::open(c));
    });
    let store = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the open did not finish within 60 s")
        .unwrap();
    check(&store, &model);
    let segs = segments_with_falling_classes(&store, "after the open");
    assert!(
        segs.iter()
            .any(|s| s.id == far && s.class == class::ORDERED),
        "{segs:?}"
    );
    let store = Arc::new(store);
    appends_go_on_and_survive_a_reopen(store, &cfg, &mut model, &mut rng, 30);
}

#[test]
fn a_batch_of_tiny_records_with_the_longest_log_name_fits_the_smallest_segments() {
    // End-writes list every record with its log name, so 16,384 one-byte
    // records under a 64-byte name take far more end-write bytes than
    // data bytes, and far more than one 16 KiB segment (four 4 KiB
    // pages, the least the config accepts). The batch must still land
    // whole, read back across a reopen, and leave the store appending.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.segment_bytes = 4 * cfg.page_bytes as u64;
    let store = Store::open(cfg.clone()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let log = "x".repeat(64);
    let records: Vec<Vec<u8>> = (0..16384u32).map(|i| vec![(i % 251) as u8]).collect();
    let pos = rt
        .block_on(store.append_many(
            &log,
            7,
            0,
            records.iter().map(|r| r.clone().into()).collect(),
        ))
        .unwrap();
    assert_eq!(pos, (0..16384).collect::<Vec<u64>>());
    let segments = rt.block_on(store.segments()).len() as u64;
    assert!(
        segments < cfg.max_segments,
        "{segments} segments of at most {}",
        cfg.max_segments
    );
    drop(store);
    let store = Store::open(cfg).unwrap();
    let mut model = Model::new();
    model.insert(log.clone(), (0, records));
    check(&store, &model);
    assert_eq!(
        store
            .append_blocking(&log, 7, 16384, b"after".to_vec())
            .unwrap(),
        16384
    );
}

/// Two stores on one set of zones would both number segments and rewrite
/// the metadata. The second open is refused while the first holds any of
/// the zones, and goes on once the first has shut down (without being
/// dropped: it still reads) with everything the first wrote.
#[test]
fn a_second_open_of_held_zones_is_refused_until_the_first_shuts_down() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let first = Store::open(cfg.clone()).unwrap();
    first.append_blocking("a", 0, 0, b"one".to_vec()).unwrap();
    // Sharing one zone is enough.
    let mut overlapping = cfg.clone();
    overlapping.zones[0] = dir.path().join("another0");
    overlapping.zones[1] = dir.path().join("another1");
    for c in [cfg.clone(), overlapping] {
        match Store::open(c) {
            Err(melddb_log::OpenError::InUse { zone, holder }) => {
                assert!(cfg.zones.contains(&zone), "{zone:?}");
                assert_eq!(holder, Some(std::process::id()));
            }
            Err(e) => panic!("expected InUse, got {e}"),
            Ok(_) => panic!("a second store opened held zones"),
        }
    }
    // The refused opens changed nothing: the first goes on.
    assert_eq!(
        first.append_blocking("a", 0, 0, b"two".to_vec()).unwrap(),
        1
    );
    first.shutdown();
    let second = Store::open(cfg).unwrap();
    assert_eq!(&second.read("a", 0).unwrap()[..], b"one");
    assert_eq!(&second.read("a", 1).unwrap()[..], b"two");
    assert_eq!(
        second
            .append_blocking("a", 0, 0, b"three".to_vec())
            .unwrap(),
        2
    );
    // The first still reads what it wrote.
    assert_eq!(&first.read("a", 1).unwrap()[..], b"two");
}

/// `meta.json` is a text file an operator can edit: numbers no store
/// writes (the largest u64s, a first position past the tail floor) must
/// not crash the open or a later append. Edited in every zone, such a
/// file is refused with a message naming it and the field; edited in one
/// zone only, the other zones' copies win. Large numbers a store could
/// have reached open, keep every record, and append without reusing a
/// position; a tail floor past the records is refused, as records lost.
#[test]
fn edited_metadata_with_extreme_numbers_is_refused_or_harmless() {
    let big = u64::MAX;
    let far = 1u64 << 40;
    // (field, value, the refusal when every zone's copy says so)
    let edits: Vec<(&str, serde_json::Value, Option<&str>)> = vec![
        ("version", big.into(), Some("meta.json: version is")),
        ("stable_seq", big.into(), Some("meta.json: stable_seq is")),
        (
            "next_seq_floor",
            big.into(),
            Some("meta.json: next_seq_floor is"),
        ),
        (
            "next_seq_floor",
            (1u64 << 62).into(),
            Some("meta.json: next_seq_floor is"),
        ),
        (
            "logs.a.tail_floor",
            big.into(),
            Some("meta.json: log \"a\"'s tail_floor is"),
        ),
        ("logs.a.first", big.into(), Some("past its tail_floor")),
        ("logs.a.first", 1000.into(), Some("past its tail_floor")),
        (
            "logs.b",
            serde_json::json!({"first": big, "tail_floor": big}),
            Some("tail_floor is"),
        ),
        (
            "discarded",
            serde_json::json!([[0, big]]),
            Some("meta.json: a discarded stripe is"),
        ),
        (
            "discarded",
            serde_json::json!([[9, 3]]),
            Some("runs backwards"),
        ),
        // Reachable by a store, if not soon: these open...
        ("version", far.into(), None),
        ("next_seq_floor", far.into(), None),
        ("discarded", serde_json::json!([[far, far + 5]]), None),
        (
            "logs.b",
            serde_json::json!({"first": far, "tail_floor": far}),
            None,
        ),
    ];
    // ...except a tail floor past the records, which is what losing them
    // looks like. It passes the file's check, so one zone's copy of it
    // (zone 0's, which wins among equal versions) is enough.
    let lost = (
        "logs.a.tail_floor",
        serde_json::Value::from(far),
        "were handed out",
    );
    let edits = edits
        .into_iter()
        .flat_map(|(f, v, r)| [(f, v.clone(), r, true), (f, v, None, false)])
        .chain([
            (lost.0, lost.1.clone(), Some(lost.2), true),
            (lost.0, lost.1, Some(lost.2), false),
        ]);
    for (field, value, refusal, all_zones) in edits {
        let what = format!(
            "{field} = {value} in {}",
            if all_zones { "every zone" } else { "one zone" }
        );
        let dir = tempfile::tempdir().unwrap();
        let cfg = small_config(dir.path());
        let store = Store::open(cfg.clone()).unwrap();
        for i in 0..20u32 {
            store
                .append_blocking("a", 0, 0, i.to_le_bytes().to_vec())
                .unwrap();
        }
        store.trim_blocking("a", 2).unwrap();
        drop(store);
        let edited = if all_zones {
            &cfg.zones[..]
        } else {
            &cfg.zones[..1]
        };
        for z in edited {
            let p = z.join(melddb_log::meta::FILE);
            let mut m: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            let path: Vec<&str> = field.split('.').collect();
            let mut at = &mut m;
            for key in &path[..path.len() - 1] {
                at = at.get_mut(*key).unwrap();
            }
            at[path[path.len() - 1]] = value.clone();
            std::fs::write(&p, serde_json::to_vec(&m).unwrap()).unwrap();
        }
        let store = match (Store::open(cfg.clone()), refusal) {
            (Ok(s), None) => s,
            (Err(e), Some(says)) => {
                let e = e.to_string();
                assert!(e.contains(says), "{what}: {e}");
                continue;
            }
            (Ok(_), Some(_)) => panic!("{what}: opened"),
            (Err(e), None) => panic!("{what}: {e}"),
        };
        // A skip the open recorded as discarded is not recorded again by
        // the next open.
        let ranges = |cfg: &Config| {
            let p = cfg.zones[0].join(melddb_log::meta::FILE);
            let m: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
            m["discarded"].clone()
        };
        let before = ranges(&cfg);
        // Appended on the open that made the skip: its stripe takes the
        // first number after the skip, which must not be among those the
        // skip discarded.
        let early = store
            .append_blocking("a", 0, 0, b"early".to_vec())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        drop(store);
        let store = Store::open(cfg.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(ranges(&cfg), before, "{what}");
        let read = store.read("a", early);
        assert_eq!(
            read.as_deref().ok(),
            Some(&b"early"[..]),
            "{what}: {read:?}"
        );
        let (first, tail) = store.bounds("a");
        assert_eq!(first, 2, "{what}");
        assert!(tail >= 20, "{what}: tail {tail}");
        for pos in 2..20 {
            assert_eq!(
                &store.read("a", pos).unwrap()[..],
                (pos as u32).to_le_bytes(),
                "{what}: a@{pos}"
            );
        }
        let p = store.append_blocking("a", 0, 0, b"next".to_vec()).unwrap();
        assert_eq!(p, tail, "{what}");
        assert_eq!(&store.read("a", p).unwrap()[..], b"next", "{what}");
        drop(store);
        let store = Store::open(cfg).unwrap_or_else(|e| panic!("{what}: {e}"));
        let read = store.read("a", p);
        assert_eq!(read.as_deref().ok(), Some(&b"next"[..]), "{what}: {read:?}");
    }
}

/// The record the small file system tests append with request id `i`.
fn rec(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8; 6000]
}

/// A real file system that fills up (a 4 MiB tmpfs under three zones):
/// appends are answered `NoSpace` and acknowledge nothing, and every
/// acknowledged record stays readable. With every byte taken by another
/// program, a trim still works (its metadata write uses the zone's
/// reserve file), deletes segments and appends go on; the store reopens
/// on a full file system, and takes appends once space is freed.
#[test]
fn a_file_system_that_fills_up_answers_no_space_and_a_trim_makes_room() {
    let Some(fs) = SmallFs::mount() else {
        return;
    };
    let cfg = fs.config();
    let store = Store::open(cfg.clone()).unwrap();
    for z in &cfg.zones {
        let reserve = std::fs::metadata(z.join("reserve")).expect("a reserve file in each zone");
        assert!(reserve.len() >= 64 << 10, "{}", reserve.len());
    }
    // Record of each position, by request id.
    let mut expect: Vec<Vec<u8>> = Vec::new();
    // Appends request ids `ids` until `stop` refusals, each `NoSpace`;
    // after the first refusal, whether later ones may still succeed (a
    // record that fits in a segment's zeros written ahead).
    let fill = |store: &Store,
                expect: &mut Vec<Vec<u8>>,
                ids: std::ops::Range<u64>,
                stop: usize,
                after: bool| {
        let mut refusals = 0;
        for i in ids {
            match store.append_blocking("full", 4, i, rec(i)) {
                Ok(pos) => {
                    assert_eq!(pos, expect.len() as u64);
                    assert!(after || refusals == 0, "appended after a refusal");
                    expect.push(rec(i));
                }
                Err(StoreError::NoSpace(m)) => {
                    assert!(m.contains("No space left"), "{m}");
                    refusals += 1;
                    if refusals == stop {
                        return;
                    }
                }
                Err(e) => panic!("append {i}: {e}"),
            }
        }
        panic!("the file system never filled up ({} appends)", expect.len());
    };
    fill(&store, &mut expect, 0..2_000, 5, false);
    let acked = expect.len() as u64;
    assert!(acked > 100, "only {acked} appends fit");
    assert_eq!(store.bounds("full"), (0, acked));
    for i in 0..acked {
        assert_eq!(&store.read("full", i).unwrap()[..], &rec(i)[..]);
    }
    let filler = take_every_byte(&fs.path);
    // With not a byte left, failed appends (each records its stripe
    // numbers as discarded in the metadata) must not wedge the store.
    fill(&store, &mut expect, 3_000..3_500, 3, true);
    let acked = expect.len() as u64;
    // A trim of most of the log deletes whole segments: room again.
    let first = acked - 20;
    store
        .trim_blocking("full", first)
        .expect("a trim on a full file system");
    for z in &cfg.zones {
        assert!(
            z.join("reserve").exists(),
            "the trim's room makes the reserve again"
        );
    }
    let more = store.append_blocking("full", 4, 5_000, rec(5_000)).unwrap();
    assert_eq!(more, acked);
    expect.push(rec(5_000));
    drop(store);
    take_every_byte(&fs.path);
    let store = Store::open(cfg.clone()).expect("opens on a full file system");
    let check = |store: &Store, expect: &[Vec<u8>]| {
        assert_eq!(store.bounds("full"), (first, expect.len() as u64));
        for p in first..expect.len() as u64 {
            assert_eq!(&store.read("full", p).unwrap()[..], &expect[p as usize][..]);
        }
    };
    check(&store, &expect);
    let big = vec![7u8; 60_000];
    let r = store.append_blocking("full", 4, 6_000, big.clone());
    assert!(matches!(r, Err(StoreError::NoSpace(_))), "{r:?}");
    std::fs::remove_file(&filler).unwrap();
    let pos = store
        .append_blocking("full", 4, 6_000, big.clone())
        .unwrap();
    assert_eq!(pos, expect.len() as u64);
    expect.push(big);
    check(&store, &expect);
    drop(store);
    let store = Store::open(cfg.clone()).unwrap();
    check(&store, &expect);
    drop(store);
    for z in &cfg.zones {
        assert!(z.join("reserve").exists(), "the reserve is made again");
    }
}

/// Spares asked for than the file system holds (15 of 256 KiB on a 4 MiB
/// tmpfs): the refill makes only those that leave two
/// segments (or a twentieth of it) free, so the log has room to make
/// segments of its own when the spares run out.
#[test]
fn spares_leave_room_on_their_file_system() {
    let Some(fs) = SmallFs::mount() else {
        return;
    };
    let mut cfg = fs.config();
    cfg.prepared_segments = 5;
    let store = Store::open(cfg.clone()).unwrap();
    // The refill makes spares until the next would leave too little
    // room, which it counts as a failure (and retries only in 10 s).
    common::wait_for_stats(&store, "a spare refused", |s| s.spares_failed > 0);
    let ready = store.stats().spares_ready;
    assert!(ready > 0 && ready < 15, "{ready} spares");
    assert!(
        free_bytes(&fs.path) >= 512 << 10,
        "{} free",
        free_bytes(&fs.path)
    );
    // Quiet: the refill has its turn, and must not fill the disk either.
    std::thread::sleep(std::time::Duration::from_millis(800));
    assert!(
        free_bytes(&fs.path) >= 512 << 10,
        "{} free",
        free_bytes(&fs.path)
    );
    assert_eq!(store.stats().spares_ready, ready);
    for i in 0..100u64 {
        assert_eq!(
            store
                .append_blocking("s", 1, i, vec![i as u8; 3000])
                .unwrap(),
            i
        );
    }
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.bounds("s"), (0, 100));
}

/// A store on a fresh [`SmallFs`] with a fault injector, holding the
/// records of request ids 0..200 at positions 0..200 of `log`; `None`
/// where the machine cannot mount one.
fn small_fs_store(log: &str) -> Option<(SmallFs, Config, Arc<Faults>, Store)> {
    let fs = SmallFs::mount()?;
    let cfg = fs.config();
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
    for i in 0..200u64 {
        assert_eq!(store.append_blocking(log, 4, i, rec(i)).unwrap(), i);
    }
    Some((fs, cfg, faults, store))
}

/// Appends refused on a file system with no byte left, where even the
/// metadata write of their roll back (the stripe numbers they took, as
/// discarded) finds no room: the reserve files were deleted by hand and
/// another program takes every byte freed. The store must not stop for
/// good. It answers
/// `NoSpace` while there is no room and takes appends again, without a
/// restart, once space is freed; everything acknowledged reads back,
/// also after a reopen.
#[test]
fn appends_refused_on_a_disk_with_no_byte_left_do_not_stop_the_store() {
    let Some((fs, cfg, faults, store)) = small_fs_store("w") else {
        return;
    };
    // Page writes fail before writing anything, so a roll back frees
    // nothing; with no reserve to pay for it, its metadata write fails.
    for z in &cfg.zones {
        std::fs::remove_file(z.join("reserve")).unwrap();
    }
    faults.fill_disk(true);
    let mut filler = PathBuf::new();
    for i in 200..206u64 {
        filler = take_every_byte(&fs.path);
        let r = store.append_blocking("w", 4, i, rec(i));
        assert!(
            matches!(r, Err(StoreError::NoSpace(_))),
            "append {i}: {r:?}"
        );
    }
    let why = store.appends_refused().expect("appends refused for now");
    assert!(why.contains("No space left"), "{why}");
    faults.fill_disk(false);
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(store.append_blocking("w", 4, 300, rec(300)).unwrap(), 200);
    assert_eq!(store.appends_refused(), None);
    // Reopened before anything else writes the metadata: the discarded
    // stripe numbers must be on disk, or recovery takes them for a hole
    // and drops the append after them.
    drop(store);
    let store = Store::open(cfg.clone()).unwrap();
    assert_eq!(store.bounds("w"), (0, 201));
    assert_eq!(&store.read("w", 200).unwrap()[..], &rec(300)[..]);
    store.trim_blocking("w", 150).unwrap();
    assert_eq!(store.append_blocking("w", 4, 301, rec(301)).unwrap(), 201);
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.bounds("w"), (150, 202));
    for i in 150..200 {
        assert_eq!(&store.read("w", i).unwrap()[..], &rec(i)[..]);
    }
    assert_eq!(&store.read("w", 200).unwrap()[..], &rec(300)[..]);
    assert_eq!(&store.read("w", 201).unwrap()[..], &rec(301)[..]);
}

/// Metadata writes on a file system with no byte left, each paid for by
/// the zone's reserve file while another program takes whatever that
/// write frees: the roll backs of refused appends, then a trim. The
/// reserve must still pay for the trim (which is what makes room), so it
/// gives up only a write's worth at a time and takes back what the
/// write freed; a reserve spent on the first write would leave the store
/// unable to trim until someone else freed space. Everything acknowledged
/// reads back after the trim and after a reopen.
#[test]
fn a_trim_makes_room_after_the_reserve_paid_for_earlier_metadata_writes() {
    let Some((fs, cfg, faults, store)) = small_fs_store("t") else {
        return;
    };
    // Each refused append's roll back writes the metadata (its stripe
    // numbers as discarded) on a file system with no byte left.
    faults.fill_disk(true);
    for i in 200..204u64 {
        take_every_byte(&fs.path);
        let r = store.append_blocking("t", 4, i, rec(i));
        assert!(
            matches!(r, Err(StoreError::NoSpace(_))),
            "append {i}: {r:?}"
        );
    }
    faults.fill_disk(false);
    let filler = take_every_byte(&fs.path);
    assert_eq!(free_bytes(&fs.path), 0);
    store
        .trim_blocking("t", 150)
        .expect("a trim on a file system with no byte left");
    assert!(
        free_bytes(&fs.path) >= 256 << 10,
        "the trim deleted segments"
    );
    for z in &cfg.zones {
        let r = std::fs::metadata(z.join("reserve")).expect("a reserve in each zone");
        assert!(r.len() >= 64 << 10, "{}: {}", z.display(), r.len());
    }
    assert_eq!(store.append_blocking("t", 4, 300, rec(300)).unwrap(), 200);
    drop(store);
    std::fs::remove_file(&filler).unwrap();
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.bounds("t"), (150, 201));
    for i in 150..200 {
        assert_eq!(&store.read("t", i).unwrap()[..], &rec(i)[..]);
    }
    assert_eq!(&store.read("t", 200).unwrap()[..], &rec(300)[..]);
}

/// Counts just under the metadata's limit (2^62, `meta::LIMIT`), which an
/// edited file may carry: the store opens and appends until the next
/// position, stripe number or metadata version would reach the limit, then
/// refuses with an error that says so. It never writes a file it would
/// refuse to open: positions and stripe numbers stop at the append, so the
/// store still opens; a version stops at the open or trim that would
/// write it, and once it is edited lower the store opens as it was.
#[test]
fn counts_just_under_the_metadata_limit_are_refused_before_the_store_is_bricked() {
    let limit = melddb_log::meta::LIMIT;
    let edit = |cfg: &Config, field: &str, value: &serde_json::Value| {
        for z in &cfg.zones {
            let p = z.join(melddb_log::meta::FILE);
            let mut m: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            let path: Vec<&str> = field.split('.').collect();
            let mut at = &mut m;
            for key in &path[..path.len() - 1] {
                at = at.get_mut(*key).unwrap();
            }
            at[path[path.len() - 1]] = value.clone();
            std::fs::write(&p, serde_json::to_vec(&m).unwrap()).unwrap();
        }
    };
    // (field, value, whether the refusal comes where the metadata is
    // written, an open or a trim, rather than at an append)
    let edits: Vec<(&str, serde_json::Value, bool)> = vec![
        ("next_seq_floor", (limit - 8).into(), false),
        ("version", (limit - 5).into(), true),
        (
            "logs.a",
            serde_json::json!({"first": limit - 3, "tail_floor": limit - 3}),
            false,
        ),
    ];
    for (field, value, at_open) in edits {
        let what = format!("{field} = {value}");
        let dir = tempfile::tempdir().unwrap();
        let cfg = small_config(dir.path());
        let store = Store::open(cfg.clone()).unwrap();
        store.append_blocking("a", 0, 0, b"zero".to_vec()).unwrap();
        drop(store);
        edit(&cfg, field, &value);
        let mut acked = Vec::new();
        let mut refused = None;
        // Reopened after every append: each open writes the metadata.
        for i in 0..12u32 {
            let store = match Store::open(cfg.clone()) {
                Ok(s) => s,
                Err(e) => {
                    refused = Some((e.to_string(), true));
                    break;
                }
            };
            match store.append_blocking("a", 0, 0, i.to_le_bytes().to_vec()) {
                Ok(p) => acked.push((p, i)),
                Err(e) => {
                    refused = Some((e.to_string(), false));
                    break;
                }
            }
            // A trim writes the metadata too, with the log's tail.
            let last = acked.last().unwrap().0;
            if let Err(e) = store.trim_blocking("a", last) {
                refused = Some((e.to_string(), true));
                break;
            }
        }
        let (refusal, was_open) = refused.unwrap_or_else(|| panic!("{what}: never refused"));
        assert!(refusal.contains("2^62"), "{what}: {refusal}");
        assert_eq!(was_open, at_open, "{what}: {refusal}");
        assert!(acked.len() >= 2, "{what}: {} appended", acked.len());
        // Every zone's copy is still one the open takes.
        let m = melddb_log::meta::Meta::load(&cfg.zones)
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .unwrap();
        if at_open {
            assert!(m.version >= limit - 2, "{what}: version {}", m.version);
            edit(&cfg, "version", &7.into());
        }
        let store = Store::open(cfg).unwrap_or_else(|e| panic!("{what}: last open: {e}"));
        // The last record appended, and nothing below it (each trim went
        // through, or the metadata was not written at all).
        let &(p, i) = acked.last().unwrap();
        assert_eq!(
            store.read("a", p).as_deref().ok(),
            Some(&i.to_le_bytes()[..]),
            "{what}: a@{p}"
        );
        assert_eq!(store.bounds("a"), (p, p + 1), "{what}");
    }
}

/// `writer_round_max_bytes`: appends made one at a time, on segments made
/// from spares (whose files a round only writes back, then flushes the
/// device), have their rounds run by the writer while each batch is
/// within the limit; by the helpers when it is over the limit, when the
/// option is off, when the round has direct writes held back for it, and
/// when its files need an fsync each (no spares, or a file system where
/// write-back does not apply). Every record reads back, before and after a
/// reopen.
#[test]
fn small_rounds_run_on_the_writer_and_larger_ones_on_the_helpers() {
    const APPENDS: u64 = 30;
    for (limit, size, spares, direct, on_writer) in [
        (256 << 10, 100, 2, false, true),
        (256 << 10, 3000, 2, false, true),
        (256 << 10, 100, 0, false, false),
        (0, 100, 2, false, false),
        (2000, 3000, 2, false, false),
        (256 << 10, 20_000, 2, true, false),
    ] {
        let what =
            format!("limit {limit}, records of {size} bytes, {spares} spares, direct {direct}");
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path());
        cfg.tuning.writer_round_max_bytes = limit;
        cfg.prepared_segments = spares;
        cfg.tuning.direct_writes = direct;
        cfg.tuning.direct_write_min_bytes = 4096;
        // Room for every append in the spares' segments.
        cfg.segment_bytes = 1 << 20;
        common::spares_on_disk(&cfg);
        let store = Store::open(cfg.clone()).unwrap();
        let mut model = Model::new();
        let mut recs = Vec::new();
        for i in 0..APPENDS {
            let bytes: Vec<u8> = (0..size).map(|j| (i as usize * 7 + j) as u8).collect();
            let pos = store.append_blocking("l", 9, i + 1, bytes.clone()).unwrap();
            assert_eq!(pos, i, "{what}");
            recs.push(bytes);
        }
        model.insert("l".into(), (0, recs));
        let stats = store.stats();
        let want = if on_writer && write_back_supported(dir.path()) {
            APPENDS
        } else {
            0
        };
        assert_eq!(stats.rounds_on_writer, want, "{what}: {stats:?}");
        if direct {
            assert!(stats.direct_write_bytes > 0, "{what}: {stats:?}");
        }
        if spares > 0 && write_back_supported(dir.path()) {
            assert!(
                stats.write_backs > 0 && stats.flushes > 0,
                "{what}: files written back and flushed: {stats:?}"
            );
        }
        check_at(&store, &model, &what);
        drop(store);
        let store = Store::open(cfg).unwrap();
        check_at(&store, &model, &format!("{what}, reopened"));
    }
}

/// Short bursts of appends from a few threads, each burst waited for
/// before the next, with fsyncs slowed a little; one thread's records are
/// over `writer_round_max_bytes`, so rounds on the helpers (with batches
/// written beside them) and rounds on the writer follow each other, and
/// each burst ends with every caller waiting. Every append must be
/// answered (a batch whose round the writer ran and nobody answered would
/// hang its callers; after a burst's last append nothing else wakes the
/// writer, and the watchdog turns that into a failure), and reads back
/// after a reopen.
#[test]
fn bursts_with_rounds_on_the_writer_are_all_answered() {
    const BURSTS: u64 = 150;
    const THREADS: u64 = 4;
    const EACH: u64 = 3;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.prepared_segments = 2;
    cfg.segment_bytes = 1 << 20;
    cfg.tuning.writer_round_max_bytes = 4000;
    common::spares_on_disk(&cfg);
    let faults = Arc::new(Faults::none());
    faults.slow_syncs(std::time::Duration::from_micros(300));
    let store = Arc::new(Store::open_with_faults(cfg.clone(), faults).unwrap());
    let mut got = Vec::new();
    for b in 0..BURSTS {
        let (tx, rx) = std::sync::mpsc::channel();
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (store, tx) = (store.clone(), tx.clone());
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let mut bytes = format!("burst {b} thread {t} append {i}").into_bytes();
                        if t == 0 {
                            bytes.resize(5000, t as u8);
                        }
                        let pos =
                            store.append_blocking("l", t + 1, b * EACH + i + 1, bytes.clone());
                        let _ = tx.send((bytes, pos));
                    }
                })
            })
            .collect();
        drop(tx);
        for _ in 0..THREADS * EACH {
            let (bytes, pos) = rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("burst {b}: an append unanswered for 60 s"));
            got.push((pos.unwrap(), bytes));
        }
        // Every answer is in, so each thread is at its end; joined, its
        // handle on the store is gone before the reopen.
        for t in threads {
            t.join().unwrap();
        }
    }
    got.sort();
    let positions: Vec<u64> = got.iter().map(|g| g.0).collect();
    assert_eq!(positions, (0..BURSTS * THREADS * EACH).collect::<Vec<_>>());
    let stats = store.stats();
    assert!(
        !write_back_supported(dir.path())
            || (stats.rounds_on_writer > 0 && stats.rounds_on_writer < stats.batches),
        "rounds on the writer and on the helpers: {stats:?}"
    );
    let mut model = Model::new();
    model.insert("l".into(), (0, got.into_iter().map(|g| g.1).collect()));
    check(&store, &model);
    drop(store);
    let store = Store::open(cfg).unwrap();
    check_at(&store, &model, "reopened");
}

/// The sequence that once left a batch unanswered, timed with slowed
/// writes and fsyncs: a large record's round goes to the helpers (A); a
/// small record is written while A runs; a third append is queued before
/// A's end is, so the writer takes A's wake-up while gathering the third,
/// answers A, runs the small record's round itself, writes the third and
/// runs its round itself too. Nothing follows the third append, so only
/// the writer's own bookkeeping can answer it (the watchdog fails the test
/// otherwise). With correct code every timing passes; the timing only
/// decides whether the sequence is exercised.
#[test]
fn a_round_run_by_the_writer_is_answered_with_nothing_queued_behind_it() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.tuning.writer_round_max_bytes = 4000;
    cfg.prepared_segments = 2;
    cfg.segment_bytes = 1 << 20;
    let faults = Arc::new(Faults::none());
    let store = Arc::new(Store::open_with_faults(cfg.clone(), faults.clone()).unwrap());
    // Segments created and windows set up before anything is slowed.
    store.append_blocking("l", 1, 1, vec![1; 5000]).unwrap();
    faults.slow_writes(Duration::from_millis(20));
    faults.slow_syncs(Duration::from_millis(60));
    let (tx, rx) = std::sync::mpsc::channel();
    let threads: Vec<_> = [(0u64, 5000usize), (140, 10), (160, 10)]
        .into_iter()
        .enumerate()
        .map(|(i, (after_ms, len))| {
            let (store, tx) = (store.clone(), tx.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(after_ms));
                let bytes = vec![i as u8 + 2; len];
                let pos = store.append_blocking("l", 2 + i as u64, 1, bytes.clone());
                let _ = tx.send((pos, bytes));
            })
        })
        .collect();
    drop(tx);
    let mut got = Vec::new();
    for _ in 0..3 {
        let (pos, bytes) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("an append unanswered for 60 s with nothing queued behind it");
        got.push((pos.unwrap(), bytes));
    }
    for t in threads {
        t.join().unwrap();
    }
    got.sort();
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    let mut model = Model::new();
    let mut recs = vec![vec![1; 5000]];
    recs.extend(got.into_iter().map(|g| g.1));
    model.insert("l".into(), (0, recs));
    check(&store, &model);
}
