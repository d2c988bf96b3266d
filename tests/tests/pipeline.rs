//! Premeld and group meld under random histories: every configuration
//! agrees with the brute-force validator (told about the grouping), premeld
//! alone decides exactly like plain meld, and a configuration's states are
//! reproducible (equal digests when the log is melded again).

use melddb::{Melder, Settings};
use melddb_tests::{run, Config, Mix, Run};
use proptest::prelude::*;

/// The configurations the issue asks for: (t, d, group meld).
const CONFIGS: &[(u32, u32, bool)] = &[
    (1, 1, false),
    (1, 10, false),
    (2, 1, false),
    (2, 10, false),
    (5, 1, false),
    (5, 10, false),
    (0, 0, true),
    (1, 1, true),
    (2, 10, true),
    (5, 10, true),
];

fn settings(t: u32, d: u32, group: bool) -> Settings {
    Settings {
        premeld_threads: t,
        premeld_distance: d,
        group_meld: group,
        ..Settings::default()
    }
}

/// Melds a recorded log again with a fresh melder; returns the final digest.
fn replay(log: &[Vec<u8>]) -> String {
    let mut m = Melder::from_genesis(&log[0]).expect("valid genesis");
    for e in &log[1..] {
        m.apply(e);
    }
    m.lcs().digest_hex()
}

fn committed_flags(r: &Run) -> Vec<(u64, bool)> {
    r.records
        .iter()
        .map(|x| (x.snapshot_pos, x.outcome.is_committed()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_configuration_agrees_with_the_brute_force_validator(
        seed in any::<u64>(),
        config in 0..CONFIGS.len(),
        degree in prop_oneof![1u64..16, 16u64..80, Just(200u64)],
        max_ops in 1usize..=16,
        keys in prop_oneof![Just(32u64), 64u64..512, Just(4096u64)],
        points_only in any::<bool>(),
        skew in any::<bool>(),
    ) {
        let (t, d, group) = CONFIGS[config];
        let cfg = Config {
            keys,
            initial: keys / 2,
            degree,
            ops: (1, max_ops),
            mix: if points_only { Mix::POINT } else { Mix::ALL },
            skew,
            txns: 200,
            seed,
            settings: settings(t, d, group),
            ..Config::default()
        };
        let r = run(&cfg).map_err(TestCaseError::fail)?;
        prop_assert_eq!(r.counts.extra_aborts, 0);
        // The log alone fixes the state: melding it again gives the same digest.
        prop_assert_eq!(replay(&r.log), r.digest.clone());
        if !group {
            // Premeld changes no decision and no content, only node identities.
            let plain = run(&Config { settings: Settings::default(), ..cfg.clone() })
                .map_err(TestCaseError::fail)?;
            prop_assert_eq!(committed_flags(&plain), committed_flags(&r));
            prop_assert_eq!(&plain.final_state, &r.final_state);
        }
    }
}

#[test]
fn premeld_and_group_meld_actually_run_and_change_identities() {
    // Large conflict zones and enough keys that most intentions commit, so
    // premeld re-expresses many of them and group meld combines pairs.
    let base = Config {
        keys: 2048,
        initial: 1024,
        degree: 120,
        ops: (2, 8),
        txns: 400,
        seed: 7,
        check_every_meld: false,
        ..Config::default()
    };
    let plain = run(&base).unwrap();
    let pre = run(&Config {
        settings: settings(2, 10, false),
        ..base.clone()
    })
    .unwrap();
    let both = run(&Config {
        settings: settings(2, 10, true),
        ..base.clone()
    })
    .unwrap();
    assert_eq!(plain.final_state, pre.final_state);
    assert_ne!(
        plain.digest, pre.digest,
        "premeld must re-express intentions"
    );
    assert_ne!(pre.digest, both.digest, "group meld must combine pairs");
    assert!(plain.counts.committed > 250, "{:?}", plain.counts);
    assert_eq!(
        run(&Config {
            settings: settings(2, 10, true),
            ..base
        })
        .unwrap()
        .digest,
        both.digest
    );
}
