//! What a store reports about itself: how it opened, and its counters.

use serde::Serialize;

/// How a store opened: what recovery found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecoveryReport {
    /// Segment files found.
    pub segments: usize,
    /// Bytes of data in them (pages, not the zero-filled space after).
    pub bytes: u64,
    /// Bytes recovery read from them: page headers, end-write and marker
    /// pages, each segment's last page, and the zero-filled tails of
    /// segments still open for writing. Page bodies are not read, so this
    /// grows with the number of pages and the window, not the log's size.
    pub bytes_read: u64,
    /// End-write records read (all copies).
    pub end_writes: u64,
    /// Complete stripes indexed.
    pub stripes: u64,
    /// Records indexed.
    pub records: u64,
    /// Torn tails cut off (bytes).
    pub torn_bytes: u64,
    /// Pages whose CRC failed during the scan (other copies or parity used).
    pub corrupt_pages: u64,
    /// Stripes dropped because an earlier stripe of their batch never
    /// completed (none of them had been acknowledged).
    pub dropped_stripes: u64,
    /// Segment files rebuilt from parity and the other end-write copies.
    pub repaired_segments: Vec<u64>,
    /// Wall time in milliseconds.
    pub millis: u64,
}

/// Counters at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// Acknowledged appends since open.
    pub appends: u64,
    /// Their bytes.
    pub append_bytes: u64,
    /// Writer batches.
    pub batches: u64,
    /// Stripes written.
    pub stripes: u64,
    /// Bytes written to segments (pages, parity, end-writes).
    pub bytes_written: u64,
    /// fsync calls (`fdatasync` of segment files, the round-ending
    /// flushes included).
    pub fsyncs: u64,
    /// Segment files a round wrote back without an fsync of their own,
    /// made durable by the round's device flush instead
    /// (`flush_once_per_device`).
    pub write_backs: u64,
    /// Device cache flushes that ended rounds with write-back files (one
    /// per device per such round; also counted in `fsyncs`).
    pub flushes: u64,
    /// fsync rounds the writer ran itself instead of the helpers (rounds
    /// of batches within `writer_round_max_bytes`).
    pub rounds_on_writer: u64,
    /// Bytes of `bytes_written` written with `O_DIRECT` by the fsync
    /// helpers (`direct_writes`), not copied into the page cache.
    pub direct_write_bytes: u64,
    /// Microseconds the writer spent building and writing batches (stripes,
    /// parity, pages, end-writes), without the fsyncs: the total of the
    /// write stage.
    pub write_us: u64,
    /// Microseconds the writer was blocked on fsync rounds: the total of
    /// the round-wait stage.
    pub sync_us: u64,
    /// Record reads.
    pub reads: u64,
    /// Reads answered from whole stripes (page checksums, parity) rather
    /// than from the record's bytes alone: every read of a record that
    /// spans several stripes, and any read whose record bytes failed the
    /// record's checksum. Growing on records that fit one stripe means
    /// damaged pages: run a scrub.
    pub reads_whole_stripe: u64,
    /// Pages rebuilt from parity on read.
    pub pages_rebuilt: u64,
    /// Segment files rebuilt.
    pub segments_repaired: u64,
    /// Batches whose writes failed (not acknowledged).
    pub write_failures: u64,
    /// Segment files freed by trim.
    pub segments_freed: u64,
    /// Spare segment files written (`prepared_segments`) since open.
    pub segments_prepared: u64,
    /// Spare segment files ready now, all zones together.
    pub spares_ready: u64,
    /// Spares whose writing failed since open (a full disk, most likely,
    /// or one under the spares' free-space rule); the refill tries again
    /// every 10 s. A count that keeps growing means the pool will not
    /// fill: free space, or lower `prepared_segments`.
    pub spares_failed: u64,
    /// Whether acknowledged appends were synced to the disk first
    /// (`fsync`); `false` means they survive a crash of the process, not
    /// of the machine.
    pub durable: bool,
    /// Whether transparent huge pages are off for this process
    /// (`disable_transparent_huge_pages`, or whoever started it).
    pub thp_disabled: bool,
    /// The I/O scheduler of each block device under the zones and
    /// devices, read at open (empty where the OS does not show one).
    pub io_schedulers: Vec<crate::blockdev::DeviceScheduler>,
    /// Segment files now.
    pub segments: u64,
    /// Where appends spent their time since open (see
    /// [`crate::latency::Stages`]).
    pub stages: crate::latency::StagesSummary,
    /// The logs: name, first, tail.
    pub logs: Vec<(String, u64, u64)>,
}
