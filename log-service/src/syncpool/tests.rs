use super::*;

fn temp_files(n: usize) -> (tempfile::TempDir, Vec<Arc<SegFile>>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = (0..n)
        .map(|i| {
            let f = std::fs::File::create(dir.path().join(format!("f{i}"))).expect("create");
            Arc::new(SegFile::whole(f))
        })
        .collect();
    (dir, files)
}

fn synced(files: &[Arc<SegFile>]) -> Vec<(Arc<SegFile>, How)> {
    files.iter().map(|f| (f.clone(), How::Sync)).collect()
}

/// The round of `files`, each synced as given.
fn round_of(files: &[(Arc<SegFile>, How)]) -> Vec<RoundFile> {
    files
        .iter()
        .map(|(f, how)| RoundFile::sync(f.clone(), *how))
        .collect()
}

/// A pool of `helpers` threads whose syncs go through a fault
/// injector that records them (read with [`trace_of`]).
fn traced_pool(helpers: usize) -> (Arc<Faults>, SyncPool) {
    let faults = Arc::new(Faults::none());
    let pool = SyncPool::new(helpers, faults.clone());
    (faults, pool)
}

/// The fault injector's trace so far.
fn trace_of(faults: &Faults) -> Vec<(&'static str, u64, String)> {
    crate::locks::lock(&faults.trace).clone()
}

fn ino(f: &SegFile) -> u64 {
    use std::os::unix::fs::MetadataExt;
    f.file().metadata().expect("metadata").ino()
}

/// On the helpers, the held-back writes land in each file's order,
/// the late file after the others, and every file answers.
#[test]
fn held_back_writes_land_in_order_and_the_late_file_last() {
    let (faults, pool) = traced_pool(3);
    let bufs = crate::direct::BufPool::default();
    let (dir, files) = temp_files(3);
    let round = |tag: u8| -> Vec<RoundFile> {
        files
            .iter()
            .enumerate()
            .map(|(i, f)| RoundFile {
                file: f.clone(),
                how: How::Sync,
                writes: vec![
                    DeferredWrite::new(f.clone(), None, 0, &[tag; 3000], &bufs),
                    DeferredWrite::new(f.clone(), None, 1000, &[tag + 1; 1000], &bufs),
                ],
                late: i == 2,
            })
            .collect()
    };
    let check = |tag: u8| {
        for i in 0..3 {
            let got = std::fs::read(dir.path().join(format!("f{i}"))).expect("read");
            assert_eq!(got.len(), 3000);
            assert!(got[..1000].iter().all(|&b| b == tag));
            assert!(got[1000..2000].iter().all(|&b| b == tag + 1));
            assert!(got[2000..].iter().all(|&b| b == tag));
        }
    };
    // Slow syncs: a late file started with the others (a helper
    // each) would be written while they sync.
    faults.slow_syncs(std::time::Duration::from_millis(20));
    let r = pool.start(round(5), Arc::new(|| {})).wait();
    assert_eq!(r.len(), 3);
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    check(5);
    let trace = trace_of(&faults);
    let ops = |what: &str| trace.iter().filter(|t| t.0 == what).count();
    assert_eq!(
        (ops("deferred-write"), ops("fsync"), trace.len()),
        (6, 3, 9),
        "the helpers wrote and synced every file: {trace:?}"
    );
    assert!(
        trace[6..].iter().all(|t| t.1 == ino(&files[2])),
        "the late file after the others: {trace:?}"
    );
}

#[test]
fn the_plan_flushes_each_device_once_through_its_first_write_back_file() {
    use How::*;
    assert_eq!(flush_plan(&[Sync, Sync]), vec![]);
    assert_eq!(
        flush_plan(&[
            Sync,
            WriteBack(7),
            WriteBack(9),
            WriteBack(7),
            Sync,
            WriteBack(9)
        ]),
        vec![(7, 1), (9, 2)]
    );
    assert_eq!(flush_plan(&[WriteBack(3), WriteBack(3)]).len(), 1);
}

/// Write-back files are made durable by their device's flush, which
/// must come after every file of the round (a flush only covers
/// writes completed before it), and the round ends after the flushes.
#[test]
fn a_round_flushes_each_device_after_every_file() {
    for helpers in [0, 1, 3, 8] {
        let (faults, pool) = traced_pool(helpers);
        let (_dir, files) = temp_files(5);
        let mut round = synced(&files);
        round[0].1 = How::WriteBack(7);
        round[2].1 = How::WriteBack(9);
        round[3].1 = How::WriteBack(7);
        let at_done = Arc::new(AtomicUsize::new(usize::MAX));
        let seen = at_done.clone();
        let f = faults.clone();
        let on_done: OnDone = Arc::new(move || {
            seen.store(crate::locks::lock(&f.trace).len(), Ordering::SeqCst);
        });
        let r = pool.start(round_of(&round), on_done).wait();
        assert_eq!(r.len(), 5);
        assert!(r.iter().all(|r| r.is_ok()), "{helpers} helpers");
        let trace = trace_of(&faults);
        // 3 write-backs, 2 fsyncs of their own, 2 flushes.
        assert_eq!(trace.len(), 7, "{helpers} helpers: {trace:?}");
        let count = |what: &str, f: &SegFile| {
            trace
                .iter()
                .filter(|(w, i, _)| *w == what && *i == ino(f))
                .count()
        };
        for (i, f) in files.iter().enumerate() {
            let (wb, fs) = match i {
                0 | 2 => (1, 1), // written back, then its device's flush
                3 => (1, 0),     // its device flushes through file 0
                _ => (0, 1),
            };
            assert_eq!(
                (count("write-back", f), count("fsync", f)),
                (wb, fs),
                "file {i}"
            );
        }
        // Both flushes come after all five files.
        let flushes: Vec<usize> = trace
            .iter()
            .enumerate()
            .filter(|(_, (w, i, _))| {
                *w == "fsync" && (*i == ino(&files[0]) || *i == ino(&files[2]))
            })
            .map(|(at, _)| at)
            .collect();
        assert_eq!(flushes.len(), 2);
        assert!(
            flushes.iter().all(|&at| at >= 5),
            "{helpers} helpers: {trace:?}"
        );
        // The round ended after the flushes.
        let t = std::time::Instant::now();
        while at_done.load(Ordering::SeqCst) == usize::MAX && t.elapsed().as_secs() < 5 {
            std::thread::yield_now();
        }
        assert_eq!(at_done.load(Ordering::SeqCst), 7, "{helpers} helpers");
    }
}

/// A round run here, with helpers idle beside it, is done when the
/// call returns, and every write, write-back, fsync and flush of it
/// ran on the calling thread in the helpers' order: the files with
/// their held-back writes, then the late file, then the device flush.
#[test]
fn a_round_run_here_runs_every_step_on_this_thread_in_order() {
    use crate::direct::{BufPool, DeferredWrite};
    let (faults, pool) = traced_pool(3);
    let (dir, files) = temp_files(4);
    let bufs = BufPool::default();
    let round: Vec<RoundFile> = files
        .iter()
        .enumerate()
        .map(|(i, f)| RoundFile {
            writes: vec![DeferredWrite::new(
                f.clone(),
                None,
                0,
                &[i as u8 + 1; 5000],
                &bufs,
            )],
            late: i == 1,
            ..RoundFile::sync(
                f.clone(),
                if i == 3 { How::Sync } else { How::WriteBack(7) },
            )
        })
        .collect();
    let called = Arc::new(AtomicUsize::new(0));
    let c = called.clone();
    let mut r = pool.run_here(
        round,
        Arc::new(move || {
            c.fetch_add(1, Ordering::SeqCst);
        }),
    );
    assert_eq!(
        called.load(Ordering::SeqCst),
        1,
        "on_done ran before the return"
    );
    assert!(r.is_done(), "nothing left to wait for");
    assert!(r.ran_here());
    let results = r.wait();
    assert_eq!(results.len(), 4);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    let me = std::thread::current().name().unwrap_or("").to_string();
    let trace = trace_of(&faults);
    assert!(
        trace.iter().all(|(_, _, t)| *t == me),
        "every step on the calling thread ({me}): {trace:?}"
    );
    let steps: Vec<(&str, u64)> = trace.iter().map(|(w, i, _)| (*w, *i)).collect();
    let f = |i: usize| ino(&files[i]);
    assert_eq!(
        steps,
        vec![
            ("deferred-write", f(0)),
            ("write-back", f(0)),
            ("deferred-write", f(2)),
            ("write-back", f(2)),
            ("deferred-write", f(3)),
            ("fsync", f(3)),
            ("deferred-write", f(1)),
            ("write-back", f(1)),
            ("fsync", f(0)),
        ],
        "files in order, the late one after them, the flush last"
    );
    for i in 0..4 {
        let back = std::fs::read(dir.path().join(format!("f{i}"))).expect("read back");
        assert!(
            back.len() == 5000 && back.iter().all(|&b| b == i as u8 + 1),
            "file {i}"
        );
    }
}

/// Held-back writes run on the file's helper before its sync, and the
/// late files (end-writes) start only once every other file of the
/// round is written and synced.
#[test]
fn late_files_start_after_every_other_file_and_writes_precede_syncs() {
    use crate::direct::{BufPool, DeferredWrite};
    for helpers in [0, 1, 3, 8] {
        let (faults, pool) = traced_pool(helpers);
        let (dir, files) = temp_files(5);
        let bufs = BufPool::default();
        let late = [false, true, false, true, false];
        let round: Vec<RoundFile> = files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let direct = f.open_direct().ok().map(Arc::new);
                let bytes = vec![i as u8 + 1; 3 * 4096 + 100];
                RoundFile {
                    writes: vec![DeferredWrite::new(f.clone(), direct, 100, &bytes, &bufs)],
                    late: late[i],
                    ..RoundFile::sync(f.clone(), How::Sync)
                }
            })
            .collect();
        let r = pool.start(round, Arc::new(|| {})).wait();
        assert!(r.iter().all(|r| r.is_ok()), "{helpers} helpers: {r:?}");
        let trace = trace_of(&faults);
        let at = |what: &str, f: &SegFile| {
            trace
                .iter()
                .position(|(w, i, _)| *w == what && *i == ino(f))
                .unwrap_or_else(|| panic!("{what} missing: {trace:?}"))
        };
        for (i, f) in files.iter().enumerate() {
            assert!(at("deferred-write", f) < at("fsync", f), "{trace:?}");
            let back = std::fs::read(dir.path().join(format!("f{i}"))).expect("read back");
            assert_eq!(back.len(), 100 + 3 * 4096 + 100, "file {i}");
            assert!(back[100..].iter().all(|&b| b == i as u8 + 1), "file {i}");
        }
        let last_first = [0, 2, 4].map(|i| at("fsync", &files[i])).into_iter().max();
        for i in [1, 3] {
            assert!(
                Some(at("deferred-write", &files[i])) > last_first,
                "{helpers} helpers: {trace:?}"
            );
        }
    }
}

/// The device flush that ends a round runs on the helper that finished
/// the round's last write-back, not on a helper woken for it: a
/// hand-off there would delay every round by a wake-up. The syncs are
/// slowed so that every helper ends after the writer's own tick (the
/// writer never runs a flush itself).
#[test]
fn the_flush_runs_on_the_helper_that_finished_the_last_write_back() {
    let (faults, pool) = traced_pool(8);
    faults.slow_syncs(std::time::Duration::from_millis(30));
    let (_dir, files) = temp_files(3);
    let round: Vec<_> = files
        .iter()
        .map(|f| (f.clone(), How::WriteBack(7)))
        .collect();
    let r = pool.start(round_of(&round), Arc::new(|| {})).wait();
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    let trace = trace_of(&faults);
    assert_eq!(trace.len(), 4, "3 write-backs and a flush: {trace:?}");
    let helpers: Vec<&String> = trace
        .iter()
        .filter(|(w, _, _)| *w == "write-back")
        .map(|(_, _, t)| t)
        .collect();
    assert_eq!(helpers.len(), 3, "{trace:?}");
    assert!(
        helpers.iter().all(|t| t.starts_with("melddb-log-fsync-")),
        "{trace:?}"
    );
    let flush = trace
        .iter()
        .find(|(w, _, _)| *w == "fsync")
        .expect("the round's flush");
    assert_eq!(flush.1, ino(&files[0]), "flushed through the first file");
    assert!(
        helpers.contains(&&flush.2),
        "the flush ran on {}, not on a write-back's helper: {trace:?}",
        flush.2
    );
}

#[test]
fn a_failed_flush_fails_that_devices_write_back_files_only() {
    let (faults, pool) = traced_pool(3);
    let (_dir, files) = temp_files(4);
    let mut round = synced(&files);
    round[0].1 = How::WriteBack(7);
    round[1].1 = How::WriteBack(7);
    round[2].1 = How::WriteBack(9);
    // Device 7's flush goes through file 0; only the flush fsyncs it.
    faults.fail_sync_of.store(ino(&files[0]), Ordering::SeqCst);
    let r = pool.start(round_of(&round), Arc::new(|| {})).wait();
    for i in [0, 1] {
        let e = r[i].as_ref().expect_err("device 7's files failed");
        assert!(e.to_string().contains("flush"), "{e}");
    }
    assert!(r[2].is_ok() && r[3].is_ok(), "{r:?}");
}

#[test]
fn every_file_gets_a_result_in_order() {
    for helpers in [0, 1, 3, 8] {
        let pool = SyncPool::new(helpers, Arc::new(Faults::none()));
        for n in [0, 1, 2, 5, 9] {
            let (_dir, files) = temp_files(n);
            let calls = Arc::new(AtomicUsize::new(0));
            let c = calls.clone();
            let on_done: OnDone = Arc::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
            });
            let r = pool.start(round_of(&synced(&files)), on_done).wait();
            assert_eq!(r.len(), n, "{helpers} helpers, {n} files");
            assert!(r.iter().all(|r| r.is_ok()), "{helpers} helpers, {n} files");
            // The last helper calls back just after sending its result.
            let t = std::time::Instant::now();
            while calls.load(Ordering::SeqCst) == 0 && t.elapsed().as_secs() < 5 {
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
            assert_eq!(
                calls.load(Ordering::SeqCst),
                1,
                "{helpers} helpers, {n} files"
            );
        }
    }
}

#[test]
fn an_injected_fsync_fault_reaches_every_result() {
    let (faults, pool) = traced_pool(3);
    let (_dir, files) = temp_files(6);
    faults.fail_syncs(true);
    let mut files = synced(&files);
    files[1].1 = How::WriteBack(1);
    files[4].1 = How::WriteBack(2);
    let r = pool.start(round_of(&files), Arc::new(|| {})).wait();
    assert_eq!(r.len(), 6);
    assert!(r.iter().all(|r| r.is_err()));
    faults.fail_syncs(false);
    assert!(pool
        .start(round_of(&files), Arc::new(|| {}))
        .wait()
        .iter()
        .all(|r| r.is_ok()));
}

/// With write-back files on two devices and a late file, a round on
/// the helpers answers each file once: the two flushes' results
/// (after the files') are not mistaken for files'.
#[test]
fn write_back_rounds_answer_every_file_once() {
    let (faults, pool) = traced_pool(2);
    let (_dir, files) = temp_files(5);
    let hows = [
        How::WriteBack(7),
        How::Sync,
        How::WriteBack(9),
        How::WriteBack(7),
        How::Sync,
    ];
    let round = || -> Vec<RoundFile> {
        files
            .iter()
            .zip(hows)
            .enumerate()
            .map(|(i, (f, how))| RoundFile {
                late: i == 4,
                ..RoundFile::sync(f.clone(), how)
            })
            .collect()
    };
    let r = pool.start(round(), Arc::new(|| {}));
    assert_eq!((r.write_backs(), r.flushes(), r.ran_here()), (3, 2, false));
    let results = r.wait();
    assert_eq!(results.len(), 5);
    assert!(
        results.iter().all(|r| r.is_ok()),
        "the helpers: {results:?}"
    );
    let trace = trace_of(&faults);
    let steps: Vec<&str> = trace.iter().map(|t| t.0).collect();
    // Three write-backs and two fsyncs of files in some order, then
    // the late file's fsync, then the two flushes.
    assert_eq!(steps.len(), 7, "{trace:?}");
    assert_eq!(trace[4].1, ino(&files[4]), "the late file fifth: {trace:?}");
    let mut flushed: Vec<u64> = trace[5..].iter().map(|t| t.1).collect();
    flushed.sort_unstable();
    let mut want = vec![ino(&files[0]), ino(&files[2])];
    want.sort_unstable();
    assert_eq!(flushed, want, "each device flushed last: {trace:?}");
}

/// A round is done once every file and flush has answered, and not
/// before: the writer answers a batch when `is_done` says so (without
/// blocking), and acknowledging before the flush would acknowledge
/// appends that are not durable.
#[test]
fn a_round_is_done_once_every_file_and_flush_answered_and_not_before() {
    let (faults, pool) = traced_pool(3);
    faults.slow_syncs(std::time::Duration::from_millis(300));
    let (_dir, files) = temp_files(3);
    let mut round = synced(&files);
    round[0].1 = How::WriteBack(7);
    round[1].1 = How::WriteBack(7);
    let mut r = pool.start(round_of(&round), Arc::new(|| {}));
    assert_eq!((r.write_backs(), r.flushes(), r.ran_here()), (2, 1, false));
    assert!(!r.is_done(), "every sync takes 300 ms");
    let t = std::time::Instant::now();
    while !r.is_done() {
        assert!(t.elapsed().as_secs() < 30, "the round never ended");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let trace = trace_of(&faults);
    assert_eq!(
        trace.len(),
        4,
        "two write-backs, an fsync and the flush, all answered: {trace:?}"
    );
    let results = r.wait();
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
}

/// With as many helpers as files, each file of a round goes to a
/// helper of its own, so their syncs run side by side.
#[test]
fn a_rounds_files_go_to_a_helper_each() {
    let (faults, pool) = traced_pool(3);
    let (_dir, files) = temp_files(3);
    let r = pool
        .start(round_of(&synced(&files)), Arc::new(|| {}))
        .wait();
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    let trace = trace_of(&faults);
    let threads: std::collections::BTreeSet<&str> = trace.iter().map(|t| t.2.as_str()).collect();
    assert_eq!(threads.len(), 3, "{trace:?}");
    assert!(
        threads.iter().all(|t| t.starts_with("melddb-log-fsync-")),
        "{trace:?}"
    );
}

/// Dropping the pool waits for its helpers, so a sync under way has
/// ended (and the helpers let go of what they hold) when the drop
/// returns: the store closes its files after.
#[test]
fn dropping_the_pool_waits_for_a_sync_under_way() {
    let (faults, pool) = traced_pool(2);
    faults.slow_syncs(std::time::Duration::from_millis(200));
    let (_dir, files) = temp_files(1);
    let round = pool.start(round_of(&synced(&files)), Arc::new(|| {}));
    drop(pool);
    assert_eq!(
        trace_of(&faults).len(),
        1,
        "the sync ended before the drop returned"
    );
    assert_eq!(Arc::strong_count(&faults), 1, "every helper ended");
    let results = round.wait();
    assert!(results.len() == 1 && results[0].is_ok(), "{results:?}");
}
