//! A load point cut into short intervals, to place its stalls.
//!
//! The service's stage histograms count per round or per append over a
//! whole point, so a stall of tens of milliseconds shows only as a max:
//! at 150K appends/s a point has about 18,000 rounds, and ten slow rounds
//! in a row are invisible in the round p99, yet delay a hundred
//! milliseconds of arrivals, enough to move the appends' p99. A
//! [`Sampler`] thread therefore reads, every [`INTERVAL`], the service's
//! histograms and what the kernel counts for the threads and the disk
//! under them, and keeps the difference per interval. Intervals whose
//! slowest acknowledgement exceeds [`STALL_MS`] are grouped, with the
//! intervals those appends waited through, into [`Episode`]s, each with
//! what happened meanwhile and a likely cause.
//!
//! The kernel's figures are Linux's (per-thread `schedstat` and `wchan`,
//! `/proc/stat`, `/proc/pressure`, `/proc/diskstats`); where a file is
//! missing its figures read as zero and [`Timeline::kernel_figures`] says
//! so.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use melddb_log::latency::{Snapshot, StagesSnapshot};
use melddb_log::store::Store;
use serde::Serialize;

/// How often the sampler reads the counters.
pub const INTERVAL: Duration = Duration::from_millis(10);

/// An interval is part of a stall when an append acknowledged in it had
/// waited longer than this: twice the p99 target.
pub const STALL_MS: f64 = 4.0;

/// Thread names (as the kernel keeps them, cut to 15 bytes) of the
/// service's writer and of its fsync helpers.
const WRITER_COMM: &str = "melddb-log-writ";
const HELPER_COMM: &str = "melddb-log-fsyn";

/// What one interval held. Times are milliseconds; a stage's `*_max_ms`
/// is a histogram bucket's upper bound (at most 19% high) and 0 when the
/// stage recorded nothing in the interval.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Interval {
    /// Start, from the sampler's start.
    pub at_ms: f64,
    /// Its length (the sampler can wake late).
    pub len_ms: f64,
    /// Appends acknowledged in it.
    pub acked: u64,
    /// The longest wait, since the store accepted it, of an append
    /// acknowledged in it.
    pub acked_max_ms: f64,
    /// The longest wait of an append the writer took in it.
    pub queued_max_ms: f64,
    /// fsync rounds that ended in it.
    pub rounds: u64,
    /// Those rounds' time, summed.
    pub round_ms: f64,
    /// The longest of them.
    pub round_max_ms: f64,
    /// The writer building and writing batches (window slides included),
    /// summed.
    pub write_ms: f64,
    /// The longest of those writes.
    pub write_max_ms: f64,
    /// The writer blocked on rounds, summed.
    pub round_wait_ms: f64,
    /// The writer answering durable batches, summed.
    pub answer_ms: f64,
    /// The writer sliding the segment windows, summed.
    pub slide_ms: f64,
    /// The writer thread on a CPU.
    pub writer_run_ms: f64,
    /// The writer thread runnable but waiting for a CPU.
    pub writer_runqueue_ms: f64,
    /// The fsync helpers runnable but waiting for a CPU, all together.
    pub helpers_runqueue_ms: f64,
    /// Time the hypervisor ran something else on this VM's CPUs (all
    /// CPUs, in the kernel's 10 ms ticks).
    pub steal_ms: f64,
    /// The CPUs' busy time: everything but idle, I/O wait and steal (all
    /// CPUs, in ticks).
    pub busy_ms: f64,
    /// CPU time of this process (client and service together), in the
    /// same ticks: `busy_ms` minus this is everything else on the machine.
    pub process_ms: f64,
    /// Time in which some task on the machine waited for a CPU (pressure
    /// stall information).
    pub cpu_pressure_ms: f64,
    /// Time in which some task waited for I/O.
    pub io_pressure_ms: f64,
    /// Time in which some task waited for memory (reclaim, compaction).
    pub memory_pressure_ms: f64,
    /// Writes the disk under the service's directory completed.
    pub disk_writes: u64,
    /// The time the kernel counted writes in flight, summed over requests
    /// (several in flight count several times).
    pub disk_write_ms: f64,
    /// Cache flushes the disk completed.
    pub disk_flushes: u64,
    /// The time flushes were in flight, summed over requests.
    pub disk_flush_ms: f64,
    /// Discards (trims) the disk completed.
    pub disk_discards: u64,
}

/// A stall: the intervals from the earliest acceptance of a late append
/// to the last late acknowledgement, with their sums.
#[derive(Debug, Clone, Serialize)]
pub struct Episode {
    /// Intervals in it.
    pub intervals: usize,
    /// The sums and maxima over them; `at_ms` is the first one's start.
    pub totals: Interval,
    /// Where the kernel had the writer thread waiting (its `wchan`) at
    /// the samples taken in the episode while it was off a CPU, with how
    /// many samples found it there, most first.
    pub writer_blocked_in: Vec<(String, usize)>,
    /// The likely cause, from the rules in [`Episode::cause_of`].
    pub cause: &'static str,
}

/// A point's intervals, reduced to what a report keeps.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timeline {
    /// Interval length asked for, milliseconds.
    pub interval_ms: f64,
    /// Intervals sampled.
    pub intervals: usize,
    /// Whether the kernel's per-thread and disk figures were found.
    pub kernel_figures: bool,
    /// Sums and maxima over the whole point.
    pub totals: Interval,
    /// Every stall, in order.
    pub episodes: Vec<Episode>,
}

impl Interval {
    /// Adds `o` to this one: sums add, maxima take the larger, the start
    /// stays the first one's.
    fn absorb(&mut self, o: &Interval) {
        self.len_ms += o.len_ms;
        self.acked += o.acked;
        self.acked_max_ms = self.acked_max_ms.max(o.acked_max_ms);
        self.queued_max_ms = self.queued_max_ms.max(o.queued_max_ms);
        self.rounds += o.rounds;
        self.round_ms += o.round_ms;
        self.round_max_ms = self.round_max_ms.max(o.round_max_ms);
        self.write_ms += o.write_ms;
        self.write_max_ms = self.write_max_ms.max(o.write_max_ms);
        self.round_wait_ms += o.round_wait_ms;
        self.answer_ms += o.answer_ms;
        self.slide_ms += o.slide_ms;
        self.writer_run_ms += o.writer_run_ms;
        self.writer_runqueue_ms += o.writer_runqueue_ms;
        self.helpers_runqueue_ms += o.helpers_runqueue_ms;
        self.steal_ms += o.steal_ms;
        self.busy_ms += o.busy_ms;
        self.process_ms += o.process_ms;
        self.cpu_pressure_ms += o.cpu_pressure_ms;
        self.io_pressure_ms += o.io_pressure_ms;
        self.memory_pressure_ms += o.memory_pressure_ms;
        self.disk_writes += o.disk_writes;
        self.disk_write_ms += o.disk_write_ms;
        self.disk_flushes += o.disk_flushes;
        self.disk_flush_ms += o.disk_flush_ms;
        self.disk_discards += o.disk_discards;
    }
}

impl Episode {
    /// The likely cause of a stall, first rule that holds:
    /// - `host steal`: the hypervisor took at least a quarter of one CPU's
    ///   time over the episode;
    /// - `memory`: some task waited for memory (reclaim, compaction) for at
    ///   least a quarter of the episode;
    /// - `writer off CPU`: the writer waited runnable for at least a
    ///   quarter of the episode;
    /// - `slow round or write`: a round or a write took at least
    ///   [`STALL_MS`] (a write includes starting the write-back of its
    ///   pages, which blocks while the disk's queue is full), or the
    ///   disk's flushes were in flight at least a quarter of the episode;
    /// - `writer busy`: the writer's own steps (writes, window slides
    ///   included, and answers) took at least half the episode;
    /// - `unplaced` otherwise.
    pub fn cause_of(t: &Interval) -> &'static str {
        let q = t.len_ms / 4.0;
        if t.steal_ms >= q {
            "host steal"
        } else if t.memory_pressure_ms >= q {
            "memory"
        } else if t.writer_runqueue_ms >= q {
            "writer off CPU"
        } else if t.round_max_ms >= STALL_MS || t.write_max_ms >= STALL_MS || t.disk_flush_ms >= q {
            "slow round or write"
        } else if t.write_ms + t.answer_ms >= 2.0 * q {
            "writer busy"
        } else {
            "unplaced"
        }
    }
}

impl Timeline {
    /// The episodes' windows, added up (0 without any).
    pub fn stall_ms(&self) -> f64 {
        self.episodes.iter().fold(0.0, |a, e| a + e.totals.len_ms)
    }

    /// Groups `intervals` into a report. An append acknowledged late in
    /// an interval was accepted up to its wait before that interval began,
    /// so a stall's window reaches back that far; overlapping windows
    /// merge, and an episode sums every interval its window touches.
    /// `wchans[i]` is the writer's `wchan` sampled at the end of
    /// `intervals[i]` (empty or "0" while it ran).
    pub fn from_intervals(
        intervals: &[Interval],
        wchans: &[String],
        kernel_figures: bool,
    ) -> Timeline {
        let mut totals = Interval::default();
        let mut windows: Vec<(f64, f64)> = Vec::new();
        for iv in intervals {
            totals.absorb(iv);
            if iv.acked_max_ms <= STALL_MS {
                continue;
            }
            let (start, end) = (iv.at_ms - iv.acked_max_ms, iv.at_ms + iv.len_ms);
            match windows.last_mut() {
                Some(w) if start <= w.1 => w.1 = end,
                _ => windows.push((start, end)),
            }
        }
        let episodes = windows
            .iter()
            .map(|&(start, end)| {
                let mut n = 0;
                let mut t: Option<Interval> = None;
                let mut blocked: BTreeMap<String, usize> = BTreeMap::new();
                for (i, iv) in intervals.iter().enumerate() {
                    if iv.at_ms < end && iv.at_ms + iv.len_ms > start {
                        n += 1;
                        match &mut t {
                            Some(t) => t.absorb(iv),
                            None => t = Some(*iv),
                        }
                        match wchans.get(i).map(String::as_str) {
                            None | Some("" | "0") => {}
                            Some(w) => *blocked.entry(w.to_string()).or_default() += 1,
                        }
                    }
                }
                let t = t.unwrap_or_default();
                let mut writer_blocked_in: Vec<(String, usize)> = blocked.into_iter().collect();
                writer_blocked_in.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                Episode {
                    intervals: n,
                    cause: Episode::cause_of(&t),
                    totals: t,
                    writer_blocked_in,
                }
            })
            .collect();
        Timeline {
            interval_ms: INTERVAL.as_secs_f64() * 1e3,
            intervals: intervals.len(),
            kernel_figures,
            totals,
            episodes,
        }
    }

    /// Prints the episodes as a table (nothing but a line when there were
    /// none).
    pub fn print(&self, title: &str) {
        let t = &self.totals;
        println!(
            "{title}: {} intervals of {:.0} ms; over the point (ms): CPUs busy {:.0} (this process {:.0}), steal {:.0}, writer on a CPU {:.0} and waiting for one {:.0}, helpers waiting {:.0}; pressure: CPU {:.0}, I/O {:.0}, memory {:.0}; disk flushes in flight {:.0}",
            self.intervals,
            self.interval_ms,
            t.busy_ms,
            t.process_ms,
            t.steal_ms,
            t.writer_run_ms,
            t.writer_runqueue_ms,
            t.helpers_runqueue_ms,
            t.cpu_pressure_ms,
            t.io_pressure_ms,
            t.memory_pressure_ms,
            t.disk_flush_ms
        );
        if !self.kernel_figures {
            println!("  (no per-thread or disk figures on this system)");
        }
        if self.episodes.is_empty() {
            println!("  no interval acknowledged an append later than {STALL_MS} ms");
            return;
        }
        println!("  each stall (ms): its window; the latest acknowledgement and the longest queueing; rounds ended and the longest; writes summed and the longest; answering summed; writer and helpers runnable off a CPU; CPUs busy and this process's share; CPU, I/O and memory pressure; steal; disk flushes in flight; the writer's kernel wait points sampled off a CPU");
        println!(
            "  {:>7} {:>5} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} {:>5} {:>6} {:>6} {:>6} {:>5} {:>5}  cause; writer waiting in",
            "at", "len", "ack", "queue", "rounds", "round", "writes", "write", "answer", "w runq", "h runq", "busy", "ours", "cpu ps", "io ps", "mem ps", "steal", "flush"
        );
        for e in &self.episodes {
            let x = &e.totals;
            println!(
                "  {:>7.0} {:>5.0} {:>6.2} {:>6.2} {:>6} {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>5.0} {:>5.0} {:>6.2} {:>6.2} {:>6.2} {:>5.0} {:>5.0}  {}; {}",
                x.at_ms,
                x.len_ms,
                x.acked_max_ms,
                x.queued_max_ms,
                x.rounds,
                x.round_max_ms,
                x.write_ms,
                x.write_max_ms,
                x.answer_ms,
                x.writer_runqueue_ms,
                x.helpers_runqueue_ms,
                x.busy_ms,
                x.process_ms,
                x.cpu_pressure_ms,
                x.io_pressure_ms,
                x.memory_pressure_ms,
                x.steal_ms,
                x.disk_flush_ms,
                e.cause,
                e.writer_blocked_in
                    .iter()
                    .map(|(w, n)| format!("{w} x{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
}

/// The kernel's counters at one moment (zeros where unreadable).
#[derive(Debug, Clone, Copy, Default)]
struct Kernel {
    writer: (u64, u64),
    helpers_wait: u64,
    /// Busy and steal ticks of all CPUs.
    cpu_ticks: (u64, u64),
    /// User and system ticks of this process.
    process_ticks: u64,
    /// `some` totals (µs) of CPU, I/O and memory pressure.
    pressure: [u64; 3],
    /// Writes, ms writing, flushes, ms flushing, discards.
    disk: [u64; 5],
}

/// The `schedstat` files of this process's threads whose kernel name
/// starts with `comm`, found once: reading every thread's name each
/// interval would cost more than the figures are worth.
fn named_threads(comm: &str) -> Vec<PathBuf> {
    let Ok(dir) = fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.flatten()
        .map(|t| t.path())
        .filter(|p| fs::read_to_string(p.join("comm")).is_ok_and(|name| name.starts_with(comm)))
        .map(|p| p.join("schedstat"))
        .collect()
}

/// Run time and run-queue wait (ns), summed over `threads` (a thread
/// that has ended counts zero).
fn thread_times(threads: &[PathBuf]) -> (u64, u64) {
    let mut sum = (0, 0);
    for p in threads {
        let s = fs::read_to_string(p).unwrap_or_default();
        let mut f = s.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
        sum.0 += f.next().unwrap_or(0);
        sum.1 += f.next().unwrap_or(0);
    }
    sum
}

/// Busy and steal ticks of all CPUs, from `/proc/stat` text: user, nice,
/// system, irq and softirq are busy; idle, iowait and steal are not.
fn cpu_ticks(stat: &str) -> (u64, u64) {
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    (at(0) + at(1) + at(2) + at(5) + at(6), at(7))
}

/// User plus system ticks of a process from its `/proc/PID/stat` text
/// (values 14 and 15; the command name before them is in parentheses and
/// may hold spaces, so counting starts after its closing one).
fn process_ticks(stat: &str) -> u64 {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    // `rest` starts at value 3 (the state).
    let v: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    v.iter().sum()
}

/// The `some` total (µs) of a `/proc/pressure/*` file's text.
fn pressure_some(text: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with("some"))
        .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("total=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The block device holding `dir`, as (major, minor).
fn device_of(dir: &Path) -> Option<(u64, u64)> {
    let dev = fs::metadata(dir).ok()?.dev();
    // glibc's gnu_dev_major / gnu_dev_minor.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    Some((major, minor))
}

/// Writes completed, ms writing, flushes completed, ms flushing and
/// discards completed of device `dev` in `/proc/diskstats` text (values 5,
/// 8, 16, 17 and 12 after the name; the flush values exist since Linux
/// 5.5).
fn disk_counts(diskstats: &str, dev: (u64, u64)) -> Option<[u64; 5]> {
    for l in diskstats.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 20 || f[0].parse() != Ok(dev.0) || f[1].parse() != Ok(dev.1) {
            continue;
        }
        let v = |i: usize| f[2 + i].parse::<u64>().unwrap_or(0);
        return Some([v(5), v(8), v(16), v(17), v(12)]);
    }
    None
}

/// Where the kernel's figures come from, found once.
struct Sources {
    writer: Vec<PathBuf>,
    helpers: Vec<PathBuf>,
    dev: Option<(u64, u64)>,
}

impl Sources {
    /// Where the kernel has the (first) writer thread waiting: a kernel
    /// function's name, or "0" while it runs.
    fn writer_wchan(&self) -> String {
        self.writer
            .first()
            .and_then(|p| fs::read_to_string(p.with_file_name("wchan")).ok())
            .unwrap_or_default()
    }

    fn read(&self) -> (Kernel, bool) {
        let disk = self
            .dev
            .and_then(|d| disk_counts(&fs::read_to_string("/proc/diskstats").ok()?, d));
        let k = Kernel {
            writer: thread_times(&self.writer),
            helpers_wait: thread_times(&self.helpers).1,
            cpu_ticks: cpu_ticks(&fs::read_to_string("/proc/stat").unwrap_or_default()),
            process_ticks: process_ticks(
                &fs::read_to_string("/proc/self/stat").unwrap_or_default(),
            ),
            pressure: ["cpu", "io", "memory"].map(|r| {
                pressure_some(
                    &fs::read_to_string(format!("/proc/pressure/{r}")).unwrap_or_default(),
                )
            }),
            disk: disk.unwrap_or_default(),
        };
        (k, !self.writer.is_empty() && disk.is_some())
    }
}

/// The largest duration counted in an interval's histogram, 0 if none.
fn max_ms(s: &Snapshot) -> f64 {
    if s.count() == 0 {
        0.0
    } else {
        s.quantile_ms(1.0).unwrap_or(0.0)
    }
}

fn sum_ms(s: &Snapshot) -> f64 {
    s.total_us() as f64 / 1e3
}

/// One interval from two readings.
fn interval(at_ms: f64, len_ms: f64, st: &StagesSnapshot, k0: &Kernel, k1: &Kernel) -> Interval {
    let ms = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e6;
    let n = |i: usize| k1.disk[i].saturating_sub(k0.disk[i]);
    let us = |i: usize| k1.pressure[i].saturating_sub(k0.pressure[i]) as f64 / 1e3;
    Interval {
        at_ms,
        len_ms,
        acked: st.acked.count(),
        acked_max_ms: max_ms(&st.acked),
        queued_max_ms: max_ms(&st.queued),
        rounds: st.round.count(),
        round_ms: sum_ms(&st.round),
        round_max_ms: max_ms(&st.round),
        write_ms: sum_ms(&st.write),
        write_max_ms: max_ms(&st.write),
        round_wait_ms: sum_ms(&st.round_wait),
        answer_ms: sum_ms(&st.answer),
        slide_ms: sum_ms(&st.slide),
        writer_run_ms: ms(k0.writer.0, k1.writer.0),
        writer_runqueue_ms: ms(k0.writer.1, k1.writer.1),
        helpers_runqueue_ms: ms(k0.helpers_wait, k1.helpers_wait),
        steal_ms: k1.cpu_ticks.1.saturating_sub(k0.cpu_ticks.1) as f64 * 10.0,
        busy_ms: k1.cpu_ticks.0.saturating_sub(k0.cpu_ticks.0) as f64 * 10.0,
        process_ms: k1.process_ticks.saturating_sub(k0.process_ticks) as f64 * 10.0,
        cpu_pressure_ms: us(0),
        io_pressure_ms: us(1),
        memory_pressure_ms: us(2),
        disk_writes: n(0),
        disk_write_ms: n(1) as f64,
        disk_flushes: n(2),
        disk_flush_ms: n(3) as f64,
        disk_discards: n(4),
    }
}

/// A thread sampling a store every [`INTERVAL`] until [`Sampler::finish`].
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(Vec<Interval>, Vec<String>, bool)>,
}

impl Sampler {
    /// Starts sampling `store`, whose segments are on the disk holding
    /// `dir`.
    pub fn start(store: Arc<Store>, dir: &Path) -> Result<Sampler, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let sources = Sources {
            writer: named_threads(WRITER_COMM),
            helpers: named_threads(HELPER_COMM),
            dev: device_of(dir),
        };
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bench-stalls".into())
            .spawn(move || {
                let start = Instant::now();
                let mut out = Vec::new();
                let mut wchans = Vec::new();
                let mut st0 = store.stages();
                let (mut k0, mut found) = sources.read();
                let mut t0 = start;
                let mut next = start + INTERVAL;
                while !flag.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                    next += INTERVAL;
                    let st1 = store.stages();
                    let (k1, ok) = sources.read();
                    found &= ok;
                    wchans.push(sources.writer_wchan());
                    let t1 = Instant::now();
                    out.push(interval(
                        (t0 - start).as_secs_f64() * 1e3,
                        (t1 - t0).as_secs_f64() * 1e3,
                        &st1.since(&st0),
                        &k0,
                        &k1,
                    ));
                    (st0, k0, t0) = (st1, k1, t1);
                }
                (out, wchans, found)
            })
            .map_err(|e| format!("starting the stall sampler: {e}"))?;
        Ok(Sampler { stop, thread })
    }

    /// Stops sampling and reports.
    pub fn finish(self) -> Result<Timeline, String> {
        self.stop.store(true, Ordering::Relaxed);
        let (intervals, wchans, found) = self
            .thread
            .join()
            .map_err(|_| "the stall sampler panicked".to_string())?;
        Ok(Timeline::from_intervals(&intervals, &wchans, found))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(at: f64, ack_max: f64) -> Interval {
        Interval {
            at_ms: at,
            len_ms: 10.0,
            acked: 100,
            acked_max_ms: ack_max,
            ..Interval::default()
        }
    }

    #[test]
    fn a_stall_reaches_back_by_its_wait_and_overlapping_ones_merge() {
        let ivs = [
            iv(0.0, 1.0),
            iv(10.0, 5.0),
            iv(20.0, 9.0),
            iv(30.0, 1.5),
            iv(40.0, 4.5),
        ];
        let wchans = ["0", "wbt_wait", "wbt_wait", "x", "folio_wait"].map(String::from);
        let t = Timeline::from_intervals(&ivs, &wchans, true);
        assert_eq!(t.intervals, 5);
        assert_eq!(t.totals.acked, 500);
        assert_eq!(t.totals.acked_max_ms, 9.0);
        let eps: Vec<(f64, usize, f64, f64)> = t
            .episodes
            .iter()
            .map(|e| {
                (
                    e.totals.at_ms,
                    e.intervals,
                    e.totals.len_ms,
                    e.totals.acked_max_ms,
                )
            })
            .collect();
        // The second stall's window, [11, 30), joins the first's, [5, 20),
        // and both reach back into the calm first interval; the last one's,
        // [35.5, 50), reaches into the calm fourth.
        assert_eq!(eps, vec![(0.0, 3, 30.0, 9.0), (30.0, 2, 20.0, 4.5)]);
        assert_eq!(t.stall_ms(), 50.0);
        // Without stalls the total is a plain zero (a float sum of nothing
        // would be -0.0 in the JSON).
        let calm = Timeline::from_intervals(&[iv(0.0, 1.0)], &[], true);
        assert!(calm.episodes.is_empty());
        assert!(calm.stall_ms() == 0.0 && calm.stall_ms().is_sign_positive());
        let blocked: Vec<_> = t
            .episodes
            .iter()
            .map(|e| e.writer_blocked_in.clone())
            .collect();
        assert_eq!(
            blocked,
            vec![
                vec![("wbt_wait".to_string(), 2)],
                vec![("folio_wait".to_string(), 1), ("x".to_string(), 1)]
            ]
        );
    }

    #[test]
    fn causes_follow_the_documented_order() {
        let base = iv(0.0, 8.0);
        let with = |f: fn(&mut Interval)| {
            let mut x = base;
            f(&mut x);
            Episode::cause_of(&x)
        };
        assert_eq!(with(|_| {}), "unplaced");
        assert_eq!(with(|x| x.steal_ms = 10.0), "host steal");
        assert_eq!(
            with(|x| {
                x.memory_pressure_ms = 2.5;
                x.writer_runqueue_ms = 9.0
            }),
            "memory"
        );
        // Steal wins over a waiting writer, which wins over the device.
        assert_eq!(
            with(|x| {
                x.writer_runqueue_ms = 3.0;
                x.round_max_ms = 6.0
            }),
            "writer off CPU"
        );
        assert_eq!(with(|x| x.round_max_ms = 6.0), "slow round or write");
        assert_eq!(with(|x| x.disk_flush_ms = 2.5), "slow round or write");
        assert_eq!(with(|x| x.answer_ms = 5.0), "writer busy");
        // A slide happens inside a write: its time is counted once.
        assert_eq!(
            with(|x| {
                x.write_ms = 3.0;
                x.slide_ms = 3.0
            }),
            "unplaced"
        );
        assert_eq!(with(|x| x.write_ms = 4.0), "unplaced");
    }

    #[test]
    fn a_named_threads_times_grow_while_it_runs() {
        if !Path::new("/proc/self/task").exists() {
            return;
        }
        let (started, go) = std::sync::mpsc::channel();
        let spin = std::thread::Builder::new()
            .name("melddb-log-writer".into())
            .spawn(move || {
                started.send(()).unwrap();
                let t = Instant::now();
                let mut x = 0u64;
                while t.elapsed() < Duration::from_millis(60) {
                    x = x.wrapping_add(std::hint::black_box(1));
                }
                x
            })
            .unwrap();
        go.recv().unwrap();
        let threads = named_threads(WRITER_COMM);
        assert_eq!(threads.len(), 1, "the spinning thread is found by name");
        let (a, _) = thread_times(&threads);
        std::thread::sleep(Duration::from_millis(40));
        let (b, _) = thread_times(&threads);
        spin.join().unwrap();
        assert!(
            b > a,
            "run time read for the named thread did not grow: {a} then {b}"
        );
    }

    #[test]
    fn cpu_ticks_and_pressure_totals_are_read_from_their_fields() {
        let stat = "cpu  4743165 47 2020285 7580447 431674 3 179913 12133 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        assert_eq!(
            cpu_ticks(stat),
            (4743165 + 47 + 2020285 + 3 + 179913, 12133)
        );
        let psi = "some avg10=4.71 avg60=4.09 avg300=3.36 total=6384727852\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n";
        assert_eq!(pressure_some(psi), 6384727852);
        assert_eq!(pressure_some(""), 0);
        // A command name with a space and a parenthesis; utime 700, stime 55.
        let pstat = "4242 (bench (x) y) S 1 4242 4242 0 -1 4194560 3 0 0 0 700 55 0 0 20 0 30 0\n";
        assert_eq!(process_ticks(pstat), 755);
    }

    #[test]
    fn diskstats_values_are_read_from_their_columns() {
        // A line of this machine's /proc/diskstats (Linux 6.18), and one of
        // another device before it.
        let text = " 254       1 vda1 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n \
                    254       0 vda 14969586 68693 1141636882 22677231 152177872 3264912 \
                    20298085096 64655507 0 7616572 89312315 4151998 365 14225299928 \
                    1164059 23014014 815517\n";
        assert_eq!(
            disk_counts(text, (254, 0)),
            Some([152177872, 64655507, 23014014, 815517, 4151998])
        );
        assert_eq!(disk_counts(text, (8, 0)), None);
    }
}
