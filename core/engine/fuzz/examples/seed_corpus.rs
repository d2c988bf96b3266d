//! Writes a seed corpus for the `decode_intention` fuzz target: real
//! intentions made on the target's base state, each as a whole record and
//! as the body the target seals itself (magic and checksum cut off), so
//! mutations start from bytes that parse, resolve and meld.
//!
//! ```text
//! cargo run --example seed_corpus -- corpus/decode_intention
//! ```

use std::ops::Bound;
use std::path::PathBuf;

use melddb::{Finished, Isolation, Order, Transaction};

#[path = "../fuzz_targets/base.rs"]
mod base;

use base::key;

/// One transaction shape: what it does on the base snapshot.
type Shape = fn(&mut Transaction);

fn shapes() -> Vec<(&'static str, Isolation, Shape)> {
    use Isolation::*;
    vec![
        ("update", Serializable, |t| {
            t.put(&key(30), b"new value").unwrap();
        }),
        ("reads-writes", Serializable, |t| {
            for i in [3u64, 60, 99, 150, 300, 450, 501, 597] {
                t.get(&key(i)).unwrap();
            }
            t.put(&key(33), b"a").unwrap();
            t.put(&key(333), b"b").unwrap();
        }),
        ("inserts", Serializable, |t| {
            for i in [1u64, 2, 4, 298, 599, 10_000] {
                t.put(&key(i), &i.to_le_bytes()).unwrap();
            }
        }),
        ("deletes", Serializable, |t| {
            for i in [0u64, 3, 6, 300, 597] {
                t.delete(&key(i)).unwrap();
            }
            t.delete(&key(1)).unwrap();
        }),
        ("scan-write", Serializable, |t| {
            t.range(
                Bound::Included(&key(90)[..]),
                Bound::Excluded(&key(200)[..]),
                Order::Forward,
                Some(10),
            ).collect::<Result<Vec<_>, _>>()
            .unwrap();
            t.range(Bound::Unbounded, Bound::Unbounded, Order::Reverse, Some(3)).collect::<Result<Vec<_>, _>>()
                .unwrap();
            t.put(&key(120), b"scanned").unwrap();
        }),
        ("absent-read", Serializable, |t| {
            t.get(&key(31)).unwrap();
            t.put(&key(32), b"x").unwrap();
        }),
        ("repeatable-read", RepeatableRead, |t| {
            t.get(&key(42)).unwrap();
            t.range(
                Bound::Included(&key(0)[..]),
                Bound::Included(&key(30)[..]),
                Order::Forward,
                None,
            ).collect::<Result<Vec<_>, _>>()
            .unwrap();
            t.put(&key(42), b"rr").unwrap();
        }),
        ("snapshot-isolation", SnapshotIsolation, |t| {
            t.get(&key(51)).unwrap();
            t.put(&key(51), &[7; 40]).unwrap();
            t.delete(&key(54)).unwrap();
        }),
        ("many", Serializable, |t| {
            for i in 0u64..60 {
                match i % 4 {
                    0 => drop(t.get(&key(i * 9)).unwrap()),
                    1 => t.put(&key(i * 9), &[i as u8; 30]).unwrap(),
                    2 => drop(t.delete(&key(i * 9)).unwrap()),
                    _ => t.put(&key(i * 9 + 1), &[1]).unwrap(),
                }
            }
        }),
    ]
}

fn main() {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "corpus/decode_intention".into()),
    );
    std::fs::create_dir_all(&dir).expect("corpus directory can be created");
    let db = base::base();
    let mut written = 0;
    for (name, isolation, shape) in shapes() {
        let mut tx = db.begin(isolation);
        shape(&mut tx);
        let Finished::Intention(bytes) = tx.finish().expect("transaction seals") else {
            panic!("seed {name} wrote nothing");
        };
        // A seed that does not decode against the base would only teach the
        // fuzzer the decoder's first checks.
        if let Err(e) = db.melder().decode(db.melder().next_pos(), &bytes) {
            panic!("seed {name} does not decode against the base state: {e}");
        }
        std::fs::write(dir.join(format!("seed-{name}")), &bytes).expect("seed written");
        // The target seals the body itself: magic (4 bytes) and CRC (4) off.
        std::fs::write(
            dir.join(format!("seed-{name}-body")),
            &bytes[4..bytes.len() - 4],
        )
        .expect("seed written");
        written += 2;
    }
    eprintln!("{written} seeds in {}", dir.display());
}
