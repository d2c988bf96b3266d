//! The binary protocol over TCP: one task reads a connection's frames
//! (see [`crate::tcp_frames`] for how an oversized frame is refused
//! without ending the connection), another writes its answers,
//! coalescing them into one flush while more are queued.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::connection::{serve_frames, Refused};
use super::context::Ctx;
use super::outgoing::Outgoing;
use crate::protocol::{self, Code};
use crate::tcp_frames::{self, FrameDecoder, Incoming};

/// Serves one accepted TCP connection until it ends.
pub(super) async fn tcp_conn(ctx: Arc<Ctx>, sock: TcpStream) {
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
    let (tx, mut rx) = mpsc::channel::<Outgoing>(ctx.store.config().limits.max_in_flight * 2);
    let writer = tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if sink.feed(f.take()).await.is_err() {
                return;
            }
            // Coalesce: flush once the queue is empty.
            while let Ok(f) = rx.try_recv() {
                if sink.feed(f.take()).await.is_err() {
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
