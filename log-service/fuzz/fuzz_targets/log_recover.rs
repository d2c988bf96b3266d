//! Fuzzes recovery on damaged and hostile segment files. Each input is a
//! list of edits to the files of a small real store (overwrite, flip,
//! truncate, delete, and re-seal a page's checksum so that a hostile page
//! looks intact); the store is then opened on the edited files. Opening
//! must return a store or a typed error, never panic, and an opened store
//! must answer reads, a scrub and an append without panicking; a record it
//! reads must be the one the base store wrote at that position (damage may
//! make a record unreadable, never different). An append it acknowledges
//! must take the log's next position and read back after a second open.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use melddb_log::{page, Store};

mod base;

struct Fixture {
    base: base::Base,
    /// Where each input's files are written.
    work: PathBuf,
}

/// Both directories live under one per-process directory in the system's
/// temporary directory, made afresh when the process starts. libFuzzer
/// exits without dropping statics, so nothing removes it at the end;
/// instead each process removes those of processes that no longer run
/// (about a megabyte each).
static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let parent = std::env::temp_dir().join("melddb-log-fuzz");
    if let Ok(entries) = std::fs::read_dir(&parent) {
        for e in entries.flatten() {
            let gone = e
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
            if gone {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let root = parent.join(std::process::id().to_string());
    let _ = std::fs::remove_dir_all(&root);
    let base_dir = root.join("base");
    std::fs::create_dir_all(&base_dir).expect("create the fuzz base dir");
    Fixture {
        base: base::build(&base_dir),
        work: root.join("work"),
    }
});

/// Reads the input as a stream of small numbers.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.u8()?, self.u8()?]))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes([
            self.u8()?,
            self.u8()?,
            self.u8()?,
            self.u8()?,
        ]))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from(self.u32()?) | u64::from(self.u32()?) << 32)
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

/// Recomputes the checksum of the page at `start`, taking its length from
/// its (possibly edited) header when that still fits the file.
fn seal(bytes: &mut [u8], start: usize, orig_len: usize) {
    if start + page::HEADER > bytes.len() {
        return;
    }
    let len = page::header(&bytes[start..])
        .map(|h| h.page_len() as usize)
        .unwrap_or(orig_len);
    let end = start.saturating_add(len).min(bytes.len());
    if end < start + 8 {
        return;
    }
    let crc = crc32fast::hash(&bytes[start + 8..end]);
    bytes[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Sets the `which`-th number of a `meta.json` (in document order) to a
/// value `how` picks from `v`. Bytes that do not parse are left alone:
/// the byte-level ops already cover a damaged file.
fn edit_meta_number(f: &mut Vec<u8>, which: u8, how: u8, v: u64) {
    fn numbers(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Number(_) => out.push(at),
            serde_json::Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    numbers(x, format!("{at}/{i}"), out);
                }
            }
            serde_json::Value::Object(o) => {
                for (k, x) in o {
                    numbers(x, format!("{at}/{k}"), out);
                }
            }
            _ => {}
        }
    }
    let Ok(mut m) = serde_json::from_slice::<serde_json::Value>(f) else {
        return;
    };
    let mut leaves = Vec::new();
    numbers(&m, String::new(), &mut leaves);
    let Some(at) = leaves.get(which as usize % leaves.len().max(1)) else {
        return;
    };
    let Some(slot) = m.pointer_mut(at) else {
        return;
    };
    let old = slot.as_u64().unwrap_or(0);
    let new = match how % 4 {
        0 => v,
        1 => old.wrapping_add(v % 64),
        2 => old.saturating_sub(v % 64),
        _ => u64::MAX - v % 64,
    };
    *slot = new.into();
    if let Ok(bytes) = serde_json::to_vec(&m) {
        *f = bytes;
    }
}

/// An input starting with this byte may also edit `meta.json` (op 6);
/// without it, ops are taken modulo 6 as before, so the inputs kept under
/// `regressions/` mean what they meant when they were found.
const WITH_META_EDITS: u8 = 0xff;

/// Applies the edits the input describes; `None` files are deleted.
fn edit(base: &base::Base, data: &[u8]) -> Vec<Option<Vec<u8>>> {
    let mut files: Vec<Option<Vec<u8>>> = base.files.iter().map(|(_, b)| Some(b.clone())).collect();
    let (kinds, data) = match data.split_first() {
        Some((&WITH_META_EDITS, rest)) => (7, rest),
        _ => (6, data),
    };
    let mut inp = Input(data);
    for _ in 0..64 {
        let Some(op) = inp.u8().map(|op| op % kinds) else {
            break;
        };
        let Some(sel) = inp.u8() else { break };
        if op == 6 {
            // Rewrite one number of a zone's meta.json, the text file an
            // operator can edit (any value, or one near the old value or
            // near the largest).
            let metas: Vec<usize> = (0..files.len())
                .filter(|&i| base.files[i].0.ends_with(melddb_log::meta::FILE))
                .collect();
            let (Some(which), Some(how), Some(v)) = (inp.u8(), inp.u8(), inp.u64()) else {
                break;
            };
            let Some(f) = metas
                .get(sel as usize % metas.len().max(1))
                .and_then(|&i| files[i].as_mut())
            else {
                continue;
            };
            edit_meta_number(f, which, how, v);
            continue;
        }
        let i = sel as usize % files.len();
        let pages = &base.pages[i];
        let Some(f) = files[i].as_mut() else {
            continue;
        };
        match op {
            0 => {
                // Overwrite with bytes from the input.
                let Some(off) = inp.u32() else { break };
                let Some(n) = inp.u8() else { break };
                let at = off as usize % (f.len() + 1);
                let src = inp.bytes(n as usize).to_vec();
                let end = (at + src.len()).min(f.len());
                f[at..end].copy_from_slice(&src[..end - at]);
            }
            1 => {
                // Flip bits of one byte.
                let (Some(off), Some(x)) = (inp.u32(), inp.u8()) else {
                    break;
                };
                if !f.is_empty() {
                    let at = off as usize % f.len();
                    f[at] ^= x.max(1);
                }
            }
            2 => {
                // Truncate (a torn or lost tail).
                let Some(off) = inp.u32() else { break };
                let keep = off as usize % (f.len() + 1);
                f.truncate(keep);
            }
            3 => {
                // Delete the file.
                files[i] = None;
            }
            4 | 5 => {
                // Rewrite a field of a page (op 5) and seal it, so the
                // page passes its checksum whatever it now says.
                let Some(which) = inp.u16() else { break };
                if pages.is_empty() {
                    continue;
                }
                let (start, len) = pages[which as usize % pages.len()];
                if op == 5 {
                    let (Some(at), Some(v), Some(width)) = (inp.u16(), inp.u64(), inp.u8()) else {
                        break;
                    };
                    let width = [1usize, 2, 4, 8][width as usize % 4];
                    let at = start + at as usize % len.max(1);
                    let end = (at + width).min(f.len());
                    if at < end {
                        f[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
                    }
                }
                seal(f, start, len);
            }
            _ => unreachable!("op 6 is handled above, and ops are below 7"),
        }
    }
    files
}

fn write_files(dir: &Path, base: &base::Base, files: &[Option<Vec<u8>>]) {
    let _ = std::fs::remove_dir_all(dir);
    for z in 0..3 {
        std::fs::create_dir_all(dir.join(format!("zone{z}"))).expect("create zone dir");
    }
    for ((rel, _), f) in base.files.iter().zip(files) {
        if let Some(bytes) = f {
            std::fs::write(dir.join(rel), bytes).expect("write fuzzed file");
        }
    }
}

fn exercise(base: &base::Base, dir: &Path) {
    let Ok(store) = Store::open(base::config(dir)) else {
        return;
    };
    let mut readable = Vec::new();
    for log in ["a", "b", "c"] {
        let (first, tail) = store.bounds(log);
        assert!(first <= tail, "{log}: first {first} above tail {tail}");
        for pos in first.saturating_sub(1)..tail.saturating_add(1).min(first + 200) {
            // Damage may make a record unreadable, never different.
            if let (Ok(got), Some(want)) = (store.read(log, pos), base.records.get(&(log, pos))) {
                assert!(
                    got[..] == want[..],
                    "{log}@{pos} reads back different bytes"
                );
                readable.push((log, pos));
            }
        }
    }
    let _ = store.scrub_blocking();
    // A scrub rebuilds what it finds wrong; it must not lose what reads.
    for &(log, pos) in &readable {
        match store.read(log, pos) {
            Ok(got) => assert!(
                got[..] == base.records[&(log, pos)][..],
                "{log}@{pos} reads back different bytes after a scrub"
            ),
            Err(e) => panic!("{log}@{pos} read before the scrub, not after: {e}"),
        }
    }
    let (_, tail) = store.bounds("a");
    let Ok(pos) = store.append_blocking("a", 0, 0, &b"appended after recovery"[..]) else {
        return;
    };
    assert_eq!(pos, tail, "an append takes the log's next position");
    drop(store);
    let store =
        Store::open(base::config(dir)).expect("a store that acknowledged an append opens again");
    let got = store
        .read("a", pos)
        .expect("an acknowledged append reads back after a reopen");
    assert_eq!(&got[..], b"appended after recovery");
}

fuzz_target!(|data: &[u8]| {
    let fx = &*FIXTURE;
    let files = edit(&fx.base, data);
    write_files(&fx.work, &fx.base, &files);
    if data.is_empty() {
        // No edit: the base itself must recover whole, or the fixture is
        // not exercising what it claims to.
        let store = Store::open(base::config(&fx.work)).expect("the undamaged base opens");
        for (log, bounds) in &fx.base.logs {
            assert_eq!(store.bounds(log), *bounds, "bounds of {log}");
            for pos in bounds.0..bounds.1 {
                let got = store.read(log, pos).expect("an undamaged record reads");
                assert!(got[..] == fx.base.records[&(*log, pos)][..], "{log}@{pos}");
            }
        }
        return;
    }
    exercise(&fx.base, &fx.work);
});
