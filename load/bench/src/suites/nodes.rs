//! `melddb-bench nodes`: node processes on one log of the log service on
//! loopback against one node on a file log of its own, read-only scaling,
//! joining a long log from a published checkpoint against replaying it.

use std::path::PathBuf;
use std::sync::Arc;

use melddb_bench::nodes::{join_run, run_workers, JoinRun, NodesRun};
use melddb_bench::round2;

use super::{write_json, RunArgs};

/// `melddb-bench nodes`.
#[derive(Debug, clap::Args)]
pub struct NodesArgs {
    /// Size of the run and where its figures go.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `melddb-bench nodes-worker` (started by the suite, one per node).
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// The node's directory.
    #[arg(long)]
    dir: PathBuf,
    /// The shared log (`melddb://…`); without it, a file log in `--dir`.
    #[arg(long)]
    log: Option<String>,
    /// Keys to load before the run (0: none).
    #[arg(long, default_value_t = 0)]
    load: u64,
    /// Client threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// `8r2w` or `ro` (10 reads).
    #[arg(long, default_value = "8r2w")]
    mix: String,
    /// Keys the workload picks from.
    #[arg(long)]
    keys: u64,
    /// Seconds.
    #[arg(long)]
    seconds: f64,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs a node process's workload.
pub fn worker(a: &WorkerArgs) -> Result<(), String> {
    let mix = match a.mix.as_str() {
        "8r2w" => (8, 2),
        "ro" => (10, 0),
        m => return Err(format!("unknown mix {m:?}: use 8r2w or ro")),
    };
    melddb_bench::nodes::worker_main(&melddb_bench::nodes::Plan {
        log: a.log.clone(),
        dir: a.dir.clone(),
        load: a.load,
        threads: a.threads,
        mix,
        keys: a.keys,
        seconds: a.seconds,
        seed: a.seed,
    })
}

/// The service the suite's nodes share: defaults, but no spare segments
/// (a new store would write its first windows' zeros, gigabytes, before
/// the first point) and transparent huge pages off, as a dedicated
/// service would have them.
fn service_config(dir: &std::path::Path) -> melddb_log::Config {
    let zones = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
    let mut c = melddb_log::Config::with_zones(zones);
    c.prepared_segments = 0;
    c.tuning.disable_transparent_huge_pages = true;
    c
}

/// Runs the suite.
pub fn run_suite(args: &NodesArgs) -> Result<(), String> {
    let quick = args.run.quick;
    let (keys, secs) = if quick {
        (20_000u64, 2.0)
    } else {
        (200_000, 8.0)
    };
    let joins: &[u64] = if quick {
        &[100_000]
    } else {
        &[100_000, 1_000_000]
    };
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let store = Arc::new(
        melddb_log::Store::open(service_config(&tmp.path().join("service")))
            .map_err(|e| e.to_string())?,
    );
    let running = rt
        .block_on(melddb_log::start_on(
            store.clone(),
            "127.0.0.1:0",
            "127.0.0.1:0",
        ))
        .map_err(|e| e.to_string())?;
    let addr = running.tcp.to_string();
    let result = (|| -> Result<(Vec<NodesRun>, Vec<JoinRun>), String> {
        let url = format!("melddb://{addr}/bench");
        eprintln!("loading {keys} keys into the shared log ...");
        {
            let loader = melddb_runtime::Database::connect(
                &url,
                tmp.path().join("loader"),
                melddb_runtime::DbOptions::default(),
            )
            .map_err(|e| e.to_string())?;
            melddb_bench::nodes::load_keys(&loader, keys)?;
        }
        let common = |mix: &str| -> Vec<String> {
            ["--threads", "4", "--mix", mix, "--keys", &keys.to_string()]
                .iter()
                .map(|s| s.to_string())
                .chain(["--seconds".into(), secs.to_string()])
                .collect()
        };
        let mut runs = Vec::new();
        eprintln!("one node on a file log of its own, 8r2w ...");
        let mut file_args = common("8r2w");
        file_args.extend(["--load".into(), keys.to_string()]);
        runs.push(NodesRun::of(
            "file log, 1 node",
            &run_workers(tmp.path(), "file", 1, &file_args)?,
        ));
        let mut shared = common("8r2w");
        shared.extend(["--log".into(), url.clone()]);
        for n in [1, 2, 4] {
            eprintln!("{n} node process(es) on the service, 8r2w ...");
            runs.push(NodesRun::of(
                &format!("service, {n} node(s)"),
                &run_workers(tmp.path(), &format!("svc{n}"), n, &shared)?,
            ));
        }
        let mut ro = common("ro");
        ro.extend(["--log".into(), url.clone()]);
        for n in [1, 2] {
            eprintln!("{n} node process(es) on the service, read-only ...");
            runs.push(NodesRun::of(
                &format!("service, {n} node(s), read-only"),
                &run_workers(tmp.path(), &format!("ro{n}"), n, &ro)?,
            ));
        }
        let mut join = Vec::new();
        for &n in joins {
            eprintln!("joining a log of {n} entries: replay from genesis, then from a published checkpoint ...");
            join.push(join_run(&rt, &addr, tmp.path(), n)?);
        }
        Ok((runs, join))
    })();
    rt.block_on(running.shutdown());
    store.shutdown();
    let (runs, join) = result?;
    print_tables(&runs, &join);
    if let Some(path) = &args.run.json {
        let by = |label: &str| runs.iter().find(|r| r.label == label);
        let tps = |label: &str| by(label).map_or(0.0, |r| round2(r.tps));
        let j1 = join.iter().find(|j| j.entries == 100_000);
        let metrics = serde_json::json!({
            "nodes_filelog_tps_8r2w": tps("file log, 1 node"),
            "nodes_service_tps_8r2w_n1": tps("service, 1 node(s)"),
            "nodes_service_tps_8r2w_n2": tps("service, 2 node(s)"),
            "nodes_service_tps_8r2w_n4": tps("service, 4 node(s)"),
            "nodes_commit_p50_ms_n2": by("service, 2 node(s)").map_or(0.0, |r| round2(r.p50_ms)),
            "nodes_commit_p99_ms_n2": by("service, 2 node(s)").map_or(0.0, |r| round2(r.p99_ms)),
            "nodes_readonly_tps_n1": tps("service, 1 node(s), read-only"),
            "nodes_readonly_tps_n2": tps("service, 2 node(s), read-only"),
            "nodes_join_speedup_1e5": j1.map_or(0.0, |j| round2(j.speedup)),
            "nodes_catchup_entries_per_s": j1.map_or(0.0, |j| j.catchup_entries_per_s.round()),
        });
        let doc = serde_json::json!({
            "suite": "nodes",
            "quick": quick,
            "config": {"keys": keys, "seconds": secs, "threads_per_node": 4, "mix": "8r2w serializable, no retries"},
            "metrics": metrics,
            "rows": runs,
            "join": join,
        });
        write_json(path, &doc)?;
    }
    Ok(())
}

fn print_tables(runs: &[NodesRun], join: &[JoinRun]) {
    println!(
        "{:<34} {:>5} {:>10} {:>8} {:>8} {:>7}",
        "run", "nodes", "tps", "p50 ms", "p99 ms", "aborts"
    );
    for r in runs {
        println!(
            "{:<34} {:>5} {:>10.0} {:>8.2} {:>8.2} {:>6.1}%",
            r.label,
            r.nodes,
            r.tps,
            r.p50_ms,
            r.p99_ms,
            r.abort_rate * 100.0
        );
    }
    println!();
    println!(
        "{:>10} {:>10} {:>10} {:>8} {:>16}",
        "entries", "replay s", "join s", "speedup", "catch-up ent/s"
    );
    for j in join {
        println!(
            "{:>10} {:>10.2} {:>10.3} {:>7.1}x {:>16.0}",
            j.entries, j.replay_s, j.join_s, j.speedup, j.catchup_entries_per_s
        );
    }
}
