//! Catch-up: how fast one client reads a log from its start, as a node
//! joining late or coming back reads the intentions it missed, through a
//! batched subscription ([`melddb_log::Client::subscribe_batches`]).

use std::time::Instant;

use melddb_log::Client;
use serde::Serialize;

/// Bytes of each record the catch-up reads.
const RECORD: usize = 1024;

/// Records per append batch when filling the log.
const FILL_BATCH: usize = 64;

/// Connections filling the log at once.
const FILL_CLIENTS: u64 = 8;

/// One catch-up run.
#[derive(Debug, Clone, Serialize)]
pub struct Catchup {
    /// Records of 1 KiB read, from position 0 to the tail.
    pub entries: u64,
    /// Seconds from subscribing to the last record received.
    pub secs: f64,
    /// Records per second.
    pub entries_per_s: f64,
}

/// Appends `entries` records of 1 KiB to `log` (which must be empty),
/// then reads them all back from position 0 with one client's batched
/// subscription, checking each record's length.
pub(super) async fn catchup(addr: &str, log: &str, entries: u64) -> Result<Catchup, String> {
    let mut fill = Vec::new();
    for c in 0..FILL_CLIENTS {
        let client = Client::connect(addr).await.map_err(|e| e.to_string())?;
        let log = log.to_string();
        let share = entries / FILL_CLIENTS + u64::from(c < entries % FILL_CLIENTS);
        fill.push(tokio::spawn(async move {
            let body = bytes::Bytes::from(vec![c as u8; RECORD]);
            let mut left = share;
            while left > 0 {
                let n = left.min(FILL_BATCH as u64);
                client
                    .append_batch(&log, vec![body.clone(); n as usize])
                    .await
                    .map_err(|e| e.to_string())?;
                left -= n;
            }
            Ok::<(), String>(())
        }));
    }
    for f in fill {
        f.await.map_err(|e| e.to_string())??;
    }
    let client = Client::connect(addr).await.map_err(|e| e.to_string())?;
    let t = Instant::now();
    let mut sub = client.subscribe_batches(log, 0);
    while sub.position() < entries {
        let (_, records) = sub.next_batch().await.map_err(|e| e.to_string())?;
        if let Some(r) = records.iter().find(|r| r.len() != RECORD) {
            return Err(format!(
                "catch-up read a record of {} bytes, not {RECORD}",
                r.len()
            ));
        }
    }
    let secs = t.elapsed().as_secs_f64();
    Ok(Catchup {
        entries,
        secs,
        entries_per_s: entries as f64 / secs.max(1e-9),
    })
}
