//! Fuzzes every decoder of bytes the log service takes from outside:
//! protocol frames (requests and responses, as the service and the client
//! read them) and what recovery reads from disk (page headers, pages,
//! end-write records, root stripes). None may panic, and whatever one
//! accepts must re-encode to exactly the input, so two readers of the same
//! bytes can never disagree about what they mean.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use melddb_log::page;
use melddb_log::protocol::{
    decode_request, decode_response, encode_request, encode_response, Code, Response,
};
use melddb_log::stripe::{decode_end_write, decode_root, encode_end_write, encode_root};

fn check(b: &[u8]) {
    let frame = Bytes::copy_from_slice(b);
    if let Ok((corr, r)) = decode_request(&frame) {
        assert_eq!(encode_request(corr, &r), frame, "request {r:?}");
    }
    if let Ok((corr, r)) = decode_response(&frame) {
        let mut again = encode_response(corr, &r).to_vec();
        // The one documented leniency: an error code this build does not
        // know (a newer server's) reads as `BadFrame`. The code follows the
        // version, the type and the correlation id (1 + 1 + 8 bytes).
        if let Response::Error { code, .. } = &r {
            let wire = u16::from_le_bytes([b[10], b[11]]);
            if wire != *code as u16 {
                assert_eq!(*code, Code::BadFrame);
                again[10..12].copy_from_slice(&wire.to_le_bytes());
            }
        }
        assert_eq!(Bytes::from(again), frame, "response {r:?}");
    }
    let _ = page::header(b);
    if let Ok((h, body)) = page::decode(b) {
        let len = h.page_len() as usize;
        assert_eq!(page::encode(&h, body), b[..len].to_vec());
    }
    if let Ok(ew) = decode_end_write(b) {
        assert_eq!(encode_end_write(&ew), b.to_vec());
    }
    if let Ok(entries) = decode_root(b) {
        assert_eq!(encode_root(&entries).0, b.to_vec());
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // Also as the body of a page with a correct checksum, so mutations get
    // past the CRC to the page's own checks.
    if data.len() >= page::HEADER {
        let mut sealed = data.to_vec();
        sealed[0..4].copy_from_slice(b"MLDP");
        let body_len = (sealed.len() - page::HEADER) as u32;
        sealed[12..16].copy_from_slice(&body_len.to_le_bytes());
        page::seal(&mut sealed, 0);
        check(&sealed);
    }
});
