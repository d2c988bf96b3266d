//! `melddb-bench log`: the log service on loopback against the raw disk,
//! in the same run; `log --point` probes one load point on its own
//! ([`super::log_point`]).

use melddb_bench::logsvc::PointSpec;
use melddb_bench::round2;

use super::log_point::{log_point, schedulers_line, spares_short_note, PointArgs};
use super::{write_json, RunArgs};
use crate::plot;

/// `melddb-bench log`.
#[derive(Debug, clap::Args)]
pub struct LogArgs {
    /// Size of the run and where its figures go.
    #[command(flatten)]
    pub run: RunArgs,
    /// Run only this load point on a fresh service and print what the
    /// writer did during it: `CLIENTSxDEPTHxBATCHxBYTES` (closed loop,
    /// e.g. `64x4x64x1024`) or `CLIENTSxBATCHxBYTES@RATE` (open loop,
    /// Poisson arrivals, e.g. `64x64x1024@150000`).
    #[arg(long, help_heading = "One load point")]
    pub point: Option<PointSpec>,
    /// The probe's settings.
    #[command(flatten)]
    pub probe: PointArgs,
}

/// Runs the suite, or with `--point` the one point.
pub fn run_suite(args: &LogArgs) -> Result<(), String> {
    if let Some(spec) = args.point {
        // Checked here, not by clap: a conflict with `--point` would also
        // lift the probe flags' requirement of it.
        if args.run.quick || args.run.plots.is_some() {
            return Err(
                "--quick and --plots are the suite's; a --point runs for --secs and draws no plots"
                    .into(),
            );
        }
        return log_point(&args.probe, args.run.json.as_deref(), spec);
    }
    let r = melddb_bench::logsvc::run(args.run.quick)?;
    println!(
        "{:<42} {:>5} {:>5} {:>5} {:>7} {:>11} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "run",
        "cli",
        "depth",
        "batch",
        "record",
        "ops/s",
        "MiB/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms"
    );
    let all: Vec<&melddb_bench::logsvc::Point> = r
        .clients
        .iter()
        .chain(&r.sizes)
        .chain([
            &r.half_load,
            &r.half_target_warmup,
            &r.half_target_load,
            &r.half_target_disk,
            &r.half_target_disk_files,
            &r.reads,
        ])
        .chain([&r.fresh_files.batched, &r.fresh_files.half_load])
        .collect();
    for p in &all {
        println!(
            "{:<42} {:>5} {:>5} {:>5} {:>7} {:>11.0} {:>9.1} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            p.label,
            p.clients,
            p.depth,
            p.batch,
            p.record,
            p.ops_s,
            p.mib_s,
            p.p50_ms,
            p.p99_ms,
            p.p999_ms,
            p.max_ms
        );
    }
    let big = r
        .sizes
        .iter()
        .find(|p| p.record == 65536)
        .map(|p| p.mib_s)
        .unwrap_or(0.0);
    let device = big * r.write_amplification_64k;
    println!(
        "raw disk sequential write: {:.1} MiB/s at the start; {:.1} MiB/s just before the 64 KiB records (as long as one load point)",
        r.disk_seq_write_mib_s, r.disk_adjacent_mib_s
    );
    println!(
        "64 KiB records: {big:.1} MiB/s payload = {:.0}% of raw; device bytes per payload byte {:.2} ({:.1} MiB/s = {:.0}% of raw)",
        100.0 * big / r.disk_seq_write_mib_s.max(1e-9),
        r.write_amplification_64k,
        device,
        100.0 * device / r.disk_seq_write_mib_s.max(1e-9)
    );
    println!(
        "64 KiB records against the adjacent raw write: {:.0}% as payload, {:.0}% as device bytes",
        100.0 * big / r.disk_adjacent_mib_s.max(1e-9),
        100.0 * device / r.disk_adjacent_mib_s.max(1e-9)
    );
    let w = &r.wide;
    let wide_device = w.point.mib_s * w.write_amplification;
    println!(
        "64 KiB records on wide stripes ({}): {:.1} MiB/s payload = {:.0}% of the adjacent raw write above; device bytes per payload byte {:.2} ({:.1} MiB/s = {:.0}%)",
        w.geometry,
        w.point.mib_s,
        100.0 * w.point.mib_s / r.disk_adjacent_mib_s.max(1e-9),
        w.write_amplification,
        wide_device,
        100.0 * wide_device / r.disk_adjacent_mib_s.max(1e-9)
    );
    let cu = &r.catchup;
    println!(
        "catch-up: one client read {} records of 1 KiB from position 0 through subscribe_batches in {:.3} s: {:.0} entries/s ({:.1}x the {:.0}/s of single random reads above)",
        cu.entries,
        cu.secs,
        cu.entries_per_s,
        cu.entries_per_s / r.reads.ops_s.max(1e-9),
        r.reads.ops_s
    );
    for ((mib, s), read) in r.recovery.iter().zip(&r.recovery_read_mib) {
        println!("recovery: {s:.3} s for {mib:.0} MiB of log data (read {read:.0} MiB)");
    }
    let sc = &r.scrub;
    println!(
        "scrub after the first recovery: {:.3} s for {:.0} MiB of pages ({:.0} MiB/s; {} stripes against parity, {} end-writes x 3 copies), {} bad",
        sc.secs,
        sc.mib,
        sc.mib / sc.secs.max(1e-9),
        sc.stripes,
        sc.end_writes,
        sc.bad_pages
    );
    println!("geometry: {}", r.geometry);
    println!("I/O scheduler: {}", schedulers_line(&r.io_schedulers));
    println!(
        "spares: {} per zone, written at the open in {:.1} s; {:.1} s waited for refills between points (spares are refilled only while the log is quiet); {} of {} ready when the half-target point started{}",
        r.spares.per_zone,
        r.spares_open_secs,
        r.spares_refill_secs,
        r.half_target_spares_ready,
        r.spares_wanted,
        spares_short_note(r.half_target_spares_ready, r.spares_wanted)
    );
    println!(
        "without spares (a second fresh service, segments start as empty files): batches {:.0}/s ({:.2}x with spares); half load p50 {:.3} ms, p99 {:.3} ms (with spares p50 {:.3}, p99 {:.3})",
        r.fresh_files.batched.ops_s,
        r.append_tps_1k / r.fresh_files.batched.ops_s.max(1e-9),
        r.fresh_files.half_load.p50_ms,
        r.fresh_files.half_load.p99_ms,
        r.half_load.p50_ms,
        r.half_load.p99_ms
    );
    melddb_bench::logsvc::print_stages("half load, inside the service:", &r.half_load_stages);
    println!(
        "at half the 300K target ({:.0} appends/s offered, {:.0}/s done): p50 {:.3} ms, p99 {:.3} ms",
        melddb_bench::logsvc::HALF_TARGET_TPS,
        r.half_target_load.ops_s,
        r.half_target_load.p50_ms,
        r.half_target_load.p99_ms
    );
    println!(
        "the disk alone as a durable log under the same arrivals, just before (one file, write + fdatasync per group of batches): p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
        r.half_target_disk.p50_ms,
        r.half_target_disk.p99_ms,
        r.half_target_disk.p999_ms,
        r.half_target_disk.max_ms
    );
    println!(
        "the disk alone again, laid out as the service's files (a file per zone, three end-write files, write-back and one flush, one thread): p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
        r.half_target_disk_files.p50_ms,
        r.half_target_disk_files.p99_ms,
        r.half_target_disk_files.p999_ms,
        r.half_target_disk_files.max_ms
    );
    melddb_bench::logsvc::print_stages(
        "at half the target, inside the service:",
        &r.half_target_stages,
    );
    println!(
        "the quarter-point at the same rate right before it, after the floors left the service idle: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        r.half_target_warmup.p50_ms, r.half_target_warmup.p99_ms, r.half_target_warmup.max_ms
    );
    melddb_bench::logsvc::print_stages(
        "half load without spares, inside the service:",
        &r.fresh_files.half_load_stages,
    );
    for f in &r.round_floor {
        println!(
            "fsync rounds on the idle disk: {} file(s) x {} B appended, then fdatasync'd in parallel, back to back: p50 {:.3} ms, p99 {:.3} ms, {:.1} MiB/s ({} rounds)",
            f.files, f.bytes, f.p50_ms, f.p99_ms, f.mib_s, f.rounds
        );
    }
    let mut metrics = serde_json::Map::new();
    let mut put = |k: &str, v: f64| {
        metrics.insert(k.into(), serde_json::json!(round2(v)));
    };
    // disk_round_*: the floor under every acknowledged append, one round
    // over the files a round of this geometry touches, on the idle disk.
    for f in &r.round_floor {
        put(&format!("disk_{}_p50_ms", f.name), f.p50_ms);
        put(&format!("disk_{}_p99_ms", f.name), f.p99_ms);
    }
    put("append_tps_1k", r.append_tps_1k);
    put("append_p99_ms_half_load", r.half_load.p99_ms);
    put("append_p50_ms_half_load", r.half_load.p50_ms);
    put("append_p99_ms_half_target", r.half_target_load.p99_ms);
    put("append_p999_ms_half_target", r.half_target_load.p999_ms);
    put("append_max_ms_half_target", r.half_target_load.max_ms);
    put("append_p50_ms_half_target", r.half_target_load.p50_ms);
    put("half_target_tps", r.half_target_load.ops_s);
    // The quarter-point before it, the service's way back from idle.
    put(
        "append_p99_ms_half_target_warmup",
        r.half_target_warmup.p99_ms,
    );
    put(
        "append_max_ms_half_target_warmup",
        r.half_target_warmup.max_ms,
    );
    // The same arrivals on the disk alone (`melddb_bench::rawlog`), measured
    // just before it: the floors under append_p99_ms_half_target, in one
    // file and in the service's files (a file per zone, three end-write
    // files, one flush), each on one thread.
    for (name, p) in [
        ("disk_durable", &r.half_target_disk),
        ("disk_files_durable", &r.half_target_disk_files),
    ] {
        put(&format!("{name}_p50_ms_half_target"), p.p50_ms);
        put(&format!("{name}_p99_ms_half_target"), p.p99_ms);
        put(&format!("{name}_p999_ms_half_target"), p.p999_ms);
        put(&format!("{name}_max_ms_half_target"), p.max_ms);
    }
    put("half_load_tps", r.half_load.ops_s);
    // Inside the service at half load: the median and p99 of each stage.
    let st = &r.half_load_stages;
    for (info, s) in st.rows() {
        put(&format!("half_load_{}_p50_ms", info.key), s.p50_ms);
        put(&format!("half_load_{}_p99_ms", info.key), s.p99_ms);
        put(&format!("half_load_{}_max_ms", info.key), s.max_ms);
    }
    put("append_tps_1k_no_spares", r.fresh_files.batched.ops_s);
    put(
        "append_p99_ms_half_load_no_spares",
        r.fresh_files.half_load.p99_ms,
    );
    put(
        "append_p50_ms_half_load_no_spares",
        r.fresh_files.half_load.p50_ms,
    );
    put("spares_open_secs", r.spares_open_secs);
    put("spares_refill_secs", r.spares_refill_secs);
    put(
        "half_target_spares_ready",
        r.half_target_spares_ready as f64,
    );
    put("read_tps_1k", r.reads.ops_s);
    // One client from position 0 through a batched subscription; read
    // against read_tps_1k, 1 KiB records one request each.
    put("catchup_entries_per_s_1k", r.catchup.entries_per_s);
    put("disk_seq_write_mib_s", r.disk_seq_write_mib_s);
    put("log_write_mib_s_64k", big);
    put("log_device_mib_s_64k", device);
    put("log_over_disk_64k", big / r.disk_seq_write_mib_s.max(1e-9));
    put("disk_adjacent_mib_s", r.disk_adjacent_mib_s);
    put(
        "log_over_adjacent_disk_64k",
        big / r.disk_adjacent_mib_s.max(1e-9),
    );
    put("write_amplification_64k", r.write_amplification_64k);
    // The same records over 8 data + 1 parity pages per stripe.
    put("log_write_mib_s_64k_wide", w.point.mib_s);
    put("log_device_mib_s_64k_wide", wide_device);
    put(
        "log_over_adjacent_disk_64k_wide",
        w.point.mib_s / r.disk_adjacent_mib_s.max(1e-9),
    );
    put("write_amplification_64k_wide", w.write_amplification);
    if let Some((mib, s)) = r.recovery.last() {
        put("recovery_s_per_gib", s / (mib / 1024.0).max(1e-9));
    }
    put("scrub_mib_s", sc.mib / sc.secs.max(1e-9));
    put("scrub_bad_pages", sc.bad_pages as f64);
    if let Some(dir) = &args.run.plots {
        plot::log_plots(dir, &r)?;
        eprintln!("plots written to {}", dir.display());
    }
    if let Some(path) = &args.run.json {
        let doc = serde_json::json!({
            "suite": "log",
            "metrics": metrics,
            "config": { "quick": args.run.quick, "geometry": r.geometry, "spares": r.spares, "io_schedulers": r.io_schedulers },
            "rows": all,
            "recovery": r.recovery,
            "recovery_read_mib": r.recovery_read_mib,
            "scrub": r.scrub,
            "round_floor": r.round_floor,
            "catchup": r.catchup,
        });
        write_json(path, &doc)?;
    }
    Ok(())
}
