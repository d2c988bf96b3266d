//! Fuzzes every decoder of bytes the log service takes from outside:
//! protocol frames (requests and responses, as the service and the client
//! read them) and what recovery reads from disk (page headers, pages,
//! end-write records, root stripes). None may panic, and whatever one
//! accepts must re-encode to exactly the input
//! (`melddb_log::samples::check_canonical`, which the property tests use
//! too), so two readers of the same bytes can never disagree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use melddb_log::page;
use melddb_log::samples::check_canonical;

fn check(b: &[u8]) {
    if let Err(e) = check_canonical(b) {
        panic!("{e}");
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
