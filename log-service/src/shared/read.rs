//! Reading stripes back: straight from the data pages where they are
//! intact, otherwise through parity from the pages that are.

use std::sync::atomic::Ordering;

use crate::error::StoreError;
use crate::page::{self, Kind};
use crate::stripe::{self, StripeRef};

use super::{Parsed, Shared};

/// Reads `len` payload bytes at `offset` straight from the data pages
/// (no page CRC: the caller checks the record's own CRC).
pub(crate) fn read_range(shared: &Shared, r: &StripeRef, offset: u32, len: u32) -> Option<Vec<u8>> {
    let shard_len = r.shard_len as u64;
    let (start, end) = (offset as u64, offset as u64 + len as u64);
    if end > r.payload_len as u64 || shard_len == 0 {
        return None;
    }
    let mut out = vec![0u8; len as usize];
    let files = shared.files();
    let mut at = start;
    while at < end {
        let i = (at / shard_len) as usize;
        let within = at % shard_len;
        let n = (shard_len - within).min(end - at);
        let (seg, poff) = *r.pages.get(i)?;
        let file = files.get(&seg)?;
        let dst = &mut out[(at - start) as usize..(at - start + n) as usize];
        file.read_exact_at(dst, poff + page::HEADER as u64 + within)
            .ok()?;
        at += n;
    }
    Some(out)
}

/// A stripe's payload as what it carries: a root stripe's entries, or a
/// fragment's bytes.
pub(crate) fn parse_payload(r: &StripeRef, payload: Vec<u8>) -> Result<Parsed, StoreError> {
    Ok(match r.kind {
        Kind::Ordered => {
            Parsed::Root(
                stripe::decode_root(&payload).map_err(|e| StoreError::Unrecoverable {
                    stripe: r.seq,
                    why: e.to_string(),
                })?,
            )
        }
        _ => Parsed::Fragment(payload),
    })
}

/// A stripe's payload rebuilt from all its pages but page `skip`, which
/// is treated as lost (parity stands in for it).
pub(crate) fn read_stripe_without(
    shared: &Shared,
    r: &StripeRef,
    skip: usize,
) -> Result<Vec<u8>, String> {
    let (k, m) = (r.k as usize, r.m as usize);
    let shards: Vec<Option<Vec<u8>>> = (0..r.pages.len())
        .map(|i| (i != skip).then(|| read_page(shared, r, i)).flatten())
        .collect();
    stripe::payload(shards, k, m, r.payload_len as usize)
}

/// How many of a stripe's pages read back intact.
pub(crate) fn valid_pages(shared: &Shared, r: &StripeRef) -> usize {
    (0..r.pages.len())
        .filter(|&i| read_page(shared, r, i).is_some())
        .count()
}

/// Reads one page and checks it belongs to stripe `r` as shard `i`.
pub(crate) fn read_page(shared: &Shared, r: &StripeRef, i: usize) -> Option<Vec<u8>> {
    let (seg, off) = r.pages[i];
    let file = shared.files().get(&seg).cloned()?;
    let mut buf = vec![0u8; page::HEADER + r.shard_len as usize];
    file.read_exact_at(&mut buf, off).ok()?;
    let (h, body) = page::decode(&buf).ok()?;
    let ok = h.kind == r.kind
        && h.stripe == r.seq
        && h.shard as usize == i
        && h.k == r.k
        && h.m == r.m
        && h.payload_len == r.payload_len
        && body.len() == r.shard_len as usize;
    ok.then(|| body.to_vec())
}

/// Reads a stripe: the data pages, and parity only if a data page is bad.
/// Returns the payload and the segments that held bad or missing pages.
/// (A scrub reads every page itself: [`crate::store::scrub`].)
pub(crate) fn read_stripe(
    shared: &Shared,
    r: &StripeRef,
) -> Result<(Vec<u8>, Vec<u64>), StoreError> {
    let (k, m) = (r.k as usize, r.m as usize);
    let mut shards: Vec<Option<Vec<u8>>> = vec![None; k + m];
    let mut bad = Vec::new();
    let mut missing_data = false;
    for (i, slot) in shards.iter_mut().enumerate() {
        let wanted = i < k || missing_data;
        if !wanted {
            continue;
        }
        match read_page(shared, r, i) {
            Some(s) => *slot = Some(s),
            None => {
                bad.push(r.pages[i].0);
                // From here on every page is wanted. A parity page is only
                // read once this is already set; no parity page comes
                // before the data pages end, so none was skipped.
                missing_data = true;
            }
        }
    }
    if !bad.is_empty() {
        shared
            .counters
            .pages_rebuilt
            .fetch_add(bad.len() as u64, Ordering::Relaxed);
    }
    let payload = stripe::payload(shards, k, m, r.payload_len as usize)
        .map_err(|why| StoreError::Unrecoverable { stripe: r.seq, why })?;
    Ok((payload, bad))
}
