//! `melddb-bench pipeline`: Hyder II's pipeline (premeld, group meld,
//! end-to-end throughput) and the wasm build of meld against the native
//! one; `pipeline-plots` redraws its plots from its JSON.

use melddb_bench::round2;

use super::{write_json, ReplotArgs, RunArgs};
use crate::plot;

/// `melddb-bench pipeline`.
#[derive(Debug, clap::Args)]
pub struct PipelineArgs {
    /// Size of the run and where its figures go.
    #[command(flatten)]
    pub run: RunArgs,
    /// RNG seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Measured transactions per configuration (default: 6,000 quick,
    /// 40,000 full).
    #[arg(long)]
    txns: Option<usize>,
    /// Keys loaded before the workload (default: 100,000 quick, 1,000,000
    /// full; the large option is 10,000,000).
    #[arg(long)]
    keys: Option<u64>,
    /// The shortest conflict zone (snapshot lag) of a transaction
    /// (default: 300 quick, 10,000 full).
    #[arg(long)]
    zone_min: Option<u64>,
    /// The longest conflict zone; lags are uniform between the two
    /// (default: 600 quick, 30,000 full, Hyder II's range).
    #[arg(long)]
    zone_max: Option<u64>,
}

/// Runs the suite.
pub fn run_suite(args: &PipelineArgs) -> Result<(), String> {
    use melddb_bench::pipeline::{run_config, PipeConfig, PipeResult, Sizes};
    let sizes = if args.run.quick {
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
    let reps = if args.run.quick { 1 } else { 3 };
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
    let sweep: &[u32] = if args.run.quick {
        &[1, 20]
    } else {
        &[1, 2, 5, 10, 20, 50, 100]
    };
    // The wasm comparison runs first: it needs the wasm32-wasip1 target and
    // Node, and a missing one should fail the suite at once, not after the
    // configurations have run for ten minutes.
    eprintln!("pipeline: wasm vs native meld ...");
    let wasm = melddb_bench::wasm::ratio(args.run.quick, args.seed)?;
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
    if let Some(dir) = &args.run.plots {
        plot::pipeline_plots(dir, &rows, &sweep_rows).map_err(|e| format!("plots: {e}"))?;
        eprintln!("plots written to {}", dir.display());
    }
    if let Some(path) = &args.run.json {
        let doc = serde_json::json!({
            "suite": "pipeline",
            "metrics": metrics,
            "config": {
                "quick": args.run.quick, "seed": args.seed, "keys": sizes.keys, "txns": sizes.txns,
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

/// Redraws the suite's plots from its JSON.
pub fn replot(args: &ReplotArgs) -> Result<(), String> {
    use melddb_bench::pipeline::PipeResult;
    let (json, dir) = (&args.json, &args.plots);
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
