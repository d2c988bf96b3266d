//! `melddb-bench`: every MeldDB benchmark suite behind one command.
//!
//! ```text
//! cargo run --release -p melddb-bench -- meld [--quick] [--json FILE] [--plots DIR]
//! ```
//! The table goes to stdout, progress to stderr, and `--json` writes
//! `{"suite", "metrics", "config", "rows"}`.

mod plot;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use melddb_bench::round2;
use melddb_bench::workload::{loaded, run, Measured, Spec, Write};

/// mimalloc (through melddb-alloc, which skips its aligned API for ordinary
/// layouts): meld allocates and frees many small nodes; the same allocator
/// serves the brute-force baseline in the same run.
#[global_allocator]
static GLOBAL: melddb_alloc::MeldAlloc = melddb_alloc::MeldAlloc;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Suite {
    /// The meld paper's §8 and App. F experiments on the meld operator.
    Meld,
    /// Hyder II's pipeline: premeld, group meld, end-to-end throughput.
    Pipeline,
    /// The embedded database against SQLite and redb.
    Embedded,
    /// The log service on loopback against the raw disk.
    Log,
    /// Redraw the embedded suite's plots (`--plots`) from its JSON
    /// (`--json`), without running anything.
    EmbeddedPlots,
    /// Redraw the pipeline suite's plots (`--plots`) from its JSON
    /// (`--json`), without running anything.
    PipelinePlots,
}

#[derive(Debug, Parser)]
#[command(version, about = "MeldDB benchmark suites")]
struct Args {
    /// Which suite to run.
    suite: Suite,
    /// Smaller sizes; finishes in under a minute.
    #[arg(long)]
    quick: bool,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write PNG plots into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// RNG seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Run only the experiments whose "name:ops:degree" contains this text
    /// (for example `symmetric:8:16`); in the embedded suite, the cells
    /// whose "engine:mix:tTHREADS" contains it (for example
    /// `melddb:8r2w:t4`), printed without the recovery and long runs.
    #[arg(long)]
    only: Option<String>,
    /// Measured transactions per experiment (default: 6,000 quick, 20,000 full).
    #[arg(long)]
    txns: Option<usize>,
    /// Meld suite: timed replays of each experiment's intentions; the
    /// fastest is reported, every round's rate is in the JSON (default: 1
    /// quick, 3 full).
    #[arg(long)]
    rounds: Option<usize>,
    /// Pipeline suite: keys loaded before the workload (default: 100,000
    /// quick, 1,000,000 full; the issue's large option is 10,000,000).
    #[arg(long)]
    keys: Option<u64>,
    /// Pipeline suite: the shortest conflict zone (snapshot lag) of a
    /// transaction (default: 300 quick, 10,000 full).
    #[arg(long)]
    zone_min: Option<u64>,
    /// Pipeline suite: the longest conflict zone; lags are uniform between
    /// the two (default: 600 quick, 30,000 full, Hyder II's range).
    #[arg(long)]
    zone_max: Option<u64>,
    /// Log suite: run only this load point on a fresh service and print
    /// what the writer did during it: `CLIENTSxDEPTHxBATCHxBYTES` (closed
    /// loop, e.g. `64x4x64x1024`) or `CLIENTSxBATCHxBYTES@RATE` (open loop,
    /// Poisson arrivals, e.g. `64x64x1024@90000`).
    #[arg(long)]
    point: Option<melddb_bench::logsvc::PointSpec>,
    /// Log suite with `--point`: seconds to run it.
    #[arg(long, default_value_t = 4.0)]
    secs: f64,
    /// Log suite with `--point`: spare segments per zone
    /// (`prepared_segments`; 0: segments start as empty files).
    #[arg(long, default_value_t = 0)]
    spares: u32,
    /// Log suite with `--point --spares N`: the spares' background refill
    /// rate in MiB/s (0: unlimited).
    #[arg(long, default_value_t = 64)]
    spares_mib_s: u32,
    /// Log suite with `--point --spares N`: wait until the refill after
    /// the open is done before the load starts.
    #[arg(long)]
    spares_wait: bool,
    /// Log suite with `--point`: run the writer and fsync helpers at this
    /// SCHED_FIFO priority (`realtime_priority`, 1-99; 0: ordinary
    /// threads). Needs CAP_SYS_NICE; the probe prints whether it applied.
    #[arg(long, default_value_t = 0)]
    realtime: u8,
    /// Log suite with `--point`: give the writer this CPU to itself
    /// (`writer_cpu`), the fsync helpers, network threads and clients
    /// the others.
    #[arg(long)]
    writer_cpu: Option<usize>,
    /// Log suite with `--point`: the writer's and fsync helpers' time
    /// slice in microseconds (`slice_us`, 100-100000; 0: the system's).
    #[arg(long, default_value_t = 0)]
    slice_us: u32,
    /// Log suite with `--point`: the largest batch whose round the
    /// writer runs itself (`writer_round_max_bytes`, payload bytes; 0:
    /// every round on the fsync helpers). Unset: the service's default.
    #[arg(long)]
    writer_round_bytes: Option<u64>,
    /// Log suite with `--point`: leave transparent huge pages as the
    /// system has them (`disable_transparent_huge_pages = false`); the
    /// service turns them off by default.
    #[arg(long)]
    keep_thp: bool,
    /// Log suite with `--point`: fsync every segment file of a round
    /// (`flush_once_per_device = false`) instead of writing segments made
    /// from spares back and flushing each device once.
    #[arg(long)]
    fsync_each_file: bool,
    /// Log suite with `--point`: make nothing durable (`fsync = false`):
    /// no write-back, no fsync, no flush. Not a durable log; it times the
    /// service's own path (sockets, tasks, the writer) without the disk,
    /// whose latency a probe on a slow disk cannot see past. What it
    /// leaves dirty is written back by the kernel once it passes the
    /// background threshold (2.3 GB on the benchmark VM, about 10 s at 150K
    /// appends/s of 1 KiB), which then shows in the tail: keep warm-up
    /// and run short of that.
    #[arg(long)]
    no_fsync: bool,
    /// Log suite with `--point`: write large batches' whole blocks
    /// directly on the fsync helpers (`direct_writes = true`) instead of
    /// copying every page into the page cache on the writer thread.
    #[arg(long)]
    direct: bool,
    /// Log suite with `--point`: write every page and end-write directly
    /// in whole 4 KiB blocks on the fsync helpers, each segment's last
    /// partial block from the writer's memory (`direct_every_block =
    /// true`), so nothing goes through the page cache.
    #[arg(long)]
    direct_every_block: bool,
    /// Log suite with `--point`: run the same load this many seconds
    /// first, unmeasured, so the figures are of a service past its first
    /// seconds (memory faulted in, the first end-write segments replaced
    /// by former data segments when the load fills a segment).
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// Log suite with `--point`: after the warm-up, run this other load
    /// point (same syntax) for `--secs`, unmeasured, and wait for the
    /// spares' refill, as the suite does between points; the measured
    /// run then shows the service coming out of that load.
    #[arg(long)]
    before: Option<melddb_bench::logsvc::PointSpec>,
    /// Log suite with `--point`: leave the service idle this many seconds
    /// right before the measured run (after the warm-up and `--before`),
    /// as the suite's half-target point follows the disk-alone floors.
    #[arg(long, default_value_t = 0.0)]
    idle: f64,
    /// Log suite with `--point`: data pages per stripe, with one parity
    /// page and one zone (directory) per page. The suite uses 4; it also
    /// measures 64 KiB records with 8.
    #[arg(long, default_value_t = melddb_bench::logsvc::DATA_SHARDS)]
    data_shards: usize,
    /// Log suite with an open-loop `--point`: run no service; time the
    /// disk alone as a durable log under the same arrivals, twice: one
    /// file (write + fdatasync per group of batches, parity bytes
    /// included), then the service's files (a file per zone, three
    /// end-write files, write-back and one flush). The suite measures both
    /// before its half-target point.
    #[arg(long)]
    disk_alone: bool,
    /// With `--disk-alone`: also time the service's files written with
    /// `O_DIRECT` in whole 4 KiB blocks through `io_uring` (Linux): a
    /// group's writes in one submission, one submission per file, and
    /// the end-write files only after the page files; each group then
    /// flushed once. What the page cache and its write-back cost against
    /// writing straight to the disk.
    #[arg(long, requires = "disk_alone")]
    direct_floors: bool,
    /// With `--disk-alone`: also time the service's files with each
    /// group's round (write-backs waited for, one flush) on a thread of
    /// its own, at most this many rounds at once, groups answered in
    /// order; a comma-separated list of depths, each timed in turn
    /// (`0,1,2,4`). Depth 0 writes nothing during a round (as the
    /// service's-files floor); 1 is the service's writer as built (the
    /// next batch written during a round); more is rounds overlapping on
    /// the device, which the service does not do.
    #[arg(long, requires = "disk_alone", value_delimiter = ',')]
    overlap_depths: Vec<usize>,
    /// With `--overlap-depths`: time each depth again with every round's
    /// flush an `fdatasync` of a file nothing writes, so a round waits
    /// for its own group's pages only (the first page file's `fdatasync`
    /// also waits for what later groups wrote to it meanwhile).
    #[arg(long, requires = "overlap_depths")]
    overlap_anchor: bool,
    /// Log suite with `--point`: segments in slots of one device image
    /// per zone (`devices`; sparse files standing in for raw devices)
    /// instead of segment files.
    #[arg(long)]
    devices: bool,
}

fn main() {
    melddb_alloc::configure();
    let args = Args::parse();
    let result = match args.suite {
        Suite::Meld => meld_suite(&args),
        Suite::Pipeline => pipeline_suite(&args),
        Suite::Embedded => embedded_suite(&args),
        Suite::Log => log_suite(&args),
        Suite::EmbeddedPlots => embedded_replot(&args),
        Suite::PipelinePlots => pipeline_replot(&args),
    };
    if let Err(e) = result {
        eprintln!("melddb-bench: {e}");
        std::process::exit(1);
    }
}

fn specs(quick: bool) -> Vec<Spec> {
    let txns = if quick { 6_000 } else { 20_000 };
    let sizes: &[usize] = if quick {
        &[2, 8, 32]
    } else {
        &[2, 4, 8, 16, 32]
    };
    let degrees: &[u64] = if quick {
        &[1, 16, 256]
    } else {
        &[1, 4, 16, 64, 256]
    };
    let mut v = Vec::new();
    let base = Spec {
        experiment: "symmetric",
        keys: 128 * 1024,
        ops: 2,
        degree: 16,
        read_pct: 50,
        write: Write::Update,
        txns,
        brute: false,
    };
    for &d in degrees {
        for &ops in sizes {
            v.push(Spec {
                ops,
                degree: d,
                brute: true,
                ..base.clone()
            });
        }
    }
    let pcts: &[u32] = if quick {
        &[0, 50, 90]
    } else {
        &[0, 20, 40, 60, 80, 90]
    };
    for &d in if quick {
        &[16u64][..]
    } else {
        &[16u64, 64][..]
    } {
        for ops in [2usize, 8] {
            for &p in pcts {
                v.push(Spec {
                    experiment: "read-pct",
                    ops,
                    degree: d,
                    read_pct: p,
                    ..base.clone()
                });
            }
        }
    }
    for &d in if quick {
        &[16u64][..]
    } else {
        &[1u64, 16, 64][..]
    } {
        for &ops in sizes {
            v.push(Spec {
                experiment: "asymmetric",
                ops,
                degree: d,
                write: Write::Insert,
                ..base.clone()
            });
        }
    }
    for keys in [128 * 1024u64, 512 * 1024] {
        for ops in [2usize, 8] {
            v.push(Spec {
                experiment: "db-size",
                keys,
                ops,
                ..base.clone()
            });
        }
    }
    v
}

fn meld_suite(args: &Args) -> Result<(), String> {
    let start = Instant::now();
    let specs: Vec<Spec> = specs(args.quick)
        .into_iter()
        .map(|s| Spec {
            txns: args.txns.unwrap_or(s.txns),
            ..s
        })
        .filter(|s| {
            args.only.as_ref().is_none_or(|f| {
                format!("{}:{}:{}", s.experiment, s.ops, s.degree).contains(f.as_str())
            })
        })
        .collect();
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 });
    let mut bases: BTreeMap<u64, melddb::Melder> = BTreeMap::new();
    let mut rows: Vec<Measured> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let base = bases.entry(spec.keys).or_insert_with(|| {
            eprintln!("loading {} keys ...", spec.keys);
            loaded(spec.keys)
        });
        eprint!(
            "\r[{:>3}/{}] {:<10} ops={:<2} deg={:<3} read={:>2}% keys={:<6} ({:.0}s)   ",
            i + 1,
            specs.len(),
            spec.experiment,
            spec.ops,
            spec.degree,
            spec.read_pct,
            spec.keys,
            start.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().flush();
        rows.push(run(spec, base, args.seed + i as u64, rounds));
    }
    eprintln!("\ndone in {:.1}s", start.elapsed().as_secs_f64());
    print_table(&rows);

    let find = |exp: &str, ops: usize, deg: u64| {
        rows.iter().find(|r| {
            r.spec.experiment == exp
                && r.spec.ops == ops
                && r.spec.degree == deg
                && r.spec.keys == 128 * 1024
        })
    };
    let mut metrics: BTreeMap<String, f64> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.spec.experiment == "symmetric") {
        let tag = format!("{}op_deg{}", r.spec.ops, r.spec.degree);
        metrics.insert(format!("meld_tps_{tag}"), r.meld_tps.round());
        metrics.insert(format!("bruteforce_tps_{tag}"), r.brute_tps.round());
        metrics.insert(format!("nodes_per_meld_{tag}"), round2(r.nodes_per_meld));
        metrics.insert(
            format!("ephemeral_per_meld_{tag}"),
            round2(r.ephemeral_per_meld),
        );
        metrics.insert(format!("abort_rate_{tag}"), round2(r.abort_rate));
        metrics.insert(format!("meld_p99_us_{tag}"), round2(r.p99_us));
        metrics.insert(
            format!("meld_tps_{tag}_slowest_round"),
            r.slowest_meld_tps().round(),
        );
    }
    for r in rows.iter().filter(|r| r.spec.experiment == "asymmetric") {
        metrics.insert(
            format!("asym_meld_tps_{}op_deg{}", r.spec.ops, r.spec.degree),
            r.meld_tps.round(),
        );
    }
    for r in rows.iter().filter(|r| r.spec.experiment == "db-size") {
        metrics.insert(
            format!("meld_tps_{}op_deg16_{}k", r.spec.ops, r.spec.keys / 1024),
            r.meld_tps.round(),
        );
    }
    for r in rows.iter().filter(|r| r.spec.experiment == "read-pct") {
        metrics.insert(
            format!(
                "meld_tps_{}op_deg{}_read{}",
                r.spec.ops, r.spec.degree, r.spec.read_pct
            ),
            r.meld_tps.round(),
        );
    }
    let meta = find("symmetric", 8, 16).map_or(0.0, |r| r.meta_bytes_per_node);
    metrics.insert("meta_bytes_per_node".into(), round2(meta));
    let disagreements: u64 = rows.iter().map(|r| r.brute_disagreements).sum();
    metrics.insert("bruteforce_disagreements".into(), disagreements as f64);
    if let (Some(m), Some(b)) = (
        find("symmetric", 8, 16),
        find("symmetric", 8, 16).map(|r| r.brute_tps),
    ) {
        metrics.insert(
            "meld_over_bruteforce_8op_deg16".into(),
            round2(m.meld_tps / b.max(1.0)),
        );
    }
    println!();
    for k in [
        "meld_tps_2op_deg16",
        "meld_tps_8op_deg16",
        "bruteforce_tps_8op_deg16",
        "meld_over_bruteforce_8op_deg16",
        "meta_bytes_per_node",
        "bruteforce_disagreements",
    ] {
        if let Some(v) = metrics.get(k) {
            println!("{k:<34} {v}");
        }
    }
    if let Some(dir) = &args.plots {
        plot::meld_plots(dir, &rows).map_err(|e| format!("plots: {e}"))?;
        eprintln!("plots written to {}", dir.display());
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "suite": "meld",
            "metrics": metrics,
            "config": {
                "quick": args.quick,
                "seed": args.seed,
                "isolation": "serializable",
                "key_bytes": 8,
                "value_bytes": 8,
                "timing": "meld only, per intention; decoding (pre-deserialization) untimed as in the paper",
                "rounds": rounds,
                "rate": "1 / mean meld latency of the fastest round (meld and brute force each their own)",
                "threads": 1,
            },
            "rows": rows,
        });
        write_json(path, &doc)?;
    }
    if disagreements > 0 {
        return Err(format!(
            "meld and the brute-force validator disagreed {disagreements} times"
        ));
    }
    Ok(())
}

fn pipeline_suite(args: &Args) -> Result<(), String> {
    use melddb_bench::pipeline::{run_config, PipeConfig, PipeResult, Sizes};
    let sizes = if args.quick {
        Sizes {
            keys: args.keys.unwrap_or(100_000),
            txns: args.txns.unwrap_or(6_000),
            zone_min: args.zone_min.unwrap_or(300),
            zone_max: args.zone_max.unwrap_or(600),
        }
    } else {
        Sizes {
            keys: args.keys.unwrap_or(1_000_000),
            txns: args.txns.unwrap_or(40_000),
            // Hyder II §3.2: at its measured throughput a conflict zone
            // was typically 10K-30K transactions.
            zone_min: args.zone_min.unwrap_or(10_000),
            zone_max: args.zone_max.unwrap_or(30_000),
        }
    };
    let reps = if args.quick { 1 } else { 3 };
    let main = [
        PipeConfig {
            name: "plain",
            t: 0,
            d: 0,
            group: false,
        },
        PipeConfig {
            name: "group",
            t: 0,
            d: 0,
            group: true,
        },
        PipeConfig {
            name: "premeld",
            t: 2,
            d: 1,
            group: false,
        },
        PipeConfig {
            name: "both",
            t: 2,
            d: 1,
            group: true,
        },
    ];
    let sweep: &[u32] = if args.quick {
        &[1, 20]
    } else {
        &[1, 2, 5, 10, 20, 50, 100]
    };
    // The wasm comparison runs first: it needs the wasm32-wasip1 target and
    // Node, and a missing one should fail the suite at once, not after the
    // configurations have run for ten minutes.
    eprintln!("pipeline: wasm vs native meld ...");
    let wasm = melddb_bench::wasm::ratio(args.quick, args.seed)?;
    if std::env::var_os("MELDDB_BENCH_WASM_ONLY").is_some() {
        println!("{wasm:?}");
        return Ok(());
    }
    let mut rows: Vec<PipeResult> = Vec::new();
    let only = std::env::var("MELDDB_BENCH_ONLY").ok();
    for c in main {
        if only.as_deref().is_some_and(|o| o != c.name) {
            continue;
        }
        eprintln!(
            "pipeline: {} (t={}, d={}, group={}) ...",
            c.name, c.t, c.d, c.group
        );
        rows.push(run_config(c, &sizes, args.seed, reps)?);
    }
    let mut sweep_rows = Vec::new();
    for &d in sweep {
        let c = PipeConfig {
            name: "sweep",
            t: 2,
            d,
            group: false,
        };
        eprintln!("pipeline: premeld distance sweep t=2 d={d} ...");
        sweep_rows.push(run_config(c, &sizes, args.seed, 1)?);
    }
    println!(
        "{:<10} {:>3} {:>4} {:>6} {:>12} {:>8} {:>14} {:>14} {:>10} {:>10} {:>11} {:>9}",
        "config",
        "t",
        "d",
        "group",
        "e2e tps",
        "commit",
        "final nodes/tx",
        "prep nodes/tx",
        "final zone",
        "final busy",
        "final us/tx",
        "cpu cores"
    );
    for r in rows.iter().chain(&sweep_rows) {
        println!(
            "{:<10} {:>3} {:>4} {:>6} {:>12.0} {:>8.3} {:>14.1} {:>14.1} {:>10.1} {:>10.2} {:>11.2} {:>9.2}",
            r.config.name, r.config.t, r.config.d, r.config.group, r.tps, r.commit_rate,
            r.final_nodes_per_txn, r.prep_nodes_per_txn, r.final_zone, r.final_busy, r.final_us_per_txn,
            r.cpu_cores
        );
    }
    println!(
        "wasm meld: {:.0} intentions/s, native {:.0}/s, ratio {:.2}",
        wasm.wasm_per_s, wasm.native_per_s, wasm.ratio
    );
    let by = |n: &str| {
        rows.iter()
            .find(|r| r.config.name == n)
            .ok_or(format!("no {n} row"))
    };
    let (plain, premeld, group, both) = (by("plain")?, by("premeld")?, by("group")?, by("both")?);
    let mut metrics = serde_json::Map::new();
    let mut put = |k: &str, v: f64| {
        metrics.insert(k.into(), serde_json::json!(round2(v)));
    };
    put("final_meld_nodes_per_txn_plain", plain.final_nodes_per_txn);
    put(
        "final_meld_nodes_per_txn_premeld",
        premeld.final_nodes_per_txn,
    );
    put("final_meld_nodes_per_txn_group", group.final_nodes_per_txn);
    put("final_meld_nodes_per_txn_both", both.final_nodes_per_txn);
    put(
        "final_meld_nodes_ratio_plain_to_premeld",
        plain.final_nodes_per_txn / premeld.final_nodes_per_txn.max(1e-9),
    );
    put("e2e_tps_plain", plain.tps);
    put("e2e_tps_premeld", premeld.tps);
    put("e2e_tps_group", group.tps);
    put("e2e_tps_both", both.tps);
    put("e2e_speedup_premeld", premeld.tps / plain.tps);
    put("e2e_speedup_both", both.tps / plain.tps);
    put("final_meld_us_per_txn_plain", plain.final_us_per_txn);
    put("final_meld_us_per_txn_premeld", premeld.final_us_per_txn);
    put("final_meld_us_per_txn_both", both.final_us_per_txn);
    put(
        "final_meld_ceiling_tps_plain",
        1e6 / plain.final_us_per_txn.max(1e-9),
    );
    put(
        "final_meld_ceiling_tps_premeld",
        1e6 / premeld.final_us_per_txn.max(1e-9),
    );
    put(
        "final_meld_ceiling_tps_both",
        1e6 / both.final_us_per_txn.max(1e-9),
    );
    put("final_zone_plain", plain.final_zone);
    put("final_zone_premeld", premeld.final_zone);
    put("wasm_to_native_meld_ratio", wasm.ratio);
    if let Some(dir) = &args.plots {
        plot::pipeline_plots(dir, &rows, &sweep_rows).map_err(|e| format!("plots: {e}"))?;
        eprintln!("plots written to {}", dir.display());
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "suite": "pipeline",
            "metrics": metrics,
            "config": {
                "quick": args.quick, "seed": args.seed, "keys": sizes.keys, "txns": sizes.txns,
                "zone_min": sizes.zone_min, "zone_max": sizes.zone_max, "value_bytes": 100, "ops": "8 reads + 2 writes, serializable",
                "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
                "wasm": {"native_per_s": wasm.native_per_s, "wasm_per_s": wasm.wasm_per_s, "runtime": "node WASI (wasm32-wasip1)"},
            },
            "rows": rows.iter().map(PipeResult::to_json).collect::<Vec<_>>(),
            "sweep": sweep_rows.iter().map(PipeResult::to_json).collect::<Vec<_>>(),
        });
        write_json(path, &doc)?;
    }
    Ok(())
}

fn embedded_suite(args: &Args) -> Result<(), String> {
    use melddb_bench::embedded::{long_run, recovery, run_cell, Engine, Mix};
    use std::time::Duration;
    let (keys, secs, threads): (u64, f64, &[usize]) = if args.quick {
        (20_000, 0.6, &[1, 4])
    } else {
        (200_000, 3.0, &[1, 2, 4, 8])
    };
    let mixes = [Mix::R8W2, Mix::Op2, Mix::ReadOnly];
    // `--only engine:mix:tN` (any part of it) runs just those cells and
    // prints them: for profiling one engine without the whole suite.
    let plan: Vec<(Mix, usize, Engine)> = mixes
        .iter()
        .flat_map(|&m| {
            threads
                .iter()
                .flat_map(move |&t| Engine::ALL.map(|e| (m, t, e)))
        })
        .filter(|(m, t, e)| {
            args.only
                .as_ref()
                .is_none_or(|f| format!("{}:{}:t{t}", e.name(), m.name()).contains(f.as_str()))
        })
        .collect();
    let total = plan.len();
    let mut cells = Vec::new();
    let started = Instant::now();
    for (mix, t, e) in plan {
        eprint!(
            "\r[{:>2}/{total}] {:<16} {:<5} threads={t} ({:.0}s)   ",
            cells.len() + 1,
            e.name(),
            mix.name(),
            started.elapsed().as_secs_f64()
        );
        cells.push(run_cell(
            e,
            mix,
            t,
            keys,
            Duration::from_secs_f64(secs),
            args.seed,
        )?);
    }
    eprintln!();
    if args.only.is_some() {
        print_cells(&cells);
        return Ok(());
    }
    let (rec_target, rec_keys, rec_every) = if args.quick {
        (64u64 << 20, 20_000, 8u64 << 20)
    } else {
        (512 << 20, 200_000, melddb_runtime::DEFAULT_CHECKPOINT_BYTES)
    };
    eprintln!(
        "recovery: {} MiB of updates without checkpoints ...",
        rec_target >> 20
    );
    // Segments of half a checkpoint interval, in both runs, so trimming
    // can delete files.
    let rec_seg = (rec_every / 2).clamp(1 << 20, 64 << 20);
    let rec_off = recovery(rec_target, 0, rec_seg, rec_keys)?;
    eprintln!(
        "recovery: the same with a checkpoint every {} MiB ...",
        rec_every >> 20
    );
    let rec_on = recovery(rec_target, rec_every, rec_seg, rec_keys)?;
    let (long_secs, long_every) = if args.quick {
        (3.0, 2u64 << 20)
    } else {
        (30.0, 16u64 << 20)
    };
    eprintln!(
        "long run: 8r2w, 4 threads, {long_secs} s, checkpoint every {} MiB ...",
        long_every >> 20
    );
    let samples = long_run(
        keys,
        4,
        Duration::from_secs_f64(long_secs),
        long_every,
        args.seed,
    )?;
    print_cells(&cells);
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let gib = rec_off.appended_bytes as f64 / (1u64 << 30) as f64;
    let rec_s = rec_off.secs;
    println!(
        "recovery without checkpoints: {:.3} s for {:.1} MiB of log = {:.2} s/GiB ({} entries replayed, directory {:.1} MiB)",
        rec_s,
        mib(rec_off.appended_bytes),
        rec_s / gib,
        rec_off.replayed,
        mib(rec_off.dir_bytes)
    );
    println!(
        "recovery with checkpoints:    {:.3} s after {:.1} MiB of log ({} checkpoints; started at {:?}, {} entries replayed, directory {:.1} MiB) = {:.1}x faster",
        rec_on.secs,
        mib(rec_on.appended_bytes),
        rec_on.checkpoints,
        rec_on.from_checkpoint,
        rec_on.replayed,
        mib(rec_on.dir_bytes),
        rec_off.secs / rec_on.secs.max(1e-9)
    );
    let unpersisted: Vec<u64> = samples.iter().map(|x| x.unpersisted_nodes).collect();
    let un_max = unpersisted.iter().copied().max().unwrap_or(0);
    let un_mean = unpersisted.iter().sum::<u64>() as f64 / unpersisted.len().max(1) as f64;
    let last = samples.last();
    let long_ckpts = last.map_or(0, |x| x.checkpoints);
    let long_tps = last.map_or(0.0, |x| x.committed as f64 / x.t.max(1e-9));
    let log_max = samples.iter().map(|x| x.log_bytes).max().unwrap_or(0);
    println!(
        "long run: {long_tps:.0} tps, {long_ckpts} checkpoints; unpersisted (ephemeral, in memory only) nodes: max {un_max}, mean {un_mean:.0}; log on disk at most {:.1} MiB",
        mib(log_max)
    );
    let mut metrics = serde_json::Map::new();
    for c in &cells {
        let base = format!("{}_tps_{}_t{}", c.engine.name(), c.mix.name(), c.threads);
        metrics.insert(base, serde_json::json!(round2(c.tps)));
        metrics.insert(
            format!("{}_p99_ms_{}_t{}", c.engine.name(), c.mix.name(), c.threads),
            serde_json::json!(round2(c.p99_ms * 1000.0) / 1000.0),
        );
    }
    metrics.insert(
        "recovery_s_per_gib".into(),
        serde_json::json!(round2(rec_s / gib)),
    );
    for (k, v) in [
        ("recovery_s_no_checkpoints", rec_off.secs),
        ("recovery_s_with_checkpoints", rec_on.secs),
        (
            "recovery_speedup_checkpoints",
            rec_off.secs / rec_on.secs.max(1e-9),
        ),
        ("log_dir_mib_no_checkpoints", mib(rec_off.dir_bytes)),
        ("log_dir_mib_with_checkpoints", mib(rec_on.dir_bytes)),
        ("long_run_tps", long_tps),
        ("long_run_checkpoints", long_ckpts as f64),
        ("long_run_unpersisted_nodes_max", un_max as f64),
        ("long_run_unpersisted_nodes_mean", un_mean),
        ("long_run_log_mib_max", mib(log_max)),
    ] {
        metrics.insert(k.into(), serde_json::json!(round2(v)));
    }
    let get = |k: &str| metrics.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
    let m4 = get("melddb_tps_8r2w_t4");
    let ratio_full = m4 / get("sqlite_full_tps_8r2w_t4").max(1e-9);
    let ratio_redb = m4 / get("redb_tps_8r2w_t4").max(1e-9);
    let ratio_normal =
        get("melddb_buffered_tps_8r2w_t4") / get("sqlite_normal_tps_8r2w_t4").max(1e-9);
    println!(
        "8r2w, 4 threads: MeldDB/SQLite FULL {ratio_full:.2}x, MeldDB/redb {ratio_redb:.2}x, MeldDB buffered/SQLite NORMAL {ratio_normal:.2}x"
    );
    metrics.insert(
        "melddb_over_sqlite_full_8r2w_t4".into(),
        serde_json::json!(round2(ratio_full)),
    );
    metrics.insert(
        "melddb_over_redb_8r2w_t4".into(),
        serde_json::json!(round2(ratio_redb)),
    );
    metrics.insert(
        "melddb_buffered_over_sqlite_normal_8r2w_t4".into(),
        serde_json::json!(round2(ratio_normal)),
    );
    if let Some(dir) = &args.plots {
        plot::embedded_plots(dir, &cells, &samples)?;
        eprintln!("plots written to {}", dir.display());
    }
    if let Some(path) = &args.json {
        let rows: Vec<_> = cells
            .iter()
            .map(|c| {
                serde_json::json!({
                    "engine": c.engine.name(), "durability": c.engine.durability(), "mix": c.mix.name(),
                    "threads": c.threads, "tps": round2(c.tps), "p50_ms": c.p50_ms, "p99_ms": c.p99_ms,
                    "bytes_per_txn": round2(c.bytes_per_txn), "retries_per_txn": c.retries_per_txn,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "suite": "embedded",
            "metrics": metrics,
            "config": {
                "quick": args.quick, "seed": args.seed, "keys": keys, "seconds_per_cell": secs,
                "key_bytes": 8, "value_bytes": 100, "isolation": "serializable",
                "recovery_log_bytes": rec_off.appended_bytes,
                "recovery_keys": rec_keys,
                "long_run_seconds": long_secs, "long_run_checkpoint_bytes": long_every,
            },
            "rows": rows,
            "recovery": [rec_off, rec_on],
            "long_run": samples,
        });
        write_json(path, &doc)?;
    }
    Ok(())
}

/// The embedded suite's results table.
fn print_cells(cells: &[melddb_bench::embedded::Cell]) {
    println!(
        "{:<16} {:<10} {:<5} {:>3} {:>10} {:>9} {:>9} {:>12} {:>9}",
        "engine", "durability", "mix", "thr", "tps", "p50 ms", "p99 ms", "bytes/txn", "retries"
    );
    for c in cells {
        println!(
            "{:<16} {:<10} {:<5} {:>3} {:>10.0} {:>9.3} {:>9.3} {:>12.0} {:>9.3}",
            c.engine.name(),
            c.engine.durability(),
            c.mix.name(),
            c.threads,
            c.tps,
            c.p50_ms,
            c.p99_ms,
            c.bytes_per_txn,
            c.retries_per_txn
        );
    }
}

fn embedded_replot(args: &Args) -> Result<(), String> {
    use melddb_bench::embedded::{Cell, Engine, Mix, Sample};
    let (Some(json), Some(dir)) = (&args.json, &args.plots) else {
        return Err("embedded-plots needs --json FILE (input) and --plots DIR".into());
    };
    let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let f = |r: &serde_json::Value, k: &str| r.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
    let cells: Vec<Cell> = doc["rows"]
        .as_array()
        .ok_or("no rows in the JSON")?
        .iter()
        .filter_map(|r| {
            Some(Cell {
                engine: Engine::from_name(r["engine"].as_str()?)?,
                mix: Mix::from_name(r["mix"].as_str()?)?,
                threads: r["threads"].as_u64()? as usize,
                tps: f(r, "tps"),
                p50_ms: f(r, "p50_ms"),
                p99_ms: f(r, "p99_ms"),
                bytes_per_txn: f(r, "bytes_per_txn"),
                retries_per_txn: f(r, "retries_per_txn"),
            })
        })
        .collect();
    let samples: Vec<Sample> =
        serde_json::from_value(doc["long_run"].clone()).map_err(|e| e.to_string())?;
    plot::embedded_plots(dir, &cells, &samples)?;
    eprintln!("plots written to {}", dir.display());
    Ok(())
}

fn pipeline_replot(args: &Args) -> Result<(), String> {
    use melddb_bench::pipeline::PipeResult;
    let (Some(json), Some(dir)) = (&args.json, &args.plots) else {
        return Err("pipeline-plots needs --json FILE (input) and --plots DIR".into());
    };
    let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    if doc["suite"] != "pipeline" {
        return Err(format!(
            "{} is not the pipeline suite's JSON",
            json.display()
        ));
    }
    let parse = |key: &str| -> Result<Vec<PipeResult>, String> {
        doc[key]
            .as_array()
            .ok_or(format!("no {key} in the JSON"))?
            .iter()
            .enumerate()
            .map(|(i, r)| PipeResult::from_json(r, &format!("{key}[{i}]")))
            .collect()
    };
    let (rows, sweep) = (parse("rows")?, parse("sweep")?);
    plot::pipeline_plots(dir, &rows, &sweep).map_err(|e| format!("plots: {e}"))?;
    eprintln!("plots written to {}", dir.display());
    Ok(())
}

fn log_suite(args: &Args) -> Result<(), String> {
    if let Some(spec) = args.point {
        return log_point(args, spec);
    }
    let r = melddb_bench::logsvc::run(args.quick)?;
    println!(
        "{:<42} {:>5} {:>5} {:>5} {:>7} {:>11} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "run",
        "cli",
        "depth",
        "batch",
        "record",
        "ops/s",
        "MiB/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms"
    );
    let all: Vec<&melddb_bench::logsvc::Point> = r
        .clients
        .iter()
        .chain(&r.sizes)
        .chain([
            &r.half_load,
            &r.half_target_warmup,
            &r.half_target_load,
            &r.half_target_disk,
            &r.half_target_disk_files,
            &r.reads,
        ])
        .chain([&r.fresh_files.batched, &r.fresh_files.half_load])
        .collect();
    for p in &all {
        println!(
            "{:<42} {:>5} {:>5} {:>5} {:>7} {:>11.0} {:>9.1} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            p.label,
            p.clients,
            p.depth,
            p.batch,
            p.record,
            p.ops_s,
            p.mib_s,
            p.p50_ms,
            p.p99_ms,
            p.p999_ms,
            p.max_ms
        );
    }
    let big = r
        .sizes
        .iter()
        .find(|p| p.record == 65536)
        .map(|p| p.mib_s)
        .unwrap_or(0.0);
    let device = big * r.write_amplification_64k;
    println!(
        "raw disk sequential write: {:.1} MiB/s at the start; {:.1} MiB/s just before the 64 KiB records (as long as one load point)",
        r.disk_seq_write_mib_s, r.disk_adjacent_mib_s
    );
    println!(
        "64 KiB records: {big:.1} MiB/s payload = {:.0}% of raw; device bytes per payload byte {:.2} ({:.1} MiB/s = {:.0}% of raw)",
        100.0 * big / r.disk_seq_write_mib_s.max(1e-9),
        r.write_amplification_64k,
        device,
        100.0 * device / r.disk_seq_write_mib_s.max(1e-9)
    );
    println!(
        "64 KiB records against the adjacent raw write: {:.0}% as payload, {:.0}% as device bytes",
        100.0 * big / r.disk_adjacent_mib_s.max(1e-9),
        100.0 * device / r.disk_adjacent_mib_s.max(1e-9)
    );
    let w = &r.wide;
    let wide_device = w.point.mib_s * w.write_amplification;
    println!(
        "64 KiB records on wide stripes ({}): {:.1} MiB/s payload = {:.0}% of the adjacent raw write above; device bytes per payload byte {:.2} ({:.1} MiB/s = {:.0}%)",
        w.geometry,
        w.point.mib_s,
        100.0 * w.point.mib_s / r.disk_adjacent_mib_s.max(1e-9),
        w.write_amplification,
        wide_device,
        100.0 * wide_device / r.disk_adjacent_mib_s.max(1e-9)
    );
    for ((mib, s), read) in r.recovery.iter().zip(&r.recovery_read_mib) {
        println!("recovery: {s:.3} s for {mib:.0} MiB of log data (read {read:.0} MiB)");
    }
    let sc = &r.scrub;
    println!(
        "scrub after the first recovery: {:.3} s for {:.0} MiB of pages ({:.0} MiB/s; {} stripes against parity, {} end-writes x 3 copies), {} bad",
        sc.secs,
        sc.mib,
        sc.mib / sc.secs.max(1e-9),
        sc.stripes,
        sc.end_writes,
        sc.bad_pages
    );
    println!("geometry: {}", r.geometry);
    println!("I/O scheduler: {}", schedulers_line(&r.io_schedulers));
    println!(
        "spares: {} per zone, written at the open in {:.1} s; {:.1} s waited for refills between points (spares are refilled only while the log is quiet); {} of {} ready when the half-target point started{}",
        r.spares.per_zone,
        r.spares_open_secs,
        r.spares_refill_secs,
        r.half_target_spares_ready,
        r.spares_wanted,
        spares_short_note(r.half_target_spares_ready, r.spares_wanted)
    );
    println!(
        "without spares (a second fresh service, segments start as empty files): batches {:.0}/s ({:.2}x with spares); half load p50 {:.3} ms, p99 {:.3} ms (with spares p50 {:.3}, p99 {:.3})",
        r.fresh_files.batched.ops_s,
        r.append_tps_1k / r.fresh_files.batched.ops_s.max(1e-9),
        r.fresh_files.half_load.p50_ms,
        r.fresh_files.half_load.p99_ms,
        r.half_load.p50_ms,
        r.half_load.p99_ms
    );
    melddb_bench::logsvc::print_stages("half load, inside the service:", &r.half_load_stages);
    println!(
        "at half the 300K target ({:.0} appends/s offered, {:.0}/s done): p50 {:.3} ms, p99 {:.3} ms",
        melddb_bench::logsvc::HALF_TARGET_TPS,
        r.half_target_load.ops_s,
        r.half_target_load.p50_ms,
        r.half_target_load.p99_ms
    );
    println!(
        "the disk alone as a durable log under the same arrivals, just before (one file, write + fdatasync per group of batches): p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
        r.half_target_disk.p50_ms,
        r.half_target_disk.p99_ms,
        r.half_target_disk.p999_ms,
        r.half_target_disk.max_ms
    );
    println!(
        "the disk alone again, laid out as the service's files (a file per zone, three end-write files, write-back and one flush, one thread): p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
        r.half_target_disk_files.p50_ms,
        r.half_target_disk_files.p99_ms,
        r.half_target_disk_files.p999_ms,
        r.half_target_disk_files.max_ms
    );
    melddb_bench::logsvc::print_stages(
        "at half the target, inside the service:",
        &r.half_target_stages,
    );
    r.half_target_stalls.print("at half the target, stalls");
    println!(
        "the quarter-point at the same rate right before it, after the floors left the service idle: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        r.half_target_warmup.p50_ms, r.half_target_warmup.p99_ms, r.half_target_warmup.max_ms
    );
    r.half_target_warmup_stalls
        .print("the quarter-point after idle, stalls");
    melddb_bench::logsvc::print_stages(
        "half load without spares, inside the service:",
        &r.fresh_files.half_load_stages,
    );
    for f in &r.round_floor {
        println!(
            "fsync rounds on the idle disk: {} file(s) x {} B appended, then fdatasync'd in parallel, back to back: p50 {:.3} ms, p99 {:.3} ms, {:.1} MiB/s ({} rounds)",
            f.files, f.bytes, f.p50_ms, f.p99_ms, f.mib_s, f.rounds
        );
    }
    let mut metrics = serde_json::Map::new();
    let mut put = |k: &str, v: f64| {
        metrics.insert(k.into(), serde_json::json!(round2(v)));
    };
    // disk_round_*: the floor under every acknowledged append, one round
    // over the files a round of this geometry touches, on the idle disk.
    for f in &r.round_floor {
        put(&format!("disk_{}_p50_ms", f.name), f.p50_ms);
        put(&format!("disk_{}_p99_ms", f.name), f.p99_ms);
    }
    put("append_tps_1k", r.append_tps_1k);
    put("append_p99_ms_half_load", r.half_load.p99_ms);
    put("append_p50_ms_half_load", r.half_load.p50_ms);
    put("append_p99_ms_half_target", r.half_target_load.p99_ms);
    put("append_p999_ms_half_target", r.half_target_load.p999_ms);
    put("append_max_ms_half_target", r.half_target_load.max_ms);
    put("append_p50_ms_half_target", r.half_target_load.p50_ms);
    put("half_target_tps", r.half_target_load.ops_s);
    // Its stalls (bench/src/stalls.rs): how many, and how long together.
    let stalls = &r.half_target_stalls;
    put("half_target_stall_episodes", stalls.episodes.len() as f64);
    put("half_target_stall_ms", stalls.stall_ms());
    // The quarter-point before it, the service's way back from idle.
    put(
        "append_p99_ms_half_target_warmup",
        r.half_target_warmup.p99_ms,
    );
    put(
        "append_max_ms_half_target_warmup",
        r.half_target_warmup.max_ms,
    );
    put(
        "half_target_warmup_stall_ms",
        r.half_target_warmup_stalls.stall_ms(),
    );
    // The same arrivals on the disk alone (bench/src/rawlog.rs), measured
    // just before it: the floors under append_p99_ms_half_target, in one
    // file and in the service's files (a file per zone, three end-write
    // files, one flush), each on one thread.
    for (name, p) in [
        ("disk_durable", &r.half_target_disk),
        ("disk_files_durable", &r.half_target_disk_files),
    ] {
        put(&format!("{name}_p50_ms_half_target"), p.p50_ms);
        put(&format!("{name}_p99_ms_half_target"), p.p99_ms);
        put(&format!("{name}_p999_ms_half_target"), p.p999_ms);
        put(&format!("{name}_max_ms_half_target"), p.max_ms);
    }
    put("half_load_tps", r.half_load.ops_s);
    // Inside the service at half load: the median and p99 of each stage.
    let st = &r.half_load_stages;
    for (info, s) in st.rows() {
        put(&format!("half_load_{}_p50_ms", info.key), s.p50_ms);
        put(&format!("half_load_{}_p99_ms", info.key), s.p99_ms);
        put(&format!("half_load_{}_max_ms", info.key), s.max_ms);
    }
    put("append_tps_1k_no_spares", r.fresh_files.batched.ops_s);
    put(
        "append_p99_ms_half_load_no_spares",
        r.fresh_files.half_load.p99_ms,
    );
    put(
        "append_p50_ms_half_load_no_spares",
        r.fresh_files.half_load.p50_ms,
    );
    put("spares_open_secs", r.spares_open_secs);
    put("spares_refill_secs", r.spares_refill_secs);
    put(
        "half_target_spares_ready",
        r.half_target_spares_ready as f64,
    );
    put("read_tps_1k", r.reads.ops_s);
    put("disk_seq_write_mib_s", r.disk_seq_write_mib_s);
    put("log_write_mib_s_64k", big);
    put("log_device_mib_s_64k", device);
    put("log_over_disk_64k", big / r.disk_seq_write_mib_s.max(1e-9));
    put("disk_adjacent_mib_s", r.disk_adjacent_mib_s);
    put(
        "log_over_adjacent_disk_64k",
        big / r.disk_adjacent_mib_s.max(1e-9),
    );
    put("write_amplification_64k", r.write_amplification_64k);
    // The same records over 8 data + 1 parity pages per stripe.
    put("log_write_mib_s_64k_wide", w.point.mib_s);
    put("log_device_mib_s_64k_wide", wide_device);
    put(
        "log_over_adjacent_disk_64k_wide",
        w.point.mib_s / r.disk_adjacent_mib_s.max(1e-9),
    );
    put("write_amplification_64k_wide", w.write_amplification);
    if let Some((mib, s)) = r.recovery.last() {
        put("recovery_s_per_gib", s / (mib / 1024.0).max(1e-9));
    }
    put("scrub_mib_s", sc.mib / sc.secs.max(1e-9));
    put("scrub_bad_pages", sc.bad_pages as f64);
    if let Some(dir) = &args.plots {
        plot::log_plots(dir, &r)?;
        eprintln!("plots written to {}", dir.display());
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "suite": "log",
            "metrics": metrics,
            "config": { "quick": args.quick, "geometry": r.geometry, "spares": r.spares, "io_schedulers": r.io_schedulers },
            "rows": all,
            "recovery": r.recovery,
            "recovery_read_mib": r.recovery_read_mib,
            "scrub": r.scrub,
            "round_floor": r.round_floor,
        });
        write_json(path, &doc)?;
    }
    Ok(())
}

/// `log --point ... --disk-alone`: the disk as a durable log under the
/// point's arrivals, no service, in one file and then in the service's
/// files.
fn disk_alone(args: &Args, spec: melddb_bench::logsvc::PointSpec) -> Result<(), String> {
    let melddb_bench::logsvc::PointSpec::Open(_, batch, record, rate) = spec else {
        return Err(
            "--disk-alone needs an open-loop point (CLIENTSxBATCHxBYTES@RATE): it replays arrivals, and a closed loop has none".into(),
        );
    };
    if args.data_shards == 0 {
        return Err("--data-shards must be at least 1".into());
    }
    let tmp = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    println!(
        "{:<36} {:>11} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "layout", "ops/s", "MiB/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"
    );
    let mut layouts = melddb_bench::rawlog::Layout::floors(args.data_shards).to_vec();
    if args.direct_floors {
        for submit in melddb_bench::rawlog::Submit::ALL {
            layouts.push(melddb_bench::rawlog::Layout::Direct {
                data_shards: args.data_shards,
                end_write_copies: melddb_log::config::END_WRITE_COPIES,
                submit,
            });
        }
    }
    for anchor in [false, true] {
        if anchor && !args.overlap_anchor {
            break;
        }
        for &depth in &args.overlap_depths {
            layouts.push(melddb_bench::rawlog::Layout::Overlapped {
                data_shards: args.data_shards,
                end_write_copies: melddb_log::config::END_WRITE_COPIES,
                depth,
                anchor,
            });
        }
    }
    for layout in layouts {
        eprintln!(
            "{}: {rate:.0} appends/s in batches of {batch} x {record} B ({layout:?}), {} s ...",
            layout.label(),
            args.secs
        );
        let p = melddb_bench::rawlog::raw_durable_appends(
            tmp.path(),
            rate,
            batch,
            record,
            layout,
            args.secs,
        )?;
        println!(
            "{:<36} {:>11.0} {:>9.1} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            p.label, p.ops_s, p.mib_s, p.p50_ms, p.p99_ms, p.p999_ms, p.max_ms
        );
    }
    Ok(())
}

/// `log --point`: one load point, its figures and the writer's time split.
fn log_point(args: &Args, spec: melddb_bench::logsvc::PointSpec) -> Result<(), String> {
    if !(args.warmup >= 0.0 && args.warmup.is_finite()) {
        return Err(format!(
            "--warmup must be a number of seconds, 0 or more, not {}",
            args.warmup
        ));
    }
    if !(args.secs > 0.0 && args.secs.is_finite()) {
        return Err(format!(
            "--secs must be a positive number of seconds, not {}",
            args.secs
        ));
    }
    if args.disk_alone {
        return disk_alone(args, spec);
    }
    let spares = melddb_bench::logsvc::SparesOpt {
        per_zone: args.spares,
        mib_s: args.spares_mib_s,
        wait: args.spares_wait,
    };
    let settings = melddb_bench::logsvc::ProbeSettings {
        realtime_priority: args.realtime,
        keep_thp: args.keep_thp,
        fsync_each_file: args.fsync_each_file,
        no_fsync: args.no_fsync,
        direct: args.direct,
        direct_every_block: args.direct_every_block,
        warmup_secs: args.warmup,
        data_shards: args.data_shards,
        before: args.before,
        idle_secs: args.idle,
        devices: args.devices,
        writer_cpu: args.writer_cpu,
        slice_us: args.slice_us,
        writer_round_bytes: args.writer_round_bytes,
    };
    let r = melddb_bench::logsvc::probe(spec, args.secs, spares, settings)?;
    let p = &r.point;
    println!(
        "{:>11} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "ops/s",
        "MiB/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "cpu cores",
        "batches",
        "fsyncs",
        "write %",
        "sync %"
    );
    println!(
        "{:>11.0} {:>9.1} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>9.2} {:>8} {:>8} {:>8.1} {:>8.1}",
        p.ops_s,
        p.mib_s,
        p.p50_ms,
        p.p99_ms,
        p.p999_ms,
        p.max_ms,
        r.cpu_cores,
        r.batches,
        r.fsyncs,
        100.0 * r.write_share,
        100.0 * r.sync_share
    );
    if args.realtime > 0 {
        println!(
            "real-time priority {}: {} of the writer and fsync helper threads got it{}",
            args.realtime,
            r.realtime_threads,
            if r.realtime_threads == 0 {
                " (refused: it needs CAP_SYS_NICE or `ulimit -r` of at least that)"
            } else {
                ""
            }
        );
    }
    if args.slice_us != 0 {
        println!(
            "time slice of {} µs: {} threads of the service run with it{}",
            args.slice_us,
            r.short_slice_threads,
            if r.short_slice_threads == 0 {
                " (this kernel has no custom slices, or the threads are real-time)"
            } else {
                ""
            }
        );
    }
    if let Some(cpu) = args.writer_cpu {
        println!(
            "writer on CPU {cpu} alone: {} threads of the service placed on or off it",
            r.pinned_threads
        );
    }
    println!(
        "spares: {} of {} ready when the point started{}",
        r.spares_ready_at_start,
        r.spares_wanted,
        spares_short_note(r.spares_ready_at_start, r.spares_wanted)
    );
    println!(
        "transparent huge pages: {}",
        if r.thp_disabled {
            "off"
        } else {
            "on (as the system has them)"
        }
    );
    println!("I/O scheduler: {}", schedulers_line(&r.io_schedulers));
    println!(
        "rounds: {} segment files written back and {} device flushes ({}); {} rounds run on the writer",
        r.write_backs,
        r.flushes,
        if args.fsync_each_file {
            "--fsync-each-file: every file fsynced"
        } else {
            "files of segments made from spares are written back, each device flushed once per round"
        },
        r.rounds_on_writer
    );
    println!(
        "written: {:.1} MiB, {:.1} % of it directly ({})",
        r.bytes_written as f64 / (1 << 20) as f64,
        100.0 * r.direct_write_bytes as f64 / r.bytes_written.max(1) as f64,
        if args.direct_every_block {
            "--direct-every-block: every page and end-write written directly in whole blocks"
        } else if args.direct {
            "--direct: whole blocks of large batches written directly by the fsync helpers"
        } else {
            "every page copied into the page cache; --direct writes large batches directly"
        }
    );
    melddb_bench::logsvc::print_stages("inside the service:", &r.stages);
    r.stalls.print("stalls");
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "suite": "log-point",
            "config": { "point": format!("{spec:?}"), "secs": args.secs, "spares": spares, "settings": settings },
            "probe": r,
        });
        write_json(path, &doc)?;
    }
    Ok(())
}

/// What a point with fewer spares than asked measured, for the line that
/// reports them ("" when none were missing).
fn spares_short_note(ready: u64, wanted: u64) -> &'static str {
    if ready >= wanted {
        ""
    } else {
        "; fewer than asked: a segment the window opens without a spare is a new file, fsynced on its own in every round, so this latency may not compare with runs that had them (--spares-wait waits for the refill; a refill that fails wants free disk space, as spares keep a twentieth of the file system free)"
    }
}

/// Writes a suite's JSON document (`--json FILE`).
fn write_json(path: &std::path::Path, doc: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    eprintln!("JSON written to {}", path.display());
    Ok(())
}

fn print_table(rows: &[Measured]) {
    println!(
        "{:<11} {:>5} {:>4} {:>5} {:>6} {:>11} {:>11} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>11} {:>7}",
        "experiment",
        "ops",
        "deg",
        "read%",
        "keys",
        "melds/s",
        "slowest/s",
        "mean_us",
        "p99_us",
        "free_us",
        "nodes",
        "eph",
        "abort%",
        "brute/s",
        "x_brute"
    );
    for r in rows {
        let s = &r.spec;
        println!(
            "{:<11} {:>5} {:>4} {:>5} {:>5}K {:>11.0} {:>11.0} {:>8.2} {:>8.2} {:>8.2} {:>8.1} {:>7.1} {:>7.1} {:>11} {:>7}",
            s.experiment,
            s.ops,
            s.degree,
            s.read_pct,
            s.keys / 1024,
            r.meld_tps,
            r.slowest_meld_tps(),
            r.mean_us,
            r.p99_us,
            r.reclaim_us,
            r.nodes_per_meld,
            r.ephemeral_per_meld,
            r.abort_rate * 100.0,
            if s.brute { format!("{:.0}", r.brute_tps) } else { "-".into() },
            if s.brute { format!("{:.2}", r.meld_tps / r.brute_tps.max(1.0)) } else { "-".into() },
        );
    }
}

/// The zones' devices and their I/O schedulers on one line, for reports.
fn schedulers_line(s: &[melddb_log::blockdev::DeviceScheduler]) -> String {
    if s.is_empty() {
        return "not shown by this system (no block device under the zones)".into();
    }
    s.iter()
        .map(|d| format!("{} on device {}", d.scheduler, d.device))
        .collect::<Vec<_>>()
        .join(", ")
}
