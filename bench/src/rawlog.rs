//! The disk alone as a durable log, under the same open-loop load as the
//! service's half-target point: the latency any log that acknowledges
//! only durable appends could reach on this disk, measured in the same
//! run, so the service's p99 has a baseline to be read against.
//!
//! One thread, one file, nothing else: each batch arriving (Poisson, at the
//! point's rate) is written with one `pwrite` and made durable with one
//! `fdatasync`; batches that arrived during the last sync share the next
//! one (group commit, as the service's writer does). An append's latency
//! runs from its batch's scheduled arrival to the end of the sync that
//! covered it, so a slow flush delays every batch arriving during it, as
//! it does in the service. No sockets, no checksums, no parity pages
//! (their bytes are written, though: a batch writes its payload times
//! `(data + parity) / data`), no second file, no task hand-offs: a floor,
//! not a model of the service.

use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::logsvc::Point;

/// The file is a ring of this size, written full of zeros and synced
/// first, so the timed writes overwrite allocated, written blocks, as the
/// service's writes into spare segments do (no metadata per sync).
const RING_BYTES: u64 = 256 << 20;

/// Runs the raw durable log for `secs` at `rate` appends per second in
/// batches of `batch` records of `record` bytes, each batch writing
/// `batch * record * stripe_factor` bytes.
pub fn raw_durable_appends(
    dir: &Path,
    rate: f64,
    batch: usize,
    record: usize,
    stripe_factor: f64,
    secs: f64,
) -> Result<Point, String> {
    if !(rate > 0.0 && rate.is_finite() && secs > 0.0 && secs.is_finite()) {
        return Err(format!(
            "raw durable log: the rate ({rate}/s) and the duration ({secs} s) must be positive"
        ));
    }
    if batch == 0 || record == 0 || !(stripe_factor >= 1.0 && stripe_factor.is_finite()) {
        return Err(format!(
            "raw durable log: batches of {batch} records of {record} B times {stripe_factor}: each must be at least 1"
        ));
    }
    let path = dir.join("rawlog.dat");
    let result = run(&path, rate, batch, record, stripe_factor, secs);
    let _ = std::fs::remove_file(&path);
    let (lat, wall) = result?;
    Ok(Point::from_latencies(
        "the disk alone at the same arrivals",
        [0, 0, batch, record],
        lat,
        wall,
    ))
}

/// Batch arrival times over `secs` at `per_s` batches per second: the
/// same arrival process as the service's open loop (exponential gaps at
/// the same rate; not the same instants, since that stream also draws a
/// client per arrival), drawn up front so the timed loop does no
/// arithmetic between a sync and the next write.
fn arrivals(per_s: f64, secs: f64) -> Vec<Duration> {
    let mut rng = ChaCha8Rng::seed_from_u64(0x0be7_1009);
    let mut due = Vec::new();
    let mut at = 0.0f64;
    loop {
        at += -(1.0 - rng.random::<f64>()).ln() / per_s;
        if at >= secs {
            return due;
        }
        due.push(Duration::from_secs_f64(at));
    }
}

/// The timed loop: every append's latency (ms) and the wall time (s).
fn run(
    path: &Path,
    rate: f64,
    batch: usize,
    record: usize,
    stripe_factor: f64,
    secs: f64,
) -> Result<(Vec<f64>, f64), String> {
    let io =
        |what: &str, e: std::io::Error| format!("raw durable log, {what} {}: {e}", path.display());
    let batch_bytes = ((batch * record) as f64 * stripe_factor).ceil() as usize;
    if batch_bytes == 0 || batch_bytes as u64 > RING_BYTES / 4 {
        return Err(format!(
            "raw durable log: a batch of {batch_bytes} bytes does not fit its ring"
        ));
    }
    let file = std::fs::File::create(path).map_err(|e| io("create", e))?;
    let zeros = vec![0u8; 8 << 20];
    for at in (0..RING_BYTES).step_by(zeros.len()) {
        file.write_all_at(&zeros, at)
            .map_err(|e| io("prepare", e))?;
    }
    file.sync_all().map_err(|e| io("sync", e))?;
    let due = arrivals(rate / batch as f64, secs);
    let mut buf = vec![0x3cu8; batch_bytes * 64];
    let mut lat: Vec<f64> = Vec::with_capacity(due.len() * batch);
    let mut off = 0u64;
    let start = Instant::now();
    let mut next = 0;
    while next < due.len() {
        let now = start.elapsed();
        if due[next] > now {
            std::thread::sleep(due[next] - now);
        }
        // Every batch due by now goes into this write and sync.
        let now = start.elapsed();
        let mut upto = next + 1;
        while upto < due.len() && due[upto] <= now {
            upto += 1;
        }
        let bytes = (upto - next) * batch_bytes;
        if buf.len() < bytes {
            buf.resize(bytes, 0x3c);
        }
        if off + bytes as u64 > RING_BYTES {
            off = 0;
        }
        // A backlog past the whole ring (a stall of over a second at the
        // suite's rate) is written as one ring's worth; its latencies
        // still count in full.
        let bytes = bytes.min(RING_BYTES as usize);
        file.write_all_at(&buf[..bytes], off)
            .map_err(|e| io("write", e))?;
        file.sync_data().map_err(|e| io("fdatasync", e))?;
        off += bytes as u64;
        let done = start.elapsed();
        for d in &due[next..upto] {
            let ms = (done - *d).as_secs_f64() * 1e3;
            lat.extend(std::iter::repeat_n(ms, batch));
        }
        next = upto;
    }
    Ok((lat, start.elapsed().as_secs_f64().max(secs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arrivals are a Poisson stream at the rate asked for: ordered,
    /// inside the run, and about `per_s * secs` of them.
    #[test]
    fn arrivals_come_at_the_rate_asked_for() {
        let due = arrivals(2000.0, 10.0);
        assert!(due.windows(2).all(|w| w[0] <= w[1]));
        assert!(due.last().is_some_and(|d| d.as_secs_f64() < 10.0));
        // 20,000 expected; a Poisson count's standard deviation is 141.
        assert!(
            (19_300..=20_700).contains(&due.len()),
            "{} arrivals",
            due.len()
        );
    }

    /// A short run answers every batch it was given, with latencies in
    /// order; a batch too large for the ring and arguments that would
    /// never end (no rate, empty batches) are refused.
    #[test]
    fn a_short_run_counts_every_append_and_bad_arguments_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ring");
        let (lat, wall) = run(&path, 20_000.0, 10, 1024, 1.25, 0.5).expect("run");
        // Every append of every batch that arrived, once: batches grouped
        // into one sync are each counted.
        assert_eq!(lat.len(), arrivals(2_000.0, 0.5).len() * 10);
        assert!(lat.iter().all(|&ms| ms > 0.0));
        assert!(wall >= 0.5);
        // The ring was written full before the timed writes.
        assert_eq!(std::fs::metadata(&path).expect("ring").len(), RING_BYTES);
        let p = raw_durable_appends(dir.path(), 20_000.0, 10, 1024, 1.25, 0.2).expect("run");
        assert!(
            0.0 < p.p50_ms
                && p.p50_ms <= p.p99_ms
                && p.p99_ms <= p.p999_ms
                && p.p999_ms <= p.max_ms
        );
        assert!(
            !dir.path().join("rawlog.dat").exists(),
            "the ring file is removed"
        );
        let err = raw_durable_appends(dir.path(), 1000.0, 1 << 20, 1 << 10, 1.0, 0.1)
            .expect_err("a 1 GiB batch");
        assert!(err.contains("does not fit"), "{err}");
        for (rate, batch, record, factor, secs) in [
            (0.0, 1, 1, 1.0, 1.0),
            (1.0, 0, 1, 1.0, 1.0),
            (1.0, 1, 0, 1.0, 1.0),
            (1.0, 1, 1, 0.5, 1.0),
            (1.0, 1, 1, 1.0, f64::NAN),
        ] {
            let err = raw_durable_appends(dir.path(), rate, batch, record, factor, secs)
                .expect_err("bad arguments");
            assert!(err.contains("must be"), "{err}");
        }
    }
}
