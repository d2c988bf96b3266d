//! The committed state every fuzzed intention is decoded and melded
//! against, shared by the fuzz target and the seed-corpus generator so
//! that the seeds' cross-pointers resolve.

use melddb::{Database, Isolation, Settings};

/// Key `i`, big-endian, as the base state and the seeds spell it.
pub fn key(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

/// 200 keys (`key(i * 3)`, so gaps exist for inserts) in one commit.
pub fn base() -> Database {
    let mut db = Database::create(Settings::default()).expect("settings are valid");
    let mut tx = db.begin(Isolation::Serializable);
    for i in 0u64..200 {
        tx.put(&key(i * 3), &i.to_le_bytes()).expect("valid pair");
    }
    db.commit(tx).expect("in-memory commit");
    db
}
