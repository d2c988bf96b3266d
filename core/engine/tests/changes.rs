//! `ParsedIntention::changes`: what a committed intention changed, checked
//! against the states before and after meld applied it.

use std::collections::BTreeMap;

use melddb::{parse, Database, Finished, Isolation, Settings};
use proptest::prelude::*;

fn state(db: &Database) -> BTreeMap<Vec<u8>, Vec<u8>> {
    db.snapshot()
        .to_vec()
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

proptest! {
    #[test]
    fn changes_are_exactly_the_difference_meld_applies(
        seed in proptest::collection::vec((0u8..24, any::<u8>()), 0..40),
        ops in proptest::collection::vec((0u8..24, proptest::option::of(any::<u8>())), 1..30),
    ) {
        let mut db = Database::create(Settings::default()).unwrap();
        let mut tx = db.begin(Isolation::Serializable);
        for (k, v) in &seed {
            tx.put(&[*k], &[*v]).unwrap();
        }
        db.commit(tx).unwrap();
        let before = state(&db);
        let mut tx = db.begin(Isolation::Serializable);
        for (k, v) in &ops {
            match v {
                Some(v) => tx.put(&[*k], &[*v]).unwrap(),
                None => { tx.delete(&[*k]).unwrap(); }
            }
        }
        let Finished::Intention(bytes) = tx.finish().unwrap() else {
            // Nothing written (only deletes of absent keys): no changes.
            return Ok(());
        };
        let changes: Vec<(Vec<u8>, Option<Vec<u8>>)> = parse(&bytes)
            .unwrap()
            .changes()
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
            .collect();
        // In key order, each key once.
        prop_assert!(changes.windows(2).all(|w| w[0].0 < w[1].0));
        let outcome = db.append_raw(&bytes).unwrap();
        prop_assert!(outcome.is_committed());
        let mut expected = before.clone();
        for (k, v) in &changes {
            match v {
                Some(v) => { expected.insert(k.clone(), v.clone()); }
                None => { expected.remove(k); }
            }
        }
        prop_assert_eq!(state(&db), expected);
        // A deletion of a key that was absent is a key the transaction
        // put and then deleted itself; nothing else is listed unchanged.
        for (k, v) in &changes {
            if v.is_none() && !before.contains_key(k) {
                prop_assert!(ops.iter().any(|(o, w)| [*o] == k[..] && w.is_some()), "{k:?}");
            }
        }
    }
}
