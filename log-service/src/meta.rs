//! The small metadata file kept in every zone: trim points, tail floors
//! (so positions are never reused after a log is trimmed empty and its
//! segments freed), and the stripe numbers recovery must ignore.
//!
//! Written with write-to-temporary, fsync, rename, fsync-directory in every
//! zone; opened by taking the highest version that parses in any zone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::segment::sync_dir;

/// File name in each zone.
pub const FILE: &str = "meta.json";

/// Per-log persisted bounds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LogMeta {
    /// First readable position.
    pub first: u64,
    /// Positions below this were handed out; the tail never goes lower.
    pub tail_floor: u64,
}

/// The metadata.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Meta {
    /// Increases with every write.
    pub version: u64,
    /// Every stripe up to this one was complete when the file was written;
    /// recovery only looks for holes above it.
    pub stable_seq: u64,
    /// Stripe numbers whose pages may exist but which were never
    /// acknowledged (a failed write, or a hole found by recovery).
    pub discarded: Vec<(u64, u64)>,
    /// Stripe numbers below this are never handed out again.
    pub next_seq_floor: u64,
    /// The logs.
    pub logs: BTreeMap<String, LogMeta>,
}

impl Meta {
    /// Whether stripe `seq` was discarded.
    pub fn is_discarded(&self, seq: u64) -> bool {
        self.discarded.iter().any(|&(a, b)| a <= seq && seq <= b)
    }

    /// Loads the newest readable copy; `Ok(None)` if no zone has one,
    /// an error if copies exist but none parses.
    pub fn load(zones: &[PathBuf]) -> Result<Option<Meta>, String> {
        let mut best: Option<Meta> = None;
        let mut errors = Vec::new();
        for z in zones {
            let p = z.join(FILE);
            match std::fs::read(&p) {
                Ok(bytes) => match serde_json::from_slice::<Meta>(&bytes) {
                    Ok(m) => {
                        if best.as_ref().is_none_or(|b| m.version > b.version) {
                            best = Some(m);
                        }
                    }
                    Err(e) => errors.push(format!("{}: {e}", p.display())),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => errors.push(format!("{}: {e}", p.display())),
            }
        }
        match best {
            Some(m) => Ok(Some(m)),
            None if errors.is_empty() => Ok(None),
            None => Err(errors.join("; ")),
        }
    }

    /// Writes the next version to every zone.
    pub fn store(&mut self, zones: &[PathBuf]) -> std::io::Result<()> {
        self.version += 1;
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        for z in zones {
            write_atomic(z, &bytes)?;
        }
        Ok(())
    }
}

fn write_atomic(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join("meta.json.tmp");
    {
        let f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut &f, bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(FILE))?;
    sync_dir(dir)
}
