//! `melddb-bench log --point`: one load point on a fresh service, or with
//! `--disk-alone` the disk alone under the point's arrivals.

use melddb_bench::logsvc::{PointSpec, ProbeSettings, SparesOpt};
use melddb_bench::rawlog::{raw_durable_appends, Layout};

use super::log::{schedulers_line, spares_short_note, LogArgs};
use super::write_json;

/// The background refill rate of a probe's spares (`prepare_mib_s`),
/// MiB/s.
const PROBE_SPARES_MIB_S: u32 = 64;

/// `log --point ... --disk-alone`: the disk as a durable log under the
/// point's arrivals, no service, in one file and then in the service's
/// files.
fn disk_alone(args: &LogArgs, spec: PointSpec) -> Result<(), String> {
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
pub(super) fn log_point(args: &LogArgs, spec: PointSpec) -> Result<(), String> {
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
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "suite": "log-point",
            "config": { "point": format!("{spec:?}"), "secs": args.secs, "spares": spares, "settings": settings },
            "probe": r,
        });
        write_json(path, &doc)?;
    }
    Ok(())
}
