//! The load the suite drives the service with: closed loops, open loops
//! with Poisson arrivals, and random reads, each returning a [`Point`].

use std::time::{Duration, Instant};

use melddb_log::Client;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Point;

/// Waits for the load tasks and turns their latencies (ms) into a point;
/// throughput is over the measured wall time (at least `secs`).
#[allow(clippy::too_many_arguments)]
pub(super) async fn finish(
    tasks: Vec<tokio::task::JoinHandle<Vec<f64>>>,
    label: &str,
    clients: usize,
    depth: usize,
    batch: usize,
    record: usize,
    secs: f64,
) -> Result<Point, String> {
    let t0 = Instant::now();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.map_err(|e| e.to_string())?);
    }
    let secs = t0.elapsed().as_secs_f64().max(secs);
    Ok(Point::from_latencies(
        label,
        [clients, depth, batch, record],
        lat,
        secs,
    ))
}

/// Closed loop: `clients` connections, each with `depth` appends in
/// flight, for `secs`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn closed_loop(
    addr: &str,
    label: &str,
    clients: usize,
    depth: usize,
    batch: usize,
    record: usize,
    secs: f64,
) -> Result<Point, String> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = Client::connect(addr).await.map_err(|e| e.to_string())?;
        for d in 0..depth {
            let client = client.clone();
            let body = bytes::Bytes::from(vec![(c * 31 + d) as u8; record]);
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let ok = if batch == 1 {
                        client.append("bench", body.clone()).await.is_ok()
                    } else {
                        client
                            .append_batch("bench", vec![body.clone(); batch])
                            .await
                            .is_ok()
                    };
                    if !ok {
                        break;
                    }
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    lat.extend(std::iter::repeat_n(ms, batch));
                }
                lat
            }));
        }
    }
    finish(tasks, label, clients, depth, batch, record, secs).await
}

/// Open loop at `rate` appends/s spread over `clients` connections, in
/// requests of `batch` records; latency counts from the scheduled send
/// time, so queueing shows.
pub(super) async fn open_loop(
    addr: &str,
    clients: usize,
    batch: usize,
    record: usize,
    rate: f64,
    secs: f64,
) -> Result<Point, String> {
    let mut senders = Vec::new();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = Client::connect(addr).await.map_err(|e| e.to_string())?;
        let body = bytes::Bytes::from(vec![c as u8; record]);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
        senders.push(tx);
        tasks.push(tokio::spawn(async move {
            // Requests that ended are reaped at each arrival, not all at
            // the end: every request's task kept until the arrivals end
            // and awaited only then puts a stall of milliseconds in the
            // point's last tens of milliseconds, which the tail shows.
            let mut inflight = tokio::task::JoinSet::new();
            let mut lat = Vec::new();
            let mut reap = |r: Result<Option<f64>, tokio::task::JoinError>| {
                if let Ok(Some(l)) = r {
                    lat.extend(std::iter::repeat_n(l, batch));
                }
            };
            while let Some(due) = rx.recv().await {
                let client = client.clone();
                let body = body.clone();
                inflight.spawn(async move {
                    if batch == 1 {
                        client.append("half", body).await.ok()?;
                    } else {
                        client.append_batch("half", vec![body; batch]).await.ok()?;
                    }
                    Some(due.elapsed().as_secs_f64() * 1e3)
                });
                while let Some(r) = inflight.try_join_next() {
                    reap(r);
                }
            }
            while let Some(r) = inflight.join_next().await {
                reap(r);
            }
            lat
        }));
    }
    // The arrivals come from a thread of their own that sleeps until each
    // one is due: tokio's timer fires on millisecond ticks, up to a
    // millisecond late, and that lateness (counted as latency, since
    // latency runs from the scheduled time) would be most of a light
    // load's median. One Poisson stream at `rate` (exponential gaps), each
    // arrival sent by a client drawn at random: together the same as
    // `clients` independent Poisson streams, the usual open-loop model.
    // Fixed gaps per client would make every client send at the same
    // instants: bursts that measure the burst, not the load.
    let per = rate / batch as f64;
    let arrivals = std::thread::spawn(move || {
        let mut rng = ChaCha8Rng::seed_from_u64(0x0be7_1009);
        let start = Instant::now();
        let mut at = 0.0f64;
        // Until the deadline, not for a fixed count, so the rate over the
        // time taken is the rate asked for.
        loop {
            at += -(1.0 - rng.random::<f64>()).ln() / per;
            if at >= secs {
                break;
            }
            let due = start + Duration::from_secs_f64(at);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let c = rng.random_range(0..senders.len());
            if senders[c].send(due).is_err() {
                break;
            }
        }
        // Dropping the senders ends the client tasks.
    });
    let point = finish(
        tasks,
        "open loop at half the peak rate",
        clients,
        0,
        batch,
        record,
        0.0,
    )
    .await;
    arrivals
        .join()
        .map_err(|_| "the arrivals thread panicked".to_string())?;
    point
}

pub(super) async fn reads(
    addr: &str,
    clients: usize,
    depth: usize,
    tail: u64,
    secs: f64,
) -> Result<Point, String> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = Client::connect(addr).await.map_err(|e| e.to_string())?;
        for d in 0..depth {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut x = (c * 7919 + d * 104_729 + 1) as u64;
                while Instant::now() < deadline {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let t = Instant::now();
                    if client.read("bench", x % tail).await.is_err() {
                        break;
                    }
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                }
                lat
            }));
        }
    }
    finish(tasks, "random 1 KiB reads", clients, depth, 1, 1024, secs).await
}

/// A load point: `CLIENTSxDEPTHxBATCHxBYTES` (closed loop, for example
/// `64x4x64x1024`) or `CLIENTSxBATCHxBYTES@RATE` (open loop at RATE
/// records/s, Poisson arrivals).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum PointSpec {
    /// Clients, in flight per client, records per request, record bytes.
    Closed(usize, usize, usize, usize),
    /// Clients, records per request, record bytes, records/s.
    Open(usize, usize, usize, f64),
}

impl std::str::FromStr for PointSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<PointSpec, String> {
        let bad = || {
            format!(
                "bad load point {s:?}: expected CLIENTSxDEPTHxBATCHxBYTES (closed loop, e.g. 64x4x64x1024) or CLIENTSxBATCHxBYTES@RATE (open loop, e.g. 64x64x1024@90000)"
            )
        };
        let (dims, rate) = match s.split_once('@') {
            Some((d, r)) => (d, Some(r.parse::<f64>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let n: Vec<usize> = dims
            .split('x')
            .map(|v| v.parse::<usize>().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        if n.contains(&0) {
            return Err(bad());
        }
        match (rate, n.as_slice()) {
            (None, &[c, d, b, r]) => Ok(PointSpec::Closed(c, d, b, r)),
            (Some(rate), &[c, b, r]) if rate > 0.0 => Ok(PointSpec::Open(c, b, r, rate)),
            _ => Err(bad()),
        }
    }
}

/// Runs load point `spec` for `secs` against the service at `addr`.
pub(super) async fn run_point(addr: &str, spec: PointSpec, secs: f64) -> Result<Point, String> {
    match spec {
        PointSpec::Closed(c, d, b, r) => closed_loop(addr, "load point", c, d, b, r, secs).await,
        PointSpec::Open(c, b, r, rate) => open_loop(addr, c, b, r, rate, secs).await,
    }
}

#[cfg(test)]
mod tests {
    use super::PointSpec;

    #[test]
    fn load_points_parse_and_bad_ones_are_refused() {
        assert_eq!(
            "64x4x64x1024".parse::<PointSpec>(),
            Ok(PointSpec::Closed(64, 4, 64, 1024))
        );
        assert_eq!(
            "64x64x1024@90000".parse::<PointSpec>(),
            Ok(PointSpec::Open(64, 64, 1024, 90000.0))
        );
        for bad in [
            "",
            "64x4x64",
            "64x4x64x1024@5",
            "0x1x1x1",
            "1x1x1@0",
            "axbxcxd",
        ] {
            assert!(bad.parse::<PointSpec>().is_err(), "{bad:?} parsed");
        }
    }
}
