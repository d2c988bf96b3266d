//! `tuning.disable_transparent_huge_pages`: the store's open leaves
//! transparent huge pages alone by default (a process-wide setting is the
//! embedding program's), turns them off for the whole process when told
//! to, and `thp_disabled` in the stats reports the process's state.
//! One test in its own binary: the switch is per process, so no other
//! test's store may flip it meanwhile.

#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};

use melddb_log::{Config, Store};

fn config(dir: &Path, disable: bool) -> Config {
    let zones: Vec<PathBuf> = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
    let mut c = Config::with_zones(zones);
    c.page_bytes = 4096;
    c.segment_bytes = 64 << 10;
    c.max_record_bytes = 256 << 10;
    c.prepared_segments = 0;
    c.tuning.disable_transparent_huge_pages = disable;
    c
}

/// The kernel's own view of the process: `THP_enabled` in
/// /proc/self/status is 0 once `PR_SET_THP_DISABLE` is set (Linux 5.0+).
fn thp_enabled_for_process() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("THP_enabled:"))
        .expect("THP_enabled in /proc/self/status (Linux 5.0 or later)");
    match line.split_whitespace().nth(1) {
        Some("1") => true,
        Some("0") => false,
        other => panic!("unexpected THP_enabled value {other:?}"),
    }
}

#[test]
fn the_open_turns_transparent_huge_pages_off_only_when_told_to() {
    // A known start, whatever the parent process passed down.
    rustix::thread::disable_transparent_huge_pages(false).unwrap();
    assert!(thp_enabled_for_process());
    let dir = tempfile::tempdir().unwrap();

    // By default the process keeps THP, and the stats say so.
    let mut default = Config::with_zones(config(dir.path(), false).zones);
    default.page_bytes = 4096;
    default.segment_bytes = 64 << 10;
    default.max_record_bytes = 256 << 10;
    default.prepared_segments = 0;
    assert!(!default.tuning.disable_transparent_huge_pages);
    let store = Store::open(default).unwrap();
    assert_eq!(store.append_blocking("a", 0, 0, b"x".to_vec()).unwrap(), 0);
    assert!(thp_enabled_for_process());
    assert!(!store.stats().thp_disabled);
    store.shutdown();

    // Told to, the open turns it off before recovery; appends and reads
    // work as before, and the stats agree with the kernel.
    let store = Store::open(config(dir.path(), true)).unwrap();
    assert!(!thp_enabled_for_process());
    assert!(store.stats().thp_disabled);
    assert_eq!(store.append_blocking("a", 0, 0, b"y".to_vec()).unwrap(), 1);
    assert_eq!(&store.read("a", 0).unwrap()[..], b"x");
    assert_eq!(&store.read("a", 1).unwrap()[..], b"y");
    store.shutdown();

    // The stat reads the process's state, not the option: THP turned off by
    // whoever started the process shows with the option off too.
    let store = Store::open(config(dir.path(), false)).unwrap();
    assert!(store.stats().thp_disabled);
    store.shutdown();
}
