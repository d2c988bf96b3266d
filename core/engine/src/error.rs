//! Typed errors, one enum per operation, and the umbrella [`Error`].

use crate::node::LogPos;

/// Largest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 4096;
/// Largest value accepted, in bytes.
pub const MAX_VALUE_LEN: usize = 1 << 20;
/// Largest encoded intention accepted, in bytes.
pub const MAX_INTENTION_BYTES: usize = 64 << 20;
/// Most nodes one intention may hold.
pub const MAX_INTENTION_NODES: usize = 1 << 22;
/// Most dependency ranges one node (or the intention header) may hold.
pub const MAX_RANGES_PER_NODE: usize = 1 << 16;

/// An argument given to a transaction operation was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("key of {len} bytes exceeds the limit of {MAX_KEY_LEN} bytes; use a shorter key (e.g. a hash prefix)")]
    KeyTooLong {
        /// Length of the rejected key.
        len: usize,
    },
    /// The value is longer than [`MAX_VALUE_LEN`].
    #[error("value of {len} bytes exceeds the limit of {MAX_VALUE_LEN} bytes; split it over several keys")]
    ValueTooLarge {
        /// Length of the rejected value.
        len: usize,
    },
    /// The transaction's intention would exceed [`MAX_INTENTION_BYTES`] or
    /// [`MAX_INTENTION_NODES`].
    #[error("the transaction is too large to log ({what}); split it into smaller transactions")]
    TooLarge {
        /// Which limit was hit.
        what: &'static str,
    },
    /// A node of the snapshot could not be read back from the log (node
    /// cache); the operation did nothing.
    #[error(transparent)]
    Store(#[from] crate::node::StoreError),
}

/// Bytes that are not a valid intention (or genesis record). Every node
/// rejects the same bytes with the same error, and meld treats such a log
/// entry as an aborted transaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The record does not start with the expected magic bytes.
    #[error("not a MeldDB {what} record (bad magic)")]
    BadMagic {
        /// Which record was expected.
        what: &'static str,
    },
    /// The record's format version is not supported by this build.
    #[error("format version {found} is not supported (this build reads version {supported}); upgrade MeldDB")]
    UnsupportedVersion {
        /// Version in the record.
        found: u8,
        /// Version this build reads.
        supported: u8,
    },
    /// The checksum does not match the content.
    #[error("checksum mismatch: the record is corrupt")]
    Checksum,
    /// The record ends in the middle of a field.
    #[error("record truncated while reading {field}")]
    Truncated {
        /// Field being read.
        field: &'static str,
    },
    /// A varint is longer than 10 bytes or overflows 64 bits.
    #[error("malformed varint in {field}")]
    BadVarint {
        /// Field being read.
        field: &'static str,
    },
    /// A length or count exceeds a documented limit.
    #[error("{field} of {value} exceeds the limit of {limit}")]
    Limit {
        /// Field being read.
        field: &'static str,
        /// Value found.
        value: u64,
        /// The limit.
        limit: u64,
    },
    /// A field holds a value that no valid writer produces.
    #[error("invalid {field}: {why}")]
    Invalid {
        /// Field being read.
        field: &'static str,
        /// What is wrong.
        why: &'static str,
    },
    /// Bytes remain after the last field.
    #[error("{0} trailing bytes after the record")]
    Trailing(usize),
    /// A pointer or unaltered node does not resolve in the snapshot.
    #[error("node reference does not resolve in the snapshot: {why}")]
    Unresolved {
        /// What failed to resolve.
        why: &'static str,
    },
    /// The tree in the intention is not a valid AVL search tree.
    #[error("intention tree is malformed: {why}")]
    BadTree {
        /// What is wrong.
        why: &'static str,
    },
}

/// A log operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// The position was trimmed away; read a newer checkpoint instead.
    #[error("log position {pos} was trimmed (the log now starts at {first})")]
    Trimmed {
        /// Requested position.
        pos: LogPos,
        /// First readable position.
        first: LogPos,
    },
    /// The position has not been written yet.
    #[error("log position {pos} is beyond the tail {tail}")]
    NotYetWritten {
        /// Requested position.
        pos: LogPos,
        /// Next position to be written.
        tail: LogPos,
    },
    /// Trimming beyond the tail is not allowed.
    #[error("cannot trim to {pos}: beyond the tail {tail}")]
    TrimBeyondTail {
        /// Requested trim point.
        pos: LogPos,
        /// Next position to be written.
        tail: LogPos,
    },
    /// The entry is larger than the log accepts.
    #[error("log entry of {len} bytes exceeds the limit of {limit} bytes")]
    EntryTooLarge {
        /// Entry length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// Another error from a log implementation (I/O, network).
    #[error("log backend error: {0}")]
    Backend(String),
}

/// Opening or creating a database failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The log's first entry is not a valid genesis record.
    #[error("the log does not start with a valid genesis record: {0}")]
    Genesis(#[source] DecodeError),
    /// Reading the log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The settings are outside their documented ranges.
    #[error("invalid setting {name}: {why}")]
    Setting {
        /// Setting name.
        name: &'static str,
        /// What is wrong.
        why: &'static str,
    },
}

/// Writing or loading a checkpoint failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// One part's framing or checksum is bad.
    #[error("checkpoint part {index} is corrupt: {source}")]
    Part {
        /// 0-based part index.
        index: u64,
        /// What is wrong.
        #[source]
        source: DecodeError,
    },
    /// The parts given are not one whole checkpoint.
    #[error("checkpoint part {index}: {why}")]
    Incomplete {
        /// 0-based part index.
        index: u64,
        /// What is wrong.
        why: &'static str,
    },
    /// The body does not decode to a valid tree.
    #[error("checkpoint body is malformed: {0}; recover from an earlier checkpoint or the genesis record")]
    Body(#[from] DecodeError),
    /// The rebuilt state differs from the one the writer recorded.
    #[error("checkpoint digest mismatch: the rebuilt state is not the recorded one")]
    Digest,
    /// A stub's node could not be read back while encoding.
    #[error(transparent)]
    Store(#[from] crate::node::StoreError),
    /// Reading a part failed (lazy loads read them one at a time).
    #[error("reading a checkpoint part: {0}")]
    Read(String),
    /// The sink refused a part (the host stopped the checkpoint).
    #[error("checkpoint stopped by its writer")]
    Stopped,
    /// The state is too large for one checkpoint.
    #[error("a checkpoint of {bytes} bytes needs more than the allowed number of parts; raise the part size")]
    TooLarge {
        /// Encoded body size.
        bytes: u64,
    },
}

/// Committing a transaction failed before its outcome was known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    /// The transaction could not be encoded.
    #[error(transparent)]
    Txn(#[from] TxnError),
    /// Appending to or reading the log failed; the outcome is unknown until
    /// the log can be read again.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The transaction was begun on a snapshot of another database.
    #[error("the transaction's snapshot does not belong to this database")]
    ForeignSnapshot,
}

/// Umbrella error for callers that do not need to tell operations apart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// See [`TxnError`].
    #[error(transparent)]
    Txn(#[from] TxnError),
    /// See [`DecodeError`].
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// See [`LogError`].
    #[error(transparent)]
    Log(#[from] LogError),
    /// See [`OpenError`].
    #[error(transparent)]
    Open(#[from] OpenError),
    /// See [`CommitError`].
    #[error(transparent)]
    Commit(#[from] CommitError),
}

pub(crate) fn check_key(key: &[u8]) -> Result<(), TxnError> {
    if key.len() > MAX_KEY_LEN {
        return Err(TxnError::KeyTooLong { len: key.len() });
    }
    Ok(())
}

pub(crate) fn check_value(value: &[u8]) -> Result<(), TxnError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(TxnError::ValueTooLarge { len: value.len() });
    }
    Ok(())
}

impl From<String> for CheckpointError {
    fn from(why: String) -> CheckpointError {
        CheckpointError::Read(why)
    }
}
