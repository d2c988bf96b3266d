//! A small synchronous database: transactions append to a [`Log`] and the
//! log is melded at once. The building block for hosts and for tests.

use crate::engine::{Melder, Outcome};
use crate::error::{CommitError, LogError, OpenError};
use crate::genesis::Settings;
use crate::isolation::Isolation;
use crate::log::{Log, MemLog};
use crate::node::{Bytes, LogPos, StoreError};
use crate::snapshot::Snapshot;
use crate::txn::{Finished, Transaction};

/// A database node on a log, melding every entry as soon as it is appended.
#[derive(Debug)]
pub struct Database<L: Log = MemLog> {
    log: L,
    melder: Melder,
}

impl Database<MemLog> {
    /// A new database on a fresh in-memory log.
    pub fn create(settings: Settings) -> Result<Database<MemLog>, OpenError> {
        Database::create_on(MemLog::new(), settings)
    }
}

impl<L: Log> Database<L> {
    /// Writes the genesis record to an empty `log` and opens it.
    pub fn create_on(mut log: L, settings: Settings) -> Result<Database<L>, OpenError> {
        settings.validate()?;
        if log.tail() != 0 {
            return Err(OpenError::Setting {
                name: "log",
                why: "must be empty to create a database; use Database::open",
            });
        }
        log.append(&settings.encode())?;
        Database::open(log)
    }

    /// Opens a database from its log: reads the genesis record at position
    /// 0 and melds every entry after it.
    pub fn open(log: L) -> Result<Database<L>, OpenError> {
        let genesis = log.read(0)?;
        let melder = Melder::from_genesis(&genesis).map_err(OpenError::Genesis)?;
        let mut db = Database { log, melder };
        db.catch_up()?;
        Ok(db)
    }

    /// The latest committed state.
    pub fn snapshot(&self) -> Snapshot {
        self.melder.lcs().clone()
    }

    /// Begins a transaction on the latest committed state.
    pub fn begin(&self, isolation: Isolation) -> Transaction {
        Transaction::begin(self.melder.lcs(), isolation)
    }

    /// Reads one key of the latest committed state (fails only when part
    /// of the tree could not be read back from a node store).
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        self.melder.lcs().get(key)
    }

    /// Finishes `tx`, appends its intention and melds the log up to it.
    pub fn commit(&mut self, tx: Transaction) -> Result<Outcome, CommitError> {
        if tx.snapshot().db_id() != self.melder.settings().db_id {
            return Err(CommitError::ForeignSnapshot);
        }
        match tx.finish()? {
            Finished::ReadOnly => Ok(Outcome::ReadOnly),
            Finished::Intention(bytes) => self.append_raw(&bytes),
        }
    }

    /// Appends raw bytes (for example an intention made elsewhere), melds
    /// the log up to them and returns their outcome.
    ///
    /// With group meld on, an entry that lands first in a pair is decided
    /// together with the next one; if no other writer supplies it, an empty
    /// filler entry is appended (every node rejects it as malformed).
    pub fn append_raw(&mut self, bytes: &[u8]) -> Result<Outcome, CommitError> {
        let pos = self.log.append(bytes)?;
        let mut outcomes = self.catch_up()?;
        if self.melder.next_pos() == pos + 1 && self.melder.lcs().pos < pos {
            self.log.append(&[])?;
            outcomes.extend(self.catch_up()?);
        }
        outcomes
            .into_iter()
            .find(|o| o.pos() == Some(pos))
            .ok_or(CommitError::Log(LogError::Backend(format!(
                "entry {pos} was appended but not melded"
            ))))
    }

    /// Melds every log entry not melded yet and returns their outcomes.
    pub fn catch_up(&mut self) -> Result<Vec<Outcome>, LogError> {
        let mut out = Vec::new();
        while self.melder.next_pos() < self.log.tail() {
            let entry = self.log.read(self.melder.next_pos())?;
            out.extend(self.melder.apply(&entry));
        }
        Ok(out)
    }

    /// Position of the last melded entry.
    pub fn last_pos(&self) -> LogPos {
        self.melder.lcs().pos
    }

    /// The melder (for statistics and retained states).
    pub fn melder(&self) -> &Melder {
        &self.melder
    }

    /// The log.
    pub fn log(&self) -> &L {
        &self.log
    }
}
