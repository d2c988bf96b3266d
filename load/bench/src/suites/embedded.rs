//! `melddb-bench embedded`: the embedded database against SQLite and redb,
//! its recovery with and without checkpoints, and a long run;
//! `embedded-plots` redraws its plots from its JSON.

use std::time::Instant;

use melddb_bench::round2;

use super::{write_json, ReplotArgs, RunArgs};
use crate::plot;

/// `melddb-bench embedded`.
#[derive(Debug, clap::Args)]
pub struct EmbeddedArgs {
    /// Size of the run and where its figures go.
    #[command(flatten)]
    pub run: RunArgs,
    /// RNG seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Run only the cells whose "engine:mix:tTHREADS" contains this text
    /// (for example `melddb:8r2w:t4`), printed without the recovery and
    /// long runs.
    #[arg(long)]
    only: Option<String>,
}

/// Runs the suite.
pub fn run_suite(args: &EmbeddedArgs) -> Result<(), String> {
    use melddb_bench::embedded::{long_run, recovery, run_cell, Engine, Mix};
    use std::time::Duration;
    let (keys, secs, threads): (u64, f64, &[usize]) = if args.run.quick {
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
    let (rec_target, rec_keys, rec_every) = if args.run.quick {
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
    let (long_secs, long_every) = if args.run.quick {
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
    if let Some(dir) = &args.run.plots {
        plot::embedded_plots(dir, &cells, &samples)?;
        eprintln!("plots written to {}", dir.display());
    }
    if let Some(path) = &args.run.json {
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
                "quick": args.run.quick, "seed": args.seed, "keys": keys, "seconds_per_cell": secs,
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

/// Redraws the suite's plots from its JSON.
pub fn replot(args: &ReplotArgs) -> Result<(), String> {
    use melddb_bench::embedded::{Cell, Engine, Mix, Sample};
    let (json, dir) = (&args.json, &args.plots);
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
