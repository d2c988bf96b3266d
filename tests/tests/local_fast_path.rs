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
                        tx.range(
                            std::ops::Bound::Included(&k[..]),
                            std::ops::Bound::Unbounded,
                            Order::Forward,
                            Some(3),
                        )
                        .collect::<Result<Vec<_>, _>>()
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
                fast.lcs().digest().unwrap(),
                slow.lcs().digest().unwrap(),
                "config {t}/{d}/{group}, txn {i}"
            );
        }
        assert!(fast.lcs().len().unwrap() > 50);
    }
}

/// A host that frees what meld replaced later, a few pieces at a time
/// (`set_deferred_reclaim`, `Garbage::free_some`, as the embedded writer
/// does while idle), sees exactly what an immediate-freeing melder sees:
/// the same outcomes and digests, and old snapshots that still read the
/// same after the garbage of their era was freed.
#[test]
fn garbage_freed_in_steps_changes_nothing() {
    let settings = melddb_tests::pipeline_settings(0, 0, false);
    let mut deferred = Melder::new(settings);
    deferred.set_deferred_reclaim(true);
    let mut plain = Melder::new(settings);
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    let mut garbage = melddb::Garbage::default();
    let mut kept: Vec<(melddb::Snapshot, melddb::Digest)> = Vec::new();
    let mut freed = 0usize;
    for i in 0..1200u32 {
        let lag = rng.random_range(0..20u64);
        let sp = deferred.lcs().pos().saturating_sub(lag);
        let Some(snap) = deferred.state_at(sp).cloned() else {
            continue;
        };
        let mut tx = Transaction::begin(&snap, Isolation::Serializable);
        for _ in 0..rng.random_range(1..6) {
            let k = rng.random_range(0..200u32).to_be_bytes();
            match rng.random_range(0..3) {
                0 => drop(tx.get(&k).unwrap()),
                1 => tx.put(&k, format!("v{i}").as_bytes()).unwrap(),
                _ => drop(tx.delete(&k).unwrap()),
            }
        }
        let Some((bytes, local)) = tx.finish_local().unwrap() else {
            continue;
        };
        let a = deferred.apply_local(&bytes, local);
        let b = plain.apply(&bytes);
        assert_eq!(a, b, "txn {i}");
        assert_eq!(
            deferred.lcs().digest().unwrap(),
            plain.lcs().digest().unwrap(),
            "txn {i}"
        );
        garbage.append(deferred.take_garbage());
        if i % 100 == 0 {
            let s = deferred.lcs().clone();
            let d = s.digest().unwrap();
            kept.push((s, d));
        }
        // Free a random number of pieces now and then; sometimes let it
        // pile up over many transactions.
        if rng.random_range(0..4) == 0 {
            let before = garbage.len();
            let n = rng.random_range(1..40);
            let more = garbage.free_some(n);
            assert_eq!(garbage.len(), before.saturating_sub(n), "txn {i}");
            assert_eq!(more, !garbage.is_empty());
            freed += before - garbage.len();
        }
    }
    assert!(freed > 500, "only {freed} pieces were freed in steps");
    while garbage.free_some(7) {}
    assert!(garbage.is_empty());
    // The melder frees what it retires in steps too, without a take.
    for i in 0..20u32 {
        let mut tx = Transaction::begin(deferred.lcs(), Isolation::Serializable);
        tx.put(&i.to_be_bytes(), b"late").unwrap();
        let (bytes, local) = tx.finish_local().unwrap().expect("a write");
        assert!(deferred.apply_local(&bytes, local)[0].is_committed());
    }
    assert!(deferred.free_garbage(0), "meld retired nothing");
    while deferred.free_garbage(7) {}
    assert!(deferred.take_garbage().is_empty());
    for (s, d) in &kept {
        assert_eq!(
            &s.digest().unwrap(),
            d,
            "a kept snapshot changed after its garbage was freed"
        );
    }
    assert!(kept.len() > 5);
}
