//! `melddb-bench log --point`: one load point on a fresh service, or with
//! `--disk-alone` the disk alone under the point's arrivals.

use melddb_bench::logsvc::{PointSpec, ProbeSettings, SparesOpt, DATA_SHARDS};
use melddb_bench::rawlog::{raw_durable_appends, Layout};

use super::write_json;

/// The background refill rate of a probe's spares (`prepare_mib_s`),
/// MiB/s.
const PROBE_SPARES_MIB_S: u32 = 64;

/// `melddb-bench log --point`'s settings (flattened into the suite's
/// arguments; each needs `--point`).
#[derive(Debug, clap::Args)]
pub struct PointArgs {
    /// Seconds to run the point.
    #[arg(
        long,
        default_value_t = 4.0,
        requires = "point",
        help_heading = "One load point"
    )]
    pub secs: f64,
    /// Run the same load this many seconds first, unmeasured, so the
    /// figures are of a service past its first seconds.
    #[arg(
        long,
        default_value_t = 0.0,
        requires = "point",
        help_heading = "One load point"
    )]
    pub warmup: f64,
    /// Spare segments per zone (`prepared_segments`; 0: segments start as
    /// empty files). The suite keeps 4.
    #[arg(
        long,
        default_value_t = 0,
        requires = "point",
        help_heading = "One load point"
    )]
    pub spares: u32,
    /// Wait until the spares written at the open are ready before the
    /// load starts, as the suite does.
    #[arg(long, requires = "point", help_heading = "One load point")]
    pub spares_wait: bool,
    /// Data pages per stripe, with one parity page and one zone
    /// (directory) per page. The suite uses 4, and 8 for its wide
    /// stripes.
    #[arg(long, default_value_t = DATA_SHARDS, requires = "point", help_heading = "One load point")]
    pub data_shards: usize,
    /// Run no service: time the disk alone as a durable log under the
    /// open-loop point's arrivals, in one file, then in the service's
    /// files, as the suite does before its half-target point.
    #[arg(long, requires = "point", help_heading = "One load point")]
    pub disk_alone: bool,
    /// Write large batches' whole blocks directly on the fsync helpers
    /// (`direct_writes = true`).
    #[arg(
        long,
        requires = "point",
        conflicts_with = "disk_alone",
        help_heading = "One load point"
    )]
    pub direct: bool,
    /// fsync every segment file of a round (`flush_once_per_device =
    /// false`) instead of writing segments made from spares back and
    /// flushing each device once.
    #[arg(
        long,
        requires = "point",
        conflicts_with = "disk_alone",
        help_heading = "One load point"
    )]
    pub fsync_each_file: bool,
    /// Make nothing durable (`fsync = false`): times the service's own
    /// path without the disk's flushes. Not a durable log. What it leaves
    /// dirty is written back once the kernel's background threshold is
    /// passed, which then shows in the tail: keep warm-up and run short.
    #[arg(
        long,
        requires = "point",
        conflicts_with = "disk_alone",
        help_heading = "One load point"
    )]
    pub no_fsync: bool,
}

/// `log --point ... --disk-alone`: the disk as a durable log under the
/// point's arrivals, no service, in one file and then in the service's
/// files.
fn disk_alone(args: &PointArgs, spec: PointSpec) -> Result<(), String> {
    let PointSpec::Open(_, batch, record, rate) = spec else {
        return Err(
            "--disk-alone needs an open-loop point (CLIENTSxBATCHxBYTES@RATE): it replays arrivals, and a closed loop has none".into(),
        );
    };
    let tmp = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    println!(
        "{:<36} {:>11} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "layout", "ops/s", "MiB/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"
    );
    for layout in Layout::floors(args.data_shards) {
        eprintln!(
            "{}: {rate:.0} appends/s in batches of {batch} x {record} B ({layout:?}), {} s ...",
            layout.label(),
            args.secs
        );
        let p = raw_durable_appends(tmp.path(), rate, batch, record, layout, args.secs)?;
        println!(
            "{:<36} {:>11.0} {:>9.1} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            p.label, p.ops_s, p.mib_s, p.p50_ms, p.p99_ms, p.p999_ms, p.max_ms
        );
    }
    Ok(())
}

/// `log --point`: one load point, its figures and the writer's time split.
pub(super) fn log_point(
    args: &PointArgs,
    json: Option<&std::path::Path>,
    spec: PointSpec,
) -> Result<(), String> {
    if !(args.warmup >= 0.0 && args.warmup.is_finite()) {
        return Err(format!(
            "--warmup must be a number of seconds, 0 or more, not {}",
            args.warmup
        ));
    }
    if !(args.secs > 0.0 && args.secs.is_finite()) {
        return Err(format!(
            "--secs must be a positive number of seconds, not {}",
            args.secs
        ));
    }
    if args.data_shards == 0 {
        return Err("--data-shards must be at least 1".into());
    }
    if args.disk_alone {
        return disk_alone(args, spec);
    }
    let spares = SparesOpt {
        per_zone: args.spares,
        mib_s: PROBE_SPARES_MIB_S,
        wait: args.spares_wait,
    };
    let settings = ProbeSettings {
        fsync_each_file: args.fsync_each_file,
        no_fsync: args.no_fsync,
        direct: args.direct,
        warmup_secs: args.warmup,
        data_shards: args.data_shards,
    };
    let r = melddb_bench::logsvc::probe(spec, args.secs, spares, settings)?;
    let p = &r.point;
    println!(
        "{:>11} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "ops/s",
        "MiB/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "cpu cores",
        "batches",
        "fsyncs",
        "write %",
        "sync %"
    );
    println!(
        "{:>11.0} {:>9.1} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>9.2} {:>8} {:>8} {:>8.1} {:>8.1}",
        p.ops_s,
        p.mib_s,
        p.p50_ms,
        p.p99_ms,
        p.p999_ms,
        p.max_ms,
        r.cpu_cores,
        r.batches,
        r.fsyncs,
        100.0 * r.write_share,
        100.0 * r.sync_share
    );
    println!(
        "spares: {} of {} ready when the point started{}",
        r.spares_ready_at_start,
        r.spares_wanted,
        spares_short_note(r.spares_ready_at_start, r.spares_wanted)
    );
    println!("I/O scheduler: {}", schedulers_line(&r.io_schedulers));
    println!(
        "rounds: {} segment files written back and {} device flushes ({}); {} rounds run on the writer",
        r.write_backs,
        r.flushes,
        if args.fsync_each_file {
            "--fsync-each-file: every file fsynced"
        } else {
            "files of segments made from spares are written back, each device flushed once per round"
        },
        r.rounds_on_writer
    );
    println!(
        "written: {:.1} MiB, {:.1} % of it directly ({})",
        r.bytes_written as f64 / (1 << 20) as f64,
        100.0 * r.direct_write_bytes as f64 / r.bytes_written.max(1) as f64,
        if args.direct {
            "--direct: whole blocks of large batches written directly by the fsync helpers"
        } else {
            "every page copied into the page cache; --direct writes large batches directly"
        }
    );
    melddb_bench::logsvc::print_stages("inside the service:", &r.stages);
    if let Some(path) = json {
        let doc = serde_json::json!({
            "suite": "log-point",
            "config": { "point": format!("{spec:?}"), "secs": args.secs, "spares": spares, "settings": settings },
            "probe": r,
        });
        write_json(path, &doc)?;
    }
    Ok(())
}

/// What a point with fewer spares than asked measured, for the line that
/// reports them ("" when none were missing).
pub(super) fn spares_short_note(ready: u64, wanted: u64) -> &'static str {
    if ready >= wanted {
        ""
    } else {
        "; fewer than asked: a segment the window opens without a spare is a new file, fsynced on its own in every round, so this latency may not compare with runs that had them (--spares-wait waits for the refill; a refill that fails wants free disk space, as spares keep a twentieth of the file system free)"
    }
}

/// The zones' devices and their I/O schedulers on one line, for reports.
pub(super) fn schedulers_line(s: &[melddb_log::blockdev::DeviceScheduler]) -> String {
    if s.is_empty() {
        return "not shown by this system (no block device under the zones)".into();
    }
    s.iter()
        .map(|d| format!("{} on device {}", d.scheduler, d.device))
        .collect::<Vec<_>>()
        .join(", ")
}
