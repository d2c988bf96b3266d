//! The network face: the binary protocol over TCP and WebSocket, and
//! HTTP/JSON for health, Prometheus metrics and tools. Every connection
//! is bounded: frames by `max_frame_bytes` (checked before allocation),
//! requests in flight by `max_in_flight` (the server stops reading a
//! connection that reaches it), connections by `max_connections`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes as AxBytes;
use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use futures_util::{SinkExt, Stream, StreamExt};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::config::Rights;
use crate::error::StoreError;
use crate::protocol::{self, Code, Request, Response};
use crate::store::Store;
use crate::tcp_frames::{self, FrameDecoder, Incoming};

/// Network counters.
#[derive(Debug, Default)]
pub struct NetMetrics {
    connections_total: AtomicU64,
    connections_open: AtomicU64,
    connections_refused: AtomicU64,
    frames_in: AtomicU64,
    error_frames: AtomicU64,
    auth_failures: AtomicU64,
    http_requests: AtomicU64,
}

struct Ctx {
    store: Arc<Store>,
    metrics: NetMetrics,
    conns: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
}

impl Ctx {
    fn all_rights() -> Rights {
        Rights {
            logs: vec!["*".into()],
            read: true,
            append: true,
        }
    }

    fn rights_for(&self, token: &str) -> Option<Rights> {
        let tokens = &self.store.config().tokens;
        if tokens.is_empty() {
            return Some(Ctx::all_rights());
        }
        tokens.get(token).cloned()
    }

    fn open_rights(&self) -> Option<Rights> {
        self.store.config().tokens.is_empty().then(Ctx::all_rights)
    }
}

/// A running service: its addresses and the handle to stop it.
pub struct Running {
    /// Binary protocol address.
    pub tcp: SocketAddr,
    /// HTTP address.
    pub http: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, lets in-flight requests finish, closes
    /// connections, and returns when the listeners are down. The store is
    /// left open for the caller to shut down.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Starts the TCP and HTTP listeners from the store's configuration.
pub async fn start(store: Arc<Store>) -> std::io::Result<Running> {
    let listen = store.config().listen.clone();
    start_on(store, &listen.tcp, &listen.http).await
}

/// Starts listeners on the given addresses (port 0 picks a free one).
pub async fn start_on(store: Arc<Store>, tcp: &str, http: &str) -> std::io::Result<Running> {
    let (stop_tx, stop) = watch::channel(false);
    let max_conns = store.config().limits.max_connections;
    let ctx = Arc::new(Ctx {
        store,
        metrics: NetMetrics::default(),
        conns: Arc::new(Semaphore::new(max_conns)),
        stop: stop.clone(),
    });
    let tcp_l = TcpListener::bind(tcp).await?;
    let http_l = TcpListener::bind(http).await?;
    let (tcp_addr, http_addr) = (tcp_l.local_addr()?, http_l.local_addr()?);
    let mut tasks = Vec::new();
    {
        let ctx = ctx.clone();
        let mut stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    acc = tcp_l.accept() => match acc {
                        Ok((sock, _)) => { tokio::spawn(tcp_conn(ctx.clone(), sock)); }
                        Err(e) => tracing::warn!(error = %e, "accept failed"),
                    }
                }
            }
        }));
    }
    {
        let app = router(ctx.clone());
        let mut stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let r = axum::serve(http_l, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.changed().await;
                })
                .await;
            if let Err(e) = r {
                tracing::error!(error = %e, "http server stopped");
            }
        }));
    }
    tracing::info!(%tcp_addr, %http_addr, "log service listening");
    Ok(Running {
        tcp: tcp_addr,
        http: http_addr,
        stop: stop_tx,
        tasks,
    })
}

async fn tcp_conn(ctx: Arc<Ctx>, sock: TcpStream) {
    let _ = sock.set_nodelay(true);
    let max = ctx.store.config().limits.max_frame_bytes as usize;
    let (r, w) = sock.into_split();
    let frames = FramedRead::new(r, FrameDecoder::new(max)).map(|f| match f {
        Ok(Incoming::Frame(b)) => Ok(b),
        // Named by its header: only that request fails.
        Ok(Incoming::Oversized { corr, len, limit }) => Err(Refused {
            corr,
            response: protocol::too_large(
                len,
                limit,
                format!(
                    "frame of {len} bytes exceeds the service's limits.max_frame_bytes {limit}; \
                     the request was not executed; split the batch or raise the limit"
                ),
            ),
            close: false,
        }),
        Err(e) => Err(Refused::closing(
            if e.kind() == std::io::ErrorKind::InvalidData {
                Code::TooLarge
            } else {
                Code::BadFrame
            },
            e.to_string(),
        )),
    });
    let mut sink = FramedWrite::new(w, tcp_frames::encoder(max));
    let (tx, mut rx) = mpsc::channel::<Bytes>(ctx.store.config().limits.max_in_flight * 2);
    let writer = tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if sink.feed(f).await.is_err() {
                return;
            }
            // Coalesce: flush once the queue is empty.
            while let Ok(f) = rx.try_recv() {
                if sink.feed(f).await.is_err() {
                    return;
                }
            }
            if SinkExt::<Bytes>::flush(&mut sink).await.is_err() {
                return;
            }
        }
    });
    let rights = ctx.open_rights();
    serve_frames(ctx, frames, tx, rights).await;
    let _ = writer.await;
}

fn send_now(tx: &mpsc::Sender<Bytes>, corr: u64, r: &Response) {
    let _ = tx.try_send(protocol::encode_response(corr, r));
}

/// A frame refused before it was decoded, and the error frame that says so.
struct Refused {
    /// The request it answers (0: none could be read).
    corr: u64,
    response: Response,
    /// Whether the byte stream is out of step, so the connection must end.
    close: bool,
}

impl Refused {
    /// A refusal that ends the connection.
    fn closing(code: Code, message: String) -> Refused {
        Refused::ending(protocol::error(code, message))
    }

    /// A refusal that ends the connection, answered with `response`.
    fn ending(response: Response) -> Refused {
        Refused {
            corr: 0,
            response,
            close: true,
        }
    }
}

/// Serves one connection's frames; answers go to `tx`.
async fn serve_frames<S>(
    ctx: Arc<Ctx>,
    mut frames: S,
    tx: mpsc::Sender<Bytes>,
    mut rights: Option<Rights>,
) where
    S: Stream<Item = Result<Bytes, Refused>> + Unpin,
{
    let Ok(conn_permit) = ctx.conns.clone().try_acquire_owned() else {
        ctx.metrics
            .connections_refused
            .fetch_add(1, Ordering::Relaxed);
        let _ = tx
            .send(protocol::encode_response(
                0,
                &protocol::error(Code::Busy, "connection limit reached; retry later"),
            ))
            .await;
        return;
    };
    ctx.metrics
        .connections_total
        .fetch_add(1, Ordering::Relaxed);
    ctx.metrics.connections_open.fetch_add(1, Ordering::Relaxed);
    let limits = ctx.store.config().limits.clone();
    let in_flight = Arc::new(Semaphore::new(limits.max_in_flight));
    let mut stop = ctx.stop.clone();
    let mut subs = 0usize;
    // Ends this connection's subscriptions when the connection ends.
    let (done_tx, done) = watch::channel(false);
    loop {
        let frame = tokio::select! {
            _ = stop.changed() => break,
            f = frames.next() => f,
        };
        let frame = match frame {
            None => break,
            Some(Err(refused)) => {
                ctx.metrics.error_frames.fetch_add(1, Ordering::Relaxed);
                let _ = tx
                    .send(protocol::encode_response(refused.corr, &refused.response))
                    .await;
                // Out of step, or not yet entitled to more answers.
                if refused.close || rights.is_none() {
                    break;
                }
                continue;
            }
            Some(Ok(f)) => f,
        };
        ctx.metrics.frames_in.fetch_add(1, Ordering::Relaxed);
        let (corr, req) = match protocol::decode_request(&frame) {
            Ok(x) => x,
            Err((corr, e)) => {
                ctx.metrics.error_frames.fetch_add(1, Ordering::Relaxed);
                let code = if matches!(e, protocol::FrameError::Version(_)) {
                    Code::Version
                } else {
                    Code::BadFrame
                };
                send_now(&tx, corr, &protocol::error(code, e.to_string()));
                continue;
            }
        };
        if let Request::Hello { token } = &req {
            match ctx.rights_for(token) {
                Some(r) => {
                    rights = Some(r);
                    let _ = tx
                        .send(protocol::encode_response(corr, &Response::HelloOk))
                        .await;
                    continue;
                }
                None => {
                    ctx.metrics.auth_failures.fetch_add(1, Ordering::Relaxed);
                    let _ = tx
                        .send(protocol::encode_response(
                            corr,
                            &protocol::error(Code::Unauthorized, "unknown token"),
                        ))
                        .await;
                    break;
                }
            }
        }
        let Some(r) = &rights else {
            ctx.metrics.auth_failures.fetch_add(1, Ordering::Relaxed);
            let _ = tx
                .send(protocol::encode_response(
                    corr,
                    &protocol::error(Code::Unauthorized, "send Hello with a token first"),
                ))
                .await;
            break;
        };
        if let Err(why) = allowed(r, &req) {
            ctx.metrics.error_frames.fetch_add(1, Ordering::Relaxed);
            let _ = tx
                .send(protocol::encode_response(
                    corr,
                    &protocol::error(Code::Forbidden, why),
                ))
                .await;
            continue;
        }
        if let Request::Subscribe { log, from } = req {
            if subs >= 64 {
                send_now(
                    &tx,
                    corr,
                    &protocol::error(Code::Busy, "at most 64 subscriptions per connection"),
                );
                continue;
            }
            subs += 1;
            tokio::spawn(subscription(
                ctx.store.clone(),
                tx.clone(),
                done.clone(),
                corr,
                log,
                from,
            ));
            continue;
        }
        // Back-pressure: stop reading this connection while it has
        // max_in_flight requests outstanding.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let store = ctx.store.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let resp = execute(&store, req).await;
            let _ = tx.send(protocol::encode_response(corr, &resp)).await;
            drop(permit);
        });
    }
    let _ = done_tx.send(true);
    ctx.metrics.connections_open.fetch_sub(1, Ordering::Relaxed);
    drop(conn_permit);
}

fn allowed(r: &Rights, req: &Request) -> Result<(), String> {
    let (log, need_append) = match req {
        Request::Append { log, .. }
        | Request::AppendBatch { log, .. }
        | Request::Trim { log, .. } => (log, true),
        Request::Read { log, .. } | Request::Bounds { log } | Request::Subscribe { log, .. } => {
            (log, false)
        }
        Request::Ping | Request::Hello { .. } => return Ok(()),
    };
    if !r.covers(log) {
        return Err(format!("token has no rights on log {log:?}"));
    }
    if need_append && !r.append {
        return Err("token may not append or trim".into());
    }
    if !need_append && !r.read {
        return Err("token may not read".into());
    }
    Ok(())
}

async fn execute(store: &Store, req: Request) -> Response {
    let res: Result<Response, StoreError> = match req {
        Request::Append {
            log,
            client,
            request,
            bytes,
        } => store
            .append(&log, client, request, bytes)
            .await
            .map(|pos| Response::Appended { pos }),
        Request::Read { log, pos } => store.read(&log, pos).map(|e| Response::Entry {
            pos,
            bytes: Bytes::from_owner(e),
        }),
        Request::Bounds { log } => crate::store::check_log_name(&log).map(|_| {
            let (first, tail) = store.bounds(&log);
            Response::Bounds { first, tail }
        }),
        Request::Trim { log, pos } => store.trim(&log, pos).await.map(|_| Response::Done),
        Request::AppendBatch {
            log,
            client,
            first_request,
            records,
        } => store
            .append_many(&log, client, first_request, records)
            .await
            .map(|positions| Response::AppendedBatch { positions }),
        Request::Ping => Ok(Response::Pong),
        Request::Hello { .. } | Request::Subscribe { .. } => Ok(Response::Done),
    };
    res.unwrap_or_else(|e| protocol::store_error(&e))
}

/// Pushes every entry of `log` from `from` on: catch up by reading, then
/// follow the broadcast; a lag or a gap is filled by reading again.
async fn subscription(
    store: Arc<Store>,
    tx: mpsc::Sender<Bytes>,
    mut done: watch::Receiver<bool>,
    corr: u64,
    log: String,
    from: u64,
) {
    if let Err(e) = crate::store::check_log_name(&log) {
        let _ = tx
            .send(protocol::encode_response(corr, &protocol::store_error(&e)))
            .await;
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
            let _ = tx
                .send(protocol::encode_response(corr, &protocol::store_error(&e)))
                .await;
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
            if tx
                .send(protocol::encode_response(corr, &resp))
                .await
                .is_err()
            {
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
                if tx
                    .send(protocol::encode_response(corr, &resp))
                    .await
                    .is_err()
                {
                    return;
                }
                next += 1;
            }
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {} // read the gap
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

fn router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/stats", get(stats))
        .route("/v1/segments", get(segments))
        .route("/v1/logs/{log}/append", post(http_append))
        .route("/v1/logs/{log}/entries/{pos}", get(http_read))
        .route("/v1/logs/{log}/tail", get(http_tail))
        .route("/v1/logs/{log}/trim/{pos}", post(http_trim))
        .route("/v1/ws", get(ws_upgrade))
        .with_state(ctx)
}

fn http_error(status: StatusCode, msg: impl Into<String>) -> HttpResponse {
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

fn store_http_error(e: &StoreError) -> HttpResponse {
    let status = match e {
        StoreError::BadLogName(_) | StoreError::TrimBeyondTail { .. } => StatusCode::BAD_REQUEST,
        StoreError::NotYetWritten { .. } => StatusCode::NOT_FOUND,
        StoreError::Trimmed { .. } => StatusCode::GONE,
        StoreError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        StoreError::Full(_) | StoreError::NoSpace(_) | StoreError::Exhausted(_) => {
            StatusCode::INSUFFICIENT_STORAGE
        }
        StoreError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        StoreError::WriteFailed(_) | StoreError::Unrecoverable { .. } => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    http_error(status, e.to_string())
}

fn http_rights(ctx: &Ctx, headers: &HeaderMap) -> Result<Rights, Box<HttpResponse>> {
    if let Some(r) = ctx.open_rights() {
        return Ok(r);
    }
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match token.and_then(|t| ctx.rights_for(t)) {
        Some(r) => Ok(r),
        None => {
            ctx.metrics.auth_failures.fetch_add(1, Ordering::Relaxed);
            Err(Box::new(http_error(
                StatusCode::UNAUTHORIZED,
                "send Authorization: Bearer <token>",
            )))
        }
    }
}

fn check(ctx: &Ctx, headers: &HeaderMap, req: &Request) -> Result<(), Box<HttpResponse>> {
    ctx.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    let r = http_rights(ctx, headers)?;
    allowed(&r, req).map_err(|why| Box::new(http_error(StatusCode::FORBIDDEN, why)))
}

async fn health(State(ctx): State<Arc<Ctx>>) -> HttpResponse {
    let s = ctx.store.stats();
    match ctx.store.appends_refused() {
        None => Json(json!({ "status": "ok", "logs": s.logs.len(), "segments": s.segments }))
            .into_response(),
        // Reads still work; a probe that routes appends here must not.
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "refusing_appends",
                "reason": why,
                "logs": s.logs.len(),
                "segments": s.segments
            })),
        )
            .into_response(),
    }
}

async fn stats(State(ctx): State<Arc<Ctx>>, headers: HeaderMap) -> HttpResponse {
    if let Err(r) = http_rights(&ctx, &headers) {
        return *r;
    }
    Json(json!({ "store": ctx.store.stats(), "recovery": ctx.store.recovery() })).into_response()
}

async fn segments(State(ctx): State<Arc<Ctx>>, headers: HeaderMap) -> HttpResponse {
    if let Err(r) = http_rights(&ctx, &headers) {
        return *r;
    }
    Json(ctx.store.segments().await).into_response()
}

async fn metrics(State(ctx): State<Arc<Ctx>>) -> HttpResponse {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::registry::Registry;
    let s = ctx.store.stats();
    let m = &ctx.metrics;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut reg = Registry::with_prefix("melddb_log");
    let counters: [(&str, &str, u64); 25] = [
        ("appends", "Acknowledged appends", s.appends),
        (
            "append_bytes",
            "Bytes of acknowledged appends",
            s.append_bytes,
        ),
        ("batches", "Writer batches", s.batches),
        ("stripes", "Stripes written", s.stripes),
        (
            "bytes_written",
            "Bytes written to segments (pages, parity, end-writes)",
            s.bytes_written,
        ),
        ("fsyncs", "fsync calls", s.fsyncs),
        (
            "write_backs",
            "Segment files written back without their own fsync, made durable by the round's device flush",
            s.write_backs,
        ),
        (
            "flushes",
            "Device cache flushes ending fsync rounds with write-back files",
            s.flushes,
        ),
        (
            "rounds_on_writer",
            "fsync rounds the writer ran itself (small batches) instead of the helpers",
            s.rounds_on_writer,
        ),
        (
            "direct_write_bytes",
            "Bytes written to segments with O_DIRECT by the fsync helpers, not through the page cache",
            s.direct_write_bytes,
        ),
        (
            "write_us",
            "Microseconds the writer spent building and writing batches",
            s.write_us,
        ),
        (
            "sync_us",
            "Microseconds the writer waited for fsync rounds",
            s.sync_us,
        ),
        ("reads", "Record reads", s.reads),
        (
            "reads_whole_stripe",
            "Reads answered from whole stripes: records spanning stripes, or record bytes that failed their checksum",
            s.reads_whole_stripe,
        ),
        (
            "pages_rebuilt",
            "Pages rebuilt from parity on read",
            s.pages_rebuilt,
        ),
        (
            "segments_repaired",
            "Segment files rebuilt",
            s.segments_repaired,
        ),
        (
            "write_failures",
            "Append batches that failed",
            s.write_failures,
        ),
        (
            "segments_freed",
            "Segment files freed by trim",
            s.segments_freed,
        ),
        (
            "segments_prepared",
            "Spare segment files written full of zeros (prepared_segments)",
            s.segments_prepared,
        ),
        (
            "spares_failed",
            "Spare segments whose writing failed (a full disk, most likely); retried every 10 s",
            s.spares_failed,
        ),
        (
            "connections",
            "Connections accepted",
            g(&m.connections_total),
        ),
        (
            "connections_refused",
            "Connections refused at the limit",
            g(&m.connections_refused),
        ),
        ("frames_in", "Protocol frames received", g(&m.frames_in)),
        (
            "error_frames",
            "Malformed, oversized or refused frames",
            g(&m.error_frames),
        ),
        (
            "auth_failures",
            "Requests with a missing or unknown token",
            g(&m.auth_failures),
        ),
    ];
    for (name, help, v) in counters {
        let c: Counter = Counter::default();
        c.inc_by(v);
        reg.register(name, help, c);
    }
    let gauges: [(&str, &str, u64); 5] = [
        (
            "connections_open",
            "Open connections",
            g(&m.connections_open),
        ),
        ("segments", "Segment files", s.segments),
        ("http_requests", "HTTP API requests", g(&m.http_requests)),
        (
            "durable",
            "1 if appends are synced to the disk before they are acknowledged (fsync = true)",
            u64::from(s.durable),
        ),
        (
            "thp_disabled",
            "1 if transparent huge pages are off for the service's process",
            u64::from(s.thp_disabled),
        ),
    ];
    for (name, help, v) in gauges {
        let gg: Gauge = Gauge::default();
        gg.set(v as i64);
        reg.register(name, help, gg);
    }
    // An info-style gauge: 1 per device, the scheduler in a label, so a
    // dashboard shows which queue the latencies were measured on.
    let schedulers: Family<Vec<(String, String)>, Gauge> = Family::default();
    for d in &s.io_schedulers {
        schedulers
            .get_or_create(&vec![
                ("device".to_string(), d.device.clone()),
                ("scheduler".to_string(), d.scheduler.clone()),
            ])
            .set(1);
    }
    reg.register(
        "io_scheduler",
        "1 for each block device under the zones, labelled with the I/O scheduler its queue ran when the service opened",
        schedulers,
    );
    let stages = ctx.store.stages();
    for (info, h) in stages.rows() {
        reg.register(info.metric, info.help, h.clone());
    }
    let mut out = String::new();
    if encode(&mut out, &reg).is_err() {
        return http_error(StatusCode::INTERNAL_SERVER_ERROR, "metrics encoding failed");
    }
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

fn header_u64(headers: &HeaderMap, name: &str) -> u64 {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn http_append(
    State(ctx): State<Arc<Ctx>>,
    Path(log): Path<String>,
    headers: HeaderMap,
    body: AxBytes,
) -> HttpResponse {
    let req = Request::Append {
        log: log.clone(),
        client: header_u64(&headers, "x-client-id"),
        request: header_u64(&headers, "x-request-id"),
        bytes: body,
    };
    if let Err(r) = check(&ctx, &headers, &req) {
        return *r;
    }
    let Request::Append {
        client,
        request,
        bytes,
        ..
    } = req
    else {
        unreachable!("built above")
    };
    match ctx
        .store
        .append(&log, client, request, bytes.to_vec())
        .await
    {
        Ok(pos) => Json(json!({ "pos": pos })).into_response(),
        Err(e) => store_http_error(&e),
    }
}

async fn http_read(
    State(ctx): State<Arc<Ctx>>,
    Path((log, pos)): Path<(String, u64)>,
    headers: HeaderMap,
) -> HttpResponse {
    if let Err(r) = check(
        &ctx,
        &headers,
        &Request::Read {
            log: log.clone(),
            pos,
        },
    ) {
        return *r;
    }
    match ctx.store.read(&log, pos) {
        Ok(e) => (
            [("content-type", "application/octet-stream")],
            Bytes::from_owner(e),
        )
            .into_response(),
        Err(e) => store_http_error(&e),
    }
}

async fn http_tail(
    State(ctx): State<Arc<Ctx>>,
    Path(log): Path<String>,
    headers: HeaderMap,
) -> HttpResponse {
    if let Err(r) = check(&ctx, &headers, &Request::Bounds { log: log.clone() }) {
        return *r;
    }
    if let Err(e) = crate::store::check_log_name(&log) {
        return store_http_error(&e);
    }
    let (first, tail) = ctx.store.bounds(&log);
    Json(json!({ "first": first, "tail": tail })).into_response()
}

async fn http_trim(
    State(ctx): State<Arc<Ctx>>,
    Path((log, pos)): Path<(String, u64)>,
    headers: HeaderMap,
) -> HttpResponse {
    if let Err(r) = check(
        &ctx,
        &headers,
        &Request::Trim {
            log: log.clone(),
            pos,
        },
    ) {
        return *r;
    }
    match ctx.store.trim(&log, pos).await {
        Ok(()) => Json(json!({ "first": pos })).into_response(),
        Err(e) => store_http_error(&e),
    }
}

async fn ws_upgrade(
    State(ctx): State<Arc<Ctx>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> HttpResponse {
    // Browsers cannot set headers on a WebSocket: a Hello frame works too.
    let rights = http_rights(&ctx, &headers).ok();
    let max = ctx.store.config().limits.max_frame_bytes as usize;
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| ws_conn(ctx, socket, rights))
}

/// How long a WebSocket connection that was refused stays open after its
/// close frame, so the peer reads the error before the socket resets.
const WS_REFUSAL_LINGER: std::time::Duration = std::time::Duration::from_millis(250);

/// A refused WebSocket message: the error frame (connection-level, so
/// correlation id 0) and the close frame that ends the connection.
fn ws_refusal(close: u16, response: Response) -> (Refused, CloseFrame) {
    // A close reason is at most 123 bytes; the error frame has the whole text.
    let mut reason = match &response {
        Response::Error { message, .. } => message.clone(),
        // Refusals are error frames; anything else has no text to give.
        _ => String::new(),
    };
    if reason.len() > 123 {
        let mut cut = 120;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
        reason.push_str("...");
    }
    (
        Refused::ending(response),
        CloseFrame {
            code: close,
            reason: reason.into(),
        },
    )
}

/// A WebSocket read error as a refusal. A message over the frame limit
/// is refused by the library from its header, before any allocation,
/// but it does not hand over the message's first bytes, so unlike TCP
/// the request cannot be named and the connection ends (close code
/// 1009, "message too big").
fn ws_read_refusal(e: axum::Error) -> (Refused, CloseFrame) {
    let inner = e.into_inner();
    if let Some(tungstenite::Error::Capacity(tungstenite::error::CapacityError::MessageTooLong {
        size,
        max_size,
    })) = inner.downcast_ref::<tungstenite::Error>()
    {
        return ws_refusal(
            close_code::SIZE,
            protocol::too_large(
                *size as u64,
                *max_size as u64,
                format!(
                    "message of {size} bytes exceeds the service's limits.max_frame_bytes {max_size}; \
                     the connection ends; split the batch or raise the limit"
                ),
            ),
        );
    }
    ws_refusal(
        close_code::PROTOCOL,
        protocol::error(Code::BadFrame, inner.to_string()),
    )
}

async fn ws_conn(ctx: Arc<Ctx>, socket: WebSocket, rights: Option<Rights>) {
    let (mut sink, stream) = socket.split();
    // Why the connection ends, for its close frame: a browser shows the
    // close code, not our error frame.
    let close_why = Arc::new(std::sync::Mutex::new(None::<CloseFrame>));
    let why = close_why.clone();
    let frames = stream.filter_map(move |m| {
        let refused = match m {
            Ok(Message::Binary(b)) => return std::future::ready(Some(Ok(b))),
            Ok(Message::Text(_)) => ws_refusal(
                close_code::UNSUPPORTED,
                protocol::error(Code::BadFrame, "text messages are not frames; send binary"),
            ),
            // Ping, pong and close are answered by the library.
            Ok(_) => return std::future::ready(None),
            Err(e) => ws_read_refusal(e),
        };
        if let Ok(mut w) = why.lock() {
            w.get_or_insert(refused.1);
        }
        std::future::ready(Some(Err(refused.0)))
    });
    let frames = Box::pin(frames);
    let (tx, mut rx) = mpsc::channel::<Bytes>(ctx.store.config().limits.max_in_flight * 2);
    let writer = tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if sink.send(Message::Binary(f)).await.is_err() {
                return;
            }
        }
        let why = close_why.lock().ok().and_then(|mut w| w.take());
        let refused = why.is_some();
        let _ = sink.send(Message::Close(why)).await;
        if refused {
            // The refused message's bytes sit unread in the socket, and
            // closing a socket with unread data resets it, which can
            // discard the error and close frames before the peer reads
            // them. Keep the socket open a moment so it can.
            tokio::time::sleep(WS_REFUSAL_LINGER).await;
        }
        let _ = sink.close().await;
    });
    serve_frames(ctx, frames, tx, rights).await;
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `allowed` against the rule as the docs state it, over every
    /// combination: Ping and Hello need nothing; appends, batches and
    /// trims need the log and the append right; reads, bounds and
    /// subscriptions need the log and the read right.
    #[test]
    fn rights_allow_exactly_what_the_rule_says() {
        let requests = |log: &str| {
            let log = log.to_string();
            vec![
                (Request::Ping, None),
                (Request::Hello { token: "t".into() }, None),
                (
                    Request::Append {
                        log: log.clone(),
                        client: 1,
                        request: 1,
                        bytes: Bytes::from_static(b"x"),
                    },
                    Some(true),
                ),
                (
                    Request::AppendBatch {
                        log: log.clone(),
                        client: 1,
                        first_request: 1,
                        records: vec![Bytes::from_static(b"x")],
                    },
                    Some(true),
                ),
                (
                    Request::Trim {
                        log: log.clone(),
                        pos: 1,
                    },
                    Some(true),
                ),
                (
                    Request::Read {
                        log: log.clone(),
                        pos: 1,
                    },
                    Some(false),
                ),
                (Request::Bounds { log: log.clone() }, Some(false)),
                (Request::Subscribe { log, from: 0 }, Some(false)),
            ]
        };
        for read in [false, true] {
            for append in [false, true] {
                for logs in [vec![], vec!["orders".to_string()], vec!["*".to_string()]] {
                    let r = Rights {
                        logs: logs.clone(),
                        read,
                        append,
                    };
                    for log in ["orders", "other"] {
                        let covered = logs.iter().any(|l| l == "*" || l == log);
                        for (req, needs_append) in requests(log) {
                            let want = match needs_append {
                                None => true,
                                Some(true) => covered && append,
                                Some(false) => covered && read,
                            };
                            assert_eq!(allowed(&r, &req).is_ok(), want, "{r:?} on {req:?}");
                        }
                    }
                }
            }
        }
    }
}
