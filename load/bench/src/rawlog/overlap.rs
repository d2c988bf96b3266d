//! [`Layout::Overlapped`]'s loop: the service's files, written as
//! [`Layout::Service`] writes them (each write followed by a started
//! write-back), but each group's round — its write-backs waited for, then
//! one flush — runs on one of `depth` round threads. Meanwhile the loop
//! writes whatever arrives into the next group, which starts its own round
//! as soon as fewer than `depth` are running. Groups are answered in
//! order: a group counts as durable only once every group before it is,
//! as a log's positions must be.
//!
//! Depth 0 is one round at a time with nothing written during it (what
//! [`Layout::Service`] does, through the same code as the other depths,
//! so they can be timed in any order). Depth 1 is the service's writer as
//! it is built: the next batch is written while one round runs, and its
//! round starts when that one ends.
//! Depth 2 and more are rounds that overlap on the device, which the
//! service does not do; this floor says what they would give on this disk
//! before anyone changes the writer's ordering and recovery for them.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use melddb_log::flush;

use super::{arrivals, io_error, shares, Cursor, Layout, Ring};

/// Most round threads one run starts.
pub(super) const MAX_DEPTH: usize = 64;

/// One group's round: the group's number, and the range each of its
/// writes covered, as (file, offset, length).
struct Round {
    group: usize,
    ranges: Vec<(usize, u64, u64)>,
}

/// A round's end: its group, and when it ended (from the run's start) or
/// why it failed.
type Ended = (usize, Result<Duration, String>);

/// The timed loop of [`Layout::Overlapped`] over the rings
/// [`super::run`] prepared, at `(rate, batch, record, secs)`, with at most
/// `depth` rounds at once, each flushing through a file nothing writes
/// when `anchor` is set: every append's latency (ms) and the wall time
/// (s).
pub(super) fn run_overlapped(
    paths: &[PathBuf],
    rings: Vec<Ring>,
    (rate, batch, record, secs): (f64, usize, usize, f64),
    layout: Layout,
    (depth, anchor): (usize, bool),
) -> Result<(Vec<f64>, f64), String> {
    let mut files = Vec::with_capacity(rings.len());
    let mut cursors = Vec::with_capacity(rings.len());
    for ring in rings {
        cursors.push(ring.cursor);
        files.push(ring.file);
    }
    // The clean file: one block, written and synced once, before timing.
    let first = paths
        .first()
        .ok_or_else(|| "raw durable log: a layout without files".to_string())?;
    let anchor_path = first.with_file_name("rawlog-anchor.dat");
    let flush_file = if anchor {
        let prepare = || -> std::io::Result<File> {
            let f = File::create(&anchor_path)?;
            f.write_all_at(&[0u8; 4096], 0)?;
            f.sync_all()?;
            Ok(f)
        };
        let prepared = prepare().map_err(|e| {
            let _ = std::fs::remove_file(&anchor_path);
            io_error("prepare", &anchor_path, e)
        })?;
        Some(prepared)
    } else {
        None
    };
    let result = timed(
        &files,
        paths,
        cursors,
        (rate, batch, record, secs),
        layout,
        depth,
        flush_file.as_ref().map(|f| (f, anchor_path.as_path())),
    );
    if flush_file.is_some() {
        let _ = std::fs::remove_file(&anchor_path);
    }
    result
}

/// Starts the round threads and runs the feeding loop: every append's
/// latency (ms) and the wall time (s).
fn timed(
    files: &[File],
    paths: &[PathBuf],
    cursors: Vec<Cursor>,
    (rate, batch, record, secs): (f64, usize, usize, f64),
    layout: Layout,
    depth: usize,
    flush_via: Option<(&File, &Path)>,
) -> Result<(Vec<f64>, f64), String> {
    let due = arrivals(rate / batch as f64, secs);
    let (job_tx, job_rx) = mpsc::channel::<Round>();
    let job_rx = Mutex::new(job_rx);
    let (end_tx, end_rx) = mpsc::channel::<Ended>();
    let start = Instant::now();
    let lat = std::thread::scope(|s| {
        for i in 0..depth.max(1) {
            let end_tx = end_tx.clone();
            let job_rx = &job_rx;
            let started = std::thread::Builder::new()
                .name(format!("rawlog-round-{i}"))
                .spawn_scoped(s, move || loop {
                    // One idle thread waits for the next round holding the
                    // lock; the others wait for the lock. None holds it while
                    // its round runs.
                    let job = match job_rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    let Ok(job) = job else { return };
                    let ended =
                        round(files, paths, &job.ranges, flush_via).map(|()| start.elapsed());
                    if end_tx.send((job.group, ended)).is_err() {
                        return;
                    }
                });
            // The threads started so far end when the job channel closes.
            started.map_err(|e| format!("raw durable log: starting round thread {i}: {e}"))?;
        }
        drop(end_tx);
        // `feed` owns the job sender: however it returns, the threads see
        // the channel close after their last round, and the scope joins
        // them.
        let loop_state = Feed {
            files,
            paths,
            cursors,
            due: &due,
            start,
            batch,
            record,
            layout,
            depth,
        };
        loop_state.feed(job_tx, &end_rx)
    })?;
    Ok((lat, start.elapsed().as_secs_f64().max(secs)))
}

/// A round: waits for the write-back of each of the group's ranges, then
/// one `fdatasync` flushes the device for all of them (the service's
/// `flush_once_per_device` round), through `flush_via` when given, else
/// through the first file.
fn round(
    files: &[File],
    paths: &[PathBuf],
    ranges: &[(usize, u64, u64)],
    flush_via: Option<(&File, &Path)>,
) -> Result<(), String> {
    for &(i, at, len) in ranges {
        flush::write_back(&files[i], at, len).map_err(|e| io_error("write-back", &paths[i], e))?;
    }
    let (file, path) = flush_via.unwrap_or((&files[0], &paths[0]));
    file.sync_data().map_err(|e| io_error("fdatasync", path, e))
}

/// What the feeding loop works on.
struct Feed<'a> {
    files: &'a [File],
    paths: &'a [PathBuf],
    /// Where each ring's next write goes.
    cursors: Vec<Cursor>,
    /// Batch arrival times.
    due: &'a [Duration],
    start: Instant,
    batch: usize,
    record: usize,
    layout: Layout,
    depth: usize,
}

impl Feed<'_> {
    /// Writes every batch as it arrives into the open group, hands the
    /// group to the round threads whenever fewer than `depth` rounds run,
    /// and waits for rounds to end or batches to arrive; then answers the
    /// groups in order. Returns every append's latency (ms).
    fn feed(
        mut self,
        jobs: mpsc::Sender<Round>,
        ends: &mpsc::Receiver<Ended>,
    ) -> Result<Vec<f64>, String> {
        let stopped = || "raw durable log: the round threads stopped".to_string();
        // Each group handed to a round: its batches, as a range of `due`,
        // and when its round ended.
        let mut groups: Vec<(std::ops::Range<usize>, Option<Duration>)> = Vec::new();
        // The group being written, not yet in a round, and its first batch.
        let mut open: Option<(Round, usize)> = None;
        let mut next = 0;
        let mut running = 0;
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let now = self.start.elapsed();
            let mut upto = next;
            while upto < self.due.len() && self.due[upto] <= now {
                upto += 1;
            }
            // Depth 0 writes nothing while its round runs.
            if upto > next && (self.depth > 0 || running == 0) {
                let group = shares(self.layout, upto - next, self.batch, self.record);
                let most = group.iter().max().copied().unwrap_or(0);
                if buf.len() < most {
                    buf.resize(most, 0x3c);
                }
                let number = groups.len();
                let (round, _) = open.get_or_insert_with(|| {
                    (
                        Round {
                            group: number,
                            ranges: Vec::new(),
                        },
                        next,
                    )
                });
                for (i, (cursor, &bytes)) in self.cursors.iter_mut().zip(&group).enumerate() {
                    let (at, len) = cursor.place(bytes);
                    self.files[i]
                        .write_all_at(&buf[..len], at)
                        .map_err(|e| io_error("write", &self.paths[i], e))?;
                    // The service's own call, so the floor submits as it does.
                    flush::start_write_back(&self.files[i], at, len as u64);
                    round.ranges.push((i, at, len as u64));
                }
                next = upto;
            }
            if running < self.depth.max(1) {
                if let Some((round, first)) = open.take() {
                    groups.push((first..next, None));
                    jobs.send(round).map_err(|_| stopped())?;
                    running += 1;
                    continue;
                }
            }
            if next == self.due.len() && open.is_none() && running == 0 {
                break;
            }
            // Wait for a round to end, or for the next batch to arrive
            // (at depth 0, only for the round: nothing is written during it).
            let wait = self
                .due
                .get(next)
                .filter(|_| self.depth > 0 || running == 0)
                .map(|d| d.saturating_sub(self.start.elapsed()));
            if running > 0 {
                let got = match wait {
                    Some(w) => ends.recv_timeout(w),
                    None => ends.recv().map_err(|_| RecvTimeoutError::Disconnected),
                };
                match got {
                    Ok((group, ended)) => {
                        let slot = groups.get_mut(group).ok_or_else(stopped)?;
                        slot.1 = Some(ended?);
                        running -= 1;
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return Err(stopped()),
                }
            } else if let Some(w) = wait {
                std::thread::sleep(w);
            }
        }
        answer(groups, self.due, self.batch)
    }
}

/// Every append's latency (ms), groups answered in order: a group counts
/// as durable when its round and every earlier group's have ended, so a
/// round that ends early waits for the slower ones before it. `groups`
/// holds each group's batches (a range of `due`, the batch arrival
/// times) and when its round ended; each batch holds `batch` appends.
fn answer(
    groups: Vec<(std::ops::Range<usize>, Option<Duration>)>,
    due: &[Duration],
    batch: usize,
) -> Result<Vec<f64>, String> {
    let mut lat = Vec::with_capacity(due.len() * batch);
    let mut answered = Duration::ZERO;
    for (batches, ended) in groups {
        let ended =
            ended.ok_or_else(|| "raw durable log: a group's round never ended".to_string())?;
        answered = answered.max(ended);
        let arrived = due.get(batches).ok_or_else(|| {
            "raw durable log: a group names batches that never arrived".to_string()
        })?;
        for d in arrived {
            let ms = answered.saturating_sub(*d).as_secs_f64() * 1e3;
            lat.extend(std::iter::repeat_n(ms, batch));
        }
    }
    Ok(lat)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round that ends before an earlier group's still waits for it:
    /// its appends are answered at the earlier round's end, not their own.
    #[test]
    fn groups_are_answered_in_order() {
        let ms = Duration::from_millis;
        let due = [ms(0), ms(1), ms(2), ms(3)];
        let groups = vec![
            (0..1, Some(ms(10))),
            // Its round ended first, at 5 ms: answered at 10 ms.
            (1..3, Some(ms(5))),
            (3..4, Some(ms(12))),
        ];
        let lat = answer(groups, &due, 2).expect("every round ended");
        assert_eq!(lat, vec![10.0, 10.0, 9.0, 9.0, 8.0, 8.0, 9.0, 9.0]);
        let err = answer(vec![(0..1, None)], &due, 1).expect_err("a round never ended");
        assert!(err.contains("never ended"), "{err}");
        let err = answer(vec![(3..9, Some(ms(1)))], &due, 1).expect_err("past the arrivals");
        assert!(err.contains("never arrived"), "{err}");
    }
}
