//! The native async client, and [`BlockingLog`], which implements the
//! core's [`melddb::Log`] trait on top of it.
//!
//! Appends carry this client's random id and a fresh request id; when the
//! connection drops mid-append the client reconnects and sends the same
//! request id again, so the service returns the first position instead of
//! appending twice. Subscriptions resume after the last position received.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use melddb::{Entry, LogError, LogPos};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::locks::lock;
use crate::protocol::{self, Code, Request, Response};
use crate::tcp_frames::{self, FrameDecoder, Incoming};

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
type Streams = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Response>>>>;

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
                    let mut subs = lock(&streams);
                    if let Some(s) = subs.get(&corr) {
                        if s.send(resp).is_err() {
                            // Its subscription is gone (dropped, or ended by
                            // an error): stop routing to it.
                            subs.remove(&corr);
                        }
                    } else if corr == 0 {
                        // A connection-level error (busy, bad frame): fail
                        // everyone waiting.
                        break;
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
        Subscription {
            client: self.clone(),
            log: log.to_string(),
            next: from,
            rx: None,
        }
    }
}

/// An ordered stream of entries; see [`Client::subscribe`].
pub struct Subscription {
    client: Client,
    log: String,
    next: u64,
    rx: Option<mpsc::UnboundedReceiver<Response>>,
}

impl Subscription {
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
                lock(&conn.streams).insert(corr, tx);
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

/// One log of the service as a [`melddb::Log`], for synchronous callers
/// (the core's database and tests). It owns a small Tokio runtime.
pub struct BlockingLog {
    rt: tokio::runtime::Runtime,
    client: Client,
    log: String,
    bounds: std::sync::Mutex<(u64, u64)>,
}

impl BlockingLog {
    /// Connects to `addr` and uses log `log`.
    pub fn connect(addr: &str, log: &str, opts: ClientOptions) -> Result<BlockingLog, ClientError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Connect {
                addr: addr.into(),
                why: e.to_string(),
            })?;
        let client = rt.block_on(Client::connect_with(addr, opts))?;
        let bounds = rt.block_on(client.bounds(log))?;
        Ok(BlockingLog {
            rt,
            client,
            log: log.to_string(),
            bounds: std::sync::Mutex::new(bounds),
        })
    }

    /// Asks the service for the bounds (other writers' appends included).
    pub fn refresh(&self) -> Result<(u64, u64), ClientError> {
        let b = self.rt.block_on(self.client.bounds(&self.log))?;
        *lock(&self.bounds) = b;
        Ok(b)
    }

    fn cached(&self) -> (u64, u64) {
        *lock(&self.bounds)
    }
}

fn to_log_error(e: ClientError) -> LogError {
    match e {
        ClientError::Server {
            code: Code::NotYetWritten,
            a,
            b,
            ..
        } => LogError::NotYetWritten { pos: a, tail: b },
        ClientError::Server {
            code: Code::Trimmed,
            a,
            b,
            ..
        } => LogError::Trimmed { pos: a, first: b },
        ClientError::Server {
            code: Code::TrimBeyondTail,
            a,
            b,
            ..
        } => LogError::TrimBeyondTail { pos: a, tail: b },
        ClientError::Server {
            code: Code::TooLarge,
            a,
            b,
            ..
        } => LogError::EntryTooLarge {
            len: a as usize,
            limit: b as usize,
        },
        // Sizes of the whole frame: the entry plus a header of a few dozen
        // bytes.
        ClientError::TooLarge { bytes, limit } => LogError::EntryTooLarge { len: bytes, limit },
        other => LogError::Backend(other.to_string()),
    }
}

impl melddb::Log for BlockingLog {
    fn append(&mut self, entry: &[u8]) -> Result<LogPos, LogError> {
        let pos = self
            .rt
            .block_on(self.client.append(&self.log, Bytes::copy_from_slice(entry)))
            .map_err(to_log_error)?;
        let mut b = lock(&self.bounds);
        b.1 = b.1.max(pos + 1);
        Ok(pos)
    }

    fn read(&self, pos: LogPos) -> Result<Entry, LogError> {
        let b = self
            .rt
            .block_on(self.client.read(&self.log, pos))
            .map_err(to_log_error)?;
        Ok(Arc::from(&b[..]))
    }

    /// Asks the service; if it cannot be reached (the trait cannot fail
    /// here) the last known tail is returned and the next read reports the
    /// error.
    fn tail(&self) -> LogPos {
        self.refresh().unwrap_or_else(|_| self.cached()).1
    }

    fn first(&self) -> LogPos {
        self.refresh().unwrap_or_else(|_| self.cached()).0
    }

    fn trim(&mut self, pos: LogPos) -> Result<(), LogError> {
        self.rt
            .block_on(self.client.trim(&self.log, pos))
            .map_err(to_log_error)?;
        let mut b = lock(&self.bounds);
        b.0 = b.0.max(pos);
        Ok(())
    }
}
