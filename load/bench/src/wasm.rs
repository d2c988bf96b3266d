//! Meld throughput of the wasm32 build relative to native, in the same run:
//! one recorded log is melded by `melddb-replay` built natively and for
//! wasm32-wasip1 (run under Node's WASI), best of three rounds each.

use std::path::{Path, PathBuf};
use std::process::Command;

use melddb::Settings;

use crate::pipeline::{write_plain_log, Sizes};

/// Result of the comparison.
#[derive(Debug, Clone, Copy)]
pub struct WasmRatio {
    /// Intentions melded per second natively.
    pub native_per_s: f64,
    /// Intentions melded per second under wasm.
    pub wasm_per_s: f64,
    /// `wasm_per_s / native_per_s`.
    pub ratio: f64,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn best_seconds(out: &std::process::Output) -> Result<f64, String> {
    if !out.status.success() {
        return Err(format!(
            "replay failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let s = String::from_utf8_lossy(&out.stdout);
    let at = s
        .find("\"best_seconds\":")
        .ok_or(format!("no timing in {s}"))?;
    s[at + 15..]
        .trim_end()
        .trim_end_matches('}')
        .parse()
        .map_err(|e| format!("bad timing in {s}: {e}"))
}

/// Builds both replays, melds one plain-meld log with each and compares.
pub fn ratio(quick: bool, seed: u64) -> Result<WasmRatio, String> {
    let dir = std::env::temp_dir().join(format!("melddb-bench-wasm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let result = (|| {
        let build_dir = workspace().join("target").join("replay-build");
        melddb_replay::node_available()?;
        let native = melddb_replay::build(&workspace(), &build_dir, None)?;
        let wasm =
            melddb_replay::build(&workspace(), &build_dir, Some(melddb_replay::WASI_TARGET))?;
        let sizes = Sizes {
            keys: if quick { 50_000 } else { 128_000 },
            txns: if quick { 5_000 } else { 20_000 },
            zone_min: 8,
            zone_max: 16,
        };
        let entries = write_plain_log(&dir.join("log.bin"), Settings::default(), &sizes, seed)?;
        let n = Command::new(&native)
            .arg(dir.join("log.bin"))
            .args(["--rounds", "3"])
            .output()
            .map_err(|e| e.to_string())?;
        let w = Command::new("node")
            .arg("--single-threaded")
            .arg(workspace().join("tests/wasm/run-wasi.mjs"))
            .arg(&wasm)
            .arg(&dir)
            .args(["/data/log.bin", "--rounds", "3"])
            .output()
            .map_err(|e| format!("running node (Node 20+ is needed): {e}"))?;
        let (ns, ws) = (best_seconds(&n)?, best_seconds(&w)?);
        let native_per_s = entries as f64 / ns;
        let wasm_per_s = entries as f64 / ws;
        Ok(WasmRatio {
            native_per_s,
            wasm_per_s,
            ratio: wasm_per_s / native_per_s,
        })
    })();
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}
