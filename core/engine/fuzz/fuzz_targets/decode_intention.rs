//! Fuzzes the intention decoder and meld on untrusted bytes: parsing,
//! resolving against a real committed state and melding must never panic,
//! and whatever melds must leave a valid search tree.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use melddb::Database;

mod base;

static BASE: LazyLock<Database> = LazyLock::new(base::base);

fn check(bytes: &[u8]) {
    let _ = melddb::parse(bytes);
    let base = &*BASE;
    if base
        .melder()
        .decode(base.melder().next_pos(), bytes)
        .is_ok()
    {
        let mut replica = Database::open(base.log().clone()).expect("replica opens");
        let _ = replica.append_raw(bytes);
        melddb::validate::check_tree(&replica.snapshot()).expect("tree stays valid");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // Also as an intention body with a correct checksum, so the fuzzer gets
    // past the CRC to the structural checks.
    let mut sealed = b"MLDI".to_vec();
    sealed.extend_from_slice(data);
    let crc = crc32fast::hash(&sealed);
    sealed.extend_from_slice(&crc.to_le_bytes());
    check(&sealed);
});
