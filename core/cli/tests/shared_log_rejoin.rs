//! A node that is away while the log is trimmed past its position: when
//! it comes back it finds the entries it needs gone, and goes on from the
//! latest published checkpoint to the same state as the other nodes.

use std::time::{Duration, Instant};

use melddb::Isolation;
use melddb_runtime::{Database, DbOptions};

mod common;
use common::{Relay, Service};

fn write(db: &Database, n: u64, tag: &str) {
    for i in 0..n {
        db.transact(Isolation::Serializable, |tx| {
            tx.put(
                format!("k/{:04}", i % 500).as_bytes(),
                format!("{tag}{i}").as_bytes(),
            )
        })
        .unwrap();
    }
}

#[test]
fn a_node_away_while_the_log_was_trimmed_past_it_rejoins_from_a_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    let relay = Relay::start(&svc.addr);
    let publisher = DbOptions {
        publish_checkpoints: true,
        checkpoint_bytes: 64 << 10,
        checkpoint_part_bytes: 16 << 10,
        trim_log: true,
        ..DbOptions::default()
    };
    let p = Database::connect(
        &format!("melddb://{}/bank", svc.addr),
        d.path().join("p"),
        publisher,
    )
    .unwrap();
    write(&p, 200, "a");
    // The away node reaches the service only through the relay.
    let away = Database::connect(
        &format!("melddb://{}/bank", relay.addr),
        d.path().join("away"),
        DbOptions::default(),
    )
    .unwrap();
    away.sync_with_log().unwrap();
    let left_at = away.snapshot().pos();

    relay.cut();
    write(&p, 1_500, "b");
    p.checkpoint().unwrap();
    write(&p, 100, "c");
    p.checkpoint().unwrap();
    let first = p.log_stats().first;
    assert!(
        first > left_at + 1,
        "the log was trimmed past the away node ({first} vs {left_at})"
    );
    relay.restore();

    // Back: it subscribes where it stopped, finds that trimmed, and goes
    // on from the latest checkpoint.
    let deadline = Instant::now() + Duration::from_secs(60);
    while away.log_stats().rejoins == 0 {
        assert!(Instant::now() < deadline, "the node never rejoined");
        std::thread::sleep(Duration::from_millis(20));
    }
    p.sync_with_log().unwrap();
    away.sync_with_log().unwrap();
    let (a, b) = (p.begin_read(), away.begin_read());
    assert_eq!(a.pos(), b.pos());
    assert_eq!(a.digest_hex().unwrap(), b.digest_hex().unwrap());
    assert_eq!(away.log_stats().rejoins, 1);
    // It commits like any node.
    away.transact(Isolation::Serializable, |tx| tx.put(b"back", b"1"))
        .unwrap();
    p.sync_with_log().unwrap();
    assert_eq!(p.get(b"back").unwrap().as_deref(), Some(&b"1"[..]));
}

/// With the service out of reach, a commit answers `TimedOut` after
/// `commit_timeout` instead of waiting forever (and `transact` does not
/// retry it); once the service is back the node goes on, and that commit
/// is in the state at most once.
#[test]
fn a_commit_with_the_service_out_of_reach_times_out() {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    let relay = Relay::start(&svc.addr);
    let opts = DbOptions {
        commit_timeout: Some(Duration::from_secs(1)),
        ..DbOptions::default()
    };
    let url = format!("melddb://{}/bank", relay.addr);
    let db = Database::connect(&url, d.path().join("n"), opts).unwrap();
    write(&db, 20, "a");
    relay.cut();
    let t0 = Instant::now();
    let e = db
        .transact(Isolation::Serializable, |tx| tx.put(b"late", b"1"))
        .unwrap_err();
    let waited = t0.elapsed();
    assert!(
        matches!(
            e,
            melddb_runtime::TransactError::Db(melddb_runtime::DbError::TimedOut { .. })
        ),
        "{e}"
    );
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(20),
        "answered after {waited:?}"
    );
    relay.restore();
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.sync_with_log().is_err() {
        assert!(Instant::now() < deadline, "the node never came back");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Committed once or not at all, and the node commits again.
    let late = db.get(b"late").unwrap();
    assert!(late.is_none() || late.as_deref() == Some(&b"1"[..]));
    db.transact(Isolation::Serializable, |tx| tx.put(b"after", b"2"))
        .unwrap();
    assert_eq!(db.get(b"after").unwrap().as_deref(), Some(&b"2"[..]));
}
