//! The service's binary protocol over the network: clients and
//! subscriptions, two MeldDB nodes on one log, malformed, oversized and
//! unauthorized frames, connection limits, and error answers for a
//! client that reads slowly. Everything listens on 127.0.0.1 and is
//! stopped by the test. HTTP and WebSocket are in `service_http.rs`, the
//! client under faults in `service_client.rs`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use melddb::{Database, Isolation, Settings};
use melddb_log::protocol::{self, Code, Request, Response};
use melddb_log::{BlockingLog, Client, ClientError, ClientOptions, Config, Rights};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::net::*;

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
        a.snapshot().digest().unwrap(),
        b.snapshot().digest().unwrap(),
        "both nodes meld the same log to the same state"
    );
    let total: u32 = (0..10u32)
        .map(|i| {
            u32::from_le_bytes(
                a.get(format!("acct{i}").as_bytes()).unwrap().unwrap()[..4]
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
    assert_eq!(
        c.snapshot().digest().unwrap(),
        a.snapshot().digest().unwrap()
    );
    rt.block_on(stop(store, running));
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
