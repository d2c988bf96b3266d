//! `melddb-bench meld`: the meld paper's §8 and App. F experiments on the
//! meld operator, against a brute-force validator in the same run.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::Instant;

use melddb_bench::round2;
use melddb_bench::workload::{loaded, run, Measured, Spec, Write};

use super::{write_json, RunArgs};
use crate::plot;

/// `melddb-bench meld`.
#[derive(Debug, clap::Args)]
pub struct MeldArgs {
    /// Size of the run and where its figures go.
    #[command(flatten)]
    pub run: RunArgs,
    /// RNG seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Run only the experiments whose "name:ops:degree" contains this text
    /// (for example `symmetric:8:16`).
    #[arg(long)]
    only: Option<String>,
    /// Measured transactions per experiment (default: 6,000 quick, 20,000
    /// full).
    #[arg(long)]
    txns: Option<usize>,
    /// Timed replays of each experiment's intentions; the fastest is
    /// reported, every round's rate is in the JSON (default: 1 quick, 3
    /// full).
    #[arg(long)]
    rounds: Option<usize>,
}

/// The experiments of one run.
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

/// Runs the suite.
pub fn run_suite(args: &MeldArgs) -> Result<(), String> {
    let start = Instant::now();
    let specs: Vec<Spec> = specs(args.run.quick)
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
    let rounds = args.rounds.unwrap_or(if args.run.quick { 1 } else { 3 });
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
    if let Some(dir) = &args.run.plots {
        plot::meld_plots(dir, &rows).map_err(|e| format!("plots: {e}"))?;
        eprintln!("plots written to {}", dir.display());
    }
    if let Some(path) = &args.run.json {
        let doc = serde_json::json!({
            "suite": "meld",
            "metrics": metrics,
            "config": {
                "quick": args.run.quick,
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

/// The suite's results table.
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
