//! Workloads shared by the `melddb-bench` binary and the criterion benches.

pub mod embedded;
pub mod logsvc;
pub mod pipeline;
pub mod wasm;
pub mod workload;
