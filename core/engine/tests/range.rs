//! Lazy range walks against a model map over random trees, bounds, orders
//! and limits: `Snapshot::range` over a committed state, and
//! `Transaction::range` over the same state with the transaction's own
//! uncommitted writes on top. Then what a walk in a transaction protects.

use std::collections::BTreeMap;
use std::ops::Bound;

use melddb::{Database, Isolation, Order, Settings, Transaction};
use proptest::prelude::*;

fn bound(b: (u8, u8)) -> Bound<Vec<u8>> {
    match b.0 % 3 {
        0 => Bound::Unbounded,
        1 => Bound::Included(vec![b.1]),
        _ => Bound::Excluded(vec![b.1]),
    }
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    b.as_ref().map(|v| &v[..])
}

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn expected(
    model: &BTreeMap<Vec<u8>, Vec<u8>>,
    start: &Bound<Vec<u8>>,
    end: &Bound<Vec<u8>>,
    reverse: bool,
    limit: Option<usize>,
) -> Pairs {
    let mut want: Pairs = model
        .range((start.clone(), end.clone()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if reverse {
        want.reverse();
    }
    want.truncate(limit.unwrap_or(usize::MAX));
    want
}

proptest! {
    #[test]
    fn lazy_walks_yield_what_a_model_does(
        keys in proptest::collection::btree_set(any::<u8>(), 0..120),
        deleted in proptest::collection::vec(any::<u8>(), 0..30),
        written in proptest::collection::vec(any::<u8>(), 0..30),
        start in (any::<u8>(), any::<u8>()),
        end in (any::<u8>(), any::<u8>()),
        reverse in any::<bool>(),
        limit in proptest::option::of(0usize..40),
        isolation in 0u8..3,
    ) {
        let (start, end) = (bound(start), bound(end));
        // `BTreeMap::range` refuses inverted or empty-exclusive bounds; the
        // walks must simply yield nothing for them.
        let inverted = match (&start, &end) {
            (Bound::Included(s) | Bound::Excluded(s), Bound::Included(e) | Bound::Excluded(e)) => {
                s > e || (s == e && !(matches!(start, Bound::Included(_)) && matches!(end, Bound::Included(_))))
            }
            _ => false,
        };
        let mut db = Database::create(Settings::default()).unwrap();
        let mut model = BTreeMap::new();
        let mut tx = db.begin(Isolation::Serializable);
        for &k in &keys {
            tx.put(&[k], &[k, 1]).unwrap();
            model.insert(vec![k], vec![k, 1]);
        }
        db.commit(tx).unwrap();
        let order = if reverse { Order::Reverse } else { Order::Forward };
        let snap = db.snapshot();
        let committed: Pairs = snap
            .range(as_ref(&start), as_ref(&end), order, limit)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .collect::<Result<_, _>>()
            .unwrap();
        let want = if inverted { Vec::new() } else { expected(&model, &start, &end, reverse, limit) };
        prop_assert_eq!(committed, want);

        // Uncommitted deletes and writes on top, seen by the transaction's
        // own walk (and by no walk of the snapshot).
        let isolation = [Isolation::Serializable, Isolation::RepeatableRead, Isolation::SnapshotIsolation][isolation as usize];
        let mut tx = db.begin(isolation);
        for &k in &deleted {
            tx.delete(&[k]).unwrap();
            model.remove(&vec![k]);
        }
        for &k in &written {
            tx.put(&[k], &[k, 2]).unwrap();
            model.insert(vec![k], vec![k, 2]);
        }
        let own: Pairs = tx
            .range(as_ref(&start), as_ref(&end), order, limit)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .collect::<Result<_, _>>()
            .unwrap();
        let want = if inverted { Vec::new() } else { expected(&model, &start, &end, reverse, limit) };
        prop_assert_eq!(own, want);
    }
}

fn k(i: u8) -> [u8; 1] {
    [i]
}

/// A database holding keys 10, 20, ..., 90.
fn tens() -> Database {
    let mut db = Database::create(Settings::default()).unwrap();
    let mut tx = db.begin(Isolation::Serializable);
    for i in 1..10u8 {
        tx.put(&k(i * 10), b"v").unwrap();
    }
    assert!(db.commit(tx).unwrap().is_committed());
    db
}

/// Runs `walk` in a serializable transaction that also writes a key of its
/// own, commits an insert of `phantom` in between, and says whether the
/// walking transaction committed.
fn commits_after_phantom(phantom: u8, walk: impl FnOnce(&mut Transaction)) -> bool {
    let mut db = tens();
    let mut t = db.begin(Isolation::Serializable);
    walk(&mut t);
    t.put(b"mine", b"x").unwrap();
    let mut other = db.begin(Isolation::Serializable);
    other.put(&k(phantom), b"new").unwrap();
    assert!(db.commit(other).unwrap().is_committed());
    db.commit(t).unwrap().is_committed()
}

#[test]
fn a_walk_stopped_early_protects_only_what_it_saw() {
    // Forward from 10, the caller stops after 10, 20, 30.
    let first_three = |t: &mut Transaction| {
        let seen: Vec<_> = t
            .range(
                Bound::Included(&k(10)),
                Bound::Unbounded,
                Order::Forward,
                None,
            )
            .take(3)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(seen.len(), 3);
    };
    assert!(
        !commits_after_phantom(25, first_three),
        "a phantom inside what it saw aborts it"
    );
    assert!(
        commits_after_phantom(35, first_three),
        "a key past the last one seen does not"
    );
    // The same cut made by the limit.
    let limited = |t: &mut Transaction| {
        let n = t
            .range(
                Bound::Included(&k(10)),
                Bound::Unbounded,
                Order::Forward,
                Some(3),
            )
            .count();
        assert_eq!(n, 3);
    };
    assert!(!commits_after_phantom(25, limited));
    assert!(commits_after_phantom(35, limited));
    // Reverse: from 90 down, three pairs seen (90, 80, 70).
    let reverse = |t: &mut Transaction| {
        let n = t
            .range(Bound::Unbounded, Bound::Unbounded, Order::Reverse, None)
            .take(3)
            .count();
        assert_eq!(n, 3);
    };
    assert!(!commits_after_phantom(75, reverse));
    assert!(commits_after_phantom(65, reverse));
}

#[test]
fn a_walk_to_its_end_protects_the_whole_range_and_an_unread_one_nothing() {
    let whole = |t: &mut Transaction| {
        let n = t
            .range(
                Bound::Included(&k(10)),
                Bound::Excluded(&k(200)),
                Order::Forward,
                None,
            )
            .count();
        assert_eq!(n, 9);
    };
    assert!(
        !commits_after_phantom(150, whole),
        "past the last key, inside the range"
    );
    assert!(commits_after_phantom(250, whole), "outside the range");
    let untouched = |t: &mut Transaction| {
        drop(t.range(Bound::Unbounded, Bound::Unbounded, Order::Forward, None));
    };
    assert!(commits_after_phantom(25, untouched));
}

#[test]
fn a_leaked_walk_protects_its_whole_range() {
    let leaked = |t: &mut Transaction| {
        let mut walk = t.range(
            Bound::Unbounded,
            Bound::Excluded(&k(50)),
            Order::Forward,
            None,
        );
        assert!(walk.next().is_some());
        std::mem::forget(walk);
    };
    assert!(!commits_after_phantom(45, leaked));
    assert!(commits_after_phantom(55, leaked));
}

#[test]
fn a_bad_bound_is_the_walks_first_item() {
    let db = tens();
    let mut t = db.begin(Isolation::Serializable);
    let long = vec![0u8; 70_000];
    let mut walk = t.range(
        Bound::Included(&long),
        Bound::Unbounded,
        Order::Forward,
        None,
    );
    assert!(matches!(
        walk.next(),
        Some(Err(melddb::TxnError::KeyTooLong { .. }))
    ));
    assert!(walk.next().is_none());
}
