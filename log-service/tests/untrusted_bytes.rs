//! Bytes from the network (protocol frames) and from the disk (pages,
//! end-write records, root stripes) are untrusted: for any input the
//! decoders return, never panic, and whatever they accept is canonical
//! (encoding the decoded value gives back exactly the input), so two
//! readers of the same bytes can never disagree about what they mean.
//! Inputs are arbitrary bytes and valid encodings with random edits.

use bytes::Bytes;
use melddb_log::protocol::{
    decode_request, decode_response, encode_request, encode_response, FrameError, Request,
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
