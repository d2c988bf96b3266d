//! The segment-file log: contents survive reopening, a torn tail is cut
//! off, corruption of acknowledged records is reported, trims persist.

use std::fs;
use std::path::{Path, PathBuf};

use super::{FileLog, FileLogError};
use melddb::{Log, LogError};

fn entry(i: u64) -> Vec<u8> {
    format!("entry-{i}-{}", "x".repeat((i % 50) as usize)).into_bytes()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v
}

fn filled(dir: &Path, n: u64, seg: u64) -> FileLog {
    let (mut log, _) = FileLog::open_with(dir, seg).unwrap();
    for i in 0..n {
        assert_eq!(log.append(&entry(i)).unwrap(), i);
    }
    log.sync().unwrap();
    log
}

#[test]
fn entries_survive_reopening_across_segments() {
    let d = tempfile::tempdir().unwrap();
    drop(filled(d.path(), 300, 2048));
    assert!(segments(d.path()).len() > 5, "small segments must roll");
    let (log, report) = FileLog::open_with(d.path(), 2048).unwrap();
    assert_eq!((report.records, report.torn_bytes), (300, 0));
    for i in 0..300 {
        assert_eq!(&log.read(i).unwrap()[..], &entry(i)[..]);
    }
    assert!(matches!(
        log.read(300),
        Err(FileLogError::NotYetWritten { .. })
    ));
    assert!(matches!(
        Log::read(&log, 300),
        Err(LogError::NotYetWritten { .. })
    ));
}

#[test]
fn a_torn_tail_is_cut_off_and_appending_continues() {
    for (cut, zero_instead) in [(1u64, false), (5, true), (17, false), (30, true)] {
        let d = tempfile::tempdir().unwrap();
        drop(filled(d.path(), 40, 1 << 20));
        let last = segments(d.path()).pop().unwrap();
        // The file is zero-filled ahead of the data: find the data's end.
        let len = 8 + (0..40).map(|i| 16 + entry(i).len() as u64).sum::<u64>();
        assert!(
            fs::metadata(&last).unwrap().len() > len,
            "zero-filled ahead"
        );
        // The last record loses its final `cut` bytes, as after a crash
        // in the middle of an (unacknowledged) write: either the file is
        // shorter, or (inside the zero-filled space) the bytes never left
        // their zeros.
        let f = fs::OpenOptions::new().write(true).open(&last).unwrap();
        if zero_instead {
            use std::os::unix::fs::FileExt;
            f.write_all_at(&vec![0u8; cut as usize], len - cut).unwrap();
        } else {
            f.set_len(len - cut).unwrap();
        }
        drop(f);
        let (mut log, report) = FileLog::open_with(d.path(), 1 << 20).unwrap();
        assert_eq!(report.records, 39, "cut {cut}");
        assert!(report.torn_bytes > 0);
        assert_eq!(log.append(b"after").unwrap(), 39);
        log.sync().unwrap();
        drop(log);
        let (log, _) = FileLog::open_with(d.path(), 1 << 20).unwrap();
        assert_eq!(&log.read(39).unwrap()[..], b"after");
        assert_eq!(&log.read(38).unwrap()[..], &entry(38)[..]);
    }
}

#[test]
fn garbage_after_the_last_record_is_cut_off() {
    let d = tempfile::tempdir().unwrap();
    drop(filled(d.path(), 10, 1 << 20));
    let last = segments(d.path()).pop().unwrap();
    // Garbage right after the last record, in the zero-filled space.
    let end = 8 + (0..10).map(|i| 16 + entry(i).len() as u64).sum::<u64>();
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&last).unwrap();
        f.write_all_at(&[0xAB; 11], end).unwrap();
    }
    let (log, report) = FileLog::open(d.path()).unwrap();
    assert_eq!((report.records, report.torn_bytes), (10, 11));
    assert_eq!(log.tail(), 10);
    drop(log);
    // The garbage was zeroed, not left to be mistaken for data later.
    let bytes = fs::read(&last).unwrap();
    assert!(bytes[end as usize..].iter().all(|b| *b == 0));
}

#[test]
fn a_flipped_bit_in_an_acknowledged_record_is_reported_not_used() {
    let d = tempfile::tempdir().unwrap();
    drop(filled(d.path(), 50, 1 << 20));
    let seg = segments(d.path()).pop().unwrap();
    let mut bytes = fs::read(&seg).unwrap();
    // A byte inside an early record: valid records follow it.
    let at = 8 + 16 + 3;
    for bit in 0..8 {
        let mut b = bytes.clone();
        b[at] ^= 1 << bit;
        fs::write(&seg, &b).unwrap();
        match FileLog::open(d.path()) {
            Err(FileLogError::Corrupt { offset, .. }) => assert_eq!(offset, 8),
            other => panic!("bit {bit}: {other:?}"),
        }
    }
    // Every byte of a record in the middle, one at a time.
    let (log, _) = {
        fs::write(&seg, &bytes).unwrap();
        FileLog::open(d.path()).unwrap()
    };
    drop(log);
    let mid = 8 + (16 + entry(0).len()) + (16 + entry(1).len());
    for i in mid..mid + 16 + entry(2).len() {
        let keep = bytes[i];
        bytes[i] ^= 0x20;
        fs::write(&seg, &bytes).unwrap();
        assert!(
            matches!(FileLog::open(d.path()), Err(FileLogError::Corrupt { .. })),
            "byte {i}"
        );
        bytes[i] = keep;
    }
}

#[test]
fn trimmed_positions_stay_unreadable_after_reopening() {
    let d = tempfile::tempdir().unwrap();
    let mut log = filled(d.path(), 200, 1024);
    let before = segments(d.path()).len();
    log.trim(120).unwrap();
    assert!(
        segments(d.path()).len() < before,
        "whole segments below 120 are deleted"
    );
    assert!(matches!(log.read(119), Err(FileLogError::Trimmed { .. })));
    assert!(matches!(
        Log::read(&log, 119),
        Err(LogError::Trimmed { .. })
    ));
    assert_eq!(&log.read(120).unwrap()[..], &entry(120)[..]);
    assert!(matches!(
        Log::trim(&mut log, 500),
        Err(LogError::TrimBeyondTail { .. })
    ));
    drop(log);
    let (mut log, _) = FileLog::open_with(d.path(), 1024).unwrap();
    assert_eq!(log.first(), 120);
    assert!(matches!(log.read(100), Err(FileLogError::Trimmed { .. })));
    assert_eq!(
        log.append(b"next").unwrap(),
        200,
        "positions are never reused"
    );
}
