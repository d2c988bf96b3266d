//! The node's error type: one enum for every operation of
//! [`Database`], whose variants carry what went wrong as data (positions,
//! paths, option names, the underlying typed errors), so a caller or a
//! language binding can match on them; the messages say what to do.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use melddb::{AbortReason, CheckpointError, DecodeError, LogPos, OpenError, TxnError};

use crate::filelog::FileLogError;

#[cfg(doc)]
use crate::Database;

/// Errors of a MeldDB node ([`Database`]). Cheap to clone: an error that
/// stops the node is handed to every later call
/// ([`DbError::Stopped`]).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// The log files could not be read or written.
    #[error(transparent)]
    Log(Arc<FileLogError>),
    /// The log's first record is not a valid genesis record.
    #[error("{path}: not a MeldDB database (bad genesis record: {source})")]
    NotADatabase {
        /// The directory, or the log's address on the service.
        path: PathBuf,
        /// What is wrong with the record.
        source: DecodeError,
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
    /// An option is outside the values it takes.
    #[error("option {option} is {value}; it must be between {min} and {max}")]
    OptionOutOfRange {
        /// The option's field name in `DbOptions`.
        option: &'static str,
        /// The value given.
        value: u64,
        /// The smallest value it takes.
        min: u64,
        /// The largest value it takes.
        max: u64,
    },
    /// The settings for a new database (`DbOptions::settings`) are invalid.
    #[error("invalid database settings: {0}")]
    Settings(#[source] OpenError),
    /// The transaction itself failed (key or value too large, a read of
    /// the tree back from the log failed, ...).
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
    /// No state to recover from.
    #[error("{path}: cannot recover: {cause}")]
    Unrecoverable {
        /// The directory.
        path: PathBuf,
        /// What was tried and failed.
        cause: Unrecoverable,
    },
    /// A checkpoint could not be written or published; the node goes on.
    #[error("checkpoint failed: {0}")]
    Checkpoint(CheckpointFailure),
    /// Part of the tree could not be read back from the log (node cache).
    #[error(transparent)]
    Store(#[from] melddb::StoreError),
    /// The log service could not be reached or refused a request (after
    /// the client's retries).
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
        why: &'static str,
    },
    /// This kind of node does not do that (yet).
    #[error("not supported: {0}")]
    Unsupported(Unsupported),
    /// A thread of the node could not be started (the process is out of
    /// threads or memory).
    #[error("cannot start the node's {thread} thread: {source}")]
    Thread {
        /// Which thread.
        thread: &'static str,
        /// What the operating system said.
        source: Arc<std::io::Error>,
    },
    /// The database was closed (by [`Database::close`] or drop).
    #[error("the database is closed")]
    Closed,
    /// The database stopped taking commits because of `cause` (an I/O
    /// error on its log, a node that could not be read back, a service
    /// that refuses it); reopen it.
    #[error("the database stopped: {cause}; reopen it")]
    Stopped {
        /// What stopped it.
        cause: Box<DbError>,
    },
    /// The shared log was trimmed past this node's position while it was
    /// away: the entries it needs next are gone. Connect again: a node
    /// joins from the latest published checkpoint.
    #[error(
        "log {log} was trimmed to position {first}, past this node's position {next}; \
         connect again to join from the latest published checkpoint"
    )]
    TrimmedBehind {
        /// The log's name.
        log: String,
        /// The log's first position now.
        first: LogPos,
        /// The position this node needed next.
        next: LogPos,
    },
    /// The commit was appended at `pos`, but this node never melded that
    /// entry: the log was trimmed past it while the node was away, and
    /// the node went on from a published checkpoint. Read the state to
    /// learn whether the transaction's writes are in.
    #[error(
        "the outcome of the commit at log position {pos} is unknown: this node rejoined \
         from a checkpoint past it; read the state to see whether it committed"
    )]
    OutcomeUnknown {
        /// The commit's log position.
        pos: LogPos,
    },
    /// On the log service: no outcome within `Options::commit_timeout`
    /// (the service unreachable, or the node unable to follow the log).
    /// The commit may still land and commit (`pos: None`: its append was
    /// not acknowledged; `Some`: it is in the log, not melded here yet):
    /// read the state after [`crate::Database::sync_with_log`] succeeds
    /// to see; retrying blindly may apply it twice.
    #[error(
        "no outcome for the commit{} within {seconds} s (log service unreachable?); it may \
         still commit: read the state once sync_with_log succeeds",
        pos.map(|p| format!(" at log position {p}")).unwrap_or_default()
    )]
    TimedOut {
        /// The commit's log position, if its append was acknowledged.
        pos: Option<LogPos>,
        /// The timeout, in seconds.
        seconds: f64,
    },
    /// A bug in MeldDB: an invariant did not hold. The node stops; reopen
    /// it, and report the message.
    #[error("internal error (a bug; please report it): {0}")]
    Internal(&'static str),
}

impl From<FileLogError> for DbError {
    fn from(e: FileLogError) -> DbError {
        DbError::Log(Arc::new(e))
    }
}

impl DbError {
    /// The error a call gets from a node that stopped because of `self`.
    pub(crate) fn stopping(self) -> DbError {
        match self {
            e @ (DbError::Stopped { .. } | DbError::Closed) => e,
            cause => DbError::Stopped {
                cause: Box::new(cause),
            },
        }
    }

    /// [`DbError::Thread`] for a thread that could not be spawned.
    pub(crate) fn thread(thread: &'static str, source: std::io::Error) -> DbError {
        DbError::Thread {
            thread,
            source: Arc::new(source),
        }
    }
}

/// Why a node has no state to start from ([`DbError::Unrecoverable`]).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Unrecoverable {
    /// The log was trimmed (it starts at `first`) and no checkpoint that
    /// could replace the entries before it loads.
    #[error(
        "the log starts at {first} (older entries were trimmed) and no checkpoint of it loads{}",
        tried_list(tried)
    )]
    NoCheckpoint {
        /// The log's first position.
        first: LogPos,
        /// Each checkpoint tried and why it did not load, oldest last.
        tried: Vec<String>,
    },
    /// Replaying the log after the checkpoint could not read a node back.
    #[error("replaying the log after the checkpoint: {0}")]
    Replay(melddb::StoreError),
}

fn tried_list(tried: &[String]) -> String {
    if tried.is_empty() {
        "; none was written".to_string()
    } else {
        format!(": {}", tried.join("; "))
    }
}

/// Why a checkpoint was not written ([`DbError::Checkpoint`]).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointFailure {
    /// Encoding the state failed (a node could not be read back).
    #[error("encoding the state at {begin}: {source}")]
    Encode {
        /// The checkpoint's begin record.
        begin: LogPos,
        /// What the encoder said.
        source: CheckpointError,
    },
    /// Another node's begin record ended this checkpoint first (on a
    /// shared log every node's checkpoint is every node's); the newer one
    /// stands for it.
    #[error("a later begin record superseded the one at {begin}")]
    Superseded {
        /// This checkpoint's begin record.
        begin: LogPos,
    },
    /// Appending a record of the checkpoint to the service failed.
    #[error("appending to {log}: {source}")]
    Append {
        /// The log (or its companion log of checkpoint pointers).
        log: String,
        /// What the client saw.
        source: melddb_log::ClientError,
    },
    /// Trimming the log (or its companion log) after the checkpoint
    /// failed; the checkpoint itself is complete.
    #[error("trimming {log} below {below}: {source}")]
    Trim {
        /// The log trimmed.
        log: String,
        /// The position it was to start at.
        below: LogPos,
        /// What the client saw.
        source: melddb_log::ClientError,
    },
    /// No checkpoint was published within the wait; one may still be.
    #[error("no checkpoint was published within {seconds} s; try again")]
    TimedOut {
        /// How long the call waited.
        seconds: u64,
    },
    /// The node closed while the checkpoint was being written.
    #[error("the node closed")]
    Closed,
}

/// What a node does not do ([`DbError::Unsupported`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unsupported {
    /// [`Database::checkpoint`] on a node on the log service that does
    /// not publish checkpoints (`DbOptions::publish_checkpoints`).
    #[error("checkpoints from a node on the log service without publish_checkpoints")]
    CheckpointWithoutPublishing,
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
