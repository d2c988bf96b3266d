//! Range reads against a model: consecutive records read in one call
//! agree byte for byte with what was appended, across reopens, trims,
//! damaged bytes and pages that lie under a valid checksum; intact
//! records are read from their bytes alone.

use std::sync::Arc;

use melddb_log::page::Kind;
use melddb_log::Store;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::store::*;
use common::{append_burst, check_ranges, small_config, Model};

#[test]
fn range_reads_match_the_model_across_reopen_trim_and_damage() {
    for seed in 0..4u64 {
        let dir = tempfile::tempdir().unwrap();
        let cfg = small_config(dir.path());
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut model = Model::new();
        let mut store = Arc::new(Store::open(cfg.clone()).unwrap());
        // A log never written: empty at 0, not yet written beyond.
        assert_eq!(store.read_range("none", 0, 5, 100).unwrap().len(), 0);
        assert!(store.read_range("none", 1, 5, 100).is_err());
        assert!(store.read_range("bad name", 0, 5, 100).is_err());
        for step in 0..10 {
            let what = format!("seed {seed} step {step}");
            let n = rng.random_range(1..60);
            append_burst(&store, &mut model, &mut rng, n);
            check_ranges(&store, &model, &what);
            match rng.random_range(0..3) {
                0 => {
                    let logs: Vec<String> = model.keys().cloned().collect();
                    let log = &logs[rng.random_range(0..logs.len())];
                    let (first, recs) = model.get_mut(log).unwrap();
                    let cut = rng.random_range(0..=recs.len());
                    store.trim_blocking(log, *first + cut as u64).unwrap();
                    recs.drain(..cut);
                    *first += cut as u64;
                }
                1 => {
                    drop(store);
                    store = Arc::new(Store::open(cfg.clone()).unwrap());
                }
                _ => {
                    // A byte flipped anywhere: parity stands in for it.
                    let files = seg_files(dir.path());
                    let victim = &files[rng.random_range(0..files.len())];
                    let mut bytes = std::fs::read(victim).unwrap();
                    if !bytes.is_empty() {
                        let i = rng.random_range(0..bytes.len());
                        bytes[i] ^= 0x5a;
                        std::fs::write(victim, &bytes).unwrap();
                    }
                    check_ranges(&store, &model, &format!("{what}, a byte flipped"));
                    // Repaired before the next damage: two in one stripe
                    // are more than its one parity page covers.
                    let report = store.scrub_blocking();
                    assert!(
                        report.unrecoverable.is_empty() && report.failed.is_empty(),
                        "{what}: {report:?}"
                    );
                }
            }
            if step == 5 {
                // A data page that passes its own checksum but holds
                // other record bytes: only the records' checksums tell.
                drop(store);
                falsify_page(dir.path(), Kind::Ordered, 0, false, &model);
                store = Arc::new(Store::open(cfg.clone()).unwrap());
                check_ranges(&store, &model, &format!("{what}, a page lying"));
                let report = store.scrub_blocking();
                assert!(
                    report.unrecoverable.is_empty() && report.failed.is_empty(),
                    "{what}: {report:?}"
                );
            }
            check_ranges(&store, &model, &format!("{what}, after the action"));
        }
    }
}

/// Intact records packed in root stripes are served from one read of the
/// span they cover, checked against their own checksums; none goes
/// through the whole stripe. A record whose bytes were changed on disk is
/// still served right, through parity, and only it takes the whole
/// stripe.
#[test]
fn intact_records_of_a_range_are_read_from_their_bytes_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.segment_bytes = 1 << 20;
    let store = Store::open(cfg.clone()).unwrap();
    let record = |i: u64| format!("record {i:03} ").repeat(9).into_bytes();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for b in 0..5u64 {
        let batch = (4 * b..4 * b + 4).map(|i| record(i).into()).collect();
        rt.block_on(store.append_many("f", 0, 0, batch)).unwrap();
    }
    let got = store.read_range("f", 0, 100, 1 << 20).unwrap();
    assert_eq!(got.len(), 20);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(&r[..], &record(i as u64)[..]);
    }
    let stats = store.stats();
    assert_eq!(stats.reads_whole_stripe, 0, "{stats:?}");
    assert_eq!(stats.reads, 20, "{stats:?}");
    drop(store);
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
    let got = store.read_range("f", 0, 100, 1 << 20).unwrap();
    assert_eq!(got.len(), 20);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(&r[..], &record(i as u64)[..], "record {i}");
    }
    assert_eq!(store.stats().reads_whole_stripe, 1, "{:?}", store.stats());
}
