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
    #[error("{detail}")]
    Aborted {
        /// The abort reason's code.
        reason: String,
        /// The conflicting key, where the reason names one.
        key: Option<Vec<u8>>,
        /// What happened.
        detail: String,
    },
    /// An argument was rejected (a key or value too long, a bad option or
    /// URL); nothing changed.
    #[error("{detail}")]
    Argument {
        /// What was wrong.
        detail: String,
    },
    /// The node's directory or its log failed (locked by another opener,
    /// unreadable, out of space, a node that cannot be read back).
    #[error("{detail}")]
    Storage {
        /// What failed.
        detail: String,
    },
    /// The log service could not be reached or refused the request.
    #[error("{detail}")]
    Connection {
        /// What failed.
        detail: String,
    },
    /// The log cannot be followed (trimmed past this node, unrecoverable),
    /// or a commit's outcome is unknown.
    #[error("{detail}")]
    Log {
        /// What happened.
        detail: String,
    },
    /// The database, transaction or iterator is closed or finished, or the
    /// node stopped.
    #[error("{detail}")]
    State {
        /// What is closed.
        detail: String,
    },
    /// The caller's transaction body threw; nothing was committed.
    #[error("{detail}")]
    Callback {
        /// The foreign error's description.
        detail: String,
    },
    /// A bug in MeldDB; report it.
    #[error("{detail}")]
    Internal {
        /// What went wrong.
        detail: String,
    },
}

impl MeldError {
    pub(crate) fn closed(what: &str) -> MeldError {
        MeldError::State {
            detail: format!("the {what} is closed"),
        }
    }
}

impl From<DbError> for MeldError {
    fn from(e: DbError) -> MeldError {
        let detail = e.to_string();
        match e {
            DbError::Conflict { last, .. } => MeldError::Aborted {
                reason: last.code().to_owned(),
                key: last.key().map(<[u8]>::to_vec),
                detail,
            },
            DbError::Txn(melddb::TxnError::Store(_)) | DbError::Store(_) => {
                MeldError::Storage { detail }
            }
            DbError::Txn(_) | DbError::OptionOutOfRange { .. } | DbError::BadUrl { .. } => {
                MeldError::Argument { detail }
            }
            DbError::Service { .. } => MeldError::Connection { detail },
            DbError::TimedOut { .. }
            | DbError::TrimmedBehind { .. }
            | DbError::OutcomeUnknown { .. }
            | DbError::Unrecoverable { .. } => MeldError::Log { detail },
            DbError::Closed | DbError::Stopped { .. } => MeldError::State { detail },
            DbError::Internal(_) | DbError::Thread { .. } => MeldError::Internal { detail },
            _ => MeldError::Storage { detail },
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
        MeldError::Callback { detail: e.reason }
    }
}
