//! Spare segments: a new store's first ones at the open, the rest in the
//! background after it; renamed
//! into the windows, cleaned up, kept off a nearly full file system, and
//! written back rather than fsynced where that is sound.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use melddb_log::{Config, Faults, Store};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

mod common;
use common::store::*;
use common::{append_burst, check, free_bytes, small_config, write_back_supported, Model, SmallFs};

/// The segment files of zone directories under `dir`, with their lengths.
fn segment_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut v = Vec::new();
    for z in 0..3 {
        for e in std::fs::read_dir(dir.join(format!("zone{z}"))).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap();
            if melddb_log::segment::parse_name(name).is_some() {
                let len = std::fs::metadata(&p).unwrap().len();
                v.push((p, len));
            }
        }
    }
    v.sort();
    v
}

/// With the default configuration a store keeps spares. A new store's
/// open writes those its first windows take, so every window segment is
/// a whole zeroed file from the first append on, and no more: the pool
/// is short when the open returns (the refill writes nothing until the
/// log has been quiet for a while, and then at `prepare_mib_s`) and
/// fills afterwards, in the background, while the store takes appends.
/// A reopen waits for none.
#[test]
fn a_new_store_opens_with_spares_in_its_windows_and_the_pool_fills_afterwards() {
    let dir = tempfile::tempdir().unwrap();
    let zones: Vec<PathBuf> = (0..3)
        .map(|z| dir.path().join(format!("zone{z}")))
        .collect();
    let mut cfg = Config::with_zones(zones);
    cfg.page_bytes = 4096;
    cfg.segment_bytes = 4 << 20;
    cfg.max_record_bytes = 256 << 10;
    let want = 3 * u64::from(cfg.prepared_segments);
    assert!(want > 0, "spares are on by default");
    let store = Store::open(cfg.clone()).unwrap();
    let at_open = store.stats();
    // Three end-write copies and two data windows of three: nine window
    // segments, three per zone, each renamed from a spare.
    let segs = segment_files(dir.path());
    assert_eq!(segs.len(), 9, "{segs:?}");
    assert!(
        segs.iter().all(|(_, len)| *len == cfg.segment_bytes),
        "window segments started as empty files: {segs:?}"
    );
    assert_eq!(at_open.segments_prepared, 9, "{at_open:?}");
    assert!(
        at_open.spares_ready < want,
        "the open waited for the whole pool: {at_open:?}"
    );
    assert_eq!(store.append_blocking("a", 0, 0, b"x".to_vec()).unwrap(), 0);
    wait_for_spares(&store, want);
    assert_eq!(store.stats().spares_ready, want);
    assert_eq!(spare_files(dir.path()).len() as u64, want);
    assert_eq!(&store.read("a", 0).unwrap()[..], b"x");
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.stats().segments_prepared, 0, "{:?}", store.stats());
    assert_eq!(store.stats().spares_ready, want);
    assert_eq!(&store.read("a", 0).unwrap()[..], b"x");
}

#[test]
fn spares_become_data_segments_and_leftovers_are_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config(dir.path());
    cfg.prepared_segments = 2;
    let seg_bytes = cfg.segment_bytes;
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    assert_eq!(store.segments_blocking().len(), 9);
    // The open wrote two spares per zone, which the first windows took;
    // the refill writes two per zone again in the background while
    // nothing is appended.
    wait_for_spares(&store, 6);
    assert_eq!(store.stats().segments_prepared, 12);
    let spares = spare_files(dir.path());
    assert_eq!(spares.len(), 6, "{spares:?}");
    assert!(
        spares.iter().all(|(_, len)| *len == seg_bytes),
        "{spares:?}"
    );

    // Slide the windows several times; everything reads back, across a
    // reopen that adopts the spares on disk instead of writing new ones.
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut model = Model::new();
    for _ in 0..6 {
        append_burst(&store, &mut model, &mut rng, 40);
        check(&store, &model);
    }
    assert!(windows_slid(&store), "the windows slid");
    wait_for_spares(&store, 6);
    // The slides took spares, and the refill made new ones.
    assert!(store.stats().segments_prepared > 6, "{:?}", store.stats());
    drop(store);
    // A spare cut short by a crash and one of another size are removed.
    let zone0 = dir.path().join("zone0");
    std::fs::write(zone0.join("spare-0000000000009998.tmp"), vec![0u8; 100]).unwrap();
    std::fs::write(zone0.join("spare-0000000000009999.dat"), vec![0u8; 100]).unwrap();
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    assert_eq!(store.stats().segments_prepared, 0, "adopted, not rewritten");
    let spares = spare_files(dir.path());
    assert_eq!(spares.len(), 6, "{spares:?}");
    assert!(
        spares.iter().all(|(_, len)| *len == seg_bytes),
        "{spares:?}"
    );
    check(&store, &model);
    append_burst(&store, &mut model, &mut rng, 40);
    check(&store, &model);
    drop(store);

    // Wanting one more spare per zone: the new ones are numbered past
    // every spare on disk, so none replaces one adopted. One spare per
    // zone, the highest number in zone 0, which takes the first new one.
    for (path, _) in spare_files(dir.path()) {
        std::fs::remove_file(path).unwrap();
    }
    for (z, n) in [(0, 99), (1, 97), (2, 98)] {
        let name = format!("spare-{n:016}.dat");
        let path = dir.path().join(format!("zone{z}")).join(name);
        std::fs::write(path, vec![0u8; seg_bytes as usize]).unwrap();
    }
    cfg.prepared_segments = 3;
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    wait_for_spares(&store, 9);
    let spares = spare_files(dir.path());
    assert_eq!(spares.len(), 9, "{spares:?}");
    assert_eq!(store.stats().segments_prepared, 6);
    check(&store, &model);
    drop(store);

    // Without spares configured, the open removes them and segments
    // start empty again.
    cfg.prepared_segments = 0;
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    assert!(spare_files(dir.path()).is_empty());
    appends_go_on_and_survive_a_reopen(store, &cfg, &mut model, &mut rng, 40);
}

/// Set in the child process of
/// [`a_disk_that_refuses_spares_opens_and_appends_without_them`].
const FULL_DISK_CHILD: &str = "MELDDB_LOG_TEST_FULL_DISK_DIR";

#[test]
fn a_disk_that_refuses_spares_opens_and_appends_without_them() {
    // A full disk, as the process sees it: the child runs under a file
    // size limit (`ulimit -f`, SIGXFSZ ignored so a write past it fails
    // with EFBIG instead of killing the process) smaller than one spare.
    // Spares only make appends faster, so the open must go on without
    // them, leave no partial spare behind, and the log must work; the
    // refill's retries must not keep the store from closing.
    if let Some(dir) = std::env::var_os(FULL_DISK_CHILD) {
        full_disk_child(Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 512; exec \"$0\" \"$@\"")
        .arg(&exe)
        .args([
            "--exact",
            "a_disk_that_refuses_spares_opens_and_appends_without_them",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FULL_DISK_CHILD, dir.path())
        .output()
        .expect("bash runs the child");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("full-disk child done"),
        "the child did not run the checks:\n{text}"
    );
}

fn full_disk_child(dir: &Path) {
    use std::io::Write;
    // The limit is in force: 600 KiB cannot be written.
    let probe = dir.join("probe");
    let big = std::fs::File::create(&probe)
        .unwrap()
        .write_all(&vec![0u8; 600 << 10]);
    assert_eq!(
        big.err().and_then(|e| e.raw_os_error()),
        Some(27), // EFBIG
        "the file size limit is not in force"
    );
    std::fs::remove_file(&probe).unwrap();

    let mut cfg = small_config(dir);
    cfg.segment_bytes = 1 << 20; // a spare is twice the limit
    cfg.prepared_segments = 2;
    let store = Store::open(cfg.clone()).expect("opens without spares");
    common::wait_for_stats(&store, "a failed spare", |s| s.spares_failed >= 1);
    assert_eq!(store.stats().spares_ready, 0, "{:?}", store.stats());
    assert_eq!(store.stats().segments_prepared, 0);
    assert!(spare_files(dir).is_empty(), "{:?}", spare_files(dir));
    for i in 0..60u64 {
        let rec = vec![i as u8; 1000];
        assert_eq!(store.append_blocking("a", 0, 0, rec).unwrap(), i);
    }
    // Quiet long enough for the refill to try (and fail) again; the
    // failure is counted.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while store.stats().spares_failed < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(store.stats().spares_failed >= 2, "{:?}", store.stats());
    // ...and then tried again only every 10 s, not in a busy loop (a
    // slower host makes fewer tries, never more).
    let failed = store.stats().spares_failed;
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(
        store.stats().spares_failed <= failed + 1,
        "the refill retried {} times in 1 s",
        store.stats().spares_failed - failed
    );
    for i in 0..60u64 {
        assert_eq!(&store.read("a", i).unwrap()[..], &vec![i as u8; 1000][..]);
    }
    drop(store);
    assert!(spare_files(dir).is_empty(), "{:?}", spare_files(dir));
    let store = Store::open(cfg).expect("reopens without spares");
    assert_eq!(store.bounds("a"), (0, 60));
    assert_eq!(store.append_blocking("a", 0, 0, b"x".to_vec()).unwrap(), 60);
    drop(store);
    println!("full-disk child done");
}

/// `flush_once_per_device`: rounds write segments made from spares back
/// and flush the device once; segments that are not from spares, and
/// every segment with the option off, are fsynced one by one. Records
/// read back either way, across a reopen.
#[test]
fn rounds_write_back_spare_segments_and_fsync_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let supported = write_back_supported(dir.path());
    for (spares, once) in [(2, true), (2, false), (0, true)] {
        let sub = dir.path().join(format!("s{spares}-{once}"));
        let mut cfg = small_config(&sub);
        cfg.prepared_segments = spares;
        cfg.tuning.flush_once_per_device = once;
        common::spares_on_disk(&cfg);
        let store = Arc::new(Store::open(cfg.clone()).unwrap());
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut model = Model::new();
        for _ in 0..4 {
            append_burst(&store, &mut model, &mut rng, 40);
            check(&store, &model);
        }
        let s = store.stats();
        let what = format!("spares {spares}, flush once {once}: {s:?}");
        if spares > 0 && once && supported {
            assert!(s.write_backs > 0, "{what}");
            assert!(s.flushes > 0 && s.flushes <= s.batches, "{what}");
        } else {
            assert_eq!((s.write_backs, s.flushes), (0, 0), "{what}");
        }
        drop(store);
        let store = Store::open(cfg).unwrap();
        check(&store, &model);
    }
}

/// A failed batch is cut off the segments it wrote, zeros of their spares
/// included: from there on those segments are fsynced, not written back
/// (their pages now extend the file); the others still are.
#[test]
fn a_rolled_back_spare_segment_is_fsynced_from_then_on() {
    let dir = tempfile::tempdir().unwrap();
    if !write_back_supported(dir.path()) {
        common::skip("the temporary directory is not on ext4 or XFS");
        return;
    }
    let mut cfg = small_config(dir.path());
    cfg.segment_bytes = 1 << 20;
    cfg.prepared_segments = 2;
    common::spares_on_disk(&cfg);
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
    let mut model = Model::new();
    let append = |store: &Store, model: &mut Model, i: u32| {
        let bytes = format!("record {i}").into_bytes();
        let pos = store.append_blocking("log", 0, 0, bytes.clone()).unwrap();
        let e = model.entry("log".into()).or_insert((pos, Vec::new()));
        e.1.push(bytes);
    };
    // The open's window markers are written back too (the segments are
    // spares): counted from here.
    let opened = store.stats();
    for i in 0..20 {
        append(&store, &mut model, i);
    }
    // Each batch writes a root stripe's three pages (one per data
    // segment) and three end-writes, all six to segments made from spares.
    let before = store.stats();
    assert_eq!(
        before.write_backs - opened.write_backs,
        6 * 20,
        "{before:?}"
    );
    // The batch's second write fails: the first segment it wrote is cut
    // back, the batch fails.
    faults.fail_write_after(1, false);
    assert!(store
        .append_blocking("log", 0, 0, b"lost".to_vec())
        .is_err());
    let failed = store.stats();
    for i in 20..40 {
        append(&store, &mut model, i);
    }
    let after = store.stats();
    assert_eq!(after.write_backs - failed.write_backs, 5 * 20, "{after:?}");
    check(&store, &model);
    drop(store);
    check(&Store::open(cfg).unwrap(), &model);
}

/// Spares asked for than the file system holds (15 of 256 KiB on a 4 MiB
/// tmpfs): the refill makes only those that leave two
/// segments (or a twentieth of it) free, so the log has room to make
/// segments of its own when the spares run out.
#[test]
fn spares_leave_room_on_their_file_system() {
    let Some(fs) = SmallFs::mount() else {
        return;
    };
    let mut cfg = fs.config();
    cfg.prepared_segments = 5;
    let store = Store::open(cfg.clone()).unwrap();
    // The refill makes spares until the next would leave too little
    // room, which it counts as a failure (and retries only in 10 s).
    common::wait_for_stats(&store, "a spare refused", |s| s.spares_failed > 0);
    let ready = store.stats().spares_ready;
    assert!(ready > 0 && ready < 15, "{ready} spares");
    assert!(
        free_bytes(&fs.path) >= 512 << 10,
        "{} free",
        free_bytes(&fs.path)
    );
    // Quiet: the refill has its turn, and must not fill the disk either.
    std::thread::sleep(std::time::Duration::from_millis(800));
    assert!(
        free_bytes(&fs.path) >= 512 << 10,
        "{} free",
        free_bytes(&fs.path)
    );
    assert_eq!(store.stats().spares_ready, ready);
    for i in 0..100u64 {
        assert_eq!(
            store
                .append_blocking("s", 1, i, vec![i as u8; 3000])
                .unwrap(),
            i
        );
    }
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.bounds("s"), (0, 100));
}
