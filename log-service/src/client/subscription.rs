//! Subscriptions: [`Subscription`] yields one entry at a time over the
//! client's shared connection; [`BatchSubscription`] yields batches over
//! a connection of its own, with bounded buffering.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{Client, ClientError, Conn, Route};
use crate::locks::lock;
use crate::protocol::{self, Request, Response};

/// An ordered stream of entries; see [`Client::subscribe`].
pub struct Subscription {
    client: Client,
    log: String,
    next: u64,
    rx: Option<mpsc::UnboundedReceiver<Response>>,
}

impl Subscription {
    /// A subscription that starts with the first call to
    /// [`Subscription::next`].
    pub(super) fn new(client: Client, log: &str, from: u64) -> Subscription {
        Subscription {
            client,
            log: log.to_string(),
            next: from,
            rx: None,
        }
    }

    /// The next entry, waiting for it to be appended. Reconnects and
    /// resumes from the next position if the connection drops.
    pub async fn next(&mut self) -> Result<(u64, Bytes), ClientError> {
        let mut failures = 0u32;
        loop {
            if self.rx.is_none() {
                let conn = match self.client.connection().await {
                    Ok(c) => c,
                    Err(e) => {
                        failures += 1;
                        if failures >= self.client.opts.attempts {
                            return Err(ClientError::Disconnected {
                                attempts: failures,
                                why: e,
                            });
                        }
                        tokio::time::sleep(self.client.opts.backoff * failures).await;
                        continue;
                    }
                };
                let corr = self.client.next.fetch_add(1, Ordering::Relaxed);
                let (tx, rx) = mpsc::unbounded_channel();
                lock(&conn.streams).insert(corr, Route::Unbounded(tx));
                let req = Request::Subscribe {
                    log: self.log.clone(),
                    from: self.next,
                };
                if conn
                    .tx
                    .send(protocol::encode_request(corr, &req))
                    .await
                    .is_err()
                {
                    continue;
                }
                self.rx = Some(rx);
            }
            let rx = self.rx.as_mut().expect("set above");
            match rx.recv().await {
                Some(Response::Entry { pos, bytes }) => {
                    if pos < self.next {
                        continue; // duplicate after a resume
                    }
                    if pos > self.next {
                        return Err(ClientError::Protocol(format!(
                            "subscription skipped from {} to {pos}",
                            self.next
                        )));
                    }
                    self.next = pos + 1;
                    return Ok((pos, bytes));
                }
                Some(Response::Error {
                    code,
                    a,
                    b,
                    message,
                }) => {
                    // The service ends a subscription it reports an error
                    // on, and an entry too large to receive ends it here:
                    // the next call starts afresh from `next` (and meets
                    // the same error if its cause is still there) rather
                    // than waiting on a stream nobody feeds.
                    self.rx = None;
                    return Err(ClientError::Server {
                        code,
                        a,
                        b,
                        message,
                    });
                }
                Some(other) => {
                    return Err(ClientError::Protocol(format!("subscription got {other:?}")))
                }
                None => {
                    // Connection lost: resubscribe from `next`.
                    self.rx = None;
                    failures += 1;
                    if failures >= self.client.opts.attempts {
                        return Err(ClientError::Disconnected {
                            attempts: failures,
                            why: "subscription connection lost".into(),
                        });
                    }
                    tokio::time::sleep(self.client.opts.backoff).await;
                }
            }
        }
    }
}

/// Batches a [`BatchSubscription`] holds received but not yet taken; the
/// connection is not read while they wait.
const BATCHES_BUFFERED: usize = 4;

/// An ordered stream of batches of entries; see
/// [`Client::subscribe_batches`]. Meant for catching up: while the log is
/// far ahead each batch is one range read of the service, and at the tail
/// a batch holds whatever has been appended since the last one.
///
/// **Back-pressure.** A batch subscription has a TCP connection of its own
/// (opened by its first [`BatchSubscription::next_batch`], with the
/// client's options and token), so a consumer that takes batches slowly
/// never holds up other requests' answers. Its batches wait in a bounded
/// queue of four; while the queue is full the connection is not read, TCP
/// fills, and the service stops reading the store for this subscription
/// (it queues at most two batches of its own), so memory stays bounded at
/// both ends however slowly batches are taken. Dropping the subscription
/// closes its connection, which ends it in the service.
pub struct BatchSubscription {
    client: Client,
    log: String,
    next: u64,
    max_records: u32,
    max_bytes: u32,
    /// Its connection and the answers routed from it: none before the
    /// first call, after a lost connection and after an error.
    live: Option<(Arc<Conn>, mpsc::Receiver<Response>)>,
}

impl BatchSubscription {
    /// A subscription from `from` whose batches hold at most `max_records`
    /// records and `max_bytes` bytes; it connects on the first call.
    pub(super) fn new(
        client: Client,
        log: &str,
        from: u64,
        (max_records, max_bytes): (u32, u32),
    ) -> BatchSubscription {
        BatchSubscription {
            client,
            log: log.to_string(),
            next: from,
            max_records,
            max_bytes,
            live: None,
        }
    }

    /// The position the next batch starts at.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Opens the subscription's connection and subscribes from `next`.
    async fn start(&self) -> Result<(Arc<Conn>, mpsc::Receiver<Response>), String> {
        let conn = Arc::new(Conn::open(&self.client.addr, &self.client.opts).await?);
        let corr = self.client.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(BATCHES_BUFFERED);
        lock(&conn.streams).insert(corr, Route::Bounded(tx));
        let req = Request::SubscribeBatches {
            log: self.log.clone(),
            from: self.next,
            max_records: self.max_records,
            max_bytes: self.max_bytes,
        };
        conn.tx
            .send(protocol::encode_request(corr, &req))
            .await
            .map_err(|_| "connection closed before subscribing".to_string())?;
        Ok((conn, rx))
    }

    /// The next batch: its first position and its records, at least one,
    /// waiting for appends at the tail. The first batch starts at `from`
    /// and each next one where the last ended. After a lost connection it
    /// reconnects and resumes from there (up to `ClientOptions::attempts`
    /// tries, then [`ClientError::Disconnected`]), dropping records it has
    /// already returned. A position skipped is a
    /// [`ClientError::Protocol`] error, an error answer (a trimmed
    /// position, an unreadable record, a record over the frame limit) a
    /// [`ClientError::Server`] one; either ends the connection, and the
    /// next call subscribes afresh from the same position.
    pub async fn next_batch(&mut self) -> Result<(u64, Vec<Bytes>), ClientError> {
        let mut failures = 0u32;
        loop {
            let rx = match &mut self.live {
                Some((_, rx)) => rx,
                None => {
                    match self.start().await {
                        Ok(live) => self.live = Some(live),
                        Err(why) => {
                            failures += 1;
                            if failures >= self.client.opts.attempts {
                                return Err(ClientError::Disconnected {
                                    attempts: failures,
                                    why,
                                });
                            }
                            tokio::time::sleep(self.client.opts.backoff * failures).await;
                        }
                    }
                    continue;
                }
            };
            match rx.recv().await {
                Some(Response::Entries { first, mut records }) => {
                    if first > self.next {
                        self.live = None;
                        return Err(ClientError::Protocol(format!(
                            "batch subscription skipped from {} to {first}",
                            self.next
                        )));
                    }
                    // Records before `next` were returned before a resume.
                    let seen = (self.next - first).min(records.len() as u64) as usize;
                    records.drain(..seen);
                    if records.is_empty() {
                        continue;
                    }
                    let at = self.next;
                    self.next += records.len() as u64;
                    return Ok((at, records));
                }
                Some(Response::Error {
                    code,
                    a,
                    b,
                    message,
                }) => {
                    self.live = None;
                    return Err(ClientError::Server {
                        code,
                        a,
                        b,
                        message,
                    });
                }
                Some(other) => {
                    self.live = None;
                    return Err(ClientError::Protocol(format!(
                        "batch subscription got {other:?}"
                    )));
                }
                None => {
                    // Connection lost: resubscribe from `next`.
                    self.live = None;
                    failures += 1;
                    if failures >= self.client.opts.attempts {
                        return Err(ClientError::Disconnected {
                            attempts: failures,
                            why: "batch subscription connection lost".into(),
                        });
                    }
                    tokio::time::sleep(self.client.opts.backoff).await;
                }
            }
        }
    }
}
