//! `melddb`: the command-line tool for a MeldDB node, on a local log in a
//! directory or on a shared log of the log service.
//!
//! ```text
//! melddb [--dir DIR] [--log melddb://HOST:PORT/LOG] put KEY VALUE | get KEY | del KEY
//! melddb ... scan [--from K] [--to K] [--limit N] [--reverse] [--json]
//! melddb ... check [--json]     verify every log record and the tree
//! melddb ... stats [--json]     sizes, recovery time, state digest
//! melddb ... bank [--accounts N] [--threads T] [--seconds S] [--json]
//! ```
//! The directory defaults to `$MELDDB_DIR` or `./melddb-data`; with
//! `--log` (or `$MELDDB_LOG`) it is the node's own directory and the
//! database is the shared log. Every
//! command opens the database, and with it the directory's lock: on a
//! directory another process holds open (an application's `Database`, or
//! another `melddb`), each command prints why and exits 1 without reading
//! or writing anything, so neither a write nor a `check` races the holder.
//! Exit status: 0 success, 1 error, 2 usage, 3 `get` of an absent key.

use std::io::Write as _;
use std::ops::Bound;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use melddb::{Isolation, Order, Outcome};
use melddb_runtime::{Database, DbOptions, Durability};
use rand::{Rng, SeedableRng};

mod bank;
mod demo;

/// mimalloc (through melddb-alloc, which skips its aligned API for ordinary
/// layouts): every transaction allocates its path copies on its own
/// thread, and once meld replaced them another committing thread may free
/// them. `melddb bench` runs faster with it than with the system
/// allocator (docs/benchmarks.md, embedded suite).
#[global_allocator]
static GLOBAL: melddb_alloc::MeldAlloc = melddb_alloc::MeldAlloc;

#[derive(Debug, Parser)]
#[command(version, about = "MeldDB embedded database tool")]
struct Args {
    /// Database directory (created if missing).
    #[arg(long, env = "MELDDB_DIR", default_value = "melddb-data")]
    dir: PathBuf,
    /// Node cache budget in bytes: tree memory beyond it is evicted and
    /// read back from the log on use (0: keep everything in memory).
    #[arg(long, env = "MELDDB_CACHE_BYTES", default_value_t = melddb_runtime::DEFAULT_CACHE_BYTES)]
    cache_bytes: u64,
    /// A shared log on the log service, `melddb://HOST:PORT/LOG`, created
    /// if empty: the node joins it instead of keeping a log in `--dir`.
    #[arg(long, env = "MELDDB_LOG")]
    log: Option<String>,
    /// Bearer token for the log service.
    #[arg(long, env = "MELDDB_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// With --log: this node writes checkpoints into the shared log and
    /// publishes them for nodes that join later (and trims the log below
    /// the one before).
    #[arg(long)]
    publish_checkpoints: bool,
    /// Isolation of the transactions `put`, `del`, `bench` and `bank` run.
    #[arg(long, value_enum, default_value_t = IsolationArg::Serializable)]
    isolation: IsolationArg,
    /// Keep the whole log: checkpoints never trim it.
    #[arg(long)]
    no_trim: bool,
    /// Log bytes between checkpoints.
    #[arg(long, env = "MELDDB_CHECKPOINT_BYTES", default_value_t = melddb_runtime::DEFAULT_CHECKPOINT_BYTES)]
    checkpoint_bytes: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

/// `--isolation`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum IsolationArg {
    /// Reads, scanned ranges and writes validated.
    Serializable,
    /// Reads and writes validated, not scanned ranges.
    RepeatableRead,
    /// Written keys only (first committer wins).
    Snapshot,
}

impl From<IsolationArg> for Isolation {
    fn from(a: IsolationArg) -> Isolation {
        match a {
            IsolationArg::Serializable => Isolation::Serializable,
            IsolationArg::RepeatableRead => Isolation::RepeatableRead,
            IsolationArg::Snapshot => Isolation::SnapshotIsolation,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Write KEY = VALUE (UTF-8).
    Put {
        key: String,
        value: String,
        /// Print `{"key", "value"}` once committed.
        #[arg(long)]
        json: bool,
    },
    /// Print the value of KEY.
    Get {
        key: String,
        /// Print `{"key", "value"}` (`value` null when absent, exit 3).
        #[arg(long)]
        json: bool,
    },
    /// Delete KEY.
    Del {
        key: String,
        /// Print `{"key", "existed"}`.
        #[arg(long)]
        json: bool,
    },
    /// Print pairs in key order, one `key<TAB>value` per line.
    Scan {
        /// First key (inclusive).
        #[arg(long)]
        from: Option<String>,
        /// Last key (exclusive).
        #[arg(long)]
        to: Option<String>,
        /// At most this many pairs.
        #[arg(long)]
        limit: Option<usize>,
        /// Descending order.
        #[arg(long)]
        reverse: bool,
        /// One JSON array instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Print committed changes to keys under PREFIX as they arrive, one
    /// line per key (`POS<TAB>KEY<TAB>VALUE`, `POS<TAB>KEY<TAB>(deleted)`),
    /// until interrupted (or `--count` commits, or `--seconds`).
    Watch {
        /// Key prefix ("" watches everything).
        prefix: String,
        /// Stop after this many commits.
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<f64>,
        /// One JSON object per commit instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Verify every log record's checksum and the tree invariants.
    Check {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Write a checkpoint now (recovery starts from it; the log below the
    /// previous checkpoint is deleted).
    Checkpoint {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Database statistics.
    Stats {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Run a workload against the database and print a results table.
    Bench {
        /// Transaction shape: 8r2w (8 reads, 2 writes), 2op (1 read,
        /// 1 write) or ro (10 reads).
        #[arg(long, default_value = "8r2w")]
        mix: String,
        /// Client threads.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Seconds to run.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Keys (`bench/NNNNNNNNNN`, 100-byte values), loaded if missing.
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        /// Machine-readable output (no progress bar).
        #[arg(long)]
        json: bool,
    },
    /// A closed economy: client threads move money between accounts in
    /// serializable transactions; prints commits, aborts by reason, the
    /// node's position and digest, and whether the total held (exit 1 if
    /// not). Run it on several nodes of one shared log at once.
    Bank {
        /// Accounts (opened at 1,000 each if the database has none).
        #[arg(long, default_value_t = 100)]
        accounts: u64,
        /// Client threads.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Seconds to run.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Seed of the transfers' random choices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Machine-readable output (no progress bar), with the log
        /// positions of this node's commits.
        #[arg(long)]
        json: bool,
        /// Print a JSON progress line four times a second.
        #[arg(long, hide = true)]
        progress: bool,
    },
    /// Every client a full node: starts a log service on loopback over a
    /// temporary directory and runs `bank` in several node processes on
    /// one shared log, with a live display; then prints per node its
    /// commits, aborts by reason, position and digest, checks each node
    /// against a replay of the log, and whether the total held. Exits 1 if
    /// anything disagreed. Ignores --dir and --log.
    Demo {
        /// Node processes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Seconds of transfers.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Accounts.
        #[arg(long, default_value_t = 100)]
        accounts: u64,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Test support: run money transfers between accounts forever,
    /// printing `ack ID` after each commit is acknowledged (crash tests
    /// kill this process at random moments).
    #[command(hide = true)]
    CrashChild {
        #[arg(long, default_value_t = 16)]
        accounts: u64,
        #[arg(long, default_value_t = 0)]
        first_id: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Checkpoint every this many log bytes (small: kills land in them).
        #[arg(long, default_value_t = melddb_runtime::DEFAULT_CHECKPOINT_BYTES)]
        checkpoint_bytes: u64,
        /// Segment file size (small: trimming deletes files).
        #[arg(long, default_value_t = 64 << 20)]
        segment_bytes: u64,
    },
}

fn main() -> ExitCode {
    melddb_alloc::configure();
    let args = Args::parse();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("melddb: {e}");
            ExitCode::from(1)
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run(args: Args) -> Result<ExitCode, String> {
    if let Cmd::Demo {
        nodes,
        seconds,
        accounts,
        json,
    } = args.cmd
    {
        demo::run(demo::DemoArgs {
            nodes,
            seconds,
            accounts,
            json,
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    let opts = DbOptions {
        cache_bytes: args.cache_bytes,
        token: args.token.clone(),
        publish_checkpoints: args.publish_checkpoints,
        checkpoint_bytes: args.checkpoint_bytes,
        trim_log: !args.no_trim,
        ..DbOptions::default()
    };
    let db = match &args.log {
        Some(url) => Database::connect(url, &args.dir, opts),
        None => Database::open_with(&args.dir, opts),
    }
    .map_err(|e| e.to_string())?;
    let isolation = Isolation::from(args.isolation);
    match args.cmd {
        Cmd::Put { key, value, json } => {
            db.transact(isolation, |tx| tx.put(key.as_bytes(), value.as_bytes()))
                .map_err(|e| e.to_string())?;
            if json {
                println!("{}", serde_json::json!({"key": key, "value": value}));
            }
        }
        Cmd::Get { key, json } => {
            let v = db.get(key.as_bytes()).map_err(|e| e.to_string())?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"key": key, "value": v.as_deref().map(text)})
                );
            }
            match v {
                Some(v) if !json => println!("{}", text(&v)),
                Some(_) => {}
                None => {
                    if !json {
                        eprintln!("melddb: key {key:?} not found");
                    }
                    return Ok(ExitCode::from(3));
                }
            }
        }
        Cmd::Del { key, json } => {
            let existed = db
                .transact(isolation, |tx| tx.delete(key.as_bytes()))
                .map_err(|e| e.to_string())?;
            if json {
                println!("{}", serde_json::json!({"key": key, "existed": existed}));
            } else if !existed {
                eprintln!("melddb: key {key:?} was not present");
            }
        }
        Cmd::Scan {
            from,
            to,
            limit,
            reverse,
            json,
        } => {
            let start = from
                .as_deref()
                .map_or(Bound::Unbounded, |k| Bound::Included(k.as_bytes()));
            let end = to
                .as_deref()
                .map_or(Bound::Unbounded, |k| Bound::Excluded(k.as_bytes()));
            let order = if reverse {
                Order::Reverse
            } else {
                Order::Forward
            };
            // Streamed: a scan of any size holds one pair at a time.
            let snap = db.snapshot();
            let mut out = std::io::stdout().lock();
            if json {
                let _ = write!(out, "[");
            }
            for (i, pair) in snap.range(start, end, order, limit).enumerate() {
                let (k, v) = pair.map_err(|e| e.to_string())?;
                if json {
                    let sep = if i == 0 { "" } else { "," };
                    let obj = serde_json::json!({"key": text(&k), "value": text(&v)});
                    let _ = write!(out, "{sep}{obj}");
                } else {
                    let _ = writeln!(out, "{}\t{}", text(&k), text(&v));
                }
            }
            if json {
                let _ = writeln!(out, "]");
            }
        }
        Cmd::Watch {
            prefix,
            count,
            seconds,
            json,
        } => watch(&db, &prefix, count, seconds, json)?,
        Cmd::Check { json } => {
            // Opening verified every record and the checkpoint it started
            // from (recovery skips, and reports, one that does not verify);
            // now the tree.
            let s = db.snapshot();
            let tree = melddb::validate::check_tree(&s);
            let r = db.recovery();
            let ok = tree.is_ok() && r.skipped_checkpoints.is_empty();
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "ok": ok,
                        "records": r.records,
                        "torn_bytes_dropped": r.torn_bytes,
                        "recovered_from_checkpoint": r.checkpoint,
                        "damaged_checkpoints": r.skipped_checkpoints,
                        "tree": tree.as_ref().err().map(|e| e.0.clone()),
                        "digest": s.digest_hex(),
                    })
                );
            } else {
                for c in &r.skipped_checkpoints {
                    println!("damaged checkpoint (recovery used an older one): {c}");
                }
                match &tree {
                    Err(e) => println!("tree invariant violated: {}", e.0),
                    Ok(()) => println!(
                        "{}: {} log records verified, {}, tree valid, digest {}",
                        if ok { "ok" } else { "NOT ok" },
                        r.records,
                        match r.checkpoint {
                            Some(p) =>
                                format!("checkpoint of the state at {p} loaded and verified"),
                            None => "replayed from the genesis record".into(),
                        },
                        s.digest_hex()
                    ),
                }
            }
            if !ok {
                return Ok(ExitCode::from(1));
            }
        }
        Cmd::Checkpoint { json } => {
            let c = db.checkpoint().map_err(|e| e.to_string())?;
            let v = serde_json::json!({
                "begin": c.first,
                "last_part": c.pos,
                "csn": c.csn,
                "nodes": c.nodes,
                "bytes": c.bytes,
                "flushed_ephemeral_nodes": c.flushed_ephemeral,
                "seconds": c.micros as f64 / 1e6,
                "log_first": db.log_stats().first,
            });
            if json {
                println!("{v}");
            } else {
                println!(
                    "checkpoint of the state at {} (parts up to {}): {} nodes, {} bytes, {} ephemeral nodes persisted, {:.3} s; log now starts at {}",
                    c.first,
                    c.pos,
                    c.nodes,
                    c.bytes,
                    c.flushed_ephemeral,
                    c.micros as f64 / 1e6,
                    db.log_stats().first
                );
            }
        }
        Cmd::Stats { json } => {
            let s = db.snapshot();
            let r = db.recovery();
            let settings = db.settings();
            let log = db.log_stats();
            let v = serde_json::json!({
                "log_first": log.first,
                "log_tail": log.tail,
                "log_bytes": log.bytes,
                "last_checkpoint": log.last_checkpoint.as_ref().map(|c| c.first),
                "last_checkpoint_bytes": log.last_checkpoint.as_ref().map(|c| c.bytes),
                "recovered_from_checkpoint": r.checkpoint,
                "replayed_entries": r.replayed,
                "unpersisted_nodes": db.unpersisted_nodes(),
                "tree_memory_bytes_estimate": s.approx_bytes(),
                "cache_budget_bytes": db.cache_stats().budget,
                "nodes_read_back": db.cache_stats().store.nodes_loaded,
                "dir": args.dir.display().to_string(),
                "log_records": r.records,
                "last_position": s.pos(),
                "csn": s.csn(),
                "keys": s.len(),
                "tree_height": s.height(),
                "recovery_seconds": r.elapsed.as_secs_f64(),
                "torn_bytes_dropped": r.torn_bytes,
                "premeld_threads": settings.premeld_threads,
                "premeld_distance": settings.premeld_distance,
                "group_meld": settings.group_meld,
                "max_conflict_zone": settings.max_conflict_zone,
                "digest": s.digest_hex(),
            });
            if json {
                println!("{v}");
            } else if let Some(m) = v.as_object() {
                for (k, x) in m {
                    println!("{k:<20} {x}");
                }
            }
        }
        Cmd::Bench {
            mix,
            threads,
            seconds,
            keys,
            json,
        } => bench(db, &mix, threads, seconds, keys, json, isolation)?,
        Cmd::Bank {
            accounts,
            threads,
            seconds,
            seed,
            json,
            progress,
        } => bank::run(
            db,
            bank::BankArgs {
                accounts,
                threads,
                seconds,
                seed,
                json,
                progress,
                isolation,
            },
        )?,
        Cmd::Demo { .. } => unreachable!("handled before the database opens"),
        Cmd::CrashChild {
            accounts,
            first_id,
            seed,
            checkpoint_bytes,
            segment_bytes,
        } => {
            drop(db);
            let opts = DbOptions {
                durability: Durability::Sync,
                retry: melddb_runtime::RetryPolicy {
                    max_attempts: 1000,
                    ..Default::default()
                },
                checkpoint_bytes,
                segment_bytes,
                cache_bytes: args.cache_bytes,
                ..DbOptions::default()
            };
            crash_child(&args.dir, opts, accounts, first_id, seed)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `melddb watch`.
fn watch(
    db: &Database,
    prefix: &str,
    count: Option<u64>,
    seconds: Option<f64>,
    json: bool,
) -> Result<(), String> {
    let mut feed = db.watch_prefix(prefix.as_bytes());
    let deadline =
        seconds.map(|s| std::time::Instant::now() + std::time::Duration::from_secs_f64(s.max(0.0)));
    let mut seen = 0u64;
    while count.is_none_or(|c| seen < c) {
        let wait = match deadline {
            Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                Some(w) => w,
                None => break,
            },
            None => std::time::Duration::from_secs(3600),
        };
        let Some(c) = feed.next_timeout(wait).map_err(|e| e.to_string())? else {
            continue;
        };
        seen += 1;
        let mut out = std::io::stdout().lock();
        if json {
            let changes: Vec<_> = c
                .changes
                .iter()
                .map(|ch| serde_json::json!({"key": text(&ch.key), "value": ch.value.as_deref().map(text)}))
                .collect();
            let _ = writeln!(
                out,
                "{}",
                serde_json::json!({"pos": c.pos, "changes": changes})
            );
        } else {
            for ch in &c.changes {
                let value = ch.value.as_deref().map_or("(deleted)".to_string(), text);
                let _ = writeln!(out, "{}\t{}\t{}", c.pos, text(&ch.key), value);
            }
        }
        let _ = out.flush();
    }
    Ok(())
}

fn bench_key(i: u64) -> Vec<u8> {
    format!("bench/{i:010}").into_bytes()
}

/// `melddb bench`: loads `keys` keys if needed, runs `threads` clients for
/// `seconds` with a progress bar, then prints tps and latency percentiles.
fn bench(
    db: Database,
    mix: &str,
    threads: usize,
    seconds: f64,
    keys: u64,
    json: bool,
    isolation: Isolation,
) -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let (reads, writes) = match mix {
        "8r2w" => (8, 2),
        "2op" => (1, 1),
        "ro" => (10, 0),
        other => return Err(format!("unknown mix {other:?}: use 8r2w, 2op or ro")),
    };
    if threads == 0 || keys == 0 || seconds.is_nan() || seconds <= 0.0 {
        return Err("threads, keys and seconds must be positive".into());
    }
    let db = Arc::new(db);
    if db
        .get(&bench_key(keys - 1))
        .map_err(|e| e.to_string())?
        .is_none()
    {
        let bar = (!json).then(|| indicatif::ProgressBar::new(keys).with_message("loading"));
        let mut i = 0;
        while i < keys {
            let end = (i + 5_000).min(keys);
            db.transact(Isolation::SnapshotIsolation, |tx| {
                for j in i..end {
                    tx.put(&bench_key(j), &[b'v'; 100])?;
                }
                Ok::<_, melddb::TxnError>(())
            })
            .map_err(|e| e.to_string())?;
            i = end;
            if let Some(b) = &bar {
                b.set_position(i);
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (db, stop, done) = (db.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || -> Result<(Vec<f64>, u64), String> {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(t as u64 + 1);
                let mut lat = Vec::new();
                let mut aborts = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    loop {
                        let mut tx = db.begin(isolation);
                        for _ in 0..reads {
                            tx.get(&bench_key(rng.random_range(0..keys)))
                                .map_err(|e| e.to_string())?;
                        }
                        let mut v = [b'v'; 100];
                        v[..8].copy_from_slice(&rng.random::<u64>().to_le_bytes());
                        for _ in 0..writes {
                            tx.put(&bench_key(rng.random_range(0..keys)), &v)
                                .map_err(|e| e.to_string())?;
                        }
                        if db.commit(tx).map_err(|e| e.to_string())?.is_committed() {
                            break;
                        }
                        aborts += 1;
                    }
                    lat.push(t0.elapsed().as_secs_f64() * 1e3);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok((lat, aborts))
            })
        })
        .collect();
    let start = Instant::now();
    let total = Duration::from_secs_f64(seconds);
    let bar = (!json).then(|| {
        let b = indicatif::ProgressBar::new(total.as_millis() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {elapsed_precise} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    while start.elapsed() < total {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(b) = &bar {
            b.set_position(start.elapsed().as_millis() as u64);
            let n = done.load(Ordering::Relaxed);
            b.set_message(format!(
                "{n} committed, {:.0} tps",
                n as f64 / start.elapsed().as_secs_f64()
            ));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    let mut aborts = 0;
    for h in handles {
        let (l, a) = h
            .join()
            .map_err(|_| "client thread panicked".to_string())??;
        lat.extend(l);
        aborts += a;
    }
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let tps = lat.len() as f64 / elapsed;
    let v = serde_json::json!({
        "mix": mix, "threads": threads, "seconds": elapsed, "keys": keys,
        "committed": lat.len(), "aborted_attempts": aborts, "tps": tps,
        "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": lat.last().copied().unwrap_or(0.0),
        "durability": "sync (fdatasync per group commit)",
    });
    if json {
        println!("{v}");
    } else {
        println!(
            "{:<8} {:>7} {:>10} {:>10} {:>9} {:>9} {:>9}",
            "mix", "threads", "committed", "tps", "p50 ms", "p99 ms", "aborts"
        );
        println!(
            "{:<8} {:>7} {:>10} {:>10.0} {:>9.3} {:>9.3} {:>9}",
            mix,
            threads,
            lat.len(),
            tps,
            pct(0.5),
            pct(0.99),
            aborts
        );
    }
    Ok(())
}

/// Transfers between `accounts` accounts (each starting at 1000) from two
/// threads; each transfer also writes a marker `x/ID`. Runs until killed.
fn crash_child(
    dir: &std::path::Path,
    opts: DbOptions,
    accounts: u64,
    first_id: u64,
    seed: u64,
) -> Result<(), String> {
    let db = std::sync::Arc::new(Database::open_with(dir, opts).map_err(|e| e.to_string())?);
    let key = |i: u64| format!("acct/{i:04}").into_bytes();
    if db.get(&key(0)).map_err(|e| e.to_string())?.is_none() {
        db.transact(Isolation::Serializable, |tx| {
            for i in 0..accounts {
                tx.put(&key(i), b"1000")?;
            }
            Ok::<_, melddb::TxnError>(())
        })
        .map_err(|e| e.to_string())?;
    }
    println!("ready");
    {
        // Tell the test when checkpoints happen, so it can count kills
        // that land near them.
        let db = db.clone();
        std::thread::spawn(move || {
            let mut seen = db.log_stats().checkpoints_written;
            loop {
                std::thread::sleep(std::time::Duration::from_millis(1));
                let st = db.log_stats();
                if st.checkpoints_written != seen {
                    seen = st.checkpoints_written;
                    let pos = st.last_checkpoint.map_or(0, |c| c.pos);
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "checkpoint {pos}");
                    let _ = out.flush();
                }
            }
        });
    }
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed * 2 + t);
                let mut id = first_id + t;
                loop {
                    let a = rng.random_range(0..accounts);
                    let b = (a + rng.random_range(1..accounts)) % accounts;
                    let amount: i64 = rng.random_range(1..50);
                    let mut tx = db.begin(Isolation::Serializable);
                    let bal = |v: Option<melddb::Bytes>| -> i64 {
                        v.and_then(|v| text(&v).parse().ok()).unwrap_or(0)
                    };
                    let x = bal(tx.get(&key(a)).map_err(|e| e.to_string())?);
                    let y = bal(tx.get(&key(b)).map_err(|e| e.to_string())?);
                    tx.put(&key(a), (x - amount).to_string().as_bytes())
                        .map_err(|e| e.to_string())?;
                    tx.put(&key(b), (y + amount).to_string().as_bytes())
                        .map_err(|e| e.to_string())?;
                    tx.put(
                        format!("x/{id}").as_bytes(),
                        format!("{a}>{b}:{amount}").as_bytes(),
                    )
                    .map_err(|e| e.to_string())?;
                    if let Outcome::Committed { .. } = db.commit(tx).map_err(|e| e.to_string())? {
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "ack {id}");
                        let _ = out.flush();
                    }
                    id += 2;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "worker panicked".to_string())??;
    }
    Ok(())
}
