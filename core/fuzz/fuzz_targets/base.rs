//! The committed state every fuzzed intention is decoded and melded
//! against, shared by the fuzz target and the seed-corpus generator so
//! that the seeds' cross-pointers resolve.

use melddb::{Database, Isolation, Settings};

/// 200 keys (`i * 3` big-endian, so gaps exist for inserts) in one commit.
pub fn base() -> Database {
    let mut db = Database::create(Settings::default()).expect("settings are valid");
    let mut tx = db.begin(Isolation::Serializable);
    for i in 0u64..200 {
        tx.put(&(i * 3).to_be_bytes(), &i.to_le_bytes())
            .expect("valid pair");
    }
    db.commit(tx).expect("in-memory commit");
    db
}
