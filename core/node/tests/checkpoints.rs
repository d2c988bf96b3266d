//! Checkpoints and log trimming in the embedded database: recovery starts
//! at the latest checkpoint and reaches the same state, the log below the
//! previous checkpoint is deleted, a checkpoint that does not verify is
//! skipped for an older one, and nothing is lost on the way.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread;

use melddb::validate::check_tree;
use melddb::{Isolation, Settings};
use melddb_runtime::{Database, DbError, DbOptions, Durability, Unrecoverable};

mod common;
use common::{account, balance, seed_accounts, spawn_transfers};

/// Checkpoints only when asked; commits acknowledged without waiting
/// for the disk (these tests are about checkpoints, not fsync).
fn manual_buffered() -> DbOptions {
    DbOptions {
        checkpoint_bytes: 0,
        durability: Durability::Buffered,
        ..DbOptions::default()
    }
}

/// Checkpoints only when asked, and every one kept.
fn explicit_checkpoints_untrimmed() -> DbOptions {
    DbOptions {
        checkpoint_bytes: 0,
        trim_log: false,
        ..DbOptions::default()
    }
}

fn small_checkpoints_with(settings: Settings) -> DbOptions {
    DbOptions {
        settings,
        durability: Durability::Buffered,
        max_in_flight: 16,
        retry: melddb_runtime::RetryPolicy {
            max_attempts: 500,
            ..Default::default()
        },
        segment_bytes: 128 << 10,
        checkpoint_bytes: 48 << 10,
        checkpoint_part_bytes: 4096,
        ..DbOptions::default()
    }
}

/// Transfers on 4 threads plus inserts on a fifth; returns the inserted
/// pairs (the model).
fn workload(db: &Arc<Database>, accounts: u64, rounds: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    seed_accounts(db, accounts);
    let movers = spawn_transfers(db, accounts, rounds, 3);
    let mut model = BTreeMap::new();
    for i in 0..rounds {
        let k = format!("item/{:06}", (i * 7919) % 100_000).into_bytes();
        let v = format!("{i}-").repeat(40).into_bytes();
        db.transact(Isolation::Serializable, |tx| tx.put(&k, &v))
            .unwrap();
        model.insert(k, v);
    }
    for m in movers {
        m.join().unwrap();
    }
    model
}

fn check(db: &Database, accounts: u64, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    let s = db.snapshot();
    check_tree(&s).unwrap();
    let total: i64 = (0..accounts)
        .map(|i| balance(s.get(&account(i)).unwrap()))
        .sum();
    assert_eq!(total, 1000 * accounts as i64, "money was created or lost");
    let items: BTreeMap<Vec<u8>, Vec<u8>> = s
        .to_vec()
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.starts_with(b"item/"))
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect();
    assert_eq!(&items, model);
}

#[test]
fn recovery_starts_at_the_latest_checkpoint_and_the_log_is_trimmed() {
    recovery_from_the_latest_checkpoint(Settings::default());
}

/// Premeld and group meld write, trim and recover from checkpoints like
/// plain meld (a checkpoint record never joins a group-meld pair).
#[test]
fn with_premeld_and_group_meld_recovery_starts_at_the_latest_checkpoint() {
    for (t, d, group) in [(1, 2, false), (0, 0, true), (2, 1, true)] {
        recovery_from_the_latest_checkpoint(Settings {
            premeld_threads: t,
            premeld_distance: d,
            group_meld: group,
            ..Settings::default()
        });
    }
}

fn recovery_from_the_latest_checkpoint(settings: Settings) {
    let small_checkpoints = || small_checkpoints_with(settings);
    let d = tempfile::tempdir().unwrap();
    let accounts = 16;
    let db = Arc::new(Database::open_with(d.path(), small_checkpoints()).unwrap());
    let model = workload(&db, accounts, 400);
    check(&db, accounts, &model);
    // The background thread finishes the last checkpoint begun (its sync
    // and trim); give it a moment rather than racing it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut stats = db.log_stats();
    while stats.checkpoints_written < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        stats = db.log_stats();
    }
    assert!(stats.checkpoints_written >= 3, "{stats:?}");
    assert!(stats.trims >= 1 && stats.first > 0, "{stats:?}");
    let before = db.snapshot();
    drop(db);
    // The genesis record and every segment wholly below the first
    // retained position are gone from the directory. (How far the trim
    // point trails the tail depends on when the background thread finished
    // the last checkpoint, so the count itself is not fixed.)
    let mut firsts: Vec<u64> = std::fs::read_dir(d.path())
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".seg")?.parse().ok()
        })
        .collect();
    firsts.sort_unstable();
    assert!(!firsts.is_empty());
    assert!(
        firsts[0] > 0,
        "the genesis segment is still there: {firsts:?}"
    );
    assert!(
        firsts.iter().filter(|&&f| f <= stats.first).count() <= 1,
        "segments wholly below the first retained position {} are left: {firsts:?}",
        stats.first
    );

    let db = Database::open_with(d.path(), small_checkpoints()).unwrap();
    let r = db.recovery().clone();
    let last = db.log_stats().last_checkpoint.unwrap();
    assert_eq!(r.checkpoint, Some(last.first), "{r:?}");
    assert_eq!(r.replayed, db.log_stats().tail - last.first - 1);
    assert!(r.skipped_checkpoints.is_empty());
    same_state(&db.snapshot(), &before);
    check(&db, accounts, &model);
    // And it keeps working: commit, reopen again.
    db.transact(Isolation::Serializable, |tx| tx.put(b"after", b"reopen"))
        .unwrap();
    let before = db.snapshot();
    drop(db);
    let db = Database::open_with(d.path(), small_checkpoints()).unwrap();
    same_state(&db.snapshot(), &before);
}

/// The same state, node identities included. (The position may differ:
/// parts of a checkpoint still being appended in the background when the
/// snapshot was taken add no-op entries.)
fn same_state(after: &melddb::Snapshot, before: &melddb::Snapshot) {
    assert_eq!(after.to_vec(), before.to_vec());
    assert_eq!(after.csn(), before.csn());
    assert_eq!(melddb::validate::vns(after), melddb::validate::vns(before));
}

#[test]
fn an_explicit_checkpoint_makes_recovery_replay_only_its_parts() {
    let d = tempfile::tempdir().unwrap();
    let opts = DbOptions {
        checkpoint_bytes: 0,
        ..DbOptions::default()
    };
    let db = Arc::new(Database::open_with(d.path(), opts.clone()).unwrap());
    let model = workload(&db, 8, 120);
    assert_eq!(
        db.log_stats().checkpoints_written,
        0,
        "automatic ones are off"
    );
    let before = db.unpersisted_nodes();
    let info = db.checkpoint().unwrap();
    assert_eq!(info.flushed_ephemeral, before);
    assert_eq!(db.unpersisted_nodes(), 0, "the checkpoint persisted them");
    assert_eq!(info.nodes, db.snapshot().len().unwrap() as u64);
    let digest = db.snapshot().digest().unwrap();
    drop(db);
    let db = Database::open_with(d.path(), opts).unwrap();
    assert_eq!(db.recovery().checkpoint, Some(info.first));
    assert_eq!(db.recovery().replayed, info.pos - info.first);
    assert_eq!(db.snapshot().digest().unwrap(), digest);
    check(&db, 8, &model);
}

#[test]
fn concurrent_commits_create_unpersisted_state_that_a_checkpoint_flushes() {
    let d = tempfile::tempdir().unwrap();
    let db = Arc::new(Database::open_with(d.path(), manual_buffered()).unwrap());
    let runner = {
        let db = db.clone();
        thread::spawn(move || workload(&db, 16, 300))
    };
    // Five threads commit on snapshots that are often behind: meld merges
    // their intentions, creating ephemeral nodes along the way.
    let mut most = 0;
    while !runner.is_finished() {
        most = most.max(db.unpersisted_nodes());
        thread::sleep(std::time::Duration::from_micros(300));
    }
    runner.join().unwrap();
    // Whether the threads above interleaved depends on the scheduler; two
    // transactions begun on the same snapshot always meld concurrently.
    let (mut a, mut b) = (
        db.begin(Isolation::Serializable),
        db.begin(Isolation::Serializable),
    );
    a.put(b"concurrent-a", b"1").unwrap();
    b.put(b"concurrent-b", b"2").unwrap();
    assert!(db.commit(a).unwrap().is_committed());
    assert!(db.commit(b).unwrap().is_committed());
    most = most.max(db.unpersisted_nodes());
    assert!(most > 0, "no ephemeral node was ever reachable");
    db.checkpoint().unwrap();
    assert_eq!(db.unpersisted_nodes(), 0);
}

#[test]
fn a_checkpoint_that_does_not_verify_is_skipped_for_the_previous_one() {
    let d = tempfile::tempdir().unwrap();
    let opts = explicit_checkpoints_untrimmed();
    let db = Arc::new(Database::open_with(d.path(), opts.clone()).unwrap());
    let model = workload(&db, 8, 60);
    let good = db.checkpoint().unwrap();
    db.transact(Isolation::Serializable, |tx| {
        tx.put(b"between", b"checkpoints")
    })
    .unwrap();
    let bad = db.checkpoint().unwrap();
    let contents = db.snapshot().to_vec();
    drop(db);
    // Change one byte of the newest checkpoint's last part on disk and
    // re-seal both the part's CRC and the log record's CRC: every checksum
    // holds, only the checkpoint's own body checks can notice.
    corrupt_sealed(d.path(), bad.pos);
    let db = Database::open_with(d.path(), opts).unwrap();
    let r = db.recovery().clone();
    assert_eq!(r.checkpoint, Some(good.first), "{r:?}");
    assert_eq!(r.skipped_checkpoints.len(), 1, "{r:?}");
    assert_eq!(db.snapshot().to_vec(), contents);
    check(&db, 8, &model);
}

/// Flips a bit in the middle of the log record at `pos` (a checkpoint
/// part) and re-seals the part's CRC and the record's CRC.
fn corrupt_sealed(dir: &std::path::Path, pos: u64) {
    let mut segs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    for seg in segs {
        let mut bytes = std::fs::read(&seg).unwrap();
        let mut at = 8;
        while at + 16 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            let rpos = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap());
            if len == 0 && rpos == 0 {
                break; // the zero-filled space after the data
            }
            if rpos == pos {
                let payload = &mut bytes[at + 16..at + 16 + len];
                payload[len / 2] ^= 0x01;
                let crc = crc32fast::hash(&payload[..len - 4]);
                payload[len - 4..].copy_from_slice(&crc.to_le_bytes());
                let mut h = crc32fast::Hasher::new();
                h.update(&pos.to_le_bytes());
                h.update(&bytes[at + 16..at + 16 + len]);
                let rcrc = h.finalize();
                bytes[at + 4..at + 8].copy_from_slice(&rcrc.to_le_bytes());
                std::fs::write(&seg, bytes).unwrap();
                return;
            }
            at += 16 + len;
        }
    }
    panic!("record {pos} not found");
}

#[test]
fn with_every_checkpoint_damaged_recovery_falls_back_to_genesis_or_refuses() {
    // Untrimmed: the genesis record is still there, so replay from it.
    let d = tempfile::tempdir().unwrap();
    let opts = explicit_checkpoints_untrimmed();
    let db = Arc::new(Database::open_with(d.path(), opts.clone()).unwrap());
    let model = workload(&db, 8, 40);
    let a = db.checkpoint().unwrap();
    let b = db.checkpoint().unwrap();
    let contents = db.snapshot().to_vec();
    drop(db);
    corrupt_sealed(d.path(), a.pos);
    corrupt_sealed(d.path(), b.pos);
    let db = Database::open_with(d.path(), opts).unwrap();
    let r = db.recovery().clone();
    assert_eq!(r.checkpoint, None, "{r:?}");
    assert_eq!(r.skipped_checkpoints.len(), 2, "{r:?}");
    assert_eq!(db.snapshot().to_vec(), contents);
    check(&db, 8, &model);
    drop(db);

    // Trimmed: nothing verifiable is left to start from; say so.
    let d = tempfile::tempdir().unwrap();
    let opts = DbOptions {
        checkpoint_bytes: 0,
        segment_bytes: 16 << 10,
        ..DbOptions::default()
    };
    let db = Arc::new(Database::open_with(d.path(), opts.clone()).unwrap());
    let _ = workload(&db, 8, 40);
    let cps: Vec<_> = (0..3).map(|_| db.checkpoint().unwrap()).collect();
    assert!(db.log_stats().first > 0, "trimmed");
    drop(db);
    corrupt_sealed(d.path(), cps[1].pos);
    corrupt_sealed(d.path(), cps[2].pos);
    match Database::open_with(d.path(), opts) {
        Err(DbError::Unrecoverable {
            cause: Unrecoverable::NoCheckpoint { first, tried },
            ..
        }) => {
            assert!(first > 0);
            assert!(!tried.is_empty(), "the damaged checkpoints were tried");
            assert!(
                tried.iter().all(|t| t.starts_with("checkpoint begun at")),
                "{tried:?}"
            );
        }
        other => panic!("expected Unrecoverable, got {other:?}"),
    }
}

#[test]
fn a_checkpoint_asked_for_covers_every_commit_made_before_the_call() {
    let d = tempfile::tempdir().unwrap();
    // Four threads ask for a checkpoint after every commit, so a barrier
    // lands between a transaction's begin and its commit far more often
    // than with automatic checkpoints (each such attempt aborts with
    // SnapshotUnavailable and is retried): allow more retries than the
    // default 16.
    let opts = DbOptions {
        retry: melddb_runtime::RetryPolicy {
            max_attempts: 1000,
            ..Default::default()
        },
        ..manual_buffered()
    };
    let db = Arc::new(Database::open_with(d.path(), opts).unwrap());
    let askers: Vec<_> = (0..4u64)
        .map(|t| {
            let db = db.clone();
            thread::spawn(move || {
                for i in 0..50u64 {
                    db.transact(Isolation::Serializable, |tx| {
                        tx.put(format!("t{t}/{i}").as_bytes(), &[1u8; 200])
                    })
                    .unwrap();
                    let seen = db.snapshot().csn();
                    let info = db.checkpoint().unwrap();
                    // Joining a checkpoint already in progress would give
                    // an older state than this caller has seen.
                    assert!(info.csn >= seen, "checkpoint csn {} < {seen}", info.csn);
                }
            })
        })
        .collect();
    for a in askers {
        a.join().unwrap();
    }
    assert!(db.log_stats().checkpoints_written >= 50);
}
