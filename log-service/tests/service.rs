//! The service over the network: client, subscriptions, two MeldDB nodes
//! on one log, auth, malformed and oversized frames, connection limits,
//! dropped connections mid-append, WebSocket and HTTP. Everything listens
//! on 127.0.0.1 and is stopped by the test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use melddb::{Database, Isolation, Settings};
use melddb_log::protocol::{self, Code, Request, Response};
use melddb_log::{BlockingLog, Client, ClientError, ClientOptions, Config, Rights, Running, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn config(dir: &Path) -> Config {
    let zones: Vec<PathBuf> = (0..3).map(|z| dir.join(format!("z{z}"))).collect();
    let mut c = Config::with_zones(zones);
    c.page_bytes = 16 << 10;
    c.segment_bytes = 1 << 20;
    c.max_record_bytes = 1 << 20;
    c.limits.max_frame_bytes = (1 << 20) + 1024;
    c
}

async fn start(cfg: Config) -> (Arc<Store>, Running) {
    start_with_faults(cfg, Arc::new(melddb_log::Faults::none())).await
}

/// [`start`] on a store whose writes take the faults armed in `faults`.
async fn start_with_faults(cfg: Config, faults: Arc<melddb_log::Faults>) -> (Arc<Store>, Running) {
    let store = Arc::new(
        tokio::task::spawn_blocking(move || Store::open_with_faults(cfg, faults).unwrap())
            .await
            .unwrap(),
    );
    let running = melddb_log::start_on(store.clone(), "127.0.0.1:0", "127.0.0.1:0")
        .await
        .unwrap();
    (store, running)
}

async fn stop(store: Arc<Store>, running: Running) {
    running.shutdown().await;
    tokio::task::spawn_blocking(move || store.shutdown())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_append_read_and_subscribe_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (store, running) = start(config(dir.path())).await;
    let addr = running.tcp.to_string();
    let c = Client::connect(&addr).await.unwrap();
    // A subscriber from position 0 before anything exists.
    let mut sub = c.subscribe("events", 0);
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let c = Client::connect(&addr).await.unwrap();
                let mut mine = Vec::new();
                for i in 0..50u32 {
                    let body = format!("w{w}-{i}-").repeat(1 + (i as usize * 37) % 500);
                    let pos = c.append("events", body.clone()).await.unwrap();
                    mine.push((pos, body));
                }
                mine
            })
        })
        .collect();
    let mut all = BTreeMap::new();
    for w in writers {
        for (p, b) in w.await.unwrap() {
            assert!(all.insert(p, b).is_none(), "position {p} handed out twice");
        }
    }
    assert_eq!(
        all.keys().copied().collect::<Vec<_>>(),
        (0..200).collect::<Vec<_>>()
    );
    for (p, b) in &all {
        assert_eq!(c.read("events", *p).await.unwrap(), Bytes::from(b.clone()));
    }
    for (p, b) in &all {
        let (pos, bytes) = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((pos, bytes), (*p, Bytes::from(b.clone())));
    }
    // A late subscriber catches up from the middle, then follows.
    let mut late = c.subscribe("events", 150);
    for p in 150..200 {
        assert_eq!(late.next().await.unwrap().0, p);
    }
    c.append("events", "one more").await.unwrap();
    assert_eq!(late.next().await.unwrap(), (200, Bytes::from("one more")));
    assert_eq!(sub.next().await.unwrap().0, 200);
    // Logs are independent.
    assert_eq!(c.append("other", "x").await.unwrap(), 0);
    assert_eq!(c.bounds("other").await.unwrap(), (0, 1));
    // Typed errors.
    let e = c.read("events", 999).await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Server {
                code: Code::NotYetWritten,
                a: 999,
                b: 201,
                ..
            }
        ),
        "{e}"
    );
    c.trim("events", 10).await.unwrap();
    let e = c.read("events", 3).await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Server {
                code: Code::Trimmed,
                a: 3,
                b: 10,
                ..
            }
        ),
        "{e}"
    );
    let e = c.append("bad name", "x").await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Server {
                code: Code::BadLogName,
                ..
            }
        ),
        "{e}"
    );
    stop(store, running).await;
}

#[test]
fn two_melddb_nodes_share_one_log_through_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (store, running) = rt.block_on(start(config(dir.path())));
    let addr = running.tcp.to_string();
    let a_log = BlockingLog::connect(&addr, "bank", ClientOptions::default()).unwrap();
    let mut a = Database::create_on(a_log, Settings::default()).unwrap();
    let mut tx = a.begin(Isolation::Serializable);
    for i in 0..10u32 {
        tx.put(format!("acct{i}").as_bytes(), &100u32.to_le_bytes())
            .unwrap();
    }
    a.commit(tx).unwrap();
    let b_log = BlockingLog::connect(&addr, "bank", ClientOptions::default()).unwrap();
    let mut b = Database::open(b_log).unwrap();
    // Transfers from both nodes, interleaved; some conflict and abort.
    let mut committed = 0;
    for round in 0..40u32 {
        let (from, to) = (round % 10, (round * 7 + 3) % 10);
        if from == to {
            continue;
        }
        let node = if round % 2 == 0 { &mut a } else { &mut b };
        node.catch_up().unwrap();
        let mut tx = node.begin(Isolation::Serializable);
        let f = u32::from_le_bytes(
            tx.get(format!("acct{from}").as_bytes()).unwrap().unwrap()[..4]
                .try_into()
                .unwrap(),
        );
        let t = u32::from_le_bytes(
            tx.get(format!("acct{to}").as_bytes()).unwrap().unwrap()[..4]
                .try_into()
                .unwrap(),
        );
        tx.put(format!("acct{from}").as_bytes(), &(f - 1).to_le_bytes())
            .unwrap();
        tx.put(format!("acct{to}").as_bytes(), &(t + 1).to_le_bytes())
            .unwrap();
        if node.commit(tx).unwrap().is_committed() {
            committed += 1;
        }
    }
    a.catch_up().unwrap();
    b.catch_up().unwrap();
    assert!(committed > 20);
    assert_eq!(
        a.snapshot().digest(),
        b.snapshot().digest(),
        "both nodes meld the same log to the same state"
    );
    let total: u32 = (0..10u32)
        .map(|i| {
            u32::from_le_bytes(
                a.get(format!("acct{i}").as_bytes()).unwrap()[..4]
                    .try_into()
                    .unwrap(),
            )
        })
        .sum();
    assert_eq!(total, 1000);
    // A third node opened after a restart of the service sees the same.
    rt.block_on(stop(store, running));
    let (store, running) = rt.block_on(start(config(dir.path())));
    let c = Database::open(
        BlockingLog::connect(&running.tcp.to_string(), "bank", ClientOptions::default()).unwrap(),
    )
    .unwrap();
    assert_eq!(c.snapshot().digest(), a.snapshot().digest());
    rt.block_on(stop(store, running));
}

async fn raw_connect(addr: &str) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

async fn send_frame(s: &mut TcpStream, body: &[u8]) {
    s.write_all(&(body.len() as u32).to_le_bytes())
        .await
        .unwrap();
    s.write_all(body).await.unwrap();
}

/// Reads one response; `None` on EOF.
async fn recv_frame(s: &mut TcpStream) -> Option<(u64, Response)> {
    let mut len = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut len))
        .await
        .ok()?
        .ok()?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).await.ok()?;
    Some(protocol::decode_response(&Bytes::from(body)).unwrap())
}

fn code_of(r: &Response) -> Option<Code> {
    match r {
        Response::Error { code, .. } => Some(*code),
        _ => None,
    }
}

/// A raw connection that said Hello with `token` and was accepted.
async fn authenticated(addr: &str, token: &str) -> TcpStream {
    let mut s = raw_connect(addr).await;
    let hello = Request::Hello {
        token: token.into(),
    };
    send_frame(&mut s, &protocol::encode_request(1, &hello)).await;
    assert_eq!(recv_frame(&mut s).await.unwrap().1, Response::HelloOk);
    s
}

/// A one-byte append to `log`, without a request id.
fn append_to(log: &str) -> Request {
    Request::Append {
        log: log.into(),
        client: 0,
        request: 0,
        bytes: Bytes::from_static(b"x"),
    }
}

/// One HTTP/1.1 request on a connection of its own, with an optional
/// bearer token: status and body.
async fn http_with_token(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status: u16 = text[9..12].parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

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
async fn malformed_oversized_and_unauthorized_frames_are_refused_and_the_service_survives() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.tokens.insert(
        "writer".into(),
        Rights {
            logs: vec!["*".into()],
            read: true,
            append: true,
        },
    );
    cfg.tokens.insert(
        "reader".into(),
        Rights {
            logs: vec!["orders".into()],
            read: true,
            append: false,
        },
    );
    let (store, running) = start(cfg).await;
    let addr = running.tcp.to_string();

    // No Hello: refused and closed.
    let mut s = raw_connect(&addr).await;
    send_frame(&mut s, &protocol::encode_request(1, &Request::Ping)).await;
    assert_eq!(
        code_of(&recv_frame(&mut s).await.unwrap().1),
        Some(Code::Unauthorized)
    );
    assert!(recv_frame(&mut s).await.is_none(), "closed after refusal");

    // Bad token.
    let mut s = raw_connect(&addr).await;
    send_frame(
        &mut s,
        &protocol::encode_request(
            1,
            &Request::Hello {
                token: "nope".into(),
            },
        ),
    )
    .await;
    assert_eq!(
        code_of(&recv_frame(&mut s).await.unwrap().1),
        Some(Code::Unauthorized)
    );

    // Reader: may read its log, may not append, may not touch others.
    let mut s = authenticated(&addr, "reader").await;
    send_frame(&mut s, &protocol::encode_request(2, &append_to("orders"))).await;
    assert_eq!(
        code_of(&recv_frame(&mut s).await.unwrap().1),
        Some(Code::Forbidden)
    );
    send_frame(
        &mut s,
        &protocol::encode_request(
            3,
            &Request::Bounds {
                log: "secret".into(),
            },
        ),
    )
    .await;
    assert_eq!(
        code_of(&recv_frame(&mut s).await.unwrap().1),
        Some(Code::Forbidden)
    );
    send_frame(
        &mut s,
        &protocol::encode_request(
            4,
            &Request::Bounds {
                log: "orders".into(),
            },
        ),
    )
    .await;
    assert_eq!(
        recv_frame(&mut s).await.unwrap(),
        (4, Response::Bounds { first: 0, tail: 0 })
    );

    // Garbage: wrong version, unknown type, truncated fields -> error
    // frames, and the connection still works.
    send_frame(&mut s, &[9, 1, 0, 0]).await;
    assert_eq!(
        code_of(&recv_frame(&mut s).await.unwrap().1),
        Some(Code::Version)
    );
    let mut unknown = protocol::encode_request(5, &Request::Ping).to_vec();
    unknown[1] = 99;
    send_frame(&mut s, &unknown).await;
    assert_eq!(
        recv_frame(&mut s).await.unwrap(),
        (5, protocol::error(Code::BadFrame, "unknown frame type 99"))
    );
    send_frame(
        &mut s,
        &protocol::encode_request(
            6,
            &Request::Read {
                log: "orders".into(),
                pos: 1,
            },
        )[..12],
    )
    .await;
    assert_eq!(
        code_of(&recv_frame(&mut s).await.unwrap().1),
        Some(Code::BadFrame)
    );
    send_frame(&mut s, &protocol::encode_request(7, &Request::Ping)).await;
    assert_eq!(recv_frame(&mut s).await.unwrap(), (7, Response::Pong));

    // An oversized frame of this protocol: refused under its own
    // correlation id before it is read whole, and the connection goes on.
    let limit = (1u64 << 20) + 1024;
    let big = protocol::encode_request(
        8,
        &Request::Append {
            log: "orders".into(),
            client: 1,
            request: 1,
            bytes: Bytes::from(vec![5u8; 2 << 20]),
        },
    );
    assert!(big.len() as u64 > limit);
    s.write_all(&(big.len() as u32).to_le_bytes())
        .await
        .unwrap();
    s.write_all(&big[..10]).await.unwrap();
    // Answered from the header alone, while the rest is still unsent.
    match recv_frame(&mut s).await.unwrap() {
        (
            8,
            Response::Error {
                code,
                a,
                b,
                message,
            },
        ) => {
            assert_eq!(code, Code::TooLarge);
            assert_eq!((a, b), (big.len() as u64, limit));
            assert!(message.contains("max_frame_bytes"), "{message}");
        }
        other => panic!("expected TooLarge for request 8, got {other:?}"),
    }
    s.write_all(&big[10..]).await.unwrap();
    send_frame(&mut s, &protocol::encode_request(9, &Request::Ping)).await;
    assert_eq!(recv_frame(&mut s).await.unwrap(), (9, Response::Pong));
    // Nothing of it was executed: the reader may not append anyway, so
    // check the log's bounds did not move.
    send_frame(
        &mut s,
        &protocol::encode_request(
            10,
            &Request::Bounds {
                log: "orders".into(),
            },
        ),
    )
    .await;
    assert_eq!(
        recv_frame(&mut s).await.unwrap(),
        (10, Response::Bounds { first: 0, tail: 0 })
    );

    // An oversized length prefix whose frame is not this protocol's:
    // refused before allocation, connection closed.
    s.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    assert_eq!(
        code_of(&recv_frame(&mut s).await.unwrap().1),
        Some(Code::TooLarge)
    );
    assert!(recv_frame(&mut s).await.is_none());

    // Before Hello, an oversized frame ends the connection as any other
    // frame would.
    let mut s = raw_connect(&addr).await;
    s.write_all(&(big.len() as u32).to_le_bytes())
        .await
        .unwrap();
    s.write_all(&big[..10]).await.unwrap();
    assert_eq!(
        code_of(&recv_frame(&mut s).await.unwrap().1),
        Some(Code::TooLarge)
    );
    assert!(recv_frame(&mut s).await.is_none());

    // A client that sends half a frame and vanishes.
    let mut s = raw_connect(&addr).await;
    s.write_all(&100u32.to_le_bytes()).await.unwrap();
    s.write_all(&[1, 2, 3]).await.unwrap();
    drop(s);

    // The service is unharmed.
    let c = Client::connect_with(
        &addr,
        ClientOptions {
            token: Some("writer".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(c.append("orders", "ok").await.unwrap(), 0);
    let e = Client::connect_with(
        &addr,
        ClientOptions {
            token: Some("bad".into()),
            attempts: 1,
            ..Default::default()
        },
    )
    .await;
    assert!(matches!(e, Err(ClientError::Connect { .. })));
    stop(store, running).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_answers_busy() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.max_connections = 2;
    let (store, running) = start(cfg).await;
    let addr = running.tcp.to_string();
    let mut held = Vec::new();
    for i in 0..2 {
        let mut s = raw_connect(&addr).await;
        send_frame(&mut s, &protocol::encode_request(i, &Request::Ping)).await;
        assert_eq!(recv_frame(&mut s).await.unwrap().1, Response::Pong);
        held.push(s);
    }
    let mut s = raw_connect(&addr).await;
    assert_eq!(
        code_of(&recv_frame(&mut s).await.unwrap().1),
        Some(Code::Busy)
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut s = raw_connect(&addr).await;
    send_frame(&mut s, &protocol::encode_request(9, &Request::Ping)).await;
    assert_eq!(recv_frame(&mut s).await.unwrap().1, Response::Pong);
    stop(store, running).await;
}

/// A proxy that cuts the first `cuts` connections right after forwarding
/// a client's request, before the answer comes back.
async fn cutting_proxy(upstream: String, cuts: usize) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut n = 0usize;
        while let Ok((mut client, _)) = l.accept().await {
            let mut server = TcpStream::connect(&upstream).await.unwrap();
            n += 1;
            let cut = n <= cuts;
            tokio::spawn(async move {
                if cut {
                    let mut buf = vec![0u8; 65536];
                    if let Ok(k) = client.read(&mut buf).await {
                        let _ = server.write_all(&buf[..k]).await;
                    }
                    // Let the append reach the service, then drop both ends.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                } else {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    addr
}

/// A client of `running` through a [`cutting_proxy`] that cuts `cuts`
/// connections, retrying after 5 ms.
async fn client_through_cuts(running: &Running, cuts: usize) -> Client {
    let proxy = cutting_proxy(running.tcp.to_string(), cuts).await;
    let opts = ClientOptions {
        backoff: Duration::from_millis(5),
        ..Default::default()
    };
    Client::connect_with(&proxy, opts).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_mid_append_are_retried_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let (store, running) = start(config(dir.path())).await;
    let c = client_through_cuts(&running, 3).await;
    // The connect itself used connection 1 (cut, but the client has not
    // noticed yet); appends run into cuts 1..3, each after the service got
    // the request, and are retried with the same request id.
    let mut positions = Vec::new();
    for i in 0..10 {
        positions.push(c.append("r", format!("rec{i}")).await.unwrap());
    }
    assert_eq!(positions, (0..10).collect::<Vec<_>>());
    let direct = Client::connect(&running.tcp.to_string()).await.unwrap();
    assert_eq!(
        direct.bounds("r").await.unwrap(),
        (0, 10),
        "each record exactly once"
    );
    for i in 0..10u64 {
        assert_eq!(
            direct.read("r", i).await.unwrap(),
            Bytes::from(format!("rec{i}"))
        );
    }
    // The same request id sent twice by hand also lands once.
    let a = direct.append_with_id("r", 77, "dup").await.unwrap();
    let b = direct.append_with_id("r", 77, "dup").await.unwrap();
    assert_eq!(a, b);
    assert_eq!(direct.bounds("r").await.unwrap().1, 11);
    // `Client::id` is the id its appends carry: request 77 under it, sent
    // by hand, is the same append; under another id it is a new one.
    let mut s = raw_connect(&running.tcp.to_string()).await;
    for (corr, client, want) in [(3, direct.id(), a), (4, direct.id() ^ 1, 11)] {
        let again = Request::Append {
            log: "r".into(),
            client,
            request: 77,
            bytes: Bytes::from_static(b"dup"),
        };
        send_frame(&mut s, &protocol::encode_request(corr, &again)).await;
        assert_eq!(
            recv_frame(&mut s).await.unwrap(),
            (corr, Response::Appended { pos: want })
        );
    }
    assert_eq!(direct.bounds("r").await.unwrap().1, 12);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_larger_than_a_frame_fails_at_once_and_the_connection_lives() {
    let dir = tempfile::tempdir().unwrap();
    let (store, running) = start(config(dir.path())).await;
    let addr = running.tcp.to_string();
    // A retry would first sleep the backoff, so the time taken shows
    // whether the client retried.
    let backoff = Duration::from_secs(10);
    let opts = ClientOptions {
        max_frame_bytes: 64 << 10,
        backoff,
        ..ClientOptions::default()
    };
    let c = Client::connect_with(&addr, opts).await.unwrap();
    c.append("big", "before").await.unwrap();
    // Too large for the client's own limit: refused before sending,
    // without waiting for retries (the limit will not change).
    let started = std::time::Instant::now();
    let big = Bytes::from(vec![7u8; 64 << 10]);
    let e = tokio::time::timeout(Duration::from_secs(30), c.append("big", big.clone()))
        .await
        .expect("an oversized append must fail, not retry for ever")
        .unwrap_err();
    assert!(
        matches!(e, ClientError::TooLarge { bytes, limit } if bytes > limit && limit == 64 << 10),
        "{e}"
    );
    assert!(e.to_string().contains("exceeds the frame limit"), "{e}");
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        c.append_batch("big", vec![big.slice(..40 << 10), big.slice(..40 << 10)]),
    )
    .await
    .expect("an oversized batch must not hang")
    .unwrap_err();
    assert!(matches!(e, ClientError::TooLarge { .. }), "{e}");
    assert!(
        started.elapsed() < backoff,
        "refused without a retry: {:?}",
        started.elapsed()
    );
    // Nothing was appended, and the same client goes on working; a
    // request of exactly the limit is sent.
    let empty = protocol::encode_request(
        0,
        &Request::Append {
            log: "big".into(),
            client: 0,
            request: 0,
            bytes: Bytes::new(),
        },
    );
    let exact = big.slice(..(64 << 10) - empty.len());
    assert_eq!(c.append("big", exact.clone()).await.unwrap(), 1);
    assert_eq!(c.read("big", 1).await.unwrap(), exact);
    assert_eq!(c.append("big", "after").await.unwrap(), 2);
    assert_eq!(c.read("big", 2).await.unwrap(), Bytes::from("after"));
    stop(store, running).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_over_the_services_frame_limit_fails_at_once_and_other_requests_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let limit = cfg.limits.max_frame_bytes as u64;
    let (store, running) = start(cfg).await;
    let addr = running.tcp.to_string();
    // The client's own limit (64 MiB) is above the service's (1 MiB):
    // the frame goes out and the service refuses it. A retry would sleep
    // the backoff first, so the time taken shows whether one happened.
    let backoff = Duration::from_secs(10);
    let c = Client::connect_with(
        &addr,
        ClientOptions {
            backoff,
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let big = Bytes::from(vec![3u8; 2 << 20]);
    let small: Vec<_> = (0..20)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { c.append("mixed", format!("small {i}")).await })
        })
        .collect();
    let e = tokio::time::timeout(Duration::from_secs(30), c.append("mixed", big))
        .await
        .expect("a refused frame must not be retried for ever")
        .unwrap_err();
    match &e {
        ClientError::Server { code, a, b, .. } => {
            assert_eq!(*code, Code::TooLarge, "{e}");
            assert!(*a > *b && *b == limit, "{e}");
        }
        other => panic!("expected the service's TooLarge, got {other}"),
    }
    // Every request sharing the connection went through.
    let mut positions = Vec::new();
    for t in small {
        positions.push(
            t.await
                .unwrap()
                .expect("a small append on the same connection"),
        );
    }
    positions.sort_unstable();
    assert_eq!(positions, (0..20).collect::<Vec<_>>());
    assert!(
        started.elapsed() < backoff,
        "refused without a retry: {:?}",
        started.elapsed()
    );
    assert_eq!(c.bounds("mixed").await.unwrap(), (0, 20));
    assert_eq!(c.append("mixed", "after").await.unwrap(), 20);
    stop(store, running).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_clients_frame_limit_fails_that_request_only() {
    let dir = tempfile::tempdir().unwrap();
    let (store, running) = start(config(dir.path())).await;
    let addr = running.tcp.to_string();
    let writer = Client::connect(&addr).await.unwrap();
    let big = Bytes::from(vec![4u8; 200 << 10]);
    assert_eq!(writer.append("wide", big.clone()).await.unwrap(), 0);
    assert_eq!(writer.append("wide", "small").await.unwrap(), 1);
    // A reader whose frame limit (64 KiB) is below the entry. A retry
    // would sleep the backoff first.
    let backoff = Duration::from_secs(10);
    let limit = 64usize << 10;
    let reader = Client::connect_with(
        &addr,
        ClientOptions {
            max_frame_bytes: limit,
            backoff,
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let small = {
        let r = reader.clone();
        tokio::spawn(async move { r.read("wide", 1).await })
    };
    let e = tokio::time::timeout(Duration::from_secs(30), reader.read("wide", 0))
        .await
        .expect("an answer too large to receive must not be retried for ever")
        .unwrap_err();
    match &e {
        ClientError::Server {
            code,
            a,
            b,
            message,
        } => {
            assert_eq!(*code, Code::TooLarge, "{e}");
            assert!(*a > big.len() as u64 && *b == limit as u64, "{e}");
            assert!(message.contains("ClientOptions::max_frame_bytes"), "{e}");
        }
        other => panic!("expected TooLarge for the answer, got {other}"),
    }
    assert_eq!(small.await.unwrap().unwrap(), Bytes::from("small"));
    assert_eq!(reader.read("wide", 1).await.unwrap(), Bytes::from("small"));
    // A subscription stops at the entry it cannot receive, every time it
    // is asked, and one from past it works.
    let mut sub = reader.subscribe("wide", 0);
    for _ in 0..2 {
        let e = tokio::time::timeout(Duration::from_secs(30), sub.next())
            .await
            .expect("the subscription must report, not hang")
            .unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::Server {
                    code: Code::TooLarge,
                    ..
                }
            ),
            "{e}"
        );
    }
    let mut sub = reader.subscribe("wide", 1);
    assert_eq!(sub.next().await.unwrap(), (1, Bytes::from("small")));
    assert!(
        started.elapsed() < backoff,
        "no retry: {:?}",
        started.elapsed()
    );
    // A client with room for it reads it.
    assert_eq!(writer.read("wide", 0).await.unwrap(), big);
    stop(store, running).await;
}

#[test]
fn the_log_trait_reports_an_oversized_entry_as_entry_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (store, running) = rt.block_on(start(config(dir.path())));
    let opts = ClientOptions {
        max_frame_bytes: 4096,
        backoff: Duration::from_secs(10),
        ..ClientOptions::default()
    };
    let mut log = BlockingLog::connect(&running.tcp.to_string(), "trait", opts).unwrap();
    let e = melddb::Log::append(&mut log, &[1u8; 4096]).unwrap_err();
    assert!(
        matches!(e, melddb::LogError::EntryTooLarge { len, limit: 4096 } if len > 4096),
        "{e}"
    );
    assert_eq!(melddb::Log::append(&mut log, b"fits").unwrap(), 0);
    drop(log);
    rt.block_on(stop(store, running));
}

/// A full disk (injected: every page write fails with "no space") is
/// error 15 over the binary protocol, 507 over HTTP, and `NoSpace` from
/// the client, which does not retry it (one failed batch per append); once
/// space is back the same client appends again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_no_space_on_every_protocol_and_the_client_does_not_retry_it() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(melddb_log::Faults::none());
    let (store, running) = start_with_faults(config(dir.path()), faults.clone()).await;
    let addr = running.tcp.to_string();
    let c = Client::connect(&addr).await.unwrap();
    assert_eq!(c.append("d", "before").await.unwrap(), 0);
    faults.fill_disk(true);

    let mut s = raw_connect(&addr).await;
    send_frame(&mut s, &protocol::encode_request(5, &append_to("d"))).await;
    let (corr, r) = recv_frame(&mut s).await.unwrap();
    assert_eq!((corr, code_of(&r)), (5, Some(Code::NoSpace)), "{r:?}");

    let (status, body) =
        http_with_token(running.http, "POST", "/v1/logs/d/append", None, b"x").await;
    assert_eq!(status, 507, "{body}");
    assert!(body.contains("no space left"), "{body}");

    let failures = store.stats().write_failures;
    match c.append("d", "during").await {
        Err(ClientError::Server {
            code: Code::NoSpace,
            message,
            ..
        }) => {
            assert!(message.contains("trim"), "{message}")
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    assert_eq!(
        store.stats().write_failures,
        failures + 1,
        "the client retried"
    );

    faults.fill_disk(false);
    assert_eq!(c.append("d", "after").await.unwrap(), 1);
    assert_eq!(&c.read("d", 1).await.unwrap()[..], b"after");
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

/// A write that fails (injected: one page write returns an error) is
/// error 9 (`WriteFailed`) over the binary protocol. The batch is rolled
/// back, so the client sends the append again with the same request id:
/// it lands once, at the next position, after exactly one failed write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_is_retried_by_the_client_and_lands_once() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(melddb_log::Faults::none());
    let (store, running) = start_with_faults(config(dir.path()), faults.clone()).await;
    let addr = running.tcp.to_string();
    let c = Client::connect_with(
        &addr,
        ClientOptions {
            backoff: Duration::from_millis(5),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(c.append("w", "before").await.unwrap(), 0);

    faults.fail_write_after(0, false);
    let mut s = raw_connect(&addr).await;
    send_frame(&mut s, &protocol::encode_request(5, &append_to("w"))).await;
    let (corr, r) = recv_frame(&mut s).await.unwrap();
    assert_eq!((corr, code_of(&r)), (5, Some(Code::WriteFailed)), "{r:?}");
    assert_eq!(
        c.bounds("w").await.unwrap(),
        (0, 1),
        "the failed append left nothing"
    );

    let failures = store.stats().write_failures;
    faults.fail_write_after(0, false);
    assert_eq!(c.append("w", "during").await.unwrap(), 1);
    assert_eq!(
        store.stats().write_failures,
        failures + 1,
        "one failed write, then the retry"
    );
    assert_eq!(
        c.bounds("w").await.unwrap(),
        (0, 2),
        "the retry landed once"
    );
    assert_eq!(&c.read("w", 1).await.unwrap()[..], b"during");
    stop(store, running).await;
}

/// A stand-in for the service on 127.0.0.1 that answers every request
/// with the frames `answer` makes of it (none: it drops the connection
/// instead). For answers the real service never gives. Stops with the
/// test's runtime.
async fn fake_service(answer: impl Fn(Request) -> Vec<Response> + Send + Sync + 'static) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut len = [0u8; 4];
                while s.read_exact(&mut len).await.is_ok() {
                    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
                    if s.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let (corr, req) = protocol::decode_request(&Bytes::from(body)).unwrap();
                    let frames = answer(req);
                    if frames.is_empty() {
                        return;
                    }
                    for r in frames {
                        send_frame(&mut s, &protocol::encode_response(corr, &r)).await;
                    }
                }
            });
        }
    });
    addr
}

/// Answers that do not fit the request are protocol errors, not data: a
/// read answered with another position's entry, a batch answered with
/// more or fewer positions than it had records, a subscription that
/// skips a position. An entry the subscription already gave is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_do_not_fit_the_request_are_protocol_errors() {
    let entry = |pos| Response::Entry {
        pos,
        bytes: Bytes::from(format!("entry {pos}")),
    };
    let addr = fake_service(move |req| match req {
        Request::Read { pos, .. } => vec![entry(pos + 1)],
        Request::AppendBatch { records, .. } => vec![Response::AppendedBatch {
            positions: (0..records.len() as u64 + 1).collect(),
        }],
        // One entry again (as after a resume), the one asked for, then a
        // gap.
        Request::Subscribe { from, .. } => vec![entry(from - 1), entry(from), entry(from + 2)],
        _ => vec![Response::Pong],
    })
    .await;
    let c = Client::connect(&addr).await.unwrap();
    let e = c.read("f", 4).await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Protocol(m) if m.contains("read answered")),
        "{e}"
    );
    let e = c
        .append_batch(
            "f",
            vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ClientError::Protocol(m) if m.contains("append batch answered")),
        "{e}"
    );
    let mut sub = c.subscribe("f", 5);
    assert_eq!(sub.next().await.unwrap(), (5, Bytes::from("entry 5")));
    let e = sub.next().await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Protocol(m) if m.contains("skipped from 6 to 7")),
        "{e}"
    );
}

/// A client of `addr` that tries each request `attempts` times, waiting
/// `backoff` (doubling) between tries.
async fn client_with_retries(addr: &str, attempts: u32, backoff: Duration) -> Client {
    let opts = ClientOptions {
        attempts,
        backoff,
        ..Default::default()
    };
    Client::connect_with(addr, opts).await.unwrap()
}

/// Retries wait the backoff, doubling from `ClientOptions::backoff`, and
/// give up after `attempts` tries without waiting after the last one.
/// (Tokio's clock is paused, so the time taken is exactly the waits.)
#[tokio::test(start_paused = true)]
async fn retries_back_off_doubling_and_stop_after_the_last_attempt() {
    let addr = fake_service(|_| Vec::new()).await;
    let backoff = Duration::from_millis(40);
    let c = client_with_retries(&addr, 4, backoff).await;
    let started = tokio::time::Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(60), c.ping())
        .await
        .expect("the retries ended")
        .unwrap_err();
    assert!(
        matches!(e, ClientError::Disconnected { attempts: 4, .. }),
        "{e}"
    );
    assert_eq!(started.elapsed(), backoff * (1 + 2 + 4));
}

/// A batch whose answer is cut off is sent again as a unit with the same
/// request ids: each record lands once, at consecutive positions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_cut_off_mid_append_lands_once() {
    let dir = tempfile::tempdir().unwrap();
    let (store, running) = start(config(dir.path())).await;
    // The connect takes the first connection, which is cut with the
    // first request on it (the batch); the retry meets the second cut.
    let c = client_through_cuts(&running, 2).await;
    let direct = Client::connect(&running.tcp.to_string()).await.unwrap();
    assert_eq!(direct.append("b", "first").await.unwrap(), 0);
    let records: Vec<Bytes> = (0..3).map(|i| Bytes::from(format!("b{i}"))).collect();
    assert_eq!(
        c.append_batch("b", records.clone()).await.unwrap(),
        vec![1, 2, 3]
    );
    assert_eq!(
        direct.bounds("b").await.unwrap(),
        (0, 4),
        "each record once"
    );
    for (i, r) in records.iter().enumerate() {
        assert_eq!(&direct.read("b", i as u64 + 1).await.unwrap(), r);
    }
    stop(store, running).await;
}

/// A subscription whose connection is lost resubscribes, waiting the
/// backoff (times the failures so far when it cannot connect), and gives
/// up after `attempts` failures in a row. (Tokio's clock is paused.)
#[tokio::test(start_paused = true)]
async fn a_subscription_that_cannot_resubscribe_gives_up_after_the_attempts() {
    // One connection, dropped when the subscription arrives; then nothing
    // listens there.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        drop(l);
        let mut len = [0u8; 4];
        let _ = s.read_exact(&mut len).await;
    });
    let backoff = Duration::from_millis(40);
    let c = client_with_retries(&addr, 3, backoff).await;
    let started = tokio::time::Instant::now();
    // A bound in (paused) time: a subscription that never gives up fails
    // here instead of hanging the test.
    let e = tokio::time::timeout(Duration::from_secs(60), c.subscribe("s", 0).next())
        .await
        .expect("the subscription gave up")
        .unwrap_err();
    server.await.unwrap();
    assert!(
        matches!(e, ClientError::Disconnected { attempts: 3, .. }),
        "{e}"
    );
    // Lost once (one backoff), then refused once (two backoffs), then
    // refused for the third time: given up.
    assert_eq!(started.elapsed(), backoff * 3);
}

/// `BlockingLog`'s `first` and `tail` ask the service; when it cannot be
/// reached they return the bounds this node last knew, which its own
/// appends and trims keep up to date.
#[test]
fn the_log_trait_keeps_its_own_bounds_for_when_the_service_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (store, running) = rt.block_on(start(config(dir.path())));
    let opts = ClientOptions {
        attempts: 2,
        backoff: Duration::from_millis(5),
        ..ClientOptions::default()
    };
    let mut log = BlockingLog::connect(&running.tcp.to_string(), "own", opts).unwrap();
    for i in 0..3u8 {
        assert_eq!(melddb::Log::append(&mut log, &[i]).unwrap(), u64::from(i));
    }
    melddb::Log::trim(&mut log, 1).unwrap();
    rt.block_on(stop(store, running));
    assert!(log.refresh().is_err(), "the service is gone");
    assert_eq!((melddb::Log::first(&log), melddb::Log::tail(&log)), (1, 3));
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

/// How many malformed frames the slow-reader tests pipeline: with a
/// connection's answer queue of `2 * max_in_flight` = 8 answers, enough
/// to fill it thousands of times over.
const MALFORMED: u64 = 40_000;

/// A frame of this protocol with an unknown type (99), correlation id
/// `corr`: it fails to decode, and its answer is a BadFrame error.
fn malformed(corr: u64) -> Vec<u8> {
    let mut f = protocol::encode_request(corr, &Request::Ping).to_vec();
    f[1] = 99;
    f
}

/// Reads `MALFORMED` answers from `answers`, slowly (a pause before the
/// first and after every 2,000), and checks each is the BadFrame error
/// for the next correlation id in order.
async fn read_malformed_answers_slowly(
    mut answers: impl futures_util::Stream<Item = (u64, Response)> + Unpin,
) {
    let want = protocol::error(Code::BadFrame, "unknown frame type 99");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for corr in 1..=MALFORMED {
        if corr % 2_000 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let got = answers
            .next()
            .await
            .unwrap_or_else(|| panic!("the connection ended before answer {corr}"));
        assert_eq!(got, (corr, want.clone()), "answer {corr} of {MALFORMED}");
    }
}

fn slow_reader_config(dir: &Path) -> Config {
    let mut cfg = config(dir);
    cfg.limits.max_in_flight = 4;
    cfg
}

/// A client that pipelines tens of thousands of malformed frames over
/// TCP, with a small receive buffer, and reads slowly gets every error
/// answer, in order: error answers wait for room in the answer queue like
/// any other answer instead of being dropped when it is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_frame_is_answered_in_order_however_slowly_the_client_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (store, running) = start(slow_reader_config(dir.path())).await;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let s = sock.connect(running.tcp).await.unwrap();
    let (r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        let mut out = Vec::new();
        for corr in 1..=MALFORMED {
            let f = malformed(corr);
            out.extend_from_slice(&(f.len() as u32).to_le_bytes());
            out.extend_from_slice(&f);
        }
        w.write_all(&out).await.unwrap();
        w
    });
    let answers = futures_util::stream::unfold(r, |mut r| async move {
        let mut len = [0u8; 4];
        r.read_exact(&mut len).await.ok()?;
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        r.read_exact(&mut body).await.ok()?;
        Some((protocol::decode_response(&Bytes::from(body)).unwrap(), r))
    });
    let read = read_malformed_answers_slowly(Box::pin(answers));
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("every answer within a minute");
    let _w = writer.await.unwrap();
    stop(store, running).await;
}

/// [`every_malformed_frame_is_answered_in_order_however_slowly_the_client_reads`]
/// over the WebSocket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_websocket_message_is_answered_in_order_however_slowly_the_client_reads() {
    use tokio_tungstenite::tungstenite::Message;
    let dir = tempfile::tempdir().unwrap();
    let (store, running) = start(slow_reader_config(dir.path())).await;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let s = sock.connect(running.http).await.unwrap();
    let url = format!("ws://{}/v1/ws", running.http);
    let (ws, _) = tokio_tungstenite::client_async(url, s).await.unwrap();
    let (mut sink, stream) = ws.split();
    let writer = tokio::spawn(async move {
        for corr in 1..=MALFORMED {
            sink.feed(Message::Binary(malformed(corr).into()))
                .await
                .unwrap();
        }
        sink.flush().await.unwrap();
        sink
    });
    let answers = stream.filter_map(|m| async move {
        match m {
            Ok(Message::Binary(b)) => Some(protocol::decode_response(&b).unwrap()),
            _ => None,
        }
    });
    let read = read_malformed_answers_slowly(Box::pin(answers));
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("every answer within a minute");
    let _sink = writer.await.unwrap();
    stop(store, running).await;
}
