//! Service configuration: failure zones, segment geometry, parity, limits
//! and tokens. Read from TOML by `melddb-log serve --config FILE`; every
//! field but `zones` has a default.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// Number of segments that hold each end-write record (§2.1 of the Hyder
/// log paper: three copies).
pub const END_WRITE_COPIES: usize = 3;

/// Most spare segments per zone `prepared_segments` may ask for.
pub const MAX_PREPARED_SEGMENTS: u32 = 64;

/// Largest page header plus shard the service accepts, whatever the config.
pub const MAX_PAGE_BYTES: u32 = 16 << 20;

/// The whole service configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// One directory per failure zone. Segment `s` lives in zone
    /// `s % zones.len()`, so any `zones.len()` consecutive segments are in
    /// different zones.
    pub zones: Vec<PathBuf>,
    /// Raw devices, one per zone in the order of `zones` (empty, the
    /// default: segments are files in the zone directories). Each is a
    /// block device or a fixed-size file standing in for one, cut into
    /// slots of `segment_bytes` plus headers; zone `z`'s segments live in
    /// slots of device `z`, and its directory keeps only the metadata,
    /// lock and reserve files. A device is labelled at its first open if its first 4 KiB
    /// are zeros, and refused if they are anything but its own label
    /// (docs/log-service.md, "Raw devices").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<PathBuf>,
    /// Data pages per stripe (Reed-Solomon data shards).
    #[serde(default = "defaults::data_shards")]
    pub data_shards: usize,
    /// Parity pages per stripe; any `parity_shards` lost or corrupt pages
    /// of a stripe are rebuilt.
    #[serde(default = "defaults::parity_shards")]
    pub parity_shards: usize,
    /// Largest page (header + shard) in bytes. A stripe carries at most
    /// `data_shards * (page_bytes - header)` bytes; larger records span
    /// several stripes.
    #[serde(default = "defaults::page_bytes")]
    pub page_bytes: u32,
    /// Size at which a segment is considered full and the windows slide.
    #[serde(default = "defaults::segment_bytes")]
    pub segment_bytes: u64,
    /// Most segment files that may exist at once (trim frees them).
    #[serde(default = "defaults::max_segments")]
    pub max_segments: u64,
    /// fsync data and end-write segments before acknowledging (default
    /// true). Turning it off keeps acknowledged appends only across a
    /// process crash, not a power loss. No round of appends or window
    /// slide waits for the disk then (a slide's new directory entries
    /// are still synced, as trim and repair sync theirs), and the open
    /// logs a warning saying so.
    #[serde(default = "defaults::fsync")]
    pub fsync: bool,
    /// Spare segment files kept ready per zone: segment-sized files
    /// written full of zeros, which a new window segment is renamed from,
    /// so its pages overwrite allocated, written blocks and the fsync
    /// rounds have no block allocation or size change to journal. The
    /// default, 4, costs up to `zones x 4 x segment_bytes` of disk (1 GiB
    /// per zone with the default 256 MiB segments); a spare file is made
    /// only while a twentieth of its file system, and at least two
    /// segments, stay free after it. 0 creates segment files empty. A new
    /// store's open writes the spares its first windows take (at most
    /// this many per zone); every other spare is written by a background
    /// thread, while no append has been written for 250 ms, at most
    /// `tuning.prepare_mib_s`; `spares_ready` in the stats counts them.
    /// Every byte of a segment made from a spare is written twice, once
    /// as a zero.
    #[serde(default = "defaults::prepared_segments")]
    pub prepared_segments: u32,
    /// Largest single record accepted.
    #[serde(default = "defaults::max_record_bytes")]
    pub max_record_bytes: u32,
    /// How many recent (client, request) ids are remembered for idempotent
    /// appends.
    #[serde(default = "defaults::dedup_window")]
    pub dedup_window: usize,
    /// Decoded stripes kept in memory for reads (0 turns the cache off).
    #[serde(default = "defaults::read_cache_stripes")]
    pub read_cache_stripes: usize,
    /// Network limits.
    #[serde(default)]
    pub limits: Limits,
    /// Listen addresses.
    #[serde(default)]
    pub listen: Listen,
    /// Bearer tokens and their rights. Empty means no authentication
    /// (only sensible on loopback).
    #[serde(default)]
    pub tokens: BTreeMap<String, Rights>,
    /// How the writer does its I/O: options that change speed, never the
    /// bytes on disk or what is acknowledged.
    #[serde(default)]
    pub tuning: Tuning,
}

/// The `[tuning]` table: how appends reach the disk. None of these
/// changes the on-disk format, so each can change between restarts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tuning {
    /// End each fsync round with one device cache flush per device
    /// instead of one per file, where that is sound (the default). A file
    /// whose round wrote only over blocks that are already allocated,
    /// written and committed (a segment made from a spare, see
    /// `prepared_segments`) has nothing for the file system to journal:
    /// its pages are written back (`sync_file_range`), and once every file
    /// of the round is written, one `fdatasync` per device flushes the
    /// device's cache for all of them. Other files are fsynced. Only on
    /// ext4 and XFS zones (Linux), whose `fdatasync` of a clean file still
    /// flushes the device; elsewhere every file is fsynced. Measured at
    /// 150K appends/s it took the median round from 0.30-0.43 to
    /// 0.26-0.30 ms (docs/benchmarks.md).
    #[serde(default = "defaults::flush_once_per_device")]
    pub flush_once_per_device: bool,
    /// Write the whole 4 KiB blocks of each large batch (at least
    /// `direct_write_min_bytes` per segment) with `O_DIRECT` on the fsync
    /// helpers, during the batch's round, instead of copying them into the
    /// page cache on the writer thread (Linux). Off by default: it frees
    /// the writer from copying, which helps 64 KiB records, but each
    /// direct write waits for the device inside the round, which costs
    /// smaller records more than it saves (docs/log-service.md). Where a
    /// file system refuses `O_DIRECT` (tmpfs), the writes are buffered.
    #[serde(default = "defaults::direct_writes")]
    pub direct_writes: bool,
    /// The smallest write of one segment's pages written directly
    /// (default 256 KiB). Smaller writes are copied into the page cache
    /// and their write-back started at once, which suits small batches
    /// better. Any size takes effect; only whole 4 KiB blocks are ever
    /// written directly. Keep it large: at 4 KiB, batches of 1 KiB
    /// records took rounds about four times as long.
    #[serde(default = "defaults::direct_write_min_bytes")]
    pub direct_write_min_bytes: u32,
    /// Rate limit of the background writing of spares, MiB/s (0: no
    /// limit).
    #[serde(default = "defaults::prepare_mib_s")]
    pub prepare_mib_s: u32,
    /// A round whose batch carries at most this many payload bytes, and
    /// whose files are all only written back (segments made from spares,
    /// `flush_once_per_device`), runs on the writer thread itself instead
    /// of the fsync helpers: handing it out costs a wake-up per file and
    /// one back, which on a small machine costs more CPU than the round's
    /// own I/O (docs/log-service.md, "How a batch becomes durable").
    /// Larger rounds go to the helpers, whose files' write-backs overlap
    /// while the writer writes the next batch, and so do rounds with
    /// direct writes held back for them. 0 sends every round to the
    /// helpers; the default is 256 KiB.
    #[serde(default = "defaults::writer_round_max_bytes")]
    pub writer_round_max_bytes: u64,
    /// Write a stripe's end-write only after its pages are fsynced (the
    /// paper's order: two fsync rounds per batch). The default writes pages
    /// and end-writes in one round and has recovery verify every page of
    /// the last batch instead, dropping the batch if a stripe of it cannot
    /// be read (none of it was acknowledged).
    #[serde(default)]
    pub strict_end_writes: bool,
    /// Turn transparent huge pages off for the whole process when the
    /// store opens (`prctl(PR_SET_THP_DISABLE)`, Linux). Off by default:
    /// it is a process-wide setting, which a library leaves to the program
    /// that embeds it. A dedicated service (`melddb-log serve`) may turn it
    /// on: with THP the index's growth meets a 2 MiB page fault a few
    /// times a second, each holding the writer for milliseconds
    /// (docs/benchmarks.md, "Tuning options: measured verdicts").
    /// `thp_disabled` in the stats says whether THP is off for the process.
    #[serde(default)]
    pub disable_transparent_huge_pages: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            flush_once_per_device: defaults::flush_once_per_device(),
            direct_writes: defaults::direct_writes(),
            direct_write_min_bytes: defaults::direct_write_min_bytes(),
            prepare_mib_s: defaults::prepare_mib_s(),
            writer_round_max_bytes: defaults::writer_round_max_bytes(),
            strict_end_writes: false,
            disable_transparent_huge_pages: false,
        }
    }
}

/// Top-level keys that moved into `[tuning]`.
const MOVED_TO_TUNING: [&str; 7] = [
    "flush_once_per_device",
    "direct_writes",
    "direct_write_min_bytes",
    "prepare_mib_s",
    "writer_round_max_bytes",
    "strict_end_writes",
    "disable_transparent_huge_pages",
];

/// Keys the service no longer has (top level or in `[tuning]`), each
/// with what to do instead.
const REMOVED: [(&str, &str); 5] = [
    (
        "zero_fill_ahead",
        "delete it; spare segments (prepared_segments) give segments zeroed space",
    ),
    (
        "direct_every_block",
        "delete it; use tuning.direct_writes for large batches",
    ),
    (
        "slice_us",
        "delete it; the threads keep the system's time slice",
    ),
    (
        "writer_cpu",
        "delete it; place the process with taskset or cgroups if it needs CPUs of its own",
    ),
    (
        "realtime_priority",
        "delete it; give the process a priority with chrt if it needs one",
    ),
];

/// Refuses a configuration that uses a removed key, or a moved one where
/// it was, with what to do: serde's own error would only list the keys
/// it knows.
fn refuse_old_keys(table: &toml::Table) -> Result<(), ConfigError> {
    let tuning = table.get("tuning").and_then(toml::Value::as_table);
    for (key, instead) in REMOVED {
        let found = if table.contains_key(key) {
            Some(key.to_string())
        } else if tuning.is_some_and(|t| t.contains_key(key)) {
            Some(format!("tuning.{key}"))
        } else {
            None
        };
        if let Some(found) = found {
            return Err(ConfigError::Invalid(format!(
                "`{found}` is no longer an option: {instead}"
            )));
        }
    }
    for key in MOVED_TO_TUNING {
        if table.contains_key(key) {
            return Err(ConfigError::Invalid(format!(
                "`{key}` moved to the [tuning] table: write it as `{key} = ...` under `[tuning]` (after the top-level keys)"
            )));
        }
    }
    Ok(())
}

/// The largest `segment_bytes` (1 TiB).
pub const MAX_SEGMENT_BYTES: u64 = 1 << 40;

/// The most `limits.max_connections`, `limits.max_in_flight`,
/// `limits.append_queue` and `read_cache_stripes` may be (2^20).
pub const MAX_COUNT_LIMIT: usize = 1 << 20;

/// Network limits; every one is checked before memory is committed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest frame (binary protocol and WebSocket) in bytes.
    #[serde(default = "defaults::max_frame_bytes")]
    pub max_frame_bytes: u32,
    /// Most open client connections; more are refused.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// Most requests one connection may have in flight; the server stops
    /// reading from a connection that reaches it (back-pressure).
    #[serde(default = "defaults::max_in_flight")]
    pub max_in_flight: usize,
    /// Appends queued for the storage writer across all connections.
    #[serde(default = "defaults::append_queue")]
    pub append_queue: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: defaults::max_frame_bytes(),
            max_connections: defaults::max_connections(),
            max_in_flight: defaults::max_in_flight(),
            append_queue: defaults::append_queue(),
        }
    }
}

/// Where the service listens. Both default to loopback.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listen {
    /// Binary protocol over TCP.
    #[serde(default = "defaults::tcp")]
    pub tcp: String,
    /// HTTP: health, metrics, JSON append/read/tail and the WebSocket.
    #[serde(default = "defaults::http")]
    pub http: String,
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            tcp: defaults::tcp(),
            http: defaults::http(),
        }
    }
}

/// What one bearer token may do.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Rights {
    /// Log names the token may use; `"*"` means all.
    pub logs: Vec<String>,
    /// May read, tail and subscribe.
    #[serde(default)]
    pub read: bool,
    /// May append and trim.
    #[serde(default)]
    pub append: bool,
}

impl Rights {
    /// Whether these rights cover `log`.
    pub fn covers(&self, log: &str) -> bool {
        self.logs.iter().any(|l| l == "*" || l == log)
    }
}

mod defaults {
    pub fn data_shards() -> usize {
        2
    }
    pub fn parity_shards() -> usize {
        1
    }
    pub fn page_bytes() -> u32 {
        128 << 10
    }
    pub fn segment_bytes() -> u64 {
        256 << 20
    }
    pub fn max_segments() -> u64 {
        4096
    }
    pub fn prepared_segments() -> u32 {
        4
    }
    pub fn prepare_mib_s() -> u32 {
        64
    }
    pub fn fsync() -> bool {
        true
    }
    pub fn writer_round_max_bytes() -> u64 {
        256 << 10
    }
    pub fn flush_once_per_device() -> bool {
        true
    }
    pub fn direct_writes() -> bool {
        false
    }
    pub fn direct_write_min_bytes() -> u32 {
        256 << 10
    }
    pub fn max_record_bytes() -> u32 {
        64 << 20
    }
    pub fn read_cache_stripes() -> usize {
        128
    }
    pub fn dedup_window() -> usize {
        1 << 20
    }
    pub fn max_frame_bytes() -> u32 {
        (64 << 20) + 4096
    }
    pub fn max_connections() -> usize {
        1024
    }
    pub fn max_in_flight() -> usize {
        256
    }
    pub fn append_queue() -> usize {
        16384
    }
    pub fn tcp() -> String {
        "127.0.0.1:7431".into()
    }
    pub fn http() -> String {
        "127.0.0.1:7432".into()
    }
}

impl Config {
    /// A configuration with defaults for everything but the zones.
    pub fn with_zones(zones: Vec<PathBuf>) -> Config {
        Config {
            zones,
            devices: Vec::new(),
            data_shards: defaults::data_shards(),
            parity_shards: defaults::parity_shards(),
            page_bytes: defaults::page_bytes(),
            segment_bytes: defaults::segment_bytes(),
            max_segments: defaults::max_segments(),
            fsync: defaults::fsync(),
            prepared_segments: defaults::prepared_segments(),
            max_record_bytes: defaults::max_record_bytes(),
            dedup_window: defaults::dedup_window(),
            read_cache_stripes: defaults::read_cache_stripes(),
            limits: Limits::default(),
            listen: Listen::default(),
            tokens: BTreeMap::new(),
            tuning: Tuning::default(),
        }
    }

    /// Parses and validates a TOML configuration. A key that was removed,
    /// or moved into `[tuning]`, is refused with what to do instead.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        refuse_old_keys(&table)?;
        let config: Config = table
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Segments in the writer's windows together: the end-write copies,
    /// the data window and the next one.
    pub fn window_segments(&self) -> u64 {
        END_WRITE_COPIES as u64 + 2 * self.stripe_width() as u64
    }

    /// Pages per stripe.
    pub fn stripe_width(&self) -> usize {
        // Saturating: validation refuses widths over 255, and must not
        // overflow on the way.
        self.data_shards.saturating_add(self.parity_shards)
    }

    /// Checks the geometry: stripes and end-write copies must fall in
    /// different zones, pages must fit segments, parity must exist.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |why: String| Err(ConfigError::Invalid(why));
        if self.data_shards == 0 || self.parity_shards == 0 {
            return bad("data_shards and parity_shards must both be at least 1 (parity is what rebuilds a lost page)".into());
        }
        if self.stripe_width() > 255 {
            return bad("data_shards + parity_shards must be at most 255".into());
        }
        let need = self.stripe_width().max(END_WRITE_COPIES);
        if self.zones.len() < need {
            return bad(format!(
                "{} zones configured but a stripe of {} pages and {} end-write copies need at least {} zones, one page per zone",
                self.zones.len(),
                self.stripe_width(),
                END_WRITE_COPIES,
                need
            ));
        }
        if self.page_bytes < 4096 || self.page_bytes > MAX_PAGE_BYTES {
            return bad(format!(
                "page_bytes must be between 4096 and {MAX_PAGE_BYTES}"
            ));
        }
        if self.segment_bytes < 4 * self.page_bytes as u64 {
            return bad("segment_bytes must hold at least four pages".into());
        }
        if self.segment_bytes > MAX_SEGMENT_BYTES {
            // A typo here would have the open write spare segments of
            // zeros until the disk is full.
            return bad(format!(
                "segment_bytes must be at most {MAX_SEGMENT_BYTES} (1 TiB)"
            ));
        }
        let window = (END_WRITE_COPIES + 2 * self.stripe_width()) as u64;
        if self.max_segments < window + 1 {
            return bad(format!(
                "max_segments must exceed the {window} segments the three windows occupy"
            ));
        }
        if !self.devices.is_empty() {
            if self.devices.len() != self.zones.len() {
                return bad(format!(
                    "{} devices configured for {} zones: give one device per zone, in the order of zones",
                    self.devices.len(),
                    self.zones.len()
                ));
            }
            let distinct: std::collections::BTreeSet<_> = self.devices.iter().collect();
            if distinct.len() != self.devices.len() {
                return bad(
                    "every zone needs its own device: a path appears twice in devices".into(),
                );
            }
            if self.segment_bytes % 4096 != 0 {
                return bad(
                    "segment_bytes must be a multiple of 4096 on devices (slots are block-aligned)"
                        .into(),
                );
            }
        }
        if self.prepared_segments > MAX_PREPARED_SEGMENTS {
            return bad(format!(
                "prepared_segments must be at most {MAX_PREPARED_SEGMENTS} per zone"
            ));
        }
        if self.max_record_bytes == 0
            || self.max_record_bytes as usize > melddb::error::MAX_INTENTION_BYTES
        {
            return bad(format!(
                "max_record_bytes must be between 1 and {}",
                melddb::error::MAX_INTENTION_BYTES
            ));
        }
        // A record bigger than a stripe keeps its last quarter-stripe in the
        // root and lists its fragment stripes there: the list must fit too.
        let cap = self.data_shards as u64 * (self.page_bytes as u64 - crate::page::HEADER as u64);
        let frags = (self.max_record_bytes as u64).div_ceil(cap);
        if frags * 8 + 128 + cap / 4 > cap {
            return bad(format!(
                "max_record_bytes {} needs {frags} stripes of {cap} bytes, more than one root stripe can list; raise page_bytes or data_shards, or lower max_record_bytes",
                self.max_record_bytes
            ));
        }
        if self.limits.max_frame_bytes < 64 {
            return bad("limits.max_frame_bytes must be at least 64".into());
        }
        for (name, n) in [
            ("limits.max_connections", self.limits.max_connections),
            ("limits.max_in_flight", self.limits.max_in_flight),
            ("limits.append_queue", self.limits.append_queue),
            ("read_cache_stripes", self.read_cache_stripes),
        ] {
            // Each sizes a semaphore, a queue or a table at the open; the
            // bound keeps a typo from aborting the service there.
            if n > MAX_COUNT_LIMIT {
                return bad(format!("{name} must be at most {MAX_COUNT_LIMIT}"));
            }
        }
        if self.limits.max_in_flight == 0
            || self.limits.max_connections == 0
            || self.limits.append_queue == 0
        {
            return bad("limits must be positive".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
