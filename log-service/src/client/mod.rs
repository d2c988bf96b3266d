//! The native async client, and [`BlockingLog`], which implements the
//! core's [`melddb::Log`] trait on top of it.
//!
//! Appends carry this client's random id and a fresh request id; when the
//! connection drops mid-append the client reconnects and sends the same
//! request id again, so the service returns the first position instead of
//! appending twice. Subscriptions resume after the last position received
//! (`subscription`); `blocking` holds [`BlockingLog`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::locks::lock;
use crate::protocol::{
    self, Code, Request, Response, ENTRIES_HEADER_BYTES, ENTRIES_RECORD_OVERHEAD, MAX_RANGE_BYTES,
    MAX_RANGE_RECORDS,
};
use crate::tcp_frames::{self, FrameDecoder, Incoming};

mod blocking;
mod subscription;

pub use blocking::BlockingLog;
pub use subscription::{BatchSubscription, Subscription};

/// A client operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Could not connect (after the configured attempts).
    #[error("cannot connect to {addr}: {why}")]
    Connect {
        /// Address.
        addr: String,
        /// Why.
        why: String,
    },
    /// The connection dropped and retries ran out.
    #[error("connection lost after {attempts} attempts: {why}")]
    Disconnected {
        /// Attempts made.
        attempts: u32,
        /// Last error.
        why: String,
    },
    /// The server answered with an error frame.
    #[error("server error {code:?}: {message}")]
    Server {
        /// Code.
        code: Code,
        /// First number.
        a: u64,
        /// Second number.
        b: u64,
        /// Message.
        message: String,
    },
    /// The server sent something that is not a valid answer.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The request does not fit in one frame; nothing was sent. Split the
    /// batch, or raise `ClientOptions::max_frame_bytes` together with the
    /// service's `limits.max_frame_bytes` (and `max_record_bytes`).
    #[error(
        "a request of {bytes} bytes exceeds the frame limit of {limit} bytes; nothing was sent"
    )]
    TooLarge {
        /// The request's frame size.
        bytes: usize,
        /// `ClientOptions::max_frame_bytes`.
        limit: usize,
    },
}

impl ClientError {
    fn retryable(&self) -> bool {
        matches!(self, ClientError::Disconnected { .. })
            || matches!(
                self,
                ClientError::Server {
                    code: Code::WriteFailed | Code::ShuttingDown | Code::Busy,
                    ..
                }
            )
    }
}

/// Connection options.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Bearer token sent in Hello.
    pub token: Option<String>,
    /// Attempts per operation (connect and retry) before giving up.
    pub attempts: u32,
    /// First retry delay; doubles up to one second.
    pub backoff: Duration,
    /// Largest frame accepted from the server, and largest request sent
    /// (a larger one fails with [`ClientError::TooLarge`]). Match it to
    /// the service's `limits.max_frame_bytes`.
    pub max_frame_bytes: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            token: None,
            attempts: 8,
            backoff: Duration::from_millis(20),
            max_frame_bytes: (64 << 20) + 4096,
        }
    }
}

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<Response>>>>;
type Streams = Arc<Mutex<HashMap<u64, Route>>>;

/// Where a connection's reader sends the answers of one subscription.
enum Route {
    /// A [`Subscription`]'s, unbounded: it shares the client's connection
    /// with other requests, whose answers must not wait behind its entries.
    Unbounded(mpsc::UnboundedSender<Response>),
    /// A [`BatchSubscription`]'s, bounded: it has its connection to
    /// itself, so the reader waits for room, which stops it reading the
    /// socket and so the service sending.
    Bounded(mpsc::Sender<Response>),
}

struct Conn {
    tx: mpsc::Sender<Bytes>,
    waiters: Waiters,
    streams: Streams,
    alive: Arc<std::sync::atomic::AtomicBool>,
}

impl Conn {
    async fn open(addr: &str, opts: &ClientOptions) -> Result<Conn, String> {
        let sock = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let _ = sock.set_nodelay(true);
        let (r, w) = sock.into_split();
        let mut read = FramedRead::new(r, FrameDecoder::new(opts.max_frame_bytes));
        let mut write = FramedWrite::new(w, tcp_frames::encoder(opts.max_frame_bytes));
        let (tx, mut rx) = mpsc::channel::<Bytes>(1024);
        let waiters: Waiters = Arc::default();
        let streams: Streams = Arc::default();
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        tokio::spawn(async move {
            while let Some(f) = rx.recv().await {
                if write.feed(f).await.is_err() {
                    return;
                }
                while let Ok(f) = rx.try_recv() {
                    if write.feed(f).await.is_err() {
                        return;
                    }
                }
                if SinkExt::<Bytes>::flush(&mut write).await.is_err() {
                    return;
                }
            }
        });
        {
            let waiters = waiters.clone();
            let streams = streams.clone();
            let alive = alive.clone();
            tokio::spawn(async move {
                while let Some(Ok(f)) = read.next().await {
                    let (corr, resp) = match f {
                        Incoming::Frame(f) => match protocol::decode_response(&f) {
                            Ok(answer) => answer,
                            Err(_) => break,
                        },
                        // The decoder skips the frame and reads on; only
                        // the request it answers fails (a subscription
                        // ends on it, see `Subscription::next`).
                        Incoming::Oversized { corr, len, limit } => (
                            corr,
                            protocol::too_large(
                                len,
                                limit,
                                format!(
                                    "an answer of {len} bytes exceeds ClientOptions::max_frame_bytes {limit}; \
                                     raise it to read this"
                                ),
                            ),
                        ),
                    };
                    if let Some(w) = lock(&waiters).remove(&corr) {
                        let _ = w.send(resp);
                        continue;
                    }
                    let bounded = {
                        let mut subs = lock(&streams);
                        match subs.get(&corr) {
                            Some(Route::Unbounded(s)) => {
                                if s.send(resp).is_err() {
                                    // Its subscription is gone (dropped, or
                                    // ended by an error): stop routing to it.
                                    subs.remove(&corr);
                                }
                                continue;
                            }
                            Some(Route::Bounded(s)) => s.clone(),
                            // A connection-level error (busy, bad frame):
                            // fail everyone waiting.
                            None if corr == 0 => break,
                            None => continue,
                        }
                    };
                    // Waits for room: back-pressure on this connection only.
                    if bounded.send(resp).await.is_err() {
                        lock(&streams).remove(&corr);
                    }
                }
                alive.store(false, Ordering::SeqCst);
                lock(&waiters).clear();
                lock(&streams).clear();
            });
        }
        let conn = Conn {
            tx,
            waiters,
            streams,
            alive,
        };
        if let Some(t) = &opts.token {
            match conn
                .call(
                    u64::MAX,
                    protocol::encode_request(u64::MAX, &Request::Hello { token: t.clone() }),
                )
                .await?
            {
                Response::HelloOk => {}
                Response::Error { message, .. } => {
                    return Err(format!("authentication failed: {message}"))
                }
                other => return Err(format!("unexpected answer to Hello: {other:?}")),
            }
        }
        Ok(conn)
    }

    /// Sends `frame` (a request encoded with correlation id `corr`) and
    /// waits for its answer.
    async fn call(&self, corr: u64, frame: Bytes) -> Result<Response, String> {
        let (w, r) = oneshot::channel();
        lock(&self.waiters).insert(corr, w);
        if !self.alive.load(Ordering::SeqCst) {
            lock(&self.waiters).remove(&corr);
            return Err("connection closed".into());
        }
        self.tx
            .send(frame)
            .await
            .map_err(|_| "connection closed".to_string())?;
        r.await
            .map_err(|_| "connection closed before the answer".to_string())
    }
}

/// An async client of the log service. Clone it freely; clones share the
/// connection.
#[derive(Clone)]
pub struct Client {
    addr: String,
    opts: ClientOptions,
    conn: Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    client_id: u64,
    next: Arc<AtomicU64>,
}

fn random_id() -> u64 {
    // Random per client so two clients' request ids never collide.
    let id: u64 = rand::random();
    id.max(1)
}

impl Client {
    /// Connects with default options.
    pub async fn connect(addr: &str) -> Result<Client, ClientError> {
        Client::connect_with(addr, ClientOptions::default()).await
    }

    /// Connects with options.
    pub async fn connect_with(addr: &str, opts: ClientOptions) -> Result<Client, ClientError> {
        let c = Client {
            addr: addr.to_string(),
            opts,
            conn: Arc::default(),
            client_id: random_id(),
            next: Arc::new(AtomicU64::new(1)),
        };
        c.connection().await.map_err(|why| ClientError::Connect {
            addr: addr.to_string(),
            why,
        })?;
        Ok(c)
    }

    /// This client's id (the idempotency namespace of its request ids).
    pub fn id(&self) -> u64 {
        self.client_id
    }

    async fn connection(&self) -> Result<Arc<Conn>, String> {
        let mut g = self.conn.lock().await;
        if let Some(c) = g.as_ref() {
            if c.alive.load(Ordering::SeqCst) {
                return Ok(c.clone());
            }
        }
        let c = Arc::new(Conn::open(&self.addr, &self.opts).await?);
        *g = Some(c.clone());
        Ok(c)
    }

    /// Sends `req`, reconnecting and resending on connection loss or a
    /// retryable error. Only idempotent requests go through here.
    async fn call(&self, req: Request) -> Result<Response, ClientError> {
        let mut delay = self.opts.backoff;
        let mut last = String::new();
        for attempt in 1..=self.opts.attempts {
            match self.connection().await {
                Ok(conn) => {
                    let corr = self.next.fetch_add(1, Ordering::Relaxed);
                    let frame = protocol::encode_request(corr, &req);
                    // Refused here: the codec would fail the connection's
                    // writer, and every retry would meet the same limit.
                    if frame.len() > self.opts.max_frame_bytes {
                        return Err(ClientError::TooLarge {
                            bytes: frame.len(),
                            limit: self.opts.max_frame_bytes,
                        });
                    }
                    match conn.call(corr, frame).await {
                        Ok(Response::Error {
                            code,
                            a,
                            b,
                            message,
                        }) => {
                            let e = ClientError::Server {
                                code,
                                a,
                                b,
                                message,
                            };
                            if !e.retryable() || attempt == self.opts.attempts {
                                return Err(e);
                            }
                            last = e.to_string();
                        }
                        Ok(r) => return Ok(r),
                        Err(e) => last = e,
                    }
                }
                Err(e) => last = e,
            }
            // No wait after the last attempt: nothing follows it.
            if attempt < self.opts.attempts {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
        Err(ClientError::Disconnected {
            attempts: self.opts.attempts,
            why: last,
        })
    }

    /// Appends a record; returns its position. Retried with the same
    /// request id, so it is appended exactly once.
    pub async fn append(&self, log: &str, bytes: impl Into<Bytes>) -> Result<u64, ClientError> {
        let request = self.next.fetch_add(1, Ordering::Relaxed);
        self.append_with_id(log, request, bytes).await
    }

    /// Appends with an explicit request id (unique per client).
    pub async fn append_with_id(
        &self,
        log: &str,
        request: u64,
        bytes: impl Into<Bytes>,
    ) -> Result<u64, ClientError> {
        let req = Request::Append {
            log: log.to_string(),
            client: self.client_id,
            request,
            bytes: bytes.into(),
        };
        match self.call(req).await? {
            Response::Appended { pos } => Ok(pos),
            other => Err(ClientError::Protocol(format!("append answered {other:?}"))),
        }
    }

    /// Appends several records in one frame and one service batch; they
    /// take consecutive positions. Retried as a unit with the same request
    /// ids, so each record lands exactly once.
    pub async fn append_batch(
        &self,
        log: &str,
        records: Vec<Bytes>,
    ) -> Result<Vec<u64>, ClientError> {
        let n = records.len() as u64;
        let first_request = self.next.fetch_add(n.max(1), Ordering::Relaxed);
        let req = Request::AppendBatch {
            log: log.to_string(),
            client: self.client_id,
            first_request,
            records,
        };
        match self.call(req).await? {
            Response::AppendedBatch { positions } if positions.len() as u64 == n => Ok(positions),
            other => Err(ClientError::Protocol(format!(
                "append batch answered {other:?}"
            ))),
        }
    }

    /// Reads one record.
    pub async fn read(&self, log: &str, pos: u64) -> Result<Bytes, ClientError> {
        match self
            .call(Request::Read {
                log: log.to_string(),
                pos,
            })
            .await?
        {
            Response::Entry { pos: p, bytes } if p == pos => Ok(bytes),
            other => Err(ClientError::Protocol(format!("read answered {other:?}"))),
        }
    }

    /// `(first, tail)` of a log.
    pub async fn bounds(&self, log: &str) -> Result<(u64, u64), ClientError> {
        match self
            .call(Request::Bounds {
                log: log.to_string(),
            })
            .await?
        {
            Response::Bounds { first, tail } => Ok((first, tail)),
            other => Err(ClientError::Protocol(format!("bounds answered {other:?}"))),
        }
    }

    /// Trims a log below `pos`.
    pub async fn trim(&self, log: &str, pos: u64) -> Result<(), ClientError> {
        match self
            .call(Request::Trim {
                log: log.to_string(),
                pos,
            })
            .await?
        {
            Response::Done => Ok(()),
            other => Err(ClientError::Protocol(format!("trim answered {other:?}"))),
        }
    }

    /// Liveness check.
    pub async fn ping(&self) -> Result<(), ClientError> {
        match self.call(Request::Ping).await? {
            Response::Pong => Ok(()),
            other => Err(ClientError::Protocol(format!("ping answered {other:?}"))),
        }
    }

    /// Every entry of `log` from `from` on, in order, resuming after a
    /// reconnect.
    pub fn subscribe(&self, log: &str, from: u64) -> Subscription {
        Subscription::new(self.clone(), log, from)
    }

    /// Reads the records of `log` at `from`, `from + 1`, ... in one
    /// request: at most `max_records` (the service caps it at
    /// [`MAX_RANGE_RECORDS`]) and `max_bytes` of record bytes (capped at
    /// [`MAX_RANGE_BYTES`], and so that the answer fits
    /// `ClientOptions::max_frame_bytes`), but at least one record when
    /// `from` is below the tail, however long. Returns `from` and the
    /// records; none at the tail. Below the first position it fails with
    /// `Trimmed`, beyond the tail with `NotYetWritten`, with 0 for either
    /// limit with `BadFrame`.
    pub async fn read_range(
        &self,
        log: &str,
        from: u64,
        max_records: u32,
        max_bytes: u32,
    ) -> Result<(u64, Vec<Bytes>), ClientError> {
        let (max_records, max_bytes) = self.range_limits(max_records, max_bytes);
        let req = Request::ReadRange {
            log: log.to_string(),
            from,
            max_records,
            max_bytes,
        };
        match self.call(req).await? {
            Response::Entries { first, records } if first == from => Ok((first, records)),
            other => Err(ClientError::Protocol(format!(
                "read range answered {other:?}"
            ))),
        }
    }

    /// `max_records` and `max_bytes` lowered so that an answer within them
    /// fits `ClientOptions::max_frame_bytes`: the records' lengths take at
    /// most half the frame, their bytes the rest. (A single record too
    /// long for the frame still fails, with `TooLarge`.) Zero stays zero,
    /// for the service to refuse.
    fn range_limits(&self, max_records: u32, max_bytes: u32) -> (u32, u32) {
        let frame = self
            .opts
            .max_frame_bytes
            .saturating_sub(ENTRIES_HEADER_BYTES);
        let most = (frame / 2 / ENTRIES_RECORD_OVERHEAD).max(1);
        let records = max_records
            .min(MAX_RANGE_RECORDS)
            .min(u32::try_from(most).unwrap_or(u32::MAX));
        let room = frame.saturating_sub(ENTRIES_RECORD_OVERHEAD * records as usize);
        let bytes = max_bytes.min(u32::try_from(room).unwrap_or(u32::MAX).max(1));
        (records, bytes)
    }

    /// Every entry of `log` from `from` on, in order, as batches of up to
    /// [`MAX_RANGE_RECORDS`] records and [`MAX_RANGE_BYTES`] bytes: see
    /// [`BatchSubscription`].
    pub fn subscribe_batches(&self, log: &str, from: u64) -> BatchSubscription {
        self.subscribe_batches_with(log, from, MAX_RANGE_RECORDS, MAX_RANGE_BYTES)
    }

    /// [`Client::subscribe_batches`] with batches of at most
    /// `max_records` records and `max_bytes` bytes (each at least 1; a
    /// record longer than `max_bytes` comes alone).
    pub fn subscribe_batches_with(
        &self,
        log: &str,
        from: u64,
        max_records: u32,
        max_bytes: u32,
    ) -> BatchSubscription {
        let limits = self.range_limits(max_records, max_bytes);
        BatchSubscription::new(self.clone(), log, from, limits)
    }
}
