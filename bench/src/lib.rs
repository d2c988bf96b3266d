//! Workloads shared by the `melddb-bench` binary and the criterion benches.

pub mod workload;
