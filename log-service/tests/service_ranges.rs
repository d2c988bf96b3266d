//! Range reads and batched subscriptions over the protocol: limits and
//! their caps, the frame limit, errors; every position delivered once and
//! in order across a trim and a service restart; a slow batch consumer
//! holding up nothing else; the subscription limit; WebSocket; answers a
//! client must not take. Everything listens on 127.0.0.1 and is stopped
//! by the test.

mod common;

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use melddb_log::protocol::{self, entries_frame_len, Code, Request, Response};
use melddb_log::{BatchSubscription, Client, ClientError, ClientOptions};

use common::net::*;

/// Record `i` of a test log: its length varies from a few bytes to a few
/// stripes, its bytes say which it is.
fn record(i: u64) -> Bytes {
    let len = match i % 10 {
        0 => 200_000 + i as usize, // spans fragment stripes
        1..=3 => 20_000 + (i as usize * 37) % 9000,
        _ => 1 + (i as usize * 131) % 3000,
    };
    Bytes::from(format!("<{i}>").repeat(len / 3 + 1)[..len].to_string())
}

/// Appends records `from..to` of [`record`] to `log` in batches of five.
async fn append_records(c: &Client, log: &str, from: u64, to: u64) {
    let mut i = from;
    while i < to {
        let end = (i + 5).min(to);
        let at = c
            .append_batch(log, (i..end).map(record).collect())
            .await
            .unwrap();
        assert_eq!(at, (i..end).collect::<Vec<_>>(), "{log}: dense positions");
        i = end;
    }
}

/// A server error's code, numbers.
fn server_error(e: &ClientError) -> Option<(Code, u64, u64)> {
    match e {
        ClientError::Server { code, a, b, .. } => Some((*code, *a, *b)),
        _ => None,
    }
}

/// Checks one range against the records: at `from`, at least one, within
/// the limits, and stopped only at a limit or `tail`.
fn check_range(
    from: u64,
    tail: u64,
    got: &(u64, Vec<Bytes>),
    max_records: usize,
    max_bytes: usize,
) {
    let (first, records) = got;
    assert_eq!(*first, from);
    let n = records.len();
    assert!((1..=max_records).contains(&n), "from {from}: {n} records");
    let bytes: usize = records.iter().map(|r| r.len()).sum();
    assert!(n == 1 || bytes <= max_bytes, "from {from}: {bytes} bytes");
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r, &record(from + i as u64), "record {}", from + i as u64);
    }
    let next = from + n as u64;
    if next < tail {
        assert!(
            n == max_records || bytes + record(next).len() > max_bytes,
            "from {from}: stopped at {next} with room"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_reads_keep_their_limits_caps_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.segment_bytes = 8 << 20;
    // Room for the 4 MiB cap below.
    cfg.limits.max_frame_bytes = 16 << 20;
    let (store, running) = start(cfg).await;
    let c = Client::connect(&running.tcp.to_string()).await.unwrap();
    assert_eq!(c.read_range("r", 0, 10, 100).await.unwrap(), (0, vec![]));
    append_records(&c, "r", 0, 60).await;
    for (max_records, max_bytes) in [(1, 1), (7, 50_000), (100, 1 << 20)] {
        let mut from = 0;
        while from < 60 {
            let got = c
                .read_range("r", from, max_records, max_bytes)
                .await
                .unwrap();
            check_range(from, 60, &got, max_records as usize, max_bytes as usize);
            from += got.1.len() as u64;
        }
    }
    assert_eq!(c.read_range("r", 60, 10, 100).await.unwrap(), (60, vec![]));
    let e = c.read_range("r", 61, 10, 100).await.unwrap_err();
    assert_eq!(server_error(&e), Some((Code::NotYetWritten, 61, 60)), "{e}");
    for (max_records, max_bytes) in [(0, 100), (10, 0), (0, 0)] {
        let e = c
            .read_range("r", 0, max_records, max_bytes)
            .await
            .unwrap_err();
        assert_eq!(server_error(&e).map(|s| s.0), Some(Code::BadFrame), "{e}");
    }
    c.trim("r", 10).await.unwrap();
    let e = c.read_range("r", 9, 10, 100).await.unwrap_err();
    assert_eq!(server_error(&e), Some((Code::Trimmed, 9, 10)), "{e}");
    let got = c.read_range("r", 10, 3, 1 << 20).await.unwrap();
    check_range(10, 60, &got, 3, 1 << 20);

    // The caps: 4096 records, 4 MiB.
    let tiny: Vec<Bytes> = (0..1000u32)
        .map(|i| Bytes::from(i.to_le_bytes().to_vec()))
        .collect();
    for _ in 0..5 {
        c.append_batch("tiny", tiny.clone()).await.unwrap();
    }
    let (_, got) = c.read_range("tiny", 0, u32::MAX, u32::MAX).await.unwrap();
    assert_eq!(got.len(), 4096);
    assert!(got.iter().enumerate().all(|(i, r)| r == &tiny[i % 1000]));
    let big = Bytes::from(vec![7u8; 64 << 10]);
    for _ in 0..10 {
        c.append_batch("big", vec![big.clone(); 8]).await.unwrap();
    }
    let (_, got) = c.read_range("big", 3, u32::MAX, u32::MAX).await.unwrap();
    assert_eq!(got.len(), 64, "4 MiB of 64 KiB records");
    assert!(got.iter().all(|r| r == &big));
    stop(store, running).await;
}

/// No answer exceeds the service's frame limit: a range stops before the
/// record that would take it over, and a record too long for a frame on
/// its own fails with TooLarge (the frame's length and the limit), the
/// connection going on. A client with a small frame limit asks for no
/// more than fits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_answers_never_exceed_the_frame_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.max_frame_bytes = 8192;
    let (store, running) = start(cfg).await;
    let c = Client::connect(&running.tcp.to_string()).await.unwrap();
    for _ in 0..4 {
        c.append("f", vec![1u8; 3000]).await.unwrap();
    }
    // Longer than a frame: appended past the network.
    store.append("f", 0, 0, vec![2u8; 10_000]).await.unwrap();
    let (_, got) = c.read_range("f", 0, u32::MAX, u32::MAX).await.unwrap();
    assert_eq!(
        got.len(),
        2,
        "two records of 3000 bytes fit 8192, three do not"
    );
    assert!(entries_frame_len(got.iter().map(|r| r.len())) <= 8192);
    let (_, got) = c.read_range("f", 2, u32::MAX, u32::MAX).await.unwrap();
    assert_eq!(got.len(), 2, "the long record is left for the next range");
    let e = c.read_range("f", 4, u32::MAX, u32::MAX).await.unwrap_err();
    let want = entries_frame_len([10_000]) as u64;
    assert_eq!(server_error(&e), Some((Code::TooLarge, want, 8192)), "{e}");
    c.ping().await.unwrap();
    let mut sub = c.subscribe_batches("f", 0);
    assert_eq!(sub.next_batch().await.unwrap().1.len(), 2);
    assert_eq!(sub.next_batch().await.unwrap().1.len(), 2);
    let e = sub.next_batch().await.unwrap_err();
    assert_eq!(server_error(&e).map(|s| s.0), Some(Code::TooLarge), "{e}");
    assert_eq!(sub.position(), 4);

    // A client whose frames are smaller than the service's.
    let small = ClientOptions {
        max_frame_bytes: 4000,
        ..ClientOptions::default()
    };
    let dir2 = tempfile::tempdir().unwrap();
    let (store2, running2) = start(config(dir2.path())).await;
    let c2 = Client::connect_with(&running2.tcp.to_string(), small)
        .await
        .unwrap();
    for _ in 0..4 {
        c2.append("g", vec![3u8; 1500]).await.unwrap();
    }
    let (_, got) = c2.read_range("g", 0, u32::MAX, u32::MAX).await.unwrap();
    assert_eq!(
        got.len(),
        1,
        "two records of 1500 bytes and their lengths exceed half of 4000"
    );
    let mut sub = c2.subscribe_batches("g", 0);
    for at in 0..4 {
        assert_eq!(
            sub.next_batch().await.unwrap(),
            (at, vec![Bytes::from(vec![3u8; 1500])])
        );
    }
    stop(store, running).await;
    stop(store2, running2).await;
}

/// Takes batches from `sub` until it reaches `to`, checking each against
/// [`record`] and the limits; returns how many batches it took.
async fn take_until(
    sub: &mut BatchSubscription,
    to: u64,
    max_records: usize,
    max_bytes: usize,
) -> usize {
    let mut batches = 0;
    while sub.position() < to {
        let at = sub.position();
        let (first, records) = tokio::time::timeout(Duration::from_secs(30), sub.next_batch())
            .await
            .expect("a batch within 30 s")
            .unwrap();
        assert_eq!(first, at, "each batch starts where the last ended");
        assert!(!records.is_empty() && records.len() <= max_records);
        let bytes: usize = records.iter().map(|r| r.len()).sum();
        assert!(records.len() == 1 || bytes <= max_bytes, "{bytes} bytes");
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r, &record(first + i as u64), "record {}", first + i as u64);
        }
        batches += 1;
    }
    assert_eq!(sub.position(), to, "no batch beyond what was appended");
    batches
}

/// A batched subscription from 0 catches up over many range reads, then
/// follows appends as they come, and keeps going past a trim below it and
/// a restart of the service: every position once, in order, byte for
/// byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_subscription_delivers_every_position_once_across_a_trim_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.segment_bytes = 8 << 20;
    let (store, running) = start(cfg.clone()).await;
    let tcp = running.tcp.to_string();
    let opts = ClientOptions {
        attempts: 200,
        backoff: Duration::from_millis(10),
        ..ClientOptions::default()
    };
    let c = Client::connect_with(&tcp, opts).await.unwrap();
    append_records(&c, "s", 0, 150).await;
    let (max_records, max_bytes) = (7, 60_000);
    let mut sub = c.subscribe_batches_with("s", 0, max_records, max_bytes);
    let batches = take_until(&mut sub, 150, 7, 60_000).await;
    assert!(batches >= 150 / 7, "{batches} batches");
    // Live: appends while it follows.
    let writer = {
        let c = c.clone();
        tokio::spawn(async move { append_records(&c, "s", 150, 300).await })
    };
    take_until(&mut sub, 300, 7, 60_000).await;
    writer.await.unwrap();
    // A trim below it changes nothing for it.
    c.trim("s", 250).await.unwrap();
    append_records(&c, "s", 300, 320).await;
    take_until(&mut sub, 320, 7, 60_000).await;
    // A restart on the same port: it resumes where it was.
    running.shutdown().await;
    tokio::task::spawn_blocking(move || store.shutdown())
        .await
        .unwrap();
    let store = std::sync::Arc::new(
        tokio::task::spawn_blocking(move || melddb_log::Store::open(cfg).unwrap())
            .await
            .unwrap(),
    );
    let running = melddb_log::start_on(store.clone(), &tcp, "127.0.0.1:0")
        .await
        .unwrap();
    append_records(&c, "s", 320, 360).await;
    take_until(&mut sub, 360, 7, 60_000).await;
    // A new subscription from below the trim is refused, from it served.
    let e = c
        .subscribe_batches("s", 249)
        .next_batch()
        .await
        .unwrap_err();
    assert_eq!(server_error(&e), Some((Code::Trimmed, 249, 250)), "{e}");
    let mut again = c.subscribe_batches("s", 250);
    take_until(&mut again, 360, 4096, 4 << 20).await;
    stop(store, running).await;
}

/// A batched subscription whose consumer stops taking batches while the
/// log holds far more than its buffers does not hold up the client's
/// other requests, and later gets every record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_batch_consumer_holds_up_no_other_request() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.segment_bytes = 8 << 20;
    let (store, running) = start(cfg).await;
    let c = Client::connect(&running.tcp.to_string()).await.unwrap();
    // About 22 MiB: more than both ends and the sockets between buffer.
    append_records(&c, "slow", 0, 800).await;
    let mut sub = c.subscribe_batches_with("slow", 0, 16, 64 << 10);
    assert_eq!(sub.next_batch().await.unwrap().0, 0);
    // The consumer rests; the client goes on.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..20u64 {
        let r = tokio::time::timeout(Duration::from_secs(5), c.read("slow", i * 40))
            .await
            .expect("a read answered while the subscription waits");
        assert_eq!(r.unwrap(), record(i * 40));
    }
    let at = tokio::time::timeout(Duration::from_secs(5), c.append("other", "x"))
        .await
        .expect("an append answered while the subscription waits")
        .unwrap();
    assert_eq!(at, 0);
    take_until(&mut sub, 800, 16, 64 << 10).await;
    stop(store, running).await;
}

/// Batched and single subscriptions share the 64 per connection; limits
/// of 0 are refused under the request's id, and the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_subscriptions_count_against_the_limit_and_bad_limits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (store, running) = start(config(dir.path())).await;
    let addr = running.tcp.to_string();
    let mut s = raw_connect(&addr).await;
    for corr in 0..64u64 {
        let req = if corr % 2 == 0 {
            Request::Subscribe {
                log: "quiet".into(),
                from: 0,
            }
        } else {
            Request::SubscribeBatches {
                log: "quiet".into(),
                from: 0,
                max_records: 10,
                max_bytes: 100,
            }
        };
        send_frame(&mut s, &protocol::encode_request(corr, &req)).await;
    }
    let over = Request::SubscribeBatches {
        log: "quiet".into(),
        from: 0,
        max_records: 10,
        max_bytes: 100,
    };
    send_frame(&mut s, &protocol::encode_request(100, &over)).await;
    let (corr, r) = recv_frame(&mut s).await.unwrap();
    assert_eq!((corr, code_of(&r)), (100, Some(Code::Busy)), "{r:?}");

    let mut s = raw_connect(&addr).await;
    let bad = [
        Request::SubscribeBatches {
            log: "quiet".into(),
            from: 0,
            max_records: 0,
            max_bytes: 100,
        },
        Request::ReadRange {
            log: "quiet".into(),
            from: 0,
            max_records: 5,
            max_bytes: 0,
        },
    ];
    for (corr, req) in bad.iter().enumerate() {
        send_frame(&mut s, &protocol::encode_request(corr as u64 + 1, req)).await;
        let (got, r) = recv_frame(&mut s).await.unwrap();
        assert_eq!(
            (got, code_of(&r)),
            (corr as u64 + 1, Some(Code::BadFrame)),
            "{r:?}"
        );
    }
    send_frame(&mut s, &protocol::encode_request(9, &Request::Ping)).await;
    assert_eq!(recv_frame(&mut s).await.unwrap(), (9, Response::Pong));
    stop(store, running).await;
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next answer on `ws`.
async fn ws_reply(ws: &mut Ws) -> (u64, Response) {
    use tokio_tungstenite::tungstenite::Message;
    match tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("an answer within 10 s")
        .unwrap()
        .unwrap()
    {
        Message::Binary(b) => protocol::decode_response(&b).unwrap(),
        other => panic!("{other:?}"),
    }
}

/// The WebSocket carries the same frames: a range read and a batched
/// subscription that catches up, then follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_carries_range_reads_and_batched_subscriptions() {
    use tokio_tungstenite::tungstenite::Message;
    let dir = tempfile::tempdir().unwrap();
    let (store, running) = start(config(dir.path())).await;
    let url = format!("ws://{}/v1/ws", running.http);
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let records: Vec<Bytes> = (0..4).map(record).collect();
    let requests = [
        Request::AppendBatch {
            log: "web".into(),
            client: 3,
            first_request: 1,
            records: records[..3].to_vec(),
        },
        Request::ReadRange {
            log: "web".into(),
            from: 0,
            max_records: 10,
            max_bytes: 1 << 20,
        },
        Request::SubscribeBatches {
            log: "web".into(),
            from: 1,
            max_records: 10,
            max_bytes: 1 << 20,
        },
    ];
    for (corr, req) in requests.iter().enumerate() {
        let frame = protocol::encode_request(corr as u64 + 1, req);
        ws.send(Message::Binary(frame)).await.unwrap();
        if corr == 0 {
            // The append first, so the reads see its records.
            let (got, r) = ws_reply(&mut ws).await;
            assert_eq!(
                (got, r),
                (
                    1,
                    Response::AppendedBatch {
                        positions: vec![0, 1, 2]
                    }
                )
            );
        }
    }
    let mut got = vec![ws_reply(&mut ws).await, ws_reply(&mut ws).await];
    got.sort_by_key(|(corr, _)| *corr);
    assert_eq!(
        got,
        vec![
            (
                2,
                Response::Entries {
                    first: 0,
                    records: records[..3].to_vec()
                }
            ),
            (
                3,
                Response::Entries {
                    first: 1,
                    records: records[1..3].to_vec()
                }
            ),
        ]
    );
    Client::connect(&running.tcp.to_string())
        .await
        .unwrap()
        .append("web", records[3].clone())
        .await
        .unwrap();
    assert_eq!(
        ws_reply(&mut ws).await,
        (
            3,
            Response::Entries {
                first: 3,
                records: vec![records[3].clone()]
            }
        )
    );
    stop(store, running).await;
}

/// Answers that do not fit the request are protocol errors: a range read
/// answered from another position, a batched subscription that skips
/// positions. Records a batched subscription already gave (as after a
/// resume) are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_answers_that_do_not_fit_are_protocol_errors_and_repeats_are_dropped() {
    let entries = |first: u64, n: u64| Response::Entries {
        first,
        records: (first..first + n)
            .map(|p| Bytes::from(format!("entry {p}")))
            .collect(),
    };
    let addr = fake_service(move |req| match req {
        Request::ReadRange { from, .. } => vec![entries(from + 1, 2)],
        // Overlapping what it gave, all of it again, then a gap.
        Request::SubscribeBatches { from, .. } => vec![
            entries(from - 1, 3),
            entries(from, 2),
            entries(from + 2, 1),
            entries(from + 5, 1),
        ],
        _ => vec![Response::Pong],
    })
    .await;
    let c = Client::connect(&addr).await.unwrap();
    let e = c.read_range("f", 4, 10, 100).await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Protocol(m) if m.contains("read range answered")),
        "{e}"
    );
    let mut sub = c.subscribe_batches("f", 5);
    let e5 = |p: u64| Bytes::from(format!("entry {p}"));
    assert_eq!(sub.next_batch().await.unwrap(), (5, vec![e5(5), e5(6)]));
    assert_eq!(sub.next_batch().await.unwrap(), (7, vec![e5(7)]));
    let e = sub.next_batch().await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Protocol(m) if m.contains("skipped from 8 to 10")),
        "{e}"
    );
}
