//! Checkpoints (meld paper App. A, self-contained variant): a node that
//! recovers from any complete checkpoint in the log and melds the rest
//! reaches the same states and decisions as one that melded the whole log
//! — single-threaded and through the threaded pipeline — and corrupt or
//! misplaced checkpoint bytes are rejected, identically, never panicking.

use std::ops::Bound;

use melddb::checkpoint::{self, TrackEvent, Tracker};
use melddb::validate::check_tree;
use melddb::{
    AbortReason, Finished, Isolation, Melder, Order, Outcome, Settings, Snapshot, Transaction,
};
use melddb_runtime::{run_from, run_log, Options};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn key(i: u64) -> Vec<u8> {
    format!("k{i:05}").into_bytes()
}

/// A recorded history with checkpoints: the log, the outcome and digest
/// after every entry (as the writing node saw them), and which entries a
/// transaction whose snapshot crossed a checkpoint produced.
struct History {
    log: Vec<Vec<u8>>,
    outcomes: Vec<Outcome>,
    digests: Vec<String>,
    crossed: usize,
    checkpoints: usize,
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    seed: u64,
    txns: usize,
    keys: u64,
    degree: u64,
    /// Checkpoint roughly every this many transactions.
    every: usize,
    /// Largest chunk per part (small: many parts).
    part_bytes: usize,
    /// Also write broken checkpoints (bad checksum, parts out of place).
    broken: bool,
}

fn history(shape: Shape) -> History {
    let mut rng = ChaCha8Rng::seed_from_u64(shape.seed);
    let settings = Settings {
        db_id: 7,
        max_conflict_zone: 64,
        ..Settings::default()
    };
    let mut m = Melder::new(settings);
    let mut h = History {
        log: vec![settings.encode()],
        outcomes: Vec::new(),
        digests: vec![m.lcs().digest_hex().unwrap()],
        crossed: 0,
        checkpoints: 0,
    };
    let append = |m: &mut Melder, h: &mut History, bytes: Vec<u8>| {
        let out = m.apply(&bytes);
        assert_eq!(out.len(), 1, "plain settings decide every entry at once");
        h.outcomes.extend(out);
        h.digests.push(m.lcs().digest_hex().unwrap());
        h.log.push(bytes);
    };
    let mut pending: std::collections::VecDeque<Vec<u8>> = Default::default();
    for _ in 0..shape.txns {
        if pending.is_empty() && rng.random_range(0..shape.every.max(1)) == 0 {
            append(&mut m, &mut h, checkpoint::begin_record(settings.db_id));
            let mut parts = checkpoint::encode(&settings, m.lcs(), shape.part_bytes)
                .expect("checkpoint encodes");
            if shape.broken && rng.random_bool(0.3) {
                match rng.random_range(0..4) {
                    // A flipped byte: the part's checksum fails.
                    0 => {
                        let i = rng.random_range(0..parts.len());
                        let j = rng.random_range(0..parts[i].len());
                        parts[i][j] ^= 0x20;
                    }
                    // A missing part.
                    1 if parts.len() > 1 => {
                        let i = rng.random_range(0..parts.len());
                        parts.remove(i);
                    }
                    // Parts in the wrong order.
                    2 if parts.len() > 1 => parts.swap(0, 1),
                    // A begin record and nothing else.
                    _ => parts.truncate(0),
                }
            } else {
                h.checkpoints += 1;
            }
            pending.extend(parts);
        }
        // Parts are interleaved with transactions, as the writer does.
        while !pending.is_empty() && rng.random_bool(0.5) {
            let p = pending.pop_front().expect("a part");
            append(&mut m, &mut h, p);
        }
        // Snapshots up to `degree` entries back, sometimes across a checkpoint.
        let lcs = m.lcs().pos();
        let back = rng.random_range(0..=shape.degree).min(lcs);
        let snap_pos = lcs - back;
        let crossing = m.state_at(snap_pos).is_none();
        let snapshot: Snapshot = match m.state_at(snap_pos) {
            Some(s) => s.clone(),
            None => {
                // Not retained (before the barrier): write the intention on
                // a reconstruction of that state to see that it aborts.
                let mut r = Melder::from_genesis(&h.log[0]).expect("genesis");
                for e in &h.log[1..=snap_pos as usize] {
                    r.apply(e);
                }
                r.lcs().clone()
            }
        };
        let mut tx = Transaction::begin(&snapshot, Isolation::Serializable);
        for _ in 0..rng.random_range(1..=6) {
            let k = key(rng.random_range(0..shape.keys));
            match rng.random_range(0..10) {
                0..=3 => {
                    tx.get(&k).expect("get");
                }
                4..=6 => {
                    let v = format!("v{}", rng.random::<u32>()).repeat(rng.random_range(1..4));
                    tx.put(&k, v.as_bytes()).expect("put");
                }
                7 => {
                    tx.delete(&k).expect("delete");
                }
                _ => {
                    let end = key(rng.random_range(0..shape.keys));
                    tx.range(
                        Bound::Included(&k[..]),
                        Bound::Excluded(&end[..]),
                        Order::Forward,
                        Some(5),
                    )
                    .collect::<Result<Vec<_>, _>>()
                    .expect("scan");
                }
            }
        }
        if let Finished::Intention(bytes) = tx.finish().expect("finish") {
            h.crossed += usize::from(crossing);
            append(&mut m, &mut h, bytes);
        }
    }
    for p in pending {
        append(&mut m, &mut h, p);
    }
    h
}

/// Every complete checkpoint in `log`: (begin position, part positions).
fn complete_checkpoints(log: &[Vec<u8>]) -> Vec<(u64, Vec<u64>)> {
    let settings = Settings::decode(&log[0]).expect("genesis");
    let mut t = Tracker::default();
    let mut out = Vec::new();
    let mut parts = Vec::new();
    for (pos, e) in log.iter().enumerate().skip(1) {
        let pos = pos as u64;
        match t.feed(&settings, pos, e) {
            TrackEvent::Begin => parts.clear(),
            TrackEvent::Part => parts.push(pos),
            TrackEvent::Complete { begin } => {
                parts.push(pos);
                out.push((begin, std::mem::take(&mut parts)));
            }
            _ => {}
        }
    }
    out
}

fn recover(log: &[Vec<u8>], parts: &[u64]) -> Melder {
    let parts: Vec<&[u8]> = parts.iter().map(|p| &log[*p as usize][..]).collect();
    let loaded = checkpoint::load(&parts).expect("a complete checkpoint loads");
    check_tree(&loaded.state).expect("a loaded state is a valid tree");
    Melder::from_checkpoint(loaded)
}

fn check_history(h: &History) {
    let cps = complete_checkpoints(&h.log);
    assert_eq!(
        cps.len(),
        h.checkpoints,
        "every intact checkpoint is found, no broken one"
    );
    for (last, parts) in &cps {
        let last = *last;
        let mut m = recover(&h.log, parts);
        assert_eq!(
            m.lcs().digest_hex().unwrap(),
            h.digests[last as usize],
            "loaded state at {last}"
        );
        for pos in last + 1..h.log.len() as u64 {
            let out = m.apply(&h.log[pos as usize]);
            assert_eq!(
                out,
                vec![h.outcomes[pos as usize - 1].clone()],
                "outcome at {pos} after recovering at {last}"
            );
            assert_eq!(
                m.lcs().digest_hex().unwrap(),
                h.digests[pos as usize],
                "state at {pos} after recovering at {last}"
            );
        }
    }
    // The threaded pipeline, from genesis and from the last checkpoint.
    let opts = Options {
        workers: Some(2),
        queue: 4,
        jitter: None,
    };
    let all = run_log(&h.log[0], &h.log[1..], &opts).expect("pipeline runs");
    assert_eq!(all.outcomes, h.outcomes, "pipeline outcomes");
    assert_eq!(
        all.melder.lcs().digest_hex().unwrap(),
        *h.digests.last().expect("digest")
    );
    if let Some((last, parts)) = cps.last() {
        let last = *last;
        let m = recover(&h.log, parts);
        let rest = run_from(m, &h.log[last as usize + 1..], &opts).expect("pipeline runs");
        assert_eq!(
            rest.outcomes,
            h.outcomes[last as usize..],
            "pipeline outcomes after the checkpoint"
        );
        assert_eq!(
            rest.melder.lcs().digest_hex().unwrap(),
            *h.digests.last().expect("digest")
        );
    }
}

#[test]
fn recovery_from_any_checkpoint_reaches_the_same_states_and_decisions() {
    let h = history(Shape {
        seed: 1,
        txns: 600,
        keys: 300,
        degree: 12,
        every: 40,
        part_bytes: 700,
        broken: false,
    });
    assert!(h.checkpoints >= 8, "{} checkpoints", h.checkpoints);
    // Transactions whose snapshot crossed a checkpoint abort on every node.
    assert!(h.crossed > 0, "the history must exercise the barrier");
    let unavailable = h
        .outcomes
        .iter()
        .filter(|o| {
            matches!(
                o,
                Outcome::Aborted {
                    reason: AbortReason::SnapshotUnavailable { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(unavailable, h.crossed);
    check_history(&h);
}

#[test]
fn a_checkpoint_of_the_genesis_state_and_one_single_part_work() {
    let h = history(Shape {
        seed: 2,
        txns: 60,
        keys: 50,
        degree: 3,
        every: 1,
        part_bytes: 1 << 20,
        broken: false,
    });
    check_history(&h);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn random_histories_with_broken_checkpoints_agree_everywhere(
        seed in any::<u64>(),
        keys in 20u64..400,
        degree in 0u64..30,
        every in 5usize..60,
        part_bytes in prop_oneof![64usize..400, Just(1usize << 20)],
    ) {
        let h = history(Shape { seed, txns: 250, keys, degree, every, part_bytes, broken: true });
        check_history(&h);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_loader_or_the_tracker(
        parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..4),
        with_magic in any::<bool>(),
    ) {
        let parts: Vec<Vec<u8>> = parts
            .into_iter()
            .map(|mut p| {
                if with_magic {
                    let mut q = checkpoint::CHECKPOINT_MAGIC.to_vec();
                    q.push(checkpoint::CHECKPOINT_VERSION);
                    q.push(p.first().copied().unwrap_or(1) % 3);
                    q.append(&mut p);
                    let crc = crc_of(&q);
                    q.extend_from_slice(&crc.to_le_bytes());
                    q
                } else {
                    p
                }
            })
            .collect();
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        let _ = checkpoint::load(&refs);
        let mut t = Tracker::default();
        for (i, p) in parts.iter().enumerate() {
            let _ = t.feed(&Settings::default(), i as u64 + 1, p);
        }
    }
}

fn crc_of(b: &[u8]) -> u32 {
    // The same CRC-32 (IEEE) the format uses, computed bit by bit here so
    // the test does not share the implementation's code path.
    let mut crc = !0u32;
    for &x in b {
        crc ^= x as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A state with enough keys to make a multi-part checkpoint.
fn sample_state() -> (Settings, Melder) {
    let settings = Settings::default();
    let mut m = Melder::new(settings);
    for round in 0..5u64 {
        let mut tx = Transaction::begin(m.lcs(), Isolation::Serializable);
        for i in 0..200u64 {
            tx.put(&key(i * 5 + round), format!("value {i} {round}").as_bytes())
                .expect("put");
        }
        let Finished::Intention(b) = tx.finish().expect("finish") else {
            panic!("writes produce an intention")
        };
        assert!(m.apply(&b)[0].is_committed());
    }
    (settings, m)
}

#[test]
fn every_corrupted_body_byte_is_rejected() {
    let (settings, m) = sample_state();
    let parts = checkpoint::encode(&settings, m.lcs(), 4096).expect("encode");
    assert!(parts.len() > 3);
    let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
    let good = checkpoint::load(&refs).expect("loads");
    assert_eq!(good.state.digest().unwrap(), m.lcs().digest().unwrap());
    assert_eq!(good.state.to_vec(), m.lcs().to_vec());
    assert_eq!(good.nodes, 1000);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..300 {
        let mut bad = parts.clone();
        let i = rng.random_range(0..bad.len());
        let header = 14; // magic, version, kind, four short varints
        let j = rng.random_range(header..bad[i].len() - 4);
        bad[i][j] ^= 1 << rng.random_range(0..8);
        // Re-seal the part, so only the body checks can notice.
        let n = bad[i].len() - 4;
        let crc = crc_of(&bad[i][..n]);
        bad[i][n..].copy_from_slice(&crc.to_le_bytes());
        let refs: Vec<&[u8]> = bad.iter().map(|p| &p[..]).collect();
        assert!(
            checkpoint::load(&refs).is_err(),
            "flipped bit in part {i} byte {j} went unnoticed"
        );
        // Without re-sealing, the part checksum catches it.
        bad[i][n] ^= 0xff;
        let refs: Vec<&[u8]> = bad.iter().map(|p| &p[..]).collect();
        assert!(matches!(
            checkpoint::load(&refs),
            Err(melddb::CheckpointError::Part { .. })
        ));
    }
    // A part of another checkpoint (begun elsewhere) does not fit in.
    let other =
        checkpoint::encode(&settings, m.state_at(4).expect("retained"), 4096).expect("encode");
    let mut mixed = refs.clone();
    mixed[1] = &other[1];
    assert!(matches!(
        checkpoint::load(&mixed),
        Err(melddb::CheckpointError::Incomplete { .. })
    ));
}

#[test]
fn with_premeld_or_group_meld_a_checkpoint_entry_is_just_malformed() {
    for settings in [
        Settings {
            premeld_threads: 1,
            premeld_distance: 1,
            ..Settings::default()
        },
        Settings {
            group_meld: true,
            ..Settings::default()
        },
    ] {
        let mut m = Melder::new(settings);
        let parts = checkpoint::encode(&settings, m.lcs(), 1 << 20).expect("encode");
        let mut log = vec![settings.encode(), checkpoint::begin_record(settings.db_id)];
        log.extend(parts.iter().cloned());
        log.push(Vec::new());
        let single: Vec<Outcome> = log[1..].iter().flat_map(|e| m.apply(e)).collect();
        assert!(single.iter().all(|o| !o.is_committed()), "{single:?}");
        assert_eq!(m.barrier(), 0);
        let piped = run_log(&log[0], &log[1..], &Options::default()).expect("runs");
        assert_eq!(piped.outcomes, single);
        assert!(complete_checkpoints(&log).is_empty());
    }
}

#[test]
fn unpersisted_nodes_matches_a_full_walk() {
    // Concurrent snapshots make meld create ephemeral nodes.
    let h = history(Shape {
        seed: 4,
        txns: 300,
        keys: 200,
        degree: 10,
        every: 50,
        part_bytes: 1 << 20,
        broken: false,
    });
    let mut m = Melder::from_genesis(&h.log[0]).expect("genesis");
    let mut since = 0;
    let mut seen_nonzero = false;
    for e in &h.log[1..] {
        m.apply(e);
        if m.barrier() == m.lcs().pos() {
            since = m.lcs().csn();
        }
        let fast = checkpoint::unpersisted_nodes(m.lcs(), since);
        let full = melddb::validate::ephemeral_vns(m.lcs())
            .into_iter()
            .filter(|v| *v > since)
            .count() as u64;
        assert_eq!(fast, full, "at {}", m.lcs().pos());
        seen_nonzero |= fast > 0;
    }
    assert!(seen_nonzero, "the history must create ephemeral nodes");
}
