use super::scan::*;
use super::*;
use crate::page::Header;
use std::io::Write;

#[test]
fn an_end_write_is_plausible_only_where_this_store_can_have_written_it() {
    // A record of the copy set 10..13 for a stripe on segments 1, 2, 3.
    let good = crate::samples::end_write();
    let bounds = Bounds {
        segment_len: 1 << 20,
        last_segment: 13,
    };
    for seg in 10..13 {
        assert!(plausible(&good, seg, bounds), "found on segment {seg}");
    }
    assert!(!plausible(&good, 9, bounds), "below its copy set");
    assert!(!plausible(&good, 13, bounds), "above its copy set");
    type Edit = fn(&mut EndWrite);
    let cases: [(&str, Edit); 6] = [
        ("page offset past any segment", |e| {
            e.stripe.pages[0].1 = 1 << 40
        }),
        ("shard longer than a segment", |e| {
            e.stripe.shard_len = u32::MAX
        }),
        ("two pages on one segment", |e| {
            e.stripe.pages[1].0 = e.stripe.pages[0].0
        }),
        ("pages out of order", |e| e.stripe.pages.swap(0, 1)),
        ("pages beyond a window's reach", |e| {
            for (i, p) in e.stripe.pages.iter_mut().enumerate() {
                p.0 = 100 + i as u64;
            }
        }),
        ("a copy-set base near 2^64", |e| e.ew_base = u64::MAX - 1),
    ];
    for (what, edit) in cases {
        let mut bad = good.clone();
        edit(&mut bad);
        assert!(!plausible(&bad, 10, bounds), "{what}");
    }
}

/// A window reaches three end-write segments and two stripe widths
/// past the last segment on disk, and a page must end within its
/// segment: both bounds are inclusive, and one further is refused.
#[test]
fn the_plausible_reach_and_page_end_are_exact() {
    let bounds = Bounds {
        segment_len: 1 << 20,
        last_segment: 13,
    };
    // Width 3: the last page may be on segment 13 + 3 + 2 * 3 = 22.
    let on = |first: u64| {
        let mut e = crate::samples::end_write();
        for (i, p) in e.stripe.pages.iter_mut().enumerate() {
            p.0 = first + i as u64;
        }
        e
    };
    assert!(plausible(&on(20), 10, bounds), "last page on segment 22");
    assert!(!plausible(&on(21), 10, bounds), "last page on segment 23");
    // A page is its 28-byte header and a 64-byte shard.
    let ending_at = |end: u64| {
        let mut e = crate::samples::end_write();
        e.stripe.pages[2].1 = end - (HEADER as u64 + 64);
        e
    };
    assert!(
        plausible(&ending_at(1 << 20), 10, bounds),
        "ends at the segment's end"
    );
    assert!(
        !plausible(&ending_at((1 << 20) + 1), 10, bounds),
        "one byte past it"
    );
}

/// Of a stripe's end-write copies, the one most copies agree on is
/// taken, a tie going to the copy on the lowest segment, and every
/// copy that differs from it counts as one corrupt page.
#[test]
fn the_end_write_most_copies_agree_on_wins_and_ties_go_to_the_lowest_segment() {
    let version = |batch_seq: u64| {
        let mut e = crate::samples::end_write();
        e.batch_seq = batch_seq;
        e
    };
    let copies = |found: &[(u64, u64)]| -> Vec<Copy> {
        found
            .iter()
            .map(|&(seg, v)| Copy {
                seg,
                ew: version(v),
                page_crc: v as u32,
            })
            .collect()
    };
    // (copies as (segment, version) in the order found, the winner's
    // segment and version, corrupt pages)
    type Case = (&'static [(u64, u64)], (u64, u64), u64);
    let cases: [Case; 6] = [
        (&[(11, 1)], (11, 1), 0),
        (&[(12, 1), (10, 1), (11, 1)], (10, 1), 0),
        (&[(10, 2), (11, 1), (12, 1)], (11, 1), 1),
        (&[(12, 1), (11, 1), (10, 2)], (11, 1), 1),
        (&[(12, 3), (10, 1), (11, 2)], (10, 1), 2),
        (&[(11, 2), (12, 1)], (11, 2), 1),
    ];
    for (found, (seg, v), corrupt) in cases {
        let mut report = RecoveryReport::default();
        let mut all = BTreeMap::new();
        all.insert(41, copies(found));
        all.insert(42, copies(&[(11, 7)]));
        let chosen = choose_copies(all, &mut report);
        assert_eq!(chosen.len(), 2, "{found:?}");
        let c = &chosen[&41];
        assert_eq!(
            (c.seg, c.ew.batch_seq, c.page_crc, report.corrupt_pages),
            (seg, v, v as u32, corrupt),
            "{found:?}"
        );
        assert_eq!(chosen[&42].ew.batch_seq, 7);
    }
}

/// How far past an open data segment's data the tests' scans look.
const NEAR: u64 = 1 << 20;

/// An ordered shard page with a body of `n` bytes.
fn shard(n: usize, stripe: u64) -> Vec<u8> {
    let body: Vec<u8> = (0..n).map(|i| (i % 251) as u8 + 1).collect();
    page::encode(
        &Header {
            kind: Kind::Ordered,
            shard: 0,
            k: 4,
            m: 1,
            body_len: n as u32,
            stripe,
            payload_len: n as u32,
        },
        &body,
    )
}

/// A segment file of `pages` followed by `zeros` zero bytes.
fn segment(pages: &[Vec<u8>], zeros: usize) -> (tempfile::TempDir, std::path::PathBuf, u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("seg");
    let mut f = std::fs::File::create(&path).expect("create");
    let mut data = 0;
    for p in pages {
        f.write_all(p).expect("write");
        data += p.len() as u64;
    }
    f.write_all(&vec![0u8; zeros]).expect("write zeros");
    (dir, path, data)
}

fn scan_of(path: &Path) -> Scan {
    let file = SegFile::whole(std::fs::File::open(path).expect("open"));
    scan(path, &file, NEAR).expect("scan")
}

fn poke(path: &Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    f.write_all_at(bytes, at).expect("poke");
}

#[test]
fn pages_of_a_few_kib_and_more_are_walked_by_their_headers_alone() {
    for (n, size) in [(16, 256 << 10), (200, 16 << 10), (400, 5 << 10)] {
        let pages: Vec<Vec<u8>> = (1..=n).map(|s| shard(size, s)).collect();
        let (_d, path, data) = segment(&pages, 0);
        let s = scan_of(&path);
        assert_eq!(s.len, data);
        assert_eq!((s.corrupt, s.damaged_at, s.cut), (0, None, None));
        // A header per page, the first window and the last page whole:
        // well under the data (reading it all, as the scan once did,
        // or a window per page of a few KiB, fails).
        let most = n * HEADER as u64 + WINDOW as u64 + size as u64 + 4096;
        assert!(
            s.read <= most && s.read >= n * HEADER as u64 + size as u64,
            "{size} B pages: read {} of {data} bytes",
            s.read
        );
    }
}

#[test]
fn small_pages_share_reads_and_every_marker_and_end_of_data_is_found() {
    let mut pages: Vec<Vec<u8>> = (1..=3000)
        .map(|s| shard(100 + s as usize % 700, s))
        .collect();
    pages.insert(1000, page::class_marker(class::ORDERED));
    let (_d, path, data) = segment(&pages, 1 << 20);
    let s = scan_of(&path);
    assert_eq!(s.len, data);
    assert_eq!(s.zeroed, data + (1 << 20));
    assert_eq!(s.markers.len(), 1);
    assert_eq!(s.markers[0].1, class::ORDERED);
    assert_eq!((s.corrupt, s.damaged_at, s.cut), (0, None, None));
    // Window reads: a few dozen for about 1.3 MiB of pages, plus the
    // zero tail of a segment still open for writing.
    assert!(
        s.read < data + data / 8 + (1 << 20) + WINDOW as u64,
        "read {}",
        s.read
    );
    // Without a tail every byte read is the walk's: windows of small
    // pages take in nearly all their bodies too (a read per header
    // instead, with no window or small pages walked header by header,
    // reads a tenth of the data).
    let (_d2, path2, data2) = segment(&pages, 0);
    let s2 = scan_of(&path2);
    assert_eq!((s2.len, s2.markers.len()), (data2, 1));
    assert!(
        s2.read >= data2 - data2 / 16 && s2.read < data2 + data2 / 8 + WINDOW as u64,
        "read {} of {data2}",
        s2.read
    );
}

#[test]
fn how_much_of_a_zero_tail_is_read_depends_on_the_segments_class() {
    let shards: Vec<Vec<u8>> = (1..=8).map(|s| shard(256 << 10, s)).collect();
    let with = |marker: Option<u8>, sealed: bool| {
        let mut pages = Vec::new();
        pages.extend(marker.map(page::class_marker));
        pages.extend(shards.iter().cloned());
        if sealed {
            pages.push(page::class_marker(class::SEALED));
        }
        pages
    };
    let tail = 64 << 20;
    for (marker, sealed, most, least) in [
        // No class yet (or end-write): the whole tail.
        (None, false, u64::MAX, tail as u64),
        (Some(class::END_WRITE), false, u64::MAX, tail as u64),
        // An open data segment: `NEAR` bytes of it.
        (Some(class::ORDERED), false, NEAR + (1 << 20), NEAR),
        (Some(class::UNORDERED), false, NEAR + (1 << 20), NEAR),
        // Sealed: none of it.
        (Some(class::ORDERED), true, 1 << 20, 0),
    ] {
        let (_d, path, data) = segment(&with(marker, sealed), tail);
        let s = scan_of(&path);
        assert_eq!((s.len, s.damaged_at), (data, None), "{marker:?} {sealed}");
        assert!(
            s.read >= least && s.read <= most,
            "{marker:?} sealed {sealed}: read {}",
            s.read
        );
    }
}

#[test]
fn bytes_after_a_zeroed_header_mark_a_segment_damaged_as_far_as_the_scan_looks() {
    let mut pages: Vec<Vec<u8>> = vec![page::class_marker(class::ORDERED)];
    pages.extend((1..=6).map(|s| shard(4000, s)));
    let marker = pages[0].len() as u64;
    let page_len = pages[1].len() as u64;
    let (_d, path, _) = segment(&pages, 8 << 20);
    // The fourth shard's first bytes lost (a torn write or damage):
    // pages after it still hold data.
    poke(&path, marker + 3 * page_len, &[0u8; HEADER]);
    let s = scan_of(&path);
    assert_eq!(s.damaged_at, Some(marker + 3 * page_len));
    // Stray bytes just after the data of an open data segment: damage
    // (the scan cannot tell them from a page whose header was torn).
    let (_d2, path2, data2) = segment(&pages, 8 << 20);
    poke(&path2, data2 + NEAR / 2, b"stray");
    assert_eq!(scan_of(&path2).damaged_at, Some(data2));
    // Further on than the scan looks: not data (live pages past the
    // end are found through the end-writes instead).
    let (_d3, path3, data3) = segment(&pages, 8 << 20);
    poke(&path3, data3 + 2 * NEAR, b"stray");
    assert_eq!(scan_of(&path3).damaged_at, None);
    // A segment without a class reads its whole tail.
    let (_d4, path4, data4) = segment(&pages[1..], 8 << 20);
    poke(&path4, data4 + (6 << 20), b"stray");
    assert_eq!(scan_of(&path4).damaged_at, Some(data4));
    // After the seal nothing is written, so bytes there are not data.
    let mut sealed = pages.clone();
    sealed.push(page::class_marker(class::SEALED));
    let (_d5, path5, data5) = segment(&sealed, 8 << 20);
    poke(&path5, data5 + NEAR / 2, b"stray");
    let s5 = scan_of(&path5);
    assert_eq!((s5.damaged_at, s5.len), (None, data5));
}

#[test]
fn a_page_running_past_the_end_is_a_cut_candidate_up_to_the_last_data() {
    let pages: Vec<Vec<u8>> = (1..=4).map(|s| shard(4000, s)).collect();
    let page_len = pages[0].len() as u64;
    let (_d, path, data) = segment(&pages, 0);
    // Truncate inside the last page: torn.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    f.set_len(data - 100).expect("truncate");
    let s = scan_of(&path);
    assert_eq!(s.len, 3 * page_len);
    assert_eq!(s.cut, Some((3 * page_len, data - 100)));
    // A torn last page whose body was zeroed in part: kept, counted.
    let (_d2, path2, data2) = segment(&pages, 1 << 20);
    poke(&path2, data2 - 50, &[0u8; 50]);
    let s2 = scan_of(&path2);
    assert_eq!((s2.len, s2.corrupt, s2.damaged_at), (data2, 1, None));
}

/// A file that ends inside a page header (fewer than its 28 bytes,
/// not all zero) ends in a torn page, like one whose body runs past
/// the end: a cut candidate, not damage.
#[test]
fn a_header_cut_short_at_the_end_is_a_cut_candidate() {
    let mut pages: Vec<Vec<u8>> = (1..=3).map(|s| shard(4000, s)).collect();
    let whole = 3 * pages[0].len() as u64;
    pages.push(shard(4000, 4)[..HEADER / 2].to_vec());
    let (_d, path, data) = segment(&pages, 0);
    let s = scan_of(&path);
    assert_eq!((s.len, s.damaged_at), (whole, None));
    assert_eq!(s.cut, Some((whole, data)));
}

/// End-write pages are kept with their offset, record and stored
/// checksum; one whose record names another stripe than its header,
/// one whose body is not a record, and one failing its checksum are
/// each counted once as corrupt and kept out.
#[test]
fn end_writes_are_kept_with_their_checksum_and_bad_ones_counted() {
    let ew = |seq: u64| {
        let mut e = crate::samples::end_write();
        e.stripe.seq = seq;
        e
    };
    let good = crate::writer::ew_page(&ew(41));
    let other_stripe = crate::writer::repair::ew_page_of(&stripe::encode_end_write(&ew(42)), 43);
    let not_a_record = crate::writer::repair::ew_page_of(b"not an end-write record", 44);
    let bad_crc = crate::writer::ew_page(&ew(45));
    let last = crate::writer::ew_page(&ew(46));
    let pages = vec![
        page::class_marker(class::END_WRITE),
        good.clone(),
        other_stripe,
        not_a_record,
        bad_crc,
        last.clone(),
    ];
    let offsets: Vec<u64> = pages
        .iter()
        .scan(0u64, |at, p| {
            let here = *at;
            *at += p.len() as u64;
            Some(here)
        })
        .collect();
    let (_d, path, data) = segment(&pages, 1 << 16);
    // One byte of the fifth page's body flipped: its checksum fails.
    poke(&path, offsets[4] + HEADER as u64 + 3, &[0xff]);
    let s = scan_of(&path);
    assert_eq!((s.len, s.damaged_at, s.cut), (data, None, None));
    assert_eq!(s.markers, vec![(0, class::END_WRITE)]);
    let kept: Vec<(u64, u64, u32)> = s
        .ews
        .iter()
        .map(|(at, e, crc)| (*at, e.stripe.seq, *crc))
        .collect();
    assert_eq!(
        kept,
        vec![
            (offsets[1], 41, page::stored_crc(&good)),
            (offsets[5], 46, page::stored_crc(&last)),
        ]
    );
    assert_eq!(s.ews[0].1, ew(41));
    assert_eq!(s.corrupt, 3, "the three bad end-write pages");
}

/// `data_end` over ranges longer than its 1 MiB reads: the end of the
/// data inside the range, or the range's start when the range holds
/// only zeros, whatever lies below it.
#[test]
fn the_end_of_data_is_looked_for_inside_the_range_only() {
    let (_d, path, _) = segment(&[vec![0xaa; 4096]], 3 << 20);
    let file = SegFile::whole(std::fs::File::open(&path).expect("open"));
    let len = 4096 + (3 << 20);
    let mut read = 0;
    let from = 1 << 20;
    assert_eq!(data_end(&file, len, from, &mut read).expect("read"), from);
    assert_eq!(read, len - from, "the range, once");
    poke(&path, (2 << 20) + 5, &[1]);
    let mut read = 0;
    assert_eq!(
        data_end(&file, len, from, &mut read).expect("read"),
        (2 << 20) + 6
    );
    assert_eq!(data_end(&file, 4000, 10, &mut read).expect("read"), 4000);
    assert_eq!(data_end(&file, 3000, 3000, &mut read).expect("read"), 3000);
}

/// Bytes past the last whole word of the lowest block are found too.
#[test]
fn a_last_non_zero_byte_after_the_last_whole_word_is_found() {
    for (len, from) in [(13, 8), (5, 0), (4096 + 5, 0), (4096 + 13, 8)] {
        let mut buf = vec![0u8; len];
        buf[from..len % 4096].fill(7);
        assert_eq!(last_non_zero(&buf), Some(len % 4096 - 1), "{len} {from}");
    }
}

#[test]
fn the_last_non_zero_byte_matches_a_byte_by_byte_search() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..400 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 20_000) as usize;
        let mut buf = vec![0u8; len];
        let k = (x >> 20) % 4;
        for j in 0..k {
            if len > 0 {
                let i = ((x >> (24 + 8 * j)) as usize) % len;
                buf[i] = (x >> 8) as u8 | 1;
            }
        }
        assert_eq!(
            last_non_zero(&buf),
            buf.iter().rposition(|&b| b != 0),
            "len {len}"
        );
    }
}
