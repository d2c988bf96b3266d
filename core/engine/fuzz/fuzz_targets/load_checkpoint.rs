//! Fuzzes the checkpoint loader on edited checkpoints: a real checkpoint
//! of a 200-key state (`base.rs`), cut into small parts, then changed by
//! the input (bytes flipped or set, parts cut short, dropped, repeated or
//! swapped), each edited part optionally sealed again so that its checksum
//! passes and the body's own checks are what must notice. Loading must
//! never panic, and whatever loads must be the state that was written,
//! key for key and digest for digest: a checkpoint that loads as another
//! state would put a recovering node on a different database.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use melddb::checkpoint;
use melddb::Settings;

mod base;

/// Parts of at most this many body bytes: a few dozen parts, so part-level
/// edits (order, count) are reachable.
const PART_BYTES: usize = 256;

struct Fixture {
    parts: Vec<Vec<u8>>,
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    digest: String,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let db = base::base();
    let state = db.snapshot();
    let parts = checkpoint::encode(&Settings::default(), &state, PART_BYTES)
        .expect("the base state encodes");
    let loaded = {
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        checkpoint::load(&refs).expect("the untouched checkpoint loads")
    };
    Fixture {
        pairs: pairs(&loaded.state),
        digest: format!("{:?}", loaded.state.digest().unwrap()),
        parts,
    }
});

fn pairs(s: &melddb::Snapshot) -> Vec<(Vec<u8>, Vec<u8>)> {
    s.to_vec()
        .expect("an in-memory tree reads")
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

/// Seals `part` again: its last four bytes are the CRC-32 of the rest.
fn reseal(part: &mut [u8]) {
    if part.len() >= 4 {
        let n = part.len() - 4;
        let crc = crc32fast::hash(&part[..n]);
        part[n..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Applies the edits the input spells, five bytes each: part, operation,
/// offset (two bytes), value.
fn edit(base: &[Vec<u8>], data: &[u8]) -> Vec<Vec<u8>> {
    let mut parts = base.to_vec();
    for e in data.chunks_exact(5).take(32) {
        if parts.is_empty() {
            break;
        }
        let i = e[0] as usize % parts.len();
        let op = e[1];
        let at = u16::from_le_bytes([e[2], e[3]]) as usize;
        let v = e[4];
        match op % 7 {
            0 => {
                let p = &mut parts[i];
                if !p.is_empty() {
                    let j = at % p.len();
                    p[j] ^= v.max(1);
                }
            }
            1 => {
                let p = &mut parts[i];
                if !p.is_empty() {
                    let j = at % p.len();
                    p[j] = v;
                }
            }
            2 => {
                let len = parts[i].len();
                parts[i].truncate(at % (len + 1));
            }
            3 => {
                parts.remove(i);
                continue;
            }
            4 => {
                let p = parts[i].clone();
                parts.insert(i, p);
            }
            5 => {
                let j = at % parts.len();
                parts.swap(i, j);
            }
            _ => {
                let p = &mut parts[i];
                let j = at % (p.len() + 1);
                p.insert(j, v);
            }
        }
        // The operation's high bit: seal the part again, so the edit gets
        // past the part checksum.
        if op & 0x80 != 0 {
            reseal(&mut parts[i]);
        }
    }
    parts
}

fuzz_target!(|data: &[u8]| {
    let fx = &*FIXTURE;
    let parts = edit(&fx.parts, data);
    let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
    if let Ok(loaded) = checkpoint::load(&refs) {
        assert_eq!(
            format!("{:?}", loaded.state.digest().unwrap()),
            fx.digest,
            "an edited checkpoint loaded with another digest"
        );
        assert!(
            pairs(&loaded.state) == fx.pairs,
            "an edited checkpoint loaded as another state"
        );
        melddb::validate::check_tree(&loaded.state).expect("a loaded tree is valid");
    }
    if data.is_empty() {
        assert!(
            checkpoint::load(&refs).is_ok(),
            "the untouched checkpoint loads"
        );
    }
});
