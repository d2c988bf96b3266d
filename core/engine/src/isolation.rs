//! The isolation levels a transaction can run at, and their codes in an
//! intention.

/// Isolation level of a transaction. What each level validates at meld time
/// (against every transaction committed in its conflict zone, i.e. between its
/// snapshot and its own log position):
///
/// | level | write-write | point reads | scanned ranges |
/// |---|---|---|---|
/// | `SnapshotIsolation` | yes | no | no |
/// | `RepeatableRead` | yes | yes (`get`, present or absent, and each pair a scan returned) | no (phantoms possible) |
/// | `Serializable` | yes | yes | yes (any insert, update or delete inside a scanned range) |
///
/// All levels read one consistent snapshot and see their own writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// First-committer-wins on written keys only (snapshot isolation).
    SnapshotIsolation,
    /// Snapshot isolation plus validation of every key read.
    RepeatableRead,
    /// Repeatable read plus phantom protection of every scanned range.
    Serializable,
}

impl Isolation {
    pub(crate) fn code(self) -> u8 {
        match self {
            Isolation::SnapshotIsolation => 0,
            Isolation::RepeatableRead => 1,
            Isolation::Serializable => 2,
        }
    }
    pub(crate) fn from_code(c: u8) -> Option<Isolation> {
        Some(match c {
            0 => Isolation::SnapshotIsolation,
            1 => Isolation::RepeatableRead,
            2 => Isolation::Serializable,
            _ => return None,
        })
    }
    pub(crate) fn tracks_reads(self) -> bool {
        self != Isolation::SnapshotIsolation
    }
}
