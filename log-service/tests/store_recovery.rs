//! Recovery: torn tails cut or taken as damage, the last batches
//! dropped whole when their pages or end-writes did not reach the disk,
//! implausible end-write copies, window slides interrupted at any marker,
//! and metadata with extreme numbers.

use std::path::Path;
use std::sync::Arc;

use melddb_log::page::{self, class};
use melddb_log::{Config, Store};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::store::*;
use common::{check, small_config, Model};

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
    // The metadata of a trimmed log says which positions are live; when
    // no record of them is left (every end-write copy lost, or a newer
    // trim's metadata lost), recovery takes them as trimmed, and must
    // write that down: otherwise, once an append is acknowledged on top,
    // the next open counts from the old first position again and refuses
    // to open.
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
/// (syncing them would make a slide wait for every page written since
/// the last one, seconds under load). What was
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
