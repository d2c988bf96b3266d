//! The embedded database's error type.

use std::path::{Path, PathBuf};

use melddb::{AbortReason, TxnError};

use crate::filelog::FileLogError;

#[cfg(doc)]
use crate::Database;

/// Errors of the embedded database.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The log files could not be read or written.
    #[error(transparent)]
    Log(#[from] FileLogError),
    /// The log's first record is not a valid genesis record.
    #[error("{path}: not a MeldDB database (bad genesis record: {why})")]
    NotADatabase {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// Another open [`Database`] holds the directory (in this process or
    /// another): two would overwrite each other's commits. Nothing was
    /// read or written; close the other one first, or go through it.
    #[error("{}", locked_message(path, *holder))]
    Locked {
        /// The directory.
        path: PathBuf,
        /// The holder's process id, as it wrote it in the lock file.
        holder: Option<u32>,
    },
    /// The options are invalid.
    #[error("invalid option: {0}")]
    Options(String),
    /// The transaction itself failed (key or value too large, ...).
    #[error(transparent)]
    Txn(#[from] TxnError),
    /// [`Database::transact`] kept conflicting.
    #[error("transaction aborted {attempts} times; last: {last}")]
    Conflict {
        /// Attempts made.
        attempts: u32,
        /// Why the last one aborted.
        last: AbortReason,
    },
    /// No state to recover from: every checkpoint still in the log is
    /// damaged and the log before them was trimmed.
    #[error("{path}: cannot recover: {why}")]
    Unrecoverable {
        /// The directory.
        path: PathBuf,
        /// What was tried and failed.
        why: String,
    },
    /// A checkpoint could not be written.
    #[error("checkpoint failed: {0}")]
    Checkpoint(String),
    /// Part of the tree could not be read back from the log (node cache).
    #[error(transparent)]
    Store(#[from] melddb::StoreError),
    /// The log service could not be reached or refused a request (after
    /// the client's retries); see the source for which.
    #[error("log service at {url}: {source}")]
    Service {
        /// The log's address.
        url: String,
        /// What the client saw.
        source: melddb_log::ClientError,
    },
    /// Not a log address: `melddb://host:port/LOG` expected.
    #[error("bad log address {url:?}: {why}")]
    BadUrl {
        /// The address given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// This kind of node does not do that (yet); the message names what.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// The database stopped taking commits (after an I/O error on its log,
    /// or because it was closed); reopen it.
    #[error("the database stopped: {0}")]
    Stopped(String),
}

/// Why [`Database::transact`] returned without committing: the caller's
/// closure failed (`Aborted`, with the closure's own error), or the
/// database did (`Db`: an I/O or service failure, or
/// [`DbError::Conflict`] once the retries ran out).
#[derive(Debug, thiserror::Error)]
pub enum TransactError<E> {
    /// The closure returned this error; nothing was committed.
    #[error("{0}")]
    Aborted(E),
    /// The database failed, or the transaction kept conflicting.
    #[error(transparent)]
    Db(#[from] DbError),
}

/// A closure whose errors are the transaction's own ([`TxnError`]): the
/// database's error type covers both sides, so `?` works in functions
/// that return [`DbError`].
impl From<TransactError<TxnError>> for DbError {
    fn from(e: TransactError<TxnError>) -> DbError {
        match e {
            TransactError::Aborted(e) => DbError::Txn(e),
            TransactError::Db(e) => e,
        }
    }
}

/// The message of [`DbError::Locked`].
fn locked_message(path: &Path, holder: Option<u32>) -> String {
    let who = match holder {
        Some(pid) if pid == std::process::id() => {
            "another Database in this process holds it".to_string()
        }
        Some(pid) => format!("process {pid} holds it"),
        None => "another process holds it".to_string(),
    };
    format!(
        "{}: the database is already open ({who}); close that one first, \
         or make the change through it (one open Database per directory)",
        path.display()
    )
}
