//! Starting and stopping the suite's services, their spare segments, and
//! the scrub of a recovered store.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use melddb_log::{Config, Running, Store};
use serde::Serialize;

use super::{config, DATA_SHARDS};

/// Waits until `store` has all its spares again (the refill runs while the
/// log is quiet); returns the seconds waited. Stops early when the refill
/// says a spare failed (a disk under the spares' free-space rule, most
/// likely: it would only retry every 10 s, for ever), and at
/// [`SETTLE_MAX`] at the latest.
pub(super) async fn settle(store: &Store, spares: SparesOpt) -> f64 {
    let want = spares.wanted(store.config().zones.len());
    let t = Instant::now();
    let failed_before = store.stats().spares_failed;
    if store.stats().spares_ready < want {
        eprintln!("  waiting for the spares' refill ...");
    }
    loop {
        let s = store.stats();
        if s.spares_ready >= want {
            break;
        }
        if s.spares_failed > failed_before {
            eprintln!(
                "  the refill failed to write a spare ({} of {want} ready; is the disk full, or under 1/20 free?); going on without the rest",
                s.spares_ready
            );
            break;
        }
        if t.elapsed() > SETTLE_MAX {
            eprintln!(
                "  the refill has not finished after {} s ({} of {want} spares ready); going on without the rest",
                SETTLE_MAX.as_secs(),
                s.spares_ready
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t.elapsed().as_secs_f64()
}

/// The longest [`settle`] waits for the spares' refill.
const SETTLE_MAX: Duration = Duration::from_secs(300);

pub(super) async fn start(dir: &Path) -> Result<(Arc<Store>, Running), String> {
    start_with(config(dir, DATA_SHARDS)).await
}

/// Spare segments for a run (`prepared_segments`): how many per zone, the
/// background refill's rate, and whether the run waits until the refill
/// after the open is done (the state of a service whose spares are ready).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SparesOpt {
    /// Spares kept ready per zone (0: segments start as empty files).
    pub per_zone: u32,
    /// Refill rate, MiB/s (0: unlimited).
    pub mib_s: u32,
    /// Wait for the refill before the load starts.
    pub wait: bool,
}

impl SparesOpt {
    /// Spares kept ready over `zones` zones.
    pub fn wanted(&self, zones: usize) -> u64 {
        u64::from(self.per_zone) * zones as u64
    }

    /// The suite's configuration over `dir` with these spares and
    /// `data_shards` data pages per stripe.
    pub(super) fn config(&self, dir: &Path, data_shards: usize) -> Config {
        let mut c = config(dir, data_shards);
        c.prepared_segments = self.per_zone;
        c.tuning.prepare_mib_s = self.mib_s;
        c
    }
}

/// Starts a service on `cfg` (made by `spares.config`), waiting for the
/// refill if asked (progress to stderr); returns it and the seconds from
/// the open to the spares being ready (the background refill writes those
/// not on disk yet once the log is quiet).
pub(super) async fn start_prepared(
    cfg: Config,
    spares: SparesOpt,
) -> Result<(Arc<Store>, Running, f64), String> {
    if spares.per_zone > 0 {
        eprintln!(
            "opening with {} spare segments of {} MiB (written in the background once the log is quiet) ...",
            spares.per_zone as usize * cfg.zones.len(),
            cfg.segment_bytes >> 20
        );
    }
    let t = Instant::now();
    let (store, running) = start_with(cfg).await?;
    if spares.wait {
        settle(&store, spares).await;
    }
    Ok((store, running, t.elapsed().as_secs_f64()))
}

pub(super) async fn start_with(cfg: Config) -> Result<(Arc<Store>, Running), String> {
    let store = tokio::task::spawn_blocking(move || Store::open(cfg))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let store = Arc::new(store);
    let running = melddb_log::start_on(store.clone(), "127.0.0.1:0", "127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    Ok((store, running))
}

pub(super) async fn stop(store: Arc<Store>, running: Running) {
    running.shutdown().await;
    let _ = tokio::task::spawn_blocking(move || store.shutdown()).await;
}

/// What one scrub read and how long it took.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ScrubRun {
    /// MiB of stripe pages read and checked.
    pub mib: f64,
    /// Seconds.
    pub secs: f64,
    /// Live stripes.
    pub stripes: u64,
    /// End-writes whose three copies were read.
    pub end_writes: u64,
    /// Pages (and end-write copies) found bad; 0 on a healthy store.
    pub bad_pages: u64,
}

/// Scrubs `store`, timed.
pub(super) fn scrub(store: &Store) -> ScrubRun {
    let t = Instant::now();
    let mut bytes = 0;
    let report = store.scrub_with_progress(&mut |p| bytes = p.bytes_done);
    ScrubRun {
        mib: bytes as f64 / (1 << 20) as f64,
        secs: t.elapsed().as_secs_f64(),
        stripes: report.stripes,
        end_writes: report.end_writes,
        bad_pages: report.bad_pages + report.bad_end_write_copies + report.bad_markers,
    }
}
