//! The node: opening a directory or joining a service log, transactions,
//! commits (blocking, and async for Swift's `async` and Kotlin's
//! `suspend`), `transact` with retries around a foreign body, reads.

use std::sync::{Arc, PoisonError, RwLock};

use melddb::{Isolation as CoreIsolation, Outcome};
use melddb_runtime::{Database as CoreDb, DbOptions, RetryPolicy};

use crate::error::MeldError;
use crate::feed::{ChangeListener, WatchHandle};
use crate::txn::{check_key, ReadTransaction, Transaction};

/// Isolation of a read-write transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum Isolation {
    /// Reads, writes and scanned ranges are checked: as if one at a time.
    Serializable,
    /// Reads and writes are checked, ranges are not (phantoms may occur).
    RepeatableRead,
    /// Only writes are checked (write skew may occur).
    Snapshot,
}

impl From<Isolation> for CoreIsolation {
    fn from(i: Isolation) -> CoreIsolation {
        match i {
            Isolation::Serializable => CoreIsolation::Serializable,
            Isolation::RepeatableRead => CoreIsolation::RepeatableRead,
            Isolation::Snapshot => CoreIsolation::SnapshotIsolation,
        }
    }
}

/// How a commit ended.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Enum)]
pub enum CommitOutcome {
    /// Committed at log position `position`, with commit sequence number `csn`.
    Committed {
        /// The intention's log position.
        position: u64,
        /// The resulting state's commit sequence number.
        csn: u64,
    },
    /// It wrote nothing: nothing was logged.
    ReadOnly,
    /// Meld aborted it: another transaction committed first and conflicts.
    Aborted {
        /// The abort reason's code (see [`MeldError::Aborted`]).
        reason: String,
        /// The conflicting key, where the reason names one.
        key: Option<Vec<u8>>,
        /// What happened.
        detail: String,
    },
}

impl From<Outcome> for CommitOutcome {
    fn from(o: Outcome) -> CommitOutcome {
        match o {
            Outcome::Committed { pos, csn } => CommitOutcome::Committed { position: pos, csn },
            Outcome::ReadOnly => CommitOutcome::ReadOnly,
            Outcome::Aborted { reason, .. } | Outcome::Rejected { reason } => {
                CommitOutcome::Aborted {
                    reason: reason.code().to_owned(),
                    key: reason.key().map(<[u8]>::to_vec),
                    detail: reason.to_string(),
                }
            }
        }
    }
}

/// The body of [`Database::transact`], written in Swift or Kotlin: it reads
/// and writes through `tx`; throwing ends the transaction, nothing
/// committed. It may run more than once (once per attempt).
#[uniffi::export(with_foreign)]
pub trait TransactionBody: Send + Sync {
    /// Runs one attempt of the transaction.
    fn run(&self, tx: Arc<Transaction>) -> Result<(), MeldError>;
}

/// A MeldDB node: on a durable log of its own in a directory, or on a log
/// of the log service shared with other nodes.
#[derive(uniffi::Object)]
pub struct Database {
    /// The node; calls take a clone and release the lock before they
    /// block, so a waiting commit never holds up `shutdown` or other calls.
    db: RwLock<Option<Arc<CoreDb>>>,
}

/// Runs `f` on a thread of its own and resolves with its result, so that
/// a foreign `async` caller never blocks its executor. Dropping the future
/// leaves the call to finish on its thread; its result is then dropped.
async fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MeldError> + Send + 'static,
) -> Result<T, MeldError> {
    let (send, recv) = futures_channel::oneshot::channel();
    std::thread::Builder::new()
        .name("melddb-ffi-call".into())
        .spawn(move || {
            let _ = send.send(f());
        })
        .map_err(|e| MeldError::Internal {
            detail: format!("could not start a thread for the call: {e}"),
        })?;
    recv.await.map_err(|_| MeldError::Internal {
        detail: "the call's thread ended without an answer".into(),
    })?
}

impl Database {
    fn with<T>(&self, f: impl FnOnce(&CoreDb) -> Result<T, MeldError>) -> Result<T, MeldError> {
        let db = self
            .db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| MeldError::closed("database"))?;
        f(&db)
    }
}

#[uniffi::export]
impl Database {
    /// Opens (or creates) the database in directory `dir`, locked while it
    /// is open.
    #[uniffi::constructor]
    pub fn open(dir: String) -> Result<Arc<Database>, MeldError> {
        Ok(Arc::new(Database {
            db: RwLock::new(Some(Arc::new(CoreDb::open(dir)?))),
        }))
    }

    /// Joins the log at `url` (`melddb://HOST:PORT/LOG`) of the log
    /// service, with `dir` as this node's own directory and `token` for a
    /// service with tokens. Returns once the node has melded the log up to
    /// the tail it found.
    #[uniffi::constructor]
    pub fn connect(
        url: String,
        dir: String,
        token: Option<String>,
    ) -> Result<Arc<Database>, MeldError> {
        let opts = DbOptions {
            token,
            ..DbOptions::default()
        };
        Ok(Arc::new(Database {
            db: RwLock::new(Some(Arc::new(CoreDb::connect(&url, dir, opts)?))),
        }))
    }

    /// Reads `key` in the latest committed state this node has.
    pub fn get(&self, key: Vec<u8>) -> Result<Option<Vec<u8>>, MeldError> {
        check_key(&key)?;
        self.with(|db| Ok(db.get(&key)?.map(|v| v.to_vec())))
    }

    /// Begins a read-write transaction on the latest committed state.
    pub fn begin(&self, isolation: Isolation) -> Result<Arc<Transaction>, MeldError> {
        self.with(|db| Ok(Transaction::new(db.begin(isolation.into()))))
    }

    /// Begins a read-only transaction on the latest committed state this
    /// node has.
    pub fn begin_read(&self) -> Result<Arc<ReadTransaction>, MeldError> {
        self.with(|db| Ok(ReadTransaction::new(db.begin_read())))
    }

    /// Begins a read-only transaction that sees every commit answered
    /// anywhere before the call (on the log service it waits until this
    /// node has melded the log's tail).
    pub async fn begin_read_latest(self: Arc<Self>) -> Result<Arc<ReadTransaction>, MeldError> {
        off_thread(move || self.with(|db| Ok(ReadTransaction::new(db.begin_read_latest()?)))).await
    }

    /// Commits `tx` and waits for its outcome (blocking the caller).
    pub fn commit_blocking(&self, tx: Arc<Transaction>) -> Result<CommitOutcome, MeldError> {
        let tx = tx.take()?;
        self.with(|db| Ok(db.commit(tx)?.into()))
    }

    /// Commits `tx`; resolves with its outcome.
    pub async fn commit(self: Arc<Self>, tx: Arc<Transaction>) -> Result<CommitOutcome, MeldError> {
        off_thread(move || self.commit_blocking(tx)).await
    }

    /// Runs `body` in a transaction and commits it, running it again on a
    /// newer state when meld aborts it (up to 16 attempts, pausing 50 µs
    /// doubling to 10 ms between them, as the node's default policy), blocking
    /// the caller. An error from `body` ends it, nothing committed; running
    /// out of retries is [`MeldError::Aborted`].
    pub fn transact_blocking(
        &self,
        isolation: Isolation,
        body: Arc<dyn TransactionBody>,
    ) -> Result<CommitOutcome, MeldError> {
        let policy = RetryPolicy::default();
        let attempts = policy.max_attempts.max(1);
        let mut pause = policy.first_backoff;
        for attempt in 1..=attempts {
            let tx = self.begin(isolation)?;
            if let Err(e) = body.run(tx.clone()) {
                // The foreign side may keep `tx`: drop its snapshot now.
                let _ = tx.take();
                return Err(e);
            }
            match self.commit_blocking(tx)? {
                CommitOutcome::Aborted {
                    reason,
                    key,
                    detail,
                } => {
                    if attempt == attempts {
                        return Err(MeldError::Aborted {
                            reason,
                            key,
                            detail: format!("{detail} (after {attempts} attempts)"),
                        });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(policy.max_backoff);
                }
                done => return Ok(done),
            }
        }
        Err(MeldError::Internal {
            detail: "transact ran no attempt".into(),
        })
    }

    /// Runs `body` in a transaction as [`Database::transact_blocking`]
    /// does; resolves with the outcome.
    pub async fn transact(
        self: Arc<Self>,
        isolation: Isolation,
        body: Arc<dyn TransactionBody>,
    ) -> Result<CommitOutcome, MeldError> {
        off_thread(move || self.transact_blocking(isolation, body)).await
    }

    /// Waits until this node has every commit answered anywhere before the
    /// call.
    pub async fn sync_with_log(self: Arc<Self>) -> Result<(), MeldError> {
        off_thread(move || self.with(|db| Ok(db.sync_with_log()?))).await
    }

    /// Calls `listener` with the changes under `prefix` of every
    /// transaction committed from now on, in log order, from a thread of
    /// its own. Dropping (or closing) the returned handle stops it.
    pub fn watch(
        &self,
        prefix: Vec<u8>,
        listener: Arc<dyn ChangeListener>,
    ) -> Result<Arc<WatchHandle>, MeldError> {
        self.with(|db| WatchHandle::start(db.watch_prefix(&prefix), listener))
    }

    /// Flushes and closes the node, reporting what failed; later calls
    /// fail with [`MeldError::State`]. Objects still open keep their own
    /// state. (Releasing the object, Kotlin's `close()` or Swift's last
    /// reference, also closes the node, without an error to report.)
    pub fn shutdown(&self) -> Result<(), MeldError> {
        let db = self
            .db
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match db.map(Arc::try_unwrap) {
            Some(Ok(db)) => Ok(db.close()?),
            // A call still under way holds the node: it closes when that
            // call ends (dropping the node flushes it).
            Some(Err(_)) | None => Ok(()),
        }
    }
}
