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
//!
//! [`Layout::Service`] keeps the one thread but writes each group the way
//! the service lays it out: its payload and parity split over one file per
//! zone, and an end-write record on each of three more files, each write
//! followed by a started write-back, then every file waited for and one
//! `fdatasync` flushing the device (the service's `flush_once_per_device`
//! round, without its helper threads). Between the two floors and the
//! service, the distance splits into what the file layout costs on this
//! disk and what the service's threads, sockets and code add.

use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use melddb_log::flush;

use crate::logsvc::Point;

/// The file is a ring of this size, written full of zeros and synced
/// first, so the timed writes overwrite allocated, written blocks, as the
/// service's writes into spare segments do (no metadata per sync).
const RING_BYTES: u64 = 256 << 20;

/// Bytes of end-write record per append in [`Layout::Service`]: about
/// what the service's end-write copies grow by per 1 KiB append (an
/// entry's log name, position, request id, length, offset and checksum).
const END_WRITE_BYTES_PER_APPEND: usize = 64;

/// How a group of batches is put on disk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Layout {
    /// One file, one write and one `fdatasync` per group; the payload is
    /// written times this factor (parity bytes, `(data + parity) / data`).
    OneFile(f64),
    /// The service's files: the payload and one parity share split over
    /// `data_shards + 1` files, an end-write record on each of
    /// `end_write_copies` more, write-back of each, and one flush.
    Service {
        /// Data pages per stripe (one more file holds the parity).
        data_shards: usize,
        /// Files that each get the group's end-write record.
        end_write_copies: usize,
    },
}

impl Layout {
    /// The two floors of a service whose stripes have `data_shards` data
    /// pages and one parity page: one file carrying the parity bytes too,
    /// then the service's own files (a file per page, the end-write
    /// copies). The suite and `log --point --disk-alone` both measure
    /// these.
    pub fn floors(data_shards: usize) -> [Layout; 2] {
        [
            Layout::OneFile((data_shards + 1) as f64 / data_shards as f64),
            Layout::Service {
                data_shards,
                end_write_copies: melddb_log::config::END_WRITE_COPIES,
            },
        ]
    }

    /// How the suite's table and JSON name it.
    pub fn label(&self) -> String {
        match self {
            Layout::OneFile(_) => "the disk alone at the same arrivals".into(),
            Layout::Service { .. } => "the disk alone, the service's files".into(),
        }
    }
}

/// Runs the raw durable log for `secs` at `rate` appends per second in
/// batches of `batch` records of `record` bytes, laid out as `layout`
/// says.
pub fn raw_durable_appends(
    dir: &Path,
    rate: f64,
    batch: usize,
    record: usize,
    layout: Layout,
    secs: f64,
) -> Result<Point, String> {
    if !(rate > 0.0 && rate.is_finite() && secs > 0.0 && secs.is_finite()) {
        return Err(format!(
            "raw durable log: the rate ({rate}/s) and the duration ({secs} s) must be positive"
        ));
    }
    let ok_layout = match layout {
        Layout::OneFile(f) => f >= 1.0 && f.is_finite(),
        Layout::Service { data_shards, .. } => data_shards >= 1,
    };
    if batch == 0 || record == 0 || !ok_layout {
        return Err(format!(
            "raw durable log: batches of {batch} records of {record} B laid out as {layout:?}: each must be at least 1"
        ));
    }
    // One path per file the layout writes.
    let files = shares(layout, 1, batch, record).len();
    let paths: Vec<_> = (0..files)
        .map(|f| dir.join(format!("rawlog-{f}.dat")))
        .collect();
    let result = run(&paths, rate, batch, record, layout, secs);
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    // The rings are hundreds of MiB; on a file system mounted with
    // `discard` their trims would land in the first seconds of whatever
    // the suite measures next (the service's point at the same load).
    if let Some(first) = paths.first() {
        crate::logsvc::settle_trims(first)?;
    }
    let (lat, wall) = result?;
    Ok(Point::from_latencies(
        &layout.label(),
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

/// Formats an I/O error of a run.
fn io_error(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("raw durable log, {what} {}: {e}", path.display())
}

/// One file of the run: a ring written full of zeros first, so the timed
/// writes overwrite allocated, written blocks.
struct Ring {
    file: std::fs::File,
    /// Its size and where the next write goes.
    cursor: Cursor,
}

/// Where a ring's next write goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    /// The ring's size.
    size: u64,
    /// The next offset.
    off: u64,
}

impl Cursor {
    /// Takes the place of the next `bytes` (from the start when they do
    /// not fit before the end; never more than the ring): the offset and
    /// the length to write.
    fn place(&mut self, bytes: usize) -> (u64, usize) {
        let bytes = bytes.min(self.size as usize);
        if self.off + bytes as u64 > self.size {
            self.off = 0;
        }
        let at = self.off;
        self.off += bytes as u64;
        (at, bytes)
    }
}

impl Ring {
    fn create(path: &Path, size: u64) -> std::io::Result<Ring> {
        let file = std::fs::File::create(path)?;
        let zeros = vec![0u8; 8 << 20];
        let mut at = 0;
        while at < size {
            let n = zeros.len().min((size - at) as usize);
            file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        file.sync_all()?;
        Ok(Ring {
            file,
            cursor: Cursor { size, off: 0 },
        })
    }

    /// Writes `bytes` of `buf` at the ring's next offset (from the start
    /// when they do not fit before its end; a backlog past the whole ring,
    /// a stall of over a second at the suite's rate, is written as one
    /// ring's worth, its latencies still counted in full), and returns
    /// where.
    fn write(&mut self, buf: &[u8], bytes: usize) -> std::io::Result<(u64, usize)> {
        let (at, bytes) = self.cursor.place(bytes.min(buf.len()));
        self.file.write_all_at(&buf[..bytes], at)?;
        Ok((at, bytes))
    }
}

/// Bytes each file gets for a group of `batches` batches: one entry per
/// path.
fn shares(layout: Layout, batches: usize, batch: usize, record: usize) -> Vec<usize> {
    // Saturating: an absurd batch is refused as too large for the ring,
    // not wrapped into a small one.
    let payload = batches.saturating_mul(batch).saturating_mul(record);
    match layout {
        Layout::OneFile(factor) => vec![(payload as f64 * factor).ceil() as usize],
        Layout::Service {
            data_shards,
            end_write_copies,
        } => {
            let page = payload.div_ceil(data_shards);
            let ew = batches
                .saturating_mul(batch)
                .saturating_mul(END_WRITE_BYTES_PER_APPEND);
            let mut v = vec![page; data_shards + 1];
            v.extend(std::iter::repeat_n(ew, end_write_copies));
            v
        }
    }
}

/// The timed loop over `paths` (one per file of the layout): every
/// append's latency (ms) and the wall time (s).
fn run(
    paths: &[std::path::PathBuf],
    rate: f64,
    batch: usize,
    record: usize,
    layout: Layout,
    secs: f64,
) -> Result<(Vec<f64>, f64), String> {
    let io = io_error;
    let one = shares(layout, 1, batch, record);
    // The ring budget is split over the page files; the small end-write
    // files get a small ring each.
    let ring_of = |file: usize| -> u64 {
        match layout {
            Layout::OneFile(_) => RING_BYTES,
            Layout::Service { data_shards, .. } if file <= data_shards => {
                (RING_BYTES / (data_shards as u64 + 1)).next_multiple_of(1 << 20)
            }
            Layout::Service { .. } => 16 << 20,
        }
    };
    let mut rings = Vec::with_capacity(paths.len());
    for (file, (path, &share)) in paths.iter().zip(&one).enumerate() {
        let size = ring_of(file);
        if share == 0 || share as u64 > size / 4 {
            return Err(format!(
                "raw durable log: a batch's {share} bytes on one file do not fit its ring of {size} bytes"
            ));
        }
        rings.push(Ring::create(path, size).map_err(|e| io("prepare", path, e))?);
    }
    let flush_once = matches!(layout, Layout::Service { .. });
    let mut buf = vec![0x3cu8; one.iter().max().copied().unwrap_or(0) * 64];
    open_loop(rate, batch, secs, |batches| {
        let group = shares(layout, batches, batch, record);
        let most = group.iter().max().copied().unwrap_or(0);
        if buf.len() < most {
            buf.resize(most, 0x3c);
        }
        for ((ring, path), &bytes) in rings.iter_mut().zip(paths).zip(&group) {
            let (at, n) = ring.write(&buf, bytes).map_err(|e| io("write", path, e))?;
            if flush_once {
                // The service's own calls, so the floor submits as it does.
                flush::start_write_back(&ring.file, at, n as u64);
            }
        }
        if flush_once {
            for (ring, path) in rings.iter().zip(paths) {
                flush::write_back(&ring.file, 0, 0).map_err(|e| io("write-back", path, e))?;
            }
        }
        // With one file, its `fdatasync`; with the service's files, the
        // one flush that makes every written-back file durable.
        rings[0]
            .file
            .sync_data()
            .map_err(|e| io("fdatasync", &paths[0], e))
    })
}

/// The open loop every layout runs: batches arrive at `rate / batch` per
/// second; each time, every batch due by then forms one group, which
/// `durable` writes and makes durable (given the number of batches). An
/// append's latency runs from its batch's arrival to its group's end.
/// Returns every append's latency (ms) and the wall time (s).
fn open_loop(
    rate: f64,
    batch: usize,
    secs: f64,
    mut durable: impl FnMut(usize) -> Result<(), String>,
) -> Result<(Vec<f64>, f64), String> {
    let due = arrivals(rate / batch as f64, secs);
    let mut lat: Vec<f64> = Vec::with_capacity(due.len() * batch);
    let start = Instant::now();
    let mut next = 0;
    while next < due.len() {
        let now = start.elapsed();
        if due[next] > now {
            std::thread::sleep(due[next] - now);
        }
        // Every batch due by now goes into this group.
        let now = start.elapsed();
        let mut upto = next + 1;
        while upto < due.len() && due[upto] <= now {
            upto += 1;
        }
        durable(upto - next)?;
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

    /// The ring cursor starts over when a write would run past the end,
    /// and never hands out more than the ring.
    #[test]
    fn writes_wrap_at_the_ring_end() {
        let mut cursor = Cursor { size: 100, off: 0 };
        assert_eq!(cursor.place(60), (0, 60));
        assert_eq!(cursor.place(30), (60, 30));
        assert_eq!(cursor.place(30), (0, 30));
        assert_eq!(cursor.place(500), (0, 100));
        assert_eq!(
            cursor,
            Cursor {
                size: 100,
                off: 100
            }
        );
    }

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
    /// order, in either layout; a batch too large for the ring and
    /// arguments that would never end (no rate, empty batches) are
    /// refused.
    #[test]
    fn a_short_run_counts_every_append_and_bad_arguments_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let service = Layout::Service {
            data_shards: 4,
            end_write_copies: 3,
        };
        for layout in [Layout::OneFile(1.25), service] {
            let one_file = matches!(layout, Layout::OneFile(_));
            let files = if one_file { 1 } else { 8 };
            let paths: Vec<_> = (0..files)
                .map(|f| dir.path().join(format!("ring{f}")))
                .collect();
            let (lat, wall) = run(&paths, 20_000.0, 10, 1024, layout, 0.5).expect("run");
            // Every append of every batch that arrived, once: batches
            // grouped into one sync are each counted.
            assert_eq!(lat.len(), arrivals(2_000.0, 0.5).len() * 10, "{layout:?}");
            assert!(lat.iter().all(|&ms| ms > 0.0));
            assert!(wall >= 0.5);
            // Each ring was written full before the timed writes, and
            // every file of the layout was written.
            assert_eq!(
                std::fs::metadata(&paths[0]).expect("ring").len(),
                if one_file { RING_BYTES } else { 52 << 20 }
            );
            for p in &paths {
                let mut head = [0u8; 64];
                std::fs::File::open(p)
                    .and_then(|f| f.read_exact_at(&mut head, 0))
                    .expect("ring head");
                assert_eq!(head, [0x3c; 64], "{} holds the group's bytes", p.display());
            }
            let p = raw_durable_appends(dir.path(), 20_000.0, 10, 1024, layout, 0.2).expect("run");
            assert!(
                0.0 < p.p50_ms
                    && p.p50_ms <= p.p99_ms
                    && p.p99_ms <= p.p999_ms
                    && p.p999_ms <= p.max_ms
            );
            assert_eq!(p.label, layout.label());
        }
        assert_eq!(
            std::fs::read_dir(dir.path())
                .expect("dir")
                .filter(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("rawlog"))
                })
                .count(),
            0,
            "the ring files are removed"
        );
        let err = raw_durable_appends(
            dir.path(),
            1000.0,
            1 << 20,
            1 << 10,
            Layout::OneFile(1.0),
            0.1,
        )
        .expect_err("a 1 GiB batch");
        assert!(err.contains("do not fit"), "{err}");
        let err = raw_durable_appends(dir.path(), 1000.0, 1 << 16, 1 << 10, service, 0.1)
            .expect_err("a 64 MiB batch over 5 files");
        assert!(err.contains("do not fit"), "{err}");
        let err = raw_durable_appends(dir.path(), 1000.0, usize::MAX / 2, 1 << 10, service, 0.1)
            .expect_err("a batch past usize");
        assert!(err.contains("do not fit"), "{err}");
        for (rate, batch, record, layout, secs) in [
            (0.0, 1, 1, Layout::OneFile(1.0), 1.0),
            (1.0, 0, 1, Layout::OneFile(1.0), 1.0),
            (1.0, 1, 0, Layout::OneFile(1.0), 1.0),
            (1.0, 1, 1, Layout::OneFile(0.5), 1.0),
            (1.0, 1, 1, Layout::OneFile(1.0), f64::NAN),
            (
                1.0,
                1,
                1,
                Layout::Service {
                    data_shards: 0,
                    end_write_copies: 3,
                },
                1.0,
            ),
        ] {
            let err = raw_durable_appends(dir.path(), rate, batch, record, layout, secs)
                .expect_err("bad arguments");
            assert!(err.contains("must be"), "{err}");
        }
    }

    /// The service's layout splits a group as the service does: the
    /// payload over the data files plus an equal parity share, and an
    /// end-write record per append on each copy.
    #[test]
    fn the_service_layout_splits_payload_parity_and_end_writes() {
        let service = Layout::Service {
            data_shards: 4,
            end_write_copies: 3,
        };
        assert_eq!(
            shares(service, 3, 64, 1024),
            [
                vec![49_152; 5],
                vec![3 * 64 * END_WRITE_BYTES_PER_APPEND; 3]
            ]
            .concat()
        );
        assert_eq!(shares(Layout::OneFile(1.25), 3, 64, 1024), vec![245_760]);
    }

    /// The two floors of one geometry write the same page bytes: the one
    /// file carries what the service's page files (data and parity) hold.
    #[test]
    fn both_floors_of_a_geometry_write_the_same_page_bytes() {
        for k in [1, 2, 4, 8] {
            let [one, files] = Layout::floors(k);
            let one: usize = shares(one, 1, 64, 1024).iter().sum();
            let files = shares(files, 1, 64, 1024);
            assert_eq!(files.len(), k + 1 + melddb_log::config::END_WRITE_COPIES);
            assert_eq!(one, files[..=k].iter().sum::<usize>(), "k = {k}");
        }
    }
}
