//! Fills the request-id table with one window (1 Mi ids, the default) in
//! the service's pattern or the worst case, and prints the process's
//! resident memory growth and the longest single remember (the table's
//! rehashes show there). Linux only (reads /proc/self/statm).
//!
//! `cargo run --release -p melddb-log --example request_ids_memory -- [batches|scattered]`

use std::time::{Duration, Instant};

use melddb_log::request_ids::RequestIds;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const WINDOW: usize = 1 << 20;

/// Resident memory in MiB.
fn resident_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    pages * 4096.0 / (1 << 20) as f64
}

fn main() {
    let scattered = std::env::args().nth(1).as_deref() == Some("scattered");
    let before = resident_mib();
    let mut ids = RequestIds::new(WINDOW);
    let opened = resident_mib();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut longest = Duration::ZERO;
    // Two windows: the table full, then a whole window of evictions; the
    // i-th id at position i.
    for n in 0..2 * WINDOW as u64 {
        let (client, request) = if scattered {
            (1 + n % 64, rng.random::<u64>())
        } else {
            // 64 clients in turn, batches of 64 consecutive ids.
            let batch = n / 64;
            (1 + batch % 64, (batch / 64) * 64 + n % 64)
        };
        let t = Instant::now();
        ids.remember((client, request), n);
        longest = longest.max(t.elapsed());
    }
    println!(
        "{}: resident {:.1} MiB at the open, {:.1} MiB after two windows of ids; longest remember {:.2} ms",
        if scattered { "scattered" } else { "batches of 64" },
        opened - before,
        resident_mib() - before,
        longest.as_secs_f64() * 1e3
    );
}
