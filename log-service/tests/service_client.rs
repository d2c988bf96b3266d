//! The client against a service that fails: connections cut mid-append,
//! a full disk, failed writes, stand-in services that answer wrongly or
//! not at all, retries and their backoff, and the `Log` trait's bounds
//! when the service is gone. Everything listens on 127.0.0.1 and is
//! stopped by the test.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use melddb_log::protocol::{self, Code, Request, Response};
use melddb_log::{BlockingLog, Client, ClientError, ClientOptions, Running};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::net::*;

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
