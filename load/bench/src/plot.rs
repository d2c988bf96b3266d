//! PNG plots of the bench suites: meld (the meld paper's figures 8–11,
//! 14, 15 in shape), pipeline (Hyder II's 10–13 and 20), log and embedded.

use std::path::Path;

use plotters::prelude::*;

use melddb_bench::workload::Measured;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn register_font() -> Result<(), String> {
    let bytes = std::fs::read(FONT).map_err(|e| format!("font {FONT}: {e}"))?;
    let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, leaked)
        .map_err(|_| "font could not be registered".to_string())
}

type Series = (String, Vec<(f64, f64)>);

fn line_chart(
    path: &Path,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    log_x: bool,
    series: &[Series],
) -> Result<(), String> {
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let xs = series.iter().flat_map(|s| s.1.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.1.iter().map(|p| p.1));
    let (xmin, xmax) = xs.fold((f64::MAX, f64::MIN), |a, x| (a.0.min(x), a.1.max(x)));
    let ymax = ys.fold(0.0f64, f64::max) * 1.1;
    let tx = |x: f64| if log_x { x.log2() } else { x };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(tx(xmin)..tx(xmax), 0.0..ymax.max(1.0))
        .map_err(|e| e.to_string())?;
    // On a log axis, one label per power of two: labels in between would
    // round to the same integer (1.41 and 1 both print as "1").
    let x_labels = if log_x {
        (tx(xmax) - tx(xmin)).round().max(1.0) as usize + 1
    } else {
        10
    };
    chart
        .configure_mesh()
        .x_desc(xlabel)
        .y_desc(ylabel)
        .x_labels(x_labels)
        .x_label_formatter(&|v| {
            if log_x {
                format!("{:.0}", 2f64.powf(*v))
            } else if xmax - xmin < 20.0 {
                format!("{v:.1}")
            } else {
                format!("{v:.0}")
            }
        })
        .y_label_formatter(&|v| {
            if *v >= 1000.0 {
                format!("{:.0}K", v / 1000.0)
            } else {
                format!("{v:.1}")
            }
        })
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = pts.iter().map(|(x, y)| (tx(*x), *y)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    draw_legend(&mut chart)?;
    root.present().map_err(|e| e.to_string())
}

/// The series legend, in one style for every chart.
fn draw_legend<'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

fn by_degree(rows: &[Measured], exp: &str, y: impl Fn(&Measured) -> f64) -> Vec<Series> {
    let mut degrees: Vec<u64> = rows
        .iter()
        .filter(|r| r.spec.experiment == exp)
        .map(|r| r.spec.degree)
        .collect();
    degrees.sort_unstable();
    degrees.dedup();
    degrees
        .into_iter()
        .map(|d| {
            let pts = rows
                .iter()
                .filter(|r| r.spec.experiment == exp && r.spec.degree == d)
                .map(|r| (r.spec.ops as f64, y(r)))
                .collect();
            (format!("degree {d}"), pts)
        })
        .collect()
}

/// Writes the plots into `dir`.
pub fn meld_plots(dir: &Path, rows: &[Measured]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    register_font()?;
    line_chart(
        &dir.join("meld_tps_vs_size.png"),
        "Meld throughput vs transaction size (read:update 1:1, 128K keys)",
        "operations per transaction",
        "melds per second",
        true,
        &by_degree(rows, "symmetric", |r| r.meld_tps),
    )?;
    line_chart(
        &dir.join("meld_nodes_vs_size.png"),
        "Nodes visited per meld",
        "operations per transaction",
        "nodes visited",
        true,
        &by_degree(rows, "symmetric", |r| r.nodes_per_meld),
    )?;
    line_chart(
        &dir.join("meld_over_brute.png"),
        "Meld throughput / brute-force validator throughput",
        "operations per transaction",
        "ratio",
        true,
        &by_degree(rows, "symmetric", |r| r.meld_tps / r.brute_tps.max(1.0)),
    )?;
    line_chart(
        &dir.join("meld_asymmetric.png"),
        "Asymmetric case: read:insert 1:1",
        "operations per transaction",
        "melds per second",
        true,
        &by_degree(rows, "asymmetric", |r| r.meld_tps),
    )?;
    let mut series = Vec::new();
    for (d, ops) in [(16u64, 2usize), (16, 8), (64, 2), (64, 8)] {
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.spec.experiment == "read-pct" && r.spec.degree == d && r.spec.ops == ops)
            .map(|r| (r.spec.read_pct as f64, r.meld_tps))
            .collect();
        if !pts.is_empty() {
            series.push((format!("degree {d}, {ops} ops"), pts));
        }
    }
    line_chart(
        &dir.join("meld_read_pct.png"),
        "Meld throughput vs read percentage",
        "reads (%)",
        "melds per second",
        false,
        &series,
    )?;
    Ok(())
}

/// Pipeline plots: the premeld-distance sweep (Hyder II fig. 20 in shape)
/// with plain, group and both as reference lines, and figures 10-13 in
/// shape per configuration.
pub fn pipeline_plots(
    dir: &Path,
    rows: &[melddb_bench::pipeline::PipeResult],
    sweep: &[melddb_bench::pipeline::PipeResult],
) -> Result<(), String> {
    use melddb_bench::pipeline::PipeResult;
    register_font()?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let (lo, hi) = sweep.iter().fold((f64::MAX, 0.0f64), |a, r| {
        (a.0.min(r.config.d as f64), a.1.max(r.config.d as f64))
    });
    let chart = |file: &str, title: &str, ylabel: &str, y: &dyn Fn(&PipeResult) -> f64| {
        let mut series: Vec<Series> = vec![(
            "premeld t=2".into(),
            sweep.iter().map(|r| (r.config.d as f64, y(r))).collect(),
        )];
        for r in rows.iter().filter(|r| r.config.name != "premeld") {
            series.push((
                format!("{} (reference)", r.config.name),
                vec![(lo, y(r)), (hi, y(r))],
            ));
        }
        line_chart(
            &dir.join(file),
            title,
            "premeld distance d",
            ylabel,
            true,
            &series,
        )
    };
    chart(
        "pipeline-tps.png",
        "End-to-end committed tps vs premeld distance (8R/2W)",
        "committed tps",
        &|r| r.tps,
    )?;
    chart(
        "pipeline-final-nodes.png",
        "Final-meld nodes visited per transaction vs premeld distance",
        "nodes per txn",
        &|r| r.final_nodes_per_txn,
    )?;
    pipeline_configs_plot(&dir.join("pipeline-configs.png"), rows)
}

/// One bar group per label; each series is one bar in every group.
/// With `log_y`, bar heights are log10 of the values and the axis is
/// labelled in powers of ten (for figures whose values span 1 to 10^5).
fn bar_panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    title: &str,
    ylabel: &str,
    labels: &[&str],
    series: &[(&str, Vec<f64>)],
    log_y: bool,
) -> Result<(), String> {
    let h = |v: f64| if log_y { v.max(1.0).log10() } else { v };
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|v| h(*v)))
        .fold(0.0f64, f64::max)
        * 1.15;
    let n = labels.len();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..ymax.max(1.0))
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|v| {
            let i = v.round();
            match labels.get(i as usize) {
                Some(name) if (v - i).abs() < 1e-6 && i >= 0.0 => name.to_string(),
                _ => String::new(),
            }
        })
        .y_desc(ylabel)
        .y_label_formatter(&|v| {
            let v = if log_y { 10f64.powf(*v) } else { *v };
            if v >= 1000.0 {
                format!("{:.0}K", v / 1000.0)
            } else {
                format!("{v:.0}")
            }
        })
        .draw()
        .map_err(|e| e.to_string())?;
    let k = series.len().max(1) as f64;
    let width = 0.8 / k;
    for (j, (name, values)) in series.iter().enumerate() {
        let color = Palette99::pick(j).to_rgba();
        let x0 = -0.4 + j as f64 * width;
        chart
            .draw_series(values.iter().enumerate().map(|(i, v)| {
                let x = i as f64 + x0;
                Rectangle::new([(x, 0.0), (x + width * 0.9, h(*v))], color.filled())
            }))
            .map_err(|e| e.to_string())?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    if series.len() > 1 {
        draw_legend(&mut chart)?;
    }
    Ok(())
}

/// Hyder II figures 10-13 in shape, one panel each, per configuration
/// (plain, group, premeld, both): committed tps, final-meld nodes per
/// transaction, the conflict zone final meld saw, and nodes per stage.
fn pipeline_configs_plot(
    path: &Path,
    rows: &[melddb_bench::pipeline::PipeResult],
) -> Result<(), String> {
    let root = BitMapBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((2, 2));
    let labels: Vec<&str> = rows.iter().map(|r| r.config.name).collect();
    let col = |f: &dyn Fn(&melddb_bench::pipeline::PipeResult) -> f64| -> Vec<f64> {
        rows.iter().map(f).collect()
    };
    bar_panel(
        &panels[0],
        "Committed tps, end to end (Fig. 10)",
        "committed tps",
        &labels,
        &[("tps", col(&|r| r.tps))],
        false,
    )?;
    bar_panel(
        &panels[1],
        "Final-meld nodes visited per txn (Fig. 11)",
        "nodes per txn",
        &labels,
        &[("final meld", col(&|r| r.final_nodes_per_txn))],
        false,
    )?;
    bar_panel(
        &panels[2],
        "Conflict zone seen by final meld (Fig. 12, log scale)",
        "intentions",
        &labels,
        &[("zone", col(&|r| r.final_zone))],
        true,
    )?;
    bar_panel(
        &panels[3],
        "Nodes visited per txn by stage (Fig. 13)",
        "nodes per txn",
        &labels,
        &[
            ("final meld", col(&|r| r.final_nodes_per_txn)),
            ("premeld + group meld", col(&|r| r.prep_nodes_per_txn)),
        ],
        false,
    )?;
    root.present().map_err(|e| e.to_string())
}

/// The log suite's plots: appends/s vs clients, MiB/s vs record size,
/// recovery time vs log size.
pub fn log_plots(dir: &Path, r: &melddb_bench::logsvc::Results) -> Result<(), String> {
    register_font()?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let one: Vec<(f64, f64)> = r
        .clients
        .iter()
        .filter(|p| p.depth == 1)
        .map(|p| (p.clients as f64, p.ops_s))
        .collect();
    let p99: Vec<(f64, f64)> = r
        .clients
        .iter()
        .filter(|p| p.depth == 1)
        .map(|p| (p.clients as f64, p.p99_ms))
        .collect();
    line_chart(
        &dir.join("log-appends-vs-clients.png"),
        "Log service: 1 KiB appends/s vs concurrent clients (loopback, fsync)",
        "clients",
        "appends/s",
        true,
        &[("appends/s".into(), one)],
    )?;
    line_chart(
        &dir.join("log-p99-vs-clients.png"),
        "Log service: p99 append latency vs concurrent clients",
        "clients",
        "p99 ms",
        true,
        &[("p99 ms".into(), p99)],
    )?;
    let sizes: Vec<(f64, f64)> = r.sizes.iter().map(|p| (p.record as f64, p.mib_s)).collect();
    let flat =
        |v: f64| -> Vec<(f64, f64)> { r.sizes.iter().map(|p| (p.record as f64, v)).collect() };
    let raw = flat(r.disk_seq_write_mib_s);
    let adjacent = flat(r.disk_adjacent_mib_s);
    line_chart(
        &dir.join("log-mib-vs-record-size.png"),
        "Log service: payload MiB/s vs record size, and the raw disk",
        "record bytes",
        "MiB/s",
        true,
        &[
            ("log service payload".into(), sizes),
            ("raw sequential write, run start".into(), raw),
            ("raw sequential write, before 64 KiB".into(), adjacent),
        ],
    )?;
    let rec: Vec<(f64, f64)> = r.recovery.iter().map(|(m, s)| (*m, *s)).collect();
    line_chart(
        &dir.join("log-recovery.png"),
        "Log service: recovery time vs log size",
        "MiB of segments",
        "seconds",
        false,
        &[("recovery".into(), rec)],
    )
}

/// Embedded suite: 8r2w throughput per engine against client threads, and
/// the long run's in-memory-only state and log size over time.
pub fn embedded_plots(
    dir: &Path,
    cells: &[melddb_bench::embedded::Cell],
    samples: &[melddb_bench::embedded::Sample],
) -> Result<(), String> {
    use melddb_bench::embedded::Mix;
    register_font()?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    // Each engine once, in the order the cells first name it.
    let mut engines: Vec<&'static str> = Vec::new();
    for c in cells {
        if !engines.contains(&c.engine.name()) {
            engines.push(c.engine.name());
        }
    }
    let series: Vec<Series> = engines
        .iter()
        .map(|e| {
            let pts = cells
                .iter()
                .filter(|c| c.engine.name() == *e && c.mix == Mix::R8W2)
                .map(|c| (c.threads as f64, c.tps))
                .collect();
            (e.to_string(), pts)
        })
        .collect();
    line_chart(
        &dir.join("embedded-8r2w-tps.png"),
        "Embedded: 8-read/2-write serializable transactions/s vs client threads",
        "client threads",
        "committed tps",
        true,
        &series,
    )?;
    let un: Vec<(f64, f64)> = samples
        .iter()
        .map(|x| (x.t, x.unpersisted_nodes as f64))
        .collect();
    let log: Vec<(f64, f64)> = samples
        .iter()
        .map(|x| (x.t, x.log_bytes as f64 / 1024.0))
        .collect();
    line_chart(
        &dir.join("embedded-unpersisted.png"),
        "Embedded long run: reachable ephemeral nodes not yet in a checkpoint",
        "seconds",
        "nodes",
        false,
        &[("unpersisted ephemeral nodes".into(), un)],
    )?;
    line_chart(
        &dir.join("embedded-log-size.png"),
        "Embedded long run: log on disk with checkpoints and trimming",
        "seconds",
        "KiB",
        false,
        &[("log segment bytes (KiB)".into(), log)],
    )
}
