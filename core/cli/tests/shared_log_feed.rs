//! The change feed of a node on a shared log: it carries every node's
//! committed changes, so a view kept from a snapshot plus the feed equals
//! the range on that node once it is up to date, with group meld too.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use melddb::{Isolation, Order, Settings};
use melddb_runtime::{Database, DbOptions};
use rand::{Rng, SeedableRng};

mod common;
use common::{Peek, Service};

fn range_of(db: &Database) -> BTreeMap<Vec<u8>, Vec<u8>> {
    db.snapshot()
        .range(
            Bound::Included(b"k/"),
            Bound::Excluded(b"k0"),
            Order::Forward,
            None,
        )
        .collect::<Result<Vec<_>, _>>()
        .expect("the range reads")
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

fn feed_follows_every_node(settings: Settings, log: &str) {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    Peek::new(&svc.addr).append(log, settings.encode());
    let url = format!("melddb://{}/{log}", svc.addr);
    let nodes: Vec<Arc<Database>> = (0..2)
        .map(|i| {
            Arc::new(
                Database::connect(&url, d.path().join(format!("n{i}")), DbOptions::default())
                    .unwrap(),
            )
        })
        .collect();
    let watcher = &nodes[1];
    let mut view = range_of(watcher);
    let mut feed = watcher.watch_prefix(b"k/");
    let writers: Vec<_> = (0..4u64)
        .map(|t| {
            let db = nodes[t as usize % 2].clone();
            std::thread::spawn(move || {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(t);
                for _ in 0..60 {
                    let mut tx = db.begin(Isolation::Serializable);
                    for _ in 0..2 {
                        let k = format!(
                            "{}/{}",
                            if rng.random_bool(0.7) { "k" } else { "x" },
                            rng.random_range(0..10)
                        );
                        if rng.random_bool(0.3) {
                            tx.delete(k.as_bytes()).unwrap();
                        } else {
                            tx.put(k.as_bytes(), &rng.random::<[u8; 4]>()).unwrap();
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
    watcher.sync_with_log().unwrap();
    let mut commits = 0;
    while let Some(c) = feed.next_timeout(Duration::from_millis(300)).unwrap() {
        commits += 1;
        for ch in c.changes {
            match ch.value {
                Some(v) => {
                    view.insert(ch.key.to_vec(), v.to_vec());
                }
                None => assert!(view.remove(&ch.key[..]).is_some(), "{:?}", ch.key),
            }
        }
    }
    assert!(commits > 20, "{commits}");
    assert_eq!(view, range_of(watcher));
}

#[test]
fn a_nodes_feed_carries_every_nodes_commits() {
    feed_follows_every_node(Settings::default(), "plain");
}

#[test]
fn a_nodes_feed_carries_every_nodes_commits_under_group_meld() {
    feed_follows_every_node(
        Settings {
            group_meld: true,
            ..Settings::default()
        },
        "grouped",
    );
}
