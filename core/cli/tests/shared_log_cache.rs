//! A node on the log service with its own checkpoints and node cache: a
//! database many times its memory budget works (every read and scan
//! matches a model map, while writing, after eviction and after a
//! restart), the tree's memory returns under the budget, and a restart
//! starts from the node directory's checkpoint, not from genesis, reaching
//! the digest of a node that replayed the whole log.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use melddb::{Isolation, Order, Settings};
use melddb_runtime::{Database, DbOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::{replay, Peek, Service};

const BUDGET: u64 = 512 << 10;
const KEYS: u64 = 20_000;

fn key(i: u64) -> Vec<u8> {
    format!("user{i:08}").into_bytes()
}

fn value(i: u64, round: u64) -> Vec<u8> {
    let mut v = format!("{i}:{round}:").into_bytes();
    v.resize(100, b'x');
    v
}

fn cached(settings: Settings) -> DbOptions {
    DbOptions {
        settings,
        cache_bytes: BUDGET,
        checkpoint_bytes: 256 << 10,
        checkpoint_part_bytes: 64 << 10,
        segment_bytes: 1 << 20,
        ..DbOptions::default()
    }
}

fn check_all(db: &Database, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    for (k, v) in model {
        let got = db.get(k).expect("read back");
        assert_eq!(
            got.as_deref(),
            Some(&v[..]),
            "{}",
            String::from_utf8_lossy(k)
        );
    }
    let all = db
        .begin_read()
        .range(Bound::Unbounded, Bound::Unbounded, Order::Forward, None)
        .collect::<Result<Vec<_>, _>>()
        .expect("scan");
    assert_eq!(all.len(), model.len());
    for ((k, v), (mk, mv)) in all.iter().zip(model) {
        assert_eq!((&k[..], &v[..]), (&mk[..], &mv[..]));
    }
}

/// Loads `KEYS` keys, then updates random ones from three threads that
/// each own a third of the keys (no conflicts: the model is exact).
fn load_and_update(db: &Arc<Database>, model: &mut BTreeMap<Vec<u8>, Vec<u8>>) {
    for chunk in 0..KEYS / 100 {
        db.transact(Isolation::Serializable, |tx| {
            for i in chunk * 100..(chunk + 1) * 100 {
                tx.put(&key(i), &value(i, 0))?;
            }
            Ok::<_, melddb::TxnError>(())
        })
        .expect("load");
    }
    for i in 0..KEYS {
        model.insert(key(i), value(i, 0));
    }
    let handles: Vec<_> = (0..3u64)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(t);
                let mut mine = Vec::new();
                for round in 1..=150u64 {
                    let ks: Vec<u64> = (0..4)
                        .map(|_| rng.random_range(0..KEYS / 3) * 3 + t)
                        .collect();
                    db.transact(Isolation::Serializable, |tx| {
                        for &k in &ks {
                            let old = tx.get(&key(k))?.expect("loaded key");
                            assert!(old.starts_with(format!("{k}:").as_bytes()));
                            tx.put(&key(k), &value(k, round * 10 + t))?;
                        }
                        Ok::<_, melddb::TxnError>(())
                    })
                    .expect("update");
                    mine.extend(ks.into_iter().map(|k| (k, round * 10 + t)));
                }
                mine
            })
        })
        .collect();
    for h in handles {
        for (k, round) in h.join().expect("thread") {
            model.insert(key(k), value(k, round));
        }
    }
}

fn larger_than_its_cache(settings: Settings) {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    let url = format!("melddb://{}/big", svc.addr);
    let mut model = BTreeMap::new();
    let db = Arc::new(Database::connect(&url, d.path().join("a"), cached(settings)).unwrap());
    load_and_update(&db, &mut model);
    check_all(&db, &model);
    // Reading everything back loaded much of the tree; the commits after
    // it let the roll-forward thread sweep.
    for i in 0..20u64 {
        db.transact(Isolation::Serializable, |tx| tx.put(&key(i), &value(i, 9)))
            .unwrap();
        model.insert(key(i), value(i, 9));
    }
    let stats = db.log_stats();
    assert!(stats.local_checkpoints_written >= 2, "{stats:?}");
    assert_eq!(stats.local_checkpoint_error, None);
    // What may stay over the budget is what no local checkpoint holds
    // yet (the latest commits): under pressure the node asks for a
    // checkpoint and sweeps once it is complete.
    let mut cache = db.cache_stats();
    for _ in 0..100 {
        if cache.in_memory_bytes <= 2 * BUDGET {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        cache = db.cache_stats();
    }
    assert!(cache.sweeps > 0 && cache.stubbed > 0, "{cache:?}");
    assert!(
        cache.store.nodes_loaded > 0,
        "nodes were read back: {cache:?}"
    );
    assert!(
        cache.in_memory_bytes <= 2 * BUDGET,
        "after the last sweep the tree holds {} bytes: {cache:?}",
        cache.in_memory_bytes
    );
    let full = db.snapshot().to_vec().unwrap().len();
    assert_eq!(full as u64, KEYS);
    let tail = db.log_stats().tail;
    Arc::try_unwrap(db).expect("sole owner").close().unwrap();

    // A restart starts from the directory's own checkpoint.
    let db = Database::connect(&url, d.path().join("a"), cached(settings)).unwrap();
    let r = db.recovery().clone();
    assert!(r.local_checkpoint && r.checkpoint.is_some(), "{r:?}");
    assert!(
        r.replayed < tail / 2,
        "restarted from {:?} yet melded {} of {tail} entries",
        r.checkpoint,
        r.replayed
    );
    check_all(&db, &model);
    // Without commits, the roll-forward thread sweeps what readers loaded
    // when it finds no entry to meld for a while.
    let mut cache = db.cache_stats();
    for _ in 0..100 {
        if cache.sweeps > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        cache = db.cache_stats();
    }
    assert!(cache.store.nodes_loaded > 0, "loaded lazily: {cache:?}");
    assert!(
        cache.sweeps > 0 && cache.in_memory_bytes <= BUDGET,
        "{cache:?}"
    );
    println!("restart: {r:?}\ncache: {cache:?}");
    // A node without a cache or checkpoints replays the log from genesis
    // and agrees, and so does a replay in this process.
    let plain = DbOptions {
        checkpoint_bytes: 0,
        cache_bytes: 0,
        ..DbOptions::default()
    };
    let b = Database::connect(&url, d.path().join("b"), plain).unwrap();
    assert_eq!(b.recovery().checkpoint, None);
    db.sync_with_log().unwrap();
    b.sync_with_log().unwrap();
    let (x, y) = (db.snapshot(), b.snapshot());
    assert_eq!(x.pos(), y.pos());
    assert_eq!(x.digest_hex().unwrap(), y.digest_hex().unwrap());
    let whole = y.approx_bytes();
    assert!(
        whole > 4 * BUDGET,
        "the tree ({whole} bytes) is much larger than the budget"
    );
    let (_, digests) = replay(&Peek::new(&svc.addr).entries("big"));
    assert_eq!(digests.get(&x.pos()), Some(&x.digest_hex().unwrap()));
}

#[test]
fn a_node_on_the_service_larger_than_its_cache_works_and_restarts_from_its_checkpoint() {
    larger_than_its_cache(Settings::default());
}

#[test]
fn with_premeld_and_group_meld_too() {
    larger_than_its_cache(Settings {
        premeld_threads: 1,
        premeld_distance: 2,
        group_meld: true,
        ..Settings::default()
    });
}

/// A node directory written from one log is not used on another: the
/// node replays the other log instead of starting from a wrong state.
#[test]
fn a_directory_of_another_log_is_not_used() {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    let one = format!("melddb://{}/one", svc.addr);
    let two = format!("melddb://{}/two", svc.addr);
    let opts = DbOptions {
        checkpoint_bytes: 16 << 10,
        ..DbOptions::default()
    };
    for url in [&one, &two] {
        let db = Database::connect(
            url,
            d.path().join(url.rsplit('/').next().unwrap()),
            opts.clone(),
        )
        .unwrap();
        for i in 0..400u64 {
            db.transact(Isolation::Serializable, |tx| {
                tx.put(&key(i), url.repeat(8).as_bytes())
            })
            .unwrap();
        }
        assert!(
            db.log_stats().local_checkpoints_written > 0,
            "{:?}",
            db.log_stats()
        );
    }
    // `one`'s directory on log `two`.
    let db = Database::connect(&two, d.path().join("one"), opts).unwrap();
    let r = db.recovery();
    assert!(!r.local_checkpoint, "{r:?}");
    assert_eq!(
        db.get(&key(5)).unwrap().as_deref(),
        Some(two.repeat(8).as_bytes())
    );
}
