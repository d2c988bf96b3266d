//! Building the replay tool for the tests and benchmarks that run it, on
//! the host and on wasm32-wasip1 (under Node's WASI): the wasm determinism
//! test and the pipeline suite's wasm-vs-native ratio.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The WASI target the replay tool is built for.
pub const WASI_TARGET: &str = "wasm32-wasip1";

/// Makes sure the active toolchain has `target`, adding it with rustup
/// where it is missing (`rust-toolchain.toml` lists it, but rustup installs
/// a toolchain file's targets only with the toolchain itself, not into a
/// toolchain installed before). Without rustup the build that follows
/// reports the missing target.
pub fn ensure_target(workspace: &Path, target: &str) -> Result<(), String> {
    let listed = Command::new("rustup")
        .current_dir(workspace)
        .args(["target", "list", "--installed"])
        .output();
    let Ok(listed) = listed else {
        return Ok(());
    };
    if String::from_utf8_lossy(&listed.stdout)
        .lines()
        .any(|l| l.trim() == target)
    {
        return Ok(());
    }
    let added = Command::new("rustup")
        .current_dir(workspace)
        .args(["target", "add", target])
        .output()
        .map_err(|e| format!("running rustup target add {target}: {e}"))?;
    if !added.status.success() {
        return Err(format!(
            "rustup target add {target} failed: {}",
            String::from_utf8_lossy(&added.stderr).trim()
        ));
    }
    Ok(())
}

/// Builds `melddb-replay` in release mode for `target` (`None`: the host)
/// into `target_dir`, a directory of its own so that a cargo already
/// running (the test or benchmark's own) does not hold its lock, and gives
/// the path of the binary or `.wasm` module.
pub fn build(workspace: &Path, target_dir: &Path, target: Option<&str>) -> Result<PathBuf, String> {
    if let Some(t) = target {
        ensure_target(workspace, t)?;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "melddb-replay",
            "--bin",
            "melddb-replay",
            "--target-dir",
        ])
        .arg(target_dir);
    if let Some(t) = target {
        cmd.args(["--target", t]);
    }
    let st = cmd.status().map_err(|e| format!("running cargo: {e}"))?;
    if !st.success() {
        return Err(format!(
            "building melddb-replay for {} failed",
            target.unwrap_or("the host")
        ));
    }
    Ok(match target {
        Some(t) => target_dir
            .join(t)
            .join("release")
            .join("melddb-replay.wasm"),
        None => target_dir.join("release").join("melddb-replay"),
    })
}

/// Whether Node.js (20 or newer, which has WASI preview 1) is on the PATH;
/// the reason it cannot be used otherwise.
pub fn node_available() -> Result<(), String> {
    let out = Command::new("node")
        .arg("--version")
        .output()
        .map_err(|e| {
            format!("node not found ({e}); Node 20 or newer runs the wasm32-wasip1 build")
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v = stdout.lines().next().unwrap_or("").trim();
    if !out.status.success() {
        return Err(format!("node --version failed ({})", out.status));
    }
    let major: u32 = v
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 20 {
        return Err(format!("node {v} is older than 20"));
    }
    Ok(())
}
