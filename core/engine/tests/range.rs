//! `Snapshot::range`, the lazy walk, against `Snapshot::scan` and a model
//! map over random trees, bounds, orders and limits.

use std::collections::BTreeMap;
use std::ops::Bound;

use melddb::{Database, Isolation, Order, Settings};
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

proptest! {
    #[test]
    fn the_lazy_walk_yields_what_scan_and_a_model_do(
        keys in proptest::collection::btree_set(any::<u8>(), 0..120),
        deleted in proptest::collection::vec(any::<u8>(), 0..30),
        start in (any::<u8>(), any::<u8>()),
        end in (any::<u8>(), any::<u8>()),
        reverse in any::<bool>(),
        limit in proptest::option::of(0usize..40),
    ) {
        let mut db = Database::create(Settings::default()).unwrap();
        let mut model = BTreeMap::new();
        // Puts, then deletes in a second commit.
        let mut tx = db.begin(Isolation::Serializable);
        for &k in &keys {
            tx.put(&[k], &[k, 1]).unwrap();
            model.insert(vec![k], vec![k, 1]);
        }
        db.commit(tx).unwrap();
        let mut tx = db.begin(Isolation::Serializable);
        for &k in &deleted {
            tx.delete(&[k]).unwrap();
            model.remove(&vec![k]);
        }
        db.commit(tx).unwrap();
        let (start, end) = (bound(start), bound(end));
        let order = if reverse { Order::Reverse } else { Order::Forward };
        let snap = db.snapshot();
        let lazy: Vec<(Vec<u8>, Vec<u8>)> = snap
            .range(as_ref(&start), as_ref(&end), order, limit)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .collect::<Result<_, _>>()
            .unwrap();
        let eager: Vec<(Vec<u8>, Vec<u8>)> = snap
            .scan(as_ref(&start), as_ref(&end), order, limit)
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        prop_assert_eq!(&lazy, &eager);
        let in_range = |k: &Vec<u8>| {
            (match &start { Bound::Unbounded => true, Bound::Included(s) => k >= s, Bound::Excluded(s) => k > s })
                && (match &end { Bound::Unbounded => true, Bound::Included(e) => k <= e, Bound::Excluded(e) => k < e })
        };
        let mut want: Vec<(Vec<u8>, Vec<u8>)> =
            model.iter().filter(|(k, _)| in_range(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
        if reverse {
            want.reverse();
        }
        want.truncate(limit.unwrap_or(usize::MAX));
        prop_assert_eq!(lazy, want);
    }
}
