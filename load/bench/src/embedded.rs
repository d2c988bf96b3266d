//! The `embedded` suite: MeldDB's embedded database against SQLite (WAL,
//! synchronous NORMAL and FULL) and redb on the same machine, data and
//! durability: YCSB-style 8-read/2-write serializable transactions, 2-op
//! (1 read, 1 write) and read-only (10 reads) transactions, with 1, 2, 4
//! and 8 client threads.
//!
//! Durability levels compared: "durable" (survives power loss: MeldDB
//! `Durability::Sync`, SQLite FULL, redb `Immediate`) and "crash-safe"
//! (survives a process crash: MeldDB `Durability::Buffered`, SQLite NORMAL
//! in WAL mode, which fsyncs only at checkpoints).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use melddb::Isolation;
use melddb_runtime::{Database, DbOptions, Durability};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redb::{ReadableTable, TableDefinition};

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");
/// The value every workload writes (100 bytes).
pub const VALUE: [u8; 100] = [b'v'; 100];

/// Transaction shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// 8 reads and 2 writes.
    R8W2,
    /// 1 read and 1 write.
    Op2,
    /// 10 reads, no write.
    ReadOnly,
}

impl Mix {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Mix::R8W2 => "8r2w",
            Mix::Op2 => "2op",
            Mix::ReadOnly => "ro",
        }
    }
    /// The mix with this [`Mix::name`].
    pub fn from_name(name: &str) -> Option<Mix> {
        [Mix::R8W2, Mix::Op2, Mix::ReadOnly]
            .into_iter()
            .find(|m| m.name() == name)
    }
    fn shape(self) -> (usize, usize) {
        match self {
            Mix::R8W2 => (8, 2),
            Mix::Op2 => (1, 1),
            Mix::ReadOnly => (10, 0),
        }
    }
}

/// The engines compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// MeldDB, group commit with fdatasync.
    MeldDb,
    /// MeldDB, acknowledged after the write to the OS.
    MeldDbBuffered,
    /// MeldDB (fdatasync) with a node cache of about an eighth of its tree.
    MeldDbSmallCache,
    /// SQLite, WAL, synchronous=FULL.
    SqliteFull,
    /// SQLite, WAL, synchronous=NORMAL.
    SqliteNormal,
    /// redb, Durability::Immediate.
    Redb,
}

impl Engine {
    /// Short name (metric prefix).
    pub fn name(self) -> &'static str {
        match self {
            Engine::MeldDb => "melddb",
            Engine::MeldDbBuffered => "melddb_buffered",
            Engine::MeldDbSmallCache => "melddb_cache8",
            Engine::SqliteFull => "sqlite_full",
            Engine::SqliteNormal => "sqlite_normal",
            Engine::Redb => "redb",
        }
    }
    /// Every engine, in the order the suite runs and reports them.
    pub const ALL: [Engine; 6] = [
        Engine::MeldDb,
        Engine::MeldDbBuffered,
        Engine::MeldDbSmallCache,
        Engine::SqliteFull,
        Engine::SqliteNormal,
        Engine::Redb,
    ];
    /// The engine with this [`Engine::name`].
    pub fn from_name(name: &str) -> Option<Engine> {
        Engine::ALL.into_iter().find(|e| e.name() == name)
    }
    /// Durability class.
    pub fn durability(self) -> &'static str {
        match self {
            Engine::MeldDb | Engine::MeldDbSmallCache | Engine::SqliteFull | Engine::Redb => {
                "durable"
            }
            _ => "crash-safe",
        }
    }
}

/// One measured cell.
#[derive(Debug, Clone)]
pub struct Cell {
    /// Engine.
    pub engine: Engine,
    /// Transaction shape.
    pub mix: Mix,
    /// Client threads.
    pub threads: usize,
    /// Committed transactions per second.
    pub tps: f64,
    /// Median commit latency (whole transaction), ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Bytes the engine's files grew by, per committed transaction.
    pub bytes_per_txn: f64,
    /// Aborted attempts per committed transaction (MeldDB retries them).
    pub retries_per_txn: f64,
}

/// The workloads' `i`-th key (spread over the key space).
pub fn key(i: u64) -> [u8; 8] {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes()
}

fn dir_bytes(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| {
                    let m = e.metadata().map(|m| {
                        if m.is_dir() {
                            dir_bytes(&e.path())
                        } else {
                            m.len()
                        }
                    });
                    m.unwrap_or(0)
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Bytes this process passed to `write`-family calls so far (Linux
/// `/proc/self/io` `wchar`); 0 where unavailable. Counts what the engine
/// writes during the run, whatever file it goes to.
fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("wchar:")
                    .map(|v| v.trim().parse().unwrap_or(0))
            })
        })
        .unwrap_or(0)
}

/// A loaded engine that can run one transaction.
trait Client: Send + Sync {
    /// Runs one transaction; returns how many attempts aborted first.
    fn txn(&self, reads: &[[u8; 8]], writes: &[[u8; 8]], value: &[u8]) -> Result<u32, String>;
}

struct Meld(Database);
impl Client for Meld {
    fn txn(&self, reads: &[[u8; 8]], writes: &[[u8; 8]], value: &[u8]) -> Result<u32, String> {
        let mut aborted = 0u32;
        loop {
            let mut tx = self.0.begin(Isolation::Serializable);
            for k in reads {
                tx.get(k).map_err(|e| e.to_string())?;
            }
            for k in writes {
                tx.put(k, value).map_err(|e| e.to_string())?;
            }
            match self.0.commit(tx).map_err(|e| e.to_string())? {
                melddb::Outcome::Aborted { .. } | melddb::Outcome::Rejected { .. } => {
                    aborted += 1;
                    if aborted > 1000 {
                        return Err("1000 aborts in a row".into());
                    }
                }
                _ => return Ok(aborted),
            }
        }
    }
}

struct Sqlite {
    path: std::path::PathBuf,
    full: bool,
    conns: std::sync::Mutex<Vec<rusqlite::Connection>>,
}

impl Sqlite {
    fn conn(&self) -> Result<rusqlite::Connection, String> {
        if let Some(c) = self.conns.lock().map_err(|e| e.to_string())?.pop() {
            return Ok(c);
        }
        let c = rusqlite::Connection::open(&self.path).map_err(|e| e.to_string())?;
        c.execute_batch(if self.full {
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=10000;"
        } else {
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=10000;"
        })
        .map_err(|e| e.to_string())?;
        Ok(c)
    }
}

impl Client for Sqlite {
    fn txn(&self, reads: &[[u8; 8]], writes: &[[u8; 8]], value: &[u8]) -> Result<u32, String> {
        let mut c = self.conn()?;
        let r = (|| -> rusqlite::Result<()> {
            // IMMEDIATE takes the write lock up front: serializable, and no
            // deadlock-style SQLITE_BUSY upgrades in the middle.
            let behavior = if writes.is_empty() {
                rusqlite::TransactionBehavior::Deferred
            } else {
                rusqlite::TransactionBehavior::Immediate
            };
            let t = c.transaction_with_behavior(behavior)?;
            {
                let mut get = t.prepare_cached("SELECT v FROM kv WHERE k = ?1")?;
                for k in reads {
                    let _: Option<Vec<u8>> = get.query_row([&k[..]], |r| r.get(0)).ok();
                }
                let mut put =
                    t.prepare_cached("INSERT OR REPLACE INTO kv (k, v) VALUES (?1, ?2)")?;
                for k in writes {
                    put.execute(rusqlite::params![&k[..], value])?;
                }
            }
            t.commit()
        })();
        self.conns.lock().map_err(|e| e.to_string())?.push(c);
        r.map(|()| 0).map_err(|e| e.to_string())
    }
}

struct Redb(redb::Database);
impl Client for Redb {
    fn txn(&self, reads: &[[u8; 8]], writes: &[[u8; 8]], value: &[u8]) -> Result<u32, String> {
        let e = |x: &dyn std::fmt::Display| x.to_string();
        if writes.is_empty() {
            let r = self.0.begin_read().map_err(|x| e(&x))?;
            let t = r.open_table(TABLE).map_err(|x| e(&x))?;
            for k in reads {
                let _ = t.get(&k[..]).map_err(|x| e(&x))?;
            }
            return Ok(0);
        }
        let w = self.0.begin_write().map_err(|x| e(&x))?;
        {
            let mut t = w.open_table(TABLE).map_err(|x| e(&x))?;
            for k in reads {
                let _ = t.get(&k[..]).map_err(|x| e(&x))?.map(|v| v.value().len());
            }
            for k in writes {
                t.insert(&k[..], value).map_err(|x| e(&x))?;
            }
        }
        w.commit().map_err(|x| e(&x))?;
        Ok(0)
    }
}

/// Loads keys `0..keys` into a MeldDB database, 10,000 per transaction.
pub fn load_meld(db: &Database, keys: u64) -> Result<(), String> {
    let mut i = 0;
    while i < keys {
        let end = (i + 10_000).min(keys);
        db.transact(Isolation::SnapshotIsolation, |tx| {
            for j in i..end {
                tx.put(&key(j), &VALUE)?;
            }
            Ok::<_, melddb::TxnError>(())
        })
        .map_err(|e| e.to_string())?;
        i = end;
    }
    Ok(())
}

/// Creates and loads an engine with `keys` keys in `dir`.
fn load(engine: Engine, dir: &Path, keys: u64) -> Result<Arc<dyn Client>, String> {
    match engine {
        Engine::MeldDb | Engine::MeldDbBuffered | Engine::MeldDbSmallCache => {
            let opts = DbOptions {
                durability: if engine == Engine::MeldDbBuffered {
                    Durability::Buffered
                } else {
                    Durability::Sync
                },
                ..DbOptions::default()
            };
            let db = Database::open_with(dir, opts.clone()).map_err(|e| e.to_string())?;
            load_meld(&db, keys)?;
            if engine != Engine::MeldDbSmallCache {
                return Ok(Arc::new(Meld(db)));
            }
            // Reopen with a budget of an eighth of the loaded tree: the run
            // starts from a checkpoint read back lazily, as after a restart.
            let tree = db.snapshot().approx_bytes();
            db.checkpoint().map_err(|e| e.to_string())?;
            db.close().map_err(|e| e.to_string())?;
            let db = Database::open_with(
                dir,
                DbOptions {
                    cache_bytes: (tree / 8).max(64 << 10),
                    ..opts
                },
            )
            .map_err(|e| e.to_string())?;
            Ok(Arc::new(Meld(db)))
        }
        Engine::SqliteFull | Engine::SqliteNormal => {
            let path = dir.join("bench.sqlite");
            let s = Sqlite {
                path,
                full: engine == Engine::SqliteFull,
                conns: std::sync::Mutex::new(Vec::new()),
            };
            let mut c = s.conn()?;
            c.execute_batch("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID;")
                .map_err(|e| e.to_string())?;
            let t = c.transaction().map_err(|e| e.to_string())?;
            {
                let mut put = t
                    .prepare("INSERT OR REPLACE INTO kv (k, v) VALUES (?1, ?2)")
                    .map_err(|e| e.to_string())?;
                for j in 0..keys {
                    put.execute(rusqlite::params![&key(j)[..], &VALUE[..]])
                        .map_err(|e| e.to_string())?;
                }
            }
            t.commit().map_err(|e| e.to_string())?;
            c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
                .map_err(|e| e.to_string())?;
            s.conns.lock().map_err(|e| e.to_string())?.push(c);
            Ok(Arc::new(s))
        }
        Engine::Redb => {
            let db = redb::Database::create(dir.join("bench.redb")).map_err(|e| e.to_string())?;
            let w = db.begin_write().map_err(|e| e.to_string())?;
            {
                let mut t = w.open_table(TABLE).map_err(|e| e.to_string())?;
                for j in 0..keys {
                    t.insert(&key(j)[..], &VALUE[..])
                        .map_err(|e| e.to_string())?;
                }
            }
            w.commit().map_err(|e| e.to_string())?;
            Ok(Arc::new(Redb(db)))
        }
    }
}

/// Runs one cell: `threads` clients for `duration` after loading `keys`.
pub fn run_cell(
    engine: Engine,
    mix: Mix,
    threads: usize,
    keys: u64,
    duration: Duration,
    seed: u64,
) -> Result<Cell, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let client = load(engine, dir.path(), keys)?;
    let before = written_bytes();
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let client = client.clone();
            let stop = stop.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || -> Result<(Vec<f64>, u64), String> {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ((t as u64 + 1) * 0x1234_5678));
                let (r, w) = mix.shape();
                let mut lat = Vec::new();
                let mut retries = 0u64;
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    let reads: Vec<[u8; 8]> =
                        (0..r).map(|_| key(rng.random_range(0..keys))).collect();
                    let writes: Vec<[u8; 8]> =
                        (0..w).map(|_| key(rng.random_range(0..keys))).collect();
                    // Every write changes the value (an identical value lets
                    // SQLite skip the page write, and with it the fsync).
                    let mut value = VALUE;
                    value[..8].copy_from_slice(&rng.random::<u64>().to_le_bytes());
                    let t0 = Instant::now();
                    retries += client.txn(&reads, &writes, &value)? as u64;
                    lat.push(t0.elapsed().as_secs_f64() * 1e3);
                }
                Ok((lat, retries))
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    let mut retries = 0;
    for h in handles {
        let (l, r) = h
            .join()
            .map_err(|_| "client thread panicked".to_string())??;
        lat.extend(l);
        retries += r;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let after = written_bytes();
    drop(client);
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let n = lat.len().max(1) as f64;
    Ok(Cell {
        engine,
        mix,
        threads,
        tps: lat.len() as f64 / elapsed,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        bytes_per_txn: after.saturating_sub(before) as f64 / n,
        retries_per_txn: retries as f64 / n,
    })
}

/// One recovery measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecoveryRun {
    /// Automatic checkpoint interval used while writing (0: off).
    pub checkpoint_bytes: u64,
    /// Record bytes appended while writing (intentions and checkpoints).
    pub appended_bytes: u64,
    /// Bytes in the directory when it was reopened (after trimming).
    pub dir_bytes: u64,
    /// Time to reopen: verify the segments, load the checkpoint (if
    /// any) and meld the log after it.
    pub secs: f64,
    /// Log entries melded after the starting point.
    pub replayed: u64,
    /// Checkpoint recovery started from.
    pub from_checkpoint: Option<u64>,
    /// Checkpoints written while writing.
    pub checkpoints: u64,
}

/// Recovery: `keys` keys are loaded, then transactions of 1,000 updates
/// to random keys are committed until `target_bytes` of log were
/// appended, with automatic checkpoints every `checkpoint_bytes` (0: none)
/// on segments of `segment_bytes`; then the directory is reopened and timed.
pub fn recovery(
    target_bytes: u64,
    checkpoint_bytes: u64,
    segment_bytes: u64,
    keys: u64,
) -> Result<RecoveryRun, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let opts = DbOptions {
        durability: Durability::Buffered,
        checkpoint_bytes,
        segment_bytes,
        ..DbOptions::default()
    };
    let (appended, checkpoints) = {
        let db = Database::open_with(dir.path(), opts.clone()).map_err(|e| e.to_string())?;
        load_meld(&db, keys)?;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        while db.log_stats().bytes_appended < target_bytes {
            let mut value = VALUE;
            value[..8].copy_from_slice(&rng.random::<u64>().to_le_bytes());
            let ks: Vec<u64> = (0..1000).map(|_| rng.random_range(0..keys)).collect();
            db.transact(Isolation::SnapshotIsolation, |tx| {
                for k in &ks {
                    tx.put(&key(*k), &value)?;
                }
                Ok::<_, melddb::TxnError>(())
            })
            .map_err(|e| e.to_string())?;
        }
        let st = db.log_stats();
        db.close().map_err(|e| e.to_string())?;
        (st.bytes_appended, st.checkpoints_written)
    };
    let dir_bytes = dir_bytes(dir.path());
    let t0 = Instant::now();
    let db = Database::open_with(dir.path(), opts).map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    let r = db.recovery().clone();
    drop(db);
    Ok(RecoveryRun {
        checkpoint_bytes,
        appended_bytes: appended,
        dir_bytes,
        secs,
        replayed: r.replayed,
        from_checkpoint: r.checkpoint,
        checkpoints,
    })
}

/// One sample of a long run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// Seconds since the start.
    pub t: f64,
    /// Reachable ephemeral nodes created since the last checkpoint.
    pub unpersisted_nodes: u64,
    /// Bytes in the log's segment files.
    pub log_bytes: u64,
    /// Checkpoints written so far.
    pub checkpoints: u64,
    /// Transactions committed so far.
    pub committed: u64,
}

/// A long 8r2w run on MeldDB (durable) with automatic checkpoints every
/// `checkpoint_bytes`, sampled every 100 ms: how much state exists only in
/// memory (what the paper's flush intentions bound) and how large the log
/// stays with trimming.
pub fn long_run(
    keys: u64,
    threads: usize,
    duration: Duration,
    checkpoint_bytes: u64,
    seed: u64,
) -> Result<Vec<Sample>, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let db = Database::open_with(
        dir.path(),
        DbOptions {
            checkpoint_bytes,
            // Segments small enough for trimming to delete files.
            segment_bytes: (checkpoint_bytes / 2).clamp(1 << 20, 64 << 20),
            ..DbOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    load_meld(&db, keys)?;
    let client = Arc::new(Meld(db));
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (client, stop, committed) = (client.clone(), stop.clone(), committed.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ((t as u64 + 1) * 0x9876_5431));
                while !stop.load(Ordering::Relaxed) {
                    let reads: Vec<[u8; 8]> =
                        (0..8).map(|_| key(rng.random_range(0..keys))).collect();
                    let writes: Vec<[u8; 8]> =
                        (0..2).map(|_| key(rng.random_range(0..keys))).collect();
                    let mut value = VALUE;
                    value[..8].copy_from_slice(&rng.random::<u64>().to_le_bytes());
                    client.txn(&reads, &writes, &value)?;
                    committed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    let start = Instant::now();
    let mut samples = Vec::new();
    while start.elapsed() < duration {
        std::thread::sleep(Duration::from_millis(100));
        let st = client.0.log_stats();
        samples.push(Sample {
            t: start.elapsed().as_secs_f64(),
            unpersisted_nodes: client.0.unpersisted_nodes(),
            log_bytes: st.bytes,
            checkpoints: st.checkpoints_written,
            committed: committed.load(Ordering::Relaxed),
        });
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join()
            .map_err(|_| "client thread panicked".to_string())??;
    }
    Ok(samples)
}
