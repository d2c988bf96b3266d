//! [`ReadTransaction`]: a read-only transaction, one committed state of a
//! node read as a whole.

use std::ops::Bound;

use melddb::{Bytes, LogPos, Order, Snapshot};

use crate::embedded::DbError;

#[cfg(doc)]
use crate::Database;

/// A read-only transaction ([`Database::begin_read`]): every read sees the
/// same committed state, whatever commits meanwhile, and it never aborts
/// (a committed state is serializable as it is). Holding it keeps that
/// state's tree alive; drop it when done. Cheap to clone and to send to
/// another thread.
#[derive(Debug, Clone)]
pub struct ReadTransaction {
    snapshot: Snapshot,
}

impl ReadTransaction {
    pub(crate) fn new(snapshot: Snapshot) -> ReadTransaction {
        ReadTransaction { snapshot }
    }

    /// Reads one key.
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>, DbError> {
        Ok(self.snapshot.get(key)?)
    }

    /// The pairs between `start` and `end` in `order`, at most `limit`,
    /// one at a time (memory O(tree height) however long the range).
    pub fn range(
        &self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        order: Order,
        limit: Option<usize>,
    ) -> ReadRange {
        ReadRange(self.snapshot.range(start, end, order, limit))
    }

    /// The pairs whose keys start with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> ReadRange {
        let end = prefix_end(prefix);
        let end = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        self.range(Bound::Included(prefix), end, Order::Forward, None)
    }

    /// The state's digest: equal on every node that melded the log up to
    /// [`ReadTransaction::pos`] (see [`melddb::Digest`]). Walks the whole
    /// tree.
    pub fn digest(&self) -> Result<melddb::Digest, DbError> {
        Ok(self.snapshot.digest()?)
    }

    /// [`ReadTransaction::digest`] as 64 lowercase hex digits.
    pub fn digest_hex(&self) -> Result<String, DbError> {
        Ok(self.snapshot.digest_hex()?)
    }

    /// The log position of the last entry in the state read.
    pub fn pos(&self) -> LogPos {
        self.snapshot.pos()
    }

    /// The state read, for the engine's own operations (digest, a
    /// transaction begun on it).
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }
}

/// The pairs of a [`ReadTransaction::range`], in order. A node that cannot
/// be read back from the log (node cache) ends the walk with an error.
#[derive(Debug)]
pub struct ReadRange(melddb::Range);

impl Iterator for ReadRange {
    type Item = Result<(Bytes, Bytes), DbError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|r| r.map_err(DbError::from))
    }
}

/// The first key after every key that starts with `prefix` (`None`: no
/// such key, the prefix is all 0xff).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}
