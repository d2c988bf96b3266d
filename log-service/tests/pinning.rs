//! `writer_cpu`, in a test binary of its own: it finds the store's
//! threads by name among the process's, and another test's store in the
//! same process would have threads of the same names.

#![cfg(target_os = "linux")]

mod common;

use common::small_config;
use melddb_log::Store;

/// The CPUs thread `tid` of this process may run on, from `/proc`.
fn cpus_of(tid: &str) -> Vec<usize> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    list.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<usize>>(),
            None => vec![part.parse().unwrap()],
        })
        .collect()
}

/// This process's threads whose name starts with `prefix`: their CPUs.
fn threads_named(prefix: &str) -> Vec<Vec<usize>> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| {
            let tid = e.ok()?.file_name().to_string_lossy().to_string();
            let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
            comm.trim().starts_with(prefix).then(|| cpus_of(&tid))
        })
        .collect()
}

/// `writer_cpu`: the writer runs on that CPU alone, the fsync helpers and
/// the spares refill on every other CPU the process has and never on
/// it, and the stats count them; the store works as before. A CPU the
/// process may not use, or its only one, is refused at the open, naming
/// the ones it may;
/// `keep_off_cpu` moves a thread of the embedding program off the CPU.
#[test]
fn writer_cpu_gives_the_writer_a_cpu_of_its_own_and_keeps_the_store_s_other_threads_off_it() {
    let process = cpus_of(&std::process::id().to_string());
    if process.len() < 2 {
        common::skip("the process may use one CPU only");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.prepared_segments = 1;
    let not_ours = (0..4096).find(|c| !process.contains(c)).unwrap();
    cfg.writer_cpu = Some(not_ours);
    let e = Store::open(cfg.clone())
        .err()
        .expect("a CPU the process may not use");
    assert!(
        e.to_string().contains("writer_cpu") && e.to_string().contains("may use"),
        "{e}"
    );
    // The last CPU, so that the pinned threads differ from their default.
    let cpu = *process.last().unwrap();
    cfg.writer_cpu = Some(cpu);
    // A process that may run on that CPU alone (its main thread's CPUs
    // are what the open checks): the writer would share it with every
    // thread it wakes, so the open refuses.
    let pid = rustix::process::getpid();
    let saved = rustix::thread::sched_getaffinity(Some(pid)).unwrap();
    let mut one = rustix::thread::CpuSet::new();
    one.set(cpu);
    rustix::thread::sched_setaffinity(Some(pid), &one).unwrap();
    let refused = Store::open(cfg.clone()).err();
    rustix::thread::sched_setaffinity(Some(pid), &saved).unwrap();
    let e = refused.expect("the process's only CPU");
    assert!(e.to_string().contains("the only CPU"), "{e}");
    let store = Store::open(cfg).unwrap();
    let writers = threads_named("melddb-log-writ");
    assert_eq!(writers, vec![vec![cpu]], "the writer, on its CPU alone");
    let others: Vec<usize> = process.iter().copied().filter(|&c| c != cpu).collect();
    let helpers = threads_named("melddb-log-fsyn");
    assert!(!helpers.is_empty());
    for t in helpers.iter().chain(&threads_named("melddb-log-spar")) {
        assert_eq!(t, &others, "a helper or the refill, on every other CPU");
    }
    // The writer, each helper and the refill.
    assert_eq!(store.stats().pinned_threads, helpers.len() as u64 + 2);
    for i in 0..50u64 {
        assert_eq!(
            store
                .append_blocking("p", 1, i, vec![i as u8; 500])
                .unwrap(),
            i
        );
    }
    let embedder = std::thread::spawn(move || {
        melddb_log::keep_off_cpu(cpu).unwrap();
        rustix::thread::sched_getaffinity(None).unwrap().is_set(cpu)
    });
    assert!(!embedder.join().unwrap(), "keep_off_cpu moved the thread");
    drop(store);
}
