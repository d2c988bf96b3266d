//! Stripes: a payload cut into `k` data shards plus `m` Reed-Solomon parity
//! shards, one page per segment of a window of consecutive segments (so one
//! page per failure zone). Also the two payload formats that ride in
//! stripes and the end-write record that says a stripe is complete.

use reed_solomon_erasure::galois_8::ReedSolomon;

use crate::page::{self, Kind};

/// Where one stripe's pages are: one `(segment, offset)` per shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeRef {
    /// Stripe sequence number (unique, increasing).
    pub seq: u64,
    /// Ordered (root) or unordered (non-root).
    pub kind: Kind,
    /// Data shards.
    pub k: u8,
    /// Parity shards.
    pub m: u8,
    /// Bytes per shard.
    pub shard_len: u32,
    /// Payload bytes before padding.
    pub payload_len: u32,
    /// `(segment, offset)` of each shard's page, data shards first.
    pub pages: Vec<(u64, u64)>,
}

/// One record as it is indexed: which log, which position, who sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryMeta {
    /// Log name.
    pub log: String,
    /// Position in that log.
    pub pos: u64,
    /// Client id (0: no idempotency).
    pub client: u64,
    /// Client request id.
    pub request: u64,
    /// Record length.
    pub len: u32,
    /// Where the record's bytes start in the root payload (`u32::MAX`
    /// when the record has fragment stripes). Only end-writes carry it.
    pub offset: u32,
    /// CRC32 of the whole record, so a read of just its bytes can be
    /// checked without reading whole pages. Only end-writes carry it.
    pub crc: u32,
}

/// `offset` of a record that spans fragment stripes.
pub const FRAGMENTED: u32 = u32::MAX;

/// A record inside a root stripe: its metadata, the non-root stripes that
/// hold its leading bytes (in order), and the bytes that follow them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootEntry {
    /// Metadata.
    pub meta: EntryMeta,
    /// Fragment stripes, in byte order.
    pub fragments: Vec<u64>,
    /// The record's last bytes.
    pub tail: Vec<u8>,
}

/// The end-write record of §2.1: a completed stripe and, for root stripes,
/// the records it orders. `ew_base` is the first of the three end-write
/// segments it was written to, so a repaired segment can be refilled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndWrite {
    /// First end-write segment of the copies.
    pub ew_base: u64,
    /// First stripe number of the batch the stripe was written in; every
    /// fragment of its records is at or above it (used to free segments).
    pub batch_seq: u64,
    /// The stripe.
    pub stripe: StripeRef,
    /// Records the stripe holds (empty for non-root stripes).
    pub entries: Vec<EntryMeta>,
}

/// A payload or record that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {what} at byte {at}")]
pub struct Malformed {
    /// What was being parsed.
    pub what: &'static str,
    /// Where.
    pub at: usize,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { bytes, at: 0, what }
    }
    fn err(&self) -> Malformed {
        Malformed {
            what: self.what,
            at: self.at,
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let end = self.at.checked_add(n).ok_or_else(|| self.err())?;
        let s = self.bytes.get(self.at..end).ok_or_else(|| self.err())?;
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, Malformed> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, Malformed> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn name(&mut self) -> Result<String, Malformed> {
        let n = self.u8()? as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err())
    }
    fn done(&self) -> Result<(), Malformed> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(self.err())
        }
    }
}

fn put_meta(out: &mut Vec<u8>, m: &EntryMeta) {
    out.push(m.log.len() as u8);
    out.extend_from_slice(m.log.as_bytes());
    out.extend_from_slice(&m.pos.to_le_bytes());
    out.extend_from_slice(&m.client.to_le_bytes());
    out.extend_from_slice(&m.request.to_le_bytes());
    out.extend_from_slice(&m.len.to_le_bytes());
}

fn get_meta(r: &mut Reader<'_>) -> Result<EntryMeta, Malformed> {
    Ok(EntryMeta {
        log: r.name()?,
        pos: r.u64()?,
        client: r.u64()?,
        request: r.u64()?,
        len: r.u32()?,
        offset: 0,
        crc: 0,
    })
}

/// Bytes a root payload starts with: its entry count.
pub const ROOT_COUNT_BYTES: usize = 4;

/// Bytes a root entry takes in a root payload, besides its tail.
pub fn root_entry_overhead(log: &str, fragments: usize) -> usize {
    1 + log.len() + 8 + 8 + 8 + 4 + 4 + 8 * fragments + 4
}

/// A record to put in a root stripe, borrowing its bytes.
#[derive(Debug, Clone)]
pub struct RootRef<'a> {
    /// Metadata.
    pub meta: &'a EntryMeta,
    /// Fragment stripes, in byte order.
    pub fragments: Vec<u64>,
    /// The record's last bytes.
    pub tail: &'a [u8],
}

/// Bytes of the root payload [`encode_root_refs`] makes of `entries`.
pub fn root_payload_len(entries: &[RootRef<'_>]) -> usize {
    ROOT_COUNT_BYTES
        + entries
            .iter()
            .map(|e| root_entry_overhead(&e.meta.log, e.fragments.len()) + e.tail.len())
            .sum::<usize>()
}

/// Encodes a root stripe's payload; also returns where each entry's tail
/// bytes start.
pub fn encode_root_refs(entries: &[RootRef<'_>]) -> (Vec<u8>, Vec<u32>) {
    let mut out = Vec::new();
    let offsets = encode_root_refs_into(&mut out, entries);
    (out, offsets)
}

/// [`encode_root_refs`] into a buffer the caller reuses (cleared first).
pub fn encode_root_refs_into(out: &mut Vec<u8>, entries: &[RootRef<'_>]) -> Vec<u32> {
    out.clear();
    out.reserve(root_payload_len(entries));
    let mut offsets = Vec::with_capacity(entries.len());
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for e in entries {
        put_meta(out, e.meta);
        out.extend_from_slice(&(e.fragments.len() as u32).to_le_bytes());
        for f in &e.fragments {
            out.extend_from_slice(&f.to_le_bytes());
        }
        out.extend_from_slice(&(e.tail.len() as u32).to_le_bytes());
        offsets.push(out.len() as u32);
        out.extend_from_slice(e.tail);
    }
    offsets
}

/// [`encode_root_refs`] for owned entries.
pub fn encode_root(entries: &[RootEntry]) -> (Vec<u8>, Vec<u32>) {
    let refs: Vec<RootRef<'_>> = entries
        .iter()
        .map(|e| RootRef {
            meta: &e.meta,
            fragments: e.fragments.clone(),
            tail: &e.tail,
        })
        .collect();
    encode_root_refs(&refs)
}

/// Decodes a root stripe's payload.
pub fn decode_root(bytes: &[u8]) -> Result<Vec<RootEntry>, Malformed> {
    let mut r = Reader::new(bytes, "root stripe payload");
    let n = r.u32()? as usize;
    // Each entry takes at least 37 bytes: bound the allocation by the input.
    let mut out = Vec::with_capacity(n.min(bytes.len() / 37));
    for _ in 0..n {
        let meta = get_meta(&mut r)?;
        let nf = r.u32()? as usize;
        if nf > bytes.len() / 8 {
            return Err(r.err());
        }
        let mut fragments = Vec::with_capacity(nf);
        for _ in 0..nf {
            fragments.push(r.u64()?);
        }
        let tl = r.u32()? as usize;
        let tail = r.take(tl)?.to_vec();
        out.push(RootEntry {
            meta,
            fragments,
            tail,
        });
    }
    r.done()?;
    Ok(out)
}

/// Encodes an end-write record (a page body).
pub fn encode_end_write(ew: &EndWrite) -> Vec<u8> {
    let s = &ew.stripe;
    let mut out = Vec::with_capacity(64 + 16 * s.pages.len() + 40 * ew.entries.len());
    out.push(1);
    out.extend_from_slice(&ew.ew_base.to_le_bytes());
    out.extend_from_slice(&ew.batch_seq.to_le_bytes());
    out.extend_from_slice(&s.seq.to_le_bytes());
    out.push(s.kind as u8);
    out.push(s.k);
    out.push(s.m);
    out.extend_from_slice(&s.shard_len.to_le_bytes());
    out.extend_from_slice(&s.payload_len.to_le_bytes());
    for (seg, off) in &s.pages {
        out.extend_from_slice(&seg.to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
    }
    out.extend_from_slice(&(ew.entries.len() as u32).to_le_bytes());
    for e in &ew.entries {
        put_meta(&mut out, e);
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.crc.to_le_bytes());
    }
    out
}

/// Decodes an end-write record.
pub fn decode_end_write(bytes: &[u8]) -> Result<EndWrite, Malformed> {
    let mut r = Reader::new(bytes, "end-write record");
    if r.u8()? != 1 {
        return Err(r.err());
    }
    let ew_base = r.u64()?;
    let batch_seq = r.u64()?;
    let seq = r.u64()?;
    if batch_seq > seq {
        return Err(r.err());
    }
    let kind = match r.u8()? {
        1 => Kind::Unordered,
        2 => Kind::Ordered,
        _ => return Err(r.err()),
    };
    let k = r.u8()?;
    let m = r.u8()?;
    if k == 0 || m == 0 {
        return Err(r.err());
    }
    let shard_len = r.u32()?;
    let payload_len = r.u32()?;
    if payload_len as u64 > shard_len as u64 * k as u64 {
        return Err(r.err());
    }
    let mut pages = Vec::with_capacity(k as usize + m as usize);
    for _ in 0..(k as usize + m as usize) {
        pages.push((r.u64()?, r.u64()?));
    }
    let n = r.u32()? as usize;
    let mut entries = Vec::with_capacity(n.min(bytes.len() / 29));
    for _ in 0..n {
        let mut m = get_meta(&mut r)?;
        m.offset = r.u32()?;
        m.crc = r.u32()?;
        if m.offset != FRAGMENTED && m.offset as u64 + m.len as u64 > payload_len as u64 {
            return Err(r.err());
        }
        entries.push(m);
    }
    r.done()?;
    Ok(EndWrite {
        ew_base,
        batch_seq,
        stripe: StripeRef {
            seq,
            kind,
            k,
            m,
            shard_len,
            payload_len,
            pages,
        },
        entries,
    })
}

/// Cuts `payload` into `k` data shards of equal length and computes `m`
/// parity shards. Shards are at least one byte.
pub fn encode_shards(payload: &[u8], k: usize, m: usize) -> Vec<Vec<u8>> {
    let shard_len = payload.len().div_ceil(k).max(1);
    let mut shards: Vec<Vec<u8>> = (0..k + m)
        .map(|i| {
            let mut s = vec![0u8; shard_len];
            if i < k {
                let start = (i * shard_len).min(payload.len());
                let end = ((i + 1) * shard_len).min(payload.len());
                s[..end - start].copy_from_slice(&payload[start..end]);
            }
            s
        })
        .collect();
    // k, m were validated by the config (both >= 1, sum <= 255) and the
    // shards are equal and non-empty, so encoding cannot fail.
    let rs = ReedSolomon::new(k, m).expect("validated shard counts");
    rs.encode(&mut shards).expect("equal non-empty shards");
    shards
}

/// Appends one stripe's pages, one to each of `bufs` (`k + m` buffers in
/// shard order, `k` and `m` from `rs`): the payload cut into `k` data
/// shards, zero-padded, then the `m` parity shards computed from them in
/// place, each page with its header and CRC. Unlike [`encode_shards`] plus
/// [`crate::page::encode_into`], no shard exists outside the page buffers:
/// the payload is copied once, and the buffers can be reused from batch to
/// batch. Returns the shard length.
pub fn encode_pages_into(
    bufs: &mut [Vec<u8>],
    rs: &ReedSolomon,
    kind: Kind,
    seq: u64,
    payload: &[u8],
) -> Result<u32, String> {
    let (k, m) = (rs.data_shard_count(), rs.parity_shard_count());
    if bufs.len() != k + m {
        return Err(format!("{} page buffers for {k}+{m} shards", bufs.len()));
    }
    let shard_len = payload.len().div_ceil(k).max(1);
    let too_big = || format!("a payload of {} bytes does not fit a stripe", payload.len());
    let body_len = u32::try_from(shard_len).map_err(|_| too_big())?;
    let payload_len = u32::try_from(payload.len()).map_err(|_| too_big())?;
    let mut starts = Vec::with_capacity(k + m);
    for (j, buf) in bufs.iter_mut().enumerate() {
        let h = page::Header {
            kind,
            shard: j as u8,
            k: k as u8,
            m: m as u8,
            body_len,
            stripe: seq,
            payload_len,
        };
        buf.reserve(page::HEADER + shard_len);
        let start = page::begin(buf, &h);
        if j < k {
            let lo = (j * shard_len).min(payload.len());
            let hi = ((j + 1) * shard_len).min(payload.len());
            buf.extend_from_slice(&payload[lo..hi]);
        }
        buf.resize(start + page::HEADER + shard_len, 0);
        starts.push(start);
    }
    let (data, parity) = bufs.split_at_mut(k);
    let body = |s: usize| s + page::HEADER..s + page::HEADER + shard_len;
    let data: Vec<&[u8]> = data
        .iter()
        .zip(&starts)
        .map(|(b, &s)| &b[body(s)])
        .collect();
    let mut parity: Vec<&mut [u8]> = parity
        .iter_mut()
        .zip(&starts[k..])
        .map(|(b, &s)| &mut b[body(s)])
        .collect();
    rs.encode_sep(&data, &mut parity)
        .map_err(|e| format!("parity of stripe {seq}: {e}"))?;
    for (buf, &s) in bufs.iter_mut().zip(&starts) {
        page::seal(buf, s);
    }
    Ok(body_len)
}

/// Whether a stripe's parity pages are what its data pages encode to:
/// every page can pass its own checksum while one of them holds other
/// bytes than were written, and only this comparison shows it before a
/// read needs parity. `shards` are all `k + m` page bodies.
pub fn parity_agrees(shards: &[Vec<u8>], k: usize, m: usize) -> Result<bool, String> {
    let rs = ReedSolomon::new(k, m).map_err(|e| format!("shard counts {k}+{m}: {e}"))?;
    rs.verify(shards)
        .map_err(|e| format!("{} pages for a {k}+{m} stripe: {e}", shards.len()))
}

/// Rebuilds every shard from the ones that survived (`None` = lost or
/// corrupt). Fails when fewer than `k` survive.
pub fn rebuild(
    mut shards: Vec<Option<Vec<u8>>>,
    k: usize,
    m: usize,
) -> Result<Vec<Vec<u8>>, String> {
    let rs = ReedSolomon::new(k, m).map_err(|e| format!("shard counts {k}+{m}: {e}"))?;
    if shards.iter().any(|s| s.is_none()) {
        let usable = shards.iter().flatten().count();
        rs.reconstruct(&mut shards)
            .map_err(|e| format!("{usable} of {} pages usable: {e}", k + m))?;
    }
    Ok(shards.into_iter().map(|s| s.unwrap_or_default()).collect())
}

/// The payload from the shards that survived; parity is only decoded when
/// a data shard is missing.
pub fn payload(
    mut shards: Vec<Option<Vec<u8>>>,
    k: usize,
    m: usize,
    payload_len: usize,
) -> Result<Vec<u8>, String> {
    if shards.len() != k + m {
        return Err(format!("{} shards for a {k}+{m} stripe", shards.len()));
    }
    if shards[..k].iter().any(|s| s.is_none()) {
        let rs = ReedSolomon::new(k, m).map_err(|e| format!("shard counts {k}+{m}: {e}"))?;
        let usable = shards.iter().flatten().count();
        rs.reconstruct_data(&mut shards)
            .map_err(|e| format!("{usable} of {} pages usable: {e}", k + m))?;
    }
    // `payload_len` comes from a record on disk: check it against the
    // shards before reserving memory for it.
    let have: usize = shards[..k].iter().flatten().map(Vec::len).sum();
    if have < payload_len {
        return Err("shards shorter than the payload".into());
    }
    let mut out = Vec::with_capacity(payload_len);
    for s in shards[..k].iter().flatten() {
        out.extend_from_slice(s);
    }
    out.truncate(payload_len);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload_of(s: Vec<Option<Vec<u8>>>, k: usize, m: usize, len: usize) -> Vec<u8> {
        super::payload(s, k, m, len).unwrap()
    }

    #[test]
    fn a_payload_length_beyond_the_shards_is_an_error_before_any_allocation() {
        let shards = encode_shards(b"short payload", 2, 1);
        let opt: Vec<Option<Vec<u8>>> = shards.into_iter().map(Some).collect();
        // A length no allocation could satisfy: reserving it first would
        // panic (capacity overflow) instead of reporting the bad record.
        let e = super::payload(opt, 2, 1, usize::MAX / 2).unwrap_err();
        assert!(e.contains("shorter than the payload"), "{e}");
    }

    #[test]
    fn any_single_lost_shard_is_rebuilt() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        for (k, m) in [(2, 1), (4, 2), (3, 1)] {
            let shards = encode_shards(&payload, k, m);
            for lost in 0..k + m {
                let mut opt: Vec<Option<Vec<u8>>> = shards.iter().cloned().map(Some).collect();
                opt[lost] = None;
                assert_eq!(payload_of(opt.clone(), k, m, payload.len()), payload);
                assert_eq!(rebuild(opt, k, m).unwrap(), shards);
            }
            let mut opt: Vec<Option<Vec<u8>>> = shards.iter().cloned().map(Some).collect();
            for s in opt.iter_mut().take(m + 1) {
                *s = None;
            }
            assert!(super::payload(opt.clone(), k, m, payload.len()).is_err());
            assert!(rebuild(opt, k, m).is_err());
        }
    }

    #[test]
    fn pages_built_in_place_match_shards_then_pages() {
        // The oracle: shards cut and encoded on their own, then each wrapped
        // in a page. Buffers start non-empty, as a reused one would.
        for (k, m) in [(4, 1), (2, 1), (3, 2), (1, 1)] {
            let rs = ReedSolomon::new(k, m).unwrap();
            for len in [0usize, 1, 2, 7, 64, 1000, 4097] {
                let payload: Vec<u8> = (0..len as u32).map(|i| (i * 31 % 253) as u8).collect();
                let mut bufs: Vec<Vec<u8>> = (0..k + m).map(|j| vec![j as u8; j * 3]).collect();
                let mut want = bufs.clone();
                let shard_len =
                    encode_pages_into(&mut bufs, &rs, Kind::Ordered, 77, &payload).unwrap();
                let shards = encode_shards(&payload, k, m);
                assert_eq!(shard_len as usize, shards[0].len(), "{k}+{m}, {len} bytes");
                for (j, shard) in shards.iter().enumerate() {
                    let h = page::Header {
                        kind: Kind::Ordered,
                        shard: j as u8,
                        k: k as u8,
                        m: m as u8,
                        body_len: shard.len() as u32,
                        stripe: 77,
                        payload_len: len as u32,
                    };
                    page::encode_into(&mut want[j], &h, shard);
                }
                assert_eq!(bufs, want, "{k}+{m}, {len} bytes");
            }
        }
        let rs = ReedSolomon::new(4, 1).unwrap();
        let mut three = vec![Vec::new(); 3];
        assert!(encode_pages_into(&mut three, &rs, Kind::Ordered, 1, b"x").is_err());
    }

    #[test]
    fn records_round_trip_and_truncations_are_rejected() {
        let meta = EntryMeta {
            log: "orders".into(),
            pos: 9,
            client: 3,
            request: 4,
            len: 12,
            offset: 0,
            crc: 0,
        };
        let roots = vec![RootEntry {
            meta: meta.clone(),
            fragments: vec![5, 6],
            tail: b"tail".to_vec(),
        }];
        let (enc, offsets) = encode_root(&roots);
        assert_eq!(&enc[offsets[0] as usize..], b"tail");
        let refs = [RootRef {
            meta: &roots[0].meta,
            fragments: vec![5, 6],
            tail: b"tail",
        }];
        assert_eq!(root_payload_len(&refs), enc.len());
        let mut reused = vec![1, 2, 3];
        assert_eq!(encode_root_refs_into(&mut reused, &refs), offsets);
        assert_eq!(reused, enc);
        assert_eq!(decode_root(&enc).unwrap(), roots);
        for cut in 0..enc.len() {
            assert!(decode_root(&enc[..cut]).is_err());
        }
        let ew = EndWrite {
            ew_base: 3,
            batch_seq: 7,
            stripe: StripeRef {
                seq: 8,
                kind: Kind::Ordered,
                k: 2,
                m: 1,
                shard_len: 10,
                payload_len: 19,
                pages: vec![(6, 0), (7, 30), (8, 60)],
            },
            entries: vec![EntryMeta {
                offset: 3,
                crc: 0xdead_beef,
                ..meta
            }],
        };
        let enc = encode_end_write(&ew);
        assert_eq!(decode_end_write(&enc).unwrap(), ew);
        for cut in 0..enc.len() {
            assert!(decode_end_write(&enc[..cut]).is_err());
        }
    }
}
