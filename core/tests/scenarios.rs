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

fn commit(db: &mut Database, snap: &Snapshot, iso: Isolation, f: impl FnOnce(&mut Transaction)) -> Outcome {
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

