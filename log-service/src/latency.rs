//! Where an append's time goes: histograms of the stages it passes through
//! inside the service, so a latency seen by a client can be split into
//! waiting for the writer, writing, and waiting for the disk.
//!
//! Buckets are fixed and logarithmic (four per doubling from 1 µs to about
//! two minutes), counted with relaxed atomics: recording costs one
//! increment, and any thread can take a [`Snapshot`] while the writer
//! records. A quantile read from a snapshot is the upper bound of the
//! bucket it falls in, so it overstates by at most 19% (2^¼).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use serde::Serialize;

/// Buckets per doubling.
const PER_OCTAVE: u32 = 4;
/// Finite buckets: 1 µs · 2^(i/4) for i in 0..BUCKETS, up to 2^27 µs.
const BUCKETS: usize = 27 * PER_OCTAVE as usize + 1;

/// Upper bound of bucket `i`, in microseconds.
fn bound_us(i: usize) -> f64 {
    2f64.powf(i as f64 / PER_OCTAVE as f64)
}

/// The bucket a duration of `us` microseconds falls in (the last one
/// holds everything longer than the largest bound).
fn bucket(us: f64) -> usize {
    if us <= 1.0 {
        return 0;
    }
    let i = (us.log2() * PER_OCTAVE as f64).ceil() as usize;
    // Rounding can put a value exactly on a bound one bucket high.
    let i = if i > 0 && us <= bound_us(i - 1) {
        i - 1
    } else {
        i
    };
    i.min(BUCKETS)
}

/// A latency histogram (see the module docs).
pub struct Histogram {
    /// BUCKETS finite buckets, then one for longer durations.
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            counts: (0..=BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.snapshot();
        f.debug_struct("Histogram")
            .field("count", &s.count())
            .field("p50_ms", &s.quantile_ms(0.5))
            .field("p99_ms", &s.quantile_ms(0.99))
            .finish()
    }
}

impl Histogram {
    /// Counts one duration.
    pub fn record(&self, d: Duration) {
        self.record_n(d, 1);
    }

    /// Counts each of `durations`, a run of equal ones at a time: the
    /// appends of a client batch arrive together and are taken and
    /// answered together, so a batch of 64 costs one bucket lookup and
    /// two atomic adds instead of 64 of each on the writer thread.
    pub fn record_runs(&self, durations: impl IntoIterator<Item = Duration>) {
        let mut run: Option<(Duration, u64)> = None;
        for d in durations {
            run = match run {
                Some((same, n)) if same == d => Some((same, n + 1)),
                Some((other, n)) => {
                    self.record_n(other, n);
                    Some((d, 1))
                }
                None => Some((d, 1)),
            };
        }
        if let Some((d, n)) = run {
            self.record_n(d, n);
        }
    }

    /// Counts `n` appends that took `d` each.
    pub fn record_n(&self, d: Duration, n: u64) {
        let us = d.as_secs_f64() * 1e6;
        self.counts[bucket(us)].fetch_add(n, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns
            .fetch_add(ns.saturating_mul(n), Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

/// A histogram's counts at one moment; subtract an earlier one
/// ([`Snapshot::since`]) for an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    counts: Vec<u64>,
    sum_ns: u64,
}

impl Snapshot {
    /// What was counted between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            counts: self
                .counts
                .iter()
                .zip(earlier.counts.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
        }
    }

    /// Durations counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The durations counted, added up, in microseconds.
    pub fn total_us(&self) -> u64 {
        self.sum_ns / 1000
    }

    /// Mean duration in milliseconds (`None` if nothing was counted).
    pub fn mean_ms(&self) -> Option<f64> {
        let n = self.count();
        (n > 0).then(|| self.sum_ns as f64 / n as f64 / 1e6)
    }

    /// The `q` quantile (0 to 1) in milliseconds: the upper bound of the
    /// bucket it falls in (`None` if nothing was counted; infinity if it
    /// falls past the largest bound).
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(if i < BUCKETS {
                    bound_us(i) / 1e3
                } else {
                    f64::INFINITY
                });
            }
        }
        Some(f64::INFINITY)
    }

    /// Count, mean, p50, p90, p99, p99.9 and max in one record.
    pub fn summary(&self) -> Summary {
        let q = |p| self.quantile_ms(p).unwrap_or(0.0);
        Summary {
            count: self.count(),
            mean_ms: self.mean_ms().unwrap_or(0.0),
            p50_ms: q(0.5),
            p90_ms: q(0.9),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: q(1.0),
        }
    }
}

/// A histogram's figures, for JSON and tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Durations counted.
    pub count: u64,
    /// Their mean, in milliseconds.
    pub mean_ms: f64,
    /// Median (bucket upper bound), milliseconds.
    pub p50_ms: f64,
    /// 90th percentile (bucket upper bound), milliseconds.
    pub p90_ms: f64,
    /// 99th percentile (bucket upper bound), milliseconds.
    pub p99_ms: f64,
    /// 99.9th percentile (bucket upper bound), milliseconds.
    pub p999_ms: f64,
    /// The longest duration's bucket upper bound, milliseconds: a stall
    /// that a percentile over many short durations hides shows here.
    pub max_ms: f64,
}

/// Prometheus gets one bucket per doubling (every fourth bound), in
/// seconds, so a scrape stays short.
impl EncodeMetric for Snapshot {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let s = self;
        let mut buckets = Vec::with_capacity(BUCKETS / PER_OCTAVE as usize + 2);
        let mut acc = 0;
        for (i, c) in s.counts.iter().enumerate() {
            acc += c;
            let last = i == BUCKETS;
            if last || i % PER_OCTAVE as usize == 0 {
                let le = if last { f64::MAX } else { bound_us(i) / 1e6 };
                buckets.push((le, acc));
                acc = 0;
            }
        }
        encoder.encode_histogram::<NoLabelSet>(s.sum_ns as f64 / 1e9, s.count(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The stages of an append inside the service.
#[derive(Debug, Default)]
pub struct Stages {
    /// From the store accepting an append to the writer taking it into a
    /// batch (one count per append).
    pub queued: Histogram,
    /// The writer building and writing one group of appends: stripes,
    /// parity, pages and end-writes, without the fsyncs (one count per
    /// write; a batch written during a round may take several).
    pub write: Histogram,
    /// One fsync round: from starting it to the last of its files being
    /// synced (one count per round). Rounds run while the writer writes the
    /// next batch.
    pub round: Histogram,
    /// The writer blocked on an fsync round before answering its batch
    /// (one count per round answered): near zero when the round had ended
    /// already, the wait itself when the batch written meanwhile reached
    /// its size bound or a command needed every append answered.
    pub round_wait: Histogram,
    /// From the store accepting an append to its acknowledgement, once its
    /// round is on disk (one count per append).
    pub acked: Histogram,
    /// The writer answering a durable batch: indexing it, replying to
    /// every append and pushing it to subscribers (one count per batch
    /// answered; appends wait meanwhile).
    pub answer: Histogram,
    /// The writer sliding the segment windows when a segment fills:
    /// sealing below the base and creating and raising window segments,
    /// each change made durable before the writer goes on (one count per
    /// slide; appends wait meanwhile).
    pub slide: Histogram,
}

/// [`Stages`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagesSnapshot {
    /// See [`Stages::queued`].
    pub queued: Snapshot,
    /// See [`Stages::write`].
    pub write: Snapshot,
    /// See [`Stages::round`].
    pub round: Snapshot,
    /// See [`Stages::round_wait`].
    pub round_wait: Snapshot,
    /// See [`Stages::acked`].
    pub acked: Snapshot,
    /// See [`Stages::answer`].
    pub answer: Snapshot,
    /// See [`Stages::slide`].
    pub slide: Snapshot,
}

impl Stages {
    /// The counts so far.
    pub fn snapshot(&self) -> StagesSnapshot {
        StagesSnapshot {
            queued: self.queued.snapshot(),
            write: self.write.snapshot(),
            round: self.round.snapshot(),
            round_wait: self.round_wait.snapshot(),
            acked: self.acked.snapshot(),
            answer: self.answer.snapshot(),
            slide: self.slide.snapshot(),
        }
    }
}

/// [`StagesSnapshot`] as figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StagesSummary {
    /// See [`Stages::queued`].
    pub queued: Summary,
    /// See [`Stages::write`].
    pub write: Summary,
    /// See [`Stages::round`].
    pub round: Summary,
    /// See [`Stages::round_wait`].
    pub round_wait: Summary,
    /// See [`Stages::acked`].
    pub acked: Summary,
    /// See [`Stages::answer`].
    pub answer: Summary,
    /// See [`Stages::slide`].
    pub slide: Summary,
}

/// What names a stage where it is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageInfo {
    /// Short name (JSON keys).
    pub key: &'static str,
    /// Table label, with what is counted.
    pub label: &'static str,
    /// OpenMetrics name, after the `melddb_log_` prefix.
    pub metric: &'static str,
    /// OpenMetrics help text.
    pub help: &'static str,
}

/// Every stage, in the order an append passes through them (the field
/// order of [`Stages`]): the one list tables, JSON keys and metrics are
/// made from.
pub const STAGE_INFO: [StageInfo; 7] = [
    StageInfo {
        key: "queued",
        label: "queued (accepted -> taken by the writer)",
        metric: "append_queued_seconds",
        help: "Time from the store accepting an append to the writer taking it into a batch",
    },
    StageInfo {
        key: "write",
        label: "write (no fsync), per write",
        metric: "batch_write_seconds",
        help: "Time the writer took to build and write one group of appends, without fsyncs",
    },
    StageInfo {
        key: "round",
        label: "fsync round, per round",
        metric: "fsync_round_seconds",
        help: "Time one fsync round took, from its start to its last file synced",
    },
    StageInfo {
        key: "round_wait",
        label: "writer blocked on a round, per round",
        metric: "round_wait_seconds",
        help: "Time the writer was blocked on an fsync round before answering its batch",
    },
    StageInfo {
        key: "acked",
        label: "acknowledged (accepted -> durable)",
        metric: "append_acked_seconds",
        help: "Time from the store accepting an append to its acknowledgement (durable)",
    },
    StageInfo {
        key: "answer",
        label: "answering a durable batch, per batch",
        metric: "batch_answer_seconds",
        help: "Time the writer took to index a durable batch, reply to its appends and push it to subscribers",
    },
    StageInfo {
        key: "slide",
        label: "window slide (segment filled), per slide",
        metric: "window_slide_seconds",
        help: "Time the writer spent sliding the segment windows when a segment filled (appends wait meanwhile)",
    },
];

/// Pairs each stage's [`StageInfo`] with its figures, in field order.
fn with_info<T: Copy>(fields: [T; 7]) -> [(&'static StageInfo, T); 7] {
    std::array::from_fn(|i| (&STAGE_INFO[i], fields[i]))
}

impl StagesSummary {
    /// Every stage with its names and figures (see [`STAGE_INFO`]).
    pub fn rows(&self) -> [(&'static StageInfo, &Summary); 7] {
        with_info([
            &self.queued,
            &self.write,
            &self.round,
            &self.round_wait,
            &self.acked,
            &self.answer,
            &self.slide,
        ])
    }
}

impl StagesSnapshot {
    /// Every stage with its names and counts (see [`STAGE_INFO`]).
    pub fn rows(&self) -> [(&'static StageInfo, &Snapshot); 7] {
        with_info([
            &self.queued,
            &self.write,
            &self.round,
            &self.round_wait,
            &self.acked,
            &self.answer,
            &self.slide,
        ])
    }

    /// What was counted between `earlier` and this snapshot.
    pub fn since(&self, earlier: &StagesSnapshot) -> StagesSnapshot {
        StagesSnapshot {
            queued: self.queued.since(&earlier.queued),
            write: self.write.since(&earlier.write),
            round: self.round.since(&earlier.round),
            round_wait: self.round_wait.since(&earlier.round_wait),
            acked: self.acked.since(&earlier.acked),
            answer: self.answer.since(&earlier.answer),
            slide: self.slide.since(&earlier.slide),
        }
    }

    /// The figures of every stage.
    pub fn summary(&self) -> StagesSummary {
        StagesSummary {
            queued: self.queued.summary(),
            write: self.write.summary(),
            round: self.round.summary(),
            round_wait: self.round_wait.summary(),
            acked: self.acked.summary(),
            answer: self.answer.summary(),
            slide: self.slide.summary(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Recording runs at once counts exactly what recording each
        /// duration alone does.
        #[test]
        fn runs_count_as_their_durations_one_by_one(runs in prop::collection::vec((0u64..5_000_000, 1usize..6), 0..40)) {
            let durations: Vec<Duration> = runs
                .iter()
                .flat_map(|&(ns, n)| std::iter::repeat_n(Duration::from_nanos(ns), n))
                .collect();
            let (each, at_once) = (Histogram::default(), Histogram::default());
            for &d in &durations {
                each.record(d);
            }
            at_once.record_runs(durations.iter().copied());
            prop_assert_eq!(each.snapshot(), at_once.snapshot());
        }
    }

    #[test]
    fn buckets_hold_their_bounds() {
        for i in 0..BUCKETS {
            let b = bound_us(i);
            assert_eq!(bucket(b), i, "bound {b} µs");
            if i + 1 < BUCKETS {
                assert_eq!(bucket(b * 1.0001), i + 1, "just above {b} µs");
            }
        }
        assert_eq!(bucket(0.0), 0);
        assert_eq!(bucket(1e12), BUCKETS);
    }

    proptest! {
        /// Every quantile read from the histogram is within one bucket
        /// (19%) above the exact quantile of the same durations, never
        /// below it.
        #[test]
        fn quantiles_bound_the_exact_ones(
            mut us in proptest::collection::vec(1u64..5_000_000, 1..400),
            q in 0.0f64..1.0,
        ) {
            let h = Histogram::default();
            for &u in &us {
                h.record(Duration::from_micros(u));
            }
            us.sort_unstable();
            let rank = ((q * us.len() as f64).ceil() as usize).max(1);
            let exact_ms = us[rank - 1] as f64 / 1e3;
            let got = h.snapshot().quantile_ms(q).unwrap();
            prop_assert!(got >= exact_ms * 0.999_999, "{got} below {exact_ms}");
            prop_assert!(got <= exact_ms * 2f64.powf(0.25) * 1.000_001, "{got} too far above {exact_ms}");
            let mean = us.iter().sum::<u64>() as f64 / us.len() as f64 / 1e3;
            let m = h.snapshot().mean_ms().unwrap();
            prop_assert!((m - mean).abs() <= mean * 1e-9 + 1e-9);
        }
    }

    #[test]
    fn since_counts_only_the_interval() {
        let h = Histogram::default();
        h.record_n(Duration::from_millis(50), 100);
        let before = h.snapshot();
        h.record_n(Duration::from_micros(300), 10);
        let d = h.snapshot().since(&before);
        assert_eq!(d.count(), 10);
        let p99 = d.quantile_ms(0.99).unwrap();
        assert!((0.3..0.36).contains(&p99), "{p99}");
        assert_eq!(Snapshot::since(&before, &before).count(), 0);
        assert_eq!(before.since(&before).quantile_ms(0.5), None);
    }

    /// One long stall among many short durations moves neither the p99
    /// nor the p99.9 but sets the max, which is what the summary's last
    /// two columns are for.
    #[test]
    fn the_summary_shows_a_single_stall_in_its_max() {
        let h = Histogram::default();
        h.record_n(Duration::from_micros(250), 9_999);
        h.record(Duration::from_millis(40));
        let s = h.snapshot().summary();
        assert_eq!(s.count, 10_000);
        assert!((0.25..0.3).contains(&s.p99_ms), "{s:?}");
        assert!((0.25..0.3).contains(&s.p999_ms), "{s:?}");
        assert!((40.0..48.0).contains(&s.max_ms), "{s:?}");
        // Eleven stalls are more than a thousandth: the p99.9 shows them.
        h.record_n(Duration::from_millis(40), 10);
        let s = h.snapshot().summary();
        assert!((40.0..48.0).contains(&s.p999_ms), "{s:?}");
        assert_eq!(Histogram::default().snapshot().summary().max_ms, 0.0);
    }

    #[test]
    fn prometheus_buckets_are_cumulative_and_complete() {
        let h = Histogram::default();
        h.record(Duration::from_micros(3));
        h.record(Duration::from_millis(7));
        h.record(Duration::from_secs(1000));
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register("stage", "test", h.snapshot());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(out.contains("stage_count 3"), "{out}");
        assert!(out.contains("stage_bucket{le=\"+Inf\"} 3"), "{out}");
        // 3 µs is under the 4 µs bound; 7 ms under 8.192 ms.
        assert!(out.contains("stage_bucket{le=\"0.000004\"} 1"), "{out}");
        assert!(out.contains("stage_bucket{le=\"0.008192\"} 2"), "{out}");
        // The sum is in seconds, like the bounds.
        let sum: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("stage_sum "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no stage_sum in {out}"));
        assert!((sum - 1_000.007_003).abs() < 1e-9, "{sum} in {out}");
    }

    /// The finite buckets end at 2^27 µs (about 134 s), as the module
    /// says: a duration on that bound still reads as a finite quantile,
    /// anything longer as infinity.
    #[test]
    fn the_last_finite_bound_is_two_to_the_27_microseconds() {
        let top = Duration::from_micros(1 << 27);
        let h = Histogram::default();
        h.record(top);
        let top_ms = (1u64 << 27) as f64 / 1e3;
        assert_eq!(h.snapshot().quantile_ms(1.0), Some(top_ms));
        h.record(top * 2);
        assert_eq!(h.snapshot().quantile_ms(0.5), Some(top_ms));
        assert_eq!(h.snapshot().quantile_ms(1.0), Some(f64::INFINITY));
        assert_eq!(h.snapshot().summary().max_ms, f64::INFINITY);
    }

    /// Totals are whole microseconds of the exact sum, the mean is the
    /// sum over the count, and an empty histogram has no mean.
    #[test]
    fn totals_and_means_are_exact_and_an_empty_one_has_no_mean() {
        let h = Histogram::default();
        assert_eq!(h.snapshot().mean_ms(), None);
        assert_eq!(h.snapshot().total_us(), 0);
        h.record_n(Duration::from_micros(1_500), 3);
        h.record(Duration::from_nanos(2_500));
        let s = h.snapshot();
        // 4,502,500 ns, cut to whole microseconds.
        assert_eq!(s.total_us(), 4_502);
        let mean = s.mean_ms().unwrap();
        assert!((mean - 1.125_625).abs() < 1e-12, "{mean}");
        assert_eq!(
            format!("{h:?}"),
            format!(
                "Histogram {{ count: 4, p50_ms: {:?}, p99_ms: {:?} }}",
                s.quantile_ms(0.5),
                s.quantile_ms(0.99)
            )
        );
    }
}
