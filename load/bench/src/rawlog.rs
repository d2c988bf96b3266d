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
//!
//! [`Layout::Direct`] (`log --disk-alone --direct-floors`) writes the same
//! files around the page cache: whole blocks with `O_DIRECT` through
//! `io_uring`, then one flush. It measures what the buffered writes and
//! their write-back cost on this disk, for a service that would write its
//! pages directly.

use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use melddb_log::flush;

use crate::logsvc::Point;

mod overlap;

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
    /// The service's files as in [`Layout::Service`], written with
    /// `O_DIRECT` through `io_uring` instead of buffered and written back:
    /// each write covers whole 4 KiB blocks, from the block holding the
    /// file's previous end (rewritten, as a log keeping its partial tail
    /// block in memory would) to the block after its own end, and one
    /// `fdatasync` flushes the device once they are all done, submitted
    /// as [`Submit`] says.
    Direct {
        /// Data pages per stripe (one more file holds the parity).
        data_shards: usize,
        /// Files that each get the group's end-write record.
        end_write_copies: usize,
        /// How the group's writes go to the kernel.
        submit: Submit,
    },
    /// The service's files written as in [`Layout::Service`], but each
    /// group's round (its write-backs waited for, then one flush) runs on
    /// one of `depth` round threads while the loop writes the groups
    /// arriving meanwhile, answered in order ([`overlap`]). Depth 1 is the
    /// service's writer as built; more is rounds overlapping on the device.
    Overlapped {
        /// Data pages per stripe (one more file holds the parity).
        data_shards: usize,
        /// Files that each get the group's end-write record.
        end_write_copies: usize,
        /// Rounds on the device at once, at most; 0: one, with nothing
        /// written while it runs.
        depth: usize,
        /// Whether each round's flush is an `fdatasync` of a file nothing
        /// writes (true), rather than of the first page file, whose own
        /// `fdatasync` also waits for the pages later groups have written
        /// to it since.
        anchor: bool,
    },
}

/// How [`Layout::Direct`] hands a group's writes to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submit {
    /// Every file's write in one `io_uring_enter`, so the block layer can
    /// pass the whole group to the device with one notification.
    Group,
    /// One `io_uring_enter` per file, all in flight together.
    PerFile,
    /// One per file, the page files first; the end-write files only once
    /// the page files' writes are done, as the service orders them when
    /// its pages are written directly (an end-write never reaches the
    /// disk before the pages it describes were issued).
    EndWritesLast,
}

impl Submit {
    /// Every mode, in the order `--direct-floors` times them.
    pub const ALL: [Submit; 3] = [Submit::Group, Submit::PerFile, Submit::EndWritesLast];
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
            Layout::Direct { submit, .. } => match submit {
                Submit::Group => "direct files, one submission".into(),
                Submit::PerFile => "direct files, one per file".into(),
                Submit::EndWritesLast => "direct files, end-writes last".into(),
            },
            Layout::Overlapped {
                depth,
                anchor: false,
                ..
            } => match depth {
                0 => "service's files, no write in a round".into(),
                _ => format!("service's files, {depth} round(s) at once"),
            },
            Layout::Overlapped {
                depth,
                anchor: true,
                ..
            } => match depth {
                0 => "no write in a round, clean-file flush".into(),
                _ => format!("{depth} round(s), flush of a clean file"),
            },
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
        Layout::Service { data_shards, .. }
        | Layout::Direct { data_shards, .. }
        | Layout::Overlapped { data_shards, .. } => data_shards >= 1,
    };
    if batch == 0 || record == 0 || !ok_layout {
        return Err(format!(
            "raw durable log: batches of {batch} records of {record} B laid out as {layout:?}: each must be at least 1"
        ));
    }
    if let Layout::Overlapped { depth, .. } = layout {
        if depth > overlap::MAX_DEPTH {
            return Err(format!(
                "raw durable log: {depth} rounds at once is more than the {} round threads it may start; ask for fewer",
                overlap::MAX_DEPTH
            ));
        }
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
        }
        | Layout::Direct {
            data_shards,
            end_write_copies,
            ..
        }
        | Layout::Overlapped {
            data_shards,
            end_write_copies,
            ..
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
            Layout::Service { data_shards, .. }
            | Layout::Direct { data_shards, .. }
            | Layout::Overlapped { data_shards, .. }
                if file <= data_shards =>
            {
                (RING_BYTES / (data_shards as u64 + 1)).next_multiple_of(1 << 20)
            }
            Layout::Service { .. } | Layout::Direct { .. } | Layout::Overlapped { .. } => 16 << 20,
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
    if let Layout::Direct {
        data_shards,
        submit,
        ..
    } = layout
    {
        // The page files (data and parity) come first in `paths`.
        let stages = match submit {
            Submit::EndWritesLast => vec![(0, data_shards + 1), (data_shards + 1, paths.len())],
            Submit::Group | Submit::PerFile => vec![(0, paths.len())],
        };
        let one_call = submit == Submit::Group;
        return run_direct(
            paths,
            rings,
            rate,
            batch,
            record,
            layout,
            secs,
            (stages, one_call),
        );
    }
    if let Layout::Overlapped { depth, anchor, .. } = layout {
        return overlap::run_overlapped(
            paths,
            rings,
            (rate, batch, record, secs),
            layout,
            (depth, anchor),
        );
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

/// Block size of the direct writes.
const BLOCK: u64 = 4096;

/// Where a direct write of `bytes` more bytes goes on a ring of `size`
/// bytes whose data ends at `end`: whole blocks from the one holding
/// `end` (its first part rewritten, as a log keeping its partial last
/// block in memory rewrites it) to the one holding the new end, as
/// `(offset, length)`, and the new end. A group that would run past the
/// ring starts again at 0; one larger than half the ring is cut to half
/// (the ring's `write` does the same with a backlog).
fn direct_span(end: u64, bytes: u64, size: u64) -> ((u64, u64), u64) {
    let bytes = bytes.min(size / 2);
    let end = if (end + bytes).next_multiple_of(BLOCK) > size {
        0
    } else {
        end
    };
    let from = end / BLOCK * BLOCK;
    let to = (end + bytes).next_multiple_of(BLOCK);
    ((from, to - from), end + bytes)
}

/// [`run`]'s loop for [`Layout::Direct`], over the rings `run` prepared.
#[cfg(not(target_os = "linux"))]
#[allow(clippy::too_many_arguments)]
fn run_direct(
    _paths: &[std::path::PathBuf],
    _rings: Vec<Ring>,
    _rate: f64,
    _batch: usize,
    _record: usize,
    _layout: Layout,
    _secs: f64,
    _how: (Vec<(usize, usize)>, bool),
) -> Result<(Vec<f64>, f64), String> {
    Err("raw durable log: the direct layouts need Linux (O_DIRECT and io_uring)".into())
}

/// [`run`]'s loop for [`Layout::Direct`], over the rings `run` prepared:
/// each group's files are written in `stages` (index ranges of `paths`,
/// each submitted and waited for before the next; in one call each when
/// `one_call`), then flushed once.
#[cfg(target_os = "linux")]
#[allow(clippy::too_many_arguments)]
fn run_direct(
    paths: &[std::path::PathBuf],
    rings: Vec<Ring>,
    rate: f64,
    batch: usize,
    record: usize,
    layout: Layout,
    secs: f64,
    (stages, one_call): (Vec<(usize, usize)>, bool),
) -> Result<(Vec<f64>, f64), String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    use std::os::unix::io::AsRawFd as _;
    let io = io_error;
    let mut direct = Vec::with_capacity(rings.len());
    for path in paths {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|e| io("open with O_DIRECT", path, e))?;
        direct.push(f);
    }
    let mut uring = io_uring::IoUring::new((paths.len() as u32).next_power_of_two().max(8))
        .map_err(|e| format!("raw durable log, io_uring: {e}"))?;
    // Where each file's data ends; writes go out in whole blocks.
    let mut ends = vec![0u64; rings.len()];
    // The bytes written are a constant, as in `run`, in a buffer with
    // room for the longest span and the alignment.
    let mut raw = Vec::new();
    let mut spans = Vec::with_capacity(rings.len());
    open_loop(rate, batch, secs, |batches| {
        let group = shares(layout, batches, batch, record);
        spans.clear();
        for ((ring, end), &bytes) in rings.iter().zip(ends.iter_mut()).zip(&group) {
            let (span, new_end) = direct_span(*end, bytes as u64, ring.cursor.size);
            *end = new_end;
            spans.push(span);
        }
        let longest = spans
            .iter()
            .map(|s: &(u64, u64)| s.1 as usize)
            .max()
            .unwrap_or(0);
        if raw.len() < longest + BLOCK as usize {
            raw.resize(longest + BLOCK as usize, 0x3cu8);
        }
        let buf = &raw[raw.as_ptr().align_offset(BLOCK as usize)..];
        for &(first, end) in &stages {
            for i in first..end {
                let (at, len) = spans[i];
                let sqe = io_uring::opcode::Write::new(
                    io_uring::types::Fd(direct[i].as_raw_fd()),
                    buf.as_ptr(),
                    len as u32,
                )
                .offset(at)
                .build()
                .user_data(i as u64);
                // SAFETY: the buffer and the files outlive the wait below,
                // which takes every completion of the stage before the
                // loop goes on.
                unsafe { uring.submission().push(&sqe) }.map_err(|_| {
                    io(
                        "queue a write to",
                        &paths[i],
                        std::io::Error::other("ring full"),
                    )
                })?;
                if !one_call {
                    uring.submit().map_err(|e| io("submit", &paths[i], e))?;
                }
            }
            let mut done = 0;
            while done < end - first {
                uring
                    .submit_and_wait(end - first - done)
                    .map_err(|e| io("submit", &paths[0], e))?;
                for cqe in uring.completion() {
                    let i = (cqe.user_data() as usize).min(spans.len() - 1);
                    if i64::from(cqe.result()) != spans[i].1 as i64 {
                        let e = if cqe.result() < 0 {
                            std::io::Error::from_raw_os_error(-cqe.result())
                        } else {
                            std::io::Error::other(format!("short write of {} bytes", cqe.result()))
                        };
                        return Err(io("direct write", &paths[i], e));
                    }
                    done += 1;
                }
            }
        }
        // The writes are on the device; one flush makes them durable (an
        // `fdatasync` of a file with nothing dirty still flushes).
        rings[0]
            .file
            .sync_data()
            .map_err(|e| io("fdatasync", &paths[0], e))
    })
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

    /// Direct writes cover whole blocks, from the block holding the data's
    /// end through the block holding its new end, inside the ring, and a
    /// group that would run past the ring starts again at its beginning.
    #[test]
    fn direct_spans_are_whole_blocks_covering_each_group() {
        let size = 1 << 20;
        let mut end = 0u64;
        let mut wrapped = 0;
        for i in 0..5_000u64 {
            let bytes = (i * 7919) % 70_000 + 1;
            let ((from, len), new_end) = direct_span(end, bytes, size);
            assert_eq!(from % BLOCK, 0, "group {i}");
            assert_eq!(len % BLOCK, 0, "group {i}");
            assert!(from + len <= size, "group {i} inside the ring");
            let start = new_end - bytes;
            if start != end {
                assert_eq!(start, 0, "group {i} starts again at 0");
                assert!((end + bytes).next_multiple_of(BLOCK) > size);
                wrapped += 1;
            }
            assert!(from <= start && start < from + BLOCK, "group {i}");
            assert!(new_end <= from + len && from + len < new_end + BLOCK);
            end = new_end;
        }
        assert!(wrapped > 100, "the ring wrapped {wrapped} times");
        // A group larger than half the ring is cut to half of it.
        assert_eq!(direct_span(0, 3 << 20, size), ((0, size / 2), size / 2));
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
        let direct = |submit| Layout::Direct {
            data_shards: 4,
            end_write_copies: 3,
            submit,
        };
        let overlapped = |depth| Layout::Overlapped {
            data_shards: 4,
            end_write_copies: 3,
            depth,
            anchor: depth == 2,
        };
        let layouts = [Layout::OneFile(1.25), service]
            .into_iter()
            .chain(Submit::ALL.map(direct))
            .chain([0, 2].map(overlapped));
        for layout in layouts {
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
        let err = raw_durable_appends(dir.path(), 1.0, 1, 1, overlapped(65), 1.0)
            .expect_err("too many round threads");
        assert!(err.contains("ask for fewer"), "{err}");
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
