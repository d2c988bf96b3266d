//! Writes seed corpora for both fuzz targets into `DIR/log_decoders` and
//! `DIR/log_recover`:
//! - `log_decoders`: a valid encoding of every request and response type, a
//!   page, an end-write record and a root stripe, so mutations start from
//!   bytes that decode;
//! - `log_recover`: no edit at all (the undamaged store must recover whole),
//!   then one script per kind of edit (overwrite, flip, truncate, delete,
//!   re-seal a page, rewrite a field and re-seal) over several files.
//!
//! ```text
//! cargo run --example seed_corpus -- corpus
//! ```

use std::path::{Path, PathBuf};

use bytes::Bytes;
use melddb_log::page::{self, Header, Kind};
use melddb_log::protocol::{encode_request, encode_response, error, Code, Request, Response};
use melddb_log::stripe::{
    encode_end_write, encode_root, EndWrite, EntryMeta, RootEntry, StripeRef, FRAGMENTED,
};

fn decoder_seeds() -> Vec<Vec<u8>> {
    let requests = [
        Request::Hello {
            token: "secret-token".into(),
        },
        Request::Append {
            log: "orders".into(),
            client: 7,
            request: 9,
            bytes: Bytes::from_static(b"an intention"),
        },
        Request::Read {
            log: "orders".into(),
            pos: 42,
        },
        Request::Bounds { log: "l".into() },
        Request::Trim {
            log: "l".into(),
            pos: 5,
        },
        Request::Subscribe {
            log: "l".into(),
            from: 3,
        },
        Request::Ping,
        Request::AppendBatch {
            log: "l".into(),
            client: 1,
            first_request: 5,
            records: vec![Bytes::from_static(b"ab"), Bytes::new()],
        },
    ];
    let responses = [
        Response::HelloOk,
        Response::Appended { pos: 9 },
        Response::Entry {
            pos: 1,
            bytes: Bytes::from_static(b"entry"),
        },
        Response::Bounds { first: 1, tail: 2 },
        Response::Done,
        Response::Pong,
        Response::AppendedBatch {
            positions: vec![3, 4, 5],
        },
        error(Code::Forbidden, "no append right on this log"),
    ];
    let meta = |log: &str, pos: u64, len: u32, offset: u32| EntryMeta {
        log: log.into(),
        pos,
        client: pos * 3,
        request: pos * 5,
        len,
        offset,
        crc: 0x1234_5678 ^ pos as u32,
    };
    let end_write = EndWrite {
        ew_base: 10,
        batch_seq: 40,
        stripe: StripeRef {
            seq: 41,
            kind: Kind::Ordered,
            k: 2,
            m: 1,
            shard_len: 64,
            payload_len: 100,
            pages: vec![(1, 0), (2, 4096), (3, 8192)],
        },
        entries: vec![meta("a", 1, 40, 0), meta("a", 3, 9, FRAGMENTED)],
    };
    let mut root_meta = meta("log", 8, 300_000, 0);
    root_meta.crc = 0;
    let root = vec![RootEntry {
        meta: root_meta,
        fragments: vec![11, 12, 13],
        tail: b"the tail".to_vec(),
    }];
    let mut v: Vec<Vec<u8>> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        v.push(encode_request(i as u64, r).to_vec());
    }
    for (i, r) in responses.iter().enumerate() {
        v.push(encode_response(100 + i as u64, r).to_vec());
    }
    let h = Header {
        kind: Kind::Ordered,
        shard: 1,
        k: 2,
        m: 1,
        body_len: 32,
        stripe: 77,
        payload_len: 60,
    };
    v.push(page::encode(&h, &[5u8; 32]));
    v.push(encode_end_write(&end_write));
    v.push(encode_root(&root).0);
    v
}

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
    let d = decoder_seeds();
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
