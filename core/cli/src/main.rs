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
use melddb::{Isolation, Order};
use melddb_runtime::{Database, DbOptions, Durability};

mod bank;
mod bench;
mod crash;
mod demo;
mod watch;

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
        } => watch::watch(&db, &prefix, count, seconds, json)?,
        Cmd::Check { json } => {
            // Opening verified every record and the checkpoint it started
            // from (recovery skips, and reports, one that does not verify);
            // now the tree.
            let s = db.snapshot();
            let tree = melddb::validate::check_tree(&s);
            let digest = s.digest_hex().map_err(|e| e.to_string())?;
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
                        "digest": digest,
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
                        digest
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
                "recovered_from_own_checkpoint": r.local_checkpoint,
                "own_checkpoint": log.local_checkpoint.as_ref().map(|c| c.first),
                "replayed_entries": r.replayed,
                "unpersisted_nodes": db.unpersisted_nodes(),
                "tree_memory_bytes_estimate": s.approx_bytes(),
                "cache_budget_bytes": db.cache_stats().budget,
                "nodes_read_back": db.cache_stats().store.nodes_loaded,
                "dir": args.dir.display().to_string(),
                "log_records": r.records,
                "last_position": s.pos(),
                "csn": s.csn(),
                "keys": s.len().map_err(|e| e.to_string())?,
                "tree_height": s.height(),
                "recovery_seconds": r.elapsed.as_secs_f64(),
                "torn_bytes_dropped": r.torn_bytes,
                "premeld_threads": settings.premeld_threads,
                "premeld_distance": settings.premeld_distance,
                "group_meld": settings.group_meld,
                "max_conflict_zone": settings.max_conflict_zone,
                "digest": s.digest_hex().map_err(|e| e.to_string())?,
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
        } => bench::bench(db, &mix, threads, seconds, keys, json, isolation)?,
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
            crash::crash_child(&args.dir, opts, accounts, first_id, seed)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
