//! The intention decoder on hostile input: it never panics, rejects
//! corruption with a typed error, and a malformed log entry aborts the same
//! way on every node without disturbing the database.

use melddb::{
    parse, AbortReason, Database, DecodeError, Finished, Isolation, Melder, Outcome, Settings,
    Transaction,
};
use proptest::prelude::*;

fn k(i: u64) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

/// A database with some keys and one valid intention against it.
fn fixture() -> (Database, Vec<u8>) {
    let mut db = Database::create(Settings::default()).unwrap();
    let mut tx = db.begin(Isolation::Serializable);
    for i in 0..50 {
        tx.put(&k(i * 2), format!("v{i}").as_bytes()).unwrap();
    }
    db.commit(tx).unwrap();
    let mut tx = db.begin(Isolation::Serializable);
    tx.get(&k(10)).unwrap();
    tx.put(&k(11), b"new").unwrap();
    tx.delete(&k(40)).unwrap();
    tx.range(
        std::ops::Bound::Included(&k(20)[..]),
        std::ops::Bound::Excluded(&k(30)[..]),
        melddb::Order::Forward,
        None,
    )
    .collect::<Result<Vec<_>, _>>()
    .unwrap();
    let Finished::Intention(bytes) = tx.finish().unwrap() else {
        panic!("expected an intention")
    };
    (db, bytes)
}

fn decode_at_tail(db: &Database, bytes: &[u8]) -> Result<(), AbortReason> {
    db.melder()
        .decode(db.melder().next_pos(), bytes)
        .map(|_| ())
}

#[test]
fn valid_intention_round_trips_and_reports_metadata_size() {
    let (db, bytes) = fixture();
    let p = parse(&bytes).unwrap();
    assert!(p.node_count() > 3);
    assert_eq!(p.delete_count(), 1);
    assert!(
        p.metadata_bytes_per_node() < 30.0,
        "{}",
        p.metadata_bytes_per_node()
    );
    decode_at_tail(&db, &bytes).unwrap();
}

#[test]
fn every_single_bit_flip_is_rejected() {
    let (db, bytes) = fixture();
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            assert!(
                decode_at_tail(&db, &b).is_err(),
                "flip at {i}.{bit} accepted"
            );
        }
    }
}

#[test]
fn every_truncation_is_rejected() {
    let (db, bytes) = fixture();
    for len in 0..bytes.len() {
        assert!(
            decode_at_tail(&db, &bytes[..len]).is_err(),
            "prefix {len} accepted"
        );
    }
}

#[test]
fn malformed_entry_aborts_identically_on_two_nodes() {
    let (mut db, bytes) = fixture();
    let mut bad = bytes.clone();
    let n = bad.len();
    bad[n / 2] ^= 0x40;
    let out = db.append_raw(&bad).unwrap();
    let Outcome::Aborted {
        reason: AbortReason::Malformed(e),
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(e, &DecodeError::Checksum);
    // A second node replaying the same log reaches the same verdicts and state.
    let replica = Database::open(db.log().clone()).unwrap();
    assert_eq!(replica.snapshot().to_vec(), db.snapshot().to_vec());
    assert_eq!(replica.snapshot().csn(), db.snapshot().csn());
    // The database still works.
    let mut tx = db.begin(Isolation::Serializable);
    tx.put(b"after", b"ok").unwrap();
    assert!(db.commit(tx).unwrap().is_committed());
}

#[test]
fn hostile_but_checksummed_bodies_are_rejected() {
    // Recompute the checksum after tampering so the structural checks run.
    let (db, bytes) = fixture();
    let body = &bytes[..bytes.len() - 4];
    let reseal = |mut b: Vec<u8>| {
        let c = crc32fast_hash(&b);
        b.extend_from_slice(&c.to_le_bytes());
        b
    };
    let mut rejected = 0;
    for i in 4..body.len() {
        for v in [0u8, 1, 2, 3, 0x7f, 0x80, 0xff] {
            let mut b = body.to_vec();
            if b[i] == v {
                continue;
            }
            b[i] = v;
            let b = reseal(b);
            // Must not panic; most mutations must be rejected, the rest
            // must decode to an intention that melds without panicking.
            match decode_at_tail(&db, &b) {
                Err(_) => rejected += 1,
                Ok(()) => {
                    // Meld it into a replica of the real state: whatever it
                    // decides, the tree must stay a valid search tree.
                    let mut replica = Database::open(db.log().clone()).unwrap();
                    replica.append_raw(&b).unwrap();
                    melddb::validate::check_tree(&replica.snapshot()).unwrap();
                }
            }
        }
    }
    assert!(rejected > body.len() * 3, "only {rejected} rejected");
}

fn crc32fast_hash(b: &[u8]) -> u32 {
    // Same CRC-32 (IEEE) as the codec, computed bitwise so the test does not
    // share code with the implementation it checks.
    let mut crc = 0xffff_ffffu32;
    for &x in b {
        crc ^= x as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn oversized_keys_and_values_are_rejected_with_clear_errors() {
    let db = Database::create(Settings::default()).unwrap();
    let mut tx = db.begin(Isolation::Serializable);
    let e = tx
        .put(&vec![0u8; melddb::error::MAX_KEY_LEN + 1], b"v")
        .unwrap_err();
    assert!(e.to_string().contains("exceeds the limit"), "{e}");
    let e = tx
        .put(b"k", &vec![0u8; melddb::error::MAX_VALUE_LEN + 1])
        .unwrap_err();
    assert!(matches!(e, melddb::TxnError::ValueTooLarge { .. }));
    assert!(tx.get(&vec![1u8; melddb::error::MAX_KEY_LEN + 1]).is_err());
    // Limits themselves are accepted.
    tx.put(&vec![7u8; melddb::error::MAX_KEY_LEN], &vec![1u8; 1000])
        .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Arbitrary bytes: parse and decode return, never panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&bytes);
        let m = Melder::new(Settings::default());
        let _ = m.decode(1, &bytes);
        let mut with_magic = b"MLDI\x01".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = parse(&with_magic);
        // The genesis record is read from the same untrusted log.
        let _ = Settings::decode(&bytes);
        // Past its checksum too: magic and version, the bytes, a good CRC.
        let mut genesis = Settings::default().encode();
        genesis.truncate(5);
        genesis.extend_from_slice(&bytes);
        let crc = crc32fast_hash(&genesis);
        genesis.extend_from_slice(&crc.to_le_bytes());
        if let Ok(s) = Settings::decode(&genesis) {
            // What decodes is a valid configuration.
            prop_assert!(s.validate().is_ok());
        }
    }

    /// Valid intentions with random edits, with the checksum fixed up.
    #[test]
    fn edited_intentions_never_panic(
        seed in 0u64..50,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let (db, bytes) = fixture();
        let mut tx = Transaction::begin(&db.snapshot(), Isolation::Serializable);
        tx.put(&k(seed), b"x").unwrap();
        let Finished::Intention(own) = tx.finish().unwrap() else { panic!() };
        for base in [bytes, own] {
            let mut body = base[..base.len() - 4].to_vec();
            for (ix, v) in &edits {
                let i = ix.index(body.len());
                body[i] = *v;
            }
            let c = crc32fast_hash(&body);
            body.extend_from_slice(&c.to_le_bytes());
            let _ = decode_at_tail(&db, &body);
            let mut m = Melder::new(Settings::default());
            let _ = m.apply(&body);
        }
    }
}

/// A checksummed intention whose nodes form one long chain (each node the
/// left child of the next): deeper than any balanced tree. It must be
/// rejected with a typed error before any recursion could overflow the
/// stack, at every length from just over the limit to very long.
#[test]
fn degenerate_deep_chains_are_rejected_without_recursing() {
    fn chain(n: u32) -> Vec<u8> {
        let mut b = b"MLDI".to_vec();
        b.push(1); // format version
        b.push(2); // serializable
        b.extend_from_slice(&[0, 0]); // snapshot position 0, csn 0
        let mut count = Vec::new();
        let mut c = n as u64;
        loop {
            let byte = (c & 0x7f) as u8;
            c >>= 7;
            if c == 0 {
                count.push(byte);
                break;
            }
            count.push(byte | 0x80);
        }
        b.extend_from_slice(&count);
        for i in 0..n {
            b.push(1); // altered (an insert)
            b.push(if i == 0 { 0 } else { 1 }); // left child: the previous node
            let key = i.to_be_bytes();
            b.push(4);
            b.extend_from_slice(&key);
            b.push(1);
            b.push(b'v');
        }
        b.push(1); // root: the last node
        b.push(0); // no deletes
        b.push(0); // no header ranges
        let c = crc32fast_hash(&b);
        b.extend_from_slice(&c.to_le_bytes());
        b
    }
    let db = Database::create(Settings::default()).unwrap();
    // A short chain parses and is rejected as unbalanced, not as deep.
    assert!(parse(&chain(3)).is_ok());
    for n in [97u32, 1_000, 200_000] {
        let bytes = chain(n);
        assert!(parse(&bytes).is_ok(), "well-framed chain of {n}");
        match decode_at_tail(&db, &bytes) {
            Err(AbortReason::Malformed(DecodeError::BadTree { why })) => {
                assert!(why.contains("deeper"), "{n}: {why}")
            }
            other => panic!("chain of {n}: {other:?}"),
        }
    }
}
