//! Range reads: the records of one log at consecutive positions in one
//! call, for a reader catching up. Records that lie side by side in a
//! root stripe's payload are read with one positioned read of the span
//! they cover, and each is checked against its own CRC; a record that
//! fails its CRC, spans fragment stripes, or whose span would drag in
//! mostly other bytes is read on its own through [`Store::read`], which
//! rebuilds from parity and queues repairs. Either way a record is served
//! only after its CRC matched.

use std::ops::Range;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::{check_log_name, Store};
use crate::error::StoreError;
use crate::shared::{read_range as read_payload_bytes, Loc};
use crate::stripe::{StripeRef, FRAGMENTED};

/// Bytes a span read may hold besides the records it serves (other logs'
/// records and the entries' metadata between them) before the records are
/// read one by one instead: bounds what a sparse span costs.
const SPAN_SLACK_BYTES: usize = 64 << 10;

/// Consecutive records of one root stripe, by their index in the planned
/// range.
struct Run {
    /// The stripe; `None` if it has no end-write any more (the records are
    /// then read one by one, and report why).
    root: Option<StripeRef>,
    /// Indexes into the planned locations.
    at: Range<usize>,
}

impl Store {
    /// The records of `log` at `from`, `from + 1`, ...: at most
    /// `max_records` of them and at most `max_bytes` bytes together, but
    /// always the first one, however long, when `from` is below the tail.
    /// Empty at the tail; `Trimmed` below the first position and
    /// `NotYetWritten` beyond the tail, as [`Store::read`] reports them.
    ///
    /// A record that cannot be read ends the range before it: an error is
    /// returned only for the first record, so a caller that asks again
    /// from where the range ended meets it there.
    pub fn read_range(
        &self,
        log: &str,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Bytes>, StoreError> {
        check_log_name(log)?;
        let (locs, runs) = self.plan_range(log, from, max_records, max_bytes)?;
        let mut out = Vec::with_capacity(locs.len());
        let mut served = 0u64;
        'runs: for run in runs {
            let span = run
                .root
                .as_ref()
                .and_then(|root| self.read_span(root, &locs[run.at.clone()]));
            for i in run.at {
                let pos = from + i as u64;
                let fast = span.as_ref().and_then(|(start, bytes)| {
                    let loc = &locs[i];
                    let at = (loc.offset - start) as usize;
                    let b = bytes.slice(at..at + loc.len as usize);
                    (crc32fast::hash(&b) == loc.crc).then_some(b)
                });
                let record = match fast {
                    Some(b) => {
                        served += 1;
                        b
                    }
                    None => match self.read(log, pos) {
                        Ok(e) => Bytes::from_owner(e),
                        Err(e) if out.is_empty() => return Err(e),
                        // Reported when the caller asks from here.
                        Err(_) => break 'runs,
                    },
                };
                out.push(record);
            }
        }
        self.shared
            .counters
            .reads
            .fetch_add(served, Ordering::Relaxed);
        Ok(out)
    }

    /// Under the index lock: where each record of the range is, and the
    /// runs of records that share a root stripe (with that stripe's
    /// reference, cloned once per run).
    fn plan_range(
        &self,
        log: &str,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<(Vec<Loc>, Vec<Run>), StoreError> {
        let idx = self.shared.index();
        let Some(l) = idx.logs.get(log) else {
            // A log never written has bounds (0, 0).
            return if from == 0 {
                Ok((Vec::new(), Vec::new()))
            } else {
                Err(StoreError::NotYetWritten {
                    log: log.into(),
                    pos: from,
                    tail: 0,
                })
            };
        };
        if from < l.first {
            return Err(StoreError::Trimmed {
                log: log.into(),
                pos: from,
                first: l.first,
            });
        }
        let tail = l.tail();
        if from > tail {
            return Err(StoreError::NotYetWritten {
                log: log.into(),
                pos: from,
                tail,
            });
        }
        // Below the tail, so the index fits a usize (it indexes `locs`).
        let start = (from - l.first) as usize;
        let mut locs: Vec<Loc> = Vec::new();
        let mut bytes = 0usize;
        while locs.len() < max_records.max(1) {
            let Some(loc) = l.locs.get(start + locs.len()).copied() else {
                break;
            };
            if !locs.is_empty() && bytes + loc.len as usize > max_bytes {
                break;
            }
            bytes += loc.len as usize;
            locs.push(loc);
        }
        let mut runs: Vec<Run> = Vec::new();
        for (i, loc) in locs.iter().enumerate() {
            match runs.last_mut() {
                Some(r) if locs[r.at.start].stripe == loc.stripe => r.at.end = i + 1,
                _ => runs.push(Run {
                    root: idx.stripes.get(&loc.stripe).cloned(),
                    at: i..i + 1,
                }),
            }
        }
        Ok((locs, runs))
    }

    /// The bytes of the span of `root`'s payload that holds every record
    /// of `locs` (all in `root`), with the offset it starts at; `None`
    /// when a record spans fragment stripes, the span holds too much else,
    /// or a page cannot be read (the records are then read one by one).
    fn read_span(&self, root: &StripeRef, locs: &[Loc]) -> Option<(u32, Bytes)> {
        if locs.iter().any(|l| l.offset == FRAGMENTED) {
            return None;
        }
        let start = locs.iter().map(|l| l.offset).min()?;
        let end = locs.iter().map(|l| l.offset as u64 + l.len as u64).max()?;
        let len = u32::try_from(end - start as u64).ok()?;
        let wanted: usize = locs.iter().map(|l| l.len as usize).sum();
        if len as usize > wanted.saturating_mul(2) + SPAN_SLACK_BYTES {
            return None;
        }
        read_payload_bytes(&self.shared, root, start, len).map(|b| (start, Bytes::from(b)))
    }
}
