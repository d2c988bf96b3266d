//! The small metadata file kept in every zone: trim points, tail floors
//! (so positions are never reused after a log is trimmed empty and its
//! segments freed), and the stripe numbers recovery must ignore.
//!
//! Written with write-to-temporary, fsync, rename, fsync-directory in every
//! zone; opened by taking the highest version that parses in any zone.
//!
//! Each zone also keeps a reserve file ([`RESERVE_FILE`]) that nothing
//! reads. A trim must write the metadata before it deletes segments, so on
//! a file system with no byte left the write that would make room could
//! never happen. A write that finds no space shortens the reserve by a
//! write's worth and tries again; once it is written, the reserve takes
//! back what the write freed (the replaced file's blocks), so one reserve
//! pays for any number of metadata writes, even while another program
//! takes every byte it can. A reserve that could not be made whole is
//! topped up once there is room.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::segment::sync_dir;

/// File name in each zone.
pub const FILE: &str = "meta.json";

/// Name of the reserve file in each zone (see the module docs).
pub const RESERVE_FILE: &str = "reserve";

/// The reserve's size: four times the metadata, and at least this.
const RESERVE_MIN: u64 = 64 << 10;

/// Blocks are counted in this unit (the common file-system block; a
/// larger one only makes each step give up more).
const RESERVE_BLOCK: u64 = 4096;

/// Counts in the file stay below this ([`Meta::check`]): a store counts
/// one at a time from 0 and never gets near it.
pub const LIMIT: u64 = 1 << 62;

/// Per-log persisted bounds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LogMeta {
    /// First readable position.
    pub first: u64,
    /// Positions below this were handed out; the tail never goes lower.
    pub tail_floor: u64,
}

/// The metadata.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Meta {
    /// Increases with every write.
    pub version: u64,
    /// Every stripe up to this one was complete when the file was written;
    /// recovery only looks for holes above it.
    pub stable_seq: u64,
    /// Stripe numbers whose pages may exist but which were never
    /// acknowledged (a failed write, or a hole found by recovery).
    pub discarded: Vec<(u64, u64)>,
    /// Stripe numbers below this are never handed out again.
    pub next_seq_floor: u64,
    /// The logs.
    pub logs: BTreeMap<String, LogMeta>,
    /// Whether the segments are slots of devices (`devices`) rather than
    /// files in the zone directories; an open with the other layout is
    /// refused, since it would find no segments and take the logs as
    /// trimmed. Absent in metadata written before devices existed: files.
    #[serde(default)]
    pub on_devices: bool,
}

impl Meta {
    /// Whether stripe `seq` was discarded.
    pub fn is_discarded(&self, seq: u64) -> bool {
        self.discarded.iter().any(|&(a, b)| a <= seq && seq <= b)
    }

    /// Loads the newest readable copy; `Ok(None)` if no zone has one,
    /// an error if copies exist but none parses.
    pub fn load(zones: &[PathBuf]) -> Result<Option<Meta>, String> {
        let mut best: Option<Meta> = None;
        let mut errors = Vec::new();
        for z in zones {
            let p = z.join(FILE);
            match std::fs::read(&p) {
                Ok(bytes) => match serde_json::from_slice::<Meta>(&bytes)
                    .map_err(|e| e.to_string())
                    .and_then(|m| m.check().map(|()| m))
                {
                    Ok(m) => {
                        if best.as_ref().is_none_or(|b| m.version > b.version) {
                            best = Some(m);
                        }
                    }
                    Err(e) => errors.push(format!("{}: {e}", p.display())),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => errors.push(format!("{}: {e}", p.display())),
            }
        }
        match best {
            Some(m) => Ok(Some(m)),
            None if errors.is_empty() => Ok(None),
            None => Err(errors.join("; ")),
        }
    }

    /// Whether every stripe number from `lo` to `hi` (inclusive) was
    /// discarded, across any number of ranges.
    pub fn covers(&self, lo: u64, hi: u64) -> bool {
        self.discarded_through(lo).is_some_and(|end| end >= hi)
    }

    /// The last stripe number of the discarded run that starts at `seq`
    /// (ranges that touch or overlap make one run), or `None` if `seq`
    /// was not discarded. Lets a walk over stripe numbers jump a
    /// discarded run in one step, however long it is.
    pub fn discarded_through(&self, seq: u64) -> Option<u64> {
        let mut ranges = self.discarded.clone();
        ranges.sort_unstable();
        let mut next = seq;
        for (a, b) in ranges {
            if a > next {
                break;
            }
            next = next.max(b.saturating_add(1));
        }
        (next > seq).then(|| next - 1)
    }

    /// Refuses numbers no store writes, which would otherwise overflow
    /// the counting that starts from them: every count (versions, stripe
    /// numbers, positions) goes up one at a time from 0 and stays below
    /// [`LIMIT`]; a log's first position is at most its tail floor, and a
    /// discarded range runs upwards. A copy that breaks one was edited or
    /// damaged, and [`Meta::load`] takes it as unreadable.
    pub fn check(&self) -> Result<(), String> {
        let within = |what: &str, n: u64| {
            if n < LIMIT {
                Ok(())
            } else {
                Err(format!(
                    "{what} is {n}, beyond what a store counts to (2^62): the file was edited or damaged"
                ))
            }
        };
        within("version", self.version)?;
        within("stable_seq", self.stable_seq)?;
        within("next_seq_floor", self.next_seq_floor)?;
        for &(a, b) in &self.discarded {
            within("a discarded stripe", b)?;
            if a > b {
                return Err(format!("discarded range [{a}, {b}] runs backwards"));
            }
        }
        for (log, l) in &self.logs {
            within(&format!("log {log:?}'s tail_floor"), l.tail_floor)?;
            if l.first > l.tail_floor {
                return Err(format!(
                    "log {log:?}'s first position {} is past its tail_floor {}",
                    l.first, l.tail_floor
                ));
            }
        }
        Ok(())
    }

    /// Writes the next version to every zone. Refused, with nothing
    /// written, when that version would reach [`LIMIT`]: [`Meta::load`]
    /// would refuse the file, so the next open would find no metadata it
    /// can take (only an edited file gets that far).
    pub fn store(&mut self, zones: &[PathBuf]) -> std::io::Result<()> {
        if self.version + 1 >= LIMIT {
            return Err(std::io::Error::other(format!(
                "the metadata's version {} would reach 2^62, the most a store counts to (meta.json was edited to a number near it); nothing was written: set \"version\" to a lower number in every zone's {FILE}",
                self.version
            )));
        }
        self.version += 1;
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        // What one write may need beyond the file it replaces: the new
        // file's blocks, and one more for the directory or the file
        // system's own bookkeeping.
        let step = (bytes.len() as u64).next_multiple_of(RESERVE_BLOCK) + RESERVE_BLOCK;
        let mut paid = false;
        for z in zones {
            loop {
                match write_atomic(z, &bytes) {
                    Err(e) if crate::error::no_space(&e) && shorten_reserve(z, step) => {
                        tracing::warn!(zone = %z.display(), "no space left for the metadata: its reserve file gave up {step} bytes to write it");
                        paid = true;
                    }
                    r => {
                        r?;
                        break;
                    }
                }
            }
        }
        if paid {
            // The replaced files' blocks are free now: back into the
            // reserves before anything else takes them.
            keep_reserve(zones, bytes.len() as u64);
        }
        Ok(())
    }

    /// Makes each zone's reserve file whole where it is missing or short:
    /// at the open, and after a trim deleted segments. Four times the
    /// metadata's size, at least 64 KiB, written rather than sparse, and
    /// not synced; topped up as far as there is room, the rest left for a
    /// later call.
    pub fn keep_reserve(&self, zones: &[PathBuf]) {
        if let Ok(bytes) = serde_json::to_vec_pretty(self) {
            keep_reserve(zones, bytes.len() as u64);
        }
    }
}

/// Gives up `step` bytes of `zone`'s reserve file (all of it when it
/// holds no more); whether there was any to give.
fn shorten_reserve(zone: &Path, step: u64) -> bool {
    let path = zone.join(RESERVE_FILE);
    let Ok(len) = std::fs::metadata(&path).map(|m| m.len()) else {
        return false;
    };
    let keep = len.saturating_sub(step) / RESERVE_BLOCK * RESERVE_BLOCK;
    if keep == 0 {
        return std::fs::remove_file(&path).is_ok();
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(keep))
        .is_ok()
}

/// Brings each zone's reserve file up to four times `meta_len` bytes, at
/// least [`RESERVE_MIN`], where it is missing or short. Written, not
/// sparse, so its blocks are really taken; not synced, since a reserve a
/// crash lost is only made again. Where there is not room for all of it,
/// it keeps the whole blocks it got (a shorter reserve still pays for a
/// write or two) and is topped up by a later call: the store works
/// without it.
fn keep_reserve(zones: &[PathBuf], meta_len: u64) {
    let want = (4 * meta_len)
        .max(RESERVE_MIN)
        .next_multiple_of(RESERVE_BLOCK);
    for z in zones {
        let path = z.join(RESERVE_FILE);
        let Ok(f) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        else {
            continue;
        };
        let len = f.metadata().map_or(0, |m| m.len());
        if len >= want {
            continue;
        }
        // From its last whole block: a block a failed write left partly
        // written is written again (and `shorten_reserve` counts whole
        // blocks only).
        let zeros = vec![0u8; RESERVE_BLOCK as usize];
        let mut at = len / RESERVE_BLOCK * RESERVE_BLOCK;
        while at < want && std::os::unix::fs::FileExt::write_all_at(&f, &zeros, at).is_ok() {
            at += RESERVE_BLOCK;
        }
        if at == 0 {
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn write_atomic(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join("meta.json.tmp");
    {
        let f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut &f, bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(FILE))?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn zones(n: usize) -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let zones = (0..n)
            .map(|i| {
                let z = dir.path().join(format!("z{i}"));
                std::fs::create_dir(&z).expect("zone dir");
                z
            })
            .collect();
        (dir, zones)
    }

    fn with_version(version: u64) -> Meta {
        Meta {
            version,
            stable_seq: version * 10,
            ..Meta::default()
        }
    }

    proptest! {
        /// Against the set of every stripe number the ranges cover (both
        /// ends included).
        #[test]
        fn discarded_ranges_cover_exactly_their_stripes(
            ranges in proptest::collection::vec((0u64..40, 0u64..6), 0..5),
        ) {
            let discarded: Vec<(u64, u64)> = ranges.iter().map(|&(a, w)| (a, a + w)).collect();
            let model: BTreeSet<u64> = discarded.iter().flat_map(|&(a, b)| a..=b).collect();
            let m = Meta { discarded, ..Meta::default() };
            for seq in 0..50 {
                prop_assert_eq!(m.is_discarded(seq), model.contains(&seq), "stripe {}", seq);
                // The run from `seq`: the model's consecutive members.
                let run_end = (seq..60).take_while(|s| model.contains(s)).last();
                prop_assert_eq!(m.discarded_through(seq), run_end, "run from {}", seq);
                for hi in seq..50 {
                    let all = (seq..=hi).all(|s| model.contains(&s));
                    prop_assert_eq!(m.covers(seq, hi), all, "{}..={}", seq, hi);
                }
            }
        }
    }

    #[test]
    fn store_writes_the_next_version_to_every_zone_and_load_reads_it_back() {
        let (_d, zs) = zones(3);
        assert_eq!(Meta::load(&zs), Ok(None), "no copy anywhere");
        let mut m = with_version(0);
        m.logs.insert(
            "a".into(),
            LogMeta {
                first: 3,
                tail_floor: 9,
            },
        );
        m.store(&zs).expect("store");
        m.store(&zs).expect("store");
        assert_eq!(m.version, 2);
        for z in &zs {
            assert!(!z.join("meta.json.tmp").exists(), "temporary left behind");
            let copy: Meta =
                serde_json::from_slice(&std::fs::read(z.join(FILE)).expect("read")).expect("parse");
            assert_eq!(copy, m);
        }
        assert_eq!(Meta::load(&zs), Ok(Some(m)));
    }

    #[test]
    fn load_takes_the_newest_copy_that_parses_whichever_zone_holds_it() {
        for newest in 0..3 {
            let (_d, zs) = zones(3);
            for (i, z) in zs.iter().enumerate() {
                let v = if i == newest { 7 } else { 5 };
                write_atomic(z, &serde_json::to_vec(&with_version(v)).unwrap()).unwrap();
            }
            assert_eq!(
                Meta::load(&zs),
                Ok(Some(with_version(7))),
                "newest in zone {newest}"
            );
            // A damaged copy of the newest: the next newest that parses.
            std::fs::write(zs[newest].join(FILE), b"{\"version\": 9, trunc").unwrap();
            assert_eq!(Meta::load(&zs), Ok(Some(with_version(5))));
        }
    }

    /// What a store writes passes the check at its edges: a range of one
    /// stripe (a hole at the highest stripe found), a log trimmed to its
    /// tail, counts just below the limit.
    #[test]
    fn the_check_takes_every_edge_a_store_writes() {
        let mut m = Meta {
            version: LIMIT - 1,
            stable_seq: LIMIT - 1,
            next_seq_floor: LIMIT - 1,
            discarded: vec![(5, 5), (0, LIMIT - 1)],
            ..Meta::default()
        };
        m.logs.insert(
            "a".into(),
            LogMeta {
                first: 7,
                tail_floor: 7,
            },
        );
        assert_eq!(m.check(), Ok(()));
        m.discarded.push((6, 5));
        assert!(m.check().unwrap_err().contains("runs backwards"));
    }

    #[test]
    fn copies_that_exist_but_none_parses_are_an_error_naming_them() {
        let (_d, zs) = zones(2);
        std::fs::write(zs[0].join(FILE), b"not json").unwrap();
        // A copy that cannot be read at all (here a directory in its place).
        std::fs::create_dir(zs[1].join(FILE)).unwrap();
        let e = Meta::load(&zs).expect_err("nothing parses");
        for z in &zs {
            assert!(e.contains(&z.join(FILE).display().to_string()), "{e}");
        }
        // One good copy beside them is enough.
        let (_d2, mut more) = zones(1);
        write_atomic(&more[0], &serde_json::to_vec(&with_version(1)).unwrap()).unwrap();
        more.extend(zs);
        assert_eq!(Meta::load(&more), Ok(Some(with_version(1))));
    }

    #[test]
    fn the_reserve_is_four_times_the_metadata_at_least_64_kib_and_topped_up_when_short() {
        let (_d, zs) = zones(2);
        let mut m = with_version(0);
        m.store(&zs).expect("store");
        let len = |z: &PathBuf| {
            std::fs::metadata(z.join(RESERVE_FILE))
                .map(|m| m.len())
                .ok()
        };
        assert_eq!(len(&zs[0]), None, "a store alone makes no reserve");
        m.keep_reserve(&zs);
        assert_eq!(len(&zs[0]), Some(RESERVE_MIN));
        assert_eq!(len(&zs[1]), Some(RESERVE_MIN));
        // Many logs: the metadata outgrows a quarter of the minimum.
        for i in 0..2_000 {
            m.logs.insert(format!("log-{i:05}"), LogMeta::default());
        }
        m.store(&zs).expect("store");
        // A short reserve, not a whole block long: topped up, not
        // taken as whole.
        std::fs::write(zs[1].join(RESERVE_FILE), b"short").expect("write");
        m.keep_reserve(&zs);
        let meta_len = std::fs::metadata(zs[0].join(FILE)).expect("meta").len();
        for z in &zs {
            let r = len(z).expect("reserve");
            assert!(
                r >= 4 * meta_len && r > RESERVE_MIN && r % RESERVE_BLOCK == 0,
                "{r} for {meta_len}"
            );
            let bytes = std::fs::read(z.join(RESERVE_FILE)).expect("read");
            assert!(
                bytes.iter().all(|&b| b == 0),
                "written zeros, not a stale copy"
            );
        }
    }

    #[test]
    fn a_reserve_gives_up_a_step_at_a_time_in_whole_blocks_until_it_is_gone() {
        let (_d, zs) = zones(1);
        let m = with_version(0);
        m.keep_reserve(&zs);
        let len = || {
            std::fs::metadata(zs[0].join(RESERVE_FILE))
                .map(|m| m.len())
                .ok()
        };
        assert_eq!(len(), Some(RESERVE_MIN));
        let step = 3 * RESERVE_BLOCK - 100;
        // Whole blocks are kept: the step rounds the rest down.
        assert!(shorten_reserve(&zs[0], step));
        assert_eq!(len(), Some(RESERVE_MIN - 3 * RESERVE_BLOCK));
        let mut gave = 1;
        while shorten_reserve(&zs[0], step) {
            gave += 1;
            assert!(gave <= 6, "a 16-block reserve outlived 6 steps of 3");
        }
        assert_eq!(gave, 6, "five steps of 3 blocks, then the last one");
        assert_eq!(len(), None, "the last step removes the file");
        assert!(!shorten_reserve(&zs[0], step));
        // Made whole again from nothing.
        m.keep_reserve(&zs);
        assert_eq!(len(), Some(RESERVE_MIN));
    }
}
