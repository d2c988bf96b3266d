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

/// A recorded history with checkpoints: the log, the outcomes each entry
/// decided and the digest after it (as the writing node saw them), and
/// which entries a transaction whose snapshot crossed a checkpoint produced.
struct History {
    log: Vec<Vec<u8>>,
    /// Outcomes decided by the entry at each position (index `pos - 1`):
    /// one, or under group meld none for a pair's head and two for its
    /// second member.
    decided: Vec<Vec<Outcome>>,
    digests: Vec<String>,
    crossed: usize,
    checkpoints: usize,
    /// Entries that premeld re-expressed, and pairs group meld melded as one.
    premelded: usize,
    grouped: usize,
    /// Positions of the transactions' intentions.
    intentions: std::collections::BTreeSet<u64>,
}

impl History {
    fn outcomes(&self, from: u64) -> Vec<Outcome> {
        self.decided[from as usize - 1..].concat()
    }
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
    /// Premeld threads and distance, and group meld.
    pipeline: (u32, u32, bool),
}

impl Shape {
    fn settings(&self) -> Settings {
        let (t, d, group) = self.pipeline;
        Settings {
            db_id: 7,
            max_conflict_zone: 64,
            premeld_threads: t,
            premeld_distance: d,
            group_meld: group,
        }
    }
}

fn history(shape: Shape) -> History {
    let mut rng = ChaCha8Rng::seed_from_u64(shape.seed);
    let settings = shape.settings();
    let mut m = Melder::new(settings);
    let mut h = History {
        log: vec![settings.encode()],
        decided: Vec::new(),
        digests: vec![m.lcs().digest_hex().unwrap()],
        crossed: 0,
        checkpoints: 0,
        premelded: 0,
        grouped: 0,
        intentions: Default::default(),
    };
    let append = |m: &mut Melder, h: &mut History, bytes: Vec<u8>| {
        let out = m.apply(&bytes);
        if !settings.group_meld {
            assert_eq!(
                out.len(),
                1,
                "without group meld every entry is decided at once"
            );
        }
        h.premelded += usize::from(m.last_prep_stats().lcs_nodes > 0);
        h.grouped += usize::from(
            matches!(&out[..], [Outcome::Committed { csn: a, .. }, Outcome::Committed { csn: b, .. }] if a == b),
        );
        h.decided.push(out);
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
        // Snapshots up to `degree` entries back, sometimes across a
        // checkpoint; never the head of a group-meld pair (no snapshot).
        let lcs = m.lcs().pos();
        let back = rng.random_range(0..=shape.degree).min(lcs);
        let mut snap_pos = lcs - back;
        if settings.group_meld && snap_pos % 2 == 1 {
            snap_pos -= 1;
        }
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
                assert_eq!(r.lcs().pos(), snap_pos, "a reconstructed state");
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
            h.intentions.insert(h.log.len() as u64);
            append(&mut m, &mut h, bytes);
        }
    }
    for p in pending {
        append(&mut m, &mut h, p);
    }
    if m.next_pos() != m.lcs().pos() + 1 {
        // Group meld: a filler (malformed) decides the last pair.
        append(&mut m, &mut h, Vec::new());
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
    // Transactions' intentions are well formed: only checkpoint records
    // (broken ones) and group-meld fillers may abort as malformed.
    for o in h.outcomes(1) {
        if let Outcome::Aborted {
            pos,
            reason: AbortReason::Malformed(e),
        } = &o
        {
            assert!(
                !h.intentions.contains(pos),
                "entry {pos}, an intention, aborted as malformed: {e}"
            );
        }
    }
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
                h.decided[pos as usize - 1],
                "outcomes at {pos} after recovering at {last}"
            );
            assert_eq!(
                m.lcs().digest_hex().unwrap(),
                h.digests[pos as usize],
                "state at {pos} after recovering at {last}"
            );
        }
        check_tree(m.lcs()).expect("the final state is a valid tree");
    }
    // The threaded pipeline, from genesis and from every checkpoint.
    let opts = Options {
        workers: Some(2),
        queue: 4,
        jitter: None,
    };
    let all = run_log(&h.log[0], &h.log[1..], &opts).expect("pipeline runs");
    assert_eq!(all.outcomes, h.outcomes(1), "pipeline outcomes");
    assert_eq!(
        all.melder.lcs().digest_hex().unwrap(),
        *h.digests.last().expect("digest")
    );
    for (last, parts) in &cps {
        let last = *last;
        let m = recover(&h.log, parts);
        let rest = run_from(m, &h.log[last as usize + 1..], &opts).expect("pipeline runs");
        assert_eq!(
            rest.outcomes,
            h.outcomes(last + 1),
            "pipeline outcomes after the checkpoint at {last}"
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
        pipeline: (0, 0, false),
    });
    assert!(h.checkpoints >= 8, "{} checkpoints", h.checkpoints);
    // Transactions whose snapshot crossed a checkpoint abort on every node.
    assert!(h.crossed > 0, "the history must exercise the barrier");
    let unavailable = h
        .outcomes(1)
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
        pipeline: (0, 0, false),
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
        let h = history(Shape { seed, txns: 250, keys, degree, every, part_bytes, broken: true, pipeline: (0, 0, false) });
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

/// Premeld and group meld with checkpoints: a checkpoint record never
/// joins a pair, and premeld never reaches behind a begin record, so a
/// node recovering from any checkpoint (begun at either member of a pair)
/// agrees with one that melded the whole log, single-threaded and piped.
#[test]
fn with_premeld_and_group_meld_recovery_agrees_everywhere() {
    for (seed, pipeline) in [
        (11, (1, 1, false)),
        (12, (2, 3, false)),
        (13, (0, 0, true)),
        (14, (1, 2, true)),
    ] {
        let h = history(Shape {
            seed,
            txns: 500,
            keys: 200,
            degree: 12,
            every: 30,
            part_bytes: 600,
            broken: false,
            pipeline,
        });
        let (t, _, group) = pipeline;
        assert!(
            h.checkpoints >= 6,
            "{pipeline:?}: {} checkpoints",
            h.checkpoints
        );
        assert!(
            h.crossed > 0,
            "{pipeline:?}: the history must exercise the barrier"
        );
        if t > 0 {
            assert!(h.premelded > 50, "{pipeline:?}: {} premelded", h.premelded);
        }
        if group {
            assert!(h.grouped > 20, "{pipeline:?}: {} pairs grouped", h.grouped);
            // Begin records landed at both members of pairs.
            let begins: Vec<u64> = complete_checkpoints(&h.log).iter().map(|c| c.0).collect();
            assert!(begins.iter().any(|b| b % 2 == 1), "{begins:?}");
            assert!(begins.iter().any(|b| b % 2 == 0), "{begins:?}");
        }
        check_history(&h);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn random_pipelined_histories_with_broken_checkpoints_agree_everywhere(
        seed in any::<u64>(),
        degree in 0u64..30,
        every in 5usize..40,
        t in 0u32..3,
        d in 1u32..4,
        group in any::<bool>(),
    ) {
        let pipeline = (t, d, group);
        let h = history(Shape { seed, txns: 200, keys: 100, degree, every, part_bytes: 300, broken: true, pipeline });
        check_history(&h);
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
        pipeline: (0, 0, false),
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
