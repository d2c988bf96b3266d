//! Range reads for the binary protocol: the answer to a `ReadRange`, and
//! each batch a batched subscription reads while it catches up. A
//! request's limits are checked and capped here ([`MAX_RANGE_RECORDS`],
//! [`MAX_RANGE_BYTES`]), and no answer exceeds the service's
//! `max_frame_bytes`.

use bytes::Bytes;

use crate::protocol::{
    self, entries_frame_len, Code, Response, ENTRIES_HEADER_BYTES, ENTRIES_RECORD_OVERHEAD,
    MAX_RANGE_BYTES, MAX_RANGE_RECORDS,
};
use crate::store::Store;

/// A range request's limits, checked and capped, and the service's frame
/// limit.
#[derive(Debug, Clone, Copy)]
pub(super) struct RangeLimits {
    records: usize,
    bytes: usize,
    frame: usize,
}

impl RangeLimits {
    /// A request's `max_records` and `max_bytes`, capped at
    /// [`MAX_RANGE_RECORDS`] and [`MAX_RANGE_BYTES`]; the error answer when
    /// either is 0 (such a request could never be answered).
    pub(super) fn new(
        store: &Store,
        max_records: u32,
        max_bytes: u32,
    ) -> Result<RangeLimits, Response> {
        if max_records == 0 || max_bytes == 0 {
            return Err(protocol::error(
                Code::BadFrame,
                format!(
                    "max_records ({max_records}) and max_bytes ({max_bytes}) must each be at least 1"
                ),
            ));
        }
        Ok(RangeLimits {
            records: max_records.min(MAX_RANGE_RECORDS) as usize,
            bytes: max_bytes.min(MAX_RANGE_BYTES) as usize,
            frame: store.config().limits.max_frame_bytes as usize,
        })
    }

    /// Whether `n` records of `bytes` bytes together leave room for one
    /// more of `len` bytes in the same answer.
    pub(super) fn room_for(&self, n: usize, bytes: usize, len: usize) -> bool {
        n < self.records
            && bytes + len <= self.bytes
            && ENTRIES_HEADER_BYTES + (n + 1) * ENTRIES_RECORD_OVERHEAD + bytes + len <= self.frame
    }

    /// Drops records from the end of `records` (read from `from`) until
    /// their frame fits the frame limit; the error answer when the first
    /// record alone does not fit.
    pub(super) fn fit(&self, from: u64, records: &mut Vec<Bytes>) -> Result<(), Response> {
        let mut len = entries_frame_len(records.iter().map(|r| r.len()));
        while len > self.frame && records.len() > 1 {
            if let Some(r) = records.pop() {
                len -= r.len() + ENTRIES_RECORD_OVERHEAD;
            }
        }
        if len > self.frame {
            return Err(protocol::too_large(
                len as u64,
                self.frame as u64,
                format!(
                    "the record at {from} needs a frame of {len} bytes, over the service's limits.max_frame_bytes {}; raise it to read this record",
                    self.frame
                ),
            ));
        }
        Ok(())
    }
}

/// The records of `log` from `from` on within `limits`: at least one when
/// `from` is below the tail, none at the tail; a store error or a record
/// that fits no frame as its error answer.
pub(super) fn read_entries(
    store: &Store,
    log: &str,
    from: u64,
    limits: RangeLimits,
) -> Result<Vec<Bytes>, Response> {
    // Nothing past the frame limit could be sent: do not read it.
    let bytes = limits.bytes.min(limits.frame);
    let mut records = store
        .read_range(log, from, limits.records, bytes)
        .map_err(|e| protocol::store_error(&e))?;
    limits.fit(from, &mut records)?;
    Ok(records)
}
