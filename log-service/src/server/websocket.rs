//! The binary protocol over WebSocket (`/v1/ws`): one binary message
//! is one frame. Text messages and messages over `max_frame_bytes` end
//! the connection with an error frame and a close frame saying why.

use std::sync::Arc;

use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response as HttpResponse;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;

use super::connection::{serve_frames, Refused};
use super::context::Ctx;
use super::http::http_rights;
use super::outgoing::Outgoing;
use crate::config::Rights;
use crate::protocol::{self, Code, Response};

/// Upgrades `/v1/ws` to a WebSocket that speaks the binary protocol.
pub(super) async fn ws_upgrade(
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

/// Serves one WebSocket: binary messages are frames for
/// [`serve_frames`]; answers go out one message each, then a close frame
/// saying why the connection ended when it was refused.
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
    let (tx, mut rx) = mpsc::channel::<Outgoing>(ctx.store.config().limits.max_in_flight * 2);
    let writer = tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if sink.send(Message::Binary(f.take())).await.is_err() {
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
