//! Roll backs and full disks: a failed batch leaves no byte behind and
//! never an acknowledgement, retries do not duplicate, and a disk that
//! fills up answers "no space", loses nothing and goes on once there is
//! room.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use melddb_log::page::{self};
use melddb_log::{Config, Faults, Store, StoreError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::store::*;
use common::{free_bytes, record, small_config, take_every_byte, SmallFs};

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
fn injected_write_faults_never_acknowledge_and_retries_do_not_duplicate() {
    for direct in [false, true] {
        injected_write_faults_case(direct);
    }
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
