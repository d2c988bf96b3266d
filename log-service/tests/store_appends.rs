//! Appends and reads against a model: every acknowledged record reads
//! back byte for byte across reopens, trims and batches of every shape;
//! request ids make retries idempotent; rounds on the writer and on the
//! helpers answer every append; direct writes leave the same bytes.

use std::collections::BTreeMap;
use std::sync::Arc;

use melddb_log::page::{self, class};
use melddb_log::store::check_log_name;
use melddb_log::{Faults, Store, StoreError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::store::*;
use common::{append_burst, check, check_at, record, small_config, write_back_supported, Model};

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
/// page may be larger than `page_bytes`. No size just under the
/// capacity may be refused as too large (and with it every append of its
/// batch).
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
