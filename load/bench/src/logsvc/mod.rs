//! The log service benchmark: a real service on loopback over temporary
//! segment directories, driven by the native client; the raw sequential
//! write bandwidth of the same disk is measured in the same run, so the
//! service's efficiency is a ratio.
//!
//! [`suite`] runs the whole suite, [`probe`] one load point on its own;
//! [`load`] drives the service, [`catchup`] reads a log back from its
//! start, [`service`] starts and stops it, and [`disk`] measures the disk
//! under it without the service.

use std::path::{Path, PathBuf};

use melddb_log::latency::StagesSummary;
use melddb_log::{Config, Stats};
use serde::Serialize;

pub mod catchup;
pub mod disk;
pub mod load;
pub mod probe;
pub mod service;
pub mod suite;

pub use catchup::Catchup;
pub use disk::{settle_trims, RoundFloor};
pub use load::PointSpec;
pub use probe::{probe, Probe, ProbeSettings};
pub use service::{ScrubRun, SparesOpt};
pub use suite::{run, FreshFiles, Results, WideStripes, HALF_TARGET_TPS};

/// One load point.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// What was measured.
    pub label: String,
    /// Concurrent clients (connections).
    pub clients: usize,
    /// Appends (or reads) each client keeps in flight.
    pub depth: usize,
    /// Records per append request (1: single appends).
    pub batch: usize,
    /// Record size in bytes.
    pub record: usize,
    /// Operations per second.
    pub ops_s: f64,
    /// Payload MiB/s.
    pub mib_s: f64,
    /// Median latency (ms).
    pub p50_ms: f64,
    /// 99th percentile latency (ms).
    pub p99_ms: f64,
    /// 99.9th percentile latency (ms).
    pub p999_ms: f64,
    /// Longest latency (ms): where a stall shows.
    pub max_ms: f64,
}

impl Point {
    /// A point from every operation's latency (ms) over `secs` of wall
    /// time; `shape` is clients, depth, records per request, record bytes.
    pub(crate) fn from_latencies(
        label: &str,
        shape: [usize; 4],
        lat: Vec<f64>,
        secs: f64,
    ) -> Point {
        let [clients, depth, batch, record] = shape;
        let n = lat.len() as f64;
        let lat = sorted(lat);
        Point {
            label: label.into(),
            clients,
            depth,
            batch,
            record,
            ops_s: n / secs,
            mib_s: n * record as f64 / secs / (1 << 20) as f64,
            p50_ms: pct(&lat, 0.5),
            p99_ms: pct(&lat, 0.99),
            p999_ms: pct(&lat, 0.999),
            max_ms: pct(&lat, 1.0),
        }
    }
}

/// Device bytes the service wrote per payload byte appended between two
/// readings of its counters.
fn write_amplification(before: &Stats, after: &Stats) -> f64 {
    (after.bytes_written - before.bytes_written) as f64
        / (after.append_bytes - before.append_bytes).max(1) as f64
}

/// Sorts latencies once, for [`pct`].
fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// The `p` quantile of `v`, which is sorted ([`sorted`]); 0 when empty.
fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Data pages per stripe of the suite's service: 4 data + 1 parity pages
/// over five zones (directories).
pub const DATA_SHARDS: usize = 4;

/// Data pages per stripe of the wide geometry the suite also measures
/// large records on: 8 data + 1 parity pages over nine zones, so parity
/// is 1/9 of the bytes written instead of 1/5.
pub const WIDE_DATA_SHARDS: usize = 8;

/// Zones of the suite's geometry.
const ZONES: usize = DATA_SHARDS + 1;

/// The suite's service over `dir`: `data_shards` data pages and one parity
/// page per stripe, one zone per page.
fn config(dir: &Path, data_shards: usize) -> Config {
    let zones: Vec<PathBuf> = (0..=data_shards)
        .map(|z| dir.join(format!("zone{z}")))
        .collect();
    let mut c = Config::with_zones(zones);
    c.data_shards = data_shards;
    c.parity_shards = 1;
    c.page_bytes = 256 << 10;
    c.segment_bytes = 256 << 20;
    c.max_segments = 100_000;
    // No spares unless a run asks for them (`SparesOpt`): a background
    // refill would otherwise write between and under the measured points.
    c.prepared_segments = 0;
    // Measured as a dedicated service runs (the library leaves THP alone
    // by default): the index's growth never waits on a 2 MiB page fault
    // (docs/benchmarks.md, "Tuning options: measured verdicts").
    c.tuning.disable_transparent_huge_pages = true;
    c.limits.max_connections = 4096;
    c.limits.max_in_flight = 1024;
    c.limits.append_queue = 65536;
    c
}

/// Prints where appends spent their time inside the service, one row per
/// stage (quantiles are bucket upper bounds, at most 19% high).
pub fn print_stages(title: &str, st: &StagesSummary) {
    println!("{title}");
    println!(
        "  {:<44} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "stage", "count", "mean ms", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"
    );
    for (info, s) in st.rows() {
        println!(
            "  {:<44} {:>9} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            info.label, s.count, s.mean_ms, s.p50_ms, s.p90_ms, s.p99_ms, s.p999_ms, s.max_ms
        );
    }
}
