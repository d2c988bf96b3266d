//! An intention built in memory for the local fast path has the same
//! shape as the one its bytes decode to.

use super::*;
use crate::codec::{parse, resolve, Intention};
use crate::engine::Melder;
use crate::genesis::Settings;
use crate::range::Order;
use std::ops::Bound;

fn shape(i: &Intention) -> Vec<String> {
    fn walk(t: &Link, i: &Intention, out: &mut Vec<String>) {
        let Some(n) = t else {
            out.push("-".into());
            return;
        };
        if !i.owns(n) {
            out.push(format!("ptr {:?} {}", n.key, n.vn()));
            return;
        }
        walk(n.left(), i, out);
        walk(n.right(), i, out);
        out.push(format!(
            "{:?}={:?} seq{} f{} scv{} ssv{} h{} o{} r{:?} b{:?}",
            n.key,
            n.val(),
            n.seq,
            n.flags,
            n.scv,
            n.ssv,
            n.height,
            n.oldest,
            n.ranges(),
            i.bounds[n.seq as usize - 1]
        ));
    }
    let mut out = Vec::new();
    walk(&i.root, i, &mut out);
    out.push(format!(
        "{:?} {:?} {}",
        i.deletes, i.header_ranges, i.node_count
    ));
    out
}

/// A state holding the keys `0, step, 2 * step, ...` below `end`.
fn loaded(end: u16, step: usize) -> Snapshot {
    let mut m = Melder::new(Settings::default());
    let mut load = Transaction::begin(m.lcs(), Isolation::SnapshotIsolation);
    for k in (0..end).step_by(step) {
        load.put(&k.to_be_bytes(), b"v0").unwrap();
    }
    let Ok(Finished::Intention(b)) = load.finish() else {
        panic!()
    };
    m.apply(&b);
    m.lcs().clone()
}

/// A deterministic stream of small numbers from `seed`.
fn draws(mut seed: u64) -> impl FnMut() -> u16 {
    move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as u16
    }
}

/// The in-memory conversion premeld uses gives exactly the intention
/// that encoding and decoding the same transaction gives.
#[test]
fn from_local_matches_the_encode_decode_round_trip() {
    let snap = loaded(400, 2);
    let mut next = draws(7);
    for round in 0..200 {
        let iso = [
            Isolation::Serializable,
            Isolation::RepeatableRead,
            Isolation::SnapshotIsolation,
        ][round % 3];
        let mut tx = Transaction::begin(&snap, iso);
        for _ in 0..(1 + next() % 12) {
            let k = (next() % 420).to_be_bytes();
            match next() % 4 {
                0 => drop(tx.get(&k).unwrap()),
                1 => tx.put(&k, b"new").unwrap(),
                2 => drop(tx.delete(&k).unwrap()),
                _ => drop(
                    tx.range(
                        Bound::Included(&k[..]),
                        Bound::Unbounded,
                        Order::Forward,
                        Some(3),
                    )
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                ),
            }
        }
        if !tx.has_writes() {
            continue;
        }
        let pos = snap.pos + 1;
        let s = tx.seal();
        let bytes = s.encode().unwrap();
        // Consumes the tree: its nodes move into the intention.
        let direct = s.intention(pos);
        let decoded = resolve(&parse(&bytes).unwrap(), pos, &snap.root).unwrap();
        assert_eq!(shape(&direct), shape(&decoded), "round {round}");
    }
}

/// Read marks put off until the first write leave the transaction with
/// exactly the intention it logs when every read marks at once.
#[test]
fn put_off_read_marks_give_the_intention_of_marking_at_once() {
    let snap = loaded(300, 3);
    let mut next = draws(11);
    let mut compared = 0;
    for round in 0..300 {
        let iso = [Isolation::Serializable, Isolation::RepeatableRead][round % 2];
        let ops: Vec<(u16, [u8; 2])> = (0..(1 + next() % 10))
            .map(|_| (next() % 5, (next() % 320).to_be_bytes()))
            .collect();
        let run = |at_once: bool| {
            let mut tx = Transaction::begin(&snap, iso);
            for (op, k) in &ops {
                match op {
                    0 | 1 => drop(tx.get(k).unwrap()),
                    2 => tx.put(k, b"new").unwrap(),
                    3 => drop(tx.delete(k).unwrap()),
                    _ => drop(
                        tx.range(
                            Bound::Included(&k[..]),
                            Bound::Unbounded,
                            Order::Forward,
                            Some(4),
                        )
                        .collect::<Result<Vec<_>, _>>()
                        .unwrap(),
                    ),
                }
                if at_once {
                    tx.mark_reads();
                }
            }
            match tx.finish().unwrap() {
                Finished::ReadOnly => None,
                Finished::Intention(b) => Some(b),
            }
        };
        let (later, at_once) = (run(false), run(true));
        assert_eq!(later, at_once, "round {round}: {ops:?}");
        compared += usize::from(later.is_some());
    }
    assert!(compared > 100, "only {compared} transactions wrote");
}
