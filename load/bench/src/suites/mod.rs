//! The suites' drivers: each runs its workloads (from the library), prints
//! its table and writes its JSON and plots.

pub mod embedded;
pub mod js;
pub mod log;
mod log_point;
pub mod meld;
pub mod nodes;
pub mod pipeline;

use std::path::{Path, PathBuf};

/// The flags every suite's run takes: its size and where its figures go.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Smaller sizes: each suite's quick form runs in about two minutes at
    /// most (CI runs it once as a smoke test).
    #[arg(long)]
    pub quick: bool,
    /// Write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write PNG plots into this directory.
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
}

/// `embedded-plots` and `pipeline-plots`: a suite's JSON in, its plots
/// out.
#[derive(Debug, clap::Args)]
pub struct ReplotArgs {
    /// The suite's JSON, as its `--json` wrote it.
    #[arg(long, value_name = "FILE")]
    pub json: PathBuf,
    /// Write the PNG plots into this directory.
    #[arg(long, value_name = "DIR")]
    pub plots: PathBuf,
}

/// Writes a suite's JSON document (`--json FILE`).
pub fn write_json(path: &Path, doc: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    eprintln!("JSON written to {}", path.display());
    Ok(())
}
