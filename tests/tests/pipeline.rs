//! Premeld and group meld under random histories: every configuration
//! agrees with the brute-force validator (told about the grouping), premeld
//! alone decides exactly like plain meld, and a configuration's states are
//! reproducible (equal digests when the log is melded again).

use melddb::{Melder, Settings};
use melddb_tests::{pipeline_settings, run, Config, Mix, Run};
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

/// Melds a recorded log again with a fresh single-threaded melder; returns
/// every outcome and the final digest.
fn replay(log: &[Vec<u8>]) -> (Vec<melddb::Outcome>, String) {
    let mut m = Melder::from_genesis(&log[0]).expect("valid genesis");
    let outcomes = log[1..].iter().flat_map(|e| m.apply(e)).collect();
    (outcomes, m.lcs().digest_hex().unwrap())
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
            settings: pipeline_settings(t, d, group),
            ..Config::default()
        };
        let r = run(&cfg).map_err(TestCaseError::fail)?;
        prop_assert_eq!(r.counts.extra_aborts, 0);
        // The log alone fixes the state: melding it again gives the same digest.
        prop_assert_eq!(replay(&r.log).1, r.digest.clone());
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
        settings: pipeline_settings(2, 10, false),
        ..base.clone()
    })
    .unwrap();
    let both = run(&Config {
        settings: pipeline_settings(2, 10, true),
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
            settings: pipeline_settings(2, 10, true),
            ..base
        })
        .unwrap()
        .digest,
        both.digest
    );
}

#[test]
fn threaded_pipeline_matches_the_single_threaded_driver_under_random_delays() {
    use melddb_runtime::{run_log, Options};
    for (i, &(t, d, group)) in CONFIGS.iter().chain(&[(0, 0, false)]).enumerate() {
        let cfg = Config {
            keys: 512,
            initial: 256,
            degree: 60,
            ops: (1, 10),
            txns: 300,
            seed: 100 + i as u64,
            check_every_meld: false,
            settings: pipeline_settings(t, d, group),
            ..Config::default()
        };
        let r = run(&cfg).unwrap();
        let (want, _) = replay(&r.log);
        for (workers, jitter) in [
            (1, None),
            (2, Some((i as u64, 200))),
            (5, Some((7 + i as u64, 50))),
        ] {
            let opts = Options {
                workers: Some(workers),
                queue: 4,
                jitter,
            };
            let report = run_log(&r.log[0], &r.log[1..], &opts).unwrap();
            assert_eq!(
                report.melder.lcs().digest_hex().unwrap(),
                r.digest,
                "config {:?}, {workers} workers, jitter {jitter:?}",
                CONFIGS.get(i)
            );
            assert_eq!(report.outcomes, want, "config {:?}", CONFIGS.get(i));
        }
    }
}

/// Hyder II App. C: T1..T4 all run on S0 (T1 updates `b`, T2 updates `d`,
/// T3 inserts `c`, T4 inserts `e`); nodes that premeld T4 against different
/// states would give one ephemeral identity different contents. Here the
/// stage names its input state itself, refuses any other, and every node
/// (whatever its worker count or timing) ends with the same digest.
#[test]
fn appendix_c_two_nodes_cannot_premeld_one_intention_against_different_states() {
    use melddb::pipeline::{premeld, premeld_input, StageError};
    use melddb::{Finished, Isolation, MeldStats, Transaction};
    use melddb_runtime::{run_log, Options};

    let settings = pipeline_settings(1, 1, false);
    let mut node = Melder::new(settings);
    let mut log = vec![settings.encode()];
    let mut tx = Transaction::begin(node.lcs(), Isolation::Serializable);
    for k in [b"a", b"b", b"d"] {
        tx.put(k, b"0").unwrap();
    }
    let Finished::Intention(s0) = tx.finish().unwrap() else {
        panic!()
    };
    node.apply(&s0);
    log.push(s0);
    let snapshot = node.lcs().clone();
    let mut intentions = Vec::new();
    for (k, v) in [(b"b", b"1"), (b"d", b"2"), (b"c", b"3"), (b"e", b"4")] {
        let mut tx = Transaction::begin(&snapshot, Isolation::Serializable);
        tx.put(k, v).unwrap();
        let Finished::Intention(bytes) = tx.finish().unwrap() else {
            panic!()
        };
        intentions.push(bytes);
    }
    // T1..T3 at positions 2..4; T4 at 5 is premelded against 5 - 1*1 - 1 = 3.
    for b in &intentions[..3] {
        assert!(node.apply(b)[0].is_committed());
        log.push(b.clone());
    }
    assert_eq!(premeld_input(&settings, 5), Some(3));
    let t4 = node.decode(5, &intentions[3]).unwrap();
    let mut stats = MeldStats::default();
    // Server Y of the paper would premeld against the state after T1:
    // handing the stage any state but the one it asked for is refused.
    let wrong = node.meld_state(2).cloned();
    assert_eq!(
        premeld(&settings, t4, |_| wrong, &mut stats).err(),
        Some(StageError::WrongState { wanted: 3, got: 2 })
    );
    let mut asked = None;
    let t4 = node.decode(5, &intentions[3]).unwrap();
    let premelded = premeld(
        &settings,
        t4,
        |p| {
            asked = Some(p);
            node.meld_state(p).cloned()
        },
        &mut stats,
    )
    .unwrap()
    .unwrap();
    assert_eq!(asked, Some(3));
    assert_eq!(
        premelded.snapshot_pos, 3,
        "re-expressed on the premeld input"
    );
    assert!(node.apply(&intentions[3])[0].is_committed());
    log.push(intentions[3].clone());
    // Servers X and Y: other worker counts and timings, same digest.
    for (workers, jitter) in [(1, None), (3, Some((1, 300))), (8, Some((2, 100)))] {
        let opts = Options {
            workers: Some(workers),
            queue: 1,
            jitter,
        };
        let r = run_log(&log[0], &log[1..], &opts).unwrap();
        assert_eq!(
            r.melder.lcs().digest().unwrap(),
            node.lcs().digest().unwrap()
        );
    }
    let keys: Vec<_> = node
        .lcs()
        .to_vec()
        .expect("an in-memory tree reads")
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect();
    assert_eq!(keys.len(), 5);
}
