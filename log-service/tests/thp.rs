//! `disable_transparent_huge_pages`: the store's open turns transparent
//! huge pages off for the whole process by default, leaves them alone when
//! told to, and `thp_disabled` in the stats reports the process's state.
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
    c.disable_transparent_huge_pages = disable;
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
fn the_open_turns_transparent_huge_pages_off_unless_told_not_to() {
    // A known start, whatever the parent process passed down.
    rustix::thread::disable_transparent_huge_pages(false).unwrap();
    assert!(thp_enabled_for_process());
    let dir = tempfile::tempdir().unwrap();

    // Told not to: the process keeps THP, and the stats say so.
    let store = Store::open(config(dir.path(), false)).unwrap();
    assert_eq!(store.append_blocking("a", 0, 0, b"x".to_vec()).unwrap(), 0);
    assert!(thp_enabled_for_process());
    assert!(!store.stats().thp_disabled);
    store.shutdown();

    // The default turns it off before recovery; appends and reads work as
    // before, and the stats agree with the kernel.
    assert!(Config::with_zones(vec![dir.path().into()]).disable_transparent_huge_pages);
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
