//! kill -9 during heavy appends, then restart: every acknowledged append
//! is readable at its position, the logs have no holes, whatever else
//! appears is an append some client really sent (in flight at the kill),
//! and no position is handed out twice. Cycles: 5 by default,
//! `MELDDB_LOG_KILL_CYCLES` for more.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use melddb_log::{Client, ClientOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The service's recovery report, from its HTTP `/v1/stats`.
fn recovery_report(http: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(http).unwrap();
    write!(
        s,
        "GET /v1/stats HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    v["recovery"].clone()
}

fn spawn(config: &Path) -> (Service, String) {
    let (svc, tcp, _) = spawn_with_http(config);
    (svc, tcp)
}

fn spawn_with_http(config: &Path) -> (Service, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_melddb-log"))
        .args(["serve", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start melddb-log");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // Warnings go to stderr; drain it on a thread so a chatty service
    // never blocks on a full pipe, and keep it for a failed start.
    let mut err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut text);
        text
    });
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| {
        let status = child.wait();
        let text = stderr.join().unwrap_or_default();
        panic!("the service did not start ({e}: {line:?}), {status:?}, stderr:\n{text}")
    });
    let addr = |k: &str| v[k].as_str().unwrap().to_string();
    (Service(child), addr("tcp"), addr("http"))
}

type Acked = Arc<Mutex<BTreeMap<(String, u64), Vec<u8>>>>;

#[test]
fn kill_dash_nine_during_appends_loses_nothing_acknowledged() {
    kill_cycles(false);
}

/// The same with segments in slots of raw devices (files standing in for
/// them): kills land in slot header writes, spare slots being zeroed and
/// slots being reused.
#[test]
fn kill_dash_nine_on_devices_loses_nothing_acknowledged() {
    kill_cycles(true);
}

fn kill_cycles(on_devices: bool) {
    let cycles: usize = std::env::var("MELDDB_LOG_KILL_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().unwrap();
    let zones: Vec<String> = (0..3)
        .map(|z| dir.path().join(format!("z{z}")).display().to_string())
        .collect();
    // Sparse images of 400 slots of a 1 MiB segment: room for every
    // cycle's appends without trimming.
    let devices = if on_devices {
        let images = device_images(dir.path(), 400);
        format!("devices = {images:?}\n")
    } else {
        String::new()
    };
    let config = dir.path().join("log.toml");
    // Cycles 2 and 3 of every 4 keep spare segments, so kills land in
    // spares' refills and in data segments renamed from them.
    // Every cycle but the second of each four writes the whole blocks of
    // any data write directly, held back for its round, so kills land
    // between held-back writes and the writes queued behind them.
    // The fifth cycle of every five runs with fsync off, whose promise is
    // the same against a kill (the page cache survives it): every
    // acknowledged append, nothing unsent, no position reused.
    let write_config = |cycle: usize| {
        let fsync = cycle % 5 != 4;
        let spares = if cycle % 4 >= 2 { 2 } else { 0 };
        let direct = cycle % 4 != 1;
        std::fs::write(
            &config,
            format!(
                "zones = {zones:?}\n{devices}fsync = {fsync}\npage_bytes = 16384\nsegment_bytes = 1048576\nmax_record_bytes = 262144\nprepared_segments = {spares}\n[tuning]\ndirect_writes = {direct}\ndirect_write_min_bytes = 4096\n[listen]\ntcp = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\n"
            ),
        )
        .unwrap();
    };
    write_config(0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let acked: Acked = Arc::default();
    let sent: Arc<Mutex<HashSet<Vec<u8>>>> = Arc::default();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for cycle in 0..cycles {
        write_config(cycle);
        let (svc, addr) = spawn(&config);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks: Vec<_> = (0..12)
            .map(|t| {
                let (addr, acked, sent, stop) =
                    (addr.clone(), acked.clone(), sent.clone(), stop.clone());
                let seed = rng.random::<u64>();
                rt.spawn(async move {
                    let opts = ClientOptions {
                        attempts: 1,
                        ..Default::default()
                    };
                    let Ok(c) = Client::connect_with(&addr, opts).await else {
                        return;
                    };
                    let mut r = ChaCha8Rng::seed_from_u64(seed);
                    let mut i = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let log = if t % 2 == 0 { "even" } else { "odd" };
                        let len = if r.random_range(0..20) == 0 {
                            r.random_range(20_000..200_000)
                        } else {
                            r.random_range(1..2_000)
                        };
                        let mut body = format!("c{cycle}t{t}i{i}:").into_bytes();
                        body.resize(len.max(body.len()), (i % 251) as u8);
                        sent.lock().unwrap().insert(body.clone());
                        match c.append(log, body.clone()).await {
                            Ok(pos) => {
                                let prev =
                                    acked.lock().unwrap().insert((log.to_string(), pos), body);
                                assert!(prev.is_none(), "position {log}@{pos} acknowledged twice");
                            }
                            Err(_) => return, // the service died
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.random_range(100..600)));
        drop(svc); // SIGKILL, then reap
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in tasks {
            rt.block_on(t).unwrap();
        }
        // Restart and check. A kill keeps what reached the page cache, and
        // the writer never writes a segment past bytes not yet written
        // (held-back writes are done in order), so a kill leaves torn
        // tails at most: nothing for recovery to rebuild.
        let (svc, addr, http) = spawn_with_http(&config);
        let report = recovery_report(&http);
        assert_eq!(
            report["repaired_segments"],
            serde_json::json!([]),
            "cycle {cycle}: {report}"
        );
        rt.block_on(async {
            let c = Client::connect(&addr).await.unwrap();
            let known = acked.lock().unwrap().clone();
            let sent = sent.lock().unwrap().clone();
            for log in ["even", "odd"] {
                let (first, tail) = c.bounds(log).await.unwrap();
                assert_eq!(first, 0);
                let max_acked = known.keys().filter(|k| k.0 == log).map(|k| k.1).max();
                if let Some(m) = max_acked {
                    assert!(
                        tail > m,
                        "cycle {cycle}: {log} tail {tail} lost acknowledged {m}"
                    );
                }
                for pos in 0..tail {
                    let got = c
                        .read(log, pos)
                        .await
                        .unwrap_or_else(|e| panic!("cycle {cycle}: {log}@{pos}: {e}"));
                    match known.get(&(log.to_string(), pos)) {
                        Some(want) => {
                            assert!(got[..] == want[..], "cycle {cycle}: {log}@{pos} differs")
                        }
                        None => assert!(
                            sent.contains(&got[..]),
                            "cycle {cycle}: {log}@{pos} holds bytes nobody sent"
                        ),
                    }
                }
                // The next append takes the next position: none reused.
                let probe = format!("probe{cycle}").into_bytes();
                let p = c.append(log, probe.clone()).await.unwrap();
                assert_eq!(p, tail);
                acked.lock().unwrap().insert((log.to_string(), p), probe);
            }
        });
        drop(svc);
    }
    let (svc, addr) = spawn(&config);
    rt.block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        let acked = acked.lock().unwrap().clone();
        assert!(
            acked.len() > 100,
            "the load really ran: {} acknowledged",
            acked.len()
        );
        for ((log, pos), want) in acked.iter() {
            assert!(c.read(log, *pos).await.unwrap()[..] == want[..]);
        }
    });
    drop(svc);
}

/// A configuration of three zones under `dir`, serving on loopback
/// ports the system picks; its path.
fn loopback_config(dir: &Path) -> std::path::PathBuf {
    let zones: Vec<String> = (0..3)
        .map(|z| dir.join(format!("z{z}")).display().to_string())
        .collect();
    let config = dir.join("log.toml");
    std::fs::write(
        &config,
        format!("zones = {zones:?}\n[listen]\ntcp = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\n"),
    )
    .unwrap();
    config
}

/// Three sparse images under `dir` standing in for devices, each of
/// `slots` slots of a 1 MiB segment; their paths.
fn device_images(dir: &Path, slots: u64) -> Vec<String> {
    (0..3)
        .map(|z| {
            let p = dir.join(format!("dev{z}.img"));
            let slot = 4096 + melddb_log::device::slot_bytes(1 << 20);
            std::fs::File::create(&p)
                .and_then(|f| f.set_len(4096 + slots * slot))
                .unwrap();
            p.display().to_string()
        })
        .collect()
}

#[test]
fn sigterm_shuts_down_gracefully_and_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let config = loopback_config(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut svc, addr) = spawn(&config);
    let n = rt.block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        for i in 0..100u32 {
            assert_eq!(c.append("g", format!("r{i}")).await.unwrap(), i as u64);
        }
        100u64
    });
    let pid = svc.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = wait_for_exit(&mut svc, "after SIGTERM");
    assert!(status.success(), "graceful shutdown exits 0: {status:?}");
    let (_svc, addr) = spawn(&config);
    rt.block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        assert_eq!(c.bounds("g").await.unwrap(), (0, n));
        assert_eq!(c.read("g", 99).await.unwrap(), bytes::Bytes::from("r99"));
    });
}

/// Waits up to 20 s for the process to exit; its status. Fails the test
/// (and the guard kills the process) if it is still running.
fn wait_for_exit(svc: &mut Service, what: &str) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = svc.0.try_wait().unwrap() {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: still running after 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `melddb-log ARGS --config CONFIG` to its exit (killed after 20 s:
/// a process that should have been refused may be serving instead); its
/// exit code and stderr.
fn run_to_exit(args: &[&str], config: &Path) -> (Option<i32>, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_melddb-log"))
        .args(args)
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start melddb-log");
    let mut svc = Service(child);
    let status = wait_for_exit(&mut svc, &format!("melddb-log {args:?}"));
    let mut err = String::new();
    use std::io::Read;
    svc.0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), err)
}

/// A second service on the same zones would write the same log: it exits
/// 3 naming the first one's process, as does a `check`, and the first
/// serves on.
#[test]
fn a_second_service_on_held_zones_exits_3_and_the_first_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let config = loopback_config(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (svc, addr) = spawn(&config);
    let c = rt.block_on(Client::connect(&addr)).unwrap();
    assert_eq!(rt.block_on(c.append("g", "before")).unwrap(), 0);
    let holder = format!("(pid {})", svc.0.id());
    for args in [&["serve"][..], &["check"]] {
        let (code, err) = run_to_exit(args, &config);
        assert_eq!(code, Some(3), "{args:?}: {err}");
        assert!(
            err.contains("is in use by another process"),
            "{args:?}: {err}"
        );
        assert!(err.contains(&holder), "{args:?}: {err}");
    }
    assert_eq!(rt.block_on(c.append("g", "after")).unwrap(), 1);
    assert_eq!(
        rt.block_on(c.read("g", 0)).unwrap(),
        bytes::Bytes::from("before")
    );
}

/// A second service on the same devices from zone directories of its own
/// passes the zone locks and is refused by the devices' claim: exit 3
/// naming the device (after the open's wait for a killed holder to let
/// go), and the first serves on.
#[test]
fn a_second_service_on_held_devices_exits_3_and_the_first_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let images = device_images(dir.path(), 8);
    let config_in = |name: &str| {
        let zones: Vec<String> = (0..3)
            .map(|z| dir.path().join(format!("{name}{z}")).display().to_string())
            .collect();
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!("zones = {zones:?}\ndevices = {images:?}\nsegment_bytes = 1048576\n[listen]\ntcp = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\n"),
        )
        .unwrap();
        config
    };
    let (first, second) = (config_in("a"), config_in("b"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_svc, addr) = spawn(&first);
    let c = rt.block_on(Client::connect(&addr)).unwrap();
    assert_eq!(rt.block_on(c.append("g", "before")).unwrap(), 0);
    let (code, err) = run_to_exit(&["serve"], &second);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains(&format!("device {} is in use", images[0])),
        "{err}"
    );
    assert_eq!(rt.block_on(c.append("g", "after")).unwrap(), 1);
    assert_eq!(
        rt.block_on(c.read("g", 0)).unwrap(),
        bytes::Bytes::from("before")
    );
}

/// A store opened with `fsync = false` says so in the log (at `warn`,
/// the level these tests and a quiet deployment keep): its appends are
/// not durable across a power loss. With fsync on, nothing is said.
#[test]
fn fsync_off_is_warned_about_when_the_store_opens() {
    for fsync in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let config = loopback_config(dir.path());
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, format!("fsync = {fsync}\n{text}")).unwrap();
        let (code, err) = run_to_exit(&["check"], &config);
        assert_eq!(code, Some(0), "fsync {fsync}: check exits 0: {err}");
        assert_eq!(
            err.contains("fsync = false"),
            !fsync,
            "fsync {fsync}: stderr {err:?}"
        );
    }
}
