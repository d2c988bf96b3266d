//! Transactions, read-only transactions and their range iterators for
//! foreign code. A range is read in chunks (each continues after the last
//! key of the one before), so no Rust iterator borrows a transaction
//! across calls.

use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use melddb::{Order, Transaction as CoreTxn};
use melddb_runtime::{prefix_end, ReadTransaction as CoreRead};

use crate::error::MeldError;

/// One key and its value.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
}

/// Pairs a range fetches at first; each next chunk doubles, up to
/// `MAX_CHUNK`, so that a serializable range stopped early guards little
/// more than it read.
const FIRST_CHUNK: usize = 16;
const MAX_CHUNK: usize = 256;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A read-write transaction on a snapshot of its node. Finish it with the
/// database's `commit`, or drop it to abandon it.
#[derive(uniffi::Object)]
pub struct Transaction {
    tx: Mutex<Option<CoreTxn>>,
}

impl Transaction {
    pub(crate) fn new(tx: CoreTxn) -> Arc<Transaction> {
        Arc::new(Transaction {
            tx: Mutex::new(Some(tx)),
        })
    }

    /// Takes the transaction out to commit it.
    pub(crate) fn take(&self) -> Result<CoreTxn, MeldError> {
        lock(&self.tx)
            .take()
            .ok_or_else(|| MeldError::closed("transaction"))
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut CoreTxn) -> Result<T, MeldError>,
    ) -> Result<T, MeldError> {
        match lock(&self.tx).as_mut() {
            Some(tx) => f(tx),
            None => Err(MeldError::closed("transaction")),
        }
    }
}

#[uniffi::export]
impl Transaction {
    /// The value of `key` as this transaction sees it (its own writes
    /// included).
    pub fn get(&self, key: Vec<u8>) -> Result<Option<Vec<u8>>, MeldError> {
        self.with(|tx| Ok(tx.get(&key)?.map(|v| v.to_vec())))
    }

    /// Stores `value` under `key`.
    pub fn put(&self, key: Vec<u8>, value: Vec<u8>) -> Result<(), MeldError> {
        self.with(|tx| Ok(tx.put(&key, &value)?))
    }

    /// Deletes `key`; whether it was present.
    pub fn delete(&self, key: Vec<u8>) -> Result<bool, MeldError> {
        self.with(|tx| Ok(tx.delete(&key)?))
    }

    /// The keys from `start` (inclusive; `None`: the first) to `end`
    /// (exclusive; `None`: past the last), descending with `reverse`, at
    /// most `limit`, seeing this transaction's writes, fetched lazily.
    pub fn range(
        self: Arc<Self>,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        reverse: bool,
        limit: Option<u64>,
    ) -> Arc<RangeIterator> {
        RangeIterator::new(Source::Txn(self), start, end, reverse, limit)
    }

    /// The keys that start with `prefix`, in order.
    pub fn prefix(self: Arc<Self>, prefix: Vec<u8>) -> Arc<RangeIterator> {
        let end = prefix_end(&prefix);
        RangeIterator::new(Source::Txn(self), Some(prefix), end, false, None)
    }
}

/// A read-only transaction: every read sees one committed state, whatever
/// commits meanwhile; it needs no commit and never aborts.
#[derive(uniffi::Object)]
pub struct ReadTransaction {
    read: CoreRead,
}

impl ReadTransaction {
    pub(crate) fn new(read: CoreRead) -> Arc<ReadTransaction> {
        Arc::new(ReadTransaction { read })
    }
}

#[uniffi::export]
impl ReadTransaction {
    /// The value of `key` in this state.
    pub fn get(&self, key: Vec<u8>) -> Result<Option<Vec<u8>>, MeldError> {
        check_key(&key)?;
        Ok(self.read.get(&key)?.map(|v| v.to_vec()))
    }

    /// The keys from `start` (inclusive) to `end` (exclusive), as
    /// [`Transaction::range`] gives them.
    pub fn range(
        self: Arc<Self>,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        reverse: bool,
        limit: Option<u64>,
    ) -> Arc<RangeIterator> {
        RangeIterator::new(Source::Read(self), start, end, reverse, limit)
    }

    /// The keys that start with `prefix`, in order.
    pub fn prefix(self: Arc<Self>, prefix: Vec<u8>) -> Arc<RangeIterator> {
        let end = prefix_end(&prefix);
        RangeIterator::new(Source::Read(self), Some(prefix), end, false, None)
    }

    /// The log position of this state.
    pub fn position(&self) -> u64 {
        self.read.pos()
    }

    /// The state's digest in hex: equal on every node at this position.
    pub fn digest(&self) -> Result<String, MeldError> {
        Ok(self.read.digest_hex()?)
    }
}

/// Refuses a key (or range bound) longer than the core takes, as an
/// argument error rather than a missing key.
pub(crate) fn check_key(key: &[u8]) -> Result<(), MeldError> {
    if key.len() > melddb::error::MAX_KEY_LEN {
        return Err(melddb::TxnError::KeyTooLong { len: key.len() }.into());
    }
    Ok(())
}

enum Source {
    Txn(Arc<Transaction>),
    Read(Arc<ReadTransaction>),
}

struct Cursor {
    start: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
    left: u64,
    chunk: usize,
    buffer: std::vec::IntoIter<KeyValue>,
    done: bool,
}

/// The pairs of a range, fetched in chunks as `next` asks for them.
#[derive(uniffi::Object)]
pub struct RangeIterator {
    source: Source,
    reverse: bool,
    cursor: Mutex<Cursor>,
}

impl RangeIterator {
    fn new(
        source: Source,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
        reverse: bool,
        limit: Option<u64>,
    ) -> Arc<RangeIterator> {
        let left = limit.unwrap_or(u64::MAX);
        Arc::new(RangeIterator {
            source,
            reverse,
            cursor: Mutex::new(Cursor {
                start: start.map_or(Bound::Unbounded, Bound::Included),
                end: end.map_or(Bound::Unbounded, Bound::Excluded),
                left,
                chunk: FIRST_CHUNK,
                buffer: Vec::new().into_iter(),
                done: left == 0,
            }),
        })
    }

    fn fill(&self, c: &mut Cursor) -> Result<(), MeldError> {
        let want = (c.chunk as u64).min(c.left) as usize;
        c.chunk = (c.chunk * 2).min(MAX_CHUNK);
        for b in [&c.start, &c.end] {
            if let Bound::Included(k) | Bound::Excluded(k) = b {
                check_key(k)?;
            }
        }
        let (start, end) = (as_ref(&c.start), as_ref(&c.end));
        let order = if self.reverse {
            Order::Reverse
        } else {
            Order::Forward
        };
        let pairs: Vec<KeyValue> = match &self.source {
            Source::Txn(t) => t.with(|tx| {
                tx.range(start, end, order, Some(want))
                    .map(|r| r.map(pair).map_err(MeldError::from))
                    .collect()
            })?,
            Source::Read(r) => r
                .read
                .range(start, end, order, Some(want))
                .map(|r| r.map(pair).map_err(MeldError::from))
                .collect::<Result<_, _>>()?,
        };
        c.left -= pairs.len() as u64;
        match pairs.last() {
            Some(last) if pairs.len() == want && c.left > 0 => {
                if self.reverse {
                    c.end = Bound::Excluded(last.key.clone());
                } else {
                    c.start = Bound::Excluded(last.key.clone());
                }
            }
            _ => c.done = true,
        }
        c.buffer = pairs.into_iter();
        Ok(())
    }
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k),
        Bound::Excluded(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn pair((k, v): (melddb::Bytes, melddb::Bytes)) -> KeyValue {
    KeyValue {
        key: k.to_vec(),
        value: v.to_vec(),
    }
}

#[uniffi::export]
impl RangeIterator {
    /// The next pair, or `None` at the end of the range.
    pub fn next(&self) -> Result<Option<KeyValue>, MeldError> {
        let mut c = lock(&self.cursor);
        if let Some(kv) = c.buffer.next() {
            return Ok(Some(kv));
        }
        if c.done {
            return Ok(None);
        }
        self.fill(&mut c)?;
        Ok(c.buffer.next())
    }
}
