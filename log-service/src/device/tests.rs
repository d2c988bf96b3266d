use super::*;
use proptest::prelude::*;

const SEG: u64 = 64 << 10;

fn image(slots: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("dev.img");
    let f = File::create(&path).expect("create");
    f.set_len(HEADER_BYTES + slots * (HEADER_BYTES + slot_bytes(SEG)) + 100)
        .expect("size");
    (dir, path)
}

/// The flush key names the device one flush covers: a block device's
/// own number; for an image on ext4 or xfs, its file system's device;
/// none on a file system where write-back is not sound (tmpfs), so
/// the rounds fsync that image itself.
#[test]
fn flush_key_is_the_device_one_flush_covers() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    // Any block device of this machine: its metadata only, never
    // opened.
    let block = std::fs::read_dir("/dev")
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| e.file_type().is_ok_and(|t| t.is_block_device()));
    if let Some(b) = block {
        let rdev = std::fs::metadata(b.path()).expect("stat").rdev();
        assert_eq!(flush_key(&b.path()), Some(rdev), "{}", b.path().display());
    }
    let (dir, path) = image(1);
    let fs_dev = std::fs::metadata(dir.path()).expect("stat").dev();
    match crate::flush::write_back_device(dir.path()) {
        Some(dev) => {
            assert_eq!(dev, fs_dev);
            assert_eq!(flush_key(&path), Some(fs_dev));
        }
        None => assert_eq!(flush_key(&path), None),
    }
    if let Ok(shm) = tempfile::tempdir_in("/dev/shm") {
        let p = shm.path().join("dev.img");
        File::create(&p).expect("create");
        if rustix::fs::statfs(shm.path()).is_ok_and(|s| s.f_type == 0x0102_1994) {
            assert_eq!(flush_key(&p), None, "an image on tmpfs");
        }
    }
}

#[test]
fn labels_and_slot_headers_round_trip_and_any_changed_byte_is_refused() {
    let l = Label {
        zone: 3,
        zones: 9,
        segment_bytes: SEG,
        slot_bytes: slot_bytes(SEG),
    };
    let b = l.encode();
    assert_eq!(Label::decode(&b), Some(l));
    for i in 0..b.len() {
        let mut c = b;
        c[i] ^= 1;
        assert_eq!(Label::decode(&c), None, "label byte {i}");
    }
    for held in [Held::Free, Held::Spare, Held::Segment(77)] {
        let h = encode_slot(held, 5, 4096, 12);
        assert_eq!(decode_slot(&h, 5, 4096), Some((held, 12)));
        assert_eq!(decode_slot(&h, 6, 4096), None, "another slot's header");
        assert_eq!(decode_slot(&h, 5, 8192), None, "another cut's header");
        for i in 0..h.len() {
            let mut c = h;
            c[i] ^= 1;
            assert_eq!(decode_slot(&c, 5, 4096), None, "header byte {i}");
        }
        // A generation no store reaches is not a header.
        let top = MAX_GENERATION - 1;
        let h = encode_slot(held, 5, 4096, top);
        assert_eq!(decode_slot(&h, 5, 4096), Some((held, top)));
        for gen in [MAX_GENERATION, u64::MAX] {
            let h = encode_slot(held, 5, 4096, gen);
            assert_eq!(decode_slot(&h, 5, 4096), None, "generation {gen}");
        }
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_are_never_a_label_or_header_by_accident(b in proptest::collection::vec(any::<u8>(), 0..64), slot in 0u64..4) {
        // Random bytes almost never carry the magic and checksum; the
        // point is that decoding them does not panic.
        let _ = Label::decode(&b);
        let _ = decode_slot(&b, slot, 4096);
    }
}

#[test]
fn a_zeroed_device_is_labelled_and_a_foreign_or_mismatched_one_refused() {
    let (_d, path) = image(3);
    let dev = Device::open(&path, 1, 5, SEG).expect("new device");
    let found = dev.segments();
    assert_eq!(dev.slots(), 3);
    assert!(found.is_empty());
    drop(dev);
    let dev = Device::open(&path, 1, 5, SEG).expect("reopen");
    drop(dev);
    for (zone, zones, seg) in [(2, 5, SEG), (1, 6, SEG), (1, 5, 2 * SEG)] {
        let e = Device::open(&path, zone, zones, seg).expect_err("mismatch");
        assert!(e.to_string().contains("is labelled for zone 1 of 5"), "{e}");
    }
    let (_d2, other) = image(3);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&other)
        .and_then(|f| f.write_all_at(b"ext4 or whatever", 1024))
        .expect("foreign data");
    let e = Device::open(&other, 0, 5, SEG).expect_err("foreign");
    assert!(e.to_string().contains("not a MeldDB log label"), "{e}");
    let mut first = vec![9u8; 16];
    File::open(&other)
        .and_then(|f| f.read_exact_at(&mut first, 1024))
        .expect("read");
    assert_eq!(&first, b"ext4 or whatever", "left as it was");
    let small = _d2.path().join("small");
    File::create(&small)
        .and_then(|f| f.set_len(HEADER_BYTES + slot_bytes(SEG)))
        .expect("small");
    let e = Device::open(&small, 0, 5, SEG).expect_err("too small");
    assert!(e.to_string().contains("too small for one slot"), "{e}");
}

#[test]
fn a_second_open_of_a_held_device_is_refused() {
    let (_d, path) = image(2);
    let dev = Device::open(&path, 0, 3, SEG).expect("open");
    let start = Instant::now();
    let e = Device::open(&path, 0, 3, SEG).expect_err("held");
    assert!(
        matches!(&e, OpenError::DeviceInUse { device, .. } if *device == path),
        "{e}"
    );
    assert!(start.elapsed() >= HELD_WAIT, "refused only after waiting");
    drop(dev);
    Device::open(&path, 0, 3, SEG).expect("released");
}

/// A restart right after a kill finds the device still held while the
/// kernel finishes the dead process's `io_uring` writes; the open
/// waits for it instead of refusing.
#[test]
fn a_device_let_go_while_an_open_waits_is_taken() {
    let (_d, path) = image(2);
    let dev = Device::open(&path, 0, 3, SEG).expect("open");
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(dev);
    });
    let start = Instant::now();
    Device::open(&path, 0, 3, SEG).expect("taken once let go");
    assert!(start.elapsed() >= Duration::from_millis(300));
    holder.join().expect("holder");
    // A wait shorter than the hold still refuses.
    let dev = Device::open(&path, 0, 3, SEG).expect("open");
    let e = open_exclusive(&path, Duration::from_millis(100)).expect_err("held");
    assert_eq!(e.kind(), io::ErrorKind::ResourceBusy, "{e}");
    drop(dev);
}

#[test]
fn slots_keep_their_segments_across_opens_and_the_newest_header_wins() {
    let (_d, path) = image(4);
    let dev = Device::open(&path, 0, 3, SEG).expect("open");
    let a = dev.zeroed_slot().expect("zero").expect("slot").0;
    let f = dev.assign(a, 30).expect("assign");
    f.write_all_at(b"page of segment 30", 0).expect("write");
    let s = dev.zeroed_slot().expect("zero").expect("slot").0;
    dev.make_spare(s).expect("spare");
    dev.sync().expect("sync");
    assert_eq!(dev.spares(), 1);
    drop((dev, f));
    let dev = Device::open(&path, 0, 3, SEG).expect("reopen");
    let found = dev.segments();
    assert_eq!(found, vec![(30, a)]);
    assert_eq!(dev.spares(), 1);
    let mut back = [0u8; 18];
    dev.seg_file(a)
        .and_then(|f| f.read_exact_at(&mut back, 0))
        .expect("read");
    assert_eq!(&back, b"page of segment 30");
    // A repair cut short: a second slot names segment 30 with a newer
    // header; the open keeps it and frees the first.
    let b = dev.take_spare().expect("spare");
    dev.assign(b, 30).expect("assign");
    dev.sync().expect("sync");
    drop(dev);
    let dev = Device::open(&path, 0, 3, SEG).expect("reopen");
    let found = dev.segments();
    assert_eq!(found, vec![(30, b)]);
    assert_eq!(dev.slot_of(30), Some(b));
    drop(dev);
    let found = Device::open(&path, 0, 3, SEG).expect("reopen").segments();
    assert_eq!(found, vec![(30, b)], "the stale slot stays free");
}

/// The first header written after an open is newer than every header
/// on the device, even when the newest was the segment's own: a
/// repair cut short right after it must still win at the next open.
#[test]
fn the_first_header_after_an_open_outranks_the_newest_before_it() {
    let (_d, path) = image(4);
    let dev = Device::open(&path, 0, 3, SEG).expect("open");
    let a = dev.zeroed_slot().expect("zero").expect("slot").0;
    dev.assign(a, 9).expect("assign");
    dev.sync().expect("sync");
    drop(dev);
    let dev = Device::open(&path, 0, 3, SEG).expect("reopen");
    let b = dev.zeroed_slot().expect("zero").expect("slot").0;
    assert!(b > a, "the rebuilt copy is in a later slot ({a}, {b})");
    dev.assign(b, 9).expect("assign");
    dev.sync().expect("sync");
    drop(dev);
    let found = Device::open(&path, 0, 3, SEG).expect("reopen").segments();
    assert_eq!(found, vec![(9, b)]);
    // And within one open, each header outranks the one before: of
    // two later copies, the second wins, whatever the slot order.
    let dev = Device::open(&path, 0, 3, SEG).expect("reopen");
    let c = dev.zeroed_slot().expect("zero").expect("slot").0;
    let d = dev.zeroed_slot().expect("zero").expect("slot").0;
    assert!(c < d, "({c}, {d})");
    dev.assign(c, 9).expect("assign");
    dev.assign(d, 9).expect("assign again");
    dev.sync().expect("sync");
    drop(dev);
    let found = Device::open(&path, 0, 3, SEG).expect("reopen").segments();
    assert_eq!(found, vec![(9, d)]);
}

/// `zero` clears exactly the range asked for, inside the slot named,
/// and refuses one that runs past the slot's end: every slot and
/// header around it keeps its bytes.
#[test]
fn zeroing_clears_exactly_its_range_of_its_slot_and_refuses_one_past_the_end() {
    let (_d, path) = image(3);
    let dev = Device::open(&path, 0, 3, SEG).expect("open");
    let sb = dev.slot_bytes();
    let mut files = Vec::new();
    for seg in 0..3 {
        let s = dev.zeroed_slot().expect("zero").expect("slot").0;
        assert_eq!(s, seg, "slots are taken lowest first");
        let f = dev.assign(s, seg).expect("assign");
        f.write_all_at(&vec![0xA0 + seg as u8; sb as usize], 0)
            .expect("fill");
        files.push(f);
    }
    let whole = || std::fs::read(&path).expect("read image");
    let before = whole();
    let (off, len) = (3 * 4096 + 100, 5 * 4096 + 7);
    dev.zero(1, off, len).expect("zero a range");
    let after = whole();
    let start = (dev.header_at(1) + HEADER_BYTES + off) as usize;
    let end = start + len as usize;
    assert!(
        after[start..end].iter().all(|&b| b == 0),
        "the range is zeros"
    );
    assert_eq!(&after[..start], &before[..start], "bytes before it");
    assert_eq!(&after[end..], &before[end..], "bytes after it");
    // Up to the slot's last byte, and not one past it.
    dev.zero(1, sb - 10, 10).expect("the slot's last bytes");
    for (off, len) in [(sb - 10, 11), (sb, 1), (0, sb + 1), (u64::MAX, 2)] {
        let e = dev.zero(1, off, len).expect_err("past the slot");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{off} + {len}: {e}");
    }
    let last = whole();
    let slot_end = (dev.header_at(2)) as usize;
    assert!(last[slot_end - 10..slot_end].iter().all(|&b| b == 0));
    assert_eq!(&last[slot_end..], &before[slot_end..], "the next slot");
}

#[test]
fn a_full_device_has_no_slot_and_a_freed_slot_comes_back_zeroed() {
    let (_d, path) = image(2);
    let dev = Device::open(&path, 0, 3, SEG).expect("open");
    let a = dev.zeroed_slot().expect("zero").expect("first").0;
    let fa = dev.assign(a, 3).expect("assign");
    let b = dev.zeroed_slot().expect("zero").expect("second").0;
    dev.assign(b, 6).expect("assign");
    assert_eq!(dev.zeroed_slot().expect("no error"), None);
    fa.write_all_at(&[7u8; 5000], 100).expect("write");
    dev.free(a).expect("free");
    let c = dev.zeroed_slot().expect("zero").expect("freed slot").0;
    assert_eq!(c, a);
    let mut back = vec![1u8; dev.slot_bytes() as usize];
    dev.seg_file(c)
        .and_then(|f| f.read_exact_at(&mut back, 0))
        .expect("read");
    assert!(back.iter().all(|&x| x == 0), "reused slot is zeros");
}
