//! `melddb-bench`: every MeldDB benchmark suite behind one command, one
//! subcommand per suite.
//!
//! ```text
//! cargo run --release -p melddb-bench -- meld [--quick] [--json FILE] [--plots DIR]
//! cargo run --release -p melddb-bench -- <suite> --help
//! ```
//! The table goes to stdout, progress to stderr, and `--json` writes
//! `{"suite", "metrics", "config", "rows", ...}`.

mod plot;
mod suites;

use clap::{Parser, Subcommand};

use suites::embedded::EmbeddedArgs;
use suites::log::LogArgs;
use suites::meld::MeldArgs;
use suites::nodes::{NodesArgs, WorkerArgs};
use suites::pipeline::PipelineArgs;
use suites::ReplotArgs;

/// mimalloc (through melddb-alloc, which skips its aligned API for ordinary
/// layouts): meld allocates and frees many small nodes; the same allocator
/// serves the brute-force baseline in the same run.
#[global_allocator]
static GLOBAL: melddb_alloc::MeldAlloc = melddb_alloc::MeldAlloc;

/// The command line: one subcommand per suite.
#[derive(Debug, Parser)]
#[command(version, about = "MeldDB benchmark suites")]
struct Cli {
    #[command(subcommand)]
    suite: Suite,
}

/// The suites, each with its own flags.
#[derive(Debug, Subcommand)]
enum Suite {
    /// The meld paper's §8 and App. F experiments on the meld operator.
    Meld(MeldArgs),
    /// Hyder II's pipeline: premeld, group meld, end-to-end throughput.
    Pipeline(PipelineArgs),
    /// The embedded database against SQLite and redb.
    Embedded(EmbeddedArgs),
    /// The log service on loopback against the raw disk; `--point` probes
    /// one load point on its own.
    Log(LogArgs),
    /// Node processes on one log of the log service against a node on a
    /// file log; joining a long log from a checkpoint against replaying it.
    Nodes(NodesArgs),
    /// The JavaScript package under Node against the native core.
    Js(suites::js::JsArgs),
    /// One node process of the `nodes` suite (started by it).
    #[command(hide = true)]
    NodesWorker(WorkerArgs),
    /// Redraw the embedded suite's plots from its JSON, running nothing.
    EmbeddedPlots(ReplotArgs),
    /// Redraw the pipeline suite's plots from its JSON, running nothing.
    PipelinePlots(ReplotArgs),
}

fn main() {
    melddb_alloc::configure();
    let result = match Cli::parse().suite {
        Suite::Meld(args) => suites::meld::run_suite(&args),
        Suite::Pipeline(args) => suites::pipeline::run_suite(&args),
        Suite::Embedded(args) => suites::embedded::run_suite(&args),
        Suite::Log(args) => suites::log::run_suite(&args),
        Suite::Nodes(args) => suites::nodes::run_suite(&args),
        Suite::Js(args) => suites::js::run_suite(&args),
        Suite::NodesWorker(args) => suites::nodes::worker(&args),
        Suite::EmbeddedPlots(args) => suites::embedded::replot(&args),
        Suite::PipelinePlots(args) => suites::pipeline::replot(&args),
    };
    if let Err(e) = result {
        eprintln!("melddb-bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests;
