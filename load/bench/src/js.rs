//! The `js` suite's workloads: the JavaScript package under Node against
//! the native core in the same run. Both sides run the same 8r2w
//! transactions on one node over an in-memory log, and meld the same
//! recorded log.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use melddb::{Database, Isolation, Melder, Settings};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::embedded::{key, VALUE};
use crate::pipeline::{write_plain_log, Sizes};

/// The figures of one run.
#[derive(Debug, Clone, Copy)]
pub struct JsRun {
    /// 8r2w transactions per second through the JavaScript API.
    pub js_tps: f64,
    /// The same on the native core (`melddb::Database` on a `MemLog`).
    pub native_tps: f64,
    /// Entries of the recorded log melded per second under Node.
    pub js_meld_per_s: f64,
    /// The same natively (`Melder::apply`).
    pub native_meld_per_s: f64,
    /// Entries in the recorded log (genesis not counted).
    pub meld_entries: usize,
    /// The package's `.wasm` size in bytes: raw, gzip -9, brotli 11.
    pub wasm_bytes: [u64; 3],
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs the package's dev tools if absent and builds it (cargo, the
/// pinned wasm-bindgen CLI, wasm-opt, tsc); the build is incremental.
pub fn build_package() -> Result<(), String> {
    let pkg = workspace().join("wasm/npm");
    if !pkg.join("node_modules/.bin/tsc").exists() {
        eprintln!("npm ci in wasm/npm ...");
        run(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund"])
                .current_dir(&pkg),
            "npm ci",
        )?;
    }
    eprintln!("building the JavaScript package ...");
    run(
        Command::new("node")
            .arg("scripts/build.mjs")
            .current_dir(&pkg),
        "node scripts/build.mjs (Node 20+ is needed)",
    )?;
    Ok(())
}

/// 8r2w transactions per second on the native core, `secs` seconds after
/// loading `keys` keys: the comparator of the JavaScript figure.
pub fn native_tps(keys: u64, secs: f64, seed: u64) -> Result<f64, String> {
    let mut db = Database::create(Settings::default()).map_err(|e| e.to_string())?;
    let mut i = 0;
    while i < keys {
        let mut tx = db.begin(Isolation::Serializable);
        for j in i..(i + 10_000).min(keys) {
            tx.put(&key(j), &VALUE).map_err(|e| e.to_string())?;
        }
        db.commit(tx).map_err(|e| e.to_string())?;
        i += 10_000;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut fresh = [0u8; 100];
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..64 {
            let mut tx = db.begin(Isolation::Serializable);
            for _ in 0..8 {
                tx.get(&key(rng.random_range(0..keys)))
                    .map_err(|e| e.to_string())?;
            }
            fresh[..8].copy_from_slice(&n.to_le_bytes());
            tx.put(&key(rng.random_range(0..keys)), &fresh)
                .map_err(|e| e.to_string())?;
            tx.put(&key(rng.random_range(0..keys)), &fresh)
                .map_err(|e| e.to_string())?;
            db.commit(tx).map_err(|e| e.to_string())?;
            n += 1;
        }
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Melds the recorded log at `path` natively: entries per second, best
/// of `rounds`.
pub fn native_meld(path: &Path, rounds: usize) -> Result<(usize, f64), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut entries = Vec::new();
    let mut at = 0;
    while at + 4 <= bytes.len() {
        let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let end = at + 4 + len as usize;
        entries.push(bytes.get(at + 4..end).ok_or("truncated log file")?);
        at = end;
    }
    let (genesis, rest) = entries.split_first().ok_or("empty log file")?;
    let mut best = f64::INFINITY;
    for _ in 0..rounds.max(1) {
        let start = Instant::now();
        let mut m = Melder::from_genesis(genesis).map_err(|e| e.to_string())?;
        for e in rest {
            m.apply(e);
        }
        best = best.min(start.elapsed().as_secs_f64());
        drop(m);
    }
    Ok((rest.len(), rest.len() as f64 / best))
}

fn field(doc: &serde_json::Value, path: &[&str]) -> Result<f64, String> {
    let mut v = doc;
    for p in path {
        v = &v[*p];
    }
    v.as_f64()
        .ok_or(format!("bench.mjs printed no {}: {doc}", path.join(".")))
}

/// The whole comparison: builds the package, records a log, runs both sides.
pub fn compare(quick: bool, seed: u64) -> Result<JsRun, String> {
    build_package()?;
    let (keys, secs, sizes) = if quick {
        (20_000u64, 2.0, (20_000, 4_000))
    } else {
        (200_000, 5.0, (128_000, 20_000))
    };
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let log = tmp.path().join("log.bin");
    eprintln!("recording a log ...");
    write_plain_log(
        &log,
        Settings::default(),
        &Sizes {
            keys: sizes.0,
            txns: sizes.1,
            zone_min: 8,
            zone_max: 16,
        },
        seed,
    )?;
    eprintln!("native: 8r2w and meld ...");
    let native_tps = native_tps(keys, secs, seed)?;
    let (meld_entries, native_meld_per_s) = native_meld(&log, 3)?;
    eprintln!("Node: 8r2w and meld ...");
    let out = run(
        Command::new("node")
            .arg("bench/bench.mjs")
            .args(["--keys", &keys.to_string(), "--secs", &secs.to_string()])
            .arg("--log")
            .arg(&log)
            .args(["--rounds", "3"])
            .current_dir(workspace().join("wasm/npm")),
        "node bench/bench.mjs",
    )?;
    let doc: serde_json::Value =
        serde_json::from_str(out.trim()).map_err(|e| format!("bench.mjs printed {out:?}: {e}"))?;
    let js_entries = field(&doc, &["meld", "entries"])? as usize;
    if js_entries != meld_entries {
        return Err(format!(
            "Node melded {js_entries} entries, native {meld_entries}"
        ));
    }
    Ok(JsRun {
        js_tps: field(&doc, &["txn_tps_8r2w"])?,
        native_tps,
        js_meld_per_s: meld_entries as f64 / field(&doc, &["meld", "best_seconds"])?,
        native_meld_per_s,
        meld_entries,
        wasm_bytes: [
            field(&doc, &["wasm_raw_bytes"])? as u64,
            field(&doc, &["wasm_gzip_bytes"])? as u64,
            field(&doc, &["wasm_brotli_bytes"])? as u64,
        ],
    })
}
