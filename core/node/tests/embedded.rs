//! The embedded database: commits survive reopening, many threads commit
//! at once without losing money in a closed economy, group meld settings
//! work through the filler, and transact gives up with a clear error.

use std::sync::Arc;
use std::thread;

use melddb::{Isolation, Outcome, Settings};
use melddb_runtime::{Database, DbError, DbOptions, Durability, TransactError};

mod common;
use common::{account, balance, seed_accounts, spawn_transfers};

fn total(db: &Database, n: u64) -> i64 {
    let s = db.snapshot();
    (0..n).map(|i| balance(s.get(&account(i)).unwrap())).sum()
}

#[test]
fn commits_survive_reopening() {
    let d = tempfile::tempdir().unwrap();
    let digest = {
        let db = Database::open(d.path()).unwrap();
        for i in 0..50u32 {
            let mut tx = db.begin(Isolation::Serializable);
            tx.put(&i.to_be_bytes(), format!("v{i}").as_bytes())
                .unwrap();
            assert!(matches!(db.commit(tx).unwrap(), Outcome::Committed { .. }));
        }
        let s = db.snapshot().digest().unwrap();
        db.close().unwrap();
        s
    };
    let db = Database::open(d.path()).unwrap();
    assert_eq!(
        db.snapshot().digest().unwrap(),
        digest,
        "recovery replays to the same state"
    );
    assert_eq!(db.recovery().records, 51);
    assert_eq!(
        db.get(&7u32.to_be_bytes()).expect("read").as_deref(),
        Some(&b"v7"[..])
    );
}

#[test]
fn concurrent_transfers_keep_the_total_and_reopen_identically() {
    for settings in [
        Settings::default(),
        Settings {
            premeld_threads: 2,
            premeld_distance: 1,
            group_meld: true,
            ..Settings::default()
        },
    ] {
        let d = tempfile::tempdir().unwrap();
        let n = 20;
        let opts = DbOptions {
            settings,
            durability: Durability::Buffered,
            max_in_flight: 8,
            retry: melddb_runtime::RetryPolicy {
                max_attempts: 200,
                ..Default::default()
            },
            ..DbOptions::default()
        };
        let db = Arc::new(Database::open_with(d.path(), opts.clone()).unwrap());
        seed_accounts(&db, n);
        for w in spawn_transfers(&db, n, 150, 7) {
            w.join().unwrap();
        }
        assert_eq!(total(&db, n), 1000 * n as i64);
        let digest = db.snapshot().digest().unwrap();
        drop(db);
        let db = Database::open_with(d.path(), opts).unwrap();
        assert_eq!(db.snapshot().digest().unwrap(), digest, "{settings:?}");
        assert_eq!(total(&db, n), 1000 * n as i64);
    }
}

#[test]
fn transact_gives_up_with_the_last_conflict() {
    let d = tempfile::tempdir().unwrap();
    let db = Database::open_with(
        d.path(),
        DbOptions {
            retry: melddb_runtime::RetryPolicy {
                max_attempts: 3,
                ..Default::default()
            },
            ..DbOptions::default()
        },
    )
    .unwrap();
    let mut calls = 0;
    let r = db.transact(Isolation::Serializable, |tx| {
        calls += 1;
        tx.get(b"k")?;
        // Someone else writes the key before this transaction commits.
        let mut other = db.begin(Isolation::Serializable);
        other.put(b"k", format!("{calls}").as_bytes())?;
        assert!(db.commit(other).unwrap().is_committed());
        tx.put(b"k", b"mine")?;
        Ok::<_, melddb::TxnError>(())
    });
    match r {
        Err(TransactError::Db(DbError::Conflict { attempts: 3, .. })) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(calls, 3);
}

/// The closure's own error ends the transaction at once, uncommitted and
/// not retried, and comes back as it was.
#[test]
fn transact_returns_the_callers_own_error_without_retrying() {
    #[derive(Debug, PartialEq)]
    enum Bank {
        Insufficient { have: i64 },
        Txn(String),
    }
    impl From<melddb::TxnError> for Bank {
        fn from(e: melddb::TxnError) -> Bank {
            Bank::Txn(e.to_string())
        }
    }
    let d = tempfile::tempdir().unwrap();
    let db = Database::open(d.path()).unwrap();
    db.transact(Isolation::Serializable, |tx| tx.put(b"alice", b"10"))
        .unwrap();
    let mut calls = 0;
    let r = db.transact(Isolation::Serializable, |tx| {
        calls += 1;
        let have: i64 = std::str::from_utf8(&tx.get(b"alice")?.unwrap())
            .unwrap()
            .parse()
            .unwrap();
        tx.put(b"alice", b"-90")?;
        if have < 100 {
            return Err(Bank::Insufficient { have });
        }
        Ok(())
    });
    match r {
        Err(TransactError::Aborted(e)) => assert_eq!(e, Bank::Insufficient { have: 10 }),
        other => panic!("{other:?}"),
    }
    assert_eq!(calls, 1);
    assert_eq!(db.get(b"alice").unwrap().as_deref(), Some(&b"10"[..]));
}

#[test]
fn a_directory_that_is_not_a_database_is_refused() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("00000000000000000000.seg"),
        b"not a segment at all",
    )
    .unwrap();
    assert!(matches!(Database::open(d.path()), Err(DbError::Log(_))));
}

#[test]
fn options_out_of_range_are_refused_with_the_option_and_its_range() {
    let d = tempfile::tempdir().unwrap();
    for (opts, name, value) in [
        (
            DbOptions {
                max_in_flight: 0,
                ..DbOptions::default()
            },
            "max_in_flight",
            0,
        ),
        (
            DbOptions {
                checkpoint_part_bytes: 100,
                ..DbOptions::default()
            },
            "checkpoint_part_bytes",
            100,
        ),
    ] {
        match Database::open_with(d.path(), opts) {
            Err(DbError::OptionOutOfRange {
                option,
                value: v,
                min,
                max,
            }) => {
                assert_eq!((option, v), (name, value));
                assert!(min > v && max >= min, "{min}..={max}");
            }
            other => panic!("expected OptionOutOfRange for {name}, got {other:?}"),
        }
    }
    let bad = DbOptions {
        settings: Settings {
            max_conflict_zone: 0,
            ..Settings::default()
        },
        ..DbOptions::default()
    };
    assert!(matches!(
        Database::open_with(d.path(), bad),
        Err(DbError::Settings(melddb::OpenError::Setting {
            name: "max_conflict_zone",
            ..
        }))
    ));
    // Nothing was created by the refused opens.
    let db = Database::open(d.path()).unwrap();
    assert_eq!(db.log_stats().tail, 1, "only the genesis record");
}

#[test]
fn trial_meld_rejects_a_doomed_commit_without_appending_it() {
    let d = tempfile::tempdir().unwrap();
    for trial in [true, false] {
        let dir = d.path().join(format!("trial-{trial}"));
        let db = Database::open_with(
            &dir,
            DbOptions {
                trial_meld: trial,
                ..DbOptions::default()
            },
        )
        .unwrap();
        let mut late = db.begin(Isolation::Serializable);
        late.get(b"k").unwrap();
        late.put(b"other", b"x").unwrap();
        let mut first = db.begin(Isolation::Serializable);
        first.put(b"k", b"1").unwrap();
        assert!(db.commit(first).unwrap().is_committed());
        let records_before = db.snapshot().pos();
        let outcome = db.commit(late).unwrap();
        match (trial, &outcome) {
            (true, Outcome::Rejected { .. }) => {
                assert_eq!(db.snapshot().pos(), records_before, "nothing appended")
            }
            (false, Outcome::Aborted { pos, .. }) => assert_eq!(*pos, records_before + 1),
            _ => panic!("trial {trial}: {outcome:?}"),
        }
        assert!(!outcome.is_committed());
    }
}

/// With `Durability::Sync` a state is published only once every commit in
/// it is on disk, so no reader sees a commit a crash could still lose.
/// Committers append and meld while the sync thread flushes; with group
/// meld the filler that closes each commit's pair must be covered too.
#[test]
fn readers_never_see_a_commit_before_it_is_durable() {
    for settings in [
        Settings::default(),
        Settings {
            premeld_threads: 2,
            premeld_distance: 1,
            group_meld: true,
            ..Settings::default()
        },
    ] {
        let d = tempfile::tempdir().unwrap();
        let n = 16;
        let db = Arc::new(
            Database::open_with(
                d.path(),
                DbOptions {
                    settings,
                    durability: Durability::Sync,
                    // Checkpoint parts are published before their flush
                    // (they hold no commit); keep them out of the check.
                    checkpoint_bytes: 0,
                    retry: melddb_runtime::RetryPolicy {
                        max_attempts: 200,
                        ..Default::default()
                    },
                    ..DbOptions::default()
                },
            )
            .unwrap(),
        );
        seed_accounts(&db, n);
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (db, done) = (db.clone(), done.clone());
            thread::spawn(move || {
                let mut checks = 0u64;
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    let seen = db.snapshot().pos();
                    let durable = db.log_stats().synced;
                    assert!(
                        seen < durable,
                        "{settings:?}: a snapshot at {seen} while only positions before {durable} are durable"
                    );
                    checks += 1;
                }
                checks
            })
        };
        for w in spawn_transfers(&db, n, 60, 3) {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        let checks = reader.join().unwrap();
        assert!(checks > 100, "the reader checked only {checks} snapshots");
        assert_eq!(total(&db, n), 1000 * n as i64);
    }
}

fn put_tx(db: &Database, i: u32) -> melddb::Transaction {
    let mut tx = db.begin(Isolation::Serializable);
    tx.put(&i.to_be_bytes(), format!("v{i}").as_bytes())
        .unwrap();
    tx
}

/// A commit whose handle is dropped unwaited is still flushed (by the
/// background thread) and its state published, so later transactions see
/// it without anyone waiting for it.
#[test]
fn commits_submitted_and_dropped_unwaited_become_durable_and_visible() {
    let d = tempfile::tempdir().unwrap();
    let db = Database::open(d.path()).unwrap();
    for i in 0..20u32 {
        drop(db.submit(put_tx(&db, i)).unwrap());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while db.get(&19u32.to_be_bytes()).unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the last unwaited commit was never published (durable before {})",
            db.log_stats().synced
        );
        thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(
        db.log_stats().synced >= 21,
        "published before it was durable"
    );
    for i in 0..20u32 {
        assert_eq!(
            db.get(&i.to_be_bytes()).unwrap().as_deref(),
            Some(format!("v{i}").as_bytes())
        );
    }
}

/// Admission control: with `max_in_flight` commits waiting for a flush,
/// the next `submit` waits for one before it appends, so unflushed
/// commits never pile up beyond the limit even if nobody waits.
#[test]
fn submit_beyond_max_in_flight_waits_for_a_flush_first() {
    let d = tempfile::tempdir().unwrap();
    let opts = DbOptions {
        max_in_flight: 4,
        checkpoint_bytes: 0,
        ..DbOptions::default()
    };
    let db = Database::open_with(d.path(), opts).unwrap();
    let mut handles = Vec::new();
    for i in 0..40u32 {
        handles.push(db.submit(put_tx(&db, i)).unwrap());
        let st = db.log_stats();
        assert!(
            st.tail - st.synced <= 5,
            "after {} submits {} records wait for a flush (limit 4 commits)",
            i + 1,
            st.tail - st.synced
        );
    }
    for h in handles {
        assert!(matches!(h.wait().unwrap(), Outcome::Committed { .. }));
    }
}

/// One open database per directory: a second open, in the same process,
/// is refused with `Locked` naming the directory and writes nothing; once
/// the first is dropped the directory opens again with every commit.
#[test]
fn a_second_open_of_a_directory_is_refused_until_the_first_is_dropped() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("db");
    let db = Database::open(&dir).unwrap();
    db.transact(Isolation::Serializable, |tx| tx.put(b"k", b"first"))
        .unwrap();
    let files = |dir: &std::path::Path| -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                (p.display().to_string(), std::fs::read(&p).unwrap())
            })
            .collect();
        v.sort();
        v
    };
    let before = files(&dir);
    for attempt in 0..2 {
        match Database::open(&dir) {
            Err(e @ DbError::Locked { .. }) => {
                let DbError::Locked { path, holder } = &e else {
                    unreachable!()
                };
                assert_eq!(path, &dir);
                assert_eq!(*holder, Some(std::process::id()));
                let msg = e.to_string();
                assert!(msg.contains(&dir.display().to_string()), "{msg}");
                assert!(msg.contains("already open"), "{msg}");
                assert!(msg.contains("close that one first"), "{msg}");
            }
            other => panic!("attempt {attempt}: expected Locked, got {other:?}"),
        }
    }
    assert_eq!(files(&dir), before, "a refused open changed the directory");
    db.transact(Isolation::Serializable, |tx| tx.put(b"k2", b"second"))
        .unwrap();
    drop(db);
    let db = Database::open(&dir).unwrap();
    assert_eq!(db.get(b"k").unwrap().as_deref(), Some(&b"first"[..]));
    assert_eq!(db.get(b"k2").unwrap().as_deref(), Some(&b"second"[..]));
    // `close` releases it too.
    db.close().unwrap();
    Database::open(&dir).unwrap();
}

/// With buffered durability commits are answered before a flush;
/// `sync()` flushes everything answered so far.
#[test]
fn sync_makes_buffered_commits_durable() {
    let d = tempfile::tempdir().unwrap();
    let db = Database::open_with(
        d.path(),
        DbOptions {
            durability: Durability::Buffered,
            ..DbOptions::default()
        },
    )
    .unwrap();
    for i in 0..10u32 {
        db.transact(Isolation::Serializable, |tx| tx.put(&i.to_be_bytes(), b"v"))
            .unwrap();
    }
    let before = db.log_stats();
    assert!(before.synced < before.tail, "{before:?}");
    db.sync().unwrap();
    let after = db.log_stats();
    assert_eq!(after.synced, after.tail, "{after:?}");
}
