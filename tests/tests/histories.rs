//! Property tests over random concurrent histories: meld agrees with the
//! brute-force validator, the final tree equals a BTreeMap model, and the
//! tree invariants hold after every meld.

use melddb::Isolation;
use melddb_tests::{run, Config, Mix};
use proptest::prelude::*;

fn level() -> impl Strategy<Value = Option<Isolation>> {
    prop_oneof![
        Just(None),
        Just(Some(Isolation::Serializable)),
        Just(Some(Isolation::RepeatableRead)),
        Just(Some(Isolation::SnapshotIsolation)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn meld_agrees_with_brute_force(
        seed in any::<u64>(),
        degree in prop_oneof![Just(1u64), 2u64..16, 16u64..64, Just(256u64)],
        max_ops in 1usize..=32,
        keys in prop_oneof![Just(16u64), 64u64..256, Just(4096u64)],
        skew in any::<bool>(),
        points_only in any::<bool>(),
        isolation in level(),
    ) {
        let cfg = Config {
            keys,
            initial: keys / 2,
            degree,
            ops: (1, max_ops),
            mix: if points_only { Mix::POINT } else { Mix::ALL },
            skew,
            isolation,
            txns: 150,
            seed,
            ..Config::default()
        };
        let r = run(&cfg);
        prop_assert!(r.is_ok(), "{}", r.err().unwrap_or_default());
        let r = r.unwrap();
        // Meld's decisions are exact (see docs/isolation.md): no extra aborts.
        prop_assert_eq!(r.counts.extra_aborts, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Meld with the Hyder II §3.3 change (return the intention's unchanged
    /// read-only subtree, keeping its readset) decides and stores the same.
    #[test]
    fn keeping_the_readset_changes_no_decision(seed in any::<u64>(), degree in 1u64..32) {
        let base = Config { seed, degree, keys: 128, initial: 64, ops: (1, 12), txns: 150, ..Config::default() };
        let plain = run(&base).map_err(TestCaseError::fail)?;
        let kept = run(&Config { keep_readset: true, ..base }).map_err(TestCaseError::fail)?;
        let d = |r: &melddb_tests::Run| r.records.iter().map(|x| x.outcome.is_committed()).collect::<Vec<_>>();
        prop_assert_eq!(d(&plain), d(&kept));
        prop_assert_eq!(plain.final_state, kept.final_state);
    }
}
