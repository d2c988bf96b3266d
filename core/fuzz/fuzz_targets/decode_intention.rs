//! Fuzzes the intention decoder and meld on untrusted bytes: parsing,
//! resolving against a real committed state and melding must never panic,
//! and whatever melds must leave a valid search tree.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use melddb::{Database, Isolation, Settings};

static BASE: LazyLock<Database> = LazyLock::new(|| {
    let mut db = Database::create(Settings::default()).expect("settings are valid");
    let mut tx = db.begin(Isolation::Serializable);
    for i in 0u64..200 {
        tx.put(&(i * 3).to_be_bytes(), &i.to_le_bytes()).expect("valid pair");
    }
    db.commit(tx).expect("in-memory commit");
    db
});

fuzz_target!(|data: &[u8]| {
    let _ = melddb::parse(data);
    let base = &*BASE;
    if base.melder().decode(base.melder().next_pos(), data).is_ok() {
        let mut replica = Database::open(base.log().clone()).expect("replica opens");
        let _ = replica.append_raw(data);
        melddb::validate::check_tree(&replica.snapshot()).expect("tree stays valid");
    }
});
