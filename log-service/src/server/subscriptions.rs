//! Subscriptions: `Subscribe` pushes one `Entry` per record, and
//! `SubscribeBatches` pushes `Entries` of many. Both catch up by reading
//! the store from where they start, then follow the store's broadcast of
//! new entries; a lag or a gap in the broadcast is filled by reading the
//! store again, so no position is skipped or sent twice.

use std::sync::Arc;

use bytes::Bytes;
use melddb::Entry;
use tokio::sync::{broadcast, mpsc, watch, Semaphore};

use super::outgoing::Outgoing;
use super::ranges::{read_entries, RangeLimits};
use crate::error::StoreError;
use crate::protocol::{self, Response};
use crate::store::Store;

/// Answers of one batched subscription that may wait in its connection's
/// queue at once. Two keep the socket busy (one being written while the
/// next is read from the store) and bound what a client that reads slowly
/// costs the service to two batches (at most 8 MiB) per subscription.
const QUEUED_BATCHES: usize = 2;

/// Pushes every entry of `log` from `from` on, one `Entry` each: catch up
/// by reading, then follow the broadcast; a lag or a gap is filled by
/// reading again.
pub(super) async fn subscription(
    store: Arc<Store>,
    tx: mpsc::Sender<Outgoing>,
    mut done: watch::Receiver<bool>,
    corr: u64,
    log: String,
    from: u64,
) {
    let send = |r: &Response| tx.send(protocol::encode_response(corr, r).into());
    if let Err(e) = crate::store::check_log_name(&log) {
        let _ = send(&protocol::store_error(&e)).await;
        return;
    }
    let mut rx = store.subscribe(&log);
    let mut next = from;
    loop {
        let (first, tail) = store.bounds(&log);
        if next < first {
            let e = StoreError::Trimmed {
                log: log.clone(),
                pos: next,
                first,
            };
            let _ = send(&protocol::store_error(&e)).await;
            return;
        }
        while next < tail {
            let resp = match store.read(&log, next) {
                Ok(e) => Response::Entry {
                    pos: next,
                    bytes: Bytes::from_owner(e),
                },
                Err(e) => protocol::store_error(&e),
            };
            if send(&resp).await.is_err() {
                return;
            }
            next += 1;
        }
        let got = tokio::select! {
            _ = done.changed() => return,
            _ = tx.closed() => return,
            g = rx.recv() => g,
        };
        match got {
            Ok((pos, e)) if pos == next => {
                let resp = Response::Entry {
                    pos,
                    bytes: Bytes::from_owner(e),
                };
                if send(&resp).await.is_err() {
                    return;
                }
                next += 1;
            }
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {} // read the gap
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Where one batched subscription's answers go, a few at a time
/// ([`QUEUED_BATCHES`]).
struct Pusher {
    tx: mpsc::Sender<Outgoing>,
    queued: Arc<Semaphore>,
    done: watch::Receiver<bool>,
    corr: u64,
}

impl Pusher {
    /// Queues `r` once fewer than [`QUEUED_BATCHES`] of this
    /// subscription's answers wait; false when the connection is gone.
    async fn push(&mut self, r: &Response) -> bool {
        let Pusher {
            tx,
            queued,
            done,
            corr,
        } = self;
        let frame = protocol::encode_response(*corr, r);
        let send = async {
            let Ok(permit) = queued.clone().acquire_owned().await else {
                return false;
            };
            tx.send(Outgoing::holding(frame, permit)).await.is_ok()
        };
        tokio::select! {
            _ = done.changed() => false,
            sent = send => sent,
        }
    }
}

/// Pushes every entry of `log` from `from` on as `Entries` answers within
/// `max_records` and `max_bytes` (capped as a range read's): while behind
/// the tail each answer is one range read of the store; at the tail each
/// holds whatever the broadcast has ready, without waiting for more. An
/// error answer (bad limits, a trimmed `from`, an unreadable record) ends
/// the subscription.
pub(super) async fn batch_subscription(
    store: Arc<Store>,
    tx: mpsc::Sender<Outgoing>,
    done: watch::Receiver<bool>,
    corr: u64,
    log: String,
    (from, max_records, max_bytes): (u64, u32, u32),
) {
    let mut out = Pusher {
        tx,
        queued: Arc::new(Semaphore::new(QUEUED_BATCHES)),
        done,
        corr,
    };
    if let Err(e) = crate::store::check_log_name(&log) {
        out.push(&protocol::store_error(&e)).await;
        return;
    }
    let limits = match RangeLimits::new(&store, max_records, max_bytes) {
        Ok(l) => l,
        Err(resp) => {
            out.push(&resp).await;
            return;
        }
    };
    let mut rx = store.subscribe(&log);
    let mut next = from;
    // A broadcast entry taken while coalescing that did not fit its batch:
    // the first of the next one.
    let mut carried: Option<(u64, Entry)> = None;
    loop {
        let (first, tail) = store.bounds(&log);
        if next < first {
            let e = StoreError::Trimmed {
                log: log.clone(),
                pos: next,
                first,
            };
            out.push(&protocol::store_error(&e)).await;
            return;
        }
        while next < tail {
            carried = None; // read again below with the rest
            let records = match read_entries(&store, &log, next, limits) {
                Ok(r) => r,
                Err(resp) => {
                    out.push(&resp).await;
                    return;
                }
            };
            let n = records.len() as u64;
            if n == 0 {
                // Nothing there after all: wait for the broadcast.
                break;
            }
            if !out
                .push(&Response::Entries {
                    first: next,
                    records,
                })
                .await
            {
                return;
            }
            next += n;
        }
        let (pos, entry) = match carried.take() {
            Some(c) => c,
            None => {
                let got = tokio::select! {
                    _ = out.done.changed() => return,
                    _ = out.tx.closed() => return,
                    g = rx.recv() => g,
                };
                match got {
                    Ok(x) => x,
                    Err(broadcast::error::RecvError::Lagged(_)) => continue, // read the gap
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        };
        if pos != next {
            // Already sent (read while catching up), or past a gap that
            // the loop's top reads from the store.
            continue;
        }
        let mut records = vec![Bytes::from_owner(entry)];
        let mut bytes = records[0].len();
        loop {
            let want = next + records.len() as u64;
            match rx.try_recv() {
                Ok((p, e)) if p == want => {
                    if !limits.room_for(records.len(), bytes, e.len()) {
                        carried = Some((p, e));
                        break;
                    }
                    bytes += e.len();
                    records.push(Bytes::from_owner(e));
                }
                Ok((p, _)) if p < want => {} // already sent
                // A gap (read from the store at the loop's top), nothing
                // ready, a lag (the gap again) or the end (the next
                // receive says so).
                Ok(_) | Err(_) => break,
            }
        }
        if let Err(resp) = limits.fit(next, &mut records) {
            out.push(&resp).await;
            return;
        }
        let n = records.len() as u64;
        if !out
            .push(&Response::Entries {
                first: next,
                records,
            })
            .await
        {
            return;
        }
        next += n;
    }
}
