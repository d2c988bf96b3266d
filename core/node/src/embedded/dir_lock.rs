//! One open [`Database`](crate::Database) per directory: the directory's
//! `lock` file is `flock`ed from the start of the open until the database
//! is dropped.
//!
//! Two databases on one directory would each append at their own
//! in-memory tail and overwrite each other's records: acknowledged commits
//! would be lost and the log would still verify. The lock is taken before
//! the log is opened, created or recovered, so a refused opener changes
//! nothing. `flock` locks die with the process, so a killed process leaves
//! nothing to clean up, and they belong to the open file, so a second open
//! in the same process is refused too.

use std::fs::File;
use std::path::Path;

use super::error::DbError;
use crate::filelog::FileLogError;

/// The lock file's name inside a database directory.
pub const LOCK_FILE: &str = "lock";

/// A database directory's lock, held until dropped.
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
}

impl DirLock {
    /// Creates `dir` if needed and locks it. Fails with
    /// [`DbError::Locked`] if another open database holds it, naming the
    /// holder's process when it wrote it.
    pub(crate) fn take(dir: &Path) -> Result<DirLock, DbError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| {
            DbError::from(FileLogError::Io {
                path: path.clone(),
                source,
            })
        };
        std::fs::create_dir_all(dir).map_err(|source| {
            DbError::from(FileLogError::Io {
                path: dir.to_path_buf(),
                source,
            })
        })?;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        if !os::try_lock(&file).map_err(io)? {
            return Err(DbError::Locked {
                path: dir.to_path_buf(),
                holder: holder(&mut file),
            });
        }
        write_holder(&mut file).map_err(io)?;
        Ok(DirLock { _file: file })
    }
}

/// The holder's process id, for the message a refused opener prints. Not
/// synced: it is a hint, and a stale one is only read while nobody holds
/// the lock, which nobody does then.
fn write_holder(file: &mut File) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    writeln!(file, "{}", std::process::id())
}

/// The process id a holder wrote into its lock file, if it did.
fn holder(file: &mut File) -> Option<u32> {
    use std::io::Read;
    let mut text = String::new();
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(unix)]
mod os {
    use std::fs::File;

    /// Takes an exclusive `flock` without waiting: `Ok(false)` if someone
    /// holds it.
    pub(super) fn try_lock(file: &File) -> std::io::Result<bool> {
        use rustix::fs::{flock, FlockOperation};
        match flock(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(true),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(not(unix))]
mod os {
    use std::fs::File;

    /// No file locks on this platform with the supported toolchain: the
    /// directory is not protected against a second opener.
    pub(super) fn try_lock(_file: &File) -> std::io::Result<bool> {
        Ok(true)
    }
}
