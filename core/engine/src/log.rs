//! The shared log: the only arbitration point, and the database itself.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::error::{LogError, MAX_INTENTION_BYTES};
use crate::node::LogPos;

/// One log entry's bytes.
pub type Entry = Arc<[u8]>;

/// A totally ordered, append-only log. Positions start at 0 (the genesis
/// record), only grow, and are never reused, even after a trim.
pub trait Log {
    /// Appends an entry and returns its position.
    fn append(&mut self, entry: &[u8]) -> Result<LogPos, LogError>;
    /// Reads the entry at `pos`.
    fn read(&self, pos: LogPos) -> Result<Entry, LogError>;
    /// The next position to be written (one past the last entry).
    fn tail(&self) -> LogPos;
    /// The first position still readable.
    fn first(&self) -> LogPos;
    /// Discards every entry before `pos`; reading them is then an error.
    fn trim(&mut self, pos: LogPos) -> Result<(), LogError>;
}

/// An in-memory log, for tests, browsers and single-process use.
#[derive(Debug, Default, Clone)]
pub struct MemLog {
    first: LogPos,
    entries: VecDeque<Entry>,
}

impl MemLog {
    /// An empty log.
    pub fn new() -> MemLog {
        MemLog::default()
    }
}

impl Log for MemLog {
    fn append(&mut self, entry: &[u8]) -> Result<LogPos, LogError> {
        if entry.len() > MAX_INTENTION_BYTES {
            return Err(LogError::EntryTooLarge {
                len: entry.len(),
                limit: MAX_INTENTION_BYTES,
            });
        }
        self.entries.push_back(entry.into());
        Ok(self.tail() - 1)
    }

    fn read(&self, pos: LogPos) -> Result<Entry, LogError> {
        if pos < self.first {
            return Err(LogError::Trimmed {
                pos,
                first: self.first,
            });
        }
        self.entries
            .get((pos - self.first) as usize)
            .cloned()
            .ok_or(LogError::NotYetWritten {
                pos,
                tail: self.tail(),
            })
    }

    fn tail(&self) -> LogPos {
        self.first + self.entries.len() as LogPos
    }

    fn first(&self) -> LogPos {
        self.first
    }

    fn trim(&mut self, pos: LogPos) -> Result<(), LogError> {
        if pos > self.tail() {
            return Err(LogError::TrimBeyondTail {
                pos,
                tail: self.tail(),
            });
        }
        while self.first < pos {
            self.entries.pop_front();
            self.first += 1;
        }
        Ok(())
    }
}
