//! Nodes and a log service for the shared-log tests: `melddb bank`
//! processes, the service in this process or in a child process of its
//! own (which a test can kill -9 and start again on the same port), and
//! an independent replay of the log to check them against.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use melddb::{Melder, Outcome};
use melddb_log::{Client, Config, Store};

/// The service's configuration over `dir`: small pages and segments.
pub fn service_config(dir: &Path) -> Config {
    let zones = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
    let mut cfg = Config::with_zones(zones);
    cfg.page_bytes = 4096;
    cfg.segment_bytes = 4 << 20;
    cfg.max_record_bytes = 1 << 20;
    cfg.prepared_segments = 0;
    cfg
}

/// Reads and appends on a service at `addr` from this process.
pub struct Peek {
    rt: tokio::runtime::Runtime,
    addr: String,
}

impl Peek {
    pub fn new(addr: &str) -> Peek {
        Peek {
            rt: tokio::runtime::Runtime::new().unwrap(),
            addr: addr.to_string(),
        }
    }

    /// Appends one record to `log`.
    pub fn append(&self, log: &str, bytes: Vec<u8>) {
        self.rt.block_on(async {
            let c = Client::connect(&self.addr).await.unwrap();
            c.append(log, bytes).await.unwrap();
        });
    }

    /// Trims `log` below `pos`.
    pub fn trim(&self, log: &str, pos: u64) {
        self.rt.block_on(async {
            let c = Client::connect(&self.addr).await.unwrap();
            c.trim(log, pos).await.unwrap();
        });
    }

    /// Every entry of `log`, position 0 on.
    pub fn entries(&self, log: &str) -> Vec<Vec<u8>> {
        self.rt.block_on(async {
            let c = Client::connect(&self.addr).await.unwrap();
            let (first, tail) = c.bounds(log).await.unwrap();
            assert_eq!(first, 0);
            let mut out = Vec::new();
            for pos in 0..tail {
                out.push(c.read(log, pos).await.unwrap().to_vec());
            }
            out
        })
    }
}

/// The service in this test process, on loopback.
pub struct Service {
    rt: tokio::runtime::Runtime,
    store: Arc<Store>,
    running: Option<melddb_log::Running>,
    pub addr: String,
}

impl Service {
    pub fn start(dir: &Path) -> Service {
        Service::start_with(service_config(dir))
    }

    /// The service over `cfg`.
    pub fn start_with(cfg: Config) -> Service {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = Arc::new(Store::open(cfg).unwrap());
        let running = rt
            .block_on(melddb_log::start_on(
                store.clone(),
                "127.0.0.1:0",
                "127.0.0.1:0",
            ))
            .unwrap();
        let addr = running.tcp.to_string();
        Service {
            rt,
            store,
            running: Some(running),
            addr,
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            self.rt.block_on(r.shutdown());
        }
        self.store.shutdown();
    }
}

/// Set in a child process that runs the service: its directory.
pub const SERVICE_DIR_ENV: &str = "MELDDB_TEST_SERVICE_DIR";
/// ... and the loopback port it listens on.
pub const SERVICE_PORT_ENV: &str = "MELDDB_TEST_SERVICE_PORT";

/// In a child started by [`ServiceProcess::start`]: runs the service
/// until killed and returns true; false in the test process itself.
pub fn run_service_child() -> bool {
    let (Some(dir), Some(port)) = (
        std::env::var_os(SERVICE_DIR_ENV),
        std::env::var_os(SERVICE_PORT_ENV),
    ) else {
        return false;
    };
    let port = port.to_str().unwrap().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = Arc::new(Store::open(service_config(Path::new(&dir))).unwrap());
    let _running = rt
        .block_on(melddb_log::start_on(
            store,
            &format!("127.0.0.1:{port}"),
            "127.0.0.1:0",
        ))
        .unwrap();
    println!("listening");
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// The service in a child process of its own (this test binary again,
/// running `test` with the environment above), killed on drop.
pub struct ServiceProcess {
    child: Option<Child>,
    _out: Option<ChildStdout>,
    pub addr: String,
}

impl ServiceProcess {
    /// A free loopback port (bound, then released for the child).
    pub fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// Starts the service over `dir` on `port` and waits until it listens.
    pub fn start(dir: &Path, port: u16, test: &str) -> ServiceProcess {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(SERVICE_DIR_ENV, dir)
            .env(SERVICE_PORT_ENV, port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut line = String::new();
        while !line.contains("listening") {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0 && Instant::now() < deadline,
                "the service process did not start"
            );
        }
        ServiceProcess {
            child: Some(child),
            _out: Some(out.into_inner()),
            addr: format!("127.0.0.1:{port}"),
        }
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A node process, killed if the test ends before it exits.
pub struct Node(pub Option<Child>);

impl Node {
    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `melddb bank` on the log at `url`, node directory `dir`.
pub fn bank(dir: &Path, url: &str, seed: u64, seconds: f64) -> Node {
    let child = Command::new(env!("CARGO_BIN_EXE_melddb"))
        .arg("--dir")
        .arg(dir)
        .args(["--log", url, "bank", "--accounts", "12", "--threads", "3"])
        .args([
            "--seconds",
            &seconds.to_string(),
            "--seed",
            &seed.to_string(),
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run melddb");
    Node(Some(child))
}

/// Waits for a `bank` node and returns its JSON report.
pub fn finish(mut node: Node) -> serde_json::Value {
    let out = node.0.take().unwrap().wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "node failed: {stdout}\n{stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Replays `entries` with a fresh melder: the outcome of every entry and
/// the digest of every committed state, by position.
pub fn replay(entries: &[Vec<u8>]) -> (BTreeMap<u64, Outcome>, BTreeMap<u64, String>) {
    let mut m = Melder::from_genesis(&entries[0]).unwrap();
    let mut outcomes = BTreeMap::new();
    let mut digests = BTreeMap::new();
    digests.insert(0, m.lcs().digest_hex().unwrap());
    for bytes in &entries[1..] {
        for o in m.apply(bytes) {
            if let Some(p) = o.pos() {
                outcomes.insert(p, o);
            }
        }
        digests.insert(m.lcs().pos(), m.lcs().digest_hex().unwrap());
    }
    (outcomes, digests)
}

/// Positions of the committed entries among `outcomes`.
pub fn committed(outcomes: &BTreeMap<u64, Outcome>) -> std::collections::BTreeSet<u64> {
    outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Committed { .. }))
        .map(|(&p, _)| p)
        .collect()
}

/// Checks a node's report against the replay: the total held, and its
/// final state is the replay's at its position. Returns the positions it
/// reports committing (transfers and, if it did, the accounts' opening).
pub fn check_report(r: &serde_json::Value, digests: &BTreeMap<u64, String>) -> Vec<u64> {
    assert_eq!(r["total_held"], true, "{r}");
    assert_eq!(r["accounts"], 12, "{r}");
    let pos = r["position"].as_u64().unwrap();
    assert_eq!(
        digests.get(&pos).map(String::as_str),
        r["digest"].as_str(),
        "node at {pos}"
    );
    let mut out: Vec<u64> = r["committed_positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    out.extend(r["opened_accounts_at"].as_u64());
    out
}

/// A TCP relay on loopback between nodes and a service that a test can
/// cut (every connection closed, new ones refused) and restore: a node
/// behind it is away from the log while other nodes go on.
pub struct Relay {
    pub addr: String,
    cut: Arc<std::sync::atomic::AtomicBool>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    open: Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    /// Relays connections to `target`.
    pub fn start(target: &str) -> Relay {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, s, o, target) = (cut.clone(), stop.clone(), open.clone(), target.to_string());
        let accept = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((down, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                if c.load(Ordering::Relaxed) {
                    continue;
                }
                let Ok(up) = std::net::TcpStream::connect(&target) else {
                    continue;
                };
                down.set_nonblocking(false).unwrap();
                let mut open = o.lock().unwrap();
                open.push(down.try_clone().unwrap());
                open.push(up.try_clone().unwrap());
                for (mut from, mut to) in [
                    (down.try_clone().unwrap(), up.try_clone().unwrap()),
                    (up, down),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay {
            addr,
            cut,
            stop,
            open,
            accept: Some(accept),
        }
    }

    /// Closes every relayed connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Relays new connections again.
    pub fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}
