//! The `pipeline` suite: Hyder II figures 10–13 and 20 in shape. A YCSB-style
//! workload (8 reads and 2 writes per serializable transaction, 100-byte
//! values, uniform keys) runs on snapshots far behind the log tail, so each
//! intention has a long conflict zone, as in a busy shared log. Its log is
//! then melded end to end by the threaded pipeline (decode, premeld, group
//! meld, final meld) under each configuration.

use melddb::{Finished, Isolation, Melder, Settings, Transaction};
use melddb_runtime::{run_from, Options, Report};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sizes of one run.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Keys loaded before the workload.
    pub keys: u64,
    /// Measured transactions.
    pub txns: usize,
    /// Shortest snapshot lag (conflict zone) of a transaction.
    pub zone_min: u64,
    /// Longest snapshot lag; lags are uniform in `zone_min..=zone_max`.
    pub zone_max: u64,
}

/// A pipeline configuration: premeld threads `t`, distance `d`, group meld.
#[derive(Debug, Clone, Copy)]
pub struct PipeConfig {
    /// Short name for tables and JSON.
    pub name: &'static str,
    /// Premeld threads (0: off).
    pub t: u32,
    /// Premeld distance.
    pub d: u32,
    /// Group meld.
    pub group: bool,
}

/// Figures of one configuration.
#[derive(Debug, Clone)]
pub struct PipeResult {
    /// The configuration.
    pub config: PipeConfig,
    /// Committed transactions per second, end to end (decode to final meld).
    pub tps: f64,
    /// Fraction of transactions committed.
    pub commit_rate: f64,
    /// Nodes final meld visited per transaction.
    pub final_nodes_per_txn: f64,
    /// Nodes premeld and group meld visited per transaction.
    pub prep_nodes_per_txn: f64,
    /// Mean conflict-zone length final meld covered.
    pub final_zone: f64,
    /// Fraction of the run final meld was busy melding.
    pub final_busy: f64,
    /// Final meld's own time per transaction, in microseconds: the
    /// throughput ceiling when workers are never the bottleneck is
    /// `1e6 / final_us_per_txn`.
    pub final_us_per_txn: f64,
    /// Cores the whole process kept busy while the pipeline ran (CPU
    /// time over wall time, all threads): near the machine's core count,
    /// the run was bound by total CPU work, not by one stage.
    pub cpu_cores: f64,
    /// The state digest (to compare repeated runs).
    pub digest: String,
}

/// The configuration names the suite uses (the rows and the sweep).
const CONFIG_NAMES: [&str; 5] = ["plain", "group", "premeld", "both", "sweep"];

impl PipeResult {
    /// One row of the suite's JSON (figures rounded to two decimals).
    pub fn to_json(&self) -> serde_json::Value {
        use crate::round2;
        serde_json::json!({
            "config": self.config.name, "t": self.config.t, "d": self.config.d,
            "group": self.config.group,
            "tps": round2(self.tps), "commit_rate": round2(self.commit_rate),
            "final_nodes_per_txn": round2(self.final_nodes_per_txn),
            "prep_nodes_per_txn": round2(self.prep_nodes_per_txn),
            "final_zone": round2(self.final_zone), "final_busy": round2(self.final_busy),
            "final_us_per_txn": round2(self.final_us_per_txn),
            "cpu_cores": round2(self.cpu_cores),
            "digest": self.digest,
        })
    }

    /// Reads back a row [`PipeResult::to_json`] wrote. A missing or
    /// malformed field is an error naming it (`at` says which row), not a
    /// zero.
    pub fn from_json(r: &serde_json::Value, at: &str) -> Result<PipeResult, String> {
        let f = |k: &str| {
            r.get(k).and_then(|v| v.as_f64()).ok_or(format!(
                "{at} has no number {k:?}: not the pipeline suite's JSON, or damaged"
            ))
        };
        let name = r["config"]
            .as_str()
            .and_then(|n| CONFIG_NAMES.into_iter().find(|c| *c == n))
            .ok_or(format!("{at}: unknown configuration {}", r["config"]))?;
        Ok(PipeResult {
            config: PipeConfig {
                name,
                t: f("t")? as u32,
                d: f("d")? as u32,
                group: r["group"]
                    .as_bool()
                    .ok_or(format!("{at} has no boolean \"group\""))?,
            },
            tps: f("tps")?,
            commit_rate: f("commit_rate")?,
            final_nodes_per_txn: f("final_nodes_per_txn")?,
            prep_nodes_per_txn: f("prep_nodes_per_txn")?,
            final_zone: f("final_zone")?,
            final_busy: f("final_busy")?,
            final_us_per_txn: f("final_us_per_txn")?,
            cpu_cores: f("cpu_cores")?,
            digest: r["digest"].as_str().unwrap_or_default().to_string(),
        })
    }
}

const VALUE: [u8; 100] = [7u8; 100];

fn key(i: u64) -> [u8; 8] {
    // Spread keys so inserts and lookups walk the whole tree.
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes()
}

/// A melder with `keys` keys (100-byte values) under `settings`.
pub fn loaded(settings: Settings, keys: u64) -> Melder {
    let mut m = Melder::new(settings);
    let mut i = 0;
    let mut batches = 0u64;
    while i < keys {
        let mut tx = Transaction::begin(m.lcs(), Isolation::SnapshotIsolation);
        for j in i..(i + 16384).min(keys) {
            tx.put(&key(j), &VALUE).expect("valid pair");
        }
        i += 16384;
        if let Ok(Finished::Intention(b)) = tx.finish() {
            m.apply(&b);
            batches += 1;
        }
    }
    if settings.group_meld && batches % 2 == 1 {
        // Close the last pair (an empty entry aborts as malformed).
        m.apply(&[]);
    }
    m
}

/// The workload's log, generated on a loaded melder.
pub struct Generated {
    /// The melder after the warm-up entries: the state the measured
    /// entries continue from, with the retained states their snapshots
    /// and premelds need.
    pub warm: Melder,
    /// The warm-up entries (already melded into `warm`): as many as the
    /// longest zone, so every measured transaction has a full-length one.
    pub warm_up: Vec<Vec<u8>>,
    /// The measured entries.
    pub log: Vec<Vec<u8>>,
}

/// Generates the workload's log on `base` (untimed), melding as it goes
/// so snapshots exist: `s.zone_max` warm-up entries, then `s.txns` measured
/// ones. Without the warm-up the first `zone_max` transactions would run on
/// snapshots clamped to the loaded state and have shorter zones.
pub fn generate(base: &Melder, s: &Sizes, seed: u64) -> Generated {
    let mut m = base.clone();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let start = m.lcs().pos();
    // One transaction on a snapshot `zone_min..=zone_max` entries behind
    // the tail (clamped to the loaded state), melded so later ones can
    // read the state after it; returns its log entry.
    let mut next = |m: &mut Melder| loop {
        let lag = rng.random_range(s.zone_min.min(s.zone_max)..=s.zone_max);
        let mut sp = m.lcs().pos().saturating_sub(lag).max(start);
        if m.state_at(sp).is_none() {
            sp -= 1;
        }
        let Some(snap) = m.state_at(sp).cloned() else {
            continue;
        };
        let mut tx = Transaction::begin(&snap, Isolation::Serializable);
        for _ in 0..8 {
            let k = key(rng.random_range(0..s.keys));
            let _ = tx.get(&k);
        }
        for _ in 0..2 {
            let k = key(rng.random_range(0..s.keys));
            tx.put(&k, &VALUE).expect("valid pair");
        }
        if let Ok(Finished::Intention(b)) = tx.finish() {
            m.apply(&b);
            return b;
        }
    };
    // Group meld melds pairs: the warm-up ends on a whole pair.
    let warm_len = (s.zone_max as usize).next_multiple_of(2);
    let warm_up: Vec<Vec<u8>> = (0..warm_len).map(|_| next(&mut m)).collect();
    let warm = m.clone();
    let mut log: Vec<Vec<u8>> = (0..s.txns).map(|_| next(&mut m)).collect();
    if base.settings().group_meld && log.len() % 2 == 1 {
        log.pop();
    }
    Generated { warm, warm_up, log }
}

/// Runs one configuration: load, generate, then meld the log end to end
/// with the threaded pipeline (best of `reps` runs).
pub fn run_config(c: PipeConfig, s: &Sizes, seed: u64, reps: usize) -> Result<PipeResult, String> {
    let settings = Settings {
        // Room for the longest zone; old states are retained this long.
        max_conflict_zone: u32::try_from(s.zone_max + 64).map_err(|_| "zone too long")?,
        premeld_threads: c.t,
        premeld_distance: c.d,
        group_meld: c.group,
        ..Settings::default()
    };
    settings.validate().map_err(|e| e.to_string())?;
    let base = loaded(settings, s.keys);
    let Generated { warm, log, .. } = generate(&base, s, seed);
    let base = warm;
    let mut best: Option<(Report, f64)> = None;
    for _ in 0..reps.max(1) {
        // Every configuration gets the same threads: one worker per core
        // (decode, premeld and group meld) plus the final-meld thread.
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
        let opts = Options {
            workers: Some(workers),
            ..Options::default()
        };
        let melder = base.clone();
        let cpu = cpu_time::ProcessTime::try_now().map_err(|e| format!("process CPU time: {e}"))?;
        let wall = std::time::Instant::now();
        let r = run_from(melder, &log, &opts).map_err(|e| e.to_string())?;
        let cores = cpu
            .try_elapsed()
            .map_err(|e| format!("process CPU time: {e}"))?
            .as_secs_f64()
            / wall.elapsed().as_secs_f64();
        if let Some((b, _)) = &best {
            if b.melder.lcs().digest() != r.melder.lcs().digest() {
                return Err(format!("{}: repeated runs gave different states", c.name));
            }
        }
        if best.as_ref().is_none_or(|(b, _)| r.elapsed < b.elapsed) {
            best = Some((r, cores));
        }
    }
    let (r, cpu_cores) = best.ok_or("no run")?;
    let n = log.len() as f64;
    let committed = r.outcomes.iter().filter(|o| o.is_committed()).count() as f64;
    Ok(PipeResult {
        config: c,
        tps: committed / r.elapsed.as_secs_f64(),
        commit_rate: committed / n,
        final_nodes_per_txn: r.final_meld.nodes as f64 / n,
        prep_nodes_per_txn: r.prep.nodes as f64 / n,
        final_zone: r.final_zone_sum as f64 / r.final_melds.max(1) as f64,
        final_busy: r.final_busy.as_secs_f64() / r.elapsed.as_secs_f64(),
        final_us_per_txn: r.final_busy.as_secs_f64() * 1e6 / n,
        cpu_cores,
        digest: r.melder.lcs().digest_hex().map_err(|e| e.to_string())?,
    })
}

/// Writes a plain-meld log (genesis, load, workload) in the replay file
/// format (4-byte little-endian length, then the record); returns the
/// number of entries after the genesis record.
pub fn write_plain_log(
    path: &std::path::Path,
    settings: Settings,
    s: &Sizes,
    seed: u64,
) -> Result<usize, String> {
    let mut m = Melder::new(settings);
    let mut entries: Vec<Vec<u8>> = Vec::new();
    let mut i = 0;
    while i < s.keys {
        let mut tx = Transaction::begin(m.lcs(), Isolation::SnapshotIsolation);
        for j in i..(i + 16384).min(s.keys) {
            tx.put(&key(j), &VALUE).expect("valid pair");
        }
        i += 16384;
        if let Ok(Finished::Intention(b)) = tx.finish() {
            m.apply(&b);
            entries.push(b);
        }
    }
    let g = generate(&m, s, seed);
    entries.extend(g.warm_up);
    entries.extend(g.log);
    let mut out = Vec::new();
    for e in std::iter::once(&settings.encode()).chain(&entries) {
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    std::fs::write(path, out).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(entries.len())
}
