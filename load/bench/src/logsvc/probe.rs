//! One load point on a fresh service (`log --point`), with what the
//! service did during it.

use std::time::Instant;

use melddb_log::latency::StagesSummary;
use serde::Serialize;

use super::load::{run_point, PointSpec};
use super::service::{start_prepared, stop, SparesOpt};
use super::Point;

/// One load point run on its own (`log --point`), with what the service did
/// during it.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// The load point.
    pub point: Point,
    /// Process CPU time over wall time (client and service share it).
    pub cpu_cores: f64,
    /// Writer batches.
    pub batches: u64,
    /// fsync calls (round-ending flushes included).
    pub fsyncs: u64,
    /// Segment files written back without their own fsync, made durable
    /// by their round's device flush.
    pub write_backs: u64,
    /// Device flushes that ended rounds with write-back files.
    pub flushes: u64,
    /// fsync rounds the writer ran itself (`writer_round_max_bytes`).
    pub rounds_on_writer: u64,
    /// Bytes the fsync helpers wrote with `O_DIRECT`, of all bytes
    /// written to segments.
    pub direct_write_bytes: u64,
    /// Bytes written to segments.
    pub bytes_written: u64,
    /// Share of the wall time the writer spent building and writing
    /// batches.
    pub write_share: f64,
    /// Share of the wall time the writer waited for fsync rounds.
    pub sync_share: f64,
    /// Where the appends spent their time inside the service.
    pub stages: StagesSummary,
    /// The I/O scheduler of each device under the zones, as the service
    /// read it at open.
    pub io_schedulers: Vec<melddb_log::blockdev::DeviceScheduler>,
    /// Spares ready, all zones together, when the measured point
    /// started; fewer than [`Probe::spares_wanted`] makes the point open
    /// new files, and its latency not comparable with runs that had them.
    pub spares_ready_at_start: u64,
    /// Spares the service keeps, all zones together.
    pub spares_wanted: u64,
}

/// Service settings a probe can change from their defaults.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ProbeSettings {
    /// fsync every file of a round (`flush_once_per_device = false`)
    /// instead of writing prepared segments back and flushing once.
    pub fsync_each_file: bool,
    /// Make nothing durable (`fsync = false`): the service's path without
    /// the disk's flushes.
    pub no_fsync: bool,
    /// Write large batches' whole blocks directly on the fsync helpers
    /// (`direct_writes = true`).
    pub direct: bool,
    /// Data pages per stripe (one parity page, one zone per page);
    /// [`super::DATA_SHARDS`] is the suite's.
    pub data_shards: usize,
    /// Seconds of the same load run first and not measured: a fresh
    /// store's first seconds fault its memory in, and its first segments
    /// (a new store's end-write segments) are not from spares.
    pub warmup_secs: f64,
}

/// Runs one load point for `secs` on a fresh service with `settings`;
/// progress to stderr.
pub fn probe(
    spec: PointSpec,
    secs: f64,
    spares: SparesOpt,
    settings: ProbeSettings,
) -> Result<Probe, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = tmp.path().join("svc");
    rt.block_on(async {
        let mut cfg = spares.config(&dir, settings.data_shards);
        cfg.tuning.flush_once_per_device = !settings.fsync_each_file;
        cfg.fsync = !settings.no_fsync;
        cfg.tuning.direct_writes = settings.direct;
        let (store, running, _) = start_prepared(cfg, spares).await?;
        let addr = running.tcp.to_string();
        if settings.warmup_secs > 0.0 {
            eprintln!(
                "warm-up: {spec:?} for {} s, not measured ...",
                settings.warmup_secs
            );
            run_point(&addr, spec, settings.warmup_secs).await?;
        }
        let before = store.stats();
        let spares_wanted = spares.wanted(store.config().zones.len());
        let stages_before = store.stages();
        let cpu = cpu_time::ProcessTime::try_now().map_err(|e| format!("process CPU time: {e}"))?;
        let wall = Instant::now();
        eprintln!("{spec:?} for {secs} s ...");
        let point = run_point(&addr, spec, secs).await?;
        let wall = wall.elapsed().as_secs_f64();
        let cpu_cores = cpu
            .try_elapsed()
            .map_err(|e| format!("process CPU time: {e}"))?
            .as_secs_f64()
            / wall;
        let after = store.stats();
        let stages = store.stages().since(&stages_before).summary();
        stop(store, running).await;
        let share = |us: u64| us as f64 / 1e6 / wall;
        Ok(Probe {
            point,
            cpu_cores,
            batches: after.batches - before.batches,
            fsyncs: after.fsyncs - before.fsyncs,
            write_backs: after.write_backs - before.write_backs,
            flushes: after.flushes - before.flushes,
            rounds_on_writer: after.rounds_on_writer - before.rounds_on_writer,
            direct_write_bytes: after.direct_write_bytes - before.direct_write_bytes,
            bytes_written: after.bytes_written - before.bytes_written,
            write_share: share(after.write_us - before.write_us),
            sync_share: share(after.sync_us - before.sync_us),
            stages,
            io_schedulers: after.io_schedulers.clone(),
            spares_ready_at_start: before.spares_ready,
            spares_wanted,
        })
    })
}
