//! One process per zone directory: each zone's `lock` file is `flock`ed
//! from the store's open until it shuts down (`Store::shutdown`, which
//! dropping the store calls).
//!
//! Two services (or a service and `melddb-log check`) on the same zones
//! would both number segments, write end-write records and rewrite the
//! metadata, and the log would be lost. Devices are claimed by the device
//! layer; this covers the directories, which hold the metadata in either
//! layout. `flock` locks die with the process, so a kill -9 leaves nothing
//! to clean up, and they belong to the open file, so a second open in the
//! same process is refused too.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::OpenError;

/// The lock file's name inside each zone directory.
pub const LOCK_FILE: &str = "lock";

/// The zones' locks, held until dropped.
#[derive(Debug)]
pub(crate) struct ZoneLocks {
    _files: Vec<File>,
}

impl ZoneLocks {
    /// Creates each zone directory if needed and locks it, in zone order.
    /// Fails on the first zone another process holds, naming it and,
    /// when the holder wrote it, its process id.
    pub(crate) fn take(zones: &[PathBuf]) -> Result<ZoneLocks, OpenError> {
        let mut files = Vec::with_capacity(zones.len());
        for z in zones {
            files.push(lock_one(z)?);
        }
        Ok(ZoneLocks { _files: files })
    }
}

fn lock_one(zone: &Path) -> Result<File, OpenError> {
    let path = zone.join(LOCK_FILE);
    let io = |source| OpenError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(zone).map_err(|source| OpenError::Io {
        path: zone.to_path_buf(),
        source,
    })?;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
            return Err(OpenError::InUse {
                zone: zone.to_path_buf(),
                holder: holder(&mut file),
            });
        }
        Err(e) => return Err(io(e.into())),
    }
    // The holder's process id, for the message a second open prints. Not
    // synced: it is a hint, and a stale one only names a dead process
    // while nobody holds the lock, when nobody reads it.
    file.set_len(0).map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    writeln!(file, "{}", std::process::id()).map_err(io)?;
    Ok(file)
}

/// The process id a holder wrote into its lock file, if it did.
fn holder(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_a_zone_is_refused_with_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let zones: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("z{i}"))).collect();
        let first = ZoneLocks::take(&zones).unwrap();
        // Any zone in common is enough to refuse.
        let other = vec![dir.path().join("elsewhere"), zones[2].clone()];
        match ZoneLocks::take(&other) {
            Err(OpenError::InUse { zone, holder }) => {
                assert_eq!(zone, zones[2]);
                assert_eq!(holder, Some(std::process::id()));
            }
            other => panic!("expected InUse, got {other:?}"),
        }
        drop(first);
        let again = ZoneLocks::take(&other).unwrap();
        drop(again);
        ZoneLocks::take(&zones).unwrap();
    }

    #[test]
    fn a_lock_file_with_garbage_in_it_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let zone = dir.path().join("z");
        std::fs::create_dir_all(&zone).unwrap();
        std::fs::write(zone.join(LOCK_FILE), b"not a pid at all, and long\n").unwrap();
        let held = ZoneLocks::take(std::slice::from_ref(&zone)).unwrap();
        let text = std::fs::read_to_string(zone.join(LOCK_FILE)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        match ZoneLocks::take(std::slice::from_ref(&zone)) {
            Err(e @ OpenError::InUse { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(&format!("pid {}", std::process::id())),
                    "{msg}"
                );
                assert!(msg.contains("own zone directories"), "{msg}");
            }
            other => panic!("expected InUse, got {other:?}"),
        }
        drop(held);
    }
}
