//! The I/O scheduler Linux runs for the block devices under the zones.
//!
//! Append latency at a steady load depends on the disk's queue as well as
//! on the service: `none` measured a lower p99 than the default
//! `mq-deadline` in three of four alternated pairs of probes. The service
//! never changes a system setting; it reads the scheduler at open, logs it
//! and reports it in its stats and metrics, so a latency figure can be
//! read with the queue it was measured on.

use std::path::Path;

use serde::Serialize;

/// One block device under the zones (or one configured raw device) and
/// the I/O scheduler its queue runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceScheduler {
    /// The device as `major:minor`, as `/sys/dev/block` and `lsblk` name it.
    pub device: String,
    /// The scheduler in use (`none`, `mq-deadline`, `kyber`, `bfq`, ...).
    pub scheduler: String,
}

/// The schedulers of the devices holding `paths` (zone directories or
/// raw devices), one entry per device, sorted by device. Paths on no
/// block device (tmpfs, overlay file systems in containers) and systems
/// without `/sys/dev/block` give no entry: this is a report, never an
/// error.
pub fn schedulers<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Vec<DeviceScheduler> {
    let mut out: Vec<DeviceScheduler> = Vec::new();
    for path in paths {
        let Some((major, minor)) = device_of(path) else {
            continue;
        };
        let device = format!("{major}:{minor}");
        if out.iter().any(|d| d.device == device) {
            continue;
        }
        if let Some(scheduler) = scheduler_of(Path::new("/sys"), major, minor) {
            out.push(DeviceScheduler { device, scheduler });
        }
    }
    out.sort_by(|a, b| a.device.cmp(&b.device));
    out
}

/// The device a path is on: its own number for a block device (a raw
/// segment device), the file system's for anything else.
#[cfg(target_os = "linux")]
fn device_of(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok()?;
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    Some((rustix::fs::major(dev), rustix::fs::minor(dev)))
}

#[cfg(not(target_os = "linux"))]
fn device_of(_path: &Path) -> Option<(u32, u32)> {
    None
}

/// The scheduler of device `major:minor` as `sys_root` (normally `/sys`)
/// shows it. A partition has no queue of its own: its disk's is one
/// directory up.
fn scheduler_of(sys_root: &Path, major: u32, minor: u32) -> Option<String> {
    let dev = sys_root.join(format!("dev/block/{major}:{minor}"));
    let text = std::fs::read_to_string(dev.join("queue/scheduler"))
        .or_else(|_| std::fs::read_to_string(dev.join("../queue/scheduler")))
        .ok()?;
    parse_scheduler(&text)
}

/// The scheduler in use from a `queue/scheduler` file: the bracketed
/// name among those available, or the only name when there is no choice
/// (devices without schedulers show a bare `none`).
fn parse_scheduler(text: &str) -> Option<String> {
    let names: Vec<&str> = text.split_whitespace().collect();
    if let Some(chosen) = names
        .iter()
        .find_map(|n| n.strip_prefix('[').and_then(|n| n.strip_suffix(']')))
    {
        return (!chosen.is_empty()).then(|| chosen.to_string());
    }
    match names.as_slice() {
        [only] => Some((*only).to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bracketed_name_is_the_scheduler_in_use() {
        assert_eq!(
            parse_scheduler("none [mq-deadline] kyber bfq\n").as_deref(),
            Some("mq-deadline")
        );
        assert_eq!(
            parse_scheduler("[none] mq-deadline kyber bfq\n").as_deref(),
            Some("none")
        );
        assert_eq!(parse_scheduler("none\n").as_deref(), Some("none"));
        // Several names and none chosen, or nothing at all: no answer
        // rather than a guess.
        assert_eq!(parse_scheduler("none mq-deadline\n"), None);
        assert_eq!(parse_scheduler(""), None);
        assert_eq!(parse_scheduler("[] none"), None);
    }

    /// A disk and one of its partitions laid out as sysfs lays them out:
    /// the partition's directory sits inside the disk's, and only the
    /// disk has a queue.
    #[cfg(unix)]
    #[test]
    fn a_partition_reports_its_disks_queue() {
        let sys = tempfile::tempdir().unwrap();
        let disk = sys.path().join("devices/virtio/block/vda");
        std::fs::create_dir_all(disk.join("queue")).unwrap();
        std::fs::create_dir_all(disk.join("vda1")).unwrap();
        std::fs::write(disk.join("queue/scheduler"), "[none] mq-deadline\n").unwrap();
        let links = sys.path().join("dev/block");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(&disk, links.join("253:0")).unwrap();
        std::os::unix::fs::symlink(disk.join("vda1"), links.join("253:1")).unwrap();
        assert_eq!(scheduler_of(sys.path(), 253, 0).as_deref(), Some("none"));
        assert_eq!(scheduler_of(sys.path(), 253, 1).as_deref(), Some("none"));
        assert_eq!(scheduler_of(sys.path(), 253, 2), None);
    }

    /// On this machine: the zones of one directory tree are one device,
    /// reported once, with the scheduler sysfs shows for it.
    #[cfg(target_os = "linux")]
    #[test]
    fn zones_on_one_disk_are_one_entry_matching_sysfs() {
        let root = tempfile::tempdir().unwrap();
        let zones: Vec<_> = (0..3).map(|z| root.path().join(format!("z{z}"))).collect();
        for z in &zones {
            std::fs::create_dir_all(z).unwrap();
        }
        let found = schedulers(zones.iter().map(|z| z.as_path()));
        let (major, minor) = device_of(root.path()).unwrap();
        match scheduler_of(Path::new("/sys"), major, minor) {
            Some(s) => assert_eq!(
                found,
                vec![DeviceScheduler {
                    device: format!("{major}:{minor}"),
                    scheduler: s
                }]
            ),
            // A temporary directory on tmpfs or overlay: no block device.
            None => assert!(found.is_empty(), "{found:?}"),
        }
    }
}
