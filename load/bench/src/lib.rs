//! Workloads shared by the `melddb-bench` binary and the criterion benches.

pub mod embedded;
pub mod js;
pub mod logsvc;
pub mod nodes;
pub mod pipeline;
pub mod rawlog;
pub mod wasm;
pub mod workload;

/// `x` rounded to two decimals, as the suites write figures into JSON.
pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
