//! Joining a long shared log from a published checkpoint: a node that
//! publishes writes checkpoints into the log and points the companion log
//! at them; a node that joins later loads the latest one and melds only
//! the log after it, reaching the state of a replay from genesis; with
//! trimming on, the log's start moves up and newcomers still join.

use melddb::{Isolation, Settings};
use melddb_runtime::{Database, DbError, DbOptions};

mod common;
use common::{replay, Peek, Service};

/// `n` transactions of a few keys each from `db`.
fn write(db: &Database, n: u64, tag: &str) {
    for i in 0..n {
        let o = db.transact(Isolation::Serializable, |tx| {
            tx.put(
                format!("k/{:05}", i % 700).as_bytes(),
                format!("{tag}{i}").as_bytes(),
            )?;
            tx.put(format!("{tag}/{i:06}").as_bytes(), b"x")
        });
        o.unwrap();
    }
}

/// Both nodes' states once they are at the same position (a publishing
/// node may still be appending a checkpoint's parts).
fn same_position(a: &Database, b: &Database) -> (melddb::Snapshot, melddb::Snapshot) {
    for _ in 0..1_000 {
        a.sync_with_log().unwrap();
        b.sync_with_log().unwrap();
        let (x, y) = (a.snapshot(), b.snapshot());
        if x.pos() == y.pos() {
            return (x, y);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the nodes never stood at the same position");
}

fn publisher_options(trim: bool) -> DbOptions {
    publisher_options_with(trim, Settings::default())
}

fn publisher_options_with(trim: bool, settings: Settings) -> DbOptions {
    DbOptions {
        settings,
        publish_checkpoints: true,
        checkpoint_bytes: 64 << 10,
        checkpoint_part_bytes: 16 << 10,
        trim_log: trim,
        ..DbOptions::default()
    }
}

#[test]
fn a_late_node_joins_from_the_latest_published_checkpoint_and_agrees_with_a_replay() {
    late_join(Settings::default(), 3_000);
}

/// The same with premeld and group meld on (the log's genesis asks for
/// them): checkpoint records never join a pair, so the state a begin
/// record holds exists on the publisher, the joiner and the replay alike.
#[test]
fn with_premeld_and_group_meld_a_late_node_joins_from_a_published_checkpoint() {
    late_join(
        Settings {
            premeld_threads: 2,
            premeld_distance: 1,
            group_meld: true,
            ..Settings::default()
        },
        1_500,
    );
}

fn late_join(settings: Settings, n: u64) {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    let url = format!("melddb://{}/bank", svc.addr);
    let p = Database::connect(
        &url,
        d.path().join("p"),
        publisher_options_with(false, settings),
    )
    .unwrap();
    write(&p, n, "a");
    let info = p.checkpoint().unwrap();
    assert!(info.nodes > 700, "{info:?}");
    let stats = p.log_stats();
    assert!(stats.checkpoints_written >= 2, "{stats:?}");
    assert_eq!(stats.checkpoint_error, None);
    write(&p, 200, "b");

    let latest = p.log_stats().last_checkpoint.unwrap().first;
    assert!(latest >= info.first);
    let j = Database::connect(&url, d.path().join("j"), DbOptions::default()).unwrap();
    let r = j.recovery();
    assert_eq!(r.checkpoint, Some(latest), "{r:?}");
    assert!(
        r.replayed < 1_000,
        "joined from the checkpoint at {}, yet melded {} entries",
        info.first,
        r.replayed
    );
    // Both up to date: the same state; and the state a replay of the
    // whole log from genesis reaches.
    let (ps, js) = same_position(&p, &j);
    assert_eq!(ps.digest_hex().unwrap(), js.digest_hex().unwrap());
    let (_, digests) = replay(&Peek::new(&svc.addr).entries("bank"));
    assert_eq!(digests.get(&js.pos()), Some(&js.digest_hex().unwrap()));
    // The joiner commits like any node.
    let o = j.transact(Isolation::Serializable, |tx| tx.put(b"from-j", b"1"));
    o.unwrap();
    p.sync_with_log().unwrap();
    assert_eq!(p.get(b"from-j").unwrap().as_deref(), Some(&b"1"[..]));
}

#[test]
fn with_trimming_the_log_starts_at_a_checkpoint_and_newcomers_still_join() {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    let url = format!("melddb://{}/bank", svc.addr);
    let p = Database::connect(&url, d.path().join("p"), publisher_options(true)).unwrap();
    write(&p, 1_500, "a");
    p.checkpoint().unwrap();
    write(&p, 100, "b");
    p.checkpoint().unwrap();
    let stats = p.log_stats();
    assert!(stats.trims >= 1 && stats.first > 0, "{stats:?}");
    // Never above the previous published checkpoint: the latest one and
    // the one before stay whole.
    assert!(stats.first < stats.last_checkpoint.as_ref().unwrap().first);

    let j = Database::connect(&url, d.path().join("j"), DbOptions::default()).unwrap();
    assert!(j.recovery().checkpoint.is_some());
    let (ps, js) = same_position(&p, &j);
    assert_eq!(ps.digest_hex().unwrap(), js.digest_hex().unwrap());
    assert_eq!(
        j.get(b"k/00007").unwrap().as_deref(),
        p.get(b"k/00007").unwrap().as_deref()
    );

    // A node cannot join a trimmed log with no published checkpoint to
    // load: a clear error, not a wrong state.
    let other = format!("melddb://{}/other", svc.addr);
    let o = Database::connect(&other, d.path().join("o"), DbOptions::default()).unwrap();
    write(&o, 20, "o");
    drop(o);
    Peek::new(&svc.addr).trim("other", 5);
    let e = Database::connect(&other, d.path().join("o2"), DbOptions::default()).unwrap_err();
    assert!(
        matches!(e, DbError::Unrecoverable { .. }) && e.to_string().contains("trimmed"),
        "{e}"
    );
}

/// A token that may read and append the log but not its companion log:
/// the node replays from genesis instead of failing to connect, and says
/// why it did not use a published checkpoint.
#[test]
fn a_token_without_rights_on_the_companion_log_replays_from_genesis() {
    let d = tempfile::tempdir().unwrap();
    let mut cfg = common::service_config(&d.path().join("service"));
    cfg.tokens.insert(
        "all".into(),
        melddb_log::Rights {
            logs: vec!["*".into()],
            read: true,
            append: true,
        },
    );
    cfg.tokens.insert(
        "bank-only".into(),
        melddb_log::Rights {
            logs: vec!["bank".into()],
            read: true,
            append: true,
        },
    );
    let svc = Service::start_with(cfg);
    let url = format!("melddb://{}/bank", svc.addr);
    let with = |token: &str, publish: bool| DbOptions {
        token: Some(token.into()),
        ..(if publish {
            publisher_options(false)
        } else {
            DbOptions::default()
        })
    };
    let p = Database::connect(&url, d.path().join("p"), with("all", true)).unwrap();
    write(&p, 300, "a");
    p.checkpoint().unwrap();
    let j = Database::connect(&url, d.path().join("j"), with("bank-only", false)).unwrap();
    let r = j.recovery();
    assert_eq!(r.checkpoint, None, "{r:?}");
    assert!(
        r.skipped_checkpoints
            .iter()
            .any(|s| s.contains("bank.ckpt")),
        "{r:?}"
    );
    let (ps, js) = same_position(&p, &j);
    assert_eq!(ps.digest_hex().unwrap(), js.digest_hex().unwrap());
}

/// The node's calls block their thread on a runtime of the node's own, so
/// they work from inside an async runtime too (blocking that thread, as
/// any blocking call does), and dropping a node there does not panic.
#[test]
fn a_node_works_from_inside_an_async_runtime() {
    let d = tempfile::tempdir().unwrap();
    let svc = Service::start(&d.path().join("service"));
    let url = format!("melddb://{}/bank", svc.addr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = d.path().join("n");
    rt.block_on(async move {
        let node = Database::connect(&url, dir, DbOptions::default()).unwrap();
        node.transact(melddb::Isolation::Serializable, |tx| tx.put(b"k", b"v"))
            .unwrap();
        node.sync_with_log().unwrap();
        assert_eq!(node.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
        drop(node);
    });
}
