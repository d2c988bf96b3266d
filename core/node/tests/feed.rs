//! The change feed on an embedded database: a view of a key range kept
//! from a snapshot plus the feed equals the range's contents at every
//! commit, whatever the writers do outside it, and a watcher that never
//! reads is cut off with the position it reached.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use melddb::{Isolation, Order};
use melddb_runtime::{Database, DbOptions, Durability, FeedError, FEED_QUEUE};
use rand::{Rng, SeedableRng};

fn range_of(db: &Database, prefix: &[u8]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut end = prefix.to_vec();
    *end.last_mut().unwrap() += 1;
    db.snapshot()
        .range(
            Bound::Included(prefix),
            Bound::Excluded(&end),
            Order::Forward,
            None,
        )
        .collect::<Result<Vec<_>, _>>()
        .expect("the range reads")
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

#[test]
fn a_view_kept_by_the_feed_matches_the_range_at_every_commit() {
    let d = tempfile::tempdir().unwrap();
    let db = Arc::new(Database::open(d.path()).unwrap());
    db.transact(Isolation::Serializable, |tx| tx.put(b"a/0", b"start"))
        .unwrap();
    let mut view = range_of(&db, b"a/");
    let mut feed = db.watch_prefix(b"a/");
    let writers: Vec<_> = (0..3u64)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(t);
                for _ in 0..200 {
                    let mut tx = db.begin(Isolation::Serializable);
                    for _ in 0..3 {
                        let prefix = if rng.random_bool(0.5) { "a" } else { "b" };
                        let k = format!("{prefix}/{}", rng.random_range(0..12));
                        match rng.random_range(0..3) {
                            0 => {
                                tx.delete(k.as_bytes()).unwrap();
                            }
                            1 => {
                                // Put and delete in one transaction: no
                                // change if the key was absent.
                                tx.put(k.as_bytes(), b"tmp").unwrap();
                                tx.delete(k.as_bytes()).unwrap();
                            }
                            _ => tx.put(k.as_bytes(), &rng.random::<[u8; 4]>()).unwrap(),
                        }
                    }
                    db.commit(tx).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let mut last = 0;
    let mut commits = 0;
    while let Some(c) = feed.next_timeout(Duration::from_millis(200)).unwrap() {
        assert!(c.pos > last, "commits out of order");
        last = c.pos;
        commits += 1;
        assert!(!c.changes.is_empty());
        assert!(c.changes.windows(2).all(|w| w[0].key < w[1].key));
        for ch in c.changes {
            assert!(
                ch.key.starts_with(b"a/"),
                "{:?} is outside the range",
                ch.key
            );
            match ch.value {
                Some(v) => {
                    view.insert(ch.key.to_vec(), v.to_vec());
                }
                None => {
                    // A deletion is only reported for a key that was there.
                    assert!(
                        view.remove(&ch.key[..]).is_some(),
                        "{:?} deleted twice",
                        ch.key
                    );
                }
            }
        }
    }
    assert!(commits > 50, "{commits}");
    assert_eq!(view, range_of(&db, b"a/"));
}

#[test]
fn a_watcher_that_never_reads_is_cut_off_and_told_where() {
    let d = tempfile::tempdir().unwrap();
    let db = Database::open_with(
        d.path(),
        DbOptions {
            durability: Durability::Buffered,
            ..DbOptions::default()
        },
    )
    .unwrap();
    let mut feed = db.watch(Bound::Unbounded, Bound::Unbounded);
    let mut idle = db.watch_prefix(b"nobody/");
    for i in 0..FEED_QUEUE as u32 + 10 {
        db.transact(Isolation::Serializable, |tx| tx.put(&i.to_be_bytes(), b"v"))
            .unwrap();
    }
    let mut got = 0;
    let end = loop {
        match feed.next_timeout(Duration::from_secs(5)) {
            Ok(Some(_)) => got += 1,
            Ok(None) => panic!("the feed neither delivered nor ended"),
            Err(e) => break e,
        }
    };
    assert_eq!(got, FEED_QUEUE);
    let FeedError::Lagged { pos } = end else {
        panic!("{end:?}")
    };
    assert!(pos > 0);
    // Ended for good; the idle watcher of an untouched range is still on.
    assert!(feed.next().is_none());
    assert_eq!(idle.next_timeout(Duration::from_millis(10)), Ok(None));
    drop(db);
    assert_eq!(
        idle.next_timeout(Duration::from_millis(10)),
        Err(FeedError::Closed)
    );
}
