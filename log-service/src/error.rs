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
    /// A device is claimed by someone else (a second service on it from
    /// other zone directories, or a mounted file system), still after the
    /// open waited for a killed service's claim to be let go.
    #[error(
        "device {} is in use: mounted, or held by another process ({reason}); stop what holds it (or unmount it), or give this service its own devices",
        .device.display()
    )]
    DeviceInUse {
        /// The device's path.
        device: PathBuf,
        /// What the system said.
        reason: String,
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
    /// The file system holding a segment or the metadata is out of space
    /// (or of the user's quota). The append was not acknowledged and
    /// nothing written before is lost; once space is freed (on that disk,
    /// or by trimming old positions, which deletes whole segments) the
    /// append may be retried with the same request id. Retrying sooner
    /// fails the same way.
    #[error("no space left for the log, append not acknowledged: {0}; free space on that disk or trim old positions, then retry with the same request id")]
    NoSpace(String),
    /// A count the store keeps (a log's positions, stripe numbers, the
    /// metadata's version) would reach 2^62 ([`crate::meta::LIMIT`]), the
    /// most a store counts to and writes in its metadata. Counting one at
    /// a time from 0 never gets there; a `meta.json` edited to a number
    /// near the limit does. Nothing was written and nothing is lost;
    /// retrying fails the same way.
    #[error("{0} would reach 2^62, the most a store counts to (meta.json was edited to a number near it); nothing was written")]
    Exhausted(String),
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

impl StoreError {
    /// The error an append reports for an I/O error `e` while doing
    /// `what`: [`StoreError::NoSpace`] when the file system is full or the
    /// quota is used up (`ENOSPC`, `EDQUOT`), since the remedy differs
    /// from a failing device, and [`StoreError::WriteFailed`] otherwise.
    pub(crate) fn from_write(what: impl std::fmt::Display, e: &std::io::Error) -> StoreError {
        let msg = format!("{what}: {e}");
        if no_space(e) {
            StoreError::NoSpace(msg)
        } else {
            StoreError::WriteFailed(msg)
        }
    }
}

/// Whether `e` says the file system has no room left for this user.
pub(crate) fn no_space(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn full_file_systems_and_quotas_are_no_space_and_other_errors_are_write_failures() {
        for (errno, full) in [
            (libc::ENOSPC, true),
            (libc::EDQUOT, true),
            (libc::EIO, false),
            (libc::EFBIG, false),
            (libc::EROFS, false),
        ] {
            let e = StoreError::from_write("segment 7", &std::io::Error::from_raw_os_error(errno));
            match (&e, full) {
                (StoreError::NoSpace(m), true) | (StoreError::WriteFailed(m), false) => {
                    assert!(m.starts_with("segment 7: "), "{m}")
                }
                _ => panic!("errno {errno}: {e:?}"),
            }
        }
        let e = StoreError::from_write("x", &std::io::Error::other("other"));
        assert!(matches!(e, StoreError::WriteFailed(_)), "{e:?}");
    }
}
