//! `slice_us`: the writer and the fsync helpers run with that time slice,
//! the background threads keep the system's, real-time threads keep
//! their policy, and the `short_slice_threads` stat counts exactly the
//! threads the kernel reports it for. One test in its own binary, so
//! that no other test's store has threads of the same names in this
//! process.

#![cfg(target_os = "linux")]

mod common;

use common::{fifo_allowed, small_config};
use melddb_log::Store;

/// A slice no kernel default comes to, so that a thread has it only if
/// it was given.
const SLICE_US: u32 = 300;

/// A thread's scheduling attributes (pid 0: the calling thread).
fn attr_of(tid: i32) -> Option<libc::sched_attr> {
    let mut attr = libc::sched_attr {
        size: 0,
        sched_policy: 0,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: 0,
        sched_deadline: 0,
        sched_period: 0,
    };
    let size = std::mem::size_of::<libc::sched_attr>() as libc::c_uint;
    // SAFETY: `attr` is a writable sched_attr of `size` bytes for the
    // call's duration.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut libc::sched_attr,
            size,
            0,
        )
    };
    (r == 0).then_some(attr)
}

/// (name, policy, slice in ns) of this process's threads whose name
/// starts with one of `prefixes` (names are cut to 15 bytes).
fn threads(prefixes: &[&str]) -> Vec<(String, u32, u64)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let e = e.unwrap();
        let Ok(comm) = std::fs::read_to_string(e.path().join("comm")) else {
            continue; // the thread ended meanwhile
        };
        let comm = comm.trim().to_string();
        if !prefixes.iter().any(|p| comm.starts_with(p)) {
            continue;
        }
        let tid: i32 = e.file_name().to_string_lossy().parse().unwrap();
        if let Some(a) = attr_of(tid) {
            v.push((comm, a.sched_policy, a.sched_runtime));
        }
    }
    v
}

/// Whether this kernel gives an ordinary thread a slice it asks for
/// (custom slices came with Linux 6.12), tried on a thread of its own.
fn kernel_has_custom_slices() -> bool {
    std::thread::spawn(|| {
        let Some(mut attr) = attr_of(0) else {
            return false;
        };
        attr.size = std::mem::size_of::<libc::sched_attr>() as u32;
        attr.sched_runtime = u64::from(SLICE_US) * 1_000;
        // SAFETY: `attr` is a complete sched_attr, read by the kernel only.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sched_setattr,
                0,
                &attr as *const libc::sched_attr,
                0,
            )
        };
        r == 0 && attr_of(0).is_some_and(|a| a.sched_runtime == u64::from(SLICE_US) * 1_000)
    })
    .join()
    .unwrap()
}

#[test]
fn slice_us_reaches_the_writer_and_the_helpers_and_nothing_else() {
    let want = u64::from(SLICE_US) * 1_000;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.prepared_segments = 1;

    // Off (the default): no thread has the slice, none is counted.
    let store = Store::open(cfg.clone()).unwrap();
    let path = threads(&["melddb-log-writ", "melddb-log-fsyn"]);
    assert!(!path.is_empty());
    assert!(path.iter().all(|t| t.2 != want), "{path:?}");
    assert_eq!(store.stats().short_slice_threads, 0);
    drop(store);

    // On: the writer and every helper have it and are counted; the
    // refill (background work) keeps the system's slice.
    cfg.slice_us = SLICE_US;
    let store = Store::open(cfg.clone()).unwrap();
    let path = threads(&["melddb-log-writ", "melddb-log-fsyn"]);
    assert!(path.len() >= 2, "{path:?}");
    let background = threads(&["melddb-log-spar"]);
    assert_eq!(background.len(), 1, "the refill thread");
    assert!(background.iter().all(|t| t.2 != want), "{background:?}");
    if kernel_has_custom_slices() {
        assert!(
            path.iter()
                .all(|t| t.1 == libc::SCHED_OTHER as u32 && t.2 == want),
            "{path:?}"
        );
        assert_eq!(store.stats().short_slice_threads, path.len() as u64);
    } else {
        eprintln!("this kernel has no custom slices: only the stat was checked");
        assert_eq!(store.stats().short_slice_threads, 0);
    }
    for i in 0..50u64 {
        assert_eq!(
            store
                .append_blocking("s", 1, i, vec![i as u8; 500])
                .unwrap(),
            i
        );
    }
    drop(store);

    // With real-time priority the threads stay SCHED_FIFO (a slice would
    // mean turning them back into ordinary threads) and none is counted.
    if fifo_allowed(7) {
        cfg.realtime_priority = 7;
        let store = Store::open(cfg).unwrap();
        let path = threads(&["melddb-log-writ", "melddb-log-fsyn"]);
        assert!(
            path.iter().all(|t| t.1 == libc::SCHED_FIFO as u32),
            "{path:?}"
        );
        assert_eq!(store.stats().short_slice_threads, 0);
        assert_eq!(store.append_blocking("r", 1, 0, vec![1; 10]).unwrap(), 0);
    } else {
        eprintln!("SCHED_FIFO refused here: the real-time case was not checked");
    }
}
