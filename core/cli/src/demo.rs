//! `melddb demo`: every client a full node, on one machine. Starts a log
//! service on loopback over a temporary directory, runs `melddb bank` in
//! several node processes on one shared log at once with a live display,
//! then checks every node against a replay of the log and prints what
//! each did.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use melddb::Melder;

/// What `melddb demo` asks for.
pub struct DemoArgs {
    pub nodes: usize,
    pub seconds: f64,
    pub accounts: u64,
    pub json: bool,
}

/// The demo's log service: small segments and no spares, so it starts at
/// once and leaves little behind.
fn service_config(dir: &Path) -> melddb_log::Config {
    let zones = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
    let mut cfg = melddb_log::Config::with_zones(zones);
    cfg.segment_bytes = 16 << 20;
    cfg.page_bytes = 16 << 10;
    cfg.max_record_bytes = 4 << 20;
    cfg.prepared_segments = 0;
    cfg
}

/// A node process's final report, or why it failed.
struct NodeRun {
    report: Result<serde_json::Value, String>,
}

pub fn run(a: DemoArgs) -> Result<(), String> {
    if a.nodes == 0 || a.nodes > 16 {
        return Err("--nodes must be from 1 to 16".into());
    }
    let tmp = tempfile::tempdir().map_err(|e| format!("cannot make a temporary directory: {e}"))?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let store = Arc::new(
        melddb_log::Store::open(service_config(&tmp.path().join("log-service")))
            .map_err(|e| format!("cannot open the log service's store: {e}"))?,
    );
    let running = rt
        .block_on(melddb_log::start_on(
            store.clone(),
            "127.0.0.1:0",
            "127.0.0.1:0",
        ))
        .map_err(|e| format!("cannot start the log service on loopback: {e}"))?;
    let url = format!("melddb://{}/bank", running.tcp);
    let result = run_nodes(&a, tmp.path(), &url, &rt);
    rt.block_on(running.shutdown());
    store.shutdown();
    result
}

fn run_nodes(
    a: &DemoArgs,
    tmp: &Path,
    url: &str,
    rt: &tokio::runtime::Runtime,
) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the melddb binary: {e}"))?;
    if !a.json {
        println!(
            "log service on {url}; {} node processes, each a full database, moving money between {} accounts for {} s",
            a.nodes, a.accounts, a.seconds
        );
    }
    let multi = (!a.json).then(indicatif::MultiProgress::new);
    let mut children = Vec::new();
    for i in 0..a.nodes {
        let mut cmd = Command::new(&exe);
        if i == 0 {
            // One node publishes checkpoints, as a trusted node would; the
            // log stays whole for the replay that checks every node.
            cmd.args([
                "--publish-checkpoints",
                "--no-trim",
                "--checkpoint-bytes",
                "1048576",
            ]);
        }
        let mut child = cmd
            .arg("--dir")
            .arg(tmp.join(format!("node{i}")))
            .args([
                "--log",
                url,
                "bank",
                "--threads",
                "2",
                "--json",
                "--progress",
            ])
            .args(["--accounts", &a.accounts.to_string()])
            .args(["--seconds", &a.seconds.to_string()])
            .args(["--seed", &(i + 1).to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start node {i}: {e}"))?;
        let out = child.stdout.take().ok_or("no stdout from a node")?;
        let bar = multi.as_ref().map(|m| {
            let b = m.add(indicatif::ProgressBar::new_spinner());
            b.set_message(format!("node {i}: connecting"));
            b
        });
        // One reader per node: progress lines update its line of the
        // display, the last line is its report.
        let reader = std::thread::spawn(move || -> Option<String> {
            let mut last = None;
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<serde_json::Value>(&line) {
                    Ok(v) if v.get("progress").is_some() => {
                        if let Some(b) = &bar {
                            let p = &v["progress"];
                            b.set_message(format!(
                                "node {i}: {} committed, {} aborted, at position {}",
                                p["committed"], p["aborted"], p["position"]
                            ));
                            b.tick();
                        }
                    }
                    _ => last = Some(line),
                }
            }
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            last
        });
        children.push((child, reader));
    }
    let runs: Vec<NodeRun> = children
        .into_iter()
        .map(|(child, reader)| {
            let out = child.wait_with_output();
            let last = reader.join().ok().flatten();
            let report = match out {
                Ok(o) if o.status.success() => last
                    .ok_or_else(|| "no report".to_string())
                    .and_then(|l| serde_json::from_str(&l).map_err(|e| format!("{e}: {l}"))),
                Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
                Err(e) => Err(e.to_string()),
            };
            NodeRun { report }
        })
        .collect();
    let digests = replay_digests(rt, url)?;
    report(a, &runs, &digests)
}

/// The digest of every committed state of the log, by position, from a
/// fresh replay: what every node's state must be at its position.
fn replay_digests(
    rt: &tokio::runtime::Runtime,
    url: &str,
) -> Result<std::collections::BTreeMap<u64, String>, String> {
    let addr = url
        .strip_prefix("melddb://")
        .and_then(|r| r.split_once('/'))
        .map(|(a, _)| a.to_string())
        .ok_or("bad url")?;
    rt.block_on(async {
        let c = melddb_log::Client::connect(&addr)
            .await
            .map_err(|e| e.to_string())?;
        let (_, tail) = c.bounds("bank").await.map_err(|e| e.to_string())?;
        let mut sub = c.subscribe("bank", 0);
        let (_, genesis) = sub.next().await.map_err(|e| e.to_string())?;
        let mut m = Melder::from_genesis(&genesis).map_err(|e| e.to_string())?;
        let mut digests = std::collections::BTreeMap::new();
        let hex = |m: &Melder| m.lcs().digest_hex().map_err(|e| e.to_string());
        digests.insert(0, hex(&m)?);
        while m.next_pos() < tail {
            let (_, bytes) = sub.next().await.map_err(|e| e.to_string())?;
            m.apply(&bytes);
            digests.insert(m.lcs().pos(), hex(&m)?);
        }
        Ok(digests)
    })
}

fn report(
    a: &DemoArgs,
    runs: &[NodeRun],
    digests: &std::collections::BTreeMap<u64, String>,
) -> Result<(), String> {
    let mut all_ok = true;
    let mut rows = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        match &run.report {
            Ok(r) => {
                let pos = r["position"].as_u64().unwrap_or(0);
                let agrees = digests.get(&pos).map(String::as_str) == r["digest"].as_str();
                let held = r["total_held"] == true;
                all_ok &= agrees && held;
                rows.push(serde_json::json!({
                    "node": i,
                    "committed": r["committed"],
                    "aborted": r["aborted"],
                    "aborts_by_reason": r["aborts_by_reason"],
                    "tps": r["tps"],
                    "position": pos,
                    "digest": r["digest"],
                    "digest_matches_log_replay": agrees,
                    "total": r["total"],
                    "total_held": held,
                    "checkpoints_published": r["checkpoints_published"],
                }));
            }
            Err(e) => {
                all_ok = false;
                rows.push(serde_json::json!({"node": i, "error": e}));
            }
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::json!({"nodes": rows, "log_entries": digests.keys().last(), "ok": all_ok})
        );
    } else {
        println!(
            "{:<5} {:>9} {:>8} {:>8} {:>9}  {:<16} {:<6} aborts by reason",
            "node", "committed", "aborted", "tps", "position", "digest", "total"
        );
        for r in &rows {
            if let Some(e) = r.get("error") {
                println!(
                    "{:<5} failed: {}",
                    r["node"],
                    e.as_str().unwrap_or_default()
                );
                continue;
            }
            let digest = r["digest"].as_str().unwrap_or_default();
            let reasons = r["aborts_by_reason"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            let n = |k: &str| r[k].as_u64().unwrap_or(0);
            println!(
                "{:<5} {:>9} {:>8} {:>8.0} {:>9}  {:<16} {:<6} {}",
                n("node"),
                n("committed"),
                n("aborted"),
                r["tps"].as_f64().unwrap_or(0.0),
                n("position"),
                &digest[..digest.len().min(16)],
                if r["total_held"] == true {
                    "held"
                } else {
                    "BROKEN"
                },
                reasons
            );
        }
        for r in &rows {
            let n = r["checkpoints_published"].as_u64().unwrap_or(0);
            if n > 0 {
                println!(
                    "node {} published {n} checkpoints of the shared state (nodes joining later load the latest)",
                    r["node"]
                );
            }
        }
        println!(
            "{}",
            if all_ok {
                "every node's state equals a replay of the log at its position, and the total held on every node"
            } else {
                "NOT OK: a node failed, disagreed with the log or lost money"
            }
        );
    }
    if all_ok {
        Ok(())
    } else {
        Err("the demo found a problem (see above)".into())
    }
}
