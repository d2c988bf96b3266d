//! Transactions and snapshots for JavaScript. Ranges come back in chunks
//! (the TypeScript iterator asks for the next chunk after the last key it
//! got), so no Rust iterator lives across calls.

use std::ops::Bound;

use melddb::{Bytes, Finished, Order, Snapshot, Transaction, TxnError};
use wasm_bindgen::prelude::*;

use crate::errors::{finished, js_error, store_error, txn_error};

/// A bound as the TypeScript layer passes it: 0 open, 1 inclusive,
/// 2 exclusive.
fn bound(kind: u8, key: &[u8]) -> Result<Bound<&[u8]>, JsValue> {
    if kind != 0 && key.len() > melddb::error::MAX_KEY_LEN {
        return Err(txn_error(TxnError::KeyTooLong { len: key.len() }));
    }
    match kind {
        0 => Ok(Bound::Unbounded),
        1 => Ok(Bound::Included(key)),
        2 => Ok(Bound::Excluded(key)),
        _ => Err(js_error(
            "MeldArgumentError",
            "Bound",
            format!("bound kind {kind} is not 0 (open), 1 (inclusive) or 2 (exclusive)"),
        )),
    }
}

/// The pairs of a walk as one chunk: per pair a u32 little-endian key
/// length, the key, a u32 value length, the value (`src/bytes.ts`,
/// `decodePairs`, reads it back).
fn chunk<E>(
    items: impl Iterator<Item = Result<(Bytes, Bytes), E>>,
    err: fn(E) -> JsValue,
) -> Result<Vec<u8>, JsValue> {
    let mut out = Vec::new();
    for item in items {
        let (k, v) = item.map_err(err)?;
        // Keys and values are bounded far below 4 GiB by the core's limits.
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&k);
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(&v);
    }
    Ok(out)
}

fn order(reverse: bool) -> Order {
    if reverse {
        Order::Reverse
    } else {
        Order::Forward
    }
}

/// A read-write transaction on a snapshot of its node.
#[wasm_bindgen]
pub struct Txn {
    tx: Option<Transaction>,
}

impl Txn {
    pub(crate) fn new(tx: Transaction) -> Txn {
        Txn { tx: Some(tx) }
    }

    fn live(&mut self) -> Result<&mut Transaction, JsValue> {
        self.tx.as_mut().ok_or_else(finished)
    }
}

#[wasm_bindgen]
impl Txn {
    /// The value of `key` as this transaction sees it.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, JsValue> {
        let v = self.live()?.get(key).map_err(txn_error)?;
        Ok(v.map(|b| b.to_vec()))
    }
    /// Stores `value` under `key`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), JsValue> {
        self.live()?.put(key, value).map_err(txn_error)
    }
    /// Deletes `key`; whether it was present.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool, JsValue> {
        self.live()?.delete(key).map_err(txn_error)
    }
    /// Whether the transaction has written anything.
    #[wasm_bindgen(js_name = hasWrites)]
    pub fn has_writes(&self) -> bool {
        self.tx.as_ref().is_some_and(Transaction::has_writes)
    }
    /// The log position of the snapshot it reads.
    #[wasm_bindgen(js_name = snapshotPos)]
    pub fn snapshot_pos(&self) -> f64 {
        self.tx.as_ref().map_or(0.0, |t| t.snapshot().pos() as f64)
    }
    /// Up to `limit` pairs between the bounds (see `bound`), in order,
    /// seeing this transaction's writes, as one chunk (see `chunk`).
    /// A chunk shorter than `limit` means the walk reached the end.
    pub fn range(
        &mut self,
        start_kind: u8,
        start: &[u8],
        end_kind: u8,
        end: &[u8],
        reverse: bool,
        limit: u32,
    ) -> Result<Vec<u8>, JsValue> {
        let (s, e) = (bound(start_kind, start)?, bound(end_kind, end)?);
        let tx = self.live()?;
        chunk(
            tx.range(s, e, order(reverse), Some(limit.max(1) as usize)),
            txn_error,
        )
    }
    /// Ends the transaction: the intention bytes to append, or `undefined`
    /// if it wrote nothing (read-only: nothing to log).
    pub fn finish(&mut self) -> Result<Option<Vec<u8>>, JsValue> {
        let tx = self.tx.take().ok_or_else(finished)?;
        match tx.finish().map_err(txn_error)? {
            Finished::ReadOnly => Ok(None),
            Finished::Intention(bytes) => Ok(Some(bytes)),
        }
    }
}

/// An immutable committed state: reads never change and never abort.
#[wasm_bindgen]
pub struct Snap {
    snap: Snapshot,
}

impl Snap {
    pub(crate) fn new(snap: Snapshot) -> Snap {
        Snap { snap }
    }
}

#[wasm_bindgen]
impl Snap {
    /// The value of `key` in this state.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, JsValue> {
        if key.len() > melddb::error::MAX_KEY_LEN {
            return Err(txn_error(TxnError::KeyTooLong { len: key.len() }));
        }
        let v = self.snap.get(key).map_err(store_error)?;
        Ok(v.map(|b| b.to_vec()))
    }
    /// Up to `limit` pairs between the bounds, as [`Txn::range`] gives them.
    pub fn range(
        &self,
        start_kind: u8,
        start: &[u8],
        end_kind: u8,
        end: &[u8],
        reverse: bool,
        limit: u32,
    ) -> Result<Vec<u8>, JsValue> {
        let (s, e) = (bound(start_kind, start)?, bound(end_kind, end)?);
        chunk(
            self.snap
                .range(s, e, order(reverse), Some(limit.max(1) as usize)),
            store_error,
        )
    }
    /// The log position of this state.
    #[wasm_bindgen(getter)]
    pub fn pos(&self) -> f64 {
        self.snap.pos() as f64
    }
    /// Its commit sequence number.
    #[wasm_bindgen(getter)]
    pub fn csn(&self) -> f64 {
        self.snap.csn() as f64
    }
    /// The state digest in hex (the same on every node at this position).
    pub fn digest(&self) -> Result<String, JsValue> {
        self.snap.digest_hex().map_err(store_error)
    }
}
