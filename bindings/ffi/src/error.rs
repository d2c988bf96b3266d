//! The one error type foreign code sees: a variant per kind of failure,
//! each with the message the node gives (which says what to do).

use melddb_runtime::{DbError, TransactError};

/// Why a call failed. Swift sees an `Error` enum, Kotlin an exception
/// class per variant.
#[derive(Debug, Clone, thiserror::Error, uniffi::Error)]
pub enum MeldError {
    /// The transaction aborted after its retries: another transaction
    /// committed first and conflicts with it. `reason` is the abort's code
    /// (`WriteWrite`, `ReadWrite`, `Phantom`, `SnapshotTooOld`,
    /// `SnapshotUnavailable`, `Malformed`), `key` the key it names.
    #[error("{message}")]
    Aborted {
        /// The abort reason's code.
        reason: String,
        /// The conflicting key, where the reason names one.
        key: Option<Vec<u8>>,
        /// What happened.
        message: String,
    },
    /// An argument was rejected (a key or value too long, a bad option or
    /// URL); nothing changed.
    #[error("{message}")]
    Argument {
        /// What was wrong.
        message: String,
    },
    /// The node's directory or its log failed (locked by another opener,
    /// unreadable, out of space, a node that cannot be read back).
    #[error("{message}")]
    Storage {
        /// What failed.
        message: String,
    },
    /// The log service could not be reached or refused the request.
    #[error("{message}")]
    Connection {
        /// What failed.
        message: String,
    },
    /// The log cannot be followed (trimmed past this node, unrecoverable),
    /// or a commit's outcome is unknown.
    #[error("{message}")]
    Log {
        /// What happened.
        message: String,
    },
    /// The database, transaction or iterator is closed or finished, or the
    /// node stopped.
    #[error("{message}")]
    State {
        /// What is closed.
        message: String,
    },
    /// The caller's transaction body threw; nothing was committed.
    #[error("{message}")]
    Callback {
        /// The foreign error's description.
        message: String,
    },
    /// A bug in MeldDB; report it.
    #[error("{message}")]
    Internal {
        /// What went wrong.
        message: String,
    },
}

impl MeldError {
    pub(crate) fn closed(what: &str) -> MeldError {
        MeldError::State {
            message: format!("the {what} is closed"),
        }
    }
}

impl From<DbError> for MeldError {
    fn from(e: DbError) -> MeldError {
        let message = e.to_string();
        match e {
            DbError::Conflict { last, .. } => MeldError::Aborted {
                reason: last.code().to_owned(),
                key: last.key().map(<[u8]>::to_vec),
                message,
            },
            DbError::Txn(melddb::TxnError::Store(_)) | DbError::Store(_) => {
                MeldError::Storage { message }
            }
            DbError::Txn(_) | DbError::OptionOutOfRange { .. } | DbError::BadUrl { .. } => {
                MeldError::Argument { message }
            }
            DbError::Service { .. } | DbError::TimedOut { .. } => MeldError::Connection { message },
            DbError::TrimmedBehind { .. }
            | DbError::OutcomeUnknown { .. }
            | DbError::Unrecoverable { .. } => MeldError::Log { message },
            DbError::Closed | DbError::Stopped { .. } => MeldError::State { message },
            DbError::Internal(_) | DbError::Thread { .. } => MeldError::Internal { message },
            _ => MeldError::Storage { message },
        }
    }
}

impl From<melddb::TxnError> for MeldError {
    fn from(e: melddb::TxnError) -> MeldError {
        DbError::Txn(e).into()
    }
}

impl From<TransactError<MeldError>> for MeldError {
    fn from(e: TransactError<MeldError>) -> MeldError {
        match e {
            TransactError::Db(e) => e.into(),
            TransactError::Aborted(e) => e,
        }
    }
}

impl From<uniffi::UnexpectedUniFFICallbackError> for MeldError {
    fn from(e: uniffi::UnexpectedUniFFICallbackError) -> MeldError {
        MeldError::Callback { message: e.reason }
    }
}
