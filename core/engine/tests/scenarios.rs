//! Hand-built conflict scenarios with known answers.

use melddb::{Database, Isolation, Outcome, Settings, Snapshot, Transaction};

fn k(i: u64) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

fn db_with(keys: &[u64]) -> Database {
    let mut db = Database::create(Settings::default()).unwrap();
    let mut tx = db.begin(Isolation::Serializable);
    for i in keys {
        tx.put(&k(*i), b"init").unwrap();
    }
    assert!(db.commit(tx).unwrap().is_committed());
    db
}

fn commit(
    db: &mut Database,
    snap: &Snapshot,
    iso: Isolation,
    f: impl FnOnce(&mut Transaction),
) -> Outcome {
    let mut tx = Transaction::begin(snap, iso);
    f(&mut tx);
    db.commit(tx).unwrap()
}

fn aborted(o: &Outcome) -> bool {
    matches!(o, Outcome::Aborted { .. })
}

#[test]
fn delete_then_reinsert_conflicts_with_concurrent_delete() {
    for n in [2u64, 3, 5, 8, 16] {
        let keys: Vec<u64> = (0..n).collect();
        let mut db = db_with(&keys);
        let s = db.snapshot();
        let a = commit(&mut db, &s, Isolation::Serializable, |t| {
            assert!(t.delete(&k(0)).unwrap());
        });
        assert!(a.is_committed(), "n={n}: {a:?}");
        let b = commit(&mut db, &s, Isolation::Serializable, |t| {
            assert!(t.delete(&k(0)).unwrap());
            t.put(&k(0), b"again").unwrap();
        });
        assert!(aborted(&b), "n={n}: {b:?}");
    }
}

fn scan_all(t: &mut Transaction, a: u64, b: u64) -> usize {
    t.range(
        std::ops::Bound::Included(&k(a)[..]),
        std::ops::Bound::Included(&k(b)[..]),
        melddb::Order::Forward,
        None,
    )
    .collect::<Result<Vec<_>, _>>()
    .unwrap()
    .len()
}

#[test]
fn phantom_aborts_only_serializable() {
    for (iso, expect_abort) in [
        (Isolation::Serializable, true),
        (Isolation::RepeatableRead, false),
        (Isolation::SnapshotIsolation, false),
    ] {
        let mut db = db_with(&[10, 20, 30, 40]);
        let s = db.snapshot();
        // Concurrently insert 25 into the range [20, 30] that `b` scans.
        assert!(commit(&mut db, &s, iso, |t| t.put(&k(25), b"x").unwrap()).is_committed());
        let b = commit(&mut db, &s, iso, |t| {
            assert_eq!(scan_all(t, 20, 30), 2);
            t.put(&k(99), b"sum").unwrap();
        });
        assert_eq!(aborted(&b), expect_abort, "{iso:?}: {b:?}");
        if expect_abort {
            assert!(matches!(
                b,
                Outcome::Aborted {
                    reason: melddb::AbortReason::Phantom { .. },
                    ..
                }
            ));
        }
    }
}

#[test]
fn change_outside_scanned_range_is_no_phantom() {
    let mut db = db_with(&[10, 20, 30, 40]);
    let s = db.snapshot();
    assert!(commit(&mut db, &s, Isolation::Serializable, |t| t
        .put(&k(35), b"x")
        .unwrap())
    .is_committed());
    let b = commit(&mut db, &s, Isolation::Serializable, |t| {
        scan_all(t, 20, 30);
        t.put(&k(99), b"sum").unwrap();
    });
    assert!(b.is_committed(), "{b:?}");
}

#[test]
fn absent_read_sees_insert_then_delete_in_zone() {
    let mut db = db_with(&[10, 20]);
    let s = db.snapshot();
    assert!(commit(&mut db, &s, Isolation::SnapshotIsolation, |t| t
        .put(&k(15), b"x")
        .unwrap())
    .is_committed());
    let s2 = db.snapshot();
    assert!(
        commit(&mut db, &s2, Isolation::SnapshotIsolation, |t| assert!(t
            .delete(&k(15))
            .unwrap()))
        .is_committed()
    );
    // Net effect on the tree: nothing; but 15 was written in the zone.
    let b = commit(&mut db, &s, Isolation::Serializable, |t| {
        assert_eq!(t.get(&k(15)).unwrap(), None);
        t.put(&k(11), b"y").unwrap();
    });
    assert!(
        matches!(
            b,
            Outcome::Aborted {
                reason: melddb::AbortReason::Phantom { .. },
                ..
            }
        ),
        "{b:?}"
    );
}

#[test]
fn read_write_conflict_depends_on_level() {
    for (iso, expect_abort) in [
        (Isolation::Serializable, true),
        (Isolation::RepeatableRead, true),
        (Isolation::SnapshotIsolation, false),
    ] {
        let mut db = db_with(&[1, 2, 3]);
        let s = db.snapshot();
        assert!(commit(&mut db, &s, iso, |t| t.put(&k(1), b"new").unwrap()).is_committed());
        let b = commit(&mut db, &s, iso, |t| {
            t.get(&k(1)).unwrap();
            t.put(&k(3), b"w").unwrap();
        });
        assert_eq!(aborted(&b), expect_abort, "{iso:?}: {b:?}");
    }
}

#[test]
fn write_skew_is_prevented_only_by_serializable() {
    for (iso, expect_abort) in [
        (Isolation::Serializable, true),
        (Isolation::SnapshotIsolation, false),
    ] {
        let mut db = db_with(&[1, 2]);
        let s = db.snapshot();
        let a = commit(&mut db, &s, iso, |t| {
            t.get(&k(1)).unwrap();
            t.get(&k(2)).unwrap();
            t.put(&k(1), b"off").unwrap();
        });
        assert!(a.is_committed());
        let b = commit(&mut db, &s, iso, |t| {
            t.get(&k(1)).unwrap();
            t.get(&k(2)).unwrap();
            t.put(&k(2), b"off").unwrap();
        });
        assert_eq!(aborted(&b), expect_abort, "{iso:?}");
    }
}

#[test]
fn concurrent_disjoint_inserts_and_deletes_all_commit() {
    let keys: Vec<u64> = (0..200).map(|i| i * 10).collect();
    let mut db = db_with(&keys);
    let s = db.snapshot();
    for i in 0..50u64 {
        let o = commit(&mut db, &s, Isolation::Serializable, |t| {
            t.put(&k(i * 40 + 5), b"ins").unwrap();
            assert!(t.delete(&k(i * 40 + 20)).unwrap());
            t.get(&k(i * 40 + 30)).unwrap();
        });
        assert!(o.is_committed(), "{i}: {o:?}");
        melddb::validate::check_tree(&db.snapshot()).unwrap();
    }
    assert_eq!(db.snapshot().len(), Ok(200));
}

#[test]
fn read_only_transactions_append_nothing() {
    let mut db = db_with(&[1]);
    let before = melddb::Log::tail(db.log());
    let mut t = db.begin(Isolation::Serializable);
    assert_eq!(t.get(&k(1)).unwrap().as_deref(), Some(&b"init"[..]));
    assert_eq!(db.commit(t).unwrap(), Outcome::ReadOnly);
    assert_eq!(melddb::Log::tail(db.log()), before);
}

#[test]
fn snapshot_older_than_the_conflict_zone_bound_aborts() {
    let settings = Settings {
        max_conflict_zone: 4,
        ..Settings::default()
    };
    let mut db = Database::create(settings).unwrap();
    let s = db.snapshot();
    for i in 0..4 {
        let now = db.snapshot();
        assert!(commit(&mut db, &now, Isolation::Serializable, |t| t
            .put(&k(i), b"x")
            .unwrap())
        .is_committed());
    }
    // Zone of exactly 4 entries: accepted.
    assert!(commit(&mut db, &s, Isolation::SnapshotIsolation, |t| t
        .put(&k(100), b"y")
        .unwrap())
    .is_committed());
    // Zone of 5: rejected deterministically.
    let o = commit(&mut db, &s, Isolation::SnapshotIsolation, |t| {
        t.put(&k(101), b"y").unwrap()
    });
    assert!(
        matches!(
            o,
            Outcome::Aborted {
                reason: melddb::AbortReason::SnapshotTooOld { .. },
                ..
            }
        ),
        "{o:?}"
    );
}

#[test]
fn trimmed_positions_are_errors_and_never_reused() {
    use melddb::{Log, LogError, MemLog};
    let mut log = MemLog::new();
    for i in 0..5u8 {
        assert_eq!(log.append(&[i]).unwrap(), i as u64);
    }
    log.trim(3).unwrap();
    assert!(matches!(
        log.read(1),
        Err(LogError::Trimmed { pos: 1, first: 3 })
    ));
    assert_eq!(&log.read(3).unwrap()[..], &[3]);
    assert_eq!(log.append(&[9]).unwrap(), 5);
    assert!(matches!(log.read(6), Err(LogError::NotYetWritten { .. })));
    assert!(log.trim(7).is_err());
}

#[test]
fn two_nodes_on_one_log_compute_identical_states() {
    let keys: Vec<u64> = (0..64).collect();
    let mut db = db_with(&keys);
    let mut snaps = vec![db.snapshot()];
    for i in 0..300u64 {
        let s = snaps[snaps.len().saturating_sub(1 + (i as usize * 7) % 9)].clone();
        commit(&mut db, &s, Isolation::Serializable, |t| {
            t.get(&k((i * 13) % 64)).unwrap();
            t.put(&k((i * 29) % 70), &i.to_be_bytes()).unwrap();
            if i % 5 == 0 {
                t.delete(&k((i * 3) % 64)).unwrap();
            }
        });
        snaps.push(db.snapshot());
    }
    let replica = Database::open(db.log().clone()).unwrap();
    assert_eq!(replica.snapshot().csn(), db.snapshot().csn());
    assert_eq!(
        melddb::validate::vns(&replica.snapshot()),
        melddb::validate::vns(&db.snapshot())
    );
    assert_eq!(replica.snapshot().to_vec(), db.snapshot().to_vec());
}

#[test]
fn foreign_snapshot_is_refused() {
    let mut a = Database::create(Settings {
        db_id: 1,
        ..Settings::default()
    })
    .unwrap();
    let b = Database::create(Settings {
        db_id: 2,
        ..Settings::default()
    })
    .unwrap();
    let mut t = b.begin(Isolation::Serializable);
    t.put(b"x", b"y").unwrap();
    assert_eq!(a.commit(t), Err(melddb::CommitError::ForeignSnapshot));
}

#[test]
fn genesis_records_the_pipeline_settings_and_rejects_bad_ones() {
    let s = Settings {
        db_id: 9,
        max_conflict_zone: 100,
        premeld_threads: 5,
        premeld_distance: 10,
        group_meld: true,
    };
    assert_eq!(Settings::decode(&s.encode()).unwrap(), s);
    // A version-1 record (no pipeline settings) still opens, with both off.
    let mut v1 = b"MLDG\x01".to_vec();
    v1.extend_from_slice(&[7, 100]);
    v1.extend_from_slice(&crc32fast::hash(&v1).to_le_bytes());
    let old = Settings::decode(&v1).unwrap();
    assert_eq!(
        (old.db_id, old.premeld_threads, old.group_meld),
        (7, 0, false)
    );
    // t*d + 1 must stay inside the conflict-zone window.
    let too_far = Settings {
        premeld_distance: 20,
        ..s
    };
    assert!(too_far.validate().is_err());
    assert!(Settings::decode(&too_far.encode()).is_err());
    let no_distance = Settings {
        premeld_distance: 0,
        ..s
    };
    assert!(no_distance.validate().is_err());
}

#[test]
fn database_with_group_meld_decides_a_lone_commit_with_a_filler() {
    let mut db = Database::create(Settings {
        group_meld: true,
        premeld_threads: 1,
        premeld_distance: 1,
        ..Settings::default()
    })
    .unwrap();
    for i in 0..5u8 {
        let mut tx = db.begin(Isolation::Serializable);
        tx.put(&[i], b"v").unwrap();
        assert!(db.commit(tx).unwrap().is_committed());
    }
    assert_eq!(db.snapshot().len(), Ok(5));
}
