//! What the service tests share (`tests/service*.rs`): a small service
//! on loopback ports, raw frames over TCP, one-shot HTTP requests, and a
//! stand-in service that answers what a test tells it to.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use melddb_log::protocol::{self, Code, Request, Response};
use melddb_log::{Config, Running, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A small service: three zones, 16 KiB pages, 1 MiB segments and
/// records, frames a little over a record.
pub fn config(dir: &Path) -> Config {
    let zones: Vec<PathBuf> = (0..3).map(|z| dir.join(format!("z{z}"))).collect();
    let mut c = Config::with_zones(zones);
    c.page_bytes = 16 << 10;
    c.segment_bytes = 1 << 20;
    c.max_record_bytes = 1 << 20;
    c.limits.max_frame_bytes = (1 << 20) + 1024;
    c
}

/// Opens a store with `cfg` and serves it on free loopback ports.
pub async fn start(cfg: Config) -> (Arc<Store>, Running) {
    start_with_faults(cfg, Arc::new(melddb_log::Faults::none())).await
}

/// [`start`] on a store whose writes take the faults armed in `faults`.
pub async fn start_with_faults(
    cfg: Config,
    faults: Arc<melddb_log::Faults>,
) -> (Arc<Store>, Running) {
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

/// Stops the service, then shuts the store down.
pub async fn stop(store: Arc<Store>, running: Running) {
    running.shutdown().await;
    tokio::task::spawn_blocking(move || store.shutdown())
        .await
        .unwrap();
}

/// A plain TCP connection to the binary protocol.
pub async fn raw_connect(addr: &str) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

/// Writes one length-prefixed frame.
pub async fn send_frame(s: &mut TcpStream, body: &[u8]) {
    s.write_all(&(body.len() as u32).to_le_bytes())
        .await
        .unwrap();
    s.write_all(body).await.unwrap();
}

/// Reads one response; `None` on EOF.
pub async fn recv_frame(s: &mut TcpStream) -> Option<(u64, Response)> {
    let mut len = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut len))
        .await
        .ok()?
        .ok()?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).await.ok()?;
    Some(protocol::decode_response(&Bytes::from(body)).unwrap())
}

/// The error code of an error answer; `None` for any other answer.
pub fn code_of(r: &Response) -> Option<Code> {
    match r {
        Response::Error { code, .. } => Some(*code),
        _ => None,
    }
}

/// A raw connection that said Hello with `token` and was accepted.
pub async fn authenticated(addr: &str, token: &str) -> TcpStream {
    let mut s = raw_connect(addr).await;
    let hello = Request::Hello {
        token: token.into(),
    };
    send_frame(&mut s, &protocol::encode_request(1, &hello)).await;
    assert_eq!(recv_frame(&mut s).await.unwrap().1, Response::HelloOk);
    s
}

/// A one-byte append to `log`, without a request id.
pub fn append_to(log: &str) -> Request {
    Request::Append {
        log: log.into(),
        client: 0,
        request: 0,
        bytes: Bytes::from_static(b"x"),
    }
}

/// One HTTP/1.1 request on a connection of its own, with an optional
/// bearer token: status and body.
pub async fn http_with_token(
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

/// A stand-in for the service on 127.0.0.1 that answers every request
/// with the frames `answer` makes of it (none: it drops the connection
/// instead). For answers the real service never gives. Stops with the
/// test's runtime.
pub async fn fake_service(
    answer: impl Fn(Request) -> Vec<Response> + Send + Sync + 'static,
) -> String {
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
