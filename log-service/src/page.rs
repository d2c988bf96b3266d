//! Pages: the unit appended to a segment file. Every page carries its own
//! header and CRC, so a reader can tell a torn tail from a flipped bit and
//! a scan can resynchronise after damage.
//!
//! ```text
//! 0  magic "MLDP"
//! 4  crc32 of bytes 8.. (header rest and body)
//! 8  kind      u8   (0 pad, 1 unordered shard, 2 ordered shard, 3 end-write, 4 class marker)
//! 9  shard     u8   (index within the stripe)
//! 10 k         u8   (data shards)
//! 11 m         u8   (parity shards)
//! 12 body_len  u32
//! 16 stripe    u64  (stripe sequence number; 0 for pad and markers)
//! 24 payload   u32  (stripe payload length before padding)
//! 28 body
//! ```

/// Bytes before the body.
pub const HEADER: usize = 28;
const MAGIC: &[u8; 4] = b"MLDP";

/// What a page holds; the numbers of the data kinds are the segment
/// classes of the Hyder log paper (§2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Filler written by repair in place of pages nothing references.
    Pad = 0,
    /// A shard of a non-root stripe of a multi-stripe record.
    Unordered = 1,
    /// A shard of a root stripe (the stripes that are totally ordered).
    Ordered = 2,
    /// An end-write record.
    EndWrite = 3,
    /// The segment's class was raised to the value in the body.
    Class = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            0 => Kind::Pad,
            1 => Kind::Unordered,
            2 => Kind::Ordered,
            3 => Kind::EndWrite,
            4 => Kind::Class,
            _ => return None,
        })
    }
}

/// Segment classes (§2.3): appends of class C to a segment of a higher
/// class are refused; a lower class is raised.
pub mod class {
    /// No page yet.
    pub const EMPTY: u8 = 0;
    /// Non-root stripes.
    pub const UNORDERED: u8 = 1;
    /// Root stripes.
    pub const ORDERED: u8 = 2;
    /// End-write records.
    pub const END_WRITE: u8 = 3;
    /// No more appends.
    pub const SEALED: u8 = 4;
}

/// A decoded page header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Page kind.
    pub kind: Kind,
    /// Shard index within the stripe.
    pub shard: u8,
    /// Data shards of the stripe.
    pub k: u8,
    /// Parity shards of the stripe.
    pub m: u8,
    /// Body length.
    pub body_len: u32,
    /// Stripe sequence number.
    pub stripe: u64,
    /// Stripe payload length.
    pub payload_len: u32,
}

impl Header {
    /// Total page length.
    pub fn page_len(&self) -> u64 {
        HEADER as u64 + self.body_len as u64
    }
}

/// Encodes a page.
pub fn encode(h: &Header, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + body.len());
    encode_into(&mut out, h, body);
    out
}

/// Appends an encoded page to `out` (no intermediate buffer).
pub fn encode_into(out: &mut Vec<u8>, h: &Header, body: &[u8]) {
    debug_assert_eq!(h.body_len as usize, body.len());
    out.reserve(HEADER + body.len());
    let start = begin(out, h);
    out.extend_from_slice(body);
    seal(out, start);
}

/// Starts a page at the end of `out`: its header, with the CRC left blank
/// until [`seal`]. The caller appends the `h.body_len` body bytes (or
/// computes them in place, as the writer does for parity) and then seals,
/// before anything else is appended to `out`.
/// Returns where the page starts.
pub fn begin(out: &mut Vec<u8>, h: &Header) -> usize {
    let start = out.len();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[0; 4]);
    out.push(h.kind as u8);
    out.push(h.shard);
    out.push(h.k);
    out.push(h.m);
    out.extend_from_slice(&h.body_len.to_le_bytes());
    out.extend_from_slice(&h.stripe.to_le_bytes());
    out.extend_from_slice(&h.payload_len.to_le_bytes());
    debug_assert_eq!(out.len() - start, HEADER);
    start
}

/// Fills in the CRC of the page that starts at `start` in `out` and runs
/// to its end (begun with [`begin`], its body complete).
pub fn seal(out: &mut [u8], start: usize) {
    let crc = crc32fast::hash(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The checksum stored in a page's header (0 for fewer than 8 bytes). Two
/// pages that pass their checksums and store the same one hold the same
/// bytes, barring a collision.
pub fn stored_crc(page: &[u8]) -> u32 {
    match page.get(4..8) {
        Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
        _ => 0,
    }
}

/// Why a page was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// Fewer than [`HEADER`] bytes.
    Short,
    /// Wrong magic or unknown kind: not a page start.
    NotAPage,
    /// The header is plausible but the CRC does not match.
    Crc,
}

/// Parses a header from the first [`HEADER`] bytes (no CRC check).
pub fn header(bytes: &[u8]) -> Result<Header, Bad> {
    if bytes.len() < HEADER {
        return Err(Bad::Short);
    }
    if &bytes[0..4] != MAGIC {
        return Err(Bad::NotAPage);
    }
    let kind = Kind::from_u8(bytes[8]).ok_or(Bad::NotAPage)?;
    let u32_at =
        |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let mut s = [0u8; 8];
    s.copy_from_slice(&bytes[16..24]);
    Ok(Header {
        kind,
        shard: bytes[9],
        k: bytes[10],
        m: bytes[11],
        body_len: u32_at(12),
        stripe: u64::from_le_bytes(s),
        payload_len: u32_at(24),
    })
}

/// Parses and CRC-checks a whole page; returns the header and the body.
pub fn decode(bytes: &[u8]) -> Result<(Header, &[u8]), Bad> {
    let h = header(bytes)?;
    if (bytes.len() as u64) < h.page_len() {
        return Err(Bad::Short);
    }
    let page = &bytes[..h.page_len() as usize];
    let crc = u32::from_le_bytes([page[4], page[5], page[6], page[7]]);
    if crc32fast::hash(&page[8..]) != crc {
        return Err(Bad::Crc);
    }
    Ok((h, &page[HEADER..]))
}

/// A pad page of exactly `len` bytes (`len >= HEADER`).
pub fn pad(len: usize) -> Vec<u8> {
    let body = vec![0u8; len - HEADER];
    encode(
        &Header {
            kind: Kind::Pad,
            shard: 0,
            k: 0,
            m: 0,
            body_len: body.len() as u32,
            stripe: 0,
            payload_len: 0,
        },
        &body,
    )
}

/// A class-marker page.
pub fn class_marker(class: u8) -> Vec<u8> {
    encode(
        &Header {
            kind: Kind::Class,
            shard: 0,
            k: 0,
            m: 0,
            body_len: 1,
            stripe: 0,
            payload_len: 0,
        },
        &[class],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_bit_flip_is_caught() {
        let h = Header {
            kind: Kind::Ordered,
            shard: 1,
            k: 2,
            m: 1,
            body_len: 5,
            stripe: 77,
            payload_len: 9,
        };
        let page = encode(&h, b"hello");
        assert_eq!(decode(&page).unwrap(), (h, &b"hello"[..]));
        for bit in 0..page.len() * 8 {
            let mut p = page.clone();
            p[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&p).is_err(), "flip of bit {bit} went unnoticed");
        }
        for cut in 0..page.len() {
            assert!(decode(&page[..cut]).is_err());
        }
        assert_eq!(decode(&pad(40)).unwrap().0.page_len(), 40);
    }

    /// The checksum a page stores is the CRC-32 of its bytes from offset
    /// 8, the value end-write copies are told apart by.
    #[test]
    fn the_stored_checksum_is_the_crc_of_the_page_after_it() {
        for body in [&b""[..], b"x", b"a longer body of a page"] {
            let h = Header {
                kind: Kind::EndWrite,
                shard: 0,
                k: 0,
                m: 0,
                body_len: body.len() as u32,
                stripe: 3,
                payload_len: 0,
            };
            let page = encode(&h, body);
            assert_eq!(stored_crc(&page), crc32fast::hash(&page[8..]));
            assert_eq!(stored_crc(&page[..8]), stored_crc(&page));
        }
        assert_eq!(stored_crc(&[0xff; 7]), 0, "too short to hold one");
    }

    /// Every kind survives the trip through a page header, and a kind byte
    /// no variant has makes the bytes not a page.
    #[test]
    fn every_kind_reads_back_and_unknown_kind_bytes_are_not_pages() {
        let all = [
            Kind::Pad,
            Kind::Unordered,
            Kind::Ordered,
            Kind::EndWrite,
            Kind::Class,
        ];
        for k in all {
            // Stops compiling when a kind is added without being listed.
            match k {
                Kind::Pad | Kind::Unordered | Kind::Ordered | Kind::EndWrite | Kind::Class => {}
            }
        }
        for b in 0..=u8::MAX {
            let h = Header {
                kind: Kind::Pad,
                shard: 0,
                k: 1,
                m: 1,
                body_len: 2,
                stripe: 5,
                payload_len: 2,
            };
            let mut page = encode(&h, b"ab");
            page[8] = b;
            seal(&mut page, 0);
            match all.iter().find(|&&k| k as u8 == b) {
                Some(&kind) => {
                    assert_eq!(decode(&page).unwrap(), (Header { kind, ..h }, &b"ab"[..]))
                }
                None => assert_eq!(decode(&page), Err(Bad::NotAPage), "kind byte {b}"),
            }
        }
    }
}
