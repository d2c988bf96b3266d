//! Bytes from the network (protocol frames) and from the disk (pages,
//! end-write records, root stripes) are untrusted: for any input the
//! decoders return, never panic, and whatever they accept is canonical
//! (encoding the decoded value gives back exactly the input), so two
//! readers of the same bytes can never disagree about what they mean.
//! Inputs are arbitrary bytes and valid encodings with random edits.

use bytes::Bytes;
use melddb_log::protocol::{
    decode_request, decode_response, encode_request, encode_response, FrameError, Request, Response,
};
use melddb_log::samples::{check_canonical, encodings, end_write, requests, responses, root};
use melddb_log::stripe::{decode_end_write, decode_root, encode_end_write, encode_root};
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

/// A batch's count is checked against the bytes left in its frame before
/// the records' (or positions') list is allocated: a count of 4 billion in
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
