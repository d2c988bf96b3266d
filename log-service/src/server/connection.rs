//! One connection's frames, whichever transport carries them (TCP or
//! WebSocket): the read loop with its authentication and rights checks,
//! back-pressure (at most `max_in_flight` requests outstanding, every
//! answer waiting for room in the connection's bounded answer queue),
//! execution against the store, and starting subscriptions
//! ([`super::subscriptions`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::sync::{mpsc, watch, Semaphore};

use super::context::{allowed, Ctx};
use super::outgoing::Outgoing;
use super::ranges::{read_entries, RangeLimits};
use super::subscriptions::{batch_subscription, subscription};
use crate::config::Rights;
use crate::error::StoreError;
use crate::protocol::{self, Code, Request, Response};
use crate::store::Store;

/// Subscriptions (of either kind) one connection may start.
const MAX_SUBSCRIPTIONS: usize = 64;

/// Queues an answer the read loop gives itself (a refusal, an error, a
/// Hello's answer) under the same back-pressure as an executed request's:
/// it takes an in-flight permit and waits for room in the connection's
/// answer queue, so a client that reads slowly slows the reading of its
/// frames instead of losing answers. False when the connection is gone
/// or the service is stopping.
async fn answer_inline(
    in_flight: &Semaphore,
    tx: &mpsc::Sender<Outgoing>,
    stop: &mut watch::Receiver<bool>,
    corr: u64,
    r: &Response,
) -> bool {
    let send = async {
        let Ok(_permit) = in_flight.acquire().await else {
            return false;
        };
        tx.send(protocol::encode_response(corr, r).into())
            .await
            .is_ok()
    };
    tokio::select! {
        _ = stop.changed() => false,
        sent = send => sent,
    }
}

/// A frame refused before it was decoded, and the error frame that says so.
pub(super) struct Refused {
    /// The request it answers (0: none could be read).
    pub(super) corr: u64,
    /// The error frame.
    pub(super) response: Response,
    /// Whether the byte stream is out of step, so the connection must end.
    pub(super) close: bool,
}

impl Refused {
    /// A refusal that ends the connection.
    pub(super) fn closing(code: Code, message: String) -> Refused {
        Refused::ending(protocol::error(code, message))
    }

    /// A refusal that ends the connection, answered with `response`.
    pub(super) fn ending(response: Response) -> Refused {
        Refused {
            corr: 0,
            response,
            close: true,
        }
    }
}

/// Serves one connection's frames; answers go to `tx`.
pub(super) async fn serve_frames<S>(
    ctx: Arc<Ctx>,
    mut frames: S,
    tx: mpsc::Sender<Outgoing>,
    mut rights: Option<Rights>,
) where
    S: Stream<Item = Result<Bytes, Refused>> + Unpin,
{
    let Ok(conn_permit) = ctx.conns.clone().try_acquire_owned() else {
        ctx.metrics
            .connections_refused
            .fetch_add(1, Ordering::Relaxed);
        let _ = tx
            .send(
                protocol::encode_response(
                    0,
                    &protocol::error(Code::Busy, "connection limit reached; retry later"),
                )
                .into(),
            )
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
                let sent =
                    answer_inline(&in_flight, &tx, &mut stop, refused.corr, &refused.response)
                        .await;
                // Out of step, or not yet entitled to more answers.
                if !sent || refused.close || rights.is_none() {
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
                let error = protocol::error(code, e.to_string());
                if !answer_inline(&in_flight, &tx, &mut stop, corr, &error).await {
                    break;
                }
                continue;
            }
        };
        if let Request::Hello { token } = &req {
            match ctx.rights_for(token) {
                Some(r) => {
                    rights = Some(r);
                    if !answer_inline(&in_flight, &tx, &mut stop, corr, &Response::HelloOk).await {
                        break;
                    }
                    continue;
                }
                None => {
                    ctx.metrics.auth_failures.fetch_add(1, Ordering::Relaxed);
                    let error = protocol::error(Code::Unauthorized, "unknown token");
                    answer_inline(&in_flight, &tx, &mut stop, corr, &error).await;
                    break;
                }
            }
        }
        let Some(r) = &rights else {
            ctx.metrics.auth_failures.fetch_add(1, Ordering::Relaxed);
            let error = protocol::error(Code::Unauthorized, "send Hello with a token first");
            answer_inline(&in_flight, &tx, &mut stop, corr, &error).await;
            break;
        };
        if let Err(why) = allowed(r, &req) {
            ctx.metrics.error_frames.fetch_add(1, Ordering::Relaxed);
            let error = protocol::error(Code::Forbidden, why);
            if !answer_inline(&in_flight, &tx, &mut stop, corr, &error).await {
                break;
            }
            continue;
        }
        if matches!(
            req,
            Request::Subscribe { .. } | Request::SubscribeBatches { .. }
        ) {
            // Counted for the connection's life, whether or not the
            // subscription has ended.
            if subs >= MAX_SUBSCRIPTIONS {
                let error = protocol::error(
                    Code::Busy,
                    format!("at most {MAX_SUBSCRIPTIONS} subscriptions per connection"),
                );
                if !answer_inline(&in_flight, &tx, &mut stop, corr, &error).await {
                    break;
                }
                continue;
            }
            subs += 1;
            let (store, tx, done) = (ctx.store.clone(), tx.clone(), done.clone());
            match req {
                Request::Subscribe { log, from } => {
                    tokio::spawn(subscription(store, tx, done, corr, log, from));
                }
                Request::SubscribeBatches {
                    log,
                    from,
                    max_records,
                    max_bytes,
                } => {
                    let range = (from, max_records, max_bytes);
                    tokio::spawn(batch_subscription(store, tx, done, corr, log, range));
                }
                _ => {}
            }
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
            let _ = tx.send(protocol::encode_response(corr, &resp).into()).await;
            drop(permit);
        });
    }
    let _ = done_tx.send(true);
    ctx.metrics.connections_open.fetch_sub(1, Ordering::Relaxed);
    drop(conn_permit);
}

/// Runs one request against the store; a store error becomes its error
/// answer.
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
        Request::ReadRange {
            log,
            from,
            max_records,
            max_bytes,
        } => {
            let read = RangeLimits::new(store, max_records, max_bytes)
                .and_then(|limits| read_entries(store, &log, from, limits));
            // Its errors are answers already.
            return match read {
                Ok(records) => Response::Entries {
                    first: from,
                    records,
                },
                Err(answer) => answer,
            };
        }
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
        // Answered by the read loop, never executed.
        Request::Hello { .. } | Request::Subscribe { .. } | Request::SubscribeBatches { .. } => {
            Ok(Response::Done)
        }
    };
    res.unwrap_or_else(|e| protocol::store_error(&e))
}
