//! Writes seed corpora for both fuzz targets into `DIR/log_decoders` and
//! `DIR/log_recover`:
//! - `log_decoders`: `melddb_log::samples::encodings()`, a valid encoding
//!   of every request and response type, a page, an end-write record and a
//!   root stripe, so mutations start from bytes that decode;
//! - `log_recover`: no edit at all (the undamaged store must recover whole),
//!   then one script per kind of edit (overwrite, flip, truncate, delete,
//!   re-seal a page, rewrite a field and re-seal) over several files, and
//!   numbers of `meta.json` rewritten (the input format that starts with
//!   0xff).
//!
//! ```text
//! cargo run --example seed_corpus -- corpus
//! ```

use std::path::{Path, PathBuf};

use melddb_log::samples::encodings;

/// Edit scripts in the `log_recover` target's input format.
fn recover_seeds() -> Vec<Vec<u8>> {
    let mut v = vec![Vec::new()];
    for sel in [0u8, 3, 7, 12] {
        let off = 100u32 + sel as u32 * 997;
        // Overwrite eight bytes.
        let mut s = vec![0, sel];
        s.extend_from_slice(&off.to_le_bytes());
        s.push(8);
        s.extend_from_slice(b"\xffGARBAGE");
        v.push(s);
        // Flip a byte.
        let mut s = vec![1, sel];
        s.extend_from_slice(&off.to_le_bytes());
        s.push(0x5a);
        v.push(s);
        // Truncate.
        let mut s = vec![2, sel];
        s.extend_from_slice(&off.to_le_bytes());
        v.push(s);
        // Delete.
        v.push(vec![3, sel]);
        // Set the stripe number (header offset 16) of a page and re-seal.
        let mut s = vec![5, sel];
        s.extend_from_slice(&(sel as u16).to_le_bytes());
        s.extend_from_slice(&16u16.to_le_bytes());
        s.extend_from_slice(&u64::MAX.to_le_bytes());
        s.push(3);
        v.push(s);
        // Set a field inside an end-write body (offsets past the header)
        // and re-seal.
        let mut s = vec![5, sel];
        s.extend_from_slice(&1u16.to_le_bytes());
        s.extend_from_slice(&(28u16 + 8 * sel as u16).to_le_bytes());
        s.extend_from_slice(&(1u64 << 33).to_le_bytes());
        s.push(3);
        v.push(s);
    }
    // Numbers of a zone's meta.json (input format with meta edits): each
    // of the first numbers set to the largest value, and near it, and
    // moved a little; the first zone's copy (sel 0) and another.
    for sel in [0u8, 1] {
        for which in 0u8..8 {
            for (how, value) in [(0u8, u64::MAX), (3, 1), (1, 5), (2, 3), (0, 1u64 << 62)] {
                let mut s = vec![0xff, 6, sel, which, how];
                s.extend_from_slice(&value.to_le_bytes());
                v.push(s);
            }
        }
    }
    v
}

fn write(dir: &Path, seeds: &[Vec<u8>]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (i, s) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:03}")), s)?;
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let dir: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("corpus"));
    let d = encodings();
    let r = recover_seeds();
    write(&dir.join("log_decoders"), &d)?;
    write(&dir.join("log_recover"), &r)?;
    println!(
        "{} decoder seeds and {} recovery scripts under {}",
        d.len(),
        r.len(),
        dir.display()
    );
    Ok(())
}
