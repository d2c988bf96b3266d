//! Typed errors, one enum per kind of operation.

use std::path::PathBuf;

/// The configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML did not parse or had unknown fields.
    #[error("config does not parse: {0}")]
    Parse(String),
    /// A value is out of range; the message says which and why.
    #[error("config is invalid: {0}")]
    Invalid(String),
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Opening the store (recovery) failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A zone directory or segment could not be read or created.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A stripe every copy of whose end-write says it exists cannot be
    /// rebuilt: more pages are lost than there is parity. Restore the
    /// segment files from a backup.
    #[error("stripe {stripe} is unreadable: {why}")]
    Unrecoverable {
        /// Stripe sequence number.
        stripe: u64,
        /// What is missing.
        why: String,
    },
    /// The service metadata file is corrupt in every zone.
    #[error("metadata is corrupt in every zone: {0}")]
    Meta(String),
    /// Another process has this zone directory open: a second service, or
    /// `melddb-log check`, on the same zones would corrupt the log.
    #[error(
        "zone directory {} is in use by another process{}: stop it first, or give this service its own zone directories",
        .zone.display(),
        .holder.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    InUse {
        /// The zone directory whose lock is held.
        zone: PathBuf,
        /// The holder's process id, as it wrote it in the lock file.
        holder: Option<u32>,
    },
}

/// A store operation (append, read, trim) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Log names are 1-64 bytes of `[A-Za-z0-9_.-]`.
    #[error("invalid log name {0:?}: use 1-64 characters from A-Z a-z 0-9 _ . -")]
    BadLogName(String),
    /// The log has no such position yet.
    #[error("log {log:?} position {pos} is not written yet (tail {tail})")]
    NotYetWritten {
        /// Log name.
        log: String,
        /// Requested.
        pos: u64,
        /// Next position.
        tail: u64,
    },
    /// The position was trimmed.
    #[error("log {log:?} position {pos} was trimmed (first readable is {first})")]
    Trimmed {
        /// Log name.
        log: String,
        /// Requested.
        pos: u64,
        /// First readable.
        first: u64,
    },
    /// Trim beyond the tail.
    #[error("cannot trim log {log:?} to {pos}: beyond the tail {tail}")]
    TrimBeyondTail {
        /// Log name.
        log: String,
        /// Requested.
        pos: u64,
        /// Next position.
        tail: u64,
    },
    /// The record is larger than `max_record_bytes`.
    #[error("record of {len} bytes exceeds max_record_bytes {limit}")]
    TooLarge {
        /// Length.
        len: usize,
        /// Limit.
        limit: usize,
    },
    /// Every allowed segment is in use (`max_segments`, or every slot of
    /// a zone's device); trim the log.
    #[error("the log is full: {0} segments in use (max_segments, or every slot of a zone's device); trim old positions")]
    Full(u64),
    /// A write failed; the append was not acknowledged and may be retried
    /// with the same request id.
    #[error("write failed, append not acknowledged (retry with the same request id): {0}")]
    WriteFailed(String),
    /// More pages of a stripe are lost than parity can rebuild.
    #[error("stripe {stripe} cannot be rebuilt: {why}")]
    Unrecoverable {
        /// Stripe.
        stripe: u64,
        /// What is missing.
        why: String,
    },
    /// The service is shutting down.
    #[error("the log service is shutting down")]
    ShuttingDown,
}
