//! Repair and scrub: deleted and corrupt segments rebuilt byte for byte,
//! pages that lie under a valid checksum outvoted by parity, and scrubs
//! that count every damaged page once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use melddb_log::page::{self};
use melddb_log::Store;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

mod common;
use common::store::*;
use common::{append_burst, check, small_config, Model};

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
    // lies under a valid checksum, on different segments. A repair that
    // rebuilt every stripe page of a segment from the stripe's other
    // pages would rebuild the second stripe's good page on the first
    // liar's segment from the second liar: two wrong pages in a
    // one-parity stripe, its records gone. Intact pages are kept unless
    // they are the ones found to lie.
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
