//! `/metrics`: the store's and the network's counters and gauges, and
//! the latency histograms of every append stage, in the OpenMetrics text
//! format for Prometheus.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response as HttpResponse};

use super::context::Ctx;
use super::http::http_error;

/// `GET /metrics`: every counter, gauge and stage histogram.
pub(super) async fn metrics(State(ctx): State<Arc<Ctx>>) -> HttpResponse {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::registry::Registry;
    let s = ctx.store.stats();
    let m = &ctx.metrics;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut reg = Registry::with_prefix("melddb_log");
    let counters: [(&str, &str, u64); 25] = [
        ("appends", "Acknowledged appends", s.appends),
        (
            "append_bytes",
            "Bytes of acknowledged appends",
            s.append_bytes,
        ),
        ("batches", "Writer batches", s.batches),
        ("stripes", "Stripes written", s.stripes),
        (
            "bytes_written",
            "Bytes written to segments (pages, parity, end-writes)",
            s.bytes_written,
        ),
        ("fsyncs", "fsync calls", s.fsyncs),
        (
            "write_backs",
            "Segment files written back without their own fsync, made durable by the round's device flush",
            s.write_backs,
        ),
        (
            "flushes",
            "Device cache flushes ending fsync rounds with write-back files",
            s.flushes,
        ),
        (
            "rounds_on_writer",
            "fsync rounds the writer ran itself (small batches) instead of the helpers",
            s.rounds_on_writer,
        ),
        (
            "direct_write_bytes",
            "Bytes written to segments with O_DIRECT by the fsync helpers, not through the page cache",
            s.direct_write_bytes,
        ),
        (
            "write_us",
            "Microseconds the writer spent building and writing batches",
            s.write_us,
        ),
        (
            "sync_us",
            "Microseconds the writer waited for fsync rounds",
            s.sync_us,
        ),
        ("reads", "Record reads", s.reads),
        (
            "reads_whole_stripe",
            "Reads answered from whole stripes: records spanning stripes, or record bytes that failed their checksum",
            s.reads_whole_stripe,
        ),
        (
            "pages_rebuilt",
            "Pages rebuilt from parity on read",
            s.pages_rebuilt,
        ),
        (
            "segments_repaired",
            "Segment files rebuilt",
            s.segments_repaired,
        ),
        (
            "write_failures",
            "Append batches that failed",
            s.write_failures,
        ),
        (
            "segments_freed",
            "Segment files freed by trim",
            s.segments_freed,
        ),
        (
            "segments_prepared",
            "Spare segment files written full of zeros (prepared_segments)",
            s.segments_prepared,
        ),
        (
            "spares_failed",
            "Spare segments whose writing failed (a full disk, most likely); retried every 10 s",
            s.spares_failed,
        ),
        (
            "connections",
            "Connections accepted",
            g(&m.connections_total),
        ),
        (
            "connections_refused",
            "Connections refused at the limit",
            g(&m.connections_refused),
        ),
        ("frames_in", "Protocol frames received", g(&m.frames_in)),
        (
            "error_frames",
            "Malformed, oversized or refused frames",
            g(&m.error_frames),
        ),
        (
            "auth_failures",
            "Requests with a missing or unknown token",
            g(&m.auth_failures),
        ),
    ];
    for (name, help, v) in counters {
        let c: Counter = Counter::default();
        c.inc_by(v);
        reg.register(name, help, c);
    }
    let gauges: [(&str, &str, u64); 5] = [
        (
            "connections_open",
            "Open connections",
            g(&m.connections_open),
        ),
        ("segments", "Segment files", s.segments),
        ("http_requests", "HTTP API requests", g(&m.http_requests)),
        (
            "durable",
            "1 if appends are synced to the disk before they are acknowledged (fsync = true)",
            u64::from(s.durable),
        ),
        (
            "thp_disabled",
            "1 if transparent huge pages are off for the service's process",
            u64::from(s.thp_disabled),
        ),
    ];
    for (name, help, v) in gauges {
        let gg: Gauge = Gauge::default();
        gg.set(v as i64);
        reg.register(name, help, gg);
    }
    // An info-style gauge: 1 per device, the scheduler in a label, so a
    // dashboard shows which queue the latencies were measured on.
    let schedulers: Family<Vec<(String, String)>, Gauge> = Family::default();
    for d in &s.io_schedulers {
        schedulers
            .get_or_create(&vec![
                ("device".to_string(), d.device.clone()),
                ("scheduler".to_string(), d.scheduler.clone()),
            ])
            .set(1);
    }
    reg.register(
        "io_scheduler",
        "1 for each block device under the zones, labelled with the I/O scheduler its queue ran when the service opened",
        schedulers,
    );
    let stages = ctx.store.stages();
    for (info, h) in stages.rows() {
        reg.register(info.metric, info.help, h.clone());
    }
    let mut out = String::new();
    if encode(&mut out, &reg).is_err() {
        return http_error(StatusCode::INTERNAL_SERVER_ERROR, "metrics encoding failed");
    }
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        out,
    )
        .into_response()
}
