//! Segments on raw devices (`devices`): the store against a model across
//! reopen, trim (slots freed and reused), lost slot headers and corrupt
//! pages; against the file layout, byte for byte; on real block devices
//! (loop devices) where this machine allows them; and the open's refusals.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use melddb_log::device::{decode_slot, slot_bytes, Held, HEADER_BYTES};
use melddb_log::{Config, Faults, Store, StoreError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::{
    append_burst, check_at, record, small_config, take_every_byte, write_back_supported, Model,
    SmallFs,
};

/// `segment_bytes` of [`small_config`], which slot offsets are made of.
const SEG: u64 = 64 << 10;

/// [`small_config`] with one device image of `slots` slots per
/// zone (sparse files of zeros: new devices).
fn device_config(dir: &Path, slots: u64) -> Config {
    std::fs::create_dir_all(dir).unwrap();
    let mut c = small_config(dir);
    assert_eq!(c.segment_bytes, SEG);
    c.devices = (0..3)
        .map(|z| {
            let p = dir.join(format!("dev{z}.img"));
            let f = std::fs::File::create(&p).unwrap();
            f.set_len(HEADER_BYTES + slots * (HEADER_BYTES + slot_bytes(SEG)))
                .unwrap();
            p
        })
        .collect();
    c
}

/// `cfg` with the same devices under other (new) zone directories, so
/// that only the devices are shared.
fn elsewhere(cfg: &Config, dir: &Path) -> Config {
    let mut c = cfg.clone();
    c.zones = (0..c.zones.len())
        .map(|z| dir.join(format!("elsewhere{z}")))
        .collect();
    c
}

/// Where slot `slot`'s header is.
fn header_at(slot: u64) -> u64 {
    HEADER_BYTES + slot * (HEADER_BYTES + slot_bytes(SEG))
}

/// Every segment on the devices, read from the slot headers as the open
/// reads them (newest header per segment): its device and slot.
fn slots(cfg: &Config) -> BTreeMap<u64, (PathBuf, u64)> {
    let mut newest: BTreeMap<u64, (u64, PathBuf, u64)> = BTreeMap::new();
    for dev in &cfg.devices {
        let f = std::fs::File::open(dev).unwrap();
        let n = (f.metadata().unwrap().len() - HEADER_BYTES) / (HEADER_BYTES + slot_bytes(SEG));
        for slot in 0..n {
            let mut b = [0u8; 64];
            f.read_exact_at(&mut b, header_at(slot)).unwrap();
            if let Some((Held::Segment(id), gen)) = decode_slot(&b, slot, slot_bytes(SEG)) {
                if newest.get(&id).is_none_or(|e| e.0 < gen) {
                    newest.insert(id, (gen, dev.clone(), slot));
                }
            }
        }
    }
    newest
        .into_iter()
        .map(|(id, (_, d, s))| (id, (d, s)))
        .collect()
}

/// A slot's data bytes.
fn slot_data(dev: &Path, slot: u64) -> Vec<u8> {
    let mut b = vec![0u8; slot_bytes(SEG) as usize];
    std::fs::File::open(dev)
        .unwrap()
        .read_exact_at(&mut b, header_at(slot) + HEADER_BYTES)
        .unwrap();
    b
}

/// Where a slot's data ends (the rest is zeros).
fn data_end(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
}

/// The model test of `tests/store.rs` on devices small enough that trim
/// must free slots for the log to go on: every acknowledged record reads
/// back across reopens, trims, slot headers wiped while closed (the
/// device's "deleted file": recovery rebuilds the segment into another
/// slot) and bytes flipped in a segment's data (scrub repairs it, again
/// into another slot).
#[test]
fn random_history_on_devices_matches_the_model_and_reuses_slots() {
    const SLOTS: u64 = 32;
    for seed in 0..6u64 {
        let dir = tempfile::tempdir().unwrap();
        // Room for the busiest step between trims (24 slots ran out now
        // and then, batching being timing-dependent), few enough that
        // slots are reused.
        let mut cfg = device_config(dir.path(), SLOTS);
        cfg.tuning.strict_end_writes = seed % 2 == 1;
        // Spare slots zeroed ahead, or every slot zeroed when taken.
        cfg.prepared_segments = if seed % 3 == 0 { 0 } else { 2 };
        cfg.tuning.direct_writes = seed % 3 != 2;
        cfg.tuning.direct_write_min_bytes = 4096;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut model = Model::new();
        let mut store = Arc::new(Store::open(cfg.clone()).unwrap());
        // Every segment each slot was seen holding.
        let mut held: BTreeMap<(PathBuf, u64), std::collections::BTreeSet<u64>> = BTreeMap::new();
        let mut freed = 0;
        for step in 0..24 {
            let what = format!("seed {seed} step {step}");
            let n = rng.random_range(1..60);
            append_burst(&store, &mut model, &mut rng, n);
            check_at(&store, &model, &what);
            for (id, at) in slots(&cfg) {
                held.entry(at).or_default().insert(id);
            }
            match rng.random_range(0..5) {
                0 | 1 => {
                    // Trim every log most of the way: the devices are
                    // small, and freed slots must be reused.
                    for (log, (first, recs)) in model.iter_mut() {
                        let cut = recs.len() * 3 / 4;
                        store.trim_blocking(log, *first + cut as u64).unwrap();
                        recs.drain(..cut);
                        *first += cut as u64;
                    }
                }
                2 => {
                    freed += store.stats().segments_freed;
                    drop(store);
                    store = Arc::new(Store::open(cfg.clone()).unwrap());
                }
                3 => {
                    // Wipe one segment's slot header while closed.
                    freed += store.stats().segments_freed;
                    drop(store);
                    let all: Vec<(u64, (PathBuf, u64))> = slots(&cfg).into_iter().collect();
                    let (victim, (dev, slot)) = &all[rng.random_range(0..all.len())];
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(dev)
                        .unwrap()
                        .write_all_at(&[0u8; HEADER_BYTES as usize], header_at(*slot))
                        .unwrap();
                    store = Arc::new(Store::open(cfg.clone()).unwrap());
                    let rebuilt = &store.recovery().repaired_segments;
                    let now = slots(&cfg);
                    assert!(
                        !rebuilt.contains(victim) || now.contains_key(victim),
                        "{what}: segment {victim} was rebuilt into a slot: {now:?}"
                    );
                }
                _ => {
                    // Flip a byte inside a random segment's data.
                    let all: Vec<(u64, (PathBuf, u64))> = slots(&cfg).into_iter().collect();
                    let (_, (dev, slot)) = &all[rng.random_range(0..all.len())];
                    let data = slot_data(dev, *slot);
                    let end = data_end(&data);
                    if end > 0 {
                        let at = rng.random_range(0..end);
                        let f = std::fs::OpenOptions::new().write(true).open(dev).unwrap();
                        f.write_all_at(
                            &[data[at] ^ 0x5a],
                            header_at(*slot) + HEADER_BYTES + at as u64,
                        )
                        .unwrap();
                    }
                    check_at(&store, &model, &what);
                    let report = store.scrub_blocking();
                    assert!(
                        report.unrecoverable.is_empty() && report.failed.is_empty(),
                        "{what}: {report:?}"
                    );
                    assert_eq!(
                        store.scrub_blocking().bad_pages,
                        0,
                        "{what}: scrub after repair is clean"
                    );
                }
            }
            check_at(&store, &model, &what);
        }
        // Slots were freed and taken again by later segments.
        let reused = held.values().filter(|ids| ids.len() > 1).count();
        assert!(
            reused > 0,
            "seed {seed}: no slot held two segments: {held:?}"
        );
        freed += store.stats().segments_freed;
        assert!(freed > 0, "seed {seed}: no segment freed");
        drop(store);
        let store = Store::open(cfg.clone()).unwrap();
        check_at(&store, &model, &format!("seed {seed}, last open"));
    }
}

/// The same appends, one at a time (so the batches are the same), on
/// files and on devices: every segment has the same bytes, and a slot
/// holds zeros after them.
#[test]
fn devices_hold_exactly_the_bytes_segment_files_hold() {
    let files_dir = tempfile::tempdir().unwrap();
    let dev_dir = tempfile::tempdir().unwrap();
    let files_cfg = small_config(files_dir.path());
    // Few slots, so that trims free them and later segments reuse them.
    let dev_cfg = device_config(dev_dir.path(), 10);
    let files = Store::open(files_cfg.clone()).unwrap();
    let devs = Store::open(dev_cfg.clone()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for i in 0..600u64 {
        let log = ["a", "b"][rng.random_range(0..2)];
        let rec = record(&mut rng, 40_000);
        let p = files.append_blocking(log, 1, i + 1, rec.clone()).unwrap();
        assert_eq!(devs.append_blocking(log, 1, i + 1, rec).unwrap(), p);
        if i % 50 == 49 {
            for s in [&files, &devs] {
                for log in ["a", "b"] {
                    let (_, tail) = s.bounds(log);
                    s.trim_blocking(log, tail.saturating_sub(5)).unwrap();
                }
            }
        }
    }
    drop((files, devs));
    let on_devices = slots(&dev_cfg);
    let mut file_segs = BTreeMap::new();
    for (z, zone) in files_cfg.zones.iter().enumerate() {
        for e in std::fs::read_dir(zone).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if let Some(id) = melddb_log::segment::parse_name(&name) {
                assert_eq!(id % 3, z as u64);
                file_segs.insert(id, std::fs::read(zone.join(&name)).unwrap());
            }
        }
    }
    let highest = *file_segs.keys().next_back().unwrap();
    assert!(
        highest / 3 > 10,
        "slots were reused: highest segment {highest}"
    );
    assert_eq!(
        on_devices.keys().collect::<Vec<_>>(),
        file_segs.keys().collect::<Vec<_>>(),
        "the same segments live (trim freed the same ones)"
    );
    for (id, bytes) in &file_segs {
        let (dev, slot) = &on_devices[id];
        let data = slot_data(dev, *slot);
        assert_eq!(&data[..bytes.len()], &bytes[..], "segment {id}");
        assert!(
            data[bytes.len()..].iter().all(|&b| b == 0),
            "segment {id}: zeros after its data"
        );
    }
}

/// Appends `rec` to log "x" (no request id) until the store refuses one,
/// counting the positions acknowledged, in order, in `acked`; the
/// refusal.
fn append_until_refused(store: &Store, rec: &[u8], acked: &mut u64) -> StoreError {
    loop {
        match store.append_blocking("x", 0, 0, rec.to_vec()) {
            Ok(p) => {
                assert_eq!(p, *acked);
                *acked += 1;
            }
            Err(e) => return e,
        }
        assert!(*acked < 10_000, "the devices never filled");
    }
}

#[test]
fn a_full_device_refuses_appends_until_a_trim_frees_slots() {
    let dir = tempfile::tempdir().unwrap();
    // The windows take 3 + 2 * 3 = 9 segments, 3 per zone: 5 slots per
    // device leave room for two slides.
    let cfg = device_config(dir.path(), 5);
    let store = Store::open(cfg.clone()).unwrap();
    let rec = vec![7u8; 3000];
    let mut acked = 0u64;
    let err = append_until_refused(&store, &rec, &mut acked);
    assert!(matches!(err, StoreError::Full(_)), "{err}");
    assert!(err.to_string().contains("trim"), "{err}");
    // Everything acknowledged is there; a trim frees sealed segments'
    // slots and appends go on, at the next position.
    for p in 0..acked {
        assert_eq!(&store.read("x", p).unwrap()[..], &rec[..]);
    }
    store.trim_blocking("x", acked).unwrap();
    let p = store.append_blocking("x", 0, 0, rec.clone()).unwrap();
    assert_eq!(p, acked, "positions are never reused");
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.bounds("x"), (acked, acked + 1));
}

/// Device images on a file system that fills up. The images are sparse,
/// so zeroing a slot for a new segment needs blocks: with none left the
/// append that needed the slot is refused `NoSpace`, and the slot it took
/// must be free again, not lost until a restart. Once there is room, the
/// devices fill to their last slot (as many segments as slots), and every
/// acknowledged record reads back, also after a reopen.
#[test]
fn a_slot_that_could_not_be_zeroed_for_lack_of_space_is_free_again() {
    let Some(fs) = SmallFs::mount() else {
        return;
    };
    let slots_per_device = 5;
    let mut cfg = device_config(&fs.path, slots_per_device);
    // No spares: the writer zeroes each new segment's slot itself.
    cfg.prepared_segments = 0;
    let store = Store::open(cfg.clone()).unwrap();
    let rec = vec![7u8; 3000];
    let mut acked = 0u64;
    let filler = take_every_byte(&fs.path);
    let refused = append_until_refused(&store, &rec, &mut acked);
    assert!(matches!(refused, StoreError::NoSpace(_)), "{refused}");
    std::fs::remove_file(&filler).unwrap();
    let full = append_until_refused(&store, &rec, &mut acked);
    assert!(matches!(full, StoreError::Full(_)), "{full}");
    assert_eq!(
        slots(&cfg).len() as u64,
        3 * slots_per_device,
        "every slot of every device holds a segment"
    );
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.bounds("x"), (0, acked));
    for p in 0..acked {
        assert_eq!(&store.read("x", p).unwrap()[..], &rec[..]);
    }
}

#[test]
fn the_open_refuses_foreign_swapped_and_held_devices_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = device_config(dir.path(), 12);
    let store = Store::open(cfg.clone()).unwrap();
    store.append_blocking("x", 0, 0, b"kept".to_vec()).unwrap();
    // A second store on the same zones is refused by their locks...
    let e = Store::open(cfg.clone()).err().expect("zones held");
    assert!(
        e.to_string().contains("is in use by another process"),
        "{e}"
    );
    // ...and one on the same devices from other zone directories by the
    // devices' own claim.
    let e = Store::open(elsewhere(&cfg, dir.path()))
        .err()
        .expect("devices held");
    assert!(
        matches!(e, melddb_log::OpenError::DeviceInUse { .. }),
        "{e}"
    );
    drop(store);
    // Zones' devices swapped.
    let mut swapped = cfg.clone();
    swapped.devices.swap(0, 1);
    let e = Store::open(swapped).err().expect("swapped");
    assert!(
        e.to_string().contains("the devices list changed order"),
        "{e}"
    );
    // Another segment size.
    let mut resized = cfg.clone();
    resized.segment_bytes = 2 * SEG;
    let e = Store::open(resized).err().expect("resized");
    assert!(e.to_string().contains("segment_bytes"), "{e}");
    // A device with someone else's data is never written.
    let mut foreign = cfg.clone();
    let other = dir.path().join("other.img");
    std::fs::write(&other, vec![0xabu8; 1 << 20]).unwrap();
    foreign.devices[2] = other.clone();
    let e = Store::open(foreign).err().expect("foreign");
    assert!(e.to_string().contains("not a MeldDB log label"), "{e}");
    assert!(std::fs::read(&other).unwrap().iter().all(|&b| b == 0xab));
    // And the real configuration still opens with its record.
    let store = Store::open(cfg).unwrap();
    assert_eq!(&store.read("x", 0).unwrap()[..], b"kept");
}

/// Loop devices over image files, detached when dropped.
struct Loops(Vec<PathBuf>);

impl Drop for Loops {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(d)
                .status();
        }
    }
}

/// Attaches a loop device to each image, or `None` where this machine
/// does not allow it (no `losetup`, not root, no loop driver).
fn loop_devices(images: &[PathBuf]) -> Option<Loops> {
    let mut loops = Loops(Vec::new());
    for img in images {
        let out = common::privileged(
            std::process::Command::new("losetup")
                .args(["-f", "--show"])
                .arg(img),
        )?;
        loops
            .0
            .push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    }
    Some(loops)
}

/// The same history as the model test, shorter, on real block devices:
/// a block device's size comes from seeking to its end, it is claimed
/// exclusively, and flushed by its own `fdatasync`.
#[test]
fn a_log_on_loop_block_devices_survives_reopen_trim_and_a_lost_header() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = device_config(dir.path(), 30);
    cfg.prepared_segments = 2;
    // Old data in every slot: a slot must be zeroed (on a block device by
    // the device: `fallocate` ZERO_RANGE) before it takes a segment.
    for img in &cfg.devices {
        let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
        for slot in 0..30 {
            f.write_all_at(
                &vec![OLD; slot_bytes(SEG) as usize],
                header_at(slot) + HEADER_BYTES,
            )
            .unwrap();
        }
    }
    let Some(loops) = loop_devices(&cfg.devices) else {
        return;
    };
    let images = std::mem::replace(&mut cfg.devices, loops.0.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut model = Model::new();
    let mut store = Arc::new(Store::open(cfg.clone()).unwrap());
    for step in 0..12 {
        let what = format!("loop step {step}");
        append_burst(&store, &mut model, &mut rng, 40);
        check_at(&store, &model, &what);
        if step % 3 == 2 {
            for (log, (first, recs)) in model.iter_mut() {
                let cut = recs.len() / 2;
                store.trim_blocking(log, *first + cut as u64).unwrap();
                recs.drain(..cut);
                *first += cut as u64;
            }
        }
        if step % 4 == 3 {
            drop(store);
            store = Arc::new(Store::open(cfg.clone()).unwrap());
            check_at(&store, &model, &what);
        }
    }
    // A second open while the first holds the devices is refused.
    let e = Store::open(elsewhere(&cfg, dir.path()))
        .err()
        .expect("held");
    assert!(
        matches!(e, melddb_log::OpenError::DeviceInUse { .. }),
        "{e}"
    );
    drop(store);
    // Lose a header through the block device; the segment is rebuilt.
    let img_cfg = Config {
        devices: images,
        ..cfg.clone()
    };
    let on = slots(&img_cfg);
    let (victim, (img, slot)) = on.iter().next().map(|(k, v)| (*k, v.clone())).unwrap();
    let z = cfg.devices[img_cfg.devices.iter().position(|d| *d == img).unwrap()].clone();
    let f = std::fs::OpenOptions::new().write(true).open(&z).unwrap();
    f.write_all_at(&[0u8; HEADER_BYTES as usize], header_at(slot))
        .unwrap();
    f.sync_all().unwrap();
    drop(f);
    let store = Store::open(cfg.clone()).unwrap();
    check_at(&store, &model, "after a lost header");
    assert!(
        !store.recovery().repaired_segments.contains(&victim)
            || slots(&img_cfg).contains_key(&victim),
        "{:?}",
        store.recovery()
    );
    drop(store);
    drop(loops);
    // No segment kept a block of the old data: its slot was zeroed first.
    for (id, (img, slot)) in slots(&img_cfg) {
        let data = slot_data(&img, slot);
        assert!(
            !data.chunks(4096).any(|b| b.iter().all(|&x| x == OLD)),
            "segment {id} in {} slot {slot} holds old data",
            img.display()
        );
    }
}

/// What the loop test's slots hold before the log uses them.
const OLD: u8 = 0xee;

/// On device images, slots zeroed by the spare refill (written zeros) are
/// written back and flushed once per round; slots zeroed on demand as
/// unwritten extents, and every slot after a reopen, are fsynced (their
/// first writes change the image's metadata). Records read back either way.
#[test]
fn image_slots_from_spares_are_written_back_and_the_rest_fsynced() {
    let dir = tempfile::tempdir().unwrap();
    let supported = write_back_supported(dir.path());
    for spares in [2, 0] {
        let sub = dir.path().join(format!("s{spares}"));
        std::fs::create_dir_all(&sub).unwrap();
        let mut cfg = device_config(&sub, 40);
        cfg.prepared_segments = spares;
        let store = Arc::new(Store::open(cfg.clone()).unwrap());
        // The refill keeps exactly `prepared_segments` spare slots per
        // device, and no more.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while store.stats().spares_ready < 3 * spares as u64 {
            assert!(std::time::Instant::now() < until, "{:?}", store.stats());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert_eq!(store.stats().spares_ready, 3 * spares as u64);
        for dev in &cfg.devices {
            let f = std::fs::File::open(dev).unwrap();
            let spare = (0..40)
                .filter(|&slot| {
                    let mut b = [0u8; 64];
                    f.read_exact_at(&mut b, header_at(slot)).unwrap();
                    decode_slot(&b, slot, slot_bytes(SEG)).is_some_and(|h| h.0 == Held::Spare)
                })
                .count();
            assert_eq!(spare, spares as usize, "{}", dev.display());
        }
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut model = Model::new();
        append_burst(&store, &mut model, &mut rng, 40);
        check_at(&store, &model, "first burst");
        let s = store.stats();
        let what = format!("spares {spares}: {s:?}");
        if spares > 0 && supported {
            assert!(s.write_backs > 0, "{what}");
        } else {
            assert_eq!((s.write_backs, s.flushes), (0, 0), "{what}");
        }
        drop(store);
        // Reopened, an image's segments are fsynced until sealed, and new
        // ones follow the rule above.
        let store = Arc::new(Store::open(cfg.clone()).unwrap());
        let opened = store.stats();
        append_burst(&store, &mut model, &mut rng, 5);
        check_at(&store, &model, "after a reopen");
        let s = store.stats();
        assert!(s.fsyncs > opened.fsyncs, "{what}: {s:?}");
    }
}

/// A batch rolled back after some of its pages were written cuts them
/// off. A device slot keeps its size and writes zeros back, so its later
/// pages still go over blocks written and committed: written back and
/// flushed, no `fdatasync` of their own (a segment file is truncated
/// instead and fsynced from then on:
/// `tests/store.rs`, `a_rolled_back_spare_segment_is_fsynced_from_then_on`).
/// Without a roll back no slot from a spare is fsynced on its own; the
/// test checks that first, or the count after the roll back would say
/// nothing.
#[test]
fn a_roll_back_keeps_slots_written_back_and_zeros_past_their_data() {
    let dir = tempfile::tempdir().unwrap();
    if !write_back_supported(dir.path()) {
        common::skip(
            "the temporary directory is not on ext4 or XFS, whose write-back the store relies on",
        );
        return;
    }
    let mut cfg = device_config(dir.path(), 40);
    cfg.prepared_segments = 2;
    let faults = Arc::new(Faults::none());
    let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
    let own_fsyncs = |s: &melddb_log::Stats| s.fsyncs - s.flushes;
    let mut acked = Vec::new();
    let mut req = 0u64;
    let mut append = |store: &Store, body: Vec<u8>| {
        req += 1;
        let pos = store
            .append_blocking("r", 1, req, body.clone())
            .unwrap_or_else(|e| panic!("append {req}: {e}"));
        acked.push((pos, body));
    };
    // The open does not wait for spares, so the first window's slots are
    // zeroed without them. Records that fill segments slide the windows
    // until every window segment is new, the pool refilled before each
    // slide takes from it, so every one is made from a spare.
    let first: Vec<u64> = store.segments_blocking().iter().map(|s| s.id).collect();
    let last_first = *first.iter().max().unwrap();
    let mut i = 0u32;
    while store
        .segments_blocking()
        .iter()
        .any(|s| s.class < melddb_log::page::class::SEALED && s.id <= last_first)
    {
        common::wait_for_stats(&store, "spares", |s| s.spares_ready == 6);
        append(&store, vec![i as u8; 7_000]);
        i += 1;
        assert!(i < 2_000, "the windows did not slide");
    }
    common::wait_for_stats(&store, "spares", |s| s.spares_ready == 6);
    for i in 0..5u8 {
        append(&store, vec![i; 300]);
    }
    let before = store.stats();
    for i in 5..10u8 {
        append(&store, vec![i; 300]);
    }
    let s = store.stats();
    assert_eq!(
        own_fsyncs(&s),
        own_fsyncs(&before),
        "slots from spares need no fsync of their own: {s:?}"
    );
    assert!(s.write_backs > before.write_backs, "{s:?}");
    // The second write of a record of one stripe fails: the pages
    // written to the first segment (from a spare) are cut off again.
    faults.fail_write_after(1, false);
    match store.append_blocking("r", 1, 1_000, vec![0xab; 7_000]) {
        Err(StoreError::WriteFailed(_)) => {}
        other => panic!("{other:?}"),
    }
    faults.fail_write_after(-1, false);
    // Past every segment's data its slot holds nothing but zeros: the
    // pages cut off are gone.
    let on_disk = slots(&cfg);
    for seg in store.segments_blocking() {
        let (dev, slot) = &on_disk[&seg.id];
        let bytes = slot_data(dev, *slot);
        assert!(
            data_end(&bytes) as u64 <= seg.len,
            "segment {} has bytes up to {} past its data's end {}",
            seg.id,
            data_end(&bytes),
            seg.len
        );
    }
    let rolled = store.stats();
    for i in 10..15u8 {
        append(&store, vec![i; 300]);
    }
    let s = store.stats();
    assert_eq!(
        own_fsyncs(&s),
        own_fsyncs(&rolled),
        "a slot cut back to zeros stays written back: {s:?}"
    );
    for (pos, body) in &acked {
        assert_eq!(&store.read("r", *pos).unwrap()[..], &body[..]);
    }
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.bounds("r"), (0, acked.len() as u64));
    for (pos, body) in &acked {
        assert_eq!(&store.read("r", *pos).unwrap()[..], &body[..]);
    }
}

/// A log kept in files does not open with `devices` added (it would find
/// no segments and take every position as trimmed), nor a log on devices
/// with them removed; both open again as they were.
#[test]
fn switching_a_log_between_files_and_devices_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let files = small_config(&dir.path().join("f"));
    let store = Store::open(files.clone()).unwrap();
    store
        .append_blocking("x", 0, 0, b"in files".to_vec())
        .unwrap();
    drop(store);
    let mut with_devices = device_config(&dir.path().join("f"), 12);
    with_devices.zones = files.zones.clone();
    let e = Store::open(with_devices).err().expect("files to devices");
    assert!(e.to_string().contains("segments are files"), "{e}");
    let store = Store::open(files).unwrap();
    assert_eq!(&store.read("x", 0).unwrap()[..], b"in files");
    drop(store);

    let devs = device_config(&dir.path().join("d"), 12);
    let store = Store::open(devs.clone()).unwrap();
    store
        .append_blocking("x", 0, 0, b"on devices".to_vec())
        .unwrap();
    drop(store);
    let mut without = devs.clone();
    without.devices.clear();
    let e = Store::open(without).err().expect("devices to files");
    assert!(e.to_string().contains("segments are on devices"), "{e}");
    let store = Store::open(devs).unwrap();
    assert_eq!(&store.read("x", 0).unwrap()[..], b"on devices");
}

/// Slot headers come from the disk, so they are untrusted even when their
/// checksum holds (a device another build wrote, or one forged): headers
/// naming a segment no store could have numbered, or carrying the largest
/// generations, must not crash the open nor later header writes. Each
/// forged header goes into a free slot of a closed store; the store must
/// then open, keep every acknowledged record, go on appending and open
/// again; or, for a segment of another zone, refuse as for a file in the
/// wrong zone directory.
#[test]
fn forged_slot_headers_with_valid_checksums_never_crash_the_open() {
    use melddb_log::device::encode_slot;
    // (zone, what the forged header says, its generation, the refusal)
    let forged: Vec<(u64, Held, u64, Option<&str>)> = vec![
        (0, Held::Segment(u64::MAX), 7, None),
        (1, Held::Segment(u64::MAX - 2), u64::MAX, None),
        (2, Held::Segment((1 << 62) + 1), 1 << 62, None),
        (0, Held::Spare, u64::MAX, None),
        (1, Held::Free, u64::MAX - 1, None),
        // A newer copy of a live segment, all zeros: the real slot looks
        // stale and is freed, and parity must bring the segment back.
        (1, Held::Segment(1), (1 << 63) - 1, None),
        (2, Held::Segment(1 << 40), 9, Some("belongs to zone 1")),
    ];
    for (case, (zone, held, gen, refusal)) in forged.into_iter().enumerate() {
        let what = format!("case {case}: zone {zone}, {held:?} at generation {gen}");
        let dir = tempfile::tempdir().unwrap();
        let cfg = device_config(dir.path(), 16);
        let mut rng = ChaCha8Rng::seed_from_u64(case as u64);
        let mut model = Model::new();
        let store = Arc::new(Store::open(cfg.clone()).unwrap());
        append_burst(&store, &mut model, &mut rng, 30);
        drop(store);
        let dev = &cfg.devices[zone as usize];
        let used: Vec<u64> = slots(&cfg)
            .values()
            .filter(|(d, _)| d == dev)
            .map(|(_, s)| *s)
            .collect();
        let free = (0..16).rev().find(|s| !used.contains(s)).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(dev).unwrap();
        f.write_all_at(
            &encode_slot(held, free, slot_bytes(SEG), gen),
            header_at(free),
        )
        .unwrap();
        drop(f);
        let opened = Store::open(cfg.clone());
        let store = match (opened, refusal) {
            (Ok(s), None) => Arc::new(s),
            (Err(e), Some(says)) => {
                assert!(e.to_string().contains(says), "{what}: {e}");
                continue;
            }
            (Ok(_), Some(_)) => panic!("{what}: opened"),
            (Err(e), None) => panic!("{what}: {e}"),
        };
        // Headers from a generation a store cannot reach are numbered
        // again by the open, so the writes after it stay valid headers.
        let top = top_generation(dev);
        assert!(top < 1 << 62, "{what}: generation {top} after the open");
        check_at(&store, &model, &what);
        append_burst(&store, &mut model, &mut rng, 30);
        check_at(&store, &model, &what);
        drop(store);
        let store = Store::open(cfg.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
        check_at(&store, &model, &what);
    }
}

/// The highest generation among `dev`'s valid slot headers.
fn top_generation(dev: &Path) -> u64 {
    let f = std::fs::File::open(dev).unwrap();
    let n = (f.metadata().unwrap().len() - HEADER_BYTES) / (HEADER_BYTES + slot_bytes(SEG));
    (0..n)
        .filter_map(|slot| {
            let mut b = [0u8; 64];
            f.read_exact_at(&mut b, header_at(slot)).unwrap();
            decode_slot(&b, slot, slot_bytes(SEG)).map(|(_, g)| g)
        })
        .max()
        .unwrap_or(0)
}
