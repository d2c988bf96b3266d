//! The log suite's driver: every point, floor and recovery it measures,
//! in the order it runs them.

use std::time::Instant;

use melddb_log::config::END_WRITE_COPIES;
use melddb_log::latency::StagesSummary;
use melddb_log::Store;
use serde::Serialize;

use super::catchup::{catchup, Catchup};
use super::disk::{
    disk_seq_write, disk_seq_write_for, fsync_round_floor, remove_and_settle, RoundFloor,
};
use super::load::{closed_loop, open_loop, reads};
use super::service::{scrub, settle, start, start_prepared, stop, ScrubRun, SparesOpt};
use super::{write_amplification, Point, DATA_SHARDS, WIDE_DATA_SHARDS, ZONES};

/// Everything the suite measured.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// Concurrency sweep, 1 KiB records.
    pub clients: Vec<Point>,
    /// Record-size sweep.
    pub sizes: Vec<Point>,
    /// Highest 1 KiB append rate seen (with batching: many in flight).
    pub append_tps_1k: f64,
    /// Open-loop run at half that rate.
    pub half_load: Point,
    /// Where the half-load appends spent their time inside the service
    /// (its stage histograms over that run; quantiles are bucket upper
    /// bounds, at most 19% high).
    pub half_load_stages: StagesSummary,
    /// Open-loop run at half the target rate
    /// ([`HALF_TARGET_TPS`]), the same on every machine and in every hour,
    /// so that runs compare where `half_load` (half of this run's peak)
    /// does not.
    pub half_target_load: Point,
    /// Inside the service during that run.
    pub half_target_stages: StagesSummary,
    /// The same arrivals for a quarter of a point (1 s; 0.25 s quick)
    /// right before it, after the disk-alone floors left the service idle:
    /// the service's way back from idle, kept out of the steady-state
    /// point above and reported here.
    pub half_target_warmup: Point,
    /// The disk alone as a durable log (one file, write and fdatasync per
    /// group of batches, [`crate::rawlog`]) under the same arrivals for as
    /// long, just before that run: the latency floor it is read against.
    pub half_target_disk: Point,
    /// The same arrivals on the disk alone laid out as the service lays a
    /// group out (a file per zone, three end-write files, write-back and
    /// one flush, [`crate::rawlog::Layout::Service`]), right after
    /// `half_target_disk`: what the layout costs on this disk, without the
    /// service's threads and sockets.
    pub half_target_disk_files: Point,
    /// Random 1 KiB reads.
    pub reads: Point,
    /// One client reading a log of 1 KiB records from position 0 through
    /// a batched subscription ([`CATCHUP_ENTRIES`]; a quarter quick):
    /// read against `reads`, 1 KiB records one `Read` request each.
    pub catchup: Catchup,
    /// Recovery: (log MiB on disk, seconds).
    pub recovery: Vec<(f64, f64)>,
    /// MiB each recovery read from the segment files (page headers, end-
    /// writes, markers, the zero tails of the window's segments).
    pub recovery_read_mib: Vec<f64>,
    /// A scrub of the store just recovered at the first recovery point:
    /// every page of every live stripe read and checked against its
    /// checksum and its stripe's parity, every end-write copy read.
    pub scrub: ScrubRun,
    /// Raw sequential write of the same disk (1 MiB writes, fsync every
    /// 8 MiB), MiB/s: 1 GiB (512 MiB quick) before anything else.
    pub disk_seq_write_mib_s: f64,
    /// The same raw write for as long as a load point runs, just before
    /// the 64 KiB records: the disk as the service met it, after the
    /// gigabytes the earlier points wrote (a disk may slow down under
    /// sustained writes).
    pub disk_adjacent_mib_s: f64,
    /// Device bytes the service wrote per payload byte (parity, headers,
    /// end-writes) in the 64 KiB run.
    pub write_amplification_64k: f64,
    /// Stripe geometry used.
    pub geometry: String,
    /// The I/O scheduler of the disk under the temporary zones (empty
    /// where the OS shows none): latency figures depend on it.
    pub io_schedulers: Vec<melddb_log::blockdev::DeviceScheduler>,
    /// fsync rounds on the idle disk before the service starts: over the
    /// files one round of this geometry touches, and over one file.
    pub round_floor: Vec<RoundFloor>,
    /// The spare segments the main service kept (`prepared_segments`).
    pub spares: SparesOpt,
    /// Seconds from the main service's open to all its spares ready.
    pub spares_open_secs: f64,
    /// Seconds the suite waited, over all points, for the refill between
    /// points (spares written while the log was quiet).
    pub spares_refill_secs: f64,
    /// Spares ready, all zones together, when the half-target point
    /// started, of [`SparesOpt::wanted`]: fewer means the window opened
    /// new files during it, fsynced one by one (a disk under the spares'
    /// free-space rule), and its latency is not comparable with runs
    /// that had them.
    pub half_target_spares_ready: u64,
    /// Spares the main service keeps, all zones together.
    pub spares_wanted: u64,
    /// The same batched and half-load runs on a second fresh service
    /// without spares (segments start as empty files), the half load at
    /// the main run's rate.
    pub fresh_files: FreshFiles,
    /// The 64 KiB point again on a third fresh service with wide stripes.
    pub wide: WideStripes,
}

/// Large records over wide stripes: [`WIDE_DATA_SHARDS`] data pages and
/// one parity page, so less of what is written is parity.
#[derive(Debug, Clone, Serialize)]
pub struct WideStripes {
    /// Stripe geometry used.
    pub geometry: String,
    /// 64 KiB records, 64 clients x 4 in flight.
    pub point: Point,
    /// Device bytes the service wrote per payload byte.
    pub write_amplification: f64,
}

/// The comparison runs without spares.
#[derive(Debug, Clone, Serialize)]
pub struct FreshFiles {
    /// Batches of 64, 64 clients x 4 in flight.
    pub batched: Point,
    /// Open loop at the main run's half-load rate.
    pub half_load: Point,
    /// Inside the service during that half load.
    pub half_load_stages: StagesSummary,
}

/// Spares per zone the suite's main service keeps: enough that the
/// batched, half-load and 64 KiB points each start with ready spares.
const SUITE_SPARES: u32 = 4;

/// Half of the target of 300K appends/s: the rate the issue's
/// "p99 at half that load" names, whatever this run's peak.
pub const HALF_TARGET_TPS: f64 = 150_000.0;

/// Records the catch-up reads (a quarter of them with `--quick`).
pub const CATCHUP_ENTRIES: u64 = 200_000;

/// Runs the suite; progress goes to stderr.
pub fn run(quick: bool) -> Result<Results, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let secs = if quick { 1.0 } else { 4.0 };
    eprintln!("raw disk ...");
    let disk = disk_seq_write(tmp.path(), if quick { 512 } else { 1024 })?;
    // A round of this geometry syncs one segment per zone (data and
    // parity pages) plus the three end-write segments; 4 KiB is the least
    // a round writes to each.
    let rounds = if quick { 200 } else { 500 };
    let mut round_floor = Vec::new();
    for (name, files, bytes) in [
        ("round", ZONES + END_WRITE_COPIES, 4096),
        ("round_32k", ZONES + END_WRITE_COPIES, 32 << 10),
        ("fsync_one_file", 1, 4096),
    ] {
        eprintln!("fsync rounds on the idle disk, {files} files x {bytes} B ...");
        round_floor.push(fsync_round_floor(tmp.path(), name, files, bytes, rounds)?);
    }
    let dir = tmp.path().join("svc");
    let spares = SparesOpt {
        per_zone: SUITE_SPARES,
        mib_s: 0,
        wait: true,
    };
    rt.block_on(async {
        let (store, running, spares_open_secs) = start_prepared(spares.config(&dir, DATA_SHARDS), spares).await?;
        let mut spares_refill_secs = 0.0;
        let addr = running.tcp.to_string();
        let mut clients = Vec::new();
        let sweep: &[usize] = if quick { &[1, 16, 256] } else { &[1, 4, 16, 64, 256] };
        for &c in sweep {
            eprintln!("appends, {c} clients ...");
            clients.push(closed_loop(&addr, "1 KiB appends, 1 in flight per client", c, 1, 1, 1024, secs).await?);
        }
        eprintln!("appends, 256 clients x 16 in flight ...");
        clients.push(closed_loop(&addr, "1 KiB appends, 16 in flight per client", 256, 16, 1, 1024, secs).await?);
        eprintln!("appends, client batches of 64 ...");
        spares_refill_secs += settle(&store, spares).await;
        clients.push(closed_loop(&addr, "1 KiB appends, batches of 64, 4 in flight", 64, 4, 64, 1024, secs).await?);
        let best = clients
            .iter()
            .max_by(|a, b| a.ops_s.total_cmp(&b.ops_s))
            .cloned()
            .ok_or("no append runs")?;
        let peak = best.ops_s;
        eprintln!("open loop at half of {peak:.0}/s, batches of {} ...", best.batch);
        spares_refill_secs += settle(&store, spares).await;
        let stages_before = store.stages();
        let half_load = open_loop(&addr, 64, best.batch, 1024, peak / 2.0, secs).await?;
        let half_load_stages = store.stages().since(&stages_before).summary();
        eprintln!("open loop at {HALF_TARGET_TPS:.0}/s (half the 300K target), batches of {} ...", best.batch);
        spares_refill_secs += settle(&store, spares).await;
        eprintln!("the disk alone as a durable log at {HALF_TARGET_TPS:.0}/s, for comparison ...");
        // Both floors, one file first, then the service's files.
        let floor = |layout: crate::rawlog::Layout| {
            crate::rawlog::raw_durable_appends(tmp.path(), HALF_TARGET_TPS, best.batch, 1024, layout, 2.0 * secs)
        };
        let [one_file, service_files] = crate::rawlog::Layout::floors(DATA_SHARDS);
        let half_target_disk = floor(one_file)?;
        eprintln!("the disk alone again, laid out as the service's files ...");
        let half_target_disk_files = floor(service_files)?;
        // The floors left the service idle: its first tens of
        // milliseconds at 150K/s after that are a transient of coming back
        // from idle, not the load, and are enough to move a p99. A quarter
        // of a point at the same rate goes first, measured and reported on
        // its own.
        let mut half_target_warmup =
            open_loop(&addr, 64, best.batch, 1024, HALF_TARGET_TPS, secs / 4.0).await?;
        half_target_warmup.label = "the same, its first quarter-point after idle".into();
        // Twice the other points' length: this p99 is read against a
        // target, and one stall of a few milliseconds moves the p99 of a
        // short run.
        let half_target_spares_ready = store.stats().spares_ready;
        let stages_before = store.stages();
        let mut half_target_load =
            open_loop(&addr, 64, best.batch, 1024, HALF_TARGET_TPS, 2.0 * secs).await?;
        half_target_load.label = "open loop at half the 300K target".into();
        let half_target_stages = store.stages().since(&stages_before).summary();
        let mut sizes = Vec::new();
        let size_list: &[usize] = if quick { &[256, 4096, 65536] } else { &[256, 1024, 4096, 16384, 65536] };
        let mut amp = 0.0;
        let mut adjacent = 0.0;
        for &s in size_list {
            if s == 65536 {
                spares_refill_secs += settle(&store, spares).await;
                eprintln!("raw disk, {secs} s, just before the 64 KiB records ...");
                adjacent = disk_seq_write_for(tmp.path(), secs)?;
            }
            eprintln!("record size {s} ...");
            let before = store.stats();
            let p = closed_loop(&addr, "64 clients x 4 in flight", 64, 4, 1, s, secs).await?;
            if s == 65536 {
                amp = write_amplification(&before, &store.stats());
            }
            sizes.push(p);
        }
        let tail = store.bounds("bench").1;
        eprintln!("reads ...");
        let rd = reads(&addr, 16, 8, tail, secs).await?;
        let entries = if quick { CATCHUP_ENTRIES / 4 } else { CATCHUP_ENTRIES };
        spares_refill_secs += settle(&store, spares).await;
        eprintln!("catch-up: {entries} records of 1 KiB, then one client reads them back ...");
        let caught_up = catchup(&addr, "catchup", entries).await?;
        spares_refill_secs += settle(&store, spares).await;
        stop(store, running).await;
        // Recovery time vs log size: reopen as is, then after growing it.
        let mut recovery = Vec::new();
        let mut recovery_read_mib = Vec::new();
        let mut scrub_run = ScrubRun::default();
        for round in 0..2 {
            if round == 1 {
                eprintln!("growing the log for the second recovery point ...");
                let (store, running, _) = start_prepared(spares.config(&dir, DATA_SHARDS), SparesOpt { wait: false, ..spares }).await?;
                let addr = running.tcp.to_string();
                closed_loop(&addr, "grow", 64, 4, 1, 65536, secs * 2.0).await?;
                // All spares on disk, so the reopen only adopts them.
                spares_refill_secs += settle(&store, spares).await;
                stop(store, running).await;
            }
            let cfg = spares.config(&dir, DATA_SHARDS);
            let t = Instant::now();
            let store = tokio::task::spawn_blocking(move || Store::open(cfg))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            let s = t.elapsed().as_secs_f64();
            // The log's data (not the spares, nor the zeros after a
            // segment's data).
            let mib = store.recovery().bytes as f64 / (1 << 20) as f64;
            let read = store.recovery().bytes_read as f64 / (1 << 20) as f64;
            eprintln!("recovery of {mib:.0} MiB: {s:.3} s (read {read:.0} MiB)");
            recovery.push((mib, s));
            recovery_read_mib.push(read);
            let scrubbed = tokio::task::spawn_blocking(move || {
                let run = (round == 0).then(|| scrub(&store));
                store.shutdown();
                run
            })
            .await
            .map_err(|e| e.to_string())?;
            if let Some(run) = scrubbed {
                eprintln!(
                    "scrub of {:.0} MiB of pages: {:.3} s ({:.0} MiB/s), {} bad pages",
                    run.mib, run.secs, run.mib / run.secs.max(1e-9), run.bad_pages
                );
                scrub_run = run;
            }
        }
        // The main log (tens of GiB after the second recovery point) is
        // done with: free the disk for the two services below.
        remove_and_settle(&dir)?;
        // The same batched and half-load runs without spares.
        let fresh_dir = tmp.path().join("fresh");
        let (store, running) = start(&fresh_dir).await?;
        let addr = running.tcp.to_string();
        eprintln!("without spares: appends, client batches of 64 ...");
        let batched = closed_loop(&addr, "1 KiB appends, batches of 64, 4 in flight, no spares", 64, 4, 64, 1024, secs).await?;
        eprintln!("without spares: open loop at {:.0}/s ...", peak / 2.0);
        let stages_before = store.stages();
        let mut fresh_half = open_loop(&addr, 64, best.batch, 1024, peak / 2.0, secs).await?;
        fresh_half.label = "open loop at the same rate, no spares".into();
        let fresh_stages = store.stages().since(&stages_before).summary();
        stop(store, running).await;
        remove_and_settle(&fresh_dir)?;
        // Large records over wide stripes, on their own fresh service with
        // spares. No raw write of its own: right after the open has written
        // gigabytes of spares, a raw write to a new file measures the disk
        // still busy with them, not the disk this point (writing over the
        // spares) meets. So it is compared with the raw write next to the
        // main 64 KiB run.
        let wide_dir = tmp.path().join("wide");
        let (store, running, _) =
            start_prepared(spares.config(&wide_dir, WIDE_DATA_SHARDS), spares).await?;
        let addr = running.tcp.to_string();
        eprintln!("record size 65536, {WIDE_DATA_SHARDS} data + 1 parity pages per stripe ...");
        let before = store.stats();
        let wide_point = closed_loop(&addr, "64 clients x 4 in flight, wide stripes", 64, 4, 1, 65536, secs).await?;
        let wide_amp = write_amplification(&before, &store.stats());
        stop(store, running).await;
        // Its segments and spares are GiBs; left to the temporary
        // directory's drop, their trims would run on after the suite exits
        // and slow whatever runs next.
        remove_and_settle(&wide_dir)?;
        Ok(Results {
            append_tps_1k: peak,
            clients,
            sizes,
            half_load,
            half_load_stages,
            half_target_load,
            half_target_stages,
            half_target_warmup,
            half_target_disk,
            half_target_disk_files,
            reads: rd,
            catchup: caught_up,
            recovery,
            recovery_read_mib,
            scrub: scrub_run,
            disk_seq_write_mib_s: disk,
            disk_adjacent_mib_s: adjacent,
            write_amplification_64k: amp,
            geometry: format!("{DATA_SHARDS} data + 1 parity pages per stripe, {ZONES} zones (directories on one disk), 256 KiB pages, 256 MiB segments, {SUITE_SPARES} spare segments per zone, fsync on"),
            io_schedulers: melddb_log::blockdev::schedulers([tmp.path()]),
            round_floor,
            spares,
            spares_open_secs,
            half_target_spares_ready,
            spares_wanted: spares.wanted(ZONES),
            spares_refill_secs,
            fresh_files: FreshFiles {
                batched,
                half_load: fresh_half,
                half_load_stages: fresh_stages,
            },
            wide: WideStripes {
                geometry: format!("{WIDE_DATA_SHARDS} data + 1 parity pages per stripe, {} zones, otherwise as the suite", WIDE_DATA_SHARDS + 1),
                point: wide_point,
                write_amplification: wide_amp,
            },
        })
    })
}
