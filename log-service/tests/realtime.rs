//! `realtime_priority`: the writer and the fsync helpers run under
//! SCHED_FIFO when the system allows it, and the `realtime_threads` stat
//! says exactly how many do. One test in its own binary, so that no other
//! test's store has threads of the same names in this process.

#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};

mod common;

use common::fifo_allowed;
use melddb_log::{Config, Store};

fn config(dir: &Path, priority: u8) -> Config {
    let zones: Vec<PathBuf> = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
    let mut c = Config::with_zones(zones);
    c.page_bytes = 4096;
    c.segment_bytes = 64 << 10;
    c.max_record_bytes = 256 << 10;
    c.realtime_priority = priority;
    c
}

/// (scheduling policy, real-time priority) of this process's threads on
/// the append path (thread names are cut to 15 bytes by the kernel).
fn append_path_threads() -> Vec<(String, u32, u32)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = e.unwrap().path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue; // the thread ended meanwhile
        };
        let comm = comm.trim().to_string();
        if !(comm.starts_with("melddb-log-writ") || comm.starts_with("melddb-log-fsyn")) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        // Fields after the name (which may hold spaces) start at field 3;
        // rt_priority is field 40 and policy field 41 (proc(5)).
        let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        let field = |n: usize| rest[n - 3].parse::<u32>().unwrap();
        v.push((comm, field(41), field(40)));
    }
    v
}

#[test]
fn realtime_priority_reaches_the_append_path_threads_or_is_reported_refused() {
    const SCHED_OTHER: u32 = 0;
    const SCHED_FIFO: u32 = 1;
    let dir = tempfile::tempdir().unwrap();

    // Off (the default): ordinary threads, nothing counted.
    let store = Store::open(config(dir.path(), 0)).unwrap();
    assert_eq!(store.append_blocking("a", 0, 0, b"x".to_vec()).unwrap(), 0);
    let threads = append_path_threads();
    // The writer and one helper per zone and end-write copy.
    assert_eq!(threads.len(), 1 + 3 + 3, "{threads:?}");
    assert!(threads.iter().all(|t| t.1 == SCHED_OTHER), "{threads:?}");
    assert_eq!(store.stats().realtime_threads, 0);
    drop(store);

    // On: every thread got it, or (no CAP_SYS_NICE here) none did and the
    // stat says 0. Either way the stat matches what the kernel reports,
    // as soon as the open returns.
    let store = Store::open(config(dir.path(), 7)).unwrap();
    let threads = append_path_threads();
    assert_eq!(threads.len(), 7, "{threads:?}");
    let fifo = threads
        .iter()
        .filter(|t| t.1 == SCHED_FIFO && t.2 == 7)
        .count() as u64;
    let counted = store.stats().realtime_threads;
    assert_eq!(
        counted, fifo,
        "the stat and the kernel disagree: {threads:?}"
    );
    assert!(fifo == 0 || fifo == 7, "some threads only: {threads:?}");
    // Where a thread of this process can take SCHED_FIFO itself, the
    // store's threads must have taken it: a refusal is no excuse here.
    assert!(
        fifo == 7 || !fifo_allowed(7),
        "the system allows SCHED_FIFO 7 but the store's threads did not take it: {threads:?}"
    );
    if fifo == 0 {
        eprintln!(
            "real-time priority refused here (no CAP_SYS_NICE); only the refusal was checked"
        );
    }
    assert_eq!(store.append_blocking("a", 0, 0, b"y".to_vec()).unwrap(), 1);
    assert_eq!(&store.read("a", 1).unwrap()[..], b"y");
    drop(store);
}
