//! Bytes from the network (protocol frames) and from the disk (pages,
//! end-write records, root stripes) are untrusted: for any input the
//! decoders return, never panic, and whatever they accept is canonical
//! (encoding the decoded value gives back exactly the input), so two
//! readers of the same bytes can never disagree about what they mean.
//! Inputs are arbitrary bytes and valid encodings with random edits.

use bytes::Bytes;
use melddb_log::page::Kind;
use melddb_log::protocol::{
    decode_request, decode_response, encode_request, encode_response, FrameError, Request, Response,
};
use melddb_log::samples::{check_canonical, encodings, end_write, requests, responses, root};
use melddb_log::stripe::{decode_end_write, decode_root, encode_end_write, encode_root, EndWrite};
use proptest::prelude::*;
use proptest::sample::Index;

fn edit(mut b: Vec<u8>, edits: &[(Index, u8)], cut: Option<Index>) -> Vec<u8> {
    for (i, v) in edits {
        if !b.is_empty() {
            let at = i.index(b.len());
            b[at] = *v;
        }
    }
    if let Some(c) = cut {
        b.truncate(c.index(b.len() + 1));
    }
    b
}

/// The library's canonical-decoding check (`samples::check_canonical`),
/// as a proptest failure.
fn check(b: &[u8]) -> Result<(), TestCaseError> {
    check_canonical(b).map_err(TestCaseError::fail)
}

/// The samples the fuzzers and these properties start from hold one of
/// every request and response type the decoders know (a type is known
/// when a frame of it is not refused for its type byte), and
/// `encodings` is each of them encoded, then a page, an end-write record
/// and a root stripe, each of which its own decoder takes.
#[test]
fn the_samples_hold_every_type_the_decoders_know() {
    let frame = |t: u8| Bytes::from([&[melddb_log::protocol::VERSION, t][..], &[0u8; 64]].concat());
    let known_requests: Vec<u8> = (0..=255u8)
        .filter(|&t| !matches!(decode_request(&frame(t)), Err((_, FrameError::Type(x))) if x == t))
        .collect();
    let known_responses: Vec<u8> = (0..=255u8)
        .filter(|&t| !matches!(decode_response(&frame(t)), Err(FrameError::Type(x)) if x == t))
        .collect();
    assert!(known_requests.len() >= 8 && known_responses.len() >= 6);
    let type_bytes = |frames: Vec<Bytes>| {
        let mut t: Vec<u8> = frames.iter().map(|f| f[1]).collect();
        t.sort_unstable();
        t.dedup();
        t
    };
    let reqs: Vec<Bytes> = requests().iter().map(|r| encode_request(1, r)).collect();
    let resps: Vec<Bytes> = responses().iter().map(|r| encode_response(1, r)).collect();
    assert_eq!(type_bytes(reqs), known_requests, "request types");
    assert_eq!(type_bytes(resps), known_responses, "response types");

    let enc = encodings();
    let (n, m) = (requests().len(), responses().len());
    assert_eq!(enc.len(), n + m + 3);
    for (i, b) in enc.iter().enumerate() {
        let b = Bytes::copy_from_slice(b);
        let taken = match i {
            i if i < n => decode_request(&b).is_ok(),
            i if i < n + m => decode_response(&b).is_ok(),
            i if i == n + m => melddb_log::page::decode(&b).is_ok(),
            i if i == n + m + 1 => decode_end_write(&b).is_ok(),
            _ => decode_root(&b).is_ok(),
        };
        assert!(taken, "encoding {i} is not what its decoder takes");
        check_canonical(&b).expect("canonical");
    }
}

#[test]
fn the_valid_encodings_decode_to_what_was_encoded() {
    for (i, r) in requests().iter().enumerate() {
        let f = encode_request(i as u64, r);
        assert_eq!(decode_request(&f).unwrap(), (i as u64, r.clone()));
        for cut in 0..f.len() {
            // Appends take the rest of the frame as the record, so a cut
            // inside the record is a shorter record, not an error.
            let record = match r {
                Request::Append { bytes, .. } => bytes.len(),
                _ => 0,
            };
            if cut < f.len() - record {
                assert!(
                    decode_request(&f.slice(..cut)).is_err(),
                    "{r:?} cut at {cut}"
                );
            }
        }
    }
    assert!(matches!(
        decode_request(&Bytes::from_static(&[9, 1])),
        Err((0, FrameError::Version(9)))
    ));
    for r in responses() {
        let f = encode_response(3, &r);
        assert_eq!(decode_response(&f).unwrap(), (3, r));
    }
    assert_eq!(
        decode_end_write(&encode_end_write(&end_write())).unwrap(),
        end_write()
    );
    assert_eq!(decode_root(&encode_root(&root()).0).unwrap(), root());
    for b in encodings() {
        check(&b).unwrap();
        // Trailing bytes: refused, or (an append's record, an entry's
        // bytes, a page's slack) part of what re-encodes.
        for extra in [&[0u8][..], &[1, 2, 3]] {
            let mut longer = b.clone();
            longer.extend_from_slice(extra);
            check(&longer).unwrap();
        }
    }
    // The disk records end where their contents say.
    let mut ew = encode_end_write(&end_write());
    ew.push(0);
    assert!(
        decode_end_write(&ew).is_err(),
        "end-write with a trailing byte"
    );
    let mut r = encode_root(&root()).0;
    r.push(0);
    assert!(
        decode_root(&r).is_err(),
        "root payload with a trailing byte"
    );
}

/// Each rule an end-write record must meet, on both sides of its edge:
/// a record recovery takes for real must be one the writer could have
/// written, and one it could have written must not be refused.
#[test]
fn end_write_rules_hold_exactly_at_their_edges() {
    let decodes = |ew: &EndWrite| {
        assert_eq!(
            decode_end_write(&encode_end_write(ew)).as_ref(),
            Ok(ew),
            "refused: {ew:?}"
        );
    };
    let refused = |ew: &EndWrite| {
        assert!(
            decode_end_write(&encode_end_write(ew)).is_err(),
            "accepted: {ew:?}"
        );
    };
    let base = end_write();
    decodes(&base);
    // The batch's first stripe is at or below the stripe.
    let mut e = base.clone();
    e.batch_seq = e.stripe.seq;
    decodes(&e);
    e.batch_seq = e.stripe.seq + 1;
    refused(&e);
    // Both stripe kinds that have end-writes.
    let mut e = base.clone();
    e.stripe.kind = Kind::Unordered;
    e.entries.clear();
    decodes(&e);
    for kind in [0u8, 3, 4, 255] {
        // After the version byte and three u64s: ew_base, batch_seq, seq.
        let mut b = encode_end_write(&base);
        assert_eq!(b[25], Kind::Ordered as u8);
        b[25] = kind;
        assert!(decode_end_write(&b).is_err(), "kind byte {kind}");
    }
    // At least one data and one parity shard, with a page each.
    for (k, m, ok) in [
        (1u8, 1u8, true),
        (0, 1, false),
        (2, 0, false),
        (0, 0, false),
    ] {
        let mut e = base.clone();
        e.stripe.k = k;
        e.stripe.m = m;
        e.stripe.shard_len = 100;
        e.stripe.pages = (0..u64::from(k + m)).map(|i| (i, 0)).collect();
        if ok {
            decodes(&e);
        } else {
            refused(&e);
        }
    }
    // The payload fits its data shards.
    let mut e = base.clone();
    e.stripe.payload_len = e.stripe.shard_len * u32::from(e.stripe.k);
    decodes(&e);
    e.stripe.payload_len += 1;
    refused(&e);
    // Every record's bytes lie within the payload (the sample's second
    // record ends exactly at it).
    let mut e = base.clone();
    assert_eq!(e.entries[1].offset + e.entries[1].len, e.stripe.payload_len);
    decodes(&e);
    e.stripe.payload_len -= 1;
    refused(&e);
}

/// A root entry's fragment list decodes at any length the payload holds,
/// and a count beyond it is refused before the list is allocated.
#[test]
fn root_fragment_lists_decode_at_any_length_and_impossible_counts_are_refused() {
    for n in [0u64, 1, 8, 9, 64] {
        let mut r = root();
        r[0].fragments = (100..100 + n).collect();
        assert_eq!(decode_root(&encode_root(&r).0), Ok(r), "{n} fragments");
    }
    // count, then the entry: log as str8, pos, client, request, len
    let r = root();
    let at = 4 + 1 + r[0].meta.log.len() + 8 + 8 + 8 + 4;
    let b = encode_root(&r).0;
    assert_eq!(b[at..at + 4], (r[0].fragments.len() as u32).to_le_bytes());
    for n in [b.len() as u32 / 8 + 1, u32::MAX] {
        let mut b = b.clone();
        b[at..at + 4].copy_from_slice(&n.to_le_bytes());
        assert!(decode_root(&b).is_err(), "count {n}");
    }
}

/// A batch's count is checked against the bytes left in its frame before
/// the records' (or positions') list is allocated (appended batches,
/// range answers, appended positions): a count of 4 billion in
/// a short frame must be refused by that check, not met with an
/// allocation of 100+ GB. Counts that fit decode.
#[test]
fn batch_counts_beyond_what_the_frame_holds_are_refused_before_allocating() {
    let too_many = |at: usize, f: &Bytes, n: u32| {
        let mut b = f.to_vec();
        b[at..at + 4].copy_from_slice(&n.to_le_bytes());
        Bytes::from(b)
    };
    for k in [0usize, 1, 5] {
        // Empty records: each takes exactly its 4-byte length, the least
        // a record can take, so a count of k fills the frame exactly.
        let r = Request::AppendBatch {
            log: "l".into(),
            client: 1,
            first_request: 1,
            records: vec![Bytes::new(); k],
        };
        let f = encode_request(7, &r);
        assert_eq!(decode_request(&f), Ok((7, r)));
        // version, type, corr, the log as str8, client, first request
        let count_at = 1 + 1 + 8 + 2 + 8 + 8;
        for n in [k as u32 + 1, k as u32 * 4 + 4, u32::MAX] {
            assert_eq!(
                decode_request(&too_many(count_at, &f, n)),
                Err((7, FrameError::Malformed("record count exceeds the frame"))),
                "{k} records, count {n}"
            );
        }

        // A range's answer: its records' count after `first`.
        let r = Response::Entries {
            first: 3,
            records: vec![Bytes::new(); k],
        };
        let f = encode_response(8, &r);
        assert_eq!(decode_response(&f), Ok((8, r)));
        let count_at = 1 + 1 + 8 + 8;
        for n in [k as u32 + 1, k as u32 * 4 + 4, u32::MAX] {
            assert_eq!(
                decode_response(&too_many(count_at, &f, n)),
                Err(FrameError::Malformed("record count exceeds the frame")),
                "{k} entries, count {n}"
            );
        }

        let r = Response::AppendedBatch {
            positions: (0..k as u64).collect(),
        };
        let f = encode_response(9, &r);
        assert_eq!(decode_response(&f), Ok((9, r)));
        let count_at = 1 + 1 + 8;
        for n in [k as u32 + 1, k as u32 * 8 + 8, u32::MAX] {
            assert_eq!(
                decode_response(&too_many(count_at, &f, n)),
                Err(FrameError::Malformed("position count exceeds the frame")),
                "{k} positions, count {n}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_and_what_decodes_is_canonical(
        b in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        check(&b)?;
    }

    #[test]
    fn edited_encodings_never_panic_and_what_decodes_is_canonical(
        which in any::<Index>(),
        edits in proptest::collection::vec((any::<Index>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<Index>()),
    ) {
        let all = encodings();
        let b = edit(all[which.index(all.len())].clone(), &edits, cut);
        check(&b)?;
    }
}
