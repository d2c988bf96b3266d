//! `Melder::apply_local` (an intention handed over as tree nodes) must give
//! exactly what `Melder::apply` gives for the same bytes: same outcomes,
//! same state digests, under every pipeline configuration but group meld
//! (which falls back to decoding).

use melddb::{Isolation, Melder, Order, Transaction};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn local_intentions_meld_exactly_like_their_bytes() {
    for (t, d, group) in [(0, 0, false), (2, 1, false), (1, 10, false), (2, 1, true)] {
        let settings = melddb_tests::pipeline_settings(t, d, group);
        let mut fast = Melder::new(settings);
        let mut slow = Melder::new(settings);
        let mut rng = ChaCha8Rng::seed_from_u64(9 + t as u64);
        for i in 0..1500u32 {
            let lag = rng.random_range(0..40u64);
            let mut sp = fast.lcs().pos().saturating_sub(lag);
            if fast.state_at(sp).is_none() {
                sp -= 1;
            }
            let snap = fast.state_at(sp).expect("retained").clone();
            let iso = [
                Isolation::Serializable,
                Isolation::RepeatableRead,
                Isolation::SnapshotIsolation,
            ][i as usize % 3];
            let mut tx = Transaction::begin(&snap, iso);
            for _ in 0..rng.random_range(1..8) {
                let k = rng.random_range(0..300u32).to_be_bytes();
                match rng.random_range(0..5) {
                    0 | 1 => drop(tx.get(&k).unwrap()),
                    2 => tx.put(&k, format!("v{i}").as_bytes()).unwrap(),
                    3 => drop(tx.delete(&k).unwrap()),
                    _ => drop(
                        tx.scan(
                            std::ops::Bound::Included(&k[..]),
                            std::ops::Bound::Unbounded,
                            Order::Forward,
                            Some(3),
                        )
                        .unwrap(),
                    ),
                }
            }
            let Some((bytes, local)) = tx.finish_local().unwrap() else {
                continue;
            };
            let a = fast.apply_local(&bytes, local);
            let b = slow.apply(&bytes);
            assert_eq!(a, b, "config {t}/{d}/{group}, txn {i}");
            assert_eq!(
                fast.lcs().digest(),
                slow.lcs().digest(),
                "config {t}/{d}/{group}, txn {i}"
            );
        }
        assert!(fast.lcs().len() > 50);
    }
}
