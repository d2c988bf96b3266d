//! The service's HTTP/JSON routes and WebSocket: tokens and rights,
//! binary frames over WebSocket, tools' routes, health while appends are
//! refused, and append bodies up to `max_record_bytes`. Everything
//! listens on 127.0.0.1 and is stopped by the test.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use melddb_log::protocol::{self, Code, Request, Response};
use melddb_log::{Client, ClientError, Rights, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::net::*;

/// Over HTTP as over the binary protocol: no or an unknown token is 401,
/// a token without the right is 403, and each right allows exactly its
/// operations (an append-only token appends but cannot read back). The
/// binary protocol's append-only case is checked too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_need_a_token_with_the_right_for_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    for (name, logs, read, append) in [
        ("admin", "*", true, true),
        ("reader", "orders", true, false),
        ("dropbox", "orders", false, true),
    ] {
        cfg.tokens.insert(
            name.into(),
            Rights {
                logs: vec![logs.into()],
                read,
                append,
            },
        );
    }
    let (store, running) = start(cfg).await;
    let at = running.http;
    let append = "/v1/logs/orders/append";
    for (token, want) in [
        (None, 401),
        (Some("nope"), 401),
        (Some("reader"), 403),
        (Some("dropbox"), 200),
        (Some("admin"), 200),
    ] {
        let (st, body) = http_with_token(at, "POST", append, token, b"rec").await;
        assert_eq!(st, want, "append with {token:?}: {body}");
    }
    assert_eq!(store.bounds("orders").1, 2, "two appends landed");
    let read = "/v1/logs/orders/entries/1";
    for (token, want) in [
        (None, 401),
        (Some("dropbox"), 403),
        (Some("reader"), 200),
        (Some("admin"), 200),
    ] {
        let (st, body) = http_with_token(at, "GET", read, token, b"").await;
        assert_eq!(st, want, "read with {token:?}: {body}");
        if st == 200 {
            assert_eq!(body, "rec");
        }
    }
    for (method, path, token) in [
        ("GET", "/v1/logs/secret/tail", "reader"),
        ("GET", "/v1/logs/orders/tail", "dropbox"),
        ("POST", "/v1/logs/orders/trim/1", "reader"),
        ("POST", "/v1/logs/secret/append", "dropbox"),
    ] {
        let (st, body) = http_with_token(at, method, path, Some(token), b"x").await;
        assert_eq!(st, 403, "{method} {path} with {token}: {body}");
    }
    let (st, body) = http_with_token(at, "GET", "/v1/logs/orders/tail", Some("reader"), b"").await;
    assert_eq!((st, body.as_str()), (200, "{\"first\":0,\"tail\":2}"));
    assert_eq!(store.bounds("orders"), (0, 2), "nothing refused landed");

    // The binary protocol: the append-only token appends, cannot read.
    let mut s = authenticated(&running.tcp.to_string(), "dropbox").await;
    send_frame(&mut s, &protocol::encode_request(2, &append_to("orders"))).await;
    assert_eq!(
        recv_frame(&mut s).await.unwrap().1,
        Response::Appended { pos: 2 }
    );
    let read = Request::Read {
        log: "orders".into(),
        pos: 2,
    };
    send_frame(&mut s, &protocol::encode_request(3, &read)).await;
    assert_eq!(
        code_of(&recv_frame(&mut s).await.unwrap().1),
        Some(Code::Forbidden)
    );
    drop(s);
    stop(store, running).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_speaks_the_same_frames_and_http_serves_tools() {
    let dir = tempfile::tempdir().unwrap();
    let (store, running) = start(config(dir.path())).await;
    let url = format!("ws://{}/v1/ws", running.http);
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    use tokio_tungstenite::tungstenite::Message;
    let append = Request::Append {
        log: "web".into(),
        client: 5,
        request: 1,
        bytes: Bytes::from_static(b"from a tab"),
    };
    ws.send(Message::Binary(protocol::encode_request(1, &append)))
        .await
        .unwrap();
    let reply = |m: Message| match m {
        Message::Binary(b) => protocol::decode_response(&b).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        reply(ws.next().await.unwrap().unwrap()),
        (1, Response::Appended { pos: 0 })
    );
    ws.send(Message::Binary(protocol::encode_request(
        2,
        &Request::Subscribe {
            log: "web".into(),
            from: 0,
        },
    )))
    .await
    .unwrap();
    assert_eq!(
        reply(ws.next().await.unwrap().unwrap()),
        (
            2,
            Response::Entry {
                pos: 0,
                bytes: Bytes::from_static(b"from a tab")
            }
        )
    );
    ws.send(Message::Text("hello".into())).await.unwrap();
    assert_eq!(
        code_of(&reply(ws.next().await.unwrap().unwrap()).1),
        Some(Code::BadFrame)
    );
    match ws.next().await.unwrap().unwrap() {
        Message::Close(Some(c)) => assert_eq!(
            c.code,
            tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Unsupported,
            "{c:?}"
        ),
        other => panic!("expected a close frame, got {other:?}"),
    }

    // HTTP, spoken by hand.
    let at = running.http;
    let http = |method: &'static str, path: &'static str, body: &'static [u8]| {
        http_with_token(at, method, path, None, body)
    };
    let (st, body) = http("GET", "/health", b"").await;
    assert_eq!(st, 200);
    assert!(body.contains("\"status\":\"ok\""), "{body}");
    let (st, body) = http("POST", "/v1/logs/web/append", b"from curl").await;
    assert_eq!((st, body.as_str()), (200, "{\"pos\":1}"));
    let (st, body) = http("GET", "/v1/logs/web/entries/1", b"").await;
    assert_eq!((st, body.as_str()), (200, "from curl"));
    let (st, body) = http("GET", "/v1/logs/web/tail", b"").await;
    assert_eq!((st, body.as_str()), (200, "{\"first\":0,\"tail\":2}"));
    let (st, _) = http("GET", "/v1/logs/web/entries/9", b"").await;
    assert_eq!(st, 404);
    let (st, body) = http("GET", "/metrics", b"").await;
    assert_eq!(st, 200);
    assert!(body.contains("melddb_log_appends_total 2"), "{body}");
    // The records read above fit one stripe each and are intact: read
    // from their bytes alone.
    assert!(body.contains("melddb_log_reads_total 3"), "{body}");
    // The default syncs before it acknowledges.
    assert!(body.contains("melddb_log_durable 1"), "{body}");
    assert!(
        body.contains("melddb_log_reads_whole_stripe_total 0"),
        "{body}"
    );
    // Both appends passed through every stage; each batch was written.
    assert!(
        body.contains("melddb_log_append_queued_seconds_count 2"),
        "{body}"
    );
    assert!(
        body.contains("melddb_log_append_acked_seconds_count 2"),
        "{body}"
    );
    assert!(
        body.contains("melddb_log_append_acked_seconds_bucket{le=\"+Inf\"} 2"),
        "{body}"
    );
    let batches = store.stats().batches;
    assert!(
        body.contains(&format!("melddb_log_batch_write_seconds_count {batches}")),
        "{body}"
    );
    // Each answered batch is timed; the last one's answer is counted just
    // after its reply went out, so it may not be in yet.
    let answered: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix("melddb_log_batch_answer_seconds_count "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!((1..=batches).contains(&answered), "{body}");
    // One info line per device the stats name, with its scheduler, and
    // no other.
    let schedulers = store.stats().io_schedulers;
    for d in &schedulers {
        let line = format!(
            "melddb_log_io_scheduler{{device=\"{}\",scheduler=\"{}\"}} 1",
            d.device, d.scheduler
        );
        assert!(body.contains(&line), "{line} in {body}");
    }
    assert_eq!(
        body.lines()
            .filter(|l| l.starts_with("melddb_log_io_scheduler{"))
            .count(),
        schedulers.len(),
        "{body}"
    );

    // The segments, as tools see them: every file the store has open
    // (counted apart, in its stats), once each, in id order, in the three
    // zones, with classes that never rise with the id, and after two
    // appends at least one holding root stripes and one the end-writes.
    let (st, body) = http("GET", "/v1/segments", b"").await;
    assert_eq!(st, 200, "{body}");
    let segs: Vec<serde_json::Value> = serde_json::from_str(&body).expect("a JSON array");
    let field =
        |s: &serde_json::Value, k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
    assert_eq!(segs.len() as u64, store.stats().segments, "{body}");
    let ids: Vec<u64> = segs.iter().map(|s| field(s, "id")).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{body}");
    let classes: Vec<u64> = segs.iter().map(|s| field(s, "class")).collect();
    assert!(classes.windows(2).all(|w| w[0] >= w[1]), "{body}");
    assert!(classes.iter().all(|&c| c <= 4), "{body}");
    assert!(segs.iter().all(|s| field(s, "zone") < 3), "{body}");
    assert!(classes.contains(&2) && classes.contains(&3), "{body}");
    assert!(segs.iter().any(|s| field(s, "len") > 0), "{body}");
    stop(store, running).await;
}

/// A WebSocket message over the frame limit is refused from its header:
/// the library cannot hand over the request's correlation id, so the
/// answer is a connection-level TooLarge error frame (with the size and
/// the limit) and a close frame with code 1009, not a generic BadFrame.
/// The service goes on serving other connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_message_over_the_limit_gets_too_large_and_close_1009() {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::Message;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let limit = cfg.limits.max_frame_bytes as u64;
    let (store, running) = start(cfg).await;
    let url = format!("ws://{}/v1/ws", running.http);
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let big = Request::Append {
        log: "web".into(),
        client: 5,
        request: 1,
        bytes: Bytes::from(vec![7u8; 2 << 20]),
    };
    let frame = protocol::encode_request(9, &big);
    let size = frame.len() as u64;
    // The service may close before the whole message is sent.
    let _ = ws.send(Message::Binary(frame)).await;
    let mut error = None;
    let mut close = None;
    while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
        match m {
            Message::Binary(b) => error = Some(protocol::decode_response(&b).unwrap()),
            Message::Close(c) => {
                close = c;
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    match error {
        Some((
            0,
            Response::Error {
                code,
                a,
                b,
                message,
            },
        )) => {
            assert_eq!(code, Code::TooLarge, "{message}");
            assert_eq!((a, b), (size, limit), "{message}");
            assert!(message.contains("max_frame_bytes"), "{message}");
        }
        other => panic!("expected a connection-level TooLarge, got {other:?}"),
    }
    let close = close.expect("a close frame");
    assert_eq!(close.code, CloseCode::Size, "{close:?}");
    assert!(close.reason.len() <= 123, "{close:?}");

    // Unharmed: a new connection appends.
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let small = Request::Append {
        log: "web".into(),
        client: 5,
        request: 2,
        bytes: Bytes::from_static(b"small"),
    };
    ws.send(Message::Binary(protocol::encode_request(1, &small)))
        .await
        .unwrap();
    match ws.next().await.unwrap().unwrap() {
        Message::Binary(b) => assert_eq!(
            protocol::decode_response(&b).unwrap(),
            (1, Response::Appended { pos: 0 })
        ),
        other => panic!("{other:?}"),
    }
    stop(store, running).await;
}

/// While a failed batch's roll back cannot record its discarded stripe
/// numbers (here a directory squats on the metadata's temporary name, so
/// the write fails without root or a full disk), every append is refused
/// and `/health` answers 503 with the reason; once the write works again
/// the next append finishes the roll back, is acknowledged, and
/// `/health` is 200 again. Everything acknowledged survives a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_while_a_roll_back_waits_and_appends_resume_once_it_can_finish() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(melddb_log::Faults::none());
    let cfg = config(dir.path());
    let (store, running) = start_with_faults(cfg.clone(), faults.clone()).await;
    let c = Client::connect(&running.tcp.to_string()).await.unwrap();
    assert_eq!(c.append("h", "first").await.unwrap(), 0);
    let (status, body) = http_with_token(running.http, "GET", "/health", None, b"").await;
    assert_eq!(status, 200, "{body}");

    let squatter = cfg.zones[0].join("meta.json.tmp");
    std::fs::create_dir(&squatter).unwrap();
    faults.fail_write_after(0, false);
    assert!(c.append("h", "lost").await.is_err());
    assert!(store.appends_refused().is_some());
    let (status, body) = http_with_token(running.http, "GET", "/health", None, b"").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("refusing_appends") && body.contains("roll back"),
        "{body}"
    );
    // Still refused, and nothing written: the roll back is retried first.
    let r = c.append("h", "refused").await;
    assert!(
        matches!(
            r,
            Err(ClientError::Server {
                code: Code::WriteFailed,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(store.bounds("h"), (0, 1));

    std::fs::remove_dir(&squatter).unwrap();
    assert_eq!(c.append("h", "second").await.unwrap(), 1);
    assert_eq!(store.appends_refused(), None);
    let (status, body) = http_with_token(running.http, "GET", "/health", None, b"").await;
    assert_eq!(status, 200, "{body}");
    stop(store, running).await;

    let store = tokio::task::spawn_blocking(move || Store::open(cfg).unwrap())
        .await
        .unwrap();
    assert_eq!(store.bounds("h"), (0, 2));
    assert_eq!(&store.read("h", 0).unwrap()[..], b"first");
    assert_eq!(&store.read("h", 1).unwrap()[..], b"second");
}

/// One HTTP/1.1 request on a connection of its own, its body written
/// while the answer is read (a refused body may be left half sent):
/// status and body bytes.
async fn http_bytes(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let (mut r, mut w) = TcpStream::connect(addr).await.unwrap().into_split();
    let writer = tokio::spawn(async move {
        // The service may answer and close before it has read everything.
        let _ = w.write_all(head.as_bytes()).await;
        let _ = w.write_all(&body).await;
        w
    });
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    drop(writer.await);
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let status = std::str::from_utf8(&out[9..12]).unwrap().parse().unwrap();
    (status, out[end + 4..].to_vec())
}

/// An HTTP append takes a record of up to `max_record_bytes`, well past
/// a web framework's usual default body limit of 2 MB: a 4 MiB record
/// reads back byte for byte, and one byte over the limit is 413 with the
/// limit in the error body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_appends_take_records_up_to_max_record_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.segment_bytes = 4 << 20;
    cfg.max_record_bytes = 8 << 20;
    let limit = cfg.max_record_bytes as usize;
    let (store, running) = start(cfg).await;
    let http = running.http;

    let record: Vec<u8> = (0..4usize << 20).map(|i| (i * 7 + i / 251) as u8).collect();
    let (status, body) = http_bytes(http, "POST", "/v1/logs/big/append", record.clone()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let pos: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(pos["pos"], 0);
    let (status, got) = http_bytes(http, "GET", "/v1/logs/big/entries/0", Vec::new()).await;
    assert_eq!(status, 200);
    assert!(got == record, "the 4 MiB record reads back byte for byte");

    let (status, body) = http_bytes(http, "POST", "/v1/logs/big/append", vec![1; limit + 1]).await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 413, "{body}");
    let err: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        err["error"].as_str().unwrap().contains(&limit.to_string()),
        "{body}"
    );
    // Exactly the limit is taken, and nothing refused was appended.
    let (status, body) = http_bytes(http, "POST", "/v1/logs/big/append", vec![2; limit]).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(store.bounds("big"), (0, 2));
    stop(store, running).await;
}
