//! The `nodes` suite's workloads: MeldDB nodes in separate processes on
//! one log of the log service (on loopback), against one node on a file
//! log of its own; and joining a long log from a published checkpoint
//! against replaying it from genesis.
//!
//! Node processes are this binary again (`melddb-bench nodes-worker`):
//! each opens its node, says `ready`, waits for `go` on stdin so all start
//! together, runs the workload and prints one JSON line.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use melddb::{Isolation, Outcome};
use melddb_runtime::{Database, DbOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::embedded::{key, VALUE};

/// What one worker process measured.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct WorkerResult {
    /// Committed transactions (or read-only ones).
    pub committed: u64,
    /// Aborted attempts.
    pub aborted: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Latency of every attempt from begin to outcome, ms, sorted.
    pub latencies_ms: Vec<f64>,
}

/// Runs `threads` clients of `reads` reads and `writes` writes over `keys`
/// keys on `db` for `seconds`, no retries (an abort is counted and the
/// next transaction begins).
pub fn workload(
    db: &Arc<Database>,
    threads: usize,
    reads: usize,
    writes: usize,
    keys: u64,
    seconds: f64,
    seed: u64,
) -> Result<WorkerResult, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (db, stop, barrier) = (db.clone(), stop.clone(), barrier.clone());
            std::thread::spawn(move || -> Result<(Vec<f64>, u64, u64), String> {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ((t as u64 + 1) << 20));
                let (mut lat, mut committed, mut aborted) = (Vec::new(), 0u64, 0u64);
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let mut tx = db.begin(Isolation::Serializable);
                    for _ in 0..reads {
                        tx.get(&key(rng.random_range(0..keys)))
                            .map_err(|e| e.to_string())?;
                    }
                    let mut value = VALUE;
                    value[..8].copy_from_slice(&rng.random::<u64>().to_le_bytes());
                    for _ in 0..writes {
                        tx.put(&key(rng.random_range(0..keys)), &value)
                            .map_err(|e| e.to_string())?;
                    }
                    match db.commit(tx).map_err(|e| e.to_string())? {
                        Outcome::Aborted { .. } | Outcome::Rejected { .. } => aborted += 1,
                        _ => committed += 1,
                    }
                    lat.push(t0.elapsed().as_secs_f64() * 1e3);
                }
                Ok((lat, committed, aborted))
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut r = WorkerResult::default();
    for h in handles {
        let (l, c, a) = h.join().map_err(|_| "a client thread panicked")??;
        r.latencies_ms.extend(l);
        r.committed += c;
        r.aborted += a;
    }
    r.seconds = start.elapsed().as_secs_f64();
    r.latencies_ms.sort_by(f64::total_cmp);
    Ok(r)
}

/// Loads `keys` keys of the workload into `db`.
pub fn load_keys(db: &Database, keys: u64) -> Result<(), String> {
    crate::embedded::load_meld(db, keys)
}

/// What one `nodes-worker` process runs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The shared log (`melddb://…`); `None`: a file log in `dir`.
    pub log: Option<String>,
    /// The node's directory.
    pub dir: std::path::PathBuf,
    /// Keys to load before the run (0: none).
    pub load: u64,
    /// Client threads.
    pub threads: usize,
    /// Reads and writes per transaction.
    pub mix: (usize, usize),
    /// Keys the workload picks from.
    pub keys: u64,
    /// Seconds.
    pub seconds: f64,
    /// RNG seed.
    pub seed: u64,
}

/// The `nodes-worker` process: opens its node, loads keys if asked, says
/// `ready`, waits for `go`, runs.
pub fn worker_main(p: &Plan) -> Result<(), String> {
    let db = match &p.log {
        Some(url) => Database::connect(url, &p.dir, DbOptions::default()),
        None => Database::open(&p.dir),
    }
    .map_err(|e| e.to_string())?;
    if p.load > 0 {
        load_keys(&db, p.load)?;
    }
    let db = Arc::new(db);
    println!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let r = workload(&db, p.threads, p.mix.0, p.mix.1, p.keys, p.seconds, p.seed)?;
    println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    Ok(())
}

/// A worker process, killed if dropped before it answered.
struct Worker {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `n` worker processes with `args` (each gets its own directory
/// under `tmp` and seed), all together, and returns their results.
pub fn run_workers(
    tmp: &Path,
    tag: &str,
    n: usize,
    args: &[String],
) -> Result<Vec<WorkerResult>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut workers = Vec::new();
    for i in 0..n {
        let mut child = Command::new(&exe)
            .arg("nodes-worker")
            .arg("--dir")
            .arg(tmp.join(format!("{tag}-{i}")))
            .args(args)
            .args(["--seed", &(i + 1).to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting a node process: {e}"))?;
        let out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        workers.push(Worker { child, out });
    }
    for w in &mut workers {
        let mut line = String::new();
        w.out.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.trim() != "ready" {
            return Err(format!("a node process did not start: {line:?}"));
        }
    }
    for w in &mut workers {
        let stdin = w.child.stdin.as_mut().ok_or("no stdin")?;
        writeln!(stdin, "go").map_err(|e| e.to_string())?;
    }
    let mut results = Vec::new();
    for w in &mut workers {
        let mut line = String::new();
        w.out.read_line(&mut line).map_err(|e| e.to_string())?;
        results.push(serde_json::from_str(line.trim()).map_err(|e| format!("{e}: {line:?}"))?);
    }
    Ok(results)
}

/// Aggregate figures of one run of `n` nodes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodesRun {
    /// Label.
    pub label: String,
    /// Node processes.
    pub nodes: usize,
    /// Committed transactions per second, all nodes together.
    pub tps: f64,
    /// Attempt latency from begin to outcome over every node, ms.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Aborted attempts per attempt.
    pub abort_rate: f64,
}

impl NodesRun {
    /// Sums `results`.
    pub fn of(label: &str, results: &[WorkerResult]) -> NodesRun {
        let mut lat: Vec<f64> = results
            .iter()
            .flat_map(|r| r.latencies_ms.iter().copied())
            .collect();
        lat.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            lat.get(((lat.len() as f64 - 1.0) * p) as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let committed: u64 = results.iter().map(|r| r.committed).sum();
        let aborted: u64 = results.iter().map(|r| r.aborted).sum();
        NodesRun {
            label: label.to_string(),
            nodes: results.len(),
            tps: results
                .iter()
                .map(|r| r.committed as f64 / r.seconds.max(1e-9))
                .sum(),
            p50_ms: pct(0.5),
            p99_ms: pct(0.99),
            abort_rate: aborted as f64 / (committed + aborted).max(1) as f64,
        }
    }
}

/// Joining a log of `entries` entries: from its published checkpoint
/// against replaying it from genesis.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JoinRun {
    /// Entries in the log (about 1 KiB each).
    pub entries: u64,
    /// Seconds for a new node to connect and meld the log from genesis.
    pub replay_s: f64,
    /// Seconds for a new node to connect from the latest published
    /// checkpoint.
    pub join_s: f64,
    /// `replay_s / join_s`.
    pub speedup: f64,
    /// Entries per second melded while replaying (the catch-up rate).
    pub catchup_entries_per_s: f64,
}

/// Writes the same `entries` transactions (one 1,000-byte value each,
/// over 10,000 keys) to logs `plain` and `ckpt` on the service at `addr`,
/// publishes a checkpoint of `ckpt` at its end, then times a new node
/// joining each.
pub fn join_run(
    rt: &tokio::runtime::Runtime,
    addr: &str,
    tmp: &Path,
    entries: u64,
) -> Result<JoinRun, String> {
    let (plain, ckpt) = (format!("plain{entries}"), format!("ckpt{entries}"));
    let client = rt
        .block_on(melddb_log::Client::connect(addr))
        .map_err(|e| e.to_string())?;
    // The entries, melded once in memory to get valid intentions.
    let settings = melddb::Settings::default();
    let mut melder = melddb::Melder::new(settings);
    let mut batch: Vec<bytes::Bytes> = vec![settings.encode().into()];
    let mut rng = ChaCha8Rng::seed_from_u64(entries);
    let flush = |batch: &mut Vec<bytes::Bytes>| -> Result<(), String> {
        for log in [&plain, &ckpt] {
            rt.block_on(client.append_batch(log, batch.clone()))
                .map_err(|e| e.to_string())?;
        }
        batch.clear();
        Ok(())
    };
    for i in 0..entries {
        let mut tx = melddb::Transaction::begin(melder.lcs(), Isolation::SnapshotIsolation);
        let mut value = [0u8; 1000];
        rng.fill(&mut value[..]);
        tx.put(&key(i % 10_000), &value)
            .map_err(|e| e.to_string())?;
        let melddb::Finished::Intention(bytes) = tx.finish().map_err(|e| e.to_string())? else {
            return Err("a write transaction finished read-only".into());
        };
        melder.apply(&bytes);
        batch.push(bytes.into());
        if batch.len() >= 256 {
            flush(&mut batch)?;
        }
    }
    flush(&mut batch)?;
    let url = |log: &str| format!("melddb://{addr}/{log}");
    // A node that publishes one checkpoint at the end of `ckpt`.
    let publisher = Database::connect(
        &url(&ckpt),
        tmp.join(format!("publisher{entries}")),
        DbOptions {
            publish_checkpoints: true,
            checkpoint_bytes: u64::MAX / 4,
            trim_log: false,
            ..DbOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    publisher.checkpoint().map_err(|e| e.to_string())?;
    publisher.close().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let replayed = Database::connect(
        &url(&plain),
        tmp.join(format!("replay{entries}")),
        DbOptions::default(),
    )
    .map_err(|e| e.to_string())?;
    let replay_s = t0.elapsed().as_secs_f64();
    let melded = replayed.recovery().replayed;
    let t0 = Instant::now();
    let joined = Database::connect(
        &url(&ckpt),
        tmp.join(format!("join{entries}")),
        DbOptions::default(),
    )
    .map_err(|e| e.to_string())?;
    let join_s = t0.elapsed().as_secs_f64();
    if joined.recovery().checkpoint.is_none() {
        return Err("the joining node did not load the published checkpoint".into());
    }
    let len = |db: &Database| db.snapshot().len().map_err(|e| e.to_string());
    if len(&joined)? != len(&replayed)?
        || joined.get(&key(7)).map_err(|e| e.to_string())?
            != replayed.get(&key(7)).map_err(|e| e.to_string())?
    {
        return Err("the joined node's state differs from the replayed one's".into());
    }
    Ok(JoinRun {
        entries,
        replay_s,
        join_s,
        speedup: replay_s / join_s.max(1e-9),
        catchup_entries_per_s: melded as f64 / replay_s.max(1e-9),
    })
}
